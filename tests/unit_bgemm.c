/*
** Unit tests for runtime/bgemm (the bf16 GEMM of --precision bf16):
** mgc_bf16_round bit for bit on the edge cases, and mgc_sbgemm against a
** double-precision product of the bf16-rounded operands, over sizes that are
** and are not multiples of the tiles and blocks, all four transpose cases in
** both orders, leading dimensions larger than needed, alpha != 1, beta 0, 1
** and 0.5 (beta 0 over a C full of NaN). Where the CPU has AVX512_BF16 every
** product is computed on both paths (the native one and, through the test
** hook mgc_bf16_force_emulation, the emulated one) and the two are compared.
**
** Build and run from the repository root (make build/unit_bgemm does it):
**   cc -std=c11 -Wall -Wextra -D_GNU_SOURCE -O2 -Iruntime -o build/unit_bgemm \
**     tests/unit_bgemm.c runtime/bgemm.c -lopenblas -lm
**   build/unit_bgemm
** Prints "N passed, M failed"; exit status 1 if anything failed.
*/
#include "bgemm.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

#define CHECK(cond, ...) check((cond) != 0, __LINE__, __VA_ARGS__)
static void check(int ok, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int ok, int line, const char *fmt, ...)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL line %d: ", line);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- mgc_bf16_round ---- */

static void round_is(uint32_t in, uint32_t want, int line)
{
    uint32_t got = to_bits(mgc_bf16_round(from_bits(in)));
    check(got == want, line, "mgc_bf16_round(0x%08x) = 0x%08x, want 0x%08x", in, got, want);
}
#define ROUND_IS(in, want) round_is(in, want, __LINE__)

static void test_round(void)
{
    ROUND_IS(0x3f800000, 0x3f800000);   /* 1 */
    ROUND_IS(0x3f808000, 0x3f800000);   /* a tie, kept part even: down */
    ROUND_IS(0x3f818000, 0x3f820000);   /* a tie, kept part odd: up */
    ROUND_IS(0x3f808001, 0x3f810000);   /* just above the tie: up */
    ROUND_IS(0x3f807fff, 0x3f800000);   /* just below: down */
    ROUND_IS(0xbf808000, 0xbf800000);   /* the same, negative */
    ROUND_IS(0xbf818000, 0xbf820000);
    ROUND_IS(0x3f80ffff, 0x3f810000);
    ROUND_IS(0x3fffffff, 0x40000000);   /* carries into the exponent */
    ROUND_IS(0x3f802000, 0x3f800000);   /* 1 + 2^-10: not representable, rounds to 1 */
    ROUND_IS(0x7f7f7fff, 0x7f7f0000);   /* the largest finite float that stays finite */
    ROUND_IS(0x7f7f8000, 0x7f800000);   /* a tie above the largest bf16 (odd): to infinity */
    ROUND_IS(0x7f7fffff, 0x7f800000);   /* FLT_MAX: infinity */
    ROUND_IS(0xff7fffff, 0xff800000);   /* -FLT_MAX: -infinity */
    ROUND_IS(0x00000000, 0x00000000);   /* +0 */
    ROUND_IS(0x80000000, 0x80000000);   /* -0 keeps its sign */
    ROUND_IS(0x7f800000, 0x7f800000);   /* inf */
    ROUND_IS(0xff800000, 0xff800000);   /* -inf */
    ROUND_IS(0x00000001, 0x00000000);   /* the smallest denormal: to +0 */
    ROUND_IS(0x80000001, 0x80000000);   /* ... to -0 */
    ROUND_IS(0x00008000, 0x00000000);   /* a denormal tie, even: down */
    ROUND_IS(0x00018000, 0x00020000);   /* a denormal tie, odd: up */
    ROUND_IS(0x007fffff, 0x00800000);   /* the largest denormal: up to the smallest normal */
    ROUND_IS(0x00400000, 0x00400000);   /* a denormal that is a bf16 stays */
    /* NaN stays NaN, quiet, whatever its payload (even one only in the cut bits) */
    uint32_t nans[] = {0x7fc00000, 0x7f800001, 0x7fbfffff, 0xffc00001, 0xff800001, 0x7fffffff};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint32_t got = to_bits(mgc_bf16_round(from_bits(nans[i])));
        CHECK(isnan(from_bits(got)) && (got & 0x00400000) && !(got & 0xffff) && (got >> 31) == (nans[i] >> 31),
              "mgc_bf16_round(NaN 0x%08x) = 0x%08x, want a quiet NaN of the same sign", nans[i], got);
    }
    /* every 16-bit pattern of the kept half is a fixed point (sampled across the range) */
    int fixed = 1;
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint32_t u = h << 16;
        if ((u & 0x7fffffff) > 0x7f800000)
            continue;
        if (to_bits(mgc_bf16_round(from_bits(u))) != u)
            fixed = 0;
    }
    CHECK(fixed, "every bf16 value rounds to itself");
}

