/*
** The state of one elaboration, which the whole-file checks
** (frontend/check.c, check.h), the built-in layers (frontend/layers.c,
** layers.h) and the interpreter that runs the net (frontend/elab.c) share.
** Not for use outside frontend/; the front end's public interface is
** frontend.h. The calls go one way: elab.c -> check.c -> layers.c.
*/
#ifndef MGC_FE_ELAB_INTERNAL_H
#define MGC_FE_ELAB_INTERNAL_H
#include "frontend.h"
#include "ast.h"

/* ---- the state of one elaboration ---- */

typedef struct NameSlot { const char *name; Loc loc; } NameSlot;

typedef struct Elab {
    Graph *g;
    Arena *a;
    Diag *d;
    FeDef *defs;
    FeDef *net;
    long iters, steps;
    int depth;
    int nesting;             /* expressions and statement lists being evaluated, all block instances together */
    const char *stack_top;   /* an address near the stack's top when elaboration began */
    long stack_budget;       /* bytes of stack elaboration may use below it */
    NameSlot *names;         /* open-addressing set of used parameter prefixes */
    int names_n, names_cap;
    Loc loss_loc;
    int loss_node;
    int notes;               /* "in block instance" notes printed for the current error */
} Elab;

#endif
