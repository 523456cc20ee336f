/*
** The kernel cache on disk: where it lives, what is trusted there, and how it
** is kept to a size.
**
** Entries are files named HASH.REST, HASH 16 hex digits: HASH.so with its
** HASH.so.seal (CPU kernels), HASH.sm_XX.cubin or HASH.compute_XX.ptx (CUDA
** kernels), and while a compile runs, or after it failed, its private work
** directory HASH.build.XXXXXXXXXXXX (the sources, objects and the compiler's
** messages). An entry is complete when its .so, .cubin or .ptx is there; its
** last use is the newest modification time among its files (a hit touches
** that main file). After an entry is added, the least recently used complete
** entries are removed while the cache holds more than its limit (MGC_CACHE_MB,
** default 1000 MB) and until it holds at most 80% of it, and what a compile
** left behind a day ago and never finished is removed too.
**
** Everything here works on descriptors, never on a path that could move:
** the cache's directory is reached from "/" one component at a time
** (cache_walk), each directory checked as it is opened, and from then on
** every file is opened, created, renamed and removed relative to it (openat,
** renameat, unlinkat) without following a link.
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
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/*
** What is trusted. Kernels are code that mgc loads into itself (dlopen) or
** onto a GPU, so the cache is trusted only where nobody but the user could
** have put anything there, as ssh's StrictModes judges ~/.ssh:
**   - every directory on the way to the cache root belongs to the user or to
**     root and is writable by nobody else, unless it is sticky (like /tmp:
**     others may add names there, but not rename or remove the user's);
**   - a symbolic link on the way is followed only when it belongs to the
**     user or to root (it sits in a directory just checked, so nobody else
**     can replace it); a link of anyone else's is refused, wherever it points
**     now, since its owner may repoint it at any moment;
**   - the cache root ($XDG_CACHE_HOME/mgc, else ~/.cache/mgc) and its kernels
**     directory belong to the user and are writable by nobody else; kernels/
**     is never a link;
**   - every entry loaded is a regular file of the user's, writable by nobody
**     else, opened without following a link (one that is not is compiled
**     again and replaced).
** Once checked, the kernels directory is held open and everything else is
** done relative to it: a link repointed after the check changes nothing,
** and what is loaded is the file that was checked (dlopen of
** /proc/self/fd/N, see cc.c).
** There is no shared fallback: without XDG_CACHE_HOME and HOME the home
** directory is the passwd entry's, and where there is none of the user's,
** the kernels go to a private directory made for the run (0700) and removed
** when it ends. The seal beside a .so is a check against truncation and
** garbage, not against anyone: ownership is the guard.
*/

/* the run's own cache, when there is no home: made once, held open */
static pthread_mutex_t private_lock = PTHREAD_MUTEX_INITIALIZER;
static char private_dir[4096];   /* its path, for messages */
static int private_fd = -1;      /* the directory */
static int private_parent = -1;  /* the directory it is in ($TMPDIR) */

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
    else if ((st->st_mode & (S_IWGRP | S_IWOTH)) && (own || !S_ISDIR(st->st_mode) || !(st->st_mode & S_ISVTX)))
        snprintf(why, size, "is writable by %s (mode %04o)",
                 (st->st_mode & S_IWGRP) && (st->st_mode & S_IWOTH) ? "its group and others"
                 : st->st_mode & S_IWGRP                            ? "its group"
                                                                    : "others",
                 (unsigned)(st->st_mode & 07777));
    return why;
}

/* err: the cache `cache` is not trusted because of `part`, for `why`, and the fix. */
static int untrusted(const char *cache, const char *part, const char *why, const char *fix, char *err, size_t err_size)
{
    snprintf(err, err_size, "the kernel cache %s is not trusted: %s %s. mgc loads compiled kernels only from a directory "
             "that nobody else can write to, nor any directory above it: %s, or set XDG_CACHE_HOME to a directory of "
             "your own", cache, part, why, fix);
    return -1;
}

/* The directory fd (at shown) checked: 0, or -1 with err. */
static int check_dir(int fd, const char *shown, bool own, const char *cache, char *err, size_t err_size)
{
    struct stat st;
    char why[512], fix[PATH_MAX + 64];
    if (fstat(fd, &st)) {
        snprintf(err, err_size, "cannot check the kernel cache directory '%s': %s", shown, strerror(errno));
        return -1;
    }
    if (!*distrust(&st, own, why, sizeof why)) return 0;
    if (st.st_uid != geteuid() && own) snprintf(fix, sizeof fix, "remove %s (or chown it to yourself)", shown);
    else if (st.st_uid != geteuid() && st.st_uid != 0) snprintf(fix, sizeof fix, "move the cache elsewhere");
    else snprintf(fix, sizeof fix, "chmod go-w %s", shown);
    return untrusted(cache, shown, why, fix, err, err_size);
}

