/*
** The executor: one Program bound to one device's memory, run step by step.
**
** Persistent buffers are the Store's tensors; activations, scratch and inputs
** get the slots of the program's memory plan (codegen/plan.c), allocated on
** the device.
** A run walks the step list: kernels and GEMMs go to the device; an
** allreduce step hands a buffer to the data-parallel group and goes on (the
** sum overlaps the steps after it), a wait step blocks until that sum is
** done. Alone (no group), a collective is the identity.
**
** On a device with memory of its own (a GPU, or a CPU device told to act like
** one), the buffers the host fills or reads have a host staging copy
** (Exec.host): a run uploads the input, labels, control votes and SGD scalars
** first and brings back the loss, the correct count and the votes last;
** anything else (logits, gradients) comes back on request (rt_exec_fetch). A
** device that records runs (CUDA graphs) records the steps once per batch
** shape and replays them after: what changes from run to run is in memory
** (the learning rate too), except a seeded step's seed, so a program with
** one (dropout) is not recorded.
*/
#include "runtime.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int rt_exec_init(Exec *x, const Program *p, Device *dev, Store *store, long max_batch, const Exec *share,
                 const RtOptions *opt, char *err, size_t err_size)
{
    memset(x, 0, sizeof *x);
    x->prog = p;
    x->dev = dev;
    x->max_batch = max_batch;
    x->ptr = calloc((size_t)p->nbufs, sizeof(float *));
    x->owned = calloc((size_t)p->nbufs + 1, sizeof(void *));
    x->fn = calloc((size_t)p->nsteps + 1, sizeof(KernelFn));
    x->host = calloc((size_t)p->nbufs, sizeof(float *));
    x->host_alt = calloc((size_t)p->nbufs, sizeof(float *));
    x->host_owned = calloc(2 * (size_t)p->nbufs + 1, sizeof(void *));
    /* the persistent buffers in the order of their IR nodes, whatever order lowering made them in
       (a kernel may make a parameter's buffer before its node's turn): the store's order, and so
       the initial values its one random stream gives each tensor (rt_store_init), are the net's */
    int *order = malloc(sizeof(int) * ((size_t)p->nbufs + 1)), np = 0;
    if (!order) {
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    for (int b = 0; b < p->nbufs; b++) {
        if (p->bufs[b].kind != BUF_PERSISTENT) continue;
        int j = np++;
        for (; j > 0 && p->bufs[order[j - 1]].node > p->bufs[b].node; j--) order[j] = order[j - 1];
        order[j] = b;
    }
    for (int i = 0; i < np; i++) {
        int b = order[i];
        const Buf *buf = &p->bufs[b];
        int k = rt_store_add(store, buf);
        if (k < 0) {
            snprintf(err, err_size, "internal: '%s' has two shapes", buf->name);
            free(order);
            return -1;
        }
        x->ptr[b] = rt_store_bind(store, k, dev);
        if (!x->ptr[b]) {
            snprintf(err, err_size, "out of memory on %s for the parameter '%s' (%ld floats)", dev->name, buf->name, store->e[k].numel);
            free(order);
            return -1;
        }
    }
    free(order);
    if (p->plan_batch < max_batch) {
        snprintf(err, err_size, "internal: the program's memory plan holds %ld examples, not %ld", p->plan_batch, max_batch);
        return -1;
    }
    /* every slot in one region, 64-byte aligned; another program's region when
       it is large enough (share: programs that never run at the same time) */
    size_t *at = calloc((size_t)p->nslots + 1, sizeof(size_t)), need = 0;
    for (int t = 0; t < p->nslots; t++) {
        at[t] = need;
        need += (p->slot_bytes[t] + 63) / 64 * 64;
    }
    if (share && share->dev == dev && share->region && share->region_bytes >= need) {
        x->region = share->region;
        x->region_bytes = share->region_bytes;
    } else if (need > 0) {
        x->region = dev->ops->alloc(dev, need);
        x->region_bytes = need;
        if (!x->region) {
            snprintf(err, err_size, "out of memory on %s: %.1f MiB of activations at batch %ld (try a smaller --batch-size)",
                     dev->name, need / 1048576.0, max_batch);
            free(at);
            return -1;
        }
        x->owned[x->nowned++] = x->region;
    }
    for (int b = 0; b < p->nbufs; b++)
        if (p->slot[b] >= 0) x->ptr[b] = (float *)((char *)x->region + at[p->slot[b]]);
    free(at);
    for (int b = 0; b < p->nbufs; b++) {
        if (p->bufs[b].kind != BUF_KEEP) continue;
        /* kept from step to step (the sliced reductions' arrival counters): zero, as every device
           allocates, and outside the region, which a program sharing it (evaluation) overwrites */
        x->ptr[b] = dev->ops->alloc(dev, sizeof(float) * (size_t)cg_dim(p->bufs[b].size, max_batch));
        if (!x->ptr[b]) {
            snprintf(err, err_size, "out of memory on %s for %s", dev->name, p->bufs[b].name);
            return -1;
        }
        x->owned[x->nowned++] = x->ptr[b];
    }
    for (int b = 0; b < p->nbufs; b++)
        if (p->bufs[b].kind == BUF_VIEW) x->ptr[b] = x->ptr[p->bufs[b].alias] + p->bufs[b].offset;
    if (opt && opt->verbose)
        fprintf(stderr, "mgc: memory plan on %s: %d buffers in %d slots, %.1f MiB (%.1f MiB without reuse) at batch %ld%s\n",
                dev->name, p->plan_buffers, p->nslots, p->plan_bytes / 1048576.0, p->plan_naive_bytes / 1048576.0, p->plan_batch,
                share && x->region == share->region ? ", in the memory of the program before it" : "");
    x->activation_bytes = p->plan_bytes;
    /* what the host sees: in place, or staged */
    int seen[9 + CG_MAXARGS], nseen = 0;
    int fixed[] = { p->input, p->labels, p->loss, p->correct, p->logits, p->input_grad, p->control, p->opt_scalars, p->accumulate };
    for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++) seen[nseen++] = fixed[k];
    for (int b = 0; b < p->nbufs; b++) {
        bool wanted = false;
        for (int k = 0; k < nseen; k++) wanted |= seen[k] == b;
        for (int k = 0; k < p->nparams; k++) wanted |= p->params[k].grad == b && dev->host_memory;   /* else staged when fetched */
        if (!wanted || !x->ptr[b]) continue;
        if (dev->host_memory) {
            x->host[b] = x->ptr[b];
            continue;
        }
        size_t bytes = sizeof(float) * (size_t)cg_dim(p->bufs[b].size, max_batch);
        void *h = dev->ops->alloc_host(dev, bytes);
        void *h2 = b == p->input || b == p->labels ? dev->ops->alloc_host(dev, bytes) : NULL;
        if (!h || (!h2 && (b == p->input || b == p->labels))) {
            snprintf(err, err_size, "out of host memory for the staging copy of %s", p->bufs[b].name);
            return -1;
        }
        x->host[b] = x->host_owned[x->nhost_owned++] = h;
        if (h2) x->host_alt[b] = x->host_owned[x->nhost_owned++] = h2;
    }
    for (int k = 0; k < p->nsteps; k++) x->seeded |= p->steps[k].kind == STEP_KERNEL && p->steps[k].seeded;
    if (opt && opt->verbose) {
        char what[256];
        fprintf(stderr, "mgc: %s\n", cg_kernels_str(p, what, sizeof what));
    }
    if (dev->ops->load(dev, p, opt && opt->verbose, &x->module, x->fn, err, err_size)) return -1;
    for (int k = 0; k < p->nsteps; k++) {   /* kernels compiled with another program: that program's, loaded here */
        const Step *s = &p->steps[k];
        if (s->kind != STEP_KERNEL || !s->shared) continue;
        if (!share || share->prog != p->kernels_from || share->dev != dev || s->shared_step < 0 ||
            s->shared_step >= share->prog->nsteps || !share->fn[s->shared_step]) {
            snprintf(err, err_size, "internal: kernel %s runs %s of another program, which is not loaded on %s", s->fn, s->sym,
                     dev->name);
            return -1;
        }
        x->fn[k] = share->fn[s->shared_step];
    }
    x->seed = 0x5eed;
    /* a seeded program (dropout) gets a new seed each run, by value: a graph would be
       recorded again every run, slower than running the steps */
    x->record = !(opt && opt->no_record) && !x->seeded;
    x->lr = p->opt.lr;   /* the net's own until told otherwise */
    return 0;
}

