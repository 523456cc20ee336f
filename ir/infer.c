/*
** The inference rewrite: the evaluation graph as a library that only
** predicts runs it (mgc export --format c|cuda; mgc NET.net --emit infer-ir).
**
** Requires: a verified graph in evaluation form (g->training false: BatchNorm
** on its running statistics) with its logits.
** Produces: a new graph whose one output is the logits: the loss, the
** accuracy and the labels are gone, and every node the logits do not need.
** With fold, each BatchNorm in evaluation form (bn_eval_stats + bn_apply)
** whose input is a conv2d or linear layer (through the reshape to [N,F,1,1]
** that batchnorm1d makes) whose output nothing else reads is folded into that
** layer: the layer gets new PARAM nodes for its weight and bias, w' = w * s
** and b' = (b - mean) * s + beta with s = gamma / sqrt(var + eps) per output
** channel, and out->folds says how their values come from the checkpoint's
** tensors (ir_fold_values computes them: in double, rounded once to float32).
** A folded layer's numbers differ from the unfolded pair's by float rounding.
**
** Dropout: none remains in an evaluation graph (ir_dropout returns its input
** when the graph is not training); a dropout mask found here is a bug
** upstream, refused as internal.
*/
#include "ir.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The name of a parameter without its last component: "stage2.0.conv1" of "stage2.0.conv1.weight". */
static const char *prefix_of(Arena *a, const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? arena_strndup(a, name, (size_t)(dot - name)) : name;
}

/* "stage2.0.conv1+bn1" of "stage2.0.conv1" and "stage2.0.bn1": the layer's
   name, a plus, and the BatchNorm's name after what the two share */
static const char *folded_name(Arena *a, const char *layer, const char *norm)
{
    size_t common = 0;
    for (size_t k = 0; layer[k] && layer[k] == norm[k]; k++)
        if (layer[k] == '.') common = k + 1;
    return arena_printf(a, "%s+%s", layer, norm + common);
}

static bool is_op(const Graph *g, int id, Op op) { return id >= 0 && g->nodes[id].op == op; }

/* The conv2d or linear whose output bn_apply b normalises (directly, or
   through the one reshape to [N,F,1,1] of batchnorm1d), when it can take the
   BatchNorm in: its output and that reshape read by nothing else, its
   weight and bias parameters, fp32 products; the BatchNorm's statistics its
   running ones. Else -1. *via: the reshape, or -1. */
static int foldable(const Graph *g, const int *users, int b, int *via)
{
    const Node *n = &g->nodes[b];
    *via = -1;
    int stats = n->in[1], x = n->in[0];
    if (!is_op(g, stats, OP_BN_EVAL_STATS) || !is_op(g, n->in[2], OP_PARAM) || !is_op(g, n->in[3], OP_PARAM)) return -1;
    const Node *s = &g->nodes[stats];
    if (!is_op(g, s->in[0], OP_STATE) || !is_op(g, s->in[1], OP_STATE)) return -1;
    if (is_op(g, x, OP_RESHAPE) && users[x] == 1) {
        int l = g->nodes[x].in[0];
        if (!is_op(g, l, OP_LINEAR)) return -1;
        *via = x;
        x = l;
    }
    const Node *p = &g->nodes[x];
    if ((p->op != OP_CONV2D && p->op != OP_LINEAR) || users[x] != 1 || p->mm != DT_F32) return -1;
    if (p->op == OP_CONV2D && *via >= 0) return -1;
    if (!is_op(g, p->in[1], OP_PARAM) || (p->nin == 3 && !is_op(g, p->in[2], OP_PARAM))) return -1;
    if (g->nodes[p->in[1]].shape.d[0] != n->shape.d[1]) return -1;   /* one BatchNorm channel per output channel */
    return x;
}

static int new_param(Graph *out, Loc loc, const char *name, Shape s)
{
    int id = ir_node(out, OP_PARAM, loc, 0, NULL);
    Node *n = &out->nodes[id];
    n->shape = s;
    n->name = name;
    n->init = INIT_NONE;   /* its values come from the checkpoint's tensors (ir_fold_values) */
    return id;
}

