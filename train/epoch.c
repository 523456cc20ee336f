/*
** The epoch loop: every replica runs the training program on its shard of
** every global batch (train_shard), the collectives in the program keeping
** them in step; then the test set is evaluated, and rank 0 reports the epoch
** (its line, the communication report, --log) and saves the checkpoint.
**
** Stopping (a stop signal, a diverging loss) must happen on the same step
** everywhere, or a replica would wait forever for a sum: each replica adds
** its vote to two floats summed with the last gradient bucket (the
** program's control buffer), and all stop when the sum says so.
*/
#include "epoch.h"
#include "checkpoint.h"
#include "tensorboard.h"
#include "pool.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* s seconds as "42s", "3m07s" or "1h02m" */
static const char *duration(double s, char *buf, size_t size)
{
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    if (t < 60) snprintf(buf, size, "%lds", t);
    else if (t < 3600) snprintf(buf, size, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, size, "%ldh%02ldm", t / 3600, t / 60 % 60);
    return buf;
}

/* Progress after `step` steps of this epoch (done of total examples): on a terminal the bar, redrawn,
   with the epoch's time to go; elsewhere (a log, nohup, Slurm, CI) a line every --progress-every
   seconds with the epoch's and the run's time to go (the test passes not counted). The loss is the
   epoch's so far on the first replica's shard (all of it on one device). */
static void progress(Group *g, long step, long done, long total, double loss)
{
    const TrainConfig *cfg = g->cfg;
    double now = train_now(), dt = now - g->t0, eps = dt > 0 ? done / dt : 0.0;
    double epoch_left = done > 0 ? dt * (double)(total - done) / (double)done : 0.0;
    long run_steps = (long)(cfg->epochs - g->first_epoch + 1) * g->steps_per_epoch;
    long run_done = (long)(g->epoch - g->first_epoch) * g->steps_per_epoch + step;
    double run_left = run_done > 0 ? (now - g->run_t0) * (double)(run_steps - run_done) / (double)run_done : 0.0;
    char a[32], b[32], num[32];
    const char *rate = rt_commas((long)(eps + 0.5), num);
    if (cfg->progress) {
        int width = 30, fill = (int)((double)width * done / total);
        fprintf(stderr, "\r  epoch %d/%d [", g->epoch, cfg->epochs);
        for (int k = 0; k < width; k++) fputc(k < fill ? '=' : k == fill ? '>' : ' ', stderr);
        fprintf(stderr, "] %3ld%%  loss %.3f  %s examples/s  eta %s ", 100 * done / total, loss, rate,
                duration(epoch_left, a, sizeof a));
    } else {
        fprintf(stderr, "  epoch %d/%d  step %ld/%ld  loss %.3f  %s examples/s  eta %s (epoch), %s (run)\n", g->epoch,
                cfg->epochs, step, g->steps_per_epoch, loss, rate, duration(epoch_left, a, sizeof a), duration(run_left, b, sizeof b));
    }
    fflush(stderr);
}

/* --log-every K: after step `step` of the epoch (run_step of the run), every K steps, a record of the steps since the last
   one (their mean loss on the first replica's shard, the rate, examples/s) in rank 0's --log */
static void log_step(Group *g, long step, long run_step, double loss, long n, int b)
{
    g->log_loss += loss * n, g->log_seen += n, g->log_steps++;
    if (g->log_steps < g->cfg->log_every || !g->log) return;
    double now = train_now(), dt = now - g->log_t0;
    fprintf(g->log, "{\"step\": %ld, \"epoch\": %d, \"epoch_step\": %ld, \"loss\": %.6f, \"lr\": %.9g, \"examples_per_s\": %.1f}\n",
            run_step, g->epoch, step, g->log_seen ? g->log_loss / g->log_seen : 0.0, train_lr(g->cfg, g->epoch, step - 1, g->steps_per_epoch),
            dt > 0 ? (double)g->log_steps * b / dt : 0.0);
    fflush(g->log);   /* a failed write is found at the epoch's record */
    g->log_loss = 0, g->log_seen = g->log_steps = 0, g->log_t0 = now;
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
    if (*n <= 0) return true;
    const Transform *t = &g->transform;
    if (transform_active(t))
        transform_gather(t, g->data, g->order + at + *first, (int)*n, g->augment, g->cfg->seed, g->epoch,
                         rt_exec_host(x, p->input), rt_exec_host(x, p->labels));
    else
        data_gather(g->data, g->order + at + *first, (int)*n, rt_exec_host(x, p->input), rt_exec_host(x, p->labels));
    return true;
}

