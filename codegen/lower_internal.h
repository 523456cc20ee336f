/*
** Lowering's shared internals, private to codegen/: the lowering context and
** the helpers every op family uses to make buffers, steps and kernel text.
**
** The driver (codegen/lower.c) walks the graph and calls one lowering function
** per op; the op families live beside their gradients:
**   elementwise.c  relu/sigmoid/tanh, add/mul, const, dropout, and their gradients
**   conv.c         convolutions: the choice among every form, the store every form
**                  ends in, and the dispatch through the table of forms (conv_forms.h)
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
*/
#ifndef MGC_LOWER_INTERNAL_H
#define MGC_LOWER_INTERNAL_H
#include "codegen.h"

typedef struct Lower {
    const Graph *g;
    Program *p;
    const CgDecisions *dec;   /* the fusion and convolution passes', asked through cg_fused_into, cg_act, ... (never NULL here) */
    FILE *src;        /* kernel bodies (open_memstream) */
    int *col;         /* conv node -> its im2col buffer (kept for the weight gradient) */
    int *dyt;         /* gradient node -> its [O, N*P] transposed copy, made once */
    int *dyc;         /* gradient node -> its [N*P, O] channels-last copy, made once */
    int *wbf;         /* weight node -> its copy rounded to bf16 for the GEMMs (cg_packs_bf16), made once */
    int *part;        /* bn_stats node -> the partial sums its convolution's kernel writes, or -1 */
    int open_kernel;        /* the kernel step whose text is being written, or -1 */
    int node_now;           /* the node being lowered (its Node.mm picks the CBLAS GEMM a kernel calls) */
    int *sgd_last;          /* a group of fused SGD updates: its first member -> its last, else -1 */
    /* data parallelism (codegen/dp.c) */
    int *in_bucket;   /* node -> the bucket buffer its output lives in, or -1 */
    int *bucket_at;   /* node -> its offset in that bucket (floats) */
    int *bucket_coll; /* IR bucket -> its collective */
    int *ready;       /* IR bucket -> the node after whose steps its collective starts */
    bool *waited;     /* IR bucket -> its wait step has been emitted */
} Lower;

/* The GEMM a C kernel of the node being lowered calls: CBLAS's, or, where the
   node multiplies in bf16 (Node.mm), mgc's (runtime/bgemm.c: the operands
   rounded to bf16 as they are packed, the products summed in fp32). */
static inline const char *cg_sgemm_fn(const Lower *L)
{
    return L->g->nodes[L->node_now].mm == DT_BF16 ? "mgc_sbgemm" : "cblas_sgemm";
}

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

/* The size of a shape in floats, as a Dim (batch-sized when dim 0 is N). */
static inline Dim dim_of(const Shape *s)
{
    Dim d = { 1, false };
    for (int k = 0; k < s->nd; k++) {
        if (s->d[k] == IR_BATCH) d.batch = true;
        else d.c *= s->d[k];
    }
    return d;
}

static inline Dim dimc(long c) { return (Dim){ c, false }; }   /* c */
static inline Dim dimn(long c) { return (Dim){ c, true }; }    /* c * N */

/* The buffer holding a node's output. */
static inline int buf_of(const Lower *L, int node) { return L->p->node_buf[node]; }

/* ---- buffers and steps (codegen/lower.c) ---- */
int   cg_new_buf(Lower *L, BufKind kind, Dim size, const char *name, int node);
Step *cg_new_step(Lower *L, StepKind kind, int node);
/* A buffer of `elems` bf16 values (Buf.bf16): a GEMM's operand, packed rounded (GPUs, --precision bf16). */
int   cg_new_bf16_buf(Lower *L, BufKind kind, Dim elems, const char *name, int node);
/* Whether the node being lowered stores its GEMMs' packed operands as bf16: it multiplies in
   bf16 (Node.mm) on GPUs, where the GEMM is cuBLAS's on CUDA_R_16BF matrices (half the bytes
   of the packing kernels and the GEMM). The C target rounds as its GEMMs pack (mgc_sbgemm). */
static inline bool cg_packs_bf16(const Lower *L, int node)
{
    return !L->dec->cpu_only && L->g->nodes[node].mm == DT_BF16;
}
/* A new activation buffer for the node's output, recorded as its buffer (a
   piece of its bucket's buffer when the node is a gradient summed in a bucket;
   in bf16 where cg_stores_bf16). */
int   cg_out_buf(Lower *L, int node);
/* GPUs under --precision bf16: the node's output stored in bf16, every reader
   rounding it to bf16 anyway (codegen/conv_gemm.c says which). */
bool  cg_stores_bf16(const Lower *L, int u);
/* Starts a kernel: the step, and the function header with its buffer
   arguments named as given ("y", "x", ...; a leading '=' marks an output).
   The body follows through cg_body(); cg_end_kernel() closes it. */
