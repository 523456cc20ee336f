/*
** model_cuda.h: how the exported CUDA library runs on a GPU, as mgc's CUDA
** device does (mgc's runtime/device_cuda.c): the kernels compiled ahead of
** time (nvcc, model_kernels.cu, embedded as an image) and loaded with the
** driver API; launched as blocks of MGC_CUDA_BLOCK threads (a block per
** reduction where the step is one, else a grid-stride grid of at most 32
** blocks per multiprocessor); GEMMs through cuBLAS in fp32, row-major as the
** transposed column-major product. A context has its own stream and cuBLAS
** handle on the device's primary context; the first error sticks and is
** what mgc_cuda_error says.
*/
#ifndef MODEL_CUDA_H
#define MODEL_CUDA_H
#include <stdbool.h>
#include <stddef.h>

#define MGC_CUDA_BLOCK 256

typedef struct mgc_cuda mgc_cuda;

/* GPU `device` with the kernels of image (a fatbin or cubin): NULL with err when it cannot be had. */
mgc_cuda *mgc_cuda_new(int device, const void *image, char *err, size_t err_size);
void mgc_cuda_free(mgc_cuda *g);
/* Makes g's context this thread's (every entry point calls it first). */
void mgc_cuda_enter(mgc_cuda *g);
/* The kernel called name in the image, or NULL (an error set). */
void *mgc_cuda_function(mgc_cuda *g, const char *name);
/* Device memory, zeroed; NULL (an error set) when there is none. */
float *mgc_cuda_alloc(mgc_cuda *g, size_t bytes);
void mgc_cuda_release(mgc_cuda *g, float *p);
void mgc_cuda_upload(mgc_cuda *g, float *dst, const void *src, size_t bytes);
void mgc_cuda_download(mgc_cuda *g, void *dst, const float *src, size_t bytes);
/* Kernel fn with its argument block (args_size bytes, by value) over work iterations. */
void mgc_cuda_kernel(mgc_cuda *g, void *fn, void *args, long work, bool blocks);
/* Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, batch of them at strides sa, sb, sc (batch <= 1: one) */
void mgc_cuda_gemm(mgc_cuda *g, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                   int ldb, float beta, float *c, int ldc, int batch, long sa, long sb, long sc);
/* Waits for the stream: 0, or -1 when anything failed (mgc_cuda_error says what). */
int  mgc_cuda_sync(mgc_cuda *g);
const char *mgc_cuda_error(const mgc_cuda *g);

#endif
