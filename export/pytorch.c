/*
** mgc export --format pytorch: the evaluation graph as a self-contained
** Python file holding an nn.Module, Net, whose state_dict keys are the
** checkpoint's tensor names (so Net().load_state_dict(tensors) takes the
** checkpoint, strict) and whose forward(x) is the graph from the input to
** the logits (the loss and accuracy, and the labels they read, left out).
** Beside it: the input's shape, the classes, transform() (the checkpoint's
** --resize and --normalize with its statistics), and load(path), which reads
** the checkpoint with the safetensors package where installed, else with a
** reader of its own (the format is a JSON header and raw little-endian
** data), so the file needs torch alone.
**
** Names. A layer's parameters are "<prefix>.weight" and so on; the prefix's
** parts are the .net file's labels ("stage2.0.conv1"). Each part is a child
** module: the layer (nn.Conv2d, nn.Linear, nn.LayerNorm, BatchNorm1d/2d:
** PyTorch's without num_batches_tracked, which checkpoints do not hold)
** under Scope modules, one per level. A part that Python can read as an
** attribute (self.stage2.conv1) is written so; one that it cannot (a digit,
** a Python keyword, a name nn.Module already has: "0", "class", "train") is
** registered and read by Scope's [] (self.stage2["0"].conv1), which sets
** nn.Module's _modules directly: the names stay exact whatever they are.
**
** forward. A node used once is folded into its user's expression, up to
** four calls deep, and a statement starts at each convolution and linear
** layer (the hand-written twins' x = F.relu(self.bn1(self.conv1(x)))); a
** variable's name is taken over by the value computed from it when it is
** no longer read. BatchNorm1d is the graph's reshape to [N, F, 1, 1],
** BatchNorm and reshape back, written as nn.BatchNorm1d on [N, F]. Every op
** an evaluation graph can hold has its PyTorch form here; another is
** refused, naming it and its .net location.
*/
#include "export.h"
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 4   /* calls nested in one statement of forward, at most */

/* How tightly an expression binds, for parentheses: an operand looser than
   its place needs them. */
typedef enum Prec { PREC_ADD, PREC_MUL, PREC_UNARY, PREC_ATOM } Prec;

/* A node's value in forward: a variable (owner: the node whose statement
   named it), or an expression not yet written, folded into its one user. */
typedef struct Value {
    const char *text;         /* the variable's name, or the expression */
    Prec prec;
    int depth;                /* calls nested in text (0: a variable) */
    int owner;                /* >= 0: text is the variable of that node; -1: an expression */
    int *refs, nrefs;         /* an expression's variables, by owner, one per reading */
} Value;

/* A module of __init__, a layer or a Scope, by its dotted path. */
typedef struct Module {
    const char *path;
    const char *layer;        /* its constructor ("nn.Conv2d(1, 6, 5)"), or NULL: a Scope */
} Module;

typedef struct Py {
    const ExModel *m;
    const Graph *g;
    Arena *a;
    char *err;
    size_t err_size;
    bool *needed;             /* on a path from the input to the logits */
    int *uses;                /* readings of each node's value by needed nodes */
    int *user;                /* the reader, where uses is 1 */
    bool *alias;              /* a reshape that is only a view for the BatchNorm1d written on [N, F] */
    bool *bn1d;               /* a BatchNorm written as nn.BatchNorm1d */
    Value *v;
    int *left;                /* a variable's readings not yet written */
    const char **free_names;  /* variables no longer read, their names free again */
    int nfree, fresh;
    Module *mods;
    int nmods, cap_mods;
    FILE *init, *fwd;         /* __init__'s and forward's lines */
    char *init_text, *fwd_text;
    size_t init_len, fwd_len;
    bool uses_bn1d, uses_bn2d, uses_attention;
    bool flag_children;       /* a child named as one of nn.Module's own fields ("training") */
    const char *input_shape;  /* "1, 28, 28": an example's dimensions */
} Py;

static int fail(Py *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Py *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, p->err_size, fmt, ap);
    va_end(ap);
    return -1;
}

/* "nets/lenet.net:12:7", or "the net" for a node no .net line made */
static const char *where(Py *p, const Node *n)
{
    if (!n->loc.file) return "the net";
    return arena_printf(p->a, "%s:%d:%d", n->loc.file->name, n->loc.line, n->loc.col);
}

/* The shortest decimal that reads back as v in float32 ("0.1", "1e-05",
   "1.0"): Python's float of it rounds to v again. */
static const char *py_float(Py *p, float v)
{
    char buf[48];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".en")) strcat(buf, ".0");   /* a float literal, not an int */
    return arena_strdup(p->a, buf);
}

/* Text for a Python string literal or docstring: backslashes and quotes
   escaped, control characters shown as '?'. */
static const char *py_text(Py *p, const char *s)
{
    size_t n = strlen(s);
    char *out = arena_alloc(p->a, 2 * n + 1), *o = out;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\' || c == '"') *o++ = '\\', *o++ = (char)c;
        else *o++ = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    *o = 0;
    return out;
}

/* ---- names ---- */

/* Names an attribute of a Scope cannot take: Python's keywords, and what
   nn.Module has (torch 1.13's, and what 2.x added), which the attribute
   would read instead of the child. tests/torch/export_check.py labels a
   net with every such name the installed torch has. */
static const char *const reserved[] = {
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
    "T_destination", "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "compile", "cpu",
    "cuda", "double", "dump_patches", "eval", "extra_repr", "float", "forward", "get_buffer", "get_extra_state",
    "get_parameter", "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia", "named_buffers",
    "named_children", "named_modules", "named_parameters", "parameters", "register_backward_hook", "register_buffer",
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_full_backward_pre_hook", "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook",
    "register_module", "register_parameter", "register_state_dict_post_hook", "register_state_dict_pre_hook",
    "requires_grad_", "set_extra_state", "set_submodule", "share_memory", "state_dict", "to",
    "to_empty", "train", "training", "type", "xpu", "zero_grad",
};

/* Whether a name part reads as an attribute: an identifier not starting
   with '_' (nn.Module's own: _modules, _parameters), not reserved. */
