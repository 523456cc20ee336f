/*
** Kernels for the CPU device: the generated C compiled by the system C
** compiler into a shared object, cached on disk by a hash of source, flags
** and compiler, and loaded with dlopen.
*/
#include "runtime.h"
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

const char *rt_cache_dir(char *buf, size_t size)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && *xdg) snprintf(buf, size, "%s/mgc", xdg);
    else snprintf(buf, size, "%s/.cache/mgc", getenv("HOME") ? getenv("HOME") : "/tmp");
    return buf;
}

uint64_t rt_fnv1a_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t rt_fnv1a(uint64_t h, const char *s) { return rt_fnv1a_bytes(h, s, strlen(s)); }

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

/* Runs argv (no shell: paths with quotes or $(...) in them are only paths)
   with stdout and stderr to out_path (or /dev/null). Returns the exit status,
   or -1 when it could not run. */
static int run_program(char *const *argv, const char *out_path)
{
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
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

static const char kernel_flags[] = "-O3 -march=native -std=gnu11 -fPIC -shared -fno-math-errno -Wno-unused";

/* A cache entry's seal: "<size> <FNV-1a of its bytes>" of the file, or 0 when
   it cannot be read. */
static int seal_of(const char *path, char *out, size_t size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = 0xcbf29ce484222325ULL;
    long n = 0;
    unsigned char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        h = rt_fnv1a_bytes(h, buf, got);
        n += (long)got;
    }
    int ok = !ferror(f);
    fclose(f);
    if (ok) snprintf(out, size, "%ld %016llx\n", n, (unsigned long long)h);
    return ok;
}

/* The entry so_path is whole: its seal matches the one written beside it
   (so_path + ".seal") when it was compiled. A truncated or garbage shared
   object would crash dlopen (SIGBUS, SIGSEGV) on every later run. */
static bool entry_sound(const char *so_path)
{
    char seal_path[4700], want[64] = "", have[64];
    snprintf(seal_path, sizeof seal_path, "%s.seal", so_path);
    FILE *f = fopen(seal_path, "r");
    if (!f) return false;
    if (!fgets(want, sizeof want, f)) want[0] = 0;
    fclose(f);
    return want[0] && seal_of(so_path, have, sizeof have) && strcmp(want, have) == 0;
}

static int compile_kernels(const char *source, bool verbose, char *so_path, size_t so_size, char *err, size_t err_size)
{
    const char *cc = getenv("MGC_CC");
    if (!cc || !*cc) cc = "cc";
    char id[256];
    compiler_id(cc, id, sizeof id);
    if (!id[0]) {
        snprintf(err, err_size, "cannot run the C compiler '%s' to build the kernels (set MGC_CC to a working compiler)", cc);
        return -1;
    }
    uint64_t h = 0xcbf29ce484222325ULL;
    h = rt_fnv1a(h, source);
    h = rt_fnv1a(h, "\n--flags ");
    h = rt_fnv1a(h, kernel_flags);
    h = rt_fnv1a(h, "\n--cc ");
    h = rt_fnv1a(h, cc);
    h = rt_fnv1a(h, id);
    char kdir[4200];
    if (rt_kernel_cache(kdir, sizeof kdir, err, err_size)) return -1;
    snprintf(so_path, so_size, "%s/%016llx.so", kdir, (unsigned long long)h);
    if (access(so_path, R_OK) == 0) {
        if (entry_sound(so_path)) {
            if (verbose) fprintf(stderr, "mgc: kernels found in cache %s\n", so_path);
            return 0;
        }
        char seal_path[4700];
        snprintf(seal_path, sizeof seal_path, "%s.seal", so_path);
        if (access(seal_path, F_OK) == 0)
            fprintf(stderr, "mgc: the cached kernels %s are damaged: compiling them again\n", so_path);
        else if (verbose)
            fprintf(stderr, "mgc: the cached kernels %s have no seal (an older mgc made them): compiling them again\n", so_path);
    }
    char c_path[4800], tmp_so[4800], log_path[4800];
    snprintf(c_path, sizeof c_path, "%s/%016llx.c", kdir, (unsigned long long)h);
    snprintf(tmp_so, sizeof tmp_so, "%s.%d.tmp", so_path, (int)getpid());
    snprintf(log_path, sizeof log_path, "%s/%016llx.log", kdir, (unsigned long long)h);
    FILE *f = fopen(c_path, "w");
    if (!f || fputs(source, f) < 0 || fclose(f)) {
        snprintf(err, err_size, "cannot write kernel source '%s': %s", c_path, strerror(errno));
        return -1;
    }
    char words_buf[512], flags_buf[sizeof kernel_flags], *argv[48];
    int n = compiler_words(cc, words_buf, sizeof words_buf, argv, 16);
    snprintf(flags_buf, sizeof flags_buf, "%s", kernel_flags);
    for (char *w = strtok(flags_buf, " "); w && n < 40; w = strtok(NULL, " ")) argv[n++] = w;
    argv[n++] = "-o";
    argv[n++] = tmp_so;
    argv[n++] = c_path;
    argv[n] = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = run_program(argv, log_path);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc != 0) {
        snprintf(err, err_size, "the C compiler failed on the generated kernels (exit %d); source %s, messages %s",
                 rc, c_path, log_path);
        unlink(tmp_so);
        return -1;
    }
    /* the seal first, then the entry, each by rename: a reader sees a whole seal, and an entry only with one */
    char seal[64], seal_path[4700], tmp_seal[4800];
    snprintf(seal_path, sizeof seal_path, "%s.seal", so_path);
    snprintf(tmp_seal, sizeof tmp_seal, "%s.%d.tmp", seal_path, (int)getpid());
    FILE *sf = seal_of(tmp_so, seal, sizeof seal) ? fopen(tmp_seal, "w") : NULL;
    if (!sf || fputs(seal, sf) < 0 || fclose(sf) || rename(tmp_seal, seal_path) || rename(tmp_so, so_path)) {
        snprintf(err, err_size, "cannot put compiled kernels into the cache '%s': %s", so_path, strerror(errno));
        unlink(tmp_seal);
        unlink(tmp_so);
        return -1;
    }
    unlink(log_path);
    if (verbose)
        fprintf(stderr, "mgc: compiled kernels in %.2f s -> %s\n",
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), so_path);
    return 0;
}

int rt_cc_load(const char *source, bool verbose, void **so, char *err, size_t err_size)
{
    char so_path[4608];
    if (compile_kernels(source, verbose, so_path, sizeof so_path, err, err_size)) return -1;
    *so = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
    if (!*so) {
        snprintf(err, err_size, "cannot load compiled kernels %s: %s (delete it to rebuild)", so_path, dlerror());
        return -1;
    }
    return 0;
}
