/*
** NVRTC, the CUDA runtime compiler, for inspection without a GPU: the
** generated CUDA kernels compiled to PTX (mgc --emit ptx). Built when the
** CUDA toolkit is found (HAVE_NVRTC); without it the call says so.
*/
#ifndef MGC_PTX_H
#define MGC_PTX_H
#include <stdbool.h>
#include <stddef.h>

bool rt_nvrtc_available(void);
/* Compiles CUDA source for arch ("sm_90") to PTX. Returns the PTX (malloc'd),
   or NULL with NVRTC's message (and log) in err. */
char *rt_nvrtc_ptx(const char *source, const char *name, const char *arch, char *err, size_t err_size);
/* The same to a cubin (machine code for arch), *size bytes (malloc'd). */
void *rt_nvrtc_cubin(const char *source, const char *name, const char *arch, size_t *size, char *err, size_t err_size);
/* "NVRTC 13.0" (part of the kernel cache's key), or "no NVRTC". */
const char *rt_nvrtc_version(char *buf, size_t size);
/* The options every compile gets beside the architecture. */
#define RT_NVRTC_NOPTIONS 3
extern const char *const rt_nvrtc_options[RT_NVRTC_NOPTIONS];

#endif
