/* address.c - a spec's addresses on this machine: names resolved
 * (getaddrinfo), this machine's interfaces (getifaddrs), the endpoints a
 * task binds, the IPv6 choice of a connect, and the check that every
 * host resolves and no two tasks share an address. */
#include <config.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <keel/cluster.h>
#include "cluster_int.h"

/* Resolved addresses of one host kept at most (a name of more is rare; the
 * rest are ignored). */
#define MAX_RESOLVED 16

/* One IPv4 or IPv6 address (no port). */
typedef struct ipaddr {
    int family;                     /* AF_INET or AF_INET6 */
    unsigned char b[16];            /* 4 or 16 bytes, network order */
} ipaddr;

static size_t
ip_len(const ipaddr *a)
{
    return a->family == AF_INET ? 4 : 16;
}

static int
ip_eq(const ipaddr *a, const ipaddr *b)
{
    return a->family == b->family && memcmp(a->b, b->b, ip_len(a)) == 0;
}

/* a as text: "1.2.3.4" or "::1" (no brackets). */
static void
ip_str(const ipaddr *a, char *buf, size_t size)
{
    if (inet_ntop(a->family, a->b, buf, (socklen_t)size) == NULL)
        snprintf(buf, size, "?");
}

static int
ip_from_sockaddr(const struct sockaddr *sa, ipaddr *out)
{
    memset(out, 0, sizeof *out);
    if (sa == NULL)
        return 0;
    if (sa->sa_family == AF_INET) {
        out->family = AF_INET;
        memcpy(out->b, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 1;
    }
    if (sa->sa_family == AF_INET6) {
        out->family = AF_INET6;
        memcpy(out->b, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return 1;
    }
    return 0;
}

int
keel__addr_split(const char *a, char *host, size_t hsize, int *port)
{
    const char *colon, *h = a;
    size_t hlen;
    char *end;
    long v;
    if (a == NULL)
        return 0;
    if (strncmp(h, "tcp://", 6) == 0)
        h += 6;
    if (h[0] == '[') {
        const char *rb = strchr(h, ']');
        if (rb == NULL || rb[1] != ':')
            return 0;
        hlen = (size_t)(rb - h - 1);
        h++;
        colon = rb + 1;
    } else {
        colon = strrchr(h, ':');
        if (colon == NULL)
            return 0;
        hlen = (size_t)(colon - h);
    }
    if (hlen == 0 || hlen >= hsize)
        return 0;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    v = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end != '\0' || v < 0 || v > 65535)
        return 0;
    *port = (int)v;
    return 1;
}

/* The addresses host resolves to (a literal: itself), at most max, no
 * duplicates; 0 with why (the resolver's reason) when none. */
static int
resolve_host(const char *host, ipaddr *out, int max, char *why,
             size_t size)
{
    struct addrinfo hints, *res = NULL;
    int n = 0, rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        snprintf(why, size, "%s", gai_strerror(rc));
        return 0;
    }
    for (struct addrinfo *r = res; r != NULL && n < max; r = r->ai_next) {
        ipaddr a;
        int dup = 0;
        if (!ip_from_sockaddr(r->ai_addr, &a))
            continue;
        for (int k = 0; k < n; k++)
            dup |= ip_eq(&out[k], &a);
        if (!dup)
            out[n++] = a;
    }
    freeaddrinfo(res);
    if (n == 0)
        snprintf(why, size, "no IPv4 or IPv6 address");
    return n;
}

/* 1 if a is an address of this machine: on one of its interfaces, or in
 * 127.0.0.0/8 (all of it is the loopback's). */
static int
is_local(const ipaddr *a, const struct ifaddrs *ifs)
{
    if (a->family == AF_INET && a->b[0] == 127)
        return 1;
    for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        ipaddr x;
        if (ip_from_sockaddr(i->ifa_addr, &x) && ip_eq(&x, a))
            return 1;
    }
    return 0;
}

