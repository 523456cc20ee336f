/*
** What the command line asks, compiled and run: the pipeline for a Cli
** (drv_compile), the checks before anything is compiled (the ranks'
** agreement under mpirun, the files rank 0 will write, the GPUs), --emit and
** --dump-kernels, and training, evaluation or check mode. main.c (mgc
** NET.net) and use.c (mgc predict, evaluate) call it; it calls neither.
*/
#include "run.h"
#include "ckmodel.h"   /* MGC_VERSION */
#include "data.h"
#include "world.h"
#include "ptx.h"
#include "device_cuda.h"
#include "agree.h"
#include "comm.h"     /* rt_comm_owner */
#include "paths.h"
#include <sys/stat.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const drv_emit_names[EMIT_COUNT] = { "none", "ir", "eval-ir", "grad", "kernels", "cuda", "dp", "ptx", "infer-ir" };
const char *const drv_leave_names[LEAVE_COUNT] = { "", "--help", "--version", "--list-layers", "--list-ops", "--cache-info",
                                                   "--cache-clear" };

/* Code generation options from the environment (read by parse_args):
   MGC_FUSE=0 turns fusion off, MGC_CONV=direct|vector|gemm|dense|chunked|winograd
   forces one convolution strategy everywhere (unset: chosen per layer). The tests run each. Kernels
   may be C only (CBLAS calls, ...) when the program runs on CPUs only (not
   for --emit cuda/ptx). */
static CgOptions codegen_options(const Cli *c)
{
    bool cuda = c->emit == EMIT_CUDA || c->emit == EMIT_PTX;
    for (int k = 0; k < c->cfg.replicas; k++) cuda |= c->cfg.devices[k].kind == DEV_CUDA;
    CgOptions o = { .fuse = c->fuse, .conv = c->conv, .cpu_only = !cuda };   /* conv: ConvStrategy's order */
    return o;
}

int drv_compile(const Cli *c, Arena *a, Diag *d, bool training, bool backward, bool input_grad, Graph *g, Program *p)
{
    long bucket = (long)((double)c->bucket_mb * 1e6);
    MgcOptions o = {
        .net = c->net, .text = c->net_text, .len = c->net_len, .sets = c->sets, .nsets = c->nsets,
        .training = training, .backward = backward, .inference = c->inference && !training, .fold = !c->no_fold,
        .input_grad = input_grad, .sync_bn = c->cfg.sync_bn, .replicas = c->total_replicas, .accumulate = c->cfg.accumulate, .shard_update = c->cfg.shard_update, .bucket_bytes = bucket,
        .first_bucket_bytes = bucket < 1000000 ? bucket : 1000000,
        .opt = { .kind = c->cfg.optimizer, .lr = c->cfg.lr, .weight_decay = c->cfg.weight_decay, .momentum = c->cfg.momentum,
                 .nesterov = c->cfg.nesterov, .beta1 = c->cfg.beta1, .beta2 = c->cfg.beta2, .eps = c->cfg.eps },
        .bf16 = c->cfg.bf16,
        .codegen = codegen_options(c),
        /* buffers share memory by liveness, for the largest shard of a global batch */
        .plan_batch = (c->cfg.batch_size + c->total_replicas - 1) / c->total_replicas,
    };
    return mgc_compile(&o, a, d, g, p, NULL) ? -1 : 0;
}

/* --dump-kernels DIR: each kernel of the program as DIR/NAME.c and DIR/NAME.cu
   (prelude included, so each compiles alone), headed by the IR nodes it
   computes: the step's node and the nodes fused into its kernel. A C-only
   kernel (CPU devices only: it calls CBLAS, ...) has no CUDA form. */
