/* keel/launch.h - a local cluster launcher: starts N ps, a chief and M
 * workers as child processes on 127.0.0.1 (each with its own TF_CONFIG and
 * free ports, a shared OUTPUT_DIR), relays their output lines, restarts
 * failed tasks, stops everything when the chief finishes, and can kill
 * tasks at random (chaos). Reports through callbacks; never prints. Linux
 * (prctl PDEATHSIG, /proc); single-threaded: one thread drives a launcher. */
#ifndef KEEL_LAUNCH_H
#define KEEL_LAUNCH_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/cluster.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_LAUNCH_MAX_PS 16
#define KEEL_LAUNCH_MAX_WORKERS 64
#define KEEL_LAUNCH_NAME_MAX 16       /* "worker.63" incl. NUL */

typedef struct keel_launch keel_launch;

typedef enum keel_launch_state {
    KEEL_LAUNCH_PENDING = 0,  /* not started yet */
    KEEL_LAUNCH_RUNNING,
    KEEL_LAUNCH_BACKOFF,      /* died; restarts (at once, or after a
                               * crash loop's backoff) */
    KEEL_LAUNCH_STOPPING,     /* told to stop (SIGTERM sent) */
    KEEL_LAUNCH_DONE,         /* exited 0 */
    KEEL_LAUNCH_STOPPED,      /* ended by the launcher's stop */
    KEEL_LAUNCH_FAILED        /* failed more than max_restarts times */
} keel_launch_state;

/* "pending", "running", ...; static, never NULL. */
const char *keel_launch_state_name(keel_launch_state s);

/* A snapshot of one task (keel_launch_task()). */
typedef struct keel_launch_task_info {
    char name[KEEL_LAUNCH_NAME_MAX];  /* "chief", "worker.1", "ps.0" */
    keel_task_type type;
    int index;
    keel_launch_state state;
    int pid;                  /* current or last process; 0 before start */
    int restarts;             /* restarts after failures (not chaos) */
    int chaos_kills;          /* times chaos killed it */
    int last_status;          /* exit code, 128+signal, -1 none yet */
    int64_t global_step;      /* from its "step N" lines; -1 unknown */
    double cpu_percent;       /* over the last sample interval */
    int64_t rss_bytes;        /* resident set size; 0 unknown */
    char address[KEEL_ADDR_MAX]; /* "127.0.0.1:port" */
} keel_launch_task_info;

/* What the launcher reports besides output lines. */
typedef enum keel_launch_event_kind {
    KEEL_LAUNCH_EV_START = 0, /* a task (re)started */
    KEEL_LAUNCH_EV_EXIT,      /* a task ended (any reason) */
    KEEL_LAUNCH_EV_RESTART,   /* a failed task will be restarted */
    KEEL_LAUNCH_EV_GIVE_UP,   /* a task failed for good */
    KEEL_LAUNCH_EV_CHAOS,     /* chaos killed a task */
    KEEL_LAUNCH_EV_STOP,      /* the launcher is stopping everything */
    KEEL_LAUNCH_EV_BACK,      /* a restarted task reported its first step */
    KEEL_LAUNCH_EV_SCALE      /* a worker is being removed
                               * (keel_launch_remove_worker) */
} keel_launch_event_kind;

typedef struct keel_launch_event {
    keel_launch_event_kind kind;
    int task;                 /* task number (keel_launch_task), -1: none */
    int pid;
    int status;               /* EXIT/RESTART/GIVE_UP: exit code/128+sig */
    double t_secs;            /* seconds since keel_launch_start() */
    const char *message;      /* one line, no newline; borrowed */
} keel_launch_event;

