/*
** mgc plot RUN.jsonl [RUN2.jsonl ...] --out curves.svg: the curves of runs
** (their --log files) for a quick look without TensorBoard, written as SVG
** directly: the training loss by epoch on the left; the accuracies (test
** solid, validation dotted, training dashed) on the right; a colour a run,
** named in the legend by its file's name. --log-every's step records are
** left out (they have no test_acc).
*/
#include "plot.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_RUNS = 8, MAX_EPOCHS = 100000 };
enum { LOSS, TRAIN_ACC, TEST_ACC, VAL_ACC, SERIES };

typedef struct Run {
    const char *name;
    int n;
    double *epoch, *v[SERIES];   /* NaN where the record has none */
} Run;

/* The number after "key": in line, or NaN (absent, null) */
static double field(const char *line, const char *key)
{
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) return NAN;
    p += strlen(pat);
    while (*p == ' ') p++;
    char *end;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

static int read_run(const char *path, Run *r)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "mgc plot: cannot read %s: %s\n", path, strerror(errno));
        return 1;
    }
    const char *slash = strrchr(path, '/');
    r->name = slash ? slash + 1 : path;
    int cap = 0;
    char line[65536];
    while (fgets(line, sizeof line, f)) {
        if (isnan(field(line, "epoch")) || !strstr(line, "\"test_acc\":")) continue;   /* a step record, or not a run's */
        if (r->n == cap) {
            cap = cap ? 2 * cap : 64;
            if (cap > MAX_EPOCHS) break;
            r->epoch = realloc(r->epoch, sizeof(double) * (size_t)cap);
            for (int s = 0; s < SERIES; s++) r->v[s] = realloc(r->v[s], sizeof(double) * (size_t)cap);
        }
        r->epoch[r->n] = field(line, "epoch");
        r->v[LOSS][r->n] = field(line, "loss");
        r->v[TRAIN_ACC][r->n] = field(line, "train_acc");
        r->v[TEST_ACC][r->n] = field(line, "test_acc");
        r->v[VAL_ACC][r->n] = field(line, "val_acc");
        r->n++;
    }
    fclose(f);
    if (r->n == 0) {
        fprintf(stderr, "mgc plot: %s holds no epoch records (mgc writes them with --log FILE.jsonl)\n", path);
        return 1;
    }
    return 0;
}

/* A panel: its box in the picture and the ranges it maps */
typedef struct Panel {
    double x0, y0, w, h;           /* pixels */
    double e0, e1, lo, hi;         /* epochs, values */
} Panel;

static double px(const Panel *p, double e) { return p->x0 + (p->e1 > p->e0 ? (e - p->e0) / (p->e1 - p->e0) : 0.5) * p->w; }

/* s as XML text (a file's name may hold & or <) */
static void xml(FILE *o, const char *s)
{
    for (; *s; s++)
        if (*s == '&') fputs("&amp;", o);
        else if (*s == '<') fputs("&lt;", o);
        else if (*s == '>') fputs("&gt;", o);
        else if (*s == '"') fputs("&quot;", o);
        else fputc(*s, o);
}
static double py(const Panel *p, double v) { return p->y0 + p->h - (p->hi > p->lo ? (v - p->lo) / (p->hi - p->lo) : 0.5) * p->h; }

static void axes(FILE *o, const Panel *p, const char *title)
{
    fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n", p->x0, p->y0, p->w, p->h);
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" text-anchor=\"middle\">%s</text>\n", p->x0 + p->w / 2, p->y0 - 8, title);
    for (int k = 0; k <= 4; k++) {   /* five values up the side */
        double v = p->lo + (p->hi - p->lo) * k / 4;
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.3g</text>\n", p->x0 - 4, py(p, v) + 4, v);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", p->x0, py(p, v), p->x0 + p->w, py(p, v));
    }
    int step = (int)ceil((p->e1 - p->e0) / 10.0);
    for (int e = (int)p->e0; e <= (int)p->e1; e += step > 0 ? step : 1)
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%d</text>\n", px(p, e), p->y0 + p->h + 14, e);
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">epoch</text>\n", p->x0 + p->w / 2, p->y0 + p->h + 30);
}

