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
    e->data = calloc((size_t)e->numel, sizeof(float));
    e->mem = NULL;
    e->init = n->init;
    e->fan_in = n->fan_in;
    e->trainable = n->trainable;
    return s->n++;
}

float *rt_store_bind(Store *s, int k, Device *d)
{
    StoreEntry *e = &s->e[k];
    if (d->host_memory) return e->data;
    s->dev = d;
    if (!e->mem) e->mem = d->ops->alloc(d, sizeof(float) * (size_t)e->numel);
    return e->mem;
}

bool rt_store_is_running(const StoreEntry *e) { return !e->trainable && strstr(e->name, "running_"); }

static bool wanted(const StoreEntry *e, StoreWhich which)
{
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
        free(s->e[k].data);
        if (s->e[k].mem) s->dev->ops->release(s->dev, s->e[k].mem);
    }
    free(s->e);
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
        case INIT_ZEROS: case INIT_NONE:
            memset(e->data, 0, sizeof(float) * (size_t)e->numel);
            break;
        }
    }
}

