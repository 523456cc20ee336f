/*
** LayerNorm over dimension 1: the features of [N, F], or the channels of
** [N, C, H, W] at each of its P = H * W positions (x[n, c, p] at
** (n * C + c) * P + p: a position's C values are P apart); or over the last
** dimension of [N, T, D], each of its N * T tokens a row of C = D (P = 1).
** stats [N, 2, P] ([N, T, 2]): per row and position the mean and
** 1 / sqrt(var + eps) (biased), in double. Backward: dgamma and dbeta summed over examples and positions;
** dx = invstd (g - mean_c(g) - xhat mean_c(g xhat)), g = dy gamma. Kernels
** overwrite what they write.
**
** On CPUs rows (P = 1) take a row an iteration, each row's sums in
** MGC_DLANES lanes, and with fusion on the statistics and the apply are one
** kernel (fuse.c's cg_ln_apply: the row read once); channels (P > 1) take 8
** positions an iteration side by side, each position's sums in channel order
** as on GPUs, where a thread takes a position (or an element, for the apply).
*/
#include "lower_internal.h"

/* C and P of x (ir/ir.h), and its rows: N, or N * T */
static Dim ln_dims(const Shape *x, int *C, int *P)
{
    *C = ir_ln_channels(x);
    *P = ir_ln_positions(x);
    return dimn(ir_ln_rows(x));
}

/* the rows (img below) as the kernel's text says them: "N", or "5L * N" */
static const char *rows_text(Lower *L, Dim rows)
{
    return rows.c == 1 ? "N" : cg_work_str(L, rows);
}

/* Rows of C contiguous floats (P == 1: tokens, features), in a FOR_EACH over them: sums over
   a row into the doubles accs[0..nacc), declared here, body ("A0 += xp[cc]; ...") adding its
   element cc to A0, A1, ... C: MGC_DLANES partial sums each (the compiler vectorises them; one
   chain waits on the add's latency: 8 cycles an element), combined in lane order; CUDA: one
   lane, the row's order. */
static void row_sums(Lower *L, int C, int nacc, const char *const *accs, const char *body)
{
    const char *lane = cg_name_accs(L, body, nacc, accs, "_l[l]");
    for (int a = 0; a < nacc; a++) cg_body(L, "        double %s_l[MGC_DLANES] = { 0 }, %s = 0.0;\n", accs[a], accs[a]);
    cg_text(L, "        {\n"
               "            int c0 = 0;\n"
               "            for (; c0 + MGC_DLANES <= $C; c0 += MGC_DLANES)\n"
               "                for (int l = 0; l < MGC_DLANES; l++) { const int cc = c0 + l; $lane }\n"
               "            for (int l = 0; c0 + l < $C; l++) { const int cc = c0 + l; $lane }\n"
               "        }\n",
            cg_n("C", C), cg_s("lane", lane));
    for (int a = 0; a < nacc; a++) cg_body(L, "        for (int l = 0; l < MGC_DLANES; l++) %s += %s_l[l];\n", accs[a], accs[a]);
}

/* In a FOR_EACH(row, ...) over rows of C: the row's mean and 1/sqrt(var + eps) (two passes) into
   stats[row * 2] and [row * 2 + 1]; xp the row */
static void row_stats(Lower *L, int C, double eps)
{
    cg_body(L, "        const float *xp = x + row * %dL;\n", C);
    row_sums(L, C, 1, (const char *const[]){ "s" }, "A0 += xp[cc];");
    cg_body(L, "        const double mean = s / %d.0;\n", C);
    row_sums(L, C, 1, (const char *const[]){ "q" }, "double d = xp[cc] - mean; A0 += d * d;");
    cg_body(L, "        stats[row * 2] = (float)mean;\n"
               "        stats[row * 2 + 1] = (float)(1.0 / sqrt(q / %d.0 + %s));\n", C, cg_f64(L, eps));
}

/* In a FOR_EACH(row, ...) over rows of C: y's row from x's (xp) and its stats */
static void row_apply(Lower *L, int C)
{
    cg_text(L, "        const float m = stats[row * 2], is = stats[row * 2 + 1];\n"
               "        float *yp = y + row * ${C}L;\n"
               "        for (int c = 0; c < $C; c++) yp[c] = (xp[c] - m) * is * gamma[c] + beta[c];\n",
            cg_n("C", C));
}

