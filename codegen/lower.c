/*
** Lowering: IR nodes -> buffers and steps, and the kernel bodies as text.
**
** Requires: a verified graph (shapes set, inputs earlier than users).
** Produces: a Program. Every node that has an output gets a buffer sized for
** N examples (views alias their input's buffer); GEMM-shaped ops become
** generated kernels, or generated pack/unpack kernels around one BLAS call
** (codegen/conv.c has the picture for convolutions).
**
** This file is the driver: it walks the nodes in order and calls the one
** lowering function of each op (the op families are listed in
** codegen/lower_internal.h), and it lowers the ops that belong to no family:
** inputs, views, SGD (one parameter, or a fused group of a bucket), AdamW,
** fusion and pinning. The buffers, steps and kernel text every family makes
** are codegen/kernel.c's (which says what a kernel's text may use).
*/
#include "lower_internal.h"
#include <stdlib.h>
#include <limits.h>
#include <string.h>

/* ------------------------------------------------------------------- the update */

/* The buffer of the run's optimizer scalars (Program.opt_scalars), made at the first update;
   the program keeps the optimizer that update was built with. */
static int opt_scalars(Lower *L, const Node *n)
{
    Program *p = L->p;
    if (p->opt_scalars >= 0) return p->opt_scalars;
    const IrAttrs *a = &n->attr;
    if (n->op == OP_ADAMW) {
        p->opt = (IrOptimizer){ .kind = IR_ADAMW, .lr = a->lr, .weight_decay = a->weight_decay, .beta1 = a->beta1,
                                .beta2 = a->beta2, .eps = a->eps };
        p->opt_scalars = cg_new_buf(L, BUF_INPUT, dimc(8), "AdamW scalars (lr, beta1, 1 - lr wd, beta2, eps, lr / (1 - beta1^t), "
                                    "sqrt(1 - beta2^t))", -1);
    } else {
        p->opt = (IrOptimizer){ .kind = IR_SGD, .lr = a->lr, .weight_decay = a->weight_decay, .momentum = a->momentum,
                                .nesterov = a->nesterov };
        p->opt_scalars = cg_new_buf(L, BUF_INPUT, dimc(3), "SGD scalars (lr, momentum, weight decay)", -1);
    }
    return p->opt_scalars;
}

/* An SGD kernel's line for one parameter's element i: its momentum (and Nesterov's look-ahead). */
static void sgd_momentum(Lower *L, const Node *n, const char *velocity)
{
    if (n->attr.nesterov)
        cg_body(L, "        { float v = %s[i] = momentum * %s[i] + gi; gi = gi + momentum * v; }   /* Nesterov */\n", velocity, velocity);
    else
        cg_body(L, "        gi = %s[i] = momentum * %s[i] + gi;\n", velocity, velocity);
}

static void lower_sgd(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    bool mom = n->nin == 3;
    int b[4] = { buf_of(L, n->in[0]), buf_of(L, n->in[1]), mom ? buf_of(L, n->in[2]) : -1, -1 };
    const char *names[4] = { "=param", "grad", "=velocity", NULL };
    int na = mom ? 3 : 2;
    b[na] = opt_scalars(L, n);
    names[na++] = "sgd";
    Step *s = cg_kernel(L, id, "sgd", work, na, b, names);
    s->sgd = true;
    cg_body(L, "    /* PyTorch's SGD: g += wd * p; v = momentum * v + g; p -= lr * v.  sgd = lr, momentum, weight decay */\n");
    cg_body(L, "    const float lr = sgd[0], momentum = sgd[1], wd = sgd[2];\n    (void)momentum;\n");
    cg_body(L, "    FOR_EACH(i, %s) {\n        float gi = grad[i] + wd * param[i];\n", cg_work_str(L, work));
    if (mom) sgd_momentum(L, n, "velocity");
    cg_body(L, "        param[i] -= lr * gi;\n    }\n");
    cg_end_kernel(L);
    L->p->node_buf[id] = buf_of(L, n->in[0]);
}

/* The SGD updates of a group (the fusion pass's; codegen/fuse.c says why groups), their
   gradients in one bucket, or (GPUs, one device) each in a buffer of its own: one grouped
   kernel (cg_group_kernel), a loop a member (on the C target a loop the compiler
   vectorises), each element with lower_sgd's arithmetic.
   first: the group's first update; lowered at its last, with first as its node. */
