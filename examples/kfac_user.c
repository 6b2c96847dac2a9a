/* kfac_user.c - K-FAC for a user's own model (keel/kfac.h): a two-layer
 * MLP written by hand on OpenBLAS (32 inputs, 64 ReLU units, 10 classes)
 * on synthetic, badly scaled data, its two dense layers registered in a
 * K-FAC layer collection, trained under MonitoredTrainingSession with
 * checkpoints. Each step computes the gradients of the mean loss and, on
 * the task that takes K-FAC's statistics, the layers' inputs and the
 * gradients at their pre-activation outputs of the loss of targets drawn
 * from the model's own predictions (the true Fisher). The third argument
 * "sgd" trains the same model with momentum SGD instead. The same program
 * runs as a cluster under `keel launch`: each task finds its place in
 * TF_CONFIG, every task (the ps too) makes the same variables and K-FAC
 * state, and the fourth argument picks K-FAC's distributed mode. chief:
 * the replicas compute gradients on their own examples, the chief takes
 * the statistics and applies each step's K-FAC update to the mean. roles
 * (3 or more replicas): replicas by index are gradient workers (the chief
 * first), covariance workers (the statistics) and inverse workers (the
 * layers' inverses); the chief preconditions with the newest inverses.
 * Alone, both modes are the one-process K-FAC.
 *
 *   cc -o kfac_user kfac_user.c $(pkg-config --cflags --libs keel) -lopenblas -lm
 *   ./kfac_user /tmp/kfac_user_run [steps] [kfac|sgd] [chief|roles]
 *   keel launch --ps 1 --workers 1 -- ./kfac_user /tmp/kfac_user_c 200
 *   keel launch --ps 1 --workers 2 -- ./kfac_user /tmp/kfac_r 200 kfac roles
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <keel/keel.h>

#define D 32            /* inputs */
#define H 64            /* hidden units */
#define C 10            /* classes */
#define N 4096          /* examples in the synthetic set */
#define B 128           /* examples per replica and step */

typedef struct model {
    float x[N][D];
    int32_t y[N];
    keel_kfac *kfac;            /* NULL: momentum SGD */
    int observes;               /* this task takes K-FAC's statistics */
    int replica, replicas;
    /* one step's buffers */
    float xb[B * D], a1[B * H], h[B * H], z[B * C], p[B * C];
    float dz[B * C], dh[B * H], d2[B * C], d1[B * H];
    int32_t yb[B], t[B];
} model;

/* The synthetic set: 10 Gaussian clusters in 32 dimensions whose
 * features are scaled from 1 down to 1/e^3 (an ill-conditioned input,
 * where a natural-gradient step gains most), the same in every task. */
static void
make_data(model *m)
{
    static float mu[C][D];
    uint64_t r = 12345;
    for (int c = 0; c < C; c++)
        for (int j = 0; j < D; j++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            mu[c][j] = (float)((double)(r >> 40) / (1 << 24) * 2 - 1);
        }
    for (int i = 0; i < N; i++) {
        m->y[i] = i % C;
        for (int j = 0; j < D; j++) {
            double u1, u2;
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            u1 = ((double)(r >> 40) + 1) / ((1 << 24) + 1.0);
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            u2 = (double)(r >> 40) / (1 << 24);
            m->x[i][j] = (float)((mu[m->y[i]][j] + 0.6 * sqrt(-2 * log(u1)) *
                                  cos(6.283185307179586 * u2)) *
                                 exp(-6.0 * j / D));
        }
    }
}

/* Forward pass of n examples xs: a1 = x W1 + b1, h = relu(a1),
 * z = h W2 + b2, p = softmax(z); returns the summed loss of labels ys. */
static const float *
value(keel_vars *vs, const char *name)
{
    return keel_var_tensor(keel_vars_find(vs, name))->data;
}

