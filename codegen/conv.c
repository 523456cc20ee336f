/*
** Convolutions, forward and both gradients, six ways. Every strategy reads
** one geometry, ConvGeom (cg_conv_geom() below), whichever of the three ops it
** lowers:
**
**   x [N, C, H, W], w [O, C, K, K], y [N, O, OH, OW]; stride S, padding P.
**
** CONV_GEMM: im2col and one BLAS GEMM over the whole batch
**   conv2d  x -> im2col -> col[CKK, N*P]                   (P = OH*OW, CKK = C*K*K)
**           t[O, N*P] = W[O, CKK] . col                    (GEMM)
**           y[N,O,P] = t[o, n*P + p] + b[o]                (unpack kernel)
**   grad    dyt[O, N*P] = dy permuted                      (pack kernel, once per dy)
**           dW[O, CKK] = dyt . col^T                       (GEMM; col kept from forward)
**           dcol[CKK, N*P] = W^T . dyt ; dx = col2im(dcol) (GEMM + gather kernel)
** CONV_DENSE: small maps (fewer input positions than taps) as a dense layer
**   over the whole map: only the multiply-adds that touch data, no im2col
**           wd[O*P, C*HW] = w where a tap joins (c, in) to (o, out), else 0
**                                                   (gather kernel, each step)
**   conv2d  y[N, O*P] = x[N, C*HW] . wd^T              (GEMM, then bias/relu)
**   grad    dx[N, C*HW] = dy . wd                      (GEMM)
**           dwd[O*P, C*HW] = dy^T . x ; dw = the taps of dwd summed   (GEMM + kernel)
** CONV_DIRECT: loops over whole planes, nothing materialised;
** CONV_VECTOR: all output channels in a vector (see cg_conv_strategy()).
** CONV_CHUNKED: CONV_GEMM a few examples at a time, C target only (the kernel
**   calls CBLAS on its own thread): the chunk's columns stay in cache
**   conv2d  per chunk: im2col -> col; t = W . col; y = t + b (one kernel)
**   grad    per chunk: t = dy's planes; dcol = W^T . t; col2im into dx
**           dW: 8 groups of examples, each dWg += t . col^T chunk after
**           chunk, then dW = their sum in group order (a second kernel)
**   Nothing whole-batch is materialised: no columns kept from the forward.
**   With fusion, a forward followed by BatchNorm also sums each chunk's
**   statistics while its output is in cache (cg_lower_bn_stats_chunks).
** CONV_WINOGRAD: 3x3, stride 1, padding 1 as Winograd's F(2x2, 3x3), chunk by
**   chunk like CONV_CHUNKED, C target only (codegen/winograd.c): 16 GEMMs with
**   K = C over the chunk's 2x2 tiles, 2.25x fewer multiply-adds than im2col
**   on even maps; the weight gradient stays chunked where Winograd's would do
**   more than half of im2col's (cg_choose_convs()).
**
** The gradients overwrite dx and dw (they do not accumulate). The direct and
** vector weight gradients sum over the batch: they are reductions (the
** prelude's FOR_EACH_BLOCK), a CUDA block per (o, c) pair or row of taps, its
** threads over the images (and rows); on the C target the same loops as a
** thread's. Their CUDA reads are not coalesced (a thread walks its own rows)
** and each result is one BLOCK_SUM; CONV_GEMM is the way on a GPU.
*/
#include "lower_internal.h"
#include <limits.h>
#include <string.h>

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

/* Three ways to run a convolution, chosen per layer by cg_conv_strategy():
     CONV_DIRECT  loops over whole (n, channel) planes: for few channels and
                  wide rows (LeNet's conv1): nothing is materialised, each plane
                  stays in L1, the inner loop over a row of pixels vectorises;
     CONV_VECTOR  loops over output rows with all output channels in a vector
                  (transposed weights, and the gradient as [N, OH, OW, O] for
                  the weight gradient), a few columns at a time in registers:
                  for 8..64 outputs, no padding, kernels up to 7, short rows (LeNet's conv2);
                  the input gradient is one GEMM on the channels-last gradient;
     CONV_GEMM    im2col + one GEMM over the whole batch: wide layers (ResNet),
                  and on GPUs every layer but the dense form's;
     CONV_CHUNKED CONV_GEMM a few examples at a time, in cache: where CONV_GEMM
                  would be chosen, when the program runs on CPUs only (opt->cpu_only);
                  ResNet-18's step: 292 -> 227 ms, im2col and col2im no longer
                  stream 29 MB per layer through memory;
     CONV_WINOGRAD 3x3 kernels with stride 1 and padding 1 and at least 16
                  channels in and out, where CONV_CHUNKED would be chosen
                  (ResNet-18's 7x7 and 4x4 maps): Winograd's F(2x2, 3x3) a chunk
                  at a time; its transforms' extra additions pay only with
                  enough channels (K = C in its GEMMs);
     CONV_DENSE   a dense layer over the whole map, when the input map has
                  fewer positions than the kernel has taps (ResNet-18's 2x2 and
                  1x1 maps with 3x3 kernels): a 3x3 convolution with padding 1
                  on a 1x1 map touches data with its centre tap only, and im2col
                  would multiply 8 of 9 columns of zero padding; dense does
                  H*W*OH*OW*C*O multiply-adds, exactly those that touch data
                  when every output sees every input (a 2x2 map), and never
                  more than im2col's K*K*OH*OW*C*O.
   opt->conv forces one everywhere (the driver takes it from
   MGC_CONV=direct|vector|gemm|dense|chunked|winograd; the tests run each). */
/* The dense weight matrix's floats at most (64 MB): beyond it, im2col. */
#define CG_DENSE_MAX (16L << 20)

ConvStrategy cg_conv_strategy(const CgOptions *opt, int c, int k, int o, int out_width, int stride, int padding,
                              int in_pixels, int out_pixels)
{
    bool dense_fits = (long)c * in_pixels * o * out_pixels <= CG_DENSE_MAX;
    /* chunked: every count in its kernels an int (else CONV_GEMM, whose im2col
       buffer lowering refuses with the layer's place) */
    bool chunked = opt && opt->cpu_only && (double)c * k * k * out_pixels <= INT_MAX;
    bool winograd = cg_winograd_applies(k, stride, padding);
    if (opt && opt->conv >= 0) {
        switch ((ConvStrategy)opt->conv) {
        case CONV_GEMM: return CONV_GEMM;
        case CONV_DIRECT: return CONV_DIRECT;
        case CONV_VECTOR: return padding == 0 && k <= 7 ? CONV_VECTOR : CONV_GEMM;   /* written for these */
        case CONV_DENSE: return dense_fits ? CONV_DENSE : CONV_GEMM;
        case CONV_CHUNKED: return chunked ? CONV_CHUNKED : CONV_GEMM;
        case CONV_WINOGRAD: return chunked && winograd ? CONV_WINOGRAD : chunked ? CONV_CHUNKED : CONV_GEMM;
        }
    }
    if (in_pixels < k * k && dense_fits) return CONV_DENSE;   /* fewer multiply-adds than im2col's, and no im2col */
    /* GPUs: im2col + cuBLAS. The direct and vector forms below are shaped for a CPU's
       vectors and caches (a thread per plane or row on a GPU); the cost model
       (codegen/cost.c) put LeNet's step on an H200 at 1.10 ms with them, 0.51 with GEMMs. */
    if (!(opt && opt->cpu_only)) return CONV_GEMM;
    /* Measured on LeNet: direct wins for conv1 (1x5x5 -> 6, 24 wide); for conv2
       (6x5x5 -> 16, 8 wide) its rows are too short, and the channel vector wins. */
    /* 1x1 layers are GEMMs as they stand: MobileNetV2's narrow ones (16..144 channels at
       28x28) chunked rather than direct, 82-86 -> 108-111 examples/s on two threads */
    if (k > 1 && (long)c * k * k * o <= 4096 && out_width >= 16) return CONV_DIRECT;
    if (padding == 0 && k <= 7 && o % 8 == 0 && o <= 64 && (long)c * k * k <= 1152) return CONV_VECTOR;
    /* 3x3, stride 1, padding 1 (ResNet-18's 7x7 and 4x4 maps): 2.25x fewer multiply-adds
       than im2col on even maps; few channels make its GEMMs too short (K = C) */
    if (chunked && winograd && c >= 16 && o >= 16) return CONV_WINOGRAD;
    return chunked ? CONV_CHUNKED : CONV_GEMM;
}

