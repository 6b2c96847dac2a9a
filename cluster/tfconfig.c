/* tfconfig.c - TF_CONFIG (json-c): the cluster, the task, the mode, the
 * replica counts and model_dir of TF1's RunConfig into a spec, every
 * problem listed at once, and a spec's TF_CONFIG for one of its tasks out. */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include <keel/cluster.h>
#include "util.h"
#include "cluster_int.h"
#include "spec_int.h"

#define MAX_TASKS_PER_JOB KEEL__MAX_TASKS_PER_JOB

/* ---- TF_CONFIG in ------------------------------------------------------- */

static int
json_int(struct json_object *o, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t v;
    if (o == NULL || !json_object_is_type(o, json_type_int))
        return 0;
    errno = 0;
    v = json_object_get_int64(o);
    if (errno != 0 || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* The optional replica count key of root (1..2^20) into *dst, else a
 * problem naming it. */
static void
json_replicas(struct json_object *root, const char *key, keel__problems *p,
              int *dst)
{
    struct json_object *o;
    int64_t v;
    if (!json_object_object_get_ex(root, key, &o))
        return;
    if (!json_int(o, 1, 1 << 20, &v))
        keel__problems_add(p, "%s must be an integer in 1..1048576", key);
    else
        *dst = (int)v;
}

/* A job given as a list: one task per element, in order. */
static keel_status
parse_job_list(keel_cluster_spec *s, keel_task_type t, const char *key,
               struct json_object *job, keel__problems *p)
{
    size_t n = json_object_array_length(job);
    keel_status st;
    if (n > MAX_TASKS_PER_JOB) {
        keel__problems_add(p, "cluster.%s has %zu tasks (max %d)", key,
                           n, MAX_TASKS_PER_JOB);
        return KEEL_OK;
    }
    for (size_t i = 0; i < n; i++) {
        struct json_object *e = json_object_array_get_idx(job, i);
        const char *a = "";
        size_t len = 0;
        if (e == NULL || !json_object_is_type(e, json_type_string))
            keel__problems_add(p, "cluster.%s[%zu] is not a string",
                               key, i);
        else {
            a = json_object_get_string(e);
            len = (size_t)json_object_get_string_len(e);
            if (strlen(a) != len) {
                keel__problems_add(p, "cluster.%s[%zu] contains NUL",
                                   key, i);
                len = strlen(a);
            }
        }
        /* keep a slot either way so indices stay meaningful */
        if ((st = keel__cluster_spec_add(s, t, a, len)) != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* The n entries of a sparse job map into slots by index; 0 (and problems
 * added) if a key is not an index in 0..n-1, a value not a string, or an
 * index given twice. */
static int
sparse_job_slots(const char *key, struct json_object *job, size_t n,
                 const char **slots, keel__problems *p)
{
    int ok = 1;
    json_object_object_foreach(job, k, v) {
        int64_t idx;
        if (!keel__parse_i64(k, 0, (int64_t)n - 1, &idx)) {
            keel__problems_add(p, "cluster.%s key '%.32s' is not an "
                               "index in 0..%zu", key, k, n - 1);
            ok = 0;
        } else if (!json_object_is_type(v, json_type_string)) {
            keel__problems_add(p, "cluster.%s[\"%s\"] is not a string",
                               key, k);
            ok = 0;
        } else if (slots[idx] != NULL) {
            keel__problems_add(p, "cluster.%s index %s given twice",
                               key, k);
            ok = 0;
        } else {
            slots[idx] = json_object_get_string(v);
        }
    }
    return ok;
}

/* A job given as a sparse {"<index>": "host:port"} map that must cover
 * 0..n-1. */
static keel_status
parse_job_map(keel_cluster_spec *s, keel_task_type t, const char *key,
              struct json_object *job, keel__problems *p)
{
    size_t n = (size_t)json_object_object_length(job);
    const char **slots;
    keel_status st = KEEL_OK;
    if (n > MAX_TASKS_PER_JOB) {
        keel__problems_add(p, "cluster.%s has %zu tasks (max %d)", key,
                           n, MAX_TASKS_PER_JOB);
        return KEEL_OK;
    }
    slots = calloc(n ? n : 1, sizeof *slots);
    if (slots == NULL)
        return keel__fail(KEEL_ENOMEM, "TF_CONFIG: sparse job %s", key);
    if (sparse_job_slots(key, job, n, slots, p))
        for (size_t i = 0; i < n && st == KEEL_OK; i++)
            st = keel__cluster_spec_add(s, t, slots[i], strlen(slots[i]));
    free(slots);
    return st;
}

/* One job: a list of "host:port" or a sparse {"<index>": "host:port"} map
 * that must cover 0..n-1. */
static keel_status
parse_job(keel_cluster_spec *s, keel_task_type t, const char *key,
          struct json_object *job, keel__problems *p)
{
    if (json_object_is_type(job, json_type_array))
        return parse_job_list(s, t, key, job, p);
    if (json_object_is_type(job, json_type_object))
        return parse_job_map(s, t, key, job, p);
    keel__problems_add(p, "cluster.%s is not a list of \"host:port\"", key);
    return KEEL_OK;
}

/* The task type of cluster job key (master: chief, with a warning), or
 * KEEL_TASK_NONE with a problem; *has_chief / *has_master set by name. */
static keel_task_type
cluster_job_type(const char *key, int *has_chief, int *has_master,
                 keel__problems *p)
{
    if (strcmp(key, "master") == 0) {
        *has_master = 1;
        keel__log(KEEL_LOG_WARN, "TF_CONFIG: job 'master' read as 'chief' "
                  "(legacy name)");
        return KEEL_TASK_CHIEF;
    }
    if (strcmp(key, "chief") == 0) {
        *has_chief = 1;
        return KEEL_TASK_CHIEF;
    }
    if (strcmp(key, "worker") == 0)
        return KEEL_TASK_WORKER;
    if (strcmp(key, "ps") == 0)
        return KEEL_TASK_PS;
    if (strcmp(key, "evaluator") == 0)
        return KEEL_TASK_EVALUATOR;
    keel__problems_add(p, "unknown task type '%.32s' in cluster (allowed: "
                       "chief, master, worker, ps, evaluator)", key);
    return KEEL_TASK_NONE;
}

/* "cluster": each job's addresses; *cluster_set when any job is known. */
static keel_status
parse_cluster(keel_cluster_spec *s, struct json_object *cluster,
              keel__problems *p, int *cluster_set)
{
    int has_chief = 0, has_master = 0;
    keel_status st;
    if (!json_object_is_type(cluster, json_type_object)) {
        keel__problems_add(p, "'cluster' is not an object");
        return KEEL_OK;
    }
    json_object_object_foreach(cluster, key, job) {
        keel_task_type t = cluster_job_type(key, &has_chief, &has_master, p);
        if (t == KEEL_TASK_NONE)
            continue;
        *cluster_set = 1;
        if ((st = parse_job(s, t, key, job, p)) != KEEL_OK)
            return st;
    }
    if (has_chief && has_master)
        keel__problems_add(p, "both 'chief' and 'master' jobs (master is an "
                           "alias of chief; keep one)");
    return KEEL_OK;
}

/* "task": this task's type and index (both required once cluster is set;
 * without a cluster, a worker). */
static void
parse_task(keel_cluster_spec *s, struct json_object *task, int cluster_set,
           keel__problems *p)
{
    struct json_object *ty = NULL, *ix = NULL;
    int64_t idx = 0;
    int has_type, has_index;
    keel_task_type t = KEEL_TASK_NONE;
    if (!json_object_is_type(task, json_type_object)) {
        keel__problems_add(p, "'task' is not an object");
        return;
    }
    has_type = json_object_object_get_ex(task, "type", &ty);
    has_index = json_object_object_get_ex(task, "index", &ix);
    if (!has_type) {
        if (cluster_set)
            keel__problems_add(p, "task.type is missing");
        else
            t = KEEL_TASK_WORKER;
    } else if (!json_object_is_type(ty, json_type_string)) {
        keel__problems_add(p, "task.type is not a string");
    } else if (keel_task_type_from_name(json_object_get_string(ty), &t)
               != KEEL_OK) {
        keel__problems_add(p, "unknown task.type '%.32s'",
                           json_object_get_string(ty));
        t = KEEL_TASK_NONE;
    }
    if (!has_index) {
        if (cluster_set)
            keel__problems_add(p, "task.index is missing");
    } else if (!json_object_is_type(ix, json_type_int)) {
        keel__problems_add(p, "task.index is not an integer");
    } else if (!json_int(ix, 0, INT_MAX, &idx)) {
        keel__problems_add(p, "task.index %.32s is negative or too large",
                           json_object_to_json_string(ix));
    }
    if (t != KEEL_TASK_NONE) {
        s->task = t;
        s->index = (int)idx;
    }
}

/* "mode": "sync" or "async". */
static void
parse_mode(keel_cluster_spec *s, struct json_object *o, keel__problems *p)
{
    const char *m = json_object_is_type(o, json_type_string)
                        ? json_object_get_string(o) : NULL;
    if (m != NULL && strcmp(m, "sync") == 0)
        s->mode = KEEL_CLUSTER_SYNC;
    else if (m != NULL && strcmp(m, "async") == 0)
        s->mode = KEEL_CLUSTER_ASYNC;
    else
        keel__problems_add(p, "mode must be \"sync\" or \"async\"");
}

/* "model_dir": a non-empty string (copied). */
static keel_status
parse_model_dir(keel_cluster_spec *s, struct json_object *o,
                keel__problems *p)
{
    if (!json_object_is_type(o, json_type_string) ||
        json_object_get_string_len(o) == 0) {
        keel__problems_add(p, "model_dir must be a non-empty string");
        return KEEL_OK;
    }
    s->model_dir = strdup(json_object_get_string(o));
    if (s->model_dir == NULL)
        return keel__fail(KEEL_ENOMEM, "TF_CONFIG: model_dir");
    return KEEL_OK;
}

/* ---- keys given twice --------------------------------------------------- */

/* json-c keeps the last of two equal keys of an object, so a job, a sparse
 * index or a task member listed twice would lose the first silently; the
 * text is scanned for them instead. */

#define SCAN_DEPTH 34           /* above the tokener's nesting limit */

typedef struct scan_frame {
    int is_object;
    int want_key;               /* the next string is a key */
    char *name;                 /* its key in the parent object, or NULL */
    char *last;                 /* the last key read (borrowed from keys) */
    char **keys;                /* decoded, owned */
    size_t n, cap;
} scan_frame;

/* The JSON string literal at text[0..len) decoded (malloc'd), or NULL. */
static char *
scan_decode(const char *text, size_t len)
{
    struct json_object *o;
    char *lit, *out = NULL;
    if (memchr(text, '\\', len) == NULL)
        return strndup(text + 1, len - 2);
    if ((lit = strndup(text, len)) == NULL)
        return NULL;
    o = json_tokener_parse(lit);
    if (o != NULL && json_object_is_type(o, json_type_string))
        out = strdup(json_object_get_string(o));
    json_object_put(o);
    free(lit);
    return out;
}

static int
scan_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Frame d of frames closes: every key it has twice, named by where it is,
 * when it is an object keel reads (members it ignores may hold anything). */
static void
scan_close(scan_frame *frames, int d, keel__problems *p)
{
    scan_frame *f = &frames[d];
    const char *parent = d >= 1 ? frames[d - 1].name : NULL;
    /* the objects keel reads: the root, "cluster", its jobs, "task" */
    int read = d == 0 ||
        (d == 1 && f->name != NULL && (strcmp(f->name, "cluster") == 0 ||
                                       strcmp(f->name, "task") == 0)) ||
        (d == 2 && f->name != NULL && parent != NULL &&
         strcmp(parent, "cluster") == 0);
    if (read && f->n > 1)
        qsort(f->keys, f->n, sizeof *f->keys, scan_cmp);
    for (size_t i = 1; read && i < f->n; i++) {
        const char *k = f->keys[i];
        if (strcmp(k, f->keys[i - 1]) != 0 ||
            (i >= 2 && strcmp(k, f->keys[i - 2]) == 0))
            continue;
        if (d == 0)
            keel__problems_add(p, "key '%.32s' given twice", k);
        else if (d == 1 && strcmp(f->name, "cluster") == 0)
            keel__problems_add(p, "cluster job '%.32s' given twice (each "
                               "job is one list of its tasks)", k);
        else if (d == 1)
            keel__problems_add(p, "%s.%.32s given twice", f->name, k);
        else
            keel__problems_add(p, "cluster.%.32s index %.32s given twice",
                               f->name, k);
    }
    for (size_t i = 0; i < f->n; i++)
        free(f->keys[i]);
    free(f->keys);
    free(f->name);
    memset(f, 0, sizeof *f);
}

/* The end of the string literal starting at text[i] (its closing quote). */
static size_t
scan_string_end(const char *text, size_t len, size_t i)
{
    for (i++; i < len && text[i] != '"'; i++)
        if (text[i] == '\\')
            i++;
    return i;
}

/* Add a key decoded from text[i..j] to f; 0 when out of memory. */
static int
scan_key(scan_frame *f, const char *text, size_t i, size_t j)
{
    char *k = scan_decode(text + i, j - i + 1);
    if (k == NULL)
        return 0;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        char **keys = realloc(f->keys, cap * sizeof *keys);
        if (keys == NULL) {
            free(k);
            return 0;
        }
        f->keys = keys;
        f->cap = cap;
    }
    f->keys[f->n++] = k;
    f->last = k;
    f->want_key = 0;
    return 1;
}

/* Every object key of the valid JSON text[0..len) given twice in its
 * object, into p. */
static keel_status
scan_duplicate_keys(const char *text, size_t len, keel__problems *p)
{
    scan_frame frames[SCAN_DEPTH];
    int d = -1, ok = 1;
    memset(frames, 0, sizeof frames);
    for (size_t i = 0; i < len && ok; i++) {
        char c = text[i];
        if (c == '"') {
            size_t j = scan_string_end(text, len, i);
            if (d >= 0 && frames[d].is_object && frames[d].want_key)
                ok = scan_key(&frames[d], text, i, j);
            i = j;
        } else if (c == '{' || c == '[') {
            if (d + 1 >= SCAN_DEPTH)
                break;          /* deeper than the tokener allows */
            d++;
            frames[d].is_object = c == '{';
            frames[d].want_key = c == '{';
            if (d > 0 && frames[d - 1].is_object &&
                frames[d - 1].last != NULL &&
                (frames[d].name = strdup(frames[d - 1].last)) == NULL)
                ok = 0;
        } else if ((c == '}' || c == ']') && d >= 0) {
            scan_close(frames, d, p);
            d--;
        } else if (c == ',' && d >= 0 && frames[d].is_object) {
            frames[d].want_key = 1;
        }
    }
    for (; d >= 0; d--) {
        keel__problems q = { .count = 0 };
        scan_close(frames, d, &q);
    }
    if (!ok)
        return keel__fail(KEEL_ENOMEM, "TF_CONFIG: checking keys");
    return KEEL_OK;
}

/* TF_CONFIG's members into s; what is wrong with them into p. */
static keel_status
parse_tf_config(keel_cluster_spec *s, struct json_object *root,
                keel__problems *p)
{
    struct json_object *o;
    int cluster_set = 0;
    keel_status st;

    if (!json_object_is_type(root, json_type_object)) {
        keel__problems_add(p, "top level is not a JSON object");
        return KEEL_OK;
    }
    /* Other members (the TFJob operator's "environment": "cloud", TF's
     * "rpc_layer") say nothing keel uses and are ignored. */
    if (json_object_object_get_ex(root, "cluster", &o) &&
        (st = parse_cluster(s, o, p, &cluster_set)) != KEEL_OK)
        return st;
    if (json_object_object_get_ex(root, "sparseCluster", &o))
        keel__problems_add(p, "'sparseCluster' (the TFJob operator's "
                           "enableDynamicWorker) is not supported: every "
                           "task needs every task's address; turn "
                           "enableDynamicWorker off");
    if (json_object_object_get_ex(root, "task", &o))
        parse_task(s, o, cluster_set, p);
    else if (cluster_set)
        keel__problems_add(p, "'task' is missing (cluster is set)");
    if (json_object_object_get_ex(root, "mode", &o))
        parse_mode(s, o, p);
    json_replicas(root, "replicas_to_aggregate", p,
                  &s->replicas_to_aggregate);
    json_replicas(root, "total_num_replicas", p, &s->total_num_replicas);
    if (json_object_object_get_ex(root, "model_dir", &o) &&
        (st = parse_model_dir(s, o, p)) != KEEL_OK)
        return st;
    return KEEL_OK;
}

keel_status
keel_cluster_spec_from_tf_config(const char *json, keel_cluster_spec **out)
{
    keel_cluster_spec *s = NULL;
    struct json_tokener *tok = NULL;
    struct json_object *root = NULL;
    keel__problems p = { .count = 0 };
    keel_status st;
    size_t len;

    if (out == NULL || json == NULL)
        return keel__fail(KEEL_EINVAL, "TF_CONFIG: NULL argument");
    *out = NULL;
    len = strnlen(json, (size_t)KEEL_TF_CONFIG_MAX + 1);
    if (len > KEEL_TF_CONFIG_MAX)
        return keel__fail(KEEL_EINVAL, "TF_CONFIG: longer than %d bytes",
                          KEEL_TF_CONFIG_MAX);
    if ((st = keel_cluster_spec_new(&s)) != KEEL_OK)
        return st;
    tok = json_tokener_new_ex(32);
    if (tok == NULL) {
        st = keel__fail(KEEL_ENOMEM, "TF_CONFIG: json tokener");
        goto out;
    }
    root = json_tokener_parse_ex(tok, json, (int)len);
    if (root == NULL || json_tokener_get_error(tok) != json_tokener_success
        || json_tokener_get_parse_end(tok) != len) {
        enum json_tokener_error e = json_tokener_get_error(tok);
        if (root != NULL || e == json_tokener_continue)
            st = keel__fail(KEEL_EINVAL, "TF_CONFIG: not valid JSON "
                            "(incomplete or trailing data at offset %zu)",
                            json_tokener_get_parse_end(tok));
        else
            st = keel__fail(KEEL_EINVAL, "TF_CONFIG: not valid JSON: %s "
                            "at offset %zu", json_tokener_error_desc(e),
                            json_tokener_get_parse_end(tok));
        goto out;
    }
    if ((st = scan_duplicate_keys(json, len, &p)) != KEEL_OK ||
        (st = parse_tf_config(s, root, &p)) != KEEL_OK)
        goto out;
    if ((st = keel__cluster_spec_check(s, &p, "TF_CONFIG")) != KEEL_OK)
        goto out;
    *out = s;
    s = NULL;
out:
    json_object_put(root);
    if (tok != NULL)
        json_tokener_free(tok);
    keel_cluster_spec_free(s);
    return st;
}

keel_status
keel_cluster_spec_from_env(keel_cluster_spec **out)
{
    const char *v = getenv("TF_CONFIG");
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "TF_CONFIG: out is NULL");
    if (v == NULL || v[0] == '\0')
        return keel_cluster_spec_new(out);
    return keel_cluster_spec_from_tf_config(v, out);
}

/* ---- TF_CONFIG out ------------------------------------------------------ */

/* The cluster object's jobs: one array of addresses per non-empty job. */
static keel_status
tf_config_jobs(const keel_cluster_spec *s, struct json_object *cl)
{
    for (int t = 1; t < KEEL_TASK_TYPE_COUNT; t++) {
        struct json_object *arr;
        if (s->n[t] == 0)
            continue;
        arr = json_object_new_array();
        if (arr == NULL)
            return keel__fail(KEEL_ENOMEM, "to_tf_config: json");
        json_object_object_add(cl, keel_task_type_name(t), arr);
        for (size_t i = 0; i < s->n[t]; i++)
            json_object_array_add(arr, json_object_new_string(s->addr[t][i]));
    }
    return KEEL_OK;
}

/* Everything of root after "cluster": the task (taking task over), the
 * mode and the optional keys that are set. */
static void
tf_config_fields(const keel_cluster_spec *s, keel_task_type type, int index,
                 struct json_object *root, struct json_object *task)
{
    json_object_object_add(root, "task", task);
    json_object_object_add(task, "type",
                           json_object_new_string(keel_task_type_name(type)));
    json_object_object_add(task, "index", json_object_new_int(index));
    json_object_object_add(root, "mode", json_object_new_string(
        s->mode == KEEL_CLUSTER_ASYNC ? "async" : "sync"));
    if (s->replicas_to_aggregate > 0)
        json_object_object_add(root, "replicas_to_aggregate",
                               json_object_new_int(s->replicas_to_aggregate));
    if (s->total_num_replicas > 0)
        json_object_object_add(root, "total_num_replicas",
                               json_object_new_int(s->total_num_replicas));
    if (s->model_dir != NULL)
        json_object_object_add(root, "model_dir",
                               json_object_new_string(s->model_dir));
}

/* root as one line of JSON into buf (size bytes, NUL included). */
static keel_status
tf_config_write(struct json_object *root, char *buf, size_t size)
{
    const char *text;
    size_t len;
    text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN |
                                          JSON_C_TO_STRING_NOSLASHESCAPE);
    if (text == NULL)
        return keel__fail(KEEL_ENOMEM, "to_tf_config: serialize");
    len = strlen(text);
    if (len >= size)
        return keel__fail(KEEL_EINVAL, "to_tf_config: needs %zu bytes, "
                          "buffer has %zu", len + 1, size);
    memcpy(buf, text, len + 1);
    return KEEL_OK;
}

keel_status
keel_cluster_spec_to_tf_config(const keel_cluster_spec *s,
                               keel_task_type type, int index, char *buf,
                               size_t size)
{
    struct json_object *root = NULL, *cl, *task;
    keel_status st;

    if (s == NULL || buf == NULL || size == 0)
        return keel__fail(KEEL_EINVAL, "to_tf_config: bad argument");
    if (!keel__task_type_ok(type) || index < 0 ||
        ((size_t)index >= s->n[type] &&
         !(type == KEEL_TASK_EVALUATOR && index == 0)))
        return keel__fail(KEEL_EINVAL, "to_tf_config: no task %s %d in the "
                          "cluster", keel_task_type_name(type), index);
    root = json_object_new_object();
    cl = json_object_new_object();
    task = json_object_new_object();
    if (root == NULL || cl == NULL || task == NULL) {
        json_object_put(cl);
        json_object_put(task);
        st = keel__fail(KEEL_ENOMEM, "to_tf_config: json");
        goto out;
    }
    json_object_object_add(root, "cluster", cl);
    if ((st = tf_config_jobs(s, cl)) != KEEL_OK) {
        json_object_put(task);
        goto out;
    }
    tf_config_fields(s, type, index, root, task);
    st = tf_config_write(root, buf, size);
out:
    json_object_put(root);
    return st;
}
