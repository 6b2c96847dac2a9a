/* manager.c - Scaffold defaults, the SessionManager (chief prepare: restore
 * or init, local init, ready check; worker wait: readiness as an event with
 * a deadline; recover) and the chief/worker session creators. */
#include <config.h>

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "defaults.h"
#include "util.h"
#include "session_int.h"

#define MISSING_MAX 1024

struct keel_session_manager {
    keel_vars *vars;
    keel_scaffold sc;
    char *checkpoint_dir;
    keel_restore_config restore_config;
    int has_restore_config;
    keel_backend backend;
    int recovery_wait_ms;
    double max_wait_secs;
    keel_status (*restore_fn)(void *ctx, const keel_ckpt_info *info);
    void *restore_ctx;
    char *warm_from;                /* NULL: no warm start */
    char *warm_vars;                /* NULL: every variable */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t change_gen;
    int is_cancelled;
    int is_initialized;             /* mu and cv exist */
};

/* ---- scaffold defaults -------------------------------------------------- */

/* Mark the local variables of vs (is_local 1) or the others initialized. */
static void
mark_initialized(keel_vars *vs, int is_local)
{
    size_t n = keel_vars_count(vs);
    for (size_t i = 0; i < n; i++) {
        keel_var *v = keel_vars_at(vs, i);
        if (!(keel_var_flags(v) & KEEL_VAR_LOCAL) == !is_local)
            keel_var_set_initialized(v, 1);
    }
}

static keel_status
default_init(void *ctx, keel_vars *vs)
{
    (void)ctx;
    mark_initialized(vs, 0);
    return KEEL_OK;
}

static keel_status
default_local_init(void *ctx, keel_vars *vs)
{
    (void)ctx;
    mark_initialized(vs, 1);
    return KEEL_OK;
}

static keel_status
default_ready(void *ctx, const keel_vars *vs, char *missing, size_t size,
              size_t *n_missing)
{
    (void)ctx;
    *n_missing = keel_vars_uninitialized(vs, missing, size);
    return KEEL_OK;
}

static keel_status
default_ready_for_local_init(void *ctx, const keel_vars *vs, char *missing,
                             size_t size, size_t *n_missing)
{
    size_t i, n = keel_vars_count(vs), len = 0;
    (void)ctx;
    *n_missing = 0;
    if (size > 0)
        missing[0] = '\0';
    for (i = 0; i < n; i++) {
        keel_var *v = keel_vars_at(vs, i);
        if ((keel_var_flags(v) & KEEL_VAR_LOCAL) || keel_var_is_initialized(v))
            continue;
        (*n_missing)++;
        if (len + 4 < size) {
            int w = snprintf(missing + len, size - len, "%s%s",
                             len > 0 ? "," : "", keel_var_name(v));
            if (w > 0 && (size_t)w < size - len)
                len += (size_t)w;
            else if (size >= 4) {
                memcpy(missing + size - 4, "...", 4);
                len = size;
            }
        }
    }
    return KEEL_OK;
}

void
keel_scaffold_init(keel_scaffold *sc)
{
    KEEL__STRUCT_INIT(sc);
    sc->init = default_init;
    sc->ready = default_ready;
    sc->ready_for_local_init = default_ready_for_local_init;
    sc->local_init = default_local_init;
    keel_saver_config_init(&sc->saver);
}

/* ---- manager ------------------------------------------------------------ */

void
keel_session_manager_config_init(keel_session_manager_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->recovery_wait_ms = KEEL__DEFAULT_RETRY_MS;
}

