/*
** The exports not written yet: each says so (status 1). Replaced, format by
** format, by export/c.c (ONNX's is export/onnx.c, PyTorch's export/pytorch.c).
*/
#include "export.h"
#include <stdio.h>

int ex_c(const ExModel *m, const Program *p, bool cuda, const char *dir, char *err, size_t err_size)
{
    (void)m, (void)p;
    snprintf(err, err_size, "cannot write %s: this mgc does not export a %s library yet", dir, cuda ? "CUDA" : "C");
    return -1;
}
