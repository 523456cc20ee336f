/*
** The ranks' agreement before they start (see agree.h). The hashes are
** gathered first (a few hundred bytes a rank); the items' texts only when
** some hash differs, for rank 0 to say what differs.
*/
#include "agree.h"
#include "codegen.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS (AGREE_MAX_ITEMS + 1)   /* a rank's gathered hashes: its item count, then each item's */

static AgreeItem *next_item(Agreement *a, const char *name)
{
    if (a->n == AGREE_MAX_ITEMS) return NULL;   /* a programming error: the list is fixed in the driver */
    AgreeItem *it = &a->item[a->n++];
    memset(it, 0, sizeof *it);
    snprintf(it->name, sizeof it->name, "%s", name);
    return it;
}

void rt_agree_add(Agreement *a, const char *name, const char *fmt, ...)
{
    AgreeItem *it = next_item(a, name);
    if (!it) return;
    va_list ap;
    va_start(ap, fmt);
    char *whole = NULL;
    if (vasprintf(&whole, fmt, ap) < 0) whole = NULL;
    va_end(ap);
    const char *v = whole ? whole : "";
    it->hash = cg_fnv1a(CG_FNV1A_START, v, strlen(v));
    snprintf(it->value, sizeof it->value, "%s", v);
    free(whole);
}

void rt_agree_add_hash(Agreement *a, const char *name, uint64_t hash, const char *shown)
{
    AgreeItem *it = next_item(a, name);
    if (!it) return;
    it->hash = hash;
    snprintf(it->value, sizeof it->value, "%s", shown);
}

/* ---------------------------------------------------------------- saying what differs */

/* What rank 0 has gathered: every rank's hashes and items. */
typedef struct Gathered {
    const uint64_t *hashes;   /* [rank * SLOTS]: the count, then the items' */
    const AgreeItem *items;   /* [rank * AGREE_MAX_ITEMS + item] */
    int size;
} Gathered;

/* Rank r's item `at`, or NULL where its list is shorter (another mgc's). */
static const AgreeItem *item_of(const Gathered *g, int r, int at)
{
    return (int)g->hashes[(size_t)r * SLOTS] > at ? &g->items[(size_t)r * AGREE_MAX_ITEMS + at] : NULL;
}

static bool same(const Gathered *g, int r, int q, int at)
{
    const AgreeItem *a = item_of(g, r, at), *b = item_of(g, q, at);
    return a && b ? a->hash == b->hash : a == b;
}

/* "rank 1", "ranks 0, 2 and 3": the ranks whose item `at` is rank first's. */
static void ranks_with(const Gathered *g, int at, int first, char *out, size_t cap)
{
    int count = 0, p = 0;
    for (int r = 0; r < g->size; r++) count += same(g, r, first, at);
    p += snprintf(out, cap, "rank%s", count == 1 ? "" : "s");
    int said = 0;
    for (int r = 0; r < g->size && p < (int)cap; r++) {
        if (!same(g, r, first, at)) continue;
        said++;
        if (said > 8 && said < count) continue;   /* a long list: the first eight and the last */
        const char *sep = said == 1 ? " " : said == count ? " and " : ", ";
        if (said == count && count > 9) sep = ", ..., ";
        p += snprintf(out + p, cap - (size_t)p, "%s%d", sep, r);
    }
}

static const char *text_of(const Gathered *g, int r, int at)
{
    const AgreeItem *it = item_of(g, r, at);
    return !it ? "(not in this rank's list: another mgc?)" : it->value[0] ? it->value : "(none)";
}

/* Value v as shown where the values first differ at byte `at`: whole when
   short, else AGREE_SHOWN characters from the start of the list element
   ("a, b, c") or word before `at`, with "..." where it is cut. */
static void window(const char *v, size_t at, char *out, size_t cap)
{
    size_t n = strlen(v);
    if (n <= AGREE_SHOWN) {
        snprintf(out, cap, "%s", v);
        return;
    }
    if (at > n) at = n;
    size_t from = at;   /* from the start of the part of a list that differs, else of a word */
    while (from > 0 && at - from < 100 && !(from >= 2 && v[from - 2] == ',' && v[from - 1] == ' ')) from--;
    if (at - from >= 100)
        for (from = at > 40 ? at - 40 : 0; from > 0 && v[from - 1] != ' ' && at - from < 100;) from--;
    if (at + 40 <= AGREE_SHOWN) from = 0;   /* the difference is within the value's first part */
    bool more = n - from > AGREE_SHOWN || n == AGREE_TEXT - 1;         /* cut here, or when kept */
    snprintf(out, cap, "%s%.*s%s", from ? "..." : "", AGREE_SHOWN, v + from, more ? "..." : "");
}

