/*
** The fusion pass: element-wise work folded into the kernel beside it, so it
** costs no sweep over memory (or no launch) of its own. The decisions are one
** record per node, kept here: the passes set them through the setters below
** (each sets both sides of a pair), lowering asks them through the questions
** (codegen.h); a fused node gets no kernel of its own.
**
**   ReLU and its gradient: folded into the kernel before them, whose buffer
**   the fused node shares (cg_fuse's comment lists the pairs). Every other
**   activation after a convolution, a linear layer, a BatchNorm, an add, a
**   mul or a sub: applied in that kernel's epilogue. Where the gradient reads the output
**   (ReLU6, sigmoid, tanh: MobileNetV2's BatchNorm + ReLU6) or nothing reads
**   the input again (an evaluation program), in place; where it reads the
**   input (hardswish, SiLU, GELU, ELU, ...), the epilogue stores both, the
**   input for the gradient and the activation in a buffer of its own: two
**   stores where a kernel of its own read the input back.
**
**   A product or difference whose only consumer is an add (an SE block's
**   gate, then the skip path's sum): computed by the add as it reads, never
**   stored (their gradients read their inputs, not their output).
**
**   CPUs: an attention op's statistics and output one kernel, its three
**   gradients another (codegen/attention.c), where each kernel made a head's
**   scores again; a LayerNorm over rows (tokens) one kernel, statistics and
**   apply (codegen/layernorm.c).
**
**   A dropout mask: made by each product that reads it (the forward's and
**   its gradient's, or the add such a product is fused into) from the seed,
**   the mask's key and the element's place, never stored (elementwise.c).
**
**   The SGD update of a gradient bucket (data parallelism): the updates of
**   parameters whose gradients lie in one bucket buffer are one kernel per
**   group, over the group's parameters one after another. A kernel takes at
**   most CG_MAXARGS (16) buffers, and each parameter (and its momentum) is a
**   persistent buffer of its own (the runtime's Store keeps them by name,
**   shared with the evaluation program and checkpoints), so one kernel
**   cannot take a whole bucket's parameters: it takes the bucket buffer once
**   (the gradients, at their offsets), the SGD scalars, and the parameters
**   and momenta of up to 7 parameters (14 without momentum). So an update of
**   P parameters is about P/7 kernels, not P (ResNet-18 on cpu:2 with
**   momentum: 62 -> 13; without, 7). On GPUs, where a launch costs more than
**   a small update, the updates of a single device (each parameter's gradient
**   a buffer of its own) are grouped too, up to 5 parameters a kernel with
**   momentum (param, gradient, momentum), 7 without (ResNet-18 on one GPU:
**   62 -> 16 launches with momentum, 11 without). The group is lowered
**   at its last update, every member's buffers made by then (a momentum
**   buffer's node comes just before its update), with the first member as
**   its node; only momentum buffers lie between the members. Each element
**   gets the very arithmetic of the unfused kernel: the same numbers.
*/
#include "codegen.h"
#include <stdlib.h>
#include <string.h>

/* One node's record. Each pair of fields names one relation from both of its
   sides, set together by one setter below. */
struct CgNode {
    int fused;                /* the node whose kernel computes it too (sharing its buffer), or -1 */
    int act;                  /* the activation (an Op) its kernel applies to what it stores, or -1 */
    int act_node;             /* with act: the activation node fused (whose fused is this node) */
    bool act_beside;          /* with act: stored into act_node's own buffer, the value as computed kept */
    bool relu_mask;           /* maxpool2d_grad: routes only where its input was positive (a fused relu_grad) */
    signed char conv;         /* a convolution or its gradient: its ConvStrategy; others -1 */
    const char *conv_why;     /* conv2d: the form chosen and why, for --emit kernels; others NULL */
    int stats_of, stats_by;   /* conv2d: the bn_stats whose partial sums its kernel writes; that bn_stats: the conv2d */
    int pool_of, pool_by;     /* bn_apply or conv2d: the max pool its kernel computes too; that maxpool2d: the producer */
    int bn_into_add;          /* add: the bn_apply input it normalises (its fused is the add), or -1 */
    int ew_into_add;          /* add: the mul or sub input it computes as it reads (its fused is the add), or -1 */
    int wgrad_pool;           /* conv2d_grad_w: the max-pool gradient whose routing its kernel does, or -1 */
    int wgrad_bias;           /* such a conv2d_grad_w: the bias_grad its kernel computes too (fused into it), or -1 */
    int grad_act;             /* bn_grad_params: the activation gradient folded in (fused into it), or -1 */
    int grad_act_bn;          /* such a bn_grad_params: the bn_apply that applied the activation, or -1 */
    int attn_out;             /* attention_stats: the attention computed by its kernel (fused into it), or -1 */
    int ln_apply;             /* ln_stats: the ln_apply computed by its kernel (fused into it), or -1 */
    bool mask_inline;         /* dropout_mask: made by each of its readers where it reads (fused into the first) */
    int attn_grad[3];         /* the first of an attention op's gradients: its dq, dk and dv nodes (each -1 where
                                 absent), computed by its kernel (the others fused into it); all -1 elsewhere */
};

