/*
** The built-in layers: one row each (name, arguments with their type,
** default and range, what else is checked in words, the builder). The
** elaborator binds a call's arguments by the row, checks their types and
** ranges (elab.c, apply_layer: each rule once, here), and calls the
** builder, which makes the IR through ir/build.c. "Did you mean", the
** signatures in messages and docs/language.md's layer table (mgc
** --list-layers; tests/golden.sh holds the two together) come from the rows.
** A new layer is a row and its builder.
*/
#include "layers.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX FE_MAX_SIZE
#define INT_ARG(name, req, def, lo) { name, A_INT, req, def, lo, MAX, false, false, NULL }
#define FLOAT_ARG(name, def, lo, lo_open, hi, hi_open) { name, A_FLOAT, false, def, lo, hi, lo_open, hi_open, NULL }
#define BOOL_ARG(name, def) { name, A_BOOL, false, def, 0, 1, false, false, NULL }
#define TENSOR_ARG(name) { name, A_TENSOR, true, 0, 0, 0, false, false, NULL }
#define MORE_TENSOR_ARG(name) { name, A_TENSOR, false, DEF_NONE, 0, 0, false, false, NULL }
#define CHOICE_ARG(name, def, n, choices) { name, A_CHOICE, false, def, 0, (n) - 1, false, false, choices }
#define SHAPE_ARG(name) { name, A_SHAPE, false, 0, 0, 0, false, false, NULL }

int fe_choice_index(const LayerArg *a, const char *name)
{
    const char *c = a->choices;
    size_t len = strlen(name);
    for (int k = 0; c && *c; k++) {
        size_t n = strcspn(c, ",");
        if (n == len && !strncmp(c, name, n)) return k;
        c += n + (c[n] == ',');
    }
    return -1;
}

static int build_conv2d(const LayerCall *c)
{
    return ir_conv2d(c->g, c->loc, c->prefix, c->x, (int)c->i[0], (int)c->i[1], (int)c->i[2], (int)c->i[3], (int)c->i[5],
                     (int)c->i[6], c->i[4] != 0);
}

static int build_conv_transpose2d(const LayerCall *c)
{
    return ir_conv_transpose2d(c->g, c->loc, c->prefix, c->x, (int)c->i[0], (int)c->i[1], (int)c->i[2], (int)c->i[3], (int)c->i[4],
                               (int)c->i[6], (int)c->i[7], c->i[5] != 0);
}

static int build_linear(const LayerCall *c)
{
    return ir_linear_in(c->g, c->loc, c->prefix, c->x, (int)c->i[2], (int)c->i[0], c->i[1] != 0);
}

static int build_batchnorm2d(const LayerCall *c)
{
    return ir_batchnorm2d(c->g, c->loc, c->prefix, c->x, (float)c->f[0], (float)c->f[1]);
}

static int build_layernorm(const LayerCall *c)
{
    if (c->i[1]) return ir_layernorm_over(c->g, c->loc, c->prefix, c->x, (float)c->f[0], (int)c->i[1], c->shape);
    return ir_layernorm(c->g, c->loc, c->prefix, c->x, (float)c->f[0]);
}

static int build_batchnorm1d(const LayerCall *c)
{
    return ir_batchnorm1d(c->g, c->loc, c->prefix, c->x, (float)c->f[0], (float)c->f[1]);
}

/* The call's arguments as the attributes of the same names (ir/attrs.def). */
static IrAttrs attrs_of(const LayerCall *c)
{
    IrAttrs at = { 0 };
    for (int k = 0; k < c->layer->nargs; k++) {
        const char *arg = c->layer->args[k].name;
#define ATTR(nm, ty, lb, sh) if (!strcmp(arg, #nm)) at.nm = (ty)(c->layer->args[k].type == A_FLOAT ? c->f[k] : (double)c->i[k]);
#include "attrs.def"
#undef ATTR
    }
    return at;
}

/* An activation (ir/activations.def): the op of the layer's name, its arguments its attributes. */
static int build_activation(const LayerCall *c)
{
    IrAttrs at = attrs_of(c);
    return ir_activation(c->g, c->loc, ir_op_find(c->layer->name), c->x, &at);
}

/* PyTorch's pools allow at most half the window as padding. */
static bool pool_padding(const LayerCall *c, const char *layer)
{
    if (c->i[2] <= c->i[0] / 2) return true;
    diag_at(c->E->d, c->where[2], "%s: padding %lld is too big for kernel %lld; it can be at most half the kernel (%lld)",
            layer, c->i[2], c->i[0], c->i[0] / 2);
    return false;
}

static int build_maxpool2d(const LayerCall *c)
{
    if (!pool_padding(c, "maxpool2d")) return -1;
    return ir_maxpool2d(c->g, c->loc, c->x, (int)c->i[0], (int)c->i[1], (int)c->i[2], c->i[3] != 0);
}

