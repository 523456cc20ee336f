/*
** Scaled dot-product attention, by head: q [N, Tq, D], k and v [N, Tk, D],
** D split into H heads of dh = D / H features (head h of row t is
** x[(n * T + t) * D + h * dh .. + dh)), so no tensor is reshaped or moved.
** Scores s_ij = q_i . k_j / sqrt(dh); query i sees keys 0..i only where causal.
**
** Nothing of size [N, H, Tq, Tk] is stored, in the forward or the backward
** (FlashAttention's scheme, a query or key per iteration instead of tiles):
**   attention_stats  each query's log-sum-exp of its scores, lse_i (one pass
**                    over its keys, the running maximum rescaling the sum)
**   attention        o_i = sum_j exp(s_ij - lse_i) v_j (a second pass)
**   attention_delta  delta_i = do_i . o_i
**   attention_grad_q dq_i = sum_j p_ij (do_i . v_j - delta_i) k_j / sqrt(dh)
**   attention_grad_k dk_j = sum_i p_ij (do_i . v_j - delta_i) q_i / sqrt(dh)
**   attention_grad_v dv_j = sum_i p_ij do_i
** each recomputing p_ij = exp(s_ij - lse_i); the key gradients loop over the
** queries of their key, so each output is written by one iteration alone (the
** same bits on any number of threads, no atomics). On GPUs every row of
** [N, H, Tq] (or [N, H, Tk]) is one iteration of FOR_EACH. On CPUs (cpu_only
** programs) each iteration is one head of one example, its queries in blocks
** of up to 64: the block's scores [64, Tk] by one CBLAS GEMM into the thread's
** scratch, then the weights, and the products by GEMMs again (o = p v, dp =
** do v^T, dq = ds k, dk += ds^T q, dv += p^T do): the scratch is [64, Tk]
** two to four times, linear in T. A row's maximum and its sum of
** exponentials run in MGC_LANES lanes (vectorised: one chain would wait on
** each add). There, with fusion (fuse.c), the statistics and the output are
** one kernel ("attention": lse, then o from the same block
** of scores) and the three gradients one more ("attention_grad": the block's
** weights made once for dv, ds, dq and dk), the same operations in the same
** order as the separate kernels, which MGC_FUSE=0 keeps.
**
** Dropout on the weights (training): p_ij becomes z_ij p_ij, z_ij 0 with the
** op's probability P, else 1 / (1 - P); then o = (z p) v, dv_j = sum_i z_ij
** p_ij do_i and ds_ij = p_ij (z_ij do_i . v_j - delta_i), delta_i = do_i . o_i
** as before. No mask is stored: z_ij is a hash of the run's seed and the
** weight's place (the global example, head, query, key), made again where
** needed. The op's kernels share one seed (Step.seed_key: its place among the
** net's attention ops), so its backward sees its forward's masks.
*/
#include <math.h>
#include "lower_internal.h"

#define ATTN_SEED_KEY (1ULL << 48)   /* above any step's index, which seeds the other seeded steps */

typedef struct Attn {
    int Tq, Tk, D, H, dh;
    bool causal;
    const char *scale;        /* 1 / sqrt(dh), a float literal */
    float dropout;            /* the probability of dropping a weight, 0 none */
    unsigned long long key;   /* the op's seed key (Step.seed_key) */
} Attn;

/* The sizes of attention op n (its inputs q and k, or o for the delta) */
static Attn attn_of(Lower *L, const Node *n)
{
    const Shape *q = &L->g->nodes[n->in[0]].shape;
    const Shape *k = n->op == OP_ATTN_DELTA ? q : &L->g->nodes[n->in[1]].shape;
    Attn a = { q->d[1], k->d[1], q->d[2], n->attr.heads, q->d[2] / n->attr.heads, n->attr.causal, NULL, 0, 0 };
    a.scale = cg_f32(L, 1.0 / sqrt((double)a.dh));
    if (n->op != OP_ATTN_STATS && n->op != OP_ATTN_DELTA && n->attr.dropout > 0) {
        a.dropout = n->attr.dropout;
        a.key = ATTN_SEED_KEY + (unsigned long long)cg_op_place(L->g, n->in[3], OP_ATTN_STATS);   /* its lse's place */
    }
    return a;
}

/* " * z_ij" for weight (row, j), row = (n * H + h) * Tq + i, counted from the global batch's first
   example (the same masks on any number of replicas); "" without dropout */
