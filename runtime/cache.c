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
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/*
** What is trusted. Kernels are code that mgc loads into itself (dlopen) or
** onto a GPU, so the cache is trusted only where nobody but the user could
** have put anything there, as ssh's StrictModes judges ~/.ssh:
**   - every directory above the cache root belongs to the user or to root and
**     is writable by nobody else, unless it is sticky (like /tmp: others may
**     add names there, but not rename or remove the user's);
**   - the cache root ($XDG_CACHE_HOME/mgc, else ~/.cache/mgc) and its kernels
**     directory belong to the user and are writable by nobody else;
**   - every entry loaded is a regular file of the user's, writable by nobody
**     else (one that is not is compiled again and replaced).
** There is no shared fallback: without XDG_CACHE_HOME and HOME the home
** directory is the passwd entry's, and where there is none of the user's,
** the kernels go to a private directory made for the run (mkdtemp, 0700)
** and removed when it ends. The seal beside a .so is a check against
** truncation and garbage, not against anyone: ownership is the guard.
*/
static pthread_mutex_t private_lock = PTHREAD_MUTEX_INITIALIZER;
static char private_dir[4096];   /* the run's own cache, when there is no home */

static void remove_private_dir(void)
{
    char kdir[4200];
    snprintf(kdir, sizeof kdir, "%s/kernels", private_dir);
    DIR *d = opendir(kdir);
    struct dirent *de;
    char path[4608];
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", kdir, de->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(kdir);
    rmdir(private_dir);
}

/* The home directory of the effective user: $HOME, else the passwd entry's. */
static const char *home_dir(void)
{
    const char *home = getenv("HOME");
    if (home && *home) return home;
    struct passwd *pw = getpwuid(geteuid());
    return pw && pw->pw_dir && pw->pw_dir[0] == '/' ? pw->pw_dir : NULL;
}

int rt_cache_root(char *buf, size_t size, char *err, size_t err_size)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && *xdg) {
        if (xdg[0] != '/') {   /* the XDG spec: a relative path is invalid */
            snprintf(err, err_size, "XDG_CACHE_HOME='%s' is not an absolute path (the kernel cache goes to "
                     "$XDG_CACHE_HOME/mgc): give one starting with /, or unset it for ~/.cache", xdg);
            return -1;
        }
        snprintf(buf, size, "%s/mgc", xdg);
        return 0;
    }
    const char *home = home_dir();
    struct stat st;
    if (home && !stat(home, &st) && S_ISDIR(st.st_mode) && st.st_uid == geteuid()) {
        snprintf(buf, size, "%s/.cache/mgc", strcmp(home, "/") ? home : "");
        return 0;
    }
    /* no home of the user's (a system account, a container): a directory of this run's own */
    pthread_mutex_lock(&private_lock);
    int rc = 0;
    if (!private_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(private_dir, sizeof private_dir, "%s/mgc-kernels-XXXXXX", tmp && tmp[0] == '/' ? tmp : "/tmp");
        if (mkdtemp(private_dir)) {
            atexit(remove_private_dir);
            fprintf(stderr, "mgc: note: no home directory of uid %d (HOME and XDG_CACHE_HOME unset): the kernels are "
                    "compiled into %s, for this run only (set XDG_CACHE_HOME to keep them)\n", (int)geteuid(), private_dir);
        } else {
            snprintf(err, err_size, "no home directory for the kernel cache, and cannot make one in %.*s: %s (set "
                     "XDG_CACHE_HOME to a directory of yours)", (int)(strrchr(private_dir, '/') - private_dir),
                     private_dir, strerror(errno));
            private_dir[0] = 0;
            rc = -1;
        }
    }
    if (!rc) snprintf(buf, size, "%s", private_dir);
    pthread_mutex_unlock(&private_lock);
    return rc;
}

uint64_t rt_fnv1a(uint64_t h, const char *s) { return cg_fnv1a(h, s, strlen(s)); }

static int mkdirs(const char *path)
{
    char tmp[4608];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
            *p = '/';
        }
    if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
    return 0;
}

/* "uid 1000 (alice)" */
static const char *owner_str(uid_t uid, char *buf, size_t size)
{
    struct passwd *pw = getpwuid(uid);
    if (pw && pw->pw_name) snprintf(buf, size, "uid %d (%s)", (int)uid, pw->pw_name);
    else snprintf(buf, size, "uid %d", (int)uid);
    return buf;
}

/* What is wrong with st (a directory on the way to the cache, or the cache and
   below when own): "" when nothing. */
