/*
** The CUDA device: a GPU behind the device interface (device.h).
**
**   memory      device memory from cuMemAlloc, in the slots of the program's
**               memory plan (the executor allocates them); pinned host memory
**               for the buffers the host fills and reads (input, labels, loss)
**   kernels     the program's CUDA source (the same bodies as the C target)
**               compiled by NVRTC to a cubin for this GPU's own architecture
**               (where the GPU is newer than NVRTC, to PTX for the newest
**               architecture NVRTC knows, which the driver compiles on
**               loading), cached on disk beside the CPU kernels (keyed by
**               source, options, NVRTC version and architecture), loaded with
**               cuModuleLoadData; launched as CG_BLOCK-thread blocks: one
**               block per iteration for reductions (Step.blocks), a
**               grid-stride loop otherwise
**   GEMMs       cuBLAS, row-major through the transposed column-major
**               product; fp32 unless --tf32
**   streams     compute; copy (uploads from pinned memory, ordered before
**               the compute that follows by an event); communication
**               (collectives, ordered by events both ways, so a bucket's sum
**               overlaps the rest of the backward pass)
**   graphs      a run's steps captured once per batch shape into a CUDA
**               graph and replayed (the learning rate is read from device
**               memory, uploaded before each run, so a new rate needs no
**               new graph)
**   collectives NCCL between GPUs (one communicator over every replica of
**               every rank; the unique id goes out by MPI); several replicas
**               on one GPU (cuda:0,cuda:0), which NCCL cannot do, sum on that
**               GPU: each replica owns a chunk of every bucket and writes its
**               sum into every replica's copy (a reduce-scatter and an
**               all-gather in one pass)
**
** The driver, cuBLAS and NCCL (and NVRTC, runtime/ptx.c) are opened with
** dlopen on first use, so a binary built with CUDA runs on machines without
** them (CPU devices only).
*/
#include "runtime.h"
#include "device_cuda.h"
#include "ptx.h"
#include "rendezvous.h"
#include "comm.h"   /* rt_comm_owner */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef HAVE_CUDA

static const char no_cuda[] = "this mgc was built without CUDA (no CUDA toolkit headers at build time; install the "
                              "toolkit and rebuild: make clean && make, or CUDA_HOME=DIR make)";

int rt_cuda_device_count(char *err, size_t err_size)
{
    snprintf(err, err_size, "%s", no_cuda);
    return -1;
}

const char *rt_cuda_build(char *buf, size_t size)
{
    (void)buf; (void)size;
    return NULL;
}

int rt_cuda_gpu_name(int gpu, char *buf, size_t size, char *err, size_t err_size)
{
    (void)gpu; (void)buf; (void)size;
    snprintf(err, err_size, "%s", no_cuda);
    return -1;
}

Device *rt_device_cuda_new(int gpu, const CudaOptions *opt, char *err, size_t err_size)
{
    (void)gpu; (void)opt;
    snprintf(err, err_size, "%s", no_cuda);
    return NULL;
}

int rt_cuda_group(Device **devs, int n, World *world, int ncolls, char *err, size_t err_size)
{
    (void)devs; (void)n; (void)world; (void)ncolls;
    snprintf(err, err_size, "%s", no_cuda);
    return -1;
}

#else

#include <cuda.h>
#include <cublas_v2.h>
#ifdef HAVE_NCCL
#include <nccl.h>
#endif

#define STR_(x) #x
#define STR(x) STR_(x)   /* after macro expansion: cuMemAlloc -> "cuMemAlloc_v2", the exported name */

#ifndef MGC_CUDA_LIB
#define MGC_CUDA_LIB "/usr/local/cuda/lib64"
#endif

/* ------------------------------------------------------------ the libraries */

#define CU_FUNCS(X)                                                                                       \
    X(cuGetErrorString) X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet)                \
    X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)   \
    X(cuCtxSetCurrent) X(cuMemAlloc) X(cuMemFree) X(cuMemsetD8Async) X(cuMemHostAlloc) X(cuMemFreeHost)   \
    X(cuMemGetInfo)                                                                                       \
    X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuStreamCreate) X(cuStreamDestroy)   \
    X(cuStreamSynchronize) X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)       \
    X(cuModuleLoadData) X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel)                        \
    X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate)                                \
    X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy)

#define CUBLAS_FUNCS(X) \
    X(cublasCreate) X(cublasDestroy) X(cublasSetStream) X(cublasSgemm) X(cublasSgemmStridedBatched) X(cublasSetMathMode) X(cublasSetWorkspace) \
    X(cublasGemmEx) X(cublasGemmStridedBatchedEx)

#ifdef HAVE_NCCL
#define NCCL_FUNCS(X) \
    X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclAllReduce) X(ncclReduceScatter) X(ncclAllGather) X(ncclGroupStart) X(ncclGroupEnd) X(ncclCommDestroy) X(ncclCommFinalize) \
    X(ncclGetErrorString)
#else
typedef void *ncclComm_t;
#endif

#define DECLARE(f) __typeof__(f) *f;
static struct { CU_FUNCS(DECLARE) } cu;
static struct { CUBLAS_FUNCS(DECLARE) } blas;
#ifdef HAVE_NCCL
static struct { NCCL_FUNCS(DECLARE) } nccl;
#endif
#undef DECLARE

static pthread_once_t cu_once = PTHREAD_ONCE_INIT, blas_once = PTHREAD_ONCE_INIT, nccl_once = PTHREAD_ONCE_INIT;
static char cu_error[512], blas_error[512], nccl_error[512];   /* empty: loaded */

