/*
** Reverse-mode automatic differentiation as a graph-to-graph pass.
**
** Two passes. The gradient pass (ir_gradients) requires a forward graph with
** a loss (g->loss), nodes in topological order, and produces backward nodes
** appended after the forward ones and g->grad[id] for every forward node
** that leads to a parameter. The update pass (ir_update) appends one SGD node
** per parameter (with a momentum buffer when momentum != 0). Between the two,
** the data-parallel pass (ir/dp.c) may sum the gradients across replicas.
** The gradients are ordinary IR nodes: later passes fuse, plan and replicate
** them like any other.
**
** One rule per op, named by the grad column of ir/ops.def (grad_<name>
** below). A node used several times gets the sum of its users'
** contributions (an ADD node per extra use).
*/
#include "ir.h"
#include <string.h>

typedef struct Ad {
    Graph *g;
    bool *needs;      /* needs[id]: some parameter (or the input) is upstream */
} Ad;

/* A backward node of the gradient of forward node fwd, of shape s. */
static int mk(Graph *g, Op op, int fwd, Shape s, int nin, const int *in, const IrAttrs *attr)
{
    int id = ir_op(g, op, g->nodes[fwd].loc, nin, in, attr, &s);
    if (id >= 0) g->nodes[id].grad_of = fwd;
    return id;
}

static void accumulate(Ad *ad, int x, int contribution)
{
    Graph *g = ad->g;
    if (x < 0 || contribution < 0 || !ad->needs[x]) return;
    if (g->grad[x] < 0) {
        g->grad[x] = contribution;
    } else {
        int in[2] = { g->grad[x], contribution };
        g->grad[x] = mk(g, OP_ADD, x, g->nodes[x].shape, 2, in, NULL);
    }
}

/* ---- the gradient rules (ops.def's grad column): given dy = g->grad[y],
   each adds d loss / d input to every input of forward node y that needs one */

static void grad_conv2d(Ad *ad, int y, const Node *n, int dy)
{
    Graph *g = ad->g;
    int x = n->in[0], w = n->in[1];
    if (ad->needs[x]) {
        int in[2] = { dy, w };
        accumulate(ad, x, mk(g, OP_CONV2D_BWD_X, y, g->nodes[x].shape, 2, in, &n->attr));
    }
    int in[2] = { dy, x };
    accumulate(ad, w, mk(g, OP_CONV2D_BWD_W, y, g->nodes[w].shape, 2, in, &n->attr));
    if (n->nin == 3) accumulate(ad, n->in[2], mk(g, OP_BIAS_BWD, y, g->nodes[n->in[2]].shape, 1, &dy, NULL));
}

/* conv2d_grad_x as a layer (conv_transpose2d): its input's gradient is the convolution of dy by the
   same weight, the weight's is conv2d's weight gradient with the two roles swapped */
static void grad_conv2d_grad_x(Ad *ad, int y, const Node *n, int dy)
{
    Graph *g = ad->g;
    int x = n->in[0], w = n->in[1];
    if (ad->needs[x]) accumulate(ad, x, mk(g, OP_CONV2D, y, g->nodes[x].shape, 2, (int[]){ dy, w }, &n->attr));
    accumulate(ad, w, mk(g, OP_CONV2D_BWD_W, y, g->nodes[w].shape, 2, (int[]){ x, dy }, &n->attr));
}

static void grad_linear(Ad *ad, int y, const Node *n, int dy)
{
    Graph *g = ad->g;
    int x = n->in[0], w = n->in[1];
    if (ad->needs[x]) {
        int in[2] = { dy, w };
        accumulate(ad, x, mk(g, OP_LINEAR_BWD_X, y, g->nodes[x].shape, 2, in, NULL));
    }
    int in[2] = { dy, x };
    accumulate(ad, w, mk(g, OP_LINEAR_BWD_W, y, g->nodes[w].shape, 2, in, NULL));
    if (n->nin == 3 && g->nodes[dy].shape.nd == 2) accumulate(ad, n->in[2], mk(g, OP_BIAS_BWD, y, g->nodes[n->in[2]].shape, 1, &dy, NULL));
    else if (n->nin == 3) {   /* [N, T, O]: dy summed to [1, 1, O], viewed as [O] */
        Shape s = g->nodes[dy].shape;
        for (int k = 0; k < s.nd - 1; k++) s.d[k] = 1;
        int sum = mk(g, OP_SUM_TO, y, s, 1, &dy, NULL);
        accumulate(ad, n->in[2], mk(g, OP_RESHAPE, y, g->nodes[n->in[2]].shape, 1, &sum, NULL));
    }
}

