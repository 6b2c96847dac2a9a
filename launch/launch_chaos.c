/* launch_chaos.c - seeded chaos for `keel launch --chaos`: exponential
 * gaps and uniform victims from one splitmix64 stream, one victim down at a
 * time. Not cryptographic; reproducible for a seed. */
#include <config.h>

#include <math.h>
#include <signal.h>
#include <stdint.h>

#include "launch_int.h"
#include "util.h"

/* An exponential gap with the configured mean, in ns. */
int64_t
keel__launch_chaos_gap_ns(keel_launch *l)
{
    double u = (double)(keel__splitmix64(&l->rng) >> 11) * 0x1.0p-53;
    double secs = -l->cfg.chaos_period_secs * log(1.0 - u);
    if (secs > 1e6)
        secs = 1e6;
    l->chaos_gap_secs = secs;
    return (int64_t)(secs * 1e9);
}

void
keel__launch_chaos_tick(keel_launch *l, int64_t now)
{
    size_t eligible[2 + KEEL_LAUNCH_MAX_PS + KEEL_LAUNCH_MAX_WORKERS];
    size_t n_eligible = 0, pick;
    task *t;
    if (!l->cfg.chaos || l->is_stopping)
        return;
    if (l->chaos_victim >= 0) {
        task *v = &l->tasks[l->chaos_victim];
        if (v->info.state == KEEL_LAUNCH_BACKOFF || v->chaos_pid)
            return;                     /* not back yet */
        /* a victim that had printed a step line on stdout is back when
         * it prints one again (it restored and trains): a slow restart is
         * never killed again before it makes progress, so a job under
         * chaos always advances however slow the machine. Log lines on
         * stderr that mention a step ("pulled ... at step 0") do not
         * count: they are not what "back" waits for, and a program
         * without step lines would never be back. */
        if (v->is_alive && v->chaos_wants_step && v->wants_back_event)
            return;
        /* running again (or ended for good): the next gap starts now */
        l->chaos_victim = -1;
        l->next_chaos_ns = now + keel__launch_chaos_gap_ns(l);
        return;
    }
    if (now < l->next_chaos_ns)
        return;
    for (size_t i = 0; i < l->n; i++) {
        t = &l->tasks[i];
        if (t->is_alive && t->info.state == KEEL_LAUNCH_RUNNING &&
            (l->cfg.chaos_types & (1u << t->info.type)))
            eligible[n_eligible++] = i;
    }
    if (n_eligible == 0) {
        l->next_chaos_ns = now + keel__launch_chaos_gap_ns(l);
        return;
    }
    pick = eligible[keel__splitmix64(&l->rng) % n_eligible];
    t = &l->tasks[pick];
    t->chaos_pid = t->info.pid;
    t->chaos_wants_step = t->had_out_step;
    t->info.chaos_kills++;
    keel__launch_signal_task(t, SIGKILL);
    t->wants_back_event = 1;
    l->chaos_victim = (int)pick;
    keel__launch_log_note(t, "chaos: killed %s (pid %d) at t=%.3f s",
                          t->info.name, t->info.pid,
                          keel__launch_since_start(l, now));
    keel__launch_emit(l, KEEL_LAUNCH_EV_CHAOS, (int)pick, t->info.pid,
                      128 + SIGKILL,
                      "killed %s (pid %d) at t=%.3f s (kill %d, gap %.3f s)",
                      t->info.name, t->info.pid,
                      keel__launch_since_start(l, now), ++l->chaos_count,
                      l->chaos_gap_secs);
}
