/*
** The direct forms of a convolution (CONV_DIRECT, codegen/conv.c says when):
** loops over whole planes with nothing materialised, forward and both
** gradients; their C-only variants (a row of outputs with every output channel
** in vectors, conv2d_rows_vec, with a fused 2x2 max pool; depthwise layers'
** own kernels over a zero-bordered copy of each plane); and the weight
** gradient that routes a fused 2x2 max pool's gradient itself. On GPUs the
** form is conv_direct_gpu.c's (a thread an element, not a plane).
*/
#include "conv_forms.h"
#include <string.h>

/* ------------------------------------------------------------ direct convolution */

/* The first input channel of output o's group in the generated code, "" or
   "(o / (O/groups)) * (C/groups) + " (cg_dilated has the rest). */
static const char *group_base(Lower *L, const ConvGeom *G, const char *o)
{
    return G->groups > 1 ? arena_printf(L->p->arena, "(%s / %d) * %d + ", o, G->O / G->groups, G->C / G->groups) : "";
}

/* Emits the loop header for output rows/columns whose input index
   o * S - P + k lies in [0, size): "int name0 = ..., name1 = ...;". */
static void valid_range(Lower *L, const char *name, const char *kvar, int S, int P, int size, int osize)
{
    /* past the last input (k > size - 1 + P: padding wider than the kernel's
       reach) no output is valid; C's division would round -1 / S up to 0 */
    cg_body(L, "%*sint %s0 = %s < %d ? (%d - %s + %d) / %d : 0, %s1 = %s > %d ? 0 : (%d + %d - %s) / %d + 1;\n"
               "%*sif (%s1 > %d) %s1 = %d;\n",
            12, "", name, kvar, P, P, kvar, S - 1, S, name, kvar, size - 1 + P, size - 1, P, kvar, S, 12, "", name,
            osize, name, osize);
}

/* The C-only direct convolution below: stride 1, no padding, rows a multiple of 8
   up to 48 floats, and O x (vectors a row) sums in registers (twice that with a
   fused pool: two rows at once). */
bool cg_conv_rows_vec_fits(bool cpu_only, const ConvGeom *G, bool pairs)
{
    int pieces = G->OW / 16 + (G->OW % 16) / 8;
    return cpu_only && G->groups == 1 && G->D == 1 && G->P == 0 && G->S == 1 && G->OW % 8 == 0 && G->OW <= 48 &&
           G->O * pieces * (pairs ? 2 : 1) <= (pairs ? 24 : 16) && (!pairs || G->OH % 2 == 0);
}

/* C only (CPU programs): one output row (n, oy) per iteration with all O channels at
   once, the row in vectors of 16 and 8 (the C prelude's), so each input row read serves
   every output channel and the O * pieces sums are independent (the plane-at-a-time form
   below waits on one chain of K*K additions per element). Stride 1, no padding: every
   load is inside the row (kx + OW <= W). LeNet's conv1: 1.07 -> 0.53 ms a step on one
   thread. With a 2x2 max pool fused (cg_pool_of: the ReLU's output is still written,
   the pool's gradient reads it), two output rows per iteration: each input row read
   serves both (K + 1 rows for 2K row-taps), and the pool of the two rows is taken from
   the sums just stored, into the pool's buffer. */
static void conv_rows_vec(Lower *L, int id, const ConvGeom *G, const int *b0, bool bias)
{
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, OH = G->OH, OW = G->OW;
    int pieces = OW / 16 + (OW % 16) / 8, pool = cg_pool_of(L->dec, id), R = pool >= 0 ? 2 : 1;
    int b[5] = { b0[0], b0[1], b0[2], b0[3], -1 };
    const char *names[5] = { "=y", "x", "w", "bias", "=py" };
    int nargs = bias ? 4 : 3;
    if (pool >= 0) {
        b[nargs] = cg_out_buf(L, pool);
        names[nargs++] = "=py";
    }
    Step *st = cg_conv_kernel(L, id, pool >= 0 ? "conv2d_rows_vec_pool" : "conv2d_rows_vec", dimn(OH / R), nargs, b, names);
    st->grain = (long)R * OW * C * K * K * O;
    st->c_only = true;
    cg_body(L, "    /* x [N, %d, %d, %d], w [%d, %d, %d, %d], y [N, %d, %d, %d]; stride 1, no padding;\n"
               "       %s per iteration, all %d output channels, a row in vectors%s */\n",
            C, H, W, O, C, K, K, O, OH, OW, R == 2 ? "two output rows (n, oy), (n, oy + 1)" : "one output row (n, oy)", O,
            pool >= 0 ? arena_printf(L->p->arena, ";\n       and their 2x2 max pool, py [N, %d, %d, %d]", O, OH / 2, OW / 2) : "");
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        long n = i / %d; int oy = (int)(i %% %d) * %d;\n",
            cg_work_str(L, dimn(OH / R)), OH / R, OH / R, R);
    for (int r = 0; r < R; r++)
        for (int o = 0; o < O; o++)
            for (int q = 0, off = 0; q < pieces; q++, off += 16)
                cg_body(L, "        mgc_f%d a%d_%d_%d = { 0 };\n", OW - off >= 16 ? 16 : 8, r, o, q);
    if (bias)
        for (int r = 0; r < R; r++)
            for (int o = 0; o < O; o++)
                for (int q = 0; q < pieces; q++) cg_body(L, "        a%d_%d_%d += bias[%d];\n", r, o, q, o);
    cg_body(L, "        for (int c = 0; c < %d; c++) {\n"
               "            const float *wc = w + c * %d;\n", C, K * K);
    for (int xr = 0; xr < K + R - 1; xr++) {   /* input row oy + xr: tap row xr - r of output row oy + r */
        cg_body(L, "            {   /* input row oy + %d */\n"
                   "                const float *xr = x + ((n * %d + c) * %d + oy + %d) * %d;\n"
                   "                for (int kx = 0; kx < %d; kx++) {\n",
                xr, C, H, xr, W, K);
        for (int q = 0, off = 0; q < pieces; q++, off += 16)
            cg_body(L, "                    const mgc_f%d v%d = mgc_load%d(xr + kx + %d);\n", OW - off >= 16 ? 16 : 8, q,
                    OW - off >= 16 ? 16 : 8, off);
        for (int r = 0; r < R; r++) {
            int ky = xr - r;
            if (ky < 0 || ky >= K) continue;
            for (int o = 0; o < O; o++) {
                cg_body(L, "                    { const float wv = wc[%d + kx];", o * C * K * K + ky * K);
                for (int q = 0; q < pieces; q++) cg_body(L, " a%d_%d_%d += wv * v%d;", r, o, q, q);
                cg_body(L, " }\n");
            }
        }
        cg_body(L, "                }\n            }\n");
    }
    cg_body(L, "        }\n"
               "        float t[%d][%d];\n", R, OW);
    for (int o = 0; o < O; o++) {
        for (int r = 0; r < R; r++) {
            for (int q = 0, off = 0; q < pieces; q++, off += 16)
                cg_body(L, "        __builtin_memcpy(t[%d] + %d, &a%d_%d_%d, sizeof a%d_%d_%d);\n", r, off, r, o, q, r, o, q);
            cg_body(L, "        { float *yr = y + ((n * %d + %d) * %d + oy + %d) * %d;\n"
                       "          for (int ox = 0; ox < %d; ox++) %s }\n",
                    O, o, OH, r, OW, OW,
                    cg_act_beside(L->dec, id) >= 0   /* a pool is fused only after ReLU, in place */
                        ? cg_store(L, id, "yr", "ox", arena_printf(L->p->arena, "t[%d][ox]", r))
                        : arena_printf(L->p->arena, "yr[ox] = t[%d][ox] = %s;", r, cg_conv_act(L, id, arena_printf(L->p->arena, "t[%d][ox]", r))));
        }
        if (pool >= 0)   /* a ReLU's output: no NaN, plain maxima */
            cg_body(L, "        { float *pr = py + ((n * %d + %d) * %d + oy / 2) * %d;\n"
                       "          for (int px = 0; px < %d; px++) {\n"
                       "              float m0 = t[0][2 * px] > t[0][2 * px + 1] ? t[0][2 * px] : t[0][2 * px + 1];\n"
                       "              float m1 = t[1][2 * px] > t[1][2 * px + 1] ? t[1][2 * px] : t[1][2 * px + 1];\n"
                       "              pr[px] = m0 > m1 ? m0 : m1;\n"
                       "          } }\n",
                    O, o, OH / 2, OW / 2, OW / 2);
    }
    cg_body(L, "    }\n");
    cg_end_kernel(L);
}

