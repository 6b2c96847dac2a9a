/* testutil.h - shared helpers for keel's Check suites: temp directories,
 * running the keel binary and child processes with deadlines, files. Tests
 * never write into the source tree: everything goes under tu_dir. */
#ifndef KEEL_TESTUTIL_H
#define KEEL_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <pthread.h>
#include <check.h>
#include <keel/distributed.h>
#include <keel/log.h>

/* A fresh mkdtemp directory made by tu_setup(), removed by tu_teardown(). */
extern char tu_dir[4096];
void tu_setup(void);
void tu_teardown(void);

/* Make a fresh temp directory into buf (size >= 64); aborts the test on
 * failure. */
void tu_mkdtemp(char *buf, size_t size);
/* rm -rf path (only paths under the temp directory are ever passed). */
void tu_rmrf(const char *path);

/* "<tu_dir>/<name>" in a static rotating buffer (8 slots). */
const char *tu_path(const char *name);
/* $KEEL_BUILDDIR/<rel> ("keel" for the CLI); $KEEL_SRCDIR/<rel>. */
const char *tu_build_path(const char *rel);
const char *tu_src_path(const char *rel);

/* Write / read whole files; abort the test on failure. tu_read returns a
 * malloc'd NUL-terminated buffer (caller frees) and sets *n if not NULL. */
void tu_write_file(const char *path, const void *data, size_t n);
char *tu_read_file(const char *path, size_t *n);
/* Truncate a file to n bytes; flip one byte at offset (xor mask). */
void tu_truncate(const char *path, off_t n);
void tu_flip_byte(const char *path, off_t offset, unsigned char mask);
off_t tu_file_size(const char *path);
/* The number of entries of directory dir whose names contain needle;
 * fails the test when dir cannot be read. */
int tu_count_names(const char *dir, const char *needle);

/* Run argv (argv[0] a path) to completion within timeout_ms, capturing
 * stdout and stderr (each truncated to its buffer, NUL-terminated; either
 * buffer may be NULL). env (may be NULL) is a NULL-terminated list of
 * "K=V" added to the environment. Returns the exit status (0..255), 128+sig
 * when killed by a signal, or -1 on timeout (the child is killed). */
int tu_run(char *const argv[], char *const env[], int timeout_ms,
           char *out, size_t out_size, char *err, size_t err_size);
/* The same for the keel CLI: tu_keel(timeout, out, n, err, n, "ckpt", ...,
 * NULL). */
int tu_keel(int timeout_ms, char *out, size_t out_size, char *err,
            size_t err_size, ...);
/* tu_keel(timeout_ms, out, sizeof out, err, sizeof err, ..., NULL): the
 * arrays named out and err in the caller's scope capture the output. */
#define TU_KEEL(timeout_ms, ...)                                          \
    tu_keel(timeout_ms, out, sizeof out, err, sizeof err, __VA_ARGS__, NULL)

/* Start a child (stdout+stderr to log_path, or /dev/null if NULL); it is
 * registered and killed + reaped by tu_teardown() whatever happens. */
pid_t tu_spawn(char *const argv[], char *const env[], const char *log_path);
/* Start a registered child whose stdout is a pipe (*out_fd, the read end,
 * non-blocking; caller closes it) and whose stderr goes to err_log (or
 * /dev/null; TU_ERR_TO_PIPE: into the same pipe). */
#define TU_ERR_TO_PIPE "|"
pid_t tu_spawn_pipe(char *const argv[], char *const env[],
                    const char *err_log, int *out_fd);
/* Start `keel train cfg [-s <set>]...` (sets NULL-terminated or NULL; at
 * most 12) as a registered child with env added (NULL: none): stdout and
 * stderr to log_path (tu_spawn), or, with out_fd, stdout on a pipe and
 * stderr to log_path (tu_spawn_pipe). */
pid_t tu_spawn_train(const char *cfg, const char *const *sets,
                     char *const env[], const char *log_path, int *out_fd);
/* Read fd until a line containing needle arrives (1), or EOF / the
 * deadline (0). The line (truncated) is copied into line if not NULL. */
int tu_wait_for_line(int fd, const char *needle, int timeout_ms, char *line,
                     size_t line_size);
/* tu_wait_for_line that fails the test when no such line comes. */
void tu_expect_line(int fd, const char *needle, int timeout_ms, char *line,
                    size_t line_size);

/* The pid in a keel launch line "launch | started|restarted <task> (pid
 * N) ..."; fails the test when the line has none. */
int tu_pid_in(const char *line);

/* Read keel launch's output on fd up to its line "launch | <verb> <task>
 * (pid N" (verb "started" or "restarted"; task "chief", "ps.0", ...)
 * within timeout_ms; fails the test when none comes. Returns N. */
int tu_launch_pid(int fd, const char *verb, const char *task,
                  int timeout_ms);

/* Wait for pid up to timeout_ms. Returns the exit status (0..255), 128+sig
 * when killed by a signal, or -1 on timeout (the child keeps running). */
int tu_wait(pid_t pid, int timeout_ms);
/* A pid that is certainly gone: a child that exited at once, reaped. Fork
 * it before allocating, so the child leaves valgrind nothing to report. */
pid_t tu_dead_pid(void);
/* SIGKILL and reap one registered child. */
void tu_kill(pid_t pid);
/* Kill and reap every registered child. */
void tu_kill_all(void);

/* The header of an IDX file (MNIST's format) at p: of n uint8 images of
 * rows x cols (16 bytes), of n uint8 labels (8 bytes). */
void tu_idx_images_header(unsigned char *p, uint32_t n, uint32_t rows,
                          uint32_t cols);
