/*
** Convolutions, forward and both gradients, six ways. Every strategy reads
** one geometry, ConvGeom (cg_conv_geom(), conv_common.c), whichever of the three ops it
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
**
** This file: the choice of a form per layer (cg_conv_strategy,
** cg_choose_convs, and the reasons --emit kernels prints) and the dispatch
** through the table of forms (conv_forms.h). The forms:
** conv_direct.c (CONV_DIRECT, with its rows_vec and depthwise variants and
** the pooled weight gradient), conv_vector.c, conv_gemm.c (CONV_GEMM,
** CONV_DENSE and the packing they share), conv_chunked.c, winograd.c; what
** they share, below them all: conv_common.c (the geometry, cg_conv_geom();
** the forward kernel's start and fused activation; the chunked forms' loops).
** The store every form's forward ends in is elementwise.c's cg_store.
*/
#include "conv_forms.h"
#include <limits.h>
#include <string.h>

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
    /* 3x3, stride 1, padding 1 (ResNet-18's 7x7 and 4x4 maps): 2.25x fewer multiply-adds
       than im2col on even maps; few channels make its GEMMs too short (K = C). Before the
       direct form: se_resnet's 16 -> 16 layers at 28x28 took 11.5 ms forward, 10.7 and 13.7
       for the gradients in the direct form, 2.5, 2.3 and 2.7 in this (batch 128, two
       threads): its step 259 -> 144 ms */
    if (chunked && winograd && c >= 16 && o >= 16) return CONV_WINOGRAD;
    if (k > 1 && (long)c * k * k * o <= 4096 && out_width >= 16) return CONV_DIRECT;
    /* not 1x1 layers: as GEMMs (chunked) ResNeXt's step took 3.2 s where the vector form's took
       4.9 (ten steps of 128, two threads; ConvNeXt-like 1.29 -> 1.03, EfficientNet-like 2.59 -> 1.92,
       MobileNetV2 9.7 -> 8.6) */
    if (k > 1 && padding == 0 && k <= 7 && o % 8 == 0 && o <= 64 && (long)c * k * k <= 1152) return CONV_VECTOR;
    return chunked ? CONV_CHUNKED : CONV_GEMM;
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
   them): on CPUs, a depthwise layer's own direct kernels (cg_conv_depthwise_fits()),
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
    return cg_conv_depthwise_fits(true, G) ? CONV_DIRECT : CONV_CHUNKED;
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
            if (fwd >= 0)
                cg_add_conv_why(d, g->arena, fwd, arena_printf(g->arena, "its input gradient chunked (im2col + GEMM %d examples at a time, in cache)",
                                                               cg_chunk_examples(&G)));
        }
        if (op == OP_CONV2D_BWD_X && g->nodes[id].grad_of < 0 && s == CONV_WINOGRAD)
            s = CONV_CHUNKED;   /* a conv_transpose2d layer: Winograd's input gradient takes the forward's transformed filter */
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
            if (fwd >= 0)
                cg_add_conv_why(d, g->arena, fwd, cg_winograd_grad_w_fits(&G)
                                                      ? "its weight gradient chunked (Winograd's would do more than half of im2col's multiply-adds)"
                                                      : "its weight gradient chunked (Winograd's partial sums per group would take too much memory)");
        }
        cg_set_conv(d, id, s, op == OP_CONV2D ? conv_why(g->arena, opt, &G, s) : NULL);
        if (op == OP_CONV2D && g->nodes[id].mm == DT_BF16)
            cg_add_conv_why(d, g->arena, id, arena_printf(g->arena, "bf16 operands, %s",
                                                          !d->cpu_only && s == CONV_GEMM ? "stored bf16 by im2col and the gradient's transposition "
                                                                                           "as they pack them, the weights by a copy"
                                                          : s == CONV_DIRECT || s == CONV_VECTOR ? "rounded into copies its fp32 loops read"
                                                          : s == CONV_WINOGRAD ? "rounded as its GEMMs pack them (Winograd's: the transformed input and filter)"
                                                                               : "rounded as its GEMMs pack them"));
    }
    /* A 2x2 max pool of a ReLU'd direct convolution's output (LeNet's conv1): computed by
       the convolution's kernel from the two rows just summed (conv_rows_vec). */
    for (int id = 0; opt && opt->fuse && id < g->n; id++) {
        const Node *pn = &g->nodes[id];
        if (pn->op != OP_MAXPOOL || pn->attr.kernel != 2 || pn->attr.stride != 2 || pn->attr.padding != 0 || pn->attr.ceil_mode) continue;
        int x = pn->in[0], c = cg_fused_into(d, x) >= 0 && g->nodes[x].op == OP_RELU ? cg_fused_into(d, x) : x;
        if (g->nodes[c].op != OP_CONV2D || !cg_relu_out(d, c) || cg_conv_form(d, c) != CONV_DIRECT || cg_pool_of(d, c) >= 0) continue;
        ConvGeom G = cg_conv_geom(g, c);
        if (!cg_conv_rows_vec_fits(d->cpu_only, &G, true) || G.OH != 2 * pn->shape.d[2] || G.OW != 2 * pn->shape.d[3]) continue;
        cg_set_pool(d, c, id);
        cg_add_conv_why(d, g->arena, c, "its 2x2 max pool taken in the same kernel, two rows at a time");
    }
    for (int id = 0; id < g->n; id++) {
        int fwd = g->nodes[id].grad_of;
        if (cg_wgrad_pool(d, id) >= 0 && fwd >= 0)
            cg_add_conv_why(d, g->arena, fwd, "its weight gradient routes the 2x2 max pool's gradient itself "
                                              "(one multiply-add per window and tap, not four)");
    }
    /* BatchNorm statistics summed by the chunked convolution before them, chunk by
       chunk while its output is in cache (see conv_chunked_forward): bn_stats then
       only combines the chunks' partial sums. */
    for (int id = 0; opt && opt->fuse && id < g->n; id++) {
        const Node *n = &g->nodes[id];
        if (n->op != OP_BN_STATS) continue;
        int c = n->in[0];
        if (g->nodes[c].op == OP_CONV2D && (cg_conv_form(d, c) == CONV_CHUNKED || cg_conv_form(d, c) == CONV_WINOGRAD) &&
            !cg_relu_out(d, c) && cg_stats_of(d, c) < 0) {
            cg_set_stats(d, c, id);
            cg_add_conv_why(d, g->arena, c, "its BatchNorm's statistics summed chunk by chunk in the same kernel");
        }
    }
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
    ConvStrategy how = (ConvStrategy)cg_conv_form(L->dec, id);
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

