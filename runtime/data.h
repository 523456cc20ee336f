/*
** Fashion-MNIST loading and batching.
**
** Reads the four official IDX files (gzip-compressed or plain, detected by
** their magic bytes through zlib), validates every header, size and label,
** and converts pixels to float32 in [0,1] (byte / 255). Errors come back as a
** message naming the file and what is wrong; nothing here exits.
**
** Shuffling is deterministic: data_epoch_order(n, seed, epoch) is a
** Fisher-Yates permutation from an Rng seeded by (seed, epoch).
*/
#ifndef MGC_DATA_H
#define MGC_DATA_H
#include <stddef.h>

#define DATA_URL "https://github.com/zalandoresearch/fashion-mnist"
#define DATA_CLASSES 10

typedef struct Dataset {
    int n;                  /* examples */
    int channels;           /* 1 (IDX) */
    int rows, cols;         /* 28, 28 */
    unsigned char *pixels;  /* n*channels*rows*cols, channel-planar and row-major per image, 0..255; owned */
    unsigned char *labels;  /* n, 0..9; owned */
} Dataset;

/* Loads train (60000) and test (10000) from dir: train-images-idx3-ubyte,
   train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte,
   each as NAME.gz or NAME (the .gz name is tried first; either may hold
   gzip or plain bytes). Returns 0, or -1 with a message in err (err_size
   bytes) and both datasets empty. */
int  data_load_fashion_mnist(const char *dir, Dataset *train, Dataset *test,
                             char *err, size_t err_size);
/* What the four files in dir hold, from their headers (and gzip's CRC-32 of
   their contents), in words, without reading the data: "train-images 60000x28x28
   crc ..., train-labels 60000 crc ..., ...", a file that cannot be read said so.
   For ranks to compare before they start. */
void data_probe(const char *dir, char *out, size_t size);
/* Frees and zeroes; safe on a zeroed or already freed Dataset. */
void data_free(Dataset *d);
/* Keeps the first n examples (no-op if n < 0 or n >= d->n; memory is kept). */
void data_limit(Dataset *d, int n);
/* Default data dir into buf: $MGC_DATA if set and non-empty, else
   $HOME/.cache/mgc/fashion-mnist (./fashion-mnist without HOME). Returns buf. */
const char *data_default_dir(char *buf, size_t size);
/* order[0..n) = a permutation of 0..n-1 for epoch `epoch` of run `seed`:
   deterministic, different per epoch. */
void data_epoch_order(int n, unsigned long long seed, int epoch, int *order);
/* x = images of examples order[0..b) (b*channels*rows*cols floats in [0,1], byte/255.0f, NCHW),
   y = their labels as float (b floats). */
void data_gather(const Dataset *d, const int *order, int b, float *x, float *y);

#endif
