/*
** The bf16 GEMM of the CPU device (see bgemm.h): what cblas_sgemm computes,
** with op(A) and op(B) rounded to bfloat16 first and the products summed in
** fp32, the semantics of PyTorch's autocast to bf16 on CPUs.
**
** Two paths, chosen once, at the first call:
**
**   native     the CPU has AVX512F, AVX512BW, AVX512VL and AVX512_BF16 and the
**              OS saves the zmm and mask registers (OSXSAVE, XCR0 bits 1, 2,
**              5, 6, 7). The operands are packed to bf16 and multiplied by
**              vdpbf16ps, which sums two bf16 products into each fp32 lane:
**              a 512-bit instruction does 32 multiply-adds where an fp32 FMA
**              does 16.
**   emulated   anything else, or MGC_BF16=emulate in the environment (read
**              once): op(A) and op(B) are copied, rounded to bf16 values held
**              in floats, and OpenBLAS's sgemm multiplies the copies. Products
**              of two bf16 values are exact in fp32, so this is the same
**              computation in fp32 arithmetic, only slower.
**
** Only the native functions are compiled for AVX-512, through the target
** attribute (BF16_TARGET below); the rest of mgc is built for the baseline
** x86-64, and nothing reaches a native function unless the detection said
** yes. Other architectures have the emulated path only.
**
** The native path is the usual blocked GEMM (Goto's loops). Everything is
** described in row-major terms for C: a column-major call is the row-major
** product C^T = op(B)^T op(A)^T, with the operands swapped. op(A)[i][k] is
** a[i*sai + k*sak] and op(B)[k][j] is b[k*sbk + j*sbj]; in every CBLAS case
** one of the two strides of each operand is 1, and the packing routine is
** chosen by which one.
**
**   for each block of NC columns of C
**     for each block of KC values of k: pack op(B) (KC x NC) to bf16
**       for each block of MC rows of C: pack op(A) (MC x KC) to bf16
**         for each NR columns, for each MR rows: the micro-kernel
**
** Packed layouts. vdpbf16ps pairs bf16 elements 2i and 2i+1 of its two
** sources into fp32 lane i, so k is packed in pairs: a 32-bit word holds
** (k even, k odd) of one row of op(A) or one column of op(B), the even one in
** the low half. B is packed in panels of NR columns (32 or 48): for each k
** pair, NR words (two or three zmm registers of 16 columns). A is packed in
** panels of MR rows (12 or 8): for each k pair, MR words, each broadcast to
** all 16 lanes. An odd K is padded with a zero, a short panel with zero rows
** or columns, so the micro-kernel never tests a bound inside its loop; the
** last panel of B is only as wide as the multiple of 16 that covers it.
**
** Packing is vectorised both ways an operand can lie in memory:
**   - the packed index contiguous, k strided (row-major B untransposed, A
**     transposed): two rows k, k+1 of 16 values are converted together by
**     vcvtne2ps2bf16 and their 32 bf16 interleaved by vpermw; B is read row
**     by row across all its panels (sequential reads);
**   - k contiguous (row-major A untransposed, B transposed: the weight
**     gradient's form): 16 rows of 32 k values become 16 registers of 16
**     k-pair words, transposed as a 16 x 16 matrix of words (64 shuffles).
**
** The micro-kernel keeps a 12 x 32 tile of C in 24 zmm accumulators; per k
** pair it loads two registers of B, broadcasts 12 words of A and issues 24
** vdpbf16ps. 24 independent accumulators cover the instruction's latency
** (about 6 cycles) at one or two per cycle, and the loads (2 full, 12
** broadcasts per 24 multiply instructions) stay well within what the load
** ports sustain; the shape leaves 8 of the 32 registers for B and A. Where M
** is a multiple of 8 but not of 12 (64 output channels: 12-row tiles would
** compute 72 rows), an 8 x 48 tile does the same work with 24 accumulators
** (3 loads of B, 8 broadcasts); the tile that computes fewer padding rows is
** chosen per call. Narrower kernels (12 x 16, 8 x 16, 8 x 32) take a last,
** narrower panel of B. Edge tiles store under column masks and a row count;
** beta == 0 never reads C.
**
** Cache blocking (KC 384, MC 192, NC 3072; measured on Zen 4, where KC from
** 256 to 768 and MC from 96 to 192 were within a few per cent of each other):
** a B micro-panel (KC/2 pairs x 32 words = 24 KB; 36 KB at 48 columns, a
** little more than L1, yet the 8-row kernel measured within a few per cent
** of the 12-row one) stays in L1 while the A
** micro-panels stream from the packed A block (MC x KC bf16, 144 KB), which
** stays in L2 (1 MB a core on Zen 4); the packed B block (KC x NC bf16,
** 2.3 MB) is read from L3 once per A block. Blocks are split evenly (K = 576
** is two blocks of 288, not 384 + 192). With K > KC, C collects the blocks'
** partial sums, in fp32.
**
** Rounding and special values: vcvtne2ps2bf16 rounds to nearest, ties to
** even, as mgc_bf16_round does, and makes NaNs quiet; but it treats denormal
** inputs as zero, and vdpbf16ps treats denormal inputs as zero and flushes
** denormal results to zero, whatever MXCSR says. So on the native path
** values below 2^-126 in magnitude count as zero, where the emulated path
** keeps them; for training this does not matter (bf16's range is fp32's, and
** such values are far below anything a gradient step sees).
**
** Scratch memory (the packed blocks, or the rounded copies) is malloc'd per
** call and freed before it returns; without it mgc stops with a message, as
** kernels do when their scratch cannot be had.
*/
#include "bgemm.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define BGEMM_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define BGEMM_X86 0
#endif

