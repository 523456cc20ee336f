/*
** Lowering's shared internals, private to codegen/: the op families'
** functions, on the kernel builder (codegen/kernel.h: the lowering context and
** the helpers every op family uses to make buffers, steps and kernel text).
**
** The driver (codegen/lower.c) walks the graph and calls one lowering function
** per op; the op families live beside their gradients:
**   elementwise.c  relu/sigmoid/tanh, add/mul, const, dropout, and their gradients;
**                  the store every producer ends in (cg_store), BatchNorm's scale and shift
**   conv.c         convolutions: the choice among every form, and the dispatch
**                  through the table of forms (conv_forms.h)
**   conv_common.c  what the forms share: the geometry, the forward kernel's start,
**                  groups and dilation, the channels-last copy, the chunked loops
**   conv_direct.c  the direct form (loops over planes; rows_vec, depthwise)
**   conv_vector.c  the channel-vectorised form
**   conv_gemm.c    im2col + GEMM, dense over the map, and the packing they share
**   conv_chunked.c im2col + GEMM a chunk of examples at a time
**   winograd.c     3x3 convolutions as Winograd's F(2x2, 3x3)
**   linear.c       linear layers (GEMM + epilogue), their gradients, bias gradients
**   pool.c         max/avg/global-average pooling and their gradients
**   norm.c         BatchNorm: batch statistics, apply, gradients, running update
**   loss.c         softmax cross-entropy, its gradient, the accuracy count
**   dp.c           data parallelism: gradient buckets and the collectives' steps
**
** No file calls one that calls it back (tests/includes.py fails a circle); from
** the bottom: kernel.c; pool.c, elementwise.c, layout.c, layernorm.c, loss.c,
** dp.c; linear.c, conv_common.c; the forms; conv.c and norm.c (which combines the
** statistics the chunked forms sum); lower.c, the driver, above them all.
*/
#ifndef MGC_LOWER_INTERNAL_H
#define MGC_LOWER_INTERNAL_H
#include "kernel.h"

/* The geometry of one convolution, the same for conv2d, conv2d_grad_x and
   conv2d_grad_w: x [N, C, H, W], w [O, C, K, K], y [N, O, OH, OW]. */
typedef struct ConvGeom {
    int C, H, W;              /* input channels, rows, columns */
    int O, K;                 /* output channels, kernel size (K x K) */
    int S, P;                 /* stride, padding */
    int OH, OW;               /* output rows, columns */
    int groups, D;            /* channel groups (w is [O, C/groups, K, K]), dilation; 1 and 1 mostly */
} ConvGeom;

/* Weight gradients are summed in a fixed number of groups of examples,
   whatever the threads, so the sum is the same on any count (up to 8 threads
   a device each has work; more would idle in these kernels). */
#define CG_WGROUPS 8
/* ... when the partial copies take at most this many floats (16 MB): a
   512-channel 3x3 layer's 8 copies would take 75 MB (ResNet-18 with the
   small stem), and its columns split between threads give wide GEMMs anyway. */
#define CG_WGROUPS_MAX_FLOATS (4L << 20)


/* ---- the op families: one function per op (or per group of like ops) ---- */
/* elementwise.c */
void cg_lower_activation(Lower *L, int id);        /* relu, sigmoid, tanh */
const char *cg_fused_act(Lower *L, int id, const char *v);   /* v through id's fused activation (cg_act) */
/* Activation gradient ga's expression (ir/activations.def) of dy and v, the value it
   reads (the activation's input or output, as its row says), each an expression. */
const char *cg_act_grad_expr(Lower *L, int ga, const char *dy, const char *v);
/* bn_grad_params id's folded activation gradient (cg_bn_grad_act) at one element, as
   statements: g_, the gradient at the activation's input, from its output's gradient
   (dy, an element) and its input p_ recomputed from the BatchNorm's input (x) as
   bn_apply computes it, with the scale sc_ and shift sh_ of channel c (C text) that
   cg_bn_grad_act_scale declares (from stats, gamma and beta: the same bits); stored at
   dg. The scale's statement before a loop of them (GCC vectorises such a loop only
   with the loads outside it). */
const char *cg_bn_grad_act_scale(Lower *L, int C, const char *c);
const char *cg_bn_grad_act_text(Lower *L, int id, const char *x, const char *dy, const char *dg);
/* The store every producer an activation can fuse into ends in (a convolution of any form, a linear
   layer, BatchNorm, add, mul, sub): its value val at ptr[idx] (ptr: y, or a pointer into y), one
   statement: val itself; through the fused activation in place; or, where the activation's gradient
   reads its input (cg_act_beside), val there and the activation at the same place of ya, the
   activation's own buffer, which the kernel takes as "=ya" (cg_conv_kernel adds it for convolutions) */