static int dump_kernels(const Graph *g, const Program *p, const char *dir)
{
    if (mkdir(dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "mgc: --dump-kernels %s: cannot create the directory: %s\n", dir, strerror(errno));
        return 1;
    }
    int files = 0, kernels = 0, c_only = 0;
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (s->kind != STEP_KERNEL) continue;
        kernels++;
        c_only += s->c_only;
        char *head = NULL;
        size_t len = 0;
        FILE *h = open_memstream(&head, &len);
        fprintf(h, "/* mgc: kernel %s, step %d of the training step of %s, computes\n", s->fn, k, g->net_name);
        ir_print(g, h, s->node, s->node + 1);
        /* fused nodes come after the step's node (a ReLU) or before it (a BatchNorm
           normalised by the add after it, a pool gradient routed by a weight gradient) */
        for (int id = 0, said = 0; id < g->n; id++)
            if (id != s->node && cg_fused_into(p->decided, id) == s->node) {
                if (!said++) fprintf(h, "   and, fused into it:\n");
                ir_print(g, h, id, id + 1);
            }
        if (s->sym != s->fn) fprintf(h, "   Its code is %s's (the same but for names and comments): compiled once, as %s.\n", s->sym, s->sym);
        fprintf(h, "*/\n");
        fclose(h);
        for (int t = 0; t < (s->c_only ? 1 : 2); t++) {   /* some kernels are C only */
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.%s", dir, s->fn, t ? "cu" : "c");
            FILE *f = fopen(path, "w");
            if (!f || fputs(head, f) < 0 || fputs(cg_kernel_source(p, k, t ? TARGET_CUDA : TARGET_C), f) < 0 || fclose(f)) {
                fprintf(stderr, "mgc: --dump-kernels: cannot write %s: %s\n", path, strerror(errno));
                free(head);
                return 1;
            }
            files++;
        }
        free(head);
    }
    printf("mgc: %d kernels of %s written to %s (%d files: C and CUDA", kernels, g->net_name, dir, files);
    if (c_only) printf("; %d C only: on a GPU they are others", c_only);
    printf(")\n");
    return 0;
}

/* --emit dp: what the data-parallel passes made of the net. */
static void print_dp(const Cli *c, const Graph *g, const Program *p, const World *w)
{
    const TrainConfig *t = &c->cfg;
    int total = c->total_replicas;
    char num[32], num2[32];
    printf("# net %s: the data-parallel training step on %d replica%s (", g->net_name, total, total == 1 ? "" : "s");
    if (w->size > 1) printf("%d ranks x ", w->size);
    printf("%s), BatchNorm %s\n", c->devices, t->sync_bn ? "over the global batch (--sync-bn)" : "per replica");
    printf("# One program, run by every replica on its shard of each global batch (SPMD).\n"
           "# softmax_cross_entropy_grad divides by the global batch, so each replica's gradient\n"
           "# is its share of the global mean's, and the buckets' sums are the global gradient.\n");
    printf("replicas (global batch %d):\n", t->batch_size);
    for (int r = 0; r < total; r++) {
        long first, n;
        train_shard(t->batch_size, total, r, &first, &n);
        const DeviceSpec *ds = &t->devices[r % t->replicas];
        printf("  replica %-3d rank %d %s:%d  examples [%ld, %ld) of each batch: %ld\n", r, r / t->replicas,
               ds->kind == DEV_CUDA ? "cuda" : "cpu", ds->index, first, first + n, n);
    }
    printf("buckets (about %g MB each, the first at most %g MB; the last layers' gradients first):\n",
           c->bucket_mb, c->bucket_mb < 1 ? c->bucket_mb : 1.0);
    if (g->nbuckets == 0) printf("  none: with one replica there is nothing to sum\n");
    for (int k = 0; k < g->nbuckets; k++) {
        const IrBucket *b = &g->buckets[k];
        printf("  bucket %d: %s floats, %s bytes, %d tensor%s\n", k, rt_commas(b->floats, num),
               rt_commas(4 * b->floats, num2), b->count, b->count == 1 ? "" : "s");
        for (int j = 0; j < b->count; j++) {
            int id = g->bucket_nodes[b->first + j];
            const Node *ar = &g->nodes[id], *st = &g->nodes[ar->in[0]];
            char what[160];
            snprintf(what, sizeof what, "%%%d = allreduce %%%d", id, ar->in[0]);
            printf("    %-28s offset %-9d %-16s %s: d loss / d %s\n", what, ar->attr.offset, ir_shape_str(g->arena, &st->shape),
                   ir_op_name(st->op), ar->name);
        }
    }
    if (p->npacks > 0) {   /* --shard-update */
        printf("sharded update (--shard-update, ZeRO-1): each bucket reduce-scattered, each replica updating its chunk\n"
               "of the bucket's parameters (one block laid out as the bucket) with that chunk's optimizer state, the\n"
               "block all-gathered; optimizer state per replica:\n");
        double whole = 0, most = 0;
        for (int k = 0; k < p->npacks; k++) {
            const ShardPack *sp = &p->packs[k];
            printf("  bucket %d: %s floats;", k, rt_commas(sp->floats, num));
            for (int r = 0; r < total; r++) {   /* the chunk it owns (rt_comm_owner): its rank's replicas hold neighbours */
                long lo = (long)rt_comm_owner(r % t->replicas, r / t->replicas, w->size) * sp->chunk;
                long hi = lo + sp->chunk < sp->floats ? lo + sp->chunk : sp->floats;
                printf(" replica %d [%ld, %ld)", r, lo < hi ? lo : hi, hi);
            }
            if (sp->nstates) printf("; state: %d slice%s of %s floats a replica\n", sp->nstates, sp->nstates == 1 ? "" : "s",
                                    rt_commas(p->bufs[sp->state[0]].size.c, num2));
            else printf("; no state (SGD without momentum)\n");
            whole += (double)sp->nstates * (double)sp->floats;
            if (sp->nstates > 0) most += (double)sp->nstates * (double)p->bufs[sp->state[0]].size.c;
        }
        printf("  the optimizer's state: %.2f MB a replica, of %.2f MB in all\n", 4 * most / 1e6, 4 * whole / 1e6);
        printf("%s", p->packs_shareable
                         ? "  replicas in one memory (a process's CPU devices) share each block, each updating its chunk in place:\n"
                           "  their all-gathers copy nothing (every read of a bucket's parameters in a step comes before a\n"
                           "  reduce-scatter its update waits for)\n"
                         : "  each replica keeps its own blocks: a read of some bucket's parameters in a step comes after every\n"
                           "  reduce-scatter its update waits for\n");
    }
    printf("collectives in the schedule of %d steps:\n", p->nsteps);
    int ncoll = 0;
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        if (s->kind != STEP_ALLREDUCE && s->kind != STEP_WAIT) continue;
        ncoll++;
        const Collective *cl = &p->colls[s->coll];
        if (s->kind == STEP_ALLREDUCE) {
            const Step *prev = k > 0 ? &p->steps[k - 1] : NULL;
            const char *after = !prev ? "-" : prev->kind == STEP_KERNEL ? prev->fn : prev->kind == STEP_GEMM ? "gemm" : "a collective";
            printf("  step %-4d start c%-3d %-14s %10s floats, after %s (%%%d): %s\n", k, s->coll, cg_coll_name(cl->kind),
                   rt_commas(cl->floats, num), after, prev ? prev->node : -1, cl->what);
        } else {
            printf("  step %-4d wait  c%-3d before %%%d %s\n", k, s->coll, s->node, ir_op_name(g->nodes[s->node].op));
        }
    }
    if (!ncoll) printf("  none\n");
}

