/*
** Training: the job. It makes this process's devices and their group,
** loads the programs onto them (checking first that their memory fits),
** starts the parameters (initialised, loaded or resumed) on replica 0 of
** rank 0 and copies them to every replica, then runs one of: check mode
** (checkmode.c), initialise-and-save, evaluation, or the epochs (epoch.c).
**
** Each replica is a device with its own Store (parameters, running
** statistics, momentum) and its own training and evaluation Exec; replica r
** of this process runs on its own thread. BatchNorm running statistics come
** from replica 0 (as DDP broadcasts its buffers): they are copied to the
** others before every evaluation, checkpoint and dump; training never reads
** them.
**
** The trainer knows devices through the device interface and the registry
** (device.h): no particular kind.
*/
#include "group.h"
#include "checkmode.h"
#include "checkpoint.h"
#include "epoch.h"
#include "predict.h"
#include "pool.h"
#include "bgemm.h"
#include "agree.h"
#include "memlimit.h"
#include "tensorboard.h"
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool input_matches(const Shape *s, int c, int h, int w)
{
    return (s->nd == 4 && s->d[1] == c && s->d[2] == h && s->d[3] == w) ||
           (s->nd == 3 && c == 1 && s->d[1] == h && s->d[2] == w);   /* one channel's [H, W] as [T, F]: the same floats */
}

/* The program's input is [N, c, h, w] (the data's); else says so: -1. */
static int train_check_input(const Program *p, int c, int h, int w, const char *what)
{
    const Shape *s = &p->input_shape;
    if (input_matches(s, c, h, w)) return 0;
    Arena a;
    arena_init(&a);
    fprintf(stderr, "mgc: the net's input %s does not match %s [N,%d,%d,%d]; declare 'input x[N, %d, %d, %d]'",
            ir_shape_str(&a, s), what, c, h, w, c, h, w);
    bool sized = s->nd == 4 && s->d[2] > 0 && s->d[3] > 0;
    if (sized && s->d[1] == c) {
        fprintf(stderr, ", or bring the images to the net's size with --resize %dx%d", s->d[2], s->d[3]);
    } else if (s->nd == 4 && s->d[1] != c) {
        /* the nets here take their input channels as a parameter */
        fprintf(stderr, ", or give the net %d input channel%s with --set in_channels=%d (where it takes that parameter, "
                "as nets/lenet.net and nets/resnet18.net do)", c, c == 1 ? "" : "s", c);
        if (sized && (s->d[2] != h || s->d[3] != w))
            fprintf(stderr, " and bring the images to its size with --resize %dx%d", s->d[2], s->d[3]);
    }
    fputc('\n', stderr);
    arena_free(&a);
    return -1;
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
    size_t t = m->train ? cg_plan_bytes(m->train, shard) : 0, e = cg_plan_bytes(m->eval, shard);
    return t + (e > t ? e - t : 0) + cg_persistent_bytes(train_primary(m));
}

/* Memory that does not fit, said: what is needed (the data set's `data`
   bytes, where they go there, and `sharing` replicas), what there is
   (avail, and what limits it in words), the three largest buffers of the
   training program, and the --batch-size that would fit, or why none does. */
static void refuse_memory(const Group *g, long shard, const char *where, int sharing, const DataSize *data, size_t avail,
                          const char *limit)
{
    const Model *m = g->m;
    const TrainConfig *cfg = g->cfg;
    const Program *p = train_primary(m);
    size_t one = replica_bytes(m, shard), persistent = cg_persistent_bytes(p), need = data->bytes + (size_t)sharing * one;
    char b1[32], b2[32], b3[32], b4[32], num[32];
    fprintf(stderr, "mgc: not enough memory: training %s at batch %d needs %s on %s (", p->net_name, cfg->batch_size,
            bytes_str((double)need, b1, sizeof b1), where);
    if (data->bytes)
        fprintf(stderr, "the data set in %s, %s %s examples, %s%s", cfg->data_dir ? cfg->data_dir : ".",
                rt_commas((long)data->examples, num), data->format, bytes_str((double)data->bytes, b1, sizeof b1),
                sharing ? "; " : "");
    if (sharing)
        fprintf(stderr, "%d device%s x (%s of activations and scratch for %ld examples + %s of parameters and state)", sharing,
                sharing == 1 ? "" : "s", bytes_str((double)(one - persistent), b2, sizeof b2), shard,
                bytes_str((double)persistent, b3, sizeof b3));
    fprintf(stderr, "), but %s is available%s%s\n", bytes_str((double)avail, b4, sizeof b4), limit[0] ? " " : "", limit);
    if (sharing) {   /* the three largest buffers of the training program */
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
    }
    /* the largest shard that fits in nine tenths of what is there, beside the data set */
    double room = 0.9 * (double)avail - (double)data->bytes;
    long lo = 0, hi = sharing ? shard : 0;
    while (lo < hi) {
        long mid = (lo + hi + 1) / 2;
        if ((double)sharing * (double)replica_bytes(m, mid) <= room) lo = mid;
        else hi = mid - 1;
    }
    if (data->bytes && (!sharing || room <= (double)sharing * (double)replica_bytes(m, 1)))
        fprintf(stderr, "mgc: the data set alone takes %s of the %s: %s, or train on a smaller data set%s\n",
                bytes_str((double)data->bytes, b1, sizeof b1), bytes_str((double)avail, b2, sizeof b2),
                limit[0] ? "run where this process may use more memory (the cgroup's limit: docker run --memory, Slurm's "
                           "--mem, systemd's MemoryMax)" : "run on a machine with more memory",
                strcmp(data->format, "safetensors") ? "" : " (images saved as U8 pixels take a quarter of F32 values)");
    else if (lo > 0)
        fprintf(stderr, "mgc: --batch-size %ld would fit (%ld examples per device)%s\n", lo * g->total, lo,
                data->bytes ? " beside the data set" : "");
    else
        fprintf(stderr, "mgc: even one example per device does not fit: make the net smaller, or train on a "
                "device with more memory\n");
}

