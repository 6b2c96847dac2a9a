/* config_validate.c - keel_config_validate: the cross-key rules of a job
 * configuration (the single keys' types and limits are checked as they
 * are set, config.c). Reads the values through the public getters. */
#include <config.h>

#include <regex.h>
#include <stdint.h>
#include <string.h>

#include <keel/config.h>
#include <keel/distributed.h>
#include <keel/tensor.h>
#include <keel/train.h>
#include "util.h"

/* checkpoint.save_steps against checkpoint.save_secs, and the run's end
 * (train.max_steps or train.epochs). */
static keel_status
validate_saves_and_end(const keel_config *cfg)
{
    if (keel_config_is_set(cfg, "checkpoint.save_steps") &&
        keel_config_is_set(cfg, "checkpoint.save_secs") &&
        keel_config_int(cfg, "checkpoint.save_steps") > 0 &&
        keel_config_double(cfg, "checkpoint.save_secs") > 0)
        return keel__fail(KEEL_EINVAL, "checkpoint.save_steps (%s) and "
                          "checkpoint.save_secs (%s) are both set; keep one",
                          keel_config_origin(cfg, "checkpoint.save_steps"),
                          keel_config_origin(cfg, "checkpoint.save_secs"));
    if (keel_config_int(cfg, "train.max_steps") == 0 &&
        keel_config_int(cfg, "train.epochs") == 0)
        return keel__fail(KEEL_EINVAL, "the run has no end: set "
                          "train.max_steps or train.epochs (or both; the "
                          "first reached stops training)");
    return KEEL_OK;
}

/* algorithm.name = hogwild against K-FAC and micro-batches. */
static keel_status
validate_hogwild(const keel_config *cfg)
{
    const char *alg = keel_config_str(cfg, "algorithm.name");
    int is_hw = strcmp(alg, "hogwild") == 0;

    if (is_hw && strcmp(keel_config_str(cfg, "optimizer.name"),
                        "kfac") == 0)
        return keel__fail(KEEL_EINVAL, "algorithm.name = hogwild and "
                          "optimizer.name = kfac (%s): K-FAC's shared "
                          "factors need one update at a time; pick "
                          "another optimizer",
                          keel_config_origin(cfg, "optimizer.name"));
    if (is_hw && keel_config_int(cfg, "train.micro_batch") > 0)
        return keel__fail(KEEL_EINVAL, "algorithm.name = hogwild and "
                          "train.micro_batch (%s): Hogwild threads "
                          "each take whole mini-batches; remove "
                          "train.micro_batch",
                          keel_config_origin(cfg, "train.micro_batch"));
    return KEEL_OK;
}

/* One process's parallelism: model threads against OpenBLAS threads,
 * train.replicas only with mirrored, whose batch they split evenly. */
static keel_status
validate_parallelism(const keel_config *cfg)
{
    if (keel_config_int(cfg, "train.model_threads") > 1 &&
        keel_config_int(cfg, "train.threads") > 1)
        return keel__fail(KEEL_EINVAL, "train.model_threads (%lld) and "
                          "train.threads (%lld) are both above 1; model "
                          "threads use single-threaded OpenBLAS: set "
                          "train.threads = 1 or remove it",
                          (long long)keel_config_int(cfg,
                                                     "train.model_threads"),
                          (long long)keel_config_int(cfg, "train.threads"));
    if (keel_config_is_set(cfg, "train.replicas") &&
        strcmp(keel_config_str(cfg, "train.strategy"), "mirrored") != 0)
        return keel__fail(KEEL_EINVAL, "train.replicas (%s) applies only to "
                          "train.strategy = mirrored, not %s",
                          keel_config_origin(cfg, "train.replicas"),
                          keel_config_str(cfg, "train.strategy"));
    if (strcmp(keel_config_str(cfg, "train.strategy"), "mirrored") == 0 &&
        keel_config_int(cfg, "train.batch_size") %
        keel_config_int(cfg, "train.replicas") != 0)
        return keel__fail(KEEL_EINVAL, "train.batch_size = %lld does not "
                          "split evenly over train.replicas = %lld "
                          "(mirrored); make it a multiple",
                          (long long)keel_config_int(cfg, "train.batch_size"),
                          (long long)keel_config_int(cfg, "train.replicas"));
    return KEEL_OK;
}

