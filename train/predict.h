/*
** predict.c: mgc predict, every example's logits from a checkpoint.
*/
#ifndef MGC_TRAIN_PREDICT_H
#define MGC_TRAIN_PREDICT_H
#include "group.h"

/* mgc predict on d (the whole of it, in its order): the logits of every
   example into cfg->predict (.safetensors, .csv or .jsonl), and with labels
   the accuracy and the confusion matrix on stdout. 0, or 1 said. */
int  train_predict(Group *g, const Dataset *d, int *order, const DataInfo *info);

#endif
