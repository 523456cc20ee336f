/*
** fakecuda: the part of the CUDA driver, NVRTC, cuBLAS and NCCL that mgc's
** CUDA device calls (runtime/device_cuda.c, runtime/ptx.c), on the CPU, in
** one shared library. mgc opens those libraries with dlopen; pointed at this
** one (tests/fakecuda.sh: LD_LIBRARY_PATH for libcuda.so.1, MGC_NVRTC,
** MGC_CUBLAS, MGC_NCCL), a CUDA build of mgc runs its whole GPU path on a
** machine without a GPU: the generated CUDA kernels (compiled by the system's
** C++ compiler with shim.h), the launches and their geometry, cuBLAS's
** column-major GEMMs, streams, events and CUDA graph capture and replay, and
** NCCL's allreduce between replicas, in one process or in several on this
** machine (mpirun: the ranks meet in shared memory named after NCCL's id).
**
** It is a test double, not a GPU. Each stream is a thread that works through
** its queue while the host goes on, events order streams as the driver's
** do, and host memory is read or written when the copy runs (pinned memory)
** or before the call returns (pageable). A copy between the host's pinned
** memory and the device runs 2 ms late; the host memory it will fill reads
** as NaN until then, and the memory it will read must not change meanwhile
** (checked by a hash): a synchronisation that mgc forgets shows as wrong
** numbers or a stop that says so. A stream's work runs in order, one kernel
** at a time (FAKECUDA_SYNC=1: all work when issued, as under
** CUDA_LAUNCH_BLOCKING=1). What it checks on the way, as the real libraries
** would fail or as a GPU would silently misbehave:
**   - device memory starts as NaN (0xff bytes), not zeros;
**   - copies, memsets and GEMM operands stay inside one allocation;
**   - cuBLAS's leading dimensions and NCCL's counts and types;
**   - capture: no allocation, synchronisation or pageable-memory copy while a
**     stream is capturing, and no wait for an event from outside; every
**     stream that joined a capture is joined back before it ends; a graph
**     launched is copied (launches in flight keep it when it is destroyed);
**   - kernels: one-dimensional grids and blocks of at most 1024 threads, and
**     every thread of a block meets each barrier (shim.h).
** FAKECUDA_GPUS (default 2) GPUs of FAKECUDA_SMS (default 2) multiprocessors,
** sm_90; FAKECUDA_CXX compiles the kernels (default c++).
*/
#define _GNU_SOURCE
#include <cuda.h>
#include <cublas_v2.h>
#include <nccl.h>
#include <nvrtc.h>
#include <cblas.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef FAKECUDA_SHIM
#error "build with -DFAKECUDA_SHIM='\"/path/to/shim.h\"'"
#endif

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fakecuda: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* ------------------------------------------------------------- allocations */

typedef struct Alloc { uintptr_t base; size_t size; bool host; } Alloc;
static Alloc *allocs;
static int nallocs, allocs_cap;

static void *track(size_t bytes, bool host)
{
    void *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) return NULL;
    memset(p, 0xff, bytes);   /* NaN: a GPU's fresh memory is not zeros */
    pthread_mutex_lock(&lock);
    if (nallocs == allocs_cap) allocs = realloc(allocs, sizeof *allocs * (size_t)(allocs_cap = allocs_cap ? 2 * allocs_cap : 64));
    allocs[nallocs++] = (Alloc){ (uintptr_t)p, bytes, host };
    pthread_mutex_unlock(&lock);
    return p;
}

static bool untrack(void *p, bool host)
{
    bool found = false;
    pthread_mutex_lock(&lock);
    for (int k = 0; k < nallocs; k++)
        if (allocs[k].base == (uintptr_t)p && allocs[k].host == host) {
            allocs[k] = allocs[--nallocs];
            found = true;
            break;
        }
    pthread_mutex_unlock(&lock);
    if (found) free(p);
    return found;
}

/* [p, p + bytes) inside one allocation of the kind asked for */
static bool inside(const void *p, size_t bytes, bool host)
{
    bool ok = false;
    pthread_mutex_lock(&lock);
    for (int k = 0; k < nallocs && !ok; k++)
        ok = allocs[k].host == host && (uintptr_t)p >= allocs[k].base && (uintptr_t)p + bytes <= allocs[k].base + allocs[k].size;
    pthread_mutex_unlock(&lock);
    return ok;
}

static bool check_dev(const void *p, size_t bytes, const char *what)
{
    if (inside(p, bytes, false)) return true;
    say("%s: %zu bytes at %p are not inside one device allocation", what, bytes, p);
    return false;
}

/* ------------------------------------------------------ work, now or later */

struct CUfunc_st { void (*launch)(const void *, unsigned, unsigned); unsigned long argsize; char name[128]; };

enum { W_KERNEL, W_COPY, W_SET, W_GEMM, W_ALLREDUCE };
typedef struct Work {
    int kind;
    CUfunction f;
    unsigned gx, bx;
    void *args;
    void *dst;
    const void *src;
    size_t bytes;
    unsigned char value;
    int host;                  /* W_COPY issued, not captured: 1 into pinned memory, 2 out of it (checked by hash) */
    uint64_t hash;
    struct { int ta, tb, m, n, k, lda, ldb, ldc; float alpha, beta; const void *a, *b; float *c; int bf16; } g;   /* bf16: BF16_* */
    struct { ncclComm_t comm; const float *send; float *recv; size_t count; int mode; } ar;   /* mode: 0 sum, 1 reduce-scatter, 2 all-gather */
} Work;

struct CUgraph_st { Work *w; int n, cap; };
struct CUgraphExec_st { Work *w; int n; };

typedef struct Capture {
    struct CUgraph_st *graph;
    CUstream origin;
    CUresult invalid;          /* a call that broke the capture */
    struct CUstream_st *joined[16];   /* other streams that joined it (waiting for an event recorded in it) */
    int njoined;
} Capture;

