/*
** mgc export --format c|cuda: the evaluation program as a standalone
** inference library (export.h), written into one directory:
**
**   model.h           the API: a context from the weights, predict N images
**                     into N x classes logits, free; the input's shape and
**                     transform, the checkpoint it came from
**   model.c           mgc's own kernels for the program (the text its CPU device
**                     compiles, prelude included) and the program's schedule,
**                     its steps in order as straight-line calls (C); for CUDA
**                     the schedule alone, the kernels in model_kernels.cu
**   model.safetensors the weights the program reads, by its buffers' names
**                     (BatchNorm folded into a layer: the folded values)
**   Makefile          libmodel.a and the example mgc_predict
**   model_st.[ch], model_cpu.[ch] | model_cuda.[ch], mgc_predict.c
**                     the fixed files (export/clib/, as they are)
**
** Requires: the program compiled from the inference rewrite's graph
** (ir_infer: the logits the one output), fp32, for the CPU (cpu_only) or for
** GPUs. On top of mgc's schedule, one change: the steps that read only the
** weights and what such steps made (BatchNorm's statistics, Winograd's and the
** dense form's transformed filters) run once, when a context is made; their
** outputs keep their memory, and the rest is planned again (cg_plan_memory)
** without them. Each kernel still runs on the data mgc's would, so the logits
** are mgc predict's, bit for bit, where the compiler, its flags and the BLAS
** are the same.
*/
#include "export.h"
#include "clib.h"
#include "runtime.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What the library is made of: the program with its once-only steps taken
   out, and where every buffer lives. */
typedef struct Lib {
    const ExModel *m;
    const Program *p;         /* as compiled */
    Program q;                /* its copy: buffers made once are BUF_KEEP, steps only those of a run, planned again */
    bool cuda;
    int *once;                /* step ids of p run once at creation, in order */
    int nonce;
    size_t *slot_at;          /* bytes into the workspace, per slot of q */
    size_t workspace;         /* bytes */
    long *weight_at, weight_floats;   /* per buffer: floats into the weights' block (persistent), or -1 */
    long *keep_at, keep_floats;       /* per buffer: floats into the block kept between runs (BUF_KEEP), or -1 */
    int nweights;
    bool blas;                /* a GEMM step, or a kernel that calls CBLAS */
    const char *dir;
    char *err;
    size_t err_size;
} Lib;

/* The activations a lane of a CPU library aims at: near a core's cache (MobileNetV2 at 28x28, 1.2 MB an image:
   3 images a lane; lanes of 2 to 8 measured 984 to 1,056 images/s, against 843 with both threads on every
   kernel of one piece of 256, 2 threads) */
#define LANE_BYTES (4.0 * 1048576)
#define LANE_MAX 32   /* and pieces enough to share out: 256 images, 8 pieces at most */

static int fail(Lib *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Lib *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err, L->err_size, fmt, ap);
    va_end(ap);
    return -1;
}

/* "%12 conv2d (net.net:9)": where a step's node is, for messages */
static const char *where(const Lib *L, int node, char *buf, size_t size)
{
    const Node *n = &L->p->graph->nodes[node];
    if (n->loc.file) snprintf(buf, size, "%%%d %s (%s:%d)", node, ir_op_name(n->op), n->loc.file->name, n->loc.line);
    else snprintf(buf, size, "%%%d %s", node, ir_op_name(n->op));
    return buf;
}

static const char *step_text(const Program *p, const Step *s, size_t *len)
{
    *len = (size_t)(s->src_end - s->src_begin);
    return p->source + s->src_begin;
}

static bool text_has(const char *t, size_t len, const char *what)
{
    size_t n = strlen(what);
    for (size_t k = 0; k + n <= len; k++)
        if (!memcmp(t + k, what, n)) return true;
    return false;
}

/* What the library cannot run: a collective, a seeded or optimizer step, a
   bf16 GEMM or buffer (exports are fp32), a C-only kernel in a CUDA program. */
static int check_program(Lib *L)
{
    const Program *p = L->p;
    char at[256];
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        size_t len = 0;
        const char *t = s->kind == STEP_KERNEL ? step_text(p, s, &len) : "";
        if (s->kind == STEP_ALLREDUCE || s->kind == STEP_WAIT)
            return fail(L, "%s: a collective (step %d) has no place in a library of one device", where(L, s->node, at, sizeof at), k);
        if (s->kind == STEP_KERNEL && (s->seeded || s->sgd))
            return fail(L, "%s: kernel %s %s; the library runs the evaluation form, which has none",
                        where(L, s->node, at, sizeof at), s->fn, s->seeded ? "draws random numbers" : "updates parameters");
        if ((s->kind == STEP_GEMM && (s->bf16 || s->ab16)) || text_has(t, len, "mgc_sbgemm"))
            return fail(L, "%s: step %d multiplies in bf16; the library is fp32 (internal: the export compiles fp32)",
                        where(L, s->node, at, sizeof at), k);
        if (L->cuda && s->c_only)
            return fail(L, "%s: kernel %s is C only (internal: a CUDA program has none)", where(L, s->node, at, sizeof at), s->fn);
        if (s->kind == STEP_KERNEL && s->shared)
            return fail(L, "internal: kernel %s runs another program's code", s->fn);
        L->blas |= s->kind == STEP_GEMM || text_has(t, len, "cblas_sgemm(");
    }
    for (int b = 0; b < p->nbufs; b++)
        if (p->bufs[b].bf16) return fail(L, "internal: buffer %d (%s) is bf16; the library is fp32", b, p->bufs[b].name);
    if (p->input < 0 || p->logits < 0 || p->classes <= 0) return fail(L, "internal: the program has no input or no logits");
    return 0;
}