static void lower_sgd_group(Lower *L, int first)
{
    const Graph *g = L->g;
    Program *p = L->p;
    int members[CG_MAXARGS], nm = 0;
    for (int id = first; id < g->n; id++)
        if (id == first || (g->nodes[id].op == OP_SGD && cg_fused_into(L->dec, id) == first)) members[nm++] = id;
    const Node *n0 = &g->nodes[first];
    bool mom = n0->nin == 3;
    CgArgs a = { 0 };
    long offset[CG_MAXARGS], count[CG_MAXARGS];   /* offset: the member's gradient in the bucket */
    int bucket = -1;
    bool in_bucket = cg_grad_bucket(g, first) >= 0;
    for (int m = 0; m < nm; m++) {
        const Node *n = &g->nodes[members[m]];
        int gb = buf_of(L, n->in[1]);
        long off = 0;
        while (in_bucket && p->bufs[gb].kind == BUF_VIEW) {
            off += p->bufs[gb].offset;
            gb = p->bufs[gb].alias;
        }
        bucket = gb;   /* in a bucket, the same for every member: one IR bucket is one buffer */
        offset[m] = off;
        count[m] = dim_of(&n->shape).c;
        cg_arg(L, &a, buf_of(L, n->in[0]), "=param%d", m);
        if (mom) cg_arg(L, &a, buf_of(L, n->in[2]), "=velocity%d", m);
        if (!in_bucket) cg_arg(L, &a, gb, "grad%d", m);
    }
    if (in_bucket) cg_arg(L, &a, bucket, "grads");
    cg_arg(L, &a, opt_scalars(L, n0), "sgd");
    Step *s = cg_group_kernel(L, first, in_bucket ? "sgd_bucket" : "sgd_group", &a, count, nm);
    s->sgd = true;
    if (in_bucket)
        cg_body(L, "    /* PyTorch's SGD (as sgd) for %d parameters, their gradients in %s at their offsets:\n", nm, p->bufs[bucket].name);
    else
        cg_body(L, "    /* PyTorch's SGD (as sgd) for %d parameters, one launch:\n", nm);
    for (int m = 0; m < nm; m++) {
        const Node *pn = &g->nodes[g->nodes[members[m]].in[0]];
        if (in_bucket) cg_body(L, "       %%%d %s: param%d, grads + %ld\n", members[m], pn->name ? pn->name : "", m, offset[m]);
        else cg_body(L, "       %%%d %s: param%d, grad%d\n", members[m], pn->name ? pn->name : "", m, m);
    }
    cg_body(L, "       sgd = lr, momentum, weight decay */\n");
    cg_body(L, "    const float lr = sgd[0], momentum = sgd[1], wd = sgd[2];\n    (void)momentum;\n");
    for (int m = 0; m < nm; m++) {   /* one loop a member: each thread's share of each, contiguous (C) */
        cg_body(L, "    FOR_EACH(i, %ldL) {\n        float gi = %s + wd * param%d[i];\n", count[m],
                in_bucket ? arena_printf(p->arena, "grads[%ldL + i]", offset[m]) : arena_printf(p->arena, "grad%d[i]", m), m);
        if (mom) sgd_momentum(L, n0, arena_printf(p->arena, "velocity%d", m));
        cg_body(L, "        param%d[i] -= lr * gi;\n    }\n", m);
    }
    cg_end_kernel(L);
}

/* ----------------------------------------------------------------------- driver */

void cg_lower_view(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int base = buf_of(L, n->in[0]);
    int off = n->op == OP_SLICE ? n->attr.offset : 0;
    while (L->p->bufs[base].kind == BUF_VIEW) {
        off += L->p->bufs[base].offset;
        base = L->p->bufs[base].alias;
    }
    int b = cg_new_buf(L, BUF_VIEW, dim_of(&n->shape), ir_op_name(n->op), id);
    L->p->bufs[b].alias = base;
    L->p->bufs[b].offset = off;
    L->p->node_buf[id] = b;
}

static void pin(Program *p, int b)
{
    b = cg_base_buf(p, b);
    if (b >= 0) p->bufs[b].pinned = true;
}