void tu_idx_labels_header(unsigned char *p, uint32_t n);

/* A synthetic MNIST-format (IDX) dataset: <prefix>-images-idx3-ubyte and
 * <prefix>-labels-idx1-ubyte with n 28x28 examples; class c (i % 10) is a
 * bright 6x6 patch at a class-specific place over deterministic noise, so
 * a small model learns it in a few dozen steps. */
void tu_write_idx_dataset(const char *prefix, int n, uint32_t seed);

/* snprintf into buf of size bytes; fails the test when the text does not
 * fit. */
#define TU_SNPRINTF(buf, size, ...)                                       \
    ck_assert_int_lt(snprintf(buf, size, __VA_ARGS__), (int)(size))

/* The integration tests' job: tu_setup(), OUTPUT_DIR unset, synthetic
 * datasets <tu_dir>/train (640 examples) and <tu_dir>/t10k (200), and
 * <tu_dir>/job.ini: an MLP (hidden 32) trained with Adam (0.01), batch
 * 32, seed 5, on them. The file ends inside [train]; tail_fmt (printf,
 * %s and the like filled from the arguments) follows: the rest of [train]
 * and the other sections. Returns the file's path (static storage, valid
 * until the next call). */
const char *tu_setup_job(const char *tail_fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* The number after the first "key": in json (keel's --json output: one
 * space after the colon); fails the test when there is none. */
double tu_json_number(const char *json, const char *key);

/* The last n bytes of s (all of s when shorter): for assertion messages,
 * which Check cuts off (with no message at all) past about 4 KiB. */
const char *tu_tail(const char *s, size_t n);

/* Monotonic milliseconds. */
int64_t tu_now_ms(void);

/* A log capture: keel_log_set_handler(tu_log_append, &log, level) appends
 * every message that contains log.filter (NULL: every message) and a
 * newline to log.text, truncated at its end. */
typedef struct tu_log {
    char text[16384];
    const char *filter;
} tu_log;
void tu_log_append(void *ctx, keel_log_level level, const char *msg);

/* keel_ps_run on a thread of this process: tu_ps_start runs it on spec,
 * vars and opts (borrowed until tu_ps_join); tu_ps_join waits for it to
 * end and returns its status. */
typedef struct tu_ps {
    const keel_cluster_spec *spec;
    const keel_vars *vs;
    const keel_cluster_config *opts;
    keel_status st;
    pthread_t thread;
} tu_ps;
void tu_ps_start(tu_ps *p, const keel_cluster_spec *spec,
                 const keel_vars *vs, const keel_cluster_config *opts);
keel_status tu_ps_join(tu_ps *p);

/* A spec from explicit lists, as a [cluster] section gives them: the ps,
 * worker and chief lists (NULL: none) and this task (type, index); fails
 * the test on any error. Not validated. */
keel_cluster_spec *tu_spec_from_lists(const char *ps, const char *workers,
                                      const char *chief, keel_task_type type,
                                      int index);

/* One cluster on 127.0.0.1, on ports from tu_held_port(): one ps, the
 * chief and, when with_worker, one worker. Each member is the validated
 * spec as seen by that task (index 0); worker is NULL without one.
 * tu_cluster_new fails the test on any error; tu_cluster_free frees every
 * spec. */
typedef struct tu_cluster {
    keel_cluster_spec *ps, *chief, *worker;
} tu_cluster;
void tu_cluster_new(tu_cluster *c, int with_worker);
void tu_cluster_free(tu_cluster *c);

/* A keel_clock function that reads the int64_t its ctx points to: a clock
 * the test sets by hand ({ tu_clock_read, &now_ns }). */
int64_t tu_clock_read(void *ctx);

/* A test case added to suite s: the fixture setup/teardown (both NULL for
 * none) around each test, timeout_s seconds per test (0: Check's default),
 * then tests (NULL-terminated, TU_TESTS(...); NULL adds none) in order.
 * Returns the case, for tests added another way (tcase_add_loop_test). */
TCase *tu_tcase(Suite *s, const char *name, int timeout_s,
                void (*setup)(void), void (*teardown)(void),
                const TTest *const *tests);
#define TU_TESTS(...) ((const TTest *const[]){ __VA_ARGS__, NULL })

/* main() for a test program: runs the suite and exits 0 only when every
 * test passed. */
#define KEEL_TEST_MAIN(suite_fn)                                          \
    int main(void)                                                        \
    {                                                                     \
        SRunner *sr = srunner_create(suite_fn());                         \
        int failed;                                                       \
        srunner_run_all(sr, CK_NORMAL);                                   \
        failed = srunner_ntests_failed(sr);                               \
        srunner_free(sr);                                                 \
        return failed == 0 ? 0 : 1;                                       \
    }

/* A loopback port handed to a ps or task without a race: our socket stays
 * bound to it (SO_REUSEADDR, never listening) until this test process
 * ends, so the kernel gives it to no other bind(port 0) or connect while
 * the task starts or restarts, and the task's listener (zmq sets
 * SO_REUSEADDR) binds it beside ours. */
int tu_held_port(void);

/* A config struct made without its init function: call passes one of
 * type `type` with struct_size 0 to the function that takes it. */
typedef struct tu_zeroed_case {
    const char *type;
    keel_status (*call)(void);
} tu_zeroed_case;
/* Every case must fail with KEEL_EINVAL and a message naming the struct
 * and its init function ("<type> has struct_size 0: fill it with
 * <type>_init()"). */
void tu_assert_zeroed_refused(const tu_zeroed_case *cases, size_t n);

#endif