void cg_decisions_init(CgDecisions *d, const Graph *g, Arena *a)
{
    d->node = arena_alloc(a, sizeof(CgNode) * (size_t)(g->n + 1));
    d->cpu_only = false;
    d->fuse = false;
    for (int id = 0; id <= g->n; id++)
        d->node[id] = (CgNode){ .fused = -1, .conv = -1, .stats_of = -1, .stats_by = -1, .pool_of = -1, .pool_by = -1,
                                .bn_into_add = -1, .wgrad_pool = -1, .wgrad_bias = -1, .act = -1,
                                .act_node = -1, .ew_into_add = -1, .grad_act = -1, .grad_act_bn = -1, .attn_out = -1, .ln_apply = -1,
                                .attn_grad = { -1, -1, -1 } };
}

/* ------------------------------------------------------------ the questions */

int cg_fused_into(const CgDecisions *d, int id) { return d->node[id].fused; }
int cg_act(const CgDecisions *d, int id) { return d->node[id].act; }
int cg_act_node(const CgDecisions *d, int id) { return d->node[id].act_node; }
bool cg_relu_out(const CgDecisions *d, int id) { return d->node[id].act == OP_RELU; }
int cg_act_beside(const CgDecisions *d, int id) { return d->node[id].act_beside ? d->node[id].act_node : -1; }
int cg_holds(const CgDecisions *d, int id)
{
    return d->node[id].act >= 0 && !d->node[id].act_beside ? d->node[id].act_node : id;
}
bool cg_relu_mask(const CgDecisions *d, int id) { return d->node[id].relu_mask; }
int cg_conv_form(const CgDecisions *d, int id) { return d->node[id].conv; }
const char *cg_conv_why(const CgDecisions *d, int id) { return d->node[id].conv_why; }
int cg_stats_of(const CgDecisions *d, int conv) { return d->node[conv].stats_of; }
int cg_stats_by(const CgDecisions *d, int stats) { return d->node[stats].stats_by; }
int cg_pool_of(const CgDecisions *d, int producer) { return d->node[producer].pool_of; }
int cg_pool_by(const CgDecisions *d, int pool) { return d->node[pool].pool_by; }
int cg_bn_into_add(const CgDecisions *d, int add) { return d->node[add].bn_into_add; }
int cg_ew_into_add(const CgDecisions *d, int add) { return d->node[add].ew_into_add; }
int cg_wgrad_pool(const CgDecisions *d, int wgrad) { return d->node[wgrad].wgrad_pool; }
int cg_wgrad_bias(const CgDecisions *d, int wgrad) { return d->node[wgrad].wgrad_bias; }
int cg_bn_grad_act(const CgDecisions *d, int params) { return d->node[params].grad_act; }
int cg_bn_grad_act_bn(const CgDecisions *d, int params) { return d->node[params].grad_act_bn; }
int cg_attn_out(const CgDecisions *d, int stats) { return d->node[stats].attn_out; }
int cg_attn_grad(const CgDecisions *d, int first, int which) { return d->node[first].attn_grad[which]; }
int cg_ln_apply(const CgDecisions *d, int stats) { return d->node[stats].ln_apply; }
bool cg_mask_inline(const CgDecisions *d, int mask) { return d->node[mask].mask_inline; }

/* -------------------------------------------------------------- the setters */

void cg_set_conv(CgDecisions *d, int id, ConvStrategy form, const char *why)
{
    d->node[id].conv = (signed char)form;
    d->node[id].conv_why = why;
}

void cg_add_conv_why(CgDecisions *d, Arena *a, int id, const char *more)
{
    if (d->node[id].conv_why) d->node[id].conv_why = arena_printf(a, "%s; %s", d->node[id].conv_why, more);
}