/* model.hidden: only for an mlp, which needs at least one layer;
 * model.classes: 0 or at least 2. */
static keel_status
validate_model(const keel_config *cfg)
{
    const char *model = keel_config_str(cfg, "model.type");

    if (keel_config_is_set(cfg, "model.hidden") && strcmp(model, "mlp") != 0)
        return keel__fail(KEEL_EINVAL, "model.hidden (%s) applies only to "
                          "model.type = mlp, not '%s'",
                          keel_config_origin(cfg, "model.hidden"), model);
    if (strcmp(model, "mlp") == 0) {
        int64_t h[1];
        keel_model_config mc;
        keel_status st;
        if (keel_config_int_list(cfg, "model.hidden", h, 1) < 1)
            return keel__fail(KEEL_EINVAL, "model.hidden is empty; an mlp "
                              "needs at least one hidden layer (e.g. "
                              "256,256)");
        /* the parser keel train builds the model with, so that config
         * check refuses what train refuses (a trailing comma, too many
         * layers) */
        keel_model_config_init(&mc);
        st = keel_model_parse_hidden(keel_config_str(cfg, "model.hidden"),
                                     &mc);
        if (st != KEEL_OK)
            return keel__wrap(KEEL_EINVAL, "model.hidden (%s)",
                              keel_config_origin(cfg, "model.hidden"));
    }
    if (keel_config_int(cfg, "model.classes") == 1)
        return keel__fail(KEEL_EINVAL, "model.classes = 1 (%s): a "
                          "classifier needs at least 2 classes (0: from "
                          "the labels)", keel_config_origin(cfg,
                                                            "model.classes"));
    {
        int64_t micro = keel_config_int(cfg, "train.micro_batch");
        int64_t batch = keel_config_int(cfg, "train.batch_size");
        if (micro > 0 && (batch % micro != 0 || batch / micro > 64))
            return keel__fail(KEEL_EINVAL, "train.micro_batch = %lld (%s) "
                              "must divide train.batch_size = %lld (%s) "
                              "into at most 64 micro-batches",
                              (long long)micro,
                              keel_config_origin(cfg, "train.micro_batch"),
                              (long long)batch,
                              keel_config_origin(cfg, "train.batch_size"));
    }
    return KEEL_OK;
}

/* The optimizer.* and kfac.* keys that only some optimizer.name reads. */
static keel_status
validate_optimizer(const keel_config *cfg)
{
    const char *opt = keel_config_str(cfg, "optimizer.name");

    if (keel_config_is_set(cfg, "optimizer.momentum") &&
        strcmp(opt, "momentum") != 0 && strcmp(opt, "rmsprop") != 0)
        return keel__fail(KEEL_EINVAL, "optimizer.momentum (%s) has no "
                          "effect with optimizer.name = %s; use momentum or "
                          "rmsprop, or remove it",
                          keel_config_origin(cfg, "optimizer.momentum"), opt);
    if (keel_config_bool(cfg, "optimizer.nesterov") &&
        strcmp(opt, "momentum") != 0)
        return keel__fail(KEEL_EINVAL, "optimizer.nesterov needs "
                          "optimizer.name = momentum, not %s", opt);
    if ((keel_config_is_set(cfg, "optimizer.beta1") ||
         keel_config_is_set(cfg, "optimizer.beta2")) &&
        strcmp(opt, "adam") != 0)
        return keel__fail(KEEL_EINVAL, "optimizer.beta1/beta2 apply only to "
                          "optimizer.name = adam, not %s", opt);
    if (strcmp(opt, "kfac") != 0) {
        static const char *const kk[] = { "kfac.damping",
            "kfac.cov_ema_decay", "kfac.momentum", "kfac.momentum_type",
            "kfac.estimation_mode", "kfac.norm_constraint",
            "kfac.invert_every", "kfac.cov_update_every",
            "kfac.distributed", "kfac.replicas_to_aggregate",
            "kfac.gradient_fraction", "kfac.covariance_fraction" };
        for (size_t i = 0; i < sizeof kk / sizeof *kk; i++)
            if (keel_config_is_set(cfg, kk[i]))
                return keel__fail(KEEL_EINVAL, "%s (%s) applies only to "
                                  "optimizer.name = kfac, not %s", kk[i],
                                  keel_config_origin(cfg, kk[i]), opt);
    }
    return KEEL_OK;
}

