/* retention.c - what a saver keeps and deletes: taking over what an
 * earlier saver left in the directory (temp files, its list, interrupted
 * deletions, unrecorded checkpoints), recording a commit with
 * max_to_keep and keep_every_n_hours applied, and unlinking the dropped
 * files on the reaper thread. */
#include <config.h>

#include <assert.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "saver_int.h"
#include "grow.h"

/* Remove ".<base>-*.h5.tmp.<pid>" and ".checkpoint.tmp.<pid>" left by
 * processes that no longer exist. */
void
keel__ckpt_clean_temp_files(const keel_saver *s)
{
    DIR *d = opendir(s->dir);
    struct dirent *de;
    size_t bl = strlen(s->basename);
    if (d == NULL)
        return;
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name, *t;
        int64_t pid;
        char path[KEEL_PATH_MAX];
        if (nm[0] != '.')
            continue;
        if (!((strncmp(nm + 1, s->basename, bl) == 0 && nm[1 + bl] == '-') ||
              strncmp(nm + 1, CK_STATE_NAME ".tmp.",
                      sizeof CK_STATE_NAME + 4) == 0))
            continue;
        t = strstr(nm, ".tmp.");
        if (t == NULL || !keel__parse_i64(t + 5, 1, INT32_MAX, &pid))
            continue;
        if (pid == (int64_t)getpid() ||
            (kill((pid_t)pid, 0) != 0 ? errno != ESRCH : 1))
            continue;          /* owner may still be alive */
        if (keel__path_join(path, sizeof path, s->dir, nm) != KEEL_OK)
            continue;
        if (unlink(path) == 0)
            keel__log(KEEL_LOG_INFO, "removed %s, left by crashed process "
                      "%lld", path, (long long)pid);
    }
    closedir(d);
}

/* Checkpoints newer than the newest listed one were committed by a
 * process that died before updating the state file: list them (by step) so
 * retention manages them. Older unlisted files are left alone: they may be
 * kept on purpose (keep_every_n_hours). */
void
keel__ckpt_adopt_orphans(keel_saver *s)
{
    keel_ckpt_file *f = NULL;
    size_t n = 0;
    if (keel_ckpt_scan(s->dir, s->basename, &f, &n) != KEEL_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        if (f[i].step <= s->last_step ||
            keel__ckpt_is_deferred(s->dir, f[i].name))
            continue;
        if (keel__ckpt_state_push(&s->state, f[i].name, f[i].mtime) != KEEL_OK)
            break;
        s->last_step = f[i].step;
        keel__log(KEEL_LOG_INFO, "adopted %s/%s, committed by a process "
                  "that stopped before recording it", s->dir, f[i].name);
    }
    keel_ckpt_scan_free(f);
}

/* Drop the loaded list's entries whose file is gone. */
static void
state_drop_missing(keel_saver *s)
{
    for (size_t i = 0; i < s->state.n; ) {
        char p[KEEL_PATH_MAX];
        struct stat sb;
        const char *nm = s->state.e[i].name;
        if (nm[0] == '/')
            snprintf(p, sizeof p, "%s", nm);
        else if (keel__path_join(p, sizeof p, s->dir, nm) != KEEL_OK)
            p[0] = '\0';
        if (stat(p, &sb) != 0) {
            keel__ckpt_state_remove(&s->state, i);
            continue;
        }
        i++;
    }
}

/* Finish the retention deletions a crash interrupted (the state file's
 * "# keel: delete=" names no longer listed), then forget them. */
static void
finish_doomed(keel_saver *s)
{
    for (size_t k = 0; k < s->state.n_doomed; k++) {
        char p[KEEL_PATH_MAX];
        int listed = 0;
        for (size_t i = 0; i < s->state.n; i++)
            listed |= strcmp(s->state.e[i].name, s->state.doomed[k]) == 0;
        if (!listed && keel__ckpt_may_unlink(s, s->state.doomed[k]) &&
            keel__path_join(p, sizeof p, s->dir, s->state.doomed[k]) ==
                KEEL_OK &&
            !keel__ckpt_lease_defer(s->dir, s->state.doomed[k])) {
            if (unlink(p) == 0)
                keel__log(KEEL_LOG_INFO, "retention: removed %s (deletion "
                          "interrupted earlier)", p);
            keel__ckpt_unlink_shards(p);
        }
    }
    free(s->state.doomed);
    s->state.doomed = NULL;
    s->state.n_doomed = 0;
}

