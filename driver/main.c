/*
** mgc: the command line. The pipeline is pipeline/pipeline.c (every pass in
** order, each checked by a verifier); this file parses the command line and
** says what to compile, and what to do with it: run.c compiles and runs it
** (training, --emit), use.c what uses a checkpoint (mgc predict, ...).
**
**   .net --front end--> IR (shapes checked) --gradients--> backward graph
**        --buckets (data-parallel runs)--> allreduce nodes --update--> SGD
**        --lower--> Program (kernels as text, GEMMs, collectives) --> training
**
** Only this file exits. Exit status: 0 ok, 1 error in the net, data or run,
** 2 bad command line or environment (ranks started differently included),
** 128 + the signal when SIGINT, SIGTERM or SIGHUP stopped the run.
*/
#include "plot.h"
#include "run.h"
#include "ckmodel.h"
#include "data.h"
#include "world.h"
#include "ptx.h"
#include "device_cuda.h"
#include "agree.h"
#include "export.h"
#include <sys/stat.h>
#include <time.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const command_names[CMD_COUNT] = { "", "predict", "evaluate", "export" };

#define AGREE_SECONDS 60      /* how long a rank waits for the others at the start-up agreement (MGC_AGREE_SECONDS) */

static void usage(FILE *out)
{
    fprintf(out,
        "usage: mgc NET.net [options]                       train\n"
        "       mgc evaluate CK.safetensors [DATA] [options]  the test accuracy of a checkpoint\n"
        "       mgc predict CK.safetensors [DATA] --out FILE  every example's logits and prediction\n"
        "       mgc export CK.safetensors --format F --out PATH\n"
        "       mgc plot RUN.jsonl [RUN2.jsonl ...] --out curves.svg   runs' --log files as curves\n"
        "Compiles a network described in NET.net and trains it on Fashion-MNIST (or the data in --data).\n"
        "A checkpoint of --save holds its net, its --set values and its transform, so the three commands\n"
        "need nothing else (docs/after-training.md):\n"
        "  DATA                   a directory as --data takes (default --data, $MGC_DATA), or for predict one\n"
        "                         FILE.safetensors holding `images` (and `labels`, optional)\n"
        "  --split test|train     which set of DATA (default test)\n"
        "  --out FILE             predict: FILE.safetensors (logits, pred, labels, confusion), FILE.csv or\n"
        "                         FILE.jsonl (a row an example: index, prediction, label, probabilities)\n"
        "  --format F             export: c (DIR: model.h, model.c, weights, Makefile, mgc_predict), cuda,\n"
        "                         onnx (FILE.onnx) or pytorch (FILE.py, an nn.Module)\n"
        "  --net NET.net          for a checkpoint of an older mgc, which does not hold its net (with its --set)\n"
        "  --devices, --gpus, --batch-size, --threads, --limit-test, --precision, --tf32, -v: as for training\n\n"
        "Training:\n"
        "  --devices LIST         where to train: cpu (default, one CPU device), cpu:N (N data-parallel\n"
        "                         replicas sharing this machine's cores) or GPUs, cuda:0,cuda:1 (a GPU named\n"
        "                         twice holds two replicas); under mpirun, on every rank\n"
        "  --gpus N               train on the first N GPUs: --devices cuda:0,...,cuda:N-1\n"
        "  --tf32                 GPUs: GEMMs may round their inputs to TF32 (faster; default full fp32)\n"
        "  --precision P          fp32 (default) or bf16: convolutions and linear layers, forward and backward,\n"
        "                         multiply bf16 operands and sum in fp32 (PyTorch autocast's policy); everything\n"
        "                         else, parameters and optimizer state fp32 (docs/usage.md)\n"
        "  --sync-bn              BatchNorm statistics over the global batch (all replicas), as SyncBatchNorm\n"
        "  --check-nan            anomaly mode: check every step's output; stop at the first value that is not\n"
        "                         finite and name the step, kernel and layer that wrote it (slow)\n"
        "  --bucket-mb X          gradients are summed in buckets of about X MB (default 25; the first at most 1)\n"
        "  --epochs N             passes over the training set (default 10; 0: initialise only)\n"
        "  --batch-size B         the global batch (default 256)\n"
        "  --accumulate K         sum the gradients of K batches before each update: steps of K x B examples\n"
        "                         in the memory of one batch of B (default 1)\n"
        "  --shard-update         each of N replicas updates 1/N of the parameters and holds 1/N of the\n"
        "                         optimizer's state (ZeRO-1): a reduce-scatter, the update, an all-gather\n"
        "  --lr X                 learning rate (default 0.1)\n"
        "  --lr-schedule S        how the learning rate changes, as PyTorch's schedulers:\n"
        "                           cosine     (default) from --lr down along a half cosine over the run,\n"
        "                                      every step (CosineAnnealingLR, T_max = all the run's steps)\n"
        "                           constant   --lr throughout\n"
        "                           step:E1,E2,...  times --lr-gamma after epochs E1, E2, ... (MultiStepLR)\n"
        "  --lr-gamma G           the factor of step:... (default 0.1; 0 to 1)\n"
        "  --lr-per step|epoch    how often the schedule moves: every step (cosine's default) or once an\n"
        "                         epoch (step:...'s default); cosine per epoch has T_max = epochs, step:...\n"
        "                         per step counts its milestones in steps\n"
        "  --warmup N             the first N steps of the run scale the rate by (t+1)/N, t = 0, 1, ...\n"
        "                         (default 0)\n"
        "  --optimizer O          sgd (default) or adamw, PyTorch's (AdamW: decoupled weight decay, default 0.01)\n"
        "  --momentum M           SGD momentum (default 0); --nesterov: Nesterov's\n"
        "  --betas B1,B2, --eps E AdamW's (default 0.9,0.999 and 1e-8)\n"
        "  --weight-decay W       L2 penalty, as PyTorch's SGD (default 0)\n"
        "  --seed S               seeds initialisation, shuffling and dropout (default 0)\n"
        "  --data DIR             the data set's directory (default $MGC_DATA, else ~/.cache/mgc/fashion-mnist):\n"
        "                         IDX files (Fashion-MNIST, MNIST, ...), CIFAR-10 or CIFAR-100 binary batches, or\n"
        "                         train.safetensors and test.safetensors with `images` and `labels`\n"
        "  --limit-train N        use only the first N training examples\n"
        "  --limit-test N         use only the first N test examples\n"
        "  --augment LIST         training images: crop[:P] (a random window after P zeros around, default 4),\n"
        "                         flip (horizontal, half of them); drawn per example from --seed, the epoch and\n"
        "                         its index (the same on any devices)\n"
        "  --normalize            (x - mean) / std per channel, the training set's (transforms.Normalize);\n"
        "                         --normalize=M1,..,Mc,S1,..,Sc given values (--normalize=imagenet: torchvision's)\n"
        "  --resize H[xW]         images bilinear to H x W first (torchvision's Resize, antialias=False)\n"
        "  --dump-batch FILE      write epoch 1's first training batch as the net sees it (x, y, index) to\n"
        "                         FILE.safetensors, and exit\n"
        "  --threads T            CPU threads of this process, shared out between its devices (default: all cores)\n"
        "  --save FILE            write parameters to FILE.safetensors after each epoch\n"
        "  --load FILE            start from the parameters in FILE.safetensors\n"
        "  --evaluate             only measure the test accuracy of the parameters (--load's, else initialised)\n"
        "  --resume FILE          go on from a checkpoint of --save (an interrupted run): from the epoch after\n"
        "                         the one it holds up to --epochs, saving back into FILE (or --save's);\n"
        "                         the same numbers as a run never interrupted\n"
        "  --log FILE             one JSON object per epoch (jsonl)\n"
        "  --log-every K          and one every K training steps: {\"step\", \"epoch\", \"loss\" (the K steps' mean),\n"
        "                         \"lr\", \"examples_per_s\"}\n"
        "  --tensorboard DIR      TensorBoard's event files in DIR: loss, accuracy, lr and examples/s per\n"
        "                         step and per epoch, the settings, each parameter's histogram per epoch\n"
        "  --val-split F          hold out this share of the training set (after --limit-train; drawn from\n"
        "                         --seed, the same on every device and rank), its accuracy each epoch\n"
        "  --save-best            with --save FILE: FILE.best.safetensors, the epoch of the best validation\n"
        "                         accuracy\n"
        "  --early-stop K         stop after K epochs without a better validation accuracy\n"
        "  --progress-every S     on a terminal a bar (the epoch's progress, loss, examples/s, time to go);\n"
        "                         elsewhere (a log file, nohup, Slurm, CI) a line every S seconds with the\n"
        "                         step, loss, examples/s and the epoch's and run's time to go (default 30;\n"
        "                         0: none)\n"
        "  --emit STAGE           print a stage and exit, needs no data:\n"
        "                           ir       the forward graph (BatchNorm in training form)\n"
        "                           eval-ir  the forward graph in evaluation form\n"
        "                           grad     the whole training step: forward, backward, SGD\n"
        "                           kernels  the generated C kernels and the step list\n"
        "                           cuda     the same kernels as CUDA C for NVRTC\n"
        "                           dp       the data-parallel plan: replicas, buckets, collectives\n"
        "                           ptx      the CUDA kernels compiled by NVRTC to PTX (--arch sm_80, sm_90, ...)\n"
        "                           infer-ir the graph mgc export compiles: the logits alone, each BatchNorm\n"
        "                                    folded into the conv2d or linear before it (--no-fold: not)\n"
        "  --gpu-model G          --emit kernels on GPUs (--gpus N): each step's predicted cost on G, and the\n"
        "                         step's and an epoch's, fp32 and bf16: h200 (default) or h100\n"
        "  --dump-kernels DIR     write each kernel of the training step to DIR/NAME.c and DIR/NAME.cu,\n"
        "                         headed by the IR nodes it computes, and exit\n"
        "  --set NAME=VALUE       override a net parameter (repeatable)\n"
        "  --check-batch FILE --steps K --dump OUT\n"
        "                         check mode: K steps on the batch x, y in FILE.safetensors at --lr\n"
        "                         (no schedule);\n"
        "                         OUT gets losses, logits, gradients and final parameters\n"
        "  -v, --verbose          say what is compiled and cached\n"
        "  --cache-info           where the kernel cache is, its entries and size, and exit; it is kept\n"
        "                         to $MGC_CACHE_MB (default 1000) MB, the entries used least recently go first\n"
        "  --cache-clear          empty the kernel cache and exit\n"
        "  --version              the version, and what this build has and finds here (OpenBLAS, MPI, CUDA, GPUs)\n"
        "  --list-layers          the built-in layers, their arguments and checks (docs/language.md's table)\n"
        "  --list-ops             the IR's ops: name, kind, 'grad' where gradients flow through it, its lowering\n"
        "  --help\n\n"
        "environment:\n"
        "  MGC_DATA               the data set's directory when --data is not given\n"
        "  MGC_CC                 the C compiler for the CPU kernels (default cc; \"ccache gcc\" works)\n"
        "  MGC_CACHE_MB           the kernel cache's size limit in MB (default 1000)\n"
        "  XDG_CACHE_HOME         the kernel cache is in $XDG_CACHE_HOME/mgc (default ~/.cache/mgc); it must be\n"
        "                         yours and writable by nobody else, nor any directory above it (docs/running.md)\n"
        "  MGC_PROFILE=1          print the time of every step of the training program\n"
        "  MGC_FUSE=0             no fusion pass\n"
        "  MGC_CONV=S             one convolution form everywhere: direct|vector|gemm|dense|chunked|winograd\n"
        "  MGC_AGREE_SECONDS=S    under mpirun, how long a rank waits for the others to compare how they were\n"
        "                         started (default 60); one that has not come by then stops them all (status 2)\n"
        "  MGC_CUDA_GRAPHS=0      GPUs: launch every step instead of replaying a CUDA graph\n"
        "  MGC_NVRTC, MGC_CUBLAS, MGC_NCCL\n"
        "                         the NVRTC, cuBLAS and NCCL libraries to open (default the system's)\n"
        "  OPENBLAS_CORETYPE      OpenBLAS's kernels (mgc sets it where OpenBLAS misjudges the CPU)\n"
        "A value mgc does not know stops it (status 2). SIGINT, SIGTERM and SIGHUP stop a run after the current\n"
        "step, the last finished epoch saved (status 128 + the signal); under mpirun the ranks must be started\n"
        "alike, or none starts.\n");
}

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "mgc: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(see mgc --help)\n");
    return 2;
}

