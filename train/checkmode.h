/*
** checkmode.c: K steps on one batch, dumped for the tests (--batch/--dump).
*/
#ifndef MGC_TRAIN_CHECKMODE_H
#define MGC_TRAIN_CHECKMODE_H
#include "group.h"

/* --batch: K steps on one batch, dumped with --dump. The exit status. */
int  train_check_mode(Group *g);

#endif