const char *cg_conv_act(Lower *L, int id, const char *v)
{
    return L->dec->node[id].act >= 0 ? cg_fused_act(L, id, v) : v;
}

const char *cg_conv_store(Lower *L, int id, const char *ptr, const char *idx, const char *val)
{
    const CgNode *d = &L->dec->node[id];
    Arena *a = L->p->arena;
    if (d->act_out < 0) return arena_printf(a, "%s[%s] = %s;", ptr, idx, cg_conv_act(L, id, val));
    const char *at = strcmp(ptr, "y") ? arena_printf(a, "%s - y + %s", ptr, idx) : idx;
    const char *keep = strcmp(val, arena_printf(a, "%s[%s]", ptr, idx)) ? arena_printf(a, " %s[%s] = v_;", ptr, idx) : "";
    return arena_printf(a, "{ const float v_ = %s;%s ya[%s] = %s; }", val, keep, at, cg_fused_act(L, id, "v_"));
}

Step *cg_conv_kernel(Lower *L, int id, const char *what, Dim work, int nargs, const int *b, const char *const *names)
{
    CgArgs a = { 0 };
    for (int k = 0; k < nargs; k++) cg_arg(L, &a, b[k], "%s", names[k]);
    if (L->dec->node[id].act_out >= 0) cg_arg(L, &a, cg_out_buf(L, L->dec->node[id].act_out), "=ya");
    return cg_kernel_args(L, id, what, work, &a);
}

/* ------------------------------------------------------- packing, shared by the strategies */

/* GPUs under --precision bf16: whether node u's output is stored in bf16 by the kernel that
   makes it, because every reader rounds it to bf16 anyway or reads only its sign:
   - a BatchNorm's input gradient that only convolutions' gradients in the GEMM form read,
     as the output gradient they pack (transposed_grad; the zero gradient of a bias before
     the BatchNorm reads nothing);
   - a ReLU's output that only convolutions in the GEMM form read, through im2col (the
     forward's, and the weight gradient's when it makes the columns again), and the ReLU's
     gradient, for its sign (rounding keeps a sign; only a positive value under 2^-134,
     half bf16's smallest subnormal, would become zero: after a BatchNorm, never seen).
   The same numbers, half the bytes written and read. u's buffer may hold its fused ReLU's
   output (applied in place: a BatchNorm's, an add's): then those are the readers. Only
   where a kernel stores u (a GEMM's output, such as a linear layer's or the dense
   convolution's before their epilogues, stays fp32). */
bool cg_stores_bf16(const Lower *L, int u)
{
    const Graph *g = L->g;
    const CgNode *d = &L->dec->node[u];
    Op pop = g->nodes[u].op;
    if (L->dec->cpu_only || (pop != OP_BN_BWD_X && pop != OP_BN_APPLY && pop != OP_ADD && pop != OP_RELU)) return false;
    int t = d->act >= 0 && d->act_out < 0 && d->act_node >= 0 ? d->act_node : u;   /* the tensor the buffer holds */
    Op uop = g->nodes[t].op;
    if (uop != OP_BN_BWD_X && uop != OP_RELU) return false;
    int readers = 0;
    for (int c = t + 1; c < g->n; c++)
        for (int k = 0; k < g->nodes[c].nin; k++) {
            if (g->nodes[c].in[k] != t) continue;
            Op op = g->nodes[c].op;
            bool packs = L->dec->node[c].conv == CONV_GEMM && cg_packs_bf16(L, c);
            bool rounds = uop == OP_BN_BWD_X
                              ? op == OP_BIAS_BWD   /* before a BatchNorm: exactly zero, dy unread (cg_lower_bias_grad) */
                                    || ((op == OP_CONV2D_BWD_X || op == OP_CONV2D_BWD_W) && k == 0 && packs)
                              : (op == OP_CONV2D && k == 0 && packs) || (op == OP_CONV2D_BWD_W && k == 1 && packs) ||
                                    (op == OP_RELU_BWD && k == 0);
            if (!rounds) return false;
            readers++;
        }
    return readers > 0;
}

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

/* [N, O, P] -> [N, P, O] (channels last), once per buffer: a gradient (the vector
   weight gradient's) or an input (the pooled weight gradient's). */
static int channels_last(Lower *L, int id, int dy_node)
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
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        long r = i / N, n = i %% N;\n"
               "        int c = (int)(r / %d), ky = (int)(r / %d) %% %d, kx = (int)(r %% %d);\n"
               "        const float *xp = x + (n * %d + c) * %d;\n"
               "        float *cp = col + i * %ld;\n"
               "        for (int oy = 0; oy < %d; oy++) {\n"
               "            int iy = oy * %d - %d + %s;\n"
               "            float *row = cp + oy * %d;\n"
               "            if (iy < 0 || iy >= %d) { for (int ox = 0; ox < %d; ox++) row[ox] = 0.0f; continue; }\n"
               "%s"
               "        }\n    }\n",
            cg_work_str(L, dimn(CKK)), K * K, K, K, K, C, H * W, P, OH, S, Pd, ky_d, OW, H, OW,
            Pd == 0 && S == 1
                /* no padding, stride 1: every row is a plain copy of OW inputs */
                ? arena_printf(L->p->arena, "            const float *xr = xp + iy * %d + %s;\n"
                                            "            for (int ox = 0; ox < %d; ox++) row[ox] = xr[ox];\n", W, kx_d, OW)
                : arena_printf(L->p->arena, "            for (int ox = 0; ox < %d; ox++) {\n"
                                            "                int ix = ox * %d - %d + %s;\n"
                                            "                row[ox] = ix >= 0 && ix < %d ? xp[iy * %d + ix] : 0.0f;\n"
                                            "            }\n", OW, S, Pd, kx_d, W, W));
    cg_end_kernel(L);
    return col;
}

/* ------------------------------------------------------------ direct convolution */

/* Groups and dilation in the generated code (the direct and chunked forms take them,
   cg_choose_convs()): a tap's offset, k or (k * D); the first input channel of output
   o's group, "" or "(o / (O/groups)) * (C/groups) + "; the header comment's words. */
const char *cg_dilated(Lower *L, const char *k, int D)
{
    return D > 1 ? arena_printf(L->p->arena, "(%s * %d)", k, D) : k;
}

static const char *group_base(Lower *L, const ConvGeom *G, const char *o)
{
    return G->groups > 1 ? arena_printf(L->p->arena, "(%s / %d) * %d + ", o, G->O / G->groups, G->C / G->groups) : "";
}