/* optimizer.schedule = piecewise: its increasing boundaries and one
 * value more; the boundaries and values need piecewise. */
static keel_status
validate_schedule(const keel_config *cfg)
{
    const char *sched = keel_config_str(cfg, "optimizer.schedule");

    if (strcmp(sched, "piecewise") == 0) {
        int64_t b[256];
        double vals[257];
        int nb = keel_config_int_list(cfg, "optimizer.boundaries", b, 256);
        int nv = keel_config_double_list(cfg, "optimizer.values", vals, 257);
        if (nb < 1 || nb > 256)
            return keel__fail(KEEL_EINVAL, "optimizer.schedule = piecewise "
                              "needs optimizer.boundaries (1 to 256 steps)");
        if (nv != nb + 1)
            return keel__fail(KEEL_EINVAL, "optimizer.values has %d entries; "
                              "piecewise needs one more than "
                              "optimizer.boundaries (%d)", nv, nb + 1);
        for (int i = 1; i < nb; i++)
            if (b[i] <= b[i - 1])
                return keel__fail(KEEL_EINVAL, "optimizer.boundaries must "
                                  "increase: %lld follows %lld",
                                  (long long)b[i], (long long)b[i - 1]);
    } else if (keel_config_is_set(cfg, "optimizer.boundaries") ||
               keel_config_is_set(cfg, "optimizer.values")) {
        return keel__fail(KEEL_EINVAL, "optimizer.boundaries/values need "
                          "optimizer.schedule = piecewise, not %s", sched);
    }
    return KEEL_OK;
}

/* The warm start: warm_start_vars compiles as a POSIX extended regex and
 * goes with a warm_start_from, which is not checkpoint.dir itself. */
static keel_status
validate_warm_start(const keel_config *cfg)
{
    const char *from = keel_config_str(cfg, "checkpoint.warm_start_from");
    const char *vars = keel_config_str(cfg, "checkpoint.warm_start_vars");
    const char *dir = keel_config_str(cfg, "checkpoint.dir");
    size_t n = strlen(dir);
    if (vars[0] != '\0') {
        regex_t re;
        char why[128];
        int rc = regcomp(&re, vars, REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            regerror(rc, &re, why, sizeof why);
            return keel__fail(KEEL_EINVAL, "checkpoint.warm_start_vars "
                              "'%s' (%s) is not a POSIX extended regex: %s",
                              vars, keel_config_origin(
                                  cfg, "checkpoint.warm_start_vars"), why);
        }
        regfree(&re);
        if (from[0] == '\0')
            return keel__fail(KEEL_EINVAL, "checkpoint.warm_start_vars (%s) "
                              "needs checkpoint.warm_start_from: the "
                              "checkpoint to warm-start from",
                              keel_config_origin(
                                  cfg, "checkpoint.warm_start_vars"));
    }
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (from[0] != '\0' && strncmp(from, dir, n) == 0 &&
        strspn(from + n, "/") == strlen(from + n))
        return keel__fail(KEEL_EINVAL, "checkpoint.warm_start_from (%s) is "
                          "checkpoint.dir (%s), this run's own checkpoint "
                          "directory: a warm start writes a new run into "
                          "another directory",
                          keel_config_origin(cfg,
                                             "checkpoint.warm_start_from"),
                          keel_config_origin(cfg, "checkpoint.dir"));
    return KEEL_OK;
}

/* The files: an HDF5 training file, checkpoint.dir and a plain
 * checkpoint.basename. */