/* ---- mgc_sbgemm against a reference ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float urand(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); }   /* [-1, 1) */

/* A matrix operand as CBLAS sees it: element (r, s) of the stored matrix */
static long at_rc(int order, long r, long s, long ld) { return order == CblasRowMajor ? r * ld + s : r + s * ld; }

typedef struct {
    int order, ta, tb, m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b, *c0;
} Case;

/* op(A)(i, kk) and op(B)(kk, j) of the case */
static float op_a(const Case *t, long i, long kk)
{
    return t->ta == CblasTrans ? t->a[at_rc(t->order, kk, i, t->lda)] : t->a[at_rc(t->order, i, kk, t->lda)];
}
static float op_b(const Case *t, long kk, long j)
{
    return t->tb == CblasTrans ? t->b[at_rc(t->order, j, kk, t->ldb)] : t->b[at_rc(t->order, kk, j, t->ldb)];
}

/* Stored rows x columns of C, and its size in floats with the leading dimension */
static long c_size(const Case *t) { return (long)t->ldc * (t->order == CblasRowMajor ? t->m : t->n); }

/* The reference: ref = alpha * sum_k bf16(a) bf16(b) + beta * C0 in double, and
   the error bound of an fp32 computation of it, per element (row-major m x n).

   The bound. The products of two bf16 values (8 significant bits each) have at
   most 16 significant bits, so they are exact in fp32 (and, with the native
   path's vdpbf16ps, exact in its internal sum of a pair). What errs is the
   fp32 sum of the K products: summed in any order (k blocks, pairs, one
   accumulator per lane), each of the at most K additions rounds once, with a
   relative error of at most u = 2^-24 of a partial sum, itself at most
   sum |a_i b_i|; so |error| <= K u sum |a_i b_i| (to first order). Scaling by
   alpha and adding beta * C rounds twice more: (K + 2) u |alpha| sum |a b|
   + 2 u |beta C0|. We allow twice that, 2^-23 in place of 2^-24, for second
   order terms and for an sgemm that folds alpha into an operand first; and
   1e-30 absolute for the native path's flush of denormal partial sums (none
   arise with these inputs, |a|, |b| < 1). A wrong bf16 rounding of one input
   would show as an error of about 2^-9 |a b|, far above the bound. */
