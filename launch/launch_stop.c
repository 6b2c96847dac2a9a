/* launch_stop.c - the end of a task and of the run: exit statuses,
 * restarts with backoff, giving up, and the ordered stop (chief, then
 * workers, then ps; SIGKILL after the grace period). */
#include <config.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_int.h"
#include "util.h"

void
keel__launch_close_task_fds(task *t)
{
    for (int s = 0; s < 2; s++)
        if (t->fd[s] >= 0) {
            close(t->fd[s]);
            t->fd[s] = -1;
        }
    if (t->pidfd >= 0) {
        close(t->pidfd);
        t->pidfd = -1;
    }
}

/* The evaluator failed for good: reported, but the training goes on and
 * the run's exit status stays the chief's. */
static void
evaluator_failed(keel_launch *l, size_t i, int status, const char *how)
{
    task *t = &l->tasks[i];
    t->info.state = KEEL_LAUNCH_FAILED;
    t->term_due_ns = 0;
    keel__launch_emit(l, KEEL_LAUNCH_EV_GIVE_UP, (int)i, t->info.pid, status,
                      "giving up on %s: %s%s after %d restart%s; see "
                      "%s/logs/%s.log (training goes on; the exit status "
                      "is the chief's)", t->info.name, how,
                      status == 2 ? " (a configuration error)" : "",
                      t->info.restarts, t->info.restarts == 1 ? "" : "s",
                      l->output_dir, t->info.name);
}

/* A ps that exited 0 was told to stop by the chief. When that chief then
 * failed (it is down, or it came back and has not stepped since), the
 * restarted chief needs the ps again: without it, it would wait for it
 * until cluster.max_wait_secs. Returns 1 when t must come back. */
static int
ps_needed_again(const keel_launch *l, const task *t)
{
    const task *c = &l->tasks[l->chief];
    if (t->info.type != KEEL_TASK_PS || l->chief_done || t->is_removed)
        return 0;
    return !c->is_alive || (c->died_ns > t->started_ns && !c->had_step);
}

/* Bring back ps i, which exited 0: not a failure, so not counted. */
static void
restart_stopped_ps(keel_launch *l, size_t i, int64_t now)
{
    task *t = &l->tasks[i];
    t->info.state = KEEL_LAUNCH_BACKOFF;
    t->restart_at_ns = now;
    keel__launch_emit(l, KEEL_LAUNCH_EV_RESTART, (int)i, t->info.pid, 0,
                      "restarting %s: it stopped when the chief told it to, "
                      "and the chief failed after that (the restarted "
                      "chief needs it; not counted)", t->info.name);
}

/* How a task ended (on_exit_status). */
typedef struct task_exit {
    int status;
    int64_t now;
    int was_chaos;              /* the chaos kill of this pid */
    char how[64];               /* the status in words */
} task_exit;

/* Task i is gone: its last lines relayed, its pipes closed, its end
 * reported and noted in its log. */
static void
record_exit(keel_launch *l, size_t i, const task_exit *e)
{
    task *t = &l->tasks[i];
    /* lines the task wrote before it died come before its exit event */
    for (int s = 0; s < 2; s++)
        if (t->fd[s] >= 0)
            keel__launch_read_stream(l, i, s);
    keel__launch_close_task_fds(t);
    t->is_alive = 0;
    t->chaos_pid = 0;
    t->info.last_status = e->status;
    t->died_ns = e->now;
    keel__launch_emit(l, KEEL_LAUNCH_EV_EXIT, (int)i, t->info.pid, e->status,
                      "%s (pid %d) ended: %s%s", t->info.name, t->info.pid,
                      e->how, e->was_chaos ? " (chaos)" : "");
    keel__launch_log_note(t, "%s (pid %d) ended: %s%s", t->info.name,
                          t->info.pid, e->how,
                          e->was_chaos ? " (chaos)" : "");
}

/* Task i exited 0: the chief's end stops the job; a ps the restarted
 * chief still needs comes back. */
