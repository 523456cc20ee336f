/*
** Per-target preludes: the few macros every kernel body is written against.
**
**   KERNEL(name)     the kernel's signature; it takes one KArgs by value
**   FOR_EACH(i, n)   the kernel's one parallel loop over independent i in [0, n):
**                    C: this thread's contiguous share of [0, n) (the runtime
**                       calls the kernel once per thread, a.thread of a.nthreads);
**                    CUDA: a grid-stride loop
**   RESTRICT, DEVICE, DEVICE_FN (a helper function's head), MGC_INF, MGC_NAN, mgc_uniform(seed, i) (counter-based, in [0, 1))
**   expf, tanhf, erff  C: mgc's own, branch-free so that loops of them vectorise (the C
**                    prelude says how, and how close); CUDA: CUDA's
**   mgc_tanh_softplus(x)  tanh(log(1 + e^x)) without a log (Mish)
**   mgc_gelu_grad(x) GELU's derivative (C: erf's exponential shared with phi's)
**   mgc_keep(v, k)   v where k is non-zero, else +0.0f (v's bits kept, even a NaN's or an
**                    infinity's): C: by masking the bits, which compilers keep branch-free
**                    (a float select on data-dependent conditions may become a branch that
**                    the data mispredict); CUDA: a select
**   C only, for kernels whose steps are c_only: mgc_f8, mgc_f16 (8 and 16 floats
**   as one vector), mgc_load8/16, mgc_store16, mgc_i16 and mgc_load16i (16 ints: lane masks); mgc_gemm_tn(M, N, K, A, lda, B, ldb,
**   C, ldc), C = A^T . B for a short K; mgc_gemm_nn(...), C = A . B, nothing packed
**   (M >= 8, N >= 16), MGC_GEMM_NN_EPI(..., EPI) the same with an epilogue in registers,
**   MGC_GEMM_NN_EPI3 up to three examples at once;
**   mgc_vkeep, mgc_vsel, mgc_vsplat (activations' vector forms)
**
** Reductions (a kernel whose step has `blocks` set): one reduction per
** iteration of FOR_EACH_BLOCK, its inner loop shared by a block of threads.
**   FOR_EACH_BLOCK(c, n)   one reduction per c in [0, n): C: as FOR_EACH (a
**                          thread's contiguous share); CUDA: a blockIdx-stride
**                          loop, uniform over the block, so barriers inside are safe
**   BLOCK_LOOP(j, n)       the inner loop the block shares: C: all of [0, n);
**                          CUDA: this thread's j, strided by blockDim.x
**   BLOCK_LOOP2(k, nk, p, np)  the same over the pairs [0, nk) x [0, np), p
**                          fastest: C: two nested loops (the inner one
**                          contiguous, as before); CUDA: one flat loop over
**                          nk * np, so consecutive threads read consecutive p
**   BLOCK_SUM(v)           the sum of v (float or double) over the block, to
**                          every thread: C: (v); CUDA: warp shuffles, then the
**                          warps' sums through shared memory. Every thread of
**                          the block must call it (never under a condition that
**                          differs between threads); it may be called several
**                          times in a row (it waits before reusing its scratch)
**   BLOCK_LEADER           the one thread that writes a reduction's result:
**                          C: 1; CUDA: (threadIdx.x == 0)
**   MGC_LANES              independent partial sums a C thread keeps side by
**                          side (16: a sum the compiler may vectorise without
**                          reordering one chain); CUDA: 1 (the block is the lanes)
**   MGC_DLANES             the same for sums in double (8 on C)
**   PREFETCH_ROW(p, n)     C: asks for the n floats at p to be brought into
**                          cache (a reduction's next rows, which the hardware
**                          prefetcher does not foresee across a stride); CUDA:
**                          nothing
**
** The bodies (codegen/kernel.c and the op families above it) are the same
** text for both targets.
*/
#include "codegen.h"
#include "kargs.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* KArgs as the kernels see it: codegen/kargs.h's rows, one a line with its comment. */
#define KARGS_ROW(comment, ...) { CG_STR(__VA_ARGS__) ";", comment },
static const struct { const char *decl, *comment; } kargs_rows[] = { CG_KARGS_FIELDS(KARGS_ROW) };

static const char *kargs_text(Arena *a)
{
    const char *t = "typedef struct KArgs {\n";
    for (size_t k = 0; k < sizeof kargs_rows / sizeof kargs_rows[0]; k++)
        t = arena_printf(a, "%s    %-26s/* %s */\n", t, kargs_rows[k].decl, kargs_rows[k].comment);
    return arena_printf(a, "%s} KArgs;\n", t);
}

static const char prelude_common[] =
    "/* splitmix64 finaliser of (seed, i): a counter-based uniform in [0, 1) */\n"
    "DEVICE_FN float mgc_uniform(unsigned long long seed, unsigned long long i)\n"
    "{\n"
    "    unsigned long long z = seed + (i + 1) * 0x9E3779B97F4A7C15ULL;\n"
    "    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;\n"
    "    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;\n"
    "    z ^= z >> 31;\n"
    "    return (float)(int)(z >> 40) * (1.0f / 16777216.0f);   /* its top 24 bits, exact; by int: AVX2 has no vector u64 -> float */\n"
    "}\n"
    "/* tanh(softplus(x)) = tanh(log(1 + e^x)) = m / (m + 2), m = e^x (e^x + 2): no log, nothing lost\n"
    "   where e^x is small; x taken at most 20 (the value is 1 in float from x = 9 on): Mish's */\n"
    "DEVICE_FN float mgc_tanh_softplus(float x)\n"
    "{\n"
    "    float n = expf(x < 20.0f ? x : 20.0f), m = n * (n + 2.0f);\n"
    "    return m / (m + 2.0f);\n"
    "}\n";

