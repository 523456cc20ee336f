/*
** Lowering: IR nodes -> buffers and steps, and the kernel bodies as text.
**
** Requires: a verified graph (shapes set, inputs earlier than users).
** Produces: a Program. Every node that has an output gets a buffer sized for
** N examples (views alias their input's buffer); GEMM-shaped ops become
** generated pack/unpack kernels around one BLAS call:
**
**   conv2d  x[N,C,H,W] -> im2col -> col[CKK, N*P]         (P = OH*OW, CKK = C*K*K)
**           t[O, N*P] = W[O, CKK] . col                    (GEMM)
**           y[N,O,P] = t[o, n*P + p] + b[o]                (unpack kernel)
**   grad    dyt[O, N*P] = dy permuted                      (pack kernel, once per dy)
**           dW[O, CKK] = dyt . col^T                       (GEMM; col kept from forward)
**           dcol[CKK, N*P] = W^T . dyt ; dx = col2im(dcol) (GEMM + gather kernel)
**
** Kernel bodies use only the macros of the prelude (codegen/prelude.c):
** KERNEL(name), FOR_EACH(i, n), DEVICE, RESTRICT, MGC_INF, mgc_uniform().
** Each kernel has exactly one FOR_EACH, whose iterations are independent: the
** CPU splits them over threads, CUDA over a grid, with no barrier inside.
*/
#include "codegen.h"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct Lower {
    const Graph *g;
    Program *p;
    FILE *src;        /* kernel bodies (open_memstream) */
    int *col;         /* conv node -> its im2col buffer (kept for the weight gradient) */
    int *dyt;         /* gradient node -> its [O, N*P] transposed copy, made once */
    int *dyc;         /* gradient node -> its [N*P, O] channels-last copy, made once */
    int *fused;       /* node -> the node whose kernel computes it too (its buffer is shared), or -1 */
    bool *relu_out;   /* node's kernel applies ReLU to what it writes (a fused relu follows) */
    bool *relu_mask;  /* maxpool2d_grad: keep only gradients where x > 0 (a fused relu_grad follows) */
    /* data parallelism */
    int *in_bucket;   /* node -> the bucket buffer its output lives in, or -1 */
    int *bucket_at;   /* node -> its offset in that bucket (floats) */
    int *bucket_coll; /* IR bucket -> its collective */
    int *ready;       /* IR bucket -> the node after whose lowering its collective starts */
    bool *waited;     /* IR bucket -> its wait step has been emitted */
} Lower;

static Dim dim_of(const Shape *s)
{
    Dim d = { 1, false };
    for (int k = 0; k < s->nd; k++) {
        if (s->d[k] == IR_BATCH) d.batch = true;
        else d.c *= s->d[k];
    }
    return d;
}

static Dim dimc(long c) { return (Dim){ c, false }; }
static Dim dimn(long c) { return (Dim){ c, true }; }

static int new_buf(Lower *L, BufKind kind, Dim size, const char *name, int node)
{
    Program *p = L->p;
    if (p->nbufs == p->capbufs) {
        int cap = p->capbufs ? 2 * p->capbufs : 64;
        p->bufs = arena_grow(p->arena, p->bufs, sizeof(Buf) * (size_t)p->capbufs, sizeof(Buf) * (size_t)cap);
        p->capbufs = cap;
    }
    Buf *b = &p->bufs[p->nbufs];
    b->kind = kind;
    b->size = size;
    b->name = name;
    b->node = node;
    b->alias = -1;
    return p->nbufs++;
}

