/*
** Diagnostics: file:line:col, the offending source line and a caret.
*/
#include "diag.h"
#include <stdarg.h>
#include <string.h>
#include <stdlib.h>

void diag_init(Diag *d, FILE *out)
{
    d->out = out ? out : stderr;
    d->errors = 0;
    d->usage = 0;
}

static void show_line(FILE *out, Loc loc)
{
    if (!loc.file || !loc.file->text || loc.line <= 0) return;
    const char *p = loc.file->text;
    for (int l = 1; l < loc.line && *p; p++)
        if (*p == '\n') l++;
    const char *end = strchr(p, '\n');
    int len = end ? (int)(end - p) : (int)strlen(p);
    fprintf(out, "%5d | %.*s\n", loc.line, len, p);
    fprintf(out, "      | ");
    for (int i = 1; i < loc.col && i <= len; i++) fputc(p[i - 1] == '\t' ? '\t' : ' ', out);
    fprintf(out, "^\n");
}

static void vreport(Diag *d, Loc loc, const char *kind, const char *fmt, va_list ap)
{
    FILE *out = d->out ? d->out : stderr;
    if (loc.file)
        fprintf(out, "%s:%d:%d: %s: ", loc.file->name, loc.line, loc.col, kind);
    else
        fprintf(out, "mgc: %s: ", kind);
    vfprintf(out, fmt, ap);
    fputc('\n', out);
    show_line(out, loc);
}

void diag_at(Diag *d, Loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(d, loc, "error", fmt, ap);
    va_end(ap);
    d->errors++;
}

void diag_note(Diag *d, Loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(d, loc, "note", fmt, ap);
    va_end(ap);
}

int diag_edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64) return 1000;
    int prev[65], cur[65];
    for (size_t j = 0; j <= m; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int c = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < c) c = prev[j] + 1;
            if (cur[j - 1] + 1 < c) c = cur[j - 1] + 1;
            cur[j] = c;
        }
        memcpy(prev, cur, sizeof(int) * (m + 1));
    }
    return prev[m];
}
