/*
** Checkpoints: replica 0's parameters and state in a safetensors file under
** PyTorch's state_dict names, with what --resume needs to go on as if the
** run had never stopped (the epoch, the steps, the seed, the batch, the
** rate's recipe). Rank 0 writes and reads; the others learn the outcome.
*/
#include "checkpoint.h"
#include "schedule.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* --shard-update: member m's state s of bucket pack sp, whole (numel floats from the member's
   place in the bucket): gathered from the slices this process's replicas hold (every rank
   calls it, then sums over the ranks), or scattered into them. */
static void shard_move(Group *g, const ShardPack *sp, int m, int s, float *whole, bool gather)
{
    const char *name = g->m->train->bufs[sp->state[s]].name;
    long at = sp->at[m], end = at + sp->numel[m];
    for (int r = 0; r < g->n; r++) {
        StoreEntry *e = rt_store_find(&g->r[r].store, name);
        long lo = (long)rt_comm_owner(r, g->world->rank, g->world->size) * sp->chunk, hi = lo + sp->chunk;
        for (long i = lo > at ? lo : at; e && i < (hi < end ? hi : end); i++) {
            if (gather) whole[i - at] = e->data[i - lo];
            else e->data[i - lo] = whole[i - at];
        }
    }
}

/* The whole state of every sharded parameter (by bucket, member and state, as sp orders them),
   gathered over every replica of every rank (each rank calls it); NULL where there is none, or
   with *failed set on every rank where one could not hold it (said on that rank). */
static float **shard_gather(Group *g, int *n, int *failed)
{
    const Program *p = g->m->train;
    *n = 0, *failed = 0;
    for (int k = 0; p && k < p->npacks; k++) *n += p->packs[k].nmembers * p->packs[k].nstates;
    if (*n == 0) return NULL;
    /* every buffer first, and every rank told whether all have theirs: a rank short of memory that
       skipped a sum would leave the others waiting in it */
    float **whole = calloc((size_t)*n, sizeof(float *));
    int oom = !whole;
    for (int k = 0, j = 0; whole && k < p->npacks; k++)
        for (int m = 0; m < p->packs[k].nmembers; m++)
            for (int st = 0; st < p->packs[k].nstates; st++, j++)
                oom |= !(whole[j] = calloc((size_t)p->packs[k].numel[m] + 1, sizeof(float)));   /* zeros: another rank's */
    if (rt_world_max_status(g->world, oom)) {
        if (oom) fprintf(stderr, "mgc: out of memory for --shard-update's optimizer state gathered whole (%d tensors)\n", *n);
        for (int j = 0; whole && j < *n; j++) free(whole[j]);
        free(whole);
        *failed = 1;
        return NULL;
    }
    for (int r = 0; r < g->n; r++) rt_store_download(&g->r[r].store, STORE_SHARDS);   /* a GPU's slices */
    for (int k = 0, j = 0; k < p->npacks; k++) {
        const ShardPack *sp = &p->packs[k];
        for (int m = 0; m < sp->nmembers; m++)
            for (int st = 0; st < sp->nstates; st++, j++) {
                shard_move(g, sp, m, st, whole[j], true);
                rt_world_sum_f32(g->world, whole[j], sp->numel[m]);
            }
    }
    return whole;
}

/* Those tensors into the checkpoint, under the names an unsharded run saves them by
   ("fc1.weight.momentum_buffer"), the parameters' shapes. */
static void shard_put(const Program *p, Store *s, StWriter *w, float **whole)
{
    int j = 0;
    for (int k = 0; whole && k < p->npacks; k++) {
        const ShardPack *sp = &p->packs[k];
        for (int m = 0; m < sp->nmembers; m++)
            for (int st = 0; st < sp->nstates; st++, j++) {
                const StoreEntry *pe = rt_store_find(s, sp->names[m]);
                if (!pe || !whole[j]) continue;
                long long shape[IR_MAXDIM];
                for (int d = 0; d < pe->shape.nd; d++) shape[d] = pe->shape.d[d];
                char name[512];
                snprintf(name, sizeof name, "%s.%s", sp->names[m], sp->suffix[st]);
                st_writer_add_f32(w, name, pe->shape.nd, shape, whole[j]);
            }
    }
}

