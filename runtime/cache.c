/*
** The kernel cache on disk: where it lives, and how it is kept to a size.
**
** Entries are files named HASH.REST, HASH 16 hex digits: HASH.so with its
** HASH.so.seal and the sources HASH.K.c (CPU kernels), HASH.sm_XX.cubin
** or HASH.compute_XX.ptx (CUDA kernels), and while a compile runs or after it
** failed its objects, logs and temporary files. An entry is complete when its
** .so, .cubin or .ptx is there; its last use is the newest modification time
** among its files (a hit touches that main file). After an entry is added,
** the least recently used complete entries are removed while the cache holds
** more than its limit (MGC_CACHE_MB, default 1000 MB) and until it holds at
** most 80% of it, and what a compile left behind a day ago and never
** finished is removed too.
*/
#include "runtime.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *rt_cache_dir(char *buf, size_t size)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && *xdg) snprintf(buf, size, "%s/mgc", xdg);
    else snprintf(buf, size, "%s/.cache/mgc", getenv("HOME") ? getenv("HOME") : "/tmp");
    return buf;
}

uint64_t rt_fnv1a(uint64_t h, const char *s) { return cg_fnv1a(h, s, strlen(s)); }

static int mkdirs(const char *path)
{
    char tmp[4608];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
    return 0;
}

int rt_kernel_cache(char *kdir, size_t size, char *err, size_t err_size)
{
    char dir[4096];
    rt_cache_dir(dir, sizeof dir);
    snprintf(kdir, size, "%s/kernels", dir);
    if (mkdirs(kdir)) {
        snprintf(err, err_size, "cannot create the kernel cache directory '%s': %s (set XDG_CACHE_HOME to a writable place)",
                 kdir, strerror(errno));
        return -1;
    }
    return 0;
}

long long rt_cache_limit(void)
{
    const char *s = getenv("MGC_CACHE_MB");
    if (s && *s) {
        char *end;
        errno = 0;
        double mb = strtod(s, &end);
        if (!*end && !errno && mb > 0 && mb <= 1e9) return (long long)(mb * 1e6);
        static int told;
        if (!told++) fprintf(stderr, "mgc: MGC_CACHE_MB='%s' is not a size in MB (a number above 0): keeping the cache to 1000 MB\n", s);
    }
    return 1000LL * 1000 * 1000;
}

void rt_cache_touch(const char *path) { utimensat(AT_FDCWD, path, NULL, 0); }

/* The 16 hex digits that start name, followed by a dot: 0 and *hash, else -1. */
static int entry_hash(const char *name, uint64_t *hash)
{
    uint64_t h = 0;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0) return -1;
        h = h << 4 | (uint64_t)v;
    }
    if (name[16] != '.') return -1;
    *hash = h;
    return 0;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* an entry's main file: there when the entry is complete */
static bool main_file(const char *name)
{
    return ends_with(name, ".so") || ends_with(name, ".cubin") || ends_with(name, ".ptx");
}

typedef struct { uint64_t hash; long long used; /* ns */ long long bytes; bool complete; } Entry;

static int by_hash(const void *a, const void *b)
{
    uint64_t x = ((const Entry *)a)->hash, y = ((const Entry *)b)->hash;
    return x < y ? -1 : x > y;
}

static int by_use(const void *a, const void *b)
{
    long long x = ((const Entry *)a)->used, y = ((const Entry *)b)->used;
    return x < y ? -1 : x > y;
}

/* The entries of the cache kdir, one per hash (files of a hash summed): a
   malloc'd array of *n, or NULL when the directory cannot be read. */
static Entry *scan(const char *kdir, int *n)
{
    DIR *d = opendir(kdir);
    if (!d) return NULL;
    int cap = 256, m = 0;
    Entry *e = malloc(sizeof *e * (size_t)cap);
    struct dirent *de;
    char path[4608];
    while (e && (de = readdir(d))) {
        uint64_t h;
        struct stat st;
        if (entry_hash(de->d_name, &h)) continue;
        snprintf(path, sizeof path, "%s/%s", kdir, de->d_name);
        if (lstat(path, &st) || !S_ISREG(st.st_mode)) continue;
        if (m == cap) {
            Entry *g = realloc(e, sizeof *e * (size_t)(cap *= 2));
            if (!g) break;
            e = g;
        }
        e[m++] = (Entry){ h, (long long)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec, (long long)st.st_size, main_file(de->d_name) };
    }
    closedir(d);
    if (!e) return NULL;
    qsort(e, (size_t)m, sizeof *e, by_hash);
    int k = 0;
    for (int i = 0; i < m; i++) {
        if (k && e[k - 1].hash == e[i].hash) {
            Entry *p = &e[k - 1];
            p->bytes += e[i].bytes;
            if (e[i].used > p->used) p->used = e[i].used;
            p->complete |= e[i].complete;
        } else {
            e[k++] = e[i];
        }
    }
    *n = k;
    return e;
}

