/* launch.c - the local cluster launcher behind `keel launch`: fork+exec of
 * one process per task with its own TF_CONFIG, line relaying and per-task
 * logs, restarts with backoff, an ordered stop (chief, then workers, then
 * ps), and seeded chaos kills. Never prints: lines and events go to
 * the caller's callbacks. Single-threaded; children never outlive us
 * (own process group + PR_SET_PDEATHSIG). */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <keel/launch.h>
#include "util.h"

extern char **environ;

#define LINE_BYTES 8192            /* longer lines are split */
#define TF_CONFIG_BYTES 65536
#define BACKOFF_CAP_SECS 5.0
#define HEALTHY_NS (10 * 1000000000LL) /* or a step line: backoff resets */
#define SAMPLE_NS 500000000LL      /* /proc sampling interval */
#define NS 1000000000LL

typedef struct line_buf {
    char data[LINE_BYTES];
    size_t used;
} line_buf;

typedef struct task {
    keel_launch_task_info info;
    char *tf_config;               /* "TF_CONFIG=..." */
    int fd[2];                     /* stdout, stderr read ends; -1 closed */
    int pidfd;                     /* -1 when unsupported */
    line_buf buf[2];
    int log_fd;
    int is_alive;                  /* a process not reaped yet */
    int chaos_pid;                 /* pid chaos killed (not reaped yet) */
    int kill_sent;                 /* stop deadline passed: SIGKILL sent */
    int is_term_held;              /* stopping: SIGTERM waits until it is up */
    int64_t restart_at_ns;
    int64_t term_sent_ns;
    int64_t died_ns;               /* for the "back" event */
    int wants_back_event;
    int had_step;                  /* printed a step line since its start */
    int64_t started_ns;
    int64_t chief_step_at_start;   /* the cluster's step when it started */
    int backoff_level;             /* failures in a row before progress */
    uint64_t last_ticks;
    int64_t last_sample_ns;
} task;

struct keel_launch {
    keel_launch_config cfg;
    char *output_dir;
    char *output_env;              /* "OUTPUT_DIR=..." */
    task *tasks;
    size_t n;
    size_t chief;
    int is_started;
    int64_t t0_ns;
    int is_stopping;
    int stop_phase;                /* task ranks told: 0..3 (chief,
                                    * workers, ps) */
    int chief_done;
    int failed_task;               /* gave up; -1 none */
    char why[512];
    uint64_t rng;
    int64_t next_chaos_ns;
    double chaos_gap_secs;         /* the gap that led to next_chaos_ns */
    int chaos_count;
    int chaos_victim;              /* -1: none awaiting its restart */
    int64_t last_sample_ns;
    long clk_tck;
    long page_size;
    char msg[1024];
};

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

/* splitmix64: a tiny reproducible PRNG (chaos only, not cryptographic). */
static uint64_t
splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* An exponential gap with the configured mean, in ns. */
static int64_t
chaos_gap_ns(keel_launch *l)
{
    double u = (double)(splitmix64(&l->rng) >> 11) * 0x1.0p-53;
    double secs = -l->cfg.chaos_period_secs * log(1.0 - u);
    if (secs > 1e6)
        secs = 1e6;
    l->chaos_gap_secs = secs;
    return (int64_t)(secs * 1e9);
}

static double
since_start(const keel_launch *l, int64_t now)
{
    return l->is_started ? (double)(now - l->t0_ns) / 1e9 : 0.0;
}

