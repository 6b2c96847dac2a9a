/* keel/checkpoint.h - crash-safe HDF5 checkpoints: one file per save
 * (<basename>-<step>.h5) holding every variable, optimizer slot, the global
 * step and run metadata, each dataset with an xxh64 checksum verified on
 * every read; a TF-format `checkpoint` state file; retention; restore with
 * fallback to the newest valid checkpoint; async save. File format:
 * docs/checkpoint-format.md. A saver is used by one thread at a time (its
 * background writer is internal). */
#ifndef KEEL_CHECKPOINT_H
#define KEEL_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_CKPT_FORMAT_VERSION 1
#define KEEL_CKPT_DEFAULT_BASENAME "model.ckpt"
#define KEEL_CKPT_MAX_BLOBS 16

/* An opaque byte string stored under /meta (data-iterator state, RNG
 * state, ...). Borrowed for the call that takes it. */
typedef struct keel_ckpt_blob {
    const char *name;          /* single segment, e.g. "data_iterator" */
    const void *data;
    size_t size;
} keel_ckpt_blob;

/* What a checkpoint records besides variables and slots. The global step
 * saved is always keel_vars_global_step() of the store. Fill it with
 * keel_ckpt_meta_init() before setting members. */
typedef struct keel_ckpt_meta {
    uint32_t struct_size;      /* set by keel_ckpt_meta_init() */
    const char *config_text;   /* the run's resolved config; may be NULL */
    const char *topology;      /* e.g. "ps=2 workers=4 mode=sync"; may be NULL */
    const keel_ckpt_blob *blobs;
    size_t n_blobs;            /* <= KEEL_CKPT_MAX_BLOBS */
    /* The model's architecture as JSON (docs/checkpoint-format.md): keel
     * train's, or a program's layer description (keel_model_desc_json,
     * docs/export.md); may be NULL. */
    const char *architecture;
    /* Epochs completed when saved, for an end-of-epoch checkpoint: the file
     * is then named <basename>-epoch<E>-<step>.h5 and /meta records it.
     * 0: an ordinary checkpoint, <basename>-<step>.h5. */
    int64_t epoch;
} keel_ckpt_meta;

/* Nothing recorded: every member NULL or 0, struct_size set. Cannot
 * fail. */
void keel_ckpt_meta_init(keel_ckpt_meta *meta);

/* ---- saving ---------------------------------------------------------------- */

typedef struct keel_saver keel_saver;

typedef struct keel_saver_config {
    uint32_t struct_size;     /* set by keel_saver_config_init() */
    const char *dir;           /* checkpoint directory (created if missing) */
    const char *basename;      /* default "model.ckpt" */
    int max_to_keep;           /* default 5; 0 keeps all */
    double keep_every_n_hours; /* default 0 (off): also keep one per N hours */
    int is_async;              /* default 0: write in a background thread */
} keel_saver_config;

/* Fill cfg with the defaults above (dir NULL). Cannot fail. */
void keel_saver_config_init(keel_saver_config *cfg);

/* Open a saver on cfg->dir (strings copied): creates the directory, removes
 * leftover temporary files of earlier crashed saves, reads the state file
 * (retention settings recorded there are superseded by cfg and rewritten at
 * the next save). Caller owns *out: keel_saver_free(). */
keel_status keel_saver_new(const keel_saver_config *cfg, keel_saver **out);

/* Save vs (variables not flagged KEEL_VAR_LOCAL, their slots, the global
 * step) and meta as <dir>/<basename>-<step>.h5, commit it durably, update
 * the state file, then apply retention. Saving a step that is already the
 * newest checkpoint is a no-op returning KEEL_OK. Async savers copy the data
 * into a staging buffer and return; the write's result is reported by the
 * next keel_saver_save/keel_saver_wait (never dropped). path (may be NULL)
 * receives the checkpoint's path. */
keel_status keel_saver_save(keel_saver *s, const keel_vars *vs,
                            const keel_ckpt_meta *meta, char *path,
                            size_t path_size);