static int build_avgpool2d(const LayerCall *c)
{
    if (!pool_padding(c, "avgpool2d")) return -1;
    return ir_avgpool2d(c->g, c->loc, c->x, (int)c->i[0], (int)c->i[1], (int)c->i[2], c->i[3] != 0, c->i[4] != 0);
}

static int build_global_avgpool(const LayerCall *c) { return ir_global_avgpool(c->g, c->loc, c->x); }
static int build_global_maxpool(const LayerCall *c) { return ir_global_maxpool(c->g, c->loc, c->x); }
static int build_upsample(const LayerCall *c) { return ir_upsample(c->g, c->loc, c->x, (int)c->i[0], c->i[1] == 1); }

static int build_adaptive_avgpool(const LayerCall *c)
{
    return ir_adaptive_avgpool(c->g, c->loc, c->x, (int)c->i[0], (int)(c->i[1] > 0 ? c->i[1] : c->i[0]));
}
static int build_flatten(const LayerCall *c) { return ir_flatten_from(c->g, c->loc, c->x, (int)c->i[0]); }
static int build_transpose(const LayerCall *c) { return ir_transpose(c->g, c->loc, c->x, (int)c->i[0], (int)c->i[1]); }
static int build_select(const LayerCall *c) { return ir_select(c->g, c->loc, c->x, (int)c->i[0], (int)c->i[1]); }
static int build_dropout(const LayerCall *c) { return ir_dropout(c->g, c->loc, c->x, (float)c->f[0]); }

static int build_add(const LayerCall *c)
{
    if (c->i[0] == c->E->loss_node) {
        diag_at(c->E->d, c->where[0], "the loss cannot be an input of 'add'");
        return -1;
    }
    return ir_add(c->g, c->loc, c->x, (int)c->i[0]);
}

/* q -> attention(k, v, heads, causal, dropout) */
static int build_attention(const LayerCall *c)
{
    for (int k = 0; k < 2; k++)
        if (c->i[k] == c->E->loss_node) {
            diag_at(c->E->d, c->where[k], "the loss cannot be an input of 'attention'");
            return -1;
        }
    return ir_attention(c->g, c->loc, c->x, (int)c->i[0], (int)c->i[1], (int)c->i[2], c->i[3] != 0, (float)c->f[4]);
}

/* Argument k, a dimension of the input, into *axis: a negative one counted from the end (-1 the
   last, as PyTorch's); one before the first said there, false */
static bool axis_arg(const LayerCall *c, int k, int *axis)
{
    int nd = ir_shape(c->g, c->x)->nd;
    long long a = c->i[k];
    if (a < 0 && a + nd < 0) {
        diag_at(c->E->d, c->where[k], "%s: %s = %lld counts back past the first dimension of %s (-1 is the last; the rank is %d)",
                c->layer->name, c->layer->args[k].name, a, ir_shape_str(c->E->a, ir_shape(c->g, c->x)), nd);
        return false;
    }
    *axis = (int)(a < 0 ? a + nd : a);
    return true;
}

/* x -> sum(axis, keepdim), mean(axis, keepdim) */
static int build_reduce(const LayerCall *c)
{
    int axis;
    if (!axis_arg(c, 0, &axis)) return -1;
    int y = ir_reduce(c->g, c->loc, ir_op_find(c->layer->name), c->x, axis);
    if (y < 0 || !c->i[1]) return y;
    Shape s = *ir_shape(c->g, c->x);   /* keepdim: the dimension back, of size 1 */
    s.d[axis] = 1;
    return ir_reshape(c->g, c->loc, y, s);
}

static int build_softmax(const LayerCall *c)
{
    int axis;
    return axis_arg(c, 0, &axis) ? ir_softmax(c->g, c->loc, c->x, axis) : -1;
}

/* x viewed as s (its batch dimension x's): s.d[unknown] (-1 given, or -1: none) from the rest */
static int view_as(const LayerCall *c, Shape s, int unknown, const char *hint)
{
    const Shape *xs = ir_shape(c->g, c->x);
    long long xe = 1, known = 1;
    for (int k = 1; k < xs->nd; k++) xe *= xs->d[k];
    for (int k = 1; k < s.nd; k++) if (k != unknown) known *= s.d[k];
    if (unknown >= 0 && known > 0 && xe % known == 0) s.d[unknown] = (int)(xe / known), known *= s.d[unknown];
    if (known != xe || (unknown >= 0 && s.d[unknown] == 0)) {
        s.d[0] = xs->d[0];
        if (unknown >= 0) s.d[unknown] = -1;
        diag_at(c->E->d, c->loc, "%s: %s has %lld elements an example; %s cannot hold them%s", c->layer->name,
                ir_shape_str(c->E->a, xs), xe, ir_shape_str(c->E->a, &s), hint);
        return -1;
    }
    s.d[0] = xs->d[0];
    return ir_reshape(c->g, c->loc, c->x, s);
}