int ir_infer(const Graph *g, Graph *out, bool fold)
{
    int n = g->n;
    if (g->training || g->logits < 0) {
        diag_at(g->diag, (Loc){ 0 }, "internal: the inference rewrite needs the evaluation form with its logits");
        return -1;
    }
    int *users = calloc((size_t)n + 1, sizeof(int)), *folds_into = malloc(sizeof(int) * ((size_t)n + 1));
    int *folded_by = malloc(sizeof(int) * ((size_t)n + 1)), *map = malloc(sizeof(int) * ((size_t)n + 1));
    bool *live = calloc((size_t)n + 1, sizeof(bool));
    int rc = 0;
    for (int id = 0; id < n; id++) {
        folds_into[id] = folded_by[id] = map[id] = -1;
        for (int k = 0; k < g->nodes[id].nin; k++) users[g->nodes[id].in[k]]++;
        if (g->nodes[id].op == OP_DROPOUT_MASK) {
            diag_at(g->diag, g->nodes[id].loc, "internal: a dropout mask (%%%d) in the evaluation form", id);
            rc = -1;
        }
    }
    /* the pairs: layer -> its BatchNorm (folds_into), BatchNorm -> its layer (folded_by) */
    for (int id = 0; fold && id < n; id++) {
        int via, layer = g->nodes[id].op == OP_BN_APPLY ? foldable(g, users, id, &via) : -1;
        if (layer >= 0) folds_into[layer] = id, folded_by[id] = layer;
    }
    /* what the logits need: a folded BatchNorm only its input, a folded layer only its x */
    live[g->logits] = true;
    if (g->input >= 0) live[g->input] = true;
    for (int id = n - 1; id >= 0; id--) {
        if (!live[id]) continue;
        const Node *nd = &g->nodes[id];
        int reads = folded_by[id] >= 0 || folds_into[id] >= 0 ? 1 : nd->nin;
        for (int k = 0; k < reads; k++) live[nd->in[k]] = true;
    }
    int nfolds = 0;
    for (int id = 0; id < n; id++) nfolds += folds_into[id] >= 0 && live[id];
    out->folds = arena_alloc(out->arena, sizeof(IrFold) * (size_t)(nfolds + 1));
    out->nfolds = 0;
    for (int id = 0; id < n && !rc; id++) {
        const Node *nd = &g->nodes[id];
        if (!live[id]) continue;
        if (folded_by[id] >= 0) {   /* the BatchNorm: its layer computes it now */
            map[id] = map[nd->in[0]];
            continue;
        }
        int in[IR_MAXIN], nin = nd->nin;
        for (int k = 0; k < nin; k++) in[k] = map[nd->in[k]];
        if (folds_into[id] >= 0) {
            const Node *bn = &g->nodes[folds_into[id]], *st = &g->nodes[bn->in[1]];
            const Node *w = &g->nodes[nd->in[1]];
            const char *name = folded_name(out->arena, prefix_of(out->arena, w->name),
                                           prefix_of(out->arena, g->nodes[bn->in[2]].name));
            int channels = w->shape.d[0];
            IrFold *f = &out->folds[out->nfolds++];
            f->weight = in[1] = new_param(out, w->loc, arena_printf(out->arena, "%s.weight", name), w->shape);
            f->bias = in[2] = new_param(out, bn->loc, arena_printf(out->arena, "%s.bias", name), ir_shape_make(1, &channels));
            nin = 3;
            f->w = w->name;
            f->b = nd->nin == 3 ? g->nodes[nd->in[2]].name : NULL;
            f->gamma = g->nodes[bn->in[2]].name, f->beta = g->nodes[bn->in[3]].name;
            f->mean = g->nodes[st->in[0]].name, f->var = g->nodes[st->in[1]].name;
            f->eps = st->attr.eps;
            f->channels = channels;
            f->per_channel = ir_numel(&w->shape, 1) / channels;
        }
        int id2 = ir_node(out, nd->op, nd->loc, nin, in);
        if (folds_into[id] >= 0) out->folds[out->nfolds - 1].layer = id2;
        Node *copy = &out->nodes[id2];
        copy->shape = nd->shape;
        copy->attr = nd->attr;
        copy->name = nd->name;
        copy->init = nd->init;
        copy->fan_in = nd->fan_in;
        copy->dtype = nd->dtype;
        copy->mm = nd->mm;
        map[id] = id2;
    }
    if (!rc) {
        out->input = g->input >= 0 ? map[g->input] : -1;
        out->logits = map[g->logits];
        out->n_forward = out->n;
        out->precision = g->precision;
    }
    free(users), free(folds_into), free(folded_by), free(map), free(live);
    return rc;
}

void ir_fold_values(const IrFold *f, const float *w, const float *b, const float *gamma, const float *beta, const float *mean,
                    const float *var, float *w_out, float *b_out)
{
    for (int o = 0; o < f->channels; o++) {
        double s = (double)gamma[o] / sqrt((double)var[o] + (double)f->eps);
        for (long j = 0; j < f->per_channel; j++) {
            long at = (long)o * f->per_channel + j;
            w_out[at] = (float)((double)w[at] * s);
        }
        b_out[o] = (float)(((b ? (double)b[o] : 0.0) - (double)mean[o]) * s + (double)beta[o]);
    }
}
