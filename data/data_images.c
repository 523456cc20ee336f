/*
** Image folders, torchvision's ImageFolder layout: DIR/train/CLASS/NAME.png|jpg
** and DIR/test/CLASS/..., the classes the training folders' names sorted
** (byte order, as Python's sorted()), each test class one of them; the
** files of a class in sorted order. PNG through libpng, JPEG through
** libjpeg(-turbo), as grayscale or RGB as the net takes them (the net's
** input shape, else the first image's), resized where their size is not
** the net's (bilinear, PyTorch's F.interpolate with align_corners=False,
** rounded to bytes). Decoded by the loader's threads, once: the result is
** kept in DIR/.mgc-images-SPLIT-CxHxW.bin, used again while no file was
** added, removed, resized or touched (a digest of every file's path, size
** and time says so). A file that cannot be decoded is named with its path.
*/
#include "data_formats.h"
#include "errbuf.h"
#include "transform.h"
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef HAVE_IMAGES
#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#endif

typedef struct ImageList {
    int n, cap;
    char **path;              /* each file's */
    int *label;
    int nclasses;
    char **classes;           /* the training classes' names, sorted */
    uint64_t digest;          /* of every path, size and modification time */
} ImageList;

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool is_image(const char *name)
{
    const char *dot = strrchr(name, '.');
    return name[0] != '.' && dot && (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

/* The entries of dir (directories, or image files), sorted: their count, or -1 */
static int entries(const char *dir, bool dirs, char ***out)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0, cap = 0;
    char **v = NULL;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[2 * DATA_PATH];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) || (dirs ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode) || !is_image(e->d_name))) continue;
        if (n == cap) {
            char **w = realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 64));
            if (!w) break;
            v = w;
        }
        v[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(v, (size_t)n, sizeof *v, by_name);
    *out = v;
    return n;
}

static void free_names(char **v, int n)
{
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

static void list_free(ImageList *l)
{
    free_names(l->path, l->n);
    free(l->label);
    free_names(l->classes, l->nclasses);
    memset(l, 0, sizeof *l);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* DIR/SPLIT's files by class: the classes are `classes` (the training set's) or, when NULL, the
   folders found here. 0, or -1 with err. */
static int list_split(const char *dir, const char *split, char **classes, int nclasses, ImageList *l, char *err, size_t size)
{
    char root[DATA_PATH];
    snprintf(root, sizeof root, "%s/%s", dir, split);
    char **found;
    int nfound = entries(root, true, &found);
    if (nfound <= 0) {
        set_err(err, size, "%s: no class folders (torchvision's ImageFolder layout: %s/CLASS/*.png or *.jpg, a folder a class)",
                root, root);
        if (nfound == 0) free(found);
        return -1;
    }
    memset(l, 0, sizeof *l);
    l->digest = 0xcbf29ce484222325ULL;
    int rc = 0;
    for (int c = 0; c < nfound && !rc; c++) {
        int label = c;
        if (classes) {   /* a test class: one of training's */
            label = -1;
            for (int k = 0; k < nclasses && label < 0; k++) if (!strcmp(classes[k], found[c])) label = k;
            if (label < 0) {
                set_err(err, size, "%s/%s: a test class the training set (%s/train) does not have: its images could not be "
                        "labelled", root, found[c], dir);
                rc = -1;
                break;
            }
        }
        char cdir[2 * DATA_PATH];
        snprintf(cdir, sizeof cdir, "%s/%s", root, found[c]);
        char **files;
        int nf = entries(cdir, false, &files);
        if (nf <= 0) {
            set_err(err, size, "%s: no .png or .jpg images in this class folder (an empty class cannot be learned; remove it)", cdir);
            if (nf == 0) free(files);
            rc = -1;
            break;
        }
        for (int i = 0; i < nf && !rc; i++) {
            if (l->n == l->cap) {
                l->cap = l->cap ? 2 * l->cap : 1024;
                char **p = realloc(l->path, sizeof *p * (size_t)l->cap);
                int *lab = realloc(l->label, sizeof *lab * (size_t)l->cap);
                if (p) l->path = p;
                if (lab) l->label = lab;
                if (!p || !lab) { set_err(err, size, "out of memory listing %s", cdir); rc = -1; break; }
            }
            char p[3 * DATA_PATH];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s", cdir, files[i]);
            if (stat(p, &st)) { set_err(err, size, "%s: %s", p, strerror(errno)); rc = -1; break; }
            l->digest = fnv(l->digest, p + strlen(dir), strlen(p + strlen(dir)) + 1);
            int64_t meta[3] = { (int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec };
            l->digest = fnv(l->digest, meta, sizeof meta);
            l->path[l->n] = strdup(p);
            l->label[l->n++] = label;
        }
        free_names(files, nf);
    }
    if (!classes && !rc) l->classes = found, l->nclasses = nfound;
    else free_names(found, nfound);
    if (rc) list_free(l);
    return rc;
}

bool images_found(const char *dir)
{
    char p[DATA_PATH];
    struct stat st;
    snprintf(p, sizeof p, "%s/train", dir);
    if (stat(p, &st) || !S_ISDIR(st.st_mode)) return false;
    char **v;
    int n = entries(p, true, &v);
    if (n > 0) free_names(v, n);
    else if (n == 0) free(v);
    return n > 0;
}

/* ------------------------------------------------------------ decoding */

#ifdef HAVE_IMAGES
typedef struct JpegErr {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} JpegErr;

static void jpeg_fail(j_common_ptr c)
{
    JpegErr *e = (JpegErr *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jump, 1);
}

/* path into *px (w x h x c bytes, interleaved), c 1 (gray) or 3 (RGB): 0, or -1 with err */
static int decode_jpeg(const char *path, int c, unsigned char **px, int *w, int *h, char *err, size_t size)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) { set_err(err, size, "%s: %s", path, strerror(errno)); return -1; }
    struct jpeg_decompress_struct ci;
    JpegErr je;
    ci.err = jpeg_std_error(&je.mgr);
    je.mgr.error_exit = jpeg_fail;
    volatile unsigned char *buf = NULL;
    if (setjmp(je.jump)) {
        set_err(err, size, "%s: not a JPEG image libjpeg can read (%s)", path, je.msg);
        jpeg_destroy_decompress(&ci);
        free((void *)buf);
        fclose(fp);
        return -1;
    }
    jpeg_create_decompress(&ci);
    jpeg_stdio_src(&ci, fp);
    jpeg_read_header(&ci, TRUE);
    ci.out_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&ci);
    *w = (int)ci.output_width, *h = (int)ci.output_height;
    buf = malloc((size_t)*w * *h * c);
    if (!buf) { set_err(err, size, "%s: out of memory", path); jpeg_destroy_decompress(&ci); fclose(fp); return -1; }
    while (ci.output_scanline < ci.output_height) {
        JSAMPROW row = (JSAMPROW)(buf + (size_t)ci.output_scanline * *w * c);
        jpeg_read_scanlines(&ci, &row, 1);
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    fclose(fp);
    *px = (unsigned char *)buf;
    return 0;
}