/* Append "tcp://A:port" (A bracketed for IPv6) to buf, space-separated. */
static keel_status
add_endpoint(char *buf, size_t size, const ipaddr *a, int port)
{
    char ip[INET6_ADDRSTRLEN];
    size_t len = strlen(buf);
    int k;
    ip_str(a, ip, sizeof ip);
    k = snprintf(buf + len, size - len, "%stcp://%s%s%s:%d",
                 len ? " " : "", a->family == AF_INET6 ? "[" : "", ip,
                 a->family == AF_INET6 ? "]" : "", port);
    if (k < 0 || (size_t)k >= size - len)
        return keel__fail(KEEL_EINVAL, "bind: endpoints longer than %zu "
                          "bytes", size);
    return KEEL_OK;
}

/* "a, b" of the n addresses into buf. */
static void
list_ips(const ipaddr *a, int n, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < size; i++) {
        char ip[INET6_ADDRSTRLEN];
        int k;
        ip_str(&a[i], ip, sizeof ip);
        k = snprintf(buf + len, size - len, "%s%s", i ? ", " : "", ip);
        if (k < 0)
            return;
        len += (size_t)k;
    }
}

/* The endpoints of interface name's addresses (IPv6 link-local ones left
 * out: they need a scope); 0 added when it has none or is no interface. */
static keel_status
interface_endpoints(const struct ifaddrs *ifs, const char *name, int port,
                    char *buf, size_t size, int *added)
{
    keel_status st = KEEL_OK;
    *added = 0;
    for (const struct ifaddrs *i = ifs; i != NULL && st == KEEL_OK;
         i = i->ifa_next) {
        ipaddr x;
        if (strcmp(i->ifa_name, name) != 0 ||
            !ip_from_sockaddr(i->ifa_addr, &x))
            continue;
        if (x.family == AF_INET6 && x.b[0] == 0xfe && (x.b[1] & 0xc0) == 0x80)
            continue;
        st = add_endpoint(buf, size, &x, port);
        (*added)++;
    }
    return st;
}

/* The endpoints of bind_address ("*", an interface, an address of this
 * machine) on port, for task who. */
static keel_status
override_endpoints(const char *who, const char *bind_address, int port,
                   const struct ifaddrs *ifs, char *buf, size_t size)
{
    ipaddr a;
    int added;
    keel_status st;
    if (strcmp(bind_address, "*") == 0)
        return keel__fmt(buf, size, "bind address", "tcp://*:%d", port);
    st = interface_endpoints(ifs, bind_address, port, buf, size, &added);
    if (st != KEEL_OK || added > 0)
        return st;
    memset(&a, 0, sizeof a);
    if (inet_pton(AF_INET, bind_address, a.b) == 1)
        a.family = AF_INET;
    else if (inet_pton(AF_INET6, bind_address, a.b) == 1)
        a.family = AF_INET6;
    if (a.family != 0 && is_local(&a, ifs))
        return add_endpoint(buf, size, &a, port);
    return keel__fail(KEEL_EINVAL, "%s: cluster.bind_address '%.64s' is "
                      "neither '*', an interface of this machine with an "
                      "address, nor an address of this machine", who,
                      bind_address);
}

static keel_status bind_tcp_endpoints(const keel_cluster_spec *s,
                                      keel_task_type type, int index,
                                      const char *bind_address, char *buf,
                                      size_t size);

/* ---- the same-host transport -------------------------------------------- */

/* Longest host kept readable in a socket's name; a longer one is named by
 * its hash. */
#define IPC_HOST_MAX 64

/* The private directory of this user's sockets, "/tmp/keel-<uid>", into
 * buf; 1 when it is a directory (not a link) owned by this user that no
 * one else may enter, after creating it when create says so and it is
 * missing; 0 with why otherwise. */
static int
ipc_dir(char *buf, size_t size, int create, char *why, size_t wsize)
{
    struct stat st;
    uid_t uid = geteuid();
    snprintf(buf, size, "/tmp/keel-%lu", (unsigned long)uid);
    if (create && mkdir(buf, 0700) != 0 && errno != EEXIST) {
        snprintf(why, wsize, "mkdir %s: %s", buf, strerror(errno));
        return 0;
    }
    if (lstat(buf, &st) != 0) {
        snprintf(why, wsize, "%s: %s", buf, strerror(errno));
        return 0;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != uid ||
        (st.st_mode & 077) != 0) {
        snprintf(why, wsize, "%s is not a directory of user %lu that only "
                 "it can enter", buf, (unsigned long)uid);
        return 0;
    }
    return 1;
}

