/*
** Code generation: lowering the IR to a Program, a flat list of steps over
** buffers, and emitting the kernels' source text.
**
** A step is either a generated kernel (source text, compiled at run time) or
** a GEMM (BLAS on the CPU, cuBLAS on CUDA). Kernel bodies are written once,
** against a small set of macros (KERNEL, FOR_EACH, KArgs; FOR_EACH_BLOCK,
** BLOCK_LOOP, BLOCK_SUM for reductions); a per-target prelude defines them: a
** parallel loop in C, a grid-stride loop (a block per reduction) in CUDA.
** So the CPU backend runs the very kernel text that NVRTC compiles.
**
** Sizes that depend on the batch are Dims: c, or c * N when batch is set.
*/
#ifndef MGC_CODEGEN_H
#define MGC_CODEGEN_H
#include "ir.h"
#include <stdint.h>

typedef enum Target { TARGET_C, TARGET_CUDA } Target;

typedef struct Dim { long c; bool batch; } Dim;     /* value = batch ? c * N : c */
static inline long cg_dim(Dim d, long n) { return d.batch ? d.c * n : d.c; }

typedef enum BufKind {
    BUF_PERSISTENT,   /* parameter or state: lives across steps, named, shared between programs */
    BUF_INPUT,        /* filled by the host before a step: the images or the labels */
    BUF_ACT,          /* activation or gradient: written each step */
    BUF_WORK,         /* scratch of one op (im2col columns, transposed gradients) */
    BUF_VIEW,         /* aliases another buffer at an offset */
    BUF_KEEP,         /* scratch that keeps its value from one step to the next (the sliced reductions'
                         arrival counters): zero when allocated, a memory of its own, outside the region
                         of slots another program may share */
} BufKind;

typedef struct Buf {
    BufKind kind;
    Dim size;                 /* floats (a bf16 buffer: half its elements, rounded up, per example) */
    bool bf16;                /* elements stored as bf16 bits (mgc_bf16; cuBLAS's CUDA_R_16BF): GPUs under --precision bf16,
                                 a GEMM's packed operands (im2col columns, the transposed gradient, a weight's copy),
                                 written rounded by the kernel that makes them and read only by GEMMs */
    const char *name;         /* BUF_PERSISTENT: parameter name; else a description */
    int node;                 /* IR node it holds, or -1 */
    const char *origin;       /* that node as the user sees it: "%12 conv2d [N,64,7,7] (net.net:9)", or NULL */
    int alias, offset;        /* BUF_VIEW: base buffer id and offset in floats */
    bool pinned;              /* read by the host after a run (loss, logits, gradients): never shared */
    /* BUF_PERSISTENT: what the runtime needs to create and initialise it */
    Shape shape;
    InitKind init;
    int fan_in;               /* INIT_UNIFORM_FAN_IN */
    float init_arg;           /* INIT_CONSTANT's value, INIT_NORMAL's standard deviation */
    bool trainable;           /* a parameter (else state: running statistics, momentum) */
    /* --shard-update: a parameter of gradient bucket `pack` lives at pack_at in one block of pack_floats
       holding the bucket's parameters as the bucket holds their gradients (-1: none); a state buffer
       holds this replica's slice of bucket shard_of's optimizer state (-1: none) */
    int pack, shard_of;
    long pack_at, pack_floats;
} Buf;

/* What a collective does: the sum over every replica, or (--shard-update) its two halves, over
   a buffer of R x chunk floats, replica KArgs.replica's chunk its own (runtime/comm.h). */
typedef enum CollKind { COLL_ALLREDUCE, COLL_REDUCE_SCATTER, COLL_ALLGATHER } CollKind;
/* Its name in printouts: "allreduce", "reduce-scatter", "all-gather". */
static inline const char *cg_coll_name(CollKind k)
{
    return k == COLL_REDUCE_SCATTER ? "reduce-scatter" : k == COLL_ALLGATHER ? "all-gather" : "allreduce";
}

/* A collective: the sum of buffer src over every replica, into dst (in place
   when dst == src). Gradient buckets are in place; --sync-bn's sums are not. */
