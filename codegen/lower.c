/*
** Lowering: IR nodes -> buffers and steps, and the kernel bodies as text.
**
** Requires: a verified graph (shapes set, inputs earlier than users).
** Produces: a Program. Every node that has an output gets a buffer sized for
** N examples (views alias their input's buffer); GEMM-shaped ops become
** generated kernels, or generated pack/unpack kernels around one BLAS call
** (codegen/conv.c has the picture for convolutions).
**
** This file is the driver: it walks the nodes in order and calls the one
** lowering function of each op (the op families are listed in
** codegen/lower_internal.h), and it holds what they share: buffers, steps,
** the kernel text, views, SGD (one parameter, or a fused group of a bucket),
** fusion and pinning.
**
** Kernel bodies use only the macros of the prelude (codegen/prelude.c):
** KERNEL(name), FOR_EACH(i, n), DEVICE, RESTRICT, MGC_INF, mgc_uniform().
** Each kernel has exactly one FOR_EACH, whose iterations are independent: the
** CPU splits them over threads, CUDA over a grid, with no barrier inside (a
** fused group of SGD updates has one after another, each as independent).
** A reduction kernel (its step's `blocks` set) has one FOR_EACH_BLOCK instead:
** its iterations are independent too, each one reduction whose inner loops
** (BLOCK_LOOP, BLOCK_LOOP2) a CUDA block shares, summed with BLOCK_SUM and
** written under BLOCK_LEADER (the prelude says how each target expands them).
*/
#include "lower_internal.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>

/* ------------------------------------------------------------ buffers and steps */

int cg_new_buf(Lower *L, BufKind kind, Dim size, const char *name, int node)
{
    Program *p = L->p;
    if (p->nbufs == p->capbufs) {
        int cap = p->capbufs ? 2 * p->capbufs : 64;
        p->bufs = arena_grow(p->arena, p->bufs, sizeof(Buf) * (size_t)p->capbufs, sizeof(Buf) * (size_t)cap);
        p->capbufs = cap;
    }
    Buf *b = &p->bufs[p->nbufs];
    b->kind = kind;
    b->size = size;
    b->name = name;
    b->node = node;
    b->alias = -1;
    b->origin = NULL;
    if (node >= 0) {
        const Node *n = &L->g->nodes[node];
        b->origin = n->loc.file
            ? arena_printf(p->arena, "%%%d %s %s (%s:%d)", node, ir_op_name(n->op), ir_shape_str(p->arena, &n->shape),
                           n->loc.file->name, n->loc.line)
            : arena_printf(p->arena, "%%%d %s %s", node, ir_op_name(n->op), ir_shape_str(p->arena, &n->shape));
    }
    return p->nbufs++;
}

int cg_new_bf16_buf(Lower *L, BufKind kind, Dim elems, const char *name, int node)
{
    int b = cg_new_buf(L, kind, (Dim){ (elems.c + 1) / 2, elems.batch }, name, node);
    L->p->bufs[b].bf16 = true;
    return b;
}

