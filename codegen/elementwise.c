/*
** Element-wise kernels and their gradients: the activations (their
** expressions are ir/activations.def's), add, mul, constants and the
** dropout mask. Every tensor is a flat array of the node's
** elements (any shape, N examples when batch-sized); one element per
** iteration of FOR_EACH. Gradients overwrite dx (they do not accumulate).
*/
#include "lower_internal.h"
#include <stdio.h>
#include <string.h>

/* The activations' expressions (ir/activations.def), by op: the forward's
   and the gradient's, and whether the gradient reads y (else x). */
static const struct { const char *fwd, *bwd, *vec; bool reads_y; } activations[OP_COUNT] = {
#define ACT(e, name, at, reads, f, b, v) [OP_##e] = { f, b, v, #reads[0] == 'Y' }, [OP_##e##_BWD] = { f, b, v, #reads[0] == 'Y' },
#include "activations.def"
#undef ACT
};

/* An expression with its float attributes' literals in place of {name} ({slope}, {alpha}). */
static const char *with_attrs(Lower *L, const char *e, const Node *n)
{
    char tag[40];
    const char *at;
#define ATTR(name, type, label, shown) \
    snprintf(tag, sizeof tag, "{%s}", #name); \
    while (!strcmp(#type, "float") && (at = strstr(e, tag))) \
        e = arena_printf(L->p->arena, "%.*s%s%s", (int)(at - e), e, cg_f32(L, (double)n->attr.name), at + strlen(tag));
#include "attrs.def"
#undef ATTR
    return e;
}

/* The value v through node id's fused activation (cg_act), as an expression:
   v itself when there is none; ReLU's text as it always was (a comment after it). */
const char *cg_fused_act(Lower *L, int id, const char *v)
{
    int act = cg_act(L->dec, id);
    if (act < 0) return v;
    if (act == OP_RELU) return arena_printf(L->p->arena, "%s > 0.0f ? %s : 0.0f   /* fused relu */", v, v);
    const char *e = with_attrs(L, activations[act].fwd, &L->g->nodes[cg_act_node(L->dec, id)]), *at;
    const char *paren = arena_printf(L->p->arena, "(%s)", v);
    while ((at = strstr(e, "x[i]"))) e = arena_printf(L->p->arena, "%.*s%s%s", (int)(at - e), e, paren, at + 4);
    return e;
}

/* Node id's store (cg_store) as a vector form of v (an mgc_f16, ir/activations.def's third expression):
   "v" with no fused activation; NULL where the store is more than the activation (stored beside its
   input) or the activation has no vector form. */
const char *cg_store_vec(Lower *L, int id)
{
    int act = cg_act(L->dec, id);
    if (act < 0) return "v";
    if (cg_act_beside(L->dec, id) >= 0 || !*activations[act].vec) return NULL;
    return with_attrs(L, activations[act].vec, &L->g->nodes[cg_act_node(L->dec, id)]);
}

/* e with every `from` replaced by `to`. */
static const char *replace_all(Lower *L, const char *e, const char *from, const char *to)
{
    for (const char *at; (at = strstr(e, from));)
        e = arena_printf(L->p->arena, "%.*s%s%s", (int)(at - e), e, to, at + strlen(from));
    return e;
}

/* The declaration of channel c's (C text) BatchNorm scale and shift, named scale and shift,
   from stats, gamma and beta: bn_apply's multiply-add's two operands (y = x * scale + shift),
   for bn_apply, the add that normalises its input, and the BatchNorm gradient that recomputes
   an activation's input: one text, so that all three round the same way. */
static const char *scale_shift_decl(Lower *L, int C, const char *c, const char *scale, const char *shift)
{
    return arena_printf(L->p->arena, "float %s = stats[%d + %s] * gamma[%s], %s = beta[%s] - stats[%s] * %s;",
                        scale, C, c, c, shift, c, c, scale);
}

const char *cg_bn_grad_act_scale(Lower *L, int C, const char *c)
{
    return arena_printf(L->p->arena, "const %s", scale_shift_decl(L, C, c, "sc_", "sh_"));
}

const char *cg_act_grad_expr(Lower *L, int ga, const char *dy, const char *v)
{
    const Node *gn = &L->g->nodes[ga];
    const char *e = replace_all(L, with_attrs(L, activations[gn->op].bwd, gn), "dy[i]", dy);
    return replace_all(L, e, activations[gn->op].reads_y ? "y[i]" : "x[i]", v);
}

/* Whether activation gradient op's expression reads the value it names (x[i] or y[i]):
   scale's, dy * factor, reads neither. */
static bool grad_reads_value(Op op)
{
    const char *e = activations[op].bwd, *v = activations[op].reads_y ? "y[i]" : "x[i]";
    for (const char *at = strstr(e, v); at; at = strstr(at + 1, v))
        if (at == e || at[-1] != 'd') return true;   /* not dy[i] */
    return false;
}

const char *cg_bn_grad_act_text(Lower *L, int id, const char *x, const char *dy, const char *dg)
{
    int ga = cg_bn_grad_act(L->dec, id);
    const Node *gn = &L->g->nodes[ga];
    const char *y = "";
    if (!grad_reads_value(gn->op)) y = " (void)p_;";   /* scale's dy * factor reads no value */
    else if (activations[gn->op].reads_y)
        y = arena_printf(L->p->arena, " const float y_ = %s;", replace_all(L, with_attrs(L, activations[gn->op].fwd, gn), "x[i]", "p_"));
    return arena_printf(L->p->arena, "const float p_ = %s * sc_ + sh_, dy_ = %s;%s const float g_ = %s; %s = g_;", x, dy, y,
                        cg_act_grad_expr(L, ga, "dy_", activations[gn->op].reads_y ? "y_" : "p_"), dg);
}

/* y = f(x): an activation's kernel, one element per iteration */
void cg_lower_activation(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    const char *W = cg_work_str(L, work);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, ir_op_name(n->op), work, 2, b, (const char *const[]){ "=y", "x" });
    cg_body(L, "    FOR_EACH(i, %s) {\n        y[i] = %s;\n    }\n", W, with_attrs(L, activations[n->op].fwd, n));
    cg_end_kernel(L);
}

/* dx = dy * f'(x), written with the forward's output y or its input x (neither where
   the expression reads neither: the kernel takes dx and dy alone) */
void cg_lower_activation_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    const char *W = cg_work_str(L, work);
    if (grad_reads_value(n->op)) {
        int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
        cg_kernel(L, id, ir_op_name(n->op), work, 3, b, (const char *const[]){ "=dx", activations[n->op].reads_y ? "y" : "x", "dy" });
    } else {
        int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[1]) };
        cg_kernel(L, id, ir_op_name(n->op), work, 2, b, (const char *const[]){ "=dx", "dy" });
    }
    cg_body(L, "    FOR_EACH(i, %s) {\n        dx[i] = %s;\n    }\n", W, with_attrs(L, activations[n->op].bwd, n));
    cg_end_kernel(L);
}