static bool attribute_name(const char *s)
{
    if (!isalpha((unsigned char)s[0])) return false;
    for (const char *c = s; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '_') return false;
    for (size_t k = 0; k < sizeof reserved / sizeof reserved[0]; k++)
        if (!strcmp(s, reserved[k])) return false;
    return true;
}

/* "self.stage2[\"0\"].conv1": the module at a dotted path (its first len characters). */
static const char *module_ref(Py *p, const char *path, size_t len)
{
    char *out = arena_strdup(p->a, "self");
    for (size_t at = 0; at < len;) {
        size_t end = at;
        while (end < len && path[end] != '.') end++;
        char *part = arena_strndup(p->a, path + at, end - at);
        out = attribute_name(part) ? arena_printf(p->a, "%s.%s", out, part) : arena_printf(p->a, "%s[\"%s\"]", out, part);
        at = end + 1;
    }
    return out;
}

static Module *find_module(Py *p, const char *path, size_t len)
{
    for (int k = 0; k < p->nmods; k++)
        if (strlen(p->mods[k].path) == len && !strncmp(p->mods[k].path, path, len)) return &p->mods[k];
    return NULL;
}

static void add_module(Py *p, const char *path, size_t len, const char *layer)
{
    if (p->nmods == p->cap_mods) {
        int cap = p->cap_mods ? 2 * p->cap_mods : 64;
        p->mods = arena_grow(p->a, p->mods, sizeof *p->mods * (size_t)p->cap_mods, sizeof *p->mods * (size_t)cap);
        p->cap_mods = cap;
    }
    p->mods[p->nmods++] = (Module){ arena_strndup(p->a, path, len), layer };
}

/* The lines of __init__ that make the layer at path (its Scopes first,
   those not made yet; constructor NULL: Scopes alone, path's own too): 0, or -1
   where the path is taken. */
static int make_module(Py *p, const Node *n, const char *path, const char *constructor)
{
    size_t len = strlen(path);
    for (size_t start = 0, k = 0; k <= len; k++) {
        if (k < len && path[k] != '.') continue;
        bool layer = k == len && constructor;
        Module *old = find_module(p, path, k);
        if (old && (old->layer || layer))
            return fail(p, "%s: the module '%.*s' would be both a layer and hold others: PyTorch's names cannot say that",
                        where(p, n), (int)k, path);
        if (!old) {
            const char *part = arena_strndup(p->a, path + start, k - start), *made = layer ? constructor : "Scope()";
            if (attribute_name(part)) fprintf(p->init, "        %s = %s\n", module_ref(p, path, k), made);
            else fprintf(p->init, "        %s[\"%s\"] = %s\n", module_ref(p, path, start ? start - 1 : 0), part, made);
            /* nn.Module sets training (and its _private fields) on itself: a child so named needs Scope's __setattr__ */
            if (!strcmp(part, "training") || part[0] == '_') p->flag_children = true;
            add_module(p, path, k, layer ? constructor : NULL);
        }
        start = k + 1;
    }
    return 0;
}

/* Node id, or the parameter it views (layernorm(shape = [...])'s weight of that shape, a vector to the op) */
static int param_source(const Graph *g, int id)
{
    const Node *n = &g->nodes[id];
    return n->op == OP_RESHAPE && g->nodes[n->in[0]].op == OP_PARAM ? n->in[0] : id;
}

/* The layer's path, from its parameter in[k] named "<path>.<leaf>", or NULL (said). */
static const char *param_path(Py *p, const Node *n, int k, const char *leaf)
{
    const Node *w = &p->g->nodes[param_source(p->g, n->in[k])];
    size_t len = w->name ? strlen(w->name) : 0, tail = strlen(leaf) + 1;
    if ((w->op != OP_PARAM && w->op != OP_STATE) || len <= tail || strcmp(w->name + len - tail + 1, leaf) ||
        w->name[len - tail] != '.') {
        fail(p, "%s: %s's input %d is %s '%s', not a parameter named PREFIX.%s", where(p, n), ir_op_name(n->op), k,
             ir_op_name(w->op), w->name ? w->name : "", leaf);
        return NULL;
    }
    return arena_strndup(p->a, w->name, len - tail);
}

/* The same layer's other tensor in[k] is "<path>.<leaf>": 0, or -1 said. */
static int same_path(Py *p, const Node *n, int k, const char *path, const char *leaf)
{
    const char *other = param_path(p, n, k, leaf);
    if (!other) return -1;
    if (strcmp(other, path))
        return fail(p, "%s: %s's tensors belong to two layers, '%s' and '%s': a PyTorch module holds one layer's",
                    where(p, n), ir_op_name(n->op), path, other);
    return 0;
}

/* ---- forward's values and statements ---- */

static void write_statement(Py *p, int id);

/* Node id's value as an operand that binds at least as tightly as prec
   (parenthesised where it does not); its variables join refs. */
static const char *operand(Py *p, int id, Prec prec, int **refs, int *nrefs, int *depth)
{
    Value *v = &p->v[id];
    int n = v->owner >= 0 ? 1 : v->nrefs;
    *refs = arena_grow(p->a, *refs, sizeof(int) * (size_t)*nrefs, sizeof(int) * (size_t)(*nrefs + n));
    if (v->owner >= 0) (*refs)[(*nrefs)++] = v->owner;
    else for (int k = 0; k < v->nrefs; k++) (*refs)[(*nrefs)++] = v->refs[k];
    if (v->depth > *depth) *depth = v->depth;
    return v->prec < prec ? arena_printf(p->a, "(%s)", v->text) : v->text;
}

/* A name for a new variable: one of its statement's variables read for the
   last time there, or a free one, or a new one. */
static const char *new_name(Py *p, const int *refs, int nrefs)
{
    const char *name = NULL;
    for (int k = 0; k < nrefs; k++) {
        int r = refs[k];
        if (--p->left[r] > 0) continue;
        if (!name) name = p->v[r].text;
        else p->free_names[p->nfree++] = p->v[r].text;
    }
    if (name) return name;
    if (p->nfree) return p->free_names[--p->nfree];
    return p->fresh++ ? arena_printf(p->a, "x%d", p->fresh - 1) : "x";
}

/* Writes node id's pending expression as a statement: `name = expr` (its
   value a variable from then on), or `return expr` for the logits. */