static double
forward(model *m, keel_vars *vs, const float *xs, const int32_t *ys, int n)
{
    const float *w1 = value(vs, "dense_1/kernel");
    const float *b1 = value(vs, "dense_1/bias");
    const float *w2 = value(vs, "dense_2/kernel");
    const float *b2 = value(vs, "dense_2/bias");
    double loss = 0;
    for (int i = 0; i < n; i++) {
        memcpy(m->a1 + i * H, b1, H * sizeof(float));
        memcpy(m->z + i * C, b2, C * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, H, D, 1.0f,
                xs, D, w1, H, 1.0f, m->a1, H);
    for (int i = 0; i < n * H; i++)
        m->h[i] = m->a1[i] > 0 ? m->a1[i] : 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, H, 1.0f,
                m->h, H, w2, C, 1.0f, m->z, C);
    for (int i = 0; i < n; i++) {
        float *z = m->z + i * C, *p = m->p + i * C, mx = z[0];
        double s = 0;
        for (int c = 1; c < C; c++)
            mx = z[c] > mx ? z[c] : mx;
        for (int c = 0; c < C; c++)
            s += exp((double)z[c] - mx);
        for (int c = 0; c < C; c++)
            p[c] = (float)(exp((double)z[c] - mx) / s);
        loss += log(s) + mx - z[ys[i]];
    }
    return loss;
}

/* From the output gradients dz (n x C): dh = (dz W2^T) relu'(a1). */
static void
back_to_hidden(model *m, keel_vars *vs, const float *dz, float *dh, int n)
{
    const float *w2 = value(vs, "dense_2/kernel");
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, H, C, 1.0f, dz,
                C, w2, C, 0.0f, dh, H);
    for (int i = 0; i < n * H; i++)
        if (m->a1[i] <= 0)
            dh[i] = 0;
}

/* One step on this replica's B examples: the mean loss's gradients; on
 * the observing task, K-FAC's statistics of both layers. The loss is a
 * metric (its sum over the B examples and B), which the session combines
 * over the replicas where the parameter servers combine the step (SGD on
 * a cluster; in K-FAC's chief mode the chief's summary shows its own). */
static keel_status
step(void *ctx, keel_step *st)
{
    model *m = ctx;
    keel_vars *vs = keel_step_vars(st);
    keel_grads *g = keel_step_grads(st);
    int64_t gs = keel_step_global_step(st);
    double loss_sum;
    keel_status s;
    for (int i = 0; i < B; i++) {
        int64_t e = ((gs * m->replicas + m->replica) * B + i) % N;
        memcpy(m->xb + i * D, m->x[e], sizeof m->x[e]);
        m->yb[i] = m->y[e];
    }
    loss_sum = forward(m, vs, m->xb, m->yb, B);
    for (int i = 0; i < B * C; i++)
        m->dz[i] = m->p[i] / B;
    for (int i = 0; i < B; i++)
        m->dz[i * C + m->yb[i]] -= 1.0f / B;
    back_to_hidden(m, vs, m->dz, m->dh, B);
    /* the gradients: kernel = in^T d, bias = column sums of d */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, C, B, 1.0f, m->h,
                H, m->dz, C, 0.0f, keel_grads_find(g, "dense_2/kernel")->data,
                C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, H, B, 1.0f,
                m->xb, D, m->dh, H, 0.0f,
                keel_grads_find(g, "dense_1/kernel")->data, H);
    {
        float *gb1 = keel_grads_find(g, "dense_1/bias")->data;
        float *gb2 = keel_grads_find(g, "dense_2/bias")->data;
        memset(gb1, 0, H * sizeof(float));
        memset(gb2, 0, C * sizeof(float));
        for (int i = 0; i < B; i++) {
            for (int j = 0; j < H; j++)
                gb1[j] += m->dh[i * H + j];
            for (int c = 0; c < C; c++)
                gb2[c] += m->dz[i * C + c];
        }
    }
    if ((s = keel_grads_set_examples(g, B)) != KEEL_OK)
        return s;
    if (m->kfac != NULL && m->observes) {
        /* the true Fisher's statistics: targets drawn from p, the
         * per-example loss gradients (of the sum, not the mean) */
        s = keel_kfac_sample_targets(m->kfac, m->z, B, C, m->yb, gs, m->t);
        if (s != KEEL_OK)
            return s;
        memcpy(m->d2, m->p, sizeof m->d2);
        for (int i = 0; i < B; i++)
            m->d2[i * C + m->t[i]] -= 1.0f;
        back_to_hidden(m, vs, m->d2, m->d1, B);
        if ((s = keel_kfac_observe_layer(m->kfac, 0, m->xb, m->d1, B, gs)) !=
                KEEL_OK ||
            (s = keel_kfac_observe_layer(m->kfac, 1, m->h, m->d2, B, gs)) !=
                KEEL_OK)
            return s;
    }
    return keel_step_set_metric(st, "loss", loss_sum, B);
}

