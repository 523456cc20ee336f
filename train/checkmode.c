/*
** Check mode (--batch FILE --steps K --dump OUT), what the tests compare with
** PyTorch: K SGD steps at --lr on one batch split over the replicas, then
** the losses, the first step's logits and gradients, the parameters, the
** evaluation logits and how far the replicas are apart, dumped.
*/
#include "checkmode.h"
#include "checkpoint.h"
#include "safetensors.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static long long *shape_ll(const Shape *s, long n, long long *out)
{
    for (int d = 0; d < s->nd; d++) out[d] = s->d[d] == IR_BATCH ? n : s->d[d];
    return out;
}

static void check_on_replica(Group *g, Replica *r)
{
    const Program *tp = g->m->train;
    long first, n, b = g->b;
    train_shard(b, g->total, r->global, &first, &n);
    long per_x = cg_dim(tp->bufs[tp->input].size, 1);
    int classes = tp->classes;
    for (int step = 0; step < g->cfg->steps; step++) {
        memcpy(rt_exec_host(&r->tr, tp->input), g->x + first * per_x, sizeof(float) * (size_t)(n * per_x));
        memcpy(rt_exec_host(&r->tr, tp->labels), g->y + first, sizeof(float) * (size_t)n);
        rt_exec_run(&r->tr, n, b, first);
        float l = train_read1(&r->tr, tp->loss);
        /* the global batch's mean: this replica's mean weighted by its share */
        g->losses[(long)step * g->total + r->global] = l * (float)n / (float)b;
        if (step == 0) {
            memcpy(g->logits + first * classes, rt_exec_fetch(&r->tr, tp->logits, n), sizeof(float) * (size_t)(n * classes));
            if (tp->input_grad >= 0)
                memcpy(g->grad_x + first * per_x, rt_exec_fetch(&r->tr, tp->input_grad, n), sizeof(float) * (size_t)(n * per_x));
            for (int k = 0; r->index == 0 && k < tp->nparams; k++)
                memcpy(g->grads[k], rt_exec_fetch(&r->tr, tp->params[k].grad, n), sizeof(float) * (size_t)cg_dim(tp->bufs[tp->params[k].grad].size, 1));
        }
    }
    r->steps = g->cfg->steps;
}

static void check_eval_on_replica(Group *g, Replica *r)
{
    const Program *ep = g->m->eval;
    long first, n, b = g->b;
    train_shard(b, g->total, r->global, &first, &n);
    long per_x = cg_dim(ep->bufs[ep->input].size, 1);
    memcpy(rt_exec_host(&r->ev, ep->input), g->x + first * per_x, sizeof(float) * (size_t)(n * per_x));
    memcpy(rt_exec_host(&r->ev, ep->labels), g->y + first, sizeof(float) * (size_t)n);
    rt_exec_run(&r->ev, n, b, first);
    memcpy(g->eval_logits + first * ep->classes, rt_exec_fetch(&r->ev, ep->logits, n), sizeof(float) * (size_t)(n * ep->classes));
}

