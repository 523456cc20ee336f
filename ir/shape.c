/*
** The ops' shape rules, one function each, named by the shape column of
** ir/ops.def (rule_<shape>). A rule gives the output's shape from the
** inputs' shapes and the node's attributes, or says why they do not fit
** together. Where an output's shape cannot be derived from the inputs (an
** input gradient has the shape of the forward input it is the gradient of),
** the rule takes the node's own and checks it against the rest.
**
** ir_op() (ir/graph.c) shapes every node it makes through its rule; ir_verify
** (ir/verify.c) checks every node of a graph against it; the layer builders
** (ir/build.c) check a layer's inputs with it (ir_rule_shape) before they make
** the node, so these messages are the ones a user reads: they say what does
** not fit and, where there is one, the rule it breaks.
*/
#include "ir.h"
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* What a rule reads, and where it says what is wrong. */
typedef struct Rule {
    const Graph *g;
    const Node *n;
    Shape *out;
    char *why;
    size_t size;
    int blame;                /* the input the message is about, or -1 */
    Arena tmp;                /* shape strings of the messages */
} Rule;

static bool no(Rule *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool no(Rule *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, r->size, fmt, ap);
    va_end(ap);
    return false;
}

static const Shape *in(const Rule *r, int k) { return &r->g->nodes[r->n->in[k]].shape; }
static const char *str(Rule *r, const Shape *s) { return ir_shape_str(&r->tmp, s); }
static const char *batch(const Shape *s) { return s->d[0] == IR_BATCH ? "N" : "?"; }

static bool give(Rule *r, int nd, const int *d)
{
    *r->out = ir_shape_make(nd, d);
    return true;
}

static bool rank(Rule *r, const char *what, const Shape *s, int nd)
{
    return s->nd == nd || no(r, "%s %s should have %d dimensions", what, str(r, s), nd);
}

static bool same(Rule *r, const char *what, const Shape *s, const char *other, const Shape *t)
{
    return ir_shape_eq(s, t) || no(r, "%s %s should be the shape of %s %s", what, str(r, s), other, str(r, t));
}

/* A 1-D [n] or 2-D [rows, n] per-channel tensor. */
static bool channels(Rule *r, const char *what, const Shape *s, int rows, int n)
{
    bool ok = rows ? s->nd == 2 && s->d[0] == rows && s->d[1] == n : s->nd == 1 && s->d[0] == n;
    if (ok) return true;
    if (rows) return no(r, "%s %s should be [%d,%d]", what, str(r, s), rows, n);
    return no(r, "%s %s should be [%d]", what, str(r, s), n);
}

/* x [N,C,H,W] through a window of k (the node's stride, padding and dilation):
   [N,O,OH,OW] into *y; o < 0: O = C. */
static bool windowed(Rule *r, const Shape *x, int o, int k, Shape *y)
{
    int s = r->n->attr.stride, p = r->n->attr.padding, dil = ir_dilation(&r->n->attr);
    if (!rank(r, "input", x, 4)) return false;
    if (k < 1 || s < 1 || p < 0) return no(r, "has kernel %d, stride %d, padding %d", k, s, p);
    long long span = (long long)dil * (k - 1) + 1;   /* the inputs a dilated kernel spans */
    if (span > INT_MAX) return no(r, "kernel %d with dilation %d spans too far", k, dil);
    int d[4] = { x->d[0], o < 0 ? x->d[1] : o, 0, 0 };
    for (int axis = 2; axis < 4; axis++) {
        const char *dim = axis == 2 ? "height" : "width";
        long long padded = (long long)x->d[axis] + 2LL * p;
        if (span > padded && dil > 1)
            return no(r, "kernel %d with dilation %d spans %lld inputs, more than the padded input %s %lld (input %d + 2x padding %d)",
                      k, dil, span, dim, padded, x->d[axis], p);
        if (span > padded)
            return no(r, "kernel %d is larger than the padded input %s %lld (input %d + 2x padding %d)", k, dim, padded, x->d[axis], p);
        long long out = (padded - span) / s + 1;
        if (r->n->attr.ceil_mode) {   /* PyTorch's: rounded up, but the last window starts inside the input or its left padding */
            out = (padded - span + s - 1) / s + 1;
            if ((out - 1) * s >= (long long)x->d[axis] + p) out--;
        }
        if (out > INT_MAX) return no(r, "the output %s %lld is too large", dim, out);
        d[axis] = (int)out;
    }
    *y = ir_shape_make(4, d);
    return true;
}

/* The shape a window gives must be the one there is. */
static bool windowed_is(Rule *r, const Shape *x, int o, int k, const Shape *y)
{
    Shape want;
    if (!windowed(r, x, o, k, &want)) return false;
    return ir_shape_eq(&want, y) ||
           no(r, "maps %s to %s, but a %dx%d window with stride %d and padding %d gives %s", str(r, x), str(r, y), k, k,
              r->n->attr.stride, r->n->attr.padding, str(r, &want));
}

