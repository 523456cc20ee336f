/*
** Unit tests for data/data (IDX, CIFAR, safetensors data sets),
** data/transform, data/safetensors, runtime/rng and runtime/memlimit
** (a cgroup tree of its own).
**
** Build and run from the repository root (make build/unit_runtime):
**   mkdir -p build && cc -std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes \
**     -Wno-missing-prototypes -Wno-unused-function -D_GNU_SOURCE -O2 -g -Iir -Icodegen -Iruntime -Idata \
**     tests/unit_runtime.c data/data.c data/data_cifar.c data/data_st.c data/digest.c data/transform.c \
**     data/safetensors.c data/json.c data/paths.c runtime/rng.c runtime/ptx.c runtime/memlimit.c \
**     runtime/store.c ir/graph.c ir/arena.c -lz -lm -lpthread -ldl -o build/unit_runtime
**   MGC_DATA=/path/to/fashion-mnist build/unit_runtime
**
** Without MGC_DATA the checks on the real Fashion-MNIST files are skipped
** (with a message); everything else runs on files crafted in a temp dir.
** The Python cross-check of safetensors runs with $MGC_PYTHON (default
** /usr/bin/python3) when it can import torch, through tests/st.py and, if
** installed, the `safetensors` package; otherwise it is skipped.
** Prints "N passed, M failed"; exit status 1 if anything failed.
*/
#include "data.h"
#include "transform.h"
#include "ptx.h"
#include "rng.h"
#include "runtime.h"
#include "safetensors.h"
#include "memlimit.h"

#include <dirent.h>
#include <float.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static int passed, failed;

#define CHECK(cond, what) check((cond) != 0, __LINE__, #cond, what)
static void check(int ok, int line, const char *cond, const char *what)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL line %d: %s (%s)\n", line, what, cond);
}

/* Expects -1 with msg containing every substring given (NULL-terminated list). */
static void expect_err(int rc, const char *err, int line, const char *what, ...)
{
    va_list ap;
    int ok = rc == -1;
    va_start(ap, what);
    const char *s;
    while ((s = va_arg(ap, const char *)) != NULL)
        if (!strstr(err, s)) {
            ok = 0;
            printf("  missing \"%s\"\n", s);
        }
    va_end(ap);
    check(ok, line, "rc == -1 && message matches", what);
    if (!ok)
        printf("  rc=%d message: %s\n", rc, err);
}
#define EXPECT_ERR(rc, err, what, ...) expect_err(rc, err, __LINE__, what, __VA_ARGS__, (const char *)NULL)

static char tmpdir[256];

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        remove_tree(sub);
    }
    closedir(d);
    rmdir(path);
}

static int write_bytes(const char *path, const void *data, size_t n, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (!f)
            return -1;
        int ok = n == 0 || gzwrite(f, data, (unsigned)n) == (int)n;
        return gzclose(f) == Z_OK && ok ? 0 : -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static unsigned char *read_whole(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static void put_be32(unsigned char *p, unsigned v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* ---- rng ----------------------------------------------------------------- */

static void test_rng(void)
{
    Rng a, b;
    rng_seed(&a, 12345);
    /* Pinned against an independent Python implementation of splitmix64 +
       xoshiro256**: a change here changes every --seed run. */
    CHECK(rng_next(&a) == 0xbe6a36374160d49bULL, "xoshiro256** known answer 1");
    CHECK(rng_next(&a) == 0x214aaa0637a688c6ULL, "xoshiro256** known answer 2");
    CHECK(rng_next(&a) == 0xf69d16de9954d388ULL, "xoshiro256** known answer 3");
    CHECK(rng_hash(7, 0) == 0xb8b4c297u && rng_hash(7, 1) == 0xa65305fdu &&
          rng_hash(7, 2) == 0x8ca3cbb6u, "rng_hash known answers");
    CHECK(rng_hash(7, 5) != rng_hash(8, 5), "rng_hash depends on the seed");
    CHECK(strstr(RNG_HASH_SOURCE, "unsigned int rng_hash(unsigned long long seed") != NULL &&
          strstr(RNG_HASH_SOURCE, "0x94D049BB133111EBULL") != NULL, "RNG_HASH_SOURCE text");

    rng_seed(&a, 99);
    rng_seed(&b, 99);
    int same = 1;
    for (int i = 0; i < 100; i++)
        same &= rng_next(&a) == rng_next(&b);
    CHECK(same, "same seed, same stream");
    rng_seed(&b, 100);
    CHECK(rng_next(&a) != rng_next(&b), "different seeds differ");
    rng_seed2(&a, 99, 1);
    rng_seed2(&b, 99, 2);
    CHECK(rng_next(&a) != rng_next(&b), "different streams differ");

    double sum = 0, sq = 0;
    int in_range = 1;
    rng_seed(&a, 1);
    for (int i = 0; i < 100000; i++) {
        float u = rng_uniform(&a, -2.0f, 3.0f);
        in_range &= u >= -2.0f && u < 3.0f;
        sum += u;
    }
    CHECK(in_range, "uniform in [lo,hi)");
    CHECK(fabs(sum / 100000 - 0.5) < 0.03, "uniform mean");

    int hist[7] = {0}, below_ok = 1;
    for (int i = 0; i < 70000; i++) {
        int k = rng_below(&a, 7);
        below_ok &= k >= 0 && k < 7;
        if (k >= 0 && k < 7)
            hist[k]++;
    }
    int flat = 1;
    for (int k = 0; k < 7; k++)
        flat &= abs(hist[k] - 10000) < 500;
    CHECK(below_ok && flat, "rng_below(7) in range and flat");
    CHECK(rng_below(&a, 1) == 0, "rng_below(1) == 0");
    int big_ok = 1;
    for (int i = 0; i < 1000; i++) {
        int k = rng_below(&a, 2147483647);
        big_ok &= k >= 0;
    }
    CHECK(big_ok, "rng_below(INT_MAX) in range");

    sum = sq = 0;
    for (int i = 0; i < 100000; i++) {
        float z = rng_normal(&a, 1.0f, 2.0f);
        sum += z;
        sq += (double)z * z;
    }
    double mean = sum / 100000, var = sq / 100000 - mean * mean;
    CHECK(fabs(mean - 1.0) < 0.03 && fabs(sqrt(var) - 2.0) < 0.03, "normal mean/std");

    /* Hash-based dropout mask: keep fraction close to 1 - p. */
    int kept = 0;
    for (unsigned i = 0; i < 100000; i++)
        kept += (rng_hash(42, i) >> 8) * (1.0f / 16777216.0f) >= 0.25f;
    CHECK(abs(kept - 75000) < 800, "rng_hash keep rate");
}

/* ---- shuffling and batching -------------------------------------------------------- */

static int is_permutation(const int *order, int n)
{
    char *seen = calloc((size_t)n + 1, 1);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        if (order[i] < 0 || order[i] >= n || seen[order[i]])
            ok = 0;
        else
            seen[order[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_shuffle(void)
{
    enum { N = 1000 };
    static int o0[N], o1[N], o0b[N], s2[N];
    data_epoch_order(N, 7, 0, o0);
    data_epoch_order(N, 7, 1, o1);
    data_epoch_order(N, 7, 0, o0b);
    data_epoch_order(N, 8, 0, s2);
    CHECK(is_permutation(o0, N) && is_permutation(o1, N), "epoch order is a permutation");
    CHECK(memcmp(o0, o0b, sizeof o0) == 0, "same seed+epoch, same order");
    CHECK(memcmp(o0, o1, sizeof o0) != 0, "epochs differ");
    CHECK(memcmp(o0, s2, sizeof o0) != 0, "seeds differ");
    int fixed = 0;
    for (int i = 0; i < N; i++)
        fixed += o0[i] == i;
    CHECK(fixed < 10, "shuffle moves nearly everything");
    int one[1] = {5};
    data_epoch_order(1, 7, 0, one);
    CHECK(one[0] == 0, "n = 1");
    data_epoch_order(0, 7, 0, one);   /* must not touch anything */

    /* Uniformity: where element 0 lands over many epochs, n = 10. */
    int pos[10] = {0}, o[10];
    for (int e = 0; e < 20000; e++) {
        data_epoch_order(10, 3, e, o);
        for (int i = 0; i < 10; i++)
            if (o[i] == 0)
                pos[i]++;
    }
    int flat = 1;
    for (int i = 0; i < 10; i++)
        flat &= abs(pos[i] - 2000) < 200;
    CHECK(flat, "element 0 lands uniformly");
}

/* ---- Fashion-MNIST on crafted files --------------------------------------- */

enum { SYN_TRAIN = 100, SYN_TEST = 20, PIX = 28 * 28 };
static const char *const names[4] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
};

/* The four files of a small valid dataset, in memory. */
static unsigned char *syn[4];
static size_t syn_len[4];

static void make_synthetic(void)
{
    int counts[2] = {SYN_TRAIN, SYN_TEST};
    Rng r;
    rng_seed(&r, 5);
    for (int s = 0; s < 2; s++) {
        int n = counts[s];
        syn_len[2 * s] = 16 + (size_t)n * PIX;
        unsigned char *im = syn[2 * s] = malloc(syn_len[2 * s]);
        put_be32(im, 0x803);
        put_be32(im + 4, (unsigned)n);
        put_be32(im + 8, 28);
        put_be32(im + 12, 28);
        for (size_t i = 0; i < (size_t)n * PIX; i++)
            im[16 + i] = (unsigned char)rng_below(&r, 256);
        syn_len[2 * s + 1] = 8 + (size_t)n;
        unsigned char *lb = syn[2 * s + 1] = malloc(syn_len[2 * s + 1]);
        put_be32(lb, 0x801);
        put_be32(lb + 4, (unsigned)n);
        for (int i = 0; i < n; i++)
            lb[8 + i] = (unsigned char)(i % 10);
    }
}

/* A fresh dir named `sub` with the four files (gz selects gzip). */
static void make_dir(char *dir, size_t size, const char *sub, int gz)
{
    snprintf(dir, size, "%s/%s", tmpdir, sub);
    mkdir(dir, 0755);
    for (int i = 0; i < 4; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s%s", dir, names[i], gz ? ".gz" : "");
        write_bytes(path, syn[i], syn_len[i], gz);
    }
}

/* Writes a modified copy of synthetic file `which` into dir (plain or gz). */
static void put_variant(const char *dir, int which, const unsigned char *data, size_t n, int gz)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gz", dir, names[which]);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", dir, names[which]);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s%s", dir, names[which], gz ? ".gz" : "");
    write_bytes(path, data, n, gz);
}

static int synthetic_ok(const Dataset *tr, const Dataset *te)
{
    if (tr->n != SYN_TRAIN || te->n != SYN_TEST || tr->rows != 28 || tr->cols != 28)
        return 0;
    const Dataset *ds[2] = {tr, te};
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < ds[s]->n; i++) {
            if (ds[s]->labels[i] != syn[2 * s + 1][8 + i])
                return 0;
            for (int p = 0; p < PIX; p++)
                if (ds[s]->pixels[(size_t)i * PIX + p] != syn[2 * s][16 + (size_t)i * PIX + p])
                    return 0;
        }
    return 1;
}

static void test_data_crafted(void)
{
    char dir[512], err[2048], path[600];
    Dataset tr, te;
    make_synthetic();

    make_dir(dir, sizeof dir, "gz", 1);
    int rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    CHECK(rc == 0, "synthetic gz loads");
    if (rc)
        printf("  %s\n", err);
    CHECK(rc == 0 && synthetic_ok(&tr, &te), "synthetic gz contents exact (byte/255)");

    /* gather and limit on it */
    if (rc == 0) {
        int order[3] = {5, 0, 99};
        float x[3 * PIX], y[3];
        data_gather(&tr, order, 3, x, y);
        int same = 1;   /* floats byte / 255.0f, as PyTorch's ToTensor makes them */
        for (int p = 0; p < PIX; p++)
            same &= x[PIX + p] == tr.pixels[p] / 255.0f && x[2 * PIX + p] == tr.pixels[99 * PIX + p] / 255.0f &&
                    x[p] == tr.pixels[5 * PIX + p] / 255.0f;
        CHECK(y[0] == 5 && y[1] == 0 && y[2] == 9 && same, "data_gather");
        data_limit(&tr, 10);
        CHECK(tr.n == 10, "data_limit(10)");
        data_limit(&tr, 50);
        CHECK(tr.n == 10, "data_limit does not grow");
    }
    data_free(&tr);
    data_free(&te);
    data_free(&tr);   /* twice is fine */

    make_dir(dir, sizeof dir, "plain", 0);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    CHECK(rc == 0 && synthetic_ok(&tr, &te), "plain uncompressed copy loads");
    if (rc)
        printf("  %s\n", err);
    data_free(&tr);
    data_free(&te);

    /* plain bytes under the .gz name: detected by magic */
    snprintf(dir, sizeof dir, "%s/plain_as_gz", tmpdir);
    mkdir(dir, 0755);
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s.gz", dir, names[i]);
        write_bytes(path, syn[i], syn_len[i], 0);
    }
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    CHECK(rc == 0 && synthetic_ok(&tr, &te), "plain bytes named .gz load");
    data_free(&tr);
    data_free(&te);

    /* missing file */
    make_dir(dir, sizeof dir, "missing", 1);
    snprintf(path, sizeof path, "%s/%s.gz", dir, names[3]);
    unlink(path);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "missing file", "missing t10k-labels-idx1-ubyte", "train-images-idx3-ubyte",
               "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", dir, "--data", "MGC_DATA",
               "https://github.com/zalandoresearch/fashion-mnist");
    CHECK(tr.pixels == NULL && te.pixels == NULL && tr.n == 0, "datasets empty after an error");
    rc = data_load("/nonexistent/mgc-data", &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "missing dir", "/nonexistent/mgc-data", "no such directory", "--data",
               "t10k-labels-idx1-ubyte", "train.safetensors", "CIFAR-10", "cifar-10-batches-bin", "CIFAR-100",
               "cifar-100-binary");

    /* truncated gzip */
    make_dir(dir, sizeof dir, "truncgz", 1);
    snprintf(path, sizeof path, "%s/%s.gz", dir, names[0]);
    size_t n;
    unsigned char *whole = read_whole(path, &n);
    write_bytes(path, whole, n / 2, 0);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "truncated gzip", "train-images-idx3-ubyte.gz", "bad gzip data", "truncated");
    /* truncated inside the 8-byte gzip trailer (all data there, CRC cut) */
    write_bytes(path, whole, n - 3, 0);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "gzip trailer cut", "train-images-idx3-ubyte.gz", "bad gzip data");
    /* corrupt deflate data */
    for (size_t i = n / 3; i < n / 3 + 64; i++)
        whole[i] ^= 0x5a;
    write_bytes(path, whole, n, 0);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "corrupt gzip", "train-images-idx3-ubyte.gz", "bad gzip data", "zlib");
    free(whole);

    unsigned char *v = malloc(syn_len[0] + 100);

    /* bad magic: labels where images belong, and random */
    make_dir(dir, sizeof dir, "magic", 1);
    memcpy(v, syn[0], syn_len[0]);
    put_be32(v, 0x801);
    put_variant(dir, 0, v, syn_len[0], 1);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "bad image magic", "train-images-idx3-ubyte.gz", "bad magic 0x00000801",
               "expected 0x00000803");
    memcpy(v, syn[3], syn_len[3]);
    put_be32(v, 0xdeadbeef);
    put_variant(dir, 0, syn[0], syn_len[0], 1);
    put_variant(dir, 3, v, syn_len[3], 0);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "bad label magic", "t10k-labels-idx1-ubyte", "bad magic 0xdeadbeef",
               "expected 0x00000801");

    /* other dimensions in the header than in the data: the size says so, in the header's terms */
    make_dir(dir, sizeof dir, "dims", 1);
    memcpy(v, syn[2], syn_len[2]);
    put_be32(v + 12, 27);
    put_variant(dir, 2, v, syn_len[2], 1);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "wrong dims", "t10k-images-idx3-ubyte.gz", "20 images of 28x27 need 15120 bytes",
               "trailing data");
    put_be32(v + 12, 0);
    put_variant(dir, 2, v, syn_len[2], 1);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "zero columns", "t10k-images-idx3-ubyte.gz", "implausible image size 28x0");

    /* size vs header: short and long plain file */
    make_dir(dir, sizeof dir, "size", 1);
    put_variant(dir, 0, syn[0], syn_len[0] - 10, 0);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    char want[64], got[64];
    snprintf(want, sizeof want, "expected %zu bytes", syn_len[0]);
    snprintf(got, sizeof got, "got %zu", syn_len[0] - 10);
    EXPECT_ERR(rc, err, "short image file", "train-images-idx3-ubyte", want, got, "truncated");
    memcpy(v, syn[0], syn_len[0]);
    memset(v + syn_len[0], 0, 100);
    put_variant(dir, 0, v, syn_len[0] + 100, 1);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    snprintf(got, sizeof got, "got %zu", syn_len[0] + 100);
    EXPECT_ERR(rc, err, "long image file", "train-images-idx3-ubyte.gz", want, got, "trailing");
    put_variant(dir, 0, v, 10, 0);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "header cut", "train-images-idx3-ubyte", "too short");

    /* image count != label count */
    make_dir(dir, sizeof dir, "count", 1);
    memcpy(v, syn[1], syn_len[1]);
    put_be32(v + 4, SYN_TRAIN - 1);
    put_variant(dir, 1, v, syn_len[1] - 1, 1);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "count mismatch", "image count != label count", "100 images", "99 labels");

    /* any label is a class: one of 10 in the test set makes 11 classes */
    make_dir(dir, sizeof dir, "label", 1);
    memcpy(v, syn[3], syn_len[3]);
    v[8 + 7] = 10;
    put_variant(dir, 3, v, syn_len[3], 1);
    DataInfo info;
    rc = data_load(dir, &tr, &te, &info, err, sizeof err);
    CHECK(rc == 0 && tr.classes == 11 && te.classes == 11 && info.classes == 11 && te.labels[7] == 10,
          "a label 10 in the test set: 11 classes");
    CHECK(rc == 0 && info.nfiles == 4 && !strcmp(info.files[3].file, "t10k-labels-idx1-ubyte.gz") &&
          info.files[3].bytes == (long long)syn_len[3] && info.files[3].crc == crc32(crc32(0L, Z_NULL, 0), v, (uInt)syn_len[3]),
          "a gzip IDX file's digest: the CRC-32 of all it holds, uncompressed");
    data_free(&tr);
    data_free(&te);
    /* a failing test set leaves no training set behind */
    put_variant(dir, 3, v, 12, 1);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "short test labels", "t10k-labels-idx1-ubyte.gz", "file truncated");
    CHECK(tr.pixels == NULL && tr.labels == NULL && tr.n == 0, "train freed when test fails");
    free(v);

    /* default dir */
    setenv("MGC_DATA", "/x/y", 1);
    char buf[256];
    CHECK(strcmp(data_default_dir(buf, sizeof buf), "/x/y") == 0, "default dir from MGC_DATA");
    unsetenv("MGC_DATA");
    const char *home = getenv("HOME");
    char expect[300];
    snprintf(expect, sizeof expect, "%s/.cache/mgc/fashion-mnist", home ? home : "");
    CHECK(!home || strcmp(data_default_dir(buf, sizeof buf), expect) == 0, "default dir from HOME");
    for (int i = 0; i < 4; i++)
        free(syn[i]);
}

