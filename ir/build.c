/*
** Layer builders: the front end's way into the IR. Their arguments are the
** front end's, checked there against the layer table's ranges (frontend/
** layers.c). Each builder checks its inputs' shapes by the op's shape rule
** (ir/shape.c, through rule_fits: a rule is written once, and its message is
** the user's), reports a mismatch at the layer's .net location, creates the
** layer's parameters (named "<prefix>.weight" / "<prefix>.bias", initialised
** as PyTorch initialises them) and returns the id of the layer's output. Its
** own checks are those a parameter's shape needs before the rule can run (the
** input's rank, conv2d's groups, the logits' before the labels are made) and
** the sizes that must fit an int (within).
*/
#include "ir.h"
#include <limits.h>
#include <stdio.h>
#include <string.h>

/* Every size is computed in 64 bits and checked before a shape holds it: a
   tensor has at most IR_MAX_ELEMS elements per example (a parameter at most
   that many in all), so every count, offset and constant in the generated code
   fits an int, whatever the batch. */
#define IR_MAX_ELEMS INT_MAX

static bool within(Graph *g, Loc loc, const char *layer, const char *what, int nd, const long long *d)
{
    long long n = 1;
    bool over = false;
    for (int k = 0; k < nd; k++) {
        if (d[k] == IR_BATCH) continue;
        if (d[k] > IR_MAX_ELEMS || n > IR_MAX_ELEMS / d[k]) over = true;
        else n *= d[k];
    }
    if (!over) return true;
    char dims[160];
    int len = 0;
    for (int k = 0; k < nd && len < (int)sizeof dims - 24; k++)
        len += d[k] == IR_BATCH ? snprintf(dims + len, sizeof dims - (size_t)len, "%sN", k ? "," : "")
                                : snprintf(dims + len, sizeof dims - (size_t)len, "%s%lld", k ? "," : "", d[k]);
    diag_at(g->diag, loc, "%s: %s [%s] would have more than %d elements%s; make the layer or its input smaller",
            layer, what, dims, IR_MAX_ELEMS, nd && d[0] == IR_BATCH ? " per example" : "");
    return false;
}

static bool shape_within(Graph *g, Loc loc, const char *layer, const char *what, const Shape *s)
{
    long long d[IR_MAXDIM];
    for (int k = 0; k < s->nd; k++) d[k] = s->d[k];
    return within(g, loc, layer, what, s->nd, d);
}

static const char *shape_str(Graph *g, int id) { return ir_shape_str(g->arena, &g->nodes[id].shape); }

/* Whether inputs in[0..nin) fit together as op's, by its shape rule (ir/shape.c): where
   they do, the output's shape in *out; where they do not, the rule's message at loc,
   after the layer's name (NULL: the op's), and (blame not NULL) the input it is about
   in *blame, or -1. */
static bool rule_fits(Graph *g, Loc loc, const char *layer, Op op, int nin, const int *in, const IrAttrs *attr, Shape *out,
                      int *blame)
{
    char why[384];
    if (ir_rule_shape(g, op, nin, in, attr, out, why, sizeof why, blame)) return true;
    diag_at(g->diag, loc, "%s: %s", layer ? layer : ir_op_name(op), why);
    return false;
}

static int unary(Graph *g, Op op, Loc loc, int x, const IrAttrs *attr)
{
    return ir_op(g, op, loc, 1, &x, attr, NULL);
}

static int binary(Graph *g, Op op, Loc loc, int a, int b, const IrAttrs *attr)
{
    int in[2] = { a, b };
    return ir_op(g, op, loc, 2, in, attr, NULL);
}

/* A persistent tensor: a trainable PARAM or a STATE buffer. */
static int persistent(Graph *g, Op op, Loc loc, const char *name, Shape s, InitKind init, int fan_in)
{
    if (ir_find_param(g, name) >= 0) {
        diag_at(g->diag, loc, "duplicate parameter name '%s'; give this layer a different label", name);
        return -1;
    }
    int id = ir_node(g, op, loc, 0, NULL);
    Node *n = &g->nodes[id];
    n->shape = s;
    n->name = arena_strdup(g->arena, name);
    n->init = init;
    n->fan_in = fan_in;
    return id;
}