static void grad_transpose(Ad *ad, int y, const Node *n, int dy)
{
    accumulate(ad, n->in[0], mk(ad->g, OP_TRANSPOSE, y, ad->g->nodes[n->in[0]].shape, 1, &dy, &n->attr));
}

static void grad_select(Ad *ad, int y, const Node *n, int dy)
{
    accumulate(ad, n->in[0], mk(ad->g, OP_SELECT_BWD, y, ad->g->nodes[n->in[0]].shape, 1, &dy, &n->attr));
}

/* sum, mean: dy at every index of the dimension reduced (times 1 / its size for the mean) */
static void grad_reduce(Ad *ad, int y, const Node *n, int dy)
{
    const Shape *xs = &ad->g->nodes[n->in[0]].shape;
    float f = n->op == OP_REDUCE_MEAN ? 1.0f / (float)xs->d[n->attr.axis] : 1.0f;
    accumulate(ad, n->in[0], mk(ad->g, OP_REDUCE_BWD, y, *xs, 1, &dy, &(IrAttrs){ .axis = n->attr.axis, .factor = f }));
}

static void grad_softmax(Ad *ad, int y, const Node *n, int dy)
{
    accumulate(ad, n->in[0], mk(ad->g, OP_SOFTMAX_BWD, y, ad->g->nodes[n->in[0]].shape, 2, (int[]){ y, dy }, &n->attr));
}

/* Attention: each query's do . o (delta), then q's, k's and v's gradients, each
   recomputing the scores from q, k and the log-sum-exps (FlashAttention's backward) */
static void grad_attention(Ad *ad, int y, const Node *n, int dy)
{
    Graph *g = ad->g;
    int delta = mk(g, OP_ATTN_DELTA, y, g->nodes[n->in[3]].shape, 2, (int[]){ y, dy }, &n->attr);
    int in[6] = { n->in[0], n->in[1], n->in[2], n->in[3], delta, dy };
    const Op ops[3] = { OP_ATTN_BWD_Q, OP_ATTN_BWD_K, OP_ATTN_BWD_V };
    for (int k = 0; k < 3; k++)
        if (ad->needs[n->in[k]]) accumulate(ad, n->in[k], mk(g, ops[k], y, g->nodes[n->in[k]].shape, 6, in, &n->attr));
}

/* Training form: the batch statistics depend on x; bn_grad_x accounts for it. */
static void grad_bn_apply(Ad *ad, int y, const Node *n, int dy)
{
    Graph *g = ad->g;
    int x = n->in[0], stats = n->in[1], gamma = n->in[2], beta = n->in[3];
    int c = g->nodes[gamma].shape.d[0];
    int in3[3] = { x, stats, dy };
    int pd[2] = { 2, c };
    int dparams = mk(g, OP_BN_BWD_PARAMS, y, ir_shape_make(2, pd), 3, in3, NULL);
    if (dparams < 0) return;
    /* With statistics over the global batch (--sync-bn), dx needs the
       two sums over the global batch too; the parameter gradients stay
       this replica's part (the bucket allreduce sums them, or reuses these). */
    bool sync = g->nodes[stats].op == OP_BN_FINISH;
    int dsums = sync ? ir_allreduce(g, g->nodes[y].loc, dparams) : dparams;
    if (dsums < 0) return;
    if (sync) g->nodes[dsums].name = arena_printf(g->arena, "%s+bias grads", g->nodes[gamma].name);
    accumulate(ad, gamma, mk(g, OP_SLICE, y, g->nodes[gamma].shape, 1, &dparams, &(IrAttrs){ .offset = 0 }));
    accumulate(ad, beta, mk(g, OP_SLICE, y, g->nodes[beta].shape, 1, &dparams, &(IrAttrs){ .offset = c }));
    if (ad->needs[x]) {
        int in5[5] = { x, stats, gamma, dy, dsums };
        accumulate(ad, x, mk(g, OP_BN_BWD_X, y, g->nodes[x].shape, 5, in5, &(IrAttrs){ .sync = sync }));   /* the mean over the global count */
    }
}