/* shown + "/" + name, or shown without its last component for "..". */
static void shown_step(char *shown, size_t size, const char *name)
{
    size_t n = strlen(shown);
    if (!strcmp(name, "..")) {
        char *slash = strrchr(shown, '/');
        if (slash && slash != shown) *slash = 0;
        else snprintf(shown, size, "/");
    } else {
        snprintf(shown + n, size - n, "%s%s", n > 1 ? "/" : "", name);
    }
}

/*
** Opens the directory `path` (absolute) the way the kernel would resolve it,
** but one component at a time from "/" and never letting the kernel follow a
** link: each directory reached is opened with O_NOFOLLOW and checked
** (distrust: each as a directory above the cache before anything in it is
** opened, the last as the cache root, own, when own_last); a link is
** followed by hand only when it is the user's or root's, at most 40 of them.
** create: missing directories are made (0700).
** The last directory's descriptor (O_PATH) goes to *out and its resolved
** path to shown. 0, or -1 with err naming the cache `cache`.
*/
static int cache_walk(const char *path, bool create, bool own_last, const char *cache, int *out, char *shown,
                      size_t shown_size, char *err, size_t err_size)
{
    char rest[2 * PATH_MAX], comp[NAME_MAX + 1];
    if (path[0] != '/' || strlen(path) >= PATH_MAX) {
        snprintf(err, err_size, "the kernel cache directory '%s' is not an absolute path of at most %d bytes", path, PATH_MAX - 1);
        return -1;
    }
    snprintf(rest, sizeof rest, "%s", path);
    int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC), links = 0;
    snprintf(shown, shown_size, "/");
    if (fd < 0) {
        snprintf(err, err_size, "cannot open / for the kernel cache: %s", strerror(errno));
        return -1;
    }
    bool checked = false;   /* fd checked as a directory above the cache: before anything in it is opened */
    char *at = rest;
    for (;;) {
        while (*at == '/') at++;
        if (!*at) break;
        size_t len = strcspn(at, "/");
        if (len > NAME_MAX) {
            snprintf(err, err_size, "cannot open the kernel cache directory '%s': a name in it is longer than %d bytes", path, NAME_MAX);
            close(fd);
            return -1;
        }
        memcpy(comp, at, len);
        comp[len] = 0;
        at += len;
        if (!strcmp(comp, ".")) continue;
        if (!checked && check_dir(fd, shown, false, cache, err, err_size)) {
            close(fd);
            return -1;
        }
        checked = true;
        int next = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT && create) {
            if (mkdirat(fd, comp, 0700) && errno != EEXIST) {
                snprintf(err, err_size, "cannot create the kernel cache directory '%s/%s': %s (set XDG_CACHE_HOME to a "
                         "writable place)", strcmp(shown, "/") ? shown : "", comp, strerror(errno));
                close(fd);
                return -1;
            }
            next = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        struct stat st;
        if (next < 0 && (errno == ENOTDIR || errno == ELOOP) && !fstatat(fd, comp, &st, AT_SYMLINK_NOFOLLOW) && S_ISLNK(st.st_mode)) {
            char link_path[PATH_MAX + NAME_MAX + 2], who[128], me[128], why[512], fix[PATH_MAX + 64];
            snprintf(link_path, sizeof link_path, "%s%s%s", shown, strcmp(shown, "/") ? "/" : "", comp);
            if (st.st_uid != geteuid() && st.st_uid != 0) {
                snprintf(why, sizeof why, "is a symbolic link that belongs to %s, not to %s who runs mgc (or root): its "
                         "owner can point it elsewhere at any moment", owner_str(st.st_uid, who, sizeof who),
                         owner_str(geteuid(), me, sizeof me));
                snprintf(fix, sizeof fix, "use the directory it points to instead of the link");
                close(fd);
                return untrusted(cache, link_path, why, fix, err, err_size);
            }
            char target[PATH_MAX + 1];
            ssize_t n = readlinkat(fd, comp, target, sizeof target - 1);
            if (n <= 0 || ++links > 40 || (size_t)n + strlen(at) + 2 > sizeof rest) {
                snprintf(err, err_size, "cannot follow the symbolic link %s on the way to the kernel cache: %s", link_path,
                         n <= 0 ? strerror(errno) : links > 40 ? "too many levels of links" : "the path grows too long");
                close(fd);
                return -1;
            }
            target[n] = 0;
            memmove(rest + n + 1, at, strlen(at) + 1);   /* rest = target/at (checked to fit above) */
            memcpy(rest, target, (size_t)n);
            rest[n] = '/';
            at = rest;
            if (target[0] == '/') {   /* from the root again */
                close(fd);
                fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
                snprintf(shown, shown_size, "/");
                checked = false;
                if (fd < 0) {
                    snprintf(err, err_size, "cannot open / for the kernel cache: %s", strerror(errno));
                    return -1;
                }
            }
            continue;
        }
        if (next < 0) {
            snprintf(err, err_size, "cannot open the kernel cache directory '%s%s%s': %s%s", shown, strcmp(shown, "/") ? "/" : "",
                     comp, strerror(errno), errno == ENOENT ? " (set XDG_CACHE_HOME to a directory that exists)" : "");
            close(fd);
            return -1;
        }
        close(fd);
        fd = next;
        checked = false;
        shown_step(shown, shown_size, comp);
    }
    if (check_dir(fd, shown, own_last, cache, err, err_size)) {
        close(fd);
        return -1;
    }
    *out = fd;
    return 0;
}

