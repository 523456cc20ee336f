/*
** Data parallelism in the generated program.
**
** Gradient buckets (ir/dp.c): each bucket is one buffer, its gradients views
** into it at their offsets, so one collective sums them all; the bucket's
** allreduce step comes right after the node that completes it, and its wait
** right before the first step that reads a sum (see cg_dp_prepare). An
** allreduce on its own (--sync-bn's sums) is a copy into a buffer of its own,
** summed and waited at once. Alone, the executor skips collectives.
**
** --accumulate K (buckets even on one replica): right before a bucket's
** collective, a kernel adds the bucket's gradients across the K micro-batches
** of a step in a buffer of its own (kept from run to run), by the mode the
** host sets (Program.accumulate): the first micro-batch copies them there,
** the middle ones add, the last adds that sum into the bucket, which then is
** summed across replicas and applied as ever. The executor skips the
** collectives and the updates of every micro-batch but the last.
*/
#include "lower_internal.h"
#include <stdlib.h>
#include <string.h>


static int new_coll(Lower *L, int src, int dst, long floats, const char *what)
{
    Program *p = L->p;
    p->colls = arena_grow(p->arena, p->colls, sizeof(Collective) * (size_t)p->ncolls, sizeof(Collective) * (size_t)(p->ncolls + 1));
    p->colls[p->ncolls] = (Collective){ src, dst, floats, what };
    return p->ncolls++;
}

static void coll_step(Lower *L, StepKind kind, int node, int coll) { cg_new_step(L, kind, node)->coll = coll; }

static int view_base(const Graph *g, int id)
{
    while (g->nodes[id].op == OP_SLICE || g->nodes[id].op == OP_RESHAPE) id = g->nodes[id].in[0];
    return id;
}

/* The buckets of ir_buckets: one buffer each (the last one float longer, for
   the replicas' stop votes), the gradients as views into it, and for each
   bucket the node after which it is complete: its last gradient computed and
   every reader of the replica's own values done (bn_grad_x reads the
   bn_grad_params it shares a bucket slot with), since the sum is in place. */
void cg_dp_prepare(Lower *L)
{
    const Graph *g = L->g;
    Program *p = L->p;
    int *last = calloc((size_t)g->n + 1, sizeof(int));
    for (int u = 0; u < g->n; u++) {
        const Node *n = &g->nodes[u];
        if (ir_op_kind(n->op) == KIND_VIEW || (n->op == OP_ALLREDUCE && n->attr.bucket >= 0)) continue;
        for (int k = 0; k < n->nin; k++) {
            int v = view_base(g, n->in[k]);
            if (u > last[v]) last[v] = u;
        }
    }
    for (int k = 0; k < g->nbuckets; k++) {
        const IrBucket *bk = &g->buckets[k];
        bool final = k == g->nbuckets - 1;
        char *what = arena_printf(p->arena, "bucket %d:", k);
        int b = cg_new_buf(L, BUF_ACT, dimc(bk->floats + 2 * final), arena_printf(p->arena, "bucket %d", k), -1);
        p->bufs[b].pinned = true;
        L->ready[k] = 0;
        for (int j = 0; j < bk->count; j++) {
            int ar = g->bucket_nodes[bk->first + j], st = g->nodes[ar].in[0];
            L->in_bucket[st] = b;
            L->bucket_at[st] = g->nodes[ar].attr.offset;
            int r = last[st] > st ? last[st] : st;
            if (r > L->ready[k]) L->ready[k] = r;
            what = arena_printf(p->arena, "%s %s", what, g->nodes[ar].name);
        }
        L->bucket_coll[k] = new_coll(L, b, b, bk->floats + 2 * final, what);
        L->bucket_buf[k] = b;
        if (final) {
            p->control = cg_new_buf(L, BUF_VIEW, dimc(2), "stop votes", -1);
            p->bufs[p->control].alias = b;
            p->bufs[p->control].offset = (int)bk->floats;
        }
    }
    free(last);
    if (g->accumulate > 1 && g->nbuckets > 0)
        p->accumulate = cg_new_buf(L, BUF_INPUT, dimc(1), "accumulation mode (0 one batch, 1 first, 2 middle, 3 last micro-batch)", -1);
}

/* --accumulate: bucket k's gradients summed over the step's micro-batches (see the top). */
static void accumulate_bucket(Lower *L, int k, int node)
{
    const IrBucket *bk = &L->g->buckets[k];
    Program *p = L->p;
    int acc = cg_new_buf(L, BUF_KEEP, dimc(bk->floats), arena_printf(p->arena, "bucket %d, summed over micro-batches", k), -1);
    int b[3] = { L->bucket_buf[k], acc, p->accumulate };
    const char *names[3] = { "=grads", "=acc", "mode" };
    cg_kernel(L, node, "accumulate", dimc(bk->floats), 3, b, names);
    cg_text(L, "    /* --accumulate: bucket $k's gradients over the micro-batches of one step. mode 1 (the first): acc = grads;\n"
               "       2: acc += grads; 3 (the last): grads += acc, summed across replicas after; 0 (one batch a step): nothing */\n"
               "    const float m = mode[0];\n"
               "    FOR_EACH(i, ${n}L) {\n"
               "        if (m == 1.0f) acc[i] = grads[i];\n"
               "        else if (m == 2.0f) acc[i] += grads[i];\n"
               "        else if (m == 3.0f) grads[i] += acc[i];\n"
               "    }\n",
            cg_n("k", k), cg_n("n", bk->floats));
    cg_end_kernel(L);
}

/* Before a node's steps: wait for the buckets whose sums it reads. */
void cg_dp_before(Lower *L, int id)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    if (ir_op_kind(n->op) == KIND_VIEW || n->op == OP_ALLREDUCE) return;
    for (int k = 0; k < n->nin; k++) {
        const Node *r = &g->nodes[view_base(g, n->in[k])];
        if (r->op == OP_ALLREDUCE && r->attr.bucket >= 0 && !L->waited[r->attr.bucket]) {
            L->waited[r->attr.bucket] = true;
            coll_step(L, STEP_WAIT, id, L->bucket_coll[r->attr.bucket]);
        }
    }
}

/* After a node's steps: start the buckets it completes. */
void cg_dp_after(Lower *L, int id)
{
    for (int k = 0; k < L->g->nbuckets; k++)
        if (L->ready[k] == id) {
            if (L->p->accumulate >= 0) accumulate_bucket(L, k, id);
            coll_step(L, STEP_ALLREDUCE, id, L->bucket_coll[k]);
        }
}

/* At the end of the step: every bucket finishes within it. */
void cg_dp_finish(Lower *L)
{
    for (int k = 0; k < L->g->nbuckets; k++)
        if (!L->waited[k]) coll_step(L, STEP_WAIT, L->g->n - 1, L->bucket_coll[k]);
}

void cg_lower_allreduce(Lower *L, int id)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    if (n->attr.bucket >= 0) {   /* in a bucket: in place, started by dp_after */
        L->p->node_buf[id] = buf_of(L, n->in[0]);
        return;
    }
    /* on its own (--sync-bn's sums): out of place, waited at once */
    int src = buf_of(L, n->in[0]), dst = cg_out_buf(L, id);
    const char *what = n->name ? n->name : arena_printf(L->p->arena, "%s %%%d", ir_op_name(g->nodes[n->in[0]].op), n->in[0]);
    int c = new_coll(L, src, dst, ir_numel(&n->shape, 1), what);
    coll_step(L, STEP_ALLREDUCE, id, c);
    coll_step(L, STEP_WAIT, id, c);
}