int ir_param(Graph *g, Loc loc, const char *name, Shape s, InitKind init, float arg)
{
    for (int k = 0; k < s.nd; k++)
        if (s.d[k] < 1) {
            diag_at(g->diag, loc, "param '%s': dimension %d is %d; each must be at least 1", name, k, s.d[k]);
            return -1;
        }
    if (s.nd < 1 || s.nd > IR_MAXDIM) {
        diag_at(g->diag, loc, "param '%s' has %d dimensions; it can have 1 to %d", name, s.nd, IR_MAXDIM);
        return -1;
    }
    if (!shape_within(g, loc, "param", name, &s)) return -1;
    int id = persistent(g, OP_PARAM, loc, name, s, init, 0);
    if (id >= 0) g->nodes[id].init_arg = arg;
    return id;
}

static const char *pname(Graph *g, const char *prefix, const char *leaf)
{
    return prefix && *prefix ? arena_printf(g->arena, "%s.%s", prefix, leaf) : arena_strdup(g->arena, leaf);
}

static bool need_rank(Graph *g, Loc loc, int x, int nd, const char *layer, const char *expected)
{
    if (x < 0) return false;
    if (g->nodes[x].shape.nd == nd) return true;
    diag_at(g->diag, loc, "%s expects a %dD input %s, got %s%s", layer, nd, expected, shape_str(g, x),
            nd == 2 && g->nodes[x].shape.nd == 4 ? "; insert 'flatten' before it" : "");
    return false;
}

int ir_input(Graph *g, Loc loc, Shape s)
{
    if (g->input >= 0) {
        diag_at(g->diag, loc, "the net already has an input (at line %d); only one is allowed",
                g->nodes[g->input].loc.line);
        return -1;
    }
    for (int k = 0; k < s.nd; k++)
        if (s.d[k] <= 0 && !(k == 0 && s.d[k] == IR_BATCH)) {
            diag_at(g->diag, loc, "input dimension %d must be positive, got %d", k, s.d[k]);
            return -1;
        }
    if (!shape_within(g, loc, "input", "the input", &s)) return -1;
    int id = ir_node(g, OP_INPUT, loc, 0, NULL);
    g->nodes[id].shape = s;
    g->nodes[id].name = "x";
    g->input = id;
    return id;
}

int ir_conv2d(Graph *g, Loc loc, const char *prefix, int x, int out_channels,
              int kernel, int stride, int padding, int groups, int dilation, bool bias)
{
    if (!need_rank(g, loc, x, 4, "conv2d", "[N, C, H, W]")) return -1;
    const Shape *xs = &g->nodes[x].shape;
    int c = xs->d[1];
    if (groups < 1 || c % groups || out_channels % groups) {
        diag_at(g->diag, loc, "conv2d: groups = %d must divide both the input's %d channels and the %d outputs "
                "(each group convolves its own C/groups inputs into O/groups outputs)", groups, c, out_channels);
        return -1;
    }
    int cg = c / groups;
    long long wl[4] = { out_channels, cg, kernel, kernel };
    if (!within(g, loc, "conv2d", "the weight", 4, wl)) return -1;
    int fan_in = cg * kernel * kernel;   /* at most the weight's elements; PyTorch's, from the weight's shape */
    int wd[4] = { out_channels, cg, kernel, kernel };
    int w = persistent(g, OP_PARAM, loc, pname(g, prefix, "weight"), ir_shape_make(4, wd), INIT_UNIFORM_FAN_IN, fan_in);
    if (w < 0) return -1;
    int in[3] = { x, w, -1 };
    if (bias) {
        in[2] = persistent(g, OP_PARAM, loc, pname(g, prefix, "bias"), ir_shape_make(1, &out_channels), INIT_UNIFORM_FAN_IN, fan_in);
        if (in[2] < 0) return -1;
    }
    IrAttrs at = { .stride = stride, .padding = padding, .groups = groups > 1 ? groups : 0, .dilation = dilation > 1 ? dilation : 0 };
    Shape out;   /* the kernel (dilated) must fit the padded input: the rule says where not */
    if (!rule_fits(g, loc, NULL, OP_CONV2D, bias ? 3 : 2, in, &at, &out, NULL)) return -1;
    if (!shape_within(g, loc, "conv2d", "the output", &out)) return -1;
    return ir_op(g, OP_CONV2D, loc, bias ? 3 : 2, in, &at, NULL);
}

