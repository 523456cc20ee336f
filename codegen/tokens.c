/*
** Moving elements between dimensions: transpose (two dimensions swapped, a
** copy) and select (one index of a dimension, that dimension gone: a ViT's
** class token), and select's gradient. One output element per iteration, its
** coordinates c0.. from its index (cg_coords); the text is the same for C and
** CUDA.
*/
#include "lower_internal.h"

/* The index into a tensor of shape s whose dimension k has the coordinate named coord[k] */
static const char *index_by(Lower *L, const Shape *s, const char *const *coord)
{
    const char *e = coord[0];
    for (int k = 1; k < s->nd; k++) e = arena_printf(L->p->arena, "(%s) * %d + %s", e, s->d[k], coord[k]);
    return e;
}

static const char *coord_name(Lower *L, int k) { return arena_printf(L->p->arena, "c%d", k); }

/* y = x.transpose(dim0, dim1): y's coordinates, dim0's and dim1's exchanged, index x */
void cg_lower_transpose(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    Dim work = dim_of(&n->shape);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "transpose", work, 2, b, (const char *const[]){ "=y", "x" });
    const char *coord[IR_MAXDIM];
    for (int k = 0; k < xs->nd; k++) coord[k] = coord_name(L, k);
    coord[n->attr.dim0] = coord_name(L, n->attr.dim1);
    coord[n->attr.dim1] = coord_name(L, n->attr.dim0);
    cg_body(L, "    /* y %s = x %s with dimensions %d and %d swapped */\n", ir_shape_str(L->p->arena, &n->shape),
            ir_shape_str(L->p->arena, xs), n->attr.dim0, n->attr.dim1);
    cg_body(L, "    FOR_EACH(i, %s) {\n", cg_work_str(L, work));
    cg_coords(L, &n->shape, "i");
    cg_body(L, "        y[i] = x[%s];\n    }\n", index_by(L, xs, coord));
    cg_end_kernel(L);
}

/* The coordinates of x (rank nd) from those of x without dimension axis (c0.., the
   one at axis the index) */
static void with_axis(Lower *L, int nd, int axis, const char *at, const char **coord)
{
    for (int k = 0, j = 0; k < nd; k++) coord[k] = k == axis ? at : coord_name(L, j++);
}

/* y = x.select(axis, index) */
void cg_lower_select(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    Dim work = dim_of(&n->shape);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "select", work, 2, b, (const char *const[]){ "=y", "x" });
    const char *coord[IR_MAXDIM];
    with_axis(L, xs->nd, n->attr.axis, arena_printf(L->p->arena, "%d", n->attr.index), coord);
    cg_body(L, "    /* y %s = x %s at index %d of dimension %d */\n", ir_shape_str(L->p->arena, &n->shape),
            ir_shape_str(L->p->arena, xs), n->attr.index, n->attr.axis);
    cg_body(L, "    FOR_EACH(i, %s) {\n", cg_work_str(L, work));
    cg_coords(L, &n->shape, "i");
    cg_body(L, "        y[i] = x[%s];\n    }\n", index_by(L, xs, coord));
    cg_end_kernel(L);
}

/* dx = dy where dimension axis is index, 0 elsewhere (overwrites) */
void cg_lower_select_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *ys = &L->g->nodes[n->in[0]].shape;
    Dim work = dim_of(&n->shape);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "select_grad", work, 2, b, (const char *const[]){ "=dx", "dy" });
    const char *coord[IR_MAXDIM];
    for (int k = 0, j = 0; k < n->shape.nd; k++) if (k != n->attr.axis) coord[j++] = coord_name(L, k);
    cg_body(L, "    /* dx %s: dy %s at index %d of dimension %d, 0 elsewhere */\n", ir_shape_str(L->p->arena, &n->shape),
            ir_shape_str(L->p->arena, ys), n->attr.index, n->attr.axis);
    cg_body(L, "    FOR_EACH(i, %s) {\n", cg_work_str(L, work));
    cg_coords(L, &n->shape, "i");
    cg_body(L, "        dx[i] = c%d == %d ? dy[%s] : 0.0f;\n    }\n", n->attr.axis, n->attr.index, index_by(L, ys, coord));
    cg_end_kernel(L);
}