/* Depthwise layers (one input channel a group) on CPUs: the plane at a time form
   below walks the output plane once per tap (a load and a store per multiply-add,
   and the valid range of every tap computed); here each (n, o) plane's input is
   copied once into a zero-bordered scratch plane on the stack, and each output
   element sums its K*K taps from it with the weights in registers: no test per
   element, one store. Kernels up to 7x7, planes up to 64 KB padded. */
#define CG_DW_MAX_PAD_FLOATS 16384

static bool dw_plane_fits(const ConvGeom *G)
{
    return G->K <= 7 && ((long)G->H + 2 * G->P) * ((long)G->W + 2 * G->P) <= CG_DW_MAX_PAD_FLOATS;
}

bool cg_conv_depthwise_fits(bool cpu_only, const ConvGeom *G)
{
    return cpu_only && G->groups > 1 && G->C == G->groups && dw_plane_fits(G);
}

/* The kernel's scratch plane `pad` ((H + 2B) x (W + 2B), and `extra` floats after it), written before its
   FOR_EACH: zeroed once, a thread's planes each copied inside the zero border (padded_plane), which no copy
   touches. */
static void padded_scratch(Lower *L, int H, int W, int B, int extra)
{
    long n = ((long)H + 2 * B) * ((long)W + 2 * B) + extra;
    cg_text(L, "    float pad[$n];   /* a plane with $B zeros around$extra: the border zeroed once */\n"
               "    for (long k = 0; k < ${n}L; k++) pad[k] = 0.0f;\n"
               "    const float *pad_of = 0;   /* the plane inside it */\n",
            cg_n("n", n), cg_n("B", B), cg_s("extra", extra ? arena_printf(L->p->arena, " and %d after it", extra) : ""));
}

/* The body's copy of plane `src` (H x W) into pad's inside (padded_scratch), unless it is there already
   (a channel multiplier's outputs, one after another, share their input plane): rows of 16 or more a
   vector at a time, the last ending at the row's end. */
static void padded_plane(Lower *L, const char *src, int H, int W, int B)
{
    cg_text(L, W >= 16 ? "        if ($src != pad_of)\n"
                         "            for (int iy = 0; iy < $H; iy++)\n"
                         "                for (int i0 = 0; i0 < $W; i0 += 16) {\n"
                         "                    const int ix = i0 + 16 <= $W ? i0 : $W - 16;\n"
                         "                    mgc_store16(pad + (iy + $B) * ${Wp}L + $B + ix, mgc_load16($src + iy * $W + ix));\n"
                         "                }\n"
                         "        pad_of = $src;\n"
                       : "        if ($src != pad_of)\n"
                         "            for (int iy = 0; iy < $H; iy++)\n"
                         "                for (int ix = 0; ix < $W; ix++) pad[(iy + $B) * ${Wp}L + $B + ix] = ${src}[iy * $W + ix];\n"
                         "        pad_of = $src;\n",
            cg_n("H", H), cg_n("W", W), cg_n("B", B), cg_n("Wp", (long)W + 2 * B), cg_s("src", src));
}

/* Output rows narrower than this (stride 1) are summed as one run over the padded width (below). */
#define CG_DW_NARROW 16

/* Same-size planes (stride 1, OH = H, OW = W) narrower than CG_DW_NARROW, of at least 16 positions: the
   plane as one flat run of H*W outputs, 16 at a time (one mgc_f16), each tap a load at a fixed offset from
   the output's own index, its lanes whose tap falls outside the plane (a row above or below, a column beside)
   zeroed by a mask: no padded copy, nothing computed that is thrown away. The plane's neighbours in memory
   are read (and masked); the first and last plane of the tensor, which have none on one side, go through a
   zero-bordered copy. The sums are the padded forms' to the bit (a masked lane adds w * +0, as a zero border
   does). The masks are per tap and position, K*K*ceil16(H*W) ints, at most CG_DW_FLAT_MASKS. */
#define CG_DW_FLAT_MASKS 4096

static long ceil16(long v) { return (v + 15) / 16 * 16; }

static bool flat_plane_fits(const ConvGeom *G)
{
    long HW = (long)G->H * G->W, R = (long)G->P * G->W + G->P;   /* R: the farthest tap's distance */
    return G->S == 1 && G->OH == G->H && G->OW == G->W && 2L * G->P == (long)(G->K - 1) * G->D && G->W < CG_DW_NARROW &&
           HW >= 16 && (long)G->K * G->K * ceil16(HW) <= CG_DW_FLAT_MASKS && ceil16(HW) - HW + R <= HW;
}

/* The flat form's tap masks, written before the kernel's FOR_EACH. */
static void flat_masks(Lower *L, const ConvGeom *G)
{
    long HW = (long)G->H * G->W;
    cg_text(L, "    /* mt[tap][p]: all ones where output p's tap lies inside the plane, else 0 */\n"
               "    int mt[$KK][$HW16];\n"
               "    for (int ky = 0; ky < $K; ky++)\n"
               "        for (int kx = 0; kx < $K; kx++)\n"
               "            for (int p = 0; p < $HW16; p++) {\n"
               "                const int py = p / $W + ky * $D - $P, px = p % $W + kx * $D - $P;\n"
               "                mt[ky * $K + kx][p] = -(p < $HW && py >= 0 && py < $H && px >= 0 && px < $W);\n"
               "            }\n",
            cg_n("KK", G->K * G->K), cg_n("HW16", ceil16(HW)), cg_n("K", G->K), cg_n("W", G->W), cg_n("D", G->D),
            cg_n("P", G->P), cg_n("HW", HW), cg_n("H", G->H));
}

/* The flat form's text for one plane: `src` (a const float * the text may repoint), plane `plane` of the
   tensor's `planes`, summed into each output's v, which `store` (a statement of o0 + l and v) keeps.
   `flip`: the taps mirrored (the input gradient); `b0`: the sum's first term ("" for none). */
