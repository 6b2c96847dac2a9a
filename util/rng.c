/* rng.c - the small deterministic PRNG: splitmix64 seeding xoshiro256**
 * (never libc), the same stream on every machine for a seed. */
#include <config.h>

#include <stdint.h>

#include "util.h"

uint64_t
keel__splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void
keel__rng_seed(keel__rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = keel__splitmix64(&x);
}

static uint64_t
rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t
keel__rng_next(keel__rng *r)
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

uint64_t
keel__rng_below(keel__rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do
        v = keel__rng_next(r);
    while (v >= limit);
    return v % n;
}

float
keel__rng_uniform(keel__rng *r, float lo, float hi)
{
    /* 24 random bits: exactly representable, in [0, 1). */
    float u = (float)(keel__rng_next(r) >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
}