/* CPUs, rows of C (P == 1): stats, and where ln_apply is fused in (cg_ln_apply) y from the
   same row while it is in cache, a row per iteration */
static void ln_rows(Lower *L, int id, Dim rows, int C)
{
    const Node *n = &L->g->nodes[id];
    int ap = cg_ln_apply(L->dec, id);
    const Node *a = ap >= 0 ? &L->g->nodes[ap] : NULL;
    int b[5] = { cg_out_buf(L, id), buf_of(L, n->in[0]), -1, -1, -1 };
    if (a) b[2] = cg_out_buf(L, ap), b[3] = buf_of(L, a->in[2]), b[4] = buf_of(L, a->in[3]);
    cg_kernel(L, id, a ? "layernorm" : "ln_stats", rows, a ? 5 : 2, b,
              (const char *const[]){ "=stats", "x", "=y", "gamma", "beta" })->grain = C;
    cg_body(L, "    /* x [%s, %d]: each row's mean and 1/sqrt(var + eps)%s; a row an iteration */\n", rows_text(L, rows), C,
            a ? ", and y = (x - mean) * invstd * gamma + beta" : "");
    cg_body(L, "    FOR_EACH(row, %s) {\n", cg_work_str(L, rows));
    row_stats(L, C, n->attr.eps);
    if (a) row_apply(L, C);
    cg_body(L, "    }\n");
    cg_end_kernel(L);
}

/* CPUs, x [rows, C, P] (P > 1: a position's C values P apart): a FOR_EACH over blocks of 8
   positions of a row, body once for a whole block ($W 8) and once for the row's last (w), with
   xp (x at the block's first position) and so (its index in stats [rows, 2, P]); $C, $P and
   $eps (eps, where given) bound. A position an iteration summed its channels in one chain,
   waiting on the add's latency; eight side by side vectorise, each one's sums in that order. */
static const char *block_body(Lower *L, const char *body, int C, int P, const char *W, const char *eps)
{
    return eps ? cg_str(L, body, cg_n("C", C), cg_n("P", P), cg_s("W", W), cg_s("eps", eps))
               : cg_str(L, body, cg_n("C", C), cg_n("P", P), cg_s("W", W));   /* (a binding no hole uses is refused) */
}

static void position_blocks(Lower *L, Dim rows, int P, int C, const char *body, const char *eps)
{
    const char *full = block_body(L, body, C, P, "8", eps), *last = block_body(L, body, C, P, "w", eps);
    cg_text(L, "    FOR_EACH(blk, $work) {\n"
               "        const long img = blk / $PB, p0 = blk % $PB * 8;\n"
               "        const long at = img * ${CP}L + p0, so = img * ${P2}L + p0;\n"
               "        const float *xp = x + at;\n"
               "        if (p0 + 8 <= $P) {\n$full"
               "        } else {\n"
               "            const int w = (int)($P - p0);\n$last"
               "        }\n"
               "    }\n",
            cg_s("work", cg_work_str(L, dimn(rows.c * ((P + 7) / 8)))), cg_n("PB", (P + 7) / 8), cg_n("CP", (long)C * P),
            cg_n("P2", 2L * P), cg_n("P", P), cg_s("full", full), cg_s("last", last));
}

/* GPUs, rows of C contiguous floats (P == 1: tokens, features): a block a row, its threads over
   the channels (a thread a row, its C channels in one chain: the ViT's [N * 50, 128] input
   gradients 62 us each on an H100 at batch 256 by the cost model, now 6 us). */
static void gpu_rows_open(Lower *L, int id, const char *what, Dim rows, int nb, const int *b, const char *const *names)
{
    Step *st = cg_kernel(L, id, what, rows, nb, b, names);
    st->heavy = st->blocks = true;
    cg_body(L, "    FOR_EACH_BLOCK(row, %s) {\n", cg_work_str(L, rows));
}

