/* kernels.c - the numeric layer's vectorized elementwise kernels (the sums the
 * parameter server, the collective and the model add gradients with) and
 * the profiling counters of the numeric layer's work. Every kernel is a fixed
 * sequence of operations: same inputs, same bits. */
#include <config.h>

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
