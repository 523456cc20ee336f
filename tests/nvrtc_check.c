/*
** nvrtc_check: compiles a file of generated CUDA kernels (mgc --emit=cuda)
** with NVRTC, as the CUDA backend will at run time, to a cubin for sm_90 (or
** the architecture given). Needs no GPU. Fails, printing the NVRTC log, when
** the compilation fails or its log is not empty (a warning).
**
**   cc -DHAVE_NVRTC -Iruntime -I/usr/local/cuda/include tests/nvrtc_check.c runtime/ptx.c \
**      -L/usr/local/cuda/lib64 -lnvrtc -o build/nvrtc_check
** (runtime/ptx.c for rt_nvrtc_options: the options the runtime compiles with)
**   build/nvrtc_check kernels.cu [sm_90]
*/
#include "ptx.h"
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: nvrtc_check FILE.cu [sm_XX]\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *src = malloc((size_t)n + 1);
    if (fread(src, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "%s: short read\n", argv[1]);
        return 2;
    }
    src[n] = 0;
    fclose(f);
    char arch[64];
    snprintf(arch, sizeof arch, "--gpu-architecture=%s", argc > 2 ? argv[2] : "sm_90");
    const char *opts[1 + RT_NVRTC_NOPTIONS] = { arch };
    for (int k = 0; k < RT_NVRTC_NOPTIONS; k++) opts[1 + k] = rt_nvrtc_options[k];
    nvrtcProgram prog;
    if (nvrtcCreateProgram(&prog, src, argv[1], 0, NULL, NULL) != NVRTC_SUCCESS) return 1;
    nvrtcResult rc = nvrtcCompileProgram(prog, 1 + RT_NVRTC_NOPTIONS, opts);
    size_t logsize = 0;
    nvrtcGetProgramLogSize(prog, &logsize);
    char *log = malloc(logsize + 1);
    log[0] = 0;
    if (logsize > 0) nvrtcGetProgramLog(prog, log);
    if (rc != NVRTC_SUCCESS) {
        fprintf(stderr, "%s: NVRTC failed: %s\n%s\n", argv[1], nvrtcGetErrorString(rc), log);
        return 1;
    }
    if (log[strspn(log, " \t\r\n")]) {   /* compiled, but with warnings: a failure too */
        fprintf(stderr, "%s: NVRTC compiled with warnings (%s):\n%s\n", argv[1], argc > 2 ? argv[2] : "sm_90", log);
        return 1;
    }
    free(log);
    size_t cubin = 0;
    nvrtcGetCUBINSize(prog, &cubin);
    int kernels = 0;
    for (const char *p = src; (p = strstr(p, "\nKERNEL(")); p++) kernels++;   /* a kernel's head starts its line */
    printf("%s: NVRTC compiled %d kernels to a %zu-byte %s cubin\n", argv[1], kernels, cubin, argc > 2 ? argv[2] : "sm_90");
    nvrtcDestroyProgram(&prog);
    free(src);
    return 0;
}
