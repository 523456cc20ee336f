/*
** CONV_CHUNKED: im2col + GEMM a few examples at a time, C target only (the
** kernels call CBLAS on their own thread), so that the chunk's columns stay
** in cache between their im2col and their GEMM (codegen/conv.c chooses it
** and describes every form):
**   conv2d  per chunk: im2col -> col; t = W . col; y = t + b (one kernel)
**   grad    per chunk: t = dy's planes; dcol = W^T . t; col2im into dx
**           dW: CG_WGROUPS groups of examples, each dWg += t . col^T chunk
**           after chunk, then dW = their sum in group order (a second kernel)
** In an evaluation program a 1x1 layer (stride 1, no padding) on maps of 16
** positions or more is a GEMM per example straight from x into y (mgc_gemm_nn,
** nothing packed), the bias and the fused activation applied in place
** (conv2d_pointwise): no columns to copy.
** Grouped convolutions (w [O, C/groups, K, K]) run one GEMM per group on
** the group's rows of the same columns (im2col's rows are channel-major, so a
** group's are contiguous); dilation D spaces the taps D apart in im2col and
** col2im. Nothing whole-batch is materialised. With fusion, a forward followed by
** BatchNorm also sums each chunk's statistics while its output is in cache
** (cg_chunk_stats; norm.c's cg_lower_bn_stats_chunks combines them).
*/
#include "lower_internal.h"

/* The columns of one chunk of examples, at most about this many floats
   (640 KB): they stay in the core's L2 cache between their im2col and their
   GEMM, where CONV_GEMM's columns for the whole batch (29 MB for one of
   ResNet-18's 64-channel layers) go out to memory and back. */
#define CG_CHUNK_FLOATS (160L << 10)

int cg_chunk_examples(const ConvGeom *G)
{
    long per = (long)G->C * G->K * G->K * G->OH * G->OW;
    long nb = CG_CHUNK_FLOATS / (per > 0 ? per : 1);
    return nb < 1 ? 1 : nb > 64 ? 64 : (int)nb;
}

/* Floats of a padded copy of one input plane (0 without padding: the plane itself serves). */
static long pad_floats(const ConvGeom *G) { return G->P > 0 ? ((long)G->H + 2 * G->P) * ((long)G->W + 2 * G->P) : 0; }

/* The body's loop over im2col rows [r0, r1) of the chunk's examples n0 ..
   n0+nb-1: col[(r - r0) * ld + j * P + p], ld = nb * P. Each input plane is
   read once, into `pad` (the kernel's scratch, pad_floats() of it) with a
   zero border when padded: every tap's row is then plain copies of OW inputs
   (S apart), with no test per element. */
static void chunk_im2col(Lower *L, const ConvGeom *G, const char *r0, const char *r1)
{
    int C = G->C, H = G->H, W = G->W, K = G->K, S = G->S, Pd = G->P, OH = G->OH, OW = G->OW, D = G->D;
    long Wp = (long)W + 2 * Pd, KK = (long)K * K;
    cg_body(L, "        {   /* im2col: rows [%s, %s) of the chunk's columns, row (c, ky, kx)%s */\n", r0, r1,
            D > 1 ? arena_printf(L->p->arena, "; taps %d apart (dilation)", D) : "");
    if (Pd > 0)
        cg_body(L, "            for (long i = 0; i < %ldL; i++) pad[i] = 0.0f;   /* the border stays zero */\n", pad_floats(G));
    cg_body(L, "            for (int j = 0; j < nb; j++)\n"
               "                for (long c = (%s) / %ld; c * %ld < (%s); c++) {\n"
               "                    const float *xp = x + ((n0 + j) * %d + c) * %d;\n",
            r0, KK, KK, r1, C, H * W);
    if (Pd > 0)
        cg_body(L, "                    for (int iy = 0; iy < %d; iy++)\n"
                   "                        for (int ix = 0; ix < %d; ix++) pad[(iy + %d) * %ldL + %d + ix] = xp[iy * %d + ix];\n"
                   "                    const float *src = pad;\n", H, W, Pd, Wp, Pd, W);
    else
        cg_body(L, "                    const float *src = xp;\n");
    cg_body(L, "                    for (int t = 0; t < %ld; t++) {\n"
               "                        long r = c * %ld + t;\n"
               "                        if (r < (%s) || r >= (%s)) continue;\n"
               "                        int ky = t / %d, kx = t %% %d;\n"
               "                        float *row = col + (r - (%s)) * ld + j * %d;\n",
            KK, KK, r0, r1, K, K, r0, OH * OW);
    /* Short rows with stride 1 (ResNet-18's 7x7 and 4x4 maps): each output row but
       the last as one 8-float load and store, whose tail the next row's store
       overwrites, the last row by its own width; the loads stay in the padded plane
       (or the input plane, where its rows are long enough). GCC made the rows of 7
       scalar copies: stage 1's forward im2col 1.6 -> 1.3 ms a step on one thread; the rest is
       writing the columns. */
    if (S == 1 && D == 1 && OW >= 4 && OW < 8 && OH >= 2 && (Pd > 0 || K + 7 <= 2 * W))
        cg_body(L, "                        for (int oy = 0; oy < %d; oy++) {   /* rows of %d in 8-float stores */\n"
                   "                            mgc_f8 v = mgc_load8(src + (oy + ky) * %ldL + kx);\n"
                   "                            __builtin_memcpy(row + oy * %d, &v, sizeof v);\n"
                   "                        }\n"
                   "                        __builtin_memcpy(row + %d, src + %ldL + ky * %ldL + kx, %d * sizeof(float));\n"
                   "                    }\n"
                   "                }\n"
                   "        }\n",
                OH - 1, OW, Wp, OW, (OH - 1) * OW, (OH - 1) * Wp, Wp, OW);
    else
        cg_body(L, "                        for (int oy = 0; oy < %d; oy++) {\n"
                   "                            const float *sp = src + (oy * %d + %s) * %ldL + %s;\n"
                   "                            float *dp = row + oy * %d;\n"
                   "                            for (int ox = 0; ox < %d; ox++) dp[ox] = sp[ox * %d];\n"
                   "                        }\n"
                   "                    }\n"
                   "                }\n"
                   "        }\n",
                OH, S, cg_dilated(L, "ky", D), Wp, cg_dilated(L, "kx", D), OW, OW, S);
}

