/* hooks_int.h - what the standard hooks (hooks/basic.c, summary.c,
 * ckpt_hook.c) share: building a keel_hook and its value names. Internal
 * to libkeel. */
#ifndef KEEL_HOOKS_INT_H
#define KEEL_HOOKS_INT_H

#include <stddef.h>

#include <keel/hooks.h>
#include <keel/session.h>

/* A zeroed context of size bytes in *ctx (the caller frees it); ENOMEM
 * names who. */
keel_status keel__hooks_new_ctx(void **ctx, size_t size, const char *who);

/* *out zeroed (struct_size set), then its name (static storage), ctx,
 * kind and destroy (called on ctx by keel_hook_release); the caller sets
 * the callbacks and flags. */
void keel__hooks_fill(keel_hook *out, const char *name, void *ctx,
                      keel_hook_kind kind, void (*destroy)(void *));

/* Copy n value names (the caller has checked n and that names is not
 * NULL) into dst; a NULL name or one of KEEL_VALUE_NAME_MAX characters or
 * more is KEEL_EINVAL naming who and its index, with dst partly written. */
keel_status keel__hooks_copy_names(char (*dst)[KEEL_VALUE_NAME_MAX],
                                   const char *const *names, size_t n,
                                   const char *who);

/* Request each of the n names for the step about to run (the first
 * failure is returned). */
keel_status keel__hooks_request_names(keel_run_context *rc,
                                      char (*names)[KEEL_VALUE_NAME_MAX],
                                      size_t n);

#endif
