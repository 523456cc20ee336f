/*
** CIFAR-10 and CIFAR-100, the binary versions (https://www.cs.toronto.edu/~kriz/cifar.html):
**
**   CIFAR-10 record:   u8 label 0..9, 3072 u8 pixels            (3073 bytes)
**   CIFAR-100 record:  u8 coarse label 0..19, u8 fine label 0..99,
**                      3072 u8 pixels                           (3074 bytes)
**
** A file is records and nothing else (no header): its size must be a whole
** number of them. The pixels are the red, green and blue 32x32 planes, each
** row-major, so a record's image is already as the Dataset keeps it. The
** class is the fine label; the coarse one is checked and dropped.
*/
#include "data_formats.h"
#include "digest.h"
#include "errbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CIFAR_SIDE 32
#define CIFAR_PIXELS (3 * CIFAR_SIDE * CIFAR_SIDE)
#define CIFAR_CHUNK 1024   /* records read at a time */

static size_t record_bytes(bool hundred) { return (hundred ? 2 : 1) + CIFAR_PIXELS; }

/* The records in the file at path; -1 with err set when it cannot be read,
   is empty, or is not a whole number of records (a truncated download). */
static long long count_records(const char *path, bool hundred, char *err, size_t err_size)
{
    struct stat st;
    size_t rec = record_bytes(hundred);
    const char *name = hundred ? "CIFAR-100" : "CIFAR-10";
    if (stat(path, &st) != 0) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    long long size = (long long)st.st_size, n = size / (long long)rec, left = size % (long long)rec;
    if (n == 0 && left == 0) {
        set_err(err, err_size, "%s: empty file: a %s batch holds records of %zu bytes (%s); fetch it again",
                path, name, rec, hundred ? "coarse and fine label, 3072 pixels" : "label, 3072 pixels");
        return -1;
    }
    if (left) {
        set_err(err, err_size, "%s: %lld bytes are not a whole number of %zu-byte %s records: %lld records and "
                "%lld bytes left over (file truncated?%s); fetch it again", path, size, rec, name, n, left,
                size % (long long)record_bytes(!hundred) == 0 ? hundred ? " it has the size of CIFAR-10 records"
                                                                        : " it has the size of CIFAR-100 records" : "");
        return -1;
    }
    if (n > 100000000) {   /* 300 GB: not a real batch; keeps the counts in int */
        set_err(err, err_size, "%s: %lld records: too many for a CIFAR batch", path, n);
        return -1;
    }
    return n;
}

/* Checks and copies n records of a chunk into d from example `at`; path and
   first (the chunk's first record in its file) for the messages. */
static int take_records(const unsigned char *buf, long n, bool hundred, Dataset *d, long at, const char *path,
                        long first, char *err, size_t err_size)
{
    size_t rec = record_bytes(hundred);
    int classes = hundred ? 100 : 10;
    for (long j = 0; j < n; j++) {
        const unsigned char *r = buf + (size_t)j * rec;
        if (hundred && r[0] >= 20) {
            set_err(err, err_size, "%s: coarse label %u of record %ld out of range 0..19 (not a CIFAR-100 batch?)",
                    path, r[0], first + j);
            return -1;
        }
        unsigned label = r[hundred ? 1 : 0];
        if ((int)label >= classes) {
            set_err(err, err_size, "%s: label %u of record %ld out of range 0..%d (not a CIFAR-%d batch?)", path,
                    label, first + j, classes - 1, classes);
            return -1;
        }
        d->labels[at + j] = (int)label;
        memcpy(d->pixels + (size_t)(at + j) * CIFAR_PIXELS, r + rec - CIFAR_PIXELS, CIFAR_PIXELS);
    }
    return 0;
}

/* Reads the n records of the file at path into d from example `at`, each
   chunk into digest as it comes. */
static int read_records(const char *path, bool hundred, long n, Dataset *d, long at, DataDigest *digest, char *err,
                        size_t err_size)
{
    data_digest_start(digest, path);
    size_t rec = record_bytes(hundred);
    FILE *fp = fopen(path, "rb");
    unsigned char *buf = malloc(rec * CIFAR_CHUNK);
    int rc = 0;
    if (!fp || !buf) {
        set_err(err, err_size, "%s: %s", path, fp ? "out of memory" : strerror(errno));
        rc = -1;
    }
    for (long i = 0; !rc && i < n; i += CIFAR_CHUNK) {
        long chunk = n - i < CIFAR_CHUNK ? n - i : CIFAR_CHUNK;
        if (fread(buf, rec, (size_t)chunk, fp) != (size_t)chunk) {
            set_err(err, err_size, "%s: read error at record %ld: %s", path, i,
                    ferror(fp) ? strerror(errno) : "the file got shorter while it was read");
            rc = -1;
        } else {
            data_digest_add(digest, buf, rec * (size_t)chunk);
            rc = take_records(buf, chunk, hundred, d, at + i, path, i, err, err_size);
        }
    }
    free(buf);
    if (fp) fclose(fp);
    return rc;
}

/* One set (training or test) from files path[first .. first + count), with their digests. */
static int load_set(const DataFiles *f, int first, int count, bool hundred, Dataset *d, DataDigest *digest, char *err,
                    size_t err_size)
{
    long long n[DATA_MAX_FILES], total = 0;
    for (int i = 0; i < count; i++) {
        if ((n[i] = count_records(f->path[first + i], hundred, err, err_size)) < 0) return -1;
        total += n[i];
    }
    d->pixels = malloc((size_t)total * CIFAR_PIXELS);
    d->labels = malloc(sizeof(int) * (size_t)total);
    if (!d->pixels || !d->labels) {
        set_err(err, err_size, "out of memory for %lld CIFAR images from %s", total, f->path[first]);
        return -1;
    }
    d->n = (int)total;
    d->channels = 3;
    d->rows = d->cols = CIFAR_SIDE;
    long at = 0;
    for (int i = 0; i < count; i++) {
        if (read_records(f->path[first + i], hundred, (long)n[i], d, at, &digest[first + i], err, err_size) < 0) return -1;
        at += (long)n[i];
    }
    return 0;
}

int cifar_load(const DataFiles *f, bool hundred, Dataset *train, Dataset *test, DataDigest *digest, char *err, size_t err_size)
{
    if (load_set(f, 0, f->ntrain, hundred, train, digest, err, err_size) < 0) return -1;
    return load_set(f, f->ntrain, f->nfiles - f->ntrain, hundred, test, digest, err, err_size);
}

int cifar_size(const DataFiles *f, bool hundred, size_t *bytes, long long *examples)
{
    char err[64];
    long long set[2] = { 0, 0 };
    for (int i = 0; i < f->nfiles; i++) {
        long long n = count_records(f->path[i], hundred, err, sizeof err);
        if (n < 0) return -1;
        set[i >= f->ntrain] += n;
    }
    /* each image's pixels and its label (an int); an epoch's order of the larger set */
    *examples = set[0] + set[1];
    *bytes = (size_t)*examples * (CIFAR_PIXELS + sizeof(int)) + (size_t)(set[0] > set[1] ? set[0] : set[1]) * sizeof(int);
    return 0;
}
