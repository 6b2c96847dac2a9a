/* keel/cluster.h - the cluster table (which tasks exist, where they listen,
 * which one this process is) read from TF_CONFIG, Slurm's environment or
 * explicit lists, and CURVE key generation for the cluster's sockets.
 * The wire protocol and the servers are internal to libkeel. */
#ifndef KEEL_CLUSTER_H
#define KEEL_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Task types (TF job names). "master" in TF_CONFIG is read as chief. */
typedef enum keel_task_type {
    KEEL_TASK_NONE = 0,      /* no task set (local mode) */
    KEEL_TASK_CHIEF,
    KEEL_TASK_WORKER,
    KEEL_TASK_PS,
    KEEL_TASK_EVALUATOR      /* runs beside the cluster, not part of it */
} keel_task_type;
#define KEEL_TASK_TYPE_COUNT 5

typedef enum keel_cluster_mode {
    KEEL_CLUSTER_SYNC = 0,   /* SyncReplicas: aggregate, then apply */
    KEEL_CLUSTER_ASYNC       /* every push is applied as it comes */
} keel_cluster_mode;

#define KEEL_ADDR_MAX 262            /* "host:port" incl. NUL */
#define KEEL_TF_CONFIG_MAX (1 << 20) /* bytes of TF_CONFIG accepted */

/* The cluster table plus this process's role. Opaque; not thread-safe. */
typedef struct keel_cluster_spec keel_cluster_spec;

/* "chief", "worker", "ps", "evaluator" ("none" for KEEL_TASK_NONE); static,
 * never NULL. */
const char *keel_task_type_name(keel_task_type t);
/* Parse a task type name ("master" is chief). KEEL_EINVAL when unknown. */
keel_status keel_task_type_from_name(const char *name, keel_task_type *out);

/* An empty spec (local mode: no tasks, no role). Caller owns *out:
 * keel_cluster_spec_free(). */
keel_status keel_cluster_spec_new(keel_cluster_spec **out);
void keel_cluster_spec_free(keel_cluster_spec *spec);

/* Parse TF_CONFIG JSON text (at most KEEL_TF_CONFIG_MAX bytes). Every
 * problem found is listed in the one KEEL_EINVAL message ("TF_CONFIG: 3
 * problems: ...; ...; ..."). A missing "cluster" key is local mode (task
 * must then be worker 0 or absent). Optional keel keys: "mode" ("sync" |
 * "async"), "replicas_to_aggregate", "total_num_replicas" (integers >= 1)
 * and "model_dir" (string). Caller owns *out. */
keel_status keel_cluster_spec_from_tf_config(const char *json,
                                             keel_cluster_spec **out);
/* The same from the TF_CONFIG environment variable; unset or empty gives
 * a local-mode spec. */
keel_status keel_cluster_spec_from_env(keel_cluster_spec **out);

/* Slurm: reads SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS),
 * SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) and
 * SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE; else tasks are
 * spread evenly in block order). The first num_ps ranks are ps, the rest
 * workers (worker 0 is chief); task k on a host listens on port_base + k. */
typedef struct keel_cluster_slurm_config {
    /* set by keel_cluster_slurm_config_init() */
    uint32_t struct_size;
    int num_ps;              /* >= 0; default 1 */
    int port_base;           /* default (and 0) 8888 */
    char *const *env;        /* "K=V" list, NULL-terminated; NULL: environ */
} keel_cluster_slurm_config;
/* The defaults above. Cannot fail. */
void keel_cluster_slurm_config_init(keel_cluster_slurm_config *opt);
keel_status keel_cluster_spec_from_slurm(
    const keel_cluster_slurm_config *opt, keel_cluster_spec **out);

/* Expand a Slurm host list ("node[01-04,07],gpu2") into a NUL-separated
 * list in buf ("node01\0node02\0..."), count in *n. KEEL_EINVAL naming the
 * problem for malformed lists; at most 65536 hosts. */
keel_status keel_cluster_expand_hostlist(const char *list, char *buf,
                                         size_t size, size_t *n);

/* Explicit tables (the INI [cluster] section): append the comma-separated
 * "host:port" list to the job of that type. Addresses are checked by
 * keel_cluster_spec_validate(), not here (only syntax-free appending). */
