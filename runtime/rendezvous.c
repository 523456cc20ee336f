/*
** The shared-memory sum's coordination (see rendezvous.h). Rounds are
** counted per collective: a replica's k-th gather of coll waits for k * N
** arrivals, its k-th finish for k * N finishes, so nothing is ever reset and
** a fast replica's next round cannot be mistaken for this one.
*/
#include "rendezvous.h"
#include <pthread.h>
#include <stdlib.h>

struct Rendezvous {
    int n, ncolls;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    float **ptr;              /* [coll * n + replica] */
    long *len;                /* [coll] */
    long *arrived, *finished; /* [coll], over all rounds */
    long *rounds;             /* [replica * ncolls + coll]: this replica's gathers */
};

Rendezvous *rt_rv_new(int n, int ncolls)
{
    Rendezvous *rv = calloc(1, sizeof *rv);
    rv->n = n;
    rv->ncolls = ncolls;
    pthread_mutex_init(&rv->mu, NULL);
    pthread_cond_init(&rv->cv, NULL);
    rv->ptr = calloc((size_t)n * (size_t)ncolls + 1, sizeof(float *));
    rv->len = calloc((size_t)ncolls + 1, sizeof(long));
    rv->arrived = calloc((size_t)ncolls + 1, sizeof(long));
    rv->finished = calloc((size_t)ncolls + 1, sizeof(long));
    rv->rounds = calloc((size_t)n * (size_t)ncolls + 1, sizeof(long));
    return rv;
}

void rt_rv_free(Rendezvous *rv)
{
    if (!rv) return;
    pthread_mutex_destroy(&rv->mu);
    pthread_cond_destroy(&rv->cv);
    free(rv->ptr);
    free(rv->len);
    free(rv->arrived);
    free(rv->finished);
    free(rv->rounds);
    free(rv);
}

void rt_rv_arrive(Rendezvous *rv, int replica, int coll, float *data, long len)
{
    pthread_mutex_lock(&rv->mu);
    rv->ptr[(size_t)coll * rv->n + replica] = data;
    rv->len[coll] = len;
    rv->arrived[coll]++;
    pthread_cond_broadcast(&rv->cv);
    pthread_mutex_unlock(&rv->mu);
}

void rt_rv_gather(Rendezvous *rv, int replica, int coll, float **bufs, long *begin, long *end)
{
    long round = ++rv->rounds[(size_t)replica * rv->ncolls + coll];
    pthread_mutex_lock(&rv->mu);
    while (rv->arrived[coll] < round * rv->n) pthread_cond_wait(&rv->cv, &rv->mu);
    for (int j = 0; j < rv->n; j++) bufs[j] = rv->ptr[(size_t)coll * rv->n + j];
    long len = rv->len[coll];
    pthread_mutex_unlock(&rv->mu);
    *begin = len * replica / rv->n;
    *end = len * (replica + 1) / rv->n;
}

void rt_rv_finish(Rendezvous *rv, int replica, int coll)
{
    long round = rv->rounds[(size_t)replica * rv->ncolls + coll];
    pthread_mutex_lock(&rv->mu);
    rv->finished[coll]++;
    pthread_cond_broadcast(&rv->cv);
    while (rv->finished[coll] < round * rv->n) pthread_cond_wait(&rv->cv, &rv->mu);
    pthread_mutex_unlock(&rv->mu);
}

void rt_rv_sum_chunk(float *const *bufs, int n, long begin, long end)
{
    for (long i = begin; i < end; i++) {
        float s = 0.0f;
        for (int j = 0; j < n; j++) s += bufs[j][i];
        for (int j = 0; j < n; j++) bufs[j][i] = s;
    }
}
