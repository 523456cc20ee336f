/*
** Graph basics: the op table, node creation, shapes, parameter lookup.
*/
#include "ir.h"
#include <string.h>
#include <stdlib.h>

static const struct { const char *name; OpKind kind; int min_in, max_in; unsigned long long attrs; const char *lowering; } op_table[OP_COUNT] = {
#define A(attr) IR_ATTR(attr)
#define X(e, name, kind, mn, mx, attrs, shape, grad, lower, print) [OP_##e] = { name, KIND_##kind, mn, mx, attrs, #lower },
#include "ops.def"
#undef X
#undef A
};

const char *ir_op_name(Op op) { return op < OP_COUNT ? op_table[op].name : "?"; }
OpKind ir_op_kind(Op op) { return op_table[op].kind; }

const char *ir_op_kind_name(OpKind kind)
{
    static const char *const names[] = { "SRC", "EW", "GEMM", "KERN", "VIEW", "EFFECT", "COMM" };
    return kind <= KIND_COMM ? names[kind] : "?";
}
unsigned long long ir_op_attrs(Op op) { return op < OP_COUNT ? op_table[op].attrs : 0; }
const char *ir_op_lowering(Op op) { return op < OP_COUNT ? op_table[op].lowering : "?"; }
int ir_op_min_inputs(Op op) { return op_table[op].min_in; }
int ir_op_max_inputs(Op op) { return op_table[op].max_in; }

int ir_op_find(const char *name)
{
    for (int k = 0; k < OP_COUNT; k++)
        if (!strcmp(op_table[k].name, name)) return k;
    return -1;
}

void ir_graph_init(Graph *g, Arena *a, Diag *d, const char *net_name, bool training)
{
    memset(g, 0, sizeof *g);
    g->arena = a;
    g->diag = d;
    g->net_name = net_name ? arena_strdup(a, net_name) : "net";
    g->training = training;
    g->input = g->labels = g->logits = g->loss = g->correct = -1;
    g->n_forward = -1;
}

int ir_node(Graph *g, Op op, Loc loc, int nin, const int *in)
{
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 64;
        g->nodes = arena_grow(g->arena, g->nodes, sizeof(Node) * (size_t)g->cap, sizeof(Node) * (size_t)cap);
        g->cap = cap;
    }
    int id = g->n++;
    Node *n = &g->nodes[id];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->loc = loc;
    n->nin = nin;
    n->grad_of = -1;
    for (int k = 0; k < nin; k++) n->in[k] = in[k];
    return id;
}

const Shape *ir_shape(const Graph *g, int id) { return &g->nodes[id].shape; }

Shape ir_shape_make(int nd, const int *d)
{
    Shape s = { .nd = nd };
    for (int k = 0; k < nd && k < IR_MAXDIM; k++) s.d[k] = d[k];
    return s;
}

long ir_numel(const Shape *s, long batch)
{
    long n = 1;
    for (int k = 0; k < s->nd; k++) n *= s->d[k] == IR_BATCH ? batch : s->d[k];
    return n;
}

bool ir_shape_eq(const Shape *a, const Shape *b)
{
    if (a->nd != b->nd) return false;
    for (int k = 0; k < a->nd; k++)
        if (a->d[k] != b->d[k]) return false;
    return true;
}

char *ir_shape_str(Arena *a, const Shape *s)
{
    char buf[128];
    int p = 0;
    buf[p++] = '[';
    for (int k = 0; k < s->nd; k++) {
        if (k) buf[p++] = ',';
        if (s->d[k] == IR_BATCH) buf[p++] = 'N';
        else p += snprintf(buf + p, sizeof buf - (size_t)p, "%d", s->d[k]);
    }
    buf[p++] = ']';
    buf[p] = 0;
    return arena_strdup(a, buf);
}

unsigned long ir_hash_name(const char *s)
{
    unsigned long h = 1469598103934665603UL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211UL;
    return h;
}

static void pindex_put(Graph *g, int id)
{
    if (2 * (g->pcount + 1) > g->pcap) {
        int *old = g->pslots, oldcap = g->pcap;
        g->pcap = oldcap ? 2 * oldcap : 256;
        g->pslots = arena_alloc(g->arena, sizeof(int) * (size_t)g->pcap);
        for (int i = 0; i < g->pcap; i++) g->pslots[i] = -1;
        g->pcount = 0;
        for (int i = 0; i < oldcap; i++)
            if (old[i] >= 0) pindex_put(g, old[i]);
    }
    unsigned long m = (unsigned long)g->pcap - 1, i = ir_hash_name(g->nodes[id].name) & m;
    while (g->pslots[i] >= 0) i = (i + 1) & m;
    g->pslots[i] = id;
    g->pcount++;
}

int ir_find_param(Graph *g, const char *name)
{
    for (; g->pindexed < g->n; g->pindexed++) {
        const Node *n = &g->nodes[g->pindexed];
        if ((n->op == OP_PARAM || n->op == OP_STATE) && n->name) pindex_put(g, g->pindexed);
    }
    if (!g->pcap) return -1;
    unsigned long m = (unsigned long)g->pcap - 1;
    int first = -1;
    for (unsigned long i = ir_hash_name(name) & m; g->pslots[i] >= 0; i = (i + 1) & m)
        if (!strcmp(g->nodes[g->pslots[i]].name, name) && (first < 0 || g->pslots[i] < first)) first = g->pslots[i];
    return first;
}

long ir_param_count(const Graph *g, int *tensors)
{
    long total = 0;
    int t = 0;
    for (int id = 0; id < g->n; id++)
        if (g->nodes[id].op == OP_PARAM) {
            total += ir_numel(&g->nodes[id].shape, 1);
            t++;
        }
    if (tensors) *tensors = t;
    return total;
}