static void
ended_ok(keel_launch *l, size_t i, int64_t now)
{
    l->tasks[i].info.state = KEEL_LAUNCH_DONE;
    if (i == l->chief) {
        l->chief_done = 1;
        keel__launch_begin_stop(l, "the chief finished");
    } else if (ps_needed_again(l, &l->tasks[i])) {
        restart_stopped_ps(l, i, now);
    }
}

/* Count task t's restart (unless chaos killed it) and return the wait
 * before it starts again. A task that made progress (its own step line, the chief's
 * step advancing while it was up, or 10 s up) died of something else
 * than its own start: it comes back at once, since every millisecond here
 * is the whole job's. Only a crash loop waits: the base delay, doubled for
 * each failure in a row without progress, at most BACKOFF_CAP_SECS. */
static double
count_restart(keel_launch *l, task *t, const task_exit *e)
{
    double delay = l->cfg.backoff_secs;
    int was_healthy = t->had_step ||
        e->now - t->started_ns >= HEALTHY_NS ||
        l->tasks[l->chief].info.global_step > t->chief_step_at_start;
    if (!e->was_chaos)
        t->info.restarts++;
    if (was_healthy) {
        t->backoff_level = 0;
        return 0;
    }
    if (!e->was_chaos) {
        for (int k = 0; k < t->backoff_level && delay < BACKOFF_CAP_SECS;
             k++)
            delay *= 2;
        if (delay > BACKOFF_CAP_SECS)
            delay = BACKOFF_CAP_SECS;
        t->backoff_level++;
    }
    return delay;
}

/* Task i starts again after its delay (a chief with the ps it had
 * stopped). */
static void
schedule_restart(keel_launch *l, size_t i, const task_exit *e)
{
    task *t = &l->tasks[i];
    double delay = count_restart(l, t, e);
    t->info.state = KEEL_LAUNCH_BACKOFF;
    t->restart_at_ns = e->now + (int64_t)(delay * 1e9);
    /* the ps this chief had already stopped come back with it */
    for (size_t k = 0; i == l->chief && k < l->n; k++)
        if (l->tasks[k].info.state == KEEL_LAUNCH_DONE &&
            ps_needed_again(l, &l->tasks[k]))
            restart_stopped_ps(l, k, e->now);
    if (e->was_chaos)
        keel__launch_emit(l, KEEL_LAUNCH_EV_RESTART, (int)i, t->info.pid,
                          e->status, "restarting %s in %.3g s (chaos kill; "
                          "not counted)", t->info.name, delay);
    else
        keel__launch_emit(l, KEEL_LAUNCH_EV_RESTART, (int)i, t->info.pid,
                          e->status, "restarting %s in %.3g s (restart %d "
                          "of %d after %s)", t->info.name, delay,
                          t->info.restarts, l->cfg.max_restarts, e->how);
}

/* Task i failed for good: the job stops, naming the first such task. */
static void
give_up(keel_launch *l, size_t i, const task_exit *e)
{
    task *t = &l->tasks[i];
    t->info.state = KEEL_LAUNCH_FAILED;
    if (l->failed_task < 0) {
        l->failed_task = (int)i;
        snprintf(l->why, sizeof l->why, "%s failed %d time%s (last: %s%s); "
                 "see %s/logs/%s.log", t->info.name, t->info.restarts + 1,
                 t->info.restarts == 0 ? "" : "s", e->how,
                 e->status == 2 ? ", a configuration error: not restarted"
                                : "",
                 l->output_dir, t->info.name);
    }
    keel__launch_emit(l, KEEL_LAUNCH_EV_GIVE_UP, (int)i, t->info.pid,
                      e->status, "giving up on %s: %s", t->info.name, l->why);
    keel__launch_begin_stop(l, "a task failed for good");
}