static void write_statement(Py *p, int id)
{
    Value *v = &p->v[id];
    if (id == p->g->logits) {
        fprintf(p->fwd, "        return %s\n", v->text);
        return;
    }
    const char *name = new_name(p, v->refs, v->nrefs);
    fprintf(p->fwd, "        %s = %s\n", name, v->text);
    *v = (Value){ name, PREC_ATOM, 0, id, NULL, 0 };
    p->left[id] = p->uses[id];
}

/* Node id's value is expr: kept for its one user while shallow enough, else written. */
static void set_value(Py *p, int id, const char *text, Prec prec, int depth, int *refs, int nrefs)
{
    p->v[id] = (Value){ text, prec, depth, -1, refs, nrefs };
    if (id == p->g->logits || p->uses[id] != 1 || depth >= MAX_DEPTH) write_statement(p, id);
}

/* A view of its input: the same value, the variable's readings counted for
   this node's users. */
static void alias_value(Py *p, int id, int of)
{
    Value *v = &p->v[of];
    if (v->owner >= 0) {
        p->v[id] = *v;
        p->left[v->owner] += p->uses[id] - 1;
        if (id == p->g->logits) fprintf(p->fwd, "        return %s\n", v->text);
    } else {
        set_value(p, id, v->text, v->prec, v->depth, v->refs, v->nrefs);
    }
}

/* ---- the ops ---- */

/* An activation of ir/activations.def as PyTorch writes it, of operand x. */
static const char *activation(Py *p, const Node *n, const char *x)
{
    switch (n->op) {
    case OP_RELU: return arena_printf(p->a, "F.relu(%s)", x);
    case OP_SIGMOID: return arena_printf(p->a, "torch.sigmoid(%s)", x);
    case OP_TANH: return arena_printf(p->a, "torch.tanh(%s)", x);
    case OP_LEAKY_RELU: return arena_printf(p->a, "F.leaky_relu(%s, %s)", x, py_float(p, n->attr.slope));
    case OP_SILU: return arena_printf(p->a, "F.silu(%s)", x);
    case OP_GELU: return arena_printf(p->a, "F.gelu(%s)", x);
    case OP_GELU_TANH: return arena_printf(p->a, "F.gelu(%s, approximate=\"tanh\")", x);
    case OP_RELU6: return arena_printf(p->a, "F.relu6(%s)", x);
    case OP_HARDSIGMOID: return arena_printf(p->a, "F.hardsigmoid(%s)", x);
    case OP_HARDSWISH: return arena_printf(p->a, "F.hardswish(%s)", x);
    case OP_MISH: return arena_printf(p->a, "F.mish(%s)", x);
    case OP_SCALE: return arena_printf(p->a, "(%s * %s + %s)", x, py_float(p, n->attr.factor), py_float(p, n->attr.shift));
    case OP_ELU: return arena_printf(p->a, "F.elu(%s, %s)", x, py_float(p, n->attr.alpha));
    default: return NULL;
    }
}

/* "nn.Conv2d(1, 6, 5)", keywords where not PyTorch's defaults */
static const char *conv_module(Py *p, const Node *n)
{
    const Graph *g = p->g;
    const Shape *w = &g->nodes[n->in[1]].shape;
    char *s = arena_printf(p->a, "nn.Conv2d(%d, %d, %d", g->nodes[n->in[0]].shape.d[1], w->d[0], w->d[2]);
    if (n->attr.stride != 1) s = arena_printf(p->a, "%s, stride=%d", s, n->attr.stride);
    if (n->attr.padding) s = arena_printf(p->a, "%s, padding=%d", s, n->attr.padding);
    if (ir_dilation(&n->attr) > 1) s = arena_printf(p->a, "%s, dilation=%d", s, ir_dilation(&n->attr));
    if (ir_groups(&n->attr) > 1) s = arena_printf(p->a, "%s, groups=%d", s, ir_groups(&n->attr));
    return arena_printf(p->a, "%s%s)", s, n->nin > 2 ? "" : ", bias=False");
}

/* The module of a conv2d, linear, BatchNorm or LayerNorm node, made in
   __init__: its reference (self.conv1), or NULL said. */
static const char *layer(Py *p, const Node *n)
{
    const Graph *g = p->g;
    const char *path = param_path(p, n, n->op == OP_CONV2D || n->op == OP_LINEAR ? 1 : 2, "weight");
    if (!path) return NULL;
    const char *ctor;
    if (n->op == OP_CONV2D || n->op == OP_LINEAR) {
        if (n->nin > 2 && same_path(p, n, 2, path, "bias")) return NULL;
        const Shape *w = &g->nodes[n->in[1]].shape;
        ctor = n->op == OP_CONV2D ? conv_module(p, n)
                                  : arena_printf(p->a, "nn.Linear(%d, %d%s)", w->d[1], w->d[0], n->nin > 2 ? "" : ", bias=False");
    } else {
        const Node *stats = &g->nodes[n->in[1]];
        if (same_path(p, n, 3, path, "bias")) return NULL;
        bool bn = n->op == OP_BN_APPLY;
        if (stats->op != (bn ? OP_BN_EVAL_STATS : OP_LN_STATS) || (!bn && stats->in[0] != n->in[0])) {
            fail(p, "%s: %s takes %s, not the %s an evaluation graph has: export the evaluation form", where(p, n),
                 ir_op_name(n->op), ir_op_name(stats->op), bn ? "running statistics (bn_eval_stats)" : "input's ln_stats");
            return NULL;
        }
        if (bn && (same_path(p, stats, 0, path, "running_mean") || same_path(p, stats, 1, path, "running_var"))) return NULL;
        int c = g->nodes[n->in[2]].shape.d[0];
        const char *eps = py_float(p, stats->attr.eps);
        const Shape *ws = &g->nodes[param_source(g, n->in[2])].shape;
        if (!bn && ws->nd > 1) {   /* nn.LayerNorm([a, b, ...]) */
            const char *dims = "";
            for (int k = 0; k < ws->nd; k++) dims = arena_printf(p->a, "%s%s%d", dims, k ? ", " : "", ws->d[k]);
            ctor = arena_printf(p->a, "nn.LayerNorm([%s], eps=%s)", dims, eps);
        } else if (!bn) ctor = arena_printf(p->a, "nn.LayerNorm(%d, eps=%s)", c, eps);
        else if (p->bn1d[n - g->nodes]) ctor = arena_printf(p->a, "BatchNorm1d(%d, eps=%s)", c, eps), p->uses_bn1d = true;
        else ctor = arena_printf(p->a, "BatchNorm2d(%d, eps=%s)", c, eps), p->uses_bn2d = true;
    }
    Module *old = find_module(p, path, strlen(path));   /* a layer read again: the same one */
    if (old && old->layer && strcmp(old->layer, ctor)) {
        fail(p, "%s: two layers are named '%s' (%s and %s)", where(p, n), path, old->layer, ctor);
        return NULL;
    }
    if ((!old || !old->layer) && make_module(p, n, path, ctor)) return NULL;
    return module_ref(p, path, strlen(path));
}