static void
emit(keel_launch *l, keel_launch_event_kind kind, int ti, int pid,
     int status, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void
emit(keel_launch *l, keel_launch_event_kind kind, int ti, int pid,
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
    ev.t_secs = since_start(l, keel__now_mono_ns());
    ev.message = l->msg;
    l->cfg.event_fn(l->cfg.ctx, &ev);
}

/* "exit status 1" / "killed by SIGKILL" for an exit code or 128+sig. */
static const char *
describe_status(int status, char *buf, size_t size)
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

/* A note in a task's own log (launcher events that concern it). */
static void
log_note(task *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
log_note(task *t, const char *fmt, ...)
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

/* ---- construction ------------------------------------------------------- */

static keel_status
pick_ports(keel_launch *l)
{
    int *socks = calloc(l->n, sizeof *socks);
    keel_status st = KEEL_OK;
    if (socks == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: %zu sockets", l->n);
    for (size_t i = 0; i < l->n; i++)
        socks[i] = -1;
    /* Keep every probe socket open until all are bound so the ports are
     * distinct; the tasks bind them again after we close ours (zmq sets
     * SO_REUSEADDR). */
    for (size_t i = 0; i < l->n && st == KEEL_OK; i++) {
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        socks[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = 0;
        if (socks[i] < 0 ||
            bind(socks[i], (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(socks[i], (struct sockaddr *)&a, &len) != 0) {
            st = keel__fail(KEEL_EIO, "launch: bind 127.0.0.1:0 for %s: %s",
                            l->tasks[i].info.name, strerror(errno));
            break;
        }
        snprintf(l->tasks[i].info.address, sizeof l->tasks[i].info.address,
                 "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    }
    for (size_t i = 0; i < l->n; i++)
        if (socks[i] >= 0)
            close(socks[i]);
    free(socks);
    return st;
}

static keel_status
build_tf_configs(keel_launch *l)
{
    keel_cluster_spec *spec = NULL;
    char *buf = malloc(TF_CONFIG_BYTES);
    keel_status st;
    if (buf == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: TF_CONFIG buffer");
    st = keel_cluster_spec_new(&spec);
    for (size_t i = 0; i < l->n && st == KEEL_OK; i++)
        st = keel_cluster_spec_add_list(spec, l->tasks[i].info.type,
                                        l->tasks[i].info.address);
    if (st == KEEL_OK)
        st = keel_cluster_spec_set_task(spec, KEEL_TASK_CHIEF, 0);
    if (st == KEEL_OK)
        st = keel_cluster_spec_validate(spec);
    for (size_t i = 0; i < l->n && st == KEEL_OK; i++) {
        task *t = &l->tasks[i];
        size_t len;
        st = keel_cluster_spec_to_tf_config(spec, t->info.type, t->info.index,
                                            buf, TF_CONFIG_BYTES);
        if (st != KEEL_OK)
            break;
        len = strlen(buf) + sizeof "TF_CONFIG=";
        t->tf_config = malloc(len);
        if (t->tf_config == NULL) {
            st = keel__fail(KEEL_ENOMEM, "launch: TF_CONFIG of %s",
                            t->info.name);
            break;
        }
        snprintf(t->tf_config, len, "TF_CONFIG=%s", buf);
    }
    if (st != KEEL_OK && strncmp(keel_last_error(), "launch", 6) != 0)
        st = keel__wrap(st, "launch");
    keel_cluster_spec_free(spec);
    free(buf);
    return st;
}

static void
init_task(task *t, keel_task_type type, int index)
{
    memset(t, 0, sizeof *t);
    t->info.type = type;
    t->info.index = index;
    t->info.state = KEEL_LAUNCH_PENDING;
    t->info.last_status = -1;
    t->info.global_step = -1;
    if (type == KEEL_TASK_CHIEF)
        snprintf(t->info.name, sizeof t->info.name, "chief");
    else
        snprintf(t->info.name, sizeof t->info.name, "%s.%d",
                 keel_task_type_name(type), index);
    t->fd[0] = t->fd[1] = t->pidfd = t->log_fd = -1;
}

keel_status
keel_launch_new(const keel_launch_config *cfg, keel_launch **out)
{
    keel_launch *l;
    keel_status st;
    size_t k = 0, len;

    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "launch: out is NULL");
    *out = NULL;
    if (cfg == NULL || cfg->exe == NULL || cfg->argv == NULL ||
        cfg->argv[0] == NULL)
        return keel__fail(KEEL_EINVAL, "launch: no program to run (exe, "
                          "argv)");
    if (cfg->num_ps < 0 || cfg->num_ps > KEEL_LAUNCH_MAX_PS)
        return keel__fail(KEEL_EINVAL, "launch: num_ps %d is out of range "
                          "0..%d", cfg->num_ps, KEEL_LAUNCH_MAX_PS);
    if (cfg->num_workers < 0 || cfg->num_workers > KEEL_LAUNCH_MAX_WORKERS)
        return keel__fail(KEEL_EINVAL, "launch: num_workers %d is out of "
                          "range 0..%d", cfg->num_workers,
                          KEEL_LAUNCH_MAX_WORKERS);
    if (cfg->output_dir == NULL || cfg->output_dir[0] == '\0')
        return keel__fail(KEEL_EINVAL, "launch: output_dir is empty");
    if (cfg->chaos && cfg->chaos_period_secs > 1e6)
        return keel__fail(KEEL_EINVAL, "launch: chaos period %g s is too "
                          "long (at most 1e6)", cfg->chaos_period_secs);
    l = calloc(1, sizeof *l);
    if (l == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: %zu bytes", sizeof *l);
    l->cfg = *cfg;
    if (l->cfg.max_restarts < 0)
        l->cfg.max_restarts = 3;
    if (l->cfg.backoff_secs < 0)
        l->cfg.backoff_secs = 0.1;
    if (l->cfg.grace_secs <= 0)
        l->cfg.grace_secs = 10;
    if (l->cfg.chaos_period_secs <= 0)
        l->cfg.chaos_period_secs = 10;
    if (l->cfg.chaos_types == 0)
        l->cfg.chaos_types = (1u << KEEL_TASK_CHIEF) |
                             (1u << KEEL_TASK_WORKER) | (1u << KEEL_TASK_PS);
    l->failed_task = -1;
    l->chaos_victim = -1;
    l->rng = cfg->chaos_seed;
    l->clk_tck = sysconf(_SC_CLK_TCK);
    l->page_size = sysconf(_SC_PAGESIZE);
    if (l->clk_tck <= 0)
        l->clk_tck = 100;
    if (l->page_size <= 0)
        l->page_size = 4096;
    l->n = (size_t)cfg->num_ps + 1 + (size_t)cfg->num_workers;
    l->tasks = calloc(l->n, sizeof *l->tasks);
    l->output_dir = strdup(cfg->output_dir);
    len = strlen(cfg->output_dir) + sizeof "OUTPUT_DIR=";
    l->output_env = malloc(len);
    if (l->tasks == NULL || l->output_dir == NULL || l->output_env == NULL) {
        keel_launch_free(l);
        return keel__fail(KEEL_ENOMEM, "launch: %zu tasks", (size_t)0);
    }
    snprintf(l->output_env, len, "OUTPUT_DIR=%s", cfg->output_dir);
    l->cfg.output_dir = l->output_dir;
    for (int i = 0; i < cfg->num_ps; i++)
        init_task(&l->tasks[k++], KEEL_TASK_PS, i);
    l->chief = k;
    init_task(&l->tasks[k++], KEEL_TASK_CHIEF, 0);
    for (int i = 0; i < cfg->num_workers; i++)
        init_task(&l->tasks[k++], KEEL_TASK_WORKER, i);
    st = pick_ports(l);
    if (st == KEEL_OK)
        st = build_tf_configs(l);
    if (st != KEEL_OK) {
        keel_launch_free(l);
        return st;
    }
    *out = l;
    return KEEL_OK;
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
    env = calloc(n + 3, sizeof *env);
    if (env == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "TF_CONFIG=", 10) != 0 &&
            strncmp(environ[i], "OUTPUT_DIR=", 11) != 0)
            env[k++] = environ[i];
    env[k++] = t->tf_config;
    env[k++] = l->output_env;
    env[k] = NULL;
    return env;
}

static keel_status
spawn(keel_launch *l, size_t i)
{
    task *t = &l->tasks[i];
    int po[2] = { -1, -1 }, pe[2] = { -1, -1 }, devnull;
    pid_t parent = getpid(), pid;
    sigset_t all, old_mask;
    char **env = child_environ(l, t);
    static const char msg127[] = "keel launch: exec failed\n";

    if (env == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: environment of %s",
                          t->info.name);
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0 || pipe2(po, O_CLOEXEC) != 0 ||
        pipe2(pe, O_CLOEXEC) != 0) {
        int e = errno;
        if (devnull >= 0)
            close(devnull);
        for (int k = 0; k < 2; k++) {
            if (po[k] >= 0)
                close(po[k]);
            if (pe[k] >= 0)
                close(pe[k]);
        }
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
    if (pid == 0) {
        /* child: async-signal-safe calls only */
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
        if (getppid() != parent)         /* the launcher died already */
            _exit(127);
        dup2(devnull, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        execve(l->cfg.exe, l->cfg.argv, env);
        if (write(2, msg127, sizeof msg127 - 1) < 0)
            _exit(127);
        _exit(127);
    }
    {
        int e = errno;
        pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
        close(devnull);
        close(po[1]);
        close(pe[1]);
        free(env);
        if (pid < 0) {
            close(po[0]);
            close(pe[0]);
            return keel__fail(KEEL_EIO, "launch: fork for %s: %s",
                              t->info.name, strerror(e));
        }
    }
    setpgid(pid, pid);       /* also in the child: whichever runs first */
    fcntl(po[0], F_SETFL, fcntl(po[0], F_GETFL) | O_NONBLOCK);
    fcntl(pe[0], F_SETFL, fcntl(pe[0], F_GETFL) | O_NONBLOCK);
    t->fd[0] = po[0];
    t->fd[1] = pe[0];
    t->buf[0].used = t->buf[1].used = 0;
    t->pidfd = open_pidfd(pid);
    t->info.pid = pid;
    t->info.state = KEEL_LAUNCH_RUNNING;
    t->is_alive = 1;
    t->chaos_pid = 0;
    t->kill_sent = 0;
    t->is_term_held = 0;
    t->had_step = 0;
    t->started_ns = keel__now_mono_ns();
    t->chief_step_at_start = l->tasks[l->chief].info.global_step;
    t->last_ticks = 0;
    t->last_sample_ns = 0;
    t->info.cpu_percent = 0;
    t->info.rss_bytes = 0;
    return KEEL_OK;
}

static keel_status
open_log(keel_launch *l, task *t)
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

static keel_status
start_task(keel_launch *l, size_t i, const char *why)
{
    task *t = &l->tasks[i];
    keel_status st = spawn(l, i);
    if (st != KEEL_OK)
        return st;
    log_note(t, "%s %s (pid %d) %s, TF_CONFIG task %s %d at %s",
             why, t->info.name, t->info.pid, l->cfg.argv[0],
             keel_task_type_name(t->info.type), t->info.index,
             t->info.address);
    emit(l, KEEL_LAUNCH_EV_START, (int)i, t->info.pid, 0,
         "%s %s (pid %d) on %s", why, t->info.name, t->info.pid,
         t->info.address);
    return KEEL_OK;
}

keel_status
keel_launch_start(keel_launch *l)
{
    keel_status st;
    if (l == NULL)
        return keel__fail(KEEL_EINVAL, "launch: NULL launcher");
    if (l->is_started)
        return keel__fail(KEEL_ESTATE, "launch: already started");
    st = keel__fs_mkdirs(l->output_dir);
    if (st != KEEL_OK)
        return keel__wrap(st, "launch: OUTPUT_DIR");
    for (size_t i = 0; i < l->n; i++) {
        st = open_log(l, &l->tasks[i]);
        if (st != KEEL_OK)
            return st;
    }
    l->is_started = 1;
    l->t0_ns = keel__now_mono_ns();
    l->last_sample_ns = l->t0_ns;
    if (l->cfg.chaos)
        l->next_chaos_ns = l->t0_ns + chaos_gap_ns(l);
    for (size_t i = 0; i < l->n; i++) {
        st = start_task(l, i, "started");
        if (st != KEEL_OK) {
            keel_launch_stop(l, 1);
            return st;
        }
    }
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
    step = parse_step(line);
    if (step >= 0) {
        t->info.global_step = step;
        t->had_step = 1;
        /* "back" counts a real step line (stdout), not a log line such
         * as "resumed from ... at step N" (stderr) */
        if (t->wants_back_event && stream == 0) {
            t->wants_back_event = 0;
            emit(l, KEEL_LAUNCH_EV_BACK, (int)i, t->info.pid, 0,
                 "%s back at step %lld, %.3f s after it died",
                 t->info.name, (long long)step,
                 (double)(keel__now_mono_ns() - t->died_ns) / 1e9);
        }
    }
    if (l->cfg.line_fn != NULL)
        l->cfg.line_fn(l->cfg.ctx, (int)i, stream + 1, line);
}

/* Read what is there; returns 0 at EOF or error (fd closed), else 1. */
static int
read_stream(keel_launch *l, size_t i, int stream)
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

/* ---- exits and restarts ------------------------------------------------- */

static void begin_stop(keel_launch *l, const char *reason);

static void
close_task_fds(task *t)
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

static void
on_exit_status(keel_launch *l, size_t i, int status, int64_t now)
{
    task *t = &l->tasks[i];
    char how[64];
    int was_chaos = t->chaos_pid != 0 && t->chaos_pid == t->info.pid &&
                    status == 128 + SIGKILL;
    /* lines the task wrote before it died come before its exit event */
    for (int s = 0; s < 2; s++)
        if (t->fd[s] >= 0)
            read_stream(l, i, s);
    close_task_fds(t);
    t->is_alive = 0;
    t->chaos_pid = 0;
    t->info.last_status = status;
    t->died_ns = now;
    describe_status(status, how, sizeof how);
    emit(l, KEEL_LAUNCH_EV_EXIT, (int)i, t->info.pid, status,
         "%s (pid %d) ended: %s%s", t->info.name, t->info.pid, how,
         was_chaos ? " (chaos)" : "");
    log_note(t, "%s (pid %d) ended: %s%s", t->info.name, t->info.pid, how,
             was_chaos ? " (chaos)" : "");
    if (l->is_stopping) {
        t->info.state = status == 0 ? KEEL_LAUNCH_DONE : KEEL_LAUNCH_STOPPED;
        return;
    }
    if (status == 0) {
        t->info.state = KEEL_LAUNCH_DONE;
        if (i == l->chief) {
            l->chief_done = 1;
            begin_stop(l, "the chief finished");
        }
        return;
    }
    /* exit 2 is keel's usage/configuration error: a restart cannot fix it */
    if (status != 2 && (was_chaos || t->info.restarts < l->cfg.max_restarts)) {
        double delay = l->cfg.backoff_secs;
        if (!was_chaos) {
            /* a crash loop backs off exponentially; a task that made
             * progress (its own step line, the chief's step advancing
             * while it was up, or 10 s up) starts over at the base */
            if (t->had_step || now - t->started_ns >= HEALTHY_NS ||
                l->tasks[l->chief].info.global_step > t->chief_step_at_start)
                t->backoff_level = 0;
            t->info.restarts++;
            for (int k = 0; k < t->backoff_level &&
                 delay < BACKOFF_CAP_SECS; k++)
                delay *= 2;
            if (delay > BACKOFF_CAP_SECS)
                delay = BACKOFF_CAP_SECS;
            t->backoff_level++;
        }
        t->info.state = KEEL_LAUNCH_BACKOFF;
        t->restart_at_ns = now + (int64_t)(delay * 1e9);
        if (was_chaos)
            emit(l, KEEL_LAUNCH_EV_RESTART, (int)i, t->info.pid, status,
                 "restarting %s in %.3g s (chaos kill; not counted)",
                 t->info.name, delay);
        else
            emit(l, KEEL_LAUNCH_EV_RESTART, (int)i, t->info.pid, status,
                 "restarting %s in %.3g s (restart %d of %d after %s)",
                 t->info.name, delay, t->info.restarts,
                 l->cfg.max_restarts, how);
        return;
    }
    t->info.state = KEEL_LAUNCH_FAILED;
    if (l->failed_task < 0) {
        l->failed_task = (int)i;
        snprintf(l->why, sizeof l->why, "%s failed %d time%s (last: %s%s); "
                 "see %s/logs/%s.log", t->info.name, t->info.restarts + 1,
                 t->info.restarts == 0 ? "" : "s", how,
                 status == 2 ? ", a configuration error: not restarted" : "",
                 l->output_dir, t->info.name);
    }
    emit(l, KEEL_LAUNCH_EV_GIVE_UP, (int)i, t->info.pid, status,
         "giving up on %s: %s", t->info.name, l->why);
    begin_stop(l, "a task failed for good");
}

static void
reap(keel_launch *l, int64_t now)
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

static void
signal_task(task *t, int sig)
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
    signal_task(t, SIGTERM);
    t->info.state = KEEL_LAUNCH_STOPPING;
    t->term_sent_ns = now;
}

/* Stop order: the chief first (its final step may still need the workers'
 * gradients, its final checkpoint the ps), then the workers, then the ps. */
static int
stop_rank(keel_task_type type)
{
    return type == KEEL_TASK_CHIEF ? 0 : type == KEEL_TASK_PS ? 2 : 1;
}

static void
advance_stop(keel_launch *l, int64_t now)
{
    for (;;) {
        for (size_t i = 0; i < l->n; i++)
            if (l->tasks[i].is_alive &&
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

static void
begin_stop(keel_launch *l, const char *reason)
{
    int64_t now = keel__now_mono_ns();
    if (l->is_stopping)
        return;
    l->is_stopping = 1;
    l->stop_phase = 0;
    emit(l, KEEL_LAUNCH_EV_STOP, -1, 0, 0, "%s: stopping every task "
         "(SIGTERM; SIGKILL after %.0f s)", reason, l->cfg.grace_secs);
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        if (!t->is_alive && i == l->chief && l->failed_task < 0 &&
            t->info.state == KEEL_LAUNCH_BACKOFF) {
            /* the chief is down (a crash or a chaos kill) and was going to
             * be restarted: restart it now, so that the run still ends
             * with its final checkpoint and exit status 0 (not when a task
             * was given up: the run has failed, nothing to save it for) */
            t->wants_back_event = 1;
            if (start_task(l, i, "restarted") == KEEL_OK)
                continue;
        }
        if (!t->is_alive)
            term_task(l, t, now);           /* in backoff: stays down */
    }
    advance_stop(l, now);
}

void
keel_launch_stop(keel_launch *l, int force)
{
    if (l == NULL)
        return;
    if (!l->is_stopping)
        begin_stop(l, force ? "forced stop" : "stop requested");
    else if (!force)
        return;
    if (force) {
        for (size_t i = 0; i < l->n; i++) {
            task *t = &l->tasks[i];
            if (t->is_alive) {
                signal_task(t, SIGKILL);
                t->info.state = KEEL_LAUNCH_STOPPING;
            } else if (t->info.state == KEEL_LAUNCH_BACKOFF ||
                       t->info.state == KEEL_LAUNCH_PENDING) {
                t->info.state = KEEL_LAUNCH_STOPPED;
            }
        }
        l->stop_phase = 3;
    }
}

/* ---- chaos -------------------------------------------------------------- */

static void
chaos_tick(keel_launch *l, int64_t now)
{
    size_t eligible[1 + KEEL_LAUNCH_MAX_PS + KEEL_LAUNCH_MAX_WORKERS];
    size_t n_eligible = 0, pick;
    task *t;
    if (!l->cfg.chaos || l->is_stopping)
        return;
    if (l->chaos_victim >= 0) {
        keel_launch_state s = l->tasks[l->chaos_victim].info.state;
        if (s == KEEL_LAUNCH_BACKOFF || l->tasks[l->chaos_victim].chaos_pid)
            return;                     /* not back yet */
        /* running again (or ended for good): the next gap starts now */
        l->chaos_victim = -1;
        l->next_chaos_ns = now + chaos_gap_ns(l);
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
        l->next_chaos_ns = now + chaos_gap_ns(l);
        return;
    }
    pick = eligible[splitmix64(&l->rng) % n_eligible];
    t = &l->tasks[pick];
    t->chaos_pid = t->info.pid;
    t->info.chaos_kills++;
    signal_task(t, SIGKILL);
    t->wants_back_event = 1;
    l->chaos_victim = (int)pick;
    log_note(t, "chaos: killed %s (pid %d) at t=%.3f s", t->info.name,
             t->info.pid, since_start(l, now));
    emit(l, KEEL_LAUNCH_EV_CHAOS, (int)pick, t->info.pid, 128 + SIGKILL,
         "killed %s (pid %d) at t=%.3f s (kill %d, gap %.3f s)",
         t->info.name, t->info.pid, since_start(l, now), ++l->chaos_count,
         l->chaos_gap_secs);
}

/* ---- /proc samples ------------------------------------------------------ */

static void
sample_proc(keel_launch *l, task *t, int64_t now)
{
    char path[64], buf[1024];
    char *p;
    int fd;
    ssize_t r;
    unsigned long long utime = 0, stime = 0;
    long long size_pages = 0, rss_pages = 0;

    snprintf(path, sizeof path, "/proc/%d/stat", t->info.pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0)
        return;
    buf[r] = '\0';
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
    snprintf(path, sizeof path, "/proc/%d/statm", t->info.pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0)
        return;
    buf[r] = '\0';
    if (sscanf(buf, "%lld %lld", &size_pages, &rss_pages) == 2)
        t->info.rss_bytes = rss_pages * l->page_size;
}

/* ---- the loop ----------------------------------------------------------- */

static int
all_ended(const keel_launch *l)
{
    for (size_t i = 0; i < l->n; i++) {
        const task *t = &l->tasks[i];
        if (t->is_alive || t->info.state == KEEL_LAUNCH_BACKOFF ||
            t->info.state == KEEL_LAUNCH_PENDING)
            return 0;
    }
    return 1;
}

/* The nearest deadline the loop must wake for (ns), or INT64_MAX. */
static int64_t
next_deadline(const keel_launch *l)
{
    int64_t d = l->last_sample_ns + SAMPLE_NS;
    for (size_t i = 0; i < l->n; i++) {
        const task *t = &l->tasks[i];
        if (t->info.state == KEEL_LAUNCH_BACKOFF && t->restart_at_ns < d)
            d = t->restart_at_ns;
        if (t->info.state == KEEL_LAUNCH_STOPPING && t->is_alive) {
            int64_t k = t->term_sent_ns + (int64_t)(l->cfg.grace_secs * 1e9);
            if (k < d)
                d = k;
        }
        if (t->is_term_held && t->is_alive) {
            int64_t k = t->started_ns + (int64_t)(l->cfg.grace_secs * 1e9);
            if (k < d)
                d = k;
        }
        if (t->is_alive && t->pidfd < 0 && l->last_sample_ns + NS / 20 < d)
            d = l->last_sample_ns + NS / 20;   /* no pidfd: poll exits */
    }
    if (l->cfg.chaos && !l->is_stopping && l->chaos_victim < 0 &&
        l->next_chaos_ns < d)
        d = l->next_chaos_ns;
    return d;
}

keel_status
keel_launch_poll(keel_launch *l, int timeout_ms, int *is_done)
{
    struct pollfd *fds;
    int *owner, *stream;
    size_t nfds = 0;
    int64_t now, until, wake;
    int r;

    if (is_done != NULL)
        *is_done = 0;
    if (l == NULL || !l->is_started)
        return keel__fail(KEEL_ESTATE, "launch: poll before start");
    now = keel__now_mono_ns();
    if (all_ended(l)) {
        if (is_done != NULL)
            *is_done = 1;
        return KEEL_OK;
    }
    fds = calloc(l->n * 3, sizeof *fds);
    owner = calloc(l->n * 3, sizeof *owner);
    stream = calloc(l->n * 3, sizeof *stream);
    if (fds == NULL || owner == NULL || stream == NULL) {
        free(fds);
        free(owner);
        free(stream);
        return keel__fail(KEEL_ENOMEM, "launch: poll set");
    }
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        for (int s = 0; s < 2; s++)
            if (t->fd[s] >= 0) {
                fds[nfds].fd = t->fd[s];
                fds[nfds].events = POLLIN;
                owner[nfds] = (int)i;
                stream[nfds++] = s;
            }
        if (t->is_alive && t->pidfd >= 0) {
            fds[nfds].fd = t->pidfd;
            fds[nfds].events = POLLIN;
            owner[nfds] = (int)i;
            stream[nfds++] = 2;
        }
    }
    until = now + (int64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000;
    wake = next_deadline(l);
    if (wake > until)
        wake = until;
    r = poll(fds, nfds, wake > now ? (int)((wake - now + 999999) / 1000000)
                                   : 0);
    if (r > 0) {
        for (size_t k = 0; k < nfds; k++) {
            task *t = &l->tasks[owner[k]];
            if (fds[k].revents == 0 || stream[k] == 2)
                continue;
            if (t->fd[stream[k]] == fds[k].fd)
                read_stream(l, (size_t)owner[k], stream[k]);
        }
    }
    free(fds);
    free(owner);
    free(stream);
    now = keel__now_mono_ns();
    reap(l, now);
    /* restarts due */
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        if (t->info.state == KEEL_LAUNCH_BACKOFF && !l->is_stopping &&
            now >= t->restart_at_ns) {
            char why[32];
            keel_status st;
            snprintf(why, sizeof why, "restarted");
            t->wants_back_event = 1;
            st = start_task(l, i, why);
            if (st != KEEL_OK) {
                t->info.state = KEEL_LAUNCH_FAILED;
                if (l->failed_task < 0) {
                    l->failed_task = (int)i;
                    snprintf(l->why, sizeof l->why, "%s could not be "
                             "restarted: %s", t->info.name,
                             keel_last_error());
                }
                begin_stop(l, "a restart failed");
            }
        }
    }
    /* stop deadlines */
    if (l->is_stopping) {
        for (size_t i = 0; i < l->n; i++) {
            task *t = &l->tasks[i];
            if (t->is_term_held && t->is_alive &&
                !must_hold_term(l, t, now))
                term_task(l, t, now);        /* up now (or out of time) */
            if (t->is_alive && t->info.state == KEEL_LAUNCH_STOPPING &&
                now - t->term_sent_ns >=
                    (int64_t)(l->cfg.grace_secs * 1e9) &&
                !t->kill_sent) {
                emit(l, KEEL_LAUNCH_EV_STOP, (int)i, t->info.pid, 0,
                     "%s (pid %d) still running %.0f s after SIGTERM: "
                     "SIGKILL", t->info.name, t->info.pid,
                     l->cfg.grace_secs);
                signal_task(t, SIGKILL);
                t->kill_sent = 1;
            }
        }
        advance_stop(l, now);
    }
    chaos_tick(l, now);
    if (now - l->last_sample_ns >= SAMPLE_NS) {
        for (size_t i = 0; i < l->n; i++)
            if (l->tasks[i].is_alive)
                sample_proc(l, &l->tasks[i], now);
        l->last_sample_ns = now;
    }
    if (is_done != NULL)
        *is_done = all_ended(l);
    return KEEL_OK;
}

/* ---- accessors and teardown --------------------------------------------- */

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
            snprintf(m->why, sizeof m->why, "the chief ended with %s",
                     describe_status(c->info.last_status, how, sizeof how));
        *why = m->why;
    }
    return 1;
}

double
keel_launch_elapsed(const keel_launch *l)
{
    return l != NULL ? since_start(l, keel__now_mono_ns()) : 0.0;
}

void
keel_launch_free(keel_launch *l)
{
    if (l == NULL)
        return;
    for (size_t i = 0; l->tasks != NULL && i < l->n; i++) {
        task *t = &l->tasks[i];
        if (t->is_alive) {
            int status;
            signal_task(t, SIGKILL);
            /* SIGKILL cannot be ignored: this wait ends promptly */
            while (waitpid(t->info.pid, &status, 0) < 0 && errno == EINTR)
                ;
            t->is_alive = 0;
        }
        close_task_fds(t);
        if (t->log_fd >= 0)
            close(t->log_fd);
        free(t->tf_config);
    }
    free(l->tasks);
    free(l->output_dir);
    free(l->output_env);
    free(l);
}