/* x [N,C,H,W] and w [O,C/groups,K,K] of a convolution. */
static bool conv_operands(Rule *r, const Shape *x, const Shape *w)
{
    int groups = ir_groups(&r->n->attr);
    if (!rank(r, "weight", w, 4)) return false;
    if (w->d[2] != w->d[3]) return no(r, "weight %s is not square", str(r, w));
    if (!rank(r, "input", x, 4)) return false;
    if (x->d[1] % groups || w->d[0] % groups)
        return no(r, "has %d groups, which do not divide the input %s's channels and the weight %s's outputs",
                  groups, str(r, x), str(r, w));
    if ((long)w->d[1] * groups != x->d[1])
        return no(r, "weight %s has %d input channels a group, the input %s has %d in %d group%s", str(r, w), w->d[1],
                  str(r, x), x->d[1], groups, groups == 1 ? "" : "s");
    return true;
}

/* Elements: the constant factor, and whether N multiplies it. */
static long numel_c(const Shape *s, bool *batched)
{
    long e = 1;
    *batched = false;
    for (int k = 0; k < s->nd; k++) {
        if (s->d[k] == IR_BATCH) *batched = true;
        else e *= s->d[k];
    }
    return e;
}

/* ------------------------------------------------------------------ the rules */

static bool rule_given(Rule *r)   /* input, const: as made */
{
    *r->out = r->n->shape;
    return r->out->nd >= 1 || no(r, "has no dimensions");
}

static bool rule_labels(Rule *r)
{
    int n = IR_BATCH;
    return give(r, 1, &n);
}

static bool rule_persistent(Rule *r)
{
    *r->out = r->n->shape;
    if (!r->n->name) return no(r, "has no name");
    return r->out->nd == 0 || r->out->d[0] != IR_BATCH || no(r, "%s grows with the batch", str(r, r->out));
}

static bool rule_conv2d(Rule *r)   /* x[N,C,H,W], w[O,C,K,K], b[O]? -> [N,O,OH,OW] */
{
    const Shape *x = in(r, 0), *w = in(r, 1);
    if (!conv_operands(r, x, w)) return false;
    if (r->n->nin == 3 && !channels(r, "bias", in(r, 2), 0, w->d[0])) return false;
    return windowed(r, x, w->d[0], w->d[2], r->out);
}

static bool rule_conv2d_grad_x(Rule *r)   /* dy, w -> dx: the input's shape, checked */
{
    const Shape *x = &r->n->shape, *w = in(r, 1);
    *r->out = *x;
    return conv_operands(r, x, w) && windowed_is(r, x, w->d[0], w->d[2], in(r, 0));
}

static bool rule_conv2d_grad_w(Rule *r)   /* dy, x -> dw: the weight's shape, checked */
{
    const Shape *x = in(r, 1), *w = &r->n->shape;
    *r->out = *w;
    return conv_operands(r, x, w) && windowed_is(r, x, w->d[0], w->d[2], in(r, 0));
}

/* A linear layer's operand: [N, F] or [N, T, F] (its last dimension multiplied, the others rows) */
static bool rows_by_features(Rule *r, const char *what, const Shape *s)
{
    return s->nd == 2 || s->nd == 3 || no(r, "%s %s should be [N, features] or [N, T, features]", what, str(r, s));
}

/* s with its last dimension d */
static bool give_last(Rule *r, const Shape *s, int d)
{
    *r->out = *s;
    r->out->d[s->nd - 1] = d;
    return true;
}

static bool rule_linear(Rule *r)   /* x[N,(T,)F], w[O,F], b[O]? -> [N,(T,)O] */
{
    const Shape *x = in(r, 0), *w = in(r, 1);
    if (!rows_by_features(r, "input", x) || !rank(r, "weight", w, 2)) return false;
    int f = x->d[x->nd - 1];
    if (w->d[1] != f) return no(r, "weight %s does not take the input's %d features", str(r, w), f);
    if (r->n->nin == 3 && !channels(r, "bias", in(r, 2), 0, w->d[0])) return false;
    return give_last(r, x, w->d[0]);
}

static bool rule_linear_grad_x(Rule *r)   /* dy[N,(T,)O], w[O,F] -> dx[N,(T,)F] */
{
    const Shape *dy = in(r, 0), *w = in(r, 1);
    if (!rows_by_features(r, "gradient", dy) || !rank(r, "weight", w, 2)) return false;
    if (dy->d[dy->nd - 1] != w->d[0]) return no(r, "gradient %s does not match weight %s", str(r, dy), str(r, w));
    return give_last(r, dy, w->d[1]);
}

static bool rule_linear_grad_w(Rule *r)   /* dy[N,(T,)O], x[N,(T,)F] -> dw[O,F] */
{
    const Shape *dy = in(r, 0), *x = in(r, 1);
    if (!rows_by_features(r, "gradient", dy) || !rows_by_features(r, "input", x)) return false;
    bool rows = dy->nd == x->nd;
    for (int k = 0; rows && k < dy->nd - 1; k++) rows = dy->d[k] == x->d[k];
    if (!rows) return no(r, "gradient %s and input %s differ in their rows", str(r, dy), str(r, x));
    return give(r, 2, (int[]){ dy->d[dy->nd - 1], x->d[x->nd - 1] });
}