/* The forms, by ConvStrategy (Winograd's one function lowers all three ops). */
static void winograd(Lower *L, int id, const ConvGeom *G) { cg_lower_conv_winograd(L, id, G); }
static const ConvForm forms[] = {
    [CONV_DIRECT] = { cg_conv_direct_forward, cg_conv_direct_grad_x, cg_conv_direct_grad_w },
    [CONV_VECTOR] = { cg_conv_vector_forward, cg_conv_vector_grad_x, cg_conv_vector_grad_w },
    [CONV_GEMM] = { cg_conv_gemm_forward, cg_conv_gemm_grad_x, cg_conv_gemm_grad_w },
    [CONV_DENSE] = { cg_conv_dense_forward, cg_conv_dense_grad_x, cg_conv_dense_grad_w },
    [CONV_CHUNKED] = { cg_conv_chunked_forward, cg_conv_chunked_grad_x, cg_conv_chunked_grad_w },
    [CONV_WINOGRAD] = { winograd, winograd, winograd },
};

static void lower_conv(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    ConvGeom G = cg_conv_geom(L->g, id);
    const ConvForm *f = &forms[cg_conv_form(L->dec, id)];   /* cg_choose_convs() */
    if (n->op == OP_CONV2D)
        f->forward(L, id, &G);
    else if (n->op == OP_CONV2D_BWD_W)
        (cg_wgrad_pool(L->dec, id) >= 0 ? cg_conv_pooled_grad_w : f->grad_w)(L, id, &G);
    else   /* OP_CONV2D_BWD_X */
        f->grad_x(L, id, &G);
}
