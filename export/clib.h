/*
** The exported C library's fixed files (export/clib/): the safetensors
** reader, the CPU's threads and GEMMs, the CUDA driver's and cuBLAS's calls,
** the example program. They are real C files, kept and compiled as such
** (tests/export_c.sh builds them with the warnings on); mgc holds their text
** (export/clib_files.c embeds them at build time) and writes them beside the
** generated model.c as they are.
*/
#ifndef MGC_CLIB_H
#define MGC_CLIB_H

typedef struct ExClibFile {
    const char *name;         /* "model_st.c" */
    const char *text;         /* its bytes, NUL-terminated */
} ExClibFile;

/* The file called name, or NULL. */
const ExClibFile *ex_clib_file(const char *name);

#endif
