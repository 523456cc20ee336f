/*
** CONV_WINOGRAD: 3x3 convolutions with stride 1 and padding 1 as Winograd's
** minimal filtering F(2x2, 3x3), C target only (the kernels call CBLAS on
** their own thread), a chunk of examples at a time like CONV_CHUNKED.
**
** Each output plane is cut into 2x2 tiles; a tile's 4x4 input window d and a
** 3x3 filter g give the tile as
**
**   y = A^T [ (G g G^T) (.) (B^T d B) ] A          ((.) : element by element)
**
**   B^T = | 1  0 -1  0 |   G = | 1    0    0   |   A^T = | 1  1  1  0 |
**         | 0  1  1  0 |       | 1/2  1/2  1/2 |         | 0  1 -1 -1 |
**         | 0 -1  1  0 |       | 1/2 -1/2  1/2 |
**         | 0  1  0 -1 |       | 0    0    1   |
**
** so that, with the 16 elements xi of the 4x4 transforms as 16 matrices,
** the sum over input channels is 16 GEMMs with K = C:
**
**   U[xi][o, c]      = (G w[o, c] G^T)[xi]             (conv2d_winograd_weights, each step)
**   V[xi][c, tile]   = (B^T d[c, tile] B)[xi]          (the chunk's input, in cache)
**   M[xi]            = U[xi] . V[xi]                   (16 GEMMs, O x C x tiles)
**   y[o, tile]       = A^T M[.][o, tile] A (+ bias, relu; BatchNorm statistics)
**
** 16 multiply-adds per 2x2 tile and channel pair where im2col + GEMM does 36:
** 2.25x fewer (ResNet-18's 4x4 maps; 1.72x on its 7x7 maps, whose 4x4 tiles
** cover 8x8). The gradients are the same three steps:
**   input gradient: the forward on dy with the filter turned 180 degrees and
**     its channels swapped; turning g swaps rows 0 and 3 of G g, so its U is
**     U[pi(xi)]^T (pi swaps 0 and 3 of each index): the forward's U serves;
**   weight gradient: dU[xi] = sum over tiles of (A dy A^T)[xi] (.) V[xi], one
**     GEMM per xi with K = the chunk's tiles, summed in CG_WGROUPS groups of
**     examples (as the chunked weight gradient) and dw = G^T dU G (a second
**     kernel, the groups added in order).
** The transforms add and halve: the error is a few float roundings larger than
** im2col's (the reference tests bound it against PyTorch like every form's).
*/
#include "lower_internal.h"

/* The chunk's transformed input and product, V [16, Cin, nb*T] and M [16,
   Cout, nb*T], at most about this many floats (512 KB, in a core's L2 with
   the GEMMs' packed blocks). Measured on ResNet-18's layers, one thread, batch
   256: 128K floats gave the forward 8.7 ms (stage 1) and 6.2 ms (stage 2),
   against 10.9 and 7.8 with 512K and 12.9 and 8.0 with 2M: the 16 GEMMs per
   chunk (K = C, 32 to 64 columns) run at about 150 GFLOP/s with their
   operands in cache. */
#define WG_CHUNK_FLOATS (128L << 10)
/* ... but at least this many tiles a chunk (512 channels on 4x4 maps: 8 examples, 2 MB) */
#define WG_MIN_COLUMNS 32

static int tiles_h(const ConvGeom *G) { return (G->OH + 1) / 2; }
static int tiles_w(const ConvGeom *G) { return (G->OW + 1) / 2; }
long cg_winograd_tiles(const ConvGeom *G) { return (long)tiles_h(G) * tiles_w(G); }

bool cg_winograd_applies(int k, int stride, int padding) { return k == 3 && stride == 1 && padding == 1; }

bool cg_winograd_grad_w_fits(const ConvGeom *G) { return 16L * CG_WGROUPS * G->O * G->C <= CG_WGROUPS_MAX_FLOATS; }

int cg_winograd_examples(const ConvGeom *G)
{
    long T = (long)tiles_h(G) * tiles_w(G), per = 16L * (G->C + G->O) * T;
    long nb = WG_CHUNK_FLOATS / (per > 0 ? per : 1), least = (WG_MIN_COLUMNS + T - 1) / T;
    if (nb < least) nb = least;   /* wide layers on small maps: GEMMs at least WG_MIN_COLUMNS wide */
    return nb < 1 ? 1 : nb > 64 ? 64 : (int)nb;
}