/* op(A) packed once (mgc_sbgemm_pack_a) */
struct MgcPackedA {
    long m, k;
    int native;               /* the path it was packed for */
    int32_t *words;           /* native: gemm_native's blocks of packed bf16 pairs */
    float *rounded;           /* emulated: A rounded to bf16, stored as given (op(A) row-major m x k, or its transpose) */
    int transposed;
};

/* ---- scratch, detection ---- */

static void *scratch(size_t bytes)
{
    bytes = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p) {
        fprintf(stderr, "mgc: out of memory in the bf16 GEMM (%zu MB)\n", (bytes >> 20) + 1);
        abort();
    }
    return p;
}

static atomic_int detected = -1;   /* -1 not yet, 0 emulated, 1 native */
static atomic_int forced;          /* mgc_bf16_force_emulation */

/* Whether the CPU and the OS let us run the native path. */
static int cpu_has_bf16(void)
{
#if BGEMM_X86
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27)))   /* OSXSAVE: xgetbv works */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & 0xe6u) != 0xe6u)   /* SSE, AVX, opmask, zmm 0-15 upper halves, zmm 16-31 saved */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    if (!(b & (1u << 16)) || !(b & (1u << 30)) || !(b & (1u << 31)))   /* AVX512F, AVX512BW, AVX512VL */
        return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d))
        return 0;
    return (a >> 5) & 1u;   /* AVX512_BF16 */
#else
    return 0;
#endif
}

/* The detection result. Threads racing through the first call compute the
   same answer, so storing it twice is harmless. */
static int detect(void)
{
    int d = atomic_load_explicit(&detected, memory_order_relaxed);
    if (d < 0) {
        const char *env = getenv("MGC_BF16");
        d = env && !strcmp(env, "emulate") ? 0 : cpu_has_bf16();
        atomic_store_explicit(&detected, d, memory_order_relaxed);
    }
    return d;
}

int mgc_bf16_native(void)
{
    return detect() && !atomic_load_explicit(&forced, memory_order_relaxed);
}

const char *mgc_bf16_path(void)
{
    return mgc_bf16_native() ? "avx512_bf16" : "emulated (bf16 rounding, fp32 arithmetic)";
}