static void gpu_rows_stats(Lower *L, int id, Dim rows, int C, const int *b)
{
    gpu_rows_open(L, id, "ln_stats", rows, 2, b, (const char *const[]){ "=stats", "x" });
    cg_body(L, "    /* each row's mean and 1/sqrt(var + eps) over its %d channels; a block a row */\n", C);
    cg_text(L, "        const float *xr = x + row * ${C}L;\n"
               "        double s = 0.0, q = 0.0;\n"
               "        BLOCK_LOOP(c, $C) s += xr[c];\n"
               "        s = BLOCK_SUM(s);\n"
               "        const double mean = s / $C.0;\n"
               "        BLOCK_LOOP(c, $C) { double d = xr[c] - mean; q += d * d; }\n"
               "        q = BLOCK_SUM(q);\n"
               "        if (BLOCK_LEADER) stats[row * 2] = (float)mean, stats[row * 2 + 1] = (float)(1.0 / sqrt(q / $C.0 + $eps));\n"
               "    }\n", cg_n("C", C), cg_s("eps", cg_f64(L, L->g->nodes[id].attr.eps)));
    cg_end_kernel(L);
}

static void gpu_rows_grad_x(Lower *L, int id, Dim rows, int C, const int *b)
{
    gpu_rows_open(L, id, "ln_grad_x", rows, 5, b, (const char *const[]){ "=dx", "x", "stats", "gamma", "dy" });
    cg_body(L, "    /* dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, means over rows of %d; a block a row */\n", C);
    cg_text(L, "        const long at = row * ${C}L;\n"
               "        const float mean = stats[row * 2], is = stats[row * 2 + 1];\n"
               "        double sg = 0.0, sgx = 0.0;\n"
               "        BLOCK_LOOP(c, $C) {\n"
               "            float g = dy[at + c] * gamma[c], xh = (x[at + c] - mean) * is;\n"
               "            sg += g; sgx += (double)g * xh;\n"
               "        }\n"
               "        sg = BLOCK_SUM(sg);\n"
               "        sgx = BLOCK_SUM(sgx);\n"
               "        const float mg = (float)(sg / $C.0), mgx = (float)(sgx / $C.0);\n"
               "        BLOCK_LOOP(c, $C) {\n"
               "            float g = dy[at + c] * gamma[c], xh = (x[at + c] - mean) * is;\n"
               "            dx[at + c] = is * (g - mg - xh * mgx);\n"
               "        }\n"
               "    }\n", cg_n("C", C));
    cg_end_kernel(L);
}

/* x -> stats [N, 2, P]: one position per iteration (CPUs: a row, or 8 positions) */
void cg_lower_ln_stats(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int C, P;
    Dim rows = ln_dims(&L->g->nodes[n->in[0]].shape, &C, &P), work = dimn(rows.c * P);
    if (P == 1 && L->dec->cpu_only) {
        ln_rows(L, id, rows, C);
        return;
    }
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
    if (P == 1) {   /* GPUs */
        gpu_rows_stats(L, id, rows, C, b);
        return;
    }
    if (L->dec->cpu_only) {
        cg_kernel(L, id, "ln_stats", dimn(rows.c * ((P + 7) / 8)), 2, b, (const char *const[]){ "=stats", "x" })->grain = 8L * C;
        cg_body(L, "    /* x [N, %d, %d]: each position's mean and 1/sqrt(var + eps) over the %d channels, 8 positions an\n"
                   "       iteration (side by side: each position's sums in channel order) */\n", C, P, C);
        position_blocks(L, rows, P, C,
                        "            double s[8] = { 0 }, q[8] = { 0 }, mean[8];\n"
                        "            for (int c = 0; c < $C; c++) for (int t = 0; t < $W; t++) s[t] += xp[(long)c * $P + t];\n"
                        "            for (int t = 0; t < $W; t++) mean[t] = s[t] / $C.0;\n"
                        "            for (int c = 0; c < $C; c++)\n"
                        "                for (int t = 0; t < $W; t++) { double d = xp[(long)c * $P + t] - mean[t]; q[t] += d * d; }\n"
                        "            for (int t = 0; t < $W; t++) {\n"
                        "                stats[so + t] = (float)mean[t];\n"
                        "                stats[so + $P + t] = (float)(1.0 / sqrt(q[t] / $C.0 + $eps));\n"
                        "            }\n", cg_f64(L, n->attr.eps));
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "ln_stats", work, 2, b, (const char *const[]){ "=stats", "x" })->grain = C;
    cg_body(L, "    /* x [N, %d, %d]: each position's mean and 1/sqrt(var + eps) over the %d channels */\n", C, P, C);
    cg_body(L, "    FOR_EACH(pos, %s) {\n"
               "        const long img = pos / %d, p = pos %% %d;\n"
               "        const float *xp = x + img * %ldL + p;\n"
               "        double s = 0.0, q = 0.0;\n"
               "        for (int c = 0; c < %d; c++) s += xp[(long)c * %d];\n"
               "        const double mean = s / %d.0;\n"
               "        for (int c = 0; c < %d; c++) { double d = xp[(long)c * %d] - mean; q += d * d; }\n"
               "        stats[img * %ldL + p] = (float)mean;\n"
               "        stats[img * %ldL + %d + p] = (float)(1.0 / sqrt(q / %d.0 + %s));\n    }\n",
            cg_work_str(L, work), P, P, (long)C * P, C, P, C, C, P, 2L * P, 2L * P, P, C, cg_f64(L, n->attr.eps));
    cg_end_kernel(L);
}

