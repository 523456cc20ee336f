/*
** The data sets: loading and batching.
**
** The format is found from the files in the data directory, in this order:
**
**   safetensors  train.safetensors and test.safetensors, each with `images`
**                (U8 pixels or F32 values; [N, C, H, W], [N, H, W, C] where
**                the last dimension is 1, 3 or 4 and the second is not, or
**                [N, H, W]) and `labels` (U8, I32 or I64; [N], 0..K-1)
**   CIFAR-10     data_batch_1.bin ... data_batch_5.bin and test_batch.bin
**                (records of 1 label byte and 3072 pixel bytes, the red,
**                green and blue 32x32 planes), in DIR or DIR/cifar-10-batches-bin
**   CIFAR-100    train.bin and test.bin (records of a coarse and a fine label
**                byte and 3072 pixel bytes; the fine label is the class), in
**                DIR or DIR/cifar-100-binary
**   images       DIR/train/CLASS/NAME.png|jpg and DIR/test/CLASS/... (torchvision's
**                ImageFolder; data_images.c), decoded at the net's shape
**   IDX          train-images-idx3-ubyte, train-labels-idx1-ubyte,
**                t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each as
**                NAME.gz or NAME, gzip or plain (detected by the magic bytes
**                through zlib): Fashion-MNIST, MNIST, KMNIST, EMNIST, of any
**                image size (the header's) and number of classes
**
** The class count is max label + 1 over training and test (fixed at 10 and
** 100 for CIFAR). Every header, size and label is validated; a failure comes
** back as a message naming the file, what is wrong and what to do; nothing
** here exits. Pixels stay bytes and become byte / 255 (as ToTensor makes
** them) in data_gather; F32 images are used as they are.
**
** Shuffling is deterministic: data_epoch_order(n, seed, epoch) is a
** Fisher-Yates permutation from an Rng seeded by (seed, epoch).
*/
#ifndef MGC_DATA_H
#define MGC_DATA_H
#include <stdbool.h>
#include <stddef.h>

#define DATA_URL "https://github.com/zalandoresearch/fashion-mnist"
#define DATA_CLASSES 10          /* Fashion-MNIST's: what a net is checked against when no data is found */
#define DATA_MAX_CHANNELS 64     /* per-channel statistics (--normalize) have room for this many */
#define DATA_MAX_CLASSES 65536   /* a label at or above this is taken for a damaged file */

typedef struct Dataset {
    int n;                  /* examples */
    int channels;           /* 1 (IDX, or [N, H, W] arrays), 3 (CIFAR), 1..4 (safetensors) */
    int rows, cols;
    int classes;            /* max label + 1 over training and test (10, 100 for CIFAR) */
    unsigned char *pixels;  /* n*channels*rows*cols, channel-planar and row-major per image, 0..255; owned; NULL with values */
    float *values;          /* the same layout as floats, used as they are (F32 arrays); owned; NULL with pixels */
    int *labels;            /* n, 0..classes-1; owned */
} Dataset;

#define DATA_MAX_FILES 6  /* of one data set: CIFAR-10's six batches */

/* A digest of all that was read of one file, computed as it was read (for
   ranks to compare: data that differs anywhere trains apart). */
typedef struct DataDigest {
    char file[48];          /* its name: "train-images-idx3-ubyte.gz", "data_batch_1.bin" */
    long long bytes;        /* read: IDX uncompressed, header included; CIFAR the whole file; safetensors
                               its `images` and `labels` data */
    unsigned long crc;      /* zlib's CRC-32 of those bytes */
} DataDigest;

/* What a data directory holds: from the headers (data_describe), or from the
   data (data_load). */
typedef struct DataInfo {
    char format[16];        /* "safetensors", "CIFAR-10", "CIFAR-100", "IDX"; "Fashion-MNIST" where none was found */
    int channels, rows, cols;
    int classes;            /* 0 where only the labels tell (IDX, safetensors) and they were not read */
    bool floats;            /* F32 images */
    bool unlabelled;        /* data_load_file of a file without labels (every label 0) */
    char class_names[4096]; /* the classes' names, a line each, where the data has them (CIFAR's
                               batches.meta.txt, fine_label_names.txt; a safetensors set's
                               metadata "class_names"), else "" */
    int nfiles;             /* data_load: each file's digest, in the format's order; data_describe: 0 */
    DataDigest files[DATA_MAX_FILES];
} DataInfo;

