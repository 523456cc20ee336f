/*
** The IR: a typed tensor graph. Every tensor is float32 (DType); under
** --precision bf16 (ir_autocast) a GEMM-class node multiplies its operands
** as bfloat16, summing the products in float32 (Node.mm). Nodes are kept in topological
** order in one array (an input always has a smaller id than its user); a
** node's id is its index. Every node carries its output shape, checked when
** the node is made, and the .net location it came from.
**
** The batch dimension is symbolic: a shape whose dim 0 is IR_BATCH holds N
** examples, N known only at run time. Kernels take N as an argument.
**
** Layer builders (ir_conv2d, ir_linear_in, ...) are what the front end calls:
** they create the parameters (named "<prefix>.weight", "<prefix>.bias",
** initialised as PyTorch does), check shapes and report mismatches through
** diag_at() at the layer's location. They return the new node's id, or -1
** after an error.
*/
#ifndef MGC_IR_H
#define MGC_IR_H
#include <stdbool.h>
#include <stdio.h>
#include "arena.h"
#include "diag.h"

#define IR_MAXDIM 6
#define IR_MAXIN  8           /* a node's inputs at most (concat's)*/
#define IR_BATCH  (-1)        /* the symbolic batch size N, only ever as dim 0 */

typedef enum Op {
#define X(e, name, kind, mn, mx, attrs, shape, grad, lower, print) OP_##e,
#include "ops.def"
#undef X
    OP_COUNT
} Op;

/* The attributes (ir/attrs.def), by name: n->attr.stride. An op carries
   those its row lists; the others are 0. */
typedef struct IrAttrs {
#define ATTR(name, type, label, shown) type name;
#include "attrs.def"
#undef ATTR
} IrAttrs;

enum {
#define ATTR(name, type, label, shown) IR_ATTR_BIT_##name,
#include "attrs.def"
#undef ATTR
    IR_ATTR_COUNT
};
#define IR_ATTR(name) (1ull << IR_ATTR_BIT_##name)   /* an attribute's bit in an op's row */
/* A convolution's groups and dilation, 1 where the attribute is 0 (not set). */
static inline int ir_groups(const IrAttrs *a) { return a->groups > 1 ? a->groups : 1; }
static inline int ir_dilation(const IrAttrs *a) { return a->dilation > 1 ? a->dilation : 1; }

typedef enum OpKind { KIND_SRC, KIND_EW, KIND_GEMM, KIND_KERN, KIND_VIEW, KIND_EFFECT, KIND_COMM } OpKind;

typedef struct Shape {
    int nd;                   /* number of dims, 0 for a scalar */
    int d[IR_MAXDIM];         /* d[0] may be IR_BATCH */
} Shape;

typedef enum InitKind {
    INIT_NONE,                /* filled from outside (input, labels) or computed */
    INIT_UNIFORM_FAN_IN,      /* U(-1/sqrt(fan_in), +1/sqrt(fan_in)): PyTorch's Conv/Linear default */
    INIT_ZEROS,
    INIT_ONES,
    INIT_CONSTANT,            /* every element init_arg (a 'param' declared = constant(v)) */
    INIT_NORMAL,              /* N(0, init_arg^2): PyTorch's torch.randn(...) * std ('param' = normal(std)) */
} InitKind;

/* A tensor's element type, or the type a GEMM-class node multiplies its operands in. */
typedef enum DType { DT_F32, DT_BF16 } DType;
const char *ir_dtype_name(DType t);              /* "f32", "bf16" */

typedef struct Node {
    Op op;
    int nin;
    int in[IR_MAXIN];         /* input node ids, all < this node's id */
    Shape shape;              /* output shape (EFFECT nodes: the updated tensor's) */
    IrAttrs attr;             /* the attributes of its op (ops.def, attrs.def) */
    const char *name;         /* PARAM/STATE: full parameter name ("stage2.0.conv1.weight") */
    InitKind init;            /* PARAM/STATE */
    int fan_in;               /* PARAM with INIT_UNIFORM_FAN_IN */
    float init_arg;           /* PARAM with INIT_CONSTANT (the value) or INIT_NORMAL (the standard deviation) */
    Loc loc;                  /* where in the .net file it came from */
    int grad_of;              /* backward nodes: id of the forward node whose gradient (part) this is, else -1 */
    DType dtype;              /* its output's element type (DT_F32: every tensor is stored as float32) */
    DType mm;                 /* GEMM-class ops (conv2d, linear and their gradients): the type their two operands
                                 are rounded to as they are multiplied (DT_BF16: round to nearest even, products
                                 summed in float32; set by ir_autocast); DT_F32 otherwise */
} Node;

