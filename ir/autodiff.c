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
** One rule per op, in backward_rule(). A node used several times gets the
** sum of its users' contributions (an ADD node per extra use).
*/
#include "ir.h"
#include <string.h>

typedef struct Ad {
    Graph *g;
    bool *needs;      /* needs[id]: some parameter (or the input) is upstream */
} Ad;

static int mk(Graph *g, Op op, int fwd, Shape s, int nin, const int *in)
{
    int id = ir_node(g, op, g->nodes[fwd].loc, nin, in);
    g->nodes[id].shape = s;
    g->nodes[id].grad_of = fwd;
    return id;
}

static void accumulate(Ad *ad, int x, int contribution)
{
    Graph *g = ad->g;
    if (x < 0 || !ad->needs[x]) return;
    if (g->grad[x] < 0) {
        g->grad[x] = contribution;
    } else {
        int in[2] = { g->grad[x], contribution };
        g->grad[x] = mk(g, OP_ADD, x, g->nodes[x].shape, 2, in);
    }
}

/* Emits d loss / d inputs of forward node y, given dy = g->grad[y]. */
static void backward_rule(Ad *ad, int y)
{
    Graph *g = ad->g;
    Node n = g->nodes[y];   /* copy: g->nodes may move as nodes are added */
    int dy = g->grad[y];
    int x = n.in[0];
    Shape xs = n.nin > 0 ? g->nodes[x].shape : n.shape;
    switch (n.op) {
    case OP_CONV2D: {
        int w = n.in[1];
        if (ad->needs[x]) {
            int in[2] = { dy, w };
            int dx = mk(g, OP_CONV2D_BWD_X, y, xs, 2, in);
            memcpy(g->nodes[dx].i, n.i, sizeof n.i);
            accumulate(ad, x, dx);
        }
        int in[2] = { dy, x };
        int dw = mk(g, OP_CONV2D_BWD_W, y, g->nodes[w].shape, 2, in);
        memcpy(g->nodes[dw].i, n.i, sizeof n.i);
        accumulate(ad, w, dw);
        if (n.nin == 3) accumulate(ad, n.in[2], mk(g, OP_BIAS_BWD, y, g->nodes[n.in[2]].shape, 1, &dy));
        break;
    }
    case OP_LINEAR: {
        int w = n.in[1];
        if (ad->needs[x]) {
            int in[2] = { dy, w };
            accumulate(ad, x, mk(g, OP_LINEAR_BWD_X, y, xs, 2, in));
        }
        int in[2] = { dy, x };
        accumulate(ad, w, mk(g, OP_LINEAR_BWD_W, y, g->nodes[w].shape, 2, in));
        if (n.nin == 3) accumulate(ad, n.in[2], mk(g, OP_BIAS_BWD, y, g->nodes[n.in[2]].shape, 1, &dy));
        break;
    }
    case OP_BN_APPLY: {
        /* Training form: the batch statistics depend on x; bn_grad_x accounts for it. */
        int stats = n.in[1], gamma = n.in[2], beta = n.in[3];
        int c = g->nodes[gamma].shape.d[0];
        int in3[3] = { x, stats, dy };
        int pd[2] = { 2, c };
        int dparams = mk(g, OP_BN_BWD_PARAMS, y, ir_shape_make(2, pd), 3, in3);
        /* With statistics over the global batch (--sync-bn), dx needs the
           two sums over the global batch too; the parameter gradients stay
           this replica's part (the bucket allreduce sums them, or reuses these). */
        bool sync = g->nodes[stats].op == OP_BN_FINISH;
        int dsums = sync ? ir_allreduce(g, g->nodes[y].loc, dparams) : dparams;
        if (sync) g->nodes[dsums].name = arena_printf(g->arena, "%s+bias grads", g->nodes[gamma].name);
        int dgamma = mk(g, OP_SLICE, y, g->nodes[gamma].shape, 1, &dparams);
        g->nodes[dgamma].i[0] = 0;
        int dbeta = mk(g, OP_SLICE, y, g->nodes[beta].shape, 1, &dparams);
        g->nodes[dbeta].i[0] = c;
        accumulate(ad, gamma, dgamma);
        accumulate(ad, beta, dbeta);
        if (ad->needs[x]) {
            int in5[5] = { x, stats, gamma, dy, dsums };
            int dx = mk(g, OP_BN_BWD_X, y, xs, 5, in5);
            g->nodes[dx].i[0] = sync;   /* the mean is over the global count */
            accumulate(ad, x, dx);
        }
        break;
    }
    case OP_RELU: case OP_SIGMOID: case OP_TANH: {
        Op bwd = n.op == OP_RELU ? OP_RELU_BWD : n.op == OP_SIGMOID ? OP_SIGMOID_BWD : OP_TANH_BWD;
        int in[2] = { y, dy };
        accumulate(ad, x, mk(g, bwd, y, xs, 2, in));
        break;
    }
    case OP_MAXPOOL: {
        int in[2] = { x, dy };
        int dx = mk(g, OP_MAXPOOL_BWD, y, xs, 2, in);
        memcpy(g->nodes[dx].i, n.i, sizeof n.i);
        accumulate(ad, x, dx);
        break;
    }
    case OP_AVGPOOL: {
        int dx = mk(g, OP_AVGPOOL_BWD, y, xs, 1, &dy);
        memcpy(g->nodes[dx].i, n.i, sizeof n.i);
        accumulate(ad, x, dx);
        break;
    }
    case OP_GAP:
        accumulate(ad, x, mk(g, OP_GAP_BWD, y, xs, 1, &dy));
        break;
    case OP_RESHAPE:
        accumulate(ad, x, mk(g, OP_RESHAPE, y, xs, 1, &dy));
        break;
    case OP_MUL: {
        int in0[2] = { dy, n.in[1] };
        if (ad->needs[n.in[0]]) accumulate(ad, n.in[0], mk(g, OP_MUL, y, xs, 2, in0));
        int in1[2] = { dy, n.in[0] };
        if (ad->needs[n.in[1]]) accumulate(ad, n.in[1], mk(g, OP_MUL, y, xs, 2, in1));
        break;
    }
    case OP_ADD:
        accumulate(ad, n.in[0], dy);
        accumulate(ad, n.in[1], dy);
        break;
    case OP_XENT: {
        int in[3] = { n.in[0], n.in[1], dy };
        accumulate(ad, n.in[0], mk(g, OP_XENT_BWD, y, g->nodes[n.in[0]].shape, 3, in));
        break;
    }
    /* No gradient flows through these. */
    case OP_INPUT: case OP_LABELS: case OP_PARAM: case OP_STATE: case OP_CONST:
    case OP_BN_STATS: case OP_BN_EVAL_STATS: case OP_DROPOUT_MASK: case OP_ACCURACY:
    case OP_SLICE: case OP_BN_RUNNING: case OP_SGD:
    case OP_XENT_BWD: case OP_CONV2D_BWD_X: case OP_CONV2D_BWD_W: case OP_LINEAR_BWD_X:
    case OP_LINEAR_BWD_W: case OP_BIAS_BWD: case OP_RELU_BWD: case OP_SIGMOID_BWD:
    case OP_TANH_BWD: case OP_MAXPOOL_BWD: case OP_AVGPOOL_BWD: case OP_GAP_BWD:
    case OP_BN_BWD_PARAMS: case OP_BN_BWD_X: case OP_ALLREDUCE: case OP_BN_SUM:
    case OP_BN_SQDEV: case OP_BN_FINISH: case OP_COUNT:
        break;
    }
}

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
        /* statistics, metrics, effects and collectives carry no gradient, whatever feeds them */
        bool never = n->op == OP_BN_STATS || n->op == OP_ACCURACY || n->op == OP_BN_RUNNING || n->op == OP_BN_SUM ||
                     n->op == OP_BN_SQDEV || n->op == OP_BN_FINISH || n->op == OP_ALLREDUCE;
        bool need = !never && (n->op == OP_PARAM || (input_grad && n->op == OP_INPUT));
        for (int k = 0; k < n->nin && !need && !never; k++)
            if (ad.needs[n->in[k]]) need = true;
        ad.needs[id] = need;
    }
    /* Room for every forward node's gradient; backward nodes never get one. */
    g->grad = arena_alloc(g->arena, sizeof(int) * (size_t)nf);
    for (int id = 0; id < nf; id++) g->grad[id] = -1;

    int seed = ir_node(g, OP_CONST, g->nodes[g->loss].loc, 0, NULL);
    g->nodes[seed].shape = g->nodes[g->loss].shape;
    g->nodes[seed].f[0] = 1.0f;
    g->nodes[seed].grad_of = g->loss;
    g->grad[g->loss] = seed;

    for (int y = nf - 1; y >= 0; y--)
        if (g->grad[y] >= 0 && ad.needs[y]) backward_rule(&ad, y);
    return 0;
}