void cg_set_stats(CgDecisions *d, int conv, int stats)
{
    d->node[conv].stats_of = stats;
    d->node[stats].stats_by = conv;
}

void cg_set_pool(CgDecisions *d, int producer, int pool)
{
    d->node[producer].pool_of = pool;
    d->node[pool].pool_by = producer;
}

/* Node id computed by into's kernel. */
static void fuse_into(CgDecisions *d, int id, int into) { d->node[id].fused = into; }

/* Activation node a (op) applied by x's kernel as it stores, in place or beside its input. */
static void fuse_act(CgDecisions *d, int x, int a, Op op, bool beside)
{
    fuse_into(d, a, x);
    d->node[x].act = (int)op;
    d->node[x].act_node = a;
    d->node[x].act_beside = beside;
}

/* relu_grad r's masking done by max-pool gradient pool's routing. */
static void fuse_relu_mask(CgDecisions *d, int pool, int r)
{
    fuse_into(d, r, pool);
    d->node[pool].relu_mask = true;
}

/* Max-pool gradient pool's routing done by weight gradient wg's kernel, and bias gradient
   bg (or -1) computed by it too; the relu_grad r (or -1) that is then read by nothing else,
   never written, and the pool gradient with it. */
static void fuse_pooled_wgrad_into(CgDecisions *d, int wg, int pool, int bg, int r)
{
    d->node[wg].wgrad_pool = pool;
    d->node[wg].wgrad_bias = bg;
    if (bg >= 0) fuse_into(d, bg, wg);
    if (r >= 0) {
        fuse_into(d, pool, wg);
        fuse_into(d, r, wg);
    }
}

/* Activation gradient ga applied by BatchNorm gradient params's kernel, bn_apply b's activation's. */
static void fuse_grad_act(CgDecisions *d, int params, int ga, int b)
{
    fuse_into(d, ga, params);
    d->node[params].grad_act = ga;
    d->node[params].grad_act_bn = b;
}

/* CPUs: attention a computed by its statistics' kernel (lse and o from one pass over the scores). */
static void fuse_attention(CgDecisions *d, int stats, int a)
{
    fuse_into(d, a, stats);
    d->node[stats].attn_out = a;
}

/* CPUs: an attention op's gradients (ids[0..2]: dq, dk, dv, -1 where absent) computed by the first's
   kernel, one pass over the scores where each made them again. */
static void fuse_attn_grads(CgDecisions *d, const int *ids)
{
    int first = -1;
    for (int w = 0; w < 3; w++)
        if (ids[w] >= 0 && (first < 0 || ids[w] < first)) first = ids[w];
    for (int w = 0; w < 3; w++) {
        d->node[first].attn_grad[w] = ids[w];
        if (ids[w] >= 0 && ids[w] != first) fuse_into(d, ids[w], first);
    }
}

/* CPUs: LayerNorm's apply a computed by its statistics' kernel, each row of x read once. */
static void fuse_ln_apply(CgDecisions *d, int stats, int a)
{
    fuse_into(d, a, stats);
    d->node[stats].ln_apply = a;
}

/* Input x of add normalised (a bn_apply) or computed (a mul or sub) by the add's kernel as it reads. */
static void fuse_into_add(CgDecisions *d, const Graph *g, int add, int x)
{
    fuse_into(d, x, add);
    if (g->nodes[x].op == OP_BN_APPLY) d->node[add].bn_into_add = x;
    else d->node[add].ew_into_add = x;
}

int cg_grad_bucket(const Graph *g, int sgd)
{
    int x = g->nodes[sgd].in[1];
    while (g->nodes[x].op == OP_SLICE || g->nodes[x].op == OP_RESHAPE) x = g->nodes[x].in[0];
    return g->nodes[x].op == OP_ALLREDUCE ? g->nodes[x].attr.bucket : -1;
}

/* SGD updates of one bucket, in groups (the header says why of up to 7 or 14), and on GPUs
   (gpu) consecutive updates whose gradients are buffers of their own, in groups of up to 5
   or 7: every member but the first fused into the group's first update. */
