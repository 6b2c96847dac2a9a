/* data_hdf5.c - HDF5 data files: 'x' ([N,D] features, [N,H,W] or
 * [N,H,W,C] images) and 'y' (labels), every header, type and value
 * checked; read whole, or streamed in blocks through a small buffer that
 * reads each block once per epoch. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hdf5.h>

#include <keel/train.h>
#include "util.h"
#include "h5util.h"
#include "data_int.h"

KEEL__VECTORIZE_FILE

#define H5_MAX_FEATURES ((hsize_t)1 << 24)
#define H5_LABEL_CHUNK ((size_t)65536)

/* An HDF5 data file being read: its 'x' and, where there is one, 'y'
 * with their dataspaces and types (H5I_INVALID_HID where not open). */
typedef struct h5_src {
    const char *path;
    hid_t f, dx, dy, sx, sy, tx, ty;
    int rank;                     /* of 'x': 2 (tabular) or 3, 4 */
    hsize_t xd[8];                /* 'x' as [N, H, W, C] ([N, D, 1, 1]) */
    int is_u8;                    /* 'x' is uint8 pixels, else floats */
} h5_src;

static void
h5_src_close(h5_src *s)
{
    keel__h5_close(s->tx);
    keel__h5_close(s->ty);
    keel__h5_close(s->sx);
    keel__h5_close(s->sy);
    keel__h5_close(s->dx);
    keel__h5_close(s->dy);
    keel__h5_close(s->f);
}

/* The file, its datasets and their headers; 'y' is optional unless
 * need_y. */
static keel_status
h5_src_open(h5_src *s, int need_y)
{
    s->f = H5Fopen(s->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (s->f < 0)
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: not a readable "
                          "HDF5 file", s->path);
    s->dx = H5Dopen2(s->f, "x", H5P_DEFAULT);
    s->dy = need_y || H5Lexists(s->f, "y", H5P_DEFAULT) > 0
        ? H5Dopen2(s->f, "y", H5P_DEFAULT) : H5I_INVALID_HID;
    if (s->dx < 0 || (need_y && s->dy < 0))
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: needs datasets "
                          "'x' and 'y' (%s missing)", s->path,
                          s->dx < 0 ? "'x'" : "'y'");
    s->sx = H5Dget_space(s->dx);
    s->tx = H5Dget_type(s->dx);
    if (s->dy >= 0) {
        s->sy = H5Dget_space(s->dy);
        s->ty = H5Dget_type(s->dy);
    }
    if (s->sx < 0 || s->tx < 0 || (s->dy >= 0 && (s->sy < 0 || s->ty < 0)))
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: cannot read "
                          "dataset headers", s->path);
    return KEEL_OK;
}

/* 'x' is [N,D], [N,H,W] or [N,H,W,C] within bounds, 'y' (if any) [N]. */
static keel_status
h5_check_shape(h5_src *s)
{
    hsize_t yd[8], *xd = s->xd;
    int xr = H5Sget_simple_extent_ndims(s->sx);
    int yr = s->dy >= 0 ? H5Sget_simple_extent_ndims(s->sy) : 1;
    if (xr < 2 || xr > 4 || yr != 1)
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset 'x' "
                          "must be [N,D], [N,H,W] or [N,H,W,C] and 'y' [N] "
                          "(ranks are %d and %d)", s->path, xr, yr);
    s->rank = xr;
    H5Sget_simple_extent_dims(s->sx, xd, NULL);
    if (s->dy >= 0)
        H5Sget_simple_extent_dims(s->sy, yd, NULL);
    else
        yd[0] = xd[0];
    if (xr == 2) {
        if (xd[0] < 1 || xd[0] > INT32_MAX || xd[1] < 1 ||
            xd[1] > H5_MAX_FEATURES)
            return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset "
                              "'x' [%llu, %llu] has bad dimensions (rows "
                              "1..%d, features 1..%llu)", s->path,
                              (unsigned long long)xd[0],
                              (unsigned long long)xd[1], INT32_MAX,
                              (unsigned long long)H5_MAX_FEATURES);
        xd[2] = xd[3] = 1;
    } else {
        if (xr == 3)
            xd[3] = 1;
        if (xd[0] < 1 || xd[0] > INT32_MAX || xd[1] < 1 ||
            xd[1] > MAX_SIDE || xd[2] < 1 || xd[2] > MAX_SIDE || xd[3] < 1 ||
            xd[3] > 4096)
            return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset "
                              "'x' has bad dimensions", s->path);
    }
    if (yd[0] != xd[0])
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset 'x' "
                          "has %llu rows but dataset 'y' has %llu labels",
                          s->path, (unsigned long long)xd[0],
                          (unsigned long long)yd[0]);
    return KEEL_OK;
}

