/* hooks_bench.c - hook-chain overhead per step and keel's share of a
 * training loop. (1) per-step cost of the default MonitoredTrainingSession
 * hooks plus StopAtStep, NaN and Logging hooks when none triggers, measured
 * as keel_session_run minus keel_session_run_without_hooks on a step that
 * does nothing; (2) a 10,000-step run of a trivial step (a linear model of
 * n_params parameters, gradient + SGD) through keel_session_run with those
 * hooks against the bare loop calling the same step and update functions,
 * plus the time outside the callbacks in the same keel steps. Loops are
 * timed in thread CPU time (CLOCK_THREAD_CPUTIME_ID), interleaved in
 * chunks of 500 steps. Medians of reps repetitions.
 * With extra_hooks 0 only the MonitoredTrainingSession defaults run
 * (StepCounter, SummarySaver, CheckpointSaver: "the default hooks").
 * ckpt_secs > 0 gives the CheckpointSaver a time-based timer of that many
 * seconds (600: the MTS default) instead of a step timer that never fires.
 * usage: hooks_bench [reps [n_params [skip_grad_zeroing [extra_hooks
 *                    [ckpt_secs]]]]]   (7 1024 1 1 0) */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <keel/keel.h>
#include "bench_util.h"

#define MAX_PARAMS 16384
#define N_STEPS 10000

/* This thread's CPU time: the loops below are timed with it, so time the
 * thread spends preempted on the shared machine does not count. */
static double
cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static float xs[MAX_PARAMS];
static int N_PARAMS = 1024;

/* The user's math, shared by the bare loop and the keel step so both run
 * the same machine code: y = <w, x> with target 1, loss and gradient. */
static __attribute__((noinline)) double
forward_backward(const float *w, float *g)
{
    double y = 0, err;
    int i;
    for (i = 0; i < N_PARAMS; i++)
        y += w[i] * xs[i];
    err = y - 1.0;
    for (i = 0; i < N_PARAMS; i++)
        g[i] = (float)(2 * err) * xs[i];
    return err * err;
}

static __attribute__((noinline)) void
update(float *w, const float *g)
{
    int i;
    for (i = 0; i < N_PARAMS; i++)
        w[i] -= 1e-4f * g[i];
}

/* Time spent inside the user's callbacks during keel runs: keel's own time
 * is the rest of keel_session_run, measured in the very same steps. Only
 * in the attribution pass (is_instrumented): the four clock reads per
 * step are the bench's, not keel's, and would cost a trivial step more
 * than keel does. */
static double user_s;
static int is_instrumented;
/* keel's gradient buffer, seen by the first step: the bare loop uses the
 * same memory so both loops touch the same cache lines. */
static float *keel_g;

static keel_status
linear_step(void *ctx, keel_step *st)
{
    double t0 = is_instrumented ? bench_now() : 0;
    keel_vars *vs = keel_step_vars(st);
    float *w = keel_var_tensor(keel_vars_at(vs, 0))->data;
    float *g = keel_grads_at(keel_step_grads(st), 0)->data;
    double loss = forward_backward(w, g);
    keel_g = g;
    (void)ctx;
    if (is_instrumented)
        user_s += bench_now() - t0;
    return keel_step_set_value(st, "loss", loss);
}

static keel_status
empty_step(void *ctx, keel_step *st)
{
    (void)ctx;
    return keel_step_set_value(st, "loss", 1.0);
}

static keel_status
sgd(void *ctx, keel_vars *vs, keel_grads *gr, int64_t step)
{
    double t0 = is_instrumented ? bench_now() : 0;
    (void)ctx;
    (void)step;
    update(keel_var_tensor(keel_vars_at(vs, 0))->data,
           keel_grads_at(gr, 0)->data);
    if (is_instrumented)
        user_s += bench_now() - t0;
    return KEEL_OK;
}

/* The bare loop: the same arithmetic without keel (own gradient buffer). */
static double
bare_loop(keel_vars *vs, float *g, int n_steps)
{
    float *w = keel_var_tensor(keel_vars_at(vs, 0))->data;
    double t0 = cpu_s(), sink = 0;
    int64_t s, gs = keel_vars_global_step(vs);
    for (s = 0; s < n_steps; s++) {
        sink += forward_backward(w, g);
        update(w, g);
        gs++;
    }
    keel_vars_set_global_step(vs, gs);
    if (sink < 0)
        printf("%g\n", sink);
    return cpu_s() - t0;
}

/* The command line: see the usage at the top of this file. */
typedef struct hooks_opts {
    int reps;
    int skip_zero;
    int has_extra;
    double ckpt_secs;
} hooks_opts;

