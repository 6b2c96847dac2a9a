/* security.c - CURVE for the cluster's sockets: key pair generation and
 * loading (secret files mode 0600, never logged), socket setup, and an
 * in-process ZAP handler that admits only allowed client public keys. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster_int.h"

/* ---- keys --------------------------------------------------------------- */

static int
name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 64 || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || *p == '_' || *p == '-' ||
              *p == '.'))
            return 0;
    return 1;
}

/* 40 Z85 characters that decode to 32 bytes. */
static int
z85_key_ok(const char *k)
{
    uint8_t raw[32];
    if (strlen(k) != 40)
        return 0;
    return zmq_z85_decode(raw, k) != NULL;
}

static keel_status
write_key_file(const char *path, const char *text, mode_t mode)
{
    char tmp[KEEL_PATH_MAX];
    keel_status st;
    int fd;
    if ((st = keel__fs_tmp_name(tmp, sizeof tmp, path)) != KEEL_OK)
        return st;
    unlink(tmp);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return keel__fail(KEEL_EIO, "keygen: create %s: %s", tmp,
                          strerror(errno));
    if (fchmod(fd, mode) != 0) {
        st = keel__fail(KEEL_EIO, "keygen: chmod %s: %s", tmp,
                        strerror(errno));
        goto fail;
    }
    if ((st = keel__fs_write_all(fd, text, strlen(text), tmp)) != KEEL_OK)
        goto fail;
    if (keel__fs->fsync(fd) != 0) {
        st = keel__fail(KEEL_EIO, "keygen: fsync %s: %s", tmp,
                        strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        st = keel__fail(KEEL_EIO, "keygen: close %s: %s", tmp,
                        strerror(errno));
        goto fail;
    }
    return keel__fs_commit(tmp, path);
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return st;
}

keel_status
keel_cluster_keygen(const char *dir, const char *name, char *public_out)
{
    char pub[KEEL_Z85_KEY], sec[KEEL_Z85_KEY], text[64];
    char ppath[KEEL_PATH_MAX], spath[KEEL_PATH_MAX], fname[96];
    keel_status st;

    if (dir == NULL || name == NULL || dir[0] == '\0')
        return keel__fail(KEEL_EINVAL, "keygen: directory and name needed");
    if (!name_ok(name))
        return keel__fail(KEEL_EINVAL, "keygen: key name '%.64s' must be 1-64 "
                          "characters of [A-Za-z0-9_.-]", name);
    if (!zmq_has("curve"))
        return keel__fail(KEEL_EINVAL, "keygen: this libzmq has no CURVE "
                          "support");
    snprintf(fname, sizeof fname, "%s.key", name);
    if ((st = keel__path_join(ppath, sizeof ppath, dir, fname)) != KEEL_OK)
        return st;
    snprintf(fname, sizeof fname, "%s.key_secret", name);
    if ((st = keel__path_join(spath, sizeof spath, dir, fname)) != KEEL_OK)
        return st;
    if (access(ppath, F_OK) == 0 || access(spath, F_OK) == 0)
        return keel__fail(KEEL_EINVAL, "keygen: %s.key or %s.key_secret "
                          "already exists in %s; remove them first or pick "
                          "another --name", name, name, dir);
    if ((st = keel__fs_mkdirs(dir)) != KEEL_OK)
        return keel__wrap(st, "keygen");
    if (zmq_curve_keypair(pub, sec) != 0)
        return keel__fail(KEEL_EIO, "keygen: zmq_curve_keypair: %s",
                          zmq_strerror(errno));
    /* Secret first: a public key without its secret is useless. */
    snprintf(text, sizeof text, "%s\n", sec);
    st = write_key_file(spath, text, 0600);
    explicit_bzero(text, sizeof text);
    explicit_bzero(sec, sizeof sec);
    if (st != KEEL_OK)
        return st;
    snprintf(text, sizeof text, "%s\n", pub);
    if ((st = write_key_file(ppath, text, 0644)) != KEEL_OK) {
        unlink(spath);
        return st;
    }
    if (public_out != NULL)
        memcpy(public_out, pub, KEEL_Z85_KEY);
    keel__log(KEEL_LOG_DEBUG, "keygen: wrote %s (public %s) and %s", ppath,
              pub, spath);
    return KEEL_OK;
}

/* Read a key file: 40 characters and optional trailing whitespace. */
static keel_status
read_key(const char *path, char out[KEEL_Z85_KEY], int is_secret)
{
    char *data = NULL;
    size_t n = 0;
    keel_status st = keel__fs_read_all(path, 256, &data, &n);
    if (st != KEEL_OK)
        return st;
    while (n > 0 && (data[n - 1] == '\n' || data[n - 1] == '\r' ||
                     data[n - 1] == ' '))
        data[--n] = '\0';
    if (n != 40 || !z85_key_ok(data)) {
        explicit_bzero(data, n);
        free(data);
        return keel__fail(KEEL_EINVAL, "%s is not a CURVE %s key (40 Z85 "
                          "characters; make one with 'keel keygen')", path,
                          is_secret ? "secret" : "public");
    }
    memcpy(out, data, KEEL_Z85_KEY);
    explicit_bzero(data, n);
    free(data);
    return KEEL_OK;
}

keel_status
keel__curve_read_public(const char *path, char out[KEEL_Z85_KEY])
{
    return read_key(path, out, 0);
}

keel_status
keel__curve_load(keel__curve *c, const char *dir, const char *name)
{
    char path[KEEL_PATH_MAX], fname[96], derived[KEEL_Z85_KEY];
    struct stat sb;
    keel_status st;
    if (!name_ok(name))
        return keel__fail(KEEL_EINVAL, "curve: bad key name '%.64s'", name);
    snprintf(fname, sizeof fname, "%s.key", name);
    if ((st = keel__path_join(path, sizeof path, dir, fname)) != KEEL_OK ||
        (st = read_key(path, c->public_key, 0)) != KEEL_OK)
        return st;
    snprintf(fname, sizeof fname, "%s.key_secret", name);
    if ((st = keel__path_join(path, sizeof path, dir, fname)) != KEEL_OK)
        return st;
    if (stat(path, &sb) != 0)
        return keel__fail(KEEL_ENOTFOUND, "curve: %s: %s", path,
                          strerror(errno));
    if (sb.st_mode & 077)
        return keel__fail(KEEL_EINVAL, "curve: %s is readable by group or "
                          "others (mode %03o); chmod 600 it", path,
                          (unsigned)(sb.st_mode & 0777));
    if ((st = read_key(path, c->secret_key, 1)) != KEEL_OK)
        return st;
    if (zmq_curve_public(derived, c->secret_key) != 0 ||
        strcmp(derived, c->public_key) != 0) {
        explicit_bzero(c->secret_key, sizeof c->secret_key);
        return keel__fail(KEEL_EINVAL, "curve: %s/%s.key does not match its "
                          "secret key", dir, name);
    }
    c->enabled = 1;
    return KEEL_OK;
}

keel_status
keel__curve_allow_key(keel__curve *c, const char *z85)
{
    char (*a)[KEEL_Z85_KEY];
    if (!z85_key_ok(z85))
        return keel__fail(KEEL_EINVAL, "curve: allowed key '%.48s' is not 40 "
                          "Z85 characters", z85);
    a = realloc(c->allowed, (c->n_allowed + 1) * sizeof *a);
    if (a == NULL)
        return keel__fail(KEEL_ENOMEM, "curve: allowed keys");
    c->allowed = a;
    memcpy(c->allowed[c->n_allowed++], z85, KEEL_Z85_KEY);
    return KEEL_OK;
}

keel_status
keel__curve_allow_dir(keel__curve *c, const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    keel_status st = KEEL_OK;
    if (d == NULL)
        return keel__fail(KEEL_ENOTFOUND, "curve: allowed-keys directory "
                          "%s: %s", dir, strerror(errno));
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        char path[KEEL_PATH_MAX], key[KEEL_Z85_KEY];
        if (n <= 4 || strcmp(e->d_name + n - 4, ".key") != 0)
            continue;
        if ((st = keel__path_join(path, sizeof path, dir, e->d_name)) !=
                KEEL_OK ||
            (st = read_key(path, key, 0)) != KEEL_OK ||
            (st = keel__curve_allow_key(c, key)) != KEEL_OK)
            break;
    }
    closedir(d);
    return st;
}