keel_status
keel_session_manager_new(const keel_session_manager_config *cfg,
                         keel_session_manager **out)
{
    keel_session_manager *sm;
    keel_status st;
    if (out != NULL)
        *out = NULL;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_session_manager_config,
                            "session manager");
    if (st != KEEL_OK)
        return st;
    if (cfg->restore_config != NULL
        && (st = KEEL__STRUCT_CHECK(cfg->restore_config, keel_restore_config))
           != KEEL_OK)
        return keel__wrap(st, "session manager: restore_config");
    if (cfg->scaffold != NULL
        && (st = KEEL__STRUCT_CHECK(cfg->scaffold, keel_scaffold)) != KEEL_OK)
        return keel__wrap(st, "session manager: scaffold");
    if (cfg->scaffold != NULL
        && (st = KEEL__STRUCT_CHECK(&cfg->scaffold->saver, keel_saver_config))
           != KEEL_OK)
        return keel__wrap(st, "session manager: scaffold->saver (fill the "
                          "scaffold with keel_scaffold_init())");
    if (cfg->vars == NULL)
        return keel__fail(KEEL_EINVAL, "session manager: config needs vars");
    if (cfg->recovery_wait_ms < 0)
        return keel__fail(KEEL_EINVAL, "session manager: recovery_wait_ms "
                          "%d < 0", cfg->recovery_wait_ms);
    if (cfg->backend != NULL &&
        (st = keel__backend_check(cfg->backend, "session manager"))
        != KEEL_OK)
        return st;
    sm = calloc(1, sizeof *sm);
    if (sm == NULL)
        return keel__fail(KEEL_ENOMEM, "session manager: %zu bytes",
                          sizeof *sm);
    sm->vars = cfg->vars;
    if (cfg->scaffold != NULL)
        sm->sc = *cfg->scaffold;
    else
        keel_scaffold_init(&sm->sc);
    if (sm->sc.local_init == NULL && sm->sc.ready_for_local_init != NULL) {
        free(sm);
        return keel__fail(KEEL_EINVAL, "session manager: scaffold has "
                          "ready_for_local_init but no local_init");
    }
    if (cfg->checkpoint_dir != NULL) {
        sm->checkpoint_dir = strdup(cfg->checkpoint_dir);
        if (sm->checkpoint_dir == NULL) {
            free(sm);
            return keel__fail(KEEL_ENOMEM, "session manager: copy dir");
        }
    }
    if (cfg->restore_config != NULL) {
        sm->restore_config = *cfg->restore_config;
        sm->has_restore_config = 1;
    }
    if (cfg->backend != NULL)
        keel__backend_copy(&sm->backend, cfg->backend);
    sm->recovery_wait_ms = cfg->recovery_wait_ms > 0 ? cfg->recovery_wait_ms
                                                     : KEEL__DEFAULT_RETRY_MS;
    sm->max_wait_secs = KEEL__DEFAULT_MAX_WAIT_SECS;
    sm->restore_fn = cfg->restore_fn;
    sm->restore_ctx = cfg->restore_ctx;
    if ((cfg->warm_start_from != NULL
         && (sm->warm_from = strdup(cfg->warm_start_from)) == NULL)
        || (cfg->warm_start_vars != NULL
            && (sm->warm_vars = strdup(cfg->warm_start_vars)) == NULL)) {
        keel_session_manager_free(sm);
        return keel__fail(KEEL_ENOMEM, "session manager: copy warm start");
    }
    if (sm->warm_from != NULL && sm->checkpoint_dir == NULL) {
        keel_session_manager_free(sm);
        return keel__fail(KEEL_EINVAL, "session manager: warm_start_from "
                          "needs a checkpoint_dir for the new run");
    }
    pthread_mutex_init(&sm->mu, NULL);
    keel__cond_init_mono(&sm->cv);
    sm->is_initialized = 1;
    *out = sm;
    return KEEL_OK;
}

void
keel_session_manager_free(keel_session_manager *sm)
{
    if (sm == NULL)
        return;
    if (sm->is_initialized) {
        pthread_cond_destroy(&sm->cv);
        pthread_mutex_destroy(&sm->mu);
    }
    free(sm->checkpoint_dir);
    free(sm->warm_from);
    free(sm->warm_vars);
    free(sm);
}