/* One CBLAS GEMM, or one per group: the arguments of cblas_sgemm after its
   layout and transposes, with each matrix's group offset (`*_step` floats per
   group, 0: shared) added to its pointer inside a loop over the groups. */
static void group_gemm(Lower *L, int groups, const char *ta, const char *tb, const char *m, const char *n, const char *k,
                       const char *a, const char *a_step, const char *lda, const char *b, const char *b_step, const char *ldb,
                       const char *beta, const char *c, const char *c_step, const char *ldc, const char *indent)
{
    if (groups == 1) {
        cg_body(L, "%s%s(MGC_ROW_MAJOR, %s, %s, %s, %s, %s, 1.0f, %s, %s, %s, %s, %s, %s, %s);\n",
                indent, cg_sgemm_fn(L), ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    cg_body(L, "%sfor (int g = 0; g < %d; g++)   /* a GEMM per group */\n"
               "%s    %s(MGC_ROW_MAJOR, %s, %s, %s, %s, %s, 1.0f, %s + g * (%s), %s, %s + g * (%s), %s, %s, %s + g * (%s), %s);\n",
            indent, groups, indent, cg_sgemm_fn(L), ta, tb, m, n, k, a, a_step, lda, b, b_step, ldb, beta, c, c_step, ldc);
}

/* The chunk's gradient dy (examples n0 .. n0+nb-1) as t[O, ld]: row o holds
   each example's plane o side by side. */
static void chunk_pack_grad(Lower *L, const ConvGeom *G)
{
    long P = (long)G->OH * G->OW;
    cg_body(L, "        for (int j = 0; j < nb; j++)   /* dy's planes, output channel major */\n"
               "            for (int o = 0; o < %d; o++) {\n"
               "                const float *src = dy + ((n0 + j) * %d + o) * %ldL;\n"
               "                float *dst = t + o * ld + j * %ldL;\n"
               "                for (int p = 0; p < %ld; p++) dst[p] = src[p];\n"
               "            }\n", G->O, G->O, P, P, P);
}

/* The chunked forward's and input gradient's scratch and loop: `cols` (the
   chunk's columns or their gradient, [CKK, nb*P]), t ([O, nb*P]) and pad (one
   padded plane) in one allocation, then one chunk of examples n0 ..
   n0+nb-1 per iteration, ld = nb * P. */
static void chunk_loop(Lower *L, const ConvGeom *G, const char *fn, const char *cols, long pad)
{
    int NB = cg_chunk_examples(G);
    long P = (long)G->OH * G->OW, CKK = (long)G->C * G->K * G->K;
    cg_body(L, "    float *%s = mgc_scratch(%ldL * %d + %ldL, \"%s\"), *t = %s + %ldL * %d, *pad = t + %ldL * %d;\n"
               "    (void)pad;\n",
            cols, (CKK + G->O) * P, NB, pad, fn, cols, CKK * P, NB, G->O * P, NB);
    if (pad > pad_floats(G))   /* col2im's rows, zero-bordered: the borders are never written */
        cg_body(L, "    for (long i = 0; i < %ldL; i++) pad[i] = 0.0f;\n", pad);
    cg_body(L, "    FOR_EACH(ch, (N + %d) / %d) {\n"
               "        long n0 = ch * %d;\n"
               "        int nb = N - n0 < %d ? (int)(N - n0) : %d, ld = nb * %ld;\n",
            NB - 1, NB, NB, NB, NB, P);
}

/* Whether convolution id runs as a pointwise GEMM per example (cg_conv_chunked_forward): 1x1, stride 1, no
   padding, groups or dilation, in an evaluation graph (no statistics summed), with at least 8 output
   channels and 16 positions (mgc_gemm_nn's blocks; on fewer, a GEMM is better batched, as the chunks
   do). MobileNetV2: see docs/benchmarks.md. */
static bool pointwise_forward(const Lower *L, int id, const ConvGeom *G, int stats)
{
    (void)id;
    return !L->g->training && stats < 0 && G->K == 1 && G->S == 1 && G->P == 0 && G->groups == 1 && G->D == 1 &&
           (long)G->OH * G->OW >= 16 && G->O >= 8;
}

/* The pointwise form's kernel: each example's y = w . x straight from x into y (im2col of a 1x1 layer
   is a copy, and t another), mgc_gemm_nn's blocks, the work split one of three ways:
   - panels, where the weights are at most CG_PW_SMALL floats (w stays in cache whole) and the map has
     CG_PW_PANEL positions or more: an example's columns in panels of CG_PW_PANEL (the last takes the
     rest), each panel all O rows, so that a panel of x is read from cache by every block of rows (a
     block of rows a pass over the whole map read x from memory again); the threads share one
     example's panels;
   - rows, larger weights and O a multiple of 8: blocks of 8 output channels, each for every example
     in turn (its 8 x C weights stay in cache); the threads share one example's blocks;
   - else the whole GEMM an example.
   The bias and activation on each block's sums in registers (MGC_GEMM_NN_EPI) where the activation
   has a vector form (cg_store_vec), else a pass over the rows just stored. */
#define CG_PW_SMALL 8192
#define CG_PW_PANEL 64

static void pointwise_kernel(Lower *L, int id, const ConvGeom *G, int nargs, const int *b, const char *const *names, bool bias)
{
    Arena *a = L->p->arena;
    int C = G->C, O = G->O;
    long P = (long)G->OH * G->OW;
    bool panels = (long)O * C <= CG_PW_SMALL && P >= CG_PW_PANEL, rows = !panels && O % 8 == 0;
    bool epi = bias || cg_act(L->dec, id) >= 0;
    const char *vec = epi ? cg_store_vec(L, id) : NULL;
    bool three = rows && (vec || !epi);   /* three examples at once (MGC_GEMM_NN_EPI3) */
    long np = panels ? P / CG_PW_PANEL : 1;
    Step *sp = cg_conv_kernel(L, id, "conv2d_pointwise", dimn(panels ? np : rows ? O / 8 : 1), nargs, b, names);
    sp->heavy = sp->c_only = true;
    cg_text(L, "    /* x [N, $C, $P], w [$O, $C], y [N, $O, $P]: per example y = w . x (mgc_gemm_nn: x's rows\n"
               "       read in place, nothing packed), $how$then */\n",
            cg_n("C", C), cg_n("P", P), cg_n("O", O),
            cg_s("how", panels ? arena_printf(a, "in panels of %d columns, each all %d rows", CG_PW_PANEL, O)
                        : three ? "in blocks of 8 channels,\n       each block for every example in turn, three examples at once"
                        : rows  ? "in blocks of 8 channels,\n       each block for every example in turn"
                               : "the whole GEMM an example"),
            cg_s("then", !epi ? "" : vec ? ";\n       bias and activation on the sums in registers" : ";\n       then bias and activation in place"));
    /* the loop's head: the block's rows M and columns cols, its A, B and C, the bias's first row (three
       examples' second and third: xn2, yn2 and xn3, yn3) */
    const char *M = "8", *cols = arena_printf(a, "%ld", P), *A = "w", *B = arena_printf(a, "x + n * %ldL", (long)C * P),
               *Cp = "yn", *row0 = "0";
    if (panels) {
        cg_text(L, "    FOR_EACH(i, $work) {\n"
                   "        const long n = i / $np, j0 = i % $np * $PANEL;\n"
                   "        const int cols = i % $np == $np - 1 ? (int)($P - j0) : $PANEL;\n"
                   "        float *yn = y + n * ${OP}L + j0;\n",
                cg_s("work", cg_work_str(L, dimn(np))), cg_n("np", np), cg_n("PANEL", CG_PW_PANEL), cg_n("P", P),
                cg_n("OP", (long)O * P));
        M = arena_printf(a, "%d", O), cols = "cols", B = arena_printf(a, "x + n * %ldL + j0", (long)C * P);
    } else if (three) {
        cg_text(L, "    FOR_EACH(i, ${blocks}L * ((N + 2) / 3)) {\n"
                   "        const long ob = i / ((N + 2) / 3), n = i % ((N + 2) / 3) * 3;\n"
                   "        float *yn = y + n * ${OP}L + ob * ${MP}L, *yn2 = n + 1 < N ? yn + ${OP}L : 0, *yn3 = n + 2 < N ? yn + 2 * ${OP}L : 0;\n"
                   "        const float *xn2 = n + 1 < N ? x + (n + 1) * ${CP}L : 0, *xn3 = n + 2 < N ? x + (n + 2) * ${CP}L : 0;\n",
                cg_n("blocks", O / 8), cg_n("OP", (long)O * P), cg_n("MP", 8L * P), cg_n("CP", (long)C * P));
        A = arena_printf(a, "w + ob * %ldL", 8L * C), row0 = "ob * 8";
    } else if (rows) {
        cg_text(L, "    FOR_EACH(i, $work) {\n"
                   "        const long ob = i / N, n = i % N;\n"
                   "        float *yn = y + n * ${OP}L + ob * ${MP}L;\n",
                cg_s("work", cg_work_str(L, dimn(O / 8))), cg_n("OP", (long)O * P), cg_n("MP", 8L * P));
        A = arena_printf(a, "w + ob * %ldL", 8L * C), row0 = "ob * 8";
    } else {
        cg_text(L, "    FOR_EACH(n, N) {\n"
                   "        float *yn = y + n * ${OP}L;\n", cg_n("OP", (long)O * P));
        M = arena_printf(a, "%d", O);
    }
    if (vec || !epi)
        cg_text(L, "#define MGC_ACT(v) ($vec)\n"
                   "#define MGC_EPI(s, r) MGC_ACT($sum)\n"
                   "        $call;\n"
                   "#undef MGC_EPI\n"
                   "#undef MGC_ACT\n",
                cg_s("vec", vec ? vec : "v"), cg_s("sum", bias ? arena_printf(a, "((s) + bias[%s + (r)])", row0) : "(s)"),
                cg_s("call", three ? arena_printf(a, "MGC_GEMM_NN_EPI3(%s, %s, %d, %s, %d, %s, xn2, xn3, %ld, %s, yn2, yn3, %ld, MGC_EPI)", M, cols,
                                                  C, A, C, B, P, Cp, P)
                                  : arena_printf(a, "MGC_GEMM_NN_EPI(%s, %s, %d, %s, %d, %s, %ld, %s, %ld, MGC_EPI)", M, cols, C, A, C, B,
                                                 P, Cp, P)));
    else
        cg_text(L, "        mgc_gemm_nn($M, $cols, $C, $A, $C, $B, $P, $Cp, $P);\n"
                   "        for (int o = 0; o < $M; o++) {\n"
                   "            float *yo = yn + o * ${P}L;\n"
                   "            const float b = $b;\n"
                   "            for (int p = 0; p < $cols; p++) $store\n"
                   "        }\n",
                cg_s("M", M), cg_s("cols", cols), cg_n("C", C), cg_s("A", A), cg_s("B", B), cg_n("P", P), cg_s("Cp", Cp),
                cg_s("b", bias ? arena_printf(a, "bias[%s + o]", row0) : "0.0f"), cg_s("store", cg_store(L, id, "yo", "p", "yo[p] + b")));
    cg_body(L, "    }\n");
    cg_end_kernel(L);
}

/* x, w, bias? -> y: per chunk of examples, im2col into scratch, t[O, nb*P] = w . col
   (CBLAS, this thread), and y = t + bias (and a fused relu) */
void cg_conv_chunked_forward(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, NB = cg_chunk_examples(G);
    long P = (long)G->OH * G->OW, CKK = (long)C * K * K;
    bool bias = n->nin == 3;
    int stats = cg_stats_of(L->dec, id);   /* the bn_stats node whose partial sums this kernel writes, or -1 */
    int b[5] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), -1, -1 };
    const char *names[5] = { "=y", "x", "w", NULL, NULL };
    int nargs = 3;
    if (bias) b[nargs] = buf_of(L, n->in[2]), names[nargs++] = "bias";
    if (stats >= 0) {
        /* per chunk and channel two doubles (4 floats); at most N chunks */
        L->part[stats] = cg_new_buf(L, BUF_WORK, dimn(4L * O), "BatchNorm partial sums", stats);
        b[nargs] = L->part[stats], names[nargs++] = "=part";
    }
    if (pointwise_forward(L, id, G, stats)) {
        pointwise_kernel(L, id, G, nargs, b, names, bias);
        return;
    }
    Step *st = cg_conv_kernel(L, id, "conv2d_chunked", dimn(1), nargs, b, names);
    st->heavy = st->c_only = true;
    cg_body(L, "    /* x [N, %d, %d, %d], w [%d, %d*%d*%d], y [N, %d, %d, %d]; stride %d, padding %d%s.\n"
               "       %d examples per iteration: their columns col[%ld, nb*%ld] (in cache), t = w . col\n"
               "       (CBLAS on this thread%s), y = t + bias%s */\n",
            C, H, W, O, C / G->groups, K, K, O, G->OH, G->OW, G->S, G->P, cg_groups_dilation(L, G), NB, CKK, P,
            G->groups > 1 ? ", a GEMM per group" : "",
            stats >= 0 ? ";\n       and per channel the chunk's mean and sum of squared deviations of y, for bn_stats" : "");
    chunk_loop(L, G, st->fn, "col", pad_floats(G));
    chunk_im2col(L, G, "0", arena_printf(L->p->arena, "%ldL", CKK));
    {
        Arena *a = L->p->arena;
        int gs = G->groups, Og = O / gs;
        long CgKK = CKK / gs;
        group_gemm(L, gs, "MGC_NO_TRANS", "MGC_NO_TRANS", arena_printf(a, "%d", Og), "ld", arena_printf(a, "%ld", CgKK),
                   "w", arena_printf(a, "%ldL", (long)Og * CgKK), arena_printf(a, "%ld", CgKK), "col", arena_printf(a, "%ldL * ld", CgKK), "ld",
                   "0.0f", "t", arena_printf(a, "%dL * ld", Og), "ld", "        ");
    }
    cg_body(L, "        for (int j = 0; j < nb; j++)\n"
               "            for (int o = 0; o < %d; o++) {\n"
               "                const float *src = t + o * ld + j * %ldL;\n"
               "                float *dst = y + ((n0 + j) * %d + o) * %ldL;\n"
               "                const float b = %s;\n"
               "                for (int p = 0; p < %ld; p++) %s\n"
               "            }\n",
            O, P, O, P, bias ? "bias[o]" : "0.0f", P,
            cg_store(L, id, "dst", "p", "src[p] + b"));
    if (stats >= 0)   /* each channel's row of t (nb*P values, in cache); the bias shifts the mean only */
        cg_chunk_stats(L, O, "t + o * ld", "1", "ld", bias ? "bias[o]" : "0.0");
    cg_body(L, "    }\n    free(col);\n");
    cg_end_kernel(L);
}