/* The sizes given from argument `from` on into s.d[at..] (s.nd grows); the one that is -1 at
   *unknown; false (said) for a size 0, a second -1 or a rank past IR_MAXDIM */
static bool sizes_into(const LayerCall *c, int from, Shape *s, int at, int *unknown)
{
    for (int k = from; k < c->layer->nargs; k++) {
        if (c->i[k] == (long long)DEF_ABSENT) continue;
        if (c->i[k] == 0 || (c->i[k] == -1 && *unknown >= 0)) {
            diag_at(c->E->d, c->where[k], c->i[k] ? "%s: a second -1; one size at most is inferred"
                                                  : "%s: a size of 0; each is at least 1, or -1 (inferred from the others)",
                    c->layer->name);
            return false;
        }
        if (s->nd >= IR_MAXDIM) {
            diag_at(c->E->d, c->where[k], "%s: more than %d dimensions with the batch; mgc's tensors have at most %d",
                    c->layer->name, IR_MAXDIM, IR_MAXDIM);
            return false;
        }
        if (c->i[k] == -1) *unknown = at;
        memmove(&s->d[at + 1], &s->d[at], sizeof(int) * (size_t)(s->nd - at));
        s->d[at++] = (int)c->i[k];
        s->nd++;
    }
    return true;
}

/* x -> reshape(d1, d2, d3): [N, d1, d2, d3], the batch kept */
static int build_reshape(const LayerCall *c)
{
    Shape s = { 1, { 0 } };
    int unknown = -1;
    if (!sizes_into(c, 0, &s, 1, &unknown)) return -1;
    long long rest = 1, xe = 1;
    const Shape *xs = ir_shape(c->g, c->x);
    for (int k = 2; k < s.nd; k++) rest *= s.d[k];
    for (int k = 1; k < xs->nd; k++) xe *= xs->d[k];
    if (unknown == 1 && s.nd > 2 && rest == xe) {   /* PyTorch's x.reshape(-1, ...), -1 the batch: here a 1 */
        diag_at(c->E->d, c->where[0], "reshape: the batch is kept and not given, so this -1 is a dimension of 1 after it "
                "([N, 1, ...]); PyTorch's x.reshape(-1, ...) is reshape(...) without the -1 (write 1 for a dimension of 1)");
        return -1;
    }
    return view_as(c, s, unknown, " (the batch is kept: give the sizes after it, as x.reshape(N, ...))");
}

/* x -> unflatten(axis, d1, d2, d3): dimension axis split into d1, d2, ... (PyTorch's x.unflatten) */
static int build_unflatten(const LayerCall *c)
{
    int axis;
    if (!axis_arg(c, 0, &axis)) return -1;
    Shape s = *ir_shape(c->g, c->x);
    if (axis < 1 || axis >= s.nd) {
        diag_at(c->E->d, c->where[0], "unflatten: axis %d of %s: one of 1..%d (dimension 0 is the batch)", axis,
                ir_shape_str(c->E->a, &s), s.nd - 1);
        return -1;
    }
    memmove(&s.d[axis], &s.d[axis + 1], sizeof(int) * (size_t)(s.nd - axis - 1));
    s.nd--;
    int unknown = -1;
    if (!sizes_into(c, 1, &s, axis, &unknown)) return -1;
    return view_as(c, s, unknown, arena_printf(c->E->a, " (the sizes' product must be dimension %d's)", axis));
}

/* x -> permute(0, d1, d2, d3): PyTorch's x.permute, the batch first; as transposes (a copy each) */
static int build_permute(const LayerCall *c)
{
    int nd = ir_shape(c->g, c->x)->nd, p[IR_MAXDIM] = { 0 }, n = 0, cur[IR_MAXDIM];
    for (int k = 0; k < c->layer->nargs; k++) if (c->i[k] != (long long)DEF_ABSENT) p[n++] = (int)c->i[k];
    bool perm = n == nd && p[0] == 0;
    for (int k = 0; k < n && perm; k++)
        for (int j = 0; j < k && perm; j++) perm = p[j] != p[k] && p[k] < nd;
    if (!perm) {
        diag_at(c->E->d, c->loc, "permute: %s takes an order of its %d dimensions, each once, the batch (0) first: "
                "permute(0, 2, 3, 1) for [N, C, H, W] -> [N, H, W, C]", ir_shape_str(c->E->a, ir_shape(c->g, c->x)), nd);
        return -1;
    }
    int y = c->x;
    for (int k = 0; k < nd; k++) cur[k] = k;
    for (int k = 1; k < nd && y >= 0; k++) {   /* bring dimension p[k] to place k */
        int j = k;
        while (cur[j] != p[k]) j++;
        if (j == k) continue;
        y = ir_transpose(c->g, c->loc, y, k, j);
        cur[j] = cur[k], cur[k] = p[k];
    }
    return y;
}

