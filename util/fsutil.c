/* fsutil.c - the one way keel writes files that must survive a crash:
 * temp file in the same directory, fsync, rename, fsync the
 * directory. Also whole-file reads with a size bound, mkdir -p and small
 * string helpers. I/O goes through keel__fs so tests can inject failures. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <keel/status.h>
#include "util.h"

static ssize_t
real_write(int fd, const void *buf, size_t n)
{
    return write(fd, buf, n);
}

const keel__fs_ops keel__fs_default = { real_write, fsync, rename };
const keel__fs_ops *keel__fs = &keel__fs_default;

void
keel__fs_set_ops(const keel__fs_ops *ops)
{
    keel__fs = ops != NULL ? ops : &keel__fs_default;
}

keel_status
keel__fmt(char *buf, size_t size, const char *what, const char *fmt, ...)
{
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= size)
        return keel__fail(KEEL_EINVAL, "%s is too long (limit %zu bytes)",
                          what, size - 1);
    return KEEL_OK;
}

keel_status
keel__path_join(char *buf, size_t size, const char *dir, const char *name)
{
    size_t n = strlen(dir);
    if (n > 0 && dir[n - 1] == '/')
        return keel__fmt(buf, size, "path", "%s%s", dir, name);
    return keel__fmt(buf, size, "path", "%s/%s", dir, name);
}

int
keel__parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    long long v;
    if (s == NULL || *s == '\0')
        return 0;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

int
keel__parse_double(const char *s, double *out)
{
    char *end;
    double v;
    if (s == NULL || *s == '\0')
        return 0;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

keel_status
keel__fs_write_all(int fd, const void *buf, size_t n, const char *path)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = keel__fs->write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return keel__fail(KEEL_EIO, "write %s: %s", path,
                              w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
    }
    return KEEL_OK;
}

keel_status
keel__fs_fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return keel__fail(KEEL_EIO, "open %s for fsync: %s", path,
                          strerror(errno));
    if (keel__fs->fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return keel__fail(KEEL_EIO, "fsync %s: %s", path, strerror(e));
    }
    close(fd);
    return KEEL_OK;
}

static void
parent_dir(char *buf, size_t size, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        snprintf(buf, size, ".");
    } else if (slash == path) {
        snprintf(buf, size, "/");
    } else {
        size_t n = (size_t)(slash - path);
        if (n >= size)
            n = size - 1;
        memcpy(buf, path, n);
        buf[n] = '\0';
    }
}

keel_status
keel__fs_fsync_parent(const char *path)
{
    char dir[KEEL_PATH_MAX];
    parent_dir(dir, sizeof dir, path);
    return keel__fs_fsync_path(dir);
}

keel_status
keel__fs_tmp_name(char *buf, size_t size, const char *path)
{
    char dir[KEEL_PATH_MAX];
    const char *slash = strrchr(path, '/');
    const char *base = slash != NULL ? slash + 1 : path;
    parent_dir(dir, sizeof dir, path);
    return keel__fmt(buf, size, "temporary path", "%s/.%s.tmp.%ld", dir,
                     base, (long)getpid());
}

keel_status
keel__fs_commit(const char *tmp, const char *path)
{
    if (keel__fs->rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return keel__fail(KEEL_EIO, "rename %s to %s: %s", tmp, path,
                          strerror(e));
    }
    return keel__fs_fsync_parent(path);
}

keel_status
keel__fs_write_atomic(const char *path, const void *data, size_t n)
{
    char tmp[KEEL_PATH_MAX];
    keel_status st;
    int fd;

    st = keel__fs_tmp_name(tmp, sizeof tmp, path);
    if (st != KEEL_OK)
        return st;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return keel__fail(KEEL_EIO, "create %s: %s", tmp, strerror(errno));
    st = keel__fs_write_all(fd, data, n, tmp);
    if (st == KEEL_OK && keel__fs->fsync(fd) != 0)
        st = keel__fail(KEEL_EIO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == KEEL_OK)
        st = keel__fail(KEEL_EIO, "close %s: %s", tmp, strerror(errno));
    if (st != KEEL_OK) {
        unlink(tmp);
        return st;
    }
    return keel__fs_commit(tmp, path);
}

keel_status
keel__fs_read_all(const char *path, size_t max_bytes, char **data, size_t *n)
{
    struct stat sb;
    char *buf;
    size_t got = 0;
    int fd;

    *data = NULL;
    *n = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return keel__fail(errno == ENOENT ? KEEL_ENOTFOUND : KEEL_EIO,
                          "open %s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return keel__fail(KEEL_EIO, "stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return keel__fail(KEEL_EINVAL, "%s is not a regular file", path);
    }
    if ((uint64_t)sb.st_size > max_bytes) {
        close(fd);
        return keel__fail(KEEL_ECORRUPT, "%s is %lld bytes, over the %zu "
                          "byte limit", path, (long long)sb.st_size,
                          max_bytes);
    }
    buf = malloc((size_t)sb.st_size + 1);
    if (buf == NULL) {
        close(fd);
        return keel__fail(KEEL_ENOMEM, "read %s: %lld bytes", path,
                          (long long)sb.st_size);
    }
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return keel__fail(KEEL_EIO, "read %s: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *data = buf;
    *n = got;
    return KEEL_OK;
}

keel_status
keel__fs_mkdirs(const char *path)
{
    char buf[KEEL_PATH_MAX];
    size_t len;
    keel_status st = keel__fmt(buf, sizeof buf, "directory path", "%s", path);
    if (st != KEEL_OK)
        return st;
    len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/')
        buf[--len] = '\0';
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return keel__fail(KEEL_EIO, "mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return keel__fail(KEEL_EIO, "mkdir %s: %s", buf, strerror(errno));
    {
        struct stat sb;
        if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return keel__fail(KEEL_EIO, "%s exists and is not a directory",
                              buf);
    }
    return KEEL_OK;
}
