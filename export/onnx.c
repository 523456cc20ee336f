/*
** ONNX export (mgc export CK --format onnx --out model.onnx): the evaluation
** graph, from the input to the logits, as an ONNX model of IR version 8 and
** opset 17 (ONNX 1.12's), its messages those of ONNX's own onnx.proto as
** protobuf-c generates them (the Makefile makes onnx.pb-c.[ch] from it).
**
**   input   "images"  float32 [N, C, H, W], N any: pixels as mgc reads them
**                     (byte / 255 as ToTensor gives them, or F32 as stored),
**                     resized beforehand where the checkpoint says --resize;
**                     --normalize's per-channel mean and std are the model's
**                     first ops (Sub, Div)
**   output  "logits"  float32 [N, classes]: the loss's first input
**   weights initializers named as the checkpoint's tensors (PyTorch's
**           state_dict names), float32, raw little-endian
**
** The labels, the loss and the count of hits are left out. Each IR op of an
** evaluation graph is one ONNX op or a short chain of them (ir_to_onnx, one
** case an op; docs/export-onnx.md has the table). An op that only a training
** graph holds (bn_stats, dropout_mask, gradients, updates) is refused,
** named with its place in the .net file, before anything is written.
*/
#include "export.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#ifndef HAVE_ONNX

int ex_onnx(const ExModel *m, const char *path, char *err, size_t err_size)
{
    (void)m;
    snprintf(err, err_size, "cannot write %s: this mgc was built without ONNX export; install protoc-c, protobuf-c and "
             "ONNX's onnx.proto (Debian: apt-get install protobuf-c-compiler libprotobuf-c-dev libonnx-dev) and build "
             "mgc again", path);
    return -1;
}

const char *ex_onnx_about(char *buf, size_t size)
{
    snprintf(buf, size, "not built in (no protoc-c, protobuf-c or onnx.proto at build time, or ONNX=0): "
             "mgc export --format onnx refuses");
    return buf;
}

#else

#include "onnx.pb-c.h"
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define ONNX_IR_VERSION 8
#define ONNX_OPSET      17

typedef struct Ox {
    Arena a;                  /* every message, string and converted tensor of the model */
    const ExModel *m;
    const Graph *g;
    const char **value;       /* [g->n]: the ONNX value each IR node's output is, NULL until made */
    bool *needed;             /* [g->n]: on the way from the input to the logits */
    Onnx__NodeProto **nodes;
    size_t nnodes, nodes_cap;
    Onnx__TensorProto **inits;
    size_t ninits, inits_cap;
    const char **names;       /* every name given so far (values, initializers), to keep them apart:
                                 open addressing by ir_hash_name, at most half full; names_cap a power of 2 */
    size_t nnames, names_cap;
    struct { float v; const char *name; } scalars[16];   /* the scalar constants made, by value */
    int nscalars;
    char *err;
    size_t err_size;
} Ox;

static void *grow(Ox *o, void *v, size_t *cap, size_t n, size_t size)
{
    if (n < *cap) return v;
    size_t more = *cap ? 2 * *cap : 64;
    v = arena_grow(&o->a, v, *cap * size, more * size);
    *cap = more;
    return v;
}

/* name's slot in the table of names: where it is, or the empty one where it would go */
static size_t slot(const Ox *o, const char *name)
{
    size_t mask = o->names_cap - 1, k = ir_hash_name(name) & mask;
    while (o->names[k] && strcmp(o->names[k], name)) k = (k + 1) & mask;
    return k;
}

static bool taken(const Ox *o, const char *name) { return o->names_cap && o->names[slot(o, name)]; }

/* name, kept as given; the caller has made sure no other value or initializer has it. */
static const char *claim(Ox *o, const char *name)
{
    if (2 * (o->nnames + 1) > o->names_cap) {   /* twice the room, every name placed again */
        const char **old = o->names;
        size_t old_cap = o->names_cap;
        o->names_cap = old_cap ? 2 * old_cap : 256;
        o->names = arena_alloc(&o->a, sizeof *o->names * o->names_cap);
        for (size_t k = 0; k < old_cap; k++)
            if (old[k]) o->names[slot(o, old[k])] = old[k];
    }
    o->names[slot(o, name)] = name;
    o->nnames++;
    return name;
}

/* A fresh name from base: base itself, or base_2, base_3, ... when taken. */
static const char *fresh(Ox *o, const char *base)
{
    const char *name = base;
    for (int k = 2; taken(o, name); k++) name = arena_printf(&o->a, "%s_%d", base, k);
    return claim(o, name);
}

/* "nets/lenet.net:6:24" */
static const char *where(Ox *o, const Node *n)
{
    if (!n->loc.file) return "(made by a pass: no place in the .net file)";
    return arena_printf(&o->a, "%s:%d:%d", n->loc.file->name, n->loc.line, n->loc.col);
}