static const char *
h5_class_name(hid_t t)
{
    switch (H5Tget_class(t)) {
    case H5T_INTEGER: return "integers";
    case H5T_FLOAT:   return "floating-point numbers";
    case H5T_STRING:  return "strings";
    case H5T_COMPOUND: return "compound records";
    default:          return "a non-numeric type";
    }
}

/* 'x' is float32/float64 (any rank) or uint8 (images only; sets is_u8),
 * 'y' an integer type. */
static keel_status
h5_check_types(h5_src *s)
{
    if (H5Tget_class(s->tx) == H5T_FLOAT &&
        (H5Tget_size(s->tx) == 4 || H5Tget_size(s->tx) == 8)) {
        s->is_u8 = 0;
    } else if (s->rank > 2 && H5Tget_class(s->tx) == H5T_INTEGER &&
               H5Tget_size(s->tx) == 1 &&
               H5Tget_sign(s->tx) == H5T_SGN_NONE) {
        s->is_u8 = 1;
    } else if (s->rank == 2) {
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset 'x' "
                          "holds %s (%zu bytes each); tabular features "
                          "[N,D] must be float32 or float64", s->path,
                          h5_class_name(s->tx), H5Tget_size(s->tx));
    } else {
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset 'x' "
                          "holds %s (%zu bytes each); images must be "
                          "float32, float64 or uint8", s->path,
                          h5_class_name(s->tx), H5Tget_size(s->tx));
    }
    if (s->dy >= 0 && H5Tget_class(s->ty) != H5T_INTEGER)
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset 'y' "
                          "holds %s; labels must be an integer type "
                          "(class indices 0..classes-1)", s->path,
                          h5_class_name(s->ty));
    return KEEL_OK;
}

/* ds's shape from 'x' and its label array; with in_memory its pixel (or
 * float) array too. */
static keel_status
h5_alloc(const h5_src *s, keel_dataset *ds, int in_memory)
{
    size_t n = (size_t)s->xd[0], count;
    ds->n = n;
    ds->rank = s->rank;
    ds->h = (int64_t)s->xd[1];
    ds->w = (int64_t)s->xd[2];
    ds->c = (int64_t)s->xd[3];
    ds->esize = (size_t)(s->xd[1] * s->xd[2] * s->xd[3]);
    if (ds->esize > KEEL_TENSOR_MAX_BYTES / 4 / (in_memory ? n : 1))
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset 'x' "
                          "too large to read into memory (set data.stream)",
                          s->path);
    count = n * ds->esize;
    ds->y = malloc(n * sizeof *ds->y);
    if (in_memory && s->is_u8)
        ds->x8 = malloc(count);
    else if (in_memory)
        ds->xf = malloc(count * sizeof(float));
    if (ds->y == NULL || (in_memory && ds->x8 == NULL && ds->xf == NULL))
        return keel__fail(KEEL_ENOMEM, "HDF5 data file %s: %zu values of "
                          "dataset 'x' (%zu bytes); set data.stream = on "
                          "to read it in blocks", s->path, count,
                          count * (s->is_u8 ? 1 : sizeof(float)));
    return KEEL_OK;
}

/* Rows [r0, r0 + rows) of 'x' into buf (uint8 or native floats). */
static keel_status
h5_read_rows(const char *path, hid_t dx, int rank, const hsize_t *xd,
             int is_u8, size_t r0, size_t rows, void *buf)
{
    hsize_t start[4] = { r0, 0, 0, 0 }, count[4];
    hid_t fs = H5I_INVALID_HID, ms = H5I_INVALID_HID;
    herr_t rc = -1;
    count[0] = rows;
    for (int d = 1; d < rank; d++)
        count[d] = xd[d];
    fs = H5Dget_space(dx);
    ms = H5Screate_simple(rank, count, NULL);
    if (fs >= 0 && ms >= 0 &&
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count,
                            NULL) >= 0)
        rc = H5Dread(dx, is_u8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT, ms, fs,
                     H5P_DEFAULT, buf);
    keel__h5_close(ms);
    keel__h5_close(fs);
    if (rc < 0)
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: reading rows "
                          "%zu..%zu of dataset 'x' failed (corrupt data)",
                          path, r0, r0 + rows - 1);
    return KEEL_OK;
}

/* Every value of rows [r0, r0 + rows) (floats at xf) is finite. */
static keel_status
check_finite_rows(const char *path, const float *xf, size_t r0, size_t rows,
                  size_t esize)
{
    for (size_t i = 0; i < rows * esize; i++)
        if (!isfinite(xf[i]))
            return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset "
                              "'x' row %zu, value %zu is %s (features must "
                              "be finite)", path, r0 + i / esize, i % esize,
                              isnan(xf[i]) ? "NaN" : "infinite");
    return KEEL_OK;
}

/* ds->y from the file's labels in blocks, each in [0, num_classes), and
 * ds->max_label; -1 each for inputs without labels. */
