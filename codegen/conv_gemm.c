/*
** The GEMM forms of a convolution (codegen/conv.c says when): the packing
** they share (im2col, the output gradient transposed or channels last, the
** bf16 copies); CONV_GEMM, im2col and one BLAS GEMM over the batch; and
** CONV_DENSE, a small map as a dense layer over the whole map.
*/
#include "conv_forms.h"
#include <string.h>

/* ------------------------------------------------------- packing, shared by the strategies */

/* [N, O, P] -> [O, N*P], once per gradient buffer (GPUs, --precision bf16: rounded to
   bf16 as it is stored, cg_packs_bf16; a reader that multiplies in fp32 gets its own). */
static int transposed_grad(Lower *L, int id, int dy_node)
{
    bool bf16 = cg_packs_bf16(L, id);
    if (L->dyt[dy_node] >= 0 && L->p->bufs[L->dyt[dy_node]].bf16 == bf16) return L->dyt[dy_node];
    const Shape *ds = &L->g->nodes[dy_node].shape;
    int O = ds->d[1], P = ds->d[2] * ds->d[3];
    int t = bf16 ? cg_new_bf16_buf(L, BUF_WORK, dimn((long)O * P), "dy transposed, rounded to bf16", dy_node)
                 : cg_new_buf(L, BUF_WORK, dimn((long)O * P), "dy transposed", dy_node);
    int b[2] = { t, buf_of(L, dy_node) };
    L->dyt[dy_node] = t;
    if (!L->dec->cpu_only) {   /* GPUs: an element per thread (cg_rows_body) */
        cg_kernel(L, id, "pack_grad", cg_rows_work(dimn(O), P), 2, b, (const char *const[]){ "=t", "dy" });
        cg_body(L, "    /* dy is [N, %d, %d]; t is [%d, N*%d]%s; one element per iteration, (o, n) rows */\n", O, P, O, P,
                bf16 ? " in bf16" : "");
        cg_rows_body(L, dimn(O), P, "        long o = row / N, n = row % N;\n",
                     arena_printf(L->p->arena, bf16 ? "t[row * %dL + at] = mgc_to_bf16(dy[(n * %d + o) * %dL + at]);"
                                                    : "t[row * %dL + at] = dy[(n * %d + o) * %dL + at];", P, O, P));
        cg_end_kernel(L);
        return t;
    }
    cg_kernel(L, id, "pack_grad", dimn(O), 2, b, (const char *const[]){ "=t", "dy" })->grain = P;
    cg_body(L, "    /* dy is [N, %d, %d]; t is [%d, N*%d]; one (o, n) row per iteration */\n", O, P, O, P);
    cg_body(L, "    FOR_EACH(i, %s) {\n        long o = i / N, n = i %% N;\n"
               "        const float *src = dy + (n * %d + o) * %d;\n        float *dst = t + i * %d;\n"
               "        for (int p = 0; p < %d; p++) dst[p] = src[p];\n    }\n", cg_work_str(L, dimn(O)), O, P, P, P);
    cg_end_kernel(L);
    L->dyt[dy_node] = t;
    return t;
}

/* A grouped convolution's GEMM as a batch of one per group (Step.batch: cuBLAS's strided
   batched GEMM on GPUs, one GEMM after another on CPUs), each operand's groups sa, sb, sc
   floats apart: weights [O, C/G*K*K] by rows, im2col's columns [C*K*K, N*P] by rows,
   the products [O, N*P] by rows. */
static void group_batch(Step *s, const ConvGeom *G, Dim sa, Dim sb, Dim sc)
{
    if (G->groups <= 1) return;
    s->batch = G->groups;
    s->sa = sa, s->sb = sb, s->sc = sc;
}

/* Bytes of im2col columns per example up to which the forward's are kept for the weight gradient. */
#define CG_KEEP_COLUMNS 65536

/* x [N, C, H, W] -> col [C*K*K, N*OH*OW]: the input under each tap, for the GEMM (taps
   D apart when dilated; with groups, group g's rows are [g*C/G*K*K, (g+1)*C/G*K*K));
   GPUs under --precision bf16 store it rounded to bf16 (cg_packs_bf16) */