/* A bucket of the data-parallel pass: parameter gradients laid out side by
   side in one buffer and summed across replicas by one collective. */
typedef struct IrBucket {
    int first, count;         /* its allreduce nodes: g->bucket_nodes[first .. first+count) */
    long floats;              /* total size */
} IrBucket;

typedef struct Graph {
    Arena *arena;             /* owns nodes and names */
    Diag *diag;
    const char *net_name;
    bool training;            /* BatchNorm uses batch stats and dropout is active only when set */
    Node *nodes;
    int n, cap;
    int input, labels;        /* ids, -1 until made */
    int logits, loss, correct;/* set by ir_softmax_xent */
    int n_forward;            /* nodes [0, n_forward) are the forward graph (set by autodiff) */
    bool sync_bn;             /* training BatchNorm normalises over the global batch (set before the front end) */
    int accumulate;           /* --accumulate K: the gradients of K micro-batches summed before one update (1: none) */
    int shard_update;         /* --shard-update: the replicas each updating its slice of every bucket (codegen/dp.c); 0: none */
    DType precision;          /* DT_BF16: ir_autocast has run (--precision bf16) */
    /* set by ir_gradients: */
    int *grad;                /* grad[id] = node holding d loss / d node id, or -1 */
    /* set by ir_buckets (data-parallel runs only): */
    IrBucket *buckets;
    int nbuckets;
    int *bucket_nodes;        /* the allreduce nodes of every bucket, bucket by bucket */
    int *update_order;        /* parameters in the order their updates run (NULL: forward order) */
    int nupdate;
    /* set by ir_infer (the inference rewrite) when it folds BatchNorm into layers: */
    struct IrFold *folds;
    int nfolds;
    /* ir_find_param's index: named PARAM and STATE nodes by name (open addressing),
       brought up to date with nodes [0, pindexed) on each lookup */
    int *pslots;
    int pcap, pcount, pindexed;
} Graph;

/* ---- the table ---- */
const char *ir_op_name(Op op);
OpKind      ir_op_kind(Op op);
const char *ir_op_kind_name(OpKind kind);       /* "EW", "GEMM", ... */
unsigned long long ir_op_attrs(Op op);                 /* the IR_ATTR bits of its attributes */
const char *ir_op_lowering(Op op);               /* its lower column: "activation", "conv", ... */
int         ir_op_min_inputs(Op op), ir_op_max_inputs(Op op);
bool        ir_op_has_gradient(Op op);           /* its row names a gradient rule */
/* The op called name ("conv2d"), or -1. */
int         ir_op_find(const char *name);
/* The op's shape rule (ops.def's shape column) applied to n: its output
   shape from its inputs and attributes into *out; false with why (a phrase:
   "weight [6,2,5,5] has 2 input channels, the input [N,1,28,28] has 1")
   when they do not fit together. */
bool        ir_op_shape(const Graph *g, const Node *n, Shape *out, char *why, size_t size);
/* The same for a node not made yet: op over inputs in[0..nin) with attr (NULL: none).
   *blame: the input why is about, or -1. The builders (ir/build.c) check their
   layers' inputs with it, so a rule's message is the user's. */
bool        ir_rule_shape(const Graph *g, Op op, int nin, const int *in, const IrAttrs *attr, Shape *out,
                          char *why, size_t size, int *blame);
/* A node of op with its inputs and attributes (NULL: none), its shape set by
   the op's rule: its id, or -1 after an internal error (the rule refused).
   given: the shape it must have (the rules of input gradients take it), or NULL. */
int         ir_op(Graph *g, Op op, Loc loc, int nin, const int *in, const IrAttrs *attr, const Shape *given);