static void cu_load(void)
{
    char why[400];
    void *h = rt_open_lib("libcuda.so.1", NULL, NULL, why, sizeof why);
    if (!h) {
        snprintf(cu_error, sizeof cu_error, "no CUDA driver on this machine (%s)", why);
        return;
    }
#define LOAD(f)                                                                                                   \
    if (!(cu.f = (__typeof__(cu.f))dlsym(h, STR(f)))) {                                                            \
        snprintf(cu_error, sizeof cu_error, "the CUDA driver has no %s: it is older than the CUDA %d.%d this mgc " \
                 "was built with; update the driver", STR(f), CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);      \
        return;                                                                                                   \
    }
    CU_FUNCS(LOAD)
#undef LOAD
    CUresult r = cu.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *m = NULL;
        cu.cuGetErrorString(r, &m);
        snprintf(cu_error, sizeof cu_error, "the CUDA driver did not start: %s (CUresult %d)", m ? m : "unknown error", (int)r);
    }
}

static void blas_load(void)
{
    char why[400];
    void *h = rt_open_lib("libcublas.so." STR(CUBLAS_VER_MAJOR), "MGC_CUBLAS", MGC_CUDA_LIB, why, sizeof why);
    if (!h) {
        snprintf(blas_error, sizeof blas_error, "cannot open cuBLAS (%s); install the CUDA toolkit's cuBLAS or set MGC_CUBLAS to its path", why);
        return;
    }
#define LOAD(f)                                                                                    \
    if (!(blas.f = (__typeof__(blas.f))dlsym(h, STR(f)))) {                                         \
        snprintf(blas_error, sizeof blas_error, "cuBLAS has no %s (another version than this mgc's %d)", \
                 STR(f), CUBLAS_VER_MAJOR);                                                         \
        return;                                                                                    \
    }
    CUBLAS_FUNCS(LOAD)
#undef LOAD
}

static void nccl_load(void)
{
#ifdef HAVE_NCCL
    char why[400];
    void *h = rt_open_lib("libnccl.so." STR(NCCL_MAJOR), "MGC_NCCL", MGC_CUDA_LIB, why, sizeof why);
    if (!h) {
        snprintf(nccl_error, sizeof nccl_error, "cannot open NCCL (%s); install NCCL or set MGC_NCCL to libnccl.so.%d's path", why, NCCL_MAJOR);
        return;
    }
#define LOAD(f)                                                                                         \
    if (!(nccl.f = (__typeof__(nccl.f))dlsym(h, STR(f)))) {                                              \
        snprintf(nccl_error, sizeof nccl_error, "NCCL has no %s (this mgc was built with NCCL %d.%d)",    \
                 STR(f), NCCL_MAJOR, NCCL_MINOR);                                                        \
        return;                                                                                         \
    }
    NCCL_FUNCS(LOAD)
#undef LOAD
#else
    snprintf(nccl_error, sizeof nccl_error, "this mgc was built without NCCL (no nccl.h at build time): it cannot sum "
             "across GPUs; install NCCL and rebuild, or put every replica on one GPU (--devices cuda:0,cuda:0)");
#endif
}

static const char *cu_msg(CUresult r)
{
    const char *m = NULL;
    if (cu.cuGetErrorString(r, &m) == CUDA_SUCCESS && m) return m;
    static _Thread_local char buf[48];
    snprintf(buf, sizeof buf, "CUDA error %d", (int)r);
    return buf;
}

/* ---------------------------------------------------------------- the device */

enum { GRAPH_SLOTS = 4 };   /* training and evaluation, at the full and the last batch */

typedef struct GraphSlot {
    unsigned long long shape, used;
    CUgraphExec exec;
} GraphSlot;

typedef struct CudaGroup CudaGroup;

typedef struct CudaDev {
    int gpu, sms, major, minor;
    CUdevice dev;
    CUcontext ctx;
    CUstream s, cs, ms;        /* compute, copy, communication */
    CUevent up;                /* the last upload is done */
    CUevent comp;              /* the compute stream's work queued before an upload */
    cublasHandle_t blas;
    CUdeviceptr workspace;
    GraphSlot graphs[GRAPH_SLOTS];
    unsigned long long clock;
    bool recording;
    /* the data-parallel group */
    CudaGroup *group;
    int replica;
    ncclComm_t comm;
    int rank, ranks;           /* NCCL's (the chunk --shard-update's replica owns), of ranks */
    CUevent *ready, *done;     /* per collective: its data is computed; its sum is in place */
    CUmodule util;             /* the same-GPU reduction's kernel */
    CUfunction ring_sum;
    CUmodule check;            /* the tensors' check (cuda_count_bad), loaded on first use */
    CUfunction count_bad;
    bool capture_failed;       /* a call failed while recording: the graph is dropped */
    bool replayed;             /* a graph has run: an error may come from one of its kernels */
} CudaDev;

/* A failed CUDA call in the middle of a run leaves the GPU in an unknown
   state: say where, and stop (the last epoch's checkpoint is on disk). */
static void fail(Device *d, const char *what, const char *msg)
{
    CudaDev *c = d->impl;
    if (c && c->recording) {   /* nothing runs while recording: record_end drops the graph and the steps run as they are */
        if (!c->capture_failed)
            fprintf(stderr, "mgc: %s: %s failed while recording a CUDA graph (%s): running the steps without one\n",
                    d->name, what, msg);
        c->capture_failed = true;
        return;
    }
    fprintf(stderr, "mgc: %s: %s failed: %s%s\n", d->name, what, msg,
            c && c->replayed ? " (it may be a kernel of the last replayed CUDA graph that failed: MGC_CUDA_GRAPHS=0 "
                          "CUDA_LAUNCH_BLOCKING=1 names it)" : "");
    exit(1);
}

