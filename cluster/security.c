/* security.c - authentication of the cluster's sockets: CURVE key pairs
 * (generation and loading; secret files mode 0600, never logged), the job
 * token's per-task passwords (ZAP PLAIN), socket setup, and an in-process
 * ZAP handler that admits only the job's tasks and names each one. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "cluster_int.h"

/* ---- task names --------------------------------------------------------- */

void
keel__task_name(keel_task_type t, int index, char *buf, size_t size)
{
    snprintf(buf, size, "%s%d", keel_task_type_name(t), index);
}

int
keel__task_parse(const char *name, keel_task_type *t, int *index)
{
    for (int k = KEEL_TASK_CHIEF; k < KEEL_TASK_TYPE_COUNT; k++) {
        const char *tn = keel_task_type_name((keel_task_type)k);
        size_t n = strlen(tn);
        int64_t v;
        if (strncmp(name, tn, n) != 0 || name[n] < '0' || name[n] > '9' ||
            (name[n] == '0' && name[n + 1] != '\0') ||
            !keel__parse_i64(name + n, 0, KEEL__MAX_TASKS_PER_JOB - 1, &v))
            continue;
        *t = (keel_task_type)k;
        *index = (int)v;
        return 1;
    }
    return 0;
}

/* ---- the job token ------------------------------------------------------ */

/* hex(HMAC-SHA256(key, "keel-task:" task)) into out[65]. */
static void
task_password(const unsigned char key[32], const char *task, char out[65])
{
    unsigned char mac[crypto_auth_hmacsha256_BYTES];
    char msg[KEEL__TASK_NAME_MAX + 16];
    int n = snprintf(msg, sizeof msg, "keel-task:%s", task);
    crypto_auth_hmacsha256((unsigned char *)mac, (const unsigned char *)msg,
                           (unsigned long long)n, key);
    sodium_bin2hex(out, 65, mac, sizeof mac);
    sodium_memzero(mac, sizeof mac);
}

keel_status
keel__auth_token(keel__curve *c, const char *token, keel_task_type type,
                 int index)
{
    if (token == NULL || strlen(token) < KEEL__TOKEN_MIN)
        return keel__fail(KEEL_EINVAL, "the cluster token (KEEL_CLUSTER_"
                          "TOKEN) must have at least %d characters; make one "
                          "with: head -c 32 /dev/urandom | xxd -p -c 64",
                          KEEL__TOKEN_MIN);
    if (sodium_init() < 0)
        return keel__fail(KEEL_EINTERNAL, "libsodium failed to initialize");
    crypto_hash_sha256(c->token_key, (const unsigned char *)token,
                       strlen(token));
    keel__task_name(type, index, c->user, sizeof c->user);
    task_password(c->token_key, c->user, c->password);
    c->plain = 1;
    return KEEL_OK;
}

int
keel__auth_on(const keel__curve *c)
{
    return c != NULL && (c->enabled || c->plain);
}

/* ---- what was logged ---------------------------------------------------- */

