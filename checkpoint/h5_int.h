/* h5_int.h - private interface between the checkpoint's HDF5 files:
 * the layout and writer (h5layout.c), the bounds checks (h5bounds.c) and
 * the reader (h5read.c). Layered: h5bounds.c uses neither of the others,
 * h5read.c uses both. */
#ifndef KEEL_H5_INT_H
#define KEEL_H5_INT_H

#include <stdint.h>
#include <hdf5.h>
#include "ckpt_int.h"

/* Lock HDF5 and switch its error printing off (libkeel never prints);
 * keel__ckpt_h5_end unlocks. */
void keel__ckpt_h5_begin(void);
void keel__ckpt_h5_end(void);
/* The file access property list every checkpoint file is opened and
 * created with (sec2, v18+, aligned, strong close, no file locking); -1
 * on failure. */
hid_t keel__ckpt_fapl(void);

/* Every link of the open checkpoint h (at path) stays within its own
 * files and resolves. With shard_count > 0 (path is a sharded
 * checkpoint's index) an external link may also lead to the same
 * dataset path in one of its shards, path's own shard files
 * (keel__ckpt_shard_name, same directory) and nothing else; each such
 * link is appended to *links (*n_links; caller frees *links, also on
 * failure). */
keel_status keel__ckpt_check_links(hid_t h, const char *path,
                                   int shard_count, ck_link **links,
                                   size_t *n_links);
/* Dataset ds (what: its name for messages) of the checkpoint path,
 * file_size bytes long, declaring bytes bytes of data: its storage is in
 * the checkpoint's own files and can hold what it declares. */
keel_status keel__ckpt_check_storage(const char *path, int64_t file_size,
                                     const char *what, hid_t ds,
                                     uint64_t bytes);

/* The most parts a virtual dataset of an index may map. */
#define CK_MAX_VIRTUAL 65536
/* The virtual dataset ds (what: "/variables/<var>" or
 * "/slots/<slot>/<var>") of the index path of shard_count shards: each
 * of its 2..CK_MAX_VIRTUAL mappings takes all of dataset "<what>/part_<k>"
 * of one of the index's own shards (keel__ckpt_shard_name, no directory)
 * onto whole rows, part k onto the k-th block of rows, the blocks
 * covering every row once. Each mapping is appended to *links (part >= 0,
 * its shape and first row; *n_links, capacity *cap) for the shard check,
 * which finds each part in its shard with that shape. */
keel_status keel__ckpt_check_virtual(const char *path, int shard_count,
                                     const char *what, const char *var,
                                     const char *slot, hid_t ds,
                                     ck_link **links, size_t *n_links,
                                     size_t *cap);

#endif
