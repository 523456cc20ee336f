/*
** The GPU cost model: what each step of a program would cost on a named
** GPU, predicted from the program alone (no GPU needed), for
** `--emit kernels --gpus N`. Per step: its launch geometry (what
** runtime/device_cuda.c launches: a block per iteration for reductions, else
** a thread per iteration in blocks of CG_BLOCK, the grid capped at 32 blocks
** per SM with the kernel's grid-stride loop doing the rest), the bytes it
** reads and writes (each buffer it names once: its whole size), its
** arithmetic, and a time: a roofline, max(bytes / bandwidth, FLOPs / peak),
** each divided by how much of the GPU the step can fill.
**
**   Fill. Bandwidth needs bytes in flight: a kernel with fewer threads than
**   half the GPU holds (an SM holds 2048) gets that share of it; a GEMM
**   with fewer 128 x 128 output tiles than SMs gets that share of the peak,
**   after splitting a long K between blocks as cuBLAS does (a weight
**   gradient's [O, C*K*K] product over K = N*P: chunks of 512 or more).
**   So a kernel that walks whole planes with a thread each (BatchNorm's
**   apply: N*C threads, each over 49 floats a plane apart from its
**   neighbour's) is predicted slow, as it would be.
**
**   Arithmetic. GEMMs: 2 m n k. Convolutions' direct loops: 2 per
**   multiply-add of the layer. Every other kernel is element-wise or a
**   reduction: 2 per element it moves (never what bounds it).
**
**   Peaks. GEMMs in fp32 reach 80% of the fp32 peak (cuBLAS's SGEMM, no
**   TF32), in bf16 70% of the tensor cores' dense peak; generated kernels
**   compute in fp32 on the CUDA cores. Two bf16 figures: the column "bf16"
**   is autocast's storage, activations, gradients and scratch stored as bf16
**   (half the bytes), parameters, optimizer state and the inputs fp32, GEMM
**   operands bf16; "mgc bf16" is the program as compiled: in a --precision
**   bf16 program the GEMMs on the tensor cores, the buffers it stores as bf16
**   (Buf.bf16: the convolutions' packed operands) at two bytes a value and
**   the rest at four; in an fp32 program the same GEMMs on the tensor cores
**   with every tensor fp32 (what --precision bf16 gains from the GEMMs alone).
**
**   Launches. A step's kernels back to back in a CUDA graph cost each its
**   time plus graph_launch_s; launched one by one, the same or the host's
**   launch rate, launch_s, whichever is longer. Collectives (several GPUs): a ring allreduce
**   over NVLink, 2 (R - 1) / R of the bucket each way, counted in full (the
**   model does not overlap them with the backward pass: an upper bound).
**
** The constants are the vendors' published peaks and a guess at launch
** costs; tests/gpu/check.sh prints predicted against measured time per
** kernel kind, so the first GPU lent calibrates them.
*/
#include "lower_internal.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

static const CgGpuModel models[] = {
    { "h200", "NVIDIA H200 SXM", 4.8e12, 67e12, 990e12, 450e9, 3e-6, 1e-6, 132, 2048 },
    { "h100", "NVIDIA H100 SXM", 3.35e12, 67e12, 990e12, 450e9, 3e-6, 1e-6, 132, 2048 },
};

const char cg_gpu_model_names[] = "h200, h100";

const CgGpuModel *cg_gpu_model(const char *name)
{
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++)
        if (name && !strcmp(name, models[k].name)) return &models[k];
    return NULL;
}

#define GEMM_TILE 128          /* a cuBLAS SGEMM block's output tile, about */
#define GEMM_SPLIT_K 512       /* the least of K a block of a split-K GEMM takes */
#define GEMM_EFF_FP32 0.8
#define GEMM_EFF_BF16 0.7