static int im2col(Lower *L, int id, int x_node, const ConvGeom *G)
{
    int C = G->C, H = G->H, W = G->W, K = G->K, S = G->S, Pd = G->P, OH = G->OH, OW = G->OW;
    const char *ky_d = cg_dilated(L, "ky", G->D), *kx_d = cg_dilated(L, "kx", G->D);
    long P = (long)OH * OW, CKK = (long)C * K * K;
    bool bf16 = cg_packs_bf16(L, id);
    int col = bf16 ? cg_new_bf16_buf(L, BUF_WORK, dimn(CKK * P), "im2col, rounded to bf16", id)
                   : cg_new_buf(L, BUF_WORK, dimn(CKK * P), "im2col", id);
    int b[2] = { col, buf_of(L, x_node) };
    if (!L->dec->cpu_only) {   /* GPUs: an element per thread (cg_rows_body) */
        cg_kernel(L, id, "im2col", cg_rows_work(dimn(CKK), P), 2, b, (const char *const[]){ "=col", "x" });
        cg_body(L, "    /* x is [N, %d, %d, %d]; col is [%d*%d*%d, N*%d*%d]%s, row (c, ky, kx), column (n, oy, ox);\n"
                   "       one element per iteration, (row, n) stretches of %ld columns */\n", C, H, W, C, K, K, OH, OW,
                bf16 ? " in bf16" : "", P);
        cg_rows_body(L, dimn(CKK), P,
                     arena_printf(L->p->arena, "        long r = row / N, n = row %% N;\n"
                                               "        int c = (int)(r / %d), ky = (int)(r / %d) %% %d, kx = (int)(r %% %d);\n",
                                  K * K, K, K, K),
                     arena_printf(L->p->arena, "{ int iy = at / %d * %d - %d + %s, ix = at %% %d * %d - %d + %s;\n"
                                               "          col[row * %ldL + at] = %siy >= 0 && iy < %d && ix >= 0 && ix < %d ? x[(n * %d + c) * %dL + iy * %d + ix] : 0.0f%s; }",
                                  OW, S, Pd, ky_d, OW, S, Pd, kx_d, P, bf16 ? "mgc_to_bf16(" : "", H, W, C, H * W, W, bf16 ? ")" : ""));
        cg_end_kernel(L);
        return col;
    }
    cg_kernel(L, id, "im2col", dimn(CKK), 2, b, (const char *const[]){ "=col", "x" })->grain = P;
    cg_body(L, "    /* x is [N, %d, %d, %d]; col is [%d*%d*%d, N*%d*%d], row (c, ky, kx), column (n, oy, ox);\n"
               "       one (row, n) stretch of %ld columns per iteration */\n", C, H, W, C, K, K, OH, OW, P);
    cg_text(L, "    FOR_EACH(i, $rows) {\n"
               "        long r = i / N, n = i % N;\n"
               "        int c = (int)(r / $KK), ky = (int)(r / $K) % $K, kx = (int)(r % $K);\n"
               "        const float *xp = x + (n * $C + c) * $HW;\n"
               "        float *cp = col + i * $P;\n"
               "        for (int oy = 0; oy < $OH; oy++) {\n"
               "            int iy = oy * $S - $Pd + $ky;\n"
               "            float *row = cp + oy * $OW;\n"
               "            if (iy < 0 || iy >= $H) { for (int ox = 0; ox < $OW; ox++) row[ox] = 0.0f; continue; }\n"
               "$copy"
               "        }\n    }\n",
            cg_s("rows", cg_work_str(L, dimn(CKK))), cg_n("KK", K * K), cg_n("K", K), cg_n("C", C), cg_n("HW", H * W), cg_n("P", P),
            cg_n("OH", OH), cg_n("S", S), cg_n("Pd", Pd), cg_s("ky", ky_d), cg_n("OW", OW), cg_n("H", H),
            cg_s("copy", Pd == 0 && S == 1
                /* no padding, stride 1: every row is a plain copy of OW inputs */
                ? arena_printf(L->p->arena, "            const float *xr = xp + iy * %d + %s;\n"
                                            "            for (int ox = 0; ox < %d; ox++) row[ox] = xr[ox];\n", W, kx_d, OW)
                : arena_printf(L->p->arena, "            for (int ox = 0; ox < %d; ox++) {\n"
                                            "                int ix = ox * %d - %d + %s;\n"
                                            "                row[ox] = ix >= 0 && ix < %d ? xp[iy * %d + ix] : 0.0f;\n"
                                            "            }\n", OW, S, Pd, kx_d, W, W)));
    cg_end_kernel(L);
    return col;
}

/* ---------------------------------------------------------- im2col + GEMM */

/* cg_take_ahead's: a later convolution's weight that gemm_weights would round (a parameter,
   or a weight made already), not made yet */
static int takes_weights(Lower *L, int c)
{
    const Node *n = &L->g->nodes[c];
    if (n->op != OP_CONV2D || cg_conv_form(L->dec, c) != CONV_GEMM || !cg_packs_bf16(L, c)) return -1;
    int w = n->in[1];
    return L->wbf[w] < 0 && (L->p->node_buf[w] >= 0 || L->g->nodes[w].op == OP_PARAM) ? w : -1;
}