/* Rank 0's message: item `at` differs; each value with its ranks, two
   different values never shown alike (the part that differs; the digests
   where even that is the same). */
static void say_difference(const Gathered *g, int at)
{
    const char *name = "";
    for (int r = 0; r < g->size && !name[0]; r++)
        if (item_of(g, r, at)) name = item_of(g, r, at)->name;
    int *group = malloc(sizeof(int) * (size_t)g->size), ngroups = 0;   /* each value's first rank */
    for (int r = 0; r < g->size; r++) {
        int k = 0;
        while (k < ngroups && !same(g, group[k], r, at)) k++;
        if (k == ngroups) group[ngroups++] = r;
    }
    /* where the values first differ from rank 0's */
    size_t from = (size_t)-1;
    const char *ref = text_of(g, 0, at);
    for (int k = 1; k < ngroups; k++) {
        const char *v = text_of(g, group[k], at);
        size_t d = 0;
        while (ref[d] && ref[d] == v[d]) d++;
        if (d < from) from = d;
    }
    char (*shown)[AGREE_SHOWN + 64] = calloc((size_t)ngroups, sizeof *shown);
    bool alike = false;
    for (int k = 0; k < ngroups; k++) {
        window(text_of(g, group[k], at), from, shown[k], sizeof shown[k]);
        for (int j = 0; j < k; j++) alike |= !strcmp(shown[j], shown[k]);
    }
    fprintf(stderr, "mgc: the %d ranks were not started alike: %s differs", g->size, name);
    for (int k = 0; k < ngroups; k++) {
        char who[256];
        ranks_with(g, at, group[k], who, sizeof who);
        const AgreeItem *it = item_of(g, group[k], at);
        fprintf(stderr, "%s%s: %s", k ? "; " : " (", who, shown[k]);
        if (alike && it) fprintf(stderr, " [digest %016llx]", (unsigned long long)it->hash);
    }
    fprintf(stderr, ")\nmgc: every rank must run the same mgc on the same net, options, environment and data "
                    "(one mpirun command line for all); none has started\n");
    free(shown);
    free(group);
}

int rt_agree(World *w, const Agreement *a, double deadline)
{
    if (w->size <= 1) return 0;
    uint64_t *mine = calloc(SLOTS, sizeof *mine), *hashes = malloc(sizeof *mine * SLOTS * (size_t)w->size);
    mine[0] = (uint64_t)a->n;
    for (int k = 0; k < a->n; k++) mine[k + 1] = a->item[k].hash;
    if (rt_world_allgather_within(w, mine, hashes, sizeof *mine * SLOTS, deadline))
        return AGREE_LATE;   /* mine and hashes stay: the collective may still use them until the world ends */
    /* the first item some rank has otherwise than rank 0 (a shorter list's
       missing items hash to 0); else, where only the counts differ, the first
       item some rank lacks */
    int differ = -1;
    for (int k = 0; k < AGREE_MAX_ITEMS && differ < 0; k++)
        for (int r = 1; r < w->size; r++)
            if (hashes[(size_t)r * SLOTS + k + 1] != hashes[k + 1]) {
                differ = k;
                break;
            }
    for (int r = 1; r < w->size && differ < 0; r++)
        if (hashes[(size_t)r * SLOTS] != hashes[0])
            differ = (int)(hashes[(size_t)r * SLOTS] < hashes[0] ? hashes[(size_t)r * SLOTS] : hashes[0]);
    free(mine);
    if (differ < 0) {
        free(hashes);
        return 0;
    }
    AgreeItem *all = calloc((size_t)w->size * AGREE_MAX_ITEMS, sizeof *all);
    rt_world_allgather(w, a->item, all, sizeof(AgreeItem) * AGREE_MAX_ITEMS);
    if (w->rank == 0) say_difference(&(Gathered){ hashes, all, w->size }, differ);
    free(all);
    free(hashes);
    return -1;
}
