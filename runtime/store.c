/*
** The Store: persistent tensors by name (parameters, BatchNorm running
** statistics, momentum buffers), shared by the training and evaluation
** programs of one replica, so evaluation sees the current weights with no copy.
**
** Every tensor has host memory (data: initialised, loaded, saved, copied
** between replicas there). On a device with memory of its own it also has a
** device copy (mem), which is what the programs compute with; upload and
** download move them across when the host needs them (the training loop says
** when: after initialising, before evaluating, saving or comparing).
*/
#include "runtime.h"
#include "rng.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

StoreEntry *rt_store_find(Store *s, const char *name)
{
    for (int k = 0; k < s->n; k++)
        if (strcmp(s->e[k].name, name) == 0) return &s->e[k];
    return NULL;
}

int rt_store_add(Store *s, const Buf *n)
{
    StoreEntry *e = rt_store_find(s, n->name);
    if (e) return ir_shape_eq(&e->shape, &n->shape) ? (int)(e - s->e) : -1;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->e = realloc(s->e, sizeof(StoreEntry) * (size_t)s->cap);
    }
    e = &s->e[s->n];
    e->name = strdup(n->name);
    e->shape = n->shape;
    e->numel = ir_numel(&n->shape, 1);
    e->pack = n->pack >= 0 && n->pack_at >= 0 && n->pack_at + e->numel <= n->pack_floats ? n->pack : -1;
    e->shard_of = n->shard_of;
    if (e->pack >= 0) {   /* --shard-update: the bucket's parameters side by side, one block */
        if (e->pack >= s->npacks) {
            s->packs = realloc(s->packs, sizeof(float *) * (size_t)(e->pack + 1));
            s->pack_mem = realloc(s->pack_mem, sizeof(float *) * (size_t)(e->pack + 1));
            s->pack_floats = realloc(s->pack_floats, sizeof(long) * (size_t)(e->pack + 1));
            s->pack_shared = realloc(s->pack_shared, sizeof(bool) * (size_t)(e->pack + 1));
            for (int k = s->npacks; k <= e->pack; k++) s->packs[k] = s->pack_mem[k] = NULL, s->pack_floats[k] = 0, s->pack_shared[k] = false;
            s->npacks = e->pack + 1;
        }
        s->pack_floats[e->pack] = n->pack_floats;
        const Store *o = s->share;   /* replicas with one memory: one block for them all */
        if (!s->packs[e->pack] && o && e->pack < o->npacks && o->packs[e->pack] && o->pack_floats[e->pack] == n->pack_floats)
            s->packs[e->pack] = o->packs[e->pack], s->pack_shared[e->pack] = true;
        if (!s->packs[e->pack]) s->packs[e->pack] = calloc((size_t)n->pack_floats, sizeof(float));
        e->data = s->packs[e->pack] ? s->packs[e->pack] + n->pack_at : NULL;
    } else {
        e->data = calloc((size_t)e->numel, sizeof(float));
    }
    e->mem = NULL;
    e->init = n->init;
    e->fan_in = n->fan_in;
    e->init_arg = n->init_arg;
    e->trainable = n->trainable;
    return s->n++;
}

float *rt_store_bind(Store *s, int k, Device *d)
{
    StoreEntry *e = &s->e[k];
    if (d->host_memory) return e->data;
    s->dev = d;
    if (!e->mem && e->pack >= 0) {   /* --shard-update: in the bucket's block on the device too */
        if (!s->pack_mem[e->pack]) s->pack_mem[e->pack] = d->ops->alloc(d, sizeof(float) * (size_t)s->pack_floats[e->pack]);
        if (s->pack_mem[e->pack]) e->mem = s->pack_mem[e->pack] + (e->data - s->packs[e->pack]);
    } else if (!e->mem) {
        e->mem = d->ops->alloc(d, sizeof(float) * (size_t)e->numel);
    }
    return e->mem;
}

bool rt_store_is_running(const StoreEntry *e) { return !e->trainable && strstr(e->name, "running_"); }

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && !strcmp(s + n - t, tail);
}

bool rt_store_is_variance(const StoreEntry *e)
{
    return (rt_store_is_running(e) && ends_with(e->name, "running_var")) || (!e->trainable && ends_with(e->name, ".exp_avg_sq"));
}

const char *rt_store_kind(const StoreEntry *e)
{
    return e->trainable ? "parameter" : rt_store_is_running(e) ? "running statistic" : "optimizer state";
}

/* Whether the float whose bits are u is out of bounds: inf or NaN (every exponent bit
   set), or, in a variance, below 0 (the sign set, and not -0). On the bits, in blocks
   of a fixed count: -O2's vectoriser takes those (it left a loop of float compares
   scalar, at 1.7 GB/s). */
