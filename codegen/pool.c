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
static bool inside_open(Lower *L, int K, int S, int P, int H, int W, int OH, int OW)
{
    int oy0 = (P + S - 1) / S, oy1 = (H - K + P) / S, ox0 = (P + S - 1) / S, ox1 = (W - K + P) / S;   /* inclusive */
    if (oy1 >= OH) oy1 = OH - 1;
    if (ox1 >= OW) ox1 = OW - 1;
    if (K > 4 || oy0 > oy1 || ox0 > ox1 || H - K + P < 0 || W - K + P < 0) return false;
    cg_body(L, "                if (oy >= %d && oy <= %d && ox >= %d && ox <= %d) {   /* inside the plane: taps written out */\n"
               "                    const int b0 = (oy * %d - %d) * %d + ox * %d - %d;\n"
               "                    const float *w0 = xp + b0;\n", oy0, oy1, ox0, ox1, S, P, W, S, P);
    return true;
}

/* maxpool2d, avgpool2d: x -> y; maxpool2d_grad: x, dy -> dx; avgpool2d_grad: dy -> dx.
   The common max-pool gradients get kernels of their own: 2x2 stride 2, and windows that tile the plane. */
void cg_lower_window_pool(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    int K = n->i[0], S = n->i[1], P = n->i[2];
    int y = cg_out_buf(L, id);
    bool fwd = n->op == OP_MAXPOOL || n->op == OP_AVGPOOL;
    bool mx = n->op == OP_MAXPOOL || n->op == OP_MAXPOOL_BWD;
    /* xs: the forward input's shape; os: the forward output's shape */
    const Shape *xs = fwd ? &g->nodes[n->in[0]].shape : &n->shape;
    const Shape *os = fwd ? &n->shape : &g->nodes[n->op == OP_MAXPOOL_BWD ? n->in[1] : n->in[0]].shape;
    int C = xs->d[1], H = xs->d[2], Wd = xs->d[3], OH = os->d[2], OW = os->d[3];
    Dim planes = dimn(C);
    const char *W = cg_work_str(L, planes);
    const char *scale = arena_printf(L->p->arena, "%#.9gf", 1.0 / (K * K));
    long Hp = (long)H + 2 * P, Wp = (long)Wd + 2 * P;
    if (fwd && mx && P > 0 && Hp * Wp + Hp * OW <= 16384 && (OH - 1) * S + K <= Hp && (OW - 1) * S + K <= Wp) {
        /* Max is separable: the maximum over each row's windows, then over K of those rows,
           in a copy of the plane bordered with -inf (which wins nothing): no test for the
           padding per tap. A NaN still wins. Measured: ResNet-18's 3x3/2 pool with padding 1,
           5.7 -> 4.4 ms a step; without padding the plain loops below are faster (LeNet's
           2x2/2: 0.16 ms, this form 2 ms). */
        int b[2] = { y, buf_of(L, n->in[0]) };
        cg_kernel(L, id, "maxpool2d", planes, 2, b, (const char *const[]){ "=y", "x" })->grain = H * Wd;
        cg_body(L, "    /* x is [N*%d planes, %d, %d], y is [N*%d, %d, %d]; window %d, stride %d, padding %d; one plane per iteration:\n"
                   "       rows' maxima hm[%ld, %d], then columns' */\n", C, H, Wd, C, OH, OW, K, S, P, Hp, OW);
        cg_body(L, "    float pad[%ld], hm[%ld];\n"
                   "    for (int i = 0; i < %ld; i++) pad[i] = -MGC_INF;   /* the border stays -inf */\n"
                   "    FOR_EACH(plane, %s) {\n"
                   "        const float *xp = x + plane * %d;\n"
                   "        float *yp = y + plane * %d;\n"
                   "        for (int iy = 0; iy < %d; iy++)\n"
                   "            for (int ix = 0; ix < %d; ix++) pad[(iy + %d) * %ld + %d + ix] = xp[iy * %d + ix];\n"
                   "        for (int iy = 0; iy < %ld; iy++)\n"
                   "            for (int ox = 0; ox < %d; ox++) {\n"
                   "                const float *r = pad + iy * %ld + ox * %d;\n"
                   "                float acc = r[0];\n"
                   "                for (int k = 1; k < %d; k++) { float v = r[k]; acc = (v > acc) | (v != v) ? v : acc; }\n"
                   "                hm[iy * %d + ox] = acc;\n"
                   "            }\n"
                   "        for (int oy = 0; oy < %d; oy++)\n"
                   "            for (int ox = 0; ox < %d; ox++) {\n"
                   "                const float *r = hm + oy * %d + ox;\n"
                   "                float acc = r[0];\n"
                   "                for (int k = 1; k < %d; k++) { float v = r[k * %d]; acc = (v > acc) | (v != v) ? v : acc; }\n"
                   "                yp[oy * %d + ox] = acc;\n"
                   "            }\n    }\n",
                Hp * Wp, Hp * OW, Hp * Wp, W, H * Wd, OH * OW, H, Wd, P, Wp, P, Wd, Hp, OW, Wp, S, K, OW, OH, OW, S * OW, K, OW, OW);
        cg_end_kernel(L);
        return;
    }
    if (fwd) {
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
        cg_body(L, "                yp[oy * %d + ox] = %s;\n"
                   "            }\n    }\n", OW, mx ? "acc" : arena_printf(L->p->arena, "acc * %s", scale));
    } else {
        if (mx && K == 2 && S == 2 && P == 0 && H == OH * 2 && Wd == OW * 2) {
            /* The common 2x2/2 pool, written out: one output row of windows per inner loop. */
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
                       "                /* the first maximum in reading order, as the forward (and PyTorch) */\n"
                       "                float a0 = r0[2 * ox], a1 = r0[2 * ox + 1], a2 = r1[2 * ox], a3 = r1[2 * ox + 1];\n"
                       "                float m = a0;\n"
                       "                m = (a1 > m) | (a1 != a1) ? a1 : m;\n"
                       "                m = (a2 > m) | (a2 != a2) ? a2 : m;\n"
                       "                m = (a3 > m) | (a3 != a3) ? a3 : m;\n"
                       "                /* exactly one of the four gets the gradient: the first equal to m (the last if m is NaN) */\n"
                       "                int e0 = a0 == m, e1 = !e0 & (a1 == m), e2 = !e0 & !e1 & (a2 == m), e3 = !e0 & !e1 & !e2;\n"
                       "                float g = %s;\n"
                       "                d0[2 * ox] = e0 ? g : 0.0f;\n"
                       "                d0[2 * ox + 1] = e1 ? g : 0.0f;\n"
                       "                d1[2 * ox] = e2 ? g : 0.0f;\n"
                       "                d1[2 * ox + 1] = e3 ? g : 0.0f;\n"
                       "            }\n        }\n    }\n",
                    W, H * Wd, OH * OW, H * Wd, OH, 2 * Wd, Wd, OW, 2 * Wd, Wd, OW,
                    L->relu_mask[id] ? "m > 0.0f ? g0[ox] : 0.0f   /* fused relu_grad */" : "g0[ox]");
            cg_end_kernel(L);
            return;
        }
        if (mx && S == K && P == 0 && H == OH * K && Wd == OW * K) {
            /* Windows tile the plane exactly: every x belongs to one window, so each
               window writes its K*K gradients directly (no zeroing, no accumulation). */
            int b[3] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
            cg_kernel(L, id, "maxpool2d_grad_tiled", planes, 3, b, (const char *const[]){ "=dx", "x", "dy" })->grain = H * Wd;
            cg_body(L, "    /* dx, x are [N*%d planes, %d, %d], dy is [N*%d, %d, %d]; %dx%d windows tile the plane */\n",
                    C, H, Wd, C, OH, OW, K, K);
            cg_body(L, "    FOR_EACH(plane, %s) {\n"
                       "        const float *xp = x + plane * %d, *dyp = dy + plane * %d;\n"
                       "        float *dxp = dx + plane * %d;\n"
                       "        for (int oy = 0; oy < %d; oy++)\n"
                       "            for (int ox = 0; ox < %d; ox++) {\n"
                       "                /* the window's first maximum, as the forward pass (and PyTorch) chose it */\n"
                       "                const float *w0 = xp + oy * %d + ox * %d;\n"
                       "                float best = w0[0]; int at = 0;\n"
                       "                for (int ky = 0; ky < %d; ky++)\n"
                       "                    for (int kx = 0; kx < %d; kx++) {\n"
                       "                        float v = w0[ky * %d + kx];\n"
                       "                        int better = (v > best) | (v != v);   /* branch-free: the data decide */\n"
                       "                        best = better ? v : best;\n"
                       "                        at = better ? ky * %d + kx : at;\n"
                       "                    }\n"
                       "                float g = %s;\n"
                       "                float *d0 = dxp + oy * %d + ox * %d;\n"
                       "                for (int ky = 0; ky < %d; ky++)\n"
                       "                    for (int kx = 0; kx < %d; kx++) d0[ky * %d + kx] = ky * %d + kx == at ? g : 0.0f;\n"
                       "            }\n    }\n",
                    W, H * Wd, OH * OW, H * Wd, OH, OW, K * Wd, K, K, K, Wd, K,
                    L->relu_mask[id] ? arena_printf(L->p->arena, "best > 0.0f ? dyp[oy * %d + ox] : 0.0f   /* fused relu_grad */", OW)
                                     : arena_printf(L->p->arena, "dyp[oy * %d + ox]", OW),
                    K * Wd, K, K, K, Wd, K);
            cg_end_kernel(L);
            return;
        }
        /* Scatter within a plane: each iteration owns one plane of dx, so no two threads write one place. */
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
                    cg_body(L, "                    { float v = w0[%d]; if (v > best || (v != v && best == best)) { best = v; at = b0 + %d; } }\n",
                            t / K * Wd + t % K, t / K * Wd + t % K);
                cg_body(L, "                    if (%s) dxp[at] += dyp[oy * %d + ox];\n                    continue;\n                }\n",
                        L->relu_mask[id] ? "best > 0.0f   /* fused relu_grad */" : "1", OW);
            }
            window_open(L, K, S, P, H, Wd);
            cg_body(L, "                        float v = xp[iy * %d + ix];\n"
                       "                        if (at < 0 || v > best || (v != v && best == best)) { best = v; at = iy * %d + ix; }\n",
                    Wd, Wd);
            window_close(L);
            cg_body(L, "                if (at >= 0%s) dxp[at] += dyp[oy * %d + ox];\n",
                    L->relu_mask[id] ? " && best > 0.0f   /* fused relu_grad: x is a relu output */" : "", OW);
        } else {
            cg_body(L, "                float g = dyp[oy * %d + ox] * %s;\n", OW, scale);
            window_open(L, K, S, P, H, Wd);
            cg_body(L, "                        dxp[iy * %d + ix] += g;\n", Wd);
            window_close(L);
        }
        cg_body(L, "            }\n    }\n");
    }
    cg_end_kernel(L);
}