/* Before the data set is read and anything is allocated or compiled: do the
   data set (data: its bytes, 0 where none is read) and this process's CPU
   replicas fit in the memory this process may take (the tightest of
   MemAvailable and its cgroups' limits)? 0, or 1 said. */
static int check_host_memory(const Group *g, long shard, const DataSize *data)
{
    const TrainConfig *cfg = g->cfg;
    RtMemLimit lim;
    rt_memory_limit(NULL, &lim);
    int sharing = 0;   /* the CPU devices of a process share its memory */
    for (int k = 0; k < g->n; k++) sharing += cfg->devices[k].kind == DEV_CPU;
    size_t need = data->bytes + (size_t)sharing * replica_bytes(g->m, shard);
    if (!lim.available || need <= lim.available) return 0;
    char limit[800] = "", b1[32], b2[32];
    if (lim.limit)
        snprintf(limit, sizeof limit, "to this process (%s: %s, %s in use)", lim.where, bytes_str((double)lim.limit, b1, sizeof b1),
                 bytes_str((double)lim.used, b2, sizeof b2));
    else
        snprintf(limit, sizeof limit, "(%s)", lim.where);
    refuse_memory(g, shard, "this machine", sharing, data, lim.available, limit);
    return 1;
}

/* Once the devices are made, before anything is allocated on them: does
   every GPU replica's memory fit there? (A process's CPU devices share its
   memory with the data set: check_host_memory.) When not, says which
   buffers are largest and which batch would fit, and returns -1. */
static int check_memory(const Group *g, long shard)
{
    const TrainConfig *cfg = g->cfg;
    for (int k = 0; k < g->n; k++) {
        Device *d = g->r[k].dev;
        if (d->kind == DEV_CPU) continue;
        int sharing = 0;   /* replicas on d's GPU; checked at the first of them */
        bool first = true;
        for (int j = 0; j < g->n; j++) {
            bool same = cfg->devices[j].kind == DEV_CUDA && cfg->devices[j].index == cfg->devices[k].index;
            if (same && j < k) first = false;
            sharing += same;
        }
        size_t avail = d->ops->memory_free ? d->ops->memory_free(d) : 0;
        size_t need = (size_t)sharing * replica_bytes(g->m, shard);
        if (!first || !avail || need <= avail) continue;
        refuse_memory(g, shard, d->name, sharing, &(DataSize){ 0 }, avail, "");
        return -1;
    }
    return 0;
}

/* The data set, read (and decompressed) by a thread of its own while the
   kernels load and the parameters are initialised. */
typedef struct DataLoad {
    const char *dir;
    bool file;       /* dir is one FILE.safetensors (mgc predict, evaluate): into test */
    int hint[3];     /* with file: the net's C, H, W (data_load_file) */
    Dataset train, test;
    DataInfo info;   /* what was read */
    int rc;
    char err[2048];
    pthread_t thread;
    bool started;
} DataLoad;

static void *load_data(void *arg)
{
    DataLoad *d = arg;
    d->rc = d->file ? data_load_file(d->dir, d->hint[0] ? d->hint : NULL, &d->test, &d->info, d->err, sizeof d->err)
                    : data_load(d->dir, &d->train, &d->test, &d->info, d->err, sizeof d->err);
    return NULL;
}

static void data_start(DataLoad *d, const char *dir, bool file)
{
    d->dir = dir;
    d->file = file;
    d->started = pthread_create(&d->thread, NULL, load_data, d) == 0;
    if (!d->started) load_data(d);
}

static int data_wait(DataLoad *d)
{
    if (d->started) pthread_join(d->thread, NULL);
    d->started = false;
    return d->rc;
}

