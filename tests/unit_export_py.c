/*
** Unit tests of the PyTorch export's refusals, on graphs no .net file makes: an
** evaluation graph with an op the form cannot write (a node damaged into
** dropout_mask), BatchNorm in its training form, two layers whose names
** nest, a file that cannot be written. Each must fail naming what and where
** (the op and its .net location), writing nothing; the undamaged graph
** exports. (tests/torch/export_check.py checks what the exports write.)
** Prints "N passed, M failed"; exit 1 on failure.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "export.h"
#include "pipeline.h"

static int passed, failed;

#define CHECK(cond, ...) do { \
    if (cond) passed++; \
    else { failed++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

typedef struct Case { Arena arena; Diag diag; Graph g; StFile weights; CkModel info; } Case;

/* net's graph (evaluation form unless training) and a checkpoint of zeros
   under its tensors' names, as they are after damage() */
static int make(Case *c, const char *net, bool training, void (*damage)(Graph *))
{
    arena_init(&c->arena);
    diag_init(&c->diag, stderr);
    MgcOptions o = { .net = net, .training = training, .replicas = 1, .codegen = { .fuse = true, .conv = -1, .cpu_only = true },
                     .plan_batch = 8 };
    if (mgc_graph(&o, &c->arena, &c->diag, &c->g, NULL) != MGC_OK) return -1;
    if (damage) damage(&c->g);
    StWriter *w = st_writer_new();
    for (int id = 0; id < c->g.n; id++) {
        const Node *n = &c->g.nodes[id];
        if (n->op != OP_PARAM && n->op != OP_STATE) continue;
        long long shape[IR_MAXDIM], count = 1;
        for (int d = 0; d < n->shape.nd; d++) count *= shape[d] = n->shape.d[d];
        float *zeros = calloc((size_t)count, sizeof *zeros);
        st_writer_add_f32(w, n->name, n->shape.nd, shape, zeros);
        free(zeros);
    }
    char path[] = "/tmp/unit_export_XXXXXX", err[512];
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    int rc = fd < 0 || st_writer_save(w, path, err, sizeof err) || st_load(path, &c->weights, err, sizeof err);
    st_writer_free(w);
    unlink(path);
    memset(&c->info, 0, sizeof c->info);
    c->info.bf16 = -1;
    return rc ? -1 : 0;
}

static void release(Case *c)
{
    st_free(&c->weights);
    arena_free(&c->arena);
}

/* ex_pytorch of c to path: its status, the message in err */
static int export_py(Case *c, const char *path, char *err, size_t size)
{
    ExModel m = { .graph = &c->g, .weights = &c->weights, .info = &c->info, .net_name = c->g.net_name, .checkpoint = "ck.safetensors" };
    err[0] = 0;
    return ex_pytorch(&m, path, err, size);
}

static int find_op(const Graph *g, Op op)
{
    for (int id = 0; id < g->n; id++)
        if (g->nodes[id].op == op) return id;
    return -1;
}

/* lenet's second relu (nets/lenet.net:8:50) made a dropout_mask */
static void relu_to_dropout(Graph *g)
{
    int first = find_op(g, OP_RELU);
    for (int id = first + 1; id < g->n; id++)
        if (g->nodes[id].op == OP_RELU) {
            g->nodes[id].op = OP_DROPOUT_MASK;
            g->nodes[id].attr.p = 0.5f;
            return;
        }
}

/* conv2's tensors named under conv1, a layer: conv1.inner.weight */
static void nest_names(Graph *g)
{
    for (int id = 0; id < g->n; id++) {
        Node *n = &g->nodes[id];
        if (n->name && !strncmp(n->name, "conv2.", 6)) n->name = arena_printf(g->arena, "conv1.inner.%s", n->name + 6);
    }
}

static bool file_exists(const char *path) { return access(path, F_OK) == 0; }

int main(void)
{
    char err[1024], path[] = "/tmp/unit_export_py_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    unlink(path);
    Case c;

    /* the graph as the front end makes it: written */
    CHECK(!make(&c, "nets/lenet.net", false, NULL), "lenet compiles");
    int rc = export_py(&c, path, err, sizeof err);
    CHECK(rc == 0 && file_exists(path), "lenet exports: %s", err);
    unlink(path);
    release(&c);

    /* an op with no PyTorch form, named with its place */
    CHECK(!make(&c, "nets/lenet.net", false, relu_to_dropout), "lenet compiles");
    rc = export_py(&c, path, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "nets/lenet.net:8:50: dropout_mask has no PyTorch form"), "dropout_mask refused: %s", err);
    CHECK(!file_exists(path), "nothing written");
    release(&c);

    /* BatchNorm on the batch's statistics: the training form */
    CHECK(!make(&c, "nets/bn_lenet.net", true, NULL), "bn_lenet compiles");
    rc = export_py(&c, path, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "nets/bn_lenet.net:6:54: bn_apply takes bn_stats") && strstr(err, "evaluation form"),
          "training BatchNorm refused: %s", err);
    CHECK(!file_exists(path), "nothing written");
    release(&c);

    /* a layer's name inside another layer's */
    CHECK(!make(&c, "nets/lenet.net", false, nest_names), "lenet compiles");
    rc = export_py(&c, path, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "nets/lenet.net:8:24: the module 'conv1' would be both a layer and hold others"),
          "nested layer names refused: %s", err);
    release(&c);

    /* a path that cannot be written */
    CHECK(!make(&c, "nets/lenet.net", false, NULL), "lenet compiles");
    rc = export_py(&c, "/nonexistent-dir/model.py", err, sizeof err);
    CHECK(rc == -1 && strstr(err, "to /nonexistent-dir/model.py: No such file or directory (writing /nonexistent-dir/model.py.tmp)"),
          "unwritable path refused: %s", err);
    release(&c);

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