/* Removes what a work or private directory holds (files and links, never
   followed; one level) and the directory itself, name in parent: the bytes
   freed. */
static long long remove_dir_at(int parent, const char *name)
{
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    long long freed = 0;
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (fd >= 0 && !d) close(fd);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        struct stat st;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) || S_ISDIR(st.st_mode)) continue;
        if (!unlinkat(dirfd(d), de->d_name, 0)) freed += S_ISREG(st.st_mode) ? (long long)st.st_size : 0;
    }
    if (d) closedir(d);
    unlinkat(parent, name, AT_REMOVEDIR);
    return freed;
}

static void remove_private_dir(void)
{
    if (private_fd < 0) return;
    remove_dir_at(private_fd, "kernels");
    const char *base = strrchr(private_dir, '/');
    if (base && private_parent >= 0) unlinkat(private_parent, base + 1, AT_REMOVEDIR);
}

/* The home directory of the effective user: $HOME, else the passwd entry's. */
static const char *home_dir(void)
{
    const char *home = getenv("HOME");
    if (home && *home) return home;
    struct passwd *pw = getpwuid(geteuid());
    return pw && pw->pw_dir && pw->pw_dir[0] == '/' ? pw->pw_dir : NULL;
}

/* n random lower-case hex digits into out (n + 1 bytes) */
static void random_hex(char *out, int n)
{
    unsigned char r[32];
    if (n > 64) n = 64;
    if (getrandom(r, (size_t)(n + 1) / 2, GRND_NONBLOCK) != (ssize_t)((n + 1) / 2)) {   /* no entropy yet: unique enough */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        uint64_t x = (uint64_t)t.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)t.tv_sec;
        for (int i = 0; i < 32; i++) r[i] = (unsigned char)(x >> (i % 8 * 8)) ^ (unsigned char)i;
    }
    for (int i = 0; i < n; i++) out[i] = "0123456789abcdef"[r[i / 2] >> (i % 2 * 4) & 15];
    out[n] = 0;
}

/* A directory made in parent (0700) as prefix + 12 random hex digits, opened
   (O_RDONLY, not following a link) and checked to be the user's alone; its
   name in name. The descriptor, or -1 with errno. */
static int make_private_dir(int parent, const char *prefix, char *name, size_t size)
{
    for (int tries = 0; tries < 64; tries++) {
        char r[13];
        random_hex(r, 12);
        snprintf(name, size, "%s%s", prefix, r);
        if (mkdirat(parent, name, 0700)) {
            if (errno == EEXIST) continue;
            return -1;
        }
        int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        char why[256];
        if (fd >= 0 && (fstat(fd, &st) || *distrust(&st, true, why, sizeof why))) {
            close(fd);
            errno = EPERM;
            return -1;
        }
        return fd;
    }
    errno = EEXIST;
    return -1;
}

/* The cache root's path into buf: $XDG_CACHE_HOME/mgc, else ~/.cache/mgc,
   else a private directory (its path, and *private a descriptor of it, held
   for the run). 0, or -1 with err (XDG_CACHE_HOME relative). */
