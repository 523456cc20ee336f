/*
** KArgs: what every generated kernel receives, defined once. The runtime
** uses the struct; the preludes (codegen/prelude.c) paste the same field
** list as text into the generated source, so the two cannot drift apart.
*/
#ifndef MGC_KARGS_H
#define MGC_KARGS_H

#define CG_KARGS_FIELDS                                                                     \
    float *t[8];              /* buffers, in the order the kernel names them */             \
    long batch;               /* N: the examples of this step on this replica */            \
    long global_batch;        /* the examples of this step on every replica together */     \
    long first;               /* this replica's first example within the global batch */    \
    float f[4];               /* run-time scalars (learning rate, ...) */                   \
    unsigned long long seed;  /* fresh per run, for dropout */                              \
    int thread, nthreads;     /* C only: this call's share of the FOR_EACH */

typedef struct KArgs { CG_KARGS_FIELDS } KArgs;

#define CG_STR_(...) #__VA_ARGS__
#define CG_STR(...) CG_STR_(__VA_ARGS__)
/* "typedef struct KArgs { ... } KArgs;" as C text (comments are gone by then) */
#define CG_KARGS_TEXT "typedef struct KArgs { " CG_STR(CG_KARGS_FIELDS) " } KArgs;\n"

#endif