/* ---- graphs ---- */
void  ir_graph_init(Graph *g, Arena *a, Diag *d, const char *net_name, bool training);
int   ir_node(Graph *g, Op op, Loc loc, int nin, const int *in);  /* raw; shape not set */
const Shape *ir_shape(const Graph *g, int id);
long  ir_numel(const Shape *s, long batch);      /* elements, with N = batch */
bool  ir_shape_eq(const Shape *a, const Shape *b);
char *ir_shape_str(Arena *a, const Shape *s);     /* "[N,6,24,24]" */
Shape ir_shape_make(int nd, const int *d);
/* Find a parameter or state tensor by name, or -1. */
int   ir_find_param(Graph *g, const char *name);   /* a PARAM or STATE node by name, or -1 (hashed) */
unsigned long ir_hash_name(const char *s);         /* FNV-1a of a name, for the hashed tables of names */
long  ir_param_count(const Graph *g, int *tensors); /* trainable scalars; *tensors = PARAM nodes */

/* ---- layer builders (front end API) ---- */
int ir_input(Graph *g, Loc loc, Shape s);
/* groups: the channels in that many groups, each output's taps over its group's
   inputs (weight [O, C/groups, K, K]); dilation: taps that far apart. */
int ir_conv2d(Graph *g, Loc loc, const char *prefix, int x, int out_channels,
              int kernel, int stride, int padding, int groups, int dilation, bool bias);
/* in_features: -1 inferred from the input, else checked against it. */
/* PyTorch's ConvTranspose2d (weight [C, out_channels / groups, K, K], bias [out_channels]): conv2d's
   input gradient as a layer, the output (H - 1) * stride - 2 * padding + dilation * (K - 1) +
   output_padding + 1 high (and wide), the bias added by broadcasting. */
int ir_conv_transpose2d(Graph *g, Loc loc, const char *prefix, int x, int out_channels, int kernel, int stride, int padding,
                        int output_padding, int groups, int dilation, bool bias);
int ir_linear_in(Graph *g, Loc loc, const char *prefix, int x, int in_features, int out_features, bool bias);
int ir_batchnorm2d(Graph *g, Loc loc, const char *prefix, int x, float eps, float momentum);
/* LayerNorm over dimension 1: the features of [N, F], or the channels of [N, C, H, W] at each position
   (PyTorch's LayerNorm(F), and LayerNorm(C) over channels-last); weight and bias [C]. */
int ir_layernorm(Graph *g, Loc loc, const char *prefix, int x, float eps);
/* nn.LayerNorm(shape): over x's last nd dimensions, which must be shape[0..nd); weight and bias of that shape */
int ir_layernorm_over(Graph *g, Loc loc, const char *prefix, int x, float eps, int nd, const int *shape);
/* What a LayerNorm of x normalises: the features of [N, F], the channels of [N, C, H, W]
   at each position, or the last dimension of [N, T, D] (each token: PyTorch's LayerNorm(D)).
   Its elements (row, c, p) lie at (row * C + c) * P + p, row over N * R. */
static inline int ir_ln_channels(const Shape *x) { return x->nd == 3 ? x->d[2] : x->d[1]; }
static inline int ir_ln_rows(const Shape *x) { return x->nd == 3 ? x->d[1] : 1; }   /* R: rows an example */
static inline int ir_ln_positions(const Shape *x)   /* P */
{
    int p = 1;
    for (int d = 2; x->nd != 3 && d < x->nd; d++) p *= x->d[d];
    return p;
}
/* An element-wise activation of ir/activations.def (relu, silu, ...), with its attributes (NULL: none). */
int ir_activation(Graph *g, Loc loc, Op op, int x, const IrAttrs *attr);
/* An activation's gradient op (relu -> relu_grad), or OP_COUNT when op is no activation;
   whether that gradient reads the forward's output y (else its input x). */
Op ir_activation_grad(Op op);
bool ir_activation_reads_y(Op op);
int ir_maxpool2d(Graph *g, Loc loc, int x, int kernel, int stride, int padding, bool ceil_mode);
/* count_include_pad: PyTorch's (the padding's zeros in each window's mean); false: the mean of the
   window's taps inside the input. ceil_mode: PyTorch's (the output rounded up, its last window partial). */