/* the input and the tensors given, side by side along dimension axis */
static int build_concat(const LayerCall *c)
{
    int in[FE_MAX_LAYER_ARGS + 1] = { c->x }, n = 1, axis = 1;
    for (int k = 0; k < c->layer->nargs; k++) {
        if (c->layer->args[k].type != A_TENSOR && !axis_arg(c, k, &axis)) return -1;
        if (c->layer->args[k].type != A_TENSOR || c->i[k] < 0) continue;   /* not given */
        if (c->i[k] == c->E->loss_node) {
            diag_at(c->E->d, c->where[k], "the loss cannot be an input of 'concat'");
            return -1;
        }
        in[n++] = (int)c->i[k];
    }
    return ir_concat(c->g, c->loc, n, in, axis);
}

/* x -> matmul(other): torch.matmul(x, other) */
static int build_matmul(const LayerCall *c)
{
    if (c->i[0] == c->E->loss_node) {
        diag_at(c->E->d, c->where[0], "the loss cannot be an input of 'matmul'");
        return -1;
    }
    return ir_matmul(c->g, c->loc, c->x, (int)c->i[0]);
}

/* mul, sub: the other tensor, broadcast as PyTorch does */
static int build_broadcast(const LayerCall *c)
{
    if (c->i[0] == c->E->loss_node) {
        diag_at(c->E->d, c->where[0], "the loss cannot be an input of '%s'", c->layer->name);
        return -1;
    }
    return ir_broadcast(c->g, c->loc, ir_op_find(c->layer->name), c->x, (int)c->i[0]);
}

static int build_softmax_xent(const LayerCall *c)
{
    Elab *E = c->E;
    if (E->loss_node >= 0) {
        diag_at(E->d, c->loc, "a second softmax_cross_entropy; the net has exactly one loss");
        diag_note(E->d, E->loss_loc, "the first is here");
        return -1;
    }
    if (c->x >= 0 && c->g->nodes[c->x].op == OP_SOFTMAX) {   /* PyTorch's habit (a softmax before CrossEntropyLoss): a bug */
        diag_at(E->d, c->loc, "softmax_cross_entropy takes logits and applies its own softmax: remove the softmax before it "
                "(a softmax twice trains poorly)");
        diag_note(E->d, c->g->nodes[c->x].loc, "the softmax is here");
        return -1;
    }
    int r = ir_softmax_xent(c->g, c->loc, c->x, (float)c->f[0]);
    if (r >= 0) E->loss_node = r, E->loss_loc = c->loc;
    return r;
}

