/* grow.c - the growable array libkeel's lists share. */
#include <config.h>

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include "grow.h"

void *
keel__grow(void *arr, size_t *cap, size_t n, size_t elem, size_t first)
{
    size_t nc;
    void *p;
    assert(first > 0);
    if (n < *cap)
        return arr;
    if (*cap > SIZE_MAX / 2)
        return NULL;
    nc = *cap ? *cap * 2 : first;
    if (elem != 0 && nc > SIZE_MAX / elem)
        return NULL;
    p = realloc(arr, nc * elem);
    if (p != NULL)
        *cap = nc;
    return p;
}
