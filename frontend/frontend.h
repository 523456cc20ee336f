/*
** The front end: reads a .net file (docs/language.md), checks it and
** elaborates it into layer-builder calls on an IR graph (ir/ir.h). Blocks
** are instantiated, parameters bound, loops and conditionals unrolled at
** compile time. Every problem is reported through the graph's Diag with
** file:line:col and a caret; the functions then return -1. No global state:
** several compilations may run side by side.
*/
#ifndef MGC_FRONTEND_H
#define MGC_FRONTEND_H
#include "ir.h"

typedef struct FeOverride { const char *name, *value; } FeOverride;   /* --set NAME=VALUE */

/* Parse and elaborate the .net file at path into g (already ir_graph_init'ed with the
   training flag). Returns 0, or -1 after reporting errors through g->diag
   (file:line:col + caret). Never crashes, never hangs, never asserts, on any input bytes. */
int fe_compile(Graph *g, const char *path, const FeOverride *sets, int nsets);
/* Same, from text in memory (for tests); name is used in messages. */
int fe_compile_text(Graph *g, const char *name, const char *text, const FeOverride *sets, int nsets);
/* Same, from len bytes that may hold NULs (the fuzz target's way in). */
int fe_compile_bytes(Graph *g, const char *name, const char *text, size_t len, const FeOverride *sets, int nsets);
/* The bytes of the .net file at path (at most FE_MAX_FILE), malloc'd, their
   number in *len; NULL with err ("cannot open 'x.net': ..."). */
char *fe_read_net(const char *path, size_t *len, char *err, size_t err_size);
/* The built-in layers as docs/language.md's table (markdown rows). */
void fe_print_layers(FILE *out);

#endif
