/*
** model_st.c: safetensors, read and written (see model_st.h). The header is
** parsed in place: a name's escapes are decoded where it stands and the name
** NUL-terminated there.
*/
#include "model_st.h"
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Parse {
    char *start, *p, *end;            /* the header's text, and what is still to read */
    char *err;
    size_t err_size;
    const char *path;
} Parse;

static int fail(Parse *ps, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(ps->err, ps->err_size, "%s: not a safetensors file: %s", ps->path, what);
    return -1;
}

static void space(Parse *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int expect(Parse *ps, char c)
{
    space(ps);
    if (ps->p >= ps->end || *ps->p != c) return fail(ps, "expected '%c' at byte %ld of the header", c, (long)(ps->p - ps->start));
    ps->p++;
    return 0;
}

/* A JSON string, decoded in place (ASCII escapes only) and NUL-terminated: *out */
static int string(Parse *ps, char **out)
{
    if (expect(ps, '"')) return -1;
    char *o = ps->p, *start = ps->p;
    while (ps->p < ps->end && *ps->p != '"') {
        char c = *ps->p++;
        if ((unsigned char)c < 0x20) return fail(ps, "a control character in a string");
        if (c == '\\') {
            if (ps->p >= ps->end) break;
            c = *ps->p++;
            switch (c) {
            case '"': case '\\': case '/': break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u': {
                unsigned v = 0;
                for (int k = 0; k < 4; k++) {
                    char h = ps->p < ps->end ? *ps->p++ : 0;
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                           : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
                }
                if (v == 0 || v > 0x7f) return fail(ps, "a \\u escape beyond ASCII (or NUL) in a string");
                c = (char)v;
                break;
            }
            default: return fail(ps, "a bad escape in a string");
            }
        }
        *o++ = c;
    }
    if (ps->p >= ps->end) return fail(ps, "a string does not end");
    ps->p++;
    *o = 0;
    *out = start;
    return 0;
}

/* A whole number (the shapes' and offsets'), at most 2^53 */
static int number(Parse *ps, long long *v)
{
    space(ps);
    char *s = ps->p;
    long long x = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9' && x <= (1LL << 53)) x = x * 10 + (*ps->p++ - '0');
    if (ps->p == s || x > (1LL << 53)) return fail(ps, "expected a whole number from 0 to 2^53");
    *v = x;
    return 0;
}

/* Any JSON value, passed over (the metadata, keys this reader does not use) */
static int skip(Parse *ps, int depth)
{
    space(ps);
    if (ps->p >= ps->end || depth > 64) return fail(ps, "a value is missing or nested too deep");
    char *s;
    switch (*ps->p) {
    case '"': return string(ps, &s);
    case '{': case '[': {
        char close = *ps->p == '{' ? '}' : ']';
        bool object = close == '}';
        ps->p++;
        space(ps);
        if (ps->p < ps->end && *ps->p == close) return ps->p++, 0;
        for (;;) {
            if (object && (string(ps, &s) || expect(ps, ':'))) return -1;
            if (skip(ps, depth + 1)) return -1;
            space(ps);
            if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
            return expect(ps, close);
        }
    }
    default:
        while (ps->p < ps->end && strchr("-+.eE0123456789truefalsn", *ps->p)) ps->p++;
        return 0;
    }
}

static size_t dtype_size(const char *d)
{
    static const struct { const char *name; size_t size; } sizes[] = {
        { "F64", 8 }, { "F32", 4 }, { "F16", 2 }, { "BF16", 2 }, { "I64", 8 }, { "I32", 4 }, { "I16", 2 }, { "I8", 1 },
        { "U8", 1 }, { "BOOL", 1 },
    };
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        if (!strcmp(d, sizes[k].name)) return sizes[k].size;
    return 0;
}

