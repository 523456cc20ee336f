/*
** Training loop, evaluation, checkpoints and the check mode.
**
** The training and evaluation programs share one Store of persistent tensors
** (parameters, BatchNorm running statistics, momentum buffers), so evaluation
** always sees the current weights with no copy.
*/
#include "train.h"
#include "data.h"
#include "safetensors.h"
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

const char *train_commas(long v, char buf[32])
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%ld", v), o = 0;
    for (int k = 0; k < n; k++) {
        if (k && (n - k) % 3 == 0 && tmp[k - 1] != '-') buf[o++] = ',';
        buf[o++] = tmp[k];
    }
    buf[o] = 0;
    return buf;
}

/* ------------------------------------------------------------------ checkpoints */

static int save_checkpoint(Store *s, const char *path, const char *net, int epoch)
{
    StWriter *w = st_writer_new();
    for (int k = 0; k < s->n; k++) {
        StoreEntry *e = &s->e[k];
        long long shape[IR_MAXDIM];
        for (int d = 0; d < e->shape.nd; d++) shape[d] = e->shape.d[d];
        st_writer_add_f32(w, e->name, e->shape.nd, shape, e->data);
    }
    char ep[32];
    snprintf(ep, sizeof ep, "%d", epoch);
    st_writer_set_meta(w, "net", net);
    st_writer_set_meta(w, "epoch", ep);
    st_writer_set_meta(w, "format", "mgc checkpoint: PyTorch state_dict names and layouts");
    char err[512];
    int rc = st_writer_save(w, path, err, sizeof err);
    st_writer_free(w);
    if (rc) fprintf(stderr, "mgc: cannot save checkpoint: %s\n", err);
    return rc;
}

static int load_checkpoint(Store *s, const char *path)
{
    StFile f;
    char err[512];
    if (st_load(path, &f, err, sizeof err)) {
        fprintf(stderr, "mgc: cannot load checkpoint: %s\n", err);
        return -1;
    }
    int bad = 0;
    for (int k = 0; k < s->n; k++) {
        StoreEntry *e = &s->e[k];
        const StTensor *t = st_find(&f, e->name);
        if (!t) {
            if (e->trainable || strstr(e->name, "running_")) {
                fprintf(stderr, "mgc: %s: checkpoint has no tensor '%s' (was it saved from another net?)\n", path, e->name);
                bad++;
            }
            continue;
        }
        bool same = t->nd == e->shape.nd;
        for (int d = 0; same && d < t->nd; d++) same = t->shape[d] == e->shape.d[d];
        if (!same) {
            Arena a;
            arena_init(&a);
            fprintf(stderr, "mgc: %s: tensor '%s' has shape [", path, e->name);
            for (int d = 0; d < t->nd; d++) fprintf(stderr, "%s%lld", d ? "," : "", t->shape[d]);
            fprintf(stderr, "] but the net needs %s\n", ir_shape_str(&a, &e->shape));
            arena_free(&a);
            bad++;
            continue;
        }
        if (st_to_f32(t, e->data)) {
            fprintf(stderr, "mgc: %s: tensor '%s' has dtype %s, which cannot be converted to float32\n", path, e->name, t->dtype);
            bad++;
        }
    }
    st_free(&f);
    return bad ? -1 : 0;
}

/* ------------------------------------------------------------------- helpers */

static int check_input(const Graph *g, int c, int h, int w, const char *what)
{
    const Shape *s = ir_shape(g, g->input);
    if (s->nd == 4 && s->d[1] == c && s->d[2] == h && s->d[3] == w) return 0;
    Arena a;
    arena_init(&a);
    fprintf(stderr, "mgc: the net's input %s does not match %s [N,%d,%d,%d]; declare 'input x[N, %d, %d, %d]'\n",
            ir_shape_str(&a, s), what, c, h, w, c, h, w);
    arena_free(&a);
    return -1;
}

