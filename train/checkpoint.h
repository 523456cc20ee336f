/*
** checkpoint.c: saving, loading and resuming.
*/
#ifndef MGC_TRAIN_CHECKPOINT_H
#define MGC_TRAIN_CHECKPOINT_H
#include "group.h"
#include "ckmodel.h"

/* What --resume reads from a checkpoint's metadata besides its tensors. */
typedef struct Resume {
    unsigned long long epoch, steps, seed, batch_size, accumulate;
    char schedule[256];       /* the learning-rate recipe (train_schedule_str), or "" (an older mgc's checkpoint) */
    char optimizer[256];      /* the optimizer (train_optimizer_str), or "" (an older mgc's) */
    unsigned long long optimizer_steps;   /* the steps its optimizer's state has taken (= steps in an older mgc's) */
    char transform[256];      /* --resize, --augment, --normalize in words (transform_str, "none"), or "" (an older mgc's) */
} Resume;

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
/* net: the name of the net being trained; a checkpoint whose metadata names another net and does
   not fit is said in one line, not a line a tensor */
int  train_load_checkpoint(Store *s, const char *path, const char *net, Resume *resume, const TrainConfig *cfg);
/* --shard-update: the optimizer state of the checkpoint at path, whole per parameter, into every
   replica's slice (after train_load_checkpoint, which loads the rest); 0, or -1 said. */
int  train_load_shards(Group *g, const char *path, const Resume *resume);
/* --resume: says on rank 0 where the run goes on from (and what differs
   from the first run's recipe); the first epoch to train. */
int  train_resume_from(Group *g, const Resume *r);

#endif