/* ------------------------------------------------------------ the ranks agree */

/* A file's bytes as an agreement item: its size and a digest, or why it cannot be read. */
static void agree_file(Agreement *a, const char *name, const char *path)
{
    FILE *f = fopen(path, "rb");
    uint64_t h = CG_FNV1A_START;
    long long n = 0;
    unsigned char buf[65536];
    size_t got;
    while (f && (got = fread(buf, 1, sizeof buf, f)) > 0) {
        h = cg_fnv1a(h, buf, got);
        n += (long long)got;
    }
    char shown[AGREE_TEXT], num[32];
    if (!f || ferror(f)) snprintf(shown, sizeof shown, "%s cannot be read (%s)", path, f ? "read error" : strerror(errno));
    else snprintf(shown, sizeof shown, "%s, %s bytes, digest %08llx", path, rt_commas((long)n, num), (unsigned long long)(h >> 32));
    if (f) fclose(f);
    rt_agree_add_hash(a, name, f ? h : 1, shown);
}

/* The first items of every rank's list: the mgc, then each option that
   makes a rank leave before it trains (a rank that would leave alone is a
   difference, named like any other, rather than the others waiting for it
   in their first collective). --evaluate, --epochs 0 and check mode follow
   in agree_inputs. */
void drv_agree_leaving(const Cli *c, Agreement *a)
{
    char b1[256], b2[256];
    const char *cuda = rt_cuda_build(b1, sizeof b1), *mpi = rt_world_mpi_build(b2, sizeof b2);
    rt_agree_add(a, "mgc", "%s, %s, %s", MGC_VERSION, cuda ? cuda : "no CUDA", mpi ? mpi : "no MPI");
    for (int k = LEAVE_HELP; k < LEAVE_COUNT; k++) rt_agree_add(a, drv_leave_names[k], "%s", (int)c->leave == k ? "given" : "not given");
    rt_agree_add(a, "--emit", "%s", drv_emit_names[c->emit]);
    rt_agree_add(a, "--dump-kernels", "%s", c->dump_kernels ? "given" : "not given");
    rt_agree_add(a, "--dump-batch", "%s", c->cfg.dump_batch ? "given" : "not given");
}