typedef struct Collective {
    int src, dst;             /* buffer ids */
    long floats;
    const char *what;         /* "bucket 0: fc3.bias fc3.weight ...", "bn1 sums" */
    CollKind kind;
} Collective;

/* --shard-update: one gradient bucket's parameters and optimizer state. The parameters lie side
   by side in one block as the bucket holds their gradients (Buf.pack); each replica updates its
   chunk of it and holds only that chunk's state (state[k], [max chunk] each); checkpoints gather
   and scatter the state by parameter (member k: names[k] at at[k], numel[k] floats). */
typedef struct ShardPack {
    long floats, chunk;       /* the bucket's floats; each replica's chunk of them, ceil(floats / R) (the buffers hold R x chunk) */
    int nmembers;
    const char **names;
    long *at, *numel;
    int nstates;
    const char *suffix[2];    /* "momentum_buffer"; "exp_avg", "exp_avg_sq" */
    int state[2];             /* their buffers */
    int base;                 /* the buffer of the parameter at the block's start: the block's address (-1: none yet) */
} ShardPack;

/* A parameter and where its gradient is after a step (summed across replicas). */
typedef struct ProgParam { int buf, grad; } ProgParam;

typedef enum StepKind {
    STEP_KERNEL,
    STEP_GEMM,
    STEP_ALLREDUCE,           /* starts collective s->coll; the step after it does not wait for it */
    STEP_WAIT,                /* waits for collective s->coll to finish */
} StepKind;

#define CG_MAXARGS 16
#define CG_BLOCK 256          /* CUDA threads per block (FOR_EACH_BLOCK kernels and grid-stride ones) */
#define CG_FILL_BLOCKS 264    /* blocks that fill a GPU: two per SM of an H100 or H200 (132 SMs) */
typedef struct Step {
    StepKind kind;
    int node;                 /* IR node this step implements (part of) */
    /* STEP_KERNEL */
    const char *fn;           /* kernel function name */
    const char *sym;          /* the function that runs it: fn, or the fn of an earlier kernel whose code is
                                 the same but for names and comments (compiled once; cg_share_kernels) */
    bool shared;              /* sym is compiled with Program.kernels_from, as its step shared_step (the
                                 evaluation program runs the training program's forward kernels) */
    int shared_step;
    int nargs;
    int args[CG_MAXARGS];     /* buffer ids, in the kernel's a.t[] order */
    unsigned outs;            /* bit j set: the kernel writes a.t[j] */
    bool seeded;              /* needs a fresh random seed each run (dropout) */
    unsigned long long seed_key;   /* a seeded step's key in its seed (0: its index): the kernels of one
                                      attention op share the op's, so its backward sees its forward's masks */
    bool sgd;                 /* an optimizer's update: reads its scalars from Program.opt_scalars */
    long src_begin, src_end;  /* its text in Program.source: [begin, end) */
    Dim work;                 /* iterations of the kernel's FOR_EACH (threads / grid size) */
    bool heavy;               /* each iteration loops over the batch: worth threads even when few */
    long grain;               /* elements an iteration touches (0: one); the runtime splits work*grain */
    bool blocks;              /* a reduction kernel (FOR_EACH_BLOCK): on CUDA each iteration is one block of
                                 CG_BLOCK threads that share its inner loops (BLOCK_LOOP, BLOCK_SUM) */
    long touch;               /* floats of each argument the kernel touches at most (0: all of each): --shard-update's
                                 chunk of a bucket (the GPU cost model's bytes) */
    bool c_only;              /* C target only (CgOptions.cpu_only): calls CBLAS, or splits its work
                                 between the threads itself (a.thread, a.nthreads) */
    /* STEP_GEMM, row-major: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C */
    bool ta, tb;
    Dim m, n, k, lda, ldb, ldc;
    int a, b, c;              /* buffer ids */
    float alpha, beta;
    bool bf16;                /* the node multiplies in bf16 (Node.mm): A and B rounded to bf16 as they are read,
                                 the products summed in fp32 (CPU: mgc_sbgemm; cuBLAS: its fast bf16 compute) */
    bool ab16;                /* A and B are bf16 buffers (Buf.bf16: cuBLAS reads them as CUDA_R_16BF, half the bytes); C fp32 */
    int batch;                /* > 1: that many GEMMs, the i-th on A + i * sa, B + i * sb, C + i * sc (a grouped
                                 convolution's groups: cuBLAS's strided batched GEMM); 0 or 1: one */
    Dim sa, sb, sc;
    /* STEP_ALLREDUCE, STEP_WAIT */
    int coll;                 /* index in Program.colls */
} Step;

