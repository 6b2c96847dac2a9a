/* evaluator.c - evaluation with no cluster: `keel eval` of one checkpoint
 * (keel_job_eval) and the TF_CONFIG evaluator task (keel_job_run_evaluator),
 * which watches checkpoint.dir and evaluates every new checkpoint on the
 * test set, holding a read lease while it reads. The test set and model
 * stay loaded between checkpoints. Linux: inotify plus a fallback poll.
 * Never prints: results go to keel's log handler and the caller. */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/inotify.h>
#endif

#include <keel/events.h>
#include <keel/session.h>
#include <keel/train.h>
#include <keel/job.h>
#include "util.h"
#include "app_int.h"

/* The test set, a model and its variables, and one batch buffer: what an
 * evaluation needs, built once. */
typedef struct eval_ctx {
    keel_dataset *ds;
    keel_vars *vs;
    keel_model *model;
    float *x;
    int32_t *y;
    int64_t bs;
    /* keel_job_eval_progress's callback (NULL: none) */
    void (*progress_fn)(void *ctx, int64_t done, int64_t total);
    void *progress_ctx;
} eval_ctx;

static void
eval_ctx_free(eval_ctx *e)
{
    free(e->x);
    free(e->y);
    keel_model_free(e->model);
    keel_vars_free(e->vs);
    keel_dataset_free(e->ds);
    memset(e, 0, sizeof *e);
}

static keel_status
eval_ctx_open(eval_ctx *e, const keel_config *cfg)
{
    keel_model_config mc;
    keel_status st;
    memset(e, 0, sizeof *e);
    keel__job_set_blas_threads(cfg);
    e->bs = keel_config_int(cfg, "train.eval_batch_size");
    st = keel__job_open_dataset(cfg, 1, &e->ds);
    if (st == KEEL_OK)
        st = keel_vars_new(&e->vs);
    if (st == KEEL_OK)
        st = keel__job_model_config_from(cfg, e->ds, e->bs, &mc);
    if (st == KEEL_OK)
        st = keel_model_new(&mc, e->vs, &e->model);
    if (st == KEEL_OK) {
        e->x = malloc((size_t)e->bs * keel_dataset_example_size(e->ds) *
                      sizeof *e->x);
        e->y = malloc((size_t)e->bs * sizeof *e->y);
        if (e->x == NULL || e->y == NULL)
            st = keel__fail(KEEL_ENOMEM, "eval: batch of %lld",
                            (long long)e->bs);
    }
    if (st != KEEL_OK)
        eval_ctx_free(e);
    return st;
}

/* The whole test set through e's model and variables. */
static keel_status
eval_ctx_pass(eval_ctx *e, keel_eval_result *result)
{
    size_t count, stride;
    double loss_sum = 0;
    int64_t correct = 0;
    keel_status st = KEEL_OK;

    count = keel_dataset_count(e->ds);
    stride = keel_dataset_example_size(e->ds);
    for (size_t i = 0; i < count && st == KEEL_OK; i += (size_t)e->bs) {
        size_t n = count - i < (size_t)e->bs ? count - i : (size_t)e->bs;
        keel_batch b;
        keel_step_stats stats;
        for (size_t k = 0; k < n && st == KEEL_OK; k++)
            st = keel_dataset_get(e->ds, i + k, e->x + k * stride, e->y + k);
        if (st != KEEL_OK)
            break;
        b.x = e->x;
        b.y = e->y;
        b.n = n;
        st = keel_model_eval(e->model, e->vs, &b, &stats);
        loss_sum += stats.loss_sum;
        correct += stats.correct;
        if (st == KEEL_OK && e->progress_fn != NULL)
            e->progress_fn(e->progress_ctx, (int64_t)(i + n),
                           (int64_t)count);
    }
    if (st != KEEL_OK)
        return st;
    result->examples = (int64_t)count;
    result->loss = count > 0 ? loss_sum / (double)count : NAN;
    result->accuracy = count > 0 ? (double)correct / (double)count : NAN;
    return KEEL_OK;
}