Step *cg_new_step(Lower *L, StepKind kind, int node)
{
    Program *p = L->p;
    if (p->nsteps == p->capsteps) {
        int cap = p->capsteps ? 2 * p->capsteps : 64;
        p->steps = arena_grow(p->arena, p->steps, sizeof(Step) * (size_t)p->capsteps, sizeof(Step) * (size_t)cap);
        p->capsteps = cap;
    }
    Step *s = &p->steps[p->nsteps++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->node = node;
    return s;
}

Step *cg_kernel(Lower *L, int node, const char *what, Dim work, int nargs, const int *bufs, const char *const *names)
{
    if (nargs > CG_MAXARGS) {   /* a lowering's bug: Step.args holds CG_MAXARGS */
        fprintf(stderr, "mgc: internal error: kernel %s of node %%%d takes %d buffers, more than the %d a kernel takes\n", what, node,
                nargs, CG_MAXARGS);
        abort();
    }
    Step *s = cg_new_step(L, STEP_KERNEL, node);
    s->fn = arena_printf(L->p->arena, "k%d_%s", L->p->nsteps - 1, what);
    fflush(L->src);
    s->src_begin = ftell(L->src);
    L->open_kernel = L->p->nsteps - 1;
    s->work = work;
    s->nargs = nargs;
    memcpy(s->args, bufs, sizeof(int) * (size_t)nargs);
    const Node *n = &L->g->nodes[node];
    fprintf(L->src, "\n/* %%%d %s %s", node, ir_op_name(n->op), ir_shape_str(L->p->arena, &n->shape));
    if (n->loc.file) fprintf(L->src, "  (%s:%d)", n->loc.file->name, n->loc.line);
    fprintf(L->src, " */\nKERNEL(%s)(KArgs a)\n{\n    const long N = a.batch;\n    (void)N;\n", s->fn);
    for (int k = 0; k < nargs; k++) {
        bool out = names[k][0] == '=';
        s->outs |= (unsigned)out << k;
        if (bufs[k] >= 0 && L->p->bufs[bufs[k]].bf16)   /* written with mgc_to_bf16() */
            fprintf(L->src, "    %smgc_bf16 *RESTRICT %s = (%smgc_bf16 *)a.t[%d];\n", out ? "" : "const ", names[k] + out, out ? "" : "const ", k);
        else
            fprintf(L->src, "    %sfloat *RESTRICT %s = a.t[%d];\n", out ? "" : "const ", names[k] + out, k);
    }
    return s;
}

int cg_arg(Lower *L, CgArgs *a, int buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const char *name = arena_vprintf(L->p->arena, fmt, ap);
    va_end(ap);
    if (a->n == CG_MAXARGS) {
        fprintf(stderr, "mgc: internal error: a kernel's argument %s is its %dth, more than the %d a kernel takes\n", name, a->n + 1,
                CG_MAXARGS);
        abort();
    }
    a->buf[a->n] = buf;
    a->name[a->n] = name;
    return a->n++;
}

Step *cg_kernel_args(Lower *L, int node, const char *what, Dim work, const CgArgs *a)
{
    return cg_kernel(L, node, what, work, a->n, a->buf, a->name);
}

int cg_take_ahead(Lower *L, int from, int first, int max, int (*take)(Lower *L, int node), int *out)
{
    int n = 0;
    out[n++] = first;
    for (int u = from + 1; u < L->g->n && n < max; u++) {
        int t = take(L, u);
        bool seen = t < 0;
        for (int k = 0; k < n && !seen; k++) seen = out[k] == t;
        if (!seen) out[n++] = t;
    }
    return n;
}

Step *cg_group_kernel(Lower *L, int node, const char *what, const CgArgs *a, const long *count, int n)
{
    long total = 0;
    for (int k = 0; k < n; k++) total += count[k];
    return cg_kernel_args(L, node, what, dimc(total), a);
}

void cg_group_piece(Lower *L, long count, int node, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(L->src, "    FOR_EACH(i, %ldL) ", count);
    vfprintf(L->src, fmt, ap);
    fprintf(L->src, "   /* %%%d */\n", node);
    va_end(ap);
}

void cg_body(Lower *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(L->src, fmt, ap);
    va_end(ap);
}

void cg_end_kernel(Lower *L)
{
    fputs("}\n", L->src);
    fflush(L->src);
    L->p->steps[L->open_kernel].src_end = ftell(L->src);
    L->open_kernel = -1;
}

const char *cg_work_str(Lower *L, Dim d)
{
    return d.batch ? arena_printf(L->p->arena, "%ldL * N", d.c) : arena_printf(L->p->arena, "%ldL", d.c);
}

/* A value the kernel's text spells (an attribute, a constant of the layer's shape)
   that is not finite in float32 came past the checks made for the user's values
   (frontend/layers.c, the options, diag_f32_rounding): it would spell "inff" or
   "nanf" and the kernel would not compile. A bug of mgc's: said, and stopped. */
static const char *literal(Lower *L, double v, const char *fmt)
{
    if (!isfinite((float)v)) {
        fprintf(stderr, "mgc: internal error: kernel %s: a literal %g is not a finite float32 (node %%%d)\n",
                L->open_kernel >= 0 ? L->p->steps[L->open_kernel].fn : "(none open)", v, L->node_now);
        abort();
    }
    return arena_printf(L->p->arena, fmt, v);
}

const char *cg_f32(Lower *L, double v) { return literal(L, v, "%#.9gf"); }
const char *cg_f64(Lower *L, double v) { return literal(L, v, "%.9g"); }

Step *cg_gemm(Lower *L, int node, bool ta, bool tb, Dim m, Dim n, Dim k, int a, Dim lda, int b, Dim ldb,
              float beta, int c, Dim ldc)
{
    Step *s = cg_new_step(L, STEP_GEMM, node);
    s->bf16 = L->g->nodes[node].mm == DT_BF16;
    s->ab16 = L->p->bufs[a].bf16 && L->p->bufs[b].bf16;   /* codegen/verify.c: both or neither, and C fp32 */
    s->ta = ta; s->tb = tb;
    s->m = m; s->n = n; s->k = k;
    s->a = a; s->b = b; s->c = c;
    s->lda = lda; s->ldb = ldb; s->ldc = ldc;
    s->alpha = 1.0f;
    s->beta = beta;
    return s;
}

Dim cg_rows_work(Dim rows, long len)
{
    return (Dim){ rows.c * len, rows.batch };
}

void cg_rows_body(Lower *L, Dim rows, long len, const char *setup, const char *stmt)
{
    cg_body(L, "    FOR_EACH(e_, %s) {\n        long row = e_ / %ldL;\n        int at = (int)(e_ %% %ldL);\n%s        %s\n    }\n",
            cg_work_str(L, cg_rows_work(rows, len)), len, len, setup, stmt);
}

int cg_out_buf(Lower *L, int node)
{
    const Node *n = &L->g->nodes[node];
    int b;
    if (L->in_bucket[node] >= 0) {
        b = cg_new_buf(L, BUF_VIEW, dim_of(&n->shape), ir_op_name(n->op), node);
        L->p->bufs[b].alias = L->in_bucket[node];
        L->p->bufs[b].offset = L->bucket_at[node];
    } else if (cg_stores_bf16(L, node)) {
        b = cg_new_bf16_buf(L, BUF_ACT, dim_of(&n->shape), arena_printf(L->p->arena, "%s, stored bf16", ir_op_name(n->op)), node);
    } else {
        b = cg_new_buf(L, BUF_ACT, dim_of(&n->shape), ir_op_name(n->op), node);
    }
    L->p->node_buf[node] = b;
    return b;
}

/* A block's sums over one channel c's N*HW elements, into the accumulators
   named in accs, of type `type` (declared and summed over the block here).
   Each element is `at` (its index in an [N, C, HW] tensor), and body is what
   it adds: "A0 += x[at]; A1 += ..." with A0, A1, ... standing for accs[0],
   .... C: `lanes` (a prelude macro, MGC_LANES or MGC_DLANES) independent
   partial sums per accumulator (chains the compiler can vectorise; one chain
   is bound by the add's latency), then the rows' last HW % lanes; CUDA: one
   lane, the block's threads over consecutive elements. `reads` names the
   [N, C, HW] arrays the body reads ("x dy"): on C each image's row of them is
   prefetched 4 images ahead (the rows are a stride of C * HW apart, too
   far and too short for the hardware prefetcher: without it these passes
   wait on memory). */
void cg_lane_sums(Lower *L, const char *type, const char *lanes, int C, int HW, int nacc, const char *const *accs,
                  const char *reads, const char *body)
{
    /* PREFETCH_ROW of each array in reads, 4 images ahead */
    char *pf = arena_printf(L->p->arena, "%s", "");
    for (const char *r = reads; *r;) {
        while (*r == ' ') r++;
        int len = (int)strcspn(r, " ");
        if (len) pf = arena_printf(L->p->arena, "%s PREFETCH_ROW(%.*s + ((k + 4) * %d + c) * %d, %d);", pf, len, r, C, HW, HW);
        r += len;
    }
    /* body with An -> accs[n]_l[l] (lanes), and -> accs[n]_l[0] (the tail) */
    char *in_lanes = arena_printf(L->p->arena, "%s", body), *tail = arena_printf(L->p->arena, "%s", body);
    for (int a = 0; a < nacc; a++) {
        char tag[16];
        snprintf(tag, sizeof tag, "A%d", a);
        for (char *hit; (hit = strstr(in_lanes, tag));)
            in_lanes = arena_printf(L->p->arena, "%.*s%s_l[l]%s", (int)(hit - in_lanes), in_lanes, accs[a], hit + strlen(tag));
        for (char *hit; (hit = strstr(tail, tag));)
            tail = arena_printf(L->p->arena, "%.*s%s_l[0]%s", (int)(hit - tail), tail, accs[a], hit + strlen(tag));
    }
    for (int a = 0; a < nacc; a++)
        cg_body(L, "        %s %s_l[%s];\n        for (int l = 0; l < %s; l++) %s_l[l] = 0;\n", type, accs[a], lanes, lanes, accs[a]);
    cg_body(L, "        BLOCK_LOOP2(k, N, j, %d / %s) {\n"
               "            if (j == 0 && k + 4 < N) {%s }\n"
               "            long at0 = (k * %d + c) * %d + j * %s;\n"
               "            for (int l = 0; l < %s; l++) { long at = at0 + l; %s }\n"
               "        }\n"
               "        BLOCK_LOOP2(k, N, j, %d %% %s) {%s%s%s long at = (k * %d + c) * %d + %d / %s * %s + j; %s }\n",
            HW, lanes, pf, C, HW, lanes, lanes, in_lanes, HW, lanes,
            *pf ? arena_printf(L->p->arena, " if (%d / %s == 0 && j == 0 && k + 4 < N) {", HW, lanes) : "", pf, *pf ? " }" : "",
            C, HW, HW, lanes, lanes, tail);
    for (int a = 0; a < nacc; a++)
        cg_body(L, "        %s %s = 0;\n        for (int l = 0; l < %s; l++) %s += %s_l[l];\n"
                   "        %s = BLOCK_SUM(%s);\n", type, accs[a], lanes, accs[a], accs[a], accs[a], accs[a]);
}

int cg_batch_slices(const Lower *L, int C)
{
    if (L->dec->cpu_only || C <= 0) return 1;
    int S = (CG_FILL_BLOCKS + C - 1) / C;
    return S > 64 ? 64 : S;
}

int cg_slices_kernel(Lower *L, int id, const char *what, int C, int S, long per, const CgArgs *in, const char *head)
{
    int part = cg_new_buf(L, BUF_WORK, dimc(per * S * C), "partial sums per slice of the batch", id);
    /* the arrivals: zero when allocated, and set back to zero by each channel's last block,
       so kept from step to step in a memory no other buffer or program shares */
    int arrivals = cg_new_buf(L, BUF_KEEP, dimc(C), "blocks finished per channel", id);
    CgArgs a = { 0 };
    cg_arg(L, &a, part, "=part");
    cg_arg(L, &a, arrivals, "=arrivals");
    for (int k = 0; k < in->n; k++) cg_arg(L, &a, in->buf[k], "%s", in->name[k]);
    Step *s = cg_kernel_args(L, id, what, dimc((long)S * C), &a);
    s->heavy = s->blocks = true;
    cg_body(L, "%s    FOR_EACH_BLOCK(i, %ldL) {\n"
               "        const long s = i / %d, c = i %% %d, n0 = N * s / %d, n1 = N * (s + 1) / %d;   /* slice s: examples [n0, n1) */\n",
            head, (long)S * C, C, C, S, S);
    return part;
}

void cg_slices_combine(Lower *L, int S, const char *combine)
{
    cg_body(L, "        if (BLOCK_LAST((unsigned *)arrivals + c, %d) && BLOCK_LEADER) {   /* channel c's last slice: the %d combined, in order */\n"
               "%s"
               "        }\n"
               "    }\n", S, S, combine);
}

void cg_coords(Lower *L, const Shape *s, const char *index)
{
    cg_body(L, "        long r_ = %s;\n", index);
    for (int k = s->nd - 1; k > 0; k--)
        cg_body(L, "        const long c%d = r_ %% %d; r_ /= %d; (void)c%d;\n", k, s->d[k], s->d[k], k);
    cg_body(L, "        const long c0 = r_; (void)c0;\n");
}

const char *cg_index_of(Lower *L, const Shape *t)
{
    const char *e = t->d[0] == 1 ? "0" : "c0";
    for (int k = 1; k < t->nd; k++)
        e = t->d[k] == 1 ? arena_printf(L->p->arena, "(%s) * %d", e, t->d[k])
                         : arena_printf(L->p->arena, "(%s) * %d + c%d", e, t->d[k], k);
    return e;
}

/* ------------------------------------------------------------------- the update */

/* The buffer of the run's optimizer scalars (Program.opt_scalars), made at the first update;
   the program keeps the optimizer that update was built with. */
static int opt_scalars(Lower *L, const Node *n)
{
    Program *p = L->p;
    if (p->opt_scalars >= 0) return p->opt_scalars;
    const IrAttrs *a = &n->attr;
    if (n->op == OP_ADAMW) {
        p->opt = (IrOptimizer){ .kind = IR_ADAMW, .lr = a->lr, .weight_decay = a->weight_decay, .beta1 = a->beta1,
                                .beta2 = a->beta2, .eps = a->eps };
        p->opt_scalars = cg_new_buf(L, BUF_INPUT, dimc(8), "AdamW scalars (lr, beta1, 1 - lr wd, beta2, eps, lr / (1 - beta1^t), "
                                    "sqrt(1 - beta2^t))", -1);
    } else {
        p->opt = (IrOptimizer){ .kind = IR_SGD, .lr = a->lr, .weight_decay = a->weight_decay, .momentum = a->momentum,
                                .nesterov = a->nesterov };
        p->opt_scalars = cg_new_buf(L, BUF_INPUT, dimc(3), "SGD scalars (lr, momentum, weight decay)", -1);
    }
    return p->opt_scalars;
}

/* An SGD kernel's line for one parameter's element i: its momentum (and Nesterov's look-ahead). */
static void sgd_momentum(Lower *L, const Node *n, const char *velocity)
{
    if (n->attr.nesterov)
        cg_body(L, "        { float v = %s[i] = momentum * %s[i] + gi; gi = gi + momentum * v; }   /* Nesterov */\n", velocity, velocity);
    else
        cg_body(L, "        gi = %s[i] = momentum * %s[i] + gi;\n", velocity, velocity);
}

static void lower_sgd(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    bool mom = n->nin == 3;
    int b[4] = { buf_of(L, n->in[0]), buf_of(L, n->in[1]), mom ? buf_of(L, n->in[2]) : -1, -1 };
    const char *names[4] = { "=param", "grad", "=velocity", NULL };
    int na = mom ? 3 : 2;
    b[na] = opt_scalars(L, n);
    names[na++] = "sgd";
    Step *s = cg_kernel(L, id, "sgd", work, na, b, names);
    s->sgd = true;
    cg_body(L, "    /* PyTorch's SGD: g += wd * p; v = momentum * v + g; p -= lr * v.  sgd = lr, momentum, weight decay */\n");
    cg_body(L, "    const float lr = sgd[0], momentum = sgd[1], wd = sgd[2];\n    (void)momentum;\n");
    cg_body(L, "    FOR_EACH(i, %s) {\n        float gi = grad[i] + wd * param[i];\n", cg_work_str(L, work));
    if (mom) sgd_momentum(L, n, "velocity");
    cg_body(L, "        param[i] -= lr * gi;\n    }\n");
    cg_end_kernel(L);
    L->p->node_buf[id] = buf_of(L, n->in[0]);
}

/* The SGD updates of a group (the fusion pass's; codegen/fuse.c says why groups), their
   gradients in one bucket, or (GPUs, one device) each in a buffer of its own: one grouped
   kernel (cg_group_kernel), a loop a member (on the C target a loop the compiler
   vectorises), each element with lower_sgd's arithmetic.
   first: the group's first update; lowered at its last, with first as its node. */
static void lower_sgd_group(Lower *L, int first)
{
    const Graph *g = L->g;
    Program *p = L->p;
    int members[CG_MAXARGS], nm = 0;
    for (int id = first; id < g->n; id++)
        if (id == first || (g->nodes[id].op == OP_SGD && cg_fused_into(L->dec, id) == first)) members[nm++] = id;
    const Node *n0 = &g->nodes[first];
    bool mom = n0->nin == 3;
    CgArgs a = { 0 };
    long offset[CG_MAXARGS], count[CG_MAXARGS];   /* offset: the member's gradient in the bucket */
    int bucket = -1;
    bool in_bucket = cg_grad_bucket(g, first) >= 0;
    for (int m = 0; m < nm; m++) {
        const Node *n = &g->nodes[members[m]];
        int gb = buf_of(L, n->in[1]);
        long off = 0;
        while (in_bucket && p->bufs[gb].kind == BUF_VIEW) {
            off += p->bufs[gb].offset;
            gb = p->bufs[gb].alias;
        }
        bucket = gb;   /* in a bucket, the same for every member: one IR bucket is one buffer */
        offset[m] = off;
        count[m] = dim_of(&n->shape).c;
        cg_arg(L, &a, buf_of(L, n->in[0]), "=param%d", m);
        if (mom) cg_arg(L, &a, buf_of(L, n->in[2]), "=velocity%d", m);
        if (!in_bucket) cg_arg(L, &a, gb, "grad%d", m);
    }
    if (in_bucket) cg_arg(L, &a, bucket, "grads");
    cg_arg(L, &a, opt_scalars(L, n0), "sgd");
    Step *s = cg_group_kernel(L, first, in_bucket ? "sgd_bucket" : "sgd_group", &a, count, nm);
    s->sgd = true;
    if (in_bucket)
        cg_body(L, "    /* PyTorch's SGD (as sgd) for %d parameters, their gradients in %s at their offsets:\n", nm, p->bufs[bucket].name);
    else
        cg_body(L, "    /* PyTorch's SGD (as sgd) for %d parameters, one launch:\n", nm);
    for (int m = 0; m < nm; m++) {
        const Node *pn = &g->nodes[g->nodes[members[m]].in[0]];
        if (in_bucket) cg_body(L, "       %%%d %s: param%d, grads + %ld\n", members[m], pn->name ? pn->name : "", m, offset[m]);
        else cg_body(L, "       %%%d %s: param%d, grad%d\n", members[m], pn->name ? pn->name : "", m, m);
    }
    cg_body(L, "       sgd = lr, momentum, weight decay */\n");
    cg_body(L, "    const float lr = sgd[0], momentum = sgd[1], wd = sgd[2];\n    (void)momentum;\n");
    for (int m = 0; m < nm; m++) {   /* one loop a member: each thread's share of each, contiguous (C) */
        cg_body(L, "    FOR_EACH(i, %ldL) {\n        float gi = %s + wd * param%d[i];\n", count[m],
                in_bucket ? arena_printf(p->arena, "grads[%ldL + i]", offset[m]) : arena_printf(p->arena, "grad%d[i]", m), m);
        if (mom) sgd_momentum(L, n0, arena_printf(p->arena, "velocity%d", m));
        cg_body(L, "        param%d[i] -= lr * gi;\n    }\n", m);
    }
    cg_end_kernel(L);
}

/* ----------------------------------------------------------------------- driver */

void cg_lower_view(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int base = buf_of(L, n->in[0]);
    int off = n->op == OP_SLICE ? n->attr.offset : 0;
    while (L->p->bufs[base].kind == BUF_VIEW) {
        off += L->p->bufs[base].offset;
        base = L->p->bufs[base].alias;
    }
    int b = cg_new_buf(L, BUF_VIEW, dim_of(&n->shape), ir_op_name(n->op), id);
    L->p->bufs[b].alias = base;
    L->p->bufs[b].offset = off;
    L->p->node_buf[id] = b;
}

static void pin(Program *p, int b)
{
    while (b >= 0 && p->bufs[b].kind == BUF_VIEW) b = p->bufs[b].alias;
    if (b >= 0) p->bufs[b].pinned = true;
}

/* PyTorch's AdamW for one parameter: decoupled weight decay, then the moments and the bias-corrected step */
void cg_lower_adamw(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Dim work = dim_of(&n->shape);
    int b[5] = { buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[3]), opt_scalars(L, n) };
    Step *s = cg_kernel(L, id, "adamw", work, 5, b, (const char *const[]){ "=param", "grad", "=exp_avg", "=exp_avg_sq", "opt" });
    s->sgd = true;
    cg_body(L, "    /* PyTorch's AdamW: p *= 1 - lr wd; m += (1 - b1)(g - m); v = b2 v + (1 - b2) g^2;\n"
               "       p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).  opt = lr, b1, 1 - lr wd, b2, eps,\n"
               "       lr / (1 - b1^t), sqrt(1 - b2^t), the host's every run */\n");
    cg_body(L, "    const float b1 = opt[1], decay = opt[2], b2 = opt[3], eps = opt[4], step = opt[5], bc2s = opt[6];\n");
    cg_body(L, "    FOR_EACH(i, %s) {\n"
               "        const float g = grad[i], p = param[i] * decay;\n"
               "        const float m = exp_avg[i] = exp_avg[i] + (1.0f - b1) * (g - exp_avg[i]);\n"
               "        const float v = exp_avg_sq[i] = exp_avg_sq[i] * b2 + (1.0f - b2) * g * g;\n"
               "        param[i] = p - step * (m / (sqrtf(v) / bc2s + eps));\n    }\n", cg_work_str(L, work));
    cg_end_kernel(L);
    L->p->node_buf[id] = buf_of(L, n->in[0]);
}