static const char prelude_c[] =
    "/* mgc generated kernels, target C */\n"
    "#include <math.h>\n"
    "/* expf, tanhf and erff in the kernels are these: branch-free (both sides of a test computed,\n"
    "   one kept), so that a loop of them vectorises, where libm's are a call per element (a GELU's\n"
    "   gradient 16.5 -> 1.5 ns an element, SiLU's 2.4 -> 0.5). Against double precision: expf within\n"
    "   1 ulp, tanhf 2, erff 3 (1.2e-7 absolute); infinities, NaN, -0 and denormals as libm's.\n"
    "   e^x = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts), e^r by its series to r^7,\n"
    "   2^n in two halves (n from -150 to 128); tanh |x| = 1 - 2 / (e^2|x| + 1), below 0.55 an odd\n"
    "   polynomial; erf |x| below 0.85 an odd polynomial, above 1 - e^-x^2 g(1 / (1 + |x| / 2)), g a\n"
    "   polynomial (both least-squares fits to double precision's, relative error 3.4e-10) */\n"
    "static inline __attribute__((always_inline)) float mgc_pow2i(int n)   /* 2^n, n in [-126, 127] */\n"
    "{\n"
    "    union { unsigned u; float f; } b = { (unsigned)(n + 127) << 23 };\n"
    "    return b.f;\n"
    "}\n"
    "static inline __attribute__((always_inline)) float mgc_expf(float x)\n"
    "{\n"
    "    float c = x < -104.0f ? -104.0f : x > 89.0f ? 89.0f : x;\n"
    "    float n = __builtin_rintf(c * 1.44269504088896341f);\n"
    "    float r = (c - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;\n"
    "    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666672e-01f + r * (4.16666679e-02f + r * (8.33333377e-03f +\n"
    "              r * (1.38888892e-03f + r * 1.98412701e-04f))))));\n"
    "    int k = (int)n, h = k >> 1;\n"
    "    float y = p * mgc_pow2i(h) * mgc_pow2i(k - h);\n"
    "    return x != x ? x : y;\n"
    "}\n"
    "static inline __attribute__((always_inline)) float mgc_tanhf(float x)\n"
    "{\n"
    "    float a = __builtin_fabsf(x), s = a * a;\n"
    "    float small = a + a * s * (-3.33333333e-01f + s * (1.33333259e-01f + s * (-5.39650559e-02f + s * (2.18213327e-02f +\n"
    "                  s * (-8.53629917e-03f + s * 2.53874044e-03f)))));\n"
    "    float big = 1.0f - 2.0f / (mgc_expf(2.0f * a) + 1.0f);\n"
    "    return x != x ? x : __builtin_copysignf(a < 0.55f ? small : big, x);\n"
    "}\n"
    "static inline __attribute__((always_inline)) float mgc_erff_e(float x, float e)   /* e = e^-x^2 */\n"
    "{\n"
    "    float a = __builtin_fabsf(x), s = a * a;\n"
    "    float small = a * (1.128379167e+00f + s * (-3.761263590e-01f + s * (1.128372540e-01f + s * (-2.686097921e-02f +\n"
    "                  s * (5.204870806e-03f + s * (-8.185928444e-04f + s * 8.553019623e-05f))))));\n"
    "    float t = 1.0f / (1.0f + 0.5f * a);\n"
    "    float g = -1.355299816e-04f + t * (2.845925875e-01f + t * (2.620671309e-01f + t * (3.377840735e-01f + t * (-7.750006129e-02f +\n"
    "              t * (5.201438862e-01f + t * (-4.271320494e-01f + t * (9.387584934e-02f + t * 6.377271754e-03f)))))));\n"
    "    float big = a >= 4.0f ? 1.0f : 1.0f - e * g;\n"
    "    return x != x ? x : __builtin_copysignf(a < 0.85f ? small : big, x);\n"
    "}\n"
    "static inline __attribute__((always_inline)) float mgc_erff(float x) { return mgc_erff_e(x, mgc_expf(-(x * x))); }\n"
    "/* GELU's derivative Phi(x) + x phi(x), phi(x) = e^(-x^2 / 2) / sqrt(2 pi): the e^-z^2 that\n"
    "   erf(z), z = x / sqrt 2, needs, made once */\n"
    "static inline __attribute__((always_inline)) float mgc_gelu_grad(float x)\n"
    "{\n"
    "    float z = x * 0.70710678118654752f, e = mgc_expf(-(z * z));\n"
    "    return 0.5f * (1.0f + mgc_erff_e(z, e)) + x * 0.39894228040143268f * e;\n"
    "}\n"
    "#define expf(x) mgc_expf(x)\n"
    "#define tanhf(x) mgc_tanhf(x)\n"
    "#define erff(x) mgc_erff(x)\n"
    "#define DEVICE\n"
    "#define DEVICE_FN static inline\n"
    "#define RESTRICT restrict\n"
    "#define MGC_INF INFINITY\n"
    "#define MGC_NAN NAN\n"
    "#define KERNEL(name) void name\n"
    "#define FOR_EACH(i, n) \\\n"
    "    for (long i##_n = (n), i = i##_n * a.thread / a.nthreads, i##_end = i##_n * (a.thread + 1) / a.nthreads; \\\n"
    "         i < i##_end; i++)\n"
    "#define FOR_EACH_BLOCK(c, n) FOR_EACH(c, n)\n"
    "#define BLOCK_LOOP(j, n) for (long j = 0; j < (n); j++)\n"
    "#define BLOCK_LOOP2(k, nk, p, np) \\\n"
    "    for (long k = 0, k##_n = (nk), k##_np = (np); k < k##_n; k++) \\\n"
    "        for (long p = 0; p < k##_np; p++)\n"
    "#define BLOCK_SUM(v) (v)\n"
    "#define BLOCK_LEADER 1\n"
    "#define MGC_LANES 16\n"
    "#define MGC_DLANES 8\n"
    "#define PREFETCH_ROW(p, n) for (long pf_ = 0; pf_ < (n); pf_ += 16) __builtin_prefetch((p) + pf_)\n"
    "/* C-only kernels (their steps' c_only): 8 and 16 floats as one vector (GCC's vector\n"
    "   extension), loaded from any float's place; arithmetic with a float broadcasts it */\n"
    "typedef float mgc_f8 __attribute__((vector_size(32)));\n"
    "static inline mgc_f8 mgc_load8(const float *p) { mgc_f8 v; __builtin_memcpy(&v, p, sizeof v); return v; }\n"
    "static inline void mgc_store8(float *p, mgc_f8 v) { __builtin_memcpy(p, &v, sizeof v); }\n"
    "/* d's 8 rows (d + r * ldd) = the columns of s's 8 rows (s + r * lds): 24 shuffles in registers\n"
    "   (__builtin_shufflevector in clang and GCC 12 on, __builtin_shuffle in older GCC) */\n"
    "#if defined(__clang__) || __GNUC__ >= 12\n"
    "#define MGC_SHUF8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)\n"
    "#else\n"
    "typedef int mgc_i8 __attribute__((vector_size(32)));\n"
    "#define MGC_SHUF8(a, b, i0, i1, i2, i3, i4, i5, i6, i7) __builtin_shuffle(a, b, (mgc_i8){ i0, i1, i2, i3, i4, i5, i6, i7 })\n"
    "#endif\n"
    "static inline __attribute__((always_inline)) void mgc_transpose8(const float *s, long lds, float *d, long ldd)\n"
    "{\n"
    "    mgc_f8 r[8], t[8], u[8];\n"
    "    for (int i = 0; i < 8; i++) r[i] = mgc_load8(s + i * lds);\n"
    "    for (int i = 0; i < 8; i += 2) {   /* pairs of rows interleaved */\n"
    "        t[i] = MGC_SHUF8(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);\n"
    "        t[i + 1] = MGC_SHUF8(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);\n"
    "    }\n"
    "    for (int i = 0; i < 8; i += 4)     /* four rows' columns by 128-bit lane */\n"
    "        for (int j = 0; j < 2; j++) {\n"
    "            u[i + 2 * j] = MGC_SHUF8(t[i + j], t[i + j + 2], 0, 1, 8, 9, 4, 5, 12, 13);\n"
    "            u[i + 2 * j + 1] = MGC_SHUF8(t[i + j], t[i + j + 2], 2, 3, 10, 11, 6, 7, 14, 15);\n"
    "        }\n"
    "    for (int c = 0; c < 4; c++) {      /* columns c and c + 4: the lanes of rows 0-3 and 4-7 */\n"
    "        mgc_store8(d + c * ldd, MGC_SHUF8(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11));\n"
    "        mgc_store8(d + (c + 4) * ldd, MGC_SHUF8(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15));\n"
    "    }\n"
    "}\n"
    "typedef float mgc_f16 __attribute__((vector_size(64)));\n"
    "static inline mgc_f16 mgc_load16(const float *p) { mgc_f16 v; __builtin_memcpy(&v, p, sizeof v); return v; }\n"
    "static inline void mgc_store16(float *p, mgc_f16 v) { __builtin_memcpy(p, &v, sizeof v); }\n"
    "typedef int mgc_i16 __attribute__((vector_size(64)));   /* 16 ints: a lane mask (all ones or 0) */\n"
    "static inline mgc_i16 mgc_load16i(const int *p) { mgc_i16 v; __builtin_memcpy(&v, p, sizeof v); return v; }\n"
    "/* C[M, N] = A^T . B, A [K, M] (row stride lda), B [K, N] (ldb), C (ldc): a GEMM with a short K\n"
    "   (a convolution's input gradient with few output channels), where a BLAS's packing costs\n"
    "   more than the multiply-adds: blocks of 6 rows by two vectors of columns in registers, the\n"
    "   vectors as wide as the CPU's (12 accumulators: 16 floats each with AVX-512's 32 registers,\n"
    "   8 with AVX2's 16, which 16-float ones would overflow) */\n"
    "#ifdef __AVX512F__\n"
    "typedef mgc_f16 mgc_gv;\n"
    "#define MGC_GW 16\n"
    "#define MGC_DOT_ROWS 8   /* mgc_nn_dots' rows at once */\n"
    "#else\n"
    "typedef mgc_f8 mgc_gv;\n"
    "#define MGC_GW 8\n"
    "#define MGC_DOT_ROWS 2\n"
    "#endif\n"
    "static inline mgc_gv mgc_loadg(const float *p) { mgc_gv v; __builtin_memcpy(&v, p, sizeof v); return v; }\n"
    "static inline void mgc_storeg(float *p, mgc_gv v) { __builtin_memcpy(p, &v, sizeof v); }\n"
    "static inline void mgc_gemm_tn(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc)\n"
    "{\n"
    "    int j = 0;\n"
    "    for (; j + 2 * MGC_GW <= N; j += 2 * MGC_GW) {\n"
    "        int m = 0;\n"
    "        for (; m + 6 <= M; m += 6) {\n"
    "            mgc_gv c0 = { 0 }, c1 = { 0 }, c2 = { 0 }, c3 = { 0 }, c4 = { 0 }, c5 = { 0 };\n"
    "            mgc_gv d0 = { 0 }, d1 = { 0 }, d2 = { 0 }, d3 = { 0 }, d4 = { 0 }, d5 = { 0 };\n"
    "            for (int k = 0; k < K; k++) {\n"
    "                const mgc_gv b0 = mgc_loadg(B + (long)k * ldb + j), b1 = mgc_loadg(B + (long)k * ldb + j + MGC_GW);\n"
    "                const float *a = A + (long)k * lda + m;\n"
    "                c0 += a[0] * b0; d0 += a[0] * b1;\n"
    "                c1 += a[1] * b0; d1 += a[1] * b1;\n"
    "                c2 += a[2] * b0; d2 += a[2] * b1;\n"
    "                c3 += a[3] * b0; d3 += a[3] * b1;\n"
    "                c4 += a[4] * b0; d4 += a[4] * b1;\n"
    "                c5 += a[5] * b0; d5 += a[5] * b1;\n"
    "            }\n"
    "            float *c = C + (long)m * ldc + j;\n"
    "            mgc_storeg(c, c0); mgc_storeg(c + MGC_GW, d0); c += ldc;\n"
    "            mgc_storeg(c, c1); mgc_storeg(c + MGC_GW, d1); c += ldc;\n"
    "            mgc_storeg(c, c2); mgc_storeg(c + MGC_GW, d2); c += ldc;\n"
    "            mgc_storeg(c, c3); mgc_storeg(c + MGC_GW, d3); c += ldc;\n"
    "            mgc_storeg(c, c4); mgc_storeg(c + MGC_GW, d4); c += ldc;\n"
    "            mgc_storeg(c, c5); mgc_storeg(c + MGC_GW, d5);\n"
    "        }\n"
    "        for (; m < M; m++) {\n"
    "            mgc_gv c0 = { 0 }, d0 = { 0 };\n"
    "            for (int k = 0; k < K; k++) {\n"
    "                const float a = A[(long)k * lda + m];\n"
    "                c0 += a * mgc_loadg(B + (long)k * ldb + j);\n"
    "                d0 += a * mgc_loadg(B + (long)k * ldb + j + MGC_GW);\n"
    "            }\n"
    "            mgc_storeg(C + (long)m * ldc + j, c0);\n"
    "            mgc_storeg(C + (long)m * ldc + j + MGC_GW, d0);\n"
    "        }\n"
    "    }\n"
    "    for (; j < N; j++)   /* the last N % (2 MGC_GW) columns */\n"
    "        for (int m = 0; m < M; m++) {\n"
    "            float s = 0.0f;\n"
    "            for (int k = 0; k < K; k++) s += A[(long)k * lda + m] * B[(long)k * ldb + j];\n"
    "            C[(long)m * ldc + j] = s;\n"
    "        }\n"
    "}\n"
    "/* C[M, N] = A . B, A [M, K] (row stride lda) and B [K, N] (ldb) read in place, C (ldc): a GEMM\n"
    "   on one example's map (a 1x1 convolution of an evaluation program, y = w . x) with nothing\n"
    "   packed: blocks of 8 rows by 48, 32 or 16 columns in registers (AVX-512's; AVX2's below), each\n"
    "   A element broadcast; the last rows and columns as a block ending at the edge (computed twice,\n"
    "   the same values) or the\n"
    "   last columns as dot products (mgc_nn_dot_tail). M >= 8 and N >= 16 (the callers' condition).\n"
    "   Each C element one sum over k in order, the dot products' as mgc_nn_dots says */\n"
    "#ifdef __AVX512F__\n"
    "static inline __attribute__((always_inline)) void mgc_gemm_nn_sums(int K, const float *A, int lda, const float *B,\n"
    "                                                                   const float *B2, int ldb, int two, mgc_f16 *c, mgc_f16 *d)\n"
    "{\n"
    "    for (int r = 0; r < 8; r++) c[r] = (mgc_f16){ 0 }, d[r] = (mgc_f16){ 0 };\n"
    "    if (two)   /* d: the 16 columns at B2 (B + 16, or another example's) */\n"
    "        for (int k = 0; k < K; k++) {\n"
    "            const mgc_f16 b0 = mgc_load16(B + (long)k * ldb), b1 = mgc_load16(B2 + (long)k * ldb);\n"
    "            for (int r = 0; r < 8; r++) c[r] += A[(long)r * lda + k] * b0, d[r] += A[(long)r * lda + k] * b1;\n"
    "        }\n"
    "    else\n"
    "        for (int k = 0; k < K; k++) {\n"
    "            const mgc_f16 b0 = mgc_load16(B + (long)k * ldb);\n"
    "            for (int r = 0; r < 8; r++) c[r] += A[(long)r * lda + k] * b0;\n"
    "        }\n"
    "}\n"
    "/* 8 rows by three vectors of 16 columns: B's 48 (B1 = B + 16, B2 = B + 32), or the 16 at B, B1 and\n"
    "   B2 of three examples; c[8 v + r] the sums of row r's vector v (24 vectors in registers: 3 loads and 8\n"
    "   broadcasts a k for 24 multiply-adds, where 16 columns take 1 and 8 for 8). On the way, where t > 0,\n"
    "   the t columns from B + at copied to col (col[q K + k]) for mgc_nn_dots: their rows are in cache now */\n"
    "static inline __attribute__((always_inline)) void mgc_gemm_nn_sums3(int K, const float *A, int lda, const float *B, const float *B1,\n"
    "                                                                    const float *B2, int ldb, mgc_f16 *c, float *col, int t, int at)\n"
    "{\n"
    "    for (int r = 0; r < 24; r++) c[r] = (mgc_f16){ 0 };\n"
    "    for (int k = 0; k < K; k++) {\n"
    "        const float *b = B + (long)k * ldb;\n"
    "        const mgc_f16 b0 = mgc_load16(b), b1 = mgc_load16(B1 + (long)k * ldb), b2 = mgc_load16(B2 + (long)k * ldb);\n"
    "        for (int q = 0; q < t; q++) col[(long)q * K + k] = b[at + q];\n"
    "        for (int r = 0; r < 8; r++) {\n"
    "            const float a = A[(long)r * lda + k];\n"
    "            c[r] += a * b0, c[8 + r] += a * b1, c[16 + r] += a * b2;\n"
    "        }\n"
    "    }\n"
    "}\n"
    "#else\n"
    "/* The same sums on AVX2, whose 16 registers 16-float vectors would overflow (24 of them are 48):\n"
    "   rows 0 to 5 by each 16 columns (12 accumulators: the shape that keeps both FMA units busy\n"
    "   here), then rows 6 and 7 by all the columns; every sum over k in AVX-512's order, the same\n"
    "   values. mgc_nn_6x16: A's 6 rows by B's 16 columns, row r to o + 16 r (an mgc_f16 each) */\n"
    "static inline __attribute__((always_inline)) void mgc_nn_6x16(int K, const float *A, int lda, const float *B, int ldb, float *o)\n"
    "{\n"
    "    mgc_f8 s[6][2];\n"
    "    for (int r = 0; r < 6; r++) s[r][0] = s[r][1] = (mgc_f8){ 0 };\n"
    "    for (int k = 0; k < K; k++) {\n"
    "        const mgc_f8 b0 = mgc_load8(B + (long)k * ldb), b1 = mgc_load8(B + (long)k * ldb + 8);\n"
    "        for (int r = 0; r < 6; r++) {\n"
    "            const float a = A[(long)r * lda + k];\n"
    "            s[r][0] += a * b0, s[r][1] += a * b1;\n"
    "        }\n"
    "    }\n"
    "    for (int r = 0; r < 6; r++) mgc_store8(o + 16 * r, s[r][0]), mgc_store8(o + 16 * r + 8, s[r][1]);\n"
    "}\n"
    "/* A's 2 rows by n (1 to 3) blocks of 16 columns at p[v], to o[v] (the second row 16 floats on) */\n"
    "static inline __attribute__((always_inline)) void mgc_nn_2x16n(int K, const float *A, int lda, const float *const *p, int n, int ldb,\n"
    "                                                               float *const *o)\n"
    "{\n"
    "    mgc_f8 s[2][6];\n"
    "    for (int i = 0; i < 6; i++) s[0][i] = s[1][i] = (mgc_f8){ 0 };\n"
    "    for (int k = 0; k < K; k++) {\n"
    "        mgc_f8 b[6];\n"
    "        for (int i = 0; i < 2 * n; i++) b[i] = mgc_load8(p[i / 2] + (long)k * ldb + 8 * (i % 2));\n"
    "        const float a0 = A[k], a1 = A[lda + k];\n"
    "        for (int i = 0; i < 2 * n; i++) s[0][i] += a0 * b[i], s[1][i] += a1 * b[i];\n"
    "    }\n"
    "    for (int i = 0; i < 2 * n; i++) mgc_store8(o[i / 2] + 8 * (i % 2), s[0][i]), mgc_store8(o[i / 2] + 16 + 8 * (i % 2), s[1][i]);\n"
    "}\n"
    "static inline __attribute__((always_inline)) void mgc_gemm_nn_sums(int K, const float *A, int lda, const float *B,\n"
    "                                                                   const float *B2, int ldb, int two, mgc_f16 *c, mgc_f16 *d)\n"
    "{\n"
    "    const float *p[2] = { B, B2 };\n"
    "    float *o[2] = { (float *)(c + 6), (float *)(d + 6) };\n"
    "    mgc_nn_6x16(K, A, lda, B, ldb, (float *)c);\n"
    "    if (two) mgc_nn_6x16(K, A, lda, B2, ldb, (float *)d);\n"
    "    mgc_nn_2x16n(K, A + 6L * lda, lda, p, two ? 2 : 1, ldb, o);\n"
    "}\n"
    "static inline __attribute__((always_inline)) void mgc_gemm_nn_sums3(int K, const float *A, int lda, const float *B, const float *B1,\n"
    "                                                                    const float *B2, int ldb, mgc_f16 *c, float *col, int t, int at)\n"
    "{\n"
    "    const float *p[3] = { B, B1, B2 };\n"
    "    float *o[3] = { (float *)(c + 6), (float *)(c + 14), (float *)(c + 22) };\n"
    "    for (int k = 0; k < K; k++)\n"
    "        for (int q = 0; q < t; q++) col[(long)q * K + k] = B[(long)k * ldb + at + q];\n"
    "    for (int v = 0; v < 3; v++) mgc_nn_6x16(K, A, lda, p[v], ldb, (float *)(c + 8 * v));\n"
    "    mgc_nn_2x16n(K, A + 6L * lda, lda, p, 3, ldb, o);\n"
    "}\n"
    "#endif\n"
    "/* Lane-wise selections on mgc_f16 (an activation's vector form, ir/activations.def): v where the\n"
    "   mask m (a comparison's) is set, else +0; a where m, else b; the float s in every lane */\n"
    "static inline mgc_f16 mgc_vkeep(mgc_f16 v, mgc_i16 m) { return (mgc_f16)((mgc_i16)v & m); }\n"
    "static inline mgc_f16 mgc_vsel(mgc_i16 m, mgc_f16 a, mgc_f16 b) { return (mgc_f16)(((mgc_i16)a & m) | ((mgc_i16)b & ~m)); }\n"
    "static inline mgc_f16 mgc_vsplat(float s) { return s - (mgc_f16){ 0 }; }\n"
    "/* s[r] = A's row r . col for 8 rows (col K contiguous floats; col2, another example's column,\n"
    "   to s[8 + r]): each sum 16 lanes of k, then the lanes in order, then the last K % 16; the 8 (or\n"
    "   16) sums side by side, sharing each load of A */\n"
    "static inline __attribute__((always_inline)) void mgc_nn_dots(int K, const float *A, int lda, const float *col,\n"
    "                                                              const float *col2, float *s)\n"
    "{\n"
    "    mgc_f16 c[8], d[8];\n"
    "    const int k = K - K % 16;\n"
    "    for (int r0 = 0; r0 < 8; r0 += MGC_DOT_ROWS) {   /* rows in groups whose sums fit the registers */\n"
    "        mgc_f16 cg[MGC_DOT_ROWS], dg[MGC_DOT_ROWS];\n"
    "        for (int r = 0; r < MGC_DOT_ROWS; r++) cg[r] = (mgc_f16){ 0 }, dg[r] = (mgc_f16){ 0 };\n"
    "        if (col2)\n"
    "            for (int q = 0; q < k; q += 16) {\n"
    "                const mgc_f16 v = mgc_load16(col + q), v2 = mgc_load16(col2 + q);\n"
    "                for (int r = 0; r < MGC_DOT_ROWS; r++) {\n"
    "                    const mgc_f16 a = mgc_load16(A + (long)(r0 + r) * lda + q);\n"
    "                    cg[r] += a * v, dg[r] += a * v2;\n"
    "                }\n"
    "            }\n"
    "        else\n"
    "            for (int q = 0; q < k; q += 16) {\n"
    "                const mgc_f16 v = mgc_load16(col + q);\n"
    "                for (int r = 0; r < MGC_DOT_ROWS; r++) cg[r] += mgc_load16(A + (long)(r0 + r) * lda + q) * v;\n"
    "            }\n"
    "        for (int r = 0; r < MGC_DOT_ROWS; r++) c[r0 + r] = cg[r], d[r0 + r] = dg[r];\n"
    "    }\n"
    "    for (int r = 0; r < 8; r++) {\n"
    "        float u = 0.0f, u2 = 0.0f;\n"
    "        for (int l = 0; l < 16; l++) u += c[r][l];\n"
    "        for (int q = k; q < K; q++) u += A[(long)r * lda + q] * col[q];\n"
    "        if (col2) {\n"
    "            for (int l = 0; l < 16; l++) u2 += d[r][l];\n"
    "            for (int q = k; q < K; q++) u2 += A[(long)r * lda + q] * col2[q];\n"
    "        }\n"
    "        s[r] = u, s[8 + r] = u2;\n"
    "    }\n"
    "}\n"
    "/* Whether the last t = N % 16 columns are done as dot products (mgc_nn_dots: per column K / 16\n"
    "   loads of it and 8 K / 16 multiply-adds, then 8 sums of 16 lanes; its copy rides along a\n"
    "   block's pass over B), not as a block of 16 columns ending at the edge (8 K multiply-adds, 16 - t\n"
    "   of its columns computed twice): where t (9 K + 2048) < 128 K, as a 7x7 map's 49 = 3 x 16 + 1 for\n"
    "   K >= 17 and a 14x14 map's 4 for K >= 113, and t K at most MGC_NN_DOT_K (the copy's room) */\n"
    "#define MGC_NN_DOT_K 2048\n"
    "static inline int mgc_nn_dot_tail(int t, int K) { return t > 0 && t * K <= MGC_NN_DOT_K && t * (9 * K + 2048) < 128 * K; }\n"
    "/* The GEMM with an epilogue: each block's sums, still in registers, stored as EPI(s, r) (s an\n"
    "   mgc_f16 of row r, a macro of the kernel's: its bias and activation), not in a pass after it.\n"
    "   MGC_GEMM_NN_EPI3 does up to three examples with the same A (B2, C2 and B3, C3; NULL: none):\n"
    "   their blocks of 16 columns side by side (24 or 16 sums in registers where one has 8), their\n"
    "   dot products two at a time */\n"
    "#define MGC_GEMM_NN_EPI(M, N, K, A, lda, B, ldb, C, ldc, EPI) \\\n"
    "    MGC_GEMM_NN_EPI3(M, N, K, A, lda, B, (const float *)0, (const float *)0, ldb, C, (float *)0, (float *)0, ldc, EPI)\n"
    "#define MGC_GEMM_NN_EPI3(M, N, K, A, lda, B, B2, B3, ldb, C, C2, C3, ldc, EPI) do { \\\n"
    "    const float *const bs_[3] = { (B), (B2), (B3) }; \\\n"
    "    float *const cs_[3] = { (C), (C2), (C3) }; \\\n"
    "    const int ne_ = (B3) ? 3 : (B2) ? 2 : 1, t_ = (N) % 16, dots_ = mgc_nn_dot_tail(t_, (K)); \\\n"
    "    const int nv_ = dots_ ? (N) - t_ : (N);   /* the columns in blocks */ \\\n"
    "    const int n48_ = nv_ - nv_ % 48, j16_ = n48_ + (nv_ - n48_ >= 32 ? 32 : 0); \\\n"
    "    for (int mb_ = 0; mb_ < (M); mb_ += 8) { \\\n"
    "        const int m_ = mb_ + 8 <= (M) ? mb_ : (M) - 8; \\\n"
    "        const float *am_ = (A) + (long)m_ * (lda); \\\n"
    "        mgc_f16 c_[24]; \\\n"
    "        float col_[3 * MGC_NN_DOT_K]; \\\n"
    "        for (int e_ = 0; e_ < ne_; e_++) { \\\n"
    "            const float *b_ = bs_[e_]; \\\n"
    "            float *cm_ = cs_[e_] + (long)m_ * (ldc); \\\n"
    "            for (int j_ = 0; j_ < n48_; j_ += 48) { \\\n"
    "                if (dots_ && j_ + 48 == n48_) \\\n"
    "                    mgc_gemm_nn_sums3((K), am_, (lda), b_ + j_, b_ + j_ + 16, b_ + j_ + 32, (ldb), c_, col_ + e_ * MGC_NN_DOT_K, t_, nv_ - j_); \\\n"
    "                else \\\n"
    "                    mgc_gemm_nn_sums3((K), am_, (lda), b_ + j_, b_ + j_ + 16, b_ + j_ + 32, (ldb), c_, (float *)0, 0, 0); \\\n"
    "                for (int r_ = 0; r_ < 8; r_++) \\\n"
    "                    for (int v_ = 0; v_ < 3; v_++) \\\n"
    "                        mgc_store16(cm_ + (long)r_ * (ldc) + j_ + 16 * v_, EPI(c_[8 * v_ + r_], m_ + r_)); \\\n"
    "            } \\\n"
    "            if (j16_ > n48_) { \\\n"
    "                mgc_gemm_nn_sums((K), am_, (lda), b_ + n48_, b_ + n48_ + 16, (ldb), 1, c_, c_ + 8); \\\n"
    "                for (int r_ = 0; r_ < 8; r_++) \\\n"
    "                    for (int v_ = 0; v_ < 2; v_++) \\\n"
    "                        mgc_store16(cm_ + (long)r_ * (ldc) + n48_ + 16 * v_, EPI(c_[8 * v_ + r_], m_ + r_)); \\\n"
    "            } \\\n"
    "            if (dots_ && n48_ == 0) \\\n"
    "                for (int k_ = 0; k_ < (K); k_++) \\\n"
    "                    for (int q_ = 0; q_ < t_; q_++) col_[e_ * MGC_NN_DOT_K + q_ * (K) + k_] = b_[(long)k_ * (ldb) + nv_ + q_]; \\\n"
    "        } \\\n"
    "        for (int j_ = j16_; j_ < nv_; j_ += 16) { \\\n"
    "            const int at_ = j_ + 16 <= nv_ ? j_ : nv_ - 16; \\\n"
    "            if (ne_ == 3) \\\n"
    "                mgc_gemm_nn_sums3((K), am_, (lda), (B) + at_, (B2) + at_, (B3) + at_, (ldb), c_, (float *)0, 0, 0); \\\n"
    "            else \\\n"
    "                mgc_gemm_nn_sums((K), am_, (lda), (B) + at_, ne_ == 2 ? (B2) + at_ : (B), (ldb), ne_ == 2, c_, c_ + 8); \\\n"
    "            for (int e_ = 0; e_ < ne_; e_++) \\\n"
    "                for (int r_ = 0; r_ < 8; r_++) \\\n"
    "                    mgc_store16(cs_[e_] + (long)(m_ + r_) * (ldc) + at_, EPI(c_[8 * e_ + r_], m_ + r_)); \\\n"
    "        } \\\n"
    "        for (int q_ = 0; dots_ && q_ < t_; q_++) \\\n"
    "            for (int e_ = 0; e_ < ne_; e_ += 2) { \\\n"
    "                float s_[16]; \\\n"
    "                const float *col2_ = e_ + 1 < ne_ ? col_ + (e_ + 1) * MGC_NN_DOT_K + q_ * (K) : (const float *)0; \\\n"
    "                mgc_nn_dots((K), am_, (lda), col_ + e_ * MGC_NN_DOT_K + q_ * (K), col2_, s_); \\\n"
    "                for (int f_ = e_; f_ < ne_ && f_ < e_ + 2; f_++) \\\n"
    "                    for (int r_ = 0; r_ < 8; r_++) \\\n"
    "                        cs_[f_][(long)(m_ + r_) * (ldc) + nv_ + q_] = EPI(mgc_vsplat(s_[8 * (f_ - e_) + r_]), m_ + r_)[0]; \\\n"
    "            } \\\n"
    "    } \\\n"
    "} while (0)\n"
    "#define MGC_EPI_NONE(s, r) (s)\n"
    "static inline void mgc_gemm_nn(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc)\n"
    "{\n"
    "    MGC_GEMM_NN_EPI(M, N, K, A, lda, B, ldb, C, ldc, MGC_EPI_NONE);\n"
    "}\n"
    "static inline float mgc_keep(float v, int k)\n"
    "{\n"
    "    union { float f; unsigned u; } b = { v };\n"
    "    b.u &= -(unsigned)(k != 0);\n"
    "    return b.f;\n"
    "}\n"
    "/* v rounded to bf16 (to nearest, ties to even; a NaN stays one), as a float */\n"
    "static inline float mgc_bf16r(float v)\n"
    "{\n"
    "    union { float f; unsigned u; } b = { v };\n"
    "    b.u = (b.u & 0x7fffffffu) > 0x7f800000u ? b.u | 0x00400000u : b.u + 0x7fffu + ((b.u >> 16) & 1u);\n"
    "    b.u &= 0xffff0000u;\n"
    "    return b.f;\n"
    "}\n"
    "/* bf16 bits (Buf.bf16: only GPU programs have such buffers, whose CUDA text converts on every\n"
    "   read and store; here a struct, so that C text storing a float into one does not compile) */\n"
    "typedef struct mgc_bf16 { unsigned short bits; } mgc_bf16;\n"
    "static inline mgc_bf16 mgc_to_bf16(float v)\n"
    "{\n"
    "    union { float f; unsigned u; } b = { mgc_bf16r(v) };\n"
    "    mgc_bf16 r = { (unsigned short)(b.u >> 16) };\n"
    "    return r;\n"
    "}\n"
    "/* CBLAS, from the process (mgc links OpenBLAS, single-threaded: each thread calls it\n"
    "   on its own share): for kernels that run GEMMs on a few examples at a time */\n"
    "#include <stdio.h>\n"
    "#include <stdlib.h>\n"
    "/* a kernel's own scratch memory (malloc); without it the step cannot run: stop with a message */\n"
    "static inline float *mgc_scratch(long floats, const char *kernel)\n"
    "{\n"
    "    float *p = malloc(sizeof(float) * (size_t)(floats > 0 ? floats : 1));\n"
    "    if (!p) {\n"
    "        fprintf(stderr, \"mgc: out of memory: kernel %s needs %ld MB of scratch memory\\n\", kernel, (floats >> 18) + 1);\n"
    "        abort();\n"
    "    }\n"
    "    return p;\n"
    "}\n"
    "enum { MGC_ROW_MAJOR = 101, MGC_NO_TRANS = 111, MGC_TRANS = 112 };\n"
    "void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,\n"
    "                 const float *b, int ldb, float beta, float *c, int ldc);\n"
    "/* --precision bf16: the same GEMM with A and B rounded to bf16 as it packs them, the products summed in\n"
    "   fp32 (mgc's runtime/bgemm.c) */\n"
    "void mgc_sbgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,\n"
    "                const float *b, int ldb, float beta, float *c, int ldc);\n"
    "/* and with op(A) rounded and packed once, for many products (row-major) */\n"
    "typedef struct MgcPackedA MgcPackedA;\n"
    "MgcPackedA *mgc_sbgemm_pack_a(int ta, int m, int k, const float *a, int lda);\n"
    "void mgc_sbgemm_packed(const MgcPackedA *p, int tb, int n, float alpha, const float *b, int ldb, float beta, float *c,\n"
    "                       int ldc);\n"
    "void mgc_sbgemm_free(MgcPackedA *p);\n";