void
keel_session_manager_set_max_wait(keel_session_manager *sm,
                                  double max_wait_secs)
{
    sm->max_wait_secs = max_wait_secs;
}

void
keel_session_manager_notify(keel_session_manager *sm)
{
    pthread_mutex_lock(&sm->mu);
    sm->change_gen++;
    pthread_cond_broadcast(&sm->cv);
    pthread_mutex_unlock(&sm->mu);
}

void
keel_session_manager_cancel(keel_session_manager *sm)
{
    pthread_mutex_lock(&sm->mu);
    sm->is_cancelled = 1;
    pthread_cond_broadcast(&sm->cv);
    pthread_mutex_unlock(&sm->mu);
}

/* Restore the newest valid checkpoint: 1 in *restored if one was used. */
static keel_status
restore_latest(keel_session_manager *sm, int *restored)
{
    char path[KEEL_PATH_MAX];
    keel_restore_report rep;
    keel_ckpt_info *info = NULL;
    keel_status st;
    int64_t t0;
    *restored = 0;
    if (sm->checkpoint_dir == NULL)
        return KEEL_OK;
    t0 = keel__now_mono_ns();       /* finding, verifying and reading */
    memset(&rep, 0, sizeof rep);
    st = keel__ckpt->restore_latest(sm->checkpoint_dir, sm->sc.saver.basename,
                                    sm->vars,
                                    sm->has_restore_config ? &sm->restore_config
                                                         : NULL,
                                    &rep, path, sizeof path);
    if (st == KEEL_ENOTFOUND) {
        keel__log(KEEL_LOG_INFO, "no checkpoint in %s: initializing",
                  sm->checkpoint_dir);
        return KEEL_OK;
    }
    if (st == KEEL_EINVAL) {        /* a checkpoint that does not fit */
        char cause[KEEL_ERR_MAX];
        snprintf(cause, sizeof cause, "%s", keel_last_error());
        return keel__fail(st, "resume from %s: %s. The model does not fit "
                          "the run in this directory (nothing was written): "
                          "resume it with the model it was trained with, or "
                          "start a new run from its checkpoint with a warm "
                          "start (warm_start_from) into a new checkpoint "
                          "directory", sm->checkpoint_dir, cause);
    }
    if (st == KEEL_ECORRUPT) {      /* checkpoints there, none usable */
        char cause[KEEL_ERR_MAX];
        snprintf(cause, sizeof cause, "%s", keel_last_error());
        return keel__fail(st, "resume from %s: %s. No checkpoint was written: "
                          "to start a new run there, move these files and "
                          "its state file out of %s; to start from another "
                          "run's checkpoint, warm-start (warm_start_from) "
                          "into a new checkpoint directory",
                          sm->checkpoint_dir, cause, sm->checkpoint_dir);
    }
    if (st != KEEL_OK)
        return keel__wrap(st, "restore from %s", sm->checkpoint_dir);
    /* Restore covers every checkpointed variable and the global step. */
    keel_session_manager_notify(sm);
    if (sm->restore_fn != NULL) {
        st = keel__ckpt->read_info(path, &info);
        if (st != KEEL_OK)
            return keel__wrap(st, "read metadata of %s", path);
        st = sm->restore_fn(sm->restore_ctx, info);
        keel__ckpt->info_free(info);
        if (st != KEEL_OK)
            return keel__wrap(st, "restore_fn for %s", path);
    }
    keel__log(KEEL_LOG_INFO, "restored %s at global step %lld (%zu "
              "variables in %.3f s)", path,
              (long long)keel_vars_global_step(sm->vars), rep.n_restored,
              (double)(keel__now_mono_ns() - t0) / 1e9);
    *restored = 1;
    return KEEL_OK;
}

static keel_status
check(keel_session_manager *sm,
      keel_status (*fn)(void *, const keel_vars *, char *, size_t, size_t *),
      char *missing, size_t size, size_t *n)
{
    *n = 0;
    missing[0] = '\0';
    if (fn == NULL)
        return KEEL_OK;
    return fn(sm->sc.ctx, sm->vars, missing, size, n);
}

