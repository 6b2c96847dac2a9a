/* stop.c - how a MonitoredSession stops: a stop is sticky and keeps the
 * first reason (keel_end_reason); stops from outside the step (the
 * SIGTERM/SIGINT flag, the coordinator) are noticed at a step boundary;
 * keel_session_request_stop, should_stop and end_reason. */
#include <config.h>

#include "util.h"
#include "monitored_int.h"

void
keel__session_stop_with(keel_session *s, keel_end_reason why)
{
    if (!s->is_stopped) {
        s->is_stopped = 1;
        s->reason = why;
    }
}

int
keel__session_notice_stop(keel_session *s)
{
    if (s->is_closed || s->is_stopped)
        return 1;
    if (keel__signal_pending()) {
        keel__log(KEEL_LOG_INFO, "signal %d received: stopping at global "
                  "step %lld", (int)keel__signal_pending(),
                  (long long)keel_vars_global_step(s->vars));
        keel__session_stop_with(s, KEEL_END_SIGNAL);
        return 1;
    }
    if (keel_coord_should_stop(s->coord)) {
        keel__session_stop_with(s, keel_coord_error(s->coord, NULL, 0)
                                       != KEEL_OK ? KEEL_END_ERROR
                                                  : KEEL_END_STOP_REQUESTED);
        return 1;
    }
    return 0;
}

int
keel_session_should_stop(keel_session *s)
{
    return keel__session_check_stop(s);
}

void
keel_session_request_stop(keel_session *s, const char *why)
{
    if (s == NULL)
        return;
    if (!s->is_stopped)
        keel__log(KEEL_LOG_INFO, "stop requested at global step %lld: %s",
                  (long long)keel_vars_global_step(s->vars),
                  why != NULL ? why : "");
    keel__session_stop_with(s, KEEL_END_STOP_REQUESTED);
}

keel_end_reason
keel_session_end_reason(const keel_session *s)
{
    return s->reason;
}
