/* kfac_dist.c - the trainer's K-FAC on a cluster: the [kfac] and
 * [cluster] keys into the library's distributed K-FAC (keel/kfac_dist.h,
 * supervise/kfac_dist.c), and the replicas' role names keel launch
 * prefixes their lines with. */
#include <config.h>

#include <string.h>

#include <keel/config.h>
#include <keel/job.h>
#include <keel/kfac_dist.h>
#include "util.h"
#include "app_int.h"

int
keel__kfac_dist_roles(const keel_config *cfg)
{
    return strcmp(keel_config_str(cfg, "optimizer.name"), "kfac") == 0 &&
           strcmp(keel_config_str(cfg, "kfac.distributed"), "roles") == 0;
}

/* The library's settings from the config, for replica of replicas. */
static keel_status
dist_config_from(const keel_config *cfg, int replica, int replicas,
                 keel_kfac_dist_config *dc)
{
    keel_status st;
    keel_kfac_dist_config_init(dc);
    st = keel_kfac_distributed_from_name(
        keel_config_str(cfg, "kfac.distributed"), &dc->mode);
    if (st != KEEL_OK)
        return keel__wrap(st, "kfac.distributed");
    dc->replica = replica;
    dc->replicas = replicas;
    dc->kfac_replicas_to_aggregate =
        strcmp(keel_config_str(cfg, "kfac.replicas_to_aggregate"), "kfac")
        == 0;
    dc->gradient_fraction = keel_config_double(cfg, "kfac.gradient_fraction");
    dc->covariance_fraction =
        keel_config_double(cfg, "kfac.covariance_fraction");
    dc->step_timeout_secs =
        keel_config_double(cfg, "cluster.step_timeout_secs");
    dc->seed = (uint64_t)keel_config_int(cfg, "train.seed");
    dc->log_every_steps = keel_config_int(cfg, "hooks.log_every_steps");
    return KEEL_OK;
}

keel_status
keel__kfac_dist_role(const keel_config *cfg, int replica, int replicas,
                     int *role, int *index, int counts[3])
{
    keel_kfac_dist_config dc;
    keel_kfac_role r = KEEL_KFAC_ROLE_GRADIENT;
    keel_status st = dist_config_from(cfg, replica, replicas, &dc);
    if (st == KEEL_OK)
        st = keel_kfac_dist_config_role(&dc, &r, index, counts);
    *role = (int)r;
    return st;
}

const char *
keel__kfac_role_name(int role)
{
    return keel_kfac_role_name((keel_kfac_role)role);
}

keel_status
keel__kfac_dist_add_state(keel_kfac *k, keel_vars *vs)
{
    return keel_kfac_dist_add_state(k, vs);
}

keel_status
keel__kfac_dist_new(const keel_config *cfg, keel_kfac *k, keel_vars *vs,
                    int replica, int replicas, keel__kfac_dist **out)
{
    keel_kfac_dist_config dc;
    keel_status st = dist_config_from(cfg, replica, replicas, &dc);
    *out = NULL;
    return st == KEEL_OK ? keel_kfac_dist_new(&dc, k, vs, out) : st;
}

void
keel__kfac_dist_free(keel__kfac_dist *d)
{
    keel_kfac_dist_free(d);
}

void
keel__kfac_dist_set_backend(keel__kfac_dist *d, keel_cluster_backend *b)
{
    keel_kfac_dist_set_backend(d, b);
}

keel_status
keel_job_replica_role(const keel_config *cfg, int replica, int replicas,
                      char *buf, size_t size)
{
    int role, index;
    keel_status st;
    if (cfg == NULL || buf == NULL)
        return keel__fail(KEEL_EINVAL, "replica role: NULL argument");
    if (!keel__kfac_dist_roles(cfg))
        return keel__fail(KEEL_ENOTFOUND, "the config splits no roles "
                          "(optimizer.name = kfac with kfac.distributed = "
                          "roles does)");
    st = keel__kfac_dist_role(cfg, replica, replicas, &role, &index, NULL);
    if (st == KEEL_OK)
        st = keel__fmt(buf, size, "replica role", "%s.%d",
                       keel__kfac_role_name(role), index);
    return st;
}
