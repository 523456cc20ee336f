/*
** The loader's transforms (see transform.h): resize, random crop and flip,
** normalisation, one image at a time on the thread that gathers the batch.
*/
#include "transform.h"
#include "errbuf.h"
#include "rng.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool transform_active(const Transform *t)
{
    return t && (t->out_h > 0 || t->crop_pad > 0 || t->flip || t->normalize || t->crop_scale > 0 || t->rotate > 0 ||
                 t->translate > 0 || t->erase > 0);
}

/* The mean and standard deviation of channel c over every pixel of every
   image: bytes through a histogram, exactly; floats in double. */
static void channel_stats(const Dataset *d, int c, double *mean, double *sd)
{
    int C = d->channels;
    size_t plane = (size_t)d->rows * d->cols;
    double n = (double)d->n * plane, sum = 0, ss = 0;
    if (d->values) {
        for (long i = 0; i < d->n; i++)
            for (size_t j = 0, at = ((size_t)i * C + c) * plane; j < plane; j++) sum += d->values[at + j];
        *mean = n > 0 ? sum / n : 0;
        for (long i = 0; i < d->n; i++)
            for (size_t j = 0, at = ((size_t)i * C + c) * plane; j < plane; j++)
                ss += ((double)d->values[at + j] - *mean) * ((double)d->values[at + j] - *mean);
        *sd = n > 0 ? sqrt(ss / n) : 1;
        return;
    }
    unsigned long long hist[256] = { 0 };
    for (long i = 0; i < d->n; i++) {
        const unsigned char *p = d->pixels + ((size_t)i * C + c) * plane;
        for (size_t j = 0; j < plane; j++) hist[p[j]]++;
    }
    for (int v = 0; v < 256; v++) sum += (double)hist[v] * v / 255.0;
    *mean = n > 0 ? sum / n : 0;
    for (int v = 0; v < 256; v++) ss += (double)hist[v] * (v / 255.0 - *mean) * (v / 255.0 - *mean);
    *sd = n > 0 ? sqrt(ss / n) : 1;
}

int transform_fit(Transform *t, const Dataset *d, char *err, size_t err_size)
{
    if (!t->normalize) return 0;
    if (t->given) {   /* the values given (ImageNet's, say): for the data's channels, each of them */
        if (t->given != d->channels) {
            set_err(err, err_size, "--normalize= gives the mean and std of %d channel%s, and the images have %d: give %d mean%s, "
                    "then %d standard deviation%s", t->given, t->given == 1 ? "" : "s", d->channels, d->channels,
                    d->channels == 1 ? "" : "s", d->channels, d->channels == 1 ? "" : "s");
            return -1;
        }
        return 0;
    }
    for (int c = 0; c < d->channels && c < TRANSFORM_MAX_CHANNELS; c++) {
        double mean, sd;
        channel_stats(d, c, &mean, &sd);
        t->mean[c] = (float)mean;
        t->std[c] = sd > 0 ? (float)sd : 1.0f;   /* a constant channel stays as it is, shifted */
        if (sd > 0 && t->std[c] == 0) {   /* not constant, but too nearly so for float32: x / 0 */
            set_err(err, err_size, "--normalize: channel %d of the training images has standard deviation %.3g, which rounds "
                    "to 0 in float32: dividing by it would make infinities; the channel is nearly constant: scale its "
                    "values up, or train without --normalize", c, sd);
            return -1;
        }
    }
    return 0;
}

void transform_shape(const Transform *t, const Dataset *d, int *c, int *h, int *w)
{
    *c = d->channels;
    *h = t && t->out_h > 0 ? t->out_h : d->rows;
    *w = t && t->out_w > 0 ? t->out_w : d->cols;
}

void transform_taps(int in, int out, Tap *taps)
{
    float scale = (float)in / (float)out;
    for (int i = 0; i < out; i++) {
        float src = scale * ((float)i + 0.5f) - 0.5f;
        if (src < 0) src = 0;
        int i0 = (int)src;
        taps[i] = (Tap){ i0, i0 < in - 1 ? 1 : 0, src - (float)i0 };
    }
}

/* The 32-bit draw k of example `index` in epoch `epoch` of run `seed`. */
static unsigned int draw(unsigned long long seed, int epoch, long index, int k)
{
    unsigned long long key = seed ^ (0x4155474D454E54ULL + (unsigned long long)(long long)epoch * 0x9E3779B97F4A7C15ULL);
    return rng_hash(key, (unsigned long long)index * 4 + (unsigned long long)k);
}