static const char *distrust(const struct stat *st, bool own, char *why, size_t size)
{
    char who[128], me[128];
    uid_t euid = geteuid();
    why[0] = 0;
    if (st->st_uid != euid && (own || st->st_uid != 0))
        snprintf(why, size, "belongs to %s, not to %s who runs mgc%s", owner_str(st->st_uid, who, sizeof who),
                 owner_str(euid, me, sizeof me), own ? "" : " (or root)");
    else if ((st->st_mode & (S_IWGRP | S_IWOTH)) && (own || !(st->st_mode & S_ISVTX)))
        snprintf(why, size, "is writable by %s (mode %04o)",
                 (st->st_mode & S_IWGRP) && (st->st_mode & S_IWOTH) ? "its group and others"
                 : st->st_mode & S_IWGRP                            ? "its group"
                                                                    : "others",
                 (unsigned)(st->st_mode & 07777));
    return why;
}

/* dir (the cache root, root_len its length, or below it) is trusted: 0, or
   -1 with err saying what was found and what to do. */
static int check_trusted(const char *dir, size_t root_len, char *err, size_t err_size)
{
    char real[PATH_MAX], why[512];
    if (!realpath(dir, real)) {
        snprintf(err, err_size, "cannot resolve the kernel cache directory '%s': %s", dir, strerror(errno));
        return -1;
    }
    /* the root's own resolved length: components from there on must be the user's */
    char root[PATH_MAX], rroot[PATH_MAX];
    snprintf(root, sizeof root, "%.*s", (int)root_len, dir);
    size_t own_from = realpath(root, rroot) ? strlen(rroot) : strlen(real);
    size_t n = strlen(real);
    for (size_t at = 1; at <= n; at++) {   /* "/", then each longer prefix that ends a component */
        if (at > 1 && at < n && real[at] != '/') continue;
        char part[PATH_MAX];
        snprintf(part, sizeof part, "%.*s", (int)at, real);
        struct stat st;
        if (stat(part, &st)) {
            snprintf(err, err_size, "cannot check the kernel cache directory '%s': %s", part, strerror(errno));
            return -1;
        }
        bool own = at >= own_from;
        if (*distrust(&st, own, why, sizeof why)) {
            char fix[PATH_MAX + 64];
            if (st.st_uid != geteuid() && own) snprintf(fix, sizeof fix, "remove %s (or chown it to yourself)", part);
            else if (st.st_uid != geteuid() && st.st_uid != 0) snprintf(fix, sizeof fix, "move the cache elsewhere");
            else snprintf(fix, sizeof fix, "chmod go-w %s", part);
            snprintf(err, err_size, "the kernel cache %s is not trusted: %s %s. mgc loads compiled kernels only from a "
                     "directory that nobody else can write to, nor any directory above it: %s, or set XDG_CACHE_HOME "
                     "to a directory of your own", dir, part, why, fix);
            return -1;
        }
    }
    return 0;
}

int rt_kernel_cache(char *kdir, size_t size, char *err, size_t err_size)
{
    char dir[4096];
    if (rt_cache_root(dir, sizeof dir, err, err_size)) return -1;
    snprintf(kdir, size, "%s/kernels", dir);
    if (mkdirs(kdir)) {
        snprintf(err, err_size, "cannot create the kernel cache directory '%s': %s (set XDG_CACHE_HOME to a writable place)",
                 kdir, strerror(errno));
        return -1;
    }
    return check_trusted(kdir, strlen(dir), err, err_size);
}

int rt_cache_entry_trusted(int fd, const char *path, bool quiet)
{
    struct stat st;
    char why[512];
    if (fstat(fd, &st)) return -1;
    if (!S_ISREG(st.st_mode)) snprintf(why, sizeof why, "is not a regular file");
    else distrust(&st, true, why, sizeof why);
    if (!why[0]) return 0;
    if (!quiet)
        fprintf(stderr, "mgc: not loading the cached kernels %s: the file %s; compiling them again in its place (mgc "
                "loads only what nobody else could have written)\n", path, why);
    return -1;
}

FILE *rt_cache_create(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return NULL;
    if (fchmod(fd, 0644)) {   /* whatever the umask: writable by its owner only */
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) close(fd);
    return f;
}

long long rt_cache_limit(void)
{
    const char *s = getenv("MGC_CACHE_MB");
    if (s && *s) {
        double mb = diag_decimal(s, true) ? strtod(s, NULL) : -1;
        return mb > 0 && mb <= 1e9 ? (long long)(mb * 1e6) : -1;
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
    if (limit < 0) return;   /* the driver stops at a bad MGC_CACHE_MB before anything is compiled */
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