static void reference(const Case *t, double *ref, double *bound)
{
    long m = t->m, n = t->n, k = t->k;
    double *ra = malloc(sizeof(double) * (size_t)(m * k)), *rb = malloc(sizeof(double) * (size_t)(k * n));
    double *mag = calloc((size_t)(m * n), sizeof(double));
    if (!ra || !rb || !mag) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    for (long i = 0; i < m; i++)
        for (long kk = 0; kk < k; kk++)
            ra[i * k + kk] = mgc_bf16_round(op_a(t, i, kk));
    for (long kk = 0; kk < k; kk++)
        for (long j = 0; j < n; j++)
            rb[kk * n + j] = mgc_bf16_round(op_b(t, kk, j));
    for (long i = 0; i < m * n; i++)
        ref[i] = 0;
    for (long i = 0; i < m; i++)
        for (long kk = 0; kk < k; kk++) {
            double x = ra[i * k + kk];
            const double *brow = rb + kk * n;
            double *r = ref + i * n, *g = mag + i * n;
            for (long j = 0; j < n; j++) {
                r[j] += x * brow[j];
                g[j] += fabs(x * brow[j]);
            }
        }
    for (long i = 0; i < m; i++)
        for (long j = 0; j < n; j++) {
            double c0 = t->beta != 0.0f ? t->c0[t->order == CblasRowMajor ? i * t->ldc + j : i + j * (long)t->ldc] : 0;
            ref[i * n + j] = t->alpha * ref[i * n + j] + t->beta * c0;
            bound[i * n + j] = (k + 2) * 0x1p-23 * fabs(t->alpha) * mag[i * n + j] + 0x1p-23 * fabs(t->beta * c0) + 1e-30;
        }
    free(ra);
    free(rb);
    free(mag);
}

/* Runs the case on the current path into c (a copy of C0); returns the number
   of elements outside the bound (the first shown), and checks that the padding
   of C beyond each row or column (the leading dimension) was left alone. */
static long run_path(const Case *t, float *c, const double *ref, const double *bound, const char *path, int line)
{
    long size = c_size(t);
    memcpy(c, t->c0, sizeof(float) * (size_t)size);
    mgc_sbgemm(t->order, t->ta, t->tb, t->m, t->n, t->k, t->alpha, t->a, t->lda, t->b, t->ldb, t->beta, c, t->ldc);
    long bad = 0, pad_bad = 0;
    for (long i = 0; i < t->m; i++)
        for (long j = 0; j < t->n; j++) {
            float got = c[t->order == CblasRowMajor ? i * t->ldc + j : i + j * (long)t->ldc];
            double want = ref[i * t->n + j], err = fabs((double)got - want);
            if (!(err <= bound[i * t->n + j])) {
                if (!bad)
                    printf("  %s: C[%ld][%ld] = %.9g, want %.9g (error %.3g, bound %.3g)\n", path, i, j, got, want, err,
                           bound[i * t->n + j]);
                bad++;
            }
        }
    long rows = t->order == CblasRowMajor ? t->m : t->n, cols = t->order == CblasRowMajor ? t->n : t->m;
    for (long r = 0; r < rows; r++)
        for (long s = cols; s < t->ldc; s++)
            if (to_bits(c[r * t->ldc + s]) != to_bits(t->c0[r * t->ldc + s]))
                pad_bad++;
    check(pad_bad == 0, line, "%s: %ld elements of C's padding changed", path, pad_bad);
    if (t->order == CblasRowMajor) {   /* A packed once (mgc_sbgemm_pack_a): the same product, bit for bit */
        float *c3 = malloc(sizeof(float) * (size_t)size);
        if (!c3) {
            printf("FAIL: out of memory\n");
            exit(1);
        }
        memcpy(c3, t->c0, sizeof(float) * (size_t)size);
        MgcPackedA *p = mgc_sbgemm_pack_a(t->ta, t->m, t->k, t->a, t->lda);
        mgc_sbgemm_packed(p, t->tb, t->n, t->alpha, t->b, t->ldb, t->beta, c3, t->ldc);
        mgc_sbgemm_packed(p, t->tb, t->n, t->alpha, t->b, t->ldb, t->beta, c3, t->ldc);   /* again: A is unchanged */
        if (t->beta != 0.0f) {   /* twice with beta: compare once more from C0 */
            memcpy(c3, t->c0, sizeof(float) * (size_t)size);
            mgc_sbgemm_packed(p, t->tb, t->n, t->alpha, t->b, t->ldb, t->beta, c3, t->ldc);
        }
        mgc_sbgemm_free(p);
        long differ = 0;
        for (long i = 0; i < size; i++)
            if (to_bits(c3[i]) != to_bits(c[i]) && !(isnan(c3[i]) && isnan(c[i])))
                differ++;
        check(differ == 0, line, "%s: A packed once: %ld elements differ from mgc_sbgemm's", path, differ);
        free(c3);
    }
    return bad;
}

