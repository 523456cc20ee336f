/*
** Collectives of a data-parallel group (see comm.h): a ring over shared
** memory between the replicas of this process, then MPI between ranks.
**
** Ring, for N replicas and a sum of n floats: chunk c is floats
** [lo(c), lo(c+1)), lo(c) = c*(n/N) + min(c, n%N). Replica r reads from its
** predecessor p = r-1 (mod N):
**   reduce-scatter, step s = 0..N-2: adds p's chunk (r-1-s) into its own;
**                                    afterwards r holds the sum of chunk r+1
**   all-gather,     step t = 0..N-2: copies p's chunk (r-t), already summed
** A reduce-scatter (--shard-update) is the first N-1 steps alone, an
** all-gather the last N-1, over equal chunks of ceil(n/N) floats, their
** indices shifted by one so that r ends the reduce-scatter holding the sum of
** chunk r, and brings chunk r to the all-gather. Across ranks (P of them,
** rt_comm_owner), local replica r's chunk is split in P parts, rank q's the
** q-th: after the ring's reduce-scatter local replica 0's thread
** reduce-scatters each local chunk across the ranks (MPI), and before the
** ring's all-gather all-gathers each across the ranks.
** An all-gather whose replicas all hold one buffer (--shard-update's shared
** parameter block, train.c) copies nothing: its steps only synchronise.
** Before step k of a sum, r waits until p has finished step k-1 of it. That
** chain also keeps r's all-gather from overwriting a chunk its successor has
** not read yet (the successor is N-2 links behind p). A sum is finished
** when every replica has done its last step: then no one reads a replica's
** buffer any more, and its compute thread may write it again.
**
** Progress is published in one counter per replica, seq * 2N + steps done,
** seq numbering the replica's sums from 1. Waits spin briefly and then
** sleep on the group's condition variable, woken by every publication.
*/
#include "comm.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define QUEUE 1024            /* collectives a replica may have started and not finished */

typedef struct Pending { int coll; float *data; long n; unsigned long seq; CommKind kind; } Pending;

typedef struct Member {
    Comm *c;
    int index;
    pthread_t tid;
    Pending q[QUEUE];
    unsigned long issued;     /* sums started by the compute thread (its last seq) */
    _Atomic unsigned long taken;     /* sums the communication thread has begun */
    _Atomic unsigned long progress;  /* seq * 2N + ring steps done */
    _Atomic unsigned long finished;  /* last seq whose ring (and MPI) part is done */
    _Atomic unsigned long done;      /* last seq finished for the whole process group */
    _Atomic unsigned long ready;     /* last seq begun (data set): an all-gather's MPI part may read it */
    _Atomic unsigned long gathered;  /* replica 0: last all-gather whose MPI part is done */
    float *_Atomic data;      /* the buffer of the sum in progress */
    unsigned long *last_seq;  /* per collective: seq of its latest start */
    CommStats st;
} Member;

