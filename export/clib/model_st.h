/*
** model_st.h: the one file format the exported library reads (its weights)
** and its example program reads and writes (images in, logits out):
** safetensors, as huggingface/safetensors defines it:
**
**   u64 little-endian N | N bytes of JSON header | the tensors' bytes
**   header: {"__metadata__": {...}, "NAME": {"dtype": "F32", "shape": [2, 3],
**            "data_offsets": [BEGIN, END]}, ...}, offsets from the data's start
**
** A reader of its own (written by mgc export, part of no library but this
** one): the whole file in memory, the header checked (JSON syntax, dtypes,
** shapes against the offsets, offsets inside the file), names ASCII. The
** data are little-endian, as this host is assumed to be.
*/
#ifndef MODEL_ST_H
#define MODEL_ST_H
#include <stddef.h>

#define MGC_ST_MAX_DIMS 8

typedef struct mgc_st_tensor {
    char *name;                       /* points into the file's copy of its header, NUL-terminated there */
    char dtype[8];                    /* "F32", "U8", ... */
    int nd;
    long long shape[MGC_ST_MAX_DIMS];
    size_t begin, end;                /* bytes, from the data's start */
} mgc_st_tensor;

typedef struct mgc_st_file {
    unsigned char *bytes;             /* the whole file (malloc) */
    size_t size;
    size_t data;                      /* where the data start in bytes */
    int n;
    mgc_st_tensor *t;                 /* [n], in header order */
} mgc_st_file;

/* Reads path whole and checks its header: 0, or -1 with err. */
int  mgc_st_read(const char *path, mgc_st_file *f, char *err, size_t err_size);
/* The tensor called name, or NULL. */
const mgc_st_tensor *mgc_st_find(const mgc_st_file *f, const char *name);
/* Its bytes (end - begin of them), in the file's copy. */
const void *mgc_st_data(const mgc_st_file *f, const mgc_st_tensor *t);
void mgc_st_free(mgc_st_file *f);
/* Writes one tensor (nd dimensions, little-endian bytes) as path, through
   path.tmp renamed into place: 0, or -1 with err. */
int  mgc_st_write1(const char *path, const char *name, const char *dtype, int nd, const long long *shape, const void *data,
                   size_t nbytes, char *err, size_t err_size);

#endif