#define CU(d, call)                                                \
    do {                                                           \
        CUresult cu_rc_ = (call);                                  \
        if (cu_rc_ != CUDA_SUCCESS) fail(d, #call, cu_msg(cu_rc_)); \
    } while (0)

static CudaDev *cur(Device *d)
{
    CudaDev *c = d->impl;
    cu.cuCtxSetCurrent(c->ctx);
    return c;
}

static void *cuda_alloc(Device *d, size_t bytes)
{
    CudaDev *c = cur(d);
    CUdeviceptr p;
    if (!bytes) bytes = 64;
    if (cu.cuMemAlloc(&p, bytes) != CUDA_SUCCESS) return NULL;
    CU(d, cu.cuMemsetD8Async(p, 0, bytes, c->s));
    return (void *)(uintptr_t)p;
}

static void cuda_release(Device *d, void *mem)
{
    cur(d);
    cu.cuMemFree((CUdeviceptr)(uintptr_t)mem);
}

static size_t cuda_memory_free(Device *d)
{
    cur(d);
    size_t free_bytes = 0, total = 0;
    return cu.cuMemGetInfo(&free_bytes, &total) == CUDA_SUCCESS ? free_bytes : 0;
}

static void *cuda_alloc_host(Device *d, size_t bytes)
{
    cur(d);
    void *p = NULL;
    if (cu.cuMemHostAlloc(&p, bytes ? bytes : 64, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) return NULL;
    memset(p, 0, bytes);
    return p;
}

static void cuda_release_host(Device *d, void *mem)
{
    cur(d);
    cu.cuMemFreeHost(mem);
}

static void cuda_upload(Device *d, void *dst, const void *src, size_t bytes)
{
    CudaDev *c = cur(d);
    /* after what the compute stream has queued (the zeroing of a new buffer, a kernel still reading dst) */
    CU(d, cu.cuEventRecord(c->comp, c->s));
    CU(d, cu.cuStreamWaitEvent(c->cs, c->comp, 0));
    CU(d, cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, bytes, c->cs));
    CU(d, cu.cuEventRecord(c->up, c->cs));
    CU(d, cu.cuStreamWaitEvent(c->s, c->up, 0));
}

static void cuda_download(Device *d, void *dst, const void *src, size_t bytes)
{
    CudaDev *c = cur(d);
    CU(d, cu.cuMemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, bytes, c->s));
    CU(d, cu.cuStreamSynchronize(c->s));
}

static void cuda_copy(Device *d, void *dst, const void *src, size_t bytes)
{
    CudaDev *c = cur(d);
    if (dst != src) CU(d, cu.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes, c->s));
}

/* The module image of source for this GPU (a cubin, or PTX where NVRTC does
   not know the GPU's architecture): from the cache, else NVRTC (then cached,
   written to a temporary file and renamed, so no reader sees half of it).
   NUL-terminated (PTX must be). */
static void *image_for(CudaDev *c, const char *source, bool verbose, bool fresh, size_t *size, char *path, size_t path_size,
                       char *err, size_t err_size)
{
    char arch[16], ver[64];
    bool ptx;
    int got = rt_nvrtc_arch(c->major * 10 + c->minor, &ptx, err, err_size);
    if (got < 0) return NULL;
    snprintf(arch, sizeof arch, "sm_%d", got);
    rt_nvrtc_version(ver, sizeof ver);
    static int told;   /* said once, whichever replica's thread loads first */
    if (ptx && !__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "mgc: note: GPU %d is sm_%d%d, newer than %s compiles for: its kernels go to the driver as PTX for "
                "compute_%d, which it compiles for the GPU on loading\n", c->gpu, c->major, c->minor, ver, got);
    uint64_t h = rt_fnv1a(CG_FNV1A_START, source);
    h = rt_fnv1a(h, "\n--nvrtc ");
    h = rt_fnv1a(h, ver);
    h = rt_fnv1a(h, arch);
    h = rt_fnv1a(h, ptx ? " ptx" : " cubin");
    for (int k = 0; k < RT_NVRTC_NOPTIONS; k++) h = rt_fnv1a(h, rt_nvrtc_options[k]);
    CacheDir cache;
    char name[64];
    if (rt_cache_open(&cache, err, err_size)) return NULL;
    if (ptx) snprintf(name, sizeof name, "%016llx.compute_%d.ptx", (unsigned long long)h, got);
    else snprintf(name, sizeof name, "%016llx.%s.cubin", (unsigned long long)h, arch);
    snprintf(path, path_size, "%s/%s", cache.path, name);
    /* another's, or writable by others: said, compiled anew */
    int fd = fresh ? -1 : rt_cache_open_entry(&cache, name, false);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (fd >= 0 && !f) close(fd);
    if (f) {
        struct stat st;
        long n = fstat(fileno(f), &st) ? -1 : (long)st.st_size;
        char *img = n > 0 ? malloc((size_t)n + 1) : NULL;
        bool ok = img && fread(img, 1, (size_t)n, f) == (size_t)n;
        if (ok) rt_cache_touch(fileno(f));
        fclose(f);
        if (ok) {
            img[n] = 0;
            rt_cache_close(&cache);
            if (verbose) fprintf(stderr, "mgc: CUDA kernels found in cache %s\n", path);
            *size = (size_t)n;
            return img;
        }
        free(img);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char *img = ptx ? rt_nvrtc_ptx(source, "mgc_kernels.cu", arch, size, err, err_size)
                    : rt_nvrtc_cubin(source, "mgc_kernels.cu", arch, size, err, err_size);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (img) {
        img[*size] = 0;   /* rt_nvrtc_* leave a byte for it */
        if (!rt_cache_put(&cache, name, img, *size)) rt_cache_prune(h, verbose);   /* else run without the cache: an optimisation */
    }
    rt_cache_close(&cache);
    if (!img) return NULL;
    if (verbose)
        fprintf(stderr, "mgc: NVRTC compiled the CUDA kernels for %s%s in %.2f s -> %s\n", ptx ? "compute_" : "sm_", arch + 3,
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), path);
    return img;
}

