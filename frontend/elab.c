/*
** Elaboration: from the syntax tree of a .net file to layer-builder calls
** on an IR graph.
**
** Two steps. fe_check_file() (frontend/check.c) looks at the whole tree
** once, without running anything: one net, no duplicate definitions, every
** layer/block name known, no recursion between blocks, 'input' only in the
** net, nothing after a 'return'. Then the net is run like a small
** interpreter: values are integers, floats, booleans and tensors (IR node
** ids); blocks are instantiated with fresh scopes; 'if' and 'for' are
** unrolled; every stage becomes one ir_* builder call (or a block
** instance). The amount of work is bounded (loop iterations, steps, block
** nesting), so no input runs away. The first error stops the run; errors
** are reported with diag_at() at the construct they are about, and the
** builders report shape errors at the Loc we pass them (the layer's name
** in the stage).
**
** Parameter names: a stage "conv1: conv2d(...)" inside an instance named
** "stage2.0" creates "stage2.0.conv1.weight"; an unlabelled stage that has
** parameters is named "<layer>_<k>" (k counts from 0 in its scope, skipping
** names already taken). See docs/language.md.
*/
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/resource.h>
#include "frontend.h"
#include "ast.h"
#include "parser.tab.h"
#include "elab_internal.h"
#include "check.h"
#include "layers.h"

#define FE_MAX_ITERS   10000    /* loop iterations, all loops of one compilation together */
#define FE_MAX_STEPS   200000   /* statements run plus stages applied, per compilation */
#define FE_MAX_DEPTH   64       /* blocks instantiated inside one another */
#define FE_MAX_FILE    (64L << 20) /* largest .net file read, bytes */
/* Expressions and statement lists evaluated inside one another, counted across
   block instances (the parser bounds each body; blocks nest 64 deep, so without
   a total, 64 instances of 900-level expressions would recurse 57,600 deep).
   About 1 KB of stack a level (measured): 4,000 levels fit in 4 MB, half
   the usual 8 MB. A stack guard backs it where the stack is smaller or the
   frames larger (sanitizers). */
#define FE_MAX_NESTING 4000

/* ---- values ---- */

typedef enum VKind { V_INT, V_FLOAT, V_BOOL, V_TENSOR, V_SHAPE } VKind;

typedef struct Value {
    VKind k;
    long long i;      /* V_INT, V_BOOL (0/1); V_SHAPE: its sizes' count */
    double f;         /* V_FLOAT */
    int node;         /* V_TENSOR: IR node id */
    int d[IR_MAXDIM]; /* V_SHAPE: the sizes, [a, b, ...] as written */
} Value;

typedef enum BindKind { B_PARAM, B_LOOP, B_VAR } BindKind;

typedef struct Binding {
    const char *name;
    BindKind kind;
    Value v;
    Loc loc;                 /* where it was first bound */
    struct Binding *next;
} Binding;

/* Variables of one { } body; parent is NULL at the top of a net/block instance.
   Past a few bindings they are also hashed (slots: open addressing), so that
   a body of many statements is not searched name by name. */
typedef struct Env {
    struct Env *parent;
    Binding *vars;
    Binding **slots;
    int nvars, cap;
} Env;

/* Counter for automatic names, per scope and base name. */
typedef struct AutoCount {
    const char *base;
    int next;
    struct AutoCount *link;
} AutoCount;

/* One instance of the net or of a block. */
typedef struct Scope {
    const FeDef *def;
    const char *prefix;      /* "" for the net, else "stage2.0" */
    AutoCount *autos;
    bool returned;
    Value ret;
    Loc ret_loc;
} Scope;

/* ---- small helpers ---- */

static const Loc no_loc = { 0 };

/* A shape value as written: [4, 5] */
static const char *shape_text(Elab *E, Value v)
{
    const char *s = "[";
    for (int k = 0; k < v.i; k++) s = arena_printf(E->a, "%s%s%d", s, k ? ", " : "", v.d[k]);
    return arena_printf(E->a, "%s]", s);
}

static const char *describe(Elab *E, Value v)
{
    switch (v.k) {
    case V_INT: return arena_printf(E->a, "the integer %lld", v.i);
    case V_FLOAT: return arena_printf(E->a, "the number %g", v.f);
    case V_BOOL: return v.i ? "'true'" : "'false'";
    case V_TENSOR: return arena_printf(E->a, "a tensor %s", ir_shape_str(E->a, ir_shape(E->g, v.node)));
    case V_SHAPE: return arena_printf(E->a, "the shape %s", shape_text(E, v));
    }
    return "a value";
}

static const char *type_name(ArgType t)
{
    switch (t) {
    case A_INT: return "an integer";
    case A_FLOAT: return "a number";
    case A_BOOL: return "'true' or 'false'";
    case A_TENSOR: return "a tensor";
    case A_CHOICE: return "a name of its choices";
    case A_SHAPE: return "a shape ([a, b, ...], or one size)";
    }
    return "?";
}

static Value vint(long long i) { Value v = { .k = V_INT, .i = i, .node = -1 }; return v; }
static Value vfloat(double f) { Value v = { .k = V_FLOAT, .f = f, .node = -1 }; return v; }
static Value vbool(bool b) { Value v = { .k = V_BOOL, .i = b, .node = -1 }; return v; }
static Value vtensor(int node) { Value v = { .k = V_TENSOR, .node = node }; return v; }

static const char *block_signature(Elab *E, const FeDef *b)
{
    char buf[256];
    size_t n = (size_t)snprintf(buf, sizeof buf, "%s(", b->name);
    for (const FeParam *p = b->params; p && n < sizeof buf; p = p->next)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s%s", p == b->params ? "" : ", ",
                              p->name, p->def ? " = ..." : "");
    for (const FeParam *p = b->inputs; p && n < sizeof buf; p = p->next)   /* (x, skip): its inputs */
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", p != b->inputs ? ", " : b->params ? ")(" : "", p->name);
    if (n < sizeof buf) snprintf(buf + n, sizeof buf - n, ")");
    return arena_strdup(E->a, buf);
}

/* ---- the set of used parameter-name prefixes ---- */

static NameSlot *names_find(Elab *E, const char *name)
{
    if (!E->names_cap) return NULL;
    unsigned long m = (unsigned long)E->names_cap - 1;
    for (unsigned long i = ir_hash_name(name) & m;; i = (i + 1) & m) {
        if (!E->names[i].name) return NULL;
        if (!strcmp(E->names[i].name, name)) return &E->names[i];
    }
}

static void names_add(Elab *E, const char *name, Loc loc)
{
    if (2 * (E->names_n + 1) > E->names_cap) {
        int cap = E->names_cap ? 2 * E->names_cap : 256;
        NameSlot *old = E->names;
        int oldcap = E->names_cap;
        E->names = arena_alloc(E->a, sizeof(NameSlot) * (size_t)cap);
        E->names_cap = cap;
        E->names_n = 0;
        for (int i = 0; i < oldcap; i++)
            if (old[i].name) names_add(E, old[i].name, old[i].loc);
    }
    unsigned long m = (unsigned long)E->names_cap - 1;
    unsigned long i = ir_hash_name(name) & m;
    while (E->names[i].name) i = (i + 1) & m;
    E->names[i].name = name;
    E->names[i].loc = loc;
    E->names_n++;
}

static const char *join(Elab *E, const char *prefix, const char *name)
{
    return *prefix ? arena_printf(E->a, "%s.%s", prefix, name) : arena_strdup(E->a, name);
}

/* ---- environments ---- */

static Binding *slot_find(const Env *env, const char *name)
{
    unsigned long m = (unsigned long)env->cap - 1;
    for (unsigned long i = ir_hash_name(name) & m; env->slots[i]; i = (i + 1) & m)
        if (!strcmp(env->slots[i]->name, name)) return env->slots[i];
    return NULL;
}

static Binding *lookup(Env *env, const char *name)
{
    for (; env; env = env->parent) {
        if (env->slots) {
            Binding *b = slot_find(env, name);
            if (b) return b;
            continue;
        }
        for (Binding *b = env->vars; b; b = b->next)
            if (!strcmp(b->name, name)) return b;
    }
    return NULL;
}

/* b into the hash: in the slot of a binding of the same name (which it hides,
   as the newer one does in the list), else in the first empty one. */
