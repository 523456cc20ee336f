/*
** The runtime: compiled programs bound to a device's memory, run step by step.
**
**   Device   (device.h) what a backend provides: memory, copies, loading a
**            Program's kernels, launching them, GEMMs, synchronisation and
**            collectives. The CPU device is runtime/device_cpu.c.
**   Pool     (pool.c) the CPU device's threads: one job at a time on all of them.
**   Store    (store.c) persistent tensors by name (parameters, running
**            statistics, momentum), shared by a replica's training and
**            evaluation programs, initialised as PyTorch initialises them.
**   Exec     (exec.c) one Program bound to one device's buffers: runs its
**            steps for a batch, starting and waiting for its collectives.
**   Comm     (comm.h) the collectives of a data-parallel group.
**
** The runtime knows Programs, never the IR or the front end.
*/
#ifndef MGC_RUNTIME_H
#define MGC_RUNTIME_H
#include "codegen.h"
#include "device.h"

/* ---- persistent tensors ---- */
typedef struct StoreEntry {
    const char *name;
    Shape shape;
    long numel;
    float *data;             /* host memory (the CPU device computes in it directly) */
    InitKind init;
    int fan_in;
    bool trainable;
} StoreEntry;

typedef struct Store {
    StoreEntry *e;
    int n, cap;
} Store;

/* Finds or creates the entry of a persistent buffer; its index, or -1 when
   the name exists with another shape. */
int   rt_store_add(Store *s, const Buf *b);
StoreEntry *rt_store_find(Store *s, const char *name);
void  rt_store_free(Store *s);
/* Initialises every entry as PyTorch does (uniform fan-in bounds, ones, zeros) from the seed. */
void  rt_store_init(Store *s, unsigned long long seed);

/* ---- executing a program ---- */
typedef struct Comm Comm;

typedef struct Exec {
    const Program *prog;
    Device *dev;
    long max_batch;
    float **ptr;             /* per buffer: its memory (views resolved) */
    void **owned;            /* allocations to release */
    int nowned;
    KernelFn *fn;            /* per step: the kernel, or NULL */
    void *module;            /* the device's loaded kernels */
    Comm *comm;              /* the data-parallel group, or NULL when alone */
    int replica;             /* this replica's index in comm */
    float sgd[3];            /* learning rate, momentum, weight decay of every SGD step */
    unsigned long long seed, runs;
    double *step_seconds;    /* per step, accumulated when profiling (else NULL) */
    double wait_seconds;     /* time spent waiting for collectives */
    size_t activation_bytes; /* memory of activations and scratch, after reuse */
} Exec;

typedef struct RtOptions {
    bool verbose;            /* say when kernels are compiled or found in the cache, print the memory plan */
} RtOptions;

/* Loads the program's kernels on dev and binds buffers for up to max_batch
   examples (persistent ones from store; the others in the slots of the
   program's memory plan, which must hold max_batch). Returns 0, or -1 with a
   message in err. */
int  rt_exec_init(Exec *x, const Program *p, Device *dev, Store *store, long max_batch,
                  const RtOptions *opt, char *err, size_t err_size);
void rt_exec_free(Exec *x);
/* Runs every step for this replica's n examples, the first-th of the
   global_n examples of the step on every replica together (n <= max_batch). */
void rt_exec_run(Exec *x, long n, long global_n, long first);
/* Sets the learning rate, momentum and weight decay of every SGD step. */
void rt_exec_set_sgd(Exec *x, float lr, float momentum, float weight_decay);
/* Times every step from now on; rt_exec_profile_report prints the table. */
void rt_exec_profile(Exec *x);
void rt_exec_profile_report(const Exec *x, FILE *out);

/* Cache directory for compiled kernels: $XDG_CACHE_HOME/mgc, else ~/.cache/mgc. */
const char *rt_cache_dir(char *buf, size_t size);
/* Compiles C kernel source with the system compiler (or finds it in the
   cache) and loads it; *so is the dlopen handle. Returns 0 or -1 with err. */
int  rt_cc_load(const char *source, bool verbose, void **so, char *err, size_t err_size);

/* v with thousands separators ("44,426"), in buf; printf's ' flag needs a locale. */
const char *rt_commas(long v, char buf[32]);

#endif