/* Loads source as a module: the cached image, or a fresh one if the cached does not load. */
static int load_module(Device *d, const char *source, bool verbose, CUmodule *mod, char *err, size_t err_size)
{
    CudaDev *c = cur(d);
    char path[4600];
    for (int fresh = 0; fresh < 2; fresh++) {
        size_t size;
        void *img = image_for(c, source, verbose, fresh, &size, path, sizeof path, err, err_size);
        if (!img) return -1;
        CUresult r = cu.cuModuleLoadData(mod, img);
        free(img);
        if (r == CUDA_SUCCESS) return 0;
        int drv = 0;
        char ver[64];
        cu.cuDriverGetVersion(&drv);
        rt_nvrtc_version(ver, sizeof ver);
        snprintf(err, err_size, "%s: cannot load the CUDA kernels (%s): %s (the driver is CUDA %d.%d, %s: a driver older "
                 "than NVRTC cannot load what it makes; update the driver)", d->name, path, cu_msg(r), drv / 1000, drv % 1000 / 10, ver);
    }
    return -1;
}

static int cuda_load(Device *d, const Program *p, bool verbose, void **module, KernelFn *fns, char *err, size_t err_size)
{
    CUmodule mod = NULL;
    for (int k = 0; k < p->nsteps; k++)
        if (p->steps[k].c_only) {   /* the driver compiles for CUDA without them (CgOptions.cpu_only) */
            snprintf(err, err_size, "internal: kernel %s is C only and cannot run on %s", p->steps[k].fn, d->name);
            return -1;
        }
    int own = 0;
    for (int k = 0; k < p->nsteps; k++) own += cg_own_code(&p->steps[k]);
    *module = NULL;
    if (own > 0) {   /* none where every kernel is another program's (loaded with it) */
        char *source;   /* the kernels that run their own code (twins share it) */
        cg_source_parts(p, TARGET_CUDA, 1, &source);
        if (load_module(d, source, verbose, &mod, err, err_size)) return -1;
        *module = mod;
    }
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (s->kind != STEP_KERNEL || s->shared) continue;   /* shared: the Exec takes it from the other program's */
        CUfunction f;
        CUresult r = cu.cuModuleGetFunction(&f, mod, s->sym);
        if (r != CUDA_SUCCESS) {
            snprintf(err, err_size, "kernel %s missing from the CUDA module: %s", s->sym, cu_msg(r));
            return -1;
        }
        memcpy(&fns[k], &f, sizeof f);
    }
    return 0;
}

static void cuda_unload(Device *d, void *module)
{
    cur(d);
    if (module) cu.cuModuleUnload(module);
}

static void cuda_launch(Device *d, KernelFn fn, const KArgs *a, const Step *s, long work)
{
    CudaDev *c = cur(d);
    CUfunction f;
    memcpy(&f, &fn, sizeof f);
    long grid;
    if (s->blocks) grid = work < (1L << 20) ? work : (1L << 20);   /* a block per reduction, looping past 2^20 */
    else {
        grid = (work + CG_BLOCK - 1) / CG_BLOCK;
        long most = (long)c->sms * 32;   /* full occupancy and then some; the grid-stride loop does the rest */
        if (grid > most) grid = most;
    }
    if (grid <= 0) return;
    KArgs args = *a;
    void *params[] = { &args };
    CUresult r = cu.cuLaunchKernel(f, (unsigned)grid, 1, 1, CG_BLOCK, 1, 1, 0, c->s, params, NULL);
    if (r != CUDA_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "launching kernel %s", s->fn);
        fail(d, what, cu_msg(r));
    }
}

static const char *cublas_msg(cublasStatus_t st, char *buf, size_t size)
{
    const char *name = st == CUBLAS_STATUS_NOT_INITIALIZED ? "not initialised" : st == CUBLAS_STATUS_ALLOC_FAILED ? "allocation failed"
                     : st == CUBLAS_STATUS_INVALID_VALUE ? "invalid value" : st == CUBLAS_STATUS_ARCH_MISMATCH ? "architecture mismatch"
                     : st == CUBLAS_STATUS_EXECUTION_FAILED ? "execution failed" : st == CUBLAS_STATUS_INTERNAL_ERROR ? "internal error"
                     : st == CUBLAS_STATUS_NOT_SUPPORTED ? "not supported" : "unknown";
    snprintf(buf, size, "cuBLAS status %d, %s", (int)st, name);
    return buf;
}

static void cuda_gemm(Device *d, const GemmArgs *g)
{
    CudaDev *c = cur(d);
    if (g->m <= 0 || g->n <= 0) return;
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
    cublasOperation_t tb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    bool batched = g->batch > 1;
    if (g->bf16 || g->ab16) {
        /* --precision bf16: the tensor cores' bf16 multiplies, fp32 sums; A and B stored as bf16
           (CUDA_R_16BF, packed by mgc's kernels: ab16), or fp32 matrices rounded as cuBLAS reads them */
        cudaDataType in = g->ab16 ? CUDA_R_16BF : CUDA_R_32F;
        cublasComputeType_t how = g->ab16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
        cublasStatus_t st =
            batched ? blas.cublasGemmStridedBatchedEx(c->blas, tb, ta, g->n, g->m, g->k, &g->alpha, g->b, in, g->ldb, g->sb, g->a, in, g->lda,
                                                      g->sa, &g->beta, g->c, CUDA_R_32F, g->ldc, g->sc, g->batch, how, CUBLAS_GEMM_DEFAULT)
                    : blas.cublasGemmEx(c->blas, tb, ta, g->n, g->m, g->k, &g->alpha, g->b, in, g->ldb, g->a, in, g->lda, &g->beta, g->c,
                                        CUDA_R_32F, g->ldc, how, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            char msg[64];
            fail(d, batched ? "cublasGemmStridedBatchedEx" : "cublasGemmEx", cublas_msg(st, msg, sizeof msg));
        }
        return;
    }
    cublasStatus_t st = batched ? blas.cublasSgemmStridedBatched(c->blas, tb, ta, g->n, g->m, g->k, &g->alpha, g->b, g->ldb, g->sb, g->a,
                                                                 g->lda, g->sa, &g->beta, g->c, g->ldc, g->sc, g->batch)
                                : blas.cublasSgemm(c->blas, tb, ta, g->n, g->m, g->k, &g->alpha, g->b, g->ldb, g->a, g->lda, &g->beta, g->c,
                                                   g->ldc);
    if (st != CUBLAS_STATUS_SUCCESS) {
        char msg[64];
        fail(d, batched ? "cublasSgemmStridedBatched" : "cublasSgemm", cublas_msg(st, msg, sizeof msg));
    }
}

