/*
** Printing the IR (the verifier is ir/verify.c). One node a line:
**   %12 = conv2d %0 %10 %11  stride=1 pad=0        [N,6,24,24]    lenet.net:4:22
** Parameters show their name and initialisation; backward nodes say whose
** gradient they compute.
*/
#include "ir.h"
#include <string.h>

static int print_one_int(char *buf, size_t size, const char *label, int v) { return snprintf(buf, size, " %s=%d", label, v); }
static int print_one_float(char *buf, size_t size, const char *label, float v)
{
    return *label ? snprintf(buf, size, " %s=%g", label, (double)v) : snprintf(buf, size, " %g", (double)v);
}
static int print_one_bool(char *buf, size_t size, const char *label, bool v) { return v ? snprintf(buf, size, " %s", label) : 0; }

/* The attributes its op carries, each as " label=value" in ir/attrs.def's
   order (a bool: " label" when set; no label: " value"). */
static void print_attrs(const Node *n, char *buf, size_t size)
{
    unsigned long long has = ir_op_attrs(n->op);
    int p = 0;
    buf[0] = 0;
#define ALWAYS(v) true
#define SET(v) ((v) != 0)
#define ATTR(name, type, label, shown) \
    if ((has & IR_ATTR(name)) && shown(n->attr.name) && p < (int)size) p += print_one_##type(buf + p, size - (size_t)p, label, n->attr.name);
#include "attrs.def"
#undef ATTR
#undef SET
#undef ALWAYS
}

/* a parameter or state buffer: its name and how it starts */
static void print_param(const Node *n, char *buf, size_t size)
{
    switch (n->init) {
    case INIT_UNIFORM_FAN_IN: snprintf(buf, size, " %s init=uniform(fan_in=%d)", n->name, n->fan_in); break;
    case INIT_ZEROS: snprintf(buf, size, " %s init=zeros", n->name); break;
    case INIT_ONES: snprintf(buf, size, " %s init=ones", n->name); break;
    case INIT_CONSTANT: snprintf(buf, size, " %s init=constant(%g)", n->name, (double)n->init_arg); break;
    case INIT_NORMAL: snprintf(buf, size, " %s init=normal(std=%g)", n->name, (double)n->init_arg); break;
    case INIT_NONE: snprintf(buf, size, " %s", n->name); break;
    }
}

/* an allreduce: its bucket and place in it, or alone; and what it sums */
static void print_allreduce(const Node *n, char *buf, size_t size)
{
    if (n->attr.bucket >= 0) snprintf(buf, size, " bucket=%d offset=%d  %s", n->attr.bucket, n->attr.offset, n->name ? n->name : "");
    else snprintf(buf, size, " alone  %s", n->name ? n->name : "");
}

static void (*const printers[OP_COUNT])(const Node *n, char *buf, size_t size) = {
#define X(e, name, kind, mn, mx, attrs, shape, grad, lower, print) [OP_##e] = print_##print,
#include "ops.def"
#undef X
};

void ir_print(const Graph *g, FILE *out, int from, int to)
{
    Arena tmp;
    arena_init(&tmp);
    for (int id = from; id < to; id++) {
        const Node *n = &g->nodes[id];
        char line[512], at[256];
        int p = snprintf(line, sizeof line, "%%%-4d = %s", id, ir_op_name(n->op));
        for (int k = 0; k < n->nin; k++) p += snprintf(line + p, sizeof line - (size_t)p, " %%%d", n->in[k]);
        printers[n->op](n, at, sizeof at);
        p += snprintf(line + p, sizeof line - (size_t)p, "%s", at);
        if (n->grad_of >= 0 && n->op != OP_SGD)
            snprintf(line + p, sizeof line - (size_t)p, "  (grad of %%%d)", n->grad_of);
        /* its element type; a GEMM's in bf16: the type it multiplies in, then what it stores */
        char ty[32];
        if (n->mm != DT_F32) snprintf(ty, sizeof ty, "%s*%s->%s", ir_dtype_name(n->mm), ir_dtype_name(n->mm), ir_dtype_name(n->dtype));
        else snprintf(ty, sizeof ty, "%s", ir_dtype_name(n->dtype));
        fprintf(out, "%-64s %-16s %-14s", line, ir_shape_str(&tmp, &n->shape), ty);
        if (n->loc.file) fprintf(out, " %s:%d:%d", n->loc.file->name, n->loc.line, n->loc.col);
        fputc('\n', out);
    }
    arena_free(&tmp);
}
