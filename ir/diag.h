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
/* A number the user wrote, v (in the range it must be in: lo to hi, each end
   open or closed), as mgc keeps it: rounded to float32, the type of every
   attribute, option and kernel literal. NULL where its rounding is in the
   range (its ends rounded to float32 as well: 1e30 is a bound of --lr) and
   is 0 only where v is 0; else what goes wrong, in words, from v
   on, into buf: "0.99999999 rounds to 1 in float32, outside [0, 1): the
   nearest float32 in it is 0.99999994"; "1e-50 rounds to 0 in float32: write
   0, or at least 1.40129846e-45". (No attribute or option is stored in bf16:
   --precision bf16 rounds the operands of products only.) */
const char *diag_f32_rounding(double v, double lo, bool lo_open, double hi, bool hi_open, char *buf, size_t size);
/* Levenshtein distance, for "did you mean" suggestions. */
int  diag_edit_distance(const char *a, const char *b);

#endif