/* ---- the other formats, and IDX of other sizes, on crafted files -------------------- */

/* A fresh directory tmpdir/sub, or tmpdir/sub/more, into dir. */
static void fresh_dir(char *dir, size_t size, const char *sub, const char *more)
{
    snprintf(dir, size, "%s/%s", tmpdir, sub);
    remove_tree(dir);
    mkdir(dir, 0755);
    if (more) {
        size_t len = strlen(dir);
        snprintf(dir + len, size - len, "/%s", more);
        mkdir(dir, 0755);
    }
}

static void put_file(const char *dir, const char *name, const void *data, size_t n)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
    write_bytes(path, data, n, 0);
}

/* IDX of 20x24 images and 12 classes: the size from the header, the classes
   from the labels (10 and 11 in the test set only). */
static void test_idx_sizes(void)
{
    enum { H = 20, W = 24, NTR = 30, NTE = 12 };
    char dir[512], err[2048];
    unsigned char *f[4];
    size_t len[4];
    int n[2] = { NTR, NTE };
    Rng r;
    rng_seed(&r, 9);
    for (int s = 0; s < 2; s++) {
        f[2 * s] = malloc(len[2 * s] = 16 + (size_t)n[s] * H * W);
        put_be32(f[2 * s], 0x803), put_be32(f[2 * s] + 4, (unsigned)n[s]), put_be32(f[2 * s] + 8, H), put_be32(f[2 * s] + 12, W);
        for (size_t i = 16; i < len[2 * s]; i++) f[2 * s][i] = (unsigned char)rng_below(&r, 256);
        f[2 * s + 1] = malloc(len[2 * s + 1] = 8 + (size_t)n[s]);
        put_be32(f[2 * s + 1], 0x801), put_be32(f[2 * s + 1] + 4, (unsigned)n[s]);
        for (int i = 0; i < n[s]; i++) f[2 * s + 1][8 + i] = (unsigned char)(i % (s ? 12 : 10));
    }
    fresh_dir(dir, sizeof dir, "idx2024", NULL);
    for (int i = 0; i < 4; i++) put_file(dir, names[i], f[i], len[i]);
    Dataset tr, te;
    DataInfo info;
    int rc = data_describe(dir, &info, err, sizeof err);
    CHECK(rc == 0 && !strcmp(info.format, "IDX") && info.channels == 1 && info.rows == H && info.cols == W &&
          info.classes == 0, "describe IDX 20x24: the size from the header, the classes not yet known");
    rc = data_load(dir, &tr, &te, &info, err, sizeof err);
    CHECK(rc == 0, "IDX 20x24 loads");
    if (rc) printf("  %s\n", err);
    if (!rc) {
        CHECK(tr.n == NTR && te.n == NTE && tr.channels == 1 && tr.rows == H && tr.cols == W && te.rows == H, "IDX 20x24 shape");
        CHECK(tr.classes == 12 && te.classes == 12 && info.classes == 12 && info.rows == H && info.cols == W,
              "12 classes: max label + 1 over training and test");
        CHECK(info.nfiles == 4 && !strcmp(info.files[0].file, names[0]) && info.files[0].bytes == (long long)len[0] &&
              info.files[0].crc == crc32(crc32(0L, Z_NULL, 0), f[0], (uInt)len[0]), "a plain IDX file's digest: its CRC-32");
        CHECK(!memcmp(tr.pixels, f[0] + 16, (size_t)NTR * H * W) && !memcmp(te.pixels, f[2] + 16, (size_t)NTE * H * W) &&
              te.labels[11] == 11 && tr.labels[9] == 9, "IDX 20x24 contents exact");
        int order[2] = { 3, 0 };
        float x[2 * H * W], y[2];
        data_gather(&te, order, 2, x, y);
        CHECK(x[5] == te.pixels[3 * H * W + 5] / 255.0f && x[H * W + 7] == te.pixels[7] / 255.0f && y[0] == 3 && y[1] == 0,
              "gather of 20x24 images");
    }
    data_free(&tr);
    data_free(&te);
    /* the size in a message is the header's */
    put_file(dir, names[0], f[0], len[0] - 5);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "short 20x24 images", "train-images-idx3-ubyte", "30 images of 20x24 need 14400 bytes", "file truncated");
    put_file(dir, names[0], f[0], len[0]);
    /* test images of another size (the same bytes, read 24x20) */
    put_be32(f[2] + 8, W), put_be32(f[2] + 12, H);
    put_file(dir, names[2], f[2], len[2]);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "train and test sizes differ", "train-images-idx3-ubyte holds images of 1x20x24",
               "t10k-images-idx3-ubyte holds 1x24x20", "must have one shape");
    CHECK(tr.pixels == NULL && te.pixels == NULL, "nothing kept after the shape check");
    for (int i = 0; i < 4; i++) free(f[i]);
}

