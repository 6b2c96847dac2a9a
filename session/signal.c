/* signal.c - the public face of the process-wide SIGTERM/SIGINT stop flag
 * (util/signal.c): the session stops at its next step boundary once the
 * flag is set. */
#include <config.h>

#include <keel/session.h>
#include "util.h"

keel_status
keel_session_install_signal_handlers(void)
{
    return keel__signal_install();
}

void
keel_session_uninstall_signal_handlers(void)
{
    keel__signal_uninstall();
}

int
keel_session_signal_received(void)
{
    return keel__signal_pending();
}

void
keel_session_clear_signal(void)
{
    keel__signal_clear();
}
