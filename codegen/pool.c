/*
** Pooling: max and average over K x K windows (stride S, padding P), the
** global average, and their gradients.
**
** x, dx are [N, C, H, W] and y, dy [N, C, OH, OW], read as N*C planes; every
** kernel takes one plane per iteration, so a gradient's scatter stays within
** the plane its iteration owns (no two threads write one place). The
** gradients overwrite dx. The max follows PyTorch: the first maximum in
** reading order wins, and a NaN counts as a maximum.
*/
#include "lower_internal.h"
#include <stdlib.h>
#include <string.h>

/* The loops over a window's in-bounds taps, at output (oy, ox): they define iy
   and ix, and skip the padding. window_close() ends them. */
static void window_open(Lower *L, int K, int S, int P, int H, int W)
{
    cg_body(L, "                for (int ky = 0; ky < %d; ky++) {\n"
               "                    int iy = oy * %d - %d + ky;\n"
               "                    if (iy < 0 || iy >= %d) continue;\n"
               "                    for (int kx = 0; kx < %d; kx++) {\n"
               "                        int ix = ox * %d - %d + kx;\n"
               "                        if (ix < 0 || ix >= %d) continue;\n", K, S, P, H, K, S, P, W);
}

static void window_close(Lower *L) { cg_body(L, "                    }\n                }\n"); }

/* Windows that lie wholly inside the plane (no padding tap) get their K*K taps
   written out with constant offsets, ahead of the general loops: on ResNet-18's
   3x3/2 pool with padding 1, 36 of a 7x7 map's 49 windows. Opens the branch for
   output (oy, ox) and defines w0 (the window's first input) and b0 (its offset
   in the plane); false when no window is inside or K is large. */
/* The windows o in [0, no) along n inputs: inside ones [*oa, *ob) (every tap in range). */
static void inside_range(int n, int no, int K, int S, int P, int *oa, int *ob)
{
    *oa = (P + S - 1) / S;
    *ob = n - K + P >= 0 ? (n - K + P) / S + 1 : 0;
    if (*ob > no) *ob = no;
    if (*oa > no) *oa = no;
    if (*ob < *oa) *ob = *oa;
}

static bool inside_open(Lower *L, int K, int S, int P, int H, int W, int OH, int OW)
{
    int oy0, oy1, ox0, ox1;   /* [oy0, oy1), [ox0, ox1) */
    inside_range(H, OH, K, S, P, &oy0, &oy1);
    inside_range(W, OW, K, S, P, &ox0, &ox1);
    if (K > 4 || oy0 >= oy1 || ox0 >= ox1) return false;
    cg_body(L, "                if (oy >= %d && oy <= %d && ox >= %d && ox <= %d) {   /* inside the plane: taps written out */\n"
               "                    const int b0 = (oy * %d - %d) * %d + ox * %d - %d;\n"
               "                    const float *w0 = xp + b0;\n", oy0, oy1 - 1, ox0, ox1 - 1, S, P, W, S, P);
    return true;
}

/* The max pool of one plane, from `src` [H, W] into `dst` [OH, OW]: the maxima
   of each row's windows (hm[H, OW]), then of K rows of those, each output row
   a loop over the OW columns that the compiler vectorises. Windows inside the
   plane take their K taps written out; those over the border, the taps in
   range, listed here (a border is at most a few windows wide). Of equal
   values the first in reading order wins, and a NaN wins: tracked in a flag
   beside the maximum (`bad`), since a select on "greater or NaN" compiles to
   branches that the data mispredict (ResNet-18's stem pool: 10 ms on one
   thread, 1.3 ms with the flag). With nan_free (the plane is a ReLU's
   output, and mgc's ReLU writes no NaN) there is no flag. */
void cg_max_pool_plane(Lower *L, const char *src, const char *dst, int K, int S, int P, int H, int W, int OH, int OW,
                       bool nan_free, int ind)
{
    int xa, xb, ya, yb;
    inside_range(W, OW, K, S, P, &xa, &xb);
    inside_range(H, OH, K, S, P, &ya, &yb);
    const char *step = nan_free ? "acc = v > acc ? v : acc;" : "acc = v > acc ? v : acc; bad |= v != v;";
    const char *init = nan_free ? "" : " int bad = 0;";
    const char *res = nan_free ? "acc" : "bad ? MGC_NAN : acc";
    cg_body(L, "%*s{   /* max pool %dx%d, stride %d, padding %d: rows' maxima hm[%d, %d], then columns'%s */\n"
               "%*s    float hm[%ld];\n"
               "%*s    for (int iy = 0; iy < %d; iy++) {\n"
               "%*s        const float *r = %s + iy * %d;\n"
               "%*s        float *q = hm + iy * %d;\n",
            ind, "", K, K, S, P, H, OW, nan_free ? " (a ReLU's output: no NaN)" : "", ind, "", (long)H * OW, ind, "", H,
            ind, "", src, W, ind, "", OW);
    for (int o = 0; o < OW; o++) {
        if (o == xa && xb > xa) {
            cg_body(L, "%*s        for (int o = %d; o < %d; o++) {\n"
                       "%*s            const float *w = r + o * %d - %d;\n"
                       "%*s            float acc = -MGC_INF;%s\n", ind, "", xa, xb, ind, "", S, P, ind, "", init);
            for (int k = 0; k < K; k++) cg_body(L, "%*s            { float v = w[%d]; %s }\n", ind, "", k, step);
            cg_body(L, "%*s            q[o] = %s;\n%*s        }\n", ind, "", res, ind, "");
            o = xb - 1;
            continue;
        }
        cg_body(L, "%*s        { float acc = -MGC_INF;%s", ind, "", init);
        for (int k = 0; k < K; k++) {
            int ix = o * S - P + k;
            if (ix >= 0 && ix < W) cg_body(L, " { float v = r[%d]; %s }", ix, step);
        }
        cg_body(L, " q[%d] = %s; }\n", o, res);
    }
    cg_body(L, "%*s    }\n", ind, "");
    for (int o = 0; o < OH; o++) {
        if (o == ya && yb > ya) {
            cg_body(L, "%*s    for (int o = %d; o < %d; o++) {\n"
                       "%*s        const float *w = hm + (o * %d - %d) * %d;\n"
                       "%*s        float *q = %s + o * %d;\n"
                       "%*s        for (int i = 0; i < %d; i++) {\n"
                       "%*s            float acc = -MGC_INF;%s\n", ind, "", ya, yb, ind, "", S, P, OW, ind, "", dst, OW, ind, "", OW,
                    ind, "", init);
            for (int k = 0; k < K; k++) cg_body(L, "%*s            { float v = w[%d + i]; %s }\n", ind, "", k * OW, step);
            cg_body(L, "%*s            q[i] = %s;\n%*s        }\n%*s    }\n", ind, "", res, ind, "", ind, "");
            o = yb - 1;
            continue;
        }
        cg_body(L, "%*s    for (int i = 0; i < %d; i++) { float acc = -MGC_INF;%s", ind, "", OW, init);
        for (int k = 0; k < K; k++) {
            int iy = o * S - P + k;
            if (iy >= 0 && iy < H) cg_body(L, " { float v = hm[%d + i]; %s }", iy * OW, step);
        }
        cg_body(L, " %s[%d + i] = %s; }\n", dst, o * OW, res);
    }
    cg_body(L, "%*s}\n", ind, "");
}

