/*
** Deterministic random numbers: splitmix64 seeding, xoshiro256** stream,
** unbiased bounded integers, uniform and normal floats. See rng.h.
*/
#include "rng.h"
#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void rng_seed(Rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    /* splitmix64 is a bijection of distinct inputs, so four zeros cannot occur;
       keep the guard anyway, xoshiro must never hold an all-zero state. */
    if ((r->s[0] | r->s[1] | r->s[2] | r->s[3]) == 0)
        r->s[0] = 1;
}

void rng_seed2(Rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = stream;
    rng_seed(r, seed ^ splitmix64(&x));
}

uint64_t rng_next(Rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float rng_uniform(Rng *r, float lo, float hi)
{
    float u = (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);   /* [0,1) exactly */
    float v = lo + (hi - lo) * u;
    return v < hi ? v : lo;   /* rounding could reach hi; keep the interval half-open */
}

int rng_below(Rng *r, int n)
{
    if (n <= 1)
        return 0;
    uint32_t bound = (uint32_t)n;
    uint64_t m = (uint64_t)(uint32_t)(rng_next(r) >> 32) * bound;
    uint32_t low = (uint32_t)m;
    if (low < bound) {
        uint32_t threshold = (uint32_t)(-bound) % bound;
        while (low < threshold) {
            m = (uint64_t)(uint32_t)(rng_next(r) >> 32) * bound;
            low = (uint32_t)m;
        }
    }
    return (int)(m >> 32);
}

float rng_normal(Rng *r, float mean, float std)
{
    /* u1 in (0,1] so log() is finite. */
    double u1 = ((double)(rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    return (float)(mean + std * z);
}