static inline uint32_t out_of_bounds(uint32_t u, uint32_t variance)
{
    return ((u & 0x7f800000u) == 0x7f800000u) | (variance & (u > 0x80000000u));
}

StoreCheck rt_store_check(const StoreEntry *e)
{
    enum { BLOCK = 64 };
    StoreCheck c = { 0, 0, -1, 0 };
    const float *x = e->data;
    long n = e->numel, i = 0;
    uint32_t variance = rt_store_is_variance(e), any = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int j = 0; j < BLOCK; j++) {
            uint32_t u;
            memcpy(&u, x + i + j, sizeof u);
            any |= out_of_bounds(u, variance);
        }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        any |= out_of_bounds(u, variance);
    }
    if (!any) return c;
    for (i = 0; i < n; i++) {
        bool nonfinite = !isfinite(x[i]), negative = !nonfinite && variance && x[i] < 0;
        if ((nonfinite || negative) && c.first < 0) c.first = i, c.value = x[i];
        c.nonfinite += nonfinite;
        c.negative += negative;
    }
    return c;
}

const char *rt_store_check_str(const StoreEntry *e, const StoreCheck *c, char *buf, size_t size)
{
    char nf[64] = "", neg[96] = "";
    if (c->nonfinite) snprintf(nf, sizeof nf, "%ld value%s that %s not finite", c->nonfinite, c->nonfinite == 1 ? "" : "s",
                               c->nonfinite == 1 ? "is" : "are");
    if (c->negative) snprintf(neg, sizeof neg, "%s%ld value%s below 0, which a variance cannot be", c->nonfinite ? " and " : "",
                              c->negative, c->negative == 1 ? "" : "s");
    snprintf(buf, size, "%s '%s' holds %s%s, of %ld (the first, element %ld, is %g)", rt_store_kind(e), e->name, nf, neg, e->numel,
             c->first, (double)c->value);
    return buf;
}

static bool wanted(const StoreEntry *e, StoreWhich which)
{
    if (which == STORE_SHARDS) return e->shard_of >= 0;
    return which == STORE_ALL || (which == STORE_RUNNING) == rt_store_is_running(e);
}

void rt_store_upload(Store *s, StoreWhich which)
{
    for (int k = 0; s->dev && k < s->n; k++)
        if (s->e[k].mem && wanted(&s->e[k], which))
            s->dev->ops->upload(s->dev, s->e[k].mem, s->e[k].data, sizeof(float) * (size_t)s->e[k].numel);
    if (s->dev) s->dev->ops->synchronize(s->dev);
}

void rt_store_download(Store *s, StoreWhich which)
{
    for (int k = 0; s->dev && k < s->n; k++)
        if (s->e[k].mem && wanted(&s->e[k], which))
            s->dev->ops->download(s->dev, s->e[k].data, s->e[k].mem, sizeof(float) * (size_t)s->e[k].numel);
}

void rt_store_free(Store *s)
{
    for (int k = 0; k < s->n; k++) {
        free((char *)s->e[k].name);
        if (s->e[k].pack < 0) free(s->e[k].data);
        if (s->e[k].mem && s->e[k].pack < 0) s->dev->ops->release(s->dev, s->e[k].mem);
    }
    free(s->e);
    for (int k = 0; k < s->npacks; k++) {
        if (!s->pack_shared[k]) free(s->packs[k]);
        if (s->pack_mem[k]) s->dev->ops->release(s->dev, s->pack_mem[k]);
    }
    free(s->packs);
    free(s->pack_mem);
    free(s->pack_floats);
    free(s->pack_shared);
    memset(s, 0, sizeof *s);
}

void rt_store_init(Store *s, unsigned long long seed)
{
    Rng r;
    rng_seed(&r, seed);
    for (int k = 0; k < s->n; k++) {
        StoreEntry *e = &s->e[k];
        switch (e->init) {
        case INIT_UNIFORM_FAN_IN: {
            float bound = 1.0f / sqrtf((float)e->fan_in);
            for (long i = 0; i < e->numel; i++) e->data[i] = rng_uniform(&r, -bound, bound);
            break;
        }
        case INIT_ONES:
            for (long i = 0; i < e->numel; i++) e->data[i] = 1.0f;
            break;
        case INIT_CONSTANT:
            for (long i = 0; i < e->numel; i++) e->data[i] = e->init_arg;
            break;
        case INIT_NORMAL:
            for (long i = 0; i < e->numel; i++) e->data[i] = rng_normal(&r, 0.0f, e->init_arg);
            break;
        case INIT_ZEROS: case INIT_NONE:
            memset(e->data, 0, sizeof(float) * (size_t)e->numel);
            break;
        }
    }
}

