/*
** Unit tests of the verifiers: cg_verify (codegen/verify.c) accepts the
** programs of real nets and rejects each kind of damage done to a copy of
** one; ir_verify (ir/verify.c) accepts the graphs and rejects damaged nodes.
** Also the kernel text's named holes (cg_fill, codegen/kernel.h), which every
** kernel is written through and a wrong template would break silently.
** Prints "N passed, M failed"; exit 1 on failure.
*/
#include <glob.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipeline.h"
#include "kernel.h"

static int passed, failed;

#define CHECK(cond, ...) do { \
    if (cond) passed++; \
    else { failed++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

/* A net compiled and lowered (with its backward graph and SGD when backward
   is set; with gradient buckets of about bucket_bytes when that is > 0, as
   for several replicas). */
typedef struct Compiled { Arena arena; Diag diag; Graph g; Program p; int rc; } Compiled;

static void compile_dp(Compiled *c, const char *path, bool backward, long bucket_bytes)
{
    arena_init(&c->arena);
    diag_init(&c->diag, stderr);
    MgcOptions o = { .net = path, .training = backward, .backward = backward, .replicas = bucket_bytes > 0 ? 2 : 1,
                     .bucket_bytes = bucket_bytes, .first_bucket_bytes = bucket_bytes, .opt = { .kind = IR_SGD, .lr = 0.1f, .momentum = 0.9f },
                     .codegen = { .fuse = true, .conv = -1, .cpu_only = true }, .plan_batch = 64 };
    c->rc = mgc_compile(&o, &c->arena, &c->diag, &c->g, &c->p, NULL);
}

static void compile(Compiled *c, const char *path, bool backward) { compile_dp(c, path, backward, 0); }

/* The GPU training program under --precision bf16 (the convolutions' GEMM operands stored bf16). */
static void compile_gpu_bf16(Compiled *c, const char *path)
{
    arena_init(&c->arena);
    diag_init(&c->diag, stderr);
    MgcOptions o = { .net = path, .training = true, .backward = true, .replicas = 1, .bf16 = true,
                     .opt = { .kind = IR_SGD, .lr = 0.1f }, .codegen = { .fuse = true, .conv = -1, .cpu_only = false }, .plan_batch = 64 };
    c->rc = mgc_compile(&o, &c->arena, &c->diag, &c->g, &c->p, NULL);
}

/* A copy of the program whose bufs and steps can be damaged. */
static Program copy(const Program *p)
{
    Program q = *p;
    q.bufs = malloc(sizeof(Buf) * (size_t)p->nbufs);
    q.steps = malloc(sizeof(Step) * (size_t)p->nsteps);
    memcpy(q.bufs, p->bufs, sizeof(Buf) * (size_t)p->nbufs);
    memcpy(q.steps, p->steps, sizeof(Step) * (size_t)p->nsteps);
    q.colls = malloc(sizeof(Collective) * (size_t)(p->ncolls + 1));
    if (p->ncolls) memcpy(q.colls, p->colls, sizeof(Collective) * (size_t)p->ncolls);
    return q;
}

static void release(Program *q) { free(q->bufs); free(q->steps); free(q->colls); }

static int find_step(const Program *p, StepKind kind)
{
    for (int k = 0; k < p->nsteps; k++) if (p->steps[k].kind == kind) return k;
    return -1;
}

static int find_view(const Program *p)
{
    for (int k = 0; k < p->nbufs; k++) if (p->bufs[k].kind == BUF_VIEW) return k;
    return -1;
}

/* Applies one damage to a copy and expects cg_verify to name it. */
#define DAMAGED(what, expect, ...) do { \
    Program q = copy(&c.p); \
    char why[256]; \
    __VA_ARGS__; \
    int bad = cg_verify(&q, why, sizeof why); \
    CHECK(bad && strstr(why, expect), "cg_verify %s: got %d \"%s\", want \"%s\"", what, bad, bad ? why : "", expect); \
    release(&q); \
} while (0)

