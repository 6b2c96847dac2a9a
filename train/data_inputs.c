/* data_inputs.c - the inputs of keel predict in any supported format,
 * told by their first bytes: .npy arrays (uint8 or float32), IDX image
 * files and HDF5 files with dataset 'x'; labels are -1. */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/train.h>
#include "util.h"
#include "data_int.h"

KEEL__VECTORIZE_FILE

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
    ds->rank = ndim;
    ds->max_label = -1;
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
        return keel__data_open_fail(path, "input");
    len = fread(sig, 1, sizeof sig, f);
    fclose(f);
    if (len == 8 && memcmp(sig, "\211HDF\r\n\032\n", 8) == 0)
    {
        keel_dataset_h5_config hc;
        keel_dataset_h5_config_init(&hc);
        hc.num_classes = INT32_MAX;
        return keel__data_h5_open(path, &hc, 0, out);
    }
    st = keel__data_read_maybe_gz(path, "input", &b, &len);
    if (st != KEEL_OK)
        return st;
    if (len >= 6 && memcmp(b, "\223NUMPY", 6) == 0) {
        st = open_npy(path, b, len, out);
    } else if (len >= 16 && b[0] == 0 && b[1] == 0 && b[2] == 0x08 &&
               b[3] == 3) {
        size_t n = keel__data_be32(b + 4), rows = keel__data_be32(b + 8),
               cols = keel__data_be32(b + 12);
        if (n < 1 || n > INT32_MAX || rows < 1 || rows > MAX_SIDE ||
            cols < 1 || cols > MAX_SIDE || len - 16 != n * rows * cols)
            st = keel__fail(KEEL_ECORRUPT, "IDX images file %s: header "
                            "%zu x %zu x %zu does not match its %zu bytes "
                            "of pixels", path, n, rows, cols, len - 16);
        else
            st = keel__data_idx_dataset(&b, n, rows, cols, NULL, "inputs",
                                        path, out);
    } else {
        st = keel__fail(KEEL_ECORRUPT, "input %s is not an IDX image file "
                        "(magic 0x00000803, gzip'd or plain), a .npy array "
                        "or an HDF5 file with dataset 'x'", path);
    }
    free(b);
    return st;
}
