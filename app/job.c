/* job.c - keel's own trainer (keel/job.h): builds the model, data, optimizer
 * and hooks a keel_config describes and runs them under
 * MonitoredTrainingSession; evaluates checkpoints with no cluster. The glue
 * between train/, checkpoint/ and the session layer; no math lives here. */
#include <config.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <json-c/json.h>

#include <keel/checkpoint.h>
#include <keel/cluster.h>
#include <keel/config.h>
#include <keel/events.h>
#include <keel/hooks.h>
#include <keel/session.h>
#include <keel/train.h>
#include <keel/job.h>
#include <keel/distributed.h>
#include <keel/supervise.h>
#include "util.h"
#include "app_int.h"
#include "../train/train_int.h"
#include "../session/step_pool.h"

#define ITER_BLOB "data_iterator"

/* Everything a training or evaluation run holds; freed by job_free. */
typedef struct job {
    const keel_config *cfg;
    keel_dataset *ds;
    keel_data_iter *it;
    keel_vars *vs;
    keel_model *model;
    /* train.strategy = mirrored: replica r steps rmodel[r] (rmodel[0] is
     * model; the others share its variables) on its slice of the batch */
    int replicas;
    keel_model *rmodel[KEEL_MAX_REPLICAS];
    keel__pool *rpool;            /* the session's replica threads (set by
                                   * replica 0 each step), for the update */
    keel_optimizer *opt;          /* NULL with kfac */
    keel_kfac *kfac;              /* optimizer.name = kfac */
    keel_lr_schedule schedule;    /* the learning rate, either way */
    int64_t global_batch;
    int64_t classes;              /* the model's class count */
    uint64_t seed;
    /* step-to-step state */
    unsigned char iter_state[KEEL_DATA_ITER_STATE_BYTES];
    keel_ckpt_blob blob;
    keel_batch batch;
    keel_job_config opts;
    int64_t last_step;
    int64_t examples;
    int64_t t0_ns, last_report_ns, last_report_examples;
    int restored;
    char restored_from[1024];
    char topology[128];
    /* The resolved config (file + -s overrides + environment) as INI text,
     * stored in every checkpoint so `keel eval DIR` rebuilds this model. */
    char *config_dump;
    /* The model, optimizer and input preprocessing as JSON
     * (docs/checkpoint-format.md), stored in every checkpoint. */
    char *arch_dump;
    int64_t steps_per_epoch;      /* global steps per epoch */
    int64_t examples_per_gstep;   /* examples one global step trains */
    int64_t last_report_gstep;
    int64_t save_epochs, validate_epochs;
    int64_t epoch_done;           /* epochs completed, reported */
    keel__validator *validator;
    keel_events *val_events;
    keel_cluster_backend *worker; /* a cluster chief's, for pulls */
    /* train.micro_batch: size, and in a cluster one gradient store per
     * micro-batch of this replica's slice (pushed separately) */
    int64_t micro;
    int n_micro;
    keel_grads *micro_g[64];
    /* Sync on a cluster with canonical leaves (reduce_leaves > 0): this
     * replica's slice cut into the tree nodes that cover its leaves, node
     * c being examples [node_off[c], + node_len[c]) computed into
     * micro_g[c] (n_nodes > 1; 0: one node, the session's gradients) */
    int64_t leaves;
    int n_nodes;
    size_t node_off[64], node_len[64];
    /* multi_worker_mirrored with leaves the ranks do not split evenly:
     * every rank reads the whole global batch and trains examples
     * [slice_off, + slice_len) of it, its leaves (0: the iterator's
     * slice is the rank's) */
    size_t slice_off, slice_len;
    /* One process: the job zeroes the step's gradients itself (the session
     * is told to skip it) and knows when the last update already did. */
    int own_zeroing;
    keel_grads *zeroed;           /* zero since job_apply; NULL: unknown */
    /* [algorithm] when algorithm.name is set (else the spec's mode) */
    int has_algo;
    /* the step after this replica's newest step: under a local-step rule
     * ahead of the shared global step by its uncommitted local steps */
    int64_t own_step;
    keel_algorithm_config algo;
    double algo_rates[1024];
    /* each replica's gradient is the mean over its own slice (not a share
     * of the global batch): a rule with local steps, and every replica
     * over the ps (the ps weighs the replicas' means by their examples) */
    int local_norm;
    /* The update rule, decided once by job_rule: its rounds take one
     * global batch (else each replica's own slice), and its workers push
     * gradients (the optimizer's slots live in this process). */
    int rule_sync, opt_slots;
    /* algorithm.name = hogwild in one process: hw_threads threads, each
     * with its own model on the shared store (hw_model[0] is model) and
     * its own global_batch slice of the iterator's hw_threads-fold batch */
    keel_hogwild *hw;
    int hw_threads;
    keel_model *hw_model[KEEL_HOGWILD_MAX_THREADS];
    const keel_batch *hw_batch;
    keel_step_stats hw_stats[KEEL_HOGWILD_MAX_THREADS];
    /* K-FAC: this task computes factor statistics (one process, or the
     * chief of kfac.distributed = chief) */
    int kfac_observes;
    int kfac_role;                /* kfac.distributed = roles: 0 gradient,
                                   * 1 covariance, 2 inverse */
    int kfac_rta;                 /* replicas a sync step aggregates; 0:
                                   * the spec's */
    keel__kfac_dist *kdist;       /* kfac.distributed = roles */
} job;

/* The [algorithm] keys into j->algo (when algorithm.name is set). */
static keel_status
algorithm_from(const keel_config *cfg, job *j)
{
    keel_status st;
    int n;
    j->has_algo = keel_config_is_set(cfg, "algorithm.name") ||
        keel_config_str(cfg, "algorithm.worker_learning_rates")[0] != '\0';
    if (!j->has_algo)
        return KEEL_OK;
    keel_algorithm_config_init(&j->algo, KEEL_ALGORITHM_SYNC);
    st = keel_algorithm_from_name(keel_config_str(cfg, "algorithm.name"),
                                  &j->algo.name);
    if (st != KEEL_OK)
        return keel__wrap(st, "algorithm.name");
    j->algo.learning_rate = keel_config_double(cfg, "algorithm.learning_rate");
    j->algo.ps_learning_rate =
        keel_config_double(cfg, "algorithm.ps_learning_rate");
    j->algo.window = (int)keel_config_int(cfg, "algorithm.window");
    j->algo.n_fetch = (int)keel_config_int(cfg, "algorithm.n_fetch");
    j->algo.n_push = (int)keel_config_int(cfg, "algorithm.n_push");
    j->algo.epsilon = keel_config_double(cfg, "algorithm.epsilon");
    j->algo.moving_rate = keel_config_double(cfg, "algorithm.moving_rate");
    j->algo.momentum = keel_config_double(cfg, "algorithm.momentum");
    n = keel_config_double_list(cfg, "algorithm.worker_learning_rates",
                                j->algo_rates, 1024);
    if (n < 0)
        return keel__fail(KEEL_EINVAL, "algorithm.worker_learning_rates: "
                          "more than 1024 rates");
    j->algo.worker_learning_rates = n > 0 ? j->algo_rates : NULL;
    j->algo.n_worker_learning_rates = n;
    return KEEL_OK;
}

static void
job_free(job *j)
{
    for (int i = 0; i < j->n_micro; i++)
        keel_grads_free(j->micro_g[i]);
    keel_hogwild_free(j->hw);
    for (int t = 1; t < j->hw_threads; t++)
        keel_model_free(j->hw_model[t]);
    keel_optimizer_free(j->opt);
    keel__kfac_dist_free(j->kdist);
    keel_kfac_free(j->kfac);
    for (int r = 1; r < j->replicas; r++)
        keel_model_free(j->rmodel[r]);
    keel_model_free(j->model);
    keel_vars_free(j->vs);
    keel_data_iter_free(j->it);
    keel_dataset_free(j->ds);
    free(j->config_dump);
    free(j->arch_dump);
    keel__validator_free(j->validator);
    keel_events_close(j->val_events);
}

/* "<dir>/<stem>-idx?-ubyte" with or without ".gz", whichever exists. */
static keel_status
find_idx(const char *dir, const char *stem, char *out, size_t size)
{
    static const char *suffix[] = { ".gz", "" };
    struct stat sb;
    for (int i = 0; i < 2; i++) {
        keel_status st = keel__fmt(out, size, "data path", "%s/%s%s", dir,
                                   stem, suffix[i]);
        if (st != KEEL_OK)
            return st;
        if (stat(out, &sb) == 0)
            return KEEL_OK;
    }
    return keel__fail(KEEL_EINVAL, "data file %s/%s[.gz] does not exist "
                      "(data.dir = %s); install Debian's "
                      "dataset-fashion-mnist or point data.dir at MNIST-"
                      "format files", dir, stem, dir);
}

/* The path of the HDF5 training (is_test 0) or test file into path. */
static keel_status
h5_path(const keel_config *cfg, int is_test, char *path, size_t size)
{
    const char *dir = keel_config_str(cfg, "data.dir");
    const char *file = keel_config_str(cfg, is_test ? "data.test_file"
                                                    : "data.train_file");
    if (file[0] == '\0')
        return keel__fail(KEEL_EINVAL, "data.format = hdf5 needs "
                          "data.%s_file", is_test ? "test" : "train");
    if (file[0] == '/')
        return keel__fmt(path, size, "data path", "%s", file);
    return keel__path_join(path, size, dir, file);
}

/* data.stream for the file at path: on, off, or auto (on when the file
 * is larger than data.memory_budget_mb). */
static int
stream_file(const keel_config *cfg, const char *path)
{
    const char *mode = keel_config_str(cfg, "data.stream");
    struct stat sb;
    if (strcmp(mode, "on") == 0 || strcmp(mode, "off") == 0)
        return strcmp(mode, "on") == 0;
    return stat(path, &sb) == 0 &&
           (uint64_t)sb.st_size >
               (uint64_t)keel_config_int(cfg, "data.memory_budget_mb") << 20;
}

keel_status
keel__job_open_dataset(const keel_config *cfg, int is_test, int64_t classes,
                       int labels_only, keel_dataset **out)
{
    const char *dir = keel_config_str(cfg, "data.dir");
    keel_status st;
    if (strcmp(keel_config_str(cfg, "data.format"), "hdf5") == 0) {
        char path[KEEL_PATH_MAX];
        keel_dataset_h5_config hc;
        st = h5_path(cfg, is_test, path, sizeof path);
        if (st != KEEL_OK)
            return st;
        keel_dataset_h5_config_init(&hc);
        if (classes > 0)
            hc.num_classes = classes;
        hc.stream = labels_only || stream_file(cfg, path);
        hc.block_rows = keel_config_int(cfg, "data.shuffle_block");
        st = keel_dataset_open_h5_config(path, &hc, out);
        if (st == KEEL_OK && keel_dataset_is_streamed(*out) && !labels_only)
            keel__log(KEEL_LOG_INFO, "data: %s streamed in blocks of %lld "
                      "rows (data.stream = %s)", path,
                      (long long)hc.block_rows,
                      keel_config_str(cfg, "data.stream"));
        return st;
    }
    {
        char images[KEEL_PATH_MAX], labels[KEEL_PATH_MAX];
        const char *pre = is_test ? "t10k" : "train";
        char stem[64];
        snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", pre);
        st = find_idx(dir, stem, images, sizeof images);
        if (st != KEEL_OK)
            return st;
        snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", pre);
        st = find_idx(dir, stem, labels, sizeof labels);
        if (st != KEEL_OK)
            return st;
        /* uint8 labels: at most 256 classes */
        return keel_dataset_open_idx(images, labels,
                                     classes > 0 && classes < 256
                                         ? (int)classes : 256, out);
    }
}

keel_status
keel__job_classes(const keel_config *cfg, const keel_dataset *train,
                  int64_t *out)
{
    keel_dataset *own = NULL;
    int64_t max;
    keel_status st;
    *out = keel_config_int(cfg, "model.classes");
    if (*out > 0)
        return KEEL_OK;
    if (train == NULL) {
        st = keel__job_open_dataset(cfg, 0, 0, 1, &own);
        if (st != KEEL_OK)
            return keel__wrap(st, "model.classes = 0 takes the class count "
                              "from the training set's labels");
        train = own;
    }
    max = keel_dataset_max_label(train);
    keel_dataset_free(own);
    if (max < 1)
        return keel__fail(KEEL_EINVAL, "model.classes = 0 takes the class "
                          "count from the training set's labels, whose "
                          "largest is %lld: set model.classes",
                          (long long)max);
    *out = max + 1;
    return KEEL_OK;
}