static bool rule_bias_grad(Rule *r)   /* dy[N,O,...] -> [O] */
{
    const Shape *dy = in(r, 0);
    if (dy->nd < 2) return no(r, "gradient %s has no channel dimension", str(r, dy));
    return give(r, 1, &dy->d[1]);
}

static bool rule_bn_stats(Rule *r)   /* x[N,C,H,W] -> [3,C] */
{
    return rank(r, "input", in(r, 0), 4) && give(r, 2, (int[]){ 3, in(r, 0)->d[1] });
}

static bool rule_bn_eval_stats(Rule *r)   /* running_mean[C], running_var[C] -> [3,C] */
{
    const Shape *m = in(r, 0);
    if (!rank(r, "running_mean", m, 1) || !channels(r, "running_var", in(r, 1), 0, m->d[0])) return false;
    return give(r, 2, (int[]){ 3, m->d[0] });
}

/* LayerNorm over dimension 1 ([N, F], or [N, C, H, W] at each position): x's positions P */
static int positions(const Shape *x)
{
    int p = 1;
    for (int d = 2; d < x->nd; d++) p *= x->d[d];
    return p;
}

/* LayerNorm's input: [N, F] or [N, C, H, W] */
static bool ln_input(Rule *r, const Shape *x)
{
    return (x->nd >= 2 && x->nd <= 4) ||
           no(r, "the input %s is not [N, features], [N, T, features] or [N, C, H, W]%s", str(r, x),
              x->nd > 4 ? ": give the dimensions it normalises, layernorm(shape = [...]) (nn.LayerNorm's)" : "");
}

/* A LayerNorm's statistics (mean, 1 / sqrt(var + eps)) of x: [N, 2, P], or [N, T, 2] over
   [N, T, D]'s last dimension (ir_ln_channels) */
static Shape ln_stats_shape(const Shape *x)
{
    return x->nd == 3 ? ir_shape_make(3, (int[]){ x->d[0], x->d[1], 2 }) : ir_shape_make(3, (int[]){ x->d[0], 2, positions(x) });
}

static bool rule_ln_stats(Rule *r)   /* x[N,C,...] -> [N,2,P]; x[N,T,D] -> [N,T,2] */
{
    const Shape *x = in(r, 0);
    if (!ln_input(r, x)) return false;
    *r->out = ln_stats_shape(x);
    return true;
}

/* x, stats[N,2,P], gamma[C] and beta[C] (the first k of them) of a LayerNorm */
static bool ln_operands(Rule *r, int k)
{
    const Shape *x = in(r, 0), *st = in(r, 1);
    if (!ln_input(r, x)) return false;
    Shape want = ln_stats_shape(x);
    if (!ir_shape_eq(st, &want)) return no(r, "stats %s do not fit input %s", str(r, st), str(r, x));
    return k < 3 || channels(r, "gamma", in(r, 2), 0, ir_ln_channels(x));
}

static bool rule_ln_apply(Rule *r)   /* x, stats, gamma, beta -> like x */
{
    *r->out = *in(r, 0);
    return ln_operands(r, 3) && channels(r, "beta", in(r, 3), 0, ir_ln_channels(in(r, 0)));
}

static bool rule_ln_grad_params(Rule *r)   /* x, stats, dy -> [2,C] */
{
    const Shape *x = in(r, 0);
    return ln_operands(r, 2) && same(r, "gradient", in(r, 2), "input", x) && give(r, 2, (int[]){ 2, ir_ln_channels(x) });
}

static bool rule_ln_grad_x(Rule *r)   /* x, stats, gamma, dy -> dx */
{
    *r->out = *in(r, 0);
    return ln_operands(r, 3) && same(r, "gradient", in(r, 3), "input", in(r, 0));
}

/* Attention's q [N, Tq, D] and k [N, Tk, D] (and v, k's shape, where v): D split into heads */
static bool attn_operands(Rule *r, bool v)
{
    const Shape *q = in(r, 0), *k = in(r, 1);
    int h = r->n->attr.heads;
    if (q->nd != 3 || k->nd != 3)
        return no(r, "the %s %s are not tokens [N, T, D] (a map [N, C, H, W] becomes them by flatten(2) -> transpose(1, 2))",
                  q->nd != 3 ? "queries" : "keys", str(r, q->nd != 3 ? q : k));
    if (k->d[0] != q->d[0] || k->d[2] != q->d[2])
        return no(r, "the keys %s do not fit the queries %s: both [N, T, D], of one N and D", str(r, k), str(r, q));
    if (h < 1 || q->d[2] % h)
        return no(r, "%d heads do not divide the queries' %d features (each head takes D / heads of them)", h, q->d[2]);
    return !v || same(r, "values", in(r, 2), "keys", k);
}

