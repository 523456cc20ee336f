/*
** The command line, as the driver's files share it: main.c parses it and
** trains (mgc NET.net ...); use.c runs what uses a trained checkpoint (mgc
** predict, mgc evaluate, mgc export); run.c (run.h) compiles and runs what
** both ask for.
*/
#ifndef MGC_CLI_H
#define MGC_CLI_H
#include "pipeline.h"
#include "train.h"
#include "world.h"

typedef enum Emit { EMIT_NONE, EMIT_IR, EMIT_EVAL_IR, EMIT_GRAD, EMIT_KERNELS, EMIT_CUDA, EMIT_DP, EMIT_PTX, EMIT_INFER_IR, EMIT_COUNT } Emit;

/* The options that make mgc do one thing and leave, before anything else
   (the parse stops at the first): under mpirun only once every rank has
   said it does the same (leave_early). */
typedef enum Leave { LEAVE_NONE, LEAVE_HELP, LEAVE_VERSION, LEAVE_LIST_LAYERS, LEAVE_LIST_OPS, LEAVE_CACHE_INFO,
                     LEAVE_CACHE_CLEAR, LEAVE_COUNT } Leave;

/* What mgc is asked to do: train a net (mgc NET.net), or use a checkpoint
   (mgc predict CK DATA, mgc evaluate CK DATA, mgc export CK). */
typedef enum Command { CMD_TRAIN, CMD_PREDICT, CMD_EVALUATE, CMD_EXPORT, CMD_COUNT } Command;

/* mgc export's formats */
typedef enum ExportFormat { FORMAT_NONE, FORMAT_C, FORMAT_CUDA, FORMAT_ONNX, FORMAT_PYTORCH, FORMAT_COUNT } ExportFormat;

#define MAX_REPLICAS 64       /* CPU devices in one process */

typedef struct Cli {
    Command command;
    const char *net;          /* the .net file (training; --net for a checkpoint of an older mgc) */
    char *net_text;           /* its bytes as read once (net_len), or NULL */
    size_t net_len;
    char *net_sets;           /* the --set values, "NAME=VALUE" a line */
    Emit emit;
    FeOverride sets[64];
    int nsets;
    TrainConfig cfg;
    const char *devices;
    float bucket_mb;          /* gradient bucket size, MB (10^6 bytes) */
    const char *arch;         /* --emit ptx: the GPU architecture, "sm_90" */
    const CgGpuModel *gpu_model;   /* --emit kernels on GPUs: the cost model's GPU (--gpu-model, default h200) */
    const char *dump_kernels; /* a directory for one file per kernel, or NULL */
    int total_replicas;       /* over every rank */
    bool devices_given;       /* --devices was given (else --gpus, or the default) */
    const char *gpus_arg;     /* --gpus's value as given */
    bool fuse;                /* MGC_FUSE (default 1) */
    int conv;                 /* MGC_CONV: a ConvStrategy, or -1 (mgc chooses) */
    Leave leave;              /* --help, --version, ...: that, and nothing else */
    double agree_seconds;     /* MGC_AGREE_SECONDS */
    /* predict, evaluate, export */
    const char *checkpoint;   /* CK.safetensors */
    const char *data_arg;     /* DATA: a directory as --data takes, or a safetensors file (predict) */
    const char *out;          /* --out */
    ExportFormat format;      /* --format (or told by --out's name) */
    bool train_split;         /* --split train */
    bool inference;           /* drv_compile's evaluation form through the inference rewrite (export, --emit infer-ir) */
    bool no_fold;             /* --no-fold: that rewrite leaves BatchNorm apart from the layer before it */
    bool normalize_given, resize_given, precision_given;   /* said on the command line (against the checkpoint's) */
    bool batch_size_given;    /* --batch-size was given (mgc export --format c: the images a thread runs together) */
} Cli;

/* mgc NET.net --evaluate --load CK (mgc evaluate's older form): the
   checkpoint's transform (with its statistics) and precision, as mgc
   evaluate takes them. 0, 1 or 2 said. */
int  drv_evaluate_transform(Cli *c);
/* mgc predict, evaluate or export (use.c). The exit status. */
int  drv_use(Cli *c, World *w);

#endif