static void env_put(Env *env, Binding *b)
{
    unsigned long m = (unsigned long)env->cap - 1, i = ir_hash_name(b->name) & m;
    while (env->slots[i] && strcmp(env->slots[i]->name, b->name)) i = (i + 1) & m;
    env->slots[i] = b;
}

static Binding *bind(Elab *E, Env *env, const char *name, BindKind kind, Value v, Loc loc)
{
    Binding *b = arena_alloc(E->a, sizeof *b);
    b->name = name;
    b->kind = kind;
    b->v = v;
    b->loc = loc;
    b->next = env->vars;
    env->vars = b;
    env->nvars++;
    if (env->nvars > 8 && 2 * env->nvars > env->cap) {   /* (re)hash every binding, newest first */
        env->cap = env->cap ? 2 * env->cap : 64;
        env->slots = arena_alloc(E->a, sizeof(Binding *) * (size_t)env->cap);
        memset(env->slots, 0, sizeof(Binding *) * (size_t)env->cap);
        for (Binding *c = env->vars; c; c = c->next)
            if (!slot_find(env, c->name)) env_put(env, c);
    } else if (env->slots) {
        env_put(env, b);
    }
    return b;
}

/* ---- expressions ---- */

static int eval(Elab *E, Scope *S, Env *env, const Ast *e, Value *out);
static int apply_stage(Elab *E, Scope *S, Env *env, const Ast *st, Value in, const Ast *args, Value *out);

static int step(Elab *E, Loc loc)
{
    if (++E->steps <= FE_MAX_STEPS) return 0;
    diag_at(E->d, loc, "the net is too big to elaborate: more than %d statements and stages "
            "would run", FE_MAX_STEPS);
    return -1;
}

static int unknown_name(Elab *E, Env *env, const Ast *e)
{
    if (!strcmp(e->name, "N")) {
        diag_at(E->d, e->loc, "'N' (the batch size) can only be the first dimension of 'input'; "
                "it has no value at compile time");
        return -1;
    }
    if (fe_find_layer(e->name) >= 0 || fe_find_block(E->defs, e->name)) {
        diag_at(E->d, e->loc, "'%s' is a %s, not a value; apply it to a tensor: 'x -> %s'",
                e->name, fe_find_layer(e->name) >= 0 ? "layer" : "block", e->name);
        return -1;
    }
    const char *cands[512];
    int n = 0;
    for (Env *v = env; v; v = v->parent)
        for (Binding *b = v->vars; b && n < 512; b = b->next) cands[n++] = b->name;
    const char *s = fe_suggest(e->name, cands, n);
    if (s) diag_at(E->d, e->loc, "unknown name '%s'; did you mean '%s'?", e->name, s);
    else diag_at(E->d, e->loc, "unknown name '%s'", e->name);
    return -1;
}

static bool is_num(Value v) { return v.k == V_INT || v.k == V_FLOAT; }
static double num(Value v) { return v.k == V_INT ? (double)v.i : v.f; }

static const char *num_text(Elab *E, Value v)
{
    return v.k == V_INT ? arena_printf(E->a, "%lld", v.i) : arena_printf(E->a, "%g", v.f);
}

static const char *op_text(int op)
{
    switch (op) {
    case '+': return "+"; case '-': return "-"; case '*': return "*"; case '/': return "/";
    case '%': return "%"; case '<': return "<"; case '>': return ">";
    case EQ: return "=="; case NE: return "!="; case LE: return "<="; case GE: return ">=";
    case AND: return "and"; case OR: return "or"; case NOT: return "not"; case POW: return "**";
    }
    return "?";
}

static int want_bool(Elab *E, const Ast *e, Value v, const char *what)
{
    if (v.k == V_BOOL) return 0;
    diag_at(E->d, e->loc, "%s must be 'true' or 'false', not %s", what, describe(E, v));
    return -1;
}

/* a ** b on numbers: an integer where both are integers and b >= 0 (as
   Python: 2 ** 3 == 8, 2 ** -1 == 0.5), else a float. */
static int eval_pow(Elab *E, const Ast *e, Value a, Value b, Value *out)
{
    if (num(a) == 0 && num(b) < 0) {
        diag_at(E->d, e->loc, "zero to a negative power (%s ** %s) is a division by zero; the exponent "
                "must be at least 0 where the base is 0", num_text(E, a), num_text(E, b));
        return -1;
    }
    if (a.k == V_INT && b.k == V_INT && b.i >= 0) {
        long long r = 1;
        if (a.i == 0 || a.i == 1) r = b.i == 0 ? 1 : a.i;
        else if (a.i == -1) r = b.i % 2 ? -1 : 1;
        else
            for (long long k = 0; k < b.i; k++)   /* |a| >= 2: past 31 steps it has overflowed */
                if (__builtin_mul_overflow(r, a.i, &r) || r > INT_MAX || r < -(long long)INT_MAX) {
                    diag_at(E->d, e->loc, "integer overflow in '**': %lld ** %lld is beyond %d; write %lld.0 ** %lld "
                            "for a float", a.i, b.i, INT_MAX, a.i, b.i);
                    return -1;
                }
        *out = vint(r);
        return 0;
    }
    double r = pow(num(a), num(b));
    if (isnan(r)) {
        diag_at(E->d, e->loc, "(%g) ** %g is not a real number: a negative base needs an integer exponent",
                num(a), num(b));
        return -1;
    }
    if (!isfinite(r)) {
        diag_at(E->d, e->loc, "the result of '**' is not a finite number (%g ** %g)", num(a), num(b));
        return -1;
    }
    *out = vfloat(r);
    return 0;
}

static int apply_layer_values(Elab *E, Scope *S, Env *env, const Ast *st, int id, Value in,
                              const Value *vals, const bool *given, const Loc *where, Value *out);

/* A layer applied to tensor a at an operator, as if written a -> layer(args): the same
   checks, messages (at the operator) and automatic names. */
static int operator_layer(Elab *E, Scope *S, Env *env, const Ast *e, const char *layer, Value a,
                          int nargs, const Value *vals, const Loc *where, Value *out)
{
    if (step(E, e->loc)) return -1;
    Ast *st = arena_alloc(E->a, sizeof *st);
    st->kind = AST_STAGE;
    st->loc = st->name_loc = e->loc;
    st->name = layer;
    bool given[2] = { true, nargs > 1 };
    return apply_layer_values(E, S, env, st, fe_find_layer(layer), a, vals, given, where, out);
}

/* A tensor by a number: the layer scale(factor, shift), y = x * factor + shift, as
   PyTorch's tensor-by-number arithmetic: t * c, c * t, t + c, c + t, t - c, c - t,
   t / c (as t * (1 / c)) and -t (unary). */
static int eval_scale_op(Elab *E, Scope *S, Env *env, const Ast *e, Value a, Value b, Value *out)
{
    bool num_left = is_num(a);
    Value t = num_left ? b : a;
    double c = num(num_left ? a : b), factor = 1, shift = 0;
    const Ast *cx = num_left ? e->lhs : e->rhs;
    switch (e->op) {
    case '*': factor = c; break;
    case '+': shift = c; break;
    case '-': if (num_left) { factor = -1; shift = c; } else shift = -c; break;
    case '/':
        if (num_left) {
            diag_at(E->d, e->loc, "operator '/' with a tensor on its right (%s / tensor) is not supported: "
                    "a tensor can be divided by a number (x / 4), not a number by a tensor", num_text(E, a));
            return -1;
        }
        if (c == 0) {
            diag_at(E->d, e->loc, "division of a tensor by zero");
            return -1;
        }
        factor = 1 / c;
        break;
    default:
        diag_at(E->d, e->loc, "operator '%s' between a tensor and a number is not supported: '*', '+', '-' "
                "and '/' (by a number) are, as the layer scale(factor, shift)%s", op_text(e->op),
                e->op == POW ? "; for a square write x * x" : "");
        return -1;
    }
    Value vals[2] = { vfloat(factor), vfloat(shift) };
    Loc where[2] = { cx->loc, cx->loc };
    return operator_layer(E, S, env, e, "scale", t, 2, vals, where, out);
}

/* An arithmetic operator with a tensor operand. Two tensors: '+', '-' and '*'
   are the layers add, sub and mul, as if written a -> add(b) (the same checks,
   broadcasting, messages and automatic names); a tensor and a number: the layer
   scale; anything else is said. */