/* ---- sharded checkpoints ------------------------------------------------- */

/* A sharded checkpoint of step S is one shard file per parameter server,
 * <basename>-S.shard-<k>-of-<n>.h5 (k from 00000, five digits each), each
 * holding that server's variables and slots, then the index
 * <basename>-S.h5, which the chief writes last: its own variables plus an
 * HDF5 external link into the shard file for every dataset of every shard.
 * Readers (restore, keel ckpt, h5py) open the index as one checkpoint;
 * keel's readers accept external links only into the index's own shards
 * whose step, run id, number and count match, and treat a missing, torn or
 * foreign shard as a damaged checkpoint (restore falls back). */

/* One shard to write. Fill with keel_ckpt_shard_config_init(). */
typedef struct keel_ckpt_shard_config {
    uint32_t struct_size;     /* set by keel_ckpt_shard_config_init() */
    const char *dir;          /* checkpoint directory; caller owns */
    const char *basename;     /* default "model.ckpt": the chief saver's */
    int64_t step;             /* the checkpoint's step; default -1: the
                               * store's global step */
    int64_t epoch;            /* as keel_ckpt_meta.epoch; default 0 */
    uint64_t run_id;          /* the chief's run id/generation for this
                               * checkpoint, the same in every shard and
                               * the index; default 0 */
    int shard_index;          /* 0-based; default -1 (required) */
    int shard_count;          /* shards of the checkpoint, 1..99999;
                               * default 0 (required) */
    /* Names of the variables to write (with their slots); NULL: every
     * variable of the store not flagged KEEL_VAR_LOCAL. Caller owns. */
    const char *const *names;
    size_t n_names;
} keel_ckpt_shard_config;

/* Defaults above (dir NULL). Cannot fail. */
void keel_ckpt_shard_config_init(keel_ckpt_shard_config *cfg);

/* Write shard cfg->shard_index of vs's variables (and slots) durably:
 * temp file, fsync, rename, fsync of the directory; an existing shard of
 * that name is replaced. Synchronous; the caller keeps vs unchanged for
 * the call. path (may be NULL) receives the shard's path. Not a
 * checkpoint by itself: the chief's keel_saver_save_sharded commits it. */
keel_status keel_ckpt_write_shard(const keel_ckpt_shard_config *cfg,
                                  const keel_vars *vs, char *path,
                                  size_t path_size);

/* A sharded checkpoint's index. Fill with keel_ckpt_index_config_init(). */
typedef struct keel_ckpt_index_config {
    uint32_t struct_size;     /* set by keel_ckpt_index_config_init() */
    uint64_t run_id;          /* as in every shard; default 0 */
    int shard_count;          /* 1..99999; default 0 (required) */
    int partitioned;          /* 1: the shards hold the parts of
                               * partitioned variables, "NAME/part_K" for
                               * K from 0 (at least 2 parts, split by
                               * rows); the index presents each NAME, and
                               * each slot of it, as one HDF5 virtual
                               * dataset of the whole shape over the parts'
                               * rows. Default 0: every dataset is linked
                               * as it is. */
} keel_ckpt_index_config;

/* Defaults above. Cannot fail. */
void keel_ckpt_index_config_init(keel_ckpt_index_config *cfg);

/* keel_saver_save for a sharded checkpoint: vs holds the chief's own
 * variables (those in no shard); every shard of the step must already be
 * written (keel_ckpt_write_shard) with index->run_id and shard_count. The
 * commit opens and checks each shard, writes the index durably, then the
 * state file, then applies retention (which deletes a checkpoint's shards
 * with its index). A shard missing or of another step or run fails the
 * save (KEEL_ENOTFOUND / KEEL_ECORRUPT, naming it) and commits nothing;
 * a variable both the chief's and in a shard is KEEL_EINVAL. Async savers
 * check the shards on their writer thread. */
keel_status keel_saver_save_sharded(keel_saver *s, const keel_vars *vs,
                                    const keel_ckpt_meta *meta,
                                    const keel_ckpt_index_config *index,
                                    char *path, size_t path_size);