/* w [O, C, 3, 3] -> u [16, O, C]: each step, before the forward (the input
   gradient reads it too: w does not change until the update). */
static int winograd_weights(Lower *L, int id, int w_node, const ConvGeom *G)
{
    long OC = (long)G->O * G->C;
    int u = cg_new_buf(L, BUF_WORK, dimc(16 * OC), "Winograd-domain weights", id);
    int b[2] = { u, buf_of(L, w_node) };
    Step *st = cg_kernel(L, id, "conv2d_winograd_weights", dimc((OC + 63) / 64), 2, b, (const char *const[]){ "=u", "w" });
    st->grain = 64 * 16;
    st->c_only = true;
    /* 64 pairs at a time, their 16 values each gathered in t and stored as 16 runs: stored
       pair by pair, the 16 stores lie O*C floats apart (a multiple of 4 KB, one cache set):
       512 x 512 took 8.9 ms a step */
    cg_body(L, "    /* w [%d, %d, 3, 3] -> u [16, %d, %d] = G w G^T; 64 (o, c) pairs per iteration */\n"
               "    FOR_EACH(blk, %ldL) {\n"
               "        const long i0 = blk * 64, n = %ldL - i0 < 64 ? %ldL - i0 : 64;\n"
               "        float t[16][64];\n"
               "        for (long k = 0; k < n; k++) {\n"
               "            const float *g = w + (i0 + k) * 9;\n"
               "            float h[4][3];   /* G g */\n"
               "            for (int q = 0; q < 3; q++) {\n"
               "                h[0][q] = g[q];\n"
               "                h[1][q] = 0.5f * (g[q] + g[3 + q] + g[6 + q]);\n"
               "                h[2][q] = 0.5f * (g[q] - g[3 + q] + g[6 + q]);\n"
               "                h[3][q] = g[6 + q];\n"
               "            }\n"
               "            for (int a = 0; a < 4; a++) {   /* (G g) G^T */\n"
               "                t[a * 4 + 0][k] = h[a][0];\n"
               "                t[a * 4 + 1][k] = 0.5f * (h[a][0] + h[a][1] + h[a][2]);\n"
               "                t[a * 4 + 2][k] = 0.5f * (h[a][0] - h[a][1] + h[a][2]);\n"
               "                t[a * 4 + 3][k] = h[a][2];\n"
               "            }\n"
               "        }\n"
               "        for (int xi = 0; xi < 16; xi++)\n"
               "            for (long k = 0; k < n; k++) u[xi * %ldL + i0 + k] = t[xi][k];\n"
               "    }\n", G->O, G->C, G->O, G->C, (OC + 63) / 64, OC, OC, OC);
    cg_end_kernel(L);
    return u;
}

/* The body's input transform: the chunk's planes of `src` ([N, CH, H, W],
   examples n0 .. n0+nb-1) -> V[(xi * CH + c) * ld + j * T + tile]. Each plane
   is copied into `pad` (zero-bordered: row and column 0 and those past the
   map, never written); then d B across each padded row, for every tile
   column, into hb[b][row parity][row / 2][tx]; then B^T down the rows: for
   each xi, all T tiles of the plane at once from contiguous rows of hb (a
   tile's rows 0..3 are even row ty, odd row ty, even row ty + 1, odd row
   ty + 1), so that V's stores are vectors. */