static void fuse_sgd(const Graph *g, CgDecisions *d, bool gpu)
{
    int first = -1, count = 0, bucket = -1;
    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op == OP_STATE) continue;   /* a momentum buffer, made just before its update */
        int b = n->op == OP_SGD ? cg_grad_bucket(g, id) : -1;
        if (n->op == OP_SGD && b < 0 && gpu) b = g->nbuckets;   /* "no bucket": each member brings its gradient */
        if (b < 0) {
            first = -1;
            continue;
        }
        const Node *f = first >= 0 ? &g->nodes[first] : NULL;
        int most = b < g->nbuckets ? (CG_MAXARGS - 2) / (n->nin - 1)   /* the gradients' bucket and the scalars take two */
                                   : (CG_MAXARGS - 1) / n->nin;        /* the scalars one, each member its gradient too */
        if (f && b == bucket && n->nin == f->nin && count < most && n->attr.lr == f->attr.lr &&
            n->attr.momentum == f->attr.momentum && n->attr.weight_decay == f->attr.weight_decay &&
            n->attr.nesterov == f->attr.nesterov) {
            fuse_into(d, id, first);
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
        int pool = cg_fused_into(d, r);
        if (rn->op != OP_RELU_BWD || pool < 0) continue;
        const Node *pn = &g->nodes[pool];
        if (pn->op != OP_MAXPOOL_BWD || !cg_relu_mask(d, pool) || pn->attr.kernel != 2 || pn->attr.stride != 2 || pn->attr.padding != 0 ||
            pn->attr.ceil_mode)
            continue;
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
        if (g->nodes[wg].mm == DT_BF16) continue;   /* its loops multiply in fp32; a bf16 layer's weight gradient is a GEMM form */
        const Node *wn = &g->nodes[wg];
        if (wn->attr.stride != 1 || wn->attr.padding != 0 || ir_groups(&wn->attr) > 1 || ir_dilation(&wn->attr) > 1 || wn->shape.d[2] > 8 || wn->shape.d[1] * wn->shape.d[2] > 32) continue;
        fuse_pooled_wgrad_into(d, wg, pool, bg, xg < 0 ? r : -1);
    }
}

bool cg_plane_indexable(const Shape *s, const Shape *out)
{
    if (s->nd != 4 || out->nd != 4) return false;
    for (int k = 0; k < 2; k++)
        if (s->d[k] != out->d[k] && s->d[k] != 1) return false;
    return (s->d[2] == out->d[2] && s->d[3] == out->d[3]) || (s->d[2] == 1 && s->d[3] == 1);
}

/* Whether node x's kernel ends in an epilogue an activation can be folded
   into: a convolution's store (every form's: cg_store), a linear layer's
   bias, a BatchNorm's store, a sum of two, a product or a difference
   (broadcast or not). */
static bool act_producer(const Graph *g, int x)
{
    Op op = g->nodes[x].op;
    return op == OP_LINEAR || op == OP_BN_APPLY || op == OP_CONV2D || ((op == OP_ADD || op == OP_MUL || op == OP_SUB) && g->nodes[x].nin == 2);
}

/* Whether x's users are the activation a and a's gradients reading x (their input 0). */
static bool only_grads_read(const Graph *g, int x, int a, const int *uses)
{
    Op grad = ir_activation_grad(g->nodes[a].op);
    int seen = 1;
    for (int id = a + 1; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] == x) {
                if (n->op != grad || k != 0) return false;
                seen++;
            }
    }
    return seen == uses[x];
}

/* The node whose kernel would apply activation a to x: x itself, or, where x is a
   reshape that only a (and a's gradients) read, the reshape's input (a BatchNorm1d's
   [N, C, 1, 1] output seen as [N, C]): a view's elements are its input's, in order. */
static int through_view(const Graph *g, int x, int a, const int *uses)
{
    return g->nodes[x].op == OP_RESHAPE && only_grads_read(g, x, a, uses) ? g->nodes[x].in[0] : x;
}

/* The product or difference an add can compute as it reads (dec->ew_into_add):
   a mul or sub whose only user is the add and whose kernel absorbed nothing. Its
   gradients read its inputs, never its output, which is then never written. */
static bool ew_into_add_fits(const Graph *g, const CgDecisions *d, int m, const int *uses)
{
    Op op = g->nodes[m].op;
    return (op == OP_MUL || op == OP_SUB) && uses[m] == 1 && cg_act(d, m) < 0 && cg_fused_into(d, m) < 0;
}

/* The bn_apply whose kernel applies the activation that gradient ga differentiates:
   ga reads that bn_apply's output (the activation's input, stored beside) or the
   activation applied in place (its output); -1 where ga's activation is anyone else's. */