const char *cg_groups_dilation(Lower *L, const ConvGeom *G)
{
    return arena_printf(L->p->arena, "%s%s", G->groups > 1 ? arena_printf(L->p->arena, ", %d groups", G->groups) : "",
                        G->D > 1 ? arena_printf(L->p->arena, ", dilation %d", G->D) : "");
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
static bool rows_vec_fits(bool cpu_only, const ConvGeom *G, bool pairs)
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
   thread. With a 2x2 max pool fused (dec->pool_of: the ReLU's output is still written,
   the pool's gradient reads it), two output rows per iteration: each input row read
   serves both (K + 1 rows for 2K row-taps), and the pool of the two rows is taken from
   the sums just stored, into the pool's buffer. */
static void conv_rows_vec(Lower *L, int id, const ConvGeom *G, const int *b0, bool bias)
{
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, OH = G->OH, OW = G->OW;
    int pieces = OW / 16 + (OW % 16) / 8, pool = L->dec->node[id].pool_of, R = pool >= 0 ? 2 : 1;
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
                    L->dec->node[id].act_out >= 0   /* a pool is fused only after ReLU, in place */
                        ? cg_conv_store(L, id, "yr", "ox", arena_printf(L->p->arena, "t[%d][ox]", r))
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

static bool depthwise_fits(bool cpu_only, const ConvGeom *G)
{
    return cpu_only && G->groups > 1 && G->C == G->groups && G->K <= 7 &&
           ((long)G->H + 2 * G->P) * ((long)G->W + 2 * G->P) <= CG_DW_MAX_PAD_FLOATS;
}

/* The body's copy of plane `src` (H x W) into `pad` ((H + 2B) x (W + 2B), B zeros around). */
static void padded_plane(Lower *L, const char *src, int H, int W, int B)
{
    long Wp = (long)W + 2 * B, Hp = (long)H + 2 * B;
    cg_body(L, "        float pad[%ld];   /* the plane with %d zeros around */\n"
               "        for (long k = 0; k < %ldL; k++) pad[k] = 0.0f;\n"
               "        for (int iy = 0; iy < %d; iy++)\n"
               "            for (int ix = 0; ix < %d; ix++) pad[(iy + %d) * %ldL + %d + ix] = %s[iy * %d + ix];\n",
            Hp * Wp, B, Hp * Wp, H, W, B, Wp, B, src, W);
}

/* The body's sum over a K x K window of `pad` (Wp wide) at row `row0` and column
   `col0` + ox * S, taps D apart, with the weights w<ky>_<kx> ("flip": the taps
   mirrored, for the input gradient): "w0_0 * r0[...] + ...". */
static const char *window_sum(Lower *L, int K, int S, int D, bool flip)
{
    Arena *a = L->p->arena;
    const char *sum = "";
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            int wy = flip ? K - 1 - ky : ky, wx = flip ? K - 1 - kx : kx;
            sum = arena_printf(a, "%s%sw%d_%d * r%d[ox%s + %d]", sum, *sum ? " + " : "", wy, wx, ky,
                               S > 1 ? arena_printf(a, " * %d", S) : "", kx * D);
        }
    return sum;
}

static void conv_depthwise_forward(Lower *L, int id, const ConvGeom *G, const int *b, bool bias)
{
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, P = G->P, D = G->D, OH = G->OH, OW = G->OW;
    int Og = O / C;
    long Wp = (long)W + 2 * P;
    Step *st = cg_conv_kernel(L, id, "conv2d_depthwise", dimn(O), bias ? 4 : 3, b, (const char *const[]){ "=y", "x", "w", "bias" });
    st->grain = (long)OH * OW * K * K;
    st->c_only = true;
    cg_body(L, "    /* x [N, %d, %d, %d], w [%d, 1, %d, %d], y [N, %d, %d, %d]; stride %d, padding %d%s;\n"
               "       one (n, o) plane per iteration: its input plane once into a zero-bordered copy,\n"
               "       each output the sum of its %d taps, the weights in registers */\n",
            C, H, W, O, K, K, O, OH, OW, S, P, cg_groups_dilation(L, G), K * K);
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        long n = i / %d, o = i %% %d;\n"
               "        const float *xp = x + (n * %d + o / %d) * %d;\n",
            cg_work_str(L, dimn(O)), O, O, C, Og, H * W);
    padded_plane(L, "xp", H, W, P);
    cg_body(L, "        const float *wp = w + o * %d, b0 = %s;\n", K * K, bias ? "bias[o]" : "0.0f");
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) cg_body(L, "        const float w%d_%d = wp[%d];\n", ky, kx, ky * K + kx);
    cg_body(L, "        float *yp = y + i * %d;\n"
               "        for (int oy = 0; oy < %d; oy++) {\n", OH * OW, OH);
    for (int ky = 0; ky < K; ky++) cg_body(L, "            const float *r%d = pad + (oy * %d + %d) * %ldL;\n", ky, S, ky * D, Wp);
    cg_body(L, "            float *yr = yp + oy * %d;\n"
               "            for (int ox = 0; ox < %d; ox++) {\n"
               "                const float v = b0 + %s;\n"
               "                %s\n"
               "            }\n        }\n    }\n",
            OW, OW, window_sum(L, K, S, D, false), cg_conv_store(L, id, "yr", "ox", "v"));
    cg_end_kernel(L);
}

/* The input gradient of a depthwise layer with stride 1 (CPUs): a correlation of
   each output's gradient plane with its kernel mirrored, over the gradient plane
   with (K-1)*D - P zeros around; a channel with several outputs (Og) adds theirs. */
static bool depthwise_grad_x_fits(bool cpu_only, const ConvGeom *G)
{
    long B = (long)(G->K - 1) * G->D - G->P;
    return depthwise_fits(cpu_only, G) && G->S == 1 && B >= 0 &&
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
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        long n = i / %d, c = i %% %d;\n"
               "        float *dxp = dx + i * %d;\n"
               "        for (int j = 0; j < %d; j++) {\n"
               "        const long o = c * %d + j;\n"
               "        const float *dyp = dy + (n * %d + o) * %d;\n",
            cg_work_str(L, dimn(C)), C, C, H * W, Og, Og, O, OH * OW);
    padded_plane(L, "dyp", OH, OW, B);
    cg_body(L, "        const float *wp = w + o * %d;\n", K * K);
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) cg_body(L, "        const float w%d_%d = wp[%d];\n", ky, kx, ky * K + kx);
    cg_body(L, "        for (int iy = 0; iy < %d; iy++) {\n", H);
    for (int ky = 0; ky < K; ky++) cg_body(L, "            const float *r%d = pad + (iy + %d) * %ldL;\n", ky, ky * D, Wp);
    cg_body(L, "            float *xr = dxp + iy * %d;\n"
               "            for (int ox = 0; ox < %d; ox++) {\n"
               "                const float v = %s;\n"
               "                xr[ox] = j ? xr[ox] + v : v;\n"
               "            }\n        }\n        }\n    }\n",
            W, W, window_sum(L, K, 1, D, true));
    cg_end_kernel(L);
}

/* The weight gradient of a depthwise layer (CPUs): per output channel, over the
   batch, each input plane once into a zero-bordered copy and, row by row, every
   tap's partial sums per output column from it (no valid range per tap). */
static bool depthwise_grad_w_fits(bool cpu_only, const ConvGeom *G)
{
    return depthwise_fits(cpu_only, G) && (long)G->K * G->K * G->OW <= 4096;
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
static void conv_direct_forward(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, P = G->P, OH = G->OH, OW = G->OW;
    bool bias = n->nin == 3;
    int b[4] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), bias ? buf_of(L, n->in[2]) : -1 };
    if (rows_vec_fits(L->dec->cpu_only, G, false)) {   /* C only: all output channels in vectors */
        conv_rows_vec(L, id, G, b, bias);
        return;
    }
    if (depthwise_fits(L->dec->cpu_only, G)) {   /* C only */
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
                cg_conv_store(L, id, "yr", "ox", "acc[ox]"));
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
    if (L->dec->node[id].relu_out)
        cg_body(L, "        for (int k = 0; k < %d; k++) yp[k] = yp[k] > 0.0f ? yp[k] : 0.0f;   /* fused relu */\n", OH * OW);
    else if (L->dec->node[id].act >= 0)
        cg_body(L, "        for (int k = 0; k < %d; k++) %s   /* fused %s */\n", OH * OW, cg_conv_store(L, id, "yp", "k", "yp[k]"),
                ir_op_name((Op)L->dec->node[id].act));
    cg_body(L, "    }\n");
    cg_end_kernel(L);
}

