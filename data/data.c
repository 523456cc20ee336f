/*
** The data loader: finds the format of the files in the data directory,
** reads IDX here (through zlib: gzip or plain) and the others through
** data_cifar.c and data_st.c, checks what every format must satisfy
** (training and test images of one shape, labels counted into classes), and
** gathers batches; deterministic epoch shuffles.
**
** IDX (all integers big-endian):
**   images: u32 magic 0x00000803, u32 count, u32 rows, u32 cols, count*rows*cols u8
**   labels: u32 magic 0x00000801, u32 count, count u8
** Each file is read whole (one allocation of the exact size the header
** announces, filled by gzread calls of 1 MiB), then checked and converted.
** Every reader keeps a digest of all it reads of each file (DataInfo.files),
** a CRC-32 taken of each piece while it is in the cache: the ranks of an
** mpirun compare them before they train.
*/
#include "data.h"
#include "data_formats.h"
#include "digest.h"
#include "errbuf.h"
#include "paths.h"
#include "rng.h"
#include "safetensors.h"

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_LABELS_MAGIC 0x00000801u
#define IDX_MAX_SIDE 65536u        /* header sanity bound on rows and columns */
#define MAX_EXAMPLES 100000000u   /* header sanity bound, far above any real file */
#define CIFAR_URL "https://www.cs.toronto.edu/~kriz/cifar.html"

enum { F_TRAIN_IMAGES, F_TRAIN_LABELS, F_TEST_IMAGES, F_TEST_LABELS, F_COUNT };
static const char *const file_names[F_COUNT] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
};

/* The formats found by their file names, in the order they are looked for
   (IDX, last, by file_names). A format is there when any of its files is, in
   dir or in the folder its archive unpacks to. */
