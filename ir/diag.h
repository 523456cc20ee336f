/*
** Diagnostics about the user's input. Every message about a .net file goes
** through diag_at(), which prints
**     file.net:12:7: error: message
**        12 |     x -> conv2: conv2d(16, kernel = 5)
**           |          ^
** and counts the error. Library code never exits: it reports and returns.
*/
#ifndef MGC_DIAG_H
#define MGC_DIAG_H
#include <stdbool.h>
#include <stdio.h>

typedef struct SourceFile {
    const char *name;   /* path as given by the user */
    const char *text;   /* whole file, NUL-terminated */
} SourceFile;

typedef struct Loc {
    const SourceFile *file;   /* NULL for nodes made by passes (no .net origin) */
    int line, col;            /* 1-based; 0 = unknown */
} Loc;

typedef struct Diag {
    FILE *out;      /* where messages go (stderr by default) */
    int errors;     /* number of errors reported */
    int usage;      /* of them, errors in the command line (--set): mgc exits 2 */
} Diag;

void diag_init(Diag *d, FILE *out);
void diag_at(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A follow-up "note:" line attached to the previous error (no count). */
void diag_note(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Whether s is a number as mgc spells them on the command line, in --set and
   in the environment: [+-]digits, and with `fraction` also a decimal point
   and an exponent [eE][+-]digits ("1", "-2", "0.5", ".5", "5.", "1e-3").
   No spaces, no hex, no inf or nan: strtod alone takes "0x10" for 16. */
bool diag_decimal(const char *s, bool fraction);
/* Levenshtein distance, for "did you mean" suggestions. */
int  diag_edit_distance(const char *a, const char *b);

#endif