/* Each stream is a queue that a thread of its own works through, as a GPU
   works through a stream behind the host's back: the host goes on at once and
   sees the results only after a synchronisation (cuStreamSynchronize, or an
   event another stream waits for), so a missing one shows as wrong numbers.
   FAKECUDA_SYNC=1 does all work when it is issued instead. */
enum { I_WORK, I_RECORD, I_WAIT, I_GRAPH };
typedef struct Item {
    int kind;
    Work w;                    /* I_WORK */
    CUevent e;                 /* I_RECORD, I_WAIT: the event and the record it is, or waits for */
    unsigned long gen;
    Work *graph;               /* I_GRAPH: a copy of the graph's work, as it was when launched */
    int ngraph;
} Item;

struct CUstream_st {
    Capture *cap;
    CUevent last_record;
    CUcontext ctx;
    pthread_t thread;
    pthread_mutex_t m;
    pthread_cond_t cv;         /* an item queued, or the queue drained */
    Item *q;
    int head, n, size;         /* q[head .. n) to do */
    bool busy, stop;
};
/* recorded: the records issued (host side); done: those the stream has reached (under ev_lock) */
struct CUevent_st { Capture *cap; bool joined_back; unsigned long recorded, done; };
struct CUctx_st { int gpu; };
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;
static bool synchronous;       /* FAKECUDA_SYNC=1 */
static CUstream streams[256];  /* every live stream, for the calls that synchronise a context */
static __thread CUcontext current_ctx;
struct CUmod_st { void *h; };

static __thread Capture *thread_capture;   /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: this thread's */

static void allreduce(ncclComm_t comm, const float *send, float *recv, size_t count);
static void collective(ncclComm_t comm, const float *send, float *recv, size_t count, int mode);

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t v;
        memcpy(&v, b + k, 8);
        h = (h ^ v) * 1099511628211ull;
    }
    for (; k < n; k++) h = (h ^ b[k]) * 1099511628211ull;
    return h;
}


/* a float rounded to bfloat16 as the tensor cores' conversion does: to nearest, ties to even
   (a NaN kept a NaN); the result a float whose low 16 bits are zero */
static float bf16_rne(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
    else u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* A GEMM's types (Work.g.bf16): fp32 matrices in fp32; fp32 matrices under
   CUBLAS_COMPUTE_32F_FAST_16BF (A and B rounded to bf16 as they are read); CUDA_R_16BF
   matrices A and B (bf16 bits, two bytes a value) with fp32 sums. C is fp32 in each. */
enum { BF16_NONE, BF16_FAST, BF16_STORED };

/* the bytes of a value of A or B under those types */
static size_t ab_bytes(int bf16) { return bf16 == BF16_STORED ? 2 : sizeof(float); }

/* the value of bf16 bits (exact) */
static float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* BF16_FAST and BF16_STORED: A and B as bf16 values (rounded to nearest even, or read as
   stored), the products (exact in fp32) summed in fp32. Column-major; the columns each
   operand spans copied as floats, then sgemm. */
static void gemm_bf16(const struct Work *w)
{
    int ac = w->g.ta ? w->g.m : w->g.k, bc = w->g.tb ? w->g.k : w->g.n;
    size_t na = (size_t)ac * w->g.lda, nb = (size_t)bc * w->g.ldb;
    float *a = malloc(sizeof(float) * (na + nb + 1)), *b = a + na;
    if (!a) {
        fprintf(stderr, "fakecuda: out of memory in a bf16 GEMM\n");
        abort();
    }
    bool stored = w->g.bf16 == BF16_STORED;
    for (size_t i = 0; i < na; i++) a[i] = stored ? bf16_value(((const uint16_t *)w->g.a)[i]) : bf16_rne(((const float *)w->g.a)[i]);
    for (size_t i = 0; i < nb; i++) b[i] = stored ? bf16_value(((const uint16_t *)w->g.b)[i]) : bf16_rne(((const float *)w->g.b)[i]);
    cblas_sgemm(CblasColMajor, w->g.ta ? CblasTrans : CblasNoTrans, w->g.tb ? CblasTrans : CblasNoTrans, w->g.m, w->g.n,
                w->g.k, w->g.alpha, a, w->g.lda, b, w->g.ldb, w->g.beta, w->g.c, w->g.ldc);
    free(a);
}

static void run(const Work *w)
{
    switch (w->kind) {
    case W_KERNEL: w->f->launch(w->args, w->gx, w->bx); break;
    case W_COPY:
        if (w->host) usleep(2000);   /* late, as a GPU may be: a host that does not wait reads or writes too early */
        if (w->host == 2 && hash_bytes(w->src, w->bytes) != w->hash) {
            say("the host changed pinned memory at %p (%zu bytes) after queueing a copy out of it, before the copy ran: "
                "a missing synchronisation", w->src, w->bytes);
            abort();
        }
        memcpy(w->dst, w->src, w->bytes);
        break;
    case W_SET: memset(w->dst, w->value, w->bytes); break;
    case W_GEMM:
        if (w->g.bf16 != BF16_NONE) gemm_bf16(w);
        else
            cblas_sgemm(CblasColMajor, w->g.ta ? CblasTrans : CblasNoTrans, w->g.tb ? CblasTrans : CblasNoTrans, w->g.m, w->g.n,
                        w->g.k, w->g.alpha, (const float *)w->g.a, w->g.lda, (const float *)w->g.b, w->g.ldb, w->g.beta, w->g.c, w->g.ldc);
        break;
    case W_ALLREDUCE: collective(w->ar.comm, w->ar.send, w->ar.recv, w->ar.count, w->ar.mode); break;
    }
}

static void work_free(Work *w)
{
    if (w->kind == W_KERNEL) free(w->args);
}

/* a copy of n works, kernel arguments included (a graph instantiated, a launch in flight) */
static Work *works_copy(const Work *w, int n)
{
    Work *c = malloc(sizeof *c * (size_t)(n ? n : 1));
    for (int k = 0; k < n; k++) {
        c[k] = w[k];
        if (w[k].kind == W_KERNEL) {
            c[k].args = malloc(w[k].f->argsize);
            memcpy(c[k].args, w[k].args, w[k].f->argsize);
        }
    }
    return c;
}

static void works_free(Work *w, int n)
{
    for (int k = 0; k < n; k++) work_free(&w[k]);
    free(w);
}

static void wait_event(CUevent e, unsigned long gen)
{
    pthread_mutex_lock(&ev_lock);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += 120;
    while (e->done < gen)
        if (pthread_cond_timedwait(&ev_cv, &ev_lock, &t) == ETIMEDOUT) {
            say("a stream waited 120 s for an event that was never reached");
            abort();
        }
    pthread_mutex_unlock(&ev_lock);
}

static void do_item(Item *it)
{
    switch (it->kind) {
    case I_WORK: run(&it->w); work_free(&it->w); break;
    case I_RECORD:
        pthread_mutex_lock(&ev_lock);
        if (it->e->done < it->gen) it->e->done = it->gen;
        pthread_cond_broadcast(&ev_cv);
        pthread_mutex_unlock(&ev_lock);
        break;
    case I_WAIT: wait_event(it->e, it->gen); break;
    case I_GRAPH:
        for (int k = 0; k < it->ngraph; k++) run(&it->graph[k]);
        works_free(it->graph, it->ngraph);
        break;
    }
}

static void *stream_thread(void *arg)
{
    CUstream s = arg;
    pthread_mutex_lock(&s->m);
    for (;;) {
        while (s->head == s->n && !s->stop) pthread_cond_wait(&s->cv, &s->m);
        if (s->head == s->n) break;   /* stopped, and nothing left */
        Item it = s->q[s->head++];
        s->busy = true;
        pthread_mutex_unlock(&s->m);
        do_item(&it);
        pthread_mutex_lock(&s->m);
        s->busy = false;
        if (s->head == s->n) {
            s->head = s->n = 0;
            pthread_cond_broadcast(&s->cv);   /* drained */
        }
    }
    pthread_mutex_unlock(&s->m);
    return NULL;
}

/* the item, done by s's thread after what s has queued (now, for no stream or FAKECUDA_SYNC=1) */
static void enqueue(CUstream s, Item *it)
{
    if (!s || synchronous) {
        do_item(it);
        return;
    }
    pthread_mutex_lock(&s->m);
    if (s->n == s->size) s->q = realloc(s->q, sizeof *s->q * (size_t)(s->size = s->size ? 2 * s->size : 64));
    s->q[s->n++] = *it;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->m);
}