/* The environment variable name: the index of its value in names (NULL-ended),
   dflt when unset or empty, or -2 with a message when it is none of them. */
static int env_choice(const char *name, const char *const *names, int dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    for (int k = 0; names[k]; k++)
        if (!strcmp(v, names[k])) return k;
    fprintf(stderr, "mgc: %s='%s' is not one of", name, v);
    for (int k = 0; names[k]; k++) fprintf(stderr, "%s%s", k ? "|" : " ", names[k]);
    fprintf(stderr, " (unset it for the default)\n");
    return -2;
}

static int parse_long(const char *opt, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!diag_decimal(s, false) || *end || errno) return bad("%s expects a whole number, got '%s'", opt, s);
    if (v < min || v > max) {
        char range[64];
        snprintf(range, sizeof range, "%ld..%ld", min, max);
        fprintf(stderr, "mgc: %s must be in %s, got %s\n(see mgc --help)\n", opt, range, s);
        return 2;
    }
    *out = v;
    return 0;
}

/* A number of a range (min to max, each end open or closed), kept as a float:
   the range holds for the value written and for its rounding to float32, which
   is 0 only where the value written is ("--eps 1e-50" would be 0: refused). */
static int parse_float(const char *opt, const char *s, double min, bool min_open, double max, bool max_open, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!diag_decimal(s, true) || *end || errno || !isfinite(v)) return bad("%s expects a number, got '%s'", opt, s);
    if (v < min || (min_open && v == min) || v > max || (max_open && v == max)) {
        if (max < 1e30)
            fprintf(stderr, "mgc: %s must be in %c%g, %g%c, got %s\n(see mgc --help)\n", opt, min_open ? '(' : '[', min, max,
                    max_open ? ')' : ']', s);
        else
            fprintf(stderr, "mgc: %s must be %s %g, got %s\n(see mgc --help)\n", opt, min_open ? ">" : ">=", min, s);
        return 2;
    }
    char why[256];
    if (diag_f32_rounding(v, min, min_open, max, max_open, why, sizeof why)) {
        fprintf(stderr, "mgc: %s %s\n(see mgc --help)\n", opt, why);
        return 2;
    }
    *out = (float)v;
    return 0;
}

/* --devices: "cpu" (one device), "cpu:N" (N replicas), or a list of GPUs
   "cuda:0,cuda:1" ("cuda" alone: cuda:0; a GPU may repeat: several replicas on it). */