static void test_cg_verify(void)
{
    Compiled c;
    for (int train = 0; train < 2; train++) {
        compile(&c, "nets/lenet.net", train);
        char err[256];
        CHECK(c.rc == 0, "lenet compiles");
        CHECK(cg_verify(&c.p, err, sizeof err) == 0, "lenet (%s) verifies: %s", train ? "train" : "eval", err);
        if (train) break;
        arena_free(&c.arena);
    }
    int k = find_step(&c.p, STEP_KERNEL), gm = find_step(&c.p, STEP_GEMM), v = find_view(&c.p);
    CHECK(k >= 0 && gm >= 0 && v >= 0, "lenet has kernels, GEMMs and views");
    if (k < 0 || gm < 0 || v < 0) return;
    DAMAGED("kernel argument out of range", "not one of the", q.steps[k].args[0] = q.nbufs);
    DAMAGED("too many arguments", "arguments, at most", q.steps[k].nargs = CG_MAXARGS + 1);
    DAMAGED("kernel without a name", "without a name", q.steps[k].fn = "");
    DAMAGED("kernel not in the source", "no body in the source", q.steps[k].fn = "k999_nowhere");
    DAMAGED("view of a view", "itself a view", q.bufs[v].alias = v);
    DAMAGED("view past its base", "does not fit", q.bufs[v].offset = (int)q.bufs[q.bufs[v].alias].size.c);
    DAMAGED("GEMM lda below its width", "leading dimension", q.steps[gm].lda.c = 0);
    DAMAGED("GEMM lda not batch-sized", "leading dimension",
            { Step *s = &q.steps[gm]; s->k = (Dim){ 1, true }; s->m = (Dim){ 1, false }; s->ta = false; s->lda = (Dim){ 1000000, false }; });
    DAMAGED("GEMM buffer too small", "needs", q.steps[gm].m.c *= 2);
    DAMAGED("GEMM buffer out of range", "not one of the", q.steps[gm].c = -1);
    DAMAGED("GEMM batch past A's buffer", "operand A needs",
            { Step *s = &q.steps[gm]; s->batch = 2; s->sa = q.bufs[s->a].size; s->sb = (Dim){ 0, false }; s->sc = q.bufs[s->c].size; });
    DAMAGED("GEMM batch whose products overlap", "overlap",
            { Step *s = &q.steps[gm]; s->batch = 2; s->sa = s->sb = s->sc = (Dim){ 0, false }; });
    DAMAGED("loss buffer missing", "loss", q.loss = -1);
    DAMAGED("input buffer not the input's", "does not hold", q.input = q.logits);
    arena_free(&c.arena);

    /* GPUs under --precision bf16: bf16 buffers only scratch, written by kernels, read by GEMMs in pairs */
    compile_gpu_bf16(&c, "nets/lenet.net");
    {
        char e[256];
        CHECK(c.rc == 0 && cg_verify(&c.p, e, sizeof e) == 0, "lenet on GPUs in bf16 verifies: %s", c.rc ? "no program" : e);
        int g16 = -1, w16 = -1;
        for (int j = 0; j < c.p.nsteps && g16 < 0; j++) if (c.p.steps[j].kind == STEP_GEMM && c.p.steps[j].ab16) g16 = j;
        for (int j = 0; g16 >= 0 && j < c.p.nsteps && w16 < 0; j++)
            if (c.p.steps[j].kind == STEP_KERNEL && c.p.steps[j].args[0] == c.p.steps[g16].b && (c.p.steps[j].outs & 1)) w16 = j;
        CHECK(g16 >= 0 && w16 >= 0 && c.p.bufs[c.p.steps[g16].a].bf16 && c.p.bufs[c.p.steps[g16].b].bf16 && !c.p.bufs[c.p.steps[g16].c].bf16,
              "a GEMM on two bf16 buffers (the first written by kernel step %d), into fp32", w16);
        if (g16 >= 0 && w16 >= 0) {
            DAMAGED("a GEMM on bf16 buffers that reads them as fp32", "both bf16 (ab16) or neither", q.steps[g16].ab16 = false);
            DAMAGED("a GEMM into a bf16 buffer", "both bf16 (ab16) or neither", q.bufs[q.steps[g16].c].bf16 = true);
            DAMAGED("a pinned bf16 buffer", "pinned", q.bufs[q.steps[g16].b].pinned = true);
            DAMAGED("a bf16 operand half its values short", "operand B needs",
                    { Buf *b = &q.bufs[q.steps[g16].b]; b->size.c = (b->size.c + 1) / 2; });
        }
        DAMAGED("a persistent bf16 buffer", "persistent", {
            for (int b = 0; b < q.nbufs; b++) if (q.bufs[b].kind == BUF_PERSISTENT) { q.bufs[b].bf16 = true; break; }
        });
        /* conv1's bias gradient, 6 channels, in slices of the batch: each channel's last block adds
           its slices, counting the blocks in a buffer kept from step to step, outside the shared slots */
        int kept = -1;
        for (int b = 0; b < c.p.nbufs && kept < 0; b++) if (c.p.bufs[b].kind == BUF_KEEP) kept = b;
        CHECK(kept >= 0, "lenet on GPUs: a sliced reduction's arrival counters in a buffer kept from step to step");
        if (kept >= 0) {
            DAMAGED("a kept bf16 buffer", "kept", q.bufs[kept].bf16 = true);
            cg_plan_memory(&c.p, 64);
            CHECK(c.p.slot[kept] < 0 && cg_verify(&c.p, e, sizeof e) == 0, "the memory plan leaves the kept buffer out of its slots: %s", e);
            int sl[1024];
            if (c.p.nbufs <= 1024)
                DAMAGED("a kept buffer in a slot", "kept from step to step",
                        { memcpy(sl, c.p.slot, sizeof(int) * (size_t)q.nbufs); sl[kept] = 0; q.slot = sl; });
        }
    }
    arena_free(&c.arena);

    /* with buckets (several replicas): the collectives' steps */
    compile_dp(&c, "nets/lenet.net", true, 50000);
    char err[256];
    CHECK(c.rc == 0 && c.g.nbuckets >= 2, "lenet in buckets of 50 kB compiles to %d buckets", c.g.nbuckets);
    CHECK(cg_verify(&c.p, err, sizeof err) == 0, "lenet with buckets verifies: %s", err);
    int st = find_step(&c.p, STEP_ALLREDUCE), wt = find_step(&c.p, STEP_WAIT);
    CHECK(st >= 0 && wt > st, "a bucket's allreduce starts before it is waited for");
    if (st >= 0 && wt > st) {
        DAMAGED("collective out of range", "not one of the", q.steps[st].coll = q.ncolls);
        DAMAGED("wait before the start", "waited for but not started", { Step t = q.steps[st]; q.steps[st] = q.steps[wt]; q.steps[wt] = t; });
        DAMAGED("started twice", "started again", q.steps[wt] = q.steps[st]);
        DAMAGED("collective larger than its buffer", "does not fit", q.colls[q.steps[st].coll].floats = 1L << 40);
    }
    /* the memory plan */
    cg_plan_memory(&c.p, 64);
    CHECK(c.p.nslots > 0 && cg_verify(&c.p, err, sizeof err) == 0, "lenet's memory plan verifies: %s", err);
    int placed = -1;
    for (int b = 0; b < c.p.nbufs && placed < 0; b++) if (c.p.slot[b] >= 0) placed = b;
    if (placed >= 0) {
        DAMAGED("slot out of range", "not one of the", { q.slot = malloc(sizeof(int) * (size_t)q.nbufs); memcpy(q.slot, c.p.slot, sizeof(int) * (size_t)q.nbufs); q.slot[placed] = q.nslots; });
        DAMAGED("slot too small", "needs", { q.plan_batch = 1L << 30; });
    }
    arena_free(&c.arena);
}

