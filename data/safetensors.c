/*
** Safetensors reader and writer (see safetensors.h for the format).
**
** The header is parsed by a small recursive-descent JSON parser (json.c) for
** untrusted input: every read is bounds-checked against the header length,
** nesting is limited, numbers are parsed with overflow checks, and any
** mistake becomes "PATH: bad header JSON at byte K: ...". Validation after
** parsing checks dtypes, shapes, sizes and offsets before any data is read.
** Linear in the header: one pass over its text, each string's buffer as long
** as the string, names checked for duplicates in a hash set, the overlap
** check a sort (n log n).
*/
#include "safetensors.h"
#include "errbuf.h"
#include "json.h"
#include "paths.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000ULL   /* the reference implementation's limit */


static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* ---- dtypes ------------------------------------------------------------ */

static const struct { const char *name; size_t size; } dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
    {"I16", 2}, {"I8", 1}, {"U8", 1}, {"BOOL", 1},
};

size_t st_dtype_size(const char *dtype)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtype, dtypes[i].name) == 0)
            return dtypes[i].size;
    return 0;
}

/* numel of a shape; -1 if it overflows 2^62 (a zero dim makes it 0 regardless). */
static long long shape_numel(int nd, const long long *shape)
{
    unsigned long long numel = 1;
    int overflow = 0;
    for (int i = 0; i < nd; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] == 0)
            return 0;
        if (numel > (1ULL << 62) / (unsigned long long)shape[i])
            overflow = 1;
        else
            numel *= (unsigned long long)shape[i];
    }
    return overflow ? -1 : (long long)numel;
}

long long st_numel(const StTensor *t)
{
    return shape_numel(t->nd, t->shape);
}

/* ---- names: a hash set ------------------------------------------------------ */

/* Indices into a tensor array, found by name: open addressing, linear
   probing, at most half full, so adding and finding are O(1) and n names
   cost O(n) (a list searched name by name made a header of 80,000 tensors
   take minutes). */
struct StIndex {
    size_t cap;                     /* slots, a power of 2 */
    int slot[];                     /* a tensor's index, or -1 */
};

static size_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;   /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return (size_t)(h ^ h >> 29);
}

/* The index of the tensor of t[] called name, or -1. */
static int index_find(const StIndex *x, const StTensor *t, const char *name)
{
    if (!x) return -1;
    for (size_t k = name_hash(name) & (x->cap - 1);; k = (k + 1) & (x->cap - 1)) {
        int i = x->slot[k];
        if (i < 0) return -1;
        if (!strcmp(t[i].name, name)) return i;
    }
}

static void index_put(StIndex *x, const StTensor *t, int i)
{
    size_t k = name_hash(t[i].name) & (x->cap - 1);
    while (x->slot[k] >= 0) k = (k + 1) & (x->cap - 1);
    x->slot[k] = i;
}

/* Adds t[i] (t[0..i) already in *x, i + 1 names in all), growing the set:
   0, or -1 out of memory (*x unchanged). The name must not be in it. */
static int index_add(StIndex **x, const StTensor *t, int i)
{
    size_t need = 2 * ((size_t)i + 1);
    if (!*x || need > (*x)->cap) {
        size_t cap = *x ? 2 * (*x)->cap : 64;
        while (cap < need) cap *= 2;
        StIndex *y = malloc(sizeof *y + cap * sizeof y->slot[0]);
        if (!y) return -1;
        y->cap = cap;
        memset(y->slot, 0xff, cap * sizeof y->slot[0]);   /* -1 */
        for (int j = 0; j < i; j++) index_put(y, t, j);
        free(*x);
        *x = y;
    }
    index_put(*x, t, i);
    return 0;
}

/* ---- reader ------------------------------------------------------------- */

typedef struct Range { long long begin, end; int index; } Range;