/* dy, w -> dx, one (n, c) plane of dx per iteration, scattered from every output it fed */
static void conv_direct_grad_x(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, P = G->P, OH = G->OH, OW = G->OW;
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
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
static void conv_direct_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, P = G->P, OH = G->OH, OW = G->OW;
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    int Cg = C / G->groups;
    const char *gx = group_base(L, G, "o"), *kyv = cg_dilated(L, "ky", G->D), *kxv = cg_dilated(L, "kx", G->D);
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
static void conv_vector_forward(Lower *L, int id, const ConvGeom *G)
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
        cg_body(L, "                %s\n", cg_conv_store(L, id, "yr", arena_printf(L->p->arena, "%d", j), arena_printf(L->p->arena, "a%d[o]", j)));
    cg_body(L, "            }\n        }\n    }\n");
    cg_end_kernel(L);
}

/* dy, x -> dw from the channels-last gradient, one row of taps (c, ky) per iteration */
static void conv_vector_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    /* CONV2D_BWD_W: dw[o, r] = sum over n, oy, ox of dy[n, o, oy, ox] * x[n, c, oy*S + ky, ox*S + kx], r = (c, ky, kx) */
    int C = G->C, H = G->H, W = G->W, O = G->O, K = G->K, S = G->S, OH = G->OH, OW = G->OW;   /* P is 0: cg_conv_strategy() picks this only then */
    long CKK = (long)C * K * K;
    int dyt = channels_last(L, id, n->in[0]);
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

/* ---------------------------------------------------------- im2col + GEMM */

/* cg_take_ahead's: a later convolution's weight that gemm_weights would round (a parameter,
   or a weight made already), not made yet */
static int takes_weights(Lower *L, int c)
{
    const Node *n = &L->g->nodes[c];
    if (n->op != OP_CONV2D || L->dec->node[c].conv != CONV_GEMM || !cg_packs_bf16(L, c)) return -1;
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
static void conv_gemm_forward(Lower *L, int id, const ConvGeom *G)
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
                                  bias ? "bias[o]" : "0.0f", cg_conv_store(L, id, "y", arena_printf(L->p->arena, "row * %ldL + at", P), "v")));
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
            cg_conv_store(L, id, "dst", "p", "src[p] + b"));
    cg_end_kernel(L);
}
/* dy, x -> dw[O, CKK] = dyt . col^T (GEMM), with the forward's columns or new ones */
static void conv_gemm_grad_w(Lower *L, int id, const ConvGeom *G)
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
        col = im2col(L, id, L->g->nodes[fwd].in[0], G);
    int dw = cg_out_buf(L, id);
    Step *s = cg_gemm(L, id, false, true, dimc(Og), dimc(CKK), dimn(P), t, dimn(P), col, dimn(P), 0.0f, dw, dimc(CKK));
    group_batch(s, G, dimn(Og * P), dimn(CKK * P), dimc(Og * CKK));
}

/* dy, w -> dx: the columns' gradient by one GEMM, gathered back into the planes of dx
   (col2im). CONV_VECTOR takes it example-major from the channels-last gradient. */
static void conv_gemm_grad_x(Lower *L, int id, const ConvGeom *G, ConvStrategy how)
{
    const Node *n = &L->g->nodes[id];
    int O = G->O, K = G->K, S = G->S, Pd = G->P;
    int C = G->C, H = G->H, W = G->W, OH = G->OH, OW = G->OW;
    long P = (long)OH * OW, CKK = (long)C * K * K;
    if (how == CONV_VECTOR) {
        /* With the gradient channels last (shared with the weight gradient), the columns'
           gradient comes out example by example: dcolT[N*P, CKK] = t[N*P, O] . W[O, CKK],
           and each example's block is gathered back into its planes while in cache. */
        int t = channels_last(L, id, n->in[0]);
        int dcol = cg_new_buf(L, BUF_WORK, dimn(CKK * P), "im2col gradient, example-major", id);
        cg_gemm(L, id, false, false, dimn(P), dimc(CKK), dimc(O), t, dimc(O), buf_of(L, n->in[1]), dimc(CKK), 0.0f, dcol, dimc(CKK));
        int dx = cg_out_buf(L, id);
        int b[2] = { dx, dcol };
        cg_kernel(L, id, "col2im_rows", dimn(C), 2, b, (const char *const[]){ "=dx", "dcol" })->grain = (long)H * W * K * K;
        cg_body(L, "    /* dcol is [N*%d*%d, %d*%d*%d]; dx is [N, %d, %d, %d]; stride %d, no padding;\n"
                   "       each iteration owns one (n, c) plane of dx */\n", OH, OW, C, K, K, C, H, W, S);
        cg_body(L, "    FOR_EACH(plane, %s) {\n"
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
                cg_work_str(L, dimn(C)), C, C, H * W, H * W, OH, OW, OH, OW, CKK, K * K, S, W, S, K, K, W, K);
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
                     arena_printf(L->p->arena,
                                  "{ int iy = at / %d, ix = at %% %d;\n"
                                  "          float s = 0.0f;\n"
                                  "          for (int ky = 0; ky < %d; ky++) {\n"
                                  "              int ty = iy + %d - %s;\n"
                                  "              if (ty < 0 || ty %% %d || ty / %d >= %d) continue;\n"
                                  "              for (int kx = 0; kx < %d; kx++) {\n"
                                  "                  int tx = ix + %d - %s;\n"
                                  "                  if (tx < 0 || tx %% %d || tx / %d >= %d) continue;\n"
                                  "                  s += dcol[((c * %d + ky) * %d + kx) * (N * %ldL) + n * %ldL + (ty / %d) * %d + tx / %d];\n"
                                  "              }\n"
                                  "          }\n"
                                  "          dx[row * %dL + at] = s; }",
                                  W, W, K, Pd, ky_d, S, S, OH, K, Pd, kx_d, S, S, OW, K, K, P, P, S, OW, S, H * W));
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "col2im", dimn(C), 2, b, (const char *const[]){ "=dx", "dcol" })->grain = (long)H * W * K * K;
    cg_body(L, "    /* dcol is [%d*%d*%d, N*%d*%d]; dx is [N, %d, %d, %d]; each iteration owns one (n, c) plane of dx */\n",
            C, K, K, OH, OW, C, H, W);
    cg_body(L, "    FOR_EACH(plane, %s) {\n"
               "        long n = plane / %d, c = plane %% %d;\n"
               "        float *dxp = dx + plane * %d;\n"
               "        for (int k = 0; k < %d; k++) dxp[k] = 0.0f;\n"
               "        for (int ky = 0; ky < %d; ky++)\n"
               "            for (int kx = 0; kx < %d; kx++) {\n"
               "                const float *cp = dcol + ((c * %d + ky) * %d + kx) * (N * %ld) + n * %ld;\n"
               "%s"
               "            }\n    }\n",
            cg_work_str(L, dimn(C)), C, C, H * W, H * W, K, K, K, K, P, P,
            Pd == 0 && S == 1
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
                                            "                }\n", OH, S, Pd, ky_d, H, OW, S, Pd, kx_d, W, W, OW));
    cg_end_kernel(L);
}

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
        cg_body(L, "    FOR_EACH(e, %ldL) {\n"
                   "        long r = e / %ldL, j = e %% %ldL;   /* row (o, oy, ox), column (c, iy, ix) */\n"
                   "        long o = r / %ld, oy = (r %% %ld) / %d, ox = r %% %d;\n"
                   "        long c = j / %ld, iy = (j %% %ld) / %d, ix = j %% %d;\n"
                   "        long ky = iy - oy * %d + %d, kx = ix - ox * %d + %d;\n"
                   "        wd[e] = ky >= 0 && ky < %d && kx >= 0 && kx < %d ? w[(o * %d + c) * %d + ky * %d + kx] : 0.0f;\n"
                   "    }\n",
                CHW * O * P, CHW, CHW, P, P, OW, OW, HW, HW, W, W, S, Pd, S, Pd, K, K, C, K * K, K);
        cg_end_kernel(L);
        return wd;
    }
    cg_kernel(L, id, "conv2d_dense_weights", dimc(O * P), 2, b, (const char *const[]){ "=wd", "w" })->grain = CHW;
    cg_body(L, "    /* w [%d, %d, %d, %d] -> wd [%d*%ld, %d*%ld]; stride %d, padding %d; one row (o, output position) per iteration */\n",
            O, C, K, K, O, P, C, HW, S, Pd);
    /* Zero the row, then store each tap that lands on the plane: a conditional load
       per element (row[j] = tap in bounds ? w[...] : 0) was vectorised by GCC 12 at
       -O3 -march=native into wrong values (checked on a stride-2 layer); stores need no gather. */
    cg_body(L, "    FOR_EACH(r, %ldL) {\n"
               "        long o = r / %ld, oy = (r %% %ld) / %d, ox = r %% %d;\n"
               "        float *row = wd + r * %ldL;\n"
               "        const float *wc = w + o * %ldL;\n"
               "%s"
               "        for (int c = 0; c < %d; c++, row += %ld, wc += %d)\n"
               "            for (int ky = 0; ky < %d; ky++) {\n"
               "                long iy = oy * %d - %d + ky;\n"
               "                if (iy < 0 || iy >= %d) continue;\n"
               "                for (int kx = 0; kx < %d; kx++) {\n"
               "                    long ix = ox * %d - %d + kx;\n"
               "                    if (ix >= 0 && ix < %d) row[iy * %d + ix] = wc[ky * %d + kx];\n"
               "                }\n"
               "            }\n    }\n",
            O * P, P, P, OW, OW, CHW, (long)C * K * K,
            all_joined(G) ? "        /* every tap of every output lands on the plane: each element is written below */\n"
                          : arena_printf(L->p->arena, "        for (long j = 0; j < %ldL; j++) row[j] = 0.0f;\n", CHW),
            C, HW, K * K, K, S, Pd, H, K, S, Pd, W, W, K);
    cg_end_kernel(L);
    return wd;
}