static const char *keep(Lower *L, const Attn *a, const char *row, const char *j)
{
    if (!a->dropout) return "";
    return arena_printf(L->p->arena,
                        " * (mgc_uniform(a.seed, ((unsigned long long)a.first * %ldULL + (unsigned long long)(%s)) * %dULL + "
                        "(unsigned long long)(%s)) >= %s ? %s : 0.0f)",
                        (long)a->H * a->Tq, row, a->Tk, j, cg_f32(L, a->dropout), cg_f32(L, 1.0 / (1.0 - a->dropout)));
}

/* A kernel of the op: seeded by the op's key where it drops weights */
static Step *seeded(Step *st, const Attn *a)
{
    if (a->dropout) st->seeded = true, st->seed_key = a->key;
    return st;
}

/* Iteration r's query: n, h, i, and qi (into t, a [N, Tq, D] tensor, as ti) */
static void query_row(Lower *L, const Attn *a, const char *t, const char *ti)
{
    cg_body(L, "        const long n = r / %ldL, h = (r / %d) %% %d, i = r %% %d;\n"
               "        const float *%s = %s + (n * %dL + i) * %d + h * %d;\n",
            (long)a->H * a->Tq, a->Tq, a->H, a->Tq, ti, t, a->Tq, a->D, a->dh);
}

/* The keys query `query` (an expression: "i", or "i0 + i" in a block) sees: [0, jend) */
static const char *keys_end_of(Lower *L, const Attn *a, const char *query)
{
    return a->causal ? arena_printf(L->p->arena, "%s + 1 < %d ? %s + 1 : %d", query, a->Tk, query, a->Tk)
                     : arena_printf(L->p->arena, "%d", a->Tk);
}

static const char *keys_end(Lower *L, const Attn *a) { return keys_end_of(L, a, "i"); }

/* "float s = a . b" over a head's dh features: four partial sums where dh allows (four
   chains of adds instead of one: a product's latency hidden, and vectorisable) */
static const char *dot(Lower *L, const Attn *a, const char *s, const char *x, const char *y)
{
    if (a->dh % 4)
        return arena_printf(L->p->arena, "float %s = 0.0f;\n            for (int d = 0; d < %d; d++) %s += %s[d] * %s[d];\n", s, a->dh,
                            s, x, y);
    return arena_printf(L->p->arena,
                        "float %s0 = 0.0f, %s1 = 0.0f, %s2 = 0.0f, %s3 = 0.0f;\n"
                        "            for (int d = 0; d < %d; d += 4) {\n"
                        "                %s0 += %s[d] * %s[d]; %s1 += %s[d + 1] * %s[d + 1];\n"
                        "                %s2 += %s[d + 2] * %s[d + 2]; %s3 += %s[d + 3] * %s[d + 3];\n"
                        "            }\n"
                        "            float %s = (%s0 + %s1) + (%s2 + %s3);\n",
                        s, s, s, s, a->dh, s, x, y, s, x, y, s, x, y, s, x, y, s, s, s, s, s);
}

/* s = qi . kj / sqrt(dh), kj (vj) key (value) j of query i's head */
static void score(Lower *L, const Attn *a, bool values)
{
    cg_body(L, "            const float *kj = k + (n * %dL + j) * %d + h * %d;\n", a->Tk, a->D, a->dh);
    if (values) cg_body(L, "            const float *vj = v + (n * %dL + j) * %d + h * %d;\n", a->Tk, a->D, a->dh);
    cg_body(L, "            %s            s *= %s;\n", dot(L, a, "s", "qi", "kj"), a->scale);
}

enum { ATTN_BLOCK = 64 };   /* CPUs: the queries of a block, whose scores one GEMM makes */

static void header(Lower *L, const Attn *a, const char *what)
{
    cg_body(L, "    /* %s; %d heads of %d features, %d queries and %d keys%s.\n", what, a->H, a->dh, a->Tq, a->Tk,
            a->causal ? ", causal (query i sees keys 0..i)" : "");
    if (a->dropout)
        cg_body(L, "       Dropout %g: p_ij times z_ij, 0 or 1 / (1 - %g) by a hash of the run's seed and the weight's place "
                   "(no mask stored; the kernels of the net's attention op %llu share one seed)\n", (double)a->dropout,
                (double)a->dropout, a->key - ATTN_SEED_KEY);
    if (L->dec->cpu_only)
        cg_body(L, "       Tiling: an iteration a head of an example; its queries in blocks of %d, each block's scores and "
                   "weights [%d, %d] in the thread's scratch (linear in the keys), never an [N, %d, %d, %d] tensor */\n",
                ATTN_BLOCK, a->Tq < ATTN_BLOCK ? a->Tq : ATTN_BLOCK, a->Tk, a->H, a->Tq, a->Tk);
    else
        cg_body(L, "       Tiling: a thread a row of [N, %d, %d] (a query, or a key for dk and dv), its scores recomputed "
                   "as it goes (online), never an [N, %d, %d, %d] tensor */\n", a->H, a->Tq, a->H, a->Tq, a->Tk);
}