typedef struct Format {
    const char *name, *subdir;
    int ntrain, nfiles;
    const char *files[DATA_MAX_FILES];
    const char *whole;   /* where a whole set comes from, for "incomplete" */
} Format;
static const Format formats[FMT_IDX] = {
    [FMT_SAFETENSORS] = { "safetensors", NULL, 1, 2, { "train.safetensors", "test.safetensors" },
                          "mgc needs both train.safetensors and test.safetensors, each with the tensors `images` and `labels`" },
    [FMT_CIFAR10] = { "CIFAR-10", "cifar-10-batches-bin", 5, 6,
                      { "data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                        "data_batch_5.bin", "test_batch.bin" },
                      "the binary version, cifar-10-binary.tar.gz from " CIFAR_URL ", holds all six" },
    [FMT_CIFAR100] = { "CIFAR-100", "cifar-100-binary", 1, 2, { "train.bin", "test.bin" },
                       "the binary version, cifar-100-binary.tar.gz from " CIFAR_URL ", holds both" },
};

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Path of file `which` in dir: NAME.gz if present, else NAME; 1 if found, 0 if
   neither exists, -1 if one exists but is not a regular file (then path names it). */
static int find_file(const char *dir, int which, char *path, size_t size)
{
    struct stat st;
    int other = -1;   /* the first name that exists but is no regular file */
    for (int gz = 1; gz >= 0; gz--) {
        snprintf(path, size, "%s/%s%s", dir, file_names[which], gz ? ".gz" : "");
        if (stat(path, &st) != 0) continue;
        if (S_ISREG(st.st_mode)) return 1;
        if (other < 0) other = gz;
    }
    if (other < 0) return 0;
    snprintf(path, size, "%s/%s%s", dir, file_names[which], other ? ".gz" : "");
    return -1;
}

/* Reads up to len bytes, each piece into digest (when not NULL) as it comes;
   returns bytes read, or -1 with err set on a zlib error. */
static long long read_exact(gzFile f, const char *path, unsigned char *buf, size_t len, DataDigest *digest,
                            char *err, size_t err_size)
{
    size_t got = 0;
    while (got < len) {
        size_t chunk = len - got;
        if (chunk > (1u << 20))   /* 1 MiB: its digest read while the piece is in the cache */
            chunk = 1u << 20;
        int n = gzread(f, buf + got, (unsigned)chunk);
        int errnum = Z_OK;
        const char *msg = gzerror(f, &errnum);
        if (errnum == Z_ERRNO) {
            set_err(err, err_size, "%s: read error: %s", path, strerror(errno));
            return -1;
        }
        if (errnum != Z_OK) {
            size_t plen = strlen(path);   /* zlib prefixes "PATH: "; we already say it */
            if (msg && strncmp(msg, path, plen) == 0 && msg[plen] == ':' && msg[plen + 1] == ' ')
                msg += plen + 2;
            set_err(err, err_size, "%s: bad gzip data (%s; zlib: %s)", path,
                    errnum == Z_BUF_ERROR ? "truncated gzip stream" : "corrupt gzip stream",
                    msg ? msg : "?");
            return -1;
        }
        if (n <= 0)
            break;
        if (digest) data_digest_add(digest, buf + got, (size_t)n);
        got += (size_t)n;
    }
    return (long long)got;
}

/* Reads and checks the header of an open IDX file. kind_magic selects images
   or labels (rows and cols 1). 0, or -1 with err set. */
static int idx_header(gzFile f, const char *path, uint32_t kind_magic, uint32_t *count, uint32_t *rows,
                      uint32_t *cols, DataDigest *digest, char *err, size_t err_size)
{
    int is_images = kind_magic == IDX_IMAGES_MAGIC;
    size_t header_len = is_images ? 16 : 8;
    unsigned char header[16];
    long long got = read_exact(f, path, header, header_len, digest, err, err_size);
    if (got < 0)
        return -1;
    if ((size_t)got < header_len) {
        set_err(err, err_size, "%s: file too short for an IDX %s header: %lld of %zu bytes%s",
                path, is_images ? "image" : "label", got, header_len,
                gzdirect(f) ? "" : " (after gunzip)");
        return -1;
    }
    uint32_t magic = be32(header);
    if (magic != kind_magic) {
        set_err(err, err_size,
                "%s: bad magic 0x%08x, expected 0x%08x (IDX %s file)%s", path, magic, kind_magic,
                is_images ? "image" : "label",
                magic == (is_images ? IDX_LABELS_MAGIC : IDX_IMAGES_MAGIC)
                    ? ": images and labels swapped?" :
                (header[0] == 0x1f && header[1] == 0x8b) ? ": gzip inside gzip?" : "");
        return -1;
    }
    *count = be32(header + 4);
    *rows = is_images ? be32(header + 8) : 1;
    *cols = is_images ? be32(header + 12) : 1;
    if (is_images && (*rows == 0 || *cols == 0 || *rows > IDX_MAX_SIDE || *cols > IDX_MAX_SIDE)) {
        set_err(err, err_size, "%s: implausible image size %ux%u in header (rows and columns 1 to %u)", path,
                *rows, *cols, IDX_MAX_SIDE);
        return -1;
    }
    if (*count == 0 || *count > MAX_EXAMPLES) {
        set_err(err, err_size, "%s: implausible %s count %u in header", path,
                is_images ? "image" : "label", *count);
        return -1;
    }
    return 0;
}

/* The message for a file whose size is not what its header says, with the
   bytes that really are there (got of the want + 1 asked for, and the rest). */
static void idx_size_err(gzFile f, const char *path, uint32_t kind_magic, uint32_t count, uint32_t rows,
                         uint32_t cols, size_t want, long long got, char *err, size_t err_size)
{
    int is_images = kind_magic == IDX_IMAGES_MAGIC;
    size_t header_len = is_images ? 16 : 8;
    unsigned long long total = (unsigned long long)got;
    if ((size_t)got > want) {
        unsigned char tmp[65536];
        int n;
        while ((n = gzread(f, tmp, sizeof tmp)) > 0)
            total += (unsigned)n;
    }
    char size[48] = "";
    if (is_images) snprintf(size, sizeof size, " of %ux%u", rows, cols);
    set_err(err, err_size,
            "%s: size does not match header: %u %s%s need %zu bytes after the %zu-byte "
            "header (expected %zu bytes%s), got %llu (%s)",
            path, count, is_images ? "images" : "labels", size, want, header_len, want + header_len,
            gzdirect(f) ? "" : " uncompressed", total + header_len,
            total < want ? "file truncated" : "trailing data");
}

/* Reads one IDX file. kind_magic selects images or labels. On success *data
   (malloc'd) holds count*item bytes, *count, *rows, *cols are set, and
   digest is the file's (uncompressed, header included). */
static int read_idx(const char *path, uint32_t kind_magic, unsigned char **data,
                    uint32_t *count, uint32_t *rows, uint32_t *cols, DataDigest *digest,
                    char *err, size_t err_size)
{
    *data = NULL;
    data_digest_start(digest, path);
    gzFile f = gzopen(path, "rb");
    if (!f) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    gzbuffer(f, 1u << 18);
    if (idx_header(f, path, kind_magic, count, rows, cols, digest, err, err_size) < 0)
        goto fail;
    size_t want = (size_t)*count * *rows * *cols;
    *data = malloc(want + 1);   /* +1: probe for trailing bytes */
    if (!*data) {
        set_err(err, err_size, "%s: out of memory for %zu bytes", path, want);
        goto fail;
    }
    long long got = read_exact(f, path, *data, want + 1, digest, err, err_size);
    if (got < 0)
        goto fail;
    if ((size_t)got != want) {
        idx_size_err(f, path, kind_magic, *count, *rows, *cols, want, got, err, err_size);
        goto fail;
    }
    gzclose(f);
    return 0;
fail:
    free(*data);
    *data = NULL;
    gzclose(f);
    return -1;
}

/* The images and labels of one set; digest[0] and [1]: theirs. */
static int load_pair(const char *img_path, const char *lab_path, Dataset *d, DataDigest *digest,
                     char *err, size_t err_size)
{
    unsigned char *pix = NULL, *lab = NULL;
    int *labels = NULL;
    uint32_t ni, nl, rows, cols, r1, c1;
    if (read_idx(img_path, IDX_IMAGES_MAGIC, &pix, &ni, &rows, &cols, &digest[0], err, err_size) < 0)
        return -1;
    if (read_idx(lab_path, IDX_LABELS_MAGIC, &lab, &nl, &r1, &c1, &digest[1], err, err_size) < 0) {
        free(pix);
        return -1;
    }
    if (ni != nl) {
        set_err(err, err_size, "image count != label count: %s has %u images, %s has %u labels",
                img_path, ni, lab_path, nl);
        goto fail;
    }
    /* every byte is a label: the classes are counted from them (check_sets) */
    if (!(labels = malloc(sizeof(int) * nl))) {
        set_err(err, err_size, "%s: out of memory for %u labels", lab_path, nl);
        goto fail;
    }
    for (uint32_t i = 0; i < nl; i++) labels[i] = lab[i];
    free(lab);
    d->n = (int)ni;
    d->channels = 1;
    d->rows = (int)rows;
    d->cols = (int)cols;
    d->pixels = pix;
    d->labels = labels;
    return 0;
fail:
    free(pix);
    free(lab);
    return -1;
}

static int idx_load(const DataFiles *f, Dataset *train, Dataset *test, DataDigest *digest, char *err, size_t err_size)
{
    if (load_pair(f->path[F_TRAIN_IMAGES], f->path[F_TRAIN_LABELS], train, &digest[F_TRAIN_IMAGES], err, err_size) < 0)
        return -1;
    return load_pair(f->path[F_TEST_IMAGES], f->path[F_TEST_LABELS], test, &digest[F_TEST_IMAGES], err, err_size);
}

/* The image shape from the training images' header. */
static int idx_describe(const char *path, DataInfo *info, char *err, size_t err_size)
{
    gzFile f = gzopen(path, "rb");
    if (!f) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    uint32_t count, rows, cols;
    int rc = idx_header(f, path, IDX_IMAGES_MAGIC, &count, &rows, &cols, NULL, err, err_size);
    gzclose(f);
    if (rc < 0) return -1;
    info->channels = 1;
    info->rows = (int)rows;
    info->cols = (int)cols;
    return 0;
}

/* ---------------------------------------------------------------- finding the format */

/* Appends ", NAME" (or NAME first) to list. */
static void list_add(char *list, size_t size, const char *name, const char *suffix)
{
    size_t len = strlen(list);
    snprintf(list + len, size - len, "%s%s%s", len ? ", " : "", name, suffix);
}

/* Format k's files in dir or in dir/its subdir: 1 (all there, into f), 0
   (none there), -1 (some missing, or one no regular file: said in err). */
static int find_format(const char *dir, int k, DataFiles *f, char *err, size_t err_size)
{
    const Format *fm = &formats[k];
    struct stat st;
    for (int sub = 0; sub < (fm->subdir ? 2 : 1); sub++) {
        int have = 0;
        for (int i = 0; i < fm->nfiles; i++) {
            snprintf(f->path[i], sizeof f->path[i], "%s%s%s/%s", dir, sub ? "/" : "", sub ? fm->subdir : "", fm->files[i]);
            have += stat(f->path[i], &st) == 0;
        }
        if (!have) continue;
        char missing[256] = "";
        for (int i = 0; i < fm->nfiles; i++) {
            if (stat(f->path[i], &st) != 0) {
                list_add(missing, sizeof missing, fm->files[i], "");
            } else if (!S_ISREG(st.st_mode)) {
                set_err(err, err_size, "%s file '%s' is %s, not a regular file: replace it with the file %s (%s)", fm->name,
                        f->path[i], rt_file_kind(st.st_mode), fm->files[i], fm->whole);
                return -1;
            }
        }
        if (missing[0]) {
            set_err(err, err_size, "%s data in '%s%s%s' is incomplete: missing %s; %s", fm->name, dir,
                    sub ? "/" : "", sub ? fm->subdir : "", missing, fm->whole);
            return -1;
        }
        f->format = k;
        f->nfiles = fm->nfiles;
        f->ntrain = fm->ntrain;
        return 1;
    }
    return 0;
}

/* The four IDX files: 1 (all there, into f), 0 (none), -1 (said in err). */
static int find_idx(const char *dir, DataFiles *f, char *err, size_t err_size)
{
    int missing = 0;
    char missing_list[512] = "";
    for (int i = 0; i < F_COUNT; i++) {
        int found = find_file(dir, i, f->path[i], sizeof f->path[i]);
        if (found < 0) {
            struct stat st;
            set_err(err, err_size, "Fashion-MNIST file '%s' is %s, not a regular file: replace it with the IDX file %s.gz "
                    "from %s (data/fashion/)", f->path[i], stat(f->path[i], &st) ? "of an unknown kind" : rt_file_kind(st.st_mode),
                    file_names[i], DATA_URL);
            return -1;
        }
        if (!found) {
            missing++;
            list_add(missing_list, sizeof missing_list, file_names[i], "[.gz]");
        }
    }
    if (missing == F_COUNT) return 0;
    if (missing) {
        set_err(err, err_size,
                "Fashion-MNIST not found in '%s': missing %s. "
                "mgc needs the four IDX files train-images-idx3-ubyte.gz, "
                "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz "
                "(gzip or uncompressed), published at %s (data/fashion/). "
                "Put them in that directory, or point mgc at them with --data DIR or MGC_DATA=DIR.",
                dir, missing_list, DATA_URL);
        return -1;
    }
    f->format = FMT_IDX;
    f->nfiles = F_COUNT;
    f->ntrain = 2;
    return 1;
}

static bool safetensors_name(const char *path)
{
    size_t n = strlen(path);
    return n > 12 && !strcmp(path + n - 12, ".safetensors");
}

/* The data set's files in dir: 0 (into f), 1 (none of any format: err says
   what was looked for), -1 (said in err). */
static int locate(const char *dir, DataFiles *f, char *err, size_t err_size)
{
    struct stat st;
    bool dir_exists = stat(dir, &st) == 0;
    if (dir_exists && !S_ISDIR(st.st_mode)) {
        set_err(err, err_size,
                "--data '%s' is a file, not a directory: point --data (or MGC_DATA) at the directory "
                "that holds the four Fashion-MNIST IDX files (or CIFAR-10 or CIFAR-100 binary batches, or "
                "train.safetensors and test.safetensors)", dir);
        return -1;
    }
    if (!dir_exists && safetensors_name(dir)) {   /* meant as mgc predict's one file */
        set_err(err, err_size, "the data file '%s' does not exist: give mgc predict a FILE.safetensors holding `images`, or a "
                "directory as --data takes", dir);
        return -1;
    }
    for (int k = 0; k < FMT_IDX; k++) {
        int found = find_format(dir, k, f, err, err_size);
        if (found) return found > 0 ? 0 : -1;
    }
    int found = find_idx(dir, f, err, err_size);
    if (found) return found > 0 ? 0 : -1;
    /* Fashion-MNIST is what mgc looks for unless told: its message as before, the others named */
    set_err(err, err_size,
            "Fashion-MNIST not found in '%s'%s: missing train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
            "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]. "
            "mgc needs the four IDX files train-images-idx3-ubyte.gz, "
            "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz "
            "(gzip or uncompressed), published at %s (data/fashion/). "
            "Put them in that directory, or point mgc at them with --data DIR or MGC_DATA=DIR. "
            "Other data sets found by their files there: train.safetensors and test.safetensors (`images` and "
            "`labels`); CIFAR-10 binary (data_batch_1.bin ... data_batch_5.bin, test_batch.bin, or in "
            "cifar-10-batches-bin/); CIFAR-100 binary (train.bin, test.bin, or in cifar-100-binary/).",
            dir, dir_exists ? "" : " (no such directory)", DATA_URL);
    return 1;
}

static const char *format_name(int format)
{
    return format == FMT_IDX ? "IDX" : formats[format].name;
}

/* ---------------------------------------------------------------- loading */

/* What every format must satisfy: training and test images of one shape;
   and the classes, counted from the labels (CIFAR's are fixed). */
static int check_sets(const DataFiles *f, Dataset *train, Dataset *test, char *err, size_t err_size)
{
    if (train->channels != test->channels || train->rows != test->rows || train->cols != test->cols) {
        set_err(err, err_size, "%s holds images of %dx%dx%d but %s holds %dx%dx%d: the training and test images "
                "must have one shape (channels x rows x columns)", f->path[0], train->channels, train->rows,
                train->cols, f->path[f->ntrain], test->channels, test->rows, test->cols);
        return -1;
    }
    int classes = f->format == FMT_CIFAR10 ? 10 : f->format == FMT_CIFAR100 ? 100 : 0;
    const Dataset *ds[2] = { train, test };
    for (int s = 0; s < 2 && (f->format == FMT_IDX || f->format == FMT_SAFETENSORS); s++)
        for (int i = 0; i < ds[s]->n; i++)
            if (ds[s]->labels[i] >= classes) classes = ds[s]->labels[i] + 1;
    train->classes = test->classes = classes;
    return 0;
}

/* A DataFiles to fill by locate(), or NULL with the message in err. */
static DataFiles *files_new(char *err, size_t err_size)
{
    DataFiles *f = malloc(sizeof *f);
    if (!f)
        set_err(err, err_size, "out of memory");
    return f;
}

/* names (a line each, or comma-separated) cleaned into out, a line each:
   "" where there are not `classes` of them, printable and at most 63 bytes */
static void names_take(const char *names, int classes, char *out, size_t size)
{
    int n = 0, p = 0;
    out[0] = 0;
    bool commas = !strchr(names, '\n');
    for (const char *s = names; *s && classes > 0;) {
        size_t len = strcspn(s, commas ? ",\n" : "\n");
        const char *b = s, *e = s + len;
        while (b < e && (*b == ' ' || *b == '\t' || *b == '\r')) b++;
        while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) e--;
        if (e > b) {
            for (const char *c = b; c < e; c++)
                if ((unsigned char)*c < 0x20 || *c == 0x7f || *c == ',') { out[0] = 0; return; }
            if (e - b > 63 || p + (e - b) + 2 >= (int)size) { out[0] = 0; return; }
            p += snprintf(out + p, size - (size_t)p, "%.*s\n", (int)(e - b), b);
            n++;
        }
        s += len + (s[len] != 0);
    }
    if (n != classes) out[0] = 0;
}

