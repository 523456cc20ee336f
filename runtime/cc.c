/*
** Kernels for the CPU device: the generated C compiled by the system C
** compiler into a shared object, cached on disk by a hash of source, flags
** and compiler, and loaded with dlopen.
*/
#include "runtime.h"
#include "pool.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Runs argv (no shell: paths with quotes or $(...) in them are only paths)
   with stdout and stderr to out_path (or /dev/null). Returns the exit status,
   or -1 when it could not run. */
static int run_program(char *const *argv, const char *out_path)
{
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        umask(022);   /* what the compiler writes into the cache: writable by its owner only */
        int fd = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* MGC_CC (default cc) as an argument vector: words split at spaces ("ccache gcc"). */
static int compiler_words(const char *cc, char *buf, size_t size, char **words, int most)
{
    snprintf(buf, size, "%s", cc);
    int n = 0;
    for (char *w = strtok(buf, " \t"); w && n < most; w = strtok(NULL, " \t")) words[n++] = w;
    return n;
}

/* The first line of `cc --version`, part of the cache key. */
static void compiler_id(const char *cc, char *buf, size_t size)
{
    char words_buf[512], *argv[18];
    int n = compiler_words(cc, words_buf, sizeof words_buf, argv, 16);
    buf[0] = 0;
    if (n == 0) return;
    argv[n] = "--version";
    argv[n + 1] = NULL;
    char tmp[] = "/tmp/mgc-cc-version-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) return;
    close(fd);
    if (run_program(argv, tmp) == 0) {
        FILE *f = fopen(tmp, "r");
        if (f && !fgets(buf, (int)size, f)) buf[0] = 0;
        if (f) fclose(f);
    }
    unlink(tmp);
}

/* each piece compiled to an object, then the objects linked into one shared object */
static const char kernel_flags[] = "-O3 -march=native -std=gnu11 -fPIC -fno-math-errno -Wno-unused";

/* A cache entry's seal: "<size> <FNV-1a of its bytes>" of the file, or 0 when
   it cannot be read. */
static int seal_of(const char *path, char *out, size_t size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = CG_FNV1A_START;
    long n = 0;
    unsigned char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        h = cg_fnv1a(h, buf, got);
        n += (long)got;
    }
    int ok = !ferror(f);
    fclose(f);
    if (ok) snprintf(out, size, "%ld %016llx\n", n, (unsigned long long)h);
    return ok;
}

/* What a cache entry so_path is worth loading: ENTRY_OK when it is the
   user's alone (rt_cache_entry_trusted; a symbolic link is not) and whole, its
   seal matching the one written beside it (so_path + ".seal") when it was
   compiled: a truncated or garbage shared object would crash dlopen (SIGBUS,
   SIGSEGV) on every later run. */