void cg_lower_input(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    L->p->node_buf[id] = cg_new_buf(L, BUF_INPUT, dim_of(&n->shape), n->name, id);
}

void cg_lower_persistent(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Program *p = L->p;
    if (p->node_buf[id] >= 0) return;   /* made early, by a kernel that reads it before its node's turn (gemm_weights) */
    int b = p->node_buf[id] = cg_new_buf(L, BUF_PERSISTENT, dim_of(&n->shape), n->name, id);
    p->bufs[b].shape = n->shape;
    p->bufs[b].init = n->init;
    p->bufs[b].fan_in = n->fan_in;
    p->bufs[b].trainable = n->op == OP_PARAM;
}

void cg_lower_sgd(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int first = cg_fused_into(L->dec, id);
    if (first >= 0) {   /* a member of a group of updates: its parameter; the group's last: its kernel */
        L->p->node_buf[id] = L->p->node_buf[n->in[0]];
        if (L->sgd_last[first] == id) lower_sgd_group(L, first);
    } else if (L->sgd_last[id] > id) {
        L->p->node_buf[id] = L->p->node_buf[n->in[0]];   /* a group's first: lowered at its last */
    } else {
        lower_sgd(L, id);
    }
}

/* Each op's lowering, by the op table's lower column. */
static void (*const lowerings[OP_COUNT])(Lower *L, int id) = {
#define X(e, name, kind, mn, mx, attrs, shape, grad, lower, print) [OP_##e] = cg_lower_##lower,
#include "ops.def"
#undef X
};

