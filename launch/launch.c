/* launch.c - the local cluster launcher behind `keel launch`: fork+exec of
 * one process per task with its own TF_CONFIG, line relaying and per-task
 * logs, restarts with backoff, an ordered stop (chief, then workers, then
 * ps), and seeded chaos kills. Never prints: lines and events go to
 * the caller's callbacks. Single-threaded; children never outlive us
 * (own process group + PR_SET_PDEATHSIG).
 * This file builds the launcher, starts and scales the job and runs its
 * loop; a task's process and output are launch_task.c's, exits and the
 * stop launch_stop.c's. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#ifdef __linux__
#include <sys/random.h>
#endif

#include "launch_int.h"
#include "util.h"

/* ---- construction ------------------------------------------------------- */


/* Hold a port for task i: bound by our socket (SO_REUSEADDR, not
 * listening) until the launch ends, the kernel gives it to no other
 * bind(port 0) or connect, while the task's own listener (zmq sets
 * SO_REUSEADDR too) may bind it - at its first start and at every
 * restart. */
static keel_status
hold_port(keel_launch *l, size_t i)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int one = 1;
    int *sock = &l->port_holds[i];
    if (l->tasks[i].info.type == KEEL_TASK_EVALUATOR) {
        /* serves nothing: no port */
        snprintf(l->tasks[i].info.address, sizeof l->tasks[i].info.address,
                 "-");
        return KEEL_OK;
    }
    *sock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (*sock < 0 ||
        setsockopt(*sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(*sock, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(*sock, (struct sockaddr *)&a, &len) != 0)
        return keel__fail(KEEL_EIO, "launch: bind 127.0.0.1:0 for %s: %s",
                          l->tasks[i].info.name, strerror(errno));
    snprintf(l->tasks[i].info.address, sizeof l->tasks[i].info.address,
             "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    return KEEL_OK;
}

static keel_status
pick_ports(keel_launch *l)
{
    int *socks = calloc(l->n, sizeof *socks);
    keel_status st = KEEL_OK;
    if (socks == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: %zu sockets", l->n);
    for (size_t i = 0; i < l->n; i++)
        socks[i] = -1;
    l->port_holds = socks;
    for (size_t i = 0; i < l->n && st == KEEL_OK; i++)
        st = hold_port(l, i);
    return st;
}

/* The TF_CONFIG of tasks first.. (the cluster: every task so far). */
static keel_status
build_tf_configs(keel_launch *l, size_t first)
{
    keel_cluster_spec *spec = NULL;
    char *buf = malloc(TF_CONFIG_BYTES);
    keel_status st;
    if (buf == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: TF_CONFIG buffer");
    st = keel_cluster_spec_new(&spec);
    /* the evaluator is not in the training cluster (TF: it may run
     * beside it as evaluator 0): the other tasks' TF_CONFIGs are the same
     * with or without it */
    for (size_t i = 0; i < l->n && st == KEEL_OK; i++)
        if (l->tasks[i].info.type != KEEL_TASK_EVALUATOR)
            st = keel_cluster_spec_add_list(spec, l->tasks[i].info.type,
                                            l->tasks[i].info.address);
    if (st == KEEL_OK)
        st = keel_cluster_spec_set_task(spec, KEEL_TASK_CHIEF, 0);
    if (st == KEEL_OK) {
        keel_cluster_spec_set_mode(spec, l->cfg.mode);
        if (l->cfg.replicas_to_aggregate > 0)
            keel_cluster_spec_set_replicas(spec,
                                           l->cfg.replicas_to_aggregate, 0);
        st = keel_cluster_spec_validate(spec);
    }
    for (size_t i = first; i < l->n && st == KEEL_OK; i++) {
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
    if (type == KEEL_TASK_CHIEF || type == KEEL_TASK_EVALUATOR)
        snprintf(t->info.name, sizeof t->info.name, "%s",
                 keel_task_type_name(type));
    else
        snprintf(t->info.name, sizeof t->info.name, "%s.%d",
                 keel_task_type_name(type), index);
    t->fd[0] = t->fd[1] = t->pidfd = t->log_fd = -1;
}

/* keel_launch_config's defaults, which also stand in for values out of
 * range. */
#define LAUNCH_MAX_RESTARTS 3
#define LAUNCH_BACKOFF_SECS 0.1
#define LAUNCH_GRACE_SECS 10
#define LAUNCH_CHAOS_PERIOD_SECS 10

void
keel_launch_config_init(keel_launch_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->max_restarts = LAUNCH_MAX_RESTARTS;
    cfg->backoff_secs = LAUNCH_BACKOFF_SECS;
    cfg->grace_secs = LAUNCH_GRACE_SECS;
    cfg->chaos_period_secs = LAUNCH_CHAOS_PERIOD_SECS;
    cfg->mode = KEEL_CLUSTER_SYNC;
}

/* What keel_launch_new refuses in cfg. */
static keel_status
check_config(const keel_launch_config *cfg)
{
    if (cfg != NULL && KEEL__STRUCT_CHECK(cfg, keel_launch_config) != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "launch");
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
    if (cfg->mode != KEEL_CLUSTER_SYNC && cfg->mode != KEEL_CLUSTER_ASYNC)
        return keel__fail(KEEL_EINVAL, "launch: mode %d is not a "
                          "keel_cluster_mode", (int)cfg->mode);
    if (cfg->replicas_to_aggregate < 0 ||
        cfg->replicas_to_aggregate > cfg->num_workers + 1)
        return keel__fail(KEEL_EINVAL, "launch: replicas_to_aggregate %d "
                          "is out of range 0..%d (the chief and %d "
                          "workers)", cfg->replicas_to_aggregate,
                          cfg->num_workers + 1, cfg->num_workers);
    if (cfg->chaos && cfg->chaos_period_secs > 1e6)
        return keel__fail(KEEL_EINVAL, "launch: chaos period %g s is too "
                          "long (at most 1e6)", cfg->chaos_period_secs);
    return KEEL_OK;
}

/* cfg into l, values out of range replaced by the defaults; the machine's
 * clock tick and page size (for the /proc samples). */
static void
take_config(keel_launch *l, const keel_launch_config *cfg)
{
    l->cfg = *cfg;
    if (l->cfg.max_restarts < 0)
        l->cfg.max_restarts = LAUNCH_MAX_RESTARTS;
    if (l->cfg.backoff_secs < 0)
        l->cfg.backoff_secs = LAUNCH_BACKOFF_SECS;
    if (l->cfg.grace_secs <= 0)
        l->cfg.grace_secs = LAUNCH_GRACE_SECS;
    if (l->cfg.chaos_period_secs <= 0)
        l->cfg.chaos_period_secs = LAUNCH_CHAOS_PERIOD_SECS;
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
}

/* The tasks in their order: the ps, the chief, the workers, the
 * evaluator. */
static void
init_tasks(keel_launch *l)
{
    size_t k = 0;
    for (int i = 0; i < l->cfg.num_ps; i++)
        init_task(&l->tasks[k++], KEEL_TASK_PS, i);
    l->chief = k;
    init_task(&l->tasks[k++], KEEL_TASK_CHIEF, 0);
    for (int i = 0; i < l->cfg.num_workers; i++)
        init_task(&l->tasks[k++], KEEL_TASK_WORKER, i);
    if (l->cfg.with_evaluator)
        init_task(&l->tasks[k++], KEEL_TASK_EVALUATOR, 0);
}

/* The task table, its tasks initialised (so that keel_launch_free of a
 * launch that fails later closes no descriptor it does not own), and
 * OUTPUT_DIR (copied: cfg.output_dir points at the copy). */
static keel_status
alloc_tasks(keel_launch *l)
{
    size_t len = strlen(l->cfg.output_dir) + sizeof "OUTPUT_DIR=";
    size_t n = (size_t)l->cfg.num_ps + 1 + (size_t)l->cfg.num_workers +
               (l->cfg.with_evaluator ? 1 : 0);
    l->tasks = calloc(n, sizeof *l->tasks);
    if (l->tasks == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: a table of %zu tasks", n);
    l->n = n;
    init_tasks(l);
    l->output_dir = strdup(l->cfg.output_dir);
    l->output_env = malloc(len);
    if (l->output_dir == NULL || l->output_env == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: OUTPUT_DIR of %zu bytes",
                          len);
    snprintf(l->output_env, len, "OUTPUT_DIR=%s", l->output_dir);
    l->cfg.output_dir = l->output_dir;
    return KEEL_OK;
}

/* Every job has a secret: the ps obey only tasks that hold it (a caller's
 * KEEL_CLUSTER_TOKEN is passed on as it is). */
static keel_status
make_token(keel_launch *l)
{
    unsigned char raw[32];
    size_t off;
    if (getenv("KEEL_CLUSTER_TOKEN") != NULL &&
        getenv("KEEL_CLUSTER_TOKEN")[0] != '\0')
        return KEEL_OK;
    off = (size_t)snprintf(l->token_env, sizeof l->token_env,
                           "KEEL_CLUSTER_TOKEN=");
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return keel__fail(KEEL_EIO, "launch: no random bytes for the "
                          "cluster token: %s", strerror(errno));
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(l->token_env + off + 2 * i, 3, "%02x", raw[i]);
    explicit_bzero(raw, sizeof raw);
    return KEEL_OK;
}

keel_status
keel_launch_new(const keel_launch_config *cfg, keel_launch **out)
{
    keel_launch *l;
    keel_status st;

    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "launch: out is NULL");
    *out = NULL;
    if ((st = check_config(cfg)) != KEEL_OK)
        return st;
    l = calloc(1, sizeof *l);
    if (l == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: %zu bytes", sizeof *l);
    take_config(l, cfg);
    st = alloc_tasks(l);
    if (st == KEEL_OK)
        st = make_token(l);
    if (st == KEEL_OK)
        st = pick_ports(l);
    if (st == KEEL_OK)
        st = build_tf_configs(l, 0);
    if (st != KEEL_OK) {
        keel_launch_free(l);
        return st;
    }
    *out = l;
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
        st = keel__launch_open_log(l, &l->tasks[i]);
        if (st != KEEL_OK)
            return st;
    }
    l->is_started = 1;
    l->t0_ns = keel__now_mono_ns();
    l->last_sample_ns = l->t0_ns;
    if (l->cfg.chaos)
        l->next_chaos_ns = l->t0_ns + keel__launch_chaos_gap_ns(l);
    for (size_t i = 0; i < l->n; i++) {
        st = keel__launch_start_task(l, i, "started");
        if (st != KEEL_OK) {
            keel_launch_stop(l, 1);
            return st;
        }
    }
    return KEEL_OK;
}

keel_status
keel_launch_add_worker(keel_launch *l)
{
    task *nt;
    int *nh;
    size_t i;
    int index = 0;
    keel_status st;
    if (l == NULL)
        return keel__fail(KEEL_EINVAL, "launch: NULL launcher");
    if (l->cfg.mode != KEEL_CLUSTER_ASYNC && !l->cfg.elastic)
        return keel__fail(KEEL_ESTATE, "launch: not adding a worker: a sync "
                          "job keeps its fixed replica count; workers join "
                          "a running job only in async mode "
                          "(algorithm.name = async or hogwild) or with "
                          "cluster.elastic = true");
    if (!l->is_started || l->is_stopping)
        return keel__fail(KEEL_ESTATE, "launch: not adding a worker: the "
                          "job is %s", l->is_stopping ? "stopping"
                                                      : "not started");
    for (i = 0; i < l->n; i++)
        if (l->tasks[i].info.type == KEEL_TASK_WORKER &&
            l->tasks[i].info.index >= index)
            index = l->tasks[i].info.index + 1;
    if (index >= KEEL_LAUNCH_MAX_WORKERS)
        return keel__fail(KEEL_EINVAL, "launch: not adding a worker: %d "
                          "workers is the most", KEEL_LAUNCH_MAX_WORKERS);
    nt = realloc(l->tasks, (l->n + 1) * sizeof *nt);
    if (nt == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: task %zu", l->n);
    l->tasks = nt;
    nh = realloc(l->port_holds, (l->n + 1) * sizeof *nh);
    if (nh == NULL)
        return keel__fail(KEEL_ENOMEM, "launch: task %zu", l->n);
    l->port_holds = nh;
    i = l->n;
    init_task(&l->tasks[i], KEEL_TASK_WORKER, index);
    l->tasks[i].is_added = 1;
    l->port_holds[i] = -1;
    l->n++;
    st = hold_port(l, i);
    if (st == KEEL_OK)
        st = build_tf_configs(l, i);
    if (st == KEEL_OK)
        st = keel__launch_open_log(l, &l->tasks[i]);
    if (st == KEEL_OK)
        st = keel__launch_start_task(l, i, "added");
    if (st != KEEL_OK) {
        /* never started: drop it again */
        if (l->port_holds[i] >= 0)
            close(l->port_holds[i]);
        if (l->tasks[i].log_fd >= 0)
            close(l->tasks[i].log_fd);
        free(l->tasks[i].tf_config);
        l->n--;
    }
    return st;
}

keel_status
keel_launch_remove_worker(keel_launch *l)
{
    if (l == NULL)
        return keel__fail(KEEL_EINVAL, "launch: NULL launcher");
    for (size_t i = l->n; i-- > 0;) {
        task *t = &l->tasks[i];
        if (!t->is_added || t->is_removed)
            continue;
        if (!t->is_alive &&
            t->info.state != KEEL_LAUNCH_BACKOFF &&
            t->info.state != KEEL_LAUNCH_PENDING)
            continue;
        t->is_removed = 1;
        keel__launch_emit(l, KEEL_LAUNCH_EV_SCALE, (int)i, t->info.pid, 0,
                          "removing %s (pid %d): SIGTERM, not restarted",
                          t->info.name, t->info.pid);
        if (t->is_alive) {
            t->info.state = KEEL_LAUNCH_STOPPING;
            t->term_sent_ns = keel__now_mono_ns();
            keel__launch_signal_task(t, SIGTERM);
        } else {
            t->info.state = KEEL_LAUNCH_STOPPED;
        }
        return KEEL_OK;
    }
    return keel__fail(KEEL_ENOTFOUND, "launch: no added worker is running "
                      "(only workers added while the job runs are "
                      "removed)");
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
        if (t->term_due_ns > 0 && t->term_due_ns < d)
            d = t->term_due_ns;
        if (keel__launch_held_deadline(l, t) < d)
            d = keel__launch_held_deadline(l, t);
        if (t->is_alive && t->pidfd < 0 && l->last_sample_ns + NS / 20 < d)
            d = l->last_sample_ns + NS / 20;   /* no pidfd: poll exits */
    }
    if (l->cfg.chaos && !l->is_stopping && l->chaos_victim < 0 &&
        l->next_chaos_ns < d)
        d = l->next_chaos_ns;
    return d;
}

/* Wait for output or a child's exit until the nearest deadline (or
 * timeout_ms after now) and relay the lines that came. */
static keel_status
poll_outputs(keel_launch *l, int64_t now, int timeout_ms)
{
    struct pollfd *fds = calloc(l->n * 3, sizeof *fds);
    int *owner = calloc(l->n * 3, sizeof *owner);
    int *stream = calloc(l->n * 3, sizeof *stream);
    size_t nfds = 0;
    int64_t until, wake;
    keel_status st = KEEL_OK;
    if (fds == NULL || owner == NULL || stream == NULL) {
        st = keel__fail(KEEL_ENOMEM, "launch: poll set");
        goto out;
    }
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        for (int s = 0; s < 3; s++) {   /* stdout, stderr, the exit */
            int fd = s < 2 ? t->fd[s] : t->is_alive ? t->pidfd : -1;
            if (fd < 0)
                continue;
            fds[nfds].fd = fd;
            fds[nfds].events = POLLIN;
            owner[nfds] = (int)i;
            stream[nfds++] = s;
        }
    }
    until = now + (int64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000;
    wake = next_deadline(l);
    if (wake > until)
        wake = until;
    if (poll(fds, nfds, wake > now ? (int)((wake - now + 999999) / 1000000)
                                   : 0) > 0)
        for (size_t k = 0; k < nfds; k++) {
            task *t = &l->tasks[owner[k]];
            if (fds[k].revents == 0 || stream[k] == 2)
                continue;
            if (t->fd[stream[k]] == fds[k].fd)
                keel__launch_read_stream(l, (size_t)owner[k], stream[k]);
        }
out:
    free(fds);
    free(owner);
    free(stream);
    return st;
}

/* Start again the tasks whose backoff is over; one that cannot start
 * fails the job. */
static void
restart_due(keel_launch *l, int64_t now)
{
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        if (t->info.state != KEEL_LAUNCH_BACKOFF || l->is_stopping ||
            now < t->restart_at_ns)
            continue;
        t->wants_back_event = 1;
        if (keel__launch_start_task(l, i, "restarted") == KEEL_OK)
            continue;
        t->info.state = KEEL_LAUNCH_FAILED;
        if (l->failed_task < 0) {
            l->failed_task = (int)i;
            snprintf(l->why, sizeof l->why, "%s could not be restarted: %s",
                     t->info.name, keel_last_error());
        }
        keel__launch_begin_stop(l, "a restart failed");
    }
}

/* Stopping: release the held tasks, SIGKILL those past the grace period,
 * send the SIGTERMs due, move the stop order on. */
static void
stop_deadlines(keel_launch *l, int64_t now)
{
    keel__launch_release_held(l, now);  /* up now (or out of time) */
    for (size_t i = 0; i < l->n; i++) {
        task *t = &l->tasks[i];
        if (t->is_alive && t->info.state == KEEL_LAUNCH_STOPPING &&
            now - t->term_sent_ns >= (int64_t)(l->cfg.grace_secs * 1e9) &&
            !t->kill_sent) {
            keel__launch_emit(l, KEEL_LAUNCH_EV_STOP, (int)i, t->info.pid, 0,
                              "%s (pid %d) still running %.0f s after "
                              "SIGTERM: SIGKILL", t->info.name, t->info.pid,
                              l->cfg.grace_secs);
            keel__launch_signal_task(t, SIGKILL);
            t->kill_sent = 1;
        }
    }
    keel__launch_term_due(l, now);
    keel__launch_advance_stop(l, now);
}

keel_status
keel_launch_poll(keel_launch *l, int timeout_ms, int *is_done)
{
    int64_t now;
    keel_status st;

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
    if ((st = poll_outputs(l, now, timeout_ms)) != KEEL_OK)
        return st;
    now = keel__now_mono_ns();
    keel__launch_reap(l, now);
    restart_due(l, now);
    if (l->is_stopping)
        stop_deadlines(l, now);
    keel__launch_chaos_tick(l, now);
    if (now - l->last_sample_ns >= SAMPLE_NS) {
        for (size_t i = 0; i < l->n; i++)
            if (l->tasks[i].is_alive)
                keel__launch_sample_proc(l, &l->tasks[i], now);
        l->last_sample_ns = now;
    }
    if (is_done != NULL)
        *is_done = all_ended(l);
    return KEEL_OK;
}

/* ---- teardown ---------------------------------------------------------- */

void
keel_launch_free(keel_launch *l)
{
    if (l == NULL)
        return;
    for (size_t i = 0; l->tasks != NULL && i < l->n; i++) {
        task *t = &l->tasks[i];
        if (t->is_alive) {
            int status;
            keel__launch_signal_task(t, SIGKILL);
            /* SIGKILL cannot be ignored: this wait ends promptly */
            while (waitpid(t->info.pid, &status, 0) < 0 && errno == EINTR)
                ;
            t->is_alive = 0;
        }
        keel__launch_close_task_fds(t);
        if (t->log_fd >= 0)
            close(t->log_fd);
        free(t->tf_config);
    }
    for (size_t i = 0; l->port_holds != NULL && i < l->n; i++)
        if (l->port_holds[i] >= 0)
            close(l->port_holds[i]);
    free(l->port_holds);
    free(l->tasks);
    free(l->output_dir);
    free(l->output_env);
    explicit_bzero(l->token_env, sizeof l->token_env);
    free(l);
}
