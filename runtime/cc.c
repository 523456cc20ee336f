/*
** Kernels for the CPU device: the generated C compiled by the system C
** compiler into a shared object, cached on disk by a hash of source, flags
** and compiler, and loaded with dlopen. The compiler runs in a private work
** directory of the cache, and the shared object is loaded through the
** descriptor of the file that was checked (cache.c says what is trusted).
*/
#include "runtime.h"
#include "pool.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A child's start: into the work directory wdir (the compiler's relative
   paths are its files; -1: stay), stdout and stderr to out (-1: /dev/null),
   what it writes writable by its owner only; then argv (no shell: paths with
   quotes or $(...) in them are only paths). Never returns. */
static void exec_child(char *const *argv, int wdir, int out)
{
    umask(022);
    if (wdir >= 0 && fchdir(wdir)) _exit(127);
    if (out < 0) out = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (out >= 0) {
        dup2(out, 1);
        dup2(out, 2);
    }
    execvp(argv[0], argv);
    _exit(127);
}

/* Waits for pid: its exit status, or -1 when it did not exit. */
static int wait_child(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* MGC_CC (default cc) as an argument vector: words split at spaces ("ccache
   gcc"); a relative path to the compiler made absolute (it runs in the work
   directory). */
typedef struct { char words[512], abs_cc[PATH_MAX]; } CcWords;
static int compiler_words(const char *cc, CcWords *buf, char **words, int most)
{
    snprintf(buf->words, sizeof buf->words, "%s", cc);
    int n = 0;
    char *save = NULL;
    for (char *w = strtok_r(buf->words, " \t", &save); w && n < most; w = strtok_r(NULL, " \t", &save)) words[n++] = w;
    if (n > 0 && words[0][0] != '/' && strchr(words[0], '/') && realpath(words[0], buf->abs_cc)) words[0] = buf->abs_cc;
    return n;
}

/* The first line of `cc --version`, part of the cache key. */
static void compiler_id(const char *cc, char *buf, size_t size)
{
    CcWords words_buf;
    char *argv[18];
    int n = compiler_words(cc, &words_buf, argv, 16);
    buf[0] = 0;
    if (n == 0) return;
    argv[n] = "--version";
    argv[n + 1] = NULL;
    int p[2];
    if (pipe2(p, O_CLOEXEC)) return;
    pid_t pid = fork();
    if (pid == 0) exec_child(argv, -1, p[1]);
    close(p[1]);
    char all[4096], chunk[4096];
    size_t got = 0;
    for (;;) {   /* all of it, the first 4 KB kept: the child never blocks on a full pipe */
        ssize_t r = pid > 0 ? read(p[0], chunk, sizeof chunk) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        size_t take = (size_t)r < sizeof all - 1 - got ? (size_t)r : sizeof all - 1 - got;
        memcpy(all + got, chunk, take);
        got += take;
    }
    close(p[0]);
    if (pid > 0 && wait_child(pid) == 0) {
        all[got] = 0;
        size_t line = strcspn(all, "\n");
        snprintf(buf, size, "%.*s\n", (int)line, all);
    }
}

/* each piece compiled to an object, then the objects linked into one shared object.
   -fno-trapping-math: no kernel reads the floating-point exception flags, and without it a loop of
   the prelude's expf, erff or tanhf (a GELU, SiLU or sigmoid) does not vectorise where the CPU has
   no masked vector operations (AVX2): the clamp's arms make a multiply conditional, one that "could
   trap", so not if-converted (a GELU's gradient 11.5 -> 1.4 ns an element on an AVX2 EPYC); the
   values are the same, element by element */
static const char kernel_flags[] = "-O3 -march=native -std=gnu11 -fPIC -fno-math-errno -fno-trapping-math -Wno-unused";

/* A cache entry's seal: "<size> <FNV-1a of its bytes>" of the open file fd
   (read from its start), or 0 when it cannot be read. */
static int seal_of(int fd, char *out, size_t size)
{
    uint64_t h = CG_FNV1A_START;
    long long n = 0;
    unsigned char buf[65536];
    for (;;) {
        ssize_t got = pread(fd, buf, sizeof buf, (off_t)n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return 0;
        if (got == 0) break;
        h = cg_fnv1a(h, buf, (size_t)got);
        n += got;
    }
    snprintf(out, size, "%lld %016llx\n", n, (unsigned long long)h);
    return 1;
}

/* What the cache entry `name`, open as fd (rt_cache_open_entry: the user's
   alone, not a link), is worth: ENTRY_OK when whole, its seal matching the
   one written beside it (name + ".seal") when it was compiled: a truncated or
   garbage shared object would crash dlopen (SIGBUS, SIGSEGV) on every later
   run. */
typedef enum { ENTRY_OK, ENTRY_UNSEALED, ENTRY_DAMAGED } EntryState;
static EntryState entry_state(const CacheDir *c, const char *name, int fd)
{
    char seal_name[NAME_MAX + 1], want[64] = "", have[64];
    snprintf(seal_name, sizeof seal_name, "%.200s.seal", name);
    int sfd = rt_cache_open_entry(c, seal_name, true);
    if (sfd < 0) return ENTRY_UNSEALED;
    ssize_t n = read(sfd, want, sizeof want - 1);
    close(sfd);
    want[n > 0 ? n : 0] = 0;
    return want[0] && seal_of(fd, have, sizeof have) && strcmp(want, have) == 0 ? ENTRY_OK : ENTRY_DAMAGED;
}

/* Runs the compiler on every piece in the work directory wdir, `jobs` at a
   time, each with its messages in logs[k] (open descriptors); each child
   waited for by its own pid, in order: other children of the process are
   not ours to reap. The index of the first piece that failed, or -1 when all
   compiled. */
static int compile_pieces(char ***argvs, const int *logs, int n, int jobs, int wdir)
{
    pid_t *pid = calloc((size_t)n + 1, sizeof *pid);
    int failed = -1, next = 0, first = 0;
    while (first < next || (next < n && failed < 0)) {
        while (next < n && next - first < jobs && failed < 0) {
            pid[next] = fork();
            if (pid[next] == 0) exec_child(argvs[next], wdir, logs[next]);
            if (pid[next] < 0) failed = next;
            else next++;
        }
        if (first == next) break;
        int st = wait_child(pid[first]);
        if (st != 0 && (failed < 0 || first < failed)) failed = first;
        first++;
    }
    free(pid);
    return failed;
}

/* The pieces' sources written into the work directory wdir (K.c, messages K.log, open in
   logs[k]; file[k] their names and the object's, K.o) and each one's compiler command line
   (argvs[k]: base's nb words, then -c -o K.o K.c). 0, or -1 with err. */
static int write_pieces(const char *const *parts, int n, int wdir, const char *wpath, char *const *base, int nb,
                        char (*file)[3][32], char ***argvs, int *logs, char *err, size_t err_size)
{
    for (int k = 0; k < n; k++) logs[k] = -1;
    for (int k = 0; k < n; k++) {
        snprintf(file[k][0], sizeof file[k][0], "%d.c", k);
        snprintf(file[k][1], sizeof file[k][1], "%d.o", k);
        snprintf(file[k][2], sizeof file[k][2], "%d.log", k);
        int f = rt_cache_create(wdir, file[k][0]);
        size_t len = strlen(parts[k]), done = 0;
        while (f >= 0 && done < len) {
            ssize_t w = write(f, parts[k] + done, len - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            done += (size_t)w;
        }
        if (f < 0 || done < len || close(f) || (logs[k] = rt_cache_create(wdir, file[k][2])) < 0) {
            snprintf(err, err_size, "cannot write kernel source '%s/%s': %s", wpath, file[k][0], errno ? strerror(errno) : "short write");
            return -1;
        }
        char **argv = argvs[k] = calloc(48, sizeof *argv);
        memcpy(argv, base, sizeof(char *) * (size_t)nb);
        int a = nb;
        argv[a++] = "-c";
        argv[a++] = "-o";
        argv[a++] = file[k][1];
        argv[a++] = file[k][0];
    }
    return 0;
}

/* cc -shared -o kernels.so *.o in the work directory wdir, messages in its link.log. 0, or -1
   with err (*keep_messages set where link.log holds the compiler's words). */
static int link_pieces(const char *cc, int n, char (*file)[3][32], int wdir, const char *wpath, bool *keep_messages, char *err,
                       size_t err_size)
{
    CcWords words_buf;
    int link_log = rt_cache_create(wdir, "link.log");
    char **argv = calloc((size_t)n + 24, sizeof *argv);
    int a = compiler_words(cc, &words_buf, argv, 16);
    argv[a++] = "-shared";
    argv[a++] = "-o";
    argv[a++] = "kernels.so";
    for (int k = 0; k < n; k++) argv[a++] = file[k][1];
    argv[a] = NULL;
    pid_t pid = link_log >= 0 ? fork() : -1;
    if (pid == 0) exec_child(argv, wdir, link_log);
    int st = pid > 0 ? wait_child(pid) : -1;
    free(argv);
    if (link_log >= 0) close(link_log);
    if (st == 0) return 0;
    *keep_messages = link_log >= 0;
    snprintf(err, err_size, "the C compiler could not link the compiled kernels (exit %d); messages %s/link.log", st, wpath);
    return -1;
}

/* The cache entry HASH.so for these pieces, open (its descriptor in *so_fd),
   found in the cache or compiled: the pieces written to a private work
   directory in the cache (HASH.build.XXXX), compiled and linked there, and
   the shared object and its seal renamed into the cache. Everything by
   descriptor: nothing here follows a path another user could redirect. 0,
   or -1 with err (a failed compile's work directory stays, with its sources
   and messages, named in err). so_path: the entry's path, for messages. */
static int compile_kernels(const char *const *parts, int nparts, bool verbose, int *so_fd, char *so_path, size_t so_size,
                           char *err, size_t err_size)
{
    const char *cc = getenv("MGC_CC");
    if (!cc || !*cc) cc = "cc";
    char id[256];
    compiler_id(cc, id, sizeof id);
    if (!id[0]) {
        snprintf(err, err_size, "cannot run the C compiler '%s' to build the kernels (set MGC_CC to a working compiler)", cc);
        return -1;
    }
    uint64_t h = CG_FNV1A_START;
    for (int k = 0; k < nparts; k++) {
        h = rt_fnv1a(h, parts[k]);
        h = rt_fnv1a(h, "\n--piece\n");
    }
    h = rt_fnv1a(h, "\n--flags ");
    h = rt_fnv1a(h, kernel_flags);
    h = rt_fnv1a(h, "\n--cc ");
    h = rt_fnv1a(h, cc);
    h = rt_fnv1a(h, id);
    CacheDir cache;
    if (rt_cache_open(&cache, err, err_size)) return -1;
    char name[64], seal_name[80];
    snprintf(name, sizeof name, "%016llx.so", (unsigned long long)h);
    snprintf(seal_name, sizeof seal_name, "%s.seal", name);
    snprintf(so_path, so_size, "%s/%s", cache.path, name);
    int fd = rt_cache_open_entry(&cache, name, false);   /* a foreign entry is said there */
    if (fd >= 0) {
        EntryState e = entry_state(&cache, name, fd);
        if (e == ENTRY_OK) {
            rt_cache_touch(fd);
            if (verbose) fprintf(stderr, "mgc: kernels found in cache %s\n", so_path);
            rt_cache_close(&cache);
            *so_fd = fd;
            return 0;
        }
        close(fd);
        if (e == ENTRY_DAMAGED) fprintf(stderr, "mgc: the cached kernels %s are damaged: compiling them again\n", so_path);
        else if (verbose)
            fprintf(stderr, "mgc: the cached kernels %s have no seal (an older mgc made them): compiling them again\n", so_path);
    }
    /* in the work directory: K.c -> K.o (messages K.log), side by side; then linked into kernels.so */
    char wname[64], wpath[4400];
    int wdir = rt_cache_workdir(&cache, h, wname, sizeof wname);
    snprintf(wpath, sizeof wpath, "%s/%s", cache.path, wname);
    if (wdir < 0) {
        snprintf(err, err_size, "cannot make a work directory in the kernel cache %s: %s", cache.path, strerror(errno));
        rt_cache_close(&cache);
        return -1;
    }
    int n = nparts;
    char (*file)[3][32] = calloc((size_t)n + 1, sizeof *file);   /* per piece: its .c, .o and .log */
    char ***argvs = calloc((size_t)n + 1, sizeof *argvs);
    int *logs = calloc((size_t)n + 1, sizeof *logs);
    CcWords words_buf;
    char flags_buf[sizeof kernel_flags], *base[48], *save = NULL;
    int nb = compiler_words(cc, &words_buf, base, 16);
    snprintf(flags_buf, sizeof flags_buf, "%s", kernel_flags);
    for (char *w = strtok_r(flags_buf, " ", &save); w && nb < 40; w = strtok_r(NULL, " ", &save)) base[nb++] = w;
    int rc = write_pieces(parts, n, wdir, wpath, base, nb, file, argvs, logs, err, err_size);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!rc && n > 4 * rt_cores())   /* minutes, for a very large net: say so rather than seem to hang */
        fprintf(stderr, "mgc: compiling the kernels in %d pieces, %d at a time (a large net: this takes a while)\n", n,
                rt_cores());
    int bad = rc ? -1 : compile_pieces(argvs, logs, n, rt_cores(), wdir);
    bool keep_messages = false;   /* the compiler failed: its work directory stays, to be read */
    if (!rc && bad >= 0) {
        keep_messages = true;
        snprintf(err, err_size, "the C compiler failed on the generated kernels; source %s/%s, messages %s/%s",
                 wpath, file[bad][0], wpath, file[bad][2]);
        rc = -1;
    }
    if (!rc && link_pieces(cc, n, file, wdir, wpath, &keep_messages, err, err_size)) rc = -1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int k = 0; k < n; k++) {
        if (logs[k] >= 0) close(logs[k]);
        free(argvs[k]);
    }
    free(argvs); free(logs);
    /* the shared object as the compiler left it, checked as any entry is; the seal
       first, then the entry, each renamed into the cache: a reader sees a whole
       seal, and an entry only with one */
    char seal[64];
    fd = -1;
    if (!rc) {
        errno = 0;
        fd = rt_cache_open_entry(&(CacheDir){ .fd = wdir, .path = "" }, "kernels.so", true);
        int sfd = fd >= 0 && seal_of(fd, seal, sizeof seal) ? rt_cache_create(wdir, "kernels.so.seal") : -1;
        bool sealed = sfd >= 0 && write(sfd, seal, strlen(seal)) == (ssize_t)strlen(seal);
        if (sfd >= 0 && close(sfd)) sealed = false;
        if (!sealed || fchmod(fd, 0755) || renameat(wdir, "kernels.so.seal", cache.fd, seal_name) ||
            renameat(wdir, "kernels.so", cache.fd, name)) {
            snprintf(err, err_size, "cannot put compiled kernels into the cache '%s': %s", so_path,
                     errno ? strerror(errno) : "the compiler's shared object is not a file of the user's alone");
            if (fd >= 0) close(fd);
            fd = -1;
            rc = -1;
        }
    }
    free(file);
    close(wdir);
    /* the sources, objects and messages are not kept (--dump-kernels writes the sources), but a compiler's complaint */
    if (!keep_messages) rt_cache_remove_dir(cache.fd, wname);
    rt_cache_close(&cache);
    if (rc) return -1;
    if (verbose)
        fprintf(stderr, "mgc: compiled kernels (%d translation unit%s, side by side) in %.2f s -> %s\n", n, n == 1 ? "" : "s",
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), so_path);
    rt_cache_prune(h, verbose);
    *so_fd = fd;
    return 0;
}

