/*
** The loss and what is counted beside it: softmax cross-entropy (mean over
** the batch), its gradient, and the number of correct argmax predictions.
** logits are [N, K], labels [N] (a class index stored as float).
*/
#include "lower_internal.h"

/* logits [N, K], labels [N] -> loss [1] (softmax_cross_entropy) or correct [1] (accuracy);
   one reduction over the whole batch (on the C target summed in order) */
void cg_lower_xent(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int K = L->g->nodes[n->in[0]].shape.d[1];
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    bool acc = n->op == OP_ACCURACY;
    cg_kernel(L, id, acc ? "correct" : "softmax_cross_entropy", dimc(1), 3, b,
              (const char *const[]){ acc ? "=correct" : "=loss", "logits", "labels" })->blocks = true;
    cg_body(L, "    /* logits [N, %d], labels [N] (class index as float) */\n", K);
    /* One reduction over the rows (FOR_EACH_BLOCK of 1): C: one thread, the rows in order;
       CUDA: one block, a row per thread. The limit: one block, for N rows of K classes. */
    if (acc)
        cg_body(L, "    FOR_EACH_BLOCK(unused, 1L) {\n        float hits = 0.0f;\n"
                   "        BLOCK_LOOP(r, N) {\n"
                   "            const float *l = logits + r * %d;\n            int best = 0;\n"
                   "            for (int k = 1; k < %d; k++) if (l[k] > l[best]) best = k;\n"
                   "            hits += best == (int)labels[r];\n        }\n"
                   "        hits = BLOCK_SUM(hits);\n"
                   "        if (BLOCK_LEADER) correct[0] = hits;\n    }\n", K, K);
    else if (n->attr.label_smoothing > 0)   /* the target (1 - s) one-hot + s / K: the loss (1 - s) CE + s mean_k(-log p_k) */
        cg_body(L, "    FOR_EACH_BLOCK(unused, 1L) {\n        double total = 0.0;\n"
                   "        BLOCK_LOOP(r, N) {\n"
                   "            const float *l = logits + r * %d;\n            float mx = l[0], all = 0.0f;\n"
                   "            for (int k = 1; k < %d; k++) mx = l[k] > mx ? l[k] : mx;\n"
                   "            float s = 0.0f;\n"
                   "            for (int k = 0; k < %d; k++) { s += expf(l[k] - mx); all += l[k]; }\n"
                   "            float lse = logf(s) + mx;   /* label smoothing %g */\n"
                   "            total += (double)(lse - %s * l[(int)labels[r]] - %s * all);\n"
                   "        }\n        total = BLOCK_SUM(total);\n"
                   "        if (BLOCK_LEADER) loss[0] = (float)(total / (double)N);\n    }\n", K, K, K,
                (double)n->attr.label_smoothing, cg_f32(L, 1.0 - n->attr.label_smoothing), cg_f32(L, n->attr.label_smoothing / K));
    else
        cg_body(L, "    FOR_EACH_BLOCK(unused, 1L) {\n        double total = 0.0;\n"
                   "        BLOCK_LOOP(r, N) {\n"
                   "            const float *l = logits + r * %d;\n            float mx = l[0];\n"
                   "            for (int k = 1; k < %d; k++) mx = l[k] > mx ? l[k] : mx;\n"
                   "            float s = 0.0f;\n"
                   "            for (int k = 0; k < %d; k++) s += expf(l[k] - mx);\n"
                   "            total += (double)(logf(s) + mx - l[(int)labels[r]]);\n"
                   "        }\n        total = BLOCK_SUM(total);\n"
                   "        if (BLOCK_LEADER) loss[0] = (float)(total / (double)N);\n    }\n", K, K, K);
    cg_end_kernel(L);
}

/* logits [N, K], labels [N], dloss [1] -> dlogits [N, K]; one row per iteration; overwrites */
void cg_lower_xent_grad(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int K = n->shape.d[1];
    int b[4] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]) };
    cg_kernel(L, id, "softmax_cross_entropy_grad", dimn(1), 4, b,
              (const char *const[]){ "=dlogits", "logits", "labels", "dloss" });
    cg_body(L, "    /* dlogits = (softmax(logits) - onehot(labels)) * dloss / global batch, one row per iteration */\n");
    cg_body(L, "    FOR_EACH(r, N) {\n"
               "        const float *l = logits + r * %d;\n        float *d = dlogits + r * %d;\n"
               "        float mx = l[0];\n"
               "        for (int k = 1; k < %d; k++) mx = l[k] > mx ? l[k] : mx;\n"
               "        float s = 0.0f;\n"
               "        for (int k = 0; k < %d; k++) s += expf(l[k] - mx);\n"
               "        float scale = dloss[0] / (float)a.global_batch, inv = 1.0f / s;   /* the mean over the global batch */\n"
               "        for (int k = 0; k < %d; k++) d[k] = (expf(l[k] - mx) * inv - %s) * scale;\n"
               "    }\n", K, K, K, K, K,
            n->attr.label_smoothing > 0   /* minus the target: (1 - s) one-hot + s / K */
                ? arena_printf(L->p->arena, "((k == (int)labels[r]) * %s + %s)", cg_f32(L, 1.0 - n->attr.label_smoothing),
                               cg_f32(L, n->attr.label_smoothing / K))
                : "(k == (int)labels[r])");
    cg_end_kernel(L);
}