int
keel__once_add(keel__once *o, const char *a, const char *b, long c)
{
    uint64_t h = 1469598103934665603ull;        /* FNV-1a */
    const char *parts[2] = { a ? a : "", b ? b : "" };
    for (int k = 0; k < 2; k++) {
        for (const char *p = parts[k]; *p; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull;
    }
    h = (h ^ (uint64_t)c) * 1099511628211ull;
    for (unsigned i = 0; i < o->n; i++)
        if (o->h[i] == h)
            return 0;
    o->h[o->next] = h;
    o->next = (o->next + 1) % 256;
    if (o->n < 256)
        o->n++;
    return 1;
}

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
keel__curve_allow_key(keel__curve *c, const char *z85, const char *task)
{
    char (*a)[KEEL_Z85_KEY];
    char (*t)[KEEL__TASK_NAME_MAX];
    if (!z85_key_ok(z85))
        return keel__fail(KEEL_EINVAL, "curve: allowed key '%.48s' is not 40 "
                          "Z85 characters", z85);
    a = realloc(c->allowed, (c->n_allowed + 1) * sizeof *a);
    if (a == NULL)
        return keel__fail(KEEL_ENOMEM, "curve: allowed keys");
    c->allowed = a;
    t = realloc(c->allowed_task, (c->n_allowed + 1) * sizeof *t);
    if (t == NULL)
        return keel__fail(KEEL_ENOMEM, "curve: allowed keys");
    c->allowed_task = t;
    memcpy(c->allowed[c->n_allowed], z85, KEEL_Z85_KEY);
    snprintf(c->allowed_task[c->n_allowed], KEEL__TASK_NAME_MAX, "%s",
             task != NULL ? task : "");
    c->n_allowed++;
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
        char task[KEEL__TASK_NAME_MAX] = "";
        keel_task_type tt;
        int ti;
        if (n <= 4 || strcmp(e->d_name + n - 4, ".key") != 0)
            continue;
        if (n - 4 < sizeof task) {
            memcpy(task, e->d_name, n - 4);
            task[n - 4] = '\0';
        }
        if (!keel__task_parse(task, &tt, &ti)) {
            keel__log(KEEL_LOG_WARN, "curve: %s/%s does not name a task "
                      "(<type><index>.key, e.g. worker1.key): its key may "
                      "connect but acts as no task", dir, e->d_name);
            task[0] = '\0';
        }
        if ((st = keel__path_join(path, sizeof path, dir, e->d_name)) !=
                KEEL_OK ||
            (st = read_key(path, key, 0)) != KEEL_OK ||
            (st = keel__curve_allow_key(c, key, task)) != KEEL_OK)
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
    free(c->allowed_task);
    explicit_bzero(c, sizeof *c);
}

keel_status
keel__curve_setup_server(void *sock, const keel__curve *c)
{
    int one = 1;
    if (c == NULL || !keel__auth_on(c)) {
        /* No authentication: a ZAP domain without a handler in the context
         * lets every ZMTP 3 peer in (the domain is not enforced) and makes
         * libzmq refuse the ZMTP 1.0 / 2.0 greetings that bytes of garbage
         * look like; libzmq 4.3 aborts the process when such a legacy
         * handshake completes while the socket is being closed. (libzmq
         * enforces a domain only with the draft ZMQ_ZAP_ENFORCE_DOMAIN.) */
        if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "keel", 4) != 0)
            return keel__fail(KEEL_EIO, "zap domain: %s",
                              zmq_strerror(errno));
        return KEEL_OK;
    }
    if (c->enabled
            ? zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
              zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret_key, 40) !=
                  0
            : zmq_setsockopt(sock, ZMQ_PLAIN_SERVER, &one, sizeof one) != 0)
        return keel__fail(KEEL_EIO, "%s server setup: %s",
                          c->enabled ? "curve" : "token",
                          zmq_strerror(errno));
    if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "keel", 4) != 0)
        return keel__fail(KEEL_EIO, "zap domain: %s", zmq_strerror(errno));
    return KEEL_OK;
}

keel_status
keel__curve_setup_client(void *sock, const keel__curve *c)
{
    if (c == NULL || !keel__auth_on(c))
        return KEEL_OK;
    if (!c->enabled) {
        if (zmq_setsockopt(sock, ZMQ_PLAIN_USERNAME, c->user,
                           strlen(c->user)) != 0 ||
            zmq_setsockopt(sock, ZMQ_PLAIN_PASSWORD, c->password,
                           strlen(c->password)) != 0)
            return keel__fail(KEEL_EIO, "token client setup: %s",
                              zmq_strerror(errno));
        return KEEL_OK;
    }
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
    void *rep;           /* inproc://zeromq.zap.01; closed by the thread */
    pthread_t thread;
    int started;
    char (*allowed)[KEEL_Z85_KEY];
    char (*allowed_task)[KEEL__TASK_NAME_MAX];
    size_t n_allowed;
    int plain;
    unsigned char token_key[32];
    keel__log_limit logged;  /* refused connections' log lines */
    atomic_long refused;
};

