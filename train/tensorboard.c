/*
** TensorBoard's event files (tensorboard.h).
*/
#include "tensorboard.h"
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_TB
#include "tensorboard.pb-c.h"
#endif

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), a table of 256, then TFRecord's mask */
unsigned tb_masked_crc32c(const void *data, size_t n)
{
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    uint32_t c = 0xFFFFFFFFu;
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    c ^= 0xFFFFFFFFu;
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

#ifdef HAVE_TB
bool tb_available(void) { return true; }

static double wall_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* one record: the event serialised, framed */
static void write_event(Tb *tb, MgcTb__Event *ev)
{
    if (!tb->f || tb->failed) return;
    size_t n = mgc_tb__event__get_packed_size(ev);
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf) return;
    mgc_tb__event__pack(ev, buf);
    unsigned char len[8];
    for (int k = 0; k < 8; k++) len[k] = (unsigned char)((uint64_t)n >> (8 * k));
    uint32_t c1 = tb_masked_crc32c(len, 8), c2 = tb_masked_crc32c(buf, n);
    unsigned char crc1[4], crc2[4];
    for (int k = 0; k < 4; k++) crc1[k] = (unsigned char)(c1 >> (8 * k)), crc2[k] = (unsigned char)(c2 >> (8 * k));
    errno = 0;
    if (fwrite(len, 8, 1, tb->f) != 1 || fwrite(crc1, 4, 1, tb->f) != 1 || (n && fwrite(buf, n, 1, tb->f) != 1) ||
        fwrite(crc2, 4, 1, tb->f) != 1 || fflush(tb->f)) {
        fprintf(stderr, "mgc: cannot write --tensorboard %s: %s\n", tb->path, strerror(errno ? errno : EIO));
        tb->failed = true;
    }
    free(buf);
}

/* an event of one summary value at step */
static void write_value(Tb *tb, MgcTb__Summary__Value *v, long step)
{
    MgcTb__Summary s = MGC_TB__SUMMARY__INIT;
    MgcTb__Summary__Value *vs[1] = { v };
    s.n_value = 1, s.value = vs;
    MgcTb__Event ev = MGC_TB__EVENT__INIT;
    ev.wall_time = wall_now(), ev.step = step;
    ev.what_case = MGC_TB__EVENT__WHAT_SUMMARY, ev.summary = &s;
    write_event(tb, &ev);
}

int tb_open(Tb *tb, const char *dir, char *err, size_t size)
{
    memset(tb, 0, sizeof *tb);
    char made[4096];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof made) {
        snprintf(err, size, "--tensorboard: '%s' is not a directory name", dir);
        return -1;
    }
    for (size_t i = 1; i <= len; i++)   /* the directory and the ones above it, where missing (mkdir -p) */
        if (dir[i] == '/' || dir[i] == 0) {
            snprintf(made, sizeof made, "%.*s", (int)i, dir);
            if (mkdir(made, 0777) && errno != EEXIST) {
                snprintf(err, size, "--tensorboard: cannot make the directory %s: %s", made, strerror(errno));
                return -1;
            }
        }
    char host[64] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%ld.%s.%ld.mgc", dir, (long)time(NULL), host, (long)getpid());
    if (!(tb->f = fopen(tb->path, "wb"))) {
        snprintf(err, size, "--tensorboard: cannot write %s: %s", tb->path, strerror(errno));
        return -1;
    }
    MgcTb__Event ev = MGC_TB__EVENT__INIT;
    ev.wall_time = wall_now();
    ev.what_case = MGC_TB__EVENT__WHAT_FILE_VERSION, ev.file_version = "brain.Event:2";
    write_event(tb, &ev);
    return tb->failed ? -1 : 0;
}

void tb_scalar(Tb *tb, const char *tag, double value, long step)
{
    MgcTb__Summary__Value v = MGC_TB__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = MGC_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE, v.simple_value = (float)value;
    write_value(tb, &v, step);
}