/* A 'param' named "<path>.<leaf>" (or "<leaf>"): in __init__ an nn.Parameter of that
   shape on the Scope at path (made where not yet), the checkpoint's values loaded into
   it; its reference in forward, or NULL (said). */
static const char *own_param(Py *p, const Node *n)
{
    const char *dot = strrchr(n->name, '.'), *leaf = dot ? dot + 1 : n->name;
    size_t plen = dot ? (size_t)(dot - n->name) : 0;
    if (find_module(p, n->name, strlen(n->name))) {
        fail(p, "%s: '%s' is a param and the name of a module: PyTorch's names cannot say that", where(p, n), n->name);
        return NULL;
    }
    if (plen && make_module(p, n, arena_strndup(p->a, n->name, plen), NULL)) return NULL;
    char *shape = arena_strdup(p->a, "");
    for (int k = 0; k < n->shape.nd; k++) shape = arena_printf(p->a, "%s%s%d", shape, k ? ", " : "", n->shape.d[k]);
    const char *scope = module_ref(p, n->name, plen);
    const char *ref = attribute_name(leaf) ? arena_printf(p->a, "%s.%s", scope, leaf)
                                           : arena_printf(p->a, "getattr(%s, \"%s\")", scope, leaf);
    fprintf(p->init, "        %s.register_parameter(\"%s\", nn.Parameter(torch.zeros(%s)))   # param %s\n", scope, leaf, shape,
            n->name);
    add_module(p, n->name, strlen(n->name), "nn.Parameter");
    return ref;
}

/* ".reshape(-1, 120, 1, 1)" or ".flatten(1)": x to shape s */
static const char *reshape(Py *p, const Shape *from, const Shape *s)
{
    if (s->nd == 2 && from->nd > 2 && s->d[0] == IR_BATCH && from->d[0] == IR_BATCH) return ".flatten(1)";
    char *out = arena_strdup(p->a, ".reshape(");
    for (int k = 0; k < s->nd; k++) out = arena_printf(p->a, "%s%s%d", out, k ? ", " : "", s->d[k] == IR_BATCH ? -1 : s->d[k]);
    return arena_printf(p->a, "%s)", out);
}