/* The class names beside the data, where it has them (see DataInfo). */
static void class_names(const DataFiles *f, int classes, char *out, size_t size)
{
    out[0] = 0;
    char path[DATA_PATH + 64], text[8192] = "";
    if (f->format == FMT_CIFAR10 || f->format == FMT_CIFAR100) {
        const char *slash = strrchr(f->path[0], '/');
        int dirlen = slash ? (int)(slash - f->path[0]) : 1;
        snprintf(path, sizeof path, "%.*s/%s", dirlen, slash ? f->path[0] : ".",
                 f->format == FMT_CIFAR10 ? "batches.meta.txt" : "fine_label_names.txt");
        FILE *in = fopen(path, "r");
        size_t got = in ? fread(text, 1, sizeof text - 1, in) : 0;
        if (in) fclose(in);
        text[got] = 0;
    } else if (f->format == FMT_SAFETENSORS) {
        StFile sf;
        char err[256];
        if (!st_load_header(f->path[0], &sf, err, sizeof err)) {
            if (st_meta_get(&sf, "class_names", text, sizeof text) < 0) text[0] = 0;
            st_free(&sf);
        }
    }
    if (text[0]) names_take(text, classes, out, size);
}

static int image_hint[3];

void data_image_shape(int c, int h, int w) { image_hint[0] = c, image_hint[1] = h, image_hint[2] = w; }

