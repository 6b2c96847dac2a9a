/* defaults.h - the timings several modules default to, in one place, so a
 * session, a hook and the trainer's config can never disagree. Private to
 * libkeel and the keel command; the public headers document the values. */
#ifndef KEEL_UTIL_DEFAULTS_H
#define KEEL_UTIL_DEFAULTS_H

/* Retry and poll interval while waiting for something to appear (a
 * session, the chief, a step): recovery_wait_ms, backoff_ms, poll_ms,
 * cluster.ready_retry_ms. */
#define KEEL__DEFAULT_RETRY_MS 50
/* How long stopping waits for threads to finish (TF1's
 * stop_grace_period_secs). */
#define KEEL__DEFAULT_STOP_GRACE_SECS 120
/* How long a worker waits for a session the chief initializes
 * (SessionManager max_wait_secs): a cluster's start-up, minutes. */
#define KEEL__DEFAULT_MAX_WAIT_SECS 300

/* A default as the string the config table wants: KEEL__XSTR(KEEL__...). */
#define KEEL__STR(x) #x
#define KEEL__XSTR(x) KEEL__STR(x)

#endif