int ir_conv_transpose2d(Graph *g, Loc loc, const char *prefix, int x, int out_channels, int kernel, int stride, int padding,
                        int output_padding, int groups, int dilation, bool bias)
{
    if (!need_rank(g, loc, x, 4, "conv_transpose2d", "[N, C, H, W]")) return -1;
    const Shape *xs = &g->nodes[x].shape;
    int c = xs->d[1];
    if (groups < 1 || c % groups || out_channels % groups) {
        diag_at(g->diag, loc, "conv_transpose2d: groups = %d must divide both the input's %d channels and the %d outputs", groups,
                c, out_channels);
        return -1;
    }
    if (output_padding >= stride && output_padding >= dilation) {
        diag_at(g->diag, loc, "conv_transpose2d: output_padding = %d must be smaller than the stride (%d) or the dilation (%d), "
                "as PyTorch's", output_padding, stride, dilation);
        return -1;
    }
    long long span = (long long)dilation * (kernel - 1) + 1 + output_padding - 2LL * padding;
    long long oh = (long long)(xs->d[2] - 1) * stride + span, ow = (long long)(xs->d[3] - 1) * stride + span;
    if (oh < 1 || ow < 1) {
        diag_at(g->diag, loc, "conv_transpose2d: the output would be %lldx%lld from %s (stride %d, padding %d, kernel %d): "
                "make the padding smaller", oh, ow, shape_str(g, x), stride, padding, kernel);
        return -1;
    }
    int og = out_channels / groups;
    long long wl[4] = { c, og, kernel, kernel }, ol[4] = { xs->d[0], out_channels, oh, ow };
    if (!within(g, loc, "conv_transpose2d", "the weight", 4, wl) || !within(g, loc, "conv_transpose2d", "the output", 4, ol))
        return -1;
    int fan_in = og * kernel * kernel;   /* PyTorch's: the weight's dimension 1 times the window */
    int wd[4] = { c, og, kernel, kernel };
    int w = persistent(g, OP_PARAM, loc, pname(g, prefix, "weight"), ir_shape_make(4, wd), INIT_UNIFORM_FAN_IN, fan_in);
    if (w < 0) return -1;
    /* conv2d's input gradient: each input pixel spreads its channels through the weight
       onto a window of the output (the IR shows conv2d_grad_x) */
    IrAttrs at = { .stride = stride, .padding = padding, .groups = groups > 1 ? groups : 0, .dilation = dilation > 1 ? dilation : 0 };
    Shape out = ir_shape_make(4, (int[]){ xs->d[0], out_channels, (int)oh, (int)ow });
    int y = ir_op(g, OP_CONV2D_BWD_X, loc, 2, (int[]){ x, w }, &at, &out);
    if (y < 0 || !bias) return y;
    int b = persistent(g, OP_PARAM, loc, pname(g, prefix, "bias"), ir_shape_make(1, &out_channels), INIT_UNIFORM_FAN_IN, fan_in);
    if (b < 0) return -1;
    return ir_broadcast(g, loc, OP_ADD, y, ir_reshape(g, loc, b, ir_shape_make(4, (int[]){ 1, out_channels, 1, 1 })));
}