void
keel__curve_clear(keel__curve *c)
{
    if (c == NULL)
        return;
    free(c->allowed);
    explicit_bzero(c, sizeof *c);
}

keel_status
keel__curve_setup_server(void *sock, const keel__curve *c)
{
    int one = 1;
    if (c == NULL || !c->enabled)
        return KEEL_OK;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret_key, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "keel", 4) != 0)
        return keel__fail(KEEL_EIO, "curve server setup: %s",
                          zmq_strerror(errno));
    return KEEL_OK;
}

keel_status
keel__curve_setup_client(void *sock, const keel__curve *c)
{
    if (c == NULL || !c->enabled)
        return KEEL_OK;
    if (!z85_key_ok(c->server_key))
        return keel__fail(KEEL_EINVAL, "curve client: no valid server public "
                          "key");
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->server_key, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->public_key, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret_key, 40) != 0)
        return keel__fail(KEEL_EIO, "curve client setup: %s",
                          zmq_strerror(errno));
    return KEEL_OK;
}

/* ---- ZAP handler -------------------------------------------------------- */

struct keel__zap {
    void *zctx;
    void *rep;           /* inproc://zeromq.zap.01 */
    void *ctl_in;        /* thread side of the stop pipe */
    void *ctl_out;
    pthread_t thread;
    int started;
    char (*allowed)[KEEL_Z85_KEY];
    size_t n_allowed;
    atomic_long refused;
};

