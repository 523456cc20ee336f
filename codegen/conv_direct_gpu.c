/*
** The direct form on GPUs: the convolutions that are not im2col + cuBLAS there
** (depthwise and other grouped layers), shaped for the GPU rather than the
** CPU. conv_direct.c's kernels take an (n, o) plane an iteration, every output
** of it in turn: a few thousand threads, each looping over a whole plane
** (MobileNetV2's depthwise layers: 176 us each of an H200's step, by the cost
** model). Here:
**   forward  a thread an output element: bias, then its taps over the
**            group's channels, (c, ky, kx) in order as the CPU's sums;
**   grad_x   a thread an element of dx: the outputs of its group that it fed,
**            (o, ky, kx) in order;
**   grad_w   a block a weight element (o, c, ky, kx), its threads over the
**            batch's output positions (consecutive threads, consecutive
**            columns of dy), BLOCK_SUM.
** Taps outside the input (padding) are skipped; strides and dilation as the
** CPU's kernels.
*/
#include "conv_forms.h"

/* The group's first input channel of output channel o (text): "0" without groups */
static const char *group_first(Lower *L, const ConvGeom *G, const char *o)
{
    int Cg = G->C / G->groups, Og = G->O / G->groups;
    return G->groups > 1 ? arena_printf(L->p->arena, "(%s / %d) * %d", o, Og, Cg) : "0";
}

/* y [N, O, OH, OW] = the convolution, an element a thread, stored through the fused activation */
void cg_conv_direct_gpu_forward(Lower *L, int id, const ConvGeom *G, const int *b, bool bias)
{
    int Cg = G->C / G->groups;
    cg_conv_kernel(L, id, "conv2d_direct", dimn((long)G->O * G->OH * G->OW), bias ? 4 : 3, b,
                   (const char *const[]){ "=y", "x", "w", "bias" });
    cg_body(L, "    /* x [N, %d, %d, %d], w [%d, %d, %d, %d], y [N, %d, %d, %d]; stride %d, padding %d%s;\n"
               "       an output element per thread (GPUs) */\n",
            G->C, G->H, G->W, G->O, Cg, G->K, G->K, G->O, G->OH, G->OW, G->S, G->P, cg_groups_dilation(L, G));
    cg_text(L, "    FOR_EACH(i, $work) {\n"
               "        const long ox = i % $OW, oy = i / $OW % $OH, o = i / ${OP}L % $O, n = i / ${OOP}L;\n"
               "        const float *xn = x + (n * $C + $g0) * ${HW}L, *wo = w + o * ${CKK}L;\n"
               "        float acc = $b0;\n"
               "        for (int c = 0; c < $Cg; c++)\n"
               "            for (int ky = 0; ky < $K; ky++) {\n"
               "                const long iy = oy * $S - $P + ky * $D;\n"
               "                if (iy < 0 || iy >= $H) continue;\n"
               "                for (int kx = 0; kx < $K; kx++) {\n"
               "                    const long ix = ox * $S - $P + kx * $D;\n"
               "                    if (ix >= 0 && ix < $W) acc += wo[(c * $K + ky) * $K + kx] * xn[c * ${HW}L + iy * $W + ix];\n"
               "                }\n"
               "            }\n"
               "        $store\n"
               "    }\n",
            cg_s("work", cg_work_str(L, dimn((long)G->O * G->OH * G->OW))), cg_n("OW", G->OW), cg_n("OH", G->OH),
            cg_n("OP", (long)G->OH * G->OW), cg_n("O", G->O), cg_n("OOP", (long)G->O * G->OH * G->OW), cg_n("C", G->C),
            cg_s("g0", group_first(L, G, "o")), cg_n("HW", (long)G->H * G->W), cg_n("CKK", (long)Cg * G->K * G->K),
            cg_s("b0", bias ? "bias[o]" : "0.0f"), cg_n("Cg", Cg), cg_n("K", G->K), cg_n("S", G->S), cg_n("P", G->P),
            cg_n("D", G->D), cg_n("H", G->H), cg_n("W", G->W), cg_s("store", cg_store(L, id, "y", "i", "acc")));
    cg_end_kernel(L);
}