static int eval_tensor_op(Elab *E, Scope *S, Env *env, const Ast *e, Value a, Value b, Value *out)
{
    const char *layer = e->op == '+' ? "add" : e->op == '-' ? "sub" : e->op == '*' ? "mul" : NULL;
    if (a.k == V_TENSOR && b.k == V_TENSOR && layer) {
        Loc where[1] = { e->rhs->loc };
        return operator_layer(E, S, env, e, layer, a, 1, &b, where, out);
    }
    if (a.k == V_TENSOR && b.k == V_TENSOR)
        diag_at(E->d, e->loc, "operator '%s' is not defined on two tensors; only '+', '-' and '*' are "
                "(the layers add, sub and mul)", op_text(e->op));
    else if (is_num(a) || is_num(b))
        return eval_scale_op(E, S, env, e, a, b, out);
    else
        diag_at(E->d, (a.k == V_TENSOR ? e->rhs : e->lhs)->loc, "operator '%s' needs numbers or two tensors, not %s",
                op_text(e->op), describe(E, a.k == V_TENSOR ? b : a));
    return -1;
}

static int eval_binary(Elab *E, Scope *S, Env *env, const Ast *e, Value *out)
{
    Value a, b;
    if (eval(E, S, env, e->lhs, &a)) return -1;
    if (e->op == AND || e->op == OR) {
        const char *what = e->op == AND ? "the left operand of 'and'" : "the left operand of 'or'";
        if (want_bool(E, e->lhs, a, what)) return -1;
        if ((e->op == AND && !a.i) || (e->op == OR && a.i)) { *out = a; return 0; }
        if (eval(E, S, env, e->rhs, &b)) return -1;
        if (want_bool(E, e->rhs, b, e->op == AND ? "the right operand of 'and'" : "the right operand of 'or'"))
            return -1;
        *out = b;
        return 0;
    }
    if (eval(E, S, env, e->rhs, &b)) return -1;
    if (e->op == EQ || e->op == NE) {
        bool eq;
        if (is_num(a) && is_num(b)) eq = (a.k == V_INT && b.k == V_INT) ? a.i == b.i : num(a) == num(b);
        else if (a.k == V_BOOL && b.k == V_BOOL) eq = a.i == b.i;
        else {
            diag_at(E->d, e->loc, "cannot compare %s with %s%s", describe(E, a), describe(E, b),
                    a.k == V_TENSOR || b.k == V_TENSOR ? "; compare shapes instead, e.g. x.channels == c" : "");
            return -1;
        }
        *out = vbool(e->op == EQ ? eq : !eq);
        return 0;
    }
    bool arith = e->op == '+' || e->op == '-' || e->op == '*' || e->op == '/' || e->op == '%' || e->op == POW;
    if (arith && (a.k == V_TENSOR || b.k == V_TENSOR)) return eval_tensor_op(E, S, env, e, a, b, out);
    if (!is_num(a) || !is_num(b)) {
        const Ast *bad = !is_num(a) ? e->lhs : e->rhs;
        diag_at(E->d, bad->loc, "operator '%s' needs numbers, not %s", op_text(e->op),
                describe(E, !is_num(a) ? a : b));
        return -1;
    }
    switch (e->op) {
    case '<': *out = vbool(a.k == V_INT && b.k == V_INT ? a.i < b.i : num(a) < num(b)); return 0;
    case '>': *out = vbool(a.k == V_INT && b.k == V_INT ? a.i > b.i : num(a) > num(b)); return 0;
    case LE:  *out = vbool(a.k == V_INT && b.k == V_INT ? a.i <= b.i : num(a) <= num(b)); return 0;
    case GE:  *out = vbool(a.k == V_INT && b.k == V_INT ? a.i >= b.i : num(a) >= num(b)); return 0;
    case POW: return eval_pow(E, e, a, b, out);
    default: break;
    }
    if ((e->op == '/' || e->op == '%') && num(b) == 0) {
        diag_at(E->d, e->loc, "division by zero");
        return -1;
    }
    if (a.k == V_INT && b.k == V_INT) {
        long long r = 0;
        bool ovf = false;
        switch (e->op) {
        case '+': ovf = __builtin_add_overflow(a.i, b.i, &r); break;
        case '-': ovf = __builtin_sub_overflow(a.i, b.i, &r); break;
        case '*': ovf = __builtin_mul_overflow(a.i, b.i, &r); break;
        case '/':
        case '%':
            if (a.i == LLONG_MIN && b.i == -1) { ovf = true; break; }
            {
                long long q = a.i / b.i, m = a.i % b.i;
                if (m != 0 && ((m < 0) != (b.i < 0))) { q--; m += b.i; }   /* floor division */
                r = e->op == '/' ? q : m;
            }
            break;
        }
        if (ovf || r > INT_MAX || r < -(long long)INT_MAX) {
            diag_at(E->d, e->loc, "integer overflow in '%s' (the limit is %d)", op_text(e->op), INT_MAX);
            return -1;
        }
        *out = vint(r);
        return 0;
    }
    double x = num(a), y = num(b), r = 0;
    switch (e->op) {
    case '+': r = x + y; break;
    case '-': r = x - y; break;
    case '*': r = x * y; break;
    case '/': r = x / y; break;
    case '%': r = x - y * floor(x / y); break;
    }
    if (!isfinite(r)) {
        diag_at(E->d, e->loc, "the result of '%s' is not a finite number", op_text(e->op));
        return -1;
    }
    *out = vfloat(r);
    return 0;
}

/* [a, b, ...]: a shape, each size an integer of 1 to FE_MAX_SIZE, at most IR_MAXDIM - 1 of them
   (a tensor's dimensions after the batch's) */
static int eval_shape(Elab *E, Scope *S, Env *env, const Ast *e, Value *out)
{
    Value v = { .k = V_SHAPE, .node = -1 };
    for (const Ast *a = e->args; a; a = a->next) {
        if (a->name) {
            diag_at(E->d, a->name_loc, "a shape's sizes are written alone ([4, 5]), not named ('%s = ...')", a->name);
            return -1;
        }
        if (v.i == IR_MAXDIM - 1) {
            diag_at(E->d, a->loc, "a shape of more than %d sizes: tensors have at most %d dimensions after the batch's",
                    IR_MAXDIM - 1, IR_MAXDIM - 1);
            return -1;
        }
        Value s;
        if (eval(E, S, env, a->lhs, &s)) return -1;
        if (s.k != V_INT || s.i < 1 || s.i > FE_MAX_SIZE) {
            diag_at(E->d, a->loc, "a shape's size must be an integer of 1 to %d, not %s", FE_MAX_SIZE, describe(E, s));
            return -1;
        }
        v.d[v.i++] = (int)s.i;
    }
    if (!v.i) {
        diag_at(E->d, e->loc, "an empty shape []: write its sizes, [4, 5]");
        return -1;
    }
    *out = v;
    return 0;
}

