/*
** Arena: one allocator owns every compile-time object of one compilation
** (AST, IR, generated source) and frees them at once with arena_free().
** Runtime objects (buffers, loaded kernels) have their own create/destroy.
*/
#ifndef MGC_ARENA_H
#define MGC_ARENA_H
#include <stdarg.h>
#include <stddef.h>

typedef struct ArenaBlock ArenaBlock;
typedef struct Arena {
    ArenaBlock *head;   /* newest block first */
} Arena;

void  arena_init(Arena *a);
void  arena_free(Arena *a);
void *arena_alloc(Arena *a, size_t size);          /* zeroed, 16-byte aligned */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *arena_vprintf(Arena *a, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Grow a buffer allocated in the arena (old contents copied; old space not reused). */
void *arena_grow(Arena *a, void *old, size_t old_size, size_t new_size);

#endif
