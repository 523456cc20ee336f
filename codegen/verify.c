/*
** Verifying a Program: the invariants the runtime relies on and does not
** check itself. Run by the driver right after cg_lower(); a failure is a bug
** in codegen, not in the user's net.
**
**   buffers  kinds valid; a view aliases a non-view base and lies within it
**   kernels  named, with at most CG_MAXARGS buffer arguments, all in range,
**            and a body in p->source
**   GEMMs    buffers in range; sizes positive; leading dimensions at least
**            the stored rows' width (lda >= k or m as A is transposed, ...);
**            each operand's buffer holds its rows times its leading dimension
**   nodes    node_buf entries in range; the buffers the host reads (input,
**            labels, loss, correct, logits) set when the graph has them
**
** Sizes that grow with the batch are Dims (c, or c * N): one Dim is at least
** another for every N >= 1 when their coefficients compare so (a constant is
** never at least a batch-sized Dim).
*/
#include "codegen.h"
#include <stdarg.h>
#include <string.h>

static int fail(char *err, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (size) vsnprintf(err, size, fmt, ap);
    va_end(ap);
    return -1;
}

/* a >= b for every batch size N >= 1 */
static bool dim_ge(Dim a, Dim b)
{
    if (a.batch == b.batch || a.batch) return a.c >= b.c;   /* a batch-sized a: N = 1 binds */
    return false;                                           /* a constant a, a growing b */
}

/* rows * ld as a Dim; false when both grow with N (an N*N extent is never meant) */
static bool dim_mul(Dim rows, Dim ld, Dim *out)
{
    if (rows.batch && ld.batch) return false;
    *out = (Dim){ rows.c * ld.c, rows.batch || ld.batch };
    return true;
}

static const char *dim_str(char *buf, size_t size, Dim d)
{
    snprintf(buf, size, d.batch ? "%ld*N" : "%ld", d.c);
    return buf;
}

static bool buf_ok(const Program *p, int b) { return b >= 0 && b < p->nbufs; }

static int check_bufs(const Program *p, char *err, size_t size)
{
    char s1[32], s2[32];
    for (int k = 0; k < p->nbufs; k++) {
        const Buf *b = &p->bufs[k];
        if (b->kind < BUF_PERSISTENT || b->kind > BUF_KEEP)
            return fail(err, size, "buffer %d has no valid kind (%d)", k, (int)b->kind);
        if (b->size.c < 0) return fail(err, size, "buffer %d has size %s", k, dim_str(s1, sizeof s1, b->size));
        if (b->bf16 && (b->kind == BUF_PERSISTENT || b->kind == BUF_VIEW || b->kind == BUF_INPUT || b->kind == BUF_KEEP || b->pinned))
            return fail(err, size, "buffer %d (%s) is bf16 but %s: only scratch and activations are", k, b->name ? b->name : "?",
                        b->pinned ? "pinned (the host reads it as floats)" : b->kind == BUF_VIEW ? "a view" : "persistent, kept or an input");
        if (b->kind != BUF_VIEW) continue;
        if (!buf_ok(p, b->alias))
            return fail(err, size, "view buffer %d aliases buffer %d, not one of the %d buffers", k, b->alias, p->nbufs);
        const Buf *base = &p->bufs[b->alias];
        if (base->kind == BUF_VIEW)
            return fail(err, size, "view buffer %d aliases buffer %d, itself a view", k, b->alias);
        Dim end = { b->size.c + b->offset, b->size.batch };
        if (b->offset < 0 || !dim_ge(base->size, b->size) || !dim_ge(base->size, end))
            return fail(err, size, "view buffer %d (%s floats at offset %d) does not fit in buffer %d (%s floats)", k,
                        dim_str(s1, sizeof s1, b->size), b->offset, b->alias, dim_str(s2, sizeof s2, base->size));
    }
    return 0;
}

/* One GEMM operand: buffer id, stored rows x cols with leading dimension ld. */
/* a + b as a Dim: mixed, the batch-sized bound c_a*N + c_b <= (c_a + c_b)*N for every N >= 1 */
static Dim dim_add(Dim a, Dim b) { return (Dim){ a.c + b.c, a.batch || b.batch }; }