static void cuda_synchronize(Device *d)
{
    CudaDev *c = cur(d);
    if (c->recording) return;   /* nothing has run yet */
    CU(d, cu.cuStreamSynchronize(c->s));
}

/* ------------------------------------------------------------- collectives */

struct CudaGroup {
    int n;                     /* replicas in this process */
    bool same_gpu;             /* the on-GPU sum (rendezvous.h), else NCCL */
    CudaDev **dev;
    int ncolls;
    Rendezvous *rv;
    bool finalized;            /* NCCL: the communicators finalised together (before any is destroyed) */
    int destroyed;             /* replicas destroyed: the last one frees the group */
};

typedef struct RingArgs {
    float *p[RV_MAX];
    int n;
    long begin, end;
} RingArgs;

/* every replica's copy of [begin, end) becomes their sum, added in replica order (the same bits
   everywhere): rt_rv_sum_chunk on the GPU */
static const char ring_source[] =
    "struct RingArgs { float *p[" STR(RV_MAX) "]; int n; long begin, end; };\n"
    "extern \"C\" __global__ void mgc_ring_sum(RingArgs a)\n"
    "{\n"
    "    for (long i = a.begin + (long)blockIdx.x * blockDim.x + threadIdx.x; i < a.end; i += (long)blockDim.x * gridDim.x) {\n"
    "        float s = 0.0f;\n"
    "        for (int j = 0; j < a.n; j++) s += a.p[j][i];\n"
    "        for (int j = 0; j < a.n; j++) a.p[j][i] = s;\n"
    "    }\n"
    "}\n";

static void cuda_allreduce_start(Device *d, Comm *comm, int replica, int coll, int kind, float *data, long n)
{
    (void)comm; (void)replica;
    CudaDev *c = cur(d);
    CudaGroup *g = c->group;
    CU(d, cu.cuEventRecord(c->ready[coll], c->s));
    if (!g->same_gpu) {
#ifdef HAVE_NCCL
        CU(d, cu.cuStreamWaitEvent(c->ms, c->ready[coll], 0));
        /* --shard-update's halves, in place: NCCL rank r's chunk of n / ranks is the r-th (its rank is the
           chunk it owns: rt_comm_owner numbers them so, see cuda_group) */
        size_t part = (size_t)n / (size_t)c->ranks;
        ncclResult_t r = kind == COLL_REDUCE_SCATTER
                             ? nccl.ncclReduceScatter(data, data + (size_t)c->rank * part, part, ncclFloat, ncclSum, c->comm, (cudaStream_t)c->ms)
                         : kind == COLL_ALLGATHER
                             ? nccl.ncclAllGather(data + (size_t)c->rank * part, data, part, ncclFloat, c->comm, (cudaStream_t)c->ms)
                             : nccl.ncclAllReduce(data, data, (size_t)n, ncclFloat, ncclSum, c->comm, (cudaStream_t)c->ms);
        if (r != ncclSuccess) fail(d, kind == COLL_ALLREDUCE ? "ncclAllReduce" : kind == COLL_ALLGATHER ? "ncclAllGather" : "ncclReduceScatter",
                                   nccl.ncclGetErrorString(r));
        CU(d, cu.cuEventRecord(c->done[coll], c->ms));
#endif
        return;
    }
    rt_rv_arrive(g->rv, c->replica, coll, data, n);
}

