/*
** Declarations shared by the two halves of elaboration: the whole-file
** checks (frontend/check.c) and the interpreter that runs the net
** (frontend/elab.c). Not for use outside frontend/; the front end's public
** interface is frontend.h.
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

/* ---- built-in layers ---- */

typedef enum ArgType { A_INT, A_FLOAT, A_BOOL, A_TENSOR } ArgType;

typedef struct LayerArg {
    const char *name;
    ArgType type;
    bool required;
    double def;              /* default (ints, floats, bools as 0/1); stride of pools: see DEF_KERNEL */
} LayerArg;

#define DEF_KERNEL (-12345.0)   /* default "= kernel" */

typedef enum LayerId {
    L_CONV2D, L_LINEAR, L_BATCHNORM2D, L_RELU, L_SIGMOID, L_TANH, L_MAXPOOL2D, L_AVGPOOL2D,
    L_GLOBAL_AVGPOOL, L_FLATTEN, L_DROPOUT, L_ADD, L_SOFTMAX_XENT, L_COUNT
} LayerId;

typedef struct Layer {
    const char *name;
    bool has_params;         /* creates parameters: gets a name */
    int nargs;
    LayerArg args[5];
} Layer;

extern const Layer fe_layers[L_COUNT];   /* indexed by LayerId; defined in elab.c */

/* The LayerId of the built-in layer called name, or -1. */
int fe_find_layer(const char *name);
/* The block (not the net) called name among defs, or NULL. */
FeDef *fe_find_block(FeDef *defs, const char *name);
/* The closest of cands[0..n) to name, if close enough to be a likely typo. */
const char *fe_suggest(const char *name, const char *const *cands, int n);

/* ---- whole-file checks (check.c) ---- */

/* Looks at the whole tree once, without running anything: one net, unique
   definitions and parameters, every layer/block name known, no recursion
   between blocks, 'input' only in the net, nothing after a 'return'. Sets
   E->net. Returns the number of errors found (each reported through E->d). */
int fe_check_file(Elab *E, const SourceFile *file);

#endif
