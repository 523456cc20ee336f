/*
** The files of export/clib/ in mgc's binary (see clib.h): each one's bytes
** put in read-only data by the assembler's .incbin (the path from the
** directory make runs in, the repository's root; the Makefile makes this
** object depend on them), a NUL after it.
*/
#include "clib.h"
#include <string.h>

#define EMBED(sym, path)                                                                                         \
    __asm__(".section .rodata\n.balign 8\n.type " #sym ", @object\n" #sym ":\n.incbin \"" path "\"\n.byte 0\n" \
            ".size " #sym ", . - " #sym "\n.previous\n");                                                        \
    extern const char sym[];

EMBED(ex_clib_model_st_h, "export/clib/model_st.h")
EMBED(ex_clib_model_st_c, "export/clib/model_st.c")
EMBED(ex_clib_model_cpu_h, "export/clib/model_cpu.h")
EMBED(ex_clib_model_cpu_c, "export/clib/model_cpu.c")
EMBED(ex_clib_model_cuda_h, "export/clib/model_cuda.h")
EMBED(ex_clib_model_cuda_c, "export/clib/model_cuda.c")
EMBED(ex_clib_mgc_predict_c, "export/clib/mgc_predict.c")
EMBED(ex_clib_api_cpu_inc, "export/clib/api_cpu.inc")
EMBED(ex_clib_api_cuda_inc, "export/clib/api_cuda.inc")

static const ExClibFile files[] = {
    { "model_st.h", ex_clib_model_st_h }, { "model_st.c", ex_clib_model_st_c },
    { "model_cpu.h", ex_clib_model_cpu_h }, { "model_cpu.c", ex_clib_model_cpu_c },
    { "model_cuda.h", ex_clib_model_cuda_h }, { "model_cuda.c", ex_clib_model_cuda_c },
    { "mgc_predict.c", ex_clib_mgc_predict_c }, { "api_cpu.inc", ex_clib_api_cpu_inc }, { "api_cuda.inc", ex_clib_api_cuda_inc },
};

const ExClibFile *ex_clib_file(const char *name)
{
    for (size_t k = 0; k < sizeof files / sizeof *files; k++)
        if (!strcmp(files[k].name, name)) return &files[k];
    return NULL;
}