/* Wait for an in-flight async save (and for the deletion of checkpoints
 * retention retired); returns the save's status. Cannot block forever: the
 * write either finishes or fails. */
keel_status keel_saver_wait(keel_saver *s);

/* The step of the newest checkpoint this saver knows, or -1. */
int64_t keel_saver_last_step(const keel_saver *s);

/* Wait for any in-flight save and retention's deletions, drop the state
 * file's "# keel: delete=" lines of the files now gone (a line left names
 * a deletion still pending), then release. NULL is a no-op. */
void keel_saver_free(keel_saver *s);

/* ---- finding and verifying ---------------------------------------------------- */

/* The newest checkpoint in dir that verifies: reads the state file (and, if
 * it is missing or unusable, scans for <basename>-<step>.h5), verifies from
 * the newest down, logs which checkpoint was skipped and why, and returns
 * the first valid one's path and step. KEEL_ENOTFOUND when dir holds no
 * checkpoint; KEEL_ECORRUPT naming every file tried when it holds some and
 * none verifies; KEEL_EINVAL, with no fallback, for a whole file that is
 * not keel's (a dataset of another dtype). basename NULL means the
 * default. */
keel_status keel_ckpt_latest(const char *dir, const char *basename,
                             char *path, size_t path_size, int64_t *step);

/* The state file of dir against the directory: KEEL_OK when there is no
 * state file or its newest entry (model_checkpoint_path) is a regular
 * file (a symlink is followed); KEEL_ENOTFOUND naming the state file and
 * the entry when that file is missing or a dangling symlink;
 * KEEL_ECORRUPT when the state file cannot be parsed. What `keel ckpt
 * verify DIR` and `keel ckpt ls` check besides each file. */
keel_status keel_ckpt_state_check(const char *dir);

/* Verify every dataset's checksum, shapes and the format version of one
 * checkpoint file: KEEL_OK, or KEEL_ECORRUPT/KEEL_EIO naming the file and
 * the first bad dataset (KEEL_EINVAL for a whole dataset of another
 * dtype). */
keel_status keel_ckpt_verify(const char *path);

/* ---- restoring ------------------------------------------------------------- */

typedef enum keel_restore_mode {
    KEEL_RESTORE_STRICT = 0,  /* every non-local variable must be in the file */
    KEEL_RESTORE_PARTIAL      /* missing variables keep their initializer */
} keel_restore_mode;

typedef struct keel_restore_config {
    uint32_t struct_size;     /* set by keel_restore_config_init() */
    keel_restore_mode mode;   /* default KEEL_RESTORE_STRICT */
    /* Renames for layers renamed since the save: "old/name=new/name". */
    const char *const *name_map;
    size_t n_name_map;
    int skip_slots;           /* 1: do not restore optimizer slots */
    /* Only the model variables whose whole name matches this POSIX
     * extended regex are restored (and can be missing); the others are
     * left as they are. NULL: every variable. Caller owns. A bad regex is
     * KEEL_EINVAL naming it. */
    const char *only_vars;
} keel_restore_config;

/* Strict, no renames, slots restored. Cannot fail. */
void keel_restore_config_init(keel_restore_config *opts);

/* What a restore found. */
typedef struct keel_restore_report {
    int64_t global_step;
    size_t n_restored;        /* variables restored */
    size_t n_missing;         /* in the store, not in the file */
    size_t n_unexpected;      /* in the file, not in the store */
    char missing[1024];       /* comma-separated names, truncated "..." */
    char unexpected[1024];
} keel_restore_report;

/* Restore variables (by name, shape-checked: the error names the variable
 * and both shapes), their slots (created if absent) and the global step from
 * the checkpoint file path, verifying checksums. opts and report may be
 * NULL (strict, no report). On failure the store may be partly written but
 * the error says so; callers re-initialize or fail. */
keel_status keel_ckpt_restore(const char *path, keel_vars *vs,
                              const keel_restore_config *opts,
                              keel_restore_report *report);