/* ---- ir_verify ---- */

static int find_op(const Graph *g, Op op)
{
    for (int id = 0; id < g->n; id++) if (g->nodes[id].op == op) return id;
    return -1;
}

/* Runs ir_verify on a copy of c's graph with one node damaged; want: a phrase of the message. */
#define IR_DAMAGED(what, want, ...) do { \
    Graph q = c.g; \
    q.nodes = malloc(sizeof(Node) * (size_t)q.n); \
    memcpy(q.nodes, c.g.nodes, sizeof(Node) * (size_t)q.n); \
    char *msg = NULL; size_t len = 0; \
    FILE *out = open_memstream(&msg, &len); \
    Diag d; diag_init(&d, out); \
    __VA_ARGS__; \
    int bad = ir_verify(&q, &d); \
    fclose(out); \
    CHECK(bad > 0 && strstr(msg, "internal: node %") && strstr(msg, want), \
          "ir_verify %s: %d problems, \"%s\", want \"%s\"", what, bad, msg, want); \
    free(msg); free(q.nodes); \
} while (0)

static void test_ir_verify(void)
{
    Compiled c;
    /* every net there is, in both forms */
    glob_t nets;
    int found = glob("nets/*.net", 0, NULL, &nets) == 0 && glob("tests/nets/*.net", GLOB_APPEND, NULL, &nets) == 0;
    CHECK(found && nets.gl_pathc >= 10, "the nets to verify: %zu", found ? (size_t)nets.gl_pathc : 0);
    for (size_t k = 0; found && k < nets.gl_pathc; k++)
        for (int train = 0; train < 2; train++) {
            compile(&c, nets.gl_pathv[k], train);
            CHECK(c.rc == 0 && ir_verify(&c.g, &c.diag) == 0, "%s (%s) verifies", nets.gl_pathv[k], train ? "train" : "eval");
            arena_free(&c.arena);
        }
    if (found) globfree(&nets);

    compile(&c, "nets/lenet.net", true);
    int conv = find_op(&c.g, OP_CONV2D), relu = find_op(&c.g, OP_RELU), lin = find_op(&c.g, OP_LINEAR);
    int rs = find_op(&c.g, OP_RESHAPE), sgd = find_op(&c.g, OP_SGD), pool = find_op(&c.g, OP_MAXPOOL);
    int dw = find_op(&c.g, OP_CONV2D_BWD_W), xent = find_op(&c.g, OP_XENT);
    CHECK(conv >= 0 && relu >= 0 && lin >= 0 && rs >= 0 && sgd >= 0 && pool >= 0 && dw >= 0 && xent >= 0, "lenet's ops found");
    if (conv < 0 || relu < 0 || lin < 0 || rs < 0 || sgd < 0 || pool < 0 || dw < 0 || xent < 0) return;
    IR_DAMAGED("too many inputs", "has 2 inputs, not 1", q.nodes[relu].nin = 2);
    IR_DAMAGED("a later input", "not an earlier node", q.nodes[relu].in[0] = relu);
    IR_DAMAGED("a zero dimension", "has dimension 1 = 0", q.nodes[relu].shape.d[1] = 0);
    IR_DAMAGED("relu changes the shape", "has shape [N,6,25,24], but its shape rule gives [N,6,24,24]", q.nodes[relu].shape.d[2] += 1);
    IR_DAMAGED("conv channels", "input channels", q.nodes[q.nodes[conv].in[1]].shape.d[1] += 1);
    IR_DAMAGED("conv output size", "has shape [N,6,24,23], but its shape rule gives [N,6,24,24]", q.nodes[conv].shape.d[3] -= 1);
    IR_DAMAGED("conv stride", "has shape [N,6,24,24], but its shape rule gives [N,6,12,12]", q.nodes[conv].attr.stride = 2);
    IR_DAMAGED("conv weight grad", "window with stride", q.nodes[dw].attr.padding = 1);
    IR_DAMAGED("pool window", "but its shape rule gives [N,6,11,11]", q.nodes[pool].attr.kernel = 3);
    IR_DAMAGED("linear features", "does not take", q.nodes[q.nodes[lin].in[1]].shape.d[1] += 1);
    IR_DAMAGED("reshape elements", "not the same elements", q.nodes[rs].shape.d[1] += 1);
    IR_DAMAGED("sgd shape", "has shape [7,1,5,5], but its shape rule gives [6,1,5,5]", q.nodes[sgd].shape.d[0] += 1);
    IR_DAMAGED("sgd of a non-parameter", "not a parameter", q.nodes[sgd].in[0] = relu);
    IR_DAMAGED("loss shape", "has shape [2], but its shape rule gives [1]", q.nodes[xent].shape.d[0] = 2);
    arena_free(&c.arena);

    compile(&c, "tests/nets/op_batchnorm.net", true);
    int st = find_op(&c.g, OP_BN_STATS), sl = find_op(&c.g, OP_SLICE), ap = find_op(&c.g, OP_BN_APPLY);
    CHECK(st >= 0 && sl >= 0 && ap >= 0, "op_batchnorm's ops found");
    if (st < 0 || sl < 0 || ap < 0) return;
    IR_DAMAGED("bn stats shape", "but its shape rule gives [3,", q.nodes[st].shape.d[0] = 2);
    IR_DAMAGED("bn gamma", "gamma", q.nodes[q.nodes[ap].in[2]].shape.d[0] += 1);
    IR_DAMAGED("slice past its input", "not within", q.nodes[sl].attr.offset = 1000);
    arena_free(&c.arena);
}

