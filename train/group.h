/*
** The replicas of this process and their group, which every file of the
** trainer works on, and what group.c does with them (train.h is the
** trainer's interface to the rest of mgc). The trainer's files, each with its
** header, none including a header of a file above it:
**
**   train.c       the job: devices, programs, parameters, data, then one of
**                 check mode, initialise-only, evaluate or the epochs
**   predict.c     mgc predict: every example's logits          (epoch.c)
**   epoch.c       the epoch loop: steps on every replica, evaluation, the
**                 epoch's report and log, the communication report
**                                                             (checkpoint.c)
**   checkmode.c   K steps on one batch, dumped for the tests (--batch/--dump)
**   checkpoint.c  saving, loading and resuming                (schedule.c)
**   schedule.c    the learning rate's schedule
**   group.c       the replicas: a function on each, their tensors copied and
**                 compared; stop signals; the clock
*/
#ifndef MGC_TRAIN_GROUP_H
#define MGC_TRAIN_GROUP_H
#include "train.h"
#include "comm.h"
#include "data.h"
#include <signal.h>

typedef struct Replica {
    int index, global;        /* in this process; in the whole group */
    Device *dev;
    Store store;
    Exec tr, ev;
    bool have_tr, have_ev;
    double step_t;            /* when its last training step ended (--tensorboard's examples/s) */
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
    long steps_per_epoch;     /* training steps (updates) in every epoch */
    long batches_per_epoch;   /* the batches they take (--accumulate K: K a step, fewer in the last) */
    double t0, last_draw;     /* the epoch's start, the progress line's last drawing */
    double run_t0;            /* the first trained epoch's start (the run's ETA) */
    int first_epoch;          /* the run's first epoch (after --resume, not 1) */
    FILE *log;                /* rank 0's --log, for --log-every's step records (NULL: none) */
    struct Tb *tb;            /* rank 0's --tensorboard event file (NULL: none) */
    const Dataset *val;       /* --val-split's held-out examples (NULL: none) */
    double best_val;          /* the best validation accuracy so far, */
    int best_epoch;           /* ... after this epoch (0: none yet) */
    double log_loss;          /* the loss summed over the steps since the last step record, */
    long log_seen, log_steps; /* ... over this many examples and steps */
    double log_t0;            /* ... since this time */
    /* check mode */
    float *x, *y;             /* the whole batch, host */
    long b;
    float *losses;
    float *logits, *eval_logits, *grad_x;   /* whole batch, this process's rows */
    float **grads;            /* per parameter, after the first step (summed: the same on every replica) */
} Group;

/* ---- group.c ---- */
/* The stop signal this process received (SIGINT, SIGTERM, SIGHUP), or 0. */
int  train_signal(void);
/* Every rank's status and stop request at one point of the run (a
   collective): 0 go on; 1 some rank failed; 128 + the signal where one asked
   to stop (the largest, where several did). */
int  train_stop_point(World *w, int rc);
/* "SIGTERM", "SIGINT (Ctrl-C)", ... */
const char *train_signal_name(int sig);
/* From here on SIGINT, SIGTERM and SIGHUP ask the run to stop (train_signal,
   train_stop_point); what they did before is kept in old. */
typedef struct TrainSignals { struct sigaction sa[3]; } TrainSignals;
void train_catch_signals(TrainSignals *old);
/* They do what they did before train_catch_signals again. */
void train_release_signals(const TrainSignals *old);
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
/* The first float of a buffer the host sees after a run (loss, correct). */
static inline float train_read1(const Exec *x, int buf) { return x->host[buf][0]; }

#endif
