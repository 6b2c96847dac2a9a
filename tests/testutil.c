/* testutil.c - helpers for keel's Check suites (see testutil.h). */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "testutil.h"

char tu_dir[4096];

#define MAX_CHILDREN 64
static pid_t children[MAX_CHILDREN];

int64_t
tu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
tu_mkdtemp(char *buf, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0')
        tmp = "/tmp";
    ck_assert_int_lt(snprintf(buf, size, "%s/keel-test-XXXXXX", tmp),
                     (int)size);
    ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp %s: %s", buf,
                  strerror(errno));
}

static int
rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    remove(path);
    return 0;
}

void
tu_rmrf(const char *path)
{
    if (path != NULL && path[0] != '\0')
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void
tu_setup(void)
{
    tu_mkdtemp(tu_dir, sizeof tu_dir);
}

void
tu_teardown(void)
{
    tu_kill_all();
    if (getenv("KEEL_KEEP_TEST_DIR") == NULL)
        tu_rmrf(tu_dir);
    tu_dir[0] = '\0';
}

static const char *
rotating(const char *a, const char *b)
{
    static char bufs[8][4096];
    static int next;
    char *buf = bufs[next++ % 8];
    int n = snprintf(buf, sizeof bufs[0], "%s/%s", a, b);
    ck_assert_msg(n >= 0 && (size_t)n < sizeof bufs[0], "path too long");
    return buf;
}

const char *
tu_path(const char *name)
{
    return rotating(tu_dir, name);
}

const char *
tu_build_path(const char *rel)
{
    const char *d = getenv("KEEL_BUILDDIR");
    return rotating(d != NULL ? d : ".", rel);
}

const char *
tu_src_path(const char *rel)
{
    const char *d = getenv("KEEL_SRCDIR");
    return rotating(d != NULL ? d : ".", rel);
}

void
tu_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "open %s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

char *
tu_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long len;
    ck_assert_msg(f != NULL, "open %s: %s", path, strerror(errno));
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    len = ftell(f);
    ck_assert_int_ge(len, 0);
    rewind(f);
    buf = malloc((size_t)len + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    buf[len] = '\0';
    if (n != NULL)
        *n = (size_t)len;
    return buf;
}

void
tu_truncate(const char *path, off_t n)
{
    ck_assert_msg(truncate(path, n) == 0, "truncate %s: %s", path,
                  strerror(errno));
}

void
tu_flip_byte(const char *path, off_t offset, unsigned char mask)
{
    int fd = open(path, O_RDWR);
    unsigned char c;
    ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
    ck_assert_int_eq(pread(fd, &c, 1, offset), 1);
    c ^= mask;
    ck_assert_int_eq(pwrite(fd, &c, 1, offset), 1);
    close(fd);
}

off_t
tu_file_size(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return -1;
    return sb.st_size;
}

static void
register_child(pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (children[i] == 0) {
            children[i] = pid;
            return;
        }
}

static void
forget_child(pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (children[i] == pid)
            children[i] = 0;
}

static void
child_env(char *const env[])
{
    for (int i = 0; env != NULL && env[i] != NULL; i++)
        putenv(env[i]);
}

/* In a forked child before exec: die with the test process. Check kills a
 * test that times out without running its teardown, and a cluster task
 * left behind would wait for its peers forever. */
static void
die_with_parent(pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
}

/* The forked child's last step: its own process group, env added, killed
 * with the test process, then argv; never returns. */
static void __attribute__((noreturn))
exec_child(char *const argv[], char *const env[], pid_t parent)
{
    setpgid(0, 0);
    child_env(env);
    die_with_parent(parent);
    execv(argv[0], argv);
    _exit(127);
}

static int
decode_status(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

pid_t
tu_spawn(char *const argv[], char *const env[], const char *log_path)
{
    pid_t parent = getpid(), pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log_path != NULL ? log_path : "/dev/null",
                      O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        exec_child(argv, env, parent);
    }
    register_child(pid);
    return pid;
}

pid_t
tu_dead_pid(void)
{
    pid_t p = fork();
    ck_assert_int_ge(p, 0);
    if (p == 0)
        _exit(0);
    ck_assert_int_eq(waitpid(p, NULL, 0), p);
    return p;
}

int
tu_wait(pid_t pid, int timeout_ms)
{
    int64_t deadline = tu_now_ms() + timeout_ms;
    int status;
    /* waitpid has no timeout: poll with short naps (the only wait here
     * without an event to block on). */
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            forget_child(pid);
            return decode_status(status);
        }
        if (r < 0 && errno != EINTR)
            return -1;
        if (tu_now_ms() >= deadline)
            return -1;
        usleep(2000);
    }
}