/* In a kernel's loop over 2x2 windows whose values a0, a1 (top row), a2, a3 are
   declared: m, their maximum, and e0..e3, which one of them is the first maximum in
   reading order (the one the gradient goes to), as int flags, branch-free. */
void cg_first_max_2x2(Lower *L, int indent, bool nan_free)
{
    /* x a ReLU's output (no NaN): plain selects; else a NaN wins (a select on "greater
       or NaN", which compiles to branches) */
    cg_body(L, "%*s/* the first maximum in reading order, as the forward (and PyTorch) */\n"
               "%*sfloat m = a0;\n", indent, "", indent, "");
    for (int k = 1; k < 4; k++)
        if (nan_free)
            cg_body(L, "%*sm = a%d > m ? a%d : m;%s\n", indent, "", k, k, k == 1 ? "   /* a ReLU's output: no NaN */" : "");
        else
            cg_body(L, "%*sm = (a%d > m) | (a%d != a%d) ? a%d : m;\n", indent, "", k, k, k, k);
    cg_body(L, "%*s/* exactly one of the four gets the gradient: the first equal to m (the last if m is NaN);\n"
               "%*s   selects by masks: branches here would follow the data */\n"
               "%*sint e0 = a0 == m, e1 = !e0 & (a1 == m), e2 = !e0 & !e1 & (a2 == m), e3 = !e0 & !e1 & !e2;\n",
            indent, "", indent, "", indent, "");
}

/* The max-pool gradient where x is a ReLU's output (no NaN; the gradient masked
   by the ReLU too), stride 2, output rows of at most 8 (ResNet-18's stem pool:
   3x3, stride 2, padding 1, 14x14 -> 7x7), C only: one output row's windows
   in 8 lanes. The plane is copied with -INFINITY around it (no tap tests its
   bounds: a ReLU's output beats the padding); each tap of the window, in
   reading order, loads 16 floats of a row and keeps the even ones (the
   stride), and a lane takes the tap where it is greater than the lane's
   maximum so far, so the first maximum wins, as in the forward pass and
   PyTorch. Then each window adds its gradient where its maximum was. The
   scalar form spent its time on its chain of selects per window, which GCC
   compiled to branches that real images mispredict (ResNet-18's stem: 12 ms
   a step on one thread; about 3.5 with this form). */
static void max_pool_grad_rows(Lower *L, int id, int K, int P, int C, int H, int W, int OH, int OW)
{
    const Node *n = &L->g->nodes[id];
    int HQ = H + 2 * P, WQ = K - 1 + 16;   /* the padded plane: a 16-float load from any tap's column stays in its row */
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    Step *st = cg_kernel(L, id, "maxpool2d_grad_rows", dimn(C), 3, b, (const char *const[]){ "=dx", "x", "dy" });
    st->grain = (long)H * W;
    st->c_only = true;
    cg_body(L, "    /* dx, x are [N*%d planes, %d, %d], dy is [N*%d, %d, %d]; window %d, stride 2, padding %d;\n"
               "       x is a ReLU's output (no NaN), whose gradient is fused: one output row's windows in 8 lanes */\n"
               "    typedef int mgc_i8 __attribute__((vector_size(32)));\n"
               "    const mgc_i8 lane = { 0, 2, 4, 6, 8, 10, 12, 14 };   /* a window's first column, less the padding */\n"
               "    FOR_EACH(plane, %s) {\n"
               "        const float *xp = x + plane * %d, *dyp = dy + plane * %d;\n"
               "        float *dxp = dx + plane * %d;\n"
               "        float xq[%d * %d];   /* the plane, -INFINITY around it: [%d, %d] */\n",
            C, H, W, C, OH, OW, K, P, cg_work_str(L, dimn(C)), H * W, OH * OW, H * W, HQ, WQ, HQ, WQ);
    if (P > 0)
        cg_body(L, "        for (int k = 0; k < %d; k++) xq[k] = -MGC_INF;\n", P * WQ);
    if (HQ - P - H > 0)
        cg_body(L, "        for (int k = %d; k < %d; k++) xq[k] = -MGC_INF;\n", (P + H) * WQ, HQ * WQ);
    cg_body(L, "        for (int r = 0; r < %d; r++) {\n"
               "            float *q = xq + (r + %d) * %d;\n"
               "            for (int k = 0; k < %d; k++) q[k] = -MGC_INF;\n"
               "            for (int k = %d; k < %d; k++) q[k] = -MGC_INF;\n"
               "            __builtin_memcpy(q + %d, xp + r * %d, %d * sizeof(float));\n"
               "        }\n"
               "        for (int k = 0; k < %d; k++) dxp[k] = 0.0f;\n"
               "        for (int oy = 0; oy < %d; oy++) {\n"
               "            mgc_f8 best = { -MGC_INF, -MGC_INF, -MGC_INF, -MGC_INF, -MGC_INF, -MGC_INF, -MGC_INF, -MGC_INF };\n"
               "            mgc_i8 at = { 0 };   /* where in the plane each lane's maximum is */\n"
               "            const float *q = xq + 2 * oy * %d;\n",
            H, P, WQ, P, P + W, WQ, P, W, W, H * W, OH, WQ);
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++)
            cg_body(L, "            {   /* tap (%d, %d) */\n"
                       "                mgc_f16 r = mgc_load16(q + %d);\n"
                       "                mgc_f8 v = __builtin_shufflevector(r, r, 0, 2, 4, 6, 8, 10, 12, 14);\n"
                       "                mgc_i8 gt = v > best;\n"
                       "                at = (at & ~gt) | ((lane + ((2 * oy %c %d) * %d %c %d)) & gt);\n"
                       "                best = (mgc_f8)(((mgc_i8)best & ~gt) | ((mgc_i8)v & gt));\n"
                       "            }\n",
                    ky, kx, ky * WQ + kx, ky < P ? '-' : '+', abs(ky - P), W, kx < P ? '-' : '+', abs(kx - P));
    cg_body(L, "            for (int ox = 0; ox < %d; ox++) dxp[at[ox]] += mgc_keep(dyp[oy * %d + ox], best[ox] > 0.0f);   /* fused relu_grad */\n"
               "        }\n"
               "    }\n", OW, OW);
    cg_end_kernel(L);
}