typedef enum { ENTRY_OK, ENTRY_FOREIGN, ENTRY_UNSEALED, ENTRY_DAMAGED } EntryState;
static EntryState entry_state(const char *so_path)
{
    int fd = open(so_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    bool trusted = fd >= 0 && rt_cache_entry_trusted(fd, so_path, false) == 0;
    if (fd < 0) fprintf(stderr, "mgc: the cached kernels %s cannot be opened as a file (%s): compiled again in their place\n",
                        so_path, strerror(errno));
    if (fd >= 0) close(fd);
    if (!trusted) return ENTRY_FOREIGN;
    char seal_path[4700], want[64] = "", have[64];
    snprintf(seal_path, sizeof seal_path, "%s.seal", so_path);
    FILE *f = fopen(seal_path, "r");
    if (!f) return ENTRY_UNSEALED;
    if (!fgets(want, sizeof want, f)) want[0] = 0;
    fclose(f);
    return want[0] && seal_of(so_path, have, sizeof have) && strcmp(want, have) == 0 ? ENTRY_OK : ENTRY_DAMAGED;
}

/* Runs the compiler on every piece, `jobs` at a time (each waited for by
   its own pid, in order: other children of the process are not ours to
   reap); the index of the first piece that failed, or -1 when all compiled. */
static int compile_pieces(char ***argvs, const char *const *logs, int n, int jobs)
{
    pid_t *pid = calloc((size_t)n + 1, sizeof *pid);
    int failed = -1, next = 0, first = 0;
    while (first < next || (next < n && failed < 0)) {
        while (next < n && next - first < jobs && failed < 0) {
            pid[next] = fork();
            if (pid[next] == 0) {
                umask(022);
                int fd = open(logs[next], O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (fd >= 0) {
                    dup2(fd, 1);
                    dup2(fd, 2);
                    close(fd);
                }
                execvp(argvs[next][0], argvs[next]);
                _exit(127);
            }
            if (pid[next] < 0) failed = next;
            else next++;
        }
        if (first == next) break;
        int st;
        pid_t w;
        while ((w = waitpid(pid[first], &st, 0)) < 0 && errno == EINTR) {}
        if ((w < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) && (failed < 0 || first < failed)) failed = first;
        first++;
    }
    free(pid);
    return failed;
}

static int compile_kernels(const char *const *parts, int nparts, bool verbose, char *so_path, size_t so_size,
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
    char kdir[4200];
    if (rt_kernel_cache(kdir, sizeof kdir, err, err_size)) return -1;
    snprintf(so_path, so_size, "%s/%016llx.so", kdir, (unsigned long long)h);
    struct stat entry;
    if (lstat(so_path, &entry) == 0) {
        EntryState e = entry_state(so_path);   /* a foreign entry is said there */
        if (e == ENTRY_OK) {
            rt_cache_touch(so_path);
            if (verbose) fprintf(stderr, "mgc: kernels found in cache %s\n", so_path);
            return 0;
        }
        if (e == ENTRY_DAMAGED) fprintf(stderr, "mgc: the cached kernels %s are damaged: compiling them again\n", so_path);
        else if (e == ENTRY_UNSEALED && verbose)
            fprintf(stderr, "mgc: the cached kernels %s have no seal (an older mgc made them): compiling them again\n", so_path);
    }
    /* HASH.K.c -> HASH.K.PID.o (log HASH.K.PID.log), side by side; then linked */
    int n = nparts;
    char (*c_path)[4800] = calloc((size_t)n + 1, sizeof *c_path), (*o_path)[4800] = calloc((size_t)n + 1, sizeof *o_path);
    char (*log_path)[4800] = calloc((size_t)n + 1, sizeof *log_path);
    char ***argvs = calloc((size_t)n + 1, sizeof *argvs);
    const char **logs = calloc((size_t)n + 1, sizeof *logs);
    char words_buf[512], flags_buf[sizeof kernel_flags], *base[48];
    int nb = compiler_words(cc, words_buf, sizeof words_buf, base, 16);
    snprintf(flags_buf, sizeof flags_buf, "%s", kernel_flags);
    for (char *w = strtok(flags_buf, " "); w && nb < 40; w = strtok(NULL, " ")) base[nb++] = w;
    int rc = 0;
    for (int k = 0; k < n && !rc; k++) {
        snprintf(c_path[k], sizeof c_path[k], "%s/%016llx.%d.c", kdir, (unsigned long long)h, k);
        snprintf(o_path[k], sizeof o_path[k], "%s/%016llx.%d.%d.o", kdir, (unsigned long long)h, k, (int)getpid());
        snprintf(log_path[k], sizeof log_path[k], "%s/%016llx.%d.%d.log", kdir, (unsigned long long)h, k, (int)getpid());
        /* written beside and renamed into place: another process (an MPI rank on
           the same machine) compiling the same kernels at the same moment never
           lets its compiler read a source this one is rewriting */
        char tmp_c[4900];
        snprintf(tmp_c, sizeof tmp_c, "%s.%d.tmp", c_path[k], (int)getpid());
        FILE *f = rt_cache_create(tmp_c);
        bool written = f && fputs(parts[k], f) >= 0;
        if (f && fclose(f)) written = false;
        if (!written || rename(tmp_c, c_path[k])) {
            snprintf(err, err_size, "cannot write kernel source '%s': %s", c_path[k], strerror(errno));
            unlink(tmp_c);
            rc = -1;
            break;
        }
        char **argv = argvs[k] = calloc(48, sizeof *argv);
        memcpy(argv, base, sizeof(char *) * (size_t)nb);
        int a = nb;
        argv[a++] = "-c";
        argv[a++] = "-o";
        argv[a++] = o_path[k];
        argv[a++] = c_path[k];
        logs[k] = log_path[k];
    }
    char tmp_so[4800], link_log[4800];
    snprintf(tmp_so, sizeof tmp_so, "%s.%d.tmp", so_path, (int)getpid());
    snprintf(link_log, sizeof link_log, "%s/%016llx.link.%d.log", kdir, (unsigned long long)h, (int)getpid());
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!rc && n > 4 * rt_cores())   /* minutes, for a very large net: say so rather than seem to hang */
        fprintf(stderr, "mgc: compiling the kernels in %d pieces, %d at a time (a large net: this takes a while)\n", n,
                rt_cores());
    int bad = rc ? -1 : compile_pieces(argvs, logs, n, rt_cores());
    if (!rc && bad >= 0) {
        snprintf(err, err_size, "the C compiler failed on the generated kernels; source %s, messages %s",
                 c_path[bad], log_path[bad]);
        rc = -1;
    }
    if (!rc) {   /* cc -shared -o tmp.so *.o */
        char **argv = calloc((size_t)n + 24, sizeof *argv);
        int a = compiler_words(cc, words_buf, sizeof words_buf, argv, 16);
        argv[a++] = "-shared";
        argv[a++] = "-o";
        argv[a++] = tmp_so;
        for (int k = 0; k < n; k++) argv[a++] = o_path[k];
        argv[a] = NULL;
        int st = run_program(argv, link_log);
        free(argv);
        if (st != 0) {
            snprintf(err, err_size, "the C compiler could not link the compiled kernels (exit %d); messages %s", st, link_log);
            rc = -1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int k = 0; k < n; k++) {
        unlink(o_path[k]);
        if (!rc) unlink(log_path[k]);
        free(argvs[k]);
    }
    free(c_path); free(o_path); free(log_path); free(argvs); free(logs);
    if (rc) {
        unlink(tmp_so);
        return -1;
    }
    unlink(link_log);
    /* the seal first, then the entry, each by rename: a reader sees a whole seal, and an entry only with one */
    char seal[64], seal_path[4700], tmp_seal[4800];
    snprintf(seal_path, sizeof seal_path, "%s.seal", so_path);
    snprintf(tmp_seal, sizeof tmp_seal, "%s.%d.tmp", seal_path, (int)getpid());
    FILE *sf = seal_of(tmp_so, seal, sizeof seal) ? rt_cache_create(tmp_seal) : NULL;
    if (!sf || chmod(tmp_so, 0755) || fputs(seal, sf) < 0 || fclose(sf) || rename(tmp_seal, seal_path) || rename(tmp_so, so_path)) {
        snprintf(err, err_size, "cannot put compiled kernels into the cache '%s': %s", so_path, strerror(errno));
        unlink(tmp_seal);
        unlink(tmp_so);
        return -1;
    }
    if (verbose)
        fprintf(stderr, "mgc: compiled kernels (%d translation unit%s, side by side) in %.2f s -> %s\n", n, n == 1 ? "" : "s",
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), so_path);
    rt_cache_prune(h, verbose);
    return 0;
}

int rt_cc_load(const char *const *parts, int nparts, bool verbose, void **so, char *err, size_t err_size)
{
    char so_path[4608];
    if (compile_kernels(parts, nparts, verbose, so_path, sizeof so_path, err, err_size)) return -1;
    *so = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
    if (!*so && access(so_path, F_OK)) {   /* another process pruned it from the cache a moment ago: once more */
        if (compile_kernels(parts, nparts, verbose, so_path, sizeof so_path, err, err_size)) return -1;
        *so = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!*so) {
        snprintf(err, err_size, "cannot load compiled kernels %s: %s (delete it to rebuild)", so_path, dlerror());
        return -1;
    }
    return 0;
}