const char *cg_store(Lower *L, int id, const char *ptr, const char *idx, const char *val)
{
    Arena *a = L->p->arena;
    if (cg_act(L->dec, id) < 0) return arena_printf(a, "%s[%s] = %s;", ptr, idx, val);
    if (cg_act_beside(L->dec, id) < 0) return arena_printf(a, "%s[%s] = %s;", ptr, idx, cg_fused_act(L, id, val));
    const char *at = strcmp(ptr, "y") ? arena_printf(a, "%s - y + %s", ptr, idx) : idx;
    const char *note = arena_printf(a, "   /* fused %s, stored beside its input */", ir_op_name((Op)cg_act(L->dec, id)));
    bool plain = strspn(val, "abcdefghijklmnopqrstuvwxyz_0123456789") == strlen(val);   /* a variable: no temporary */
    if (plain) return arena_printf(a, "%s[%s] = %s; ya[%s] = %s;%s", ptr, idx, val, at, cg_fused_act(L, id, val), note);
    const char *keep = strcmp(val, arena_printf(a, "%s[%s]", ptr, idx)) ? arena_printf(a, " %s[%s] = v_;", ptr, idx) : "";
    return arena_printf(a, "{ const float v_ = %s;%s ya[%s] = %s; }%s", val, keep, at, cg_fused_act(L, id, "v_"), note);
}

