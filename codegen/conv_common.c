/*
** What the convolution forms share (codegen/conv.c chooses a form per layer,
** and conv_forms.h lists the forms): the geometry of any of the three ops,
** the forward kernel's start and its fused activation, groups and dilation in
** the kernels' text, the channels-last copy of a gradient or input, and the
** loops and partial statistics of the chunked forms (conv_chunked.c,
** winograd.c). It stands below every form and the choice: it calls the
** kernel builder, the store (elementwise.c) and the passes' decisions only.
*/
#include "lower_internal.h"

/* Where each op keeps x, w and y (dy for the gradients):
     conv2d         x = in[0], w = in[1], y = the node
     conv2d_grad_x  dy = in[0], w = in[1], dx = the node (the shape of x)
     conv2d_grad_w  dy = in[0], x = in[1], dw = the node (the shape of w)
   Stride, padding, groups and dilation are the same on all three (autodiff copies them). */
ConvGeom cg_conv_geom(const Graph *g, int id)
{
    const Node *n = &g->nodes[id];
    const Shape *xs, *ws, *ys;
    if (n->op == OP_CONV2D) {
        xs = &g->nodes[n->in[0]].shape, ws = &g->nodes[n->in[1]].shape, ys = &n->shape;
    } else if (n->op == OP_CONV2D_BWD_X) {
        xs = &n->shape, ws = &g->nodes[n->in[1]].shape, ys = &g->nodes[n->in[0]].shape;
    } else {   /* OP_CONV2D_BWD_W */
        xs = &g->nodes[n->in[1]].shape, ws = &n->shape, ys = &g->nodes[n->in[0]].shape;
    }
    return (ConvGeom){ .C = xs->d[1], .H = xs->d[2], .W = xs->d[3], .O = ws->d[0], .K = ws->d[2],
                       .S = n->attr.stride, .P = n->attr.padding, .OH = ys->d[2], .OW = ys->d[3],
                       .groups = ir_groups(&n->attr), .D = ir_dilation(&n->attr) };
}

const char *cg_conv_act(Lower *L, int id, const char *v)
{
    return cg_act(L->dec, id) >= 0 ? cg_fused_act(L, id, v) : v;
}

Step *cg_conv_kernel(Lower *L, int id, const char *what, Dim work, int nargs, const int *b, const char *const *names)
{
    CgArgs a = { 0 };
    for (int k = 0; k < nargs; k++) cg_arg(L, &a, b[k], "%s", names[k]);
    if (cg_act_beside(L->dec, id) >= 0) cg_arg(L, &a, cg_out_buf(L, cg_act_beside(L->dec, id)), "=ya");
    return cg_kernel_args(L, id, what, work, &a);
}

/* Groups and dilation in the generated code (the direct and chunked forms take them,
   cg_choose_convs()): a tap's offset, k or (k * D); the header comment's words. */
const char *cg_dilated(Lower *L, const char *k, int D)
{
    return D > 1 ? arena_printf(L->p->arena, "(%s * %d)", k, D) : k;
}

const char *cg_groups_dilation(Lower *L, const ConvGeom *G)
{
    return arena_printf(L->p->arena, "%s%s", G->groups > 1 ? arena_printf(L->p->arena, ", %d groups", G->groups) : "",
                        G->D > 1 ? arena_printf(L->p->arena, ", dilation %d", G->D) : "");
}

/* [N, O, P] -> [N, P, O] (channels last), once per buffer: a gradient (the vector
   weight gradient's) or an input (the pooled weight gradient's). */