int data_load(const char *dir, Dataset *train, Dataset *test, DataInfo *info, char *err, size_t err_size)
{
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (dir && *dir && images_found(dir)) {
        int rc = images_load(dir, image_hint[0] ? image_hint : NULL, train, test, info, err, err_size);
        if (rc) data_free(train), data_free(test);
        return rc;
    }
    DataFiles *f = files_new(err, err_size);
    if (!f)
        return -1;
    if (!dir || !*dir)
        dir = ".";
    bool floats = false;
    DataDigest digest[DATA_MAX_FILES];
    int rc = locate(dir, f, err, err_size) ? -1 : 0;
    if (!rc && f->format == FMT_SAFETENSORS)
        rc = st_data_load(f, train, test, &floats, digest, err, err_size);
    else if (!rc && (f->format == FMT_CIFAR10 || f->format == FMT_CIFAR100))
        rc = cifar_load(f, f->format == FMT_CIFAR100, train, test, digest, err, err_size);
    else if (!rc)
        rc = idx_load(f, train, test, digest, err, err_size);
    if (!rc)
        rc = check_sets(f, train, test, err, err_size);
    if (rc) {
        data_free(train);
        data_free(test);
    } else if (info) {
        *info = (DataInfo){ .channels = train->channels, .rows = train->rows, .cols = train->cols,
                            .classes = train->classes, .floats = floats, .nfiles = f->nfiles };
        snprintf(info->format, sizeof info->format, "%s", format_name(f->format));
        memcpy(info->files, digest, sizeof(DataDigest) * (size_t)f->nfiles);
        class_names(f, train->classes, info->class_names, sizeof info->class_names);
    }
    free(f);
    return rc;
}

