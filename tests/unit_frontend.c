/*
** Unit tests of the front end (frontend/frontend.h) through fe_compile_text:
** parameter counts and names of small nets, --set overrides, automatic
** names, two compilations side by side, and that errors come back as -1
** with a file:line:col message. Prints "N passed, M failed"; exit 1 on failure.
*/
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "frontend.h"

static int passed, failed;

#define CHECK(cond, ...) do { \
    if (cond) passed++; \
    else { failed++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

typedef struct Run {
    Arena arena;
    Diag diag;
    Graph g;
    char *msg;      /* everything diag printed */
    size_t msg_len;
    FILE *out;
    int rc;
} Run;

static void run(Run *r, const char *text, const FeOverride *sets, int nsets)
{
    arena_init(&r->arena);
    r->msg = NULL;
    r->msg_len = 0;
    r->out = open_memstream(&r->msg, &r->msg_len);
    diag_init(&r->diag, r->out);
    ir_graph_init(&r->g, &r->arena, &r->diag, NULL, true);
    r->rc = fe_compile_text(&r->g, "t.net", text, sets, nsets);
    fflush(r->out);
}

static void done(Run *r)
{
    fclose(r->out);
    free(r->msg);
    arena_free(&r->arena);
}

static const char *lenet =
    "net lenet(classes = 10, in_channels = 1) {\n"
    "    input x[N, in_channels, 28, 28]\n"
    "    return x -> conv1: conv2d(6, kernel = 5) -> relu -> maxpool2d(2, stride = 2)\n"
    "             -> conv2: conv2d(16, kernel = 5) -> relu -> maxpool2d(2, stride = 2)\n"
    "             -> flatten -> fc1: linear(120) -> relu -> fc2: linear(84) -> relu\n"
    "             -> fc3: linear(classes) -> softmax_cross_entropy\n"
    "}\n";

static void test_lenet(void)
{
    Run a, b;
    run(&a, lenet, NULL, 0);
    FeOverride set[] = { { "classes", "100" } };
    run(&b, lenet, set, 1);            /* a second compilation while the first is alive */
    int ta = 0, tb = 0;
    CHECK(a.rc == 0, "lenet: rc %d: %s", a.rc, a.msg);
    CHECK(ir_param_count(&a.g, &ta) == 44426 && ta == 10, "lenet: %ld params in %d tensors",
          ir_param_count(&a.g, &ta), ta);
    CHECK(b.rc == 0 && ir_param_count(&b.g, &tb) == 44426 + 90 * 85 && tb == 10, "--set classes=100");
    CHECK(ir_find_param(&a.g, "fc3.bias") >= 0 && ir_find_param(&a.g, "conv1.weight") >= 0, "lenet names");
    CHECK(a.g.loss >= 0 && a.g.input >= 0, "lenet loss and input");
    CHECK(strcmp(a.g.net_name, "lenet") == 0, "net name '%s'", a.g.net_name);
    done(&a);
    done(&b);
}

static void test_blocks(void)
{
    Run r;
    run(&r,
        "block unit(c, s = 1)(x) {\n"
        "    y = x -> conv1: conv2d(c, kernel = 3, stride = s, padding = 1) -> bn: batchnorm2d\n"
        "    if s != 1 or x.channels != c { x = x -> proj: conv2d(c, kernel = 1, stride = s) }\n"
        "    return y -> add(x) -> relu\n"
        "}\n"
        "net n(k = 2) {\n"
        "    input x[N, 3, 8, 8]\n"
        "    for i in 0..k { x = x -> (i): unit(4 * (i + 1), s = if i == 0 then 1 else 2) }\n"
        "    x = x -> conv2d(4, 1) -> conv2d(4, 1) -> unit(8)\n"
        "    return x -> global_avgpool -> flatten -> linear(10) -> softmax_cross_entropy\n"
        "}\n", NULL, 0);
    CHECK(r.rc == 0, "blocks: %s", r.msg);
    CHECK(ir_find_param(&r.g, "0.conv1.weight") >= 0 && ir_find_param(&r.g, "1.proj.bias") >= 0 &&
          ir_find_param(&r.g, "0.proj.weight") >= 0, "computed labels");
    CHECK(ir_find_param(&r.g, "conv2d_0.weight") >= 0 && ir_find_param(&r.g, "conv2d_1.weight") >= 0 &&
          ir_find_param(&r.g, "unit_0.conv1.weight") >= 0 && ir_find_param(&r.g, "linear_0.bias") >= 0,
          "automatic names");
    done(&r);
}

/* Each bad text must fail with a message that contains want. */
static void test_errors(void)
{
    static const struct { const char *text, *want; } cases[] = {
        { "net n() {\n  input x[N, 4]\n  return x -> linar(3) -> softmax_cross_entropy\n}\n",
          "t.net:3:15: error: unknown layer 'linar'; did you mean 'linear'?" },
        { "net n() {\n  input x[N, 4]\n  return x -> linear(3)\n}\n", "t.net:3:15: error: the net must return the loss" },
        { "net n() {\n  input x[N, 4]\n  return x -> linear(3) -> softmax_cross_entropy\n", "unexpected end of file" },
        { "", "t.net:1:1: error: the file defines nothing" },
        { "net n() {\n  input x[N, 4]\n  for i in 0..20000 { x = x }\n  return x\n}\n", "t.net:3:3: error: this loop would run 20000 times" },
        { "block a(x) { return x -> a }\nnet n() {\n  input x[N, 4]\n  return x -> a -> softmax_cross_entropy\n}\n",
          "t.net:1:26: error: recursive use of block 'a'" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Run r;
        run(&r, cases[i].text, NULL, 0);
        CHECK(r.rc == -1 && r.diag.errors > 0 && r.msg && strstr(r.msg, cases[i].want),
              "case %zu: rc %d, wanted '%s' in:\n%s", i, r.rc, cases[i].want, r.msg ? r.msg : "");
        done(&r);
    }
    Run r;
    FeOverride bad[] = { { "classes", "abc" } };
    run(&r, lenet, bad, 1);
    CHECK(r.rc == -1 && strstr(r.msg, "bad value 'abc'"), "--set classes=abc: %s", r.msg);
    done(&r);
    FeOverride unknown[] = { { "clases", "3" } };
    run(&r, lenet, unknown, 1);
    CHECK(r.rc == -1 && strstr(r.msg, "did you mean 'classes'") && strstr(r.msg, "in_channels"),
          "--set clases=3: %s", r.msg);
    done(&r);
}

/* max, min and ** in number expressions: value and type (an integer is
   accepted as an input dimension, a float is refused there). */
static void test_expressions(void)
{
    static const struct { const char *expr; double want; int is_int; } cases[] = {
        { "2 ** 3", 8, 1 },                { "2 ** 3 ** 2", 512, 1 },      /* right to left */
        { "-2 ** 2", -4, 1 },              { "(-2) ** 2", 4, 1 },          /* ** before unary minus */
        { "(-2) ** 3", -8, 1 },            { "2 ** 0", 1, 1 },
        { "0 ** 0", 1, 1 },                { "(-1) ** 2147483647", -1, 1 },
        { "1 ** 2147483647", 1, 1 },       { "2 ** 30 / 2 ** 11", 524288, 1 },
        { "3 * 2 ** 2", 12, 1 },           { "2 ** -1", 0.5, 0 },          /* a negative exponent: a float */
        { "2 ** -2 * 4", 1, 0 },           { "4.0 ** 0.5", 2, 0 },
        { "2 ** 2.0", 4, 0 },              { "max(1, 16 / 4)", 4, 1 },
        { "max(1, 2 / 4)", 1, 1 },         { "min(3, 5, -1, 2)", -1, 1 },
        { "max(1, 2.5)", 2.5, 0 },         { "max(3, 2.5)", 3, 0 },        /* any float: a float */
        { "min(2 ** 4, max(3, 7) * 2)", 14, 1 }, { "max(-1, -2) + min(10, 20)", 9, 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        Run r;
        snprintf(text, sizeof text, "net n() {\n  input x[N, if (%s) == %.17g then 1 else 2]\n"
                 "  return x -> linear(3) -> softmax_cross_entropy\n}\n", cases[i].expr, cases[i].want);
        run(&r, text, NULL, 0);
        CHECK(r.rc == 0 && ir_shape(&r.g, r.g.input)->d[1] == 1, "%s == %g: rc %d, %s", cases[i].expr,
              cases[i].want, r.rc, r.msg);
        done(&r);
        snprintf(text, sizeof text, "net n() {\n  input x[N, 1000 + (%s)]\n"
                 "  return x -> linear(3) -> softmax_cross_entropy\n}\n", cases[i].expr);
        run(&r, text, NULL, 0);
        bool ok = cases[i].is_int ? r.rc == 0 : r.rc == -1 && strstr(r.msg, "must be an integer, not the number");
        CHECK(ok, "%s should be %s: rc %d, %s", cases[i].expr, cases[i].is_int ? "an integer" : "a float",
              r.rc, r.msg);
        done(&r);
    }
}

/* a + b, a - b, a * b on tensors are the layers add, sub and mul: the same
   nodes and parameter names as the net written with the layers. */
static void test_tensor_operators(void)
{
    static const char *const nets[2] = {
        "net n() {\n  input x[N, 8, 4, 4]\n  y = x -> conv2d(8, 3, padding = 1)\n"
        "  g = x -> global_avgpool -> conv2d(8, 1)\n  z = x + y * g - y\n"
        "  return z -> flatten -> linear(10) -> softmax_cross_entropy\n}\n",
        "net n() {\n  input x[N, 8, 4, 4]\n  y = x -> conv2d(8, 3, padding = 1)\n"
        "  g = x -> global_avgpool -> conv2d(8, 1)\n  z = x -> add(y -> mul(g)) -> sub(y)\n"
        "  return z -> flatten -> linear(10) -> softmax_cross_entropy\n}\n",
    };
    Run r[2];
    for (int k = 0; k < 2; k++) run(&r[k], nets[k], NULL, 0);
    CHECK(r[0].rc == 0 && r[1].rc == 0, "tensor operators: %s %s", r[0].msg, r[1].msg);
    if (r[0].rc == 0 && r[1].rc == 0) {
        bool same = r[0].g.n == r[1].g.n;
        for (int i = 0; same && i < r[0].g.n; i++)
            same = r[0].g.nodes[i].op == r[1].g.nodes[i].op && r[0].g.nodes[i].nin == r[1].g.nodes[i].nin &&
                   !memcmp(r[0].g.nodes[i].in, r[1].g.nodes[i].in, sizeof r[0].g.nodes[i].in) &&
                   !memcmp(ir_shape(&r[0].g, i), ir_shape(&r[1].g, i), sizeof(Shape));
        CHECK(same, "tensor operators: the graphs differ from add/mul/sub's");
        CHECK(ir_find_param(&r[0].g, "conv2d_1.weight") >= 0 && ir_find_param(&r[0].g, "linear_0.bias") >= 0,
              "tensor operators: automatic names");
    }
    for (int k = 0; k < 2; k++) done(&r[k]);
}

/* Prefixes of a valid net, and byte flips: errors, never crashes. */
static void test_robust(void)
{
    size_t n = strlen(lenet);
    char *buf = malloc(n + 1);
    int bad_rc = 0;
    for (size_t cut = 0; cut < n; cut += 7) {
        memcpy(buf, lenet, cut);
        buf[cut] = 0;
        Run r;
        run(&r, buf, NULL, 0);
        if (r.rc != -1 || r.diag.errors == 0) bad_rc++;
        done(&r);
    }
    unsigned seed = 1;
    for (int k = 0; k < 300; k++) {
        memcpy(buf, lenet, n + 1);
        for (int j = 0; j < 3; j++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % n;
            seed = seed * 1103515245u + 12345u;
            buf[at] = (char)(1 + (seed >> 8) % 255);
        }
        Run r;
        run(&r, buf, NULL, 0);
        if (r.rc != 0 && (r.rc != -1 || r.diag.errors == 0)) bad_rc++;
        done(&r);
    }
    CHECK(bad_rc == 0, "%d truncated/mutated nets did not return -1 with an error", bad_rc);
    free(buf);
}

int main(void)
{
    test_lenet();
    test_blocks();
    test_errors();
    test_expressions();
    test_tensor_operators();
    test_robust();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
