/*
** Parser for the .net language (bison, pure, with locations).
**
** Builds the syntax tree of frontend/ast.h in the FeParse's arena; no
** checking beyond syntax happens here (names, types and values are the
** elaborator's job, frontend/elab.c). A syntax error is reported once,
** through diag_at(), as "unexpected X; expected A, B or C" with a note at
** an unclosed bracket when the file ends early; the parse then stops.
** Nesting deeper than YYMAXDEPTH parser states is reported, not crashed on.
** The language is described in docs/language.md.
*/
%define api.pure full
%define api.prefix {fe_yy}
%define parse.error custom
%define parse.lac full
%locations
%param {void *scanner}

%code requires {
#include "ast.h"
/* A list being built: first and last element. */
typedef struct AstList { Ast *head, *tail; } AstList;
typedef struct ParamList { FeParam *head, *tail; bool written; } ParamList;
}

%union {
    long long ival;
    double fval;
    char *str;
    Ast *ast;
    AstList list;
    FeParam *param;
    ParamList params;
}

%code {
#include <stdio.h>
#include <string.h>

#define YYMAXDEPTH 2000
#define YYINITDEPTH 200

int fe_yylex(FE_YYSTYPE *lval, FE_YYLTYPE *lloc, void *scanner);
FeParse *fe_yyget_extra(void *scanner);

static void fe_yyerror(FE_YYLTYPE *lloc, void *scanner, const char *msg);

#define PS (fe_yyget_extra(scanner))

static Loc mkloc(void *scanner, FE_YYLTYPE l)
{
    Loc loc = { PS->file, l.first_line, l.first_column };
    return loc;
}
#define LOC(l) mkloc(scanner, (l))

Ast *fe_ast_new(FeParse *fp, AstKind kind, Loc loc)
{
    Ast *a = arena_alloc(fp->arena, sizeof *a);
    a->kind = kind;
    a->loc = loc;
    return a;
}
#define NEW(kind, l) fe_ast_new(PS, (kind), LOC(l))

static int dmax(int a, const Ast *b) { return b && b->depth > a ? b->depth : a; }

/* Sets e->depth; reports and returns -1 when it is too deep for the elaborator. */
static int set_depth(void *scanner, Ast *e)
{
    int inner = 0, d;
    inner = dmax(inner, e->rhs);
    inner = dmax(inner, e->cond);
    inner = dmax(inner, e->label);
    for (const Ast *a = e->args; a; a = a->next) inner = dmax(inner, a->lhs);
    if (e->kind == AST_PIPE) d = dmax(inner + 1, e->lhs);
    else d = dmax(inner, e->lhs) + 1;
    e->depth = d;
    if (d <= FE_MAX_EXPR_DEPTH) return 0;
    diag_at(PS->diag, e->loc, "this expression is nested too deeply (more than %d levels)", FE_MAX_EXPR_DEPTH);
    return -1;
}
#define DEPTH(e) do { if (set_depth(scanner, (e))) YYABORT; } while (0)

static AstList list1(Ast *a) { AstList l = { a, a }; return l; }
static AstList list_add(AstList l, Ast *a)
{
    if (!a) return l;
    if (!l.head) return list1(a);
    l.tail->next = a;
    l.tail = a;
    return l;
}
static ParamList plist_add(ParamList l, FeParam *p)
{
    if (!l.head) { l.head = l.tail = p; return l; }
    l.tail->next = p;
    l.tail = p;
    return l;
}

static Ast *binary(void *scanner, FE_YYLTYPE l, int op, Ast *a, Ast *b)
{
    Ast *n = NEW(AST_BINARY, l);
    n->op = op;
    n->lhs = a;
    n->rhs = b;
    return n;
}

static Ast *call(void *scanner, Ast *label, FE_YYLTYPE name_l, char *name, Ast *args, AstKind kind)
{
    Ast *n = NEW(kind, name_l);
    n->name = name;
    n->name_loc = LOC(name_l);
    n->args = args;
    n->label = label;
    if (label) n->loc = label->loc;
    return n;
}

static void add_def(void *scanner, FeDef *d)
{
    FeParse *fp = PS;
    if (!fp->defs) fp->defs = d;
    else fp->defs_tail->next = d;
    fp->defs_tail = d;
}
}