bool data_is_file(const char *path)
{
    struct stat st;
    return path && !stat(path, &st) && !S_ISDIR(st.st_mode);
}


int data_load_file(const char *path, const int *hint, Dataset *d, DataInfo *info, char *err, size_t err_size)
{
    memset(d, 0, sizeof *d);
    if (!safetensors_name(path)) {
        set_err(err, err_size, "the data '%s' is a file: give a directory as --data takes (IDX, CIFAR, or train.safetensors "
                "and test.safetensors), or one FILE.safetensors holding `images` (and `labels`, optional)", path);
        return -1;
    }
    bool floats, labelled;
    DataDigest digest;
    if (st_data_load_one(path, hint, d, &floats, &labelled, &digest, err, err_size)) {
        data_free(d);
        return -1;
    }
    *info = (DataInfo){ .channels = d->channels, .rows = d->rows, .cols = d->cols, .classes = d->classes, .floats = floats,
                        .nfiles = 1, .unlabelled = !labelled };
    snprintf(info->format, sizeof info->format, "safetensors");
    info->files[0] = digest;
    return 0;
}

/* IDX: the images' headers (gzip's first bytes); labels as many. */
static int idx_size(const DataFiles *f, size_t *bytes, long long *examples)
{
    long long set[2];
    size_t kept = 0;
    for (int s = 0; s < 2; s++) {
        const char *path = f->path[s ? F_TEST_IMAGES : F_TRAIN_IMAGES];
        char err[64];
        uint32_t count, rows, cols;
        gzFile g = gzopen(path, "rb");
        int rc = g ? idx_header(g, path, IDX_IMAGES_MAGIC, &count, &rows, &cols, NULL, err, sizeof err) : -1;
        if (g) gzclose(g);
        if (rc < 0) return -1;
        set[s] = count;
        /* a byte a pixel (and the one the reader probes past the end), an int a label */
        kept += (size_t)count * rows * cols + 1 + (size_t)count * sizeof(int);
    }
    long long most = set[0] > set[1] ? set[0] : set[1];
    *examples = set[0] + set[1];
    *bytes = kept + (size_t)most * 1 + (size_t)most * sizeof(int);   /* a set's label bytes while read; an epoch's order */
    return 0;
}