static void sgd_node(Graph *g, const IrSgd *sgd, int p)
{
    int in[3] = { p, g->grad[p], -1 };
    int nin = 2;
    if (sgd->momentum != 0) {
        Node pn = g->nodes[p];
        int buf = ir_node(g, OP_STATE, pn.loc, 0, NULL);
        g->nodes[buf].shape = pn.shape;
        g->nodes[buf].name = arena_printf(g->arena, "%s.momentum_buffer", pn.name);
        g->nodes[buf].init = INIT_ZEROS;
        in[2] = buf;
        nin = 3;
    }
    int u = mk(g, OP_SGD, p, g->nodes[p].shape, nin, in);
    g->nodes[u].f[0] = sgd->lr;
    g->nodes[u].f[1] = sgd->momentum;
    g->nodes[u].f[2] = sgd->weight_decay;
}

int ir_update(Graph *g, const IrSgd *sgd)
{
    if (!g->grad) {
        diag_at(g->diag, (Loc){0}, "internal: the update pass runs after the gradient pass");
        return -1;
    }
    if (g->update_order) {
        for (int k = 0; k < g->nupdate; k++) sgd_node(g, sgd, g->update_order[k]);
        return 0;
    }
    /* in parameter order; an unused parameter has no gradient and no update */
    for (int p = 0; p < g->n_forward; p++)
        if (g->nodes[p].op == OP_PARAM && g->grad[p] >= 0) sgd_node(g, sgd, p);
    return 0;
}
