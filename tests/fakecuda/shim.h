/*
** fakecuda's device side: what the generated CUDA kernels need from CUDA, on
** the CPU, so that the fake NVRTC (fakecuda.c) can compile them with the
** system's C++ compiler into a shared object that the fake driver runs.
**
** A launch runs its blocks one after another on the launching thread. A
** kernel that never synchronises runs its threads one after another too; one
** that does (__syncthreads, a warp shuffle) runs each thread as a fiber
** with its own stack, switched at every barrier, so that every
** thread of the block reaches the barrier before any passes it: the order of
** a block's threads between barriers is the only freedom a GPU has that this
** does not explore (x86-64 only: the switch is a few instructions of
** assembly). Whether a kernel synchronises is read from its source by
** the fake NVRTC; a kernel said not to that does anyway stops the process.
**
** Included (g++ -include) ahead of the kernels' source; the source's own
** macros stay as NVRTC sees them. The emulation's state is the loaded
** module's own (plain statics: thread-local storage costs a call at every
** access in a shared object, and barriers access it all the time):
** the fake driver loads a copy of the module each time it is asked, mgc loads
** one per device and drives a device from one thread at a time, and a launch
** into a module that another thread is running in stops the process.
*/
#ifndef FAKECUDA_SHIM_H
#define FAKECUDA_SHIM_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 { unsigned x, y, z; };
static dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, sizeof i); return i; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, sizeof f); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, sizeof u); return u; }
/* the blocks of a launch run one after another: the atomics and fences need no more than these */
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

enum { FK_RUN, FK_BARRIER, FK_DONE };
enum { FK_STACK = 128 << 10, FK_MAX_THREADS = 1024 };

/* A switch between fibers saves what the ABI says a call keeps (rbx, rbp,
   r12-r15) on the stack it leaves and takes them from the one it enters:
   no system call, unlike swapcontext's signal mask. */
extern "C" __attribute__((visibility("hidden"))) void fk_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl fk_switch\n"
    ".hidden fk_switch\n"
    ".type fk_switch, @function\n"
    "fk_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size fk_switch, .-fk_switch\n");

struct FkFiber { void *sp; int state; };
static FkFiber *fk_fib;        /* the block's threads (fibers) */
static char *fk_stacks;
static int fk_cur, fk_nstacks;
static bool fk_direct;          /* threads run one after another: no barrier may come */
static const char *fk_kernel;
static void *fk_sched_sp;
static void (*fk_body)(const void *);
static const void *fk_arg;

static void fk_barrier(const char *what)
{
    if (fk_direct) {
        fprintf(stderr, "fakecuda: kernel %s calls %s, but its source was read as never synchronising\n", fk_kernel, what);
        abort();
    }
    int me = fk_cur;
    fk_fib[me].state = FK_BARRIER;
    fk_switch(&fk_fib[me].sp, fk_sched_sp);
}

static inline void __syncthreads(void) { fk_barrier("__syncthreads"); }

/* every thread of the block leaves its value, all wait, each reads its
   partner's. Two exchanges alternate (each thread counts its shuffles): a
   thread that writes the next one's cannot overwrite a value not yet read,
   and one barrier a shuffle is enough. */
static double fk_xch[2][FK_MAX_THREADS];
static unsigned char fk_nshfl[FK_MAX_THREADS];
template <class T> static inline T fk_shfl_xor(T v, int o)
{
    unsigned me = threadIdx.x, other = (threadIdx.x & ~31u) | ((threadIdx.x & 31u) ^ (unsigned)o);
    double *xch = fk_xch[fk_nshfl[me]++ & 1];
    xch[me] = (double)v;
    fk_barrier("__shfl_xor_sync");
    return (T)xch[other < blockDim.x ? other : me];
}
static inline float __shfl_xor_sync(unsigned, float v, int o) { return fk_shfl_xor(v, o); }
static inline double __shfl_xor_sync(unsigned, double v, int o) { return fk_shfl_xor(v, o); }

static void fk_entry(void)
{
    fk_body(fk_arg);
    fk_fib[fk_cur].state = FK_DONE;
    void *gone;
    fk_switch(&gone, fk_sched_sp);
    abort();   /* a finished fiber is never entered again */
}

/* one launch: gx blocks of bx threads, args copied per thread (kernels take them by value) */
static void fk_launch(void (*body)(const void *), const void *args, unsigned gx, unsigned bx, bool sync, const char *name)
{
    static int busy;
    if (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) {
        fprintf(stderr, "fakecuda: kernel %s launched from two threads at once into one loaded module\n", name);
        abort();
    }
    gridDim = { gx, 1, 1 };
    blockDim = { bx, 1, 1 };
    fk_kernel = name;
    if (sync && fk_nstacks < (int)bx) {
        if (fk_stacks) munmap(fk_stacks, (size_t)fk_nstacks * FK_STACK);
        fk_stacks = (char *)mmap(NULL, (size_t)bx * FK_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (fk_stacks == MAP_FAILED) { perror("fakecuda: fiber stacks"); abort(); }
        free(fk_fib);
        fk_fib = (FkFiber *)calloc(bx, sizeof *fk_fib);
        fk_nstacks = (int)bx;
    }
    for (unsigned b = 0; b < gx; b++) {
        blockIdx = { b, 0, 0 };
        if (!sync) {
            fk_direct = true;
            for (unsigned t = 0; t < bx; t++) {
                threadIdx = { t, 0, 0 };
                body(args);
            }
            fk_direct = false;
            continue;
        }
        fk_body = body;
        fk_arg = args;
        for (unsigned t = 0; t < bx; t++) {
            /* a fresh stack: six saved registers, then fk_entry as the return address
               (16-aligned, so that fk_entry starts as if called) */
            void **top = (void **)(fk_stacks + (size_t)(t + 1) * FK_STACK - 16);
            top[0] = (void *)fk_entry;
            top[1] = NULL;
            fk_fib[t].sp = top - 6;
            fk_fib[t].state = FK_RUN;
            fk_nshfl[t] = 0;
        }
        for (;;) {   /* each pass runs every thread to its next barrier or its end */
            int live = 0;
            for (unsigned t = 0; t < bx; t++) {
                if (fk_fib[t].state != FK_RUN) continue;
                fk_cur = (int)t;
                threadIdx = { t, 0, 0 };
                fk_switch(&fk_sched_sp, fk_fib[t].sp);
            }
            for (unsigned t = 0; t < bx; t++) live += fk_fib[t].state != FK_DONE;
            if (!live) break;
            for (unsigned t = 0; t < bx; t++)
                if (fk_fib[t].state == FK_BARRIER) fk_fib[t].state = FK_RUN;
        }
    }
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
}

template <class F> struct FkArg;
template <class A> struct FkArg<void(A)> { typedef A type; };
template <class A, void (*K)(A)> static void fk_call(const void *p)
{
    A a;
    memcpy((void *)&a, p, sizeof a);
    K(a);
}

/* what the fake NVRTC appends for each kernel NAME of the source */
#define FAKECUDA_KERNEL(name, sync)                                                                         \
    extern "C" __attribute__((visibility("default"))) void name##__fake_launch(const void *args, unsigned gx, unsigned bx) \
    {                                                                                                       \
        fk_launch(fk_call<FkArg<decltype(name)>::type, name>, args, gx, bx, sync, #name);                   \
    }                                                                                                       \
    extern "C" __attribute__((visibility("default"))) const unsigned long name##__fake_argsize =             \
        sizeof(FkArg<decltype(name)>::type);
#endif