static void
zap_reply(void *rep, zmq_msg_t *version, zmq_msg_t *reqid, const char *code,
          const char *text, const char *user)
{
    zmq_msg_send(version, rep, ZMQ_SNDMORE);
    zmq_msg_send(reqid, rep, ZMQ_SNDMORE);
    zmq_send(rep, code, strlen(code), ZMQ_SNDMORE);
    zmq_send(rep, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(rep, user, strlen(user), ZMQ_SNDMORE);  /* the User-Id */
    zmq_send(rep, "", 0, 0);                         /* metadata */
}

/* A frame as a NUL-terminated string (cut to size - 1). */
static void
frame_str(zmq_msg_t *f, char *buf, size_t size)
{
    size_t n = zmq_msg_size(f);
    if (n > size - 1)
        n = size - 1;
    memcpy(buf, zmq_msg_data(f), n);
    buf[n] = '\0';
}

/* Receive one request's frames: the first 8 into f, the rest received and
 * dropped; the number kept returned. */
static size_t
zap_recv(keel__zap *z, zmq_msg_t f[8])
{
    size_t n = 0;
    int more = 1;
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
    return n;
}

/* Not a ZAP request: REP still needs a reply. */
static void
zap_reply_bad_request(void *rep)
{
    zmq_send(rep, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(rep, "", 0, ZMQ_SNDMORE);
    zmq_send(rep, "500", 3, ZMQ_SNDMORE);
    zmq_send(rep, "bad request", 11, ZMQ_SNDMORE);
    zmq_send(rep, "", 0, ZMQ_SNDMORE);
    zmq_send(rep, "", 0, 0);
}

/* The task whose allowed key is the 32-byte public key in kf (its Z85 text
 * into key), or NULL with *why saying why not. */
static const char *
zap_curve_task(const keel__zap *z, zmq_msg_t *kf, char key[KEEL_Z85_KEY],
               const char **why)
{
    const char *task = NULL;
    zmq_z85_encode(key, zmq_msg_data(kf), 32);
    for (size_t i = 0; i < z->n_allowed && task == NULL; i++)
        if (strcmp(key, z->allowed[i]) == 0) {
            task = z->allowed_task[i];
            *why = "its key names no task (<type><index>.key)";
        }
    if (task != NULL && task[0] == '\0')
        task = NULL;
    else if (task == NULL)
        *why = "unknown public key";
    return task;
}

/* user (the frame uf, into user) when it names a task and the password
 * frame pf is that task's token, else NULL with *why saying why not. */
static const char *
zap_plain_task(const keel__zap *z, zmq_msg_t *uf, zmq_msg_t *pf,
               char user[KEEL__TASK_NAME_MAX], const char **why)
{
    const char *task = NULL;
    char pass[80], want[65];
    keel_task_type tt;
    int ti;
    frame_str(uf, user, KEEL__TASK_NAME_MAX);
    frame_str(pf, pass, sizeof pass);
    *why = "wrong token";
    if (keel__task_parse(user, &tt, &ti) && zmq_msg_size(uf) <
            KEEL__TASK_NAME_MAX && strlen(pass) == 64) {
        task_password(z->token_key, user, want);
        if (sodium_memcmp(want, pass, 64) == 0)
            task = user;
        sodium_memzero(want, sizeof want);
    } else if (!keel__task_parse(user, &tt, &ti)) {
        *why = "user is not a task name";
    }
    sodium_memzero(pass, sizeof pass);
    return task;
}

/* Count and answer a refused request. Logged rate-limited (the first at
 * once, then one line per interval with the count between): a refused
 * client reconnects every few ms, and a flood of new addresses or names
 * must not flood the log. The mechanism, address and user name come from
 * the peer: escaped. The public key is not secret; it helps find the stray
 * client. Passwords are never logged. */
static void
zap_refuse(keel__zap *z, zmq_msg_t f[8], const char *mech, const char *key,
           const char *user, const char *why)
{
    char addr[64], e_addr[256], e_user[4 * KEEL__TASK_NAME_MAX];
    char e_mech[80];
    long held = 0;
    frame_str(&f[3], addr, sizeof addr);
    atomic_fetch_add(&z->refused, 1);
    if (keel__log_limit_take(&z->logged, keel__now_mono_ns(), &held))
        keel__log(KEEL_LOG_WARN, "cluster: refused %s client from %s%s%s"
                  "%s%s: %s (%ld more refused since the last such line; "
                  "at most one line per %d s)",
                  mech[0] ? keel__log_escape(e_mech, sizeof e_mech, mech)
                          : "unknown",
                  keel__log_escape(e_addr, sizeof e_addr, addr),
                  key[0] ? " with public key " : "", key,
                  user[0] ? " as " : "",
                  keel__log_escape(e_user, sizeof e_user, user), why, held,
                  (int)(KEEL__LOG_LIMIT_NS / 1000000000));
    zap_reply(z->rep, &f[0], &f[1], "400", "not allowed", "");
}

static void
zap_handle(keel__zap *z)
{
    zmq_msg_t f[8];
    size_t n = zap_recv(z, f);
    const char *task = NULL;
    char mech[16] = "", key[KEEL_Z85_KEY] = "", user[KEEL__TASK_NAME_MAX] = "";
    const char *why = "not a task of this job";
    if (n < 6) {
        for (size_t i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
        zap_reply_bad_request(z->rep);
        return;
    }
    frame_str(&f[5], mech, sizeof mech);
    if (strcmp(mech, "CURVE") == 0 && n >= 7 && zmq_msg_size(&f[6]) == 32)
        task = zap_curve_task(z, &f[6], key, &why);
    else if (strcmp(mech, "PLAIN") == 0 && z->plain && n >= 8)
        task = zap_plain_task(z, &f[6], &f[7], user, &why);
    else
        why = z->plain ? "no token (PLAIN) credentials"
                       : "no CURVE credentials";
    if (task != NULL)
        zap_reply(z->rep, &f[0], &f[1], "200", "OK", task);
    else
        zap_refuse(z, f, mech, key, user, why);
    for (size_t i = 0; i < n; i++)     /* sent ones are empty now */
        zmq_msg_close(&f[i]);
}

/* Answers every ZAP request until the context is terminated (ETERM):
 * a connection still in its handshake while the sockets close is answered
 * too. Then closes its socket, which lets zmq_ctx_term finish. */
static void *
zap_main(void *arg)
{
    keel__zap *z = arg;
    long held;
    for (;;) {
        zmq_pollitem_t item = { z->rep, 0, ZMQ_POLLIN, 0 };
        if (zmq_poll(&item, 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (item.revents & ZMQ_POLLIN)
            zap_handle(z);
    }
    zmq_close(z->rep);
    z->rep = NULL;
    if ((held = keel__log_limit_flush(&z->logged)) > 0)
        keel__log(KEEL_LOG_WARN, "cluster: %ld more clients refused since "
                  "the last such line", held);
    return NULL;
}

keel_status
keel__zap_start(void *zctx, const keel__curve *c, keel__zap **out)
{
    keel__zap *z;
    int zero = 0;
    *out = NULL;
    z = calloc(1, sizeof *z);
    if (z == NULL)
        return keel__fail(KEEL_ENOMEM, "zap: %zu bytes", sizeof *z);
    z->zctx = zctx;
    if (c->enabled && c->n_allowed > 0) {
        z->allowed = malloc(c->n_allowed * sizeof *z->allowed);
        z->allowed_task = calloc(c->n_allowed, sizeof *z->allowed_task);
        if (z->allowed == NULL || z->allowed_task == NULL) {
            free(z->allowed);
            free(z->allowed_task);
            free(z);
            return keel__fail(KEEL_ENOMEM, "zap: allowed keys");
        }
        memcpy(z->allowed, c->allowed, c->n_allowed * sizeof *z->allowed);
        if (c->allowed_task != NULL)
            memcpy(z->allowed_task, c->allowed_task,
                   c->n_allowed * sizeof *z->allowed_task);
        z->n_allowed = c->n_allowed;
    } else if (!c->enabled && c->plain) {
        z->plain = 1;
        memcpy(z->token_key, c->token_key, sizeof z->token_key);
    }
    z->rep = zmq_socket(zctx, ZMQ_REP);
    if (z->rep == NULL)
        goto fail;
    zmq_setsockopt(z->rep, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(z->rep, "inproc://zeromq.zap.01") != 0)
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
    if (z->started)
        pthread_join(z->thread, NULL);    /* it ends at ETERM */
    if (z->rep)
        zmq_close(z->rep);
    free(z->allowed);
    free(z->allowed_task);
    sodium_memzero(z->token_key, sizeof z->token_key);
    free(z);
}
