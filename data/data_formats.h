/*
** Inside the data loader (data.c): the files a format was found in, and the
** readers of the formats other than IDX (data_cifar.c, data_st.c). Each
** reader fills both Datasets (labels checked against the format's range) or
** returns -1 with a message; data.c frees what a failed reader left, counts
** the classes and checks that training and test images have one shape.
*/
#ifndef MGC_DATA_FORMATS_H
#define MGC_DATA_FORMATS_H
#include "data.h"

#define DATA_PATH 4200

enum { FMT_SAFETENSORS, FMT_CIFAR10, FMT_CIFAR100, FMT_IDX };

/* Where a format's files are: path[0..ntrain) hold the training set,
   path[ntrain..nfiles) the test set (IDX: images, then labels, of each). */
typedef struct DataFiles {
    int format;   /* FMT_* */
    int nfiles, ntrain;
    char path[DATA_MAX_FILES][DATA_PATH];
} DataFiles;

/* CIFAR-10 (hundred false) or CIFAR-100 binary batches; digest[i]: file i's. */
int cifar_load(const DataFiles *f, bool hundred, Dataset *train, Dataset *test, DataDigest *digest, char *err, size_t err_size);
/* The bytes CIFAR's batches will take once loaded (DataSize), and their records: 0, or -1. */
int cifar_size(const DataFiles *f, bool hundred, size_t *bytes, long long *examples);

/* train.safetensors and test.safetensors; *floats: the images are F32; digest[i]: file i's. */
int st_data_load(const DataFiles *f, Dataset *train, Dataset *test, bool *floats, DataDigest *digest, char *err,
                 size_t err_size);
/* One file's images, and its labels where it has them (else *labelled false
   and every label 0), into d: mgc predict's data. hint: the net's C, H, W
   (an [N, 4, 4, 4] array is read as the net takes it), or NULL. */
int st_data_load_one(const char *path, const int *hint, Dataset *d, bool *floats, bool *labelled, DataDigest *digest, char *err,
                     size_t err_size);
/* The bytes the two files will take once loaded (DataSize), and their examples: 0, or -1. */
int st_data_size(const DataFiles *f, size_t *bytes, long long *examples);
/* The images' shape and dtype from train.safetensors's header, into info. */
int st_data_describe(const char *path, DataInfo *info, char *err, size_t err_size);

/* Image folders (data_images.c): whether dir/train holds class folders; both sets decoded at hint's
   C, H, W (NULL: the first image's size, grayscale where it is), cached beside them; the classes, the
   training folders' sorted names, in info->class_names. */
bool images_found(const char *dir);
int images_load(const char *dir, const int *hint, Dataset *train, Dataset *test, DataInfo *info, char *err, size_t size);
int images_describe(const char *dir, const int *hint, DataInfo *info, char *err, size_t size);
int images_count(const char *dir, long long *examples);

#endif
