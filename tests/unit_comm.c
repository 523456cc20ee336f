/*
** The collectives: the in-process ring allreduce against a plain sum in
** double precision, for 1 to 8 replicas and sizes that do not divide evenly
** (smaller than the number of replicas included); every replica must end
** with the same bits, and each must send what the ring promises, 2(N-1)/N
** of the data (within a float per chunk of uneven size). And the split of a
** global batch into shards. Prints "N passed, M failed".
*/
#include "comm.h"
#include "train.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pass, fail;

static void check(int ok, const char *what, int n, long len, const char *detail)
{
    if (ok) pass++;
    else {
        fail++;
        printf("FAIL comm %s (N=%d, len=%ld) %s\n", what, n, len, detail);
    }
}

static unsigned long long rng = 88172645463325252ULL;
static double uniform(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

int main(void)
{
    static const long sizes[] = { 1, 2, 3, 5, 7, 8, 9, 13, 64, 1000, 1001, 65539 };
    for (int n = 1; n <= 8; n++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            long len = sizes[si];
            float **bufs = malloc(sizeof(float *) * (size_t)n);
            double *want = calloc((size_t)len, sizeof(double));
            double scale = 0;
            for (int r = 0; r < n; r++) {
                bufs[r] = malloc(sizeof(float) * (size_t)len);
                for (long i = 0; i < len; i++) {
                    bufs[r][i] = (float)((uniform() - 0.5) * (i % 7 == 0 ? 1e3 : 1.0));
                    want[i] += bufs[r][i];
                    scale += fabs(bufs[r][i]);
                }
            }
            CommStats st[8];
            rt_ring_allreduce_threads(bufs, n, len, st);
            double worst = 0;
            int same = 1;
            for (long i = 0; i < len; i++) {
                /* float32 sums of n terms: within n ulps of the largest partial sum */
                double bound = 1e-6 * n * (fabs(want[i]) + 1e3) ;
                double err = fabs(bufs[0][i] - want[i]);
                if (err / bound > worst) worst = err / bound;
                for (int r = 1; r < n; r++) same &= memcmp(&bufs[r][i], &bufs[0][i], sizeof(float)) == 0;
            }
            char detail[160];
            snprintf(detail, sizeof detail, "worst error %.3g of the bound", worst);
            check(worst <= 1.0, "sum against double", n, len, detail);
            check(same, "every replica the same bits", n, len, "");
            double expect = 2.0 * (n - 1) / n * 4.0 * (double)len;
            int bytes_ok = 1;
            for (int r = 0; r < n; r++) {
                /* chunk sizes differ by at most one float: a replica sends 2(N-1) chunks */
                if (fabs(st[r].bytes_sent - expect) > 4.0 * 2 * (n - 1) + 1e-9) bytes_ok = 0;
                if (st[r].ops != 1) bytes_ok = 0;
            }
            snprintf(detail, sizeof detail, "replica 0 sent %.0f bytes, ring bound %.0f", st[0].bytes_sent, expect);
            check(bytes_ok, "bytes sent against 2(N-1)/N S", n, len, detail);
            for (int r = 0; r < n; r++) free(bufs[r]);
            free(bufs);
            free(want);
            (void)scale;
        }
    /* shards: sizes differ by at most one, cover the batch in order */
    static const long batches[] = { 1, 2, 3, 96, 255, 256, 257, 60000 };
    for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++)
        for (int parts = 1; parts <= 8; parts++) {
            long b = batches[bi];
            if (b < parts) continue;
            long next = 0, lo = b, hi = 0;
            int ok = 1;
            for (int j = 0; j < parts; j++) {
                long first, count;
                train_shard(b, parts, j, &first, &count);
                ok &= first == next;
                next = first + count;
                if (count < lo) lo = count;
                if (count > hi) hi = count;
            }
            ok &= next == b && hi - lo <= 1;
            check(ok, "shards cover the batch, sizes within one", parts, b, "");
        }
    long f, c;
    train_shard(256, 3, 0, &f, &c);
    check(c == 86, "256 over 3: 86 first", 3, 256, "");
    train_shard(256, 3, 2, &f, &c);
    check(c == 85 && f == 171, "256 over 3: 85 last, from 171", 3, 256, "");
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
