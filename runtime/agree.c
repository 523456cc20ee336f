/*
** The ranks' agreement before they start (see agree.h).
*/
#include "agree.h"
#include "codegen.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    size_t n = strlen(v);
    if (n < sizeof it->value) snprintf(it->value, sizeof it->value, "%s", v);
    else snprintf(it->value, sizeof it->value, "%.*s...", (int)sizeof it->value - 4, v);
    free(whole);
}

void rt_agree_add_hash(Agreement *a, const char *name, uint64_t hash, const char *shown)
{
    AgreeItem *it = next_item(a, name);
    if (!it) return;
    it->hash = hash;
    snprintf(it->value, sizeof it->value, "%s", shown);
}

/* "rank 1", "ranks 0, 2 and 3": the ranks whose item `at` is rank first's. */
static void ranks_with(const AgreeItem *all, int size, int at, int first, char *out, size_t cap)
{
    int count = 0, p = 0;
    for (int r = 0; r < size; r++) count += all[r * AGREE_MAX_ITEMS + at].hash == all[first * AGREE_MAX_ITEMS + at].hash;
    p += snprintf(out, cap, "rank%s", count == 1 ? "" : "s");
    int said = 0;
    for (int r = 0; r < size && p < (int)cap; r++) {
        if (all[r * AGREE_MAX_ITEMS + at].hash != all[first * AGREE_MAX_ITEMS + at].hash) continue;
        said++;
        if (said > 8 && said < count) continue;   /* a long list: the first eight and the last */
        const char *sep = said == 1 ? " " : said == count ? " and " : ", ";
        if (said == count && count > 9) sep = ", ..., ";
        p += snprintf(out + p, cap - (size_t)p, "%s%d", sep, r);
    }
}

int rt_agree(World *w, const Agreement *a)
{
    if (w->size <= 1) return 0;
    /* the hashes first (small), then the items' texts only where they differ */
    uint64_t mine[AGREE_MAX_ITEMS + 1] = { (uint64_t)a->n };
    for (int k = 0; k < a->n; k++) mine[k + 1] = a->item[k].hash;
    uint64_t *hashes = malloc(sizeof mine * (size_t)w->size);
    rt_world_allgather(w, mine, hashes, sizeof mine);
    int differ = -1;   /* the first item some rank has otherwise than rank 0 */
    for (int k = 0; k <= AGREE_MAX_ITEMS && differ < 0; k++)
        for (int r = 1; r < w->size; r++)
            if (hashes[(size_t)r * (AGREE_MAX_ITEMS + 1) + k] != hashes[k]) {
                differ = k == 0 ? 0 : k - 1;   /* a different number of items: a different mgc, shown by its first */
                break;
            }
    free(hashes);
    if (differ < 0) return 0;
    AgreeItem *all = calloc((size_t)w->size * AGREE_MAX_ITEMS, sizeof *all);
    rt_world_allgather(w, a->item, all, sizeof(AgreeItem) * AGREE_MAX_ITEMS);
    if (w->rank == 0) {
        fprintf(stderr, "mgc: the %d ranks were not started alike: %s differs", w->size, all[differ].name);
        bool *said = calloc((size_t)w->size, sizeof *said);
        const char *sep = " (";
        for (int r = 0; r < w->size; r++) {
            if (said[r]) continue;
            char who[256];
            ranks_with(all, w->size, differ, r, who, sizeof who);
            for (int q = r; q < w->size; q++)
                said[q] |= all[q * AGREE_MAX_ITEMS + differ].hash == all[r * AGREE_MAX_ITEMS + differ].hash;
            fprintf(stderr, "%s%s: %s", sep, who, all[r * AGREE_MAX_ITEMS + differ].value[0] ? all[r * AGREE_MAX_ITEMS + differ].value : "(none)");
            sep = "; ";
        }
        free(said);
        fprintf(stderr, ")\nmgc: every rank must run the same mgc on the same net, options, environment and data "
                        "(one mpirun command line for all); none has started\n");
    }
    free(all);
    return -1;
}
