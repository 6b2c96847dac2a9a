/* embedding.c - a click model on hashed categorical features: every
 * example has FIELDS categorical values, each hashed into one row of a
 * large embedding table (keel_embedding), and the click probability is
 * sigmoid(b + sum over fields of <table[id], w>). The table's gradient is
 * rows (only the rows the batch read), so Adagrad updates only those rows.
 * examples/make_clicks.py writes a data set from a known model (HDF5:
 * "x" [N, FIELDS] the hashed ids as float32, "y" [N] the clicks).
 *
 * Alone, or on a cluster (`keel launch --ps 4 --workers 1 -- ...`): each
 * task finds its role in TF_CONFIG. Global step s reads examples
 * [s*B, (s+1)*B) mod N; replica r of R trains its slice [r*B/R,
 * (r+1)*B/R) of them and declares its size, so the ps apply the
 * example-weighted mean and any replica count takes the steps one process
 * takes.
 *
 *   python3 examples/make_clicks.py clicks.h5 --vocab 65536
 *   ./embedding clicks.h5 /tmp/emb_run 300 65536
 *   keel launch --ps 4 --workers 1 -- ./embedding clicks.h5 /tmp/emb4 300 65536
 *   keel launch --ps 4 --workers 2 -- ./embedding clicks.h5 /tmp/e 300 \
 *       16777216 sharded 64
 *
 * The table is a row variable: on a cluster the chief and the workers
 * pull the rows a step reads and push their gradient rows; the table
 * lives on its ps (with the sharded argument, checkpoints too). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <keel/keel.h>

#define FIELDS 8                /* categorical fields per example */
#define DIM 8                   /* floats per table row, by default */
#define MAX_DIM 64
#define BATCH 128               /* global batch */

typedef struct model {
    keel_dataset *ds;
    keel_embedding *emb;
    int dim;                    /* floats per table row */
    int replica, n_replicas;
    long print_every;
    double loss_sum;            /* since the last line printed */
    long loss_n;
} model;

/* One step of replica r: forward, loss, backward; the table's gradient
 * as rows (one per field of each example, in example order: the bits
 * depend on nothing else), w's and b's dense. */
static keel_status
step(void *ctx, keel_step *st)
{
    model *m = ctx;
    keel_vars *vs = keel_step_vars(st);
    keel_grads *g = keel_step_grads(st);
    const float *w = keel_var_tensor(keel_vars_find(vs, "click/w"))->data;
    float b = keel_var_tensor(keel_vars_find(vs, "click/b"))->data[0];
    float *gw = keel_grads_find(g, "click/w")->data;
    float *gb = keel_grads_find(g, "click/b")->data;
    int64_t gs = keel_step_global_step(st);
    size_t n_all = keel_dataset_count(m->ds);
    long lo = (long)BATCH * m->replica / m->n_replicas;
    long hi = (long)BATCH * (m->replica + 1) / m->n_replicas;
    double loss = 0, dgb = 0, dgw[MAX_DIM] = { 0 };
    const int D = m->dim;
    int32_t y[BATCH];
    int64_t ids[BATCH * FIELDS];
    float e[BATCH * FIELDS * MAX_DIM];
    keel_status s = KEEL_OK;
    /* the slice's ids first, then its rows in one lookup: on a cluster,
     * one request for the rows this step reads */
    for (long k = lo; k < hi && s == KEEL_OK; k++) {
        float x[FIELDS];
        size_t i = (size_t)(((uint64_t)gs * BATCH + (uint64_t)k) % n_all);
        s = keel_dataset_get(m->ds, i, x, &y[k - lo]);
        for (int f = 0; f < FIELDS; f++)
            ids[(k - lo) * FIELDS + f] = (int64_t)x[f];
    }
    if (s == KEEL_OK)
        s = keel_embedding_lookup(m->emb, (size_t)(hi - lo) * FIELDS, ids,
                                  e);
    for (long k = lo; k < hi && s == KEEL_OK; k++) {
        const float *ek = e + (k - lo) * FIELDS * D;
        float drow[FIELDS * MAX_DIM];
        double z = b, p, dz, h[MAX_DIM] = { 0 };
        int32_t yk = y[k - lo];
        for (int f = 0; f < FIELDS; f++)
            for (int j = 0; j < D; j++)
                h[j] += ek[f * D + j];
        for (int j = 0; j < D; j++)
            z += h[j] * w[j];
        p = 1 / (1 + exp(-z));
        loss += yk ? -log(p + 1e-12) : -log(1 - p + 1e-12);
        dz = (p - yk) / (double)(hi - lo);   /* the mean over the slice */
        dgb += dz;
        for (int j = 0; j < D; j++)
            dgw[j] += dz * h[j];
        for (int f = 0; f < FIELDS; f++)
            for (int j = 0; j < D; j++)
                drow[f * D + j] = (float)(dz * w[j]);
        s = keel_embedding_backward(m->emb, FIELDS, ids + (k - lo) * FIELDS,
                                    drow, g);
    }
    if (s != KEEL_OK)
        return s;
    for (int j = 0; j < D; j++)
        gw[j] = (float)dgw[j];
    gb[0] = (float)dgb;
    if ((s = keel_grads_set_examples(g, hi - lo)) != KEEL_OK)
        return s;
    m->loss_sum += loss;
    m->loss_n += hi - lo;
    if (m->replica == 0 && (gs + 1) % m->print_every == 0) {
        printf("step %lld: loss %.6f\n", (long long)gs + 1,
               m->loss_sum / (double)m->loss_n);
        fflush(stdout);
        m->loss_sum = 0;
        m->loss_n = 0;
    }
    return keel_step_set_metric(st, "loss", loss, hi - lo);
}

