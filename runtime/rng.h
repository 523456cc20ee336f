/*
** Deterministic random numbers for parameter init and data shuffling.
**
** Rng is xoshiro256** (Blackman & Vigna) seeded through splitmix64, so any
** 64-bit seed (0 included) gives a good state. Same seed, same numbers, on
** every machine: training runs are reproducible from --seed.
**
** rng_hash() is stateless and counter-based (a keyed splitmix64 finalizer):
** element i of a dropout mask is a pure function of (seed, i), so a generated
** kernel computes it in any order on any device. It is written with plain
** unsigned int / unsigned long long (no <stdint.h>, which NVRTC lacks) and its
** text is available as the string RNG_HASH_SOURCE for codegen to paste behind
** its own qualifier ("static inline " in C, "__device__ __forceinline__ " in
** CUDA). unsigned int / unsigned long long are uint32_t / uint64_t on every
** target we build for.
*/
#ifndef MGC_RNG_H
#define MGC_RNG_H
#include <stdint.h>

typedef struct Rng {
    uint64_t s[4];      /* xoshiro256** state, never all zero */
} Rng;

void     rng_seed(Rng *r, uint64_t seed);
/* Independent stream `stream` of `seed` (per layer, per epoch, ...). */
void     rng_seed2(Rng *r, uint64_t seed, uint64_t stream);
uint64_t rng_next(Rng *r);
/* Uniform in [lo, hi): 24 random mantissa bits. */
float    rng_uniform(Rng *r, float lo, float hi);
/* Uniform integer in [0, n), unbiased (Lemire's method with rejection); n >= 1. */
int      rng_below(Rng *r, int n);
/* Normal(mean, std) by Box-Muller (one value per call). */
float    rng_normal(Rng *r, float mean, float std);

/* The kernel-pasteable definition, without storage qualifier. */
#define RNG_HASH_DEFINITION \
    unsigned int rng_hash(unsigned long long seed, unsigned long long index) { \
        unsigned long long k = seed + 0x9E3779B97F4A7C15ULL; \
        k = (k ^ (k >> 30)) * 0xBF58476D1CE4E5B9ULL; \
        k = (k ^ (k >> 27)) * 0x94D049BB133111EBULL; \
        k ^= k >> 31; \
        unsigned long long z = k + (index + 1ULL) * 0x9E3779B97F4A7C15ULL; \
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL; \
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL; \
        z ^= z >> 31; \
        return (unsigned int)(z >> 32); \
    }
#define RNG_STR_(...) #__VA_ARGS__
#define RNG_XSTR_(...) RNG_STR_(__VA_ARGS__)
/* Source text of rng_hash for generated kernels (one line, no qualifier). */
#define RNG_HASH_SOURCE RNG_XSTR_(RNG_HASH_DEFINITION)

/* 32 well-mixed bits from (seed, index). A float in [0,1):
   (rng_hash(s, i) >> 8) * (1.0f / 16777216.0f). */
static inline RNG_HASH_DEFINITION

#endif