static void flat_plane(Lower *L, const ConvGeom *G, const char *src, const char *plane, const char *planes, bool flip,
                       const char *b0, const char *store)
{
    Arena *a = L->p->arena;
    int K = G->K, W = G->W, D = G->D, P = G->P;
    long HW = (long)G->H * W, R = (long)P * W + P;
    const char *sum = b0;
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            long off = (long)(ky * D - P) * W + kx * D - P;
            int wy = flip ? K - 1 - ky : ky, wx = flip ? K - 1 - kx : kx;
            const char *ld = off ? arena_printf(a, "(mgc_f16)((mgc_i16)mgc_load16(q %c %ld) & mgc_load16i(mt[%d] + o0))",
                                                off < 0 ? '-' : '+', off < 0 ? -off : off, ky * K + kx)
                                 : "mgc_load16(q)";
            sum = arena_printf(a, "%s%sw%d_%d * %s", sum, *sum ? " + " : "", wy, wx, ld);
        }
    cg_text(L, "        float pad[$padn];   /* the first and last plane: a copy with $R zeros around */\n"
               "        if ($plane == 0 || $plane == $planes - 1) {\n"
               "            for (int k = 0; k < $R; k++) pad[k] = 0.0f;\n"
               "            for (int k = 0; k < $HW; k++) pad[$R + k] = ${src}[k];\n"
               "            for (int k = $R + $HW; k < $padn; k++) pad[k] = 0.0f;\n"
               "            $src = pad + $R;\n"
               "        }\n",
            cg_n("padn", 2 * R + ceil16(HW)), cg_n("R", R), cg_s("plane", plane), cg_s("planes", planes), cg_n("HW", HW),
            cg_s("src", src));
    cg_text(L, "        for (int o0 = 0; o0 < $HW; o0 += 16) {\n"
               "            const float *q = $src + o0;\n"
               "            float t[16];\n"
               "            mgc_store16(t, $sum);\n"
               "            const int len = $len;\n"
               "            _Pragma(\"GCC unroll 1\") for (int l = 0; l < len; l++) {   /* vectorised, not unrolled into branches */\n"
               "                const float v = t[l];\n"
               "                $store\n"
               "            }\n"
               "        }\n",
            cg_n("HW", HW), cg_s("src", src), cg_s("sum", sum),
            cg_s("len", HW % 16 ? arena_printf(a, "%ld - o0 < 16 ? %ld - o0 : 16", HW, HW) : "16"), cg_s("store", store));
}

/* The body's sum over a K x K window of `pad` (Wp wide) at row `row0` and column
   `col0` + ox * S, taps D apart, with the weights w<ky>_<kx> ("flip": the taps
   mirrored, for the input gradient): "w0_0 * r0[...] + ...". `vec`: of the 16
   outputs from ox, "w0_0 * mgc_load16(r0 + ox + 0) + ..." (stride 1). */
static const char *window_sum(Lower *L, int K, int S, int D, bool flip, bool vec)
{
    Arena *a = L->p->arena;
    const char *sum = "";
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            int wy = flip ? K - 1 - ky : ky, wx = flip ? K - 1 - kx : kx;
            const char *w = arena_printf(a, "%s%sw%d_%d * ", sum, *sum ? " + " : "", wy, wx);
            sum = vec ? arena_printf(a, "%smgc_load16(r%d + ox + %d)", w, ky, kx * D)
                      : arena_printf(a, "%sr%d[ox%s + %d]", w, ky, S > 1 ? arena_printf(a, " * %d", S) : "", kx * D);
        }
    return sum;
}

/* Stride-1 rows of at least 16 outputs (`rows` of `width`) over `pad` (rows `ld` apart), 16 a vector:
   each row's vectors from its start, the last one ending at the row's end (it overlaps the one before:
   those outputs are computed again, to the same bits). `first`: the sum's first term ("" for none). The
   vector v stored whole at `dst` + the output's index as `vec` (an mgc_f16 expression of v; where storing
   an output twice is harmless), or, vec NULL, each output v not stored before by `store` (a statement
   of row or_, column ox + l and v). The sums are the scalar rows' to the bit (the same terms in the
   same order). */
static void vector_rows(Lower *L, const ConvGeom *G, int rows, int width, long ld, bool flip, const char *first, const char *vec,
                        const char *dst, const char *store)
{
    int K = G->K, D = G->D;
    const char *sum = window_sum(L, K, 1, D, flip, true);
    cg_text(L, "        for (int or_ = 0; or_ < $rows; or_++) {\n", cg_n("rows", rows));
    for (int ky = 0; ky < K; ky++)
        cg_text(L, "            const float *r$ky = pad + (or_ + $kyD) * ${ld}L;\n", cg_n("ky", ky), cg_n("kyD", ky * D), cg_n("ld", ld));
    cg_text(L, "            for (int o0 = 0; o0 < $width; o0 += 16) {\n"
               "                const int ox = o0 + 16 <= $width ? o0 : $last;   /* the last 16 end at the row's end */\n"
               "                const mgc_f16 v = $sum;\n",
            cg_n("width", width), cg_n("last", width - 16), cg_s("sum", *first ? arena_printf(L->p->arena, "%s + %s", first, sum) : sum));
    if (vec)
        cg_text(L, "                mgc_store16($dst + or_ * $width + ox, $vec);\n", cg_s("dst", dst), cg_n("width", width), cg_s("vec", vec));
    else
        cg_text(L, "                for (int l = o0 - ox; l < 16; l++) {\n"
                   "                    const float vl = v[l];\n"
                   "                    $store\n"
                   "                }\n",
                cg_s("store", store));
    cg_body(L, "            }\n        }\n");
}