/* x, stats, gamma, beta -> y: one (example, channel) plane per iteration */
void cg_lower_ln_apply(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int C, P;
    Dim rows = ln_dims(&n->shape, &C, &P), work = dimn(rows.c * C);
    int b[5] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[3]) };
    if (P == 1 && L->dec->cpu_only) {   /* a row an iteration (an element each was 5 ns) */
        cg_kernel(L, id, "ln_apply", rows, 5, b, (const char *const[]){ "=y", "x", "stats", "gamma", "beta" })->grain = C;
        cg_body(L, "    /* y = (x - mean) * invstd * gamma + beta; rows [%s, %d] */\n", rows_text(L, rows), C);
        cg_body(L, "    FOR_EACH(row, %s) {\n        const float *xp = x + row * %dL;\n", cg_work_str(L, rows), C);
        row_apply(L, C);
        cg_body(L, "    }\n");
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "ln_apply", work, 5, b, (const char *const[]){ "=y", "x", "stats", "gamma", "beta" })->grain = P;
    cg_body(L, "    /* y = (x - mean) * invstd * gamma + beta; planes [%s*%d, %d] */\n", rows.c == 1 ? "N" : cg_work_str(L, rows), C, P);
    cg_body(L, "    FOR_EACH(plane, %s) {\n"
               "        const long img = plane / %d, c = plane %% %d;\n"
               "        const float *xp = x + plane * %dL, *m = stats + img * %ldL, *is = m + %d;\n"
               "        float *yp = y + plane * %dL;\n"
               "        const float gm = gamma[c], bt = beta[c];\n"
               "        for (int p = 0; p < %d; p++) yp[p] = (xp[p] - m[p]) * is[p] * gm + bt;\n    }\n",
            cg_work_str(L, work), C, C, P, 2L * P, P, P, P);
    cg_end_kernel(L);
}

/* x, stats, dy -> [2, C]: dgamma = sum dy xhat, dbeta = sum dy over examples and positions; one channel per iteration */
/* GPUs: S slices of the batch per channel, a block each (about CG_FILL_BLOCKS in all), its threads
   over the slice's rows and positions; each channel's S partial sums added in order by its last
   block (cg_slices_combine). A thread a channel (or 16) summing every row alone ran the ViT's
   [N * 50, 128] gradients on 8 threads: 66 ms each predicted on an H100 at batch 256, now 5 us. */
static void ln_grad_params_slices(Lower *L, int id, Dim rows, int C, int P)
{
    const Node *n = &L->g->nodes[id];
    int S = cg_batch_slices(L, C);
    CgArgs in = { 0 };
    cg_arg(L, &in, cg_out_buf(L, id), "=dparams");
    cg_arg(L, &in, buf_of(L, n->in[0]), "x");
    cg_arg(L, &in, buf_of(L, n->in[1]), "stats");
    cg_arg(L, &in, buf_of(L, n->in[2]), "dy");
    cg_slices_kernel(L, id, "ln_grad_params_slices", C, S, 2, &in,
                     arena_printf(L->p->arena, "    /* x, dy [%s rows, %d, %d]; part[2 (s * %d + c) + {0, 1}] = slice s's (of %d) sums "
                                               "of dy * xhat and dy over channel c; dparams[c], dparams[%d + c] the slices' sums */\n",
                                  rows_text(L, rows), C, P, C, S, C));
    cg_text(L, "        float g = 0.0f, b = 0.0f;\n"
               "        BLOCK_LOOP2(k, (n1 - n0) * ${R}L, p, ${P}L) {\n"
               "            const long img = n0 * ${R}L + k, at = (img * $C + c) * ${P}L + p;\n"
               "            const float *st = stats + img * ${P2}L, v = dy[at];\n"
               "            g += v * ((x[at] - st[p]) * st[$P + p]);\n"
               "            b += v;\n"
               "        }\n"
               "        g = BLOCK_SUM(g);\n"
               "        b = BLOCK_SUM(b);\n"
               "        if (BLOCK_LEADER) part[2 * i] = g, part[2 * i + 1] = b;\n",
            cg_n("R", rows.c), cg_n("P", P), cg_n("C", C), cg_n("P2", 2L * P));
    cg_slices_combine(L, S, cg_str(L, "            float sg = 0.0f, sb = 0.0f;\n"
                                      "            for (long k = 0; k < $S; k++) sg += part[2 * (k * $C + c)], sb += part[2 * (k * $C + c) + 1];\n"
                                      "            dparams[c] = sg;\n"
                                      "            dparams[$C + c] = sb;\n", cg_n("S", S), cg_n("C", C)));
    cg_end_kernel(L);
}