static int decode_png(const char *path, int c, unsigned char **px, int *w, int *h, char *err, size_t size)
{
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, path)) {
        set_err(err, size, "%s: not a PNG image libpng can read (%s)", path, im.message);
        return -1;
    }
    im.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;   /* alpha composed on black, as libpng does without a background */
    *w = (int)im.width, *h = (int)im.height;
    unsigned char *buf = malloc(PNG_IMAGE_SIZE(im));
    if (!buf || !png_image_finish_read(&im, NULL, buf, 0, NULL)) {
        set_err(err, size, "%s: %s", path, buf ? im.message : "out of memory");
        free(buf);
        png_image_free(&im);
        return -1;
    }
    *px = buf;
    return 0;
}
#endif

/* px (w x h x c, interleaved) into dst (c planes of oh x ow), resized where the sizes differ */
static void to_planes(const unsigned char *px, int w, int h, int c, unsigned char *dst, int ow, int oh)
{
    if (w == ow && h == oh) {
        for (int ch = 0; ch < c; ch++)
            for (int i = 0; i < w * h; i++) dst[(size_t)ch * w * h + i] = px[(size_t)i * c + ch];
        return;
    }
    /* each channel as a float plane, resized as the loader resizes (transform.c), rounded back to bytes */
    Tap *ty = malloc(sizeof(Tap) * (size_t)(oh + ow)), *tx = ty + oh;
    float *plane = malloc(sizeof(float) * ((size_t)w * h + (size_t)ow * oh)), *out = plane + (size_t)w * h;
    if (!ty || !plane) { free(ty), free(plane); memset(dst, 0, (size_t)c * ow * oh); return; }
    transform_taps(h, oh, ty), transform_taps(w, ow, tx);
    for (int ch = 0; ch < c; ch++) {
        for (long i = 0; i < (long)w * h; i++) plane[i] = px[(size_t)i * c + ch];
        transform_resize_plane(plane, w, ty, tx, oh, ow, out);
        for (long i = 0; i < (long)ow * oh; i++) dst[(size_t)ch * oh * ow + i] = (unsigned char)(out[i] + 0.5f);
    }
    free(ty), free(plane);
}