/* Node id's value in forward (its module made in __init__ where it has one): 0, or -1 said. */
static int emit_node(Py *p, int id)
{
    const Graph *g = p->g;
    const Node *n = &g->nodes[id];
    int *refs = NULL, nrefs = 0, depth = 0;
    const char *x = NULL, *text = NULL;
    Prec prec = PREC_ATOM;
    if (n->op == OP_INPUT) {
        p->v[id] = (Value){ "x", PREC_ATOM, 0, id, NULL, 0 };
        p->left[id] = p->uses[id];
        p->fresh = 1;
        if (id == g->logits) fprintf(p->fwd, "        return x\n");
        return 0;
    }
    if (p->uses[id] == 0 && id != g->logits) return 0;   /* a layer's parameter, state or statistics: its module's */
    switch (n->op) {
    case OP_CONV2D: case OP_LINEAR: case OP_BN_APPLY: case OP_LN_APPLY: {
        const char *module = layer(p, n);
        if (!module) return -1;
        /* a statement starts at each convolution and linear layer, as the twins' do (a view, x.flatten(1), goes in) */
        if ((n->op == OP_CONV2D || n->op == OP_LINEAR) && p->v[n->in[0]].owner < 0 && p->v[n->in[0]].depth > 0)
            write_statement(p, n->in[0]);
        x = operand(p, n->in[0], n->op == OP_LN_APPLY && n->shape.nd == 4 ? PREC_ATOM : PREC_ADD, &refs, &nrefs, &depth);
        if (n->op == OP_LN_APPLY && n->shape.nd == 4)   /* over the channels at each position */
            text = arena_printf(p->a, "%s(%s.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)", module, x);
        else text = arena_printf(p->a, "%s(%s)", module, x);
        break;
    }
    case OP_MAXPOOL: case OP_AVGPOOL:
        x = operand(p, n->in[0], PREC_ADD, &refs, &nrefs, &depth);
        /* avg_pool2d counts the padding, as mgc does (its default count_include_pad=True) */
        text = arena_printf(p->a, "F.%s(%s, %d, %d", n->op == OP_MAXPOOL ? "max_pool2d" : "avg_pool2d", x, n->attr.kernel,
                            n->attr.stride);
        if (n->attr.padding || n->attr.ceil_mode || n->attr.exclude_pad) text = arena_printf(p->a, "%s, %d", text, n->attr.padding);
        if (n->attr.ceil_mode) text = arena_printf(p->a, "%s, ceil_mode=True", text);
        text = arena_printf(p->a, "%s%s)", text, n->attr.exclude_pad ? ", count_include_pad=False" : "");
        break;
    case OP_GAP: case OP_GLOBAL_MAXPOOL:
        x = operand(p, n->in[0], PREC_ADD, &refs, &nrefs, &depth);
        text = arena_printf(p->a, "F.adaptive_%s_pool2d(%s, 1)", n->op == OP_GAP ? "avg" : "max", x);
        break;
    case OP_ADAPTIVE_AVGPOOL:
        x = operand(p, n->in[0], PREC_ADD, &refs, &nrefs, &depth);
        text = arena_printf(p->a, "F.adaptive_avg_pool2d(%s, (%d, %d))", x, n->attr.height, n->attr.width);
        break;
    case OP_UPSAMPLE:
        x = operand(p, n->in[0], PREC_ADD, &refs, &nrefs, &depth);
        text = arena_printf(p->a, "F.interpolate(%s, scale_factor=%d, mode=\"%s\")", x, n->attr.scale,
                            n->attr.bilinear ? "bilinear" : "nearest");
        break;
    case OP_RESHAPE:
        if (p->alias[id]) {
            alias_value(p, id, n->in[0]);
            return 0;
        }
        x = operand(p, n->in[0], PREC_ATOM, &refs, &nrefs, &depth);
        text = arena_printf(p->a, "%s%s", x, reshape(p, &g->nodes[n->in[0]].shape, &n->shape));
        depth--;   /* a method, not a call around it */
        break;
    case OP_CONCAT: {   /* an input of batch 1 (a param: a class token) .expand()ed to the batch of one that has it */
        int full = 0;
        while (full < n->nin - 1 && g->nodes[n->in[full]].shape.d[0] == 1) full++;
        bool expand = false;
        for (int k = 0; k < n->nin; k++) expand |= g->nodes[n->in[k]].shape.d[0] == 1 && n->shape.d[0] != 1;
        if (expand && p->v[n->in[full]].owner < 0 && p->v[n->in[full]].depth > 0) write_statement(p, n->in[full]);
        char *list = arena_strdup(p->a, "");
        for (int k = 0; k < n->nin; k++) {
            const Shape *ks = &g->nodes[n->in[k]].shape;
            bool once = ks->d[0] == 1 && n->shape.d[0] != 1;
            const char *t = operand(p, n->in[k], once ? PREC_ATOM : PREC_ADD, &refs, &nrefs, &depth);
            if (once) {
                t = arena_printf(p->a, "%s.expand(%s.shape[0]", t, p->v[n->in[full]].text);
                for (int d = 1; d < ks->nd; d++) t = arena_printf(p->a, "%s, -1", t);
                t = arena_printf(p->a, "%s)", t);
            }
            list = arena_printf(p->a, "%s%s%s", list, k ? ", " : "", t);
        }
        text = arena_printf(p->a, "torch.cat([%s], %d)", list, n->attr.axis);
        break;
    }
    case OP_ADD: case OP_SUB: case OP_MUL: {
        /* left to right, as mgc computes one op at a time: a right operand
           of the same precedence keeps its parentheses ((a * (b * c)) */
        prec = n->op == OP_MUL ? PREC_MUL : PREC_ADD;
        const char *a = operand(p, n->in[0], prec, &refs, &nrefs, &depth);
        const char *b = operand(p, n->in[1], (Prec)(prec + 1), &refs, &nrefs, &depth);
        text = arena_printf(p->a, "%s %c %s", a, n->op == OP_ADD ? '+' : n->op == OP_SUB ? '-' : '*', b);
        break;
    }
    case OP_CONV2D_BWD_X: {   /* a conv_transpose2d layer: its weight (and bias) params of its Scope, as nn.ConvTranspose2d's */
        const Shape *ws = &g->nodes[n->in[1]].shape;
        int K = ws->d[2], S = n->attr.stride, D = ir_dilation(&n->attr);
        int op = n->shape.d[2] - ((g->nodes[n->in[0]].shape.d[2] - 1) * S - 2 * n->attr.padding + D * (K - 1) + 1);
        const char *a = operand(p, n->in[0], PREC_ADD, &refs, &nrefs, &depth), *w = operand(p, n->in[1], PREC_ADD, &refs, &nrefs, &depth);
        text = arena_printf(p->a, "F.conv_transpose2d(%s, %s, stride=%d, padding=%d, output_padding=%d, groups=%d, dilation=%d)", a, w,
                            S, n->attr.padding, op, ir_groups(&n->attr), D);
        break;
    }
    case OP_MATMUL: {
        const char *a = operand(p, n->in[0], n->attr.trans_a ? PREC_ATOM : PREC_ADD, &refs, &nrefs, &depth);
        const char *b = operand(p, n->in[1], n->attr.trans_b ? PREC_ATOM : PREC_ADD, &refs, &nrefs, &depth);
        text = arena_printf(p->a, "torch.matmul(%s%s, %s%s)", a, n->attr.trans_a ? ".mT" : "", b, n->attr.trans_b ? ".mT" : "");
        break;
    }
    case OP_ATTENTION: {   /* attention_stats is its own */
        const char *a[3];
        for (int k = 0; k < 3; k++) a[k] = operand(p, n->in[k], PREC_ADD, &refs, &nrefs, &depth);
        text = arena_printf(p->a, "attention(%s, %s, %s, %d%s)", a[0], a[1], a[2], n->attr.heads, n->attr.causal ? ", causal=True" : "");
        p->uses_attention = true;
        break;
    }
    case OP_TRANSPOSE: case OP_SELECT: case OP_REDUCE_SUM: case OP_REDUCE_MEAN: case OP_SOFTMAX:
        x = operand(p, n->in[0], PREC_ATOM, &refs, &nrefs, &depth);
        text = n->op == OP_TRANSPOSE ? arena_printf(p->a, "%s.transpose(%d, %d)", x, n->attr.dim0, n->attr.dim1)
             : n->op == OP_SELECT    ? arena_printf(p->a, "%s.select(%d, %d)", x, n->attr.axis, n->attr.index)
                                     : arena_printf(p->a, "%s.%s(%d)", x, ir_op_name(n->op), n->attr.axis);
        depth--;   /* a method, not a call around it */
        break;
    case OP_PARAM:   /* a net's own learned tensor ('param'): an nn.Parameter of its Scope */
        if (!(text = own_param(p, n))) return -1;
        depth = -1;
        break;
    case OP_NEG:
        text = arena_printf(p->a, "-%s", operand(p, n->in[0], PREC_UNARY, &refs, &nrefs, &depth));
        prec = PREC_UNARY;
        depth--;
        break;
    default:
        if (ir_activation_grad(n->op) != OP_COUNT) {
            x = operand(p, n->in[0], PREC_ADD, &refs, &nrefs, &depth);
            text = activation(p, n, x);
        }
        if (!text)
            return fail(p, "%s: %s has no PyTorch form here (mgc export --format pytorch writes the ops of an "
                        "evaluation graph: layers, activations, pooling, reshapes, concat, add, mul, sub)",
                        where(p, n), ir_op_name(n->op));
    }
    set_value(p, id, text, prec, depth + 1, refs, nrefs);
    return 0;
}