/* ---- CPUs: a head of an example an iteration, its queries in blocks (CBLAS) ---- */

/* The iteration's head (qh, kh, vh, gh: q, k, v, dy of head h of example n, rows D apart), its
   blocks of queries [i0, i0 + bq), each block's scores s = q k^T / sqrt(dh) [bq, Tk] and
   weights p = exp(s - lse) in scratch (p: 0 past the keys a causal query sees); nbuf blocks [64, Tk]
   of scratch: s, dp, and pz and zk where nbuf is 4. */
static void cpu_blocks_in(Lower *L, const Attn *a, const char *kernel, bool weights, bool grad, bool masked, int nbuf)
{
    cg_body(L, "    float *s = mgc_scratch(%dL * %d * %d, \"%s\"), *dp = s + %dL * %d;\n"
               "    (void)dp;\n"
               "    FOR_EACH(bh, %s) {\n"
               "        const long n = bh / %d, h = bh %% %d;\n"
               "        const float *qh = q + n * %ldL + h * %d, *kh = k + n * %ldL + h * %d;\n",
            ATTN_BLOCK, a->Tk, nbuf, kernel, ATTN_BLOCK, a->Tk, cg_work_str(L, dimn(a->H)), a->H, a->H, (long)a->Tq * a->D, a->dh,
            (long)a->Tk * a->D, a->dh);
    if (nbuf > 2) cg_body(L, "        float *pz = dp + %dL * %d, *zk = pz + %dL * %d;\n        (void)zk;\n", ATTN_BLOCK, a->Tk, ATTN_BLOCK, a->Tk);
    if (grad) cg_body(L, "        const float *gh = dy + n * %ldL + h * %d;\n", (long)a->Tq * a->D, a->dh);
    cg_body(L, "        for (int i0 = 0; i0 < %d; i0 += %d) {\n"
               "            const int bq = %d - i0 < %d ? %d - i0 : %d;\n"
               "            cblas_sgemm(MGC_ROW_MAJOR, MGC_NO_TRANS, MGC_TRANS, bq, %d, %d, %s, qh + (long)i0 * %d, %d, kh, %d, 0.0f, s, %d);\n",
            a->Tq, ATTN_BLOCK, a->Tq, ATTN_BLOCK, a->Tq, ATTN_BLOCK, a->Tk, a->dh, a->scale, a->D, a->D, a->D, a->Tk);
    if (!weights) return;
    cg_body(L, "            for (int i = 0; i < bq; i++) {\n"
               "                const long r = (n * %d + h) * %dL + i0 + i;\n"
               "                const int jend = %s;\n"
               "                float *si = s + (long)i * %d;\n"
               "                for (int j = 0; j < jend; j++) si[j] = expf(si[j] - lse[r])%s;\n"
               "                for (int j = jend; j < %d; j++) si[j] = 0.0f;\n"
               "            }\n",
            a->H, a->Tq, keys_end_of(L, a, "i0 + i"), a->Tk, masked ? keep(L, a, "r", "j") : "", a->Tk);
}

static void cpu_blocks(Lower *L, const Attn *a, const char *kernel, bool weights, bool grad, bool masked)
{
    cpu_blocks_in(L, a, kernel, weights, grad, masked, 2);
}

static void cpu_end(Lower *L)
{
    cg_body(L, "        }\n"
    "}\n"
    "free(s);\n");
}

/* ds = p (z do v^T - delta) in s, after dp = do_block vh^T (s holds p); z the text of the dropout
   factor z_ij (" * z_ij", or "" without dropout) */
static void cpu_ds_by(Lower *L, const Attn *a, const char *z)
{
    cg_body(L, "            cblas_sgemm(MGC_ROW_MAJOR, MGC_NO_TRANS, MGC_TRANS, bq, %d, %d, 1.0f, gh + (long)i0 * %d, %d, vh, %d, 0.0f, dp, %d);\n"
               "            for (int i = 0; i < bq; i++) {\n"
               "                const long r = (n * %d + h) * %dL + i0 + i;\n"
               "                const float di = delta[r];\n"
               "                for (int j = 0; j < %d; j++) s[(long)i * %d + j] *= dp[(long)i * %d + j]%s - di;\n"
               "            }\n",
            a->Tk, a->dh, a->D, a->D, a->D, a->Tk, a->H, a->Tq, a->Tk, a->Tk, a->Tk, z);
}