const char *cg_store(Lower *L, int id, const char *ptr, const char *idx, const char *val);
const char *cg_store_vec(Lower *L, int id);   /* the store as a vector form of v (mgc_f16), or NULL: none */
void cg_lower_activation_grad(Lower *L, int id);   /* relu_grad, sigmoid_grad, tanh_grad */
void cg_lower_binary(Lower *L, int id);            /* add, mul, sub (mul and sub broadcast) */
void cg_lower_neg(Lower *L, int id);
void cg_lower_concat(Lower *L, int id);            /* layout.c */
void cg_lower_channel_slice(Lower *L, int id);
void cg_lower_sum_to(Lower *L, int id);            /* a broadcast's gradient */
void cg_lower_reduce(Lower *L, int id);            /* tokens.c: sum, mean along a dimension */
void cg_lower_softmax(Lower *L, int id);           /* softmax along a dimension, and its gradient */
void cg_lower_const(Lower *L, int id);
/* elementwise.c: in a loop over (n, c) planes, c and channel c's BatchNorm as y = x * scale + shift
   (the add's fused BatchNorm apply, and norm.c's bn_apply) */
void cg_bn_scale_shift(Lower *L, int C);
/* The same statements as text, of the plane index named `plane` (c, scale, shift declared) */
const char *cg_bn_scale_shift_text(Lower *L, int C, const char *plane);
/* lower.c: the table's other entries */
void cg_lower_input(Lower *L, int id);             /* input, labels: filled by the host */
void cg_lower_view(Lower *L, int id);              /* reshape, slice: their input's buffer */
void cg_lower_sgd(Lower *L, int id);               /* one parameter's update, or a fused group's */
void cg_lower_adamw(Lower *L, int id);
void cg_lower_dropout_mask(Lower *L, int id);
/* conv_common.c: what the convolution forms share */
ConvGeom cg_conv_geom(const Graph *g, int id);     /* the geometry of any of the three */
/* A convolution's value v as its store writes it: through the activation fused into it (its ReLU, or in
   an evaluation graph any other: cg_fuse), else v */
const char *cg_conv_act(Lower *L, int id, const char *v);
/* cg_kernel for a convolution's forward kernel: its buffers, and "=ya" where cg_act_beside says */
Step *cg_conv_kernel(Lower *L, int id, const char *what, Dim work, int nargs, const int *b, const char *const *names);
/* a tap's offset, "k" or "(k * D)"; ", 8 groups, dilation 2" for kernels' comments ("" for neither) */
const char *cg_dilated(Lower *L, const char *k, int D);
const char *cg_groups_dilation(Lower *L, const ConvGeom *G);
/* dy [N, O, P] -> [N*P, O], once per gradient buffer (the vector form's weight gradient and
   input gradient share it; the pooled weight gradient takes its input so) */
int cg_conv_channels_last(Lower *L, int id, int dy_node);
/* a weight gradient's loop over CG_WGROUPS groups of examples and their chunks (chunked, Winograd) */
void cg_group_chunks(Lower *L, long per_group, int NB, long cols);
/* in a chunked forward's loop, the chunk's BatchNorm partial sums per channel
   (its mean and sum of squared deviations) over nseg runs of len floats at seg (chunked, Winograd) */
void cg_chunk_stats(Lower *L, int O, const char *seg, const char *nseg, const char *len, const char *shift);
/* conv.c */
void cg_lower_conv(Lower *L, int id);              /* conv2d, conv2d_grad_x, conv2d_grad_w */
/* conv_chunked.c: CONV_CHUNKED's three ops; examples per chunk */
void cg_conv_chunked_forward(Lower *L, int id, const ConvGeom *G);
void cg_conv_chunked_grad_x(Lower *L, int id, const ConvGeom *G);
void cg_conv_chunked_grad_w(Lower *L, int id, const ConvGeom *G);
int  cg_chunk_examples(const ConvGeom *G);
bool cg_chunked_wgroups_fit(const ConvGeom *G);
/* winograd.c: CONV_WINOGRAD's three ops; where it applies (3x3, stride 1, padding 1);
   whether its weight gradient's groups fit in CG_WGROUPS_MAX_FLOATS; examples per chunk */