/* LayerNorm: the statistics depend on x; ln_grad_x accounts for it. */
static void grad_ln_apply(Ad *ad, int y, const Node *n, int dy)
{
    Graph *g = ad->g;
    int x = n->in[0], stats = n->in[1], gamma = n->in[2], beta = n->in[3];
    int c = g->nodes[gamma].shape.d[0];
    int in3[3] = { x, stats, dy };
    int dparams = mk(g, OP_LN_BWD_PARAMS, y, ir_shape_make(2, (int[]){ 2, c }), 3, in3, NULL);
    if (dparams < 0) return;
    accumulate(ad, gamma, mk(g, OP_SLICE, y, g->nodes[gamma].shape, 1, &dparams, &(IrAttrs){ .offset = 0 }));
    accumulate(ad, beta, mk(g, OP_SLICE, y, g->nodes[beta].shape, 1, &dparams, &(IrAttrs){ .offset = c }));
    if (ad->needs[x]) {
        int in4[4] = { x, stats, gamma, dy };
        accumulate(ad, x, mk(g, OP_LN_BWD_X, y, g->nodes[x].shape, 4, in4, NULL));
    }
}

/* The activations (ir/activations.def): each its gradient op, reading the
   forward's input or its output, and dy. */
static const struct { Op bwd; bool reads_y; } activations[OP_COUNT] = {
#define ACT(e, name, at, reads, fwd, bwd, vec) [OP_##e] = { OP_##e##_BWD, #reads[0] == 'Y' },
#include "activations.def"
#undef ACT
};

Op ir_activation_grad(Op op)
{
    return (unsigned)op < OP_COUNT && activations[op].bwd ? activations[op].bwd : OP_COUNT;   /* OP_INPUT (0): no activation */
}

bool ir_activation_reads_y(Op op)
{
    return ir_activation_grad(op) != OP_COUNT && activations[op].reads_y;
}

static void grad_activation(Ad *ad, int y, const Node *n, int dy)
{
    int in[2] = { activations[n->op].reads_y ? y : n->in[0], dy };
    accumulate(ad, n->in[0], mk(ad->g, activations[n->op].bwd, y, ad->g->nodes[n->in[0]].shape, 2, in, &n->attr));
}

static void grad_maxpool(Ad *ad, int y, const Node *n, int dy)
{
    int in[2] = { n->in[0], dy };
    accumulate(ad, n->in[0], mk(ad->g, OP_MAXPOOL_BWD, y, ad->g->nodes[n->in[0]].shape, 2, in, &n->attr));
}

static void grad_avgpool(Ad *ad, int y, const Node *n, int dy)
{
    accumulate(ad, n->in[0], mk(ad->g, OP_AVGPOOL_BWD, y, ad->g->nodes[n->in[0]].shape, 1, &dy, &n->attr));
}

static void grad_gap(Ad *ad, int y, const Node *n, int dy)
{
    accumulate(ad, n->in[0], mk(ad->g, OP_GAP_BWD, y, ad->g->nodes[n->in[0]].shape, 1, &dy, NULL));
}

static void grad_upsample(Ad *ad, int y, const Node *n, int dy)
{
    accumulate(ad, n->in[0], mk(ad->g, OP_UPSAMPLE_BWD, y, ad->g->nodes[n->in[0]].shape, 1, &dy, &n->attr));
}

static void grad_adaptive_avgpool(Ad *ad, int y, const Node *n, int dy)
{
    accumulate(ad, n->in[0], mk(ad->g, OP_ADAPTIVE_AVGPOOL_BWD, y, ad->g->nodes[n->in[0]].shape, 1, &dy, &n->attr));
}

static void grad_global_maxpool(Ad *ad, int y, const Node *n, int dy)
{
    int in[2] = { n->in[0], dy };
    accumulate(ad, n->in[0], mk(ad->g, OP_GLOBAL_MAXPOOL_BWD, y, ad->g->nodes[n->in[0]].shape, 2, in, NULL));
}

static void grad_reshape(Ad *ad, int y, const Node *n, int dy)
{
    accumulate(ad, n->in[0], mk(ad->g, OP_RESHAPE, y, ad->g->nodes[n->in[0]].shape, 1, &dy, NULL));
}