/* A GEMM's weight operand: the weight itself, or on GPUs under --precision bf16 its copy
   rounded to bf16 (cuBLAS takes both operands in one type), made once: the forward's,
   kept for the layer's input gradient (the update comes after both). The copies of the
   weights of the next convolutions in that form are made by the same kernel, up to
   CG_MAXARGS / 2 a launch (a launch costs more than copying a small weight; the weights
   are the same all through the step's forward and backward). */
static int gemm_weights(Lower *L, int id, int w_node)
{
    if (!cg_packs_bf16(L, id)) return buf_of(L, w_node);
    if (L->wbf[w_node] >= 0) return L->wbf[w_node];
    const Graph *g = L->g;
    int ws[CG_MAXARGS / 2];
    int nw = cg_take_ahead(L, id, w_node, CG_MAXARGS / 2, takes_weights, ws);
    for (int k = 1; k < nw; k++) cg_lower_persistent(L, ws[k]);   /* a parameter not lowered yet: its buffer now */
    CgArgs a = { 0 };
    long count[CG_MAXARGS / 2];
    for (int k = 0; k < nw; k++) {
        Dim d = dim_of(&g->nodes[ws[k]].shape);
        count[k] = d.c;
        L->wbf[ws[k]] = cg_new_bf16_buf(L, BUF_WORK, d, "weights rounded to bf16", ws[k]);
        cg_arg(L, &a, L->wbf[ws[k]], "=wb%d", k);
        cg_arg(L, &a, buf_of(L, ws[k]), "w%d", k);
    }
    cg_group_kernel(L, id, "weights_bf16", &a, count, nw);
    cg_body(L, "    /* weights rounded to bf16, for their layers' GEMMs (the forward's and the input gradient's), one after another */\n");
    for (int k = 0; k < nw; k++) cg_group_piece(L, count[k], ws[k], "wb%d[i] = mgc_to_bf16(w%d[i]);", k, k);
    cg_end_kernel(L);
    return L->wbf[w_node];
}

/* x, w, bias? -> y: im2col, t[O, N*P] = w . col (GEMM), unpack into y with the bias */
void cg_conv_gemm_forward(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int O = G->O, K = G->K, OH = G->OH, OW = G->OW, Og = O / G->groups;
    long P = (long)OH * OW, CKK = (long)G->C / G->groups * K * K;   /* a group's */
    int col = im2col(L, id, n->in[0], G);
    L->col[id] = col;
    int t = cg_new_buf(L, BUF_WORK, dimn(O * P), "conv out transposed", id);
    Step *s = cg_gemm(L, id, false, false, dimc(Og), dimn(P), dimc(CKK), gemm_weights(L, id, n->in[1]), dimc(CKK), col, dimn(P), 0.0f, t,
                      dimn(P));
    group_batch(s, G, dimc(Og * CKK), dimn(CKK * P), dimn(Og * P));
    int y = cg_out_buf(L, id);
    bool bias = n->nin == 3;
    int b[3] = { y, t, bias ? buf_of(L, n->in[2]) : -1 };
    if (!L->dec->cpu_only) {   /* GPUs: an element per thread (cg_rows_body) */
        cg_conv_kernel(L, id, "conv2d_unpack", cg_rows_work(dimn(O), P), bias ? 3 : 2, b, (const char *const[]){ "=y", "t", "bias" });
        cg_body(L, "    /* t is [%d, N*%ld]; y is [N, %d, %ld]; one element per iteration, (n, o) planes */\n", O, P, O, P);
        cg_rows_body(L, dimn(O), P, arena_printf(L->p->arena, "        long n = row / %d, o = row %% %d;\n", O, O),
                     arena_printf(L->p->arena, "{ float v = t[(o * N + n) * %ldL + at] + %s; %s }", P,
                                  bias ? "bias[o]" : "0.0f", cg_store(L, id, "y", arena_printf(L->p->arena, "row * %ldL + at", P), "v")));
        cg_end_kernel(L);
        return;
    }
    cg_conv_kernel(L, id, "conv2d_unpack", dimn(O), bias ? 3 : 2, b, (const char *const[]){ "=y", "t", "bias" })->grain = P;
    cg_body(L, "    /* t is [%d, N*%ld]; y is [N, %d, %ld]; one (n, o) plane per iteration */\n", O, P, O, P);
    cg_body(L, "    FOR_EACH(i, %s) {\n        long n = i / %d, o = i %% %d;\n"
               "        const float *src = t + (o * N + n) * %ld;\n        float *dst = y + i * %ld;\n"
               "        const float b = %s;\n"
               "        for (int p = 0; p < %ld; p++) %s\n    }\n",
            cg_work_str(L, dimn(O)), O, O, P, P, bias ? "bias[o]" : "0.0f", P,
            cg_store(L, id, "dst", "p", "src[p] + b"));
    cg_end_kernel(L);
}
/* dy, x -> dw[O, CKK] = dyt . col^T (GEMM), with the forward's columns or new ones */
void cg_conv_gemm_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int fwd = n->grad_of;
    int Og = G->O / G->groups;
    long CKK = (long)G->C / G->groups * G->K * G->K, P = (long)G->OH * G->OW;   /* a group's */
    int t = transposed_grad(L, id, n->in[0]);
    /* The forward's columns are kept when small; big ones (ResNet) are made
       again here, so they need not live from the forward to the backward. */
    int col = L->col[fwd];
    if (col < 0 || CKK * G->groups * P * (long)sizeof(float) > CG_KEEP_COLUMNS || L->p->bufs[col].bf16 != cg_packs_bf16(L, id))
        col = im2col(L, id, n->in[1], G);   /* the forward's input (x) */
    int dw = cg_out_buf(L, id);
    Step *s = cg_gemm(L, id, false, true, dimc(Og), dimc(CKK), dimn(P), t, dimn(P), col, dimn(P), 0.0f, dw, dimc(CKK));
    group_batch(s, G, dimn(Og * P), dimn(CKK * P), dimc(Og * CKK));
}

