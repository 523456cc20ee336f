/*
** The runtime: compiled programs bound to memory, run step by step.
**
** An Exec is one Program made runnable on the CPU (runtime/exec_cpu.c): its
** kernel source compiled by the system C compiler (cached on disk) and loaded
** with dlopen, its buffers bound to memory, its steps run in order, kernels on
** a Pool and GEMMs through CBLAS. A Store holds the persistent buffers
** (parameters, running statistics, momentum) by name, shared by the training
** and evaluation programs. A Pool is a set of worker threads that runs one
** job at a time on all of them; the Execs of one process share it.
*/
#ifndef MGC_RUNTIME_H
#define MGC_RUNTIME_H
#include "codegen.h"

typedef struct Pool Pool;

/* Persistent tensors by name, shared between programs. */
typedef struct StoreEntry {
    const char *name;
    Shape shape;
    long numel;
    float *data;
    const Node *node;        /* the PARAM/STATE node that first declared it (init, fan_in) */
    bool trainable;
} StoreEntry;

typedef struct Store {
    StoreEntry *e;
    int n, cap;
} Store;

typedef void (*KernelFn)(void);   /* stored type; called as void fn(KArgs) */

typedef struct Exec {
    const Program *prog;
    long max_batch;
    float **ptr;             /* per buffer: its memory (views resolved) */
    void **owned;            /* allocations to free */
    int nowned;
    KernelFn *fn;            /* per step: the kernel, or NULL for GEMMs */
    void *so;                /* dlopen handle */
    Pool *pool;
    unsigned long long seed, runs;
    double *step_seconds;    /* per step, accumulated when profiling (else NULL) */
    size_t activation_bytes; /* memory of activations and scratch, after reuse */
} Exec;

typedef struct RtOptions {
    bool verbose;            /* say when kernels are compiled or found in the cache */
} RtOptions;

Pool *rt_pool_new(int threads);
void  rt_pool_free(Pool *p);
int   rt_pool_threads(const Pool *p);

/* Compiles (or finds in the cache) the program's kernels and binds buffers
   for up to max_batch examples. Returns 0, or -1 with a message in err. */
int  rt_exec_init(Exec *x, const Program *p, Store *store, long max_batch, Pool *pool,
                  const RtOptions *opt, char *err, size_t err_size);
void rt_exec_free(Exec *x);
/* Runs every step for a batch of n examples (n <= max_batch). */
void rt_exec_run(Exec *x, long n);
/* Sets the run-time scalars of every SGD step (learning rate schedules, ...). */
void rt_exec_set_sgd(Exec *x, float lr, float momentum, float weight_decay);
/* Times every step from now on; rt_exec_profile_report prints the table. */
void rt_exec_profile(Exec *x);
void rt_exec_profile_report(const Exec *x, FILE *out);

int   rt_store_add(Store *s, const Node *n);      /* finds or creates; returns index or -1 on shape clash */
StoreEntry *rt_store_find(Store *s, const char *name);
void  rt_store_free(Store *s);
/* Initialises every entry as PyTorch does (uniform fan-in bounds, ones, zeros) from the seed. */
void  rt_store_init(Store *s, unsigned long long seed);

/* Cache directory for compiled kernels: $XDG_CACHE_HOME/mgc, else ~/.cache/mgc. */
const char *rt_cache_dir(char *buf, size_t size);

#endif