/* keel_ckpt_restore of shard shard_index only of the sharded checkpoint
 * whose index is path: the variables (and slots) that shard holds, by
 * name, into vs, and the step. The index and every shard are opened and
 * checked as for a whole restore; only that shard's data is read. A
 * checkpoint that is not sharded, or has no such shard, is KEEL_EINVAL.
 * For a parameter server restoring its own part. */
keel_status keel_ckpt_restore_shard(const char *path, int shard_index,
                                    keel_vars *vs,
                                    const keel_restore_config *opts,
                                    keel_restore_report *report);

/* One tensor keel_ckpt_read_parts reads: variable name's (or its slot's)
 * rows [row_begin, row_end) of dimension 0, or the whole tensor when both
 * are 0, into dst. Found by name: through a sharded checkpoint's index,
 * whichever shard holds it. */
typedef struct keel_ckpt_part {
    const char *name;         /* the variable's name; caller owns */
    const char *slot;         /* NULL or "": the variable; else its slot's
                               * name; caller owns */
    int64_t row_begin;        /* first row (dimension 0) */
    int64_t row_end;          /* one past the last; 0 and 0: every row */
    float *dst;               /* caller owns; receives count floats */
    size_t count;             /* the part's elements (rows x row size) */
} keel_ckpt_part;

/* Read parts[0..n) from the checkpoint file path, verifying each dataset's
 * checksum (a part of rows reads its whole dataset to verify it). step >= 0
 * and run_id != 0 are what the checkpoint must be (its global step, a
 * sharded checkpoint's run id), checked before anything is read: a
 * mismatch is KEEL_EABORTED naming both. A dataset that is absent is
 * KEEL_ENOTFOUND, a count or rows that do not fit it KEEL_EINVAL, each
 * naming the variable, the slot and the file. On failure some dsts may be
 * written. *global_step (may be NULL): the checkpoint's step. For a
 * parameter server reading the variables it holds (any of them, in any
 * placement) and, later, the rows of a partitioned variable it holds. */
keel_status keel_ckpt_read_parts(const char *path, int64_t step,
                                 uint64_t run_id, const keel_ckpt_part *parts,
                                 size_t n, int64_t *global_step);

/* keel_ckpt_latest and keel_ckpt_restore in one pass over the data: the
 * newest checkpoint is restored as it is verified (the checksums are checked
 * while reading), and one that fails as a file (KEEL_ECORRUPT, KEEL_EIO, gone)
 * is skipped, logged, for the next newest. A checkpoint that does not fit
 * the store (shapes, names: KEEL_EINVAL) ends the search. Partial-mode
 * restores verify first, then read (see the source). path (may be NULL)
 * receives the file restored. KEEL_ENOTFOUND when dir holds no checkpoint;
 * KEEL_ECORRUPT naming every file tried when it holds some and none
 * restores (a caller that starts afresh on KEEL_ENOTFOUND must not on
 * this). */
keel_status keel_ckpt_restore_latest(const char *dir, const char *basename,
                                     keel_vars *vs,
                                     const keel_restore_config *opts,
                                     keel_restore_report *report, char *path,
                                     size_t path_size);

/* Read a checkpoint's metadata: global step, wall time, format version,
 * keel version, config text, topology, and blobs. Caller owns *out:
 * keel_ckpt_info_free(). */
typedef struct keel_ckpt_info {
    int64_t global_step;
    double wall_time;
    int format_version;
    char keel_version[32];
    char *config_text;        /* NULL if absent */
    char *topology;           /* NULL if absent */
    char *architecture;       /* JSON; NULL if absent (older files) */
    int64_t epoch;            /* end-of-epoch checkpoint's epoch; 0: none */
    size_t n_blobs;
    struct {
        char name[64];
        void *data;
        size_t size;
    } blobs[KEEL_CKPT_MAX_BLOBS];
    size_t n_variables;       /* datasets under /variables (an index's
                               * own and those in its shards) */
    size_t n_slots;           /* datasets under /slots */
    int shard_count;          /* a sharded checkpoint's shards; 0: none */
    uint64_t run_id;          /* a sharded checkpoint's run id; 0: none */
} keel_ckpt_info;