/* n CIFAR records (hundred: CIFAR-100's) with labels from label0 and random pixels. */
static unsigned char *cifar_file(int n, int hundred, Rng *r, int label0, size_t *len)
{
    size_t rec = hundred ? 3074 : 3073;
    unsigned char *b = malloc((*len = rec * (size_t)n) + 1);
    for (int i = 0; i < n; i++) {
        unsigned char *p = b + rec * (size_t)i;
        if (hundred) p[0] = (unsigned char)((label0 + i) % 20), p[1] = (unsigned char)((label0 + 37 * i) % 100);
        else p[0] = (unsigned char)((label0 + i) % 10);
        for (size_t j = hundred ? 2 : 1; j < rec; j++) p[j] = (unsigned char)rng_below(r, 256);
    }
    return b;
}

static const char *const c10_names[6] = {
    "data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin",
};

static void test_cifar10(void)
{
    char dir[512], top[600], err[2048], probe[1024], want[128];
    int counts[6] = { 3, 4, 5, 2, 6, 5 };
    unsigned char *b[6];
    size_t len[6];
    Rng r;
    rng_seed(&r, 10);
    for (int i = 0; i < 6; i++) b[i] = cifar_file(counts[i], 0, &r, i, &len[i]);
    fresh_dir(dir, sizeof dir, "c10", "cifar-10-batches-bin");   /* as the archive unpacks */
    for (int i = 0; i < 6; i++) put_file(dir, c10_names[i], b[i], len[i]);
    snprintf(top, sizeof top, "%s/c10", tmpdir);
    Dataset tr, te;
    DataInfo info;
    int rc = data_describe(top, &info, err, sizeof err);
    CHECK(rc == 0 && !strcmp(info.format, "CIFAR-10") && info.channels == 3 && info.rows == 32 && info.cols == 32 &&
          info.classes == 10, "describe CIFAR-10: 3x32x32, 10 classes");
    DataSize ds;
    CHECK(data_size(top, &ds) == 0 && ds.examples == 25 && ds.bytes == 25 * (3072 + sizeof(int)) + 20 * sizeof(int) &&
          !strcmp(ds.format, "CIFAR-10"), "CIFAR-10's size in memory from its files' sizes: pixels, labels, an epoch's order");
    rc = data_load(top, &tr, &te, &info, err, sizeof err);
    CHECK(rc == 0, "CIFAR-10 in cifar-10-batches-bin/ loads");
    if (rc) printf("  %s\n", err);
    if (!rc) {
        CHECK(tr.n == 20 && te.n == 5 && tr.channels == 3 && tr.rows == 32 && tr.cols == 32 && tr.classes == 10 &&
              te.classes == 10 && !strcmp(info.format, "CIFAR-10"), "CIFAR-10 counts and shape");
        /* example 7 is data_batch_3's first record; the test set's last is test_batch's fifth */
        CHECK(tr.labels[7] == b[2][0] && !memcmp(tr.pixels + 7 * 3072, b[2] + 1, 3072) && te.labels[4] == b[5][4 * 3073] &&
              !memcmp(te.pixels + 4 * 3072, b[5] + 4 * 3073 + 1, 3072), "CIFAR-10 records in file order, exact");
        int order[1] = { 7 };
        static float x[3072];
        float y[1];
        data_gather(&tr, order, 1, x, y);
        CHECK(x[0] == b[2][1] / 255.0f && x[1024] == b[2][1 + 1024] / 255.0f && x[2048 + 33] == b[2][1 + 2048 + 33] / 255.0f &&
              y[0] == b[2][0], "CIFAR-10 gather: red, green, blue planes, byte / 255");
        CHECK(info.nfiles == 6 && !strcmp(info.files[5].file, "test_batch.bin") && info.files[5].bytes == (long long)len[5] &&
              info.files[5].crc == crc32(crc32(0L, Z_NULL, 0), b[5], (uInt)len[5]), "a CIFAR-10 batch's digest: its CRC-32");
    }
    data_free(&tr);
    data_free(&te);
    data_probe(top, probe, sizeof probe);
    snprintf(want, sizeof want, "CIFAR-10: data_batch_1.bin 9219 bytes crc %08lx, data_batch_2.bin 12292 bytes",
             crc32(crc32(0L, Z_NULL, 0), b[0], (uInt)len[0]));
    CHECK(strstr(probe, want) && strstr(probe, "test_batch.bin 15365 bytes crc "), "data_probe of CIFAR-10");
    if (!strstr(probe, want)) printf("  probe: %s\n", probe);

    /* the files right in DIR; then damaged copies */
    fresh_dir(dir, sizeof dir, "c10flat", NULL);
    for (int i = 0; i < 6; i++) put_file(dir, c10_names[i], b[i], len[i]);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    CHECK(rc == 0 && tr.n == 20, "CIFAR-10 right in the data dir loads");
    data_free(&tr);
    data_free(&te);
    put_file(dir, c10_names[2], b[2], len[2] - 100);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-10 truncated", "data_batch_3.bin", "15265 bytes are not a whole number of 3073-byte CIFAR-10 records",
               "4 records and 2973 bytes left over", "truncated");
    put_file(dir, c10_names[2], b[2], len[2]);
    b[1][2 * 3073] = 10;
    put_file(dir, c10_names[1], b[1], len[1]);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-10 label 10", "data_batch_2.bin", "label 10 of record 2 out of range 0..9");
    CHECK(tr.pixels == NULL && tr.labels == NULL && tr.n == 0, "nothing kept after a bad label");
    b[1][2 * 3073] = 9;
    put_file(dir, c10_names[1], b[1], len[1]);
    put_file(dir, c10_names[5], b[5], 0);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-10 empty test batch", "test_batch.bin", "empty file");
    put_file(dir, c10_names[5], b[5], len[5]);
    snprintf(top, sizeof top, "%s/%s", dir, c10_names[3]);
    unlink(top);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-10 missing batch", "CIFAR-10 data in", "is incomplete: missing data_batch_4.bin", "cifar-10-binary.tar.gz");
    mkdir(top, 0755);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-10 batch a directory", "data_batch_4.bin' is a directory, not a regular file");
    rmdir(top);
    mkfifo(top, 0644);   /* never opened: a FIFO would wait for a writer */
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-10 batch a FIFO", "data_batch_4.bin' is a FIFO, not a regular file: replace it with the file data_batch_4.bin");
    rc = data_describe(dir, &info, err, sizeof err);
    CHECK(rc == -1, "describe: -1 where the files cannot be read");
    for (int i = 0; i < 6; i++) free(b[i]);
}

static void test_cifar100(void)
{
    char dir[512], top[600], err[2048];
    size_t len[2];
    Rng r;
    rng_seed(&r, 11);
    unsigned char *b[2] = { cifar_file(7, 1, &r, 0, &len[0]), cifar_file(3, 1, &r, 5, &len[1]) };
    b[0][3 * 3074 + 1] = 99;
    fresh_dir(dir, sizeof dir, "c100", "cifar-100-binary");
    put_file(dir, "train.bin", b[0], len[0]);
    put_file(dir, "test.bin", b[1], len[1]);
    snprintf(top, sizeof top, "%s/c100", tmpdir);
    Dataset tr, te;
    DataInfo info;
    int rc = data_describe(top, &info, err, sizeof err);
    CHECK(rc == 0 && !strcmp(info.format, "CIFAR-100") && info.channels == 3 && info.classes == 100, "describe CIFAR-100");
    rc = data_load(top, &tr, &te, &info, err, sizeof err);
    CHECK(rc == 0, "CIFAR-100 in cifar-100-binary/ loads");
    if (rc) printf("  %s\n", err);
    if (!rc) {
        CHECK(tr.n == 7 && te.n == 3 && tr.channels == 3 && tr.rows == 32 && tr.classes == 100 && info.classes == 100,
              "CIFAR-100 counts, shape, 100 classes");
        CHECK(tr.labels[3] == 99 && tr.labels[1] == b[0][3074 + 1] && te.labels[2] == b[1][2 * 3074 + 1] &&
              !memcmp(tr.pixels + 3 * 3072, b[0] + 3 * 3074 + 2, 3072), "CIFAR-100: the fine label, the pixels exact");
    }
    data_free(&tr);
    data_free(&te);
    fresh_dir(dir, sizeof dir, "c100flat", NULL);
    put_file(dir, "test.bin", b[1], len[1]);
    put_file(dir, "train.bin", b[0], len[0] - 1);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-100 truncated", "train.bin", "21517 bytes are not a whole number of 3074-byte CIFAR-100 records",
               "6 records and 3073 bytes left over", "truncated");
    put_file(dir, "train.bin", b[0], 3 * 3073);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-10 records as CIFAR-100", "train.bin", "2 records and 3071 bytes left over",
               "it has the size of CIFAR-10 records");
    b[0][1 * 3074 + 1] = 100;
    put_file(dir, "train.bin", b[0], len[0]);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-100 fine label 100", "train.bin", "label 100 of record 1 out of range 0..99");
    b[0][1 * 3074 + 1] = 1;
    b[0][0] = 20;
    put_file(dir, "train.bin", b[0], len[0]);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-100 coarse label 20", "train.bin", "coarse label 20 of record 0 out of range 0..19");
    b[0][0] = 0;
    put_file(dir, "train.bin", b[0], len[0]);
    snprintf(top, sizeof top, "%s/test.bin", dir);
    unlink(top);
    rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    EXPECT_ERR(rc, err, "CIFAR-100 missing test.bin", "CIFAR-100 data in", "missing test.bin");
    /* IDX files beside CIFAR-100: CIFAR-100 comes first */
    put_file(dir, "test.bin", b[1], len[1]);
    for (int i = 0; i < 4; i++) put_file(dir, names[i], "x", 1);
    rc = data_load(dir, &tr, &te, &info, err, sizeof err);
    CHECK(rc == 0 && !strcmp(info.format, "CIFAR-100"), "CIFAR-100 found before IDX");
    data_free(&tr);
    data_free(&te);
    free(b[0]);
    free(b[1]);
}