/* x, w, bias? -> y[N, O*P] = x[N, C*HW] . wd^T (GEMM straight into y), then the bias and a fused relu */
static void conv_dense_forward(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    long HW = (long)G->H * G->W, P = (long)G->OH * G->OW, CHW = G->C * HW, OP = G->O * P;
    int wd = dense_weights(L, id, n->in[1], G);
    L->col[id] = wd;
    int y = cg_out_buf(L, id);
    cg_gemm(L, id, false, true, dimn(1), dimc(OP), dimc(CHW), buf_of(L, n->in[0]), dimc(CHW), wd, dimc(CHW), 0.0f, y, dimc(OP));
    bool bias = n->nin == 3, act = L->dec->node[id].act >= 0;
    if (!bias && !act) return;
    int b[2] = { y, bias ? buf_of(L, n->in[2]) : -1 };
    if (!L->dec->cpu_only) {   /* GPUs: an element per thread (cg_rows_body) */
        cg_conv_kernel(L, id, "conv2d_dense_epilogue", cg_rows_work(dimn(G->O), P), bias ? 2 : 1, b, (const char *const[]){ "=y", "bias" });
        cg_body(L, "    /* y is [N, %d, %ld]; an element per iteration */\n", G->O, P);
        cg_rows_body(L, dimn(G->O), P, arena_printf(L->p->arena, "        float *yp = y + row * %ldL + at;\n", P),
                     arena_printf(L->p->arena, "float v = *yp + %s; %s",
                                  bias ? arena_printf(L->p->arena, "bias[row %% %d]", G->O) : "0.0f",
                                  cg_conv_store(L, id, "yp", "0", "v")));
        cg_end_kernel(L);
        return;
    }
    cg_conv_kernel(L, id, "conv2d_dense_epilogue", dimn(G->O), bias ? 2 : 1, b, (const char *const[]){ "=y", "bias" })->grain = P;
    cg_body(L, "    /* y is [N, %d, %ld]; one (n, o) plane per iteration */\n", G->O, P);
    cg_body(L, "    FOR_EACH(i, %s) {\n        float *yp = y + i * %ld;\n        const float b = %s;\n"
               "        for (int p = 0; p < %ld; p++) { float v = yp[p] + b; %s }\n    }\n",
            cg_work_str(L, dimn(G->O)), P, bias ? arena_printf(L->p->arena, "bias[i %% %d]", G->O) : "0.0f", P,
            cg_conv_store(L, id, "yp", "p", "v"));
    cg_end_kernel(L);
}

/* dy, w -> dx[N, C*HW] = dy[N, O*P] . wd (GEMM), with the forward's wd */
static void conv_dense_grad_x(Lower *L, int id, const ConvGeom *G)
{
    const Node *n = &L->g->nodes[id];
    long CHW = (long)G->C * G->H * G->W, OP = (long)G->O * G->OH * G->OW;
    int wd = L->col[n->grad_of];
    if (wd < 0) wd = dense_weights(L, id, n->in[1], G);
    int dx = cg_out_buf(L, id);
    cg_gemm(L, id, false, false, dimn(1), dimc(CHW), dimc(OP), buf_of(L, n->in[0]), dimc(OP), wd, dimc(CHW), 0.0f, dx, dimc(CHW));
}

/* dy, x -> dwd[O*P, C*HW] = dy^T . x (GEMM), then dw[o, c, ky, kx] = the sum of dwd where that tap joins */
static void conv_dense_grad_w(Lower *L, int id, const ConvGeom *G)
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
        cg_body(L, "    FOR_EACH(e_, %ldL) {\n"
                   "        long i = e_ / %d, o = i / %d, c = i %% %d;\n"
                   "        int ky = (int)(e_ %% %d) / %d, kx = (int)(e_ %% %d) %% %d;\n"
                   "        float acc = 0.0f;\n"
                   "        for (int oy = 0; oy < %d; oy++) {\n"
                   "            int iy = oy * %d - %d + ky;\n"
                   "            if (iy < 0 || iy >= %d) continue;\n"
                   "            for (int ox = 0; ox < %d; ox++) {\n"
                   "                int ix = ox * %d - %d + kx;\n"
                   "                if (ix >= 0 && ix < %d) acc += dwd[(o * %ldL + oy * %d + ox) * %ldL + c * %ldL + iy * %d + ix];\n"
                   "            }\n"
                   "        }\n"
                   "        dw[e_] = acc;\n"
                   "    }\n",
                (long)O * C * K * K, K * K, C, C, K * K, K, K * K, K, OH, S, Pd, H, OW, S, Pd, W, P, OW, CHW, HW, W);
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "conv2d_dense_grad_w", dimc((long)O * C), 2, b, (const char *const[]){ "=dw", "dwd" })->grain = (long)K * K * P;
    cg_body(L, "    /* dwd [%d*%ld, %d*%ld] -> dw [%d, %d, %d, %d]: each tap's sum over the output positions it reaches\n"
               "       (in their order); one (o, c) pair per iteration, its rows of dwd read once */\n", O, P, C, HW, O, C, K, K);
    cg_body(L, "    FOR_EACH(i, %dL) {\n"
               "        long o = i / %d, c = i %% %d;\n"
               "        float acc[%d] = { 0.0f };\n"
               "        for (int oy = 0; oy < %d; oy++)\n"
               "            for (int ox = 0; ox < %d; ox++) {\n"
               "                const float *drow = dwd + (o * %ldL + oy * %d + ox) * %ldL + c * %ldL;\n"
               "                for (int iy = 0; iy < %d; iy++) {\n"
               "                    int ky = iy - oy * %d + %d;\n"
               "                    if (ky < 0 || ky >= %d) continue;\n"
               "                    for (int ix = 0; ix < %d; ix++) {\n"
               "                        int kx = ix - ox * %d + %d;\n"
               "                        if (kx >= 0 && kx < %d) acc[ky * %d + kx] += drow[iy * %d + ix];\n"
               "                    }\n"
               "                }\n"
               "            }\n"
               "        for (int k = 0; k < %d; k++) dw[i * %d + k] = acc[k];\n"
               "    }\n",
            O * C, C, C, K * K, OH, OW, P, OW, CHW, HW, H, S, Pd, K, W, S, Pd, K, K, W, K * K, K * K);
    cg_end_kernel(L);
}