/* What every rank of an mpirun launch must have alike, before anything is
   compiled or read: what it was asked to do, the mgc, the net and --set, the
   options that shape the run, the environment that shapes the kernels, and
   (where it will read it) the data. */
static void agree_inputs(const Cli *c, const char *devices, bool running, Agreement *a)
{
    const TrainConfig *t = &c->cfg;
    drv_agree_leaving(c, a);
    agree_file(a, "the net's text", c->net);
    char *sets = NULL;   /* every --set whole: a difference anywhere in them is one */
    size_t len = 0;
    FILE *f = open_memstream(&sets, &len);
    for (int k = 0; f && k < c->nsets; k++) fprintf(f, "%s%s=%s", k ? " " : "", c->sets[k].name, c->sets[k].value);
    if (f) fclose(f);
    rt_agree_add(a, "--set", "%s", c->nsets && sets ? sets : "none");
    free(sets);
    rt_agree_add(a, "--devices (each rank's)", "%s", devices);
    rt_agree_add(a, "--epochs", "%d", t->epochs);
    rt_agree_add(a, "--batch-size", "%d", t->batch_size);
    rt_agree_add(a, "--lr", "%.9g", (double)t->lr);
    char sched[256] = "";
    int p = snprintf(sched, sizeof sched, "%s, per %s", t->lr_schedule == LR_COSINE ? "cosine" : t->lr_schedule == LR_STEP ? "step"
                     : "constant", t->lr_per_step ? "step" : "epoch");
    for (int k = 0; k < t->lr_nmilestones && p < (int)sizeof sched; k++)
        p += snprintf(sched + p, sizeof sched - (size_t)p, "%s%d", k ? "," : " at ", t->lr_milestones[k]);
    rt_agree_add(a, "--lr-schedule and --lr-per", "%s", sched);
    rt_agree_add(a, "--lr-gamma", "%.9g", (double)t->lr_gamma);
    rt_agree_add(a, "--warmup", "%d", t->warmup);
    rt_agree_add(a, "--momentum", "%.9g", (double)t->momentum);
    rt_agree_add(a, "--optimizer, --nesterov, --betas, --eps", "%s%s betas %.9g,%.9g eps %.9g", t->optimizer == IR_ADAMW ? "adamw" : "sgd",
                 t->nesterov ? " nesterov" : "", (double)t->beta1, (double)t->beta2, (double)t->eps);
    rt_agree_add(a, "--weight-decay", "%.9g", (double)t->weight_decay);
    rt_agree_add(a, "--seed", "%llu", t->seed);
    char tf[256];
    transform_str(&t->transform, tf, sizeof tf);
    rt_agree_add(a, "--resize, --augment, --normalize", "%s", tf[0] ? tf : "none");
    rt_agree_add(a, "--limit-train", "%d%s", t->limit_train, t->limit_train < 0 ? " (all)" : "");
    rt_agree_add(a, "--limit-test", "%d%s", t->limit_test, t->limit_test < 0 ? " (all)" : "");
    rt_agree_add(a, "--sync-bn", "%s", t->sync_bn ? "on" : "off");
    rt_agree_add(a, "--accumulate", "%d", t->accumulate > 1 ? t->accumulate : 1);
    rt_agree_add(a, "--shard-update", "%s", t->shard_update ? "on" : "off");
    rt_agree_add(a, "--bucket-mb", "%.9g", (double)c->bucket_mb);
    rt_agree_add(a, "--tf32", "%s", t->tf32 ? "on" : "off");
    rt_agree_add(a, "--precision", "%s", t->bf16 ? "bf16" : "fp32");
    rt_agree_add(a, "--check-nan", "%s", t->check_nan ? "on" : "off");
    rt_agree_add(a, "--evaluate", "%s", t->evaluate ? "on" : "off");
    rt_agree_add(a, "--load or --resume", "%s", t->resume ? "--resume" : t->load ? "--load" : "neither");
    rt_agree_add(a, "--save", "%s", t->save ? "given" : "not given");
    rt_agree_add(a, "check mode (--batch, --steps)", "%s, %d step%s", t->batch_file ? "on" : "off", t->steps, t->steps == 1 ? "" : "s");
    const char *conv = getenv("MGC_CONV");
    rt_agree_add(a, "the kernels' environment (MGC_FUSE, MGC_CONV)", "fusion %s, convolutions %s%s", c->fuse ? "on" : "off",
                 c->conv < 0 ? "chosen per layer" : "MGC_CONV=", c->conv < 0 ? "" : conv);
    if (t->batch_file) agree_file(a, "the --check-batch file", t->batch_file);
    if (running && !t->batch_file && (t->epochs > 0 || t->evaluate)) {
        char probe[1024];
        data_probe(t->data_dir, probe, sizeof probe);
        rt_agree_add(a, "the data (--data, MGC_DATA)", "%s", probe);
    }
}