/* The socket path of the task whose address is host:port in dir. */
static int
ipc_path(const char *dir, const char *host, int port, char *buf, size_t size)
{
    char name[IPC_HOST_MAX + 1];
    size_t n = strlen(host);
    int k;
    if (n <= IPC_HOST_MAX) {
        for (size_t i = 0; i <= n; i++) {
            char c = host[i];
            name[i] = (c == '\0' || (c >= 'a' && c <= 'z') ||
                       (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '-') ? c : '_';
        }
    } else {
        uint64_t h = 1469598103934665603ULL;            /* FNV-1a */
        for (size_t i = 0; i < n; i++)
            h = (h ^ (unsigned char)host[i]) * 1099511628211ULL;
        snprintf(name, sizeof name, "h%016llx", (unsigned long long)h);
    }
    k = snprintf(buf, size, "%s/%s-%d", dir, name, port);
    return k > 0 && (size_t)k < size &&
           (size_t)k < sizeof(((struct sockaddr_un *)0)->sun_path);
}

/* 1 when one of the n addresses is an address of this machine. */
static int
any_local(const ipaddr *a, int n)
{
    struct ifaddrs *ifs = NULL;
    int local = 0;
    if (getifaddrs(&ifs) != 0)
        ifs = NULL;
    for (int i = 0; i < n && !local; i++)
        local = is_local(&a[i], ifs);
    freeifaddrs(ifs);
    return local;
}

int
keel__cluster_ipc_path(const char *address, int create, char *buf,
                       size_t size)
{
    char host[KEEL_ADDR_MAX], dir[64], why[160];
    ipaddr res[MAX_RESOLVED];
    int port, n;
    if (!keel__addr_split(address, host, sizeof host, &port))
        return 0;
    n = resolve_host(host, res, MAX_RESOLVED, why, sizeof why);
    if (n == 0 || !any_local(res, n))
        return 0;
    if (!ipc_dir(dir, sizeof dir, create, why, sizeof why)) {
        if (create)                 /* a ps; its peers then use tcp */
            keel__log(KEEL_LOG_WARN, "cluster: %.80s over tcp, not a "
                      "Unix socket: %s", address, why);
        return 0;
    }
    return ipc_path(dir, host, port, buf, size);
}

keel_status
keel__cluster_peer_endpoint(const char *address, keel_local_transport mode,
                            char *buf, size_t size)
{
    char path[KEEL_PATH_MAX];
    struct stat st;
    if (mode == KEEL_LOCAL_TRANSPORT_AUTO &&
        keel__cluster_ipc_path(address, 0, path, sizeof path) &&
        stat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        return keel__fmt(buf, size, "ps address", "ipc://%s", path);
    return keel__fmt(buf, size, "ps address", "tcp://%s", address);
}

/* 1 when path is a Unix socket nobody listens on (connecting is
 * refused): one a killed task left. */
static int
ipc_is_stale(const char *path)
{
    struct sockaddr_un a;
    int fd, stale;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path)
        return 0;
    memcpy(a.sun_path, path, strlen(path));
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    stale = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 &&
            errno == ECONNREFUSED;
    close(fd);
    return stale;
}

/* Append "ipc://<path>" of the task's own address to buf when it is on
 * this machine (after the tcp endpoints: binding those first makes sure
 * no other task holds the address, so a socket file already at the path is
 * a stale one, which ZeroMQ replaces). */
static keel_status
add_ipc_endpoint(const char *entry, char *buf, size_t size)
{
    char path[KEEL_PATH_MAX];
    size_t len = strlen(buf);
    int k;
    if (!keel__cluster_ipc_path(entry, 1, path, sizeof path))
        return KEEL_OK;
    k = snprintf(buf + len, size - len, "%sipc://%s", len ? " " : "", path);
    if (k < 0 || (size_t)k >= size - len)
        return keel__fail(KEEL_EINVAL, "bind: endpoints longer than %zu "
                          "bytes", size);
    return KEEL_OK;
}

keel_status
keel__cluster_bind_endpoints(const keel_cluster_spec *s, keel_task_type type,
                             int index, const char *bind_address,
                             keel_local_transport local, char *buf,
                             size_t size)
{
    keel_status st = bind_tcp_endpoints(s, type, index, bind_address, buf,
                                        size);
    const char *entry = keel_cluster_spec_address(s, type, index);
    char path[KEEL_PATH_MAX];
    if (st != KEEL_OK)
        return st;
    if (local == KEEL_LOCAL_TRANSPORT_AUTO)
        return add_ipc_endpoint(entry, buf, size);
    /* a socket an earlier task of this address left would draw its peers
     * there */
    if (keel__cluster_ipc_path(entry, 0, path, sizeof path) &&
        ipc_is_stale(path))
        unlink(path);
    return KEEL_OK;
}

/* keel__cluster_bind_endpoints' tcp endpoints. */
static keel_status
bind_tcp_endpoints(const keel_cluster_spec *s, keel_task_type type,
                   int index, const char *bind_address, char *buf,
                   size_t size)
{
    const char *entry = keel_cluster_spec_address(s, type, index);
    char host[KEEL_ADDR_MAX], why[160], who[64], ips[256];
    ipaddr res[MAX_RESOLVED];
    struct ifaddrs *ifs = NULL;
    int port, n;
    keel_status st = KEEL_OK;
    snprintf(who, sizeof who, "%s %d", keel_task_type_name(type), index);
    if (entry == NULL)
        return keel__fail(KEEL_EINVAL, "bind: no task %s in the cluster",
                          who);
    if (!keel__cluster_check_address(entry, why, sizeof why) ||
        !keel__addr_split(entry, host, sizeof host, &port))
        return keel__fail(KEEL_EINVAL, "bind: %s: %s", who, why);
    if (size > 0)
        buf[0] = '\0';
    if (getifaddrs(&ifs) != 0)
        ifs = NULL;                 /* then only the loopback is known */
    if (bind_address != NULL && bind_address[0] != '\0') {
        st = override_endpoints(who, bind_address, port, ifs, buf, size);
        freeifaddrs(ifs);
        return st;
    }
    n = resolve_host(host, res, MAX_RESOLVED, why, sizeof why);
    if (n == 0) {
        freeifaddrs(ifs);
        return keel__fail(KEEL_EINVAL, "%s: host '%.64s' of its address "
                          "'%.80s' does not resolve: %s", who, host, entry,
                          why);
    }
    for (int i = 0; i < n && st == KEEL_OK; i++)
        if (is_local(&res[i], ifs))
            st = add_endpoint(buf, size, &res[i], port);
    freeifaddrs(ifs);
    if (st == KEEL_OK && buf[0] == '\0') {
        list_ips(res, n, ips, sizeof ips);
        return keel__fail(KEEL_EINVAL, "%s: host '%.64s' of its address "
                          "'%.80s' resolves to %s, no address of this "
                          "machine (is this task's entry on another host? "
                          "to listen anyway set cluster.bind_address to * "
                          "or an interface)", who, host, entry, ips);
    }
    return st;
}

/* ---- binding and connecting --------------------------------------------- */

static int
set_ipv6(void *sock, int on)
{
    return zmq_setsockopt(sock, ZMQ_IPV6, &on, sizeof on);
}

keel_status
keel__cluster_zmq_bind(void *sock, const char *endpoints, const char *who)
{
    const char *p = endpoints;
    int n = 0;
    while (*p != '\0') {
        char ep[KEEL_ADDR_MAX + 16];
        size_t len = strcspn(p, " ");
        int wild;
        if (len == 0 || len >= sizeof ep) {
            p += len + (p[len] == ' ');
            if (len == 0)
                continue;
            return keel__fail(KEEL_EINVAL, "%s: bind endpoint of %zu bytes",
                              who, len);
        }
        memcpy(ep, p, len);
        ep[len] = '\0';
        p += len + (p[len] == ' ');
        wild = strncmp(ep, "tcp://*:", 8) == 0;
        /* "*" listens on IPv6 and IPv4 where the machine has IPv6 */
        if (set_ipv6(sock, strchr(ep, '[') != NULL || wild) != 0)
            return keel__fail(KEEL_EIO, "%s: ZMQ_IPV6: %s", who,
                              zmq_strerror(errno));
        if (zmq_bind(sock, ep) != 0 &&
            !(wild && set_ipv6(sock, 0) == 0 && zmq_bind(sock, ep) == 0))
            return keel__fail(KEEL_EUNAVAILABLE, "%s: bind %s: %s", who, ep,
                              zmq_strerror(errno));
        n++;
    }
    if (n == 0)
        return keel__fail(KEEL_EINVAL, "%s: no address to bind", who);
    return KEEL_OK;
}

int
keel__cluster_wants_ipv6(const char *endpoint)
{
    char host[KEEL_ADDR_MAX];
    unsigned char b[16];
    struct addrinfo hints, *res = NULL;
    int port, rc;
    if (!keel__addr_split(endpoint, host, sizeof host, &port))
        return 0;
    if (strchr(host, ':') != NULL)          /* an IPv6 literal */
        return 1;
    if (inet_pton(AF_INET, host, b) == 1)
        return 0;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc == 0)
        freeaddrinfo(res);
    return rc != 0;
}