int data_size(const char *dir, DataSize *size)
{
    memset(size, 0, sizeof *size);
    if (dir && *dir && images_found(dir)) {   /* decoded at the net's shape (else guessed at 3x224x224: an upper bound) */
        if (images_count(dir, &size->examples)) return -1;
        long per = image_hint[0] ? (long)image_hint[0] * image_hint[1] * image_hint[2] : 3L * 224 * 224;
        size->bytes = (size_t)size->examples * ((size_t)per + sizeof(int)) * 2;   /* the decoded sets and the loader's copy */
        snprintf(size->format, sizeof size->format, "images");
        return 0;
    }
    char err[2048];
    DataFiles *f = files_new(err, sizeof err);
    if (!f) return -1;
    int rc = locate(dir && *dir ? dir : ".", f, err, sizeof err) ? -1 : 0;
    if (!rc && f->format == FMT_SAFETENSORS) rc = st_data_size(f, &size->bytes, &size->examples);
    else if (!rc && f->format == FMT_IDX) rc = idx_size(f, &size->bytes, &size->examples);
    else if (!rc) rc = cifar_size(f, f->format == FMT_CIFAR100, &size->bytes, &size->examples);
    if (!rc) snprintf(size->format, sizeof size->format, "%s", format_name(f->format));
    free(f);
    return rc;
}

int data_describe(const char *dir, DataInfo *info, char *err, size_t err_size)
{
    *info = (DataInfo){ .format = "Fashion-MNIST", .channels = 1, .rows = 28, .cols = 28, .classes = DATA_CLASSES };
    DataFiles *f = files_new(err, err_size);
    if (!f)
        return -1;
    if (!dir || !*dir)
        dir = ".";
    if (data_is_file(dir) && safetensors_name(dir)) {   /* mgc predict's one file */
        free(f);
        snprintf(info->format, sizeof info->format, "safetensors");
        info->classes = 0;
        return st_data_describe(dir, info, err, err_size);
    }
    if (images_found(dir)) {
        free(f);
        return images_describe(dir, image_hint[0] ? image_hint : NULL, info, err, err_size);
    }
    int rc = locate(dir, f, err, err_size);
    if (!rc) {
        snprintf(info->format, sizeof info->format, "%s", format_name(f->format));
        info->classes = 0;
        if (f->format == FMT_SAFETENSORS) {
            rc = st_data_describe(f->path[0], info, err, err_size);
        } else if (f->format == FMT_IDX) {
            rc = idx_describe(f->path[F_TRAIN_IMAGES], info, err, err_size);
        } else {
            info->channels = 3, info->rows = info->cols = 32;
            info->classes = f->format == FMT_CIFAR10 ? 10 : 100;
        }
    }
    free(f);
    return rc;
}