/* [N, H, Tq]: a number per head and query */
static Shape attn_rows(const Rule *r, const Shape *q)
{
    return ir_shape_make(3, (int[]){ q->d[0], r->n->attr.heads, q->d[1] });
}

static bool rule_attn_stats(Rule *r)   /* q, k -> [N,H,Tq] */
{
    if (!attn_operands(r, false)) return false;
    *r->out = attn_rows(r, in(r, 0));
    return true;
}

static bool rule_attention(Rule *r)   /* q, k, v, lse -> like q */
{
    if (!attn_operands(r, true)) return false;
    Shape rows = attn_rows(r, in(r, 0));
    *r->out = *in(r, 0);
    return same(r, "statistics", in(r, 3), "rows", &rows);
}

static bool rule_attn_delta(Rule *r)   /* o, do -> [N,H,Tq] */
{
    const Shape *o = in(r, 0);
    int h = r->n->attr.heads;
    if (!rank(r, "output", o, 3) || !same(r, "gradient", in(r, 1), "output", o)) return false;
    if (h < 1 || o->d[2] % h) return no(r, "%d heads do not divide %d features", h, o->d[2]);
    *r->out = attn_rows(r, o);
    return true;
}

static bool rule_attn_grad(Rule *r)   /* q, k, v, lse, delta, do -> the gradient of q, k or v */
{
    if (!attn_operands(r, true)) return false;
    Shape rows = attn_rows(r, in(r, 0));
    int which = r->n->op == OP_ATTN_BWD_Q ? 0 : r->n->op == OP_ATTN_BWD_K ? 1 : 2;
    *r->out = *in(r, which);
    return same(r, "statistics", in(r, 3), "rows", &rows) && same(r, "deltas", in(r, 4), "rows", &rows) &&
           same(r, "gradient", in(r, 5), "queries", in(r, 0));
}

static bool rule_transpose(Rule *r)   /* x with d[dim0] and d[dim1] swapped */
{
    const Shape *x = in(r, 0);
    int a = r->n->attr.dim0, b = r->n->attr.dim1;
    if (a < 1 || b < 1 || a >= x->nd || b >= x->nd || a == b)
        return no(r, "swaps dimensions %d and %d of %s: two of 1..%d (dimension 0 is the batch)", a, b, str(r, x), x->nd - 1);
    *r->out = *x;
    r->out->d[a] = x->d[b];
    r->out->d[b] = x->d[a];
    return true;
}

static bool rule_select(Rule *r)   /* x without dimension axis: its index-th slice */
{
    const Shape *x = in(r, 0);
    int a = r->n->attr.axis, i = r->n->attr.index;
    if (a < 1 || a >= x->nd || x->nd < 3) return no(r, "takes dimension %d of %s: one of 1..%d, of a tensor of 3 or 4", a, str(r, x), x->nd - 1);
    if (i < 0 || i >= x->d[a]) return no(r, "takes index %d of dimension %d of %s, which has %d", i, a, str(r, x), x->d[a]);
    Shape o = { x->nd - 1, { 0 } };
    for (int k = 0, j = 0; k < x->nd; k++) if (k != a) o.d[j++] = x->d[k];
    *r->out = o;
    return true;
}

static bool rule_select_grad(Rule *r)   /* dy -> dx, the input's shape (given) */
{
    const Shape *x = &r->n->shape, *dy = in(r, 0);
    int a = r->n->attr.axis;
    *r->out = *x;
    bool fits = a >= 1 && a < x->nd && dy->nd == x->nd - 1;
    for (int k = 0, j = 0; fits && k < x->nd; k++) if (k != a) fits = dy->d[j++] == x->d[k];
    return fits || no(r, "puts %s into %s at dimension %d", str(r, dy), str(r, x), a);
}

static bool rule_reduce_grad(Rule *r) { return rule_select_grad(r); }   /* dy -> dx, the input's shape (given) */

/* a dimension of x to work along: 1..rank - 1 */
static bool along(Rule *r, const char *what)
{
    const Shape *x = in(r, 0);
    int a = r->n->attr.axis;
    return (a >= 1 && a < x->nd) ||
           no(r, "%s dimension %d of %s: one of 1..%d (dimension 0 is the batch: each example on its own)", what, a, str(r, x),
              x->nd - 1);
}

static bool rule_reduce(Rule *r)   /* x without dimension axis */
{
    const Shape *x = in(r, 0);
    if (!along(r, "reduces")) return false;
    Shape o = { x->nd - 1, { 0 } };
    for (int k = 0, j = 0; k < x->nd; k++) if (k != r->n->attr.axis) o.d[j++] = x->d[k];
    *r->out = o;
    return true;
}

static bool rule_softmax(Rule *r)   /* like x */
{
    *r->out = *in(r, 0);
    return along(r, "normalises along");
}

