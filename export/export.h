/*
** Exports: a trained model in forms that run without mgc. Each takes the
** evaluation form of the net (BatchNorm on its running statistics, dropout
** off; the inference rewrite's output where the form runs generated code)
** and the checkpoint's tensors, by the IR's parameter names.
**
**   ex_c        a standalone C (or CUDA) library: model.h, model.c, the
**               weights, a Makefile and an example program (export/c.c)
**   ex_onnx     ONNX, through protobuf-c and ONNX's own .proto (export/onnx.c)
**   ex_pytorch  an nn.Module whose load_state_dict takes the checkpoint (export/pytorch.c)
**
** export/ sees ir/, codegen/ and runtime/; the driver calls it. Every
** function returns 0, or -1 with a message in err naming what could not be
** exported and why (an op the form cannot express names the op and its
** place in the .net file).
*/
#ifndef MGC_EXPORT_H
#define MGC_EXPORT_H
#include "codegen.h"
#include "safetensors.h"
#include "ckmodel.h"

typedef struct ExModel {
    const Graph *graph;       /* the evaluation form (training false); its loss and accuracy nodes are not exported:
                                 the output is the logits, the loss's first input */
    const StFile *weights;    /* the checkpoint: every PARAM and STATE node's tensor, by its name */
    const CkModel *info;      /* what the checkpoint says: the input's shape, the classes, the transform (resize,
                                 normalize's mean and std), the source file */
    const char *net_name;
    const char *checkpoint;   /* its path, for the files' headers */
    bool batch_given;         /* the program's plan batch was asked for (--batch-size): a CPU library's pieces, else chosen */
} ExModel;

int ex_onnx(const ExModel *m, const char *path, char *err, size_t err_size);
/* What this build's ex_onnx writes ("export to ONNX IR version 8, opset 17 ..."),
   or why it writes nothing (built without protobuf-c and onnx.proto), into buf. */
const char *ex_onnx_about(char *buf, size_t size);
/* p: the evaluation program compiled for the target (cuda: CUDA kernels and cuBLAS). */
int ex_c(const ExModel *m, const Program *p, bool cuda, const char *dir, char *err, size_t err_size);
int ex_pytorch(const ExModel *m, const char *path, char *err, size_t err_size);

#endif