/* dy, w -> dx: the columns' gradient by one GEMM, gathered back into the planes of dx
   (col2im). CONV_VECTOR takes it example-major from the channels-last gradient. */
static void gemm_grad_x(Lower *L, int id, const ConvGeom *G, ConvStrategy how)
{
    const Node *n = &L->g->nodes[id];
    int O = G->O, K = G->K, S = G->S, Pd = G->P;
    int C = G->C, H = G->H, W = G->W, OH = G->OH, OW = G->OW;
    long P = (long)OH * OW, CKK = (long)C * K * K;
    if (how == CONV_VECTOR) {
        /* With the gradient channels last (shared with the weight gradient), the columns'
           gradient comes out example by example: dcolT[N*P, CKK] = t[N*P, O] . W[O, CKK],
           and each example's block is gathered back into its planes while in cache. */
        int t = cg_conv_channels_last(L, id, n->in[0]);
        int dcol = cg_new_buf(L, BUF_WORK, dimn(CKK * P), "im2col gradient, example-major", id);
        cg_gemm(L, id, false, false, dimn(P), dimc(CKK), dimc(O), t, dimc(O), buf_of(L, n->in[1]), dimc(CKK), 0.0f, dcol, dimc(CKK));
        int dx = cg_out_buf(L, id);
        int b[2] = { dx, dcol };
        cg_kernel(L, id, "col2im_rows", dimn(C), 2, b, (const char *const[]){ "=dx", "dcol" })->grain = (long)H * W * K * K;
        cg_body(L, "    /* dcol is [N*%d*%d, %d*%d*%d]; dx is [N, %d, %d, %d]; stride %d, no padding;\n"
                   "       each iteration owns one (n, c) plane of dx */\n", OH, OW, C, K, K, C, H, W, S);
        cg_text(L, "    FOR_EACH(plane, $planes) {\n"
                   "        long n = plane / $C, c = plane % $C;\n"
                   "        float *dxp = dx + plane * $HW;\n"
                   "        for (int k = 0; k < $HW; k++) dxp[k] = 0.0f;\n"
                   "        for (int oy = 0; oy < $OH; oy++)\n"
                   "            for (int ox = 0; ox < $OW; ox++) {\n"
                   "                const float *cp = dcol + ((n * $OH + oy) * $OW + ox) * ${CKK}L + c * $KK;\n"
                   "                float *xp = dxp + (oy * $S) * $W + ox * $S;\n"
                   "                for (int ky = 0; ky < $K; ky++)\n"
                   "                    for (int kx = 0; kx < $K; kx++) xp[ky * $W + kx] += cp[ky * $K + kx];\n"
                   "            }\n    }\n",
                cg_s("planes", cg_work_str(L, dimn(C))), cg_n("C", C), cg_n("HW", H * W), cg_n("OH", OH), cg_n("OW", OW),
                cg_n("CKK", CKK), cg_n("KK", K * K), cg_n("S", S), cg_n("W", W), cg_n("K", K));
        cg_end_kernel(L);
        return;
    }
    int t = transposed_grad(L, id, n->in[0]);
    int dcol = cg_new_buf(L, BUF_WORK, dimn(CKK * P), "im2col gradient", id);
    long CKKg = CKK / G->groups;
    int Og = O / G->groups;
    Step *s = cg_gemm(L, id, true, false, dimc(CKKg), dimn(P), dimc(Og), gemm_weights(L, id, n->in[1]), dimc(CKKg), t, dimn(P), 0.0f, dcol,
                      dimn(P));
    group_batch(s, G, dimc(Og * CKKg), dimn(Og * P), dimn(CKKg * P));
    const char *ky_d = cg_dilated(L, "ky", G->D), *kx_d = cg_dilated(L, "kx", G->D);
    int dx = cg_out_buf(L, id);
    int b[2] = { dx, dcol };
    if (!L->dec->cpu_only) {
        /* GPUs: a thread per element of dx, the sum of its taps' columns, taps in the
           order the CPU's loops add them (the same sum) */
        cg_kernel(L, id, "col2im", cg_rows_work(dimn(C), (long)H * W), 2, b, (const char *const[]){ "=dx", "dcol" });
        cg_body(L, "    /* dcol is [%d*%d*%d, N*%d*%d]; dx is [N, %d, %d, %d]; one element of dx per iteration, (n, c) planes */\n",
                C, K, K, OH, OW, C, H, W);
        cg_rows_body(L, dimn(C), (long)H * W, arena_printf(L->p->arena, "        long n = row / %d, c = row %% %d;\n", C, C),
                     cg_str(L, "{ int iy = at / $W, ix = at % $W;\n"
                               "          float s = 0.0f;\n"
                               "          for (int ky = 0; ky < $K; ky++) {\n"
                               "              int ty = iy + $Pd - $ky;\n"
                               "              if (ty < 0 || ty % $S || ty / $S >= $OH) continue;\n"
                               "              for (int kx = 0; kx < $K; kx++) {\n"
                               "                  int tx = ix + $Pd - $kx;\n"
                               "                  if (tx < 0 || tx % $S || tx / $S >= $OW) continue;\n"
                               "                  s += dcol[((c * $K + ky) * $K + kx) * (N * ${P}L) + n * ${P}L + (ty / $S) * $OW + tx / $S];\n"
                               "              }\n"
                               "          }\n"
                               "          dx[row * ${HW}L + at] = s; }",
                            cg_n("W", W), cg_n("K", K), cg_n("Pd", Pd), cg_s("ky", ky_d), cg_s("kx", kx_d), cg_n("S", S), cg_n("OH", OH),
                            cg_n("OW", OW), cg_n("P", P), cg_n("HW", H * W)));
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "col2im", dimn(C), 2, b, (const char *const[]){ "=dx", "dcol" })->grain = (long)H * W * K * K;
    cg_body(L, "    /* dcol is [%d*%d*%d, N*%d*%d]; dx is [N, %d, %d, %d]; each iteration owns one (n, c) plane of dx */\n",
            C, K, K, OH, OW, C, H, W);
    cg_text(L, "    FOR_EACH(plane, $planes) {\n"
               "        long n = plane / $C, c = plane % $C;\n"
               "        float *dxp = dx + plane * $HW;\n"
               "        for (int k = 0; k < $HW; k++) dxp[k] = 0.0f;\n"
               "        for (int ky = 0; ky < $K; ky++)\n"
               "            for (int kx = 0; kx < $K; kx++) {\n"
               "                const float *cp = dcol + ((c * $K + ky) * $K + kx) * (N * $P) + n * $P;\n"
               "$rows"
               "            }\n    }\n",
            cg_s("planes", cg_work_str(L, dimn(C))), cg_n("C", C), cg_n("HW", H * W), cg_n("K", K), cg_n("P", P),
            cg_s("rows", Pd == 0 && S == 1
                /* no padding, stride 1: every row adds into a contiguous stretch of dx */
                ? arena_printf(L->p->arena, "                for (int oy = 0; oy < %d; oy++) {\n"
                                            "                    float *xr = dxp + (oy + %s) * %d + %s;\n"
                                            "                    const float *cr = cp + oy * %d;\n"
                                            "                    for (int ox = 0; ox < %d; ox++) xr[ox] += cr[ox];\n"
                                            "                }\n", OH, ky_d, W, kx_d, OW, OW)
                : arena_printf(L->p->arena, "                for (int oy = 0; oy < %d; oy++) {\n"
                                            "                    int iy = oy * %d - %d + %s;\n"
                                            "                    if (iy < 0 || iy >= %d) continue;\n"
                                            "                    for (int ox = 0; ox < %d; ox++) {\n"
                                            "                        int ix = ox * %d - %d + %s;\n"
                                            "                        if (ix >= 0 && ix < %d) dxp[iy * %d + ix] += cp[oy * %d + ox];\n"
                                            "                    }\n"
                                            "                }\n", OH, S, Pd, ky_d, H, OW, S, Pd, kx_d, W, W, OW)));
    cg_end_kernel(L);
}

