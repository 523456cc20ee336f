/*
** The generated CUDA kernels through NVRTC (see nvrtc.h). NVRTC needs no GPU
** and no driver: it compiles to PTX or cubins on any machine with the
** toolkit. Like the driver, cuBLAS and NCCL (runtime/device_cuda.c), it is
** opened with dlopen on first use, so a binary built with CUDA starts, and
** trains on CPU devices, where the toolkit is missing.
*/
#include "ptx.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef HAVE_NVRTC
#include <nvrtc.h>
#endif
#ifndef MGC_NVRTC_SONAME
#define MGC_NVRTC_SONAME "libnvrtc.so"
#endif
#ifndef MGC_CUDA_LIB
#define MGC_CUDA_LIB "/usr/local/cuda/lib64"
#endif

void *rt_open_lib(const char *name, const char *env, const char *dir, char *err, size_t err_size)
{
    const char *path = env ? getenv(env) : NULL;
    void *h = dlopen(path && *path ? path : name, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(err, err_size, "%s", dlerror());
    if (!h && dir && !(path && *path)) {
        char full[512];
        snprintf(full, sizeof full, "%s/%s", dir, name);
        h = dlopen(full, RTLD_NOW | RTLD_LOCAL);
    }
    return h;
}

int rt_arch_choose(const int *archs, int n, int want, bool *ptx)
{
    int best = -1;
    for (int k = 0; k < n; k++) {
        if (archs[k] == want) {
            *ptx = false;
            return want;
        }
        if (archs[k] < want && archs[k] > best) best = archs[k];
    }
    *ptx = true;
    return best;
}

#ifdef HAVE_NVRTC
#define NVRTC_FUNCS(X)                                                                                           \
    X(nvrtcCreateProgram) X(nvrtcCompileProgram) X(nvrtcDestroyProgram) X(nvrtcGetProgramLogSize)                \
    X(nvrtcGetProgramLog) X(nvrtcGetPTXSize) X(nvrtcGetPTX) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)                \
    X(nvrtcGetErrorString) X(nvrtcVersion) X(nvrtcGetNumSupportedArchs) X(nvrtcGetSupportedArchs)
#define DECLARE(f) __typeof__(f) *f;
static struct { NVRTC_FUNCS(DECLARE) } nv;
#undef DECLARE
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;
static char nv_error[600];   /* empty: loaded */
#define NV_MAX_ARCHS 256
static int nv_archs[NV_MAX_ARCHS], nv_narchs, nv_major, nv_minor;