static double cuda_allreduce_wait(Device *d, Comm *comm, int replica, int coll)
{
    (void)comm; (void)replica;
    CudaDev *c = cur(d);
    CudaGroup *g = c->group;
    if (!g->same_gpu) {
        CU(d, cu.cuStreamWaitEvent(c->s, c->done[coll], 0));
        return 0;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    RingArgs a = { .n = g->n };
    rt_rv_gather(g->rv, c->replica, coll, a.p, &a.begin, &a.end);
    /* this replica's chunk, once every replica's data is computed */
    for (int j = 0; j < g->n; j++) CU(d, cu.cuStreamWaitEvent(c->ms, g->dev[j]->ready[coll], 0));
    if (a.end > a.begin) {
        long grid = (a.end - a.begin + CG_BLOCK - 1) / CG_BLOCK;
        if (grid > (long)c->sms * 8) grid = (long)c->sms * 8;
        void *params[] = { &a };
        CU(d, cu.cuLaunchKernel(c->ring_sum, (unsigned)grid, 1, 1, CG_BLOCK, 1, 1, 0, c->ms, params, NULL));
    }
    CU(d, cu.cuEventRecord(c->done[coll], c->ms));
    rt_rv_finish(g->rv, c->replica, coll);
    for (int j = 0; j < g->n; j++) CU(d, cu.cuStreamWaitEvent(c->s, g->dev[j]->done[coll], 0));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

int rt_cuda_group(Device **devs, int n, World *world, int ncolls, char *err, size_t err_size)
{
    CudaGroup *g = calloc(1, sizeof *g);
    g->n = n;
    g->ncolls = ncolls;
    g->dev = calloc((size_t)n, sizeof *g->dev);
    /* a GPU named twice holds every replica of this one process (the driver's
       check_gpus refuses any other list before anything starts): the on-GPU
       sum; else one GPU a replica, NCCL */
    bool same = true;
    for (int k = 0; k < n; k++) {
        g->dev[k] = devs[k]->impl;
        same &= g->dev[k]->gpu == g->dev[0]->gpu;
    }
    g->same_gpu = same && n > 1 && world->size == 1;
    if (g->same_gpu && n > RV_MAX) {
        snprintf(err, err_size, "at most %d replicas on one GPU (asked for %d)", RV_MAX, n);
        free(g->dev);
        free(g);
        return -1;
    }
    if (g->same_gpu) g->rv = rt_rv_new(n, ncolls);
    for (int k = 0; k < n; k++) {
        CudaDev *c = g->dev[k];
        Device *d = devs[k];
        cur(d);
        c->group = g;
        c->replica = k;
        c->ready = calloc((size_t)ncolls + 1, sizeof(CUevent));
        c->done = calloc((size_t)ncolls + 1, sizeof(CUevent));
        for (int j = 0; j < ncolls; j++) {
            CU(d, cu.cuEventCreate(&c->ready[j], CU_EVENT_DISABLE_TIMING));
            CU(d, cu.cuEventCreate(&c->done[j], CU_EVENT_DISABLE_TIMING));
        }
        if (g->same_gpu) {
            if (load_module(d, ring_source, false, &c->util, err, err_size)) return -1;
            CU(d, cu.cuModuleGetFunction(&c->ring_sum, c->util, "mgc_ring_sum"));
            d->can_record = false;   /* its replicas wait for each other's events: not one graph each */
        }
    }
    if (g->same_gpu) return 0;
    pthread_once(&nccl_once, nccl_load);
    if (nccl_error[0]) {
        snprintf(err, err_size, "%s", nccl_error);
        return -1;
    }
#ifdef HAVE_NCCL
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (world->rank == 0) r = nccl.ncclGetUniqueId(&id);
    if (rt_world_max_status(world, r != ncclSuccess)) {
        snprintf(err, err_size, "NCCL could not start: %s", r != ncclSuccess ? nccl.ncclGetErrorString(r) : "rank 0 failed");
        return -1;
    }
    rt_world_bcast(world, &id, sizeof id);
    int total = n * world->size;
    nccl.ncclGroupStart();
    for (int k = 0; k < n && r == ncclSuccess; k++) {
        cur(devs[k]);
        /* the rank: the chunk --shard-update's replica owns (rt_comm_owner: a process's replicas hold neighbouring chunks) */
        g->dev[k]->rank = rt_comm_owner(k, world->rank, world->size), g->dev[k]->ranks = total;
        r = nccl.ncclCommInitRank(&g->dev[k]->comm, total, id, g->dev[k]->rank);
    }
    ncclResult_t r2 = nccl.ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        snprintf(err, err_size, "NCCL could not join the %d replicas: %s", total, nccl.ncclGetErrorString(r));
        return -1;
    }
#endif
    return 0;
}

/* ------------------------------------------------------------------- graphs */

static GraphSlot *slot_for(CudaDev *c, unsigned long long shape)
{
    for (int k = 0; k < GRAPH_SLOTS; k++)
        if (c->graphs[k].exec && c->graphs[k].shape == shape) return &c->graphs[k];
    return NULL;
}

static bool cuda_replay(Device *d, unsigned long long shape)
{
    CudaDev *c = cur(d);
    GraphSlot *g = slot_for(c, shape);
    if (!g) return false;
    g->used = ++c->clock;
    CU(d, cu.cuGraphLaunch(g->exec, c->s));
    c->replayed = true;
    return true;
}

static void cuda_record_begin(Device *d)
{
    CudaDev *c = cur(d);
    /* thread-local: the other replicas' threads go on calling CUDA meanwhile */
    if (cu.cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS) c->recording = true;
}

static int cuda_record_end(Device *d, unsigned long long shape)
{
    CudaDev *c = cur(d);
    if (!c->recording) return 1;   /* recording never began: the steps ran as they were issued */
    c->recording = false;
    CUgraph graph = NULL;
    CUresult er = cu.cuStreamEndCapture(c->s, &graph);
    if (c->capture_failed || er != CUDA_SUCCESS || !graph) {
        if (!c->capture_failed) fprintf(stderr, "mgc: %s: recording a CUDA graph failed (%s): running the steps without one\n",
                                        d->name, cu_msg(er));
        c->capture_failed = false;
        if (graph) cu.cuGraphDestroy(graph);
        return -1;
    }
    GraphSlot *g = slot_for(c, shape);   /* NULL: recorded only when not found */
    if (!g) {   /* the least recently used slot */
        g = &c->graphs[0];
        for (int k = 1; k < GRAPH_SLOTS; k++)
            if (!c->graphs[k].exec || (g->exec && c->graphs[k].used < g->used)) g = &c->graphs[k];
    }
    if (g->exec) cu.cuGraphExecDestroy(g->exec);
    g->exec = NULL;
    if (cu.cuGraphInstantiate(&g->exec, graph, 0) != CUDA_SUCCESS) {
        g->exec = NULL;
        cu.cuGraphDestroy(graph);
        return -1;
    }
    cu.cuGraphDestroy(graph);
    g->shape = shape;
    g->used = ++c->clock;
    CU(d, cu.cuGraphLaunch(g->exec, c->s));
    c->replayed = true;
    return 0;
}

/* ------------------------------------------------------------------ devices */

static void cuda_destroy(Device *d)
{
    CudaDev *c = cur(d);
    cu.cuStreamSynchronize(c->s);
    for (int k = 0; k < GRAPH_SLOTS; k++)
        if (c->graphs[k].exec) cu.cuGraphExecDestroy(c->graphs[k].exec);
#ifdef HAVE_NCCL
    if (c->comm && c->group && !c->group->finalized) {
        /* finalising waits until every rank's communicator is quiescent: one thread
           driving several GPUs finalises them all in one group, else the first would
           wait for the others forever; then each is destroyed without waiting */
        CudaGroup *g = c->group;
        g->finalized = true;
        nccl.ncclGroupStart();
        for (int k = 0; k < g->n; k++)
            if (g->dev[k] && g->dev[k]->comm) {
                cu.cuCtxSetCurrent(g->dev[k]->ctx);
                nccl.ncclCommFinalize(g->dev[k]->comm);
            }
        nccl.ncclGroupEnd();
        cu.cuCtxSetCurrent(c->ctx);
    }
    if (c->comm) nccl.ncclCommDestroy(c->comm);
#endif
    for (int j = 0; c->group && j < c->group->ncolls; j++) {
        cu.cuEventDestroy(c->ready[j]);
        cu.cuEventDestroy(c->done[j]);
    }
    free(c->ready);
    free(c->done);
    if (c->util) cu.cuModuleUnload(c->util);
    if (c->check) cu.cuModuleUnload(c->check);
    if (c->blas) blas.cublasDestroy(c->blas);
    if (c->workspace) cu.cuMemFree(c->workspace);
    if (c->up) cu.cuEventDestroy(c->up);
    if (c->comp) cu.cuEventDestroy(c->comp);
    if (c->s) cu.cuStreamDestroy(c->s);
    if (c->cs) cu.cuStreamDestroy(c->cs);
    if (c->ms) cu.cuStreamDestroy(c->ms);
    cu.cuDevicePrimaryCtxRelease(c->dev);
    CudaGroup *g = c->group;
    if (g) {   /* no longer the group's; the last of its replicas frees it */
        g->dev[c->replica] = NULL;
        if (__atomic_add_fetch(&g->destroyed, 1, __ATOMIC_ACQ_REL) == g->n) {
            if (g->rv) rt_rv_free(g->rv);
            free(g->dev);
            free(g);
        }
    }
    free(c);
    free(d);
}

/* *count += the elements of x[0, n) that are not finite, or below 0 where variance (-0 is not):
   by their bits, which no fast-math option reads otherwise */
typedef struct CheckArgs {
    const float *x;
    long n;
    int variance;
    unsigned *count;
} CheckArgs;
static const char check_source[] =
    "struct CheckArgs { const float *x; long n; int variance; unsigned *count; };\n"
    "extern \"C\" __global__ void mgc_count_bad(CheckArgs a)\n"
    "{\n"
    "    unsigned bad = 0;\n"
    "    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += (long)blockDim.x * gridDim.x) {\n"
    "        unsigned b = __float_as_uint(a.x[i]);\n"
    "        bad += (b & 0x7f800000u) == 0x7f800000u || (a.variance && b > 0x80000000u);\n"
    "    }\n"
    "    if (bad) atomicAdd(a.count, bad);\n"
    "}\n";

/* Each tensor a launch on the compute stream (after the work queued there),
   into a counter of its own; the counters alone come back. */
static int cuda_count_bad(Device *d, float *const *mem, const long *numel, const bool *variance, int n, long *bad)
{
    CudaDev *c = cur(d);
    char err[1024];
    if (!c->check) {
        if (load_module(d, check_source, false, &c->check, err, sizeof err)) {
            fprintf(stderr, "mgc: %s: %s\n", d->name, err);
            return -1;
        }
        CU(d, cu.cuModuleGetFunction(&c->count_bad, c->check, "mgc_count_bad"));
    }
    unsigned *counts = n > 0 ? calloc((size_t)n, sizeof *counts) : NULL;
    CUdeviceptr dev_counts;
    if (n <= 0 || !counts || cu.cuMemAlloc(&dev_counts, (size_t)n * sizeof *counts) != CUDA_SUCCESS) {
        free(counts);
        return n <= 0 ? 0 : -1;
    }
    CU(d, cu.cuMemsetD8Async(dev_counts, 0, (size_t)n * sizeof *counts, c->s));
    for (int k = 0; k < n; k++) {
        if (numel[k] <= 0) continue;
        long grid = (numel[k] + CG_BLOCK - 1) / CG_BLOCK;
        if (grid > (long)c->sms * 4) grid = (long)c->sms * 4;
        CheckArgs a = { mem[k], numel[k], variance[k], (unsigned *)(uintptr_t)(dev_counts + (CUdeviceptr)k * sizeof *counts) };
        void *params[] = { &a };
        CU(d, cu.cuLaunchKernel(c->count_bad, (unsigned)grid, 1, 1, CG_BLOCK, 1, 1, 0, c->s, params, NULL));
    }
    CU(d, cu.cuMemcpyDtoHAsync(counts, dev_counts, (size_t)n * sizeof *counts, c->s));
    CU(d, cu.cuStreamSynchronize(c->s));
    cu.cuMemFree(dev_counts);
    for (int k = 0; k < n; k++) bad[k] = (long)counts[k];
    free(counts);
    return 0;
}

static const DeviceOps cuda_ops = {
    .alloc = cuda_alloc, .release = cuda_release, .alloc_host = cuda_alloc_host, .release_host = cuda_release_host,
    .memory_free = cuda_memory_free,
    .upload = cuda_upload, .download = cuda_download, .copy = cuda_copy, .load = cuda_load, .unload = cuda_unload,
    .launch = cuda_launch, .gemm = cuda_gemm, .synchronize = cuda_synchronize,
    .allreduce_start = cuda_allreduce_start, .allreduce_wait = cuda_allreduce_wait,
    .replay = cuda_replay, .record_begin = cuda_record_begin, .record_end = cuda_record_end,
    .count_bad = cuda_count_bad, .destroy = cuda_destroy,
};

int rt_cuda_device_count(char *err, size_t err_size)
{
    pthread_once(&cu_once, cu_load);
    if (cu_error[0]) {
        snprintf(err, err_size, "%s", cu_error);
        return -1;
    }
    int n = 0;
    CUresult r = cu.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS) {
        snprintf(err, err_size, "the CUDA driver cannot count the GPUs: %s", cu_msg(r));
        return -1;
    }
    return n;
}