/* What the compilers made, where the inputs agreed: whether the net
   compiled, and the training program's plan (parameters, collectives and
   kernels), which a different build or environment could change. */
static void agree_program(const Program *p, Agreement *a)
{
    if (!p) {
        rt_agree_add(a, "the net compiles", "no (rank 0 says why where it is the one)");
        return;
    }
    rt_agree_add(a, "the net compiles", "yes");
    uint64_t h = CG_FNV1A_START;
    long floats = 0;
    for (int k = 0; k < p->ncolls; k++) {
        h = cg_fnv1a(h, &p->colls[k].floats, sizeof p->colls[k].floats);
        floats += p->colls[k].floats;
    }
    for (int k = 0; k < p->nparams; k++) {
        const Buf *b = &p->bufs[p->params[k].buf];
        h = rt_fnv1a(h, b->name);
        h = cg_fnv1a(h, b->shape.d, sizeof(int) * (size_t)b->shape.nd);
    }
    h = rt_fnv1a(h, cg_source(p, TARGET_C));
    char num[32];
    char shown[AGREE_TEXT];
    snprintf(shown, sizeof shown, "%d steps, %d collectives of %s floats, %d parameter tensors, digest %08llx", p->nsteps,
             p->ncolls, rt_commas(floats, num), p->nparams, (unsigned long long)(h >> 32));
    rt_agree_add_hash(a, "the training program", h, shown);
}

/* ------------------------------------------------------------ files written */

/* --save, --dump and --log can be written, checked before anything is compiled
   or trained (rank 0 writes them): 0, or 2 with a message. */
static int check_outputs(const Cli *c)
{
    const TrainConfig *t = &c->cfg;
    const struct { const char *opt, *path; bool replaced; } out[] = {
        { "--save", t->save, true }, { "--dump", t->dump, true }, { "--log", t->log, false },
        { "--dump-batch", t->dump_batch, true }, { "--out", c->command == CMD_PREDICT ? c->out : NULL, true },
    };
    for (size_t k = 0; k < sizeof out / sizeof *out; k++) {
        if (!out[k].path) continue;
        char err[4400];
        int rc = out[k].replaced ? rt_check_replaceable(out[k].path, err, sizeof err)
                                 : rt_check_appendable(out[k].path, err, sizeof err);
        if (rc) {
            fprintf(stderr, "mgc: %s %s\n", out[k].opt, err);
            return 2;
        }
    }
    return 0;
}

/* The GPUs asked for exist, on every rank: said before anything is compiled.
   0, or -1 on every rank, said by the first rank that lacks its GPUs (the
   others would otherwise wait for it in their first collective). */
