/*
** The kernel builder, private to codegen/: the lowering context (Lower) and
** what every op family makes with it: buffers and steps, the text of a
** kernel (its header, body and end), grouped and sliced kernels, literals,
** GEMM steps, and the buffers of outputs and parameters. It needs nothing
** of codegen/ but the passes' decisions (codegen.h): the op families
** (codegen/lower_internal.h) stand on it, and codegen/lower.c, which walks the
** graph, above them.
*/
#ifndef MGC_KERNEL_H
#define MGC_KERNEL_H
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
    int *bucket_buf;  /* IR bucket -> its buffer */
    /* --shard-update (codegen/dp.c) */
    int *shard_bucket;   /* update node -> the bucket it updates a slice of, or -1 */
    int *shard_last;     /* IR bucket -> its last update node */
    bool *shard_state;   /* node -> an optimizer state the sharded update holds in slices (no buffer of its own) */
    int *gather_coll;    /* IR bucket -> the all-gather of its parameters, or -1 */
    int votes_coll;      /* the stop votes' own sum, or -1 */
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

/* ---- buffers and steps ---- */
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
   rounding it to bf16 anyway (kernel.c says which). */
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
/* Kernel text with named holes, for a body whose values a positional printf list
   would hide. The template is the kernel's C text as it reads, each value a hole:
   `$name` (a name is letters, digits and '_') or `${name}` where a letter or digit
   follows (`${len}L`); `$$` is a '$'. Everything else is text: C's braces, and '%'
   (a template is no printf format: `i % $C`). The values are bindings, listed after
   the template: cg_n(name, v) a number, formatted as printf's "%d" for an int or
   "%ld" for a long (its type picks, so the text is what a format would have made);
   cg_s(name, text) a string. cg_text writes the filled template into the open
   kernel, cg_str returns it (the arena's). A hole no binding fills, a binding no
   hole uses, or a name bound twice is a bug of the lowering: an internal error that
   names it and the kernel. cg_fill is the filling itself: the text to f, or false
   and the error in err (the tests ask it).
     cg_text(L, "    for (int o = 0; o < $O; o++) { y[plane * ${len}L + o] = 0.0f; }\n",
             cg_n("O", O), cg_n("len", (long)H * W));  */
typedef struct CgHole {
    const char *name;   /* NULL: the end of the list */
    const char *text;   /* cg_s's string, or NULL: num */
    char num[24];       /* cg_n's number, formatted */
} CgHole;
CgHole cg_hole_int(const char *name, int v);
CgHole cg_hole_long(const char *name, long v);
CgHole cg_s(const char *name, const char *text);
#define cg_n(name, v) _Generic((v), int: cg_hole_int, long: cg_hole_long)(name, v)
#define cg_text(L, tmpl, ...) cg_text_holes(L, tmpl, (const CgHole[]){ __VA_ARGS__, { NULL, NULL, { 0 } } })
#define cg_str(L, tmpl, ...) cg_str_holes(L, tmpl, (const CgHole[]){ __VA_ARGS__, { NULL, NULL, { 0 } } })
void        cg_text_holes(Lower *L, const char *tmpl, const CgHole *holes);
const char *cg_str_holes(Lower *L, const char *tmpl, const CgHole *holes);
bool        cg_fill(FILE *f, const char *tmpl, const CgHole *holes, char *err, size_t errlen);
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
   (see kernel.c): the reductions' inner loop, written once. */
void  cg_lane_sums(Lower *L, const char *type, const char *lanes, int C, int HW, int nacc, const char *const *accs,
                   const char *reads, const char *body);
/* body ("A0 += x[at]; A1 += ...") with each An (n < nacc) named accs[n] followed by suffix ("_l[l]") */
const char *cg_name_accs(Lower *L, const char *body, int nacc, const char *const *accs, const char *suffix);
/* Node id's place among the graph's nodes of op `op` before it (0 for the first): the seed key
   of the ops whose kernels draw from the run's seed (dropout masks, attention), the same
   whichever step makes them */
long cg_op_place(const Graph *g, int id, Op op);
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
/* In a kernel's FOR_EACH: the coordinates c0, c1, ... of element `index` (a C expression) of a
   tensor of shape s, as const longs; and a C expression for the element at those coordinates in a
   tensor of shape t that broadcasts to s (its dimensions of 1 at coordinate 0). */
void cg_coords(Lower *L, const Shape *s, const char *index);
const char *cg_index_of(Lower *L, const Shape *t);
/* The buffer of a param or state node (the Store's), made once: at its node's turn, or earlier by a
   kernel that reads it first (codegen/conv_gemm.c's gemm_weights). */
void cg_lower_persistent(Lower *L, int id);        /* param, state: the Store's */

#endif