int ir_linear_in(Graph *g, Loc loc, const char *prefix, int x, int in_features, int out_features, bool bias)
{
    /* [N, features], or [N, T, features]: over the last dimension, each token a row (PyTorch's); [N, A, B, ...,
       features] viewed as [N, A * B * ..., features] and back */
    if (x >= 0 && g->nodes[x].shape.nd > 3) {
        Shape xs = g->nodes[x].shape, out = xs;
        long long rows = 1;
        for (int k = 1; k < xs.nd - 1; k++) rows *= xs.d[k];
        int y = ir_linear_in(g, loc, prefix, ir_reshape(g, loc, x, ir_shape_make(3, (int[]){ xs.d[0], (int)rows, xs.d[xs.nd - 1] })),
                             in_features, out_features, bias);
        out.d[out.nd - 1] = out_features;
        return y < 0 || !shape_within(g, loc, "linear", "the output", &out) ? -1 : ir_reshape(g, loc, y, out);
    }
    if ((x < 0 || g->nodes[x].shape.nd != 3) && !need_rank(g, loc, x, 2, "linear", "[N, features] (or [N, T, features])"))
        return -1;
    const Shape *xs = &g->nodes[x].shape;
    int f = xs->d[xs->nd - 1];
    if (in_features >= 0 && in_features != f) {
        diag_at(g->diag, loc, "linear: input has %d features (shape %s) but the layer expects in_features = %d",
                f, shape_str(g, x), in_features);
        return -1;
    }
    long long wl[2] = { out_features, f };
    if (!within(g, loc, "linear", "the weight", 2, wl)) return -1;
    int wd[2] = { out_features, f };
    int w = persistent(g, OP_PARAM, loc, pname(g, prefix, "weight"), ir_shape_make(2, wd), INIT_UNIFORM_FAN_IN, f);
    if (w < 0) return -1;
    int in[3] = { x, w, -1 };
    if (bias) {
        in[2] = persistent(g, OP_PARAM, loc, pname(g, prefix, "bias"), ir_shape_make(1, &out_features), INIT_UNIFORM_FAN_IN, f);
        if (in[2] < 0) return -1;
    }
    return ir_op(g, OP_LINEAR, loc, bias ? 3 : 2, in, NULL, NULL);
}

int ir_batchnorm2d(Graph *g, Loc loc, const char *prefix, int x, float eps, float momentum)
{
    if (!need_rank(g, loc, x, 4, "batchnorm2d", "[N, C, H, W]")) return -1;
    int c = g->nodes[x].shape.d[1];
    Shape cs = ir_shape_make(1, &c);
    int gamma = persistent(g, OP_PARAM, loc, pname(g, prefix, "weight"), cs, INIT_ONES, 0);
    if (gamma < 0) return -1;
    int beta = persistent(g, OP_PARAM, loc, pname(g, prefix, "bias"), cs, INIT_ZEROS, 0);
    if (beta < 0) return -1;
    int rmean = persistent(g, OP_STATE, loc, pname(g, prefix, "running_mean"), cs, INIT_ZEROS, 0);
    if (rmean < 0) return -1;
    int rvar = persistent(g, OP_STATE, loc, pname(g, prefix, "running_var"), cs, INIT_ONES, 0);
    if (rvar < 0) return -1;
    int stats;
    if (g->training && g->sync_bn) {
        /* Statistics over the global batch (--sync-bn): the sums of every
           replica are added up, then the squared deviations from the global
           mean; two passes, as bn_stats makes on one device. */
        int sum = ir_allreduce(g, loc, unary(g, OP_BN_SUM, loc, x, NULL));
        g->nodes[sum].name = pname(g, prefix, "sum");
        int sq = ir_allreduce(g, loc, binary(g, OP_BN_SQDEV, loc, x, sum, NULL));
        g->nodes[sq].name = pname(g, prefix, "sqdev");
        stats = binary(g, OP_BN_FINISH, loc, sum, sq, &(IrAttrs){ .eps = eps, .sync = true });
    } else if (g->training) {
        stats = unary(g, OP_BN_STATS, loc, x, &(IrAttrs){ .eps = eps });
    } else {
        stats = binary(g, OP_BN_EVAL_STATS, loc, rmean, rvar, &(IrAttrs){ .eps = eps });
    }
    if (stats < 0) return -1;
    if (g->training) {
        int rin[3] = { stats, rmean, rvar };
        /* sync: the unbiased variance over the global count */
        if (ir_op(g, OP_BN_RUNNING, loc, 3, rin, &(IrAttrs){ .momentum = momentum, .sync = g->sync_bn }, NULL) < 0) return -1;
    }
    int in[4] = { x, stats, gamma, beta };
    return ir_op(g, OP_BN_APPLY, loc, 4, in, NULL, NULL);
}