typedef struct StepCost {
    long grid, block;          /* kernels: the launch; GEMMs: tiles, 0 */
    double read, written;      /* bytes, fp32 */
    double read16, written16;  /* bytes, bf16 storage */
    double readm, writtenm;    /* bytes, as the program stores them (Buf.bf16 at two a value) */
    double flops;
    double s32, s16;           /* seconds on the GPU, without the launch: fp32; autocast's bf16 storage */
    double smgc;               /* mgc's --precision bf16: GEMMs in bf16, tensors fp32 */
    double fill;               /* the share of the GPU the step can use, 0..1 */
    const char *bound;         /* "memory", "compute", "launch" (fp32, in a graph) */
} StepCost;

/* A kernel's kind: its name past "k12_". */
static const char *kernel_kind(const Step *s)
{
    const char *u = strchr(s->fn, '_');
    return u ? u + 1 : s->fn;
}

/* Whether kernel step s is a convolution's direct loops (its multiply-adds), not
   the data movement around a GEMM (im2col, unpack, the dense form's weights). */
static bool conv_loops(const Graph *g, const Step *s)
{
    Op op = g->nodes[s->node].op;
    if (op != OP_CONV2D && op != OP_CONV2D_BWD_X && op != OP_CONV2D_BWD_W) return false;
    const char *fn = kernel_kind(s);
    return !strncmp(fn, "conv2d", 6) && !strstr(fn, "unpack") && !strstr(fn, "dense") && !strstr(fn, "epilogue");
}

/* A buffer's bytes at batch n: all fp32, as autocast's bf16 stores it, and as the program does. */
static void buf_bytes(const Program *p, int b, long n, long touch, double *b32, double *b16, double *bm)
{
    double values = (double)cg_dim(p->bufs[b].size, n) * (p->bufs[b].bf16 ? 2 : 1);
    if (touch > 0 && values > (double)touch) values = (double)touch;   /* a chunk of it (--shard-update) */
    BufKind k = p->bufs[b].kind == BUF_VIEW && p->bufs[b].alias >= 0 ? p->bufs[p->bufs[b].alias].kind : p->bufs[b].kind;
    *b32 = 4 * values;
    *b16 = k == BUF_ACT || k == BUF_WORK ? 2 * values : 4 * values;
    *bm = p->bufs[b].bf16 ? 2 * values : 4 * values;
}