const char *rt_cuda_build(char *buf, size_t size)
{
    snprintf(buf, size, "built with CUDA %d.%d, cuBLAS %d.%d, %s", CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10,
             CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR,
#ifdef HAVE_NCCL
             "NCCL " STR(NCCL_MAJOR) "." STR(NCCL_MINOR)
#else
             "no NCCL (replicas on one GPU only)"
#endif
    );
    return buf;
}

/* dev's compute capability and "NAME, sm_XY" (the run report's and --version's words for it) */
static CUresult describe_gpu(CUdevice dev, int *major, int *minor, char *model, size_t size)
{
    char name[48] = "";
    CUresult r = cu.cuDeviceGetName(name, sizeof name, dev);
    if (r == CUDA_SUCCESS) r = cu.cuDeviceGetAttribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    if (r == CUDA_SUCCESS) r = cu.cuDeviceGetAttribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    if (r == CUDA_SUCCESS) snprintf(model, size, "%.40s, sm_%d%d", name, *major, *minor);
    return r;
}

int rt_cuda_gpu_name(int gpu, char *buf, size_t size, char *err, size_t err_size)
{
    int count = rt_cuda_device_count(err, err_size);
    if (count < 0) return -1;
    CUdevice dev;
    int major, minor;
    CUresult r = cu.cuDeviceGet(&dev, gpu);
    if (r == CUDA_SUCCESS) r = describe_gpu(dev, &major, &minor, buf, size);
    if (r != CUDA_SUCCESS) {
        snprintf(err, err_size, "cuda:%d: %s", gpu, cu_msg(r));
        return -1;
    }
    return 0;
}