/* The retention list from the directory's state file, without missing
 * files, and the newest entry's step; no state file (or a bad one, with
 * a warning) starts a new list. */
void
keel__ckpt_load_state(keel_saver *s)
{
    keel_status st = keel__ckpt_state_read(s->dir, &s->state);
    if (st != KEEL_OK) {
        if (st != KEEL_ENOTFOUND)
            keel__log(KEEL_LOG_WARN, "%s; starting a new checkpoint list",
                      keel_last_error());
        memset(&s->state, 0, sizeof s->state);
        return;
    }
    state_drop_missing(s);
    keel__ckpt_state_dedup(s);
    finish_doomed(s);
    if (s->state.n > 0) {
        const char *nm = s->state.e[s->state.n - 1].name;
        const char *sl = strrchr(nm, '/');
        s->last_step = keel__ckpt_name_step(sl ? sl + 1 : nm, s->basename);
    }
}

/* A reader's lease on path: record `.deferred-<file>` instead of deleting
 * it now (lease.c). */
static int
reap_is_leased(const char *path)
{
    char dir[KEEL_PATH_MAX];
    const char *sl = strrchr(path, '/');
    if (sl == NULL)
        return keel__ckpt_lease_defer(".", path);
    if (sl == path)
        return keel__ckpt_lease_defer("/", sl + 1);
    if ((size_t)(sl - path) >= sizeof dir)
        return 0;
    memcpy(dir, path, (size_t)(sl - path));
    dir[sl - path] = '\0';
    return keel__ckpt_lease_defer(dir, sl + 1);
}

static void *
reaper_main(void *arg)
{
    keel_saver *s = arg;
    for (size_t i = 0; i < s->n_reap; i++) {
        if (reap_is_leased(s->reap[i]))
            continue;                   // deleted by a later save
        if (unlink(s->reap[i]) != 0 && errno != ENOENT)
            keel__log(KEEL_LOG_WARN, "retention: cannot remove %s: %s",
                      s->reap[i], strerror(errno));
        else
            keel__log(KEEL_LOG_DEBUG, "retention: removed %s", s->reap[i]);
        keel__ckpt_unlink_shards(s->reap[i]);  /* after its index */
    }
    return NULL;
}

/* Wait for the retention deletions of the previous save. */
void
keel__ckpt_join_reaper(keel_saver *s)
{
    if (s->reaping)
        pthread_join(s->reaper, NULL);
    s->reaping = 0;
    free(s->reap);
    s->reap = NULL;
    s->n_reap = 0;
}

/* Whether the list still names the file name names (retention never
 * deletes a file the state file goes on listing). */
static int
still_listed(const keel_saver *s, const char *name)
{
    for (size_t i = 0; i < s->state.n; i++)
        if (keel__ckpt_same_entry(s, s->state.e[i].name, name))
            return 1;
    return 0;
}

/* Retention: the oldest entries past max_to_keep leave the list, into
 * c->doomed unless keep_every_n_hours keeps them for good. The entry
 * just added is never removed (n > max >= 1). */
static void
apply_retention(keel_saver *s, ck_commit *c)
{
    while (s->max_to_keep > 0 && s->state.n > (size_t)s->max_to_keep) {
        ck_state_entry old = s->state.e[0];
        keel__ckpt_state_remove(&s->state, 0);
        if (s->keep_every_n_hours > 0 &&
            old.ts - s->state.last_preserved >=
                s->keep_every_n_hours * 3600.0) {
            s->state.last_preserved = old.ts;   /* kept for good */
            continue;
        }
        if (!still_listed(s, old.name))
            snprintf(c->doomed[c->n_doomed++], KEEL_NAME_MAX, "%s",
                     old.name);
    }
}

/* The new list (without an older entry of the same name, plus this one,
 * after retention) into the state file. When that cannot be written the
 * .h5 is committed but unrecorded: the old list stays. */
