/*
** The fuzz target: bytes in, the whole compiler out, as `mgc NET --emit
** kernels` runs it (pipeline/pipeline.c, in its two halves), and nothing is
** executed. Each input is parsed, checked and elaborated; when that
** succeeds, the graph is verified, differentiated, bucketed for two replicas
** (some inputs), given its SGD update, fused, lowered, memory-planned,
** checked by the program verifier, and printed (IR and the C and CUDA kernel
** sources). An error message is a fine outcome; a
** crash, a sanitizer report, a leak, a hang or a verifier failure is not.
**
** A hash of the input picks the variant (training or evaluation form, SyncBN,
** fusion, a forced convolution strategy, two replicas), so every input always
** takes the same path and a crash replays from its file alone.
**
** Built by `make fuzz` (clang -fsanitize=fuzzer,address,undefined); the
** corpus it starts from is nets/, tests/nets/ and tests/bad/ (tests/fuzz/run.sh).
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipeline.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Graphs past this many nodes are only elaborated and verified: lowering a
   10,000-layer net is a scale test (tests/cli.sh), not a search for bugs, and
   would make every such input cost seconds. */
#define LOWER_MAX_NODES 4000

static FILE *sink(void)
{
    static FILE *f;
    if (!f) f = fopen("/dev/null", "w");
    if (!f) abort();
    return f;
}

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static void fail(const char *what, const char *why)
{
    fprintf(stderr, "fuzz_net: %s: %s\n", what, why);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t h = fnv1a(data, size);
    bool training = (h & 7) != 0;        /* 1 in 8: the evaluation form */
    bool sync_bn = (h >> 3 & 3) == 0;
    bool replicas = (h >> 5 & 1) != 0;
    CgOptions opt = { .fuse = (h >> 6 & 3) != 0, .conv = -1, .cpu_only = (h >> 11 & 1) != 0 };
    switch (h >> 8 & 7) {                /* six in eight force a strategy */
    case 0: opt.conv = CONV_DIRECT; break;
    case 1: opt.conv = CONV_VECTOR; break;
    case 2: opt.conv = CONV_GEMM; break;
    case 3: opt.conv = CONV_DENSE; break;
    case 6: opt.conv = CONV_CHUNKED; break;   /* CONV_GEMM where .cpu_only is off (as for CUDA) */
    case 7: opt.conv = CONV_WINOGRAD; break;  /* chunked (or CONV_GEMM) where it does not apply */
    default: break;
    }

    Arena a;
    arena_init(&a);
    Diag d;
    diag_init(&d, sink());
    MgcOptions o = {
        .net = "fuzz.net", .text = (const char *)data, .len = size, .training = training, .backward = training,
        .input_grad = (h >> 11 & 7) == 0, .sync_bn = sync_bn, .replicas = replicas ? 2 : 1,
        .bucket_bytes = (long)(h >> 14 & 0xffff) * 64 + 1, .first_bucket_bytes = 4096,
        .opt = { .kind = (h >> 31 & 1) ? IR_ADAMW : IR_SGD, .lr = 0.1f, .momentum = 0.9f, .nesterov = (h >> 32 & 1) != 0,
                 .weight_decay = (h >> 30 & 1) ? 5e-4f : 0.0f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f }, .codegen = opt, .plan_batch = replicas ? 128 : 256,
    };
    /* the pipeline in its two halves, the graph printed between; past the
       front end, every pass must succeed and pass its verifier */
    Graph g;
    const char *failed;
    MgcStatus s = mgc_graph(&o, &a, &d, &g, &failed);
    if (s && failed && strcmp(failed, "front end")) fail(failed, "the pass failed, or its verifier rejected what it made");
    if (s == MGC_INTERNAL) fail("ir_verify", "the front end built a graph the verifier rejects");
    if (s) goto done;
    ir_print(&g, sink(), 0, g.n);
    if (g.n > LOWER_MAX_NODES) goto done;
    {
        Program p;
        s = mgc_program(&o, &g, &a, &d, &p, &failed);
        if (s == MGC_INTERNAL) fail(failed, "the program verifier rejected the generated program");
        if (s) goto done;   /* an error message, as from mgc */
        (void)cg_plan_bytes(&p, 256);
        (void)cg_persistent_bytes(&p);
        cg_print_steps(&p, sink());
        fputs(cg_source(&p, TARGET_C), sink());
        fputs(cg_source(&p, TARGET_CUDA), sink());
        char *parts[64];
        int n = cg_source_parts(&p, TARGET_C, 64, parts);
        if (n < 1 || n > 64) fail("cg_source_parts", "a count out of range");
    }
done:
    arena_free(&a);
    return 0;
}
