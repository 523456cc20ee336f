/*
** Printing the IR (the verifier is ir/verify.c). One node a line:
**   %12 = conv2d %0 %10 %11  stride=1 pad=0        [N,6,24,24]    lenet.net:4:22
** Parameters show their name and initialisation; backward nodes say whose
** gradient they compute.
*/
#include "ir.h"
#include <string.h>

static void attrs(const Node *n, char *buf, size_t size)
{
    buf[0] = 0;
    switch (n->op) {
    case OP_CONV2D: case OP_CONV2D_BWD_X: case OP_CONV2D_BWD_W:
        snprintf(buf, size, " stride=%d pad=%d", n->i[0], n->i[1]);
        break;
    case OP_MAXPOOL: case OP_AVGPOOL: case OP_MAXPOOL_BWD: case OP_AVGPOOL_BWD:
        snprintf(buf, size, " kernel=%d stride=%d pad=%d", n->i[0], n->i[1], n->i[2]);
        break;
    case OP_BN_STATS: case OP_BN_EVAL_STATS:
        snprintf(buf, size, " eps=%g", n->f[0]);
        break;
    case OP_BN_RUNNING:
        snprintf(buf, size, " momentum=%g%s", n->f[0], n->i[0] ? " count=global" : "");
        break;
    case OP_BN_FINISH:
        snprintf(buf, size, " eps=%g count=global", n->f[0]);
        break;
    case OP_BN_BWD_X:
        snprintf(buf, size, "%s", n->i[0] ? " count=global" : "");
        break;
    case OP_ALLREDUCE:
        if (n->i[0] >= 0) snprintf(buf, size, " bucket=%d offset=%d  %s", n->i[0], n->i[1], n->name ? n->name : "");
        else snprintf(buf, size, " alone  %s", n->name ? n->name : "");
        break;
    case OP_DROPOUT_MASK:
        snprintf(buf, size, " p=%g", n->f[0]);
        break;
    case OP_SLICE:
        snprintf(buf, size, " offset=%d", n->i[0]);
        break;
    case OP_CONST:
        snprintf(buf, size, " %g", n->f[0]);
        break;
    case OP_SGD:
        snprintf(buf, size, " lr=%g momentum=%g weight_decay=%g", n->f[0], n->f[1], n->f[2]);
        break;
    case OP_PARAM: case OP_STATE:
        switch (n->init) {
        case INIT_UNIFORM_FAN_IN: snprintf(buf, size, " %s init=uniform(fan_in=%d)", n->name, n->fan_in); break;
        case INIT_ZEROS: snprintf(buf, size, " %s init=zeros", n->name); break;
        case INIT_ONES: snprintf(buf, size, " %s init=ones", n->name); break;
        case INIT_NONE: snprintf(buf, size, " %s", n->name); break;
        }
        break;
    case OP_INPUT: case OP_LABELS: case OP_LINEAR: case OP_BN_APPLY: case OP_RELU: case OP_SIGMOID:
    case OP_TANH: case OP_GAP: case OP_RESHAPE: case OP_MUL: case OP_ADD: case OP_XENT: case OP_ACCURACY:
    case OP_XENT_BWD: case OP_LINEAR_BWD_X: case OP_LINEAR_BWD_W: case OP_BIAS_BWD: case OP_RELU_BWD:
    case OP_SIGMOID_BWD: case OP_TANH_BWD: case OP_GAP_BWD: case OP_BN_BWD_PARAMS: case OP_BN_SUM:
    case OP_BN_SQDEV: case OP_COUNT:
        break;   /* no attributes */
    }
}

void ir_print(const Graph *g, FILE *out, int from, int to)
{
    Arena tmp;
    arena_init(&tmp);
    for (int id = from; id < to; id++) {
        const Node *n = &g->nodes[id];
        char line[512], at[256];
        int p = snprintf(line, sizeof line, "%%%-4d = %s", id, ir_op_name(n->op));
        for (int k = 0; k < n->nin; k++) p += snprintf(line + p, sizeof line - (size_t)p, " %%%d", n->in[k]);
        attrs(n, at, sizeof at);
        p += snprintf(line + p, sizeof line - (size_t)p, "%s", at);
        if (n->grad_of >= 0 && n->op != OP_SGD)
            snprintf(line + p, sizeof line - (size_t)p, "  (grad of %%%d)", n->grad_of);
        fprintf(out, "%-64s %-16s", line, ir_shape_str(&tmp, &n->shape));
        if (n->loc.file) fprintf(out, " %s:%d:%d", n->loc.file->name, n->loc.line, n->loc.col);
        fputc('\n', out);
    }
    arena_free(&tmp);
}