/* A gradient g (of y's shape) to x's: summed over the dimensions x broadcast along. */
static int unbroadcast(Ad *ad, int y, int g, int x)
{
    const Shape *xs = &ad->g->nodes[x].shape;
    if (g < 0 || ir_shape_eq(&ad->g->nodes[g].shape, xs)) return g;
    return mk(ad->g, OP_SUM_TO, y, *xs, 1, &g, NULL);
}

static void grad_mul(Ad *ad, int y, const Node *n, int dy)
{
    Shape s = ad->g->nodes[y].shape;
    for (int k = 0; k < 2; k++) {
        int x = n->in[k], in[2] = { dy, n->in[1 - k] };
        if (ad->needs[x]) accumulate(ad, x, unbroadcast(ad, y, mk(ad->g, OP_MUL, y, s, 2, in, NULL), x));
    }
}

static void grad_sub(Ad *ad, int y, const Node *n, int dy)
{
    if (ad->needs[n->in[0]]) accumulate(ad, n->in[0], unbroadcast(ad, y, dy, n->in[0]));
    if (ad->needs[n->in[1]])
        accumulate(ad, n->in[1], unbroadcast(ad, y, mk(ad->g, OP_NEG, y, ad->g->nodes[y].shape, 1, &dy, NULL), n->in[1]));
}

/* each input its channels of dy */
static void grad_concat(Ad *ad, int y, const Node *n, int dy)
{
    int at = 0;
    for (int k = 0; k < n->nin; k++) {
        int x = n->in[k];
        const Shape *xs = &ad->g->nodes[x].shape;
        Shape s = *xs;   /* an input of batch 1 (a param: a class token) repeated for every example: summed back */
        s.d[0] = ad->g->nodes[y].shape.d[0];
        if (ad->needs[x])
            accumulate(ad, x, unbroadcast(ad, y, mk(ad->g, OP_CHANNEL_SLICE, y, s, 1, &dy, &(IrAttrs){ .axis = n->attr.axis, .offset = at }), x));
        at += xs->d[n->attr.axis];
    }
}

/* dy to each input, summed over the dimensions it was broadcast along */
static void grad_add(Ad *ad, int y, const Node *n, int dy)
{
    for (int k = 0; k < 2; k++)
        if (ad->needs[n->in[k]]) accumulate(ad, n->in[k], unbroadcast(ad, y, dy, n->in[k]));
}

/* y = a b: da = dy b^T, db = a^T dy (each as the operands' transposes say), summed over the
   dimensions an operand was broadcast along */
static void grad_matmul(Ad *ad, int y, const Node *n, int dy)
{
    Graph *g = ad->g;
    int a = n->in[0], b = n->in[1];
    bool ta = n->attr.trans_a, tb = n->attr.trans_b;
    Shape s = g->nodes[y].shape;
    int nd = s.nd;
    if (ad->needs[a]) {   /* da = dy b^T, or (where trans_a) b dy^T */
        Shape as = s;
        as.d[nd - 2] = g->nodes[a].shape.d[nd - 2], as.d[nd - 1] = g->nodes[a].shape.d[nd - 1];
        int da = ta ? mk(g, OP_MATMUL, y, as, 2, (int[]){ b, dy }, &(IrAttrs){ .trans_a = tb, .trans_b = true })
                    : mk(g, OP_MATMUL, y, as, 2, (int[]){ dy, b }, &(IrAttrs){ .trans_b = !tb });
        accumulate(ad, a, unbroadcast(ad, y, da, a));
    }
    if (ad->needs[b]) {   /* db = a^T dy, or (where trans_b) dy^T a */
        Shape bs = s;
        bs.d[nd - 2] = g->nodes[b].shape.d[nd - 2], bs.d[nd - 1] = g->nodes[b].shape.d[nd - 1];
        int db = tb ? mk(g, OP_MATMUL, y, bs, 2, (int[]){ dy, a }, &(IrAttrs){ .trans_a = true, .trans_b = ta })
                    : mk(g, OP_MATMUL, y, bs, 2, (int[]){ a, dy }, &(IrAttrs){ .trans_a = !ta });
        accumulate(ad, b, unbroadcast(ad, y, db, b));
    }
}

static void grad_xent(Ad *ad, int y, const Node *n, int dy)
{
    int in[3] = { n->in[0], n->in[1], dy };
    accumulate(ad, n->in[0], mk(ad->g, OP_XENT_BWD, y, ad->g->nodes[n->in[0]].shape, 3, in, &n->attr));
}