/* In a loop over (n, c) planes: c, and the normalisation of channel c as one
   multiply-add, y = x * scale + shift (the add that applies a BatchNorm itself,
   below, and bn_apply, norm.c: scale_shift_decl's arithmetic). */
const char *cg_bn_scale_shift_text(Lower *L, int C, const char *plane)
{
    return arena_printf(L->p->arena, "        long c = %s %% %d;\n        %s\n", plane, C, scale_shift_decl(L, C, "c", "scale", "shift"));
}

void cg_bn_scale_shift(Lower *L, int C)
{
    cg_body(L, "%s", cg_bn_scale_shift_text(L, C, "plane"));
}

#define DROPOUT_SEED_KEY (1ULL << 49)   /* above any step's index and attention's keys (codegen/attention.c) */

/* Dropout mask m's element at idx (its index in the step's part of the batch) as an expression:
   0 with probability p, else 1/(1-p), of the run's seed, the mask's key (mask_key) and the
   element's index in the global batch: the same masks on any number of replicas, wherever made. */
static const char *mask_value(Lower *L, int m, const char *idx)
{
    const Node *n = &L->g->nodes[m];
    return arena_printf(L->p->arena, "(mgc_uniform(a.seed, (unsigned long long)(a.first * %ldL + %s)) >= %s ? %s : 0.0f)",
                        dim_of(&n->shape).c, idx, cg_f32(L, n->attr.p), cg_f32(L, 1.0 / (1.0 - n->attr.p)));
}

/* The seed key of mask m: its place among the net's masks (the same whichever step makes it) */
static unsigned long long mask_key(const Lower *L, int m)
{
    return DROPOUT_SEED_KEY + (unsigned long long)cg_op_place(L->g, m, OP_DROPOUT_MASK);
}

/* Node in of a kernel read at idx: its buffer (named name, appended to a), or a dropout mask made
   there (cg_mask_inline; *mask set to it) */
static const char *read_at(Lower *L, int in, const char *name, const char *idx, CgArgs *a, int *mask)
{
    if (cg_mask_inline(L->dec, in)) {
        *mask = in;
        return mask_value(L, in, idx);
    }
    cg_arg(L, a, buf_of(L, in), "%s", name);
    return arena_printf(L->p->arena, "%s[%s]", name, idx);
}

/* Node in's operand of an add's, mul's or sub's kernel as an expression: a
   buffer (named name) or, fused into the add (cg_ew_into_add), a product or
   difference of two (named name_l and name_r), each read at its index: idx(shape)
   gives it. Appends the buffers to a; a dropout mask made as it is read sets *mask. */
typedef const char *(*IndexOf)(Lower *L, const Shape *s, const Shape *out);
static const char *operand(Lower *L, int id, int in, const char *name, IndexOf idx, CgArgs *a, int *mask)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    if (in != cg_ew_into_add(L->dec, id)) return read_at(L, in, name, idx(L, &g->nodes[in].shape, &n->shape), a, mask);
    const Node *e = &g->nodes[in];
    const char *side[2];
    for (int k = 0; k < 2; k++)
        side[k] = read_at(L, e->in[k], arena_printf(L->p->arena, "%s_%c", name, k ? 'r' : 'l'),
                          idx(L, &g->nodes[e->in[k]].shape, &n->shape), a, mask);
    return arena_printf(L->p->arena, "(%s %c %s)", side[0], e->op == OP_MUL ? '*' : '-', side[1]);
}