keel_status keel_cluster_spec_add_list(keel_cluster_spec *spec,
                                       keel_task_type type,
                                       const char *list);
/* This process's role. */
keel_status keel_cluster_spec_set_task(keel_cluster_spec *spec,
                                       keel_task_type type, int index);
void keel_cluster_spec_set_mode(keel_cluster_spec *spec,
                                keel_cluster_mode mode);
/* 0 means "the number of worker replicas" (chief + workers). */
void keel_cluster_spec_set_replicas(keel_cluster_spec *spec,
                                    int replicas_to_aggregate,
                                    int total_num_replicas);

/* Check the whole spec: addresses (host non-empty, port 1..65535), no
 * empty or duplicate addresses, at most one chief and one evaluator, the
 * task in range, the replica counts. KEEL_EINVAL lists every problem. */
keel_status keel_cluster_spec_validate(const keel_cluster_spec *spec);

/* Accessors; cannot fail. */
size_t keel_cluster_spec_num_tasks(const keel_cluster_spec *spec,
                                   keel_task_type type);
/* "host:port" of a task, or NULL. Borrowed until the spec is freed. */
const char *keel_cluster_spec_address(const keel_cluster_spec *spec,
                                      keel_task_type type, int index);
keel_task_type keel_cluster_spec_task_type(const keel_cluster_spec *spec);
int keel_cluster_spec_task_index(const keel_cluster_spec *spec);
/* 1 for the chief task, or worker 0 when there is no chief job; also 1 in
 * local mode. */
int keel_cluster_spec_is_chief(const keel_cluster_spec *spec);
/* 1 when this process's task is a parameter server (it runs
 * keel_ps_run, keel/distributed.h), else 0 (also in local mode). */
int keel_cluster_spec_is_ps(const keel_cluster_spec *spec);
/* 1 when the spec has no tasks at all. */
int keel_cluster_spec_is_local(const keel_cluster_spec *spec);
/* chief + workers (the evaluator does not count). */
int keel_cluster_spec_num_replicas(const keel_cluster_spec *spec);
/* This task's place among the training replicas, 0 ..
 * num_replicas - 1: 0 for the chief, worker i is i + 1 when the cluster
 * has a chief and i when it has none (worker 0 is then the chief); -1
 * for a ps or evaluator task; 0 in local mode. With
 * keel_step_global_step it tells a replica which slice of the data a step
 * reads, so a restarted replica resumes its data position. */
int keel_cluster_spec_replica_index(const keel_cluster_spec *spec);

keel_cluster_mode keel_cluster_spec_mode(const keel_cluster_spec *spec);
int keel_cluster_spec_replicas_to_aggregate(const keel_cluster_spec *spec);
int keel_cluster_spec_total_num_replicas(const keel_cluster_spec *spec);
/* model_dir from TF_CONFIG or NULL; borrowed. */
const char *keel_cluster_spec_model_dir(const keel_cluster_spec *spec);

/* Human-readable multi-line summary (for `keel config check`). KEEL_EINVAL
 * when buf is too small. */
keel_status keel_cluster_spec_format(const keel_cluster_spec *spec,
                                     char *buf, size_t size);
/* TF_CONFIG JSON for the given task of this cluster (what a launcher puts
 * in each child's environment). KEEL_EINVAL for an unknown task or when buf
 * is too small. */
keel_status keel_cluster_spec_to_tf_config(const keel_cluster_spec *spec,
                                           keel_task_type type, int index,
                                           char *buf, size_t size);

/* ---- security ----------------------------------------------------------- */

/* Write a CURVE key pair: DIR/NAME.key (Z85 public key, mode 0644) and
 * DIR/NAME.key_secret (mode 0600), each durably (temp file, fsync,
 * rename). DIR is created if needed; existing keys are never overwritten
 * (KEEL_EINVAL). NAME is one segment of [A-Za-z0-9_.-]. If public_out is
 * not NULL it receives the 40-character public key (size >= 41). */
keel_status keel_cluster_keygen(const char *dir, const char *name,
                                char *public_out);

#ifdef __cplusplus
}
#endif
#endif