%token <str>  IDENT "identifier"
%token <ival> INT   "integer"
%token <fval> FLOAT "number"
%token <ival> BOOL  "'true' or 'false'"
%token ARROW "'->'" DOTDOT "'..'" EQ "'=='" NE "'!='" LE "'<='" GE "'>='" POW "'**'"
%token NET "'net'" BLOCK "'block'" INPUT "'input'" PARAM "'param'" RETURN "'return'"
%token IF "'if'" THEN "'then'" ELSE "'else'" FOR "'for'" IN "'in'"
%token AND "'and'" OR "'or'" NOT "'not'"

%type <ast> stmt if_stmt else_part expr cond_expr or_expr and_expr not_expr cmp_expr
%type <ast> add_expr mul_expr unary power postfix primary stage callee arg
%type <list> stmts args arg_list
%type <param> param
%type <params> params param_list net_params

%%

/* file: def* */
file
    : %empty
    | file def
    ;

/* def: 'net' NAME [(params)] { stmts }
      | 'block' NAME (params) [(inputs)] { stmts } */
def
    : NET IDENT net_params '{' stmts '}'
        {
            FeDef *d = arena_alloc(PS->arena, sizeof *d);
            d->is_net = true;
            d->name = $2;
            d->loc = LOC(@1);
            d->name_loc = LOC(@2);
            d->params = $3.head;
            d->body = $5.head;
            d->end_loc = LOC(@6);
            add_def(scanner, d);
        }
    | BLOCK IDENT '(' param_list ')' net_params '{' stmts '}'
        {
            FeDef *d = arena_alloc(PS->arena, sizeof *d);
            d->name = $2;
            d->loc = LOC(@1);
            d->name_loc = LOC(@2);
            /* block f(params)(input) { }, or block f(input) { } when it has no parameters */
            if ($6.written) {
                d->params = $4.head;
                d->inputs = $6.head;
                d->has_inputs = true;
            } else {
                d->inputs = $4.head;
                d->has_inputs = true;
            }
            d->body = $8.head;
            d->end_loc = LOC(@9);
            add_def(scanner, d);
        }
    ;

/* net_params: [ '(' param_list ')' ] */
net_params
    : %empty                { $$.head = $$.tail = NULL; $$.written = false; }
    | '(' param_list ')'    { $$ = $2; $$.written = true; }
    ;

/* param_list: [ param (',' param)* [','] ] */
param_list
    : %empty                { $$.head = $$.tail = NULL; $$.written = false; }
    | params                { $$ = $1; }
    | params ','            { $$ = $1; }
    ;

params
    : param                 { $$.head = $$.tail = NULL; $$.written = true; $$ = plist_add($$, $1); }
    | params ',' param      { $$ = plist_add($1, $3); }
    ;

/* param: NAME [ '=' expr ] */
param
    : IDENT
        {
            $$ = arena_alloc(PS->arena, sizeof *$$);
            $$->name = $1;
            $$->loc = LOC(@1);
        }
    | IDENT '=' expr
        {
            $$ = arena_alloc(PS->arena, sizeof *$$);
            $$->name = $1;
            $$->loc = LOC(@1);
            $$->def = $3;
        }
    ;

/* stmts: stmt* */
stmts
    : %empty                { $$.head = $$.tail = NULL; }
    | stmts stmt            { $$ = list_add($1, $2); }
    ;

