/*
** The bf16 GEMM of the CPU device (--precision bf16): cblas_sgemm's
** arguments and meaning, with op(A) and op(B) rounded to bfloat16 (round to
** nearest, ties to even) and the products summed in fp32, as PyTorch's
** autocast does. Generated kernels call mgc_sbgemm where they would call
** cblas_sgemm; see bgemm.c for the two paths (AVX512_BF16, emulated).
*/
#ifndef MGC_BGEMM_H
#define MGC_BGEMM_H
#include <stdint.h>
#include <string.h>

/* C = alpha * bf16(op(A)) . bf16(op(B)) + beta * C, CBLAS conventions: order 101
   row-major or 102 column-major, ta and tb 111 no transpose or 112 transpose.
   With beta == 0, C is only written (a NaN there does not leak). Runs on the
   calling thread only; any number of threads may call it at once. */
void mgc_sbgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                const float *b, int ldb, float beta, float *c, int ldc);

/* op(A) (row-major, m x k, lda apart; ta 112 transposed) rounded to bf16 and
   packed once, for many products with it: the Winograd form's transformed
   filters, the same for every chunk of examples a thread takes. Then
   mgc_sbgemm_packed(p, tb, n, ...) is mgc_sbgemm(101, ta, tb, m, n, k, ...)
   with that A, bit for bit; mgc_sbgemm_free releases it. Scratch as for
   mgc_sbgemm: without memory, a message and abort. */
typedef struct MgcPackedA MgcPackedA;
MgcPackedA *mgc_sbgemm_pack_a(int ta, int m, int k, const float *a, int lda);
void mgc_sbgemm_packed(const MgcPackedA *p, int tb, int n, float alpha, const float *b, int ldb, float beta, float *c,
                       int ldc);
void mgc_sbgemm_free(MgcPackedA *p);

/* 1 when mgc_sbgemm runs on AVX512_BF16 instructions, 0 when it emulates them
   (the CPU or the OS lacks them, MGC_BF16=emulate, or the test hook below). */
int mgc_bf16_native(void);
/* The path in words: "avx512_bf16" or "emulated (bf16 rounding, fp32 arithmetic)". */
const char *mgc_bf16_path(void);
/* Test hook: on != 0 makes later calls take the emulated path even where the
   native one is available; 0 goes back to what the CPU detection chose. */
void mgc_bf16_force_emulation(int on);

/* x rounded to the nearest bfloat16 (ties to even), as a float: the low 16 bits
   of its encoding are zero. A NaN stays a NaN (made quiet), infinities stay,
   a finite value beyond the largest bfloat16 becomes an infinity, denormals
   are rounded like any other value (not flushed). */
static inline float mgc_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x00400000u;                    /* NaN: set the quiet bit, which survives the cut */
    else
        u += 0x7fffu + ((u >> 16) & 1u);     /* half an ulp, less one when the kept part is even */
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
