/*
** The device registry: each kind of device is a row (how one is made, how
** a process's devices of that kind join a data-parallel group), so that the
** trainer knows the device interface (device.h) and no particular device.
** A new kind is a new row and its implementation file.
*/
#include "device.h"
#include "device_cuda.h"
#include "comm.h"
#include "world.h"
#include <stdio.h>
#include <stdlib.h>

static Device *cpu_make(DeviceSpec s, const DeviceOptions *o, char *err, size_t err_size)
{
    (void)err; (void)err_size;
    return rt_device_cpu_new(s.index, o->threads > 0 ? o->threads : 1, o->own_memory);
}

/* CPU devices sum through a Comm (a ring over threads, MPI across ranks) the executor drives. */
static int cpu_group(Device **devs, int n, World *world, int ncolls, Comm **comm, char *err, size_t err_size)
{
    (void)devs; (void)err; (void)err_size;
    *comm = rt_comm_new(n, world, ncolls);
    return 0;
}

static Device *cuda_make(DeviceSpec s, const DeviceOptions *o, char *err, size_t err_size)
{
    CudaOptions co = { .tf32 = o->tf32, .verbose = o->verbose };
    return rt_device_cuda_new(s.index, &co, err, err_size);
}

/* GPUs sum by NCCL, or on one GPU for replicas that share it; the group keeps the list. */
static int cuda_group(Device **devs, int n, World *world, int ncolls, Comm **comm, char *err, size_t err_size)
{
    *comm = NULL;
    Device **kept = calloc((size_t)n, sizeof *kept);   /* kept by the group */
    for (int k = 0; k < n; k++) kept[k] = devs[k];
    return rt_cuda_group(kept, n, world, ncolls, err, err_size);
}

static const struct {
    DeviceKind kind;
    const char *name;
    Device *(*make)(DeviceSpec s, const DeviceOptions *o, char *err, size_t err_size);
    int (*group)(Device **devs, int n, World *world, int ncolls, Comm **comm, char *err, size_t err_size);
} kinds[] = {
    { DEV_CPU, "cpu", cpu_make, cpu_group },
    { DEV_CUDA, "cuda", cuda_make, cuda_group },
};
#define NKINDS ((int)(sizeof kinds / sizeof *kinds))

static int row_of(DeviceKind kind)
{
    for (int k = 0; k < NKINDS; k++)
        if (kinds[k].kind == kind) return k;
    return -1;
}

Device *rt_device_new(DeviceSpec spec, const DeviceOptions *o, char *err, size_t err_size)
{
    int k = row_of(spec.kind);
    if (k < 0) {
        snprintf(err, err_size, "internal: no device of kind %d", (int)spec.kind);
        return NULL;
    }
    return kinds[k].make(spec, o, err, err_size);
}

int rt_device_group(Device **devs, int n, World *world, int ncolls, Comm **comm, char *err, size_t err_size)
{
    *comm = NULL;
    int k = n > 0 ? row_of(devs[0]->kind) : -1;
    if (k < 0) {
        snprintf(err, err_size, "internal: no devices to group");
        return -1;
    }
    return kinds[k].group(devs, n, world, ncolls, comm, err, err_size);
}

const char *rt_device_kind_name(DeviceKind kind)
{
    int k = row_of(kind);
    return k < 0 ? "?" : kinds[k].name;
}