/* ---------------------------------------------------------------- the job */

/* The cores of this process for its CPU devices (--threads, at most the cores). */
static int cpu_threads(const TrainConfig *cfg)
{
    int threads = cfg->threads > 0 ? cfg->threads : rt_cores();
    if (cfg->devices[0].kind == DEV_CPU && threads > rt_cores()) {
        if (cfg->world->rank == 0)
            fprintf(stderr, "mgc: warning: --threads %d is more than the %d core%s this process may use; using %d "
                    "(threads beyond the cores wait for each other at every barrier and run far slower)\n",
                    threads, rt_cores(), rt_cores() == 1 ? "" : "s", rt_cores());
        threads = rt_cores();
    }
    return threads;
}

/* --shard-update with replicas whose devices compute in the host's memory: they share each bucket's
   parameter block (one copy in the process, not one a replica), each updating its own chunk of it in
   place; the all-gathers then copy nothing and only synchronise (runtime/comm.c). Only where the
   program's schedule ends every read of a bucket's parameters before any replica may update them
   (Program.packs_shareable). */
static bool shares_parameters(const Group *g)
{
    const Program *p = g->m->train;
    if (!p || p->npacks == 0 || !p->packs_shareable || g->n < 2 || g->cfg->unshared_params) return false;
    for (int k = 0; k < g->n; k++)
        if (!g->r[k].dev->host_memory) return false;
    return true;
}

/* This process's devices, their data-parallel group, and the training and
   evaluation programs loaded on each (after the memory check). 0, or 1 said. */
static int open_group(Group *g)
{
    const TrainConfig *cfg = g->cfg;
    const Model *m = g->m;
    char err[1024];
    g->threads = cpu_threads(cfg);
    for (int k = 0; k < g->n; k++) {
        Replica *r = &g->r[k];
        r->index = k;
        r->global = g->world->rank * g->n + k;
        int t = g->threads / g->n + (k < g->threads % g->n);
        DeviceOptions o = { .threads = t > 0 ? t : 1, .own_memory = cfg->cpu_own_memory, .tf32 = cfg->tf32,
                            .verbose = cfg->verbose && g->world->rank == 0 && k == 0 };
        if (!(r->dev = rt_device_new(cfg->devices[k], &o, err, sizeof err))) {
            fprintf(stderr, "mgc: %s\n", err);
            return 1;
        }
    }
    if (g->total > 1 && m->train) {   /* evaluation alone sums nothing on the devices */
        Device *devs[TRAIN_MAX_DEVICES];
        for (int k = 0; k < g->n; k++) devs[k] = g->r[k].dev;
        int rc = rt_device_group(devs, g->n, g->world, m->train->ncolls, &g->comm, err, sizeof err);
        if (rc) {
            fprintf(stderr, "mgc: %s\n", err);
            return 1;
        }
        static const CommKind kinds[] = { [COLL_ALLREDUCE] = COMM_ALLREDUCE, [COLL_REDUCE_SCATTER] = COMM_REDUCE_SCATTER,
                                          [COLL_ALLGATHER] = COMM_ALLGATHER };
        for (int k = 0; g->comm && k < m->train->ncolls; k++) rt_comm_set_kind(g->comm, k, kinds[m->train->colls[k].kind]);
    }
    long shard = (cfg->batch_size + g->total - 1) / g->total;   /* the most examples a replica gets */
    if (check_memory(g, shard)) return 1;
    RtOptions opt = { .verbose = cfg->verbose && g->world->rank == 0, .no_record = cfg->no_graphs };
    bool share = shares_parameters(g);
    for (int k = 0; k < g->n; k++) {
        Replica *r = &g->r[k];
        if (share && k > 0) r->store.share = &g->r[0].store;
        /* an Exec that failed half-way still holds memory: freed with the others */
        r->have_tr = m->train != NULL;
        int rc = m->train ? rt_exec_init(&r->tr, m->train, r->dev, &r->store, shard, NULL, &opt, err, sizeof err) : 0;
        if (!rc) {
            r->have_ev = true;
            rc = rt_exec_init(&r->ev, m->eval, r->dev, &r->store, shard, m->train ? &r->tr : NULL, &opt, err, sizeof err);
        }
        if (rc) {
            fprintf(stderr, "mgc: %s\n", err);
            return 1;
        }
        r->ev.seed = cfg->seed;
        if (!m->train) continue;
        r->tr.comm = g->comm;
        r->tr.grouped = g->total > 1;
        r->tr.replica = k;
        r->tr.shard = rt_comm_owner(k, g->world->rank, g->world->size);
        rt_exec_set_lr(&r->tr, cfg->lr);
        if (cfg->check_nan) rt_exec_check_nan(&r->tr);
        if (cfg->profile && k == 0 && g->world->rank == 0) rt_exec_profile(&r->tr);
        r->tr.seed = cfg->seed;
        opt.verbose = false;   /* once is enough */
    }
    return 0;
}

