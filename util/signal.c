/* signal.c - the process-wide stop flag that SIGTERM and SIGINT set, and
 * the handlers that set it. Every layer reads it (the session at step
 * boundaries, the cluster roles while waiting, the trainer at start-up);
 * the public functions (keel_session_*_signal*) are session/signal.c's. */
#include <config.h>

#include <signal.h>
#include <string.h>

#include "util.h"

volatile sig_atomic_t keel__signal_flag;
static struct sigaction g_old_term, g_old_int;
static int g_is_installed;

static void
on_signal(int sig)
{
    keel__signal_flag = sig;
}

keel_status
keel__signal_install(void)
{
    struct sigaction sa;
    if (g_is_installed)
        return KEEL_OK;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &sa, &g_old_term) != 0
        || sigaction(SIGINT, &sa, &g_old_int) != 0)
        return keel__fail(KEEL_EIO, "install SIGTERM/SIGINT handlers failed");
    g_is_installed = 1;
    return KEEL_OK;
}

void
keel__signal_uninstall(void)
{
    if (!g_is_installed)
        return;
    sigaction(SIGTERM, &g_old_term, NULL);
    sigaction(SIGINT, &g_old_int, NULL);
    g_is_installed = 0;
}

void
keel__signal_clear(void)
{
    keel__signal_flag = 0;
}

int
keel__signal_pending(void)
{
    return keel__signal_flag;
}