void mgc_bf16_force_emulation(int on)
{
    atomic_store_explicit(&forced, on != 0, memory_order_relaxed);
}

/* ---- the emulated path ---- */

/* rows x cols values at src (rows ld apart) rounded to bf16, densely into dst */
static void round_copy(float *dst, const float *src, long rows, long cols, long ld)
{
    for (long r = 0; r < rows; r++) {
        const float *s = src + r * ld;
        float *d = dst + r * cols;
        for (long j = 0; j < cols; j++)
            d[j] = mgc_bf16_round(s[j]);
    }
}

/* Row-major C (m x n) from op(A), op(B) given by strides (one of each pair is 1):
   each operand is copied, rounded, in the layout it has, and sgemm does the rest. */
static void gemm_emulated(long m, long n, long k, float alpha, const float *a, long sai, long sak,
                          const float *b, long sbk, long sbj, float beta, float *c, long ldc)
{
    float *ra = scratch(sizeof(float) * (size_t)(m * k + k * n));
    float *rb = ra + m * k;
    enum CBLAS_TRANSPOSE tra, trb;
    long lda, ldb;
    if (sak == 1) {   /* rows of op(A) contiguous */
        round_copy(ra, a, m, k, sai);
        tra = CblasNoTrans, lda = k;
    } else {          /* columns of op(A) contiguous: A^T stored row by row */
        round_copy(ra, a, k, m, sak);
        tra = CblasTrans, lda = m;
    }
    if (sbj == 1) {
        round_copy(rb, b, k, n, sbk);
        trb = CblasNoTrans, ldb = n;
    } else {
        round_copy(rb, b, n, k, sbj);
        trb = CblasTrans, ldb = k;
    }
    cblas_sgemm(CblasRowMajor, tra, trb, (int)m, (int)n, (int)k, alpha, ra, (int)lda, rb, (int)ldb, beta, c, (int)ldc);
    free(ra);
}

/* ---- the native path ---- */

#if BGEMM_X86
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

enum {
    KC = 384,   /* k values per block */
    MC = 192,   /* rows per block of A, a multiple of both tiles' rows */
    NC = 3072,  /* columns per block of B, a multiple of both tiles' columns */
};

/* a mask of the first n of 16 lanes (none for n <= 0) */
static inline __mmask16 lanes(long n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* Packs k pairs where the packed index is contiguous and k is strided: for
   each pair p, rows k = 2p, 2p+1 (ks apart) of ncols values at src become
   ncols words (the rest of the 16 zero) at dst + p * dstride, stored under
   smask. nk k values; an odd last one is paired with zero. */
static BF16_TARGET void pack_interleave(const float *src, long ks, long ncols, long nk, int32_t *dst, long dstride,
                                        __mmask16 smask)
{
    /* word i of the result takes bf16 i (row k) and bf16 16 + i (row k + 1) */
    const __m512i mix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __mmask16 cm = lanes(ncols);
    long p = 0;
    for (; 2 * p + 1 < nk; p++) {
        __m512 even = _mm512_maskz_loadu_ps(cm, src + 2 * p * ks), odd = _mm512_maskz_loadu_ps(cm, src + (2 * p + 1) * ks);
        __m512i v = (__m512i)_mm512_cvtne2ps_pbh(odd, even);
        _mm512_mask_storeu_epi32(dst + p * dstride, smask, _mm512_permutexvar_epi16(mix, v));
    }
    if (2 * p < nk) {
        __m512 even = _mm512_maskz_loadu_ps(cm, src + 2 * p * ks);
        __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_setzero_ps(), even);
        _mm512_mask_storeu_epi32(dst + p * dstride, smask, _mm512_permutexvar_epi16(mix, v));
    }
}

/* r[i] word j -> r[j] word i: a 16 x 16 transpose in four rounds of shuffles
   (words within 128-bit lanes, then pairs of words, then lanes twice). */