int ir_avgpool2d(Graph *g, Loc loc, int x, int kernel, int stride, int padding, bool ceil_mode, bool count_include_pad);
int ir_global_avgpool(Graph *g, Loc loc, int x);
int ir_flatten(Graph *g, Loc loc, int x);
/* Dimensions start.. as one: [N, C, H, W] from 2 is [N, C, H * W] (PyTorch's x.flatten(start)). */
int ir_flatten_from(Graph *g, Loc loc, int x, int start);
/* Nearest upsampling: each pixel scale x scale times (PyTorch's Upsample(scale_factor, "nearest")). */
int ir_upsample(Graph *g, Loc loc, int x, int scale, bool bilinear);
/* PyTorch's AdaptiveAvgPool2d((height, width)); AdaptiveMaxPool2d(1). */
int ir_adaptive_avgpool(Graph *g, Loc loc, int x, int height, int width);
int ir_global_maxpool(Graph *g, Loc loc, int x);
int ir_dropout(Graph *g, Loc loc, int x, float p);
/* x with the same elements in shape s (a view; x itself when s is its shape). */
int ir_reshape(Graph *g, Loc loc, int x, Shape s);
/* BatchNorm over the batch of [N, F] (after a linear layer): PyTorch's BatchNorm1d. */
int ir_batchnorm1d(Graph *g, Loc loc, const char *prefix, int x, float eps, float momentum);
int ir_add(Graph *g, Loc loc, int a, int b);
/* Scaled dot-product attention, PyTorch's: q [N, Tq, D], k and v [N, Tk, D], D split into heads
   of D / heads; each head's softmax(q k^T / sqrt(D / heads)) v ([N, Tq, D], heads side by side),
   query i seeing keys 0..i only where causal. No [N, H, Tq, Tk] tensor is stored: each query's
   log-sum-exp (attention_stats), then its output in one pass over the keys. */
int ir_attention(Graph *g, Loc loc, int q, int k, int v, int heads, bool causal, float dropout);
/* x with dimensions dim0 and dim1 (1 or more) swapped, PyTorch's x.transpose(dim0, dim1) (a copy). */
int ir_transpose(Graph *g, Loc loc, int x, int dim0, int dim1);
/* x[:, index] along dimension axis (1 or more), that dimension gone: PyTorch's x.select(axis, index). */
int ir_select(Graph *g, Loc loc, int x, int axis, int index);
/* op OP_REDUCE_SUM or OP_REDUCE_MEAN of x along dimension axis (1 or more), that dimension gone:
   PyTorch's x.sum(axis), x.mean(axis). */
int ir_reduce(Graph *g, Loc loc, Op op, int x, int axis);
/* a times b as matrices by their last two dimensions, the dimensions before broadcast: PyTorch's
   torch.matmul(a, b) on tensors of one rank, 3 or 4. */
int ir_matmul(Graph *g, Loc loc, int a, int b);
/* softmax of x along dimension axis (1 or more): PyTorch's x.softmax(axis). */
int ir_softmax(Graph *g, Loc loc, int x, int axis);
/* A learned tensor of its own (a 'param' statement: a class token, a position embedding,
   a layer scale), named name, of shape s (no batch dimension), started as init says
   (INIT_ZEROS, INIT_ONES, INIT_CONSTANT or INIT_NORMAL with arg). */
int ir_param(Graph *g, Loc loc, const char *name, Shape s, InitKind init, float arg);
/* The n tensors in[] side by side along dimension axis (1: channels or features; 1 or more), n from 2
   to IR_MAXIN - 1. */
int ir_concat(Graph *g, Loc loc, int n, const int *in, int axis);
/* a op b (mul, sub) with PyTorch's broadcasting: each dimension equal, or 1 in one of them. */
int ir_broadcast(Graph *g, Loc loc, Op op, int a, int b);
/* The loss; labels are implicit. label_smoothing: PyTorch's (the target (1 - s) one-hot + s / K). */
int ir_softmax_xent(Graph *g, Loc loc, int logits, float label_smoothing);

/* ---- passes ---- */
/* Checks every node (ir/verify.c): input count within the op table's bounds,
   inputs earlier, dimensions positive, and its op's shape rule against its
   inputs and attributes. Returns the number of problems (printed to d, "internal:"). */