int train_check_mode(Group *g)
{
    const TrainConfig *cfg = g->cfg;
    const Program *tp = g->m->train;
    StFile f;
    char err[512];
    if (st_load(cfg->batch_file, &f, err, sizeof err)) {
        fprintf(stderr, "mgc: --batch: %s\n", err);
        return 1;
    }
    const StTensor *tx = st_find(&f, "x"), *ty = st_find(&f, "y");
    const Shape *is = &tp->input_shape;
    if (!tx || !ty || tx->nd != is->nd || ty->nd != 1 || tx->shape[0] != ty->shape[0]) {
        fprintf(stderr, "mgc: --batch %s: needs tensors 'x' [B,...] matching the net's input and 'y' [B]\n", cfg->batch_file);
        st_free(&f);
        return 1;
    }
    for (int d = 1; d < is->nd; d++)
        if (tx->shape[d] != is->d[d]) {
            fprintf(stderr, "mgc: --batch %s: 'x' dimension %d is %lld, the net's input needs %d\n", cfg->batch_file, d, tx->shape[d], is->d[d]);
            st_free(&f);
            return 1;
        }
    long b = (long)tx->shape[0];
    if (b > cfg->batch_size) {
        fprintf(stderr, "mgc: --batch %s holds %ld examples, more than --batch-size %d\n", cfg->batch_file, b, cfg->batch_size);
        st_free(&f);
        return 1;
    }
    if (b < g->total) {
        fprintf(stderr, "mgc: --batch %s holds %ld examples, fewer than the %d replicas\n", cfg->batch_file, b, g->total);
        st_free(&f);
        return 1;
    }
    long per_x = cg_dim(tp->bufs[tp->input].size, 1);
    int classes = tp->classes;
    g->b = b;
    g->x = malloc(sizeof(float) * (size_t)(b * per_x));
    g->y = malloc(sizeof(float) * (size_t)b);
    if (st_to_f32(tx, g->x) || st_to_f32(ty, g->y)) {
        fprintf(stderr, "mgc: --batch %s: unsupported dtype\n", cfg->batch_file);
        st_free(&f);
        return 1;
    }
    st_free(&f);
    /* the batch as the loader checks data: finite inputs, whole labels of the net's classes */
    for (long i = 0; i < b * per_x; i++)
        if (!isfinite(g->x[i])) {
            fprintf(stderr, "mgc: --batch %s: 'x' holds %g at element %ld (example %ld): the inputs must be finite\n",
                    cfg->batch_file, (double)g->x[i], i, i / per_x);
            return 1;
        }
    for (long i = 0; i < b; i++) {
        float y = g->y[i];
        if (!(y >= 0 && y < (float)classes && y == floorf(y))) {
            fprintf(stderr, "mgc: --batch %s: label %ld of 'y' is %.9g; the net has %d classes: labels are whole numbers "
                    "0 to %d\n", cfg->batch_file, i, (double)y, classes, classes - 1);
            return 1;
        }
    }
    g->losses = calloc((size_t)cfg->steps * (size_t)g->total, sizeof(float));
    g->logits = calloc((size_t)(b * classes), sizeof(float));
    g->eval_logits = calloc((size_t)(b * classes), sizeof(float));
    g->grad_x = calloc((size_t)(b * per_x), sizeof(float));
    g->grads = calloc((size_t)tp->nparams + 1, sizeof(float *));
    for (int k = 0; k < tp->nparams; k++) g->grads[k] = malloc(sizeof(float) * (size_t)cg_dim(tp->bufs[tp->params[k].grad].size, 1));
    train_on_every_replica(g, check_on_replica);
    /* every rank filled its own rows (zeros elsewhere), and its replicas' losses: sums join them */
    rt_world_sum_f32(g->world, g->losses, (long)cfg->steps * g->total);
    rt_world_sum_f32(g->world, g->logits, b * classes);
    rt_world_sum_f32(g->world, g->grad_x, b * per_x);
    double state_diff = train_replica_diff(g, true), param_diff = train_replica_diff(g, false);
    train_from_replica0(g, STORE_RUNNING, false);
    train_on_every_replica(g, check_eval_on_replica);
    rt_world_sum_f32(g->world, g->eval_logits, b * classes);

    float *loss = calloc((size_t)cfg->steps, sizeof(float));
    for (int s = 0; s < cfg->steps; s++)
        for (int k = 0; k < g->total; k++) loss[s] += g->losses[(long)s * g->total + k];
    int rc = 0;
    if (g->world->rank == 0) {
        StWriter *w = st_writer_new();
        long long sh[IR_MAXDIM];
        Replica *r0 = &g->r[0];
        st_writer_add_f32(w, "logits", 2, (long long[]){ b, classes }, g->logits);
        if (tp->input_grad >= 0) st_writer_add_f32(w, "grad.x", is->nd, shape_ll(is, b, sh), g->grad_x);
        for (int k = 0; k < tp->nparams; k++) {
            const Buf *pb = &tp->bufs[tp->params[k].buf];
            char name[512];
            snprintf(name, sizeof name, "grad.%s", pb->name);
            st_writer_add_f32(w, name, pb->shape.nd, shape_ll(&pb->shape, 1, sh), g->grads[k]);
        }
        st_writer_add_f32(w, "loss", 1, (long long[]){ cfg->steps }, loss);
        Store *store = &r0->store;
        for (int k = 0; k < store->n; k++)
            st_writer_add_f32(w, store->e[k].name, store->e[k].shape.nd, shape_ll(&store->e[k].shape, 1, sh), store->e[k].data);
        st_writer_add_f32(w, "eval_logits", 2, (long long[]){ b, classes }, g->eval_logits);
        /* how far the replicas are apart: parameters and momentum, and running
           statistics before they were copied from replica 0 */
        float diffs[2] = { (float)param_diff, (float)state_diff };
        st_writer_add_f32(w, "replicas.param_diff", 1, (long long[]){ 1 }, diffs);
        st_writer_add_f32(w, "replicas.state_diff", 1, (long long[]){ 1 }, diffs + 1);
        float nrep = (float)g->total;
        st_writer_add_f32(w, "replicas.count", 1, (long long[]){ 1 }, &nrep);
        if (cfg->dump && st_writer_save(w, cfg->dump, err, sizeof err)) {
            fprintf(stderr, "mgc: --dump: %s\n", err);
            rc = 1;
        }
        for (int s = 0; s < cfg->steps; s++) printf("step %d  loss %.6f\n", s + 1, loss[s]);
        st_writer_free(w);
    }
    rc = rt_world_max_status(g->world, rc);
    free(loss);
    if (!rc && cfg->save) {   /* tensors that are not finite are not saved (said by rank 0) */
        StoreCheck c;
        char what[512];
        bool downloaded;
        if (train_check_tensors(g, &c, what, sizeof what, &downloaded)) {
            if (g->world->rank == 0)
                fprintf(stderr, "mgc: after %d step%s, %s: not saved to %s\n", cfg->steps, cfg->steps == 1 ? "" : "s", what, cfg->save);
            rc = 1;
        } else {
            rc = train_save(g, cfg->save, 0, downloaded);
        }
    }
    return rc;
}