Device *rt_device_cuda_new(int gpu, const CudaOptions *opt, char *err, size_t err_size)
{
    int count = rt_cuda_device_count(err, err_size);
    if (count < 0) return NULL;
    if (gpu < 0 || gpu >= count) {
        snprintf(err, err_size, "there is no GPU cuda:%d: this machine has %d; use --gpus %d or fewer, or train on CPU devices "
                 "with --devices cpu:N", gpu, count, count);
        return NULL;
    }
    pthread_once(&blas_once, blas_load);
    if (blas_error[0]) {
        snprintf(err, err_size, "%s", blas_error);
        return NULL;
    }
    CudaDev *c = calloc(1, sizeof *c);
    Device *d = calloc(1, sizeof *d);
    d->ops = &cuda_ops;
    d->impl = c;
    d->kind = DEV_CUDA;
    d->host_memory = false;
    d->can_record = true;
    snprintf(d->name, sizeof d->name, "cuda:%d", gpu);
    c->gpu = gpu;
    CUresult r;
#define TRY(call)                                                                                     \
    if ((r = (call)) != CUDA_SUCCESS) {                                                               \
        snprintf(err, err_size, "cuda:%d: %s failed: %s", gpu, #call, cu_msg(r));                    \
        free(c);                                                                                      \
        free(d);                                                                                      \
        return NULL;                                                                                  \
    }
    TRY(cu.cuDeviceGet(&c->dev, gpu));
    TRY(cu.cuDevicePrimaryCtxRetain(&c->ctx, c->dev));
    TRY(cu.cuCtxSetCurrent(c->ctx));
    TRY(describe_gpu(c->dev, &c->major, &c->minor, d->model, sizeof d->model));
    TRY(cu.cuDeviceGetAttribute(&c->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c->dev));
    TRY(cu.cuStreamCreate(&c->s, CU_STREAM_NON_BLOCKING));
    TRY(cu.cuStreamCreate(&c->cs, CU_STREAM_NON_BLOCKING));
    TRY(cu.cuStreamCreate(&c->ms, CU_STREAM_NON_BLOCKING));
    TRY(cu.cuEventCreate(&c->up, CU_EVENT_DISABLE_TIMING));
    TRY(cu.cuEventCreate(&c->comp, CU_EVENT_DISABLE_TIMING));
    /* cuBLAS on the compute stream, with a workspace of its own so that graph capture allocates nothing */
    size_t ws = 32u << 20;
    TRY(cu.cuMemAlloc(&c->workspace, ws));
#undef TRY
    cublasStatus_t bst;
    const char *bcall = "cublasCreate";
    if ((bst = blas.cublasCreate(&c->blas)) == CUBLAS_STATUS_SUCCESS &&
        (bcall = "cublasSetStream", bst = blas.cublasSetStream(c->blas, (cudaStream_t)c->s)) == CUBLAS_STATUS_SUCCESS &&
        (bcall = "cublasSetWorkspace", bst = blas.cublasSetWorkspace(c->blas, (void *)(uintptr_t)c->workspace, ws)) == CUBLAS_STATUS_SUCCESS)
        bcall = "cublasSetMathMode", bst = blas.cublasSetMathMode(c->blas, opt && opt->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (bst != CUBLAS_STATUS_SUCCESS) {
        char msg[64];
        snprintf(err, err_size, "cuda:%d: cuBLAS could not start: %s gave %s", gpu, bcall, cublas_msg(bst, msg, sizeof msg));
        cuda_destroy(d);
        return NULL;
    }
    if (opt && opt->verbose) {
        int v = 0;
        cu.cuDriverGetVersion(&v);
        fprintf(stderr, "mgc: cuda:%d is %s, %d multiprocessors; driver CUDA %d.%d; GEMMs in %s\n", gpu, d->model, c->sms,
                v / 1000, v % 1000 / 10, opt->tf32 ? "TF32" : "fp32");
    }
    return d;
}

#endif