static int parse_devices(const char *list, TrainConfig *t)
{
    if (!strcmp(list, "cpu")) {
        t->replicas = 1;
        t->devices[0] = (DeviceSpec){ DEV_CPU, 0 };
        return 0;
    }
    if (!strncmp(list, "cuda", 4) || !strncmp(list, "gpu", 3)) {
        if (!strcmp(list, "cuda")) list = "cuda:0";
        int n = 0;
        for (const char *p = list; *p;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            char item[32];
            snprintf(item, sizeof item, "%.*s", (int)(len < 31 ? len : 31), p);
            char *end;
            long k = -1;
            if (!strncmp(item, "cuda:", 5) && item[5] >= '0' && item[5] <= '9') k = strtol(item + 5, &end, 10);
            if (k < 0 || *end || k > 1023)
                return bad("--devices: '%s' is not a GPU; write cuda:K (K = 0, 1, ...), e.g. --devices cuda:0,cuda:1%s", item, "");
            if (n == MAX_REPLICAS) {
                fprintf(stderr, "mgc: --devices: at most %d devices in one process\n(see mgc --help)\n", MAX_REPLICAS);
                return 2;
            }
            t->devices[n++] = (DeviceSpec){ DEV_CUDA, (int)k };
            p += len;
            if (*p == ',') p++;
        }
        if (n == 0) return bad("--devices %s: no devices to train on%s", list, "");
        t->replicas = n;
        return 0;
    }
    if (strncmp(list, "cpu:", 4))
        return bad("--devices %s: unknown device list; use cpu (one CPU device), cpu:N (N data-parallel CPU devices) "
                   "or cuda:0,cuda:1 (GPUs)%s", list, "");
    const char *num = list + 4;
    char *end;
    errno = 0;
    long n = strtol(num, &end, 10);
    if (!*num || *end || errno || n < 0 || !(*num >= '0' && *num <= '9'))
        return bad("--devices %s: expected the number of CPU devices after 'cpu:', e.g. cpu:2%s", list, "");
    if (n == 0) return bad("--devices %s: no devices to train on; use cpu:1 or more%s", list, "");
    if (n > MAX_REPLICAS) {
        fprintf(stderr, "mgc: --devices %s: at most %d CPU devices in one process; for more, start several processes with mpirun\n(see mgc --help)\n",
                list, MAX_REPLICAS);
        return 2;
    }
    t->replicas = (int)n;
    for (int k = 0; k < n; k++) t->devices[k] = (DeviceSpec){ DEV_CPU, k };
    return 0;
}

/* mgc --version: the version, then what this build has and what it finds on this machine. */
static int print_version(void)
{
    char buf[1024], err[1024];
    printf("mgc %s\n", MGC_VERSION);
    rt_cpu_blas_describe(buf, sizeof buf);
    printf("  OpenBLAS  %s\n", buf);
    const char *mpi = rt_world_mpi_build(buf, sizeof buf);
    printf("  MPI       %s%s\n", mpi ? "built with " : "", mpi ? mpi : "not built in (no mpicc at build time, or MPI=0): one process only");
    const char *cuda = rt_cuda_build(buf, sizeof buf);
    printf("  CUDA      %s\n", cuda ? cuda : "not built in (no CUDA toolkit at build time, or CUDA=0): CPU devices only");
    printf("  NVRTC     %s\n", rt_nvrtc_open(err, sizeof err) ? rt_nvrtc_version(buf, sizeof buf) : err);
    printf("  ONNX      %s\n", ex_onnx_about(buf, sizeof buf));
    if (cuda) {
        int n = rt_cuda_device_count(err, sizeof err);
        if (n < 0) printf("  GPUs      none: %s\n", err);
        else if (n == 0) printf("  GPUs      none: the driver sees no GPU\n");
        for (int k = 0; k < n; k++) {
            if (rt_cuda_gpu_name(k, buf, sizeof buf, err, sizeof err)) snprintf(buf, sizeof buf, "%s", err);
            printf("  %-9s cuda:%d, %s\n", k ? "" : "GPUs", k, buf);
        }
    }
    return 0;
}

/* The options that take a value (--name VALUE or --name=VALUE) or are flags;
   the switch in parse_args has a case for each (-Wswitch says when one lacks it). */
enum Opt {
    O_DEVICES, O_GPUS, O_EPOCHS, O_BATCH_SIZE, O_LR, O_LR_SCHEDULE, O_LR_GAMMA, O_LR_PER, O_WARMUP, O_MOMENTUM, O_WEIGHT_DECAY,
    O_OPTIMIZER, O_BETAS, O_EPS, O_NESTEROV, O_AUGMENT, O_NORMALIZE, O_RESIZE, O_DUMP_BATCH,
    O_SEED, O_DATA, O_LIMIT_TRAIN, O_LIMIT_TEST, O_THREADS, O_SAVE, O_LOAD, O_RESUME, O_LOG, O_EMIT, O_SET,
    O_BATCH, O_STEPS, O_DUMP, O_BUCKET_MB, O_ARCH, O_GPU_MODEL, O_DUMP_KERNELS, O_SYNC_BN, O_TF32, O_CHECK_NAN, O_EVALUATE,
    O_PRECISION, O_OUT, O_FORMAT, O_SPLIT, O_NET, O_NO_FOLD, O_PROGRESS_EVERY, O_LOG_EVERY, O_VAL_SPLIT, O_SAVE_BEST, O_EARLY_STOP, O_TENSORBOARD, O_ACCUMULATE, O_SHARD_UPDATE, O_COUNT
};
/* which commands take an option */
enum { U_TRAIN = 1 << CMD_TRAIN, U_PREDICT = 1 << CMD_PREDICT, U_EVALUATE = 1 << CMD_EVALUATE, U_EXPORT = 1 << CMD_EXPORT,
       U_RUN = U_TRAIN | U_PREDICT | U_EVALUATE, U_MODEL = U_RUN | U_EXPORT };
static const struct { const char *name; bool flag; int uses; } options[O_COUNT] = {
    [O_DEVICES] = { "--devices", false, U_RUN }, [O_GPUS] = { "--gpus", false, U_RUN }, [O_EPOCHS] = { "--epochs" },
    [O_BATCH_SIZE] = { "--batch-size", false, U_MODEL }, [O_LR] = { "--lr" }, [O_LR_SCHEDULE] = { "--lr-schedule" },
    [O_LR_GAMMA] = { "--lr-gamma" }, [O_LR_PER] = { "--lr-per" }, [O_WARMUP] = { "--warmup" }, [O_MOMENTUM] = { "--momentum" },
    [O_WEIGHT_DECAY] = { "--weight-decay" }, [O_OPTIMIZER] = { "--optimizer" }, [O_BETAS] = { "--betas" },
    [O_EPS] = { "--eps" }, [O_NESTEROV] = { "--nesterov", true }, [O_AUGMENT] = { "--augment" },
    [O_NORMALIZE] = { "--normalize", true, U_MODEL }, [O_RESIZE] = { "--resize", false, U_MODEL },
    [O_DUMP_BATCH] = { "--dump-batch" }, [O_SEED] = { "--seed" }, [O_DATA] = { "--data", false, U_RUN },
    [O_LIMIT_TRAIN] = { "--limit-train" }, [O_LIMIT_TEST] = { "--limit-test", false, U_RUN },
    [O_THREADS] = { "--threads", false, U_RUN },
    [O_SAVE] = { "--save" }, [O_LOAD] = { "--load" }, [O_RESUME] = { "--resume" }, [O_LOG] = { "--log" },
    [O_EMIT] = { "--emit" }, [O_SET] = { "--set", false, U_MODEL }, [O_BATCH] = { "--check-batch" }, [O_STEPS] = { "--steps" },
    [O_DUMP] = { "--dump" }, [O_BUCKET_MB] = { "--bucket-mb" }, [O_ARCH] = { "--arch" }, [O_GPU_MODEL] = { "--gpu-model" },
    [O_DUMP_KERNELS] = { "--dump-kernels" }, [O_SYNC_BN] = { "--sync-bn", true }, [O_TF32] = { "--tf32", true, U_RUN },
    [O_CHECK_NAN] = { "--check-nan", true }, [O_EVALUATE] = { "--evaluate", true },
    [O_PRECISION] = { "--precision", false, U_RUN }, [O_OUT] = { "--out", false, U_PREDICT | U_EXPORT },
    [O_FORMAT] = { "--format", false, U_EXPORT }, [O_SPLIT] = { "--split", false, U_PREDICT | U_EVALUATE },
    [O_NET] = { "--net", false, U_MODEL & ~U_TRAIN }, [O_NO_FOLD] = { "--no-fold", true, U_TRAIN | U_EXPORT },
    [O_PROGRESS_EVERY] = { "--progress-every" }, [O_LOG_EVERY] = { "--log-every" }, [O_VAL_SPLIT] = { "--val-split" },
    [O_SAVE_BEST] = { "--save-best", true }, [O_EARLY_STOP] = { "--early-stop" }, [O_TENSORBOARD] = { "--tensorboard" },
    [O_ACCUMULATE] = { "--accumulate" }, [O_SHARD_UPDATE] = { "--shard-update", true },
};
/* the options handled before the table's (they end the parse, or take no value) */
static const char *const early_options[] = { "--cache-info", "--cache-clear", "--help", "--version", "--verbose", "--list-layers",
                                             "--list-ops" };

