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
#define INT_ARG(name, req, def, lo) { name, A_INT, req, def, lo, MAX, false, false }
#define FLOAT_ARG(name, def, lo, lo_open, hi, hi_open) { name, A_FLOAT, false, def, lo, hi, lo_open, hi_open }
#define BOOL_ARG(name, def) { name, A_BOOL, false, def, 0, 1, false, false }
#define TENSOR_ARG(name) { name, A_TENSOR, true, 0, 0, 0, false, false }
#define MORE_TENSOR_ARG(name) { name, A_TENSOR, false, DEF_NONE, 0, 0, false, false }

static int build_conv2d(const LayerCall *c)
{
    return ir_conv2d(c->g, c->loc, c->prefix, c->x, (int)c->i[0], (int)c->i[1], (int)c->i[2], (int)c->i[3], (int)c->i[5],
                     (int)c->i[6], c->i[4] != 0);
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
    return ir_maxpool2d(c->g, c->loc, c->x, (int)c->i[0], (int)c->i[1], (int)c->i[2]);
}

static int build_avgpool2d(const LayerCall *c)
{
    if (!pool_padding(c, "avgpool2d")) return -1;
    return ir_avgpool2d(c->g, c->loc, c->x, (int)c->i[0], (int)c->i[1], (int)c->i[2]);
}

static int build_global_avgpool(const LayerCall *c) { return ir_global_avgpool(c->g, c->loc, c->x); }
static int build_global_maxpool(const LayerCall *c) { return ir_global_maxpool(c->g, c->loc, c->x); }
static int build_upsample(const LayerCall *c) { return ir_upsample(c->g, c->loc, c->x, (int)c->i[0]); }

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

/* q -> attention(k, v, heads, causal) */
static int build_attention(const LayerCall *c)
{
    for (int k = 0; k < 2; k++)
        if (c->i[k] == c->E->loss_node) {
            diag_at(c->E->d, c->where[k], "the loss cannot be an input of 'attention'");
            return -1;
        }
    return ir_attention(c->g, c->loc, c->x, (int)c->i[0], (int)c->i[1], (int)c->i[2], c->i[3] != 0);
}

