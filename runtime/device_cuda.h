/*
** The CUDA device (runtime/device_cuda.c): a GPU behind the device interface.
** Built when the CUDA toolkit's headers are found (HAVE_CUDA); the driver,
** cuBLAS and NCCL are opened at run time, so a binary built with CUDA starts
** and trains on CPU devices on a machine with no GPU, driver or NCCL.
*/
#ifndef MGC_DEVICE_CUDA_H
#define MGC_DEVICE_CUDA_H
#include "device.h"
#include "world.h"

typedef struct CudaOptions {
    bool tf32;                /* GEMMs may use TF32 tensor cores (else full fp32) */
    bool verbose;             /* say what was found and compiled */
} CudaOptions;

/* The GPUs this process can use: their count, or -1 with the reason in err
   (built without CUDA, no driver, no GPU). */
int     rt_cuda_device_count(char *err, size_t err_size);
/* What the build has: "built with CUDA 13.0, cuBLAS 13.1, NCCL 2.28" (the
   headers' versions; the libraries are opened at run time), or NULL when
   built without CUDA. */
const char *rt_cuda_build(char *buf, size_t size);
/* GPU gpu's name and architecture ("NVIDIA H200, sm_90"), or -1 with why in err. */
int     rt_cuda_gpu_name(int gpu, char *buf, size_t size, char *err, size_t err_size);
/* Device cuda:gpu. NULL with a message in err. */
Device *rt_device_cuda_new(int gpu, const CudaOptions *opt, char *err, size_t err_size);
/* Joins the n CUDA devices of this process (and the same of every rank of
   world) into one data-parallel group for ncolls collectives: NCCL across
   GPUs, or, when every device is the same GPU in one process, a reduction
   over the replicas' buffers on that GPU. 0, or -1 with err. */
int     rt_cuda_group(Device **devs, int n, World *world, int ncolls, char *err, size_t err_size);

#endif
