/*
** Collectives of a data-parallel group: the replicas of this process
** (threads, each with a device of its own) and, through MPI, those of the
** other ranks of the world.
**
** Every replica starts the same collectives in the same order (they run one
** program). Each replica has a communication thread that works through its
** replica's collectives in order, so a sum overlaps the replica's compute:
**
**   in the process  a ring over shared memory: reduce-scatter, then
**                   all-gather, in N chunks whose sizes differ by at most one
**                   (any size, any N); each replica sends 2(N-1)/N of the data
**   across ranks    after the ring, local replica 0's communication thread sums
**                   the result with the other ranks (MPI_Allreduce, while the
**                   compute threads go on), and the others copy it back
**
** A sum is finished for a replica when every replica of the process is done
** with it, so a replica may reuse its buffer as soon as its wait returns.
*/
#ifndef MGC_COMM_H
#define MGC_COMM_H
#include "world.h"

typedef struct Comm Comm;

/* What a collective does (--shard-update splits the sum in two). The chunk of
   a sum of n floats replica r owns: rt_comm_chunk. */
typedef enum CommKind {
    COMM_ALLREDUCE,           /* every replica gets the sum of all */
    COMM_REDUCE_SCATTER,      /* each replica gets the sum of its own chunk (the rest: partial sums) */
    COMM_ALLGATHER,           /* each replica's own chunk to every replica */
} CommKind;

/* Per replica, since creation or the last reset. */
typedef struct CommStats {
    long ops;                 /* collectives finished */
    double bytes_sent;        /* to the next replica of the ring */
    double bytes_bound;       /* what the ring must send at least: 2(N-1)/N of every sum's bytes */
    double mpi_bytes;         /* handed to MPI (local replica 0 only) */
} CommStats;

/* A group of `local` replicas in this process, joined with the other ranks of
   world (which must all have as many), for collectives 0..ncolls-1. */
Comm *rt_comm_new(int local, World *world, int ncolls);
void  rt_comm_free(Comm *c);
/* Collective coll's kind (default COMM_ALLREDUCE). A reduce-scatter or all-gather of n floats
   takes n a multiple of every replica's count (codegen pads the buckets): each replica owns
   n / (local x ranks) floats of it, the owner-th such chunk. */
void  rt_comm_set_kind(Comm *c, int coll, CommKind kind);
/* The chunk local replica `local` of rank `rank` owns, of ranks x local-per-rank: local x ranks
   + rank (a process's replicas hold neighbouring chunks of each rank's). */
int   rt_comm_owner(int local, int rank, int ranks);
/* Starts summing data[0, n) over the group, in place; returns at once.
   data must not be touched by the replica until rt_comm_wait returns. */
void  rt_comm_start(Comm *c, int replica, int coll, float *data, long n);
/* Waits until the replica's latest start of coll is finished; returns the seconds waited. */
double rt_comm_wait(Comm *c, int replica, int coll);
void  rt_comm_stats(const Comm *c, int replica, CommStats *s);
void  rt_comm_reset_stats(Comm *c);

/* The in-process ring on its own, for tests: sums bufs[0..n)[0, len) in place
   over n threads, one a replica; stats[0..n) (if not NULL) get each replica's. */
void  rt_ring_allreduce_threads(float **bufs, int n, long len, CommStats *stats);
/* The same for one kind of collective (a reduce-scatter or all-gather: len a multiple of n). */
void  rt_ring_threads(float **bufs, int n, long len, CommKind kind, CommStats *stats);

#endif