/* A pooling node's geometry, shared by its kernels' writers. */
typedef struct PoolGeom {
    int K, S, P;              /* window, stride, padding */
    int C, H, Wd, OH, OW;     /* the forward input's channels and plane, the output's plane */
    bool mx;                  /* max (else average) */
    bool relu;                /* a max pool's gradient routes only where its input was positive (cg_relu_mask) */
    bool ceil;                /* ceil_mode: a last, partial window (the output's size rounded up) */
    bool excl;                /* an average over each window's taps inside the input (count_include_pad=false) */
    int y;                    /* the output's buffer */
    Dim planes;               /* N * C: one per iteration */
    const char *W;            /* planes as C text */
    const char *scale;        /* 1 / K^2 as a float literal */
} PoolGeom;

#define POOL_GEOM(G) int K = G->K, S = G->S, P = G->P, C = G->C, H = G->H, Wd = G->Wd, OH = G->OH, OW = G->OW; \
    bool mx = G->mx, relu = G->relu; int y = G->y; Dim planes = G->planes; const char *W = G->W, *scale = G->scale; \
    const Node *n = &L->g->nodes[id]; (void)K; (void)S; (void)P; (void)C; (void)H; (void)Wd; (void)OH; (void)OW; \
    (void)mx; (void)relu; (void)y; (void)planes; (void)W; (void)scale; (void)n

/* max pool, separable, one plane per iteration (cg_max_pool_plane) */
static void pool_forward_separable(Lower *L, int id, const PoolGeom *G)
{
    POOL_GEOM(G);
    const Graph *g = L->g;
    /* Separable, one plane per iteration (cg_max_pool_plane). Measured on ResNet-18's
       3x3/2 pool with padding 1 (unfused, MGC_FUSE=0): 4.2 -> 0.9 ms a step (the NaN
       test per tap had compiled to branches); LeNet's 2x2/2 pools 0.16 and 0.03 ms
       before, 0.16 and 0.06 now (the small 8x8 planes pay the row pass's setup). */
    int xin = n->in[0];
    bool relu_in = g->nodes[xin].op == OP_RELU || cg_relu_out(L->dec, xin);   /* mgc's ReLU writes no NaN */
    int b[2] = { y, buf_of(L, xin) };
    cg_kernel(L, id, "maxpool2d", planes, 2, b, (const char *const[]){ "=y", "x" })->grain = H * Wd;
    cg_body(L, "    /* x is [N*%d planes, %d, %d], y is [N*%d, %d, %d]; one plane per iteration */\n", C, H, Wd, C, OH, OW);
    cg_body(L, "    FOR_EACH(plane, %s) {\n"
               "        const float *xp = x + plane * %d;\n"
               "        float *yp = y + plane * %d;\n", W, H * Wd, OH * OW);
    cg_max_pool_plane(L, "xp", "yp", K, S, P, H, Wd, OH, OW, relu_in, 8);
    cg_body(L, "    }\n");
    cg_end_kernel(L);
}

/* An average window's divisor at (oy, ox), C text, where it varies: PyTorch's, the window within the
   padded input (a partial last window: ceil_mode), or within the input (count_include_pad=false);
   NULL where it is K * K everywhere */
static const char *avg_divisor(Lower *L, const PoolGeom *G, const char *oy, const char *ox)
{
    if (G->mx || (!G->ceil && !G->excl)) return NULL;
    const char *side[2];
    for (int k = 0; k < 2; k++) {
        const char *o = k ? ox : oy;
        int n = k ? G->Wd : G->H, end = G->excl ? n : n + G->P;
        const char *s = arena_printf(L->p->arena, "(%s * %d - %d)", o, G->S, G->P);
        const char *e = arena_printf(L->p->arena, "(%s + %d < %d ? %s + %d : %d)", s, G->K, end, s, G->K, end);
        side[k] = G->excl ? arena_printf(L->p->arena, "(%s - (%s > 0 ? %s : 0))", e, s, s) : arena_printf(L->p->arena, "(%s - %s)", e, s);
    }
    return arena_printf(L->p->arena, "(float)(%s * %s)", side[0], side[1]);
}

/* max or average pool: each output a loop over its window */
static void pool_forward(Lower *L, int id, const PoolGeom *G)
{
    POOL_GEOM(G);
    int b[2] = { y, buf_of(L, n->in[0]) };
    cg_kernel(L, id, ir_op_name(n->op), planes, 2, b, (const char *const[]){ "=y", "x" })->grain = H * Wd;
    cg_body(L, "    /* x is [N*%d planes, %d, %d], y is [N*%d, %d, %d]; window %d, stride %d, padding %d; one plane per iteration */\n",
            C, H, Wd, C, OH, OW, K, S, P);
    cg_body(L, "    FOR_EACH(plane, %s) {\n"
               "        const float *xp = x + plane * %d;\n"
               "        float *yp = y + plane * %d;\n"
               "        for (int oy = 0; oy < %d; oy++)\n"
               "            for (int ox = 0; ox < %d; ox++) {\n"
               "                float acc = %s;\n",
            W, H * Wd, OH * OW, OH, OW, mx ? "-MGC_INF" : "0.0f");
    if (mx && inside_open(L, K, S, P, H, Wd, OH, OW)) {
        cg_body(L, "                    acc = w0[0];\n");
        for (int t = 1; t < K * K; t++)
            cg_body(L, "                    { float v = w0[%d]; acc = (v > acc) | (v != v) ? v : acc; }\n", t / K * Wd + t % K);
        cg_body(L, "                    yp[oy * %d + ox] = acc;\n                    continue;\n                }\n", OW);
    }
    window_open(L, K, S, P, H, Wd);
    cg_body(L, "                        float v = xp[iy * %d + ix];\n"
               "                        %s\n", Wd, mx ? "acc = (v > acc) | (v != v) ? v : acc;   /* a NaN wins; branch-free: the data decide */" : "acc += v;");
    window_close(L);
    const char *div = avg_divisor(L, G, "oy", "ox");
    cg_body(L, "                yp[oy * %d + ox] = %s;\n"
               "            }\n    }\n", OW, mx ? "acc" : div ? arena_printf(L->p->arena, "acc / %s", div) : arena_printf(L->p->arena, "acc * %s", scale));
    cg_end_kernel(L);
}