/* col2im of example j's columns (cp_at: where column (c, tap) starts) into its planes of dx,
   stride 1: in two passes over a zero-bordered scratch q[K][Hp][R] (R = OW + 2(K-1), a row's
   data at K-1): q[kx] sums the rows of taps (0..K-1, kx) down the rows, as aligned adds; then
   each row of dx is the sum of the K rows q[kx] shifted by kx, loads only. */
static void col2im_two_pass(Lower *L, const ConvGeom *G, const char *cp_at)
{
    int C = G->C, H = G->H, W = G->W, K = G->K, Pd = G->P, OH = G->OH, OW = G->OW;
    long Hp = (long)H + 2 * Pd, R = (long)OW + 2 * (K - 1);
    cg_text(L, "            /* col2im, two passes */\n"
               "            for (int c = 0; c < $C; c++) {\n"
               "                float *dxp = dx + ((n0 + j) * $C + c) * $HW;\n"
               "                for (int kx = 0; kx < $K; kx++) {\n"
               "                    float *qk = pad + kx * ${HpR}L + $K1;\n"
               "                    for (long iy = 0; iy < ${Hp}L; iy++)\n"
               "                        for (int ox = 0; ox < $OW; ox++) qk[iy * ${R}L + ox] = 0.0f;\n"
               "                    for (int ky = 0; ky < $K; ky++) {\n"
               "                        const float *cp = dcol + (c * $KK + ky * $K + kx) * $cp_at;\n"
               "                        for (int oy = 0; oy < $OH; oy++) {\n"
               "                            float *qr = qk + (oy + ky) * ${R}L;\n"
               "                            const float *sp = cp + oy * $OW;\n"
               "                            for (int ox = 0; ox < $OW; ox++) qr[ox] += sp[ox];\n"
               "                        }\n"
               "                    }\n"
               "                }\n"
               "                for (int iy = 0; iy < $H; iy++) {\n"
               "                    const float *q0 = pad + (iy + $Pd) * ${R}L + $K1Pd;\n"
               "                    float *dr = dxp + iy * $W;\n"
               "                    for (int ix = 0; ix < $W; ix++) dr[ix] = q0[ix]",
            cg_n("C", C), cg_n("HW", H * W), cg_n("K", K), cg_n("HpR", Hp * R), cg_n("K1", K - 1), cg_n("Hp", Hp), cg_n("OW", OW),
            cg_n("R", R), cg_n("KK", K * K), cg_s("cp_at", cp_at), cg_n("OH", OH), cg_n("H", H), cg_n("Pd", Pd),
            cg_n("K1Pd", K - 1 + Pd), cg_n("W", W));
    for (int kx = 1; kx < K; kx++) cg_body(L, " + q0[%ld + ix]", kx * Hp * R - kx);
    cg_body(L, ";\n                }\n");
}