static int eval_attr(Elab *E, Scope *S, Env *env, const Ast *e, Value *out)
{
    static const char *const attrs[] = { "channels", "height", "width", "features", "rank", "shape" };
    Value x;
    if (eval(E, S, env, e->lhs, &x)) return -1;
    if (x.k != V_TENSOR) {
        diag_at(E->d, e->name_loc, "'.%s' needs a tensor, but this is %s", e->name, describe(E, x));
        return -1;
    }
    const Shape *s = ir_shape(E->g, x.node);
    const char *sh = ir_shape_str(E->a, s);
    int dim = -1;
    if (!strcmp(e->name, "shape")) {
        if (!e->rhs) {
            diag_at(E->d, e->name_loc, "'.shape' needs an index, e.g. x.shape[1]");
            return -1;
        }
        Value iv;
        if (eval(E, S, env, e->rhs, &iv)) return -1;
        if (iv.k != V_INT) {
            diag_at(E->d, e->rhs->loc, "a shape index must be an integer, not %s", describe(E, iv));
            return -1;
        }
        long long i = iv.i < 0 ? iv.i + s->nd : iv.i;
        if (i < 0 || i >= s->nd) {
            diag_at(E->d, e->rhs->loc, "shape index %lld is out of range for a tensor %s of %d dimensions",
                    iv.i, sh, s->nd);
            return -1;
        }
        dim = (int)i;
    } else {
        if (e->rhs) {
            diag_at(E->d, e->name_loc, "only '.shape' can be indexed");
            return -1;
        }
        if (!strcmp(e->name, "rank")) { *out = vint(s->nd); return 0; }
        bool four = s->nd == 4;
        if (!strcmp(e->name, "channels")) dim = s->nd >= 3 ? 1 : -2;
        else if (!strcmp(e->name, "height")) dim = four ? 2 : -2;
        else if (!strcmp(e->name, "width")) dim = four ? 3 : -2;
        else if (!strcmp(e->name, "features")) dim = s->nd == 2 ? 1 : -2;
        else {
            const char *sug = fe_suggest(e->name, attrs, 6);
            diag_at(E->d, e->name_loc, "tensors have no attribute '%s'%s%s%s (attributes: channels, height, "
                    "width, features, rank, shape[i])", e->name, sug ? "; did you mean '" : "",
                    sug ? sug : "", sug ? "'?" : "");
            return -1;
        }
        if (dim == -2) {
            diag_at(E->d, e->name_loc, "a tensor %s has no '%s' (%s)", sh, e->name,
                    !strcmp(e->name, "features") ? "that needs [N, features]"
                    : !strcmp(e->name, "channels") ? "that needs [N, C, H, W]" : "that needs [N, C, H, W]");
            return -1;
        }
    }
    if (s->d[dim] == IR_BATCH) {
        diag_at(E->d, e->name_loc, "dimension %d is the batch size N, which is not known at compile time", dim);
        return -1;
    }
    *out = vint(s->d[dim]);
    return 0;
}

/* Enter one level of evaluation (an expression, a statement list); leave() undoes it. */
static int enter(Elab *E, Loc loc)
{
    char here;
    long used = E->stack_top ? (long)(E->stack_top - &here) : 0;
    if (E->nesting < FE_MAX_NESTING && used < E->stack_budget) {
        E->nesting++;
        return 0;
    }
    if (E->nesting >= FE_MAX_NESTING)
        diag_at(E->d, loc, "this is nested too deeply: with the blocks it is in, elaboration is %d levels deep here "
                "(the limit is %d; flatten the expression or the blocks)", E->nesting, FE_MAX_NESTING);
    else
        diag_at(E->d, loc, "this is nested too deeply: elaboration has used %ld KB of stack here (%d levels; "
                "the budget is %ld KB; flatten the expression or the blocks)", used >> 10, E->nesting,
                E->stack_budget >> 10);
    return -1;
}

static void leave(Elab *E) { E->nesting--; }

static int eval_node(Elab *E, Scope *S, Env *env, const Ast *e, Value *out);

/* max(a, b, ...), min(a, b, ...) of numbers: an integer where all are
   integers, else a float. */
static int eval_function(Elab *E, Scope *S, Env *env, const Ast *e, Value *out)
{
    bool is_max = !strcmp(e->name, "max");
    int n = 0;
    if (e->label) {
        diag_at(E->d, e->label->loc, "'%s' is a function of numbers, not a layer: it takes no label", e->name);
        return -1;
    }
    for (const Ast *a = e->args; a; a = a->next, n++) {
        if (a->name) {
            diag_at(E->d, a->name_loc, "'%s' takes numbers, not named arguments: %s(a, b, ...)", e->name, e->name);
            return -1;
        }
        Value v;
        if (eval(E, S, env, a->lhs, &v)) return -1;
        if (!is_num(v)) {
            diag_at(E->d, a->loc, "'%s' takes numbers, not %s%s", e->name, describe(E, v),
                    v.k == V_TENSOR ? "; an element-wise maximum or minimum of tensors is not a layer yet" : "");
            return -1;
        }
        if (n == 0) *out = v;
        else {
            bool take = is_max ? num(v) > num(*out) : num(v) < num(*out);
            bool fl = v.k == V_FLOAT || out->k == V_FLOAT;
            if (take) *out = v;
            if (fl) *out = vfloat(num(*out));
        }
    }
    if (n < 2) {
        diag_at(E->d, e->name_loc, "'%s' needs at least two numbers, e.g. %s(1, x.channels / 4); it has %d",
                e->name, e->name, n);
        return -1;
    }
    return 0;
}

static int eval(Elab *E, Scope *S, Env *env, const Ast *e, Value *out)
{
    if (enter(E, e->loc)) return -1;
    int rc = eval_node(E, S, env, e, out);
    leave(E);
    return rc;
}

static int eval_node(Elab *E, Scope *S, Env *env, const Ast *e, Value *out)
{
    switch (e->kind) {
    case AST_INT: *out = vint(e->ival); return 0;
    case AST_FLOAT: *out = vfloat(e->fval); return 0;
    case AST_BOOL: *out = vbool(e->ival != 0); return 0;
    case AST_NAME: {
        Binding *b = lookup(env, e->name);
        if (!b) return unknown_name(E, env, e);
        *out = b->v;
        return 0;
    }
    case AST_UNARY: {
        Value v;
        if (eval(E, S, env, e->lhs, &v)) return -1;
        if (e->op == NOT) {
            if (want_bool(E, e->lhs, v, "the operand of 'not'")) return -1;
            *out = vbool(!v.i);
            return 0;
        }
        if (v.k == V_TENSOR && e->op == '-') {   /* -t: scale(-1) */
            Value vals[2] = { vfloat(-1), vfloat(0) };
            Loc where[2] = { e->loc, e->loc };
            return operator_layer(E, S, env, e, "scale", v, 2, vals, where, out);
        }
        if (v.k == V_TENSOR && e->op == '+') { *out = v; return 0; }
        if (!is_num(v)) {
            diag_at(E->d, e->loc, "unary '%s' needs a number, not %s", op_text(e->op), describe(E, v));
            return -1;
        }
        if (e->op == '-') { if (v.k == V_INT) v.i = -v.i; else v.f = -v.f; }
        *out = v;
        return 0;
    }
    case AST_BINARY:
        return eval_binary(E, S, env, e, out);
    case AST_COND: {
        Value c;
        if (eval(E, S, env, e->cond, &c)) return -1;
        if (want_bool(E, e->cond, c, "the condition of 'if'")) return -1;
        return eval(E, S, env, c.i ? e->lhs : e->rhs, out);
    }
    case AST_ATTR:
        return eval_attr(E, S, env, e, out);
    case AST_LIST:
        return eval_shape(E, S, env, e, out);
    case AST_PIPE: {
        /* x -> a -> b is ((x -> a) -> b): walk down the chain, then apply from x up */
        int n = 0;
        const Ast *p = e;
        for (; p->kind == AST_PIPE; p = p->lhs) n++;
        const Ast **stages = arena_alloc(E->a, sizeof(Ast *) * (size_t)n);
        int k = n;
        for (p = e; p->kind == AST_PIPE; p = p->lhs) stages[--k] = p->rhs;
        Value v;
        if (eval(E, S, env, p, &v)) return -1;
        for (k = 0; k < n; k++)
            if (apply_stage(E, S, env, stages[k], v, stages[k]->args, &v)) return -1;
        *out = v;
        return 0;
    }
    case AST_CALL: {
        if (fe_is_function(e->name)) return eval_function(E, S, env, e, out);
        /* f(x, args...) == x -> f(args...) */
        const Ast *first = e->args;
        if (!first || first->name) {
            diag_at(E->d, e->name_loc, "'%s(...)' needs the value it applies to as its first argument, "
                    "e.g. '%s(x, ...)', or write 'x -> %s(...)'", e->name, e->name, e->name);
            return -1;
        }
        Value in;
        if (eval(E, S, env, first->lhs, &in)) return -1;
        return apply_stage(E, S, env, e, in, first->next, out);
    }
    default:
        diag_at(E->d, e->loc, "this is not an expression");
        return -1;
    }
}

/* ---- arguments ---- */

/* Binds args to formals[0..n): vals[i]/given[i]/where[i]. Formal names
   come from names[]. Returns -1 after reporting. */