static int range_cmp(const void *a, const void *b)
{
    const Range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Parses one tensor entry {"dtype":..,"shape":[..],"data_offsets":[b,e]}. */
static int parse_tensor(Json *j, StTensor *t, long long *begin, long long *end)
{
    int have_dtype = 0, have_shape = 0, have_offsets = 0;
    if (json_expect(j, '{') < 0)
        return -1;
    if (json_peek(j) == '}')
        return json_fail(j, "tensor entry has no dtype, shape or data_offsets");
    for (;;) {
        char *key = NULL;
        if (json_string(j, &key) < 0 || json_expect(j, ':') < 0) {
            free(key);
            return -1;
        }
        int rc = 0;
        if (strcmp(key, "dtype") == 0) {
            char *dtype = NULL;
            if (json_peek(j) != '"')
                rc = json_fail(j, "dtype must be a string");
            else if (json_string(j, &dtype) < 0)
                rc = -1;
            else if (!st_dtype_size(dtype))
                rc = json_fail(j, "unknown dtype \"%.20s\" (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)",
                               dtype);
            else
                snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
            free(dtype);
            have_dtype = 1;
        } else if (strcmp(key, "shape") == 0 || strcmp(key, "data_offsets") == 0) {
            int is_shape = key[0] == 's';
            long long vals[ST_MAX_DIMS];
            int n = 0;
            rc = json_expect(j, '[');
            if (rc == 0 && json_peek(j) == ']') {
                j->p++;
            } else {
                while (rc == 0) {
                    long long v = 0;
                    if (n == ST_MAX_DIMS) {
                        rc = json_fail(j, "%s has more than %d entries", key, ST_MAX_DIMS);
                        break;
                    }
                    if ((rc = json_uint(j, &v)) < 0)
                        break;
                    vals[n++] = v;
                    if (json_peek(j) == ',') {
                        j->p++;
                        continue;
                    }
                    rc = json_expect(j, ']');
                    break;
                }
            }
            if (rc == 0 && is_shape) {
                t->nd = n;
                memcpy(t->shape, vals, (size_t)n * sizeof vals[0]);
                have_shape = 1;
            } else if (rc == 0) {
                if (n != 2)
                    rc = json_fail(j, "data_offsets must hold 2 integers, has %d", n);
                *begin = n > 0 ? vals[0] : 0;
                *end = n > 1 ? vals[1] : 0;
                have_offsets = 1;
            }
        } else {
            rc = json_skip(j);   /* unknown keys are ignored */
        }
        free(key);
        if (rc < 0)
            return -1;
        if (json_peek(j) == ',') {
            j->p++;
            continue;
        }
        if (json_expect(j, '}') < 0)
            return -1;
        break;
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return json_fail(j, "tensor entry lacks %s", !have_dtype ? "dtype" :
                         !have_shape ? "shape" : "data_offsets");
    return 0;
}

void st_free(StFile *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n; i++) {
        free(f->t[i].name);
        free(f->t[i].data);
    }
    free(f->t);
    free(f->meta_json);
    free(f->index);
    memset(f, 0, sizeof *f);
}

/* Parses the header text into f (names, dtypes, shapes) and ranges. */
static int parse_header(const char *path, const char *text, size_t len, StFile *f,
                        Range **ranges_out, char *err, size_t err_size)
{
    Json j = {.begin = text, .p = text, .end = text + len};
    Range *ranges = NULL;
    int cap = 0;
    *ranges_out = NULL;
    if (json_expect(&j, '{') < 0)
        goto syntax;
    if (json_peek(&j) == '}') {
        j.p++;
    } else {
        for (;;) {
            char *name = NULL;
            if (json_string(&j, &name) < 0 || json_expect(&j, ':') < 0) {
                free(name);
                goto syntax;
            }
            if (strcmp(name, "__metadata__") == 0) {
                free(name);
                if (f->meta_json) {
                    json_fail(&j, "duplicate __metadata__");
                    goto syntax;
                }
                json_ws(&j);
                const char *start = j.p;
                if (json_string_map(&j, NULL, NULL) < 0)
                    goto syntax;
                size_t n = (size_t)(j.p - start);
                f->meta_json = malloc(n + 1);
                if (!f->meta_json) {
                    set_err(err, err_size, "%s: out of memory", path);
                    goto fail;
                }
                memcpy(f->meta_json, start, n);
                f->meta_json[n] = 0;
            } else {
                if (index_find(f->index, f->t, name) >= 0) {
                    set_err(err, err_size, "%s: duplicate tensor name \"%.200s\"", path, name);
                    free(name);
                    goto fail;
                }
                if (f->n == cap) {
                    int ncap = cap ? 2 * cap : 16;
                    StTensor *nt = realloc(f->t, (size_t)ncap * sizeof *nt);
                    Range *nr = nt ? realloc(ranges, (size_t)ncap * sizeof *nr) : NULL;
                    if (nt)
                        f->t = nt;
                    if (nr)
                        ranges = nr;
                    if (!nt || !nr) {
                        free(name);
                        set_err(err, err_size, "%s: out of memory", path);
                        goto fail;
                    }
                    cap = ncap;
                }
                StTensor *t = &f->t[f->n];
                memset(t, 0, sizeof *t);
                t->name = name;
                f->n++;
                if (index_add(&f->index, f->t, f->n - 1) < 0) {
                    set_err(err, err_size, "%s: out of memory", path);
                    goto fail;
                }
                Range *r = &ranges[f->n - 1];
                r->index = f->n - 1;
                if (parse_tensor(&j, t, &r->begin, &r->end) < 0)
                    goto syntax;
            }
            if (json_peek(&j) == ',') {
                j.p++;
                continue;
            }
            if (json_expect(&j, '}') < 0)
                goto syntax;
            break;
        }
    }
    json_ws(&j);
    if (j.p != j.end) {
        json_fail(&j, "trailing bytes after the header object");
        goto syntax;
    }
    *ranges_out = ranges;
    return 0;
syntax:
    set_err(err, err_size, "%s: bad header JSON at byte %ld of %zu: %s%s%s%s", path,
            (long)(j.err_at - text), len, j.msg,
            f->n > 0 && f->t[f->n - 1].name ? " (in entry \"" : "",
            f->n > 0 && f->t[f->n - 1].name ? f->t[f->n - 1].name : "",
            f->n > 0 && f->t[f->n - 1].name ? "\")" : "");
fail:
    free(ranges);
    return -1;
}

/* st_load, or with header_only st_load_header: everything validated, the data
   read only when asked. */
static int load(const char *path, StFile *f, int header_only, char *err, size_t err_size)
{
    memset(f, 0, sizeof *f);
    char *header = NULL;
    Range *ranges = NULL;
    /* O_NONBLOCK: a FIFO is refused below, not waited on for a writer (for
       a regular file the flag changes nothing) */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, err_size, "%s: is %s, not a regular file: name a safetensors file", path, rt_file_kind(st.st_mode));
        close(fd);
        return -1;
    }
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    unsigned long long fsize = (unsigned long long)st.st_size;
    unsigned char lenbuf[8];
    if (fsize < 8 || fread(lenbuf, 1, 8, fp) != 8) {
        set_err(err, err_size, "%s: not a safetensors file: %llu bytes, shorter than the 8-byte "
                "header length", path, fsize);
        goto fail;
    }
    unsigned long long hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenbuf[i];
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > fsize - 8) {
        set_err(err, err_size, "%s: not a safetensors file or truncated: header length %llu %s "
                "(file has %llu bytes)", path, hlen,
                hlen < 2 ? "too small" : hlen > ST_MAX_HEADER ? "over the 100 MB limit" :
                "runs past the end of the file", fsize);
        goto fail;
    }
    header = malloc(hlen + 1);
    if (!header) {
        set_err(err, err_size, "%s: out of memory for a %llu-byte header", path, hlen);
        goto fail;
    }
    if (fread(header, 1, hlen, fp) != hlen) {
        set_err(err, err_size, "%s: read error in header", path);
        goto fail;
    }
    header[hlen] = 0;
    if (parse_header(path, header, hlen, f, &ranges, err, err_size) < 0)
        goto fail;

    unsigned long long data_len = fsize - 8 - hlen;
    for (int i = 0; i < f->n; i++) {
        StTensor *t = &f->t[i];
        Range *r = &ranges[i];
        long long numel = st_numel(t);
        size_t es = st_dtype_size(t->dtype);
        if (numel < 0 || (unsigned long long)numel > data_len / es + 1) {
            set_err(err, err_size, "%s: tensor \"%.200s\": shape too large for the file", path, t->name);
            goto fail;
        }
        t->nbytes = (size_t)numel * es;
        if (r->end < r->begin || (unsigned long long)r->end > data_len) {
            set_err(err, err_size, "%s: tensor \"%.200s\": data_offsets [%lld,%lld] %s the %llu data "
                    "bytes (file truncated?)", path, t->name, r->begin, r->end,
                    r->end < r->begin ? "are reversed, not inside" : "run past", data_len);
            goto fail;
        }
        if ((unsigned long long)(r->end - r->begin) != t->nbytes) {
            set_err(err, err_size, "%s: tensor \"%.200s\": data_offsets [%lld,%lld] hold %lld bytes, "
                    "but %s of shape with %lld elements needs %zu", path, t->name, r->begin, r->end,
                    r->end - r->begin, t->dtype, numel, t->nbytes);
            goto fail;
        }
    }
    if (f->n > 1)
        qsort(ranges, (size_t)f->n, sizeof *ranges, range_cmp);
    long long reach = 0;
    int reach_index = -1;
    for (int i = 0; i < f->n; i++) {
        if (ranges[i].begin == ranges[i].end)
            continue;
        if (ranges[i].begin < reach) {
            set_err(err, err_size, "%s: tensors \"%.200s\" and \"%.200s\" overlap in the data", path,
                    f->t[reach_index].name, f->t[ranges[i].index].name);
            goto fail;
        }
        reach = ranges[i].end;
        reach_index = ranges[i].index;
    }
    for (int i = 0; i < f->n && !header_only; i++) {
        StTensor *t = &f->t[ranges[i].index];
        if (t->nbytes == 0)
            continue;
        t->data = malloc(t->nbytes);
        if (!t->data) {
            set_err(err, err_size, "%s: out of memory for tensor \"%.200s\" (%zu bytes)", path,
                    t->name, t->nbytes);
            goto fail;
        }
        if (fseeko(fp, (off_t)(8 + hlen + (unsigned long long)ranges[i].begin), SEEK_SET) < 0 ||
            fread(t->data, 1, t->nbytes, fp) != t->nbytes) {
            set_err(err, err_size, "%s: read error in tensor \"%.200s\"", path, t->name);
            goto fail;
        }
    }
    free(ranges);
    free(header);
    fclose(fp);
    return 0;