typedef struct Decode {
    const ImageList *l;
    Dataset *d;
    int next, failed;
    pthread_mutex_t lock;
    char err[1024];
} Decode;

static int decode_one(const char *path, int c, unsigned char **px, int *w, int *h, char *err, size_t size)
{
#ifdef HAVE_IMAGES
    const char *dot = strrchr(path, '.');
    return !strcasecmp(dot, ".png") ? decode_png(path, c, px, w, h, err, size) : decode_jpeg(path, c, px, w, h, err, size);
#else
    (void)c, (void)px, (void)w, (void)h;
    set_err(err, size, "%s: this mgc was built without libpng and libjpeg, which decode image folders (Debian: apt-get install "
            "libpng-dev libjpeg62-turbo-dev, then make again)", path);
    return -1;
#endif
}

static void *decode_worker(void *arg)
{
    Decode *t = arg;
    Dataset *d = t->d;
    size_t per = (size_t)d->channels * d->rows * d->cols;
    for (;;) {
        pthread_mutex_lock(&t->lock);
        int i = t->failed ? t->l->n : t->next++;
        pthread_mutex_unlock(&t->lock);
        if (i >= t->l->n) return NULL;
        unsigned char *px = NULL;
        int w, h;
        char err[1024];
        if (decode_one(t->l->path[i], d->channels, &px, &w, &h, err, sizeof err)) {
            pthread_mutex_lock(&t->lock);
            if (!t->failed++) snprintf(t->err, sizeof t->err, "%s", err);
            pthread_mutex_unlock(&t->lock);
            return NULL;
        }
        to_planes(px, w, h, d->channels, d->pixels + per * (size_t)i, d->cols, d->rows);
        d->labels[i] = t->l->label[i];
        free(px);
    }
}

/* The cache file's header */
typedef struct CacheHead {
    char magic[8];            /* "MGCIMG1" */
    int64_t n, c, h, w;
    uint64_t digest;
} CacheHead;

static int cache_read(const char *path, const ImageList *l, Dataset *d)
{
    FILE *f = fopen(path, "rb");
    CacheHead hd;
    size_t per = (size_t)d->channels * d->rows * d->cols;
    int rc = f && fread(&hd, sizeof hd, 1, f) == 1 && !memcmp(hd.magic, "MGCIMG1", 8) && hd.n == l->n &&
             hd.c == d->channels && hd.h == d->rows && hd.w == d->cols && hd.digest == l->digest &&
             fread(d->labels, sizeof(int), (size_t)l->n, f) == (size_t)l->n && fread(d->pixels, per, (size_t)l->n, f) == (size_t)l->n
             ? 0 : -1;
    for (int i = 0; !rc && i < l->n; i++) rc = d->labels[i] == l->label[i] ? 0 : -1;
    if (f) fclose(f);
    return rc;
}