/* ---------------------------------------------------------------- probing */

/* The IDX files' headers and gzip's CRC-32 of their contents (or their size). */
static void idx_probe(const char *dir, char *out, size_t size)
{
    int p = 0;
    for (int k = 0; k < F_COUNT && p < (int)size; k++) {
        char path[DATA_PATH];
        unsigned char header[16] = { 0 };
        int found = find_file(dir, k, path, sizeof path);
        gzFile f = found > 0 ? gzopen(path, "rb") : NULL;
        int got = f ? gzread(f, header, k == F_TRAIN_IMAGES || k == F_TEST_IMAGES ? 16 : 8) : -1;
        if (f) gzclose(f);
        const char *name = file_names[k];
        if (got < 8) {
            p += snprintf(out + p, size - (size_t)p, "%s%s unreadable", p ? ", " : "", name);
            continue;
        }
        int short_name = (int)strcspn(name, "-") + 7;   /* "train-images", "t10k-labels" */
        p += snprintf(out + p, size - (size_t)p, "%s%.*s %u", p ? ", " : "", short_name, name, be32(header + 4));
        if (got >= 16 && p < (int)size) p += snprintf(out + p, size - (size_t)p, "x%ux%u", be32(header + 8), be32(header + 12));
        /* gzip's trailer: the CRC-32 and length of what it holds, a digest of the contents for free */
        struct stat st;
        FILE *raw = fopen(path, "rb");
        unsigned char magic[2] = { 0 }, tail[8];
        bool gz = raw && fread(magic, 1, 2, raw) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
        if (gz && !fseek(raw, -8, SEEK_END) && fread(tail, 1, 8, raw) == 8 && p < (int)size)
            p += snprintf(out + p, size - (size_t)p, " crc %02x%02x%02x%02x", tail[3], tail[2], tail[1], tail[0]);
        else if (!gz && !stat(path, &st) && p < (int)size)
            p += snprintf(out + p, size - (size_t)p, " (%lld bytes)", (long long)st.st_size);
        if (raw) fclose(raw);
    }
}

/* A CRC-32 of the first and the last 64 KiB of a file (the whole of a small
   one) and its size: a digest of its contents without reading them all.
   0, or -1 when it cannot be read. */
static int file_digest(const char *path, long long *bytes, unsigned long *crc)
{
    enum { PIECE = 65536 };
    FILE *fp = fopen(path, "rb");
    struct stat st;
    if (!fp) return -1;
    unsigned char *buf = malloc(PIECE);
    int rc = buf && !fstat(fileno(fp), &st) ? 0 : -1;
    *bytes = rc ? 0 : (long long)st.st_size;
    *crc = crc32(0L, Z_NULL, 0);
    long long tail = *bytes > 2 * PIECE ? *bytes - PIECE : PIECE;   /* where the second piece starts */
    size_t n = rc ? 0 : fread(buf, 1, PIECE, fp);
    if (!rc && n != (size_t)(*bytes < PIECE ? *bytes : PIECE)) rc = -1;
    if (!rc) *crc = crc32(*crc, buf, (uInt)n);
    if (!rc && *bytes > PIECE && !fseeko(fp, (off_t)tail, SEEK_SET)) {
        n = fread(buf, 1, PIECE, fp);
        if (n != (size_t)(*bytes - tail)) rc = -1;
        *crc = crc32(*crc, buf, (uInt)n);
    }
    free(buf);
    fclose(fp);
    return rc;
}