/* One tensor's entry: {"dtype": ..., "shape": [...], "data_offsets": [b, e]} */
static int entry(Parse *ps, mgc_st_tensor *t, size_t data_bytes)
{
    bool has_dtype = false, has_shape = false, has_offsets = false;
    if (expect(ps, '{')) return -1;
    for (;;) {
        char *key, *v;
        if (string(ps, &key) || expect(ps, ':')) return -1;
        if (!strcmp(key, "dtype")) {
            if (string(ps, &v)) return -1;
            if (strlen(v) >= sizeof t->dtype || !dtype_size(v)) return fail(ps, "tensor %s has an unknown dtype", t->name);
            strcpy(t->dtype, v);
            has_dtype = true;
        } else if (!strcmp(key, "shape") || !strcmp(key, "data_offsets")) {
            bool shape = key[0] == 's';
            long long d[MGC_ST_MAX_DIMS];
            int nd = 0;
            if (expect(ps, '[')) return -1;
            space(ps);
            if (ps->p < ps->end && *ps->p == ']') ps->p++;
            else
                for (;;) {
                    if (nd == MGC_ST_MAX_DIMS || number(ps, &d[nd++])) return nd == MGC_ST_MAX_DIMS ? fail(ps, "too many dimensions") : -1;
                    space(ps);
                    if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
                    if (expect(ps, ']')) return -1;
                    break;
                }
            if (shape) {
                t->nd = nd;
                memcpy(t->shape, d, sizeof(long long) * (size_t)nd);
                has_shape = true;
            } else {
                if (nd != 2 || d[0] > d[1] || (unsigned long long)d[1] > data_bytes)
                    return fail(ps, "tensor %s's data_offsets are not two offsets inside the file", t->name);
                t->begin = (size_t)d[0], t->end = (size_t)d[1];
                has_offsets = true;
            }
        } else if (skip(ps, 1)) {
            return -1;
        }
        space(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (expect(ps, '}')) return -1;
        break;
    }
    if (!has_dtype || !has_shape || !has_offsets) return fail(ps, "tensor %s lacks its dtype, shape or data_offsets", t->name);
    unsigned long long n = 1;
    for (int k = 0; k < t->nd; k++) {
        if (t->shape[k] > 0 && n > (1ULL << 53) / (unsigned long long)t->shape[k]) return fail(ps, "tensor %s is too large", t->name);
        n *= (unsigned long long)t->shape[k];
    }
    if (n * dtype_size(t->dtype) != t->end - t->begin)
        return fail(ps, "tensor %s's shape and dtype make %llu bytes, its offsets %zu", t->name, n * dtype_size(t->dtype),
                    t->end - t->begin);
    return 0;
}

int mgc_st_read(const char *path, mgc_st_file *f, char *err, size_t err_size)
{
    memset(f, 0, sizeof *f);
    FILE *in = fopen(path, "rb");
    if (!in) {
        snprintf(err, err_size, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    long size = fseek(in, 0, SEEK_END) ? -1 : ftell(in);
    if (size >= 0 && fseek(in, 0, SEEK_SET)) size = -1;
    f->bytes = size >= 0 ? malloc((size_t)size + 1) : NULL;
    bool ok = f->bytes && fread(f->bytes, 1, (size_t)size, in) == (size_t)size;
    fclose(in);
    if (!ok) {
        snprintf(err, err_size, "cannot read %s: %s", path, f->bytes ? "read failed" : size < 0 ? "not a regular file" : "out of memory");
        mgc_st_free(f);
        return -1;
    }
    f->size = (size_t)size;
    Parse ps = { .err = err, .err_size = err_size, .path = path };
    uint64_t hlen = 0;
    if (f->size >= 8) memcpy(&hlen, f->bytes, 8);
    if (f->size < 8 || hlen > f->size - 8 || hlen < 2) {
        fail(&ps, "its header's length does not fit in its %zu bytes", f->size);
        mgc_st_free(f);
        return -1;
    }
    f->data = 8 + (size_t)hlen;
    ps.start = ps.p = (char *)f->bytes + 8, ps.end = (char *)f->bytes + f->data;
    int cap = 0, rc = expect(&ps, '{');
    space(&ps);
    if (!rc && ps.p < ps.end && *ps.p == '}') ps.p++;
    else
        while (!rc) {
            char *name;
            if ((rc = string(&ps, &name)) || (rc = expect(&ps, ':'))) break;
            if (!strcmp(name, "__metadata__")) {
                rc = skip(&ps, 1);
            } else {
                if (f->n == cap) {
                    cap = cap ? 2 * cap : 64;
                    mgc_st_tensor *t = realloc(f->t, sizeof *t * (size_t)cap);
                    if (!t) {
                        rc = fail(&ps, "out of memory");
                        break;
                    }
                    f->t = t;
                }
                mgc_st_tensor *t = &f->t[f->n++];
                memset(t, 0, sizeof *t);
                t->name = name;
                rc = entry(&ps, t, f->size - f->data);
            }
            space(&ps);
            if (!rc && ps.p < ps.end && *ps.p == ',') {
                ps.p++;
                continue;
            }
            if (!rc) rc = expect(&ps, '}');
            break;
        }
    space(&ps);
    if (!rc && ps.p != ps.end) rc = fail(&ps, "bytes after the header's object");
    if (rc) mgc_st_free(f);
    return rc;
}

const mgc_st_tensor *mgc_st_find(const mgc_st_file *f, const char *name)
{
    for (int k = 0; k < f->n; k++)
        if (!strcmp(f->t[k].name, name)) return &f->t[k];
    return NULL;
}

const void *mgc_st_data(const mgc_st_file *f, const mgc_st_tensor *t) { return f->bytes + f->data + t->begin; }

void mgc_st_free(mgc_st_file *f)
{
    free(f->bytes);
    free(f->t);
    memset(f, 0, sizeof *f);
}

int mgc_st_write1(const char *path, const char *name, const char *dtype, int nd, const long long *shape, const void *data,
                  size_t nbytes, char *err, size_t err_size)
{
    char head[1024], tmp[4200];
    int n = snprintf(head, sizeof head, "{\"%s\":{\"dtype\":\"%s\",\"shape\":[", name, dtype);
    for (int k = 0; k < nd && n < (int)sizeof head; k++) n += snprintf(head + n, sizeof head - (size_t)n, "%s%lld", k ? "," : "", shape[k]);
    if (n < (int)sizeof head) n += snprintf(head + n, sizeof head - (size_t)n, "],\"data_offsets\":[0,%zu]}}", nbytes);
    while (n < (int)sizeof head - 1 && n % 8) head[n++] = ' ';   /* the data 8-byte aligned, as the format's writers do */
    if (n >= (int)sizeof head - 1) {
        snprintf(err, err_size, "cannot write %s: the tensor's name is too long", path);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "wb");
    if (!out) {
        snprintf(err, err_size, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    uint64_t hlen = (uint64_t)n;
    bool ok = fwrite(&hlen, 8, 1, out) == 1 && fwrite(head, 1, (size_t)n, out) == (size_t)n &&
              (nbytes == 0 || fwrite(data, 1, nbytes, out) == nbytes);
    if (fclose(out) || !ok || rename(tmp, path)) {
        snprintf(err, err_size, "cannot write %s: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}
