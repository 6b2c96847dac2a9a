/* launch_task.c - one task's process: fork+exec with its own TF_CONFIG,
 * environment and pipes (its own process group, killed with the
 * launcher), its log under OUTPUT_DIR/logs, and its output relayed line
 * by line (to the log and the caller's line callback, the "step N" it
 * prints recorded). Uses launch_status.c alone of the launcher's files;
 * launch.c and launch_stop.c start and read tasks through it. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "launch_int.h"
#include "util.h"

extern char **environ;

/* The first "step N" in a line (at its start or after a blank), or -1. */
static int64_t
parse_step(const char *line)
{
    const char *p = line;
    while ((p = strstr(p, "step ")) != NULL) {
        if ((p == line || p[-1] == ' ' || p[-1] == '\t') &&
            p[5] >= '0' && p[5] <= '9') {
            int64_t v = 0;
            for (const char *q = p + 5; *q >= '0' && *q <= '9'; q++) {
                if (v > (INT64_MAX - 9) / 10)
                    return -1;
                v = v * 10 + (*q - '0');
            }
            return v;
        }
        p += 5;
    }
    return -1;
}

/* ---- processes ---------------------------------------------------------- */

static int
open_pidfd(int pid)
{
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0)
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
#else
    (void)pid;
    return -1;
#endif
}

/* environ minus TF_CONFIG and OUTPUT_DIR, plus ours. Built before fork:
 * the child may only make async-signal-safe calls. */
static char **
child_environ(keel_launch *l, task *t)
{
    size_t n = 0, k = 0;
    char **env;
    while (environ != NULL && environ[n] != NULL)
        n++;
    env = calloc(n + 4, sizeof *env);
    if (env == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "TF_CONFIG=", 10) != 0 &&
            strncmp(environ[i], "OUTPUT_DIR=", 11) != 0 &&
            (l->token_env[0] == '\0' ||
             strncmp(environ[i], "KEEL_CLUSTER_TOKEN=", 19) != 0))
            env[k++] = environ[i];
    env[k++] = t->tf_config;
    env[k++] = l->output_env;
    if (l->token_env[0] != '\0')
        env[k++] = l->token_env;
    env[k] = NULL;
    return env;
}

/* A child's standard streams: /dev/null in, a pipe each for out and err
 * (read ends [0] ours, write ends [1] the child's). */
typedef struct child_fds {
    int devnull;
    int out[2], err[2];
} child_fds;

static void
close_child_fds(child_fds *f)
{
    if (f->devnull >= 0)
        close(f->devnull);
    for (int k = 0; k < 2; k++) {
        if (f->out[k] >= 0)
            close(f->out[k]);
        if (f->err[k] >= 0)
            close(f->err[k]);
    }
}

/* 0, or errno with nothing left open. */
static int
open_child_fds(child_fds *f)
{
    f->out[0] = f->out[1] = f->err[0] = f->err[1] = -1;
    f->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (f->devnull < 0 || pipe2(f->out, O_CLOEXEC) != 0 ||
        pipe2(f->err, O_CLOEXEC) != 0) {
        int e = errno;
        close_child_fds(f);
        return e;
    }
    return 0;
}

/* The child, after fork: async-signal-safe calls only. Default signal
 * handling, its own process group, killed with the launcher, then exec. */
static void __attribute__((noreturn))
exec_child(const keel_launch *l, char **env, pid_t parent,
           const child_fds *f)
{
    static const char msg127[] = "keel launch: exec failed\n";
    struct sigaction sa;
    sigset_t none;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setpgid(0, 0);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    if (getppid() != parent)            /* the launcher died already */
        _exit(127);
    dup2(f->devnull, 0);
    dup2(f->out[1], 1);
    dup2(f->err[1], 2);
    execve(l->cfg.exe, l->cfg.argv, env);
    if (write(2, msg127, sizeof msg127 - 1) < 0)
        _exit(127);
    _exit(127);
}

/* Task t runs as pid, its output on the read ends of f: a fresh start of
 * its state and statistics. */
static void
task_running(keel_launch *l, task *t, pid_t pid, const child_fds *f)
{
    setpgid(pid, pid);       /* also in the child: whichever runs first */
    fcntl(f->out[0], F_SETFL, fcntl(f->out[0], F_GETFL) | O_NONBLOCK);
    fcntl(f->err[0], F_SETFL, fcntl(f->err[0], F_GETFL) | O_NONBLOCK);
    t->fd[0] = f->out[0];
    t->fd[1] = f->err[0];
    t->buf[0].used = t->buf[1].used = 0;
    t->pidfd = open_pidfd(pid);
    t->info.pid = pid;
    t->info.state = KEEL_LAUNCH_RUNNING;
    t->is_alive = 1;
    t->chaos_pid = 0;
    t->kill_sent = 0;
    t->is_term_held = 0;
    t->had_step = 0;
    t->had_out_step = 0;
    t->last_error[0] = '\0';
    t->started_ns = keel__now_mono_ns();
    t->chief_step_at_start = l->tasks[l->chief].info.global_step;
    t->last_ticks = 0;
    t->last_sample_ns = 0;
    t->info.cpu_percent = 0;
    t->info.rss_bytes = 0;
}

