/*
** check.c: the whole-file checks, run before elaboration.
*/
#ifndef MGC_FE_CHECK_H
#define MGC_FE_CHECK_H
#include "elab_internal.h"

/* Looks at the whole tree once, without running anything: one net, unique
   definitions and parameters, every layer/block name known, no recursion
   between blocks, 'input' only in the net, nothing after a 'return'. Sets
   E->net. Returns the number of errors found (each reported through E->d). */
int fe_check_file(Elab *E, const SourceFile *file);

#endif