keel_status
keel__job_model_config_from(const keel_config *cfg, const keel_dataset *ds,
                            int64_t classes, int64_t max_batch,
                            keel_model_config *mc)
{
    keel_status st;
    keel_model_config_init(mc);
    st = keel_model_kind_from_name(keel_config_str(cfg, "model.type"),
                                   &mc->kind);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "model.type");
    if (mc->kind == KEEL_MODEL_CNN && keel_dataset_rank(ds) == 2)
        return keel__fail(KEEL_EINVAL, "model.type = cnn needs images "
                          "([N,H,W] or [N,H,W,C]); the data is tabular "
                          "[N,%zu]: use model.type = softmax or mlp",
                          keel_dataset_example_size(ds));
    if (mc->kind == KEEL_MODEL_MLP) {
        st = keel_model_parse_hidden(keel_config_str(cfg, "model.hidden"),
                                     mc);
        if (st != KEEL_OK)
            return keel__wrap(KEEL_EINVAL, "model.hidden");
    }
    st = keel_init_kind_from_name(keel_config_str(cfg, "model.init"),
                                  &mc->init);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "model.init");
    keel_dataset_shape(ds, &mc->height, &mc->width, &mc->channels);
    mc->classes = classes;
    mc->max_batch = max_batch;
    mc->threads = (int)keel_config_int(cfg, "train.model_threads");
    return KEEL_OK;
}

static keel_status schedule_from(const keel_config *cfg,
                                 int64_t steps_per_epoch,
                                 keel_lr_schedule *s);

static keel_status
optimizer_config_from(const keel_config *cfg, int64_t steps_per_epoch,
                      keel_optimizer_config *oc)
{
    keel_optimizer_kind kind;
    keel_status st = keel_optimizer_kind_from_name(
        keel_config_str(cfg, "optimizer.name"), &kind);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "optimizer.name");
    keel_optimizer_config_init(oc, kind);
    if (keel_config_is_set(cfg, "optimizer.momentum") ||
        kind == KEEL_OPT_MOMENTUM)
        oc->momentum = keel_config_double(cfg, "optimizer.momentum");
    oc->use_nesterov = keel_config_bool(cfg, "optimizer.nesterov");
    oc->beta1 = keel_config_double(cfg, "optimizer.beta1");
    oc->beta2 = keel_config_double(cfg, "optimizer.beta2");
    oc->epsilon = keel_config_double(cfg, "optimizer.epsilon");
    oc->rho = keel_config_double(cfg, "optimizer.rho");
    oc->initial_accumulator_value =
        keel_config_double(cfg, "optimizer.initial_accumulator_value");
    return schedule_from(cfg, steps_per_epoch, &oc->schedule);
}

/* The learning rate and its schedule (optimizer.*); with schedule_unit =
 * epochs, boundaries and decay_steps count epochs of steps_per_epoch. */
static keel_status
schedule_from(const keel_config *cfg, int64_t steps_per_epoch,
              keel_lr_schedule *s)
{
    keel_status st;
    keel_lr_schedule_init(s);
    s->learning_rate =
        keel_config_double(cfg, "optimizer.learning_rate");
    st = keel_lr_kind_from_name(keel_config_str(cfg, "optimizer.schedule"),
                                &s->kind);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "optimizer.schedule");
    if (s->kind == KEEL_LR_PIECEWISE) {
        st = keel_lr_parse_piecewise(
            keel_config_str(cfg, "optimizer.boundaries"),
            keel_config_str(cfg, "optimizer.values"), s);
        if (st != KEEL_OK)
            return keel__wrap(KEEL_EINVAL, "optimizer.boundaries/values");
    }
    s->decay_rate = keel_config_double(cfg, "optimizer.decay_rate");
    s->decay_steps = keel_config_int(cfg, "optimizer.decay_steps");
    s->staircase = keel_config_bool(cfg, "optimizer.staircase");
    if (strcmp(keel_config_str(cfg, "optimizer.schedule_unit"), "epochs")
        == 0) {
        /* epoch e is global steps [e * spe, (e + 1) * spe) */
        int64_t spe = steps_per_epoch, lim = INT64_MAX / (spe > 0 ? spe : 1);
        if (spe <= 0)
            return keel__fail(KEEL_EINVAL, "optimizer.schedule_unit = epochs "
                              "needs at least one step per epoch");
        for (int i = 0; i < s->n_boundaries; i++) {
            if (s->boundaries[i] > lim)
                return keel__fail(KEEL_EINVAL, "optimizer.boundaries: epoch "
                                  "%lld is too large",
                                  (long long)s->boundaries[i]);
            s->boundaries[i] *= spe;
        }
        if (s->decay_steps > lim)
            return keel__fail(KEEL_EINVAL, "optimizer.decay_steps: %lld "
                              "epochs is too large",
                              (long long)s->decay_steps);
        s->decay_steps *= spe;
    }
    return keel_lr_schedule_validate(s);
}

/* K-FAC's config: the learning rate and its schedule from [optimizer], the
 * rest from [kfac], the sampling seed from train.seed. */
static keel_status
kfac_config_from(const keel_config *cfg, int64_t steps_per_epoch,
                 keel_kfac_config *kc)
{
    keel_status st;
    keel_kfac_config_init(kc);
    if ((st = schedule_from(cfg, steps_per_epoch, &kc->schedule)) != KEEL_OK)
        return st;
    if (!keel_config_is_set(cfg, "optimizer.learning_rate"))
        kc->schedule.learning_rate = 0.0001;   /* kfac's convnet example */
    kc->damping = keel_config_double(cfg, "kfac.damping");
    kc->cov_ema_decay = keel_config_double(cfg, "kfac.cov_ema_decay");
    kc->momentum = keel_config_double(cfg, "kfac.momentum");
    st = keel_kfac_momentum_type_from_name(
        keel_config_str(cfg, "kfac.momentum_type"), &kc->momentum_type);
    if (st == KEEL_OK)
        st = keel_kfac_estimation_from_name(
            keel_config_str(cfg, "kfac.estimation_mode"), &kc->estimation);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "[kfac]");
    kc->norm_constraint = keel_config_double(cfg, "kfac.norm_constraint");
    kc->invert_every = keel_config_int(cfg, "kfac.invert_every");
    kc->cov_update_every = keel_config_int(cfg, "kfac.cov_update_every");
    kc->seed = (uint64_t)keel_config_int(cfg, "train.seed");
    return KEEL_OK;
}

/* OpenBLAS threads: train.threads, or 1 under model threads (each model
 * thread runs its own single-threaded sgemm). Neither changes the bits. */
void
keel__job_set_blas_threads(const keel_config *cfg)
{
    if (keel_config_int(cfg, "train.model_threads") > 1)
        keel_train_set_threads(1);
    else if (keel_config_int(cfg, "train.threads") > 0)
        keel_train_set_threads((int)keel_config_int(cfg, "train.threads"));
}

keel_status
keel__job_steps_per_epoch(const keel_config *cfg, int64_t *out)
{
    keel_dataset *ds = NULL;
    keel_data_iter *it = NULL;
    keel_data_iter_config ic;
    keel_status st = keel__job_open_dataset(cfg, 0, 0, 1, &ds);
    *out = 0;
    if (st != KEEL_OK)
        return st;
    keel_data_iter_config_init(&ic);          // as job_build, replica 0 of 1
    ic.global_batch_size = keel_config_int(cfg, "train.batch_size");
    ic.seed = (uint64_t)keel_config_int(cfg, "train.seed");
    ic.shuffle = keel_config_bool(cfg, "data.shuffle");
    ic.max_epochs = keel_config_int(cfg, "train.epochs");
    st = keel_data_iter_new(ds, &ic, &it);
    if (st == KEEL_OK)
        *out = keel_data_iter_steps_per_epoch(it);
    keel_data_iter_free(it);
    keel_dataset_free(ds);
    return st;
}

/* o[key] = v (a JSON number, or a string: copied). */
static void
put_num(struct json_object *o, const char *key, double v)
{
    json_object_object_add(o, key, json_object_new_double(v));
}

static void
put_str(struct json_object *o, const char *key, const char *v)
{
    json_object_object_add(o, key, json_object_new_string(v));
}

/* The architecture JSON of docs/checkpoint-format.md: the model's layers
 * plus its optimizer and input preprocessing. */
static keel_status
arch_dump(job *j, const keel_optimizer_config *oc,
          const keel_kfac_config *kc)
{
    struct json_object *o = keel__model_arch(j->model), *opt, *pre;
    const keel_config *cfg = j->cfg;
    const char *text;
    if (o == NULL)
        return keel__fail(KEEL_ENOMEM, "architecture description");
    opt = json_object_new_object();
    put_str(opt, "name", kc != NULL ? "kfac"
            : keel_optimizer_kind_name(oc->kind));
    put_num(opt, "learning_rate", j->schedule.learning_rate);
    put_str(opt, "schedule", keel_config_str(cfg, "optimizer.schedule"));
    put_str(opt, "schedule_unit",
            keel_config_str(cfg, "optimizer.schedule_unit"));
    put_str(opt, "boundaries", keel_config_str(cfg, "optimizer.boundaries"));
    put_str(opt, "values", keel_config_str(cfg, "optimizer.values"));
    if (kc != NULL) {
        put_num(opt, "damping", kc->damping);
        put_num(opt, "cov_ema_decay", kc->cov_ema_decay);
        put_num(opt, "momentum", kc->momentum);
        put_str(opt, "momentum_type",
                keel_config_str(cfg, "kfac.momentum_type"));
        put_str(opt, "estimation_mode",
                keel_config_str(cfg, "kfac.estimation_mode"));
        put_num(opt, "norm_constraint", kc->norm_constraint);
        json_object_object_add(opt, "invert_every",
                               json_object_new_int64(kc->invert_every));
        json_object_object_add(opt, "cov_update_every",
                               json_object_new_int64(kc->cov_update_every));
    } else {
        put_num(opt, "momentum", oc->momentum);
        json_object_object_add(opt, "nesterov",
                               json_object_new_boolean(oc->use_nesterov));
        put_num(opt, "beta_1", oc->beta1);
        put_num(opt, "beta_2", oc->beta2);
        put_num(opt, "epsilon", oc->epsilon);
        put_num(opt, "rho", oc->rho);
        put_num(opt, "initial_accumulator_value",
                oc->initial_accumulator_value);
    }
    json_object_object_add(opt, "batch_size",
                           json_object_new_int64(j->global_batch));
    json_object_object_add(o, "optimizer", opt);
    pre = json_object_new_object();
    put_str(pre, "layout", "NHWC");
    put_str(pre, "dtype", "float32");
    put_num(pre, "uint8_scale", 1.0 / 255.0);
    put_str(pre, "data_format", keel_config_str(cfg, "data.format"));
    json_object_object_add(o, "preprocessing", pre);
    text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
    j->arch_dump = text != NULL ? strdup(text) : NULL;
    json_object_put(o);
    if (j->arch_dump == NULL)
        return keel__fail(KEEL_ENOMEM, "architecture description");
    return KEEL_OK;
}

/* Hogwild's threads and models (algorithm.name = hogwild, one process). */
static keel_status
hogwild_build(job *j, const keel_config *cfg, const keel_model_config *mc,
              const keel_optimizer_config *oc)
{
    keel_hogwild_config hc;
    keel_model_config one = *mc;
    keel_status st = KEEL_OK;
    keel_hogwild_config_init(&hc);
    hc.threads = j->hw_threads;
    hc.use_cas = keel_config_bool(cfg, "algorithm.hogwild_cas");
    one.threads = 1;
    j->hw_model[0] = j->model;
    for (int t = 1; t < j->hw_threads && st == KEEL_OK; t++)
        st = keel_model_new_shared(&one, j->vs, &j->hw_model[t]);
    if (st == KEEL_OK)
        st = keel_hogwild_new(&hc, oc, j->vs, &j->hw);
    if (st != KEEL_OK)
        return keel__wrap(st, "algorithm.name = hogwild with "
                          "train.model_threads = %d", j->hw_threads);
    return KEEL_OK;
}

