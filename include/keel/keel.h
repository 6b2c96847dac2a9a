/* keel/keel.h - umbrella header of the framework: every public header but
 * those of the trainer application (keel/app.h: config, job and export;
 * it includes this one) and of the local cluster launcher (keel/launch.h).
 *
 * Process-wide state in libkeel (nothing else is global):
 *   - the thread-local error message (keel_last_error),
 *   - the log handler (keel_log_set_handler),
 *   - the OpenBLAS thread count, set by train/ only on request,
 *   - the SIGTERM/SIGINT flag, once keel_session_install_signal_handlers(),
 *   - the event-writer cache that lets hooks writing to one directory share
 *     one TensorBoard event file (as TF's FileWriterCache). */
#ifndef KEEL_KEEL_H
#define KEEL_KEEL_H

#include <keel/version.h>
#include <keel/status.h>
#include <keel/log.h>
#include <keel/tensor.h>
#include <keel/optimizer.h>
#include <keel/checkpoint.h>
#include <keel/events.h>
#include <keel/hooks.h>
#include <keel/session.h>
#include <keel/train.h>
#include <keel/kfac.h>
#include <keel/cluster.h>
#include <keel/distributed.h>
#include <keel/supervise.h>
#include <keel/kfac_dist.h>

#endif