static const char prelude_cuda[] =
    "/* mgc generated kernels, target CUDA (NVRTC) */\n"
    "#define DEVICE __device__\n"
    "#define DEVICE_FN __device__ inline   /* not static: NVRTC warns of an unused static function */\n"
    "#define RESTRICT __restrict__\n"
    "#define MGC_INF __int_as_float(0x7f800000)\n"
    "#define MGC_NAN __int_as_float(0x7fc00000)\n"
    "#define KERNEL(name) extern \"C\" __global__ void name\n"
    "/* GELU's derivative Phi(x) + x phi(x) (the C prelude's shares erf's exponential) */\n"
    "DEVICE_FN float mgc_gelu_grad(float x)\n"
    "{\n"
    "    return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x);\n"
    "}\n"
    "#define FOR_EACH(i, n) \\\n"
    "    for (long i##_n = (n), i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < i##_n; \\\n"
    "         i += (long)blockDim.x * gridDim.x)\n"
    "#define FOR_EACH_BLOCK(c, n) for (long c = blockIdx.x; c < (n); c += gridDim.x)\n"
    "#define BLOCK_LOOP(j, n) for (long j = threadIdx.x; j < (n); j += blockDim.x)\n"
    "#define BLOCK_LOOP2(k, nk, p, np) \\\n"
    "    for (long k##_j = threadIdx.x, k##_np = (np), k##_end = (nk) * k##_np; k##_j < k##_end; k##_j += blockDim.x) \\\n"
    "        for (long k = k##_j / k##_np, p = k##_j - k * k##_np, k##_once = 1; k##_once; k##_once = 0)\n"
    "#define BLOCK_SUM(v) mgc_block_sum(v)\n"
    "#define BLOCK_LEADER (threadIdx.x == 0)\n"
    "#define BLOCK_LAST(counter, n) mgc_block_last(counter, n)\n"
    "#define MGC_LANES 1\n"
    "#define MGC_DLANES 1\n"
    "#define PREFETCH_ROW(p, n)\n"
    "DEVICE_FN float mgc_keep(float v, int k) { return k ? v : 0.0f; }\n"
    "DEVICE_FN float mgc_bf16r(float v)   /* to bf16, to nearest, ties to even; a NaN stays one */\n"
    "{\n"
    "    unsigned u = __float_as_uint(v);\n"
    "    u = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x00400000u : u + 0x7fffu + ((u >> 16) & 1u);\n"
    "    return __uint_as_float(u & 0xffff0000u);\n"
    "}\n"
    "/* bf16, laid out as __nv_bfloat16 and cuBLAS's CUDA_R_16BF (not cuda_bf16.h's type:\n"
    "   NVRTC has no built-in copy of that header, and a machine with only the driver and\n"
    "   NVRTC's library may have no toolkit headers to point it at): a buffer stored in bf16\n"
    "   under --precision bf16 (Buf.bf16), a GEMM's packed operand or a tensor whose every\n"
    "   reader rounds it to bf16 anyway. A kernel reads an element as a float and stores a\n"
    "   float into it rounded (to nearest, ties to even: one cvt from sm_80 on), so its text\n"
    "   is the same whichever of its buffers are bf16; a copy between two bf16 buffers\n"
    "   copies the bits. No compound assignment: a sum kept in a bf16 buffer would be\n"
    "   rounded at every term, so a kernel that tried would not compile. */\n"
    "DEVICE_FN unsigned short mgc_bf16_bits(float v)\n"
    "{\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n"
    "    unsigned short r;\n"
    "    asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(r) : \"f\"(v));\n"
    "    return r;\n"
    "#else\n"
    "    return (unsigned short)(__float_as_uint(mgc_bf16r(v)) >> 16);\n"
    "#endif\n"
    "}\n"
    "struct mgc_bf16 {\n"
    "    unsigned short bits;\n"
    "    DEVICE_FN operator float() const { return __uint_as_float((unsigned)bits << 16); }\n"
    "    DEVICE_FN mgc_bf16 &operator=(float v) { bits = mgc_bf16_bits(v); return *this; }\n"
    "};\n"
    "DEVICE_FN mgc_bf16 mgc_to_bf16(float v) { mgc_bf16 r; r.bits = mgc_bf16_bits(v); return r; }\n"
    "/* Whether this block is the n-th (the last) to arrive at the counter, to every thread:\n"
    "   what the n - 1 before it wrote (before their arrival) it reads. The counter (device\n"
    "   memory) is zero before the first arrives; the last sets it back to zero. */\n"
    "DEVICE_FN bool mgc_block_last(unsigned *counter, unsigned n)\n"
    "{\n"
    "    __shared__ bool last;\n"
    "    __threadfence();   /* this block's writes before its arrival */\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x == 0) {\n"
    "        last = atomicAdd(counter, 1u) == n - 1;\n"
    "        if (last) *counter = 0;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (last) __threadfence();   /* the others' writes before what this block reads next */\n"
    "    const bool r = last;\n"
    "    __syncthreads();   /* every thread has read it before a later call rewrites it */\n"
    "    return r;\n"
    "}\n"
    "/* The block's sum, to every thread: a butterfly in each warp (every lane ends\n"
    "   with the same bits), the warps' sums through shared memory, a butterfly over\n"
    "   those. blockDim.x: a multiple of 32, at most 1024. The first barrier lets a\n"
    "   previous call's readers finish with the scratch before it is rewritten. */\n"
    "__device__ __forceinline__ float mgc_warp_sum(float v)\n"
    "{\n"
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    return v;\n"
    "}\n"
    "__device__ __forceinline__ double mgc_warp_sum(double v)\n"
    "{\n"
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    return v;\n"
    "}\n"
    "DEVICE_FN float mgc_block_sum(float v)\n"
    "{\n"
    "    __shared__ float part[32];\n"
    "    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;\n"
    "    v = mgc_warp_sum(v);\n"
    "    __syncthreads();\n"
    "    if (lane == 0) part[warp] = v;\n"
    "    __syncthreads();\n"
    "    return mgc_warp_sum(lane < (blockDim.x >> 5) ? part[lane] : 0.0f);\n"
    "}\n"
    "DEVICE_FN double mgc_block_sum(double v)\n"
    "{\n"
    "    __shared__ double part[32];\n"
    "    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;\n"
    "    v = mgc_warp_sum(v);\n"
    "    __syncthreads();\n"
    "    if (lane == 0) part[warp] = v;\n"
    "    __syncthreads();\n"
    "    return mgc_warp_sum(lane < (blockDim.x >> 5) ? part[lane] : 0.0);\n"
    "}\n";