/* train.safetensors or test.safetensors (name) in dir: `images` (left out
   where dtype is NULL) and `labels` [n] (left out where ldtype is NULL). */
static void put_st(const char *dir, const char *name, const char *dtype, int nd, const long long *shape, const void *images,
                   const char *ldtype, long long n, const void *labels)
{
    StWriter *w = st_writer_new();
    if (dtype) st_writer_add(w, "images", dtype, nd, shape, images);
    if (ldtype) st_writer_add(w, "labels", ldtype, 1, (long long[]){ n }, labels);
    char path[700], err[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (st_writer_save(w, path, err, sizeof err)) printf("  put_st: %s\n", err);
    st_writer_free(w);
}

enum { SN = 6, SC = 3, SH = 5, SW = 7, SPER = SC * SH * SW };

/* One load of dir, checked to hold the images u8 (or f32) [SN or 4, c, h, w]. */
static int st_loads(const char *dir, int c, int h, int w, const unsigned char *u8, const float *f32, int classes,
                    const char *what)
{
    Dataset tr, te;
    DataInfo info;
    char err[2048];
    int rc = data_load(dir, &tr, &te, &info, err, sizeof err), ok = rc == 0;
    if (rc) printf("  %s: %s\n", what, err);
    ok = ok && tr.n == SN && te.n == 4 && tr.channels == c && tr.rows == h && tr.cols == w && tr.classes == classes &&
         !strcmp(info.format, "safetensors") && info.floats == (f32 != NULL);
    size_t all = (size_t)SN * c * h * w, per = (size_t)c * h * w;
    if (ok && u8) ok = tr.pixels && !tr.values && !memcmp(tr.pixels, u8, all);
    if (ok && f32) ok = tr.values && !tr.pixels && !memcmp(tr.values, f32, sizeof(float) * all);
    if (ok) {   /* gather: byte / 255, or the values as they are */
        int order[2] = { 5, 1 };
        float *x = malloc(sizeof(float) * 2 * per), y[2];
        data_gather(&tr, order, 2, x, y);
        for (size_t j = 0; j < per; j++)
            ok &= x[j] == (u8 ? u8[5 * per + j] / 255.0f : f32[5 * per + j]) && x[per + j] == (u8 ? u8[per + j] / 255.0f : f32[per + j]);
        ok &= y[0] == (float)tr.labels[5] && y[1] == (float)tr.labels[1];
        free(x);
    }
    data_free(&tr);
    data_free(&te);
    check(ok, __LINE__, what, what);
    return ok;
}

static void test_st_data_good(const unsigned char *nchw, const float *f32)
{
    char dir[512], err[2048];
    unsigned char nhwc[SN * SPER], lab8[SN] = { 0, 1, 2, 3, 4, 0 }, lab8t[4] = { 6, 0, 1, 2 };
    long long lab64[SN] = { 1, 0, 8, 2, 3, 1 }, lab64t[4] = { 0, 1, 2, 3 };
    int lab32[SN] = { 2, 2, 2, 0, 1, 1 }, lab32t[4] = { 0, 1, 1, 0 };
    for (int i = 0; i < SN; i++)
        for (int c = 0; c < SC; c++)
            for (int p = 0; p < SH * SW; p++) nhwc[(i * SH * SW + p) * SC + c] = nchw[(i * SC + c) * SH * SW + p];
    fresh_dir(dir, sizeof dir, "st_nchw", NULL);
    put_st(dir, "train.safetensors", "U8", 4, (long long[]){ SN, SC, SH, SW }, nchw, "U8", SN, lab8);
    put_st(dir, "test.safetensors", "U8", 4, (long long[]){ 4, SC, SH, SW }, nchw, "U8", 4, lab8t);
    DataInfo info;
    int rc = data_describe(dir, &info, err, sizeof err);
    CHECK(rc == 0 && !strcmp(info.format, "safetensors") && info.channels == SC && info.rows == SH && info.cols == SW &&
          info.classes == 0 && !info.floats, "describe safetensors U8 [N, C, H, W]");
    st_loads(dir, SC, SH, SW, nchw, NULL, 7, "safetensors U8 [N, C, H, W], 7 classes (6 in the test set)");
    fresh_dir(dir, sizeof dir, "st_nhwc", NULL);
    put_st(dir, "train.safetensors", "U8", 4, (long long[]){ SN, SH, SW, SC }, nhwc, "U8", SN, lab8);
    put_st(dir, "test.safetensors", "U8", 4, (long long[]){ 4, SH, SW, SC }, nhwc, "U8", 4, lab8t);
    rc = data_describe(dir, &info, err, sizeof err);
    CHECK(rc == 0 && info.channels == SC && info.rows == SH && info.cols == SW, "describe safetensors [N, H, W, C]");
    st_loads(dir, SC, SH, SW, nchw, NULL, 7, "safetensors U8 [N, H, W, C] transposed to channel planes");
    DataSize ds;
    /* kept: the images and an int a label; passing: the training file's labels as stored and its images twice */
    CHECK(data_size(dir, &ds) == 0 && ds.examples == SN + 4 &&
          ds.bytes == (SN + 4) * (SPER + sizeof(int)) + (SN + SN * SPER) + SN * sizeof(int), "safetensors U8 [N, H, W, C]: its size in memory");
    fresh_dir(dir, sizeof dir, "st_f32", NULL);
    put_st(dir, "train.safetensors", "F32", 4, (long long[]){ SN, SC, SH, SW }, f32, "I64", SN, lab64);
    put_st(dir, "test.safetensors", "F32", 4, (long long[]){ 4, SC, SH, SW }, f32, "I64", 4, lab64t);
    rc = data_describe(dir, &info, err, sizeof err);
    CHECK(rc == 0 && info.floats, "describe safetensors F32");
    st_loads(dir, SC, SH, SW, NULL, f32, 9, "safetensors F32, I64 labels: the values as they are");
    CHECK(data_size(dir, &ds) == 0 && ds.bytes == (SN + 4) * (4 * SPER + sizeof(int)) + 8 * SN + SN * sizeof(int) &&
          !strcmp(ds.format, "safetensors"), "safetensors F32, I64 labels: its size in memory (from the headers)");
    fresh_dir(dir, sizeof dir, "st_3d", NULL);
    put_st(dir, "train.safetensors", "U8", 3, (long long[]){ SN, SC * SH, SW }, nchw, "I32", SN, lab32);
    put_st(dir, "test.safetensors", "U8", 3, (long long[]){ 4, SC * SH, SW }, nchw, "I32", 4, lab32t);
    st_loads(dir, 1, SC * SH, SW, nchw, NULL, 3, "safetensors U8 [N, H, W]: one channel, I32 labels");
    /* [N, 3, 5, 3]: the second dimension is a channel count too: read as [N, C, H, W] */
    fresh_dir(dir, sizeof dir, "st_ambiguous", NULL);
    put_st(dir, "train.safetensors", "U8", 4, (long long[]){ SN, 3, 5, 7 * 3 / 3 }, nchw, "U8", SN, lab8);
    put_st(dir, "test.safetensors", "U8", 4, (long long[]){ 4, 3, 5, 7 }, nchw, "U8", 4, lab8t);
    st_loads(dir, 3, 5, 7, nchw, NULL, 7, "safetensors [N, 3, 5, 7] is [N, C, H, W]");
    /* the pair comes before CIFAR-10 and IDX files beside it */
    for (int i = 0; i < 6; i++) put_file(dir, c10_names[i], "x", 1);
    st_loads(dir, 3, 5, 7, nchw, NULL, 7, "safetensors found before CIFAR-10");
}

static void test_st_data_bad(const unsigned char *nchw, const float *f32)
{
    char dir[512], err[2048];
    unsigned char lab8[SN] = { 0, 1, 2, 3, 4, 0 };
    long long lab64[SN] = { 0, 1, 2, 3, 4, 0 };
    float bad[SN * SPER];
    Dataset tr, te;
    long long nchw_shape[4] = { SN, SC, SH, SW };
    fresh_dir(dir, sizeof dir, "st_bad", NULL);
    put_st(dir, "test.safetensors", "U8", 4, (long long[]){ 4, SC, SH, SW }, nchw, "U8", 4, lab8);
    put_st(dir, "train.safetensors", NULL, 0, NULL, NULL, "U8", SN, lab8);
#define LOAD_ERR(what, ...)                                          \
    do {                                                             \
        int rc_ = data_load(dir, &tr, &te, NULL, err, sizeof err);   \
        EXPECT_ERR(rc_, err, what, "train.safetensors", __VA_ARGS__); \
        CHECK(!tr.pixels && !tr.values && !tr.labels, what);         \
    } while (0)
    LOAD_ERR("no images", "no tensor `images`", "this one holds labels");
    put_st(dir, "train.safetensors", "U8", 4, nchw_shape, nchw, NULL, 0, NULL);
    LOAD_ERR("no labels", "no tensor `labels`", "this one holds images");
    put_st(dir, "train.safetensors", "U8", 2, (long long[]){ SN, SPER }, nchw, "U8", SN, lab8);
    LOAD_ERR("images of rank 2", "`images` has 2 dimensions, shape [6, 105]", "[N, C, H, W]");
    put_st(dir, "train.safetensors", "U8", 4, nchw_shape, nchw, "U8", SN - 1, lab8);
    LOAD_ERR("N differs", "`labels` has shape [5], but `images` holds 6 examples");
    put_st(dir, "train.safetensors", "U8", 4, nchw_shape, nchw, "U8", 0, lab8);
    LOAD_ERR("labels empty", "`labels` has shape [0]");
    put_st(dir, "train.safetensors", "F16", 4, (long long[]){ SN, SC, SH, 3 }, nchw, "U8", SN, lab8);
    LOAD_ERR("F16 images", "`images` is F16", "U8", "F32");
    put_st(dir, "train.safetensors", "U8", 4, nchw_shape, nchw, "F32", SN, f32);
    LOAD_ERR("F32 labels", "`labels` is F32", "U8, I32 or I64");
    lab64[2] = -1;
    put_st(dir, "train.safetensors", "U8", 4, nchw_shape, nchw, "I64", SN, lab64);
    LOAD_ERR("negative label", "label -1 of example 2 is negative");
    lab64[2] = 1LL << 40;
    put_st(dir, "train.safetensors", "U8", 4, nchw_shape, nchw, "I64", SN, lab64);
    LOAD_ERR("huge label", "label 1099511627776 of example 2 is too large", "65536");
    memcpy(bad, f32, sizeof bad);
    bad[4 * SPER + 1 * SH * SW + 2 * SW + 3] = NAN;
    put_st(dir, "train.safetensors", "F32", 4, nchw_shape, bad, "U8", SN, lab8);
    LOAD_ERR("NaN pixel", "`images` holds NaN at example 4 (channel 1, row 2, column 3)", "finite");
    bad[4 * SPER + 1 * SH * SW + 2 * SW + 3] = -INFINITY;
    put_st(dir, "train.safetensors", "F32", 4, nchw_shape, bad, "U8", SN, lab8);
    LOAD_ERR("infinite pixel", "an infinity at example 4");
    put_st(dir, "train.safetensors", "U8", 4, (long long[]){ 1, 65, 1, 2 }, nchw, "U8", SN, lab8);
    LOAD_ERR("65 channels", "has 65 channels: mgc takes 1 to 64");
    put_st(dir, "train.safetensors", "U8", 4, (long long[]){ 0, SC, SH, SW }, nchw, "U8", 0, lab8);
    LOAD_ERR("no examples", "holds no examples");
    put_st(dir, "train.safetensors", "U8", 4, (long long[]){ SN, SC, SW, SH }, nchw, "U8", SN, lab8);
    LOAD_ERR("C/H/W differ", "holds images of 3x7x5", "test.safetensors holds 3x5x7", "one shape");
    put_st(dir, "train.safetensors", "F32", 4, nchw_shape, f32, "U8", SN, lab8);
    LOAD_ERR("U8 and F32", "holds F32 images but", "test.safetensors holds U8", "the same way");
    put_file(dir, "train.safetensors", "not a safetensors file", 22);
    LOAD_ERR("not safetensors", "not a safetensors file");
    DataInfo info;
    CHECK(data_describe(dir, &info, err, sizeof err) == -1, "describe: -1 on a broken header");
    char path[700];
    snprintf(path, sizeof path, "%s/test.safetensors", dir);
    unlink(path);
    LOAD_ERR("missing test.safetensors", "safetensors data in", "is incomplete: missing test.safetensors");
#undef LOAD_ERR
}

static void test_st_data(void)
{
    unsigned char nchw[SN * SPER];
    float f32[SN * SPER];
    Rng r;
    rng_seed(&r, 12);
    for (int i = 0; i < SN * SPER; i++) {
        nchw[i] = (unsigned char)rng_below(&r, 256);
        f32[i] = ((float)rng_below(&r, 2001) - 1000.0f) / 7.0f;   /* negative, above 1: used as they are */
    }
    test_st_data_good(nchw, f32);
    test_st_data_bad(nchw, f32);
}

/* Nothing of any format: what was looked for, and Fashion-MNIST's shape to check a net against. */
static void test_no_data(void)
{
    char dir[512], err[2048];
    Dataset tr, te;
    DataInfo info;
    fresh_dir(dir, sizeof dir, "empty", NULL);
    int rc = data_load(dir, &tr, &te, &info, err, sizeof err);
    EXPECT_ERR(rc, err, "empty dir", "Fashion-MNIST not found", "missing train-images-idx3-ubyte[.gz]",
               "https://github.com/zalandoresearch/fashion-mnist", "train.safetensors and test.safetensors",
               "CIFAR-10 binary (data_batch_1.bin", "CIFAR-100 binary (train.bin, test.bin");
    rc = data_describe(dir, &info, err, sizeof err);
    CHECK(rc == 1 && !strcmp(info.format, "Fashion-MNIST") && info.channels == 1 && info.rows == 28 && info.cols == 28 &&
          info.classes == 10, "describe an empty dir: 1, Fashion-MNIST's shape and classes");
    rc = data_load("/etc/hostname", &tr, &te, &info, err, sizeof err);
    EXPECT_ERR(rc, err, "a file for a dir", "is a file, not a directory", "CIFAR-10");
}

/* The transforms on float data: statistics in double, values as they are. */
static void test_transform_floats(void)
{
    enum { N = 3, C = 2, H = 4, W = 5, PER = C * H * W };
    float v[N * PER];
    int labels[N] = { 2, 0, 1 };
    double sum[C] = { 0 }, ss[C] = { 0 };
    for (int i = 0; i < N * PER; i++) v[i] = (float)((i * 37) % 101) / 3.0f - 10.0f;
    for (int i = 0; i < N * PER; i++) sum[i / (H * W) % C] += v[i];
    for (int i = 0; i < N * PER; i++) {
        double d = v[i] - sum[i / (H * W) % C] / (N * H * W);
        ss[i / (H * W) % C] += d * d;
    }
    Dataset d = { .n = N, .channels = C, .rows = H, .cols = W, .classes = 3, .values = v, .labels = labels };
    Transform t = { .normalize = true };
    char err[512] = "";
    int ok = transform_fit(&t, &d, err, sizeof err) == 0;
    for (int c = 0; c < C; c++)
        ok &= t.mean[c] == (float)(sum[c] / (N * H * W)) && t.std[c] == (float)sqrt(ss[c] / (N * H * W));
    CHECK(ok, "transform_fit on floats: the mean and std in double");
    int order[2] = { 2, 0 };
    float x[2 * PER], y[2], plain[2 * PER], py[2];
    transform_gather(&t, &d, order, 2, false, 1, 1, x, y);
    data_gather(&d, order, 2, plain, py);
    ok = y[0] == 1 && y[1] == 2 && py[0] == 1;
    for (int j = 0; j < 2 * PER; j++) ok &= plain[j] == v[(j < PER ? 2 * PER : 0) + j % PER] && x[j] == (plain[j] - t.mean[j / (H * W) % C]) / t.std[j / (H * W) % C];
    CHECK(ok, "transform_gather on floats: (value - mean) / std, no / 255");
    for (int i = 0; i < N * PER; i++) v[i] = 2.5f;
    Transform rs = { .out_h = 7, .out_w = 3 };
    float big[2 * C * 7 * 3];
    transform_gather(&rs, &d, order, 2, false, 1, 1, big, y);
    ok = 1;
    for (int j = 0; j < 2 * C * 7 * 3; j++) ok &= big[j] == 2.5f;
    CHECK(ok, "--resize of a constant float image: the constant");
    /* --normalize: a constant channel (deviation 0) is shifted, not scaled; one
       that differs from constant by a float32's least step among all these
       values has a deviation that rounds to 0 in float32: refused, named */
    for (int i = 0; i < N * PER; i++) v[i] = 0.0f;
    Transform nt = { .normalize = true };
    ok = transform_fit(&nt, &d, err, sizeof err) == 0 && nt.std[0] == 1.0f && nt.std[1] == 1.0f && nt.mean[0] == 0.0f;
    CHECK(ok, "--normalize of constant channels: deviation 1 (shifted only)");
    float tiny = nextafterf(0.0f, 1.0f);   /* 1.4e-45 */
    v[H * W + 3] = tiny;   /* example 0, channel 1 */
    EXPECT_ERR(transform_fit(&nt, &d, err, sizeof err), err, "--normalize of a nearly constant channel",
               "channel 1 of the training images has standard deviation", "which rounds to 0 in float32", "without --normalize");
}

/* ---- the real Fashion-MNIST ------------------------------------------------------ */

static void test_data_real(const char *dir)
{
    if (!dir || !*dir) {
        printf("SKIP real Fashion-MNIST checks: MGC_DATA not set\n");
        return;
    }
    Dataset tr, te;
    char err[2048];
    struct timespec t0, t1;
    DataSize size;
    CHECK(data_size(dir, &size) == 0 && size.examples == 70000 && !strcmp(size.format, "IDX") &&
          size.bytes == 70000 * (784 + sizeof(int)) + 2 + 60000 * (1 + sizeof(int)),
          "Fashion-MNIST's size in memory, from the gzip files' headers");
    CHECK(data_size("/nonexistent", &size) == -1 && size.bytes == 0, "no data set: no size");
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = data_load(dir, &tr, &te, NULL, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    CHECK(rc == 0, "real dataset loads");
    if (rc) {
        printf("  %s\n", err);
        return;
    }
    printf("loaded Fashion-MNIST (70000 examples) in %.3f s\n", secs);
    /* ~0.5 s here (zlib inflate dominates); the bound leaves room for a busy
       2-core machine and sanitizer builds, and still catches byte-wise reading. */
    CHECK(secs < 3.0, "loads in a fraction of a second");
    CHECK(tr.n == 60000 && te.n == 10000 && tr.rows == 28 && tr.cols == 28, "counts and dims");
    /* Reference values from Python (gzip + struct on the official files). */
    static const unsigned char first_train[8] = {9, 0, 0, 3, 0, 2, 7, 2};
    static const unsigned char first_test[8] = {9, 2, 1, 1, 6, 1, 4, 6};
    int first_ok[2] = { 1, 1 };
    for (int i = 0; i < 8; i++) first_ok[0] &= tr.labels[i] == first_train[i], first_ok[1] &= te.labels[i] == first_test[i];
    CHECK(first_ok[0], "first train labels 9 0 0 3 0 2 7 2");
    CHECK(first_ok[1], "first test labels 9 2 1 1 6 1 4 6");
    CHECK(tr.classes == 10 && te.classes == 10, "10 classes");
    const Dataset *ds[2] = {&tr, &te};
    const unsigned long long want_sum[2] = {3431114169ULL, 573469082ULL};
    const unsigned long want_adler[2] = {3280708108UL, 2314039915UL};
    const long want_labels[2] = {270000, 45000};
    for (int s = 0; s < 2; s++) {
        const Dataset *d = ds[s];
        size_t total = (size_t)d->n * PIX;
        unsigned char *bytes = malloc(total);
        int range_ok = 1, exact = 1;
        unsigned long long sum = 0;
        /* every example through data_gather, as training reads them */
        float *xs = malloc(sizeof(float) * total), *ys = malloc(sizeof(float) * (size_t)d->n);
        int *order = malloc(sizeof(int) * (size_t)d->n);
        for (int i = 0; i < d->n; i++) order[i] = i;
        data_gather(d, order, d->n, xs, ys);
        for (size_t i = 0; i < total; i++) {
            float x = xs[i];
            range_ok &= x >= 0.0f && x <= 1.0f;
            long b = lrintf(x * 255.0f);
            exact &= x == (float)b / 255.0f && b == d->pixels[i];
            bytes[i] = (unsigned char)b;
            sum += (unsigned long long)b;
        }
        for (int i = 0; i < d->n; i++) exact &= ys[i] == (float)d->labels[i];
        free(xs);
        free(ys);
        free(order);
        unsigned long adler = adler32(adler32(0L, Z_NULL, 0), bytes, (uInt)total);
        long lsum = 0;
        int counts[10] = {0};
        for (int i = 0; i < d->n; i++) {
            lsum += d->labels[i];
            counts[d->labels[i]]++;
        }
        CHECK(range_ok && exact, "pixels in [0,1], exactly byte/255");
        CHECK(sum == want_sum[s], "pixel byte sum matches Python");
        CHECK(adler == want_adler[s], "adler32 of pixel bytes (order) matches Python");
        CHECK(lsum == want_labels[s], "label sum matches Python");
        int balanced = 1;
        for (int k = 0; k < 10; k++)
            balanced &= counts[k] == d->n / 10;
        CHECK(balanced, "classes balanced (n/10 each)");
        double mean = (double)sum / 255.0 / (double)total;
        CHECK(fabs(mean - (s ? 0.2868 : 0.2860)) < 0.0005, "pixel mean as published");
        free(bytes);
    }
    data_limit(&tr, 1000);
    CHECK(tr.n == 1000, "data_limit on the real set");
    data_free(&tr);
    data_free(&te);
}

/* ---- safetensors ----------------------------------------------------------------- */

static char st_path[512];

/* A file with a raw header text and `data_len` zero data bytes. */
static void write_raw_st(const char *path, const char *header, size_t data_len)
{
    size_t hl = strlen(header);
    unsigned char *b = calloc(8 + hl + data_len + 1, 1);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((unsigned long long)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    write_bytes(path, b, 8 + hl + data_len, 0);
    free(b);
}

static int raw_load(const char *header, size_t data_len, char *err, size_t err_size)
{
    write_raw_st(st_path, header, data_len);
    StFile f;
    int rc = st_load(st_path, &f, err, err_size);
    st_free(&f);
    return rc;
}

static const char *const rt_names[] = {
    "conv1.weight", "fc.bias", "scalar", "empty", "we\"ird\\na\nme/\xc3\xbc", "i64", "f16",
    "bf16", "u8", "bool", "f64", "i32", "i16", "i8", "check",
};

/* Writes the round-trip file; returns 0 on success. */
static int write_roundtrip(const char *path, float *conv, char *err, size_t err_size)
{
    StWriter *w = st_writer_new();
    Rng r;
    rng_seed(&r, 3);
    for (int i = 0; i < 150; i++)
        conv[i] = rng_normal(&r, 0, 1);
    long long s_conv[4] = {6, 1, 5, 5}, s10[1] = {10}, s_empty[2] = {0, 3}, s3[1] = {3},
              s_check[3] = {2, 3, 4};
    float bias[10], scal = 3.5f, check_v[24];
    for (int i = 0; i < 10; i++)
        bias[i] = (float)i - 4.5f;
    for (int i = 0; i < 24; i++)
        check_v[i] = (float)i;
    long long i64[3] = {-5, 0, 1LL << 40};
    unsigned short f16[3] = {0x3C00, 0xC000, 0x0001};   /* 1, -2, smallest subnormal */
    unsigned short bf16[3] = {0x3F80, 0xC040, 0x0000};  /* 1, -3, 0 */
    unsigned char u8[3] = {0, 128, 255}, bl[3] = {0, 1, 1};
    double f64[3] = {0.25, -1e10, 3.0};
    int i32[3] = {-7, 8, 9};
    short i16[3] = {-300, 0, 300};
    signed char i8[3] = {-128, 0, 127};
    int rc = 0;
    rc |= st_writer_add_f32(w, rt_names[0], 4, s_conv, conv);
    rc |= st_writer_add_f32(w, rt_names[1], 1, s10, bias);
    rc |= st_writer_add_f32(w, rt_names[2], 0, NULL, &scal);
    rc |= st_writer_add_f32(w, rt_names[3], 2, s_empty, NULL);
    rc |= st_writer_add_f32(w, rt_names[4], 1, s3, bias);
    rc |= st_writer_add(w, rt_names[5], "I64", 1, s3, i64);
    rc |= st_writer_add(w, rt_names[6], "F16", 1, s3, f16);
    rc |= st_writer_add(w, rt_names[7], "BF16", 1, s3, bf16);
    rc |= st_writer_add(w, rt_names[8], "U8", 1, s3, u8);
    rc |= st_writer_add(w, rt_names[9], "BOOL", 1, s3, bl);
    rc |= st_writer_add(w, rt_names[10], "F64", 1, s3, f64);
    rc |= st_writer_add(w, rt_names[11], "I32", 1, s3, i32);
    rc |= st_writer_add(w, rt_names[12], "I16", 1, s3, i16);
    rc |= st_writer_add(w, rt_names[13], "I8", 1, s3, i8);
    rc |= st_writer_add_f32(w, rt_names[14], 3, s_check, check_v);
    rc |= st_writer_set_meta(w, "format", "pt");
    rc |= st_writer_set_meta(w, "net", "lenet \"5\"\n\\ \xc3\xa9");
    rc |= st_writer_set_meta(w, "step", "1");
    rc |= st_writer_set_meta(w, "step", "100");   /* replaces */
    memset(conv + 150, 0, 0);
    if (rc == 0)
        rc = st_writer_save(w, path, err, err_size);
    st_writer_free(w);
    return rc;
}

/* Checks the round-trip file's contents; returns 1 if all is as written. */
static int check_roundtrip(const char *path, const float *conv, int check_order, int check_meta)
{
    StFile f;
    char err[512];
    if (st_load(path, &f, err, sizeof err) < 0) {
        printf("  %s\n", err);
        return 0;
    }
    int ok = f.n == (int)(sizeof rt_names / sizeof rt_names[0]);
    for (int i = 0; ok && check_order && i < f.n; i++)
        ok &= strcmp(f.t[i].name, rt_names[i]) == 0;
    const StTensor *t = st_find(&f, "conv1.weight");
    ok &= t && t->nd == 4 && t->shape[0] == 6 && t->shape[3] == 5 && !strcmp(t->dtype, "F32") &&
          t->nbytes == 600 && memcmp(t->data, conv, 600) == 0;
    t = st_find(&f, "scalar");
    ok &= t && t->nd == 0 && t->nbytes == 4 && *(float *)t->data == 3.5f;
    t = st_find(&f, "empty");
    ok &= t && t->nd == 2 && t->shape[0] == 0 && t->nbytes == 0 && st_numel(t) == 0;
    ok &= st_find(&f, "we\"ird\\na\nme/\xc3\xbc") != NULL;
    ok &= st_find(&f, "nope") == NULL;
    struct { const char *name; float v[3]; } conv_expect[] = {
        {"i64", {-5, 0, 1099511627776.0f}}, {"f16", {1, -2, 5.9604645e-8f}}, {"bf16", {1, -3, 0}},
        {"u8", {0, 128, 255}}, {"bool", {0, 1, 1}}, {"f64", {0.25f, -1e10f, 3}},
        {"i32", {-7, 8, 9}}, {"i16", {-300, 0, 300}}, {"i8", {-128, 0, 127}},
    };
    for (size_t k = 0; k < sizeof conv_expect / sizeof conv_expect[0]; k++) {
        float out[3] = {99, 99, 99};
        t = st_find(&f, conv_expect[k].name);
        int this_ok = t && st_to_f32(t, out) == 0 && memcmp(out, conv_expect[k].v, sizeof out) == 0;
        if (!this_ok)
            printf("  st_to_f32 %s: %g %g %g\n", conv_expect[k].name, out[0], out[1], out[2]);
        ok &= this_ok;
    }
    t = st_find(&f, "check");
    float out24[24];
    ok &= t && st_to_f32(t, out24) == 0 && out24[23] == 23.0f && out24[5] == 5.0f;
    if (check_meta) {
        char buf[64];
        ok &= st_meta_get(&f, "step", buf, sizeof buf) == 3 && strcmp(buf, "100") == 0;
        ok &= st_meta_get(&f, "net", buf, sizeof buf) > 0 &&
              strcmp(buf, "lenet \"5\"\n\\ \xc3\xa9") == 0;
        ok &= st_meta_get(&f, "absent", buf, sizeof buf) == -1;
    }
    st_free(&f);
    return ok;
}

/* Headers of many tensors (names in a hash set, issue 35): 20,000 empty
   ones load, each found by name; a duplicate at the end of them is named; a
   writer refuses a duplicate among as many. */
static void test_many_tensors(char *err, size_t err_size)
{
    enum { MANY = 20000 };
    size_t cap = (size_t)MANY * 64 + 256, len = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{");
    for (int i = 0; i < MANY; i++)
        len += (size_t)snprintf(h + len, cap - len, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                                i ? "," : "", i);
    snprintf(h + len, cap - len, "}");
    write_raw_st(st_path, h, 0);
    StFile f;
    int rc = st_load(st_path, &f, err, err_size), found = rc == 0;
    for (int i = 0; found && i < MANY; i += 7) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        const StTensor *t = st_find(&f, name);
        found = t == &f.t[i] && !strcmp(t->name, name);
    }
    CHECK(rc == 0 && f.n == MANY && found && !st_find(&f, "t20000") && !st_find(&f, "t"), "20,000 tensors load, each found by name");
    if (rc) printf("  %s\n", err);
    st_free(&f);
    snprintf(h + len, cap - len, ",\"t12345\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}");
    EXPECT_ERR(raw_load(h, 0, err, err_size), err, "a duplicate after 20,000 names", "duplicate tensor name \"t12345\"");
    free(h);
    StWriter *w = st_writer_new();
    long long zero[1] = { 0 };
    int added = 0;
    for (int i = 0; i < MANY; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        added += st_writer_add_f32(w, name, 1, zero, NULL) == 0;
    }
    CHECK(added == MANY && st_writer_add_f32(w, "w4321", 1, zero, NULL) == -1, "the writer: 20,000 names, then a duplicate refused");
    st_writer_free(w);
}

static const char *python;
static char tests_dir[512];

/* Runs a shell command; 1 if it exits 0. */
static int run_ok(const char *cmd)
{
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_safetensors(void)
{
    char err[1024], path[600], path2[700];
    float conv[150];
    snprintf(st_path, sizeof st_path, "%s/x.safetensors", tmpdir);
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);

    int rc = write_roundtrip(path, conv, err, sizeof err);
    CHECK(rc == 0, "writer saves");
    if (rc)
        printf("  %s\n", err);
    CHECK(check_roundtrip(path, conv, 1, 1), "round trip: order, shapes, bytes, dtypes, metadata");
    snprintf(path2, sizeof path2, "%s.tmp", path);
    CHECK(access(path2, F_OK) != 0, "no .tmp left behind");
    size_t n;
    unsigned char *file = read_whole(path, &n);
    unsigned long long hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | file[i];
    CHECK(hl % 8 == 0 && hl + 8 < n && memcmp(file + 8, "{\"__metadata__\":{", 17) == 0 &&
          file[8 + hl - 1] == ' ', "header padded to 8 with spaces, metadata first");
    /* Overwrite in place: still one valid file. */
    rc = write_roundtrip(path, conv, err, sizeof err);
    CHECK(rc == 0 && check_roundtrip(path, conv, 1, 1), "overwrite");

    /* Every truncation fails cleanly. */
    int all_fail = 1;
    for (size_t len = 0; len < n; len++) {
        write_bytes(st_path, file, len, 0);
        StFile f;
        if (st_load(st_path, &f, err, sizeof err) == 0) {
            all_fail = 0;
            printf("  truncation to %zu bytes loaded\n", len);
            st_free(&f);
        }
    }
    CHECK(all_fail, "every truncated file is rejected");
    write_bytes(st_path, file, n - 1, 0);
    StFile f;
    rc = st_load(st_path, &f, err, sizeof err);
    EXPECT_ERR(rc, err, "truncated data", "check", "run past", "truncated");

    /* Random mutations: never crash; whatever loads is self-consistent. */
    Rng r;
    rng_seed(&r, 11);
    unsigned char *mut = malloc(n);
    int consistent = 1, loaded = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(mut, file, n);
        int flips = 1 + rng_below(&r, 4);
        for (int k = 0; k < flips; k++) {
            size_t at = iter % 2 ? (size_t)rng_below(&r, (int)(hl + 8)) : (size_t)rng_below(&r, (int)n);
            mut[at] = (unsigned char)(iter % 3 ? rng_below(&r, 256) :
                                      "{}[]\",:0123456789 \\u"[rng_below(&r, 20)]);
        }
        write_bytes(st_path, mut, n, 0);
        if (st_load(st_path, &f, err, sizeof err) == 0) {
            loaded++;
            size_t total = 0;
            for (int i = 0; i < f.n; i++) {
                total += f.t[i].nbytes;
                consistent &= f.t[i].nbytes == (size_t)st_numel(&f.t[i]) * st_dtype_size(f.t[i].dtype);
            }
            consistent &= total <= n;
            st_free(&f);
        }
    }
    CHECK(consistent, "mutated files: whatever loads is consistent");
    printf("mutation fuzz: 3000 files, %d still loaded (value-only changes), none crashed\n", loaded);
    /* Random garbage behind a plausible header length. */
    for (int iter = 0; iter < 2000; iter++) {
        size_t len = 8 + (size_t)rng_below(&r, 300);
        for (size_t i = 0; i < len; i++)
            mut[i] = (unsigned char)(iter % 2 ? rng_below(&r, 256) :
                                     "{}[]\",:0123456789 \\ueE-.FIU8"[rng_below(&r, 28)]);
        unsigned long long h = (unsigned long long)rng_below(&r, (int)len - 7);
        for (int i = 0; i < 8; i++)
            mut[i] = (unsigned char)(h >> (8 * i));
        if (iter % 2 == 0 && len > 9)
            mut[8] = '{';
        write_bytes(st_path, mut, len, 0);
        if (st_load(st_path, &f, err, sizeof err) == 0)
            st_free(&f);
    }
    CHECK(1, "random garbage files did not crash");
    free(mut);
    free(file);

    /* Handcrafted bad headers. */
    const char *A = "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    char h[512];
    snprintf(h, sizeof h, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", A);
    EXPECT_ERR(raw_load(h, 12, err, sizeof err), err, "overlap", "overlap", "\"a\"", "\"b\"");
    snprintf(h, sizeof h, "{%s}", A);
    EXPECT_ERR(raw_load(h, 7, err, sizeof err), err, "past end", "data_offsets [0,8]", "run past");
    CHECK(raw_load(h, 8, err, sizeof err) == 0, "minimal valid file loads");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, err,
                        sizeof err), err, "nbytes", "needs 12");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, err,
                        sizeof err), err, "reversed", "reversed");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, err,
                        sizeof err), err, "dtype", "unknown dtype \"F33\"");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",}", 8, err, sizeof err), err, "bad JSON",
               "bad header JSON at byte");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}", 8, err,
                        sizeof err), err, "negative dim", "non-negative");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, err,
                        sizeof err), err, "fractional dim", "fraction");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
                        "\"data_offsets\":[0,8]}}", 8, err, sizeof err), err, "huge dim", "too large");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
                        "\"data_offsets\":[0,8]}}", 8, err, sizeof err), err, "numel overflow",
               "too large");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                        8, err, sizeof err), err, "too many dims", "more than 8");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, err, sizeof err), err,
               "missing offsets", "lacks data_offsets");
    EXPECT_ERR(raw_load("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8, err,
                        sizeof err), err, "3 offsets", "2 integers");
    snprintf(h, sizeof h, "{%s,%s}", A, A);
    EXPECT_ERR(raw_load(h, 8, err, sizeof err), err, "duplicate", "duplicate tensor name \"a\"");
    test_many_tensors(err, sizeof err);
    snprintf(h, sizeof h, "{\"__metadata__\":{\"k\":1},%s}", A);
    EXPECT_ERR(raw_load(h, 8, err, sizeof err), err, "meta value", "must be strings");
    snprintf(h, sizeof h, "{%s} x", A);
    EXPECT_ERR(raw_load(h, 8, err, sizeof err), err, "trailing", "trailing bytes");
    snprintf(h, sizeof h, "{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0],"
             "\"extra\":[[[{\"q\":[true,false,null,-1.5e3]}]]]},%s}   ", A);
    CHECK(raw_load(h, 8, err, sizeof err) == 0, "unknown keys skipped, trailing spaces ok");
    char deep[400];
    memset(deep, 0, sizeof deep);
    strcpy(deep, "{\"a\":{\"x\":");
    for (int i = 0; i < 100; i++)
        strcat(deep, "[");
    EXPECT_ERR(raw_load(deep, 8, err, sizeof err), err, "deep nesting", "nesting deeper");
    EXPECT_ERR(raw_load("{\"a\\q\":1}", 8, err, sizeof err), err, "bad escape", "bad escape");
    EXPECT_ERR(raw_load("{\"a\\ud800\":1}", 8, err, sizeof err), err, "lone surrogate", "surrogate");
    EXPECT_ERR(raw_load("{\"a\\u0000\":1}", 8, err, sizeof err), err, "escaped NUL", "\\u0000");
    snprintf(h, sizeof h, "{\"\\u00fc\\ud83d\\ude00\\/\\t\":{\"dtype\":\"U8\",\"shape\":[],"
             "\"data_offsets\":[0,1]}}");
    write_raw_st(st_path, h, 1);
    rc = st_load(st_path, &f, err, sizeof err);
    CHECK(rc == 0 && f.n == 1 && strcmp(f.t[0].name, "\xc3\xbc\xf0\x9f\x98\x80/\t") == 0,
          "\\u escapes decode to UTF-8");
    st_free(&f);
    CHECK(raw_load("{}      ", 0, err, sizeof err) == 0, "empty file {} loads");

    /* Header length field lies. */
    unsigned char bad[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    write_bytes(st_path, bad, 16, 0);
    rc = st_load(st_path, &f, err, sizeof err);
    EXPECT_ERR(rc, err, "huge header length", "header length");
    write_bytes(st_path, bad, 5, 0);
    rc = st_load(st_path, &f, err, sizeof err);
    EXPECT_ERR(rc, err, "5-byte file", "shorter than the 8-byte");
    rc = st_load("/nonexistent/x.safetensors", &f, err, sizeof err);
    EXPECT_ERR(rc, err, "missing file", "/nonexistent/x.safetensors", "cannot open");

    /* Writer errors. */
    StWriter *w = st_writer_new();
    long long s2[1] = {2};
    float two[2] = {1, 2};
    CHECK(st_writer_add_f32(w, "a", 1, s2, two) == 0, "add");
    CHECK(st_writer_add_f32(w, "a", 1, s2, two) == -1, "duplicate add fails");
    snprintf(path2, sizeof path2, "%s/dup.safetensors", tmpdir);
    rc = st_writer_save(w, path2, err, sizeof err);
    EXPECT_ERR(rc, err, "save after bad add", "duplicate tensor name \"a\"", "not written");
    CHECK(access(path2, F_OK) != 0, "nothing written after a bad add");
    st_writer_free(w);
    w = st_writer_new();
    CHECK(st_writer_add_f32(w, "__metadata__", 1, s2, two) == -1, "reserved name rejected");
    CHECK(st_writer_add(w, "x", "F99", 1, s2, two) == -1, "unknown dtype rejected");
    st_writer_free(w);
    w = st_writer_new();
    st_writer_add_f32(w, "a", 1, s2, two);
    rc = st_writer_save(w, "/nonexistent/dir/c.safetensors", err, sizeof err);
    EXPECT_ERR(rc, err, "unwritable path", "/nonexistent/dir/c.safetensors.tmp", "cannot create");
    st_writer_free(w);

    /* Cross-check with PyTorch: our file -> Python -> our reader. */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s -c 'import torch' >/dev/null 2>&1", python);
    if (!run_ok(cmd)) {
        printf("SKIP Python cross-check: %s cannot import torch (set MGC_PYTHON)\n", python);
        return;
    }
    snprintf(cmd, sizeof cmd, "%s/st.py", tests_dir);
    if (access(cmd, R_OK) != 0) {
        printf("SKIP Python cross-check: %s not found (run from the repository root)\n", cmd);
        return;
    }
    snprintf(path2, sizeof path2, "%s/py.safetensors", tmpdir);
    snprintf(cmd, sizeof cmd, "%s %s/st.py roundtrip '%s' '%s'", python, tests_dir, path, path2);
    CHECK(run_ok(cmd), "tests/st.py reads our file and writes it back");
    CHECK(check_roundtrip(path2, conv, 1, 1), "our reader on tests/st.py's file (order kept)");
    snprintf(cmd, sizeof cmd,
             "%s -c 'import sys, torch; sys.path.insert(0, \"%s\"); import st; "
             "t = st.load(sys.argv[1]); "
             "assert torch.equal(t[\"check\"], torch.arange(24.).reshape(2, 3, 4)); "
             "assert t[\"scalar\"].shape == () and float(t[\"scalar\"]) == 3.5; "
             "assert t[\"empty\"].shape == (0, 3); "
             "assert t[\"f16\"].tolist()[:2] == [1.0, -2.0] and t[\"i64\"].tolist() == [-5, 0, 1 << 40]; "
             "assert st.load_metadata(sys.argv[1])[\"step\"] == \"100\"' '%s'",
             python, tests_dir, path);
    CHECK(run_ok(cmd), "PyTorch sees the values, shapes and metadata we wrote");
    snprintf(cmd, sizeof cmd, "%s -c 'import safetensors' >/dev/null 2>&1", python);
    if (!run_ok(cmd)) {
        printf("SKIP cross-check with the safetensors package: not installed for %s\n", python);
        return;
    }
    snprintf(path2, sizeof path2, "%s/hf.safetensors", tmpdir);
    snprintf(cmd, sizeof cmd,
             "%s -c 'import sys, torch; sys.path.insert(0, \"%s\"); import st; "
             "from safetensors.torch import load_file, save_file; from safetensors import safe_open; "
             "a = load_file(sys.argv[1]); b = st.load(sys.argv[1]); "
             "assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a); "
             "m = safe_open(sys.argv[1], \"pt\").metadata(); assert m[\"step\"] == \"100\", m; "
             "save_file(a, sys.argv[2], metadata=m)' '%s' '%s'",
             python, tests_dir, path, path2);
    CHECK(run_ok(cmd), "safetensors package loads our file, equal to tests/st.py");
    CHECK(check_roundtrip(path2, conv, 0, 1), "our reader on the safetensors package's file");
}