static bool rule_softmax_grad(Rule *r)   /* y, dy -> like y */
{
    *r->out = *in(r, 0);
    return along(r, "normalises along") && (ir_shape_eq(in(r, 0), in(r, 1)) ||
           no(r, "the output %s and its gradient %s differ in shape", str(r, in(r, 0)), str(r, in(r, 1))));
}

/* a [..., M, K] (or [..., K, M] where trans_a), b [..., K, P] (or [..., P, K]) -> [..., M, P]: the
   dimensions before the last two broadcast, as PyTorch's torch.matmul */
static bool rule_matmul(Rule *r)
{
    const Shape *a = in(r, 0), *b = in(r, 1);
    bool ta = r->n->attr.trans_a, tb = r->n->attr.trans_b;
    r->blame = 1;
    if (a->nd < 3 || a->nd != b->nd)
        return no(r, "multiplies %s by %s: two tensors of one rank, 3 to 6 (the batch, ..., then the matrices' two dimensions)",
                  str(r, a), str(r, b));
    int nd = a->nd, M = a->d[nd - (ta ? 1 : 2)], K = a->d[nd - (ta ? 2 : 1)], Kb = b->d[nd - (tb ? 1 : 2)], P = b->d[nd - (tb ? 2 : 1)];
    if (K != Kb)
        return no(r, "multiplies %s by %s: the first's rows have %d elements, the second's columns %d; they must be equal "
                     "(a transpose(...) may be missing)", str(r, a), str(r, b), K, Kb);
    Shape o = *a;
    for (int k = 0; k < nd - 2; k++) {
        if (a->d[k] != b->d[k] && a->d[k] != 1 && b->d[k] != 1)
            return no(r, "multiplies %s by %s: dimension %d is neither equal nor 1 in one of them (broadcast)", str(r, a), str(r, b), k);
        o.d[k] = a->d[k] == 1 ? b->d[k] : a->d[k];
    }
    o.d[nd - 2] = M, o.d[nd - 1] = P;
    *r->out = o;
    return true;
}

static bool rule_bn_apply(Rule *r)   /* x, stats[3,C], gamma[C], beta[C] -> like x */
{
    const Shape *x = in(r, 0);
    if (!rank(r, "input", x, 4)) return false;
    *r->out = *x;
    return channels(r, "stats", in(r, 1), 3, x->d[1]) && channels(r, "gamma", in(r, 2), 0, x->d[1]) &&
           channels(r, "beta", in(r, 3), 0, x->d[1]);
}

static bool rule_same(Rule *r)   /* element-wise over one input */
{
    *r->out = *in(r, 0);
    return true;
}

static bool rule_same2(Rule *r)   /* element-wise over two inputs of one shape */
{
    *r->out = *in(r, 0);
    r->blame = 1;
    return ir_shape_eq(in(r, 0), in(r, 1)) ||
           no(r, "the two inputs have different shapes, %s and %s", str(r, in(r, 0)), str(r, in(r, 1)));
}


/* inputs alike but in dimension 1, side by side along it */
static bool rule_concat(Rule *r)
{
    const Shape *a = in(r, 0);
    int ax = r->n->attr.axis;
    if (ax < 1 || ax >= a->nd)
        return no(r, "joins along dimension %d of %s: one of 1..%d (dimension 0 is the batch)", ax, str(r, a), a->nd - 1);
    Shape o = *a;
    for (int k = 1; k < r->n->nin; k++)   /* the batch: N where any input has it (one of batch 1 is repeated) */
        if (in(r, k)->d[0] != 1) o.d[0] = in(r, k)->d[0];
    for (int k = 1; k < r->n->nin; k++) {
        const Shape *b = in(r, k);
        bool alike = b->nd == a->nd;
        for (int d = 0; alike && d < a->nd; d++)
            alike = d == ax || b->d[d] == a->d[d] || (d == 0 && (b->d[0] == 1 || a->d[0] == 1));
        r->blame = alike ? -1 : k;
        if (!alike && ax == 1)
            return no(r, "input %d has shape %s, input 0 %s: they must be alike but in dimension 1 "
                         "(the channels of [N, C, H, W], the features of [N, F]; a batch of 1 is repeated)", k, str(r, b), str(r, a));
        if (!alike)
            return no(r, "input %d has shape %s, input 0 %s: they must be alike but in dimension %d (a batch of 1 is repeated)", k,
                      str(r, b), str(r, a), ax);
        if ((long long)o.d[ax] + b->d[ax] > INT_MAX)
            return no(r, "the output would have more than %d along dimension %d; make the layer or its inputs smaller", INT_MAX, ax);
        o.d[ax] += b->d[ax];
    }
    *r->out = o;
    return true;
}