/* TF _try_run_local_init_op: 1 in *ok when local init ran (or there is
 * none); else why in missing. */
static keel_status
try_local_init(keel_session_manager *sm, int *ok, char *missing, size_t size)
{
    size_t n;
    keel_status st;
    *ok = 1;
    missing[0] = '\0';
    if (sm->sc.local_init == NULL)
        return KEEL_OK;
    st = check(sm, sm->sc.ready_for_local_init, missing, size, &n);
    if (st != KEEL_OK)
        return st;
    if (n > 0) {
        *ok = 0;
        return KEEL_OK;
    }
    keel__log(KEEL_LOG_DEBUG, "running local_init");
    st = sm->sc.local_init(sm->sc.ctx, sm->vars);
    if (st != KEEL_OK)
        return keel__wrap(st, "local_init");
    return KEEL_OK;
}

/* The warm start's checkpoint file into path: warm_from itself, or a
 * directory's newest valid checkpoint. A directory that is the run's own
 * checkpoint_dir is refused: a warm start writes a new run elsewhere. */
static keel_status
warm_start_file(const keel_session_manager *sm, char *path, size_t size)
{
    char a[PATH_MAX], b[PATH_MAX];
    struct stat sb;
    int64_t step;
    keel_status st;
    if (stat(sm->warm_from, &sb) != 0)
        return keel__fail(KEEL_EINVAL, "warm start: %s does not exist",
                          sm->warm_from);
    if (!S_ISDIR(sb.st_mode))
        return keel__fmt(path, size, "warm start path", "%s", sm->warm_from);
    if (realpath(sm->warm_from, a) != NULL
        && realpath(sm->checkpoint_dir, b) != NULL && strcmp(a, b) == 0)
        return keel__fail(KEEL_EINVAL, "warm start from %s: that is this "
                          "run's own checkpoint directory; a warm start "
                          "writes a new run into another directory",
                          sm->warm_from);
    st = keel__ckpt->latest(sm->warm_from, NULL, path, size, &step);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "warm start from %s", sm->warm_from);
    return KEEL_OK;
}

/* Warm start (after init): the matching variables from the other run's
 * checkpoint, by name; their slots and the global step stay fresh. */
static keel_status
warm_start(keel_session_manager *sm)
{
    char path[KEEL_PATH_MAX];
    keel_restore_config o;
    keel_restore_report rep;
    int64_t gs = keel_vars_global_step(sm->vars);
    keel_status st = warm_start_file(sm, path, sizeof path);
    if (st != KEEL_OK)
        return st;
    keel_restore_config_init(&o);
    o.mode = KEEL_RESTORE_PARTIAL;
    o.skip_slots = 1;
    o.only_vars = sm->warm_vars;
    if (sm->has_restore_config) {
        o.name_map = sm->restore_config.name_map;
        o.n_name_map = sm->restore_config.n_name_map;
    }
    memset(&rep, 0, sizeof rep);
    st = keel__ckpt->restore(path, sm->vars, &o, &rep);
    keel_vars_set_global_step(sm->vars, gs);
    if (st != KEEL_OK)
        return keel__wrap(st == KEEL_ENOTFOUND ? KEEL_EINVAL : st,
                          "warm start from %s", path);
    if (rep.n_restored == 0)
        return keel__fail(KEEL_EINVAL, "warm start from %s: no variable of "
                          "the model is in it%s%s%s", path,
                          sm->warm_vars != NULL ? " and matches '" : "",
                          sm->warm_vars != NULL ? sm->warm_vars : "",
                          sm->warm_vars != NULL ? "'" : "");
    keel__log(KEEL_LOG_INFO, "warm start from %s: %zu variable(s) restored, "
              "%zu keep their initial values%s%s; step %lld, fresh "
              "optimizer state", path, rep.n_restored, rep.n_missing,
              rep.n_missing > 0 ? ": " : "", rep.missing, (long long)gs);
    return KEEL_OK;
}