/* What the passes before lowering decided for one node (codegen/fuse.c keeps
   the record; everyone else asks it through the cg_ functions after CgDecisions). */
typedef struct CgNode CgNode;
typedef struct CgDecisions CgDecisions;

typedef struct Program {
    Arena *arena;
    const Graph *graph;
    Buf *bufs;
    int nbufs, capbufs;
    Step *steps;
    int nsteps, capsteps;
    int *node_buf;            /* node id -> buffer id holding its output (-1: none) */
    const CgDecisions *decided;   /* the fusion and convolution passes' decisions (cg_fused_into, cg_conv_why, ...) */
    char *source;             /* all kernels' bodies, without prelude */
    const struct Program *kernels_from;   /* the program some kernels' code is compiled with (Step.shared), or NULL */
    int input, labels, loss, correct, logits;   /* buffer ids (-1 if absent) */
    int input_grad;           /* buffer of d loss / d input (check mode), or -1 */
    Shape input_shape;        /* the net's input, [N, C, H, W] */
    int classes;              /* outputs per example (logits' second dimension) */
    const char *net_name;
    Collective *colls;        /* the collectives, in the order every replica starts them */
    int ncolls;
    int control;              /* one float summed with the last bucket (a replica's vote to stop), or -1 */
    int opt_scalars;          /* the floats the host fills before every run, read by the update kernels
                                 (SGD: lr, momentum, weight decay; AdamW: lr, beta1, 1 - lr wd, beta2, eps,
                                 lr / (1 - beta1^t), sqrt(1 - beta2^t)): a rate that changes from step to step
                                 changes no kernel argument (a recorded CUDA graph stays valid); or -1 */
    int accumulate;           /* --accumulate K: the float the host sets before every run, read by each bucket's
                                 accumulation kernel (0: one batch a step; 1: the first micro-batch of a step,
                                 2: a middle one, 3: the last, summed and applied), or -1 */
    IrOptimizer opt;          /* the optimizer the updates were built with (their hyper-parameters) */
    ShardPack *packs;         /* --shard-update: per gradient bucket (npacks of them), else NULL */
    int npacks;
    bool packs_shareable;     /* --shard-update: every step's reads of a bucket's parameters end before a reduce-scatter
                                 whose end its update waits for, so replicas with one memory may share each block,
                                 each updating its chunk in place, the all-gather then a barrier (runtime/store.c) */
    ProgParam *params;        /* trainable parameters with a gradient, in the net's order */
    int nparams;
    long param_scalars;       /* trainable scalars, all parameters */
    int param_tensors;
    /* the memory plan (cg_plan_memory) */
    int *slot;                /* per buffer: its slot, or -1 (persistent buffers, views) */
    size_t *slot_bytes;
    int nslots;
    long plan_batch;          /* the examples the slots hold (0: not planned) */
    size_t plan_bytes, plan_naive_bytes;   /* with and without sharing */
    int plan_buffers;         /* buffers placed in slots */
} Program;

/* The buffer whose memory buffer b is: b, or the base a view aliases (-1 stays -1). */
static inline int cg_base_buf(const Program *p, int b)
{
    while (b >= 0 && p->bufs[b].kind == BUF_VIEW) b = p->bufs[b].alias;
    return b;
}

/* How a convolution runs (codegen/conv.c says when each is chosen). */
typedef enum ConvStrategy { CONV_DIRECT, CONV_VECTOR, CONV_GEMM, CONV_DENSE, CONV_CHUNKED, CONV_WINOGRAD } ConvStrategy;

/* Choices the driver makes for code generation (driver/main.c takes them
   from MGC_FUSE and MGC_CONV). Codegen reads no environment. */
