/*
** A data set of the user's own arrays: train.safetensors and test.safetensors,
** as safetensors.torch.save_file({"images": x, "labels": y}, path) writes them:
**
**   images  U8 pixels 0..255 (byte / 255 on the way into a batch, as IDX) or
**           F32 values (used as they are: already scaled as the user wants);
**           [N, C, H, W], or [N, H, W, C] where the last dimension is 1, 3 or 4
**           and the second is not (NumPy's and PIL's habit), or [N, H, W] (one
**           channel)
**   labels  U8, I32 or I64 class indices 0..K-1; [N]
**
** Read through the project's safetensors reader (which validates the file);
** here the names, dtypes, shapes and values are checked. An array already
** laid out as the Dataset keeps it is taken over, not copied.
*/
#include "data_formats.h"
#include "digest.h"
#include "errbuf.h"
#include "safetensors.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_MAX_SIDE 65536

typedef struct Layout { long long n, c, h, w; bool nhwc; } Layout;

static const char *shape_str(const StTensor *t, char *buf, size_t size)
{
    int p = snprintf(buf, size, "[");
    for (int i = 0; i < t->nd && p < (int)size; i++) p += snprintf(buf + p, size - (size_t)p, "%s%lld", i ? ", " : "", t->shape[i]);
    if (p < (int)size) snprintf(buf + p, size - (size_t)p, "]");
    return buf;
}

/* The tensor called name in f, or NULL with err saying what f holds instead. */
static StTensor *need(StFile *f, const char *path, const char *name, char *err, size_t err_size)
{
    const StTensor *t = st_find(f, name);
    if (t) return &f->t[t - f->t];
    char names[320] = "";
    int listed = 0;
    for (; listed < f->n && strlen(names) < 200; listed++) {
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, "%s%.40s", len ? ", " : "", f->t[listed].name);
    }
    if (listed < f->n) {
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, " and %d more", f->n - listed);
    }
    set_err(err, err_size, "%s: no tensor `%s`: a data set file holds `images` ([N, C, H, W], [N, H, W, C] or "
            "[N, H, W]; U8 or F32) and `labels` ([N]; U8, I32 or I64); this one holds %s", path, name,
            f->n ? names : "no tensors");
    return NULL;
}

static bool small_channels(long long d) { return d == 1 || d == 3 || d == 4; }

/* How the images tensor's dimensions are read (hint: the net's C, H, W where
   known, which settles [N, C, H, W] against [N, H, W, C]): 0, or -1 with err set. */
static int images_layout(const char *path, const StTensor *t, const int *hint, Layout *l, char *err, size_t err_size)
{
    char shape[160];
    const long long *s = t->shape;
    if (strcmp(t->dtype, "U8") && strcmp(t->dtype, "F32")) {
        set_err(err, err_size, "%s: `images` is %s, which mgc does not read: U8 pixels (0..255, scaled by 1/255 "
                "as ToTensor does) or F32 values (used as they are); convert it, e.g. images.to(torch.float32)",
                path, t->dtype);
        return -1;
    }
    if (t->nd == 3) {
        *l = (Layout){ s[0], 1, s[1], s[2], false };
    } else if (t->nd == 4) {
        bool nhwc = small_channels(s[3]) && !small_channels(s[1]);
        if (hint && s[1] == hint[0] && s[2] == hint[1] && s[3] == hint[2]) nhwc = false;
        else if (hint && s[3] == hint[0] && s[1] == hint[1] && s[2] == hint[2]) nhwc = true;
        *l = nhwc ? (Layout){ s[0], s[3], s[1], s[2], true } : (Layout){ s[0], s[1], s[2], s[3], false };
    } else {
        set_err(err, err_size, "%s: `images` has %d dimensions, shape %s: mgc reads [N, C, H, W], [N, H, W, C] "
                "(C = 1, 3 or 4) or [N, H, W]", path, t->nd, shape_str(t, shape, sizeof shape));
        return -1;
    }
    shape_str(t, shape, sizeof shape);
    if (l->n < 1 || l->n > 100000000) {
        set_err(err, err_size, "%s: `images` %s holds %s examples: mgc needs 1 to 100,000,000", path, shape,
                l->n < 1 ? "no" : "too many");
        return -1;
    }
    if (l->c < 1 || l->c > DATA_MAX_CHANNELS) {
        set_err(err, err_size, "%s: `images` %s, read as [N, C, H, W], has %lld channels: mgc takes 1 to %d", path,
                shape, l->c, DATA_MAX_CHANNELS);
        return -1;
    }
    if (l->h < 1 || l->w < 1 || l->h > ST_MAX_SIDE || l->w > ST_MAX_SIDE) {
        set_err(err, err_size, "%s: `images` %s has images of %lldx%lld: rows and columns must be 1 to %d", path,
                shape, l->h, l->w, ST_MAX_SIDE);
        return -1;
    }
    return 0;
}

