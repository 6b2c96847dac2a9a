/* sync_supervisor.c - synchronous data-parallel SGD under the Supervisor,
 * the TF1 recipe: a ps task serves the variables, the chief initializes
 * them (or restores its last checkpoint) and publishes them, the workers
 * wait until the model is ready, then every replica computes the mean
 * gradient over its slice of each global batch, declares the slice's size
 * (keel_grads_set_examples), and the ps apply the example-weighted mean of
 * one gradient per replica per step, the mean over the global batch
 * (SyncReplicas with tokens: no barrier in the program). The step is the
 * one a single process runs on the whole batch: 1, 2 or 3 replicas train
 * the same model (up to float rounding). The loss is a metric (the sum
 * over the replica's slice and the slice's size): after each step every
 * replica reads the mean over the whole global batch, which the ps
 * combine from the replicas' sums, and prints it every 50 steps - the
 * line one process prints. The chief checkpoints to LOGDIR;
 * at max_steps it stops, writes the final checkpoint and stops the ps, and
 * the workers end.
 *
 * A ps or a worker lost mid-run and restarted (by keel launch) costs no
 * step: the chief and the other workers keep their processes, the chief
 * re-initializes a restarted ps from its own variables at the step the
 * job reached, a restarted worker pulls them and rejoins.
 *
 * The model: logistic regression on a synthetic, deterministic set
 * (8 features, label 1 when a fixed linear function is positive),
 * Adagrad as the update rule (or plain SGD: a third argument "sgd").
 *
 *   cc -o sync_supervisor sync_supervisor.c $(pkg-config --cflags --libs keel) -lm
 *   keel launch --ps 1 --workers 2 -- ./sync_supervisor LOGDIR [max_steps [sgd]]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <keel/keel.h>

#define DIM 8
#define SET 4096                      /* examples in the synthetic set */
#define BATCH 96                      /* global batch, split by replicas */

typedef struct run {
    float x[SET][DIM];
    float y[SET];
    int replica, replicas;            /* this replica's slice of a batch */
    int64_t step;                     /* global step of the last step */
} run;

/* One replica's step: the mean log-loss gradient over its slice of the
 * global batch of this global step (key part 3 of the recipe), and the
 * slice's summed loss as the metric "loss". */
static keel_status
step(void *ctx, keel_step *st)
{
    run *r = ctx;
    keel_vars *vs = keel_step_vars(st);
    const float *w = keel_var_tensor(keel_vars_find(vs, "logreg/w"))->data;
    float b = keel_var_tensor(keel_vars_find(vs, "logreg/b"))->data[0];
    float *gw = keel_grads_find(keel_step_grads(st), "logreg/w")->data;
    float *gb = keel_grads_find(keel_step_grads(st), "logreg/b")->data;
    int64_t g = keel_step_global_step(st);
    int per = BATCH / r->replicas;
    int first = (int)((g * BATCH) % SET) + r->replica * per;
    double loss_sum = 0;
    r->step = g;
    for (int k = 0; k < per; k++) {
        const float *x = r->x[(first + k) % SET];
        float yk = r->y[(first + k) % SET];
        double z = b, p, e;
        for (int j = 0; j < DIM; j++)
            z += w[j] * x[j];
        p = 1 / (1 + exp(-z));
        e = p - yk;                  /* d loss / d z */
        loss_sum -= yk > 0 ? log(p + 1e-12) : log(1 - p + 1e-12);
        for (int j = 0; j < DIM; j++)
            gw[j] += (float)(e * x[j] / per);
        gb[0] += (float)(e / per);
    }
    if (keel_grads_set_examples(keel_step_grads(st), per) != KEEL_OK)
        return KEEL_EINVAL;
    return keel_step_set_metric(st, "loss", loss_sum, per);
}

/* The synthetic set, the same in every task (a fixed seed). */
static void
make_data(run *r)
{
    uint32_t seed = 7;
    for (int i = 0; i < SET; i++) {
        double z = 0.5;
        for (int j = 0; j < DIM; j++) {
            seed = seed * 1664525u + 1013904223u;
            r->x[i][j] = (float)(seed >> 8) / (1 << 24) * 2 - 1;
            z += (j % 2 ? -1.0 : 1.0) * (j + 1) * r->x[i][j];
        }
        r->y[i] = z > 0 ? 1.0f : 0.0f;
    }
}

/* every task creates the same variables in the same order */
static keel_status
create_variables(keel_vars **vs)
{
    int64_t wshape[1] = { DIM }, bshape[1] = { 1 };
    keel_status st = keel_vars_new(vs);
    if (st == KEEL_OK)
        st = keel_vars_create(*vs, "logreg/w", 1, wshape, KEEL_VAR_TRAINABLE,
                              NULL);
    if (st == KEEL_OK)
        st = keel_vars_create(*vs, "logreg/b", 1, bshape, KEEL_VAR_TRAINABLE,
                              NULL);
    return st;
}

/* The training loop: steps until the supervisor should stop; the chief
 * requests the stop at max_steps. Every 50 steps the step's loss, the
 * mean over every replica's slice (the Supervisor takes no hooks: read
 * from the session after the step). */
