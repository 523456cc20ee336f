/*
** The fusion pass: element-wise ReLU and its gradient folded into the kernel
** before them, so they cost no sweep over memory of their own. Lowering
** reads the decisions: a fused node gets no kernel, and shares the buffer of
** the node that computes it.
*/
#include "codegen.h"
#include <stdlib.h>
#include <string.h>

void cg_decisions_init(CgDecisions *d, const Graph *g, Arena *a)
{
    d->fused = arena_alloc(a, sizeof(int) * (size_t)(g->n + 1));
    d->relu_out = arena_alloc(a, sizeof(bool) * (size_t)(g->n + 1));
    d->relu_mask = arena_alloc(a, sizeof(bool) * (size_t)(g->n + 1));
    d->conv = arena_alloc(a, (size_t)(g->n + 1));
    for (int id = 0; id < g->n; id++) {
        d->fused[id] = -1;
        d->relu_out[id] = d->relu_mask[id] = false;
        d->conv[id] = -1;
    }
}

/* Requires: a verified graph. Produces: d->fused, d->relu_out, d->relu_mask.
     conv2d -> relu            the convolution's store applies max(0, .)
     linear -> relu            the bias epilogue after the GEMM applies it
     bn_apply -> relu          the normalisation's store applies it (BatchNorm, ReLU)
     add -> relu               the sum's store applies it (a residual block's end)
     maxpool2d_grad -> relu_grad(y = the pool's input)
                               the pool gradient is routed only where y > 0
   A producer is fused only when the ReLU is its one user. With fusion off
   (opt->fuse false; the driver's MGC_FUSE=0) nothing is: the tests compare both. */
void cg_fuse(const Graph *g, const CgOptions *opt, CgDecisions *d)
{
    int *uses = calloc((size_t)g->n + 1, sizeof(int));
    for (int id = 0; id < g->n; id++)
        for (int k = 0; k < g->nodes[id].nin; k++) uses[g->nodes[id].in[k]]++;
    for (int id = 0; opt->fuse && id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op == OP_RELU) {
            int x = n->in[0];
            Op op = g->nodes[x].op;
            if ((op == OP_CONV2D || op == OP_LINEAR || op == OP_BN_APPLY || op == OP_ADD) && uses[x] == 1) {
                d->fused[id] = x;
                d->relu_out[x] = true;
            }
        } else if (n->op == OP_RELU_BWD) {
            int y = n->in[0], pool = n->in[1];
            const Node *dn = &g->nodes[pool];
            if (dn->op == OP_MAXPOOL_BWD && uses[pool] == 1 && dn->in[0] == y) {
                d->fused[id] = pool;
                d->relu_mask[pool] = true;
            }
        }
    }
    free(uses);
}
