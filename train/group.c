/*
** The replicas of this process and their group, as the trainer's files share
** them: running a function on every replica, copying and comparing their
** tensors, a batch's shards; the stop signals and the vote on them; the clock.
*/
#include "group.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* SIGINT (Ctrl-C), SIGTERM (Slurm's preemption, docker stop, systemd, mpirun)
   and SIGHUP (a closed terminal) ask the run to stop: after the current step,
   on every replica and rank at the same step (the control vote), with the
   last finished epoch's checkpoint whole, and status 128 + the signal. A
   checkpoint being written when the signal comes is finished first. */
static volatile sig_atomic_t interrupted;   /* the signal that asked to stop, or 0 */
static void on_stop_signal(int sig) { interrupted = sig; }
static const int stop_signals[] = { SIGINT, SIGTERM, SIGHUP };
#define NSTOP_SIGNALS ((int)(sizeof stop_signals / sizeof *stop_signals))

int train_stop_point(World *w, int rc)
{
    int all = rt_world_max_status(w, rc ? 1000 : (int)interrupted);
    if (all >= 1000) return 1;
    if (all > 0) interrupted = all;
    return all > 0 ? 128 + all : 0;
}

const char *train_signal_name(int sig)
{
    return sig == SIGINT ? "SIGINT (Ctrl-C)" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

int train_signal(void) { return interrupted; }

void train_catch_signals(TrainSignals *old)
{
    struct sigaction stop_sa = { .sa_handler = on_stop_signal };
    sigemptyset(&stop_sa.sa_mask);
    interrupted = 0;
    for (int k = 0; k < NSTOP_SIGNALS; k++) sigaction(stop_signals[k], &stop_sa, &old->sa[k]);
}

void train_release_signals(const TrainSignals *old)
{
    for (int k = 0; k < NSTOP_SIGNALS; k++) sigaction(stop_signals[k], &old->sa[k], NULL);
}

double train_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void train_shard(long b, int parts, int j, long *first, long *count)
{
    long q = b / parts, r = b % parts;
    *first = j * q + (j < r ? j : r);
    *count = q + (j < r);
}

typedef struct ThreadArg { Group *g; Replica *r; void (*fn)(Group *, Replica *); } ThreadArg;
static void *replica_thread(void *arg)
{
    ThreadArg *a = arg;
    a->fn(a->g, a->r);
    return NULL;
}

void train_on_every_replica(Group *g, void (*fn)(Group *, Replica *))
{
    pthread_t *tid = calloc((size_t)g->n, sizeof(pthread_t));
    ThreadArg *args = calloc((size_t)g->n, sizeof(ThreadArg));
    for (int k = 1; k < g->n; k++) {
        args[k] = (ThreadArg){ g, &g->r[k], fn };
        pthread_create(&tid[k], NULL, replica_thread, &args[k]);
    }
    fn(g, &g->r[0]);
    for (int k = 1; k < g->n; k++) pthread_join(tid[k], NULL);
    free(args);
    free(tid);
}

/* Every replica's tensors from replica 0 of rank 0 (all of them, or the
   running statistics only), on the host and on the devices. at_start: replica
   0's host copy is the truth (initialised or loaded); else its device's is. */
void train_from_replica0(Group *g, StoreWhich which, bool at_start)
{
    Store *s0 = &g->r[0].store;
    if (!at_start) rt_store_download(s0, which);
    for (int k = 0; k < s0->n; k++) {
        StoreEntry *e = &s0->e[k];
        if (which == STORE_RUNNING && !rt_store_is_running(e)) continue;
        if (e->shard_of >= 0) continue;   /* --shard-update: each replica's own slice of the state */
        rt_world_bcast(g->world, e->data, sizeof(float) * (size_t)e->numel);
        for (int r = 1; r < g->n; r++)
            if (g->r[r].store.e[k].data != e->data)   /* --shard-update: replicas may share a parameter block */
                memcpy(g->r[r].store.e[k].data, e->data, sizeof(float) * (size_t)e->numel);
    }
    for (int r = at_start || g->world->rank ? 0 : 1; r < g->n; r++) rt_store_upload(&g->r[r].store, which);
}

/* The largest difference between any replica's tensors and replica 0's of rank 0, over all
   tensors, or over the running statistics. */
double train_replica_diff(Group *g, bool running)
{
    double worst = 0;
    Store *s0 = &g->r[0].store;
    for (int r = 0; r < g->n; r++) rt_store_download(&g->r[r].store, running ? STORE_RUNNING : STORE_NOT_RUNNING);
    for (int k = 0; k < s0->n; k++) {
        StoreEntry *e = &s0->e[k];
        if (rt_store_is_running(e) != running || e->shard_of >= 0) continue;
        float *ref = malloc(sizeof(float) * (size_t)e->numel);
        memcpy(ref, e->data, sizeof(float) * (size_t)e->numel);
        rt_world_bcast(g->world, ref, sizeof(float) * (size_t)e->numel);
        for (int r = 0; r < g->n; r++)
            for (long i = 0; i < e->numel; i++) {
                double d = fabs((double)g->r[r].store.e[k].data[i] - ref[i]);
                if (d > worst || d != d) worst = d != d ? INFINITY : d;
            }
        free(ref);
    }
    rt_world_max_f64(g->world, &worst, 1);
    return worst;
}
