/*
** layers.c: the built-in layers, a row each (name, arguments with their
** types, defaults and ranges, builder), what the checks and the
** interpreter ask of the table, and the other look-ups by name they share
** (a block, a likely typo's fix).
*/
#ifndef MGC_FE_LAYERS_H
#define MGC_FE_LAYERS_H
#include "elab_internal.h"

#define FE_MAX_SIZE (1 << 20)       /* largest channel count, feature count, kernel, input dim */
#define FE_MAX_LAYER_ARGS 8

typedef enum ArgType { A_INT, A_FLOAT, A_BOOL, A_TENSOR, A_CHOICE, A_SHAPE } ArgType;   /* A_SHAPE: [a, b, ...] or a size */

typedef struct LayerArg {
    const char *name;
    ArgType type;
    bool required;
    double def;              /* its default (ints, floats, bools as 0/1), or DEF_KERNEL, DEF_INFERRED */
    double lo, hi;           /* the range a given value must be in (ints, floats) */
    bool lo_open, hi_open;   /* floats: the range excludes lo, hi */
    const char *choices;     /* A_CHOICE: its names, "nearest,bilinear" (written as a name: mode = bilinear; the
                                builder gets its index) */
} LayerArg;

/* The index of name among a's choices, or -1. */
int fe_choice_index(const LayerArg *a, const char *name);

#define DEF_KERNEL (-12345.0)     /* default "= kernel" (a pool's stride) */
#define DEF_INFERRED (-1.0)       /* default from the input (linear's in_features) */
#define DEF_NONE (-1.0)           /* an optional tensor not given (concat's) */
#define DEF_HEIGHT (-12346.0)     /* default "= height" (adaptive_avgpool's width) */
#define DEF_ABSENT (-12347.0)     /* an optional size not given (reshape's d2) */
#define DEF_LAST (-12348.0)       /* default -1, the last dimension (softmax's axis; -1 alone reads as DEF_INFERRED) */

/* A call of a built-in layer, its arguments bound, defaulted and checked. */
typedef struct Layer Layer;
typedef struct LayerCall {
    const Layer *layer;      /* its row */
    Elab *E;                 /* the checks that need the elaboration's state (one loss, ...) */
    Graph *g;
    Loc loc;                 /* the layer's name in the .net */
    Loc where[FE_MAX_LAYER_ARGS];   /* each argument, where given (else the layer's) */
    const char *prefix;      /* its parameters' names' prefix, or NULL */
    int x;                   /* the input tensor's node */
    long long i[FE_MAX_LAYER_ARGS];   /* ints, bools (0/1), tensors (their nodes); a shape: its sizes' count, 0 not given */
    double f[FE_MAX_LAYER_ARGS];      /* numbers */
    int shape[IR_MAXDIM];             /* a shape argument's sizes (a layer takes one at most) */
} LayerCall;

struct Layer {
    const char *name;
    bool has_params;         /* creates parameters: gets a name */
    int nargs;
    LayerArg args[FE_MAX_LAYER_ARGS];
    int (*build)(const LayerCall *c);   /* the node it makes, or -1 (said) */
    const char *checks;      /* what else it checks, in words (docs/language.md's table) */
};

extern const Layer fe_layers[];
extern const int fe_nlayers;

/* The index in fe_layers of the built-in layer called name, or -1. */
int fe_find_layer(const char *name);
/* "conv2d(out_channels, kernel, stride = 1, padding = 0, bias = true)" into buf. */
const char *fe_layer_signature(const Layer *L, char *buf, size_t size);
/* Argument k of L, given as iv (ints) or fv (numbers), within its range (a number also
   after its rounding to float32, which is 0 only where fv is); else said at where. */
bool fe_layer_arg_in_range(Elab *E, Loc where, const Layer *L, int k, long long iv, double fv);

/* e is a param's initialiser mgc knows: zeros, ones, constant(...) or normal(...) (their
   arguments are checked when the param is made). */
bool fe_param_init_known(const struct Ast *e);

/* name is a built-in function of numbers (max, min), called as max(a, b, ...). */
bool fe_is_function(const char *name);
/* A positional integer v given as L's first argument where that is eps and v
   looks like a size (PyTorch's LayerNorm(C)): said at where, true; else false. */
bool fe_layer_size_for_eps(Elab *E, Loc where, const Layer *L, int x, long long v);

/* The block (not the net) called name among defs, or NULL. */
FeDef *fe_find_block(FeDef *defs, const char *name);
/* The closest of cands[0..n) to name, if close enough to be a likely typo. */
const char *fe_suggest(const char *name, const char *const *cands, int n);

#endif