void cg_conv_gemm_grad_x(Lower *L, int id, const ConvGeom *G) { gemm_grad_x(L, id, G, CONV_GEMM); }
void cg_conv_vector_grad_x(Lower *L, int id, const ConvGeom *G) { gemm_grad_x(L, id, G, CONV_VECTOR); }

/* ------------------------------------------------------------- dense over the map */

/* Whether every input position is joined to every output position by a tap
   (a 2x2 map under a 3x3 kernel with padding 1): wd then has no zero. */
static bool all_joined(const ConvGeom *G)
{
    for (long o = 0; o < G->OH; o++)
        for (long i = 0; i < G->H; i++)
            if (i - o * G->S + G->P < 0 || i - o * G->S + G->P >= G->K) return false;
    for (long o = 0; o < G->OW; o++)
        for (long i = 0; i < G->W; i++)
            if (i - o * G->S + G->P < 0 || i - o * G->S + G->P >= G->K) return false;
    return true;
}

/* w [O, C, K, K] -> wd [O*P, C*HW]: tap (ky, kx) of w where it joins input
   position (iy, ix) to output (oy, ox) (iy = oy*S - pad + ky, ...), else 0:
   the weight of a linear layer from the input map to the output map (rows
   output-major, like linear's [out, in], so that a row reads one block of w:
   the other order gathered w with a stride of C*K*K floats, a cache line per
   float, 1.2 ms a step for one of ResNet-18's 512-channel layers). Made each
   step, by the forward (the gradients read it: w does not change until the
   update). */
