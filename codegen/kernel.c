/*
** The kernel builder (codegen/kernel.h): buffers and steps, the text of a
** kernel, literals, GEMM steps, and the buffers of outputs and parameters,
** for every op family's lowering. It calls nothing of codegen/ but the
** passes' decisions (cg_holds, cg_conv_form: whether an output is stored
** in bf16).
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
#include "kernel.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
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
    b->pack = b->shard_of = -1;
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

/* ------------------------------------------------------------ named holes */

CgHole cg_hole_int(const char *name, int v)
{
    CgHole h = { name, NULL, { 0 } };
    snprintf(h.num, sizeof h.num, "%d", v);
    return h;
}

CgHole cg_hole_long(const char *name, long v)
{
    CgHole h = { name, NULL, { 0 } };
    snprintf(h.num, sizeof h.num, "%ld", v);
    return h;
}

CgHole cg_s(const char *name, const char *text) { return (CgHole){ name, text, { 0 } }; }

enum { CG_MAXHOLES = 64 };

/* The binding of the hole name[0..len), or -1 */
static int hole_of(const CgHole *holes, const char *name, size_t len)
{
    for (int k = 0; holes[k].name; k++)
        if (strlen(holes[k].name) == len && memcmp(holes[k].name, name, len) == 0) return k;
    return -1;
}

static bool hole_name_char(char c) { return c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

bool cg_fill(FILE *f, const char *tmpl, const CgHole *holes, char *err, size_t errlen)
{
    bool used[CG_MAXHOLES] = { false };
    int nholes = 0;
    for (; holes[nholes].name; nholes++) {
        if (nholes == CG_MAXHOLES) { snprintf(err, errlen, "more than %d bindings", CG_MAXHOLES); return false; }
        if (hole_of(holes, holes[nholes].name, strlen(holes[nholes].name)) != nholes) {
            snprintf(err, errlen, "the hole $%s is bound twice", holes[nholes].name);
            return false;
        }
    }
    for (const char *t = tmpl; *t; ) {
        const char *dollar = strchr(t, '$');
        if (!dollar) { fputs(t, f); break; }
        fwrite(t, 1, (size_t)(dollar - t), f);
        const char *name = dollar + 1, *end;
        if (*name == '$') { fputc('$', f); t = name + 1; continue; }
        bool braced = *name == '{';
        if (braced) name++;
        for (end = name; hole_name_char(*end); end++) {}
        if (end == name || (braced && *end != '}')) {
            snprintf(err, errlen, "a '$' that names no hole: \"%.20s\"", dollar);
            return false;
        }
        int k = hole_of(holes, name, (size_t)(end - name));
        if (k < 0) { snprintf(err, errlen, "the hole $%.*s has no binding", (int)(end - name), name); return false; }
        fputs(holes[k].text ? holes[k].text : holes[k].num, f);
        used[k] = true;
        t = braced ? end + 1 : end;
    }
    for (int k = 0; k < nholes; k++)
        if (!used[k]) { snprintf(err, errlen, "the binding %s fills no hole", holes[k].name); return false; }
    return true;
}

/* cg_fill into f, or mgc's bug said and stopped */
static void fill_or_die(Lower *L, FILE *f, const char *tmpl, const CgHole *holes)
{
    char err[160];
    if (cg_fill(f, tmpl, holes, err, sizeof err)) return;
    fprintf(stderr, "mgc: internal error: kernel %s: %s (node %%%d)\n",
            L->open_kernel >= 0 ? L->p->steps[L->open_kernel].fn : "(none open)", err, L->node_now);
    abort();
}

void cg_text_holes(Lower *L, const char *tmpl, const CgHole *holes) { fill_or_die(L, L->src, tmpl, holes); }

const char *cg_str_holes(Lower *L, const char *tmpl, const CgHole *holes)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) { perror("mgc: open_memstream"); abort(); }
    fill_or_die(L, f, tmpl, holes);
    fclose(f);
    const char *s = arena_strndup(L->p->arena, buf, len);
    free(buf);
    return s;
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