char *cg_source(const Program *p, Target t)
{
    const char *pre = t == TARGET_C ? prelude_c : prelude_cuda;
    return arena_printf(p->arena, "%s%s%s%s", pre, kargs_text(p->arena), prelude_common, p->source);
}

char *cg_prelude(const Program *p, Target t)
{
    return arena_printf(p->arena, "%s%s%s", t == TARGET_C ? prelude_c : prelude_cuda, kargs_text(p->arena), prelude_common);
}

const char *cg_kargs_decl(const Program *p) { return kargs_text(p->arena); }

char *cg_kernel_source(const Program *p, int k, Target t)
{
    const Step *s = &p->steps[k];
    const char *pre = t == TARGET_C ? prelude_c : prelude_cuda;
    return arena_printf(p->arena, "%s%s%s%.*s", pre, kargs_text(p->arena), prelude_common,
                        (int)(s->src_end - s->src_begin), p->source + s->src_begin);
}

/* Kernel step k's text as compared for sharing: comments out, its own name
   as "@" (the name also labels its scratch memory's message). */
static char *kernel_code(const Program *p, int k)
{
    const Step *s = &p->steps[k];
    const char *t = p->source + s->src_begin, *end = p->source + s->src_end;
    size_t fl = strlen(s->fn);
    char *out = malloc((size_t)(end - t) + 1), *o = out;
    while (t < end) {
        if (t + 1 < end && t[0] == '/' && t[1] == '*') {
            const char *close = strstr(t + 2, "*/");
            t = close && close + 2 <= end ? close + 2 : end;
        } else if ((size_t)(end - t) >= fl && memcmp(t, s->fn, fl) == 0) {
            *o++ = '@';
            t += fl;
        } else {
            *o++ = *t++;
        }
    }
    *o = 0;
    return out;
}