/* A kernel that makes dropout mask m as it reads (m >= 0): seeded with the mask's key */
static void seed_by_mask(Lower *L, Step *s, int m)
{
    if (m < 0) return;
    s->seeded = true;
    s->seed_key = mask_key(L, m);
}

/* Indices: the flat loop's (i, or from its coordinates where s broadcasts), and a plane loop's
   (cg_plane_indexable: plane = n * C + c, k the position). */
static const char *flat_index(Lower *L, const Shape *s, const Shape *out)
{
    return ir_shape_eq(s, out) ? "i" : cg_index_of(L, s);
}

static const char *plane_index(Lower *L, const Shape *s, const Shape *out)
{
    int C = out->d[1], HW = out->d[2] * out->d[3];
    if (ir_shape_eq(s, out)) return arena_printf(L->p->arena, "plane * %d + k", HW);
    const char *nn = s->d[0] == 1 ? "0" : arena_printf(L->p->arena, "plane / %d", C);
    const char *cc = s->d[1] == 1 ? "0" : arena_printf(L->p->arena, "c");
    long shw = (long)s->d[2] * s->d[3];
    return arena_printf(L->p->arena, "((%s) * %d + %s) * %ld%s", nn, s->d[1], cc, shw, shw == 1 ? "" : " + k");
}

/* y = lhs + rhs, y = lhs * rhs, y = lhs - rhs (PyTorch's broadcasting); an add may
   normalise one input itself (a fused BatchNorm apply, cg_bn_into_add), one (n, c)
   plane per iteration, and compute the product or difference that is the other
   (cg_ew_into_add) as it reads; an activation may follow (cg_act, cg_act_beside) */