static int bind_args(Elab *E, Scope *S, Env *env, const Ast *callee, const char *sig,
                     const char *const *names, const LayerArg *types, int n, const Ast *args,
                     Value *vals, bool *given, Loc *where)
{
    int pos = 0;
    bool named = false;
    for (const Ast *a = args; a; a = a->next) {
        int k;
        if (!a->name) {
            if (named) {
                diag_at(E->d, a->loc, "positional argument after a named argument; in %s", sig);
                return -1;
            }
            if (pos >= n) {
                if (n == 0)
                    diag_at(E->d, a->loc, "'%s' takes no arguments", callee->name);
                else
                    diag_at(E->d, a->loc, "too many arguments: '%s' takes at most %d (%s)%s",
                            callee->name, n, sig, !strcmp(callee->name, "reshape") || !strcmp(callee->name, "unflatten")
                                                      ? "; the batch is not given: its sizes follow it" : "");
                return -1;
            }
            k = pos++;
        } else {
            named = true;
            for (k = 0; k < n; k++)
                if (!strcmp(names[k], a->name)) break;
            if (k == n) {
                const char *s = fe_suggest(a->name, names, n);
                if (s)
                    diag_at(E->d, a->name_loc, "'%s' has no argument '%s'; did you mean '%s'? (%s)",
                            callee->name, a->name, s, sig);
                else if (n == 0)
                    diag_at(E->d, a->name_loc, "'%s' has no argument '%s'; it takes no arguments",
                            callee->name, a->name);
                else
                    diag_at(E->d, a->name_loc, "'%s' has no argument '%s'; expected one of %s",
                            callee->name, a->name, sig);
                return -1;
            }
            if (given[k]) {
                diag_at(E->d, a->name_loc, "argument '%s' is given twice", a->name);
                diag_note(E->d, where[k], "first given here");
                return -1;
            }
        }
        if (types && types[k].type == A_CHOICE) {   /* a name of its choices, as written: mode = bilinear */
            int c = a->lhs->kind == AST_NAME ? fe_choice_index(&types[k], a->lhs->name) : -1;
            if (c < 0) {
                char list[128];
                size_t at = 0;
                for (const char *ch = types[k].choices; *ch && at + 5 < sizeof list; ch++)
                    at += (size_t)snprintf(list + at, sizeof list - at, *ch == ',' ? " or " : "%c", *ch);
                diag_at(E->d, a->lhs->loc, "'%s' of %s is %s, written as a name (%s = %.*s)", names[k], callee->name, list,
                        names[k], (int)strcspn(types[k].choices, ","), types[k].choices);
                return -1;
            }
            vals[k] = vint(c);
        } else if (eval(E, S, env, a->lhs, &vals[k])) return -1;
        given[k] = true;
        where[k] = a->name ? a->name_loc : a->loc;
    }
    return 0;
}

/* ---- stages ---- */

static int want_tensor_input(Elab *E, const Ast *st, Value in)
{
    if (in.k != V_TENSOR) {
        diag_at(E->d, st->name_loc, "'%s' needs a tensor as its input, not %s", st->name, describe(E, in));
        return -1;
    }
    if (in.node == E->loss_node) {
        diag_at(E->d, st->name_loc, "the loss cannot be the input of '%s': softmax_cross_entropy "
                "must end the chain the net returns", st->name);
        diag_note(E->d, E->loss_loc, "the loss is made here");
        return -1;
    }
    return 0;
}

/* The parameter-name prefix of a stage: its label, or an automatic name. */
static int stage_name(Elab *E, Scope *S, Env *env, const Ast *st, bool needs_name, const char **out)
{
    *out = NULL;
    const char *label = NULL;
    Loc loc = st->label ? st->label->loc : st->name_loc;
    if (st->label) {
        const Ast *l = st->label;
        if (!st->computed_label && l->kind == AST_NAME) label = l->name;
        else if (!st->computed_label && l->kind == AST_INT) label = arena_printf(E->a, "%lld", l->ival);
        else {
            Value v;
            if (eval(E, S, env, l, &v)) return -1;
            if (v.k != V_INT || v.i < 0) {
                diag_at(E->d, l->loc, "a computed label must be a non-negative integer, not %s", describe(E, v));
                return -1;
            }
            label = arena_printf(E->a, "%lld", v.i);
        }
        const char *full = join(E, S->prefix, label);
        NameSlot *old = names_find(E, full);
        if (old) {
            diag_at(E->d, loc, "duplicate name '%s': parameters '%s.*' already exist", full, full);
            diag_note(E->d, old->loc, "'%s' was first used here", full);
            return -1;
        }
        names_add(E, full, loc);
        *out = full;
        return 0;
    }
    if (!needs_name) return 0;
    AutoCount *c = S->autos;
    while (c && strcmp(c->base, st->name)) c = c->link;
    if (!c) {
        c = arena_alloc(E->a, sizeof *c);
        c->base = st->name;
        c->link = S->autos;
        S->autos = c;
    }
    for (;;) {
        const char *full = join(E, S->prefix, arena_printf(E->a, "%s_%d", st->name, c->next++));
        if (!names_find(E, full)) {
            names_add(E, full, loc);
            *out = full;
            return 0;
        }
    }
}

/* An input dimension v within [lo, hi]: 0, or -1 said. */
static int check_range(Elab *E, Loc loc, const char *layer, const char *arg, long long v, long long lo, long long hi)
{
    if (v >= lo && v <= hi) return 0;
    if (v < lo && lo == 0)
        diag_at(E->d, loc, "%s: '%s' must not be negative, got %lld", layer, arg, v);
    else if (v < lo)
        diag_at(E->d, loc, "%s: '%s' must be at least %lld, got %lld", layer, arg, lo, v);
    else
        diag_at(E->d, loc, "%s: '%s' = %lld is too large (the limit is %lld)", layer, arg, v, hi);
    return -1;
}

/* A built-in layer (frontend/layers.c): its arguments bound by its row,
   then apply_layer_values. */
static int apply_layer(Elab *E, Scope *S, Env *env, const Ast *st, int id, Value in, const Ast *args, Value *out)
{
    const Layer *L = &fe_layers[id];
    char sigbuf[256];
    const char *sig = arena_strdup(E->a, fe_layer_signature(L, sigbuf, sizeof sigbuf));
    const char *names[FE_MAX_LAYER_ARGS];
    Value vals[FE_MAX_LAYER_ARGS];
    bool given[FE_MAX_LAYER_ARGS] = { 0 };
    Loc where[FE_MAX_LAYER_ARGS];
    for (int i = 0; i < L->nargs; i++) { names[i] = L->args[i].name; where[i] = st->name_loc; }
    if (want_tensor_input(E, st, in)) return -1;
    if (bind_args(E, S, env, st, sig, names, L->args, L->nargs, args, vals, given, where)) return -1;
    /* layernorm([5, 4]) and layernorm(64), PyTorch's LayerNorm([5, 4]) and LayerNorm(64): a shape or a size where eps goes */
    if (args && !args->name && vals[0].k == V_SHAPE && !strcmp(L->name, "layernorm")) {
        diag_at(E->d, where[0], "layernorm: the first argument is 'eps', not the shape %s: write 'layernorm(shape = %s)' "
                "(nn.LayerNorm's normalised shape)", shape_text(E, vals[0]), shape_text(E, vals[0]));
        return -1;
    }
    if (args && !args->name && vals[0].k == V_INT && fe_layer_size_for_eps(E, where[0], L, in.node, vals[0].i))
        return -1;
    return apply_layer_values(E, S, env, st, id, in, vals, given, where, out);
}

/* The layer of fe_layers[id] on the tensor in, its arguments evaluated
   (vals[k] where given[k], written at where[k]): defaulted, their types
   and ranges checked, then its builder. */