static Step *new_step(Lower *L, StepKind kind, int node)
{
    Program *p = L->p;
    if (p->nsteps == p->capsteps) {
        int cap = p->capsteps ? 2 * p->capsteps : 64;
        p->steps = arena_grow(p->arena, p->steps, sizeof(Step) * (size_t)p->capsteps, sizeof(Step) * (size_t)cap);
        p->capsteps = cap;
    }
    Step *s = &p->steps[p->nsteps++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->node = node;
    return s;
}

/* Starts a kernel: the step, and the function header with its buffer
   arguments named as given ("y", "x", ...; a leading '=' marks an output). */
static Step *kernel(Lower *L, int node, const char *what, Dim work, int nargs, const int *bufs, const char *const *names)
{
    Step *s = new_step(L, STEP_KERNEL, node);
    s->fn = arena_printf(L->p->arena, "k%d_%s", L->p->nsteps - 1, what);
    s->work = work;
    s->nargs = nargs;
    memcpy(s->args, bufs, sizeof(int) * (size_t)nargs);
    const Node *n = &L->g->nodes[node];
    fprintf(L->src, "\n/* %%%d %s %s", node, ir_op_name(n->op), ir_shape_str(L->p->arena, &n->shape));
    if (n->loc.file) fprintf(L->src, "  (%s:%d)", n->loc.file->name, n->loc.line);
    fprintf(L->src, " */\nKERNEL(%s)(KArgs a)\n{\n    const long N = a.batch;\n    (void)N;\n", s->fn);
    for (int k = 0; k < nargs; k++) {
        bool out = names[k][0] == '=';
        fprintf(L->src, "    %sfloat *RESTRICT %s = a.t[%d];\n", out ? "" : "const ", names[k] + out, k);
    }
    return s;
}

static void body(Lower *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void body(Lower *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(L->src, fmt, ap);
    va_end(ap);
}

static void end_kernel(Lower *L) { fputs("}\n", L->src); }

/* The work count as C text: "150 * N" or "150". */
static const char *work_str(Lower *L, Dim d)
{
    return d.batch ? arena_printf(L->p->arena, "%ldL * N", d.c) : arena_printf(L->p->arena, "%ldL", d.c);
}

static Step *gemm(Lower *L, int node, bool ta, bool tb, Dim m, Dim n, Dim k, int a, Dim lda, int b, Dim ldb,
                  float beta, int c, Dim ldc)
{
    Step *s = new_step(L, STEP_GEMM, node);
    s->ta = ta; s->tb = tb;
    s->m = m; s->n = n; s->k = k;
    s->a = a; s->b = b; s->c = c;
    s->lda = lda; s->ldb = ldb; s->ldc = ldc;
    s->alpha = 1.0f;
    s->beta = beta;
    return s;
}

static int buf_of(Lower *L, int node) { return L->p->node_buf[node]; }

static int out_buf(Lower *L, int node)
{
    const Node *n = &L->g->nodes[node];
    int b;
    if (L->in_bucket[node] >= 0) {   /* a gradient summed in a bucket: a piece of the bucket's buffer */
        b = new_buf(L, BUF_VIEW, dim_of(&n->shape), ir_op_name(n->op), node);
        L->p->bufs[b].alias = L->in_bucket[node];
        L->p->bufs[b].offset = L->bucket_at[node];
    } else {
        b = new_buf(L, BUF_ACT, dim_of(&n->shape), ir_op_name(n->op), node);
    }
    L->p->node_buf[node] = b;
    return b;
}

/* ---------------------------------------------------------------- element-wise */

static void lower_elementwise(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    Dim work = dim_of(&n->shape);
    const char *W = work_str(L, work);
    int y = out_buf(L, id);
    int in0 = n->nin > 0 ? buf_of(L, n->in[0]) : -1;
    int in1 = n->nin > 1 ? buf_of(L, n->in[1]) : -1;
    switch (n->op) {
    case OP_RELU: case OP_SIGMOID: case OP_TANH: {
        int b[2] = { y, in0 };
        kernel(L, id, ir_op_name(n->op), work, 2, b, (const char *const[]){ "=y", "x" });
        const char *e = n->op == OP_RELU ? "x[i] > 0.0f ? x[i] : 0.0f"
                      : n->op == OP_SIGMOID ? "1.0f / (1.0f + expf(-x[i]))" : "tanhf(x[i])";
        body(L, "    FOR_EACH(i, %s) {\n        y[i] = %s;\n    }\n", W, e);
        break;
    }
    case OP_RELU_BWD: case OP_SIGMOID_BWD: case OP_TANH_BWD: {
        int b[3] = { y, in0, in1 };
        kernel(L, id, ir_op_name(n->op), work, 3, b, (const char *const[]){ "=dx", "y", "dy" });
        const char *e = n->op == OP_RELU_BWD ? "y[i] > 0.0f ? dy[i] : 0.0f"
                      : n->op == OP_SIGMOID_BWD ? "dy[i] * y[i] * (1.0f - y[i])" : "dy[i] * (1.0f - y[i] * y[i])";
        body(L, "    FOR_EACH(i, %s) {\n        dx[i] = %s;\n    }\n", W, e);
        break;
    }
    case OP_ADD: case OP_MUL: {
        int b[3] = { y, in0, in1 };
        kernel(L, id, ir_op_name(n->op), work, 3, b, (const char *const[]){ "=y", "lhs", "rhs" });
        body(L, "    FOR_EACH(i, %s) {\n        y[i] = lhs[i] %c rhs[i];\n    }\n", W, n->op == OP_ADD ? '+' : '*');
        break;
    }
    case OP_CONST: {
        kernel(L, id, "const", work, 1, &y, (const char *const[]){ "=y" });
        body(L, "    FOR_EACH(i, %s) {\n        y[i] = %#.9gf;\n    }\n", W, n->f[0]);
        break;
    }
    case OP_DROPOUT_MASK: {
        Step *s = kernel(L, id, "dropout_mask", work, 1, &y, (const char *const[]){ "=mask" });
        s->seeded = true;
        body(L, "    /* counted from the global batch's first example: the same masks on any number of replicas */\n"
                "    FOR_EACH(i, %s) {\n        mask[i] = mgc_uniform(a.seed, (unsigned long long)(a.first * %ldL + i)) >= %#.9gf ? %#.9gf : 0.0f;\n    }\n",
             W, work.c, n->f[0], 1.0 / (1.0 - n->f[0]));
        break;
    }
    case OP_BN_EVAL_STATS: {
        int c = n->shape.d[1];
        int b[3] = { y, in0, in1 };
        kernel(L, id, "bn_eval_stats", dimc(c), 3, b, (const char *const[]){ "=stats", "running_mean", "running_var" });
        body(L, "    FOR_EACH(c, %dL) {\n"
                "        stats[c] = running_mean[c];\n"
                "        stats[%d + c] = 1.0f / sqrtf(running_var[c] + %#.9gf);\n"
                "        stats[%d + c] = running_var[c];\n    }\n", c, c, n->f[0], 2 * c);
        break;
    }
    case OP_BN_APPLY: {
        const Shape *xs = &n->shape;
        int C = xs->d[1], HW = xs->d[2] * xs->d[3];
        int b[5] = { y, in0, in1, buf_of(L, n->in[2]), buf_of(L, n->in[3]) };
        kernel(L, id, "bn_apply", dimn(C), 5, b, (const char *const[]){ "=y", "x", "stats", "gamma", "beta" })->grain = HW;
        body(L, "    /* x, y are [N*%d planes, %d]; y = (x - mean) * invstd * gamma + beta */\n", C, HW);
        body(L, "    FOR_EACH(plane, %s) {\n"
                "        long c = plane %% %d;\n"
                "        float scale = stats[%d + c] * gamma[c], shift = beta[c] - stats[c] * scale;\n"
                "        const float *xp = x + plane * %d;\n        float *yp = y + plane * %d;\n"
                "        for (int k = 0; k < %d; k++) yp[k] = xp[k] * scale + shift;\n    }\n",
             work_str(L, dimn(C)), C, C, HW, HW, HW);
        break;
    }
    case OP_BN_BWD_X: {
        const Shape *xs = &n->shape;
        int C = xs->d[1], HW = xs->d[2] * xs->d[3];
        int b[6] = { y, in0, in1, buf_of(L, n->in[2]), buf_of(L, n->in[3]), buf_of(L, n->in[4]) };
        kernel(L, id, "bn_grad_x", dimn(C), 6, b, (const char *const[]){ "=dx", "x", "stats", "gamma", "dy", "dparams" })->grain = HW;
        body(L, "    /* dx = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M), M = N*H*W; planes [N*%d, %d] */\n", C, HW);
        body(L, "    const float inv_m = 1.0f / (float)(%s * %dL);\n"
                "    FOR_EACH(plane, %s) {\n"
                "        long c = plane %% %d;\n"
                "        float invstd = stats[%d + c], mean = stats[c], k1 = gamma[c] * invstd;\n"
                "        float mdb = dparams[%d + c] * inv_m, mdg = dparams[c] * inv_m;\n"
                "        const float *xp = x + plane * %d, *dyp = dy + plane * %d;\n        float *dxp = dx + plane * %d;\n"
                "        for (int k = 0; k < %d; k++) dxp[k] = k1 * (dyp[k] - mdb - (xp[k] - mean) * invstd * mdg);\n    }\n",
             n->i[0] ? "a.global_batch" : "N", HW, work_str(L, dimn(C)), C, C, C, HW, HW, HW, HW);
        break;
    }
    case OP_GAP_BWD: {
        const Shape *xs = &n->shape;
        int C = xs->d[1], HW = xs->d[2] * xs->d[3];
        int b[2] = { y, in0 };
        kernel(L, id, "global_avgpool_grad", dimn(C), 2, b, (const char *const[]){ "=dx", "dy" })->grain = HW;
        body(L, "    FOR_EACH(plane, %s) {\n        float g = dy[plane] * %#.9gf;\n"
                "        for (int k = 0; k < %d; k++) dx[plane * %d + k] = g;\n    }\n", work_str(L, dimn(C)), 1.0 / HW, HW, HW);
        break;
    }
    default:
        break;
    }
    (void)g;
    end_kernel(L);
}

/* ------------------------------------------------------------------ reductions */

/* The loops over a window's in-bounds taps, at output (oy, ox): they define iy
   and ix, and skip the padding. window_close() ends them. */
static void window_open(Lower *L, int K, int S, int P, int H, int W)
{
    body(L, "                for (int ky = 0; ky < %d; ky++) {\n"
            "                    int iy = oy * %d - %d + ky;\n"
            "                    if (iy < 0 || iy >= %d) continue;\n"
            "                    for (int kx = 0; kx < %d; kx++) {\n"
            "                        int ix = ox * %d - %d + kx;\n"
            "                        if (ix < 0 || ix >= %d) continue;\n", K, S, P, H, K, S, P, W);
}

static void window_close(Lower *L) { body(L, "                    }\n                }\n"); }

static void lower_window(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    int K = n->i[0], S = n->i[1], P = n->i[2];
    int y = out_buf(L, id);
    bool fwd = n->op == OP_MAXPOOL || n->op == OP_AVGPOOL;
    bool mx = n->op == OP_MAXPOOL || n->op == OP_MAXPOOL_BWD;
    /* xs: the forward input's shape; os: the forward output's shape */
    const Shape *xs = fwd ? &g->nodes[n->in[0]].shape : &n->shape;
    const Shape *os = fwd ? &n->shape : &g->nodes[n->op == OP_MAXPOOL_BWD ? n->in[1] : n->in[0]].shape;
    int C = xs->d[1], H = xs->d[2], Wd = xs->d[3], OH = os->d[2], OW = os->d[3];
    Dim planes = dimn(C);
    const char *W = work_str(L, planes);
    const char *scale = arena_printf(L->p->arena, "%#.9gf", 1.0 / (K * K));
    if (fwd) {
        int b[2] = { y, buf_of(L, n->in[0]) };
        kernel(L, id, ir_op_name(n->op), planes, 2, b, (const char *const[]){ "=y", "x" })->grain = H * Wd;
        body(L, "    /* x is [N*%d planes, %d, %d], y is [N*%d, %d, %d]; window %d, stride %d, padding %d; one plane per iteration */\n",
             C, H, Wd, C, OH, OW, K, S, P);
        body(L, "    FOR_EACH(plane, %s) {\n"
                "        const float *xp = x + plane * %d;\n"
                "        float *yp = y + plane * %d;\n"
                "        for (int oy = 0; oy < %d; oy++)\n"
                "            for (int ox = 0; ox < %d; ox++) {\n"
                "                float acc = %s;\n",
             W, H * Wd, OH * OW, OH, OW, mx ? "-MGC_INF" : "0.0f");
        window_open(L, K, S, P, H, Wd);
        body(L, "                        float v = xp[iy * %d + ix];\n"
                "                        %s\n", Wd, mx ? "if (v > acc || v != v) acc = v;" : "acc += v;");
        window_close(L);
        body(L, "                yp[oy * %d + ox] = %s;\n"
                "            }\n    }\n", OW, mx ? "acc" : arena_printf(L->p->arena, "acc * %s", scale));
    } else {
        if (mx && K == 2 && S == 2 && P == 0 && H == OH * 2 && Wd == OW * 2) {
            /* The common 2x2/2 pool, written out: one output row of windows per inner loop. */
            int b[3] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
            kernel(L, id, "maxpool2d_grad_2x2", planes, 3, b, (const char *const[]){ "=dx", "x", "dy" })->grain = H * Wd;
            body(L, "    /* dx, x are [N*%d planes, %d, %d], dy is [N*%d, %d, %d]; 2x2 windows, stride 2, tiling the plane */\n",
                 C, H, Wd, C, OH, OW);
            body(L, "    FOR_EACH(plane, %s) {\n"
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
            end_kernel(L);
            return;
        }
        if (mx && S == K && P == 0 && H == OH * K && Wd == OW * K) {
            /* Windows tile the plane exactly: every x belongs to one window, so each
               window writes its K*K gradients directly (no zeroing, no accumulation). */
            int b[3] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
            kernel(L, id, "maxpool2d_grad_tiled", planes, 3, b, (const char *const[]){ "=dx", "x", "dy" })->grain = H * Wd;
            body(L, "    /* dx, x are [N*%d planes, %d, %d], dy is [N*%d, %d, %d]; %dx%d windows tile the plane */\n",
                 C, H, Wd, C, OH, OW, K, K);
            body(L, "    FOR_EACH(plane, %s) {\n"
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
            end_kernel(L);
            return;
        }
        /* Scatter within a plane: each iteration owns one plane of dx, so no two threads write one place. */
        int b[3] = { y, buf_of(L, n->in[0]), mx ? buf_of(L, n->in[1]) : -1 };
        if (mx) kernel(L, id, "maxpool2d_grad", planes, 3, b, (const char *const[]){ "=dx", "x", "dy" })->grain = H * Wd;
        else kernel(L, id, "avgpool2d_grad", planes, 2, b, (const char *const[]){ "=dx", "dy" })->grain = H * Wd;
        body(L, "    /* dx%s are [N*%d planes, %d, %d], dy is [N*%d, %d, %d]; window %d, stride %d, padding %d */\n",
             mx ? ", x" : "", C, H, Wd, C, OH, OW, K, S, P);
        body(L, "    FOR_EACH(plane, %s) {\n"
                "        float *dxp = dx + plane * %d;\n"
                "        const float *dyp = dy + plane * %d;\n"
                "        for (int k = 0; k < %d; k++) dxp[k] = 0.0f;\n"
                "        for (int oy = 0; oy < %d; oy++)\n"
                "            for (int ox = 0; ox < %d; ox++) {\n",
             W, H * Wd, OH * OW, H * Wd, OH, OW);
        if (mx) {
            body(L, "                /* the window's first maximum, as the forward pass (and PyTorch) chose it */\n"
                    "                const float *xp = x + plane * %d;\n"
                    "                float best = -MGC_INF; int at = -1;\n", H * Wd);
            window_open(L, K, S, P, H, Wd);
            body(L, "                        float v = xp[iy * %d + ix];\n"
                    "                        if (at < 0 || v > best || (v != v && best == best)) { best = v; at = iy * %d + ix; }\n",
                 Wd, Wd);
            window_close(L);
            body(L, "                if (at >= 0%s) dxp[at] += dyp[oy * %d + ox];\n",
                 L->relu_mask[id] ? " && best > 0.0f   /* fused relu_grad: x is a relu output */" : "", OW);
        } else {
            body(L, "                float g = dyp[oy * %d + ox] * %s;\n", OW, scale);
            window_open(L, K, S, P, H, Wd);
            body(L, "                        dxp[iy * %d + ix] += g;\n", Wd);
            window_close(L);
        }
        body(L, "            }\n    }\n");
    }
    end_kernel(L);
}

static void lower_reduction(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    switch (n->op) {
    case OP_GAP: {
        const Shape *xs = &g->nodes[n->in[0]].shape;
        int HW = xs->d[2] * xs->d[3];
        int b[2] = { out_buf(L, id), buf_of(L, n->in[0]) };
        Dim work = dim_of(&n->shape);
        kernel(L, id, "global_avgpool", work, 2, b, (const char *const[]){ "=y", "x" });
        body(L, "    FOR_EACH(i, %s) {\n        const float *xp = x + i * %d;\n        float acc = 0.0f;\n"
                "        for (int k = 0; k < %d; k++) acc += xp[k];\n        y[i] = acc * %#.9gf;\n    }\n",
             work_str(L, work), HW, HW, 1.0 / HW);
        break;
    }
    case OP_BN_STATS: {
        const Shape *xs = &g->nodes[n->in[0]].shape;
        int C = xs->d[1], HW = xs->d[2] * xs->d[3];
        int b[2] = { out_buf(L, id), buf_of(L, n->in[0]) };
        kernel(L, id, "bn_stats", dimc(C), 2, b, (const char *const[]){ "=stats", "x" })->heavy = true;
        body(L, "    /* x is [N, %d, %d]: per channel mean, 1/sqrt(biased var + eps), biased var; two passes in double */\n", C, HW);
        body(L, "    FOR_EACH(c, %dL) {\n"
                "        double sum = 0.0, sq = 0.0, m = (double)N * %d;\n"
                "        for (long k = 0; k < N; k++) {\n"
                "            const float *xp = x + (k * %d + c) * %d;\n"
                "            for (int j = 0; j < %d; j++) sum += xp[j];\n"
                "        }\n"
                "        double mean = sum / m;\n"
                "        for (long k = 0; k < N; k++) {\n"
                "            const float *xp = x + (k * %d + c) * %d;\n"
                "            for (int j = 0; j < %d; j++) { double d = xp[j] - mean; sq += d * d; }\n"
                "        }\n"
                "        double var = sq / m;\n"
                "        stats[c] = (float)mean;\n"
                "        stats[%d + c] = (float)(1.0 / sqrt(var + %.9g));\n"
                "        stats[%d + c] = (float)var;\n    }\n",
             C, HW, C, HW, HW, C, HW, HW, C, n->f[0], 2 * C);
        break;
    }
    case OP_BN_BWD_PARAMS: {
        const Shape *xs = &g->nodes[n->in[0]].shape;
        int C = xs->d[1], HW = xs->d[2] * xs->d[3];
        int b[4] = { out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]) };
        kernel(L, id, "bn_grad_params", dimc(C), 4, b, (const char *const[]){ "=dparams", "x", "stats", "dy" })->heavy = true;
        body(L, "    /* dparams[0] = d gamma = sum(dy * xhat), dparams[1] = d beta = sum(dy), over N, H, W */\n");
        body(L, "    FOR_EACH(c, %dL) {\n"
                "        double dg = 0.0, db = 0.0;\n"
                "        float mean = stats[c], invstd = stats[%d + c];\n"
                "        for (long k = 0; k < N; k++) {\n"
                "            const float *xp = x + (k * %d + c) * %d, *dyp = dy + (k * %d + c) * %d;\n"
                "            for (int j = 0; j < %d; j++) { dg += dyp[j] * (xp[j] - mean) * invstd; db += dyp[j]; }\n"
                "        }\n"
                "        dparams[c] = (float)dg;\n        dparams[%d + c] = (float)db;\n    }\n",
             C, C, C, HW, C, HW, HW, C);
        break;
    }
    case OP_BIAS_BWD: {
        const Shape *ds = &g->nodes[n->in[0]].shape;
        int O = ds->d[1];
        int inner = 1;
        for (int k = 2; k < ds->nd; k++) inner *= ds->d[k];
        int b[2] = { out_buf(L, id), buf_of(L, n->in[0]) };
        kernel(L, id, "bias_grad", dimc(O), 2, b, (const char *const[]){ "=db", "dy" })->heavy = true;
        body(L, "    /* dy is [N, %d, %d]; db[o] = sum over n and the inner positions */\n", O, inner);
        if (inner >= 16) {
            /* 16 running sums side by side: a sum the compiler may vectorise without reordering a chain */
            body(L, "    FOR_EACH(o, %dL) {\n        float part[16];\n"
                    "        for (int l = 0; l < 16; l++) part[l] = 0.0f;\n"
                    "        for (long k = 0; k < N; k++) {\n"
                    "            const float *dyp = dy + (k * %d + o) * %d;\n"
                    "            for (int j = 0; j < %d; j += 16)\n"
                    "                for (int l = 0; l < 16; l++) part[l] += dyp[j + l];\n"
                    "            for (int j = %d; j < %d; j++) part[0] += dyp[j];\n"
                    "        }\n"
                    "        float acc = 0.0f;\n        for (int l = 0; l < 16; l++) acc += part[l];\n"
                    "        db[o] = acc;\n    }\n", O, O, inner, inner / 16 * 16, inner / 16 * 16, inner);
        } else {
            body(L, "    FOR_EACH(o, %dL) {\n        float acc = 0.0f;\n"
                    "        for (long k = 0; k < N; k++) {\n"
                    "            const float *dyp = dy + (k * %d + o) * %d;\n"
                    "            for (int j = 0; j < %d; j++) acc += dyp[j];\n"
                    "        }\n        db[o] = acc;\n    }\n", O, O, inner, inner);
        }
        break;
    }
    case OP_XENT: case OP_ACCURACY: {
        int K = g->nodes[n->in[0]].shape.d[1];
        int b[3] = { out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
        bool acc = n->op == OP_ACCURACY;
        kernel(L, id, acc ? "correct" : "softmax_cross_entropy", dimc(1), 3, b,
               (const char *const[]){ acc ? "=correct" : "=loss", "logits", "labels" });
        body(L, "    /* logits [N, %d], labels [N] (class index as float) */\n", K);
        if (acc)
            body(L, "    FOR_EACH(unused, 1L) {\n        float hits = 0.0f;\n"
                    "        for (long r = 0; r < N; r++) {\n"
                    "            const float *l = logits + r * %d;\n            int best = 0;\n"
                    "            for (int k = 1; k < %d; k++) if (l[k] > l[best]) best = k;\n"
                    "            hits += best == (int)labels[r];\n        }\n        correct[0] = hits;\n    }\n", K, K);
        else
            body(L, "    FOR_EACH(unused, 1L) {\n        double total = 0.0;\n"
                    "        for (long r = 0; r < N; r++) {\n"
                    "            const float *l = logits + r * %d;\n            float mx = l[0];\n"
                    "            for (int k = 1; k < %d; k++) mx = l[k] > mx ? l[k] : mx;\n"
                    "            float s = 0.0f;\n"
                    "            for (int k = 0; k < %d; k++) s += expf(l[k] - mx);\n"
                    "            total += (double)(logf(s) + mx - l[(int)labels[r]]);\n"
                    "        }\n        loss[0] = (float)(total / (double)N);\n    }\n", K, K, K);
        break;
    }
    case OP_XENT_BWD: {
        int K = n->shape.d[1];
        int b[4] = { out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]) };
        kernel(L, id, "softmax_cross_entropy_grad", dimn(1), 4, b,
               (const char *const[]){ "=dlogits", "logits", "labels", "dloss" });
        body(L, "    /* dlogits = (softmax(logits) - onehot(labels)) * dloss / global batch, one row per iteration */\n");
        body(L, "    FOR_EACH(r, N) {\n"
                "        const float *l = logits + r * %d;\n        float *d = dlogits + r * %d;\n"
                "        float mx = l[0];\n"
                "        for (int k = 1; k < %d; k++) mx = l[k] > mx ? l[k] : mx;\n"
                "        float s = 0.0f;\n"
                "        for (int k = 0; k < %d; k++) s += expf(l[k] - mx);\n"
                "        float scale = dloss[0] / (float)a.global_batch, inv = 1.0f / s;   /* the mean over the global batch */\n"
                "        for (int k = 0; k < %d; k++) d[k] = (expf(l[k] - mx) * inv - (k == (int)labels[r])) * scale;\n"
                "    }\n", K, K, K, K, K);
        break;
    }
    default:
        break;
    }
    end_kernel(L);
}

/* ------------------------------------------------------------------------ GEMMs */

/* [N, O, P] -> [O, N*P], once per gradient buffer. */
static int transposed_grad(Lower *L, int id, int dy_node)
{
    if (L->dyt[dy_node] >= 0) return L->dyt[dy_node];
    const Shape *ds = &L->g->nodes[dy_node].shape;
    int O = ds->d[1], P = ds->d[2] * ds->d[3];
    int t = new_buf(L, BUF_WORK, dimn((long)O * P), "dy transposed", dy_node);
    int b[2] = { t, buf_of(L, dy_node) };
    kernel(L, id, "pack_grad", dimn(O), 2, b, (const char *const[]){ "=t", "dy" })->grain = P;
    body(L, "    /* dy is [N, %d, %d]; t is [%d, N*%d]; one (o, n) row per iteration */\n", O, P, O, P);
    body(L, "    FOR_EACH(i, %s) {\n        long o = i / N, n = i %% N;\n"
            "        const float *src = dy + (n * %d + o) * %d;\n        float *dst = t + i * %d;\n"
            "        for (int p = 0; p < %d; p++) dst[p] = src[p];\n    }\n", work_str(L, dimn(O)), O, P, P, P);
    end_kernel(L);
    L->dyt[dy_node] = t;
    return t;
}

/* [N, O, P] -> [N, P, O] (channels last), once per gradient buffer. */
static int channels_last_grad(Lower *L, int id, int dy_node)
{
    if (L->dyc[dy_node] >= 0) return L->dyc[dy_node];
    const Shape *ds = &L->g->nodes[dy_node].shape;
    int O = ds->d[1], P = ds->d[2] * ds->d[3];
    int t = new_buf(L, BUF_WORK, dimn((long)P * O), "dy channels last", dy_node);
    int b[2] = { t, buf_of(L, dy_node) };
    kernel(L, id, "pack_grad_channels_last", dimn(1), 2, b, (const char *const[]){ "=t", "dy" })->grain = (long)O * P;
    body(L, "    /* dy is [N, %d, %d]; t is [N, %d, %d]: one example per iteration */\n", O, P, P, O);
    body(L, "    FOR_EACH(n, N) {\n"
            "        for (int o = 0; o < %d; o++)\n"
            "            for (int p = 0; p < %d; p++) t[(n * %d + p) * %d + o] = dy[(n * %d + o) * %d + p];\n    }\n",
         O, P, P, O, O, P);
    end_kernel(L);
    L->dyc[dy_node] = t;
    return t;
}

/* Bytes of im2col columns per example up to which the forward's are kept for the weight gradient. */
#define CG_KEEP_COLUMNS 65536

static int im2col(Lower *L, int id, int x_node, int K, int S, int Pd, int OH, int OW)
{
    const Shape *xs = &L->g->nodes[x_node].shape;
    int C = xs->d[1], H = xs->d[2], W = xs->d[3];
    long P = (long)OH * OW, CKK = (long)C * K * K;
    int col = new_buf(L, BUF_WORK, dimn(CKK * P), "im2col", id);
    int b[2] = { col, buf_of(L, x_node) };
    kernel(L, id, "im2col", dimn(CKK), 2, b, (const char *const[]){ "=col", "x" })->grain = P;
    body(L, "    /* x is [N, %d, %d, %d]; col is [%d*%d*%d, N*%d*%d], row (c, ky, kx), column (n, oy, ox);\n"
            "       one (row, n) stretch of %ld columns per iteration */\n", C, H, W, C, K, K, OH, OW, P);
    body(L, "    FOR_EACH(i, %s) {\n"
            "        long r = i / N, n = i %% N;\n"
            "        int c = (int)(r / %d), ky = (int)(r / %d) %% %d, kx = (int)(r %% %d);\n"
            "        const float *xp = x + (n * %d + c) * %d;\n"
            "        float *cp = col + i * %ld;\n"
            "        for (int oy = 0; oy < %d; oy++) {\n"
            "            int iy = oy * %d - %d + ky;\n"
            "            float *row = cp + oy * %d;\n"
            "            if (iy < 0 || iy >= %d) { for (int ox = 0; ox < %d; ox++) row[ox] = 0.0f; continue; }\n"
            "%s"
            "        }\n    }\n",
         work_str(L, dimn(CKK)), K * K, K, K, K, C, H * W, P, OH, S, Pd, OW, H, OW,
         Pd == 0 && S == 1
             /* no padding, stride 1: every row is a plain copy of OW inputs */
             ? arena_printf(L->p->arena, "            const float *xr = xp + iy * %d + kx;\n"
                                         "            for (int ox = 0; ox < %d; ox++) row[ox] = xr[ox];\n", W, OW)
             : arena_printf(L->p->arena, "            for (int ox = 0; ox < %d; ox++) {\n"
                                         "                int ix = ox * %d - %d + kx;\n"
                                         "                row[ox] = ix >= 0 && ix < %d ? xp[iy * %d + ix] : 0.0f;\n"
                                         "            }\n", OW, S, Pd, W, W));
    end_kernel(L);
    return col;
}

/* ------------------------------------------------------------ direct convolution */

/* Three ways to run a convolution, chosen per layer by cg_conv_strategy():
     CONV_DIRECT  loops over whole (n, channel) planes: for few channels and
                  wide rows (LeNet's conv1): nothing is materialised, each plane
                  stays in L1, the inner loop over a row of pixels vectorises;
     CONV_VECTOR  loops over output rows with all output channels in a vector
                  (transposed weights, and the gradient as [N, OH, OW, O] for
                  the weight gradient), a few columns at a time in registers:
                  for 8..64 outputs, no padding, kernels up to 7, short rows (LeNet's conv2);
                  the input gradient is one GEMM on the channels-last gradient;
     CONV_GEMM    im2col + one GEMM over the whole batch: wide layers (ResNet).
   MGC_CONV=direct|vector|gemm forces one everywhere (the tests run each). */
ConvStrategy cg_conv_strategy(int c, int k, int o, int out_width, int padding)
{
    const char *force = getenv("MGC_CONV");
    if (force && !strcmp(force, "gemm")) return CONV_GEMM;
    if (force && !strcmp(force, "direct")) return CONV_DIRECT;
    if (force && !strcmp(force, "vector")) return padding == 0 && k <= 7 ? CONV_VECTOR : CONV_GEMM;   /* written for these */
    /* Measured on LeNet: direct wins for conv1 (1x5x5 -> 6, 24 wide); for conv2
       (6x5x5 -> 16, 8 wide) its rows are too short, and the channel vector wins. */
    if ((long)c * k * k * o <= 4096 && out_width >= 16) return CONV_DIRECT;
    if (padding == 0 && k <= 7 && o % 8 == 0 && o <= 64 && (long)c * k * k <= 1152) return CONV_VECTOR;
    return CONV_GEMM;
}

/* Emits the loop header for output rows/columns whose input index
   o * S - P + k lies in [0, size): "int name0 = ..., name1 = ...;". */
static void valid_range(Lower *L, const char *name, const char *kvar, int S, int P, int size, int osize)
{
    body(L, "%*sint %s0 = %s < %d ? (%d - %s + %d) / %d : 0, %s1 = (%d + %d - %s) / %d + 1;\n"
            "%*sif (%s1 > %d) %s1 = %d;\n",
         12, "", name, kvar, P, P, kvar, S - 1, S, name, size - 1, P, kvar, S, 12, "", name, osize, name, osize);
}

static void lower_conv_direct(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    int S = n->i[0], P = n->i[1];
    switch (n->op) {
    case OP_CONV2D: {
        const Shape *xs = &g->nodes[n->in[0]].shape, *ws = &g->nodes[n->in[1]].shape, *ys = &n->shape;
        int C = xs->d[1], H = xs->d[2], W = xs->d[3], O = ws->d[0], K = ws->d[2], OH = ys->d[2], OW = ys->d[3];
        bool bias = n->nin == 3;
        int b[4] = { out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), bias ? buf_of(L, n->in[2]) : -1 };
        if (P == 0 && K <= 7) {
            /* No padding: a row of outputs gathers a whole row of taps (kx) per input row read. */
            kernel(L, id, "conv2d_rows", dimn(O), bias ? 4 : 3, b, (const char *const[]){ "=y", "x", "w", "bias" })->grain =
                (long)OH * OW * C * K * K;
            body(L, "    /* x [N, %d, %d, %d], w [%d, %d, %d, %d], y [N, %d, %d, %d]; stride %d, no padding;\n"
                    "       one (n, o) output plane per iteration, a row of outputs at a time */\n",
                 C, H, W, O, C, K, K, O, OH, OW, S);
            body(L, "    FOR_EACH(i, %s) {\n"
                    "        long n = i / %d, o = i %% %d;\n"
                    "        const float b0 = %s;\n"
                    "        for (int oy = 0; oy < %d; oy++) {\n"
                    "            float acc[%d];\n"
                    "            for (int ox = 0; ox < %d; ox++) acc[ox] = b0;\n"
                    "            for (int c = 0; c < %d; c++)\n"
                    "                for (int ky = 0; ky < %d; ky++) {\n"
                    "                    const float *xr = x + ((n * %d + c) * %d + oy * %d + ky) * %d;\n"
                    "                    const float *wr = w + ((o * %d + c) * %d + ky) * %d;\n",
                 work_str(L, dimn(O)), O, O, bias ? "bias[o]" : "0.0f", OH, OW, OW, C, K, C, H, S, W, C, K, K);
            for (int j = 0; j < K; j++) body(L, "                    const float w%d = wr[%d];\n", j, j);
            body(L, "                    for (int ox = 0; ox < %d; ox++)\n                        acc[ox] += ", OW);
            for (int j = 0; j < K; j++) body(L, "%sw%d * xr[ox * %d + %d]", j ? " + " : "", j, S, j);
            body(L, ";\n                }\n"
                    "            float *yr = y + (i * %d + oy) * %d;\n"
                    "            for (int ox = 0; ox < %d; ox++) yr[ox] = %s;\n"
                    "        }\n    }\n", OH, OW, OW,
                 L->relu_out[id] ? "acc[ox] > 0.0f ? acc[ox] : 0.0f   /* fused relu */" : "acc[ox]");
            break;
        }
        kernel(L, id, "conv2d_direct", dimn(O), bias ? 4 : 3, b, (const char *const[]){ "=y", "x", "w", "bias" })->grain = OH * OW * C * K * K;
        body(L, "    /* x [N, %d, %d, %d], w [%d, %d, %d, %d], y [N, %d, %d, %d]; stride %d, padding %d;\n"
                "       one (n, o) output plane per iteration, accumulated in place */\n",
             C, H, W, O, C, K, K, O, OH, OW, S, P);
        body(L, "    FOR_EACH(i, %s) {\n"
                "        long n = i / %d, o = i %% %d;\n"
                "        float *yp = y + i * %d;\n"
                "        const float b0 = %s;\n"
                "        for (int k = 0; k < %d; k++) yp[k] = b0;\n"
                "        for (int c = 0; c < %d; c++) {\n"
                "            const float *xp = x + (n * %d + c) * %d, *wp = w + (o * %d + c) * %d;\n"
                "            for (int ky = 0; ky < %d; ky++)\n"
                "            for (int kx = 0; kx < %d; kx++) {\n"
                "            const float wv = wp[ky * %d + kx];\n",
             work_str(L, dimn(O)), O, O, OH * OW, bias ? "bias[o]" : "0.0f", OH * OW, C, C, H * W, C, K * K, K, K, K);
        valid_range(L, "oy", "ky", S, P, H, OH);
        valid_range(L, "ox", "kx", S, P, W, OW);
        body(L, "            for (int oy = oy0; oy < oy1; oy++) {\n"
                "                const float *xr = xp + (oy * %d - %d + ky) * %d - %d + kx;\n"
                "                float *yr = yp + oy * %d;\n"
                "                for (int ox = ox0; ox < ox1; ox++) yr[ox] += wv * xr[ox * %d];\n"
                "            }\n            }\n        }\n", S, P, W, P, OW, S);
        if (L->relu_out[id])
            body(L, "        for (int k = 0; k < %d; k++) yp[k] = yp[k] > 0.0f ? yp[k] : 0.0f;   /* fused relu */\n", OH * OW);
        body(L, "    }\n");
        break;
    }
    case OP_CONV2D_BWD_X: {
        const Shape *ws = &g->nodes[n->in[1]].shape, *ds = &g->nodes[n->in[0]].shape, *xs = &n->shape;
        int C = xs->d[1], H = xs->d[2], W = xs->d[3], O = ws->d[0], K = ws->d[2], OH = ds->d[2], OW = ds->d[3];
        int b[3] = { out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
        kernel(L, id, "conv2d_grad_x_direct", dimn(C), 3, b, (const char *const[]){ "=dx", "dy", "w" })->grain = OH * OW * O * K * K;
        body(L, "    /* dy [N, %d, %d, %d], w [%d, %d, %d, %d], dx [N, %d, %d, %d]; stride %d, padding %d;\n"
                "       one (n, c) plane of dx per iteration: it scatters from every output it fed */\n",
             O, OH, OW, O, C, K, K, C, H, W, S, P);
        body(L, "    FOR_EACH(i, %s) {\n"
                "        long n = i / %d, c = i %% %d;\n"
                "        float *dxp = dx + i * %d;\n"
                "        for (int k = 0; k < %d; k++) dxp[k] = 0.0f;\n"
                "        for (int o = 0; o < %d; o++) {\n"
                "            const float *dyp = dy + (n * %d + o) * %d, *wp = w + (o * %d + c) * %d;\n"
                "            for (int ky = 0; ky < %d; ky++)\n"
                "            for (int kx = 0; kx < %d; kx++) {\n"
                "            const float wv = wp[ky * %d + kx];\n",
             work_str(L, dimn(C)), C, C, H * W, H * W, O, O, OH * OW, C, K * K, K, K, K);
        valid_range(L, "oy", "ky", S, P, H, OH);
        valid_range(L, "ox", "kx", S, P, W, OW);
        body(L, "            for (int oy = oy0; oy < oy1; oy++) {\n"
                "                float *xr = dxp + (oy * %d - %d + ky) * %d - %d + kx;\n"
                "                const float *yr = dyp + oy * %d;\n"
                "                for (int ox = ox0; ox < ox1; ox++) xr[ox * %d] += wv * yr[ox];\n"
                "            }\n            }\n        }\n    }\n", S, P, W, P, OW, S);
        break;
    }
    case OP_CONV2D_BWD_W: {
        const Shape *ws = &n->shape, *ds = &g->nodes[n->in[0]].shape, *xs = &g->nodes[n->in[1]].shape;
        int C = xs->d[1], H = xs->d[2], W = xs->d[3], O = ws->d[0], K = ws->d[2], OH = ds->d[2], OW = ds->d[3];
        int b[3] = { out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
        if (P == 0 && K <= 7) {
            /* No padding: every tap of a row of taps reads the same output columns, so one
               pass over dy serves all K taps (kx), each with a row of partial sums. */
            kernel(L, id, "conv2d_grad_w_rows", dimc((long)O * C * K), 3, b, (const char *const[]){ "=dw", "dy", "x" })->heavy = true;
            body(L, "    /* dy [N, %d, %d, %d], x [N, %d, %d, %d], dw [%d, %d, %d, %d]; stride %d, no padding;\n"
                    "       one row of taps (o, c, ky) per iteration, partial sums per kx and output column */\n",
                 O, OH, OW, C, H, W, O, C, K, K, S);
            body(L, "    FOR_EACH(i, %dL) {\n"
                    "        long o = i / %d, c = (i / %d) %% %d; int ky = (int)(i %% %d);\n", O * C * K, C * K, K, C, K);
            for (int j = 0; j < K; j++) body(L, "        float k%d[%d];\n", j, OW);
            body(L, "        for (int ox = 0; ox < %d; ox++) {\n", OW);
            for (int j = 0; j < K; j++) body(L, "            k%d[ox] = 0.0f;\n", j);
            body(L, "        }\n"
                    "        for (long n = 0; n < N; n++)\n"
                    "            for (int oy = 0; oy < %d; oy++) {\n"
                    "                const float *yr = dy + ((n * %d + o) * %d + oy) * %d;\n"
                    "                const float *xr = x + ((n * %d + c) * %d + oy * %d + ky) * %d;\n"
                    "                for (int ox = 0; ox < %d; ox++) {\n"
                    "                    const float g = yr[ox];\n", OH, O, OH, OW, C, H, S, W, OW);
            for (int j = 0; j < K; j++) body(L, "                    k%d[ox] += g * xr[ox * %d + %d];\n", j, S, j);
            body(L, "                }\n            }\n");
            for (int j = 0; j < K; j++)
                body(L, "        { float acc = 0.0f; for (int ox = 0; ox < %d; ox++) acc += k%d[ox]; dw[i * %d + %d] = acc; }\n", OW, j, K, j);
            body(L, "    }\n");
            break;
        }
        kernel(L, id, "conv2d_grad_w_direct", dimc((long)O * C), 3, b, (const char *const[]){ "=dw", "dy", "x" })->heavy = true;
        body(L, "    /* dy [N, %d, %d, %d], x [N, %d, %d, %d], dw [%d, %d, %d, %d]; stride %d, padding %d;\n"
                "       one (o, c) pair per iteration; partial sums per (ky, kx, output column) over the batch */\n",
             O, OH, OW, C, H, W, O, C, K, K, S, P);
        body(L, "    FOR_EACH(i, %dL) {\n"
                "        long o = i / %d, c = i %% %d;\n"
                "        float part[%d][%d];\n"
                "        for (int k = 0; k < %d; k++) for (int j = 0; j < %d; j++) part[k][j] = 0.0f;\n"
                "        for (long n = 0; n < N; n++) {\n"
                "            const float *dyp = dy + (n * %d + o) * %d, *xp = x + (n * %d + c) * %d;\n"
                "            for (int ky = 0; ky < %d; ky++)\n"
                "            for (int kx = 0; kx < %d; kx++) {\n"
                "            float *pp = part[ky * %d + kx];\n",
             O * C, C, C, K * K, OW, K * K, OW, O, OH * OW, C, H * W, K, K, K);
        valid_range(L, "oy", "ky", S, P, H, OH);
        valid_range(L, "ox", "kx", S, P, W, OW);
        body(L, "            for (int oy = oy0; oy < oy1; oy++) {\n"
                "                const float *xr = xp + (oy * %d - %d + ky) * %d - %d + kx;\n"
                "                const float *yr = dyp + oy * %d;\n"
                "                for (int ox = ox0; ox < ox1; ox++) pp[ox] += yr[ox] * xr[ox * %d];\n"
                "            }\n            }\n        }\n"
                "        for (int k = 0; k < %d; k++) {\n"
                "            float acc = 0.0f;\n"
                "            for (int j = 0; j < %d; j++) acc += part[k][j];\n"
                "            dw[i * %d + k] = acc;\n"
                "        }\n    }\n", S, P, W, P, OW, S, K * K, OW, K * K);
        break;
    }
    default:
        break;
    }
    end_kernel(L);
}

/* ------------------------------------------------- channel-vectorised convolution */

/* w [O, C, K, K] -> wt [C*K*K, O]: the taps' weights for all outputs side by side. */
static int transposed_weights(Lower *L, int id, int w_node)
{
    const Shape *ws = &L->g->nodes[w_node].shape;
    int O = ws->d[0];
    long CKK = (long)ws->d[1] * ws->d[2] * ws->d[3];
    int wt = new_buf(L, BUF_WORK, dimc(CKK * O), "weights transposed", w_node);
    int b[2] = { wt, buf_of(L, w_node) };
    kernel(L, id, "transpose_weights", dimc(CKK), 2, b, (const char *const[]){ "=wt", "w" })->grain = O;
    body(L, "    /* w is [%d, %ld]; wt is [%ld, %d] */\n", O, CKK, CKK, O);
    body(L, "    FOR_EACH(r, %ldL) {\n        for (int o = 0; o < %d; o++) wt[r * %d + o] = w[o * %ldL + r];\n    }\n",
         CKK, O, O, CKK);
    end_kernel(L);
    return wt;
}

/* Columns per block in the channel-vectorised kernels: B output columns are
   computed together, each with its own accumulators, so the compiler keeps
   2*B vector registers of sums in flight. */
static int column_block(int ow) { return ow % 4 == 0 ? 4 : ow % 2 == 0 ? 2 : 1; }

static void lower_conv_vector(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    int S = n->i[0];   /* padding is 0: cg_conv_strategy() picks this only then */
    if (n->op == OP_CONV2D) {
        const Shape *xs = &g->nodes[n->in[0]].shape, *ws = &g->nodes[n->in[1]].shape, *ys = &n->shape;
        int C = xs->d[1], H = xs->d[2], W = xs->d[3], O = ws->d[0], K = ws->d[2], OH = ys->d[2], OW = ys->d[3];
        int B = column_block(OW);
        bool bias = n->nin == 3;
        int wt = transposed_weights(L, id, n->in[1]);
        int b[4] = { out_buf(L, id), buf_of(L, n->in[0]), wt, bias ? buf_of(L, n->in[2]) : -1 };
        kernel(L, id, "conv2d_vector", dimn(OH), bias ? 4 : 3, b, (const char *const[]){ "=y", "x", "wt", "bias" })->grain =
            (long)OW * O * C * K * K;
        body(L, "    /* x [N, %d, %d, %d], wt [%d*%d*%d, %d], y [N, %d, %d, %d]; stride %d, no padding;\n"
                "       one output row (n, oy) per iteration, all %d output channels at once, %d columns per block */\n",
             C, H, W, C, K, K, O, O, OH, OW, S, O, B);
        body(L, "    FOR_EACH(i, %s) {\n"
                "        long n = i / %d; int oy = (int)(i %% %d);\n"
                "        for (int ox0 = 0; ox0 < %d; ox0 += %d) {\n",
             work_str(L, dimn(OH)), OH, OH, OW, B);
        for (int j = 0; j < B; j++) body(L, "            float a%d[%d];\n", j, O);
        body(L, "            for (int o = 0; o < %d; o++) {\n", O);
        for (int j = 0; j < B; j++) body(L, "                a%d[o] = %s;\n", j, bias ? "bias[o]" : "0.0f");
        body(L, "            }\n"
                "            for (int c = 0; c < %d; c++)\n"
                "                for (int ky = 0; ky < %d; ky++) {\n"
                "                    const float *xr = x + ((n * %d + c) * %d + oy * %d + ky) * %d + ox0 * %d;\n"
                "                    const float *wr = wt + (c * %d + ky) * %d * %d;\n"
                "                    for (int kx = 0; kx < %d; kx++) {\n",
             C, K, C, H, S, W, S, K, K, O, K);
        for (int j = 0; j < B; j++) body(L, "                        const float x%d = xr[kx + %d];\n", j, j * S);
        body(L, "                        for (int o = 0; o < %d; o++) {\n"
                "                            const float w = wr[kx * %d + o];\n", O, O);
        for (int j = 0; j < B; j++) body(L, "                            a%d[o] += x%d * w;\n", j, j);
        body(L, "                        }\n                    }\n                }\n"
                "            for (int o = 0; o < %d; o++) {\n"
                "                float *yr = y + ((n * %d + o) * %d + oy) * %d + ox0;\n", O, O, OH, OW);
        for (int j = 0; j < B; j++)
            body(L, "                yr[%d] = %s;\n", j,
                 L->relu_out[id] ? arena_printf(L->p->arena, "a%d[o] > 0.0f ? a%d[o] : 0.0f   /* fused relu */", j, j)
                                 : arena_printf(L->p->arena, "a%d[o]", j));
        body(L, "            }\n        }\n    }\n");
        end_kernel(L);
        return;
    }
    /* CONV2D_BWD_W: dw[o, r] = sum over n, oy, ox of dy[n, o, oy, ox] * x[n, c, oy*S + ky, ox*S + kx], r = (c, ky, kx) */
    const Shape *ws = &n->shape, *ds = &g->nodes[n->in[0]].shape, *xs = &g->nodes[n->in[1]].shape;
    int C = xs->d[1], H = xs->d[2], W = xs->d[3], O = ws->d[0], K = ws->d[2], OH = ds->d[2], OW = ds->d[3];
    long CKK = (long)C * K * K;
    int dyt = channels_last_grad(L, id, n->in[0]);
    int b[3] = { out_buf(L, id), dyt, buf_of(L, n->in[1]) };
    kernel(L, id, "conv2d_grad_w_vector", dimc((long)C * K), 3, b, (const char *const[]){ "=dw", "t", "x" })->heavy = true;
    body(L, "    /* t [N, %d, %d, %d] (dy, channels last), x [N, %d, %d, %d], dw [%d, %ld]; stride %d, no padding;\n"
            "       one row of taps (c, ky) per iteration: each gradient row of t is read once for all %d kx,\n"
            "       which keep their own %d sums */\n",
         OH, OW, O, C, H, W, O, CKK, S, K, O);
    body(L, "    FOR_EACH(row, %dL) {\n"
            "        int c = (int)(row / %d), ky = (int)(row %% %d);\n", C * K, K, K);
    for (int j = 0; j < K; j++) body(L, "        float k%d[%d];\n", j, O);
    body(L, "        for (int o = 0; o < %d; o++) {\n", O);
    for (int j = 0; j < K; j++) body(L, "            k%d[o] = 0.0f;\n", j);
    body(L, "        }\n"
            "        for (long n = 0; n < N; n++)\n"
            "            for (int oy = 0; oy < %d; oy++) {\n"
            "                const float *xr = x + ((n * %d + c) * %d + oy * %d + ky) * %d;\n"
            "                const float *tr = t + (n * %d + oy) * %d * %d;\n"
            "                for (int ox = 0; ox < %d; ox++) {\n"
            "                    const float *tv = tr + ox * %d, *xv = xr + ox * %d;\n"
            "                    for (int o = 0; o < %d; o++) {\n"
            "                        const float g = tv[o];\n",
         OH, C, H, S, W, OH, OW, O, OW, O, S, O);
    for (int j = 0; j < K; j++) body(L, "                        k%d[o] += xv[%d] * g;\n", j, j);
    body(L, "                    }\n                }\n            }\n"
            "        for (int o = 0; o < %d; o++) {\n"
            "            float *dr = dw + o * %ldL + row * %d;\n", O, CKK, K);
    for (int j = 0; j < K; j++) body(L, "            dr[%d] = k%d[o];\n", j, j);
    body(L, "        }\n    }\n");
    end_kernel(L);
}

static void lower_gemm(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    ConvStrategy how = CONV_GEMM;
    if (n->op == OP_CONV2D || n->op == OP_CONV2D_BWD_X || n->op == OP_CONV2D_BWD_W) {
        const Shape *ws = &g->nodes[n->op == OP_CONV2D_BWD_W ? id : n->in[1]].shape;
        const Shape *ys = n->op == OP_CONV2D ? &n->shape : &g->nodes[n->in[0]].shape;
        how = cg_conv_strategy(ws->d[1], ws->d[2], ws->d[0], ys->d[3], n->i[1]);
        if (how == CONV_DIRECT) {
            lower_conv_direct(L, id);
            return;
        }
        if (how == CONV_VECTOR && n->op != OP_CONV2D_BWD_X) {   /* its input gradient: below */
            lower_conv_vector(L, id);
            return;
        }
    }
    switch (n->op) {
    case OP_CONV2D: {
        const Shape *ws = &g->nodes[n->in[1]].shape, *ys = &n->shape;
        int O = ws->d[0], K = ws->d[2], OH = ys->d[2], OW = ys->d[3];
        long P = (long)OH * OW, CKK = (long)ws->d[1] * K * K;
        int col = im2col(L, id, n->in[0], K, n->i[0], n->i[1], OH, OW);
        L->col[id] = col;
        int t = new_buf(L, BUF_WORK, dimn(O * P), "conv out transposed", id);
        gemm(L, id, false, false, dimc(O), dimn(P), dimc(CKK), buf_of(L, n->in[1]), dimc(CKK), col, dimn(P), 0.0f, t, dimn(P));
        int y = out_buf(L, id);
        bool bias = n->nin == 3;
        int b[3] = { y, t, bias ? buf_of(L, n->in[2]) : -1 };
        kernel(L, id, "conv2d_unpack", dimn(O), bias ? 3 : 2, b, (const char *const[]){ "=y", "t", "bias" })->grain = P;
        body(L, "    /* t is [%d, N*%ld]; y is [N, %d, %ld]; one (n, o) plane per iteration */\n", O, P, O, P);
        body(L, "    FOR_EACH(i, %s) {\n        long n = i / %d, o = i %% %d;\n"
                "        const float *src = t + (o * N + n) * %ld;\n        float *dst = y + i * %ld;\n"
                "        const float b = %s;\n"
                "        for (int p = 0; p < %ld; p++) dst[p] = %s;\n    }\n",
             work_str(L, dimn(O)), O, O, P, P, bias ? "bias[o]" : "0.0f", P,
             L->relu_out[id] ? "src[p] + b > 0.0f ? src[p] + b : 0.0f   /* fused relu */" : "src[p] + b");
        end_kernel(L);
        break;
    }
    case OP_CONV2D_BWD_W: {
        int fwd = n->grad_of;
        const Shape *ws = &n->shape, *ds = &g->nodes[n->in[0]].shape;
        int O = ws->d[0];
        long CKK = (long)ws->d[1] * ws->d[2] * ws->d[3], P = (long)ds->d[2] * ds->d[3];
        int t = transposed_grad(L, id, n->in[0]);
        /* The forward's columns are kept when small; big ones (ResNet) are made
           again here, so they need not live from the forward to the backward. */
        int col = L->col[fwd];
        if (col < 0 || CKK * P * (long)sizeof(float) > CG_KEEP_COLUMNS) {
            const Node *f = &g->nodes[fwd];
            col = im2col(L, id, f->in[0], ws->d[2], f->i[0], f->i[1], ds->d[2], ds->d[3]);
        }
        int dw = out_buf(L, id);
        gemm(L, id, false, true, dimc(O), dimc(CKK), dimn(P), t, dimn(P), col, dimn(P), 0.0f, dw, dimc(CKK));
        break;
    }
    case OP_CONV2D_BWD_X: {
        const Shape *ws = &g->nodes[n->in[1]].shape, *ds = &g->nodes[n->in[0]].shape, *xs = &n->shape;
        int O = ws->d[0], K = ws->d[2], S = n->i[0], Pd = n->i[1];
        int C = xs->d[1], H = xs->d[2], W = xs->d[3], OH = ds->d[2], OW = ds->d[3];
        long P = (long)OH * OW, CKK = (long)C * K * K;
        if (how == CONV_VECTOR) {
            /* With the gradient channels last (shared with the weight gradient), the columns'
               gradient comes out example by example: dcolT[N*P, CKK] = t[N*P, O] . W[O, CKK],
               and each example's block is gathered back into its planes while in cache. */
            int t = channels_last_grad(L, id, n->in[0]);
            int dcol = new_buf(L, BUF_WORK, dimn(CKK * P), "im2col gradient, example-major", id);
            gemm(L, id, false, false, dimn(P), dimc(CKK), dimc(O), t, dimc(O), buf_of(L, n->in[1]), dimc(CKK), 0.0f, dcol, dimc(CKK));
            int dx = out_buf(L, id);
            int b[2] = { dx, dcol };
            kernel(L, id, "col2im_rows", dimn(C), 2, b, (const char *const[]){ "=dx", "dcol" })->grain = (long)H * W * K * K;
            body(L, "    /* dcol is [N*%d*%d, %d*%d*%d]; dx is [N, %d, %d, %d]; stride %d, no padding;\n"
                    "       each iteration owns one (n, c) plane of dx */\n", OH, OW, C, K, K, C, H, W, S);
            body(L, "    FOR_EACH(plane, %s) {\n"
                    "        long n = plane / %d, c = plane %% %d;\n"
                    "        float *dxp = dx + plane * %d;\n"
                    "        for (int k = 0; k < %d; k++) dxp[k] = 0.0f;\n"
                    "        for (int oy = 0; oy < %d; oy++)\n"
                    "            for (int ox = 0; ox < %d; ox++) {\n"
                    "                const float *cp = dcol + ((n * %d + oy) * %d + ox) * %ldL + c * %d;\n"
                    "                float *xp = dxp + (oy * %d) * %d + ox * %d;\n"
                    "                for (int ky = 0; ky < %d; ky++)\n"
                    "                    for (int kx = 0; kx < %d; kx++) xp[ky * %d + kx] += cp[ky * %d + kx];\n"
                    "            }\n    }\n",
                 work_str(L, dimn(C)), C, C, H * W, H * W, OH, OW, OH, OW, CKK, K * K, S, W, S, K, K, W, K);
            end_kernel(L);
            break;
        }
        int t = transposed_grad(L, id, n->in[0]);
        int dcol = new_buf(L, BUF_WORK, dimn(CKK * P), "im2col gradient", id);
        gemm(L, id, true, false, dimc(CKK), dimn(P), dimc(O), buf_of(L, n->in[1]), dimc(CKK), t, dimn(P), 0.0f, dcol, dimn(P));
        int dx = out_buf(L, id);
        int b[2] = { dx, dcol };
        kernel(L, id, "col2im", dimn(C), 2, b, (const char *const[]){ "=dx", "dcol" })->grain = H * W * K * K;
        body(L, "    /* dcol is [%d*%d*%d, N*%d*%d]; dx is [N, %d, %d, %d]; each iteration owns one (n, c) plane of dx */\n",
             C, K, K, OH, OW, C, H, W);
        body(L, "    FOR_EACH(plane, %s) {\n"
                "        long n = plane / %d, c = plane %% %d;\n"
                "        float *dxp = dx + plane * %d;\n"
                "        for (int k = 0; k < %d; k++) dxp[k] = 0.0f;\n"
                "        for (int ky = 0; ky < %d; ky++)\n"
                "            for (int kx = 0; kx < %d; kx++) {\n"
                "                const float *cp = dcol + ((c * %d + ky) * %d + kx) * (N * %ld) + n * %ld;\n"
                "%s"
                "            }\n    }\n",
             work_str(L, dimn(C)), C, C, H * W, H * W, K, K, K, K, P, P,
             Pd == 0 && S == 1
                 /* no padding, stride 1: every row adds into a contiguous stretch of dx */
                 ? arena_printf(L->p->arena, "                for (int oy = 0; oy < %d; oy++) {\n"
                                             "                    float *xr = dxp + (oy + ky) * %d + kx;\n"
                                             "                    const float *cr = cp + oy * %d;\n"
                                             "                    for (int ox = 0; ox < %d; ox++) xr[ox] += cr[ox];\n"
                                             "                }\n", OH, W, OW, OW)
                 : arena_printf(L->p->arena, "                for (int oy = 0; oy < %d; oy++) {\n"
                                             "                    int iy = oy * %d - %d + ky;\n"
                                             "                    if (iy < 0 || iy >= %d) continue;\n"
                                             "                    for (int ox = 0; ox < %d; ox++) {\n"
                                             "                        int ix = ox * %d - %d + kx;\n"
                                             "                        if (ix >= 0 && ix < %d) dxp[iy * %d + ix] += cp[oy * %d + ox];\n"
                                             "                    }\n"
                                             "                }\n", OH, S, Pd, H, OW, S, Pd, W, W, OW));
        end_kernel(L);
        break;
    }
    case OP_LINEAR: {
        /* y = x . W^T (GEMM), then the epilogue: + bias, and a fused relu */
        const Shape *ws = &g->nodes[n->in[1]].shape;
        int O = ws->d[0], F = ws->d[1];
        int y = out_buf(L, id);
        bool bias = n->nin == 3, relu = L->relu_out[id];
        gemm(L, id, false, true, dimn(1), dimc(O), dimc(F), buf_of(L, n->in[0]), dimc(F), buf_of(L, n->in[1]), dimc(F), 0.0f, y, dimc(O));
        if (!bias && !relu) break;
        int b[2] = { y, bias ? buf_of(L, n->in[2]) : -1 };
        kernel(L, id, relu ? "linear_epilogue_relu" : "linear_epilogue", dimn(1), bias ? 2 : 1, b, (const char *const[]){ "=y", "bias" })->grain = O;
        body(L, "    /* y is [N, %d]; one row per iteration */\n", O);
        body(L, "    FOR_EACH(r, N) {\n        float *yr = y + r * %d;\n        for (int o = 0; o < %d; o++) {\n"
                "            float v = yr[o]%s;\n            yr[o] = %s;\n        }\n    }\n",
             O, O, bias ? " + bias[o]" : "", relu ? "v > 0.0f ? v : 0.0f   /* fused relu */" : "v");
        end_kernel(L);
        break;
    }
    case OP_LINEAR_BWD_X: {
        const Shape *ws = &g->nodes[n->in[1]].shape;
        int O = ws->d[0], F = ws->d[1];
        int dx = out_buf(L, id);
        gemm(L, id, false, false, dimn(1), dimc(F), dimc(O), buf_of(L, n->in[0]), dimc(O), buf_of(L, n->in[1]), dimc(F), 0.0f, dx, dimc(F));
        break;
    }
    case OP_LINEAR_BWD_W: {
        int O = n->shape.d[0], F = n->shape.d[1];
        int dw = out_buf(L, id);
        gemm(L, id, true, false, dimc(O), dimc(F), dimn(1), buf_of(L, n->in[0]), dimc(O), buf_of(L, n->in[1]), dimc(F), 0.0f, dw, dimc(F));
        break;
    }
    default:
        break;
    }
}

/* ---------------------------------------------------------------------- effects */

static void lower_effect(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    if (n->op == OP_SGD) {
        Dim work = dim_of(&n->shape);
        bool mom = n->nin == 3;
        int b[3] = { buf_of(L, n->in[0]), buf_of(L, n->in[1]), mom ? buf_of(L, n->in[2]) : -1 };
        Step *s = kernel(L, id, "sgd", work, mom ? 3 : 2, b, (const char *const[]){ "=param", "grad", "=velocity" });
        s->nf = 3;
        s->sgd = true;
        memcpy(s->f, n->f, sizeof(float) * 3);
        body(L, "    /* PyTorch's SGD: g += wd * p; v = momentum * v + g; p -= lr * v.  a.f = lr, momentum, weight decay */\n");
        body(L, "    const float lr = a.f[0], momentum = a.f[1], wd = a.f[2];\n    (void)momentum;\n");
        body(L, "    FOR_EACH(i, %s) {\n        float gi = grad[i] + wd * param[i];\n", work_str(L, work));
        if (mom) body(L, "        gi = velocity[i] = momentum * velocity[i] + gi;\n");
        body(L, "        param[i] -= lr * gi;\n    }\n");
        end_kernel(L);
        L->p->node_buf[id] = buf_of(L, n->in[0]);
    } else if (n->op == OP_BN_RUNNING) {
        const Node *st = &g->nodes[n->in[0]];
        int C = st->shape.d[1];
        int x = st->in[0];   /* bn_stats x; bn_finish (allreduce (bn_sum x)) */
        if (st->op == OP_BN_FINISH) x = g->nodes[g->nodes[x].in[0]].in[0];
        const Shape *xs = &g->nodes[x].shape;
        int HW = xs->d[2] * xs->d[3];
        int b[3] = { buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[0]) };
        kernel(L, id, "bn_running_update", dimc(C), 3, b, (const char *const[]){ "=running_mean", "=running_var", "stats" });
        body(L, "    /* running = (1 - momentum) * running + momentum * batch; the variance unbiased, as PyTorch */\n");
        body(L, "    const float m = %#.9gf, count = (float)(%s * %dL);\n", n->f[0], n->i[0] ? "a.global_batch" : "N", HW);
        body(L, "    FOR_EACH(c, %dL) {\n"
                "        running_mean[c] = (1.0f - m) * running_mean[c] + m * stats[c];\n"
                "        float unbiased = count > 1.0f ? stats[%d + c] * count / (count - 1.0f) : stats[%d + c];\n"
                "        running_var[c] = (1.0f - m) * running_var[c] + m * unbiased;\n    }\n", C, 2 * C, 2 * C);
        end_kernel(L);
        L->p->node_buf[id] = buf_of(L, n->in[1]);
    }
}

/* ----------------------------------------------------------------------- driver */

static void lower_view(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int base = buf_of(L, n->in[0]);
    int off = n->op == OP_SLICE ? n->i[0] : 0;
    while (L->p->bufs[base].kind == BUF_VIEW) {
        off += L->p->bufs[base].offset;
        base = L->p->bufs[base].alias;
    }
    int b = new_buf(L, BUF_VIEW, dim_of(&n->shape), ir_op_name(n->op), id);
    L->p->bufs[b].alias = base;
    L->p->bufs[b].offset = off;
    L->p->node_buf[id] = b;
}

/* Fusion: element-wise ReLU and its gradient folded into the kernel before them.
   Requires: use counts. Produces: L->fused, L->relu_out, L->relu_mask.
     conv2d -> relu            the convolution's store applies max(0, .)
     linear -> relu            the bias epilogue after the GEMM applies it
     maxpool2d_grad -> relu_grad(y = the pool's input)
                               the pool gradient is routed only where y > 0
   A producer is fused only when the ReLU is its one user; set MGC_FUSE=0 to
   turn fusion off (the tests compare both). */
static void fuse(Lower *L)
{
    const Graph *g = L->g;
    int *uses = calloc((size_t)g->n + 1, sizeof(int));
    for (int id = 0; id < g->n; id++)
        for (int k = 0; k < g->nodes[id].nin; k++) uses[g->nodes[id].in[k]]++;
    const char *env = getenv("MGC_FUSE");
    bool on = !(env && !strcmp(env, "0"));
    for (int id = 0; on && id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op == OP_RELU) {
            int x = n->in[0];
            Op op = g->nodes[x].op;
            if ((op == OP_CONV2D || op == OP_LINEAR) && uses[x] == 1) {
                L->fused[id] = x;
                L->relu_out[x] = true;
            }
        } else if (n->op == OP_RELU_BWD) {
            int y = n->in[0], d = n->in[1];
            const Node *dn = &g->nodes[d];
            if (dn->op == OP_MAXPOOL_BWD && uses[d] == 1 && dn->in[0] == y) {
                L->fused[id] = d;
                L->relu_mask[d] = true;
            }
        }
    }
    free(uses);
}