/* Lower's per-node and per-bucket maps, allocated and set to none. */
static void lower_init(Lower *L, Arena *a)
{
    const Graph *g = L->g;
    int **fields[] = { &L->col, &L->dyt, &L->dyc, &L->wbf, &L->part, &L->in_bucket, &L->bucket_at, &L->sgd_last };
    for (int k = 0; k < (int)(sizeof fields / sizeof *fields); k++) {
        int *map = *fields[k] = arena_alloc(a, sizeof(int) * (size_t)(g->n + 1));
        for (int id = 0; id <= g->n; id++) map[id] = -1;
    }
    L->bucket_coll = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    L->ready = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    L->waited = arena_alloc(a, sizeof(bool) * (size_t)(g->nbuckets + 1));
    /* groups of SGD updates (fusion): first member -> last member */
    for (int id = 0; id < g->n; id++)
        if (g->nodes[id].op == OP_SGD && cg_fused_into(L->dec, id) >= 0) L->sgd_last[cg_fused_into(L->dec, id)] = id;
}

/* After the steps: what the runtime needs to know, so that it never reads the IR. */
static void lower_finish(Lower *L, Arena *a)
{
    const Graph *g = L->g;
    Program *p = L->p;
    /* What the host reads after a run keeps its own memory (see the planner in runtime/). */
    for (int id = 0; g->grad && id < g->n_forward; id++) {
        Op op = g->nodes[id].op;
        if ((op == OP_PARAM || op == OP_INPUT) && g->grad[id] >= 0) pin(p, p->node_buf[g->grad[id]]);
    }
    int host[5] = { g->input, g->labels, g->loss, g->correct, g->logits };
    for (int k = 0; k < 5; k++)
        if (host[k] >= 0) pin(p, p->node_buf[host[k]]);
    p->input = g->input >= 0 ? p->node_buf[g->input] : -1;
    p->labels = g->labels >= 0 ? p->node_buf[g->labels] : -1;
    p->loss = g->loss >= 0 ? p->node_buf[g->loss] : -1;
    p->correct = g->correct >= 0 ? p->node_buf[g->correct] : -1;
    p->logits = g->logits >= 0 ? p->node_buf[g->logits] : -1;
    p->net_name = g->net_name;
    if (g->input >= 0) p->input_shape = g->nodes[g->input].shape;
    p->classes = g->logits >= 0 ? g->nodes[g->logits].shape.d[1] : 0;
    p->input_grad = g->grad && g->input >= 0 && g->grad[g->input] >= 0 ? p->node_buf[g->grad[g->input]] : -1;
    p->param_scalars = ir_param_count(g, &p->param_tensors);
    p->params = arena_alloc(a, sizeof(ProgParam) * (size_t)(p->param_tensors + 1));
    for (int id = 0; g->grad && id < g->n_forward; id++)
        if (g->nodes[id].op == OP_PARAM && g->grad[id] >= 0)
            p->params[p->nparams++] = (ProgParam){ p->node_buf[id], p->node_buf[g->grad[id]] };
}

