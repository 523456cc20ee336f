/*
** The world of processes (see world.h): MPI when built with it (HAVE_MPI)
** and started by mpirun, else one process.
*/
#include "world.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef HAVE_MPI
#include <mpi.h>
#endif

/* Started by a process manager (mpirun, srun) rather than by hand? */
static bool launched(void)
{
    static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", NULL };
    for (int k = 0; vars[k]; k++)
        if (getenv(vars[k])) return true;
    return false;
}

const char *rt_world_mpi_build(char *buf, size_t size)
{
#if defined(HAVE_MPI) && defined(OMPI_MAJOR_VERSION)
    snprintf(buf, size, "Open MPI %d.%d.%d", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
    return buf;
#elif defined(HAVE_MPI)
    snprintf(buf, size, "MPI %d.%d", MPI_VERSION, MPI_SUBVERSION);
    return buf;
#else
    (void)buf; (void)size;
    return NULL;
#endif
}

int rt_world_init(World *w, int *argc, char ***argv, char *err, size_t err_size)
{
    memset(w, 0, sizeof *w);
    w->size = 1;
    if (!launched()) return 0;
#ifdef HAVE_MPI
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        snprintf(err, err_size, "MPI_Init_thread failed");
        return -1;
    }
    w->mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    if (provided < MPI_THREAD_SERIALIZED) {
        /* one thread at a time calls MPI (a replica's communication thread, or the main thread between epochs) */
        snprintf(err, err_size, "this MPI library gives thread level %d; mgc needs MPI_THREAD_SERIALIZED or better", provided);
        return -1;
    }
    return 0;
#else
    (void)argc; (void)argv;
    if (getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1) {
        snprintf(err, err_size, "started by mpirun with %s processes, but this mgc was built without MPI "
                 "(install libopenmpi-dev and rebuild: make clean && make)", getenv("OMPI_COMM_WORLD_SIZE"));
        return -1;
    }
    (void)err; (void)err_size;
    return 0;
#endif
}

void rt_world_finalize(World *w)
{
#ifdef HAVE_MPI
    if (w->mpi) MPI_Finalize();
#endif
    w->mpi = false;
}

int rt_world_max_status(World *w, int status)
{
#ifdef HAVE_MPI
    if (w->mpi) {
        int all = status;
        MPI_Allreduce(&status, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        return all;
    }
#endif
    (void)w;
    return status;
}

void rt_world_sum_f32(World *w, float *v, long n)
{
#ifdef HAVE_MPI
    /* in pieces that fit an int count */
    for (long at = 0; w->mpi && at < n; at += 1L << 30) {
        long k = n - at < (1L << 30) ? n - at : (1L << 30);
        MPI_Allreduce(MPI_IN_PLACE, v + at, (int)k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
#endif
    (void)w; (void)v; (void)n;
}

void rt_world_reduce_scatter_f32(World *w, const float *v, float *mine, long n)
{
#ifdef HAVE_MPI
    if (w->mpi) {
        MPI_Reduce_scatter_block(v, mine, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return;
    }
#endif
    memmove(mine, v + (long)w->rank * n, sizeof(float) * (size_t)n);
}

void rt_world_allgather_f32(World *w, float *v, long n)
{
#ifdef HAVE_MPI
    if (w->mpi) MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
#endif
    (void)w; (void)v; (void)n;
}

void rt_world_sum_f64(World *w, double *v, int n)
{
#ifdef HAVE_MPI
    if (w->mpi) MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#endif
    (void)w; (void)v; (void)n;
}

void rt_world_max_f64(World *w, double *v, int n)
{
#ifdef HAVE_MPI
    if (w->mpi) MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
#endif
    (void)w; (void)v; (void)n;
}

void rt_world_bcast(World *w, void *data, size_t bytes)
{
#ifdef HAVE_MPI
    for (size_t at = 0; w->mpi && at < bytes; at += 1UL << 30) {
        size_t k = bytes - at < (1UL << 30) ? bytes - at : (1UL << 30);
        MPI_Bcast((char *)data + at, (int)k, MPI_BYTE, 0, MPI_COMM_WORLD);
    }
#endif
    (void)w; (void)data; (void)bytes;
}


void rt_world_allgather(World *w, const void *mine, void *all, size_t bytes)
{
#ifdef HAVE_MPI
    if (w->mpi && bytes <= (1UL << 30)) {
        MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
        return;
    }
#endif
    (void)w;
    memcpy(all, mine, bytes);
}

int rt_world_allgather_within(World *w, const void *mine, void *all, size_t bytes, double seconds)
{
#ifdef HAVE_MPI
    if (w->mpi && seconds > 0 && bytes <= (1UL << 30)) {
        /* nonblocking, asked whether done every millisecond until the deadline */
        MPI_Request rq;
        MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD, &rq);
        struct timespec t0, t, ms = { 0, 1000000 };
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            int done = 0;
            MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
            if (done) return 0;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > seconds) return -1;
            nanosleep(&ms, NULL);
        }
    }
#endif
    (void)seconds;
    rt_world_allgather(w, mine, all, bytes);
    return 0;
}

void rt_world_abort(World *w, int status)
{
#ifdef HAVE_MPI
    if (w->mpi) MPI_Abort(MPI_COMM_WORLD, status);
#endif
    (void)w; (void)status;
}