keel_status
keel__cluster_zmq_connect(void *sock, const char *endpoint)
{
    if (set_ipv6(sock, keel__cluster_wants_ipv6(endpoint)) != 0)
        return keel__fail(KEEL_EIO, "connect %s: ZMQ_IPV6: %s", endpoint,
                          zmq_strerror(errno));
    if (zmq_connect(sock, endpoint) != 0)
        return keel__fail(KEEL_EINVAL, "connect %s: %s", endpoint,
                          zmq_strerror(errno));
    return KEEL_OK;
}

/* ---- every host of a spec ----------------------------------------------- */

/* One resolved address of one task. */
typedef struct task_ip {
    ipaddr ip;
    int port;
    int type;
    size_t index;
} task_ip;

static int
cmp_task_ip(const void *x, const void *y)
{
    const task_ip *a = x, *b = y;
    int c;
    if (a->ip.family != b->ip.family)
        return a->ip.family - b->ip.family;
    if ((c = memcmp(a->ip.b, b->ip.b, ip_len(&a->ip))) != 0)
        return c;
    if (a->port != b->port)
        return a->port - b->port;
    if (a->type != b->type)
        return a->type - b->type;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* The resolved addresses of every task into *out (*n of them); every host
 * that does not resolve into p. */
static keel_status
resolve_all(const keel_cluster_spec *s, task_ip **out, size_t *n,
            keel__problems *p, int *unresolved)
{
    size_t cap = 0, k = 0;
    task_ip *all = NULL;
    for (int t = 1; t < KEEL_TASK_TYPE_COUNT; t++)
        cap += keel_cluster_spec_num_tasks(s, (keel_task_type)t);
    cap *= MAX_RESOLVED;
    if (cap > 0 && (all = malloc(cap * sizeof *all)) == NULL)
        return keel__fail(KEEL_ENOMEM, "cluster: resolving %zu addresses",
                          cap / MAX_RESOLVED);
    for (int t = 1; t < KEEL_TASK_TYPE_COUNT; t++)
        for (size_t i = 0; i < keel_cluster_spec_num_tasks(s, t); i++) {
            const char *a = keel_cluster_spec_address(s, t, (int)i);
            char host[KEEL_ADDR_MAX], why[160];
            ipaddr res[MAX_RESOLVED];
            int port, m;
            if (!keel__addr_split(a, host, sizeof host, &port))
                continue;               /* the spec's validation says */
            m = resolve_host(host, res, MAX_RESOLVED, why, sizeof why);
            if (m == 0) {
                keel__problems_add(p, "%s %zu: host '%.64s' does not "
                                   "resolve (%s)", keel_task_type_name(t),
                                   i, host, why);
                (*unresolved)++;
            }
            for (int j = 0; j < m; j++)
                all[k++] = (task_ip){ res[j], port, t, i };
        }
    *out = all;
    *n = k;
    return KEEL_OK;
}

/* Two tasks on one address and port (two names of one address too). */
static void
find_shared(const keel_cluster_spec *s, task_ip *all, size_t n,
            keel__problems *p)
{
    qsort(all, n, sizeof *all, cmp_task_ip);
    for (size_t i = 1; i < n; i++) {
        const task_ip *a = &all[i - 1], *b = &all[i];
        char ip[INET6_ADDRSTRLEN];
        if (!ip_eq(&a->ip, &b->ip) || a->port != b->port ||
            (a->type == b->type && a->index == b->index))
            continue;
        ip_str(&a->ip, ip, sizeof ip);
        keel__problems_add(p, "%s %zu ('%.64s') and %s %zu ('%.64s') are "
                           "one address, %s%s%s:%d",
                           keel_task_type_name(a->type), a->index,
                           keel_cluster_spec_address(s, a->type,
                                                     (int)a->index),
                           keel_task_type_name(b->type), b->index,
                           keel_cluster_spec_address(s, b->type,
                                                     (int)b->index),
                           a->ip.family == AF_INET6 ? "[" : "", ip,
                           a->ip.family == AF_INET6 ? "]" : "", a->port);
    }
}

/* keel_cluster_spec_check_hosts, counting the hosts that do not resolve
 * into *unresolved. */
static keel_status
check_hosts(const keel_cluster_spec *s, const char *bind_address,
            int *unresolved)
{
    keel__problems p = { .count = 0 };
    task_ip *all = NULL;
    size_t n = 0;
    keel_status st;
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "cluster hosts: spec is NULL");
    if (keel_cluster_spec_is_local(s))
        return KEEL_OK;
    *unresolved = 0;
    if ((st = resolve_all(s, &all, &n, &p, unresolved)) != KEEL_OK)
        return st;
    find_shared(s, all, n, &p);
    free(all);
    if (p.count == 0 && keel_cluster_spec_is_ps(s)) {
        char eps[4 * (KEEL_ADDR_MAX + 16)];
        st = bind_tcp_endpoints(s, KEEL_TASK_PS,
                                keel_cluster_spec_task_index(s),
                                bind_address, eps, sizeof eps);
        if (st != KEEL_OK)
            keel__problems_add(&p, "%s", keel_last_error());
    }
    return keel__problems_fail(&p, "cluster hosts");
}