Step *cg_kernel(Lower *L, int node, const char *what, Dim work, int nargs, const int *bufs, const char *const *names);
/* A kernel's buffer arguments, in the kernel's order, each with its name in the
   kernel's text (a leading '=': one it writes), for the kernels whose arguments
   depend on what they take: cg_arg adds one (its name formatted) and returns its
   index; cg_kernel_args starts the kernel. More than CG_MAXARGS is a bug of the
   lowering that asks: mgc stops with an internal error naming the kernel. */
typedef struct CgArgs {
    int n;
    int buf[CG_MAXARGS];
    const char *name[CG_MAXARGS];
} CgArgs;
int   cg_arg(Lower *L, CgArgs *a, int buf, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
Step *cg_kernel_args(Lower *L, int node, const char *what, Dim work, const CgArgs *a);
/* Grouped kernels: one launch for several independent pieces (a weight's bf16 copy,
   a zero gradient, a parameter's update) where a launch each would cost more than a
   piece. cg_take_ahead collects the members: out[0] = first, then for each node
   after `from` the one take() names (the node itself or one of its inputs; -1:
   none), each once, up to max; returns how many. cg_group_kernel starts the kernel,
   its work all the pieces' elements (count[k] each); its body is a loop a piece,
   one after another with no barrier between (their elements are independent: on
   the C target each thread takes its contiguous share of each piece, on CUDA each
   is a grid-stride loop); cg_group_piece writes a loop of one statement of i. */
int   cg_take_ahead(Lower *L, int from, int first, int max, int (*take)(Lower *L, int node), int *out);
Step *cg_group_kernel(Lower *L, int node, const char *what, const CgArgs *a, const long *count, int n);
void  cg_group_piece(Lower *L, long count, int node, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void  cg_body(Lower *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void  cg_end_kernel(Lower *L);
/* A number as a literal of the kernels' text: a float's ("0.100000001f", 9 digits:
   every float32 reads back as itself), or a double's ("1.00000001e-05"). Never
   inf or nan: every value a kernel spells is checked finite in float32 here (the
   front end and the options refuse a user's value that would not be, so one
   that is not is mgc's bug: an internal error). Every float a kernel's text
   holds goes through these. */
const char *cg_f32(Lower *L, double v);
const char *cg_f64(Lower *L, double v);
/* The work count as C text: "150L * N" or "150L". */
const char *cg_work_str(Lower *L, Dim d);
/* GPUs: a loop over `rows` rows of len elements each (planes, a tap's stretch of
   columns) as one iteration per element, the GPU's shape (a thread per element:
   rows alone, a thread each, are too few threads, and neighbouring threads
   would touch addresses a row apart). Declares `long row` and `int at` (its
   index in the row) from the iteration, then `setup` (statements of row) and
   `stmt` (of at) each iteration. The kernel's work is cg_rows_work(). */
Dim cg_rows_work(Dim rows, long len);
void cg_rows_body(Lower *L, Dim rows, long len, const char *setup, const char *stmt);
/* Sums over each channel c of an [N, C, HW] tensor, in independent lanes
   (see lower.c): the reductions' inner loop, written once. */
void  cg_lane_sums(Lower *L, const char *type, const char *lanes, int C, int HW, int nacc, const char *const *accs,
                   const char *reads, const char *body);
/* GPUs: the slices of the batch a per-channel reduction over C channels is split
   into, a block each, so that few channels still fill the GPU (about
   CG_FILL_BLOCKS blocks in all, at most 64 slices); 1 on the C target. */
int cg_batch_slices(const Lower *L, int C);
/* The kernel of such a split: `what`, a block per (slice s, channel c), i = s * C + c,
   `const long s, c, n0, n1` declared (the slice's examples [n0, n1)), after `head` (the
   kernel's comment and declarations); its arguments =part (returned: `per` floats a
   block, slice s of channel c at (s * C + c) * per), =arrivals (a counter a channel),
   then `in`'s (inputs, and the outputs the combination writes). The caller writes the
   block's body, then cg_slices_combine() its combination and cg_end_kernel(). */
int cg_slices_kernel(Lower *L, int id, const char *what, int C, int S, long per, const CgArgs *in, const char *head);
/* The channel's last block to finish (BLOCK_LAST on its arrivals counter) combines its
   S slices: `combine`, statements of c (at 16 spaces) run by that block's leader, read
   the parts in slice order, so the result does not depend on which block is last.
   One launch where a second kernel would cost its launch for a few hundred sums. */
void cg_slices_combine(Lower *L, int S, const char *combine);
/* A GEMM step, row-major: C[m,n] = op(A)[m,k] . op(B)[k,n] + beta * C. */
Step *cg_gemm(Lower *L, int node, bool ta, bool tb, Dim m, Dim n, Dim k, int a, Dim lda, int b, Dim ldb,
              float beta, int c, Dim ldc);

/* ---- the op families: one function per op (or per group of like ops) ---- */
/* elementwise.c */
void cg_lower_activation(Lower *L, int id);        /* relu, sigmoid, tanh */
const char *cg_fused_act(Lower *L, int id, const char *v);   /* v through id's fused activation (cg_act) */
/* A convolution's value v as its store writes it: through the activation fused into it (its ReLU, or in
   an evaluation graph any other: cg_fuse), else v (conv.c) */
const char *cg_conv_act(Lower *L, int id, const char *v);
/* The store every producer an activation can fuse into ends in (a convolution of any form, a linear
   layer, BatchNorm, add, mul, sub): its value val at ptr[idx] (ptr: y, or a pointer into y), one
   statement: val itself; through the fused activation in place; or, where the activation's gradient
   reads its input (cg_act_beside), val there and the activation at the same place of ya, the
   activation's own buffer, which the kernel takes as "=ya" (cg_conv_kernel adds it for convolutions) */
const char *cg_store(Lower *L, int id, const char *ptr, const char *idx, const char *val);
/* cg_kernel for a convolution's forward kernel: its buffers, and "=ya" where cg_act_beside says (conv.c) */
Step *cg_conv_kernel(Lower *L, int id, const char *what, Dim work, int nargs, const int *b, const char *const *names);
void cg_lower_activation_grad(Lower *L, int id);   /* relu_grad, sigmoid_grad, tanh_grad */
void cg_lower_binary(Lower *L, int id);            /* add, mul, sub (mul and sub broadcast) */
void cg_lower_neg(Lower *L, int id);
void cg_lower_concat(Lower *L, int id);            /* layout.c */
void cg_lower_channel_slice(Lower *L, int id);
/* In a kernel's FOR_EACH: the coordinates c0, c1, ... of element `index` (a C expression) of a
   tensor of shape s, as const longs; and a C expression for the element at those coordinates in a
   tensor of shape t that broadcasts to s (its dimensions of 1 at coordinate 0). */
void cg_coords(Lower *L, const Shape *s, const char *index);
const char *cg_index_of(Lower *L, const Shape *t);
void cg_lower_sum_to(Lower *L, int id);            /* a broadcast's gradient */
void cg_lower_const(Lower *L, int id);
/* lower.c: the table's other entries */
void cg_lower_input(Lower *L, int id);             /* input, labels: filled by the host */
void cg_lower_persistent(Lower *L, int id);        /* param, state: the Store's */
void cg_lower_view(Lower *L, int id);              /* reshape, slice: their input's buffer */
void cg_lower_sgd(Lower *L, int id);               /* one parameter's update, or a fused group's */
void cg_lower_adamw(Lower *L, int id);
void cg_lower_dropout_mask(Lower *L, int id);
/* conv.c */
void cg_lower_conv(Lower *L, int id);              /* conv2d, conv2d_grad_x, conv2d_grad_w */
ConvGeom cg_conv_geom(const Graph *g, int id);     /* the geometry of any of the three */
/* conv_direct.c: a tap's offset, "k" or "(k * D)"; ", 8 groups, dilation 2" for kernels' comments ("" for neither) */
const char *cg_dilated(Lower *L, const char *k, int D);
const char *cg_groups_dilation(Lower *L, const ConvGeom *G);
/* conv_chunked.c: CONV_CHUNKED's three ops; examples per chunk */
void cg_conv_chunked_forward(Lower *L, int id, const ConvGeom *G);
void cg_conv_chunked_grad_x(Lower *L, int id, const ConvGeom *G);
void cg_conv_chunked_grad_w(Lower *L, int id, const ConvGeom *G);
int  cg_chunk_examples(const ConvGeom *G);
bool cg_chunked_wgroups_fit(const ConvGeom *G);
/* conv_chunked.c: a weight gradient's loop over CG_WGROUPS groups of examples and their chunks */
void cg_group_chunks(Lower *L, long per_group, int NB, long cols);
/* conv_chunked.c: in a chunked forward's loop, the chunk's BatchNorm partial sums per channel
   (its mean and sum of squared deviations) over nseg runs of len floats at seg */
void cg_chunk_stats(Lower *L, int O, const char *seg, const char *nseg, const char *len, const char *shift);
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
void cg_lower_upsample_grad(Lower *L, int id);
/* norm.c */
void cg_lower_bn_stats(Lower *L, int id);
/* norm.c: in a loop over (n, c) planes, c and channel c's BatchNorm as y = x * scale + shift */
void cg_bn_scale_shift(Lower *L, int C);
/* The same statements as text, of the plane index named `plane` (c, scale, shift declared) */
const char *cg_bn_scale_shift_text(Lower *L, int C, const char *plane);
/* norm.c: the bn_running_update its statistics' kernel does too, or -1 */
int cg_fused_running(const Lower *L, int stats);
/* norm.c: stats [3, C] from per-slice means and sums of squared deviations (the kernel) */
Step *cg_bn_stats_combine(Lower *L, int id, const char *what, int C, int part, const char *slices, const char *count,
                          const char *how);
/* conv_chunked.c: bn_stats from a chunked convolution's partial sums */
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
void cg_lower_allreduce(Lower *L, int id);

#endif
