/*
** The sgemm roof of this machine: OpenBLAS's single-precision GEMM on
** square matrices (default 2048), on T threads, best of a few runs, in
** GFLOP/s. bench/bench_cpu.py builds and runs it in the same run as the
** benchmarks it is the yardstick for.
**
**   cc -O2 -o build/sgemm_roof bench/sgemm_roof.c -lopenblas
**   build/sgemm_roof THREADS [N]      prints "GFLOPS <value> core <OpenBLAS core>"
*/
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

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1, n = argc > 2 ? atoi(argv[2]) : 2048;
    if (threads < 1 || n < 64) {
        fprintf(stderr, "usage: sgemm_roof THREADS [N >= 64]\n");
        return 2;
    }
    openblas_set_num_threads(threads);
    float *a = malloc(sizeof(float) * (size_t)n * n), *b = malloc(sizeof(float) * (size_t)n * n);
    float *c = malloc(sizeof(float) * (size_t)n * n);
    if (!a || !b || !c) return 1;
    for (long i = 0; i < (long)n * n; i++) a[i] = (float)(i % 7) * 0.25f, b[i] = (float)(i % 5) * 0.5f, c[i] = 0;
    double best = 0;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double gf = 2.0 * n * n * (double)n / (now() - t0) / 1e9;
        if (rep > 0 && gf > best) best = gf;   /* the first run warms caches and threads */
    }
    printf("GFLOPS %.1f core %s\n", best, openblas_get_corename());
    free(a); free(b); free(c);
    return 0;
}
