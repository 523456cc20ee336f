/*
** Moving elements between dimensions: transpose (two dimensions swapped, a
** copy) and select (one index of a dimension, that dimension gone: a ViT's
** class token), and select's gradient. One output element per iteration, its
** coordinates c0.. from its index (cg_coords); the text is the same for C and
** CUDA. On CPUs a transpose that keeps N in front copies whole matrices
** instead (transpose_tiles: 8 x 8 blocks in registers, or tiles of rows).
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

/* The product of dimensions [from, to) of s (none of them N) */
static long dims_product(const Shape *s, int from, int to)
{
    long p = 1;
    for (int k = from; k < to; k++) p *= s->d[k];
    return p;
}

/* CPUs: x viewed as [P, A, M, B, Q] (A and B the swapped dimensions, P the
   product of those before A, N's among them), y as [P, B, M, A, Q]; an
   iteration a whole [A, B] matrix of x (for each m): blocks of 8 x 8 through
   registers (mgc_transpose8) where Q is 1, else tiles of 16 x 16 of rows of Q.
   (An element an iteration, its coordinates from its index, read x a row apart
   each time: the MLP-Mixer's [128, 49, 128] tokens took 1.5 ms in a step, 8 x 8 blocks 0.4.) */
static void transpose_tiles(Lower *L, int id, const Shape *xs, int d0, int d1)
{
    const Node *n = &L->g->nodes[id];
    long A = xs->d[d0], B = xs->d[d1], M = dims_product(xs, d0 + 1, d1), Q = dims_product(xs, d1 + 1, xs->nd);
    Dim work = dim_of(&n->shape);
    work.c = work.c / (A * B * Q);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "transpose", work, 2, b, (const char *const[]){ "=y", "x" })->c_only = true;
    cg_text(L, "    /* y $ys = x $xs with dimensions $d0 and $d1 swapped: x as [P, $A, $M, $B, $Q],\n"
               "       y as [P, $B, $M, $A, $Q] */\n"
               "    FOR_EACH(pm, $work) {\n"
               "        const long p = pm / ${M}L, m = pm % ${M}L;\n"
               "        const long xo = (p * $A * ${M}L + m) * $B * ${Q}L, yo = (p * $B * ${M}L + m) * $A * ${Q}L;\n",
            cg_s("ys", ir_shape_str(L->p->arena, &n->shape)), cg_s("xs", ir_shape_str(L->p->arena, xs)),
            cg_n("d0", d0), cg_n("d1", d1), cg_n("A", A), cg_n("B", B), cg_n("M", M), cg_n("Q", Q),
            cg_s("work", cg_work_str(L, work)));
    if (Q == 1)
        cg_text(L, "        long a0 = 0;\n"
                   "        for (; a0 + 8 <= $A; a0 += 8) {\n"
                   "            long b0 = 0;\n"
                   "            for (; b0 + 8 <= $B; b0 += 8) mgc_transpose8(x + xo + a0 * ${MB}L + b0, ${MB}L, y + yo + b0 * ${MA}L + a0, ${MA}L);\n"
                   "            for (long bb = b0; bb < $B; bb++)\n"
                   "                for (long aa = a0; aa < a0 + 8; aa++) y[yo + bb * ${MA}L + aa] = x[xo + aa * ${MB}L + bb];\n"
                   "        }\n"
                   "        for (long bb = 0; bb < $B; bb++)\n"
                   "            for (long aa = a0; aa < $A; aa++) y[yo + bb * ${MA}L + aa] = x[xo + aa * ${MB}L + bb];\n"
                   "    }\n",
                cg_n("A", A), cg_n("B", B), cg_n("MA", M * A), cg_n("MB", M * B));
    else
        cg_text(L, "        for (long a0 = 0; a0 < $A; a0 += 16)\n"
                   "            for (long b0 = 0; b0 < $B; b0 += 16)\n"
                   "                for (long bb = b0; bb < (b0 + 16 < $B ? b0 + 16 : $B); bb++)\n"
                   "                    for (long aa = a0; aa < (a0 + 16 < $A ? a0 + 16 : $A); aa++)\n"
                   "                        for (long q = 0; q < ${Q}L; q++)\n"
                   "                            y[yo + (bb * ${MA}L + aa) * ${Q}L + q] = x[xo + (aa * ${MB}L + bb) * ${Q}L + q];\n"
                   "    }\n",
                cg_n("A", A), cg_n("B", B), cg_n("MA", M * A), cg_n("MB", M * B), cg_n("Q", Q));
    cg_end_kernel(L);
}

