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
    keel_restore_config ro;
    keel_restore_report rep;
    keel_status st;

    memset(result, 0, sizeof *result);
    keel_restore_config_init(&ro);       // strict
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
keel_evaluator_config_init(keel_evaluator_config *o)
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

/* What the evaluator task's steps share: its settings, the loaded test
 * set and model, the event file, the directory watch and the result so
 * far. */
typedef struct evaluator {
    const keel_config *cfg;
    keel_evaluator_config o;
    keel_evaluator_result r;
    eval_ctx e;
    keel_events *ev;
    const char *dir, *base;             /* checkpoint.dir and .basename */
    char evdir[KEEL_PATH_MAX];
    int64_t final_step, deadline_ns, poll_ms;
    int ifd;                            /* inotify, or -1: polling */
    int installed;                      /* the signal handlers */
} evaluator;

/* The options (opts, or the defaults when NULL) with the config's
 * timeout, the final training step and the directories; creates
 * checkpoint.dir. Acquires nothing. */
static keel_status
evaluator_settings(evaluator *w, const keel_config *cfg,
                   const keel_evaluator_config *opts)
{
    keel_evaluator_config *o = &w->o;
    keel_status st;

    w->cfg = cfg;
    if (opts != NULL)
        *o = *opts;
    else
        keel_evaluator_config_init(o);
    if (o->timeout_secs <= 0)
        o->timeout_secs = keel_config_double(cfg,
                                             "cluster.eval_timeout_secs");
    if (o->poll_secs <= 0)
        o->poll_secs = 0.5;
    w->poll_ms = (int64_t)(o->poll_secs * 1000);
    w->dir = keel_config_str(cfg, "checkpoint.dir");
    w->base = keel_config_str(cfg, "checkpoint.basename");
    w->final_step = o->final_step;
    if (w->final_step <= 0) {
        st = final_step_of(cfg, &w->final_step);
        if (st != KEEL_OK)
            return keel__wrap(st, "evaluator: the final step");
    }
    /* the chief may not have created it yet; the saver creates it too */
    st = keel__fs_mkdirs(w->dir);
    if (st == KEEL_OK)
        st = keel__path_join(w->evdir, sizeof w->evdir, w->dir, "eval");
    if (st != KEEL_OK)
        return keel__wrap(st, "evaluator: checkpoint.dir %s", w->dir);
    return KEEL_OK;
}

/* Load the test set and model, open the event file and watch the
 * directory (w->ifd, -1 without inotify). On failure nothing is held;
 * on success evaluator_close releases them. */
static keel_status
evaluator_open(evaluator *w)
{
    keel_status st = eval_ctx_open(&w->e, w->cfg);

    if (st != KEEL_OK)
        return st;
    st = keel_events_open(w->evdir, NULL, &w->ev);
    if (st != KEEL_OK) {
        eval_ctx_free(&w->e);
        return keel__wrap(st, "evaluator: event files in %s", w->evdir);
    }
#ifdef __linux__
    /* The state file is replaced by rename (IN_MOVED_TO); the poll covers
     * file systems without inotify events (NFS) and a full queue. */
    w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->ifd >= 0 && inotify_add_watch(w->ifd, w->dir, IN_MOVED_TO |
                                         IN_CLOSE_WRITE) < 0) {
        keel__log(KEEL_LOG_DEBUG, "evaluator: inotify on %s: %s; polling "
                  "every %.1f s", w->dir, strerror(errno), w->o.poll_secs);
        close(w->ifd);
        w->ifd = -1;
    }
#endif
    return KEEL_OK;
}

/* Count an evaluated checkpoint (at step; between: the newer ones it
 * skipped), log it, write it to the event file, hand it to the caller's
 * result_fn and restart the timeout. */
static keel_status
evaluator_record(evaluator *w, const keel_eval_result *er, int64_t step,
                 int64_t between)
{
    keel_status st;

    w->r.evaluated++;
    w->r.skipped += between;
    w->r.last_step = step;
    keel__log(KEEL_LOG_INFO, "eval step %lld: loss %.4f accuracy "
              "%.4f (%s)", (long long)er->step, er->loss, er->accuracy,
              base_name(er->checkpoint));
    if (between > 0)
        keel__log(KEEL_LOG_DEBUG, "evaluator: skipped %lld older "
                  "checkpoint(s) that arrived meanwhile",
                  (long long)between);
    st = keel_events_scalar(w->ev, er->step, "eval/loss", er->loss);
    if (st == KEEL_OK)
        st = keel_events_scalar(w->ev, er->step, "eval/accuracy",
                                er->accuracy);
    if (st == KEEL_OK)
        st = keel_events_flush(w->ev);
    if (st != KEEL_OK)
        return st;
    if (w->o.result_fn != NULL)
        w->o.result_fn(w->o.ctx, er);
    w->deadline_ns = keel__now_mono_ns() +
                     (int64_t)(w->o.timeout_secs * 1e9);
    return KEEL_OK;
}

/* One new checkpoint, name at step (between: newer ones skipped): read
 * it under a read lease, evaluate and record it. A checkpoint that went
 * away or is unreadable is passed over. Returns 1 to look for the next
 * one at once, 0 to end the watch with *st (KEEL_OK: the final step is
 * evaluated). */