static int apply_layer_values(Elab *E, Scope *S, Env *env, const Ast *st, int id, Value in,
                              const Value *vals, const bool *given, const Loc *where, Value *out)
{
    const Layer *L = &fe_layers[id];
    char sigbuf[256];
    const char *sig = fe_layer_signature(L, sigbuf, sizeof sigbuf);
    LayerCall c = { .layer = L, .E = E, .g = E->g, .loc = st->name_loc, .x = in.node };
    for (int i = 0; i < L->nargs; i++) c.where[i] = where[i];
    if (want_tensor_input(E, st, in)) return -1;
    for (int i = 0; i < L->nargs; i++) {
        const LayerArg *a = &L->args[i];
        if (!given[i]) {
            if (a->required) {
                diag_at(E->d, st->name_loc, "missing argument '%s' to %s", a->name, sig);
                return -1;
            }
            c.i[i] = a->def == DEF_KERNEL || a->def == DEF_HEIGHT ? c.i[0] : a->def == DEF_LAST ? -1 : (long long)a->def;
            c.f[i] = a->def;
            continue;
        }
        Value v = vals[i];
        bool ok = ((a->type == A_INT || a->type == A_CHOICE) && v.k == V_INT) || (a->type == A_FLOAT && is_num(v)) ||
                  (a->type == A_BOOL && v.k == V_BOOL) || (a->type == A_TENSOR && v.k == V_TENSOR) ||
                  (a->type == A_SHAPE && (v.k == V_SHAPE || v.k == V_INT));
        if (ok && a->type == A_SHAPE) {   /* one size: a shape of one dimension (nn.LayerNorm(D)) */
            if (v.k == V_INT && (v.i < 1 || v.i > FE_MAX_SIZE)) {
                diag_at(E->d, c.where[i], "%s: '%s' = %lld is not a size (1 to %d)", L->name, a->name, v.i, FE_MAX_SIZE);
                return -1;
            }
            if (v.k == V_INT) v.d[0] = (int)v.i, v.i = 1;
            c.i[i] = v.i;
            memcpy(c.shape, v.d, sizeof c.shape);
            continue;
        }
        if (!ok) {
            diag_at(E->d, c.where[i], "argument '%s' of %s must be %s, not %s", a->name, L->name,
                    type_name(a->type), describe(E, v));
            return -1;
        }
        c.i[i] = a->type == A_TENSOR ? v.node : v.k == V_FLOAT ? 0 : v.i;
        c.f[i] = num(v);
        if (!fe_layer_arg_in_range(E, c.where[i], L, i, c.i[i], c.f[i])) return -1;
    }
    if (stage_name(E, S, env, st, L->has_params, &c.prefix)) return -1;
    int errors = E->d->errors;
    int r = L->build(&c);
    if (r < 0) {
        if (E->d->errors == errors)
            diag_at(E->d, c.loc, "cannot apply '%s' to a tensor %s", L->name, ir_shape_str(E->a, ir_shape(E->g, in.node)));
        return -1;
    }
    *out = vtensor(r);
    return 0;
}

static int run_stmts(Elab *E, Scope *S, Env *env, const Ast *s);

static int apply_block(Elab *E, Scope *S, Env *env, const Ast *st, FeDef *b, Value in,
                       const Ast *args, Value *out)
{
    if (want_tensor_input(E, st, in)) return -1;
    if (E->depth >= FE_MAX_DEPTH) {
        diag_at(E->d, st->name_loc, "blocks are nested more than %d deep", FE_MAX_DEPTH);
        return -1;
    }
    /* the arguments: its parameters, then its inputs after the first (block up(c)(x, skip):
       x -> up(64, s), or up(c = 64, skip = s)) */
    int n = 0;
    for (FeParam *p = b->params; p; p = p->next) n++;
    for (FeParam *p = b->inputs->next; p; p = p->next) n++;
    const char **names = arena_alloc(E->a, sizeof(char *) * (size_t)(n + 1));
    Value *vals = arena_alloc(E->a, sizeof(Value) * (size_t)(n + 1));
    bool *given = arena_alloc(E->a, sizeof(bool) * (size_t)(n + 1));
    Loc *where = arena_alloc(E->a, sizeof(Loc) * (size_t)(n + 1));
    int k = 0;
    for (FeParam *p = b->params; p; p = p->next, k++) { names[k] = p->name; where[k] = st->name_loc; }
    for (FeParam *p = b->inputs->next; p; p = p->next, k++) { names[k] = p->name; where[k] = st->name_loc; }
    const char *sig = block_signature(E, b);
    if (bind_args(E, S, env, st, sig, names, NULL, n, args, vals, given, where)) return -1;
    const char *prefix;
    if (stage_name(E, S, env, st, true, &prefix)) return -1;

    Scope inner = { b, prefix, NULL, false, { 0 }, no_loc };
    Env top = { .parent = NULL };
    k = 0;
    int errors = E->d->errors;
    int rc = 0;
    E->depth++;
    for (FeParam *p = b->params; p; p = p->next, k++) {
        Value v;
        if (given[k]) v = vals[k];
        else if (p->def) {
            if (eval(E, &inner, &top, p->def, &v)) { rc = -1; break; }
        } else {
            diag_at(E->d, st->name_loc, "missing argument '%s' to block %s", p->name, sig);
            rc = -1;
            break;
        }
        bind(E, &top, p->name, B_PARAM, v, p->loc);
    }
    for (FeParam *p = b->inputs->next; !rc && p; p = p->next, k++) {   /* the inputs after the first: tensors */
        if (!given[k]) {
            diag_at(E->d, st->name_loc, "missing input '%s' to block %s: give it after the parameters "
                    "(x -> %s(..., %s = t))", p->name, sig, b->name, p->name);
            rc = -1;
        } else if (vals[k].k != V_TENSOR || vals[k].node == E->loss_node) {
            diag_at(E->d, where[k], "input '%s' of block %s must be a tensor, not %s", p->name, sig,
                    vals[k].k == V_TENSOR ? "the loss" : describe(E, vals[k]));
            rc = -1;
        } else {
            bind(E, &top, p->name, B_VAR, vals[k], p->loc);
        }
    }
    if (!rc) {
        bind(E, &top, b->inputs->name, B_VAR, in, b->inputs->loc);
        rc = run_stmts(E, &inner, &top, b->body);
    }
    if (!rc && !inner.returned) {
        diag_at(E->d, b->end_loc, "block '%s' ends without 'return'", b->name);
        rc = -1;
    }
    if (!rc && inner.ret.k != V_TENSOR) {
        diag_at(E->d, inner.ret_loc, "block '%s' must return a tensor, not %s", b->name, describe(E, inner.ret));
        rc = -1;
    }
    E->depth--;
    if (rc) {
        if (E->d->errors > errors && E->notes++ < 4)   /* the innermost few instances */
            diag_note(E->d, st->name_loc, "in '%s', an instance of block '%s' made here", prefix, b->name);
        return -1;
    }
    *out = inner.ret;
    return 0;
}

static int apply_stage(Elab *E, Scope *S, Env *env, const Ast *st, Value in, const Ast *args, Value *out)
{
    if (step(E, st->name_loc)) return -1;
    int id = fe_find_layer(st->name);
    if (id >= 0) return apply_layer(E, S, env, st, id, in, args, out);
    FeDef *b = fe_find_block(E->defs, st->name);
    if (b) return apply_block(E, S, env, st, b, in, args, out);
    diag_at(E->d, st->name_loc, "unknown layer '%s'", st->name);   /* fe_check_file catches this first */
    return -1;
}

/* ---- statements ---- */

/* Dimension a of an input or a param (what: "input", and with its article, "an input"):
   an integer in [1, FE_MAX_SIZE] into *d; 0, or -1 said. */
static int eval_dim(Elab *E, Scope *S, Env *env, const Ast *a, const char *what, const char *a_what, int *d)
{
    Value v;
    if (eval(E, S, env, a->lhs, &v)) return -1;
    if (v.k != V_INT) {
        diag_at(E->d, a->loc, "%s dimension must be an integer, not %s", a_what, describe(E, v));
        return -1;
    }
    if (check_range(E, a->loc, what, "dimension", v.i, 1, FE_MAX_SIZE)) return -1;
    *d = (int)v.i;
    return 0;
}

