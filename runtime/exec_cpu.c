/*
** The CPU backend: kernels compiled by the system C compiler into a shared
** object (cached on disk by a hash of source, flags and compiler), loaded with
** dlopen, run on a small thread pool; GEMMs through CBLAS (OpenBLAS).
**
** The pool runs one job at a time on all its threads: a kernel (every thread
** calls it with its own a.thread, and FOR_EACH gives each its contiguous
** share) or a GEMM (each thread multiplies its block of rows or columns with
** single-threaded BLAS). One pool owns all the cores: BLAS's own threads would
** fight it for them. Small jobs run on the calling thread alone.
*/
#include "runtime.h"
#include "kargs.h"
#include "rng.h"
#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef void (*KernelCall)(KArgs);

/* ------------------------------------------------------------------ thread pool */

struct Pool {
    int nthreads;
    pthread_t *tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void (*job)(void *ctx, int thread, int nthreads);   /* run by threads 1..nthreads-1 too */
    void *ctx;
    atomic_ulong generation;  /* bumped per job */
    atomic_int pending;       /* workers still running the job */
    bool quit;
};

typedef struct Worker { Pool *pool; int index; } Worker;

static void *worker_main(void *arg)
{
    Worker *w = arg;
    Pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        /* Spin briefly for the next job (kernels come back to back), then sleep. */
        unsigned long gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int spin = 0; gen == seen && spin < 20000; spin++) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
            gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (gen == seen) {
            pthread_mutex_lock(&p->mu);
            while ((gen = atomic_load(&p->generation)) == seen && !p->quit) pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (p->quit) break;
        seen = gen;
        p->job(p->ctx, w->index, p->nthreads);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    free(w);
    return NULL;
}

Pool *rt_pool_new(int threads)
{
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    Pool *p = calloc(1, sizeof *p);
    p->nthreads = threads;
    openblas_set_num_threads(1);   /* the pool parallelises GEMMs itself */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->tid = calloc((size_t)threads, sizeof(pthread_t));
    for (int k = 1; k < threads; k++) {
        Worker *w = malloc(sizeof *w);
        w->pool = p;
        w->index = k;
        pthread_create(&p->tid[k], NULL, worker_main, w);
    }
    return p;
}

void rt_pool_free(Pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int k = 1; k < p->nthreads; k++) pthread_join(p->tid[k], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->tid);
    free(p);
}

int rt_pool_threads(const Pool *p) { return p->nthreads; }

/* Runs job(ctx, t, nthreads) for t = 0..nthreads-1, t = 0 on this thread; returns when all are done. */
static void pool_run(Pool *p, void (*job)(void *, int, int), void *ctx, bool parallel)
{
    int nt = p->nthreads;
    if (nt == 1 || !parallel) {
        job(ctx, 0, 1);
        return;
    }
    p->job = job;
    p->ctx = ctx;
    atomic_store(&p->pending, nt - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    job(ctx, 0, nt);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
}

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
typedef struct GemmJob {
    bool ta, tb;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
} GemmJob;

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
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                m, n, g->k, g->alpha, a, g->lda, b, g->ldb, g->beta, c, g->ldc);
}

/* ----------------------------------------------------------------- compilation */

const char *rt_cache_dir(char *buf, size_t size)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && *xdg) snprintf(buf, size, "%s/mgc", xdg);
    else snprintf(buf, size, "%s/.cache/mgc", getenv("HOME") ? getenv("HOME") : "/tmp");
    return buf;
}

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static int mkdirs(const char *path)
{
    char tmp[4608];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
    return 0;
}

/* The first line of `cc --version`, part of the cache key. */
static void compiler_id(const char *cc, char *buf, size_t size)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --version 2>/dev/null", cc);
    buf[0] = 0;
    FILE *f = popen(cmd, "r");
    if (!f) return;
    if (!fgets(buf, (int)size, f)) buf[0] = 0;
    pclose(f);
}

static const char kernel_flags[] = "-O3 -march=native -std=gnu11 -fPIC -shared -fno-math-errno -Wno-unused";