/* LayerNorm of x with its weight and bias of shape ps, viewed as x's ir_ln_channels (one dimension) */
static int layernorm_of(Graph *g, Loc loc, const char *prefix, int x, float eps, Shape ps)
{
    Shape stats_shape;   /* the statistics' rule says what the input must be */
    if (x < 0 || !rule_fits(g, loc, "layernorm", OP_LN_STATS, 1, &x, NULL, &stats_shape, NULL)) return -1;
    int c = ir_ln_channels(&g->nodes[x].shape);
    int gamma = persistent(g, OP_PARAM, loc, pname(g, prefix, "weight"), ps, INIT_ONES, 0);
    int beta = gamma < 0 ? -1 : persistent(g, OP_PARAM, loc, pname(g, prefix, "bias"), ps, INIT_ZEROS, 0);
    if (beta < 0) return -1;
    if (ps.nd > 1) {   /* the op's weight and bias are one dimension: views */
        gamma = ir_reshape(g, loc, gamma, ir_shape_make(1, &c));
        beta = ir_reshape(g, loc, beta, ir_shape_make(1, &c));
    }
    int stats = unary(g, OP_LN_STATS, loc, x, &(IrAttrs){ .eps = eps });
    if (stats < 0 || gamma < 0 || beta < 0) return -1;
    int in[4] = { x, stats, gamma, beta };
    return ir_op(g, OP_LN_APPLY, loc, 4, in, NULL, NULL);
}

int ir_layernorm(Graph *g, Loc loc, const char *prefix, int x, float eps)
{
    if (x < 0) return -1;
    int c = ir_ln_channels(&g->nodes[x].shape);
    return layernorm_of(g, loc, prefix, x, eps, ir_shape_make(1, &c));
}

/* Over the last nd dimensions: x viewed as [N, the others' product, their product] (or [N, their
   product] where they are all but the batch's), whose last dimension the op normalises (contiguous:
   the last dimensions of a row-major tensor), then viewed back */
int ir_layernorm_over(Graph *g, Loc loc, const char *prefix, int x, float eps, int nd, const int *shape)
{
    if (x < 0) return -1;
    const Shape xs = g->nodes[x].shape;
    Shape want = ir_shape_make(nd, shape);
    bool fits = nd < xs.nd;
    for (int k = 0; fits && k < nd; k++) fits = xs.d[xs.nd - nd + k] == shape[k];
    if (!fits) {
        diag_at(g->diag, loc, "layernorm: the shape %s is not the input's last dimensions (the input is %s): "
                "nn.LayerNorm's shape, the sizes of the dimensions it normalises over, the last of them the input's last",
                ir_shape_str(g->arena, &want), shape_str(g, x));
        return -1;
    }
    long long inner = 1, outer = 1;
    for (int k = 0; k < nd; k++) inner *= shape[k];
    for (int k = 1; k < xs.nd - nd; k++) outer *= xs.d[k];
    if (inner > INT_MAX || outer > INT_MAX) {
        diag_at(g->diag, loc, "layernorm: %lld features a group is too many (the limit is %d)", inner, INT_MAX);
        return -1;
    }
    int v[3] = { xs.d[0], (int)outer, (int)inner };
    Shape view = xs.nd - nd == 1 ? ir_shape_make(2, (int[]){ v[0], v[2] }) : ir_shape_make(3, v);
    int y = layernorm_of(g, loc, prefix, ir_reshape(g, loc, x, view), eps, want);
    return ir_reshape(g, loc, y, xs);
}

/* op of x with attributes at, its rule's message (if it does not fit) said at the layer */
static int checked_unary(Graph *g, Loc loc, Op op, int x, const IrAttrs *at)
{
    Shape out;
    if (x < 0 || !rule_fits(g, loc, NULL, op, 1, &x, at, &out, NULL)) return -1;
    return unary(g, op, loc, x, at);
}