/* y = x.transpose(dim0, dim1): y's coordinates, dim0's and dim1's exchanged, index x
   (on CPUs in tiles, where N is not one of the two) */
void cg_lower_transpose(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int d0 = n->attr.dim0 < n->attr.dim1 ? n->attr.dim0 : n->attr.dim1, d1 = n->attr.dim0 ^ n->attr.dim1 ^ d0;
    if (L->dec->cpu_only && d0 > 0 && d0 != d1 && xs->d[0] == IR_BATCH) {
        transpose_tiles(L, id, xs, d0, d1);
        return;
    }
    Dim work = dim_of(&n->shape);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "transpose", work, 2, b, (const char *const[]){ "=y", "x" });
    const char *coord[IR_MAXDIM] = { 0 };
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

/* CPUs, where N leads x [P, A, Q] (A the dimension axis, P the product of those before it, N's
   among them, Q after it): a row of Q an iteration, no coordinates made from an index. select:
   y[p, q] = x[p, index, q]; its gradient dx[p, a, q] = a == index ? dy[p, q] : 0; sum's and
   mean's dx[p, a, q] = dy[p, q] * factor. */
static bool axis_rows(Lower *L, int id, const Shape *full, const char *kind, const char *const *names, const char *what)
{
    const Node *n = &L->g->nodes[id];
    int axis = n->attr.axis;
    if (!L->dec->cpu_only || axis < 1 || full->d[0] != IR_BATCH) return false;
    long P = dims_product(full, 1, axis), A = full->d[axis], Q = dims_product(full, axis + 1, full->nd);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, kind, dimn(P), 2, b, names)->grain = A * Q;
    cg_body(L, "    /* %s; viewed as [%s, %ld, %ld], a row of %ld an iteration */\n", what, cg_work_str(L, dimn(P)), A, Q, Q);
    if (n->op == OP_SELECT)
        cg_body(L, "    FOR_EACH(p, %s) {\n        const float *xr = x + (p * %ldL + %d) * %ldL;\n        float *yr = y + p * %ldL;\n"
                   "        for (long q = 0; q < %ldL; q++) yr[q] = xr[q];\n    }\n",
                cg_work_str(L, dimn(P)), A, n->attr.index, Q, Q, Q);
    else
        cg_body(L, "    FOR_EACH(p, %s) {\n        const float *dy_p = dy + p * %ldL;\n"
                   "        for (long a = 0; a < %ldL; a++) {\n            float *dxr = dx + (p * %ldL + a) * %ldL;\n"
                   "            %s\n        }\n    }\n",
                cg_work_str(L, dimn(P)), Q, A, A, Q,
                n->op == OP_SELECT_BWD
                    ? arena_printf(L->p->arena, "if (a == %d) for (long q = 0; q < %ldL; q++) dxr[q] = dy_p[q];\n"
                                                "            else for (long q = 0; q < %ldL; q++) dxr[q] = 0.0f;", n->attr.index, Q, Q)
                    : arena_printf(L->p->arena, "for (long q = 0; q < %ldL; q++) dxr[q] = dy_p[q]%s;", Q,
                                   n->attr.factor == 1.0f ? "" : arena_printf(L->p->arena, " * %.9gf", n->attr.factor)));
    cg_end_kernel(L);
    return true;
}

