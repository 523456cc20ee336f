/*
** The generated CUDA kernels through NVRTC (see nvrtc.h). NVRTC needs no GPU
** and no driver: it compiles to PTX on any machine with the toolkit.
*/
#include "ptx.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef HAVE_NVRTC
#include <nvrtc.h>
#endif

bool rt_nvrtc_available(void)
{
#ifdef HAVE_NVRTC
    return true;
#else
    return false;
#endif
}

/* Compiles source for arch: PTX (cubin false, "compute_XX") or a cubin ("sm_XX"). */
static char *nvrtc_compile(const char *source, const char *name, const char *arch, bool cubin, size_t *size,
                           char *err, size_t err_size);

char *rt_nvrtc_ptx(const char *source, const char *name, const char *arch, char *err, size_t err_size)
{
    size_t n;
    return nvrtc_compile(source, name, arch, false, &n, err, err_size);
}

void *rt_nvrtc_cubin(const char *source, const char *name, const char *arch, size_t *size, char *err, size_t err_size)
{
    return nvrtc_compile(source, name, arch, true, size, err, err_size);
}

const char *rt_nvrtc_version(char *buf, size_t size)
{
#ifdef HAVE_NVRTC
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    snprintf(buf, size, "NVRTC %d.%d", major, minor);
#else
    snprintf(buf, size, "no NVRTC");
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
#ifdef HAVE_NVRTC
    nvrtcProgram prog;
    nvrtcResult rc = nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL);
    if (rc != NVRTC_SUCCESS) {
        snprintf(err, err_size, "NVRTC cannot take the program: %s", nvrtcGetErrorString(rc));
        return NULL;
    }
    char opt_arch[64];
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s_%s", cubin ? "sm" : "compute", arch + 3);
    const char *opts[1 + RT_NVRTC_NOPTIONS] = { opt_arch };
    for (int k = 0; k < RT_NVRTC_NOPTIONS; k++) opts[1 + k] = rt_nvrtc_options[k];
    rc = nvrtcCompileProgram(prog, 1 + RT_NVRTC_NOPTIONS, opts);
    if (rc == NVRTC_ERROR_INVALID_OPTION) {   /* an older NVRTC: a fresh program, without the last (--split-compile) */
        nvrtcDestroyProgram(&prog);
        rc = nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL);
        if (rc != NVRTC_SUCCESS) {
            snprintf(err, err_size, "NVRTC cannot take the program: %s", nvrtcGetErrorString(rc));
            return NULL;
        }
        rc = nvrtcCompileProgram(prog, RT_NVRTC_NOPTIONS, opts);
    }
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    char *log = malloc(log_size + 1);
    log[0] = 0;
    if (log_size > 1) nvrtcGetProgramLog(prog, log);
    char *ptx = NULL;
    if (rc != NVRTC_SUCCESS) {
        snprintf(err, err_size, "NVRTC failed for %s: %s\n%s", arch, nvrtcGetErrorString(rc), log);
    } else if (cubin) {
        size_t n = 0;
        nvrtcGetCUBINSize(prog, &n);
        ptx = malloc(n + 1);
        nvrtcGetCUBIN(prog, ptx);
        *size = n;
    } else {
        size_t n = 0;
        nvrtcGetPTXSize(prog, &n);
        ptx = malloc(n + 1);
        nvrtcGetPTX(prog, ptx);
        ptx[n] = 0;
        *size = n;
    }
    free(log);
    nvrtcDestroyProgram(&prog);
    return ptx;
#else
    (void)source; (void)name; (void)arch; (void)cubin;
    snprintf(err, err_size, "this mgc was built without NVRTC (no CUDA toolkit at build time; install it and rebuild: "
             "make clean && make, or CUDA_HOME=DIR make)");
    return NULL;
#endif
}