/* Uniform in [0, n) from 32 random bits (multiply-shift; n is small). */
static int below(unsigned int r, int n) { return (int)(((unsigned long long)r * (unsigned)n) >> 32); }

/* The draws of the augmentations after crop and flip: a stream of their own (128 an example) */
static double uniform(unsigned long long seed, int epoch, long index, int k, double lo, double hi)
{
    unsigned long long key = seed ^ (0x4155474D32ULL + (unsigned long long)(long long)epoch * 0xD1B54A32D192ED03ULL);
    return lo + (hi - lo) * (double)rng_hash(key, (unsigned long long)index * 128 + (unsigned long long)k) / 4294967296.0;
}

static int rounded(double v) { return (int)floor(v + 0.5); }

/* RandomResizedCrop's window (torchvision's draws: 10 tries, then the centre), resized back to H x W
   bilinearly, in place on img [C, H, W]; tmp: C * H * W floats */
static void crop_resize(const Transform *t, float *img, int C, int H, int W, unsigned long long seed, int epoch, long k, float *tmp)
{
    int top = 0, left = 0, h = H, w = W;
    bool found = false;
    for (int tr = 0; tr < 10 && !found; tr++) {
        double area = (double)H * W * uniform(seed, epoch, k, 4 * tr, t->crop_scale, 1.0);
        double ratio = exp(uniform(seed, epoch, k, 4 * tr + 1, log(3.0 / 4.0), log(4.0 / 3.0)));
        w = rounded(sqrt(area * ratio)), h = rounded(sqrt(area / ratio));
        if (w > 0 && w <= W && h > 0 && h <= H) {
            top = (int)uniform(seed, epoch, k, 4 * tr + 2, 0, H - h + 1), left = (int)uniform(seed, epoch, k, 4 * tr + 3, 0, W - w + 1);
            found = true;
        }
    }
    if (!found) {   /* the centre, its aspect clamped to the range */
        double in = (double)W / H;
        w = W, h = H;
        if (in < 3.0 / 4.0) h = rounded(W / (3.0 / 4.0));
        else if (in > 4.0 / 3.0) w = rounded(H * (4.0 / 3.0));
        top = (H - h) / 2, left = (W - w) / 2;
    }
    Tap ty[4096], tx[4096];
    if (H > 4096 || W > 4096) return;
    transform_taps(h, H, ty), transform_taps(w, W, tx);
    memcpy(tmp, img, sizeof(float) * (size_t)C * H * W);
    for (int c = 0; c < C; c++)   /* the window's planes: rows W apart, from (top, left) */
        transform_resize_plane(tmp + (size_t)c * H * W + (size_t)top * W + left, W, ty, tx, H, W, img + (size_t)c * H * W);
}

/* RandomRotation and RandomAffine's translation as one map, in place on img: output pixel (x, y) reads
   the input at the rotation back by the angle about the centre ((W - 1) / 2, (H - 1) / 2) of (x - tx,
   y - ty), the nearest pixel, 0 outside (before normalisation: torchvision's fill 0) */
static void affine(const Transform *t, float *img, int C, int H, int W, unsigned long long seed, int epoch, long k, float *tmp)
{
    double a = t->rotate > 0 ? uniform(seed, epoch, k, 40, -t->rotate, t->rotate) * M_PI / 180.0 : 0.0;
    int dx = t->translate > 0 ? rounded(uniform(seed, epoch, k, 41, -t->translate * W, t->translate * W)) : 0;
    int dy = t->translate > 0 ? rounded(uniform(seed, epoch, k, 42, -t->translate * H, t->translate * H)) : 0;
    double cs = cos(a), sn = sin(a), cx = (W - 1) * 0.5, cy = (H - 1) * 0.5;
    memcpy(tmp, img, sizeof(float) * (size_t)C * H * W);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            double u = x - dx - cx, v = y - dy - cy;
            int sx = rounded(cs * u + sn * v + cx), sy = rounded(-sn * u + cs * v + cy);
            bool in = sx >= 0 && sx < W && sy >= 0 && sy < H;
            for (int c = 0; c < C; c++)
                img[(size_t)c * H * W + (size_t)y * W + x] = in ? tmp[(size_t)c * H * W + (size_t)sy * W + sx] : 0.0f;
        }
}

/* RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0) on dst [C, H, W], after normalisation */
static void erase(const Transform *t, float *dst, int C, int H, int W, unsigned long long seed, int epoch, long k)
{
    if (uniform(seed, epoch, k, 43, 0, 1) >= t->erase) return;
    for (int tr = 0; tr < 10; tr++) {
        double area = (double)H * W * uniform(seed, epoch, k, 44 + 4 * tr, 0.02, 0.33);
        double ratio = exp(uniform(seed, epoch, k, 45 + 4 * tr, log(0.3), log(3.3)));
        int h = rounded(sqrt(area * ratio)), w = rounded(sqrt(area / ratio));
        if (!(h < H && w < W) || h < 1 || w < 1) continue;
        int top = (int)uniform(seed, epoch, k, 46 + 4 * tr, 0, H - h + 1), left = (int)uniform(seed, epoch, k, 47 + 4 * tr, 0, W - w + 1);
        for (int c = 0; c < C; c++)
            for (int r = top; r < top + h; r++) memset(dst + (size_t)c * H * W + (size_t)r * W + left, 0, sizeof(float) * (size_t)w);
        return;
    }
}

/* Channel c of example k as floats: byte / 255 into buf, or the values as stored. */
static const float *source_plane(const Dataset *d, long k, int c, float *buf)
{
    size_t in_plane = (size_t)d->rows * d->cols, at = ((size_t)k * d->channels + c) * in_plane;
    if (d->values) return d->values + at;
    const unsigned char *s = d->pixels + at;
    for (size_t j = 0; j < in_plane; j++) buf[j] = (float)s[j] / 255.0f;
    return buf;
}

void transform_resize_plane(const float *s, int IW, const Tap *ty, const Tap *tx, int H, int W, float *o)
{
    for (int r = 0; r < H; r++) {
        const float *r0 = s + (size_t)ty[r].i0 * IW, *r1 = r0 + (size_t)ty[r].step * IW;
        float ly = ty[r].l, hy = 1.0f - ly;
        for (int q = 0; q < W; q++) {
            int c0 = tx[q].i0, c1 = c0 + tx[q].step;
            float lx = tx[q].l, hx = 1.0f - lx;
            o[(size_t)r * W + q] = hy * (hx * r0[c0] + lx * r0[c1]) + ly * (hx * r1[c0] + lx * r1[c1]);
        }
    }
}

/* Example k at H x W into img [C, H, W]: resized through the taps ty and tx,
   or as stored where they are NULL. buf: a plane of the stored size. */
static void resize_example(const Dataset *d, long k, int H, int W, const Tap *ty, const Tap *tx, float *buf, float *img)
{
    int IW = d->cols;
    size_t plane = (size_t)H * W;
    for (int c = 0; c < d->channels; c++) {
        const float *s = source_plane(d, k, c, buf);
        float *o = img + (size_t)c * plane;
        if (!ty) memcpy(o, s, sizeof(float) * plane);
        else transform_resize_plane(s, IW, ty, tx, H, W, o);
    }
}

/* The window at (oy, ox) of img [C, H, W] after P zeros around, flipped or
   not, normalised by t, into dst [C, H, W]. */
static void place_example(const Transform *t, const float *img, int C, int H, int W, int P, int oy, int ox, bool flip,
                          float *dst)
{
    size_t plane = (size_t)H * W;
    for (int c = 0; c < C; c++) {
        const float *s = img + (size_t)c * plane;
        float *o = dst + (size_t)c * plane;
        float mean = t->normalize ? t->mean[c] : 0.0f, sd = t->normalize ? t->std[c] : 1.0f;
        float zero = t->normalize ? (0.0f - mean) / sd : 0.0f;   /* the padding, normalised */
        /* the window's columns q in [q0, q1) read the image (at q + ox - P, or
           flipped at W - 1 - q + ox - P); the others are padding */
        int dx = ox - P, q0 = flip ? dx : -dx, q1 = flip ? W + dx : W - dx;
        if (q0 < 0) q0 = 0;
        if (q1 > W) q1 = W;
        for (int r = 0; r < H; r++) {
            int sr = r + oy - P;   /* the window's row r, in the image (outside: the zero padding) */
            float *or = o + (size_t)r * W;
            if (sr < 0 || sr >= H || q1 <= q0) {
                for (int q = 0; q < W; q++) or[q] = zero;
                continue;
            }
            const float *sp = s + (size_t)sr * W;
            for (int q = 0; q < q0; q++) or[q] = zero;
            if (flip)
                for (int q = q0; q < q1; q++) or[q] = t->normalize ? (sp[W - 1 - q + dx] - mean) / sd : sp[W - 1 - q + dx];
            else
                for (int q = q0; q < q1; q++) or[q] = t->normalize ? (sp[q + dx] - mean) / sd : sp[q + dx];
            for (int q = q1; q < W; q++) or[q] = zero;
        }
    }
}