/* dx [N, C, H, W] from dy and w: an element a thread, from every output of its group it fed */
void cg_conv_direct_gpu_grad_x(Lower *L, int id, const ConvGeom *G, const int *b)
{
    int Cg = G->C / G->groups, Og = G->O / G->groups;
    Dim work = dimn((long)G->C * G->H * G->W);
    cg_kernel(L, id, "conv2d_grad_x_direct", work, 3, b, (const char *const[]){ "=dx", "dy", "w" });
    cg_body(L, "    /* dy [N, %d, %d, %d], w [%d, %d, %d, %d], dx [N, %d, %d, %d]; stride %d, padding %d%s;\n"
               "       an element of dx per thread (GPUs): the outputs it fed */\n",
            G->O, G->OH, G->OW, G->O, Cg, G->K, G->K, G->C, G->H, G->W, G->S, G->P, cg_groups_dilation(L, G));
    cg_text(L, "    FOR_EACH(i, $work) {\n"
               "        const long ix = i % $W, iy = i / $W % $H, c = i / ${HW}L % $C, n = i / ${CHW}L;\n"
               "        const long o0 = c / $Cg * $Og;\n"
               "        float acc = 0.0f;\n"
               "        for (long o = o0; o < o0 + $Og; o++) {\n"
               "            const float *dyo = dy + (n * $O + o) * ${OP}L, *wo = w + (o * $Cg + c % $Cg) * ${KK}L;\n"
               "            for (int ky = 0; ky < $K; ky++) {\n"
               "                const long ty = iy + $P - ky * $D, oy = ty / $S;\n"
               "                if (ty < 0 || ty % $S || oy >= $OH) continue;\n"
               "                for (int kx = 0; kx < $K; kx++) {\n"
               "                    const long tx = ix + $P - kx * $D, ox = tx / $S;\n"
               "                    if (tx >= 0 && tx % $S == 0 && ox < $OW) acc += wo[ky * $K + kx] * dyo[oy * $OW + ox];\n"
               "                }\n"
               "            }\n"
               "        }\n"
               "        dx[i] = acc;\n"
               "    }\n",
            cg_s("work", cg_work_str(L, work)), cg_n("W", G->W), cg_n("H", G->H), cg_n("HW", (long)G->H * G->W), cg_n("C", G->C),
            cg_n("CHW", (long)G->C * G->H * G->W), cg_n("Cg", Cg), cg_n("Og", Og), cg_n("O", G->O), cg_n("OP", (long)G->OH * G->OW),
            cg_n("KK", G->K * G->K), cg_n("K", G->K), cg_n("P", G->P), cg_n("D", G->D), cg_n("S", G->S), cg_n("OH", G->OH),
            cg_n("OW", G->OW));
    cg_end_kernel(L);
}

/* dw [O, Cg, K, K]: a block a weight element, its threads over the batch's output positions */
void cg_conv_direct_gpu_grad_w(Lower *L, int id, const ConvGeom *G, const int *b)
{
    int Cg = G->C / G->groups;
    long nw = (long)G->O * Cg * G->K * G->K;
    Step *st = cg_kernel(L, id, "conv2d_grad_w_direct", dimc(nw), 3, b, (const char *const[]){ "=dw", "dy", "x" });
    st->heavy = st->blocks = true;
    cg_body(L, "    /* dy [N, %d, %d, %d], x [N, %d, %d, %d], dw [%d, %d, %d, %d]; stride %d, padding %d%s;\n"
               "       a block per weight element (GPUs), its threads over the batch's output positions */\n",
            G->O, G->OH, G->OW, G->C, G->H, G->W, G->O, Cg, G->K, G->K, G->S, G->P, cg_groups_dilation(L, G));
    cg_text(L, "    FOR_EACH_BLOCK(i, ${nw}L) {\n"
               "        const long kx = i % $K, ky = i / $K % $K, c = i / ${KK}L % $Cg, o = i / ${CKK}L;\n"
               "        const long xc = $g0 + c;\n"
               "        float acc = 0.0f;\n"
               "        BLOCK_LOOP2(n, N, p, ${OP}L) {\n"
               "            const long oy = p / $OW, ox = p % $OW, iy = oy * $S - $P + ky * $D, ix = ox * $S - $P + kx * $D;\n"
               "            if (iy >= 0 && iy < $H && ix >= 0 && ix < $W)\n"
               "                acc += dy[(n * $O + o) * ${OP}L + p] * x[(n * $C + xc) * ${HW}L + iy * $W + ix];\n"
               "        }\n"
               "        acc = BLOCK_SUM(acc);\n"
               "        if (BLOCK_LEADER) dw[i] = acc;\n"
               "    }\n",
            cg_n("nw", nw), cg_n("K", G->K), cg_n("KK", G->K * G->K), cg_n("Cg", Cg), cg_n("CKK", (long)Cg * G->K * G->K),
            cg_s("g0", group_first(L, G, "o")), cg_n("OP", (long)G->OH * G->OW), cg_n("OW", G->OW), cg_n("S", G->S), cg_n("P", G->P),
            cg_n("D", G->D), cg_n("H", G->H), cg_n("W", G->W), cg_n("O", G->O), cg_n("C", G->C), cg_n("HW", (long)G->H * G->W));
    cg_end_kernel(L);
}
