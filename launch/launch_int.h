/* launch_int.h - private to launch/launch*.c: the launcher's state (one
 * struct keel_launch with its tasks) and the helpers its files share.
 * launch.c builds, starts and polls; launch_chaos.c the seeded kills;
 * launch_stop.c handles exits, restarts and the ordered stop;
 * launch_task.c spawns a task's process and relays its output;
 * launch_status.c events, notes, /proc samples and snapshots. Each file
 * uses only the files after it in this list. */
#ifndef KEEL_LAUNCH_INT_H
#define KEEL_LAUNCH_INT_H

#include <stddef.h>
#include <stdint.h>
#include <keel/launch.h>

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
    int chaos_wants_step;          /* chaos killed it after it printed a
                                    * step line on stdout: back when it
                                    * prints another */
    int kill_sent;                 /* stop deadline passed: SIGKILL sent */
    int is_term_held;              /* stopping: SIGTERM waits until it is up */
    int64_t restart_at_ns;
    int64_t term_sent_ns;
    int64_t died_ns;               /* for the "back" event */
    int wants_back_event;
    int had_step;                  /* printed a step line since its start */
    int had_out_step;              /* ... on stdout (what "back" counts) */
    char last_error[256];          /* its last "keel: ..." stderr line
                                    * (why it failed, for the report) */
    int64_t started_ns;
    int64_t chief_step_at_start;   /* the cluster's step when it started */
    int backoff_level;             /* failures in a row before progress */
    uint64_t last_ticks;
    int64_t last_sample_ns;
    int64_t term_due_ns;           /* evaluator after the chief finished:
                                    * SIGTERM at this time; 0 none */
    int is_added;                  /* keel_launch_add_worker's */
    int is_removed;                /* keel_launch_remove_worker: its end
                                    * is final, never restarted */
} task;

struct keel_launch {
    keel_launch_config cfg;
    char *output_dir;
    char *output_env;              /* "OUTPUT_DIR=..." */
    char token_env[96];            /* "KEEL_CLUSTER_TOKEN=<64 hex>", made
                                    * here when the environment has none;
                                    * "" to pass the caller's */
    task *tasks;
    size_t n;
    int *port_holds;               /* per task: a socket bound to its port
                                    * (SO_REUSEADDR, never listening) for
                                    * the launch's life, so no other
                                    * process is given the port while the
                                    * task starts or restarts; -1 none */
    size_t chief;
    int is_started;
    int64_t t0_ns;
    int is_stopping;
    int stop_phase;                /* task ranks told: 0..3 (chief,
                                    * workers, ps; the evaluator has no
                                    * rank) */
    int chief_done;
    int64_t stop_began_ns;         /* when the stop began (the evaluator's
                                    * grace is counted from it) */
    int failed_task;               /* gave up; -1 none (never the
                                    * evaluator) */
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

/* launch_status.c */
double keel__launch_since_start(const keel_launch *l, int64_t now);
void keel__launch_emit(keel_launch *l, keel_launch_event_kind kind, int ti,
                       int pid, int status, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
const char *keel__launch_describe_status(int status, char *buf, size_t size);
void keel__launch_log_note(task *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void keel__launch_sample_proc(keel_launch *l, task *t, int64_t now);

/* launch_task.c */
/* Read what is there of task i's stream (0 stdout, 1 stderr), relaying
 * each whole line; returns 0 at EOF or error (fd closed), else 1. */
int keel__launch_read_stream(keel_launch *l, size_t i, int stream);
/* (Re)start task i ("started", "restarted"): spawn, log, event. */
keel_status keel__launch_start_task(keel_launch *l, size_t i,
                                    const char *why);
/* Open t's log, OUTPUT_DIR/logs/<name>.log (appended to), into log_fd. */
keel_status keel__launch_open_log(keel_launch *l, task *t);

/* launch_stop.c */
void keel__launch_close_task_fds(task *t);
void keel__launch_reap(keel_launch *l, int64_t now);
void keel__launch_signal_task(task *t, int sig);
void keel__launch_begin_stop(keel_launch *l, const char *reason);
void keel__launch_advance_stop(keel_launch *l, int64_t now);
/* The evaluator's SIGTERM once its term_due_ns has come. */
void keel__launch_term_due(keel_launch *l, int64_t now);
/* Send the SIGTERMs held back from a restarted chief once it is up (or its
 * grace period is over); the deadline that wakes the loop for it. */
void keel__launch_release_held(keel_launch *l, int64_t now);
int64_t keel__launch_held_deadline(const keel_launch *l, const task *t);

/* launch_chaos.c */
int64_t keel__launch_chaos_gap_ns(keel_launch *l);
void keel__launch_chaos_tick(keel_launch *l, int64_t now);

#endif