int cg_conv_channels_last(Lower *L, int id, int dy_node)
{
    if (L->dyc[dy_node] >= 0) return L->dyc[dy_node];
    const Shape *ds = &L->g->nodes[dy_node].shape;
    int O = ds->d[1], P = ds->d[2] * ds->d[3];
    int t = cg_new_buf(L, BUF_WORK, dimn((long)P * O), "channels-last copy", dy_node);
    int b[2] = { t, buf_of(L, dy_node) };
    cg_kernel(L, id, "pack_channels_last", dimn(1), 2, b, (const char *const[]){ "=t", "dy" })->grain = (long)O * P;
    cg_body(L, "    /* dy is [N, %d, %d] (%s); t is [N, %d, %d]: one example per iteration */\n", O, P,
            L->g->nodes[dy_node].grad_of >= 0 ? "a gradient" : "an input", P, O);
    cg_body(L, "    FOR_EACH(n, N) {\n"
               "        for (int o = 0; o < %d; o++)\n"
               "            for (int p = 0; p < %d; p++) t[(n * %d + p) * %d + o] = dy[(n * %d + o) * %d + p];\n    }\n",
            O, P, P, O, O, P);
    cg_end_kernel(L);
    L->dyc[dy_node] = t;
    return t;
}

/* In a chunked forward's loop (chunk `ch`, `part` the BatchNorm's partial sums):
   per output channel o < O the mean and the sum of squared deviations of its
   values in this chunk, `nseg` runs of `len` floats from `seg` (C expressions
   of o and of the run j), two passes in double in lanes the compiler
   vectorises; `shift` is added to the mean (a bias not in the values). */
void cg_chunk_stats(Lower *L, int O, const char *seg, const char *nseg, const char *len, const char *shift)
{
    cg_body(L, "        double *pd = (double *)part + ch * %dL * 2;   /* this chunk's partial statistics */\n"
               "        for (int o = 0; o < %d; o++) {\n"
               "            double s_l[MGC_DLANES] = { 0 }, q_l[MGC_DLANES] = { 0 };\n"
               "            for (long j = 0; j < (%s); j++) {\n"
               "                const float *r = %s;\n"
               "                long q = 0;\n"
               "                for (; q + MGC_DLANES <= (%s); q += MGC_DLANES)\n"
               "                    for (int l = 0; l < MGC_DLANES; l++) s_l[l] += r[q + l];\n"
               "                for (; q < (%s); q++) s_l[0] += r[q];\n"
               "            }\n"
               "            double s = 0;\n"
               "            for (int l = 0; l < MGC_DLANES; l++) s += s_l[l];\n"
               "            const double mean = s / ((double)(%s) * (%s));\n"
               "            for (long j = 0; j < (%s); j++) {\n"
               "                const float *r = %s;\n"
               "                long q = 0;\n"
               "                for (; q + MGC_DLANES <= (%s); q += MGC_DLANES)\n"
               "                    for (int l = 0; l < MGC_DLANES; l++) { double d = r[q + l] - mean; q_l[l] += d * d; }\n"
               "                for (; q < (%s); q++) { double d = r[q] - mean; q_l[0] += d * d; }\n"
               "            }\n"
               "            double m2 = 0;\n"
               "            for (int l = 0; l < MGC_DLANES; l++) m2 += q_l[l];\n"
               "            pd[2 * o] = mean + %s;\n"
               "            pd[2 * o + 1] = m2;\n"
               "        }\n", O, O, nseg, seg, len, len, nseg, len, nseg, seg, len, len, shift);
}

/* A weight gradient's loop over its CG_WGROUPS groups of examples (FOR_EACH
   g), each writing its partial sum pg (`per_group` floats of `part`; zeros
   for a group with no examples), and in it the loop over the group's chunks
   of NB examples n0 .. n0+nb-1, ld = nb * cols; the body closes both. */
void cg_group_chunks(Lower *L, long per_group, int NB, long cols)
{
    cg_body(L, "    FOR_EACH(g, %dL) {\n"
               "        float *pg = part + g * %ldL;\n"
               "        const long e0 = N * g / %d, e1 = N * (g + 1) / %d;\n"
               "        if (e0 == e1) for (long q = 0; q < %ldL; q++) pg[q] = 0.0f;   /* no examples (N < %d) */\n"
               "        for (long n0 = e0; n0 < e1; n0 += %d) {\n"
               "            int nb = e1 - n0 < %d ? (int)(e1 - n0) : %d, ld = nb * %ld;\n",
            CG_WGROUPS, per_group, CG_WGROUPS, CG_WGROUPS, per_group, CG_WGROUPS, NB, NB, NB, cols);
}
