/*
** The data-parallel pass: gradients summed across replicas, in buckets.
**
** Requires: the gradient pass (g->grad[]). Runs before the
** update pass, and only for runs with more than one replica.
** Produces: one allreduce node per gradient tensor, tagged with its bucket
** and its offset in the bucket; g->grad[param] then names the summed
** gradient; g->buckets; g->update_order (the parameters bucket by bucket).
**
** The replicas run one and the same graph (SPMD): each computes the
** gradient of the global-batch mean loss over its own shard (the loss
** gradient divides by the global batch, see softmax_cross_entropy_grad), so
** the sum over replicas is exactly the gradient of one device on the whole
** batch, for any split. Buckets take the gradients in the order they are
** ready: the last layers' first; code
** generation lays each bucket's gradients side by side in one buffer and
** starts its collective as soon as the last of them is computed (and read),
** so communication overlaps the rest of the backward pass.
**
** Gradients stored together in one tensor (BatchNorm's dgamma and dbeta are
** two halves of bn_grad_params' output) are summed as that one tensor. With
** --sync-bn that tensor is already summed across replicas for the input
** gradient; the parameters then take that sum, and no bucket carries it.
**
** The order is that in which the backward pass computes the gradients (the
** node ids of the tensors that hold them), which is the reverse of the net's.
*/
#include "ir.h"
#include <string.h>

/* The node whose buffer holds gradient node gn, and gn's offset in it. */
static int storage(const Graph *g, int gn, int *offset)
{
    *offset = 0;
    while (g->nodes[gn].op == OP_SLICE || g->nodes[gn].op == OP_RESHAPE) {
        if (g->nodes[gn].op == OP_SLICE) *offset += g->nodes[gn].attr.offset;
        gn = g->nodes[gn].in[0];
    }
    return gn;
}

/* The gradient of a parameter read from the summed tensor at `offset`. */
static int summed_view(Graph *g, int p, int sum, int offset)
{
    if (offset == 0 && ir_shape_eq(&g->nodes[sum].shape, &g->nodes[p].shape)) return sum;
    int id = ir_op(g, OP_SLICE, g->nodes[p].loc, 1, &sum, &(IrAttrs){ .offset = offset }, &g->nodes[p].shape);
    if (id >= 0) g->nodes[id].grad_of = p;
    return id;
}

int ir_buckets(Graph *g, long bucket_bytes, long first_bytes)
{
    int nf = g->n_forward;
    int nparams = 0;
    for (int p = 0; p < nf; p++) nparams += g->nodes[p].op == OP_PARAM && g->grad[p] >= 0;
    g->update_order = arena_alloc(g->arena, sizeof(int) * (size_t)(nparams + 1));
    g->bucket_nodes = arena_alloc(g->arena, sizeof(int) * (size_t)(nparams + 1));
    g->buckets = arena_alloc(g->arena, sizeof(IrBucket) * (size_t)(nparams + 1));
    g->nupdate = g->nbuckets = 0;
    int nmembers = 0;
    /* summed[id]: the allreduce node of storage node id, once it has one */
    int *summed = arena_alloc(g->arena, sizeof(int) * (size_t)(g->n + 2 * nparams + 1));
    for (int id = 0; id < g->n; id++) summed[id] = -1;
    for (int id = g->n_forward; id < g->n; id++)
        if (g->nodes[id].op == OP_ALLREDUCE) summed[g->nodes[id].in[0]] = id;   /* --sync-bn's sums */

    /* The parameters in the order their gradients are computed: the backward
       pass runs from the last layer to the first. */
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)(nparams + 1)), n = 0;
    for (int p = nf - 1; p >= 0; p--)
        if (g->nodes[p].op == OP_PARAM && g->grad[p] >= 0) {
            int off, st = storage(g, g->grad[p], &off);
            int k = n++;
            for (; k > 0; k--) {   /* insertion sort by the storage node, stable */
                int o, sk = storage(g, g->grad[order[k - 1]], &o);
                if (sk <= st) break;
                order[k] = order[k - 1];
            }
            order[k] = p;
        }
    IrBucket *cur = NULL;
    for (int k = 0; k < n; k++) {
        int p = order[k];
        g->update_order[g->nupdate++] = p;
        int offset, st = storage(g, g->grad[p], &offset);
        if (summed[st] < 0) {
            long floats = ir_numel(&g->nodes[st].shape, 1);
            long cap = cur == g->buckets ? first_bytes : bucket_bytes;   /* the first bucket is small */
            if (!cur || (cur->floats > 0 && 4 * (cur->floats + floats) > cap)) {
                cur = &g->buckets[g->nbuckets++];
                cur->first = nmembers;
                cur->count = 0;
                cur->floats = 0;
            }
            IrAttrs at = { .bucket = (int)(cur - g->buckets), .offset = (int)cur->floats };
            int ar = ir_op(g, OP_ALLREDUCE, g->nodes[st].loc, 1, &st, &at, NULL);
            if (ar < 0) return -1;
            g->nodes[ar].grad_of = g->nodes[st].grad_of;
            g->nodes[ar].name = g->nodes[p].name;
            g->bucket_nodes[nmembers++] = ar;
            cur->count++;
            cur->floats += floats;
            summed[st] = ar;
        } else if (g->nodes[summed[st]].attr.bucket >= 0) {   /* a second parameter in the same tensor */
            g->nodes[summed[st]].name = arena_printf(g->arena, "%s+%s", g->nodes[summed[st]].name, g->nodes[p].name);
        }
        if ((g->grad[p] = summed_view(g, p, summed[st], offset)) < 0) return -1;
    }
    return 0;
}
