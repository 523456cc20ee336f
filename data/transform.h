/*
** What the loader does to each image on its way into a batch, as
** torchvision's transforms in this order:
**
**   Resize((H, W), antialias=False)   --resize HxW: bilinear, half-pixel
**                                     centres (F.interpolate, align_corners=False)
**   RandomCrop(size, padding=P)       --augment crop:P: P zeros around, a random
**                                     window of the image's size (training only)
**   RandomHorizontalFlip()            --augment flip: half of the images (training only)
**   Normalize(mean, std)              --normalize: per channel, the training set's
**
** on the image as ToTensor gives it (byte / 255; F32 data as stored). The
** random draws of an example are a function of (seed, epoch, its index in the
** data set): the same on any number of devices, ranks and threads, and after
** --resume.
*/
#ifndef MGC_TRANSFORM_H
#define MGC_TRANSFORM_H
#include <stdbool.h>
#include "data.h"

#define TRANSFORM_MAX_CHANNELS DATA_MAX_CHANNELS

typedef struct Transform {
    int out_h, out_w;         /* --resize: the size images come out at; 0: as stored */
    int crop_pad;             /* --augment crop:P (0: no crop) */
    bool flip;                /* --augment flip */
    float crop_scale;         /* --augment crop-resize:S: RandomResizedCrop, area (S, 1), aspect (3/4, 4/3) (0: none) */
    float rotate;             /* --augment rotate:D: RandomRotation(D) degrees, nearest, zeros outside (0: none) */
    float translate;          /* --augment translate:F: RandomAffine(translate=(F, F)), whole pixels (0: none) */
    float erase;              /* --augment erase:P: RandomErasing(p=P), area (0.02, 0.33), aspect (0.3, 3.3), value 0 */
    bool normalize;           /* --normalize: (x - mean[c]) / std[c] */
    float mean[TRANSFORM_MAX_CHANNELS], std[TRANSFORM_MAX_CHANNELS];   /* filled by transform_fit() */
    int given;                /* --normalize=M1,..,Mc,S1,..,Sc: the channels whose mean and std were given (0: fitted) */
} Transform;

/* One axis of a bilinear resize as PyTorch's upsample_bilinear2d (align_corners=False): output i
   reads inputs i0 and i0 + step, weights 1 - l and l. */
typedef struct Tap { int i0, step; float l; } Tap;
void transform_taps(int in, int out, Tap *taps);
/* Plane s (rows IW apart) resized through the taps ty and tx into o [H, W]. */
void transform_resize_plane(const float *s, int IW, const Tap *ty, const Tap *tx, int H, int W, float *o);

/* Whether t changes anything (else data_gather's plain copy is the loader). */
bool transform_active(const Transform *t);
/* The per-channel mean and standard deviation of d's pixels (byte / 255, or
   the F32 values, over every pixel of every image, before any resize:
   torchvision's usual recipe), into t when t->normalize; exact (from a
   histogram; floats summed in double), the same everywhere. A constant
   channel (deviation 0) is only shifted; one whose deviation is not 0 but
   rounds to 0 in float32 cannot be divided by: -1, with err naming it. */
int  transform_fit(Transform *t, const Dataset *d, char *err, size_t err_size);
/* The shape images come out at: d's, or --resize's. */
void transform_shape(const Transform *t, const Dataset *d, int *c, int *h, int *w);
/* As data_gather, through t: training (augment: true) draws each example's
   crop and flip from (seed, epoch, its index); evaluation only resizes and
   normalises. */
void transform_gather(const Transform *t, const Dataset *d, const int *order, int b, bool augment,
                      unsigned long long seed, int epoch, float *x, float *y);
/* t in words for the run's first lines and the ranks' agreement:
   "resize 32x32, crop:4, flip, normalize (mean 0.286 std 0.353)"; "" when inactive. */
void transform_str(const Transform *t, char *out, size_t size);

#endif
