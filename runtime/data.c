/*
** Fashion-MNIST loader: IDX files through zlib (gzip or plain), validated
** before anything is returned; deterministic epoch shuffles; batch gather.
**
** IDX (all integers big-endian):
**   images: u32 magic 0x00000803, u32 count, u32 rows, u32 cols, count*rows*cols u8
**   labels: u32 magic 0x00000801, u32 count, count u8
** Each file is read whole (one allocation of the exact size the header
** announces, filled by large gzread calls), then checked and converted.
*/
#include "data.h"
#include "errbuf.h"
#include "rng.h"

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
#define MNIST_SIDE 28
#define MAX_EXAMPLES 100000000u   /* header sanity bound, far above any real file */

enum { F_TRAIN_IMAGES, F_TRAIN_LABELS, F_TEST_IMAGES, F_TEST_LABELS, F_COUNT };
static const char *const file_names[F_COUNT] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
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

/* Reads up to len bytes; returns bytes read, or -1 with err set on a zlib error. */
static long long read_exact(gzFile f, const char *path, unsigned char *buf, size_t len,
                            char *err, size_t err_size)
{
    size_t got = 0;
    while (got < len) {
        size_t chunk = len - got;
        if (chunk > (1u << 30))
            chunk = 1u << 30;
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
        got += (size_t)n;
    }
    return (long long)got;
}

/* Reads one IDX file. kind_magic selects images or labels. On success *data
   (malloc'd) holds count*item bytes, *count, *rows, *cols are set. */