static int compile_kernels(const char *source, const RtOptions *opt, char *so_path, size_t so_size, char *err, size_t err_size)
{
    const char *cc = getenv("MGC_CC");
    if (!cc || !*cc) cc = "cc";
    char id[256];
    compiler_id(cc, id, sizeof id);
    if (!id[0]) {
        snprintf(err, err_size, "cannot run the C compiler '%s' to build the kernels (set MGC_CC to a working compiler)", cc);
        return -1;
    }
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv1a(h, source);
    h = fnv1a(h, "\n--flags ");
    h = fnv1a(h, kernel_flags);
    h = fnv1a(h, "\n--cc ");
    h = fnv1a(h, cc);
    h = fnv1a(h, id);
    char dir[4096], kdir[4200];
    rt_cache_dir(dir, sizeof dir);
    snprintf(kdir, sizeof kdir, "%s/kernels", dir);
    if (mkdirs(kdir)) {
        snprintf(err, err_size, "cannot create the kernel cache directory '%s': %s (set XDG_CACHE_HOME to a writable place)",
                 kdir, strerror(errno));
        return -1;
    }
    snprintf(so_path, so_size, "%s/%016llx.so", kdir, (unsigned long long)h);
    if (access(so_path, R_OK) == 0) {
        if (opt && opt->verbose) fprintf(stderr, "mgc: kernels found in cache %s\n", so_path);
        return 0;
    }
    char c_path[4800], tmp_so[4800], log_path[4800];
    snprintf(c_path, sizeof c_path, "%s/%016llx.c", kdir, (unsigned long long)h);
    snprintf(tmp_so, sizeof tmp_so, "%s.%d.tmp", so_path, (int)getpid());
    snprintf(log_path, sizeof log_path, "%s/%016llx.log", kdir, (unsigned long long)h);
    FILE *f = fopen(c_path, "w");
    if (!f || fputs(source, f) < 0 || fclose(f)) {
        snprintf(err, err_size, "cannot write kernel source '%s': %s", c_path, strerror(errno));
        return -1;
    }
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "%s %s -o '%s' '%s' > '%s' 2>&1", cc, kernel_flags, tmp_so, c_path, log_path);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = system(cmd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc != 0) {
        snprintf(err, err_size, "the C compiler failed on the generated kernels (exit %d); source %s, messages %s",
                 WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, c_path, log_path);
        unlink(tmp_so);
        return -1;
    }
    if (rename(tmp_so, so_path)) {
        snprintf(err, err_size, "cannot move compiled kernels into the cache '%s': %s", so_path, strerror(errno));
        return -1;
    }
    unlink(log_path);
    if (opt && opt->verbose)
        fprintf(stderr, "mgc: compiled kernels in %.2f s -> %s\n",
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), so_path);
    return 0;
}

/* ---------------------------------------------------------------------- store */

StoreEntry *rt_store_find(Store *s, const char *name)
{
    for (int k = 0; k < s->n; k++)
        if (strcmp(s->e[k].name, name) == 0) return &s->e[k];
    return NULL;
}

int rt_store_add(Store *s, const Node *n)
{
    StoreEntry *e = rt_store_find(s, n->name);
    if (e) return ir_shape_eq(&e->shape, &n->shape) ? (int)(e - s->e) : -1;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->e = realloc(s->e, sizeof(StoreEntry) * (size_t)s->cap);
    }
    e = &s->e[s->n];
    e->name = strdup(n->name);
    e->shape = n->shape;
    e->numel = ir_numel(&n->shape, 1);
    e->data = calloc((size_t)e->numel, sizeof(float));
    e->node = n;
    e->trainable = n->op == OP_PARAM;
    return s->n++;
}

void rt_store_free(Store *s)
{
    for (int k = 0; k < s->n; k++) {
        free((char *)s->e[k].name);
        free(s->e[k].data);
    }
    free(s->e);
    memset(s, 0, sizeof *s);
}

void rt_store_init(Store *s, unsigned long long seed)
{
    Rng r;
    rng_seed(&r, seed);
    for (int k = 0; k < s->n; k++) {
        StoreEntry *e = &s->e[k];
        switch (e->node->init) {
        case INIT_UNIFORM_FAN_IN: {
            float bound = 1.0f / sqrtf((float)e->node->fan_in);
            for (long i = 0; i < e->numel; i++) e->data[i] = rng_uniform(&r, -bound, bound);
            break;
        }
        case INIT_ONES:
            for (long i = 0; i < e->numel; i++) e->data[i] = 1.0f;
            break;
        case INIT_ZEROS: case INIT_NONE:
            memset(e->data, 0, sizeof(float) * (size_t)e->numel);
            break;
        }
    }
}

/* --------------------------------------------------------------- memory plan */

/* Buffer reuse by liveness. Each activation or scratch buffer lives from the
   first step that touches it to the last (a view extends its base's life);
   buffers whose lives do not overlap share one allocation ("slot"), chosen
   best-fit. What the host reads after a run is pinned to a slot of its own.
   Sizes are for max_batch examples. */