static void input_transform(Lower *L, const ConvGeom *G, const char *src, int CH)
{
    int H = G->H, W = G->W, TH = tiles_h(G), TW = tiles_w(G), Hp = 2 * TH + 2, Wp = 2 * TW + 2;
    long HW = (long)H * W, T = (long)TH * TW, HS = (long)(TH + 1) * TW;
    cg_text(L, "        for (int j = 0; j < nb; j++)   /* input transform: V = B^T d B */\n"
               "            for (int c = 0; c < $CH; c++) {\n"
               "                const float *xp = $src + ((n0 + j) * $CH + c) * ${HW}L;\n"
               "                for (int iy = 0; iy < $H; iy++)\n"
               "                    for (int ix = 0; ix < $W; ix++) pad[(iy + 1) * $Wp + 1 + ix] = xp[iy * $W + ix];\n"
               "                for (int r = 0; r < $Hp; r++) {   /* d B: per padded row, each tile column's 4 */\n"
               "                    const float *row = pad + r * $Wp;\n"
               "                    float *h = hb + (r & 1) * ${HS}L + (r >> 1) * $TW;\n"
               "                    for (int tx = 0; tx < $TW; tx++) {\n"
               "                        const float e0 = row[2 * tx], o0 = row[2 * tx + 1], e1 = row[2 * tx + 2], o1 = row[2 * tx + 3];\n"
               "                        h[tx] = e0 - e1; h[$HS2 + tx] = o0 + e1; h[$HS4 + tx] = e1 - o0; h[$HS6 + tx] = o0 - o1;\n"
               "                    }\n"
               "                }\n"
               "                float *vb = V + c * (long)ld + j * ${T}L;\n"
               "                for (int b = 0; b < 4; b++) {   /* B^T: down the rows, the plane's $T tiles at once */\n"
               "                    const float *E = hb + b * ${HS2}L, *O = E + ${HS}L;\n"
               "                    float *v0 = vb + b * vs, *v1 = v0 + 4 * vs, *v2 = v0 + 8 * vs, *v3 = v0 + 12 * vs;\n"
               "                    for (int t = 0; t < $T; t++) {\n"
               "                        v0[t] = E[t] - E[t + $TW]; v1[t] = O[t] + E[t + $TW];\n"
               "                        v2[t] = E[t + $TW] - O[t]; v3[t] = O[t] - O[t + $TW];\n"
               "                    }\n"
               "                }\n"
               "            }\n",
            cg_n("CH", CH), cg_s("src", src), cg_n("HW", HW), cg_n("H", H), cg_n("W", W), cg_n("Wp", Wp), cg_n("Hp", Hp), cg_n("HS", HS),
            cg_n("TW", TW), cg_n("HS2", 2 * HS), cg_n("HS4", 4 * HS), cg_n("HS6", 6 * HS), cg_n("T", T));
}

/* The 16 matrices of V (and of M) lie WG_SKEW floats more than their size
   apart: at a multiple of 4 KB, the 16 stores of a tile's transform (and the
   16 loads of the output's) fall in one set of the L1 and L2 caches; stage 1's
   input transform took 18 ms a step on one thread, 4 ms skewed. */
#define WG_SKEW 16

/* The kernels' scratch for chunks of up to NB examples: V [16, cin, NB*T] and
   M (or D) [16, cout, NB*T], each matrix WG_SKEW floats apart, the padded
   plane (zeroed here: its border is never written), the transforms' rows
   (hb) and dy's plane rounded up to whole tiles (gp, zero past the map). */
static void scratch(Lower *L, const ConvGeom *G, const char *fn, int cin, int cout, int NB)
{
    int Hp = 2 * tiles_h(G) + 2, Wp = 2 * tiles_w(G) + 2;
    long T = (long)tiles_h(G) * tiles_w(G), vs = cin * T * NB + WG_SKEW, ms = cout * T * NB + WG_SKEW;
    long HB = 8L * (tiles_h(G) + 1) * tiles_w(G);
    cg_body(L, "    float *V = mgc_scratch(%ldL, \"%s\"), *M = V + %ldL, *pad = M + %ldL, *hb = pad + %dL, *gp = hb + %ldL;\n"
               "    (void)gp;\n"
               "    for (long i = 0; i < %ldL; i++) pad[i] = 0.0f;   /* the borders stay zero */\n",
            16 * (vs + ms) + Hp * Wp + HB + 4 * T, fn, 16 * vs, 16 * ms, Hp * Wp, HB, Hp * Wp + HB + 4 * T);
}

/* The output transform's store of a 2x2 tile's values val[4] at ptr (the tile's top left
   on a plane W wide); on a map of odd size, only the parts on the map (rx, ry). */
static void tile_store(Lower *L, const char *ptr, const char *val, bool odd, int W)
{
    if (odd)
        cg_body(L, "                        %s[0] = %s[0];\n"
                   "                        if (rx) %s[1] = %s[1];\n"
                   "                        if (ry) { %s[%d] = %s[2]; if (rx) %s[%d] = %s[3]; }\n",
                ptr, val, ptr, val, ptr, W, val, ptr, W + 1, val);
    else
        cg_body(L, "                        %s[0] = %s[0]; %s[1] = %s[1]; %s[%d] = %s[2]; %s[%d] = %s[3];\n", ptr, val, ptr, val, ptr, W, val,
                ptr, W + 1, val);
}