static int grad_act_source(const Graph *g, const CgDecisions *d, int ga)
{
    int v = g->nodes[ga].in[0];
    int b = g->nodes[v].op == OP_BN_APPLY ? v : cg_fused_into(d, v);
    if (b < 0 || g->nodes[b].op != OP_BN_APPLY || cg_act(d, b) < 0) return -1;
    Op f = (Op)cg_act(d, b);
    if (ir_activation_grad(f) != g->nodes[ga].op) return -1;
    return v == (ir_activation_reads_y(f) ? cg_act_node(d, b) : b) ? b : -1;
}

/* CPUs (codegen/attention.c): an attention op's statistics and output one kernel, its gradients
   another. Each kernel makes a head's scores [Tq, Tk] again, a block of queries at a time: the
   forward's two kernels made them twice, the gradients' three three times. The grouped gradients
   share all six inputs; the output needs v made before the statistics (as ir_attention orders them). */
static int attn_grad_which(Op op) { return op == OP_ATTN_BWD_Q ? 0 : op == OP_ATTN_BWD_K ? 1 : op == OP_ATTN_BWD_V ? 2 : -1; }

static void fuse_attention_ops(const Graph *g, CgDecisions *d)
{
    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op == OP_ATTENTION) {
            int st = n->in[3];
            if (g->nodes[st].op == OP_ATTN_STATS && n->in[2] < st && cg_fused_into(d, st) < 0 && cg_attn_out(d, st) < 0)
                fuse_attention(d, st, id);
        } else if (attn_grad_which(n->op) >= 0 && cg_fused_into(d, id) < 0) {
            int ids[3] = { -1, -1, -1 };
            for (int o = id; o < g->n; o++) {
                const Node *m = &g->nodes[o];
                int w = attn_grad_which(m->op);
                if (w >= 0 && ids[w] < 0 && m->nin == n->nin && !memcmp(m->in, n->in, sizeof(int) * (size_t)n->nin)) ids[w] = o;
            }
            fuse_attn_grads(d, ids);
        }
    }
}

/* Reader r of dropout mask m, a product of it and a tensor of its shape, may make the mask as it
   reads: computed by its own kernel or by an add's (cg_ew_into_add) that reads no other mask (a
   kernel has one seed, so one mask). */
static bool mask_reader_fits(const Graph *g, const CgDecisions *d, int r, int m)
{
    const Node *n = &g->nodes[r];
    if (n->op != OP_MUL || n->nin != 2 || !ir_shape_eq(&n->shape, &g->nodes[m].shape)) return false;
    int other = n->in[0] == m ? n->in[1] : n->in[0];
    if (g->nodes[other].op == OP_DROPOUT_MASK || !ir_shape_eq(&g->nodes[other].shape, &n->shape)) return false;
    int add = cg_fused_into(d, r);
    if (add < 0) return true;
    if (g->nodes[add].op != OP_ADD || cg_ew_into_add(d, add) != r) return false;
    int side = g->nodes[add].in[0] == r ? g->nodes[add].in[1] : g->nodes[add].in[0];
    return g->nodes[side].op != OP_DROPOUT_MASK;
}

/* Dropout masks made where they are read (codegen/elementwise.c): the forward's product and the
   gradient's each compute mask element i from the run's seed, the mask's key and the element's
   global index, as the mask's own kernel did, where every reader fits; the mask is never stored
   (a pass and a tensor less a dropout, and a read less each reader). */
static void fuse_dropout_masks(const Graph *g, CgDecisions *d)
{
    for (int m = 0; m < g->n; m++) {
        if (g->nodes[m].op != OP_DROPOUT_MASK || cg_fused_into(d, m) >= 0) continue;
        int first = -1;
        bool fits = true;
        for (int r = m + 1; r < g->n && fits; r++)
            for (int j = 0; j < g->nodes[r].nin; j++)
                if (g->nodes[r].in[j] == m) {
                    fits = mask_reader_fits(g, d, r, m);
                    if (first < 0) first = r;
                    break;
                }
        if (fits && first >= 0) {
            fuse_into(d, m, first);
            d->node[m].mask_inline = true;
        }
    }
}

/* CPUs (codegen/layernorm.c): a LayerNorm over rows (tokens, features: each normalised row
   contiguous) one kernel, a row's statistics and then its values while the row is in cache, where
   the apply read x again. */