void tb_text(Tb *tb, const char *tag, const char *markdown, long step)
{
    MgcTb__SummaryMetadata__PluginData pd = MGC_TB__SUMMARY_METADATA__PLUGIN_DATA__INIT;
    pd.plugin_name = "text";
    MgcTb__SummaryMetadata md = MGC_TB__SUMMARY_METADATA__INIT;
    md.plugin_data = &pd;
    MgcTb__TensorShapeProto shape = MGC_TB__TENSOR_SHAPE_PROTO__INIT;   /* a scalar string */
    ProtobufCBinaryData s = { strlen(markdown), (uint8_t *)markdown };
    MgcTb__TensorProto t = MGC_TB__TENSOR_PROTO__INIT;
    t.dtype = 7, t.tensor_shape = &shape, t.n_string_val = 1, t.string_val = &s;
    MgcTb__Summary__Value v = MGC_TB__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag, v.metadata = &md;
    v.value_case = MGC_TB__SUMMARY__VALUE__VALUE_TENSOR, v.tensor = &t;
    write_value(tb, &v, step);
}

void tb_histogram(Tb *tb, const char *tag, const float *x, long n, long step)
{
    enum { BUCKETS = 30 };
    double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0, limit[BUCKETS], count[BUCKETS] = { 0 };
    for (long i = 0; i < n; i++) {
        double v = x[i];
        if (!isfinite(v)) continue;
        lo = v < lo ? v : lo, hi = v > hi ? v : hi, sum += v, sq += v * v;
    }
    if (!(lo <= hi)) return;   /* nothing finite */
    double w = hi > lo ? (hi - lo) / BUCKETS : 1.0;
    for (int b = 0; b < BUCKETS; b++) limit[b] = b == BUCKETS - 1 ? hi : lo + w * (b + 1);   /* each bucket's right edge */
    for (long i = 0; i < n; i++) {
        double v = x[i];
        if (!isfinite(v)) continue;
        int b = (int)((v - lo) / w);
        count[b < 0 ? 0 : b >= BUCKETS ? BUCKETS - 1 : b] += 1;
    }
    MgcTb__HistogramProto h = MGC_TB__HISTOGRAM_PROTO__INIT;
    h.min = lo, h.max = hi, h.num = (double)n, h.sum = sum, h.sum_squares = sq;
    h.n_bucket_limit = h.n_bucket = BUCKETS, h.bucket_limit = limit, h.bucket = count;
    MgcTb__Summary__Value v = MGC_TB__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = MGC_TB__SUMMARY__VALUE__VALUE_HISTO, v.histo = &h;
    write_value(tb, &v, step);
}

int tb_close(Tb *tb)
{
    int rc = tb->failed ? -1 : 0;
    if (tb->f && fclose(tb->f) && !tb->failed) {
        fprintf(stderr, "mgc: cannot write --tensorboard %s: %s\n", tb->path, strerror(errno));
        rc = -1;
    }
    tb->f = NULL;
    return rc;
}
#else
bool tb_available(void) { return false; }

int tb_open(Tb *tb, const char *dir, char *err, size_t size)
{
    (void)dir;
    memset(tb, 0, sizeof *tb);
    snprintf(err, size, "--tensorboard: this mgc was built without protobuf-c, which writes TensorBoard's events "
             "(Debian: apt-get install protobuf-c-compiler libprotobuf-c-dev, then make again)");
    return -1;
}
void tb_scalar(Tb *tb, const char *tag, double value, long step) { (void)tb, (void)tag, (void)value, (void)step; }
void tb_text(Tb *tb, const char *tag, const char *markdown, long step) { (void)tb, (void)tag, (void)markdown, (void)step; }
void tb_histogram(Tb *tb, const char *tag, const float *v, long n, long step) { (void)tb, (void)tag, (void)v, (void)n, (void)step; }
int tb_close(Tb *tb) { (void)tb; return 0; }
#endif
