/* fuzz_util.c - scratch directory and file writes for the harnesses. */
#include <config.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keel/log.h>
#include "fuzz_util.h"

static char dir[256];

static void
remove_dir(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

const char *
fuzz_dir(void)
{
    if (dir[0] == '\0') {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/keel-fuzz-XXXXXX",
                 t != NULL && t[0] != '\0' ? t : "/tmp");
        if (mkdtemp(dir) == NULL)
            abort();
        atexit(remove_dir);
    }
    return dir;
}

const char *
fuzz_write(int slot, const char *name, const void *data, size_t size)
{
    static char paths[4][512];
    char *p = paths[slot & 3];
    const char *b = data;
    int fd;
    snprintf(p, 512, "%s/%s", fuzz_dir(), name);
    fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        abort();
    while (size > 0) {
        ssize_t w = write(fd, b, size);
        if (w <= 0)
            abort();
        b += w;
        size -= (size_t)w;
    }
    if (close(fd) != 0)
        abort();
    return p;
}

char *
fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s == NULL)
        abort();
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* keel logs through a handler; the harnesses drop everything so a run's
 * output is libFuzzer's own. */
static void
drop_log(void *ctx, keel_log_level level, const char *msg)
{
    (void)ctx;
    (void)level;
    (void)msg;
}

__attribute__((constructor)) static void
quiet_logs(void)
{
    keel_log_set_handler(drop_log, NULL, KEEL_LOG_ERROR);
}