/* The same, any stride: each plane of dx gathered in a zero-bordered copy (no test per
   element), each tap's rows added at their shifted place, then its inside kept. */
static void col2im_one_pass(Lower *L, const ConvGeom *G, const char *cp_at)
{
    int C = G->C, H = G->H, W = G->W, K = G->K, S = G->S, Pd = G->P, OH = G->OH, OW = G->OW, D = G->D;
    long Wp = (long)W + 2 * Pd;
    cg_body(L, "            /* col2im */\n"
               "            for (int c = 0; c < %d; c++) {\n"
               "                float *dxp = dx + ((n0 + j) * %d + c) * %d;\n", C, C, H * W);
    if (Pd == 0) cg_body(L, "                float *pad = dxp;\n");
    cg_text(L, "                for (long i = 0; i < ${pad}L; i++) pad[i] = 0.0f;\n"
               "                for (int t = 0; t < $KK; t++) {\n"
               "                    int ky = t / $K, kx = t % $K;\n"
               "                    const float *cp = dcol + (c * $KK + t) * $cp_at;\n"
               "                    for (int oy = 0; oy < $OH; oy++) {\n"
               "                        float *dp = pad + (oy * $S + $ky_d) * ${Wp}L + $kx_d;\n"
               "                        const float *sp = cp + oy * $OW;\n"
               "                        for (int ox = 0; ox < $OW; ox++) dp[ox * $S] += sp[ox];\n"
               "                    }\n"
               "                }\n",
            cg_n("pad", Pd > 0 ? pad_floats(G) : (long)H * W), cg_n("KK", K * K), cg_n("K", K), cg_s("cp_at", cp_at), cg_n("OH", OH),
            cg_n("S", S), cg_s("ky_d", cg_dilated(L, "ky", D)), cg_n("Wp", Wp), cg_s("kx_d", cg_dilated(L, "kx", D)), cg_n("OW", OW));
    if (Pd > 0)
        cg_body(L, "                for (int iy = 0; iy < %d; iy++)\n"
                   "                    for (int ix = 0; ix < %d; ix++) dxp[iy * %d + ix] = pad[(iy + %d) * %ldL + %d + ix];\n",
                H, W, W, Pd, Wp, Pd);
}