/* ------------------------------------------------------------ data parallelism */

static int new_coll(Lower *L, int src, int dst, long floats, int bucket, const char *what)
{
    Program *p = L->p;
    p->colls = arena_grow(p->arena, p->colls, sizeof(Collective) * (size_t)p->ncolls, sizeof(Collective) * (size_t)(p->ncolls + 1));
    p->colls[p->ncolls] = (Collective){ src, dst, floats, bucket, what };
    return p->ncolls++;
}

static void coll_step(Lower *L, StepKind kind, int node, int coll) { new_step(L, kind, node)->coll = coll; }

static int view_base(const Graph *g, int id)
{
    while (g->nodes[id].op == OP_SLICE || g->nodes[id].op == OP_RESHAPE) id = g->nodes[id].in[0];
    return id;
}

/* The buckets of ir_buckets: one buffer each (the last one float longer, for
   the replicas' stop votes), the gradients as views into it, and for each
   bucket the node after which it is complete: its last gradient computed and
   every reader of the replica's own values done (bn_grad_x reads the
   bn_grad_params it shares a bucket slot with), since the sum is in place. */
static void dp_prepare(Lower *L)
{
    const Graph *g = L->g;
    Program *p = L->p;
    int *last = calloc((size_t)g->n + 1, sizeof(int));
    for (int u = 0; u < g->n; u++) {
        const Node *n = &g->nodes[u];
        if (ir_op_kind(n->op) == KIND_VIEW || (n->op == OP_ALLREDUCE && n->i[0] >= 0)) continue;
        for (int k = 0; k < n->nin; k++) {
            int v = view_base(g, n->in[k]);
            if (u > last[v]) last[v] = u;
        }
    }
    for (int k = 0; k < g->nbuckets; k++) {
        const IrBucket *bk = &g->buckets[k];
        bool final = k == g->nbuckets - 1;
        char *what = arena_printf(p->arena, "bucket %d:", k);
        int b = new_buf(L, BUF_ACT, dimc(bk->floats + 2 * final), arena_printf(p->arena, "bucket %d", k), -1);
        p->bufs[b].pinned = true;
        L->ready[k] = 0;
        for (int j = 0; j < bk->count; j++) {
            int ar = g->bucket_nodes[bk->first + j], st = g->nodes[ar].in[0];
            L->in_bucket[st] = b;
            L->bucket_at[st] = g->nodes[ar].i[1];
            int r = last[st] > st ? last[st] : st;
            if (r > L->ready[k]) L->ready[k] = r;
            what = arena_printf(p->arena, "%s %s", what, g->nodes[ar].name);
        }
        L->bucket_coll[k] = new_coll(L, b, b, bk->floats + 2 * final, k, what);
        if (final) {
            p->control = new_buf(L, BUF_VIEW, dimc(2), "stop votes", -1);
            p->bufs[p->control].alias = b;
            p->bufs[p->control].offset = (int)bk->floats;
        }
    }
    free(last);
}