static int
evaluator_one(evaluator *w, const char *name, int64_t step,
              int64_t between, keel_status *st)
{
    char path[KEEL_PATH_MAX];
    keel_ckpt_lease *lease = NULL;
    keel_eval_result er;
    struct stat sb;

    *st = keel_ckpt_lease_take(w->dir, name, &lease);
    if (*st != KEEL_OK)
        return 0;
    *st = keel__path_join(path, sizeof path, w->dir, name);
    if (*st == KEEL_OK && stat(path, &sb) != 0)
        *st = keel__fail(KEEL_ENOTFOUND, "%s is gone", path);
    if (*st == KEEL_OK)
        *st = eval_ctx_run(&w->e, path, &er);
    keel_ckpt_lease_release(lease);
    if (*st == KEEL_ENOTFOUND || (*st != KEEL_OK && stat(path, &sb) != 0)) {
        /* retention removed it before our lease: a newer one is there */
        keel__log(KEEL_LOG_DEBUG, "evaluator: %s went away before it was "
                  "read", name);
        return 1;
    }
    if (*st == KEEL_ECORRUPT || *st == KEEL_EIO) {
        keel__log(KEEL_LOG_WARN, "evaluator: skipping %s: %s", path,
                  keel_last_error());
        w->r.last_step = step;
        return 1;
    }
    if (*st != KEEL_OK || (*st = evaluator_record(w, &er, step, between))
        != KEEL_OK)
        return 0;
    if (w->final_step > 0 && step >= w->final_step) {
        keel__log(KEEL_LOG_INFO, "evaluator: done: evaluated the final "
                  "step %lld (%lld checkpoints, %lld skipped)",
                  (long long)step, (long long)w->r.evaluated,
                  (long long)w->r.skipped);
        return 0;
    }
    return 1;                   /* a newer one may be there already */
}

/* The timeout's failure: no new checkpoint (or none at all) within
 * o.timeout_secs. */
static keel_status
evaluator_timeout(const evaluator *w)
{
    if (w->r.last_step >= 0)
        return keel__fail(KEEL_ETIMEOUT, "evaluator: no new checkpoint "
                          "in %s for %.0f s after step %lld "
                          "(cluster.eval_timeout_secs); is the chief "
                          "running?", w->dir, w->o.timeout_secs,
                          (long long)w->r.last_step);
    return keel__fail(KEEL_ETIMEOUT, "evaluator: no checkpoint appeared in "
                      "%s within %.0f s (cluster.eval_timeout_secs); is the "
                      "chief running and writing there?", w->dir,
                      w->o.timeout_secs);
}

/* The watch loop: evaluate each new checkpoint until the final step's,
 * a signal (a clean stop), the timeout or a failure. */
static keel_status
evaluator_watch(evaluator *w)
{
    keel_status st;

    /* no "step N" here: keel launch takes such lines as progress */
    keel__log(KEEL_LOG_INFO, "evaluator: watching %s until the checkpoint "
              "of the final training step (%lld); timeout %.0f s without a "
              "new one", w->dir, (long long)w->final_step,
              w->o.timeout_secs);
    w->deadline_ns = keel__now_mono_ns() +
                     (int64_t)(w->o.timeout_secs * 1e9);
    for (;;) {
        char name[KEEL_NAME_MAX];
        int64_t step = -1, between = 0, now, left_ms;

        st = KEEL_OK;
        if (keel_session_signal_received() != 0) {
            w->r.stopped_by_signal = 1;
            keel__log(KEEL_LOG_INFO, "evaluator: stopped by signal %d "
                      "after %lld evaluations",
                      keel_session_signal_received(),
                      (long long)w->r.evaluated);
            return st;
        }
        if (newest_checkpoint(w->dir, w->base, name, sizeof name, &step,
                              w->r.last_step, &between) &&
            step > w->r.last_step) {
            if (evaluator_one(w, name, step, between, &st))
                continue;
            return st;
        }
        now = keel__now_mono_ns();
        if (now >= w->deadline_ns)
            return evaluator_timeout(w);
        left_ms = (w->deadline_ns - now) / 1000000 + 1;
        wait_for_change(w->ifd, (int)(left_ms < w->poll_ms ? left_ms
                                                           : w->poll_ms));
    }
}

/* Release what evaluator_open and the signal handlers hold. Cannot
 * fail. */
static void
evaluator_close(evaluator *w)
{
    if (w->installed)
        keel_session_uninstall_signal_handlers();
    if (w->ifd >= 0)
        close(w->ifd);
    keel_events_close(w->ev);
    eval_ctx_free(&w->e);
}

keel_status
keel_job_run_evaluator(const keel_config *cfg,
                       const keel_evaluator_config *opts,
                       keel_evaluator_result *result)
{
    evaluator w;
    keel_status st;

    memset(&w, 0, sizeof w);
    w.r.last_step = -1;
    w.ifd = -1;
    if (result != NULL)
        *result = w.r;
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "evaluator: config is NULL");
    if (opts != NULL &&
        (st = KEEL__STRUCT_CHECK(opts, keel_evaluator_config)) != KEEL_OK)
        return keel__wrap(st, "evaluator");
    if ((st = evaluator_settings(&w, cfg, opts)) != KEEL_OK ||
        (st = evaluator_open(&w)) != KEEL_OK)
        return st;
    if (w.o.handle_signals) {
        st = keel_session_install_signal_handlers();
        w.installed = st == KEEL_OK;
    }
    if (st == KEEL_OK)
        st = evaluator_watch(&w);
    evaluator_close(&w);
    if (result != NULL)
        *result = w.r;
    return st;
}
