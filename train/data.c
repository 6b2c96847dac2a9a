/* data.c - training data: IDX (MNIST format, gzip'd or plain) and HDF5
 * readers that validate every header field, and the batch iterator with
 * deterministic per-epoch shuffling, per-worker slices of the global batch
 * and a small versioned state blob for exact resumes. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>
#include <zlib.h>

#include <keel/train.h>
#include "util.h"
#include "h5util.h"
#include "train_int.h"

KEEL__VECTORIZE_FILE

#define IDX_MAX_BYTES ((size_t)4 << 30)   /* 4 GiB uncompressed */
#define MAX_SIDE 65536

struct keel_dataset {
    size_t n;
    int64_t h, w, c;
    size_t esize;          /* h*w*c */
    uint8_t *x8;           /* either pixels (scaled by 1/255) */
    float *xf;             /* or floats */
    int32_t *y;
};

void
keel_dataset_free(keel_dataset *ds)
{
    if (ds == NULL)
        return;
    free(ds->x8);
    free(ds->xf);
    free(ds->y);
    free(ds);
}

size_t
keel_dataset_count(const keel_dataset *ds)
{
    return ds != NULL ? ds->n : 0;
}

void
keel_dataset_shape(const keel_dataset *ds, int64_t *h, int64_t *w,
                   int64_t *c)
{
    if (h != NULL)
        *h = ds->h;
    if (w != NULL)
        *w = ds->w;
    if (c != NULL)
        *c = ds->c;
}

size_t
keel_dataset_example_size(const keel_dataset *ds)
{
    return ds != NULL ? ds->esize : 0;
}

static KEEL__HOT void
u8_to_float(const uint8_t *restrict p, float *restrict x, size_t n)
{
    for (size_t j = 0; j < n; j++)
        x[j] = (float)p[j] / 255.0f;     /* like numpy's x/np.float32(255) */
}

static void
copy_example(const keel_dataset *ds, size_t i, float *x)
{
    if (ds->x8 != NULL) {
        u8_to_float(ds->x8 + i * ds->esize, x, ds->esize);
    } else {
        memcpy(x, ds->xf + i * ds->esize, ds->esize * sizeof *x);
    }
}

keel_status
keel_dataset_get(const keel_dataset *ds, size_t i, float *x, int32_t *y)
{
    if (ds == NULL || x == NULL)
        return keel__fail(KEEL_EINVAL, "dataset get: NULL argument");
    if (i >= ds->n)
        return keel__fail(KEEL_EINVAL, "dataset get: example %zu of %zu", i,
                          ds->n);
    copy_example(ds, i, x);
    if (y != NULL)
        *y = ds->y[i];
    return KEEL_OK;
}

/* ---- IDX ---------------------------------------------------------------- */

static keel_status
open_fail(const char *path, const char *what)
{
    int e = errno;
    return keel__fail(e == ENOENT ? KEEL_ENOTFOUND : KEEL_EIO,
                      "%s file %s: %s", what, path, strerror(e));
}

/* Open path for zlib. *first is the first buffer's size: a plain file fits
 * exactly (its size + 1, so the read that finds its end needs no growth), a
 * gzip'd one grows from there by doubling; a small file never gets a large
 * block. One open: the size that sizes the buffer is the opened file's. */
static keel_status
gz_open(const char *path, const char *what, gzFile *f, size_t *first)
{
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return open_fail(path, what);
    if (fstat(fd, &sb) != 0 || (*f = gzdopen(fd, "rb")) == NULL) {
        keel_status st = open_fail(path, what);
        close(fd);
        return st;
    }
    *first = sb.st_size < 4096 ? 4096
             : (uint64_t)sb.st_size < ((uint64_t)1 << 20)
                 ? (size_t)sb.st_size + 1 : (size_t)1 << 20;
    return KEEL_OK;
}

