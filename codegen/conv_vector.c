/*
** The channel-vectorised form of a convolution (CONV_VECTOR, codegen/conv.c
** says when): a row of outputs at a time with all output channels in a vector,
** the weights transposed to [C*K*K, O]; its input gradient is the GEMM form's
** through channels-last gradients (conv_gemm.c).
*/
#include "conv_forms.h"

/* ------------------------------------------------- channel-vectorised convolution */

/* w [O, C, K, K] -> wt [C*K*K, O]: the taps' weights for all outputs side by side. */
static int transposed_weights(Lower *L, int id, int w_node)
{
    const Shape *ws = &L->g->nodes[w_node].shape;
    int O = ws->d[0];
    long CKK = (long)ws->d[1] * ws->d[2] * ws->d[3];
    int wt = cg_new_buf(L, BUF_WORK, dimc(CKK * O), "weights transposed", w_node);
    int b[2] = { wt, buf_of(L, w_node) };
    cg_kernel(L, id, "transpose_weights", dimc(CKK), 2, b, (const char *const[]){ "=wt", "w" })->grain = O;
    cg_body(L, "    /* w is [%d, %ld]; wt is [%ld, %d] */\n", O, CKK, CKK, O);
    cg_body(L, "    FOR_EACH(r, %ldL) {\n        for (int o = 0; o < %d; o++) wt[r * %d + o] = w[o * %ldL + r];\n    }\n",
            CKK, O, O, CKK);
    cg_end_kernel(L);
    return wt;
}

/* Columns per block in the channel-vectorised kernels: B output columns are
   computed together, each with its own accumulators, so the compiler keeps
   B * O / 8 vector registers of sums in flight: 8 columns for up to 16
   outputs (an FMA waits about 4 cycles for the one before into the same sum,
   and two units need 8 independent sums; LeNet's conv2 forward 1.05 -> 0.76
   ms a step on one thread), else 4 (more would spill). */
static int column_block(int ow, int o) { return ow % 8 == 0 && o <= 16 ? 8 : ow % 4 == 0 ? 4 : ow % 2 == 0 ? 2 : 1; }

/* x, w, bias? -> y, one output row (n, oy) per iteration with all O outputs in a vector */
void cg_conv_vector_forward(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, OH = G->OH, OW = G->OW;   /* P is 0: cg_conv_strategy() picks this only then */
    int B = column_block(OW, O);
    bool bias = n->nin == 3;
    int wt = transposed_weights(L, id, n->in[1]);
    int b[4] = { cg_out_buf(L, id), buf_of(L, n->in[0]), wt, bias ? buf_of(L, n->in[2]) : -1 };
    cg_conv_kernel(L, id, "conv2d_vector", dimn(OH), bias ? 4 : 3, b, (const char *const[]){ "=y", "x", "wt", "bias" })->grain =
        (long)OW * O * C * K * K;
    cg_body(L, "    /* x [N, %d, %d, %d], wt [%d*%d*%d, %d], y [N, %d, %d, %d]; stride %d, no padding;\n"
               "       one output row (n, oy) per iteration, all %d output channels at once, %d columns per block */\n",
            C, H, W, C, K, K, O, O, OH, OW, S, O, B);
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        long n = i / %d; int oy = (int)(i %% %d);\n"
               "        for (int ox0 = 0; ox0 < %d; ox0 += %d) {\n",
            cg_work_str(L, dimn(OH)), OH, OH, OW, B);
    for (int j = 0; j < B; j++) cg_body(L, "            float a%d[%d];\n", j, O);
    cg_body(L, "            for (int o = 0; o < %d; o++) {\n", O);
    for (int j = 0; j < B; j++) cg_body(L, "                a%d[o] = %s;\n", j, bias ? "bias[o]" : "0.0f");
    cg_body(L, "            }\n"
               "            for (int c = 0; c < %d; c++)\n"
               "                for (int ky = 0; ky < %d; ky++) {\n"
               "                    const float *xr = x + ((n * %d + c) * %d + oy * %d + ky) * %d + ox0 * %d;\n"
               "                    const float *wr = wt + (c * %d + ky) * %d * %d;\n"
               "                    for (int kx = 0; kx < %d; kx++) {\n",
            C, K, C, H, S, W, S, K, K, O, K);
    for (int j = 0; j < B; j++) cg_body(L, "                        const float x%d = xr[kx + %d];\n", j, j * S);
    cg_body(L, "                        for (int o = 0; o < %d; o++) {\n"
               "                            const float w = wr[kx * %d + o];\n", O, O);
    for (int j = 0; j < B; j++) cg_body(L, "                            a%d[o] += x%d * w;\n", j, j);
    cg_body(L, "                        }\n                    }\n                }\n"
               "            for (int o = 0; o < %d; o++) {\n"
               "                float *yr = y + ((n * %d + o) * %d + oy) * %d + ox0;\n", O, O, OH, OW);
    for (int j = 0; j < B; j++)
        cg_body(L, "                %s\n", cg_store(L, id, "yr", arena_printf(L->p->arena, "%d", j), arena_printf(L->p->arena, "a%d[o]", j)));
    cg_body(L, "            }\n        }\n    }\n");
    cg_end_kernel(L);
}