/* dy, w -> dx: per chunk, t = dy's planes, dcol[CKK, nb*P] = w^T . t (CBLAS), col2im into dx */
void cg_conv_chunked_grad_x(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, Pd = G->P, OH = G->OH, OW = G->OW, NB = cg_chunk_examples(G);
    long P = (long)OH * OW, CKK = (long)C * K * K;
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    Step *st = cg_kernel(L, id, "conv2d_grad_x_chunked", dimn(1), 3, b, (const char *const[]){ "=dx", "dy", "w" });
    st->heavy = st->c_only = true;
    int gs = G->groups, Og = O / gs, D = G->D;
    long CgKK = CKK / gs;
    bool small = Og <= 32 && L->g->nodes[id].mm != DT_BF16;   /* bf16: through the GEMM that rounds */
    cg_body(L, "    /* dy [N, %d, %d, %d], w [%d, %d*%d*%d], dx [N, %d, %d, %d]; stride %d, padding %d%s.\n"
               "       %d examples per iteration: t = their dy, dcol = w^T . t (%s on this thread%s),\n"
               "       added back into their planes of dx (col2im) */\n",
            O, OH, OW, O, C / gs, K, K, C, H, W, S, Pd, cg_groups_dilation(L, G), NB,
            small ? "mgc_gemm_tn, an example at a time," : "CBLAS", gs > 1 ? ", a GEMM per group" : "");
    /* Stride 1: col2im in two passes (col2im_two_pass); the one-pass form adds each tap's rows
       at their shifted place, read-modify-writes that overlap at a different offset per tap
       (LeNet's conv2: 25 taps a plane). */
    bool two_pass = S == 1 && D == 1;
    long Hp = (long)H + 2 * Pd, R = (long)OW + 2 * (K - 1), Q = (long)K * Hp * R;
    chunk_loop(L, G, st->fn, "dcol", two_pass ? Q : pad_floats(G));
    if (!small) chunk_pack_grad(L, G);
    /* A short K (few output channels, LeNet's conv2: 16): the prelude's register-blocked
       GEMM, one example at a time, its columns read back from L1 by col2im (LeNet's conv2:
       1.78 -> 1.14 ms a step on one thread; CBLAS's packing costs more than its multiply-adds
       there). Else one CBLAS GEMM over the chunk. */
    const char *cp_at = small ? arena_printf(L->p->arena, "%ldL", P) : arena_printf(L->p->arena, "ld + j * %ldL", P);
    if (small && gs == 1)
        cg_body(L, "        (void)ld;\n"
                   "        for (int j = 0; j < nb; j++) {\n"
                   "            mgc_gemm_tn(%ld, %ld, %d, w, %ld, dy + (n0 + j) * %ldL, %ld, dcol, %ld);   /* dy's planes in place */\n",
                CKK, P, O, CKK, O * P, P, P);
    else if (small)
        cg_body(L, "        (void)ld;\n"
                   "        for (int j = 0; j < nb; j++) {\n"
                   "            for (int g = 0; g < %d; g++)   /* a GEMM per group, dy's planes in place */\n"
                   "                mgc_gemm_tn(%ld, %ld, %d, w + g * %ldL, %ld, dy + (n0 + j) * %ldL + g * %ldL, %ld, dcol + g * %ldL, %ld);\n",
                gs, CgKK, P, Og, Og * CgKK, CgKK, O * P, Og * P, P, CgKK * P, P);
    else {
        Arena *a = L->p->arena;
        group_gemm(L, gs, "MGC_TRANS", "MGC_NO_TRANS", arena_printf(a, "%ld", CgKK), "ld", arena_printf(a, "%d", Og),
                   "w", arena_printf(a, "%ldL", (long)Og * CgKK), arena_printf(a, "%ld", CgKK), "t", arena_printf(a, "%dL * ld", Og), "ld",
                   "0.0f", "dcol", arena_printf(a, "%ldL * ld", CgKK), "ld", "        ");
        cg_body(L, "        for (int j = 0; j < nb; j++) {\n");
    }
    if (two_pass) col2im_two_pass(L, G, cp_at);
    else col2im_one_pass(L, G, cp_at);
    cg_body(L, "            }\n        }\n    }\n    free(dcol);\n");
    cg_end_kernel(L);
}