/* The identifier N used in a kernel's body beyond its header's two
   ("const long N = a.batch; (void)N;"): the kernel depends on the batch. */
static bool reads_batch(const Program *p, const Step *s)
{
    size_t len;
    const char *t = step_text(p, s, &len);
    int uses = 0;
    for (size_t k = 0; k < len; k++) {
        bool before = k > 0 && (t[k - 1] == '_' || (t[k - 1] >= 'a' && t[k - 1] <= 'z') || (t[k - 1] >= 'A' && t[k - 1] <= 'Z') ||
                                (t[k - 1] >= '0' && t[k - 1] <= '9'));
        char after = k + 1 < len ? t[k + 1] : ' ';
        bool word_end = !(after == '_' || (after >= 'a' && after <= 'z') || (after >= 'A' && after <= 'Z') || (after >= '0' && after <= '9'));
        if (t[k] == 'N' && !before && word_end) uses++;
        if (k + 1 < len && t[k] == '/' && t[k + 1] == '*') {   /* comments say [N,64,28,28] */
            const char *close = strstr(t + k + 2, "*/");
            k = close ? (size_t)(close - t) + 1 : len;
        }
    }
    return uses > 2;
}

static int base_of(const Program *p, int b)
{
    while (b >= 0 && p->bufs[b].kind == BUF_VIEW) b = p->bufs[b].alias;
    return b;
}

/* The steps that run once: those whose inputs are all weights or made by
   such steps, with nothing of the batch in their sizes or text, writing
   buffers of their own that no other step writes. Then the plan again. */
