/*
** A file's digest as a data set's reader takes it (DataDigest, data.h): its
** name, its bytes counted and their CRC-32, taken piece by piece as the
** reader reads them.
*/
#include "digest.h"
#include <stdio.h>
#include <string.h>
#include <zlib.h>

void data_digest_start(DataDigest *d, const char *path)
{
    const char *slash = strrchr(path, '/');
    snprintf(d->file, sizeof d->file, "%s", slash ? slash + 1 : path);
    d->bytes = 0;
    d->crc = crc32(0L, Z_NULL, 0);
}

void data_digest_add(DataDigest *d, const void *bytes, size_t n)
{
    for (size_t at = 0; at < n; at += 1u << 30) {   /* in pieces that fit zlib's uInt */
        size_t k = n - at < (1u << 30) ? n - at : (1u << 30);
        d->crc = crc32(d->crc, (const Bytef *)bytes + at, (uInt)k);
    }
    d->bytes += (long long)n;
}