/* The forward (transposed: the input gradient): src [N, cin, H, W] -> dst [N,
   cout, H, W] through u (the forward's, [16, O, C]). */
/* The kernel's output transform (winograd_apply): per plane, A^T down the rows for all its
   tiles at once (vectors), then across: each tile's four outputs, the bias and the fused
   activation, stored into the plane of dst */
static void output_transform(Lower *L, int id, const ConvGeom *G, bool transposed, bool bias, bool relu, const char *dst, int cout)
{
    int H = G->H, W = G->W, TH = tiles_h(G), TW = tiles_w(G);
    long HW = (long)H * W, T = (long)TH * TW;
    bool odd = H % 2 || W % 2;
    cg_text(L, "        for (int j = 0; j < nb; j++)   /* output transform: A^T M A */\n"
               "            for (int o = 0; o < $cout; o++) {\n"
               "                float *yp = $dst + ((n0 + j) * $cout + o) * ${HW}L;\n"
               "                const float *mb = M + o * (long)ld + j * ${T}L;\n"
               "                const float b = $bias;\n"
               "                float s0[4][$T], s1[4][$T];\n"
               "                for (int c = 0; c < 4; c++) {\n"
               "                    const float *m0 = mb + c * ms, *m1 = m0 + 4 * ms, *m2 = m0 + 8 * ms, *m3 = m0 + 12 * ms;\n"
               "                    for (int t = 0; t < $T; t++) { s0[c][t] = m0[t] + m1[t] + m2[t]; s1[c][t] = m1[t] - m2[t] - m3[t]; }\n"
               "                }\n"
               "                for (int ty = 0; ty < $TH; ty++)\n"
               "                    for (int tx = 0; tx < $TW; tx++) {\n"
               "                        const int t = ty * $TW + tx;\n"
               "                        float v[4] = { s0[0][t] + s0[1][t] + s0[2][t] + b, s0[1][t] - s0[2][t] - s0[3][t] + b,\n"
               "                                       s1[0][t] + s1[1][t] + s1[2][t] + b, s1[1][t] - s1[2][t] - s1[3][t] + b };\n",
            cg_n("cout", cout), cg_s("dst", dst), cg_n("HW", HW), cg_n("T", T), cg_s("bias", bias ? "bias[o]" : "0.0f"), cg_n("TH", TH),
            cg_n("TW", TW));
    if (relu)
        cg_body(L, "                        for (int k = 0; k < 4; k++) v[k] = v[k] > 0.0f ? v[k] : 0.0f;   /* fused relu */\n");
    bool beside = !transposed && cg_act_beside(L->dec, id) >= 0;   /* the activation into ya, v kept in y */
    if (!transposed && cg_act(L->dec, id) >= 0 && !relu)
        cg_body(L, "                        %sfor (int k = 0; k < 4; k++) %s[k] = %s;   /* fused %s%s */\n", beside ? "float va[4];\n                        " : "",
                beside ? "va" : "v", cg_conv_act(L, id, "v[k]"), ir_op_name((Op)cg_act(L->dec, id)), beside ? ", stored beside its input" : "");
    cg_body(L, "                        float *yo = yp + 2 * ty * %d + 2 * tx;\n", W);
    if (odd)
        cg_body(L, "                        const int ry = 2 * ty + 1 < %d, rx = 2 * tx + 1 < %d;   /* the tile's second row, column on the map */\n",
                H, W);
    tile_store(L, "yo", "v", odd, W);
    if (beside) {
        cg_body(L, "                        float *ao = ya + (yo - y);\n");
        tile_store(L, "ao", "va", odd, W);
    }
    cg_body(L, "                    }\n            }\n");
}