/* --accumulate K: batch `m` of the epoch's place in its step (Program.accumulate's mode: 0 a step of one
   batch, 1 the first of several, 2 a middle one, 3 the last), and the step's examples (its batches',
   the last step's fewer) */
static int step_place(const Group *g, long m, long *examples, long batch)
{
    long K = g->cfg->accumulate > 1 ? g->cfg->accumulate : 1, u = m / K;
    long end = (u + 1) * K < g->batches_per_epoch ? (u + 1) * K : g->batches_per_epoch;   /* the step's batches: [u K, end) */
    long covered = end * (long)g->cfg->batch_size < g->count ? end * (long)g->cfg->batch_size : g->count;
    *examples = K == 1 ? batch : covered - u * K * (long)g->cfg->batch_size;
    return K == 1 ? 0 : m == end - 1 ? 3 : m == u * K ? 1 : 2;
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
    long at = 0, b, first, n, step = 0, m = 0, step_n = 0;
    double t0 = train_now(), step_loss = 0, step_hits = 0;
    r->step_t = t0;
    bool have = gather_shard(g, r, &r->tr, B, W, at, &b, &first, &n);
    bool per_step = train_lr_per_step(cfg);
    for (; have && !r->stop; m++) {
        long examples;
        int place = step_place(g, m, &examples, b);
        bool last = place == 0 || place == 3;   /* the step's last batch: summed across replicas, applied */
        if (per_step && place < 2)   /* every replica computes the same rate from the step's place in the run */
            rt_exec_set_lr(&r->tr, train_lr(cfg, g->epoch, step, g->steps_per_epoch));
        if (control && last) {
            control[0] = train_signal() ? 1.0f : 0.0f;
            control[1] = r->diverged ? 1.0f : 0.0f;
        }
        if (r->steps == 0 && r->global == 0 && cfg->verbose && cfg->started > 0)
            fprintf(stderr, "mgc: the first training step starts %.2f s after mgc did\n", train_now() - cfg->started);
        rt_exec_set_accumulate(&r->tr, place);
        rt_exec_start(&r->tr, n, examples, first);
        /* the next batch is read while the device computes this one (where it queues work) */
        long nb = 0, nfirst = 0, nn = 0;
        bool more = gather_shard(g, r, &r->tr, B, W, at + B, &nb, &nfirst, &nn);
        rt_exec_finish(&r->tr);
        double t1 = train_now();
        r->compute_seconds += t1 - t0;
        t0 = t1;
        r->steps++;
        float l = train_read1(&r->tr, p->loss);
        if (!isfinite(l) || (r->tr.check_nan && r->tr.nan_step >= 0)) r->diverged = true;
        if (r->tr.check_nan && r->tr.nan_step >= 0 && !r->nan_epoch) r->nan_epoch = g->epoch, r->nan_batch = r->steps;
        r->loss_sum += (double)l * n;
        float hits = train_read1(&r->tr, p->correct);
        r->correct += hits;
        r->seen += n;
        step_loss += (double)l * n, step_hits += hits, step_n += n;
        at += B;
        have = more, b = nb, first = nfirst, n = nn;
        if (!last) continue;
        if (control ? control[1] > 0 : r->diverged) r->stop = true, r->stop_reason = 2;
        else if (control ? control[0] > 0 : train_signal() != 0) r->stop = true, r->stop_reason = 1;
        if (r->global == 0 && g->world->rank == 0) {
            double sl = step_n > 0 ? step_loss / (double)step_n : (double)l;   /* the step's loss: its batches' (their mean) */
            long s = (long)(g->epoch - 1) * g->steps_per_epoch + step + 1;   /* the run's step axis */
            if (cfg->log_every) log_step(g, step + 1, s, sl, step_n, (int)examples);
            if (g->tb) {   /* the step's scalars (the first replica's shard) */
                tb_scalar(g->tb, "train/loss", sl, s);
                tb_scalar(g->tb, "train/accuracy", step_n > 0 ? step_hits / (double)step_n : 0.0, s);
                tb_scalar(g->tb, "train/lr", train_lr(cfg, g->epoch, step, g->steps_per_epoch), s);
                tb_scalar(g->tb, "train/examples_per_s", t1 > r->step_t ? (double)examples / (t1 - r->step_t) : 0.0, s);
                r->step_t = t1;
            }
            double every = cfg->progress ? 0.2 : cfg->progress_every;
            if ((cfg->progress || every > 0) && train_now() - g->last_draw >= every) {
                progress(g, step + 1, at < g->count ? at : g->count, g->count, r->loss_sum / r->seen);
                g->last_draw = train_now();
            }
        }
        step++;
        step_loss = step_hits = 0, step_n = 0;
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
            r->eval_correct += train_read1(&r->ev, p->correct);
            if (g->pred_logits)   /* mgc predict: every example's logits, in the data's order */
                memcpy(g->pred_logits + (at + first) * p->classes, rt_exec_fetch(&r->ev, p->logits, n),
                       sizeof(float) * (size_t)(n * p->classes));
        }
        at += B;
        have = more, b = nb, first = nfirst, n = nn;
    }
}

