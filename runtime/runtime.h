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
#include <stdint.h>

#define RT_SEEN_SHAPES 4  /* Exec.seen */

/* ---- persistent tensors ---- */
typedef struct StoreEntry {
    const char *name;
    Shape shape;
    long numel;
    float *data;             /* host memory (the CPU device computes in it directly) */
    float *mem;              /* the device's copy, on a device with memory of its own (else NULL) */
    InitKind init;
    int fan_in;
    float init_arg;          /* INIT_CONSTANT's value, INIT_NORMAL's standard deviation */
    bool trainable;
    int pack;                /* --shard-update: data lies in the store's block of that bucket (Buf.pack), or -1 */
    int shard_of;            /* --shard-update: this replica's slice of that bucket's optimizer state, or -1 */
} StoreEntry;

typedef struct Store {
    StoreEntry *e;
    int n, cap;
    Device *dev;             /* the device holding the entries' mem, or NULL */
    float **packs;           /* --shard-update: per bucket, its parameters' block (host memory), or NULL */
    float **pack_mem;        /* and its device copy (a device with memory of its own), or NULL */
    long *pack_floats;
    bool *pack_shared;       /* per bucket: its block is share's (not this store's to free) */
    int npacks;
    const struct Store *share;   /* --shard-update, replicas with one memory: each bucket's block is this
                                    store's, if it has one (set before the first rt_store_add), or NULL */
} Store;

typedef enum StoreWhich { STORE_ALL, STORE_RUNNING, STORE_NOT_RUNNING, STORE_SHARDS /* --shard-update's state slices */ } StoreWhich;

/* Finds or creates the entry of a persistent buffer; its index, or -1 when
   the name exists with another shape. */
int   rt_store_add(Store *s, const Buf *b);
StoreEntry *rt_store_find(Store *s, const char *name);
/* The memory entry k is computed in on device d: its host data when d
   computes in host memory, else its device copy (allocated here; NULL when
   the device is out of memory). */
float *rt_store_bind(Store *s, int k, Device *d);
/* Host to device and back, for the entries that have a device copy: every
   one, the BatchNorm running statistics, or all but those. No-ops on a device
   that computes in host memory. Both return when the copy is done. */
void  rt_store_upload(Store *s, StoreWhich which);
/* A BatchNorm running statistic (state that evaluation reads, not a parameter). */
bool  rt_store_is_running(const StoreEntry *e);
/* A variance, which cannot be below 0: BatchNorm's running_var, AdamW's exp_avg_sq. */
bool  rt_store_is_variance(const StoreEntry *e);
/* "parameter", "running statistic" or "optimizer state" (momentum, AdamW's moments). */
const char *rt_store_kind(const StoreEntry *e);
/* An entry's host values against what they must be: finite, and not below 0
   in a variance. How many are not (nonfinite, negative: 0 and 0, first -1
   where all are fine), the first one's index and value. One pass that the
   compiler vectorises, a second to count only where the first found one. */
typedef struct StoreCheck {
    long nonfinite, negative;
    long first;
    float value;
} StoreCheck;
StoreCheck rt_store_check(const StoreEntry *e);
/* A failed check in words, into buf: "parameter 'fc1.weight' holds 3 values
   that are not finite, of 30720 (the first, element 17, is nan)". */
const char *rt_store_check_str(const StoreEntry *e, const StoreCheck *c, char *buf, size_t size);
void  rt_store_download(Store *s, StoreWhich which);
void  rt_store_free(Store *s);
/* Initialises every entry as PyTorch does (uniform fan-in bounds, ones, zeros) from the seed. */
void  rt_store_init(Store *s, unsigned long long seed);

/* ---- executing a program ---- */
typedef struct Comm Comm;