/* The common 2x2/2 max pool's gradient, written out: one output row of windows per inner loop. */
static void maxpool_grad_2x2(Lower *L, int id, const PoolGeom *G)
{
    POOL_GEOM(G);
    int b[3] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    cg_kernel(L, id, "maxpool2d_grad_2x2", planes, 3, b, (const char *const[]){ "=dx", "x", "dy" })->grain = H * Wd;
    cg_body(L, "    /* dx, x are [N*%d planes, %d, %d], dy is [N*%d, %d, %d]; 2x2 windows, stride 2, tiling the plane */\n",
            C, H, Wd, C, OH, OW);
    cg_body(L, "    FOR_EACH(plane, %s) {\n"
               "        const float *xp = x + plane * %d, *dyp = dy + plane * %d;\n"
               "        float *dxp = dx + plane * %d;\n"
               "        for (int oy = 0; oy < %d; oy++) {\n"
               "            const float *r0 = xp + oy * %d, *r1 = r0 + %d, *g0 = dyp + oy * %d;\n"
               "            float *d0 = dxp + oy * %d, *d1 = d0 + %d;\n"
               "            for (int ox = 0; ox < %d; ox++) {\n"
               "                float a0 = r0[2 * ox], a1 = r0[2 * ox + 1], a2 = r1[2 * ox], a3 = r1[2 * ox + 1];\n",
            W, H * Wd, OH * OW, H * Wd, OH, 2 * Wd, Wd, OW, 2 * Wd, Wd, OW);
    cg_first_max_2x2(L, 16, relu);
    cg_body(L, "                float g = %s;\n"
               "                d0[2 * ox] = mgc_keep(g, e0);\n"
               "                d0[2 * ox + 1] = mgc_keep(g, e1);\n"
               "                d1[2 * ox] = mgc_keep(g, e2);\n"
               "                d1[2 * ox + 1] = mgc_keep(g, e3);\n"
               "            }\n        }\n    }\n",
            relu ? "mgc_keep(g0[ox], m > 0.0f)   /* fused relu_grad */" : "g0[ox]");
    cg_end_kernel(L);
}

/* Windows tile the plane exactly: every x belongs to one window, so each
   window writes its K*K gradients directly (no zeroing, no accumulation). */
static void maxpool_grad_tiled(Lower *L, int id, const PoolGeom *G)
{
    POOL_GEOM(G);
    int b[3] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    cg_kernel(L, id, "maxpool2d_grad_tiled", planes, 3, b, (const char *const[]){ "=dx", "x", "dy" })->grain = H * Wd;
    cg_body(L, "    /* dx, x are [N*%d planes, %d, %d], dy is [N*%d, %d, %d]; %dx%d windows tile the plane */\n",
            C, H, Wd, C, OH, OW, K, K);
    cg_text(L, "    FOR_EACH(plane, $planes) {\n"
               "        const float *xp = x + plane * $HW, *dyp = dy + plane * $OHW;\n"
               "        float *dxp = dx + plane * $HW;\n"
               "        for (int oy = 0; oy < $OH; oy++)\n"
               "            for (int ox = 0; ox < $OW; ox++) {\n"
               "                /* the window's first maximum, as the forward pass (and PyTorch) chose it */\n"
               "                const float *w0 = xp + oy * $KW + ox * $K;\n"
               "                float best = w0[0]; int at = 0;\n"
               "                for (int ky = 0; ky < $K; ky++)\n"
               "                    for (int kx = 0; kx < $K; kx++) {\n"
               "                        float v = w0[ky * $Wd + kx];\n"
               "                        int better = (v > best) | (v != v);   /* branch-free: the data decide */\n"
               "                        best = better ? v : best;\n"
               "                        at = better ? ky * $K + kx : at;\n"
               "                    }\n"
               "                float g = $g;\n"
               "                float *d0 = dxp + oy * $KW + ox * $K;\n"
               "                for (int ky = 0; ky < $K; ky++)\n"
               "                    for (int kx = 0; kx < $K; kx++) d0[ky * $Wd + kx] = ky * $K + kx == at ? g : 0.0f;\n"
               "            }\n    }\n",
            cg_s("planes", W), cg_n("HW", H * Wd), cg_n("OHW", OH * OW), cg_n("OH", OH), cg_n("OW", OW), cg_n("KW", K * Wd), cg_n("K", K),
            cg_n("Wd", Wd),
            cg_s("g", relu ? cg_str(L, "best > 0.0f ? dyp[oy * $OW + ox] : 0.0f   /* fused relu_grad */", cg_n("OW", OW))
                           : cg_str(L, "dyp[oy * $OW + ox]", cg_n("OW", OW))));
    cg_end_kernel(L);
}

