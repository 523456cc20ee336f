/*
** The device interface: what the executor asks of a backend. A device owns
** memory, loads a Program's kernels, launches them, runs GEMMs, and joins
** the collectives of a data-parallel group. Handles are opaque; the CPU
** device (runtime/device_cpu.c) is one implementation, and a CUDA device
** plugs in behind the same table without touching the passes or the executor.
*/
#ifndef MGC_DEVICE_H
#define MGC_DEVICE_H
#include "codegen.h"
#include "kargs.h"
#include <stddef.h>

typedef void (*KernelFn)(void);   /* stored type; the device knows how to call it */
typedef struct Device Device;
typedef struct Comm Comm;

/* Row-major C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C. */
typedef struct GemmArgs {
    bool ta, tb;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
} GemmArgs;

typedef struct DeviceOps {
    /* memory: zeroed, 64-byte aligned; NULL when out of memory */
    void *(*alloc)(Device *d, size_t bytes);
    void  (*release)(Device *d, void *mem);
    void  (*upload)(Device *d, void *dst, const void *src, size_t bytes);
    void  (*download)(Device *d, void *dst, const void *src, size_t bytes);
    void  (*copy)(Device *d, void *dst, const void *src, size_t bytes);   /* within the device */
    /* kernels: compiles (or finds in a cache) the program's kernel source and
       fills fns[step] for its kernel steps; 0, or -1 with a message */
    int   (*load)(Device *d, const Program *p, bool verbose, void **module, KernelFn *fns, char *err, size_t err_size);
    void  (*unload)(Device *d, void *module);
    /* runs a kernel over `work` iterations of its FOR_EACH (each touching `grain` elements; heavy: each is a loop over the batch) */
    void  (*launch)(Device *d, KernelFn fn, const KArgs *a, long work, long grain, bool heavy);
    void  (*gemm)(Device *d, const GemmArgs *g);
    void  (*synchronize)(Device *d);
    /* collectives: starts summing data[0, n) over every replica of comm (in
       place), and waits for that sum; returns the seconds spent waiting */
    void   (*allreduce_start)(Device *d, Comm *c, int replica, int coll, float *data, long n);
    double (*allreduce_wait)(Device *d, Comm *c, int replica, int coll);
} DeviceOps;

struct Device {
    const DeviceOps *ops;
    char name[24];            /* "cpu:0" */
    int threads;              /* CPU: the threads it computes with */
    bool host_memory;         /* its memory is the host's: the Store's tensors are used in place */
    void *impl;
};

/* A CPU device computing with `threads` threads (the calling thread is one of them). */
Device *rt_device_cpu_new(int index, int threads);
void    rt_device_free(Device *d);

#endif
