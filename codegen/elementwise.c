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
static const struct { const char *fwd, *bwd; bool reads_y; } activations[OP_COUNT] = {
#define ACT(e, name, at, reads, f, b) [OP_##e] = { f, b, #reads[0] == 'Y' }, [OP_##e##_BWD] = { f, b, #reads[0] == 'Y' },
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
        e = arena_printf(L->p->arena, "%.*s%#.9gf%s", (int)(at - e), e, (double)n->attr.name, at + strlen(tag));
#include "attrs.def"
#undef ATTR
    return e;
}

/* The value v through node id's fused activation (d->act), as an expression:
   v itself when there is none; ReLU's text as it always was (a comment after it). */
const char *cg_fused_act(Lower *L, int id, const char *v)
{
    int act = L->dec->node[id].act;
    if (act < 0) return v;
    if (act == OP_RELU) return arena_printf(L->p->arena, "%s > 0.0f ? %s : 0.0f   /* fused relu */", v, v);
    const char *e = activations[act].fwd, *at;
    const char *paren = arena_printf(L->p->arena, "(%s)", v);
    while ((at = strstr(e, "x[i]"))) e = arena_printf(L->p->arena, "%.*s%s%s", (int)(at - e), e, paren, at + 4);
    return e;
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

/* dx = dy * f'(x), written with the forward's output y or its input x */
void cg_lower_activation_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    const char *W = cg_work_str(L, work);
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    cg_kernel(L, id, ir_op_name(n->op), work, 3, b, (const char *const[]){ "=dx", activations[n->op].reads_y ? "y" : "x", "dy" });
    cg_body(L, "    FOR_EACH(i, %s) {\n        dx[i] = %s;\n    }\n", W, with_attrs(L, activations[n->op].bwd, n));
    cg_end_kernel(L);
}

/* y = lhs + rhs, y = lhs * rhs (same shapes); an add may normalise one input
   itself (a fused BatchNorm apply, dec->bn_into_add), one (n, c) plane per iteration */
void cg_lower_binary(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int bn = L->dec->node[id].bn_into_add;
    if (bn >= 0) {
        const Node *bnn = &L->g->nodes[bn];
        int C = n->shape.d[1], HW = n->shape.d[2] * n->shape.d[3];
        int other = n->in[0] == bn ? n->in[1] : n->in[0];
        int b[6] = { cg_out_buf(L, id), buf_of(L, bnn->in[0]), buf_of(L, bnn->in[1]), buf_of(L, bnn->in[2]), buf_of(L, bnn->in[3]),
                     buf_of(L, other) };
        cg_kernel(L, id, "bn_apply_add", dimn(C), 6, b, (const char *const[]){ "=y", "x", "stats", "gamma", "beta", "skip" })->grain = HW;
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
    Dim work = dim_of(&n->shape);
    const char *W = cg_work_str(L, work);
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    cg_kernel(L, id, ir_op_name(n->op), work, 3, b, (const char *const[]){ "=y", "lhs", "rhs" });
    char op = n->op == OP_ADD ? '+' : n->op == OP_SUB ? '-' : '*';
    const Shape *ls = &L->g->nodes[n->in[0]].shape, *rs = &L->g->nodes[n->in[1]].shape;
    if (L->dec->node[id].act >= 0)   /* only add: the fusion pass fuses no activation into mul or sub */
        cg_body(L, "    FOR_EACH(i, %s) {\n        float v = lhs[i] + rhs[i];\n        y[i] = %s\n    }\n", W,
                L->dec->node[id].act == OP_RELU ? "v > 0.0f ? v : 0.0f;   /* fused relu */"
                                                : arena_printf(L->p->arena, "%s;   /* fused %s */", cg_fused_act(L, id, "v"),
                                                               ir_op_name((Op)L->dec->node[id].act)));
    else if (ir_shape_eq(ls, &n->shape) && ir_shape_eq(rs, &n->shape))
        cg_body(L, "    FOR_EACH(i, %s) {\n        y[i] = lhs[i] %c rhs[i];\n    }\n", W, op);
    else {   /* broadcast: each input's index from the output's coordinates */
        cg_body(L, "    /* y %s = lhs %s %c rhs %s, broadcast */\n", ir_shape_str(L->p->arena, &n->shape), ir_shape_str(L->p->arena, ls), op,
                ir_shape_str(L->p->arena, rs));
        cg_body(L, "    FOR_EACH(i, %s) {\n", W);
        cg_coords(L, &n->shape, "i");
        cg_body(L, "        y[i] = lhs[%s] %c rhs[%s];\n    }\n", cg_index_of(L, ls), op, cg_index_of(L, rs));
    }
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

/* x -> y, the shape given: each y summed over the x it broadcast to (the dimensions y has as 1);
   one y per iteration, in double */
void cg_lower_sum_to(Lower *L, int id)
{
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
        if (ys->d[k] == 1 && xs->d[k] != 1) cg_body(L, "        for (long c%d = 0; c%d < %d; c%d++)\n", k, k, xs->d[k], k);
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
    cg_body(L, "    FOR_EACH(i, %s) {\n        y[i] = %#.9gf;\n    }\n", W, n->attr.value);
    cg_end_kernel(L);
}

/* mask[i] = 0 with probability p, else 1/(1-p); a fresh seed each run */
void cg_lower_dropout_mask(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    const char *W = cg_work_str(L, work);
    int y = cg_out_buf(L, id);
    Step *s = cg_kernel(L, id, "dropout_mask", work, 1, &y, (const char *const[]){ "=mask" });
    s->seeded = true;
    cg_body(L, "    /* counted from the global batch's first example: the same masks on any number of replicas */\n"
               "    FOR_EACH(i, %s) {\n        mask[i] = mgc_uniform(a.seed, (unsigned long long)(a.first * %ldL + i)) >= %#.9gf ? %#.9gf : 0.0f;\n    }\n",
            W, work.c, n->attr.p, 1.0 / (1.0 - n->attr.p));
    cg_end_kernel(L);
}