static void step_cost(const Program *p, int k, long n, const CgGpuModel *m, StepCost *c)
{
    const Step *s = &p->steps[k];
    memset(c, 0, sizeof *c);
    c->fill = 1;
    if (s->kind == STEP_KERNEL) {
        long work = cg_dim(s->work, n);
        c->block = CG_BLOCK;
        if (s->blocks) c->grid = work < (1L << 20) ? work : (1L << 20);
        else {
            c->grid = (work + CG_BLOCK - 1) / CG_BLOCK;
            if (c->grid > (long)m->sms * 32) c->grid = (long)m->sms * 32;
        }
        double threads = s->blocks ? (double)c->grid * CG_BLOCK : (double)(work < c->grid * CG_BLOCK ? work : c->grid * CG_BLOCK);
        c->fill = fmin(1.0, threads / (m->sms * m->threads_per_sm * 0.5));
        for (int j = 0; j < s->nargs; j++) {
            int b = s->args[j];
            bool seen = b < 0;
            for (int i = 0; i < j && !seen; i++) seen = s->args[i] == b;
            if (seen) continue;
            double b32, b16, bm;
            buf_bytes(p, b, n, s->touch, &b32, &b16, &bm);
            if (s->outs >> j & 1) c->written += b32, c->written16 += b16, c->writtenm += bm;
            else c->read += b32, c->read16 += b16, c->readm += bm;
        }
        if (conv_loops(p->graph, s)) {
            ConvGeom G = cg_conv_geom(p->graph, s->node);
            c->flops = 2.0 * n * G.O * G.OH * G.OW * (double)(G.C / G.groups) * G.K * G.K;
        } else {
            c->flops = 2.0 * fmax(c->read, c->written) / 4;
        }
        if (c->fill <= 0) c->fill = 1e-9;
        double mem32 = (c->read + c->written) / (m->bytes_per_s * c->fill), mem16 = (c->read16 + c->written16) / (m->bytes_per_s * c->fill);
        double memm = (c->readm + c->writtenm) / (m->bytes_per_s * c->fill);
        double fl = c->flops / (m->fp32_flops * c->fill);
        c->s32 = fmax(mem32, fl);
        c->s16 = fmax(mem16, fl);
        c->smgc = fmax(memm, fl);
        c->bound = fl > mem32 ? "compute" : "memory";
    } else if (s->kind == STEP_GEMM) {
        double M = (double)cg_dim(s->m, n), N = (double)cg_dim(s->n, n), K = (double)cg_dim(s->k, n);
        double batch = s->batch > 1 ? s->batch : 1;
        double tiles = ceil(M / GEMM_TILE) * ceil(N / GEMM_TILE) * batch;
        /* few tiles and a long K (a weight gradient: K = N*P): cuBLAS splits K between blocks,
           chunks of GEMM_SPLIT_K at least, up to filling the SMs */
        double split = fmax(1.0, fmin(floor(K / GEMM_SPLIT_K), floor(m->sms / tiles)));
        c->grid = (long)(tiles * split);
        c->fill = fmin(1.0, tiles * split / m->sms);
        c->read = 4 * (M * K + K * N + (s->beta != 0 ? M * N : 0)) * batch;
        c->written = 4 * M * N * batch;
        c->read16 = c->read / 2, c->written16 = c->written / 2;
        c->readm = c->read - (s->ab16 ? 2 * (M * K + K * N) * batch : 0), c->writtenm = c->written;   /* ab16: A and B two bytes a value */
        c->flops = 2 * M * N * K * batch;
        double mem32 = (c->read + c->written) / m->bytes_per_s, mem16 = mem32 / 2, memm = (c->readm + c->writtenm) / m->bytes_per_s;
        double fl32 = c->flops / (m->fp32_flops * GEMM_EFF_FP32 * c->fill), fl16 = c->flops / (m->bf16_flops * GEMM_EFF_BF16 * c->fill);
        c->s32 = fmax(mem32, fl32);
        c->s16 = fmax(mem16, fl16);
        c->smgc = fmax(memm, fl16);
        c->bound = fl32 > mem32 ? "compute" : "memory";
    } else if (s->kind == STEP_ALLREDUCE) {
        (void)0;   /* costed by the caller, which knows the replicas */
    }
}

/* Why a kernel fills fewer than 2 blocks per SM: its parallel loop's shape, and what
   bounds it. */
static const char *few_blocks_why(Arena *a, const Step *s, const StepCost *c, long n, const CgGpuModel *m)
{
    long work = cg_dim(s->work, n), two = 2L * m->sms * CG_BLOCK;
    if (s->blocks)
        return arena_printf(a, "a block per reduction, %ld of them, each over %.3g KB: %s", work, c->read / (double)work / 1024,
                            c->read / (double)work < 65536 ? "that little costs its launch"
                                                           : arena_printf(a, "not split into slices of the batch (BatchNorm's and the bias "
                                                                             "gradients' sums are, below %d channels)", CG_FILL_BLOCKS));
    if (s->grain > 1)
        return arena_printf(a, "%ld threads, each over %ld elements (%ld elements: a thread each would fill %.2g blocks per SM)",
                            work, s->grain, work * s->grain, (double)(work * s->grain) / CG_BLOCK / m->sms);
    return arena_printf(a, "%ld element%s in all, a thread each: the tensor is that small (%ld would fill 2 blocks per SM); "
                           "it costs its launch", work, work == 1 ? "" : "s", two);
}