/* The same, z_ij made here */
static void cpu_ds(Lower *L, const Attn *a)
{
    cpu_ds_by(L, a, keep(L, a, "r", "j"));
}

static Step *cpu_kernel(Lower *L, int id, const char *what, const Attn *a, int nargs, const int *b, const char *const *names)
{
    Step *st = seeded(cg_kernel(L, id, what, dimn(a->H), nargs, b, names), a);
    st->heavy = st->c_only = true;
    st->grain = (long)a->Tq * a->Tk * a->dh;
    return st;
}

/* lse (and, where the attention is fused in, o = p v from the same scores: cg_attn_out) */
static void cpu_stats(Lower *L, int id, const Attn *a)
{
    const Node *n = &L->g->nodes[id];
    int att = cg_attn_out(L->dec, id);
    Attn ao = att >= 0 ? attn_of(L, &L->g->nodes[att]) : *a;   /* the output's dropout */
    int b[5] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), -1, -1 };
    if (att >= 0) b[3] = cg_out_buf(L, att), b[4] = buf_of(L, L->g->nodes[att].in[2]);
    const char *kernel = att >= 0 ? "attention" : "attention_stats";
    seeded(cpu_kernel(L, id, kernel, a, att >= 0 ? 5 : 3, b, (const char *const[]){ "=lse", "q", "k", "=o", "v" }), &ao);
    header(L, &ao, att >= 0 ? "lse_i = log sum_j exp(s_ij), s = q k^T / sqrt(dh), and o = p v, p = exp(s - lse), from the same "
                              "scores; a head an iteration, by blocks of queries (CBLAS)"
                            : "lse_i = log sum_j exp(q_i . k_j / sqrt(dh)); a head an iteration, its scores by blocks of queries (CBLAS)");
    cpu_blocks(L, a, kernel, false, false, false);
    cg_body(L, "            for (int i = 0; i < bq; i++) {\n"
               "                const long r = (n * %d + h) * %dL + i0 + i;\n"
               "                const int jend = %s;\n"
               "                float *si = s + (long)i * %d;\n"
               "                float m_l[MGC_LANES], l_l[MGC_LANES], m = -3.402823466e38f, l = 0.0f;\n"
               "                for (int t = 0; t < MGC_LANES; t++) m_l[t] = m, l_l[t] = 0.0f;\n"
               "                const int jl = jend / MGC_LANES * MGC_LANES;\n"
               "                for (int j = 0; j < jl; j += MGC_LANES)\n"
               "                    for (int t = 0; t < MGC_LANES; t++) m_l[t] = si[j + t] > m_l[t] ? si[j + t] : m_l[t];\n"
               "                for (int t = 0; t < MGC_LANES; t++) m = m_l[t] > m ? m_l[t] : m;\n"
               "                for (int j = jl; j < jend; j++) m = si[j] > m ? si[j] : m;\n"
               "                for (int j = 0; j < jl; j += MGC_LANES)\n"
               "                    for (int t = 0; t < MGC_LANES; t++) l_l[t] += expf(si[j + t] - m);\n"
               "                for (int t = 0; t < MGC_LANES; t++) l += l_l[t];\n"
               "                for (int j = jl; j < jend; j++) l += expf(si[j] - m);\n"
               "                const float li = m + logf(l);\n"
               "                lse[r] = li;\n",
            a->H, a->Tq, keys_end_of(L, a, "i0 + i"),
            a->Tk);
    if (att >= 0)
        cg_body(L, "                for (int j = 0; j < jend; j++) si[j] = expf(si[j] - li)%s;\n"
                   "                for (int j = jend; j < %d; j++) si[j] = 0.0f;\n", keep(L, &ao, "r", "j"), a->Tk);
    cg_body(L, "            }\n");
    if (att >= 0)
        cg_body(L, "            cblas_sgemm(MGC_ROW_MAJOR, MGC_NO_TRANS, MGC_NO_TRANS, bq, %d, %d, 1.0f, s, %d, v + n * %ldL + h * %d, %d, 0.0f,\n"
                   "                        o + n * %ldL + h * %d + (long)i0 * %d, %d);\n",
                a->dh, a->Tk, a->Tk, (long)a->Tk * a->D, a->dh, a->D, (long)a->Tq * a->D, a->dh, a->D, a->D);
    cpu_end(L);
    cg_end_kernel(L);
}

