/*
** matmul: y [..., M, P] = x [..., M, K] w [..., K, P] for each index of the
** dimensions before the last two (an operand with 1 there is broadcast: the
** same matrix for each), either operand read transposed where the op says
** (its gradients: dy w^T, x^T dy). On CPUs (cpu_only programs) one
** iteration is one product, a CBLAS GEMM; on GPUs one output element, its
** dot product over K.
*/
#include "lower_internal.h"

typedef struct Mm {
    Shape batch;              /* y's dimensions before the last two */
    int M, K, P;
    bool ta, tb;
} Mm;

/* The index of an operand's matrix (shape s: its batch dimensions, 1 where broadcast) from the
   coordinates c0.. of y's */
static const char *matrix_of(Lower *L, const Shape *s)
{
    Shape b = *s;
    b.nd -= 2;
    return cg_index_of(L, &b);
}

void cg_lower_matmul(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *as = &L->g->nodes[n->in[0]].shape, *bs = &L->g->nodes[n->in[1]].shape;
    int nd = n->shape.nd;
    Mm m = { n->shape, n->shape.d[nd - 2], as->d[nd - (n->attr.trans_a ? 2 : 1)], n->shape.d[nd - 1], n->attr.trans_a, n->attr.trans_b };
    m.batch.nd -= 2;
    bool cpu = L->dec->cpu_only;
    Dim work = cpu ? dim_of(&m.batch) : cg_rows_work(dim_of(&m.batch), (long)m.M * m.P);
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    cg_kernel(L, id, "matmul", work, 3, b, (const char *const[]){ "=y", "x", "w" })->grain = cpu ? (long)m.M * m.P * m.K : m.K;
    cg_body(L, "    /* y %s = x%s %s times w%s %s: [%d, %d] by [%d, %d] for each index of %s (a %s) */\n",
            ir_shape_str(L->p->arena, &n->shape), m.ta ? "^T" : "", ir_shape_str(L->p->arena, as), m.tb ? "^T" : "",
            ir_shape_str(L->p->arena, bs), m.M, m.K, m.K, m.P, ir_shape_str(L->p->arena, &m.batch),
            cpu ? "GEMM an iteration" : "dot product an output element");
    const char *ai = matrix_of(L, as), *bi = matrix_of(L, bs);
    if (cpu) {
        cg_body(L, "    FOR_EACH(t, %s) {\n", cg_work_str(L, work));
        cg_coords(L, &m.batch, "t");
        cg_body(L, "        cblas_sgemm(MGC_ROW_MAJOR, %s, %s, %d, %d, %d, 1.0f, x + (%s) * %ldL, %d, w + (%s) * %ldL, %d, 0.0f,\n"
                   "                    y + t * %ldL, %d);\n    }\n",
                m.ta ? "MGC_TRANS" : "MGC_NO_TRANS", m.tb ? "MGC_TRANS" : "MGC_NO_TRANS", m.M, m.P, m.K, ai, (long)m.M * m.K,
                m.ta ? m.M : m.K, bi, (long)m.K * m.P, m.tb ? m.K : m.P, (long)m.M * m.P, m.P);
    } else {
        cg_body(L, "    FOR_EACH(e, %s) {\n        const long i = (e / %d) %% %d, j = e %% %d;\n", cg_work_str(L, work), m.P, m.M, m.P);
        cg_coords(L, &m.batch, arena_printf(L->p->arena, "e / %ldL", (long)m.M * m.P));
        cg_body(L, "        const float *ap = x + (%s) * %ldL, *bp = w + (%s) * %ldL;\n"
                   "        float s = 0.0f;\n"
                   "        for (long k = 0; k < %d; k++) s += ap[%s] * bp[%s];\n"
                   "        y[e] = s;\n    }\n",
                ai, (long)m.M * m.K, bi, (long)m.K * m.P, m.K, m.ta ? arena_printf(L->p->arena, "k * %d + i", m.M) : arena_printf(L->p->arena, "i * %d + k", m.K),
                m.tb ? arena_printf(L->p->arena, "j * %d + k", m.K) : arena_printf(L->p->arena, "k * %d + j", m.P));
    }
    cg_end_kernel(L);
}