/* A shared object loaded: the descriptor of the file it was loaded from is
   held as long as it is, so that no other file ever gets its
   /proc/self/fd/N name while dlopen knows a library by it. */
struct CcModule {
    void *so;
    int fd;
};

int rt_cc_load(const char *const *parts, int nparts, bool verbose, CcModule **mod, char *err, size_t err_size)
{
    char so_path[4608], by_fd[64];
    int fd;
    *mod = NULL;
    if (compile_kernels(parts, nparts, verbose, &fd, so_path, sizeof so_path, err, err_size)) return -1;
    /* the very file that was checked (or just made), whatever is at its path now */
    snprintf(by_fd, sizeof by_fd, "/proc/self/fd/%d", fd);
    void *so = dlopen(by_fd, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        const char *why = dlerror();
        bool no_proc = access("/proc/self/fd", X_OK) != 0;
        snprintf(err, err_size, "cannot load compiled kernels %s: %s%s", so_path, why ? why : "?",
                 no_proc ? " (mgc loads its kernels through /proc/self/fd: mount /proc)" : " (delete it to rebuild)");
        close(fd);
        return -1;
    }
    *mod = malloc(sizeof **mod);
    if (!*mod) {
        dlclose(so);
        close(fd);
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    (*mod)->so = so;
    (*mod)->fd = fd;
    return 0;
}

void *rt_cc_sym(CcModule *mod, const char *name) { return mod ? dlsym(mod->so, name) : NULL; }

void rt_cc_unload(CcModule *mod)
{
    if (!mod) return;
    dlclose(mod->so);
    close(mod->fd);
    free(mod);
}