/* The parameters on every replica: initialised, or --load'ed or --resume'd on
   replica 0 of rank 0 and copied. 0 (*first_epoch the first to train), or 1. */
static int start_parameters(Group *g, int *first_epoch)
{
    const TrainConfig *cfg = g->cfg;
    rt_store_init(&g->r[0].store, cfg->seed);
    Resume resume = { 0 };
    int rc = cfg->load && g->world->rank == 0 && train_load_checkpoint(&g->r[0].store, cfg->load, train_primary(g->m)->net_name,
                                                                            cfg->resume ? &resume : NULL, cfg);
    if (rt_world_max_status(g->world, rc ? 1 : 0)) return 1;
    /* --shard-update: the optimizer state, whole in the file, into each replica's slice (every rank) */
    if (cfg->load && g->m->train && rt_world_max_status(g->world, train_load_shards(g, cfg->load, cfg->resume ? &resume : NULL) ? 1 : 0))
        return 1;
    *first_epoch = 1;
    if (cfg->resume) {
        rt_world_bcast(g->world, &resume, sizeof resume);
        *first_epoch = train_resume_from(g, &resume);
    }
    train_from_replica0(g, STORE_ALL, true);   /* every replica starts from replica 0's parameters */
    return 0;
}

/* --epochs 0: the initial (or loaded) parameters, saved with --save. */
static int initialise_only(Group *g)
{
    const TrainConfig *cfg = g->cfg;
    const Program *tp = g->m->train;
    char num[32];
    int status = cfg->save && train_save(g, cfg->save, 0, false) ? 1 : 0;
    if (!status && g->world->rank == 0) {
        printf("%s: %s parameters in %d tensors ", tp->net_name, rt_commas(tp->param_scalars, num), tp->param_tensors);
        if (cfg->load) printf("loaded from %s", cfg->load);
        else printf("initialised (seed %llu)", cfg->seed);
        printf("%s%s\n", cfg->save ? ", saved to " : "", cfg->save ? cfg->save : "");
    }
    return status;
}

/* The data in words for the run's first line: "CIFAR-10, 3x32x32",
   "IDX, 1x28x28, 10 classes" (the classes where the labels tell them). */
static void data_str(const DataInfo *info, char *out, size_t size)
{
    int p = snprintf(out, size, "%s, %dx%dx%d%s", info->format, info->channels, info->rows, info->cols,
                     info->floats ? " floats" : "");
    if (strncmp(info->format, "CIFAR", 5) && p < (int)size)
        snprintf(out + p, size - (size_t)p, ", %d classes", info->classes);
}

/* The run's first line on rank 0: the net, the devices, the data. */
static void say_run(const Group *g, const Dataset *train, const Dataset *test, const DataInfo *info)
{
    const TrainConfig *cfg = g->cfg;
    const Program *tp = train_primary(g->m);
    char num[32], num2[32], num3[32], devs[256], data[96];
    train_device_list(g, devs, sizeof devs);
    data_str(info, data, sizeof data);
    printf("mgc: %s, %s parameters in %d tensors, on %s", tp->net_name, rt_commas(tp->param_scalars, num), tp->param_tensors, devs);
    if (g->world->size > 1) printf(" x %d ranks", g->world->size);
    bool cpu = g->r[0].dev->kind == DEV_CPU;
    if (!cpu) printf(" (%s)", g->r[0].dev->model);
    else printf(" with %d thread%s%s", g->r[0].dev->threads, g->r[0].dev->threads == 1 ? "" : "s", g->n > 1 ? " each" : "");
    if (cfg->evaluate) printf("; %s test examples (%s), batch %d\n", rt_commas(test->n, num3), data, cfg->batch_size);
    else if (g->val) {
        char num4[32];
        printf("; %s training (%s held out for validation, --val-split %g) and %s test examples (%s), batch %d%s\n",
               rt_commas(train->n, num2), rt_commas(g->val->n, num4), cfg->val_split, rt_commas(test->n, num3), data,
               cfg->batch_size, cfg->sync_bn ? ", BatchNorm synchronised" : "");
    } else printf("; %s training and %s test examples (%s), batch %d%s\n", rt_commas(train->n, num2),
                rt_commas(test->n, num3), data, cfg->batch_size, cfg->sync_bn ? ", BatchNorm synchronised" : "");
    if (cfg->accumulate > 1 && !cfg->evaluate)
        printf("mgc: --accumulate %d: each step sums the gradients of %d batches of %d, one update for %ld examples\n",
               cfg->accumulate, cfg->accumulate, cfg->batch_size, (long)cfg->accumulate * cfg->batch_size);
    if (cfg->bf16)   /* says once how bf16 runs here */
        printf("mgc: precision bf16: convolutions and linear layers multiply bf16 operands, sum in fp32 (%s)\n",
               !cpu ? "cuBLAS, the tensor cores" : mgc_bf16_native() ? "AVX512_BF16 on this CPU"
               : "this CPU has no AVX512_BF16: bf16 rounding in fp32 arithmetic, as slow as fp32 or slower");
    if (cpu && g->threads < g->n)
        printf("mgc: %d devices on %d thread%s: they share the cores (the numbers are the same, the speed is not)\n",
               g->n, g->threads, g->threads == 1 ? "" : "s");
    if (transform_active(&g->transform)) {
        char tf[256];
        int c, h, w;
        transform_str(&g->transform, tf, sizeof tf);
        transform_shape(&g->transform, train->n ? train : test, &c, &h, &w);   /* mgc predict's one file: test alone */
        printf("mgc: images %dx%dx%d; %s", c, h, w, tf);
        for (int k = 0; g->transform.normalize && k < c; k++)
            printf("%s%.4f std %.4f", k ? ", " : " (mean ", (double)g->transform.mean[k], (double)g->transform.std[k]);
        printf("%s%s\n", g->transform.normalize ? ")" : "",
               g->transform.crop_pad || g->transform.flip || g->transform.crop_scale > 0 || g->transform.rotate > 0 ||
                       g->transform.translate > 0 || g->transform.erase > 0
                   ? "; the augmentations drawn per example from the seed, the epoch and its index" : "");
    }
    long last = train->n % cfg->batch_size;
    if (last > 0 && last < g->total)
        printf("mgc: the last %ld example%s of every epoch %s dropped: fewer than the %d replicas\n", last,
               last == 1 ? "" : "s", last == 1 ? "is" : "are", g->total);
    fflush(stdout);
}