/* Kernels with the same code share it: a twin's code is, but for its name and
   comments, the kernel it runs; ResNet-18's repeated blocks give twins. */
static char *code_of(const Program *p, int k)
{
    const Step *s = &p->steps[k];
    char *out = malloc((size_t)(s->src_end - s->src_begin) + 1), *o = out;
    for (const char *t = p->source + s->src_begin, *end = p->source + s->src_end; t < end;) {
        if (!strncmp(t, "/*", 2)) t = strstr(t, "*/") + 2;
        else if (!strncmp(t, s->fn, strlen(s->fn))) {
            *o++ = '#';
            t += strlen(s->fn);
        } else *o++ = *t++;
    }
    *o = 0;
    return out;
}

/* The source in pieces: each piece is the prelude and whole kernels, every
   kernel that runs its own code is in exactly one piece and a twin in none,
   in the order of the steps within a piece, and the pieces are about equal. */
static void test_source_parts(void)
{
    Compiled c;
    compile(&c, "nets/resnet18.net", true);
    CHECK(c.rc == 0, "resnet18 compiles");
    const char *whole = cg_source(&c.p, TARGET_C);
    size_t pre = strlen(whole) - strlen(c.p.source), own_bytes = 0;
    int kernels = 0, own = 0, twins_same = 0;
    for (int k = 0; k < c.p.nsteps; k++) {
        const Step *s = &c.p.steps[k];
        if (s->kind != STEP_KERNEL) continue;
        kernels++;
        if (cg_own_code(s)) {
            own++;
            own_bytes += (size_t)(s->src_end - s->src_begin);
            continue;
        }
        int j = 0;
        while (j < k && !(c.p.steps[j].kind == STEP_KERNEL && c.p.steps[j].fn == s->sym)) j++;
        char *mine = code_of(&c.p, k), *theirs = j < k ? code_of(&c.p, j) : NULL;
        twins_same += theirs && c.p.steps[j].sym == c.p.steps[j].fn && !strcmp(mine, theirs);
        free(mine);
        free(theirs);
    }
    CHECK(own < kernels * 2 / 3 && own > 10, "resnet18: %d of %d kernels run their own code", own, kernels);
    CHECK(twins_same == kernels - own, "every twin runs an earlier kernel of the same code (%d of %d)", twins_same,
          kernels - own);
    int wants[] = { 1, 2, 3, 7, 64, own, own + 5 };
    for (size_t w = 0; w < sizeof wants / sizeof wants[0]; w++) {
        char **parts = malloc(sizeof(char *) * (size_t)(wants[w] + 1));
        int n = cg_source_parts(&c.p, TARGET_C, wants[w], parts);
        int expect = wants[w] < own ? wants[w] : own;
        CHECK(n == expect, "%d pieces asked of %d distinct kernels: got %d", wants[w], own, n);
        bool prelude = true;
        size_t total = 0, biggest = 0;
        for (int j = 0; j < n; j++) {
            size_t len = strlen(parts[j]);
            prelude &= len > pre && !strncmp(parts[j], whole, pre);
            total += len - pre;
            if (len - pre > biggest) biggest = len - pre;
        }
        CHECK(prelude && total == own_bytes, "%d pieces: each has the prelude, their bodies are the distinct kernels' (%zu of %zu bytes)",
              n, total, own_bytes);
        CHECK(n < 2 || n >= own || biggest < 2 * total / (size_t)n + 20000,
              "%d pieces: the largest (%zu bytes of %zu) is about its share", n, biggest, total);
        /* each kernel's head lies in exactly one piece, or in none for a twin; within a piece in step order */
        int found = 0;
        bool ordered = true;
        const char **last = calloc((size_t)n, sizeof *last);
        for (int k = 0; k < c.p.nsteps; k++) {
            const Step *s = &c.p.steps[k];
            if (s->kind != STEP_KERNEL) continue;
            char head[128];
            snprintf(head, sizeof head, "KERNEL(%s)(", s->fn);
            int in = 0;
            for (int j = 0; j < n; j++) {
                const char *at = strstr(parts[j], head);
                if (!at) continue;
                in++;
                ordered &= !last[j] || at > last[j];
                last[j] = at;
            }
            found += in == cg_own_code(s);
        }
        free(last);
        CHECK(found == kernels, "%d pieces: every distinct kernel in one piece, twins in none (%d of %d)", n, found, kernels);
        CHECK(ordered, "%d pieces: kernels in step order within each piece", n);
        free(parts);
    }
    arena_free(&c.arena);
}