/* The parameters and state, with what --resume needs to go on as if never
   stopped: the epoch finished, the training steps run, the seed and batch;
   and the rate's recipe, which --resume compares with its own. p, whole:
   --shard-update's state, gathered from every replica's slice (shard_gather). */
static int save_checkpoint(Store *s, const Program *p, float **whole, const char *path, const char *net, int epoch, unsigned long long steps,
                           unsigned long long opt_steps, const TrainConfig *cfg, const CkModel *model)
{
    StWriter *w = st_writer_new();
    for (int k = 0; k < s->n; k++) {
        StoreEntry *e = &s->e[k];
        if (e->shard_of >= 0) continue;   /* --shard-update: a replica's slice; the whole below */
        long long shape[IR_MAXDIM];
        for (int d = 0; d < e->shape.nd; d++) shape[d] = e->shape.d[d];
        st_writer_add_f32(w, e->name, e->shape.nd, shape, e->data);
    }
    shard_put(p, s, w, whole);
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
    snprintf(v, sizeof v, "%d", cfg->accumulate > 1 ? cfg->accumulate : 1);
    st_writer_set_meta(w, "accumulate", v);
    char sched[256];
    train_schedule_str(cfg, sched, sizeof sched);
    st_writer_set_meta(w, "lr_schedule", sched);
    char optim[256];
    train_optimizer_str(cfg, optim, sizeof optim);
    st_writer_set_meta(w, "optimizer", optim);
    snprintf(v, sizeof v, "%llu", opt_steps);
    st_writer_set_meta(w, "optimizer_steps", v);
    char tf[256];
    transform_str(&cfg->transform, tf, sizeof tf);
    st_writer_set_meta(w, "transform", tf[0] ? tf : "none");
    st_writer_set_meta(w, "format", "mgc checkpoint: PyTorch state_dict names and layouts");
    ck_model_put(w, model);   /* what mgc predict, evaluate and export need to use it alone */
    char err[512];
    int rc = st_writer_save(w, path, err, sizeof err);
    st_writer_free(w);
    if (rc) fprintf(stderr, "mgc: cannot save checkpoint: %s\n", err);
    return rc;
}

/* Rank 0 saves; every rank learns whether it worked. */
int train_save(Group *g, const char *path, int epoch, bool downloaded)
{
    int rc = 0, nwhole = 0, lost = 0;
    float **whole = shard_gather(g, &nwhole, &lost);   /* --shard-update: every rank takes part */
    if (lost && g->world->rank == 0)   /* the parameters are rank 0's: saved, not lost with the state */
        fprintf(stderr, "mgc: warning: %s holds the parameters without the optimizer's state (a rank had no memory to "
                "gather it): --load starts from them; --resume cannot go on exactly\n", path);
    if (g->world->rank == 0) {
        if (!downloaded) rt_store_download(&g->r[0].store, STORE_ALL);
        const Exec *x = &g->r[0].tr;
        CkModel model;
        train_model_info(g, &model);
        rc = save_checkpoint(&g->r[0].store, g->m->train, whole, path, g->m->train->net_name, epoch, x->runs_before + x->runs,
                                  x->opt_steps_before + x->updates, g->cfg, &model) ? 1 : 0;
    }
    for (int k = 0; k < nwhole && whole; k++) free(whole[k]);
    free(whole);
    return rt_world_max_status(g->world, rc);
}

