/*
** mgc predict: the evaluation program over a data set, every example's
** logits kept in the data's order, written as
**
**   FILE.safetensors  logits [N, classes] F32, pred [N] I64 (the first
**                     largest logit, as torch.argmax), and with labels
**                     labels [N] I64 and confusion [classes, classes] I64
**                     (row: the label, column: the prediction)
**   FILE.csv          index,pred[,label],p0,...: a row an example, the
**                     probabilities (softmax of the logits, in double)
**   FILE.jsonl        {"index": i, "pred": k[, "label": y], "probs": [...]}
**
** each written beside and renamed into place. With labels, the accuracy and
** the confusion matrix go to stdout.
*/
#include "predict.h"
#include "epoch.h"
#include "safetensors.h"
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* softmax of row (k values) into p, in double */
static void softmax(const float *row, int k, double *p)
{
    double m = row[0], sum = 0;
    for (int j = 1; j < k; j++)
        if (row[j] > m) m = row[j];
    for (int j = 0; j < k; j++) sum += p[j] = exp((double)row[j] - m);
    for (int j = 0; j < k; j++) p[j] /= sum;
}

/* The k class names of lines (a line each) into names[k] (pointers into
   copy, malloc'd): true, or false where there are not k of them. */
static bool split_names(const char *lines, int k, char **copy, const char **names)
{
    *copy = NULL;
    if (!lines || !*lines) return false;
    char *c = strdup(lines);
    int n = 0;
    for (char *s = c, *e; c && *s && n <= k; s = e + 1) {
        if (!(e = strchr(s, '\n'))) break;
        *e = 0;
        if (n < k) names[n] = s;
        n++;
    }
    if (n != k) {
        free(c);
        return false;
    }
    *copy = c;
    return true;
}

/* FILE.csv or FILE.jsonl, through path.tmp renamed into place: 0, or -1 with err */
static int write_rows(const char *path, bool json, const float *logits, const int64_t *pred, const int *labels,
                      const char *const *names, long n, int k, char *err, size_t err_size)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, err_size, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    double *p = malloc(sizeof(double) * (size_t)k);
    if (!json) {
        fprintf(f, "index,pred%s%s", names ? ",pred_name" : "", labels ? ",label" : "");
        for (int j = 0; j < k; j++) fprintf(f, ",p%d", j);
        fputc('\n', f);
    }
    for (long i = 0; p && i < n; i++) {
        softmax(logits + i * k, k, p);
        if (json) {
            fprintf(f, "{\"index\": %ld, \"pred\": %lld", i, (long long)pred[i]);
            if (names) {   /* printable, no quotes or backslashes to escape but these */
                fprintf(f, ", \"pred_name\": \"");
                for (const char *c = names[pred[i]]; *c; c++) fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
                fputc('"', f);
            }
            if (labels) fprintf(f, ", \"label\": %d", labels[i]);
            fprintf(f, ", \"probs\": [");
            for (int j = 0; j < k; j++) fprintf(f, "%s%.6g", j ? ", " : "", p[j]);
            fprintf(f, "]}\n");
        } else {
            fprintf(f, "%ld,%lld", i, (long long)pred[i]);
            if (names) {   /* quoted where it holds a quote (a comma it cannot) */
                bool quote = strchr(names[pred[i]], '"') != NULL;
                fputs(quote ? ",\"" : ",", f);
                for (const char *c = names[pred[i]]; *c; c++) fprintf(f, *c == '"' ? "\"\"" : "%c", *c);
                if (quote) fputc('"', f);
            }
            if (labels) fprintf(f, ",%d", labels[i]);
            for (int j = 0; j < k; j++) fprintf(f, ",%.6g", p[j]);
            fputc('\n', f);
        }
    }
    int bad = !p || ferror(f);
    free(p);
    if (fclose(f) || bad || rename(tmp, path)) {
        snprintf(err, err_size, "cannot write %s: %s", path, p ? strerror(errno) : "out of memory");
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int write_safetensors(const Group *g, const char *path, const float *logits, const int64_t *pred, const int *labels,
                             const int64_t *confusion, const char *names, long n, int k, char *err, size_t err_size)
{
    StWriter *w = st_writer_new();
    long long s2[2] = { n, k }, s1[1] = { n }, sk[2] = { k, k };
    st_writer_add_f32(w, "logits", 2, s2, logits);
    st_writer_add(w, "pred", "I64", 1, s1, pred);
    int64_t *l64 = labels ? malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1)) : NULL;
    for (long i = 0; l64 && i < n; i++) l64[i] = labels[i];
    if (l64) st_writer_add(w, "labels", "I64", 1, s1, l64);
    if (labels) st_writer_add(w, "confusion", "I64", 2, sk, confusion);
    st_writer_set_meta(w, "checkpoint", g->cfg->load ? g->cfg->load : "");
    st_writer_set_meta(w, "data", g->cfg->data_dir ? g->cfg->data_dir : "");
    st_writer_set_meta(w, "split", g->cfg->eval_train_split ? "train" : "test");
    st_writer_set_meta(w, "net", g->m->eval->net_name);
    if (names) st_writer_set_meta(w, "class_names", names);
    st_writer_set_meta(w, "format", "mgc predict: logits [N, classes], pred [N] (argmax), labels and confusion where known");
    int rc = st_writer_save(w, path, err, err_size);
    st_writer_free(w);
    free(l64);
    return rc;
}