void
tu_kill(pid_t pid)
{
    int status;
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    forget_child(pid);
}

void
tu_kill_all(void)
{
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (children[i] > 0) {
            kill(-children[i], SIGKILL);   /* its process group too */
            tu_kill(children[i]);
        }
}

static void
drain(int fd, char *buf, size_t size, size_t *used, int *open_flag)
{
    char scratch[4096];
    ssize_t r;
    if (buf != NULL && *used + 1 < size)
        r = read(fd, buf + *used, size - 1 - *used);
    else
        r = read(fd, scratch, sizeof scratch);
    if (r <= 0) {
        if (r == 0 || (errno != EINTR && errno != EAGAIN))
            *open_flag = 0;
        return;
    }
    if (buf != NULL && *used + 1 < size) {
        *used += (size_t)r;
        buf[*used] = '\0';
    }
}

int
tu_run(char *const argv[], char *const env[], int timeout_ms, char *out,
       size_t out_size, char *err, size_t err_size)
{
    int po[2], pe[2], status, out_open = 1, err_open = 1;
    size_t out_used = 0, err_used = 0;
    int64_t deadline = tu_now_ms() + timeout_ms;
    pid_t pid, parent;

    if (out != NULL && out_size > 0)
        out[0] = '\0';
    if (err != NULL && err_size > 0)
        err[0] = '\0';
    ck_assert_int_eq(pipe(po), 0);
    ck_assert_int_eq(pipe(pe), 0);
    parent = getpid();
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]); close(po[1]); close(pe[0]); close(pe[1]);
        child_env(env);
        die_with_parent(parent);
        execv(argv[0], argv);
        _exit(127);
    }
    register_child(pid);
    close(po[1]);
    close(pe[1]);
    while (out_open || err_open) {
        struct pollfd fds[2] = { { po[0], POLLIN, 0 }, { pe[0], POLLIN, 0 } };
        int64_t left = deadline - tu_now_ms();
        if (left <= 0)
            break;
        if (!out_open)
            fds[0].fd = -1;
        if (!err_open)
            fds[1].fd = -1;
        if (poll(fds, 2, (int)left) < 0 && errno != EINTR)
            break;
        if (fds[0].revents)
            drain(po[0], out, out_size, &out_used, &out_open);
        if (fds[1].revents)
            drain(pe[0], err, err_size, &err_used, &err_open);
    }
    close(po[0]);
    close(pe[0]);
    if (out_open || err_open) {
        tu_kill(pid);
        return -1;
    }
    {
        int64_t left = deadline - tu_now_ms();
        int r = tu_wait(pid, left > 0 ? (int)left : 1);
        if (r == -1)
            tu_kill(pid);
        (void)status;
        return r;
    }
}

int
tu_keel(int timeout_ms, char *out, size_t out_size, char *err,
        size_t err_size, ...)
{
    char *argv[64];
    int n = 0;
    va_list ap;
    argv[n++] = (char *)tu_build_path("keel");
    va_start(ap, err_size);
    for (;;) {
        char *a = va_arg(ap, char *);
        if (a == NULL || n == 63)
            break;
        argv[n++] = a;
    }
    va_end(ap);
    argv[n] = NULL;
    return tu_run(argv, NULL, timeout_ms, out, out_size, err, err_size);
}

/* tu_wait_for_line's buffer: lines read from line_fd but not yet asked
 * for. A new pipe may reuse a closed one's number: tu_spawn_pipe forgets
 * what was buffered for it. */
static char line_buf[65536];
static size_t line_used;
static int line_fd = -1;

