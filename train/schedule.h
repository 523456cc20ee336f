/*
** schedule.c: the learning rate's schedule (train_lr, train.h) and the recipe in words.
*/
#ifndef MGC_TRAIN_SCHEDULE_H
#define MGC_TRAIN_SCHEDULE_H
#include "train.h"
#include <stddef.h>

/* The learning-rate recipe in words (a checkpoint's "lr_schedule"): what --resume compares. */
void train_schedule_str(const TrainConfig *cfg, char *out, size_t size);
/* The optimizer in words (a checkpoint's "optimizer"): "adamw betas 0.9,0.999 eps 1e-08 weight decay 0.01". */
void train_optimizer_str(const TrainConfig *cfg, char *out, size_t size);

#endif