uint64_t cg_fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t code_hash(const char *c) { return cg_fnv1a(CG_FNV1A_START, c, strlen(c)); }

void cg_share_kernels(Program *p)
{
    int n = p->nsteps;
    char **code = calloc((size_t)n + 1, sizeof *code);
    uint64_t *hash = calloc((size_t)n + 1, sizeof *hash);
    for (int k = 0; k < n; k++) {
        Step *s = &p->steps[k];
        if (s->kind != STEP_KERNEL) continue;
        s->sym = s->fn;
        code[k] = kernel_code(p, k);
        hash[k] = code_hash(code[k]);
        for (int j = 0; j < k; j++)   /* the first with the same code runs its own */
            if (code[j] && hash[j] == hash[k] && cg_own_code(&p->steps[j]) && strcmp(code[j], code[k]) == 0) {
                s->sym = p->steps[j].fn;
                break;
            }
    }
    for (int k = 0; k < n; k++) free(code[k]);
    free(code);
    free(hash);
}

int cg_share_kernels_with(Program *p, const Program *from)
{
    int nf = from->nsteps, shared = 0;
    char **code = calloc((size_t)nf + 1, sizeof *code);
    uint64_t *hash = calloc((size_t)nf + 1, sizeof *hash);
    for (int j = 0; j < nf; j++)
        if (cg_own_code(&from->steps[j])) {
            code[j] = kernel_code(from, j);
            hash[j] = code_hash(code[j]);
        }
    for (int k = 0; k < p->nsteps; k++) {
        Step *s = &p->steps[k];
        if (!cg_own_code(s)) continue;
        char *mine = kernel_code(p, k);
        uint64_t h = code_hash(mine);
        for (int j = 0; j < nf; j++)
            if (code[j] && hash[j] == h && strcmp(code[j], mine) == 0) {
                /* this kernel and its twins (which name it by its fn) run from's */
                const char *own = s->fn;
                for (int t = k; t < p->nsteps; t++) {
                    Step *u = &p->steps[t];
                    if (u->kind != STEP_KERNEL || u->shared || u->sym != own) continue;
                    u->shared = true;
                    u->shared_step = j;
                    u->sym = from->steps[j].fn;
                }
                shared++;
                break;
            }
        free(mine);
    }
    for (int j = 0; j < nf; j++) free(code[j]);
    free(code);
    free(hash);
    if (shared) p->kernels_from = from;
    return shared;
}