static keel_status
validate_files(const keel_config *cfg)
{
    if (strcmp(keel_config_str(cfg, "data.format"), "hdf5") == 0 &&
        keel_config_str(cfg, "data.train_file")[0] == '\0')
        return keel__fail(KEEL_EINVAL, "data.format = hdf5 needs "
                          "data.train_file (an HDF5 file with datasets x "
                          "and y)");
    if (keel_config_str(cfg, "checkpoint.dir")[0] == '\0')
        return keel__fail(KEEL_EINVAL, "checkpoint.dir is empty; set it or "
                          "$OUTPUT_DIR");
    if (!keel_name_is_valid(keel_config_str(cfg, "checkpoint.basename")) ||
        strchr(keel_config_str(cfg, "checkpoint.basename"), '/') != NULL)
        return keel__fail(KEEL_EINVAL, "checkpoint.basename '%s' must be a "
                          "plain file name of [A-Za-z0-9_.-]",
                          keel_config_str(cfg, "checkpoint.basename"));
    return validate_warm_start(cfg);
}

/* The cluster's timing (heartbeat before death) and replica counts. */
static keel_status
validate_cluster(const keel_config *cfg)
{
    if (keel_config_int(cfg, "cluster.heartbeat_ms") >=
        keel_config_int(cfg, "cluster.dead_after_ms"))
        return keel__fail(KEEL_EINVAL, "cluster.heartbeat_ms (%lld) must be "
                          "less than cluster.dead_after_ms (%lld): a peer "
                          "would be declared dead between two heartbeats",
                          (long long)keel_config_int(cfg,
                                                     "cluster.heartbeat_ms"),
                          (long long)keel_config_int(cfg,
                                                     "cluster.dead_after_ms"));
    if (keel_config_int(cfg, "cluster.total_num_replicas") > 0 &&
        keel_config_int(cfg, "cluster.replicas_to_aggregate") >
        keel_config_int(cfg, "cluster.total_num_replicas"))
        return keel__fail(KEEL_EINVAL, "cluster.replicas_to_aggregate "
                          "(%lld) exceeds cluster.total_num_replicas (%lld)",
                          (long long)keel_config_int(cfg,
                              "cluster.replicas_to_aggregate"),
                          (long long)keel_config_int(cfg,
                              "cluster.total_num_replicas"));
    if (keel_config_bool(cfg, "cluster.elastic")) {
        const char *other = NULL;
        if (strcmp(keel_config_str(cfg, "cluster.mode"), "async") == 0)
            other = "cluster.mode = async";
        else if (!keel_config_bool(cfg, "cluster.reduce_tree"))
            other = "cluster.reduce_tree = false";
        else if (keel_config_int(cfg, "train.micro_batch") > 0)
            other = "train.micro_batch";
        else if (keel_config_int(cfg, "cluster.replicas_to_aggregate") > 0)
            other = "cluster.replicas_to_aggregate (backup workers)";
        else if (keel_config_is_set(cfg, "algorithm.name") &&
                 strcmp(keel_config_str(cfg, "algorithm.name"), "sync") != 0)
            other = "algorithm.name other than sync";
        if (other != NULL)
            return keel__fail(KEEL_EINVAL, "cluster.elastic (%s) needs sync "
                              "mode over the reduction tree; %s is set: "
                              "unset one of them",
                              keel_config_origin(cfg, "cluster.elastic"),
                              other);
    }
    if (keel_config_int(cfg, "cluster.partition_bytes") > 0) {
        const char *other = NULL;
        const char *algo = keel_config_str(cfg, "algorithm.name");
        if (strcmp(keel_config_str(cfg, "optimizer.name"), "kfac") == 0)
            other = "optimizer.name = kfac (the chief applies the update)";
        else if (keel_config_is_set(cfg, "algorithm.name") &&
                 strcmp(algo, "sync") != 0 && strcmp(algo, "async") != 0 &&
                 strcmp(algo, "hogwild") != 0)
            other = "an algorithm.name other than sync, async or hogwild";
        if (other != NULL)
            return keel__fail(KEEL_EINVAL, "cluster.partition_bytes (%s) "
                              "and %s do not go together: unset one of them",
                              keel_config_origin(cfg,
                                                 "cluster.partition_bytes"),
                              other);
    }
    return KEEL_OK;
}