/* The training set and this worker's iterator over it; hogwild: a round
 * of the iterator's batch is one global batch per thread. */
static keel_status
job_data(job *j, const keel_config *cfg, int worker_index, int num_workers,
         int hogwild)
{
    keel_data_iter_config ic;
    int64_t classes = keel_config_int(cfg, "model.classes");
    keel_status st = keel__job_open_dataset(cfg, 0, classes, 0, &j->ds);
    if (st == KEEL_OK)
        st = keel__job_classes(cfg, j->ds, &j->classes);
    if (st != KEEL_OK)
        return st;
    if (classes == 0)
        keel__log(KEEL_LOG_INFO, "model.classes = %lld from the training "
                  "set's labels (largest %lld); set model.classes to fix it",
                  (long long)j->classes,
                  (long long)keel_dataset_max_label(j->ds));
    keel_data_iter_config_init(&ic);
    ic.global_batch_size = j->global_batch * (hogwild ? j->hw_threads : 1);
    ic.seed = j->seed;
    ic.shuffle = keel_config_bool(cfg, "data.shuffle");
    ic.max_epochs = keel_config_int(cfg, "train.epochs");
    ic.worker_index = worker_index;
    ic.num_workers = num_workers;
    return keel_data_iter_new(j->ds, &ic, &j->it);
}

/* The variables and the model (its config into mc); hogwild: the threads
 * are Hogwild's, and a round of the iterator's batch is one global step
 * per thread. */
static keel_status
job_model(job *j, const keel_config *cfg, int hogwild,
          keel_model_config *mc)
{
    keel_status st = keel_vars_new(&j->vs);
    if (st == KEEL_OK)
        st = keel__job_model_config_from(cfg, j->ds, j->classes,
                                         j->global_batch, mc);
    if (st == KEEL_OK && hogwild)
        mc->threads = 1;
    if (st == KEEL_OK)
        st = keel_model_new(mc, j->vs, &j->model);
    if (st == KEEL_OK)
        j->steps_per_epoch = keel_data_iter_steps_per_epoch(j->it) *
                             (hogwild ? j->hw_threads : 1);
    return st;
}

/* optimizer.name = kfac: K-FAC (one_process: it applies the gradients the
 * model step wrote), its state for kfac.distributed = roles, and the
 * architecture description. */
static keel_status
job_kfac(job *j, const keel_config *cfg, int one_process)
{
    keel_kfac_config kc;
    keel_status st = kfac_config_from(cfg, j->steps_per_epoch, &kc);
    kc.model_grads = one_process;
    if (st == KEEL_OK) {
        j->schedule = kc.schedule;
        st = keel_kfac_new(&kc, j->model, j->vs, &j->kfac);
    }
    if (st == KEEL_OK && keel__kfac_dist_roles(cfg))
        st = keel__kfac_dist_add_state(j->kfac, j->vs);
    if (st == KEEL_OK)
        st = arch_dump(j, NULL, &kc);
    return st;
}

/* Every other optimizer, the architecture description, and with hogwild
 * its threads. */
static keel_status
job_optimizer(job *j, const keel_config *cfg, const keel_model_config *mc,
              int hogwild)
{
    keel_optimizer_config oc;
    keel_status st = optimizer_config_from(cfg, j->steps_per_epoch, &oc);
    if (st == KEEL_OK)
        st = keel_optimizer_new(&oc, &j->opt);
    if (st == KEEL_OK) {
        j->schedule = oc.schedule;
        st = arch_dump(j, &oc, NULL);
    }
    if (st == KEEL_OK && hogwild)
        st = hogwild_build(j, cfg, mc, &oc);
    return st;
}

/* The topology line every checkpoint records. */
static void
job_topology(job *j, int num_workers, int hogwild)
{
    if (num_workers > 1)
        snprintf(j->topology, sizeof j->topology, "cluster replicas=%d "
                 "batch=%lld", num_workers, (long long)j->global_batch);
    else if (hogwild)
        snprintf(j->topology, sizeof j->topology, "single-process hogwild "
                 "threads=%d batch=%lld", j->hw_threads,
                 (long long)j->global_batch);
    else
        snprintf(j->topology, sizeof j->topology, "single-process "
                 "workers=1 batch=%lld", (long long)j->global_batch);
}

/* Build dataset, iterator, variables, model and optimizer; hogwild: one
 * process runs algorithm.name = hogwild; one_process: no cluster and no
 * collective (K-FAC then applies the gradients the model step wrote). */
static keel_status
job_build(job *j, const keel_config *cfg, int worker_index, int num_workers,
          int hogwild, int one_process)
{
    keel_model_config mc;
    keel_status st;

    memset(j, 0, sizeof *j);
    j->cfg = cfg;
    j->global_batch = keel_config_int(cfg, "train.batch_size");
    j->seed = (uint64_t)keel_config_int(cfg, "train.seed");
    j->hw_threads = hogwild
        ? (int)keel_config_int(cfg, "train.model_threads") : 0;
    keel__job_set_blas_threads(cfg);
    st = job_data(j, cfg, worker_index, num_workers, hogwild);
    if (st == KEEL_OK)
        st = algorithm_from(cfg, j);
    if (st == KEEL_OK)
        st = job_model(j, cfg, hogwild, &mc);
    if (st == KEEL_OK)
        st = strcmp(keel_config_str(cfg, "optimizer.name"), "kfac") == 0
            ? job_kfac(j, cfg, one_process)
            : job_optimizer(j, cfg, &mc, hogwild);
    if (st == KEEL_OK)
        st = keel_config_dump(cfg, 0, &j->config_dump);
    job_topology(j, num_workers, hogwild);
    return st;
}

/* ---- session callbacks ------------------------------------------------------ */

/* Set the step's loss, accuracy and learning rate from stats. */
static keel_status
step_values(job *j, keel_step *stp, const keel_step_stats *stats)
{
    keel_status st = keel_step_set_value(stp, "loss", stats->count > 0
        ? stats->loss_sum / (double)stats->count : 0.0);
    if (st == KEEL_OK)
        st = keel_step_set_value(stp, "accuracy", stats->count > 0
            ? (double)stats->correct / stats->count : 0.0);
    if (st == KEEL_OK)
        st = keel_step_set_value(stp, "learning_rate", keel_lr_at(
            &j->schedule, keel_step_global_step(stp)));
    return st;
}

/* Examples [off, off + n) of b: a view, nothing copied; stride is
 * one example's floats. */
static keel_batch
batch_slice(const keel_batch *b, size_t off, size_t n, size_t stride)
{
    keel_batch s = { b->x + off * stride, b->y + off, n };
    return s;
}

static void
stats_add(keel_step_stats *sum, const keel_step_stats *one)
{
    sum->loss_sum += one->loss_sum;
    sum->correct += one->correct;
    sum->count += one->count;
}

/* Mirrored: replica r of R trains examples [r*n/R, (r+1)*n/R) of the
 * batch on its own model into its own gradients (the session adds them).
 * Runs on R threads at once: it writes only replica r's state. */
static keel_status
replica_step(job *j, keel_step *stp, const keel_batch *b)
{
    int r = keel_step_replica(stp), R = keel_step_num_replicas(stp);
    size_t lo = b->n * (size_t)r / (size_t)R;
    size_t hi = b->n * (size_t)(r + 1) / (size_t)R;
    size_t stride = keel_dataset_example_size(j->ds);
    keel_step_stats stats;
    keel_batch slice;
    keel_status st;
    if (R != j->replicas || hi <= lo)
        return keel__fail(KEEL_EINTERNAL, "replica %d of %d: batch of %zu "
                          "for %d replicas", r, R, b->n, j->replicas);
    slice = batch_slice(b, lo, hi - lo, stride);
    st = keel_model_step(j->rmodel[r], keel_step_vars(stp), &slice,
                         j->global_batch, keel_step_grads(stp), &stats);
    if (st != KEEL_OK)
        return keel__wrap(st, "replica %d", r);
    if (r == 0) {
        j->examples += (int64_t)b->n;
        j->rpool = keel__step_pool(stp);
    }
    return step_values(j, stp, &stats);
}

/* Hogwild thread t: its slice of the round's batch on its own model. */
static keel_status
hogwild_thread(void *ctx, int t, keel_grads *grads, int64_t global_step)
{
    job *j = ctx;
    const keel_batch *b = j->hw_batch;
    size_t lo = b->n * (size_t)t / (size_t)j->hw_threads;
    size_t hi = b->n * ((size_t)t + 1) / (size_t)j->hw_threads;
    keel_batch mb = batch_slice(b, lo, hi - lo,
                                keel_dataset_example_size(j->ds));
    (void)global_step;
    memset(&j->hw_stats[t], 0, sizeof j->hw_stats[t]);
    if (mb.n == 0)
        return KEEL_OK;
    return keel_model_step(j->hw_model[t], j->vs, &mb, (int64_t)mb.n, grads,
                           &j->hw_stats[t]);
}

/* One Hogwild round: every thread trains its mini-batch and updates the
 * store lock-free; the round counts one global step per thread. */
static keel_status
hogwild_step(job *j, keel_step *stp, const keel_batch *b,
             keel_step_stats *stats)
{
    int64_t gs = keel_step_global_step(stp);
    keel_status st;
    j->hw_batch = b;
    st = keel_hogwild_run(j->hw, hogwild_thread, j, gs);
    if (st != KEEL_OK)
        return st;
    memset(stats, 0, sizeof *stats);
    for (int t = 0; t < j->hw_threads; t++)
        stats_add(stats, &j->hw_stats[t]);
    keel_step_mark_applied(stp);
    keel_vars_set_global_step(keel_step_vars(stp), gs + j->hw_threads);
    return KEEL_OK;
}

/* One piece of the step's batch through the model, its loss and accuracy
 * added to stats: into own (zeroed first), or with own NULL into the
 * step's gradients; norm divides the loss. */
static keel_status
piece_step(job *j, keel_step *stp, const keel_batch *piece, int64_t norm,
           keel_grads *own, keel_step_stats *stats)
{
    keel_step_stats one;
    keel_status st;
    if (own != NULL)
        keel_grads_zero(own);
    st = keel_model_step(j->model, keel_step_vars(stp), piece, norm,
                         own != NULL ? own : keel_step_grads(stp), &one);
    if (st == KEEL_OK)
        stats_add(stats, &one);
    return st;
}

/* train.micro_batch: fixed micro-batches, each computed alone and added in
 * order (in a cluster each into its own gradient store, pushed
 * separately). */