void transform_gather(const Transform *t, const Dataset *d, const int *order, int b, bool augment,
                      unsigned long long seed, int epoch, float *x, float *y)
{
    int C, H, W;
    transform_shape(t, d, &C, &H, &W);
    size_t plane = (size_t)H * W;
    float *img = malloc(sizeof(float) * (size_t)C * plane);   /* one example, resized */
    float *tmp = malloc(sizeof(float) * (size_t)C * plane);   /* the augmentations' copy */
    float *buf = malloc(sizeof(float) * (size_t)d->rows * d->cols);   /* one stored plane as floats */
    Tap *ty = malloc(sizeof(Tap) * (size_t)H), *tx = malloc(sizeof(Tap) * (size_t)W);
    if (!img || !tmp || !buf || !ty || !tx) {   /* a few KB: cannot fail where the data set fit */
        fprintf(stderr, "mgc: out of memory in the data loader\n");
        abort();
    }
    bool resize = H != d->rows || W != d->cols;
    if (resize) transform_taps(d->rows, H, ty), transform_taps(d->cols, W, tx);
    for (int i = 0; i < b; i++) {
        long k = order[i];
        resize_example(d, k, H, W, resize ? ty : NULL, resize ? tx : NULL, buf, img);
        if (augment && t->crop_scale > 0) crop_resize(t, img, C, H, W, seed, epoch, k, tmp);
        if (augment && (t->rotate > 0 || t->translate > 0)) affine(t, img, C, H, W, seed, epoch, k, tmp);
        int P = augment ? t->crop_pad : 0;
        int oy = P ? below(draw(seed, epoch, k, 0), 2 * P + 1) : P, ox = P ? below(draw(seed, epoch, k, 1), 2 * P + 1) : P;
        bool flip = augment && t->flip && (draw(seed, epoch, k, 2) >> 31);
        place_example(t, img, C, H, W, P, oy, ox, flip, x + (size_t)i * C * plane);
        if (augment && t->erase > 0) erase(t, x + (size_t)i * C * plane, C, H, W, seed, epoch, k);
        y[i] = (float)d->labels[k];
    }
    free(img);
    free(tmp);
    free(buf);
    free(ty);
    free(tx);
}

void transform_str(const Transform *t, char *out, size_t size)
{
    int p = 0;
    out[0] = 0;
    if (!transform_active(t)) return;
    if (t->out_h > 0) p += snprintf(out + p, size - (size_t)p, "resize %dx%d", t->out_h, t->out_w);
    if (t->crop_pad > 0 && p < (int)size) p += snprintf(out + p, size - (size_t)p, "%scrop:%d", p ? ", " : "", t->crop_pad);
    if (t->flip && p < (int)size) p += snprintf(out + p, size - (size_t)p, "%sflip", p ? ", " : "");
    if (t->crop_scale > 0 && p < (int)size) p += snprintf(out + p, size - (size_t)p, "%scrop-resize:%g", p ? ", " : "", t->crop_scale);
    if (t->rotate > 0 && p < (int)size) p += snprintf(out + p, size - (size_t)p, "%srotate:%g", p ? ", " : "", t->rotate);
    if (t->translate > 0 && p < (int)size) p += snprintf(out + p, size - (size_t)p, "%stranslate:%g", p ? ", " : "", t->translate);
    if (t->erase > 0 && p < (int)size) p += snprintf(out + p, size - (size_t)p, "%serase:%g", p ? ", " : "", t->erase);
    if (t->normalize && p < (int)size) p += snprintf(out + p, size - (size_t)p, "%snormalize", p ? ", " : "");
}