static void winograd_apply(Lower *L, int id, const ConvGeom *G, bool transposed)
{
    const Node *n = &L->g->nodes[id];
    int O = G->O, C = G->C, H = G->H, W = G->W, TH = tiles_h(G), TW = tiles_w(G), NB = cg_winograd_examples(G);
    int cin = transposed ? O : C, cout = transposed ? C : O;
    long HW = (long)H * W, T = (long)TH * TW, OC = (long)O * C;
    bool bias = !transposed && n->nin == 3, relu = !transposed && cg_relu_out(L->dec, id);
    int stats = transposed ? -1 : cg_stats_of(L->dec, id);
    int u = transposed ? L->col[n->grad_of] : -1;
    if (u < 0) u = winograd_weights(L, id, n->in[1], G);
    if (!transposed) L->col[id] = u;   /* for the input gradient */
    int b[5] = { cg_out_buf(L, id), buf_of(L, n->in[0]), u, -1, -1 };
    const char *names[5] = { transposed ? "=dx" : "=y", transposed ? "dy" : "x", "u", NULL, NULL };
    int nargs = 3;
    if (bias) b[nargs] = buf_of(L, n->in[2]), names[nargs++] = "bias";
    if (stats >= 0) {
        L->part[stats] = cg_new_buf(L, BUF_WORK, dimn(4L * O), "BatchNorm partial sums", stats);
        b[nargs] = L->part[stats], names[nargs++] = "=part";
    }
    Step *st = transposed ? cg_kernel(L, id, "conv2d_grad_x_winograd", dimn(1), nargs, b, names)
                          : cg_conv_kernel(L, id, "conv2d_winograd", dimn(1), nargs, b, names);
    st->heavy = st->c_only = true;
    const char *dst = transposed ? "dx" : "y";
    cg_body(L, "    /* %s [N, %d, %d, %d] -> %s [N, %d, %d, %d]: 3x3, stride 1, padding 1 as F(2x2, 3x3);\n"
               "       %d examples (%ld 2x2 tiles each) per iteration: V = B^T d B, M[xi] = %s . V[xi]\n"
               "       (16 CBLAS GEMMs on this thread), %s = A^T M A%s */\n",
            transposed ? "dy" : "x", cin, H, W, dst, cout, H, W, NB, T,
            transposed ? "u[pi(xi)]^T (the filter turned, channels swapped)" : "u[xi]", dst,
            bias ? " + bias" : "");
    scratch(L, G, st->fn, cin, cout, NB);
    /* bf16: where this thread takes 4 chunks or more, the 16 filters rounded and packed
       once, not once per chunk (ResNet-18's 128 and 256 channels at batch 32: 4.4 -> 3.5
       ms a layer); with fewer, each chunk packs them as it goes, one filter at a time
       in cache (packing all 16 of 512 x 512 up front: 6.1 -> 11 ms) */
    bool packed = L->g->nodes[id].mm == DT_BF16;
    if (packed)
        cg_body(L, "    MgcPackedA *pu[16] = { 0 };   /* u[xi]%s in bf16, packed for mgc_sbgemm_packed */\n"
                   "    const int prepack = (N + %d) / %d >= 4L * a.nthreads;\n"
                   "    for (int xi = 0; prepack && xi < 16; xi++)\n"
                   "        pu[xi] = mgc_sbgemm_pack_a(%s, %d, %d, u + xi * %ldL, %d);\n",
                transposed ? "^T" : "", NB - 1, NB, transposed ? "MGC_TRANS" : "MGC_NO_TRANS", cout, cin, OC, C);
    cg_body(L, "    FOR_EACH(ch, (N + %d) / %d) {\n"
               "        long n0 = ch * %d;\n"
               "        int nb = N - n0 < %d ? (int)(N - n0) : %d, ld = nb * %ld;\n"
               "        const long vs = %dL * ld + %d, ms = %dL * ld + %d;\n",
            NB - 1, NB, NB, NB, NB, T, cin, WG_SKEW, cout, WG_SKEW);
    input_transform(L, G, transposed ? "dy" : "x", cin);
    /* the 16 products M[xi] = u[xi] . V[xi] (the input gradient: u[pi(xi)]^T) */
    const char *pi = transposed ? "        static const int pi[16] = { 15, 13, 14, 12, 7, 5, 6, 4, 11, 9, 10, 8, 3, 1, 2, 0 };\n" : "";
    const char *u_xi = transposed ? "pi[xi]" : "xi";
    const char *product = arena_printf(L->p->arena, "%s(MGC_ROW_MAJOR, %s, MGC_NO_TRANS, %d, ld, %d, 1.0f, u + %s * %ldL, %d,\n", cg_sgemm_fn(L),
                                       transposed ? "MGC_TRANS" : "MGC_NO_TRANS", cout, cin, u_xi, OC, C);
    if (packed)
        cg_body(L, "%s        for (int xi = 0; xi < 16; xi++)\n"
                   "            if (prepack) mgc_sbgemm_packed(pu[%s], MGC_NO_TRANS, ld, 1.0f, V + xi * vs, ld, 0.0f, M + xi * ms, ld);\n"
                   "            else %s                            V + xi * vs, ld, 0.0f, M + xi * ms, ld);\n", pi, u_xi, product);
    else
        cg_body(L, "%s        for (int xi = 0; xi < 16; xi++)\n"
                   "            %s                        V + xi * vs, ld, 0.0f, M + xi * ms, ld);\n", pi, product);
    output_transform(L, id, G, transposed, bias, relu, dst, cout);
    if (stats >= 0)   /* each channel's nb planes of y, in cache */
        cg_chunk_stats(L, O, arena_printf(L->p->arena, "y + ((n0 + j) * %dL + o) * %ldL", O, HW), "nb",
                       arena_printf(L->p->arena, "%ldL", HW), "0.0");
    cg_body(L, "    }\n    free(V);\n");
    if (packed)
        cg_body(L, "    for (int xi = 0; xi < 16; xi++) mgc_sbgemm_free(pu[xi]);\n");   /* NULL: nothing */
    cg_end_kernel(L);
}

