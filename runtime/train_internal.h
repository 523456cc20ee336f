/*
** What the trainer's files share (not for use outside runtime/; the
** trainer's interface is train.h): the replicas of this process and their
** group, and the functions each file gives the others.
**
**   train.c       the job: devices, programs, parameters, data, then one of
**                 check mode, initialise-only, evaluate or the epochs; stop signals
**   epoch.c       the epoch loop: steps on every replica, evaluation, the
**                 epoch's report and log, the communication report
**   schedule.c    the learning rate's schedule
**   checkpoint.c  saving, loading and resuming
**   checkmode.c   K steps on one batch, dumped for the tests (--batch/--dump)
*/
#ifndef MGC_TRAIN_INTERNAL_H
#define MGC_TRAIN_INTERNAL_H
#include "train.h"
#include "comm.h"
#include "data.h"
#include "pool.h"
#include "safetensors.h"
#include "ckmodel.h"
#include <stdio.h>

typedef struct Replica {
    int index, global;        /* in this process; in the whole group */
    Device *dev;
    Store store;
    Exec tr, ev;
    bool have_tr, have_ev;
    /* results of the current epoch or check */
    double loss_sum, correct, eval_correct;
    long seen;
    double compute_seconds, wait_seconds;   /* this epoch */
    bool diverged, stop;
    int stop_reason;          /* 1 interrupted, 2 diverged */
    long steps;
    int nan_epoch;            /* --check-nan: the epoch and step (1-based) where a value first was not finite */
    long nan_batch;
} Replica;

typedef struct Group {
    const Model *m;
    const TrainConfig *cfg;
    World *world;
    Replica *r;
    int n;                    /* replicas in this process */
    int total;                /* in the whole group */
    int threads;              /* CPU threads of this process, shared out between its CPU devices */
    Comm *comm;               /* the CPU devices' group (NULL otherwise, or with one replica) */
    /* the work of the current parallel phase */
    const Dataset *data;
    bool augment;             /* data is the training set: its random transforms apply */
    Transform transform;      /* cfg's, its normalisation fitted to the training set */
    bool have_data;           /* the data was read: data_info and transform's statistics hold */
    float *pred_logits;       /* mgc predict: [examples, classes] filled by train_evaluate, or NULL */
    DataInfo data_info;
    const int *order;
    int count;                /* examples */
    int epoch;
    long steps_per_epoch;     /* training steps in every epoch */
    double t0, last_draw;     /* the epoch's start, the progress line's last drawing */
    /* check mode */
    float *x, *y;             /* the whole batch, host */
    long b;
    float *losses;
    float *logits, *eval_logits, *grad_x;   /* whole batch, this process's rows */
    float **grads;            /* per parameter, after the first step (summed: the same on every replica) */
} Group;

/* What --resume reads from a checkpoint's metadata besides its tensors. */
typedef struct Resume {
    unsigned long long epoch, steps, seed, batch_size;
    char schedule[256];       /* the learning-rate recipe (train_schedule_str), or "" (an older mgc's checkpoint) */
    char optimizer[256];      /* the optimizer (train_optimizer_str), or "" (an older mgc's) */
    unsigned long long optimizer_steps;   /* the steps its optimizer's state has taken (= steps in an older mgc's) */
    char transform[256];      /* --resize, --augment, --normalize in words (transform_str, "none"), or "" (an older mgc's) */
} Resume;

/* ---- train.c ---- */
/* The stop signal this process received (SIGINT, SIGTERM, SIGHUP), or 0. */
int  train_signal(void);
/* Every rank's status and stop request at one point of the run (a
   collective): 0 go on; 1 some rank failed; 128 + the signal where one asked
   to stop (the largest, where several did). */
int  train_stop_point(World *w, int rc);
/* "SIGTERM", "SIGINT (Ctrl-C)", ... */
const char *train_signal_name(int sig);
/* CLOCK_MONOTONIC seconds. */
double train_now(void);
/* Runs fn on every replica of the group, replica r > 0 on a thread of its own. */
void train_on_every_replica(Group *g, void (*fn)(Group *, Replica *));
/* Every replica's tensors from replica 0 of rank 0 (all of them, or the
   running statistics only), on the host and on the devices. at_start: replica
   0's host copy is the truth (initialised or loaded); else its device's is. */
