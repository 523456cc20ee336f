/*
** The thread pool of the CPU device (see pool.h).
*/
#include "pool.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    if (threads <= 0) threads = rt_cores();
    Pool *p = calloc(1, sizeof *p);
    p->nthreads = threads;
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
void rt_pool_run(Pool *p, void (*job)(void *, int, int), void *ctx, bool parallel)
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

int rt_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The first number in a file, or -1 (a missing file, or "max") */
static long long read_number(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    while (fgets(line, sizeof line, f)) {
        if (key && strncmp(line, key, strlen(key))) continue;
        char *p = line + (key ? strlen(key) : 0);
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end != p) v = key ? x * 1024 : x;   /* /proc/self/status counts kB */
        break;
    }
    fclose(f);
    return v;
}

size_t rt_peak_resident(void)
{
    /* VmHWM: this address space's peak, from exec on (getrusage's ru_maxrss would also
       count the parent's pages that a fork copied before the exec: a parent as large as
       a Python process with PyTorch loaded sets a floor under every child's figure) */
    long long v = read_number("/proc/self/status", "VmHWM:");
    return v > 0 ? (size_t)v : 0;
}