static void conv_depthwise_forward(Lower *L, int id, const ConvGeom *G, const int *b, bool bias)
{
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, P = G->P, D = G->D, OH = G->OH, OW = G->OW;
    int Og = O / C;
    long Wp = (long)W + 2 * P;
    Step *st = cg_conv_kernel(L, id, "conv2d_depthwise", dimn(O), bias ? 4 : 3, b, (const char *const[]){ "=y", "x", "w", "bias" });
    st->grain = (long)OH * OW * K * K;
    st->c_only = true;
    /* stride 2 on a plane the flat form takes: the stride-1 layer's outputs (the flat form's), every other
       row and column kept: the same taps summed in the same order, in vectors, where the stride-2 loads
       of a row are not */
    ConvGeom G1 = *G;
    G1.S = 1, G1.OH = H, G1.OW = W;
    bool half = S == 2 && D == 1 && flat_plane_fits(&G1) && OH == (H + 1) / 2 && OW == (W + 1) / 2;
    bool flat = half || flat_plane_fits(G), narrow = !flat && S == 1 && OW < CG_DW_NARROW;
    cg_body(L, "    /* x [N, %d, %d, %d], w [%d, 1, %d, %d], y [N, %d, %d, %d]; stride %d, padding %d%s;\n"
               "       one (n, o) plane per iteration: %s,\n"
               "       each output the sum of its %d taps, the weights in registers */\n",
            C, H, W, O, K, K, O, OH, OW, S, P, cg_groups_dilation(L, G),
            !flat  ? "its input plane once into a zero-bordered copy"
            : half ? "the stride-1 outputs as one flat run (taps off the\n"
                     "       plane masked), every other row and column kept"
                   : "the outputs as one flat run, 16 a vector (taps off the plane masked)",
            K * K);
    if (flat) flat_masks(L, half ? &G1 : G);
    else padded_scratch(L, H, W, P, narrow ? (K - 1) * D : 0);
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        long n = i / %d, o = i %% %d;\n"
               "        const float *xp = x + (n * %d + o / %d) * %d;\n",
            cg_work_str(L, dimn(O)), O, O, C, Og, H * W);
    if (!flat) padded_plane(L, "xp", H, W, P);
    cg_body(L, "        const float *wp = w + o * %d, b0 = %s;\n", K * K, bias ? "bias[o]" : "0.0f");
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) cg_body(L, "        const float w%d_%d = wp[%d];\n", ky, kx, ky * K + kx);
    cg_body(L, "        float *yp = y + i * %d;\n", OH * OW);
    /* the flat forms' input plane: its index among the tensor's planes, and their count */
    const char *plane = arena_printf(L->p->arena, "(n * %d + o / %d)", C, Og), *planes = arena_printf(L->p->arena, "%ldL * N", (long)C);
    if (half) {
        cg_body(L, "        float full[%ld];   /* the stride-1 outputs */\n", ceil16((long)H * W));
        flat_plane(L, &G1, "xp", plane, planes, false, "b0", "full[o0 + l] = v;");
        cg_text(L, "        for (int oy = 0; oy < $OH; oy++)\n"
                   "            for (int ox = 0; ox < $OW; ox++) {\n"
                   "                const float v = full[oy * ${W2}L + ox * 2];\n"
                   "                $store\n"
                   "            }\n"
                   "    }\n",
                cg_n("OH", OH), cg_n("OW", OW), cg_n("W2", 2L * W), cg_s("store", cg_store(L, id, "yp", arena_printf(L->p->arena, "oy * %d + ox", OW), "v")));
        cg_end_kernel(L);
        return;
    }
    if (flat) {
        flat_plane(L, G, "xp", plane, planes, false, "b0", cg_store(L, id, "yp", "o0 + l", "v"));
        cg_body(L, "    }\n");
        cg_end_kernel(L);
        return;
    }
    if (narrow) {
        /* rows too short to vectorise: every output over the padded width as one run (t[oy * Wp + ox]; the
           last Wp - OW of a row are thrown away), its taps at fixed offsets, then the row's first OW stored */
        cg_body(L, "        float t[%ldL];   /* the outputs over the padded width, %ld a row, the first %d kept */\n", OH * Wp, Wp, OW);
        for (int ky = 0; ky < K; ky++) cg_body(L, "        const float *r%d = pad + %ldL;\n", ky, ky * D * Wp);
        cg_body(L, "        for (int ox = 0; ox < %ld; ox++) t[ox] = b0 + %s;\n"
                   "        for (int oy = 0; oy < %d; oy++) {\n"
                   "            float *yr = yp + oy * %d;\n"
                   "            for (int ox = 0; ox < %d; ox++) {\n"
                   "                const float v = t[oy * %ldL + ox];\n"
                   "                %s\n"
                   "            }\n        }\n    }\n",
                OH * Wp, window_sum(L, K, 1, D, false, false), OH, OW, OW, Wp, cg_store(L, id, "yr", "ox", "v"));
        cg_end_kernel(L);
        return;
    }
    if (S == 1 && OW >= 16) {   /* rows of 16 outputs a vector */
        vector_rows(L, G, OH, OW, Wp, false, "b0", cg_store_vec(L, id), "yp",
                    cg_store(L, id, "yp", arena_printf(L->p->arena, "or_ * %d + ox + l", OW), "vl"));
        cg_body(L, "    }\n");
        cg_end_kernel(L);
        return;
    }
    cg_body(L, "        for (int oy = 0; oy < %d; oy++) {\n", OH);
    for (int ky = 0; ky < K; ky++) cg_body(L, "            const float *r%d = pad + (oy * %d + %d) * %ldL;\n", ky, S, ky * D, Wp);
    cg_body(L, "            float *yr = yp + oy * %d;\n"
               "            for (int ox = 0; ox < %d; ox++) {\n"
               "                const float v = b0 + %s;\n"
               "                %s\n"
               "            }\n        }\n    }\n",
            OW, OW, window_sum(L, K, S, D, false, false), cg_store(L, id, "yr", "ox", "v"));
    cg_end_kernel(L);
}

/* The input gradient of a depthwise layer with stride 1 (CPUs): a correlation of
   each output's gradient plane with its kernel mirrored, over the gradient plane
   with (K-1)*D - P zeros around; a channel with several outputs (Og) adds theirs. */
static bool depthwise_grad_x_fits(bool cpu_only, const ConvGeom *G)
{
    long B = (long)(G->K - 1) * G->D - G->P;
    return cg_conv_depthwise_fits(cpu_only, G) && G->S == 1 && B >= 0 &&
           ((long)G->OH + 2 * B) * ((long)G->OW + 2 * B) <= CG_DW_MAX_PAD_FLOATS;
}

static void conv_depthwise_grad_x(Lower *L, int id, const ConvGeom *G, const int *b)
{
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, P = G->P, D = G->D, OH = G->OH, OW = G->OW;
    int Og = O / C, B = (K - 1) * D - P;
    long Wp = (long)OW + 2 * B;
    Step *st = cg_kernel(L, id, "conv2d_grad_x_depthwise", dimn(C), 3, b, (const char *const[]){ "=dx", "dy", "w" });
    st->grain = (long)H * W * K * K * Og;
    st->c_only = true;
    cg_body(L, "    /* dy [N, %d, %d, %d], w [%d, 1, %d, %d], dx [N, %d, %d, %d]; stride 1, padding %d%s;\n"
               "       one (n, c) plane of dx per iteration: for each of its %d output%s, dy's plane with %d zeros\n"
               "       around, correlated with the mirrored kernel (the weights in registers) */\n",
            O, OH, OW, O, K, K, C, H, W, P, cg_groups_dilation(L, G), Og, Og == 1 ? "" : "s", B);
    bool flat = flat_plane_fits(G), narrow = !flat && W < CG_DW_NARROW;
    if (flat) flat_masks(L, G);
    else padded_scratch(L, OH, OW, B, narrow ? (K - 1) * D : 0);
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        long n = i / %d, c = i %% %d;\n"
               "        float *dxp = dx + i * %d;\n"
               "        for (int j = 0; j < %d; j++) {\n"
               "        const long o = c * %d + j;\n"
               "        const float *dyp = dy + (n * %d + o) * %d;\n",
            cg_work_str(L, dimn(C)), C, C, H * W, Og, Og, O, OH * OW);
    if (!flat) padded_plane(L, "dyp", OH, OW, B);
    cg_body(L, "        const float *wp = w + o * %d;\n", K * K);
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) cg_body(L, "        const float w%d_%d = wp[%d];\n", ky, kx, ky * K + kx);
    if (flat) {   /* the forward's flat form over dy's plane (the same size), the taps mirrored */
        flat_plane(L, G, "dyp", arena_printf(L->p->arena, "(n * %d + o)", O), arena_printf(L->p->arena, "%ldL * N", (long)O), true, "",
                   "dxp[o0 + l] = j ? dxp[o0 + l] + v : v;");
        cg_body(L, "        }\n    }\n");
        cg_end_kernel(L);
        return;
    }
    if (narrow) {   /* as the forward's narrow rows: one run over the padded width, each row's first W kept */
        cg_body(L, "        float t[%ldL];   /* over the padded width, %ld a row, the first %d kept */\n", H * Wp, Wp, W);
        for (int ky = 0; ky < K; ky++) cg_body(L, "        const float *r%d = pad + %ldL;\n", ky, ky * D * Wp);
        cg_body(L, "        for (int ox = 0; ox < %ld; ox++) t[ox] = %s;\n"
                   "        for (int iy = 0; iy < %d; iy++)\n"
                   "            for (int ix = 0; ix < %d; ix++) dxp[iy * %d + ix] = j ? dxp[iy * %d + ix] + t[iy * %ldL + ix] : t[iy * %ldL + ix];\n"
                   "        }\n    }\n",
                H * Wp, window_sum(L, K, 1, D, true, false), H, W, W, W, Wp, Wp);
        cg_end_kernel(L);
        return;
    }
    if (W >= 16) {   /* rows of 16 a vector */
        vector_rows(L, G, H, W, Wp, true, "", Og == 1 ? "v" : NULL, "dxp",
                    arena_printf(L->p->arena, "dxp[or_ * %d + ox + l] = j ? dxp[or_ * %d + ox + l] + vl : vl;", W, W));
        cg_body(L, "        }\n    }\n");
        cg_end_kernel(L);
        return;
    }
    cg_body(L, "        for (int iy = 0; iy < %d; iy++) {\n", H);
    for (int ky = 0; ky < K; ky++) cg_body(L, "            const float *r%d = pad + (iy + %d) * %ldL;\n", ky, ky * D, Wp);
    cg_body(L, "            float *xr = dxp + iy * %d;\n"
               "            for (int ox = 0; ox < %d; ox++) {\n"
               "                const float v = %s;\n"
               "                xr[ox] = j ? xr[ox] + v : v;\n"
               "            }\n        }\n        }\n    }\n",
            W, W, window_sum(L, K, 1, D, true, false));
    cg_end_kernel(L);
}