/* The evaluation program runs the training program's kernels where their code
   is the same: each shared kernel's code is, but for names and comments, a
   training kernel that runs its own; what is left is compiled alone. */
static void test_share_programs(void)
{
    Compiled tr, ev;
    compile(&tr, "nets/resnet18.net", true);
    compile(&ev, "nets/resnet18.net", false);
    CHECK(tr.rc == 0 && ev.rc == 0, "resnet18 compiles for training and for evaluation");
    int before = 0, kernels = 0;
    for (int k = 0; k < ev.p.nsteps; k++) {
        before += cg_own_code(&ev.p.steps[k]);
        kernels += ev.p.steps[k].kind == STEP_KERNEL;
    }
    int n = cg_share_kernels_with(&ev.p, &tr.p);
    CHECK(n > before / 2 && ev.p.kernels_from == &tr.p, "resnet18: %d of the evaluation's %d distinct kernels are the training's",
          n, before);
    int own = 0, shared = 0, same = 0, twins_ok = 0;
    for (int k = 0; k < ev.p.nsteps; k++) {
        const Step *s = &ev.p.steps[k];
        if (s->kind != STEP_KERNEL) continue;
        own += cg_own_code(s);
        if (s->shared) {
            shared++;
            int j = s->shared_step;
            if (j < 0 || j >= tr.p.nsteps || !cg_own_code(&tr.p.steps[j]) || tr.p.steps[j].fn != s->sym) continue;
            char *mine = code_of(&ev.p, k), *theirs = code_of(&tr.p, j);
            same += !strcmp(mine, theirs);
            free(mine);
            free(theirs);
        } else if (!cg_own_code(s)) {   /* a twin: of a kernel of its own program that runs its own code */
            for (int j = 0; j < k; j++) twins_ok += ev.p.steps[j].fn == s->sym && cg_own_code(&ev.p.steps[j]);
        }
    }
    CHECK(same == shared && shared >= n, "every shared kernel is a training kernel of the same code (%d of %d)", same, shared);
    CHECK(own == before - n, "%d kernels of its own left (%d before, %d shared)", own, before, n);
    CHECK(twins_ok == kernels - own - shared, "the twins left run a kernel of their own program (%d of %d)", twins_ok,
          kernels - own - shared);
    char *parts[4];
    int np = cg_source_parts(&ev.p, TARGET_C, 4, parts), heads = 0;
    for (int j = 0; j < np; j++)
        for (const char *c = parts[j]; (c = strstr(c, "KERNEL(k")) != NULL; c++) heads++;
    CHECK(heads == own, "the evaluation compiles only its own kernels (%d in its source, %d own)", heads, own);
    arena_free(&tr.arena);
    arena_free(&ev.arena);
}