static int run_input(Elab *E, Scope *S, Env *env, const Ast *s)
{
    if (E->g->input >= 0) {
        diag_at(E->d, s->loc, "a second 'input'; the net has exactly one");
        diag_note(E->d, E->g->nodes[E->g->input].loc, "the first is here");
        return -1;
    }
    Shape sh = { 0 };
    int nd = 0;
    for (const Ast *a = s->args; a; a = a->next, nd++) {
        if (a->name) {
            diag_at(E->d, a->name_loc, "input dimensions are plain values, not 'name = value'");
            return -1;
        }
        if (nd >= IR_MAXDIM) {
            diag_at(E->d, a->loc, "too many input dimensions: at most %d with the batch ([N, C, H, W] for images)", IR_MAXDIM);
            return -1;
        }
        if (nd == 0) {
            if (a->lhs->kind != AST_NAME || strcmp(a->lhs->name, "N")) {
                diag_at(E->d, a->loc, "the first input dimension must be N, the batch size");
                return -1;
            }
            sh.d[0] = IR_BATCH;
            continue;
        }
        if (a->lhs->kind == AST_NAME && !strcmp(a->lhs->name, "N")) {
            diag_at(E->d, a->loc, "N (the batch size) can only be the first input dimension");
            return -1;
        }
        if (eval_dim(E, S, env, a, "input", "an input", &sh.d[nd])) return -1;
    }
    if (nd < 2) {
        diag_at(E->d, s->name_loc, "input '%s' needs the batch size and at least one more dimension, "
                "e.g. [N, 1, 28, 28] or [N, 784]", s->name);
        return -1;
    }
    sh.nd = nd;
    int errors = E->d->errors;
    int id = ir_input(E->g, s->name_loc, sh);
    if (id < 0) {
        if (E->d->errors == errors) diag_at(E->d, s->name_loc, "cannot make this input");
        return -1;
    }
    if (lookup(env, s->name)) {
        diag_at(E->d, s->name_loc, "'%s' is already defined", s->name);
        return -1;
    }
    bind(E, env, s->name, B_VAR, vtensor(id), s->name_loc);
    return 0;
}

/* A param's initialiser (fe_param_init_known has checked its name): zeros, ones,
   constant(value), normal(std = 1). */
static int param_init(Elab *E, Scope *S, Env *env, const Ast *e, InitKind *init, float *arg)
{
    bool normal = !strcmp(e->name, "normal"), constant = !strcmp(e->name, "constant");
    *init = normal ? INIT_NORMAL : constant ? INIT_CONSTANT : !strcmp(e->name, "zeros") ? INIT_ZEROS : INIT_ONES;
    *arg = normal ? 1.0f : 0.0f;
    const char *want = normal ? "std" : constant ? "value" : NULL;
    int n = 0;
    for (const Ast *a = e->kind == AST_CALL ? e->args : NULL; a; a = a->next, n++) {
        if (!want || n > 0 || (a->name && strcmp(a->name, want))) {
            diag_at(E->d, a->loc, "%s takes %s", e->name, !want ? "no argument" : normal ? "one argument, std (normal(0.02))"
                    : "one argument, value (constant(1e-6))");
            return -1;
        }
        Value v;
        if (eval(E, S, env, a->lhs, &v)) return -1;
        double f = v.k == V_INT ? (double)v.i : v.f;
        if ((v.k != V_INT && v.k != V_FLOAT) || !isfinite(f) || fabs(f) > 3.4e38) {
            diag_at(E->d, a->loc, "the %s of %s must be a finite number, not %s", want, e->name, describe(E, v));
            return -1;
        }
        if (normal && !(f > 0)) {
            diag_at(E->d, a->loc, "the std of normal must be above 0, not %g (zeros makes a tensor of zeros)", f);
            return -1;
        }
        *arg = (float)f;
    }
    if (constant && n == 0) {
        diag_at(E->d, e->loc, "constant needs its value: constant(1e-6)");
        return -1;
    }
    return 0;
}

/* param name[d1, ...] = init: a learned tensor of its own, named in its scope as a
   label is (stage2.0.gamma), saved and updated as any layer's weights. */
static int run_param(Elab *E, Scope *S, Env *env, const Ast *s)
{
    Shape sh = { 0 };
    int nd = 0;
    for (const Ast *a = s->args; a; a = a->next, nd++) {
        if (a->name) {
            diag_at(E->d, a->name_loc, "param dimensions are plain values, not 'name = value'");
            return -1;
        }
        if (nd >= IR_MAXDIM) {
            diag_at(E->d, a->loc, "param '%s' has too many dimensions: at most %d", s->name, IR_MAXDIM);
            return -1;
        }
        if (a->lhs->kind == AST_NAME && !strcmp(a->lhs->name, "N")) {
            diag_at(E->d, a->loc, "a param has no batch dimension N: write 1 where it is shared by the batch "
                    "(param pos[1, T, D], param gamma[1, C, 1, 1]), as PyTorch's nn.Parameter(torch.zeros(1, T, D))");
            return -1;
        }
        if (eval_dim(E, S, env, a, "param", "a param", &sh.d[nd])) return -1;
    }
    if (nd == 0) {
        diag_at(E->d, s->name_loc, "param '%s' needs its shape: param %s[1, 1, 64] = zeros", s->name, s->name);
        return -1;
    }
    sh.nd = nd;
    InitKind init;
    float arg;
    if (param_init(E, S, env, s->lhs, &init, &arg)) return -1;
    if (lookup(env, s->name)) {
        diag_at(E->d, s->name_loc, "'%s' is already defined", s->name);
        return -1;
    }
    const char *full = join(E, S->prefix, s->name);
    NameSlot *old = names_find(E, full);
    if (old) {
        diag_at(E->d, s->name_loc, "duplicate name '%s': a param is declared once in its net or block instance "
                "(in a loop, give each a name of its own through a block)", full);
        diag_note(E->d, old->loc, "'%s' was first used here", full);
        return -1;
    }
    names_add(E, full, s->name_loc);
    int errors = E->d->errors;
    int id = ir_param(E->g, s->name_loc, full, sh, init, arg);
    if (id < 0) {
        if (E->d->errors == errors) diag_at(E->d, s->name_loc, "cannot make param '%s'", s->name);
        return -1;
    }
    bind(E, env, s->name, B_VAR, vtensor(id), s->name_loc);
    return 0;
}

static int run_for(Elab *E, Scope *S, Env *env, const Ast *s)
{
    Value a, b;
    if (eval(E, S, env, s->lhs, &a) || eval(E, S, env, s->rhs, &b)) return -1;
    if (a.k != V_INT || b.k != V_INT) {
        const Ast *bad = a.k != V_INT ? s->lhs : s->rhs;
        diag_at(E->d, bad->loc, "loop bounds must be integers, not %s", describe(E, a.k != V_INT ? a : b));
        return -1;
    }
    long long count = b.i > a.i ? b.i - a.i : 0;
    if (count > FE_MAX_ITERS - E->iters) {
        diag_at(E->d, s->loc, "this loop would run %lld times; loops may run at most %d iterations "
                "in all (so far %ld)", count, FE_MAX_ITERS, E->iters);
        return -1;
    }
    Binding *old = lookup(env, s->name);
    if (old) {
        diag_at(E->d, s->name_loc, "loop variable '%s' hides a name that is already defined", s->name);
        diag_note(E->d, old->loc, "'%s' is defined here", s->name);
        return -1;
    }
    E->iters += count;
    for (long long i = a.i; i < b.i; i++) {
        Env var = { .parent = env };
        bind(E, &var, s->name, B_LOOP, vint(i), s->name_loc);
        Env body = { .parent = &var };
        if (run_stmts(E, S, &body, s->body)) return -1;
        if (S->returned) break;
    }
    return 0;
}

static int run_stmt_list(Elab *E, Scope *S, Env *env, const Ast *s);

static int run_stmts(Elab *E, Scope *S, Env *env, const Ast *s)
{
    if (!s) return 0;
    if (enter(E, s->loc)) return -1;
    int rc = run_stmt_list(E, S, env, s);
    leave(E);
    return rc;
}

static int run_stmt_list(Elab *E, Scope *S, Env *env, const Ast *s)
{
    for (; s && !S->returned; s = s->next) {
        if (step(E, s->loc)) return -1;
        switch (s->kind) {
        case AST_INPUT:
            if (run_input(E, S, env, s)) return -1;
            break;
        case AST_PARAM:
            if (run_param(E, S, env, s)) return -1;
            break;
        case AST_ASSIGN: {
            Value v;
            if (eval(E, S, env, s->lhs, &v)) return -1;
            Binding *b = lookup(env, s->name);
            if (b && b->kind != B_VAR) {
                diag_at(E->d, s->name_loc, "cannot assign to %s '%s'; it is a constant",
                        b->kind == B_PARAM ? "parameter" : "loop variable", s->name);
                return -1;
            }
            if (b) b->v = v;
            else bind(E, env, s->name, B_VAR, v, s->name_loc);
            break;
        }
        case AST_RETURN: {
            Value v;
            if (eval(E, S, env, s->lhs, &v)) return -1;
            S->returned = true;
            S->ret = v;
            /* a chain is reported at its last stage */
            S->ret_loc = s->lhs->kind == AST_PIPE ? s->lhs->rhs->name_loc : s->lhs->loc;
            break;
        }
        case AST_IF: {
            const Ast *i = s;
            while (i) {
                if (i->kind == AST_BLOCK_STMT) {
                    Env inner = { .parent = env };
                    if (run_stmts(E, S, &inner, i->body)) return -1;
                    break;
                }
                Value c;
                if (eval(E, S, env, i->cond, &c)) return -1;
                if (want_bool(E, i->cond, c, "the condition of 'if'")) return -1;
                if (c.i) {
                    Env inner = { .parent = env };
                    if (run_stmts(E, S, &inner, i->body)) return -1;
                    break;
                }
                i = i->els;
            }
            break;
        }
        case AST_FOR:
            if (run_for(E, S, env, s)) return -1;
            break;
        default:
            diag_at(E->d, s->loc, "this is not a statement");
            return -1;
        }
    }
    return 0;
}