static void nv_load(void)
{
    char why[400];
    void *h = rt_open_lib(MGC_NVRTC_SONAME, "MGC_NVRTC", MGC_CUDA_LIB, why, sizeof why);
    if (!h) {
        snprintf(nv_error, sizeof nv_error, "cannot open NVRTC (%s); install the CUDA toolkit's NVRTC (%s) or set MGC_NVRTC to its path",
                 why, MGC_NVRTC_SONAME);
        return;
    }
#define LOAD(f)                                                                                                   \
    if (!(nv.f = (__typeof__(nv.f))dlsym(h, #f))) {                                                                \
        snprintf(nv_error, sizeof nv_error, "the NVRTC opened (%s) has no %s: it is older than the one this mgc was " \
                 "built with; set MGC_NVRTC to %s's path", MGC_NVRTC_SONAME, #f, MGC_NVRTC_SONAME);                 \
        return;                                                                                                   \
    }
    NVRTC_FUNCS(LOAD)
#undef LOAD
    nv.nvrtcVersion(&nv_major, &nv_minor);
    /* the list, when it fits (else none: NVRTC judges each architecture itself) */
    int n = 0;
    if (nv.nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0 && n <= NV_MAX_ARCHS &&
        nv.nvrtcGetSupportedArchs(nv_archs) == NVRTC_SUCCESS)
        nv_narchs = n;
}
#endif

bool rt_nvrtc_open(char *err, size_t err_size)
{
#ifdef HAVE_NVRTC
    pthread_once(&nv_once, nv_load);
    if (!nv_error[0]) return true;
    snprintf(err, err_size, "%s", nv_error);
#else
    snprintf(err, err_size, "this mgc was built without NVRTC (no CUDA toolkit at build time; install it and rebuild: "
             "make clean && make, or CUDA_HOME=DIR make)");
#endif
    return false;
}

/* "sm_75, sm_80, ..." */
static void arch_list(char *buf, size_t size)
{
    buf[0] = 0;
#ifdef HAVE_NVRTC
    size_t at = 0;
    for (int k = 0; k < nv_narchs && at + 16 < size; k++)
        at += (size_t)snprintf(buf + at, size - at, "%ssm_%d", k ? ", " : "", nv_archs[k]);
#else
    (void)size;
#endif
}

int rt_nvrtc_arch(int want, bool *ptx, char *err, size_t err_size)
{
    if (!rt_nvrtc_open(err, err_size)) return -1;
#ifdef HAVE_NVRTC
    if (nv_narchs == 0) {   /* an NVRTC that does not list them: let it judge */
        *ptx = false;
        return want;
    }
    int got = rt_arch_choose(nv_archs, nv_narchs, want, ptx);
    if (got < 0) {
        char list[400];
        arch_list(list, sizeof list);
        snprintf(err, err_size, "NVRTC %d.%d compiles for %s, nothing as old as sm_%d: use a CUDA toolkit that still "
                 "supports sm_%d (CUDA_HOME=DIR make, or MGC_NVRTC=its libnvrtc.so)", nv_major, nv_minor, list, want, want);
    }
    return got;
#else
    (void)want; (void)ptx;
    return -1;
#endif
}

/* Compiles source for arch: PTX (cubin false, "compute_XX") or a cubin ("sm_XX"). */
static char *nvrtc_compile(const char *source, const char *name, const char *arch, bool cubin, size_t *size,
                           char *err, size_t err_size);

char *rt_nvrtc_ptx(const char *source, const char *name, const char *arch, size_t *size, char *err, size_t err_size)
{
    return nvrtc_compile(source, name, arch, false, size, err, err_size);
}

void *rt_nvrtc_cubin(const char *source, const char *name, const char *arch, size_t *size, char *err, size_t err_size)
{
    return nvrtc_compile(source, name, arch, true, size, err, err_size);
}

const char *rt_nvrtc_version(char *buf, size_t size)
{
    snprintf(buf, size, "no NVRTC");
#ifdef HAVE_NVRTC
    pthread_once(&nv_once, nv_load);
    if (!nv_error[0]) snprintf(buf, size, "NVRTC %d.%d", nv_major, nv_minor);
#endif
    return buf;
}

/* --split-compile=0: NVRTC optimises the kernels on as many threads as there
   are cores (ResNet-18's 293 kernels for sm_90: 11.9 s on one core, 7.8 s on
   two); an NVRTC without the option compiles without it. */
const char *const rt_nvrtc_options[RT_NVRTC_NOPTIONS] = { "--std=c++17", "-default-device", "--split-compile=0" };

static char *nvrtc_compile(const char *source, const char *name, const char *arch, bool cubin, size_t *size,
                           char *err, size_t err_size)
{
    *size = 0;
#ifndef HAVE_NVRTC
    (void)source; (void)name; (void)arch; (void)cubin;
    rt_nvrtc_open(err, err_size);
    return NULL;
#else
    bool ptx_only;
    int want = strncmp(arch, "sm_", 3) ? -1 : atoi(arch + 3);
    if (want <= 0) {
        snprintf(err, err_size, "'%s' is not an architecture: write sm_ and the compute capability, as sm_90", arch);
        return NULL;
    }
    int got = rt_nvrtc_arch(want, &ptx_only, err, err_size);
    if (got < 0) return NULL;
    if (got != want) {
        char list[400];
        arch_list(list, sizeof list);
        snprintf(err, err_size, "NVRTC %d.%d does not compile for %s; it compiles for %s", nv_major, nv_minor, arch, list);
        return NULL;
    }
    nvrtcProgram prog;
    nvrtcResult rc = nv.nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL);
    if (rc != NVRTC_SUCCESS) {
        snprintf(err, err_size, "NVRTC cannot take the program: %s", nv.nvrtcGetErrorString(rc));
        return NULL;
    }
    char opt_arch[64];
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s_%d", cubin ? "sm" : "compute", want);
    const char *opts[1 + RT_NVRTC_NOPTIONS] = { opt_arch };
    for (int k = 0; k < RT_NVRTC_NOPTIONS; k++) opts[1 + k] = rt_nvrtc_options[k];
    rc = nv.nvrtcCompileProgram(prog, 1 + RT_NVRTC_NOPTIONS, opts);
    if (rc == NVRTC_ERROR_INVALID_OPTION) {   /* an older NVRTC: a fresh program, without the last (--split-compile) */
        nv.nvrtcDestroyProgram(&prog);
        rc = nv.nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL);
        if (rc != NVRTC_SUCCESS) {
            snprintf(err, err_size, "NVRTC cannot take the program: %s", nv.nvrtcGetErrorString(rc));
            return NULL;
        }
        rc = nv.nvrtcCompileProgram(prog, RT_NVRTC_NOPTIONS, opts);
    }
    size_t log_size = 0;
    nv.nvrtcGetProgramLogSize(prog, &log_size);
    char *log = malloc(log_size + 1);
    log[0] = 0;
    if (log_size > 1) nv.nvrtcGetProgramLog(prog, log);
    char *out = NULL;
    if (rc != NVRTC_SUCCESS) {
        snprintf(err, err_size, "NVRTC failed for %s: %s\n%s", arch, nv.nvrtcGetErrorString(rc), log);
    } else if (cubin) {
        size_t n = 0;
        nv.nvrtcGetCUBINSize(prog, &n);
        out = malloc(n + 1);
        nv.nvrtcGetCUBIN(prog, out);
        *size = n;
    } else {
        size_t n = 0;
        nv.nvrtcGetPTXSize(prog, &n);   /* with its terminating NUL */
        out = malloc(n + 1);
        nv.nvrtcGetPTX(prog, out);
        out[n] = 0;
        *size = strlen(out);
    }
    free(log);
    nv.nvrtcDestroyProgram(&prog);
    return out;
#endif
}