/* Room for more: *cap becomes first, then doubles up to IDX_MAX_BYTES. */
static keel_status
gz_grow(uint8_t **buf, size_t *cap, size_t first, const char *path,
        const char *what)
{
    size_t ncap = *cap == 0 ? first
                  : *cap > IDX_MAX_BYTES / 2 ? IDX_MAX_BYTES : *cap * 2;
    uint8_t *nb;
    if (*cap >= IDX_MAX_BYTES)
        return keel__fail(KEEL_ECORRUPT, "%s file %s: larger than %zu bytes "
                          "uncompressed", what, path, IDX_MAX_BYTES);
    nb = realloc(*buf, ncap);
    if (nb == NULL)
        return keel__fail(KEEL_ENOMEM, "%s file %s: %zu bytes", what, path,
                          ncap);
    *buf = nb;
    *cap = ncap;
    return KEEL_OK;
}

/* Whole file, decompressed if it is gzip'd (zlib reads plain files as is). */
static keel_status
read_maybe_gz(const char *path, const char *what, uint8_t **data,
              size_t *len)
{
    gzFile f;
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0, first = 0;
    int got = 0, errnum = Z_OK;
    keel_status st;

    *data = NULL;
    *len = 0;
    st = gz_open(path, what, &f, &first);
    if (st != KEEL_OK)
        return st;
    do {
        if (n == cap && (st = gz_grow(&buf, &cap, first, path, what)) !=
                            KEEL_OK)
            break;
        got = gzread(f, buf + n, (unsigned)(cap - n > INT_MAX ? INT_MAX
                                                              : cap - n));
        if (got > 0)
            n += (size_t)got;
    } while (got > 0);
    if (st == KEEL_OK) {
        const char *msg = gzerror(f, &errnum);
        if (errnum != Z_OK && errnum != Z_STREAM_END)
            st = keel__fail(KEEL_ECORRUPT, "%s file %s: bad or truncated "
                            "gzip data (%s)", what, path,
                            msg != NULL ? msg : "zlib error");
    }
    gzclose(f);
    if (st != KEEL_OK) {
        free(buf);
        return st;
    }
    *data = buf;
    *len = n;
    return KEEL_OK;
}

