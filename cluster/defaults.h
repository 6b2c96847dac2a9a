/* defaults.h - private to libkeel: the defaults of a cluster task's
 * options in one place. keel_cluster_config_init (cluster/options.c) and
 * the INI keys of `keel train` (app/config.c, as strings through
 * KEEL__XSTR) both take them from here; a default the session shares is
 * util/defaults.h's. */
#ifndef KEEL_CLUSTER_DEFAULTS_H
#define KEEL_CLUSTER_DEFAULTS_H

#include "../util/defaults.h"

#define KEEL__CLUSTER_HEARTBEAT_MS 200
#define KEEL__CLUSTER_DEAD_AFTER_MS 5000
#define KEEL__CLUSTER_STALL_WARN_SECS 10
#define KEEL__CLUSTER_STEP_TIMEOUT_SECS 3600
#define KEEL__CLUSTER_ORPHAN_SECS 600
#define KEEL__CLUSTER_READY_RETRY_MS KEEL__DEFAULT_RETRY_MS
#define KEEL__CLUSTER_MAX_WAIT_SECS 7200
#define KEEL__CLUSTER_SEND_BUFFER_KIB 512
#define KEEL__CLUSTER_SLURM_NUM_PS 1
#define KEEL__CLUSTER_SLURM_PORT_BASE 8888
/* async: training replicas (chief + workers, the ones that join later
 * included) a ps keeps track of; a worker index beyond is refused */
#define KEEL__CLUSTER_MAX_REPLICAS 1024

#endif