/* What a scaffold init or init_fn of the user's own most often forgets;
 * said before the list of what is missing, which may fill the message. */
static const char *
not_marked_hint(const keel_session_manager *sm, int is_restored)
{
    if (is_restored || (sm->sc.init == default_init && sm->sc.init_fn == NULL)
        || (sm->sc.init == NULL && sm->sc.init_fn == NULL))
        return "";
    return " (your scaffold init or init_fn marks what it sets with "
           "keel_var_set_initialized or keel_vars_set_all_initialized)";
}

keel_status
keel_session_manager_prepare(keel_session_manager *sm, int is_recovery,
                             int *restored)
{
    char missing[MISSING_MAX];
    int is_restored = 0, ok, is_intact = 0;
    size_t n;
    keel_status st;
    if (restored != NULL)
        *restored = 0;
    if (sm == NULL)
        return keel__fail(KEEL_EINVAL, "prepare: NULL manager");
    if (is_recovery && sm->backend.is_intact != NULL) {
        st = sm->backend.is_intact(sm->backend.ctx, sm->vars, &is_intact);
        if (st != KEEL_OK)
            return keel__wrap(st, "backend '%s' is_intact",
                              sm->backend.name ? sm->backend.name : "?");
    }
    if (is_intact) {
        keel__log(KEEL_LOG_INFO, "recovery: shared state intact at step "
                  "%lld, not restoring", (long long)keel_vars_global_step(
                      sm->vars));
        is_restored = 1;
    } else {
        st = restore_latest(sm, &is_restored);
        if (st != KEEL_OK)
            return st;
    }
    if (!is_restored) {
        if (sm->sc.init == NULL && sm->sc.init_fn == NULL
            && sm->sc.local_init == NULL)
            return keel__fail(KEEL_ESTATE, "Model is not initialized and no "
                              "init, init_fn or local_init was given");
        if (sm->sc.init != NULL) {
            st = sm->sc.init(sm->sc.ctx, sm->vars);
            if (st != KEEL_OK)
                return keel__wrap(st, "scaffold init");
        }
        if (sm->sc.init_fn != NULL) {
            st = sm->sc.init_fn(sm->sc.ctx, sm->vars);
            if (st != KEEL_OK)
                return keel__wrap(st, "scaffold init_fn");
        }
        if (sm->warm_from != NULL && (st = warm_start(sm)) != KEEL_OK)
            return st;
    } else if (sm->warm_from != NULL) {
        keel__log(KEEL_LOG_INFO, "%s holds this run's own checkpoint: "
                  "resuming it (warm start from %s not applied)",
                  sm->checkpoint_dir, sm->warm_from);
    }
    st = try_local_init(sm, &ok, missing, sizeof missing);
    if (st != KEEL_OK)
        return st;
    if (!ok)
        return keel__fail(KEEL_ESTATE, "Init operations did not make model "
                          "ready for local_init%s: %s",
                          not_marked_hint(sm, is_restored), missing);
    st = check(sm, sm->sc.ready, missing, sizeof missing, &n);
    if (st != KEEL_OK)
        return keel__wrap(st, "scaffold ready");
    if (n > 0)
        return keel__fail(KEEL_ESTATE, "Init operations did not make model "
                          "ready%s: %zu not initialized: %s",
                          not_marked_hint(sm, is_restored), n, missing);
    if (sm->backend.publish != NULL) {
        st = sm->backend.publish(sm->backend.ctx, sm->vars, is_restored);
        if (st != KEEL_OK)
            return keel__wrap(st, "backend '%s' publish",
                              sm->backend.name ? sm->backend.name : "?");
    }
    keel_session_manager_notify(sm);
    if (restored != NULL)
        *restored = is_restored;
    return KEEL_OK;
}