static void
on_exit_status(keel_launch *l, size_t i, int status, int64_t now)
{
    task *t = &l->tasks[i];
    task_exit e;
    e.status = status;
    e.now = now;
    e.was_chaos = t->chaos_pid != 0 && t->chaos_pid == t->info.pid &&
                  status == 128 + SIGKILL;
    keel__launch_describe_status(status, e.how, sizeof e.how);
    record_exit(l, i, &e);
    if (t->info.type == KEEL_TASK_EVALUATOR && status != 0 &&
        t->info.state != KEEL_LAUNCH_STOPPING &&
        (l->is_stopping || status == 2 ||
         (!e.was_chaos && t->info.restarts >= l->cfg.max_restarts))) {
        evaluator_failed(l, i, status, e.how);
        return;
    }
    t->term_due_ns = 0;
    if (l->is_stopping || t->is_removed)
        t->info.state = status == 0 ? KEEL_LAUNCH_DONE : KEEL_LAUNCH_STOPPED;
    else if (status == 0)
        ended_ok(l, i, now);
    /* exit 2 is keel's usage/configuration error: a restart cannot fix it */
    else if (status != 2 &&
             (e.was_chaos || t->info.restarts < l->cfg.max_restarts))
        schedule_restart(l, i, &e);
    else
        give_up(l, i, &e);
}

void
keel__launch_reap(keel_launch *l, int64_t now)
{
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        int status;
        pid_t r;
        if (!t->is_alive)
            continue;
        do {
            r = waitpid(t->info.pid, &status, WNOHANG);
        } while (r < 0 && errno == EINTR);
        if (r == t->info.pid) {
            int code = WIFEXITED(status) ? WEXITSTATUS(status)
                     : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
            on_exit_status(l, i, code, now);
        } else if (r < 0 && errno == ECHILD) {
            /* someone else reaped it (a caller's waitpid(-1)): treat it as
             * lost rather than waiting forever */
            on_exit_status(l, i, 128 + SIGKILL, now);
        }
    }
}

void
keel__launch_signal_task(task *t, int sig)
{
    if (!t->is_alive || t->info.pid <= 0)
        return;
    /* the whole process group (the task and anything it started) */
    if (kill(-t->info.pid, sig) != 0)
        kill(t->info.pid, sig);
}

/* A restarted chief gets its SIGTERM only once it is up (its first step
 * line, or the grace period): until it has its signal handlers, SIGTERM
 * would kill it without the final checkpoint the stop is waiting for. */
static int
must_hold_term(const keel_launch *l, const task *t, int64_t now)
{
    return t == &l->tasks[l->chief] && t->is_alive && t->wants_back_event &&
           now - t->started_ns < (int64_t)(l->cfg.grace_secs * 1e9);
}

static void
term_task(keel_launch *l, task *t, int64_t now)
{
    if (must_hold_term(l, t, now)) {
        t->is_term_held = 1;
        return;
    }
    t->is_term_held = 0;
    if (!t->is_alive) {
        if (t->info.state == KEEL_LAUNCH_BACKOFF ||
            t->info.state == KEEL_LAUNCH_PENDING)
            t->info.state = KEEL_LAUNCH_STOPPED;
        return;
    }
    if (t->info.state == KEEL_LAUNCH_STOPPING)
        return;
    keel__launch_signal_task(t, SIGTERM);
    t->info.state = KEEL_LAUNCH_STOPPING;
    t->term_sent_ns = now;
}

/* Stop order: the chief first (its final step may still need the workers'
 * gradients, its final checkpoint the ps), then the workers, then the ps.
 * The evaluator depends on nobody and nobody on it: it has no rank
 * (-1) and is told in begin_stop. */
static int
stop_rank(keel_task_type type)
{
    if (type == KEEL_TASK_EVALUATOR)
        return -1;
    return type == KEEL_TASK_CHIEF ? 0 : type == KEEL_TASK_PS ? 2 : 1;
}

void
keel__launch_advance_stop(keel_launch *l, int64_t now)
{
    for (;;) {
        for (size_t i = 0; i < l->n; i++)
            if (l->tasks[i].is_alive &&
                stop_rank(l->tasks[i].info.type) >= 0 &&
                stop_rank(l->tasks[i].info.type) < l->stop_phase)
                return;                  /* the previous rank is not gone */
        if (l->stop_phase >= 3)
            return;
        for (size_t i = 0; i < l->n; i++)
            if (stop_rank(l->tasks[i].info.type) == l->stop_phase)
                term_task(l, &l->tasks[i], now);
        l->stop_phase++;
    }
}