static int read_idx(const char *path, uint32_t kind_magic, unsigned char **data,
                    uint32_t *count, uint32_t *rows, uint32_t *cols,
                    char *err, size_t err_size)
{
    int is_images = kind_magic == IDX_IMAGES_MAGIC;
    size_t header_len = is_images ? 16 : 8;
    unsigned char header[16];
    *data = NULL;

    gzFile f = gzopen(path, "rb");
    if (!f) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    gzbuffer(f, 1u << 18);

    long long got = read_exact(f, path, header, header_len, err, err_size);
    if (got < 0)
        goto fail;
    if ((size_t)got < header_len) {
        set_err(err, err_size, "%s: file too short for an IDX %s header: %lld of %zu bytes%s",
                path, is_images ? "image" : "label", got, header_len,
                gzdirect(f) ? "" : " (after gunzip)");
        goto fail;
    }
    uint32_t magic = be32(header);
    if (magic != kind_magic) {
        set_err(err, err_size,
                "%s: bad magic 0x%08x, expected 0x%08x (IDX %s file)%s", path, magic, kind_magic,
                is_images ? "image" : "label",
                magic == (is_images ? IDX_LABELS_MAGIC : IDX_IMAGES_MAGIC)
                    ? ": images and labels swapped?" :
                (header[0] == 0x1f && header[1] == 0x8b) ? ": gzip inside gzip?" : "");
        goto fail;
    }
    *count = be32(header + 4);
    *rows = is_images ? be32(header + 8) : 1;
    *cols = is_images ? be32(header + 12) : 1;
    if (is_images && (*rows != MNIST_SIDE || *cols != MNIST_SIDE)) {
        set_err(err, err_size, "%s: wrong dimensions %ux%u, expected %dx%d", path,
                *rows, *cols, MNIST_SIDE, MNIST_SIDE);
        goto fail;
    }
    if (*count == 0 || *count > MAX_EXAMPLES) {
        set_err(err, err_size, "%s: implausible %s count %u in header", path,
                is_images ? "image" : "label", *count);
        goto fail;
    }
    size_t item = (size_t)*rows * *cols;
    size_t want = (size_t)*count * item;
    *data = malloc(want + 1);   /* +1: probe for trailing bytes */
    if (!*data) {
        set_err(err, err_size, "%s: out of memory for %zu bytes", path, want);
        goto fail;
    }
    got = read_exact(f, path, *data, want + 1, err, err_size);
    if (got < 0)
        goto fail;
    if ((size_t)got != want) {
        /* Count what really is there for the message. */
        unsigned long long total = (unsigned long long)got;
        if ((size_t)got > want) {
            unsigned char tmp[65536];
            int n;
            while ((n = gzread(f, tmp, sizeof tmp)) > 0)
                total += (unsigned)n;
        }
        set_err(err, err_size,
                "%s: size does not match header: %u %s%s need %zu bytes after the %zu-byte "
                "header (expected %zu bytes%s), got %llu (%s)",
                path, *count, is_images ? "images" : "labels",
                is_images ? " of 28x28" : "", want, header_len, want + header_len,
                gzdirect(f) ? "" : " uncompressed", total + header_len,
                total < want ? "file truncated" : "trailing data");
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

static int load_pair(const char *img_path, const char *lab_path, Dataset *d,
                     char *err, size_t err_size)
{
    unsigned char *pix = NULL, *lab = NULL;
    uint32_t ni, nl, rows, cols, r1, c1;
    if (read_idx(img_path, IDX_IMAGES_MAGIC, &pix, &ni, &rows, &cols, err, err_size) < 0)
        return -1;
    if (read_idx(lab_path, IDX_LABELS_MAGIC, &lab, &nl, &r1, &c1, err, err_size) < 0) {
        free(pix);
        return -1;
    }
    if (ni != nl) {
        set_err(err, err_size, "image count != label count: %s has %u images, %s has %u labels",
                img_path, ni, lab_path, nl);
        goto fail;
    }
    for (uint32_t i = 0; i < nl; i++)
        if (lab[i] >= DATA_CLASSES) {
            set_err(err, err_size, "%s: label %u of example %u out of range 0..%d", lab_path,
                    lab[i], i, DATA_CLASSES - 1);
            goto fail;
        }
    d->n = (int)ni;
    d->channels = 1;
    d->rows = (int)rows;
    d->cols = (int)cols;
    d->pixels = pix;
    d->labels = lab;
    return 0;
fail:
    free(pix);
    free(lab);
    return -1;
}

int data_load_fashion_mnist(const char *dir, Dataset *train, Dataset *test,
                            char *err, size_t err_size)
{
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!dir || !*dir)
        dir = ".";
    char paths[F_COUNT][4096];
    int missing = 0;
    char missing_list[512] = "";
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
        set_err(err, err_size,
                "--data '%s' is a file, not a directory: point --data (or MGC_DATA) at the directory "
                "that holds the four Fashion-MNIST IDX files", dir);
        return -1;
    }
    for (int i = 0; i < F_COUNT; i++) {
        int found = find_file(dir, i, paths[i], sizeof paths[i]);
        if (found < 0) {
            set_err(err, err_size,
                    "Fashion-MNIST file '%s' is not a regular file (a directory?): replace it with the "
                    "IDX file %s.gz from %s (data/fashion/)", paths[i], file_names[i], DATA_URL);
            return -1;
        }
        if (!found) {
            missing++;
            size_t len = strlen(missing_list);
            snprintf(missing_list + len, sizeof missing_list - len, "%s%s[.gz]",
                     len ? ", " : "", file_names[i]);
        }
    }
    if (missing) {
        int dir_exists = stat(dir, &st) == 0;
        set_err(err, err_size,
                "Fashion-MNIST not found in '%s'%s: missing %s. "
                "mgc needs the four IDX files train-images-idx3-ubyte.gz, "
                "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz "
                "(gzip or uncompressed), published at %s (data/fashion/). "
                "Put them in that directory, or point mgc at them with --data DIR or MGC_DATA=DIR.",
                dir, dir_exists ? "" : " (no such directory)", missing_list, DATA_URL);
        return -1;
    }
    if (load_pair(paths[F_TRAIN_IMAGES], paths[F_TRAIN_LABELS], train, err, err_size) < 0)
        return -1;
    if (load_pair(paths[F_TEST_IMAGES], paths[F_TEST_LABELS], test, err, err_size) < 0) {
        data_free(train);
        return -1;
    }
    return 0;
}

void data_probe(const char *dir, char *out, size_t size)
{
    int p = 0;
    for (int k = 0; k < F_COUNT && p < (int)size; k++) {
        char path[4200];
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

void data_free(Dataset *d)
{
    if (!d)
        return;
    free(d->pixels);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

void data_limit(Dataset *d, int n)
{
    if (n >= 0 && n < d->n)
        d->n = n;
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
        const unsigned char *src = d->pixels + (size_t)k * per;
        float *dst = x + (size_t)i * per;
        for (size_t j = 0; j < per; j++) dst[j] = pixel_value[src[j]];
        y[i] = (float)d->labels[k];
    }
}