/* ---- the net, --set ---- */

/* Parses a --set value: an integer, a number, true or false. */
static bool parse_value(const char *s, Value *v)
{
    if (!strcmp(s, "true")) { *v = vbool(true); return true; }
    if (!strcmp(s, "false")) { *v = vbool(false); return true; }
    char *end;
    errno = 0;
    if (diag_decimal(s, false)) {
        long long i = strtoll(s, &end, 10);
        if (!errno && i >= -(long long)INT_MAX && i <= INT_MAX) { *v = vint(i); return true; }
        return false;
    }
    if (!diag_decimal(s, true)) return false;   /* "1e3" and "1.0" are numbers; hex, inf and nan are not */
    double f = strtod(s, &end);
    if (errno || !isfinite(f)) return false;
    *v = vfloat(f);
    return true;
}

static int run_net(Elab *E, const FeOverride *sets, int nsets)
{
    FeDef *net = E->net;
    Diag *d = E->d;
    /* every --set names a parameter */
    int bad = 0;
    for (int i = 0; i < nsets; i++) {
        const char *name = sets[i].name ? sets[i].name : "";
        FeParam *p = net->params;
        while (p && strcmp(p->name, name)) p = p->next;
        if (p) continue;
        const char *cands[256];
        int n = 0;
        char list[512];
        size_t len = 0;
        list[0] = 0;
        for (FeParam *q = net->params; q; q = q->next) {
            if (n < 256) cands[n++] = q->name;
            if (len < sizeof list)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", q == net->params ? "" : ", ", q->name);
        }
        const char *s = fe_suggest(name, cands, n);
        if (!net->params)
            diag_at(d, no_loc, "--set %s: net '%s' has no parameters", name, net->name);
        else if (s)
            diag_at(d, no_loc, "--set %s: net '%s' has no parameter '%s'; did you mean '%s'? (its parameters: %s)",
                    name, net->name, name, s, list);
        else
            diag_at(d, no_loc, "--set %s: net '%s' has no parameter '%s'; its parameters: %s",
                    name, net->name, name, list);
        bad++;
    }
    d->usage += bad;
    if (bad) return -1;

    Scope S = { net, "", NULL, false, { 0 }, no_loc };
    Env top = { .parent = NULL };
    for (FeParam *p = net->params; p; p = p->next) {
        Value v;
        if (eval(E, &S, &top, p->def, &v)) return -1;
        const FeOverride *o = NULL;
        for (int i = 0; i < nsets; i++)
            if (sets[i].name && !strcmp(sets[i].name, p->name)) o = &sets[i];   /* last one wins */
        if (o) {
            Value nv;
            const char *val = o->value ? o->value : "";
            const char *want = v.k == V_INT ? "an integer" : v.k == V_FLOAT ? "a number"
                             : v.k == V_BOOL ? "'true' or 'false'" : "a value";
            if (!parse_value(val, &nv) || v.k == V_TENSOR ||
                (v.k == V_INT && nv.k != V_INT) || (v.k == V_BOOL && nv.k != V_BOOL) ||
                (v.k == V_FLOAT && !is_num(nv))) {
                diag_at(d, no_loc, "--set %s=%s: bad value '%s'; parameter '%s' of net '%s' expects %s",
                        p->name, val, val, p->name, net->name, want);
                d->usage++;
                return -1;
            }
            if (v.k == V_FLOAT) nv = vfloat(num(nv));
            v = nv;
        }
        bind(E, &top, p->name, B_PARAM, v, p->loc);
    }
    if (run_stmts(E, &S, &top, net->body)) return -1;
    if (!S.returned) {
        diag_at(d, net->end_loc, "net '%s' ends without 'return'", net->name);
        return -1;
    }
    if (S.ret.k != V_TENSOR || S.ret.node != E->loss_node || E->loss_node < 0) {
        diag_at(d, S.ret_loc, "the net must return the loss: end the chain it returns with "
                "'-> softmax_cross_entropy'");
        return -1;
    }
    if (E->g->input < 0) {
        diag_at(d, net->name_loc, "net '%s' has no 'input' statement", net->name);
        return -1;
    }
    return 0;
}

/* ---- entry points ---- */

/* Half the stack's limit, at most 32 MB (a guess where there is no limit). */
static long stack_budget(void)
{
    struct rlimit r;
    long limit = 8L << 20;
    if (!getrlimit(RLIMIT_STACK, &r)) limit = r.rlim_cur == RLIM_INFINITY ? 64L << 20 : (long)r.rlim_cur;
    return limit / 2 < (32L << 20) ? limit / 2 : 32L << 20;
}

int fe_compile_bytes(Graph *g, const char *name, const char *text, size_t len, const FeOverride *sets, int nsets)
{
    Arena *a = g->arena;
    /* The copy the diagnostics show: NUL bytes become spaces so lines print whole. */
    SourceFile *file = arena_alloc(a, sizeof *file);
    char *shown = arena_strndup(a, text, len);
    for (size_t i = 0; i < len; i++)
        if (!shown[i]) shown[i] = ' ';
    file->name = arena_strdup(a, name);
    file->text = shown;

    FeParse fp;
    memset(&fp, 0, sizeof fp);
    fp.arena = a;
    fp.diag = g->diag;
    fp.file = file;
    int errors = g->diag->errors;
    if (fe_parse(&fp, text, len) != 0) {
        if (g->diag->errors == errors) {
            Loc l = { file, fp.line, fp.col };
            diag_at(g->diag, l, "cannot parse this file");
        }
        return -1;
    }
    Elab E;
    memset(&E, 0, sizeof E);
    E.g = g;
    E.a = a;
    E.d = g->diag;
    E.defs = fp.defs;
    E.loss_node = -1;
    char top;
    E.stack_top = &top;
    E.stack_budget = stack_budget();
    if (fe_check_file(&E, file)) return -1;
    g->net_name = E.net->name;      /* the net is named by its file */
    if (run_net(&E, sets, nsets)) {
        if (g->diag->errors == errors) diag_at(g->diag, E.net->name_loc, "cannot elaborate this net");
        return -1;
    }
    return 0;
}

int fe_compile_text(Graph *g, const char *name, const char *text, const FeOverride *sets, int nsets)
{
    return fe_compile_bytes(g, name ? name : "<text>", text ? text : "", text ? strlen(text) : 0, sets, nsets);
}

char *fe_read_net(const char *path, size_t *len_out, char *err, size_t err_size)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_size, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    int rc = -1;
    for (;;) {
        if (!buf) {
            snprintf(err, err_size, "cannot read '%s': out of memory", path);
            break;
        }
        if (len == cap) {
            if (cap >= (size_t)FE_MAX_FILE) {
                snprintf(err, err_size, "'%s' is too large for a .net file (over %ld bytes)", path, FE_MAX_FILE);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; continue; }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) snprintf(err, err_size, "cannot read '%s': %s", path, strerror(errno));
            else rc = 0;
            break;
        }
    }
    fclose(f);
    if (rc) {
        free(buf);
        return NULL;
    }
    *len_out = len;
    return buf;
}

int fe_compile(Graph *g, const char *path, const FeOverride *sets, int nsets)
{
    char err[1024];
    size_t len;
    char *buf = fe_read_net(path, &len, err, sizeof err);
    if (!buf) {
        diag_at(g->diag, no_loc, "%s", err);
        return -1;
    }
    int rc = fe_compile_bytes(g, path, buf, len, sets, nsets);
    free(buf);
    return rc;
}
