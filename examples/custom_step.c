/* custom_step.c - a user's own model and train step on keel's public API:
 * linear regression y = 3x - 2 + noise with hand-written gradients, keel's
 * SGD as the update rule, under MonitoredTrainingSession with checkpoints.
 * Run twice with the same directory and it resumes. The same program runs
 * alone or as a cluster: under `keel launch --ps 1 --workers 2 --
 * ./custom_step DIR` each task finds its role in TF_CONFIG, the ps task
 * serves the variables, the chief and the workers train them (sync, or
 * the update rule named by the third argument: agn, easgd, ...;
 * docs/algorithms.md). The step computes the mean gradient over its own
 * examples and says how many they were (keel_grads_set_examples); the ps
 * apply the example-weighted mean of the replicas' gradients, so one
 * process and any number of replicas take the same steps. Its loss is a
 * metric (keel_step_set_metric: the sum over its examples and their
 * count); a hook prints it every 100 steps after the step, when it is the
 * mean over every replica of a sync step - the line one process prints
 * (async mode: each replica's own loss).
 *
 *   cc -o custom_step custom_step.c $(pkg-config --cflags --libs keel)
 *   ./custom_step /tmp/custom_step_run [steps]
 *   keel launch --ps 1 --workers 2 -- ./custom_step /tmp/cs_run 2000
 *   keel launch --ps 1 --workers 2 -- ./custom_step /tmp/cs_agn 2000 agn
 */
#include <stdio.h>
#include <stdlib.h>
#include <keel/keel.h>

#define N 256                         /* examples in the synthetic set */

typedef struct data {
    float x[N], y[N];
} data;

/* Gradient of the mean squared error over the whole set, the mean over
 * its N examples (every replica computes it; a real program gives each
 * replica its slice of a batch and declares the slice's size). The loss
 * is a metric: its sum over the step's examples and their count, which
 * the session combines over the replicas of a sync step. */
static keel_status
step(void *ctx, keel_step *st)
{
    const data *d = ctx;
    keel_vars *vs = keel_step_vars(st);
    keel_grads *g = keel_step_grads(st);
    float w = keel_var_tensor(keel_vars_find(vs, "linear/w"))->data[0];
    float b = keel_var_tensor(keel_vars_find(vs, "linear/b"))->data[0];
    double loss_sum = 0, gw = 0, gb = 0;
    for (int i = 0; i < N; i++) {
        double e = w * d->x[i] + b - d->y[i];
        loss_sum += e * e;
        gw += 2 * e * d->x[i] / N;
        gb += 2 * e / N;
    }
    keel_grads_find(g, "linear/w")->data[0] = (float)gw;
    keel_grads_find(g, "linear/b")->data[0] = (float)gb;
    if (keel_grads_set_examples(g, N) != KEEL_OK)
        return KEEL_EINVAL;
    return keel_step_set_metric(st, "loss", loss_sum, N);
}

/* The step line every 100 steps, printed after the step: the loss hooks
 * read there is the mean over every replica of a sync step (async: this
 * replica's own), the figure one process prints. */
static keel_status
print_loss(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    int64_t g = keel_run_values_step_before(v);
    (void)ctx;
    (void)rc;
    if (g % 100 == 0) {
        printf("step %lld: loss %.6f\n", (long long)g,
               keel_run_values_get(v, "loss"));
        fflush(stdout);
    }
    return KEEL_OK;
}

/* The synthetic set: y = 3x - 2 plus a little noise, the same in every
 * task (a fixed seed). */
static void
make_data(data *d)
{
    uint32_t r = 12345;
    for (int i = 0; i < N; i++) {
        r = r * 1664525u + 1013904223u;
        d->x[i] = (float)i / N * 4 - 2;
        d->y[i] = 3 * d->x[i] - 2 + ((float)(r >> 8) / (1 << 24) - 0.5f) * 0.1f;
    }
}

/* The model's variables. Every task (the ps too) creates the same
 * variables in the same order: that is how they agree on which ps holds
 * which. */