/* y = x.select(axis, index) */
void cg_lower_select(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    Dim work = dim_of(&n->shape);
    const char *what = arena_printf(L->p->arena, "y %s = x %s at index %d of dimension %d", ir_shape_str(L->p->arena, &n->shape),
                                    ir_shape_str(L->p->arena, xs), n->attr.index, n->attr.axis);
    if (axis_rows(L, id, xs, "select", (const char *const[]){ "=y", "x" }, what)) return;
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "select", work, 2, b, (const char *const[]){ "=y", "x" });
    const char *coord[IR_MAXDIM] = { 0 };
    with_axis(L, xs->nd, n->attr.axis, arena_printf(L->p->arena, "%d", n->attr.index), coord);
    cg_body(L, "    /* %s */\n", what);
    cg_body(L, "    FOR_EACH(i, %s) {\n", cg_work_str(L, work));
    cg_coords(L, &n->shape, "i");
    cg_body(L, "        y[i] = x[%s];\n    }\n", index_by(L, xs, coord));
    cg_end_kernel(L);
}

/* dx from dy, x's shape without dimension axis (overwrites): select's gradient, dy where dimension
   axis is index and 0 elsewhere; sum's and mean's, dy times factor at every index of it */
void cg_lower_select_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *ys = &L->g->nodes[n->in[0]].shape;
    bool sel = n->op == OP_SELECT_BWD;
    const char *what = sel ? arena_printf(L->p->arena, "dx %s: dy %s at index %d of dimension %d, 0 elsewhere", ir_shape_str(L->p->arena, &n->shape),
                                          ir_shape_str(L->p->arena, ys), n->attr.index, n->attr.axis)
                           : arena_printf(L->p->arena, "dx %s: dy %s repeated along dimension %d, times %.9g", ir_shape_str(L->p->arena, &n->shape),
                                          ir_shape_str(L->p->arena, ys), n->attr.axis, n->attr.factor);
    if (axis_rows(L, id, &n->shape, sel ? "select_grad" : "reduce_grad", (const char *const[]){ "=dx", "dy" }, what)) return;
    Dim work = dim_of(&n->shape);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, sel ? "select_grad" : "reduce_grad", work, 2, b, (const char *const[]){ "=dx", "dy" });
    const char *coord[IR_MAXDIM] = { 0 };
    for (int k = 0, j = 0; k < n->shape.nd; k++) if (k != n->attr.axis) coord[j++] = coord_name(L, k);
    cg_body(L, "    /* %s */\n", what);
    cg_body(L, "    FOR_EACH(i, %s) {\n", cg_work_str(L, work));
    cg_coords(L, &n->shape, "i");
    if (sel) cg_body(L, "        dx[i] = c%d == %d ? dy[%s] : 0.0f;\n    }\n", n->attr.axis, n->attr.index, index_by(L, ys, coord));
    else
        cg_body(L, "        dx[i] = dy[%s]%s;\n    }\n", index_by(L, ys, coord),
                n->attr.factor == 1.0f ? "" : arena_printf(L->p->arena, " * %.9gf", n->attr.factor));
    cg_end_kernel(L);
}

/* y = x.sum(axis) or x.mean(axis): one output element per iteration, the sum along axis in
   order (PyTorch sums in another order: the same to rounding) */
void cg_lower_reduce(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int a = n->attr.axis, len = xs->d[a];
    bool mean = n->op == OP_REDUCE_MEAN;
    Dim work = dim_of(&n->shape);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, mean ? "mean" : "sum", work, 2, b, (const char *const[]){ "=y", "x" });
    const char *coord[IR_MAXDIM] = { 0 };
    with_axis(L, xs->nd, a, "r", coord);
    cg_body(L, "    /* y %s = x %s %s along dimension %d (%d) */\n", ir_shape_str(L->p->arena, &n->shape),
            ir_shape_str(L->p->arena, xs), mean ? "averaged" : "summed", a, len);
    cg_body(L, "    FOR_EACH(i, %s) {\n", cg_work_str(L, work));
    cg_coords(L, &n->shape, "i");
    cg_body(L, "        float s = 0.0f;\n"
               "        for (long r = 0; r < %d; r++) s += x[%s];\n"
               "        y[i] = s%s;\n    }\n", len, index_by(L, xs, coord),
            mean ? arena_printf(L->p->arena, " / %d.0f", len) : "");
    cg_end_kernel(L);
}