/* Scatter within a plane: each iteration owns one plane of dx, so no two threads write one place. */
static void pool_grad_scatter(Lower *L, int id, const PoolGeom *G)
{
    POOL_GEOM(G);
    int b[3] = { y, buf_of(L, n->in[0]), mx ? buf_of(L, n->in[1]) : -1 };
    if (mx) cg_kernel(L, id, "maxpool2d_grad", planes, 3, b, (const char *const[]){ "=dx", "x", "dy" })->grain = H * Wd;
    else cg_kernel(L, id, "avgpool2d_grad", planes, 2, b, (const char *const[]){ "=dx", "dy" })->grain = H * Wd;
    cg_body(L, "    /* dx%s are [N*%d planes, %d, %d], dy is [N*%d, %d, %d]; window %d, stride %d, padding %d */\n",
            mx ? ", x" : "", C, H, Wd, C, OH, OW, K, S, P);
    cg_body(L, "    FOR_EACH(plane, %s) {\n"
               "        float *dxp = dx + plane * %d;\n"
               "        const float *dyp = dy + plane * %d;\n"
               "        for (int k = 0; k < %d; k++) dxp[k] = 0.0f;\n"
               "        for (int oy = 0; oy < %d; oy++)\n"
               "            for (int ox = 0; ox < %d; ox++) {\n",
            W, H * Wd, OH * OW, H * Wd, OH, OW);
    if (mx) {
        cg_body(L, "                /* the window's first maximum, as the forward pass (and PyTorch) chose it */\n"
                   "                const float *xp = x + plane * %d;\n"
                   "                float best = -MGC_INF; int at = -1;\n", H * Wd);
        if (inside_open(L, K, S, P, H, Wd, OH, OW)) {
            cg_body(L, "                    best = w0[0]; at = b0;\n");
            for (int t = 1; t < K * K; t++)
                if (relu)   /* x is a ReLU's output: no NaN; branch-free selects */
                    cg_body(L, "                    { float v = w0[%d]; int gt = v > best; best = gt ? v : best; at = gt ? b0 + %d : at; }\n",
                            t / K * Wd + t % K, t / K * Wd + t % K);
                else
                    cg_body(L, "                    { float v = w0[%d]; if (v > best || (v != v && best == best)) { best = v; at = b0 + %d; } }\n",
                            t / K * Wd + t % K, t / K * Wd + t % K);
            cg_body(L, "                    dxp[at] += %s;\n                    continue;\n                }\n",
                    relu ? arena_printf(L->p->arena, "mgc_keep(dyp[oy * %d + ox], best > 0.0f)   /* fused relu_grad, branch-free */", OW)
                         : arena_printf(L->p->arena, "dyp[oy * %d + ox]", OW));
        }
        window_open(L, K, S, P, H, Wd);
        if (relu)
            cg_body(L, "                        float v = xp[iy * %d + ix];\n"
                       "                        int gt = (at < 0) | (v > best);   /* no NaN (a ReLU's output): branch-free */\n"
                       "                        best = gt ? v : best;\n"
                       "                        at = gt ? iy * %d + ix : at;\n", Wd, Wd);
        else
            cg_body(L, "                        float v = xp[iy * %d + ix];\n"
                       "                        if (at < 0 || v > best || (v != v && best == best)) { best = v; at = iy * %d + ix; }\n",
                    Wd, Wd);
        window_close(L);
        if (relu)
            cg_body(L, "                if (at >= 0) dxp[at] += mgc_keep(dyp[oy * %d + ox], best > 0.0f);   /* fused relu_grad: x is a relu output */\n", OW);
        else
            cg_body(L, "                if (at >= 0) dxp[at] += dyp[oy * %d + ox];\n", OW);
    } else {
        const char *div = avg_divisor(L, G, "oy", "ox");
        if (div) cg_body(L, "                float g = dyp[oy * %d + ox] / %s;\n", OW, div);
        else cg_body(L, "                float g = dyp[oy * %d + ox] * %s;\n", OW, scale);
        window_open(L, K, S, P, H, Wd);
        cg_body(L, "                        dxp[iy * %d + ix] += g;\n", Wd);
        window_close(L);
    }
    cg_body(L, "            }\n    }\n");
    cg_end_kernel(L);
}

/* maxpool2d, avgpool2d: x -> y; maxpool2d_grad: x, dy -> dx; avgpool2d_grad: dy -> dx.
   The common max-pool gradients get kernels of their own: 2x2 stride 2, and windows that tile the plane. */
/* GPUs: pooling a thread per element (cg_rows_body over the planes). The forward, one
   output each: its window's taps in reading order, as the CPU's loops (the same max,
   the same sum). The gradients, one input each, gathering from the windows that hold
   it in the order the CPU's scatter adds them (oy, then ox): a max pool's window
   routes its gradient to its first maximum, found again per window as the forward
   found it (a NaN wins, as PyTorch); with relu (cg_relu_mask), only where that maximum is
   positive (the fused relu_grad). The same numbers as the CPU's, a thread per plane
   there being 16,384 threads at ResNet-18's batch of 256. */