static int dense_weights(Lower *L, int id, int w_node, const ConvGeom *G)
{
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, Pd = G->P, OW = G->OW;
    long HW = (long)H * W, P = (long)G->OH * G->OW, CHW = C * HW;
    int wd = cg_new_buf(L, BUF_WORK, dimc(CHW * O * P), "conv weights over the whole map", id);
    int b[2] = { wd, buf_of(L, w_node) };
    if (!L->dec->cpu_only) {
        /* GPUs: a thread per element of wd, each its tap or 0. A row per thread (the CPU's
           form, below) gives a 512-channel layer 512 to 2048 threads, each writing
           rows of 2048 to 8192 floats: the cost model (codegen/cost.c) put four such
           kernels at 45% of ResNet-18's step on an H200. */
        cg_kernel(L, id, "conv2d_dense_weights", dimc(CHW * O * P), 2, b, (const char *const[]){ "=wd", "w" });
        cg_body(L, "    /* w [%d, %d, %d, %d] -> wd [%d*%ld, %d*%ld]; stride %d, padding %d; one element per iteration */\n", O, C, K, K, O, P, C,
                HW, S, Pd);
        cg_text(L, "    FOR_EACH(e, ${all}L) {\n"
                   "        long r = e / ${CHW}L, j = e % ${CHW}L;   /* row (o, oy, ox), column (c, iy, ix) */\n"
                   "        long o = r / $P, oy = (r % $P) / $OW, ox = r % $OW;\n"
                   "        long c = j / $HW, iy = (j % $HW) / $W, ix = j % $W;\n"
                   "        long ky = iy - oy * $S + $Pd, kx = ix - ox * $S + $Pd;\n"
                   "        wd[e] = ky >= 0 && ky < $K && kx >= 0 && kx < $K ? w[(o * $C + c) * $KK + ky * $K + kx] : 0.0f;\n"
                   "    }\n",
                cg_n("all", CHW * O * P), cg_n("CHW", CHW), cg_n("P", P), cg_n("OW", OW), cg_n("HW", HW), cg_n("W", W), cg_n("S", S),
                cg_n("Pd", Pd), cg_n("K", K), cg_n("C", C), cg_n("KK", K * K));
        cg_end_kernel(L);
        return wd;
    }
    cg_kernel(L, id, "conv2d_dense_weights", dimc(O * P), 2, b, (const char *const[]){ "=wd", "w" })->grain = CHW;
    cg_body(L, "    /* w [%d, %d, %d, %d] -> wd [%d*%ld, %d*%ld]; stride %d, padding %d; one row (o, output position) per iteration */\n",
            O, C, K, K, O, P, C, HW, S, Pd);
    /* Zero the row, then store each tap that lands on the plane: a conditional load
       per element (row[j] = tap in bounds ? w[...] : 0) was vectorised by GCC 12 at
       -O3 -march=native into wrong values (checked on a stride-2 layer); stores need no gather. */
    cg_text(L, "    FOR_EACH(r, ${OP}L) {\n"
               "        long o = r / $P, oy = (r % $P) / $OW, ox = r % $OW;\n"
               "        float *row = wd + r * ${CHW}L;\n"
               "        const float *wc = w + o * ${CKK}L;\n"
               "$zero"
               "        for (int c = 0; c < $C; c++, row += $HW, wc += $KK)\n"
               "            for (int ky = 0; ky < $K; ky++) {\n"
               "                long iy = oy * $S - $Pd + ky;\n"
               "                if (iy < 0 || iy >= $H) continue;\n"
               "                for (int kx = 0; kx < $K; kx++) {\n"
               "                    long ix = ox * $S - $Pd + kx;\n"
               "                    if (ix >= 0 && ix < $W) row[iy * $W + ix] = wc[ky * $K + kx];\n"
               "                }\n"
               "            }\n    }\n",
            cg_n("OP", O * P), cg_n("P", P), cg_n("OW", OW), cg_n("CHW", CHW), cg_n("CKK", (long)C * K * K),
            cg_s("zero", all_joined(G) ? "        /* every tap of every output lands on the plane: each element is written below */\n"
                                       : cg_str(L, "        for (long j = 0; j < ${CHW}L; j++) row[j] = 0.0f;\n", cg_n("CHW", CHW))),
            cg_n("C", C), cg_n("HW", HW), cg_n("KK", K * K), cg_n("K", K), cg_n("S", S), cg_n("Pd", Pd), cg_n("H", H), cg_n("W", W));
    cg_end_kernel(L);
    return wd;
}