static void curve(FILE *o, const Panel *p, const Run *r, int s, const char *colour, const char *dash, const char *what)
{
    int shown = 0;
    for (int i = 0; i < r->n; i++) shown += !isnan(r->v[s][i]);
    if (!shown) return;
    fputs("<polyline data-run=\"", o);
    xml(o, r->name);
    fprintf(o, "\" data-series=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", what, colour, dash);
    for (int i = 0; i < r->n; i++)
        if (!isnan(r->v[s][i])) fprintf(o, "%.2f,%.2f ", px(p, r->epoch[i]), py(p, r->v[s][i]));
    fprintf(o, "\"/>\n");
}

int plot_main(int argc, char **argv)
{
    const char *out = NULL, *files[MAX_RUNS];
    int nf = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strncmp(argv[i], "--out=", 6)) out = argv[i] + 6;
        else if (argv[i][0] == '-') {
            fprintf(stderr, "mgc plot: unknown option '%s' (mgc plot RUN.jsonl ... --out curves.svg)\n", argv[i]);
            return 2;
        } else if (nf == MAX_RUNS) {
            fprintf(stderr, "mgc plot: at most %d runs in one picture\n", MAX_RUNS);
            return 2;
        } else files[nf++] = argv[i];
    }
    size_t ol = out ? strlen(out) : 0;
    if (!nf || !out || ol < 5 || strcmp(out + ol - 4, ".svg")) {
        fprintf(stderr, "mgc plot: give runs' --log files and where the picture goes: mgc plot RUN.jsonl [RUN2.jsonl ...] --out "
                "curves.svg\n");
        return 2;
    }
    Run runs[MAX_RUNS] = { 0 };
    int rc = 0;
    for (int k = 0; k < nf && !rc; k++) rc = read_run(files[k], &runs[k]);
    Panel lp = { 70, 40, 380, 280, INFINITY, -INFINITY, INFINITY, -INFINITY }, ap = lp;
    ap.x0 = 540;
    for (int k = 0; k < nf && !rc; k++)
        for (int i = 0; i < runs[k].n; i++) {
            double e = runs[k].epoch[i];
            lp.e0 = fmin(lp.e0, e), lp.e1 = fmax(lp.e1, e), ap.e0 = lp.e0, ap.e1 = lp.e1;
            if (isfinite(runs[k].v[LOSS][i])) lp.lo = fmin(lp.lo, runs[k].v[LOSS][i]), lp.hi = fmax(lp.hi, runs[k].v[LOSS][i]);
            for (int s = TRAIN_ACC; s < SERIES; s++)
                if (isfinite(runs[k].v[s][i])) ap.lo = fmin(ap.lo, runs[k].v[s][i]), ap.hi = fmax(ap.hi, runs[k].v[s][i]);
        }
    FILE *o = rc ? NULL : fopen(out, "w");
    if (!rc && !o) {
        fprintf(stderr, "mgc plot: cannot write %s: %s\n", out, strerror(errno));
        rc = 1;
    }
    if (o) {
        if (!(lp.lo <= lp.hi)) lp.lo = 0, lp.hi = 1;
        if (!(ap.lo <= ap.hi)) ap.lo = 0, ap.hi = 1;
        static const char *const colours[MAX_RUNS] = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f" };
        fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"%d\" font-family=\"sans-serif\">\n", 380 + 18 * nf);
        axes(o, &lp, "training loss");
        axes(o, &ap, "accuracy: test (solid), validation (dotted), training (dashed)");
        for (int k = 0; k < nf; k++) {
            curve(o, &lp, &runs[k], LOSS, colours[k], "", "loss");
            curve(o, &ap, &runs[k], TEST_ACC, colours[k], "", "test_acc");
            curve(o, &ap, &runs[k], VAL_ACC, colours[k], " stroke-dasharray=\"2,3\"", "val_acc");
            curve(o, &ap, &runs[k], TRAIN_ACC, colours[k], " stroke-dasharray=\"6,4\"", "train_acc");
            fprintf(o, "<text x=\"70\" y=\"%d\" font-size=\"12\" fill=\"%s\">", 380 + 18 * k, colours[k]);
            xml(o, runs[k].name);
            fputs("</text>\n", o);
        }
        fprintf(o, "</svg>\n");
        if (fclose(o)) {
            fprintf(stderr, "mgc plot: cannot write %s: %s\n", out, strerror(errno));
            rc = 1;
        }
    }
    for (int k = 0; k < nf; k++) {
        free(runs[k].epoch);
        for (int s = 0; s < SERIES; s++) free(runs[k].v[s]);
    }
    if (!rc) printf("mgc plot: %d run%s, %s\n", nf, nf == 1 ? "" : "s", out);
    return rc;
}
