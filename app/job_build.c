/* job_build.c - a training job's pieces from its config: the [algorithm]
 * settings, the data iterator, variables and model, the optimizer or
 * K-FAC with its learning-rate schedule, the architecture description
 * checkpoints carry, Hogwild's threads, mirrored replicas, the topology
 * line; and their release. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include <keel/config.h>
#include <keel/events.h>
#include <keel/train.h>
#include <keel/distributed.h>
#include "util.h"
#include "app_int.h"
#include "job_int.h"
#include "../train/train_int.h"

/* The [algorithm] keys into j->algo (when algorithm.name is set). */
static keel_status
algorithm_from(const keel_config *cfg, keel__job *j)
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

void
keel__job_free(keel__job *j)
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
arch_dump(keel__job *j, const keel_optimizer_config *oc,
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
hogwild_build(keel__job *j, const keel_config *cfg, const keel_model_config *mc,
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
job_data(keel__job *j, const keel_config *cfg, int worker_index,
         int num_workers, int hogwild)
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
job_model(keel__job *j, const keel_config *cfg, int hogwild,
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
job_kfac(keel__job *j, const keel_config *cfg, int one_process)
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
job_optimizer(keel__job *j, const keel_config *cfg, const keel_model_config *mc,
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
job_topology(keel__job *j, int num_workers, int hogwild)
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
keel_status
keel__job_build(keel__job *j, const keel_config *cfg, int worker_index,
                int num_workers, int hogwild, int one_process)
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

/* Mirrored: train.replicas models over one variable store, each with
 * train.model_threads threads. */
keel_status
keel__job_mirrored_build(keel__job *j, const keel_config *cfg)
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
