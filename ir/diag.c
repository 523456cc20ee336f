/*
** Diagnostics: file:line:col, the offending source line and a caret.
*/
#include "diag.h"
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <stdlib.h>

void diag_init(Diag *d, FILE *out)
{
    d->out = out ? out : stderr;
    d->errors = 0;
    d->usage = 0;
}

/* The source line of loc and a caret under its column. A line longer than
   DIAG_WINDOW columns shows only a window of that many around the caret, cut
   at UTF-8 character boundaries and marked "...": a generated file with a
   line of megabytes errs in milliseconds, not in pages of output. */
#define DIAG_WINDOW 200
static void show_line(FILE *out, Loc loc)
{
    if (!loc.file || !loc.file->text || loc.line <= 0) return;
    const char *p = loc.file->text;
    for (int l = 1; l < loc.line && *p; p++)
        if (*p == '\n') l++;
    const char *end = strchr(p, '\n');
    long len = end ? (long)(end - p) : (long)strlen(p);
    long caret = loc.col > 1 ? (long)loc.col - 1 : 0;   /* bytes before the caret */
    if (caret > len) caret = len;
    long from = 0, to = len;
    if (len > DIAG_WINDOW) {
        from = caret - DIAG_WINDOW / 2;
        if (from < 0) from = 0;
        to = from + DIAG_WINDOW;
        if (to > len) to = len, from = len - DIAG_WINDOW;
        while (from > 0 && ((unsigned char)p[from] & 0xC0) == 0x80) from--;   /* not inside a character */
        while (to < len && ((unsigned char)p[to] & 0xC0) == 0x80) to++;
    }
    const char *pre = from > 0 ? "..." : "", *post = to < len ? "..." : "";
    fprintf(out, "%5d | %s%.*s%s\n", loc.line, pre, (int)(to - from), p + from, post);
    fprintf(out, "      | %s", from > 0 ? "   " : "");
    for (long i = from; i < caret; i++)   /* a column per character: none for UTF-8's continuation bytes */
        if (((unsigned char)p[i] & 0xC0) != 0x80) fputc(p[i] == '\t' ? '\t' : ' ', out);
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

static const char *digits(const char *p)
{
    while (*p >= '0' && *p <= '9') p++;
    return p;
}

bool diag_decimal(const char *s, bool fraction)
{
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    const char *q = digits(p);
    bool some = q > p;
    if (fraction && *q == '.') {
        const char *r = digits(q + 1);
        some |= r > q + 1;
        q = r;
    }
    if (!some) return false;
    if (fraction && (*q == 'e' || *q == 'E')) {
        p = q + 1;
        if (*p == '+' || *p == '-') p++;
        q = digits(p);
        if (q == p) return false;
    }
    return *q == 0;
}

/* v in the fewest digits that read back as v: 0.99999999, not 0.99999999000000006 */
static const char *shortest(double v, char *buf, size_t size)
{
    for (int digits = 6; digits < 17; digits++) {
        snprintf(buf, size, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) return buf;
    }
    snprintf(buf, size, "%.17g", v);
    return buf;
}

static bool in_range(double f, double lo, bool lo_open, double hi, bool hi_open)
{
    return (lo_open ? f > lo : f >= lo) && (hi_open ? f < hi : f <= hi);
}

const char *diag_f32_rounding(double v, double lo, bool lo_open, double hi, bool hi_open, char *buf, size_t size)
{
    float f = (float)v;
    char vs[32];
    shortest(v, vs, sizeof vs);
    if (isinf(f)) {
        snprintf(buf, size, "%s rounds to %sinfinity in float32 (its largest number is %.9g)", vs, f < 0 ? "minus " : "",
                 (double)FLT_MAX);
        return buf;
    }
    /* the range's ends as float32 too: a closed end that float32 does not hold
       (--lr's 1e30) takes its own rounding; 0 and 1 are themselves */
    float flo = (float)lo, fhi = (float)hi;
    if (!in_range(f, flo, lo_open, fhi, hi_open)) {
        /* the float32 in the range nearest the end that f fell past */
        bool high = f > flo;
        float m = high ? fhi : flo;
        while (!in_range(m, flo, lo_open, fhi, hi_open) && isfinite(m)) m = nextafterf(m, high ? -INFINITY : INFINITY);
        snprintf(buf, size, "%s rounds to %.9g in float32, outside %c%g, %g%c: the nearest float32 in it is %.9g", vs,
                 (double)f, lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']', (double)m);
        return buf;
    }
    if (f == 0 && v != 0) {
        snprintf(buf, size, "%s rounds to 0 in float32: write 0, or at %s %.9g", vs, v < 0 ? "most" : "least",
                 (double)nextafterf(0, v < 0 ? -INFINITY : INFINITY));
        return buf;
    }
    return NULL;
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