static int plan(Lib *L)
{
    const Program *p = L->p;
    int nb = p->nbufs, ns = p->nsteps;
    bool *fixed = calloc((size_t)nb + 1, sizeof(bool)), *once = calloc((size_t)ns + 1, sizeof(bool));
    int *writers = calloc((size_t)nb + 1, sizeof(int));
    for (int b = 0; b < nb; b++) fixed[b] = p->bufs[b].kind == BUF_PERSISTENT;
    for (int k = 0; k < ns; k++) {
        const Step *s = &p->steps[k];
        if (s->kind == STEP_GEMM) writers[base_of(p, s->c)]++;
        for (int j = 0; s->kind == STEP_KERNEL && j < s->nargs; j++)
            if (s->outs >> j & 1 && s->args[j] >= 0) writers[base_of(p, s->args[j])]++;
    }
    for (bool more = true; more;) {
        more = false;
        for (int k = 0; k < ns; k++) {
            const Step *s = &p->steps[k];
            if (once[k] || (s->kind != STEP_KERNEL && s->kind != STEP_GEMM)) continue;
            int in[CG_MAXARGS + 3], out[CG_MAXARGS + 1], ni = 0, no = 0;
            bool ok = true;
            if (s->kind == STEP_GEMM) {
                in[ni++] = s->a, in[ni++] = s->b;
                if (s->beta != 0) in[ni++] = s->c;
                out[no++] = s->c;
                ok = !s->m.batch && !s->n.batch && !s->k.batch;
            } else {
                for (int j = 0; j < s->nargs; j++)
                    if (s->args[j] >= 0) {
                        if (s->outs >> j & 1) out[no++] = s->args[j];
                        else in[ni++] = s->args[j];
                    }
                ok = !s->work.batch && !reads_batch(p, s);
            }
            for (int j = 0; ok && j < ni; j++) ok = fixed[base_of(p, in[j])];
            for (int j = 0; ok && j < no; j++) {
                const Buf *b = &p->bufs[out[j]];
                ok = (b->kind == BUF_ACT || b->kind == BUF_WORK) && !b->pinned && !b->size.batch && writers[out[j]] == 1;
            }
            if (!ok || no == 0) continue;
            once[k] = true;
            for (int j = 0; j < no; j++) fixed[out[j]] = true;
            more = true;
        }
    }
    /* the copy: what the once-only steps write kept (BUF_KEEP), the rest planned by liveness again */
    Program *q = &L->q;
    *q = *p;
    q->bufs = arena_alloc(p->arena, sizeof(Buf) * (size_t)(nb + 1));
    memcpy(q->bufs, p->bufs, sizeof(Buf) * (size_t)nb);
    q->steps = arena_alloc(p->arena, sizeof(Step) * (size_t)(ns + 1));
    q->nsteps = 0;
    L->once = arena_alloc(p->arena, sizeof(int) * (size_t)(ns + 1));
    for (int k = 0; k < ns; k++) {
        if (once[k]) L->once[L->nonce++] = k;
        else q->steps[q->nsteps++] = p->steps[k];
    }
    for (int b = 0; b < nb; b++)
        if (fixed[b] && p->bufs[b].kind != BUF_PERSISTENT) q->bufs[b].kind = BUF_KEEP;
    cg_plan_memory(q, p->plan_batch);
    if (!L->cuda && !L->m->batch_given) {   /* a lane a thread (api_cpu.inc): as many images as keep its activations near a core's cache */
        long lane = (long)(LANE_BYTES / (double)(cg_plan_bytes(q, 1) > 0 ? cg_plan_bytes(q, 1) : 1));
        lane = lane < 1 ? 1 : lane > LANE_MAX ? LANE_MAX : lane;
        lane = lane > p->plan_batch ? p->plan_batch : lane;
        if (lane != p->plan_batch) cg_plan_memory(q, lane);
    }
    char why[256];
    int rc = cg_verify(q, why, sizeof why) ? fail(L, "internal: the library's program is inconsistent: %s", why) : 0;
    free(fixed), free(once), free(writers);
    if (rc) return rc;
    /* where each buffer lives: slots at 64-byte boundaries in one workspace (as runtime/exec.c lays
       them), weights and kept buffers each 64-byte aligned in a block of their own */
    L->slot_at = arena_alloc(p->arena, sizeof(size_t) * (size_t)(q->nslots + 1));
    for (int t = 0; t < q->nslots; t++) {
        L->slot_at[t] = L->workspace;
        L->workspace += (q->slot_bytes[t] + 63) / 64 * 64;
    }
    L->weight_at = arena_alloc(p->arena, sizeof(long) * (size_t)(nb + 1));
    L->keep_at = arena_alloc(p->arena, sizeof(long) * (size_t)(nb + 1));
    for (int b = 0; b < nb; b++) {
        L->weight_at[b] = L->keep_at[b] = -1;
        long floats = cg_dim(q->bufs[b].size, q->plan_batch);
        if (q->bufs[b].kind == BUF_PERSISTENT) {
            L->weight_at[b] = L->weight_floats;
            L->weight_floats += (floats + 15) / 16 * 16;
            L->nweights++;
        } else if (q->bufs[b].kind == BUF_KEEP) {
            L->keep_at[b] = L->keep_floats;
            L->keep_floats += (floats + 15) / 16 * 16;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ the weights */

/* Tensor `name` of the checkpoint as numel floats (malloc), or NULL said. */
static float *checkpoint_tensor(Lib *L, const char *name, long numel)
{
    const StTensor *t = st_find(L->m->weights, name);
    if (!t) return fail(L, "the checkpoint %s has no tensor '%s', which the net reads", L->m->checkpoint, name), NULL;
    if (st_numel(t) != numel)
        return fail(L, "the checkpoint's '%s' has %lld elements; the net's has %ld", name, st_numel(t), numel), NULL;
    float *v = malloc(sizeof(float) * (size_t)(numel > 0 ? numel : 1));
    if (!v || st_to_f32(t, v)) {
        free(v);
        return fail(L, "the checkpoint's '%s' (%s) cannot be read as floats", name, t->dtype), NULL;
    }
    return v;
}

/* model.safetensors: every persistent buffer's values by its name, each fold's computed */
static int write_weights(Lib *L, const char *path)
{
    const Graph *g = L->p->graph;
    const Program *q = &L->q;
    StWriter *w = st_writer_new();
    int rc = 0;
    for (int b = 0; b < q->nbufs && !rc; b++) {
        const Buf *buf = &q->bufs[b];
        if (buf->kind != BUF_PERSISTENT) continue;
        long numel = cg_dim(buf->size, 1);
        long long shape[IR_MAXDIM];
        for (int k = 0; k < buf->shape.nd; k++) shape[k] = buf->shape.d[k];
        const IrFold *f = NULL;
        bool is_bias = false;
        for (int k = 0; k < g->nfolds && !f; k++)
            if (g->folds[k].weight == buf->node || g->folds[k].bias == buf->node) f = &g->folds[k], is_bias = g->folds[k].bias == buf->node;
        float *v;
        if (!f) {
            v = checkpoint_tensor(L, buf->name, numel);
        } else {   /* the layer's weight and bias with the BatchNorm in them */
            long wn = (long)f->channels * f->per_channel, c = f->channels;
            float *wt = checkpoint_tensor(L, f->w, wn), *bt = f->b ? checkpoint_tensor(L, f->b, c) : NULL;
            float *ga = checkpoint_tensor(L, f->gamma, c), *be = checkpoint_tensor(L, f->beta, c);
            float *mu = checkpoint_tensor(L, f->mean, c), *va = checkpoint_tensor(L, f->var, c);
            float *wo = malloc(sizeof(float) * (size_t)wn), *bo = malloc(sizeof(float) * (size_t)c);
            bool ok = wt && (bt || !f->b) && ga && be && mu && va && wo && bo;
            if (ok) ir_fold_values(f, wt, bt, ga, be, mu, va, wo, bo);
            if (!ok && wo && bo) rc = -1;
            v = ok ? (is_bias ? bo : wo) : NULL;
            if (ok) free(is_bias ? wo : bo);
            else free(wo), free(bo);
            free(wt), free(bt), free(ga), free(be), free(mu), free(va);
        }
        if (!v) {
            rc = -1;
            if (!L->err[0]) fail(L, "out of memory");
            break;
        }
        st_writer_add_f32(w, buf->name, buf->shape.nd, shape, v);
        free(v);
    }
    if (!rc) {
        st_writer_set_meta(w, "net", g->net_name);
        st_writer_set_meta(w, "checkpoint", L->m->checkpoint);
        st_writer_set_meta(w, "format", "mgc export: the tensors model.c reads, by name (BatchNorm folded where named a+b)");
        rc = st_writer_save(w, path, L->err, L->err_size);
    }
    st_writer_free(w);
    return rc;
}

/* ------------------------------------------------------------ files */

static FILE *create(Lib *L, const char *name, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", L->dir, name);
    FILE *f = fopen(path, "w");
    if (!f) fail(L, "cannot write %s: %s", path, strerror(errno));
    return f;
}

static int done(Lib *L, FILE *f, const char *path)
{
    bool bad = ferror(f) != 0;
    if (fclose(f) || bad) return fail(L, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

static int copy_fixed(Lib *L, const char *name)
{
    const ExClibFile *c = ex_clib_file(name);
    char path[4200];
    if (!c) return fail(L, "internal: mgc holds no %s", name);
    FILE *f = create(L, name, path, sizeof path);
    if (!f) return -1;
    fputs(c->text, f);
    return done(L, f, path);
}

/* A Dim as C text of the batch n: "64L * n" or "64L" */
static const char *dim_text(char *buf, size_t size, Dim d)
{
    if (d.batch) snprintf(buf, size, d.c == 1 ? "n" : "%ldL * n", d.c);
    else snprintf(buf, size, "%ldL", d.c);
    return buf;
}

/* The transform, in words, for the header */
static void transform_comment(const Lib *L, FILE *f)
{
    const CkModel *info = L->m->info;
    fprintf(f, "** Input: n images of MODEL_INPUT_C x MODEL_INPUT_H x MODEL_INPUT_W floats each (n, C, H, W;\n"
               "** row-major), %s.\n",
            info->pixels == CK_PIXELS_FLOATS ? "the values as the training data stored them (it was F32)"
                                             : "as torchvision's ToTensor gives them: each byte divided by 255");
    if (info->normalize) {
        fprintf(f, "** mgc_model_predict normalises them as the model was trained, per channel c:\n"
                   "** (x - mean[c]) / std[c] in float, with the training set's statistics\n**   mean {");
        for (int k = 0; k < info->nchannels; k++) fprintf(f, "%s%.9g", k ? ", " : " ", (double)info->mean[k]);
        fprintf(f, " }\n**   std  {");
        for (int k = 0; k < info->nchannels; k++) fprintf(f, "%s%.9g", k ? ", " : " ", (double)info->std[k]);
        fprintf(f, " }\n");
    } else {
        fprintf(f, "** The model was trained without --normalize: predict takes them as they are.\n");
    }
    if (info->resize_h > 0)
        fprintf(f, "** It was trained with --resize %dx%d: give images of that size (mgc resized the stored\n"
                   "** images bilinearly, as torchvision's Resize(antialias=False)); predict does not resize.\n",
                info->resize_h, info->resize_w);
    if (!info->has_transform)
        fprintf(f, "** (The checkpoint does not say how its images were transformed: an older mgc's.)\n");
}

static int write_header(Lib *L)
{
    const Program *p = L->p;
    char path[4200];
    FILE *f = create(L, "model.h", path, sizeof path);
    if (!f) return -1;
    const Shape *in = &p->input_shape;
    fprintf(f, "/*\n** model.h: the net %s as a standalone %s inference library, made by mgc %s\n"
               "** (mgc export --format %s) from the checkpoint %s.\n**\n",
            L->m->net_name, L->cuda ? "CUDA" : "C", MGC_VERSION, L->cuda ? "cuda" : "c", L->m->checkpoint);
    transform_comment(L, f);
    fprintf(f, "** Output: n x MODEL_CLASSES logits (floats, row-major): softmax's input; the class is the\n"
               "** largest's index.\n**\n"
               "** The weights are a file beside the library, model.safetensors (or a copy elsewhere): a\n"
               "** context reads them once. %s\n",
            L->m->graph->nfolds ? "Each BatchNorm after a convolution or linear layer is folded into that\n"
                                  "** layer's weights (w * gamma / sqrt(var + eps), computed in double): the logits differ from\n"
                                  "** mgc predict's by float rounding (mgc export --no-fold: the same bits)."
                                : "The logits are mgc predict's, bit for bit, built with the same compiler and\n"
                                  "** flags (the Makefile's) and the same BLAS on the same kind of CPU.");
    if (L->cuda)
        fprintf(f, "** A context is one GPU's (the device's primary context, a stream and a cuBLAS handle of its\n"
                   "** own); contexts are independent, and one context may be shared by threads (predict\n"
                   "** takes a lock).\n");
    else
        fprintf(f, "** A context owns its threads and memory; contexts are independent (no state outside them),\n"
                   "** and one context may be shared by threads (predict takes a lock). Given more than\n"
                   "** MODEL_MAX_BATCH images, each thread runs pieces of its own (a lane: MODEL_MAX_BATCH images\n"
                   "** at a time, chosen by mgc export to keep a piece's activations near a core's cache;\n"
                   "** --batch-size sets it); given fewer, the threads share each kernel of the one piece. The\n"
                   "** library sets OpenBLAS to one thread of its own where OpenBLAS is linked.\n");
    fprintf(f, "*/\n#ifndef MGC_MODEL_H\n#define MGC_MODEL_H\n#include <stddef.h>\n\n"
               "#define MODEL_INPUT_C %d\n#define MODEL_INPUT_H %d\n#define MODEL_INPUT_W %d\n#define MODEL_CLASSES %d\n"
               "#define MODEL_MAX_BATCH %ld   /* images %s; predict takes any n, in pieces of at most this many */\n"
               "#define MODEL_CUDA %d\n\n",
            in->d[1], in->nd > 2 ? in->d[2] : 1, in->nd > 3 ? in->d[3] : 1, p->classes, L->q.plan_batch,
            L->cuda ? "run together" : "a thread runs together", L->cuda ? 1 : 0);
    fprintf(f, "typedef struct mgc_model mgc_model;\n\n"
               "/* A context from the weights file (model.safetensors): %s.\n"
               "   NULL, with a message in err, where the file is not this model's or memory is short. */\n"
               "mgc_model *mgc_model_new(const char *weights_path, int %s, char *err, size_t err_size);\n"
               "/* The logits of n images (n * MODEL_CLASSES floats into logits): 0, or -1 (mgc_model_error says why). */\n"
               "int mgc_model_predict(mgc_model *m, const float *images, long n, float *logits);\n"
               "/* What the last call that failed on m said. */\n"
               "const char *mgc_model_error(const mgc_model *m);\n"
               "void mgc_model_free(mgc_model *m);\n\n#endif\n",
            L->cuda ? "device is the GPU's ordinal (0: the first)" : "threads it runs on (0: as many as this process may use)",
            L->cuda ? "device" : "threads");
    return done(L, f, path);
}

/* ------------------------------------------------------------ model.c */

/* The name a kernel step calls: its own, or its twin's (the first kernel of the same code) */
static const char *callee(const Step *s) { return s->sym ? s->sym : s->fn; }

/* A step's line(s) of the schedule. cuda: kernels by their index in kernel_names */
static void emit_step(const Lib *L, FILE *f, const Step *s, int k)
{
    const Program *p = L->p;
    const Node *n = &p->graph->nodes[s->node];
    char w[64], d[10][48];
    fprintf(f, "    /* step %d: %%%d %s %s", k, s->node, ir_op_name(n->op), ir_shape_str(p->arena, &n->shape));
    if (n->loc.file) fprintf(f, " (%s:%d)", n->loc.file->name, n->loc.line);
    fprintf(f, " */\n");
    if (s->kind == STEP_KERNEL) {
        if (L->cuda) {
            int index = 0;
            for (int j = 0; j < p->nsteps; j++)
                if (cg_own_code(&p->steps[j])) {
                    if (!strcmp(p->steps[j].fn, callee(s))) break;
                    index++;
                }
            fprintf(f, "    K(%d /* %s */, %s, %d", index, callee(s), dim_text(w, sizeof w, s->work), s->blocks ? 1 : 0);
        } else {
            fprintf(f, "    K(%s, %s, %d, %ldL", callee(s), dim_text(w, sizeof w, s->work), s->heavy || s->blocks ? 1 : 0, s->grain);
        }
        for (int j = 0; j < s->nargs; j++) {
            if (s->args[j] >= 0) fprintf(f, ", B(%d)", s->args[j]);
            else fprintf(f, ", NULL");
        }
        fprintf(f, ");\n");
    } else {
        fprintf(f, "    G(%d, %d, (int)(%s), (int)(%s), (int)(%s), %#.9gf, B(%d), (int)(%s), B(%d), (int)(%s), %#.9gf, B(%d), (int)(%s), %d, %s, %s, %s);\n",
                s->ta, s->tb, dim_text(d[0], sizeof d[0], s->m), dim_text(d[1], sizeof d[1], s->n), dim_text(d[2], sizeof d[2], s->k),
                (double)s->alpha, s->a, dim_text(d[3], sizeof d[3], s->lda), s->b, dim_text(d[4], sizeof d[4], s->ldb), (double)s->beta,
                s->c, dim_text(d[5], sizeof d[5], s->ldc), s->batch, dim_text(d[6], sizeof d[6], s->sa), dim_text(d[7], sizeof d[7], s->sb),
                dim_text(d[8], sizeof d[8], s->sc));
    }
}

/* Where every buffer is: bind() */
static void emit_bind(const Lib *L, FILE *f)
{
    const Program *q = &L->q;
    fprintf(f, "/* every buffer of the program: a weight, a buffer kept from run to run (made once), a slot of the\n"
               "   memory plan in the workspace, or a view into another */\nstatic void bind(Lane *m)\n{\n");
    for (int b = 0; b < q->nbufs; b++) {
        const Buf *u = &q->bufs[b];
        const char *what = u->origin ? u->origin : u->name ? u->name : "";
        if (u->kind == BUF_PERSISTENT) fprintf(f, "    m->b[%d] = m->weights + %ld;   /* %s */\n", b, L->weight_at[b], u->name);
        else if (u->kind == BUF_KEEP) fprintf(f, "    m->b[%d] = m->keep + %ld;   /* %s%s%s */\n", b, L->keep_at[b], u->name ? u->name : "",
                                                  u->origin ? ": " : "", u->origin ? u->origin : "");
        else if (q->slot[b] >= 0)
            fprintf(f, "    m->b[%d] = (float *)(m->workspace + %zu);   /* slot %d: %s */\n", b, L->slot_at[q->slot[b]], q->slot[b], what);
    }
    for (int b = 0; b < q->nbufs; b++)
        if (q->bufs[b].kind == BUF_VIEW) fprintf(f, "    m->b[%d] = m->b[%d] + %d;   /* a view */\n", b, q->bufs[b].alias, q->bufs[b].offset);
    fprintf(f, "}\n\n");
}

static void emit_schedule(const Lib *L, FILE *f)
{
    const Program *p = L->p, *q = &L->q;
    fprintf(f, "/* once, when a context is made: the steps that read only the weights */\nstatic void run_once(Lane *m)\n{\n"
               "    const long n = MODEL_MAX_BATCH;\n    (void)n;\n");
    for (int i = 0; i < L->nonce; i++) emit_step(L, f, &p->steps[L->once[i]], L->once[i]);
    fprintf(f, "}\n\n/* a run: n images (at most MODEL_MAX_BATCH) in B(%d) to their logits in B(%d) */\n"
               "static void run(Lane *m, long n)\n{\n", q->input, q->logits);
    for (int k = 0, i = 0; k < p->nsteps; k++) {
        if (i < L->nonce && L->once[i] == k) {
            i++;
            continue;
        }
        emit_step(L, f, &p->steps[k], k);
    }
    fprintf(f, "}\n\n");
}

/* The weights' table and the sizes */
static void emit_tables(const Lib *L, FILE *f)
{
    const Program *q = &L->q;
    const CkModel *info = L->m->info;
    fprintf(f, "/* the weights: model.safetensors's tensors (F32), each at `at` floats into the weights' block */\n"
               "#define NWEIGHTS %d\nstatic const struct { const char *name; int nd; long long shape[4]; long at; } weights[NWEIGHTS] = {\n",
            L->nweights);
    for (int b = 0; b < q->nbufs; b++) {
        const Buf *u = &q->bufs[b];
        if (u->kind != BUF_PERSISTENT) continue;
        fprintf(f, "    { \"%s\", %d, {", u->name, u->shape.nd);
        for (int k = 0; k < u->shape.nd; k++) fprintf(f, "%s%d", k ? ", " : " ", u->shape.d[k]);
        fprintf(f, " }, %ld },\n", L->weight_at[b]);
    }
    fprintf(f, "};\n#define WEIGHT_FLOATS %ldL\n#define KEEP_FLOATS %ldL\n#define WORKSPACE_BYTES ((size_t)%zu)   /* the plan's %d slots */\n"
               "#define NBUFS %d\n#define INPUT_FLOATS ((long)MODEL_INPUT_C * MODEL_INPUT_H * MODEL_INPUT_W)\n\n",
            L->weight_floats, L->keep_floats, L->workspace, q->nslots, q->nbufs);
    fprintf(f, "/* the transform the model was trained with (mgc's data/transform.c: the same float operations) */\n");
    if (info->normalize) {
        fprintf(f, "static const float norm_mean[MODEL_INPUT_C] = {");
        for (int k = 0; k < info->nchannels; k++) fprintf(f, "%s%#.9gf", k ? ", " : " ", (double)info->mean[k]);
        fprintf(f, " }, norm_std[MODEL_INPUT_C] = {");
        for (int k = 0; k < info->nchannels; k++) fprintf(f, "%s%#.9gf", k ? ", " : " ", (double)info->std[k]);
        fprintf(f, " };\n\nstatic void transform(const float *x, float *out, long n)\n{\n"
                   "    const long plane = (long)MODEL_INPUT_H * MODEL_INPUT_W;\n"
                   "    for (long i = 0; i < n * MODEL_INPUT_C; i++) {\n"
                   "        const float mean = norm_mean[i %% MODEL_INPUT_C], sd = norm_std[i %% MODEL_INPUT_C];\n"
                   "        for (long j = 0; j < plane; j++) out[i * plane + j] = (x[i * plane + j] - mean) / sd;\n"
                   "    }\n}\n\n");
    } else {
        fprintf(f, "static void transform(const float *x, float *out, long n)\n{\n"
                   "    memcpy(out, x, sizeof(float) * (size_t)(n * INPUT_FLOATS));   /* none */\n}\n\n");
    }
}

/* Sizes in words for the files' headers: "44,426 floats (0.2 MB)" */
static const char *mb(double bytes, char *buf, size_t size)
{
    snprintf(buf, size, "%.1f MB", bytes / 1e6);
    return buf;
}

/* The most bytes of activations and scratch live at once, over the steps of a run (a buffer lives from
   the first step that touches it to the last; views count as their base): what any plan needs at least */
static double live_peak(const Lib *L)
{
    const Program *q = &L->q;
    int *first = malloc(sizeof(int) * ((size_t)q->nbufs + 1)), *last = malloc(sizeof(int) * ((size_t)q->nbufs + 1));
    for (int b = 0; b < q->nbufs; b++) first[b] = q->nsteps, last[b] = -1;
    for (int k = 0; k < q->nsteps; k++) {
        const Step *s = &q->steps[k];
        int used[CG_MAXARGS + 3], nu = 0;
        if (s->kind == STEP_GEMM) used[nu++] = s->a, used[nu++] = s->b, used[nu++] = s->c;
        for (int j = 0; s->kind == STEP_KERNEL && j < s->nargs; j++) used[nu++] = s->args[j];
        for (int j = 0; j < nu; j++) {
            int b = base_of(q, used[j]);
            if (b < 0 || q->slot[b] < 0) continue;
            if (k < first[b]) first[b] = k;
            if (k > last[b]) last[b] = k;
        }
    }
    double peak = 0;
    for (int k = 0; k < q->nsteps; k++) {
        double live = 0;
        for (int b = 0; b < q->nbufs; b++)
            if (first[b] <= k && k <= last[b]) live += 4.0 * (double)cg_dim(q->bufs[b].size, q->plan_batch);
        if (live > peak) peak = live;
    }
    free(first), free(last);
    return peak;
}

static void model_c_comment(const Lib *L, FILE *f)
{
    const Program *p = L->p, *q = &L->q;
    char a[32], b[32], c[32], what[256];
    fprintf(f, "/*\n** model.c: the net %s (from %s) as a library (model.h), made by mgc %s: the kernels mgc's\n"
               "** %s device runs for its evaluation program %s, and the program's schedule.\n**\n",
            L->m->net_name, L->m->checkpoint, MGC_VERSION, L->cuda ? "CUDA" : "CPU",
            L->cuda ? "(model_kernels.cu, compiled by nvcc)" : "(the same text, prelude included)");
    fprintf(f, "**   kernels  %s\n", cg_kernels_str(p, what, sizeof what));
    fprintf(f, "**   steps    %d a run, in mgc's order; %d once, when a context is made (they read only the\n"
               "**            weights and what such steps made: BatchNorm's statistics, transformed filters)\n",
            q->nsteps, L->nonce);
    char d[32];
    fprintf(f, "**   memory   weights %s, made once %s, activations %s%s for MODEL_MAX_BATCH images (%d buffers\n"
               "**            in %d slots of the memory plan: buffers share memory by liveness; %s without sharing,\n"
               "**            %s live at once at most)\n",
            mb(4.0 * (double)L->weight_floats, a, sizeof a), mb(4.0 * (double)L->keep_floats, b, sizeof b),
            mb((double)L->workspace, c, sizeof c), L->cuda ? "" : " a thread", q->plan_buffers, q->nslots, mb((double)q->plan_naive_bytes, what, sizeof what),
            mb(live_peak(L), d, sizeof d));
    fprintf(f, "** B(k) is buffer k of the program (mgc's numbering, as --emit kernels shows it for a program).\n*/\n");
}

static int write_model_c(Lib *L)
{
    const Program *p = L->p;
    char path[4200];
    FILE *f = create(L, "model.c", path, sizeof path);
    if (!f) return -1;
    model_c_comment(L, f);
    fprintf(f, "#include \"model.h\"\n#include \"model_%s.h\"\n#include \"model_st.h\"\n#include <pthread.h>\n#include <stdbool.h>\n"
               "#include <stdatomic.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n", L->cuda ? "cuda" : "cpu");
    if (L->cuda) {   /* the kernels are in the image: their names, and KArgs as they take it */
        fprintf(f, "/* the kernels: model_kernels.cu, compiled by nvcc (the Makefile), its image in the library (model_image.c) */\n"
                   "extern const unsigned char mgc_model_image[];\n%s\n", cg_kargs_decl(p));
        int n = 0;
        for (int k = 0; k < p->nsteps; k++) n += cg_own_code(&p->steps[k]);
        fprintf(f, "#define NKERNELS %d\nstatic const char *const kernel_names[NKERNELS] = {\n", n);
        for (int k = 0; k < p->nsteps; k++)
            if (cg_own_code(&p->steps[k])) fprintf(f, "    \"%s\",\n", p->steps[k].fn);
        fprintf(f, "};\n\n");
    } else {
        fprintf(f, "/* ---- the kernels: mgc's prelude for C and the bodies, as mgc's CPU device compiles them ---- */\n%s",
                cg_prelude(p, TARGET_C));
        fprintf(f, "/* here every kernel is this file's own */\n#undef KERNEL\n#define KERNEL(name) static __attribute__((noinline)) void name\n");
        for (int k = 0; k < p->nsteps; k++) {
            size_t len;
            const char *t = step_text(p, &p->steps[k], &len);
            if (cg_own_code(&p->steps[k])) fwrite(t, 1, len, f);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "/* ---- the program ---- */\n");
    emit_tables(L, f);
    fprintf(f, "#define INPUT_BUF %d\n#define LOGITS_BUF %d\n\n"
               "/* what runs the program: %s */\ntypedef struct %s Lane;\n"
               "static void bind(Lane *m);\nstatic void run_once(Lane *m);\nstatic void run(Lane *m, long n);\n\n",
            L->q.input, L->q.logits, L->cuda ? "the context" : "a lane of the context (api below)", L->cuda ? "mgc_model" : "Lane");
    const char *api = L->cuda ? "api_cuda.inc" : "api_cpu.inc";
    const ExClibFile *inc = ex_clib_file(api);
    if (!inc) {
        fclose(f);
        return fail(L, "internal: mgc holds no %s", api);
    }
    fputs(inc->text, f);
    if (L->cuda)
        fprintf(f, "\n#define K(fn, work, blocks, ...) \\\n"
                   "    kernel(m, fn, n, work, blocks, (float *const[]){ __VA_ARGS__ }, (int)(sizeof((float *const[]){ __VA_ARGS__ }) / sizeof(float *)))\n"
                   "#define G(...) mgc_cuda_gemm(m->gpu, __VA_ARGS__)\n");
    else
        fprintf(f, "\n#define K(fn, work, heavy, grain, ...) \\\n"
                   "    kernel(m, fn, n, work, heavy, grain, (float *const[]){ __VA_ARGS__ }, (int)(sizeof((float *const[]){ __VA_ARGS__ }) / sizeof(float *)))\n"
                   "#define G(...) mgc_cpu_gemm(m->pool, __VA_ARGS__)\n");
    fprintf(f, "#define B(k) (m->b[k])\n\n");
    emit_bind(L, f);
    emit_schedule(L, f);
    return done(L, f, path);
}

/* CUDA: the kernels for nvcc, and the image's place in the library */
static int write_cuda_kernels(Lib *L)
{
    const Program *p = L->p;
    char path[4200];
    FILE *f = create(L, "model_kernels.cu", path, sizeof path);
    if (!f) return -1;
    fprintf(f, "/* model_kernels.cu: the CUDA kernels mgc's CUDA device runs for %s's evaluation program (mgc %s),\n"
               "   as NVRTC compiles them there; here nvcc compiles them (the Makefile) */\n%s",
            L->m->net_name, MGC_VERSION, cg_prelude(p, TARGET_CUDA));
    for (int k = 0; k < p->nsteps; k++) {
        size_t len;
        const char *t = step_text(p, &p->steps[k], &len);
        if (cg_own_code(&p->steps[k])) fwrite(t, 1, len, f);
    }
    if (done(L, f, path)) return -1;
    if (!(f = create(L, "model_image.c", path, sizeof path))) return -1;
    fprintf(f, "/* model_image.c: model_kernels.fatbin (nvcc's, of model_kernels.cu) in the library's read-only data */\n"
               "__asm__(\".section .rodata\\n.balign 64\\n.globl mgc_model_image\\n.type mgc_model_image, @object\\n\"\n"
               "        \"mgc_model_image:\\n.incbin \\\"model_kernels.fatbin\\\"\\n.byte 0\\n.previous\\n\");\n");
    return done(L, f, path);
}

static int write_makefile(Lib *L)
{
    char path[4200];
    FILE *f = create(L, "Makefile", path, sizeof path);
    if (!f) return -1;
    fprintf(f, "# libmodel.a and the example mgc_predict for %s, made by mgc export --format %s.\n", L->m->net_name, L->cuda ? "cuda" : "c");
    if (L->cuda)
        fprintf(f, "# Needs a C compiler, libc, libm, pthreads, and CUDA: nvcc for the kernels, the driver (-lcuda) and cuBLAS\n"
                   "# (-lcublas); CUDA_HOME says where the toolkit is, CUDA_ARCH the GPUs' architecture (90: H100, H200).\n");
    else
        fprintf(f, "# Needs a C compiler, libc, libm and pthreads%s.\n",
                L->blas ? ", and OpenBLAS (-lopenblas: the program's GEMMs call cblas_sgemm)" : " (no BLAS: the program has no GEMM)");
    fprintf(f, "#   make            libmodel.a and mgc_predict\n"
               "#   ./mgc_predict IN.safetensors OUT.safetensors\n\n"
               "CC     ?= cc\n"
               "# The flags mgc compiles its CPU kernels with: with the same compiler the numbers are mgc's, bit for bit.\n"
               "# -march=native makes code for this machine's kind of CPU; for a library that runs on others give e.g.\n"
               "# CFLAGS='-O3 -march=x86-64-v3 ...' (the logits may then differ from mgc's by float rounding).\n"
               "CFLAGS ?= -O3 -march=native -std=gnu11 -fPIC -fno-math-errno -fno-trapping-math -Wno-unused\n");
    if (L->cuda) {
        fprintf(f, "CUDA_HOME ?= /usr/local/cuda\nNVCC      ?= $(CUDA_HOME)/bin/nvcc\nCUDA_ARCH ?= 90\n"
                   "NVCCFLAGS ?= -std=c++17 -gencode arch=compute_$(CUDA_ARCH),code=[sm_$(CUDA_ARCH),compute_$(CUDA_ARCH)]\n"
                   "CPPFLAGS  += -I$(CUDA_HOME)/include\n"
                   "LDLIBS     = -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib64/stubs -lcublas -lcuda -lm -lpthread\n"
                   "OBJ        = model.o model_image.o model_cuda.o model_st.o\n\n");
    } else {
        fprintf(f, "CPPFLAGS += -DMODEL_BLAS=%d\nLDLIBS    = %s-lm -lpthread\nOBJ       = model.o model_cpu.o model_st.o\n\n",
                L->blas ? 1 : 0, L->blas ? "-lopenblas " : "");
    }
    fprintf(f, "all: libmodel.a mgc_predict\n\n"
               "libmodel.a: $(OBJ)\n\t$(AR) rcs $@ $(OBJ)\n\n"
               "%%.o: %%.c model.h model_st.h %s\n\t$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<\n\n", L->cuda ? "model_cuda.h" : "model_cpu.h");
    if (L->cuda)
        fprintf(f, "model_kernels.fatbin: model_kernels.cu\n\t$(NVCC) $(NVCCFLAGS) -fatbin -o $@ $<\n\n"
                   "model_image.o: model_image.c model_kernels.fatbin\n\t$(CC) -c -o $@ model_image.c\n\n");
    fprintf(f, "mgc_predict: mgc_predict.o libmodel.a\n\t$(CC) $(LDFLAGS) -o $@ mgc_predict.o libmodel.a $(LDLIBS)\n\n"
               "clean:\n\trm -f *.o libmodel.a mgc_predict%s\n\n.PHONY: all clean\n", L->cuda ? " model_kernels.fatbin" : "");
    return done(L, f, path);
}

int ex_c(const ExModel *m, const Program *p, bool cuda, const char *dir, char *err, size_t err_size)
{
    Lib L = { .m = m, .p = p, .cuda = cuda, .dir = dir, .err = err, .err_size = err_size };
    err[0] = 0;
    if (check_program(&L) || plan(&L)) return -1;
    if (mkdir(dir, 0755) && errno != EEXIST) return fail(&L, "cannot make the directory %s: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return fail(&L, "%s is not a directory", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    static const char *const common[] = { "model_st.h", "model_st.c", "mgc_predict.c" };
    for (size_t k = 0; k < sizeof common / sizeof *common; k++)
        if (copy_fixed(&L, common[k])) return -1;
    if (copy_fixed(&L, cuda ? "model_cuda.h" : "model_cpu.h") || copy_fixed(&L, cuda ? "model_cuda.c" : "model_cpu.c")) return -1;
    if (write_weights(&L, path) || write_header(&L) || write_model_c(&L) || (cuda && write_cuda_kernels(&L)) || write_makefile(&L))
        return -1;
    return 0;
}