/* The net against the data: its input against the images (after --resize)
   and its outputs against the classes (where known). 0, or 1 (said when say). */
static int check_net(const Group *g, const DataInfo *info, bool say)
{
    const Program *tp = train_primary(g->m);
    const Transform *t = &g->cfg->transform;
    int ic, ih, iw;
    transform_shape(t, &(Dataset){ .channels = info->channels, .rows = info->rows, .cols = info->cols }, &ic, &ih, &iw);
    char what[64];
    snprintf(what, sizeof what, "%s images%s", info->format, t->out_h ? " after --resize" : "");
    if (g->cfg->evaluate && g->cfg->load && !input_matches(&tp->input_shape, ic, ih, iw)) {   /* a trained net: the data must fit it */
        if (say) {
            Arena a;
            arena_init(&a);
            fprintf(stderr, "mgc: the net of %s takes images %s, but %s holds %s [N,%d,%d,%d]: give images of the net's "
                    "shape%s\n", g->cfg->load, ir_shape_str(&a, &tp->input_shape), g->cfg->data_dir, what, ic, ih, iw,
                    t->out_h ? " (it resizes them to its size first, as in its training)" : "");
            arena_free(&a);
        }
        return 1;
    }
    if (say ? train_check_input(tp, ic, ih, iw, what) != 0 : !input_matches(&tp->input_shape, ic, ih, iw)) return 1;
    if (info->classes > 0 && tp->classes < info->classes) {
        if (say)
            fprintf(stderr, "mgc: the net has %d outputs but the data (%s) has %d classes (labels 0..%d); use --set classes=%d\n",
                    tp->classes, info->format, info->classes, info->classes - 1, info->classes);
        return 1;
    }
    return 0;
}

/* Under mpirun, every rank read the same data: each file's digest, of all
   that was read of it, compared (the probe before the start compares only
   headers, sizes and the ends of files). 0, or 2 said by rank 0. */
static int agree_data(World *w, const DataInfo *info)
{
    if (w->size <= 1) return 0;
    Agreement *a = calloc(1, sizeof *a);
    rt_agree_add(a, "the data's format", "%s, %d files", info->format, info->nfiles);
    for (int k = 0; k < info->nfiles; k++) {
        char name[64], num[32];
        snprintf(name, sizeof name, "the data's %s", info->files[k].file);
        rt_agree_add(a, name, "%s bytes, CRC-32 %08lx", rt_commas(info->files[k].bytes, num), info->files[k].crc);
    }
    int rc = rt_agree(w, a, 0);
    free(a);
    return rc ? 2 : 0;
}

/* The data (read meanwhile by its thread) and rank 0's --log, on every rank:
   0, 1 (said), 2 (the ranks read different data, said), or 128 + a stop
   signal. */