/* --lr-schedule constant | cosine | step:E1,E2,... (increasing epochs, or steps with --lr-per step) */
static int parse_schedule(const char *val, TrainConfig *t)
{
    t->lr_nmilestones = 0;
    if (!strcmp(val, "constant")) t->lr_schedule = LR_CONSTANT;
    else if (!strcmp(val, "cosine")) t->lr_schedule = LR_COSINE;
    else if (!strncmp(val, "step:", 5)) {
        t->lr_schedule = LR_STEP;
        const char *p = val + 5;
        int cap = (int)(sizeof t->lr_milestones / sizeof *t->lr_milestones);
        for (;;) {
            char *end = (char *)p;
            errno = 0;
            long e = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : 0;
            if (e == 0 || errno || e < 1 || e > 1000000 || (*end && *end != ','))
                return bad("--lr-schedule step: expects epochs (or steps) E1,E2,... (whole numbers from 1), got '%s'%s", val, "");
            if (t->lr_nmilestones && e <= t->lr_milestones[t->lr_nmilestones - 1])
                return bad("--lr-schedule %s: the milestones must increase%s", val, "");
            if (t->lr_nmilestones == cap) return bad("--lr-schedule %s: at most 16 milestones%s", val, "");
            t->lr_milestones[t->lr_nmilestones++] = (int)e;
            if (!*end) break;
            p = end + 1;
        }
    } else {
        return bad("--lr-schedule expects constant, cosine or step:E1,E2,... (e.g. step:30,60), got '%s'%s", val, "");
    }
    return 0;
}

/* --augment crop[:P],flip (either, or both): 0, or 2 said */
static int parse_augment(const char *val, Transform *t)
{
    t->crop_pad = 0, t->flip = false, t->crop_scale = t->rotate = t->translate = t->erase = 0;
    const char *p = val;
    for (;;) {
        size_t len = strcspn(p, ",");
        /* NAME:V of the augmentations that take a number: their field, range, and what V is */
        static const struct { const char *name; double lo, hi; bool hi_open; const char *what; } augs[] = {
            { "crop-resize", 0, 1, true, "the smallest share of the area kept (RandomResizedCrop's scale (S, 1))" },
            { "rotate", 0, 180, false, "degrees either way (RandomRotation(D))" },
            { "translate", 0, 1, true, "the largest shift, a share of the width and height (RandomAffine's translate)" },
            { "erase", 0, 1, false, "the probability of erasing a rectangle (RandomErasing(p))" },
        };
        float *fields[4] = { &t->crop_scale, &t->rotate, &t->translate, &t->erase };
        int which = -1;
        for (int k = 0; k < 4 && which < 0; k++) {
            size_t n = strlen(augs[k].name);
            if (len > n + 1 && !strncmp(p, augs[k].name, n) && p[n] == ':') which = k;
        }
        if (which >= 0) {
            size_t n = strlen(augs[which].name) + 1;
            char txt[32], *end;
            snprintf(txt, sizeof txt, "%.*s", (int)(len - n < 31 ? len - n : 31), p + n);
            double v = strtod(txt, &end);
            if (*end || !(v > augs[which].lo) || (augs[which].hi_open ? v >= augs[which].hi : v > augs[which].hi)) {
                char msg[256];
                snprintf(msg, sizeof msg, "--augment %s:V takes V above 0 and %s %g: %s", augs[which].name,
                         augs[which].hi_open ? "below" : "at most", augs[which].hi, augs[which].what);
                return bad("%s; got '%s'", msg, val);
            }
            *fields[which] = (float)v;
        } else if (len == 4 && !strncmp(p, "flip", 4)) t->flip = true;
        else if (len == 4 && !strncmp(p, "crop", 4)) t->crop_pad = 4;
        else if (len > 5 && !strncmp(p, "crop:", 5)) {
            char num[16], *end;
            if (len - 5 >= sizeof num) return bad("--augment crop:P expects P from 1 to 64, got '%s'%s", val, "");
            snprintf(num, sizeof num, "%.*s", (int)(len - 5), p + 5);
            errno = 0;
            long v = strtol(num, &end, 10);
            if (*end || errno || v < 1 || v > 64 || !diag_decimal(num, false))
                return bad("--augment crop:P expects P from 1 to 64 (zeros around the image), got '%s'%s", val, "");
            t->crop_pad = (int)v;
        } else {
            return bad("--augment expects a list of crop[:P] (a random crop after P zeros around, default 4), flip, "
                       "crop-resize:S, rotate:D, translate:F, erase:P, e.g. crop:4,flip; got '%s'%s", val, "");
        }
        if (!p[len]) break;
        p += len + 1;
    }
    return 0;
}

/* --normalize=M1,...,Mc,S1,...,Sc (or imagenet): each channel's mean and standard deviation given, not
   the training set's: 0, or 2 said */
static int parse_normalize(const char *val, Transform *t)
{
    if (!strcmp(val, "imagenet")) val = "0.485,0.456,0.406,0.229,0.224,0.225";   /* torchvision's */
    float v[2 * TRANSFORM_MAX_CHANNELS];
    int n = 0;
    for (const char *p = val;; p++) {
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno || !isfinite(x) || (*end && *end != ',') || n == 2 * TRANSFORM_MAX_CHANNELS)
            return bad("--normalize=M1,...,Mc,S1,...,Sc takes each channel's mean, then each one's standard deviation (or "
                       "imagenet), e.g. --normalize=0.286,0.353; got '%s'%s", val, "");
        v[n++] = (float)x;
        p = end;
        if (!*end) break;
    }
    if (n % 2) return bad("--normalize=%s: an odd count of numbers; give the means, then as many standard deviations%s", val, "");
    for (int c = 0; c < n / 2; c++) {
        if (!(v[n / 2 + c] > 0))
            return bad("--normalize=%s: a standard deviation must be above 0 (it divides)%s", val, "");
        t->mean[c] = v[c], t->std[c] = v[n / 2 + c];
    }
    t->given = n / 2;
    return 0;
}

