/*
** Agreement of the ranks before they start: each rank lists what must be
** the same everywhere (the net's text, --set, the options that shape the run,
** the program's plan, the data), and rt_agree compares the lists across the
** ranks with one collective. Ranks started differently would otherwise hang
** in a collective, crash, or train apart without a word; this way every rank
** stops at once and rank 0 names the first difference and who differs, as
** DDP checks its parameters' shapes across processes.
*/
#ifndef MGC_AGREE_H
#define MGC_AGREE_H
#include "world.h"
#include <stdint.h>

#define AGREE_MAX_ITEMS 48
#define AGREE_VALUE 160      /* the part of a value shown in the message */

typedef struct AgreeItem {
    char name[48];            /* what it is: "--epochs", "the net's text" */
    char value[AGREE_VALUE];  /* as shown: "3", "nets/lenet.net, 1,024 bytes" */
    uint64_t hash;            /* of the whole value (which may be longer than what is shown) */
} AgreeItem;

typedef struct Agreement {
    AgreeItem item[AGREE_MAX_ITEMS];
    int n;
} Agreement;

/* An item whose value is the text printf makes (hashed whole). */
void rt_agree_add(Agreement *a, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An item known by a digest of something large, shown as `shown`. */
void rt_agree_add_hash(Agreement *a, const char *name, uint64_t hash, const char *shown);
/* Every rank's list against rank 0's, in order (one collective; every rank
   calls it at the same point). 0 when all agree; else -1 on every rank, and
   rank 0 has said which item differs first, with each value and its ranks. */
int rt_agree(World *w, const Agreement *a);

#endif