static int fail(Ox *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Ox *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->err, o->err_size, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- messages ---- */

static Onnx__NodeProto *node(Ox *o, const char *type, const char *out, int nin, const char *const *in, const Node *from)
{
    Onnx__NodeProto *n = arena_alloc(&o->a, sizeof *n);
    onnx__node_proto__init(n);
    n->op_type = (char *)type;
    n->name = (char *)out;
    n->n_input = (size_t)nin;
    n->input = arena_alloc(&o->a, sizeof *n->input * (size_t)(nin ? nin : 1));
    for (int k = 0; k < nin; k++) n->input[k] = (char *)in[k];
    n->n_output = 1;
    n->output = arena_alloc(&o->a, sizeof *n->output);
    n->output[0] = (char *)out;
    if (from) n->doc_string = arena_printf(&o->a, "%s at %s", ir_op_name(from->op), where(o, from));
    o->nodes = grow(o, o->nodes, &o->nodes_cap, o->nnodes, sizeof *o->nodes);
    o->nodes[o->nnodes++] = n;
    return n;
}

static Onnx__AttributeProto *attr(Ox *o, Onnx__NodeProto *n, const char *name, Onnx__AttributeProto__AttributeType type)
{
    Onnx__AttributeProto *a = arena_alloc(&o->a, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = (char *)name;
    a->has_type = 1;
    a->type = type;
    n->attribute = arena_grow(&o->a, n->attribute, n->n_attribute * sizeof *n->attribute,
                              (n->n_attribute + 1) * sizeof *n->attribute);
    n->attribute[n->n_attribute++] = a;
    return a;
}

static void attr_int(Ox *o, Onnx__NodeProto *n, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = attr(o, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    a->has_i = 1, a->i = v;
}

static void attr_float(Ox *o, Onnx__NodeProto *n, const char *name, float v)
{
    Onnx__AttributeProto *a = attr(o, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    a->has_f = 1, a->f = v;
}

static void attr_string(Ox *o, Onnx__NodeProto *n, const char *name, const char *v)
{
    Onnx__AttributeProto *a = attr(o, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
    a->has_s = 1, a->s.len = strlen(v), a->s.data = (uint8_t *)v;
}

/* ints: count values, each of them v (a window's two sides, four paddings) */
static void attr_ints(Ox *o, Onnx__NodeProto *n, const char *name, int count, int64_t v)
{
    Onnx__AttributeProto *a = attr(o, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    a->n_ints = (size_t)count;
    a->ints = arena_alloc(&o->a, sizeof *a->ints * (size_t)count);
    for (int k = 0; k < count; k++) a->ints[k] = v;
}

static void attr_int_list(Ox *o, Onnx__NodeProto *n, const char *name, int count, const int64_t *v)
{
    Onnx__AttributeProto *a = attr(o, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    a->n_ints = (size_t)count;
    a->ints = arena_alloc(&o->a, sizeof *a->ints * (size_t)count);
    memcpy(a->ints, v, sizeof *v * (size_t)count);
}

/* An initializer: nd dims, its bytes (float32 or int64, little-endian, as this host's) not copied. */
static const char *initializer(Ox *o, const char *name, int type, int nd, const int64_t *dims, const void *data, size_t nbytes)
{
    Onnx__TensorProto *t = arena_alloc(&o->a, sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = (char *)name;
    t->has_data_type = 1;
    t->data_type = type;
    t->n_dims = (size_t)nd;
    t->dims = arena_alloc(&o->a, sizeof *t->dims * (size_t)(nd ? nd : 1));
    if (nd) memcpy(t->dims, dims, sizeof *dims * (size_t)nd);
    t->has_raw_data = 1;
    t->raw_data.len = nbytes;
    t->raw_data.data = (uint8_t *)data;
    o->inits = grow(o, o->inits, &o->inits_cap, o->ninits, sizeof *o->inits);
    o->inits[o->ninits++] = t;
    return name;
}

static const char *const_f32(Ox *o, const char *base, int nd, const int64_t *dims, const float *v)
{
    long long count = 1;
    for (int k = 0; k < nd; k++) count *= dims[k];
    float *copy = arena_alloc(&o->a, sizeof *copy * (size_t)count);
    memcpy(copy, v, sizeof *copy * (size_t)count);
    return initializer(o, fresh(o, base), ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, nd, dims, copy, sizeof *copy * (size_t)count);
}

static const char *const_i64(Ox *o, const char *base, int count, const int64_t *v)
{
    int64_t *copy = arena_alloc(&o->a, sizeof *copy * (size_t)count);
    memcpy(copy, v, sizeof *copy * (size_t)count);
    int64_t dim = count;
    return initializer(o, fresh(o, base), ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, &dim, copy, sizeof *copy * (size_t)count);
}

/* A float32 scalar, one initializer per value however often used ("const_0.5"). */
static const char *scalar(Ox *o, float v)
{
    for (int k = 0; k < o->nscalars; k++)
        if (!memcmp(&o->scalars[k].v, &v, sizeof v)) return o->scalars[k].name;
    float *data = arena_alloc(&o->a, sizeof *data);
    *data = v;
    const char *name = initializer(o, fresh(o, arena_printf(&o->a, "const_%.9g", (double)v)), ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT,
                                   0, NULL, data, sizeof *data);
    if (o->nscalars < (int)(sizeof o->scalars / sizeof *o->scalars))
        o->scalars[o->nscalars].v = v, o->scalars[o->nscalars++].name = name;
    return name;
}

/* ---- the checkpoint's tensors ---- */

/* The PARAM or STATE node id as an initializer under its own name, from the
   checkpoint, checked against the graph's shape; made once. NULL, said, where
   the checkpoint lacks it or holds it in another shape. */
static const char *weight(Ox *o, int id, const Node *user)
{
    const Node *p = &o->g->nodes[id];
    if (o->value[id]) return o->value[id];
    const StTensor *t = st_find(o->m->weights, p->name);
    if (!t) {
        fail(o, "the checkpoint has no tensor '%s' (of the %s at %s)", p->name, ir_op_name(user->op), where(o, user));
        return NULL;
    }
    bool same = t->nd == p->shape.nd;
    for (int k = 0; same && k < p->shape.nd; k++) same = t->shape[k] == p->shape.d[k];
    if (!same) {
        char *dims = "";
        for (int k = 0; k < t->nd; k++) dims = arena_printf(&o->a, "%s%s%lld", dims, k ? "," : "", t->shape[k]);
        fail(o, "the checkpoint's '%s' is [%s], the net's %s (the %s at %s)", p->name, dims, ir_shape_str(&o->a, &p->shape),
             ir_op_name(user->op), where(o, user));
        return NULL;
    }
    long long count = st_numel(t);
    const void *data = t->data;
    if (strcmp(t->dtype, "F32")) {   /* another float or int type: float32, as the net computes */
        float *f = arena_alloc(&o->a, sizeof *f * (size_t)(count ? count : 1));
        if (st_to_f32(t, f)) {
            fail(o, "the checkpoint's '%s' is of type %s, which cannot be read as float32", p->name, t->dtype);
            return NULL;
        }
        data = f;
    }
    int64_t dims[IR_MAXDIM];
    for (int k = 0; k < p->shape.nd; k++) dims[k] = p->shape.d[k];
    return o->value[id] = initializer(o, p->name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, p->shape.nd, dims, data,
                                      sizeof(float) * (size_t)count);
}

/* ---- the ops ---- */

/* Why op has no ONNX form here, or NULL where it has one (or is folded into
   the op that reads it: bn_eval_stats into BatchNormalization, ln_stats into
   LayerNormalization). */
static const char *no_onnx_form(Op op)
{
    switch (op) {
    case OP_INPUT: case OP_PARAM: case OP_STATE:
    case OP_CONV2D: case OP_LINEAR: case OP_BN_EVAL_STATS: case OP_BN_APPLY: case OP_LN_STATS: case OP_LN_APPLY:
    case OP_RELU: case OP_SIGMOID: case OP_TANH: case OP_LEAKY_RELU: case OP_SILU: case OP_GELU: case OP_GELU_TANH:
    case OP_RELU6: case OP_HARDSIGMOID: case OP_HARDSWISH: case OP_ELU: case OP_MISH: case OP_SCALE:
    case OP_MAXPOOL: case OP_AVGPOOL: case OP_GAP: case OP_GLOBAL_MAXPOOL: case OP_UPSAMPLE: case OP_ADAPTIVE_AVGPOOL:
    case OP_RESHAPE: case OP_CONCAT: case OP_ADD: case OP_MUL: case OP_SUB: case OP_ATTN_STATS: case OP_ATTENTION:
    case OP_TRANSPOSE: case OP_SELECT: case OP_REDUCE_SUM: case OP_REDUCE_MEAN: case OP_SOFTMAX: case OP_MATMUL:
    case OP_CONV2D_BWD_X:   /* in an evaluation graph, a conv_transpose2d layer */
        return NULL;
    case OP_BN_STATS: case OP_BN_SUM: case OP_BN_SQDEV: case OP_BN_FINISH:
        return "BatchNorm on the batch's own statistics is training's; an evaluation graph normalises with the running ones";
    case OP_DROPOUT_MASK:
        return "a fresh random mask each step is training's; dropout is the identity in an evaluation graph";
    case OP_LABELS: case OP_XENT: case OP_ACCURACY:
        return "the labels and the loss are not on the way to the logits";
    default:
        return "it is not an op of an evaluation graph (a gradient, an update, a collective, or a view the passes make)";
    }
}

/* The value of node n's input k (an initializer for a PARAM or STATE). */
static const char *in(Ox *o, const Node *n, int k)
{
    int id = n->in[k];
    Op op = o->g->nodes[id].op;
    if ((op == OP_PARAM || op == OP_STATE) && !o->value[id]) return weight(o, id, n);
    if (!o->value[id]) fail(o, "internal: the %s at %s reads %%%d (%s), which has no ONNX value", ir_op_name(n->op), where(o, n),
                            id, ir_op_name(op));
    return o->value[id];
}

/* Several inputs' values at once: false (said) where one is missing. */
static bool ins(Ox *o, const Node *n, int count, const char **v)
{
    for (int k = 0; k < count; k++)
        if (!(v[k] = in(o, n, k))) return false;
    return true;
}

/* A step of a chain that computes one IR node: named after its output ("gelu_7/erf"). */
static const char *step(Ox *o, const char *out, const char *what) { return fresh(o, arena_printf(&o->a, "%s/%s", out, what)); }

static const char *unary(Ox *o, const char *type, const char *out, const char *x, const Node *from)
{
    node(o, type, out, 1, &x, from);
    return out;
}

static const char *binary(Ox *o, const char *type, const char *out, const char *a, const char *b, const Node *from)
{
    const char *v[2] = { a, b };
    node(o, type, out, 2, v, from);
    return out;
}

/* PyTorch's AdaptiveAvgPool2d along one side: the matrix [O, I] (rows: true) or
   [I, O] whose cell (o, i) is 1 / |window o| where i is in window o,
   [floor(o I / O), ceil((o + 1) I / O)), as codegen/pool.c's kernel takes them. */
static const char *adaptive_matrix(Ox *o, const char *out, int I, int O, bool rows)
{
    float *w = arena_alloc(&o->a, sizeof *w * (size_t)I * (size_t)O);
    for (int c = 0; c < O; c++) {
        int lo = (int)((long)c * I / O), hi = (int)(((long)c + 1) * I + O - 1) / O;
        for (int i = lo; i < hi; i++) w[rows ? (long)c * I + i : (long)i * O + c] = 1.0f / (float)(hi - lo);
    }
    int64_t dims[2] = { rows ? O : I, rows ? I : O };
    return initializer(o, step(o, out, rows ? "rows" : "columns"), ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, dims, w,
                       sizeof *w * (size_t)I * (size_t)O);
}

/* Node n as ONNX, its output called out: 0, or -1 said. */
/* An activation of ir/activations.def (n) as ONNX nodes making out. */
static int activation_to_onnx(Ox *o, const Node *n, const char *out)
{
    const char *x;
    if (!ins(o, n, 1, &x)) return -1;
    switch (n->op) {
    case OP_RELU: case OP_SIGMOID: case OP_TANH: {
        unary(o, n->op == OP_RELU ? "Relu" : n->op == OP_SIGMOID ? "Sigmoid" : "Tanh", out, x, n);
        return 0;
    }
    case OP_LEAKY_RELU: case OP_ELU: {   /* LeakyRelu(alpha = slope); Elu(alpha) */
        Onnx__NodeProto *a = node(o, n->op == OP_ELU ? "Elu" : "LeakyRelu", out, 1, &x, n);
        attr_float(o, a, "alpha", n->op == OP_ELU ? n->attr.alpha : n->attr.slope);
        return 0;
    }
    case OP_SILU: {   /* x * Sigmoid(x) */
        binary(o, "Mul", out, x, unary(o, "Sigmoid", step(o, out, "sigmoid"), x, n), n);
        return 0;
    }
    case OP_MISH: {   /* x * Tanh(Softplus(x)): Mish is opset 18's */
        const char *sp = unary(o, "Softplus", step(o, out, "softplus"), x, n);
        binary(o, "Mul", out, x, unary(o, "Tanh", step(o, out, "tanh"), sp, n), n);
        return 0;
    }
    case OP_GELU: {   /* 0.5 x (1 + Erf(x / sqrt 2)): opset 17 has no Gelu */
        const char *e = unary(o, "Erf", step(o, out, "erf"),
                              binary(o, "Mul", step(o, out, "scaled"), x, scalar(o, 0.70710678118654752f), n), n);
        const char *xe = binary(o, "Mul", step(o, out, "x_phi2"), x, binary(o, "Add", step(o, out, "one_plus"), e, scalar(o, 1.0f), n), n);
        binary(o, "Mul", out, xe, scalar(o, 0.5f), n);
        return 0;
    }
    case OP_GELU_TANH: {   /* 0.5 x (1 + Tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
        const char *x3 = binary(o, "Mul", step(o, out, "cube"), binary(o, "Mul", step(o, out, "square"), x, x, n), x, n);
        const char *u = binary(o, "Add", step(o, out, "inner"), x, binary(o, "Mul", step(o, out, "cubic_term"), x3, scalar(o, 0.044715f), n), n);
        const char *t = unary(o, "Tanh", step(o, out, "tanh"), binary(o, "Mul", step(o, out, "scaled"), u, scalar(o, 0.79788456080286536f), n), n);
        const char *xt = binary(o, "Mul", step(o, out, "x_tanh2"), x, binary(o, "Add", step(o, out, "one_plus"), t, scalar(o, 1.0f), n), n);
        binary(o, "Mul", out, xt, scalar(o, 0.5f), n);
        return 0;
    }
    case OP_RELU6: {   /* Clip(x, 0, 6) */
        const char *c[3] = { x, scalar(o, 0.0f), scalar(o, 6.0f) };
        node(o, "Clip", out, 3, c, n);
        return 0;
    }
    case OP_HARDSIGMOID: case OP_HARDSWISH: {   /* relu6(x + 3) / 6 = max(0, min(1, x / 6 + 1/2)); HardSwish: x times that */
        Onnx__NodeProto *h = node(o, n->op == OP_HARDSIGMOID ? "HardSigmoid" : "HardSwish", out, 1, &x, n);
        if (n->op == OP_HARDSIGMOID) attr_float(o, h, "alpha", 1.0f / 6.0f), attr_float(o, h, "beta", 0.5f);
        return 0;
    }
    case OP_SCALE: {   /* x * factor + shift: Mul, then Add (a shift of 0 left out) */
        const char *m = n->attr.shift == 0 ? out : step(o, out, "scaled");
        binary(o, "Mul", m, x, scalar(o, n->attr.factor), n);
        if (n->attr.shift != 0) binary(o, "Add", out, m, scalar(o, n->attr.shift), n);
        return 0;
    }
    default:
        return fail(o, "internal: no ONNX form for %s at %s", ir_op_name(n->op), where(o, n));
    }
}

/* t [N, T, D] as [N, H, T, dh] (perm 0, 2, 1, 3), or [N, H, dh, T] (0, 2, 3, 1: keys to multiply by) */
static const char *heads_of(Ox *o, const Node *n, const char *t, const char *out, const char *what, bool keys)
{
    int H = n->attr.heads, dh = o->g->nodes[n->in[0]].shape.d[2] / H;
    const char *r[2] = { t, const_i64(o, "heads_shape", 4, (int64_t[]){ 0, -1, H, dh }) }, *split = step(o, out, what);
    node(o, "Reshape", split, 2, r, n);
    const char *moved = step(o, out, arena_printf(&o->a, "%s_by_head", what));
    attr_int_list(o, node(o, "Transpose", moved, 1, &split, n), "perm", 4, keys ? (int64_t[]){ 0, 2, 3, 1 } : (int64_t[]){ 0, 2, 1, 3 });
    return moved;
}

/* attention (its attention_stats read by it): by head, Softmax(q k^T / sqrt(dh), causal: + a mask of
   -inf above the diagonal) v, the heads side by side again */
static int attention_to_onnx(Ox *o, const Node *n, const char *out)
{
    const char *v[3];
    if (!ins(o, n, 3, v)) return -1;
    const Shape *qs = &o->g->nodes[n->in[0]].shape, *ks = &o->g->nodes[n->in[1]].shape;
    int D = qs->d[2], Tq = qs->d[1], Tk = ks->d[1];
    const char *q = heads_of(o, n, v[0], out, "q", false), *k = heads_of(o, n, v[1], out, "k", true);
    const char *vh = heads_of(o, n, v[2], out, "v", false);
    const char *s = binary(o, "Mul", step(o, out, "scores"), binary(o, "MatMul", step(o, out, "qk"), q, k, n),
                           scalar(o, (float)(1.0 / sqrt((double)(D / n->attr.heads)))), n);
    if (n->attr.causal) {
        float *mask = arena_alloc(&o->a, sizeof *mask * (size_t)Tq * (size_t)Tk);
        for (int i = 0; i < Tq; i++)
            for (int j = 0; j < Tk; j++) mask[(long)i * Tk + j] = j <= i ? 0.0f : -INFINITY;
        s = binary(o, "Add", step(o, out, "causal"), s, const_f32(o, "causal_mask", 2, (int64_t[]){ Tq, Tk }, mask), n);
    }
    const char *p = step(o, out, "weights");
    attr_int(o, node(o, "Softmax", p, 1, &s, n), "axis", -1);
    const char *oh = binary(o, "MatMul", step(o, out, "by_head"), p, vh, n), *back = step(o, out, "heads_last");
    attr_int_list(o, node(o, "Transpose", back, 1, &oh, n), "perm", 4, (int64_t[]){ 0, 2, 1, 3 });
    const char *r[2] = { back, const_i64(o, "tokens_shape", 3, (int64_t[]){ 0, -1, D }) };
    node(o, "Reshape", out, 2, r, n);
    return 0;
}

/* transpose: Transpose by the permutation that swaps the two; select: Gather of a scalar index
   (the dimension goes) */
static int tokens_to_onnx(Ox *o, const Node *n, const char *out)
{
    const char *v;
    if (!ins(o, n, 1, &v)) return -1;
    if (n->op == OP_TRANSPOSE) {
        int64_t perm[IR_MAXDIM];
        for (int k = 0; k < n->shape.nd; k++) perm[k] = k;
        perm[n->attr.dim0] = n->attr.dim1;
        perm[n->attr.dim1] = n->attr.dim0;
        attr_int_list(o, node(o, "Transpose", out, 1, &v, n), "perm", n->shape.nd, perm);
        return 0;
    }
    int64_t *at = arena_alloc(&o->a, sizeof *at);
    *at = n->attr.index;
    const char *g[2] = { v, initializer(o, fresh(o, "select_index"), ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 0, NULL, at, sizeof *at) };
    attr_int(o, node(o, "Gather", out, 2, g, n), "axis", n->attr.axis);
    return 0;
}

/* matmul (an operand transposed, a gradient's form, by Transpose; numpy's broadcasting is
   PyTorch's), softmax, and the reductions along one dimension (opset 17: ReduceMean's axes an
   attribute, ReduceSum's an input) */
static int dims_to_onnx(Ox *o, const Node *n, const char *out)
{
    const char *v[2];
    if (!ins(o, n, n->nin, v)) return -1;
    if (n->op == OP_MATMUL) {
        int nd = n->shape.nd;
        int64_t perm[IR_MAXDIM];
        for (int k = 0; k < nd; k++) perm[k] = k;
        perm[nd - 2] = nd - 1, perm[nd - 1] = nd - 2;
        for (int k = 0; k < 2; k++)
            if (k ? n->attr.trans_b : n->attr.trans_a) {
                const char *t = step(o, out, k ? "b_t" : "a_t");
                attr_int_list(o, node(o, "Transpose", t, 1, &v[k], n), "perm", nd, perm);
                v[k] = t;
            }
        binary(o, "MatMul", out, v[0], v[1], n);
    } else if (n->op == OP_SOFTMAX) {
        attr_int(o, node(o, "Softmax", out, 1, v, n), "axis", n->attr.axis);
    } else if (n->op == OP_REDUCE_MEAN) {
        Onnx__NodeProto *r = node(o, "ReduceMean", out, 1, v, n);
        attr_int_list(o, r, "axes", 1, (int64_t[]){ n->attr.axis });
        attr_int(o, r, "keepdims", 0);
    } else {
        v[1] = const_i64(o, step(o, out, "axes"), 1, (int64_t[]){ n->attr.axis });
        attr_int(o, node(o, "ReduceSum", out, 2, v, n), "keepdims", 0);
    }
    return 0;
}

/* conv_transpose2d (conv2d_grad_x in an evaluation graph): ConvTranspose, weight [C, O/groups, K, K];
   its bias an Add after */
static int conv_transpose_to_onnx(Ox *o, const Node *n, const char *out)
{
    const char *v[2];
    if (!ins(o, n, 2, v)) return -1;
    Onnx__NodeProto *c = node(o, "ConvTranspose", out, 2, v, n);
    const Shape *xs = &o->g->nodes[n->in[0]].shape, *ws = &o->g->nodes[n->in[1]].shape;
    int K = ws->d[2], S = n->attr.stride, D = ir_dilation(&n->attr);
    attr_ints(o, c, "kernel_shape", 2, K);
    attr_ints(o, c, "strides", 2, S);
    attr_ints(o, c, "pads", 4, n->attr.padding);
    attr_ints(o, c, "dilations", 2, D);
    attr_int(o, c, "group", ir_groups(&n->attr));
    attr_ints(o, c, "output_padding", 2, n->shape.d[2] - ((xs->d[2] - 1) * S - 2 * n->attr.padding + D * (K - 1) + 1));
    return 0;
}

/* MaxPool (the padding never the max); AveragePool with the padding counted, as PyTorch. A ceil_mode
   average whose last window overhangs the padded input divides, in PyTorch, by the window's part within
   the padded input, which ONNX Runtime's count_include_pad does not: there the mean over the window's
   taps inside the input (count_include_pad=0, the same in both), times a constant [1, 1, OH, OW] of
   their count over PyTorch's divisor. */
static int pool_to_onnx(Ox *o, const Node *n, const char *out)
{
    const char *v[1];
    if (!ins(o, n, 1, v)) return -1;
    const Shape *xs = &o->g->nodes[n->in[0]].shape;
    int K = n->attr.kernel, S = n->attr.stride, P = n->attr.padding, H = xs->d[2], W = xs->d[3], OH = n->shape.d[2], OW = n->shape.d[3];
    bool avg = n->op == OP_AVGPOOL, rescale = avg && n->attr.ceil_mode && !n->attr.exclude_pad && P > 0;
    const char *pooled = rescale ? step(o, out, "mean_inside") : out;
    Onnx__NodeProto *p = node(o, avg ? "AveragePool" : "MaxPool", pooled, 1, v, n);
    attr_ints(o, p, "kernel_shape", 2, K);
    attr_ints(o, p, "strides", 2, S);
    attr_ints(o, p, "pads", 4, P);
    /* without padding, counting it or not is the same: the taps inside (ORT's ceil_mode windows agree then) */
    if (avg) attr_int(o, p, "count_include_pad", !n->attr.exclude_pad && P > 0 && !rescale);
    if (n->attr.ceil_mode) attr_int(o, p, "ceil_mode", 1);
    if (!rescale) return 0;
    float *f = arena_alloc(&o->a, sizeof(float) * (size_t)OH * OW);
    for (int y = 0; y < OH; y++)
        for (int x = 0; x < OW; x++) {
            int hs = y * S - P, ws = x * S - P, he = hs + K < H + P ? hs + K : H + P, we = ws + K < W + P ? ws + K : W + P;
            int ih = (he < H ? he : H) - (hs > 0 ? hs : 0), iw = (we < W ? we : W) - (ws > 0 ? ws : 0);
            f[y * OW + x] = (float)((double)ih * iw / ((double)(he - hs) * (we - ws)));
        }
    binary(o, "Mul", out, pooled, const_f32(o, step(o, out, "divisor_ratio"), 4, (int64_t[]){ 1, 1, OH, OW }, f), n);
    return 0;
}

/* concat's input k of batch 1 (a param), Expanded to the batch of input full: its new name */
static const char *expanded(Ox *o, const Node *n, int k, const char *v, const char *full, const char *out)
{
    const Shape *ks = &o->g->nodes[n->in[k]].shape;
    const char *batch = step(o, out, "batch"), *sh = unary(o, "Shape", step(o, out, "shape"), full, n);
    const char *sl[3] = { sh, const_i64(o, "zero", 1, (int64_t[]){ 0 }), const_i64(o, "one", 1, (int64_t[]){ 1 }) };
    node(o, "Slice", batch, 3, sl, n);
    int64_t rest[IR_MAXDIM];
    for (int d = 1; d < ks->nd; d++) rest[d - 1] = ks->d[d];
    const char *cat[2] = { batch, const_i64(o, "rest_shape", ks->nd - 1, rest) }, *target = step(o, out, "expanded_shape");
    attr_int(o, node(o, "Concat", target, 2, cat, n), "axis", 0);
    const char *ex[2] = { v, target }, *e = step(o, out, "expanded");
    node(o, "Expand", e, 2, ex, n);
    return e;
}

static int ir_to_onnx(Ox *o, const Node *n, const char *out)
{
    const Graph *g = o->g;
    const char *v[IR_MAXIN];
    const Shape *xs = n->nin ? &g->nodes[n->in[0]].shape : NULL;
    if (ir_activation_grad(n->op) != OP_COUNT) return activation_to_onnx(o, n, out);
    if (n->op == OP_ATTENTION) return attention_to_onnx(o, n, out);
    if (n->op == OP_TRANSPOSE || n->op == OP_SELECT) return tokens_to_onnx(o, n, out);
    if (n->op == OP_CONV2D_BWD_X) return conv_transpose_to_onnx(o, n, out);
    if (n->op == OP_MATMUL || n->op == OP_SOFTMAX || n->op == OP_REDUCE_MEAN || n->op == OP_REDUCE_SUM) return dims_to_onnx(o, n, out);
    switch (n->op) {
    case OP_CONV2D: {   /* Conv: weight [O, C/groups, K, K], bias optional */
        if (!ins(o, n, n->nin, v)) return -1;
        Onnx__NodeProto *c = node(o, "Conv", out, n->nin, v, n);
        attr_ints(o, c, "kernel_shape", 2, g->nodes[n->in[1]].shape.d[2]);
        attr_ints(o, c, "strides", 2, n->attr.stride);
        attr_ints(o, c, "pads", 4, n->attr.padding);
        attr_ints(o, c, "dilations", 2, ir_dilation(&n->attr));
        attr_int(o, c, "group", ir_groups(&n->attr));
        return 0;
    }
    case OP_LINEAR: {   /* Gemm: x [N, F] times weight [O, F] transposed, bias optional */
        if (!ins(o, n, n->nin, v)) return -1;
        if (xs->nd == 3) {   /* [N, T, F]: MatMul by the weight transposed, then Add the bias (Gemm is 2-D) */
            const char *wt = step(o, out, "weight_t"), *mm = n->nin == 3 ? step(o, out, "matmul") : out;
            attr_int_list(o, node(o, "Transpose", wt, 1, &v[1], n), "perm", 2, (int64_t[]){ 1, 0 });
            binary(o, "MatMul", mm, v[0], wt, n);
            if (n->nin == 3) binary(o, "Add", out, mm, v[2], n);
            return 0;
        }
        attr_int(o, node(o, "Gemm", out, n->nin, v, n), "transB", 1);
        return 0;
    }
    case OP_BN_APPLY: {   /* BatchNormalization (inference) on the running statistics bn_eval_stats reads */
        const Node *stats = &g->nodes[n->in[1]];
        if (stats->op != OP_BN_EVAL_STATS)
            return fail(o, "the batchnorm at %s normalises with %s, not the running statistics: ONNX's BatchNormalization "
                        "(inference) takes those", where(o, n), ir_op_name(stats->op));
        const char *x = in(o, n, 0), *gamma = x ? in(o, n, 2) : NULL, *beta = gamma ? in(o, n, 3) : NULL;
        const char *mean = beta ? in(o, stats, 0) : NULL, *var = mean ? in(o, stats, 1) : NULL;
        if (!var) return -1;
        const char *bn[5] = { x, gamma, beta, mean, var };
        attr_float(o, node(o, "BatchNormalization", out, 5, bn, n), "epsilon", stats->attr.eps);
        return 0;
    }
    case OP_LN_APPLY: {   /* LayerNormalization over dimension 1 (the last of [N, F]; [N, C, H, W] moved to channels-last
                             and back), or over the last of [N, T, D] */
        const Node *stats = &g->nodes[n->in[1]];
        if (stats->op != OP_LN_STATS || stats->in[0] != n->in[0])
            return fail(o, "internal: the layernorm at %s takes its statistics from %s", where(o, n), ir_op_name(stats->op));
        const char *x = in(o, n, 0), *gamma = x ? in(o, n, 2) : NULL, *beta = gamma ? in(o, n, 3) : NULL;
        if (!beta) return -1;
        int nd = xs->nd == 4 ? 4 : 2;   /* (nd > 2: moved) */
        int64_t last[IR_MAXDIM], back[IR_MAXDIM];   /* dimension 1 to the end, and back */
        for (int k = 0, j = 0; k < nd; k++) if (k != 1) last[j++] = k;
        last[nd - 1] = 1;
        for (int k = 0; k < nd; k++) back[last[k]] = k;
        const char *y = nd > 2 ? step(o, out, "channels_last") : x;
        if (nd > 2) attr_int_list(o, node(o, "Transpose", y, 1, &x, n), "perm", nd, last);
        const char *ln[3] = { y, gamma, beta }, *normed = nd > 2 ? step(o, out, "normalized") : out;
        Onnx__NodeProto *l = node(o, "LayerNormalization", normed, 3, ln, n);
        attr_int(o, l, "axis", -1);
        attr_float(o, l, "epsilon", stats->attr.eps);
        if (nd > 2) attr_int_list(o, node(o, "Transpose", out, 1, &normed, n), "perm", nd, back);
        return 0;
    }
    case OP_MAXPOOL: case OP_AVGPOOL:
        return pool_to_onnx(o, n, out);
    case OP_GAP: case OP_GLOBAL_MAXPOOL: {
        if (!ins(o, n, 1, v)) return -1;
        unary(o, n->op == OP_GAP ? "GlobalAveragePool" : "GlobalMaxPool", out, v[0], n);
        return 0;
    }
    case OP_UPSAMPLE: {   /* Resize, nearest: output pixel i from input floor(i / scale) */
        if (!ins(o, n, 1, v)) return -1;
        float s = (float)n->attr.scale, scales[4] = { 1, 1, s, s };
        int64_t four = 4;
        const char *r[3] = { v[0], "", const_f32(o, step(o, out, "scales"), 1, &four, scales) };
        Onnx__NodeProto *z = node(o, "Resize", out, 3, r, n);
        if (n->attr.bilinear) {   /* PyTorch's align_corners=False */
            attr_string(o, z, "mode", "linear");
            attr_string(o, z, "coordinate_transformation_mode", "pytorch_half_pixel");
            return 0;
        }
        attr_string(o, z, "mode", "nearest");
        attr_string(o, z, "coordinate_transformation_mode", "asymmetric");
        attr_string(o, z, "nearest_mode", "floor");
        return 0;
    }
    case OP_ADAPTIVE_AVGPOOL: {
        if (!ins(o, n, 1, v)) return -1;
        int H = xs->d[2], W = xs->d[3], OH = n->attr.height, OW = n->attr.width;
        if (H % OH == 0 && W % OW == 0) {   /* equal windows side by side: an AveragePool */
            Onnx__NodeProto *p = node(o, "AveragePool", out, 1, v, n);
            int64_t k[2] = { H / OH, W / OW };
            attr_int_list(o, p, "kernel_shape", 2, k);
            attr_int_list(o, p, "strides", 2, k);
            return 0;
        }
        /* windows of two sizes, or overlapping: rows [OH, H] times x [N, C, H, W] times columns [W, OW] */
        const char *cols = adaptive_matrix(o, out, W, OW, false), *rows = adaptive_matrix(o, out, H, OH, true);
        binary(o, "MatMul", out, rows, binary(o, "MatMul", step(o, out, "columns_pooled"), v[0], cols, n), n);
        return 0;
    }
    case OP_RESHAPE: {   /* Flatten to [N, F]; else Reshape, the batch dimension copied (0) */
        if (!ins(o, n, 1, v)) return -1;
        if (n->shape.nd == 2 && n->shape.d[0] == IR_BATCH && xs->d[0] == IR_BATCH) {
            attr_int(o, node(o, "Flatten", out, 1, v, n), "axis", 1);
            return 0;
        }
        int64_t d[IR_MAXDIM];
        for (int k = 0; k < n->shape.nd; k++) d[k] = n->shape.d[k] == IR_BATCH ? 0 : n->shape.d[k];
        binary(o, "Reshape", out, v[0], const_i64(o, step(o, out, "shape"), n->shape.nd, d), n);
        return 0;
    }
    case OP_CONCAT: {   /* along its axis; an input of batch 1 (a param) Expanded to the batch of one that has it */
        if (!ins(o, n, n->nin, v)) return -1;
        int full = 0;
        while (full < n->nin - 1 && g->nodes[n->in[full]].shape.d[0] == 1) full++;
        for (int k = 0; k < n->nin && n->shape.d[0] != 1; k++)
            if (g->nodes[n->in[k]].shape.d[0] == 1) v[k] = expanded(o, n, k, v[k], v[full], out);
        attr_int(o, node(o, "Concat", out, n->nin, v, n), "axis", n->attr.axis);
        return 0;
    }
    case OP_ADD: case OP_MUL: case OP_SUB: {   /* both of one rank: ONNX's broadcasting is PyTorch's */
        if (!ins(o, n, 2, v)) return -1;
        binary(o, n->op == OP_ADD ? "Add" : n->op == OP_MUL ? "Mul" : "Sub", out, v[0], v[1], n);
        return 0;
    }
    default:
        return fail(o, "internal: no ONNX form for %s at %s", ir_op_name(n->op), where(o, n));
    }
}

/* ---- the model ---- */

static Onnx__ValueInfoProto *tensor_info(Ox *o, const char *name, const Shape *s, const char *doc)
{
    Onnx__TensorShapeProto *shape = arena_alloc(&o->a, sizeof *shape);
    onnx__tensor_shape_proto__init(shape);
    shape->n_dim = (size_t)s->nd;
    shape->dim = arena_alloc(&o->a, sizeof *shape->dim * (size_t)(s->nd ? s->nd : 1));
    for (int k = 0; k < s->nd; k++) {
        Onnx__TensorShapeProto__Dimension *d = arena_alloc(&o->a, sizeof *d);
        onnx__tensor_shape_proto__dimension__init(d);
        if (s->d[k] == IR_BATCH) d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM, d->dim_param = "N";
        else d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE, d->dim_value = s->d[k];
        shape->dim[k] = d;
    }
    Onnx__TypeProto__Tensor *tt = arena_alloc(&o->a, sizeof *tt);
    onnx__type_proto__tensor__init(tt);
    tt->has_elem_type = 1;
    tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    tt->shape = shape;
    Onnx__TypeProto *type = arena_alloc(&o->a, sizeof *type);
    onnx__type_proto__init(type);
    type->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    type->tensor_type = tt;
    Onnx__ValueInfoProto *vi = arena_alloc(&o->a, sizeof *vi);
    onnx__value_info_proto__init(vi);
    vi->name = (char *)name;
    vi->type = type;
    vi->doc_string = (char *)doc;
    return vi;
}

/* "0.286,0.353" */
static const char *float_list(Ox *o, const float *v, int n)
{
    char *s = "";
    for (int k = 0; k < n; k++) s = arena_printf(&o->a, "%s%s%.9g", s, k ? "," : "", (double)v[k]);
    return s;
}

/* The value the net's input is: images, or images normalised per channel
   (Sub the mean, Div by the deviation, as data/transform.c). NULL, said,
   where the checkpoint's statistics do not fit the input. */
static const char *net_input(Ox *o, const Node *input, const char *images)
{
    const CkModel *info = o->m->info;
    if (!info->has_transform || !info->normalize) return images;
    int c = input->shape.nd >= 2 ? input->shape.d[1] : 0;
    if (info->nchannels != c) {
        fail(o, "the checkpoint normalises %d channels, the net's input %s has %d", info->nchannels,
             ir_shape_str(&o->a, &input->shape), c);
        return NULL;
    }
    int64_t dims[IR_MAXDIM] = { 1, c, 1, 1 };   /* [1, C, 1, 1]: broadcast over N, H and W */
    for (int k = 2; k < input->shape.nd; k++) dims[k] = 1;
    const char *mean = const_f32(o, "images/mean", input->shape.nd, dims, info->mean);
    const char *std = const_f32(o, "images/std", input->shape.nd, dims, info->std);
    return binary(o, "Div", fresh(o, "images/normalized"), binary(o, "Sub", fresh(o, "images/centered"), images, mean, input), std,
                  input);
}

/* What the model's doc_string says of its use. */
static const char *model_doc(Ox *o, const Shape *in, int classes)
{
    const CkModel *info = o->m->info;
    const char *input = ir_shape_str(&o->a, in) + 1;   /* "N,1,28,28]" */
    char *s = arena_printf(&o->a, "%s (%s), exported by mgc %s from %s.\n"
                           "Input 'images': float32 [%s, N any: ", o->m->net_name,
                           info->net_file ? info->net_file : "its net", MGC_VERSION, o->m->checkpoint, input);
    s = arena_printf(&o->a, "%s%s", s, info->pixels == CK_PIXELS_FLOATS ? "the values as the training data stored them (float32)"
                                       : "pixels as ToTensor gives them (byte / 255, 0 to 1)");
    if (info->has_transform && info->resize_h > 0)
        s = arena_printf(&o->a, "%s, resized to %dx%d beforehand (bilinear, half-pixel centres: torchvision's "
                         "Resize((%d, %d), antialias=False))", s, info->resize_h, info->resize_w, info->resize_h, info->resize_w);
    if (info->has_transform && info->normalize)
        s = arena_printf(&o->a, "%s; normalised inside the model ((x - mean) / std per channel, mean %s, std %s)", s,
                         float_list(o, info->mean, info->nchannels), float_list(o, info->std, info->nchannels));
    else if (!info->has_transform)
        s = arena_printf(&o->a, "%s (the checkpoint does not say how its images were transformed)", s);
    s = arena_printf(&o->a, "%s.\nOutput 'logits': float32 [N, %d], a row per image: its argmax is the class, its softmax "
                     "the probabilities.", s, classes);
    if (o->g->precision == DT_BF16)
        s = arena_printf(&o->a, "%s\nThe net was run in bf16 (--precision bf16); this model computes in float32.", s);
    return s;
}

static void meta(Ox *o, Onnx__ModelProto *model, const char *key, const char *value)
{
    Onnx__StringStringEntryProto *e = arena_alloc(&o->a, sizeof *e);
    onnx__string_string_entry_proto__init(e);
    e->key = (char *)key;
    e->value = (char *)value;
    model->metadata_props = arena_grow(&o->a, model->metadata_props, model->n_metadata_props * sizeof *model->metadata_props,
                                       (model->n_metadata_props + 1) * sizeof *model->metadata_props);
    model->metadata_props[model->n_metadata_props++] = e;
}

static void model_meta(Ox *o, Onnx__ModelProto *model, const Shape *in, int classes)
{
    const CkModel *info = o->m->info;
    meta(o, model, "mgc_version", MGC_VERSION);
    if (info->version[0]) meta(o, model, "trained_by", arena_printf(&o->a, "mgc %s", info->version));
    meta(o, model, "net", o->m->net_name);
    if (info->net_file) meta(o, model, "net_file", info->net_file);
    meta(o, model, "classes", arena_printf(&o->a, "%d", classes));
    meta(o, model, "input", arena_printf(&o->a, "images: float32 [%s", ir_shape_str(&o->a, in) + 1));
    meta(o, model, "output", arena_printf(&o->a, "logits: float32 [N,%d]", classes));
    meta(o, model, "pixels", info->pixels == CK_PIXELS_FLOATS ? "float32" : info->pixels == CK_PIXELS_BYTES ? "byte/255" : "unknown");
    meta(o, model, "resize", !info->has_transform ? "unknown" : info->resize_h > 0 ? arena_printf(&o->a, "%dx%d", info->resize_h,
                                                                                                  info->resize_w) : "none");
    meta(o, model, "normalize", !info->has_transform ? "unknown" : info->normalize ? "in the model" : "none");
    if (info->has_transform && info->normalize) {
        meta(o, model, "normalize_mean", float_list(o, info->mean, info->nchannels));
        meta(o, model, "normalize_std", float_list(o, info->std, info->nchannels));
    }
    meta(o, model, "precision", o->g->precision == DT_BF16 ? "trained in bf16, computed here in float32" : "float32");
    if (info->data[0]) meta(o, model, "data", info->data);
}

typedef struct FileSink {
    ProtobufCBuffer base;     /* first: protobuf-c calls append with it */
    FILE *f;
    bool failed;
} FileSink;

static void sink_append(ProtobufCBuffer *b, size_t len, const uint8_t *data)
{
    FileSink *s = (FileSink *)b;
    if (!s->failed && fwrite(data, 1, len, s->f) != len) s->failed = true;
}

/* model into path, whole or not at all (PATH.tmp, fsync, rename). 0, or -1 said. */
static int write_model(Ox *o, const Onnx__ModelProto *model, const char *path)
{
    size_t size = onnx__model_proto__get_packed_size(model);
    if (size > INT32_MAX)
        return fail(o, "the model would take %zu bytes: ONNX's protobuf holds at most 2 GiB in one file, and this export does "
                    "not write weights as external data", size);
    char *tmp = arena_printf(&o->a, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return fail(o, "cannot write %s (its temporary file %s): %s", path, tmp, strerror(errno));
    FileSink sink = { .base = { sink_append }, .f = f };
    onnx__model_proto__pack_to_buffer(model, &sink.base);
    int e = sink.failed || fflush(f) || fsync(fileno(f)) ? (errno ? errno : EIO) : 0;
    if (fclose(f) && !e) e = errno ? errno : EIO;
    if (!e && rename(tmp, path)) e = errno;
    if (e) {
        unlink(tmp);
        return fail(o, "cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

static int export_graph(Ox *o, const char *path)
{
    const Graph *g = o->g;
    if (g->logits < 0 || g->input < 0) return fail(o, "the net has no %s to export", g->input < 0 ? "input" : "logits");
    /* the nodes on the way to the logits; every one must have an ONNX form */
    o->needed[g->logits] = true;
    for (int id = g->logits; id >= 0; id--)
        for (int k = 0; o->needed[id] && k < g->nodes[id].nin; k++) o->needed[g->nodes[id].in[k]] = true;
    for (int id = 0; id <= g->logits; id++) {
        const char *why = o->needed[id] ? no_onnx_form(g->nodes[id].op) : NULL;
        if (why) return fail(o, "ONNX cannot express the net's %s at %s: %s", ir_op_name(g->nodes[id].op),
                             where(o, &g->nodes[id]), why);
    }
    const Node *input = &g->nodes[g->input];
    const Node *logits = &g->nodes[g->logits];
    const char *images = claim(o, "images");
    claim(o, "logits");
    for (int id = 0; id <= g->logits; id++) {   /* the checkpoint's names first: the values' names keep out of their way */
        const Node *n = &g->nodes[id];
        if (!o->needed[id] || (n->op != OP_PARAM && n->op != OP_STATE)) continue;
        if (taken(o, n->name)) return fail(o, "internal: the tensor name '%s' is given twice", n->name);
        claim(o, n->name);
    }
    if (!(o->value[g->input] = net_input(o, input, images))) return -1;
    for (int id = 0; id <= g->logits; id++) {
        const Node *n = &g->nodes[id];
        if (!o->needed[id] || n->op == OP_INPUT || n->op == OP_PARAM || n->op == OP_STATE || n->op == OP_BN_EVAL_STATS ||
            n->op == OP_LN_STATS || n->op == OP_ATTN_STATS)
            continue;   /* made already, made as an initializer when read, or read by the op they feed */
        const char *out = id == g->logits ? "logits" : NULL;
        if (!out) {   /* a layer's output by its name ("conv1", from conv1.weight), else the op's and its id ("relu_4") */
            const char *w = n->nin > 1 && g->nodes[n->in[1]].op == OP_PARAM ? g->nodes[n->in[1]].name : NULL;
            const char *dot = w ? strrchr(w, '.') : NULL;
            out = fresh(o, dot ? arena_strndup(&o->a, w, (size_t)(dot - w)) : arena_printf(&o->a, "%s_%d", ir_op_name(n->op), id));
        }
        if (ir_to_onnx(o, n, out)) return -1;
        o->value[id] = out;
    }
    if (strcmp(o->value[g->logits], "logits")) unary(o, "Identity", "logits", o->value[g->logits], logits);   /* logits = input */

    Onnx__GraphProto *graph = arena_alloc(&o->a, sizeof *graph);
    onnx__graph_proto__init(graph);
    graph->name = (char *)o->m->net_name;
    graph->n_node = o->nnodes, graph->node = o->nodes;
    graph->n_initializer = o->ninits, graph->initializer = o->inits;
    const Shape *in = &input->shape;
    int classes = logits->shape.nd == 2 ? logits->shape.d[1] : 0;
    graph->n_input = graph->n_output = 1;
    graph->input = arena_alloc(&o->a, sizeof *graph->input);
    graph->input[0] = tensor_info(o, "images", in, "float32 images [N, C, H, W], N any");
    graph->output = arena_alloc(&o->a, sizeof *graph->output);
    graph->output[0] = tensor_info(o, "logits", &logits->shape, "float32 logits [N, classes]");
    graph->doc_string = (char *)model_doc(o, in, classes);

    Onnx__OperatorSetIdProto *opset = arena_alloc(&o->a, sizeof *opset);
    onnx__operator_set_id_proto__init(opset);
    opset->domain = "";
    opset->has_version = 1, opset->version = ONNX_OPSET;
    Onnx__ModelProto *model = arena_alloc(&o->a, sizeof *model);
    onnx__model_proto__init(model);
    model->has_ir_version = 1, model->ir_version = ONNX_IR_VERSION;
    model->n_opset_import = 1, model->opset_import = arena_alloc(&o->a, sizeof *model->opset_import);
    model->opset_import[0] = opset;
    model->producer_name = "mgc";
    model->producer_version = MGC_VERSION;
    model->doc_string = graph->doc_string;
    model->graph = graph;
    model_meta(o, model, in, classes);
    return write_model(o, model, path);
}

int ex_onnx(const ExModel *m, const char *path, char *err, size_t err_size)
{
    Ox o = { .m = m, .g = m->graph, .err = err, .err_size = err_size };
    arena_init(&o.a);
    o.value = arena_alloc(&o.a, sizeof *o.value * (size_t)(m->graph->n ? m->graph->n : 1));
    o.needed = arena_alloc(&o.a, sizeof *o.needed * (size_t)(m->graph->n ? m->graph->n : 1));
    int rc = export_graph(&o, path);
    if (rc) {   /* "cannot write m.onnx: ...", unless the message says so already */
        char why[2048];
        snprintf(why, sizeof why, "%s", err);
        if (strncmp(why, "cannot ", 7)) snprintf(err, err_size, "cannot export %s to %s: %s", m->checkpoint, path, why);
    }
    arena_free(&o.a);
    return rc;
}

const char *ex_onnx_about(char *buf, size_t size)
{
    snprintf(buf, size, "export to ONNX IR version %d, opset %d (protobuf-c %s)", ONNX_IR_VERSION,
             ONNX_OPSET, protobuf_c_version());
    return buf;
}

#endif
