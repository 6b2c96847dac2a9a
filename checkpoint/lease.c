/* lease.c - read leases on checkpoint files: a reader (the evaluator)
 * creates `.lease-<pid>.<seq>-<file>` beside the file while it reads, and
 * the saver's retention defers deleting a leased file (`.deferred-<file>`)
 * until a later save finds it unleased. Leases of dead processes are stale
 * and ignored (and removed). Same-host readers only: liveness is kill(pid,
 * 0). Lease and marker files are not part of any checkpoint. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"

#define LEASE_PREFIX ".lease-"
#define DEFERRED_PREFIX ".deferred-"

struct keel_ckpt_lease {
    char path[KEEL_PATH_MAX];      /* the lease file */
};

/* A file name a lease may name: one path segment, not hidden. */
static int
lease_file_ok(const char *file)
{
    return file != NULL && file[0] != '\0' && file[0] != '.' &&
           strchr(file, '/') == NULL && strlen(file) < KEEL_NAME_MAX;
}

/* Parse ".lease-<pid>.<seq>-<file>": the pid and a pointer to <file>, or 0
 * when name is not a lease. */
static int
parse_lease(const char *name, long *pid, const char **file)
{
    const char *p = name + sizeof LEASE_PREFIX - 1;
    char *end;
    long v;
    if (strncmp(name, LEASE_PREFIX, sizeof LEASE_PREFIX - 1) != 0)
        return 0;
    errno = 0;
    v = strtol(p, &end, 10);
    if (errno != 0 || end == p || v <= 0 || *end != '.')
        return 0;
    p = end + 1;
    while (*p >= '0' && *p <= '9')
        p++;
    if (p == end + 1 || *p != '-' || p[1] == '\0')
        return 0;
    *pid = v;
    *file = p + 1;
    return 1;
}

static int
pid_is_alive(long pid)
{
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

keel_status
keel_ckpt_lease_take(const char *dir, const char *file,
                     keel_ckpt_lease **out)
{
    keel_ckpt_lease *l;
    char name[KEEL_NAME_MAX + 64];
    uint64_t seq;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "lease: out is NULL");
    *out = NULL;
    if (dir == NULL || dir[0] == '\0' || !lease_file_ok(file))
        return keel__fail(KEEL_EINVAL, "lease: '%s' in '%s' is not a "
                          "checkpoint file name (one segment, not hidden)",
                          file != NULL ? file : "(null)",
                          dir != NULL ? dir : "(null)");
    l = calloc(1, sizeof *l);
    if (l == NULL)
        return keel__fail(KEEL_ENOMEM, "lease of %s", file);
    /* <seq> makes several leases of one process distinct without any
     * process-wide counter: start from the clock, step past taken names */
    seq = (uint64_t)keel__now_mono_ns();
    for (int tries = 0;; tries++, seq++) {
        int fd;
        snprintf(name, sizeof name, LEASE_PREFIX "%ld.%llu-%s",
                 (long)getpid(), (unsigned long long)seq, file);
        st = keel__path_join(l->path, sizeof l->path, dir, name);
        if (st != KEEL_OK) {
            free(l);
            return keel__wrap(st, "lease of %s", file);
        }
        /* O_EXCL: the lease exists whole or not at all (it is empty) */
        fd = open(l->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            close(fd);
            break;
        }
        if (errno != EEXIST || tries >= 1000) {
            int e = errno;
            free(l);
            return keel__fail(KEEL_EIO, "lease: create %s: %s", name,
                              strerror(e));
        }
    }
    *out = l;
    return KEEL_OK;
}

void
keel_ckpt_lease_release(keel_ckpt_lease *lease)
{
    if (lease == NULL)
        return;
    /* nothing to report: a lease left behind is stale once we exit */
    if (unlink(lease->path) != 0 && errno != ENOENT)
        keel__log(KEEL_LOG_WARN, "lease: remove %s: %s", lease->path,
                  strerror(errno));
    free(lease);
}

const char *
keel_ckpt_lease_path(const keel_ckpt_lease *lease)
{
    return lease != NULL ? lease->path : "";
}

/* Walk dir's leases: *is_leased for file (NULL: any), removing stale ones
 * of dead processes. */