keel_status
keel_session_manager_recover(keel_session_manager *sm, int *is_ready)
{
    char missing[MISSING_MAX];
    int restored = 0, ok;
    size_t n;
    keel_status st;
    *is_ready = 0;
    st = restore_latest(sm, &restored);
    if (st != KEEL_OK)
        return st;
    st = try_local_init(sm, &ok, missing, sizeof missing);
    if (st != KEEL_OK)
        return st;
    if (!restored)
        return KEEL_OK;
    if (!ok) {
        keel__log(KEEL_LOG_INFO, "restored model not ready for local_init: "
                  "%s", missing);
        return KEEL_OK;
    }
    st = check(sm, sm->sc.ready, missing, sizeof missing, &n);
    if (st != KEEL_OK)
        return st;
    if (n > 0) {
        keel__log(KEEL_LOG_INFO, "restored model is not ready: %s", missing);
        return KEEL_OK;
    }
    *is_ready = 1;
    return KEEL_OK;
}

/* Why the last attempt found no ready model: not ready for local init
 * (why), or the variables not yet initialized (missing); "" for none. */
typedef struct not_ready {
    char why[MISSING_MAX];
    char missing[MISSING_MAX];
} not_ready;

/* A cancel or a signal ends the wait; *gen is the state's generation
 * before this attempt (a later change ends the pause after it). */
static keel_status
wait_check_cancel(keel_session_manager *sm, int attempts, uint64_t *gen)
{
    pthread_mutex_lock(&sm->mu);
    *gen = sm->change_gen;
    if (sm->is_cancelled) {
        pthread_mutex_unlock(&sm->mu);
        return keel__fail(KEEL_ECANCELLED, "wait for session: cancelled "
                          "after %d attempts", attempts);
    }
    pthread_mutex_unlock(&sm->mu);
    if (keel__signal_pending())
        return keel__fail(KEEL_ECANCELLED, "wait for session: signal %d "
                          "received after %d attempts",
                          (int)keel__signal_pending(), attempts);
    return KEEL_OK;
}

/* One attempt: fetch the shared state, run local init, check the ready
 * list; *is_ready, or nr says what is missing. */
static keel_status
wait_attempt(keel_session_manager *sm, not_ready *nr, int *is_ready)
{
    int is_fetched = 1, ok;
    size_t n = 0;
    keel_status st;
    *is_ready = 0;
    nr->why[0] = '\0';
    nr->missing[0] = '\0';
    if (sm->backend.fetch != NULL) {
        st = sm->backend.fetch(sm->backend.ctx, sm->vars, &is_fetched,
                               nr->why, sizeof nr->why);
        if (st != KEEL_OK)
            return keel__wrap(st, "backend '%s' fetch",
                              sm->backend.name ? sm->backend.name : "?");
    }
    if (!is_fetched)
        return KEEL_OK;
    st = try_local_init(sm, &ok, nr->why, sizeof nr->why);
    if (st != KEEL_OK || !ok)
        return st;
    st = check(sm, sm->sc.ready, nr->missing, sizeof nr->missing, &n);
    if (st != KEEL_OK)
        return st;
    *is_ready = n == 0;
    return KEEL_OK;
}

/* Pause until the shared state may have changed since generation gen
 * (the backend's own wait, or a local change or cancel), or until next. */
static keel_status
wait_for_change(keel_session_manager *sm, uint64_t gen, int64_t next)
{
    if (sm->backend.wait_for_change != NULL) {
        keel_status st = sm->backend.wait_for_change(sm->backend.ctx, next);
        if (st != KEEL_OK)
            return keel__wrap(st, "backend '%s' wait_for_change",
                              sm->backend.name ? sm->backend.name : "?");
        return KEEL_OK;
    }
    pthread_mutex_lock(&sm->mu);
    while (sm->change_gen == gen && !sm->is_cancelled)
        if (keel__cond_wait_until(&sm->cv, &sm->mu, next))
            break;
    pthread_mutex_unlock(&sm->mu);
    return KEEL_OK;
}

