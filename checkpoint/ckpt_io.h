/* ckpt_io.h - private interface of the checkpoint's bulk I/O engine
 * (ckpt_io.c): tensor bytes written and read with write()/pread(), and
 * O_DIRECT where the buffers and offsets allow, at the file offsets the
 * HDF5 layout (h5layout.c) allocated, each run's xxh64 computed on the
 * way. The engine knows nothing of HDF5 and takes no HDF5 lock. */
#ifndef KEEL_CKPT_IO_H
#define KEEL_CKPT_IO_H

#include <stddef.h>
#include <stdint.h>
#include "ckpt_int.h"

/* Buffered read size; a verify pass reads through a buffer of this size. */
#define CK_IO_CHUNK ((size_t)32 << 20)

/* One contiguous run of bytes to write: a dataset's data. */
typedef struct ck_piece {
    const void *data;         /* borrowed for the call */
    size_t bytes;             /* 0: nothing to write (offset may be -1) */
    int64_t offset;           /* file offset of the dataset's bytes */
    const char *what;         /* dataset name, for messages */
    uint64_t *hash;           /* receives xxh64(data, bytes), or NULL */
} ck_piece;

/* Write every piece's bytes at its offset through fd, a descriptor open
 * for writing on the file tmp (tmp names it in messages). With direct,
 * page-aligned pieces also go through a second, O_DIRECT descriptor;
 * *n_direct receives the bytes written that way. Every piece with a hash
 * pointer gets its checksum. On return every write has been issued, none
 * is fsynced; fd stays open. */
keel_status keel__ckpt_io_write(int fd, const char *tmp,
                                const ck_piece *pieces, size_t n,
                                int direct, size_t *n_direct);

/* Read n bytes at off of fd into dst, or with dst NULL through bounce
 * (CK_IO_CHUNK bytes), and return their xxh64 in *hash. path names the
 * file in messages; an early end of file is KEEL_ECORRUPT. */
keel_status keel__ckpt_io_read_hashed(int fd, void *dst, void *bounce,
                                      size_t n, int64_t off,
                                      const char *path, uint64_t *hash);

/* keel__ckpt_read_many for the jobs whose dataset is contiguous
 * (d->offset >= 0); the others are skipped. */
keel_status keel__ckpt_io_read_many(const ck_file *f,
                                    const ck_read_job *jobs, size_t n);

/* The failure for dataset d of the file path failing its checksum:
 * KEEL_ECORRUPT, naming the variable or slot. */
keel_status keel__ckpt_io_bad_hash(const char *path, const ck_dset *d);

#endif