typedef struct CgOptions {
    bool fuse;                /* fusion on (cg_fuse, and the lowering's own merges) */
    int conv;                 /* -1: choose per layer, else a forced ConvStrategy */
    bool cpu_only;            /* the program runs on CPU devices only: its kernels may be C only
                                 (CONV_CHUNKED calls CBLAS; reductions in memory order); never for
                                 CUDA, whose kernels are the same text */
} CgOptions;


/* The passes' decisions: one record per node (arena memory), asked through
   the functions below, set through the setters after them (codegen/fuse.c). */
struct CgDecisions {
    CgNode *node;             /* [graph's nodes]: fuse.c's alone */
    bool cpu_only;            /* CgOptions.cpu_only, for the lowering: kernels may take C-only forms */
    bool fuse;                /* CgOptions.fuse, for the lowering's own merges (cg_fused_running) */
};

/* ---- The questions. Each takes a node id and answers -1 (false, NULL) where
   nothing was decided. "x's kernel" is the kernel lowered for node x. */

/* The node whose kernel computes id too (id gets no kernel of its own; its value
   is in that kernel's buffer, or in one of its own that kernel makes), or -1. Of
   an SGD update: the first update of its group. */
int cg_fused_into(const CgDecisions *d, int id);
/* The activation (an Op) id's kernel applies to what it stores, its node, and
   whether ReLU is that activation. */
int cg_act(const CgDecisions *d, int id);
int cg_act_node(const CgDecisions *d, int id);
bool cg_relu_out(const CgDecisions *d, int id);
/* With an activation whose gradient reads its input: the activation's node, whose
   own buffer receives the activation while id's keeps the value as computed; -1
   where the activation is applied in place (or there is none). */
int cg_act_beside(const CgDecisions *d, int id);
/* The node whose value id's buffer holds once id's kernel ran: the activation
   applied in place, else id. */
int cg_holds(const CgDecisions *d, int id);
/* maxpool2d_grad: it routes only where its input was positive (a relu_grad fused). */
bool cg_relu_mask(const CgDecisions *d, int id);
/* A convolution or either gradient: its ConvStrategy (-1: not a convolution); conv2d:
   the form chosen and why, for --emit kernels. */
int cg_conv_form(const CgDecisions *d, int id);
const char *cg_conv_why(const CgDecisions *d, int id);
/* conv2d: the bn_stats whose partial sums its kernel writes; bn_stats: that conv2d. */
int cg_stats_of(const CgDecisions *d, int conv);
int cg_stats_by(const CgDecisions *d, int stats);
/* bn_apply or conv2d: the max pool its kernel computes too (of its ReLU output);
   maxpool2d: that bn_apply or conv2d. */
int cg_pool_of(const CgDecisions *d, int producer);
int cg_pool_by(const CgDecisions *d, int pool);
/* add: the bn_apply input it normalises itself, and the mul or sub input whose
   product or difference it computes as it reads (both fused into it). */
int cg_bn_into_add(const CgDecisions *d, int add);
int cg_ew_into_add(const CgDecisions *d, int add);
/* conv2d_grad_w: the 2x2 max-pool gradient (ReLU-masked) whose routing its kernel
   does, reading the pool's input and gradient, and the bias_grad it computes too. */
int cg_wgrad_pool(const CgDecisions *d, int wgrad);
int cg_wgrad_bias(const CgDecisions *d, int wgrad);
/* bn_grad_params: the activation gradient its kernel applies to the dy it reads (fused
   into it), the activation recomputed from the BatchNorm's input, stored into the
   gradient's own buffer (which bn_grad_x reads); and that bn_apply (whose gamma and
   beta it reads). -1 where none. */
int cg_bn_grad_act(const CgDecisions *d, int params);
int cg_bn_grad_act_bn(const CgDecisions *d, int params);
/* CPUs: attention_stats: the attention (its o) its kernel computes too, from the scores it has
   just made, or -1. attention_grad_q, _k or _v, the first of an op's: the op's gradient `which`
   (0 q, 1 k, 2 v) its kernel computes too (the others fused into it), from one pass over the
   scores, or -1 (none, or not grouped). */