const Layer fe_layers[] = {
    { "conv2d", true, 7, { INT_ARG("out_channels", true, 0, 1), INT_ARG("kernel", true, 0, 1), INT_ARG("stride", false, 1, 1),
                           INT_ARG("padding", false, 0, 0), BOOL_ARG("bias", 1), INT_ARG("groups", false, 1, 1),
                           INT_ARG("dilation", false, 1, 1) },
      build_conv2d, "input `[N, C, H, W]`; the kernel (dilated: `dilation * (kernel - 1) + 1` wide) fits the padded input; "
                    "`groups` divides C and `out_channels` (weight `[out_channels, C / groups, kernel, kernel]`)" },
    { "conv_transpose2d", true, 8, { INT_ARG("out_channels", true, 0, 1), INT_ARG("kernel", true, 0, 1), INT_ARG("stride", false, 1, 1),
                                     INT_ARG("padding", false, 0, 0), INT_ARG("output_padding", false, 0, 0), BOOL_ARG("bias", 1),
                                     INT_ARG("groups", false, 1, 1), INT_ARG("dilation", false, 1, 1) },
      build_conv_transpose2d, "PyTorch's `ConvTranspose2d`: input `[N, C, H, W]` -> `[N, out_channels, (H - 1) * stride - 2 * "
                              "padding + dilation * (kernel - 1) + output_padding + 1, ...]` (kernel 2, stride 2: twice the size); "
                              "weight `[C, out_channels / groups, kernel, kernel]`; output_padding below the stride or the dilation" },
    { "linear", true, 3, { INT_ARG("out_features", true, 0, 1), BOOL_ARG("bias", 1), INT_ARG("in_features", false, DEF_INFERRED, 1) },
      build_linear, "input `[N, F]`, or `[N, T, F]` (each of the N * T rows, a transformer's tokens: `[N, T, out_features]`); "
                    "an explicit `in_features` must equal F" },
    { "batchnorm2d", true, 2, { FLOAT_ARG("eps", 1e-5, 0, true, 1, true), FLOAT_ARG("momentum", 0.1, 0, false, 1, false) },
      build_batchnorm2d, "input `[N, C, H, W]`" },
    { "batchnorm1d", true, 2, { FLOAT_ARG("eps", 1e-5, 0, true, 1, true), FLOAT_ARG("momentum", 0.1, 0, false, 1, false) },
      build_batchnorm1d, "input `[N, F]` (after `linear`): statistics over the batch, as PyTorch's `BatchNorm1d`" },
    { "layernorm", true, 2, { FLOAT_ARG("eps", 1e-5, 0, true, 1, true), SHAPE_ARG("shape") }, build_layernorm,
      "over the features of `[N, F]` (PyTorch's `LayerNorm(F)`), the last dimension of `[N, T, D]` (`LayerNorm(D)`: "
      "each token), or the channels of `[N, C, H, W]` at each position (`LayerNorm(C)` over channels-last, as ConvNeXt's); "
      "`shape = [a, b, ...]`: over the input's last dimensions, which must be these (`nn.LayerNorm([a, b, ...])`: "
      "`[N, T, D]` by `[T, D]`, `[N, C, H, W]` by `[H, W]` or `[C, H, W]`, or `[W]`), its weight and bias of this shape" },
    { "relu", false, 0, { { 0 } }, build_activation, "" },
    { "sigmoid", false, 0, { { 0 } }, build_activation, "" },
    { "tanh", false, 0, { { 0 } }, build_activation, "" },
    { "leaky_relu", false, 1, { FLOAT_ARG("slope", 0.01, 0, false, 1, false) }, build_activation,
      "`x > 0 ? x : slope * x` (PyTorch's `LeakyReLU(negative_slope)`)" },
    { "silu", false, 0, { { 0 } }, build_activation, "`x * sigmoid(x)`" },
    { "relu6", false, 0, { { 0 } }, build_activation, "`min(max(x, 0), 6)`" },
    { "hardsigmoid", false, 0, { { 0 } }, build_activation, "`relu6(x + 3) / 6`" },
    { "hardswish", false, 0, { { 0 } }, build_activation, "`x * relu6(x + 3) / 6`" },
    { "elu", false, 1, { FLOAT_ARG("alpha", 1.0, 0, true, 100, false) }, build_activation, "`x > 0 ? x : alpha * (exp(x) - 1)`" },
    { "gelu", false, 0, { { 0 } }, build_activation, "`x * Phi(x)`, the exact form (PyTorch's `GELU()`)" },
    { "gelu_tanh", false, 0, { { 0 } }, build_activation, "the tanh approximation (PyTorch's `GELU(approximate=\"tanh\")`)" },
    { "mish", false, 0, { { 0 } }, build_activation, "`x * tanh(log(1 + exp(x)))`" },
    { "scale", false, 2, { FLOAT_ARG("factor", 1.0, -1e30, false, 1e30, false), FLOAT_ARG("shift", 0.0, -1e30, false, 1e30, false) },
      build_activation, "`x * factor + shift`: what `x * 0.5`, `x + 1`, `1 - x` and `-x` make on a tensor" },
    { "maxpool2d", false, 4, { INT_ARG("kernel", true, 0, 1), INT_ARG("stride", false, DEF_KERNEL, 1), INT_ARG("padding", false, 0, 0),
                               BOOL_ARG("ceil_mode", 0) },
      build_maxpool2d, "input `[N, C, H, W]`; padding <= kernel / 2; `ceil_mode`: the output's size rounded up, a last window "
                       "partial (PyTorch's: it starts inside the input or its left padding)" },
    { "avgpool2d", false, 5, { INT_ARG("kernel", true, 0, 1), INT_ARG("stride", false, DEF_KERNEL, 1), INT_ARG("padding", false, 0, 0),
                               BOOL_ARG("ceil_mode", 0), BOOL_ARG("count_include_pad", 1) },
      build_avgpool2d, "input `[N, C, H, W]`; padding <= kernel / 2 (counted in the mean, as PyTorch, unless `count_include_pad "
                       "= false`); `ceil_mode` as maxpool2d's (a partial window's mean over the part within the padded input)" },
    { "global_avgpool", false, 0, { { 0 } }, build_global_avgpool, "`[N, C, H, W]` -> `[N, C, 1, 1]`" },
    { "global_maxpool", false, 0, { { 0 } }, build_global_maxpool, "`[N, C, H, W]` -> `[N, C, 1, 1]`: each plane's maximum" },
    { "adaptive_avgpool", false, 2, { INT_ARG("height", true, 0, 1), INT_ARG("width", false, DEF_HEIGHT, 1) },
      build_adaptive_avgpool, "`[N, C, H, W]` -> `[N, C, height, width]`, PyTorch's windows (`AdaptiveAvgPool2d`)" },
    { "upsample", false, 2, { INT_ARG("scale", false, 2, 1), CHOICE_ARG("mode", 0, 2, "nearest,bilinear") }, build_upsample,
      "nearest: each pixel `scale x scale` times (`Upsample(scale_factor=scale)`); `mode = bilinear`: interpolated, PyTorch's "
      "`Upsample(scale_factor=scale, mode=\"bilinear\")` (`align_corners=False`)" },
    { "flatten", false, 1, { INT_ARG("start", false, 1, 1) }, build_flatten,
      "`[N, ...]` -> `[N, F]`; from dimension `start` on: `[N, C, H, W]` from 2 is `[N, C, H * W]` (PyTorch's `flatten(start)`)" },
    { "transpose", false, 2, { INT_ARG("dim0", true, 0, 1), INT_ARG("dim1", true, 0, 1) }, build_transpose,
      "dimensions `dim0` and `dim1` (not 0, the batch) swapped: `[N, D, T]` by (1, 2) is `[N, T, D]` (a copy)" },
    { "select", false, 2, { INT_ARG("axis", true, 0, 1), INT_ARG("index", true, 0, 0) }, build_select,
      "index `index` of dimension `axis`, that dimension gone: `[N, T, D]` by (1, 0) is `[N, D]` (PyTorch's `x[:, 0]`: a class token)" },
    { "reshape", false, 5, { INT_ARG("d1", true, 0, -1), INT_ARG("d2", false, DEF_ABSENT, -1), INT_ARG("d3", false, DEF_ABSENT, -1),
                             INT_ARG("d4", false, DEF_ABSENT, -1), INT_ARG("d5", false, DEF_ABSENT, -1) },
      build_reshape, "`[N, ...]` -> `[N, d1, d2, ...]`, the same elements (a view, no copy); the batch kept (PyTorch's "
                     "`x.reshape(N, d1, ...)`); one size may be -1, inferred: `[N, 16]` by (16, 1, 1) is `[N, 16, 1, 1]`" },
    { "unflatten", false, 5, { INT_ARG("axis", true, 0, -IR_MAXDIM), INT_ARG("d1", true, 0, -1), INT_ARG("d2", true, 0, -1),
                               INT_ARG("d3", false, DEF_ABSENT, -1), INT_ARG("d4", false, DEF_ABSENT, -1) },
      build_unflatten, "dimension `axis` split into `d1, d2, ...` (PyTorch's `x.unflatten(axis, (d1, d2))`): `[N, C, H * W]` by "
                       "(2, H, W) is `[N, C, H, W]`; a view; one size may be -1" },
    { "permute", false, 6, { INT_ARG("d0", true, 0, 0), INT_ARG("d1", true, 0, 0), INT_ARG("d2", false, DEF_ABSENT, 0),
                             INT_ARG("d3", false, DEF_ABSENT, 0), INT_ARG("d4", false, DEF_ABSENT, 0), INT_ARG("d5", false, DEF_ABSENT, 0) },
      build_permute, "PyTorch's `x.permute(0, ...)`, every dimension once, the batch first: `[N, C, H, W]` by (0, 2, 3, 1) is "
                     "`[N, H, W, C]` (made of transposes, a copy each)" },
    { "sum", false, 2, { INT_ARG("axis", true, 0, -IR_MAXDIM), BOOL_ARG("keepdim", 0) }, build_reduce,
      "the sum along dimension `axis` (not 0; -1 the last), that dimension gone unless `keepdim` (PyTorch's `x.sum(axis)`)" },
    { "mean", false, 2, { INT_ARG("axis", true, 0, -IR_MAXDIM), BOOL_ARG("keepdim", 0) }, build_reduce,
      "the mean along dimension `axis` as `sum`: `[N, T, D]` by 1 is `[N, D]` (a mixer's pooling over its tokens)" },
    { "softmax", false, 1, { INT_ARG("axis", false, DEF_LAST, -IR_MAXDIM) }, build_softmax,
      "`exp(x) / its sum` along dimension `axis` (not 0; -1 the last), PyTorch's `x.softmax(axis)`; the loss takes logits: "
      "no softmax before `softmax_cross_entropy`" },
    { "dropout", false, 1, { FLOAT_ARG("p", 0.5, 0, false, 1, true) }, build_dropout,
      "in training each element is dropped with probability p and the rest scaled by 1 / (1 - p) (`nn.Dropout`; nothing in "
      "evaluation). The mask depends on `--seed`, the step of the run, the layer's place among the net's dropouts and the "
      "element's place in the global batch: the same on any number of replicas, fused or not (`MGC_FUSE=0`). The product "
      "and its gradient make it as they read it: no mask is stored" },
    { "add", false, 1, { TENSOR_ARG("other") }, build_add, "as `mul`: `x + other` (a residual connection: both shapes equal)" },
    { "concat", false, 7, { TENSOR_ARG("b"), MORE_TENSOR_ARG("c"), MORE_TENSOR_ARG("d"), MORE_TENSOR_ARG("e"), MORE_TENSOR_ARG("f"),
                            MORE_TENSOR_ARG("g"), INT_ARG("axis", false, 1, -IR_MAXDIM) },
      build_concat, "`x -> concat(b, c, ...)`: the tensors side by side along dimension 1 (channels, or features), alike in "
                    "every other; up to 7 (nest for more); its gradient splits dy. `axis = 2` (or -1, ...) joins along another "
                    "(PyTorch's `torch.cat(..., dim)`)" },
    { "mul", false, 1, { TENSOR_ARG("other") }, build_broadcast,
      "PyTorch's broadcasting: each dimension equal, or 1 in one of them (`[N, C, H, W]` by `[N, C, 1, 1]`: an SE block's gate)" },
    { "sub", false, 1, { TENSOR_ARG("other") }, build_broadcast, "as `mul`: `x - other`" },
    { "matmul", false, 1, { TENSOR_ARG("other") }, build_matmul,
      "`x -> matmul(other)`: `torch.matmul(x, other)` on tensors of one rank, 3 to 6: `[N, M, K]` by `[N, K, P]` is `[N, M, P]`, "
      "each example's matrices (and each head's, `[N, H, M, K]`); a dimension before the last two of 1 in one of them is "
      "broadcast (a learned `[1, K, P]`)" },
    { "attention", false, 5, { TENSOR_ARG("k"), TENSOR_ARG("v"), INT_ARG("heads", false, 1, 1), BOOL_ARG("causal", 0),
                               FLOAT_ARG("dropout", 0, 0, false, 1, true) }, build_attention,
      "`q -> attention(k, v, heads)`: scaled dot-product attention, PyTorch's (`F.scaled_dot_product_attention` on q, k, v "
      "split into heads): q `[N, Tq, D]`, k and v `[N, Tk, D]`, each head `softmax(q k^T / sqrt(D / heads)) v`, the heads side "
      "by side `[N, Tq, D]`; `causal`: query i sees keys 0..i; `dropout`: in training each weight `p_ij` is dropped with this "
      "probability and the rest scaled by 1 / (1 - dropout), as `dropout_p` (none in evaluation). No `[N, heads, Tq, Tk]` "
      "tensor is stored, the dropout mask neither" },
    { "softmax_cross_entropy", false, 1, { FLOAT_ARG("label_smoothing", 0, 0, false, 1, true) }, build_softmax_xent,
      "the loss: once per net, and it must end the chain the net returns (labels are implicit)" },
};
const int fe_nlayers = (int)(sizeof fe_layers / sizeof *fe_layers);