/* dy, x -> dw: per group of examples, chunk by chunk, D = A dy A^T, V = B^T x B,
   part[g][xi] += D[xi] . V[xi]^T; then dw = G^T (sum of the groups) G. */
static void winograd_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int O = G->O, C = G->C, H = G->H, W = G->W, TH = tiles_h(G), TW = tiles_w(G), NB = cg_winograd_examples(G);
    long HW = (long)H * W, T = (long)TH * TW, OC = (long)O * C;
    int part = cg_new_buf(L, BUF_WORK, dimc(CG_WGROUPS * 16 * OC), "Winograd-domain weight gradient per group of examples", id);
    int b[3] = { part, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    Step *st = cg_kernel(L, id, "conv2d_grad_w_winograd", dimc(CG_WGROUPS), 3, b, (const char *const[]){ "=part", "dy", "x" });
    st->heavy = st->c_only = true;
    cg_body(L, "    /* dy [N, %d, %d, %d], x [N, %d, %d, %d], part [%d, 16, %d, %d]: 3x3, stride 1, padding 1 as F(2x2, 3x3).\n"
               "       One group of examples per iteration, %d at a time: V = B^T x B, D = A dy A^T,\n"
               "       part[g][xi] += D[xi] . V[xi]^T (16 CBLAS GEMMs on this thread) */\n",
            O, H, W, C, H, W, CG_WGROUPS, O, C, NB);
    scratch(L, G, st->fn, C, O, NB);
    cg_group_chunks(L, 16 * OC, NB, T);
    cg_body(L, "            const long vs = %dL * ld + %d, ms = %dL * ld + %d;\n", C, WG_SKEW, O, WG_SKEW);
    input_transform(L, G, "x", C);
    /* D = A g A^T of each 2x2 tile g of dy (zero past the map): g A^T across each row of
       dy (rounded up to whole tiles in gp where the map is odd) into hb[b][row parity][ty][tx],
       then A down: all the plane's tiles at once */
    bool odd = H % 2 || W % 2;
    cg_body(L, "        for (int j = 0; j < nb; j++)   /* D = A dy A^T */\n"
               "            for (int o = 0; o < %d; o++) {\n"
               "                const float *gq = dy + ((n0 + j) * %d + o) * %ldL;\n",
            O, O, HW);
    if (odd)
        cg_body(L, "                for (int iy = 0; iy < %d; iy++)\n"
                   "                    for (int ix = 0; ix < %d; ix++) gp[iy * %d + ix] = gq[iy * %d + ix];\n"
                   "                gq = gp;\n", H, W, 2 * TW, W);
    cg_body(L, "                for (int r = 0; r < %d; r++) {\n"
               "                    const float *row = gq + r * %d;\n"
               "                    float *h = hb + (r & 1) * %ldL + (r >> 1) * %d;\n"
               "                    for (int tx = 0; tx < %d; tx++) {\n"
               "                        const float g0 = row[2 * tx], g1 = row[2 * tx + 1];\n"
               "                        h[tx] = g0; h[%ld + tx] = g0 + g1; h[%ld + tx] = g0 - g1; h[%ld + tx] = -g1;\n"
               "                    }\n"
               "                }\n"
               "                float *db = M + o * (long)ld + j * %ldL;\n"
               "                for (int b = 0; b < 4; b++) {\n"
               "                    const float *E = hb + b * %ldL, *Od = E + %ldL;\n"
               "                    float *d0 = db + b * ms, *d1 = d0 + 4 * ms, *d2 = d0 + 8 * ms, *d3 = d0 + 12 * ms;\n"
               "                    for (int t = 0; t < %ld; t++) { d0[t] = E[t]; d1[t] = E[t] + Od[t]; d2[t] = E[t] - Od[t]; d3[t] = -Od[t]; }\n"
               "                }\n"
               "            }\n",
            2 * TH, odd ? 2 * TW : W, T, TW, TW, 2 * T, 4 * T, 6 * T, T, 2 * T, T, T);
    cg_body(L, "            for (int xi = 0; xi < 16; xi++)\n"
               "                %s(MGC_ROW_MAJOR, MGC_NO_TRANS, MGC_TRANS, %d, %d, ld, 1.0f, M + xi * ms, ld, V + xi * vs, ld,\n"
               "                            n0 == e0 ? 0.0f : 1.0f, pg + xi * %ldL, %d);\n"
               "        }\n    }\n    free(V);\n",
            cg_sgemm_fn(L), O, C, OC, C);
    cg_end_kernel(L);
    int b2[2] = { cg_out_buf(L, id), part };
    Step *s2 = cg_kernel(L, id, "conv2d_grad_w_winograd_sum", dimc((OC + 63) / 64), 2, b2, (const char *const[]){ "=dw", "part" });
    s2->grain = 64 * 16 * CG_WGROUPS;
    s2->c_only = true;
    cg_body(L, "    /* dw [%d, %d, 3, 3] = G^T u G, u = the %d groups' partial gradients, added in order;\n"
               "       64 (o, c) pairs per iteration, their sums in lanes */\n"
               "    FOR_EACH(blk, %ldL) {\n"
               "        const long i0 = blk * 64, n = %ldL - i0 < 64 ? %ldL - i0 : 64;\n"
               "        float u[16][64];\n"
               "        for (int xi = 0; xi < 16; xi++)\n"
               "            for (long k = 0; k < n; k++) u[xi][k] = part[xi * %ldL + i0 + k];\n"
               "        for (int g = 1; g < %d; g++)\n"
               "            for (int xi = 0; xi < 16; xi++) {\n"
               "                const float *pg = part + (g * 16 + xi) * %ldL + i0;\n"
               "                for (long k = 0; k < n; k++) u[xi][k] += pg[k];\n"
               "            }\n"
               "        for (long k = 0; k < n; k++) {\n"
               "            float h[4][3];\n"
               "            for (int c = 0; c < 4; c++) {   /* G^T u: down the rows */\n"
               "                h[c][0] = u[c][k] + 0.5f * (u[4 + c][k] + u[8 + c][k]);\n"
               "                h[c][1] = 0.5f * (u[4 + c][k] - u[8 + c][k]);\n"
               "                h[c][2] = 0.5f * (u[4 + c][k] + u[8 + c][k]) + u[12 + c][k];\n"
               "            }\n"
               "            float *d = dw + (i0 + k) * 9;\n"
               "            for (int r = 0; r < 3; r++) {   /* (G^T u) G: across */\n"
               "                d[r * 3] = h[0][r] + 0.5f * (h[1][r] + h[2][r]);\n"
               "                d[r * 3 + 1] = 0.5f * (h[1][r] - h[2][r]);\n"
               "                d[r * 3 + 2] = 0.5f * (h[1][r] + h[2][r]) + h[3][r];\n"
               "            }\n"
               "        }\n"
               "    }\n", O, C, CG_WGROUPS, (OC + 63) / 64, OC, OC, OC, CG_WGROUPS, OC);
    cg_end_kernel(L);
}

void cg_lower_conv_winograd(Lower *L, int id, const ConvGeom *G)
{
    switch (L->g->nodes[id].op) {
    case OP_CONV2D: winograd_apply(L, id, G, false); break;
    case OP_CONV2D_BWD_X: winograd_apply(L, id, G, true); break;
    default: winograd_grad_w(L, id, G); break;   /* OP_CONV2D_BWD_W (cg_lower_conv calls for these three only) */
    }
}