/* x [N, C, H, W] -> y [N, C, 1, 1]: the mean of each plane */
void cg_lower_global_avgpool(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int HW = xs->d[2] * xs->d[3];
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    Dim work = dim_of(&n->shape);
    cg_kernel(L, id, "global_avgpool", work, 2, b, (const char *const[]){ "=y", "x" });
    cg_body(L, "    FOR_EACH(i, %s) {\n        const float *xp = x + i * %d;\n        float acc = 0.0f;\n"
               "        for (int k = 0; k < %d; k++) acc += xp[k];\n        y[i] = acc * %#.9gf;\n    }\n",
            cg_work_str(L, work), HW, HW, 1.0 / HW);
    cg_end_kernel(L);
}

/* dy [N, C, 1, 1] -> dx [N, C, H, W]: each plane gets its gradient / (H*W) */
void cg_lower_global_avgpool_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &n->shape;
    int C = xs->d[1], HW = xs->d[2] * xs->d[3];
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "global_avgpool_grad", dimn(C), 2, b, (const char *const[]){ "=dx", "dy" })->grain = HW;
    cg_body(L, "    FOR_EACH(plane, %s) {\n        float g = dy[plane] * %#.9gf;\n"
               "        for (int k = 0; k < %d; k++) dx[plane * %d + k] = g;\n    }\n", cg_work_str(L, dimn(C)), 1.0 / HW, HW, HW);
    cg_end_kernel(L);
}
