/*
** Safetensors checkpoints: reader and writer for the format of Hugging
** Face's `safetensors` (https://github.com/huggingface/safetensors):
**
**   u64 little-endian N | N bytes of JSON header, space-padded to a multiple of 8 | data
**   header: {"__metadata__":{"k":"v",...},
**            "name":{"dtype":"F32","shape":[6,1,5,5],"data_offsets":[begin,end]}, ...}
**   offsets are relative to the first byte after the header; data little-endian.
**
** The writer keeps tensors in insertion order (JSON order = data order) and
** writes atomically: PATH.tmp, fsync, rename. The reader validates everything
** (header length, JSON syntax, dtypes, shapes, nbytes, offsets inside the file
** and not overlapping) and never trusts a byte of the file, in time and
** memory linear in the file's header (names in a hash set; each string's
** allocation bounded by its own length): 80,000 tensors parse in tens of
** milliseconds. Assumes a little-endian host (x86-64, aarch64).
*/
#ifndef MGC_SAFETENSORS_H
#define MGC_SAFETENSORS_H
#include <stddef.h>

#define ST_MAX_DIMS 8

typedef struct StTensor {
    char *name;                     /* owned */
    char dtype[8];                  /* "F32", "F64", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL" */
    int nd;                         /* 0 (scalar) .. ST_MAX_DIMS */
    long long shape[ST_MAX_DIMS];
    void *data;                     /* owned, malloc'd (so suitably aligned); NULL when nbytes == 0 */
    size_t nbytes;                  /* numel * dtype size */
} StTensor;

typedef struct StIndex StIndex;     /* a hash set of tensors by name (safetensors.c) */

typedef struct StFile {
    int n;                          /* tensors, in header (file) order */
    StTensor *t;
    char *meta_json;                /* raw "__metadata__" object text, or NULL; owned */
    StIndex *index;                 /* t by name, for st_find; owned */
} StFile;

/* Writer. Data is COPIED at add time: the caller may free or reuse its
   buffer right after st_writer_add_*. Errors from add/set_meta (bad name,
   duplicate, nd out of range, out of memory) are remembered and reported,
   with a message, by st_writer_save; add/set_meta also return -1 at once. */
typedef struct StWriter StWriter;
StWriter *st_writer_new(void);
int  st_writer_add_f32(StWriter *w, const char *name, int nd, const long long *shape,
                       const float *data);
/* Any dtype above; nbytes of data are derived from shape and dtype. */
int  st_writer_add(StWriter *w, const char *name, const char *dtype, int nd,
                   const long long *shape, const void *data);
/* Adds or replaces a metadata string. */
int  st_writer_set_meta(StWriter *w, const char *key, const char *value);
int  st_writer_save(StWriter *w, const char *path, char *err, size_t err_size);
void st_writer_free(StWriter *w);

/* Reader: 0, or -1 with a message (and *f empty). */
int  st_load(const char *path, StFile *f, char *err, size_t err_size);
/* As st_load, checked as closely, but without the data: every tensor's data
   stays NULL (nbytes is set). For a look at names, dtypes and shapes. */
int  st_load_header(const char *path, StFile *f, char *err, size_t err_size);
/* The tensor called name, or NULL: a hash lookup. */
const StTensor *st_find(const StFile *f, const char *name);
/* Metadata value of key into out (NUL-terminated, truncated to size);
   returns its full length, or -1 if absent. */
int  st_meta_get(const StFile *f, const char *key, char *out, size_t size);
long long st_numel(const StTensor *t);
/* Bytes per element of a dtype name; 0 if unknown. */
size_t st_dtype_size(const char *dtype);
/* t's elements converted to float32 into out[numel]: every dtype above
   (I64/I32 rounded to nearest float). 0, or -1 for an unknown dtype. */
int  st_to_f32(const StTensor *t, float *out);
void st_free(StFile *f);

#endif