int drv_check_gpus(const Cli *c, World *w)
{
    /* NCCL holds one replica a GPU: a GPU named twice is for replicas that all
       share it, in one process (they sum on it); the same on every rank */
    bool same = true, distinct = true;
    for (int k = 0; k < c->cfg.replicas; k++) {
        same &= c->cfg.devices[k].index == c->cfg.devices[0].index;
        for (int j = 0; j < k; j++) distinct &= c->cfg.devices[k].index != c->cfg.devices[j].index;
    }
    if (!distinct && (!same || w->size > 1)) {
        if (w->rank == 0)
            fprintf(stderr, "mgc: --devices %s: %s\n", c->devices,
                    w->size > 1 ? "under mpirun every replica needs a GPU of its own (NCCL holds one replica a GPU): "
                                  "name each GPU once"
                                : "a GPU named twice holds replicas that all share it: put every replica on one GPU "
                                  "(--devices cuda:0,cuda:0) or each on its own (--gpus N)");
        return -1;
    }
    char err[512];
    int count = rt_cuda_device_count(err, sizeof err), most = -1;
    for (int k = 0; k < c->cfg.replicas; k++)
        if (c->cfg.devices[k].index > most) most = c->cfg.devices[k].index;
    bool ok = count >= 0 && most < count;
    int first_bad = rt_world_max_status(w, ok ? 0 : w->size - w->rank);   /* the lowest failing rank, as size - rank */
    if (!first_bad) return 0;
    if (w->rank != w->size - first_bad) return -1;
    fprintf(stderr, "mgc: ");
    if (w->size > 1) fprintf(stderr, "rank %d: ", w->rank);
    fprintf(stderr, "--%s %s: ", c->devices_given ? "devices" : "gpus", c->devices_given ? c->devices : c->gpus_arg);
    if (count < 0)
        fprintf(stderr, "%s; train on CPU devices with --devices cpu:%d\n", err, c->cfg.replicas);
    else if (count == 0)
        fprintf(stderr, "the CUDA driver sees no GPU on this machine; train on CPU devices with --devices cpu:%d\n", c->cfg.replicas);
    else {
        char have[64];
        if (count == 1) snprintf(have, sizeof have, "1 GPU (cuda:0)");
        else snprintf(have, sizeof have, "%d GPUs (cuda:0 to cuda:%d)", count, count - 1);
        if (w->size > 1)
            fprintf(stderr, "there is no cuda:%d: this machine has %s, and its ranks take them in turn, %d each; start "
                    "fewer ranks on it, or ask for fewer GPUs each\n", most, have, c->cfg.replicas);
        else
            fprintf(stderr, "there is no cuda:%d: this machine has %s; ask for fewer%s\n", most, have,
                    c->cfg.replicas > count ? ", or put several replicas on one GPU, e.g. --devices cuda:0,cuda:0" : "");
    }
    return -1;
}

/* The start-up agreement, under mpirun, before anything else: 0, or 2 said
   (by rank 0). A rank that has not come by the deadline (one that left, or a
   program that is not this mgc) ends them all at once, status 2. */
int drv_agree_start(const Cli *c, World *world, Agreement *a)
{
    int rc = rt_agree(world, a, c->agree_seconds);
    if (rc == AGREE_LATE) {
        fprintf(stderr, "mgc: rank %d: not every rank came to compare how it was started within %g s (MGC_AGREE_SECONDS): "
                "one has left or is stuck before that (a program other than this mgc, or one that left without a "
                "word?); every rank must run the same mgc with the same options (one mpirun command line for all); "
                "stopping them all (status 2)\n", world->rank, c->agree_seconds);
        fflush(stderr);
        rt_world_abort(world, 2);
    }
    return rc ? 2 : 0;
}

/* The rank's first local rank on its machine (OMPI_COMM_WORLD_LOCAL_RANK,
   MPI_LOCALRANKID), or -1 where the launcher does not say. */
int drv_local_rank(void)
{
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!local) local = getenv("MPI_LOCALRANKID");
    return local ? atoi(local) : -1;
}

/* Before anything is compiled, on every rank: were the ranks started alike,
   can rank 0 write what it will, is the batch large enough, are the GPUs
   there? 0, or 2 said. */
