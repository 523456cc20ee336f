/*
** What a checkpoint says of its model, so that it can be used alone: the
** .net file's text and name, the --set values, the input's shape and the
** transform its images went through (--resize, --normalize with the training
** set's mean and std), the classes, the precision, the data and mgc's version.
** --save writes it into the safetensors metadata (ck_model_put); mgc predict,
** evaluate and export read it back (ck_model_get) and build the model from it.
** One place for the keys:
**
**   mgc_version     "0.1.0"
**   net_file        the .net file as it was given ("nets/lenet.net")
**   net_source      its text
**   set             the --set values, "NAME=VALUE" a line ("" none)
**   input           an example's shape as the net takes it, "CxHxW"
**   classes         the net's outputs per example
**   precision       "fp32" or "bf16"
**   resize          "HxW", or "none"
**   normalize_mean  per channel, "%.9g" comma-separated (absent: not normalised)
**   normalize_std   the same
**   pixels          "byte/255" (bytes as ToTensor gives them), "float32" (as stored)
**   data            the data it trained on, in words ("IDX, 1x28x28")
**   class_names     the classes' names, a line each, where the data had them
*/
#ifndef MGC_CKMODEL_H
#define MGC_CKMODEL_H
#include "safetensors.h"
#include "transform.h"
#include <stdbool.h>
#include <stddef.h>

#define MGC_VERSION "0.1.0"

typedef enum CkPixels { CK_PIXELS_UNKNOWN, CK_PIXELS_BYTES, CK_PIXELS_FLOATS } CkPixels;

typedef struct CkModel {
    char *net_file;           /* as given at training, or NULL */
    char *net_text;           /* its bytes (net_len), or NULL: an older mgc's checkpoint */
    size_t net_len;
    char *sets;               /* --set values, "NAME=VALUE" a line ("" none); NULL: not said */
    int channels, height, width;   /* an example as the net takes it (after --resize); 0: not said */
    int classes;              /* 0: not said */
    int bf16;                 /* 1 bf16, 0 fp32, -1 not said */
    bool has_transform;       /* resize and normalize below are the checkpoint's (else not said) */
    int resize_h, resize_w;   /* --resize, 0: none */
    bool normalize;
    int nchannels;            /* of mean and std */
    float mean[TRANSFORM_MAX_CHANNELS], std[TRANSFORM_MAX_CHANNELS];
    CkPixels pixels;
    char data[96];            /* "" not said */
    char *class_names;        /* a line each (as many as classes), or NULL */
    char version[32];         /* "" not said */
} CkModel;

/* Writes m's keys (those it knows) into w's metadata. 0, or -1 (the writer's error). */
int  ck_model_put(StWriter *w, const CkModel *m);
/* Reads what f's metadata says of its model into m (zeroed first; what is
   not said stays unknown). 0, or -1 with err when a key is there but
   malformed (naming it). */
int  ck_model_get(const StFile *f, CkModel *m, char *err, size_t err_size);
void ck_model_free(CkModel *m);
/* The transform m says (resize, normalize with its statistics) into t. */
void ck_model_transform(const CkModel *m, Transform *t);

#endif