typedef struct keel_launch_config {
    uint32_t struct_size;          /* set by keel_launch_config_init() */
    /* The program each task runs and its arguments (argv[0] included),
     * NULL-terminated; borrowed until keel_launch_free(). */
    const char *exe;
    char *const *argv;
    int num_ps;               /* 0..KEEL_LAUNCH_MAX_PS */
    int num_workers;          /* 0..KEEL_LAUNCH_MAX_WORKERS (plus a chief) */
    /* Exported as OUTPUT_DIR to every task; per-task logs go to
     * OUTPUT_DIR/logs/<task>.log (appended). Created if missing. */
    const char *output_dir;
    int max_restarts;         /* per task, failures only; default (and
                               * < 0) 3 */
    double backoff_secs;      /* restart delay in a crash loop, doubled
                               * per failure in a row before any progress
                               * (its step line, the chief's step
                               * advancing meanwhile, or 10 s up), at
                               * most 5 s; a task that made progress
                               * restarts at once; default (and < 0)
                               * 0.1 */
    double grace_secs;        /* SIGTERM -> SIGKILL; default (and <= 0)
                               * 10 */
    /* Chaos: SIGKILL one eligible running task at random times with mean
     * chaos_period_secs (exponential gaps), reproducible from the seed;
     * the next kill comes only once the previous victim runs again.
     * Chaos kills are restarted without counting against max_restarts. */
    int chaos;
    uint64_t chaos_seed;
    double chaos_period_secs; /* default (and <= 0) 10 */
    unsigned chaos_types;     /* bit (1 << keel_task_type) per eligible
                               * type; 0: chief, workers and ps */
    /* Each complete output line of a task (stream 1 stdout, 2 stderr),
     * without its newline; borrowed for the call. NULL: not relayed. */
    void (*line_fn)(void *ctx, int task, int stream, const char *line);
    void (*event_fn)(void *ctx, const keel_launch_event *ev);
    void *ctx;
    /* 1: also run one evaluator task (TF_CONFIG task type evaluator, index
     * 0; no port, not in the training cluster), started last. It is not a
     * chaos target by default. When the chief finishes, it gets grace_secs
     * to evaluate the final checkpoint and exit before its SIGTERM. Its
     * failure (after its restarts) is reported (KEEL_LAUNCH_EV_GIVE_UP,
     * state failed) but stops nothing and does not change
     * keel_launch_exit_code(). */
    int with_evaluator;
    /* The TF_CONFIG keel keys of every task: "mode" (default sync) and,
     * when > 0, "replicas_to_aggregate" (sync replicas per step; at most
     * the chief plus num_workers). `keel train` lets its config's
     * [cluster] mode override them. */
    keel_cluster_mode mode;
    int replicas_to_aggregate;
    /* A sync job whose config sets cluster.elastic: workers are added and
     * removed while it runs as in async mode (keel_launch_add_worker).
     * Default 0. */
    int elastic;
} keel_launch_config;

/* The defaults above; exe, argv, output_dir NULL, no tasks, no chaos,
 * mode sync. Cannot fail. */
void keel_launch_config_init(keel_launch_config *cfg);

/* Validate cfg (copied; argv and output_dir borrowed) and pick a free
 * 127.0.0.1 port per task. Nothing is started. KEEL_EINVAL names the bad
 * field. Caller owns *out: keel_launch_free(). */
keel_status keel_launch_new(const keel_launch_config *cfg,
                            keel_launch **out);
/* Start every task (ps first, then chief, then workers). Each child gets
 * TF_CONFIG, OUTPUT_DIR, its own process group, stdin from /dev/null and
 * PR_SET_PDEATHSIG=SIGKILL so it never outlives the launcher. */
keel_status keel_launch_start(keel_launch *l);
/* Run the supervision loop for at most timeout_ms: relay lines, reap and
 * restart tasks, chaos, stop deadlines, /proc samples. Returns early when
 * something happened. *is_done becomes 1 once every task has ended and
 * been reaped (the run is over). */
keel_status keel_launch_poll(keel_launch *l, int timeout_ms, int *is_done);
/* Stop gracefully: SIGTERM the chief, then (once it is gone) the workers,
 * then the ps, and the evaluator at once; SIGKILL what is still alive
 * grace_secs after its SIGTERM (every process group, so nothing is
 * orphaned). After the chief finished, a call stops an evaluator still
 * finishing. A second call (force) SIGKILLs everything now. Safe to call
 * any time; no restarts happen after it. Cannot fail. */
void keel_launch_stop(keel_launch *l, int force);

/* Scale a running async job (mode KEEL_CLUSTER_ASYNC). Add: start one
 * more worker with the next unused index (its TF_CONFIG lists every
 * worker so far, itself included; the ps accept it, docs/algorithms.md);
 * it is restarted on failure like any task. KEEL_ESTATE in sync mode
 * unless elastic (a sync job keeps its fixed replica count), before the
 * start or while stopping; KEEL_EINVAL past KEEL_LAUNCH_MAX_WORKERS workers. Remove:
 * SIGTERM the most recently added worker still running (it ends its step
 * and exits; never restarted); KEEL_ENOTFOUND when no added worker runs
 * (the workers the job started with are not removed). */
keel_status keel_launch_add_worker(keel_launch *l);
keel_status keel_launch_remove_worker(keel_launch *l);

size_t keel_launch_num_tasks(const keel_launch *l);
/* Snapshot of task i (0 <= i < num_tasks; ps first, chief, workers, the
 * evaluator last).
 * KEEL_EINVAL when out of range. */
keel_status keel_launch_task(const keel_launch *l, size_t i,
                             keel_launch_task_info *out);
/* The run's result once done: 0 when the chief exited 0 and no task
 * failed for good, else 1. *why (may be NULL) gets a borrowed one-line
 * reason ("chief failed 4 times; last exit status 1"). */
int keel_launch_exit_code(const keel_launch *l, const char **why);
/* Seconds since keel_launch_start(). */
double keel_launch_elapsed(const keel_launch *l);

/* Kill (SIGKILL, whole process group) and reap every task still alive,
 * then release everything. NULL is a no-op. */
void keel_launch_free(keel_launch *l);

#ifdef __cplusplus
}
#endif
#endif