/* The labels tensor as ints into *out (malloc'd): 0, or -1 with err set. */
static int read_labels(const char *path, const StTensor *t, long long n, int **out, char *err, size_t err_size)
{
    char shape[160];
    int es = !strcmp(t->dtype, "U8") ? 1 : !strcmp(t->dtype, "I32") ? 4 : !strcmp(t->dtype, "I64") ? 8 : 0;
    if (!es) {
        set_err(err, err_size, "%s: `labels` is %s, which mgc does not read: class indices 0..K-1 as U8, I32 or "
                "I64; convert them, e.g. labels.to(torch.int64)", path, t->dtype);
        return -1;
    }
    if (t->nd != 1 || t->shape[0] != n) {
        set_err(err, err_size, "%s: `labels` has shape %s, but `images` holds %lld examples: one label each, [%lld]",
                path, shape_str(t, shape, sizeof shape), n, n);
        return -1;
    }
    if (!(*out = malloc(sizeof(int) * (size_t)n))) {
        set_err(err, err_size, "%s: out of memory for %lld labels", path, n);
        return -1;
    }
    const unsigned char *p = t->data;
    for (long long i = 0; i < n; i++) {
        int32_t v32;
        int64_t v = 0;
        if (es == 1) v = p[i];
        else if (es == 4) memcpy(&v32, p + 4 * i, 4), v = v32;
        else memcpy(&v, p + 8 * i, 8);
        if (v < 0 || v >= DATA_MAX_CLASSES) {
            set_err(err, err_size, "%s: label %lld of example %lld is %s: labels are class indices 0..K-1 (K at "
                    "most %d)", path, (long long)v, i, v < 0 ? "negative" : "too large", DATA_MAX_CLASSES);
            return -1;
        }
        (*out)[i] = (int)v;
    }
    return 0;
}

/* d's images from t, channel-planar: t's data taken over, or transposed from
   [N, H, W, C]. F32 values must be finite. */