int fe_find_layer(const char *name)
{
    for (int i = 0; i < fe_nlayers; i++)
        if (!strcmp(fe_layers[i].name, name)) return i;
    return -1;
}

bool fe_param_init_known(const Ast *e)
{
    if (e->kind == AST_NAME) return !strcmp(e->name, "zeros") || !strcmp(e->name, "ones");
    return e->kind == AST_CALL && !e->label &&
           (!strcmp(e->name, "zeros") || !strcmp(e->name, "ones") || !strcmp(e->name, "constant") || !strcmp(e->name, "normal"));
}

bool fe_is_function(const char *name)
{
    return !strcmp(name, "max") || !strcmp(name, "min");
}

/* PyTorch's habit LayerNorm(C), BatchNorm2d(C): a size given where mgc's first
   argument is eps. A size is an integer of at least 2, or the input's dimension 1
   (what these layers normalise); mgc takes it from the input. */
bool fe_layer_size_for_eps(Elab *E, Loc where, const Layer *L, int x, long long v)
{
    if (L->nargs < 1 || strcmp(L->args[0].name, "eps")) return false;
    const Shape *s = ir_shape(E->g, x);
    bool ln = !strcmp(L->name, "layernorm");
    long long size = s->nd < 2 ? -1 : ln ? ir_ln_channels(s) : s->d[1];
    if (v < 2 && v != size) return false;
    diag_at(E->d, where, "%s: the first argument is 'eps', not a size (%lld); the size comes from the input "
            "(%s), so write '%s', or '%s(eps = 1e-5)' to set eps%s",
            L->name, v, ir_shape_str(E->a, s), L->name, L->name,
            ln ? " (nn.LayerNorm over the last dimensions: 'layernorm(shape = [...])')" : "");
    return true;
}

