/*
** mgc_predict: the exported library's example program.
**
**   mgc_predict [--threads T | --device D] [--weights FILE] IN.safetensors OUT.safetensors
**
** reads IN's `images` (U8 pixels, each divided by 255 as ToTensor does, or
** F32 values used as they are; [N, C, H, W], [N, H, W, C] where the last
** dimension is 1, 3 or 4 and the second is not, or [N, H, W] for one
** channel), predicts them with the model (model.h: its transform applied,
** its weights from --weights, default model.safetensors beside this
** program) and writes their logits to OUT as `logits` [N, MODEL_CLASSES]
** F32. Status 0, 1 (the model, the files) or 2 (the command line).
*/
#define _POSIX_C_SOURCE 200809L   /* clock_gettime */
#include "model.h"
#include "model_st.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int usage(const char *why)
{
    fprintf(stderr, "mgc_predict: %s\nusage: mgc_predict [%s] [--weights FILE] IN.safetensors OUT.safetensors\n", why,
            MODEL_CUDA ? "--device D" : "--threads T");
    return 2;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* IN's images as the model takes them, [n, C, H, W] floats (malloc), or NULL with err */
static float *read_images(const char *path, long *n, char *err, size_t err_size)
{
    mgc_st_file f;
    if (mgc_st_read(path, &f, err, err_size)) return NULL;
    const mgc_st_tensor *t = mgc_st_find(&f, "images");
    long long N = 0, C = 1, H = 0, W = 0;
    int nhwc = 0;
    if (t && t->nd == 4) {
        N = t->shape[0], C = t->shape[1], H = t->shape[2], W = t->shape[3];
        long long last = t->shape[3], second = t->shape[1];
        if ((last == 1 || last == 3 || last == 4) && !(second == 1 || second == 3 || second == 4))
            nhwc = 1, C = last, H = t->shape[1], W = t->shape[2];
    } else if (t && t->nd == 3) {
        N = t->shape[0], H = t->shape[1], W = t->shape[2];
    }
    bool u8 = t && !strcmp(t->dtype, "U8"), f32 = t && !strcmp(t->dtype, "F32");
    if (!t || (t->nd != 3 && t->nd != 4) || (!u8 && !f32)) {
        snprintf(err, err_size, "%s: no `images` tensor of U8 or F32 in 3 or 4 dimensions", path);
        mgc_st_free(&f);
        return NULL;
    }
    if (C != MODEL_INPUT_C || H != MODEL_INPUT_H || W != MODEL_INPUT_W) {
        snprintf(err, err_size, "%s: images of %lldx%lldx%lld; the model takes %dx%dx%d (C x H x W)", path, C, H, W,
                 MODEL_INPUT_C, MODEL_INPUT_H, MODEL_INPUT_W);
        mgc_st_free(&f);
        return NULL;
    }
    size_t per = (size_t)C * (size_t)H * (size_t)W, plane = (size_t)H * (size_t)W;
    float *x = malloc(sizeof(float) * (N > 0 ? (size_t)N * per : 1));
    if (!x) {
        snprintf(err, err_size, "out of memory for %lld images", N);
        mgc_st_free(&f);
        return NULL;
    }
    const unsigned char *b = mgc_st_data(&f, t);
    const float *v = mgc_st_data(&f, t);
    for (size_t i = 0; i < (size_t)N; i++)
        for (size_t c = 0; c < (size_t)C; c++)
            for (size_t j = 0; j < plane; j++) {
                size_t from = nhwc ? (i * plane + j) * (size_t)C + c : (i * (size_t)C + c) * plane + j;
                float value;
                if (u8) value = (float)b[from] / 255.0f;
                else memcpy(&value, v + from, sizeof value);   /* the data may be unaligned */
                x[i * per + c * plane + j] = value;
            }
    mgc_st_free(&f);
    *n = (long)N;
    return x;
}

int main(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *weights = NULL;
    int where = 0;   /* the GPU's ordinal, or the threads (0: every core) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], MODEL_CUDA ? "--device" : "--threads") && i + 1 < argc) where = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--weights") && i + 1 < argc) weights = argv[++i];
        else if (argv[i][0] == '-') return usage("unknown option");
        else if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else return usage("too many files");
    }
    if (!in || !out) return usage("give IN.safetensors and OUT.safetensors");
    char path[4096], err[512];
    if (!weights) {   /* beside this program */
        const char *slash = strrchr(argv[0], '/');
        snprintf(path, sizeof path, "%.*smodel.safetensors", slash ? (int)(slash - argv[0] + 1) : 0, argv[0]);
        weights = path;
    }
    long n = 0;
    float *x = read_images(in, &n, err, sizeof err);
    if (!x) {
        fprintf(stderr, "mgc_predict: %s\n", err);
        return 1;
    }
    mgc_model *m = mgc_model_new(weights, where, err, sizeof err);
    if (!m) {
        fprintf(stderr, "mgc_predict: %s\n", err);
        free(x);
        return 1;
    }
    float *logits = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1) * MODEL_CLASSES);
    double t0 = now();
    int rc = logits ? mgc_model_predict(m, x, n, logits) : -1;
    double secs = now() - t0;
    if (rc) fprintf(stderr, "mgc_predict: %s\n", logits ? mgc_model_error(m) : "out of memory for the logits");
    long long shape[2] = { n, MODEL_CLASSES };
    if (!rc && (rc = mgc_st_write1(out, "logits", "F32", 2, shape, logits, sizeof(float) * (size_t)n * MODEL_CLASSES, err,
                                   sizeof err)))
        fprintf(stderr, "mgc_predict: %s\n", err);
    if (!rc) printf("mgc_predict: %ld images in %.3f s (%.0f images/s): %s\n", n, secs, secs > 0 ? (double)n / secs : 0.0, out);
    mgc_model_free(m);
    free(logits);
    free(x);
    return rc ? 1 : 0;
}