/* Scratch buffers (im2col columns, transposed gradients) are not IR tensors,
   whose sizes the builders check: held to the same limit, so that every
   count fits an int and a plan of up to 2^20 examples fits a size_t. 0, or -1 said. */
static int check_sizes(const Graph *g, const Program *p)
{
    for (int b = 0; b < p->nbufs; b++) {
        if (p->bufs[b].size.c <= INT_MAX) continue;
        const Buf *B = &p->bufs[b];
        Loc at = B->node >= 0 ? g->nodes[B->node].loc : (Loc){ 0 };
        diag_at(g->diag, at, "%s: its %s would hold %ld floats%s (more than %d); make the layer or its input smaller",
                B->node >= 0 ? ir_op_name(g->nodes[B->node].op) : "a step", B->name ? B->name : "buffer", B->size.c,
                B->size.batch ? " per example" : "", INT_MAX);
        return -1;
    }
    return 0;
}

int cg_lower(const Graph *g, Arena *a, const CgDecisions *dec, Program *p)
{
    CgDecisions own;
    if (!dec) {   /* the passes with their defaults: fusion on, strategies chosen per layer */
        static const CgOptions defaults = { .fuse = true, .conv = -1 };
        cg_decisions_init(&own, g, a);
        cg_fuse(g, &defaults, &own);
        cg_choose_convs(g, &defaults, &own);
        dec = &own;
    }
    memset(p, 0, sizeof *p);
    p->arena = a;
    p->graph = g;
    p->node_buf = arena_alloc(a, sizeof(int) * (size_t)g->n);
    for (int id = 0; id < g->n; id++) p->node_buf[id] = -1;
    CgDecisions *kept = arena_alloc(a, sizeof *kept);   /* dec may be the caller's, or own above: the program's outlives both */
    *kept = *dec;
    p->decided = kept;
    p->control = -1;
    p->opt_scalars = -1;
    Lower L = { .g = g, .p = p, .dec = dec, .open_kernel = -1 };
    lower_init(&L, a);
    char *text = NULL;
    size_t len = 0;
    L.src = open_memstream(&text, &len);
    if (!L.src) return -1;
    cg_dp_prepare(&L);
    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        cg_dp_before(&L, id);
        int into = cg_fused_into(dec, id);
        if (into >= 0 && n->op != OP_SGD) {
            /* computed by the kernel of the node it was fused into: in its buffer,
               or in one of its own that kernel made (a fused bias gradient) */
            if (p->node_buf[id] < 0) p->node_buf[id] = p->node_buf[into];
        } else if (n->op < OP_COUNT) {
            L.node_now = id;
            lowerings[n->op](&L, id);
        }
        cg_dp_after(&L, id);
    }
    cg_dp_finish(&L);
    fclose(L.src);
    p->source = arena_strndup(a, text, len);
    free(text);
    cg_share_kernels(p);
    if (check_sizes(g, p)) return -1;
    lower_finish(&L, a);
    return 0;
}