void rt_exec_free(Exec *x)
{
    for (int k = 0; k < x->nowned; k++) x->dev->ops->release(x->dev, x->owned[k]);
    for (int k = 0; k < x->nhost_owned; k++) x->dev->ops->release_host(x->dev, x->host_owned[k]);
    if (x->module) x->dev->ops->unload(x->dev, x->module);
    free(x->owned);
    free(x->host_owned);
    free(x->host);
    free(x->host_alt);
    free(x->ptr);
    free(x->fn);
    free(x->step_seconds);
    memset(x, 0, sizeof *x);
}

void rt_exec_check_nan(Exec *x)
{
    x->check_nan = true;
    x->nan_step = -1;
}

/* The first element of buffer b (n examples) that is not finite, or -1. */
static long first_nonfinite(Exec *x, int b, long n, float *value)
{
    if (b < 0 || !x->ptr[b]) return -1;
    long floats = cg_dim(x->prog->bufs[b].size, n);
    const float *h = x->ptr[b];
    float *copy = NULL;
    if (!x->dev->host_memory) {
        if (!(copy = malloc(sizeof(float) * (size_t)(floats > 0 ? floats : 1)))) return -1;
        x->dev->ops->download(x->dev, copy, x->ptr[b], sizeof(float) * (size_t)floats);
        h = copy;
    }
    x->dev->ops->synchronize(x->dev);
    long at = -1;
    for (long i = 0; i < floats && at < 0; i++)
        if (!isfinite(h[i])) at = i, *value = h[i];
    free(copy);
    return at;
}