pid_t
tu_spawn_pipe(char *const argv[], char *const env[], const char *err_log,
              int *out_fd)
{
    int p[2];
    pid_t pid, parent;
    ck_assert_int_eq(pipe(p), 0);
    parent = getpid();
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = err_log != NULL && strcmp(err_log, TU_ERR_TO_PIPE) == 0
                 ? dup(p[1])
                 : open(err_log != NULL ? err_log : "/dev/null",
                        O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(p[1], 1);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
        close(p[0]);
        close(p[1]);
        exec_child(argv, env, parent);
    }
    register_child(pid);
    close(p[1]);
    if (p[0] == line_fd) {          /* a closed pipe's number, reused */
        line_fd = -1;
        line_used = 0;
    }
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    *out_fd = p[0];
    return pid;
}

pid_t
tu_spawn_train(const char *cfg, const char *const *sets, char *const env[],
               const char *log_path, int *out_fd)
{
    char *argv[32];
    int k = 0;
    argv[k++] = (char *)tu_build_path("keel");
    argv[k++] = "train";
    argv[k++] = (char *)cfg;
    for (int i = 0; sets != NULL && sets[i] != NULL; i++) {
        ck_assert_int_lt(i, 12);
        argv[k++] = "-s";
        argv[k++] = (char *)sets[i];
    }
    argv[k] = NULL;
    if (out_fd != NULL)
        return tu_spawn_pipe(argv, env, log_path, out_fd);
    return tu_spawn(argv, env, log_path);
}

int
tu_wait_for_line(int fd, const char *needle, int timeout_ms, char *line,
                 size_t line_size)
{
    int64_t deadline = tu_now_ms() + timeout_ms;
    if (line_fd != fd) {
        line_fd = fd;
        line_used = 0;
    }
    for (;;) {
        char *nl;
        /* complete lines already buffered */
        while ((nl = memchr(line_buf, '\n', line_used)) != NULL) {
            size_t len = (size_t)(nl - line_buf);
            int hit;
            *nl = '\0';
            hit = strstr(line_buf, needle) != NULL;
            if (hit && line != NULL)
                snprintf(line, line_size, "%s", line_buf);
            memmove(line_buf, nl + 1, line_used - len - 1);
            line_used -= len + 1;
            if (hit)
                return 1;
        }
        {
            struct pollfd pfd = { fd, POLLIN, 0 };
            int64_t left = deadline - tu_now_ms();
            ssize_t r;
            if (left <= 0)
                return 0;
            if (poll(&pfd, 1, (int)left) < 0 && errno != EINTR)
                return 0;
            if (line_used == sizeof line_buf - 1)
                line_used = 0;          /* an absurdly long line */
            r = read(fd, line_buf + line_used,
                     sizeof line_buf - 1 - line_used);
            if (r == 0) {
                line_fd = -1;          /* EOF: a later pipe may reuse fd */
                line_used = 0;
                return 0;
            }
            if (r > 0)
                line_used += (size_t)r;
        }
    }
}

static void
put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

void
tu_idx_images_header(unsigned char *p, uint32_t n, uint32_t rows,
                     uint32_t cols)
{
    put_be32(p, 0x00000803);
    put_be32(p + 4, n);
    put_be32(p + 8, rows);
    put_be32(p + 12, cols);
}

void
tu_idx_labels_header(unsigned char *p, uint32_t n)
{
    put_be32(p, 0x00000801);
    put_be32(p + 4, n);
}

void
tu_write_idx_dataset(const char *prefix, int n, uint32_t seed)
{
    size_t img_bytes = 16 + (size_t)n * 784, lab_bytes = 8 + (size_t)n;
    unsigned char *img = calloc(1, img_bytes), *lab = calloc(1, lab_bytes);
    char path[4096];
    uint32_t s = seed;
    ck_assert_ptr_nonnull(img);
    ck_assert_ptr_nonnull(lab);
    tu_idx_images_header(img, (uint32_t)n, 28, 28);
    tu_idx_labels_header(lab, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        int c = i % 10, r0 = 2 + (c / 5) * 12, c0 = 2 + (c % 5) * 5;
        unsigned char *x = img + 16 + (size_t)i * 784;
        for (int k = 0; k < 784; k++) {
            s = s * 1664525u + 1013904223u;
            x[k] = (unsigned char)(s >> 27);
        }
        for (int r = r0; r < r0 + 6; r++)
            for (int q = c0; q < c0 + 6 && q < 28; q++)
                x[r * 28 + q] = 230;
        lab[8 + i] = (unsigned char)c;
    }
    snprintf(path, sizeof path, "%s-images-idx3-ubyte", prefix);
    tu_write_file(path, img, img_bytes);
    snprintf(path, sizeof path, "%s-labels-idx1-ubyte", prefix);
    tu_write_file(path, lab, lab_bytes);
    free(img);
    free(lab);
}

