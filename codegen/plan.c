/*
** The memory plan pass: activation, scratch and input buffers share memory by
** liveness. Requires: a lowered Program (its steps say which buffers each
** touches). Produces: which buffer goes in which slot, and each slot's size,
** for up to max_batch examples; a device allocates the slots when it binds
** the program (runtime/exec.c).
*/
#include "codegen.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Buffer reuse by liveness. Each activation or scratch buffer lives from the
   first step that touches it to the last (a view extends its base's life);
   buffers whose lives do not overlap share one allocation ("slot"), chosen
   best-fit. What the host reads after a run is pinned to a slot of its own.
   Sizes are for max_batch examples. */
void cg_plan_memory(Program *p, long max_batch)
{
    int nb = p->nbufs;
    int *first = malloc(sizeof(int) * (size_t)nb), *last = malloc(sizeof(int) * (size_t)nb);
    int *slot = malloc(sizeof(int) * (size_t)nb), *order = malloc(sizeof(int) * (size_t)nb);
    for (int b = 0; b < nb; b++) first[b] = INT32_MAX, last[b] = -1, slot[b] = -1;
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        int used[CG_MAXARGS + 3], nu = 0;
        switch (s->kind) {
        case STEP_KERNEL: for (int j = 0; j < s->nargs; j++) used[nu++] = s->args[j]; break;
        case STEP_GEMM: used[nu++] = s->a; used[nu++] = s->b; used[nu++] = s->c; break;
        case STEP_ALLREDUCE: case STEP_WAIT: used[nu++] = p->colls[s->coll].src; used[nu++] = p->colls[s->coll].dst; break;
        }
        for (int j = 0; j < nu; j++) {
            int b = cg_base_buf(p, used[j]);
            if (b < 0) continue;
            if (k < first[b]) first[b] = k;
            if (k > last[b]) last[b] = k;
        }
    }
    int n = 0;
    for (int b = 0; b < nb; b++) {
        BufKind kind = p->bufs[b].kind;
        if (kind == BUF_ACT || kind == BUF_WORK || kind == BUF_INPUT) {
            if (first[b] == INT32_MAX) first[b] = last[b] = 0;
            order[n++] = b;
        }
    }
    /* by first use: a simple sweep */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && first[order[j]] < first[order[j - 1]]; j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    size_t *slot_bytes = calloc((size_t)n + 1, sizeof(size_t));
    int *slot_free_after = calloc((size_t)n + 1, sizeof(int));   /* last step of the slot's current tenant */
    bool *slot_pinned = calloc((size_t)n + 1, sizeof(bool));
    int nslots = 0;
    size_t naive = 0;
    for (int i = 0; i < n; i++) {
        int b = order[i];
        size_t bytes = sizeof(float) * (size_t)cg_dim(p->bufs[b].size, max_batch) + 64;
        naive += bytes;
        int best = -1;
        if (!p->bufs[b].pinned && p->bufs[b].kind != BUF_INPUT)
            for (int t = 0; t < nslots; t++) {
                if (slot_pinned[t] || slot_free_after[t] >= first[b]) continue;
                /* best fit: the smallest slot that holds it, else the largest to grow */
                if (best < 0) { best = t; continue; }
                bool fits = slot_bytes[t] >= bytes, bfits = slot_bytes[best] >= bytes;
                if ((fits && (!bfits || slot_bytes[t] < slot_bytes[best])) || (!fits && !bfits && slot_bytes[t] > slot_bytes[best]))
                    best = t;
            }
        if (best < 0) {
            best = nslots++;
            slot_pinned[best] = p->bufs[b].pinned || p->bufs[b].kind == BUF_INPUT;
        }
        if (slot_bytes[best] < bytes) slot_bytes[best] = bytes;
        slot_free_after[best] = last[b];
        slot[b] = best;
    }
    p->slot = arena_alloc(p->arena, sizeof(int) * (size_t)(nb + 1));
    memcpy(p->slot, slot, sizeof(int) * (size_t)nb);
    p->slot_bytes = arena_alloc(p->arena, sizeof(size_t) * (size_t)(nslots + 1));
    memcpy(p->slot_bytes, slot_bytes, sizeof(size_t) * (size_t)nslots);
    p->nslots = nslots;
    p->plan_batch = max_batch;
    p->plan_buffers = n;
    p->plan_naive_bytes = naive;
    p->plan_bytes = 0;
    for (int t = 0; t < nslots; t++) p->plan_bytes += slot_bytes[t];
    free(slot); free(slot_bytes); free(slot_free_after); free(slot_pinned);
    free(first); free(last); free(order);
}

size_t cg_plan_bytes(const Program *p, long batch)
{
    size_t *bytes = calloc((size_t)p->nslots + 1, sizeof(size_t)), total = 0;
    for (int b = 0; b < p->nbufs; b++) {
        int t = p->slot ? p->slot[b] : -1;
        if (t < 0) continue;
        size_t n = sizeof(float) * (size_t)cg_dim(p->bufs[b].size, batch) + 64;
        if (bytes[t] < n) bytes[t] = n;
    }
    for (int t = 0; t < p->nslots; t++) total += (bytes[t] + 63) / 64 * 64;
    free(bytes);
    return total;
}

size_t cg_persistent_bytes(const Program *p)
{
    size_t total = 0;
    for (int b = 0; b < p->nbufs; b++)
        if (p->bufs[b].kind == BUF_PERSISTENT) total += sizeof(float) * (size_t)cg_dim(p->bufs[b].size, 1);
    return total;
}
