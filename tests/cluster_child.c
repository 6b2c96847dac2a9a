/* cluster_child.c - a small training program of one cluster task for
 * tests/it_cluster, written against the public API like a user's own
 * program: the role from TF_CONFIG (a ps serves, a chief or worker trains
 * y = 3x + 1 with SGD through MonitoredTrainingSession, the chief
 * checkpointing into CKPT_DIR), SIGTERM/SIGINT handlers installed. With
 * CHILD_STOP_AT=N in its environment a replica's own hook in session.hooks
 * requests a stop once the global step reaches N (an early-stopping hook).
 * A replica prints "step N" after every step and "final_step N reason R"
 * at the end; every task exits 0 on a clean ending, 1 otherwise.
 * usage: cluster_child CKPT_DIR LAST_STEP */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/keel.h>
#include "linefit.h"

typedef struct child {
    int64_t position;          /* data position: next sample index */
    int64_t stop_at;           /* 0: never */
} child;

static keel_status
step(void *ctx, keel_step *st)
{
    child *c = ctx;
    linefit_grads(st, c->position++);
    return KEEL_OK;
}

/* The early-stopping hook: prints each step, stops at stop_at. */
static keel_status
after_run(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    child *c = ctx;
    int64_t after = keel_run_values_step_after(v);
    printf("step %lld\n", (long long)after);
    fflush(stdout);
    if (c->stop_at > 0 && after >= c->stop_at)
        keel_run_context_request_stop(rc, "cluster_child: CHILD_STOP_AT "
                                      "reached");
    return KEEL_OK;
}

static void
log_line(void *ctx, keel_log_level level, const char *msg)
{
    (void)ctx;
    fprintf(stderr, "[%s] %s\n", keel_log_level_name(level), msg);
}

static keel_status
train(keel_cluster_spec *spec, keel_cluster_config *copts, keel_vars *vs,
      keel_optimizer *opt, const char *dir, int64_t last_step, child *c)
{
    keel_training_config cfg;
    keel_stop_at_step_hook_config sc;
    keel_hook hooks[2];
    keel_session *s = NULL;
    keel_status st;
    memset(hooks, 0, sizeof hooks);
    keel_stop_at_step_hook_config_init(&sc);
    sc.last_step = last_step;
    if ((st = keel_stop_at_step_hook_new(&sc, &hooks[0])) != KEEL_OK)
        return st;
    hooks[1].struct_size = sizeof hooks[1];
    hooks[1].name = "early_stop";
    hooks[1].ctx = c;
    hooks[1].after_run = after_run;
    keel_training_config_init(&cfg);
    cfg.session.manager.vars = vs;
    cfg.session.step = step;
    cfg.session.step_ctx = c;
    cfg.session.updater = keel_optimizer_updater(opt);
    cfg.session.hooks = hooks;
    cfg.session.n_hooks = 2;
    cfg.session.manager.checkpoint_dir = dir;
    cfg.save_checkpoint_steps = 1000000;
    cfg.save_checkpoint_secs = 0;
    cfg.summary_dir = NULL;
    cfg.log_step_count_steps = 0;
    cfg.save_summaries_steps = 0;
    cfg.cluster = spec;
    cfg.cluster_config = copts;
    st = keel_training_session_new(&cfg, &s);
    if (st == KEEL_OK)
        st = keel_session_train(s);
    if (st == KEEL_OK)
        st = keel_session_close(s);
    if (s != NULL) {
        printf("final_step %lld reason %s\n",
               (long long)keel_session_global_step(s),
               keel_end_reason_name(keel_session_end_reason(s)));
        fflush(stdout);
    }
    keel_session_free(s);
    keel_hook_release(&hooks[0]);
    return st;
}

int
main(int argc, char **argv)
{
    keel_vars *vs = NULL;
    keel_optimizer *opt = NULL;
    keel_optimizer_config oc;
    keel_cluster_config copts;
    keel_cluster_spec *spec = NULL;
    child c = { 0, 0 };
    keel_status st;
    if (argc < 3) {
        fprintf(stderr, "usage: cluster_child CKPT_DIR LAST_STEP\n");
        return 2;
    }
    if (getenv("CHILD_STOP_AT") != NULL)
        c.stop_at = strtoll(getenv("CHILD_STOP_AT"), NULL, 10);
    keel_log_set_handler(log_line, NULL, KEEL_LOG_INFO);
    keel_optimizer_config_init(&oc, KEEL_OPT_SGD);
    oc.schedule.learning_rate = 0.05;
    keel_cluster_config_init(&copts);
    copts.optimizer = &oc;
    st = keel_vars_new(&vs);
    if (st == KEEL_OK)
        st = keel_vars_create(vs, "w", 0, NULL, KEEL_VAR_TRAINABLE, NULL);
    if (st == KEEL_OK)
        st = keel_vars_create(vs, "b", 0, NULL, KEEL_VAR_TRAINABLE, NULL);
    if (st == KEEL_OK)
        st = keel_cluster_spec_detect(&copts, &spec);
    if (st == KEEL_OK)
        st = keel_session_install_signal_handlers();
    if (st == KEEL_OK && keel_cluster_spec_is_ps(spec)) {
        st = keel_ps_run(spec, vs, &copts);
    } else {
        if (st == KEEL_OK)
            st = keel_optimizer_new(&oc, &opt);
        if (st == KEEL_OK)
            st = keel_optimizer_prepare(opt, vs);
        if (st == KEEL_OK)
            st = train(spec, &copts, vs, opt, argv[1],
                       strtoll(argv[2], NULL, 10), &c);
    }
    if (st != KEEL_OK)
        fprintf(stderr, "cluster_child: %s: %s\n", keel_status_name(st),
                keel_last_error());
    keel_optimizer_free(opt);
    keel_cluster_spec_free(spec);
    keel_vars_free(vs);
    return st == KEEL_OK ? 0 : 1;
}