/* s without dimension axis */
static Shape without_axis(const Shape *s, int axis)
{
    Shape o = { s->nd - 1, { 0 } };
    for (int k = 0, j = 0; k < s->nd; k++) if (k != axis) o.d[j++] = s->d[k];
    return o;
}

/* The loop over the rows along dimension axis of a tensor of shape s, one per element of s
   without it: the first element's index e0 (from the coordinates c0..) and the step between
   the row's elements */
static void rows_along(Lower *L, const Shape *s, int axis, const char **e0, long *step)
{
    Shape o = without_axis(s, axis);
    const char *coord[IR_MAXDIM] = { 0 };
    with_axis(L, s->nd, axis, "0", coord);
    *e0 = index_by(L, s, coord);
    *step = 1;
    for (int k = axis + 1; k < s->nd; k++) *step *= s->d[k];
    cg_body(L, "    FOR_EACH(i, %s) {\n", cg_work_str(L, dim_of(&o)));
    cg_coords(L, &o, "i");
}

/* y = x.softmax(axis): a row's maximum, the sum of exp(x - max), each exp(x - max) / sum (PyTorch's);
   its gradient dx = y * (dy - sum(dy * y)) along axis (overwrites). A row an iteration. */
void cg_lower_softmax(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *s = &n->shape;
    int a = n->attr.axis, len = s->d[a];
    bool fwd = n->op == OP_SOFTMAX;
    Shape o = without_axis(s, a);
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), fwd ? -1 : buf_of(L, n->in[1]) };
    if (fwd) cg_kernel(L, id, "softmax", dim_of(&o), 2, b, (const char *const[]){ "=y", "x" });
    else cg_kernel(L, id, "softmax_grad", dim_of(&o), 3, b, (const char *const[]){ "=dx", "y", "dy" });
    cg_body(L, fwd ? "    /* y %s = softmax of x along dimension %d: rows of %d */\n"
                   : "    /* dx %s = y * (dy - sum(dy * y)) along dimension %d: rows of %d */\n",
            ir_shape_str(L->p->arena, s), a, len);
    const char *e0;
    long st;
    rows_along(L, s, a, &e0, &st);
    if (fwd)
        cg_body(L, "        const float *xr = x + (%s);\n        float *yr = y + (%s);\n"
                   "        float m = xr[0];\n"
                   "        for (long r = 1; r < %d; r++) m = xr[r * %ldL] > m ? xr[r * %ldL] : m;\n"
                   "        float s = 0.0f;\n"
                   "        for (long r = 0; r < %d; r++) { float e = expf(xr[r * %ldL] - m); yr[r * %ldL] = e; s += e; }\n"
                   "        const float inv = 1.0f / s;\n"
                   "        for (long r = 0; r < %d; r++) yr[r * %ldL] *= inv;\n    }\n",
                e0, e0, len, st, st, len, st, st, len, st);
    else
        cg_body(L, "        const long o_ = %s;\n"
                   "        float d = 0.0f;\n"
                   "        for (long r = 0; r < %d; r++) d += dy[o_ + r * %ldL] * y[o_ + r * %ldL];\n"
                   "        for (long r = 0; r < %d; r++) dx[o_ + r * %ldL] = y[o_ + r * %ldL] * (dy[o_ + r * %ldL] - d);\n    }\n",
                e0, len, st, st, len, st, st, st);
    cg_end_kernel(L);
}
