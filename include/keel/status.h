/* keel/status.h - the one error model: a status code per call plus a
 * thread-local message that names what failed (file, key, peer, step).
 * libkeel never prints and never exits; callers decide what to do. */
#ifndef KEEL_STATUS_H
#define KEEL_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Append new codes at the end; never renumber or reuse. */
typedef enum keel_status {
    KEEL_OK = 0,
    KEEL_EINVAL,       /* bad argument or configuration value */
    KEEL_ENOMEM,       /* allocation failed */
    KEEL_EIO,          /* file system or HDF5 failure */
    KEEL_ECORRUPT,     /* a checkpoint, data file or message failed validation */
    KEEL_ETIMEOUT,     /* a peer or operation missed its deadline */
    KEEL_EPEER,        /* a remote task failed for good or sent an error */
    KEEL_EHOOK,        /* a user hook returned failure */
    KEEL_ESTATE,       /* call not valid in the handle's current state */
    KEEL_EINTERNAL,    /* a bug in keel */
    KEEL_ENOTFOUND,    /* a named file, variable or key does not exist */
    KEEL_EABORTED,     /* recoverable: a peer aborted or restarted (retry) */
    KEEL_EUNAVAILABLE, /* recoverable: a peer is unreachable right now (retry) */
    KEEL_EOUTOFRANGE,  /* end of input: the data iterator is exhausted */
    KEEL_ECANCELLED    /* a stop was requested while waiting */
} keel_status;

/* Static English name of a code ("invalid argument"); never NULL. */
const char *keel_status_name(keel_status s);

/* Last failure's detail on this thread; borrowed until the next failure on
 * this thread. Never NULL (empty string when nothing failed yet). */
const char *keel_last_error(void);

/* Nonzero for the error class that makes a MonitoredSession re-create itself
 * and retry the step: KEEL_EABORTED and KEEL_EUNAVAILABLE. */
int keel_status_is_recoverable(keel_status s);

/* Set this thread's message from user code (a hook or step callback that
 * fails), so the session reports the real cause. Returns code. */
keel_status keel_error_set(keel_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
