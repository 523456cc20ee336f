/*
** The CPU device: host memory, kernels compiled by the system C compiler
** (runtime/cc.c), run on a thread pool of its own; GEMMs through CBLAS
** (OpenBLAS, single-threaded: the pool splits them), collectives through the
** in-process ring and MPI of runtime/comm.c.
**
** A kernel runs on every thread of the pool: each calls it with its own
** a.thread, and FOR_EACH gives each its contiguous share. Small jobs run on
** the calling thread alone. One pool owns a device's cores: BLAS's own
** threads would fight it for them.
*/
#include "runtime.h"
#include "comm.h"
#include "pool.h"
#include "memlimit.h"
#include "bgemm.h"
#include <cblas.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

typedef void (*KernelCall)(KArgs);

typedef struct KernelJob { KernelCall fn; KArgs a; } KernelJob;

static void kernel_job(void *ctx, int thread, int nthreads)
{
    KernelJob *k = ctx;
    KArgs a = k->a;
    a.thread = thread;
    a.nthreads = nthreads;
    k->fn(a);
}

/* Row-major C[M,N] = alpha op(A) op(B) + beta C, split over threads by
   rows of C (when M is the larger) or by columns. */
typedef GemmArgs GemmJob;

static void gemm_job(void *ctx, int thread, int nthreads)
{
    GemmJob *g = ctx;
    const float *a = g->a, *b = g->b;
    float *c = g->c;
    int m = g->m, n = g->n;
    if (g->m >= g->n) {
        int m0 = (int)((long)g->m * thread / nthreads), m1 = (int)((long)g->m * (thread + 1) / nthreads);
        m = m1 - m0;
        a += g->ta ? m0 : (long)m0 * g->lda;
        c += (long)m0 * g->ldc;
    } else {
        int n0 = (int)((long)g->n * thread / nthreads), n1 = (int)((long)g->n * (thread + 1) / nthreads);
        n = n1 - n0;
        b += g->tb ? (long)n0 * g->ldb : n0;
        c += n0;
    }
    if (m <= 0 || n <= 0) return;
    if (g->bf16)   /* --precision bf16 */
        mgc_sbgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                   m, n, g->k, g->alpha, a, g->lda, b, g->ldb, g->beta, c, g->ldc);
    else
        cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                    m, n, g->k, g->alpha, a, g->lda, b, g->ldb, g->beta, c, g->ldc);
}

/* calloc, aligned by hand (the block's start kept just before the aligned
   pointer): large blocks come zeroed from the kernel, with no pass over them
   here (a memset of ResNet-18's 346 MB of activations cost about 0.1 s of
   start-up and faulted every page in twice). */