static keel_status
scan_leases(const char *dir, const char *file, int *is_leased)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    *is_leased = 0;
    if (d == NULL) {
        if (errno == ENOENT)
            return KEEL_OK;
        return keel__fail(KEEL_EIO, "lease: open directory %s: %s", dir,
                          strerror(errno));
    }
    while ((e = readdir(d)) != NULL) {
        long pid;
        const char *target;
        if (!parse_lease(e->d_name, &pid, &target))
            continue;
        if (!pid_is_alive(pid)) {
            char p[KEEL_PATH_MAX];
            if (keel__path_join(p, sizeof p, dir, e->d_name) == KEEL_OK &&
                unlink(p) == 0)
                keel__log(KEEL_LOG_INFO, "lease: removed %s (process %ld "
                          "is gone)", p, pid);
            continue;
        }
        if (file == NULL || strcmp(target, file) == 0)
            *is_leased = 1;
    }
    closedir(d);
    return KEEL_OK;
}

keel_status
keel_ckpt_lease_is_leased(const char *dir, const char *file, int *is_leased)
{
    if (is_leased == NULL || dir == NULL || !lease_file_ok(file))
        return keel__fail(KEEL_EINVAL, "lease: bad argument (dir '%s', "
                          "file '%s')", dir != NULL ? dir : "(null)",
                          file != NULL ? file : "(null)");
    return scan_leases(dir, file, is_leased);
}

/* ---- the saver's side --------------------------------------------------- */

static int
is_listed(const ck_state *st, const char *file)
{
    for (size_t i = 0; st != NULL && i < st->n; i++) {
        const char *nm = st->e[i].name;
        const char *sl = strrchr(nm, '/');
        if (strcmp(sl != NULL ? sl + 1 : nm, file) == 0)
            return 1;
    }
    return 0;
}

int
keel__ckpt_lease_defer(const char *dir, const char *file)
{
    char p[KEEL_PATH_MAX], name[KEEL_NAME_MAX + 16];
    int leased = 0, fd;
    if (!lease_file_ok(file) || scan_leases(dir, file, &leased) != KEEL_OK ||
        !leased)
        return 0;
    snprintf(name, sizeof name, DEFERRED_PREFIX "%s", file);
    if (keel__path_join(p, sizeof p, dir, name) != KEEL_OK)
        return 0;
    fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        keel__log(KEEL_LOG_WARN, "retention: cannot record %s: %s; %s/%s "
                  "stays until it is unleased and a later save finds it",
                  p, strerror(errno), dir, file);
        return 1;   // still leased: not deleted now
    }
    close(fd);
    keel__log(KEEL_LOG_INFO, "retention: %s/%s is leased by a reader; "
              "deleting it once released", dir, file);
    return 1;
}

int
keel__ckpt_is_deferred(const char *dir, const char *file)
{
    char p[KEEL_PATH_MAX], name[KEEL_NAME_MAX + 16];
    struct stat sb;
    snprintf(name, sizeof name, DEFERRED_PREFIX "%s", file);
    return keel__path_join(p, sizeof p, dir, name) == KEEL_OK &&
           stat(p, &sb) == 0;
}

void
keel__ckpt_lease_sweep(const char *dir, const ck_state *listed)
{
    DIR *d;
    struct dirent *e;
    int any;
    /* removes stale leases as a side effect */
    if (scan_leases(dir, NULL, &any) != KEEL_OK)
        return;
    d = opendir(dir);
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        const char *file = e->d_name + sizeof DEFERRED_PREFIX - 1;
        char marker[KEEL_PATH_MAX], target[KEEL_PATH_MAX];
        int leased = 0;
        if (strncmp(e->d_name, DEFERRED_PREFIX,
                    sizeof DEFERRED_PREFIX - 1) != 0 ||
            !lease_file_ok(file))
            continue;
        if (keel__path_join(marker, sizeof marker, dir, e->d_name) !=
                KEEL_OK ||
            keel__path_join(target, sizeof target, dir, file) != KEEL_OK)
            continue;
        if (is_listed(listed, file)) {
            /* listed again (the same step was saved anew): it is live */
            unlink(marker);
            continue;
        }
        if (scan_leases(dir, file, &leased) != KEEL_OK || leased)
            continue;
        if (unlink(target) != 0 && errno != ENOENT) {
            keel__log(KEEL_LOG_WARN, "retention: cannot remove %s: %s",
                      target, strerror(errno));
            continue;
        }
        keel__ckpt_unlink_shards(target);
        unlink(marker);
        keel__log(KEEL_LOG_INFO, "retention: removed %s (its lease was "
                  "released)", target);
    }
    closedir(d);
}