/* ------------------------------------------------------------------- dispatch */

/* The pairs (output o of n, tap k of K) whose input o*S - P + k*D is in [0, size):
   a range of taps per output, or of outputs per tap, whichever loop is shorter
   (at most 46,341 steps, since K*K fits the limits: testing every pair, n*K
   steps, slowed the fuzzer on wide kernels over wide maps to 33 executions/s). */
static long taps_in_bounds(int n, int K, int S, int P, int D, int size)
{
    long t = 0;
    if (n <= K) {
        for (long o = 0; o < n; o++) {
            long lo = P - o * S, hi = (long)size + P - o * S;   /* k * D in [lo, hi) */
            lo = lo <= 0 ? 0 : (lo + D - 1) / D, hi = hi <= 0 ? 0 : (hi + D - 1) / D;
            if (hi > K) hi = K;
            if (hi > lo) t += hi - lo;
        }
    } else {
        for (long k = 0; k < K; k++) {
            long lo = P - k * D, hi = (long)size + P - k * D;   /* o * S in [lo, hi) */
            long o0 = lo <= 0 ? 0 : (lo + S - 1) / S, o1 = hi <= 0 ? 0 : (hi + S - 1) / S;   /* o in [o0, o1) */
            if (o1 > n) o1 = n;
            if (o1 > o0) t += o1 - o0;
        }
    }
    return t;
}

/* "8 groups of 4 channels, dilation 2" */
static const char *grouped_words(Arena *a, const ConvGeom *G)
{
    int Cg = G->C / G->groups;
    return arena_printf(a, "%s%s%s", G->groups > 1 ? arena_printf(a, "%d groups of %d channel%s", G->groups, Cg, Cg == 1 ? "" : "s") : "",
                        G->groups > 1 && G->D > 1 ? ", " : "", G->D > 1 ? arena_printf(a, "dilation %d", G->D) : "");
}

static bool chunked_takes(const CgOptions *opt, const ConvGeom *G)
{
    /* grouped: the weight gradient's partial copies must fit (its other form splits columns across groups) */
    return opt && opt->cpu_only && (double)G->C * G->K * G->K * G->OH * G->OW <= INT_MAX &&
           (G->groups == 1 || cg_chunked_wgroups_fit(G));
}

/* Why a grouped or dilated layer runs the direct loops. */
static const char *grouped_direct_why(const CgOptions *opt, const ConvGeom *G)
{
    if (opt && opt->conv >= 0 && opt->conv != CONV_DIRECT) return "only the direct, GEMM and chunked forms take them";
    if (!(opt && opt->cpu_only))
        return G->groups > 1 && G->C == G->groups ? "depthwise: a thread per output over its taps, where a GEMM per group would be 1 row by K*K"
                                                  : "few weights and wide rows";
    if (!chunked_takes(opt, G)) return "the chunked form does not fit it";
    if (G->groups > 1 && G->C == G->groups) return "depthwise: its own kernels, the taps' weights in registers";
    return "few weights and wide rows";
}

/* The form of a grouped or dilated convolution (direct, GEMM and chunked take
   them): on CPUs, a depthwise layer's own direct kernels (depthwise_fits()),
   other grouped layers chunked (a GEMM per group); `s`, cg_conv_strategy()'s
   choice for one group's channels, decides a dilated layer without groups
   (direct or a GEMM form, which becomes chunked). On GPUs, a depthwise layer's
   direct loops (a thread per output over its K*K taps: a GEMM per group would
   have one row), other grouped layers im2col over the batch and a GEMM per
   group, one strided batched cuBLAS call (not measured: no GPU yet). Measured, one thread, a step of 256,
   forward / input / weight gradient in ms: depthwise 3x3 on 32 channels at
   28x28, 6.5 / 3.2 / 8.6 against chunked 13.5 / 15.7 / 11.8; 96 at 14x14,
   3.2 / 3.2 / 5.2 against 9.8 / 13.9 / 9.9; 384 at 7x7, 6.3 / 6.3 / 9.1
   against 11.9 / 16.4 / 12.1; 8 groups of 4 channels at 28x28, chunked 16.3 /
   18.2 / 13.2 against the plane-at-a-time loops' 37.4 / 43.2 / 47.7 (8 and 16
   channels a group at 14x14 and 7x7: 9x to 18x). */
static ConvStrategy grouped_strategy(const CgOptions *opt, const ConvGeom *G, ConvStrategy s)
{
    if (opt && opt->conv >= 0) {   /* forced: direct, GEMM or chunked (where it fits; else GEMM, as without groups) */
        if (s == CONV_CHUNKED || s == CONV_WINOGRAD) return chunked_takes(opt, G) ? CONV_CHUNKED : CONV_GEMM;
        return s == CONV_GEMM ? CONV_GEMM : CONV_DIRECT;
    }
    if (!(opt && opt->cpu_only))   /* GPUs: a depthwise layer's direct loops, other grouped layers a GEMM per group */
        return G->groups > 1 && G->C == G->groups ? CONV_DIRECT : CONV_GEMM;   /* s is never direct here: GPUs take GEMMs */
    if (!chunked_takes(opt, G)) return CONV_DIRECT;
    if (G->groups == 1) return s == CONV_DIRECT ? CONV_DIRECT : CONV_CHUNKED;
    return depthwise_fits(true, G) ? CONV_DIRECT : CONV_CHUNKED;
}

/* For --emit kernels: the form a layer got and why, with the share of its
   multiply-adds that touch data (the rest multiply padding). */