static uint32_t
be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
           (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* 1 when the IDX file b (len bytes) holds at least its header (the magic
 * and one 4-byte size per dimension) and the magic of uint8 data of dims
 * dimensions; else 0 after a KEEL_ECORRUPT naming what, path and shape. */
static int
idx_magic_ok(const uint8_t *b, size_t len, int dims, const char *what,
             const char *path, const char *shape)
{
    size_t head = 4 + 4 * (size_t)dims;
    char why[64];
    if (len >= head && b[0] == 0 && b[1] == 0 && b[2] == 0x08 &&
        b[3] == dims)
        return 1;
    if (len < head)
        snprintf(why, sizeof why, "shorter than its %zu-byte header", head);
    else
        snprintf(why, sizeof why, "wrong magic");
    keel__fail(KEEL_ECORRUPT, "IDX %s file %s: %s (want magic 0x0000080%d, "
               "uint8 %s)", what, path, why, dims, shape);
    return 0;
}

/* The dataset of an IDX images file read whole into *img (a checked
 * 16-byte header of n x rows x cols, then the pixels): the pixels are
 * moved to the front and the dataset takes the buffer (*img = NULL);
 * labels holds n labels, or is NULL for none (-1 each). On failure *img
 * stays the caller's; what and path name the failure. */
static keel_status
idx_dataset(uint8_t **img, size_t n, size_t rows, size_t cols,
            const uint8_t *labels, const char *what, const char *path,
            keel_dataset **out)
{
    keel_dataset *ds = calloc(1, sizeof *ds);
    if (ds == NULL || (ds->y = malloc(n * sizeof *ds->y)) == NULL) {
        keel_dataset_free(ds);
        return keel__fail(KEEL_ENOMEM, "%s %s", what, path);
    }
    ds->n = n;
    ds->h = (int64_t)rows;
    ds->w = (int64_t)cols;
    ds->c = 1;
    ds->esize = rows * cols;
    for (size_t i = 0; i < n; i++)
        ds->y[i] = labels != NULL ? labels[i] : -1;
    memmove(*img, *img + 16, n * rows * cols);
    ds->x8 = *img;
    *img = NULL;
    *out = ds;
    return KEEL_OK;
}

keel_status
keel_dataset_open_idx(const char *images_path, const char *labels_path,
                      int num_classes, keel_dataset **out)
{
    uint8_t *img = NULL, *lab = NULL;
    size_t ilen, llen, n, rows, cols, need;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "dataset: out is NULL");
    *out = NULL;
    if (images_path == NULL || labels_path == NULL)
        return keel__fail(KEEL_EINVAL, "dataset: NULL path");
    if (num_classes < 2 || num_classes > 256)
        return keel__fail(KEEL_EINVAL, "dataset: IDX num_classes %d outside "
                          "2..256", num_classes);
    if ((st = read_maybe_gz(images_path, "IDX images", &img, &ilen)) !=
        KEEL_OK)
        return st;
    if ((st = read_maybe_gz(labels_path, "IDX labels", &lab, &llen)) !=
        KEEL_OK)
        goto out;
    st = KEEL_ECORRUPT;
    if (!idx_magic_ok(img, ilen, 3, "images", images_path, "[N,rows,cols]"))
        goto out;
    n = be32(img + 4);
    rows = be32(img + 8);
    cols = be32(img + 12);
    if (n < 1 || n > INT32_MAX || rows < 1 || rows > MAX_SIDE || cols < 1 ||
        cols > MAX_SIDE) {
        keel__fail(st, "IDX images file %s: bad header dimensions %zu x %zu "
                   "x %zu", images_path, n, rows, cols);
        goto out;
    }
    need = n * rows * cols;         /* < 2^31 * 2^32: no overflow */
    if (ilen - 16 != need) {
        keel__fail(st, "IDX images file %s: %s: header says %zu x %zu x %zu "
                   "= %zu bytes of pixels, file has %zu", images_path,
                   ilen - 16 < need ? "truncated" : "trailing bytes", n,
                   rows, cols, need, ilen - 16);
        goto out;
    }
    if (!idx_magic_ok(lab, llen, 1, "labels", labels_path, "[N]"))
        goto out;
    if (be32(lab + 4) != n) {
        keel__fail(st, "IDX labels file %s has %u labels but images file %s "
                   "has %zu images", labels_path, be32(lab + 4),
                   images_path, n);
        goto out;
    }
    if (llen - 8 != n) {
        keel__fail(st, "IDX labels file %s: %s: header says %zu labels, "
                   "file has %zu bytes of them", labels_path,
                   llen - 8 < n ? "truncated" : "trailing bytes", n,
                   llen - 8);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        if (lab[8 + i] >= num_classes) {
            keel__fail(st, "IDX labels file %s: label %u of example %zu "
                       "outside [0, %d)", labels_path, lab[8 + i], i,
                       num_classes);
            goto out;
        }
    st = idx_dataset(&img, n, rows, cols, lab + 8, "dataset", images_path,
                     out);
out:
    free(img);
    free(lab);
    return st;
}

/* ---- HDF5 --------------------------------------------------------------- */

/* An HDF5 data file being read: its 'x' and, where there is one, 'y'
 * with their dataspaces and types (H5I_INVALID_HID where not open). */
typedef struct h5_src {
    const char *path;
    hid_t f, dx, dy, sx, sy, tx, ty;
    hsize_t xd[8];                /* 'x' as [N, H, W, C] */
    int is_u8;                    /* 'x' is uint8 pixels, else float32 */
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

/* 'x' is [N,H,W] or [N,H,W,C] within bounds, 'y' (if any) [N]. */
static keel_status
h5_check_shape(h5_src *s)
{
    hsize_t yd[8], *xd = s->xd;
    int xr = H5Sget_simple_extent_ndims(s->sx);
    int yr = s->dy >= 0 ? H5Sget_simple_extent_ndims(s->sy) : 1;
    if (xr < 3 || xr > 4 || yr != 1)
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: 'x' must be "
                          "[N,H,W] or [N,H,W,C] and 'y' [N] (ranks are %d "
                          "and %d)", s->path, xr, yr);
    H5Sget_simple_extent_dims(s->sx, xd, NULL);
    if (s->dy >= 0)
        H5Sget_simple_extent_dims(s->sy, yd, NULL);
    else
        yd[0] = xd[0];
    if (xr == 3)
        xd[3] = 1;
    if (xd[0] < 1 || xd[0] > INT32_MAX || xd[1] < 1 || xd[1] > MAX_SIDE ||
        xd[2] < 1 || xd[2] > MAX_SIDE || xd[3] < 1 || xd[3] > 4096)
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: 'x' has bad "
                          "dimensions", s->path);
    if (yd[0] != xd[0])
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: 'x' has %llu "
                          "examples but 'y' has %llu labels", s->path,
                          (unsigned long long)xd[0],
                          (unsigned long long)yd[0]);
    return KEEL_OK;
}