const char *cg_kernels_str(const Program *p, char *buf, size_t size)
{
    int steps = 0, own = 0, twins = 0, shared = 0;
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (s->kind != STEP_KERNEL) continue;
        steps++;
        own += cg_own_code(s);
        shared += s->shared;
        twins += !s->shared && s->sym != s->fn;
    }
    int n = snprintf(buf, size, "%d kernel step%s: %d kernel%s of its own", steps, steps == 1 ? "" : "s", own, own == 1 ? "" : "s");
    if (twins && n > 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, ", %d twin%s (the same code as one of them: compiled once)", twins, twins == 1 ? "" : "s");
    if (shared && n > 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, ", %d run%s the training program's (the same code, compiled with it)", shared, shared == 1 ? "s" : "");
    return buf;
}

int cg_source_parts(const Program *p, Target t, int most, char **parts)
{
    const char *pre = t == TARGET_C ? prelude_c : prelude_cuda, *kargs = kargs_text(p->arena);
    int own = 0;
    for (int k = 0; k < p->nsteps; k++) own += cg_own_code(&p->steps[k]);
    int n = most < 1 ? 1 : most;
    if (n > own) n = own > 0 ? own : 1;
    /* distinct kernel i goes to piece i mod n: the kinds of kernel (forward,
       gradients; some slower to compile than others) come in runs, and each
       piece gets its turn of every run */
    char **text = calloc((size_t)n, sizeof *text);
    size_t *len = calloc((size_t)n, sizeof *len);
    FILE **f = calloc((size_t)n, sizeof *f);
    for (int j = 0; j < n; j++) {
        f[j] = open_memstream(&text[j], &len[j]);
        fprintf(f[j], "%s%s%s", pre, kargs, prelude_common);
    }
    int i = 0;
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (!cg_own_code(s)) continue;
        fwrite(p->source + s->src_begin, 1, (size_t)(s->src_end - s->src_begin), f[i++ % n]);
    }
    for (int j = 0; j < n; j++) {
        fclose(f[j]);
        parts[j] = arena_strndup(p->arena, text[j], len[j]);
        free(text[j]);
    }
    free(text);
    free(len);
    free(f);
    return n;
}