static void cpu_attention(Lower *L, int id, const Attn *a)
{
    const Node *n = &L->g->nodes[id];
    int b[5] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[3]) };
    cpu_kernel(L, id, "attention", a, 5, b, (const char *const[]){ "=o", "q", "k", "v", "lse" });
    header(L, a, "o = p v, p = exp(q k^T / sqrt(dh) - lse); a head an iteration, by blocks of queries (CBLAS)");
    cpu_blocks(L, a, "attention", true, false, true);
    cg_body(L, "            cblas_sgemm(MGC_ROW_MAJOR, MGC_NO_TRANS, MGC_NO_TRANS, bq, %d, %d, 1.0f, s, %d, v + n * %ldL + h * %d, %d, 0.0f,\n"
               "                        o + n * %ldL + h * %d + (long)i0 * %d, %d);\n",
            a->dh, a->Tk, a->Tk, (long)a->Tk * a->D, a->dh, a->D, (long)a->Tq * a->D, a->dh, a->D, a->D);
    cpu_end(L);
    cg_end_kernel(L);
}

/* dq = ds k / sqrt(dh) a block at a time; dk += ds^T q / sqrt(dh), dv += p^T do over the blocks */
static void cpu_grad(Lower *L, int id, const Attn *a)
{
    const Node *n = &L->g->nodes[id];
    bool q = n->op == OP_ATTN_BWD_Q, key = n->op == OP_ATTN_BWD_K;
    int b[7] = { cg_out_buf(L, id) };
    for (int k = 0; k < 6; k++) b[k + 1] = buf_of(L, n->in[k]);
    if (q || key)
        cpu_kernel(L, id, ir_op_name(n->op), a, 7, b, (const char *const[]){ "=dx", "q", "k", "v", "lse", "delta", "dy" });
    else
        cpu_kernel(L, id, ir_op_name(n->op), a, 5, (const int[]){ b[0], b[1], b[2], b[4], b[6] },
                   (const char *const[]){ "=dx", "q", "k", "lse", "dy" });
    header(L, a, q ? "dq = ds k / sqrt(dh), ds = p (do v^T - delta); a head an iteration, by blocks of queries (CBLAS)"
                 : key ? "dk = sum over the blocks of queries of ds^T q / sqrt(dh) (CBLAS)" : "dv = sum over the blocks of queries of p^T do (CBLAS)");
    cpu_blocks(L, a, ir_op_name(n->op), true, true, !q && !key);   /* dv: sum_i z_ij p_ij do_i */
    if (!q && !key) {
        cg_body(L, "            (void)qh;\n"
                   "            cblas_sgemm(MGC_ROW_MAJOR, MGC_TRANS, MGC_NO_TRANS, %d, %d, bq, 1.0f, s, %d, gh + (long)i0 * %d, %d, i0 ? 1.0f : 0.0f,\n"
                   "                        dx + n * %ldL + h * %d, %d);\n",
                a->Tk, a->dh, a->Tk, a->D, a->D, (long)a->Tk * a->D, a->dh, a->D);
    } else {
        cg_body(L, "            const float *vh = v + n * %ldL + h * %d;\n", (long)a->Tk * a->D, a->dh);
        cpu_ds(L, a);
        if (q)
            cg_body(L, "            cblas_sgemm(MGC_ROW_MAJOR, MGC_NO_TRANS, MGC_NO_TRANS, bq, %d, %d, %s, s, %d, kh, %d, 0.0f,\n"
                       "                        dx + n * %ldL + h * %d + (long)i0 * %d, %d);\n",
                    a->dh, a->Tk, a->scale, a->Tk, a->D, (long)a->Tq * a->D, a->dh, a->D, a->D);
        else
            cg_body(L, "            cblas_sgemm(MGC_ROW_MAJOR, MGC_TRANS, MGC_NO_TRANS, %d, %d, bq, %s, s, %d, qh + (long)i0 * %d, %d, i0 ? 1.0f : 0.0f,\n"
                       "                        dx + n * %ldL + h * %d, %d);\n",
                    a->Tk, a->dh, a->scale, a->Tk, a->D, a->D, (long)a->Tk * a->D, a->dh, a->D);
    }
    cpu_end(L);
    cg_end_kernel(L);
}

/* "dq, dk and dv", or those of them that w names (w[k] >= 0) */
static const char *grads_text(Lower *L, const int *w)
{
    const char *name[3] = { "dq", "dk", "dv" }, *t = "";
    int n = (w[0] >= 0) + (w[1] >= 0) + (w[2] >= 0), said = 0;
    for (int k = 0; k < 3; k++)
        if (w[k] >= 0) {
            said++;
            t = arena_printf(L->p->arena, "%s%s%s", t, said == 1 ? "" : said == n ? " and " : ", ", name[k]);
        }
    return t;
}

