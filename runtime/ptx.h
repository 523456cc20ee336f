/*
** NVRTC, the CUDA runtime compiler: the generated CUDA kernels compiled to
** PTX (mgc --emit ptx, no GPU needed) or to a cubin (the CUDA device). Built
** when the CUDA toolkit is found (HAVE_NVRTC) and opened at run time (dlopen);
** where it is missing the calls say so.
*/
#ifndef MGC_PTX_H
#define MGC_PTX_H
#include <stdbool.h>
#include <stddef.h>

/* dlopen of name (or of $env's path when set), else of dir/name; NULL with
   dlerror's reason in err. The CUDA libraries (NVRTC, the driver, cuBLAS, NCCL). */
void *rt_open_lib(const char *name, const char *env, const char *dir, char *err, size_t err_size);
/* Opens NVRTC once: true, or false with why (and what to do) in err. */
bool rt_nvrtc_open(char *err, size_t err_size);
/* The architecture to compile for a GPU of compute capability want (90 for
   sm_90): want itself when NVRTC compiles for it (*ptx false: a cubin), else
   the newest older one NVRTC knows, as PTX (*ptx true: the driver compiles it
   for the GPU on loading, PTX running on every later GPU); -1 with why in err
   when NVRTC knows none (a GPU older than it supports) or is missing. */
int rt_nvrtc_arch(int want, bool *ptx, char *err, size_t err_size);
/* rt_nvrtc_arch's choice among archs[0..n) (unit-tested): want, or the largest below it (*ptx), or -1. */
int rt_arch_choose(const int *archs, int n, int want, bool *ptx);
/* Compiles CUDA source for arch ("sm_90") to PTX (for compute_90). Returns the
   PTX (malloc'd, NUL-terminated, *size its length), or NULL with NVRTC's
   message (and log) in err. */
char *rt_nvrtc_ptx(const char *source, const char *name, const char *arch, size_t *size, char *err, size_t err_size);
/* The same to a cubin (machine code for arch), *size bytes (malloc'd). */
void *rt_nvrtc_cubin(const char *source, const char *name, const char *arch, size_t *size, char *err, size_t err_size);
/* "NVRTC 13.0" (part of the kernel cache's key), or "no NVRTC". */
const char *rt_nvrtc_version(char *buf, size_t size);
/* The options every compile gets beside the architecture. */
#define RT_NVRTC_NOPTIONS 3
extern const char *const rt_nvrtc_options[RT_NVRTC_NOPTIONS];

#endif