/* dy, x -> dw[O, CKK] = sum over chunks of t . col^T, for gradients too large to
   keep CG_WGROUPS partial copies of: each thread owns a range of dw's columns
   (im2col rows), makes only those rows of each chunk's columns and accumulates
   its own block of dw (CBLAS, beta 1 after the first chunk). */
static void conv_chunked_grad_w_rows(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K;
    long P = (long)G->OH * G->OW, CKK = (long)C * K * K;
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    Step *st = cg_kernel(L, id, "conv2d_grad_w_chunked", dimc(CKK), 3, b, (const char *const[]){ "=dw", "dy", "x" });
    st->heavy = st->c_only = true;
    cg_body(L, "    /* dy [N, %d, %d, %d], x [N, %d, %d, %d], dw [%d, %ld]; stride %d, padding %d.\n"
               "       This thread's columns [r0, r1) of dw, over the batch NB examples at a time:\n"
               "       t = their dy, col = their im2col rows r0..r1, dw[:, r0:r1] += t . col^T */\n",
            O, G->OH, G->OW, C, H, W, O, CKK, G->S, G->P);
    cg_body(L, "    long r0 = %ldL * a.thread / a.nthreads, r1 = %ldL * (a.thread + 1) / a.nthreads;\n"
               "    if (r0 >= r1) return;\n"
               "    if (N == 0) {\n"
               "        for (int o = 0; o < %d; o++) for (long r = r0; r < r1; r++) dw[o * %ldL + r] = 0.0f;\n"
               "        return;\n"
               "    }\n"
               "    /* examples per chunk: this thread's rows of their columns about %ld floats */\n"
               "    long NB = %ldL / ((r1 - r0) * %ldL);\n"
               "    NB = NB < 1 ? 1 : NB > 1024 ? 1024 : NB;\n"
               "    float *col = mgc_scratch((r1 - r0) * %ldL * NB + %ldL * NB + %ldL, \"%s\"), *t = col + (r1 - r0) * %ldL * NB;\n"
               "    float *pad = t + %ldL * NB;\n"
               "    (void)pad;\n"
               "    for (long n0 = 0; n0 < N; n0 += NB) {\n"
               "        int nb = N - n0 < NB ? (int)(N - n0) : (int)NB, ld = nb * %ld;\n",
            CKK, CKK, O, CKK, CG_CHUNK_FLOATS, CG_CHUNK_FLOATS, P, P, O * P, pad_floats(G), st->fn, P, O * P, P);
    chunk_pack_grad(L, G);
    chunk_im2col(L, G, "r0", "r1");
    cg_body(L, "        %s(MGC_ROW_MAJOR, MGC_NO_TRANS, MGC_TRANS, %d, (int)(r1 - r0), ld, 1.0f, t, ld, col, ld,\n"
               "                    n0 ? 1.0f : 0.0f, dw + r0, %ld);\n"
               "    }\n    free(col);\n", cg_sgemm_fn(L), O, CKK);
    cg_end_kernel(L);
}