static int plan_memory(Exec *x, const Program *p, long max_batch, const RtOptions *opt, char *err, size_t err_size)
{
    int nb = p->nbufs;
    int *first = malloc(sizeof(int) * (size_t)nb), *last = malloc(sizeof(int) * (size_t)nb);
    int *slot = malloc(sizeof(int) * (size_t)nb), *order = malloc(sizeof(int) * (size_t)nb);
    for (int b = 0; b < nb; b++) first[b] = INT32_MAX, last[b] = -1, slot[b] = -1;
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        int used[CG_MAXARGS + 3], nu = 0;
        if (s->kind == STEP_KERNEL) for (int j = 0; j < s->nargs; j++) used[nu++] = s->args[j];
        else { used[nu++] = s->a; used[nu++] = s->b; used[nu++] = s->c; }
        for (int j = 0; j < nu; j++) {
            int b = used[j];
            while (b >= 0 && p->bufs[b].kind == BUF_VIEW) b = p->bufs[b].alias;
            if (b < 0) continue;
            if (k < first[b]) first[b] = k;
            if (k > last[b]) last[b] = k;
        }
    }
    int n = 0;
    for (int b = 0; b < nb; b++) {
        BufKind kind = p->bufs[b].kind;
        if (kind == BUF_ACT || kind == BUF_WORK || kind == BUF_INPUT) {
            if (first[b] == INT32_MAX) first[b] = last[b] = 0;
            order[n++] = b;
        }
    }
    /* by first use: a simple sweep */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && first[order[j]] < first[order[j - 1]]; j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    size_t *slot_bytes = calloc((size_t)n + 1, sizeof(size_t));
    int *slot_free_after = calloc((size_t)n + 1, sizeof(int));   /* last step of the slot's current tenant */
    bool *slot_pinned = calloc((size_t)n + 1, sizeof(bool));
    int nslots = 0;
    size_t naive = 0;
    for (int i = 0; i < n; i++) {
        int b = order[i];
        size_t bytes = sizeof(float) * (size_t)cg_dim(p->bufs[b].size, max_batch) + 64;
        naive += bytes;
        int best = -1;
        if (!p->bufs[b].pinned && p->bufs[b].kind != BUF_INPUT)
            for (int t = 0; t < nslots; t++) {
                if (slot_pinned[t] || slot_free_after[t] >= first[b]) continue;
                /* best fit: the smallest slot that holds it, else the largest to grow */
                if (best < 0) { best = t; continue; }
                bool fits = slot_bytes[t] >= bytes, bfits = slot_bytes[best] >= bytes;
                if ((fits && (!bfits || slot_bytes[t] < slot_bytes[best])) || (!fits && !bfits && slot_bytes[t] > slot_bytes[best]))
                    best = t;
            }
        if (best < 0) {
            best = nslots++;
            slot_pinned[best] = p->bufs[b].pinned || p->bufs[b].kind == BUF_INPUT;
        }
        if (slot_bytes[best] < bytes) slot_bytes[best] = bytes;
        slot_free_after[best] = last[b];
        slot[b] = best;
    }
    void **mem = calloc((size_t)nslots + 1, sizeof(void *));
    size_t total = 0;
    int rc = 0;
    for (int t = 0; t < nslots; t++) {
        if (posix_memalign(&mem[t], 64, slot_bytes[t])) {
            snprintf(err, err_size, "out of memory: %zu bytes of activations (try a smaller --batch-size)", slot_bytes[t]);
            rc = -1;
            break;
        }
        memset(mem[t], 0, slot_bytes[t]);
        x->owned[x->nowned++] = mem[t];
        total += slot_bytes[t];
    }
    if (!rc)
        for (int b = 0; b < nb; b++)
            if (slot[b] >= 0) x->ptr[b] = mem[slot[b]];
    if (!rc && opt && opt->verbose)
        fprintf(stderr, "mgc: memory plan: %d buffers in %d slots, %.1f MiB (%.1f MiB without reuse) at batch %ld\n",
                n, nslots, total / 1048576.0, naive / 1048576.0, max_batch);
    x->activation_bytes = total;
    free(mem); free(slot_bytes); free(slot_free_after); free(slot_pinned);
    free(first); free(last); free(slot); free(order);
    return rc;
}

/* ----------------------------------------------------------------------- exec */