const char *
tu_tail(const char *s, size_t n)
{
    size_t len = strlen(s);
    return len > n ? s + (len - n) : s;
}

const char *
tu_setup_job(const char *tail_fmt, ...)
{
    static char path[4200];
    char text[2048], tail[1536];
    va_list ap;
    int n;
    tu_setup();
    unsetenv("OUTPUT_DIR");
    tu_write_idx_dataset(tu_path("train"), 640, 1);
    tu_write_idx_dataset(tu_path("t10k"), 200, 2);
    va_start(ap, tail_fmt);
    n = vsnprintf(tail, sizeof tail, tail_fmt, ap);
    va_end(ap);
    ck_assert_int_lt(n, (int)sizeof tail);
    TU_SNPRINTF(text, sizeof text,
                "[model]\ntype = mlp\nhidden = 32\n"
                "[data]\ndir = %s\n"
                "[optimizer]\nname = adam\nlearning_rate = 0.01\n"
                "[train]\nbatch_size = 32\nseed = 5\n%s", tu_dir, tail);
    TU_SNPRINTF(path, sizeof path, "%s", tu_path("job.ini"));
    tu_write_file(path, text, strlen(text));
    return path;
}

int
tu_count_names(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    ck_assert_msg(d != NULL, "cannot read directory %s", dir);
    while ((de = readdir(d)) != NULL)
        if (strstr(de->d_name, needle) != NULL)
            n++;
    closedir(d);
    return n;
}

int
tu_pid_in(const char *line)
{
    int pid = 0;
    const char *p = strstr(line, "(pid ");
    ck_assert_msg(p != NULL, "no pid in '%s'", line);
    ck_assert_int_eq(sscanf(p + 5, "%d", &pid), 1);
    return pid;
}

void
tu_expect_line(int fd, const char *needle, int timeout_ms, char *line,
               size_t line_size)
{
    ck_assert_msg(tu_wait_for_line(fd, needle, timeout_ms, line, line_size),
                  "never printed '%s' (waited %d ms)", needle, timeout_ms);
}

int
tu_launch_pid(int fd, const char *verb, const char *task, int timeout_ms)
{
    char needle[128], line[512];
    TU_SNPRINTF(needle, sizeof needle, "launch | %s %s (pid ", verb, task);
    tu_expect_line(fd, needle, timeout_ms, line, sizeof line);
    return tu_pid_in(line);
}

int
tu_held_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one,
                                sizeof one), 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    return ntohs(a.sin_port);
}

TCase *
tu_tcase(Suite *s, const char *name, int timeout_s, void (*setup)(void),
         void (*teardown)(void), const TTest *const *tests)
{
    TCase *tc = tcase_create(name);
    if (setup != NULL || teardown != NULL)
        tcase_add_checked_fixture(tc, setup, teardown);
    if (timeout_s > 0)
        tcase_set_timeout(tc, timeout_s);
    for (size_t i = 0; tests != NULL && tests[i] != NULL; i++)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    return tc;
}

void
tu_log_append(void *ctx, keel_log_level level, const char *msg)
{
    tu_log *log = ctx;
    size_t n = strlen(log->text);
    (void)level;
    if (log->filter == NULL || strstr(msg, log->filter) != NULL)
        snprintf(log->text + n, sizeof log->text - n, "%s\n", msg);
}

int64_t
tu_clock_read(void *ctx)
{
    return *(const int64_t *)ctx;
}

static void *
ps_main(void *arg)
{
    tu_ps *p = arg;
    p->st = keel_ps_run(p->spec, p->vs, p->opts);
    return NULL;
}