static void pool_gpu(Lower *L, int id, const PoolGeom *G)
{
    POOL_GEOM(G);
    bool fwd = n->op == OP_MAXPOOL || n->op == OP_AVGPOOL;
    Arena *a = L->p->arena;
    int b[3] = { y, buf_of(L, n->in[0]), n->nin > 1 ? buf_of(L, n->in[1]) : -1 };
    /* the window at (oy, ox): its first maximum's offset `bat` and value `best`, or the sum `acc` */
    const char *tap = mx ? arena_printf(a, "if (bat < 0 || v > best || (v != v && best == best)) { best = v; bat = yy * %d + xx; }", Wd)
                         : "acc += v;";
    const char *taps = arena_printf(a,
        "for (int ky = 0; ky < %d; ky++) {\n"
        "              int yy = oy * %d - %d + ky;\n"
        "              if (yy < 0 || yy >= %d) continue;\n"
        "              for (int kx = 0; kx < %d; kx++) {\n"
        "                  int xx = ox * %d - %d + kx;\n"
        "                  if (xx < 0 || xx >= %d) continue;\n"
        "                  float v = xp[yy * %d + xx];\n"
        "                  %s\n"
        "              }\n"
        "          }", K, S, P, H, K, S, P, Wd, Wd, tap);
    if (fwd) {
        cg_kernel(L, id, ir_op_name(n->op), cg_rows_work(planes, (long)OH * OW), 2, b, (const char *const[]){ "=y", "x" });
        cg_body(L, "    /* x is [N*%d planes, %d, %d], y is [N*%d, %d, %d]; window %d, stride %d, padding %d; one output per iteration */\n",
                C, H, Wd, C, OH, OW, K, S, P);
        cg_rows_body(L, planes, (long)OH * OW, arena_printf(a, "        const float *xp = x + row * %dL;\n", H * Wd),
                     arena_printf(a, "{ int oy = at / %d, ox = at %% %d;\n"
                                     "          %s\n"
                                     "          %s\n"
                                     "          y[row * %dL + at] = %s; }",
                                  OW, OW, mx ? "float best = -MGC_INF; int bat = -1;" : "float acc = 0.0f;", taps, OH * OW,
                                  mx ? "bat < 0 ? -MGC_INF : best"
                                     : avg_divisor(L, G, "oy", "ox") ? arena_printf(a, "acc / %s", avg_divisor(L, G, "oy", "ox"))
                                                                     : arena_printf(a, "acc * %s", scale)));
        cg_end_kernel(L);
        return;
    }
    if (mx) cg_kernel(L, id, "maxpool2d_grad", cg_rows_work(planes, (long)H * Wd), 3, b, (const char *const[]){ "=dx", "x", "dy" });
    else cg_kernel(L, id, "avgpool2d_grad", cg_rows_work(planes, (long)H * Wd), 2, b, (const char *const[]){ "=dx", "dy" });
    cg_body(L, "    /* dx%s are [N*%d planes, %d, %d], dy is [N*%d, %d, %d]; window %d, stride %d, padding %d; one input per iteration */\n",
            mx ? ", x" : "", C, H, Wd, C, OH, OW, K, S, P);
    const char *g = arena_printf(a, "dyp[oy * %d + ox]", OW);
    const char *route = mx ? arena_printf(a, "float best = -MGC_INF; int bat = -1;\n"
                                             "                  %s\n"
                                             "                  if (bat == iy * %d + ix) s += %s",
                                          taps, Wd, relu ? arena_printf(a, "mgc_keep(%s, best > 0.0f);   /* fused relu_grad */", g) : arena_printf(a, "%s;", g))
                       : avg_divisor(L, G, "oy", "ox") ? arena_printf(a, "s += %s / %s;", g, avg_divisor(L, G, "oy", "ox"))
                                                       : arena_printf(a, "s += %s * %s;", g, scale);
    cg_rows_body(L, planes, (long)H * Wd,
                 arena_printf(a, "        const float *dyp = dy + row * %dL;%s\n", OH * OW,
                              mx ? arena_printf(a, " const float *xp = x + row * %dL;", H * Wd) : ""),
                 arena_printf(a, "{ int iy = at / %d, ix = at %% %d;\n"
                                 "          float s = 0.0f;\n"
                                 "          int ty = iy + %d - %d + 1, tx = ix + %d - %d + 1;\n"
                                 "          int oy0 = ty <= 0 ? 0 : (ty + %d - 1) / %d, oy1 = (iy + %d) / %d, ox0 = tx <= 0 ? 0 : (tx + %d - 1) / %d, ox1 = (ix + %d) / %d;\n"
                                 "          for (int oy = oy0; oy <= oy1 && oy < %d; oy++)\n"
                                 "              for (int ox = ox0; ox <= ox1 && ox < %d; ox++) {\n"
                                 "                  %s\n"
                                 "              }\n"
                                 "          dx[row * %dL + at] = s; }",
                              Wd, Wd, P, K, P, K, S, S, P, S, S, S, P, S, OH, OW, route, H * Wd));
    cg_end_kernel(L);
}

void cg_lower_window_pool(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    if (cg_pool_by(L->dec, id) >= 0) return;   /* computed, and its buffer made, by the BatchNorm's or convolution's kernel */
    bool fwd = n->op == OP_MAXPOOL || n->op == OP_AVGPOOL;
    /* xs: the forward input's shape; os: the forward output's shape */
    const Shape *xs = fwd ? &g->nodes[n->in[0]].shape : &n->shape;
    const Shape *os = fwd ? &n->shape : &g->nodes[n->op == OP_MAXPOOL_BWD ? n->in[1] : n->in[0]].shape;
    PoolGeom G = { .K = n->attr.kernel, .S = n->attr.stride, .P = n->attr.padding, .C = xs->d[1], .H = xs->d[2],
                   .Wd = xs->d[3], .OH = os->d[2], .OW = os->d[3], .mx = n->op == OP_MAXPOOL || n->op == OP_MAXPOOL_BWD,
                   .relu = cg_relu_mask(L->dec, id), .ceil = n->attr.ceil_mode, .excl = n->attr.exclude_pad,
                   .y = cg_out_buf(L, id), .planes = dimn(xs->d[1]) };
    G.W = cg_work_str(L, G.planes);
    G.scale = cg_f32(L, 1.0 / (G.K * G.K));
    int K = G.K, S = G.S, P = G.P, H = G.H, Wd = G.Wd, OH = G.OH, OW = G.OW;
    if (!L->dec->cpu_only) {
        pool_gpu(L, id, &G);
        return;
    }
    if (fwd && G.mx && !G.ceil && (long)H * OW <= 4096 && K <= 16) pool_forward_separable(L, id, &G);
    else if (fwd) pool_forward(L, id, &G);
    else if (G.mx && K == 2 && S == 2 && P == 0 && H == OH * 2 && Wd == OW * 2) maxpool_grad_2x2(L, id, &G);
    else if (G.mx && S == K && P == 0 && H == OH * K && Wd == OW * K) maxpool_grad_tiled(L, id, &G);
    else if (G.mx && G.relu && !G.ceil && L->dec->cpu_only && S == 2 && OW <= 8 && K <= 4 && P < K && H + 2 * P <= 64)
        max_pool_grad_rows(L, id, K, P, G.C, H, Wd, OH, OW);
    else pool_grad_scatter(L, id, &G);
}

/* x [N, C, H, W] -> y [N, C, 1, 1]: the mean of each plane */
void cg_lower_global_avgpool(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int HW = xs->d[2] * xs->d[3];
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    Dim work = dim_of(&n->shape);
    Step *st = cg_kernel(L, id, "global_avgpool", work, 2, b, (const char *const[]){ "=y", "x" });
    if (!L->dec->cpu_only && HW >= 256) {   /* GPUs, planes of a block's worth: a block a plane (a thread a plane: SE-ResNet's
                                               [N, 16, 28, 28] on 16 blocks of threads) */
        st->heavy = st->blocks = true;
        cg_body(L, "    FOR_EACH_BLOCK(i, %s) {\n        const float *xp = x + i * %dL;\n        float acc = 0.0f;\n"
                   "        BLOCK_LOOP(k, %d) acc += xp[k];\n        acc = BLOCK_SUM(acc);\n        if (BLOCK_LEADER) y[i] = acc * %s;\n    }\n",
                cg_work_str(L, work), HW, HW, cg_f32(L, 1.0 / HW));
        cg_end_kernel(L);
        return;
    }
    cg_body(L, "    FOR_EACH(i, %s) {\n        const float *xp = x + i * %d;\n        float acc = 0.0f;\n"
               "        for (int k = 0; k < %d; k++) acc += xp[k];\n        y[i] = acc * %s;\n    }\n",
            cg_work_str(L, work), HW, HW, cg_f32(L, 1.0 / HW));
    cg_end_kernel(L);
}

