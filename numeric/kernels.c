/* kernels.c - the numeric layer's vectorized elementwise kernels (the sums the
 * parameter server, the collective and the model add gradients with) and
 * the profiling counters of the numeric layer's work. Every kernel is a fixed
 * sequence of operations: same inputs, same bits. */
#include <config.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"
#include "numeric_int.h"

KEEL__VECTORIZE_FILE

int keel__prof_on;
keel__core_prof keel__prof_core;

int64_t
keel__prof_now(void)
{
    return keel__now_mono_ns();
}

static KEEL__HOT void
add_row(float *restrict acc, const float *restrict row, size_t cols)
{
    for (size_t c = 0; c < cols; c++)
        acc[c] += row[c];
}

void
keel__add_into(float *dst, const float *src, size_t count)
{
    KEEL__PROF_BEGIN();
    add_row(dst, src, count);
    KEEL__CORE_PROF_END(elementwise_ns);
}

static KEEL__HOT void
zero_plus(float *restrict dst, const float *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++)
        dst[i] = 0.0f + src[i];
}

void
keel__zero_add_into(float *dst, const float *src, size_t count)
{
    KEEL__PROF_BEGIN();
    zero_plus(dst, src, count);
    KEEL__CORE_PROF_END(elementwise_ns);
}

/* d = w * s (first) or d += w * s, in double. */
static KEEL__HOT void
wsum_first(double *restrict d, const float *restrict s, double w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = w * (double)s[i];
}

static KEEL__HOT void
wsum_add(double *restrict d, const float *restrict s, double w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] += w * (double)s[i];
}

/* dst = d / total, or d * scale where scale = 1 / total is exact (total a
 * power of two: the same correctly rounded quotient), rounded to float. */
static KEEL__HOT void
wsum_div(float *restrict dst, const double *restrict d, double total,
         size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (float)(d[i] / total);
}

static KEEL__HOT void
wsum_scale(float *restrict dst, const double *restrict d, double scale,
           size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (float)(d[i] * scale);
}

/* Elements per block: the block's double sums stay in L1 while every
 * source passes over them. */
#define WMEAN_BLOCK 1024

void
keel__weighted_mean_into(float *dst, const float *const *src,
                         const double *w, int k, double total, size_t count)
{
    double d[WMEAN_BLOCK];
    int exp;
    int pow2 = frexp(total, &exp) == 0.5 && exp > -1021 && exp < 1023;
    double scale = pow2 ? ldexp(1.0, 1 - exp) : 0.0;
    KEEL__PROF_BEGIN();
    for (size_t lo = 0; lo < count && k > 0; lo += WMEAN_BLOCK) {
        size_t n = count - lo < WMEAN_BLOCK ? count - lo : WMEAN_BLOCK;
        wsum_first(d, src[0] + lo, w[0], n);
        for (int r = 1; r < k; r++)
            wsum_add(d, src[r] + lo, w[r], n);
        if (pow2)
            wsum_scale(dst + lo, d, scale, n);
        else
            wsum_div(dst + lo, d, total, n);
    }
    KEEL__CORE_PROF_END(elementwise_ns);
}