static int native_cpu;   /* the native path exists here: run both */

static const char *name_of(int order, int ta, int tb)
{
    static const char *names[] = {"row NN", "row NT", "row TN", "row TT", "col NN", "col NT", "col TN", "col TT"};
    return names[(order == CblasColMajor) * 4 + (ta == CblasTrans) * 2 + (tb == CblasTrans)];
}

static void gemm_case(int order, int ta, int tb, int m, int n, int k, int pad, float alpha, float beta, int line)
{
    Case t = {order, ta, tb, m, n, k, 0, 0, 0, alpha, beta, NULL, NULL, NULL};
    int row = order == CblasRowMajor;
    long ar = ta == CblasTrans ? k : m, ac = ta == CblasTrans ? m : k;   /* stored A: ar x ac */
    long br = tb == CblasTrans ? n : k, bc = tb == CblasTrans ? k : n;
    t.lda = (int)((row ? ac : ar) + pad);
    t.ldb = (int)((row ? bc : br) + pad);
    t.ldc = (int)((row ? n : m) + pad);
    long asz = (long)t.lda * (row ? ar : ac), bsz = (long)t.ldb * (row ? br : bc), csz = c_size(&t);
    float *a = malloc(sizeof(float) * (size_t)asz), *b = malloc(sizeof(float) * (size_t)bsz);
    float *c0 = malloc(sizeof(float) * (size_t)csz), *c = malloc(sizeof(float) * (size_t)csz);
    float *c2 = malloc(sizeof(float) * (size_t)csz);
    double *ref = malloc(sizeof(double) * (size_t)m * n), *bound = malloc(sizeof(double) * (size_t)m * n);
    if (!a || !b || !c0 || !c || !c2 || !ref || !bound) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    /* the padding holds NaN: reading it into the product would show */
    for (long i = 0; i < asz; i++)
        a[i] = i % t.lda < (row ? ac : ar) ? urand() : NAN;
    for (long i = 0; i < bsz; i++)
        b[i] = i % t.ldb < (row ? bc : br) ? urand() : NAN;
    for (long i = 0; i < csz; i++)
        c0[i] = beta == 0.0f ? NAN : urand();
    t.a = a, t.b = b, t.c0 = c0;
    reference(&t, ref, bound);
    char what[160];
    snprintf(what, sizeof what, "%s m %d n %d k %d pad %d alpha %g beta %g", name_of(order, ta, tb), m, n, k, pad,
             (double)alpha, (double)beta);
    if (native_cpu) {
        long bad = run_path(&t, c, ref, bound, "native", line);
        check(bad == 0, line, "native: %s: %ld elements outside the bound", what, bad);
        mgc_bf16_force_emulation(1);
    }
    long bad = run_path(&t, native_cpu ? c2 : c, ref, bound, "emulated", line);
    check(bad == 0, line, "emulated: %s: %ld elements outside the bound", what, bad);
    if (native_cpu) {
        mgc_bf16_force_emulation(0);
        /* both within the bound of the reference: within twice the bound of each other */
        long differ = 0;
        for (long i = 0; i < m; i++)
            for (long j = 0; j < n; j++) {
                long at = row ? i * t.ldc + j : i + j * (long)t.ldc;
                if (!(fabs((double)c[at] - c2[at]) <= 2 * bound[i * n + j]))
                    differ++;
            }
        check(differ == 0, line, "native and emulated differ: %s: %ld elements", what, differ);
    }
    free(a);
    free(b);
    free(c0);
    free(c);
    free(c2);
    free(ref);
    free(bound);
}