static inline BF16_TARGET void transpose16(__m512i r[16])
{
    __m512i t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + e], lane L: rows 4g..4g+3 of column 4L + e */
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) {
        __m512i v = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88), w = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xdd);
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88), w2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xdd);
        r[e] = _mm512_shuffle_i32x4(v, v2, 0x88);
        r[8 + e] = _mm512_shuffle_i32x4(v, v2, 0xdd);
        r[4 + e] = _mm512_shuffle_i32x4(w, w2, 0x88);
        r[12 + e] = _mm512_shuffle_i32x4(w, w2, 0xdd);
    }
}

/* Packs k pairs where k is contiguous: nrows rows (rs apart, at most 16, the
   rest of the 16 zero) of nk values at src; pair p of row i goes to word i of
   dst + p * dstride, stored under smask. */
static BF16_TARGET void pack_transpose(const float *src, long rs, long nrows, long nk, int32_t *dst, long dstride,
                                       __mmask16 smask)
{
    for (long k0 = 0; k0 < nk; k0 += 32) {
        long kn = nk - k0 < 32 ? nk - k0 : 32, np = (kn + 1) / 2;
        __mmask16 lo = lanes(kn), hi = lanes(kn - 16);
        __m512i r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            if (i < nrows) {
                const float *s = src + i * rs + k0;
                r[i] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, s + 16), _mm512_maskz_loadu_ps(lo, s));
            } else {
                r[i] = _mm512_setzero_si512();
            }
        }
        transpose16(r);
        int32_t *d = dst + k0 / 2 * dstride;
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++)
            if (p < np)
                _mm512_mask_storeu_epi32(d + p * dstride, smask, r[p]);
    }
}

/* Packs op(A) rows [0, m) x k values [0, kc) into panels of mr rows (at most
   16), each kp * mr words (kp = ceil(kc / 2)). */
static BF16_TARGET void pack_a(const float *a, long sai, long sak, long m, long kc, int32_t *pa, long mr)
{
    long kp = (kc + 1) / 2;
    for (long i = 0; i < m; i += mr, pa += kp * mr) {
        if (sak == 1)
            pack_transpose(a + i * sai, sai, m - i < mr ? m - i : mr, kc, pa, mr, lanes(mr));
        else
            pack_interleave(a + i * sai, sak, m - i < mr ? m - i : mr, kc, pa, mr, lanes(mr));
    }
}

/* Packs op(B) k values [0, kc) x columns [0, n) into panels of nr columns (a
   multiple of 16), each kp * nr words, but the last, as wide as the multiple
   of 16 that covers it (columns past n zero), so that the micro-kernel for
   it computes fewer columns for nothing (N = 196 is 6 panels of 32 and one
   of 16, not of 32). With the columns contiguous (sbj 1), the rows of B are read in order,
   two at a time, across all the panels: reading panel by panel would walk
   down B with a stride of ldb, a cache line per row, which the hardware
   prefetchers follow badly (a third of the time of the 16 Winograd products
   of 64 x 1024 x 64 went there). */
static BF16_TARGET void pack_b(const float *b, long sbk, long sbj, long kc, long n, int32_t *pb, long nr)
{
    long kp = (kc + 1) / 2, npad = (n + 15) / 16 * 16;
    if (sbj == 1) {
        const __m512i mix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                             23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        for (long p = 0; p < kp; p++) {
            const float *even = b + 2 * p * sbk, *odd = even + sbk;
            int has_odd = 2 * p + 1 < kc;
            long w = nr < npad ? nr : npad;   /* the width of this panel */
            int32_t *panel = pb + p * w;
            for (long j = 0, h = 0; j < npad; j += 16) {
                __mmask16 cm = lanes(n - j);
                __m512 e = _mm512_maskz_loadu_ps(cm, even + j);
                __m512 o = has_odd ? _mm512_maskz_loadu_ps(cm, odd + j) : _mm512_setzero_ps();
                __m512i v = (__m512i)_mm512_cvtne2ps_pbh(o, e);
                _mm512_storeu_si512(panel + h, _mm512_permutexvar_epi16(mix, v));
                h += 16;
                if (h == w) {   /* the next panel */
                    panel += kp * w - p * w;
                    w = nr < npad - j - 16 ? nr : npad - j - 16;
                    panel += p * w, h = 0;
                }
            }
        }
        return;
    }
    for (long j = 0; j < n; j += nr, pb += kp * nr) {
        long w = nr < npad - j ? nr : npad - j;
        for (long h = 0; h < w; h += 16)
            pack_transpose(b + (j + h) * sbj, sbj, n - j - h, kc, pb + h, w, 0xffff);
    }
}

