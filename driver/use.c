/*
** After training: mgc predict, mgc evaluate and mgc export, from a checkpoint
** alone. A checkpoint of --save holds its model (data/ckmodel.h: the .net
** file's text, the --set values, the input's shape, the transform with the
** training set's statistics, the precision); from it the evaluation form is
** compiled again, the parameters loaded, and the data transformed as in
** training. A checkpoint of an older mgc (or PyTorch's, under the same
** names) takes --net NET.net with its --set values instead.
**
** The command line may not contradict the checkpoint: --normalize or
** --resize other than what it was trained with, or --net or --set beside a
** checkpoint that holds its own, stop with status 2 and the difference
** named. --precision may differ (fp32 weights run in bf16, or the other
** way): said in a note.
*/
#include "run.h"
#include "ckmodel.h"
#include "export.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const command_words[CMD_COUNT] = { "", "predict", "evaluate", "export" };

/* The checkpoint's --set lines as c's overrides (copies: m->sets stays as
   the checkpoint has it, for mgc export to show). 0, or 1 said. */
static int take_sets(Cli *c, CkModel *m)
{
    for (const char *line = m->sets; line && *line;) {
        size_t len = strcspn(line, "\n");
        const char *eq = memchr(line, '=', len);
        if (!eq || eq == line || c->nsets == 64) {
            fprintf(stderr, "mgc: %s: the checkpoint's --set values are not NAME=VALUE lines ('%.*s'): the file was changed "
                    "after it was saved\n", c->checkpoint, (int)len, line);
            return 1;
        }
        char *copy = strndup(line, len);   /* "NAME\0VALUE": one allocation, freed with the name */
        copy[eq - line] = 0;
        c->sets[c->nsets].name = copy;
        c->sets[c->nsets].value = copy + (eq - line) + 1;
        c->nsets++;
        line += len + (line[len] == '\n');
    }
    return 0;
}

/* "resize 32x32, normalize (mean 0.286 std 0.353)", or "no transform" */
static void transform_words(int h, int w, bool normalize, const float *mean, const float *std, int n, char *out, size_t size)
{
    int p = 0;
    out[0] = 0;
    if (h > 0) p += snprintf(out + p, size - (size_t)p, "resize %dx%d", h, w);
    for (int k = 0; normalize && k < n && p < (int)size; k++)
        p += snprintf(out + p, size - (size_t)p, "%s%.4g std %.4g", k ? ", " : p ? ", normalize (mean " : "normalize (mean ",
                      (double)mean[k], (double)std[k]);
    if (normalize && p < (int)size) p += snprintf(out + p, size - (size_t)p, ")");
    if (!p) snprintf(out, size, "no transform");
}

static int take_transform(Cli *c, const CkModel *m);

/* The model c is to use, from the checkpoint's metadata (or --net's file):
   c's net, its text and --set values, the transform and the precision. 0,
   1 (the checkpoint cannot be used, said) or 2 (the command line contradicts
   it, said). */
static int model_from_checkpoint(Cli *c, CkModel *m)
{
    const char *cmd = command_words[c->command];
    char err[2048];
    StFile f;
    if (st_load_header(c->checkpoint, &f, err, sizeof err)) {
        fprintf(stderr, "mgc: cannot read the checkpoint: %s\n", err);
        return 1;
    }
    int rc = ck_model_get(&f, m, err, sizeof err);
    st_free(&f);
    if (rc) {
        fprintf(stderr, "mgc: %s: %s\n", c->checkpoint, err);
        return 1;
    }
    if (m->net_text) {
        if (c->net) {
            fprintf(stderr, "mgc: %s holds its net (%s) and its --set values: --net is for a checkpoint that does not (an "
                    "older mgc's); leave --net out\n", c->checkpoint, m->net_file ? m->net_file : "its text");
            return 2;
        }
        c->net = m->net_file ? m->net_file : c->checkpoint;
        c->net_text = m->net_text, c->net_len = m->net_len;
        m->net_text = NULL;   /* c's now */
        if (take_sets(c, m)) return 1;
    } else {
        if (!c->net) {
            fprintf(stderr, "mgc: %s does not hold its net (a checkpoint of an older mgc, or not mgc's): give it with --net "
                    "NET.net, and the --set values it was trained with (mgc %s %s --net NET.net ...)\n", c->checkpoint, cmd,
                    c->checkpoint);
            return 1;
        }
        if (!(c->net_text = fe_read_net(c->net, &c->net_len, err, sizeof err))) {
            fprintf(stderr, "mgc: %s\n", err);
            return 1;
        }
    }
    return take_transform(c, m);
}

/* The checkpoint's transform and precision (m) for c, unless the command
   line contradicts them: 0, or 2 said. */