static int cache_root(char *buf, size_t size, int *private, char *err, size_t err_size)
{
    *private = -1;
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
    int home_err = !home || home[0] != '/' ? 0 : stat(home, &st) ? errno : 0;
    if (home && home[0] == '/' && !home_err && S_ISDIR(st.st_mode) && st.st_uid == geteuid()) {
        snprintf(buf, size, "%s/.cache/mgc", strcmp(home, "/") ? home : "");
        return 0;
    }
    /* why there is none, as the note says it: HOME given but unusable is not HOME unset */
    char why[PATH_MAX + 96];
    const char *env_home = getenv("HOME");
    if (!env_home || !*env_home) snprintf(why, sizeof why, "HOME and XDG_CACHE_HOME unset");
    else if (env_home[0] != '/') snprintf(why, sizeof why, "HOME='%s' is not an absolute path", env_home);
    else if (home_err) snprintf(why, sizeof why, "HOME=%s: %s", env_home, strerror(home_err));
    else if (!S_ISDIR(st.st_mode)) snprintf(why, sizeof why, "HOME=%s is not a directory", env_home);
    else snprintf(why, sizeof why, "HOME=%s belongs to uid %d, not to this one", env_home, (int)st.st_uid);
    /* no home of the user's (a system account, a container): a directory of this run's own */
    pthread_mutex_lock(&private_lock);
    int rc = 0;
    if (private_fd < 0) {
        const char *tmp = getenv("TMPDIR");
        char shown[PATH_MAX], name[64];
        tmp = tmp && tmp[0] == '/' ? tmp : "/tmp";
        int parent = -1, fd = -1;
        char walk_err[1024] = "";
        /* checked as a directory above the cache: a shared $TMPDIR (/tmp) is root's and sticky */
        if (!cache_walk(tmp, false, false, tmp, &parent, shown, sizeof shown, walk_err, sizeof walk_err))
            fd = make_private_dir(parent, "mgc-kernels-", name, sizeof name);
        if (fd >= 0) {
            snprintf(private_dir, sizeof private_dir, "%s/%s", tmp, name);
            private_fd = fd;
            private_parent = parent;
            atexit(remove_private_dir);
            fprintf(stderr, "mgc: note: no home directory of uid %d (%s): the kernels are compiled into %s, for this run "
                    "only (set XDG_CACHE_HOME to keep them)\n", (int)geteuid(), why, private_dir);
        } else {
            snprintf(err, err_size, "no home directory for the kernel cache, and cannot make one in %s: %s (set "
                     "XDG_CACHE_HOME to a directory of yours)", tmp, parent < 0 ? walk_err : strerror(errno));
            if (parent >= 0) close(parent);
            rc = -1;
        }
    }
    if (!rc) {
        snprintf(buf, size, "%s", private_dir);
        *private = private_fd;
    }
    pthread_mutex_unlock(&private_lock);
    return rc;
}

