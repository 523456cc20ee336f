/*
** mgc: the command line, and the one function that runs the pipeline.
**
**   .net --frontend--> IR (shapes checked) --autodiff--> training graph
**        --lower--> Program (kernels as text + GEMMs) --cc--> loaded kernels --> training
**
** Only this file exits. Exit status: 0 ok, 1 error in the net, data or run,
** 2 bad command line, 130 interrupted.
*/
#include "frontend.h"
#include "train.h"
#include "data.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MGC_VERSION "0.1.0"

typedef enum Emit { EMIT_NONE, EMIT_IR, EMIT_EVAL_IR, EMIT_GRAD, EMIT_KERNELS, EMIT_CUDA } Emit;

typedef struct Cli {
    const char *net;
    Emit emit;
    FeOverride sets[64];
    int nsets;
    TrainConfig cfg;
    const char *devices;
} Cli;

static void usage(FILE *out)
{
    fprintf(out,
        "usage: mgc NET.net [options]\n"
        "Compiles a network described in NET.net and trains it on Fashion-MNIST.\n\n"
        "  --devices LIST         where to train: cpu (default)\n"
        "  --epochs N             passes over the training set (default 10; 0: initialise only)\n"
        "  --batch-size B         the global batch (default 256)\n"
        "  --lr X                 learning rate (default 0.1)\n"
        "  --momentum M           SGD momentum (default 0)\n"
        "  --weight-decay W       L2 penalty, as PyTorch's SGD (default 0)\n"
        "  --seed S               seeds initialisation, shuffling and dropout (default 0)\n"
        "  --data DIR             Fashion-MNIST directory (default $MGC_DATA, else ~/.cache/mgc/fashion-mnist)\n"
        "  --limit-train N        use only the first N training examples\n"
        "  --limit-test N         use only the first N test examples\n"
        "  --threads T            CPU threads (default: all cores)\n"
        "  --save FILE            write parameters to FILE.safetensors after each epoch\n"
        "  --load FILE            start from the parameters in FILE.safetensors\n"
        "  --log FILE             one JSON object per epoch (jsonl)\n"
        "  --emit STAGE           print a stage and exit, needs no data:\n"
        "                           ir       the forward graph (BatchNorm in training form)\n"
        "                           eval-ir  the forward graph in evaluation form\n"
        "                           grad     the whole training step: forward, backward, SGD\n"
        "                           kernels  the generated C kernels and the step list\n"
        "                           cuda     the same kernels as CUDA C for NVRTC\n"
        "  --set NAME=VALUE       override a net parameter (repeatable)\n"
        "  --batch FILE --steps K --dump OUT\n"
        "                         check mode: K steps on the batch x, y in FILE.safetensors;\n"
        "                         OUT gets losses, logits, gradients and final parameters\n"
        "  -v, --verbose          say what is compiled and cached\n"
        "  --help, --version\n");
}

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "mgc: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(see mgc --help)\n");
    return 2;
}

static int parse_long(const char *opt, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno) return bad("%s expects a whole number, got '%s'", opt, s);
    if (v < min || v > max) {
        char range[64];
        snprintf(range, sizeof range, "%ld..%ld", min, max);
        fprintf(stderr, "mgc: %s must be in %s, got %s\n(see mgc --help)\n", opt, range, s);
        return 2;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *opt, const char *s, double min, bool min_open, double max, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v)) return bad("%s expects a number, got '%s'", opt, s);
    if (v < min || (min_open && v == min) || v > max) {
        if (max < 1e30)
            fprintf(stderr, "mgc: %s must be in %c%g, %g], got %s\n(see mgc --help)\n", opt, min_open ? '(' : '[', min, max, s);
        else
            fprintf(stderr, "mgc: %s must be %s %g, got %s\n(see mgc --help)\n", opt, min_open ? ">" : ">=", min, s);
        return 2;
    }
    *out = (float)v;
    return 0;
}