struct Comm {
    int n;                    /* replicas in this process */
    World *world;
    int ncolls;
    CommKind *kind;           /* per collective */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit;
    Member *m;
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void publish(Comm *c, _Atomic unsigned long *where, unsigned long v)
{
    atomic_store_explicit(where, v, memory_order_release);
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Waits until *where >= v (or the group quits). */
static void await(Comm *c, _Atomic unsigned long *where, unsigned long v)
{
    for (int spin = 0; spin < 4000; spin++) {
        if (atomic_load_explicit(where, memory_order_acquire) >= v) return;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
    pthread_mutex_lock(&c->mu);
    while (atomic_load_explicit(where, memory_order_acquire) < v && !c->quit) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static long chunk_lo(long n, int parts, int c) { return c * (n / parts) + (c < n % parts ? c : n % parts); }

int rt_comm_owner(int local, int rank, int ranks) { return local * ranks + rank; }

/* Where chunk c of N starts: an allreduce's balanced chunks, or the halves' equal ones. */
static long part_lo(long n, int N, int c, CommKind kind)
{
    if (kind == COMM_ALLREDUCE) return chunk_lo(n, N, c);
    long size = (n + N - 1) / N, lo = (long)c * size;
    return lo < n ? lo : n;
}

/* Replica r's part of the ring for sum `seq` over data[0, n): its steps [k0, k1) of the 2(N-1).
   Whether it was an all-gather in place (its predecessor's buffer its own: nothing to send). */
static bool ring(Comm *c, int r, float *data, long n, unsigned long seq, CommKind kind)
{
    int N = c->n, shift = kind != COMM_ALLREDUCE;   /* the halves: r ends owning chunk r, not r + 1 */
    Member *me = &c->m[r], *pred = &c->m[(r + N - 1) % N];
    unsigned long base = seq * 2 * (unsigned long)N;
    int k0 = kind == COMM_ALLGATHER ? N - 1 : 0, k1 = kind == COMM_REDUCE_SCATTER ? N - 1 : 2 * (N - 1);
    atomic_store_explicit(&me->data, data, memory_order_relaxed);
    publish(c, &me->progress, base + (unsigned long)k0);   /* an all-gather: the reduce-scatter's steps count as done */
    bool in_place = false;
    if (N == 1) return in_place;
    for (int k = k0; k < k1; k++) {
        await(c, &pred->progress, base + (unsigned long)k);
        const float *src = atomic_load_explicit(&pred->data, memory_order_relaxed);
        bool gather = k >= N - 1;
        int chunk = gather ? (r - shift - (k - (N - 1)) + 2 * N) % N : (r - 1 - shift - k + 2 * N) % N;
        long lo = part_lo(n, N, chunk, kind), hi = part_lo(n, N, chunk + 1, kind);
        if (gather && src == data) {   /* one buffer for the replicas (a shared parameter block): in place already */
            in_place = true;
            publish(c, &me->progress, base + (unsigned long)k + 1);
            continue;
        }
        if (gather) memcpy(data + lo, src + lo, sizeof(float) * (size_t)(hi - lo));
        else for (long i = lo; i < hi; i++) data[i] += src[i];
        pred->st.bytes_sent += 4.0 * (double)(hi - lo);   /* only r reads from pred: no race */
        publish(c, &me->progress, base + (unsigned long)k + 1);
    }
    return in_place;
}

/* --shard-update across ranks, on local replica 0's thread: each local replica k's chunk of
   the sum (n floats, N equal chunks, each in as many parts as ranks) reduce-scattered or
   all-gathered with the other ranks, in k's own buffer. */
static void mpi_halves(Comm *c, long n, CommKind kind)
{
    int N = c->n, P = c->world->size, q = c->world->rank;
    long L = n / N, part = L / P;   /* n is ranks x N x part (codegen pads the buckets so) */
    float *mine = kind == COMM_REDUCE_SCATTER ? malloc(sizeof(float) * (size_t)(part > 0 ? part : 1)) : NULL;
    for (int k = 0; k < N; k++) {
        float *chunk = atomic_load(&c->m[k].data) + (long)k * L;
        if (kind == COMM_REDUCE_SCATTER && mine) {
            rt_world_reduce_scatter_f32(c->world, chunk, mine, part);
            memcpy(chunk + (long)q * part, mine, sizeof(float) * (size_t)part);
        } else if (kind == COMM_ALLGATHER) {
            rt_world_allgather_f32(c->world, chunk, part);
        }
        c->m[0].st.mpi_bytes += 4.0 * (double)L;
    }
    free(mine);
}

static void *comm_main(void *arg)
{
    Member *me = arg;
    Comm *c = me->c;
    int r = me->index, N = c->n;
    for (;;) {
        unsigned long seq = atomic_load(&me->taken) + 1;
        pthread_mutex_lock(&c->mu);
        while (me->issued < seq && !c->quit) pthread_cond_wait(&c->cv, &c->mu);
        bool quit = c->quit;
        Pending op = me->q[seq % QUEUE];
        pthread_mutex_unlock(&c->mu);
        if (quit) break;
        atomic_store(&me->taken, seq);
        bool ranks = c->world && c->world->size > 1;
        unsigned long base = seq * 2 * (unsigned long)N;
        if (op.kind == COMM_ALLGATHER && ranks) {   /* across the ranks first, then the ring */
            atomic_store(&me->data, op.data);
            publish(c, &me->ready, seq);
            if (r == 0) {
                for (int k = 0; k < N; k++) await(c, &c->m[k].ready, seq);
                mpi_halves(c, op.n, op.kind);
                publish(c, &me->gathered, seq);
            } else {
                await(c, &c->m[0].gathered, seq);
            }
        }
        bool in_place = ring(c, r, op.data, op.n, seq, op.kind);
        if (op.kind == COMM_REDUCE_SCATTER && ranks) {   /* the ring, then across the ranks */
            if (r == 0) {
                for (int k = 0; k < N; k++) await(c, &c->m[k].progress, base + (unsigned long)(N - 1));
                mpi_halves(c, op.n, op.kind);
            }
            publish(c, &me->finished, seq);
        } else if (ranks && op.kind == COMM_ALLREDUCE) {
            /* across ranks: local replica 0 sums with the other ranks, the others copy its result */
            if (r == 0) {
                rt_world_sum_f32(c->world, op.data, op.n);
                me->st.mpi_bytes += 4.0 * (double)op.n;
                publish(c, &me->finished, seq);
            } else {
                await(c, &c->m[0].finished, seq);
                memcpy(op.data, atomic_load(&c->m[0].data), sizeof(float) * (size_t)op.n);
                publish(c, &me->finished, seq);
            }
        } else {
            publish(c, &me->finished, seq);
        }
        for (int k = 0; k < N; k++) await(c, &c->m[k].finished, seq);
        me->st.ops++;
        if (!in_place) me->st.bytes_bound += (op.kind == COMM_ALLREDUCE ? 2.0 : 1.0) * (N - 1) / N * 4.0 * (double)op.n;
        publish(c, &me->done, seq);
    }
    return NULL;
}

Comm *rt_comm_new(int local, World *world, int ncolls)
{
    Comm *c = calloc(1, sizeof *c);
    c->n = local;
    c->world = world;
    c->ncolls = ncolls;
    c->kind = calloc((size_t)ncolls + 1, sizeof(CommKind));   /* COMM_ALLREDUCE */
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->m = calloc((size_t)local, sizeof(Member));
    for (int r = 0; r < local; r++) {
        Member *m = &c->m[r];
        m->c = c;
        m->index = r;
        m->last_seq = calloc((size_t)ncolls + 1, sizeof(unsigned long));
        pthread_create(&m->tid, NULL, comm_main, m);
    }
    return c;
}

void rt_comm_free(Comm *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->quit = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    for (int r = 0; r < c->n; r++) {
        pthread_join(c->m[r].tid, NULL);
        free(c->m[r].last_seq);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->m);
    free(c->kind);
    free(c);
}

void rt_comm_set_kind(Comm *c, int coll, CommKind kind) { c->kind[coll] = kind; }

void rt_comm_start(Comm *c, int replica, int coll, float *data, long n)
{
    Member *m = &c->m[replica];
    unsigned long seq = m->issued + 1;
    /* room in the queue: the sum QUEUE places back must be finished */
    if (seq > QUEUE) await(c, &m->done, seq - QUEUE);
    m->q[seq % QUEUE] = (Pending){ coll, data, n, seq, c->kind[coll] };
    m->last_seq[coll] = seq;
    pthread_mutex_lock(&c->mu);
    m->issued = seq;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

double rt_comm_wait(Comm *c, int replica, int coll)
{
    Member *m = &c->m[replica];
    unsigned long seq = m->last_seq[coll];
    if (atomic_load_explicit(&m->done, memory_order_acquire) >= seq) return 0;
    double t0 = now();
    await(c, &m->done, seq);
    return now() - t0;
}

void rt_comm_stats(const Comm *c, int replica, CommStats *s) { *s = c->m[replica].st; }

void rt_comm_reset_stats(Comm *c)
{
    for (int r = 0; r < c->n; r++) memset(&c->m[r].st, 0, sizeof(CommStats));
}

/* ------------------------------------------------------------ for the tests */

typedef struct RingTest { Comm *c; int r; float *buf; long len; } RingTest;

static void *ring_test_main(void *arg)
{
    RingTest *t = arg;
    rt_comm_start(t->c, t->r, 0, t->buf, t->len);
    rt_comm_wait(t->c, t->r, 0);
    return NULL;
}

void rt_ring_allreduce_threads(float **bufs, int n, long len, CommStats *stats)
{
    rt_ring_threads(bufs, n, len, COMM_ALLREDUCE, stats);
}

void rt_ring_threads(float **bufs, int n, long len, CommKind kind, CommStats *stats)
{
    Comm *c = rt_comm_new(n, NULL, 1);
    rt_comm_set_kind(c, 0, kind);
    pthread_t *tid = calloc((size_t)n, sizeof(pthread_t));
    RingTest *t = calloc((size_t)n, sizeof(RingTest));
    for (int r = 0; r < n; r++) {
        t[r] = (RingTest){ c, r, bufs[r], len };
        pthread_create(&tid[r], NULL, ring_test_main, &t[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(tid[r], NULL);
    for (int r = 0; stats && r < n; r++) rt_comm_stats(c, r, &stats[r]);
    free(t);
    free(tid);
    rt_comm_free(c);
}