void cg_lower_binary(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int bn = cg_bn_into_add(L->dec, id), ew = cg_ew_into_add(L->dec, id), act = cg_act(L->dec, id), beside = cg_act_beside(L->dec, id);
    char op = n->op == OP_ADD ? '+' : n->op == OP_SUB ? '-' : '*';
    CgArgs a = { 0 };
    int y = cg_out_buf(L, id);
    cg_arg(L, &a, y, "=y");
    if (beside >= 0) cg_arg(L, &a, cg_out_buf(L, beside), "=ya");
    int other = bn < 0 ? -1 : n->in[0] == bn ? n->in[1] : n->in[0], mask = -1;
    bool inline_mask = cg_mask_inline(L->dec, n->in[0]) || cg_mask_inline(L->dec, n->in[1]);
    if (bn >= 0 && beside < 0 && ew < 0 && !inline_mask && L->dec->cpu_only && ir_shape_eq(&L->g->nodes[other].shape, &n->shape)) {
        const Node *bnn = &L->g->nodes[bn];
        int C = n->shape.d[1], HW = n->shape.d[2] * n->shape.d[3];
        int b6[6] = { y, buf_of(L, bnn->in[0]), buf_of(L, bnn->in[1]), buf_of(L, bnn->in[2]), buf_of(L, bnn->in[3]),
                      buf_of(L, other) };
        cg_kernel(L, id, "bn_apply_add", dimn(C), 6, b6, (const char *const[]){ "=y", "x", "stats", "gamma", "beta", "skip" })->grain = HW;
        cg_body(L, "    /* y = (x - mean) * invstd * gamma + beta (the fused BatchNorm) + skip; planes [N*%d, %d] */\n", C, HW);
        cg_body(L, "    FOR_EACH(plane, %s) {\n", cg_work_str(L, dimn(C)));
        cg_bn_scale_shift(L, C);
        cg_body(L, "        const float *xp = x + plane * %d, *sp = skip + plane * %d;\n"
                   "        float *yp = y + plane * %d;\n"
                   "        for (int k = 0; k < %d; k++) { float v = (xp[k] * scale + shift) + sp[k]; yp[k] = %s; }\n"
                   "    }\n",
                HW, HW, HW, HW, cg_fused_act(L, id, "v"));
        cg_end_kernel(L);
        return;
    }
    if (bn >= 0) {   /* the same with a product or difference for the other input, or the activation stored beside; or on GPUs */
        const Node *bnn = &L->g->nodes[bn];
        int C = n->shape.d[1], HW = n->shape.d[2] * n->shape.d[3];
        for (int k = 0; k < 4; k++) cg_arg(L, &a, buf_of(L, bnn->in[k]), "%s", (const char *[]){ "x", "stats", "gamma", "beta" }[k]);
        const char *skip = operand(L, id, other, "skip", plane_index, &a, &mask);
        const char *what = ew >= 0 ? arena_printf(L->p->arena, "bn_apply_add_%s", ir_op_name(L->g->nodes[ew].op))
                                   : "bn_apply_add";
        const char *stmt = arena_printf(L->p->arena, "{ float v = (x[plane * %d + k] * scale + shift) + %s; %s }", HW, skip,
                                        cg_store(L, id, "y", arena_printf(L->p->arena, "plane * %d + k", HW), "v"));
        if (!L->dec->cpu_only) {   /* GPUs: an element per thread (cg_rows_body) */
            seed_by_mask(L, cg_kernel_args(L, id, what, cg_rows_work(dimn(C), HW), &a), mask);
            cg_body(L, "    /* y = (x - mean) * invstd * gamma + beta (the fused BatchNorm) + %s; one element per iteration, planes [N*%d, %d] */\n",
                    skip, C, HW);
            cg_rows_body(L, dimn(C), HW,
                         arena_printf(L->p->arena, "        long plane = row;\n        int k = at;\n%s", cg_bn_scale_shift_text(L, C, "plane")), stmt);
            cg_end_kernel(L);
            return;
        }
        Step *st = cg_kernel_args(L, id, what, dimn(C), &a);
        st->grain = HW;
        seed_by_mask(L, st, mask);
        cg_body(L, "    /* y = (x - mean) * invstd * gamma + beta (the fused BatchNorm) + %s; planes [N*%d, %d] */\n", skip, C, HW);
        cg_body(L, "    FOR_EACH(plane, %s) {\n", cg_work_str(L, dimn(C)));
        cg_bn_scale_shift(L, C);
        cg_body(L, "        for (int k = 0; k < %d; k++) %s\n    }\n", HW, stmt);
        cg_end_kernel(L);
        return;
    }
    Dim work = dim_of(&n->shape);
    const char *W = cg_work_str(L, work);
    const Shape *ls = &L->g->nodes[n->in[0]].shape, *rs = &L->g->nodes[n->in[1]].shape;
    bool same = ir_shape_eq(ls, &n->shape) && ir_shape_eq(rs, &n->shape);
    if (beside < 0 && ew < 0 && !same && act < 0 && !inline_mask) {   /* broadcast: each input's index from the output's coordinates */
        int b3[3] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
        cg_kernel(L, id, ir_op_name(n->op), work, 3, b3, (const char *const[]){ "=y", "lhs", "rhs" });
        cg_body(L, "    /* y %s = lhs %s %c rhs %s, broadcast */\n", ir_shape_str(L->p->arena, &n->shape), ir_shape_str(L->p->arena, ls), op,
                ir_shape_str(L->p->arena, rs));
        cg_body(L, "    FOR_EACH(i, %s) {\n", W);
        cg_coords(L, &n->shape, "i");
        cg_body(L, "        y[i] = lhs[%s] %c rhs[%s];\n    }\n", cg_index_of(L, ls), op, cg_index_of(L, rs));
        cg_end_kernel(L);
        return;
    }
    if (beside < 0 && ew < 0 && same && (act < 0 || n->op == OP_ADD) && !inline_mask) {
        int b3[3] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
        cg_kernel(L, id, ir_op_name(n->op), work, 3, b3, (const char *const[]){ "=y", "lhs", "rhs" });
        if (act >= 0)
            cg_body(L, "    FOR_EACH(i, %s) {\n        float v = lhs[i] + rhs[i];\n        y[i] = %s\n    }\n", W,
                    act == OP_RELU ? "v > 0.0f ? v : 0.0f;   /* fused relu */"
                                   : arena_printf(L->p->arena, "%s;   /* fused %s */", cg_fused_act(L, id, "v"), ir_op_name((Op)act)));
        else
            cg_body(L, "    FOR_EACH(i, %s) {\n        y[i] = lhs[i] %c rhs[i];\n    }\n", W, op);
        cg_end_kernel(L);
        return;
    }
    /* broadcast, a product or difference fused in, or an activation after a mul or sub, or stored beside:
       each operand's index from the output's coordinates where its shape differs */
    const char *lhs = operand(L, id, n->in[0], "lhs", flat_index, &a, &mask);
    const char *rhs = operand(L, id, n->in[1], "rhs", flat_index, &a, &mask);
    const char *what = ew >= 0 ? arena_printf(L->p->arena, "%s_%s", ir_op_name(L->g->nodes[ew].op), ir_op_name(n->op)) : ir_op_name(n->op);
    seed_by_mask(L, cg_kernel_args(L, id, mask >= 0 ? arena_printf(L->p->arena, "%s_dropout", what) : what, work, &a), mask);
    cg_body(L, "    /* y %s = %s %c %s%s */\n", ir_shape_str(L->p->arena, &n->shape), lhs, op, rhs, same ? "" : ", broadcast");
    cg_body(L, "    FOR_EACH(i, %s) {\n", W);
    bool coords = !same;
    for (int k = 0; ew >= 0 && k < 2; k++) coords |= !ir_shape_eq(&L->g->nodes[L->g->nodes[ew].in[k]].shape, &n->shape);
    if (coords) cg_coords(L, &n->shape, "i");
    cg_body(L, "        float v = %s %c %s;\n        %s\n    }\n", lhs, op, rhs, cg_store(L, id, "y", "i", "v"));
    cg_end_kernel(L);
}