static keel_status
train(keel_supervisor *sv, run *r, long max_steps)
{
    keel_status st = KEEL_OK;
    double loss;
    while (st == KEEL_OK && !keel_supervisor_should_stop(sv)) {
        st = keel_supervisor_run_step(sv, NULL);
        if (st == KEEL_OK && r->step % 50 == 0 &&
            keel_session_find_value(keel_supervisor_session(sv), "loss",
                                    &loss)) {
            printf("step %lld: loss %.4f\n", (long long)r->step, loss);
            fflush(stdout);
        }
        if (st == KEEL_EOUTOFRANGE)          /* the chief stopped the ps */
            st = KEEL_OK;
        else if (st == KEEL_OK && keel_session_global_step(
                     keel_supervisor_session(sv)) >= max_steps)
            keel_supervisor_request_stop(sv, "max_steps reached");
    }
    return st;
}

static void
log_line(void *ctx, keel_log_level level, const char *msg)
{
    (void)ctx;
    fprintf(stderr, "%s%s\n", level >= KEEL_LOG_WARN ? "warning: " : "", msg);
}

int
main(int argc, char **argv)
{
    const char *logdir = argc > 1 ? argv[1] : "sync_supervisor_run";
    long max_steps = argc > 2 ? strtol(argv[2], NULL, 10) : 300;
    const char *rule = argc > 3 ? argv[3] : "adagrad";
    keel_vars *vs = NULL;
    keel_cluster_spec *spec = NULL;
    keel_cluster_backend *cluster = NULL;
    keel_optimizer *local_opt = NULL;
    keel_backend backend;
    keel_supervisor *sv = NULL;
    keel_supervisor_config cfg;
    keel_optimizer_config update;
    keel_cluster_config copts;
    keel_status st, stop_st;
    static run r;

    keel_log_set_handler(log_line, NULL, KEEL_LOG_INFO);
    make_data(&r);
    st = create_variables(&vs);
    if (strcmp(rule, "adagrad") != 0 && strcmp(rule, "sgd") != 0) {
        fprintf(stderr, "sync_supervisor: update rule '%s': want adagrad "
                "or sgd\n", rule);
        keel_vars_free(vs);
        return 2;
    }
    keel_optimizer_config_init(&update, rule[0] == 's' ? KEEL_OPT_SGD
                                                        : KEEL_OPT_ADAGRAD);
    update.schedule.learning_rate = 0.5;
    keel_cluster_config_init(&copts);
    copts.optimizer = &update;              /* the ps apply the rule */
    if (st == KEEL_OK)
        st = keel_cluster_spec_detect(&copts, &spec);
    if (st == KEEL_OK)
        st = keel_session_install_signal_handlers();
    if (st != KEEL_OK)
        goto out;
    if (keel_cluster_spec_is_ps(spec)) {     /* server.join() */
        st = keel_ps_run(spec, vs, &copts);
        goto out;
    }

    keel_supervisor_config_init(&cfg);
    cfg.session.manager.vars = vs;
    cfg.session.step = step;
    cfg.session.step_ctx = &r;
    cfg.session.manager.checkpoint_dir = logdir; /* the chief's */
    cfg.save_checkpoint_secs = 600;
    cfg.session.manager.recovery_wait_ms = 10;   /* recovery_wait_secs */
    r.replicas = 1;
    if (keel_cluster_spec_is_local(spec)) {  /* alone: apply here */
        st = keel_optimizer_new(&update, &local_opt);
        if (st == KEEL_OK)
            st = keel_optimizer_prepare(local_opt, vs);
        cfg.session.updater = keel_optimizer_updater(local_opt);  /* same */
    } else {
        /* replica 0 is the chief, then worker 0, 1, ... */
        r.replicas = keel_cluster_spec_num_replicas(spec);
        r.replica = keel_cluster_spec_replica_index(spec);
        if (BATCH % r.replicas != 0) {
            fprintf(stderr, "sync_supervisor: %d replicas do not divide "
                    "the batch of %d\n", r.replicas, BATCH);
            keel_cluster_spec_free(spec);
            keel_vars_free(vs);
            return 2;
        }
        st = keel_cluster_backend_new(spec, vs, &copts, &cluster);
        if (st == KEEL_OK)
            keel_cluster_backend_session_backend(cluster, &backend);
        cfg.session.manager.backend = &backend;
        cfg.session.is_chief = keel_cluster_spec_is_chief(spec);
    }
    if (st == KEEL_OK)
        st = keel_supervisor_new(&cfg, &sv);
    /* chief: restore or init, then publish; worker: wait until ready */
    if (st == KEEL_OK)
        st = keel_supervisor_prepare_or_wait(sv, 600);
    if (st == KEEL_EOUTOFRANGE) {            /* the run ended before us */
        st = KEEL_OK;
        goto out;
    }
    if (st == KEEL_OK)
        st = train(sv, &r, max_steps);
    /* the chief writes the final checkpoint and stops the ps */
    stop_st = keel_supervisor_stop(sv);
    if (st == KEEL_OK)
        st = stop_st;
    if (st == KEEL_OK && sv != NULL)
        printf("%s done at step %lld\n",
               keel_cluster_spec_is_chief(spec) ? "chief" : "worker",
               (long long)keel_session_global_step(
                   keel_supervisor_session(sv)));
out:
    if (st != KEEL_OK)
        fprintf(stderr, "sync_supervisor: %s\n", keel_last_error());
    keel_supervisor_free(sv);
    keel_cluster_backend_free(cluster);
    keel_optimizer_free(local_opt);
    keel_cluster_spec_free(spec);
    keel_vars_free(vs);
    return st == KEEL_OK ? 0 : 1;
}