/* Before a node's steps: wait for the buckets whose sums it reads. */
static void dp_before(Lower *L, int id)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    if (ir_op_kind(n->op) == KIND_VIEW || n->op == OP_ALLREDUCE) return;
    for (int k = 0; k < n->nin; k++) {
        const Node *r = &g->nodes[view_base(g, n->in[k])];
        if (r->op == OP_ALLREDUCE && r->i[0] >= 0 && !L->waited[r->i[0]]) {
            L->waited[r->i[0]] = true;
            coll_step(L, STEP_WAIT, id, L->bucket_coll[r->i[0]]);
        }
    }
}

/* After a node's steps: start the buckets it completes. */
static void dp_after(Lower *L, int id)
{
    for (int k = 0; k < L->g->nbuckets; k++)
        if (L->ready[k] == id) coll_step(L, STEP_ALLREDUCE, id, L->bucket_coll[k]);
}

static void lower_allreduce(Lower *L, int id)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    if (n->i[0] >= 0) {   /* in a bucket: in place, started by dp_after */
        L->p->node_buf[id] = buf_of(L, n->in[0]);
        return;
    }
    /* on its own (--sync-bn's sums): out of place, waited at once */
    int src = buf_of(L, n->in[0]), dst = out_buf(L, id);
    const char *what = n->name ? n->name : arena_printf(L->p->arena, "%s %%%d", ir_op_name(g->nodes[n->in[0]].op), n->in[0]);
    int c = new_coll(L, src, dst, ir_numel(&n->shape, 1), -1, what);
    coll_step(L, STEP_ALLREDUCE, id, c);
    coll_step(L, STEP_WAIT, id, c);
}