/* Restore path into e's variables and run the whole test set. */
static keel_status
eval_ctx_run(eval_ctx *e, const char *path, keel_eval_result *result)
{
    keel_restore_opts ro;
    keel_restore_report rep;
    keel_status st;

    memset(result, 0, sizeof *result);
    keel_restore_opts_init(&ro);       // strict
    ro.skip_slots = 1;          // evaluation needs no optimizer state
    st = keel_ckpt_restore(path, e->vs, &ro, &rep);
    if (st == KEEL_OK)
        st = eval_ctx_pass(e, result);
    if (st != KEEL_OK)
        return st;
    result->step = rep.global_step;
    snprintf(result->checkpoint, sizeof result->checkpoint, "%s", path);
    return KEEL_OK;
}

/* ---- validation during training ----------------------------------------- */

struct keel__validator {
    eval_ctx e;
};

keel_status
keel__validator_new(const keel_config *cfg, keel__validator **out)
{
    keel__validator *v = calloc(1, sizeof *v);
    keel_status st;
    *out = NULL;
    if (v == NULL)
        return keel__fail(KEEL_ENOMEM, "validation");
    st = eval_ctx_open(&v->e, cfg);
    if (st != KEEL_OK) {
        free(v);
        return keel__wrap(st, "validation: the test set");
    }
    *out = v;
    return KEEL_OK;
}

keel_status
keel__validator_run(keel__validator *v, const keel_vars *src,
                    keel_eval_result *result)
{
    size_t n = keel_vars_count(v->e.vs);
    memset(result, 0, sizeof *result);
    for (size_t i = 0; i < n; i++) {
        keel_var *dst = keel_vars_at(v->e.vs, i);
        keel_var *from = keel_vars_find(src, keel_var_name(dst));
        keel_tensor *t = keel_var_tensor(dst);
        if (from == NULL ||
            keel_tensor_bytes(keel_var_tensor(from)) != keel_tensor_bytes(t))
            return keel__fail(KEEL_EINTERNAL, "validation: variable %s "
                              "missing or of another size in the training "
                              "store", keel_var_name(dst));
        memcpy(t->data, keel_var_tensor(from)->data, keel_tensor_bytes(t));
    }
    result->step = keel_vars_global_step(src);
    return eval_ctx_pass(&v->e, result);
}

void
keel__validator_free(keel__validator *v)
{
    if (v == NULL)
        return;
    eval_ctx_free(&v->e);
    free(v);
}

/* ---- keel eval: one checkpoint ------------------------------------------ */

keel_status
keel_config_from_checkpoint(const char *checkpoint_path, keel_config **out)
{
    keel_ckpt_info *info = NULL;
    keel_config *cfg = NULL;
    keel_status st;
    char name[KEEL_PATH_MAX + 16];
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "config from checkpoint: out is NULL");
    *out = NULL;
    st = keel_ckpt_read_info(checkpoint_path, &info);
    if (st != KEEL_OK)
        return st;
    if (info->config_text == NULL) {
        keel_ckpt_info_free(info);
        return keel__fail(KEEL_EINVAL, "%s holds no config; pass the job's "
                          "CONFIG file instead", checkpoint_path);
    }
    snprintf(name, sizeof name, "%s:/meta/config", checkpoint_path);
    st = keel_config_new(&cfg);
    if (st == KEEL_OK)
        st = keel_config_load_text(cfg, info->config_text, name);
    keel_ckpt_info_free(info);
    if (st != KEEL_OK) {
        keel_config_free(cfg);
        return st;
    }
    *out = cfg;
    return KEEL_OK;
}

keel_status
keel_job_eval(const keel_config *cfg, const char *checkpoint_path,
              keel_eval_result *result)
{
    return keel_job_eval_progress(cfg, checkpoint_path, NULL, NULL, result);
}