int ir_transpose(Graph *g, Loc loc, int x, int dim0, int dim1)
{
    return checked_unary(g, loc, OP_TRANSPOSE, x, &(IrAttrs){ .dim0 = dim0, .dim1 = dim1 });
}

int ir_select(Graph *g, Loc loc, int x, int axis, int index)
{
    return checked_unary(g, loc, OP_SELECT, x, &(IrAttrs){ .axis = axis, .index = index });
}

int ir_reduce(Graph *g, Loc loc, Op op, int x, int axis)
{
    return checked_unary(g, loc, op, x, &(IrAttrs){ .axis = axis });
}

int ir_matmul(Graph *g, Loc loc, int a, int b)
{
    if (a < 0 || b < 0) return -1;
    Shape out;
    if (!rule_fits(g, loc, "matmul", OP_MATMUL, 2, (int[]){ a, b }, NULL, &out, NULL)) {
        diag_note(g->diag, g->nodes[b].loc, "the second operand, of shape %s, is made here", shape_str(g, b));
        return -1;
    }
    if (!shape_within(g, loc, "matmul", "the output", &out)) return -1;
    return ir_op(g, OP_MATMUL, loc, 2, (int[]){ a, b }, NULL, NULL);
}

int ir_softmax(Graph *g, Loc loc, int x, int axis)
{
    return checked_unary(g, loc, OP_SOFTMAX, x, &(IrAttrs){ .axis = axis });
}

int ir_attention(Graph *g, Loc loc, int q, int k, int v, int heads, bool causal, float dropout)
{
    if (q < 0 || k < 0 || v < 0) return -1;
    IrAttrs at = { .heads = heads, .causal = causal };   /* the statistics are the same with dropout */
    Shape lse;   /* the rules say what q, k and v must be */
    if (!rule_fits(g, loc, "attention", OP_ATTN_STATS, 2, (int[]){ q, k }, &at, &lse, NULL)) return -1;
    if (!ir_shape_eq(&g->nodes[v].shape, &g->nodes[k].shape)) {
        diag_at(g->diag, loc, "attention: the values %s are not of the keys' shape %s (one value a key)", shape_str(g, v),
                shape_str(g, k));
        return -1;
    }
    int stats = ir_op(g, OP_ATTN_STATS, loc, 2, (int[]){ q, k }, &at, NULL);
    if (stats < 0) return -1;
    at.dropout = g->training ? dropout : 0;   /* none in evaluation, as ir_dropout */
    return ir_op(g, OP_ATTENTION, loc, 4, (int[]){ q, k, v, stats }, &at, NULL);
}

int ir_allreduce(Graph *g, Loc loc, int x)
{
    if (x < 0) return -1;
    int id = unary(g, OP_ALLREDUCE, loc, x, &(IrAttrs){ .bucket = -1 });
    if (id >= 0) g->nodes[id].grad_of = g->nodes[x].grad_of;
    return id;
}

int ir_activation(Graph *g, Loc loc, Op op, int x, const IrAttrs *attr)
{
    if (x < 0) return -1;
    return unary(g, op, loc, x, attr);
}

static int pool(Graph *g, Loc loc, Op op, int x, int kernel, int stride, int padding, bool ceil_mode, bool exclude_pad)
{
    if (!need_rank(g, loc, x, 4, ir_op_name(op), "[N, C, H, W]")) return -1;
    IrAttrs at = { .kernel = kernel, .stride = stride, .padding = padding, .ceil_mode = ceil_mode, .exclude_pad = exclude_pad };
    Shape out, floor_out;
    if (!rule_fits(g, loc, NULL, op, 1, &x, &at, &out, NULL)) return -1;
    IrAttrs fl = at;
    fl.ceil_mode = false;
    char why[256];
    if (ceil_mode && ir_rule_shape(g, op, 1, &x, &fl, &floor_out, why, sizeof why, NULL) && ir_shape_eq(&out, &floor_out))
        at.ceil_mode = false;   /* every window whole either way: the same pool */
    return unary(g, op, loc, x, &at);
}
int ir_maxpool2d(Graph *g, Loc loc, int x, int k, int s, int p, bool ceil_mode)
{
    return pool(g, loc, OP_MAXPOOL, x, k, s, p, ceil_mode, false);
}