int rt_cache_open(CacheDir *c, char *err, size_t err_size)
{
    char root[PATH_MAX], shown[PATH_MAX];
    int private, rfd;
    c->fd = -1;
    if (cache_root(root, sizeof root, &private, err, err_size)) return -1;
    snprintf(c->path, sizeof c->path, "%s/kernels", root);
    if (private >= 0) rfd = dup(private);
    else if (cache_walk(root, true, true, c->path, &rfd, shown, sizeof shown, err, err_size)) return -1;
    if (rfd < 0) {
        snprintf(err, err_size, "cannot open the kernel cache '%s': %s", root, strerror(errno));
        return -1;
    }
    /* kernels/: made here if missing, a directory of the user's, never a link */
    int fd = openat(rfd, "kernels", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        if (mkdirat(rfd, "kernels", 0700) && errno != EEXIST) {
            snprintf(err, err_size, "cannot create the kernel cache directory '%s': %s (set XDG_CACHE_HOME to a writable "
                     "place)", c->path, strerror(errno));
            close(rfd);
            return -1;
        }
        fd = openat(rfd, "kernels", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    int open_errno = errno;
    struct stat st;
    bool link = fd < 0 && !fstatat(rfd, "kernels", &st, AT_SYMLINK_NOFOLLOW) && S_ISLNK(st.st_mode);
    close(rfd);
    if (link) return untrusted(c->path, c->path, "is a symbolic link (mgc makes it a directory)",
                               "remove the link", err, err_size);
    if (fd < 0) {
        snprintf(err, err_size, "cannot open the kernel cache directory '%s': %s", c->path, strerror(open_errno));
        return -1;
    }
    if (check_dir(fd, c->path, true, c->path, err, err_size)) {
        close(fd);
        return -1;
    }
    c->fd = fd;
    return 0;
}

void rt_cache_close(CacheDir *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

int rt_cache_open_entry(const CacheDir *c, const char *name, bool quiet)
{
    int fd = openat(c->fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    char why[512];
    struct stat st;
    if (fd < 0) {
        if (errno == ENOENT) return -1;
        if (errno == ELOOP) snprintf(why, sizeof why, "is a symbolic link");
        else snprintf(why, sizeof why, "cannot be opened (%s)", strerror(errno));
    } else if (fstat(fd, &st)) {
        snprintf(why, sizeof why, "cannot be checked (%s)", strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(why, sizeof why, "is not a regular file");
    } else {
        distrust(&st, true, why, sizeof why);
    }
    if (!why[0]) return fd;
    if (fd >= 0) close(fd);
    if (!quiet)
        fprintf(stderr, "mgc: not loading the cached kernels %s/%s: the file %s; compiling them again in its place (mgc "
                "loads only what nobody else could have written)\n", c->path, name, why);
    return -1;
}

int rt_cache_workdir(const CacheDir *c, uint64_t hash, char *name, size_t size)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%016llx.build.", (unsigned long long)hash);
    return make_private_dir(c->fd, prefix, name, size);
}

int rt_cache_create(int dir, const char *name)
{
    int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0 && fchmod(fd, 0644)) {   /* whatever the umask: writable by its owner only */
        int e = errno;
        close(fd);
        unlinkat(dir, name, 0);
        errno = e;
        return -1;
    }
    return fd;
}

int rt_cache_put(const CacheDir *c, const char *name, const void *data, size_t size)
{
    char tmp[NAME_MAX + 1], r[13];
    random_hex(r, 12);
    snprintf(tmp, sizeof tmp, "%.200s.%s.tmp", name, r);
    int fd = rt_cache_create(c->fd, tmp);
    if (fd < 0) return -1;
    const char *p = data;
    size_t left = size;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        p += n;
        left -= (size_t)n;
    }
    int e = errno;
    if (close(fd) || left > 0 || renameat(c->fd, tmp, c->fd, name)) {
        if (left > 0) errno = e ? e : ENOSPC;
        e = errno;
        unlinkat(c->fd, tmp, 0);
        errno = e;
        return -1;
    }
    return 0;
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

void rt_cache_touch(int fd) { futimens(fd, NULL); }

long long rt_cache_remove_dir(int dir, const char *name) { return remove_dir_at(dir, name); }

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

static long long mtime_ns(const struct stat *st) { return (long long)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec; }

/* A work directory's bytes, and its newest modification time in *used. */
static long long dir_bytes(int parent, const char *name, long long *used)
{
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (fd >= 0 && !d) close(fd);
    long long bytes = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        struct stat st;
        if (de->d_name[0] == '.' || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode)) continue;
        bytes += (long long)st.st_size;
        if (mtime_ns(&st) > *used) *used = mtime_ns(&st);
    }
    if (d) closedir(d);
    return bytes;
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

/* A fresh stream over the cache directory (its own descriptor), or NULL. */
static DIR *open_listing(const CacheDir *c)
{
    int fd = openat(c->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (fd >= 0 && !d) close(fd);
    return d;
}

/* The entries of the cache, one per hash (files and work directories of a
   hash summed): a malloc'd array of *n, or NULL when it cannot be read. */
static Entry *scan(const CacheDir *c, int *n)
{
    DIR *d = open_listing(c);
    if (!d) return NULL;
    int cap = 256, m = 0;
    Entry *e = malloc(sizeof *e * (size_t)cap);
    struct dirent *de;
    while (e && (de = readdir(d))) {
        uint64_t h;
        struct stat st;
        if (entry_hash(de->d_name, &h) || fstatat(c->fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW)) continue;
        if (m == cap) {
            Entry *g = realloc(e, sizeof *e * (size_t)(cap *= 2));
            if (!g) break;
            e = g;
        }
        long long used = mtime_ns(&st);
        long long bytes = S_ISREG(st.st_mode) ? (long long)st.st_size : S_ISDIR(st.st_mode) ? dir_bytes(c->fd, de->d_name, &used) : 0;
        e[m++] = (Entry){ h, used, bytes, S_ISREG(st.st_mode) && main_file(de->d_name) };
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

/* Removes the files of the entry hash (unlinkat: a link is removed, never
   followed): the main file first, so that no reader finds half an entry;
   then its work directories older than a day, or all of them with all (a
   younger one may be another process's compile). The bytes freed. */
static long long remove_entry(const CacheDir *c, uint64_t hash, bool all)
{
    DIR *d = open_listing(c);
    if (!d) return 0;
    char prefix[24];
    snprintf(prefix, sizeof prefix, "%016llx.", (unsigned long long)hash);
    long long freed = 0, day_ago = ((long long)time(NULL) - 24 * 3600) * 1000000000;
    for (int pass = 0; pass < 2; pass++) {
        struct dirent *de;
        rewinddir(d);
        while ((de = readdir(d))) {
            struct stat st;
            if (strncmp(de->d_name, prefix, 17) || fstatat(c->fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW)) continue;
            bool first = S_ISREG(st.st_mode) && main_file(de->d_name);
            if (first != (pass == 0)) continue;
            if (S_ISDIR(st.st_mode)) {
                long long used = mtime_ns(&st);
                dir_bytes(c->fd, de->d_name, &used);
                if (all || used < day_ago) freed += remove_dir_at(c->fd, de->d_name);
            } else if (!unlinkat(c->fd, de->d_name, 0) && S_ISREG(st.st_mode)) {
                freed += (long long)st.st_size;
            }
        }
    }
    closedir(d);
    return freed;
}

void rt_cache_prune(uint64_t keep, bool verbose)
{
    CacheDir c;
    char err[1024];
    if (rt_cache_open(&c, err, sizeof err)) return;
    long long limit = rt_cache_limit(), total = 0;
    int n;
    Entry *e = limit < 0 ? NULL : scan(&c, &n);   /* the driver stops at a bad MGC_CACHE_MB before anything is compiled */
    if (!e) {
        rt_cache_close(&c);
        return;
    }
    long long day_ago = ((long long)time(NULL) - 24 * 3600) * 1000000000;
    int removed = 0;
    long long freed = 0;
    for (int i = 0; i < n; i++) {   /* left by a compile that never finished: a day is long enough to read its log */
        if (!e[i].complete && e[i].used < day_ago && e[i].hash != keep) {
            freed += remove_entry(&c, e[i].hash, true);
            removed++;
            e[i].bytes = 0;
        }
        total += e[i].bytes;
    }
    if (total > limit) {
        qsort(e, (size_t)n, sizeof *e, by_use);
        for (int i = 0; i < n && total > limit / 10 * 8; i++) {
            if (!e[i].complete || e[i].hash == keep) continue;
            freed += remove_entry(&c, e[i].hash, false);
            total -= e[i].bytes;
            removed++;
        }
    }
    free(e);
    if (verbose && removed)
        fprintf(stderr, "mgc: kernel cache %s over its limit of %.6g MB (MGC_CACHE_MB): removed %d entr%s used least recently, %.1f MB\n",
                c.path, (double)limit / 1e6, removed, removed == 1 ? "y" : "ies", (double)freed / 1e6);
    rt_cache_close(&c);
}

int rt_cache_report(bool clear, FILE *out)
{
    CacheDir c;
    char err[1024];
    if (rt_cache_open(&c, err, sizeof err)) {
        fprintf(stderr, "mgc: %s\n", err);
        return 1;
    }
    int n;
    Entry *e = scan(&c, &n);
    if (!e) {
        fprintf(stderr, "mgc: cannot read the kernel cache '%s': %s\n", c.path, strerror(errno));
        rt_cache_close(&c);
        return 1;
    }
    long long total = 0, freed = 0;
    int complete = 0;
    for (int i = 0; i < n; i++) {
        total += e[i].bytes;
        complete += e[i].complete;
        if (clear) freed += remove_entry(&c, e[i].hash, true);
    }
    free(e);
    if (clear)
        fprintf(out, "kernel cache %s: removed %d entr%s, %.1f MB\n", c.path, n, n == 1 ? "y" : "ies", (double)freed / 1e6);
    else
        fprintf(out, "kernel cache %s: %d entr%s (%d complete), %.1f MB of at most %.6g MB (MGC_CACHE_MB)\n", c.path, n,
                n == 1 ? "y" : "ies", complete, (double)total / 1e6, (double)rt_cache_limit() / 1e6);
    rt_cache_close(&c);
    return 0;
}

uint64_t rt_fnv1a(uint64_t h, const char *s) { return cg_fnv1a(h, s, strlen(s)); }