/* Removes every file of the entry hash in kdir: the main file first, so
   that no reader finds half an entry; the number of bytes freed. */
static long long remove_entry(const char *kdir, uint64_t hash)
{
    DIR *d = opendir(kdir);
    if (!d) return 0;
    char prefix[24], path[4608];
    snprintf(prefix, sizeof prefix, "%016llx.", (unsigned long long)hash);
    long long freed = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct dirent *de;
        rewinddir(d);
        while ((de = readdir(d))) {
            if (strncmp(de->d_name, prefix, 17)) continue;
            if (main_file(de->d_name) != (pass == 0)) continue;
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", kdir, de->d_name);
            if (!lstat(path, &st) && S_ISREG(st.st_mode) && !unlink(path)) freed += (long long)st.st_size;
        }
    }
    closedir(d);
    return freed;
}

void rt_cache_prune(uint64_t keep, bool verbose)
{
    char kdir[4200], err[512];
    if (rt_kernel_cache(kdir, sizeof kdir, err, sizeof err)) return;
    int n;
    Entry *e = scan(kdir, &n);
    if (!e) return;
    long long limit = rt_cache_limit(), total = 0;
    long long day_ago = ((long long)time(NULL) - 24 * 3600) * 1000000000;
    int removed = 0;
    long long freed = 0;
    for (int i = 0; i < n; i++) {   /* left by a compile that never finished: a day is long enough to read its log */
        if (!e[i].complete && e[i].used < day_ago && e[i].hash != keep) {
            freed += remove_entry(kdir, e[i].hash);
            removed++;
            e[i].bytes = 0;
        }
        total += e[i].bytes;
    }
    if (total > limit) {
        qsort(e, (size_t)n, sizeof *e, by_use);
        for (int i = 0; i < n && total > limit / 10 * 8; i++) {
            if (!e[i].complete || e[i].hash == keep) continue;
            long long f = remove_entry(kdir, e[i].hash);
            freed += f;
            total -= e[i].bytes;
            removed++;
        }
    }
    free(e);
    if (verbose && removed)
        fprintf(stderr, "mgc: kernel cache %s over its limit of %.6g MB (MGC_CACHE_MB): removed %d entr%s used least recently, %.1f MB\n",
                kdir, (double)limit / 1e6, removed, removed == 1 ? "y" : "ies", (double)freed / 1e6);
}

int rt_cache_report(bool clear, FILE *out)
{
    char kdir[4200], err[512];
    if (rt_kernel_cache(kdir, sizeof kdir, err, sizeof err)) {
        fprintf(stderr, "mgc: %s\n", err);
        return 1;
    }
    int n;
    Entry *e = scan(kdir, &n);
    if (!e) {
        fprintf(stderr, "mgc: cannot read the kernel cache '%s': %s\n", kdir, strerror(errno));
        return 1;
    }
    long long total = 0, freed = 0;
    int complete = 0;
    for (int i = 0; i < n; i++) {
        total += e[i].bytes;
        complete += e[i].complete;
        if (clear) freed += remove_entry(kdir, e[i].hash);
    }
    free(e);
    if (clear)
        fprintf(out, "kernel cache %s: removed %d entr%s, %.1f MB\n", kdir, n, n == 1 ? "y" : "ies", (double)freed / 1e6);
    else
        fprintf(out, "kernel cache %s: %d entr%s (%d complete), %.1f MB of at most %.6g MB (MGC_CACHE_MB)\n", kdir, n,
                n == 1 ? "y" : "ies", complete, (double)total / 1e6, (double)rt_cache_limit() / 1e6);
    return 0;
}