/* the input and the tensors given, side by side along dimension 1 */
static int build_concat(const LayerCall *c)
{
    int in[FE_MAX_LAYER_ARGS + 1] = { c->x }, n = 1;
    for (int k = 0; k < c->layer->nargs; k++) {
        if (c->i[k] < 0) continue;   /* not given */
        if (c->i[k] == c->E->loss_node) {
            diag_at(c->E->d, c->where[k], "the loss cannot be an input of 'concat'");
            return -1;
        }
        in[n++] = (int)c->i[k];
    }
    return ir_concat(c->g, c->loc, n, in);
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
    { "linear", true, 3, { INT_ARG("out_features", true, 0, 1), BOOL_ARG("bias", 1), INT_ARG("in_features", false, DEF_INFERRED, 1) },
      build_linear, "input `[N, F]`, or `[N, T, F]` (each of the N * T rows, a transformer's tokens: `[N, T, out_features]`); "
                    "an explicit `in_features` must equal F" },
    { "batchnorm2d", true, 2, { FLOAT_ARG("eps", 1e-5, 0, true, 1, true), FLOAT_ARG("momentum", 0.1, 0, false, 1, false) },
      build_batchnorm2d, "input `[N, C, H, W]`" },
    { "batchnorm1d", true, 2, { FLOAT_ARG("eps", 1e-5, 0, true, 1, true), FLOAT_ARG("momentum", 0.1, 0, false, 1, false) },
      build_batchnorm1d, "input `[N, F]` (after `linear`): statistics over the batch, as PyTorch's `BatchNorm1d`" },
    { "layernorm", true, 1, { FLOAT_ARG("eps", 1e-5, 0, true, 1, true) }, build_layernorm,
      "over the features of `[N, F]` (PyTorch's `LayerNorm(F)`), the last dimension of `[N, T, D]` (`LayerNorm(D)`: "
      "each token), or the channels of `[N, C, H, W]` at each position (`LayerNorm(C)` over channels-last, as ConvNeXt's)" },
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
    { "maxpool2d", false, 3, { INT_ARG("kernel", true, 0, 1), INT_ARG("stride", false, DEF_KERNEL, 1), INT_ARG("padding", false, 0, 0) },
      build_maxpool2d, "input `[N, C, H, W]`; padding <= kernel / 2" },
    { "avgpool2d", false, 3, { INT_ARG("kernel", true, 0, 1), INT_ARG("stride", false, DEF_KERNEL, 1), INT_ARG("padding", false, 0, 0) },
      build_avgpool2d, "input `[N, C, H, W]`; padding <= kernel / 2 (counted in the mean, as PyTorch)" },
    { "global_avgpool", false, 0, { { 0 } }, build_global_avgpool, "`[N, C, H, W]` -> `[N, C, 1, 1]`" },
    { "global_maxpool", false, 0, { { 0 } }, build_global_maxpool, "`[N, C, H, W]` -> `[N, C, 1, 1]`: each plane's maximum" },
    { "adaptive_avgpool", false, 2, { INT_ARG("height", true, 0, 1), INT_ARG("width", false, DEF_HEIGHT, 1) },
      build_adaptive_avgpool, "`[N, C, H, W]` -> `[N, C, height, width]`, PyTorch's windows (`AdaptiveAvgPool2d`)" },
    { "upsample", false, 1, { INT_ARG("scale", false, 2, 1) }, build_upsample,
      "nearest: each pixel `scale x scale` times (`Upsample(scale_factor=scale)`)" },
    { "flatten", false, 1, { INT_ARG("start", false, 1, 1) }, build_flatten,
      "`[N, ...]` -> `[N, F]`; from dimension `start` on: `[N, C, H, W]` from 2 is `[N, C, H * W]` (PyTorch's `flatten(start)`)" },
    { "transpose", false, 2, { INT_ARG("dim0", true, 0, 1), INT_ARG("dim1", true, 0, 1) }, build_transpose,
      "dimensions `dim0` and `dim1` (not 0, the batch) swapped: `[N, D, T]` by (1, 2) is `[N, T, D]` (a copy)" },
    { "select", false, 2, { INT_ARG("axis", true, 0, 1), INT_ARG("index", true, 0, 0) }, build_select,
      "index `index` of dimension `axis`, that dimension gone: `[N, T, D]` by (1, 0) is `[N, D]` (PyTorch's `x[:, 0]`: a class token)" },
    { "dropout", false, 1, { FLOAT_ARG("p", 0.5, 0, false, 1, true) }, build_dropout, "" },
    { "add", false, 1, { TENSOR_ARG("other") }, build_add, "as `mul`: `x + other` (a residual connection: both shapes equal)" },
    { "concat", false, 6, { TENSOR_ARG("b"), MORE_TENSOR_ARG("c"), MORE_TENSOR_ARG("d"), MORE_TENSOR_ARG("e"), MORE_TENSOR_ARG("f"),
                            MORE_TENSOR_ARG("g") },
      build_concat, "`x -> concat(b, c, ...)`: the tensors side by side along dimension 1 (channels, or features), alike in "
                    "every other; up to 7 (nest for more); its gradient splits dy" },
    { "mul", false, 1, { TENSOR_ARG("other") }, build_broadcast,
      "PyTorch's broadcasting: each dimension equal, or 1 in one of them (`[N, C, H, W]` by `[N, C, 1, 1]`: an SE block's gate)" },
    { "sub", false, 1, { TENSOR_ARG("other") }, build_broadcast, "as `mul`: `x - other`" },
    { "attention", false, 4, { TENSOR_ARG("k"), TENSOR_ARG("v"), INT_ARG("heads", false, 1, 1), BOOL_ARG("causal", 0) }, build_attention,
      "`q -> attention(k, v, heads)`: scaled dot-product attention, PyTorch's (`F.scaled_dot_product_attention` on q, k, v "
      "split into heads): q `[N, Tq, D]`, k and v `[N, Tk, D]`, each head `softmax(q k^T / sqrt(D / heads)) v`, the heads side "
      "by side `[N, Tq, D]`; `causal`: query i sees keys 0..i. No `[N, heads, Tq, Tk]` tensor is stored" },
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
    long long size = s->nd < 2 ? -1 : !strcmp(L->name, "layernorm") ? ir_ln_channels(s) : s->d[1];
    if (v < 2 && v != size) return false;
    diag_at(E->d, where, "%s: the first argument is 'eps', not a size (%lld); the size comes from the input "
            "(%s), so write '%s', or '%s(eps = 1e-5)' to set eps",
            L->name, v, ir_shape_str(E->a, s), L->name, L->name);
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
    if (a->type == A_TENSOR) return "none";
    if (a->def == DEF_INFERRED) return "(inferred)";
    if (a->type == A_BOOL) return a->def ? "true" : "false";
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
            fprintf(out, "`%s", a->type == A_TENSOR ? " (a tensor)" : "");
        }
        fprintf(out, " | ");
        int said = 0;
        for (int k = 0; k < L->nargs; k++) {
            const LayerArg *a = &L->args[k];
            if (a->type == A_INT) fprintf(out, "%s%s in [%.0f, %.0f]", said++ ? "; " : "", a->name, a->lo, a->hi);
            else if (a->type == A_FLOAT)
                fprintf(out, "%s%s in %c%g, %g%c", said++ ? "; " : "", a->name, a->lo_open ? '(' : '[', a->lo, a->hi,
                        a->hi_open ? ')' : ']');
        }
        fprintf(out, "%s%s |\n", said && L->checks[0] ? "; " : "", L->checks);
    }
}