keel_status
keel__ckpt_record_commit(keel_saver *s, ck_commit *c)
{
    size_t backup_n = s->state.n;
    double saved_lp = s->state.last_preserved;
    ck_state_entry *backup = malloc((backup_n + 1) * sizeof *backup);
    keel_status st;
    if (backup == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint retention list");
    if (backup_n > 0)
        memcpy(backup, s->state.e, backup_n * sizeof *backup);
    for (size_t i = 0; i < s->state.n; ) {
        const char *nm = s->state.e[i].name;
        const char *sl = strrchr(nm, '/');
        if (strcmp(sl ? sl + 1 : nm, c->name) == 0)
            keel__ckpt_state_remove(&s->state, i);
        else
            i++;
    }
    st = keel__ckpt_state_push(&s->state, c->name, c->now);
    if (st == KEEL_OK) {
        apply_retention(s, c);
        st = keel__ckpt_state_write(s, c->doomed, c->n_doomed);
        if (st != KEEL_OK) {
            memcpy(s->state.e, backup, backup_n * sizeof *backup);
            s->state.n = backup_n;
            s->state.last_preserved = saved_lp;
            c->n_doomed = 0;
            st = keel__wrap(st, "checkpoint %s was written but the state "
                            "file could not be updated", c->path);
        }
    }
    free(backup);
    return st;
}

/* Unlink the files retention dropped, on the reaper thread (here when it
 * cannot start): only now that the state file no longer lists them (a
 * crash before they are gone is finished by the next saver: "# keel:
 * delete="). */
void
keel__ckpt_start_reaping(keel_saver *s, const ck_commit *c)
{
    if (c->n_doomed == 0)
        return;
    s->n_reap = 0;
    s->reap = malloc(c->n_doomed * sizeof *s->reap);
    for (size_t i = 0; s->reap != NULL && i < c->n_doomed; i++) {
        const char *nm = c->doomed[i];
        char *dp = s->reap[s->n_reap];
        if (!keel__ckpt_may_unlink(s, nm))
            continue;
        if (nm[0] == '/')
            snprintf(dp, KEEL_PATH_MAX, "%s", nm);
        else if (keel__path_join(dp, KEEL_PATH_MAX, s->dir, nm) != KEEL_OK)
            continue;
        s->n_reap++;
    }
    if (s->reap != NULL) {
        s->reaping = pthread_create(&s->reaper, NULL, reaper_main, s) == 0;
        if (!s->reaping)
            reaper_main(s);
    }
}

/* 1 when the state file on disk lists the entries of s's list, in order
 * (no other saver of the directory wrote it since s). */
static int
state_is_ours(const keel_saver *s, const ck_state *disk)
{
    if (disk->n != s->state.n)
        return 0;
    for (size_t i = 0; i < disk->n; i++)
        if (strcmp(disk->e[i].name, s->state.e[i].name) != 0)
            return 0;
    return 1;
}

/* At a clean end, once the reaper is done: rewrite the state file without
 * the "# keel: delete=" lines of the files that are gone, so that a line
 * left there means a deletion still pending (a crash, a reader's lease,
 * a failed unlink). Leaves a file another saver wrote since alone. */
void
keel__ckpt_drop_finished_deletions(keel_saver *s)
{
    ck_state disk;
    size_t n = 0;
    if (!s->lists_deletions)
        return;
    s->lists_deletions = 0;
    if (keel__ckpt_state_read(s->dir, &disk) != KEEL_OK)
        return;
    for (size_t k = 0; k < disk.n_doomed; k++) {
        char p[KEEL_PATH_MAX];
        if (keel__path_join(p, sizeof p, s->dir, disk.doomed[k]) !=
                KEEL_OK || access(p, F_OK) == 0)
            memmove(disk.doomed[n++], disk.doomed[k], KEEL_NAME_MAX);
    }
    if (n < disk.n_doomed && state_is_ours(s, &disk) &&
        keel__ckpt_state_write(s, disk.doomed, n) != KEEL_OK)
        keel__log(KEEL_LOG_WARN, "%s (its \"# keel: delete=\" lines stay "
                  "until the next save)", keel_last_error());
    keel__ckpt_state_free(&disk);
}