static int parse_args(int argc, char **argv, Cli *c)
{
    memset(c, 0, sizeof *c);
    TrainConfig *t = &c->cfg;
    t->epochs = 10;
    t->batch_size = 256;
    t->lr = 0.1f;
    t->limit_train = t->limit_test = -1;
    t->steps = 1;
    c->devices = "cpu";
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        if (arg[0] != '-' || !arg[1]) {
            if (c->net) return bad("more than one net given: '%s' and '%s'", c->net, arg);
            c->net = arg;
            continue;
        }
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(arg, "--version")) {
            printf("mgc %s\n", MGC_VERSION);
            exit(0);
        }
        if (!strcmp(arg, "-v") || !strcmp(arg, "--verbose")) {
            t->verbose = true;
            continue;
        }
        /* --name VALUE or --name=VALUE */
        char name[64];
        const char *val = NULL;
        char *eq = strchr(arg, '=');
        if (eq && eq - arg < (long)sizeof name) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        static const char *const known[] = { "--devices", "--gpus", "--epochs", "--batch-size", "--lr", "--momentum",
            "--weight-decay", "--seed", "--data", "--limit-train", "--limit-test", "--threads", "--save", "--load",
            "--log", "--emit", "--set", "--batch", "--steps", "--dump", NULL };
        int which = -1;
        for (int k = 0; known[k]; k++)
            if (!strcmp(name, known[k])) which = k;
        if (which < 0) {
            const char *best = NULL;
            int bestd = 4;
            for (int k = 0; known[k]; k++) {
                int d = diag_edit_distance(name, known[k]);
                if (d < bestd) { bestd = d; best = known[k]; }
            }
            if (best) return bad("unknown option '%s'; did you mean '%s'?", name, best);
            return bad("unknown option '%s'%s", name, "");
        }
        if (!val) {
            if (i + 1 >= argc) return bad("%s needs a value%s", name, "");
            val = argv[++i];
        }
        long v;
        int rc = 0;
        switch (which) {
        case 0: c->devices = val; break;
        case 1:
            rc = parse_long(name, val, 0, 1024, &v);
            if (!rc && v > 0) {
                fprintf(stderr, "mgc: --gpus %ld: this mgc has no CUDA device support yet; train on the CPU with --devices cpu\n", v);
                return 2;
            }
            break;
        case 2: rc = parse_long(name, val, 0, 1000000, &v); t->epochs = (int)v; break;
        case 3: rc = parse_long(name, val, 1, 1 << 20, &v); t->batch_size = (int)v; break;
        case 4: rc = parse_float(name, val, 0, false, 1e30, &t->lr); break;
        case 5: rc = parse_float(name, val, 0, false, 1, &t->momentum); break;
        case 6: rc = parse_float(name, val, 0, false, 1e30, &t->weight_decay); break;
        case 7: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(val, &end, 10);
            if (!*val || *end || errno || val[0] == '-') return bad("%s expects a non-negative whole number, got '%s'", name, val);
            t->seed = s;
            break;
        }
        case 8: t->data_dir = val; break;
        case 9: rc = parse_long(name, val, 1, INT_MAX, &v); t->limit_train = (int)v; break;
        case 10: rc = parse_long(name, val, 0, INT_MAX, &v); t->limit_test = (int)v; break;
        case 11: rc = parse_long(name, val, 1, 1024, &v); t->threads = (int)v; break;
        case 12: t->save = val; break;
        case 13: t->load = val; break;
        case 14: t->log = val; break;
        case 15:
            if (!strcmp(val, "ir")) c->emit = EMIT_IR;
            else if (!strcmp(val, "eval-ir")) c->emit = EMIT_EVAL_IR;
            else if (!strcmp(val, "grad")) c->emit = EMIT_GRAD;
            else if (!strcmp(val, "kernels")) c->emit = EMIT_KERNELS;
            else if (!strcmp(val, "cuda")) c->emit = EMIT_CUDA;
            else return bad("--emit expects ir, eval-ir, grad, kernels or cuda, got '%s'%s", val, "");
            break;
        case 16: {
            const char *e = strchr(val, '=');
            if (!e || e == val) return bad("--set expects NAME=VALUE, got '%s'%s", val, "");
            if (c->nsets == 64) return bad("too many --set options%s%s", "", "");
            c->sets[c->nsets].name = strndup(val, (size_t)(e - val));
            c->sets[c->nsets].value = e + 1;
            c->nsets++;
            break;
        }
        case 17: t->batch_file = val; break;
        case 18: rc = parse_long(name, val, 1, 1000000, &v); t->steps = (int)v; break;
        case 19: t->dump = val; break;
        }
        if (rc) return rc;
    }
    if (!c->net) return bad("no net given: mgc NET.net [options], e.g. mgc nets/lenet.net%s%s", "", "");
    if (strcmp(c->devices, "cpu") && strcmp(c->devices, "cpu:0")) {
        if (!strncmp(c->devices, "cuda", 4))
            return bad("--devices %s: this mgc has no CUDA device support yet; use --devices cpu%s", c->devices, "");
        return bad("--devices %s: unknown device list; this mgc trains on one CPU device: --devices cpu%s", c->devices, "");
    }
    if (t->dump && !t->batch_file) return bad("--dump needs --batch FILE (check mode)%s%s", "", "");
    return 0;
}

