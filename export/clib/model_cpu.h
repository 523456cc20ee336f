/*
** model_cpu.h: how the exported library runs its kernels and GEMMs on the
** CPU, as mgc's CPU device does (mgc's runtime/pool.c, device_cpu.c): a pool
** of threads per context; a kernel called once on every thread, each with
** its own a.thread of a.nthreads (FOR_EACH gives each a contiguous share),
** or on the calling thread alone where the work is small (a serial pool:
** every share on the calling thread, as a thread that runs a piece of the
** images alone does); a GEMM through
** CBLAS (OpenBLAS, one thread: the pool splits the product by rows or
** columns of C). The same rules as mgc's give the same numbers.
*/
#ifndef MODEL_CPU_H
#define MODEL_CPU_H
#include <stdbool.h>

typedef struct mgc_pool mgc_pool;

/* threads <= 0: as many as this process may run on (its CPU affinity). NULL: out of memory or threads. */
mgc_pool *mgc_pool_new(int threads);
void mgc_pool_free(mgc_pool *p);
int  mgc_pool_threads(const mgc_pool *p);
/* A pool of no threads that runs a job's nthreads shares one after another on the calling thread: the same
   numbers as a pool of nthreads threads (each GEMM split the same way), from one thread. */
mgc_pool *mgc_pool_serial(int nthreads);
/* job(ctx, t, nthreads) for t = 0 .. nthreads-1 (t = 0 on this thread), or job(ctx, 0, 1) alone when not parallel;
   returns when all are done */
void mgc_pool_run(mgc_pool *p, void (*job)(void *ctx, int thread, int nthreads), void *ctx, bool parallel);

/* A kernel over `work` iterations: on every thread where the work is worth it (heavy: each iteration loops
   over the batch, or is a reduction; grain: the elements an iteration touches, 0 one); fn takes its KArgs
   (a.thread, a.nthreads set here) through a pointer cast by the caller's wrapper. */
void mgc_cpu_kernel(mgc_pool *p, void (*call)(void *args, int thread, int nthreads), void *args, long work, bool heavy,
                    long grain);

#if MODEL_BLAS
/* Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, batch of them at strides sa, sb, sc (batch <= 1: one) */
void mgc_cpu_gemm(mgc_pool *p, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                  int ldb, float beta, float *c, int ldc, int batch, long sa, long sb, long sc);
#endif
/* OpenBLAS to one thread where it is linked (its own threads would fight the pool's for the cores). */
void mgc_cpu_blas_one_thread(void);

#endif
