/*
** Per-target preludes: the few macros every kernel body is written against.
**
**   KERNEL(name)     the kernel's signature; it takes one KArgs by value
**   FOR_EACH(i, n)   the kernel's one parallel loop over independent i in [0, n):
**                    C: this thread's contiguous share of [0, n) (the runtime
**                       calls the kernel once per thread, a.thread of a.nthreads);
**                    CUDA: a grid-stride loop
**   RESTRICT, DEVICE, MGC_INF, mgc_uniform(seed, i) (counter-based, in [0, 1))
**
** The bodies (codegen/lower.c and the op families beside it) are the same
** text for both targets.
*/
#include "codegen.h"
#include "kargs.h"
#include <string.h>

/* KArgs as the kernels see it: codegen/kargs.h's rows, one a line with its comment. */
#define KARGS_ROW(comment, ...) { CG_STR(__VA_ARGS__) ";", comment },
static const struct { const char *decl, *comment; } kargs_rows[] = { CG_KARGS_FIELDS(KARGS_ROW) };

static const char *kargs_text(Arena *a)
{
    const char *t = "typedef struct KArgs {\n";
    for (size_t k = 0; k < sizeof kargs_rows / sizeof kargs_rows[0]; k++)
        t = arena_printf(a, "%s    %-26s/* %s */\n", t, kargs_rows[k].decl, kargs_rows[k].comment);
    return arena_printf(a, "%s} KArgs;\n", t);
}

static const char prelude_common[] =
    "/* splitmix64 finaliser of (seed, i): a counter-based uniform in [0, 1) */\n"
    "static DEVICE inline float mgc_uniform(unsigned long long seed, unsigned long long i)\n"
    "{\n"
    "    unsigned long long z = seed + (i + 1) * 0x9E3779B97F4A7C15ULL;\n"
    "    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;\n"
    "    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;\n"
    "    z ^= z >> 31;\n"
    "    return (float)(z >> 40) * (1.0f / 16777216.0f);\n"
    "}\n";

static const char prelude_c[] =
    "/* mgc generated kernels, target C */\n"
    "#include <math.h>\n"
    "#define DEVICE\n"
    "#define RESTRICT restrict\n"
    "#define MGC_INF INFINITY\n"
    "#define KERNEL(name) void name\n"
    "#define FOR_EACH(i, n) \\\n"
    "    for (long i##_n = (n), i = i##_n * a.thread / a.nthreads, i##_end = i##_n * (a.thread + 1) / a.nthreads; \\\n"
    "         i < i##_end; i++)\n";

static const char prelude_cuda[] =
    "/* mgc generated kernels, target CUDA (NVRTC) */\n"
    "#define DEVICE __device__\n"
    "#define RESTRICT __restrict__\n"
    "#define MGC_INF __int_as_float(0x7f800000)\n"
    "#define KERNEL(name) extern \"C\" __global__ void name\n"
    "#define FOR_EACH(i, n) \\\n"
    "    for (long i##_n = (n), i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < i##_n; \\\n"
    "         i += (long)blockDim.x * gridDim.x)\n";

char *cg_source(const Program *p, Target t)
{
    const char *pre = t == TARGET_C ? prelude_c : prelude_cuda;
    return arena_printf(p->arena, "%s%s%s%s", pre, kargs_text(p->arena), prelude_common, p->source);
}

char *cg_kernel_source(const Program *p, int k, Target t)
{
    const Step *s = &p->steps[k];
    const char *pre = t == TARGET_C ? prelude_c : prelude_cuda;
    return arena_printf(p->arena, "%s%s%s%.*s", pre, kargs_text(p->arena), prelude_common,
                        (int)(s->src_end - s->src_begin), p->source + s->src_begin);
}

static void print_dim(FILE *out, Dim d)
{
    if (d.batch) fprintf(out, "%ld*N", d.c);
    else fprintf(out, "%ld", d.c);
}

void cg_print_steps(const Program *p, FILE *out)
{
    for (int k = 0; k < p->nsteps; k++) {
        const Step *s = &p->steps[k];
        fprintf(out, "  step %-3d %%%-4d ", k, s->node);
        if (s->kind == STEP_ALLREDUCE || s->kind == STEP_WAIT) {
            const Collective *c = &p->colls[s->coll];
            if (s->kind == STEP_WAIT) fprintf(out, "wait allreduce c%d", s->coll);
            else if (c->src == c->dst) fprintf(out, "allreduce c%d b%d (%ld floats, in place; %s)", s->coll, c->dst, c->floats, c->what);
            else fprintf(out, "allreduce c%d b%d -> b%d (%ld floats; %s)", s->coll, c->src, c->dst, c->floats, c->what);
        } else if (s->kind == STEP_KERNEL) {
            fprintf(out, "kernel %s(", s->fn);
            for (int j = 0; j < s->nargs; j++) fprintf(out, "%sb%d", j ? ", " : "", s->args[j]);
            fprintf(out, ") over ");
            print_dim(out, s->work);
        } else {
            fprintf(out, "gemm b%d[", s->c);
            print_dim(out, s->m);
            fputc(',', out);
            print_dim(out, s->n);
            fprintf(out, "] = b%d%s . b%d%s  (K = ", s->a, s->ta ? "^T" : "", s->b, s->tb ? "^T" : "");
            print_dim(out, s->k);
            fprintf(out, ")%s", s->beta != 0 ? " + C" : "");
        }
        fputc('\n', out);
    }
}
