/*
** json.c: the JSON of a safetensors header. The parser reads one value at a
** time at a cursor, for a caller that knows what it expects; the first
** mistake is kept (msg, err_at) and every later call fails. The writer
** appends to a growing buffer and remembers running out of memory.
*/
#ifndef MGC_JSON_H
#define MGC_JSON_H
#include <stddef.h>

#define JSON_MAX_DEPTH 64            /* arrays and objects inside each other, at most */

typedef struct Json {
    const char *begin, *p, *end;   /* the header text, cursor */
    int depth;
    char msg[160];                 /* first error, empty if none */
    const char *err_at;
} Json;

/* Keeps the first error (printf format) and where it was; returns -1. */
int  json_fail(Json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Skips whitespace. */
void json_ws(Json *j);
/* Skips whitespace and consumes c; -1 if the next character is not c. */
int  json_expect(Json *j, char c);
/* Peeks the next non-space character; 0 at the end. */
char json_peek(Json *j);
/* Parses a string. With out != NULL, returns it malloc'd and unescaped
   (UTF-8); an escaped NUL is rejected then, as C strings cannot hold it. */
int  json_string(Json *j, char **out);
/* A non-negative integer that fits in 2^62 (shapes, offsets). */
int  json_uint(Json *j, long long *out);
/* Skips any value (nesting at most JSON_MAX_DEPTH). */
int  json_skip(Json *j);
/* Walks an object of string values (the metadata): the value of key_wanted
   (the last, where it is there twice) into *value_out, malloc'd; -1 on a
   syntax error or a value that is not a string. */
int  json_string_map(Json *j, const char *key_wanted, char **value_out);

typedef struct JsonBuf { char *s; size_t len, cap; int oom; } JsonBuf;

/* Appends n bytes of s. */
void json_buf_put(JsonBuf *b, const char *s, size_t n);
/* Appends printf's text (at most 127 bytes). */
void json_buf_printf(JsonBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string: quoted, '"', '\\' and control characters escaped. */
void json_buf_string(JsonBuf *b, const char *s);

#endif