static const char *conv_why(Arena *a, const CgOptions *opt, const ConvGeom *G, ConvStrategy s)
{
    long P = (long)G->OH * G->OW, CKK = (long)G->C / G->groups * G->K * G->K, HW = (long)G->H * G->W;
    long touch = taps_in_bounds(G->OH, G->K, G->S, G->P, G->D, G->H) * taps_in_bounds(G->OW, G->K, G->S, G->P, G->D, G->W) *
                 (G->C / G->groups) * G->O;
    long full = CKK * P * G->O;   /* im2col's */
    const char *what = "";
    switch (s) {
    case CONV_DIRECT:
        what = arena_printf(a, "direct: loops over whole planes (%ld weights, rows %d wide), nothing materialised%s", CKK * G->O, G->OW,
                            G->groups > 1 || G->D > 1 ? arena_printf(a, " (%s: %s)", grouped_words(a, G), grouped_direct_why(opt, G)) : "");
        break;
    case CONV_VECTOR:
        what = arena_printf(a, "vector: all %d outputs in a vector per output row (no padding, short rows)", G->O);
        break;
    case CONV_GEMM:
        what = arena_printf(a, "gemm: im2col + one GEMM over the batch (columns [%ld, N*%ld])%s%s", CKK * G->groups, P,
                            G->groups > 1 || G->D > 1
                                ? arena_printf(a, " (%s%s)", grouped_words(a, G),
                                               G->groups > 1 ? arena_printf(a, ": a GEMM per group, %d of [%d x %ld] by [%ld x N*%ld], strided batched",
                                                                            G->groups, G->O / G->groups, CKK, CKK, P)
                                                             : ": im2col's taps spaced")
                                : "",
                            opt && opt->cpu_only ? "" : "; on GPUs, cuBLAS");
        break;
    case CONV_CHUNKED:
        what = arena_printf(a, "chunked: im2col + GEMM %d example%s at a time on each thread, their columns (%ld KB) in cache%s",
                            cg_chunk_examples(G), cg_chunk_examples(G) == 1 ? "" : "s", (long)G->C * G->K * G->K * P * cg_chunk_examples(G) * 4 / 1024,
                            G->groups > 1 || G->D > 1
                                ? arena_printf(a, " (%s%s)", grouped_words(a, G),
                                               G->groups > 1 ? arena_printf(a, ": a GEMM per group, [%d x %ld] by [%ld x %ld]", G->O / G->groups, CKK,
                                                                            CKK, P * cg_chunk_examples(G))
                                                             : ": im2col's taps spaced")
                                : "");
        break;
    case CONV_WINOGRAD:
        what = arena_printf(a, "winograd: F(2x2, 3x3), %ld 2x2 tiles per map, 16 GEMMs with K = %d over %d examples' tiles at a time "
                            "on each thread, %ld multiply-adds per example in them against im2col's %ld",
                            cg_winograd_tiles(G), G->C, cg_winograd_examples(G), 16 * cg_winograd_tiles(G) * G->C * G->O, full);
        break;
    case CONV_DENSE:
        what = arena_printf(a, "dense: %ld input position%s, fewer than the kernel's %d taps: one GEMM over the whole map, "
                            "%ld multiply-adds per example, no im2col", HW, HW == 1 ? "" : "s", G->K * G->K, G->C * HW * G->O * P);
        break;
    }
    return arena_printf(a, "%s%s; %ld of im2col's %ld multiply-adds per example touch data (%.0f%%)", what,
                        opt && opt->conv >= 0 ? (s == (ConvStrategy)opt->conv ? " (forced)" : " (the forced form does not apply)") : "",
                        touch, full, full ? 100.0 * (double)touch / (double)full : 100.0);
}

void cg_choose_convs(const Graph *g, const CgOptions *opt, CgDecisions *d)
{
    d->cpu_only = opt && opt->cpu_only;
    d->fuse = opt && opt->fuse;
    for (int id = 0; id < g->n; id++) {
        Op op = g->nodes[id].op;
        if (op != OP_CONV2D && op != OP_CONV2D_BWD_X && op != OP_CONV2D_BWD_W) continue;
        ConvGeom G = cg_conv_geom(g, id);   /* the layer's, for its gradients too: one choice per layer */
        ConvStrategy s = cg_conv_strategy(opt, G.C / G.groups, G.K, G.O, G.OW, G.S, G.P, G.H * G.W, G.OH * G.OW);
        if (G.groups > 1 || G.D > 1) s = grouped_strategy(opt, &G, s);
        if (s == CONV_VECTOR && !g->training && opt && opt->conv < 0 && G.K == 1 && G.S == 1 && (long)G.OH * G.OW >= 128 &&
            (double)G.C * G.OH * G.OW <= INT_MAX)
            s = CONV_CHUNKED;   /* an evaluation program's 1x1 layer: one GEMM per example, no columns (conv_chunked.c) */
        if (op == OP_CONV2D_BWD_X && s == CONV_VECTOR && opt && opt->conv < 0 && opt->cpu_only &&
            (double)G.C * G.K * G.K * G.OH * G.OW <= INT_MAX) {
            /* The vector form's input gradient is one GEMM over the batch with K = O (16 on
               LeNet's conv2) and a col2im through memory; chunked, the same GEMMs run on
               columns in cache. Measured on LeNet, one thread: 2.15 -> 1.19 ms a step. */
            s = CONV_CHUNKED;
            int fwd = g->nodes[id].grad_of;
            if (fwd >= 0 && d->node[fwd].conv_why)
                d->node[fwd].conv_why = arena_printf(g->arena, "%s; its input gradient chunked (im2col + GEMM %d examples at a time, in cache)",
                                                d->node[fwd].conv_why, cg_chunk_examples(&G));
        }
        bool wg_more = 16 * cg_winograd_tiles(&G) * 2 > 9L * G.OH * G.OW;   /* more than half of im2col's */
        if (op == OP_CONV2D_BWD_W && s == CONV_WINOGRAD && (!cg_winograd_grad_w_fits(&G) || (opt->conv < 0 && wg_more))) {
            /* The Winograd weight gradient's GEMMs are O x C with K = the chunk's tiles and
               accumulate in memory; they pay only with at most half of im2col's multiply-adds
               (4x4 maps: 0.44; 7x7: 0.58, whose tiles cover 8x8). Measured on ResNet-18's
               7x7 layers, one thread: 10.0-10.5 ms against 9.8 chunked; 4x4: 8.3 against 11.3.
               Its 8 groups' partial sums take 16/9 of im2col's: past CG_WGROUPS_MAX_FLOATS,
               the chunked form (which then splits dw's columns between threads). */
            s = CONV_CHUNKED;
            int fwd = g->nodes[id].grad_of;
            if (fwd >= 0 && d->node[fwd].conv_why)
                d->node[fwd].conv_why = arena_printf(g->arena, "%s; its weight gradient chunked (%s)", d->node[fwd].conv_why,
                                                cg_winograd_grad_w_fits(&G) ? "Winograd's would do more than half of im2col's multiply-adds"
                                                                            : "Winograd's partial sums per group would take too much memory");
        }
        d->node[id].conv = (signed char)s;
        if (op == OP_CONV2D) {
            d->node[id].conv_why = conv_why(g->arena, opt, &G, s);
            if (g->nodes[id].mm == DT_BF16)
                d->node[id].conv_why = arena_printf(g->arena, "%s; bf16 operands, %s", d->node[id].conv_why,
                                                    !d->cpu_only && s == CONV_GEMM ? "stored bf16 by im2col and the gradient's transposition "
                                                                                     "as they pack them, the weights by a copy"
                                                    : s == CONV_DIRECT || s == CONV_VECTOR ? "rounded into copies its fp32 loops read"
                                                    : s == CONV_WINOGRAD ? "rounded as its GEMMs pack them (Winograd's: the transformed input and filter)"
                                                                         : "rounded as its GEMMs pack them");
        }
    }
    /* A 2x2 max pool of a ReLU'd direct convolution's output (LeNet's conv1): computed by
       the convolution's kernel from the two rows just summed (conv_rows_vec). */
    for (int id = 0; opt && opt->fuse && id < g->n; id++) {
        const Node *pn = &g->nodes[id];
        if (pn->op != OP_MAXPOOL || pn->attr.kernel != 2 || pn->attr.stride != 2 || pn->attr.padding != 0) continue;
        int x = pn->in[0], c = d->node[x].fused >= 0 && g->nodes[x].op == OP_RELU ? d->node[x].fused : x;
        if (g->nodes[c].op != OP_CONV2D || !d->node[c].relu_out || d->node[c].conv != CONV_DIRECT || d->node[c].pool_of >= 0) continue;
        ConvGeom G = cg_conv_geom(g, c);
        if (!rows_vec_fits(d->cpu_only, &G, true) || G.OH != 2 * pn->shape.d[2] || G.OW != 2 * pn->shape.d[3]) continue;
        d->node[c].pool_of = id;
        d->node[id].pool_by = c;
        if (d->node[c].conv_why)
            d->node[c].conv_why = arena_printf(g->arena, "%s; its 2x2 max pool taken in the same kernel, two rows at a time", d->node[c].conv_why);
    }
    for (int id = 0; id < g->n; id++) {
        int fwd = g->nodes[id].grad_of;
        if (d->node[id].wgrad_pool >= 0 && fwd >= 0 && d->node[fwd].conv_why)
            d->node[fwd].conv_why = arena_printf(g->arena, "%s; its weight gradient routes the 2x2 max pool's gradient itself "
                                            "(one multiply-add per window and tap, not four)", d->node[fwd].conv_why);
    }
    /* BatchNorm statistics summed by the chunked convolution before them, chunk by
       chunk while its output is in cache (see conv_chunked_forward): bn_stats then
       only combines the chunks' partial sums. */
    for (int id = 0; opt && opt->fuse && id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op != OP_BN_STATS) continue;
        int c = n->in[0];
        if (g->nodes[c].op == OP_CONV2D && (d->node[c].conv == CONV_CHUNKED || d->node[c].conv == CONV_WINOGRAD) && !d->node[c].relu_out &&
            d->node[c].stats_of < 0) {
            d->node[c].stats_of = id;
            d->node[id].stats_by = c;
            if (d->node[c].conv_why)
                d->node[c].conv_why = arena_printf(g->arena, "%s; its BatchNorm's statistics summed chunk by chunk in the same kernel", d->node[c].conv_why);
        }
    }
}

