/*
** The fusion pass: element-wise work folded into the kernel beside it, so it
** costs no sweep over memory (or no launch) of its own. Lowering reads the
** decisions: a fused node gets no kernel of its own.
**
**   ReLU and its gradient: folded into the kernel before them, whose buffer
**   the fused node shares (cg_fuse's comment lists the pairs). ReLU6, sigmoid
**   and tanh (their gradients read their output) after a linear layer, a
**   BatchNorm or an add: the same (MobileNetV2's BatchNorm + ReLU6).
**
**   The SGD update of a gradient bucket (data parallelism): the updates of
**   parameters whose gradients lie in one bucket buffer are one kernel per
**   group, over the group's parameters one after another. A kernel takes at
**   most CG_MAXARGS (8) buffers, and each parameter (and its momentum) is a
**   persistent buffer of its own (the runtime's Store keeps them by name,
**   shared with the evaluation program and checkpoints), so one kernel
**   cannot take a whole bucket's parameters: it takes the bucket buffer once
**   (the gradients, at their offsets), the SGD scalars, and the parameters
**   and momenta of up to 3 parameters (6 without momentum). So an update of
**   P parameters is P/3 kernels, not P (ResNet-18 on cpu:2: 62 -> 21). The group is lowered
**   at its last update, every member's buffers made by then (a momentum
**   buffer's node comes just before its update), with the first member as
**   its node; only momentum buffers lie between the members. Each element
**   gets the very arithmetic of the unfused kernel: the same numbers.
*/
#include "codegen.h"
#include <stdlib.h>
#include <string.h>

void cg_decisions_init(CgDecisions *d, const Graph *g, Arena *a)
{
    d->node = arena_alloc(a, sizeof(CgNode) * (size_t)(g->n + 1));
    d->cpu_only = false;
    for (int id = 0; id <= g->n; id++)
        d->node[id] = (CgNode){ .fused = -1, .conv = -1, .stats_of = -1, .stats_by = -1, .pool_of = -1, .pool_by = -1,
                                .bn_into_add = -1, .wgrad_pool = -1, .wgrad_bias = -1, .act = -1 };
}

/* The bucket holding the gradient an SGD node reads (through slices and
   reshapes: BatchNorm's gamma and beta share a tensor), or -1. */
static int grad_bucket(const Graph *g, int sgd)
{
    int x = g->nodes[sgd].in[1];
    while (g->nodes[x].op == OP_SLICE || g->nodes[x].op == OP_RESHAPE) x = g->nodes[x].in[0];
    return g->nodes[x].op == OP_ALLREDUCE ? g->nodes[x].attr.bucket : -1;
}

/* SGD updates of one bucket, in groups (the header says why of up to 3 or 7):
   d->node[member].fused = the group's first update, for every member but the first. */
static void fuse_sgd(const Graph *g, CgDecisions *d)
{
    int first = -1, count = 0, bucket = -1;
    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op == OP_STATE) continue;   /* a momentum buffer, made just before its update */
        int b = n->op == OP_SGD ? grad_bucket(g, id) : -1;
        if (b < 0) {
            first = -1;
            continue;
        }
        const Node *f = first >= 0 ? &g->nodes[first] : NULL;
        int most = (CG_MAXARGS - 2) / (n->nin - 1);   /* the gradients' bucket and the scalars take two */
        if (f && b == bucket && n->nin == f->nin && count < most && n->attr.lr == f->attr.lr &&
            n->attr.momentum == f->attr.momentum && n->attr.weight_decay == f->attr.weight_decay &&
            n->attr.nesterov == f->attr.nesterov) {
            d->node[id].fused = first;
            count++;
        } else {
            first = id;
            count = 1;
            bucket = b;
        }
    }
}

/* A convolution followed by ReLU and a 2x2 max pool (LeNet's conv1 and conv2):
   its output gradient is the pool's gradient routed to each window's maximum
   where that is positive, zero at 3 of every 4 places. The weight gradient's
   kernel does the routing itself, window by window, and multiplies only the
   one place per window that is not zero: a quarter of the multiply-adds. The
   bias gradient after it is computed by the same kernel, into its own buffer.
   When nothing else reads the routed gradient (a first convolution: no input
   gradient), it is never written: the pool gradient's kernel goes too (LeNet's
   conv1, one thread: pool, weight and bias gradients 1.44 -> 0.6 ms a step).
   Taken when the routed gradient's users are the weight gradient, a bias
   gradient after it and the input gradient, the convolution has stride 1, no
   padding and a kernel row (K x C floats) of at most 32, and the program runs
   on CPUs (the kernel is C: vectors, and a thread's share of channels). */