/* x, w, bias? -> y[N, O*P] = x[N, C*HW] . wd^T (GEMM straight into y), then the bias and a fused relu */
void cg_conv_dense_forward(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    long HW = (long)G->H * G->W, P = (long)G->OH * G->OW, CHW = G->C * HW, OP = G->O * P;
    int wd = dense_weights(L, id, n->in[1], G);
    L->col[id] = wd;
    int y = cg_out_buf(L, id);
    cg_gemm(L, id, false, true, dimn(1), dimc(OP), dimc(CHW), buf_of(L, n->in[0]), dimc(CHW), wd, dimc(CHW), 0.0f, y, dimc(OP));
    bool bias = n->nin == 3, act = cg_act(L->dec, id) >= 0;
    if (!bias && !act) return;
    int b[2] = { y, bias ? buf_of(L, n->in[2]) : -1 };
    if (!L->dec->cpu_only) {   /* GPUs: an element per thread (cg_rows_body) */
        cg_conv_kernel(L, id, "conv2d_dense_epilogue", cg_rows_work(dimn(G->O), P), bias ? 2 : 1, b, (const char *const[]){ "=y", "bias" });
        cg_body(L, "    /* y is [N, %d, %ld]; an element per iteration */\n", G->O, P);
        cg_rows_body(L, dimn(G->O), P, arena_printf(L->p->arena, "        float *yp = y + row * %ldL + at;\n", P),
                     arena_printf(L->p->arena, "float v = *yp + %s; %s",
                                  bias ? arena_printf(L->p->arena, "bias[row %% %d]", G->O) : "0.0f",
                                  cg_store(L, id, "yp", "0", "v")));
        cg_end_kernel(L);
        return;
    }
    cg_conv_kernel(L, id, "conv2d_dense_epilogue", dimn(G->O), bias ? 2 : 1, b, (const char *const[]){ "=y", "bias" })->grain = P;
    cg_body(L, "    /* y is [N, %d, %ld]; one (n, o) plane per iteration */\n", G->O, P);
    cg_body(L, "    FOR_EACH(i, %s) {\n        float *yp = y + i * %ld;\n        const float b = %s;\n"
               "        for (int p = 0; p < %ld; p++) { float v = yp[p] + b; %s }\n    }\n",
            cg_work_str(L, dimn(G->O)), P, bias ? arena_printf(L->p->arena, "bias[i %% %d]", G->O) : "0.0f", P,
            cg_store(L, id, "yp", "p", "v"));
    cg_end_kernel(L);
}

/* dy, w -> dx[N, C*HW] = dy[N, O*P] . wd (GEMM), with the forward's wd */
void cg_conv_dense_grad_x(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    long CHW = (long)G->C * G->H * G->W, OP = (long)G->O * G->OH * G->OW;
    int wd = n->grad_of >= 0 ? L->col[n->grad_of] : -1;   /* none for a conv_transpose2d layer's forward */
    if (wd < 0) wd = dense_weights(L, id, n->in[1], G);
    int dx = cg_out_buf(L, id);
    cg_gemm(L, id, false, false, dimn(1), dimc(CHW), dimc(OP), buf_of(L, n->in[0]), dimc(OP), wd, dimc(CHW), 0.0f, dx, dimc(CHW));
}

