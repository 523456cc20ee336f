/*
** Training: the loop over epochs and batches on one or more replicas,
** evaluation, checkpoints, logs, the communication report, and the
** single-batch check mode used by the tests (--batch/--dump).
*/
#ifndef MGC_TRAIN_H
#define MGC_TRAIN_H
#include "runtime.h"
#include "world.h"
#include "transform.h"

#define TRAIN_MAX_DEVICES 64  /* devices in one process */

/* --lr-schedule, as PyTorch's schedulers stepped once an epoch (or, with
   --lr-per step, once a step): constant; CosineAnnealingLR(T_max = epochs,
   or every step of the run); MultiStepLR(milestones, gamma). */
typedef enum { LR_CONSTANT, LR_COSINE, LR_STEP } LrSchedule;


typedef struct TrainConfig {
    int epochs;               /* 0: initialise (and --save) only */
    int batch_size;           /* the global batch, over every replica of every rank (--accumulate: a micro-batch) */
    int accumulate;           /* --accumulate K: the gradients of K batches summed before one update (0, 1: none) */
    bool shard_update;        /* --shard-update: each replica updates its slice of the parameters (ZeRO-1) */
    float lr, momentum, weight_decay;
    IrOptKind optimizer;      /* SGD (momentum, Nesterov's) or AdamW (betas, eps) */
    bool nesterov;
    float beta1, beta2, eps;
    LrSchedule lr_schedule;   /* how the learning rate changes from epoch to epoch (train_lr) */
    int lr_milestones[16], lr_nmilestones;   /* LR_STEP: after these epochs (steps with lr_per_step), increasing */
    float lr_gamma;           /* LR_STEP: the factor at each milestone */
    bool lr_per_step;         /* the schedule's clock counts steps, not epochs */
    int warmup;               /* the first `warmup` steps of the run scale the rate by (t + 1) / warmup */
    unsigned long long seed;
    const char *data_dir;     /* resolved directory */
    Transform transform;      /* --resize, --augment, --normalize (its statistics filled from the training set) */
    const char *dump_batch;   /* --dump-batch: the first training batch as the net sees it goes there; no training */
    int limit_train, limit_test;   /* -1: all */
    const char *save, *load, *log; /* paths or NULL */
    bool evaluate;            /* --evaluate: test accuracy of the loaded (or initialised) parameters, no training */
    bool resume;              /* --resume: load is a checkpoint of --save, training goes on after its epoch */
    const char *batch_file;   /* check mode: one batch from a safetensors file */
    int steps;                /* check mode: SGD steps on it */
    const char *dump;         /* check mode: where the results go */
    int threads;              /* CPU threads of this process, shared out between its replicas (0: all cores) */
    int replicas;             /* devices (replicas) in this process */
    DeviceSpec devices[TRAIN_MAX_DEVICES];   /* which, [0, replicas) */
    bool cpu_own_memory;      /* CPU devices keep memory apart from the host's, as a GPU does (testing) */
    bool unshared_params;     /* --shard-update: each replica keeps its own parameter blocks even in one memory
                                 (MGC_SHARED_PARAMS=0: the all-gather copies them, as across ranks; measuring) */
    bool tf32;                /* CUDA: GEMMs may use TF32 tensor cores */
    bool bf16;                /* --precision bf16: the programs' GEMM-class nodes multiply in bf16 (ir_autocast) */
    bool no_graphs;           /* CUDA: launch every step (no CUDA graph) */
    bool profile;             /* MGC_PROFILE=1: time every step of the training program */
    bool sync_bn;             /* BatchNorm statistics over the global batch */
    double started;           /* CLOCK_MONOTONIC seconds when the process began (-v says when the first step ran) */
    bool check_nan;           /* anomaly mode: every step's output checked; the first not finite named */
    World *world;             /* the ranks of an MPI run, or this process alone */
    bool verbose;
    bool progress;            /* draw progress on stderr (a terminal): a bar with the epoch's ETA */
    double progress_every;    /* not a terminal: a line of progress every this many seconds (--progress-every; 0 none) */
    int log_every;            /* --log-every K: a --log record every K training steps too (0: epochs only) */
    const char *tensorboard;  /* --tensorboard DIR: TensorBoard's event files there (NULL: none) */
    double val_split;         /* --val-split F: this share of the training set held out, measured each epoch (0: none) */
    bool save_best;           /* --save-best: --save's file with .best, the epoch of the best validation accuracy */
    int early_stop;           /* --early-stop K: stop after K epochs without a better validation accuracy (0: never) */
    /* the model as given, written into every checkpoint so that it can be used alone (ckmodel.h) */
    const char *net_file;     /* the .net file's path as given */
    const char *net_text;     /* its bytes, net_len of them (NULL: not kept) */
    size_t net_len;
    const char *net_sets;     /* the --set values, "NAME=VALUE" a line ("" none) */
    /* mgc predict and evaluate (evaluate set) */
    bool transform_given;     /* transform's statistics are the checkpoint's: not fitted to the training set */
    bool eval_train_split;    /* evaluate (or predict) on the training set, not the test set */
    const char *predict;      /* mgc predict: where the logits go (.safetensors, .csv, .jsonl) */
    const char *class_names;  /* mgc predict: the checkpoint's, a line each, or NULL */
} TrainConfig;

/* The compiled net: the training program (forward, backward, collectives,
   update) and the evaluation program (forward, BatchNorm on running
   statistics). train is NULL for a job that only evaluates (mgc predict,
   evaluate). */
typedef struct Model {
    const Program *train, *eval;
} Model;
/* The program that says the net's parameters, input and classes: the training one, else the evaluation one. */
static inline const Program *train_primary(const Model *m) { return m->train ? m->train : m->eval; }

/* Runs the whole job. Returns the process exit status (0 ok, 1 error, 128 + the
   signal when SIGINT, SIGTERM or SIGHUP stopped it). */
int train_run(const Model *m, const TrainConfig *cfg);

/* The learning rate of epoch (1, 2, ...) of the run cfg describes. */
/* The learning rate of step `step` (from 0) of epoch `epoch` (from 1), an
   epoch having steps_per_epoch steps. */
float train_lr(const TrainConfig *cfg, int epoch, long step, long steps_per_epoch);
/* Whether the rate changes within an epoch (set before every step, then). */
bool train_lr_per_step(const TrainConfig *cfg);

/* How a batch of b examples is split over `parts` replicas: replica j gets
   count examples from first on; sizes differ by at most one. */
void train_shard(long b, int parts, int j, long *first, long *count);

#endif
