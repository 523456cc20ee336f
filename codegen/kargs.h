/*
** KArgs: what every generated kernel receives, by value. The field list is
** written once, here; it makes both the C struct the runtime fills
** (runtime/exec.c) and the declaration in the kernels' prelude text
** (codegen/prelude.c, which prints each row with its comment), so the
** host's and the kernels' layouts cannot drift apart.
*/
#ifndef MGC_KARGS_H
#define MGC_KARGS_H
#include "codegen.h"

/* One row per field: F("comment", declaration); a declaration may name several fields. */
#define CG_KARGS_FIELDS(F)                                                   \
    F("buffers, in the order the kernel names them", float *t[CG_MAXARGS])  \
    F("N, the examples of this step on this replica", long batch)            \
    F("the examples of this step on every replica together", long global_batch) \
    F("this replica's first example within the global batch", long first)    \
    F("fresh per run, for dropout", unsigned long long seed)                 \
    F("C only: this call's share of the FOR_EACH", int thread, nthreads)         \
    F("--shard-update: the chunk of each bucket this replica owns (rt_comm_owner)", int replica)

#define CG_KARGS_DECLARE_(comment, ...) __VA_ARGS__;
typedef struct KArgs {
    CG_KARGS_FIELDS(CG_KARGS_DECLARE_)
} KArgs;

/* The text of a declaration, its macros expanded: "float *t[8]". */
#define CG_STR_(...) #__VA_ARGS__
#define CG_STR(...) CG_STR_(__VA_ARGS__)

#endif