void data_probe(const char *dir, char *out, size_t size)
{
    long long n;
    if (dir && *dir && images_found(dir)) {   /* the file count; data_load's digests cover every name, size and time */
        if (images_count(dir, &n)) snprintf(out, size, "images: unreadable");
        else snprintf(out, size, "images: %lld files", n);
        return;
    }
    DataFiles *f = malloc(sizeof *f);
    char err[2048];
    out[0] = 0;
    if (!f || locate(dir && *dir ? dir : ".", f, err, sizeof err) != 0 || f->format == FMT_IDX) {
        idx_probe(dir, out, size);   /* also where nothing is found: what is missing, said */
        free(f);
        return;
    }
    int p = snprintf(out, size, "%s:", format_name(f->format));
    for (int i = 0; i < f->nfiles && p < (int)size; i++) {
        long long bytes;
        unsigned long crc;
        const char *name = formats[f->format].files[i];
        if (file_digest(f->path[i], &bytes, &crc) < 0)
            p += snprintf(out + p, size - (size_t)p, "%s %s unreadable", i ? "," : "", name);
        else
            p += snprintf(out + p, size - (size_t)p, "%s %s %lld bytes crc %08lx", i ? "," : "", name, bytes, crc);
    }
    free(f);
}

/* ---------------------------------------------------------------- using the data */

void data_free(Dataset *d)
{
    if (!d)
        return;
    free(d->pixels);
    free(d->values);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

void data_limit(Dataset *d, int n)
{
    if (n >= 0 && n < d->n)
        d->n = n;
}

int data_split(Dataset *d, Dataset *val, double frac, unsigned long long seed)
{
    *val = (Dataset){ 0, d->channels, d->rows, d->cols, d->classes, NULL, NULL, NULL };
    int k = (int)(frac * d->n + 0.5);
    if (k <= 0) return 0;
    size_t per = (size_t)d->channels * d->rows * d->cols, esz = d->pixels ? 1 : sizeof(float);
    int *order = malloc(sizeof(int) * (size_t)d->n);
    char *held = calloc((size_t)d->n, 1);
    val->labels = malloc(sizeof(int) * (size_t)k);
    void *vdata = malloc(per * esz * (size_t)k);
    if (!order || !held || !val->labels || !vdata) {
        free(order), free(held), free(val->labels), free(vdata);
        val->labels = NULL;
        return -1;
    }
    /* a draw of its own: not any epoch's shuffle ("VALID") */
    Rng r;
    rng_seed2(&r, seed, 0x56414c4944ULL);
    for (int i = 0; i < d->n; i++) order[i] = i;
    for (int i = 0; i < k; i++) {   /* the first k of a Fisher-Yates shuffle */
        int j = i + rng_below(&r, d->n - i), t = order[i];
        order[i] = order[j], order[j] = t;
        held[order[i]] = 1;
    }
    unsigned char *src = d->pixels ? d->pixels : (unsigned char *)d->values, *dst = vdata;
    int kept = 0, taken = 0;
    for (int i = 0; i < d->n; i++) {   /* in d's order: the held-out ones to val, the rest packed down */
        unsigned char *from = src + (size_t)i * per * esz;
        if (held[i]) {
            memcpy(dst + (size_t)taken * per * esz, from, per * esz);
            val->labels[taken++] = d->labels[i];
        } else {
            if (kept != i) memmove(src + (size_t)kept * per * esz, from, per * esz);
            d->labels[kept++] = d->labels[i];
        }
    }
    if (d->pixels) val->pixels = vdata;
    else val->values = vdata;
    val->n = k;
    d->n = kept;
    free(order), free(held);
    return 0;
}

const char *data_default_dir(char *buf, size_t size)
{
    const char *env = getenv("MGC_DATA");
    const char *home = getenv("HOME");
    if (env && *env)
        snprintf(buf, size, "%s", env);
    else if (home && *home)
        snprintf(buf, size, "%s/.cache/mgc/fashion-mnist", home);
    else
        snprintf(buf, size, "./fashion-mnist");
    return buf;
}

void data_epoch_order(int n, unsigned long long seed, int epoch, int *order)
{
    Rng r;
    rng_seed2(&r, seed, 0x5348554646ULL + (uint64_t)(int64_t)epoch);   /* "SHUFF" + epoch */
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = rng_below(&r, i + 1);
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* byte / 255.0f, exactly, by table */
static float pixel_value[256];
static pthread_once_t pixel_once = PTHREAD_ONCE_INIT;
static void pixel_table(void)
{
    for (int v = 0; v < 256; v++) pixel_value[v] = (float)v / 255.0f;
}

void data_gather(const Dataset *d, const int *order, int b, float *x, float *y)
{
    pthread_once(&pixel_once, pixel_table);
    size_t per = (size_t)d->channels * d->rows * d->cols;
    for (int i = 0; i < b; i++) {
        int k = order[i];
        float *dst = x + (size_t)i * per;
        if (d->values) {
            memcpy(dst, d->values + (size_t)k * per, sizeof(float) * per);
        } else {
            const unsigned char *src = d->pixels + (size_t)k * per;
            for (size_t j = 0; j < per; j++) dst[j] = pixel_value[src[j]];
        }
        y[i] = (float)d->labels[k];
    }
}