static void check_step(Exec *x, int k, long n)
{
    const Step *s = &x->prog->steps[k];
    int outs[CG_MAXARGS + 1], no = 0;
    if (s->kind == STEP_KERNEL)
        for (int j = 0; j < s->nargs; j++)
            if (s->outs >> j & 1) outs[no++] = s->args[j];
    if (s->kind == STEP_GEMM) outs[no++] = s->c;
    if (s->kind == STEP_WAIT) outs[no++] = x->prog->colls[s->coll].dst;
    for (int j = 0; j < no && x->nan_step < 0; j++) {
        float v = 0;
        long at = first_nonfinite(x, outs[j], n, &v);
        if (at >= 0) x->nan_step = k, x->nan_buf = outs[j], x->nan_at = at, x->nan_value = v;
    }
}

void rt_exec_set_lr(Exec *x, double lr) { x->lr = lr; }

void rt_exec_set_accumulate(Exec *x, int mode) { x->accumulate = x->prog->accumulate >= 0 ? mode : 0; }

/* --accumulate: the next run is a micro-batch before its step's last (no collective, no update) */
static bool micro_batch(const Exec *x) { return x->accumulate == 1 || x->accumulate == 2; }

/* The optimizer's scalars of run t (1, 2, ...: AdamW's bias correction), into x->opt; their count. */
static int opt_scalars(Exec *x, unsigned long long t)
{
    const IrOptimizer *o = &x->prog->opt;
    if (o->kind == IR_SGD) {
        x->opt[0] = (float)x->lr, x->opt[1] = o->momentum, x->opt[2] = o->weight_decay;
        return 3;
    }
    /* as PyTorch's AdamW computes them, in double from the Python floats */
    double b1 = o->beta1, b2 = o->beta2, lr = x->lr;
    x->opt[0] = (float)lr, x->opt[1] = (float)b1, x->opt[2] = (float)(1.0 - lr * o->weight_decay), x->opt[3] = (float)b2;
    x->opt[4] = o->eps, x->opt[5] = (float)(lr / (1.0 - pow(b1, (double)t))), x->opt[6] = (float)sqrt(1.0 - pow(b2, (double)t));
    x->opt[7] = 0;
    return 8;
}

void rt_exec_profile(Exec *x)
{
    if (!x->step_seconds) x->step_seconds = calloc((size_t)x->prog->nsteps, sizeof(double));
}

