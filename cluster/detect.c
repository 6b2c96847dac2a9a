/* detect.c - the spec this process's environment describes: TF_CONFIG
 * (tfconfig.c), else Slurm's variables (slurm.c), else a local spec; a
 * cluster of only a chief is local too (TF's master ''). */
#include <config.h>

#include <stdlib.h>

#include <keel/cluster.h>
#include <keel/distributed.h>
#include "util.h"

keel_status
keel_cluster_spec_detect(const keel_cluster_config *opts,
                         keel_cluster_spec **out)
{
    keel_cluster_spec *spec = NULL;
    const char *tf = getenv("TF_CONFIG");
    keel_cluster_config d;
    keel_status st;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "cluster: out is NULL");
    *out = NULL;
    if (opts == NULL) {
        keel_cluster_config_init(&d);
        opts = &d;
    }
    if (tf != NULL && tf[0] != '\0') {
        st = keel_cluster_spec_from_env(&spec);
    } else if (getenv("SLURM_PROCID") != NULL) {
        keel_cluster_slurm_config so;
        keel_cluster_slurm_config_init(&so);
        so.num_ps = opts->slurm_num_ps;
        so.port_base = opts->slurm_port_base;
        st = keel_cluster_spec_from_slurm(&so, &spec);
    } else {
        st = keel_cluster_spec_new(&spec);
    }
    if (st == KEEL_OK && !keel_cluster_spec_is_local(spec) &&
        keel_cluster_spec_num_tasks(spec, KEEL_TASK_CHIEF) == 1 &&
        keel_cluster_spec_num_tasks(spec, KEEL_TASK_PS) == 0 &&
        keel_cluster_spec_num_tasks(spec, KEEL_TASK_WORKER) == 0 &&
        keel_cluster_spec_task_type(spec) == KEEL_TASK_CHIEF) {
        /* TF: a cluster of one chief is local (master '') */
        keel_cluster_spec_free(spec);
        spec = NULL;
        st = keel_cluster_spec_new(&spec);
    }
    if (st == KEEL_OK)
        st = keel_cluster_spec_validate(spec);
    if (st != KEEL_OK) {
        keel_cluster_spec_free(spec);
        return st;
    }
    *out = spec;
    return KEEL_OK;
}
