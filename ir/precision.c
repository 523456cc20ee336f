/*
** --precision bf16: which nodes multiply in bfloat16 (ir_autocast, ir.h).
**
** PyTorch's autocast runs convolutions and linear layers in bf16 and keeps
** the numerically delicate ops (BatchNorm's statistics, softmax, the loss,
** sums) in float32. mgc marks the GEMM-class nodes, forward and backward:
** their operands are rounded to bf16 (round to nearest, ties to even) as the
** GEMM packs them and the products are summed in float32, as autocast's
** kernels do. Two differences from autocast, both toward float32: the
** tensors between the GEMMs stay float32 (a GEMM's result is not rounded to
** bf16 before the BatchNorm that follows; an activation's gradient is not
** rounded before the GEMM that reads it, where it is), and a depthwise
** convolution (one row per group: memory bound, its cost the bytes, not the
** multiplies) stays float32.
*/
#include "ir.h"

const char *ir_dtype_name(DType t) { return t == DT_BF16 ? "bf16" : "f32"; }

int ir_autocast(Graph *g)
{
    int marked = 0;
    g->precision = DT_BF16;
    for (int id = 0; id < g->n; id++) {
        Node *n = &g->nodes[id];
        if (ir_op_kind(n->op) != KIND_GEMM) continue;
        if (n->op == OP_CONV2D || n->op == OP_CONV2D_BWD_X || n->op == OP_CONV2D_BWD_W) {
            /* a weight's dimension 1: the input channels per group (conv2d_grad_w makes the weight) */
            int per_group = n->op == OP_CONV2D_BWD_W ? n->shape.d[1] : g->nodes[n->in[1]].shape.d[1];
            if (ir_groups(&n->attr) > 1 && per_group == 1) continue;   /* depthwise */
        }
        n->mm = DT_BF16;
        marked++;
    }
    return marked;
}