/* algorithm.name against the older cluster.mode, per-worker learning
 * rates only with sync, and K-FAC's plain sync rule. */
static keel_status
validate_algorithm(const keel_config *cfg)
{
    if (keel_config_is_set(cfg, "algorithm.name") &&
        keel_config_is_set(cfg, "cluster.mode")) {
        keel_algorithm a;
        int async_mode = strcmp(keel_config_str(cfg, "cluster.mode"),
                                "async") == 0;
        if (keel_algorithm_from_name(keel_config_str(cfg, "algorithm.name"),
                                     &a) == KEEL_OK &&
            keel_algorithm_is_sync(a) == async_mode)
            return keel__fail(KEEL_EINVAL, "algorithm.name = %s (%s) is "
                              "%s but cluster.mode = %s (%s); cluster.mode "
                              "is the older name of sync and async: drop "
                              "it", keel_algorithm_name(a),
                              keel_config_origin(cfg, "algorithm.name"),
                              async_mode ? "synchronous" : "asynchronous",
                              keel_config_str(cfg, "cluster.mode"),
                              keel_config_origin(cfg, "cluster.mode"));
    }
    if (keel_config_str(cfg, "algorithm.worker_learning_rates")[0] != '\0' &&
        (strcmp(keel_config_str(cfg, "algorithm.name"), "sync") != 0 ||
         strcmp(keel_config_str(cfg, "cluster.mode"), "async") == 0))
        return keel__fail(KEEL_EINVAL, "algorithm.worker_learning_rates "
                          "(%s) applies to synchronous SGD only "
                          "(algorithm.name = sync), not %s",
                          keel_config_origin(cfg,
                              "algorithm.worker_learning_rates"),
                          strcmp(keel_config_str(cfg, "algorithm.name"),
                                 "sync") != 0
                              ? keel_config_str(cfg, "algorithm.name")
                              : "cluster.mode = async");
    if (strcmp(keel_config_str(cfg, "optimizer.name"), "kfac") == 0) {
        /* the chief applies each step's mean gradient: no other rule */
        const char *k = keel_config_str(cfg, "algorithm.worker_learning_"
                                        "rates")[0] != '\0'
                            ? "algorithm.worker_learning_rates"
                        : keel_config_is_set(cfg, "algorithm.name") &&
                          strcmp(keel_config_str(cfg, "algorithm.name"),
                                 "sync") != 0
                            ? "algorithm.name"
                            : NULL;
        if (k != NULL)
            return keel__fail(KEEL_EINVAL, "%s (%s) does not apply to "
                              "optimizer.name = kfac: in a cluster K-FAC "
                              "takes the plain sync rule, the chief "
                              "applying each step's mean gradient "
                              "(docs/kfac.md); unset it", k,
                              keel_config_origin(cfg, k));
    }
    return KEEL_OK;
}

/* security.curve needs its key directory. */
static keel_status
validate_security(const keel_config *cfg)
{
    if (keel_config_bool(cfg, "security.curve") &&
        keel_config_str(cfg, "security.key_dir")[0] == '\0')
        return keel__fail(KEEL_EINVAL, "security.curve = true needs "
                          "security.key_dir (make keys with 'keel keygen "
                          "DIR')");
    return KEEL_OK;
}

/* Cross-key rules. Each names both keys and where they were set; the
 * first rule broken, in this order, is the one reported. */
keel_status
keel_config_validate(const keel_config *cfg)
{
    static keel_status (*const rules[])(const keel_config *) = {
        validate_saves_and_end, validate_hogwild, validate_parallelism,
        validate_model, validate_optimizer, validate_schedule,
        validate_files, validate_cluster, validate_algorithm,
        validate_security
    };
    keel_status st;

    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    for (size_t i = 0; i < sizeof rules / sizeof *rules; i++)
        if ((st = rules[i](cfg)) != KEEL_OK)
            return st;
    return KEEL_OK;
}
