/*
** Linear layers: one BLAS GEMM each for the forward and both gradients, and
** a small epilogue kernel for the bias and a fused ReLU; and the bias
** gradient, shared with the convolutions.
**
** x [N, F], w [O, F], y [N, O] (row-major, as PyTorch stores them); x [N, T, F]
** is N * T rows of F (a transformer's tokens), y [N, T, O].
*/
#include "lower_internal.h"

/* The rows of a linear layer's operand s: N, or N * T of [N, T, F] */
static Dim rows_of(const Shape *s)
{
    return dimn(s->nd == 3 ? s->d[1] : 1);
}

/* Their count as the kernel's text says it: "N", or "16L * N" */
static const char *rows_text(Lower *L, const Shape *s)
{
    return s->nd == 3 ? cg_work_str(L, rows_of(s)) : "N";
}

/* y[N, O] = x[N, F] . w[O, F]^T (GEMM), then the epilogue: + bias, and a fused relu */
void cg_lower_linear(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *ws = &L->g->nodes[n->in[1]].shape;
    int O = ws->d[0], F = ws->d[1];
    int y = cg_out_buf(L, id);
    int act = cg_act(L->dec, id);
    bool bias = n->nin == 3;
    Dim rows = rows_of(&n->shape);
    cg_gemm(L, id, false, true, rows, dimc(O), dimc(F), buf_of(L, n->in[0]), dimc(F), buf_of(L, n->in[1]), dimc(F), 0.0f, y, dimc(O));
    if (!bias && act < 0) return;
    int act_out = cg_act_beside(L->dec, id);
    int b[3] = { y, -1, -1 }, nb = 1;
    const char *names[3] = { "=y" };
    if (act_out >= 0) b[nb] = cg_out_buf(L, act_out), names[nb++] = "=ya";
    if (bias) b[nb] = buf_of(L, n->in[2]), names[nb++] = "bias";
    const char *kind = act < 0 ? "linear_epilogue" : arena_printf(L->p->arena, "linear_epilogue_%s", ir_op_name((Op)act));
    if (!L->dec->cpu_only) {   /* GPUs: an element per thread (cg_rows_body) */
        cg_kernel(L, id, kind, cg_rows_work(rows, O), nb, b, names);
        cg_body(L, "    /* y is [%s, %d]; an element per iteration */\n", rows_text(L, &n->shape), O);
        cg_rows_body(L, rows, O, arena_printf(L->p->arena, "        float v = y[row * %dL + at]%s;\n", O, bias ? " + bias[at]" : ""),
                     cg_store(L, id, "y", arena_printf(L->p->arena, "row * %dL + at", O), "v"));
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, kind, rows, nb, b, names)->grain = O;
    cg_body(L, "    /* y is [%s, %d]; one row per iteration */\n", rows_text(L, &n->shape), O);
    cg_body(L, "    FOR_EACH(r, %s) {\n        float *yr = y + r * %d;\n        for (int o = 0; o < %d; o++) {\n"
               "            float v = yr[o]%s;\n            %s\n        }\n    }\n",
            rows_text(L, &n->shape), O, O, bias ? " + bias[o]" : "", cg_store(L, id, "yr", "o", "v"));
    cg_end_kernel(L);
}

/* dx[N, F] = dy[N, O] . w[O, F] (GEMM, overwrites) */
void cg_lower_linear_grad_x(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *ws = &L->g->nodes[n->in[1]].shape;
    int O = ws->d[0], F = ws->d[1];
    int dx = cg_out_buf(L, id);
    cg_gemm(L, id, false, false, rows_of(&n->shape), dimc(F), dimc(O), buf_of(L, n->in[0]), dimc(O), buf_of(L, n->in[1]), dimc(F), 0.0f,
            dx, dimc(F));
}

/* dw[O, F] = dy[N, O]^T . x[N, F] (GEMM, overwrites) */
void cg_lower_linear_grad_w(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int O = n->shape.d[0], F = n->shape.d[1];
    int dw = cg_out_buf(L, id);
    cg_gemm(L, id, true, false, dimc(O), dimc(F), rows_of(&L->g->nodes[n->in[0]].shape), buf_of(L, n->in[0]), dimc(O), buf_of(L, n->in[1]),
            dimc(F), 0.0f, dw, dimc(F));
}

/* cg_take_ahead's: a bias gradient whose only consumer is a BatchNorm with batch statistics */
static int takes_zero_bias_grad(Lower *L, int u)
{
    const Node *n = &L->g->nodes[u];
    return n->op == OP_BIAS_BWD && L->g->nodes[n->in[0]].op == OP_BN_BWD_X ? u : -1;
}