/* Rank 0's --tensorboard event file, and the run's settings in it as a text summary: 0, or 1 said */
static int open_tensorboard(Group *g)
{
    const TrainConfig *cfg = g->cfg;
    static Tb tb;
    char err[512];
    if (tb_open(&tb, cfg->tensorboard, err, sizeof err)) {
        fprintf(stderr, "mgc: %s\n", err);
        return 1;
    }
    g->tb = &tb;
    char text[2048], aug[256];
    transform_str(&cfg->transform, aug, sizeof aug);
    if (!aug[0]) snprintf(aug, sizeof aug, "none");
    snprintf(text, sizeof text,
             "| setting | value |\n|---|---|\n| net | %s |\n| epochs | %d |\n| batch size | %d |\n| optimizer | %s |\n| lr | %g |\n"
             "| lr schedule | %s |\n| warmup steps | %d |\n| momentum | %g |\n| weight decay | %g |\n| seed | %llu |\n"
             "| transform | %s |\n| normalize | %s |\n| precision | %s |\n| val split | %g |\n| replicas | %d |\n",
             train_primary(g->m)->net_name, cfg->epochs, cfg->batch_size, cfg->optimizer == IR_ADAMW ? "adamw" : "sgd",
             (double)cfg->lr, cfg->lr_schedule == LR_COSINE ? "cosine" : cfg->lr_schedule == LR_CONSTANT ? "constant" : "step",
             cfg->warmup, (double)cfg->momentum, (double)cfg->weight_decay, (unsigned long long)cfg->seed, aug,
             cfg->transform.normalize ? "yes" : "no", cfg->bf16 ? "bf16" : "fp32", cfg->val_split, g->total);
    tb_text(&tb, "run/settings", text, 0);
    return tb.failed;
}

static int take_data(Group *g, DataLoad *data, Dataset *train, Dataset *test, FILE **log)
{
    const TrainConfig *cfg = g->cfg;
    World *world = g->world;
    int rc = data_wait(data);
    *train = data->train, *test = data->test;
    data->train = data->test = (Dataset){ 0 };
    if (rc) {
        if (world->size > 1) fprintf(stderr, "mgc: rank %d: %s\n", world->rank, data->err);
        else fprintf(stderr, "mgc: %s\n", data->err);
        rc = 1;
    }
    /* the classes (and the shape, where the headers could not be read before) from the data */
    if (!rc && check_net(g, &data->info, world->rank == 0)) rc = 1;
    if (!rc && cfg->log && world->rank == 0 && !(*log = fopen(cfg->log, cfg->resume ? "a" : "w"))) {
        fprintf(stderr, "mgc: cannot write --log %s: %s\n", cfg->log, strerror(errno));
        rc = 1;
    }
    if (!rc && cfg->tensorboard && world->rank == 0 && open_tensorboard(g)) rc = 1;
    int status = train_stop_point(world, rc);
    if (status == 1 && !rc) fprintf(stderr, "mgc: rank %d: stopping, another rank failed (see its message)\n", world->rank);
    return status ? status : agree_data(world, &data->info);
}

/* --dump-batch: epoch 1's first training batch as the net sees it (after
   --resize, --augment, --normalize), with the examples' labels and indices
   in the training set, and the normalisation's statistics: 0, or 1 said. */
static int dump_batch(Group *g, const Dataset *train, int *order)
{
    const TrainConfig *cfg = g->cfg;
    int c, h, w, b = train->n < cfg->batch_size ? train->n : cfg->batch_size;
    transform_shape(&g->transform, train, &c, &h, &w);
    data_epoch_order(train->n, cfg->seed, 1, order);
    size_t per = (size_t)c * h * w;
    float *x = malloc(sizeof(float) * per * (size_t)b + 1), *y = malloc(sizeof(float) * (size_t)b + 1),
          *index = malloc(sizeof(float) * (size_t)b + 1);
    if (!x || !y || !index) {
        fprintf(stderr, "mgc: --dump-batch: out of memory for %d examples of %dx%dx%d\n", b, c, h, w);
        free(x), free(y), free(index);
        return 1;
    }
    transform_gather(&g->transform, train, order, b, true, cfg->seed, 1, x, y);
    for (int i = 0; i < b; i++) index[i] = (float)order[i];   /* exact below 2^24 examples */
    StWriter *wr = st_writer_new();
    st_writer_add_f32(wr, "x", 4, (long long[]){ b, c, h, w }, x);
    st_writer_add_f32(wr, "y", 1, (long long[]){ b }, y);
    st_writer_add_f32(wr, "index", 1, (long long[]){ b }, index);
    char tf[256], v[160];
    transform_str(&g->transform, tf, sizeof tf);
    st_writer_set_meta(wr, "transform", tf[0] ? tf : "none");
    st_writer_set_meta(wr, "seed", (snprintf(v, sizeof v, "%llu", cfg->seed), v));
    if (g->transform.normalize) {
        int p = 0;
        for (int k = 0; k < c; k++) p += snprintf(v + p, sizeof v - (size_t)p, "%s%.9g", k ? "," : "", (double)g->transform.mean[k]);
        st_writer_set_meta(wr, "mean", v);
        p = 0;
        for (int k = 0; k < c; k++) p += snprintf(v + p, sizeof v - (size_t)p, "%s%.9g", k ? "," : "", (double)g->transform.std[k]);
        st_writer_set_meta(wr, "std", v);
    }
    char err[512];
    int rc = st_writer_save(wr, cfg->dump_batch, err, sizeof err);
    st_writer_free(wr);
    free(x), free(y), free(index);
    if (rc) {
        fprintf(stderr, "mgc: --dump-batch: %s\n", err);
        return 1;
    }
    printf("mgc: wrote epoch 1's first training batch (%d examples of %dx%dx%d%s%s) to %s\n", b, c, h, w,
           tf[0] ? ", " : "", tf, cfg->dump_batch);
    return 0;
}