/* The ten costliest kernels and GEMMs of p (their costs c), fp32, and their share of the step. */
static void print_costliest(const Program *p, const StepCost *c, double graph32, FILE *out)
{
    int top[10], nt = 0, ns = p->nsteps;
    for (; nt < 10; nt++) {
        int best = -1;
        for (int k = 0; k < ns; k++) {
            if (p->steps[k].kind != STEP_KERNEL && p->steps[k].kind != STEP_GEMM) continue;
            bool taken = false;
            for (int i = 0; i < nt && !taken; i++) taken = top[i] == k;
            if (!taken && (best < 0 || c[k].s32 > c[best].s32)) best = k;
        }
        if (best < 0) break;
        top[nt] = best;
    }
    fprintf(out, "  the %d costliest steps (fp32):", nt);
    for (int i = 0; i < nt; i++) {
        const Step *s = &p->steps[top[i]];
        fprintf(out, "%s step %d %s %.1f us (%.0f%%)", i ? "," : "", top[i], s->kind == STEP_KERNEL ? s->fn : "gemm", c[top[i]].s32 * 1e6,
                graph32 > 0 ? 100 * c[top[i]].s32 / graph32 : 0);
    }
    fprintf(out, "\n");
}

void cg_print_cost(const Program *p, const CgGpuModel *m, long batch, int replicas, long train_examples, FILE *out)
{
    Arena *a = p->arena;
    int ns = p->nsteps;
    StepCost *c = arena_alloc(a, sizeof(StepCost) * (size_t)(ns ? ns : 1));
    double graph32 = 0, graph16 = 0, launched32 = 0, launched16 = 0, comm = 0, graphmgc = 0;
    int kernels = 0, gemms = 0, few = 0;
    fprintf(out, "  cost model: %s (--gpu-model %s): %.2g TB/s, %.3g TFLOP/s fp32, %.3g TFLOP/s bf16 dense, %d SMs; a launch %.1f us alone, "
                 "%.1f us in a CUDA graph; batch %ld per GPU%s\n",
            m->words, m->name, m->bytes_per_s / 1e12, m->fp32_flops / 1e12, m->bf16_flops / 1e12, m->sms, m->launch_s * 1e6,
            m->graph_launch_s * 1e6, batch, replicas > 1 ? arena_printf(a, ", %d GPUs (NVLink %.0f GB/s each way)", replicas, m->link_bytes_per_s / 1e9) : "");
    fprintf(out, "  step %-34s %14s %7s %9s %9s %10s %9s %9s %9s  %s\n", "", "grid x block", "blk/SM", "read MB", "write MB", "MFLOP", "fp32 us",
            "bf16 us", "mgc us", "bound");
    for (int k = 0; k < ns; k++) {
        const Step *s = &p->steps[k];
        step_cost(p, k, batch, m, &c[k]);
        if (s->kind == STEP_ALLREDUCE && replicas > 1) {
            const Collective *cl = &p->colls[s->coll];
            /* a ring: an allreduce sends 2(N-1)/N of the data, a reduce-scatter or all-gather (--shard-update) half that */
            double t = (cl->kind == COLL_ALLREDUCE ? 2.0 : 1.0) * (replicas - 1) / replicas * 4.0 * (double)cl->floats / m->link_bytes_per_s;
            c[k].s32 = c[k].s16 = c[k].smgc = t;
            comm += t;
            fprintf(out, "  step %-3d %-14s c%-15d %14s %7s %9.2f %9s %10s %9.1f %9.1f %9.1f  link\n", k, cg_coll_name(cl->kind), s->coll, "", "",
                    4.0 * (double)cl->floats / 1e6, "", "", t * 1e6, t * 1e6, t * 1e6);
            continue;
        }
        if (s->kind != STEP_KERNEL && s->kind != STEP_GEMM) continue;
        const char *what = s->kind == STEP_KERNEL ? s->fn
                                                  : arena_printf(a, "gemm %ldx%ldx%ld%s", cg_dim(s->m, batch), cg_dim(s->n, batch), cg_dim(s->k, batch),
                                                                 s->batch > 1 ? arena_printf(a, " x%d", s->batch) : "");
        const char *geom = s->kind == STEP_KERNEL ? arena_printf(a, "%ld x %ld", c[k].grid, c[k].block) : arena_printf(a, "%ld tiles", c[k].grid);
        double per_sm = (double)c[k].grid / m->sms;
        bool launch_bound = c[k].s32 < m->graph_launch_s;
        fprintf(out, "  step %-3d %-30.30s %14s %7.1f %9.2f %9.2f %10.1f %9.1f %9.1f %9.1f  %s\n", k, what, geom, per_sm, c[k].read / 1e6,
                c[k].written / 1e6, c[k].flops / 1e6, c[k].s32 * 1e6, c[k].s16 * 1e6, c[k].smgc * 1e6, launch_bound ? "launch" : c[k].bound);
        graph32 += c[k].s32 + m->graph_launch_s;
        graph16 += c[k].s16 + m->graph_launch_s;
        graphmgc += c[k].smgc + m->graph_launch_s;
        launched32 += fmax(c[k].s32 + m->graph_launch_s, m->launch_s);   /* the GPU's gap between kernels, or the host's rate */
        launched16 += fmax(c[k].s16 + m->graph_launch_s, m->launch_s);
        if (s->kind == STEP_KERNEL) {
            kernels++;
            few += per_sm < 2;
        } else {
            gemms++;
        }
    }
    graph32 += comm, graph16 += comm, launched32 += comm, launched16 += comm, graphmgc += comm;
    long global = batch * (replicas > 0 ? replicas : 1);
    long steps = (train_examples + global - 1) / global;
    fprintf(out, "  predicted step (%d kernels, %d GEMMs%s): fp32 %.2f ms in a CUDA graph (%.2f ms launched one by one), bf16 %.2f ms (%.2f)\n",
            kernels, gemms, comm > 0 ? arena_printf(a, ", collectives %.2f ms not overlapped", comm * 1e3) : "", graph32 * 1e3,
            launched32 * 1e3, graph16 * 1e3, launched16 * 1e3);
    fprintf(out, "  predicted epoch of %ld examples (%ld steps of %ld): fp32 %.2f s, bf16 %.2f s (in CUDA graphs; training steps only)\n",
            train_examples, steps, global, graph32 * (double)steps, graph16 * (double)steps);
    if (p->graph && p->graph->precision == DT_BF16)
        fprintf(out, "  this program, mgc's --precision bf16 (GEMMs on the tensor cores, the convolutions' packed operands and the "
                     "gradients they pack stored bf16, every other tensor fp32): step %.2f ms, epoch %.2f s; bf16 above is autocast's storage (activations and "
                     "gradients in bf16)\n", graphmgc * 1e3, graphmgc * (double)steps);
    else
        fprintf(out, "  with the GEMMs alone on the tensor cores (every tensor fp32): step %.2f ms, epoch %.2f s; bf16 above is autocast's "
                     "storage (activations and gradients in bf16); --emit kernels --precision bf16 predicts mgc's bf16 as it runs\n",
                graphmgc * 1e3, graphmgc * (double)steps);
    print_costliest(p, c, graph32, out);
    if (few) {   /* by kind (the name past "k12_"): how many, their blocks per SM, the first one's loop */
        fprintf(out, "  %d of %d kernels fill fewer than 2 blocks per SM at this batch, by kind:\n", few, kernels);
        bool *told = arena_alloc(a, sizeof(bool) * (size_t)ns);
        memset(told, 0, sizeof(bool) * (size_t)ns);
        for (int k = 0; k < ns; k++) {
            const Step *s = &p->steps[k];
            if (s->kind != STEP_KERNEL || told[k] || (double)c[k].grid / m->sms >= 2) continue;
            const char *kind = kernel_kind(s);
            int count = 0;
            double lo = 1e30, hi = 0;
            for (int j = k; j < ns; j++) {
                const Step *t = &p->steps[j];
                if (t->kind != STEP_KERNEL || told[j] || (double)c[j].grid / m->sms >= 2 || strcmp(kernel_kind(t), kind)) continue;
                told[j] = true;
                count++;
                lo = fmin(lo, (double)c[j].grid / m->sms), hi = fmax(hi, (double)c[j].grid / m->sms);
            }
            fprintf(out, "    %-28s %3d step%s, %.2g%s blocks per SM; step %d: %s\n", kind, count, count == 1 ? " " : "s", lo,
                    hi > lo ? arena_printf(a, " to %.2g", hi) : "", k, few_blocks_why(a, s, &c[k], batch, m));
        }
    }
}
