/* data_int.h - private to the data files (dataset.c, data_idx.c,
 * data_hdf5.c, data_inputs.c, data.c): the dataset handle and a streamed
 * HDF5 set's state, and what one of those files defines for the others.
 * A file calls only the files on the lines below its own, never back:
 *   data.c         examples and batches: keel_dataset_get, the iterator
 *   data_inputs.c  inputs of any supported format (.npy, IDX, HDF5)
 *   data_idx.c     IDX files;  data_hdf5.c  HDF5 files and streaming
 *   dataset.c      the handle: free, accessors, what the readers share */
#ifndef KEEL_TRAIN_DATA_INT_H
#define KEEL_TRAIN_DATA_INT_H

#include <stddef.h>
#include <stdint.h>

#include <hdf5.h>

#include <keel/train.h>
#include "util.h"
#include "train_int.h"

/* The largest image side (rows, columns) the readers accept. */
#define MAX_SIDE 65536

/* A streamed HDF5 set's open file and its bounded buffer: STREAM_SLOTS
 * blocks of rows rows each, the least recently used one replaced on a
 * miss. Reading positions that advance through a shuffled epoch (each
 * block's rows contiguous in it) reads every block once per epoch. */
#define STREAM_SLOTS 2
typedef struct stream_state {
    char *path;
    hid_t f, dx;
    hsize_t xd[8];
    int is_u8;
    size_t rows;                 /* rows per block */
    size_t block[STREAM_SLOTS];  /* SIZE_MAX: empty */
    uint64_t used[STREAM_SLOTS], clock;
    float *buf[STREAM_SLOTS];
    uint8_t *u8;                 /* uint8 staging of one block */
    uint64_t reads;              /* blocks read so far */
} stream_state;

struct keel_dataset {
    size_t n;
    int rank;              /* of the file's examples: 2 tabular, 3 or 4 */
    int64_t h, w, c;
    size_t esize;          /* h*w*c */
    uint8_t *x8;           /* either pixels (scaled by 1/255) */
    float *xf;             /* or floats */
    int32_t *y;
    int64_t max_label;     /* -1: no labels */
    size_t block_rows;     /* shuffle block; 0: the whole set */
    int streamed;          /* x is read by blocks through st */
    stream_state st;
};

/* ---- dataset.c -----------------------------------------------------------
 * x[j] = p[j] / 255 for j < n. */
void keel__data_u8_to_float(const uint8_t *restrict p, float *restrict x,
                            size_t n);
/* The errno of a failed open of path as a status: KEEL_ENOTFOUND or
 * KEEL_EIO, the message naming what file and path. */
keel_status keel__data_open_fail(const char *path, const char *what);

/* ---- data_idx.c ----------------------------------------------------------
 * The whole file at path, decompressed if it is gzip'd (plain files as
 * they are), in *data (caller frees) of *len bytes. */
keel_status keel__data_read_maybe_gz(const char *path, const char *what,
                                     uint8_t **data, size_t *len);
/* The big-endian 32-bit number at p. */
uint32_t keel__data_be32(const uint8_t *p);
/* The dataset of an IDX images file read whole into *img (a checked
 * 16-byte header of n x rows x cols, then the pixels): the pixels are
 * moved to the front and the dataset takes the buffer (*img = NULL);
 * labels holds n labels, or is NULL for none (-1 each). On failure *img
 * stays the caller's; what and path name the failure. */
keel_status keel__data_idx_dataset(uint8_t **img, size_t n, size_t rows,
                                   size_t cols, const uint8_t *labels,
                                   const char *what, const char *path,
                                   keel_dataset **out);

/* ---- data_hdf5.c ---------------------------------------------------------
 * The HDF5 data file at path as a new dataset (cfg's classes, streaming
 * and shuffle block), under keel's HDF5 lock; 'y' is optional unless
 * need_y. */
keel_status keel__data_h5_open(const char *path,
                               const keel_dataset_h5_config *cfg,
                               int need_y, keel_dataset **out);
/* Example i of a streamed dataset into x, through its block buffer. */
keel_status keel__data_stream_example(keel_dataset *ds, size_t i, float *x);

#endif