/* One sample per repetition of each timed quantity. */
typedef struct hooks_times {
    double *with_h, *without_h, *keel_t, *bare_t, *share, *own;
} hooks_times;

/* 0, or -1 when out of memory. */
static int
times_alloc(hooks_times *t, int reps)
{
    t->with_h = calloc((size_t)reps, sizeof *t->with_h);
    t->without_h = calloc((size_t)reps, sizeof *t->without_h);
    t->keel_t = calloc((size_t)reps, sizeof *t->keel_t);
    t->bare_t = calloc((size_t)reps, sizeof *t->bare_t);
    t->share = calloc((size_t)reps, sizeof *t->share);
    t->own = calloc((size_t)reps, sizeof *t->own);
    return t->with_h != NULL && t->without_h != NULL && t->keel_t != NULL
           && t->bare_t != NULL && t->share != NULL && t->own != NULL
           ? 0 : -1;
}

/* The inputs xs and the model's one variable, w of N_PARAMS floats. */
static keel_status
linear_model_new(keel_vars **vs)
{
    int64_t shape[1] = { N_PARAMS };
    keel_status st;
    for (int i = 0; i < N_PARAMS; i++)
        xs[i] = (float)((i % 7) - 3) / 100.0f;
    st = keel_vars_new(vs);
    if (st == KEEL_OK)
        st = keel_vars_create(*vs, "w", 1, shape, KEEL_VAR_TRAINABLE, NULL);
    return st;
}

/* StopAtStep, NaN and Logging hooks that never trigger in the run. */
static keel_status
extra_hooks_new(keel_hook extra[3])
{
    static const char *names[] = { "loss" };
    keel_logging_hook_config lc;
    keel_stop_at_step_hook_config sc;
    keel_nan_hook_config nc;
    keel_status st;
    keel_logging_hook_config_init(&lc);
    lc.names = names;
    lc.n_names = 1;
    lc.every_n_iter = 1000000000;
    keel_stop_at_step_hook_config_init(&sc);
    sc.last_step = (int64_t)1 << 60;
    keel_nan_hook_config_init(&nc);
    nc.fail_on_inf = 1;
    st = keel_stop_at_step_hook_new(&sc, &extra[0]);
    if (st == KEEL_OK)
        st = keel_nan_hook_new(&nc, &extra[1]);
    if (st == KEEL_OK)
        st = keel_logging_hook_new(&lc, &extra[2]);
    return st;
}

static void
training_config_fill(keel_training_config *cfg, const hooks_opts *o,
                     keel_vars *vs, keel_hook *extra, const char *dir)
{
    keel_training_config_init(cfg);
    cfg->session.manager.vars = vs;
    cfg->session.step = linear_step;
    cfg->session.updater.apply = sgd;
    cfg->session.hooks = extra;
    cfg->session.n_hooks = o->has_extra ? 3 : 0;
    cfg->session.skip_grad_zeroing = o->skip_zero; // the step writes them all
    cfg->session.manager.checkpoint_dir = dir;
    /* Default hooks present but not triggering inside the timed loops. */
    if (o->ckpt_secs > 0)
        cfg->save_checkpoint_secs = o->ckpt_secs;
    else
        cfg->save_checkpoint_steps = (int64_t)1 << 60;
    cfg->log_step_count_steps = (int64_t)1 << 60;
    cfg->save_summaries_steps = (int64_t)1 << 60;
}

/* (2) trivial step: 10,000 steps each of keel and bare, interleaved in
 * chunks of 500 so machine noise hits both alike; then the attribution
 * pass, the same steps with the callbacks timed. Returns 0, or 1 when a
 * step fails. */
static int
time_trivial_step(keel_session *s, keel_vars *vs, float *g, int r,
                  hooks_times *t)
{
    double t0, tk;
    int chunk, i;
    t->bare_t[r] = t->keel_t[r] = 0;
    user_s = 0;
    for (chunk = 0; chunk < N_STEPS / 500; chunk++) {
        t->bare_t[r] += bare_loop(vs, keel_g != NULL ? keel_g : g, 500);
        t0 = cpu_s();
        for (i = 0; i < 500; i++)
            if (keel_session_run(s, NULL) != KEEL_OK)
                return 1;
        t->keel_t[r] += cpu_s() - t0;
    }
    t->share[r] = (t->keel_t[r] - t->bare_t[r]) / t->keel_t[r];
    user_s = 0;
    is_instrumented = 1;
    t0 = bench_now();
    for (i = 0; i < N_STEPS; i++)
        if (keel_session_run(s, NULL) != KEEL_OK)
            return 1;
    tk = bench_now() - t0;
    is_instrumented = 0;
    t->own[r] = (tk - user_s) / tk;
    return 0;
}