/* Writes text to dir/name, making dir (and its parents) first. */
static void put_text(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "mkdir -p '%s'", dir);
    if (system(path)) return;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_bytes(path, text, strlen(text), 0);
}

/* The memory limit of this process's own cgroup and those above it, in a
   fake tree: /proc/self/cgroup, mountinfo and meminfo of the test's own. */
static void test_memlimit(void)
{
    char root[600], v2[700], v1[700], d[900], cg[700], mi[700], meminfo[700], text[2200];
    snprintf(root, sizeof root, "%s/cg", tmpdir);
    snprintf(v2, sizeof v2, "%s/unified", root);
    snprintf(v1, sizeof v1, "%s/mem ory", root);   /* a space: mountinfo writes it \040 */
    snprintf(cg, sizeof cg, "%s/cgroup", root);
    snprintf(mi, sizeof mi, "%s/mountinfo", root);
    snprintf(meminfo, sizeof meminfo, "%s/meminfo", root);
    put_text(root, "meminfo", "MemTotal:       16000000 kB\nMemFree:   100 kB\nMemAvailable:    8000000 kB\n");
    RtMemSources src = { cg, mi, meminfo };
    RtMemLimit m;

    /* v2: the process in /a/b/c; /a allows 1 GB with 300 MB used (100 MB of it
       inactive page cache), /a/b no limit, /a/b/c 900 MB with 50 MB used */
    snprintf(text, sizeof text, "31 23 0:28 / /sys rw - sysfs sysfs rw\n41 31 0:38 / %s rw,relatime - cgroup2 cgroup2 rw\n", v2);
    write_bytes(mi, text, strlen(text), 0);
    put_text(root, "cgroup", "0::/a/b/c\n");
    snprintf(d, sizeof d, "%s/a", v2);
    put_text(d, "memory.max", "1000000000\n");
    put_text(d, "memory.current", "300000000\n");
    put_text(d, "memory.stat", "anon 150000000\nfile 150000000\ninactive_file 100000000\nactive_file 50000000\n");
    snprintf(d, sizeof d, "%s/a/b", v2);
    put_text(d, "memory.max", "max\n");
    put_text(d, "memory.current", "250000000\n");
    snprintf(d, sizeof d, "%s/a/b/c", v2);
    put_text(d, "memory.max", "900000000\n");
    put_text(d, "memory.current", "50000000\n");
    rt_memory_limit(&src, &m);
    CHECK(m.available == 800000000 && m.limit == 1000000000 && m.used == 200000000 && !strcmp(m.where, "cgroup /a memory.max"),
          "cgroup v2: the tightest level above the process's own counts (/a: 1 GB less 200 MB in use, page cache not counted)");
    if (m.available != 800000000) printf("  available %zu, %s\n", m.available, m.where);
    snprintf(d, sizeof d, "%s/a/b/c", v2);
    put_text(d, "memory.max", "700000000\n");
    rt_memory_limit(&src, &m);
    CHECK(m.available == 650000000 && !strcmp(m.where, "cgroup /a/b/c memory.max"), "cgroup v2: the process's own cgroup when it is the tightest");
    /* the root's files (a v2 root has none) do not count: a limit at the mount point with the process below */
    put_text(v2, "memory.max", "10\n");
    rt_memory_limit(&src, &m);
    CHECK(!strcmp(m.where, "cgroup / memory.max") && m.available == 10, "cgroup v2: the root of the hierarchy is a level too");
    snprintf(d, sizeof d, "%s/memory.max", v2);
    unlink(d);

    /* v1, docker's way: the container's cgroup /docker/ab mounted as the
       hierarchy's root; the process in /docker/ab/job; 600 MB at /docker/ab */
    snprintf(text, sizeof text, "41 31 0:38 / %s rw - cgroup2 cgroup2 rw\n"
             "35 31 0:32 /docker/ab %s/mem\\040ory rw,relatime - cgroup cgroup rw,memory\n", v2, root);
    write_bytes(mi, text, strlen(text), 0);
    put_text(root, "cgroup", "5:cpu,cpuacct:/docker/ab\n4:memory:/docker/ab/job\n0::/\n");
    put_text(v1, "memory.limit_in_bytes", "600000000\n");
    put_text(v1, "memory.usage_in_bytes", "100000000\n");
    put_text(v1, "memory.stat", "cache 60000000\ninactive_file 1\ntotal_inactive_file 50000000\n");
    snprintf(d, sizeof d, "%s/job", v1);
    put_text(d, "memory.limit_in_bytes", "9223372036854771712\n");   /* v1's "no limit" */
    put_text(d, "memory.usage_in_bytes", "90000000\n");
    rt_memory_limit(&src, &m);
    CHECK(m.available == 550000000 && m.limit == 600000000 && !strcmp(m.where, "cgroup /docker/ab memory.limit_in_bytes"),
          "cgroup v1 (the memory controller's line), a mount whose root is the container's cgroup, its escaped mount point");
    if (m.available != 550000000) printf("  available %zu, %s\n", m.available, m.where);

    /* no limit anywhere: MemAvailable; nothing readable: 0 */
    put_text(v1, "memory.limit_in_bytes", "9223372036854771712\n");
    rt_memory_limit(&src, &m);
    CHECK(m.available == 8192000000ULL && !strcmp(m.where, "MemAvailable") && !m.limit, "no cgroup limit: MemAvailable");
    RtMemSources none = { "/nonexistent/cgroup", "/nonexistent/mountinfo", "/nonexistent/meminfo" };
    rt_memory_limit(&none, &m);
    CHECK(m.available == 0 && !m.where[0], "nothing to read: unknown (0)");
    rt_memory_limit(NULL, &m);
    printf("note this process: %zu MB available (%s)\n", m.available >> 20, m.where);
}

