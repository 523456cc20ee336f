/*
** The IR verifier, run by the pipeline after every pass. Every node: a
** valid op; an input count within the op table's bounds (ir/ops.def); inputs
** that are earlier nodes; dimensions positive (dim 0 may be N); and the
** shape its op's rule gives (ir/shape.c) from its inputs and attributes. A
** failure is a bug in a pass, reported as "internal:" at the node's .net
** location with its id and op.
*/
#include "ir.h"
#include <stdarg.h>
#include <string.h>

typedef struct Check {
    const Graph *g;
    Diag *d;
    Arena *tmp;       /* shape strings of the messages */
    int id;           /* the node being checked */
    int bad;          /* problems reported */
} Check;

static bool problem(Check *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool problem(Check *c, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const Node *n = &c->g->nodes[c->id];
    diag_at(c->d, n->loc, "internal: node %%%d (%s) %s", c->id, ir_op_name(n->op), msg);
    c->bad++;
    return false;
}

/* The node's shape against its op's rule. */
static void shape_rule(Check *c)
{
    const Node *n = &c->g->nodes[c->id];
    Shape want;
    char why[384];
    if (!ir_op_shape(c->g, n, &want, why, sizeof why)) problem(c, "%s", why);
    else if (!ir_shape_eq(&want, &n->shape))
        problem(c, "has shape %s, but its shape rule gives %s", ir_shape_str(c->tmp, &n->shape), ir_shape_str(c->tmp, &want));
}

int ir_verify(const Graph *g, Diag *d)
{
    Arena tmp;
    arena_init(&tmp);
    Check c = { .g = g, .d = d, .tmp = &tmp };
    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        c.id = id;
        if (n->op >= OP_COUNT) {
            diag_at(d, n->loc, "internal: node %%%d has no valid op", id);
            c.bad++;
            continue;
        }
        int before = c.bad;
        int mn = ir_op_min_inputs(n->op), mx = ir_op_max_inputs(n->op);
        if (n->nin < mn || n->nin > mx) {
            if (mn == mx) problem(&c, "has %d inputs, not %d", n->nin, mn);
            else problem(&c, "has %d inputs, not %d to %d", n->nin, mn, mx);
        }
        for (int k = 0; k < n->nin && k < IR_MAXIN; k++)
            if (n->in[k] < 0 || n->in[k] >= id) problem(&c, "input %d is %%%d, not an earlier node", k, n->in[k]);
        if (n->shape.nd < 0 || n->shape.nd > IR_MAXDIM) {
            problem(&c, "has %d dimensions", n->shape.nd);
            continue;
        }
        for (int k = 0; k < n->shape.nd; k++)
            if (n->shape.d[k] <= 0 && !(k == 0 && n->shape.d[k] == IR_BATCH))
                problem(&c, "has dimension %d = %d", k, n->shape.d[k]);
        if (c.bad == before) shape_rule(&c);   /* only over well-formed inputs */
        if (n->dtype != DT_F32) problem(&c, "stores %s: every tensor is f32", ir_dtype_name(n->dtype));
        if (n->mm != DT_F32 && (ir_op_kind(n->op) != KIND_GEMM || n->mm != DT_BF16))
            problem(&c, "multiplies in %s, but only a GEMM-class op multiplies in bf16", ir_dtype_name(n->mm));
    }
    arena_free(&tmp);
    return c.bad;
}
