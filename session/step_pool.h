/* step_pool.h - the session's seam for the owner of a mirrored step: the
 * threads the session runs its replicas on, idle between two steps. */
#ifndef KEEL_SESSION_STEP_POOL_H
#define KEEL_SESSION_STEP_POOL_H

#include <keel/session.h>
#include "../numeric/numeric_int.h"

/* The pool the session runs st's replicas on (borrowed: valid while the
 * session lives), NULL with one replica. It is idle while the session's
 * updater runs, which may spread the update over it
 * (keel__optimizer_apply_pooled). Cannot fail. */
keel__pool *keel__step_pool(const keel_step *st);

#endif