/* The micro-kernel, for R rows and V registers (16 columns each) of C:
   the tile (mr <= R rows, nr <= 16 V columns, rows ldc apart) := alpha * A
   panel . B panel + beta * tile, over kp k pairs. R and V are constants where
   it is inlined, so the loops unroll and the accumulators live in registers. */
static inline __attribute__((always_inline)) BF16_TARGET void tile(const int R, const int V, long kp, const int32_t *pa,
                                                                   const int32_t *pb, float *c, long ldc, long mr,
                                                                   long nr, float alpha, float beta)
{
    __m512 acc[12][3];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int v = 0; v < V; v++)
            acc[r][v] = _mm512_setzero_ps();
    for (long p = 0; p < kp; p++, pa += R, pb += 16 * V) {
        __m512bh b[3];
#pragma GCC unroll 3
        for (int v = 0; v < V; v++)
            b[v] = (__m512bh)_mm512_loadu_si512(pb + 16 * v);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512bh ar = (__m512bh)_mm512_set1_epi32(pa[r]);   /* the (k, k + 1) pair of row r, in every lane */
#pragma GCC unroll 3
            for (int v = 0; v < V; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, b[v]);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 mask[3];
#pragma GCC unroll 3
    for (int v = 0; v < V; v++)
        mask[v] = lanes(nr - 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        if (r >= mr)
            break;
#pragma GCC unroll 3
        for (int v = 0; v < V; v++) {
            float *cv = c + r * ldc + 16 * v;
            __m512 x = _mm512_mul_ps(acc[r][v], va);
            if (beta != 0.0f)   /* beta 0: C is not read */
                x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask[v], cv), x);
            _mm512_mask_storeu_ps(cv, mask[v], x);
        }
    }
}

typedef void Kernel(long kp, const int32_t *pa, const int32_t *pb, float *c, long ldc, long mr, long nr, float alpha,
                    float beta);

/* The micro-kernels: 12 x 32, the usual shape (24 accumulators; per k pair 2
   loads of B, 12 broadcasts of A); 8 x 48 where M is a multiple of 8 but not
   of 12 (64 output channels; 24 accumulators too); and the narrower ones for
   a last panel of B of fewer columns. */
#define KERNEL(R, V)                                                                                          \
    static BF16_TARGET void kernel_##R##x##V(long kp, const int32_t *pa, const int32_t *pb, float *c, long ldc, \
                                             long mr, long nr, float alpha, float beta)                       \
    {                                                                                                         \
        tile(R, V, kp, pa, pb, c, ldc, mr, nr, alpha, beta);                                                 \
    }
KERNEL(12, 2)
KERNEL(12, 1)
KERNEL(8, 3)
KERNEL(8, 2)
KERNEL(8, 1)
#undef KERNEL

/* blocks of at most max, as even as the unit allows: the block size */
static long block(long total, long max, long unit)
{
    long nb = (total + max - 1) / max, size = (total + nb - 1) / nb;
    return (size + unit - 1) / unit * unit;
}

/* The rows of the tile for m rows of C: the one that computes fewer padding
   rows (12 on a tie; the columns padded alike for both): 12 x 32, or 8 x 48. */
static long tile_rows(long m)
{
    return (m + 7) / 8 * 8 < (m + 11) / 12 * 12 ? 8 : 12;
}

/* words of one (k block, row block) of packed A: its panels of mr rows, kp pairs each */
static long a_block_words(long mcur, long kcur, long mr)
{
    return (mcur + mr - 1) / mr * mr * ((kcur + 1) / 2);
}

