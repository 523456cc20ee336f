/*
** model_cpu.c: the exported library's threads, kernel launches and GEMMs on
** the CPU (see model_cpu.h). A context's pool: its workers spin briefly for
** the next job (kernels come back to back), then sleep on a condition
** variable; no state outside the pool, so contexts run side by side.
*/
#define _GNU_SOURCE   /* sched_getaffinity */
#include "model_cpu.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct mgc_pool {
    int nthreads;
    bool serial;                      /* mgc_pool_serial's: no threads, a job's shares one after another */
    pthread_t *tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void (*job)(void *ctx, int thread, int nthreads);   /* run by threads 1..nthreads-1 too */
    void *ctx;
    atomic_ulong generation;          /* bumped per job */
    atomic_int pending;               /* workers still running the job */
    atomic_bool quit;
};

typedef struct Worker { mgc_pool *pool; int index; } Worker;

static void pause_cpu(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg)
{
    Worker *w = arg;
    mgc_pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        unsigned long gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int spin = 0; gen == seen && spin < 20000; spin++) {
            pause_cpu();
            gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (gen == seen) {
            pthread_mutex_lock(&p->mu);
            while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) break;
        seen = gen;
        p->job(p->ctx, w->index, p->nthreads);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    free(w);
    return NULL;
}

static int cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

mgc_pool *mgc_pool_new(int threads)
{
    if (threads <= 0) threads = cores();
    mgc_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->tid = calloc((size_t)threads, sizeof(pthread_t)))) {
        free(p);
        return NULL;
    }
    p->nthreads = 1;   /* the threads started so far, this one included */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int k = 1; k < threads; k++) {
        Worker *w = malloc(sizeof *w);
        if (!w) break;
        w->pool = p;
        w->index = k;
        if (pthread_create(&p->tid[k], NULL, worker_main, w)) {
            free(w);
            break;
        }
        p->nthreads++;
    }
    if (p->nthreads < threads) {   /* a pool short of threads would split work otherwise than asked */
        mgc_pool_free(p);
        return NULL;
    }
    return p;
}

void mgc_pool_free(mgc_pool *p)
{
    if (!p) return;
    if (p->serial) {
        free(p);
        return;
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int k = 1; k < p->nthreads; k++) pthread_join(p->tid[k], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->tid);
    free(p);
}

int mgc_pool_threads(const mgc_pool *p) { return p->nthreads; }

mgc_pool *mgc_pool_serial(int nthreads)
{
    mgc_pool *p = calloc(1, sizeof *p);
    if (p) p->nthreads = nthreads, p->serial = true;
    return p;
}

void mgc_pool_run(mgc_pool *p, void (*job)(void *, int, int), void *ctx, bool parallel)
{
    int nt = p->nthreads;
    if (nt == 1 || !parallel) {
        job(ctx, 0, 1);
        return;
    }
    if (p->serial) {
        for (int t = 0; t < nt; t++) job(ctx, t, nt);
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
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) pause_cpu();
}

void mgc_cpu_kernel(mgc_pool *p, void (*call)(void *args, int thread, int nthreads), void *args, long work, bool heavy,
                    long grain)
{
    if (work <= 0) return;
    mgc_pool_run(p, call, args, heavy ? work >= 2 : work * (grain > 0 ? grain : 1) >= 8192 && work >= 2);
}

#if MODEL_BLAS
/* CBLAS's GEMM (OpenBLAS's), declared here so that no cblas.h is needed to build */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc);

typedef struct Gemm {
    bool ta, tb;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
} Gemm;

/* this thread's rows of C (when M is the larger) or its columns */
static void gemm_job(void *ctx, int thread, int nthreads)
{
    Gemm *g = ctx;
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
    cblas_sgemm(ROW_MAJOR, g->ta ? TRANS : NO_TRANS, g->tb ? TRANS : NO_TRANS, m, n, g->k, g->alpha, a,
                g->lda, b, g->ldb, g->beta, c, g->ldc);
}

void mgc_cpu_gemm(mgc_pool *p, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                  int ldb, float beta, float *c, int ldc, int batch, long sa, long sb, long sc)
{
    double flops = 2.0 * m * n * k;
    for (int i = 0; i < (batch > 1 ? batch : 1); i++) {   /* one GEMM after another, each split between the threads */
        Gemm g = { ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, a + i * sa, b + i * sb, c + i * sc };
        mgc_pool_run(p, gemm_job, &g, flops > 2e5 && (m >= 16 || n >= 16));
    }
}
#endif

/* OpenBLAS's own call, where OpenBLAS is what is linked (a weak reference: absent, nothing to set) */
void openblas_set_num_threads(int n) __attribute__((weak));

void mgc_cpu_blas_one_thread(void)
{
    if (openblas_set_num_threads) openblas_set_num_threads(1);
}