static keel_status
spawn(keel_launch *l, size_t i)
{
    task *t = &l->tasks[i];
    child_fds f;
    pid_t parent = getpid(), pid;
    sigset_t all, old_mask;
    char **env = child_environ(l, t);
    int e;

    if (env == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: environment of %s",
                          t->info.name);
    if ((e = open_child_fds(&f)) != 0) {
        free(env);
        return keel__fail(KEEL_EIO, "launch: pipes for %s: %s", t->info.name,
                          strerror(e));
    }
    /* signals stay blocked until the child has reset its handlers: one
     * that arrived in between would run the launcher's (or a test
     * harness's) handler inside the child */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old_mask);
    pid = fork();
    if (pid == 0)
        exec_child(l, env, parent, &f);
    e = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    close(f.devnull);
    close(f.out[1]);
    close(f.err[1]);
    free(env);
    if (pid < 0) {
        close(f.out[0]);
        close(f.err[0]);
        return keel__fail(KEEL_EIO, "launch: fork for %s: %s", t->info.name,
                          strerror(e));
    }
    task_running(l, t, pid, &f);
    return KEEL_OK;
}

keel_status
keel__launch_open_log(keel_launch *l, task *t)
{
    char dir[KEEL_PATH_MAX], path[KEEL_PATH_MAX], name[64];
    keel_status st = keel__path_join(dir, sizeof dir, l->output_dir, "logs");
    if (st == KEEL_OK)
        st = keel__fs_mkdirs(dir);
    snprintf(name, sizeof name, "%s.log", t->info.name);
    if (st == KEEL_OK)
        st = keel__path_join(path, sizeof path, dir, name);
    if (st != KEEL_OK)
        return keel__wrap(st, "launch: log of %s", t->info.name);
    t->log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (t->log_fd < 0)
        return keel__fail(KEEL_EIO, "launch: open %s: %s", path,
                          strerror(errno));
    return KEEL_OK;
}

keel_status
keel__launch_start_task(keel_launch *l, size_t i, const char *why)
{
    task *t = &l->tasks[i];
    keel_status st = spawn(l, i);
    if (st != KEEL_OK)
        return st;
    keel__launch_log_note(t, "%s %s (pid %d) %s, TF_CONFIG task %s %d at %s",
                          why, t->info.name, t->info.pid, l->cfg.argv[0],
                          keel_task_type_name(t->info.type), t->info.index,
                          t->info.address);
    keel__launch_emit(l, KEEL_LAUNCH_EV_START, (int)i, t->info.pid, 0,
                      "%s %s (pid %d)%s%s", why, t->info.name, t->info.pid,
                      t->info.address[0] == '-' ? "" : " on ",
                      t->info.address[0] == '-' ? "" : t->info.address);
    return KEEL_OK;
}

/* ---- output ------------------------------------------------------------- */

static void
deliver_line(keel_launch *l, size_t i, int stream, char *line, size_t len)
{
    task *t = &l->tasks[i];
    int64_t step;
    line[len] = '\0';
    if (len > 0 && line[len - 1] == '\r')
        line[--len] = '\0';
    if (t->log_fd >= 0) {
        line[len] = '\n';
        if (write(t->log_fd, line, len + 1) < 0) {
            /* best effort, as for notes */
        }
        line[len] = '\0';
    }
    if (stream == 1 && strncmp(line, "keel: ", 6) == 0 &&
        strncmp(line, "keel: warning", 13) != 0)
        snprintf(t->last_error, sizeof t->last_error, "%s", line + 6);
    step = parse_step(line);
    if (step >= 0) {
        t->info.global_step = step;
        t->had_step = 1;
        t->had_out_step |= stream == 0;
        /* "back" counts a real step line (stdout), not a log line such
         * as "resumed from ... at step N" (stderr) */
        if (t->wants_back_event && stream == 0) {
            t->wants_back_event = 0;
            keel__launch_emit(l, KEEL_LAUNCH_EV_BACK, (int)i, t->info.pid, 0,
                              "%s back at step %lld, %.3f s after it died",
                              t->info.name, (long long)step,
                              (double)(keel__now_mono_ns() - t->died_ns) / 1e9);
        }
    }
    if (l->cfg.line_fn != NULL)
        l->cfg.line_fn(l->cfg.ctx, (int)i, stream + 1, line);
}

/* Read what is there; returns 0 at EOF or error (fd closed), else 1. */
int
keel__launch_read_stream(keel_launch *l, size_t i, int stream)
{
    task *t = &l->tasks[i];
    line_buf *b = &t->buf[stream];
    for (;;) {
        ssize_t r;
        char *nl;
        if (b->used == LINE_BYTES - 1) {   /* an over-long line: split */
            deliver_line(l, i, stream, b->data, b->used);
            b->used = 0;
        }
        r = read(t->fd[stream], b->data + b->used, LINE_BYTES - 1 - b->used);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1;
        if (r <= 0) {
            if (b->used > 0)
                deliver_line(l, i, stream, b->data, b->used);
            b->used = 0;
            close(t->fd[stream]);
            t->fd[stream] = -1;
            return 0;
        }
        b->used += (size_t)r;
        while ((nl = memchr(b->data, '\n', b->used)) != NULL) {
            size_t len = (size_t)(nl - b->data);
            deliver_line(l, i, stream, b->data, len);
            memmove(b->data, nl + 1, b->used - len - 1);
            b->used -= len + 1;
        }
    }
}