static void test_gemm_sizes(void)
{
    static const int sizes[] = {1, 2, 3, 7, 13, 31, 33, 64, 65, 100, 257};
    const int ns = (int)(sizeof sizes / sizeof sizes[0]);
    static const float alphas[] = {1.0f, -0.75f, 2.5f}, betas[] = {0.0f, 1.0f, 0.5f};
    int layouts = 0;
    for (int order = CblasRowMajor; order <= CblasColMajor; order++)
        for (int ta = CblasNoTrans; ta <= CblasTrans; ta++)
            for (int tb = CblasNoTrans; tb <= CblasTrans; tb++) {
                int f0 = failed;
                /* a few fixed shapes every layout sees: the smallest, odd K, edges of both tile dimensions */
                gemm_case(order, ta, tb, 1, 1, 1, 0, 1.0f, 0.0f, __LINE__);
                gemm_case(order, ta, tb, 13, 33, 7, 3, -0.75f, 0.5f, __LINE__);
                gemm_case(order, ta, tb, 257, 65, 31, 1, 2.5f, 1.0f, __LINE__);
                gemm_case(order, ta, tb, 25, 47, 777, 5, 1.0f, 0.0f, __LINE__);   /* k across blocks, odd */
                gemm_case(order, ta, tb, 200, 97, 400, 0, 0.5f, 0.5f, __LINE__);  /* m across blocks */
                gemm_case(order, ta, tb, 16, 95, 9, 2, 1.0f, 0.5f, __LINE__);    /* the 8 x 48 tile, a short last panel */
                gemm_case(order, ta, tb, 40, 100, 66, 1, -1.0f, 0.0f, __LINE__); /* the 8 x 48 tile, 4 columns over */
                gemm_case(order, ta, tb, 16, 75, 5, 0, 1.0f, 1.0f, __LINE__);    /* 8 rows, a last panel of 32 */
                gemm_case(order, ta, tb, 36, 45, 30, 1, 1.0f, 0.0f, __LINE__);   /* 12 rows, a last panel of 16 */
                /* and 24 random shapes from the list */
                for (int r = 0; r < 24; r++) {
                    int m = sizes[rnd() % ns], n = sizes[rnd() % ns], k = sizes[rnd() % ns];
                    gemm_case(order, ta, tb, m, n, k, (int)(rnd() % 3) * 4, alphas[rnd() % 3], betas[rnd() % 3], __LINE__);
                }
                layouts += failed == f0;
            }
    CHECK(layouts == 8, "%d of 8 layouts pass every size", layouts);
}

/* The shapes convolutions give: the forward (NN), the weight gradient (NT) and the input gradient (TN) */
static void test_gemm_conv(void)
{
    gemm_case(CblasRowMajor, CblasNoTrans, CblasNoTrans, 64, 3136, 576, 0, 1.0f, 0.0f, __LINE__);
    gemm_case(CblasRowMajor, CblasNoTrans, CblasNoTrans, 128, 784, 1152, 0, 1.0f, 1.0f, __LINE__);
    gemm_case(CblasRowMajor, CblasNoTrans, CblasTrans, 64, 576, 3136, 0, 1.0f, 1.0f, __LINE__);
    gemm_case(CblasRowMajor, CblasNoTrans, CblasTrans, 128, 784, 1152, 0, 0.5f, 0.0f, __LINE__);
    gemm_case(CblasRowMajor, CblasTrans, CblasNoTrans, 576, 3136, 64, 0, 1.0f, 0.0f, __LINE__);
    gemm_case(CblasRowMajor, CblasTrans, CblasNoTrans, 128, 784, 1152, 0, 1.0f, 0.5f, __LINE__);
    gemm_case(CblasRowMajor, CblasNoTrans, CblasNoTrans, 512, 49, 4608, 0, 1.0f, 0.0f, __LINE__);
    gemm_case(CblasRowMajor, CblasNoTrans, CblasNoTrans, 70, 3300, 70, 0, 1.0f, 0.0f, __LINE__);   /* n across blocks */
}