void
tu_ps_start(tu_ps *p, const keel_cluster_spec *spec, const keel_vars *vs,
            const keel_cluster_config *opts)
{
    p->spec = spec;
    p->vs = vs;
    p->opts = opts;
    p->st = KEEL_EINTERNAL;
    ck_assert_int_eq(pthread_create(&p->thread, NULL, ps_main, p), 0);
}

keel_status
tu_ps_join(tu_ps *p)
{
    pthread_join(p->thread, NULL);
    return p->st;
}

keel_cluster_spec *
tu_spec_from_lists(const char *ps, const char *workers, const char *chief,
                   keel_task_type type, int index)
{
    const struct { keel_task_type type; const char *list; } jobs[] = {
        { KEEL_TASK_PS, ps }, { KEEL_TASK_WORKER, workers },
        { KEEL_TASK_CHIEF, chief },
    };
    keel_cluster_spec *s;
    ck_assert_int_eq(keel_cluster_spec_new(&s), KEEL_OK);
    for (size_t i = 0; i < sizeof jobs / sizeof *jobs; i++)
        if (jobs[i].list != NULL)
            ck_assert_msg(keel_cluster_spec_add_list(s, jobs[i].type,
                                                     jobs[i].list) == KEEL_OK,
                          "%s: %s", jobs[i].list, keel_last_error());
    ck_assert_int_eq(keel_cluster_spec_set_task(s, type, index), KEEL_OK);
    return s;
}

/* The validated spec of a cluster of one ps, the chief and, when
 * worker_port > 0, one worker at those ports, as task (type, 0). */
static keel_cluster_spec *
loopback_spec(int ps_port, int chief_port, int worker_port,
              keel_task_type type)
{
    char ps[32], chief[32], worker[32];
    keel_cluster_spec *spec;
    TU_SNPRINTF(ps, sizeof ps, "127.0.0.1:%d", ps_port);
    TU_SNPRINTF(chief, sizeof chief, "127.0.0.1:%d", chief_port);
    TU_SNPRINTF(worker, sizeof worker, "127.0.0.1:%d", worker_port);
    spec = tu_spec_from_lists(ps, worker_port > 0 ? worker : NULL, chief,
                              type, 0);
    ck_assert_int_eq(keel_cluster_spec_validate(spec), KEEL_OK);
    return spec;
}

void
tu_cluster_new(tu_cluster *c, int with_worker)
{
    int ps = tu_held_port(), chief = tu_held_port();
    int worker = with_worker ? tu_held_port() : 0;
    c->ps = loopback_spec(ps, chief, worker, KEEL_TASK_PS);
    c->chief = loopback_spec(ps, chief, worker, KEEL_TASK_CHIEF);
    c->worker = with_worker ? loopback_spec(ps, chief, worker,
                                            KEEL_TASK_WORKER) : NULL;
}

void
tu_cluster_free(tu_cluster *c)
{
    keel_cluster_spec_free(c->ps);
    keel_cluster_spec_free(c->chief);
    keel_cluster_spec_free(c->worker);
}

double
tu_json_number(const char *json, const char *key)
{
    char field[128];
    const char *p;
    double x = 0;
    TU_SNPRINTF(field, sizeof field, "\"%s\": ", key);
    p = strstr(json, field);
    ck_assert_msg(p != NULL, "no %s in %s", field, tu_tail(json, 2000));
    ck_assert_msg(sscanf(p + strlen(field), "%lf", &x) == 1,
                  "%s is no number in %s", field, tu_tail(json, 2000));
    return x;
}

void
tu_assert_zeroed_refused(const tu_zeroed_case *cases, size_t n)
{
    char want[160];
    for (size_t i = 0; i < n; i++) {
        keel_status st = cases[i].call();
        ck_assert_msg(st == KEEL_EINVAL, "case %zu (%s): %s, not "
                      "KEEL_EINVAL", i, cases[i].type, keel_status_name(st));
        TU_SNPRINTF(want, sizeof want, "%s has struct_size 0: fill it with "
                 "%s_init()", cases[i].type, cases[i].type);
        ck_assert_msg(strstr(keel_last_error(), want) != NULL,
                      "case %zu: '%s' lacks '%s'", i, keel_last_error(),
                      want);
    }
}