/* PyTorch's AdamW for one parameter: decoupled weight decay, then the moments and the bias-corrected step */
void cg_lower_adamw(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    if (cg_sharded(L, id) && cg_shard_update(L, id, opt_scalars(L, n))) return;
    Dim work = dim_of(&n->shape);
    int b[5] = { buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[3]), opt_scalars(L, n) };
    Step *s = cg_kernel(L, id, "adamw", work, 5, b, (const char *const[]){ "=param", "grad", "=exp_avg", "=exp_avg_sq", "opt" });
    s->sgd = true;
    cg_body(L, "    /* PyTorch's AdamW: p *= 1 - lr wd; m += (1 - b1)(g - m); v = b2 v + (1 - b2) g^2;\n"
               "       p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).  opt = lr, b1, 1 - lr wd, b2, eps,\n"
               "       lr / (1 - b1^t), sqrt(1 - b2^t), the host's every run */\n");
    cg_body(L, "    const float b1 = opt[1], decay = opt[2], b2 = opt[3], eps = opt[4], step = opt[5], bc2s = opt[6];\n");
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        const float g = grad[i], p = param[i] * decay;\n"
               "        const float m = exp_avg[i] = exp_avg[i] + (1.0f - b1) * (g - exp_avg[i]);\n"
               "        const float v = exp_avg_sq[i] = exp_avg_sq[i] * b2 + (1.0f - b2) * g * g;\n"
               "        param[i] = p - step * (m / (sqrtf(v) / bc2s + eps));\n    }\n", cg_work_str(L, work));
    cg_end_kernel(L);
    L->p->node_buf[id] = buf_of(L, n->in[0]);
}

void cg_lower_input(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    L->p->node_buf[id] = cg_new_buf(L, BUF_INPUT, dim_of(&n->shape), n->name, id);
}

void cg_lower_sgd(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    if (cg_sharded(L, id) && cg_shard_update(L, id, opt_scalars(L, n))) return;
    int first = cg_fused_into(L->dec, id);
    if (first >= 0) {   /* a member of a group of updates: its parameter; the group's last: its kernel */
        L->p->node_buf[id] = L->p->node_buf[n->in[0]];
        if (L->sgd_last[first] == id) lower_sgd_group(L, first);
    } else if (L->sgd_last[id] > id) {
        L->p->node_buf[id] = L->p->node_buf[n->in[0]];   /* a group's first: lowered at its last */
    } else {
        lower_sgd(L, id);
    }
}

/* Each op's lowering, by the op table's lower column. */
static void (*const lowerings[OP_COUNT])(Lower *L, int id) = {
#define X(e, name, kind, mn, mx, attrs, shape, grad, lower, print) [OP_##e] = cg_lower_##lower,
#include "ops.def"
#undef X
};

/* Lower's per-node and per-bucket maps, allocated and set to none. */
static void lower_init(Lower *L, Arena *a)
{
    const Graph *g = L->g;
    int **fields[] = { &L->col, &L->dyt, &L->dyc, &L->wbf, &L->part, &L->in_bucket, &L->bucket_at, &L->sgd_last };
    for (int k = 0; k < (int)(sizeof fields / sizeof *fields); k++) {
        int *map = *fields[k] = arena_alloc(a, sizeof(int) * (size_t)(g->n + 1));
        for (int id = 0; id <= g->n; id++) map[id] = -1;
    }
    L->bucket_coll = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    L->bucket_buf = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    L->ready = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    L->waited = arena_alloc(a, sizeof(bool) * (size_t)(g->nbuckets + 1));
    /* groups of SGD updates (fusion): first member -> last member */
    for (int id = 0; id < g->n; id++)
        if (g->nodes[id].op == OP_SGD && cg_fused_into(L->dec, id) >= 0) L->sgd_last[cg_fused_into(L->dec, id)] = id;
}