typedef struct Exec {
    const Program *prog;
    Device *dev;
    long max_batch;
    float **ptr;             /* per buffer: its memory on the device (views resolved) */
    float **host;            /* per buffer the host reads or writes (input, labels, loss, logits,
                                gradients, ...): where the host sees it; the same as ptr on a device
                                that computes in host memory, else a staging copy */
    void *region;            /* the memory plan's slots, one allocation (perhaps another Exec's) */
    size_t region_bytes;
    void **owned;            /* allocations to release */
    int nowned;
    float **host_alt;        /* input and labels: the second staging copy (the next batch's) */
    void **host_owned;       /* staging allocations to release */
    int nhost_owned;
    bool seeded;             /* some step takes a fresh seed each run (dropout) */
    bool record;             /* record runs and replay them, where the device can (CUDA graphs) */
    KernelFn *fn;            /* per step: the kernel, or NULL */
    void *module;            /* the device's loaded kernels */
    Comm *comm;              /* the CPU devices' data-parallel group, or NULL */
    bool grouped;            /* in a data-parallel group (comm, or the device's own): collectives sum */
    int replica;             /* this replica's index in comm */
    int shard;               /* --shard-update: the chunk of each bucket this replica owns (KArgs.replica) */
    double lr;               /* the optimizer's learning rate for the next run (the rest is the program's) */
    float opt[8];            /* the optimizer's scalars of the next run (Program.opt_scalars) */
    unsigned long long seed, runs;
    unsigned long long updates;   /* runs that updated the parameters (all but --accumulate's first K-1 of a step) */
    int accumulate;          /* the next run's Program.accumulate mode (rt_exec_set_accumulate) */
    unsigned long long seen[RT_SEEN_SHAPES];   /* shapes run once already (recorded from their second run) */
    int nseen;
    unsigned long long runs_before; /* training steps before this process (--resume): dropout's seeds go on from there */
    unsigned long long opt_steps_before; /* the optimizer's steps before this process (--resume with the same
                                            optimizer; else 0): AdamW's bias corrections count on from there */
    double *step_seconds;    /* per step, accumulated when profiling (else NULL) */
    double wait_seconds;     /* time spent waiting for collectives */
    size_t activation_bytes; /* memory of activations and scratch, after reuse */
    /* --check-nan: every step's output is checked; the first not finite, or nan_step -1 */
    bool check_nan;
    int nan_step, nan_buf;
    long nan_at;
    float nan_value;
} Exec;

typedef struct RtOptions {
    bool verbose;            /* say when kernels are compiled or found in the cache, print the memory plan */
    bool no_record;          /* never record and replay runs (CUDA graphs off) */
} RtOptions;

/* Loads the program's kernels on dev and binds buffers for up to max_batch
   examples (persistent ones from store; the others in the slots of the
   program's memory plan, which must hold max_batch). With share (an Exec on
   the same device whose runs never overlap this one's, as evaluation and
   training), the slots go in share's memory when it is large enough: nothing
   in them outlives a run but what the host reads right after it. Returns 0,
   or -1 with a message in err. */
int  rt_exec_init(Exec *x, const Program *p, Device *dev, Store *store, long max_batch, const Exec *share,
                  const RtOptions *opt, char *err, size_t err_size);
void rt_exec_free(Exec *x);
/* Anomaly mode: after every step, its outputs are read back and checked; the
   first step that writes a value that is not finite is kept in nan_step,
   nan_buf, nan_at (the element) and nan_value, and nothing more is checked.
   Steps are not recorded (CUDA graphs) meanwhile. Slow: for finding a bug. */
void rt_exec_check_nan(Exec *x);
/* Runs every step for this replica's n examples, the first-th of the
   global_n examples of the step on every replica together (n <= max_batch). */
void rt_exec_run(Exec *x, long n, long global_n, long first);
/* rt_exec_run in two halves: start queues the run on the device (and
   returns at once on a device that queues work); finish waits for it and
   brings back the loss, the correct count and the votes. Between them the
   host may fill the next batch: rt_exec_host(input or labels) then gives the
   other staging copy. */
void rt_exec_start(Exec *x, long n, long global_n, long first);
/* --accumulate: the next runs' place in a step of several micro-batches (Program.accumulate's
   modes: 0 a whole step, 1 its first micro-batch, 2 a middle one, 3 its last). A first or middle
   run starts no collective and updates nothing; global_n is then the whole step's examples. */
void rt_exec_set_accumulate(Exec *x, int mode);
void rt_exec_finish(Exec *x);
/* Where the host writes a buffer it fills before a run (input, labels,
   control): uploaded by the next rt_exec_run. After a run, loss, correct and
   control are there too. NULL for a buffer the host never sees. */
float *rt_exec_host(Exec *x, int buf);
/* After a run of n examples: buffer buf (logits, a gradient, ...) brought to
   the host, and where it is there. */
float *rt_exec_fetch(Exec *x, int buf, long n);
/* Sets the learning rate of the next runs' updates (a schedule's; the other
   hyper-parameters are the program's). */
void rt_exec_set_lr(Exec *x, double lr);
/* Times every step from now on; rt_exec_profile_report prints the table. */
void rt_exec_profile(Exec *x);
void rt_exec_profile_report(const Exec *x, FILE *out);

/* The kernel cache's directory, open: everything in it is reached through fd
   (openat, renameat, unlinkat), never by a path that could move. */