int  ir_verify(const Graph *g, Diag *d);
/* The optimizer and its hyper-parameters, with PyTorch's semantics: SGD
   (dampening 0; momentum, Nesterov's or not; weight decay added to the
   gradient), or AdamW (decoupled weight decay; bias-corrected moments). */
typedef enum IrOptKind { IR_SGD, IR_ADAMW } IrOptKind;
typedef struct IrOptimizer {
    IrOptKind kind;
    float lr, weight_decay;
    float momentum;           /* SGD */
    bool nesterov;            /* SGD */
    float beta1, beta2, eps;  /* AdamW */
} IrOptimizer;
/* The gradient pass: appends the backward graph as ordinary nodes.
   Requires: a loss. Produces: g->grad[], g->n_forward. With
   input_grad the gradient of the input is computed too (for checks).
   Returns 0 or -1. */
int  ir_gradients(Graph *g, bool input_grad);
/* The data-parallel pass (ir/dp.c), between the gradient and update passes:
   groups the parameter gradients into buckets of about bucket_bytes (the
   first at most first_bytes), last layers first, and sums each across the
   replicas with allreduce nodes; g->grad[param] then names the summed value.
   Requires: ir_gradients. Produces: g->buckets, g->update_order. Returns 0. */
int  ir_buckets(Graph *g, long bucket_bytes, long first_bytes);
/* The update pass: one optimizer node per parameter with a gradient (SGD
   with a momentum buffer when momentum != 0; AdamW with its two moments), in
   g->update_order when set. Requires: ir_gradients (and ir_buckets, if any).
   Returns 0 or -1. */
int  ir_update(Graph *g, const IrOptimizer *opt);
/* --precision bf16, after the graph is complete (forward, gradients,
   update): PyTorch autocast's policy for bfloat16 on the ops mgc has.
   Convolutions, linear layers and their gradients multiply bf16 operands and
   sum in float32 (Node.mm = DT_BF16), but a depthwise convolution (memory
   bound: a GEMM of one row per group) stays float32; everything else
   (BatchNorm and its statistics, activations, pooling, softmax and the loss,
   reductions, the update, parameters and optimizer state) is float32.
   Tensors stay float32 in memory: the rounding happens as a GEMM packs its
   operands. Sets g->precision. Returns the nodes marked. */
int  ir_autocast(Graph *g);
/* A BatchNorm folded into the conv2d or linear layer before it (ir_infer):
   the layer's new weight and bias, and the checkpoint's tensors their values
   come from, by name. */
typedef struct IrFold {
    int weight, bias;         /* the new PARAM nodes, in the rewritten graph */
    const char *w, *b;        /* the layer's weight and bias (b NULL: it had none) */
    const char *gamma, *beta, *mean, *var;   /* the BatchNorm's weight, bias and running statistics */
    float eps;
    int channels;             /* output channels: w's rows, the BatchNorm's channels */
    long per_channel;         /* w's elements per output channel */
    int layer;                /* the conv2d (or linear) node that computes both now, in the rewritten graph */
} IrFold;
/* The inference rewrite (ir/infer.c): from g (the evaluation form) into out
   (ir_graph_init'ed, not training) the graph a library runs: the logits its
   one output (no loss, accuracy or labels); with fold, BatchNorm folded into
   the conv2d or linear layer before it where that layer's output is read by
   it alone (out->folds). Requires: a verified evaluation graph with logits.
   Returns 0, or -1 said through g->diag (internal). */
int  ir_infer(const Graph *g, Graph *out, bool fold);
/* A fold's values: w_out = w * s, b_out = (b - mean) * s + beta, with
   s = gamma / sqrt(var + eps) per output channel, in double, each rounded
   once to float32. b may be NULL (a layer without bias: 0). */
void ir_fold_values(const IrFold *f, const float *w, const float *b, const float *gamma, const float *beta, const float *mean,
                    const float *var, float *w_out, float *b_out);
/* An allreduce node on its own (not in a bucket): the sum of x over every replica. */
int  ir_allreduce(Graph *g, Loc loc, int x);
/* Prints nodes [from, to) one a line, with shapes and source locations. */
void ir_print(const Graph *g, FILE *out, int from, int to);

#endif