static keel_status
create_variables(keel_vars **vs)
{
    int64_t one[1] = { 1 };
    keel_status st = keel_vars_new(vs);
    if (st == KEEL_OK)
        st = keel_vars_create(*vs, "linear/w", 1, one, KEEL_VAR_TRAINABLE,
                              NULL);
    if (st == KEEL_OK)
        st = keel_vars_create(*vs, "linear/b", 1, one, KEEL_VAR_TRAINABLE,
                              NULL);
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
    const char *dir = argc > 1 ? argv[1] : "custom_step_run";
    long steps = argc > 2 ? strtol(argv[2], NULL, 10) : 200;
    const char *rule = argc > 3 ? argv[3] : NULL;
    keel_vars *vs = NULL;
    keel_cluster_spec *cluster = NULL;
    keel_session *s = NULL;
    keel_hook hooks[2] = { { 0 } };     /* stop at the last step, print */
    keel_stop_at_step_hook_config stop_cfg;
    keel_optimizer_config sgd;
    keel_cluster_config copts;
    keel_algorithm_config algo;
    keel_training_config cfg;
    keel_status st;
    data d;

    keel_log_set_handler(log_line, NULL, KEEL_LOG_INFO);
    make_data(&d);
    keel_algorithm_config_init(&algo, KEEL_ALGORITHM_SYNC);
    st = rule != NULL ? keel_algorithm_from_name(rule, &algo.name) : KEEL_OK;
    if (st == KEEL_OK)
        st = create_variables(&vs);
    keel_optimizer_config_init(&sgd, KEEL_OPT_SGD);
    sgd.schedule.learning_rate = 0.1;
    keel_cluster_config_init(&copts);
    copts.optimizer = &sgd;                   /* what the ps apply */
    if (rule != NULL)                         /* every task the same */
        copts.algorithm = &algo;
    /* TF_CONFIG (or Slurm) says which task this is; none: train alone */
    if (st == KEEL_OK)
        st = keel_cluster_spec_detect(&copts, &cluster);
    /* SIGTERM: the chief writes a final checkpoint, a ps stops */
    if (st == KEEL_OK)
        st = keel_session_install_signal_handlers();
    if (st == KEEL_OK && keel_cluster_spec_is_ps(cluster)) {
        /* a parameter server: serve until the chief says the run is over */
        st = keel_ps_run(cluster, vs, &copts);
        goto out;
    }
    keel_stop_at_step_hook_config_init(&stop_cfg);
    stop_cfg.last_step = steps;                 /* absolute: restart safe */
    if (st == KEEL_OK)
        st = keel_stop_at_step_hook_new(&stop_cfg, &hooks[0]);
    if (st != KEEL_OK)
        goto out;
    keel_hook_init(&hooks[1]);
    hooks[1].name = "print_loss";
    hooks[1].after_run = print_loss;

    keel_training_config_init(&cfg);          /* TF's defaults */
    cfg.session.manager.vars = vs;
    cfg.session.step = step;
    cfg.session.step_ctx = &d;
    cfg.session.hooks = hooks;                /* on every replica */
    cfg.session.n_hooks = 2;
    cfg.optimizer = &sgd;                     /* here, or on the ps */
    cfg.cluster = cluster;                    /* local: trains alone */
    cfg.cluster_config = &copts;
    cfg.session.manager.checkpoint_dir = dir; /* the chief's */
    cfg.save_checkpoint_steps = 50;
    cfg.log_step_count_steps = 100;
    st = keel_training_session_new(&cfg, &s);
    if (st == KEEL_EOUTOFRANGE) {             /* a worker came too late */
        fprintf(stderr, "custom_step: training already finished: %s\n",
                keel_last_error());
        st = KEEL_OK;
        goto out;
    }
    if (st == KEEL_OK)
        st = keel_session_train(s);
    if (st == KEEL_OK)
        st = keel_session_close(s);
    if (st == KEEL_OK)
        printf("step %lld: w = %.4f, b = %.4f\n",
               (long long)keel_session_global_step(s),
               keel_var_tensor(keel_vars_find(vs, "linear/w"))->data[0],
               keel_var_tensor(keel_vars_find(vs, "linear/b"))->data[0]);
out:
    if (st != KEEL_OK)
        fprintf(stderr, "custom_step: %s\n", keel_last_error());
    keel_session_free(s);
    keel_hook_release(&hooks[0]);
    keel_cluster_spec_free(cluster);
    keel_vars_free(vs);
    return st == KEEL_OK ? 0 : 1;
}