/* dy [N, C, 1, 1] -> dx [N, C, H, W]: each plane gets its gradient / (H*W) */
void cg_lower_global_avgpool_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &n->shape;
    int C = xs->d[1], HW = xs->d[2] * xs->d[3];
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    if (!L->dec->cpu_only) {   /* GPUs: an element a thread */
        cg_kernel(L, id, "global_avgpool_grad", cg_rows_work(dimn(C), HW), 2, b, (const char *const[]){ "=dx", "dy" });
        cg_rows_body(L, dimn(C), HW, "", arena_printf(L->p->arena, "dx[row * %dL + at] = dy[row] * %s;", HW, cg_f32(L, 1.0 / HW)));
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "global_avgpool_grad", dimn(C), 2, b, (const char *const[]){ "=dx", "dy" })->grain = HW;
    cg_body(L, "    FOR_EACH(plane, %s) {\n        float g = dy[plane] * %s;\n"
               "        for (int k = 0; k < %d; k++) dx[plane * %d + k] = g;\n    }\n", cg_work_str(L, dimn(C)), cg_f32(L, 1.0 / HW), HW, HW);
    cg_end_kernel(L);
}

/* x [N, C, H, W] -> y [N, C, sH, sW], nearest: one output plane per iteration */
/* Bilinear, PyTorch's (align_corners=False): output row o reads input rows i0 and i1 = i0 + 1 (the
   last at the edge) at r = max((o + 0.5) / s - 0.5, 0), i0 = floor(r), weights 1 - (r - i0) and
   r - i0; columns alike. One plane per iteration; the gradient scatters each output's weights
   back within its plane (the plane's iteration alone writes it). */
static void upsample_bilinear(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    bool fwd = n->op == OP_UPSAMPLE;
    const Shape *xs = fwd ? &L->g->nodes[n->in[0]].shape : &n->shape;
    int C = xs->d[1], H = xs->d[2], W = xs->d[3], s = n->attr.scale, OH = H * s, OW = W * s;
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, fwd ? "upsample_bilinear" : "upsample_bilinear_grad", dimn(C), 2, b,
              fwd ? (const char *const[]){ "=y", "x" } : (const char *const[]){ "=dx", "dy" })->grain = (long)OH * OW * 4;
    const char *inv = cg_f32(L, 1.0 / s);
    cg_body(L, "    /* %s [N*%d planes, %d, %d] %s [N*%d, %d, %d], bilinear by %d (align_corners=False) */\n", fwd ? "x" : "dx", C, H, W,
            fwd ? "-> y" : "<- dy", C, OH, OW, s);
    cg_body(L, "    FOR_EACH(plane, %s) {\n", cg_work_str(L, dimn(C)));
    if (fwd) cg_body(L, "        const float *xp = x + plane * %dL;\n        float *yp = y + plane * %ldL;\n", H * W, (long)OH * OW);
    else cg_body(L, "        const float *gp = dy + plane * %ldL;\n        float *dp = dx + plane * %dL;\n"
                    "        for (int k = 0; k < %d; k++) dp[k] = 0.0f;\n", (long)OH * OW, H * W, H * W);
    cg_body(L, "        for (int oy = 0; oy < %d; oy++) {\n"
               "            float ry = %s * (oy + 0.5f) - 0.5f;\n"
               "            if (ry < 0.0f) ry = 0.0f;\n"
               "            const int y0 = (int)ry, y1 = y0 + (y0 < %d);\n"
               "            const float ly = ry - y0, hy = 1.0f - ly;\n"
               "            for (int ox = 0; ox < %d; ox++) {\n"
               "                float rx = %s * (ox + 0.5f) - 0.5f;\n"
               "                if (rx < 0.0f) rx = 0.0f;\n"
               "                const int x0 = (int)rx, x1 = x0 + (x0 < %d);\n"
               "                const float lx = rx - x0, hx = 1.0f - lx;\n", OH, inv, H - 1, OW, inv, W - 1);
    if (fwd)
        cg_body(L, "                yp[oy * %d + ox] = hy * (hx * xp[y0 * %d + x0] + lx * xp[y0 * %d + x1]) +\n"
                   "                                   ly * (hx * xp[y1 * %d + x0] + lx * xp[y1 * %d + x1]);\n", OW, W, W, W, W);
    else
        cg_body(L, "                const float g = gp[oy * %d + ox];\n"
                   "                dp[y0 * %d + x0] += hy * hx * g;\n                dp[y0 * %d + x1] += hy * lx * g;\n"
                   "                dp[y1 * %d + x0] += ly * hx * g;\n                dp[y1 * %d + x1] += ly * lx * g;\n", OW, W, W, W, W);
    cg_body(L, "            }\n        }\n    }\n");
    cg_end_kernel(L);
}

void cg_lower_upsample(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    if (n->attr.bilinear) {
        upsample_bilinear(L, id);
        return;
    }
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int C = xs->d[1], H = xs->d[2], W = xs->d[3], s = n->attr.scale;
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "upsample", dimn(C), 2, b, (const char *const[]){ "=y", "x" })->grain = (long)H * W * s * s;
    cg_body(L, "    /* x [N*%d planes, %d, %d] -> y [N*%d, %d, %d], each pixel %dx%d times */\n", C, H, W, C, H * s, W * s, s, s);
    cg_body(L, "    FOR_EACH(plane, %s) {\n"
               "        const float *xp = x + plane * %dL;\n        float *yp = y + plane * %ldL;\n"
               "        for (int oy = 0; oy < %d; oy++)\n"
               "            for (int ox = 0; ox < %d; ox++) yp[oy * %d + ox] = xp[(oy / %d) * %d + ox / %d];\n    }\n",
            cg_work_str(L, dimn(C)), H * W, (long)H * W * s * s, H * s, W * s, W * s, s, W, s);
    cg_end_kernel(L);
}