/* The template filled (cg_fill), or NULL and the error in err */
static char *filled(const char *tmpl, const CgHole *holes, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    bool ok = cg_fill(f, tmpl, holes, err, errlen);
    fclose(f);
    if (ok) return buf;
    free(buf);
    return NULL;
}

#define HOLES(...) ((const CgHole[]){ __VA_ARGS__, { NULL, NULL, { 0 } } })

/* Named holes: filled as printf would have, C's braces and '%' kept, a wrong
   name or an unused binding refused with its name; cg_str stops mgc on one. */
static void test_holes(void)
{
    char err[160] = "";
    char *t = filled("for (int o = 0; o < $O; o++) { y[$plane * n + o] = x[o % $O] + ${len}L; } $$ $s\n",
                     HOLES(cg_n("O", 7), cg_n("plane", 1L << 40), cg_n("len", -3), cg_s("s", "{ }")), err, sizeof err);
    CHECK(t && !strcmp(t, "for (int o = 0; o < 7; o++) { y[1099511627776 * n + o] = x[o % 7] + -3L; } $ { }\n"),
          "holes filled, braces and %% kept: %s", t ? t : err);
    free(t);
    t = filled("no holes {}", HOLES(cg_s("unused", "1")), err, sizeof err);
    CHECK(!t && strstr(err, "unused") && strstr(err, "fills no hole"), "an unused binding named: %s", err);
    free(t);
    t = filled("a[$C * $Cx]", HOLES(cg_n("C", 2)), err, sizeof err);
    CHECK(!t && strstr(err, "$Cx has no binding"), "an unknown hole named: %s", err);
    free(t);
    t = filled("a[${C]", HOLES(cg_n("C", 2)), err, sizeof err);
    CHECK(!t && strstr(err, "names no hole"), "an unclosed ${ refused: %s", err);
    free(t);
    t = filled("$C $C", HOLES(cg_n("C", 2), cg_n("C", 3)), err, sizeof err);
    CHECK(!t && strstr(err, "$C is bound twice"), "a name bound twice refused: %s", err);
    free(t);
    /* through cg_str: an internal error naming the hole, and mgc stops */
    int fd[2];
    if (pipe(fd) != 0) { CHECK(false, "pipe"); return; }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        Arena a;
        arena_init(&a);
        Program p = { .arena = &a };
        Lower L = { .p = &p, .open_kernel = -1 };
        cg_str(&L, "x[$missing]", cg_n("C", 1));
        _exit(0);
    }
    close(fd[1]);
    char msg[256] = "";
    ssize_t got = read(fd[0], msg, sizeof msg - 1);
    close(fd[0]);
    msg[got > 0 ? got : 0] = 0;
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && strstr(msg, "internal error") && strstr(msg, "$missing"),
          "cg_str stops on an unknown hole, naming it: %s", msg);
}

int main(void)
{
    test_holes();
    test_cg_verify();
    test_ir_verify();
    test_source_parts();
    test_share_programs();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