int drv_preflight(Cli *c, World *world)
{
    bool running = c->emit == EMIT_NONE && !c->dump_kernels;   /* trains, evaluates or checks: not an --emit */
    if (running && c->cfg.shard_update && !c->cfg.evaluate) {   /* where the sharded update runs (see docs/data-parallel.md) */
        const char *why = c->cfg.replicas * world->size < 2 ? "shards the update across replicas, and this run has one: give --devices cpu:N"
                        : c->cfg.devices[0].kind == DEV_CUDA && c->cfg.replicas > 1 && c->cfg.devices[1].index == c->cfg.devices[0].index
                            ? "needs a GPU a replica (NCCL's reduce-scatter and all-gather), not replicas sharing one: give "
                              "--gpus N or leave it out"
                        : NULL;
        if (why) {
            if (world->rank == 0) fprintf(stderr, "mgc: --shard-update %s\n", why);
            return 2;
        }
    }
    if (world->size > 1) {   /* under mpirun, before anything else */
        char devs[MAX_REPLICAS * 12] = "";
        if (c->cfg.devices[0].kind == DEV_CPU) snprintf(devs, sizeof devs, "cpu:%d", c->cfg.replicas);
        for (int k = 0, p = 0; c->cfg.devices[0].kind == DEV_CUDA && k < c->cfg.replicas; k++)
            p += snprintf(devs + p, sizeof devs - (size_t)p, "%scuda:%d", k ? "," : "", c->cfg.devices[k].index);
        Agreement *inputs = calloc(1, sizeof *inputs);
        agree_inputs(c, devs, running, inputs);
        int differ = drv_agree_start(c, world, inputs);
        free(inputs);
        if (differ) return 2;
    }
    /* what rank 0 will write, checked before an epoch is spent */
    if (running && rt_world_max_status(world, world->rank == 0 ? check_outputs(c) : 0)) return 2;
    if (c->cfg.batch_size < c->total_replicas) {
        if (world->rank == 0)
            fprintf(stderr, "mgc: --batch-size %d is smaller than the %d devices (%s%s): every device needs an example; "
                    "use --batch-size %d or more\n(see mgc --help)\n", c->cfg.batch_size, c->total_replicas, c->devices,
                    world->size > 1 ? " on every rank" : "", c->total_replicas);
        return 2;
    }
    /* under mpirun, the ranks on one machine take its GPUs in turn: the k-th
       local rank's cuda:j is GPU k * (its devices) + j */
    int local = drv_local_rank();
    if (c->cfg.devices[0].kind == DEV_CUDA && world->size > 1 && local >= 0)
        for (int k = 0; k < c->cfg.replicas; k++) c->cfg.devices[k].index += local * c->cfg.replicas;
    if (c->cfg.devices[0].kind == DEV_CUDA && running && drv_check_gpus(c, world)) return 2;
    return 0;
}