/* Rounding really happens: the same product in fp32 differs by the bf16 amount. */
static void test_rounding_happens(int native)
{
    const char *path = native ? "native" : "emulated";
    enum { M = 5, N = 37, K = 8 };
    float a[M * K], b[K * N], c[M * N], cf[M * N];
    for (int i = 0; i < M * K; i++)
        a[i] = 1.0f + 0x1p-10f;   /* rounds to 1 */
    for (int i = 0; i < K * N; i++)
        b[i] = from_bits(0x3f818000);   /* a tie, rounds up to 0x3f820000 = 1.015625 */
    mgc_sbgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, cf, N);
    int exact = 1, apart = 1;
    for (int i = 0; i < M * N; i++) {
        exact &= c[i] == K * 1.015625f;   /* exact: 8 * 1.015625 has few bits */
        apart &= fabsf(cf[i] - c[i]) > 0.001f;
    }
    CHECK(exact, "%s: (1 + 2^-10) x 0x3f818000 summed 8 times is 8 x 1.015625 (got %.9g)", path, (double)c[0]);
    CHECK(apart, "%s: and differs from fp32 sgemm's %.9g", path, (double)cf[0]);

    /* NaN and inf go through; beta 0 ignores a NaN C; alpha 0 and k 0 give beta C */
    float x[2] = {NAN, 1.0f}, y[2] = {1.0f, 1.0f}, z[2] = {INFINITY, 1.0f}, out = 7.0f;
    mgc_sbgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 2, 1.0f, x, 2, y, 1, 0.0f, &out, 1);
    CHECK(isnan(out), "%s: a NaN in A gives a NaN", path);
    mgc_sbgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 2, 1.0f, z, 2, y, 1, 0.0f, &out, 1);
    CHECK(isinf(out) && out > 0, "%s: an inf in A gives inf (got %g)", path, (double)out);
    float w[2] = {from_bits(0x7f7fffff), 0.0f};   /* FLT_MAX rounds to inf */
    mgc_sbgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 2, 1.0f, w, 2, y, 1, 0.0f, &out, 1);
    CHECK(isinf(out), "%s: FLT_MAX in A rounds to inf (got %g)", path, (double)out);
    float cn[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    mgc_sbgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 3, 2, 0.0f, x, 2, y, 3, 0.0f, cn, 3);
    int zeros = 1;
    for (int i = 0; i < 6; i++)
        zeros &= cn[i] == 0.0f;
    CHECK(zeros, "%s: alpha 0, beta 0 writes zeros over NaN", path);
    float cb[2] = {3.0f, -1.0f};
    mgc_sbgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, 2, 1, 0, 1.0f, x, 2, y, 1, 0.5f, cb, 2);
    CHECK(cb[0] == 1.5f && cb[1] == -0.5f, "%s: k 0 gives beta C", path);
}

int main(void)
{
    native_cpu = mgc_bf16_native();
    printf("note: bf16 GEMM path here: %s%s\n", mgc_bf16_path(),
           native_cpu ? "; every product also checked on the emulated path"
                      : "; the native path is not tested (no AVX512_BF16 here, or MGC_BF16=emulate)");
    CHECK(!strcmp(mgc_bf16_path(), native_cpu ? "avx512_bf16" : "emulated (bf16 rounding, fp32 arithmetic)"), "the path's name");
    mgc_bf16_force_emulation(1);
    CHECK(!mgc_bf16_native() && !strcmp(mgc_bf16_path(), "emulated (bf16 rounding, fp32 arithmetic)"),
          "the test hook forces the emulated path");
    mgc_bf16_force_emulation(0);
    CHECK(mgc_bf16_native() == native_cpu, "and lets go of it");

    test_round();
    if (native_cpu)
        test_rounding_happens(1);
    mgc_bf16_force_emulation(1);
    test_rounding_happens(0);
    mgc_bf16_force_emulation(0);
    test_gemm_sizes();
    test_gemm_conv();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