int ir_avgpool2d(Graph *g, Loc loc, int x, int k, int s, int p, bool ceil_mode, bool count_include_pad)
{
    return pool(g, loc, OP_AVGPOOL, x, k, s, p, ceil_mode, !count_include_pad && p > 0);
}

int ir_global_avgpool(Graph *g, Loc loc, int x)
{
    if (!need_rank(g, loc, x, 4, "global_avgpool", "[N, C, H, W]")) return -1;
    return unary(g, OP_GAP, loc, x, NULL);
}

int ir_upsample(Graph *g, Loc loc, int x, int scale, bool bilinear)
{
    if (!need_rank(g, loc, x, 4, "upsample", "[N, C, H, W]")) return -1;
    const Shape *xs = &g->nodes[x].shape;
    long long d[4] = { IR_BATCH, xs->d[1], (long long)xs->d[2] * scale, (long long)xs->d[3] * scale };
    if (!within(g, loc, "upsample", "the output", 4, d)) return -1;
    return unary(g, OP_UPSAMPLE, loc, x, &(IrAttrs){ .scale = scale, .bilinear = bilinear });
}

int ir_adaptive_avgpool(Graph *g, Loc loc, int x, int height, int width)
{
    if (!need_rank(g, loc, x, 4, "adaptive_avgpool", "[N, C, H, W]")) return -1;
    long long d[4] = { IR_BATCH, g->nodes[x].shape.d[1], height, width };
    if (!within(g, loc, "adaptive_avgpool", "the output", 4, d)) return -1;
    return unary(g, OP_ADAPTIVE_AVGPOOL, loc, x, &(IrAttrs){ .height = height, .width = width });
}

int ir_global_maxpool(Graph *g, Loc loc, int x)
{
    if (!need_rank(g, loc, x, 4, "global_maxpool", "[N, C, H, W]")) return -1;
    return unary(g, OP_GLOBAL_MAXPOOL, loc, x, NULL);
}

int ir_flatten(Graph *g, Loc loc, int x) { return ir_flatten_from(g, loc, x, 1); }

int ir_flatten_from(Graph *g, Loc loc, int x, int start)
{
    if (x < 0) return -1;
    const Shape *xs = &g->nodes[x].shape;
    if (xs->nd < 2 || xs->d[0] != IR_BATCH) {
        diag_at(g->diag, loc, "flatten expects a batched input [N, ...], got %s", shape_str(g, x));
        return -1;
    }
    if (start < 1 || start >= xs->nd) {
        diag_at(g->diag, loc, "flatten: start = %d is not a dimension of %s after the batch (1..%d)", start, shape_str(g, x),
                xs->nd - 1);
        return -1;
    }
    if (start == xs->nd - 1) return x;
    if (!shape_within(g, loc, "flatten", "the input", xs)) return -1;
    long long f = 1;
    for (int k = start; k < xs->nd; k++) f *= xs->d[k];   /* within IR_MAX_ELEMS, checked above */
    Shape flat = *xs;
    flat.nd = start + 1;
    flat.d[start] = (int)f;
    return ir_op(g, OP_RESHAPE, loc, 1, &x, NULL, &flat);
}

int ir_reshape(Graph *g, Loc loc, int x, Shape s)
{
    if (x < 0) return -1;
    if (ir_shape_eq(&g->nodes[x].shape, &s)) return x;
    return ir_op(g, OP_RESHAPE, loc, 1, &x, NULL, &s);
}

