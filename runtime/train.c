/*
** Training loop, evaluation, checkpoints, the communication report and the
** check mode, on one or more replicas.
**
** Each replica is a device with its own Store (parameters, running
** statistics, momentum) and its own training and evaluation Exec; replica r
** of this process runs on its own thread. Every replica runs the same steps
** on its shard of every global batch (train_shard) and the collectives in
** the training program keep them in step: the gradients are summed, so every
** replica applies the same update to the same parameters.
**
** Parameters start on replica 0 of rank 0 (initialised or loaded) and are
** copied to every other replica. BatchNorm running statistics come from
** replica 0 (as DDP broadcasts its buffers): they are copied to the others
** before every evaluation, checkpoint and dump; training never reads them.
**
** Stopping (Ctrl-C, a diverging loss) must happen on the same step
** everywhere, or a replica would wait forever for a sum: each replica adds
** its vote to two floats summed with the last gradient bucket (the
** program's control buffer), and all stop when the sum says so.
*/
#include "train.h"
#include "comm.h"
#include "data.h"
#include "pool.h"
#include "safetensors.h"
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* SIGINT (Ctrl-C), SIGTERM (Slurm's preemption, docker stop, systemd, mpirun)
   and SIGHUP (a closed terminal) ask the run to stop: after the current step,
   on every replica and rank at the same step (the control vote), with the
   last finished epoch's checkpoint whole, and status 128 + the signal. A
   checkpoint being written when the signal comes is finished first. */
static volatile sig_atomic_t interrupted;   /* the signal that asked to stop, or 0 */
static void on_stop_signal(int sig) { interrupted = sig; }
static const int stop_signals[] = { SIGINT, SIGTERM, SIGHUP };
#define NSTOP_SIGNALS ((int)(sizeof stop_signals / sizeof *stop_signals))

/* Every rank's status and stop request at one point of the run (a
   collective): 0 go on; 1 some rank failed; 128 + the signal where one asked
   to stop (the largest, where several did). */
static int stop_point(World *w, int rc)
{
    int all = rt_world_max_status(w, rc ? 1000 : (int)interrupted);
    if (all >= 1000) return 1;
    if (all > 0) interrupted = all;
    return all > 0 ? 128 + all : 0;
}

static const char *signal_name(int sig)
{
    return sig == SIGINT ? "SIGINT (Ctrl-C)" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

const char *rt_commas(long v, char buf[32])
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

float train_lr(const TrainConfig *cfg, int epoch, long step, long steps_per_epoch)
{
    double lr = cfg->lr;
    long t = (long)(epoch - 1) * steps_per_epoch + step;   /* the steps of the run before this one */
    /* the schedule's clock: epochs or steps gone, and how many the run has */
    double u = cfg->lr_per_step ? (double)t : (double)(epoch - 1);
    double total = cfg->lr_per_step ? (double)cfg->epochs * (double)steps_per_epoch : (double)cfg->epochs;
    if (cfg->lr_schedule == LR_COSINE && total > 0) lr *= 0.5 * (1.0 + cos(M_PI * u / total));
    for (int k = 0; cfg->lr_schedule == LR_STEP && k < cfg->lr_nmilestones; k++)
        if (cfg->lr_milestones[k] <= u) lr *= cfg->lr_gamma;
    if (t < cfg->warmup) lr *= (double)(t + 1) / (double)cfg->warmup;
    return (float)lr;
}

bool train_lr_per_step(const TrainConfig *cfg)
{
    return cfg->warmup > 0 || (cfg->lr_per_step && cfg->lr_schedule != LR_CONSTANT);
}

void train_shard(long b, int parts, int j, long *first, long *count)
{
    long q = b / parts, r = b % parts;
    *first = j * q + (j < r ? j : r);
    *count = q + (j < r);
}

/* ------------------------------------------------------------------ replicas */

typedef struct Replica {
    int index, global;        /* in this process; in the whole group */
    Device *dev;
    Store store;
    Exec tr, ev;
    bool have_tr, have_ev;
    /* results of the current epoch or check */
    double loss_sum, correct, eval_correct;
    long seen;
    double compute_seconds, wait_seconds;   /* this epoch */
    bool diverged, stop;
    int stop_reason;          /* 1 interrupted, 2 diverged */
    long steps;
    int nan_epoch;            /* --check-nan: the epoch and step (1-based) where a value first was not finite */
    long nan_batch;
} Replica;

typedef struct Group {
    const Model *m;
    const TrainConfig *cfg;
    World *world;
    Replica *r;
    int n;                    /* replicas in this process */
    int total;                /* in the whole group */
    Comm *comm;
    /* the work of the current parallel phase */
    const Dataset *data;
    const int *order;
    int count;                /* examples */
    int epoch;
    long steps_per_epoch;     /* training steps in every epoch */
    double t0, last_draw;     /* the epoch's start, the progress line's last drawing */
    /* check mode */
    float *x, *y;             /* the whole batch, host */
    long b;
    float *losses;
    float *logits, *eval_logits, *grad_x;   /* whole batch, this process's rows */
    float **grads;            /* per parameter, after the first step (summed: the same on every replica) */
} Group;

/* Runs fn on every replica of the group, replica r > 0 on a thread of its own. */
typedef struct ThreadArg { Group *g; Replica *r; void (*fn)(Group *, Replica *); } ThreadArg;
static void *replica_thread(void *arg)
{
    ThreadArg *a = arg;
    a->fn(a->g, a->r);
    return NULL;
}

static void on_every_replica(Group *g, void (*fn)(Group *, Replica *))
{
    pthread_t *tid = calloc((size_t)g->n, sizeof(pthread_t));
    ThreadArg *args = calloc((size_t)g->n, sizeof(ThreadArg));
    for (int k = 1; k < g->n; k++) {
        args[k] = (ThreadArg){ g, &g->r[k], fn };
        pthread_create(&tid[k], NULL, replica_thread, &args[k]);
    }
    fn(g, &g->r[0]);
    for (int k = 1; k < g->n; k++) pthread_join(tid[k], NULL);
    free(args);
    free(tid);
}

/* Every replica's tensors from replica 0 of rank 0 (all of them, or the
   running statistics only), on the host and on the devices. at_start: replica
   0's host copy is the truth (initialised or loaded); else its device's is. */
static void from_replica0(Group *g, StoreWhich which, bool at_start)
{
    Store *s0 = &g->r[0].store;
    if (!at_start) rt_store_download(s0, which);
    for (int k = 0; k < s0->n; k++) {
        StoreEntry *e = &s0->e[k];
        if (which == STORE_RUNNING && !rt_store_is_running(e)) continue;
        rt_world_bcast(g->world, e->data, sizeof(float) * (size_t)e->numel);
        for (int r = 1; r < g->n; r++)
            memcpy(g->r[r].store.e[k].data, e->data, sizeof(float) * (size_t)e->numel);
    }
    for (int r = at_start || g->world->rank ? 0 : 1; r < g->n; r++) rt_store_upload(&g->r[r].store, which);
}

/* The largest difference between any replica's tensors and replica 0's of rank 0, over all
   tensors, or over the running statistics. */
static double replica_diff(Group *g, bool running)
{
    double worst = 0;
    Store *s0 = &g->r[0].store;
    for (int r = 0; r < g->n; r++) rt_store_download(&g->r[r].store, running ? STORE_RUNNING : STORE_NOT_RUNNING);
    for (int k = 0; k < s0->n; k++) {
        StoreEntry *e = &s0->e[k];
        if (rt_store_is_running(e) != running) continue;
        float *ref = malloc(sizeof(float) * (size_t)e->numel);
        memcpy(ref, e->data, sizeof(float) * (size_t)e->numel);
        rt_world_bcast(g->world, ref, sizeof(float) * (size_t)e->numel);
        for (int r = 0; r < g->n; r++)
            for (long i = 0; i < e->numel; i++) {
                double d = fabs((double)g->r[r].store.e[k].data[i] - ref[i]);
                if (d > worst || d != d) worst = d != d ? INFINITY : d;
            }
        free(ref);
    }
    rt_world_max_f64(g->world, &worst, 1);
    return worst;
}

/* ------------------------------------------------------------------ checkpoints */

/* The learning-rate recipe in words (a checkpoint's "lr_schedule"): what --resume compares. */
static void schedule_str(const TrainConfig *cfg, char *out, size_t size)
{
    int p = snprintf(out, size, "lr %g", (double)cfg->lr);
    if (cfg->lr_schedule == LR_COSINE)
        p += snprintf(out + p, size - (size_t)p, ", cosine over %d epoch%s, every %s", cfg->epochs, cfg->epochs == 1 ? "" : "s",
                      cfg->lr_per_step ? "step" : "epoch");
    else if (cfg->lr_schedule == LR_STEP) {
        p += snprintf(out + p, size - (size_t)p, ", times %g after %s", (double)cfg->lr_gamma, cfg->lr_per_step ? "steps" : "epochs");
        for (int k = 0; k < cfg->lr_nmilestones && p < (int)size; k++)
            p += snprintf(out + p, size - (size_t)p, "%s%d", k ? "," : " ", cfg->lr_milestones[k]);
    } else {
        p += snprintf(out + p, size - (size_t)p, ", constant");
    }
    if (cfg->warmup && p < (int)size) snprintf(out + p, size - (size_t)p, ", warmup %d steps", cfg->warmup);
}

/* The parameters and state, with what --resume needs to go on as if never
   stopped: the epoch finished, the training steps run, the seed and batch;
   and the rate's recipe, which --resume compares with its own. */
static int save_checkpoint(Store *s, const char *path, const char *net, int epoch, unsigned long long steps,
                           const TrainConfig *cfg)
{
    StWriter *w = st_writer_new();
    for (int k = 0; k < s->n; k++) {
        StoreEntry *e = &s->e[k];
        long long shape[IR_MAXDIM];
        for (int d = 0; d < e->shape.nd; d++) shape[d] = e->shape.d[d];
        st_writer_add_f32(w, e->name, e->shape.nd, shape, e->data);
    }
    char v[64];
    st_writer_set_meta(w, "net", net);
    snprintf(v, sizeof v, "%d", epoch);
    st_writer_set_meta(w, "epoch", v);
    snprintf(v, sizeof v, "%llu", steps);
    st_writer_set_meta(w, "steps", v);
    snprintf(v, sizeof v, "%llu", cfg->seed);
    st_writer_set_meta(w, "seed", v);
    snprintf(v, sizeof v, "%d", cfg->batch_size);
    st_writer_set_meta(w, "batch_size", v);
    char sched[256];
    schedule_str(cfg, sched, sizeof sched);
    st_writer_set_meta(w, "lr_schedule", sched);
    st_writer_set_meta(w, "format", "mgc checkpoint: PyTorch state_dict names and layouts");
    char err[512];
    int rc = st_writer_save(w, path, err, sizeof err);
    st_writer_free(w);
    if (rc) fprintf(stderr, "mgc: cannot save checkpoint: %s\n", err);
    return rc;
}

/* Rank 0 saves; every rank learns whether it worked. */
static int save_everywhere(Group *g, const char *path, int epoch)
{
    int rc = 0;
    if (g->world->rank == 0) {
        rt_store_download(&g->r[0].store, STORE_ALL);
        const Exec *x = &g->r[0].tr;
        rc = save_checkpoint(&g->r[0].store, path, g->m->train->net_name, epoch, x->runs_before + x->runs, g->cfg) ? 1 : 0;
    }
    return rt_world_max_status(g->world, rc);
}

/* What --resume reads from a checkpoint's metadata besides its tensors. */
typedef struct Resume {
    unsigned long long epoch, steps, seed, batch_size;
    char schedule[256];       /* the learning-rate recipe (schedule_str), or "" (an older mgc's checkpoint) */
} Resume;

/* The metadata key of f as a whole number (seeds are 64 bits: not through a double). */
static int meta_count(const StFile *f, const char *path, const char *key, unsigned long long *out)
{
    char v[64], *end;
    if (st_meta_get(f, key, v, sizeof v) < 0) {
        fprintf(stderr, "mgc: %s: the checkpoint does not say its %s (not one of mgc --save's, or an older mgc's): "
                "--resume cannot go on from it; --load starts a new run from its parameters\n", path, key);
        return -1;
    }
    errno = 0;
    *out = strtoull(v, &end, 10);
    if (!v[0] || v[0] == '-' || *end || errno) {
        fprintf(stderr, "mgc: %s: the checkpoint's %s is '%s', not a count\n", path, key, v);
        return -1;
    }
    return 0;
}

static int load_checkpoint(Store *s, const char *path, Resume *resume)
{
    StFile f;
    char err[512];
    if (st_load(path, &f, err, sizeof err)) {
        fprintf(stderr, "mgc: cannot load checkpoint: %s\n", err);
        return -1;
    }
    int bad = 0, nonfinite_tensors = 0;
    if (resume && (meta_count(&f, path, "epoch", &resume->epoch) || meta_count(&f, path, "steps", &resume->steps) ||
                   meta_count(&f, path, "seed", &resume->seed) || meta_count(&f, path, "batch_size", &resume->batch_size))) {
        st_free(&f);
        return -1;
    }
    if (resume && st_meta_get(&f, "lr_schedule", resume->schedule, sizeof resume->schedule) < 0) resume->schedule[0] = 0;
    for (int k = 0; k < s->n; k++) {
        StoreEntry *e = &s->e[k];
        const StTensor *t = st_find(&f, e->name);
        if (!t) {
            if (e->trainable || rt_store_is_running(e)) {
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
            continue;
        }
        long n = e->numel, nonfinite = 0;
        for (long i = 0; i < n; i++) nonfinite += !isfinite(e->data[i]);
        if (nonfinite && nonfinite_tensors++ < 4)
            fprintf(stderr, "mgc: warning: %s: tensor '%s' holds %ld values that are not finite (NaN or infinity) "
                    "of %ld\n", path, e->name, nonfinite, n);
    }
    if (nonfinite_tensors)
        fprintf(stderr, "mgc: warning: %s: %d tensors hold NaN or infinity: the checkpoint was saved from a run that "
                "diverged, or is damaged; the net's outputs will not be finite\n", path, nonfinite_tensors);
    st_free(&f);
    return bad ? -1 : 0;
}

/* ------------------------------------------------------------------- helpers */

static int check_input(const Program *p, int c, int h, int w, const char *what)
{
    const Shape *s = &p->input_shape;
    if (s->nd == 4 && s->d[1] == c && s->d[2] == h && s->d[3] == w) return 0;
    Arena a;
    arena_init(&a);
    fprintf(stderr, "mgc: the net's input %s does not match %s [N,%d,%d,%d]; declare 'input x[N, %d, %d, %d]'\n",
            ir_shape_str(&a, s), what, c, h, w, c, h, w);
    arena_free(&a);
    return -1;
}

static float read1(const Exec *x, int buf) { return x->host[buf][0]; }

static void progress(const TrainConfig *cfg, int epoch, long done, long total, double loss, double t0)
{
    int width = 30, fill = (int)((double)width * done / total);
    fprintf(stderr, "\r  epoch %d/%d [", epoch, cfg->epochs);
    for (int k = 0; k < width; k++) fputc(k < fill ? '=' : k == fill ? '>' : ' ', stderr);
    double dt = now() - t0;
    fprintf(stderr, "] %3ld%%  loss %.3f  %.0f examples/s ", 100 * done / total, loss, dt > 0 ? done / dt : 0.0);
    fflush(stderr);
}

/* ------------------------------------------------------------------ one epoch */

/* The batch of B examples from `at` (fewer at the end): false when there is
   none, or it has fewer than min_b examples (dropped: said at the start).
   Else its size b, and this replica's shard of it [first, first + n), read
   into x's input and labels when n > 0. */
static bool gather_shard(Group *g, Replica *r, Exec *x, int B, int min_b, long at, long *b, long *first, long *n)
{
    if (at >= g->count) return false;
    *b = g->count - at < B ? g->count - at : B;
    if (*b < min_b) return false;
    train_shard(*b, g->total, r->global, first, n);
    const Program *p = x->prog;
    if (*n > 0) data_gather(g->data, g->order + at + *first, (int)*n, rt_exec_host(x, p->input), rt_exec_host(x, p->labels));
    return true;
}

static void epoch_on_replica(Group *g, Replica *r)
{
    const Program *p = g->m->train;
    const TrainConfig *cfg = g->cfg;
    int B = cfg->batch_size, W = g->total;
    float *control = rt_exec_host(&r->tr, p->control);
    r->loss_sum = r->correct = 0;
    r->seen = 0;
    r->compute_seconds = 0;
    r->stop = false;
    double wait0 = r->tr.wait_seconds;
    long at = 0, b, first, n, step = 0;
    double t0 = now();
    bool have = gather_shard(g, r, &r->tr, B, W, at, &b, &first, &n);
    bool per_step = train_lr_per_step(cfg);
    for (; have && !r->stop; step++) {
        if (per_step)   /* every replica computes the same rate from the step's place in the run */
            rt_exec_set_sgd(&r->tr, train_lr(cfg, g->epoch, step, g->steps_per_epoch), cfg->momentum, cfg->weight_decay);
        if (control) {
            control[0] = interrupted ? 1.0f : 0.0f;
            control[1] = r->diverged ? 1.0f : 0.0f;
        }
        if (r->steps == 0 && r->global == 0 && cfg->verbose && cfg->started > 0)
            fprintf(stderr, "mgc: the first training step starts %.2f s after mgc did\n", now() - cfg->started);
        rt_exec_start(&r->tr, n, b, first);
        /* the next batch is read while the device computes this one (where it queues work) */
        long nb = 0, nfirst = 0, nn = 0;
        bool more = gather_shard(g, r, &r->tr, B, W, at + B, &nb, &nfirst, &nn);
        rt_exec_finish(&r->tr);
        double t1 = now();
        r->compute_seconds += t1 - t0;
        t0 = t1;
        r->steps++;
        float l = read1(&r->tr, p->loss);
        if (!isfinite(l) || (r->tr.check_nan && r->tr.nan_step >= 0)) r->diverged = true;
        if (r->tr.check_nan && r->tr.nan_step >= 0 && !r->nan_epoch) r->nan_epoch = g->epoch, r->nan_batch = r->steps;
        r->loss_sum += (double)l * n;
        r->correct += read1(&r->tr, p->correct);
        r->seen += n;
        if (control ? control[1] > 0 : r->diverged) r->stop = true, r->stop_reason = 2;
        else if (control ? control[0] > 0 : interrupted) r->stop = true, r->stop_reason = 1;
        if (r->global == 0 && cfg->progress && now() - g->last_draw > 0.2) {
            progress(cfg, g->epoch, at + b, g->count, r->loss_sum / r->seen, g->t0);
            g->last_draw = now();
        }
        at += B;
        have = more, b = nb, first = nfirst, n = nn;
    }
    r->wait_seconds = r->tr.wait_seconds - wait0;
    r->compute_seconds -= r->wait_seconds;
}

static void eval_on_replica(Group *g, Replica *r)
{
    const Program *p = g->m->eval;
    int B = g->cfg->batch_size;
    r->eval_correct = 0;
    long at = 0, b, first, n;
    bool have = gather_shard(g, r, &r->ev, B, 1, at, &b, &first, &n);
    while (have) {
        if (n > 0) rt_exec_start(&r->ev, n, b, first);   /* a last batch smaller than the replicas leaves some none */
        long nb = 0, nfirst = 0, nn = 0;
        bool more = gather_shard(g, r, &r->ev, B, 1, at + B, &nb, &nfirst, &nn);
        if (n > 0) {
            rt_exec_finish(&r->ev);
            r->eval_correct += read1(&r->ev, p->correct);
        }
        at += B;
        have = more, b = nb, first = nfirst, n = nn;
    }
}

/* Test accuracy over every replica of every rank (NaN without test examples). */
static double evaluate(Group *g, const Dataset *test, int *order)
{
    if (test->n == 0) return NAN;
    from_replica0(g, STORE_RUNNING, false);
    for (int i = 0; i < test->n; i++) order[i] = i;
    g->data = test;
    g->order = order;
    g->count = test->n;
    on_every_replica(g, eval_on_replica);
    double correct = 0;
    for (int k = 0; k < g->n; k++) correct += g->r[k].eval_correct;
    rt_world_sum_f64(g->world, &correct, 1);
    return correct / test->n;
}

/* ---------------------------------------------------------------- check mode */

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
        float l = read1(&r->tr, tp->loss);
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

static int check_mode(Group *g)
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
    on_every_replica(g, check_on_replica);
    /* every rank filled its own rows (zeros elsewhere), and its replicas' losses: sums join them */
    rt_world_sum_f32(g->world, g->losses, (long)cfg->steps * g->total);
    rt_world_sum_f32(g->world, g->logits, b * classes);
    rt_world_sum_f32(g->world, g->grad_x, b * per_x);
    double state_diff = replica_diff(g, true), param_diff = replica_diff(g, false);
    from_replica0(g, STORE_RUNNING, false);
    on_every_replica(g, check_eval_on_replica);
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
    if (!rc && cfg->save) rc = save_everywhere(g, cfg->save, 0);
    return rc;
}

/* ------------------------------------------------------------ the report */

static void device_list(const Group *g, char *buf, size_t size)
{
    int p = snprintf(buf, size, "%s[", g->world->size > 1 ? "every rank: " : "");
    for (int k = 0; k < g->n && p < (int)size; k++)
        p += snprintf(buf + p, size - (size_t)p, "%s%s", k ? ", " : "", g->r[k].dev->name);
    if (p < (int)size) snprintf(buf + p, size - (size_t)p, "]");
}

/* The group's communication this epoch, per device of every rank (rank 0 has
   them all): bytes sent per step against the ring's bound, seconds waiting for
   sums and computing. The busiest device and the means summarise it. */
enum { CR_SENT, CR_BOUND, CR_MPI, CR_WAIT, CR_COMPUTE, CR_FIELDS };
typedef struct CommReport {
    double *dev;              /* [total][CR_FIELDS] */
    int total;
    double bytes_per_step, bound_per_step, mpi_bytes_per_step, wait_s, compute_s;
} CommReport;

static CommReport comm_report(Group *g, long steps)
{
    CommReport c = { .total = g->total };
    if (!g->comm || steps == 0) return c;
    c.dev = calloc((size_t)g->total * CR_FIELDS, sizeof(double));
    for (int k = 0; k < g->n; k++) {
        CommStats st;
        rt_comm_stats(g->comm, k, &st);
        double *d = c.dev + (size_t)g->r[k].global * CR_FIELDS;
        d[CR_SENT] = st.bytes_sent / (double)steps;
        d[CR_BOUND] = st.bytes_bound / (double)steps;
        d[CR_MPI] = st.mpi_bytes / (double)steps;
        d[CR_WAIT] = g->r[k].wait_seconds;
        d[CR_COMPUTE] = g->r[k].compute_seconds;
    }
    rt_world_sum_f64(g->world, c.dev, g->total * CR_FIELDS);   /* every rank filled its own devices' rows */
    for (int r = 0; r < g->total; r++) {
        const double *d = c.dev + (size_t)r * CR_FIELDS;
        if (d[CR_SENT] > c.bytes_per_step) c.bytes_per_step = d[CR_SENT];
        if (d[CR_BOUND] > c.bound_per_step) c.bound_per_step = d[CR_BOUND];
        if (d[CR_MPI] > c.mpi_bytes_per_step) c.mpi_bytes_per_step = d[CR_MPI];
        c.wait_s += d[CR_WAIT] / g->total;
        c.compute_s += d[CR_COMPUTE] / g->total;
    }
    return c;
}

/* "cpu:1", or "rank 1 cpu:0" in a run of several ranks (which all have this rank's devices). */
static const char *device_name(const Group *g, int global, char *buf, size_t size)
{
    if (g->world->size > 1) snprintf(buf, size, "rank %d %s", global / g->n, g->r[global % g->n].dev->name);
    else snprintf(buf, size, "%s", g->r[global].dev->name);
    return buf;
}

/* ---------------------------------------------------------------- the job */

/* --check-nan: where the first value that was not finite came from. */
static void report_nan(const Group *g)
{
    for (int k = 0; k < g->n; k++) {
        const Replica *r = &g->r[k];
        const Exec *x = &r->tr;
        if (!x->check_nan || x->nan_step < 0) continue;
        const Program *p = x->prog;
        const Step *s = &p->steps[x->nan_step];
        const Buf *b = &p->bufs[x->nan_buf];
        int nb = s->node >= 0 ? p->node_buf[s->node] : -1;
        const char *node = nb >= 0 && p->bufs[nb].origin ? p->bufs[nb].origin : NULL;
        fprintf(stderr, "mgc: --check-nan: the first value that is not finite (%g) was written in epoch %d, step %ld "
                "of the run, on %s, by step %d of the training program: %s%s%s%s\n",
                (double)x->nan_value, r->nan_epoch, r->nan_batch, r->dev->name, x->nan_step,
                s->kind == STEP_KERNEL ? "kernel " : s->kind == STEP_GEMM ? "a GEMM" : "the sum of a gradient bucket",
                s->kind == STEP_KERNEL ? s->fn : "", node ? ", computing " : "", node ? node : "");
        fprintf(stderr, "mgc: it went into element %ld of b%d (%s%s%s); every earlier step wrote finite values "
                "(--emit kernels shows the step)\n", x->nan_at, x->nan_buf, b->name, b->origin ? ", of " : "",
                b->origin ? b->origin : "");
        return;
    }
}

static const char *bytes_str(double b, char *buf, size_t size)
{
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    int u = 0;
    while (b >= 1024 && u < 5) b /= 1024, u++;
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

/* One replica's memory at `shard` examples: the training program's slots,
   the evaluation program's where they do not fit in those, and the
   parameters and state. */
static size_t replica_bytes(const Model *m, long shard)
{
    size_t t = cg_plan_bytes(m->train, shard), e = cg_plan_bytes(m->eval, shard);
    return t + (e > t ? e : 0) + cg_persistent_bytes(m->train);
}

/* Before anything is allocated or compiled: does every replica's memory fit
   where it goes? The CPU devices of a process share the host's memory; a GPU
   has its own. When not, says which buffers are largest and which batch would
   fit, and returns -1. */
static int check_memory(const Group *g, long shard)
{
    const Model *m = g->m;
    const TrainConfig *cfg = g->cfg;
    for (int k = 0; k < g->n; k++) {
        Device *d = g->r[k].dev;
        int sharing = 0;   /* replicas in d's memory; checked at the first of them */
        bool first = true;
        for (int j = 0; j < g->n; j++) {
            bool same = d->kind == DEV_CPU ? g->r[j].dev->kind == DEV_CPU
                                           : cfg->devices[j].kind == DEV_CUDA && cfg->devices[j].index == cfg->devices[k].index;
            if (same && j < k) first = false;
            sharing += same;
        }
        size_t avail = d->ops->memory_free ? d->ops->memory_free(d) : 0;
        size_t need = (size_t)sharing * replica_bytes(m, shard);
        if (!first || !avail || need <= avail) continue;
        char b1[32], b2[32], b3[32], b4[32];
        const char *where = d->kind == DEV_CPU ? "this machine" : d->name;
        fprintf(stderr, "mgc: not enough memory: training %s at batch %d needs %s on %s (%d device%s x (%s of activations "
                "and scratch for %ld examples + %s of parameters and state)), but %s is available\n",
                m->train->net_name, cfg->batch_size, bytes_str((double)need, b1, sizeof b1), where, sharing,
                sharing == 1 ? "" : "s", bytes_str((double)(replica_bytes(m, shard) - cg_persistent_bytes(m->train)), b2, sizeof b2),
                shard, bytes_str((double)cg_persistent_bytes(m->train), b3, sizeof b3), bytes_str((double)avail, b4, sizeof b4));
        /* the three largest buffers of the training program */
        const Program *p = m->train;
        int top[3] = { -1, -1, -1 };
        for (int b = 0; b < p->nbufs; b++) {
            if (p->slot[b] < 0) continue;
            long sz = cg_dim(p->bufs[b].size, shard);
            for (int t = 0; t < 3; t++)
                if (top[t] < 0 || sz > cg_dim(p->bufs[top[t]].size, shard)) {
                    for (int u = 2; u > t; u--) top[u] = top[u - 1];
                    top[t] = b;
                    break;
                }
        }
        fprintf(stderr, "mgc: the largest buffers at %ld examples:\n", shard);
        for (int t = 0; t < 3 && top[t] >= 0; t++) {
            const Buf *b = &p->bufs[top[t]];
            fprintf(stderr, "    %10s  %s%s%s\n", bytes_str(4.0 * (double)cg_dim(b->size, shard), b1, sizeof b1), b->name,
                    b->origin ? ", of " : "", b->origin ? b->origin : "");
        }
        /* the largest shard that fits in nine tenths of what is there */
        long lo = 0, hi = shard;
        while (lo < hi) {
            long mid = (lo + hi + 1) / 2;
            if ((double)sharing * (double)replica_bytes(m, mid) <= 0.9 * (double)avail) lo = mid;
            else hi = mid - 1;
        }
        if (lo > 0)
            fprintf(stderr, "mgc: --batch-size %ld would fit (%ld examples per device)\n", lo * g->total, lo);
        else
            fprintf(stderr, "mgc: even one example per device does not fit: make the net smaller, or train on a "
                    "device with more memory\n");
        return -1;
    }
    return 0;
}

/* The data set, read (and decompressed) by a thread of its own while the
   kernels load and the parameters are initialised. */
typedef struct DataLoad {
    const char *dir;
    Dataset train, test;
    int rc;
    char err[1024];
    pthread_t thread;
    bool started;
} DataLoad;

static void *load_data(void *arg)
{
    DataLoad *d = arg;
    d->rc = data_load_fashion_mnist(d->dir, &d->train, &d->test, d->err, sizeof d->err);
    return NULL;
}

static void data_start(DataLoad *d, const char *dir)
{
    d->dir = dir;
    d->started = pthread_create(&d->thread, NULL, load_data, d) == 0;
    if (!d->started) load_data(d);
}

static int data_wait(DataLoad *d)
{
    if (d->started) pthread_join(d->thread, NULL);
    d->started = false;
    return d->rc;
}

int train_run(const Model *m, const TrainConfig *cfg)
{
    const Program *tp = m->train;
    World *world = cfg->world;
    char err[1024], num[32], num2[32], num3[32], devs[256];
    Group G = { .m = m, .cfg = cfg, .world = world, .n = cfg->replicas };
    Group *g = &G;
    G.total = G.n * world->size;
    G.r = calloc((size_t)G.n, sizeof(Replica));
    RtOptions opt = { .verbose = cfg->verbose && world->rank == 0 };
    int status = 1;
    Dataset train = { 0 }, test = { 0 };
    DataLoad data = { 0 };
    if (!cfg->batch_file && cfg->epochs > 0) data_start(&data, cfg->data_dir);
    int *order = NULL;
    FILE *log = NULL;
    bool log_failed = false;
    /* from here on a stop signal is a request, answered at the next stop point or step */
    struct sigaction stop_sa = { .sa_handler = on_stop_signal }, old_sa[NSTOP_SIGNALS];
    sigemptyset(&stop_sa.sa_mask);
    interrupted = 0;
    for (int k = 0; k < NSTOP_SIGNALS; k++) sigaction(stop_signals[k], &stop_sa, &old_sa[k]);
    int stopped_at = 0;       /* set where a signal stopped the run: 1 before training, 2 during an epoch, 3 after one */

    /* the cores of this process, shared out between its replicas */
    int threads = cfg->threads > 0 ? cfg->threads : rt_cores();
    if (cfg->devices[0].kind == DEV_CPU && threads > rt_cores()) {
        if (world->rank == 0)
            fprintf(stderr, "mgc: warning: --threads %d is more than the %d core%s this process may use; using %d "
                    "(threads beyond the cores wait for each other at every barrier and run far slower)\n",
                    threads, rt_cores(), rt_cores() == 1 ? "" : "s", rt_cores());
        threads = rt_cores();
    }
    int rc = 0;
    bool cuda = cfg->devices[0].kind == DEV_CUDA;
    for (int k = 0; k < G.n; k++) {
        Replica *r = &G.r[k];
        r->index = k;
        r->global = world->rank * G.n + k;
        if (cuda) {
            CudaOptions co = { .tf32 = cfg->tf32, .verbose = opt.verbose && k == 0 };
            if (!(r->dev = rt_device_cuda_new(cfg->devices[k].index, &co, err, sizeof err))) {
                fprintf(stderr, "mgc: %s\n", err);
                rc = 1;
                break;
            }
        } else {
            int t = threads / G.n + (k < threads % G.n);
            r->dev = rt_device_cpu_new(k, t > 0 ? t : 1, cfg->cpu_own_memory);
        }
    }
    if (!rc && G.total > 1 && !cuda) G.comm = rt_comm_new(G.n, world, tp->ncolls);
    if (!rc && G.total > 1 && cuda) {
        Device **gd = calloc((size_t)G.n, sizeof *gd);   /* kept by the group */
        for (int k = 0; k < G.n; k++) gd[k] = G.r[k].dev;
        if (rt_cuda_group(gd, G.n, world, tp->ncolls, err, sizeof err)) {
            fprintf(stderr, "mgc: %s\n", err);
            rc = 1;
        }
    }
    opt.no_record = cfg->no_graphs;
    long shard = (cfg->batch_size + G.total - 1) / G.total;   /* the most examples a replica gets */
    if (!rc && check_memory(g, shard)) rc = 1;
    for (int k = 0; k < G.n && !rc; k++) {
        Replica *r = &G.r[k];
        /* an Exec that failed half-way still holds memory: freed with the others */
        r->have_tr = true;
        if (rt_exec_init(&r->tr, tp, r->dev, &r->store, shard, NULL, &opt, err, sizeof err)) rc = 1;
        if (!rc) {
            r->have_ev = true;
            if (rt_exec_init(&r->ev, m->eval, r->dev, &r->store, shard, &r->tr, &opt, err, sizeof err)) rc = 1;
        }
        if (rc) fprintf(stderr, "mgc: %s\n", err);
        if (rc) break;
        r->tr.comm = G.comm;
        r->tr.grouped = G.total > 1;
        r->tr.replica = k;
        rt_exec_set_sgd(&r->tr, cfg->lr, cfg->momentum, cfg->weight_decay);
        if (cfg->check_nan) rt_exec_check_nan(&r->tr);
        if (cfg->profile && k == 0 && world->rank == 0) rt_exec_profile(&r->tr);
        r->tr.seed = r->ev.seed = cfg->seed;
        opt.verbose = false;   /* once is enough */
    }
    if ((status = stop_point(world, rc))) {   /* the kernels took a while to compile: a stop asked meanwhile is answered */
        stopped_at = status > 1;
        if (status == 1) goto out;
        goto stop;
    }
    status = 1;
    rt_store_init(&G.r[0].store, cfg->seed);
    rc = 0;
    Resume resume = { 0 };
    if (cfg->load && world->rank == 0 && load_checkpoint(&G.r[0].store, cfg->load, cfg->resume ? &resume : NULL)) rc = 1;
    if (rt_world_max_status(world, rc)) goto out;
    int first_epoch = 1;
    if (cfg->resume) {
        rt_world_bcast(world, &resume, sizeof resume);
        first_epoch = resume.epoch < (unsigned long long)cfg->epochs ? (int)resume.epoch + 1 : cfg->epochs + 1;
        for (int k = 0; k < G.n; k++) G.r[k].tr.runs_before = resume.steps;
        if (world->rank == 0) {
            if (first_epoch > cfg->epochs) {
                printf("mgc: %s holds %llu epoch%s already, --epochs %d: nothing to train (a larger --epochs goes on)\n",
                       cfg->load, resume.epoch, resume.epoch == 1 ? "" : "s", cfg->epochs);
            } else {
                printf("mgc: going on from %s after epoch %llu (%llu steps)\n", cfg->load, resume.epoch, resume.steps);
                if (resume.seed != cfg->seed || resume.batch_size != (unsigned long long)cfg->batch_size)
                    printf("mgc: note: the checkpoint was trained with --seed %llu --batch-size %llu, this run has --seed %llu "
                           "--batch-size %d: it goes on, but not as the first run would have\n",
                           resume.seed, resume.batch_size, cfg->seed, cfg->batch_size);
                char sched[256];
                schedule_str(cfg, sched, sizeof sched);
                if (resume.schedule[0] && strcmp(resume.schedule, sched))
                    printf("mgc: note: the checkpoint was trained with %s; this run has %s: epoch %d goes on along "
                           "this run's schedule, not the first run's\n", resume.schedule, sched, first_epoch);
            }
            fflush(stdout);
        }
        if (first_epoch > cfg->epochs) {
            status = 0;
            goto out;
        }
    }
    from_replica0(g, STORE_ALL, true);   /* every replica starts from replica 0's parameters */

    if (cfg->batch_file) {
        status = check_mode(g);
        goto out;
    }
    long params = tp->param_scalars;
    if (cfg->epochs == 0) {
        status = cfg->save && save_everywhere(g, cfg->save, 0) ? 1 : 0;
        if (!status && world->rank == 0) {
            printf("%s: %s parameters in %d tensors ", tp->net_name, rt_commas(params, num), tp->param_tensors);
            if (cfg->load) printf("loaded from %s", cfg->load);
            else printf("initialised (seed %llu)", cfg->seed);
            printf("%s%s\n", cfg->save ? ", saved to " : "", cfg->save ? cfg->save : "");
        }
        goto out;
    }

    /* The net must fit the data before the data is read. */
    if (check_input(tp, 1, 28, 28, "Fashion-MNIST images")) goto out;
    if (tp->classes < DATA_CLASSES) {
        fprintf(stderr, "mgc: the net has %d outputs but Fashion-MNIST has %d classes; use --set classes=%d\n",
                tp->classes, DATA_CLASSES, DATA_CLASSES);
        goto out;
    }
    rc = 0;
    rc = data_wait(&data);
    train = data.train, test = data.test;
    data.train = data.test = (Dataset){ 0 };
    if (rc) {
        if (world->size > 1) fprintf(stderr, "mgc: rank %d: %s\n", world->rank, data.err);
        else fprintf(stderr, "mgc: %s\n", data.err);
        rc = 1;
    }
    if (!rc && cfg->log && world->rank == 0 && !(log = fopen(cfg->log, cfg->resume ? "a" : "w"))) {
        fprintf(stderr, "mgc: cannot write --log %s: %s\n", cfg->log, strerror(errno));
        rc = 1;
    }
    if ((status = stop_point(world, rc))) {
        if (status == 1 && !rc) fprintf(stderr, "mgc: rank %d: stopping, another rank failed (see its message)\n", world->rank);
        stopped_at = status > 1;
        if (status == 1) goto out;
        goto stop;
    }
    status = 1;
    data_limit(&train, cfg->limit_train);
    data_limit(&test, cfg->limit_test);
    /* every full batch, and a last one with an example for each replica at least (gather_shard) */
    G.steps_per_epoch = train.n / cfg->batch_size + (train.n % cfg->batch_size >= G.total ? 1 : 0);
    order = malloc(sizeof(int) * (size_t)(train.n > test.n ? train.n : test.n) + 1);
    device_list(g, devs, sizeof devs);
    if (world->rank == 0) {
        printf("mgc: %s, %s parameters in %d tensors, on %s", tp->net_name, rt_commas(params, num), tp->param_tensors, devs);
        if (world->size > 1) printf(" x %d ranks", world->size);
        if (cuda) printf(" (%s)", G.r[0].dev->model);
        else printf(" with %d thread%s%s", G.r[0].dev->threads, G.r[0].dev->threads == 1 ? "" : "s", G.n > 1 ? " each" : "");
        if (cfg->evaluate) printf("; %s test examples, batch %d\n", rt_commas(test.n, num3), cfg->batch_size);
        else printf("; %s training and %s test examples, batch %d%s\n", rt_commas(train.n, num2),
                    rt_commas(test.n, num3), cfg->batch_size, cfg->sync_bn ? ", BatchNorm synchronised" : "");
        if (!cuda && threads < G.n)
            printf("mgc: %d devices on %d thread%s: they share the cores (the numbers are the same, the speed is not)\n",
                   G.n, threads, threads == 1 ? "" : "s");
        long last = train.n % cfg->batch_size;
        if (last > 0 && last < G.total)
            printf("mgc: the last %ld example%s of every epoch %s dropped: fewer than the %d replicas\n", last,
                   last == 1 ? "" : "s", last == 1 ? "is" : "are", G.total);
        fflush(stdout);
    }
    if (cfg->evaluate) {
        double t0 = now(), acc = evaluate(g, &test, order);
        if (world->rank == 0) {
            if (isnan(acc)) printf("no test examples to evaluate on (--limit-test 0)\n");
            else printf("test acc %.4f  on %s test examples in %.2f s, parameters %s%s\n", acc, rt_commas(test.n, num3), now() - t0,
                        cfg->load ? "from " : "initialised", cfg->load ? cfg->load : "");
        }
        status = 0;
        goto out;
    }
    int epoch;
    status = 0;
    bool stopped = false;
    for (epoch = first_epoch; epoch <= cfg->epochs && !stopped; epoch++) {
        double t0 = now();
        data_epoch_order(train.n, cfg->seed, epoch, order);
        G.data = &train;
        G.order = order;
        G.count = train.n;
        if (G.comm) rt_comm_reset_stats(G.comm);
        long steps0 = G.r[0].steps;
        G.epoch = epoch;
        float lr = train_lr(cfg, epoch, 0, G.steps_per_epoch);
        for (int k = 0; k < G.n; k++) rt_exec_set_sgd(&G.r[k].tr, lr, cfg->momentum, cfg->weight_decay);
        G.t0 = t0;
        on_every_replica(g, epoch_on_replica);
        double t_train = now() - t0;
        double sums[3] = { 0, 0, 0 };
        for (int k = 0; k < G.n; k++) {
            sums[0] += G.r[k].loss_sum;
            sums[1] += G.r[k].correct;
            sums[2] += (double)G.r[k].seen;
        }
        rt_world_sum_f64(world, sums, 3);
        Replica *r0 = &G.r[0];
        if (r0->stop) {
            stopped = true;
            if (r0->stop_reason == 2) {
                bool named = false;
                for (int k = 0; k < G.n; k++) named |= G.r[k].tr.check_nan && G.r[k].tr.nan_step >= 0;
                if (world->rank == 0 && !named)
                    fprintf(stderr, "\nmgc: the loss became %g in epoch %d: training diverged; try a smaller --lr%s\n",
                            sums[0] / (sums[2] > 0 ? sums[2] : 1), epoch,
                            cfg->check_nan ? "" : " (--check-nan names the first layer whose output is not finite)");
                report_nan(g);
                status = 1;
            } else {
                stopped_at = 2;   /* the signal's number: below, from every rank */
            }
            break;
        }
        if (cfg->progress && world->rank == 0) fprintf(stderr, "\r%*s\r", 100, "");
        double test_acc = evaluate(g, &test, order);
        double secs = now() - t0;
        double seen = sums[2] > 0 ? sums[2] : 1, eps = sums[2] / t_train;
        long steps = G.r[0].steps - steps0;
        if (train_lr_per_step(cfg) && steps > 0) lr = train_lr(cfg, epoch, steps - 1, G.steps_per_epoch);   /* the last step's */
        CommReport cr = comm_report(g, steps);
        if (world->rank == 0) {
            char accs[32];
            if (isnan(test_acc)) snprintf(accs, sizeof accs, "-");
            else snprintf(accs, sizeof accs, "%.3f", test_acc);
            char lrs[32] = "";
            if (cfg->lr_schedule != LR_CONSTANT || cfg->warmup) snprintf(lrs, sizeof lrs, "  lr %.4g", (double)lr);
            printf("epoch %d/%d  loss %.3f  train acc %.3f  test acc %s%s  %s examples/s  %.1f s  on %s\n",
                   epoch, cfg->epochs, sums[0] / seen, sums[1] / seen, accs, lrs, rt_commas((long)eps, num), secs, devs);
            if (cr.dev) {
                printf("  communication per step: %.2f MB sent by the busiest replica (ring bound 2(N-1)/N S = %.2f MB)",
                       cr.bytes_per_step / 1e6, cr.bound_per_step / 1e6);
                if (cr.mpi_bytes_per_step > 0) printf(", %.2f MB summed with the other ranks by MPI", cr.mpi_bytes_per_step / 1e6);
                printf("; waiting %.1f%% of the step, computing %.1f%%\n", 100 * cr.wait_s / t_train, 100 * cr.compute_s / t_train);
                if (cfg->verbose)
                    for (int r = 0; r < G.total; r++) {
                        const double *d = cr.dev + (size_t)r * CR_FIELDS;
                        char name[48];
                        printf("    %-14s sent %.3f MB a step (bound %.3f MB), waited %.2f s, computed %.2f s\n",
                               device_name(g, r, name, sizeof name), d[CR_SENT] / 1e6, d[CR_BOUND] / 1e6, d[CR_WAIT], d[CR_COMPUTE]);
                    }
            }
            fflush(stdout);
            if (log) {
                fprintf(log, "{\"epoch\": %d, \"loss\": %.6f, \"train_acc\": %.6f, \"test_acc\": ", epoch, sums[0] / seen, sums[1] / seen);
                if (isnan(test_acc)) fprintf(log, "null");
                else fprintf(log, "%.6f", test_acc);
                fprintf(log, ", \"lr\": %.9g, \"examples_per_s\": %.1f, \"seconds\": %.3f, \"train_seconds\": %.3f, \"replicas\": %d",
                        (double)lr, eps, secs, t_train, G.total);
                size_t peak = rt_peak_resident();
                if (peak) fprintf(log, ", \"peak_resident_mb\": %.1f", (double)peak / (1 << 20));
                if (cr.dev) {
                    fprintf(log, ", \"comm\": {\"steps\": %ld, \"bytes_per_step\": %.0f, \"ring_bound_per_step\": %.0f, "
                                 "\"mpi_bytes_per_step\": %.0f, \"wait_seconds\": %.3f, \"compute_seconds\": %.3f, \"devices\": [",
                            steps, cr.bytes_per_step, cr.bound_per_step, cr.mpi_bytes_per_step, cr.wait_s, cr.compute_s);
                    for (int r = 0; r < G.total; r++) {
                        const double *d = cr.dev + (size_t)r * CR_FIELDS;
                        char name[48];
                        fprintf(log, "%s{\"device\": \"%s\", \"bytes_per_step\": %.0f, \"ring_bound_per_step\": %.0f, "
                                     "\"mpi_bytes_per_step\": %.0f, \"wait_seconds\": %.3f, \"compute_seconds\": %.3f}",
                                r ? ", " : "", device_name(g, r, name, sizeof name), d[CR_SENT], d[CR_BOUND], d[CR_MPI], d[CR_WAIT],
                                d[CR_COMPUTE]);
                    }
                    fprintf(log, "]}");
                }
                fprintf(log, "}\n");
                if (fflush(log) || ferror(log)) {   /* a full disk: said now, and the run ends with status 1 */
                    fprintf(stderr, "mgc: cannot write --log %s: %s; training goes on without the log\n", cfg->log, strerror(errno));
                    fclose(log);
                    log = NULL;
                    log_failed = true;
                }
            }
        }
        free(cr.dev);
        if (cfg->save && save_everywhere(g, cfg->save, epoch)) { status = 1; break; }
        if (epoch < cfg->epochs && stop_point(world, 0)) {   /* asked during the evaluation or the save: stop here */
            stopped_at = 3;
            break;
        }
    }
    if (status == 0 && stopped_at) {   /* which signal, from whichever rank got it */
        int sig = stop_point(world, 0) - 128;
        if (sig > 0 && world->rank == 0) {
            if (stopped_at == 3)
                fprintf(stderr, "\nmgc: interrupted by %s after epoch %d%s%s%s\n", signal_name(sig), epoch,
                        cfg->save ? "; the checkpoint holds it: " : "", cfg->save ? cfg->save : "", cfg->save ? " (--resume it to go on)" : "");
            else if (cfg->save && (epoch > first_epoch || cfg->resume))
                fprintf(stderr, "\nmgc: interrupted by %s during epoch %d; the checkpoint holds the last finished epoch: %s "
                        "(--resume it to go on)\n", signal_name(sig), epoch, cfg->save);
            else
                fprintf(stderr, "\nmgc: interrupted by %s during epoch %d%s\n", signal_name(sig), epoch,
                        cfg->save ? "; no epoch had finished: nothing was saved" : "");
        }
        status = sig > 0 ? 128 + sig : 130;
    }
    goto out;
stop:   /* a signal before the training began */
    if (world->rank == 0)
        fprintf(stderr, "mgc: interrupted by %s before the training began; nothing was trained or saved\n", signal_name(status - 128));
out:
    if (G.n > 0 && G.r[0].have_tr && G.r[0].tr.step_seconds && G.r[0].tr.runs) rt_exec_profile_report(&G.r[0].tr, stderr);
    if (log && fclose(log)) {
        fprintf(stderr, "mgc: cannot write --log %s: %s\n", cfg->log, strerror(errno));
        log_failed = true;
    }
    if (log_failed && status == 0) status = 1;
    free(order);
    data_wait(&data);   /* a run that stopped before it needed the data */
    data_free(&data.train);
    data_free(&data.test);
    data_free(&train);
    data_free(&test);
    rt_comm_free(G.comm);
    for (int k = 0; k < G.n; k++) {
        Replica *r = &G.r[k];
        if (r->have_ev) rt_exec_free(&r->ev);
        if (r->have_tr) rt_exec_free(&r->tr);
        rt_store_free(&r->store);
        rt_device_free(r->dev);
    }
    free(G.r);
    for (int k = 0; G.grads && k < tp->nparams; k++) free(G.grads[k]);
    free(G.grads);
    free(G.x); free(G.y); free(G.losses); free(G.logits); free(G.eval_logits); free(G.grad_x);
    for (int k = 0; k < NSTOP_SIGNALS; k++) sigaction(stop_signals[k], &old_sa[k], NULL);
    return status;
}