static keel_status
h5_read_labels(const h5_src *s, keel_dataset *ds, int64_t num_classes)
{
    int64_t *buf;
    keel_status st = KEEL_OK;
    ds->max_label = -1;
    if (s->dy < 0) {
        for (size_t i = 0; i < ds->n; i++)
            ds->y[i] = -1;
        return KEEL_OK;
    }
    buf = malloc(H5_LABEL_CHUNK * sizeof *buf);
    if (buf == NULL)
        return keel__fail(KEEL_ENOMEM, "HDF5 data file %s: labels", s->path);
    for (size_t r0 = 0; r0 < ds->n && st == KEEL_OK; r0 += H5_LABEL_CHUNK) {
        size_t rows = ds->n - r0 < H5_LABEL_CHUNK ? ds->n - r0
                                                  : H5_LABEL_CHUNK;
        hsize_t start = r0, count = rows;
        hid_t fs = H5Dget_space(s->dy), ms = H5Screate_simple(1, &count,
                                                               NULL);
        herr_t rc = -1;
        if (fs >= 0 && ms >= 0 &&
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count,
                                NULL) >= 0)
            rc = H5Dread(s->dy, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, buf);
        keel__h5_close(ms);
        keel__h5_close(fs);
        if (rc < 0) {
            st = keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: reading "
                            "dataset 'y' failed (corrupt data)", s->path);
            break;
        }
        for (size_t i = 0; i < rows; i++) {
            if (buf[i] < 0 || buf[i] >= num_classes) {
                st = keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: dataset "
                                "'y' row %zu: label %lld outside [0, %lld)",
                                s->path, r0 + i, (long long)buf[i],
                                (long long)num_classes);
                break;
            }
            ds->y[r0 + i] = (int32_t)buf[i];
            if (buf[i] > ds->max_label)
                ds->max_label = buf[i];
        }
    }
    free(buf);
    return st;
}

/* ds from the HDF5 file at path: open and check its headers, read the
 * labels, then 'x' whole (checking its values) or, streamed, keep the
 * file open for block reads. */
static keel_status
h5_read_dataset(const char *path, const keel_dataset_h5_config *cfg,
                keel_dataset *ds, int need_y)
{
    h5_src s = { .path = path, .f = H5I_INVALID_HID,
                 .dx = H5I_INVALID_HID, .dy = H5I_INVALID_HID,
                 .sx = H5I_INVALID_HID, .sy = H5I_INVALID_HID,
                 .tx = H5I_INVALID_HID, .ty = H5I_INVALID_HID };
    keel_status st = h5_src_open(&s, need_y);
    if (st == KEEL_OK)
        st = h5_check_shape(&s);
    if (st == KEEL_OK)
        st = h5_check_types(&s);
    if (st == KEEL_OK)
        st = h5_alloc(&s, ds, !cfg->stream);
    if (st == KEEL_OK)
        st = h5_read_labels(&s, ds, cfg->num_classes);
    if (st == KEEL_OK && !cfg->stream) {
        st = h5_read_rows(path, s.dx, s.rank, s.xd, s.is_u8, 0, ds->n,
                          s.is_u8 ? (void *)ds->x8 : (void *)ds->xf);
        if (st == KEEL_OK && ds->xf != NULL)
            st = check_finite_rows(path, ds->xf, 0, ds->n, ds->esize);
    }
    if (st == KEEL_OK && cfg->stream) {
        ds->st.path = strdup(path);
        ds->st.rows = (size_t)cfg->block_rows;
        ds->st.is_u8 = s.is_u8;
        memcpy(ds->st.xd, s.xd, sizeof s.xd);
        for (int k = 0; k < STREAM_SLOTS; k++) {
            ds->st.block[k] = SIZE_MAX;
            ds->st.buf[k] = malloc(ds->st.rows * ds->esize * sizeof(float));
            if (ds->st.buf[k] == NULL)
                st = keel__fail(KEEL_ENOMEM, "HDF5 data file %s: block "
                                "buffer of %zu rows", path, ds->st.rows);
        }
        if (s.is_u8 && st == KEEL_OK &&
            (ds->st.u8 = malloc(ds->st.rows * ds->esize)) == NULL)
            st = keel__fail(KEEL_ENOMEM, "HDF5 data file %s: block buffer",
                            path);
        if (ds->st.path == NULL && st == KEEL_OK)
            st = keel__fail(KEEL_ENOMEM, "HDF5 data file %s", path);
        if (st == KEEL_OK) {        /* the dataset keeps file and 'x' */
            ds->st.f = s.f;
            ds->st.dx = s.dx;
            s.f = s.dx = H5I_INVALID_HID;
            ds->streamed = 1;
        }
    }
    if (cfg->block_rows > 0 && (uint64_t)cfg->block_rows < ds->n)
        ds->block_rows = (size_t)cfg->block_rows;
    h5_src_close(&s);
    return st;
}