/* Evaluation (--evaluate) or the epochs, on the data. The exit status. */
static int on_data(Group *g, DataLoad *data, int first_epoch)
{
    const TrainConfig *cfg = g->cfg;
    /* The net must fit the data before the data is read: the files' headers
       say its shape (Fashion-MNIST's where there is none: the loader then says
       what is missing; nothing where they cannot be read: the loader says why). */
    DataInfo info;
    char err[2048];
    if (!data->file && data_describe(cfg->data_dir, &info, err, sizeof err) >= 0 && check_net(g, &info, true))
        return 1;   /* (one file of mgc predict's is read in a moment, its layout as the net takes it) */
    Dataset train = { 0 }, test = { 0 }, val = { 0 };
    FILE *log = NULL;
    bool log_failed = false;
    int status = take_data(g, data, &train, &test, &log);
    if (status > 128 && g->world->rank == 0)
        fprintf(stderr, "mgc: interrupted by %s before the training began; nothing was trained or saved\n",
                train_signal_name(status - 128));
    int *order = NULL;
    if (!status) {
        g->data_info = data->info;
        g->have_data = true;
        g->transform = cfg->transform;
        if (cfg->transform_given) {
            /* the checkpoint's statistics (mgc predict, evaluate): as in its training, whatever this data's */
        } else if (cfg->transform.normalize && train.n == 0) {
            if (g->world->rank == 0)
                fprintf(stderr, "mgc: --normalize takes its mean and standard deviation from the training set, and %s holds "
                        "none: give the data's directory, or a checkpoint that holds its statistics (mgc --save writes them)\n",
                        cfg->data_dir);
            status = 1;
        } else if (transform_fit(&g->transform, &train, err, sizeof err)) {
            /* over the whole training set, whatever --limit-train; every rank has the same data (agreed): the same outcome */
            if (g->world->rank == 0) fprintf(stderr, "mgc: %s\n", err);
            status = 1;
        }
    }
    if (!status) {
        data_limit(&train, cfg->limit_train);
        data_limit(&test, cfg->limit_test);
        if (cfg->val_split > 0 && !cfg->evaluate && !cfg->predict) {   /* after --limit-train: a share of what it trains on */
            if (data_split(&train, &val, cfg->val_split, cfg->seed)) {
                fprintf(stderr, "mgc: out of memory holding out the validation examples\n");
                status = 1;
            } else if (val.n == 0 || train.n == 0) {
                if (g->world->rank == 0)
                    fprintf(stderr, "mgc: --val-split %g of %d training examples leaves %s: give a share that leaves examples on "
                            "both sides\n", cfg->val_split, train.n + val.n, val.n == 0 ? "none to validate on" : "none to train on");
                status = 1;
            }
            g->val = status ? NULL : &val;
        }
    }
    if (!status) {
        /* every full batch, and a last one with an example for each replica at least (gather_shard) */
        g->batches_per_epoch = train.n / cfg->batch_size + (train.n % cfg->batch_size >= g->total ? 1 : 0);
        int K = cfg->accumulate > 1 ? cfg->accumulate : 1;   /* --accumulate: K batches a step */
        g->steps_per_epoch = (g->batches_per_epoch + K - 1) / K;
        int most = train.n > test.n ? train.n : test.n;
        order = malloc(sizeof(int) * (size_t)(most > val.n ? most : val.n) + 1);
        if (g->world->rank == 0) say_run(g, &train, &test, &data->info);
    }
    if (!status && cfg->dump_batch) {
        status = g->world->rank == 0 ? dump_batch(g, &train, order) : 0;
    } else if (!status && cfg->predict) {
        status = train_predict(g, cfg->eval_train_split ? &train : &test, order, &data->info);
    } else if (!status && cfg->evaluate) {
        char num[32];
        const Dataset *set = cfg->eval_train_split ? &train : &test;
        if (data->info.unlabelled && g->world->rank == 0)
            fprintf(stderr, "mgc: %s has no `labels`: there is no accuracy to measure without them (mgc predict gives the "
                    "predictions)\n", cfg->data_dir);
        if (data->info.unlabelled) status = 1;
        const char *which = cfg->eval_train_split ? "training" : "test";
        double t0 = train_now(), acc = status ? NAN : train_evaluate(g, set, order);
        if (g->world->rank == 0 && !status) {
            if (isnan(acc)) printf("no %s examples to evaluate on%s\n", which, set->n == 0 && !cfg->eval_train_split ? " (--limit-test 0)" : "");
            else printf("%s acc %.4f  on %s %s examples in %.2f s, parameters %s%s\n", cfg->eval_train_split ? "train" : "test",
                        acc, rt_commas(set->n, num), which, train_now() - t0, cfg->load ? "from " : "initialised",
                        cfg->load ? cfg->load : "");
        }
    } else if (!status) {
        status = train_epochs(g, &train, &test, order, first_epoch, &log, &log_failed);
    }
    if (log && fclose(log)) {
        fprintf(stderr, "mgc: cannot write --log %s: %s\n", cfg->log, strerror(errno));
        log_failed = true;
    }
    if (g->tb && tb_close(g->tb)) log_failed = true;
    g->tb = NULL;
    if (log_failed && status == 0) status = 1;
    free(order);
    data_free(&train);
    data_free(&test);
    data_free(&val);
    g->val = NULL;
    return status;
}

