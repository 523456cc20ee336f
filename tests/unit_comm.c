/*
** The collectives: the in-process ring allreduce against a plain sum in
** double precision, for 1 to 8 replicas and sizes that do not divide evenly
** (smaller than the number of replicas included); every replica must end
** with the same bits, and each must send what the ring promises, 2(N-1)/N
** of the data (within a float per chunk of uneven size). And the split of a
** global batch into shards. Prints "N passed, M failed".
*/
#include "comm.h"
#include "rendezvous.h"
#include "train.h"
#include <math.h>
#include <pthread.h>
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

/* The shared-memory sum's protocol (runtime/rendezvous.c, what the CUDA
   device runs for replicas on one GPU), with the owner's pass on the host:
   n threads, several collectives in order, many rounds, buffers refilled
   every round, so a replica that ran ahead into the next round would show. */
enum { RV_COLLS = 3, RV_ROUNDS = 200 };
typedef struct RvArg { Rendezvous *rv; int n, r; float **bufs; const long *len; double *worst; int *same; } RvArg;

static float rv_value(int round, int coll, int r, long i) { return (float)((round * 7 + coll * 3 + r + 1) * 0.5 + (i % 5) * 0.25); }

static void *rv_thread(void *p)
{
    RvArg *a = p;
    for (int round = 0; round < RV_ROUNDS; round++)
        for (int coll = 0; coll < RV_COLLS; coll++) {
            float *mine = a->bufs[coll * RV_MAX + a->r];
            for (long i = 0; i < a->len[coll]; i++) mine[i] = rv_value(round, coll, a->r, i);
            rt_rv_arrive(a->rv, a->r, coll, mine, a->len[coll]);
            float *all[RV_MAX];
            long begin, end;
            rt_rv_gather(a->rv, a->r, coll, all, &begin, &end);
            rt_rv_sum_chunk(all, a->n, begin, end);
            rt_rv_finish(a->rv, a->r, coll);
            for (long i = 0; i < a->len[coll]; i++) {   /* every replica's sum is in place now */
                double want = 0;
                for (int j = 0; j < a->n; j++) want += rv_value(round, coll, j, i);
                double e = fabs(mine[i] - want) / (fabs(want) + 1);
                if (e > a->worst[a->r]) a->worst[a->r] = e;
            }
            /* before the next arrival of any replica, nobody writes: all must hold the same bits */
            rt_rv_arrive(a->rv, a->r, coll, mine, a->len[coll]);
            rt_rv_gather(a->rv, a->r, coll, all, &begin, &end);
            for (int j = 0; j < a->n; j++)
                a->same[a->r] &= memcmp(all[j], mine, sizeof(float) * (size_t)a->len[coll]) == 0;
            rt_rv_finish(a->rv, a->r, coll);
        }
    return NULL;
}

static void rendezvous_tests(void)
{
    static const long lens[RV_COLLS] = { 1, 7, 1003 };
    for (int n = 1; n <= RV_MAX; n++) {
        Rendezvous *rv = rt_rv_new(n, RV_COLLS);
        float *bufs[RV_COLLS * RV_MAX];
        for (int c = 0; c < RV_COLLS; c++)
            for (int r = 0; r < n; r++) bufs[c * RV_MAX + r] = calloc((size_t)lens[c], sizeof(float));
        double worst[RV_MAX] = { 0 };
        int same[RV_MAX];
        pthread_t t[RV_MAX];
        RvArg args[RV_MAX];
        for (int r = 0; r < n; r++) {
            same[r] = 1;
            args[r] = (RvArg){ rv, n, r, bufs, lens, worst, same };
            pthread_create(&t[r], NULL, rv_thread, &args[r]);
        }
        double w = 0;
        int all_same = 1;
        for (int r = 0; r < n; r++) {
            pthread_join(t[r], NULL);
            if (worst[r] > w) w = worst[r];
            all_same &= same[r];
        }
        char detail[96];
        snprintf(detail, sizeof detail, "worst relative error %.2g over %d rounds of 3 sums", w, RV_ROUNDS);
        check(w < 1e-6, "shared-memory sum (rendezvous) against double", n, 1003, detail);
        check(all_same, "shared-memory sum: every replica the same bits", n, 1003, "");
        for (int c = 0; c < RV_COLLS; c++)
            for (int r = 0; r < n; r++) free(bufs[c * RV_MAX + r]);
        rt_rv_free(rv);
    }
}

int main(void)
{
    rendezvous_tests();
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
    /* --shard-update's halves: after a reduce-scatter each replica's own chunk (rt_comm_chunk) is
       the sum and the chunks cover the buffer once; an all-gather brings each replica's chunk to all */
    for (int n = 1; n <= 5; n++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            long len = (sizes[si] + n - 1) / n * n;   /* a multiple of the replicas, as codegen pads buckets */
            float *bufs[5];
            double *want = calloc((size_t)len, sizeof(double));
            for (int r = 0; r < n; r++) {
                bufs[r] = malloc(sizeof(float) * (size_t)len);
                for (long i = 0; i < len; i++) want[i] += bufs[r][i] = (float)(uniform() - 0.5);
            }
            CommStats st[5];
            rt_ring_threads(bufs, n, len, COMM_REDUCE_SCATTER, st);
            int ok = 1;
            long covered = 0;
            for (int r = 0; r < n; r++) {
                long lo = (long)rt_comm_owner(r, 0, 1) * (len / n), hi = lo + len / n;
                covered += hi - lo;
                for (long i = lo; i < hi; i++) ok &= fabs(bufs[r][i] - want[i]) <= 1e-6 * n * (fabs(want[i]) + 1);
                ok &= fabs(st[r].bytes_sent - 4.0 * (double)(n - 1) / n * (double)len) <= 4.0 * (n - 1) + 1e-9;
            }
            check(ok && covered == len, "reduce-scatter: each replica's chunk the sum, the chunks cover it, (N-1)/N S sent", n, len, "");
            /* each replica writes its chunk (r * 1000 + i), the all-gather gives every replica all */
            for (int r = 0; r < n; r++) {
                long lo = (long)r * (len / n), hi = lo + len / n;
                for (long i = 0; i < len; i++) bufs[r][i] = i >= lo && i < hi ? (float)(r * 1000 + i % 1000) : -1.0f;
            }
            rt_ring_threads(bufs, n, len, COMM_ALLGATHER, NULL);
            ok = 1;
            for (int o = 0; o < n; o++) {
                long lo = (long)o * (len / n), hi = lo + len / n;
                for (int r = 0; r < n; r++)
                    for (long i = lo; i < hi; i++) ok &= bufs[r][i] == (float)(o * 1000 + i % 1000);
            }
            check(ok, "all-gather: every replica holds every replica's chunk", n, len, "");
            /* replicas sharing one buffer (--shard-update's shared parameter block): the all-gather
               copies nothing, sends nothing, and leaves the buffer as it was */
            float *one[5];
            for (int r = 0; r < n; r++) one[r] = bufs[0];
            for (long i = 0; i < len; i++) bufs[0][i] = (float)(i % 977) - 3.0f;
            rt_ring_threads(one, n, len, COMM_ALLGATHER, st);
            ok = 1;
            for (long i = 0; i < len; i++) ok &= bufs[0][i] == (float)(i % 977) - 3.0f;
            for (int r = 0; r < n; r++) ok &= st[r].bytes_sent == 0 && st[r].bytes_bound == 0 && st[r].ops == 1;
            check(ok, "all-gather of one shared buffer: in place, nothing sent, bound 0", n, len, "");
            for (int r = 0; r < n; r++) free(bufs[r]);
            free(want);
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