keel_status
keel_cluster_spec_check_hosts(const keel_cluster_spec *s,
                              const char *bind_address)
{
    int unresolved;
    return check_hosts(s, bind_address, &unresolved);
}

/* Polling a resolver that has no event to wait on: once a second. */
#define RESOLVE_POLL_MS 1000
#define RESOLVE_LOG_SECS 10

keel_status
keel_cluster_spec_wait_hosts(const keel_cluster_spec *s,
                             const char *bind_address, double wait_secs)
{
    int64_t start = keel__now_mono_ns(), last_log = start;
    for (;;) {
        int unresolved = 0;
        keel_status st = check_hosts(s, bind_address, &unresolved);
        int64_t now = keel__now_mono_ns();
        double waited = (double)(now - start) / 1e9;
        if (st == KEEL_OK || unresolved == 0)
            return st;
        if (!(wait_secs > waited))
            return waited > 0
                ? keel__wrap(st, "cluster hosts: still unresolved after "
                             "%.0f s (cluster.max_wait_secs)", waited)
                : st;
        if (keel__signal_pending())
            return keel__wrap(KEEL_ECANCELLED, "cluster hosts: waiting for "
                              "names to resolve: stopped by a signal");
        if (now == start || now - last_log >= RESOLVE_LOG_SECS * 1000000000LL) {
            keel__log(KEEL_LOG_INFO, "cluster: waiting up to %.0f s for "
                      "every host to resolve (%.0f s so far): %s", wait_secs,
                      waited, keel_last_error());
            last_log = now;
        }
        {
            struct timespec ts = { RESOLVE_POLL_MS / 1000,
                                   (RESOLVE_POLL_MS % 1000) * 1000000L };
            nanosleep(&ts, NULL);
        }
    }
}