/* The architecture the CUDA device compiles for, among those NVRTC 13.0 lists. */
static void test_arch_choice(void)
{
    const int archs[] = { 75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121 };
    const int n = (int)(sizeof archs / sizeof archs[0]);
    bool ptx = true;
    CHECK(rt_arch_choose(archs, n, 90, &ptx) == 90 && !ptx, "a listed GPU (sm_90) gets its own cubin");
    CHECK(rt_arch_choose(archs, n, 75, &ptx) == 75 && !ptx, "the oldest listed (sm_75) gets its cubin");
    CHECK(rt_arch_choose(archs, n, 125, &ptx) == 121 && ptx, "a GPU newer than all (sm_125): PTX of the newest (compute_121)");
    CHECK(rt_arch_choose(archs, n, 95, &ptx) == 90 && ptx, "an unlisted GPU between two (sm_95): PTX of the one below (compute_90)");
    CHECK(rt_arch_choose(archs, n, 70, &ptx) == -1, "a GPU older than every architecture (sm_70): none");
    const int shuffled[] = { 90, 75, 120, 80 };
    CHECK(rt_arch_choose(shuffled, 4, 100, &ptx) == 90 && ptx, "the list's order does not matter");
}

/* The store's check (runtime/store.c): finite values, a variance's not below 0; the
   fast pass in blocks of 64 and the tail after them, each bound at its edge. */