/* the channels [offset, offset + C) of the input along dimension axis: the shape given, checked */
static bool rule_channel_slice(Rule *r)
{
    const Shape *x = in(r, 0), *y = &r->n->shape;
    int ax = r->n->attr.axis;
    *r->out = *y;
    bool alike = x->nd == y->nd && ax >= 1 && ax < x->nd;
    for (int d = 0; alike && d < x->nd; d++) alike = d == ax || x->d[d] == y->d[d];
    int off = r->n->attr.offset;
    return (alike && off >= 0 && (long long)off + y->d[ax] <= x->d[ax]) ||
           no(r, "takes %s from index %d of dimension %d of %s: not within it", str(r, y), off, ax, str(r, x));
}

/* Two inputs of one rank broadcast as PyTorch's: each dimension equal, or 1 in one of them. */
static bool rule_broadcast2(Rule *r)
{
    const Shape *a = in(r, 0), *b = in(r, 1);
    const char *rule = "each dimension must be equal, or 1 in one of them ([N, C, H, W] against [N, C, 1, 1], say)";
    r->blame = 1;
    if (a->nd != b->nd) return no(r, "the shapes %s and %s do not broadcast: they differ in rank; %s", str(r, a), str(r, b), rule);
    Shape o = *a;
    for (int k = 0; k < a->nd; k++) {
        if (a->d[k] == b->d[k]) continue;
        if (a->d[k] != 1 && b->d[k] != 1)
            return no(r, "the shapes %s and %s do not broadcast in dimension %d: %s", str(r, a), str(r, b), k, rule);
        o.d[k] = a->d[k] == 1 ? b->d[k] : a->d[k];
    }
    *r->out = o;
    return true;
}

/* x summed to the shape given: each dimension equal to x's, or 1 */
static bool rule_sum_to(Rule *r)
{
    const Shape *x = in(r, 0);
    *r->out = r->n->shape;
    if (x->nd != r->out->nd) return no(r, "sums %s to %s: not of one rank", str(r, x), str(r, r->out));
    for (int k = 0; k < x->nd; k++)
        if (r->out->d[k] != x->d[k] && r->out->d[k] != 1) return no(r, "sums %s to %s: dimension %d", str(r, x), str(r, r->out), k);
    return true;
}

static bool rule_pool(Rule *r)   /* x[N,C,H,W] -> [N,C,OH,OW] */
{
    return windowed(r, in(r, 0), -1, r->n->attr.kernel, r->out);
}

static bool rule_maxpool_grad(Rule *r)   /* x, dy -> dx like x */
{
    *r->out = *in(r, 0);
    return windowed_is(r, in(r, 0), -1, r->n->attr.kernel, in(r, 1));
}

static bool rule_avgpool_grad(Rule *r)   /* dy -> dx: the input's shape, checked */
{
    *r->out = r->n->shape;
    return windowed_is(r, r->out, -1, r->n->attr.kernel, in(r, 0));
}

static bool rule_gap(Rule *r)   /* [N,C,H,W] -> [N,C,1,1] */
{
    const Shape *x = in(r, 0);
    return rank(r, "input", x, 4) && give(r, 4, (int[]){ x->d[0], x->d[1], 1, 1 });
}

static bool rule_gap_grad(Rule *r)   /* dy[N,C,1,1] -> dx[N,C,H,W]: the input's shape, checked */
{
    const Shape *x = &r->n->shape, *p = in(r, 0);
    *r->out = *x;
    if (!rank(r, "input", x, 4) || !rank(r, "pooled", p, 4)) return false;
    return (p->d[0] == x->d[0] && p->d[1] == x->d[1] && p->d[2] == 1 && p->d[3] == 1) ||
           no(r, "pools %s to %s, not to [%s,%d,1,1]", str(r, x), str(r, p), batch(x), x->d[1]);
}

static bool rule_upsample(Rule *r)   /* [N,C,H,W] -> [N,C,sH,sW] */
{
    const Shape *x = in(r, 0);
    int s = r->n->attr.scale;
    if (!rank(r, "input", x, 4)) return false;
    if (s < 1 || (long long)x->d[2] * s > INT_MAX || (long long)x->d[3] * s > INT_MAX) return no(r, "has scale %d", s);
    return give(r, 4, (int[]){ x->d[0], x->d[1], x->d[2] * s, x->d[3] * s });
}

static bool rule_upsample_grad(Rule *r)   /* dy -> dx: the input's shape, checked */
{
    const Shape *x = &r->n->shape, *dy = in(r, 0);
    int s = r->n->attr.scale;
    *r->out = *x;
    if (!rank(r, "input", x, 4) || !rank(r, "gradient", dy, 4)) return false;
    return (dy->d[0] == x->d[0] && dy->d[1] == x->d[1] && dy->d[2] == (long long)x->d[2] * s && dy->d[3] == (long long)x->d[3] * s) ||
           no(r, "takes %s back to %s, not by scale %d", str(r, dy), str(r, x), s);
}

static bool rule_adaptive_avgpool(Rule *r)   /* [N,C,H,W] -> [N,C,height,width] */
{
    const Shape *x = in(r, 0);
    if (!rank(r, "input", x, 4)) return false;
    if (r->n->attr.height < 1 || r->n->attr.width < 1) return no(r, "has an output %dx%d", r->n->attr.height, r->n->attr.width);
    return give(r, 4, (int[]){ x->d[0], x->d[1], r->n->attr.height, r->n->attr.width });
}