/* After the steps: what the runtime needs to know, so that it never reads the IR. */
static void lower_finish(Lower *L, Arena *a)
{
    const Graph *g = L->g;
    Program *p = L->p;
    /* What the host reads after a run keeps its own memory (see the planner in runtime/). */
    for (int id = 0; g->grad && id < g->n_forward; id++) {
        Op op = g->nodes[id].op;
        if ((op == OP_PARAM || op == OP_INPUT) && g->grad[id] >= 0) pin(p, p->node_buf[g->grad[id]]);
    }
    int host[5] = { g->input, g->labels, g->loss, g->correct, g->logits };
    for (int k = 0; k < 5; k++)
        if (host[k] >= 0) pin(p, p->node_buf[host[k]]);
    p->input = g->input >= 0 ? p->node_buf[g->input] : -1;
    p->labels = g->labels >= 0 ? p->node_buf[g->labels] : -1;
    p->loss = g->loss >= 0 ? p->node_buf[g->loss] : -1;
    p->correct = g->correct >= 0 ? p->node_buf[g->correct] : -1;
    p->logits = g->logits >= 0 ? p->node_buf[g->logits] : -1;
    p->net_name = g->net_name;
    if (g->input >= 0) p->input_shape = g->nodes[g->input].shape;
    p->classes = g->logits >= 0 ? g->nodes[g->logits].shape.d[1] : 0;
    p->input_grad = g->grad && g->input >= 0 && g->grad[g->input] >= 0 ? p->node_buf[g->grad[g->input]] : -1;
    p->param_scalars = ir_param_count(g, &p->param_tensors);
    p->params = arena_alloc(a, sizeof(ProgParam) * (size_t)(p->param_tensors + 1));
    for (int id = 0; g->grad && id < g->n_forward; id++)
        if (g->nodes[id].op == OP_PARAM && g->grad[id] >= 0)
            p->params[p->nparams++] = (ProgParam){ p->node_buf[id], p->node_buf[g->grad[id]] };
}

/* Scratch buffers (im2col columns, transposed gradients) are not IR tensors,
   whose sizes the builders check: held to the same limit, so that every
   count fits an int and a plan of up to 2^20 examples fits a size_t. 0, or -1 said. */
static int check_sizes(const Graph *g, const Program *p)
{
    for (int b = 0; b < p->nbufs; b++) {
        if (p->bufs[b].size.c <= INT_MAX) continue;
        const Buf *B = &p->bufs[b];
        Loc at = B->node >= 0 ? g->nodes[B->node].loc : (Loc){ 0 };
        diag_at(g->diag, at, "%s: its %s would hold %ld floats%s (more than %d); make the layer or its input smaller",
                B->node >= 0 ? ir_op_name(g->nodes[B->node].op) : "a step", B->name ? B->name : "buffer", B->size.c,
                B->size.batch ? " per example" : "", INT_MAX);
        return -1;
    }
    return 0;
}

int cg_lower(const Graph *g, Arena *a, const CgDecisions *dec, Program *p)
{
    CgDecisions own;
    if (!dec) {   /* the passes with their defaults: fusion on, strategies chosen per layer */
        static const CgOptions defaults = { .fuse = true, .conv = -1 };
        cg_decisions_init(&own, g, a);
        cg_fuse(g, &defaults, &own);
        cg_choose_convs(g, &defaults, &own);
        dec = &own;
    }
    memset(p, 0, sizeof *p);
    p->arena = a;
    p->graph = g;
    p->node_buf = arena_alloc(a, sizeof(int) * (size_t)g->n);
    for (int id = 0; id < g->n; id++) p->node_buf[id] = -1;
    CgDecisions *kept = arena_alloc(a, sizeof *kept);   /* dec may be the caller's, or own above: the program's outlives both */
    *kept = *dec;
    p->decided = kept;
    p->control = -1;
    p->opt_scalars = -1;
    p->accumulate = -1;
    Lower L = { .g = g, .p = p, .dec = dec, .open_kernel = -1 };
    lower_init(&L, a);
    char *text = NULL;
    size_t len = 0;
    L.src = open_memstream(&text, &len);
    if (!L.src) return -1;
    cg_dp_prepare(&L);
    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        cg_dp_before(&L, id);
        int into = cg_fused_into(dec, id);
        if (into >= 0 && n->op != OP_SGD) {
            /* computed by the kernel of the node it was fused into: in its buffer,
               or in one of its own that kernel made (a fused bias gradient) */
            if (p->node_buf[id] < 0) p->node_buf[id] = p->node_buf[into];
        } else if (n->op < OP_COUNT) {
            L.node_now = id;
            lowerings[n->op](&L, id);
        }
        cg_dp_after(&L, id);
    }
    cg_dp_finish(&L);
    fclose(L.src);
    p->source = arena_strndup(a, text, len);
    free(text);
    cg_share_kernels(p);
    if (check_sizes(g, p)) return -1;
    lower_finish(&L, a);
    return 0;
}
