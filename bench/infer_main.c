/*
** The exported C library's side of bench/bench_infer.py: built against a
** directory of mgc export --format c (its model.h and libmodel.a),
**
**   infer_main WEIGHTS THREADS BATCH SECONDS
**
** makes one context with THREADS threads and times mgc_model_predict on
** random images: BATCH images a call (throughput, images/s) and one image a
** call (latency, ms), each called again and again for SECONDS after a
** warm-up; prints one JSON line with the median call of each, the best and
** the calls made, and the context's creation time.
*/
#define _POSIX_C_SOURCE 200809L
#include "model.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* calls of predict on n images for `seconds` (at least 5) after `warm` calls: their median and best seconds */
static int timed(mgc_model *m, const float *x, float *y, long n, double seconds, int warm, double *median, double *best, int *calls)
{
    for (int k = 0; k < warm; k++)
        if (mgc_model_predict(m, x, n, y)) return -1;
    int cap = 1 << 20, c = 0;
    double *t = malloc(sizeof(double) * (size_t)cap), t0 = now();
    while (c < cap && (c < 5 || now() - t0 < seconds)) {
        double a = now();
        if (mgc_model_predict(m, x, n, y)) return -1;
        t[c++] = now() - a;
    }
    qsort(t, (size_t)c, sizeof *t, by_value);
    *median = t[c / 2], *best = t[0], *calls = c;
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: infer_main WEIGHTS THREADS BATCH SECONDS\n");
        return 2;
    }
    int threads = atoi(argv[2]);
    long batch = atol(argv[3]);
    double seconds = atof(argv[4]);
    long per = (long)MODEL_INPUT_C * MODEL_INPUT_H * MODEL_INPUT_W;
    float *x = malloc(sizeof(float) * (size_t)(batch * per)), *y = malloc(sizeof(float) * (size_t)(batch * MODEL_CLASSES));
    unsigned s = 12345;
    for (long i = 0; i < batch * per; i++) x[i] = (float)((s = s * 1103515245u + 12345u) >> 24) / 255.0f;
    char err[512];
    double t0 = now();
    mgc_model *m = mgc_model_new(argv[1], threads, err, sizeof err);
    double made = now() - t0;
    if (!m) {
        fprintf(stderr, "infer_main: %s\n", err);
        return 1;
    }
    double med, best, lmed, lbest;
    int calls, lcalls;
    if (timed(m, x, y, batch, seconds, 3, &med, &best, &calls) || timed(m, x, y, 1, seconds, 20, &lmed, &lbest, &lcalls)) {
        fprintf(stderr, "infer_main: %s\n", mgc_model_error(m));
        return 1;
    }
    printf("{\"images_per_s\": %.1f, \"best_images_per_s\": %.1f, \"calls\": %d, \"latency_ms\": %.4f, \"best_latency_ms\": %.4f, "
           "\"latency_calls\": %d, \"create_s\": %.3f}\n",
           (double)batch / med, (double)batch / best, calls, 1e3 * lmed, 1e3 * lbest, lcalls, made);
    mgc_model_free(m);
    free(x);
    free(y);
    return 0;
}
