/*
** What a checkpoint says of its model (see ckmodel.h).
*/
#include "ckmodel.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* len bytes of UTF-8 without a NUL: what a metadata string can hold */
static bool text_storable(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        unsigned c = *p++;
        int more = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
        if (c == 0 || more < 0 || (more == 1 && c < 0xc2)) return false;
        for (int k = 0; k < more; k++)
            if (p >= end || (*p++ & 0xc0) != 0x80) return false;
    }
    return true;
}

/* "%.9g" values, comma-separated: each float32 back exactly */
static void floats_str(const float *v, int n, char *out, size_t size)
{
    int p = 0;
    out[0] = 0;
    for (int k = 0; k < n && p < (int)size; k++) p += snprintf(out + p, size - (size_t)p, "%s%.9g", k ? "," : "", (double)v[k]);
}

int ck_model_put(StWriter *w, const CkModel *m)
{
    char v[1024];
    int rc = st_writer_set_meta(w, "mgc_version", MGC_VERSION);
    if (m->net_file) rc |= st_writer_set_meta(w, "net_file", m->net_file);
    if (m->net_text && text_storable(m->net_text, m->net_len)) {
        char *text = malloc(m->net_len + 1);
        if (!text) return -1;
        memcpy(text, m->net_text, m->net_len);
        text[m->net_len] = 0;
        rc |= st_writer_set_meta(w, "net_source", text);
        free(text);
    }
    if (m->sets) rc |= st_writer_set_meta(w, "set", m->sets);
    if (m->channels > 0) {
        snprintf(v, sizeof v, "%dx%dx%d", m->channels, m->height, m->width);
        rc |= st_writer_set_meta(w, "input", v);
    }
    if (m->classes > 0) {
        snprintf(v, sizeof v, "%d", m->classes);
        rc |= st_writer_set_meta(w, "classes", v);
    }
    if (m->bf16 >= 0) rc |= st_writer_set_meta(w, "precision", m->bf16 ? "bf16" : "fp32");
    if (m->has_transform) {
        if (m->resize_h > 0) snprintf(v, sizeof v, "%dx%d", m->resize_h, m->resize_w);
        else snprintf(v, sizeof v, "none");
        rc |= st_writer_set_meta(w, "resize", v);
        if (m->normalize) {
            floats_str(m->mean, m->nchannels, v, sizeof v);
            rc |= st_writer_set_meta(w, "normalize_mean", v);
            floats_str(m->std, m->nchannels, v, sizeof v);
            rc |= st_writer_set_meta(w, "normalize_std", v);
        }
    }
    if (m->pixels != CK_PIXELS_UNKNOWN)
        rc |= st_writer_set_meta(w, "pixels", m->pixels == CK_PIXELS_BYTES ? "byte/255" : "float32");
    if (m->data[0]) rc |= st_writer_set_meta(w, "data", m->data);
    if (m->class_names && m->class_names[0]) rc |= st_writer_set_meta(w, "class_names", m->class_names);
    return rc ? -1 : 0;
}

/* key's value, malloc'd, or NULL when absent */
static char *meta_dup(const StFile *f, const char *key)
{
    int n = st_meta_get(f, key, NULL, 0);
    if (n < 0) return NULL;
    char *v = malloc((size_t)n + 1);
    if (v) st_meta_get(f, key, v, (size_t)n + 1);
    return v;
}

/* "AxB" or "AxBxC" into at most 3 positive ints: how many, or -1 */
static int dims(const char *s, int *out, int most)
{
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v <= 0 || v > (1 << 20) || n == most || *p == '+' || *p == '-') return -1;
        out[n++] = (int)v;
        if (!*end) return n;
        if (*end != 'x') return -1;
        p = end + 1;
    }
}

/* comma-separated floats, finite (std: above 0): how many, or -1 */
static int floats(const char *s, float *out, int most, bool positive)
{
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || n == most || !isfinite(v) || !isfinite((float)v) || (positive && !((float)v > 0))) return -1;
        out[n++] = (float)v;
        if (!*end) return n;
        if (*end != ',') return -1;
        p = end + 1;
    }
}

