/* keel/log.h - where keel's progress lines go. libkeel never prints: it hands
 * each line to a process-wide handler that the program installs (the keel CLI
 * prints to stderr). With no handler, lines are dropped. */
#ifndef KEEL_LOG_H
#define KEEL_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum keel_log_level {
    KEEL_LOG_DEBUG = 0,
    KEEL_LOG_INFO,
    KEEL_LOG_WARN,
    KEEL_LOG_ERROR
} keel_log_level;

/* msg is borrowed for the call; it has no trailing newline. The handler may
 * run on any keel thread (background saver, heartbeat) and must be safe for
 * that. */
typedef void (*keel_log_fn)(void *ctx, keel_log_level level, const char *msg);

/* Install (or with fn NULL remove) the process-wide handler; lines below
 * min_level are dropped before formatting. Cannot fail. */
void keel_log_set_handler(keel_log_fn fn, void *ctx, keel_log_level min_level);

/* Short lowercase name of a level ("info"); never NULL. */
const char *keel_log_level_name(keel_log_level level);

#ifdef __cplusplus
}
#endif
#endif