void train_from_replica0(Group *g, StoreWhich which, bool at_start);
/* The largest difference between any replica's tensors and replica 0's of
   rank 0, over all tensors, or over the running statistics. */
double train_replica_diff(Group *g, bool running);
/* The program's input is [N, c, h, w] (the data's); else says so: -1. */
int  train_check_input(const Program *p, int c, int h, int w, const char *what);
/* The first float of a buffer the host sees after a run (loss, correct). */
static inline float train_read1(const Exec *x, int buf) { return x->host[buf][0]; }

/* ---- schedule.c ---- */
/* The learning-rate recipe in words (a checkpoint's "lr_schedule"): what --resume compares. */
void train_schedule_str(const TrainConfig *cfg, char *out, size_t size);
/* The optimizer in words (a checkpoint's "optimizer"): "adamw betas 0.9,0.999 eps 1e-08 weight decay 0.01". */
void train_optimizer_str(const TrainConfig *cfg, char *out, size_t size);

/* ---- predict.c ---- */
/* mgc predict on d (the whole of it, in its order): the logits of every
   example into cfg->predict (.safetensors, .csv or .jsonl), and with labels
   the accuracy and the confusion matrix on stdout. 0, or 1 said. */
int  train_predict(Group *g, const Dataset *d, int *order, const DataInfo *info);

/* ---- checkpoint.c ---- */
/* What a checkpoint of this run says of its model (ckmodel.h): the net's
   text and --set values from cfg, the input and classes from the training
   program, the transform as fitted to the data (once it was read). m's
   strings are borrowed from cfg: not for ck_model_free. */
void train_model_info(const Group *g, CkModel *m);
/* Rank 0 saves replica 0's parameters and state after `epoch` (downloaded:
   its host copy is its device's already, as train_check_tensors may have
   left it); every rank learns whether it worked (0 or 1). */
int  train_save(Group *g, const char *path, int epoch, bool downloaded);
/* Replica 0's tensors checked on rank 0 before they are saved (finite, a
   variance not below 0; the other replicas hold the same, or take replica
   0's running statistics before they are read): the first that fails in
   *found, and in words in what (rank 0). Where the device counts them itself
   (DeviceOps.count_bad: a GPU), only the counts come back, and a tensor is
   downloaded only when one fails; else the host copy is downloaded and
   scanned (rt_store_check: one thread at about the memory's speed,
   ResNet-18's 11.2M parameters and momentum, 89 MB, in 27-30 ms on this
   project's machines, 41 with AdamW's two moments, against about 240 s an
   epoch of Fashion-MNIST there; -v says it each epoch). *downloaded: the
   host copy is now the device's (train_save need not download it again).
   Every rank's status: 0, or 1 where one failed. */
int  train_check_tensors(Group *g, StoreCheck *found, char *what, size_t size, bool *downloaded);
/* Loads the tensors of the checkpoint at path into s (and, with resume,
   what --resume needs from its metadata); 0, or -1 said. Every tensor is
   checked: its shape, its values finite (a variance's not below 0), and with
   resume the optimizer state of cfg's optimizer present where the
   checkpoint's is the same kind and kept one; the step counts in range. */
int  train_load_checkpoint(Store *s, const char *path, Resume *resume, const TrainConfig *cfg);
/* --resume: says on rank 0 where the run goes on from (and what differs
   from the first run's recipe); the first epoch to train. */
int  train_resume_from(Group *g, const Resume *r);

/* ---- checkmode.c ---- */
/* --batch: K steps on one batch, dumped with --dump. The exit status. */
int  train_check_mode(Group *g);

/* ---- epoch.c ---- */
/* Test accuracy over every replica of every rank (NaN without test examples). */
double train_evaluate(Group *g, const Dataset *test, int *order);
/* "[cpu:0, cpu:1]", or "every rank: [...]" */
void train_device_list(const Group *g, char *buf, size_t size);
/* The epochs first_epoch .. cfg->epochs over train (evaluated on test), saving
   and logging (log: rank 0's open --log, or NULL) after each; *log_failed
   when writing it failed, and then the run stops after that epoch (saved)
   with status 1. The exit status (128 + the signal when one stopped the run). */
int  train_epochs(Group *g, const Dataset *train, const Dataset *test, int *order, int first_epoch, FILE **log,
                  bool *log_failed);

#endif