/* ---- the walk ---- */

/* Which nodes the logits need, and how often each value is read. A
   layer's parameters, state and statistics are needed (their tensors are
   checked) but not read as values. */
static void mark(Py *p)
{
    const Graph *g = p->g;
    p->needed[g->logits] = true;
    for (int id = g->logits; id >= 0; id--) {
        const Node *n = &g->nodes[id];
        if (!p->needed[id]) continue;
        bool layer = n->op == OP_CONV2D || n->op == OP_LINEAR || n->op == OP_BN_APPLY || n->op == OP_LN_APPLY;
        for (int k = 0; k < n->nin; k++) {
            p->needed[layer && k > 0 ? param_source(g, n->in[k]) : n->in[k]] = true;   /* a weight's view is the module's */
            if (n->op == OP_BN_EVAL_STATS || n->op == OP_LN_STATS || n->op == OP_ATTN_STATS || (layer && k > 0) ||
                (n->op == OP_ATTENTION && k == 3))
                continue;   /* statistics the layer or attention() computes itself */
            p->uses[n->in[k]]++;
            p->user[n->in[k]] = id;
        }
    }
    /* batchnorm1d: reshape [N, F] -> [N, F, 1, 1], BatchNorm, reshape back */
    for (int id = 0; id <= g->logits; id++) {
        const Node *n = &g->nodes[id];
        if (!p->needed[id] || n->op != OP_BN_APPLY || n->shape.nd != 4 || n->shape.d[2] != 1 || n->shape.d[3] != 1) continue;
        const Node *in = &g->nodes[n->in[0]];
        if (in->op != OP_RESHAPE || g->nodes[in->in[0]].shape.nd != 2 || p->uses[n->in[0]] != 1) continue;
        if (p->uses[id] != 1 || g->nodes[p->user[id]].op != OP_RESHAPE || id == g->logits) continue;
        const Node *out = &g->nodes[p->user[id]];
        if (!ir_shape_eq(&out->shape, &g->nodes[in->in[0]].shape)) continue;
        p->alias[n->in[0]] = p->alias[p->user[id]] = p->bn1d[id] = true;
    }
    /* layernorm(shape = [...]): reshape X to rows of the last dimensions, LayerNorm, reshape back: nn.LayerNorm of
       the weight's shape on X, where X's last dimensions are that shape */
    for (int id = 0; id <= g->logits; id++) {
        const Node *n = &g->nodes[id];
        if (!p->needed[id] || n->op != OP_LN_APPLY || id == g->logits || p->uses[id] != 1) continue;
        const Node *in = &g->nodes[n->in[0]], *out = &g->nodes[p->user[id]];
        if (in->op != OP_RESHAPE || p->uses[n->in[0]] != 1 || out->op != OP_RESHAPE) continue;
        const Shape *xs = &g->nodes[in->in[0]].shape, *ws = &g->nodes[param_source(g, n->in[2])].shape;
        bool last = ir_shape_eq(&out->shape, xs) && ws->nd < xs->nd;
        for (int k = 0; last && k < ws->nd; k++) last = xs->d[xs->nd - ws->nd + k] == ws->d[k];
        if (last) p->alias[n->in[0]] = p->alias[p->user[id]] = true;
    }
}

/* Every parameter and state tensor the logits need is in the checkpoint,
   float32 of its shape: 0, or -1 said. */
static int check_weights(Py *p)
{
    const Graph *g = p->g;
    for (int id = 0; id <= g->logits; id++) {
        const Node *n = &g->nodes[id];
        if (!p->needed[id] || (n->op != OP_PARAM && n->op != OP_STATE)) continue;
        const StTensor *t = st_find(p->m->weights, n->name);
        const char *want = ir_shape_str(p->a, &n->shape);
        if (!t) return fail(p, "%s has no tensor '%s' (the net's %s, %s)", p->m->checkpoint, n->name, want, where(p, n));
        bool same = t->nd == n->shape.nd && !strcmp(t->dtype, "F32");
        for (int d = 0; same && d < t->nd; d++) same = t->shape[d] == n->shape.d[d];
        if (!same) {
            char *has = arena_printf(p->a, "%s [", t->dtype);
            for (int d = 0; d < t->nd; d++) has = arena_printf(p->a, "%s%s%lld", has, d ? "," : "", t->shape[d]);
            return fail(p, "%s: '%s' is %s], the net's is F32 %s (%s)", p->m->checkpoint, n->name, has, want, where(p, n));
        }
    }
    return 0;
}

/* ---- the file ---- */

static const char *module_name(Py *p, const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strlen(base);
    if (len > 3 && !strcmp(base + len - 3, ".py")) len -= 3;
    return arena_strndup(p->a, base, len);
}

/* The floats of a tuple: "(0.2860402,)", "(0.49, 0.48, 0.45)" */
static const char *float_tuple(Py *p, const float *v, int n)
{
    char *s = arena_strdup(p->a, "(");
    for (int k = 0; k < n; k++) s = arena_printf(p->a, "%s%s%s", s, k ? ", " : "", py_float(p, v[k]));
    return arena_printf(p->a, "%s%s)", s, n == 1 ? "," : "");
}

