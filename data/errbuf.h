/*
** errbuf.h: the runtime's loaders (data.c, safetensors.c) report a failure as
** a message in a caller's buffer; this writes it, safely, with printf format.
*/
#ifndef MGC_ERRBUF_H
#define MGC_ERRBUF_H
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline void set_err(char *err, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void set_err(char *err, size_t size, const char *fmt, ...)
{
    if (!err || size == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
}

#endif
