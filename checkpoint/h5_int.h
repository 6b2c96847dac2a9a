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

#endif