void rt_exec_profile_report(const Exec *x, FILE *out)
{
    const Program *p = x->prog;
    if (!x->step_seconds) return;
    double total = 0;
    for (int k = 0; k < p->nsteps; k++) total += x->step_seconds[k];
    fprintf(out, "profile (%s): %llu runs, %.3f s in steps\n  step  node   share     ms/run  what\n", x->dev->name, x->runs, total);
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        const char *what = s->kind == STEP_KERNEL ? s->fn : s->kind == STEP_GEMM ? "gemm" : cg_coll_name(p->colls[s->coll].kind);
        const char *when = s->kind == STEP_ALLREDUCE ? " (start)" : s->kind == STEP_WAIT ? " (wait)" : "";
        fprintf(out, "  %-5d %%%-5d %5.1f%%  %9.4f  %s%s\n", k, s->node, 100 * x->step_seconds[k] / (total > 0 ? total : 1),
                1e3 * x->step_seconds[k] / (double)(x->runs ? x->runs : 1), what, when);
    }
}

static void run_steps(Exec *x, long n, long global_n, long first)
{
    const Program *p = x->prog;
    Device *dev = x->dev;
    bool micro = micro_batch(x);
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (micro && (s->kind == STEP_ALLREDUCE || s->kind == STEP_WAIT || (s->kind == STEP_KERNEL && s->sgd))) continue;
        double t0 = x->step_seconds ? seconds() : 0;
        switch (s->kind) {
        case STEP_KERNEL: {
            long work = cg_dim(s->work, n);
            if (work <= 0) break;
            KArgs a;
            memset(&a, 0, sizeof a);
            for (int j = 0; j < s->nargs; j++) a.t[j] = s->args[j] >= 0 ? x->ptr[s->args[j]] : NULL;
            a.batch = n;
            a.global_batch = global_n;
            a.first = first;
            a.replica = x->shard;
            /* the same masks on every replica count: seeded by run, step (or the step's key) and the global
               example index */
            a.seed = s->seeded ? x->seed * 0x9E3779B97F4A7C15ULL + (x->runs_before + x->runs) * 0xD1B54A32D192ED03ULL +
                                     (s->seed_key ? s->seed_key : (unsigned long long)k)
                               : 0;
            dev->ops->launch(dev, x->fn[k], &a, s, work);
            break;
        }
        case STEP_GEMM: {
            GemmArgs g = { s->ta, s->tb, (int)cg_dim(s->m, n), (int)cg_dim(s->n, n), (int)cg_dim(s->k, n),
                           (int)cg_dim(s->lda, n), (int)cg_dim(s->ldb, n), (int)cg_dim(s->ldc, n), s->alpha, s->beta,
                           x->ptr[s->a], x->ptr[s->b], x->ptr[s->c], s->batch, cg_dim(s->sa, n), cg_dim(s->sb, n), cg_dim(s->sc, n),
                           s->bf16, s->ab16 };
            dev->ops->gemm(dev, &g);
            break;
        }
        case STEP_ALLREDUCE: {
            const Collective *c = &p->colls[s->coll];
            if (c->src != c->dst) dev->ops->copy(dev, x->ptr[c->dst], x->ptr[c->src], sizeof(float) * (size_t)c->floats);
            if (x->grouped) dev->ops->allreduce_start(dev, x->comm, x->replica, s->coll, c->kind, x->ptr[c->dst], c->floats);
            break;
        }
        case STEP_WAIT:
            if (x->grouped) x->wait_seconds += dev->ops->allreduce_wait(dev, x->comm, x->replica, s->coll);
            break;
        }
        if (x->step_seconds) {
            dev->ops->synchronize(dev);   /* a device that queues work is timed by what it did */
            x->step_seconds[k] += seconds() - t0;
        }
        if (x->check_nan && x->nan_step < 0) check_step(x, k, n);
    }
}

static unsigned long long mix(unsigned long long h, unsigned long long v)
{
    h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    return h;
}

/* host -> device before a run, device -> host after: the buffers the host fills and reads each step */
static void stage(Exec *x, int buf, long floats, bool up)
{
    if (buf < 0 || !x->host[buf] || x->dev->host_memory) return;
    if (up) x->dev->ops->upload(x->dev, x->ptr[buf], x->host[buf], sizeof(float) * (size_t)floats);
    else x->dev->ops->download(x->dev, x->host[buf], x->ptr[buf], sizeof(float) * (size_t)floats);
}