static void drain(CUstream s)
{
    if (!s || synchronous) return;
    pthread_mutex_lock(&s->m);
    while (s->head != s->n || s->busy) pthread_cond_wait(&s->cv, &s->m);
    pthread_mutex_unlock(&s->m);
}

/* every stream of this thread's context: what cuMemFree and its kind wait for */
static void drain_context(void)
{
    CUstream list[256];
    int n = 0;
    pthread_mutex_lock(&lock);
    for (int k = 0; k < 256; k++)
        if (streams[k] && streams[k]->ctx == current_ctx) list[n++] = streams[k];
    pthread_mutex_unlock(&lock);
    for (int k = 0; k < n; k++) drain(list[k]);
}

/* the work is queued on s, or kept in the graph s is capturing into */
static void submit(CUstream s, Work *w)
{
    if (s && s->cap) {
        struct CUgraph_st *g = s->cap->graph;
        if (g->n == g->cap) g->w = realloc(g->w, sizeof *g->w * (size_t)(g->cap = g->cap ? 2 * g->cap : 64));
        g->w[g->n++] = *w;
        s->last_record = NULL;
        return;
    }
    Item it = { .kind = I_WORK, .w = *w };
    enqueue(s, &it);
}

/* a call that may not happen while this thread captures: it breaks the capture */
static CUresult capture_forbids(const char *what)
{
    if (!thread_capture) return CUDA_SUCCESS;
    say("%s while this thread records a CUDA graph (not allowed in thread-local capture)", what);
    thread_capture->invalid = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* ------------------------------------------------------------------ driver */

CUresult cuGetErrorString(CUresult r, const char **s)
{
    switch ((int)r) {
    case CUDA_SUCCESS: *s = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_IMAGE: *s = "device kernel image is invalid"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *s = "operation not supported"; break;
    case CUDA_ERROR_ILLEGAL_STATE: *s = "the operation cannot be performed in the present state"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *s = "operation not permitted when stream is capturing"; break;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *s = "operation failed due to a previous error during capture"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED: *s = "capture was not joined to the origin stream"; break;
    case CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE: *s = "the graph update was not performed"; break;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *s = "too many resources requested for launch"; break;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuInit(unsigned flags) { return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }

CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n)
{
    *n = env_int("FAKECUDA_GPUS", 2);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    if (ordinal < 0 || ordinal >= env_int("FAKECUDA_GPUS", 2)) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    (void)d;
    snprintf(name, (size_t)len, "fakecuda (CPU emulation)");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    (void)d;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = env_int("FAKECUDA_SMS", 2); return CUDA_SUCCESS;
    default: say("cuDeviceGetAttribute: attribute %d is not emulated", (int)a); return CUDA_ERROR_NOT_SUPPORTED;
    }
}

static struct CUctx_st contexts[64];

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    if (d < 0 || d >= 64) return CUDA_ERROR_INVALID_DEVICE;
    contexts[d].gpu = d;
    *c = &contexts[d];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return d < 0 || d >= 64 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c)
{
    current_ctx = c;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *p, size_t bytes)
{
    CUresult r = capture_forbids("cuMemAlloc");
    if (r) return r;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    void *m = track(bytes, false);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p)
{
    CUresult r = capture_forbids("cuMemFree");
    if (r) return r;
    if (!p) return CUDA_SUCCESS;
    drain_context();   /* as the driver's: after the work that may use it */
    if (!untrack((void *)(uintptr_t)p, false)) {
        say("cuMemFree of %p: not a device allocation (freed twice?)", (void *)(uintptr_t)p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned flags)
{
    (void)flags;
    CUresult r = capture_forbids("cuMemHostAlloc");
    if (r) return r;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    return (*p = track(bytes, true)) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *p)
{
    drain_context();
    if (!untrack(p, true)) {
        say("cuMemFreeHost of %p: not from cuMemHostAlloc", p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    *free_bytes = (size_t)8 << 30;
    *total = (size_t)16 << 30;
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s)
{
    if (!check_dev((void *)(uintptr_t)p, n, "cuMemsetD8Async")) return CUDA_ERROR_INVALID_VALUE;
    Work w = { .kind = W_SET, .dst = (void *)(uintptr_t)p, .value = v, .bytes = n };
    submit(s, &w);
    return CUDA_SUCCESS;
}

/* host memory in a copy that is captured must be pinned: pageable memory cannot be */
static CUresult copy(CUstream s, void *dst, const void *src, size_t n, int host_side, const char *what)
{
    const void *dev_side[2] = { dst, src };
    for (int k = 0; k < 2; k++) {
        if (k == host_side) continue;
        if (!check_dev(dev_side[k], n, what)) return CUDA_ERROR_INVALID_VALUE;
    }
    if (host_side >= 0 && s && s->cap && !inside(dev_side[host_side], n, true)) {
        say("%s of pageable host memory while the stream records a CUDA graph", what);
        s->cap->invalid = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if ((const char *)dst < (const char *)src + n && (const char *)src < (const char *)dst + n && dst != src) {
        say("%s: the %zu bytes copied overlap", what, n);
        return CUDA_ERROR_INVALID_VALUE;
    }
    Work w = { .kind = W_COPY, .dst = dst, .src = src, .bytes = n };
    bool queued = s && !s->cap && !synchronous;
    if (host_side >= 0 && !(s && s->cap) && !inside(dev_side[host_side], n, true)) {
        drain(s);   /* pageable memory: the driver copies it before the call returns */
        run(&w);
        return CUDA_SUCCESS;
    }
    if (queued && host_side == 0) {   /* what the host reads before the copy has run: NaN */
        memset(dst, 0xff, n);
        w.host = 1;
    } else if (queued && host_side == 1) {   /* the host must leave it alone until the copy has run */
        w.hash = hash_bytes(src, n);
        w.host = 2;
    }
    submit(s, &w);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return copy(s, (void *)(uintptr_t)dst, src, n, 1, "cuMemcpyHtoDAsync");
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy(s, dst, (const void *)(uintptr_t)src, n, 0, "cuMemcpyDtoHAsync");
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy(s, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, -1, "cuMemcpyDtoDAsync");
}

static void read_env(void)
{
    const char *v = getenv("FAKECUDA_SYNC");
    synchronous = v && !strcmp(v, "1");
}

CUresult cuStreamCreate(CUstream *s, unsigned flags)
{
    (void)flags;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_env);
    CUstream x = calloc(1, sizeof *x);
    x->ctx = current_ctx;
    pthread_mutex_init(&x->m, NULL);
    pthread_cond_init(&x->cv, NULL);
    pthread_mutex_lock(&lock);
    int slot = -1;
    for (int k = 0; k < 256 && slot < 0; k++)
        if (!streams[k]) slot = k;
    if (slot >= 0) streams[slot] = x;
    pthread_mutex_unlock(&lock);
    if (slot < 0 || pthread_create(&x->thread, NULL, stream_thread, x)) {
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *s = x;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream s)
{
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    if (s->cap) {
        say("cuStreamDestroy of a stream that records a CUDA graph");
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    pthread_mutex_lock(&s->m);   /* its work is finished first, as the driver's */
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->m);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&lock);
    for (int k = 0; k < 256; k++)
        if (streams[k] == s) streams[k] = NULL;
    pthread_mutex_unlock(&lock);
    free(s->q);
    free(s);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s)
{
    if (s && s->cap) {
        say("cuStreamSynchronize of a stream that records a CUDA graph");
        s->cap->invalid = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    drain(s);
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned flags)
{
    (void)flags;
    *e = calloc(1, sizeof **e);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent e)
{
    drain_context();   /* no stream still to reach one of its records */
    free(e);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s)
{
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    e->cap = s ? s->cap : NULL;
    e->joined_back = false;
    if (s && s->cap) {
        s->last_record = e;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&ev_lock);
    Item it = { .kind = I_RECORD, .e = e, .gen = ++e->recorded };
    pthread_mutex_unlock(&ev_lock);
    enqueue(s, &it);
    return CUDA_SUCCESS;
}

/* s goes on once the event's latest record (when this is called) is reached;
   in a capture, a stream that waits for an event recorded in it joins it */
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags)
{
    (void)flags;
    if (!s || !e) return CUDA_ERROR_INVALID_VALUE;
    if (!(e->cap && e->cap->graph)) {
        if (s->cap) {
            say("cuStreamWaitEvent: a capturing stream waits for an event recorded outside the capture");
            return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        }
        pthread_mutex_lock(&ev_lock);
        Item it = { .kind = I_WAIT, .e = e, .gen = e->recorded };
        pthread_mutex_unlock(&ev_lock);
        if (it.gen) enqueue(s, &it);
        return CUDA_SUCCESS;
    }
    if (s == e->cap->origin) e->joined_back = true;
    else if (!s->cap) {
        if (e->cap->njoined == 16) return CUDA_ERROR_NOT_SUPPORTED;
        s->cap = e->cap;
        e->cap->joined[e->cap->njoined++] = s;
    } else if (s->cap != e->cap) {
        say("cuStreamWaitEvent joins two captures");
        return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    return CUDA_SUCCESS;
}

/* an ELF shared object for this machine, as the fake NVRTC makes them */
CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    const Elf64_Ehdr *eh = image;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_machine != EM_X86_64 || eh->e_type != ET_DYN) {
        say("cuModuleLoadData: the image is not one the fake NVRTC made (a real cubin or PTX?)");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    size_t size = (size_t)eh->e_shoff + (size_t)eh->e_shnum * eh->e_shentsize;
    char path[] = "/tmp/fakecuda-module-XXXXXX";
    int fd = mkstemp(path);   /* a file of its own: two devices loading one image get two copies */
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    bool ok = write(fd, image, size) == (ssize_t)size;
    close(fd);
    void *h = ok ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h) say("cuModuleLoadData: %s", ok ? dlerror() : strerror(errno));
    unlink(path);
    if (!h) return CUDA_ERROR_INVALID_IMAGE;
    *m = calloc(1, sizeof **m);
    (*m)->h = h;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    char sym[200];
    snprintf(sym, sizeof sym, "%s__fake_launch", name);
    void *launch = dlsym(m->h, sym);
    snprintf(sym, sizeof sym, "%s__fake_argsize", name);
    const unsigned long *argsize = dlsym(m->h, sym);
    if (!launch || !argsize) return CUDA_ERROR_NOT_FOUND;
    *f = calloc(1, sizeof **f);
    (*f)->launch = (void (*)(const void *, unsigned, unsigned))launch;
    (*f)->argsize = *argsize;
    snprintf((*f)->name, sizeof (*f)->name, "%s", name);
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m)
{
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    drain_context();
    dlclose(m->h);
    free(m);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream s, void **params, void **extra)
{
    if (!f || !params || extra) return CUDA_ERROR_INVALID_VALUE;
    if (gy != 1 || gz != 1 || by != 1 || bz != 1 || shared) {
        say("kernel %s: only one-dimensional launches without dynamic shared memory are emulated", f->name);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (bx == 0 || bx > 1024 || gx == 0 || gx > 0x7fffffffu) {
        say("kernel %s: a grid of %u blocks of %u threads cannot be launched", f->name, gx, bx);
        return bx > 1024 ? CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES : CUDA_ERROR_INVALID_VALUE;
    }
    Work w = { .kind = W_KERNEL, .f = f, .gx = gx, .bx = bx, .args = malloc(f->argsize) };
    memcpy(w.args, params[0], f->argsize);
    submit(s, &w);
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode)
{
    if (!s || s->cap) return CUDA_ERROR_ILLEGAL_STATE;
    if (mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) {
        say("cuStreamBeginCapture: only thread-local capture is emulated");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    Capture *c = calloc(1, sizeof *c);
    c->graph = calloc(1, sizeof *c->graph);
    c->origin = s;
    s->cap = c;
    thread_capture = c;
    return CUDA_SUCCESS;
}

static void graph_free(struct CUgraph_st *g)
{
    if (g) works_free(g->w, g->n);
    free(g);
}

CUresult cuStreamEndCapture(CUstream s, CUgraph *graph)
{
    *graph = NULL;
    if (!s || !s->cap || s->cap->origin != s) return CUDA_ERROR_ILLEGAL_STATE;
    Capture *c = s->cap;
    CUresult r = c->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
    /* every stream that joined must be joined back: its last work followed by an
       event that the origin stream waited for */
    for (int k = 0; k < c->njoined; k++) {
        struct CUstream_st *x = c->joined[k];
        if (!r && !(x->last_record && x->last_record->joined_back)) {
            say("cuStreamEndCapture: a stream that joined the capture was not joined back to the origin stream");
            r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
        }
        x->cap = NULL;
    }
    s->cap = NULL;
    thread_capture = NULL;
    if (r) graph_free(c->graph);
    else *graph = c->graph;
    c->graph = NULL;   /* events recorded in it no longer join anything; the Capture stays for them */
    return r;
}

CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    if (!g || flags) return CUDA_ERROR_INVALID_VALUE;
    *e = calloc(1, sizeof **e);
    (*e)->n = g->n;
    (*e)->w = works_copy(g->w, g->n);
    return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    if (s && s->cap) {
        say("cuGraphLaunch into a capturing stream is not emulated");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    /* a copy: an update or a destruction of the graph does not touch a launch in flight */
    Item it = { .kind = I_GRAPH, .graph = works_copy(e->w, e->n), .ngraph = e->n };
    enqueue(s, &it);
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph g)
{
    graph_free(g);
    return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec e)
{
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    works_free(e->w, e->n);
    free(e);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ cuBLAS */

struct cublasContext { CUstream s; };

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = calloc(1, sizeof **h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->s = (CUstream)s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    (void)h;
    return mode == CUBLAS_DEFAULT_MATH || mode == CUBLAS_TF32_TENSOR_OP_MATH ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    (void)h;
    return !bytes || check_dev(ws, bytes, "cublasSetWorkspace") ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

/* column-major, as cuBLAS: op(A) is m x k, op(B) k x n, C m x n; bf16: the types (BF16_*) */
static cublasStatus_t gemm_queue(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float *alpha,
                                 const void *a, int lda, const void *b, int ldb, const float *beta, float *c, int ldc, int bf16)
{
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1) ||
        (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T)) {
        say("cublasSgemm: invalid arguments: m %d n %d k %d, lda %d ldb %d ldc %d", m, n, k, lda, ldb, ldc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!m || !n) return CUBLAS_STATUS_SUCCESS;
    size_t sa = ((size_t)(ac - 1) * lda + ar) * ab_bytes(bf16), sb = ((size_t)(bc - 1) * ldb + br) * ab_bytes(bf16);
    size_t sc = ((size_t)(n - 1) * ldc + m) * sizeof(float);
    if ((k && (!check_dev(a, sa, "cublasSgemm's A") || !check_dev(b, sb, "cublasSgemm's B"))) || !check_dev(c, sc, "cublasSgemm's C"))
        return CUBLAS_STATUS_INVALID_VALUE;
    Work w = { .kind = W_GEMM };
    w.g.ta = ta == CUBLAS_OP_T, w.g.tb = tb == CUBLAS_OP_T;
    w.g.m = m, w.g.n = n, w.g.k = k, w.g.lda = lda, w.g.ldb = ldb, w.g.ldc = ldc;
    w.g.alpha = *alpha, w.g.beta = *beta, w.g.a = a, w.g.b = b, w.g.c = c, w.g.bf16 = bf16;
    submit(h->s, &w);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float *alpha,
                           const float *a, int lda, const float *b, int ldb, const float *beta, float *c, int ldc)
{
    return gemm_queue(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, BF16_NONE);
}

/* What mgc calls: fp32 matrices computed in fp32 or in bf16 (CUBLAS_COMPUTE_32F_FAST_16BF),
   or bf16 A and B (CUDA_R_16BF) with an fp32 C and CUBLAS_COMPUTE_32F. BF16_*, or -1. */
static int ex_types(const char *fn, cudaDataType at, cudaDataType bt, cudaDataType ct, cublasComputeType_t compute)
{
    if (at == CUDA_R_32F && bt == CUDA_R_32F && ct == CUDA_R_32F && compute == CUBLAS_COMPUTE_32F) return BF16_NONE;
    if (at == CUDA_R_32F && bt == CUDA_R_32F && ct == CUDA_R_32F && compute == CUBLAS_COMPUTE_32F_FAST_16BF) return BF16_FAST;
    if (at == CUDA_R_16BF && bt == CUDA_R_16BF && ct == CUDA_R_32F && compute == CUBLAS_COMPUTE_32F) return BF16_STORED;
    say("%s: the fake takes fp32 matrices with CUBLAS_COMPUTE_32F or _32F_FAST_16BF, or bf16 A and B with an fp32 C and "
        "CUBLAS_COMPUTE_32F, only (types %d %d %d, compute %d)", fn, (int)at, (int)bt, (int)ct, (int)compute);
    return -1;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
                            const void *a, cudaDataType at, int lda, const void *b, cudaDataType bt, int ldb, const void *beta, void *c,
                            cudaDataType ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    (void)algo;
    int bf16 = ex_types("cublasGemmEx", at, bt, ct, compute);
    if (bf16 < 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm_queue(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bf16);
}

/* batch GEMMs, the i-th on a + i * sa, b + i * sb, c + i * sc (strides in values of each one's type);
   each checked and queued as cublasSgemm's (the strides checked to keep the products apart: C's may
   not overlap) */
static cublasStatus_t batched(const char *fn, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const void *a, int lda, long long sa, const void *b, int ldb, long long sb,
                              const float *beta, float *c, int ldc, long long sc, int batch, int bf16)
{
    if (batch < 0 || sa < 0 || sb < 0 || (batch > 1 && sc < (long long)(n - 1) * ldc + m)) {
        say("%s: invalid arguments: batch %d, strides %lld %lld %lld (C is %d x %d, ldc %d)", fn, batch, sa, sb, sc, m, n, ldc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (int i = 0; i < batch; i++) {
        long long es = (long long)ab_bytes(bf16);
        cublasStatus_t st = gemm_queue(h, ta, tb, m, n, k, alpha, (const char *)a + i * sa * es, lda, (const char *)b + i * sb * es, ldb,
                                       beta, c + i * sc, ldc, bf16);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *a, int lda, long long sa, const float *b, int ldb,
                                         long long sb, const float *beta, float *c, int ldc, long long sc, int batch)
{
    return batched("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch, BF16_NONE);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *a, cudaDataType at, int lda, long long sa, const void *b,
                                          cudaDataType bt, int ldb, long long sb, const void *beta, void *c, cudaDataType ct, int ldc,
                                          long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    (void)algo;
    int bf16 = ex_types("cublasGemmStridedBatchedEx", at, bt, ct, compute);
    if (bf16 < 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    return batched("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch, bf16);
}

/* -------------------------------------------------------------------- NCCL */

/* The ranks of one communicator, in this process or in others on this
   machine (mpirun): a shared-memory segment named after the unique id. Each
   call leaves its part of the data there, a round of CHUNK floats at a time,
   waits for the others, and sums every rank's part in rank order (the same
   bits everywhere). */
enum { CHUNK = 1 << 20, MAX_RANKS = 64 };
typedef struct Clique {
    pthread_mutex_t m;         /* process-shared, like cv */
    pthread_cond_t cv;
    int n, arrived, refs, ready;
    unsigned long generation;
    size_t count[MAX_RANKS];
    float data[];              /* n x CHUNK */
} Clique;

struct ncclComm { Clique *q; int rank; size_t size; char name[64]; };

static void clique_wait(Clique *q, int rank)
{
    pthread_mutex_lock(&q->m);
    unsigned long gen = q->generation;
    if (++q->arrived == q->n) {
        q->arrived = 0;
        q->generation++;
        pthread_cond_broadcast(&q->cv);
    } else {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_sec += 120;
        while (q->generation == gen)
            if (pthread_cond_timedwait(&q->cv, &q->m, &t) == ETIMEDOUT) {
                say("NCCL rank %d of %d waited 120 s for the others: not every rank called ncclAllReduce", rank, q->n);
                abort();
            }
    }
    pthread_mutex_unlock(&q->m);
}

static void allreduce(ncclComm_t comm, const float *send, float *recv, size_t count)
{
    Clique *q = comm->q;
    int me = comm->rank;
    for (size_t off = 0; off < count; off += CHUNK) {
        size_t len = count - off < CHUNK ? count - off : CHUNK;
        memcpy(q->data + (size_t)me * CHUNK, send + off, len * sizeof(float));
        q->count[me] = count;
        clique_wait(q, me);
        for (int r = 0; r < q->n; r++)
            if (q->count[r] != count) {
                say("ncclAllReduce: rank %d sums %zu values, rank %d %zu", me, count, r, q->count[r]);
                abort();
            }
        for (size_t i = 0; i < len; i++) {   /* send is in the segment: recv may be send */
            float s = 0;
            for (int r = 0; r < q->n; r++) s += q->data[(size_t)r * CHUNK + i];
            recv[off + i] = s;
        }
        clique_wait(q, me);   /* every rank has read the round before the next is written */
    }
}

/* The halves as sums: a reduce-scatter sums every rank's count x ranks values and keeps the rank's
   count of them; an all-gather sums zeros but for each rank's own count (x + 0 is x: the same bits). */
static void collective(ncclComm_t comm, const float *send, float *recv, size_t count, int mode)
{
    if (mode == 0) {
        allreduce(comm, send, recv, count);
        return;
    }
    size_t all = count * (size_t)comm->q->n;
    float *tmp = calloc(all ? all : 1, sizeof(float));
    if (!tmp) {
        say("NCCL emulation: out of memory for %zu floats", all);
        abort();
    }
    if (mode == 1) {
        allreduce(comm, send, tmp, all);
        memcpy(recv, tmp + (size_t)comm->rank * count, count * sizeof(float));
    } else {
        memcpy(tmp + (size_t)comm->rank * count, send, count * sizeof(float));
        allreduce(comm, tmp, tmp, all);
        memcpy(recv, tmp, all * sizeof(float));
    }
    free(tmp);
}

const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclSuccess ? "no error" : r == ncclInvalidArgument ? "invalid argument" : r == ncclInvalidUsage ? "invalid usage"
         : "unhandled error";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static unsigned long counter;
    memset(id, 0, sizeof *id);
    unsigned long v[3] = { __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED), (unsigned long)getpid(), (unsigned long)time(NULL) };
    memcpy(id->internal, v, sizeof v);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int n, ncclUniqueId id, int rank)
{
    if (n < 1 || n > MAX_RANKS || rank < 0 || rank >= n) return ncclInvalidArgument;
    unsigned long v[3];
    memcpy(v, id.internal, sizeof v);
    struct ncclComm *c = calloc(1, sizeof *c);
    snprintf(c->name, sizeof c->name, "/fakecuda-nccl-%lx-%lx-%lx", v[0], v[1], v[2]);
    c->rank = rank;
    c->size = sizeof(Clique) + (size_t)n * CHUNK * sizeof(float);
    int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    bool creator = fd >= 0;
    if (!creator) fd = shm_open(c->name, O_RDWR, 0600);
    Clique *q = MAP_FAILED;
    if (fd >= 0 && (!creator || ftruncate(fd, (off_t)c->size) == 0)) {
        for (int tries = 0; tries < 60000; tries++) {   /* the creator may not have sized it yet */
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= c->size) break;
            usleep(1000);
        }
        q = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (fd >= 0) close(fd);
    if (q == MAP_FAILED) {
        say("ncclCommInitRank: the shared segment %s: %s", c->name, strerror(errno));
        free(c);
        return ncclSystemError;
    }
    if (creator) {
        pthread_mutexattr_t ma;
        pthread_condattr_t ca;
        pthread_mutexattr_init(&ma);
        pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
        pthread_condattr_init(&ca);
        pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
        pthread_mutex_init(&q->m, &ma);
        pthread_cond_init(&q->cv, &ca);
        q->n = n;
        __atomic_store_n(&q->ready, 1, __ATOMIC_RELEASE);
    }
    for (int tries = 0; !__atomic_load_n(&q->ready, __ATOMIC_ACQUIRE); tries++) {
        if (tries == 60000) {
            say("ncclCommInitRank: %s was never initialised", c->name);
            abort();
        }
        usleep(1000);
    }
    if (q->n != n) {
        munmap(q, c->size);
        free(c);
        return ncclInvalidUsage;
    }
    pthread_mutex_lock(&q->m);
    q->refs++;
    pthread_mutex_unlock(&q->m);
    c->q = q;
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream)
{
    if (type != ncclFloat || op != ncclSum || !comm) {
        say("ncclReduceScatter: only float sums are emulated");
        return ncclInvalidArgument;
    }
    if (!check_dev(send, count * (size_t)comm->q->n * 4, "ncclReduceScatter's send buffer") ||
        !check_dev(recv, count * 4, "ncclReduceScatter's receive buffer"))
        return ncclInvalidArgument;
    Work w = { .kind = W_ALLREDUCE };
    w.ar.comm = comm, w.ar.send = send, w.ar.recv = recv, w.ar.count = count, w.ar.mode = 1;
    submit((CUstream)stream, &w);
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream)
{
    if (type != ncclFloat || !comm) {
        say("ncclAllGather: only floats are emulated");
        return ncclInvalidArgument;
    }
    if (!check_dev(send, count * 4, "ncclAllGather's send buffer") || !check_dev(recv, count * (size_t)comm->q->n * 4, "ncclAllGather's receive buffer"))
        return ncclInvalidArgument;
    Work w = { .kind = W_ALLREDUCE };
    w.ar.comm = comm, w.ar.send = send, w.ar.recv = recv, w.ar.count = count, w.ar.mode = 2;
    submit((CUstream)stream, &w);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    if (type != ncclFloat || op != ncclSum || !comm) {
        say("ncclAllReduce: only float sums are emulated");
        return ncclInvalidArgument;
    }
    if (!check_dev(send, count * 4, "ncclAllReduce's send buffer") || !check_dev(recv, count * 4, "ncclAllReduce's receive buffer"))
        return ncclInvalidArgument;
    Work w = { .kind = W_ALLREDUCE };
    w.ar.comm = comm, w.ar.send = send, w.ar.recv = recv, w.ar.count = count;
    submit((CUstream)stream, &w);
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm) return ncclInvalidArgument;
    Clique *q = comm->q;
    pthread_mutex_lock(&q->m);
    bool last = --q->refs == 0;
    pthread_mutex_unlock(&q->m);
    munmap(q, comm->size);
    if (last) shm_unlink(comm->name);
    free(comm);
    return ncclSuccess;
}

/* ------------------------------------------------------------------- NVRTC */

struct _nvrtcProgram { char *source, *log, *image; size_t image_size; };

const char *nvrtcGetErrorString(nvrtcResult r)
{
    return r == NVRTC_SUCCESS ? "NVRTC_SUCCESS" : r == NVRTC_ERROR_COMPILATION ? "NVRTC_ERROR_COMPILATION"
         : r == NVRTC_ERROR_INVALID_OPTION ? "NVRTC_ERROR_INVALID_OPTION" : "NVRTC_ERROR (fakecuda)";
}

nvrtcResult nvrtcVersion(int *major, int *minor)
{
    *major = 99;   /* not a real NVRTC's: its images are not cubins, and the kernel cache keeps them apart */
    *minor = 0;
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetNumSupportedArchs(int *n)
{
    *n = 1;
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetSupportedArchs(int *archs)
{
    archs[0] = 90;
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *p, const char *src, const char *name, int nh, const char *const *h,
                               const char *const *hn)
{
    (void)name; (void)h; (void)hn;
    if (!src || nh) return NVRTC_ERROR_INVALID_INPUT;
    *p = calloc(1, sizeof **p);
    (*p)->source = strdup(src);
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *p)
{
    if (!p || !*p) return NVRTC_ERROR_INVALID_PROGRAM;
    free((*p)->source);
    free((*p)->log);
    free((*p)->image);
    free(*p);
    *p = NULL;
    return NVRTC_SUCCESS;
}

static bool has(const char *begin, const char *end, const char *what)
{
    size_t n = strlen(what);
    for (const char *s = begin; s + n <= end; s++)
        if (!memcmp(s, what, n)) return true;
    return false;
}

/* the kernels of src, named where a line (not a #define) says KERNEL(NAME) or
   __global__ void NAME(: a launcher for each (shim.h), told whether its text
   up to the next kernel synchronises */
static char *launchers(const char *src)
{
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    out[0] = 0;
    const char *names[4096], *ends[4096];
    size_t lens[4096];
    int n = 0;
    for (const char *line = src; *line && n < 4096; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line)) {
        const char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (*s == '#') continue;
        const char *eol = strchr(s, '\n');
        if (!eol) eol = s + strlen(s);
        const char *at = NULL, *name = NULL;
        for (const char *p = s; p < eol && !at; p++) {
            if (!strncmp(p, "KERNEL(", 7)) at = p, name = p + 7;
            else if (!strncmp(p, "__global__ void ", 16)) at = p, name = p + 16;
        }
        if (!at) continue;
        size_t k = strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        if (!k) continue;
        if (n) ends[n - 1] = at;
        names[n] = name, lens[n] = k, ends[n] = src + strlen(src);
        n++;
    }
    for (int k = 0; k < n; k++) {
        bool sync = has(names[k], ends[k], "__syncthreads") || has(names[k], ends[k], "BLOCK_SUM") ||
                    has(names[k], ends[k], "__shfl") || has(names[k], ends[k], "mgc_block_sum") ||
                    has(names[k], ends[k], "BLOCK_LAST");
        if (len + lens[k] + 64 > cap) out = realloc(out, cap = 2 * cap + lens[k] + 64);
        len += (size_t)sprintf(out + len, "FAKECUDA_KERNEL(%.*s, %s)\n", (int)lens[k], names[k], sync ? "true" : "false");
    }
    return out;
}

static char *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)(n > 0 ? n : 0) + 1);
    size_t got = fread(b, 1, (size_t)(n > 0 ? n : 0), f);
    fclose(f);
    b[got] = 0;
    if (size) *size = got;
    return b;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int nopts, const char *const *opts)
{
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    for (int k = 0; k < nopts; k++) {   /* mgc's options; another is an error, as NVRTC's unknown ones are */
        const char *o = opts[k];
        if (strcmp(o, "--std=c++17") && strcmp(o, "-default-device") && strcmp(o, "--split-compile=0") &&
            strcmp(o, "--gpu-architecture=sm_90") && strcmp(o, "--gpu-architecture=compute_90")) {
            free(p->log);
            size_t n = strlen(o) + 64;
            p->log = malloc(n);
            snprintf(p->log, n, "fakecuda NVRTC: unknown option '%s'\n", o);
            return NVRTC_ERROR_INVALID_OPTION;
        }
    }
    char dir[] = "/tmp/fakecuda-nvrtc-XXXXXX";
    if (!mkdtemp(dir)) return NVRTC_ERROR_OUT_OF_MEMORY;
    char src[64], so[64], log[64], cmd[600];
    snprintf(src, sizeof src, "%s/k.cpp", dir);
    snprintf(so, sizeof so, "%s/k.so", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    FILE *f = fopen(src, "w");
    char *tail = launchers(p->source);
    if (f) {
        fputs(p->source, f);
        fputs("\n/* fakecuda: a launcher for each kernel */\n", f);
        fputs(tail, f);
        fclose(f);
    }
    free(tail);
    const char *cxx = getenv("FAKECUDA_CXX");
    /* -fno-gnu-unique, hidden: a static in an inline function (mgc_block_sum's
       __shared__ scratch) would otherwise be one object across every loaded
       copy of a module, shared by devices that run at once */
    snprintf(cmd, sizeof cmd, "%s -std=c++17 -O1 -fPIC -shared -w -fno-gnu-unique -fvisibility=hidden -include '%s' -x c++ %s "
             "-o %s > %s 2>&1",
             cxx && *cxx ? cxx : "c++", FAKECUDA_SHIM, src, so, log);
    int rc = system(cmd);
    free(p->log);
    p->log = slurp(log, NULL);
    free(p->image);
    p->image = rc == 0 ? slurp(so, &p->image_size) : NULL;
    unlink(src); unlink(so); unlink(log); rmdir(dir);
    return p->image ? NVRTC_SUCCESS : NVRTC_ERROR_COMPILATION;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n)
{
    *n = p->log ? strlen(p->log) + 1 : 1;
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram p, char *log)
{
    strcpy(log, p->log ? p->log : "");
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t *n)
{
    if (!p->image) return NVRTC_ERROR_INVALID_PROGRAM;
    *n = p->image_size;
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram p, char *out)
{
    if (!p->image) return NVRTC_ERROR_INVALID_PROGRAM;
    memcpy(out, p->image, p->image_size);
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetPTXSize(nvrtcProgram p, size_t *n)
{
    (void)p; (void)n;
    return NVRTC_ERROR_INVALID_INPUT;   /* sm_90 is listed: mgc asks for cubins only */
}

nvrtcResult nvrtcGetPTX(nvrtcProgram p, char *out)
{
    (void)p; (void)out;
    return NVRTC_ERROR_INVALID_INPUT;
}
