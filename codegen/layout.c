/*
** Kernels that move data without arithmetic on it: concat (tensors side by
** side along a dimension, 1 mostly) and its gradient, a channel slice. A
** tensor joined along dimension a is seen as [N * M, C, P]: M the product of
** the dimensions between the batch and a (1 along dimension 1), C the one
** joined, P the product of those after it ([N, C, H, W] along 1: planes of
** H * W; [N, F]: planes of one element); one output plane per iteration,
** copied whole (CPUs), or an element per iteration (GPUs).
*/
#include "lower_internal.h"

/* Elements of a plane: the dimensions after axis. */
static long plane_of(const Shape *s, int axis)
{
    long p = 1;
    for (int d = axis + 1; d < s->nd; d++) p *= s->d[d];
    return p;
}

/* Rows of planes per example: the dimensions between the batch and axis. */
static long rows_of(const Shape *s, int axis)
{
    long m = 1;
    for (int d = 1; d < axis; d++) m *= s->d[d];
    return m;
}

/* The kernel of a copy by planes: y's planes [N * planes] of P elements. CPUs: a plane an
   iteration, copied whole; GPUs: an element an iteration (a thread a plane left the ViT's
   class-token slice, [N, 1, 128], on one block of threads). The body between sets src, plane
   P elements of the source; copy_end copies (dst: y's plane). */
static Step *copy_kernel(Lower *L, int id, const char *what, long planes, long P, int nb, const int *b, const char *const *names)
{
    bool gpu = !L->dec->cpu_only;
    Step *st = cg_kernel(L, id, what, dimn(gpu ? planes * P : planes), nb, b, names);
    if (!gpu) st->grain = (int)(P < 1 << 20 ? P : 1 << 20);
    return st;
}

static void copy_begin(Lower *L, long planes, long P)
{
    if (L->dec->cpu_only) cg_body(L, "    FOR_EACH(plane, %s) {\n", cg_work_str(L, dimn(planes)));
    else cg_body(L, "    FOR_EACH(i, %s) {\n        const long plane = i / %ldL, k = i %% %ldL;\n", cg_work_str(L, dimn(planes * P)), P, P);
}

static void copy_end(Lower *L, long P)
{
    if (L->dec->cpu_only)
        cg_body(L, "        float *dst = y + plane * %ldL;\n        for (long k = 0; k < %ldL; k++) dst[k] = src[k];\n    }\n", P, P);
    else
        cg_body(L, "        y[i] = src[k];\n    }\n");
}

/* in0, in1, ... [N, Ck, ...] -> y [N, C0 + C1 + ..., ...]: each output plane from its input's */
void cg_lower_concat(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int b[CG_MAXARGS] = { cg_out_buf(L, id) };
    const char *names[CG_MAXARGS] = { "=y" };
    for (int k = 0; k < n->nin; k++) b[k + 1] = buf_of(L, n->in[k]), names[k + 1] = arena_printf(L->p->arena, "in%d", k);
    int ax = n->attr.axis, C = n->shape.d[ax];
    long P = plane_of(&n->shape, ax), M = rows_of(&n->shape, ax);
    copy_kernel(L, id, "concat", M * C, P, n->nin + 1, b, names);
    if (ax == 1) cg_body(L, "    /* y [N, %d, ...] = the %d inputs side by side along dimension 1, planes of %ld */\n", C, n->nin, P);
    else cg_body(L, "    /* y %s = the %d inputs side by side along dimension %d: [N * %ld, %d, %ld] */\n",
                 ir_shape_str(L->p->arena, &n->shape), n->nin, ax, M, C, P);
    copy_begin(L, M * C, P);
    cg_body(L, "        const long img = plane / %d, c = plane %% %d;\n        const float *src;\n", C, C);
    int at = 0;
    for (int k = 0; k < n->nin; k++) {
        const Shape *ks = &L->g->nodes[n->in[k]].shape;
        int Ck = ks->d[ax];
        bool once = ks->d[0] == 1 && n->shape.d[0] != 1;   /* a batch of 1 (a param), repeated for every example */
        const char *row = !once ? "img" : M == 1 ? "0" : arena_printf(L->p->arena, "(img %% %ld)", M);
        cg_body(L, "        %sif (c < %d) src = in%d + (%s * %d + c - %d) * %ldL;\n", k ? "else " : "", at + Ck, k, row, Ck,
                at, P);
        at += Ck;
    }
    cg_body(L, "        else src = in0;   /* not reached */\n");
    copy_end(L, P);
    cg_end_kernel(L);
}

/* dy [N, C, ...] -> dx [N, Ck, ...], its channels [offset, offset + Ck) */
void cg_lower_channel_slice(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int ax = n->attr.axis, C = xs->d[ax], Ck = n->shape.d[ax], off = n->attr.offset;
    long P = plane_of(&n->shape, ax), M = rows_of(&n->shape, ax);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    copy_kernel(L, id, "channel_slice", M * Ck, P, 2, b, (const char *const[]){ "=y", "x" });
    if (ax == 1) cg_body(L, "    /* y [N, %d, ...] = x [N, %d, ...]'s channels from %d, planes of %ld */\n", Ck, C, off, P);
    else cg_body(L, "    /* y %s = x %s from index %d of dimension %d: [N * %ld, %d of %d, %ld] */\n",
                 ir_shape_str(L->p->arena, &n->shape), ir_shape_str(L->p->arena, xs), off, ax, M, Ck, C, P);
    copy_begin(L, M * Ck, P);
    cg_body(L, "        const long img = plane / %d, c = plane %% %d;\n"
               "        const float *src = x + (img * %d + c + %d) * %ldL;\n", Ck, Ck, C, off, P);
    copy_end(L, P);
    cg_end_kernel(L);
}
