/* fuzz_slurm.c - the Slurm host list and the spec built from a Slurm
 * environment. Input: byte 0 = number of ps (mod 4); the rest is split at
 * '\n' into SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE, SLURM_NTASKS and
 * SLURM_PROCID (missing ones stay unset). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/cluster.h>
#include "fuzz_util.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const keys[] = { "SLURM_JOB_NODELIST",
        "SLURM_TASKS_PER_NODE", "SLURM_NTASKS", "SLURM_PROCID" };
    static char hosts[(size_t)65536 * 32];
    char *text, *p, *env_store[4];
    char *env[5] = { NULL };
    keel_cluster_slurm_config opt;
    keel_cluster_spec *spec = NULL;
    size_t n_env = 0, n_hosts;
    if (size < 1)
        return 0;
    text = fuzz_strndup(data + 1, size - 1);
    p = text;
    for (int k = 0; k < 4 && p != NULL; k++) {
        char *nl = strchr(p, '\n');
        size_t len;
        if (nl != NULL)
            *nl = '\0';
        len = strlen(keys[k]) + 1 + strlen(p) + 1;
        env_store[n_env] = malloc(len);
        if (env_store[n_env] == NULL)
            abort();
        snprintf(env_store[n_env], len, "%s=%s", keys[k], p);
        env[n_env] = env_store[n_env];
        n_env++;
        if (k == 0)
            (void)keel_cluster_expand_hostlist(p, hosts, sizeof hosts,
                                               &n_hosts);
        p = nl != NULL ? nl + 1 : NULL;
    }
    keel_cluster_slurm_config_init(&opt);
    opt.num_ps = data[0] % 4;
    opt.env = env;
    if (keel_cluster_spec_from_slurm(&opt, &spec) == KEEL_OK) {
        (void)keel_cluster_spec_validate(spec);
        keel_cluster_spec_free(spec);
    }
    for (size_t i = 0; i < n_env; i++)
        free(env_store[i]);
    free(text);
    return 0;
}