/* An op's gradients in one kernel (cg_attn_grad: those of dq, dk and dv that exist): a block's
   scores and weights made once, then dv += (z p)^T do, ds = p (z do v^T - delta), dq = ds k / sqrt(dh),
   dk += ds^T q / sqrt(dh): the very operations of the three kernels, so the same numbers */
static void cpu_grads(Lower *L, int id, const Attn *a)
{
    const Node *n = &L->g->nodes[id];
    int w[3], nargs = 0, b[9];
    const char *names[9];
    for (int k = 0; k < 3; k++)
        if ((w[k] = cg_attn_grad(L->dec, id, k)) >= 0) b[nargs] = cg_out_buf(L, w[k]), names[nargs++] = (const char *[]){ "=dq", "=dk", "=dv" }[k];
    bool ds = w[0] >= 0 || w[1] >= 0, pz = a->dropout && w[2] >= 0;   /* ds needed; dv's weights apart from p */
    const char *ins[6] = { "q", "k", "v", "lse", "delta", "dy" };
    for (int k = 0; k < 6; k++)
        if (ds || (k != 2 && k != 4)) b[nargs] = buf_of(L, n->in[k]), names[nargs++] = ins[k];   /* dv alone reads neither v nor delta */
    cpu_kernel(L, id, "attention_grad", a, nargs, b, names);
    header(L, a, arena_printf(L->p->arena, "%s from one pass over the scores: dv += (z p)^T do, ds = p (z do v^T - delta), dq = ds k / sqrt(dh), "
                                            "dk += ds^T q / sqrt(dh); a head an iteration, by blocks of queries (CBLAS)",
                              grads_text(L, w)));
    cpu_blocks_in(L, a, "attention_grad", true, true, false, pz ? 4 : 2);
    if (pz)   /* each weight's factor z_ij made once, for dv's weights and for ds */
        cg_body(L, "            for (int i = 0; i < bq; i++) {\n"
                   "                const long r = (n * %d + h) * %dL + i0 + i;\n"
                   "                const float *si = s + (long)i * %d;\n"
                   "                float *zi = zk + (long)i * %d;\n"
                   "                for (int j = 0; j < %d; j++) zi[j] = 1.0f%s;\n"
                   "                for (int j = 0; j < %d; j++) pz[(long)i * %d + j] = si[j] * zi[j];\n"
                   "            }\n",
                a->H, a->Tq, a->Tk, a->Tk, a->Tk, keep(L, a, "r", "j"), a->Tk, a->Tk);
    if (w[2] >= 0)
        cg_body(L, "            cblas_sgemm(MGC_ROW_MAJOR, MGC_TRANS, MGC_NO_TRANS, %d, %d, bq, 1.0f, %s, %d, gh + (long)i0 * %d, %d, i0 ? 1.0f : 0.0f,\n"
                   "                        dv + n * %ldL + h * %d, %d);\n",
                a->Tk, a->dh, pz ? "pz" : "s", a->Tk, a->D, a->D, (long)a->Tk * a->D, a->dh, a->D);
    if (ds) {
        cg_body(L, "            const float *vh = v + n * %ldL + h * %d;\n", (long)a->Tk * a->D, a->dh);
        cpu_ds_by(L, a, pz ? arena_printf(L->p->arena, " * zk[(long)i * %d + j]", a->Tk) : keep(L, a, "r", "j"));
    }
    if (w[0] >= 0)
        cg_body(L, "            cblas_sgemm(MGC_ROW_MAJOR, MGC_NO_TRANS, MGC_NO_TRANS, bq, %d, %d, %s, s, %d, kh, %d, 0.0f,\n"
                   "                        dq + n * %ldL + h * %d + (long)i0 * %d, %d);\n",
                a->dh, a->Tk, a->scale, a->Tk, a->D, (long)a->Tq * a->D, a->dh, a->D, a->D);
    if (w[1] >= 0)
        cg_body(L, "            cblas_sgemm(MGC_ROW_MAJOR, MGC_TRANS, MGC_NO_TRANS, %d, %d, bq, %s, s, %d, qh + (long)i0 * %d, %d, i0 ? 1.0f : 0.0f,\n"
                   "                        dk + n * %ldL + h * %d, %d);\n",
                a->Tk, a->dh, a->scale, a->Tk, a->D, a->D, (long)a->Tk * a->D, a->dh, a->D);
    cpu_end(L);
    cg_end_kernel(L);
}

/* ---- GPUs: a query (or key) an iteration ---- */