/* --emit STAGE and --dump-kernels: a stage printed (by rank 0). The exit status. */
int drv_emit(const Cli *c, World *world, Arena *arena, Diag *diag)
{
    Graph g;
    Program p;
    bool say = world->rank == 0;
    char num[32];
    if (c->dump_kernels) {
        if (drv_compile(c, arena, diag, true, true, false, &g, &p)) return 1;
        return say ? dump_kernels(&g, &p, c->dump_kernels) : 0;
    }
    bool tr = c->emit != EMIT_EVAL_IR && c->emit != EMIT_INFER_IR;
    bool program = c->emit != EMIT_IR && c->emit != EMIT_EVAL_IR && c->emit != EMIT_GRAD && c->emit != EMIT_INFER_IR;
    if (drv_compile(c, arena, diag, tr, tr && c->emit != EMIT_IR, false, &g, program ? &p : NULL)) return 1;
    if (c->emit == EMIT_PTX) {
        char why[8192];
        size_t ptx_len;
        char *ptx = rt_nvrtc_ptx(cg_source(&p, TARGET_CUDA), g.net_name, c->arch, &ptx_len, why, sizeof why);
        if (!ptx) {
            fprintf(stderr, "mgc: --emit ptx: %s\n", why);
            return 1;
        }
        if (say) fputs(ptx, stdout);
        free(ptx);
        return 0;
    }
    if (!say) return 0;
    switch (c->emit) {
    case EMIT_IR: case EMIT_EVAL_IR: {
        int tensors;
        long n = ir_param_count(&g, &tensors);
        printf("# net %s (%s form): %s parameters in %d tensors%s\n", g.net_name, tr ? "training" : "evaluation",
               rt_commas(n, num), tensors,
               g.precision == DT_BF16 ? "; precision bf16: GEMMs multiply bf16 operands, sum and store f32" : "");
        ir_print(&g, stdout, 0, g.n);
        break;
    }
    case EMIT_INFER_IR: {
        int tensors;
        long n = ir_param_count(&g, &tensors);
        printf("# net %s (inference form: the logits alone%s): %s parameters in %d tensors\n", g.net_name,
               c->no_fold ? ", BatchNorm not folded (--no-fold)" : "", rt_commas(n, num), tensors);
        for (int k = 0; k < g.nfolds; k++) {
            const IrFold *f = &g.folds[k];
            const char *bn = f->gamma, *dot = strrchr(bn, '.');
            printf("#   %%%d %s takes in %.*s: %s = %s * s, %s = (%s - %s) * s + %s, s = %s / sqrt(%s + %g)\n", f->layer,
                   ir_op_name(g.nodes[f->layer].op), dot ? (int)(dot - bn) : (int)strlen(bn), bn, g.nodes[f->weight].name, f->w,
                   g.nodes[f->bias].name, f->b ? f->b : "0", f->mean, f->beta, f->gamma, f->var, (double)f->eps);
        }
        ir_print(&g, stdout, 0, g.n);
        break;
    }
    case EMIT_GRAD:
        if (c->cfg.optimizer == IR_ADAMW)
            printf("# net %s: training step (AdamW: lr %g, betas %g,%g, eps %g, weight decay %g)\n# forward\n", g.net_name,
                   c->cfg.lr, c->cfg.beta1, c->cfg.beta2, c->cfg.eps, c->cfg.weight_decay);
        else
            printf("# net %s: training step (lr %g, momentum %g%s, weight decay %g)\n# forward\n", g.net_name,
                   c->cfg.lr, c->cfg.momentum, c->cfg.nesterov ? " Nesterov's" : "", c->cfg.weight_decay);
        ir_print(&g, stdout, 0, g.n_forward);
        printf("# backward and update\n");
        ir_print(&g, stdout, g.n_forward, g.n);
        break;
    case EMIT_KERNELS: case EMIT_CUDA:
        printf("/* steps of the training program of %s:\n", g.net_name);
        cg_print_steps(&p, stdout);
        if (!codegen_options(c).cpu_only)   /* on GPUs: what each step would cost there */
            cg_print_cost(&p, c->gpu_model, (c->cfg.batch_size + c->total_replicas - 1) / c->total_replicas, c->total_replicas, 60000,
                          stdout);
        printf("*/\n%s", cg_source(&p, c->emit == EMIT_CUDA ? TARGET_CUDA : TARGET_C));
        break;
    case EMIT_DP:
        print_dp(c, &g, &p, world);
        break;
    case EMIT_PTX: case EMIT_NONE: case EMIT_COUNT:
        break;
    }
    return 0;
}

int drv_run(Cli *c, World *world)
{
    c->total_replicas = c->cfg.replicas * world->size;
    int status = drv_preflight(c, world);
    if (status) return status;
    Arena arena;
    arena_init(&arena);
    Diag diag;
    diag_init(&diag, stderr);
    status = drv_train(c, world, &arena, &diag);
    arena_free(&arena);
    return status;
}

/* Training, evaluation or check mode: the training and evaluation programs,
   the same on every rank, run. The exit status. */
int drv_train(Cli *c, World *world, Arena *arena, Diag *diag)
{
    Graph train_graph, eval_graph;
    Program train_prog, eval_prog;
    bool checking = c->cfg.batch_file != NULL;
    bool training = !c->cfg.evaluate;   /* --evaluate, mgc predict and evaluate: the evaluation program alone */
    bool compiled = (!training || !drv_compile(c, arena, diag, true, true, checking, &train_graph, &train_prog)) &&
                    !drv_compile(c, arena, diag, false, false, false, &eval_graph, &eval_prog);
    if (world->size > 1) {   /* the same program everywhere (a different build or environment could differ) */
        Agreement *plan = calloc(1, sizeof *plan);
        agree_program(compiled ? training ? &train_prog : &eval_prog : NULL, plan);
        int differ = rt_agree(world, plan, 0);
        free(plan);
        if (differ) return 2;
    }
    if (!compiled) return 1;
    if (training) cg_share_kernels_with(&eval_prog, &train_prog);   /* its forward kernels are the training program's */
    c->cfg.progress = isatty(2) && !checking;
    Model m = { training ? &train_prog : NULL, &eval_prog };
    return train_run(&m, &c->cfg);
}