fail:
    free(ranges);
    free(header);
    fclose(fp);
    st_free(f);
    return -1;
}

int st_load(const char *path, StFile *f, char *err, size_t err_size)
{
    return load(path, f, 0, err, err_size);
}

int st_load_header(const char *path, StFile *f, char *err, size_t err_size)
{
    return load(path, f, 1, err, err_size);
}

const StTensor *st_find(const StFile *f, const char *name)
{
    int i = index_find(f->index, f->t, name);
    return i < 0 ? NULL : &f->t[i];
}

int st_meta_get(const StFile *f, const char *key, char *out, size_t size)
{
    if (!f->meta_json)
        return -1;
    Json j = {.begin = f->meta_json, .p = f->meta_json,
              .end = f->meta_json + strlen(f->meta_json)};
    char *value = NULL;
    if (json_string_map(&j, key, &value) < 0 || !value) {
        free(value);
        return -1;
    }
    int len = (int)strlen(value);
    if (out && size)
        snprintf(out, size, "%s", value);
    free(value);
    return len;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {                                   /* subnormal: normalize */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3FF) << 13);
    }
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

static float bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

int st_to_f32(const StTensor *t, float *out)
{
    long long n = st_numel(t);
    const unsigned char *p = t->data;
    if (n < 0 || !st_dtype_size(t->dtype))
        return -1;
#define CONVERT(type, expr) \
    for (long long i = 0; i < n; i++) { type v; memcpy(&v, p + (size_t)i * sizeof v, sizeof v); out[i] = (expr); }
    if (strcmp(t->dtype, "F32") == 0) {
        if (n)
            memcpy(out, p, (size_t)n * 4);
    } else if (strcmp(t->dtype, "F64") == 0) {
        CONVERT(double, (float)v)
    } else if (strcmp(t->dtype, "F16") == 0) {
        CONVERT(uint16_t, half_to_float(v))
    } else if (strcmp(t->dtype, "BF16") == 0) {
        CONVERT(uint16_t, bf16_to_float(v))
    } else if (strcmp(t->dtype, "I64") == 0) {
        CONVERT(int64_t, (float)v)
    } else if (strcmp(t->dtype, "I32") == 0) {
        CONVERT(int32_t, (float)v)
    } else if (strcmp(t->dtype, "I16") == 0) {
        CONVERT(int16_t, (float)v)
    } else if (strcmp(t->dtype, "I8") == 0) {
        CONVERT(int8_t, (float)v)
    } else if (strcmp(t->dtype, "U8") == 0) {
        CONVERT(uint8_t, (float)v)
    } else if (strcmp(t->dtype, "BOOL") == 0) {
        CONVERT(uint8_t, v ? 1.0f : 0.0f)
    } else {
        return -1;
    }
#undef CONVERT
    return 0;
}