int cg_attn_out(const CgDecisions *d, int stats);
int cg_attn_grad(const CgDecisions *d, int first, int which);
int cg_ln_apply(const CgDecisions *d, int stats);   /* ln_stats: the ln_apply its kernel computes too, or -1 */
/* dropout_mask: made by each reader (a mul, or the add it is fused into) as it reads, never stored */
bool cg_mask_inline(const CgDecisions *d, int mask);

/* ---- The setters, for the passes (fuse.c, conv.c); each sets both sides of a pair. */
void cg_set_conv(CgDecisions *d, int id, ConvStrategy form, const char *why);
/* Appends "; more" to conv2d id's why, if it has one (a on which it is made). */
void cg_add_conv_why(CgDecisions *d, Arena *a, int id, const char *more);
void cg_set_stats(CgDecisions *d, int conv, int stats);
void cg_set_pool(CgDecisions *d, int producer, int pool);

/* Whether a tensor of shape s broadcast to out ([N, C, H, W]) is indexed in a
   loop over out's (n, c) planes as ((n' * C' + c') * H'W' + k'): each of its
   batch and channel dimensions out's or 1, its positions out's or 1 x 1. */
bool cg_plane_indexable(const Shape *s, const Shape *out);

/* Nothing fused, no strategy chosen. */
void cg_decisions_init(CgDecisions *d, const Graph *g, Arena *a);
/* The fusion pass (codegen/fuse.c): an activation folded into the kernel before it
   (a convolution, a linear layer, BatchNorm, add, mul, sub), ReLU's gradient into a max
   pool's gradient, a max pool after BatchNorm + ReLU into the BatchNorm's kernel, a
   BatchNorm or a mul or sub whose only consumer is an add into the add's, (CPU
   programs) a 2x2 max pool's gradient into the weight gradient of the convolution
   before it, and the SGD updates of a bucket into groups, when opt->fuse. Requires: a
   verified graph. Produces: what cg_fused_into, cg_act*, cg_relu_mask, cg_pool_of/by,
   cg_bn_into_add, cg_ew_into_add and cg_wgrad_* answer. */
void cg_fuse(const Graph *g, const CgOptions *opt, CgDecisions *d);
/* The gradient bucket holding the gradient update node `sgd` (SGD or AdamW) reads (through
   slices and reshapes: BatchNorm's gamma and beta share a tensor), or -1 (codegen/fuse.c). */
int cg_grad_bucket(const Graph *g, int sgd);
/* The convolution pass (codegen/conv.c): how each convolution runs, forward
   and gradients alike (opt->conv forces one); with opt->fuse, the BatchNorm
   statistics that a chunked or Winograd convolution's kernel sums as it writes its
   output, and the 2x2 max pool that a direct convolution's kernel takes of its rows.
   Produces: what cg_conv_form, cg_conv_why, cg_stats_of/by answer, and cg_pool_of/by
   of direct convolutions. */
void cg_choose_convs(const Graph *g, const CgOptions *opt, CgDecisions *d);
/* Lowers nodes [0, g->n) of g to steps and buffers; emits the kernel bodies.
   Requires: the fusion and convolution passes' decisions (NULL: both run
   with fusion on and strategies chosen per layer).
   Returns 0, or -1 with a message through g->diag. */
int  cg_lower(const Graph *g, Arena *a, const CgDecisions *d, Program *p);
/* The memory plan pass (codegen/plan.c): activations, scratch and inputs share
   memory by liveness, for up to max_batch examples. Requires: a lowered
   Program. Produces: p->slot, p->slot_bytes, p->nslots, p->plan_*. */
void cg_plan_memory(Program *p, long max_batch);
/* The bytes the plan's slots take at `batch` examples (the same slots, each
   as large as its largest buffer at that batch), and the bytes of the
   program's persistent buffers (parameters and state). */
size_t cg_plan_bytes(const Program *p, long batch);
size_t cg_persistent_bytes(const Program *p);
/* Checks the program's invariants (codegen/verify.c): buffer ids in range,
   views within their base, GEMM leading dimensions and extents, kernels named
   and present in the source, the host's buffers set. Returns 0, or -1 with
   the first problem in err. */