static void fuse_layernorm_ops(const Graph *g, CgDecisions *d)
{
    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op != OP_LN_APPLY || cg_fused_into(d, id) >= 0) continue;
        int st = n->in[1];
        if (g->nodes[st].op == OP_LN_STATS && g->nodes[st].in[0] == n->in[0] && ir_ln_positions(&n->shape) == 1 &&
            cg_fused_into(d, st) < 0 && cg_ln_apply(d, st) < 0)
            fuse_ln_apply(d, st, id);
    }
}

/* A BatchNorm's activation (MobileNetV2's BatchNorm + ReLU6, an MBConv's + SiLU)
   differentiated where its gradient is read: an activation gradient whose only
   readers are the BatchNorm gradients of the bn_apply that applied it is computed
   by bn_grad_params's kernel as it reads dy, the activation's input recomputed from
   the BatchNorm's input (bn_apply's multiply-add, the same bits), and stored there
   for bn_grad_x: one pass over dy where a kernel of its own read dy and the
   activation's input or output and wrote the gradient that bn_grad_params read
   back. Where the activation's gradients are all folded so, nothing reads its
   input any more: the activation is applied in place, one store fewer. */
static void fuse_bn_grad_acts(const Graph *g, CgDecisions *d, const int *uses)
{
    for (int ga = 0; ga < g->n; ga++) {
        if (uses[ga] != 2 || g->nodes[ga].nin != 2 || cg_fused_into(d, ga) >= 0) continue;
        int b = grad_act_source(g, d, ga);
        if (b < 0) continue;
        const Node *bn = &g->nodes[b];
        int params = -1, gx = -1;
        for (int id = ga + 1; id < g->n; id++) {
            const Node *n = &g->nodes[id];
            bool same = n->nin >= 3 && n->in[0] == bn->in[0] && n->in[1] == bn->in[1];   /* x, stats */
            if (n->op == OP_BN_BWD_PARAMS && same && n->in[2] == ga) params = id;
            else if (n->op == OP_BN_BWD_X && same && n->in[2] == bn->in[2] && n->in[3] == ga) gx = id;
        }
        if (params >= 0 && gx > params) fuse_grad_act(d, params, ga, b);
    }
    for (int b = 0; b < g->n; b++) {
        int a = cg_act_beside(d, b);
        if (g->nodes[b].op != OP_BN_APPLY || a < 0) continue;
        int folded = 0;
        for (int id = b + 1; id < g->n; id++)
            for (int k = 0; k < g->nodes[id].nin; k++)
                if (g->nodes[id].in[k] == b && (id == a || (cg_fused_into(d, id) >= 0 && g->nodes[cg_fused_into(d, id)].op == OP_BN_BWD_PARAMS)))
                    folded++;
        if (folded == uses[b]) d->node[b].act_beside = false;
    }
}