static float read1(const Exec *x, int buf) { return x->ptr[buf][0]; }

/* Evaluates the test set; returns accuracy. */
static double evaluate(Exec *ev, const Dataset *test, int batch, int *order)
{
    if (test->n == 0) return NAN;
    for (int i = 0; i < test->n; i++) order[i] = i;
    double correct = 0;
    const Program *p = ev->prog;
    for (int at = 0; at < test->n; at += batch) {
        int b = test->n - at < batch ? test->n - at : batch;
        data_gather(test, order + at, b, ev->ptr[p->input], ev->ptr[p->labels]);
        rt_exec_run(ev, b);
        correct += read1(ev, p->correct);
    }
    return correct / test->n;
}

static void progress(const TrainConfig *cfg, int epoch, int done, int total, double loss, double t0)
{
    if (!cfg->progress) return;
    int width = 30, fill = (int)((double)width * done / total);
    fprintf(stderr, "\r  epoch %d/%d [", epoch, cfg->epochs);
    for (int k = 0; k < width; k++) fputc(k < fill ? '=' : k == fill ? '>' : ' ', stderr);
    double dt = now() - t0;
    fprintf(stderr, "] %3d%%  loss %.3f  %.0f examples/s ", 100 * done / total, loss, dt > 0 ? done / dt : 0.0);
    fflush(stderr);
}

/* ---------------------------------------------------------------- check mode */

static long long *shape_ll(const Shape *s, long n, long long *out)
{
    for (int d = 0; d < s->nd; d++) out[d] = s->d[d] == IR_BATCH ? n : s->d[d];
    return out;
}

static int check_mode(const Model *m, const TrainConfig *cfg, Exec *tr, Exec *ev, Store *store)
{
    StFile f;
    char err[512];
    if (st_load(cfg->batch_file, &f, err, sizeof err)) {
        fprintf(stderr, "mgc: --batch: %s\n", err);
        return 1;
    }
    const StTensor *tx = st_find(&f, "x"), *ty = st_find(&f, "y");
    const Shape *is = ir_shape(m->train, m->train->input);
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
    if (b > tr->max_batch) {
        fprintf(stderr, "mgc: --batch %s holds %ld examples, more than --batch-size %ld\n", cfg->batch_file, b, tr->max_batch);
        st_free(&f);
        return 1;
    }
    const Program *tp = m->train_prog, *ep = m->eval_prog;
    const Graph *g = m->train;
    if (st_to_f32(tx, tr->ptr[tp->input]) || st_to_f32(ty, tr->ptr[tp->labels])) {
        fprintf(stderr, "mgc: --batch %s: unsupported dtype\n", cfg->batch_file);
        st_free(&f);
        return 1;
    }
    int classes = ir_shape(g, g->logits)->d[1];
    float *losses = calloc((size_t)cfg->steps, sizeof(float));
    StWriter *w = st_writer_new();
    long long sh[IR_MAXDIM];
    for (int step = 0; step < cfg->steps; step++) {
        rt_exec_run(tr, b);
        losses[step] = read1(tr, tp->loss);
        if (step == 0) {
            st_writer_add_f32(w, "logits", 2, (long long[]){ b, classes }, tr->ptr[tp->logits]);
            if (g->grad[g->input] >= 0)
                st_writer_add_f32(w, "grad.x", is->nd, shape_ll(is, b, sh), tr->ptr[tp->node_buf[g->grad[g->input]]]);
            for (int id = 0; id < g->n_forward; id++) {
                const Node *n = &g->nodes[id];
                if (n->op != OP_PARAM || g->grad[id] < 0) continue;
                char name[512];
                snprintf(name, sizeof name, "grad.%s", n->name);
                st_writer_add_f32(w, name, n->shape.nd, shape_ll(&n->shape, 1, sh), tr->ptr[tp->node_buf[g->grad[id]]]);
            }
        }
    }
    st_writer_add_f32(w, "loss", 1, (long long[]){ cfg->steps }, losses);
    for (int k = 0; k < store->n; k++)
        st_writer_add_f32(w, store->e[k].name, store->e[k].shape.nd, shape_ll(&store->e[k].shape, 1, sh), store->e[k].data);
    /* evaluation form on the same batch */
    st_to_f32(tx, ev->ptr[ep->input]);
    st_to_f32(ty, ev->ptr[ep->labels]);
    rt_exec_run(ev, b);
    st_writer_add_f32(w, "eval_logits", 2, (long long[]){ b, classes }, ev->ptr[ep->logits]);
    int rc = 0;
    if (cfg->dump && st_writer_save(w, cfg->dump, err, sizeof err)) {
        fprintf(stderr, "mgc: --dump: %s\n", err);
        rc = 1;
    }
    for (int s = 0; s < cfg->steps; s++) printf("step %d  loss %.6f\n", s + 1, losses[s]);
    st_writer_free(w);
    free(losses);
    st_free(&f);
    if (!rc && cfg->save) rc = save_checkpoint(store, cfg->save, g->net_name, 0) ? 1 : 0;
    return rc;
}