keel_status
keel_job_eval_progress(const keel_config *cfg, const char *checkpoint_path,
                       void (*progress_fn)(void *ctx, int64_t done,
                                           int64_t total),
                       void *ctx, keel_eval_result *result)
{
    eval_ctx e;
    char path[1024];
    int64_t step = 0;
    keel_status st;

    if (cfg == NULL || result == NULL)
        return keel__fail(KEEL_EINVAL, "eval: NULL argument");
    memset(result, 0, sizeof *result);
    if (checkpoint_path != NULL) {
        st = keel__fmt(path, sizeof path, "checkpoint path", "%s",
                       checkpoint_path);
    } else {
        st = keel_ckpt_latest(keel_config_str(cfg, "checkpoint.dir"),
                              keel_config_str(cfg, "checkpoint.basename"),
                              path, sizeof path, &step);
        if (st == KEEL_ENOTFOUND)
            st = keel__fail(KEEL_ENOTFOUND, "no valid checkpoint in %s "
                            "(train first: keel train CONFIG)",
                            keel_config_str(cfg, "checkpoint.dir"));
    }
    if (st != KEEL_OK)
        return st;
    st = eval_ctx_open(&e, cfg);
    if (st != KEEL_OK)
        return st;
    e.progress_fn = progress_fn;
    e.progress_ctx = ctx;
    st = eval_ctx_run(&e, path, result);
    eval_ctx_free(&e);
    return st;
}

/* ---- the evaluator task ------------------------------------------------ */

void
keel_evaluator_options_init(keel_evaluator_options *o)
{
    KEEL__STRUCT_INIT(o);
}

/* The newest checkpoint file in dir: the newest the state file lists,
 * else (no state file yet) the newest on disk. 0 when there is none. */
static int
newest_checkpoint(const char *dir, const char *base, char *name,
                  size_t size, int64_t *step, int64_t after,
                  int64_t *n_between)
{
    keel_ckpt_file *f = NULL;
    size_t n = 0;
    int found = 0, any_listed = 0;
    if (keel_ckpt_scan(dir, base, &f, &n) != KEEL_OK)
        return 0;
    for (size_t i = 0; i < n; i++)
        any_listed |= f[i].in_state_file;
    *n_between = 0;
    for (size_t i = n; i-- > 0;) {
        if (any_listed && !f[i].in_state_file)
            continue;
        if (!found) {
            snprintf(name, size, "%s", f[i].name);
            *step = f[i].step;
            found = 1;
        } else if (f[i].step > after) {
            (*n_between)++;        // newer than the last evaluated: skipped
        }
    }
    keel_ckpt_scan_free(f);
    return found;
}

static keel_status
final_step_of(const keel_config *cfg, int64_t *out)
{
    int64_t max_steps = keel_config_int(cfg, "train.max_steps");
    int64_t epochs = keel_config_int(cfg, "train.epochs");
    int64_t by_epochs = 0;
    if (epochs > 0) {
        int64_t per_epoch = 0;
        keel_status st = keel__job_steps_per_epoch(cfg, &per_epoch);
        if (st != KEEL_OK)
            return st;
        by_epochs = epochs * per_epoch;
    }
    *out = max_steps > 0 && (by_epochs == 0 || max_steps < by_epochs)
         ? max_steps : by_epochs;
    return KEEL_OK;
}

/* Wait up to timeout_ms for a change in the watched directory. */
static void
wait_for_change(int ifd, int timeout_ms)
{
    struct pollfd p;
    if (timeout_ms < 0)
        timeout_ms = 0;
    if (ifd < 0) {
        poll(NULL, 0, timeout_ms);
        return;
    }
    p.fd = ifd;
    p.events = POLLIN;
    if (poll(&p, 1, timeout_ms) > 0) {
        char buf[4096] __attribute__((aligned(8)));
        // drain: what changed does not matter, the scan decides
        while (read(ifd, buf, sizeof buf) > 0)
            ;
    }
}