/* stmt: 'input' NAME '[' dims ']' | 'param' NAME '[' dims ']' '=' init | NAME '=' expr | 'return' expr | if | for */
stmt
    : INPUT IDENT '[' arg_list ']'
        {
            $$ = NEW(AST_INPUT, @1);
            $$->name = $2;
            $$->name_loc = LOC(@2);
            $$->args = $4.head;
        }
    | PARAM IDENT '[' arg_list ']' '=' expr
        {
            $$ = NEW(AST_PARAM, @1);
            $$->name = $2;
            $$->name_loc = LOC(@2);
            $$->args = $4.head;
            $$->lhs = $7;
        }
    | IDENT '=' expr
        {
            $$ = NEW(AST_ASSIGN, @1);
            $$->name = $1;
            $$->name_loc = LOC(@1);
            $$->lhs = $3;
        }
    | RETURN expr
        {
            $$ = NEW(AST_RETURN, @1);
            $$->lhs = $2;
        }
    | if_stmt
    | FOR IDENT IN expr DOTDOT expr '{' stmts '}'
        {
            $$ = NEW(AST_FOR, @1);
            $$->name = $2;
            $$->name_loc = LOC(@2);
            $$->lhs = $4;
            $$->rhs = $6;
            $$->body = $8.head;
            $$->end_loc = LOC(@9);
        }
    ;

/* if: 'if' expr '{' stmts '}' [ 'else' ( if | '{' stmts '}' ) ] */
if_stmt
    : IF expr '{' stmts '}' else_part
        {
            $$ = NEW(AST_IF, @1);
            $$->cond = $2;
            $$->body = $4.head;
            $$->end_loc = LOC(@5);
            $$->els = $6;
        }
    ;

else_part
    : %empty                { $$ = NULL; }
    | ELSE if_stmt          { $$ = $2; }
    | ELSE '{' stmts '}'
        {
            $$ = NEW(AST_BLOCK_STMT, @2);
            $$->body = $3.head;
            $$->end_loc = LOC(@4);
        }
    ;

/* expr: expr '->' stage | cond_expr      (-> binds loosest, left to right) */
expr
    : expr ARROW stage
        {
            $$ = NEW(AST_PIPE, @2);
            $$->lhs = $1;
            $$->rhs = $3;
            DEPTH($$);
        }
    | cond_expr
    ;

/* stage: [label ':'] NAME [ '(' args ')' ]   label: NAME | INT | '(' expr ')' */
stage
    : callee
    | IDENT ':' callee
        {
            Ast *l = NEW(AST_NAME, @1);
            l->name = $1;
            $$ = $3;
            $$->label = l;
        }
    | INT ':' callee
        {
            Ast *l = NEW(AST_INT, @1);
            l->ival = $1;
            $$ = $3;
            $$->label = l;
        }
    | '(' expr ')' ':' callee
        {
            $$ = $5;
            $$->label = $2;
            $$->computed_label = true;
            DEPTH($$);
        }
    ;

callee
    : IDENT                 { $$ = call(scanner, NULL, @1, $1, NULL, AST_STAGE); }
    | IDENT '(' arg_list ')'
        {
            $$ = call(scanner, NULL, @1, $1, $3.head, AST_STAGE);
            $$->has_parens = true;
            DEPTH($$);
        }
    ;

/* cond_expr: 'if' expr 'then' expr 'else' cond_expr | or_expr */
cond_expr
    : IF expr THEN expr ELSE cond_expr
        {
            $$ = NEW(AST_COND, @1);
            $$->cond = $2;
            $$->lhs = $4;
            $$->rhs = $6;
            DEPTH($$);
        }
    | or_expr
    ;

or_expr
    : or_expr OR and_expr   { $$ = binary(scanner, @2, OR, $1, $3); DEPTH($$); }
    | and_expr
    ;

and_expr
    : and_expr AND not_expr { $$ = binary(scanner, @2, AND, $1, $3); DEPTH($$); }
    | not_expr
    ;

not_expr
    : NOT not_expr
        {
            $$ = NEW(AST_UNARY, @1);
            $$->op = NOT;
            $$->lhs = $2;
            DEPTH($$);
        }
    | cmp_expr
    ;

