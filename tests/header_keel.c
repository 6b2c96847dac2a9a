/* header_keel.c - keel/keel.h on its own (tests/header_keel.sh compiles
 * this file with -Wall -Wextra -Werror): the framework umbrella compiles
 * by itself and declares nothing of the trainer application (keel/app.h:
 * config, job, export) or of the local cluster launcher (keel/launch.h). */
#include <keel/keel.h>

#if defined(KEEL_APP_H) || defined(KEEL_CONFIG_H) || defined(KEEL_JOB_H) || \
    defined(KEEL_EXPORT_H) || defined(KEEL_LAUNCH_H)
#error "keel/keel.h includes a header of the trainer app or the launcher"
#endif

/* Each declaration below is an error where keel/keel.h already declares
 * the name, as a type or as a function. */
typedef int keel_config;
typedef int keel_job_config;
typedef int keel_job_result;
typedef int keel_job_progress;
typedef int keel_eval_result;
typedef int keel_evaluator_config;
typedef int keel_inference;
typedef int keel_export_format;
typedef int keel_launch;
typedef int keel_launch_config;
typedef int keel_launch_event;
int keel_config_new, keel_config_load, keel_job_train, keel_job_eval,
    keel_job_run_evaluator, keel_inference_open, keel_export,
    keel_launch_new, keel_launch_start;

/* The framework is there: a session, a hook, a checkpoint, a cluster. */
int
header_keel_framework(void)
{
    keel_hook h;
    keel_cluster_spec *spec = NULL;
    keel_hook_init(&h);
    keel_cluster_spec_free(spec);
    return (int)sizeof(keel_session *) + (int)sizeof(keel_ckpt_entry) +
           (KEEL_VERSION_MAJOR >= 0);
}
