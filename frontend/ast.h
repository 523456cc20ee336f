/*
** The front end's internal header: the syntax tree of a .net file and the
** state shared by the lexer (frontend/lexer.l), the parser
** (frontend/parser.y) and the elaborator (frontend/elab.c).
**
** Every node carries the Loc of its first token. All nodes, strings and
** lists live in the compilation's Arena (the Graph's), so the Locs that the
** IR keeps stay valid as long as the graph does. Nothing here is global:
** the flex scanner is reentrant and its extra data is an FeParse.
*/
#ifndef MGC_FE_AST_H
#define MGC_FE_AST_H
#include <stdbool.h>
#include "arena.h"
#include "diag.h"

typedef enum AstKind {
    /* expressions */
    AST_INT,        /* ival */
    AST_FLOAT,      /* fval */
    AST_BOOL,       /* ival: 0 or 1 */
    AST_NAME,       /* name */
    AST_UNARY,      /* op ('-', '+', NOT) applied to lhs */
    AST_BINARY,     /* lhs op rhs: arithmetic, comparison, AND, OR */
    AST_COND,       /* if cond then lhs else rhs */
    AST_ATTR,       /* lhs.name, or lhs.name[rhs] (only x.shape[i]) */
    AST_CALL,       /* [label:] name(args): a layer or block applied to its first positional arg(s) */
    AST_PIPE,       /* lhs -> stage (rhs, an AST_STAGE) */
    AST_STAGE,      /* [label:] name [(args)]; only as the rhs of a PIPE */
    AST_ARG,        /* one argument: name = lhs (name NULL when positional) */
    AST_LIST,       /* [a, b, ...]: a shape (layernorm's), its sizes AST_ARG (positional) in args */
    /* statements */
    AST_INPUT,      /* input name[args]: dims are AST_ARG (positional) in args */
    AST_PARAM,      /* param name[args] = lhs: a learned tensor, dims AST_ARG in args, lhs its initialiser */
    AST_ASSIGN,     /* name = lhs */
    AST_RETURN,     /* return lhs */
    AST_IF,         /* if cond { body } else els (els: NULL, an AST_IF, or an AST_BLOCK_STMT) */
    AST_FOR,        /* for name in lhs..rhs { body } */
    AST_BLOCK_STMT, /* { body }: the else part of an if */
} AstKind;

typedef struct Ast Ast;
struct Ast {
    AstKind kind;
    Loc loc;              /* first token of the construct; the operator for BINARY/PIPE */
    Ast *next;            /* next in a list (statements, arguments) */
    long long ival;       /* INT, BOOL */
    double fval;          /* FLOAT */
    int op;               /* UNARY/BINARY: operator token kind (see parser.y) */
    const char *name;     /* NAME; ATTR attribute; CALL/STAGE callee; ARG keyword; ASSIGN/FOR/INPUT variable */
    Loc name_loc;         /* where name is */
    Ast *lhs, *rhs;       /* operands, see each kind */
    Ast *cond;            /* IF, COND */
    Ast *body;            /* IF then-body, FOR body, BLOCK_STMT body (statement lists) */
    Ast *els;             /* IF else part */
    Ast *args;            /* CALL/STAGE/INPUT: AST_ARG list, NULL if none */
    bool has_parens;      /* STAGE: an argument list was written, even "()" */
    Ast *label;           /* CALL/STAGE: NULL, or AST_NAME / AST_INT, or an expression when computed */
    bool computed_label;  /* CALL/STAGE: the label was written "(expr):" */
    Loc end_loc;          /* IF/FOR/BLOCK_STMT: the closing '}' */
    int depth;            /* expressions: nesting depth, the recursion the elaborator needs
                             (a '->' chain counts as one level: it is walked iteratively) */
};

/* Deepest expression accepted (operators chained or nested). */
#define FE_MAX_EXPR_DEPTH 1000

/* A formal parameter of a net or block: name [= default]. */
typedef struct FeParam {
    const char *name;
    Loc loc;
    Ast *def;             /* default value expression, NULL if required */
    struct FeParam *next;
} FeParam;

/* A `net` or `block` definition. */
typedef struct FeDef {
    bool is_net;
    const char *name;
    Loc loc;              /* the 'net'/'block' keyword */
    Loc name_loc;
    FeParam *params;      /* parameters, in order */
    FeParam *inputs;      /* blocks: the input value names (exactly one is valid) */
    bool has_inputs;      /* a block was written with an input list */
    Ast *body;            /* statement list */
    Loc end_loc;          /* the closing '}' */
    struct FeDef *next;
} FeDef;

/* Open-bracket stack kept by the lexer, for "unclosed '{'" notes. */
#define FE_MAX_OPEN 64

/* State of one parse: the flex scanner's extra data. */
typedef struct FeParse {
    Arena *arena;
    Diag *diag;
    const SourceFile *file;
    int line, col;               /* position of the next byte to be scanned, 1-based */
    FeDef *defs, *defs_tail;     /* the parse result, in file order */
    int open_n;                  /* depth of open brackets (may exceed FE_MAX_OPEN) */
    char open_ch[FE_MAX_OPEN];
    Loc open_loc[FE_MAX_OPEN];
    char last_text[40];          /* text of the last token, for syntax errors */
    char prev_text[40];          /* text of the token before it */
    Loc prev_loc;
    int last_line, last_col;     /* where last_text is */
    char mismatch_ch;            /* a closer did not match: the open bracket it met, else 0 */
    Loc mismatch_loc;            /* where that open bracket is */
    bool lex_error;              /* the lexer has reported an error */
} FeParse;

/* Parses fp->file into fp->defs. Returns 0, or -1 after reporting. (parser.y) */
int fe_parse(FeParse *fp, const char *text, size_t len);

/* Allocation helpers for the parser (parser.y). */
Ast *fe_ast_new(FeParse *fp, AstKind kind, Loc loc);

#endif
