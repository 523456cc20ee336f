/*
** Unit tests of the verifiers: cg_verify (codegen/verify.c) accepts the
** programs of real nets and rejects each kind of damage done to a copy of
** one; ir_verify (ir/verify.c) accepts the graphs and rejects damaged nodes.
** Prints "N passed, M failed"; exit 1 on failure.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "codegen.h"
#include "frontend.h"

static int passed, failed;

#define CHECK(cond, ...) do { \
    if (cond) passed++; \
    else { failed++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

/* A net compiled and lowered (with its backward graph and SGD when backward is set). */
typedef struct Compiled { Arena arena; Diag diag; Graph g; Program p; int rc; } Compiled;

static void compile(Compiled *c, const char *path, bool backward)
{
    arena_init(&c->arena);
    diag_init(&c->diag, stderr);
    ir_graph_init(&c->g, &c->arena, &c->diag, NULL, backward);
    IrSgd sgd = { 0.1f, 0.9f, 0.0f };
    c->rc = fe_compile(&c->g, path, NULL, 0);
    if (!c->rc && backward) c->rc = ir_autodiff(&c->g, &sgd, false);
    if (!c->rc) c->rc = cg_lower(&c->g, &c->arena, NULL, &c->p);
}

/* A copy of the program whose bufs and steps can be damaged. */
static Program copy(const Program *p)
{
    Program q = *p;
    q.bufs = malloc(sizeof(Buf) * (size_t)p->nbufs);
    q.steps = malloc(sizeof(Step) * (size_t)p->nsteps);
    memcpy(q.bufs, p->bufs, sizeof(Buf) * (size_t)p->nbufs);
    memcpy(q.steps, p->steps, sizeof(Step) * (size_t)p->nsteps);
    return q;
}

static void release(Program *q) { free(q->bufs); free(q->steps); }

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
    char err[256]; \
    __VA_ARGS__; \
    int bad = cg_verify(&q, err, sizeof err); \
    CHECK(bad && strstr(err, expect), "cg_verify %s: got %d \"%s\", want \"%s\"", what, bad, bad ? err : "", expect); \
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
    DAMAGED("loss buffer missing", "loss", q.loss = -1);
    DAMAGED("input buffer not the input's", "does not hold", q.input = q.logits);
    arena_free(&c.arena);
}

int main(void)
{
    test_cg_verify();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