static keel_status
micro_step(job *j, keel_step *stp, const keel_batch *b,
           keel_step_stats *stats)
{
    size_t m = (size_t)j->micro, stride = keel_dataset_example_size(j->ds);
    int64_t norm = j->local_norm ? (int64_t)b->n : j->global_batch;
    keel_status st;
    if (b->n % m != 0)
        return keel__fail(KEEL_EINVAL, "train.micro_batch = %zu does not "
                          "divide this batch of %zu examples", m, b->n);
    memset(stats, 0, sizeof *stats);
    for (size_t k = 0; k < b->n / m; k++) {
        keel_batch mb = batch_slice(b, k * m, m, stride);
        keel_grads *own = NULL;
        if (j->n_micro > 0) {
            if (k >= (size_t)j->n_micro)
                return keel__fail(KEEL_EINTERNAL, "micro-batch %zu of %d",
                                  k, j->n_micro);
            own = j->micro_g[k];
        }
        if ((st = piece_step(j, stp, &mb, norm, own, stats)) != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* Canonical leaves on a cluster: each tree node's sum alone, into its own
 * gradient store; the ps adds them along the tree. */
static keel_status
tree_step(job *j, keel_step *stp, const keel_batch *b,
          keel_step_stats *stats)
{
    size_t stride = keel_dataset_example_size(j->ds);
    keel_status st;
    memset(stats, 0, sizeof *stats);
    for (int c = 0; c < j->n_nodes; c++) {
        keel_batch nb;
        if (j->node_off[c] + j->node_len[c] > b->n)
            return keel__fail(KEEL_EINTERNAL, "tree node %d: examples "
                              "[%zu, +%zu) of a batch of %zu", c,
                              j->node_off[c], j->node_len[c], b->n);
        nb = batch_slice(b, j->node_off[c], j->node_len[c], stride);
        st = piece_step(j, stp, &nb, j->global_batch, j->micro_g[c], stats);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* The step's gradients (and with Hogwild the update) from batch b: by
 * Hogwild's threads, fixed micro-batches, tree nodes, or all at once. */
static keel_status
batch_step(job *j, keel_step *stp, const keel_batch *b,
           keel_step_stats *stats)
{
    if (j->hw != NULL)
        return hogwild_step(j, stp, b, stats);
    if (j->micro > 0)
        return micro_step(j, stp, b, stats);
    if (j->n_nodes > 0)
        return tree_step(j, stp, b, stats);
    return keel_model_step(j->model, keel_step_vars(stp), b,
                           j->local_norm ? (int64_t)b->n : j->global_batch,
                           keel_step_grads(stp), stats);
}

static keel_status
job_step(void *ctx, keel_step *stp)
{
    job *j = ctx;
    const keel_batch *b = keel_step_batch(stp);
    keel_step_stats stats;
    keel_batch slice;
    keel_status st;
    if (b == NULL)
        return keel__fail(KEEL_EINTERNAL, "train step: no batch was fed");
    if (keel_step_num_replicas(stp) > 1)
        return replica_step(j, stp, b);
    /* one replica only: mirrored replicas run on several threads, and no
     * local-step rule runs mirrored */
    j->own_step = keel_step_global_step(stp) + 1;
    if (j->own_zeroing && j->hw == NULL &&
        j->zeroed != keel_step_grads(stp))
        keel_grads_zero(keel_step_grads(stp));
    j->zeroed = NULL;
    if (j->kfac_role == 2)              /* an inverse worker: no batch */
        return keel_step_set_value(stp, "loss", 0.0);
    if (j->slice_len > 0) {
        if (j->slice_off + j->slice_len > b->n)
            return keel__fail(KEEL_EINTERNAL, "this rank's examples [%zu, "
                              "+%zu) of a batch of %zu", j->slice_off,
                              j->slice_len, b->n);
        slice = batch_slice(b, j->slice_off, j->slice_len,
                            keel_dataset_example_size(j->ds));
        b = &slice;
    }
    if ((st = batch_step(j, stp, b, &stats)) != KEEL_OK)
        return st;
    if (j->worker != NULL &&
        (st = keel_grads_set_examples(keel_step_grads(stp), (int64_t)b->n))
        != KEEL_OK)
        return st;
    if (j->kfac != NULL && j->kfac_observes &&
        (st = keel_kfac_observe(j->kfac, keel_step_vars(stp), b,
                                keel_step_global_step(stp))) != KEEL_OK)
        return st;
    j->examples += (int64_t)b->n;
    return step_values(j, stp, &stats);
}

static keel_status
job_apply(void *ctx, keel_vars *vs, keel_grads *g, int64_t global_step)
{
    job *j = ctx;
    keel_status st;
    if (j->kfac != NULL) {
        j->zeroed = NULL;            /* job_step zeroes them */
        return keel_kfac_apply(j->kfac, vs, g, global_step);
    }
    if (!j->own_zeroing)              /* mirrored: on the replicas' threads */
        return keel__optimizer_apply_pooled(j->opt, vs, g, global_step, 0,
                                            j->replicas > 1 ? j->rpool
                                                            : NULL);
    /* zeroing g as the update passes saves the next step a pass over it */
    st = keel__optimizer_apply_pooled(j->opt, vs, g, global_step, 1,
                                      keel__model_pool(j->model));
    j->zeroed = st == KEEL_OK ? g : NULL;
    return st;
}

/* kfac.distributed = chief: the chief's update of a sync step, with the
 * step's mean gradient from the ps (keel_cluster_config.chief_apply). */
static keel_status
job_chief_apply(void *ctx, keel_vars *vs, keel_grads *mean,
                int64_t global_step)
{
    job *j = ctx;
    return keel_kfac_apply(j->kfac, vs, mean, global_step);
}

static keel_status
job_init(void *ctx, keel_vars *vs)
{
    job *j = ctx;
    return keel_model_init_vars(j->model, vs, j->seed);
}

static keel_status
job_feed(void *ctx, int64_t global_step, const void **batch)
{
    job *j = ctx;
    (void)global_step;      /* the iterator's state is in the checkpoint */
    keel_status st = keel_data_iter_next(j->it, &j->batch);
    if (st != KEEL_OK)
        return st;
    *batch = &j->batch;
    return KEEL_OK;
}

static keel_status
job_meta(void *ctx, keel_ckpt_meta *meta)
{
    job *j = ctx;
    size_t len = 0;
    keel_status st = keel_data_iter_state(j->it, j->iter_state,
                                              sizeof j->iter_state, &len);
    if (st != KEEL_OK)
        return st;
    j->blob.name = ITER_BLOB;
    j->blob.data = j->iter_state;
    j->blob.size = len;
    meta->blobs = &j->blob;
    meta->n_blobs = 1;
    meta->config_text = j->config_dump;
    meta->topology = j->topology;
    meta->architecture = j->arch_dump;
    /* a save at the end of an epoch save_epochs asks for is named by it */
    if (j->save_epochs > 0 && j->steps_per_epoch > 0) {
        int64_t g = keel_vars_global_step(j->vs);
        if (g > 0 && g % j->steps_per_epoch == 0 &&
            (g / j->steps_per_epoch) % j->save_epochs == 0)
            meta->epoch = g / j->steps_per_epoch;
    }
    return KEEL_OK;
}

static keel_status
job_restore(void *ctx, const keel_ckpt_info *info)
{
    job *j = ctx;
    size_t size = 0;
    const void *blob = keel_ckpt_info_blob(info, ITER_BLOB, &size);
    j->restored = 1;
    snprintf(j->restored_from, sizeof j->restored_from, "%s/%s-%lld.h5",
             keel_config_str(j->cfg, "checkpoint.dir"),
             keel_config_str(j->cfg, "checkpoint.basename"),
             (long long)info->global_step);
    if (blob == NULL) {
        keel__log(KEEL_LOG_WARN, "%s has no data-iterator state: the data "
                  "restarts from the first example of epoch 0",
                  j->restored_from);
        return KEEL_OK;
    }
    return keel_data_iter_set_state(j->it, blob, size);
}

static keel_status
progress_after_run(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    job *j = ctx;
    keel_job_progress p;
    int64_t now = keel__now_mono_ns();
    double dt = (now - j->last_report_ns) / 1e9;
    (void)rc;
    if (j->opts.progress_fn == NULL)
        return KEEL_OK;
    memset(&p, 0, sizeof p);
    p.global_step = keel_run_values_step_after(v);
    p.last_step = j->last_step;
    p.epoch = keel_data_iter_epoch(j->it);
    p.loss = keel_run_values_get(v, "loss");
    p.accuracy = keel_run_values_get(v, "accuracy");
    p.examples_per_sec = dt > 0 ? (j->examples - j->last_report_examples) / dt
                                : 0.0;
    p.global_examples_per_sec = dt > 0
        ? (double)((p.global_step - j->last_report_gstep) *
                   j->examples_per_gstep) / dt : 0.0;
    p.learning_rate = keel_run_values_get(v, "learning_rate");
    p.steps_per_epoch = j->steps_per_epoch;
    p.epochs = keel_config_int(j->cfg, "train.epochs");
    p.elapsed_secs = (now - j->t0_ns) / 1e9;
    j->last_report_ns = now;
    j->last_report_examples = j->examples;
    j->last_report_gstep = p.global_step;
    j->opts.progress_fn(j->opts.progress_ctx, &p);
    return KEEL_OK;
}

static keel_status
progress_before_run(void *ctx, keel_run_context *rc)
{
    (void)ctx;
    keel_status st = keel_run_context_request(rc, "loss");
    if (st == KEEL_OK)
        st = keel_run_context_request(rc, "accuracy");
    if (st == KEEL_OK)
        st = keel_run_context_request(rc, "learning_rate");
    return st;
}

/* Mirrored: train.replicas models over one variable store, each with
 * train.model_threads threads. */
static keel_status
mirrored_build(job *j, const keel_config *cfg)
{
    int R = (int)keel_config_int(cfg, "train.replicas");
    int threads = (int)keel_config_int(cfg, "train.model_threads");
    keel_status st;
    if (j->kfac != NULL)
        return keel__fail(KEEL_EINVAL, "train.strategy = mirrored with "
                          "optimizer.name = kfac: K-FAC runs on "
                          "one_device only");
    if (j->hw != NULL)
        return keel__fail(KEEL_EINVAL, "train.strategy = mirrored (%s) with "
                          "algorithm.name = hogwild (%s): pick one (Hogwild "
                          "runs its own train.model_threads threads; use "
                          "train.strategy = one_device or auto)",
                          keel_config_origin(cfg, "train.strategy"),
                          keel_config_origin(cfg, "algorithm.name"));
    if (keel_config_int(cfg, "train.micro_batch") > 0)
        return keel__fail(KEEL_EINVAL, "train.strategy = mirrored with "
                          "train.micro_batch (%s): pick one (mirrored "
                          "already adds its replicas' gradients in a fixed "
                          "order)", keel_config_origin(cfg,
                                                       "train.micro_batch"));
    if (R < 1 || R > KEEL_MAX_REPLICAS || j->global_batch % R != 0)
        return keel__fail(KEEL_EINVAL, "train.replicas = %d: 1..%d, "
                          "dividing train.batch_size = %lld", R,
                          KEEL_MAX_REPLICAS, (long long)j->global_batch);
    j->replicas = R;
    j->rmodel[0] = j->model;
    for (int r = 1; r < R; r++)
        if ((st = keel__model_new_replica(j->model, j->vs, threads,
                                          &j->rmodel[r])) != KEEL_OK) {
            j->replicas = r;
            return keel__wrap(st, "mirrored replica %d", r);
        }
    snprintf(j->topology, sizeof j->topology, "single-process mirrored "
             "replicas=%d batch=%lld", R, (long long)j->global_batch);
    return KEEL_OK;
}

/* Epoch e's end is an end-of-epoch checkpoint (checkpoint.save_epochs)
 * and this task saves. */
static int
epoch_saves(const job *j, keel_session *s, int64_t e)
{
    return j->save_epochs > 0 && e % j->save_epochs == 0 &&
           keel_session_saver(s) != NULL;
}

/* The end-of-epoch checkpoint, its path into ep. save_now pulls the ps's
 * state first (the backend's before_save). */
static keel_status
epoch_save(keel_session *s, keel_job_epoch *ep)
{
    keel_status st = keel_session_save_now(s, ep->checkpoint,
                                           sizeof ep->checkpoint);
    if (st != KEEL_OK)
        return keel__wrap(st, "checkpoint at the end of epoch %lld",
                          (long long)ep->epoch);
    keel__log(KEEL_LOG_INFO, "saved end-of-epoch checkpoint: %s",
              ep->checkpoint);
    return KEEL_OK;
}

/* validation/loss and validation/accuracy at step g, flushed. */
static keel_status
validation_events(job *j, int64_t g, const keel_eval_result *er)
{
    keel_status st = keel_events_scalar(j->val_events, g, "validation/loss",
                                        er->loss);
    if (st == KEEL_OK)
        st = keel_events_scalar(j->val_events, g, "validation/accuracy",
                                er->accuracy);
    if (st == KEEL_OK)
        st = keel_events_flush(j->val_events);
    if (st != KEEL_OK)
        return keel__wrap(st, "validation events");
    return KEEL_OK;
}

/* The test set evaluated on the session's variables (a cluster chief
 * pulls them first unless pull is 0: a save just did), into ep, the log
 * and the validation events. */
static keel_status
epoch_validate(job *j, keel_session *s, int pull, keel_job_epoch *ep)
{
    keel_eval_result er;
    keel_status st;
    if (j->worker != NULL && pull &&
        (st = keel_cluster_backend_pull(j->worker)) != KEEL_OK)
        return keel__wrap(st, "validation after epoch %lld",
                          (long long)ep->epoch);
    st = keel__validator_run(j->validator, keel_session_vars(s), &er);
    if (st != KEEL_OK)
        return keel__wrap(st, "validation after epoch %lld",
                          (long long)ep->epoch);
    ep->validated = 1;
    ep->val_loss = er.loss;
    ep->val_accuracy = er.accuracy;
    ep->val_examples = er.examples;
    keel__log(KEEL_LOG_INFO, "validation after epoch %lld (step %lld): "
              "loss %.4f accuracy %.4f (%lld examples)",
              (long long)ep->epoch, (long long)ep->global_step, er.loss,
              er.accuracy, (long long)er.examples);
    if (j->val_events != NULL)
        return validation_events(j, ep->global_step, &er);
    return KEEL_OK;
}

/* The chief's end of an epoch: the learning rate (Keras's PrintLR), the
 * end-of-epoch checkpoint, validation, then the caller's epoch_fn. */
static keel_status
epoch_after_run(void *ctx, keel_run_context *rc, const keel_run_values *v)
{
    job *j = ctx;
    keel_session *s = keel_run_context_session(rc);
    int64_t g = keel_run_values_step_after(v), e;
    keel_job_epoch ep;
    int saves;
    keel_status st;
    if (j->steps_per_epoch <= 0 || g <= 0 || g % j->steps_per_epoch != 0)
        return KEEL_OK;
    e = g / j->steps_per_epoch;
    if (e <= j->epoch_done)
        return KEEL_OK;
    j->epoch_done = e;
    memset(&ep, 0, sizeof ep);
    ep.epoch = e;
    ep.global_step = g;
    ep.learning_rate = keel_run_values_get(v, "learning_rate");
    /* debug: keel train prints its own epoch line (epoch_fn) */
    keel__log(KEEL_LOG_DEBUG, "epoch %lld ended at step %lld: learning rate "
              "for epoch %lld was %g", (long long)e, (long long)g,
              (long long)e, ep.learning_rate);
    saves = epoch_saves(j, s, e);
    if (saves && (st = epoch_save(s, &ep)) != KEEL_OK)
        return st;
    if (j->validator != NULL && e % j->validate_epochs == 0 &&
        (st = epoch_validate(j, s, !saves, &ep)) != KEEL_OK)
        return st;
    if (j->opts.epoch_fn != NULL)
        j->opts.epoch_fn(j->opts.progress_ctx, &ep);
    return KEEL_OK;
}

/* Steps the run will end at: max_steps and/or epochs, whichever first. */
static int64_t
planned_last_step(const job *j)
{
    int64_t max_steps = keel_config_int(j->cfg, "train.max_steps");
    int64_t epochs = keel_config_int(j->cfg, "train.epochs");
    int64_t by_epochs = epochs > 0 ? epochs * j->steps_per_epoch : 0;
    if (max_steps > 0 && (by_epochs == 0 || max_steps < by_epochs))
        return max_steps;
    return by_epochs;
}

/* A chief or a process alone that ends cleanly must have reached its last
 * step; only a signal (a stop request) may end it before. keel train adds
 * no hook that stops early without an error, so anything else is a bug or
 * an outside stop, and the run must not look successful. at: the global
 * step training stopped at, before the final checkpoint. Under a
 * local-step rule the final checkpoint's step (the parameter servers'
 * count of committed steps, which its save reads back) may be lower by the
 * local steps not committed yet (docs/algorithms.md); the run still
 * reached its end. */
static keel_status
check_reached_end(const job *j, const keel_session *s, int64_t at)
{
    keel_end_reason why = keel_session_end_reason(s);
    if (j->last_step <= 0 || at >= j->last_step || why == KEEL_END_SIGNAL)
        return KEEL_OK;
    return keel__fail(KEEL_EINTERNAL, "training ended (%s) at step %lld, "
                      "before its last step %lld, and not by a signal; "
                      "the newest checkpoint in %s resumes it",
                      keel_end_reason_name(why), (long long)at,
                      (long long)j->last_step,
                      keel_config_str(j->cfg, "checkpoint.dir"));
}

/* The cluster options of the config's [cluster] and [security] keys. */
static void
cluster_options_from(const keel_config *cfg, job *j,
                     keel_cluster_config *o)
{
    keel_cluster_config_init(o);
    o->optimizer = keel_optimizer_get_config(j->opt);
    o->algorithm = j->has_algo ? &j->algo : NULL;
    o->placement = strcmp(keel_config_str(cfg, "cluster.placement"),
                          "round_robin") == 0
                       ? KEEL_PLACEMENT_ROUND_ROBIN
                       : KEEL_PLACEMENT_SIZE_BALANCED;
    o->dead_after_ms = (int)keel_config_int(cfg, "cluster.dead_after_ms");
    o->heartbeat_ms = (int)keel_config_int(cfg, "cluster.heartbeat_ms");
    o->stall_warn_secs = keel_config_double(cfg, "cluster.stall_warn_secs");
    o->step_timeout_secs =
        keel_config_double(cfg, "cluster.step_timeout_secs");
    o->orphan_secs = keel_config_double(cfg, "cluster.orphan_secs");
    o->ready_retry_ms = (int)keel_config_int(cfg, "cluster.ready_retry_ms");
    o->max_wait_secs = keel_config_double(cfg, "cluster.max_wait_secs");
    o->bind_address = keel_config_str(cfg, "cluster.bind_address");
    o->local_transport =
        strcmp(keel_config_str(cfg, "cluster.local_transport"), "tcp") == 0
            ? KEEL_LOCAL_TRANSPORT_TCP : KEEL_LOCAL_TRANSPORT_AUTO;
    o->curve = keel_config_bool(cfg, "security.curve");
    o->key_dir = keel_config_str(cfg, "security.key_dir");
    o->send_buffer_kib =
        (int)keel_config_int(cfg, "cluster.send_buffer_kib");
    o->reduce_leaves = j->leaves;
    if (j->kfac != NULL) {
        /* K-FAC's update is not per variable: the chief applies it, its
         * state (factors, inverses, velocity) lives on the ps */
        o->optimizer = NULL;
        o->chief_applies = 1;
        o->chief_apply = job_chief_apply;
        o->chief_apply_ctx = j;
        if (j->kdist != NULL) {
            o->chief_apply = keel__kfac_dist_chief_apply;
            o->chief_apply_ctx = j->kdist;
            o->chief_commits_trainable_only = 1;
        }
        o->replicas_to_aggregate = j->kfac_rta;
    }
}

/* K-FAC in a cluster of replicas: the replicas a sync step aggregates
 * (roles: the gradient workers; chief with kfac.replicas_to_aggregate =
 * kfac: ceil(0.6 N) for N >= 3, tensorflow/kfac's convnet rule). */
static keel_status
kfac_replicas(const keel_config *cfg, int replicas, job *j)
{
    int role, index, counts[3];
    keel_status st;
    if (j->kfac == NULL)
        return KEEL_OK;
    if (keel__kfac_dist_roles(cfg)) {
        st = keel__kfac_dist_role(cfg, 0, replicas, &role, &index, counts);
        if (st == KEEL_OK)
            j->kfac_rta = counts[0];
        return st;
    }
    if (strcmp(keel_config_str(cfg, "kfac.replicas_to_aggregate"), "kfac")
        == 0 && replicas >= 3)
        j->kfac_rta = (int)ceil(0.6 * replicas);
    return KEEL_OK;
}

/* j's update rule in cluster (NULL: one process, or ranks of a collective:
 * sync SGD): [algorithm] when set, else the cluster's mode. A rule pushing
 * gradients gets the optimizer's slots here. */
static keel_status
job_rule(job *j, const keel_cluster_spec *cluster)
{
    j->rule_sync = j->opt_slots = 1;
    if (cluster != NULL && j->has_algo) {
        j->rule_sync = keel_algorithm_is_sync(j->algo.name);
        j->opt_slots = keel_algorithm_pushes_gradients(j->algo.name);
    } else if (cluster != NULL) {
        j->rule_sync = keel_cluster_spec_mode(cluster) == KEEL_CLUSTER_SYNC;
    }
    return j->opt_slots && j->opt != NULL
        ? keel_optimizer_prepare(j->opt, j->vs) : KEEL_OK;
}

/* The canonical leaves of a sync cluster's global batch: the model's
 * pieces, when every replica's slice is a whole number of them and one
 * process computes the whole batch as one tree (at most
 * KEEL__MODEL_TREE_PIECES pieces); 0 otherwise (logged: results then
 * depend on the replica count). */
static int64_t
leaves_for(const keel_config *cfg, const job *j,
           const keel_cluster_spec *spec)
{
    int R = keel_cluster_spec_num_replicas(spec);
    int64_t p = (int64_t)keel__model_piece(j->model), L;
    const char *why = NULL;
    if (keel_cluster_spec_mode(spec) != KEEL_CLUSTER_SYNC ||
        !keel_config_bool(cfg, "cluster.reduce_tree"))
        return 0;
    /* an update rule of its own, or per-worker rates: the ps needs each
     * replica's commit, not one tree of the batch */
    if (j->has_algo && (j->algo.name != KEEL_ALGORITHM_SYNC ||
                        j->algo.n_worker_learning_rates > 0))
        return 0;
    L = j->global_batch / p;
    if (keel_cluster_spec_replicas_to_aggregate(spec) != R)
        why = "backup workers (replicas_to_aggregate < replicas)";
    else if (j->kfac_rta > 0 && j->kfac_rta != R)
        why = "K-FAC's sync steps aggregate the gradients of some replicas "
              "only (kfac.replicas_to_aggregate, kfac.distributed)";
    else if (keel_config_int(cfg, "train.micro_batch") > 0)
        why = "train.micro_batch is set (its micro-batches are added in "
              "order instead)";
    else if (j->global_batch % p != 0 || L % R != 0)
        why = "train.batch_size is not a multiple of the replicas times "
              "the model's piece";
    else if (L > KEEL__MODEL_TREE_PIECES)
        why = "the global batch has more pieces than one tree of the model";
    if (why != NULL) {
        if (R > 1)
            keel__log(KEEL_LOG_INFO, "sync results depend on the number of "
                      "replicas (%d) in this run: %s; the model's piece is "
                      "%lld examples (docs/determinism.md)", R, why,
                      (long long)p);
        return 0;
    }
    return L;
}

/* This replica's nodes of the tree over j->leaves: more than one gets a
 * gradient store each, pushed in order instead of the session's. */
static keel_status
tree_nodes_build(job *j, int replica, int replicas)
{
    keel__tree_node nodes[64];
    int64_t per = j->leaves / replicas, first = replica * per;
    size_t piece = keel__model_piece(j->model);
    int k = keel__tree_cover(j->leaves, first, first + per, nodes, 64);
    keel_status st;
    if (k < 1)
        return keel__fail(KEEL_EINTERNAL, "tree cover of replica %d", replica);
    keel__log(KEEL_LOG_INFO, "sync results independent of the replica "
              "count: the global batch is %lld leaves of %zu examples; "
              "this replica pushes %d node sum(s)", (long long)j->leaves,
              piece, k);
    if (k == 1)
        return KEEL_OK;
    for (int c = 0; c < k; c++) {
        j->node_off[c] = (size_t)(nodes[c].lo - first) * piece;
        j->node_len[c] = (size_t)(nodes[c].hi - nodes[c].lo) * piece;
        if ((st = keel_grads_new(j->vs, &j->micro_g[c])) != KEEL_OK)
            return st;
        j->n_micro = c + 1;
    }
    j->n_nodes = k;
    return keel_cluster_backend_set_micro(j->worker, j->micro_g, k);
}

/* The ps task: build the model only to know the variables, then serve. */
static keel_status
run_ps(const keel_config *cfg, const keel_cluster_spec *spec,
       const keel_job_config *opts)
{
    job j;
    keel_cluster_config o;
    keel_status st = KEEL_OK;
    /* Before anything slow: a SIGTERM during start-up then ends the task
     * cleanly instead of killing it. */
    if (opts->handle_signals)
        st = keel_session_install_signal_handlers();
    if (st == KEEL_OK)
        st = job_build(&j, cfg, 0, 1, 0, 0);
    else
        memset(&j, 0, sizeof j);
    if (st == KEEL_OK)
        st = kfac_replicas(cfg, keel_cluster_spec_num_replicas(spec), &j);
    if (st == KEEL_OK) {
        j.leaves = leaves_for(cfg, &j, spec);
        cluster_options_from(cfg, &j, &o);
        st = keel_ps_run(spec, j.vs, &o);
    }
    if (opts->handle_signals)
        keel_session_uninstall_signal_handlers();
    job_free(&j);
    return st;
}

/* A cluster replica, after every session creation: its data slice goes
 * to the global step's batch (a worker that joins or rejoins, a chief that
 * joined live ps). Exact for sync without backups, where every step takes
 * one global batch. The state blob is train/'s little-endian layout
 * (epoch at byte 8, offset at 16), checked against the accessors first. */
static keel_status
position_after_create(void *ctx, keel_session *s)
{
    job *j = ctx;
    int64_t g = keel_session_global_step(s);
    int64_t spe = keel_data_iter_steps_per_epoch(j->it);
    int64_t epoch, offset;
    unsigned char b[KEEL_DATA_ITER_STATE_BYTES];
    size_t len = 0;
    keel_status st;
    if (spe <= 0)
        return KEEL_OK;
    epoch = g / spe;
    offset = (g % spe) * j->global_batch;
    if (epoch == keel_data_iter_epoch(j->it) &&
        offset == keel_data_iter_offset(j->it))
        return KEEL_OK;
    st = keel_data_iter_state(j->it, b, sizeof b, &len);
    if (st != KEEL_OK)
        return st;
    for (int k = 0; k < 8; k++) {
        if (b[8 + k] != (unsigned char)((uint64_t)keel_data_iter_epoch(j->it)
                                        >> (8 * k)) ||
            b[16 + k] != (unsigned char)((uint64_t)
                                         keel_data_iter_offset(j->it)
                                         >> (8 * k))) {
            keel__log(KEEL_LOG_WARN, "data: unknown iterator state layout; "
                      "this replica's data position is not moved to step "
                      "%lld", (long long)g);
            return KEEL_OK;
        }
        b[8 + k] = (unsigned char)((uint64_t)epoch >> (8 * k));
        b[16 + k] = (unsigned char)((uint64_t)offset >> (8 * k));
    }
    st = keel_data_iter_set_state(j->it, b, len);
    if (st == KEEL_OK)
        keel__log(KEEL_LOG_INFO, "data: this replica's slice continues at "
                  "epoch %lld, example %lld (global step %lld)",
                  (long long)epoch + 1, (long long)offset, (long long)g);
    return st;
}

/* One gradient store per micro-batch (or leaf) of this replica: k of them
 * (at most 64). */
static keel_status
alloc_micro(job *j, int k)
{
    keel_status st = KEEL_OK;
    for (; st == KEEL_OK && j->n_micro < k; j->n_micro++)
        st = keel_grads_new(j->vs, &j->micro_g[j->n_micro]);
    if (st != KEEL_OK)
        j->n_micro--;
    return st;
}

/* A replica of several (parameter-server or all-reduce): its session runs
 * over backend (borrowed: lives until the session is freed), moves its
 * data slice to the global step after every creation (a hook after
 * hooks[0..n)), and only the chief writes checkpoints. A backend that
 * applies the updates (the ps's, K-FAC's roles) takes the place of
 * job_apply: the session is given no updater of its own. */
static void
replica_session(job *j, keel_training_config *tc, const keel_backend *backend,
                keel_hook *hooks, size_t n_hooks, int is_chief)
{
    keel_hook *position = &hooks[n_hooks];     /* owns nothing */
    KEEL__STRUCT_INIT(position);
    position->name = "data_position";
    position->ctx = j;
    position->after_create_session = position_after_create;
    tc->session.manager.backend = backend;
    if (backend->updater.apply != NULL)
        memset(&tc->session.updater, 0, sizeof tc->session.updater);
    tc->session.n_hooks = n_hooks + 1;
    tc->session.is_chief = is_chief;
    if (!is_chief) {
        tc->session.manager.checkpoint_dir = NULL;
        tc->session.manager.warm_start_from = NULL; /* the chief's to apply */
    }
}

/* train.strategy = multi_worker_mirrored: what the config and the
 * process must offer before MPI starts. */
static keel_status
mwm_check(const keel_config *cfg, int in_cluster)
{
    int64_t leaves = keel_config_int(cfg, "train.leaves");
    int64_t batch = keel_config_int(cfg, "train.batch_size");
    if (!keel_collective_is_available())
        return keel__fail(KEEL_EINVAL, "train.strategy = "
                          "multi_worker_mirrored (%s) needs MPI, and this "
                          "keel was built without it: apt-get install "
                          "libopenmpi-dev openmpi-bin, re-run configure and "
                          "rebuild (or use train.strategy = "
                          "parameter_server)",
                          keel_config_origin(cfg, "train.strategy"));
    if (in_cluster)
        return keel__fail(KEEL_EINVAL, "train.strategy = "
                          "multi_worker_mirrored takes its ranks from MPI "
                          "(mpirun -n N, srun, keel launch --strategy "
                          "multi_worker_mirrored), not from a cluster spec: "
                          "unset TF_CONFIG and the [cluster] task lists");
    if (strcmp(keel_config_str(cfg, "optimizer.name"), "kfac") == 0)
        return keel__fail(KEEL_EINVAL, "optimizer.name = kfac does not run "
                          "under train.strategy = multi_worker_mirrored yet "
                          "(one process only)");
    if (keel_config_is_set(cfg, "algorithm.name") &&
        strcmp(keel_config_str(cfg, "algorithm.name"), "sync") != 0)
        return keel__fail(KEEL_EINVAL, "algorithm.name = %s (%s) does not "
                          "apply to train.strategy = multi_worker_mirrored "
                          "(its ranks all-reduce every step, as sync): "
                          "remove algorithm.name or use parameter_server",
                          keel_config_str(cfg, "algorithm.name"),
                          keel_config_origin(cfg, "algorithm.name"));
    if (keel_config_int(cfg, "train.micro_batch") > 0)
        return keel__fail(KEEL_EINVAL, "train.micro_batch (%s) does not "
                          "apply to multi_worker_mirrored: its gradients are "
                          "always summed over train.leaves fixed leaves",
                          keel_config_origin(cfg, "train.micro_batch"));
    if (batch % leaves != 0)
        return keel__fail(KEEL_EINVAL, "train.leaves = %lld (%s) must "
                          "divide train.batch_size = %lld",
                          (long long)leaves,
                          keel_config_origin(cfg, "train.leaves"),
                          (long long)batch);
    return KEEL_OK;
}

static keel_status
mwm_check_ranks(const keel_config *cfg, int ranks)
{
    int64_t leaves = keel_config_int(cfg, "train.leaves");
    if (leaves < ranks || (leaves + ranks - 1) / ranks > 64)
        return keel__fail(KEEL_EINVAL, "multi_worker_mirrored: %d ranks "
                          "and train.leaves = %lld: every rank needs at "
                          "least one leaf and at most 64 (start at most %lld "
                          "ranks, or set train.leaves)",
                          ranks, (long long)leaves, (long long)leaves);
    return KEEL_OK;
}

/* The session of j's run (hooks, strategy and gradient zeroing are the
 * caller's): its callbacks, the scaffold sc (the saver of the
 * [checkpoint] keys), where and how often it saves checkpoints and
 * summaries, how often it logs. */
static void
session_config_from(const keel_config *cfg, job *j, keel_scaffold *sc,
                    keel_training_config *tc)
{
    static const char *const summary_names[] = { "loss", "accuracy",
                                                 "learning_rate" };
    int64_t every = keel_config_int(cfg, "checkpoint.save_steps");
    double secs = keel_config_double(cfg, "checkpoint.save_secs");
    keel_scaffold_init(sc);
    sc->ctx = j;
    sc->init = job_init;
    keel_saver_config_init(&sc->saver);
    sc->saver.basename = keel_config_str(cfg, "checkpoint.basename");
    sc->saver.max_to_keep =
        (int)keel_config_int(cfg, "checkpoint.max_to_keep");
    sc->saver.keep_every_n_hours =
        keel_config_double(cfg, "checkpoint.keep_checkpoint_every_n_hours");
    sc->saver.is_async = keel_config_bool(cfg, "checkpoint.async");

    keel_training_config_init(tc);
    tc->session.manager.vars = j->vs;
    tc->session.step = job_step;
    tc->session.step_ctx = j;
    tc->session.updater.ctx = j;
    tc->session.updater.apply = job_apply;
    tc->session.manager.scaffold = sc;
    tc->session.meta_fn = job_meta;
    tc->session.meta_ctx = j;
    tc->session.manager.restore_fn = job_restore;
    tc->session.manager.restore_ctx = j;
    tc->session.manager.checkpoint_dir = keel_config_str(cfg, "checkpoint.dir");
    if (keel_config_str(cfg, "checkpoint.warm_start_from")[0] != '\0')
        tc->session.manager.warm_start_from =
            keel_config_str(cfg, "checkpoint.warm_start_from");
    if (keel_config_str(cfg, "checkpoint.warm_start_vars")[0] != '\0')
        tc->session.manager.warm_start_vars =
            keel_config_str(cfg, "checkpoint.warm_start_vars");
    tc->save_checkpoint_steps = every > 0 ? every : 0;
    tc->save_checkpoint_secs = every > 0 ? 0 : secs;
    if (j->save_epochs > 0 &&
        !keel_config_is_set(cfg, "checkpoint.save_steps") &&
        !keel_config_is_set(cfg, "checkpoint.save_secs"))
        secs = tc->save_checkpoint_secs = 0;   /* by epochs only */
    if (every <= 0 && secs <= 0)        /* only at start and at the end */
        tc->save_checkpoint_steps = INT64_MAX;
    tc->save_summaries_steps =
        keel_config_int(cfg, "hooks.summary_every_steps");
    tc->save_summaries_secs = 0;
    tc->summary_names = summary_names;
    tc->n_summary_names = 3;
    tc->log_step_count_steps = keel_config_int(cfg, "hooks.log_every_steps");
    tc->save_on_error = keel_config_bool(cfg, "checkpoint.save_on_error");
    if (j->replicas > 0)                        /* mirrored */
        tc->session.replicas = j->replicas;
}

void
keel_job_config_init(keel_job_config *opts)
{
    KEEL__STRUCT_INIT(opts);
}

/* What the steps of one keel_job_train share. It lives on that call's
 * stack: the hooks, the session and the backend hold pointers into it. */
typedef struct train_run {
    const keel_config *cfg;
    const keel_job_config *opts;        /* borrowed; may be NULL */
    keel_job_result *result;             /* borrowed; may be NULL */
    const keel_cluster_spec *spec;       /* opts' cluster, or NULL */
    int in_cluster, is_chief, replica, replicas, is_mwm;
    int is_ps;                           /* a ps task: run_ps serves it */
    keel_strategy strategy;
    keel_cluster_backend *worker;
    keel_collective *coll;
    keel_backend backend;
    job j;
    keel_training_config tc;
    keel_scaffold sc;
    keel_hook hooks[5], chief_hooks[3], nan;
    size_t n_hooks, n_chief_hooks;
    int has_nan;
} train_run;

/* Resolve train.strategy against r->in_cluster into r->strategy and
 * r->is_mwm; refuse a strategy (or K-FAC's mode) this process cannot
 * run. Acquires nothing. */
static keel_status
train_strategy(train_run *r)
{
    const keel_config *cfg = r->cfg;
    keel_status st;

    st = keel_strategy_from_name(keel_config_str(cfg, "train.strategy"),
                                 &r->strategy);
    if (st != KEEL_OK)
        return keel__wrap(st, "train.strategy");
    r->strategy = keel_strategy_resolve(r->strategy, r->in_cluster);
    r->is_mwm = r->strategy == KEEL_STRATEGY_MULTI_WORKER_MIRRORED;
    if (r->is_mwm && (st = mwm_check(cfg, r->in_cluster)) != KEEL_OK)
        return st;
    if (r->strategy == KEEL_STRATEGY_PARAMETER_SERVER && !r->in_cluster)
        return keel__fail(KEEL_EINVAL, "train.strategy = parameter_server "
                          "(%s) needs a cluster (TF_CONFIG, Slurm, [cluster] "
                          "or keel launch --ps N --workers M), and this "
                          "process has none; use one_device, mirrored or "
                          "auto", keel_config_origin(cfg, "train.strategy"));
    if (r->strategy != KEEL_STRATEGY_PARAMETER_SERVER && !r->is_mwm &&
        r->in_cluster)
        return keel__fail(KEEL_EINVAL, "train.strategy = %s (%s) trains in "
                          "one process, but this process is %s %d of a "
                          "cluster; use parameter_server (or auto) there",
                          keel_strategy_name(r->strategy),
                          keel_config_origin(cfg, "train.strategy"),
                          keel_task_type_name(
                              keel_cluster_spec_task_type(r->spec)),
                          keel_cluster_spec_task_index(r->spec));
    /* algorithm.name other than sync is refused by keel_config_validate */
    if (r->in_cluster &&
        strcmp(keel_config_str(cfg, "optimizer.name"), "kfac") == 0 &&
        keel_cluster_spec_mode(r->spec) != KEEL_CLUSTER_SYNC &&
        !keel_config_is_set(cfg, "algorithm.name"))
        return keel__fail(KEEL_EINVAL, "optimizer.name = kfac in a cluster "
                          "needs sync mode (cluster.mode = sync): the chief "
                          "applies each step's K-FAC update (docs/kfac.md)");
    return KEEL_OK;
}

/* A cluster task's role: sets r->is_ps for a ps task (and looks no
 * further), else r->is_chief, r->replica and r->replicas of a chief or
 * worker; refuses other task types and a cluster without a ps. */
static keel_status
train_cluster_role(train_run *r)
{
    const keel_cluster_spec *spec = r->spec;
    keel_task_type t = keel_cluster_spec_task_type(spec);
    keel_status st;

    if ((st = keel_cluster_spec_validate(spec)) != KEEL_OK)
        return st;
    if (t == KEEL_TASK_PS) {
        r->is_ps = 1;
        return KEEL_OK;
    }
    if (t != KEEL_TASK_CHIEF && t != KEEL_TASK_WORKER)
        return keel__fail(KEEL_EINVAL, "train: task type %s does not "
                          "train (use chief, worker or ps)",
                          keel_task_type_name(t));
    if (keel_cluster_spec_num_tasks(spec, KEEL_TASK_PS) == 0)
        return keel__fail(KEEL_EINVAL, "train: the cluster has no ps "
                          "task (parameter-server training needs at "
                          "least one)");
    r->is_chief = keel_cluster_spec_is_chief(spec);
    r->replicas = keel_cluster_spec_num_replicas(spec);
    r->replica = keel_cluster_spec_replica_index(spec);
    return KEEL_OK;
}

/* multi_worker_mirrored: start the collective in r->coll (the caller
 * frees it, on failure too) and take this process's rank, the number of
 * ranks and the chief role from it. */
static keel_status
train_ranks(train_run *r)
{
    keel_updater up;
    keel_status st;

    /* the ranks before the data: a rank's slice is its rank's part */
    up.ctx = &r->j;
    up.apply = job_apply;
    st = keel_collective_new(&up, &r->coll);
    if (st != KEEL_OK)
        return st;
    r->replica = keel_collective_rank(r->coll);
    r->replicas = keel_collective_size(r->coll);
    r->is_chief = r->replica == 0;
    return mwm_check_ranks(r->cfg, r->replicas);
}

/* Build r->j (model, data, optimizer) for this replica and its update
 * rule; on failure the caller frees r->j. */
static keel_status
train_build_job(train_run *r)
{
    const keel_config *cfg = r->cfg;
    keel_status st;

    /* multi_worker_mirrored ranks that split the leaves unevenly read
     * the whole batch: the iterator's even slices would cut leaves */
    int even = !r->is_mwm ||
               keel_config_int(cfg, "train.leaves") % r->replicas == 0;
    st = job_build(&r->j, cfg, even ? r->replica : 0, even ? r->replicas : 1,
                   !r->in_cluster && !r->is_mwm &&
                   strcmp(keel_config_str(cfg, "algorithm.name"),
                          "hogwild") == 0, !r->in_cluster && !r->is_mwm);
    if (st == KEEL_OK)
        st = job_rule(&r->j, r->in_cluster ? r->spec : NULL);
    if (st == KEEL_OK && r->is_mwm)
        snprintf(r->j.topology, sizeof r->j.topology,
                 "multi_worker_mirrored ranks=%d batch=%lld leaves=%lld",
                 r->replicas, (long long)r->j.global_batch,
                 (long long)keel_config_int(cfg, "train.leaves"));
    return st;
}

/* Set up the signal handlers, the collective and the job. On failure
 * nothing is left held (train_free must not run); on success train_free
 * releases them. */
static keel_status
train_start(train_run *r)
{
    int signals = r->opts != NULL && r->opts->handle_signals;
    int built = 0;
    keel_status st = KEEL_OK;

    /* Before loading the data: a SIGTERM during start-up then ends the run
     * cleanly (a chief with its checkpoint) instead of killing it. */
    if (signals && (st = keel_session_install_signal_handlers()) != KEEL_OK)
        return st;
    if (r->is_mwm)
        st = train_ranks(r);
    if (st == KEEL_OK) {
        built = 1;
        st = train_build_job(r);
    }
    if (st != KEEL_OK) {
        keel_collective_free(r->coll);
        if (built)
            job_free(&r->j);
        if (signals)
            keel_session_uninstall_signal_handlers();
        return st;
    }
    if (r->opts != NULL)
        r->j.opts = *r->opts;
    return KEEL_OK;
}

/* The hooks every replica runs: feed, stop at train.max_steps, a
 * worker's NaN check, the profiler (r->hooks[0..r->n_hooks)); the NaN
 * hook in r->nan (r->has_nan). What it made train_free releases. */
static keel_status
train_step_hooks(train_run *r)
{
    const keel_config *cfg = r->cfg;
    keel_feed_fn_hook_config feed_cfg;
    keel_stop_at_step_hook_config stop_cfg;
    keel_nan_hook_config nan_cfg;
    keel_profiler_hook_config prof_cfg;
    int64_t max_steps, every;
    keel_status st;

    keel_feed_fn_hook_config_init(&feed_cfg);
    feed_cfg.fn = job_feed;
    feed_cfg.ctx = &r->j;
    st = keel_feed_fn_hook_new(&feed_cfg, &r->hooks[r->n_hooks]);
    if (st == KEEL_OK)
        r->n_hooks++;
    max_steps = keel_config_int(cfg, "train.max_steps");
    if (st == KEEL_OK && max_steps > 0) {
        keel_stop_at_step_hook_config_init(&stop_cfg);
        stop_cfg.last_step = max_steps;
        st = keel_stop_at_step_hook_new(&stop_cfg, &r->hooks[r->n_hooks]);
        if (st == KEEL_OK)
            r->n_hooks++;
    }
    if (st == KEEL_OK && keel_config_bool(cfg, "hooks.nan_check")) {
        keel_nan_hook_config_init(&nan_cfg);
        nan_cfg.fail_on_inf = keel_config_bool(cfg, "hooks.inf_check");
        st = keel_nan_hook_new(&nan_cfg, &r->nan);
        r->has_nan = st == KEEL_OK;
        /* A worker checks among its hooks; the chief before its saver
         * (chief-only hooks run first), so that the step whose loss is
         * NaN fails before a checkpoint of its update is written. */
        if (r->has_nan && !r->is_chief)
            r->hooks[r->n_hooks++] = r->nan;
    }
    every = keel_config_int(cfg, "hooks.profile_steps");
    if (st == KEEL_OK && every > 0) {
        keel_profiler_hook_config_init(&prof_cfg);
        prof_cfg.save_steps = every;
        prof_cfg.output_dir = keel_config_str(cfg, "checkpoint.dir");
        st = keel_profiler_hook_new(&prof_cfg, &r->hooks[r->n_hooks]);
        if (st == KEEL_OK)
            r->n_hooks++;
    }
    return st;
}

/* The chief-only hooks (the chief's NaN check first, before its saver;
 * progress; epoch_end) in r->chief_hooks, the job's epoch settings and,
 * with train.validate_every_epochs, the chief's validator and its event
 * file. Takes st, the status so far: builds the validator only on OK. */
static keel_status
train_chief_hooks(train_run *r, keel_status st)
{
    const keel_config *cfg = r->cfg;
    job *j = &r->j;
    keel_hook *ch = r->chief_hooks;

    if (r->has_nan && r->is_chief)
        *ch++ = r->nan;
    ch[0].struct_size = sizeof ch[0];
    ch[0].name = "progress";
    ch[0].ctx = j;
    ch[0].before_run = progress_before_run;
    ch[0].after_run = progress_after_run;
    ch[1].struct_size = sizeof ch[1];
    ch[1].name = "epoch_end";
    ch[1].ctx = j;
    ch[1].before_run = progress_before_run;
    ch[1].after_run = epoch_after_run;
    r->n_chief_hooks = (size_t)(ch - r->chief_hooks) + 2;
    j->save_epochs = keel_config_int(cfg, "checkpoint.save_epochs");
    j->validate_epochs = keel_config_int(cfg, "train.validate_every_epochs");
    j->examples_per_gstep = j->rule_sync ? j->global_batch
        : j->global_batch / r->replicas;
    /* local steps: each replica's own mean gradient */
    j->local_norm = !j->opt_slots;
    if (st == KEEL_OK && r->is_chief && j->validate_epochs > 0) {
        char vdir[KEEL_PATH_MAX];
        st = keel__validator_new(cfg, &j->validator);
        if (st == KEEL_OK)
            st = keel__path_join(vdir, sizeof vdir,
                                 keel_config_str(cfg, "checkpoint.dir"),
                                 "validation");
        if (st == KEEL_OK)
            st = keel__fs_mkdirs(vdir);
        if (st == KEEL_OK)
            st = keel_events_open(vdir, NULL, &j->val_events);
    }
    return st;
}

/* Build the hooks: the mirrored replicas' models, the step hooks and the
 * chief's. What it made train_free releases. */
static keel_status
train_hooks(train_run *r)
{
    keel_status st;

    if (r->strategy == KEEL_STRATEGY_MIRRORED &&
        (st = mirrored_build(&r->j, r->cfg)) != KEEL_OK)
        return st;
    st = train_step_hooks(r);
    return train_chief_hooks(r, st);
}

/* A K-FAC job in a cluster: its replicas and, with distributed roles,
 * this replica's role (gradient, covariance or inverse worker) in
 * r->j.kfac_role and r->j.kdist (which job_free frees). */
static keel_status
train_kfac_roles(train_run *r)
{
    const keel_config *cfg = r->cfg;
    job *j = &r->j;
    int counts[3] = { 0, 0, 0 }, index = 0;
    keel_status st;

    st = kfac_replicas(cfg, r->replicas, j);
    if (st == KEEL_OK && keel__kfac_dist_roles(cfg))
        st = keel__kfac_dist_role(cfg, r->replica, r->replicas,
                                  &j->kfac_role, &index, counts);
    if (st == KEEL_OK && keel__kfac_dist_roles(cfg)) {
        st = keel__kfac_dist_new(cfg, j->kfac, j->vs, j->kfac_role, index,
                                 counts[j->kfac_role], &j->kdist);
        j->kfac_observes = j->kfac_role == 1;
        keel__log(KEEL_LOG_INFO, "K-FAC roles: this replica (%d of %d) "
                  "is %s worker %d (%d gradient, %d covariance, %d "
                  "inverse)", r->replica, r->replicas,
                  keel__kfac_role_name(j->kfac_role), index, counts[0],
                  counts[1], counts[2]);
    }
    return st;
}

/* Refuse a train.micro_batch that does not split each replica's part of
 * the batch into at most 64 equal micro-batches (not for
 * multi_worker_mirrored, whose micro-batches are its leaves). */
static keel_status
train_micro_check(const train_run *r)
{
    const job *j = &r->j;
    int64_t slice;

    if (j->micro <= 0 || r->is_mwm)
        return KEEL_OK;
    slice = j->global_batch / r->replicas;
    if (j->global_batch % r->replicas != 0 || slice % j->micro != 0 ||
        slice / j->micro > 64)
        return keel__fail(KEEL_EINVAL, "train.micro_batch = %lld: each "
                          "of the %d replicas' %lld-example part of "
                          "train.batch_size = %lld must be a multiple of "
                          "it, at most 64 micro-batches",
                          (long long)j->micro, r->replicas,
                          (long long)slice, (long long)j->global_batch);
    return KEEL_OK;
}

/* multi_worker_mirrored: train.leaves are this rank's leaves, each
 * computed alone (the micro-batch path) and summed along the
 * collective's tree; the session runs over the collective's backend. */
static keel_status
train_mwm_backend(train_run *r)
{
    job *j = &r->j;
    int64_t leaves = keel_config_int(r->cfg, "train.leaves");
    int64_t first = leaves * r->replica / r->replicas;
    int64_t end = leaves * (r->replica + 1) / r->replicas;
    keel_status st;

    /* rank r's leaves: [L r / R, L (r + 1) / R), in rank order (the
     * collective places them in its tree by the ranks' counts) */
    j->micro = j->global_batch / leaves;
    if (leaves % r->replicas != 0) {
        j->slice_off = (size_t)(first * j->micro);
        j->slice_len = (size_t)((end - first) * j->micro);
    }
    if ((st = alloc_micro(j, (int)(end - first))) != KEEL_OK ||
        (st = keel_collective_set_leaves(r->coll, j->micro_g, j->n_micro)) !=
        KEEL_OK)
        return st;
    keel_collective_session_backend(r->coll, &r->backend);
    replica_session(j, &r->tc, &r->backend, r->hooks, r->n_hooks,
                    r->is_chief);
    return KEEL_OK;
}

/* A cluster's chief or worker: the cluster through the public seam
 * (keel/distributed.h) in r->worker (which train_free frees); the
 * backend pulls before the chief's checkpoints and stops the ps when the
 * chief's session ends cleanly. */
static keel_status
train_cluster_backend(train_run *r)
{
    job *j = &r->j;
    keel_cluster_config o;
    keel_status st;

    j->leaves = leaves_for(r->cfg, j, r->spec);
    /* each replica's gradient is the mean over its own slice (the ps
     * forms the example-weighted mean of the replicas'); the tree's node
     * sums (j->leaves) and micro-batches stay pieces of the global
     * batch's mean, which the ps add */
    if (j->leaves == 0 && j->micro == 0)
        j->local_norm = 1;
    cluster_options_from(r->cfg, j, &o);
    st = keel_cluster_backend_new(r->spec, j->vs, &o, &r->worker);
    if (st != KEEL_OK)
        return st;
    j->worker = r->worker;
    if (j->leaves > 0 &&
        (st = tree_nodes_build(j, r->replica, r->replicas)) != KEEL_OK)
        return st;
    if (j->micro > 0) {
        int k = (int)(j->global_batch / r->replicas / j->micro);
        if ((st = alloc_micro(j, k)) != KEEL_OK ||
            (st = keel_cluster_backend_set_micro(r->worker, j->micro_g,
                                                 j->n_micro)) != KEEL_OK)
            return st;
    }
    keel_cluster_backend_session_backend(r->worker, &r->backend);
    if (j->kdist != NULL) {
        keel__kfac_dist_set_backend(j->kdist, r->worker);
        if (j->kfac_role != 0) {     /* statistics or inverses, no push */
            r->backend.updater.ctx = j->kdist;
            r->backend.updater.apply = keel__kfac_dist_role_apply;
        }
    }
    replica_session(j, &r->tc, &r->backend, r->hooks, r->n_hooks,
                    r->is_chief);
    return KEEL_OK;
}

/* Fill r->tc and r->sc, the training session's settings: the config's,
 * the hooks, K-FAC's roles, the micro-batches and the backend of a
 * collective or a cluster. */
static keel_status
train_session_config(train_run *r)
{
    const keel_config *cfg = r->cfg;
    job *j = &r->j;
    keel_status st;

    session_config_from(cfg, j, &r->sc, &r->tc);
    /* one process: job_step zeroes the gradients unless job_apply left
     * them zero (a replica pushes them and the session zeroes them) */
    j->own_zeroing = !r->in_cluster && j->replicas <= 1;
    j->kfac_observes = r->is_chief;
    if (r->in_cluster && j->kfac != NULL &&
        (st = train_kfac_roles(r)) != KEEL_OK)
        return st;
    r->tc.session.skip_grad_zeroing = j->own_zeroing;
    r->tc.session.hooks = r->hooks;
    r->tc.session.n_hooks = r->n_hooks;
    r->tc.chief_only_hooks = r->chief_hooks;
    r->tc.n_chief_only_hooks = r->n_chief_hooks;
    r->tc.strategy = r->strategy;
    j->micro = keel_config_int(cfg, "train.micro_batch");
    if ((st = train_micro_check(r)) != KEEL_OK)
        return st;
    if (r->is_mwm && (st = train_mwm_backend(r)) != KEEL_OK)
        return st;
    if (r->in_cluster && (st = train_cluster_backend(r)) != KEEL_OK)
        return st;
    if (r->in_cluster || r->is_mwm) {
        r->tc.session.max_wait_secs =
            keel_config_double(cfg, "cluster.max_wait_secs");
        r->tc.session.stop_grace_period_secs =
            keel_config_double(cfg, "cluster.stop_grace_secs");
    }
    return KEEL_OK;
}

/* Open the training session in *out (caller owns). KEEL_OK with *out
 * NULL is a clean end with nothing to train: a worker whose chief
 * already finished, or a signal before training started. */
static keel_status
train_open(train_run *r, keel_session **out)
{
    keel_session *s = NULL;
    keel_status st;

    *out = NULL;
    if (r->tc.session.manager.checkpoint_dir != NULL &&
        (st = keel__fs_mkdirs(r->tc.session.manager.checkpoint_dir)) != KEEL_OK)
        return st;
    st = keel_training_session_new(&r->tc, &s);
    if (st == KEEL_EOUTOFRANGE && r->in_cluster && !r->is_chief) {
        /* the chief finished and shut the ps down before we joined */
        keel__log(KEEL_LOG_INFO, "training already finished: %s",
                  keel_last_error());
        return KEEL_OK;
    }
    if (st == KEEL_ECANCELLED && keel_session_signal_received()) {
        /* SIGTERM while waiting for the chief or the ps: nothing trained,
         * nothing to save; a clean stop, like one in mid-run */
        keel__log(KEEL_LOG_INFO, "signal %d received before training "
                  "started: stopping (%s)", keel_session_signal_received(),
                  keel_last_error());
        if (r->result != NULL)
            r->result->end_reason = (int)KEEL_END_SIGNAL;
        return KEEL_OK;
    }
    if (st == KEEL_OK)
        *out = s;
    return st;
}

/* Before the run loop: the planned last step, the resume log line, the
 * result's start and the progress clocks. Cannot fail. */
static void
train_begin(train_run *r, const keel_session *s)
{
    job *j = &r->j;

    j->last_step = planned_last_step(j);
    if (j->restored)
        keel__log(KEEL_LOG_INFO, "resumed from %s at step %lld",
                  j->restored_from, (long long)keel_session_global_step(s));
    if (r->result != NULL) {
        r->result->start_step = keel_session_global_step(s);
        r->result->restored = j->restored;
        snprintf(r->result->restored_from, sizeof r->result->restored_from,
                 "%s", j->restored_from);
    }
    j->t0_ns = j->last_report_ns = keel__now_mono_ns();
    j->last_report_gstep = keel_session_global_step(s);
    if (j->steps_per_epoch > 0)
        j->epoch_done = j->last_report_gstep / j->steps_per_epoch;
}

/* After the run loop: the result's figures, the end check (the chief or
 * the one process must have reached the planned end; reached is the
 * step this replica stopped at) and the log line. Takes st, the run's
 * status so far, and returns the final one. */
static keel_status
train_end(train_run *r, const keel_session *s, int64_t reached,
          keel_status st)
{
    const job *j = &r->j;
    keel_job_result *result = r->result;

    if (result != NULL) {
        result->final_step = keel_session_global_step(s);
        result->examples = j->examples;
        result->cluster_examples = (result->final_step - result->start_step)
                                   * j->examples_per_gstep;
        result->seconds = (keel__now_mono_ns() - j->t0_ns) / 1e9;
        result->end_reason = (int)keel_session_end_reason(s);
    }
    if (st == KEEL_OK && (!r->in_cluster || r->is_chief))
        st = check_reached_end(j, s, reached);
    if (st == KEEL_OK && keel_session_global_step(s) < reached)
        keel__log(KEEL_LOG_INFO, "training ended (%s) at step %lld (the "
                  "parameter servers' committed steps; this replica "
                  "stopped at step %lld)",
                  keel_end_reason_name(keel_session_end_reason(s)),
                  (long long)keel_session_global_step(s), (long long)reached);
    else if (st == KEEL_OK)
        keel__log(KEEL_LOG_INFO, "training ended (%s) at step %lld",
                  keel_end_reason_name(keel_session_end_reason(s)),
                  (long long)keel_session_global_step(s));
    return st;
}

/* The run loop over session s (takes ownership: closed and freed here),
 * between train_begin and train_end. */
static keel_status
train_loop(train_run *r, keel_session *s)
{
    keel_status st, cst;
    int64_t reached;

    train_begin(r, s);
    st = keel_session_train(s);
    reached = keel_session_global_step(s);
    if (r->j.own_step > reached) /* a sync local-step rule's chief pulled */
        reached = r->j.own_step; /* the center before its final save */
    cst = keel_session_close(s);
    if (st == KEEL_OK)
        st = cst;
    st = train_end(r, s, reached, st);
    keel_session_free(s);
    return st;
}

/* Release what a started run holds, in reverse order: the cluster
 * backend, the collective, the signal handlers, the hooks, the job.
 * Cannot fail. */
static void
train_free(train_run *r)
{
    keel_cluster_backend_free(r->worker);
    /* after the session: MPI_Finalize (or, after a failure, not: the
     * launcher then ends the other ranks) */
    keel_collective_free(r->coll);
    if (r->j.opts.handle_signals)
        keel_session_uninstall_signal_handlers();
    for (size_t i = 0; i < r->n_hooks; i++)
        keel_hook_release(&r->hooks[i]);
    if (r->has_nan && r->is_chief)
        keel_hook_release(&r->nan);
    job_free(&r->j);
}

keel_status
keel_job_train(const keel_config *cfg, const keel_job_config *opts,
               keel_job_result *result)
{
    train_run r;
    keel_session *s = NULL;
    keel_status st;

    if (result != NULL)
        memset(result, 0, sizeof *result);
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "train: config is NULL");
    if (opts != NULL &&
        (st = KEEL__STRUCT_CHECK(opts, keel_job_config)) != KEEL_OK)
        return keel__wrap(st, "train");
    st = keel_config_validate(cfg);
    if (st != KEEL_OK)
        return st;
    memset(&r, 0, sizeof r);
    r.cfg = cfg;
    r.opts = opts;
    r.result = result;
    r.spec = opts ? opts->cluster : NULL;
    r.in_cluster = r.spec != NULL && !keel_cluster_spec_is_local(r.spec);
    r.is_chief = 1;
    r.replicas = 1;
    r.strategy = KEEL_STRATEGY_AUTO;
    if ((st = train_strategy(&r)) != KEEL_OK ||
        (r.in_cluster && (st = train_cluster_role(&r)) != KEEL_OK))
        return st;
    if (r.is_ps)
        return run_ps(cfg, r.spec, opts);
    if ((st = train_start(&r)) != KEEL_OK)
        return st;
    st = train_hooks(&r);
    if (st == KEEL_OK)
        st = train_session_config(&r);
    if (st == KEEL_OK)
        st = train_open(&r, &s);
    if (st == KEEL_OK && s != NULL)
        st = train_loop(&r, s);
    train_free(&r);
    return st;
}