int rt_exec_init(Exec *x, const Program *p, Store *store, long max_batch, Pool *pool,
                 const RtOptions *opt, char *err, size_t err_size)
{
    memset(x, 0, sizeof *x);
    x->prog = p;
    x->max_batch = max_batch;
    x->pool = pool;
    x->ptr = calloc((size_t)p->nbufs, sizeof(float *));
    x->owned = calloc((size_t)p->nbufs, sizeof(void *));
    x->fn = calloc((size_t)p->nsteps, sizeof(KernelFn));
    for (int b = 0; b < p->nbufs; b++) {
        const Buf *buf = &p->bufs[b];
        if (buf->kind == BUF_PERSISTENT) {
            const Node *n = &p->graph->nodes[buf->node];
            int k = rt_store_add(store, n);
            if (k < 0) {
                snprintf(err, err_size, "internal: '%s' has two shapes", n->name);
                return -1;
            }
            x->ptr[b] = store->e[k].data;
        }
    }
    if (plan_memory(x, p, max_batch, opt, err, err_size)) return -1;
    for (int b = 0; b < p->nbufs; b++)
        if (p->bufs[b].kind == BUF_VIEW) x->ptr[b] = x->ptr[p->bufs[b].alias] + p->bufs[b].offset;

    char so_path[4608];
    char *src = cg_source(p, TARGET_C);
    if (compile_kernels(src, opt, so_path, sizeof so_path, err, err_size)) return -1;
    x->so = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
    if (!x->so) {
        snprintf(err, err_size, "cannot load compiled kernels %s: %s (delete it to rebuild)", so_path, dlerror());
        return -1;
    }
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (s->kind != STEP_KERNEL) continue;
        void *sym = dlsym(x->so, s->fn);
        if (!sym) {
            snprintf(err, err_size, "kernel %s missing from %s (delete it to rebuild)", s->fn, so_path);
            return -1;
        }
        memcpy(&x->fn[k], &sym, sizeof sym);
    }
    x->seed = 0x5eed;
    return 0;
}

void rt_exec_free(Exec *x)
{
    for (int k = 0; k < x->nowned; k++) free(x->owned[k]);
    free(x->owned);
    free(x->ptr);
    free(x->fn);
    free(x->step_seconds);
    if (x->so) dlclose(x->so);
    memset(x, 0, sizeof *x);
}

void rt_exec_set_sgd(Exec *x, float lr, float momentum, float weight_decay)
{
    const Program *p = x->prog;
    for (int k = 0; k < p->nsteps; k++) {
        Step *s = &p->steps[k];
        if (s->kind == STEP_KERNEL && p->graph->nodes[s->node].op == OP_SGD) {
            s->f[0] = lr;
            s->f[1] = momentum;
            s->f[2] = weight_decay;
        }
    }
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void rt_exec_profile(Exec *x)
{
    if (!x->step_seconds) x->step_seconds = calloc((size_t)x->prog->nsteps, sizeof(double));
}

void rt_exec_profile_report(const Exec *x, FILE *out)
{
    const Program *p = x->prog;
    if (!x->step_seconds) return;
    double total = 0;
    for (int k = 0; k < p->nsteps; k++) total += x->step_seconds[k];
    fprintf(out, "profile: %llu runs, %.3f s in steps\n  step  node   share     ms/run  what\n", x->runs, total);
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        fprintf(out, "  %-5d %%%-5d %5.1f%%  %9.4f  %s\n", k, s->node, 100 * x->step_seconds[k] / (total > 0 ? total : 1),
                1e3 * x->step_seconds[k] / (double)(x->runs ? x->runs : 1), s->kind == STEP_KERNEL ? s->fn : "gemm");
    }
}

void rt_exec_run(Exec *x, long n)
{
    const Program *p = x->prog;
    x->runs++;
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        double t0 = x->step_seconds ? seconds() : 0;
        if (s->kind == STEP_KERNEL) {
            KArgs a;
            memset(&a, 0, sizeof a);
            for (int j = 0; j < s->nargs; j++) a.t[j] = s->args[j] >= 0 ? x->ptr[s->args[j]] : NULL;
            a.batch = n;
            memcpy(a.f, s->f, sizeof a.f);
            a.seed = s->seeded ? x->seed * 0x9E3779B97F4A7C15ULL + x->runs * 0xD1B54A32D192ED03ULL + (unsigned long long)k : 0;
            KernelJob job = { .a = a };
            memcpy(&job.fn, &x->fn[k], sizeof job.fn);
            long work = cg_dim(s->work, n);
            pool_run(x->pool, kernel_job, &job, s->heavy ? work >= 2 : work * (s->grain > 0 ? s->grain : 1) >= 8192 && work >= 2);
        } else {
            GemmJob g = { s->ta, s->tb, (int)cg_dim(s->m, n), (int)cg_dim(s->n, n), (int)cg_dim(s->k, n),
                          (int)cg_dim(s->lda, n), (int)cg_dim(s->ldb, n), (int)cg_dim(s->ldc, n), s->alpha, s->beta,
                          x->ptr[s->a], x->ptr[s->b], x->ptr[s->c] };
            double flops = 2.0 * g.m * g.n * g.k;
            pool_run(x->pool, gemm_job, &g, flops > 2e5 && (g.m >= 16 || g.n >= 16));
        }
        if (x->step_seconds) x->step_seconds[k] += seconds() - t0;
    }
}
