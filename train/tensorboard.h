/*
** --tensorboard DIR: TensorBoard's event files. Each record is a serialised
** Event (train/tensorboard.proto, TensorBoard's own field numbers, through
** protobuf-c) in TFRecord framing: its length (8 bytes, little-endian), the
** length's masked CRC-32C, the bytes, their masked CRC-32C. Scalars per step
** and per epoch, the run's settings as a text summary, each trainable
** parameter's histogram per epoch. Built without protobuf-c, tb_open says
** so and fails.
*/
#ifndef MGC_TENSORBOARD_H
#define MGC_TENSORBOARD_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct Tb {
    FILE *f;
    char path[4200];          /* the event file's */
    bool failed;              /* a write failed (said once) */
} Tb;

/* Whether this mgc writes event files (built with protobuf-c). */
bool tb_available(void);
/* Opens DIR/events.out.tfevents.<time>.<host>.mgc (DIR made where missing) and writes the file's
   version event: 0, or -1 with err. */
int tb_open(Tb *tb, const char *dir, char *err, size_t size);
void tb_scalar(Tb *tb, const char *tag, double value, long step);
/* markdown as the text dashboard shows it */
void tb_text(Tb *tb, const char *tag, const char *markdown, long step);
/* v[0..n)'s histogram: buckets evenly between its min and max */
void tb_histogram(Tb *tb, const char *tag, const float *v, long n, long step);
/* Closes it: 0, or -1 (a write failed; said). */
int tb_close(Tb *tb);
/* The masked CRC-32C of TFRecord framing (exposed for the unit test). */
unsigned tb_masked_crc32c(const void *data, size_t n);

#endif