/* comparisons do not chain: a < b < c is a syntax error */
cmp_expr
    : add_expr EQ add_expr  { $$ = binary(scanner, @2, EQ, $1, $3); DEPTH($$); }
    | add_expr NE add_expr  { $$ = binary(scanner, @2, NE, $1, $3); DEPTH($$); }
    | add_expr '<' add_expr { $$ = binary(scanner, @2, '<', $1, $3); DEPTH($$); }
    | add_expr LE add_expr  { $$ = binary(scanner, @2, LE, $1, $3); DEPTH($$); }
    | add_expr '>' add_expr { $$ = binary(scanner, @2, '>', $1, $3); DEPTH($$); }
    | add_expr GE add_expr  { $$ = binary(scanner, @2, GE, $1, $3); DEPTH($$); }
    | add_expr
    ;

add_expr
    : add_expr '+' mul_expr { $$ = binary(scanner, @2, '+', $1, $3); DEPTH($$); }
    | add_expr '-' mul_expr { $$ = binary(scanner, @2, '-', $1, $3); DEPTH($$); }
    | mul_expr
    ;

mul_expr
    : mul_expr '*' unary    { $$ = binary(scanner, @2, '*', $1, $3); DEPTH($$); }
    | mul_expr '/' unary    { $$ = binary(scanner, @2, '/', $1, $3); DEPTH($$); }
    | mul_expr '%' unary    { $$ = binary(scanner, @2, '%', $1, $3); DEPTH($$); }
    | unary
    ;

unary
    : '-' unary
        {
            $$ = NEW(AST_UNARY, @1);
            $$->op = '-';
            $$->lhs = $2;
            DEPTH($$);
        }
    | '+' unary
        {
            $$ = NEW(AST_UNARY, @1);
            $$->op = '+';
            $$->lhs = $2;
            DEPTH($$);
        }
    | power
    ;

/* power: postfix [ '**' unary ]   (right to left; binds tighter than a unary
   minus on its left, looser on its right, as in Python: -2 ** 2 == -4, 2 ** -1 == 0.5) */
power
    : postfix POW unary     { $$ = binary(scanner, @2, POW, $1, $3); DEPTH($$); }
    | postfix
    ;

/* postfix: primary ( '.' NAME [ '[' expr ']' ] )* */
postfix
    : primary
    | postfix '.' IDENT
        {
            $$ = NEW(AST_ATTR, @3);
            $$->lhs = $1;
            $$->name = $3;
            $$->name_loc = LOC(@3);
            DEPTH($$);
        }
    | postfix '.' IDENT '[' expr ']'
        {
            $$ = NEW(AST_ATTR, @3);
            $$->lhs = $1;
            $$->name = $3;
            $$->name_loc = LOC(@3);
            $$->rhs = $5;
            DEPTH($$);
        }
    ;

/* primary: literal | NAME | '(' expr ')' | [label ':'] NAME '(' args ')' */
primary
    : INT                   { $$ = NEW(AST_INT, @1); $$->ival = $1; }
    | FLOAT                 { $$ = NEW(AST_FLOAT, @1); $$->fval = $1; }
    | BOOL                  { $$ = NEW(AST_BOOL, @1); $$->ival = $1; }
    | IDENT                 { $$ = NEW(AST_NAME, @1); $$->name = $1; $$->name_loc = $$->loc; }
    | '(' expr ')'          { $$ = $2; }
    | '[' arg_list ']'      { $$ = NEW(AST_LIST, @1); $$->args = $2.head; DEPTH($$); }
    | IDENT '(' arg_list ')'
        { $$ = call(scanner, NULL, @1, $1, $3.head, AST_CALL); DEPTH($$); }
    | IDENT ':' IDENT '(' arg_list ')'
        {
            Ast *l = NEW(AST_NAME, @1);
            l->name = $1;
            $$ = call(scanner, l, @3, $3, $5.head, AST_CALL);
            DEPTH($$);
        }
    | INT ':' IDENT '(' arg_list ')'
        {
            Ast *l = NEW(AST_INT, @1);
            l->ival = $1;
            $$ = call(scanner, l, @3, $3, $5.head, AST_CALL);
            DEPTH($$);
        }
    | '(' expr ')' ':' IDENT '(' arg_list ')'
        {
            $$ = call(scanner, $2, @5, $5, $7.head, AST_CALL);
            $$->computed_label = true;
            DEPTH($$);
        }
    ;

