/* reduce_tree.c - the canonical binary tree over n leaves and sums of
 * float vectors along it (numeric_int.h, "reduce_tree.c"). Every reduction
 * keel wants independent of how leaves are spread over threads, replicas
 * or processes adds along this one tree: the sum of a node's leaves is the
 * sum of its left child's plus its right child's, each rounded alone, so a
 * part holding a node's sum gives the same bits wherever it was made. */
#include <config.h>

#include <string.h>

#include "util.h"
#include "numeric_int.h"

KEEL__VECTORIZE_FILE

int64_t
keel__tree_split(int64_t lo, int64_t hi)
{
    return lo + (hi - lo) / 2;
}

/* Append the nodes of the subtree [nlo, nhi) that cover [lo, hi). */
static int
cover(int64_t nlo, int64_t nhi, int64_t lo, int64_t hi,
      keel__tree_node *out, int k, int max)
{
    int64_t mid;
    if (hi <= nlo || lo >= nhi || k < 0)
        return k;
    if (lo <= nlo && nhi <= hi) {
        if (k >= max)
            return -1;
        out[k].lo = nlo;
        out[k].hi = nhi;
        return k + 1;
    }
    mid = keel__tree_split(nlo, nhi);
    k = cover(nlo, mid, lo, hi, out, k, max);
    return cover(mid, nhi, lo, hi, out, k, max);
}

int
keel__tree_cover(int64_t n, int64_t lo, int64_t hi, keel__tree_node *out,
                 int max)
{
    if (n < 1 || lo < 0 || hi > n || lo >= hi || out == NULL || max < 1)
        return -1;
    return cover(0, n, lo, hi, out, 0, max);
}

/* Floats per block: the blocks of the levels in use stay in L1; the
 * scratch is KEEL__TREE_MAX_DEPTH blocks on the caller's stack (64 KiB). */
#define BLOCK 256

/* out[i] = a[i] + b[i]: one rounding per element, the same bits on every
 * clone. out may be a or b (the same element is read before written). */
static KEEL__HOT void
add3(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

typedef struct tree_sum {
    const keel__tree_node *nodes;
    const float *const *parts;
    int k;
    int next;                     /* the next part, in left-to-right order */
    size_t off, len;              /* this block */
    float (*tmp)[BLOCK];          /* one block per level */
    int bad;
} tree_sum;

/* The sum of node [lo, hi) over this block: a part's own block when the
 * node is a part (read in place, never copied), else out, filled. A node
 * at level l writes only out and tmp[l..]: out is its parent's out or
 * tmp[l - 1], so a left child's result survives its sibling's work. */
static const float *
node_sum(tree_sum *t, int64_t lo, int64_t hi, int level, float *out)
{
    const float *a, *b;
    int64_t mid;
    if (t->bad)
        return out;
    if (t->next < t->k && t->nodes[t->next].lo == lo &&
        t->nodes[t->next].hi == hi)
        return t->parts[t->next++] + t->off;
    if (hi - lo < 2 || level >= KEEL__TREE_MAX_DEPTH) {
        t->bad = 1;               /* not covered by the parts */
        return out;
    }
    mid = keel__tree_split(lo, hi);
    a = node_sum(t, lo, mid, level + 1, out);
    b = node_sum(t, mid, hi, level + 1, t->tmp[level]);
    if (!t->bad)
        add3(out, a, b, t->len);
    return out;
}

keel_status
keel__tree_sum(int64_t n, const keel__tree_node *nodes,
               const float *const *parts, int k, float *dst, size_t lo,
               size_t hi)
{
    float tmp[KEEL__TREE_MAX_DEPTH][BLOCK];
    float out[BLOCK];
    tree_sum t;
    if (n < 1 || nodes == NULL || parts == NULL || k < 1 || dst == NULL ||
        lo > hi)
        return keel__fail(KEEL_EINVAL, "tree sum: bad arguments");
    if (k == 1) {
        if (nodes[0].lo != 0 || nodes[0].hi != n)
            return keel__fail(KEEL_EINVAL, "tree sum: one part [%lld, %lld) "
                              "does not cover the %lld leaves",
                              (long long)nodes[0].lo, (long long)nodes[0].hi,
                              (long long)n);
        if (dst != parts[0])
            memmove(dst + lo, parts[0] + lo, (hi - lo) * sizeof *dst);
        return KEEL_OK;
    }
    if (k == 2) {
        /* the root's two children, one pass: dst = left + right */
        int64_t mid = keel__tree_split(0, n);
        if (nodes[0].lo != 0 || nodes[0].hi != mid || nodes[1].lo != mid ||
            nodes[1].hi != n)
            return keel__fail(KEEL_EINVAL, "tree sum: the 2 parts are not "
                              "the two halves of the %lld leaves' tree",
                              (long long)n);
        add3(dst + lo, parts[0] + lo, parts[1] + lo, hi - lo);
        return KEEL_OK;
    }
    t.nodes = nodes;
    t.parts = parts;
    t.k = k;
    t.tmp = tmp;
    t.bad = 0;
    for (size_t b = lo; b < hi; b += BLOCK) {
        const float *l, *r;
        int64_t mid = keel__tree_split(0, n);
        t.off = b;
        t.len = hi - b < BLOCK ? hi - b : BLOCK;
        t.next = 0;
        /* the root's children, then the root straight into dst: every
         * part's block is read before (or as) dst's is written, so dst
         * may be one of the parts */
        l = node_sum(&t, 0, mid, 1, out);
        r = node_sum(&t, mid, n, 1, tmp[0]);
        if (t.bad || t.next != k)
            return keel__fail(KEEL_EINVAL, "tree sum: the %d parts are not "
                              "nodes covering the %lld leaves left to right",
                              k, (long long)n);
        add3(dst + b, l, r, t.len);
    }
    return KEEL_OK;
}