/* dy, x -> dw[O, CKK]: CG_WGROUPS groups of examples, each a partial dw over
   all columns (its own dy and im2col, chunk by chunk, the chunk's columns in
   cache), then dw = the partials' sum in group order (a second kernel).
   Measured on ResNet-18 against splitting dw's columns between threads (each
   thread then packed all of dy, and the stem's 49 columns gave GEMMs 24
   wide): the weight gradients 42 -> 38 ms a step (the stem's 3.8 -> 2.6, the
   first 1x1 projection's 0.77 -> 0.47); 16 groups: 40. */
void cg_conv_chunked_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, NB = cg_chunk_examples(G);
    int gs = G->groups, Og = O / gs;
    long P = (long)G->OH * G->OW, CKK = (long)C * K * K, CgKK = CKK / gs, OC = (long)O * CgKK;
    if (!cg_chunked_wgroups_fit(G)) {   /* groups == 1 then (cg_choose_convs) */
        conv_chunked_grad_w_rows(L, id, G);
        return;
    }
    int part = cg_new_buf(L, BUF_WORK, dimc(CG_WGROUPS * OC), "weight gradient per group of examples", id);
    int b[3] = { part, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    Step *st = cg_kernel(L, id, "conv2d_grad_w_groups", dimc(CG_WGROUPS), 3, b, (const char *const[]){ "=part", "dy", "x" });
    st->heavy = st->c_only = true;
    cg_body(L, "    /* dy [N, %d, %d, %d], x [N, %d, %d, %d], part [%d, %d, %ld]; stride %d, padding %d%s.\n"
               "       One group of examples per iteration, %d at a time: t = their dy, col = their im2col,\n"
               "       part[g] += t . col^T%s */\n",
            O, G->OH, G->OW, C, H, W, CG_WGROUPS, O, CgKK, G->S, G->P, cg_groups_dilation(L, G), NB,
            gs > 1 ? " (a GEMM per channel group)" : "");
    cg_body(L, "    float *col = mgc_scratch(%ldL * %d + %ldL * %d + %ldL, \"%s\"), *t = col + %ldL * %d, *pad = t + %ldL * %d;\n"
               "    (void)pad;\n",
            CKK * P, NB, O * P, NB, pad_floats(G), st->fn, CKK * P, NB, O * P, NB);
    cg_group_chunks(L, OC, NB, P);
    chunk_pack_grad(L, G);
    chunk_im2col(L, G, "0", arena_printf(L->p->arena, "%ldL", CKK));
    {
        Arena *a = L->p->arena;
        group_gemm(L, gs, "MGC_NO_TRANS", "MGC_TRANS", arena_printf(a, "%d", Og), arena_printf(a, "%ld", CgKK), "ld",
                   "t", arena_printf(a, "%dL * ld", Og), "ld", "col", arena_printf(a, "%ldL * ld", CgKK), "ld",
                   "n0 == e0 ? 0.0f : 1.0f", "pg", arena_printf(a, "%ldL", (long)Og * CgKK), arena_printf(a, "%ld", CgKK),
                   "            ");
    }
    cg_body(L, "        }\n    }\n    free(col);\n");
    cg_end_kernel(L);
    int b2[2] = { cg_out_buf(L, id), part };
    Step *s2 = cg_kernel(L, id, "conv2d_grad_w_sum", dimc(OC), 2, b2, (const char *const[]){ "=dw", "part" });
    s2->grain = CG_WGROUPS;
    s2->c_only = true;
    cg_body(L, "    /* dw = the %d groups' partial gradients, added in order */\n"
               "    FOR_EACH(i, %ldL) {\n"
               "        float acc = part[i];\n"
               "        for (int g = 1; g < %d; g++) acc += part[g * %ldL + i];\n"
               "        dw[i] = acc;\n"
               "    }\n", CG_WGROUPS, OC, CG_WGROUPS, OC);
    cg_end_kernel(L);
}

/* Whether the weight gradient's CG_WGROUPS partial copies fit (else each thread
   takes a range of its columns, a form for groups == 1 only). */
bool cg_chunked_wgroups_fit(const ConvGeom *G)
{
    return (long)G->O * (G->C / G->groups) * G->K * G->K * CG_WGROUPS <= CG_WGROUPS_MAX_FLOATS;
}