/* Requires: a verified graph. Produces: the records' activations, fused nodes, pools and adds' inputs.
     conv2d -> relu            the convolution's store applies max(0, .)
     linear -> relu            the bias epilogue after the GEMM applies it
     bn_apply -> relu          the normalisation's store applies it (BatchNorm, ReLU)
     add -> relu               the sum's store applies it (a residual block's end)
     mul, sub -> relu          the same
     linear, bn_apply, add, mul, sub -> any other activation
                               the store applies it, in place or beside (cg_act_beside)
     conv2d -> any other activation
                               the convolution's store applies it, in place or beside
     mul, sub -> add           the add computes the product as it reads (ew_into_add)
     maxpool2d_grad -> relu_grad(y = the pool's input)
                               the pool gradient is routed only where y > 0
     bn_apply + activation: its gradient -> bn_grad_params, bn_grad_x
                               bn_grad_params applies the activation's gradient
                               as it reads dy (fuse_bn_grad_acts)
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
            int x = through_view(g, n->in[0], id, uses);
            if (act_producer(g, x) && uses[x] == 1) fuse_act(d, x, id, OP_RELU, false);
        } else if (ir_activation_grad(n->op) != OP_COUNT) {
            /* every other activation, where the kernel before it ends in a simple
               epilogue (a convolution's store, a linear layer's bias, a BatchNorm's
               store, a sum, product or difference): applied in that epilogue. Alone in reading the producer's
               output (an evaluation program, or a gradient that reads y), it is
               applied in place: the input is never written. Otherwise its gradients
               read the input: the epilogue stores both, the input and the activation
               in a buffer of its own, one pass where two kernels made three. */
            int v = n->in[0], x = through_view(g, v, id, uses);   /* x == v, or a reshape v between */
            if (!act_producer(g, x) || cg_act(d, x) >= 0 || (x != v && uses[x] != 1)) continue;
            if (uses[v] == 1) fuse_act(d, x, id, n->op, false);
            else if (only_grads_read(g, v, id, uses)) fuse_act(d, x, id, n->op, true);
        } else if (n->op == OP_RELU_BWD) {
            int y = n->in[0], pool = n->in[1];
            const Node *dn = &g->nodes[pool];
            if (dn->op == OP_MAXPOOL_BWD && uses[pool] == 1 && dn->in[0] == y) fuse_relu_mask(d, pool, id);
        }
    }
    /* A max pool of a BatchNorm + ReLU output (ResNet-18's stem): computed plane by
       plane by the BatchNorm's kernel while the plane it just wrote is in L1, where
       a kernel of its own reads the whole map back from memory (ResNet-18: 4.2 ms a
       step). The ReLU output is still written: the pool's gradient reads it. CPUs
       only: on GPUs both kernels take a thread per element, which a plane loop
       would not allow. */
    for (int id = 0; opt->fuse && id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op != OP_MAXPOOL || n->attr.ceil_mode) continue;
        int x = n->in[0], b = cg_fused_into(d, x) >= 0 && g->nodes[x].op == OP_RELU ? cg_fused_into(d, x) : x;
        const Shape *xs = &g->nodes[x].shape;
        if (opt->cpu_only && g->nodes[b].op == OP_BN_APPLY && cg_relu_out(d, b) && cg_pool_of(d, b) < 0 && (long)xs->d[2] * xs->d[3] <= 4096)
            cg_set_pool(d, b, id);
    }
    /* A product or difference whose only consumer is an add (an SE block's gate
       times the branch, before the sum with the skip path): the add's kernel
       multiplies as it reads, the product never written (SE-ResNet: every block's
       end). Taken before a BatchNorm into the same add (below): the add then
       normalises its other input too, where that input's index is per plane. */
    for (int id = 0; opt->fuse && id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op != OP_ADD || n->nin != 2) continue;
        for (int k = 0; k < 2; k++)
            if (ew_into_add_fits(g, d, n->in[k], uses)) {
                fuse_into_add(d, g, id, n->in[k]);
                break;
            }
    }
    /* A BatchNorm (no ReLU) whose only consumer is an add (a residual block's last
       BatchNorm, before the sum with the skip path): the add's kernel normalises as it
       reads, and the BatchNorm's output is never written. Its backward reads its input
       and statistics, not its output. One such input per add (its kernel normalises
       one of its two inputs). */
    for (int id = 0; opt->fuse && id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op != OP_ADD || n->nin != 2 || n->shape.nd != 4) continue;
        for (int k = 0; k < 2; k++) {
            int b = n->in[k];
            int e = cg_ew_into_add(d, id);
            if (e >= 0 && !(cg_plane_indexable(&g->nodes[g->nodes[e].in[0]].shape, &n->shape) &&
                            cg_plane_indexable(&g->nodes[g->nodes[e].in[1]].shape, &n->shape)))
                break;   /* the kernel walks planes: the product's inputs must be indexed per plane */
            if (g->nodes[b].op == OP_BN_APPLY && uses[b] == 1 && cg_act(d, b) < 0 && cg_pool_of(d, b) < 0 && cg_fused_into(d, b) < 0 &&
                ir_shape_eq(&g->nodes[b].shape, &n->shape) && cg_plane_indexable(&g->nodes[n->in[1 - k]].shape, &n->shape)) {
                /* (the BatchNorm's planes are the sum's; the other input, if broadcast, indexed per plane) */
                fuse_into_add(d, g, id, b);
                break;
            }
        }
    }
    if (opt->fuse) fuse_bn_grad_acts(g, d, uses);
    if (opt->fuse && opt->cpu_only) fuse_pooled_wgrad(g, d, uses);
    if (opt->fuse && opt->cpu_only) fuse_attention_ops(g, d);
    if (opt->fuse && opt->cpu_only) fuse_layernorm_ops(g, d);
    if (opt->fuse) fuse_dropout_masks(g, d);
    free(uses);
    if (opt->fuse) fuse_sgd(g, d, !opt->cpu_only);
}