/* dy [N, C, sH, sW] -> dx [N, C, H, W]: each block of s x s summed; one plane per iteration */
void cg_lower_upsample_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    if (n->attr.bilinear) {
        upsample_bilinear(L, id);
        return;
    }
    int C = n->shape.d[1], H = n->shape.d[2], W = n->shape.d[3], s = n->attr.scale;
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "upsample_grad", dimn(C), 2, b, (const char *const[]){ "=dx", "dy" })->grain = (long)H * W * s * s;
    cg_body(L, "    /* dy [N*%d planes, %d, %d] -> dx [N*%d, %d, %d], each %dx%d block summed */\n", C, H * s, W * s, C, H, W, s, s);
    cg_body(L, "    FOR_EACH(plane, %s) {\n"
               "        const float *gp = dy + plane * %ldL;\n        float *dp = dx + plane * %dL;\n"
               "        for (int iy = 0; iy < %d; iy++)\n"
               "            for (int ix = 0; ix < %d; ix++) {\n"
               "                float acc = 0.0f;\n"
               "                for (int a = 0; a < %d; a++)\n"
               "                    for (int c = 0; c < %d; c++) acc += gp[(iy * %d + a) * %d + ix * %d + c];\n"
               "                dp[iy * %d + ix] = acc;\n"
               "            }\n    }\n",
            cg_work_str(L, dimn(C)), (long)H * W * s * s, H * W, H, W, s, s, s, W * s, s, W);
    cg_end_kernel(L);
}

/* PyTorch's adaptive windows of output cell o of O over an input of I: [o I / O, ceil((o + 1) I / O)) */
static void adaptive_window(Lower *L, const char *o, int I, int O, const char *lo, const char *hi)
{
    cg_body(L, "            const int %s = (int)((long)%s * %d / %d), %s = (int)(((long)%s + 1) * %d + %d) / %d;\n", lo, o, I, O, hi, o, I, O - 1, O);
}

/* x [N, C, H, W] -> y [N, C, OH, OW]: each window's mean; one plane per iteration */
void cg_lower_adaptive_avgpool(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int C = xs->d[1], H = xs->d[2], W = xs->d[3], OH = n->attr.height, OW = n->attr.width;
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "adaptive_avgpool", dimn(C), 2, b, (const char *const[]){ "=y", "x" })->grain = (long)H * W;
    cg_body(L, "    /* x [N*%d planes, %d, %d] -> y [N*%d, %d, %d], PyTorch's adaptive windows */\n", C, H, W, C, OH, OW);
    cg_body(L, "    FOR_EACH(plane, %s) {\n        const float *xp = x + plane * %dL;\n        float *yp = y + plane * %dL;\n"
               "        for (int oy = 0; oy < %d; oy++)\n          for (int ox = 0; ox < %d; ox++) {\n",
            cg_work_str(L, dimn(C)), H * W, OH * OW, OH, OW);
    adaptive_window(L, "oy", H, OH, "y0", "y1");
    adaptive_window(L, "ox", W, OW, "x0", "x1");
    cg_body(L, "            float acc = 0.0f;\n"
               "            for (int iy = y0; iy < y1; iy++)\n                for (int ix = x0; ix < x1; ix++) acc += xp[iy * %d + ix];\n"
               "            yp[oy * %d + ox] = acc / (float)((y1 - y0) * (x1 - x0));\n          }\n    }\n", W, OW);
    cg_end_kernel(L);
}

/* dy [N, C, OH, OW] -> dx [N, C, H, W]: each cell's gradient shared out over its window (windows may
   overlap: accumulated); one plane per iteration */
void cg_lower_adaptive_avgpool_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int C = n->shape.d[1], H = n->shape.d[2], W = n->shape.d[3], OH = n->attr.height, OW = n->attr.width;
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "adaptive_avgpool_grad", dimn(C), 2, b, (const char *const[]){ "=dx", "dy" })->grain = (long)H * W;
    cg_body(L, "    FOR_EACH(plane, %s) {\n        const float *gp = dy + plane * %dL;\n        float *dp = dx + plane * %dL;\n"
               "        for (int k = 0; k < %d; k++) dp[k] = 0.0f;\n"
               "        for (int oy = 0; oy < %d; oy++)\n          for (int ox = 0; ox < %d; ox++) {\n",
            cg_work_str(L, dimn(C)), OH * OW, H * W, H * W, OH, OW);
    adaptive_window(L, "oy", H, OH, "y0", "y1");
    adaptive_window(L, "ox", W, OW, "x0", "x1");
    cg_body(L, "            float g = gp[oy * %d + ox] / (float)((y1 - y0) * (x1 - x0));\n"
               "            for (int iy = y0; iy < y1; iy++)\n                for (int ix = x0; ix < x1; ix++) dp[iy * %d + ix] += g;\n"
               "          }\n    }\n", OW, W);
    cg_end_kernel(L);
}

/* x [N, C, H, W] -> y [N, C, 1, 1]: each plane's maximum (a NaN wins, as PyTorch's) */
void cg_lower_global_maxpool(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int C = xs->d[1], HW = xs->d[2] * xs->d[3];
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "global_maxpool", dimn(C), 2, b, (const char *const[]){ "=y", "x" })->grain = HW;
    cg_body(L, "    FOR_EACH(plane, %s) {\n        const float *xp = x + plane * %dL;\n        float acc = xp[0];\n"
               "        for (int k = 1; k < %d; k++) { float v = xp[k]; acc = (v > acc) | (v != v && acc == acc) ? v : acc; }\n"
               "        y[plane] = acc;\n    }\n", cg_work_str(L, dimn(C)), HW, HW);
    cg_end_kernel(L);
}

/* x, dy [N, C, 1, 1] -> dx: each plane's gradient to its first maximum, zeros elsewhere */
void cg_lower_global_maxpool_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int C = n->shape.d[1], HW = n->shape.d[2] * n->shape.d[3];
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    cg_kernel(L, id, "global_maxpool_grad", dimn(C), 3, b, (const char *const[]){ "=dx", "x", "dy" })->grain = HW;
    cg_body(L, "    FOR_EACH(plane, %s) {\n        const float *xp = x + plane * %dL;\n        float *dp = dx + plane * %dL;\n"
               "        float best = xp[0]; int at = 0;\n"
               "        for (int k = 1; k < %d; k++) { float v = xp[k]; if ((v > best) | (v != v && best == best)) { best = v; at = k; } }\n"
               "        for (int k = 0; k < %d; k++) dp[k] = k == at ? dy[plane] : 0.0f;\n    }\n",
            cg_work_str(L, dimn(C)), HW, HW, HW, HW);
    cg_end_kernel(L);
}
