/*
** The compiler as a library: one function runs every pass, in order, each
** followed by its verifier, from a .net file to a Program.
**
**   front end      parse, check, elaborate (frontend/)       -> forward graph
**   ir_verify
**   inference      the logits alone, BatchNorm folded (ir/infer.c) [export, --emit infer-ir]
**   gradients      the backward graph (ir/autodiff.c)          [training]
**   buckets        allreduce nodes, bucket by bucket (ir/dp.c) [several replicas, or --accumulate]
**   update         SGD (ir/autodiff.c)                         [training]
**   autocast       GEMM-class nodes multiply in bf16 (ir/precision.c) [--precision bf16]
**   fusion, convolution forms (codegen/fuse.c, conv.c)
**   lowering       kernels, GEMMs, collectives (codegen/lower.c)
**   memory plan    buffers share slots by liveness (codegen/plan.c)
**   cg_verify
**
** The driver (mgc), the unit tests and the fuzz target all compile through
** it. pipeline/ sees frontend/, ir/ and codegen/; nothing below sees it.
*/
#ifndef MGC_PIPELINE_H
#define MGC_PIPELINE_H
#include "frontend.h"
#include "codegen.h"

typedef struct MgcOptions {
    const char *net;          /* the .net file's path (its name in messages) */
    const char *text;         /* or its bytes (may hold NULs), len of them, when not NULL */
    size_t len;
    const FeOverride *sets;   /* --set NAME=VALUE */
    int nsets;
    bool training;            /* the training form: BatchNorm on batch statistics, dropout on */
    bool inference;           /* the inference rewrite of the evaluation form (not with training or backward):
                                 the logits the one output */
    bool fold;                /* with inference: BatchNorm folded into the layer before it */
    bool backward;            /* the gradient pass, the buckets (replicas > 1) and the update */
    bool input_grad;          /* the input's gradient too (check mode) */
    bool sync_bn;             /* BatchNorm over the global batch (with training) */
    int replicas;             /* over every rank: more than 1 sums the gradients */
    int accumulate;           /* --accumulate K: K micro-batches a step (more than 1: buckets even alone) */
    bool shard_update;        /* --shard-update: the update sharded across replicas (more than 1) */
    long bucket_bytes;        /* a bucket's size in bytes */
    long first_bucket_bytes;  /* the first bucket's (the last layers', ready first) */
    IrOptimizer opt;
    bool bf16;                /* --precision bf16: ir_autocast on the complete graph */
    CgOptions codegen;        /* fusion, convolution forms, CPU only */
    long plan_batch;          /* the examples each replica's memory plan holds */
} MgcOptions;

/* How a compilation ended. An error in the user's net is reported through
   the Diag as file:line:col; an internal one names the pass whose output its
   verifier rejected. */
typedef enum MgcStatus { MGC_OK = 0, MGC_BAD_NET = 1, MGC_INTERNAL = 2 } MgcStatus;

/* The whole pipeline: the graph into g (ir_graph_init'ed here) and, when p
   is not NULL, the program into p. *failed (when not NULL) names the pass
   that failed. */
MgcStatus mgc_compile(const MgcOptions *o, Arena *a, Diag *d, Graph *g, Program *p, const char **failed);
/* Its two halves: the graph passes (front end to update), then code
   generation (fusion to the verified, planned program) of that graph. */
MgcStatus mgc_graph(const MgcOptions *o, Arena *a, Diag *d, Graph *g, const char **failed);
MgcStatus mgc_program(const MgcOptions *o, Graph *g, Arena *a, Diag *d, Program *p, const char **failed);

#endif