static void fuse_pooled_wgrad(const Graph *g, CgDecisions *d, const int *uses)
{
    for (int r = 0; r < g->n; r++) {
        const Node *rn = &g->nodes[r];
        if (rn->op != OP_RELU_BWD || d->node[r].fused < 0) continue;
        int pool = d->node[r].fused;
        const Node *pn = &g->nodes[pool];
        if (pn->op != OP_MAXPOOL_BWD || !d->node[pool].relu_mask || pn->attr.kernel != 2 || pn->attr.stride != 2 || pn->attr.padding != 0) continue;
        const Shape *xs = &pn->shape, *ys = &g->nodes[pn->in[1]].shape;
        if (xs->d[2] != 2 * ys->d[2] || xs->d[3] != 2 * ys->d[3]) continue;
        int wg = -1, bg = -1, xg = -1, others = 0;
        for (int id = r + 1; id < g->n; id++) {
            const Node *n = &g->nodes[id];
            for (int k = 0; k < n->nin; k++) {
                if (n->in[k] != r) continue;
                if (n->op == OP_CONV2D_BWD_W && k == 0 && wg < 0) wg = id;
                else if (n->op == OP_BIAS_BWD && wg >= 0 && bg < 0) bg = id;
                else if (n->op == OP_CONV2D_BWD_X && k == 0 && xg < 0) xg = id;
                else others++;
            }
        }
        if (wg < 0 || others || uses[r] != 1 + (bg >= 0) + (xg >= 0)) continue;
        const Node *wn = &g->nodes[wg];
        if (wn->attr.stride != 1 || wn->attr.padding != 0 || ir_groups(&wn->attr) > 1 || ir_dilation(&wn->attr) > 1 || wn->shape.d[2] > 8 || wn->shape.d[1] * wn->shape.d[2] > 32) continue;
        d->node[wg].wgrad_pool = pool;
        d->node[wg].wgrad_bias = bg;
        if (bg >= 0) d->node[bg].fused = wg;
        if (xg < 0) d->node[pool].fused = d->node[r].fused = wg;   /* the routed gradient: read by nothing else */
    }
}

/* Requires: a verified graph. Produces: each node's record's fused, relu_out and relu_mask (d->node[id]).
     conv2d -> relu            the convolution's store applies max(0, .)
     linear -> relu            the bias epilogue after the GEMM applies it
     bn_apply -> relu          the normalisation's store applies it (BatchNorm, ReLU)
     add -> relu               the sum's store applies it (a residual block's end)
     maxpool2d_grad -> relu_grad(y = the pool's input)
                               the pool gradient is routed only where y > 0
   A producer is fused only when the ReLU is its one user.
   And on CPUs a 2x2 max pool's gradient routed by the weight gradient of the
   convolution before it (fuse_pooled_wgrad), and the SGD updates of a bucket, in
   groups (fuse_sgd). With fusion off
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
                d->node[id].fused = x;
                d->node[x].relu_out = true;
                d->node[x].act = OP_RELU;
            }
        } else if (n->op == OP_RELU6 || n->op == OP_SIGMOID || n->op == OP_TANH) {
            /* activations whose gradient reads their output: the input need never be
               written; fused where the kernel before them ends in a simple epilogue */
            int x = n->in[0];
            Op op = g->nodes[x].op;
            if ((op == OP_LINEAR || op == OP_BN_APPLY || (op == OP_ADD && g->nodes[x].nin == 2)) && uses[x] == 1) {
                d->node[id].fused = x;
                d->node[x].act = (int)n->op;
            }
        } else if (n->op == OP_RELU_BWD) {
            int y = n->in[0], pool = n->in[1];
            const Node *dn = &g->nodes[pool];
            if (dn->op == OP_MAXPOOL_BWD && uses[pool] == 1 && dn->in[0] == y) {
                d->node[id].fused = pool;
                d->node[pool].relu_mask = true;
            }
        }
    }
    /* A max pool of a BatchNorm + ReLU output (ResNet-18's stem): computed plane by
       plane by the BatchNorm's kernel while the plane it just wrote is in L1, where
       a kernel of its own reads the whole map back from memory (ResNet-18: 4.2 ms a
       step). The ReLU output is still written: the pool's gradient reads it. */
    for (int id = 0; opt->fuse && id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op != OP_MAXPOOL) continue;
        int x = n->in[0], b = d->node[x].fused >= 0 && g->nodes[x].op == OP_RELU ? d->node[x].fused : x;
        const Shape *xs = &g->nodes[x].shape;
        if (g->nodes[b].op == OP_BN_APPLY && d->node[b].relu_out && d->node[b].pool_of < 0 && (long)xs->d[2] * xs->d[3] <= 4096) {
            d->node[b].pool_of = id;
            d->node[id].pool_by = b;
        }
    }
    /* A BatchNorm (no ReLU) whose only consumer is an add (a residual block's last
       BatchNorm, before the sum with the skip path): the add's kernel normalises as it
       reads, and the BatchNorm's output is never written. Its backward reads its input
       and statistics, not its output. One such input per add (a kernel takes at most
       8 buffers). */
    for (int id = 0; opt->fuse && id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op != OP_ADD || n->nin != 2 || n->shape.nd != 4) continue;
        for (int k = 0; k < 2; k++) {
            int b = n->in[k];
            if (g->nodes[b].op == OP_BN_APPLY && uses[b] == 1 && d->node[b].act < 0 && d->node[b].pool_of < 0 && d->node[b].fused < 0) {
                d->node[id].bn_into_add = b;
                d->node[b].fused = id;
                break;
            }
        }
    }
    if (opt->fuse && opt->cpu_only) fuse_pooled_wgrad(g, d, uses);
    free(uses);
    if (opt->fuse) fuse_sgd(g, d);
}
