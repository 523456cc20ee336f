/*
** Agreement of the ranks before they start: each rank lists what must be
** the same everywhere (what it was asked to do, the net's text, --set, the
** options that shape the run, the program's plan, the data), and rt_agree
** compares the lists across the ranks with one collective. Ranks started
** differently would otherwise hang in a collective, crash, or train apart
** without a word; this way every rank stops at once and rank 0 names the
** first difference and who differs, as DDP checks its parameters' shapes
** across processes.
*/
#ifndef MGC_AGREE_H
#define MGC_AGREE_H
#include "world.h"
#include <stdint.h>

#define AGREE_MAX_ITEMS 64
#define AGREE_TEXT 1024      /* the part of a value kept to show (the hash is of the whole value) */
#define AGREE_SHOWN 160      /* the part of a long value shown: around where the values differ */
#define AGREE_LATE (-2)      /* rt_agree: some rank did not come within the deadline */

typedef struct AgreeItem {
    char name[48];            /* what it is: "--epochs", "the net's text" */
    char value[AGREE_TEXT];   /* as shown: "3", "nets/lenet.net, 1,024 bytes" (the first AGREE_TEXT - 1 characters) */
    uint64_t hash;            /* of the whole value */
} AgreeItem;

typedef struct Agreement {
    AgreeItem item[AGREE_MAX_ITEMS];
    int n;
} Agreement;

/* An item whose value is the text printf makes (hashed whole). */
void rt_agree_add(Agreement *a, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An item known by a digest of something large, shown as `shown`. */
void rt_agree_add_hash(Agreement *a, const char *name, uint64_t hash, const char *shown);
/* Every rank's list against rank 0's, in order (collectives; every rank
   calls it at the same point). 0 when all agree; -1 on every rank when they
   differ, and rank 0 has said which item differs first, with each rank's
   value (where two long values differ, the part that differs) and its ranks.
   With deadline > 0 (seconds): AGREE_LATE when some rank has not come in
   that time, said by this rank; the collective is left pending, so the
   caller can only end the world (rt_world_abort). */
int rt_agree(World *w, const Agreement *a, double deadline);

#endif
