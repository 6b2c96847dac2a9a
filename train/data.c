/* data.c - reading a dataset: one example (keel_dataset_get, in memory or
 * through a streamed set's blocks) and the batch iterator with
 * deterministic per-epoch shuffling (whole set or by blocks), per-worker
 * slices of the global batch and a small versioned state blob for exact
 * resumes. The readers that make datasets: data_idx.c, data_hdf5.c,
 * data_inputs.c, on the handle in dataset.c. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <keel/train.h>
#include "util.h"
#include "data_int.h"

KEEL__VECTORIZE_FILE

/* A streamed dataset's block buffer changes on reads: the handle is not
 * thread-safe (keel/train.h), and its const is the caller's view. */
static keel_status
copy_example(const keel_dataset *ds, size_t i, float *x)
{
    if (ds->streamed)
        return keel__data_stream_example((keel_dataset *)ds, i, x);
    if (ds->x8 != NULL) {
        keel__data_u8_to_float(ds->x8 + i * ds->esize, x, ds->esize);
    } else {
        memcpy(x, ds->xf + i * ds->esize, ds->esize * sizeof *x);
    }
    return KEEL_OK;
}

keel_status
keel_dataset_get(const keel_dataset *ds, size_t i, float *x, int32_t *y)
{
    if (ds == NULL || x == NULL)
        return keel__fail(KEEL_EINVAL, "dataset get: NULL argument");
    if (i >= ds->n)
        return keel__fail(KEEL_EINVAL, "dataset get: example %zu of %zu", i,
                          ds->n);
    if (y != NULL)
        *y = ds->y[i];
    return copy_example(ds, i, x);
}

/* ---- iterator ----------------------------------------------------------- */

struct keel_data_iter {
    const keel_dataset *ds;
    keel_data_iter_config cfg;
    int64_t epoch, offset;
    int64_t steps_per_epoch, epoch_end;   /* examples used per epoch */
    uint32_t *perm;
    int64_t perm_epoch;                   /* -1: none built */
    float *x;
    int32_t *y;
    size_t cap;                           /* examples in x / y */
};

void
keel_data_iter_config_init(keel_data_iter_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->global_batch_size = 64;
    cfg->num_workers = 1;
    cfg->shuffle = 1;
    cfg->drop_remainder = 1;
}

void
keel_data_iter_free(keel_data_iter *it)
{
    if (it == NULL)
        return;
    free(it->perm);
    keel_aligned_free(it->x);
    free(it->y);
    free(it);
}

keel_status
keel_data_iter_new(const keel_dataset *ds, const keel_data_iter_config *cfg,
                   keel_data_iter **out)
{
    keel_data_iter *it;
    int64_t b, n;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "data iterator: out is NULL");
    *out = NULL;
    if (ds == NULL || cfg == NULL)
        return keel__fail(KEEL_EINVAL, "data iterator: NULL argument");
    if (KEEL__STRUCT_CHECK(cfg, keel_data_iter_config) != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "data iterator");
    b = cfg->global_batch_size;
    n = (int64_t)ds->n;
    if (cfg->num_workers < 1 || cfg->worker_index < 0 ||
        cfg->worker_index >= cfg->num_workers)
        return keel__fail(KEEL_EINVAL, "data iterator: worker %d of %d",
                          cfg->worker_index, cfg->num_workers);
    if (b < cfg->num_workers || b > 1 << 24)
        return keel__fail(KEEL_EINVAL, "data iterator: global batch size "
                          "%lld must be in [num_workers (%d), 16777216]",
                          (long long)b, cfg->num_workers);
    if (cfg->max_epochs < 0)
        return keel__fail(KEEL_EINVAL, "data iterator: max_epochs %lld < 0",
                          (long long)cfg->max_epochs);
    if (cfg->drop_remainder && n < b)
        return keel__fail(KEEL_EINVAL, "data iterator: dataset of %lld "
                          "examples is smaller than one global batch (%lld) "
                          "and drop_remainder is set", (long long)n,
                          (long long)b);
    it = calloc(1, sizeof *it);
    if (it == NULL)
        return keel__fail(KEEL_ENOMEM, "data iterator");
    it->ds = ds;
    it->cfg = *cfg;
    it->perm_epoch = -1;
    it->steps_per_epoch = cfg->drop_remainder ? n / b : (n + b - 1) / b;
    it->epoch_end = cfg->drop_remainder ? it->steps_per_epoch * b : n;
    it->cap = (size_t)(b / cfg->num_workers + 1);
    /* n rows, then (block shuffle) one entry per block */
    it->perm = malloc(((size_t)n + (ds->block_rows > 0
                                    ? (size_t)n / ds->block_rows + 1 : 0)) *
                      sizeof *it->perm);
    it->x = keel_aligned_alloc(it->cap * ds->esize * sizeof(float));
    it->y = malloc(it->cap * sizeof *it->y);
    if (it->perm == NULL || it->x == NULL || it->y == NULL) {
        keel_data_iter_free(it);
        return keel__fail(KEEL_ENOMEM, "data iterator buffers");
    }
    *out = it;
    return KEEL_OK;
}

