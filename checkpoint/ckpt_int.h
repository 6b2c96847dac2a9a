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

/* The longest shard count a sharded checkpoint may have (five digits in
 * the shard file names). */
#define CK_MAX_SHARDS 99999

/* A dataset a sharded checkpoint's index links into a shard file: linked
 * whole (part -1), or part k of a partitioned variable name (the shard's
 * dataset "<name>/part_<k>", rows [first, first + shape[0]) of name),
 * which the index maps into one virtual dataset name. */
typedef struct ck_link {
    char name[KEEL_NAME_MAX];
    char slot[KEEL_NAME_MAX];    /* "" for the variable itself */
    int shard;                   /* 0-based shard number */
    int part;                    /* -1: linked whole; else the part */
    int n_parts;                 /* parts of name (part >= 0) */
    int ndim;                    /* the part's shape (part >= 0) */
    int64_t shape[KEEL_MAX_DIMS];
    int64_t first;               /* its first row in name */
    uint64_t hash;               /* part 0: xxh64 of the whole of name */
} ck_link;

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
    /* Sharding: shard_count 0 is an ordinary checkpoint. A shard file has
     * shard_index >= 0; an index has shard_index -1 and links (external
     * links into the shard files, named keel__ckpt_shard_name). */
    uint64_t run_id;
    int shard_count;
    int shard_index;
    const ck_link *links;      /* borrowed */
    size_t n_links;
    /* An index over partitioned variables: the shards' "<name>/part_<k>"
     * datasets become one virtual dataset name each (keel_ckpt_index_config.
     * partitioned). */
    int partitioned;
} ck_plan;

/* Append a dataset to p: variable name (slot NULL) or its slot, t's shape,
 * data's bytes (borrowed until the write). */
keel_status keel__ckpt_plan_add(ck_plan *p, const char *name,
                                const char *slot, const keel_tensor *t,
                                const void *data);
/* Write plan as a complete, durable file at path (temp file, fsync,
 * rename, fsync dir); fills in the items' hashes. On failure nothing is
 * left behind at path. */
keel_status keel__ckpt_write_file(ck_plan *p, const char *path);

/* The links of the index index_name (in dir) for plan p (p->step,
 * run_id, shard_count): every dataset of each of its shards, each shard
 * opened and checked to be that shard of this checkpoint, none also a
 * dataset of p's own. Caller frees *out. */
keel_status keel__ckpt_index_links(const char *dir, const char *index_name,
                                   const ck_plan *p, ck_link **out,
                                   size_t *n_out);

/* Unlink the shard files of the checkpoint whose index is index_path
 * (every "<stem>.shard-<k>-of-<n>.h5" beside it), whether or not the
 * index is still there: retention, after the index. Best effort, logs. */
void keel__ckpt_unlink_shards(const char *index_path);
/* 1 when name is a shard file's name ("<stem>.shard-<k>-of-<n>.h5"). */
int keel__ckpt_is_shard_name(const char *name);

/* One dataset found in a file, with where its raw bytes are. */
typedef struct ck_dset {
    keel_ckpt_entry e;
    size_t count;            /* elements */
    int64_t offset;          /* file offset of contiguous data, or -1 */
    int src;                 /* 0: the file itself; k: shard k-1's file */
} ck_dset;

/* A file a sharded checkpoint's data is in. */
typedef struct ck_src {
    char path[KEEL_PATH_MAX];
    int64_t file_size;
} ck_src;

/* An opened-and-parsed checkpoint: meta plus the dataset table. For a
 * sharded checkpoint's index the table holds the index's own datasets and
 * every dataset it links into its shards (each shard opened, checked and
 * listed: src, offset and checksum are the shard's). */
typedef struct ck_file {
    char path[KEEL_PATH_MAX];
    int64_t file_size;
    int64_t global_step;
    ck_dset *d;
    size_t n, n_vars;        /* variables first (sorted), then slots */
    uint64_t run_id;         /* sharded: the checkpoint's run id */
    int shard_count;         /* 0: not sharded */
    int shard_index;         /* a shard file: its number; else -1 */
    ck_src *srcs;            /* index: srcs[k] is shard k's file */
} ck_file;

/* The path of the file dataset d of f is in. */
const char *keel__ckpt_dset_path(const ck_file *f, const ck_dset *d);
/* A table-less view of the file dataset src k of f lives in (path and
 * size only), for the I/O engine. */
void keel__ckpt_src_view(const ck_file *f, int src, ck_file *view);
/* Shard k (0-based) of n of the checkpoint named index_name
 * ("<stem>.h5"): "<stem>.shard-<k>-of-<n>.h5", five digits each. */
keel_status keel__ckpt_shard_name(char *out, size_t size,
                                  const char *index_name, int k, int n);

/* Order of a file's table: by slot ("" first), then by name. */
int keel__ckpt_dset_cmp(const void *a, const void *b);
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