/* 'x' is float32 or uint8 (sets is_u8), 'y' an integer type. */
static keel_status
h5_check_types(h5_src *s)
{
    if (H5Tget_class(s->tx) == H5T_FLOAT && H5Tget_size(s->tx) == 4) {
        s->is_u8 = 0;
    } else if (H5Tget_class(s->tx) == H5T_INTEGER &&
               H5Tget_size(s->tx) == 1 &&
               H5Tget_sign(s->tx) == H5T_SGN_NONE) {
        s->is_u8 = 1;
    } else {
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: 'x' must be "
                          "float32 or uint8", s->path);
    }
    if (s->dy >= 0 && H5Tget_class(s->ty) != H5T_INTEGER)
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: 'y' must be an "
                          "integer type", s->path);
    return KEEL_OK;
}

/* ds's shape from 'x', and its pixel (or float) and label arrays; labels
 * gets room for the file's int64 labels. */
static keel_status
h5_alloc(const h5_src *s, keel_dataset *ds, int64_t **labels)
{
    size_t n = (size_t)s->xd[0], count;
    ds->n = n;
    ds->h = (int64_t)s->xd[1];
    ds->w = (int64_t)s->xd[2];
    ds->c = (int64_t)s->xd[3];
    ds->esize = (size_t)(s->xd[1] * s->xd[2] * s->xd[3]);
    if (ds->esize > KEEL_TENSOR_MAX_BYTES / 4 / n)
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: 'x' too large",
                          s->path);
    count = n * ds->esize;
    *labels = malloc(n * sizeof **labels);
    ds->y = malloc(n * sizeof *ds->y);
    if (s->is_u8)
        ds->x8 = malloc(count);
    else
        ds->xf = malloc(count * sizeof(float));
    if (*labels == NULL || ds->y == NULL ||
        (ds->x8 == NULL && ds->xf == NULL))
        return keel__fail(KEEL_ENOMEM, "HDF5 data file %s: %zu values",
                          s->path, count);
    return KEEL_OK;
}

static keel_status
h5_read_values(const h5_src *s, keel_dataset *ds, int64_t *labels)
{
    if (H5Dread(s->dx, s->is_u8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT,
                H5S_ALL, H5S_ALL, H5P_DEFAULT,
                s->is_u8 ? (void *)ds->x8 : (void *)ds->xf) < 0 ||
        (s->dy >= 0 && H5Dread(s->dy, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL,
                               H5P_DEFAULT, labels) < 0))
        return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: H5Dread failed "
                          "(corrupt data)", s->path);
    return KEEL_OK;
}

/* ds->y from the file's labels, each in [0, num_classes); -1 for inputs
 * without labels. */
static keel_status
h5_set_labels(const h5_src *s, keel_dataset *ds, const int64_t *labels,
              int num_classes)
{
    for (size_t i = 0; i < ds->n && s->dy >= 0; i++) {
        if (labels[i] < 0 || labels[i] >= num_classes)
            return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: label %lld "
                              "of example %zu outside [0, %d)", s->path,
                              (long long)labels[i], i, num_classes);
        ds->y[i] = (int32_t)labels[i];
    }
    for (size_t i = 0; i < ds->n && s->dy < 0; i++)
        ds->y[i] = -1;
    return KEEL_OK;
}

static keel_status
h5_check_finite(const char *path, const keel_dataset *ds)
{
    size_t count = ds->n * ds->esize;
    if (ds->xf == NULL)
        return KEEL_OK;
    for (size_t i = 0; i < count; i++)
        if (!isfinite(ds->xf[i]))
            return keel__fail(KEEL_ECORRUPT, "HDF5 data file %s: 'x' value "
                              "%zu is not finite", path, i);
    return KEEL_OK;
}

/* ds from the HDF5 file at path: open and check its headers, then read,
 * then check the values. */