static int take_transform(Cli *c, const CkModel *m)
{
    const char *cmd = c->command == CMD_TRAIN ? "--evaluate" : command_words[c->command];
    TrainConfig *t = &c->cfg;
    if (m->has_transform) {
        char theirs[512], ours[512];
        transform_words(m->resize_h, m->resize_w, m->normalize, m->mean, m->std, m->nchannels, theirs, sizeof theirs);
        if ((c->normalize_given && !m->normalize) ||
            (c->resize_given && (t->transform.out_h != m->resize_h || t->transform.out_w != m->resize_w))) {
            transform_words(c->resize_given ? t->transform.out_h : m->resize_h, t->transform.out_w, c->normalize_given, NULL,
                            NULL, 0, ours, sizeof ours);
            fprintf(stderr, "mgc: %s was trained on images with %s, not %s%s: %s%s applies the checkpoint's; leave %s out\n",
                    c->checkpoint, theirs, c->resize_given ? "--resize " : "--normalize", c->resize_given ? ours + 7 : "", c->command == CMD_TRAIN ? "" : "mgc ", cmd,
                    c->resize_given ? "--resize" : "--normalize");
            return 2;
        }
        ck_model_transform(m, &t->transform);
        t->transform_given = true;   /* its statistics are the checkpoint's, not fitted again */
    }
    if (m->bf16 >= 0 && !c->precision_given) t->bf16 = m->bf16;
    else if (m->bf16 >= 0 && t->bf16 != m->bf16)
        printf("mgc: note: %s was trained in %s; it runs here in %s (--precision)\n", c->checkpoint, m->bf16 ? "bf16" : "fp32",
               t->bf16 ? "bf16" : "fp32");
    return 0;
}

/* mgc export: the evaluation graph (and, for a library, its program) with the checkpoint's tensors. */
static int export_model(Cli *c, const CkModel *m)
{
    Arena arena;
    arena_init(&arena);
    Diag diag;
    diag_init(&diag, stderr);
    Graph g;
    Program p;
    bool library = c->format == FORMAT_C || c->format == FORMAT_CUDA;
    if (c->format == FORMAT_CUDA) c->emit = EMIT_CUDA;   /* the program's kernels for GPUs */
    if (library) {
        /* the inference rewrite's graph (the logits alone, BatchNorm folded unless --no-fold), in fp32:
           a library of its own has no bf16 GEMM, and the checkpoint's weights are fp32 whatever it trained in */
        c->inference = true;
        if (c->cfg.bf16) printf("mgc: note: %s was trained in bf16; the library computes in fp32 (mgc predict --precision fp32 "
                                "gives its logits)\n", c->checkpoint);
        c->cfg.bf16 = false;
    }
    int status = drv_compile(c, &arena, &diag, false, false, false, &g, library ? &p : NULL) ? 1 : 0;
    StFile weights;
    char err[4096];
    if (!status && st_load(c->checkpoint, &weights, err, sizeof err)) {
        fprintf(stderr, "mgc: cannot read the checkpoint: %s\n", err);
        status = 1;
    } else if (!status) {
        ExModel x = { .graph = &g, .weights = &weights, .info = m, .net_name = g.net_name, .checkpoint = c->checkpoint,
                      .batch_given = c->batch_size_given };
        int rc = c->format == FORMAT_ONNX ? ex_onnx(&x, c->out, err, sizeof err)
                 : c->format == FORMAT_PYTORCH ? ex_pytorch(&x, c->out, err, sizeof err)
                                               : ex_c(&x, &p, c->format == FORMAT_CUDA, c->out, err, sizeof err);
        if (rc) fprintf(stderr, "mgc: %s\n", err);
        else printf("mgc: exported %s (%s) to %s\n", c->checkpoint, g.net_name, c->out);
        status = rc ? 1 : 0;
        st_free(&weights);
    }
    arena_free(&arena);
    return status;
}

int drv_use(Cli *c, World *w)
{
    const char *cmd = command_words[c->command];
    if (w->size > 1) {
        if (w->rank == 0)
            fprintf(stderr, "mgc: mgc %s runs in one process, not under mpirun: give it the devices of this machine "
                    "(--devices cpu:N, --gpus N)\n", cmd);
        return 2;
    }
    CkModel m = { 0 };   /* freed below also where the checkpoint could not be read */
    int status = model_from_checkpoint(c, &m);
    if (!status) {
        if (c->command == CMD_EXPORT) {
            status = export_model(c, &m);
        } else {
            TrainConfig *t = &c->cfg;
            t->load = c->checkpoint;
            t->evaluate = true;
            t->eval_train_split = c->train_split;
            if (c->data_arg) t->data_dir = c->data_arg;
            if (c->command == CMD_PREDICT) t->predict = c->out, t->class_names = m.class_names;
            status = drv_run(c, w);
        }
    }
    ck_model_free(&m);
    return status;
}

int drv_evaluate_transform(Cli *c)
{
    char err[2048];
    StFile f;
    CkModel m;
    c->checkpoint = c->cfg.load;
    if (st_load_header(c->checkpoint, &f, err, sizeof err)) return 0;   /* the load says what is wrong with it */
    int rc = ck_model_get(&f, &m, err, sizeof err);
    st_free(&f);
    if (rc) {
        fprintf(stderr, "mgc: %s: %s\n", c->checkpoint, err);
        return 1;
    }
    rc = take_transform(c, &m);
    ck_model_free(&m);
    return rc;
}