static void *cpu_alloc(Device *d, size_t bytes)
{
    (void)d;
    char *raw = calloc(1, bytes + 64 + sizeof(void *));
    if (!raw) return NULL;
    uintptr_t at = ((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63;
    ((void **)at)[-1] = raw;
    return (void *)at;
}

static void cpu_release(Device *d, void *mem)
{
    (void)d;
    if (mem) free(((void **)mem)[-1]);
}

static void *cpu_alloc_host(Device *d, size_t bytes) { return cpu_alloc(d, bytes); }

static size_t cpu_memory_free(Device *d)
{
    (void)d;
    return rt_memory_available();
}

static void cpu_copy(Device *d, void *dst, const void *src, size_t bytes)
{
    (void)d;
    if (dst != src) memcpy(dst, src, bytes);
}

char *openblas_get_corename(void);
char *openblas_get_config(void);

/* OpenBLAS's kernels at least as new as this CPU can run: "SkylakeX" with
   AVX-512 (F, BW, DQ, VL), "Haswell" with AVX2 and FMA, else NULL. */
static const char *cpu_blas_core(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return NULL;
}

/* Whether this CPU runs OpenBLAS's `core` kernels: AVX-512 ones need what
   cpu_blas_core() calls SkylakeX, AVX2 ones at least Haswell; the rest any x86-64. */
static bool blas_core_runs(const char *core, const char *want)
{
    static const char *const avx512[] = { "skylakex", "cooperlake", "sapphirerapids" };
    static const char *const avx2[] = { "haswell", "zen" };
    for (int k = 0; k < 3; k++)
        if (!strcasecmp(core, avx512[k])) return want && !strcmp(want, "SkylakeX");
    for (int k = 0; k < 2; k++)
        if (!strcasecmp(core, avx2[k])) return want != NULL;
    return true;
}

/* OpenBLAS's `core` (openblas_get_corename()) is as good as `want`. */
static bool blas_core_enough(const char *core, const char *want)
{
    static const char *const cores[] = { "skylakex", "cooperlake", "sapphirerapids",   /* AVX-512 */
                                         "haswell", "zen" };                           /* AVX2 */
    int n = strcmp(want, "SkylakeX") ? 5 : 3;
    for (int k = 0; k < n; k++)
        if (!strcasecmp(core, cores[k])) return true;
    return false;
}

void rt_cpu_blas_describe(char *buf, size_t size)
{
    const char *config = openblas_get_config(), *core = openblas_get_corename(), *want = cpu_blas_core();
    const char *set = getenv("OPENBLAS_CORETYPE");
    const char *version = config && !strncmp(config, "OpenBLAS ", 9) ? config + 9 : "(version unknown)";
    int vlen = (int)strcspn(version, " ");
    if (!core) core = "unknown";
    if (set && strcasecmp(set, core))
        snprintf(buf, size, "%.*s, %s kernels (OPENBLAS_CORETYPE=%s, which it does not take: mgc stops on it)", vlen,
                 version, core, set);
    else if (set) snprintf(buf, size, "%.*s, %s kernels (OPENBLAS_CORETYPE=%s)", vlen, version, core, set);
    else if (want && !blas_core_enough(core, want))
        snprintf(buf, size, "%.*s, %s kernels, older than this CPU runs: mgc trains with OPENBLAS_CORETYPE=%s", vlen, version,
                 core, want);
    else snprintf(buf, size, "%.*s, %s kernels", vlen, version, core);
}

int rt_cpu_blas_core(char **argv, bool verbose)
{
    const char *core = openblas_get_corename(), *want = cpu_blas_core(), *set = getenv("OPENBLAS_CORETYPE");
    if (!core) return 0;
    if (set && *set && strcasecmp(set, core)) {   /* a name it does not know, or kernels it has not for this CPU */
        fprintf(stderr, "mgc: OPENBLAS_CORETYPE=%s: OpenBLAS does not take it and runs its %s kernels instead (a name it "
                "does not know, or kernels it has no build of); unset it (OpenBLAS chooses, and mgc corrects a choice "
                "older than the CPU), or name kernels OpenBLAS has, e.g. OPENBLAS_CORETYPE=%s\n", set, core,
                want ? want : "Haswell");
        return -1;
    }
    if (set && *set && !blas_core_runs(core, want)) {   /* it took the name, but its kernels would stop on an illegal instruction */
        fprintf(stderr, "mgc: OPENBLAS_CORETYPE=%s names OpenBLAS kernels for instructions this CPU lacks (%s): unset it "
                "(mgc chooses kernels this CPU runs), or name such kernels, e.g. OPENBLAS_CORETYPE=%s\n", set,
                strcasecmp(set, "Haswell") && strcasecmp(set, "Zen") ? "AVX-512" : "AVX2", want ? want : "Prescott");
        return -1;
    }
    if (!set && want && !blas_core_enough(core, want)) {
        if (verbose)
            fprintf(stderr, "mgc: OpenBLAS took this CPU for a %s; it runs %s kernels: starting again with OPENBLAS_CORETYPE=%s "
                            "(set OPENBLAS_CORETYPE to choose)\n", core, want, want);
        setenv("OPENBLAS_CORETYPE", want, 1);
        fflush(NULL);
        execv("/proc/self/exe", argv);
        /* no /proc: go on with the kernels OpenBLAS chose */
        if (verbose) fprintf(stderr, "mgc: cannot start again (%s): OpenBLAS's %s kernels it is\n", strerror(errno), core);
        return 0;
    }
    if (verbose) fprintf(stderr, "mgc: OpenBLAS kernels for %s%s\n", core, set ? " (OPENBLAS_CORETYPE)" : "");
    return 0;
}

static int cpu_load(Device *d, const Program *p, bool verbose, void **module, KernelFn *fns, char *err, size_t err_size)
{
    (void)d;
    /* as many pieces as cores, more where the source is large: no compiler
       process gets more than about 256 KB of kernels */
    long kernels = 0, bytes = 0;
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (!cg_own_code(s)) continue;
        kernels++;
        bytes += s->src_end - s->src_begin;
    }
    *module = NULL;
    if (kernels > 0) {   /* none where every kernel is another program's (compiled with it) */
        long want = (bytes >> 18) + 1;
        if (want < rt_cores()) want = rt_cores();
        if (want > kernels) want = kernels;
        char **parts = malloc(sizeof(char *) * (size_t)want);
        int n = cg_source_parts(p, TARGET_C, (int)want, parts);
        int rc = rt_cc_load((const char *const *)parts, n, verbose, (CcModule **)module, err, err_size);
        free(parts);
        if (rc) return -1;
    }
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (s->kind != STEP_KERNEL || s->shared) continue;   /* shared: the Exec takes it from the other program's */
        void *sym = rt_cc_sym(*module, s->sym);
        if (!sym) {
            snprintf(err, err_size, "kernel %s missing from the compiled kernels (delete the kernel cache to rebuild)", s->sym);
            return -1;
        }
        memcpy(&fns[k], &sym, sizeof sym);
    }
    return 0;
}