/* The input and labels are uploaded from one of two staging copies: the host
   fills the other (the next batch) while the device computes. */
static void stage_batch(Exec *x, int buf, long floats)
{
    if (buf < 0) return;
    stage(x, buf, floats, true);
    if (x->host_alt[buf]) {
        float *t = x->host[buf];
        x->host[buf] = x->host_alt[buf];
        x->host_alt[buf] = t;
    }
}

void rt_exec_run(Exec *x, long n, long global_n, long first)
{
    rt_exec_start(x, n, global_n, first);
    rt_exec_finish(x);
}

void rt_exec_start(Exec *x, long n, long global_n, long first)
{
    const Program *p = x->prog;
    Device *dev = x->dev;
    x->runs++;
    if (!micro_batch(x)) x->updates++;
    if (p->accumulate >= 0) {
        x->host[p->accumulate][0] = (float)x->accumulate;
        stage(x, p->accumulate, 1, true);
    }
    if (p->input >= 0) stage_batch(x, p->input, cg_dim(p->bufs[p->input].size, n));
    stage_batch(x, p->labels, n);
    stage(x, p->control, 2, true);
    if (p->opt_scalars >= 0) {   /* this run's learning rate etc., read by the update kernels */
        int k = opt_scalars(x, x->opt_steps_before + x->updates);
        memcpy(x->host[p->opt_scalars], x->opt, sizeof(float) * (size_t)k);
        stage(x, p->opt_scalars, k, true);
    }
    bool ran = false;
    if (dev->ops->replay && dev->can_record && x->record && !x->step_seconds && !x->check_nan) {
        unsigned long long shape = mix(mix(mix(mix(0x6d6763, (unsigned long long)(uintptr_t)p), (unsigned long long)n),
                                           (unsigned long long)global_n), (unsigned long long)first);
        shape = mix(shape, (unsigned long long)x->accumulate);   /* a micro-batch's run skips steps: recorded apart */
        ran = dev->ops->replay(dev, shape);
        bool seen = false;
        for (int k = 0; k < x->nseen; k++) seen |= x->seen[k] == shape;
        if (!ran && !seen) {
            /* the first run of a shape runs as it is: the libraries' first calls (kernels
               loaded, connections made) happen outside any recording; recorded from the second */
            x->seen[x->nseen < RT_SEEN_SHAPES ? x->nseen++ : (int)(x->runs % RT_SEEN_SHAPES)] = shape;
        } else if (!ran) {
            dev->ops->record_begin(dev);
            run_steps(x, n, global_n, first);
            int rr = dev->ops->record_end(dev, shape);
            ran = rr >= 0;   /* 0: recorded and ran; 1: never recorded, ran as issued; -1: nothing ran */
            if (rr != 0) x->record = false;   /* this device cannot record this program: run the steps from now on */
        }
    }
    if (!ran) run_steps(x, n, global_n, first);
}

void rt_exec_finish(Exec *x)
{
    const Program *p = x->prog;
    Device *dev = x->dev;
    if (p->loss >= 0) stage(x, p->loss, 1, false);
    if (p->correct >= 0) stage(x, p->correct, 1, false);
    stage(x, p->control, 2, false);
    dev->ops->synchronize(dev);
}

float *rt_exec_host(Exec *x, int buf)
{
    return buf >= 0 ? x->host[buf] : NULL;
}

float *rt_exec_fetch(Exec *x, int buf, long n)
{
    if (buf < 0 || !x->ptr[buf]) return NULL;
    if (!x->host[buf]) {   /* a buffer read only now and then (a gradient, in check mode): staged on first use */
        void *h = x->dev->ops->alloc_host(x->dev, sizeof(float) * (size_t)cg_dim(x->prog->bufs[buf].size, x->max_batch));
        if (!h) return NULL;
        x->host[buf] = x->host_owned[x->nhost_owned++] = h;
    }
    stage(x, buf, cg_dim(x->prog->bufs[buf].size, n), false);
    x->dev->ops->synchronize(x->dev);
    return x->host[buf];
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
