/* launch_status.c - what the launcher reports: events to the caller's
 * callback, notes in a task's log, exit-status wording, /proc samples
 * (CPU %, RSS) and the read-only accessors. Never prints. */
#include <config.h>

#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "launch_int.h"
#include "util.h"

/* ---- small helpers ------------------------------------------------------ */

static const char *const state_names[] = {
    "pending", "running", "backoff", "stopping", "done", "stopped", "failed"
};

const char *
keel_launch_state_name(keel_launch_state s)
{
    if ((unsigned)s < sizeof state_names / sizeof state_names[0])
        return state_names[s];
    return "unknown";
}

double
keel__launch_since_start(const keel_launch *l, int64_t now)
{
    return l->is_started ? (double)(now - l->t0_ns) / 1e9 : 0.0;
}

void
keel__launch_emit(keel_launch *l, keel_launch_event_kind kind, int ti, int pid,
     int status, const char *fmt, ...)
{
    keel_launch_event ev;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->msg, sizeof l->msg, fmt, ap);
    va_end(ap);
    if (l->cfg.event_fn == NULL)
        return;
    ev.kind = kind;
    ev.task = ti;
    ev.pid = pid;
    ev.status = status;
    ev.t_secs = keel__launch_since_start(l, keel__now_mono_ns());
    ev.message = l->msg;
    l->cfg.event_fn(l->cfg.ctx, &ev);
}

/* "exit status 1" / "killed by SIGKILL" for an exit code or 128+sig. */
const char *
keel__launch_describe_status(int status, char *buf, size_t size)
{
    if (status > 128 && status < 128 + 65) {
        const char *name = NULL;
        switch (status - 128) {
        case SIGKILL: name = "SIGKILL"; break;
        case SIGTERM: name = "SIGTERM"; break;
        case SIGINT: name = "SIGINT"; break;
        case SIGSEGV: name = "SIGSEGV"; break;
        case SIGABRT: name = "SIGABRT"; break;
        case SIGBUS: name = "SIGBUS"; break;
        default: break;
        }
        if (name != NULL)
            snprintf(buf, size, "killed by %s", name);
        else
            snprintf(buf, size, "killed by signal %d", status - 128);
    } else {
        snprintf(buf, size, "exit status %d", status);
    }
    return buf;
}

void
keel__launch_log_note(task *t, const char *fmt, ...)
{
    char line[1024], stamp[64];
    time_t now = time(NULL);
    struct tm tm;
    va_list ap;
    int n;
    if (t->log_fd < 0)
        return;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    n = snprintf(line, sizeof line, "--- keel launch %s: ", stamp);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line - 1)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    /* best effort: a full disk must not stop the supervision */
    if (write(t->log_fd, line, (size_t)n) < 0)
        return;
}

/* ---- /proc samples ------------------------------------------------------ */

/* /proc/<pid>/<what> into buf (NUL-terminated); 0 if it cannot be read
 * (the task has just exited: the sample is skipped). */
static int
read_proc(pid_t pid, const char *what, char *buf, size_t size)
{
    char path[64];
    ssize_t r;
    int fd;
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, what);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    r = read(fd, buf, size - 1);
    close(fd);
    if (r <= 0)
        return 0;
    buf[r] = '\0';
    return 1;
}

void
keel__launch_sample_proc(keel_launch *l, task *t, int64_t now)
{
    char buf[1024];
    char *p;
    unsigned long long utime = 0, stime = 0;
    long long size_pages = 0, rss_pages = 0;

    if (!read_proc(t->info.pid, "stat", buf, sizeof buf))
        return;
    p = strrchr(buf, ')');            /* comm may hold spaces and parens */
    if (p == NULL ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu "
               "%llu", &utime, &stime) != 2)
        return;
    if (t->last_sample_ns > 0 && now > t->last_sample_ns) {
        double dt = (double)(now - t->last_sample_ns) / 1e9;
        double used = (double)(utime + stime - t->last_ticks) /
                      (double)l->clk_tck;
        t->info.cpu_percent = used >= 0 ? 100.0 * used / dt : 0;
    }
    t->last_ticks = utime + stime;
    t->last_sample_ns = now;
    if (read_proc(t->info.pid, "statm", buf, sizeof buf) &&
        sscanf(buf, "%lld %lld", &size_pages, &rss_pages) == 2)
        t->info.rss_bytes = rss_pages * l->page_size;
}

/* ---- accessors ---------------------------------------------------------- */

size_t
keel_launch_num_tasks(const keel_launch *l)
{
    return l != NULL ? l->n : 0;
}

keel_status
keel_launch_task(const keel_launch *l, size_t i, keel_launch_task_info *out)
{
    if (l == NULL || out == NULL || i >= l->n)
        return keel__fail(KEEL_EINVAL, "launch: no task %zu (have %zu)", i,
                          l != NULL ? l->n : 0);
    *out = l->tasks[i].info;
    return KEEL_OK;
}

int
keel_launch_exit_code(const keel_launch *l, const char **why)
{
    const task *c;
    if (why != NULL)
        *why = "";
    if (l == NULL || l->n == 0)
        return 1;
    if (l->failed_task >= 0) {
        if (why != NULL)
            *why = l->why;
        return 1;
    }
    c = &l->tasks[l->chief];
    if (c->info.last_status == 0 && !c->is_alive)
        return 0;
    if (why != NULL) {
        char how[64];
        keel_launch *m = (keel_launch *)l;   /* the why buffer only */
        if (c->info.last_status < 0)
            snprintf(m->why, sizeof m->why, "the chief never ran");
        else
            snprintf(m->why, sizeof m->why, "the chief ended with %s%s%s",
                     keel__launch_describe_status(c->info.last_status, how,
                                                  sizeof how),
                     c->last_error[0] ? ": " : "", c->last_error);
        *why = m->why;
    }
    return 1;
}

double
keel_launch_elapsed(const keel_launch *l)
{
    return l != NULL ? keel__launch_since_start(l, keel__now_mono_ns()) : 0.0;
}