/* Image folders (DIR/train/CLASS/NAME.png|jpg, DIR/test/...) are decoded at this shape (the net's C,
   H, W) by data_load and described so by data_describe; 0s (the default): the first image's. */
void data_image_shape(int c, int h, int w);
/* Loads the training and test sets from dir (see above). Returns 0 (info,
   when not NULL, says what was read), or -1 with a message in err (err_size
   bytes) and both data sets empty. */
int  data_load(const char *dir, Dataset *train, Dataset *test, DataInfo *info, char *err, size_t err_size);
/* Whether path is there and not a directory. */
bool data_is_file(const char *path);
/* One FILE.safetensors holding `images` (and `labels`, optional), as a
   data set file holds them, into d (mgc predict's and evaluate's data);
   hint: the net's C, H, W, which settles an array's layout, or NULL. 0, or
   -1 with err. */
int  data_load_file(const char *path, const int *hint, Dataset *d, DataInfo *info, char *err, size_t err_size);
/* The format, the image shape and (where the headers say) the classes of the
   data in dir, from the first bytes of its files only. 0; 1 when no data set
   is there (info says Fashion-MNIST's 1x28x28 and 10 classes, what mgc looks
   for by default; data_load will say what is missing); -1 with a message in
   err when files of a format are there but cannot be read. */
int  data_describe(const char *dir, DataInfo *info, char *err, size_t err_size);
/* What data_load(dir) will hold in memory, told from the files' headers and
   sizes before any data is read: the images and labels of both sets (pixels
   a byte, F32 values four, labels an int each), the largest of the loader's
   passing copies, and an epoch's order of the larger set. */
typedef struct DataSize {
    size_t bytes;
    long long examples;     /* training and test */
    char format[16];        /* "IDX", "CIFAR-10", ... */
} DataSize;
/* 0 (into *size); -1 where the files cannot tell (missing, damaged:
   data_load will say what is wrong). Reads headers only. */
int  data_size(const char *dir, DataSize *size);
/* What the files in dir hold, in words, without reading the data: for IDX
   "train-images 60000x28x28 crc ..., train-labels 60000 crc ..., ..." (gzip's
   CRC-32 of the contents), for the others "CIFAR-10: data_batch_1.bin 30730000
   bytes crc ..., ..." (a CRC-32 of the first and last 64 KiB); a file that
   cannot be read said so. For ranks to compare before they start, in
   milliseconds; data_load's digests (DataInfo.files) cover everything read. */
void data_probe(const char *dir, char *out, size_t size);
/* Frees and zeroes; safe on a zeroed or already freed Dataset. */
void data_free(Dataset *d);
/* Keeps the first n examples (no-op if n < 0 or n >= d->n; memory is kept). */
void data_limit(Dataset *d, int n);
/* --val-split: round(frac * d->n) examples drawn from seed (the same on every rank and device) moved
   out of d into *val, both in d's order; 0, or -1 (out of memory). */
int data_split(Dataset *d, Dataset *val, double frac, unsigned long long seed);
/* Default data dir into buf: $MGC_DATA if set and non-empty, else
   $HOME/.cache/mgc/fashion-mnist (./fashion-mnist without HOME). Returns buf. */
const char *data_default_dir(char *buf, size_t size);
/* order[0..n) = a permutation of 0..n-1 for epoch `epoch` of run `seed`:
   deterministic, different per epoch. */
void data_epoch_order(int n, unsigned long long seed, int epoch, int *order);
/* x = images of examples order[0..b) (b*channels*rows*cols floats, NCHW: byte/255.0f
   in [0,1], or the F32 values as stored), y = their labels as float (b floats). */
void data_gather(const Dataset *d, const int *order, int b, float *x, float *y);

#endif