/* y = -x */
void cg_lower_neg(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "neg", work, 2, b, (const char *const[]){ "=y", "x" });
    cg_body(L, "    FOR_EACH(i, %s) {\n        y[i] = -x[i];\n    }\n", cg_work_str(L, work));
    cg_end_kernel(L);
}

/* Whether sum_to sums x [xs] over dimension k to make y [ys] (over the batch too: a param's gradient, [1, ...]) */
static bool summed_dim(const Shape *xs, const Shape *ys, int k) { return ys->d[k] == 1 && xs->d[k] != 1; }

/* Where y is x after a run of leading 1s (x summed over its first *lead dimensions, the rest
   kept): the product O of the kept ones (at most 2^24); else 0 */
static long summed_lead(const Shape *xs, const Shape *ys, int *lead)
{
    int k = 0;
    while (k < ys->nd && ys->d[k] == 1) k++;
    *lead = k;
    if (k == 0 || k == ys->nd) return 0;
    long O = 1;
    for (; k < ys->nd; k++) {
        if (ys->d[k] != xs->d[k]) return 0;
        O *= ys->d[k];
    }
    return O > (1L << 24) ? 0 : O;
}

/* CPUs: x [rows, O] summed over its rows into y [1, .., 1, O] (a linear layer's bias gradient over
   [N, T, O]; a learned [1, T, D] tensor's gradient over the batch, O = T * D): y's dimensions
   those of x after a run of leading 1s. 16 columns an iteration, the rows in order (each column's
   sum as the general loop's), reading a row's 16 floats at once where the general loop strides O */