/* Glorot-uniform kernels, zero biases, from a fixed seed (the chief
 * initializes; the others take its values). */
static keel_status
init_vars(void *ctx, keel_vars *vs)
{
    static const char *const names[2] = { "dense_1/kernel", "dense_2/kernel" };
    uint64_t r = 777;
    (void)ctx;
    for (int l = 0; l < 2; l++) {
        keel_tensor *t = keel_var_tensor(keel_vars_find(vs, names[l]));
        double lim = sqrt(6.0 / (double)(t->shape[0] + t->shape[1]));
        for (size_t i = 0; i < t->count; i++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            t->data[i] = (float)(((double)(r >> 40) / (1 << 24) * 2 - 1) *
                                 lim);
        }
    }
    return KEEL_OK;
}

/* The model's variables, the same on every task in the same order; with
 * K-FAC, its layer collection and optimizer, which add the factors,
 * inverses and velocity to the store. */
static keel_status
create_model(keel_vars *vs, const keel_kfac_config *kc, keel_kfac **kfac)
{
    static const int64_t shapes[4][2] = { { D, H }, { H, 0 }, { H, C },
                                          { C, 0 } };
    static const char *const names[4] = { "dense_1/kernel", "dense_1/bias",
                                          "dense_2/kernel", "dense_2/bias" };
    keel_var *v[4];
    keel_kfac_layers *lc = NULL;
    keel_status st = KEEL_OK;
    for (int i = 0; i < 4 && st == KEEL_OK; i++)
        st = keel_vars_create(vs, names[i], shapes[i][1] > 0 ? 2 : 1,
                              shapes[i], KEEL_VAR_TRAINABLE, &v[i]);
    if (st != KEEL_OK || kc == NULL)
        return st;
    st = keel_kfac_layers_new(&lc);
    if (st == KEEL_OK)
        st = keel_kfac_layers_add_dense(lc, v[0], v[1], NULL);
    if (st == KEEL_OK)
        st = keel_kfac_layers_add_dense(lc, v[2], v[3], NULL);
    if (st == KEEL_OK)
        st = keel_kfac_new_from_layers(kc, lc, vs, kfac);
    keel_kfac_layers_free(lc);
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
    const char *dir = argc > 1 ? argv[1] : "kfac_user_run";
    long steps = argc > 2 ? strtol(argv[2], NULL, 10) : 200;
    int use_kfac = !(argc > 3 && strcmp(argv[3], "sgd") == 0);
    keel_kfac_distributed mode = KEEL_KFAC_DIST_CHIEF;
    model *m = calloc(1, sizeof *m);
    keel_vars *vs = NULL;
    keel_cluster_spec *cluster = NULL;
    keel_session *s = NULL;
    keel_kfac_dist *dist = NULL;
    keel_hook stop = { 0 };
    keel_stop_at_step_hook_config stop_cfg;
    keel_optimizer_config sgd;
    keel_kfac_config kc;
    keel_kfac_dist_config dc;
    keel_cluster_config copts;
    keel_training_config cfg;
    keel_scaffold scaffold;
    keel_status st = m != NULL ? KEEL_OK : KEEL_ENOMEM;

    keel_log_set_handler(log_line, NULL, KEEL_LOG_INFO);
    if (st == KEEL_OK && argc > 4)            /* "chief" or "roles" */
        st = keel_kfac_distributed_from_name(argv[4], &mode);
    if (st == KEEL_OK)
        make_data(m);
    keel_optimizer_config_init(&sgd, KEEL_OPT_MOMENTUM);
    sgd.schedule.learning_rate = 0.8;
    keel_kfac_config_init(&kc);
    kc.schedule.learning_rate = 0.05;
    kc.damping = 0.01;
    kc.momentum_type = KEEL_KFAC_MOMENTUM_REGULAR;
    kc.seed = 1;
    keel_cluster_config_init(&copts);
    /* TF_CONFIG (or Slurm) says which task this is; none: train alone */
    if (st == KEEL_OK)
        st = keel_cluster_spec_detect(&copts, &cluster);
    if (st == KEEL_OK)
        st = keel_vars_new(&vs);
    if (st == KEEL_OK)
        st = create_model(vs, use_kfac ? &kc : NULL, &m->kfac);
    m->replicas = 1;
    if (st == KEEL_OK && cluster != NULL &&
        !keel_cluster_spec_is_local(cluster)) {
        m->replicas = keel_cluster_spec_num_replicas(cluster);
        if (!keel_cluster_spec_is_ps(cluster))
            m->replica = keel_cluster_spec_replica_index(cluster);
    }
    if (st == KEEL_OK && use_kfac) {
        /* K-FAC distributed in this task's place: which task observes,
         * which applies (alone: this one both) */
        keel_kfac_dist_config_init(&dc);
        dc.mode = mode;
        dc.replica = m->replica;
        dc.replicas = m->replicas;
        if (mode == KEEL_KFAC_DIST_ROLES)     /* the inverses' versions */
            st = keel_kfac_dist_add_state(m->kfac, vs);
        if (st == KEEL_OK)
            st = keel_kfac_dist_new(&dc, m->kfac, vs, &dist);
        m->observes = keel_kfac_dist_observes(dist);
    } else {
        copts.optimizer = &sgd;               /* what the ps apply */
    }
    /* SIGTERM: the chief writes a final checkpoint, a ps stops */
    if (st == KEEL_OK)
        st = keel_session_install_signal_handlers();
    if (st == KEEL_OK && keel_cluster_spec_is_ps(cluster)) {
        /* the ps take the cluster settings the session takes itself */
        if (dist != NULL)
            st = keel_kfac_dist_cluster_config(dist, &copts);
        if (st == KEEL_OK)
            st = keel_ps_run(cluster, vs, &copts);
        goto out;
    }
    keel_stop_at_step_hook_config_init(&stop_cfg);
    stop_cfg.last_step = steps;
    if (st == KEEL_OK)
        st = keel_stop_at_step_hook_new(&stop_cfg, &stop);
    if (st != KEEL_OK)
        goto out;

    keel_training_config_init(&cfg);
    cfg.session.manager.vars = vs;
    keel_scaffold_init(&scaffold);
    scaffold.init_fn = init_vars;
    cfg.session.manager.scaffold = &scaffold;
    cfg.session.step = step;
    cfg.session.step_ctx = m;
    cfg.session.hooks = &stop;
    cfg.session.n_hooks = 1;
    cfg.cluster = cluster;
    cfg.cluster_config = &copts;
    if (use_kfac)
        cfg.kfac_dist = dist;                 /* alone or on the cluster */
    else
        cfg.optimizer = &sgd;
    cfg.session.manager.checkpoint_dir = dir;
    cfg.save_checkpoint_steps = 100;
    cfg.log_step_count_steps = 100;
    st = keel_training_session_new(&cfg, &s);
    if (st == KEEL_EOUTOFRANGE) {             /* a worker came too late */
        fprintf(stderr, "kfac_user: training already finished: %s\n",
                keel_last_error());
        st = KEEL_OK;
        goto out;
    }
    if (st == KEEL_OK)
        st = keel_session_train(s);
    if (st == KEEL_OK)
        st = keel_session_close(s);
    if (st == KEEL_OK && m->replica == 0) {
        /* the loss on the whole set, B examples at a time */
        double sum = 0;
        for (int i = 0; i < N; i += B)
            sum += forward(m, vs, m->x[i], m->y + i, B);
        printf("%s: step %lld: loss %.4f\n", use_kfac ? "kfac" : "sgd",
               (long long)keel_session_global_step(s), sum / N);
    }
out:
    if (st != KEEL_OK)
        fprintf(stderr, "kfac_user: %s\n", keel_last_error());
    keel_session_free(s);
    keel_hook_release(&stop);
    keel_kfac_dist_free(dist);
    keel_kfac_free(m != NULL ? m->kfac : NULL);
    keel_cluster_spec_free(cluster);
    keel_vars_free(vs);
    free(m);
    return st == KEEL_OK ? 0 : 1;
}