/* arg_list: [ arg (',' arg)* [','] ]   arg: expr | NAME '=' expr */
arg_list
    : %empty                { $$.head = $$.tail = NULL; }
    | args                  { $$ = $1; }
    | args ','              { $$ = $1; }
    ;

args
    : arg                   { $$ = list1($1); }
    | args ',' arg          { $$ = list_add($1, $3); }
    ;

arg
    : expr
        {
            $$ = fe_ast_new(PS, AST_ARG, $1->loc);
            $$->lhs = $1;
        }
    | IDENT '=' expr
        {
            $$ = NEW(AST_ARG, @1);
            $$->name = $1;
            $$->name_loc = LOC(@1);
            $$->lhs = $3;
        }
    ;

%%

/* Only called for parser stack exhaustion (syntax errors are reported below). */
static void fe_yyerror(FE_YYLTYPE *lloc, void *scanner, const char *msg)
{
    FeParse *fp = PS;
    if (strcmp(msg, "memory exhausted") == 0)
        diag_at(fp->diag, mkloc(scanner, *lloc),
                "nesting is too deep (the parser's limit is %d levels)", YYMAXDEPTH);
    else
        diag_at(fp->diag, mkloc(scanner, *lloc), "%s", msg);
}

/* How a token is named in a message: an identifier with its text. */
static void describe_token(FeParse *fp, yysymbol_kind_t k, char *buf, size_t n)
{
    switch (k) {
    case YYSYMBOL_IDENT: snprintf(buf, n, "identifier '%s'", fp->last_text); break;
    case YYSYMBOL_INT:   snprintf(buf, n, "integer %s", fp->last_text); break;
    case YYSYMBOL_FLOAT: snprintf(buf, n, "number %s", fp->last_text); break;
    case YYSYMBOL_BOOL:  snprintf(buf, n, "'%s'", fp->last_text); break;
    default:             snprintf(buf, n, "%s", yysymbol_name(k)); break;
    }
}

static bool is_operator(const char *name)
{
    static const char *const ops[] = {
        "'+'", "'-'", "'*'", "'/'", "'%'", "'**'", "'<'", "'>'", "'=='", "'!='", "'<='", "'>='",
        "'and'", "'or'", "'.'",
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(name, ops[i])) return true;
    return false;
}

static char closer_of(char open) { return open == '(' ? ')' : open == '[' ? ']' : '}'; }

/* "unexpected X; expected A, B or C". Tokens that can start an expression
   are summarised as "an expression", binary operators as "an operator". */
