/*
** The bf16 GEMM against the fp32 one, on one thread: mgc_sbgemm
** (runtime/bgemm.c, the path the CPU takes: avx512_bf16 where it has it) and
** OpenBLAS's cblas_sgemm, on a square product and on the shapes convolutions
** give (row-major; M output channels, N output positions, K = 9 Cin or Cin):
** the forward and input-gradient GEMMs (NN), the weight gradient (NT, K the
** positions) and the Winograd form (16 products of M = Cout, N = tiles,
** K = Cin). Best of a few runs, in GFLOP/s.
**
**   cc -O2 -D_GNU_SOURCE -o build/sbgemm_roof bench/sbgemm_roof.c runtime/bgemm.c -lopenblas -lm
**   OPENBLAS_CORETYPE=SkylakeX build/sbgemm_roof
*/
#include "../runtime/bgemm.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int);
char *openblas_get_corename(void);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    const char *what;
    int ta, tb, m, n, k, count;   /* count products of this shape per run (Winograd: 16) */
} Shape;

typedef void Gemm(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

static void sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                  int ldb, float beta, float *c, int ldc)
{
    cblas_sgemm((enum CBLAS_ORDER)order, (enum CBLAS_TRANSPOSE)ta, (enum CBLAS_TRANSPOSE)tb, m, n, k, alpha, a, lda, b,
                ldb, beta, c, ldc);
}

/* best GFLOP/s of runs of about 0.1 s each over 0.6 s */
static double rate(Gemm *f, const Shape *s, const float *a, const float *b, float *c)
{
    int lda = s->ta == CblasTrans ? s->m : s->k, ldb = s->tb == CblasTrans ? s->k : s->n;
    long sa = (long)s->m * s->k, sb = (long)s->k * s->n, sc = (long)s->m * s->n;
    double flops = 2.0 * s->m * s->n * (double)s->k * s->count, best = 0, t_end = now() + 0.6;
    int reps = 1;
    for (int run = 0; run < 100 && (run < 3 || now() < t_end); run++) {
        double t0 = now();
        for (int r = 0; r < reps; r++)
            for (int g = 0; g < s->count; g++)
                f(CblasRowMajor, s->ta, s->tb, s->m, s->n, s->k, 1.0f, a + g * sa, lda, b + g * sb, ldb, 0.0f,
                  c + g * sc, s->n);
        double dt = now() - t0, gf = flops * reps / dt / 1e9;
        if (run > 0 && gf > best)   /* the first run warms caches */
            best = gf;
        if (dt < 0.05)
            reps *= 2;
    }
    return best;
}

int main(void)
{
    static const Shape shapes[] = {
        {"square", CblasNoTrans, CblasNoTrans, 2048, 2048, 2048, 1},
        {"conv NN", CblasNoTrans, CblasNoTrans, 64, 3136, 576, 1},
        {"conv NN", CblasNoTrans, CblasNoTrans, 128, 784, 1152, 1},
        {"conv NN", CblasNoTrans, CblasNoTrans, 256, 196, 2304, 1},
        {"conv NN", CblasNoTrans, CblasNoTrans, 512, 49, 4608, 1},
        {"wgrad NT", CblasNoTrans, CblasTrans, 64, 576, 3136, 1},
        {"wgrad NT", CblasNoTrans, CblasTrans, 128, 1152, 784, 1},
        {"dgrad TN", CblasTrans, CblasNoTrans, 576, 3136, 64, 1},
        {"dgrad TN", CblasTrans, CblasNoTrans, 1152, 784, 128, 1},
        {"winograd", CblasNoTrans, CblasNoTrans, 64, 1024, 64, 16},
        {"winograd", CblasNoTrans, CblasNoTrans, 128, 256, 128, 16},
    };
    openblas_set_num_threads(1);
    long most = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const Shape *s = &shapes[i];
        long need = (long)s->count * ((long)s->m * s->k + (long)s->k * s->n + (long)s->m * s->n);
        most = need > most ? need : most;
    }
    float *mem = malloc(sizeof(float) * (size_t)most);
    if (!mem)
        return 1;
    for (long i = 0; i < most; i++)
        mem[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    printf("bf16 path: %s; OpenBLAS core %s; one thread; GFLOP/s\n", mgc_bf16_path(), openblas_get_corename());
    printf("%-9s %5s %5s %5s %3s %10s %10s %6s\n", "form", "M", "N", "K", "x", "sbgemm", "sgemm", "ratio");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const Shape *s = &shapes[i];
        float *a = mem, *b = a + (long)s->count * s->m * s->k, *c = b + (long)s->count * s->k * s->n;
        double bf = rate(mgc_sbgemm, s, a, b, c), fp = rate(sgemm, s, a, b, c);
        printf("%-9s %5d %5d %5d %3d %10.1f %10.1f %6.2f\n", s->what, s->m, s->n, s->k, s->count, bf, fp, bf / fp);
        fflush(stdout);
    }
    free(mem);
    return 0;
}