/* pre (may be NULL): op(A) packed by mgc_sbgemm_pack_a, its blocks in the order these loops visit them */
static BF16_TARGET void gemm_native(long m, long n, long k, float alpha, const float *a, long sai, long sak,
                                    const float *b, long sbk, long sbj, float beta, float *c, long ldc,
                                    const MgcPackedA *pre)
{
    long mr = tile_rows(m), nr = mr == 12 ? 32 : 48;
    Kernel *kernels[4] = {NULL, kernel_12x1, kernel_12x2, NULL};   /* by the panel's registers of B */
    if (mr == 8)
        kernels[1] = kernel_8x1, kernels[2] = kernel_8x2, kernels[3] = kernel_8x3;
    long kc = block(k, KC, 2), mc = block(m, MC, mr), nc = block(n, NC, nr), kp = kc / 2;
    size_t abytes = pre ? 0 : ((size_t)(mc * kp) * sizeof(int32_t) + 63) & ~(size_t)63;
    int32_t *pa = scratch(abytes + (size_t)(nc * kp) * sizeof(int32_t));
    int32_t *pb = pa + abytes / sizeof(int32_t);
    for (long jc = 0; jc < n; jc += nc) {
        long ncur = n - jc < nc ? n - jc : nc;
        const int32_t *pre_at = pre ? pre->words : NULL;
        for (long pc = 0; pc < k; pc += kc) {
            long kcur = k - pc < kc ? k - pc : kc, kpc = (kcur + 1) / 2;
            pack_b(b + pc * sbk + jc * sbj, sbk, sbj, kcur, ncur, pb, nr);
            float bc = pc == 0 ? beta : 1.0f;   /* later k blocks add to what the first wrote */
            for (long ic = 0; ic < m; ic += mc) {
                long mcur = m - ic < mc ? m - ic : mc;
                const int32_t *ablk = pa;
                if (pre)
                    ablk = pre_at, pre_at += a_block_words(mcur, kcur, mr);
                else
                    pack_a(a + ic * sai + pc * sak, sai, sak, mcur, kcur, pa, mr);
                for (long jr = 0; jr < ncur; jr += nr) {
                    Kernel *kernel = kernels[ncur - jr >= nr ? nr / 16 : (ncur - jr + 15) / 16];
                    for (long ir = 0; ir < mcur; ir += mr)
                        kernel(kpc, ablk + ir * kpc, pb + jr * kpc, c + (ic + ir) * ldc + jc + jr, ldc,
                               mcur - ir < mr ? mcur - ir : mr, ncur - jr < nr ? ncur - jr : nr, alpha, bc);
                }
            }
        }
    }
    free(pa);
}

/* op(A) packed whole, block by block in gemm_native's order (k blocks, then row blocks) */
static BF16_TARGET void pack_a_whole(MgcPackedA *p, const float *a, long sai, long sak)
{
    long m = p->m, k = p->k, mr = tile_rows(m), kc = block(k, KC, 2), mc = block(m, MC, mr), words = 0;
    for (long pc = 0; pc < k; pc += kc)
        for (long ic = 0; ic < m; ic += mc)
            words += a_block_words(m - ic < mc ? m - ic : mc, k - pc < kc ? k - pc : kc, mr);
    int32_t *w = p->words = scratch(sizeof(int32_t) * (size_t)words);
    for (long pc = 0; pc < k; pc += kc) {
        long kcur = k - pc < kc ? k - pc : kc;
        for (long ic = 0; ic < m; ic += mc) {
            long mcur = m - ic < mc ? m - ic : mc;
            pack_a(a + ic * sai + pc * sak, sai, sak, mcur, kcur, w, mr);
            w += a_block_words(mcur, kcur, mr);
        }
    }
}
#endif

/* ---- the entry point ---- */

