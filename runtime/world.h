/*
** The world: the processes of one run. Without MPI, or when mgc is not
** started by mpirun, it is this process alone (rank 0 of 1). Started by
** `mpirun -np P` in a build with MPI, it is MPI_COMM_WORLD: every call below
** is a collective that every rank makes, in the same order.
**
** MPI appears in runtime/world.c only (behind HAVE_MPI).
*/
#ifndef MGC_WORLD_H
#define MGC_WORLD_H
#include <stdbool.h>
#include <stddef.h>

typedef struct World {
    int rank, size;
    bool mpi;                 /* MPI was initialised (and must be finalised) */
} World;

/* The MPI this build has ("Open MPI 4.1.4"), or NULL when built without it. */
const char *rt_world_mpi_build(char *buf, size_t size);
/* Joins the other ranks when started by mpirun. Returns 0, or -1 with err. */
int  rt_world_init(World *w, int *argc, char ***argv, char *err, size_t err_size);
void rt_world_finalize(World *w);
/* The largest status of all ranks: every rank learns whether one failed. */
int  rt_world_max_status(World *w, int status);
/* In-place sums over the ranks. */
void rt_world_sum_f32(World *w, float *v, long n);
void rt_world_sum_f64(World *w, double *v, int n);
void rt_world_max_f64(World *w, double *v, int n);
/* Reduce-scatter: the sums over the ranks of v[0, size x n), rank r's block [r n, (r + 1) n) into mine. */
void rt_world_reduce_scatter_f32(World *w, const float *v, float *mine, long n);
/* All-gather in place: each rank's block v[r n, (r + 1) n) to every rank. */
void rt_world_allgather_f32(World *w, float *v, long n);
/* Every rank's `bytes` bytes (at most 1 GiB), in rank order: all holds size x bytes. */
void rt_world_allgather(World *w, const void *mine, void *all, size_t bytes);
/* The same with a deadline (seconds; 0: none): 0, or -1 when some rank has
   not come in that time. The collective is then left pending, with mine and
   all in its use: the world can only be ended (rt_world_abort). */
int  rt_world_allgather_within(World *w, const void *mine, void *all, size_t bytes, double seconds);
/* Ends every rank of the world at once, with status as mpirun's (MPI_Abort):
   for a collective some rank will never come to. Returns only without MPI. */
void rt_world_abort(World *w, int status);
/* Rank 0's bytes to every rank. */
void rt_world_bcast(World *w, void *data, size_t bytes);

#endif