FeDef *fe_find_block(FeDef *defs, const char *name)
{
    for (FeDef *d = defs; d; d = d->next)
        if (!d->is_net && !strcmp(d->name, name)) return d;
    return NULL;
}

/* The closest of cands[0..n) to name, if close enough to be a likely typo. */
const char *fe_suggest(const char *name, const char *const *cands, int n)
{
    const char *best = NULL;
    int bestd = 1 << 30;
    int len = (int)strlen(name);
    for (int i = 0; i < n; i++) {
        if (!cands[i]) continue;
        int dist = diag_edit_distance(name, cands[i]);
        if (dist < bestd) { bestd = dist; best = cands[i]; }
    }
    if (best && bestd <= 2 && bestd < len) return best;
    return NULL;
}

/* An argument's default as the .net language writes it, into buf. */
static const char *default_str(const LayerArg *a, char *buf, size_t size)
{
    if (a->def == DEF_KERNEL) return "kernel";
    if (a->def == DEF_HEIGHT) return "height";
    if (a->type == A_TENSOR || a->type == A_SHAPE || a->def == DEF_ABSENT) return "none";
    if (a->def == DEF_LAST) return "-1";
    if (a->def == DEF_INFERRED) return "(inferred)";
    if (a->type == A_BOOL) return a->def ? "true" : "false";
    if (a->type == A_CHOICE) {   /* the default's name */
        const char *c = a->choices;
        for (int k = 0; k < (int)a->def; k++) c += strcspn(c, ",") + 1;
        snprintf(buf, size, "%.*s", (int)strcspn(c, ","), c);
        return buf;
    }
    snprintf(buf, size, "%g", a->def);
    char *e = strstr(buf, "e-0");   /* 1e-5, as the .net language (and PyTorch) writes it */
    if (e) memmove(e + 2, e + 3, strlen(e + 3) + 1);
    return buf;
}