/* --sync-bn's statistics: sums of this replica's part, finished over the global count. */
static void lower_bn_sync(Lower *L, int id)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    int y = out_buf(L, id);
    if (n->op == OP_BN_FINISH) {
        const Shape *xs = &g->nodes[g->nodes[g->nodes[n->in[0]].in[0]].in[0]].shape;   /* allreduce(bn_sum(x)) */
        int C = xs->d[1], HW = xs->d[2] * xs->d[3];
        int b[3] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
        kernel(L, id, "bn_finish", dimc(C), 3, b, (const char *const[]){ "=stats", "sum", "sqdev" });
        body(L, "    /* sum, sqdev: over the global batch (every replica's part added); stats as bn_stats */\n");
        body(L, "    const double m = (double)a.global_batch * %d;\n"
                "    FOR_EACH(c, %dL) {\n"
                "        double var = sqdev[c] / m;\n"
                "        stats[c] = (float)(sum[c] / m);\n"
                "        stats[%d + c] = (float)(1.0 / sqrt(var + %.9g));\n"
                "        stats[%d + c] = (float)var;\n    }\n", HW, C, C, n->f[0], 2 * C);
        end_kernel(L);
        return;
    }
    const Shape *xs = &g->nodes[n->in[0]].shape;
    int C = xs->d[1], HW = xs->d[2] * xs->d[3];
    bool sq = n->op == OP_BN_SQDEV;
    int b[3] = { y, buf_of(L, n->in[0]), sq ? buf_of(L, n->in[1]) : -1 };
    Step *s = sq ? kernel(L, id, "bn_sqdev", dimc(C), 3, b, (const char *const[]){ "=sqdev", "x", "sum" })
                 : kernel(L, id, "bn_sum", dimc(C), 2, b, (const char *const[]){ "=sum", "x" });
    s->heavy = true;
    body(L, "    /* x is [N, %d, %d], this replica's part of the global batch; in double, as bn_stats */\n", C, HW);
    if (sq) body(L, "    const double m = (double)a.global_batch * %d;\n", HW);
    body(L, "    FOR_EACH(c, %dL) {\n"
            "        double acc = 0.0%s;\n"
            "        for (long k = 0; k < N; k++) {\n"
            "            const float *xp = x + (k * %d + c) * %d;\n"
            "            for (int j = 0; j < %d; j++) %s\n"
            "        }\n"
            "        %s[c] = (float)acc;\n    }\n",
         C, sq ? ", mean = sum[c] / m" : "", C, HW, HW, sq ? "{ double d = xp[j] - mean; acc += d * d; }" : "acc += xp[j];",
         sq ? "sqdev" : "sum");
    end_kernel(L);
}

