/* fuzz_tfconfig.c - TF_CONFIG JSON to a cluster spec, then validation,
 * formatting and the round trip back to TF_CONFIG for every task. */
#include <config.h>

#include <stdlib.h>

#include <keel/cluster.h>
#include "fuzz_util.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = fuzz_strndup(data, size);
    keel_cluster_spec *spec = NULL;
    if (keel_cluster_spec_from_tf_config(json, &spec) == KEEL_OK) {
        static char buf[1 << 16];
        (void)keel_cluster_spec_validate(spec);
        (void)keel_cluster_spec_format(spec, buf, sizeof buf);
        for (int t = 0; t < KEEL_TASK_TYPE_COUNT; t++) {
            int n = keel_cluster_spec_num_tasks(spec, (keel_task_type)t);
            for (int i = 0; i < n && i < 4; i++)
                (void)keel_cluster_spec_to_tf_config(spec, (keel_task_type)t,
                                                     i, buf, sizeof buf);
        }
        keel_cluster_spec_free(spec);
    }
    free(json);
    return 0;
}