static void write_header(Py *p, FILE *f, const char *path)
{
    const ExModel *m = p->m;
    const CkModel *info = m->info;
    fprintf(f, "\"\"\"%s", py_text(p, m->net_name));
    if (info->net_file) fprintf(f, " (%s)", py_text(p, info->net_file));
    fprintf(f, " as a PyTorch module, written by mgc %s (mgc export --format pytorch)\nfrom the checkpoint %s.\n\n",
            MGC_VERSION, py_text(p, m->checkpoint));
    fprintf(f, "    import %s\n", module_name(p, path));
    const char *ck = strrchr(m->checkpoint, '/');
    fprintf(f, "    net = %s.load(\"%s\")   # Net() with the checkpoint's tensors, in evaluation mode\n",
            module_name(p, path), py_text(p, ck ? ck + 1 : m->checkpoint));
    fprintf(f, "    logits = net(%s.transform(images))   # images [N, %s]%s\n\n", module_name(p, path), p->input_shape,
            info->pixels == CK_PIXELS_FLOATS ? " as the data set stores them" : ": uint8 pixels, or floats in [0, 1]");
    fprintf(f, "Net's state_dict keys are the checkpoint's tensor names: Net().load_state_dict(tensors)\n"
               "takes them (strict). forward(x) is the net's evaluation graph from the input to the\n"
               "logits (BatchNorm on its running statistics, dropout off; the loss left out).\n");
    if (info->sets && *info->sets) {
        fprintf(f, "Its --set values:");
        for (const char *s = info->sets; *s;) {
            size_t len = strcspn(s, "\n");
            fprintf(f, " %s", py_text(p, arena_strndup(p->a, s, len)));
            s += len + (s[len] == '\n');
        }
        fprintf(f, "\n");
    }
    if (info->bf16 == 1)
        fprintf(f, "It was trained with --precision bf16, in which mgc multiplies the convolutions' and linear\n"
                   "layers' operands (as torch.autocast(\"cpu\", dtype=torch.bfloat16) does): in float32, as here,\n"
                   "its logits differ from mgc predict's by about bf16's rounding.\n");
    fprintf(f, "Needs torch alone; reads the checkpoint with the safetensors package where installed.\n\"\"\"\n");
    fprintf(f, "import json\nimport math\nimport struct\nimport sys\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n");
    fprintf(f, "INPUT_SHAPE = (%s)   # an example as Net takes it\n", p->input_shape);
    fprintf(f, "CLASSES = %d\n", p->g->nodes[p->g->logits].shape.d[1]);
}

static void write_transform(Py *p, FILE *f)
{
    const CkModel *info = p->m->info;
    bool resize = info->has_transform && info->resize_h > 0, normalize = info->has_transform && info->normalize;
    if (resize) fprintf(f, "RESIZE = (%d, %d)   # --resize: height, width\n", info->resize_h, info->resize_w);
    if (normalize) {
        fprintf(f, "MEAN = %s   # --normalize: the training set's, per channel\n", float_tuple(p, info->mean, info->nchannels));
        fprintf(f, "STD = %s\n", float_tuple(p, info->std, info->nchannels));
    }
    fprintf(f, "\n\ndef transform(images):\n    \"\"\"Images [N, C, H, W] -> Net's input, as the checkpoint's training made them:\n");
    if (info->pixels == CK_PIXELS_FLOATS) fprintf(f, "    floats as the data set stores them (not scaled)");
    else fprintf(f, "    uint8 pixels / 255 (as ToTensor; floats are taken as already scaled)");
    if (resize) fprintf(f, ", resized bilinearly\n    (torchvision's Resize(RESIZE, antialias=False))");
    if (normalize) fprintf(f, ", normalised with the\n    training set's MEAN and STD");
    if (!info->has_transform)
        fprintf(f, ".\n    The checkpoint does not say what else its images went through (it was saved\n"
                   "    before any data was read, or by an older mgc): nothing more is done");
    fprintf(f, ".\"\"\"\n");
    if (info->pixels == CK_PIXELS_FLOATS) fprintf(f, "    x = images.float()\n");
    else fprintf(f, "    x = images.float() / 255 if images.dtype == torch.uint8 else images.float()\n");
    if (resize) fprintf(f, "    x = F.interpolate(x, size=RESIZE, mode=\"bilinear\", align_corners=False)\n");
    if (normalize)
        fprintf(f, "    x = (x - torch.tensor(MEAN).view(1, -1, 1, 1)) / torch.tensor(STD).view(1, -1, 1, 1)\n");
    fprintf(f, "    return x\n");
}

static const char py_classes[] =
    "\n\nclass Scope(nn.Module):\n"
    "    \"\"\"One level of the checkpoint's dotted names (stage2, stage2.0): children by any\n"
    "    name, scope[\"0\"], where Python's attributes cannot hold it (a digit, a keyword,\n"
    "    a name nn.Module already has).\"\"\"\n\n"
    "    def __getitem__(self, name):\n"
    "        return self._modules[name]\n\n"
    "    def __setitem__(self, name, module):\n"
    "        self._modules[name] = module\n";

static const char py_flag_children[] =
    "\n    def __setattr__(self, name, value):\n"
    "        if not isinstance(value, nn.Module) and name in self.__dict__.get(\"_modules\", {}):\n"
    "            object.__setattr__(self, name, value)   # nn.Module's own field (training) beside a child so named\n"
    "        else:\n"
    "            super().__setattr__(name, value)\n";

static const char py_batchnorm[] =
    "\n\ndef _checkpoint_batchnorm(base):\n"
    "    \"\"\"base (nn.BatchNorm1d or 2d) holding the tensors mgc's checkpoints hold: weight,\n"
    "    bias, running_mean, running_var; not num_batches_tracked. momentum is PyTorch's\n"
    "    default (the evaluation graph does not keep the .net file's).\"\"\"\n\n"
    "    class BatchNorm(base):\n"
    "        def __init__(self, channels, eps):\n"
    "            super().__init__(channels, eps)\n"
    "            self.num_batches_tracked = None\n\n"
    "        def _load_from_state_dict(self, state_dict, prefix, *args):\n"
    "            nn.Module._load_from_state_dict(self, state_dict, prefix, *args)   # adds no num_batches_tracked\n\n"
    "    BatchNorm.__name__ = BatchNorm.__qualname__ = base.__name__\n"
    "    return BatchNorm\n\n\n";

static const char py_attention[] =
    "\n\ndef attention(q, k, v, heads, causal=False):\n"
    "    \"\"\"mgc's attention: scaled dot-product attention (F.scaled_dot_product_attention's) on q [N, Tq, D],\n"
    "    k and v [N, Tk, D] split into heads of D / heads features, the heads side by side again.\"\"\"\n"
    "    n, tq, d = q.shape\n"
    "    split = lambda t: t.reshape(n, t.shape[1], heads, d // heads).transpose(1, 2)\n"
    "    s = split(q) @ split(k).transpose(-2, -1) / math.sqrt(d // heads)\n"
    "    if causal:   # query i sees keys 0..i\n"
    "        s = s.masked_fill(torch.ones(tq, k.shape[1], dtype=torch.bool, device=q.device).tril().logical_not(), float(\"-inf\"))\n"
    "    return (torch.softmax(s, -1) @ split(v)).transpose(1, 2).reshape(n, tq, d)\n";