/* dy, x -> dw from the channels-last gradient, one row of taps (c, ky) per iteration */
void cg_conv_vector_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    /* CONV2D_BWD_W: dw[o, r] = sum over n, oy, ox of dy[n, o, oy, ox] * x[n, c, oy*S + ky, ox*S + kx], r = (c, ky, kx) */
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, OH = G->OH, OW = G->OW;   /* P is 0: cg_conv_strategy() picks this only then */
    long CKK = (long)C * K * K;
    int dyt = cg_conv_channels_last(L, id, n->in[0]);
    int b[3] = { cg_out_buf(L, id), dyt, buf_of(L, n->in[1]) };
    Step *st = cg_kernel(L, id, "conv2d_grad_w_vector", dimc((long)C * K), 3, b, (const char *const[]){ "=dw", "t", "x" });
    st->heavy = st->blocks = true;
    cg_body(L, "    /* t [N, %d, %d, %d] (dy, channels last), x [N, %d, %d, %d], dw [%d, %ld]; stride %d, no padding;\n"
               "       one row of taps (c, ky) per iteration: each gradient row of t is read once for all %d kx,\n"
               "       which keep their own %d sums */\n",
            OH, OW, O, C, H, W, O, CKK, S, K, O);
    cg_body(L, "    FOR_EACH_BLOCK(row, %dL) {\n"
               "        int c = (int)(row / %d), ky = (int)(row %% %d);\n", C * K, K, K);
    for (int j = 0; j < K; j++) cg_body(L, "        float k%d[%d];\n", j, O);
    cg_body(L, "        for (int o = 0; o < %d; o++) {\n", O);
    for (int j = 0; j < K; j++) cg_body(L, "            k%d[o] = 0.0f;\n", j);
    cg_body(L, "        }\n"
               "        BLOCK_LOOP2(n, N, oy, %dL) {\n"
               "                const float *xr = x + ((n * %d + c) * %d + oy * %d + ky) * %d;\n"
               "                const float *tr = t + (n * %d + oy) * %d * %d;\n"
               "                for (int ox = 0; ox < %d; ox++) {\n"
               "                    const float *tv = tr + ox * %d, *xv = xr + ox * %d;\n"
               "                    for (int o = 0; o < %d; o++) {\n"
               "                        const float g = tv[o];\n",
            OH, C, H, S, W, OH, OW, O, OW, O, S, O);
    for (int j = 0; j < K; j++) cg_body(L, "                        k%d[o] += xv[%d] * g;\n", j, j);
    cg_body(L, "                    }\n                }\n            }\n"
               "        for (int o = 0; o < %d; o++) {\n"
               "            float *dr = dw + o * %ldL + row * %d;\n", O, CKK, K);
    for (int j = 0; j < K; j++) cg_body(L, "            { float v = BLOCK_SUM(k%d[o]); if (BLOCK_LEADER) dr[%d] = v; }\n", j, j);
    cg_body(L, "        }\n    }\n");
    cg_end_kernel(L);
}