const char *fe_layer_signature(const Layer *L, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "%s(", L->name);
    for (int i = 0; i < L->nargs && n < size; i++) {
        const LayerArg *a = &L->args[i];
        char d[32];
        const char *sep = i ? ", " : "";
        if (a->required) n += (size_t)snprintf(buf + n, size - n, "%s%s", sep, a->name);
        else if (a->def == DEF_INFERRED && a->type != A_TENSOR) n += (size_t)snprintf(buf + n, size - n, "%s%s = inferred", sep, a->name);
        else n += (size_t)snprintf(buf + n, size - n, "%s%s = %s", sep, a->name, default_str(a, d, sizeof d));
    }
    if (n < size) snprintf(buf + n, size - n, ")");
    return buf;
}

bool fe_layer_arg_in_range(Elab *E, Loc where, const Layer *L, int k, long long iv, double fv)
{
    const LayerArg *a = &L->args[k];
    if (a->type == A_INT) {
        long long lo = (long long)a->lo, hi = (long long)a->hi;
        if (iv >= lo && iv <= hi) return true;
        if (iv < lo && lo == 0) diag_at(E->d, where, "%s: '%s' must not be negative, got %lld", L->name, a->name, iv);
        else if (iv < lo) diag_at(E->d, where, "%s: '%s' must be at least %lld, got %lld", L->name, a->name, lo, iv);
        else diag_at(E->d, where, "%s: '%s' = %lld is too large (the limit is %lld)", L->name, a->name, iv, hi);
        return false;
    }
    if (a->type != A_FLOAT) return true;
    bool ok = (a->lo_open ? fv > a->lo : fv >= a->lo) && (a->hi_open ? fv < a->hi : fv <= a->hi);
    if (!ok) {
        diag_at(E->d, where, "%s: '%s' must be in %c%g, %g%c, got %g", L->name, a->name, a->lo_open ? '(' : '[', a->lo, a->hi,
                a->hi_open ? ')' : ']', fv);
        return false;
    }
    /* the range holds for the value as the kernels get it, rounded to float32:
       dropout's p = 0.99999999 is 1 there, and 1 / (1 - p) infinity */
    char why[256];
    if (diag_f32_rounding(fv, a->lo, a->lo_open, a->hi, a->hi_open, why, sizeof why)) {
        diag_at(E->d, where, "%s: '%s' = %s", L->name, a->name, why);
        return false;
    }
    return true;
}

/* docs/language.md's layer table: a row per layer. */
void fe_print_layers(FILE *out)
{
    fprintf(out, "| layer | arguments | checks |\n|---|---|---|\n");
    for (int l = 0; l < fe_nlayers; l++) {
        const Layer *L = &fe_layers[l];
        fprintf(out, "| `%s` | ", L->name);
        for (int k = 0; k < L->nargs; k++) {
            const LayerArg *a = &L->args[k];
            char d[32];
            fprintf(out, "%s`%s", k ? ", " : "", a->name);
            if (!a->required) fprintf(out, " = %s", default_str(a, d, sizeof d));
            fprintf(out, "`%s", a->type == A_TENSOR ? " (a tensor)" : a->type == A_SHAPE ? " (a shape)" : "");
        }
        fprintf(out, " | ");
        int said = 0;
        for (int k = 0; k < L->nargs; k++) {
            const LayerArg *a = &L->args[k];
            if (a->type == A_INT) fprintf(out, "%s%s in [%.0f, %.0f]", said++ ? "; " : "", a->name, a->lo, a->hi);
            else if (a->type == A_CHOICE) {
                fprintf(out, "%s%s: ", said++ ? "; " : "", a->name);
                for (const char *c = a->choices; *c; c++) fprintf(out, *c == ',' ? " or " : "%c", *c);
            }
            else if (a->type == A_FLOAT)
                fprintf(out, "%s%s in %c%g, %g%c", said++ ? "; " : "", a->name, a->lo_open ? '(' : '[', a->lo, a->hi,
                        a->hi_open ? ')' : ']');
        }
        fprintf(out, "%s%s |\n", said && L->checks[0] ? "; " : "", L->checks);
    }
}
