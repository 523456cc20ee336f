/*
** Whole-file static checks of a .net file, run before elaboration: they
** look at the syntax tree once, without running anything. One net, no
** duplicate definitions or parameters, every layer/block name known
** (with a "did you mean" suggestion), 'input' only in the net, nothing
** after a 'return', 'N' not rebound, and no recursion between blocks
** (a depth-first search over block references). Every problem is reported
** with diag_at(); the caller (frontend/elab.c) stops if any was found.
*/
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "layers.h"

typedef struct Checker {
    Elab *E;
    int errors;
} Checker;

static void check_expr(Checker *C, const Ast *e);

static void check_callee(Checker *C, const Ast *e)
{
    Elab *E = C->E;
    if (fe_is_function(e->name)) {
        if (e->kind == AST_CALL) return;
        diag_at(E->d, e->name_loc, "'%s' is a function of numbers, not a layer; write %s(a, b, ...) in an "
                "expression, e.g. %s(1, x.channels / 4)", e->name, e->name, e->name);
        C->errors++;
        return;
    }
    if (fe_find_layer(e->name) >= 0 || fe_find_block(E->defs, e->name)) return;
    const char *cands[64 + 256];
    int n = 0;
    for (int i = 0; i < fe_nlayers && n < 64; i++) cands[n++] = fe_layers[i].name;
    for (FeDef *d = E->defs; d && n < 64 + 256; d = d->next)
        if (!d->is_net) cands[n++] = d->name;
    const char *s = fe_suggest(e->name, cands, n);
    if (s) {
        diag_at(E->d, e->name_loc, "unknown layer '%s'; did you mean '%s'?", e->name, s);
    } else {
        /* every built-in layer, from the layer table (mgc --list-layers says their arguments) */
        char list[1024];
        size_t len = 0;
        for (int i = 0; i < fe_nlayers && len < sizeof list; i++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", fe_layers[i].name);
        diag_at(E->d, e->name_loc, "unknown layer '%s'; expected a built-in layer (%s; mgc --list-layers) or a block defined in this file",
                e->name, list);
    }
    C->errors++;
}

static void check_args(Checker *C, const Ast *args)
{
    for (const Ast *a = args; a; a = a->next) check_expr(C, a->lhs);
}

static void check_expr(Checker *C, const Ast *e)
{
    if (!e) return;
    switch (e->kind) {
    case AST_CALL:
    case AST_STAGE:
        check_callee(C, e);
        if (e->label) check_expr(C, e->label);
        check_args(C, e->args);
        break;
    case AST_LIST:
        check_args(C, e->args);
        break;
    case AST_PIPE:      /* a long chain is walked, not recursed into */
        while (e->kind == AST_PIPE) {
            check_expr(C, e->rhs);
            e = e->lhs;
        }
        check_expr(C, e);
        break;
    case AST_BINARY:
    case AST_UNARY:
    case AST_ATTR:
        check_expr(C, e->lhs);
        check_expr(C, e->rhs);
        break;
    case AST_COND:
        check_expr(C, e->cond);
        check_expr(C, e->lhs);
        check_expr(C, e->rhs);
        break;
    default:
        break;
    }
}

static bool reserved_name(Elab *E, const char *name, Loc loc)
{
    if (strcmp(name, "N")) return false;
    diag_at(E->d, loc, "'N' is reserved for the batch size; choose another name");
    return true;
}

static void check_stmts(Checker *C, const FeDef *def, const Ast *s, bool *has_input, bool *has_return)
{
    Elab *E = C->E;
    for (; s; s = s->next) {
        switch (s->kind) {
        case AST_INPUT:
            *has_input = true;
            if (!def->is_net) {
                diag_at(E->d, s->loc, "'input' is only allowed in the net; block '%s' gets its input "
                        "from its input list", def->name);
                C->errors++;
            }
            check_args(C, s->args);
            break;
        case AST_PARAM:
            if (reserved_name(E, s->name, s->name_loc)) C->errors++;
            check_args(C, s->args);
            if (!fe_param_init_known(s->lhs)) {
                diag_at(E->d, s->lhs->loc, "a param's initialiser is zeros, ones, constant(value) or normal(std), "
                        "as PyTorch's torch.zeros, torch.ones, torch.full and torch.randn(...) * std");
                C->errors++;
            } else if (s->lhs->kind == AST_CALL) {
                check_args(C, s->lhs->args);
            }
            break;
        case AST_ASSIGN:
            if (reserved_name(E, s->name, s->name_loc)) C->errors++;
            check_expr(C, s->lhs);
            break;
        case AST_RETURN:
            *has_return = true;
            check_expr(C, s->lhs);
            if (s->next) {
                diag_at(E->d, s->next->loc, "statement after 'return' would never run");
                C->errors++;
            }
            break;
        case AST_IF:
            for (const Ast *i = s; i; i = i->els) {
                if (i->kind == AST_IF) check_expr(C, i->cond);
                check_stmts(C, def, i->body, has_input, has_return);
            }
            break;
        case AST_FOR:
            if (reserved_name(E, s->name, s->name_loc)) C->errors++;
            check_expr(C, s->lhs);
            check_expr(C, s->rhs);
            check_stmts(C, def, s->body, has_input, has_return);
            break;
        default:
            break;
        }
    }
}

/* Block references of an expression/statement tree, for the recursion check. */
typedef struct RefVisit {
    Elab *E;
    FeDef **stack;        /* blocks on the current path */
    int n;
    int *state;           /* per block index: 0 unvisited, 1 on path, 2 done */
    FeDef **index;        /* block index -> def */
    int nblocks;
    bool found;
} RefVisit;

static void visit_block(RefVisit *V, FeDef *b, const Ast *site);

static int block_index(RefVisit *V, const FeDef *b)
{
    for (int i = 0; i < V->nblocks; i++)
        if (V->index[i] == b) return i;
    return -1;
}

static void visit_expr(RefVisit *V, const Ast *e)
{
    for (; e && !V->found; ) {
        switch (e->kind) {
        case AST_CALL:
        case AST_STAGE: {
            FeDef *b = fe_find_layer(e->name) >= 0 ? NULL : fe_find_block(V->E->defs, e->name);
            if (b) visit_block(V, b, e);
            if (e->label) visit_expr(V, e->label);
            for (const Ast *a = e->args; a && !V->found; a = a->next) visit_expr(V, a->lhs);
            return;
        }
        case AST_LIST:
            for (const Ast *a = e->args; a && !V->found; a = a->next) visit_expr(V, a->lhs);
            return;
        case AST_PIPE:
            visit_expr(V, e->rhs);
            e = e->lhs;
            continue;
        case AST_BINARY: case AST_UNARY: case AST_ATTR:
            visit_expr(V, e->lhs);
            e = e->rhs;
            continue;
        case AST_COND:
            visit_expr(V, e->cond);
            visit_expr(V, e->lhs);
            e = e->rhs;
            continue;
        default:
            return;
        }
    }
}

static void visit_stmts(RefVisit *V, const Ast *s)
{
    for (; s && !V->found; s = s->next) {
        switch (s->kind) {
        case AST_INPUT:
            for (const Ast *a = s->args; a; a = a->next) visit_expr(V, a->lhs);
            break;
        case AST_ASSIGN: case AST_RETURN:
            visit_expr(V, s->lhs);
            break;
        case AST_PARAM:
            for (const Ast *a = s->args; a; a = a->next) visit_expr(V, a->lhs);
            if (s->lhs->kind == AST_CALL)
                for (const Ast *a = s->lhs->args; a; a = a->next) visit_expr(V, a->lhs);
            break;
        case AST_IF:
            for (const Ast *i = s; i && !V->found; i = i->els) {
                if (i->kind == AST_IF) visit_expr(V, i->cond);
                visit_stmts(V, i->body);
            }
            break;
        case AST_FOR:
            visit_expr(V, s->lhs);
            visit_expr(V, s->rhs);
            visit_stmts(V, s->body);
            break;
        default:
            break;
        }
    }
}

static void visit_params(RefVisit *V, const FeParam *p)
{
    for (; p && !V->found; p = p->next) visit_expr(V, p->def);
}

static void visit_block(RefVisit *V, FeDef *b, const Ast *site)
{
    int i = block_index(V, b);
    if (i < 0 || V->state[i] == 2) return;
    if (V->state[i] == 1) {
        /* b is on the path: the cycle is b ... -> b */
        char buf[512];
        size_t n = 0;
        int from = 0;
        while (from < V->n && V->stack[from] != b) from++;
        for (int k = from; k < V->n && n < sizeof buf; k++)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s -> ", V->stack[k]->name);
        if (n < sizeof buf) snprintf(buf + n, sizeof buf - n, "%s", b->name);
        diag_at(V->E->d, site->name_loc, "recursive use of block '%s' (%s); blocks cannot use "
                "themselves, directly or through other blocks", b->name, buf);
        V->found = true;
        return;
    }
    V->state[i] = 1;
    V->stack[V->n++] = b;
    visit_params(V, b->params);
    visit_stmts(V, b->body);
    V->n--;
    V->state[i] = 2;
}

/* Returns the number of errors found. */
int fe_check_file(Elab *E, const SourceFile *file)
{
    Checker C = { E, 0 };
    Diag *d = E->d;

    /* one net; definitions unique; no block named like a layer */
    int nblocks = 0;
    for (FeDef *def = E->defs; def; def = def->next) {
        if (def->is_net) {
            if (E->net) {
                diag_at(d, def->loc, "second 'net' definition ('%s'); a file holds exactly one net",
                        def->name);
                diag_note(d, E->net->loc, "the first is '%s', here", E->net->name);
                C.errors++;
            } else {
                E->net = def;
            }
        } else {
            nblocks++;
            if (fe_find_layer(def->name) >= 0 || fe_is_function(def->name)) {
                diag_at(d, def->name_loc, "block '%s' has the name of a built-in %s; choose another name",
                        def->name, fe_is_function(def->name) ? "function" : "layer");
                C.errors++;
            }
        }
        for (FeDef *prev = E->defs; prev != def; prev = prev->next)
            if (!strcmp(prev->name, def->name)) {
                diag_at(d, def->name_loc, "'%s' is defined twice", def->name);
                diag_note(d, prev->name_loc, "first defined here");
                C.errors++;
                break;
            }
        /* parameters: unique names, defaults for the net, one input for a block */
        for (FeParam *p = def->params; p; p = p->next) {
            if (reserved_name(E, p->name, p->loc)) C.errors++;
            for (FeParam *q = def->params; q != p; q = q->next)
                if (!strcmp(q->name, p->name)) {
                    diag_at(d, p->loc, "parameter '%s' is listed twice", p->name);
                    C.errors++;
                    break;
                }
            if (def->is_net && !p->def) {
                diag_at(d, p->loc, "net parameter '%s' needs a default value, e.g. '%s = 10' "
                        "(it can be changed with --set %s=VALUE)", p->name, p->name, p->name);
                C.errors++;
            }
            check_expr(&C, p->def);
        }
        if (!def->is_net) {
            int nin = 0;
            for (FeParam *p = def->inputs; p; p = p->next) {
                nin++;
                for (FeParam *q = def->inputs; q != p; q = q->next)
                    if (!strcmp(q->name, p->name)) {
                        diag_at(d, p->loc, "block '%s' has two inputs named '%s'", def->name, p->name);
                        C.errors++;
                        break;
                    }
                if (p->def) {
                    diag_at(d, p->loc, "the input '%s' of block '%s' cannot have a default value",
                            p->name, def->name);
                    C.errors++;
                }
                for (FeParam *q = def->params; q; q = q->next)
                    if (!strcmp(q->name, p->name)) {
                        diag_at(d, p->loc, "the input '%s' has the name of a parameter of block '%s'",
                                p->name, def->name);
                        C.errors++;
                        break;
                    }
            }
            if (nin == 0) {
                diag_at(d, def->name_loc, "block '%s' has no input; write 'block %s(params)(x) { ... }'",
                        def->name, def->name);
                C.errors++;
            }
        }
        bool has_input = false, has_return = false;
        check_stmts(&C, def, def->body, &has_input, &has_return);
        if (def->is_net && !has_input) {
            diag_at(d, def->name_loc, "net '%s' has no 'input' statement; expected e.g. "
                    "'input x[N, 1, 28, 28]' in its body", def->name);
            C.errors++;
        }
        if (!has_return) {
            diag_at(d, def->end_loc, "missing 'return' in %s '%s'; expected 'return' and the value "
                    "it produces before this '}'", def->is_net ? "net" : "block", def->name);
            C.errors++;
        }
    }
    if (!E->net) {
        Loc l = { file, 1, 1 };
        if (E->defs)
            diag_at(d, l, "no 'net' definition in this file; expected 'net NAME(params) { ... }'");
        else
            diag_at(d, l, "the file defines nothing; expected 'net NAME(params) { ... }'");
        C.errors++;
    }
    if (C.errors) return C.errors;

    /* recursion between blocks: depth-first search over every block */
    RefVisit V = { E, NULL, 0, NULL, NULL, nblocks, false };
    V.stack = arena_alloc(E->a, sizeof(FeDef *) * (size_t)(nblocks + 1));
    V.state = arena_alloc(E->a, sizeof(int) * (size_t)(nblocks + 1));
    V.index = arena_alloc(E->a, sizeof(FeDef *) * (size_t)(nblocks + 1));
    int k = 0;
    for (FeDef *def = E->defs; def; def = def->next)
        if (!def->is_net) V.index[k++] = def;
    for (int i = 0; i < nblocks && !V.found; i++)
        visit_block(&V, V.index[i], NULL);
    if (V.found) C.errors++;
    return C.errors;
}