void cg_lower_ln_grad_params(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int C, P;
    Dim rows = ln_dims(&L->g->nodes[n->in[0]].shape, &C, &P);
    if (!L->dec->cpu_only) {
        ln_grad_params_slices(L, id, rows, C, P);
        return;
    }
    int b[4] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]) };
    if (P == 1 && C >= 16) {   /* rows of C (tokens, features): 16 channels an iteration, each row's 16 read at once */
        cg_kernel(L, id, "ln_grad_params", dimc((C + 15) / 16), 4, b, (const char *const[]){ "=dparams", "x", "stats", "dy" })->heavy = true;
        cg_body(L, "    /* per channel, over %s rows of %d, 16 channels an iteration (each channel's sums in row order) */\n",
                rows_text(L, rows), C);
        cg_body(L, "    FOR_EACH(blk, %dL) {\n"
                   "        const long c0 = blk * 16;\n"
                   "        const int w = %d - c0 < 16 ? (int)(%d - c0) : 16;\n"
                   "        double dg[16], db[16];\n"
                   "        for (int t = 0; t < 16; t++) dg[t] = db[t] = 0.0;\n"
                   "        for (long img = 0; img < %s; img++) {\n"
                   "            const float *xp = x + img * %dL + c0, *gp = dy + img * %dL + c0;\n"
                   "            const float m = stats[img * 2], is = stats[img * 2 + 1];\n"
                   "            for (int t = 0; t < w; t++) { dg[t] += (double)gp[t] * (xp[t] - m) * is; db[t] += gp[t]; }\n"
                   "        }\n"
                   "        for (int t = 0; t < w; t++) { dparams[c0 + t] = (float)dg[t]; dparams[%d + c0 + t] = (float)db[t]; }\n    }\n",
                (C + 15) / 16, C, C, rows_text(L, rows), C, C, C);
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "ln_grad_params", dimc(C), 4, b, (const char *const[]){ "=dparams", "x", "stats", "dy" })->heavy = true;
    cg_body(L, "    /* per channel, over %s %s and %d positions */\n", rows_text(L, rows), rows.c == 1 ? "examples" : "rows", P);
    cg_body(L, "    FOR_EACH(c, %dL) {\n"
               "        double dg = 0.0, db = 0.0;\n"
               "        for (long img = 0; img < %s; img++) {\n"
               "            const float *xp = x + (img * %d + c) * %dL, *gp = dy + (img * %d + c) * %dL;\n"
               "            const float *m = stats + img * %ldL, *is = m + %d;\n"
               "            for (int p = 0; p < %d; p++) { dg += (double)gp[p] * (xp[p] - m[p]) * is[p]; db += gp[p]; }\n"
               "        }\n"
               "        dparams[c] = (float)dg;\n        dparams[%d + c] = (float)db;\n    }\n",
            C, rows_text(L, rows), C, P, C, P, 2L * P, P, P, C);
    cg_end_kernel(L);
}