/* Operand name of GEMM step `step` (a batch of `batch`, `stride` floats apart): rows x cols, rows ld apart, within buffer b */
static int check_operand(const Program *p, int step, const char *name, int b, Dim rows, Dim cols, Dim ld, int batch, Dim stride,
                         char *err, size_t size)
{
    char s1[32], s2[32], s3[32];
    if (!buf_ok(p, b))
        return fail(err, size, "step %d: GEMM operand %s is buffer %d, not one of the %d buffers", step, name, b, p->nbufs);
    if (!dim_ge(ld, cols))
        return fail(err, size, "step %d: GEMM operand %s has leading dimension %s < %s stored columns", step, name,
                    dim_str(s1, sizeof s1, ld), dim_str(s2, sizeof s2, cols));
    Dim need, before;
    if (!dim_mul(rows, ld, &need))
        return fail(err, size, "step %d: GEMM operand %s spans %s rows of %s floats (N*N)", step, name,
                    dim_str(s1, sizeof s1, rows), dim_str(s2, sizeof s2, ld));
    if (batch > 1) {   /* the last of the batch begins (batch - 1) strides in */
        if (stride.c < 0 || !dim_mul((Dim){ batch - 1, false }, stride, &before))
            return fail(err, size, "step %d: GEMM operand %s has stride %s", step, name, dim_str(s1, sizeof s1, stride));
        need = dim_add(need, before);
    }
    Dim have = p->bufs[b].size;   /* values: a bf16 buffer holds two a float */
    if (p->bufs[b].bf16) have.c *= 2;
    if (!dim_ge(have, need))
        return fail(err, size, "step %d: GEMM operand %s needs %s values, buffer %d holds %s", step, name,
                    dim_str(s1, sizeof s1, need), b, dim_str(s3, sizeof s3, have));
    return 0;
}

static int check_steps(const Program *p, char *err, size_t size)
{
    int nodes = p->graph ? p->graph->n : 0;
    long source_len = p->source ? (long)strlen(p->source) : 0;
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (s->node < 0 || (p->graph && s->node >= nodes))
            return fail(err, size, "step %d implements node %%%d, not a node of the graph", k, s->node);
        if (s->kind != STEP_KERNEL && s->kind != STEP_GEMM && s->kind != STEP_ALLREDUCE && s->kind != STEP_WAIT)
            return fail(err, size, "step %d has no valid kind (%d)", k, (int)s->kind);
        switch (s->kind) {
        case STEP_KERNEL: {
            if (!s->fn || !s->fn[0]) return fail(err, size, "step %d: kernel without a name", k);
            if (s->nargs < 0 || s->nargs > CG_MAXARGS)
                return fail(err, size, "step %d (%s): %d arguments, at most %d", k, s->fn, s->nargs, CG_MAXARGS);
            for (int j = 0; j < s->nargs; j++) {
                if (!buf_ok(p, s->args[j]))
                    return fail(err, size, "step %d (%s): argument %d is buffer %d, not one of the %d buffers", k, s->fn, j,
                                s->args[j], p->nbufs);
            }
            if (s->work.c < 0 || s->grain < 0) return fail(err, size, "step %d (%s): negative work", k, s->fn);
            /* its head within its own text (searching only there: linear in the source, not quadratic) */
            char head[160];
            snprintf(head, sizeof head, "KERNEL(%s)(", s->fn);
            if (s->src_begin < 0 || s->src_end > source_len || s->src_begin >= s->src_end)
                return fail(err, size, "step %d: kernel %s's text [%ld, %ld) is not within the %ld-byte source", k, s->fn,
                            s->src_begin, s->src_end, source_len);
            if (!memmem(p->source + s->src_begin, (size_t)(s->src_end - s->src_begin), head, strlen(head)))
                return fail(err, size, "step %d: kernel %s has no body in the source where its text is recorded", k, s->fn);
            break;
        }
        case STEP_GEMM: {
            if (s->m.c <= 0 || s->n.c <= 0 || s->k.c <= 0)
                return fail(err, size, "step %d: GEMM with an empty dimension (m %ld, n %ld, k %ld)", k, s->m.c, s->n.c, s->k.c);
            /* row-major: op(A) is m x k, op(B) is k x n, C is m x n */
            if (check_operand(p, k, "A", s->a, s->ta ? s->k : s->m, s->ta ? s->m : s->k, s->lda, s->batch, s->sa, err, size) ||
                check_operand(p, k, "B", s->b, s->tb ? s->n : s->k, s->tb ? s->k : s->n, s->ldb, s->batch, s->sb, err, size) ||
                check_operand(p, k, "C", s->c, s->m, s->n, s->ldc, s->batch, s->sc, err, size))
                return -1;
            Dim cspan;
            if (s->batch > 1 && (!dim_mul(s->m, s->ldc, &cspan) || !dim_ge(s->sc, cspan)))
                return fail(err, size, "step %d: a batch of GEMMs whose products overlap (C's stride below its %ld rows of %ld)", k,
                            s->m.c, s->ldc.c);
            if (s->c == s->a || s->c == s->b) return fail(err, size, "step %d: GEMM writes the buffer it reads", k);
            if (p->bufs[s->a].bf16 != s->ab16 || p->bufs[s->b].bf16 != s->ab16 || p->bufs[s->c].bf16)
                return fail(err, size, "step %d: GEMM on buffers %d, %d -> %d: A and B both bf16 (ab16) or neither, C fp32", k, s->a,
                            s->b, s->c);
            break;
        }
        case STEP_ALLREDUCE: case STEP_WAIT: {
            if (s->coll < 0 || s->coll >= p->ncolls)
                return fail(err, size, "step %d: collective %d, not one of the %d", k, s->coll, p->ncolls);
            const Collective *c = &p->colls[s->coll];
            if (!buf_ok(p, c->src) || !buf_ok(p, c->dst))
                return fail(err, size, "step %d: collective c%d sums buffer %d into %d, not buffers of the program", k, s->coll,
                            c->src, c->dst);
            const Buf *sb = &p->bufs[c->src];
            bool block = c->kind == COLL_ALLGATHER && c->src == c->dst && sb->kind == BUF_PERSISTENT && sb->pack >= 0 &&
                         sb->pack_at == 0 && c->floats == sb->pack_floats;   /* --shard-update: a bucket's parameters' block */
            if (c->floats <= 0 || (!block && (!dim_ge(p->bufs[c->src].size, (Dim){ c->floats, false }) ||
                                              !dim_ge(p->bufs[c->dst].size, (Dim){ c->floats, false }))))
                return fail(err, size, "step %d: collective c%d of %ld floats does not fit its buffers", k, s->coll, c->floats);
            /* started once before it is waited for, waited once after it is started */
            int starts = 0, waits = 0;
            for (int j = 0; j < k; j++)
                if (p->steps[j].coll == s->coll && (p->steps[j].kind == STEP_ALLREDUCE || p->steps[j].kind == STEP_WAIT))
                    p->steps[j].kind == STEP_ALLREDUCE ? starts++ : waits++;
            if (s->kind == STEP_ALLREDUCE ? starts != waits : starts != waits + 1)
                return fail(err, size, "step %d: collective c%d %s", k, s->coll,
                            s->kind == STEP_ALLREDUCE ? "started again before it was waited for" : "waited for but not started");
            break;
        }
        }
    }
    return 0;
}

