/* ps_skel.h - a parameter server without an optimizer, for tests and
 * benchmarks of the wire protocol: PUSH sums the gradients into the
 * variables, INIT assigns them, PULL returns them, HELLO answers READY at
 * once. */
#ifndef KEEL_PS_SKEL_H
#define KEEL_PS_SKEL_H

#include "../cluster/cluster_int.h"

/* The keel__ps_config serve function (serve_ctx unused). */
keel_status ps_skel_serve(void *ctx, keel__ps *ps, keel__wire_msg *req);

#endif