int  cg_verify(const Program *p, char *err, size_t err_size);
/* Kernels with the same code (ResNet's repeated blocks: the same shapes,
   other buffers) are compiled once: sets every kernel step's sym to the fn of
   the first kernel whose text is the same but for its name and comments.
   Run by cg_lower(). */
void cg_share_kernels(Program *p);
/* Kernels of p whose code a kernel of `from` has (the evaluation program's
   forward kernels and the training program's) run from's: their steps get
   shared, shared_step and sym, and p->kernels_from = from, whose Exec on the
   same device must then be given to p's (rt_exec_init's share). Returns how
   many of p's distinct kernels are shared. */
int cg_share_kernels_with(Program *p, const Program *from);
/* FNV-1a over n bytes, from h (CG_FNV1A_START to begin): kernel texts compared
   here, the kernel caches' keys in the runtime. */
#define CG_FNV1A_START 0xcbf29ce484222325ULL
uint64_t cg_fnv1a(uint64_t h, const void *data, size_t n);
/* "N kernel steps: K kernels compiled (T twins, S from the training program)", in buf. */
const char *cg_kernels_str(const Program *p, char *buf, size_t size);
/* The step runs its own code: a kernel compiled with its program (neither a
   twin of another nor shared with another program). */
static inline bool cg_own_code(const Step *s) { return s->kind == STEP_KERNEL && !s->shared && s->sym == s->fn; }
/* The whole source for a target: prelude + bodies (every kernel, twins too). */
char *cg_source(const Program *p, Target t);
/* The prelude alone (what every kernel body is written against), and the
   KArgs declaration in it (for host code that fills one: an exported library). */
char *cg_prelude(const Program *p, Target t);
const char *cg_kargs_decl(const Program *p);
/* One kernel's source for a target: prelude + the body of kernel step k. */
char *cg_kernel_source(const Program *p, int k, Target t);
/* What is compiled for a target, in up to `most` pieces of about equal
   size, each headed by the prelude so that each compiles alone (translation
   units compiled side by side, none too large): the kernels that run their
   own code (cg_own_code), dealt out in turn so that every piece gets a share of
   each kind. Fills parts[] and returns how many (at least 1, at most most
   and the distinct kernels there are). */
int cg_source_parts(const Program *p, Target t, int most, char **parts);
/* The strategy for a convolution of c input channels, k x k, o outputs,
   out_width columns, the stride and padding, and the input and output
   positions per map: opt->conv when forced (CONV_VECTOR, CONV_DENSE,
   CONV_CHUNKED and CONV_WINOGRAD fall back where they do not apply), else
   chosen by measurements. */
ConvStrategy cg_conv_strategy(const CgOptions *opt, int c, int k, int o, int out_width, int stride, int padding,
                              int in_pixels, int out_pixels);
/* Prints how each convolution runs and why (conv_why), then the program's
   steps (for --emit=kernels). */
void cg_print_steps(const Program *p, FILE *out);

/* A GPU the cost model (codegen/cost.c) predicts for: its published peaks and
   a guess at launch costs, until a lent GPU calibrates them. */
typedef struct CgGpuModel {
    const char *name;                  /* --gpu-model's value: "h200" */
    const char *words;                 /* "NVIDIA H200 SXM" */
    double bytes_per_s;                /* memory bandwidth */
    double fp32_flops, bf16_flops;     /* dense peaks: CUDA cores' fp32, tensor cores' bf16 */
    double link_bytes_per_s;           /* NVLink, each way (the gradients' allreduce) */
    double launch_s, graph_launch_s;   /* a kernel launched alone, and inside a CUDA graph */
    int sms, threads_per_sm;
} CgGpuModel;
/* The model of that name, or NULL; the names there are (for messages). */
const CgGpuModel *cg_gpu_model(const char *name);
extern const char cg_gpu_model_names[];
/* Prints each step's launch geometry, bytes, FLOPs and predicted time on m
   (fp32 and bf16) at `batch` examples per GPU, then the step's and an epoch's
   of train_examples over `replicas` GPUs, the ten costliest steps, and the
   kernels that fill fewer than 2 blocks per SM and why. Needs no GPU. */
void cg_print_cost(const Program *p, const CgGpuModel *m, long batch, int replicas, long train_examples, FILE *out);

#endif