/* perm[0..n) shuffled in place by Fisher-Yates from seed. */
static void
shuffle(uint32_t *perm, size_t n, uint64_t seed)
{
    keel__rng r;
    keel__rng_seed(&r, seed);
    for (size_t i = n - 1; n > 1 && i > 0; i--) {
        size_t j = (size_t)keel__rng_below(&r, (uint64_t)i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* The epoch's order of the examples, a function of (seed, epoch) and the
 * dataset's shuffle block R alone. R = 0 (the whole set): one
 * Fisher-Yates shuffle of all rows. Otherwise the blocks of R consecutive
 * rows (the last one shorter) in a shuffled order, each block's rows
 * shuffled within it: block b's shuffle has the seed of the whole-set
 * shuffle mixed with b (b = 0 unmixed), so R >= n gives the whole-set
 * order. A streamed set and the same set in memory get the same order. */
static void
build_perm(keel_data_iter *it)
{
    size_t n = it->ds->n, r = it->ds->block_rows;
    uint64_t mix = it->cfg.seed;
    for (size_t i = 0; i < n; i++)
        it->perm[i] = (uint32_t)i;
    if (it->cfg.shuffle) {
        /* each epoch's order depends only on (seed, epoch) */
        mix ^= keel__splitmix64(&(uint64_t){ (uint64_t)it->epoch });
        if (r == 0 || r >= n) {
            shuffle(it->perm, n, mix);
        } else {
            size_t nb = (n + r - 1) / r, pos = 0;
            uint32_t *order = it->perm + n;      /* nb spare entries */
            for (size_t b = 0; b < nb; b++)
                order[b] = (uint32_t)b;
            shuffle(order, nb, mix ^ keel__splitmix64(&(uint64_t){
                                         UINT64_C(0x6b65656c626c6f63) }));
            for (size_t k = 0; k < nb; k++) {
                size_t b = order[k], r0 = b * r;
                size_t len = n - r0 < r ? n - r0 : r;
                uint32_t *p = it->perm + pos;
                for (size_t i = 0; i < len; i++)
                    p[i] = (uint32_t)(r0 + i);
                shuffle(p, len, b == 0 ? mix
                                : mix ^ keel__splitmix64(&(uint64_t){ b }));
                pos += len;
            }
        }
    }
    it->perm_epoch = it->epoch;
}

keel_status
keel_data_iter_next(keel_data_iter *it, keel_batch *out)
{
    int64_t b, lo, hi;
    int nw, wi;
    if (it == NULL || out == NULL)
        return keel__fail(KEEL_EINVAL, "data iterator next: NULL argument");
    if (it->offset >= it->epoch_end) {
        it->epoch++;
        it->offset = 0;
    }
    if (it->cfg.max_epochs > 0 && it->epoch >= it->cfg.max_epochs)
        return keel__fail(KEEL_EOUTOFRANGE, "data iterator: end of data "
                          "after %lld epochs", (long long)it->cfg.max_epochs);
    if (it->perm_epoch != it->epoch)
        build_perm(it);
    b = it->epoch_end - it->offset;
    if (b > it->cfg.global_batch_size)
        b = it->cfg.global_batch_size;
    nw = it->cfg.num_workers;
    wi = it->cfg.worker_index;
    lo = it->offset + b * wi / nw;
    hi = it->offset + b * (wi + 1) / nw;
    for (int64_t i = lo; i < hi; i++) {
        size_t ex = it->perm[i];
        keel_status st = copy_example(it->ds, ex, it->x + (size_t)(i - lo) *
                                                          it->ds->esize);
        if (st != KEEL_OK)
            return st;           /* the position stays: nothing consumed */
        it->y[i - lo] = it->ds->y[ex];
    }
    it->offset += b;
    out->x = it->x;
    out->y = it->y;
    out->n = (size_t)(hi - lo);
    return KEEL_OK;
}

int64_t
keel_data_iter_epoch(const keel_data_iter *it)
{
    if (it == NULL)
        return 0;
    return it->offset >= it->epoch_end ? it->epoch + 1 : it->epoch;
}

int64_t
keel_data_iter_offset(const keel_data_iter *it)
{
    if (it == NULL)
        return 0;
    return it->offset >= it->epoch_end ? 0 : it->offset;
}

int64_t
keel_data_iter_steps_per_epoch(const keel_data_iter *it)
{
    return it != NULL ? it->steps_per_epoch : 0;
}

#define STATE_MAGIC 0x5449444bu   /* "KDIT" little-endian */
#define STATE_VERSION 1u          /* whole-set shuffle */
#define STATE_VERSION_BLOCKS 2u   /* block shuffle: the count's high 32
                                   * bits hold the block's rows */

keel_status
keel_data_iter_state(const keel_data_iter *it, void *buf, size_t size,
                         size_t *len)
{
    uint8_t *p = buf;
    if (it == NULL || buf == NULL)
        return keel__fail(KEEL_EINVAL, "data iterator state: NULL argument");
    if (size < KEEL_DATA_ITER_STATE_BYTES)
        return keel__fail(KEEL_EINVAL, "data iterator state: buffer of %zu "
                          "bytes, need %d", size, KEEL_DATA_ITER_STATE_BYTES);
    keel__le_put(p, (uint64_t)STATE_MAGIC |
                 (uint64_t)(it->ds->block_rows > 0 ? STATE_VERSION_BLOCKS
                                                   : STATE_VERSION) << 32, 8);
    keel__le_put(p + 8, (uint64_t)keel_data_iter_epoch(it), 8);
    keel__le_put(p + 16, (uint64_t)keel_data_iter_offset(it), 8);
    keel__le_put(p + 24, it->cfg.seed, 8);
    keel__le_put(p + 32, (uint64_t)it->ds->n |
                         (uint64_t)it->ds->block_rows << 32, 8);
    if (len != NULL)
        *len = KEEL_DATA_ITER_STATE_BYTES;
    return KEEL_OK;
}

keel_status
keel_data_iter_set_state(keel_data_iter *it, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint64_t head, epoch, offset, count, block;
    if (it == NULL || buf == NULL)
        return keel__fail(KEEL_EINVAL, "data iterator state: NULL argument");
    if (len != KEEL_DATA_ITER_STATE_BYTES)
        return keel__fail(KEEL_ECORRUPT, "data iterator state: %zu bytes, "
                          "expected %d", len, KEEL_DATA_ITER_STATE_BYTES);
    head = keel__le_get(p, 8);
    if ((uint32_t)head != STATE_MAGIC)
        return keel__fail(KEEL_ECORRUPT, "data iterator state: bad magic");
    if ((head >> 32) != STATE_VERSION && (head >> 32) != STATE_VERSION_BLOCKS)
        return keel__fail(KEEL_ECORRUPT, "data iterator state: version %u "
                          "(this keel reads %u and %u)",
                          (unsigned)(head >> 32), STATE_VERSION,
                          STATE_VERSION_BLOCKS);
    epoch = keel__le_get(p + 8, 8);
    offset = keel__le_get(p + 16, 8);
    count = keel__le_get(p + 32, 8);
    block = (head >> 32) == STATE_VERSION_BLOCKS ? count >> 32 : 0;
    count &= 0xffffffffu;
    if ((head >> 32) == STATE_VERSION_BLOCKS && block == 0)
        return keel__fail(KEEL_ECORRUPT, "data iterator state: block "
                          "shuffle of 0 rows");
    if (block != it->ds->block_rows)
        return keel__fail(KEEL_EINVAL, "data iterator state: saved with the "
                          "examples shuffled in blocks of %llu rows (0: the "
                          "whole set), this dataset shuffles in blocks of "
                          "%zu; the order would differ",
                          (unsigned long long)block, it->ds->block_rows);
    if (count != it->ds->n)
        return keel__fail(KEEL_EINVAL, "data iterator state: saved for a "
                          "dataset of %llu examples, this one has %zu",
                          (unsigned long long)count, it->ds->n);
    if (epoch > INT64_MAX / 2 || offset > (uint64_t)it->epoch_end)
        return keel__fail(KEEL_ECORRUPT, "data iterator state: epoch %llu "
                          "offset %llu out of range",
                          (unsigned long long)epoch,
                          (unsigned long long)offset);
    it->epoch = (int64_t)epoch;
    it->offset = (int64_t)offset;
    it->cfg.seed = keel__le_get(p + 24, 8);
    it->perm_epoch = -1;
    return KEEL_OK;
}
