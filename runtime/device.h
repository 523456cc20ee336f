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
    int batch;                /* > 1: that many GEMMs, the i-th on a + i * sa, b + i * sb, c + i * sc */
    long sa, sb, sc;
    bool bf16;                /* op(A) and op(B) rounded to bf16 as they are read, the products summed in fp32 (Step.bf16) */
    bool ab16;                /* a and b hold bf16 bits (Step.ab16: GPUs only), the products summed in fp32 */
} GemmArgs;

typedef struct DeviceOps {
    /* memory: zeroed, 64-byte aligned; NULL when out of memory */
    void *(*alloc)(Device *d, size_t bytes);
    void  (*release)(Device *d, void *mem);
    /* host memory the device copies from and to fastest (CUDA: pinned); NULL when out of memory */
    void *(*alloc_host)(Device *d, size_t bytes);
    void  (*release_host)(Device *d, void *mem);
    /* bytes the device can still allocate (the host's available memory for a
       CPU device); 0 when it cannot tell */
    size_t (*memory_free)(Device *d);
    /* copies, ordered with the device's work: upload returns at once (src must
       stay unchanged until the next synchronize), download when the bytes are there */
    void  (*upload)(Device *d, void *dst, const void *src, size_t bytes);
    void  (*download)(Device *d, void *dst, const void *src, size_t bytes);
    void  (*copy)(Device *d, void *dst, const void *src, size_t bytes);   /* within the device */
    /* kernels: compiles (or finds in a cache) the program's kernel source and
       fills fns[step] for its kernel steps; 0, or -1 with a message */
    int   (*load)(Device *d, const Program *p, bool verbose, void **module, KernelFn *fns, char *err, size_t err_size);
    void  (*unload)(Device *d, void *module);
    /* runs kernel step s over `work` iterations of its FOR_EACH (s->grain,
       s->heavy and s->blocks say how to split them) */
    void  (*launch)(Device *d, KernelFn fn, const KArgs *a, const Step *s, long work);
    void  (*gemm)(Device *d, const GemmArgs *g);
    void  (*synchronize)(Device *d);
    /* collectives: starts summing data[0, n) over every replica of the group
       (in place), and waits for that sum; wait returns the seconds the host
       spent waiting. The CPU device's group is comm; a CUDA device has its own. */
    /* starts collective coll of `kind` (CollKind: a sum, or --shard-update's reduce-scatter or all-gather) */
    void   (*allreduce_start)(Device *d, Comm *c, int replica, int coll, int kind, float *data, long n);
    double (*allreduce_wait)(Device *d, Comm *c, int replica, int coll);
    /* optional (NULL: none), used where the device's can_record is set: a
       run's steps recorded once and replayed (CUDA graphs). A run is named by
       its shape (the program and the batch: what decides which steps
       run; the kernels' arguments follow from it). replay runs what was
       recorded under that key and returns true, or returns false having
       nothing for it; between record_begin and record_end the device
       records instead of running, and record_end runs the recording once and
       keeps it. record_end returns 0 then; -1 when recording failed and
       nothing ran; 1 when recording never began and the steps ran as they
       were issued. */
    bool  (*replay)(Device *d, unsigned long long shape);
    void  (*record_begin)(Device *d);
    int   (*record_end)(Device *d, unsigned long long shape);
    /* optional (NULL: the host looks at a downloaded copy): for each of the n
       tensors mem[k] of numel[k] floats in the device's memory, the elements
       that are not finite, or that are below 0 where variance[k], counted
       into bad[k], on the device (only the counts come back). 0, or -1 when
       the device could not. */
    int   (*count_bad)(Device *d, float *const *mem, const long *numel, const bool *variance, int n, long *bad);
    void  (*destroy)(Device *d);
} DeviceOps;

typedef enum DeviceKind { DEV_CPU, DEV_CUDA } DeviceKind;

struct Device {
    const DeviceOps *ops;
    DeviceKind kind;
    char name[24];            /* "cpu:0", "cuda:1" */
    char model[64];           /* "NVIDIA H200, sm_90"; empty on CPU devices */
    int threads;              /* CPU: the threads it computes with */
    bool host_memory;         /* its memory is the host's: the Store's tensors are used in place */
    bool can_record;          /* replay/record_* may be used (see DeviceOps) */
    void *impl;
};

/* A CPU device computing with `threads` threads (the calling thread is one
   of them). own_memory: it keeps its buffers apart from the host's and
   copies through upload and download, as a GPU does (tests use it to run the
   executor's device-memory paths without a GPU). */
Device *rt_device_cpu_new(int index, int threads, bool own_memory);
void    rt_device_free(Device *d);

/* ---- the registry (runtime/devices.c): devices by kind, for the trainer ---- */

/* One device of this process: cpu:index (index numbers the replica) or
   cuda:index (a GPU). */
typedef struct DeviceSpec { DeviceKind kind; int index; } DeviceSpec;

/* How a device is made, whatever its kind (each kind takes what applies). */
typedef struct DeviceOptions {
    int threads;              /* CPU: the threads it computes with */
    bool own_memory;          /* CPU: memory apart from the host's (testing) */
    bool tf32;                /* CUDA: GEMMs may round to TF32 */
    bool verbose;             /* say what is found and compiled */
} DeviceOptions;

struct World;
/* The device spec asks for: NULL with the reason in err. */
Device *rt_device_new(DeviceSpec spec, const DeviceOptions *o, char *err, size_t err_size);
/* Joins this process's n devices, all of one kind (and the same of every
   rank of world), into one data-parallel group for ncolls collectives. The
   CPU kind's group is *comm (the executor's Comm); other kinds keep theirs
   and leave *comm NULL. 0, or -1 with err. */
int     rt_device_group(Device **devs, int n, struct World *world, int ncolls, Comm **comm, char *err, size_t err_size);
/* The kind's name ("cpu", "cuda"). */
const char *rt_device_kind_name(DeviceKind kind);

#endif