static bool rule_adaptive_avgpool_grad(Rule *r)   /* dy -> dx: the input's shape, checked */
{
    const Shape *x = &r->n->shape, *dy = in(r, 0);
    *r->out = *x;
    if (!rank(r, "input", x, 4) || !rank(r, "gradient", dy, 4)) return false;
    return (dy->d[0] == x->d[0] && dy->d[1] == x->d[1] && dy->d[2] == r->n->attr.height && dy->d[3] == r->n->attr.width) ||
           no(r, "takes %s back to %s, not from %dx%d", str(r, dy), str(r, x), r->n->attr.height, r->n->attr.width);
}

static bool rule_global_maxpool_grad(Rule *r)   /* x, dy -> dx like x */
{
    const Shape *x = in(r, 0), *dy = in(r, 1);
    *r->out = *x;
    if (!rank(r, "input", x, 4) || !rank(r, "gradient", dy, 4)) return false;
    return (dy->d[0] == x->d[0] && dy->d[1] == x->d[1] && dy->d[2] == 1 && dy->d[3] == 1) ||
           no(r, "routes %s into %s", str(r, dy), str(r, x));
}

static bool rule_reshape(Rule *r)   /* the same elements: the shape given */
{
    bool xb, yb;
    *r->out = r->n->shape;
    long xe = numel_c(in(r, 0), &xb), ye = numel_c(r->out, &yb);
    return (xe == ye && xb == yb) || no(r, "reshapes %s to %s: not the same elements", str(r, in(r, 0)), str(r, r->out));
}

static bool rule_slice(Rule *r)   /* a contiguous piece from an offset: the shape given */
{
    bool xb, yb;
    *r->out = r->n->shape;
    long xe = numel_c(in(r, 0), &xb), ye = numel_c(r->out, &yb);
    int off = r->n->attr.offset;
    return (off >= 0 && (xb || !yb) && off + ye <= xe) ||
           no(r, "takes %s at offset %d from %s: not within it", str(r, r->out), off, str(r, in(r, 0)));
}

/* logits [N,K] and labels [N] */
static bool logits_labels(Rule *r)
{
    const Shape *l = in(r, 0), *lab = in(r, 1);
    if (!rank(r, "logits", l, 2) || !rank(r, "labels", lab, 1)) return false;
    return lab->d[0] == l->d[0] || no(r, "labels %s do not match logits %s", str(r, lab), str(r, l));
}

static bool rule_xent(Rule *r)   /* logits, labels -> [1] (the loss, or the number correct) */
{
    int one = 1;
    return logits_labels(r) && give(r, 1, &one);
}

static bool rule_xent_grad(Rule *r)   /* logits, labels, dloss[1] -> dlogits */
{
    *r->out = *in(r, 0);
    return logits_labels(r) && channels(r, "loss gradient", in(r, 2), 0, 1);
}

static bool rule_bn_grad_params(Rule *r)   /* x, stats, dy -> [2,C] */
{
    const Shape *x = in(r, 0);
    if (!rank(r, "input", x, 4)) return false;
    return channels(r, "stats", in(r, 1), 3, x->d[1]) && same(r, "gradient", in(r, 2), "input", x) &&
           give(r, 2, (int[]){ 2, x->d[1] });
}

static bool rule_bn_grad_x(Rule *r)   /* x, stats, gamma, dy, dparams -> dx like x */
{
    const Shape *x = in(r, 0);
    if (!rank(r, "input", x, 4)) return false;
    *r->out = *x;
    return channels(r, "stats", in(r, 1), 3, x->d[1]) && channels(r, "gamma", in(r, 2), 0, x->d[1]) &&
           same(r, "gradient", in(r, 3), "input", x) && channels(r, "dparams", in(r, 4), 2, x->d[1]);
}

static bool rule_bn_running(Rule *r)   /* stats, running_mean, running_var, updated in place */
{
    const Node *st = &r->g->nodes[r->n->in[0]];
    if (st->op != OP_BN_STATS && st->op != OP_BN_FINISH)
        return no(r, "updates from %%%d (%s), not bn_stats or bn_finish", r->n->in[0], ir_op_name(st->op));
    const Shape *m = in(r, 1);
    if (!rank(r, "running_mean", m, 1)) return false;
    *r->out = *m;
    return channels(r, "running_var", in(r, 2), 0, m->d[0]) && channels(r, "stats", &st->shape, 3, m->d[0]);
}

static bool rule_sgd(Rule *r)   /* param, grad, momentum buffer? -> the parameter, updated in place */
{
    const Node *p = &r->g->nodes[r->n->in[0]];
    if (p->op != OP_PARAM) return no(r, "updates %%%d (%s), not a parameter", r->n->in[0], ir_op_name(p->op));
    if (r->n->nin == 3 && r->g->nodes[r->n->in[2]].op != OP_STATE)
        return no(r, "keeps its momentum in %%%d, not a state buffer", r->n->in[2]);
    *r->out = p->shape;
    return same(r, "gradient", in(r, 1), "parameter", &p->shape) &&
           (r->n->nin < 3 || same(r, "momentum buffer", in(r, 2), "parameter", &p->shape));
}