typedef struct CacheDir {
    int fd;                  /* the kernels directory (O_RDONLY | O_DIRECTORY), or -1 */
    char path[4200];         /* its path, for messages only */
} CacheDir;
/* Opens the kernel cache's directory, $XDG_CACHE_HOME/mgc/kernels, else
   ~/.cache/mgc/kernels (HOME, or the passwd entry's home), else one in a
   private directory made for this run and removed at its end; made if
   missing. It is reached from "/" one component at a time, each directory
   checked as it is opened, a symbolic link followed only when it is the
   user's or root's (cache.c says the rule). 0, or -1 with err saying what
   was found and the fix. */
int  rt_cache_open(CacheDir *c, char *err, size_t err_size);
void rt_cache_close(CacheDir *c);
/* The entry name opened for reading when it is one to load: a regular file
   of the user's that nobody else can write, not a link. Its descriptor, or
   -1: missing (said nowhere), or not to be trusted (said on stderr unless
   quiet). */
int  rt_cache_open_entry(const CacheDir *c, const char *name, bool quiet);
/* A private work directory for one compile of the entry hash, made 0700 in
   the cache as HASH.build.<12 random hex digits>: its descriptor (its name
   in name), or -1 with errno. */
int  rt_cache_workdir(const CacheDir *c, uint64_t hash, char *name, size_t size);
/* A new file name in the directory dir (O_EXCL, O_NOFOLLOW, mode 0644
   whatever the umask): its descriptor, or -1 with errno. */
int  rt_cache_create(int dir, const char *name);
/* The entry name, written whole to a temporary file beside it and renamed
   into place (no reader sees half of it). 0, or -1 with errno. */
int  rt_cache_put(const CacheDir *c, const char *name, const void *data, size_t size);
/* Removes the directory name in dir and the files in it, following no link:
   the bytes freed. */
long long rt_cache_remove_dir(int dir, const char *name);
/* The kernel cache's limit in bytes: $MGC_CACHE_MB (10^6 bytes), else 1000 MB;
   -1 when MGC_CACHE_MB is not a number above 0 (the driver stops on it). */
long long rt_cache_limit(void);
/* Marks a cache entry (its .so or .cubin, open as fd) used now. */
void rt_cache_touch(int fd);
/* After an entry is added (keep: its hash, never removed): while the cache
   holds more than its limit, removes the entries used least recently, down
   to 80% of the limit; and what unfinished compiles left over a day ago. */
void rt_cache_prune(uint64_t keep, bool verbose);
/* mgc --cache-info (clear false) and --cache-clear: prints the cache's
   entries and size to out, or removes them all; 0, or 1 with a message. */
int  rt_cache_report(bool clear, FILE *out);
/* OpenBLAS reads OPENBLAS_CORETYPE only as it loads, and 0.3.21 takes some
   CPUs with AVX-512 for a Prescott (kernels of a quarter of the speed): where
   it chose kernels older than this CPU runs and OPENBLAS_CORETYPE is not set,
   sets it and starts mgc again (execv of /proc/self/exe with argv). Call first
   thing, before any thread or MPI. With verbose, says which kernels run.
   -1, said, when OPENBLAS_CORETYPE names kernels OpenBLAS does not run (a
   name it does not know: it says "Core not found" and chooses itself). */
int  rt_cpu_blas_core(char **argv, bool verbose);
/* OpenBLAS's version and the kernels it runs on this CPU, and what mgc does
   about it ("0.3.21, Prescott kernels; mgc trains with OPENBLAS_CORETYPE=SkylakeX"). */
void rt_cpu_blas_describe(char *buf, size_t size);
/* cg_fnv1a over a string, from h (CG_FNV1A_START to start): the caches' keys. */
uint64_t rt_fnv1a(uint64_t h, const char *s);
/* Compiled C kernels, loaded (cc.c). */
typedef struct CcModule CcModule;
/* Compiles C kernel source, given as pieces that each compile alone, with
   the system compiler (the pieces side by side, one per core, then linked
   into one shared object), or finds it in the cache, and loads it through
   the descriptor of the file checked (never by a path). Returns 0 and *mod,
   or -1 with err. */
int  rt_cc_load(const char *const *parts, int nparts, bool verbose, CcModule **mod, char *err, size_t err_size);
/* A kernel's address in mod, or NULL. */
void *rt_cc_sym(CcModule *mod, const char *name);
void rt_cc_unload(CcModule *mod);

/* v with thousands separators ("44,426"), in buf; printf's ' flag needs a locale. */
const char *rt_commas(long v, char buf[32]);

#endif