/* The weight gradient of a depthwise layer (CPUs): per output channel, over the
   batch, each input plane once into a zero-bordered copy and, row by row, every
   tap's partial sums per output column from it (no valid range per tap). */
static bool depthwise_grad_w_fits(bool cpu_only, const ConvGeom *G)
{
    return cg_conv_depthwise_fits(cpu_only, G) && (long)G->K * G->K * G->OW <= 4096;
}

static void conv_depthwise_grad_w(Lower *L, int id, const ConvGeom *G, const int *b)
{
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, P = G->P, D = G->D, OH = G->OH, OW = G->OW;
    int Og = O / C;
    long Wp = (long)W + 2 * P;
    Step *st = cg_kernel(L, id, "conv2d_grad_w_depthwise", dimc(O), 3, b, (const char *const[]){ "=dw", "dy", "x" });
    st->heavy = st->blocks = st->c_only = true;
    cg_body(L, "    /* dy [N, %d, %d, %d], x [N, %d, %d, %d], dw [%d, 1, %d, %d]; stride %d, padding %d%s;\n"
               "       one output channel per iteration: over the batch, its input plane once into a\n"
               "       zero-bordered copy, and per output row every tap's partial sums per column */\n",
            O, OH, OW, C, H, W, O, K, K, S, P, cg_groups_dilation(L, G));
    padded_scratch(L, H, W, P, 0);
    cg_body(L, "    FOR_EACH_BLOCK(o, %dL) {\n"
               "        float part[%d][%d];\n"
               "        for (int k = 0; k < %d; k++) for (int j = 0; j < %d; j++) part[k][j] = 0.0f;\n"
               "        BLOCK_LOOP(n, N) {\n"
               "        const float *xp = x + (n * %d + o / %d) * %d, *dyp = dy + (n * %d + o) * %d;\n",
            O, K * K, OW, K * K, OW, C, Og, H * W, O, OH * OW);
    padded_plane(L, "xp", H, W, P);
    cg_body(L, "        for (int oy = 0; oy < %d; oy++) {\n", OH);
    for (int ky = 0; ky < K; ky++) cg_body(L, "            const float *r%d = pad + (oy * %d + %d) * %ldL;\n", ky, S, ky * D, Wp);
    cg_body(L, "            const float *g = dyp + oy * %d;\n"
               "            for (int ox = 0; ox < %d; ox++) {\n"
               "                const float gv = g[ox];\n", OW, OW);
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++)
            cg_body(L, "                part[%d][ox] += gv * r%d[ox%s + %d];\n", ky * K + kx, ky,
                    S > 1 ? arena_printf(L->p->arena, " * %d", S) : "", kx * D);
    cg_body(L, "            }\n        }\n        }\n"
               "        for (int k = 0; k < %d; k++) {\n"
               "            float acc = 0.0f;\n"
               "            for (int j = 0; j < %d; j++) acc += part[k][j];\n"
               "            acc = BLOCK_SUM(acc);\n"
               "            if (BLOCK_LEADER) dw[o * %d + k] = acc;\n"
               "        }\n    }\n", K * K, OW, K * K);
    cg_end_kernel(L);
}

/* x, w, bias? -> y, one (n, o) output plane per iteration; without padding a row of
   outputs at a time, with every tap of a kernel row in registers */