/* C = beta * C with nothing to add (no k, or alpha 0), as sgemm does; beta == 0 writes zeros */
static void scale_c(long rows, long cols, float beta, float *c, long ldc)
{
    for (long i = 0; i < rows; i++)
        for (long j = 0; j < cols; j++)
            c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

void mgc_sbgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                const float *b, int ldb, float beta, float *c, int ldc)
{
    if (m <= 0 || n <= 0)
        return;
    int at = ta == CblasTrans || ta == CblasConjTrans, bt = tb == CblasTrans || tb == CblasConjTrans;
    /* op(A)[i][k] = a[i * sai + k * sak], op(B)[k][j] = b[k * sbk + j * sbj], C row-major (rows, cols) */
    long sai, sak, sbk, sbj, rows = m, cols = n;
    if (order == CblasColMajor) {
        /* C^T (row-major n x m) = op(B)^T op(A)^T: op(B)^T[j][k] = b[j * (bt ? 1 : ldb) + k * (bt ? ldb : 1)] */
        const float *t = a;
        a = b, b = t;
        sai = bt ? 1 : ldb, sak = bt ? ldb : 1;
        sbk = at ? 1 : lda, sbj = at ? lda : 1;
        rows = n, cols = m;
    } else {
        sai = at ? 1 : lda, sak = at ? lda : 1;
        sbk = bt ? 1 : ldb, sbj = bt ? ldb : 1;
    }
    if (k <= 0 || alpha == 0.0f) {
        scale_c(rows, cols, beta, c, ldc);
        return;
    }
#if BGEMM_X86
    if (mgc_bf16_native()) {
        gemm_native(rows, cols, k, alpha, a, sai, sak, b, sbk, sbj, beta, c, ldc, NULL);
        return;
    }
#endif
    gemm_emulated(rows, cols, k, alpha, a, sai, sak, b, sbk, sbj, beta, c, ldc);
}

/* ---- op(A) packed once, for many products (the Winograd form's filters) ---- */

MgcPackedA *mgc_sbgemm_pack_a(int ta, int m, int k, const float *a, int lda)
{
    MgcPackedA *p = scratch(sizeof *p);
    memset(p, 0, sizeof *p);
    p->m = m > 0 ? m : 0, p->k = k > 0 ? k : 0;
    p->native = mgc_bf16_native();
    if (!p->m || !p->k)
        return p;
    int at = ta == CblasTrans || ta == CblasConjTrans;
    long sai = at ? 1 : lda, sak = at ? lda : 1;
#if BGEMM_X86
    if (p->native) {
        pack_a_whole(p, a, sai, sak);
        return p;
    }
#endif
    /* kept as it lies (transposed or not), so that sgemm sums in the order mgc_sbgemm's call would */
    p->rounded = scratch(sizeof(float) * (size_t)(p->m * p->k));
    p->transposed = at;
    for (long i = 0; i < p->m; i++)
        for (long j = 0; j < p->k; j++)
            p->rounded[at ? j * p->m + i : i * p->k + j] = mgc_bf16_round(a[i * sai + j * sak]);
    return p;
}

void mgc_sbgemm_packed(const MgcPackedA *p, int tb, int n, float alpha, const float *b, int ldb, float beta, float *c,
                       int ldc)
{
    long m = p->m, k = p->k;
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0 || alpha == 0.0f) {
        scale_c(m, n, beta, c, ldc);
        return;
    }
    int bt = tb == CblasTrans || tb == CblasConjTrans;
    long sbk = bt ? 1 : ldb, sbj = bt ? ldb : 1;
#if BGEMM_X86
    if (p->native) {
        gemm_native(m, n, k, alpha, NULL, 0, 0, b, sbk, sbj, beta, c, ldc, p);
        return;
    }
#endif
    gemm_emulated(m, n, k, alpha, p->rounded, p->transposed ? 1 : k, p->transposed ? m : 1, b, sbk, sbj, beta, c, ldc);
}

void mgc_sbgemm_free(MgcPackedA *p)
{
    if (!p)
        return;
    free(p->words);
    free(p->rounded);
    free(p);
}