static int yyreport_syntax_error(const yypcontext_t *ctx, void *scanner)
{
    FeParse *fp = PS;
    if (fp->lex_error) return 0;     /* the lexer has said what is wrong */
    yysymbol_kind_t tok = yypcontext_token(ctx);
    Loc loc = mkloc(scanner, *yypcontext_location(ctx));
    const char *tname = yysymbol_name(tok);
    char what[96];
    if (tok == YYSYMBOL_YYEOF) snprintf(what, sizeof what, "end of file");
    else describe_token(fp, tok, what, sizeof what);

    /* a closing bracket that does not match the open one */
    bool closer = !strcmp(tname, "')'") || !strcmp(tname, "']'") || !strcmp(tname, "'}'");
    if (closer && fp->mismatch_ch) {
        diag_at(fp->diag, loc, "unexpected %s; expected '%c' to close the '%c' at line %d", what,
                closer_of(fp->mismatch_ch), fp->mismatch_ch, fp->mismatch_loc.line);
        diag_note(fp->diag, fp->mismatch_loc, "the '%c' opened here is not closed", fp->mismatch_ch);
        return 0;
    }
    /* the file ends inside brackets */
    if (tok == YYSYMBOL_YYEOF && fp->open_n > 0 && fp->open_n <= FE_MAX_OPEN) {
        char c = fp->open_ch[fp->open_n - 1];
        diag_at(fp->diag, loc, "unexpected end of file; expected '%c' to close the '%c' at line %d",
                closer_of(c), c, fp->open_loc[fp->open_n - 1].line);
        diag_note(fp->diag, fp->open_loc[fp->open_n - 1], "the '%c' opened here is not closed", c);
        return 0;
    }

    enum { MAXEXP = 40 };
    yysymbol_kind_t exp[MAXEXP];
    int n = yypcontext_expected_tokens(ctx, exp, MAXEXP);
    if (n < 0) n = 0;
    bool has_int = false, has_ident = false, has_arrow = false, has_eq = false, has_cmp = false;
    int nops = 0;
    for (int i = 0; i < n; i++) {
        const char *name = yysymbol_name(exp[i]);
        if (exp[i] == YYSYMBOL_INT) has_int = true;
        if (exp[i] == YYSYMBOL_IDENT) has_ident = true;
        if (exp[i] == YYSYMBOL_ARROW) has_arrow = true;
        if (!strcmp(name, "'='")) has_eq = true;
        if (!strcmp(name, "'<'")) has_cmp = true;
        if (is_operator(name)) nops++;
    }
    /* "x flatten -> ...": an identifier read as the start of a new statement */
    if (n == 1 && has_eq && fp->prev_text[0]) {
        diag_at(fp->diag, fp->prev_loc, "unexpected identifier '%s' here; a statement is 'NAME = value', "
                "'return value', 'input', 'param', 'if' or 'for' (is a '->' missing before '%s'?)",
                fp->prev_text, fp->prev_text);
        return 0;
    }
    bool is_cmp = !strcmp(tname, "'<'") || !strcmp(tname, "'>'") || !strcmp(tname, "'<='") ||
                  !strcmp(tname, "'>='") || !strcmp(tname, "'=='") || !strcmp(tname, "'!='");
    if (is_cmp && !has_cmp && nops > 0) {
        diag_at(fp->diag, loc, "comparisons do not chain; write 'a < b and b < c'");
        return 0;
    }
    bool expr = has_int && has_ident;
    bool ops = nops >= 3;
    const char *items[MAXEXP + 2];
    int total = 0;
    if (expr) items[total++] = "an expression";
    for (int i = 0; i < n; i++) {
        yysymbol_kind_t k = exp[i];
        const char *name = yysymbol_name(k);
        if (expr && (k == YYSYMBOL_INT || k == YYSYMBOL_FLOAT || k == YYSYMBOL_BOOL ||
                     k == YYSYMBOL_IDENT || k == YYSYMBOL_NOT || k == YYSYMBOL_IF ||
                     !strcmp(name, "'('") || !strcmp(name, "'-'") || !strcmp(name, "'+'")))
            continue;
        if (ops && is_operator(name)) continue;
        /* after a name, '(' (a call) and ':' (a label) are possible but rarely meant */
        if (has_arrow && (!strcmp(name, "'('") || !strcmp(name, "':'") || !strcmp(name, "'['")))
            continue;
        items[total++] = name;
    }
    if (ops) items[total++] = "an operator";
    char list[512];
    size_t len = 0;
    list[0] = 0;
    for (int i = 0; i < total; i++) {
        const char *sep = i == 0 ? "" : (i == total - 1 ? " or " : ", ");
        int w = snprintf(list + len, sizeof list - len, "%s%s", sep, items[i]);
        if (w < 0 || (size_t)w >= sizeof list - len) break;
        len += (size_t)w;
    }
    if (total > 0)
        diag_at(fp->diag, loc, "unexpected %s; expected %s", what, list);
    else
        diag_at(fp->diag, loc, "unexpected %s", what);
    return 0;
}