static int take_images(const char *path, StTensor *t, const Layout *l, Dataset *d, char *err, size_t err_size)
{
    bool f32 = !strcmp(t->dtype, "F32");
    size_t plane = (size_t)l->h * (size_t)l->w, C = (size_t)l->c, per = C * plane, n = (size_t)l->n;
    void *data = t->data;
    if (l->nhwc && C > 1) {
        if (!(data = malloc(t->nbytes))) {
            set_err(err, err_size, "%s: out of memory for %zu bytes of images", path, t->nbytes);
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            for (size_t c = 0; c < C; c++)
                for (size_t p = 0; p < plane; p++) {
                    size_t to = i * per + c * plane + p, from = i * per + p * C + c;
                    if (f32) ((float *)data)[to] = ((const float *)t->data)[from];
                    else ((unsigned char *)data)[to] = ((const unsigned char *)t->data)[from];
                }
    } else {
        t->data = NULL;   /* taken over: st_free leaves it */
    }
    d->n = (int)l->n, d->channels = (int)l->c, d->rows = (int)l->h, d->cols = (int)l->w;
    if (!f32) {
        d->pixels = data;
        return 0;
    }
    d->values = data;
    for (size_t j = 0; j < n * per; j++)
        if (!isfinite(d->values[j])) {
            set_err(err, err_size, "%s: `images` holds %s at example %zu (channel %zu, row %zu, column %zu): "
                    "every value must be finite", path, isnan(d->values[j]) ? "NaN" : "an infinity", j / per,
                    j % per / plane, j % plane / (size_t)l->w, j % (size_t)l->w);
            return -1;
        }
    return 0;
}

/* One file into d; *dtype: its images' dtype; digest: of its images' and
   labels' data (what the data set is; the header and any other tensor are
   not used). */
static int load_file(const char *path, Dataset *d, char dtype[8], bool labels_optional, const int *hint, DataDigest *digest,
                     char *err, size_t err_size)
{
    StFile f;
    Layout l;
    if (st_load(path, &f, err, err_size) < 0) return -1;
    StTensor *images = need(&f, path, "images", err, err_size), *labels = NULL;
    if (images && !(labels_optional && !st_find(&f, "labels"))) labels = need(&f, path, "labels", err, err_size);
    int rc = images && (labels || labels_optional) ? images_layout(path, images, hint, &l, err, err_size) : -1;
    if (!rc) {
        data_digest_start(digest, path);
        data_digest_add(digest, images->data, images->nbytes);
        if (labels) data_digest_add(digest, labels->data, labels->nbytes);
    }
    if (!rc && labels) rc = read_labels(path, labels, l.n, &d->labels, err, err_size);
    else if (!rc && !(d->labels = calloc((size_t)l.n, sizeof(int)))) {   /* none: every example's class 0, never reported */
        set_err(err, err_size, "%s: out of memory for %lld examples", path, l.n);
        rc = -1;
    }
    if (!rc) rc = take_images(path, images, &l, d, err, err_size);
    if (!rc) memcpy(dtype, images->dtype, 8);
    st_free(&f);
    return rc;
}

int st_data_load(const DataFiles *f, Dataset *train, Dataset *test, bool *floats, DataDigest *digest, char *err,
                 size_t err_size)
{
    char a[8], b[8];
    if (load_file(f->path[0], train, a, false, NULL, &digest[0], err, err_size) < 0 ||
        load_file(f->path[1], test, b, false, NULL, &digest[1], err, err_size) < 0)
        return -1;
    if (strcmp(a, b)) {
        /* the two would be on different scales (pixels / 255 and values as they are) */
        set_err(err, err_size, "%s holds %s images but %s holds %s: save both the same way (U8 pixels, or F32 "
                "values)", f->path[0], a, f->path[1], b);
        return -1;
    }
    *floats = !strcmp(a, "F32");
    return 0;
}

int st_data_describe(const char *path, DataInfo *info, char *err, size_t err_size)
{
    StFile f;
    Layout l;
    if (st_load_header(path, &f, err, err_size) < 0) return -1;
    StTensor *images = need(&f, path, "images", err, err_size);
    int rc = images ? images_layout(path, images, NULL, &l, err, err_size) : -1;
    if (!rc) {
        info->channels = (int)l.c, info->rows = (int)l.h, info->cols = (int)l.w;
        info->floats = !strcmp(images->dtype, "F32");
    }
    st_free(&f);
    return rc;
}

int st_data_size(const DataFiles *f, size_t *bytes, long long *examples)
{
    size_t kept = 0, passing = 0;
    long long most = 0;
    *examples = 0;
    for (int k = 0; k < 2; k++) {
        StFile sf;
        Layout l;
        char err[512];
        if (st_load_header(f->path[k], &sf, err, sizeof err) < 0) return -1;
        const StTensor *images = st_find(&sf, "images"), *labels = st_find(&sf, "labels");
        int rc = images && labels ? images_layout(f->path[k], images, NULL, &l, err, sizeof err) : -1;
        if (!rc) {
            /* kept: the images (taken over, or their channel-planar copy) and an int a label;
               while a file loads, its labels as stored and, for [N, H, W, C], the images twice */
            kept += images->nbytes + (size_t)l.n * sizeof(int);
            size_t p = labels->nbytes + (l.nhwc && l.c > 1 ? images->nbytes : 0);
            if (p > passing) passing = p;
            *examples += l.n;
            if (l.n > most) most = l.n;
        }
        st_free(&sf);
        if (rc) return -1;
    }
    *bytes = kept + passing + (size_t)most * sizeof(int);
    return 0;
}

int st_data_load_one(const char *path, const int *hint, Dataset *d, bool *floats, bool *labelled, DataDigest *digest, char *err,
                     size_t err_size)
{
    char dtype[8];
    StFile f;
    *labelled = false;
    if (st_load_header(path, &f, err, err_size) < 0) return -1;
    *labelled = st_find(&f, "labels") != NULL;
    st_free(&f);
    if (load_file(path, d, dtype, true, hint, digest, err, err_size) < 0) return -1;
    *floats = !strcmp(dtype, "F32");
    int classes = 0;
    for (int i = 0; *labelled && i < d->n; i++)
        if (d->labels[i] >= classes) classes = d->labels[i] + 1;
    d->classes = classes;
    return 0;
}
