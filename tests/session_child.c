/* session_child.c - a tiny training program for tests/it_sigterm: fits
 * y = 3x + 1 with SGD through MonitoredTrainingSession on a real checkpoint
 * directory, saving its data position as a checkpoint blob. Prints
 * "start_step N position P", then "running" once past min_steps, and
 * "final_step N" at the end; exits 0 on any clean ending (incl. SIGTERM).
 * usage: session_child CKPT_DIR LAST_STEP [MIN_STEPS] */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/keel.h>
#include "linefit.h"

typedef struct child {
    int64_t position;          /* data iterator state: next sample index */
    int64_t steps_here;
    int64_t min_steps;
    int is_announced;
} child;

static keel_status
step(void *ctx, keel_step *st)
{
    child *c = ctx;
    double err = linefit_grads(st, c->position++);
    c->steps_here++;
    if (!c->is_announced && c->steps_here >= c->min_steps) {
        printf("running\n");
        fflush(stdout);
        c->is_announced = 1;
    }
    return keel_step_set_value(st, "loss", err * err);
}

static keel_status
sgd(void *ctx, keel_vars *vs, keel_grads *g, int64_t global_step)
{
    size_t i;
    (void)ctx;
    (void)global_step;
    for (i = 0; i < keel_vars_count(vs); i++) {
        keel_tensor *t = keel_var_tensor(keel_vars_at(vs, i));
        keel_tensor *gt = keel_grads_at(g, i);
        size_t k;
        if (gt == NULL)
            continue;
        for (k = 0; k < t->count; k++)
            t->data[k] -= 0.05f * gt->data[k];
    }
    return KEEL_OK;
}

static keel_status
meta_fn(void *ctx, keel_ckpt_meta *meta)
{
    static keel_ckpt_blob blob;
    child *c = ctx;
    blob.name = "data_iterator";
    blob.data = &c->position;
    blob.size = sizeof c->position;
    meta->blobs = &blob;
    meta->n_blobs = 1;
    return KEEL_OK;
}

static keel_status
restore_fn(void *ctx, const keel_ckpt_info *info)
{
    child *c = ctx;
    size_t n = 0;
    const void *p = keel_ckpt_info_blob(info, "data_iterator", &n);
    if (p == NULL || n != sizeof c->position)
        return keel_error_set(KEEL_ECORRUPT, "data_iterator blob missing");
    memcpy(&c->position, p, n);
    return KEEL_OK;
}

static void
log_line(void *ctx, keel_log_level level, const char *msg)
{
    (void)ctx;
    fprintf(stderr, "[%s] %s\n", keel_log_level_name(level), msg);
}

int
main(int argc, char **argv)
{
    keel_training_config cfg;
    keel_vars *vs = NULL;
    keel_session *s = NULL;
    keel_hook stop;
    keel_stop_at_step_hook_config stop_cfg;
    child c = { 0, 0, 1, 0 };
    int64_t last_step;
    keel_status st;
    if (argc < 3) {
        fprintf(stderr, "usage: session_child CKPT_DIR LAST_STEP "
                "[MIN_STEPS]\n");
        return 2;
    }
    last_step = strtoll(argv[2], NULL, 10);
    if (argc > 3)
        c.min_steps = strtoll(argv[3], NULL, 10);
    keel_log_set_handler(log_line, NULL, KEEL_LOG_INFO);
    keel_stop_at_step_hook_config_init(&stop_cfg);
    stop_cfg.last_step = last_step;
    if (keel_session_install_signal_handlers() != KEEL_OK
        || keel_vars_new(&vs) != KEEL_OK
        || keel_vars_create(vs, "w", 0, NULL, KEEL_VAR_TRAINABLE, NULL)
           != KEEL_OK
        || keel_vars_create(vs, "b", 0, NULL, KEEL_VAR_TRAINABLE, NULL)
           != KEEL_OK
        || keel_stop_at_step_hook_new(&stop_cfg, &stop) != KEEL_OK) {
        fprintf(stderr, "setup: %s\n", keel_last_error());
        return 1;
    }
    keel_training_config_init(&cfg);
    cfg.session.manager.vars = vs;
    cfg.session.step = step;
    cfg.session.step_ctx = &c;
    cfg.session.updater.apply = sgd;
    cfg.session.hooks = &stop;
    cfg.session.n_hooks = 1;
    cfg.session.meta_fn = meta_fn;
    cfg.session.meta_ctx = &c;
    cfg.session.manager.restore_fn = restore_fn;
    cfg.session.manager.restore_ctx = &c;
    cfg.session.manager.checkpoint_dir = argv[1];
    cfg.summary_dir = NULL;
    cfg.log_step_count_steps = 0;
    cfg.save_summaries_steps = 0;
    st = keel_training_session_new(&cfg, &s);
    if (st != KEEL_OK) {
        fprintf(stderr, "session: %s\n", keel_last_error());
        return 1;
    }
    printf("start_step %lld position %lld\n",
           (long long)keel_session_global_step(s), (long long)c.position);
    fflush(stdout);
    st = keel_session_train(s);
    if (st == KEEL_OK)
        st = keel_session_close(s);
    printf("final_step %lld reason %s\n",
           (long long)keel_session_global_step(s),
           keel_end_reason_name(keel_session_end_reason(s)));
    fflush(stdout);
    if (st != KEEL_OK)
        fprintf(stderr, "train: %s\n", keel_last_error());
    keel_session_free(s);
    keel_hook_release(&stop);
    keel_vars_free(vs);
    return st == KEEL_OK ? 0 : 1;
}
