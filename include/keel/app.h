/* keel/app.h - umbrella header of keel's own trainer application, built on
 * the framework keel/keel.h declares: the INI job configuration
 * (keel/config.h), the job and the evaluator (keel/job.h), and inference
 * and export of a checkpoint's model (keel/export.h). The local cluster
 * launcher has its own header, keel/launch.h. A program that only uses
 * the framework (sessions, hooks, checkpoints, clusters) needs neither. */
#ifndef KEEL_APP_H
#define KEEL_APP_H

#include <keel/keel.h>
#include <keel/config.h>
#include <keel/job.h>
#include <keel/export.h>

#endif
