/* saver_int.h - private interface between the saver's files: the save
 * path (saver.c), the state file and names (state.c) and retention
 * (retention.c). Layered: state.c uses neither of the others, retention.c
 * uses state.c, saver.c uses both. */
#ifndef KEEL_SAVER_INT_H
#define KEEL_SAVER_INT_H

#include <pthread.h>
#include "ckpt_int.h"

struct keel_saver {
    char dir[KEEL_PATH_MAX];
    char basename[KEEL_NAME_MAX];
    int max_to_keep;
    double keep_every_n_hours;
    int is_async;

    ck_state state;             /* the retention list, save order */
    int64_t last_step;          /* atomic: read by keel_saver_last_step */

    /* async: one writer thread for the saver's life, woken per save (a
     * thread created per save made the step wait for clone() and, on a
     * busy machine, for the new thread to give the core back) */
    pthread_t thread;
    int has_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* has_job set, or is_quitting */
    pthread_cond_t done_cv;     /* in_flight cleared */
    int has_job, is_quitting;
    int in_flight;              /* a staged save not yet committed */
    int64_t t_stage_ns, t_staged_ns, t_woken_ns;
    keel_status th_status;
    char th_err[KEEL_ERR_MAX];
    ck_plan plan;
    char *stage;                /* staging buffer, KEEL_TENSOR_ALIGN'd */
    size_t stage_cap;
    char *names;                /* copied names, config, topology */
    size_t names_cap;

    /* retention deletions run on their own thread (freeing a large file's
     * blocks takes tens of ms) */
    pthread_t reaper;
    int reaping;
    char (*reap)[KEEL_PATH_MAX];
    size_t n_reap;
    /* the state file this saver last wrote has "# keel: delete=" lines,
     * which only a crash before the reaper is done may leave behind */
    int lists_deletions;
};

/* One save being committed: its file's name and path, when the save
 * began (the file's timestamp in the state file), and the files
 * retention drops from the list. */
typedef struct ck_commit {
    char name[KEEL_NAME_MAX];
    char path[KEEL_PATH_MAX];
    double now;
    char (*doomed)[KEEL_NAME_MAX];
    size_t n_doomed;
} ck_commit;

/* state.c */
/* <basename>-<step>.h5, or <basename>-epoch<E>-<step>.h5 for an
 * end-of-epoch checkpoint (epoch > 0). */
keel_status keel__ckpt_file_name(char *out, size_t size, const char *base,
                                 int64_t step, int64_t epoch);
/* Append name (timestamp ts) to st's list. */
keel_status keel__ckpt_state_push(ck_state *st, const char *name,
                                  double ts);
/* Remove entry i of st's list. */
void keel__ckpt_state_remove(ck_state *st, size_t i);
/* 1 when retention may unlink name, a file of s's own (logs why not). */
int keel__ckpt_may_unlink(const keel_saver *s, const char *name);
/* 1 when state file entries a and b name the same file of s's dir. */
int keel__ckpt_same_entry(const keel_saver *s, const char *a,
                          const char *b);
/* Keep only the newest entry of each file s's list names twice. */
void keel__ckpt_state_dedup(keel_saver *s);
/* Write s's list, with "# keel: delete=" lines for doomed, atomically. */
keel_status keel__ckpt_state_write(const keel_saver *s,
                                   char (*doomed)[KEEL_NAME_MAX],
                                   size_t n_doomed);

/* retention.c */
/* Remove temp files left by processes that no longer exist. */
void keel__ckpt_clean_temp_files(const keel_saver *s);
/* Load s's list from the state file (missing files dropped, interrupted
 * deletions finished). */
void keel__ckpt_load_state(keel_saver *s);
/* List checkpoints newer than the newest listed one. */
void keel__ckpt_adopt_orphans(keel_saver *s);
/* Wait for the previous save's retention deletions. */
void keel__ckpt_join_reaper(keel_saver *s);
/* Record commit c in the state file with retention applied; c->doomed
 * receives what retention dropped. */
keel_status keel__ckpt_record_commit(keel_saver *s, ck_commit *c);
/* Unlink c's dropped files on the reaper thread. */
void keel__ckpt_start_reaping(keel_saver *s, const ck_commit *c);
/* Rewrite the state file without "# keel: delete=" lines of files gone. */
void keel__ckpt_drop_finished_deletions(keel_saver *s);

#endif