keel_status keel_ckpt_read_info(const char *path, keel_ckpt_info **out);
void keel_ckpt_info_free(keel_ckpt_info *info);
/* The blob with this name, or NULL (size in *size). */
const void *keel_ckpt_info_blob(const keel_ckpt_info *info, const char *name,
                                size_t *size);

/* ---- reading, for tools (keel ckpt ls/show/diff) ------------------------- */

/* One dataset of a checkpoint: a variable (slot "") or one of its slots. */
typedef struct keel_ckpt_entry {
    char name[KEEL_NAME_MAX];     /* variable name, e.g. "conv1/kernel" */
    char slot[KEEL_NAME_MAX];     /* slot name, "" for the variable itself */
    int ndim;
    int64_t shape[KEEL_MAX_DIMS];
    uint64_t xxh64;               /* the recorded checksum */
} keel_ckpt_entry;

/* Every variable and slot dataset of a checkpoint file, variables first,
 * each group sorted by name. Checks the format, types and shapes but not
 * checksums (cheap). Caller owns *out: keel_ckpt_list_free(). */
keel_status keel_ckpt_list(const char *path, keel_ckpt_entry **out,
                           size_t *n);
void keel_ckpt_list_free(keel_ckpt_entry *entries);

/* Read one variable (slot NULL or "") or slot into a newly allocated
 * tensor *out, verifying its checksum. KEEL_ENOTFOUND when absent. Caller
 * owns out: keel_tensor_release(). */
keel_status keel_ckpt_read_tensor(const char *path, const char *name,
                                  const char *slot, keel_tensor *out);

/* One <basename>-<step>.h5 file found in a directory. */
typedef struct keel_ckpt_file {
    char name[KEEL_NAME_MAX];     /* file name, relative to the directory */
    int64_t step;                 /* from the file name */
    int64_t size;                 /* bytes */
    double mtime;                 /* seconds since the epoch */
    int in_state_file;            /* listed in the `checkpoint` state file */
} keel_ckpt_file;

/* The checkpoint files in dir, by step ascending; basename NULL matches
 * any "<something>-<digits>.h5". Caller owns *out: keel_ckpt_scan_free(). */
keel_status keel_ckpt_scan(const char *dir, const char *basename,
                           keel_ckpt_file **out, size_t *n);
void keel_ckpt_scan_free(keel_ckpt_file *files);

/* ---- read leases ------------------------------------------------------------- */

/* A reader's claim on one checkpoint file: while it is held, a saver's
 * retention in the same directory does not delete that file (it records
 * `.deferred-<file>` and deletes it at a later save, once unleased). A
 * lease is the empty file `<dir>/.lease-<pid>.<seq>-<file>`; leases of
 * processes that are gone count as released (same host: pid liveness). */
typedef struct keel_ckpt_lease keel_ckpt_lease;

/* Create a lease on dir/file (file: a name in dir, e.g.
 * "model.ckpt-100.h5"), atomically (O_EXCL). It does not check that the
 * file exists: take the lease first, then open the file (a file retention
 * removed before the lease shows up as missing). Caller owns *out:
 * keel_ckpt_lease_release(). */
keel_status keel_ckpt_lease_take(const char *dir, const char *file,
                                 keel_ckpt_lease **out);
/* Remove the lease file and free the handle. NULL is a no-op. Cannot fail
 * (a lease file that cannot be removed is stale once this process ends). */
void keel_ckpt_lease_release(keel_ckpt_lease *lease);
/* The lease file's path; borrowed until release. */
const char *keel_ckpt_lease_path(const keel_ckpt_lease *lease);
/* *is_leased = 1 when a live process holds a lease on dir/file. Leases of
 * dead processes are ignored and removed. */
keel_status keel_ckpt_lease_is_leased(const char *dir, const char *file,
                                      int *is_leased);

#ifdef __cplusplus
}
#endif
#endif