void train_model_info(const Group *g, CkModel *m)
{
    const TrainConfig *cfg = g->cfg;
    const Program *p = g->m->train;
    memset(m, 0, sizeof *m);
    m->net_file = (char *)cfg->net_file;   /* borrowed: never freed here */
    m->net_text = (char *)cfg->net_text;
    m->net_len = cfg->net_len;
    m->sets = (char *)(cfg->net_sets ? cfg->net_sets : "");
    if (p->input_shape.nd == 4)
        m->channels = (int)p->input_shape.d[1], m->height = (int)p->input_shape.d[2], m->width = (int)p->input_shape.d[3];
    m->classes = p->classes;
    m->bf16 = cfg->bf16;
    /* the transform as fitted to the training set: only once the data was read (--epochs 0 reads none),
       but a --resize alone needs nothing fitted */
    const Transform *t = g->have_data ? &g->transform : &cfg->transform;
    m->has_transform = g->have_data || !cfg->transform.normalize;
    m->resize_h = t->out_h, m->resize_w = t->out_w;
    m->normalize = g->have_data && g->transform.normalize;
    m->nchannels = m->channels <= TRANSFORM_MAX_CHANNELS ? m->channels : 0;
    for (int k = 0; k < m->nchannels; k++) m->mean[k] = g->transform.mean[k], m->std[k] = g->transform.std[k];
    if (g->have_data) {
        m->pixels = g->data_info.floats ? CK_PIXELS_FLOATS : CK_PIXELS_BYTES;
        snprintf(m->data, sizeof m->data, "%s, %dx%dx%d%s", g->data_info.format, g->data_info.channels, g->data_info.rows,
                 g->data_info.cols, g->data_info.floats ? " floats" : "");
        int lines = 0;   /* the data's names, for as many classes as the net has */
        for (const char *c = g->data_info.class_names; *c; c++) lines += *c == '\n';
        if (lines == p->classes) m->class_names = (char *)g->data_info.class_names;
    }
}

int train_check_tensors(Group *g, StoreCheck *found, char *what, size_t size, bool *downloaded)
{
    int rc = 0;
    *found = (StoreCheck){ 0, 0, -1, 0 };
    what[0] = 0;
    *downloaded = false;
    if (g->world->rank == 0) {
        Store *s = &g->r[0].store;
        Device *d = s->dev;
        /* on the device where it can count them: only the tensors that fail come back */
        bool on_device = d && d->ops->count_bad && s->n > 0;
        for (int k = 0; k < s->n && on_device; k++) on_device = s->e[k].mem != NULL;
        long *bad = on_device ? calloc((size_t)s->n, sizeof *bad) : NULL;
        float **mem = on_device ? calloc((size_t)s->n, sizeof *mem) : NULL;
        long *numel = on_device ? calloc((size_t)s->n, sizeof *numel) : NULL;
        bool *variance = on_device ? calloc((size_t)s->n, sizeof *variance) : NULL;
        for (int k = 0; bad && mem && numel && variance && k < s->n; k++) {
            mem[k] = s->e[k].mem;
            numel[k] = s->e[k].numel;
            variance[k] = rt_store_is_variance(&s->e[k]);
        }
        on_device = bad && mem && numel && variance && d->ops->count_bad(d, mem, numel, variance, s->n, bad) == 0;
        if (!on_device) {
            rt_store_download(s, STORE_ALL);
            *downloaded = true;
        }
        for (int k = 0; k < s->n && !rc; k++) {
            if (on_device && !bad[k]) continue;
            if (on_device) d->ops->download(d, s->e[k].data, s->e[k].mem, sizeof(float) * (size_t)s->e[k].numel);
            StoreCheck c = rt_store_check(&s->e[k]);
            if (c.first < 0) continue;
            *found = c;
            rt_store_check_str(&s->e[k], &c, what, size);
            rc = 1;
        }
        free(bad); free(mem); free(numel); free(variance);
    }
    return rt_world_max_status(g->world, rc);
}

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

/* Whether this run's optimizer goes on with the state of the checkpoint's
   (was: its optimizer in words; "" in an older mgc's, which had SGD's alone):
   the same kind of optimizer; another's state starts afresh, from zero. */
static bool same_optimizer(const TrainConfig *cfg, const char *was)
{
    char optim[256];
    train_optimizer_str(cfg, optim, sizeof optim);
    if (!was[0]) was = "sgd";
    size_t kind = strcspn(optim, " ");
    return strlen(was) >= kind && !strncmp(was, optim, kind) && (was[kind] == ' ' || !was[kind]);
}

/* Whether the checkpoint's optimizer kept state, every tensor of it saved:
   AdamW's moments; SGD's momentum buffers where its momentum is not 0 (an
   older mgc's checkpoint does not say). */
static bool keeps_state(const char *was)
{
    double momentum;
    return !strncmp(was, "adamw ", 6) || (sscanf(was, "sgd momentum %lf", &momentum) == 1 && momentum != 0);
}