static void close_group(Group *g)
{
    if (g->n > 0 && g->r[0].have_tr && g->r[0].tr.step_seconds && g->r[0].tr.runs) rt_exec_profile_report(&g->r[0].tr, stderr);
    rt_comm_free(g->comm);
    for (int k = 0; k < g->n; k++) {
        Replica *r = &g->r[k];
        if (r->have_ev) rt_exec_free(&r->ev);
        if (r->have_tr) rt_exec_free(&r->tr);
        rt_store_free(&r->store);
        rt_device_free(r->dev);
    }
    free(g->r);
    for (int k = 0; g->grads && g->m->train && k < g->m->train->nparams; k++) free(g->grads[k]);
    free(g->grads);
    free(g->x); free(g->y); free(g->losses); free(g->logits); free(g->eval_logits); free(g->grad_x);
}

int train_run(const Model *m, const TrainConfig *cfg)
{
    Group G = { .m = m, .cfg = cfg, .world = cfg->world, .n = cfg->replicas };
    G.total = G.n * G.world->size;
    G.r = calloc((size_t)G.n, sizeof(Replica));
    DataLoad data = { 0 };
    /* the data set (its size from its headers) and the CPU devices must fit in
       this process's memory before the data is read, meanwhile, as the kernels load */
    bool data_needed = !cfg->batch_file && (cfg->epochs > 0 || cfg->dump_batch);
    DataSize data_bytes = { 0 };
    const Shape *in = &train_primary(m)->input_shape;
    if (in->nd == 4 && !cfg->transform.out_h)   /* the net's shape is the file's (a resize would make it so) */
        data.hint[0] = (int)in->d[1], data.hint[1] = (int)in->d[2], data.hint[2] = (int)in->d[3];
    if (in->nd == 3 && !cfg->transform.out_h) data_image_shape(1, (int)in->d[1], (int)in->d[2]);   /* image folders: the net's */
    else data_image_shape(data.hint[0], data.hint[1], data.hint[2]);
    if (data_needed && data_size(cfg->data_dir, &data_bytes) < 0) data_bytes = (DataSize){ 0 };   /* the loader says why */
    int too_large = check_host_memory(&G, (cfg->batch_size + G.total - 1) / G.total, &data_bytes);
    if (data_needed && !too_large)
        data_start(&data, cfg->data_dir, cfg->evaluate && data_is_file(cfg->data_dir));
    /* from here on a stop signal is a request, answered at the next stop point or step */
    TrainSignals old_signals;
    train_catch_signals(&old_signals);

    /* the kernels take a while to compile: a stop asked meanwhile is answered after */
    int status = train_stop_point(G.world, too_large ? 1 : open_group(&G)), first_epoch = 1;
    if (status > 1 && G.world->rank == 0)
        fprintf(stderr, "mgc: interrupted by %s before the training began; nothing was trained or saved\n",
                train_signal_name(status - 128));
    if (!status) status = start_parameters(&G, &first_epoch);
    if (!status) {
        if (cfg->batch_file) status = train_check_mode(&G);
        else if (first_epoch > cfg->epochs && cfg->resume) status = 0;   /* the checkpoint holds every epoch asked for */
        else if (cfg->epochs == 0 && !cfg->dump_batch) status = initialise_only(&G);
        else status = on_data(&G, &data, first_epoch);
    }
    close_group(&G);
    data_wait(&data);   /* a run that stopped before it needed the data */
    data_free(&data.train);
    data_free(&data.test);
    train_release_signals(&old_signals);
    return status;
}