static void pin(Program *p, int b)
{
    while (b >= 0 && p->bufs[b].kind == BUF_VIEW) b = p->bufs[b].alias;
    if (b >= 0) p->bufs[b].pinned = true;
}

int cg_lower(const Graph *g, Arena *a, Program *p)
{
    memset(p, 0, sizeof *p);
    p->arena = a;
    p->graph = g;
    p->node_buf = arena_alloc(a, sizeof(int) * (size_t)g->n);
    Lower L = { .g = g, .p = p };
    L.col = arena_alloc(a, sizeof(int) * (size_t)g->n);
    L.dyt = arena_alloc(a, sizeof(int) * (size_t)g->n);
    L.dyc = arena_alloc(a, sizeof(int) * (size_t)g->n);
    L.fused = arena_alloc(a, sizeof(int) * (size_t)g->n);
    L.relu_out = arena_alloc(a, sizeof(bool) * (size_t)g->n);
    L.relu_mask = arena_alloc(a, sizeof(bool) * (size_t)g->n);
    L.in_bucket = arena_alloc(a, sizeof(int) * (size_t)g->n);
    L.bucket_at = arena_alloc(a, sizeof(int) * (size_t)g->n);
    L.bucket_coll = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    L.ready = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    L.waited = arena_alloc(a, sizeof(bool) * (size_t)(g->nbuckets + 1));
    for (int id = 0; id < g->n; id++)
        p->node_buf[id] = L.col[id] = L.dyt[id] = L.dyc[id] = L.fused[id] = L.in_bucket[id] = -1;
    p->control = -1;
    fuse(&L);
    char *text = NULL;
    size_t len = 0;
    L.src = open_memstream(&text, &len);
    if (!L.src) return -1;
    dp_prepare(&L);

    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        dp_before(&L, id);
        if (L.fused[id] >= 0) {   /* computed by the kernel of the node it was fused into */
            p->node_buf[id] = p->node_buf[L.fused[id]];
            dp_after(&L, id);
            continue;
        }
        switch (ir_op_kind(n->op)) {
        case KIND_SRC:
            if (n->op == OP_CONST) {
                lower_elementwise(&L, id);
            } else {
                BufKind k = n->op == OP_PARAM || n->op == OP_STATE ? BUF_PERSISTENT : BUF_INPUT;
                int b = p->node_buf[id] = new_buf(&L, k, dim_of(&n->shape), n->name, id);
                p->bufs[b].shape = n->shape;
                p->bufs[b].init = n->init;
                p->bufs[b].fan_in = n->fan_in;
                p->bufs[b].trainable = n->op == OP_PARAM;
            }
            break;
        case KIND_EW:
            if (n->op == OP_BN_FINISH) lower_bn_sync(&L, id);
            else lower_elementwise(&L, id);
            break;
        case KIND_KERN:
            if (n->op == OP_MAXPOOL || n->op == OP_AVGPOOL || n->op == OP_MAXPOOL_BWD || n->op == OP_AVGPOOL_BWD)
                lower_window(&L, id);
            else if (n->op == OP_BN_SUM || n->op == OP_BN_SQDEV)
                lower_bn_sync(&L, id);
            else
                lower_reduction(&L, id);
            break;
        case KIND_GEMM:
            lower_gemm(&L, id);
            break;
        case KIND_VIEW:
            lower_view(&L, id);
            break;
        case KIND_EFFECT:
            lower_effect(&L, id);
            break;
        case KIND_COMM:
            lower_allreduce(&L, id);
            break;
        }
        dp_after(&L, id);
    }
    for (int k = 0; k < g->nbuckets; k++)   /* every bucket finishes within the step */
        if (!L.waited[k]) coll_step(&L, STEP_WAIT, g->n - 1, L.bucket_coll[k]);
    fclose(L.src);
    p->source = arena_strndup(a, text, len);
    free(text);
    /* What the host reads after a run keeps its own memory (see the planner in runtime/). */
    for (int id = 0; g->grad && id < g->n_forward; id++) {
        Op op = g->nodes[id].op;
        if ((op == OP_PARAM || op == OP_INPUT) && g->grad[id] >= 0) pin(p, p->node_buf[g->grad[id]]);
    }
    int host[5] = { g->input, g->labels, g->loss, g->correct, g->logits };
    for (int k = 0; k < 5; k++)
        if (host[k] >= 0) pin(p, p->node_buf[host[k]]);
    p->input = g->input >= 0 ? p->node_buf[g->input] : -1;
    p->labels = g->labels >= 0 ? p->node_buf[g->labels] : -1;
    p->loss = g->loss >= 0 ? p->node_buf[g->loss] : -1;
    p->correct = g->correct >= 0 ? p->node_buf[g->correct] : -1;
    p->logits = g->logits >= 0 ? p->node_buf[g->logits] : -1;
    p->net_name = g->net_name;
    if (g->input >= 0) p->input_shape = g->nodes[g->input].shape;
    p->classes = g->logits >= 0 ? g->nodes[g->logits].shape.d[1] : 0;
    p->input_grad = g->grad && g->input >= 0 && g->grad[g->input] >= 0 ? p->node_buf[g->grad[g->input]] : -1;
    p->param_scalars = ir_param_count(g, &p->param_tensors);
    p->params = arena_alloc(a, sizeof(ProgParam) * (size_t)(p->param_tensors + 1));
    for (int id = 0; g->grad && id < g->n_forward; id++)
        if (g->nodes[id].op == OP_PARAM && g->grad[id] >= 0)
            p->params[p->nparams++] = (ProgParam){ p->node_buf[id], p->node_buf[g->grad[id]] };
    return 0;
}
