/* tensor.c - float32 tensors of up to 4 dimensions: overflow-checked shapes
 * and 64-byte aligned storage (the alignment OpenBLAS and AVX-512 like). */
#include <config.h>

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <keel/tensor.h>
#include "util.h"

keel_status
keel_shape_count(int ndim, const int64_t *shape, size_t *count)
{
    size_t n = 1;
    if (ndim < 0 || ndim > KEEL_MAX_DIMS)
        return keel__fail(KEEL_EINVAL, "shape has %d dimensions; keel "
                          "tensors have 0 to %d", ndim, KEEL_MAX_DIMS);
    if (ndim > 0 && shape == NULL)
        return keel__fail(KEEL_EINVAL, "shape is NULL");
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1)
            return keel__fail(KEEL_EINVAL, "dimension %d is %lld; every "
                              "dimension must be at least 1", i,
                              (long long)shape[i]);
        if ((uint64_t)shape[i] > KEEL_TENSOR_MAX_BYTES / sizeof(float) / n)
            return keel__fail(KEEL_EINVAL, "shape is too large (over %zu "
                              "bytes)", (size_t)KEEL_TENSOR_MAX_BYTES);
        n *= (size_t)shape[i];
    }
    *count = n;
    return KEEL_OK;
}

/* Aligned blocks carry the pointer malloc/calloc returned just before the
 * aligned address, so that zeroed blocks can come from calloc: for a large
 * block that is fresh memory from the kernel, zero already and faulted in
 * only where it is touched (a worker's optimizer slots never are). */
/* Large blocks are page-aligned (KEEL__ALIGN_FOR, util.h) for O_DIRECT;
 * the waste is under 4 KiB per such block. Blocks of KEEL__HUGE_BYTES or
 * more are their own anonymous mapping (zero and lazily faulted, like
 * calloc's), 2 MiB-aligned and marked MADV_HUGEPAGE before anything
 * touches them, so they fault in as transparent huge pages where the
 * kernel allows (`madvise` mode, the common default): physically
 * contiguous 2 MiB runs that an O_DIRECT read or write moves in a few
 * large block requests instead of many small ones (a tensor on 4 KiB
 * pages splits an O_DIRECT transfer at every physical discontinuity,
 * see docs/checkpoint.md), and fewer TLB misses for the kernels. Such a
 * block's stored pointer has its low bit set and the mapping's length
 * sits one word below it. Only the block's whole 2 MiB runs are marked,
 * so its memory use stays bytes rounded up to a 4 KiB page. */
#define KEEL__HUGE_BYTES ((size_t)2 << 20)
#define KEEL__HUGE_ALIGN ((size_t)2 << 20)

static void *
aligned_huge(size_t bytes)
{
    size_t len = bytes + KEEL__HUGE_ALIGN + KEEL__PAGE_ALIGN, body;
    char *raw, *p;
    raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
               -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    /* One page below p for the two words; p on a 2 MiB boundary. */
    p = (char *)(((uintptr_t)raw + KEEL__PAGE_ALIGN + KEEL__HUGE_ALIGN - 1) &
                 ~(uintptr_t)(KEEL__HUGE_ALIGN - 1));
    /* Only whole huge pages of the block: a tail of 4 KiB pages wastes
     * nothing past bytes. */
    body = bytes & ~(KEEL__HUGE_ALIGN - 1);
#ifdef MADV_HUGEPAGE
    (void)madvise(p, body, MADV_HUGEPAGE);   /* a hint: failure is fine */
#endif
    ((uintptr_t *)p)[-1] = (uintptr_t)raw | 1u;
    ((size_t *)p)[-2] = len;
    return p;
}

static void *
aligned_from(size_t bytes, int zero)
{
    void *raw, *p;
    uintptr_t align = KEEL__ALIGN_FOR(bytes);
    if (bytes == 0 || bytes > KEEL_TENSOR_MAX_BYTES)
        return NULL;
    if (bytes >= KEEL__HUGE_BYTES && (p = aligned_huge(bytes)) != NULL)
        return p;
    raw = zero ? calloc(1, bytes + align) : malloc(bytes + align);
    if (raw == NULL)
        return NULL;
    /* at least one pointer's room below p; malloc aligns to 16 */
    p = (void *)(((uintptr_t)raw + align) & ~(align - 1));
    ((void **)p)[-1] = raw;
    return p;
}

void *
keel_aligned_alloc(size_t bytes)
{
    return aligned_from(bytes, 0);
}

void *
keel__aligned_zalloc(size_t bytes)
{
    return aligned_from(bytes, 1);
}

void
keel_aligned_free(void *p)
{
    uintptr_t raw;
    if (p == NULL)
        return;
    raw = ((uintptr_t *)p)[-1];
    if (raw & 1u)
        munmap((void *)(raw & ~(uintptr_t)1), ((size_t *)p)[-2]);
    else
        free((void *)raw);
}

keel_status
keel_tensor_alloc(keel_tensor *t, int ndim, const int64_t *shape)
{
    size_t count;
    keel_status st;
    if (t == NULL)
        return keel__fail(KEEL_EINVAL, "tensor: t is NULL");
    memset(t, 0, sizeof *t);
    st = keel_shape_count(ndim, shape, &count);
    if (st != KEEL_OK)
        return st;
    t->data = keel__aligned_zalloc(count * sizeof(float));
    if (t->data == NULL)
        return keel__fail(KEEL_ENOMEM, "tensor: %zu bytes",
                          count * sizeof(float));
    t->ndim = ndim;
    for (int i = 0; i < KEEL_MAX_DIMS; i++)
        t->shape[i] = i < ndim ? shape[i] : 1;
    t->count = count;
    t->is_owner = 1;
    return KEEL_OK;
}

void
keel_tensor_release(keel_tensor *t)
{
    if (t == NULL)
        return;
    if (t->is_owner)
        keel_aligned_free(t->data);
    memset(t, 0, sizeof *t);
}

size_t
keel_tensor_bytes(const keel_tensor *t)
{
    return t != NULL ? t->count * sizeof(float) : 0;
}

int
keel_shape_equal(int ndim_a, const int64_t *a, int ndim_b, const int64_t *b)
{
    if (ndim_a != ndim_b)
        return 0;
    for (int i = 0; i < ndim_a; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

char *
keel_shape_format(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t used = 0;
    if (buf == NULL || size == 0)
        return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld",
                                 i > 0 ? "," : "", (long long)shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}
