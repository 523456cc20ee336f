/*
** Training: the loop over epochs and batches, evaluation, checkpoints, logs,
** and the single-batch check mode used by the tests (--batch/--dump).
*/
#ifndef MGC_TRAIN_H
#define MGC_TRAIN_H
#include "runtime.h"

typedef struct TrainConfig {
    int epochs;               /* 0: initialise (and --save) only */
    int batch_size;           /* the global batch */
    float lr, momentum, weight_decay;
    unsigned long long seed;
    const char *data_dir;     /* resolved directory */
    int limit_train, limit_test;   /* -1: all */
    const char *save, *load, *log; /* paths or NULL */
    const char *batch_file;   /* check mode: one batch from a safetensors file */
    int steps;                /* check mode: SGD steps on it */
    const char *dump;         /* check mode: where the results go */
    int threads;
    bool verbose;
    bool progress;            /* draw progress on stderr (a terminal) */
} TrainConfig;

/* The compiled net: training graph (forward + backward + update) and the
   evaluation graph (forward only, BatchNorm on running statistics). */
typedef struct Model {
    Graph *train, *eval;
    Program *train_prog, *eval_prog;
} Model;

/* v with thousands separators ("44,426"), in buf; printf's ' flag needs a locale. */
const char *train_commas(long v, char buf[32]);

/* Runs the whole job. Returns the process exit status (0 ok, 1 error, 130 interrupted). */
int train_run(const Model *m, const TrainConfig *cfg);

#endif