/* h5_read_dataset into a new dataset, under keel's HDF5 lock. */
keel_status
keel__data_h5_open(const char *path, const keel_dataset_h5_config *cfg,
                   int need_y, keel_dataset **out)
{
    keel_dataset *ds = calloc(1, sizeof *ds);
    keel_status st;
    if (ds == NULL)
        return keel__fail(KEEL_ENOMEM, "dataset %s", path);
    ds->st.f = ds->st.dx = H5I_INVALID_HID;
    keel__h5_lock();
    H5E_BEGIN_TRY {
        st = h5_read_dataset(path, cfg, ds, need_y);
    } H5E_END_TRY;
    keel__h5_unlock();
    if (st != KEEL_OK) {
        keel_dataset_free(ds);
        return st;
    }
    *out = ds;
    return KEEL_OK;
}

/* Block b of a streamed dataset in one of its slots (read on a miss,
 * into the least recently used slot): the slot's floats. */
static keel_status
stream_block(keel_dataset *ds, size_t b, const float **out)
{
    stream_state *t = &ds->st;
    size_t r0 = b * t->rows, rows = ds->n - r0 < t->rows ? ds->n - r0
                                                         : t->rows;
    keel_status st;
    int k;
    for (k = 0; k < STREAM_SLOTS; k++)
        if (t->block[k] == b) {
            t->used[k] = ++t->clock;
            *out = t->buf[k];
            return KEEL_OK;
        }
    k = t->used[0] <= t->used[1] ? 0 : 1;
    t->block[k] = SIZE_MAX;
    keel__h5_lock();
    H5E_BEGIN_TRY {
        st = h5_read_rows(t->path, t->dx, ds->rank, t->xd, t->is_u8, r0,
                          rows, t->is_u8 ? (void *)t->u8 : (void *)t->buf[k]);
    } H5E_END_TRY;
    keel__h5_unlock();
    if (st != KEEL_OK)
        return st;
    if (t->is_u8)
        keel__data_u8_to_float(t->u8, t->buf[k], rows * ds->esize);
    else if ((st = check_finite_rows(t->path, t->buf[k], r0, rows,
                                     ds->esize)) != KEEL_OK)
        return st;
    t->block[k] = b;
    t->used[k] = ++t->clock;
    t->reads++;
    *out = t->buf[k];
    return KEEL_OK;
}

keel_status
keel__data_stream_example(keel_dataset *ds, size_t i, float *x)
{
    const float *blk;
    keel_status st = stream_block(ds, i / ds->st.rows, &blk);
    if (st == KEEL_OK)
        memcpy(x, blk + (i % ds->st.rows) * ds->esize,
               ds->esize * sizeof *x);
    return st;
}

void
keel_dataset_h5_config_init(keel_dataset_h5_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->num_classes = KEEL_DATASET_MAX_CLASSES;
    cfg->stream = 0;
    cfg->block_rows = 0;
}

keel_status
keel_dataset_open_h5_config(const char *path,
                            const keel_dataset_h5_config *cfg,
                            keel_dataset **out)
{
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "dataset: out is NULL");
    *out = NULL;
    if (path == NULL || cfg == NULL)
        return keel__fail(KEEL_EINVAL, "dataset: NULL argument");
    if (KEEL__STRUCT_CHECK(cfg, keel_dataset_h5_config) != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "dataset %s", path);
    if (cfg->num_classes < 2 || cfg->num_classes > INT32_MAX)
        return keel__fail(KEEL_EINVAL, "dataset %s: num_classes %lld outside "
                          "2..%d", path, (long long)cfg->num_classes,
                          INT32_MAX);
    if (cfg->block_rows < 0 || cfg->block_rows > INT32_MAX ||
        (cfg->stream && cfg->block_rows < 1))
        return keel__fail(KEEL_EINVAL, "dataset %s: block_rows %lld outside "
                          "%d..%d", path, (long long)cfg->block_rows,
                          cfg->stream ? 1 : 0, INT32_MAX);
    if (access(path, R_OK) != 0)
        return keel__data_open_fail(path, "HDF5 data");
    return keel__data_h5_open(path, cfg, 1, out);
}

keel_status
keel_dataset_open_h5(const char *path, int num_classes, keel_dataset **out)
{
    keel_dataset_h5_config cfg;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "dataset: out is NULL");
    *out = NULL;
    if (num_classes < 2)
        return keel__fail(KEEL_EINVAL, "dataset: num_classes %d < 2",
                          num_classes);
    keel_dataset_h5_config_init(&cfg);
    cfg.num_classes = num_classes;
    return keel_dataset_open_h5_config(path, &cfg, out);
}