#define grad_none NULL
static void (*const grad_rules[OP_COUNT])(Ad *ad, int y, const Node *n, int dy) = {
#define X(e, name, kind, mn, mx, attrs, shape, grad, lower, print) [OP_##e] = grad_##grad,
#include "ops.def"
#undef X
};
#undef grad_none

bool ir_op_has_gradient(Op op) { return op < OP_COUNT && grad_rules[op]; }

int ir_gradients(Graph *g, bool input_grad)
{
    if (g->loss < 0) {
        diag_at(g->diag, (Loc){0}, "the net has no loss: end the chain it returns with softmax_cross_entropy");
        return -1;
    }
    int nf = g->n;
    g->n_forward = nf;
    Ad ad = { .g = g };
    ad.needs = arena_alloc(g->arena, sizeof(bool) * (size_t)nf);
    for (int id = 0; id < nf; id++) {
        const Node *n = &g->nodes[id];
        /* the sources of gradients, and what depends on them through ops that
           have a gradient rule (statistics, metrics, masks, effects and
           collectives carry none, whatever feeds them) */
        bool need = n->op == OP_PARAM || (input_grad && n->op == OP_INPUT);
        for (int k = 0; k < n->nin && !need && ir_op_has_gradient(n->op); k++)
            if (ad.needs[n->in[k]]) need = true;
        ad.needs[id] = need;
    }
    /* Room for every forward node's gradient; backward nodes never get one. */
    g->grad = arena_alloc(g->arena, sizeof(int) * (size_t)nf);
    for (int id = 0; id < nf; id++) g->grad[id] = -1;

    int seed = ir_op(g, OP_CONST, g->nodes[g->loss].loc, 0, NULL, &(IrAttrs){ .value = 1.0f }, &g->nodes[g->loss].shape);
    if (seed < 0) return -1;
    g->nodes[seed].grad_of = g->loss;
    g->grad[g->loss] = seed;

    int errors = g->diag->errors;
    for (int y = nf - 1; y >= 0; y--)
        if (g->grad[y] >= 0 && ad.needs[y] && grad_rules[g->nodes[y].op]) {
            Node n = g->nodes[y];   /* a copy: g->nodes may move as nodes are added */
            grad_rules[n.op](&ad, y, &n, g->grad[y]);
        }
    return g->diag->errors > errors ? -1 : 0;
}

/* A state buffer of parameter p, named p.name + suffix (PyTorch's optimizer state's names), zeros. */
static int state_of(Graph *g, int p, const char *suffix)
{
    Node pn = g->nodes[p];
    int buf = ir_node(g, OP_STATE, pn.loc, 0, NULL);
    g->nodes[buf].shape = pn.shape;
    g->nodes[buf].name = arena_printf(g->arena, "%s.%s", pn.name, suffix);
    g->nodes[buf].init = INIT_ZEROS;
    return buf;
}

static void update_node(Graph *g, const IrOptimizer *o, int p)
{
    if (o->kind == IR_ADAMW) {
        int in[4] = { p, g->grad[p], state_of(g, p, "exp_avg"), state_of(g, p, "exp_avg_sq") };
        mk(g, OP_ADAMW, p, g->nodes[p].shape, 4, in,
           &(IrAttrs){ .lr = o->lr, .weight_decay = o->weight_decay, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps });
        return;
    }
    int in[3] = { p, g->grad[p], -1 };
    int nin = 2;
    if (o->momentum != 0) in[2] = state_of(g, p, "momentum_buffer"), nin = 3;
    mk(g, OP_SGD, p, g->nodes[p].shape, nin, in,
       &(IrAttrs){ .lr = o->lr, .momentum = o->momentum, .weight_decay = o->weight_decay, .nesterov = o->nesterov });
}

int ir_update(Graph *g, const IrOptimizer *opt)
{
    if (!g->grad) {
        diag_at(g->diag, (Loc){0}, "internal: the update pass runs after the gradient pass");
        return -1;
    }
    if (g->update_order) {
        for (int k = 0; k < g->nupdate; k++) update_node(g, opt, g->update_order[k]);
        return 0;
    }
    /* in parameter order; an unused parameter has no gradient and no update */
    for (int p = 0; p < g->n_forward; p++)
        if (g->nodes[p].op == OP_PARAM && g->grad[p] >= 0) update_node(g, opt, p);
    return 0;
}