/* (1) the hook chain alone: an empty step, without and with hooks. */
static void
time_hook_chain(keel_session *s, int r, hooks_times *t)
{
    int chunk, i;
    t->without_h[r] = t->with_h[r] = 0;
    for (chunk = 0; chunk < N_STEPS / 500; chunk++) {
        double t0 = cpu_s();
        for (i = 0; i < 500; i++)
            keel_session_run_without_hooks(s, NULL);
        t->without_h[r] += cpu_s() - t0;
        t0 = cpu_s();
        for (i = 0; i < 500; i++)
            keel_session_run(s, NULL);
        t->with_h[r] += cpu_s() - t0;
    }
}

static void
print_table(const hooks_opts *o, hooks_times *t)
{
    int reps = o->reps;
    double mh = bench_median(t->with_h, reps) / N_STEPS * 1e9;
    double mw = bench_median(t->without_h, reps) / N_STEPS * 1e9;
    double mk = bench_median(t->keel_t, reps) / N_STEPS * 1e9;
    double mb = bench_median(t->bare_t, reps) / N_STEPS * 1e9;
    printf("hooks: %s, none triggering; checkpoint timer %s; %d "
           "parameters; gradient zeroing %s; medians of %d x %d "
           "steps\n", o->has_extra ?
           "6 hooks (step_counter, summary_saver, checkpoint_saver, "
           "stop_at_step, nan_tensor, logging)" : "3 hooks (the "
           "MonitoredTrainingSession defaults: step_counter, "
           "summary_saver, checkpoint_saver)",
           o->ckpt_secs > 0 ? "time based" : "step based", N_PARAMS,
           o->skip_zero ? "off" : "on", reps, N_STEPS);
    printf("| quantity | median ns/step |\n|---|---|\n");
    printf("| empty step, run_without_hooks (baseline) | %.1f |\n", mw);
    printf("| empty step, run with %d hooks | %.1f |\n",
           o->has_extra ? 6 : 3, mh);
    printf("| hook-chain overhead per step | %.1f |\n", mh - mw);
    printf("| trivial step, bare loop (baseline) | %.1f |\n", mb);
    printf("| trivial step, keel_session_run + %d hooks | %.1f |\n",
           o->has_extra ? 6 : 3, mk);
    printf("| share in keel: (keel run - bare loop) / keel run | "
           "%.2f %% |\n", 100.0 * bench_median(t->share, reps));
    printf("| share in keel: time outside the callbacks (timed "
           "callbacks, own pass) | %.2f %% |\n",
           100.0 * bench_median(t->own, reps));
}

static int
remove_dir(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) != 0 ? 1 : 0;
}

int
main(int argc, char **argv)
{
    hooks_opts o;
    hooks_times t;
    char dir[] = "/tmp/keel-hooks-bench-XXXXXX";
    keel_training_config cfg;
    keel_vars *vs;
    keel_session *s;
    keel_hook extra[3];
    float *g;
    int r, i;
    o.reps = argc > 1 ? atoi(argv[1]) : 7;
    o.skip_zero = argc > 3 ? atoi(argv[3]) : 1;
    o.has_extra = argc > 4 ? atoi(argv[4]) : 1;
    o.ckpt_secs = argc > 5 ? atof(argv[5]) : 0;
    if (argc > 2)
        N_PARAMS = atoi(argv[2]);
    if (o.reps < 1 || N_PARAMS < 1 || N_PARAMS > MAX_PARAMS
        || mkdtemp(dir) == NULL)
        return 2;
    g = calloc(N_PARAMS, sizeof *g);
    if (times_alloc(&t, o.reps) != 0 || g == NULL) {
        fprintf(stderr, "hooks_bench: out of memory for %d reps\n", o.reps);
        return 1;
    }
    if (linear_model_new(&vs) != KEEL_OK || extra_hooks_new(extra) != KEEL_OK)
        return 1;
    training_config_fill(&cfg, &o, vs, extra, dir);
    if (keel_training_session_new(&cfg, &s) != KEEL_OK) {
        fprintf(stderr, "session: %s\n", keel_last_error());
        return 1;
    }
    for (r = 0; r < o.reps; r++)
        if (time_trivial_step(s, vs, g, r, &t) != 0)
            return 1;
    keel_session_free(s);
    cfg.session.step = empty_step;
    cfg.session.updater.apply = NULL;
    if (keel_training_session_new(&cfg, &s) != KEEL_OK)
        return 1;
    for (r = 0; r < o.reps; r++)
        time_hook_chain(s, r, &t);
    keel_session_free(s);
    for (i = 0; i < 3; i++)
        keel_hook_release(&extra[i]);
    keel_vars_free(vs);
    print_table(&o, &t);
    return remove_dir(dir);
}
