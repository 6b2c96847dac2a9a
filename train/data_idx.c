/* data_idx.c - IDX files (MNIST format, gzip'd or plain): the whole-file
 * reader with zlib, every header field checked, and the dataset of an
 * images file and its labels file. */
#include <config.h>

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include <keel/train.h>
#include "util.h"
#include "data_int.h"

KEEL__VECTORIZE_FILE

#define IDX_MAX_BYTES ((size_t)4 << 30)   /* 4 GiB uncompressed */

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
        return keel__data_open_fail(path, what);
    if (fstat(fd, &sb) != 0 || (*f = gzdopen(fd, "rb")) == NULL) {
        keel_status st = keel__data_open_fail(path, what);
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
keel_status
keel__data_read_maybe_gz(const char *path, const char *what, uint8_t **data,
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

uint32_t
keel__data_be32(const uint8_t *p)
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
keel_status
keel__data_idx_dataset(uint8_t **img, size_t n, size_t rows, size_t cols,
                       const uint8_t *labels, const char *what,
                       const char *path, keel_dataset **out)
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
    ds->rank = 3;
    ds->esize = rows * cols;
    ds->max_label = -1;
    for (size_t i = 0; i < n; i++) {
        ds->y[i] = labels != NULL ? labels[i] : -1;
        if (ds->y[i] > ds->max_label)
            ds->max_label = ds->y[i];
    }
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
    if ((st = keel__data_read_maybe_gz(images_path, "IDX images", &img,
                                       &ilen)) != KEEL_OK)
        return st;
    if ((st = keel__data_read_maybe_gz(labels_path, "IDX labels", &lab,
                                       &llen)) != KEEL_OK)
        goto out;
    st = KEEL_ECORRUPT;
    if (!idx_magic_ok(img, ilen, 3, "images", images_path, "[N,rows,cols]"))
        goto out;
    n = keel__data_be32(img + 4);
    rows = keel__data_be32(img + 8);
    cols = keel__data_be32(img + 12);
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
    if (keel__data_be32(lab + 4) != n) {
        keel__fail(st, "IDX labels file %s has %u labels but images file %s "
                   "has %zu images", labels_path, keel__data_be32(lab + 4),
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
    st = keel__data_idx_dataset(&img, n, rows, cols, lab + 8, "dataset",
                                images_path, out);
out:
    free(img);
    free(lab);
    return st;
}