int ck_model_get(const StFile *f, CkModel *m, char *err, size_t err_size)
{
    memset(m, 0, sizeof *m);
    m->bf16 = -1;
    char v[1024];
    const char *bad = NULL;
    if (st_meta_get(f, "mgc_version", m->version, sizeof m->version) < 0) m->version[0] = 0;
    m->net_file = meta_dup(f, "net_file");
    m->net_text = meta_dup(f, "net_source");
    if (m->net_text) m->net_len = strlen(m->net_text);
    m->sets = meta_dup(f, "set");
    if (st_meta_get(f, "input", v, sizeof v) >= 0) {
        int d[3];
        if (dims(v, d, 3) != 3) bad = "input";
        else m->channels = d[0], m->height = d[1], m->width = d[2];
    }
    if (!bad && st_meta_get(f, "classes", v, sizeof v) >= 0) {
        int d[1];
        if (dims(v, d, 1) != 1) bad = "classes";
        else m->classes = d[0];
    }
    if (!bad && st_meta_get(f, "precision", v, sizeof v) >= 0) {
        if (!strcmp(v, "fp32")) m->bf16 = 0;
        else if (!strcmp(v, "bf16")) m->bf16 = 1;
        else bad = "precision";
    }
    if (!bad && st_meta_get(f, "resize", v, sizeof v) >= 0) {
        int d[2];
        m->has_transform = true;
        if (!strcmp(v, "none")) m->resize_h = m->resize_w = 0;
        else if (dims(v, d, 2) == 2) m->resize_h = d[0], m->resize_w = d[1];
        else bad = "resize";
    }
    if (!bad && st_meta_get(f, "normalize_mean", v, sizeof v) >= 0) {
        char s[1024];
        int n = floats(v, m->mean, TRANSFORM_MAX_CHANNELS, false);
        int k = st_meta_get(f, "normalize_std", s, sizeof s) >= 0 ? floats(s, m->std, TRANSFORM_MAX_CHANNELS, true) : -1;
        if (n < 1) bad = "normalize_mean";
        else if (k != n) bad = "normalize_std";
        else m->normalize = true, m->nchannels = n, m->has_transform = true;
    }
    if (!bad && st_meta_get(f, "pixels", v, sizeof v) >= 0) {
        if (!strcmp(v, "byte/255")) m->pixels = CK_PIXELS_BYTES;
        else if (!strcmp(v, "float32")) m->pixels = CK_PIXELS_FLOATS;
        else bad = "pixels";
    }
    if (!bad && st_meta_get(f, "data", m->data, sizeof m->data) < 0) m->data[0] = 0;
    if (!bad && (m->class_names = meta_dup(f, "class_names"))) {
        int lines = 0;
        for (const char *c = m->class_names; *c; c++) lines += *c == '\n';
        if (m->classes > 0 && lines != m->classes) bad = "class_names";
    }
    if (!bad && m->normalize && m->channels > 0 && m->nchannels != m->channels) bad = "normalize_mean";
    if (bad) {
        char shown[96];
        if (st_meta_get(f, bad, shown, sizeof shown) < 0) shown[0] = 0;
        snprintf(err, err_size, "the checkpoint's metadata '%s' is '%s%s', which mgc --save never writes: the file was "
                 "changed after it was saved", bad, shown, strlen(shown) == sizeof shown - 1 ? "..." : "");
        ck_model_free(m);
        return -1;
    }
    return 0;
}

void ck_model_free(CkModel *m)
{
    free(m->net_file);
    free(m->net_text);
    free(m->sets);
    free(m->class_names);
    m->net_file = m->net_text = m->sets = m->class_names = NULL;
}

void ck_model_transform(const CkModel *m, Transform *t)
{
    t->out_h = m->resize_h;
    t->out_w = m->resize_w;
    t->normalize = m->normalize;
    for (int k = 0; k < m->nchannels && k < TRANSFORM_MAX_CHANNELS; k++) t->mean[k] = m->mean[k], t->std[k] = m->std[k];
}