/* q, k -> lse [N, H, Tq]: each query's log-sum-exp of its scores, one pass (the running maximum m) */
void cg_lower_attn_stats(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Attn a = attn_of(L, n);
    if (L->dec->cpu_only) {
        cpu_stats(L, id, &a);
        return;
    }
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    cg_kernel(L, id, "attention_stats", dimn(a.H * a.Tq), 3, b, (const char *const[]){ "=lse", "q", "k" })->grain = (long)a.Tk * a.dh;
    header(L, &a, "lse_i = log sum_j exp(q_i . k_j / sqrt(dh))");
    cg_body(L, "    FOR_EACH(r, %s) {\n", cg_work_str(L, dimn(a.H * a.Tq)));
    query_row(L, &a, "q", "qi");
    cg_body(L, "        const long jend = %s;\n"
               "        float m = -3.402823466e38f, l = 0.0f;\n"
               "        for (long j = 0; j < jend; j++) {\n", keys_end(L, &a));
    score(L, &a, false);
    cg_body(L, "            if (s > m) { l = l * expf(m - s) + 1.0f; m = s; } else l += expf(s - m);\n"
               "        }\n"
               "        lse[r] = m + logf(l);\n    }\n");
    cg_end_kernel(L);
}

/* q, k, v, lse -> o: o_i = sum_j exp(s_ij - lse_i) v_j */
void cg_lower_attention(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Attn a = attn_of(L, n);
    if (L->dec->cpu_only) {
        cpu_attention(L, id, &a);
        return;
    }
    int b[5] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[3]) };
    seeded(cg_kernel(L, id, "attention", dimn(a.H * a.Tq), 5, b, (const char *const[]){ "=o", "q", "k", "v", "lse" }), &a)->grain =
        2L * a.Tk * a.dh;
    header(L, &a, "o_i = sum_j exp(q_i . k_j / sqrt(dh) - lse_i) v_j");
    cg_body(L, "    FOR_EACH(r, %s) {\n", cg_work_str(L, dimn(a.H * a.Tq)));
    query_row(L, &a, "q", "qi");
    cg_body(L, "        const long jend = %s;\n"
               "        const float li = lse[r];\n"
               "        float acc[%d];\n"
               "        for (int d = 0; d < %d; d++) acc[d] = 0.0f;\n"
               "        for (long j = 0; j < jend; j++) {\n", keys_end(L, &a), a.dh, a.dh);
    score(L, &a, true);
    cg_body(L, "            const float p = expf(s - li)%s;\n"
               "            for (int d = 0; d < %d; d++) acc[d] += p * vj[d];\n"
               "        }\n"
               "        float *oi = o + (n * %dL + i) * %d + h * %d;\n"
               "        for (int d = 0; d < %d; d++) oi[d] = acc[d];\n    }\n", keep(L, &a, "r", "j"), a.dh, a.Tq, a.D, a.dh, a.dh);
    cg_end_kernel(L);
}

/* o, do -> delta [N, H, Tq]: delta_i = do_i . o_i */
void cg_lower_attn_delta(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Attn a = attn_of(L, n);
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    cg_kernel(L, id, "attention_delta", dimn(a.H * a.Tq), 3, b, (const char *const[]){ "=delta", "o", "dy" })->grain = a.dh;
    cg_body(L, "    /* delta_i = do_i . o_i, by head (%d of %d features) */\n", a.H, a.dh);
    cg_body(L, "    FOR_EACH(r, %s) {\n", cg_work_str(L, dimn(a.H * a.Tq)));
    query_row(L, &a, "o", "oi");
    cg_body(L, "        const float *gi = dy + (n * %dL + i) * %d + h * %d;\n"
               "        float s = 0.0f;\n"
               "        for (int d = 0; d < %d; d++) s += gi[d] * oi[d];\n"
               "        delta[r] = s;\n    }\n", a.Tq, a.D, a.dh, a.dh);
    cg_end_kernel(L);
}

/* dq: one query per iteration, over the keys it sees */
static void grad_q(Lower *L, const Attn *a)
{
    cg_body(L, "    FOR_EACH(r, %s) {\n", cg_work_str(L, dimn(a->H * a->Tq)));
    query_row(L, a, "q", "qi");
    cg_body(L, "        const float *gi = dy + (n * %dL + i) * %d + h * %d;\n"
               "        const long jend = %s;\n"
               "        const float li = lse[r], di = delta[r];\n"
               "        float acc[%d];\n"
               "        for (int d = 0; d < %d; d++) acc[d] = 0.0f;\n"
               "        for (long j = 0; j < jend; j++) {\n", a->Tq, a->D, a->dh, keys_end(L, a), a->dh, a->dh);
    score(L, a, true);
    cg_body(L, "            %s", dot(L, a, "dp", "gi", "vj"));
    cg_body(L, "            const float ds = expf(s - li) * (dp%s - di);\n"
               "            for (int d = 0; d < %d; d++) acc[d] += ds * kj[d];\n"
               "        }\n"
               "        float *dqi = dx + (n * %dL + i) * %d + h * %d;\n"
               "        for (int d = 0; d < %d; d++) dqi[d] = acc[d] * %s;\n    }\n",
            keep(L, a, "r", "j"), a->dh, a->Tq, a->D, a->dh, a->dh, a->scale);
}

