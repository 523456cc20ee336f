/*
** epoch.c: the epoch loop, evaluation, the epoch's report and log.
*/
#ifndef MGC_TRAIN_EPOCH_H
#define MGC_TRAIN_EPOCH_H
#include "group.h"
#include <stdio.h>

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
