/*
** JSON for the safetensors header (safetensors.c): a small recursive-descent
** parser written for untrusted input (every read bounds-checked against the
** text's end, nesting limited, numbers parsed with overflow checks, the
** first mistake kept with where it was), and the writer's text buffer.
*/
#include "json.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int json_fail(Json *j, const char *fmt, ...)
{
    if (!j->msg[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->msg, sizeof j->msg, fmt, ap);
        va_end(ap);
        j->err_at = j->p;
    }
    return -1;
}

void json_ws(Json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

/* Skips whitespace and consumes c; -1 if the next character is not c. */
int json_expect(Json *j, char c)
{
    json_ws(j);
    if (j->p >= j->end)
        return json_fail(j, "expected '%c', got end of header", c);
    if (*j->p != c)
        return json_fail(j, "expected '%c', got '%c'", c,
                         (*j->p >= 0x20 && *j->p < 0x7f) ? *j->p : '?');
    j->p++;
    return 0;
}

/* Peeks the next non-space character; 0 at the end. */
char json_peek(Json *j)
{
    json_ws(j);
    return j->p < j->end ? *j->p : 0;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Parses a string. With out != NULL, returns it malloc'd and unescaped
   (UTF-8); an escaped NUL is rejected then, as C strings cannot hold it. */
int json_string(Json *j, char **out)
{
    if (out)
        *out = NULL;
    if (json_expect(j, '"') < 0)
        return -1;
    const char *start = j->p;
    /* Unescaped text is never longer than the escaped text: the buffer is
       as long as the string as written (its closing quote found first), so
       the strings of a header take memory linear in its length. */
    char *buf = NULL;
    size_t len = 0;
    if (out) {
        const char *q = start;
        while (q < j->end && *q != '"') q += *q == '\\' && q + 1 < j->end ? 2 : 1;
        if (q < j->end && !(buf = malloc((size_t)(q - start) + 1)))   /* unterminated: said below */
            return json_fail(j, "out of memory");
    }
    for (;;) {
        if (j->p >= j->end) {
            free(buf);
            return json_fail(j, "unterminated string");
        }
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"')
            break;
        if (c < 0x20) {
            free(buf);
            j->p--;
            return json_fail(j, "control character 0x%02x in string", c);
        }
        if (c != '\\') {
            if (buf)
                buf[len++] = (char)c;
            continue;
        }
        if (j->p >= j->end) {
            free(buf);
            return json_fail(j, "unterminated string");
        }
        char e = *j->p++;
        char simple = 0;
        switch (e) {
        case '"': simple = '"'; break;
        case '\\': simple = '\\'; break;
        case '/': simple = '/'; break;
        case 'b': simple = '\b'; break;
        case 'f': simple = '\f'; break;
        case 'n': simple = '\n'; break;
        case 'r': simple = '\r'; break;
        case 't': simple = '\t'; break;
        case 'u': break;
        default:
            free(buf);
            j->p--;
            return json_fail(j, "bad escape '\\%c'", (e >= 0x20 && e < 0x7f) ? e : '?');
        }
        if (simple) {
            if (buf)
                buf[len++] = simple;
            continue;
        }
        unsigned cp;
        if (j->end - j->p < 4 || hex4(j->p, &cp) < 0) {
            free(buf);
            return json_fail(j, "bad \\u escape");
        }
        j->p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {           /* high surrogate: need the low one */
            unsigned lo;
            if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, &lo) < 0 ||
                lo < 0xDC00 || lo > 0xDFFF) {
                free(buf);
                return json_fail(j, "unpaired UTF-16 surrogate in \\u escape");
            }
            j->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            free(buf);
            return json_fail(j, "unpaired UTF-16 surrogate in \\u escape");
        }
        if (cp == 0 && buf) {
            free(buf);
            return json_fail(j, "\\u0000 in a name or value");
        }
        if (!buf)
            continue;
        /* 6 escaped chars always cover the <= 4 bytes of UTF-8 written */
        if (cp < 0x80) {
            buf[len++] = (char)cp;
        } else if (cp < 0x800) {
            buf[len++] = (char)(0xC0 | (cp >> 6));
            buf[len++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            buf[len++] = (char)(0xE0 | (cp >> 12));
            buf[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[len++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[len++] = (char)(0xF0 | (cp >> 18));
            buf[len++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            buf[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[len++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    if (buf) {
        buf[len] = 0;
        *out = buf;
    }
    return 0;
}

/* A JSON number, checked for syntax only. */
static int json_number(Json *j)
{
    const char *p = j->p;
    if (p < j->end && *p == '-')
        p++;
    if (p >= j->end || *p < '0' || *p > '9')
        return json_fail(j, "bad number");
    if (*p == '0')
        p++;
    else
        while (p < j->end && *p >= '0' && *p <= '9')
            p++;
    if (p < j->end && *p == '.') {
        p++;
        if (p >= j->end || *p < '0' || *p > '9')
            return json_fail(j, "bad number");
        while (p < j->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < j->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < j->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= j->end || *p < '0' || *p > '9')
            return json_fail(j, "bad number");
        while (p < j->end && *p >= '0' && *p <= '9')
            p++;
    }
    j->p = p;
    return 0;
}

/* A non-negative integer that fits in 2^62 (shapes, offsets). */
int json_uint(Json *j, long long *out)
{
    json_ws(j);
    const char *p = j->p;
    if (p >= j->end || *p < '0' || *p > '9')
        return json_fail(j, "expected a non-negative integer");
    unsigned long long v = 0;
    while (p < j->end && *p >= '0' && *p <= '9') {
        v = v * 10 + (unsigned)(*p - '0');
        if (v > (1ULL << 62))
            return json_fail(j, "integer too large");
        p++;
    }
    if (p < j->end && (*p == '.' || *p == 'e' || *p == 'E'))
        return json_fail(j, "expected an integer, got a fraction or exponent");
    if (p - j->p > 1 && *j->p == '0')
        return json_fail(j, "leading zero in integer");
    j->p = p;
    *out = (long long)v;
    return 0;
}

static int json_literal(Json *j, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
        return json_fail(j, "unexpected character");
    j->p += n;
    return 0;
}

int json_skip(Json *j)
{
    char c = json_peek(j);
    if (c == '"')
        return json_string(j, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        if (++j->depth > JSON_MAX_DEPTH)
            return json_fail(j, "nesting deeper than %d", JSON_MAX_DEPTH);
        j->p++;
        if (json_peek(j) == close) {
            j->p++;
            j->depth--;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                if (json_string(j, NULL) < 0 || json_expect(j, ':') < 0)
                    return -1;
            }
            if (json_skip(j) < 0)
                return -1;
            char n = json_peek(j);
            if (n == ',') {
                j->p++;
                continue;
            }
            if (json_expect(j, close) < 0)
                return -1;
            break;
        }
        j->depth--;
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9'))
        return json_number(j);
    if (c == 't')
        return json_literal(j, "true");
    if (c == 'f')
        return json_literal(j, "false");
    if (c == 'n')
        return json_literal(j, "null");
    if (!c)
        return json_fail(j, "expected a value, got end of header");
    return json_fail(j, "expected a value");
}

/* Walks an object of string values (the metadata): calls back on each pair
   when key_wanted matches; returns -1 on a syntax error or a non-string value. */
int json_string_map(Json *j, const char *key_wanted, char **value_out)
{
    if (json_expect(j, '{') < 0)
        return -1;
    if (json_peek(j) == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char *key = NULL, *value = NULL;
        if (json_string(j, &key) < 0 || json_expect(j, ':') < 0) {
            free(key);
            return -1;
        }
        if (json_peek(j) != '"') {
            free(key);
            return json_fail(j, "__metadata__ values must be strings");
        }
        if (json_string(j, &value) < 0) {
            free(key);
            return -1;
        }
        if (key_wanted && value_out && strcmp(key, key_wanted) == 0) {
            free(*value_out);
            *value_out = value;   /* last one wins, as in a JSON map */
            value = NULL;
        }
        free(key);
        free(value);
        char n = json_peek(j);
        if (n == ',') {
            j->p++;
            continue;
        }
        return json_expect(j, '}');
    }
}

/* ---- writing ------------------------------------------------------------- */

void json_buf_put(JsonBuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + n + 1)
            ncap *= 2;
        char *ns = realloc(b->s, ncap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = ncap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

void json_buf_printf(JsonBuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        json_buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

void json_buf_string(JsonBuf *b, const char *s)
{
    json_buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"')
            json_buf_put(b, "\\\"", 2);
        else if (c == '\\')
            json_buf_put(b, "\\\\", 2);
        else if (c < 0x20)
            json_buf_printf(b, "\\u%04x", c);
        else
            json_buf_put(b, s, 1);
    }
    json_buf_put(b, "\"", 1);
}
