/*
** Arena allocator: bump allocation in large blocks, freed all at once.
*/
#include "arena.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ArenaBlock {
    ArenaBlock *next;
    size_t used, size;     /* bytes used / capacity of data[] */
    _Alignas(16) unsigned char data[];
};

void arena_init(Arena *a) { a->head = NULL; }

void arena_free(Arena *a)
{
    ArenaBlock *b = a->head;
    while (b) {
        ArenaBlock *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

void *arena_alloc(Arena *a, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    ArenaBlock *b = a->head;
    if (!b || b->used + size > b->size) {
        size_t cap = size > (1u << 20) ? size : (1u << 20);
        b = malloc(sizeof *b + cap);
        if (!b) {
            fprintf(stderr, "mgc: out of memory (arena block of %zu bytes)\n", cap);
            abort();
        }
        b->used = 0;
        b->size = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += size;
    memset(p, 0, size);
    return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_vprintf(Arena *a, const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    char *p = arena_alloc(a, (size_t)n + 1);
    vsnprintf(p, (size_t)n + 1, fmt, again);
    va_end(again);
    return p;
}

char *arena_printf(Arena *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *p = arena_vprintf(a, fmt, ap);
    va_end(ap);
    return p;
}

void *arena_grow(Arena *a, void *old, size_t old_size, size_t new_size)
{
    void *p = arena_alloc(a, new_size);
    if (old && old_size) memcpy(p, old, old_size < new_size ? old_size : new_size);
    return p;
}