static const char *
base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s != NULL ? s + 1 : path;
}

keel_status
keel_job_run_evaluator(const keel_config *cfg,
                       const keel_evaluator_options *opts,
                       keel_evaluator_result *result)
{
    keel_evaluator_options o;
    keel_evaluator_result r;
    eval_ctx e;
    keel_events *ev = NULL;
    const char *dir, *base;
    char evdir[KEEL_PATH_MAX];
    int64_t final_step, deadline_ns, poll_ms;
    int ifd = -1, installed = 0;
    keel_status st;

    memset(&r, 0, sizeof r);
    r.last_step = -1;
    if (result != NULL)
        *result = r;
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "evaluator: config is NULL");
    if (opts != NULL &&
        (st = KEEL__STRUCT_CHECK(opts, keel_evaluator_options)) != KEEL_OK)
        return keel__wrap(st, "evaluator");
    if (opts != NULL)
        o = *opts;
    else
        keel_evaluator_options_init(&o);
    if (o.timeout_secs <= 0)
        o.timeout_secs = keel_config_double(cfg, "cluster.eval_timeout_secs");
    if (o.poll_secs <= 0)
        o.poll_secs = 0.5;
    poll_ms = (int64_t)(o.poll_secs * 1000);
    dir = keel_config_str(cfg, "checkpoint.dir");
    base = keel_config_str(cfg, "checkpoint.basename");
    final_step = o.final_step;
    if (final_step <= 0) {
        st = final_step_of(cfg, &final_step);
        if (st != KEEL_OK)
            return keel__wrap(st, "evaluator: the final step");
    }
    /* the chief may not have created it yet; the saver creates it too */
    st = keel__fs_mkdirs(dir);
    if (st == KEEL_OK)
        st = keel__path_join(evdir, sizeof evdir, dir, "eval");
    if (st != KEEL_OK)
        return keel__wrap(st, "evaluator: checkpoint.dir %s", dir);
    st = eval_ctx_open(&e, cfg);
    if (st != KEEL_OK)
        return st;
    st = keel_events_open(evdir, NULL, &ev);
    if (st != KEEL_OK) {
        eval_ctx_free(&e);
        return keel__wrap(st, "evaluator: event files in %s", evdir);
    }
#ifdef __linux__
    /* The state file is replaced by rename (IN_MOVED_TO); the poll covers
     * file systems without inotify events (NFS) and a full queue. */
    ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (ifd >= 0 && inotify_add_watch(ifd, dir, IN_MOVED_TO |
                                      IN_CLOSE_WRITE) < 0) {
        keel__log(KEEL_LOG_DEBUG, "evaluator: inotify on %s: %s; polling "
                  "every %.1f s", dir, strerror(errno), o.poll_secs);
        close(ifd);
        ifd = -1;
    }