int train_predict(Group *g, const Dataset *d, int *order, const DataInfo *info)
{
    const TrainConfig *cfg = g->cfg;
    const Program *p = g->m->eval;
    int k = p->classes;
    long n = d->n;
    char num[32], err[4400];
    if (n == 0) {
        fprintf(stderr, "mgc: no examples to predict in %s%s\n", cfg->data_dir, cfg->limit_test == 0 ? " (--limit-test 0)" : "");
        return 1;
    }
    float *logits = calloc((size_t)n * (size_t)k, sizeof *logits);
    int64_t *pred = malloc(sizeof *pred * (size_t)n), *confusion = calloc((size_t)k * (size_t)k, sizeof *confusion);
    if (!logits || !pred || !confusion) {
        fprintf(stderr, "mgc: out of memory for the logits of %s examples\n", rt_commas(n, num));
        free(logits), free(pred), free(confusion);
        return 1;
    }
    g->pred_logits = logits;
    double t0 = train_now();
    train_evaluate(g, d, order);
    double secs = train_now() - t0;
    g->pred_logits = NULL;
    const int *labels = info->unlabelled ? NULL : d->labels;
    long correct = 0;
    for (long i = 0; i < n; i++) {
        const float *row = logits + i * k;
        int best = 0;
        for (int j = 1; j < k; j++)
            if (row[j] > row[best]) best = j;
        pred[i] = best;
        if (labels && labels[i] < k) {
            confusion[labels[i] * k + best]++;
            correct += labels[i] == best;
        }
    }
    /* the classes' names: the checkpoint's, else the data's */
    const char **names = malloc(sizeof(char *) * (size_t)k), *lines = cfg->class_names;
    char *copy = NULL;
    if (!split_names(lines, k, &copy, names)) lines = info->class_names;
    bool named = names && (copy || split_names(lines, k, &copy, names));
    bool json = ends_with(cfg->predict, ".jsonl"), csv = ends_with(cfg->predict, ".csv");
    int rc = json || csv ? write_rows(cfg->predict, json, logits, pred, labels, named ? names : NULL, n, k, err, sizeof err)
                         : write_safetensors(g, cfg->predict, logits, pred, labels, confusion, named ? lines : NULL, n, k, err,
                                             sizeof err);
    if (rc) {
        fprintf(stderr, "mgc: %s\n", err);
    } else {
        printf("mgc: predicted %s %s examples in %.2f s (%s examples/s): %s\n", rt_commas(n, num),
               cfg->eval_train_split ? "training" : "test", secs, rt_commas((long)(n / (secs > 0 ? secs : 1e-9)), err),
               cfg->predict);
        if (labels) {
            printf("accuracy %.4f (%s of %s)\n", (double)correct / (double)n, rt_commas(correct, num), rt_commas(n, err));
            if (named && k <= 20) {
                printf("classes:");
                for (int j = 0; j < k; j++) printf(" %d %s%s", j, names[j], j + 1 < k ? "," : "\n");
            }
            if (k <= 20) {   /* a wider one is in FILE.safetensors's `confusion` */
                printf("confusion (rows: label, columns: prediction)\n      ");
                for (int j = 0; j < k; j++) printf(" %6d", j);
                printf("\n");
                for (int i = 0; i < k; i++) {
                    printf("%6d", i);
                    for (int j = 0; j < k; j++) printf(" %6lld", (long long)confusion[i * k + j]);
                    printf("\n");
                }
            }
        }
    }
    free(logits), free(pred), free(confusion), free(names), free(copy);
    return rc ? 1 : 0;
}
