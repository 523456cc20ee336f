/*
** The CPU device's thread pool. It runs one job at a time on all its
** threads: job(ctx, t, nthreads) for t = 0..nthreads-1, thread 0 being the
** caller (so each replica's own thread drives its pool). Workers spin
** briefly between jobs (kernels come back to back), then sleep.
*/
#ifndef MGC_POOL_H
#define MGC_POOL_H
#include <stdbool.h>
#include <stddef.h>

typedef struct Pool Pool;

/* threads <= 0: one per online core. */
Pool *rt_pool_new(int threads);
void  rt_pool_free(Pool *p);
int   rt_pool_threads(const Pool *p);
/* Runs job on every thread (or, when !parallel, once on the caller with nthreads 1); returns when all are done. */
void  rt_pool_run(Pool *p, void (*job)(void *ctx, int thread, int nthreads), void *ctx, bool parallel);
/* Cores this process may run on. */
int   rt_cores(void);
/* Bytes of this process's peak resident memory since it started (exec), 0 when unknown. */
size_t rt_peak_resident(void);

#endif