static keel_status
h5_read_dataset(const char *path, int num_classes, keel_dataset *ds,
                int need_y)
{
    h5_src s = { .path = path, .f = H5I_INVALID_HID,
                 .dx = H5I_INVALID_HID, .dy = H5I_INVALID_HID,
                 .sx = H5I_INVALID_HID, .sy = H5I_INVALID_HID,
                 .tx = H5I_INVALID_HID, .ty = H5I_INVALID_HID };
    int64_t *labels = NULL;
    keel_status st = h5_src_open(&s, need_y);
    if (st == KEEL_OK)
        st = h5_check_shape(&s);
    if (st == KEEL_OK)
        st = h5_check_types(&s);
    if (st == KEEL_OK)
        st = h5_alloc(&s, ds, &labels);
    if (st == KEEL_OK)
        st = h5_read_values(&s, ds, labels);
    if (st == KEEL_OK)
        st = h5_set_labels(&s, ds, labels, num_classes);
    if (st == KEEL_OK)
        st = h5_check_finite(path, ds);
    free(labels);
    h5_src_close(&s);
    return st;
}

/* h5_read_dataset into a new dataset, under keel's HDF5 lock. */
static keel_status
h5_open(const char *path, int num_classes, int need_y, keel_dataset **out)
{
    keel_dataset *ds = calloc(1, sizeof *ds);
    keel_status st;
    if (ds == NULL)
        return keel__fail(KEEL_ENOMEM, "dataset %s", path);
    keel__h5_lock();
    H5E_BEGIN_TRY {
        st = h5_read_dataset(path, num_classes, ds, need_y);
    } H5E_END_TRY;
    keel__h5_unlock();
    if (st != KEEL_OK) {
        keel_dataset_free(ds);
        return st;
    }
    *out = ds;
    return KEEL_OK;
}

keel_status
keel_dataset_open_h5(const char *path, int num_classes, keel_dataset **out)
{
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "dataset: out is NULL");
    *out = NULL;
    if (path == NULL)
        return keel__fail(KEEL_EINVAL, "dataset: NULL path");
    if (num_classes < 2)
        return keel__fail(KEEL_EINVAL, "dataset: num_classes %d < 2",
                          num_classes);
    if (access(path, R_OK) != 0)
        return open_fail(path, "HDF5 data");
    return h5_open(path, num_classes, 1, out);
}

/* ---- inputs of any supported format (keel predict) ---------------------- */

/* The shape and dtype of a .npy header dict ("{'descr': '<f4',
 * 'fortran_order': False, 'shape': (2, 28, 28), }"). */
static keel_status
npy_header(const char *path, const char *h, size_t len, int *is_u8,
           int *ndim, size_t *dims)
{
    char buf[512];
    const char *d, *fo, *sh;
    if (len >= sizeof buf)
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: header of %zu bytes "
                          "is too long", path, len);
    memcpy(buf, h, len);
    buf[len] = '\0';
    d = strstr(buf, "'descr':");
    fo = strstr(buf, "'fortran_order':");
    sh = strstr(buf, "'shape':");
    if (d == NULL || fo == NULL || sh == NULL)
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: header lacks descr, "
                          "fortran_order or shape", path);
    d += 8;
    while (*d == ' ')
        d++;
    if (strncmp(d, "'|u1'", 5) == 0 || strncmp(d, "'u1'", 4) == 0 ||
        strncmp(d, "'<u1'", 5) == 0)
        *is_u8 = 1;
    else if (strncmp(d, "'<f4'", 5) == 0)
        *is_u8 = 0;
    else
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: dtype %.8s is not "
                          "uint8 or little-endian float32", path, d);
    fo += 16;
    while (*fo == ' ')
        fo++;
    if (strncmp(fo, "False", 5) != 0)
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: Fortran order is "
                          "not supported (save it C-contiguous)", path);
    sh += 8;
    while (*sh == ' ')
        sh++;
    if (*sh++ != '(')
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: bad shape", path);
    *ndim = 0;
    for (;;) {
        char *end;
        unsigned long long v;
        while (*sh == ' ' || *sh == ',')
            sh++;
        if (*sh == ')')
            break;
        if (*ndim == 4 || *sh < '0' || *sh > '9')
            return keel__fail(KEEL_ECORRUPT, ".npy file %s: shape must be "
                              "(N, H, W), (N, H, W, C) or (N, D)", path);
        errno = 0;
        v = strtoull(sh, &end, 10);
        if (errno != 0 || v < 1 || v > INT32_MAX)
            return keel__fail(KEEL_ECORRUPT, ".npy file %s: dimension out of "
                              "range", path);
        dims[(*ndim)++] = (size_t)v;
        sh = end;
    }
    if (*ndim < 2)
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: shape must be (N, "
                          "H, W), (N, H, W, C) or (N, D)", path);
    return KEEL_OK;
}

