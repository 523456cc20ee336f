/*
** LayerNorm over dimension 1: the features of [N, F], or the channels of
** [N, C, H, W] at each of its P = H * W positions (x[n, c, p] at
** (n * C + c) * P + p: a position's C values are P apart); or over the last
** dimension of [N, T, D], each of its N * T tokens a row of C = D (P = 1).
** stats [N, 2, P] ([N, T, 2]): per row and position the mean and
** 1 / sqrt(var + eps) (biased), in double. Backward: dgamma and dbeta summed over examples and positions;
** dx = invstd (g - mean_c(g) - xhat mean_c(g xhat)), g = dy gamma. Kernels
** overwrite what they write.
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

/* x -> stats [N, 2, P]: one position per iteration */
void cg_lower_ln_stats(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int C, P;
    Dim rows = ln_dims(&L->g->nodes[n->in[0]].shape, &C, &P), work = dimn(rows.c * P);
    int b[2] = { cg_out_buf(L, id), buf_of(L, n->in[0]) };
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
void cg_lower_ln_grad_params(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int C, P;
    Dim rows = ln_dims(&L->g->nodes[n->in[0]].shape, &C, &P);
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
    cg_kernel(L, id, "ln_grad_x", work, 5, b, (const char *const[]){ "=dx", "x", "stats", "gamma", "dy" })->grain = C;
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