static void test_store_check(void)
{
    enum { N = 64 * 3 + 5 };   /* three blocks and a tail */
    float v[N];
    StoreEntry p = { .name = "fc.weight", .numel = N, .data = v, .trainable = true };
    StoreEntry var = { .name = "bn1.running_var", .numel = N, .data = v }, sq = { .name = "fc.weight.exp_avg_sq", .numel = N, .data = v };
    StoreEntry mom = { .name = "fc.weight.momentum_buffer", .numel = N, .data = v }, mean = { .name = "bn1.running_mean", .numel = N, .data = v };
    CHECK(rt_store_is_variance(&var) && rt_store_is_variance(&sq) && !rt_store_is_variance(&p) && !rt_store_is_variance(&mom) &&
          !rt_store_is_variance(&mean), "the variances: running_var, exp_avg_sq");
    CHECK(!strcmp(rt_store_kind(&p), "parameter") && !strcmp(rt_store_kind(&var), "running statistic") &&
          !strcmp(rt_store_kind(&sq), "optimizer state"), "what each tensor is, in words");
    /* the edges that pass: the largest floats, the least subnormal, -0 (also in a variance) */
    for (int i = 0; i < N; i++) v[i] = i % 4 == 0 ? FLT_MAX : i % 4 == 1 ? nextafterf(0, 1) : i % 4 == 2 ? -0.0f : 1.0f;
    StoreCheck c = rt_store_check(&var);
    CHECK(c.first == -1 && c.nonfinite == 0 && c.negative == 0, "FLT_MAX, 1.4e-45, -0 and 1 in a variance: fine");
    v[7] = -FLT_MAX;
    c = rt_store_check(&p);
    CHECK(c.first == -1, "-FLT_MAX in a parameter: fine");
    c = rt_store_check(&var);
    CHECK(c.first == 7 && c.negative == 1 && c.nonfinite == 0 && c.value == -FLT_MAX, "-FLT_MAX in a variance: below 0");
    v[7] = -nextafterf(0, 1);
    c = rt_store_check(&sq);
    CHECK(c.first == 7 && c.negative == 1, "the least negative subnormal in exp_avg_sq: below 0");
    v[7] = 1;
    int at[] = { 0, 63, 64, 191, 192, N - 1 };   /* each block's edges, the tail's */
    for (int k = 0; k < (int)(sizeof at / sizeof *at); k++) {
        float was = v[at[k]];
        v[at[k]] = k % 3 == 0 ? NAN : k % 3 == 1 ? INFINITY : -INFINITY;
        c = rt_store_check(&p);
        char msg[96];
        snprintf(msg, sizeof msg, "a %g at element %d of %d found, counted, named", (double)v[at[k]], at[k], N);
        CHECK(c.first == at[k] && c.nonfinite == 1 && c.negative == 0, msg);
        v[at[k]] = was;
    }
    v[5] = NAN, v[100] = -2, v[150] = -INFINITY;
    c = rt_store_check(&var);
    char what[256];
    rt_store_check_str(&var, &c, what, sizeof what);
    CHECK(c.first == 5 && c.nonfinite == 2 && c.negative == 1 &&
          !strcmp(what, "running statistic 'bn1.running_var' holds 2 values that are not finite and 1 value below 0, which a "
                        "variance cannot be, of 197 (the first, element 5, is nan)"), what);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/mgc_unit_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    python = getenv("MGC_PYTHON") ? getenv("MGC_PYTHON") : "/usr/bin/python3";
    char file[512];
    snprintf(file, sizeof file, "%s", __FILE__);
    snprintf(tests_dir, sizeof tests_dir, "%s", dirname(file));
    char *data_dir = getenv("MGC_DATA") ? strdup(getenv("MGC_DATA")) : NULL;

    test_rng();
    test_memlimit();
    test_arch_choice();
    test_store_check();
    test_shuffle();
    test_data_crafted();
    test_idx_sizes();
    test_cifar10();
    test_cifar100();
    test_st_data();
    test_no_data();
    test_transform_floats();
    test_data_real(data_dir);
    test_safetensors();

    remove_tree(tmpdir);
    free(data_dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