static keel_status
open_npy(const char *path, const uint8_t *b, size_t len, keel_dataset **out)
{
    size_t hl, off, dims[4] = { 1, 1, 1, 1 }, n, esize, bytes;
    int is_u8 = 0, ndim = 0;
    keel_dataset *ds;
    keel_status st;
    if (len < 10 || b[6] < 1 || b[6] > 3)
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: bad header or "
                          "version", path);
    if (b[6] == 1) {
        hl = (size_t)b[8] | (size_t)b[9] << 8;
        off = 10;
    } else {
        if (len < 12)
            return keel__fail(KEEL_ECORRUPT, ".npy file %s: truncated "
                              "header", path);
        hl = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 |
             (size_t)b[11] << 24;
        off = 12;
    }
    if (hl > len - off)
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: truncated header",
                          path);
    st = npy_header(path, (const char *)b + off, hl, &is_u8, &ndim, dims);
    if (st != KEEL_OK)
        return st;
    off += hl;
    n = dims[0];
    if (ndim == 2) {          /* (N, D): flat examples, D x 1 x 1 */
        dims[2] = dims[3] = 1;
    } else if (ndim == 3) {
        dims[3] = 1;
    }
    if (dims[1] > MAX_SIDE || dims[2] > MAX_SIDE || dims[3] > 4096)
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: example shape too "
                          "large", path);
    esize = dims[1] * dims[2] * dims[3];
    if (esize > KEEL_TENSOR_MAX_BYTES / 4 / n)
        return keel__fail(KEEL_EINVAL, ".npy file %s: too large", path);
    bytes = n * esize * (is_u8 ? 1 : 4);
    if (len - off != bytes)
        return keel__fail(KEEL_ECORRUPT, ".npy file %s: %s: the shape needs "
                          "%zu bytes of data, the file has %zu", path,
                          len - off < bytes ? "truncated" : "trailing bytes",
                          bytes, len - off);
    ds = calloc(1, sizeof *ds);
    if (ds == NULL || (ds->y = malloc(n * sizeof *ds->y)) == NULL ||
        (is_u8 ? (ds->x8 = malloc(bytes)) == NULL
               : (ds->xf = malloc(bytes)) == NULL)) {
        keel_dataset_free(ds);
        return keel__fail(KEEL_ENOMEM, ".npy file %s", path);
    }
    ds->n = n;
    ds->h = (int64_t)dims[1];
    ds->w = (int64_t)dims[2];
    ds->c = (int64_t)dims[3];
    ds->esize = esize;
    memcpy(is_u8 ? (void *)ds->x8 : (void *)ds->xf, b + off, bytes);
    for (size_t i = 0; i < n; i++)
        ds->y[i] = -1;
    for (size_t i = 0; !is_u8 && i < n * esize; i++)
        if (!isfinite(ds->xf[i])) {
            keel_dataset_free(ds);
            return keel__fail(KEEL_ECORRUPT, ".npy file %s: value %zu is "
                              "not finite", path, i);
        }
    *out = ds;
    return KEEL_OK;
}