void cg_lower_conv_winograd(Lower *L, int id, const ConvGeom *G);
bool cg_winograd_applies(int k, int stride, int padding);
bool cg_winograd_grad_w_fits(const ConvGeom *G);
long cg_winograd_tiles(const ConvGeom *G);         /* 2x2 output tiles per map */
int  cg_winograd_examples(const ConvGeom *G);
/* linear.c */
void cg_lower_linear(Lower *L, int id);
void cg_lower_linear_grad_x(Lower *L, int id);
void cg_lower_linear_grad_w(Lower *L, int id);
void cg_lower_bias_grad(Lower *L, int id);
/* pool.c */
void cg_lower_window_pool(Lower *L, int id);       /* maxpool2d, avgpool2d and their gradients */
void cg_lower_global_avgpool(Lower *L, int id);
void cg_lower_global_avgpool_grad(Lower *L, int id);
void cg_lower_global_maxpool(Lower *L, int id);
void cg_lower_global_maxpool_grad(Lower *L, int id);
void cg_lower_adaptive_avgpool(Lower *L, int id);
void cg_lower_adaptive_avgpool_grad(Lower *L, int id);
void cg_lower_upsample(Lower *L, int id);
void cg_lower_matmul(Lower *L, int id);      /* codegen/matmul.c */
void cg_lower_transpose(Lower *L, int id);   /* codegen/tokens.c */
void cg_lower_select(Lower *L, int id);
void cg_lower_select_grad(Lower *L, int id);   /* and sum's and mean's (reduce_grad) */
void cg_lower_attn_stats(Lower *L, int id);   /* codegen/attention.c */
void cg_lower_attention(Lower *L, int id);
void cg_lower_attn_delta(Lower *L, int id);
void cg_lower_attn_grad(Lower *L, int id);
void cg_lower_upsample_grad(Lower *L, int id);
/* norm.c */
void cg_lower_bn_stats(Lower *L, int id);
/* norm.c: the bn_running_update its statistics' kernel does too, or -1 */
int cg_fused_running(const Lower *L, int stats);
/* norm.c: stats [3, C] from per-slice means and sums of squared deviations (the kernel) */
Step *cg_bn_stats_combine(Lower *L, int id, const char *what, int C, int part, const char *slices, const char *count,
                          const char *how);
/* norm.c: bn_stats from a chunked convolution's partial sums */
void cg_lower_bn_stats_chunks(Lower *L, int id);
/* pool.c: the max pool of one plane src [H, W] -> dst [OH, OW], inside a kernel's loop. */
void cg_max_pool_plane(Lower *L, const char *src, const char *dst, int K, int S, int P, int H, int W, int OH, int OW,
                       bool nan_free, int ind);
/* pool.c: in a loop over 2x2 windows with a0..a3 declared, m (their maximum) and e0..e3
   (the first maximum, the one a gradient goes to); nan_free: the values are a ReLU's. */
void cg_first_max_2x2(Lower *L, int indent, bool nan_free);
void cg_lower_bn_eval_stats(Lower *L, int id);
void cg_lower_ln_stats(Lower *L, int id);          /* layernorm.c */
void cg_lower_ln_apply(Lower *L, int id);
void cg_lower_ln_grad_params(Lower *L, int id);
void cg_lower_ln_grad_x(Lower *L, int id);
void cg_lower_bn_apply(Lower *L, int id);
void cg_lower_bn_grad_params(Lower *L, int id);
void cg_lower_bn_grad_x(Lower *L, int id);
void cg_lower_bn_running(Lower *L, int id);
void cg_lower_bn_sync(Lower *L, int id);           /* --sync-bn's bn_sum, bn_sqdev, bn_finish */
/* loss.c */
void cg_lower_xent(Lower *L, int id);              /* softmax_cross_entropy and correct (accuracy) */
void cg_lower_xent_grad(Lower *L, int id);
/* dp.c */
void cg_dp_prepare(Lower *L);                      /* bucket buffers, the gradients' places in them */
void cg_dp_before(Lower *L, int id);               /* waits for the buckets node id reads */
void cg_dp_after(Lower *L, int id);                /* starts the buckets node id completes */
void cg_dp_finish(Lower *L);                       /* waits for any bucket not waited yet */
/* --shard-update: update node id lowered as its part of its bucket's sharded update (the
   bucket's last: the kernel and the parameters' all-gather), scalars the optimizer's; false
   where id is not sharded (lowered as ever) */
bool cg_shard_update(Lower *L, int id, int scalars);
static inline bool cg_sharded(const Lower *L, int id) { return L->shard_bucket && L->shard_bucket[id] >= 0; }
void cg_lower_allreduce(Lower *L, int id);

#endif