int ir_batchnorm1d(Graph *g, Loc loc, const char *prefix, int x, float eps, float momentum)
{
    if (!need_rank(g, loc, x, 2, "batchnorm1d", "[N, features]")) return -1;
    const Shape *xs = &g->nodes[x].shape;
    int four[4] = { xs->d[0], xs->d[1], 1, 1 };
    Shape flat = *xs;   /* BatchNorm1d over [N, F] is BatchNorm2d over [N, F, 1, 1] */
    int y = ir_batchnorm2d(g, loc, prefix, ir_reshape(g, loc, x, ir_shape_make(4, four)), eps, momentum);
    return ir_reshape(g, loc, y, flat);
}

int ir_dropout(Graph *g, Loc loc, int x, float p)
{
    if (x < 0) return -1;
    if (!g->training || p == 0) return x;   /* identity in evaluation, or when nothing is dropped */
    int mask = unary(g, OP_DROPOUT_MASK, loc, x, &(IrAttrs){ .p = p });
    return mask < 0 ? -1 : binary(g, OP_MUL, loc, x, mask, NULL);
}

int ir_add(Graph *g, Loc loc, int a, int b)
{
    if (a < 0 || b < 0) return -1;
    Shape out;
    if (!rule_fits(g, loc, NULL, OP_ADD, 2, (int[]){ a, b }, NULL, &out, NULL)) {
        diag_note(g->diag, g->nodes[a].loc, "the first input, of shape %s, is made here", shape_str(g, a));
        diag_note(g->diag, g->nodes[b].loc, "the second input, of shape %s, is made here", shape_str(g, b));
        return -1;
    }
    return binary(g, OP_ADD, loc, a, b, NULL);
}

int ir_concat(Graph *g, Loc loc, int n, const int *in, int axis)
{
    for (int k = 0; k < n; k++)
        if (in[k] < 0) return -1;
    Shape out;
    int k;
    IrAttrs at = { .axis = axis };
    if (!rule_fits(g, loc, NULL, OP_CONCAT, n, in, &at, &out, &k)) {
        if (k > 0) diag_note(g->diag, g->nodes[in[k]].loc, "input %d, of shape %s, is made here", k, shape_str(g, in[k]));
        return -1;
    }
    if (!shape_within(g, loc, "concat", "the output", &out)) return -1;
    return ir_op(g, OP_CONCAT, loc, n, in, &at, NULL);
}

int ir_broadcast(Graph *g, Loc loc, Op op, int a, int b)
{
    if (a < 0 || b < 0) return -1;
    Shape out;
    if (!rule_fits(g, loc, NULL, op, 2, (int[]){ a, b }, NULL, &out, NULL)) {
        diag_note(g->diag, g->nodes[b].loc, "the second input, of shape %s, is made here", shape_str(g, b));
        return -1;
    }
    return binary(g, op, loc, a, b, NULL);
}

int ir_softmax_xent(Graph *g, Loc loc, int logits, float label_smoothing)
{
    if (logits < 0) return -1;
    const Shape *ls = &g->nodes[logits].shape;
    if (ls->nd != 2 || ls->d[0] != IR_BATCH) {
        const Node *made = &g->nodes[logits];
        if (made->op == OP_RESHAPE) made = &g->nodes[made->in[0]];
        diag_at(g->diag, loc, "softmax_cross_entropy expects logits [N, classes], got %s%s", shape_str(g, logits),
                ls->nd > 2 && made->op == OP_LINEAR ? "; a linear layer works on the last dimension (as nn.Linear): flatten before it"
                : ls->nd == 4 ? "; flatten and add a linear layer before it" : "");
        return -1;
    }
    if (g->loss >= 0) {
        diag_at(g->diag, loc, "the net already has a loss; only one softmax_cross_entropy is allowed");
        return -1;
    }
    int lab = ir_op(g, OP_LABELS, loc, 0, NULL, NULL, NULL);
    g->nodes[lab].name = "labels";
    g->labels = lab;
    g->loss = binary(g, OP_XENT, loc, logits, lab, &(IrAttrs){ .label_smoothing = label_smoothing });
    g->correct = binary(g, OP_ACCURACY, loc, logits, lab, NULL);
    g->logits = logits;
    return g->loss < 0 || g->correct < 0 ? -1 : g->loss;
}