/* Test accuracy over every replica of every rank (NaN without test examples). */
double train_evaluate(Group *g, const Dataset *test, int *order)
{
    if (test->n == 0) return NAN;
    train_from_replica0(g, STORE_RUNNING, false);
    for (int i = 0; i < test->n; i++) order[i] = i;
    g->data = test;
    g->augment = false;
    g->order = order;
    g->count = test->n;
    train_on_every_replica(g, eval_on_replica);
    double correct = 0;
    for (int k = 0; k < g->n; k++) correct += g->r[k].eval_correct;
    rt_world_sum_f64(g->world, &correct, 1);
    return correct / test->n;
}

/* ------------------------------------------------------------ the report */

void train_device_list(const Group *g, char *buf, size_t size)
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

/* What one epoch did, over every replica of every rank. */
typedef struct EpochResult {
    double loss, correct, seen;   /* sums */
    double t_train, test_acc, secs;
    double val_acc;               /* --val-split's (NaN: none) */
    long steps;
    float lr;                     /* the rate of the epoch's last step */
} EpochResult;

/* The epoch's line, the communication report and rank 0's --log entry. */
static void report_epoch(Group *g, int epoch, const EpochResult *e, const CommReport *cr, FILE **log, bool *log_failed)
{
    const TrainConfig *cfg = g->cfg;
    char num[32], devs[256], accs[32], lrs[32] = "";
    train_device_list(g, devs, sizeof devs);
    double seen = e->seen > 0 ? e->seen : 1, eps = e->seen / e->t_train;
    if (isnan(e->test_acc)) snprintf(accs, sizeof accs, "-");
    else snprintf(accs, sizeof accs, "%.3f", e->test_acc);
    if (cfg->lr_schedule != LR_CONSTANT || cfg->warmup) snprintf(lrs, sizeof lrs, "  lr %.4g", (double)e->lr);
    char vals[48] = "";
    if (!isnan(e->val_acc)) snprintf(vals, sizeof vals, "  val acc %.3f%s", e->val_acc, g->best_epoch == epoch ? " (best)" : "");
    printf("epoch %d/%d  loss %.3f  train acc %.3f%s  test acc %s%s  %s examples/s  %.1f s  on %s\n",
           epoch, cfg->epochs, e->loss / seen, e->correct / seen, vals, accs, lrs, rt_commas((long)eps, num), e->secs, devs);
    if (cr->dev) {
        printf("  communication per step: %.2f MB sent by the busiest replica (the ring's bound %.2f MB)",
               cr->bytes_per_step / 1e6, cr->bound_per_step / 1e6);
        if (cr->mpi_bytes_per_step > 0) printf(", %.2f MB summed with the other ranks by MPI", cr->mpi_bytes_per_step / 1e6);
        printf("; waiting %.1f%% of the step, computing %.1f%%\n", 100 * cr->wait_s / e->t_train, 100 * cr->compute_s / e->t_train);
        if (cfg->verbose)
            for (int r = 0; r < g->total; r++) {
                const double *d = cr->dev + (size_t)r * CR_FIELDS;
                char name[48];
                printf("    %-14s sent %.3f MB a step (bound %.3f MB), waited %.2f s, computed %.2f s\n",
                       device_name(g, r, name, sizeof name), d[CR_SENT] / 1e6, d[CR_BOUND] / 1e6, d[CR_WAIT], d[CR_COMPUTE]);
            }
    }
    fflush(stdout);
    if (g->tb) {   /* the epoch's scalars on the epochs' axis */
        tb_scalar(g->tb, "epoch/loss", e->loss / seen, epoch);
        tb_scalar(g->tb, "epoch/train_acc", e->correct / seen, epoch);
        if (!isnan(e->test_acc)) tb_scalar(g->tb, "epoch/test_acc", e->test_acc, epoch);
        if (!isnan(e->val_acc)) tb_scalar(g->tb, "epoch/val_acc", e->val_acc, epoch);
        tb_scalar(g->tb, "epoch/examples_per_s", eps, epoch);
        tb_scalar(g->tb, "epoch/lr", e->lr, epoch);
        const Store *st = &g->r[0].store;   /* downloaded by the epoch's check (train_epochs) */
        for (int k = 0; k < st->n; k++)
            if (st->e[k].trainable) {
                char tag[300];
                snprintf(tag, sizeof tag, "params/%s", st->e[k].name);
                tb_histogram(g->tb, tag, st->e[k].data, st->e[k].numel, epoch);
            }
    }
    FILE *f = *log;
    if (!f) return;
    errno = 0;
    fprintf(f, "{\"epoch\": %d, \"loss\": %.6f, \"train_acc\": %.6f, \"test_acc\": ", epoch, e->loss / seen, e->correct / seen);
    if (isnan(e->test_acc)) fprintf(f, "null");
    else fprintf(f, "%.6f", e->test_acc);
    if (!isnan(e->val_acc)) fprintf(f, ", \"val_acc\": %.6f", e->val_acc);
    fprintf(f, ", \"lr\": %.9g, \"examples_per_s\": %.1f, \"seconds\": %.3f, \"train_seconds\": %.3f, \"replicas\": %d",
            (double)e->lr, eps, e->secs, e->t_train, g->total);
    fprintf(f, ", \"precision\": \"%s\"", g->cfg->bf16 ? "bf16" : "fp32");
    size_t peak = rt_peak_resident();
    if (peak) fprintf(f, ", \"peak_resident_mb\": %.1f", (double)peak / (1 << 20));
    if (cr->dev) {
        fprintf(f, ", \"comm\": {\"steps\": %ld, \"bytes_per_step\": %.0f, \"ring_bound_per_step\": %.0f, "
                   "\"mpi_bytes_per_step\": %.0f, \"wait_seconds\": %.3f, \"compute_seconds\": %.3f, \"devices\": [",
                e->steps, cr->bytes_per_step, cr->bound_per_step, cr->mpi_bytes_per_step, cr->wait_s, cr->compute_s);
        for (int r = 0; r < g->total; r++) {
            const double *d = cr->dev + (size_t)r * CR_FIELDS;
            char name[48];
            fprintf(f, "%s{\"device\": \"%s\", \"bytes_per_step\": %.0f, \"ring_bound_per_step\": %.0f, "
                       "\"mpi_bytes_per_step\": %.0f, \"wait_seconds\": %.3f, \"compute_seconds\": %.3f}",
                    r ? ", " : "", device_name(g, r, name, sizeof name), d[CR_SENT], d[CR_BOUND], d[CR_MPI], d[CR_WAIT],
                    d[CR_COMPUTE]);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "}\n");
    if (fflush(f) || ferror(f)) {   /* a full disk: said now, and the run stops after this epoch with status 1 (train_epochs) */
        fprintf(stderr, "mgc: cannot write --log %s: %s\n", cfg->log, strerror(errno ? errno : EIO));
        fclose(f);
        *log = NULL;
        *log_failed = true;
    }
}

/* --save-best's file: FILE.safetensors as FILE.best.safetensors (else FILE.best) */
static const char *best_path(const char *save, char *buf, size_t size)
{
    size_t n = strlen(save), ext = strlen(".safetensors");
    if (n > ext && !strcmp(save + n - ext, ".safetensors")) snprintf(buf, size, "%.*s.best.safetensors", (int)(n - ext), save);
    else snprintf(buf, size, "%s.best", save);
    return buf;
}

/* After epoch's validation: the best so far (saved where --save-best), and whether --early-stop
   stops the run here (said). The same on every rank: the accuracy is the sum over them all. */
static int after_validation(Group *g, int epoch, const EpochResult *e, bool downloaded, bool *stop)
{
    const TrainConfig *cfg = g->cfg;
    *stop = false;
    if (isnan(e->val_acc)) return 0;
    if (g->best_epoch == 0 || e->val_acc > g->best_val) {
        g->best_val = e->val_acc, g->best_epoch = epoch;
        char path[4096];
        if (cfg->save_best && train_save(g, best_path(cfg->save, path, sizeof path), epoch, downloaded)) return 1;
    } else if (cfg->early_stop && epoch - g->best_epoch >= cfg->early_stop) {
        *stop = true;
    }
    return 0;
}

static void say_early_stop(const Group *g, int epoch)
{
    const TrainConfig *cfg = g->cfg;
    char best[4200] = "", path[4096];
    if (cfg->save_best) snprintf(best, sizeof best, "; its parameters are in %s", best_path(cfg->save, path, sizeof path));
    if (g->world->rank == 0)
        printf("mgc: stopped early after epoch %d of %d: the validation accuracy has not improved for %d epoch%s (best %.4f after "
               "epoch %d%s)\n", epoch, cfg->epochs, epoch - g->best_epoch, epoch - g->best_epoch == 1 ? "" : "s", g->best_val,
               g->best_epoch, best);
}

/* Trains one epoch on every replica; the sums over every rank in *e. */
static void train_one_epoch(Group *g, const Dataset *train, int *order, int epoch, EpochResult *e)
{
    const TrainConfig *cfg = g->cfg;
    double t0 = train_now();
    data_epoch_order(train->n, cfg->seed, epoch, order);
    g->data = train;
    g->augment = true;
    g->order = order;
    g->count = train->n;
    if (g->comm) rt_comm_reset_stats(g->comm);
    long steps0 = (long)g->r[0].tr.updates;   /* steps: updates (--accumulate: not its batches) */
    g->epoch = epoch;
    float lr = train_lr(cfg, epoch, 0, g->steps_per_epoch);
    for (int k = 0; k < g->n; k++) rt_exec_set_lr(&g->r[k].tr, lr);
    g->t0 = t0;
    train_on_every_replica(g, epoch_on_replica);
    double sums[3] = { 0, 0, 0 };
    for (int k = 0; k < g->n; k++) {
        sums[0] += g->r[k].loss_sum;
        sums[1] += g->r[k].correct;
        sums[2] += (double)g->r[k].seen;
    }
    rt_world_sum_f64(g->world, sums, 3);
    *e = (EpochResult){ .loss = sums[0], .correct = sums[1], .seen = sums[2], .t_train = train_now() - t0, .lr = lr,
                        .steps = (long)g->r[0].tr.updates - steps0 };
    if (train_lr_per_step(cfg) && e->steps > 0) e->lr = train_lr(cfg, epoch, e->steps - 1, g->steps_per_epoch);   /* the last step's */
}

/* A diverged loss, said once (where --check-nan has not named the layer). */
static void say_diverged(Group *g, int epoch, const EpochResult *e)
{
    bool named = false;
    for (int k = 0; k < g->n; k++) named |= g->r[k].tr.check_nan && g->r[k].tr.nan_step >= 0;
    if (g->world->rank == 0 && !named)
        fprintf(stderr, "\nmgc: the loss became %g in epoch %d: training diverged; try a smaller --lr%s\n",
                e->loss / (e->seen > 0 ? e->seen : 1), epoch,
                g->cfg->check_nan ? "" : " (--check-nan names the first layer whose output is not finite)");
    report_nan(g);
}

/* A stop signal ended the run in epoch `epoch` (during it, or after it where
   `after`): which signal, from whichever rank got it, said by rank 0; the status. */
static int say_stopped(Group *g, int epoch, int first_epoch, bool after)
{
    const TrainConfig *cfg = g->cfg;
    int sig = train_stop_point(g->world, 0) - 128;
    if (sig > 0 && g->world->rank == 0) {
        const char *name = train_signal_name(sig);
        if (after)
            fprintf(stderr, "\nmgc: interrupted by %s after epoch %d%s%s%s\n", name, epoch,
                    cfg->save ? "; the checkpoint holds it: " : "", cfg->save ? cfg->save : "", cfg->save ? " (--resume it to go on)" : "");
        else if (cfg->save && (epoch > first_epoch || cfg->resume))
            fprintf(stderr, "\nmgc: interrupted by %s during epoch %d; the checkpoint holds the last finished epoch: %s "
                    "(--resume it to go on)\n", name, epoch, cfg->save);
        else
            fprintf(stderr, "\nmgc: interrupted by %s during epoch %d%s\n", name, epoch,
                    cfg->save ? "; no epoch had finished: nothing was saved" : "");
    }
    return sig > 0 ? 128 + sig : 130;
}

/* After the epoch's steps, before its evaluation and its checkpoint: replica
   0's tensors hold what they must (train_check_tensors). A run whose loss
   stays finite while its parameters do not (ReLU and max-pooling make numbers
   of NaN) stops here, the checkpoint on disk the last epoch's. 0, or 1 said. */
static int check_epoch(Group *g, int epoch, int first_epoch, bool *downloaded)
{
    const TrainConfig *cfg = g->cfg;
    StoreCheck c;
    char what[512];
    double t0 = train_now();
    int rc = train_check_tensors(g, &c, what, sizeof what, downloaded);
    if (cfg->verbose && g->world->rank == 0)
        fprintf(stderr, "mgc: epoch %d's parameters and state checked in %.1f ms%s\n", epoch, 1e3 * (train_now() - t0),
                *downloaded ? "" : ", on the device");
    if (!rc) return 0;
    if (g->world->rank != 0) return 1;
    char kept[1200] = "";
    if (cfg->save && (epoch > first_epoch || cfg->resume))
        snprintf(kept, sizeof kept, "; %s keeps epoch %d, whose tensors were finite", cfg->save, epoch - 1);
    else if (cfg->save)
        snprintf(kept, sizeof kept, "; nothing was saved");
    if (c.nonfinite)
        fprintf(stderr, "mgc: after epoch %d, %s: training diverged, though the loss stayed finite (ReLU and max-pooling "
                "make numbers of NaN)%s; try a smaller --lr (--check-nan names the first layer whose output is not finite)\n",
                epoch, what, kept);
    else   /* no step makes a variance negative from one that is not (the load checks those) */
        fprintf(stderr, "mgc: after epoch %d, %s: mgc's own error (no training step makes one); please report it%s\n", epoch,
                what, kept);
    return 1;
}

int train_epochs(Group *g, const Dataset *train, const Dataset *test, int *order, int first_epoch, FILE **log,
                 bool *log_failed)
{
    const TrainConfig *cfg = g->cfg;
    g->first_epoch = first_epoch;
    g->best_epoch = 0;
    g->run_t0 = g->log_t0 = g->last_draw = train_now();
    g->log = *log;
    for (int epoch = first_epoch; epoch <= cfg->epochs; epoch++) {
        EpochResult e;
        train_one_epoch(g, train, order, epoch, &e);
        Replica *r0 = &g->r[0];
        if (r0->stop && r0->stop_reason == 2) {
            say_diverged(g, epoch, &e);
            return 1;
        }
        if (r0->stop) return say_stopped(g, epoch, first_epoch, false);   /* every replica stopped at this step */
        if (cfg->progress && g->world->rank == 0) fprintf(stderr, "\r%*s\r", 100, "");
        bool downloaded;
        if (check_epoch(g, epoch, first_epoch, &downloaded)) return 1;
        if (g->tb && !downloaded) rt_store_download(&g->r[0].store, STORE_ALL), downloaded = true;   /* the histograms' */
        e.test_acc = train_evaluate(g, test, order);
        e.val_acc = g->val ? train_evaluate(g, g->val, order) : NAN;
        e.secs = train_now() - g->t0;
        bool early = false;
        if (after_validation(g, epoch, &e, downloaded, &early)) return 1;
        CommReport cr = comm_report(g, e.steps);
        if (g->world->rank == 0) report_epoch(g, epoch, &e, &cr, log, log_failed);
        g->log = *log;   /* closed there where it could not be written: no step records after */
        free(cr.dev);
        if (cfg->save && train_save(g, cfg->save, epoch, downloaded)) return 1;
        if (early) say_early_stop(g, epoch);
        if (epoch == cfg->epochs || early) break;
        /* rank 0's --log could not be written (a full disk), on every rank; or a
           stop asked during the evaluation or the save: stop here */
        int stop = train_stop_point(g->world, *log_failed ? 1 : 0);
        if (stop == 1 && g->world->rank == 0)
            fprintf(stderr, "mgc: stopped after epoch %d of %d: its --log entry could not be written%s%s%s\n", epoch,
                    cfg->epochs, cfg->save ? "; the checkpoint holds it: " : "", cfg->save ? cfg->save : "",
                    cfg->save ? " (--resume it to go on)" : "");
        if (stop == 1) return 1;
        if (stop) return say_stopped(g, epoch, first_epoch, true);
    }
    return 0;
}