/* Attempt until the model is ready, pausing recovery_wait_ms (or until
 * the state changes) between attempts, within max_wait_secs (<= 0 or
 * infinite: no limit). */
keel_status
keel_session_manager_wait(keel_session_manager *sm, double max_wait_secs)
{
    not_ready nr;
    int64_t start = keel__now_mono_ns(), deadline = -1;
    int attempts = 0;
    if (sm == NULL)
        return keel__fail(KEEL_EINVAL, "wait for session: NULL manager");
    if (max_wait_secs > 0 && isfinite(max_wait_secs))
        deadline = start + (int64_t)(max_wait_secs * 1e9);
    for (;;) {
        int is_ready;
        uint64_t gen;
        int64_t next;
        keel_status st = wait_check_cancel(sm, attempts, &gen);
        if (st != KEEL_OK)
            return st;
        attempts++;
        st = wait_attempt(sm, &nr, &is_ready);
        if (st != KEEL_OK)
            return st;
        if (is_ready) {
            keel__log(KEEL_LOG_INFO, "model ready after %d attempt(s), "
                      "%.3f s", attempts,
                      (double)(keel__now_mono_ns() - start) / 1e9);
            return KEEL_OK;
        }
        next = keel__now_mono_ns() + (int64_t)sm->recovery_wait_ms * 1000000;
        if (deadline >= 0 && keel__now_mono_ns() >= deadline)
            return keel__fail(KEEL_ETIMEOUT, "Session was not ready after "
                              "waiting %.0f secs (ready_for_local_init: %s; "
                              "ready: %s)", max_wait_secs,
                              nr.why[0] ? nr.why : "None",
                              nr.missing[0] ? nr.missing : "None");
        if (deadline >= 0 && next > deadline)
            next = deadline;
        if (attempts == 1 || attempts % 100 == 0)
            keel__log(KEEL_LOG_INFO, "Waiting for model to be ready. "
                      "Ready_for_local_init: %s, ready: %s",
                      nr.why[0] ? nr.why : "None",
                      nr.missing[0] ? nr.missing : "None");
        st = wait_for_change(sm, gen, next);
        if (st != KEEL_OK)
            return st;
    }
}

/* ---- creators ----------------------------------------------------------- */

static keel_status
chief_create(void *ctx, int is_recovery)
{
    return keel_session_manager_prepare(ctx, is_recovery, NULL);
}

static keel_status
worker_create(void *ctx, int is_recovery)
{
    keel_session_manager *sm = ctx;
    (void)is_recovery;
    return keel_session_manager_wait(sm, sm->max_wait_secs);
}

keel_session_creator
keel_chief_creator(keel_session_manager *sm)
{
    keel_session_creator c = { sm, chief_create };
    return c;
}

keel_session_creator
keel_worker_creator(keel_session_manager *sm)
{
    keel_session_creator c = { sm, worker_create };
    return c;
}

void
keel_backend_init(keel_backend *be)
{
    KEEL__STRUCT_INIT(be);
}

keel_status
keel__backend_check(const keel_backend *be, const char *who)
{
    /* the first version ended before before_save */
    keel_status st = keel__struct_size_check(be->struct_size,
                                             offsetof(keel_backend,
                                                      before_save),
                                             sizeof *be, "keel_backend");
    if (st != KEEL_OK)
        return keel__wrap(st, "%s: backend '%s'", who,
                          be->name != NULL ? be->name : "?");
    return KEEL_OK;
}

void
keel__backend_copy(keel_backend *dst, const keel_backend *src)
{
    size_t n = src->struct_size < sizeof *dst ? src->struct_size
                                              : sizeof *dst;
    memset(dst, 0, sizeof *dst);
    memcpy(dst, src, n);
    dst->struct_size = sizeof *dst;
}