static bool rule_adamw(Rule *r)   /* param, grad, exp_avg, exp_avg_sq -> the parameter, updated in place */
{
    const Node *p = &r->g->nodes[r->n->in[0]];
    if (p->op != OP_PARAM) return no(r, "updates %%%d (%s), not a parameter", r->n->in[0], ir_op_name(p->op));
    for (int k = 2; k < 4; k++)
        if (r->g->nodes[r->n->in[k]].op != OP_STATE) return no(r, "keeps a moment in %%%d, not a state buffer", r->n->in[k]);
    *r->out = p->shape;
    return same(r, "gradient", in(r, 1), "parameter", &p->shape) && same(r, "exp_avg", in(r, 2), "parameter", &p->shape) &&
           same(r, "exp_avg_sq", in(r, 3), "parameter", &p->shape);
}

static bool rule_allreduce(Rule *r)   /* a sum over replicas: the shape of its input */
{
    *r->out = *in(r, 0);
    int b = r->n->attr.bucket;
    return b < 0 || b < r->g->nbuckets || no(r, "is in bucket %d of %d", b, r->g->nbuckets);
}

static bool rule_bn_sum(Rule *r)   /* x -> [C] */
{
    return rank(r, "input", in(r, 0), 4) && give(r, 1, &in(r, 0)->d[1]);
}

static bool rule_bn_sqdev(Rule *r)   /* x, sum[C] -> [C] */
{
    return rank(r, "input", in(r, 0), 4) && channels(r, "sum", in(r, 1), 0, in(r, 0)->d[1]) && give(r, 1, &in(r, 0)->d[1]);
}

static bool rule_bn_finish(Rule *r)   /* sum[C], sqdev[C] -> [3,C]; the sum must come (through an allreduce) from bn_sum */
{
    const Graph *g = r->g;
    const Node *sum = &g->nodes[r->n->in[0]];
    if (sum->op != OP_ALLREDUCE || g->nodes[sum->in[0]].op != OP_BN_SUM)
        return no(r, "finishes %%%d (%s), not the allreduce of a bn_sum", r->n->in[0], ir_op_name(sum->op));
    int ch = in(r, 0)->d[0];
    return channels(r, "sqdev", in(r, 1), 0, ch) && give(r, 2, (int[]){ 3, ch });
}

static bool (*const rules[OP_COUNT])(Rule *r) = {
#define X(e, name, kind, mn, mx, attrs, shape, grad, lower, print) [OP_##e] = rule_##shape,
#include "ops.def"
#undef X
};

static bool run_rule(const Graph *g, const Node *n, Shape *out, char *why, size_t size, int *blame)
{
    Rule r = { .g = g, .n = n, .out = out, .why = why, .size = size, .blame = -1 };
    if (blame) *blame = -1;
    if (n->op >= OP_COUNT) {
        snprintf(why, size, "has no valid op");
        return false;
    }
    arena_init(&r.tmp);
    why[0] = 0;
    bool ok = rules[n->op](&r);
    arena_free(&r.tmp);
    if (!ok && blame) *blame = r.blame;
    return ok;
}

bool ir_op_shape(const Graph *g, const Node *n, Shape *out, char *why, size_t size)
{
    return run_rule(g, n, out, why, size, NULL);
}

bool ir_rule_shape(const Graph *g, Op op, int nin, const int *in, const IrAttrs *attr, Shape *out, char *why, size_t size, int *blame)
{
    Node n = { .op = op, .nin = nin, .grad_of = -1 };
    for (int k = 0; k < nin; k++) n.in[k] = in[k];
    if (attr) n.attr = *attr;
    return run_rule(g, &n, out, why, size, blame);
}

int ir_op(Graph *g, Op op, Loc loc, int nin, const int *in_ids, const IrAttrs *attr, const Shape *given)
{
    int id = ir_node(g, op, loc, nin, in_ids);
    Node *n = &g->nodes[id];
    if (attr) n->attr = *attr;
    if (given) n->shape = *given;
    char why[384];
    Shape s;
    bool ok = ir_op_shape(g, n, &s, why, sizeof why);
    if (ok && given && !ir_shape_eq(&s, given)) {
        Arena tmp;
        arena_init(&tmp);
        snprintf(why, sizeof why, "is made %s, but its inputs give %s", ir_shape_str(&tmp, given), ir_shape_str(&tmp, &s));
        arena_free(&tmp);
        ok = false;
    }
    if (!ok) {
        diag_at(g->diag, loc, "internal: node %%%d (%s) %s", id, ir_op_name(op), why);
        return -1;
    }
    g->nodes[id].shape = s;
    return id;
}