static void cpu_unload(Device *d, void *module)
{
    (void)d;
    rt_cc_unload(module);
}

static void cpu_launch(Device *d, KernelFn fn, const KArgs *a, const Step *s, long work)
{
    KernelJob job = { .a = *a };
    memcpy(&job.fn, &fn, sizeof job.fn);
    bool heavy = s->heavy || s->blocks;   /* a reduction per iteration: worth threads even when few */
    rt_pool_run(d->impl, kernel_job, &job, heavy ? work >= 2 : work * (s->grain > 0 ? s->grain : 1) >= 8192 && work >= 2);
}

static void cpu_gemm(Device *d, const GemmArgs *g)
{
    double flops = 2.0 * g->m * g->n * g->k;
    for (int i = 0; i < (g->batch > 1 ? g->batch : 1); i++) {   /* a batch: one GEMM after another, each split between the threads */
        GemmArgs one = *g;
        one.a += i * g->sa, one.b += i * g->sb, one.c += i * g->sc;
        rt_pool_run(d->impl, gemm_job, &one, flops > 2e5 && (g->m >= 16 || g->n >= 16));
    }
}

static void cpu_synchronize(Device *d) { (void)d; }   /* every call returns when its work is done */

static void cpu_allreduce_start(Device *d, Comm *c, int replica, int coll, int kind, float *data, long n)
{
    (void)kind;   /* the Comm knows each collective's (rt_comm_set_kind) */
    (void)d;
    rt_comm_start(c, replica, coll, data, n);
}

static double cpu_allreduce_wait(Device *d, Comm *c, int replica, int coll)
{
    (void)d;
    return rt_comm_wait(c, replica, coll);
}

static void cpu_destroy(Device *d)
{
    rt_pool_free(d->impl);
    free(d);
}

static const DeviceOps cpu_ops = {
    .alloc = cpu_alloc, .release = cpu_release, .alloc_host = cpu_alloc_host, .release_host = cpu_release,
    .memory_free = cpu_memory_free,
    .upload = cpu_copy, .download = cpu_copy, .copy = cpu_copy, .load = cpu_load, .unload = cpu_unload,
    .launch = cpu_launch, .gemm = cpu_gemm, .synchronize = cpu_synchronize,
    .allreduce_start = cpu_allreduce_start, .allreduce_wait = cpu_allreduce_wait, .destroy = cpu_destroy,
};

Device *rt_device_cpu_new(int index, int threads, bool own_memory)
{
    openblas_set_num_threads(1);   /* the pool parallelises GEMMs itself */
    Device *d = calloc(1, sizeof *d);
    d->ops = &cpu_ops;
    snprintf(d->name, sizeof d->name, "cpu:%d", index);
    d->impl = rt_pool_new(threads);
    d->threads = rt_pool_threads(d->impl);
    d->kind = DEV_CPU;
    d->host_memory = !own_memory;
    return d;
}

void rt_device_free(Device *d)
{
    if (d) d->ops->destroy(d);
}
