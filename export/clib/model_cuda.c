/*
** model_cuda.c: the exported CUDA library's calls of the CUDA driver and
** cuBLAS (see model_cuda.h). Linked with -lcuda -lcublas; no NVRTC and no
** CUDA runtime.
*/
#include "model_cuda.h"
#include <cublas_v2.h>
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mgc_cuda {
    CUdevice dev;
    CUcontext ctx;                    /* the device's primary context (retained) */
    CUstream s;
    CUmodule mod;
    cublasHandle_t blas;
    int sms;                          /* multiprocessors: the grid-stride grids' bound */
    char error[256];                  /* the first failure, "" none */
};

static void failed(mgc_cuda *g, const char *call, CUresult r)
{
    if (g->error[0]) return;
    const char *why = NULL;
    cuGetErrorString(r, &why);
    snprintf(g->error, sizeof g->error, "%s: %s", call, why ? why : "CUDA error");
}

#define CU(g, call)                          \
    do {                                     \
        CUresult r_ = (call);                \
        if (r_ != CUDA_SUCCESS) failed(g, #call, r_); \
    } while (0)

mgc_cuda *mgc_cuda_new(int device, const void *image, char *err, size_t err_size)
{
    mgc_cuda *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    int count = 0;
    CU(g, cuInit(0));
    if (!g->error[0]) CU(g, cuDeviceGetCount(&count));
    if (!g->error[0] && (device < 0 || device >= count))
        snprintf(g->error, sizeof g->error, "there is no GPU %d: the CUDA driver sees %d", device, count);
    if (!g->error[0]) CU(g, cuDeviceGet(&g->dev, device));
    if (!g->error[0]) CU(g, cuDevicePrimaryCtxRetain(&g->ctx, g->dev));
    if (!g->error[0]) CU(g, cuCtxSetCurrent(g->ctx));
    if (!g->error[0]) CU(g, cuDeviceGetAttribute(&g->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g->dev));
    if (!g->error[0]) CU(g, cuStreamCreate(&g->s, CU_STREAM_NON_BLOCKING));
    if (!g->error[0]) CU(g, cuModuleLoadData(&g->mod, image));
    if (!g->error[0]) {
        cublasStatus_t st = cublasCreate(&g->blas);
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(g->blas, (cudaStream_t)g->s);
        if (st != CUBLAS_STATUS_SUCCESS) snprintf(g->error, sizeof g->error, "cuBLAS: status %d", (int)st);
    }
    if (g->error[0]) {
        snprintf(err, err_size, "%s", g->error);
        mgc_cuda_free(g);
        return NULL;
    }
    return g;
}

void mgc_cuda_free(mgc_cuda *g)
{
    if (!g) return;
    if (g->ctx) cuCtxSetCurrent(g->ctx);
    if (g->blas) cublasDestroy(g->blas);
    if (g->mod) cuModuleUnload(g->mod);
    if (g->s) cuStreamDestroy(g->s);
    if (g->ctx) cuDevicePrimaryCtxRelease(g->dev);
    free(g);
}

void mgc_cuda_enter(mgc_cuda *g) { CU(g, cuCtxSetCurrent(g->ctx)); }

void *mgc_cuda_function(mgc_cuda *g, const char *name)
{
    CUfunction f = NULL;
    CU(g, cuModuleGetFunction(&f, g->mod, name));
    return f;
}

float *mgc_cuda_alloc(mgc_cuda *g, size_t bytes)
{
    CUdeviceptr p = 0;
    CU(g, cuMemAlloc(&p, bytes ? bytes : 1));
    if (!g->error[0]) CU(g, cuMemsetD8Async(p, 0, bytes, g->s));
    return g->error[0] ? NULL : (float *)(uintptr_t)p;
}

void mgc_cuda_release(mgc_cuda *g, float *p)
{
    if (p) cuMemFree((CUdeviceptr)(uintptr_t)p);
    (void)g;
}

void mgc_cuda_upload(mgc_cuda *g, float *dst, const void *src, size_t bytes)
{
    CU(g, cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, bytes, g->s));
}

void mgc_cuda_download(mgc_cuda *g, void *dst, const float *src, size_t bytes)
{
    CU(g, cuMemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, bytes, g->s));
}

void mgc_cuda_kernel(mgc_cuda *g, void *fn, void *args, long work, bool blocks)
{
    long grid;
    if (work <= 0) return;
    if (blocks) grid = work < (1L << 20) ? work : (1L << 20);   /* a block per reduction, looping past 2^20 */
    else {
        grid = (work + MGC_CUDA_BLOCK - 1) / MGC_CUDA_BLOCK;
        if (grid > (long)g->sms * 32) grid = (long)g->sms * 32;   /* the grid-stride loop does the rest */
    }
    void *params[] = { args };
    CU(g, cuLaunchKernel((CUfunction)fn, (unsigned)grid, 1, 1, MGC_CUDA_BLOCK, 1, 1, 0, g->s, params, NULL));
}

void mgc_cuda_gemm(mgc_cuda *g, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                   int ldb, float beta, float *c, int ldc, int batch, long sa, long sb, long sc)
{
    if (m <= 0 || n <= 0) return;
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st = batch > 1 ? cublasSgemmStridedBatched(g->blas, opb, opa, n, m, k, &alpha, b, ldb, sb, a, lda, sa, &beta, c,
                                                               ldc, sc, batch)
                                  : cublasSgemm(g->blas, opb, opa, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc);
    if (st != CUBLAS_STATUS_SUCCESS && !g->error[0])
        snprintf(g->error, sizeof g->error, "%s: cuBLAS status %d", batch > 1 ? "cublasSgemmStridedBatched" : "cublasSgemm", (int)st);
}

int mgc_cuda_sync(mgc_cuda *g)
{
    CU(g, cuStreamSynchronize(g->s));
    return g->error[0] ? -1 : 0;
}

const char *mgc_cuda_error(const mgc_cuda *g) { return g->error; }
