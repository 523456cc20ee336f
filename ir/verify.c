/*
** The IR verifier, run by the driver after the front end and after autodiff.
** Every node: a valid op; an input count within the op table's min and max
** (ir/ops.def); inputs that are earlier nodes; dimensions positive (dim 0 may
** be N); and the shape rule of its op, checked against its inputs' shapes
** and its attributes, one case per op (no default: -Wswitch names a new op).
** A failure is a bug in a pass, reported as "internal:" at the node's .net
** location with its id and op.
*/
#include "ir.h"
#include <stdarg.h>
#include <string.h>

static const struct { int min_in, max_in; } arity[OP_COUNT] = {
#define X(e, name, kind, mn, mx) [OP_##e] = { mn, mx },
#include "ops.def"
#undef X
};

typedef struct Check {
    const Graph *g;
    Diag *d;
    Arena *tmp;       /* shape strings of the messages */
    int id;           /* the node being checked */
    int bad;          /* problems reported */
} Check;

static bool problem(Check *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool problem(Check *c, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const Node *n = &c->g->nodes[c->id];
    diag_at(c->d, n->loc, "internal: node %%%d (%s) %s", c->id, ir_op_name(n->op), msg);
    c->bad++;
    return false;
}

static const Shape *in_shape(const Check *c, int k) { return &c->g->nodes[c->g->nodes[c->id].in[k]].shape; }
static const char *str(Check *c, const Shape *s) { return ir_shape_str(c->tmp, s); }

static bool rank(Check *c, const char *what, const Shape *s, int nd)
{
    return s->nd == nd || problem(c, "%s %s should have %d dimensions", what, str(c, s), nd);
}

static bool same(Check *c, const char *what, const Shape *s, const char *other, const Shape *t)
{
    return ir_shape_eq(s, t) || problem(c, "%s %s should be the shape of %s %s", what, str(c, s), other, str(c, t));
}

/* A 1-D [n] or 2-D [rows, n] per-channel tensor. */
static bool channels(Check *c, const char *what, const Shape *s, int rows, int n)
{
    bool ok = rows ? s->nd == 2 && s->d[0] == rows && s->d[1] == n : s->nd == 1 && s->d[0] == n;
    if (ok) return true;
    if (rows) return problem(c, "%s %s should be [%d,%d]", what, str(c, s), rows, n);
    return problem(c, "%s %s should be [%d]", what, str(c, s), n);
}

/* The output size of a sliding window of k, stride s, padding p over in. */
static int window(int in, int k, int s, int p) { return s > 0 && in + 2 * p >= k ? (in + 2 * p - k) / s + 1 : -1; }

/* x [N,C,H,W] through a window of k (stride s, padding p) gives y [N,O,OH,OW]; o < 0: O == C. */
static bool windowed(Check *c, const Shape *x, const Shape *y, int o, int k, int s, int p)
{
    if (!rank(c, "input", x, 4) || !rank(c, "output", y, 4)) return false;
    if (k < 1 || s < 1 || p < 0) return problem(c, "has kernel %d, stride %d, padding %d", k, s, p);
    int oh = window(x->d[2], k, s, p), ow = window(x->d[3], k, s, p);
    if (y->d[0] != x->d[0] || y->d[1] != (o < 0 ? x->d[1] : o) || y->d[2] != oh || y->d[3] != ow)
        return problem(c, "maps %s to %s, but a %dx%d window with stride %d and padding %d gives [%s,%d,%d,%d]",
                       str(c, x), str(c, y), k, k, s, p, x->d[0] == IR_BATCH ? "N" : "?", o < 0 ? x->d[1] : o, oh, ow);
    return true;
}

/* x [N,C,H,W], w [O,C,K,K], y [N,O,OH,OW] of a convolution with the node's stride and padding. */
static bool conv(Check *c, const Shape *x, const Shape *w, const Shape *y)
{
    const Node *n = &c->g->nodes[c->id];
    if (!rank(c, "weight", w, 4)) return false;
    if (w->d[2] != w->d[3]) return problem(c, "weight %s is not square", str(c, w));
    if (!rank(c, "input", x, 4)) return false;
    if (w->d[1] != x->d[1])
        return problem(c, "weight %s has %d input channels, the input %s has %d", str(c, w), w->d[1], str(c, x), x->d[1]);
    return windowed(c, x, y, w->d[0], w->d[2], n->i[0], n->i[1]);
}

/* Elements: the constant factor, and whether N multiplies it. */
static long numel_c(const Shape *s, bool *batch)
{
    long e = 1;
    *batch = false;
    for (int k = 0; k < s->nd; k++) {
        if (s->d[k] == IR_BATCH) *batch = true;
        else e *= s->d[k];
    }
    return e;
}

static bool shape_rule(Check *c)
{
    const Graph *g = c->g;
    const Node *n = &g->nodes[c->id];
    const Shape *y = &n->shape;
    switch (n->op) {
    case OP_INPUT:
        return y->nd >= 1 || problem(c, "has no dimensions");
    case OP_LABELS:
        return (y->nd == 1 && y->d[0] == IR_BATCH) || problem(c, "%s should be [N]", str(c, y));
    case OP_PARAM: case OP_STATE:
        if (!n->name) return problem(c, "has no name");
        return y->nd == 0 || y->d[0] != IR_BATCH || problem(c, "%s grows with the batch", str(c, y));
    case OP_CONST:
        return true;
    case OP_CONV2D:
        if (n->nin == 3 && !channels(c, "bias", in_shape(c, 2), 0, in_shape(c, 1)->d[0])) return false;
        return conv(c, in_shape(c, 0), in_shape(c, 1), y);
    case OP_CONV2D_BWD_X:   /* dy, w -> dx */
        return conv(c, y, in_shape(c, 1), in_shape(c, 0));
    case OP_CONV2D_BWD_W:   /* dy, x -> dw */
        return conv(c, in_shape(c, 1), y, in_shape(c, 0));
    case OP_LINEAR: {
        const Shape *x = in_shape(c, 0), *w = in_shape(c, 1);
        if (!rank(c, "input", x, 2) || !rank(c, "weight", w, 2)) return false;
        if (w->d[1] != x->d[1]) return problem(c, "weight %s does not take the input's %d features", str(c, w), x->d[1]);
        if (n->nin == 3 && !channels(c, "bias", in_shape(c, 2), 0, w->d[0])) return false;
        return (y->nd == 2 && y->d[0] == x->d[0] && y->d[1] == w->d[0]) ||
               problem(c, "output %s should be [%s,%d]", str(c, y), x->d[0] == IR_BATCH ? "N" : "?", w->d[0]);
    }
    case OP_LINEAR_BWD_X: {   /* dy[N,O], w[O,F] -> dx[N,F] */
        const Shape *dy = in_shape(c, 0), *w = in_shape(c, 1);
        if (!rank(c, "gradient", dy, 2) || !rank(c, "weight", w, 2) || !rank(c, "output", y, 2)) return false;
        return (dy->d[1] == w->d[0] && y->d[0] == dy->d[0] && y->d[1] == w->d[1]) ||
               problem(c, "maps %s and weight %s to %s", str(c, dy), str(c, w), str(c, y));
    }
    case OP_LINEAR_BWD_W: {   /* dy[N,O], x[N,F] -> dw[O,F] */
        const Shape *dy = in_shape(c, 0), *x = in_shape(c, 1);
        if (!rank(c, "gradient", dy, 2) || !rank(c, "input", x, 2) || !rank(c, "output", y, 2)) return false;
        return (dy->d[0] == x->d[0] && y->d[0] == dy->d[1] && y->d[1] == x->d[1]) ||
               problem(c, "maps %s and input %s to %s", str(c, dy), str(c, x), str(c, y));
    }
    case OP_BIAS_BWD: {
        const Shape *dy = in_shape(c, 0);
        if (dy->nd < 2) return problem(c, "gradient %s has no channel dimension", str(c, dy));
        return channels(c, "output", y, 0, dy->d[1]);
    }
    case OP_BN_STATS:
        return rank(c, "input", in_shape(c, 0), 4) && channels(c, "output", y, 3, in_shape(c, 0)->d[1]);
    case OP_BN_SUM:   /* x -> [C] */
        return rank(c, "input", in_shape(c, 0), 4) && channels(c, "output", y, 0, in_shape(c, 0)->d[1]);
    case OP_BN_SQDEV:   /* x, sum[C] -> [C] */
        return rank(c, "input", in_shape(c, 0), 4) && channels(c, "sum", in_shape(c, 1), 0, in_shape(c, 0)->d[1]) &&
               channels(c, "output", y, 0, in_shape(c, 0)->d[1]);
    case OP_BN_FINISH: {   /* sum[C], sqdev[C] -> [3,C]; the sum must come (through an allreduce) from bn_sum */
        const Node *sum = &g->nodes[n->in[0]];
        if (sum->op != OP_ALLREDUCE || g->nodes[sum->in[0]].op != OP_BN_SUM)
            return problem(c, "finishes %%%d (%s), not the allreduce of a bn_sum", n->in[0], ir_op_name(sum->op));
        int ch = in_shape(c, 0)->d[0];
        return channels(c, "sqdev", in_shape(c, 1), 0, ch) && channels(c, "output", y, 3, ch);
    }
    case OP_ALLREDUCE:   /* a sum over replicas: the shape of its input */
        return same(c, "output", y, "input", in_shape(c, 0)) &&
               (n->i[0] < 0 || n->i[0] < g->nbuckets || problem(c, "is in bucket %d of %d", n->i[0], g->nbuckets));
    case OP_BN_EVAL_STATS:
        return channels(c, "running_var", in_shape(c, 1), 0, in_shape(c, 0)->d[0]) &&
               channels(c, "output", y, 3, in_shape(c, 0)->d[0]);
    case OP_BN_APPLY: {
        const Shape *x = in_shape(c, 0);
        if (!rank(c, "input", x, 4)) return false;
        return channels(c, "stats", in_shape(c, 1), 3, x->d[1]) && channels(c, "gamma", in_shape(c, 2), 0, x->d[1]) &&
               channels(c, "beta", in_shape(c, 3), 0, x->d[1]) && same(c, "output", y, "input", x);
    }
    case OP_BN_BWD_PARAMS: {   /* x, stats, dy -> [2,C] */
        const Shape *x = in_shape(c, 0);
        if (!rank(c, "input", x, 4)) return false;
        return channels(c, "stats", in_shape(c, 1), 3, x->d[1]) && same(c, "gradient", in_shape(c, 2), "input", x) &&
               channels(c, "output", y, 2, x->d[1]);
    }
    case OP_BN_BWD_X: {   /* x, stats, gamma, dy, dparams -> dx */
        const Shape *x = in_shape(c, 0);
        if (!rank(c, "input", x, 4)) return false;
        return channels(c, "stats", in_shape(c, 1), 3, x->d[1]) && channels(c, "gamma", in_shape(c, 2), 0, x->d[1]) &&
               same(c, "gradient", in_shape(c, 3), "input", x) && channels(c, "dparams", in_shape(c, 4), 2, x->d[1]) &&
               same(c, "output", y, "input", x);
    }
    case OP_BN_RUNNING: {   /* stats, running_mean, running_var, updated in place */
        const Node *st = &g->nodes[n->in[0]];
        if (st->op != OP_BN_STATS && st->op != OP_BN_FINISH)
            return problem(c, "updates from %%%d (%s), not bn_stats or bn_finish", n->in[0], ir_op_name(st->op));
        int ch = in_shape(c, 1)->d[0];
        return channels(c, "running_mean", in_shape(c, 1), 0, ch) && channels(c, "running_var", in_shape(c, 2), 0, ch) &&
               channels(c, "stats", &st->shape, 3, ch) && same(c, "shape", y, "running_mean", in_shape(c, 1));
    }
    case OP_RELU: case OP_SIGMOID: case OP_TANH: case OP_DROPOUT_MASK:
        if (n->op == OP_DROPOUT_MASK && !(n->f[0] >= 0 && n->f[0] < 1)) return problem(c, "has p = %g", n->f[0]);
        return same(c, "output", y, "input", in_shape(c, 0));
    case OP_RELU_BWD: case OP_SIGMOID_BWD: case OP_TANH_BWD: case OP_ADD: case OP_MUL:
        return same(c, "input 0", in_shape(c, 0), "output", y) && same(c, "input 1", in_shape(c, 1), "output", y);
    case OP_MAXPOOL: case OP_AVGPOOL:
        return windowed(c, in_shape(c, 0), y, -1, n->i[0], n->i[1], n->i[2]);
    case OP_MAXPOOL_BWD:   /* x, dy -> dx */
        return same(c, "output", y, "input", in_shape(c, 0)) && windowed(c, y, in_shape(c, 1), -1, n->i[0], n->i[1], n->i[2]);
    case OP_AVGPOOL_BWD:   /* dy -> dx */
        return windowed(c, y, in_shape(c, 0), -1, n->i[0], n->i[1], n->i[2]);
    case OP_GAP: case OP_GAP_BWD: {
        const Shape *x = n->op == OP_GAP ? in_shape(c, 0) : y, *p = n->op == OP_GAP ? y : in_shape(c, 0);
        if (!rank(c, "input", x, 4) || !rank(c, "pooled", p, 4)) return false;
        return (p->d[0] == x->d[0] && p->d[1] == x->d[1] && p->d[2] == 1 && p->d[3] == 1) ||
               problem(c, "pools %s to %s, not to [N,%d,1,1]", str(c, x), str(c, p), x->d[1]);
    }
    case OP_RESHAPE: {
        bool xb, yb;
        long xe = numel_c(in_shape(c, 0), &xb), ye = numel_c(y, &yb);
        return (xe == ye && xb == yb) || problem(c, "reshapes %s to %s: not the same elements", str(c, in_shape(c, 0)), str(c, y));
    }
    case OP_SLICE: {
        bool xb, yb;
        long xe = numel_c(in_shape(c, 0), &xb), ye = numel_c(y, &yb);
        return (n->i[0] >= 0 && (xb || !yb) && n->i[0] + ye <= xe) ||
               problem(c, "takes %s at offset %d from %s: not within it", str(c, y), n->i[0], str(c, in_shape(c, 0)));
    }
    case OP_XENT: case OP_ACCURACY: case OP_XENT_BWD: {
        const Shape *l = in_shape(c, 0), *lab = in_shape(c, 1);
        if (!rank(c, "logits", l, 2) || !rank(c, "labels", lab, 1)) return false;
        if (lab->d[0] != l->d[0]) return problem(c, "labels %s do not match logits %s", str(c, lab), str(c, l));
        if (n->op == OP_XENT_BWD)
            return channels(c, "loss gradient", in_shape(c, 2), 0, 1) && same(c, "output", y, "logits", l);
        return channels(c, "output", y, 0, 1);
    }
    case OP_SGD: {
        const Node *p = &g->nodes[n->in[0]];
        if (p->op != OP_PARAM) return problem(c, "updates %%%d (%s), not a parameter", n->in[0], ir_op_name(p->op));
        if (n->nin == 3 && g->nodes[n->in[2]].op != OP_STATE)
            return problem(c, "keeps its momentum in %%%d, not a state buffer", n->in[2]);
        return same(c, "gradient", in_shape(c, 1), "parameter", &p->shape) &&
               (n->nin < 3 || same(c, "momentum buffer", in_shape(c, 2), "parameter", &p->shape)) &&
               same(c, "shape", y, "parameter", &p->shape);
    }
    case OP_COUNT:
        break;
    }
    return problem(c, "is not an op");
}

int ir_verify(const Graph *g, Diag *d)
{
    Arena tmp;
    arena_init(&tmp);
    Check c = { .g = g, .d = d, .tmp = &tmp };
    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        c.id = id;
        if (n->op >= OP_COUNT) {
            diag_at(d, n->loc, "internal: node %%%d has no valid op", id);
            c.bad++;
            continue;
        }
        int before = c.bad;
        if (n->nin < arity[n->op].min_in || n->nin > arity[n->op].max_in) {
            if (arity[n->op].min_in == arity[n->op].max_in)
                problem(&c, "has %d inputs, not %d", n->nin, arity[n->op].min_in);
            else
                problem(&c, "has %d inputs, not %d to %d", n->nin, arity[n->op].min_in, arity[n->op].max_in);
        }
        for (int k = 0; k < n->nin && k < IR_MAXIN; k++)
            if (n->in[k] < 0 || n->in[k] >= id) problem(&c, "input %d is %%%d, not an earlier node", k, n->in[k]);
        if (n->shape.nd < 0 || n->shape.nd > IR_MAXDIM) {
            problem(&c, "has %d dimensions", n->shape.nd);
            continue;
        }
        for (int k = 0; k < n->shape.nd; k++)
            if (n->shape.d[k] <= 0 && !(k == 0 && n->shape.d[k] == IR_BATCH))
                problem(&c, "has dimension %d = %d", k, n->shape.d[k]);
        if (c.bad == before) shape_rule(&c);   /* only over well-formed inputs */
    }
    arena_free(&tmp);
    return c.bad;
}