/* The most training steps a checkpoint may count: more than any run takes, and
   every count to there exact in a double (AdamW's bias corrections' exponent). */
#define MAX_STEPS (1ULL << 53)

/* The store's parameters and running statistics that checkpoint f lacks or has in another shape */
static int misfits(const Store *s, const StFile *f)
{
    int n = 0;
    for (int k = 0; k < s->n; k++) {
        const StoreEntry *e = &s->e[k];
        const StTensor *t = st_find(f, e->name);
        if (!t) {
            n += e->trainable || rt_store_is_running(e);
            continue;
        }
        bool same = t->nd == e->shape.nd;
        for (int d = 0; same && d < t->nd; d++) same = t->shape[d] == e->shape.d[d];
        n += !same;
    }
    return n;
}

int train_load_checkpoint(Store *s, const char *path, const char *net, Resume *resume, const TrainConfig *cfg)
{
    StFile f;
    char err[512];
    if (st_load(path, &f, err, sizeof err)) {
        fprintf(stderr, "mgc: cannot load checkpoint: %s\n", err);
        return -1;
    }
    int bad = 0, damaged = 0;
    char theirs[256];
    int wrong = misfits(s, &f);
    if (wrong && net && st_meta_get(&f, "net", theirs, sizeof theirs) >= 0 && strcmp(theirs, net)) {
        fprintf(stderr, "mgc: %s is a checkpoint of the net '%s', not of '%s': %d of this net's %d tensors are not in it "
                "or not of its shape; give a checkpoint saved from %s (or leave out --load/--resume to start afresh)\n", path,
                theirs, net, wrong, s->n, net);
        st_free(&f);
        return -1;
    }
    if (resume && (meta_count(&f, path, "epoch", &resume->epoch) || meta_count(&f, path, "steps", &resume->steps) ||
                   meta_count(&f, path, "seed", &resume->seed) || meta_count(&f, path, "batch_size", &resume->batch_size))) {
        st_free(&f);
        return -1;
    }
    if (resume && st_meta_get(&f, "lr_schedule", resume->schedule, sizeof resume->schedule) < 0) resume->schedule[0] = 0;
    if (resume && st_meta_get(&f, "optimizer", resume->optimizer, sizeof resume->optimizer) < 0) resume->optimizer[0] = 0;
    if (resume && st_meta_get(&f, "transform", resume->transform, sizeof resume->transform) < 0) resume->transform[0] = 0;
    if (resume) {
        char v[8];
        resume->optimizer_steps = resume->steps;
        resume->accumulate = 1;   /* older checkpoints: one batch a step */
        if (st_meta_get(&f, "accumulate", v, sizeof v) >= 0 && meta_count(&f, path, "accumulate", &resume->accumulate)) {
            st_free(&f);
            return -1;
        }
        if (st_meta_get(&f, "optimizer_steps", v, sizeof v) >= 0 && meta_count(&f, path, "optimizer_steps", &resume->optimizer_steps)) {
            st_free(&f);
            return -1;
        }
        /* AdamW's step t = optimizer_steps + 1 must not wrap to 0 (1 - beta1^0 = 0: a step of lr / 0) */
        if (resume->steps > MAX_STEPS || resume->optimizer_steps > resume->steps) {
            if (resume->steps > MAX_STEPS)
                fprintf(stderr, "mgc: %s: the checkpoint's steps is %llu, more than 2^53 (no run takes so many): it is damaged; "
                        "--load starts a new run from its parameters\n", path, resume->steps);
            else
                fprintf(stderr, "mgc: %s: the checkpoint's optimizer_steps is %llu, more than its steps (%llu): its "
                        "optimizer's state cannot have taken more steps than the run; it is damaged; --load starts a new "
                        "run from its parameters\n", path, resume->optimizer_steps, resume->steps);
            st_free(&f);
            return -1;
        }
    }
    /* --resume with the optimizer whose state the checkpoint keeps: every tensor of that state is there */
    bool state_goes_on = resume && same_optimizer(cfg, resume->optimizer) && keeps_state(resume->optimizer);
    for (int k = 0; k < s->n; k++) {
        StoreEntry *e = &s->e[k];
        if (e->shard_of >= 0) continue;   /* --shard-update: a replica's slice, from the whole (train_load_shards) */
        const StTensor *t = st_find(&f, e->name);
        if (!t) {
            if (e->trainable || rt_store_is_running(e)) {
                fprintf(stderr, "mgc: %s: checkpoint has no tensor '%s' (was it saved from another net?)\n", path, e->name);
                bad++;
            } else if (state_goes_on) {
                fprintf(stderr, "mgc: %s: checkpoint has no tensor '%s' of its optimizer's state (%s): --resume cannot go on "
                        "as the run would have; --load starts a new run from its parameters\n", path, e->name, resume->optimizer);
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
        /* finite, a variance not below 0: else the run would train on NaN (ReLU and
           max-pooling make numbers of it, the loss stays finite) and save it */
        StoreCheck c = rt_store_check(e);
        if (c.first >= 0) {
            char what[512];
            if (damaged++ < 4) fprintf(stderr, "mgc: %s: %s\n", path, rt_store_check_str(e, &c, what, sizeof what));
            bad++;
        }
    }
    if (damaged)
        fprintf(stderr, "mgc: %s: %d tensor%s hold%s such values: the checkpoint was saved from a run that diverged, or is "
                "damaged; load an earlier one\n", path, damaged, damaged == 1 ? "" : "s", damaged == 1 ? "s" : "");
    st_free(&f);
    return bad ? -1 : 0;
}

/* Root's verdict on each sharded state tensor of path (as shard_gather orders them) into have[]: 1 in the
   file and usable, 0 not in it, -1 unusable (said); its values go out later, one tensor at a time */
static void shard_verdicts(Group *g, const StFile *f, const char *path, const Resume *resume, int *have)
{
    const Program *p = g->m->train;
    bool state_goes_on = resume && same_optimizer(g->cfg, resume->optimizer) && keeps_state(resume->optimizer);
    for (int k = 0, j = 0; k < p->npacks; k++) {
        const ShardPack *sp = &p->packs[k];
        for (int m = 0; m < sp->nmembers; m++)
            for (int s = 0; s < sp->nstates; s++, j++) {
                char name[512];
                snprintf(name, sizeof name, "%s.%s", sp->names[m], sp->suffix[s]);
                const StTensor *t = st_find(f, name);
                long numel = 1;
                for (int d = 0; t && d < t->nd; d++) numel *= (long)t->shape[d];
                have[j] = t != NULL;
                if (!t && state_goes_on) {
                    fprintf(stderr, "mgc: %s: checkpoint has no tensor '%s' of its optimizer's state (%s): --resume cannot "
                            "go on as the run would have; --load starts a new run from its parameters\n", path, name,
                            resume->optimizer);
                    have[j] = -1;
                } else if (t && numel != sp->numel[m]) {
                    fprintf(stderr, "mgc: %s: tensor '%s' is not %ld float32 values, as the parameter's state is\n", path,
                            name, sp->numel[m]);
                    have[j] = -1;
                }
            }
    }
}

int train_load_shards(Group *g, const char *path, const Resume *resume)
{
    const Program *p = g->m->train;
    if (!p || p->npacks == 0) return 0;
    bool root = g->world->rank == 0;   /* reads the file; every rank scatters into its replicas */
    StFile f;
    char err[512];
    int n = 0, bad = 0;
    long most = 0;
    for (int k = 0; k < p->npacks; k++)
        for (int m = 0; m < p->packs[k].nmembers; m++) {
            n += p->packs[k].nstates;
            if (p->packs[k].numel[m] > most) most = p->packs[k].numel[m];
        }
    /* one buffer for the largest tensor and the verdicts, every rank's or none: a rank without them
       would leave the others in the broadcasts */
    int *have = calloc((size_t)n, sizeof(int));
    float *whole = calloc((size_t)most + 1, sizeof(float));
    if (!have || !whole) fprintf(stderr, "mgc: cannot load checkpoint %s: out of memory for its optimizer's state\n", path), bad = 1;
    if (!bad && root && st_load(path, &f, err, sizeof err)) fprintf(stderr, "mgc: cannot load checkpoint: %s\n", err), bad = 2;
    if (rt_world_max_status(g->world, bad ? 1 : 0)) {
        if (root && !bad) st_free(&f);
        free(have), free(whole);
        return -1;
    }
    if (root) shard_verdicts(g, &f, path, resume, have);
    rt_world_bcast(g->world, have, sizeof(int) * (size_t)n);   /* one message for all */
    for (int j = 0; j < n; j++) bad += have[j] < 0;
    for (int k = 0, j = 0; !bad && k < p->npacks; k++) {
        const ShardPack *sp = &p->packs[k];
        for (int m = 0; !bad && m < sp->nmembers; m++)
            for (int s = 0; !bad && s < sp->nstates; s++, j++) {
                if (have[j] != 1) continue;
                int rc = 0;
                if (root) {
                    char name[512];
                    snprintf(name, sizeof name, "%s.%s", sp->names[m], sp->suffix[s]);
                    rc = st_to_f32(st_find(&f, name), whole);
                    if (rc) fprintf(stderr, "mgc: %s: tensor '%s' cannot be read as float32\n", path, name);
                }
                rt_world_bcast(g->world, &rc, sizeof rc);   /* every rank stops at the same tensor */
                if ((bad = rc != 0)) continue;
                rt_world_bcast(g->world, whole, sizeof(float) * (size_t)sp->numel[m]);
                shard_move(g, sp, m, s, whole, false);
            }
    }
    if (root) st_free(&f);
    free(have), free(whole);
    for (int r = 0; r < g->n; r++) rt_store_upload(&g->r[r].store, STORE_SHARDS);   /* to a GPU's slices */
    return bad ? -1 : 0;
}

int train_resume_from(Group *g, const Resume *resume)
{
    const TrainConfig *cfg = g->cfg;
    int first = resume->epoch < (unsigned long long)cfg->epochs ? (int)resume->epoch + 1 : cfg->epochs + 1;
    /* the optimizer's state goes on where it is the same optimizer's */
    char optim[256];
    train_optimizer_str(cfg, optim, sizeof optim);
    bool same_kind = same_optimizer(cfg, resume->optimizer);
    for (int k = 0; k < g->n; k++) {
        g->r[k].tr.runs_before = resume->steps;
        g->r[k].tr.opt_steps_before = same_kind ? resume->optimizer_steps : 0;
    }
    if (g->world->rank != 0) return first;
    if (first > cfg->epochs) {
        printf("mgc: %s holds %llu epoch%s already, --epochs %d: nothing to train (a larger --epochs goes on)\n",
               cfg->load, resume->epoch, resume->epoch == 1 ? "" : "s", cfg->epochs);
    } else {
        printf("mgc: going on from %s after epoch %llu (%llu steps)\n", cfg->load, resume->epoch, resume->steps);
        unsigned long long K = cfg->accumulate > 1 ? (unsigned long long)cfg->accumulate : 1;
        if (resume->seed != cfg->seed || resume->batch_size != (unsigned long long)cfg->batch_size || resume->accumulate != K)
            printf("mgc: note: the checkpoint was trained with --seed %llu --batch-size %llu --accumulate %llu, this run has "
                   "--seed %llu --batch-size %d --accumulate %llu: it goes on, but not as the first run would have\n",
                   resume->seed, resume->batch_size, resume->accumulate, cfg->seed, cfg->batch_size, K);
        char sched[256];
        train_schedule_str(cfg, sched, sizeof sched);
        if (resume->schedule[0] && strcmp(resume->schedule, sched))
            printf("mgc: note: the checkpoint was trained with %s; this run has %s: epoch %d goes on along "
                   "this run's schedule, not the first run's\n", resume->schedule, sched, first);
        if (resume->optimizer[0] && strcmp(resume->optimizer, optim))
            printf("mgc: note: the checkpoint was trained with %s; this run goes on with %s%s\n", resume->optimizer, optim,
                   same_kind ? "" : " (its state starts afresh)");
        char tf[256];
        transform_str(&cfg->transform, tf, sizeof tf);
        if (!tf[0]) snprintf(tf, sizeof tf, "none");
        if (resume->transform[0] && strcmp(resume->transform, tf))
            printf("mgc: note: the checkpoint's images were transformed with %s; this run's are with %s\n", resume->transform, tf);
    }
    fflush(stdout);
    return first;
}
