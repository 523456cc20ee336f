/*
** A calloc that fails for one size: LD_PRELOAD'ed into one rank of an mpirun
** (tests/dp.sh) so that the checkpoint's gather and load of --shard-update's
** state meet a rank short of memory. FAILCALLOC_N=n: every calloc(n, 4)
** returns NULL (the state's buffers are calloc(numel + 1, sizeof(float))).
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>

void *calloc(size_t n, size_t size)
{
    static void *(*real)(size_t, size_t);
    static long fail = -2;
    if (fail == -2) {
        const char *e = getenv("FAILCALLOC_N");
        fail = e ? atol(e) : -1;
    }
    if ((long)n == fail && size == 4) {
        errno = ENOMEM;
        return NULL;
    }
    if (!real) {
        /* dlsym may calloc: the first call's memory from a small static pool */
        static char pool[4096];
        static size_t used;
        static int inside;
        if (inside) {
            size_t want = (n * size + 15) & ~(size_t)15;
            if (used + want > sizeof pool) return NULL;
            used += want;
            return pool + used - want;
        }
        inside = 1;
        real = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
        inside = 0;
    }
    return real(n, size);
}
