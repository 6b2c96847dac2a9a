/* grow.h - the growable array libkeel's lists share: room for one more
 * element by doubling the capacity. */
#ifndef KEEL_GROW_H
#define KEEL_GROW_H

#include <stddef.h>

/* The array arr (*cap elements of elem bytes, n of them used) with room
 * for one more: arr itself while n < *cap, else reallocated to twice
 * *cap (first, which is > 0, when empty) and *cap updated. NULL when out
 * of memory or when the new size overflows size_t (arr and *cap are
 * unchanged; the caller names what it was growing). */
void *keel__grow(void *arr, size_t *cap, size_t n, size_t elem,
                 size_t first);

#endif