static int check_host(const Program *p, char *err, size_t size)
{
    const Graph *g = p->graph;
    if (!g) return fail(err, size, "program without a graph");
    for (int id = 0; id < g->n; id++)
        if (p->node_buf[id] < -1 || p->node_buf[id] >= p->nbufs)
            return fail(err, size, "node %%%d is held by buffer %d, not one of the %d buffers", id, p->node_buf[id], p->nbufs);
    struct { const char *what; int node, buf; } host[] = {
        { "input", g->input, p->input }, { "labels", g->labels, p->labels }, { "loss", g->loss, p->loss },
        { "correct", g->correct, p->correct }, { "logits", g->logits, p->logits },
    };
    for (size_t k = 0; k < sizeof host / sizeof host[0]; k++) {
        if (host[k].node < 0) continue;
        if (!buf_ok(p, host[k].buf))
            return fail(err, size, "the graph has %s (%%%d) but the program's %s buffer is %d", host[k].what, host[k].node,
                        host[k].what, host[k].buf);
        if (host[k].buf != p->node_buf[host[k].node])
            return fail(err, size, "the program's %s buffer %d does not hold node %%%d", host[k].what, host[k].buf, host[k].node);
    }
    return 0;
}

/* The memory plan, when there is one: every placed buffer fits its slot. */
static int check_plan(const Program *p, char *err, size_t size)
{
    if (p->plan_batch <= 0) return 0;
    for (int b = 0; b < p->nbufs; b++) {
        int t = p->slot[b];
        if (t < -1 || t >= p->nslots) return fail(err, size, "buffer %d is in slot %d, not one of the %d", b, t, p->nslots);
        if (t < 0) continue;
        if (p->bufs[b].kind == BUF_VIEW || p->bufs[b].kind == BUF_PERSISTENT || p->bufs[b].kind == BUF_KEEP)
            return fail(err, size, "buffer %d (%s) has a slot of its own", b,
                        p->bufs[b].kind == BUF_VIEW ? "a view" : p->bufs[b].kind == BUF_KEEP ? "kept from step to step" : "persistent");
        size_t need = sizeof(float) * (size_t)cg_dim(p->bufs[b].size, p->plan_batch);
        if (p->slot_bytes[t] < need)
            return fail(err, size, "buffer %d needs %zu bytes at batch %ld, slot %d has %zu", b, need, p->plan_batch, t, p->slot_bytes[t]);
    }
    return 0;
}

int cg_verify(const Program *p, char *err, size_t err_size)
{
    if (err_size) err[0] = 0;
    if (p->nbufs < 0 || p->nsteps < 0) return fail(err, err_size, "negative buffer or step count");
    if (check_bufs(p, err, err_size) || check_steps(p, err, err_size) || check_host(p, err, err_size) ||
        check_plan(p, err, err_size))
        return -1;
    return 0;
}
