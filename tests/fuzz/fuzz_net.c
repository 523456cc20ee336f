/*
** The fuzz target: bytes in, the whole compiler out, as `mgc NET --emit
** kernels` runs it, and nothing is executed. Each input is parsed, checked and
** elaborated; when that succeeds, the graph is verified, differentiated,
** bucketed for two replicas (some inputs), given its SGD update, fused,
** lowered, memory-planned, checked by the program verifier, and printed (IR
** and the C and CUDA kernel sources). An error message is a fine outcome; a
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
#include "ir.h"
#include "frontend.h"
#include "codegen.h"

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
    Graph g;
    ir_graph_init(&g, &a, &d, NULL, training);
    g.sync_bn = sync_bn && training;
    if (fe_compile_bytes(&g, "fuzz.net", (const char *)data, size, NULL, 0) || g.loss < 0) goto done;
    if (ir_verify(&g, &d)) fail("ir_verify", "the front end built a graph the verifier rejects");
    ir_print(&g, sink(), 0, g.n);
    if (g.n > LOWER_MAX_NODES) goto done;
    if (training) {
        if (ir_gradients(&g, (h >> 11 & 7) == 0) || ir_verify(&g, &d)) fail("ir_gradients", "the gradient pass failed");
        if (replicas && (ir_buckets(&g, (long)(h >> 14 & 0xffff) * 64 + 1, 4096) || ir_verify(&g, &d)))
            fail("ir_buckets", "the bucket pass failed");
        IrSgd sgd = { 0.1f, 0.9f, (h >> 30 & 1) ? 5e-4f : 0.0f };
        if (ir_update(&g, &sgd) || ir_verify(&g, &d)) fail("ir_update", "the update pass failed");
        ir_print(&g, sink(), 0, g.n);
    }
    {
        CgDecisions dec;
        cg_decisions_init(&dec, &g, &a);
        cg_fuse(&g, &opt, &dec);
        cg_choose_convs(&g, &opt, &dec);
        Program p;
        memset(&p, 0, sizeof p);
        if (cg_lower(&g, &a, &dec, &p)) goto done;    /* an error message, as from mgc */
        cg_plan_memory(&p, replicas ? 128 : 256);
        char err[256];
        if (cg_verify(&p, err, sizeof err)) fail("cg_verify", err);
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