/* --resize H or HxW: 0, or 2 said */
static int parse_resize(const char *val, Transform *t)
{
    char *end;
    errno = 0;
    long h = val[0] >= '0' && val[0] <= '9' ? strtol(val, &end, 10) : 0, w = h;
    if (h > 0 && !errno && *end == 'x') {
        const char *q = end + 1;
        w = q[0] >= '0' && q[0] <= '9' ? strtol(q, &end, 10) : 0;
    }
    if (h < 1 || w < 1 || h > 4096 || w > 4096 || errno || *end)
        return bad("--resize expects H or HxW (each 1 to 4096), e.g. 32 or 64x48, got '%s'%s", val, "");
    t->out_h = (int)h, t->out_w = (int)w;
    return 0;
}

/* The kernel cache's environment, checked before --cache-info reads it:
   0, or 2 with a message. */
static int check_cache_env(void)
{
    const char *mb = getenv("MGC_CACHE_MB"), *xdg = getenv("XDG_CACHE_HOME");
    if (mb && *mb && rt_cache_limit() < 0) {
        fprintf(stderr, "mgc: MGC_CACHE_MB='%s' is not a size in MB (a number above 0, at most 1e9, e.g. 500); unset it "
                "for 1000 MB\n", mb);
        return 2;
    }
    if (xdg && *xdg && xdg[0] != '/') {
        fprintf(stderr, "mgc: XDG_CACHE_HOME='%s' is not an absolute path (the kernel cache goes to $XDG_CACHE_HOME/mgc): "
                "give one starting with /, or unset it for ~/.cache\n", xdg);
        return 2;
    }
    return 0;
}

/* MGC_AGREE_SECONDS (default AGREE_SECONDS) into *seconds: 0, or 2 said. */
static int agree_env(double *seconds)
{
    const char *v = getenv("MGC_AGREE_SECONDS");
    char *end;
    *seconds = AGREE_SECONDS;
    if (!v || !*v) return 0;
    errno = 0;
    double s = strtod(v, &end);
    if (!diag_decimal(v, true) || *end || errno || !(s > 0) || s > 1e6) {
        fprintf(stderr, "mgc: MGC_AGREE_SECONDS='%s' is not a number of seconds (above 0, at most 1e6, e.g. 300); unset it "
                "for %d\n", v, AGREE_SECONDS);
        return 2;
    }
    *seconds = s;
    return 0;
}

/* What parse_args gathers before it can judge the whole command line. */
typedef struct Parse {
    int gpus;                 /* --gpus N */
    bool devices_given, gamma_given, per_given, momentum_given, wd_given, betas_given, eps_given, gpu_model_given, arch_given;
    const char *load, *resume;
} Parse;

/* One option of the table with its value (NULL for a flag): 0, or 2 said. */
static int take_option(Cli *c, Parse *ps, enum Opt which, const char *name, const char *val)
{
    TrainConfig *t = &c->cfg;
    long v;
    float f;
    int rc = 0;
    switch (which) {
    case O_DEVICES: c->devices = val; ps->devices_given = c->devices_given = true; break;
    case O_GPUS:
        rc = parse_long(name, val, 1, MAX_REPLICAS, &v);
        if (!rc) ps->gpus = (int)v, c->gpus_arg = val;
        break;
    case O_EPOCHS: rc = parse_long(name, val, 0, 1000000, &v); t->epochs = (int)v; break;
    case O_BATCH_SIZE: rc = parse_long(name, val, 1, 1 << 20, &v); t->batch_size = (int)v; c->batch_size_given = true; break;
    case O_LR: rc = parse_float(name, val, 0, false, 1e30, false, &t->lr); break;
    case O_LR_SCHEDULE: rc = parse_schedule(val, t); break;
    case O_LR_GAMMA: rc = parse_float(name, val, 0, false, 1, false, &t->lr_gamma); ps->gamma_given = true; break;
    case O_LR_PER:
        if (!strcmp(val, "step") || !strcmp(val, "epoch")) t->lr_per_step = val[0] == 's', ps->per_given = true;
        else return bad("--lr-per expects step or epoch, got '%s'%s", val, "");
        break;
    case O_WARMUP: rc = parse_long(name, val, 0, 1000000000, &v); t->warmup = (int)v; break;
    case O_MOMENTUM: rc = parse_float(name, val, 0, false, 1, false, &t->momentum); ps->momentum_given = true; break;
    case O_WEIGHT_DECAY: rc = parse_float(name, val, 0, false, 1e30, false, &t->weight_decay); ps->wd_given = true; break;
    case O_OPTIMIZER:
        if (!strcmp(val, "sgd") || !strcmp(val, "adamw")) t->optimizer = val[0] == 'a' ? IR_ADAMW : IR_SGD;
        else return bad("--optimizer expects sgd or adamw, got '%s'%s", val, "");
        break;
    case O_BETAS: {
        const char *comma = strchr(val, ',');
        char b1[64];
        if (!comma || strchr(comma + 1, ',') || comma - val >= (long)sizeof b1) return bad("--betas expects B1,B2 (e.g. 0.9,0.999), got '%s'%s", val, "");
        snprintf(b1, sizeof b1, "%.*s", (int)(comma - val), val);
        rc = parse_float("--betas' first", b1, 0, false, 1, true, &t->beta1);
        if (!rc) rc = parse_float("--betas' second", comma + 1, 0, false, 1, true, &t->beta2);
        ps->betas_given = true;
        break;
    }
    case O_EPS: rc = parse_float(name, val, 0, true, 1, false, &t->eps); ps->eps_given = true; break;
    case O_NESTEROV: t->nesterov = true; break;
    case O_AUGMENT: rc = parse_augment(val, &t->transform); break;
    case O_NORMALIZE:
        t->transform.normalize = c->normalize_given = true;
        if (val) rc = parse_normalize(val, &t->transform);
        break;
    case O_RESIZE: rc = parse_resize(val, &t->transform); c->resize_given = true; break;
    case O_OUT: c->out = val; break;
    case O_FORMAT: {
        static const char *const formats[FORMAT_COUNT] = { "", "c", "cuda", "onnx", "pytorch" };
        c->format = FORMAT_NONE;
        for (int k = FORMAT_C; k < FORMAT_COUNT; k++)
            if (!strcmp(val, formats[k])) c->format = (ExportFormat)k;
        if (c->format == FORMAT_NONE) return bad("--format expects c, cuda, onnx or pytorch, got '%s'%s", val, "");
        break;
    }
    case O_SPLIT:
        if (strcmp(val, "test") && strcmp(val, "train")) return bad("--split expects test or train, got '%s'%s", val, "");
        c->train_split = !strcmp(val, "train");
        break;
    case O_NET: c->net = val; break;
    case O_DUMP_BATCH: t->dump_batch = val; break;
    case O_SEED: {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(val, &end, 10);
        if (!diag_decimal(val, false) || *end || errno || val[0] == '-')
            return bad("%s expects a non-negative whole number, got '%s'", name, val);
        t->seed = s;
        break;
    }
    case O_DATA: t->data_dir = val; break;
    case O_LIMIT_TRAIN: rc = parse_long(name, val, 1, INT_MAX, &v); t->limit_train = (int)v; break;
    case O_LIMIT_TEST: rc = parse_long(name, val, 0, INT_MAX, &v); t->limit_test = (int)v; break;
    case O_THREADS: rc = parse_long(name, val, 1, 1024, &v); t->threads = (int)v; break;
    case O_SAVE: t->save = val; break;
    case O_LOAD: ps->load = val; break;
    case O_RESUME: ps->resume = val; break;
    case O_LOG: t->log = val; break;
    case O_PROGRESS_EVERY: rc = parse_float(name, val, 0, false, 1e6, false, &f); t->progress_every = f; break;
    case O_LOG_EVERY: rc = parse_long(name, val, 1, 1000000000, &v); t->log_every = (int)v; break;
    case O_VAL_SPLIT: rc = parse_float(name, val, 0, true, 1, true, &f); t->val_split = f; break;
    case O_SAVE_BEST: t->save_best = true; break;
    case O_TENSORBOARD: t->tensorboard = val; break;
    case O_EARLY_STOP: rc = parse_long(name, val, 1, 1000000, &v); t->early_stop = (int)v; break;
    case O_EMIT:
        c->emit = EMIT_NONE;
        for (int k = EMIT_IR; k < EMIT_COUNT; k++)
            if (!strcmp(val, drv_emit_names[k])) c->emit = (Emit)k;
        if (c->emit == EMIT_NONE) return bad("--emit expects ir, eval-ir, grad, kernels, cuda, ptx, dp or infer-ir, got '%s'%s", val, "");
        break;
    case O_SET: {
        const char *e = strchr(val, '=');
        if (!e || e == val) return bad("--set expects NAME=VALUE, got '%s'%s", val, "");
        if (c->nsets == 64) return bad("too many --set options%s%s", "", "");
        c->sets[c->nsets].name = strndup(val, (size_t)(e - val));
        c->sets[c->nsets].value = e + 1;
        c->nsets++;
        break;
    }
    case O_BATCH: t->batch_file = val; break;
    case O_STEPS: rc = parse_long(name, val, 1, 1000000, &v); t->steps = (int)v; break;
    case O_DUMP: t->dump = val; break;
    case O_GPU_MODEL:
        if (!(c->gpu_model = cg_gpu_model(val)))
            return bad("--gpu-model expects one of %s, got '%s'", cg_gpu_model_names, val);
        ps->gpu_model_given = true;
        break;
    case O_ARCH:
        if (strncmp(val, "sm_", 3) || !val[3] || strspn(val + 3, "0123456789") != strlen(val + 3))
            return bad("--arch expects a GPU architecture such as sm_80 or sm_90, got '%s'%s", val, "");
        c->arch = val;
        ps->arch_given = true;
        break;
    case O_DUMP_KERNELS: c->dump_kernels = val; break;
    case O_BUCKET_MB: {
        char *end;
        errno = 0;
        double mb = strtod(val, &end);
        if (!diag_decimal(val, true) || *end || errno || !isfinite(mb)) return bad("%s expects a number of megabytes, got '%s'", name, val);
        if (!(mb > 0) || mb > 1e6) {
            fprintf(stderr, "mgc: %s must be more than 0 and at most 1e6, got %s\n(see mgc --help)\n", name, val);
            return 2;
        }
        c->bucket_mb = (float)mb;
        break;
    }
    case O_SYNC_BN: t->sync_bn = true; break;
    case O_ACCUMULATE: rc = parse_long(name, val, 1, 1 << 20, &v); t->accumulate = (int)v; break;
    case O_SHARD_UPDATE: t->shard_update = true; break;
    case O_TF32: t->tf32 = true; break;
    case O_PRECISION:
        c->precision_given = true;
        if (!strcmp(val, "bf16")) t->bf16 = true;
        else if (!strcmp(val, "fp32")) t->bf16 = false;
        else return bad("--precision expects fp32 or bf16, got '%s'%s", val, "");
        break;
    case O_CHECK_NAN: t->check_nan = true; break;
    case O_EVALUATE: t->evaluate = true; break;
    case O_NO_FOLD: c->no_fold = true; break;
    case O_COUNT: break;
    }
    return rc;
}