static const char py_load[] =
    "\n\ndef read_safetensors(path):\n"
    "    \"\"\"Every tensor of a safetensors file, by name: with the safetensors package where it\n"
    "    is installed, else here (a little-endian u64, the JSON header's length; the header:\n"
    "    each tensor's dtype, shape and data offsets; the raw little-endian data).\"\"\"\n"
    "    try:\n"
    "        from safetensors.torch import load_file\n"
    "    except ImportError:\n"
    "        load_file = None\n"
    "    if load_file is not None:\n"
    "        return load_file(path)\n"
    "    if sys.byteorder != \"little\":\n"
    "        raise RuntimeError(\"this reader takes a little-endian machine's bytes: install safetensors\")\n"
    "    dtypes = {\"F64\": torch.float64, \"F32\": torch.float32, \"F16\": torch.float16, \"BF16\": torch.bfloat16,\n"
    "              \"I64\": torch.int64, \"I32\": torch.int32, \"I16\": torch.int16, \"I8\": torch.int8,\n"
    "              \"U8\": torch.uint8, \"BOOL\": torch.bool}\n"
    "    with open(path, \"rb\") as f:\n"
    "        (length,) = struct.unpack(\"<Q\", f.read(8))\n"
    "        header = json.loads(f.read(length))\n"
    "        data = f.read()\n"
    "    tensors = {}\n"
    "    for name, info in header.items():\n"
    "        if name == \"__metadata__\":\n"
    "            continue\n"
    "        begin, end = info[\"data_offsets\"]\n"
    "        dtype = dtypes[info[\"dtype\"]]\n"
    "        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype) if end > begin else torch.empty(0, dtype=dtype)\n"
    "        tensors[name] = flat.reshape(info[\"shape\"])\n"
    "    return tensors\n\n\n"
    "def load(path):\n"
    "    \"\"\"Net with the checkpoint's tensors, in evaluation mode: every tensor Net has, by name\n"
    "    and shape (strict); the checkpoint's others (an optimizer's state, kept for --resume)\n"
    "    are left.\"\"\"\n"
    "    net = Net()\n"
    "    names = net.state_dict().keys()\n"
    "    net.load_state_dict({k: v for k, v in read_safetensors(path).items() if k in names})\n"
    "    return net.eval()\n";

static int write_file(Py *p, const char *path)
{
    char *tmp = arena_printf(p->a, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return fail(p, "%s (writing %s)", strerror(errno), tmp);
    write_header(p, f, path);
    write_transform(p, f);
    fputs(py_classes, f);
    if (p->flag_children) fputs(py_flag_children, f);
    if (p->uses_attention) fputs(py_attention, f);
    if (p->uses_bn1d || p->uses_bn2d) {
        fputs(py_batchnorm, f);
        if (p->uses_bn1d) fprintf(f, "BatchNorm1d = _checkpoint_batchnorm(nn.BatchNorm1d)\n");
        if (p->uses_bn2d) fprintf(f, "BatchNorm2d = _checkpoint_batchnorm(nn.BatchNorm2d)\n");
    }
    fprintf(f, "\n\nclass Net(Scope):\n    \"\"\"%s: x [N, %s] -> logits [N, %d]\"\"\"\n\n", py_text(p, p->m->net_name),
            p->input_shape, p->g->nodes[p->g->logits].shape.d[1]);
    fprintf(f, "    def __init__(self):\n        super().__init__()\n");
    fwrite(p->init_text, 1, p->init_len, f);
    fprintf(f, "\n    def forward(self, x):\n");
    fwrite(p->fwd_text, 1, p->fwd_len, f);
    fputs(py_load, f);
    bool ok = !ferror(f);
    ok = !fclose(f) && ok;
    if (!ok || rename(tmp, path)) {
        int e = errno;
        remove(tmp);
        return fail(p, "%s (writing %s)", strerror(e), tmp);
    }
    return 0;
}

int ex_pytorch(const ExModel *m, const char *path, char *err, size_t err_size)
{
    const Graph *g = m->graph;
    if (g->input < 0 || g->logits < 0) {
        snprintf(err, err_size, "cannot write %s: the net has no %s", path, g->input < 0 ? "input" : "logits (no softmax_cross_entropy)");
        return -1;
    }
    Arena arena;
    arena_init(&arena);
    Py p = { .m = m, .g = g, .a = &arena, .err = err, .err_size = err_size };
    size_t n = (size_t)g->n;
    p.needed = arena_alloc(&arena, n * sizeof *p.needed);
    p.uses = arena_alloc(&arena, n * sizeof *p.uses);
    p.user = arena_alloc(&arena, n * sizeof *p.user);
    p.alias = arena_alloc(&arena, n * sizeof *p.alias);
    p.bn1d = arena_alloc(&arena, n * sizeof *p.bn1d);
    p.v = arena_alloc(&arena, n * sizeof *p.v);
    p.left = arena_alloc(&arena, n * sizeof *p.left);
    p.free_names = arena_alloc(&arena, n * sizeof *p.free_names);
    const Shape *in = &g->nodes[g->input].shape;
    char *shape = arena_strdup(&arena, "");
    for (int k = 1; k < in->nd; k++) shape = arena_printf(&arena, "%s%s%d", shape, k > 1 ? ", " : "", in->d[k]);
    p.input_shape = shape;
    mark(&p);
    int rc = check_weights(&p);
    p.init = open_memstream(&p.init_text, &p.init_len);
    p.fwd = open_memstream(&p.fwd_text, &p.fwd_len);
    if (!p.init || !p.fwd) rc = fail(&p, "out of memory");
    for (int id = 0; !rc && id <= g->logits; id++)
        if (p.needed[id]) rc = emit_node(&p, id);
    if (p.init) fclose(p.init);
    if (p.fwd) fclose(p.fwd);
    if (!rc) rc = write_file(&p, path);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, err_size, "cannot export %s to %s: %s", g->net_name, path, why);
    }
    free(p.init_text);
    free(p.fwd_text);
    arena_free(&arena);
    return rc;
}