/* written beside the data where it may be (else only this run decodes them, said by nothing: a read-only set) */
static void cache_write(const char *path, const ImageList *l, const Dataset *d)
{
    char tmp[DATA_PATH + 16];
    snprintf(tmp, sizeof tmp, "%s.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    CacheHead hd = { "MGCIMG1", l->n, d->channels, d->rows, d->cols, l->digest };
    size_t per = (size_t)d->channels * d->rows * d->cols;
    bool ok = fwrite(&hd, sizeof hd, 1, f) == 1 && fwrite(d->labels, sizeof(int), (size_t)l->n, f) == (size_t)l->n &&
              fwrite(d->pixels, per, (size_t)l->n, f) == (size_t)l->n;
    ok = !fclose(f) && ok;
    if (!ok || rename(tmp, path)) unlink(tmp);
}

/* The images of l as d (c x h x w each): from the cache where it holds them, else decoded by threads */
static int load_list(const char *dir, const char *split, const ImageList *l, int c, int h, int w, Dataset *d, char *err, size_t size)
{
    *d = (Dataset){ l->n, c, h, w, 0, NULL, NULL, NULL };
    size_t per = (size_t)c * h * w;
    d->pixels = malloc(per * (size_t)l->n);
    d->labels = malloc(sizeof(int) * (size_t)l->n);
    if (!d->pixels || !d->labels) {
        set_err(err, size, "out of memory for %d images of %dx%dx%d in %s/%s", l->n, c, h, w, dir, split);
        return -1;
    }
    char cache[DATA_PATH];
    snprintf(cache, sizeof cache, "%s/.mgc-images-%s-%dx%dx%d.bin", dir, split, c, h, w);
    if (!cache_read(cache, l, d)) return 0;
    Decode t = { .l = l, .d = d };
    pthread_mutex_init(&t.lock, NULL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = cores < 1 ? 1 : cores > 16 ? 16 : (int)cores, started = 0;
    pthread_t th[16];
    for (int k = 0; k < nt; k++) started += pthread_create(&th[started], NULL, decode_worker, &t) == 0;
    if (!started) decode_worker(&t);
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    pthread_mutex_destroy(&t.lock);
    if (t.failed) {
        set_err(err, size, "%s%s", t.err, t.failed > 1 ? " (and other images; the first is said)" : "");
        return -1;
    }
    cache_write(cache, l, d);
    return 0;
}

/* The shape to decode into: the hint's (the net's C, H, W), else the first training image's, in grayscale
   where it is */
static int first_shape(const ImageList *l, const int *hint, int *c, int *h, int *w, char *err, size_t size)
{
    if (hint && hint[0] > 0) {
        *c = hint[0], *h = hint[1], *w = hint[2];
        if (*c != 1 && *c != 3) {
            set_err(err, size, "the net takes %d channels; image folders are decoded as grayscale (1) or RGB (3)", *c);
            return -1;
        }
        return 0;
    }
    unsigned char *px = NULL;
    *c = 3;
    if (decode_one(l->path[0], 3, &px, w, h, err, size)) return -1;
    bool gray = true;
    for (long i = 0; gray && i < (long)*w * *h; i++) gray = px[3 * i] == px[3 * i + 1] && px[3 * i] == px[3 * i + 2];
    *c = gray ? 1 : 3;
    free(px);
    return 0;
}

int images_load(const char *dir, const int *hint, Dataset *train, Dataset *test, DataInfo *info, char *err, size_t size)
{
    ImageList tr, te;
    if (list_split(dir, "train", NULL, 0, &tr, err, size)) return -1;
    if (list_split(dir, "test", tr.classes, tr.nclasses, &te, err, size)) {
        list_free(&tr);
        return -1;
    }
    int c, h, w, rc = first_shape(&tr, hint, &c, &h, &w, err, size);
    if (!rc) rc = load_list(dir, "train", &tr, c, h, w, train, err, size);
    if (!rc) rc = load_list(dir, "test", &te, c, h, w, test, err, size);
    if (!rc) {
        train->classes = test->classes = tr.nclasses;
        if (info) {
            *info = (DataInfo){ .format = "images", .channels = c, .rows = h, .cols = w, .classes = tr.nclasses, .nfiles = 2 };
            int p = 0;
            for (int k = 0; k < tr.nclasses && p < (int)sizeof info->class_names; k++)
                p += snprintf(info->class_names + p, sizeof info->class_names - (size_t)p, "%s\n", tr.classes[k]);
            ImageList *ls[2] = { &tr, &te };
            for (int k = 0; k < 2; k++) {   /* the digests the ranks compare: every file's name, size and time */
                snprintf(info->files[k].file, sizeof info->files[k].file, "%s", k ? "test/" : "train/");
                info->files[k].bytes = ls[k]->n;
                info->files[k].crc = (unsigned long)(ls[k]->digest ^ ls[k]->digest >> 32);
            }
        }
    }
    list_free(&tr);
    list_free(&te);
    return rc;
}

int images_describe(const char *dir, const int *hint, DataInfo *info, char *err, size_t size)
{
    ImageList tr;
    if (list_split(dir, "train", NULL, 0, &tr, err, size)) return -1;
    int c, h, w, rc = first_shape(&tr, hint, &c, &h, &w, err, size);
    if (!rc) {
        *info = (DataInfo){ .format = "images", .channels = c, .rows = h, .cols = w, .classes = tr.nclasses };
        int p = 0;
        for (int k = 0; k < tr.nclasses && p < (int)sizeof info->class_names; k++)
            p += snprintf(info->class_names + p, sizeof info->class_names - (size_t)p, "%s\n", tr.classes[k]);
    }
    list_free(&tr);
    return rc;
}

int images_count(const char *dir, long long *examples)
{
    ImageList tr, te;
    char err[512];
    if (list_split(dir, "train", NULL, 0, &tr, err, sizeof err)) return -1;
    if (list_split(dir, "test", tr.classes, tr.nclasses, &te, err, sizeof err)) {
        list_free(&tr);
        return -1;
    }
    *examples = tr.n + te.n;
    list_free(&tr);
    list_free(&te);
    return 0;
}