keel_status
keel_dataset_open_inputs(const char *path, keel_dataset **out)
{
    uint8_t *b = NULL, sig[8];
    size_t len = 0;
    keel_status st;
    FILE *f;
    if (out == NULL || path == NULL)
        return keel__fail(KEEL_EINVAL, "inputs: NULL argument");
    *out = NULL;
    f = fopen(path, "rb");
    if (f == NULL)
        return open_fail(path, "input");
    len = fread(sig, 1, sizeof sig, f);
    fclose(f);
    if (len == 8 && memcmp(sig, "\211HDF\r\n\032\n", 8) == 0)
        return h5_open(path, INT32_MAX, 0, out);
    st = read_maybe_gz(path, "input", &b, &len);
    if (st != KEEL_OK)
        return st;
    if (len >= 6 && memcmp(b, "\223NUMPY", 6) == 0) {
        st = open_npy(path, b, len, out);
    } else if (len >= 16 && b[0] == 0 && b[1] == 0 && b[2] == 0x08 &&
               b[3] == 3) {
        size_t n = be32(b + 4), rows = be32(b + 8), cols = be32(b + 12);
        if (n < 1 || n > INT32_MAX || rows < 1 || rows > MAX_SIDE ||
            cols < 1 || cols > MAX_SIDE || len - 16 != n * rows * cols)
            st = keel__fail(KEEL_ECORRUPT, "IDX images file %s: header "
                            "%zu x %zu x %zu does not match its %zu bytes "
                            "of pixels", path, n, rows, cols, len - 16);
        else
            st = idx_dataset(&b, n, rows, cols, NULL, "inputs", path, out);
    } else {
        st = keel__fail(KEEL_ECORRUPT, "input %s is not an IDX image file "
                        "(magic 0x00000803, gzip'd or plain), a .npy array "
                        "or an HDF5 file with dataset 'x'", path);
    }
    free(b);
    return st;
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
    it->perm = malloc((size_t)n * sizeof *it->perm);
    it->x = keel_aligned_alloc(it->cap * ds->esize * sizeof(float));
    it->y = malloc(it->cap * sizeof *it->y);
    if (it->perm == NULL || it->x == NULL || it->y == NULL) {
        keel_data_iter_free(it);
        return keel__fail(KEEL_ENOMEM, "data iterator buffers");
    }
    *out = it;
    return KEEL_OK;
}

static void
build_perm(keel_data_iter *it)
{
    size_t n = it->ds->n;
    keel__rng r;
    uint64_t mix = it->cfg.seed;
    for (size_t i = 0; i < n; i++)
        it->perm[i] = (uint32_t)i;
    if (it->cfg.shuffle) {
        /* each epoch's order depends only on (seed, epoch) */
        mix ^= keel__splitmix64(&(uint64_t){ (uint64_t)it->epoch });
        keel__rng_seed(&r, mix);
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = (size_t)keel__rng_below(&r, (uint64_t)i + 1);
            uint32_t t = it->perm[i];
            it->perm[i] = it->perm[j];
            it->perm[j] = t;
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
        copy_example(it->ds, ex, it->x + (size_t)(i - lo) * it->ds->esize);
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
#define STATE_VERSION 1u

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
    keel__le_put(p, (uint64_t)STATE_MAGIC | (uint64_t)STATE_VERSION << 32, 8);
    keel__le_put(p + 8, (uint64_t)keel_data_iter_epoch(it), 8);
    keel__le_put(p + 16, (uint64_t)keel_data_iter_offset(it), 8);
    keel__le_put(p + 24, it->cfg.seed, 8);
    keel__le_put(p + 32, (uint64_t)it->ds->n, 8);
    if (len != NULL)
        *len = KEEL_DATA_ITER_STATE_BYTES;
    return KEEL_OK;
}

keel_status
keel_data_iter_set_state(keel_data_iter *it, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint64_t head, epoch, offset, count;
    if (it == NULL || buf == NULL)
        return keel__fail(KEEL_EINVAL, "data iterator state: NULL argument");
    if (len != KEEL_DATA_ITER_STATE_BYTES)
        return keel__fail(KEEL_ECORRUPT, "data iterator state: %zu bytes, "
                          "expected %d", len, KEEL_DATA_ITER_STATE_BYTES);
    head = keel__le_get(p, 8);
    if ((uint32_t)head != STATE_MAGIC)
        return keel__fail(KEEL_ECORRUPT, "data iterator state: bad magic");
    if ((head >> 32) != STATE_VERSION)
        return keel__fail(KEEL_ECORRUPT, "data iterator state: version %u "
                          "(this keel reads %u)", (unsigned)(head >> 32),
                          STATE_VERSION);
    epoch = keel__le_get(p + 8, 8);
    offset = keel__le_get(p + 16, 8);
    count = keel__le_get(p + 32, 8);
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