void cg_conv_direct_forward(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, P = G->P, OH = G->OH, OW = G->OW;
    bool bias = n->nin == 3;
    int b[4] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), bias ? buf_of(L, n->in[2]) : -1 };
    if (!L->dec->cpu_only) {
        cg_conv_direct_gpu_forward(L, id, G, b, bias);
        return;
    }
    if (cg_conv_rows_vec_fits(L->dec->cpu_only, G, false)) {   /* C only: all output channels in vectors */
        conv_rows_vec(L, id, G, b, bias);
        return;
    }
    /* C only: depthwise layers, and a layer of one input channel as one (its O outputs the planes of a
       channel multiplier of O, as a stem's on grey images) */
    if (cg_conv_depthwise_fits(L->dec->cpu_only, G) || (L->dec->cpu_only && C == 1 && G->groups == 1 && dw_plane_fits(G))) {
        conv_depthwise_forward(L, id, G, b, bias);
        return;
    }
    int Cg = C / G->groups, D = G->D;
    const char *gx = group_base(L, G, "o"), *kyv = cg_dilated(L, "ky", D), *kxv = cg_dilated(L, "kx", D);
    if (P == 0 && K <= 7 && G->groups == 1 && D == 1) {
        /* No padding: a row of outputs gathers a whole row of taps (kx) per input row read. */
        cg_conv_kernel(L, id, "conv2d_rows", dimn(O), bias ? 4 : 3, b, (const char *const[]){ "=y", "x", "w", "bias" })->grain =
            (long)OH * OW * C * K * K;
        cg_body(L, "    /* x [N, %d, %d, %d], w [%d, %d, %d, %d], y [N, %d, %d, %d]; stride %d, no padding;\n"
                   "       one (n, o) output plane per iteration, a row of outputs at a time */\n",
                C, H, W, O, C, K, K, O, OH, OW, S);
        cg_body(L, "    FOR_EACH(i, %s) {\n"
                   "        long n = i / %d, o = i %% %d;\n"
                   "        const float b0 = %s;\n"
                   "        for (int oy = 0; oy < %d; oy++) {\n"
                   "            float acc[%d];\n"
                   "            for (int ox = 0; ox < %d; ox++) acc[ox] = b0;\n"
                   "            for (int c = 0; c < %d; c++)\n"
                   "                for (int ky = 0; ky < %d; ky++) {\n"
                   "                    const float *xr = x + ((n * %d + c) * %d + oy * %d + ky) * %d;\n"
                   "                    const float *wr = w + ((o * %d + c) * %d + ky) * %d;\n",
                cg_work_str(L, dimn(O)), O, O, bias ? "bias[o]" : "0.0f", OH, OW, OW, C, K, C, H, S, W, C, K, K);
        for (int j = 0; j < K; j++) cg_body(L, "                    const float w%d = wr[%d];\n", j, j);
        cg_body(L, "                    for (int ox = 0; ox < %d; ox++)\n                        acc[ox] += ", OW);
        for (int j = 0; j < K; j++) cg_body(L, "%sw%d * xr[ox * %d + %d]", j ? " + " : "", j, S, j);
        cg_body(L, ";\n                }\n"
                   "            float *yr = y + (i * %d + oy) * %d;\n"
                   "            for (int ox = 0; ox < %d; ox++) %s\n"
                   "        }\n    }\n", OH, OW, OW,
                cg_store(L, id, "yr", "ox", "acc[ox]"));
        cg_end_kernel(L);
        return;
    }
    cg_conv_kernel(L, id, "conv2d_direct", dimn(O), bias ? 4 : 3, b, (const char *const[]){ "=y", "x", "w", "bias" })->grain = (long)OH * OW * Cg * K * K;
    cg_body(L, "    /* x [N, %d, %d, %d], w [%d, %d, %d, %d], y [N, %d, %d, %d]; stride %d, padding %d%s;\n"
               "       one (n, o) output plane per iteration, accumulated in place */\n",
            C, H, W, O, Cg, K, K, O, OH, OW, S, P, cg_groups_dilation(L, G));
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        long n = i / %d, o = i %% %d;\n"
               "        float *yp = y + i * %d;\n"
               "        const float b0 = %s;\n"
               "        for (int k = 0; k < %d; k++) yp[k] = b0;\n"
               "        for (int c = 0; c < %d; c++) {\n"
               "            const float *xp = x + (n * %d + %sc) * %d, *wp = w + (o * %d + c) * %d;\n"
               "            for (int ky = 0; ky < %d; ky++)\n"
               "            for (int kx = 0; kx < %d; kx++) {\n"
               "            const float wv = wp[ky * %d + kx];\n",
            cg_work_str(L, dimn(O)), O, O, OH * OW, bias ? "bias[o]" : "0.0f", OH * OW, Cg, C, gx, H * W, Cg, K * K, K, K, K);
    valid_range(L, "oy", kyv, S, P, H, OH);
    valid_range(L, "ox", kxv, S, P, W, OW);
    cg_body(L, "            for (int oy = oy0; oy < oy1; oy++) {\n"
               "                const float *xr = xp + (oy * %d - %d + %s) * %d - %d + %s;\n"
               "                float *yr = yp + oy * %d;\n"
               "                for (int ox = ox0; ox < ox1; ox++) yr[ox] += wv * xr[ox * %d];\n"
               "            }\n            }\n        }\n", S, P, kyv, W, P, kxv, OW, S);
    if (cg_relu_out(L->dec, id))
        cg_body(L, "        for (int k = 0; k < %d; k++) yp[k] = yp[k] > 0.0f ? yp[k] : 0.0f;   /* fused relu */\n", OH * OW);
    else if (cg_act(L->dec, id) >= 0)
        cg_body(L, "        for (int k = 0; k < %d; k++) %s   /* fused %s */\n", OH * OW, cg_store(L, id, "yp", "k", "yp[k]"),
                ir_op_name((Op)cg_act(L->dec, id)));
    cg_body(L, "    }\n");
    cg_end_kernel(L);
}

/* dy, w -> dx, one (n, c) plane of dx per iteration, scattered from every output it fed */
void cg_conv_direct_grad_x(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, P = G->P, OH = G->OH, OW = G->OW;
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    if (!L->dec->cpu_only) {
        cg_conv_direct_gpu_grad_x(L, id, G, b);
        return;
    }
    if (depthwise_grad_x_fits(L->dec->cpu_only, G)) {   /* C only */
        conv_depthwise_grad_x(L, id, G, b);
        return;
    }
    int Cg = C / G->groups, Og = O / G->groups;
    Arena *a = L->p->arena;
    const char *kyv = cg_dilated(L, "ky", G->D), *kxv = cg_dilated(L, "kx", G->D);
    /* grouped: the outputs of c's group, and c's place in it */
    const char *o0 = G->groups > 1 ? arena_printf(a, "(int)(c / %d) * %d", Cg, Og) : "0";
    const char *o1 = G->groups > 1 ? arena_printf(a, "(int)(c / %d) * %d + %d", Cg, Og, Og) : arena_printf(a, "%d", O);
    const char *cw = G->groups > 1 ? arena_printf(a, "c %% %d", Cg) : "c";
    cg_kernel(L, id, "conv2d_grad_x_direct", dimn(C), 3, b, (const char *const[]){ "=dx", "dy", "w" })->grain = (long)OH * OW * Og * K * K;
    cg_body(L, "    /* dy [N, %d, %d, %d], w [%d, %d, %d, %d], dx [N, %d, %d, %d]; stride %d, padding %d%s;\n"
               "       one (n, c) plane of dx per iteration: it scatters from every output it fed */\n",
            O, OH, OW, O, Cg, K, K, C, H, W, S, P, cg_groups_dilation(L, G));
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        long n = i / %d, c = i %% %d;\n"
               "        float *dxp = dx + i * %d;\n"
               "        for (int k = 0; k < %d; k++) dxp[k] = 0.0f;\n"
               "        for (int o = %s; o < %s; o++) {\n"
               "            const float *dyp = dy + (n * %d + o) * %d, *wp = w + (o * %d + %s) * %d;\n"
               "            for (int ky = 0; ky < %d; ky++)\n"
               "            for (int kx = 0; kx < %d; kx++) {\n"
               "            const float wv = wp[ky * %d + kx];\n",
            cg_work_str(L, dimn(C)), C, C, H * W, H * W, o0, o1, O, OH * OW, Cg, cw, K * K, K, K, K);
    valid_range(L, "oy", kyv, S, P, H, OH);
    valid_range(L, "ox", kxv, S, P, W, OW);
    cg_body(L, "            for (int oy = oy0; oy < oy1; oy++) {\n"
               "                float *xr = dxp + (oy * %d - %d + %s) * %d - %d + %s;\n"
               "                const float *yr = dyp + oy * %d;\n"
               "                for (int ox = ox0; ox < ox1; ox++) xr[ox * %d] += wv * yr[ox];\n"
               "            }\n            }\n        }\n    }\n", S, P, kyv, W, P, kxv, OW, S);
    cg_end_kernel(L);
}