/* Code generation options from the environment: MGC_FUSE=0 turns ReLU fusion
   off, MGC_CONV=direct|vector|gemm forces one convolution strategy everywhere
   (anything else: chosen per layer). The tests run each. */
static CgOptions codegen_options(void)
{
    CgOptions o = { .fuse = true, .conv = -1 };
    const char *fuse = getenv("MGC_FUSE"), *conv = getenv("MGC_CONV");
    if (fuse && !strcmp(fuse, "0")) o.fuse = false;
    if (conv && !strcmp(conv, "direct")) o.conv = CONV_DIRECT;
    if (conv && !strcmp(conv, "vector")) o.conv = CONV_VECTOR;
    if (conv && !strcmp(conv, "gemm")) o.conv = CONV_GEMM;
    return o;
}

/* The pipeline, front to back. Each pass states what it needs at its top. */
static int compile(const Cli *c, Arena *a, Diag *d, bool training, bool backward, bool input_grad, Graph *g, Program *p)
{
    ir_graph_init(g, a, d, NULL, training);
    if (fe_compile(g, c->net, c->sets, c->nsets)) return -1;
    if (g->loss < 0) {
        diag_at(d, (Loc){ 0 }, "%s: the net returns no loss; end its last chain with softmax_cross_entropy", c->net);
        return -1;
    }
    if (ir_verify(g, d)) return -1;
    if (backward) {
        IrSgd sgd = { c->cfg.lr, c->cfg.momentum, c->cfg.weight_decay };
        if (ir_autodiff(g, &sgd, input_grad) || ir_verify(g, d)) return -1;
    }
    if (p) {
        CgOptions opt = codegen_options();
        if (cg_lower(g, a, &opt, p)) return -1;
        char err[256];
        if (cg_verify(p, err, sizeof err)) {
            diag_at(d, (Loc){ 0 }, "internal: %s: the generated program is inconsistent: %s", c->net, err);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    Cli c;
    int rc = parse_args(argc, argv, &c);
    if (rc) return rc;
    Arena arena;
    arena_init(&arena);
    Diag diag;
    diag_init(&diag, stderr);
    Graph train, eval;
    Program train_prog, eval_prog;
    int status = 1;

    switch (c.emit) {
    case EMIT_IR: case EMIT_EVAL_IR: {
        bool tr = c.emit == EMIT_IR;
        if (compile(&c, &arena, &diag, tr, false, false, &train, NULL)) break;
        int tensors;
        char num[32];
        long n = ir_param_count(&train, &tensors);
        printf("# net %s (%s form): %s parameters in %d tensors\n", train.net_name, tr ? "training" : "evaluation",
               train_commas(n, num), tensors);
        ir_print(&train, stdout, 0, train.n);
        status = 0;
        break;
    }
    case EMIT_GRAD:
        if (compile(&c, &arena, &diag, true, true, false, &train, NULL)) break;
        printf("# net %s: training step (lr %g, momentum %g, weight decay %g)\n# forward\n", train.net_name,
               c.cfg.lr, c.cfg.momentum, c.cfg.weight_decay);
        ir_print(&train, stdout, 0, train.n_forward);
        printf("# backward and update\n");
        ir_print(&train, stdout, train.n_forward, train.n);
        status = 0;
        break;
    case EMIT_KERNELS: case EMIT_CUDA:
        if (compile(&c, &arena, &diag, true, true, false, &train, &train_prog)) break;
        printf("/* steps of the training program of %s:\n", train.net_name);
        cg_print_steps(&train_prog, stdout);
        printf("*/\n%s", cg_source(&train_prog, c.emit == EMIT_CUDA ? TARGET_CUDA : TARGET_C));
        status = 0;
        break;
    case EMIT_NONE: {
        bool checking = c.cfg.batch_file != NULL;
        if (compile(&c, &arena, &diag, true, true, checking, &train, &train_prog)) break;
        if (compile(&c, &arena, &diag, false, false, false, &eval, &eval_prog)) break;
        char dir[4096];
        if (!c.cfg.data_dir) c.cfg.data_dir = data_default_dir(dir, sizeof dir);
        c.cfg.progress = isatty(2) && !checking;
        Model m = { &train, &eval, &train_prog, &eval_prog };
        status = train_run(&m, &c.cfg);
        break;
    }
    }
    arena_free(&arena);
    for (int k = 0; k < c.nsets; k++) free((char *)c.sets[k].name);
    return status;
}