/* The chief's initial values when nothing was restored: the table
 * Keras' uniform, w ones, b zero. */
static keel_status
init_fn(void *ctx, keel_vars *vs)
{
    model *m = ctx;
    float *w = keel_var_tensor(keel_vars_find(vs, "click/w"))->data;
    for (int j = 0; j < m->dim; j++)
        w[j] = 1.0f / (float)m->dim;
    return keel_embedding_init_vars(m->emb, 42);
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
    const char *data = argc > 1 ? argv[1] : "clicks.h5";
    const char *dir = argc > 2 ? argv[2] : "embedding_run";
    long steps = argc > 3 ? strtol(argv[3], NULL, 10) : 300;
    int64_t vocab = argc > 4 ? strtoll(argv[4], NULL, 10) : 1 << 20;
    /* "sharded": each ps writes its part of a checkpoint (a table too
     * large to gather into the chief) */
    int sharded = argc > 5 && strcmp(argv[5], "sharded") == 0;
    long dim = argc > 6 ? strtol(argv[6], NULL, 10) : DIM;
    int64_t dim1[1], one[1] = { 1 };
    model m = { 0 };
    keel_vars *vs = NULL;
    keel_cluster_spec *cluster = NULL;
    keel_session *s = NULL;
    keel_hook stop = { 0 };
    keel_stop_at_step_hook_config stop_cfg;
    keel_embedding_config ecfg;
    keel_optimizer_config opt;
    keel_cluster_config copts;
    keel_training_config cfg;
    keel_scaffold scaffold;
    keel_status st;

    keel_log_set_handler(log_line, NULL, KEEL_LOG_INFO);
    if (dim < 1 || dim > MAX_DIM) {
        fprintf(stderr, "embedding: dim %ld is outside 1..%d\n", dim,
                MAX_DIM);
        return 2;
    }
    m.dim = (int)dim;
    dim1[0] = dim;
    m.print_every = steps >= 10 ? steps / 10 : 1;
    /* every task creates the same variables in the same order */
    keel_embedding_config_init(&ecfg);
    ecfg.name = "click/emb";
    ecfg.vocab = vocab;
    ecfg.dim = dim;
    ecfg.rows = 1;          /* on a cluster: the table stays on its ps */
    st = keel_vars_new(&vs);
    if (st == KEEL_OK)
        st = keel_embedding_new(&ecfg, vs, &m.emb);
    if (st == KEEL_OK)
        st = keel_vars_create(vs, "click/w", 1, dim1, KEEL_VAR_TRAINABLE,
                              NULL);
    if (st == KEEL_OK)
        st = keel_vars_create(vs, "click/b", 1, one, KEEL_VAR_TRAINABLE,
                              NULL);
    keel_optimizer_config_init(&opt, KEEL_OPT_ADAGRAD);
    opt.schedule.learning_rate = 0.1;
    keel_cluster_config_init(&copts);
    copts.optimizer = &opt;                   /* what the ps apply */
    copts.sharded_checkpoints = sharded;
    copts.checkpoint_dir = sharded ? dir : NULL;
    if (st == KEEL_OK)
        st = keel_cluster_spec_detect(&copts, &cluster);
    if (st == KEEL_OK)
        st = keel_session_install_signal_handlers();
    if (st == KEEL_OK && keel_cluster_spec_is_ps(cluster)) {
        st = keel_ps_run(cluster, vs, &copts);
        goto out;
    }
    if (st == KEEL_OK)
        st = keel_dataset_open_h5(data, 2, &m.ds);
    if (st == KEEL_OK && keel_dataset_example_size(m.ds) != FIELDS)
        st = KEEL_EINVAL;
    m.replica = keel_cluster_spec_replica_index(cluster);
    m.n_replicas = keel_cluster_spec_num_replicas(cluster);
    if (m.n_replicas < 1)
        m.n_replicas = 1;
    keel_stop_at_step_hook_config_init(&stop_cfg);
    stop_cfg.last_step = steps;
    if (st == KEEL_OK)
        st = keel_stop_at_step_hook_new(&stop_cfg, &stop);
    if (st != KEEL_OK)
        goto out;

    keel_training_config_init(&cfg);
    cfg.session.manager.vars = vs;
    keel_scaffold_init(&scaffold);
    scaffold.init_fn = init_fn;
    scaffold.ctx = &m;
    cfg.session.manager.scaffold = &scaffold;  /* copied */
    cfg.session.step = step;
    cfg.session.step_ctx = &m;
    cfg.session.hooks = &stop;
    cfg.session.n_hooks = 1;
    cfg.optimizer = &opt;
    cfg.cluster = cluster;
    cfg.cluster_config = &copts;
    cfg.session.manager.checkpoint_dir = dir;
    cfg.save_checkpoint_steps = 100;
    st = keel_training_session_new(&cfg, &s);
    if (st == KEEL_EOUTOFRANGE) {
        fprintf(stderr, "embedding: training already finished: %s\n",
                keel_last_error());
        st = KEEL_OK;
        goto out;
    }
    if (st == KEEL_OK)
        st = keel_session_train(s);
    if (st == KEEL_OK)
        st = keel_session_close(s);
    if (st == KEEL_OK)
        printf("done at step %lld\n", (long long)keel_session_global_step(s));
out:
    if (st != KEEL_OK)
        fprintf(stderr, "embedding: %s\n", keel_last_error());
    keel_session_free(s);
    keel_hook_release(&stop);
    keel_cluster_spec_free(cluster);
    keel_embedding_free(m.emb);
    keel_dataset_free(m.ds);
    keel_vars_free(vs);
    return st == KEEL_OK ? 0 : 1;
}
