/* ckpt_int.h - private interface between the checkpoint files: the HDF5
 * layout (h5layout.c writes, h5bounds.c checks, h5read.c reads; h5_int.h)
 * with its bulk I/O engine (ckpt_io.c, ckpt_io.h), the saver (saver.c)
 * with its state file (state.c) and retention (retention.c; saver_int.h)
 * and finding/restoring (restore.c). */
#ifndef KEEL_CKPT_INT_H
#define KEEL_CKPT_INT_H

#include <stddef.h>
#include <stdint.h>
#include <keel/checkpoint.h>
#include <keel/tensor.h>
#include "util.h"

#define CK_STATE_NAME "checkpoint"
#define CK_META_MAX_TEXT ((size_t)64 << 20)   /* config / topology bound */
#define CK_BLOB_MAX ((size_t)1 << 32)         /* 4 GiB per blob on read */
#define CK_MAX_ENTRIES 1000000                /* datasets per file on read */

/* One dataset to write: a variable (slot NULL) or a slot. */
typedef struct ck_item {
    const char *name;
    const char *slot;
    int ndim;
    int64_t shape[KEEL_MAX_DIMS];
    const void *data;
    size_t bytes;
    uint64_t hash;
} ck_item;

/* Everything one checkpoint file holds. */
typedef struct ck_plan {
    ck_item *items;
    size_t n, cap;
    int64_t step;
    double wall_time;
    const char *config_text;
    const char *topology;
    const char *architecture;
    int64_t epoch;             /* > 0: an end-of-epoch checkpoint */
    keel_ckpt_blob blobs[KEEL_CKPT_MAX_BLOBS];
    size_t n_blobs;
} ck_plan;

/* Write plan as a complete, durable file at path (temp file, fsync,
 * rename, fsync dir); fills in the items' hashes. On failure nothing is
 * left behind at path. */
keel_status keel__ckpt_write_file(ck_plan *p, const char *path);

/* One dataset found in a file, with where its raw bytes are. */
typedef struct ck_dset {
    keel_ckpt_entry e;
    size_t count;            /* elements */
    int64_t offset;          /* file offset of contiguous data, or -1 */
} ck_dset;

/* An opened-and-parsed checkpoint: meta plus the dataset table. */
typedef struct ck_file {
    char path[KEEL_PATH_MAX];
    int64_t file_size;
    int64_t global_step;
    ck_dset *d;
    size_t n, n_vars;        /* variables first (sorted), then slots */
} ck_file;

/* Open path, check format/meta/types/shapes and list every dataset (no
 * data read). Errors name the file. */
keel_status keel__ckpt_open(const char *path, ck_file *f);
void keel__ckpt_close(ck_file *f);
/* Read dataset d of f into dst (d->count floats), verifying its xxh64. */
keel_status keel__ckpt_read(const ck_file *f, const ck_dset *d, void *dst);
/* One dataset to read and where its floats go. */
typedef struct ck_read_job {
    const ck_dset *d;
    void *dst;
} ck_read_job;
/* Read every job's dataset into its dst and verify each xxh64, in one
 * pass over the file in offset order: reader threads read pieces ahead
 * (several in flight) while the caller hashes, in file order, what has
 * arrived. Stops at the first failure in file order (a bad checksum names
 * the dataset); earlier dsts are then already written. */
keel_status keel__ckpt_read_many(const ck_file *f, const ck_read_job *jobs,
                                 size_t n);
/* Full verification (every dataset and blob checksum); *step may be NULL. */
keel_status keel__ckpt_verify(const char *path, int64_t *step);

/* The state file. */
typedef struct ck_state_entry {
    char name[KEEL_NAME_MAX];   /* relative file name, or absolute path */
    double ts;
} ck_state_entry;

typedef struct ck_state {
    char latest[KEEL_NAME_MAX];
    ck_state_entry *e;          /* oldest first */
    size_t n, cap;
    double last_preserved;      /* < 0 when absent */
    int max_to_keep;            /* -1 when not recorded */
    double keep_every_n_hours;  /* < 0 when not recorded */
    /* Files retention dropped from the list ("# keel: delete=NAME"): a
     * crash between the state write and the unlink leaves them; the next
     * saver removes them. */
    char (*doomed)[KEEL_NAME_MAX];
    size_t n_doomed;
} ck_state;

/* Parse <dir>/checkpoint. KEEL_ENOTFOUND when absent, KEEL_ECORRUPT when
 * it cannot be parsed. */
keel_status keel__ckpt_state_read(const char *dir, ck_state *st);
void keel__ckpt_state_free(ck_state *st);
/* Parse "<base>-<digits>.h5" or "<base>-epoch<E>-<digits>.h5" (any base
 * if base is NULL): the step, or -1. */
int64_t keel__ckpt_name_step(const char *name, const char *base);

/* Leases (lease.c). Retention asks before deleting dir/file: 1 when a
 * live reader holds a lease on it (then `.deferred-<file>` is recorded and
 * the caller must not delete it), 0 to delete it now. */
int keel__ckpt_lease_defer(const char *dir, const char *file);
/* 1 when dir holds a `.deferred-<file>` marker. */
int keel__ckpt_is_deferred(const char *dir, const char *file);
/* Remove stale leases (dead pids) and every deferred file that is no longer
 * leased, with its marker; a file listed in `listed` (may be NULL) is live:
 * only its marker goes. Best effort, logs what it removed; cannot fail. */
void keel__ckpt_lease_sweep(const char *dir, const ck_state *listed);

#endif