void
keel__launch_begin_stop(keel_launch *l, const char *reason)
{
    int64_t now = keel__now_mono_ns();
    if (l->is_stopping)
        return;
    l->is_stopping = 1;
    l->stop_phase = 0;
    l->stop_began_ns = now;
    keel__launch_emit(l, KEEL_LAUNCH_EV_STOP, -1, 0, 0,
                      "%s: stopping every task (SIGTERM; SIGKILL after "
                      "%.0f s)", reason, l->cfg.grace_secs);
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        if (!t->is_alive && i == l->chief && l->failed_task < 0 &&
            t->info.state == KEEL_LAUNCH_BACKOFF) {
            /* the chief is down (a crash or a chaos kill) and was going to
             * be restarted: restart it now, so that the run still ends
             * with its final checkpoint and exit status 0 (not when a task
             * was given up: the run has failed, nothing to save it for) */
            t->wants_back_event = 1;
            if (keel__launch_start_task(l, i, "restarted") == KEEL_OK)
                continue;
        }
        if (!t->is_alive)
            term_task(l, t, now);              /* in backoff: stays down */
        else if (t->info.type == KEEL_TASK_EVALUATOR && l->chief_done)
            /* a complete run: let it evaluate the final checkpoint */
            t->term_due_ns = now + (int64_t)(l->cfg.grace_secs * 1e9);
        else if (t->info.type == KEEL_TASK_EVALUATOR)
            term_task(l, t, now);
    }
    keel__launch_advance_stop(l, now);
}

void
keel__launch_release_held(keel_launch *l, int64_t now)
{
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        if (t->is_term_held && t->is_alive && !must_hold_term(l, t, now))
            term_task(l, t, now);
    }
}

int64_t
keel__launch_held_deadline(const keel_launch *l, const task *t)
{
    if (!t->is_term_held || !t->is_alive)
        return INT64_MAX;
    return t->started_ns + (int64_t)(l->cfg.grace_secs * 1e9);
}

void
keel__launch_term_due(keel_launch *l, int64_t now)
{
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        if (t->term_due_ns > 0 && now >= t->term_due_ns) {
            t->term_due_ns = 0;
            if (t->is_alive)
                keel__launch_emit(l, KEEL_LAUNCH_EV_STOP, (int)i,
                                  t->info.pid, 0, "%s (pid %d) still "
                                  "running %.1f s after the chief finished: "
                                  "SIGTERM", t->info.name, t->info.pid,
                                  (double)(now - l->stop_began_ns) / 1e9);
            term_task(l, t, now);
        }
    }
}

void
keel_launch_stop(keel_launch *l, int force)
{
    if (l == NULL)
        return;
    if (!l->is_stopping) {
        keel__launch_begin_stop(l, force ? "forced stop" : "stop requested");
    } else if (!force) {
        /* an evaluator finishing after the chief: stop it now */
        for (size_t i = 0; i < l->n; i++)
            if (l->tasks[i].term_due_ns > 0)
                l->tasks[i].term_due_ns = keel__now_mono_ns();
        keel__launch_term_due(l, keel__now_mono_ns());
        return;
    }
    if (force) {
        for (size_t i = 0; i < l->n; i++) {
            task *t = &l->tasks[i];
            if (t->is_alive) {
                keel__launch_signal_task(t, SIGKILL);
                t->info.state = KEEL_LAUNCH_STOPPING;
            } else if (t->info.state == KEEL_LAUNCH_BACKOFF ||
                       t->info.state == KEEL_LAUNCH_PENDING) {
                t->info.state = KEEL_LAUNCH_STOPPED;
            }
            t->term_due_ns = 0;
        }
        l->stop_phase = 3;
    }
}