/* dy, x -> dw, one (o, c) pair (or without padding one (o, c, ky) row of taps) per iteration */
void cg_conv_direct_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, P = G->P, OH = G->OH, OW = G->OW;
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    int Cg = C / G->groups;
    const char *gx = group_base(L, G, "o"), *kyv = cg_dilated(L, "ky", G->D), *kxv = cg_dilated(L, "kx", G->D);
    if (!L->dec->cpu_only) {
        cg_conv_direct_gpu_grad_w(L, id, G, b);
        return;
    }
    if (depthwise_grad_w_fits(L->dec->cpu_only, G)) {   /* C only */
        conv_depthwise_grad_w(L, id, G, b);
        return;
    }
    if (P == 0 && K <= 7 && G->groups == 1 && G->D == 1) {
        /* No padding: every tap of a row of taps reads the same output columns, so one
           pass over dy serves all K taps (kx), each with a row of partial sums. */
        Step *st = cg_kernel(L, id, "conv2d_grad_w_rows", dimc((long)O * C * K), 3, b, (const char *const[]){ "=dw", "dy", "x" });
        st->heavy = st->blocks = true;
        cg_body(L, "    /* dy [N, %d, %d, %d], x [N, %d, %d, %d], dw [%d, %d, %d, %d]; stride %d, no padding;\n"
                   "       one row of taps (o, c, ky) per iteration, partial sums per kx and output column */\n",
                O, OH, OW, C, H, W, O, C, K, K, S);
        cg_body(L, "    FOR_EACH_BLOCK(i, %dL) {\n"
                   "        long o = i / %d, c = (i / %d) %% %d; int ky = (int)(i %% %d);\n", O * C * K, C * K, K, C, K);
        for (int j = 0; j < K; j++) cg_body(L, "        float k%d[%d];\n", j, OW);
        cg_body(L, "        for (int ox = 0; ox < %d; ox++) {\n", OW);
        for (int j = 0; j < K; j++) cg_body(L, "            k%d[ox] = 0.0f;\n", j);
        cg_body(L, "        }\n"
                   "        BLOCK_LOOP2(n, N, oy, %dL) {\n"
                   "                const float *yr = dy + ((n * %d + o) * %d + oy) * %d;\n"
                   "                const float *xr = x + ((n * %d + c) * %d + oy * %d + ky) * %d;\n"
                   "                for (int ox = 0; ox < %d; ox++) {\n"
                   "                    const float g = yr[ox];\n", OH, O, OH, OW, C, H, S, W, OW);
        for (int j = 0; j < K; j++) cg_body(L, "                    k%d[ox] += g * xr[ox * %d + %d];\n", j, S, j);
        cg_body(L, "                }\n            }\n");
        for (int j = 0; j < K; j++)
            cg_body(L, "        { float acc = 0.0f; for (int ox = 0; ox < %d; ox++) acc += k%d[ox];\n"
                       "          acc = BLOCK_SUM(acc); if (BLOCK_LEADER) dw[i * %d + %d] = acc; }\n", OW, j, K, j);
        cg_body(L, "    }\n");
        cg_end_kernel(L);
        return;
    }
    Step *st = cg_kernel(L, id, "conv2d_grad_w_direct", dimc((long)O * Cg), 3, b, (const char *const[]){ "=dw", "dy", "x" });
    st->heavy = st->blocks = true;
    cg_body(L, "    /* dy [N, %d, %d, %d], x [N, %d, %d, %d], dw [%d, %d, %d, %d]; stride %d, padding %d%s;\n"
               "       one (o, c) pair per iteration; partial sums per (ky, kx, output column) over the batch */\n",
            O, OH, OW, C, H, W, O, Cg, K, K, S, P, cg_groups_dilation(L, G));
    cg_body(L, "    FOR_EACH_BLOCK(i, %dL) {\n"
               "        long o = i / %d, c = i %% %d;\n"
               "        float part[%d][%d];\n"
               "        for (int k = 0; k < %d; k++) for (int j = 0; j < %d; j++) part[k][j] = 0.0f;\n"
               "        BLOCK_LOOP(n, N) {\n"
               "            const float *dyp = dy + (n * %d + o) * %d, *xp = x + (n * %d + %sc) * %d;\n"
               "            for (int ky = 0; ky < %d; ky++)\n"
               "            for (int kx = 0; kx < %d; kx++) {\n"
               "            float *pp = part[ky * %d + kx];\n",
            O * Cg, Cg, Cg, K * K, OW, K * K, OW, O, OH * OW, C, gx, H * W, K, K, K);
    valid_range(L, "oy", kyv, S, P, H, OH);
    valid_range(L, "ox", kxv, S, P, W, OW);
    cg_body(L, "            for (int oy = oy0; oy < oy1; oy++) {\n"
               "                const float *xr = xp + (oy * %d - %d + %s) * %d - %d + %s;\n"
               "                const float *yr = dyp + oy * %d;\n"
               "                for (int ox = ox0; ox < ox1; ox++) pp[ox] += yr[ox] * xr[ox * %d];\n"
               "            }\n            }\n        }\n"
               "        for (int k = 0; k < %d; k++) {\n"
               "            float acc = 0.0f;\n"
               "            for (int j = 0; j < %d; j++) acc += part[k][j];\n"
               "            acc = BLOCK_SUM(acc);\n"
               "            if (BLOCK_LEADER) dw[i * %d + k] = acc;\n"
               "        }\n    }\n", S, P, kyv, W, P, kxv, OW, S, K * K, OW, K * K);
    cg_end_kernel(L);
}

/* The weight (and bias) gradient of a convolution followed by ReLU and a 2x2 max
   pool, from the pool's gradient gy and input y (the ReLU's output), the fusion
   pass's cg_wgrad_pool: each window's gradient goes to its first maximum where that
   is positive, so dw[o, c, ky, kx] = sum over the windows of g * x[n, c, ay + ky,
   ax + kx] with (ay, ax) the maximum's place: one multiply-add per window and
   tap, where the routed gradient would take four (three of them by zero).
   x is read channels last ([N, H, W, C]: the input itself when C = 1, else a
   copy): a window's kernel row is then K*C contiguous floats, (kx, c) in the
   lanes of one or two vectors (at most 32). Each thread owns a range of output
   channels; a block of examples at a time (their x in L2), per output channel
   first each window's g and place, then per window and kernel row one
   multiply-add per vector, in two sets (even and odd windows) so that the
   additions do not wait on each other; the sums wait in memory between
   blocks, in the same order on any thread count. A row's last vector may read
   past the row: past the batch's end only in its last example, which is read
   from a copy with room after it. */
/* One window's multiply-adds into the sums <sum><ky>_<v> (sum: the indent and the set's
   letter): its gradient g times each kernel row's vectors at x (rows `row` floats apart). */
static void window_taps(Lower *L, int K, int nv, const int *lanes, int row, const char *sum, const char *g, const char *x)
{
    for (int ky = 0; ky < K; ky++)
        for (int v = 0; v < nv; v++)
            cg_body(L, "%s%d_%d += %s * mgc_load%d(%s + %d);\n", sum, ky, v, g, lanes[v], x, ky * row + v * 16);
}

