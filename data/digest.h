/*
** digest.c: what the readers of the data sets (data.c, data_cifar.c,
** data_st.c) keep of every file they read, for the ranks of an mpirun to
** compare.
*/
#ifndef MGC_DATA_DIGEST_H
#define MGC_DATA_DIGEST_H
#include "data.h"
#include <stddef.h>

/* A digest begun for the file at path (its name, no bytes yet). */
void data_digest_start(DataDigest *d, const char *path);
/* n more bytes of it. */
void data_digest_add(DataDigest *d, const void *bytes, size_t n);

#endif
