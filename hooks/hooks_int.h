/* hooks_int.h - what the standard hooks (hooks/basic.c, summary.c,
 * ckpt_hook.c) share: building a keel_hook and its value names. Internal
 * to libkeel. */
#ifndef KEEL_HOOKS_INT_H
#define KEEL_HOOKS_INT_H

#include <stddef.h>

#include <keel/hooks.h>
#include <keel/session.h>

/* A zeroed context of size bytes (the caller frees it), or NULL with
 * KEEL_ENOMEM set naming who. A constructor checks its whole config first
 * (names, timer period) so that after this only copying into the context
 * can fail. */
void *keel__hooks_new_ctx(size_t size, const char *who);

/* *out zeroed (struct_size set), then its name (static storage), ctx,
 * kind and destroy (called on ctx by keel_hook_release); the caller sets
 * the callbacks and flags. */
void keel__hooks_fill(keel_hook *out, const char *name, void *ctx,
                      keel_hook_kind kind, void (*destroy)(void *));

/* The most value names a hook records. */
#define KEEL__HOOKS_NAMES_MAX 16

/* A config's value names, checked before anything is allocated: names not
 * NULL, n 1..KEEL__HOOKS_NAMES_MAX, each name not NULL and shorter than
 * KEEL_VALUE_NAME_MAX; otherwise KEEL_EINVAL naming who and the fault. */
keel_status keel__hooks_check_names(const char *const *names, size_t n,
                                    const char *who);

/* Copy n names that keel__hooks_check_names accepted into dst. */
void keel__hooks_copy_names(char (*dst)[KEEL_VALUE_NAME_MAX],
                            const char *const *names, size_t n);

/* Request each of the n names for the step about to run (the first
 * failure is returned). */
keel_status keel__hooks_request_names(keel_run_context *rc,
                                      char (*names)[KEEL_VALUE_NAME_MAX],
                                      size_t n);

#endif