/* dy, x -> dwd[O*P, C*HW] = dy^T . x (GEMM), then dw[o, c, ky, kx] = the sum of dwd where that tap joins */
void cg_conv_dense_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, Pd = G->P, OH = G->OH, OW = G->OW;
    long HW = (long)H * W, P = (long)OH * OW, CHW = C * HW, OP = O * P;
    int dwd = cg_new_buf(L, BUF_WORK, dimc(CHW * OP), "conv weight gradient over the whole map", id);
    cg_gemm(L, id, true, false, dimc(OP), dimc(CHW), dimn(1), buf_of(L, n->in[0]), dimc(OP), buf_of(L, n->in[1]), dimc(CHW),
            0.0f, dwd, dimc(CHW));
    int b[2] = { cg_out_buf(L, id), dwd };
    if (!L->dec->cpu_only) {   /* GPUs: a thread per tap (o, c, ky, kx), its sum in the same order */
        cg_kernel(L, id, "conv2d_dense_grad_w", dimc((long)O * C * K * K), 2, b, (const char *const[]){ "=dw", "dwd" })->grain = P;
        cg_body(L, "    /* dwd [%d*%ld, %d*%ld] -> dw [%d, %d, %d, %d]: each tap's sum over the output positions it reaches\n"
                   "       (in their order); a tap per iteration */\n", O, P, C, HW, O, C, K, K);
        cg_text(L, "    FOR_EACH(e_, ${taps}L) {\n"
                   "        long i = e_ / $KK, o = i / $C, c = i % $C;\n"
                   "        int ky = (int)(e_ % $KK) / $K, kx = (int)(e_ % $KK) % $K;\n"
                   "        float acc = 0.0f;\n"
                   "        for (int oy = 0; oy < $OH; oy++) {\n"
                   "            int iy = oy * $S - $Pd + ky;\n"
                   "            if (iy < 0 || iy >= $H) continue;\n"
                   "            for (int ox = 0; ox < $OW; ox++) {\n"
                   "                int ix = ox * $S - $Pd + kx;\n"
                   "                if (ix >= 0 && ix < $W) acc += dwd[(o * ${P}L + oy * $OW + ox) * ${CHW}L + c * ${HW}L + iy * $W + ix];\n"
                   "            }\n"
                   "        }\n"
                   "        dw[e_] = acc;\n"
                   "    }\n",
                cg_n("taps", (long)O * C * K * K), cg_n("KK", K * K), cg_n("C", C), cg_n("K", K), cg_n("OH", OH), cg_n("S", S),
                cg_n("Pd", Pd), cg_n("H", H), cg_n("OW", OW), cg_n("W", W), cg_n("P", P), cg_n("CHW", CHW), cg_n("HW", HW));
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "conv2d_dense_grad_w", dimc((long)O * C), 2, b, (const char *const[]){ "=dw", "dwd" })->grain = (long)K * K * P;
    cg_body(L, "    /* dwd [%d*%ld, %d*%ld] -> dw [%d, %d, %d, %d]: each tap's sum over the output positions it reaches\n"
               "       (in their order); one (o, c) pair per iteration, its rows of dwd read once */\n", O, P, C, HW, O, C, K, K);
    cg_text(L, "    FOR_EACH(i, ${OC}L) {\n"
               "        long o = i / $C, c = i % $C;\n"
               "        float acc[$KK] = { 0.0f };\n"
               "        for (int oy = 0; oy < $OH; oy++)\n"
               "            for (int ox = 0; ox < $OW; ox++) {\n"
               "                const float *drow = dwd + (o * ${P}L + oy * $OW + ox) * ${CHW}L + c * ${HW}L;\n"
               "                for (int iy = 0; iy < $H; iy++) {\n"
               "                    int ky = iy - oy * $S + $Pd;\n"
               "                    if (ky < 0 || ky >= $K) continue;\n"
               "                    for (int ix = 0; ix < $W; ix++) {\n"
               "                        int kx = ix - ox * $S + $Pd;\n"
               "                        if (kx >= 0 && kx < $K) acc[ky * $K + kx] += drow[iy * $W + ix];\n"
               "                    }\n"
               "                }\n"
               "            }\n"
               "        for (int k = 0; k < $KK; k++) dw[i * $KK + k] = acc[k];\n"
               "    }\n",
            cg_n("OC", O * C), cg_n("C", C), cg_n("KK", K * K), cg_n("OH", OH), cg_n("OW", OW), cg_n("P", P), cg_n("CHW", CHW),
            cg_n("HW", HW), cg_n("H", H), cg_n("S", S), cg_n("Pd", Pd), cg_n("K", K), cg_n("W", W));
    cg_end_kernel(L);
}