void cg_conv_pooled_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    int pool = cg_wgrad_pool(L->dec, id), bg = cg_wgrad_bias(L->dec, id);
    const Node *pn = &g->nodes[pool];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, OH = G->OH, OW = G->OW, PH = OH / 2, PW = OW / 2, PQ = PH * PW;
    int R = K * C;                          /* floats of one kernel row, (kx, c) */
    int nv = R <= 16 ? 1 : 2;               /* its vectors: 8, 16, or 16 + (8 or 16) lanes */
    int lanes[2] = { R <= 8 ? 8 : 16, R <= 16 ? 0 : R <= 24 ? 8 : 16 };
    int RP = lanes[0] + lanes[1];           /* lanes per row, R used */
    long img = (long)H * W * C;
    /* examples per block: their x about 64K floats (in L2), 1 to 64 */
    long NBK = (64L << 10) / img;
    NBK = NBK < 1 ? 1 : NBK > 64 ? 64 : NBK;
    int xt = C == 1 ? buf_of(L, n->in[1]) : cg_conv_channels_last(L, id, n->in[1]);
    CgArgs args = { 0 };
    cg_arg(L, &args, cg_out_buf(L, id), "=dw");
    if (bg >= 0) cg_arg(L, &args, cg_out_buf(L, bg), "=db");
    cg_arg(L, &args, buf_of(L, pn->in[0]), "y"), cg_arg(L, &args, buf_of(L, pn->in[1]), "gy"), cg_arg(L, &args, xt, "xt");
    Step *st = cg_kernel_args(L, id, "conv2d_grad_w_pooled", dimc(O), &args);
    st->heavy = st->c_only = true;
    cg_body(L, "    /* xt [N, %d, %d, %d] (x channels last), dw [%d, %d, %d, %d]; the convolution's output\n"
               "       gradient is relu_grad(maxpool2d_grad(y [N, %d, %d, %d], gy [N, %d, %d, %d])), not read:\n"
               "       each 2x2 window's g goes to its first maximum (ay, ax) where positive, so each\n"
               "       window adds g * xt[ay + ky][ax .. ax + %d][c] to dw%s. This thread's output\n"
               "       channels [o0, o1), %ld examples a block */\n",
            H, W, C, O, C, K, K, O, OH, OW, O, PH, PW, K - 1, bg >= 0 ? ", and g to db" : "", NBK);
    cg_body(L, "    const long o0 = %dL * a.thread / a.nthreads, o1 = %dL * (a.thread + 1) / a.nthreads;\n"
               "    if (o0 >= o1) return;\n"
               "    float *gq = mgc_scratch(%dL * 2 + %ldL + 32 + (o1 - o0) * %dL, \"%s\");\n"
               "    int *at = (int *)(gq + %d);\n"
               "    float *tail = gq + %dL * 2, *acc = tail + %ldL + 32;   /* acc: per channel %d rows of %d lanes, then 16 bias lanes */\n"
               "    for (long k = 0; k < %ldL; k++) tail[k] = N ? xt[(N - 1) * %ldL + k] : 0.0f;   /* the last example */\n"
               "    for (int k = 0; k < 32; k++) tail[%ldL + k] = 0.0f;\n"
               "    for (long k = 0; k < (o1 - o0) * %dL; k++) acc[k] = 0.0f;\n",
            O, O, PQ, img, K * RP + 16, st->fn, PQ, PQ, img, K, RP, img, img, img, K * RP + 16);
    cg_body(L, "    for (long n0 = 0; n0 < N; n0 += %ld) {\n"
               "        const int nb = N - n0 < %ld ? (int)(N - n0) : %ld;\n"
               "        for (long o = o0; o < o1; o++) {\n"
               "            float *ac = acc + (o - o0) * %dL, *bl = ac + %d;\n",
            NBK, NBK, NBK, K * RP + 16, K * RP);
    for (int ky = 0; ky < K; ky++)
        for (int v = 0; v < nv; v++)
            cg_body(L, "            mgc_f%d e%d_%d = mgc_load%d(ac + %d), f%d_%d = { 0 };\n", lanes[v], ky, v, lanes[v],
                    ky * RP + v * 16, ky, v);
    cg_body(L, "            for (int j = 0; j < nb; j++) {\n"
               "                const long n = n0 + j;\n"
               "                const float *ap = y + (n * %d + o) * %dL, *gp = gy + (n * %d + o) * %dL;\n"
               "                for (int py = 0; py < %d; py++)   /* each window's gradient and the place it goes */\n"
               "                    for (int px = 0; px < %d; px++) {\n"
               "                        const float *r0 = ap + py * %d + 2 * px, *r1 = r0 + %d;\n"
               "                        float a0 = r0[0], a1 = r0[1], a2 = r1[0], a3 = r1[1];\n",
            O, OH * OW, O, PQ, PH, PW, 2 * OW, OW);
    cg_first_max_2x2(L, 24, true);   /* y is a ReLU's output */
    cg_body(L, "                        int q = py * %d + px;\n"
               "                        gq[q] = mgc_keep(gp[q], m > 0.0f);\n"
               "                        at[q] = ((2 * py + (e2 | e3)) * %d + 2 * px + (e1 | e3)) * %d;\n"
               "                    }\n",
            PW, W, C);
    if (bg >= 0) {
        cg_body(L, "                for (int q0 = 0; q0 + 16 <= %d; q0 += 16)\n"
                   "                    for (int k = 0; k < 16; k++) bl[k] += gq[q0 + k];\n", PQ);
        if (PQ % 16) cg_body(L, "                for (int q = %d; q < %d; q++) bl[q - %d] += gq[q];\n", PQ / 16 * 16, PQ, PQ / 16 * 16);
    }
    cg_body(L, "                const float *xp = n == N - 1 ? tail : xt + n * %ldL;\n"
               "                for (int q = 0; q < %d; q += 2) {\n"
               "                    const float g0 = gq[q], *x0 = xp + at[q];\n", img, PQ / 2 * 2);
    window_taps(L, K, nv, lanes, W * C, "                    e", "g0", "x0");
    cg_body(L, "                    const float g1 = gq[q + 1], *x1 = xp + at[q + 1];\n");
    window_taps(L, K, nv, lanes, W * C, "                    f", "g1", "x1");
    cg_body(L, "                }\n");
    if (PQ % 2) {
        cg_body(L, "                { const float g0 = gq[%d], *x0 = xp + at[%d];\n", PQ - 1, PQ - 1);
        window_taps(L, K, nv, lanes, W * C, "                  e", "g0", "x0");
        cg_body(L, "                }\n");
    }
    cg_body(L, "            }\n");
    /* the sums are vectors (the C prelude's): as arrays of which only R lanes are read, the
       compiler drops the other lanes and regroups the live ones, element by element (4x slower) */
    for (int ky = 0; ky < K; ky++)
        for (int v = 0; v < nv; v++)
            cg_body(L, "            { mgc_f%d s = e%d_%d + f%d_%d; __builtin_memcpy(ac + %d, &s, sizeof s); }\n", lanes[v], ky, v, ky, v,
                    ky * RP + v * 16);
    cg_body(L, "        }\n"
               "    }\n"
               "    for (long o = o0; o < o1; o++) {\n"
               "        const float *ac = acc + (o - o0) * %dL;\n"
               "        for (int c = 0; c < %d; c++)\n"
               "            for (int ky = 0; ky < %d; ky++)\n"
               "                for (int kx = 0; kx < %d; kx++) dw[((o * %d + c) * %d + ky) * %d + kx] = ac[ky * %d + kx * %d + c];\n",
            K * RP + 16, C, K, K, C, K, K, RP, C);
    if (bg >= 0)
        cg_body(L, "        float s = 0.0f;\n"
                   "        for (int k = 0; k < 16; k++) s += ac[%d + k];\n"
                   "        db[o] = s;\n", K * RP);
    cg_body(L, "    }\n    free(gq);\n");
    cg_end_kernel(L);
}

