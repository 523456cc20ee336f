/*
** The compiler's passes in order (see pipeline.h).
*/
#include "pipeline.h"
#include <string.h>

/* A pass's result, checked: MGC_OK, or why it failed. */
static MgcStatus checked(const char *pass, int rc, const Graph *g, Diag *d, const char **failed)
{
    if (!rc && !ir_verify(g, d)) return MGC_OK;
    if (failed) *failed = pass;
    return rc && d->errors ? MGC_BAD_NET : MGC_INTERNAL;
}

MgcStatus mgc_graph(const MgcOptions *o, Arena *a, Diag *d, Graph *g, const char **failed)
{
    if (failed) *failed = NULL;
    ir_graph_init(g, a, d, NULL, o->training);
    g->sync_bn = o->sync_bn && o->training;
    g->accumulate = o->training && o->backward && o->accumulate > 1 ? o->accumulate : 1;
    g->shard_update = o->training && o->backward && o->shard_update && o->replicas > 1 ? o->replicas : 0;
    int rc = o->text ? fe_compile_bytes(g, o->net, o->text, o->len, o->sets, o->nsets)   /* parse, check, elaborate, build */
                     : fe_compile(g, o->net, o->sets, o->nsets);
    if (rc) {
        if (failed) *failed = "front end";
        return MGC_BAD_NET;
    }
    if (g->loss < 0) {
        diag_at(d, (Loc){ 0 }, "%s: the net returns no loss; end its last chain with softmax_cross_entropy", o->net);
        if (failed) *failed = "front end";
        return MGC_BAD_NET;
    }
    MgcStatus s = checked("front end", 0, g, d, failed);
    if (s) return s;
    if (o->inference) {   /* the graph a library runs: a new one, from the evaluation form */
        Graph eval = *g;
        if (o->training || o->backward) {
            diag_at(d, (Loc){ 0 }, "internal: %s: the inference rewrite takes the evaluation form", o->net);
            if (failed) *failed = "inference";
            return MGC_INTERNAL;
        }
        ir_graph_init(g, a, d, eval.net_name, false);
        if ((s = checked("inference", ir_infer(&eval, g, o->fold), g, d, failed))) return s;
    }
    if (o->backward) {
        if ((s = checked("gradients", ir_gradients(g, o->input_grad), g, d, failed))) return s;   /* the backward graph */
        if ((o->replicas > 1 || g->accumulate > 1) && (s = checked("buckets", ir_buckets(g, o->bucket_bytes, o->first_bucket_bytes), g, d, failed)))
            return s;                                                                               /* sums across replicas */
        if ((s = checked("update", ir_update(g, &o->opt), g, d, failed))) return s;                /* SGD */
    }
    if (o->bf16) {
        ir_autocast(g);                                                                             /* GEMMs in bf16 */
        return checked("autocast", 0, g, d, failed);
    }
    return MGC_OK;
}

MgcStatus mgc_program(const MgcOptions *o, Graph *g, Arena *a, Diag *d, Program *p, const char **failed)
{
    if (failed) *failed = NULL;
    CgDecisions dec;
    cg_decisions_init(&dec, g, a);
    cg_fuse(g, &o->codegen, &dec);                                     /* ReLU into its producer */
    cg_choose_convs(g, &o->codegen, &dec);                             /* each convolution's form */
    memset(p, 0, sizeof *p);
    if (cg_lower(g, a, &dec, p)) {                                     /* kernels, GEMMs, collectives */
        if (failed) *failed = "lowering";
        return d->errors ? MGC_BAD_NET : MGC_INTERNAL;
    }
    cg_plan_memory(p, o->plan_batch > 0 ? o->plan_batch : 1);          /* buffers share memory by liveness */
    char err[256];
    if (cg_verify(p, err, sizeof err)) {
        diag_at(d, (Loc){ 0 }, "internal: %s: the generated program is inconsistent: %s", o->net, err);
        if (failed) *failed = "cg_verify";
        return MGC_INTERNAL;
    }
    return MGC_OK;
}

MgcStatus mgc_compile(const MgcOptions *o, Arena *a, Diag *d, Graph *g, Program *p, const char **failed)
{
    MgcStatus s = mgc_graph(o, a, d, g, failed);
    if (s || !p) return s;
    return mgc_program(o, g, a, d, p, failed);
}