long cg_op_place(const Graph *g, int id, Op op)
{
    long place = 0;
    for (int k = 0; k < id; k++) place += g->nodes[k].op == op;
    return place;
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
const char *cg_name_accs(Lower *L, const char *body, int nacc, const char *const *accs, const char *suffix)
{
    char *text = arena_printf(L->p->arena, "%s", body);
    for (int a = 0; a < nacc; a++) {
        char tag[16];
        snprintf(tag, sizeof tag, "A%d", a);
        for (char *hit; (hit = strstr(text, tag));)
            text = arena_printf(L->p->arena, "%.*s%s%s%s", (int)(hit - text), text, accs[a], suffix, hit + strlen(tag));
    }
    return text;
}

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
    const char *in_lanes = cg_name_accs(L, body, nacc, accs, "_l[l]"), *tail = cg_name_accs(L, body, nacc, accs, "_l[0]");
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

/* ------------------------------------------------ outputs in bf16, parameters */

/* GPUs under --precision bf16: whether node u's output is stored in bf16 by the kernel that
   makes it, because every reader rounds it to bf16 anyway or reads only its sign:
   - a BatchNorm's input gradient that only convolutions' gradients in the GEMM form read,
     as the output gradient they pack (transposed_grad; the zero gradient of a bias before
     the BatchNorm reads nothing);
   - a ReLU's output that only convolutions in the GEMM form read, through im2col (the
     forward's, and the weight gradient's when it makes the columns again), and the ReLU's
     gradient, for its sign (rounding keeps a sign; only a positive value under 2^-134,
     half bf16's smallest subnormal, would become zero: after a BatchNorm, never seen).
   The same numbers, half the bytes written and read. u's buffer may hold its fused ReLU's
   output (applied in place: a BatchNorm's, an add's): then those are the readers. Only
   where a kernel stores u (a GEMM's output, such as a linear layer's or the dense
   convolution's before their epilogues, stays fp32). */
bool cg_stores_bf16(const Lower *L, int u)
{
    const Graph *g = L->g;
    Op pop = g->nodes[u].op;
    if (L->dec->cpu_only || (pop != OP_BN_BWD_X && pop != OP_BN_APPLY && pop != OP_ADD && pop != OP_RELU)) return false;
    int t = cg_holds(L->dec, u);   /* the tensor the buffer holds */
    Op uop = g->nodes[t].op;
    if (uop != OP_BN_BWD_X && uop != OP_RELU) return false;
    int readers = 0;
    for (int c = t + 1; c < g->n; c++)
        for (int k = 0; k < g->nodes[c].nin; k++) {
            if (g->nodes[c].in[k] != t) continue;
            Op op = g->nodes[c].op;
            bool packs = cg_conv_form(L->dec, c) == CONV_GEMM && cg_packs_bf16(L, c);
            bool rounds = uop == OP_BN_BWD_X
                              ? op == OP_BIAS_BWD   /* before a BatchNorm: exactly zero, dy unread (cg_lower_bias_grad) */
                                    || ((op == OP_CONV2D_BWD_X || op == OP_CONV2D_BWD_W) && k == 0 && packs)
                              : (op == OP_CONV2D && k == 0 && packs) || (op == OP_CONV2D_BWD_W && k == 1 && packs) ||
                                    (op == OP_RELU_BWD && k == 0);
            if (!rounds) return false;
            readers++;
        }
    return readers > 0;
}

void cg_lower_persistent(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Program *p = L->p;
    if (p->node_buf[id] >= 0) return;   /* made early, by a kernel that reads it before its node's turn (gemm_weights) */
    if (L->shard_state && L->shard_state[id]) return;   /* --shard-update: its bucket's slice holds it (codegen/dp.c) */
    int b = p->node_buf[id] = cg_new_buf(L, BUF_PERSISTENT, dim_of(&n->shape), n->name, id);
    p->bufs[b].shape = n->shape;
    p->bufs[b].init = n->init;
    p->bufs[b].fan_in = n->fan_in;
    p->bufs[b].init_arg = n->init_arg;
    p->bufs[b].trainable = n->op == OP_PARAM;
}