static void print_dim(FILE *out, Dim d)
{
    if (d.batch) fprintf(out, "%ld*N", d.c);
    else fprintf(out, "%ld", d.c);
}

void cg_print_steps(const Program *p, FILE *out)
{
    const Graph *g = p->graph;
    bool head = false;
    for (int id = 0; p->decided && id < g->n; id++) {
        if (!cg_conv_why(p->decided, id)) continue;
        if (!head) fprintf(out, "  convolutions: how each runs (its gradients too) and why\n");
        head = true;
        const Node *n = &g->nodes[id];
        const Shape *ws = &g->nodes[n->in[1]].shape;
        fprintf(out, "    %%%-4d %dx%dx%d -> %d on %dx%d", id, ws->d[1], ws->d[2], ws->d[3], ws->d[0],
                g->nodes[n->in[0]].shape.d[2], g->nodes[n->in[0]].shape.d[3]);
        if (n->loc.file) fprintf(out, " (%s:%d)", n->loc.file->name, n->loc.line);
        fprintf(out, ": %s\n", cg_conv_why(p->decided, id));
    }
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        fprintf(out, "  step %-3d %%%-4d ", k, s->node);
        if (s->kind == STEP_ALLREDUCE || s->kind == STEP_WAIT) {
            const Collective *c = &p->colls[s->coll];
            const char *kind = cg_coll_name(c->kind);
            if (s->kind == STEP_WAIT) fprintf(out, "wait %s c%d", kind, s->coll);
            else if (c->src == c->dst) fprintf(out, "%s c%d b%d (%ld floats, in place; %s)", kind, s->coll, c->dst, c->floats, c->what);
            else fprintf(out, "%s c%d b%d -> b%d (%ld floats; %s)", kind, s->coll, c->src, c->dst, c->floats, c->what);
        } else if (s->kind == STEP_KERNEL) {
            fprintf(out, "kernel %s(", s->fn);
            for (int j = 0; j < s->nargs; j++) fprintf(out, "%sb%d", j ? ", " : "", s->args[j]);
            fprintf(out, ") over ");
            print_dim(out, s->work);
            if (s->blocks) fprintf(out, " (blocks)");
            if (s->shared) fprintf(out, "  = %s's code, compiled with the training program", s->sym);
            else if (s->sym && s->sym != s->fn) fprintf(out, "  = %s's code", s->sym);
        } else {
            fprintf(out, "gemm b%d[", s->c);
            print_dim(out, s->m);
            fputc(',', out);
            print_dim(out, s->n);
            fprintf(out, "] = b%d%s . b%d%s  (K = ", s->a, s->ta ? "^T" : "", s->b, s->tb ? "^T" : "");
            print_dim(out, s->k);
            fprintf(out, ")%s", s->beta != 0 ? " + C" : "");
            if (s->batch > 1) fprintf(out, ", %d of them (strided batched: one per group)", s->batch);
            if (s->ab16) fprintf(out, ", bf16 operands (stored bf16), fp32 sums");
            else if (s->bf16) fprintf(out, ", bf16 operands, fp32 sums");
        }
        fputc('\n', out);
    }
}