/* The option called name (--name), or -1 said with the nearest there is. */
static int find_option(const char *name)
{
    for (int k = 0; k < O_COUNT; k++)
        if (!strcmp(name, options[k].name)) return k;
    if (!strcmp(name, "--batch")) {   /* check mode's old name, easily taken for the batch size */
        bad("'--batch' is now '--check-batch FILE' (check mode: steps on the batch in FILE); the batch size is "
            "--batch-size N%s%s", "", "");
        return -1;
    }
    /* a suggestion only where it is close: a typo, not another option (--bs is not --lr) */
    size_t len = strlen(name) > 2 ? strlen(name) - 2 : 0;
    const char *best = NULL;
    int bestd = len <= 4 ? 2 : len <= 8 ? 3 : 4;
    for (int k = 0; k < O_COUNT + (int)(sizeof early_options / sizeof *early_options); k++) {
        const char *o = k < O_COUNT ? options[k].name : early_options[k - O_COUNT];
        int d = diag_edit_distance(name, o);
        if (d < bestd && (size_t)d < len) { bestd = d; best = o; }
    }
    if (best) bad("unknown option '%s'; did you mean '%s'?", name, best);
    else bad("unknown option '%s'%s", name, "");
    return -1;
}

/* The optimizer's options together, PyTorch's defaults (AdamW's weight decay 0.01): 0, or 2 said. */
static int finish_optimizer(TrainConfig *t, const Parse *ps)
{
    if (t->optimizer == IR_ADAMW) {
        if (ps->momentum_given || t->nesterov)
            return bad("--%s is SGD's; AdamW has --betas B1,B2 (default 0.9,0.999)%s", ps->momentum_given ? "momentum" : "nesterov", "");
        if (!ps->wd_given) t->weight_decay = 0.01f;
        return 0;
    }
    if (ps->betas_given || ps->eps_given)
        return bad("--%s is AdamW's: give --optimizer adamw too (SGD has --momentum, --nesterov)%s", ps->betas_given ? "betas" : "eps", "");
    if (t->nesterov && !(t->momentum > 0))
        return bad("--nesterov needs a momentum (--momentum M above 0), as PyTorch's SGD%s%s", "", "");
    return 0;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* mgc predict, evaluate and export: the checkpoint, the data, --out and --format. 0, or 2 said. */
static int finish_use(Cli *c)
{
    const char *cmd = command_names[c->command];
    if (!c->checkpoint)
        return c->command == CMD_EXPORT ? bad("no checkpoint given: mgc export CK.safetensors --format c|cuda|onnx|pytorch --out "
                                              "PATH%s%s", "", "")
                                        : bad("no checkpoint given: mgc %s CK.safetensors DATA%s", cmd,
                                              c->command == CMD_PREDICT ? " --out FILE.safetensors|.csv|.jsonl" : "");
    if (c->data_arg && c->cfg.data_dir)
        return bad("the data is given twice, '%s' and --data %s: give one", c->data_arg, c->cfg.data_dir);
    if (c->command == CMD_PREDICT && !c->out)
        return bad("mgc predict needs --out FILE: FILE.safetensors (logits and predictions), FILE.csv or FILE.jsonl (a row an "
                   "example with its probabilities)%s%s", "", "");
    if (c->command == CMD_PREDICT && !ends_with(c->out, ".safetensors") && !ends_with(c->out, ".csv") && !ends_with(c->out, ".jsonl"))
        return bad("--out %s: mgc predict writes FILE.safetensors, FILE.csv or FILE.jsonl; name one of those%s", c->out, "");
    if (c->command == CMD_EXPORT) {
        if (!c->out) return bad("mgc export needs --out: a directory (--format c, cuda), FILE.onnx (onnx) or FILE.py (pytorch)%s%s", "", "");
        if (c->format == FORMAT_NONE) c->format = ends_with(c->out, ".onnx") ? FORMAT_ONNX : ends_with(c->out, ".py") ? FORMAT_PYTORCH
                                                                                                                : FORMAT_NONE;
        if (c->format == FORMAT_NONE)
            return bad("--out %s: say what to export there with --format c|cuda|onnx|pytorch%s", c->out, "");
        struct stat st;
        if ((c->format == FORMAT_C || c->format == FORMAT_CUDA) && !stat(c->out, &st) && !S_ISDIR(st.st_mode))
            return bad("--out %s is there and is not a directory: --format c and cuda write a directory (model.h, model.c, "
                       "the weights, a Makefile); name a new one or a directory%s", c->out, "");
    }
    if (c->nsets && !c->net)
        return bad("--set goes with --net NET.net, for a checkpoint of an older mgc: a checkpoint of this one holds its net and its "
                   "--set values%s%s", "", "");
    return 0;
}

/* The options given that depend on each other, and the environment's switches: 0, or 2 said. */
static int finish_args(Cli *c, Parse *ps)
{
    TrainConfig *t = &c->cfg;
    if (c->command != CMD_TRAIN) {
        int rc = finish_use(c);
        if (rc) return rc;
    } else if (!c->net) {
        return bad("no net given: mgc NET.net [options], e.g. mgc nets/lenet.net%s%s", "", "");
    }
    if (!ps->per_given) t->lr_per_step = t->lr_schedule == LR_COSINE;   /* a smooth cosine; milestones in epochs */
    if (ps->gamma_given && t->lr_schedule != LR_STEP)
        return bad("--lr-gamma is the factor of --lr-schedule step:E1,E2,...; give that too%s%s", "", "");
    if (ps->load && ps->resume) return bad("--load and --resume both name a checkpoint: give one%s%s", "", "");
    int rc1 = finish_optimizer(t, ps);
    if (rc1) return rc1;
    t->load = ps->load ? ps->load : ps->resume;
    t->resume = ps->resume != NULL;
    if (ps->gpus && ps->devices_given) return bad("--gpus and --devices both say where to train: give one%s%s", "", "");
    static char gpu_list[MAX_REPLICAS * 9];
    if (ps->gpus) {   /* --gpus N: the first N GPUs */
        int p = 0;
        for (int k = 0; k < ps->gpus; k++) p += snprintf(gpu_list + p, sizeof gpu_list - (size_t)p, "%scuda:%d", k ? "," : "", k);
        c->devices = gpu_list;
    }
    int rc2 = parse_devices(c->devices, t);
    if (rc2) return rc2;
    /* the environment's switches: a value mgc does not know is an error, not silently the default */
    static const char *const off_on[] = { "0", "1", NULL };
    static const char *const convs[] = { "direct", "vector", "gemm", "dense", "chunked", "winograd", NULL };
    int own = env_choice("MGC_CPU_OWN_MEMORY", off_on, 0), graphs = env_choice("MGC_CUDA_GRAPHS", off_on, 1);
    int shared = env_choice("MGC_SHARED_PARAMS", off_on, 1);
    int fuse = env_choice("MGC_FUSE", off_on, 1), profile = env_choice("MGC_PROFILE", off_on, 0);
    c->conv = env_choice("MGC_CONV", convs, -1);
    if (own < -1 || graphs < -1 || shared < -1 || fuse < -1 || profile < -1 || c->conv < -1) return 2;
    t->profile = profile == 1;
    t->cpu_own_memory = own == 1;
    t->unshared_params = shared == 0;
    t->no_graphs = graphs == 0;
    c->fuse = fuse == 1;
    if (t->dump && !t->batch_file) return bad("--dump needs --check-batch FILE (check mode)%s%s", "", "");
    if (t->accumulate > 1 && t->sync_bn)
        return bad("--accumulate sums the gradients of several batches, --sync-bn's BatchNorm gradients are summed apart from "
                   "them: use one or the other (BatchNorm per batch with --accumulate, as PyTorch's accumulation does)%s%s", "", "");
    if (t->shard_update && t->batch_file)
        return bad("--shard-update applies to training; check mode (--check-batch) compares whole gradients%s%s", "", "");
    if (t->accumulate > 1 && t->batch_file)
        return bad("--accumulate applies to training; check mode (--check-batch) runs one batch%s%s", "", "");
    if (t->log_every && !t->log) return bad("--log-every K writes its records into --log FILE: give one%s%s", "", "");
    if ((t->save_best || t->early_stop) && t->val_split <= 0)
        return bad("%s measures the validation accuracy: give --val-split F (a share of the training set held out, e.g. 0.1)%s",
                   t->save_best ? "--save-best" : "--early-stop", "");
    if (t->save_best && !t->save) return bad("--save-best writes beside --save FILE (FILE.best.safetensors): give --save%s%s", "", "");
    if (c->no_fold && (c->command == CMD_TRAIN ? c->emit != EMIT_INFER_IR : c->format != FORMAT_C && c->format != FORMAT_CUDA))
        return bad("--no-fold applies to --emit infer-ir and mgc export --format c|cuda: it keeps each BatchNorm apart from "
                   "the layer before it in the library's graph%s%s", "", "");
    c->inference = c->emit == EMIT_INFER_IR;
    /* options for one printout only: refused elsewhere, not ignored */
    bool gpus = c->emit == EMIT_CUDA;   /* as codegen_options: a program for GPUs, whose cost is printed */
    for (int k = 0; k < t->replicas; k++) gpus |= t->devices[k].kind == DEV_CUDA;
    bool costed = (c->emit == EMIT_KERNELS || c->emit == EMIT_CUDA) && !c->dump_kernels && gpus;
    if (ps->gpu_model_given && !costed)
        return bad("--gpu-model applies to --emit kernels on GPUs (--gpus N) and --emit cuda: it names the GPU each step's "
                   "cost is predicted on; add --emit kernels --gpus N%s%s", "", "");
    if (ps->arch_given && c->emit != EMIT_PTX)
        return bad("--arch applies to --emit ptx: it names the architecture NVRTC compiles the printed PTX for (a GPU "
                   "that trains compiles for its own); add --emit ptx%s%s", "", "");
    if (t->resume && t->batch_file) return bad("--resume goes on training from a checkpoint; check mode (--check-batch) takes --load%s%s", "", "");
    if (t->evaluate && (t->save || t->resume || t->batch_file))
        return bad("--evaluate only measures the parameters on the test set: it takes --load, not %s%s",
                   t->save ? "--save" : t->resume ? "--resume" : "--check-batch", "");
    if (t->dump_batch && (t->batch_file || t->evaluate))
        return bad("--dump-batch writes a training batch and exits; it does not go with %s%s",
                   t->batch_file ? "--check-batch" : "--evaluate", "");
    if (t->resume && !t->save) t->save = t->load;   /* it goes on saving where it left off */
    return 0;
}


static int parse_args(int argc, char **argv, Cli *c)
{
    memset(c, 0, sizeof *c);
    if (check_cache_env() || agree_env(&c->agree_seconds)) return 2;
    TrainConfig *t = &c->cfg;
    t->epochs = 10;
    t->batch_size = 256;
    t->lr = 0.1f;
    t->lr_gamma = 0.1f;
    t->lr_schedule = LR_COSINE;
    t->beta1 = 0.9f, t->beta2 = 0.999f, t->eps = 1e-8f;   /* AdamW's, PyTorch's defaults */
    t->limit_train = t->limit_test = -1;
    t->steps = 1;
    t->progress_every = 30;
    c->devices = "cpu";
    c->bucket_mb = 25;
    c->arch = "sm_90";
    c->gpu_model = cg_gpu_model("h200");
    Parse ps = { 0 };
    int first = 1;
    for (int k = CMD_PREDICT; k < CMD_COUNT && argc > 1; k++)
        if (!strcmp(argv[1], command_names[k])) c->command = (Command)k, first = 2;
    const char *cmd = command_names[c->command];
    for (int i = first; i < argc; i++) {
        char *arg = argv[i];
        if (arg[0] != '-' || !arg[1]) {
            if (c->command == CMD_TRAIN) {
                if (c->net) return bad("more than one net given: '%s' and '%s'", c->net, arg);
                c->net = arg;
            } else if (!c->checkpoint) {
                c->checkpoint = arg;
            } else if (!c->data_arg && c->command != CMD_EXPORT) {
                c->data_arg = arg;
            } else {
                return bad(c->command == CMD_EXPORT ? "mgc export takes one checkpoint, got '%s' too (mgc export CK.safetensors "
                           "--format c|cuda|onnx|pytorch --out PATH)%s" : "one checkpoint and one data set, got '%s' too "
                           "(mgc %s CK.safetensors DATA)", arg, cmd);
            }
            continue;
        }
        for (int k = LEAVE_HELP; k < LEAVE_COUNT; k++)
            if (!strcmp(arg, drv_leave_names[k]) || (k == LEAVE_HELP && !strcmp(arg, "-h"))) {
                c->leave = (Leave)k;
                return 0;
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
        int which = find_option(name);
        if (which < 0) return 2;
        int uses = options[which].uses ? options[which].uses : U_TRAIN;
        if (!(uses & 1 << c->command)) {
            if (c->command == CMD_TRAIN)
                return bad("%s is mgc %s's: mgc predict|evaluate|export CK.safetensors ...", name,
                           uses & U_EXPORT && !(uses & U_PREDICT) ? "export" : uses & U_PREDICT ? "predict" : "evaluate");
            return bad("%s is for training (mgc NET.net ...), not for mgc %s: the checkpoint holds what it needs", name, cmd);
        }
        if (options[which].flag && val && which != O_NORMALIZE) return bad("%s takes no value, got '%s'", name, val);
        if (!val && !options[which].flag) {
            if (i + 1 >= argc) return bad("%s needs a value%s", name, "");
            val = argv[++i];
        }
        int rc = take_option(c, &ps, (enum Opt)which, name, val);
        if (rc) return rc;
    }
    return finish_args(c, &ps);
}

/* --help, --version, --list-layers, --list-ops, --cache-info, --cache-clear:
   that, and leave. Under mpirun every rank must have been given the same (a
   rank leaving alone would leave the others waiting for it at their start);
   then rank 0 prints what is the same everywhere, the first rank of each
   machine what is the machine's (its build and GPUs, its kernel cache). The
   exit status, the worst of every rank's. */
static int leave_early(const Cli *c, int *argc, char ***argv)
{
    World world;
    char err[512];
    if (rt_world_init(&world, argc, argv, err, sizeof err)) {   /* alone then: no MPI here, so nobody waits in it */
        rt_world_finalize(&world);
        world = (World){ .size = 1 };
    }
    if (world.size > 1) {
        Agreement *a = calloc(1, sizeof *a);
        drv_agree_leaving(c, a);
        int rc = drv_agree_start(c, &world, a);
        free(a);
        if (rc) {
            rt_world_finalize(&world);
            return rc;
        }
    }
    bool first = world.rank == 0, first_here = world.size == 1 || drv_local_rank() <= 0;
    int status = 0;
    switch (c->leave) {
    case LEAVE_HELP: if (first) usage(stdout); break;
    case LEAVE_VERSION: if (first_here) status = print_version(); break;
    case LEAVE_LIST_LAYERS: if (first) fe_print_layers(stdout); break;   /* docs/language.md's table, from the layer table */
    case LEAVE_LIST_OPS:   /* the op table: name, kind, gradient rule or not, lowering */
        for (int k = 0; first && k < OP_COUNT; k++)
            printf("%s %s %s %s\n", ir_op_name(k), ir_op_kind_name(ir_op_kind(k)), ir_op_has_gradient(k) ? "grad" : "-",
                   ir_op_lowering(k));
        break;
    case LEAVE_CACHE_INFO: case LEAVE_CACHE_CLEAR:
        if (first_here) status = rt_cache_report(c->leave == LEAVE_CACHE_CLEAR, stdout);
        break;
    case LEAVE_NONE: case LEAVE_COUNT: break;
    }
    fflush(stdout);
    status = rt_world_max_status(&world, status);
    rt_world_finalize(&world);
    return status;
}

/* The --set values, "NAME=VALUE" a line, as a checkpoint keeps them (malloc'd). */
static char *sets_text(const Cli *c)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    for (int k = 0; f && k < c->nsets; k++) fprintf(f, "%s=%s\n", c->sets[k].name, c->sets[k].value);
    if (f) fclose(f);
    return text;
}

int main(int argc, char **argv)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* started with no PATH (env -i, some service managers): the C compiler
       finds its linker on the system's default search path */
    if (!getenv("PATH")) {
        char path[256];
        if (confstr(_CS_PATH, path, sizeof path) > 0) setenv("PATH", path, 1);
    }
    if (argc > 1 && !strcmp(argv[1], "plot")) return plot_main(argc - 1, argv + 1);   /* no net, no data: a picture of logs */
    Cli c;
    int status = parse_args(argc, argv, &c);
    if (status) return status;   /* under mpirun too: a rank that stops with an error makes mpirun end the others */
    if (c.leave) return leave_early(&c, &argc, &argv);
    if (c.command == CMD_TRAIN) {   /* read once: what is compiled is what each checkpoint keeps */
        char rerr[1024];
        c.net_text = fe_read_net(c.net, &c.net_len, rerr, sizeof rerr);   /* NULL: the compile says why */
        c.cfg.net_file = c.net;
        c.cfg.net_text = c.net_text;
        c.cfg.net_len = c.net_len;
        c.cfg.net_sets = c.net_sets = sets_text(&c);
    }
    if (rt_cpu_blas_core(argv, c.cfg.verbose)) {   /* may start mgc again, with OpenBLAS's right kernels */
        for (int k = 0; k < c.nsets; k++) free((char *)c.sets[k].name);
        free(c.net_text);
        free(c.net_sets);
        return 2;
    }
    c.cfg.started = (double)t0.tv_sec + 1e-9 * (double)t0.tv_nsec;
    World world;
    char err[512], data_dir[4096];
    if (rt_world_init(&world, &argc, &argv, err, sizeof err)) {
        fprintf(stderr, "mgc: %s\n", err);
        return 1;
    }
    c.cfg.world = &world;
    c.total_replicas = c.cfg.replicas * world.size;
    if (!c.cfg.data_dir) c.cfg.data_dir = data_default_dir(data_dir, sizeof data_dir);
    status = c.command == CMD_TRAIN ? drv_preflight(&c, &world) : 0;   /* the others', drv_run's */
    if (!status && c.command == CMD_TRAIN && c.cfg.evaluate && c.cfg.load) status = drv_evaluate_transform(&c);
    if (!status) {
        Arena arena;
        arena_init(&arena);
        Diag diag;
        /* every rank compiles the same net: only rank 0 reports what is wrong with it */
        FILE *quiet = world.rank == 0 ? NULL : fopen("/dev/null", "w");
        diag_init(&diag, quiet ? quiet : stderr);
        status = c.command != CMD_TRAIN                  ? drv_use(&c, &world)
                 : c.emit != EMIT_NONE || c.dump_kernels ? drv_emit(&c, &world, &arena, &diag)
                                                         : drv_train(&c, &world, &arena, &diag);
        if (status && diag.usage) status = 2;   /* a bad --set is a command-line error */
        arena_free(&arena);
        if (quiet) fclose(quiet);
    }
    for (int k = 0; k < c.nsets; k++) free((char *)c.sets[k].name);
    free(c.net_text);
    free(c.net_sets);
    rt_world_finalize(&world);
    return status;
}