/* The weight (and bias) gradient of a convolution followed by ReLU and a 2x2 max
   pool, from the pool's gradient gy and input y (the ReLU's output), the fusion
   pass's wgrad_pool: each window's gradient goes to its first maximum where that
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
static void conv_pooled_grad_w(Lower *L, int id, const ConvGeom *G)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    int pool = L->dec->node[id].wgrad_pool, bg = L->dec->node[id].wgrad_bias;
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
    int xt = C == 1 ? buf_of(L, n->in[1]) : channels_last(L, id, n->in[1]);
    int b[5] = { cg_out_buf(L, id), -1, buf_of(L, pn->in[0]), buf_of(L, pn->in[1]), xt };
    const char *names[5] = { "=dw", "=db", "y", "gy", "xt" };
    int nargs = 5;
    if (bg >= 0) b[1] = cg_out_buf(L, bg);
    else {   /* no bias: drop the db argument */
        b[1] = b[2], b[2] = b[3], b[3] = b[4];
        names[1] = "y", names[2] = "gy", names[3] = "xt";
        nargs = 4;
    }
    Step *st = cg_kernel(L, id, "conv2d_grad_w_pooled", dimc(O), nargs, b, names);
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
    for (int ky = 0; ky < K; ky++)
        for (int v = 0; v < nv; v++)
            cg_body(L, "                    e%d_%d += g0 * mgc_load%d(x0 + %d);\n", ky, v, lanes[v], ky * W * C + v * 16);
    cg_body(L, "                    const float g1 = gq[q + 1], *x1 = xp + at[q + 1];\n");
    for (int ky = 0; ky < K; ky++)
        for (int v = 0; v < nv; v++)
            cg_body(L, "                    f%d_%d += g1 * mgc_load%d(x1 + %d);\n", ky, v, lanes[v], ky * W * C + v * 16);
    cg_body(L, "                }\n");
    if (PQ % 2) {
        cg_body(L, "                { const float g0 = gq[%d], *x0 = xp + at[%d];\n", PQ - 1, PQ - 1);
        for (int ky = 0; ky < K; ky++)
            for (int v = 0; v < nv; v++)
                cg_body(L, "                  e%d_%d += g0 * mgc_load%d(x0 + %d);\n", ky, v, lanes[v], ky * W * C + v * 16);
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

/* --precision bf16 in the direct and vector forms, whose loops multiply in fp32: the
   node's two operands (conv2d: x, w; conv2d_grad_x: dy, w; conv2d_grad_w: dy, x) copied
   rounded to bf16, node_buf pointing at the copies while the node is lowered (saved[2]
   the buffers to put back). The products of bf16 values are exact in fp32, so the loops
   then compute what a bf16 GEMM does, and LeNet keeps its fastest forms (one pass over
   each operand: 784 and 864 floats an example). */
static void round_operands(Lower *L, int id, int saved[2])
{
    const Node *n = &L->g->nodes[id];
    for (int k = 0; k < 2; k++) {
        int in = n->in[k], src = buf_of(L, in);
        saved[k] = src;
        Dim d = dim_of(&L->g->nodes[in].shape);
        int r = cg_new_buf(L, BUF_WORK, d, "an operand rounded to bf16", id);
        int b[2] = { r, src };
        cg_kernel(L, id, "round_bf16", d, 2, b, (const char *const[]){ "=r", "v" });
        cg_body(L, "    /* %%%d, rounded to bf16 for %%%d's fp32 loops */\n"
                   "    FOR_EACH(i, %s) r[i] = mgc_bf16r(v[i]);\n", in, id, cg_work_str(L, d));
        cg_end_kernel(L);
        L->p->node_buf[in] = r;
    }
}

static void lower_conv(Lower *L, int id);

/* conv2d, conv2d_grad_x, conv2d_grad_w, each the way cg_conv_strategy() picks for the layer. */
void cg_lower_conv(Lower *L, int id)
{
    ConvStrategy how = (ConvStrategy)L->dec->node[id].conv;
    if (L->g->nodes[id].mm != DT_BF16 || (how != CONV_DIRECT && how != CONV_VECTOR)) {
        lower_conv(L, id);
        return;
    }
    const Node *n = &L->g->nodes[id];
    int saved[2];
    round_operands(L, id, saved);
    lower_conv(L, id);
    L->p->node_buf[n->in[0]] = saved[0], L->p->node_buf[n->in[1]] = saved[1];
}

static void lower_conv(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    ConvGeom G = cg_conv_geom(L->g, id);
    ConvStrategy how = (ConvStrategy)L->dec->node[id].conv;   /* cg_choose_convs() */
    if (n->op == OP_CONV2D) {
        switch (how) {
        case CONV_DIRECT: conv_direct_forward(L, id, &G); break;
        case CONV_VECTOR: conv_vector_forward(L, id, &G); break;
        case CONV_GEMM: conv_gemm_forward(L, id, &G); break;
        case CONV_DENSE: conv_dense_forward(L, id, &G); break;
        case CONV_CHUNKED: cg_conv_chunked_forward(L, id, &G); break;
        case CONV_WINOGRAD: cg_lower_conv_winograd(L, id, &G); break;
        }
    } else if (n->op == OP_CONV2D_BWD_W) {
        if (L->dec->node[id].wgrad_pool >= 0) {
            conv_pooled_grad_w(L, id, &G);
            return;
        }
        switch (how) {
        case CONV_DIRECT: conv_direct_grad_w(L, id, &G); break;
        case CONV_VECTOR: conv_vector_grad_w(L, id, &G); break;
        case CONV_GEMM: conv_gemm_grad_w(L, id, &G); break;
        case CONV_DENSE: conv_dense_grad_w(L, id, &G); break;
        case CONV_CHUNKED: cg_conv_chunked_grad_w(L, id, &G); break;
        case CONV_WINOGRAD: cg_lower_conv_winograd(L, id, &G); break;
        }
    } else {   /* OP_CONV2D_BWD_X */
        switch (how) {
        case CONV_DIRECT: conv_direct_grad_x(L, id, &G); break;
        case CONV_VECTOR: case CONV_GEMM: conv_gemm_grad_x(L, id, &G, how); break;
        case CONV_DENSE: conv_dense_grad_x(L, id, &G); break;
        case CONV_CHUNKED: cg_conv_chunked_grad_x(L, id, &G); break;
        case CONV_WINOGRAD: cg_lower_conv_winograd(L, id, &G); break;
        }
    }
}