/* ---------------------------------------------------------------- the job */

int train_run(const Model *m, const TrainConfig *cfg)
{
    const Graph *g = m->train;
    char err[1024], num[32], num2[32], num3[32];
    int tensors;
    long params = ir_param_count(g, &tensors);
    Pool *pool = rt_pool_new(cfg->threads);
    Store store = { 0 };
    Exec tr, ev;
    RtOptions opt = { .verbose = cfg->verbose };
    int status = 1;
    Dataset train = { 0 }, test = { 0 };
    int *order = NULL;
    FILE *log = NULL;
    bool have_tr = false, have_ev = false;

    if (rt_exec_init(&tr, m->train_prog, &store, cfg->batch_size, pool, &opt, err, sizeof err)) {
        fprintf(stderr, "mgc: %s\n", err);
        goto out;
    }
    have_tr = true;
    if (rt_exec_init(&ev, m->eval_prog, &store, cfg->batch_size, pool, &opt, err, sizeof err)) {
        fprintf(stderr, "mgc: %s\n", err);
        goto out;
    }
    have_ev = true;
    rt_exec_set_sgd(&tr, cfg->lr, cfg->momentum, cfg->weight_decay);
    if (getenv("MGC_PROFILE")) rt_exec_profile(&tr);
    tr.seed = ev.seed = cfg->seed;
    rt_store_init(&store, cfg->seed);
    if (cfg->load && load_checkpoint(&store, cfg->load)) goto out;

    if (cfg->batch_file) {
        status = check_mode(m, cfg, &tr, &ev, &store);
        goto out;
    }
    if (cfg->epochs == 0) {
        status = cfg->save && save_checkpoint(&store, cfg->save, g->net_name, 0) ? 1 : 0;
        if (!status) printf("%s: %s parameters in %d tensors initialised (seed %llu)%s%s\n", g->net_name,
                            train_commas(params, num), tensors, cfg->seed, cfg->save ? ", saved to " : "", cfg->save ? cfg->save : "");
        goto out;
    }

    /* The net must fit the data before the data is read. */
    if (check_input(g, 1, 28, 28, "Fashion-MNIST images")) goto out;
    if (ir_shape(g, g->logits)->d[1] < DATA_CLASSES) {
        fprintf(stderr, "mgc: the net has %d outputs but Fashion-MNIST has %d classes; use --set classes=%d\n",
                ir_shape(g, g->logits)->d[1], DATA_CLASSES, DATA_CLASSES);
        goto out;
    }
    if (data_load_fashion_mnist(cfg->data_dir, &train, &test, err, sizeof err)) {
        fprintf(stderr, "mgc: %s\n", err);
        goto out;
    }
    data_limit(&train, cfg->limit_train);
    data_limit(&test, cfg->limit_test);
    if (cfg->log && !(log = fopen(cfg->log, "w"))) {
        fprintf(stderr, "mgc: cannot write --log %s: %s\n", cfg->log, strerror(errno));
        goto out;
    }
    order = malloc(sizeof(int) * (size_t)(train.n > test.n ? train.n : test.n));
    printf("mgc: %s, %s parameters in %d tensors, on [cpu] with %d threads; %s training and %s test examples, batch %d\n",
           g->net_name, train_commas(params, num), tensors, rt_pool_threads(pool), train_commas(train.n, num2),
           train_commas(test.n, num3), cfg->batch_size);
    fflush(stdout);
    struct sigaction sa = { .sa_handler = on_sigint }, old_sa;
    sigaction(SIGINT, &sa, &old_sa);
    int epoch;
    status = 0;
    for (epoch = 1; epoch <= cfg->epochs && !interrupted; epoch++) {
        double t0 = now(), loss_sum = 0, correct = 0, last_draw = 0;
        int seen = 0;
        data_epoch_order(train.n, cfg->seed, epoch, order);
        const Program *p = m->train_prog;
        for (int at = 0; at < train.n && !interrupted; at += cfg->batch_size) {
            int b = train.n - at < cfg->batch_size ? train.n - at : cfg->batch_size;
            data_gather(&train, order + at, b, tr.ptr[p->input], tr.ptr[p->labels]);
            rt_exec_run(&tr, b);
            float l = read1(&tr, p->loss);
            if (!isfinite(l)) {
                fprintf(stderr, "\nmgc: the loss became %g at epoch %d, example %d: training diverged; try a smaller --lr\n", l, epoch, at);
                status = 1;
                interrupted = 1;
                break;
            }
            loss_sum += (double)l * b;
            correct += read1(&tr, p->correct);
            seen += b;
            if (cfg->progress && now() - last_draw > 0.2) {
                progress(cfg, epoch, seen, train.n, loss_sum / seen, t0);
                last_draw = now();
            }
        }
        if (interrupted) break;
        double t_train = now() - t0;
        if (cfg->progress) fprintf(stderr, "\r%*s\r", 100, "");
        double test_acc = evaluate(&ev, &test, cfg->batch_size, order);
        double secs = now() - t0;
        double eps = seen / t_train;
        printf("epoch %d/%d  loss %.3f  train acc %.3f  test acc %.3f  %s examples/s  %.1f s  on [cpu]\n",
               epoch, cfg->epochs, loss_sum / seen, correct / seen, test_acc, train_commas((long)eps, num), secs);
        fflush(stdout);
        if (log) {
            fprintf(log, "{\"epoch\": %d, \"loss\": %.6f, \"train_acc\": %.6f, \"test_acc\": %.6f, "
                         "\"examples_per_s\": %.1f, \"seconds\": %.3f, \"train_seconds\": %.3f}\n",
                    epoch, loss_sum / seen, correct / seen, test_acc, eps, secs, t_train);
            fflush(log);
        }
        if (cfg->save && save_checkpoint(&store, cfg->save, g->net_name, epoch)) { status = 1; break; }
    }
    sigaction(SIGINT, &old_sa, NULL);
    if (interrupted && status == 0) {
        fprintf(stderr, "\nmgc: interrupted during epoch %d%s%s\n", epoch,
                cfg->save ? "; the checkpoint holds the last finished epoch: " : "", cfg->save ? cfg->save : "");
        status = 130;
    }
out:
    if (have_tr && tr.step_seconds && tr.runs) rt_exec_profile_report(&tr, stderr);
    if (log) fclose(log);
    free(order);
    data_free(&train);
    data_free(&test);
    if (have_ev) rt_exec_free(&ev);
    if (have_tr) rt_exec_free(&tr);
    rt_store_free(&store);
    rt_pool_free(pool);
    return status;
}
