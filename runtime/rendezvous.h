/*
** A sum over the buffers of replicas that share one memory (several replicas
** on one GPU): no ring, since every replica can read every buffer. Each
** replica owns the chunk [begin, end) of every collective (sizes within one
** of each other) and writes its sum into every replica's copy: a
** reduce-scatter and an all-gather in one pass, each replica reading and
** writing 2(N-1)/N of the data like a ring. Elements are added in replica
** order, so every replica gets the same bits.
**
** This file is the host-side coordination only; the summing is the
** caller's (a kernel on the GPU, rt_rv_sum_chunk on the host), so the tests
** exercise the same protocol the CUDA device runs. Per collective, in order:
**   rt_rv_arrive   the replica's data is ready (or queued to be): at once
**   rt_rv_gather   blocks until every replica has arrived; gives the buffers
**                  and this replica's chunk
**   (the caller sums its chunk into every buffer)
**   rt_rv_finish   blocks until every replica's chunk is summed (or queued)
** A replica may reuse its buffer when rt_rv_finish returns.
*/
#ifndef MGC_RENDEZVOUS_H
#define MGC_RENDEZVOUS_H

typedef struct Rendezvous Rendezvous;

#define RV_MAX 8              /* replicas that can share one memory */

Rendezvous *rt_rv_new(int n, int ncolls);
void rt_rv_free(Rendezvous *rv);
void rt_rv_arrive(Rendezvous *rv, int replica, int coll, float *data, long len);
/* bufs[0..n): every replica's buffer; [*begin, *end): this replica's chunk. */
void rt_rv_gather(Rendezvous *rv, int replica, int coll, float **bufs, long *begin, long *end);
void rt_rv_finish(Rendezvous *rv, int replica, int coll);
/* The owner's pass on the host: bufs[j][i] = sum over k of bufs[k][i], k in order, for i in [begin, end). */
void rt_rv_sum_chunk(float *const *bufs, int n, long begin, long end);

#endif