/* ---- writer ------------------------------------------------------------- */

struct StWriter {
    StTensor *t;            /* tensors in insertion order; data copied */
    int n, cap;
    StIndex *index;         /* t by name */
    char **meta_key, **meta_value;
    int nmeta, capmeta;
    char err[256];          /* first add/set_meta error, reported by save */
};

StWriter *st_writer_new(void)
{
    return calloc(1, sizeof(StWriter));
}

void st_writer_free(StWriter *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    for (int i = 0; i < w->nmeta; i++) {
        free(w->meta_key[i]);
        free(w->meta_value[i]);
    }
    free(w->t);
    free(w->index);
    free(w->meta_key);
    free(w->meta_value);
    free(w);
}

static int writer_fail(StWriter *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int writer_fail(StWriter *w, const char *fmt, ...)
{
    if (!w->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err, sizeof w->err, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Valid UTF-8 (the reference reader rejects anything else). */
static int utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int n = *p < 0x80 ? 0 : (*p & 0xE0) == 0xC0 ? 1 : (*p & 0xF0) == 0xE0 ? 2 :
                (*p & 0xF8) == 0xF0 ? 3 : -1;
        if (n < 0 || (n == 1 && *p < 0xC2))
            return 0;
        p++;
        for (int i = 0; i < n; i++, p++)
            if ((*p & 0xC0) != 0x80)
                return 0;
    }
    return 1;
}

int st_writer_add(StWriter *w, const char *name, const char *dtype, int nd,
                  const long long *shape, const void *data)
{
    if (!name || !*name || strcmp(name, "__metadata__") == 0 || !utf8_valid(name))
        return writer_fail(w, "bad tensor name \"%.100s\" (empty, reserved or not UTF-8)",
                           name ? name : "(null)");
    size_t es = dtype ? st_dtype_size(dtype) : 0;
    if (!es)
        return writer_fail(w, "tensor \"%.100s\": unknown dtype \"%.20s\"", name, dtype ? dtype : "(null)");
    if (nd < 0 || nd > ST_MAX_DIMS || (nd > 0 && !shape))
        return writer_fail(w, "tensor \"%.100s\": %d dimensions (0..%d allowed)", name, nd, ST_MAX_DIMS);
    long long numel = shape_numel(nd, shape);
    if (numel < 0 || (unsigned long long)numel > SIZE_MAX / es)
        return writer_fail(w, "tensor \"%.100s\": negative or huge shape", name);
    if (index_find(w->index, w->t, name) >= 0)
        return writer_fail(w, "duplicate tensor name \"%.100s\"", name);
    if (numel > 0 && !data)
        return writer_fail(w, "tensor \"%.100s\": no data", name);
    if (w->n == w->cap) {
        int ncap = w->cap ? 2 * w->cap : 16;
        StTensor *nt = realloc(w->t, (size_t)ncap * sizeof *nt);
        if (!nt)
            return writer_fail(w, "out of memory");
        w->t = nt;
        w->cap = ncap;
    }
    StTensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->nbytes = (size_t)numel * es;
    t->name = dup_str(name);
    t->data = t->nbytes ? malloc(t->nbytes) : NULL;
    if (!t->name || (t->nbytes && !t->data)) {
        free(t->name);
        free(t->data);
        return writer_fail(w, "out of memory for tensor \"%.100s\"", name);
    }
    if (t->nbytes)
        memcpy(t->data, data, t->nbytes);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->nd = nd;
    for (int i = 0; i < nd; i++)
        t->shape[i] = shape[i];
    if (index_add(&w->index, w->t, w->n) < 0) {
        free(t->name);
        free(t->data);
        return writer_fail(w, "out of memory for tensor \"%.100s\"", name);
    }
    w->n++;
    return 0;
}

int st_writer_add_f32(StWriter *w, const char *name, int nd, const long long *shape,
                      const float *data)
{
    return st_writer_add(w, name, "F32", nd, shape, data);
}

int st_writer_set_meta(StWriter *w, const char *key, const char *value)
{
    if (!key || !value || !utf8_valid(key) || !utf8_valid(value))
        return writer_fail(w, "bad metadata key or value (NULL or not UTF-8)");
    for (int i = 0; i < w->nmeta; i++)
        if (strcmp(w->meta_key[i], key) == 0) {
            char *v = dup_str(value);
            if (!v)
                return writer_fail(w, "out of memory");
            free(w->meta_value[i]);
            w->meta_value[i] = v;
            return 0;
        }
    if (w->nmeta == w->capmeta) {
        int ncap = w->capmeta ? 2 * w->capmeta : 8;
        char **nk = realloc(w->meta_key, (size_t)ncap * sizeof *nk);
        if (nk)
            w->meta_key = nk;
        char **nv = nk ? realloc(w->meta_value, (size_t)ncap * sizeof *nv) : NULL;
        if (nv)
            w->meta_value = nv;
        if (!nk || !nv)
            return writer_fail(w, "out of memory");
        w->capmeta = ncap;
    }
    char *k = dup_str(key), *v = dup_str(value);
    if (!k || !v) {
        free(k);
        free(v);
        return writer_fail(w, "out of memory");
    }
    w->meta_key[w->nmeta] = k;
    w->meta_value[w->nmeta] = v;
    w->nmeta++;
    return 0;
}

static int write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int st_writer_save(StWriter *w, const char *path, char *err, size_t err_size)
{
    if (w->err[0]) {
        set_err(err, err_size, "%s: not written: %s", path, w->err);
        return -1;
    }
    JsonBuf h = {0};
    json_buf_put(&h, "{", 1);
    if (w->nmeta) {
        json_buf_put(&h, "\"__metadata__\":{", 16);
        for (int i = 0; i < w->nmeta; i++) {
            if (i)
                json_buf_put(&h, ",", 1);
            json_buf_string(&h, w->meta_key[i]);
            json_buf_put(&h, ":", 1);
            json_buf_string(&h, w->meta_value[i]);
        }
        json_buf_put(&h, "}", 1);
    }
    size_t offset = 0;
    for (int i = 0; i < w->n; i++) {
        const StTensor *t = &w->t[i];
        if (i || w->nmeta)
            json_buf_put(&h, ",", 1);
        json_buf_string(&h, t->name);
        json_buf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", t->dtype);
        for (int d = 0; d < t->nd; d++)
            json_buf_printf(&h, "%s%lld", d ? "," : "", t->shape[d]);
        json_buf_printf(&h, "],\"data_offsets\":[%zu,%zu]}", offset, offset + t->nbytes);
        offset += t->nbytes;
    }
    json_buf_put(&h, "}", 1);
    while (!h.oom && h.len % 8)
        json_buf_put(&h, " ", 1);
    if (h.oom) {
        free(h.s);
        set_err(err, err_size, "%s: out of memory building the header", path);
        return -1;
    }

    /* a symbolic link is followed: its target is replaced, the link stays; a
       FIFO or device node is not a file to replace */
    char target[PATH_MAX];
    struct stat st;
    if (rt_path_target(path, target, sizeof target)) {
        set_err(err, err_size, "%s: cannot follow its symbolic links: %s", path, strerror(errno));
        free(h.s);
        return -1;
    }
    if (!stat(target, &st) && !S_ISREG(st.st_mode)) {
        set_err(err, err_size, "%s: not a regular file (a directory, FIFO or device): not replaced", target);
        free(h.s);
        return -1;
    }
    size_t plen = strlen(target);
    char *tmp = malloc(plen + 5);
    if (!tmp) {
        free(h.s);
        set_err(err, err_size, "%s: out of memory", path);
        return -1;
    }
    memcpy(tmp, target, plen);
    memcpy(tmp + plen, ".tmp", 5);
    /* a .tmp left by an earlier run that was killed while saving goes first; a
       new one is made, never written through whatever has that name */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        set_err(err, err_size, "%s: cannot create: %s", tmp, strerror(errno));
        free(h.s);
        free(tmp);
        return -1;
    }
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (unsigned char)((unsigned long long)h.len >> (8 * i));
    int bad = write_all(fd, lenbuf, 8) < 0 || write_all(fd, h.s, h.len) < 0;
    for (int i = 0; !bad && i < w->n; i++)
        if (w->t[i].nbytes)
            bad = write_all(fd, w->t[i].data, w->t[i].nbytes) < 0;
    if (!bad)
        bad = fsync(fd) < 0;
    int saved = errno;
    if (close(fd) < 0 && !bad) {
        bad = 1;
        saved = errno;
    }
    free(h.s);
    if (bad) {
        set_err(err, err_size, "%s: write failed: %s", tmp, strerror(saved));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    if (rename(tmp, target) < 0) {
        set_err(err, err_size, "%s: cannot rename %s into place: %s", target, tmp, strerror(errno));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    /* Make the rename durable too (best effort). */
    memcpy(tmp, target, plen + 1);
    int dfd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(tmp);
    return 0;
}