/* dk or dv: one key per iteration, over the queries that see it */
static void grad_kv(Lower *L, const Attn *a, bool key)
{
    cg_body(L, "    FOR_EACH(c, %s) {\n"
               "        const long n = c / %ldL, h = (c / %d) %% %d, j = c %% %d;\n"
               "        const float *kj = k + (n * %dL + j) * %d + h * %d;\n"
               "%s"
               "        float acc[%d];\n"
               "        for (int d = 0; d < %d; d++) acc[d] = 0.0f;\n"
               "        for (long i = %s; i < %d; i++) {\n"
               "            const long r = (n * %d + h) * %dL + i;\n"
               "            const float *qi = q + (n * %dL + i) * %d + h * %d, *gi = dy + (n * %dL + i) * %d + h * %d;\n"
               "            %s"
               "            const float p = expf(s * %s - lse[r]);\n",
            cg_work_str(L, dimn(a->H * a->Tk)), (long)a->H * a->Tk, a->Tk, a->H, a->Tk, a->Tk, a->D, a->dh,
            key ? arena_printf(L->p->arena, "        const float *vj = v + (n * %dL + j) * %d + h * %d;\n", a->Tk, a->D, a->dh) : "",
            a->dh, a->dh, a->causal ? "j" : "0", a->Tq, a->H, a->Tq, a->Tq, a->D, a->dh, a->Tq, a->D, a->dh, dot(L, a, "s", "qi", "kj"), a->scale);
    if (key)
        cg_body(L, "            %s"
                   "            const float ds = p * (dp%s - delta[r]);\n"
                   "            for (int d = 0; d < %d; d++) acc[d] += ds * qi[d];\n", dot(L, a, "dp", "gi", "vj"), keep(L, a, "r", "j"), a->dh);
    else
        cg_body(L, "            const float pz = p%s;\n"
                   "            for (int d = 0; d < %d; d++) acc[d] += pz * gi[d];\n", keep(L, a, "r", "j"), a->dh);
    cg_body(L, "        }\n"
               "        float *out = dx + (n * %dL + j) * %d + h * %d;\n"
               "        for (int d = 0; d < %d; d++) out[d] = acc[d]%s%s;\n    }\n",
            a->Tk, a->D, a->dh, a->dh, key ? " * " : "", key ? a->scale : "");
}

/* q, k, v, lse, delta, do -> dq, dk or dv */
void cg_lower_attn_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    Attn a = attn_of(L, n);
    if (L->dec->cpu_only) {
        if (cg_attn_grad(L->dec, id, 0) >= 0 || cg_attn_grad(L->dec, id, 1) >= 0 || cg_attn_grad(L->dec, id, 2) >= 0) cpu_grads(L, id, &a);
        else cpu_grad(L, id, &a);
        return;
    }
    bool q = n->op == OP_ATTN_BWD_Q, key = n->op == OP_ATTN_BWD_K;
    int b[7] = { cg_out_buf(L, id) };
    for (int k = 0; k < 6; k++) b[k + 1] = buf_of(L, n->in[k]);
    Dim work = dimn(a.H * (q ? a.Tq : a.Tk));
    Step *st = seeded(q || key ? cg_kernel(L, id, ir_op_name(n->op), work, 7, b, (const char *const[]){ "=dx", "q", "k", "v", "lse", "delta", "dy" })
                               : cg_kernel(L, id, ir_op_name(n->op), work, 5, (const int[]){ b[0], b[1], b[2], b[4], b[6] },
                                           (const char *const[]){ "=dx", "q", "k", "lse", "dy" }), &a);   /* dv reads neither v nor delta */
    st->grain = 3L * (q ? a.Tk : a.Tq) * a.dh;
    header(L, &a, q ? "dq_i = sum_j p_ij (do_i . v_j - delta_i) k_j / sqrt(dh), p_ij = exp(s_ij - lse_i)"
                  : key ? "dk_j = sum_i p_ij (do_i . v_j - delta_i) q_i / sqrt(dh), p_ij = exp(s_ij - lse_i)"
                        : "dv_j = sum_i p_ij do_i, p_ij = exp(s_ij - lse_i)");
    if (q) grad_q(L, &a);
    else grad_kv(L, &a, key);
    cg_end_kernel(L);
}