static void
zap_reply(void *rep, zmq_msg_t *version, zmq_msg_t *reqid, const char *code,
          const char *text)
{
    zmq_msg_send(version, rep, ZMQ_SNDMORE);
    zmq_msg_send(reqid, rep, ZMQ_SNDMORE);
    zmq_send(rep, code, strlen(code), ZMQ_SNDMORE);
    zmq_send(rep, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(rep, "", 0, ZMQ_SNDMORE);      /* user id */
    zmq_send(rep, "", 0, 0);                /* metadata */
}

static void
zap_handle(keel__zap *z)
{
    zmq_msg_t f[8];
    size_t n = 0;
    int more = 1, ok = 0;
    char mech[16] = "", key[KEEL_Z85_KEY] = "";
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, z->rep, 0) < 0) {
            zmq_msg_close(&tmp);
            break;
        }
        more = zmq_msg_more(&tmp);
        if (n < 8)
            f[n++] = tmp;
        else
            zmq_msg_close(&tmp);
    }
    if (n < 6) {                 /* not a ZAP request: REP needs a reply */
        for (size_t i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
        zmq_send(z->rep, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(z->rep, "", 0, ZMQ_SNDMORE);
        zmq_send(z->rep, "500", 3, ZMQ_SNDMORE);
        zmq_send(z->rep, "bad request", 11, ZMQ_SNDMORE);
        zmq_send(z->rep, "", 0, ZMQ_SNDMORE);
        zmq_send(z->rep, "", 0, 0);
        return;
    }
    if (zmq_msg_size(&f[5]) < sizeof mech)
        memcpy(mech, zmq_msg_data(&f[5]), zmq_msg_size(&f[5]));
    if (strcmp(mech, "CURVE") == 0 && n >= 7 && zmq_msg_size(&f[6]) == 32) {
        zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
        for (size_t i = 0; i < z->n_allowed && !ok; i++)
            ok = strcmp(key, z->allowed[i]) == 0;
    }
    if (ok) {
        zap_reply(z->rep, &f[0], &f[1], "200", "OK");
    } else {
        char addr[64] = "";
        size_t al = zmq_msg_size(&f[3]);
        memcpy(addr, zmq_msg_data(&f[3]), al < sizeof addr - 1 ? al
                                                               : sizeof addr - 1);
        atomic_fetch_add(&z->refused, 1);
        /* The public key is not secret; it helps find the stray client. */
        keel__log(KEEL_LOG_WARN, "cluster: refused %s client from %s%s%s",
                  mech[0] ? mech : "unknown", addr,
                  key[0] ? " with unknown public key " : "", key);
        zap_reply(z->rep, &f[0], &f[1], "400", "key not allowed");
    }
    for (size_t i = 0; i < n; i++)     /* sent ones are empty now */
        zmq_msg_close(&f[i]);
}

static void *
zap_main(void *arg)
{
    keel__zap *z = arg;
    for (;;) {
        zmq_pollitem_t items[2] = { { z->rep, 0, ZMQ_POLLIN, 0 },
                                    { z->ctl_in, 0, ZMQ_POLLIN, 0 } };
        if (zmq_poll(items, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (items[1].revents & ZMQ_POLLIN)
            break;
        if (items[0].revents & ZMQ_POLLIN)
            zap_handle(z);
    }
    return NULL;
}

keel_status
keel__zap_start(void *zctx, const keel__curve *c, keel__zap **out)
{
    keel__zap *z;
    char ctl[64];
    int zero = 0;
    *out = NULL;
    z = calloc(1, sizeof *z);
    if (z == NULL)
        return keel__fail(KEEL_ENOMEM, "zap: %zu bytes", sizeof *z);
    z->zctx = zctx;
    if (c->n_allowed > 0) {
        z->allowed = malloc(c->n_allowed * sizeof *z->allowed);
        if (z->allowed == NULL) {
            free(z);
            return keel__fail(KEEL_ENOMEM, "zap: allowed keys");
        }
        memcpy(z->allowed, c->allowed, c->n_allowed * sizeof *z->allowed);
        z->n_allowed = c->n_allowed;
    }
    snprintf(ctl, sizeof ctl, "inproc://keel-zap-ctl-%p", (void *)z);
    z->rep = zmq_socket(zctx, ZMQ_REP);
    z->ctl_in = zmq_socket(zctx, ZMQ_PAIR);
    z->ctl_out = zmq_socket(zctx, ZMQ_PAIR);
    if (z->rep == NULL || z->ctl_in == NULL || z->ctl_out == NULL)
        goto fail;
    zmq_setsockopt(z->rep, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(z->ctl_in, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(z->ctl_out, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(z->rep, "inproc://zeromq.zap.01") != 0 ||
        zmq_bind(z->ctl_in, ctl) != 0 || zmq_connect(z->ctl_out, ctl) != 0)
        goto fail;
    if (pthread_create(&z->thread, NULL, zap_main, z) != 0)
        goto fail;
    z->started = 1;
    *out = z;
    return KEEL_OK;
fail:
    {
        keel_status st = keel__fail(KEEL_EIO, "zap handler: %s",
                                    zmq_strerror(errno));
        keel__zap_stop(z);
        return st;
    }
}

void
keel__zap_stop(keel__zap *z)
{
    if (z == NULL)
        return;
    if (z->started) {
        zmq_send(z->ctl_out, "", 0, 0);
        pthread_join(z->thread, NULL);
    }
    if (z->rep)
        zmq_close(z->rep);
    if (z->ctl_in)
        zmq_close(z->ctl_in);
    if (z->ctl_out)
        zmq_close(z->ctl_out);
    free(z->allowed);
    free(z);
}