static bool sum_rows(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape, *ys = &n->shape;
    int lead;
    long O = summed_lead(xs, ys, &lead);
    if (!L->dec->cpu_only || O < 16) return false;   /* GPUs: sum_slices, or a thread a y */
    Dim rows = dim_of(xs);
    rows.c /= O;
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "sum_to", dimc((O + 15) / 16), 2, b, (const char *const[]){ "=y", "x" });
    cg_body(L, "    /* x %s summed over its %s rows of %ld, to y %s; 16 columns an iteration */\n",
            ir_shape_str(L->p->arena, xs), cg_work_str(L, rows), O, ir_shape_str(L->p->arena, ys));
    /* w is 16 in every block but a last, narrower one: its bound a constant where O divides, so the
       compiler makes the 16 sums four vectors of doubles (the same additions, in the same order) */
    const char *w = O % 16 == 0 ? "16" : arena_printf(L->p->arena, "(%ld - o0 < 16 ? (int)(%ld - o0) : 16)", O, O);
    cg_body(L, "    FOR_EACH(blk, %ldL) {\n"
               "        const long o0 = blk * 16;\n"
               "        const int w = %s;\n"
               "        double s[16];\n"
               "        for (int t = 0; t < 16; t++) s[t] = 0.0;\n"
               "        for (long r = 0; r < %s; r++) {\n"
               "            const float *xr = x + r * %ldL + o0;\n"
               "            for (int t = 0; t < w; t++) s[t] += xr[t];\n"
               "        }\n"
               "        for (int t = 0; t < w; t++) y[o0 + t] = (float)s[t];\n    }\n",
            (O + 15) / 16, w, cg_work_str(L, rows), O);
    cg_end_kernel(L);
    return true;
}

/* GPUs, x [N, R.., O..] summed to y [1, .., 1, O..] (a bias gradient over tokens, a learned
   tensor's over the batch): S slices of the batch per column, a block each, its threads over the
   slice's N * R rows; each column's S partial sums added in order by its last block. (Sixteen
   columns a thread, every row alone, ran the ViT's bias gradients on 8 or 16 threads.) */
static bool sum_slices(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape, *ys = &n->shape;
    int lead;
    long O = summed_lead(xs, ys, &lead), R = 1;
    if (L->dec->cpu_only || xs->d[0] != IR_BATCH || O == 0) return false;
    for (int k = 1; k < lead; k++) R *= xs->d[k];
    int S = cg_batch_slices(L, (int)O);
    CgArgs in = { 0 };
    cg_arg(L, &in, cg_out_buf(L, id), "=y");
    cg_arg(L, &in, buf_of(L, n->in[0]), "x");
    cg_slices_kernel(L, id, "sum_to_slices", (int)O, S, 1, &in,
                     arena_printf(L->p->arena, "    /* x %s summed to y %s: x as [N * %ld rows, %ld]; part[s * %ld + c] = slice s's (of %d) "
                                               "sum of column c; y[c] the slices' sums */\n",
                                  ir_shape_str(L->p->arena, xs), ir_shape_str(L->p->arena, ys), R, O, O, S));
    cg_text(L, "        float acc = 0.0f;\n"
               "        BLOCK_LOOP(k, (n1 - n0) * ${R}L) acc += x[(n0 * ${R}L + k) * ${O}L + c];\n"
               "        acc = BLOCK_SUM(acc);\n"
               "        if (BLOCK_LEADER) part[i] = acc;\n", cg_n("R", R), cg_n("O", O));
    cg_slices_combine(L, S, cg_str(L, "            float sum = 0.0f;\n"
                                      "            for (long k = 0; k < $S; k++) sum += part[k * ${O}L + c];\n"
                                      "            y[c] = sum;\n", cg_n("S", S), cg_n("O", O)));
    cg_end_kernel(L);
    return true;
}

/* x -> y, the shape given: each y summed over the x it broadcast to (the dimensions y has as 1);
   one y per iteration, in double (or sum_slices, sum_rows) */
/* GPUs, each y a sum of at least a block's worth of x (an SE gate's gradient, [N, C, 28, 28] to
   [N, C, 1, 1]): a block a y, its threads over the summed elements (a thread a y left 16 blocks
   of threads on SE-ResNet's [N, 16, 1, 1], 88 us of an H200's step by the model). */