#endif
    if (o.handle_signals) {
        st = keel_session_install_signal_handlers();
        if (st != KEEL_OK)
            goto out;
        installed = 1;
    }
    /* no "step N" here: keel launch takes such lines as progress */
    keel__log(KEEL_LOG_INFO, "evaluator: watching %s until the checkpoint "
              "of the final training step (%lld); timeout %.0f s without a "
              "new one", dir, (long long)final_step, o.timeout_secs);
    deadline_ns = keel__now_mono_ns() + (int64_t)(o.timeout_secs * 1e9);
    for (;;) {
        char name[KEEL_NAME_MAX], path[KEEL_PATH_MAX];
        int64_t step = -1, between = 0, now;
        keel_ckpt_lease *lease = NULL;
        keel_eval_result er;
        struct stat sb;

        st = KEEL_OK;
        if (keel_session_signal_received() != 0) {
            r.stopped_by_signal = 1;
            keel__log(KEEL_LOG_INFO, "evaluator: stopped by signal %d "
                      "after %lld evaluations",
                      keel_session_signal_received(),
                      (long long)r.evaluated);
            break;
        }
        if (newest_checkpoint(dir, base, name, sizeof name, &step,
                              r.last_step, &between) &&
            step > r.last_step) {
            st = keel_ckpt_lease_take(dir, name, &lease);
            if (st != KEEL_OK)
                break;
            st = keel__path_join(path, sizeof path, dir, name);
            if (st == KEEL_OK && stat(path, &sb) != 0)
                st = keel__fail(KEEL_ENOTFOUND, "%s is gone", path);
            if (st == KEEL_OK)
                st = eval_ctx_run(&e, path, &er);
            keel_ckpt_lease_release(lease);
            if (st == KEEL_ENOTFOUND ||
                (st != KEEL_OK && stat(path, &sb) != 0)) {
                /* retention removed it before our lease: a newer one is
                 * there */
                keel__log(KEEL_LOG_DEBUG, "evaluator: %s went away before "
                          "it was read", name);
                continue;
            }
            if (st == KEEL_ECORRUPT || st == KEEL_EIO) {
                keel__log(KEEL_LOG_WARN, "evaluator: skipping %s: %s", path,
                          keel_last_error());
                r.last_step = step;
                continue;
            }
            if (st != KEEL_OK)
                break;
            r.evaluated++;
            r.skipped += between;
            r.last_step = step;
            keel__log(KEEL_LOG_INFO, "eval step %lld: loss %.4f accuracy "
                      "%.4f (%s)", (long long)er.step, er.loss, er.accuracy,
                      base_name(er.checkpoint));
            if (between > 0)
                keel__log(KEEL_LOG_DEBUG, "evaluator: skipped %lld older "
                          "checkpoint(s) that arrived meanwhile",
                          (long long)between);
            st = keel_events_scalar(ev, er.step, "eval/loss", er.loss);
            if (st == KEEL_OK)
                st = keel_events_scalar(ev, er.step, "eval/accuracy",
                                        er.accuracy);
            if (st == KEEL_OK)
                st = keel_events_flush(ev);
            if (st != KEEL_OK)
                break;
            if (o.result_fn != NULL)
                o.result_fn(o.ctx, &er);
            deadline_ns = keel__now_mono_ns() +
                          (int64_t)(o.timeout_secs * 1e9);
            if (final_step > 0 && step >= final_step) {
                keel__log(KEEL_LOG_INFO, "evaluator: done: evaluated the "
                          "final step %lld (%lld checkpoints, %lld "
                          "skipped)", (long long)step,
                          (long long)r.evaluated, (long long)r.skipped);
                break;
            }
            continue;                   // a newer one may be there already
        }
        now = keel__now_mono_ns();
        if (now >= deadline_ns) {
            if (r.last_step >= 0)
                st = keel__fail(KEEL_ETIMEOUT, "evaluator: no new checkpoint "
                                "in %s for %.0f s after step %lld "
                                "(cluster.eval_timeout_secs); is the chief "
                                "running?", dir, o.timeout_secs,
                                (long long)r.last_step);
            else
                st = keel__fail(KEEL_ETIMEOUT, "evaluator: no checkpoint "
                                "appeared in %s within %.0f s "
                                "(cluster.eval_timeout_secs); is the chief "
                                "running and writing there?", dir,
                                o.timeout_secs);
            break;
        }
        wait_for_change(ifd, (int)((deadline_ns - now) / 1000000 + 1 <
                                   poll_ms
                                   ? (deadline_ns - now) / 1000000 + 1
                                   : poll_ms));
    }
out:
    if (installed)
        keel_session_uninstall_signal_handlers();
    if (ifd >= 0)
        close(ifd);
    keel_events_close(ev);
    eval_ctx_free(&e);
    if (result != NULL)
        *result = r;
    return st;
}