/* x, stats, gamma, dy -> dx: one position per iteration, its C channels P apart */
void cg_lower_ln_grad_x(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int C, P;
    Dim rows = ln_dims(&n->shape, &C, &P), work = dimn(rows.c * P);
    int b[5] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[3]) };
    if (P > 1 && L->dec->cpu_only) {
        cg_kernel(L, id, "ln_grad_x", dimn(rows.c * ((P + 7) / 8)), 5, b, (const char *const[]){ "=dx", "x", "stats", "gamma", "dy" })->grain = 8L * C;
        cg_body(L, "    /* dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, means over the %d channels;\n"
                   "       8 positions an iteration */\n", C);
        position_blocks(L, rows, P, C,
                        "            float mean[8], is[8], mg[8], mgx[8];\n"
                        "            double sg[8] = { 0 }, sgx[8] = { 0 };\n"
                        "            for (int t = 0; t < $W; t++) { mean[t] = stats[so + t]; is[t] = stats[so + $P + t]; }\n"
                        "            for (int c = 0; c < $C; c++)\n"
                        "                for (int t = 0; t < $W; t++) {\n"
                        "                    float g = dy[at + (long)c * $P + t] * gamma[c], xh = (xp[(long)c * $P + t] - mean[t]) * is[t];\n"
                        "                    sg[t] += g; sgx[t] += (double)g * xh;\n"
                        "                }\n"
                        "            for (int t = 0; t < $W; t++) { mg[t] = (float)(sg[t] / $C.0); mgx[t] = (float)(sgx[t] / $C.0); }\n"
                        "            for (int c = 0; c < $C; c++)\n"
                        "                for (int t = 0; t < $W; t++) {\n"
                        "                    float g = dy[at + (long)c * $P + t] * gamma[c], xh = (xp[(long)c * $P + t] - mean[t]) * is[t];\n"
                        "                    dx[at + (long)c * $P + t] = is[t] * (g - mg[t] - xh * mgx[t]);\n"
                        "                }\n", NULL);
        cg_end_kernel(L);
        return;
    }
    if (P == 1 && !L->dec->cpu_only) {
        gpu_rows_grad_x(L, id, rows, C, b);
        return;
    }
    cg_kernel(L, id, "ln_grad_x", work, 5, b, (const char *const[]){ "=dx", "x", "stats", "gamma", "dy" })->grain = C;
    if (P == 1 && L->dec->cpu_only) {   /* rows of C: the sums in lanes */
        cg_body(L, "    /* dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, means over rows of %d */\n", C);
        cg_text(L, "    FOR_EACH(row, $rows) {\n"
                   "        const long at = row * ${C}L;\n"
                   "        const float mean = stats[row * 2], is = stats[row * 2 + 1];\n",
                cg_s("rows", cg_work_str(L, work)), cg_n("C", C));
        row_sums(L, C, 2, (const char *const[]){ "sg", "sgx" },
                 "float g = dy[at + cc] * gamma[cc], xh = (x[at + cc] - mean) * is; A0 += g; A1 += (double)g * xh;");
        cg_text(L, "        const float mg = (float)(sg / $C.0), mgx = (float)(sgx / $C.0);\n"
                   "        for (int c = 0; c < $C; c++) {\n"
                   "            float g = dy[at + c] * gamma[c], xh = (x[at + c] - mean) * is;\n"
                   "            dx[at + c] = is * (g - mg - xh * mgx);\n        }\n    }\n",
                cg_n("C", C));
        cg_end_kernel(L);
        return;
    }
    cg_body(L, "    /* dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, means over the %d channels */\n", C);
    cg_body(L, "    FOR_EACH(pos, %s) {\n"
               "        const long img = pos / %d, p = pos %% %d;\n"
               "        const long at = img * %ldL + p;\n"
               "        const float mean = stats[img * %ldL + p], is = stats[img * %ldL + %d + p];\n"
               "        double sg = 0.0, sgx = 0.0;\n"
               "        for (int c = 0; c < %d; c++) {\n"
               "            float g = dy[at + (long)c * %d] * gamma[c], xh = (x[at + (long)c * %d] - mean) * is;\n"
               "            sg += g; sgx += (double)g * xh;\n        }\n"
               "        const float mg = (float)(sg / %d.0), mgx = (float)(sgx / %d.0);\n"
               "        for (int c = 0; c < %d; c++) {\n"
               "            float g = dy[at + (long)c * %d] * gamma[c], xh = (x[at + (long)c * %d] - mean) * is;\n"
               "            dx[at + (long)c * %d] = is * (g - mg - xh * mgx);\n        }\n    }\n",
            cg_work_str(L, work), P, P, (long)C * P, 2L * P, 2L * P, P, C, P, P, C, C, C, P, P, P);
    cg_end_kernel(L);
}