static bool sum_blocks(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape, *ys = &n->shape;
    Dim per = { 1, false };   /* the elements each y sums */
    for (int k = 0; k < xs->nd; k++)
        if (summed_dim(xs, ys, k)) {
            if (xs->d[k] == IR_BATCH) per.batch = true;
            else per.c *= xs->d[k];
        }
    if (L->dec->cpu_only || (!per.batch && per.c < 256)) return false;
    Dim work = dim_of(ys);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    Step *st = cg_kernel(L, id, "sum_to", work, 2, b, (const char *const[]){ "=y", "x" });
    st->heavy = st->blocks = true;
    cg_body(L, "    /* x %s summed to y %s: a block a y, its threads over the %s elements it sums */\n"
               "    FOR_EACH_BLOCK(i, %s) {\n", ir_shape_str(L->p->arena, xs), ir_shape_str(L->p->arena, ys), cg_work_str(L, per),
            cg_work_str(L, work));
    cg_coords(L, ys, "i");
    cg_body(L, "        double s = 0.0;\n        BLOCK_LOOP(j, %s) {\n            long q_ = j;\n", cg_work_str(L, per));
    for (int k = xs->nd - 1; k >= 0; k--)   /* the summed dimensions' coordinates from j, the last fastest */
        if (summed_dim(xs, ys, k)) {
            if (xs->d[k] == IR_BATCH) cg_body(L, "            const long c%d = q_;\n", k);
            else cg_body(L, "            const long c%d = q_ %% %d; q_ /= %d;\n", k, xs->d[k], xs->d[k]);
        }
    cg_body(L, "            (void)q_;\n            s += x[%s];\n        }\n        s = BLOCK_SUM(s);\n"
               "        if (BLOCK_LEADER) y[i] = (float)s;\n    }\n", cg_index_of(L, xs));
    cg_end_kernel(L);
    return true;
}

void cg_lower_sum_to(Lower *L, int id)
{
    if (sum_slices(L, id) || sum_rows(L, id) || sum_blocks(L, id)) return;
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape, *ys = &n->shape;
    Dim work = dim_of(ys);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "sum_to", work, 2, b, (const char *const[]){ "=y", "x" });
    cg_body(L, "    /* x %s summed to y %s */\n    FOR_EACH(i, %s) {\n", ir_shape_str(L->p->arena, xs), ir_shape_str(L->p->arena, ys),
            cg_work_str(L, work));
    cg_coords(L, ys, "i");
    cg_body(L, "        double s = 0.0;\n");
    for (int k = 0; k < xs->nd; k++)   /* the dimensions summed over: a loop each, the others at y's coordinate */
        if (summed_dim(xs, ys, k))
            cg_body(L, "        for (long c%d = 0; c%d < %s; c%d++)\n", k, k,
                    xs->d[k] == IR_BATCH ? "N" : arena_printf(L->p->arena, "%d", xs->d[k]), k);
    cg_body(L, "        s += x[%s];\n        y[i] = (float)s;\n    }\n", cg_index_of(L, xs));
    cg_end_kernel(L);
}

/* y[i] = f[0] (the loss seed) */
void cg_lower_const(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    const char *W = cg_work_str(L, work);
    int y = cg_out_buf(L, id);
    cg_kernel(L, id, "const", work, 1, &y, (const char *const[]){ "=y" });
    cg_body(L, "    FOR_EACH(i, %s) {\n        y[i] = %s;\n    }\n", W, cg_f32(L, n->attr.value));
    cg_end_kernel(L);
}

/* mask[i] = 0 with probability p, else 1/(1-p); a fresh seed each run */
void cg_lower_dropout_mask(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    const char *W = cg_work_str(L, work);
    int y = cg_out_buf(L, id);
    seed_by_mask(L, cg_kernel(L, id, "dropout_mask", work, 1, &y, (const char *const[]){ "=mask" }), id);
    cg_body(L, "    /* counted from the global batch's first example: the same masks on any number of replicas */\n"
               "    FOR_EACH(i, %s) {\n        mask[i] = %s;\n    }\n", W, mask_value(L, id, "i"));
    cg_end_kernel(L);
}
