/* spec_int.h - private to cluster/: the fields of a keel_cluster_spec,
 * for the files that fill and write them (spec.c: the model, its queries
 * and validation; tfconfig.c: TF_CONFIG in and out). Every other file
 * uses the public accessors. */
#ifndef KEEL_CLUSTER_SPEC_INT_H
#define KEEL_CLUSTER_SPEC_INT_H

#include <stddef.h>

#include <keel/cluster.h>

struct keel_cluster_spec {
    char **addr[KEEL_TASK_TYPE_COUNT];
    size_t n[KEEL_TASK_TYPE_COUNT];
    size_t cap[KEEL_TASK_TYPE_COUNT];
    keel_task_type task;
    int index;
    keel_cluster_mode mode;
    int replicas_to_aggregate;   /* 0: default */
    int total_num_replicas;      /* 0: default */
    char *model_dir;
};

/* 1 for a task type a job can have (chief, worker, ps, evaluator). */
static inline int
keel__task_type_ok(keel_task_type t)
{
    return (int)t > KEEL_TASK_NONE && (int)t < KEEL_TASK_TYPE_COUNT;
}

#endif