/* dy [N, O, ...] -> db [O]: the sum over the batch and every inner position; overwrites */
void cg_lower_bias_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Graph *g = L->g;
    const Shape *ds = &g->nodes[n->in[0]].shape;
    int O = ds->d[1];
    int inner = 1;
    for (int k = 2; k < ds->nd; k++) inner *= ds->d[k];
    if (g->nodes[n->in[0]].op == OP_BN_BWD_X) {
        /* The bias of a layer whose only consumer is a BatchNorm with batch statistics:
           its gradient is exactly zero. dy = gamma * invstd * (g - mean(g) - xhat * mean(g * xhat))
           sums to zero over the batch and positions because xhat does (with --sync-bn, over
           the global batch: the replicas' partial sums add up to zero). The sum over dy
           would give only rounding noise, at the cost of a pass over dy (ResNet-18: 2 ms a
           step). The forward keeps the bias: the running mean, and so evaluation, sees it.
           One kernel zeroes the next such gradients too, up to CG_MAXARGS (a launch each
           would cost more than the zeros: ResNet-18 has 17); each is written before any of
           its readers (its bucket's allreduce starts after its node). */
        if (L->p->node_buf[id] >= 0) return;   /* zeroed by an earlier one's kernel */
        int zs[CG_MAXARGS];
        int nz = cg_take_ahead(L, id, id, CG_MAXARGS, takes_zero_bias_grad, zs);
        CgArgs a = { 0 };
        long count[CG_MAXARGS];
        for (int k = 0; k < nz; k++) {
            cg_arg(L, &a, cg_out_buf(L, zs[k]), "=db%d", k);
            count[k] = g->nodes[zs[k]].shape.d[0];
        }
        cg_group_kernel(L, id, "bias_grad_zero", &a, count, nz);
        cg_body(L, "    /* biases that feed only a BatchNorm with batch statistics: their gradients are exactly zero */\n");
        for (int k = 0; k < nz; k++) cg_group_piece(L, count[k], zs[k], "db%d[i] = 0.0f;", k);
        cg_end_kernel(L);
        return;
    }
    int db = cg_out_buf(L, id);
    /* GPUs, a few channels over many positions (LeNet's conv1: 6 channels of 256 x 576,
       predicted a quarter of its step as 6 blocks): S slices of the batch per channel,
       a block each (CG_FILL_BLOCKS in all, about), each channel's S partial sums added
       in order by its last block (cg_slices_combine). */
    int S = cg_batch_slices(L, O);
    if (inner >= 16 && S > 1) {
        CgArgs in = { 0 };
        cg_arg(L, &in, buf_of(L, n->in[0]), "dy");
        cg_arg(L, &in, db, "=db");
        cg_slices_kernel(L, id, "bias_grad_slices", O, S, 1, &in,
                         arena_printf(L->p->arena, "    /* dy is [N, %d, %d]; part[s * %d + c] = the sum over slice s of the batch (of %d) "
                                                   "and the inner positions; db[c] = the slices' sums */\n", O, inner, O, S));
        cg_body(L, "        float acc = 0.0f;\n"
                   "        BLOCK_LOOP2(k, n1 - n0, j, %d) acc += dy[((n0 + k) * %d + c) * %dL + j];\n"
                   "        acc = BLOCK_SUM(acc);\n"
                   "        if (BLOCK_LEADER) part[i] = acc;\n", inner, O, inner);
        cg_slices_combine(L, S, arena_printf(L->p->arena, "            float sum = 0.0f;\n"
                                                          "            for (long k = 0; k < %d; k++) sum += part[k * %d + c];\n"
                                                          "            db[c] = sum;\n", S, O));
        cg_end_kernel(L);
        return;
    }
    int b[2] = { db, buf_of(L, n->in[0]) };
    Step *s = cg_kernel(L, id, "bias_grad", dimc(O), 2, b, (const char *const[]){ "=db", "dy" });
    s->heavy = s->blocks = true;
    /* A reduction per output (FOR_EACH_BLOCK; the limit is as BatchNorm's, codegen/norm.c).
       C: MGC_LANES (16) running sums side by side, a sum the compiler may vectorise without
       reordering a chain, then each row's last inner % 16 positions; CUDA: one lane, the
       block's threads over consecutive positions of the flattened (n, inner) loop. */
    cg_body(L, "    /* dy is [N, %d, %d]; db[c] = sum over n and the inner positions */\n", O, inner);
    cg_body(L, "    FOR_EACH_BLOCK(c, %dL) {\n", O);
    cg_lane_sums(L, "float", "MGC_LANES", O, inner, 1, (const char *const[]){ "acc" }, "", "A0 += dy[at];");   /* dy was just written: in cache */
    cg_body(L, "        if (BLOCK_LEADER) db[c] = acc;\n    }\n");
    cg_end_kernel(L);
}
