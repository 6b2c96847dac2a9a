/* vars.c - the variable store: named variables in creation order, a hash
 * index for constant-time lookup by name, optimizer slots per variable and
 * the global step. Names are path-like and double as checkpoint names. */
#include <config.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <keel/tensor.h>
#include "util.h"
#include "grow.h"
#include "numeric_int.h"

typedef struct slot {
    char *name;
    keel_tensor t;
} slot;

struct keel_var {
    char *name;
    keel_tensor t;
    unsigned flags;
    int is_initialized;
    size_t index;
    slot **slots;        /* each slot allocated alone: pointers stay valid */
    size_t n_slots;
    keel__row_source row_src;  /* KEEL_VAR_ROWS on a worker, else NULL */
    void *row_ctx;
};

struct keel_vars {
    keel_var **vars;     /* creation order */
    size_t n, cap;
    size_t *index;       /* open addressing: position + 1, 0 = empty */
    size_t index_cap;    /* power of two, >= 2 * n */
    int64_t global_step;
};

static uint64_t
hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ULL;     /* FNV-1a */
    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static int
segment_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

static int
name_ok(const char *name, int allow_slash)
{
    size_t len, seg = 0;
    const char *seg_start;
    if (name == NULL)
        return 0;
    len = strlen(name);
    if (len == 0 || len >= KEEL_NAME_MAX)
        return 0;
    seg_start = name;
    for (const char *p = name;; p++) {
        if (*p == '/' || *p == '\0') {
            if (seg == 0)
                return 0;
            if ((seg == 1 && seg_start[0] == '.') ||
                (seg == 2 && seg_start[0] == '.' && seg_start[1] == '.'))
                return 0;
            if (*p == '\0')
                return 1;
            if (!allow_slash)
                return 0;
            seg = 0;
            seg_start = p + 1;
            continue;
        }
        if (!segment_char_ok(*p))
            return 0;
        seg++;
    }
}

int
keel_name_is_valid(const char *name)
{
    return name_ok(name, 1);
}

keel_status
keel_vars_new(keel_vars **out)
{
    keel_vars *vs;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "vars: out is NULL");
    *out = NULL;
    vs = calloc(1, sizeof *vs);
    if (vs == NULL)
        return keel__fail(KEEL_ENOMEM, "vars: %zu bytes", sizeof *vs);
    *out = vs;
    return KEEL_OK;
}

static void
var_free(keel_var *v)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < v->n_slots; i++) {
        free(v->slots[i]->name);
        keel_tensor_release(&v->slots[i]->t);
        free(v->slots[i]);
    }
    free(v->slots);
    keel_tensor_release(&v->t);
    free(v->name);
    free(v);
}

void
keel_vars_free(keel_vars *vs)
{
    if (vs == NULL)
        return;
    for (size_t i = 0; i < vs->n; i++)
        var_free(vs->vars[i]);
    free(vs->vars);
    free(vs->index);
    free(vs);
}

static size_t
index_probe(const keel_vars *vs, const char *name, int *found)
{
    size_t mask = vs->index_cap - 1;
    size_t i = (size_t)hash_name(name) & mask;
    for (;;) {
        size_t slot_val = vs->index[i];
        if (slot_val == 0) {
            *found = 0;
            return i;
        }
        if (strcmp(vs->vars[slot_val - 1]->name, name) == 0) {
            *found = 1;
            return i;
        }
        i = (i + 1) & mask;
    }
}

static keel_status
index_grow(keel_vars *vs)
{
    size_t cap = vs->index_cap ? vs->index_cap * 2 : 16;
    size_t *idx = calloc(cap, sizeof *idx);
    if (idx == NULL)
        return keel__fail(KEEL_ENOMEM, "vars: index of %zu entries", cap);
    free(vs->index);
    vs->index = idx;
    vs->index_cap = cap;
    for (size_t k = 0; k < vs->n; k++) {
        int found;
        size_t i = index_probe(vs, vs->vars[k]->name, &found);
        vs->index[i] = k + 1;
    }
    return KEEL_OK;
}

keel_var *
keel_vars_find(const keel_vars *vs, const char *name)
{
    int found;
    size_t i;
    if (vs == NULL || name == NULL || vs->index_cap == 0)
        return NULL;
    i = index_probe(vs, name, &found);
    return found ? vs->vars[vs->index[i] - 1] : NULL;
}

keel_status
keel_vars_create(keel_vars *vs, const char *name, int ndim,
                 const int64_t *shape, unsigned flags, keel_var **out)
{
    keel_var **p;
    keel_var *v;
    keel_status st;
    char shp[96];
    int found;
    size_t pos;

    if (out != NULL)
        *out = NULL;
    if (vs == NULL)
        return keel__fail(KEEL_EINVAL, "vars: store is NULL");
    if (!keel_name_is_valid(name))
        return keel__fail(KEEL_EINVAL, "variable name '%s' is invalid: use "
                          "[A-Za-z0-9_.-] segments joined by '/', at most "
                          "%d bytes", name != NULL ? name : "(null)",
                          KEEL_NAME_MAX - 1);
    if (keel_vars_find(vs, name) != NULL)
        return keel__fail(KEEL_EINVAL, "variable '%s' already exists", name);
    if ((vs->n + 1) * 2 > vs->index_cap) {
        st = index_grow(vs);
        if (st != KEEL_OK)
            return st;
    }
    p = keel__grow(vs->vars, &vs->cap, vs->n, sizeof *p, 16);
    if (p == NULL)
        return keel__fail(KEEL_ENOMEM, "variable '%s': no room in the "
                          "store for %zu entries", name, vs->n + 1);
    vs->vars = p;
    v = calloc(1, sizeof *v);
    if (v == NULL)
        return keel__fail(KEEL_ENOMEM, "variable '%s'", name);
    v->name = strdup(name);
    if (v->name == NULL) {
        var_free(v);
        return keel__fail(KEEL_ENOMEM, "variable '%s'", name);
    }
    st = keel_tensor_alloc(&v->t, ndim, shape);
    if (st != KEEL_OK) {
        var_free(v);
        if (st == KEEL_EINVAL && ndim >= 0 && ndim <= KEEL_MAX_DIMS &&
            shape != NULL)
            return keel__wrap(st, "variable '%s' shape %s", name,
                              keel_shape_format(shp, sizeof shp, ndim, shape));
        return keel__wrap(st, "variable '%s'", name);
    }
    v->flags = flags;
    v->index = vs->n;
    pos = index_probe(vs, name, &found);
    vs->vars[vs->n++] = v;
    vs->index[pos] = vs->n;
    if (out != NULL)
        *out = v;
    return KEEL_OK;
}

size_t
keel_vars_count(const keel_vars *vs)
{
    return vs != NULL ? vs->n : 0;
}

keel_var *
keel_vars_at(const keel_vars *vs, size_t i)
{
    return vs != NULL && i < vs->n ? vs->vars[i] : NULL;
}

size_t
keel_vars_bytes(const keel_vars *vs, int with_slots)
{
    size_t total = 0;
    if (vs == NULL)
        return 0;
    for (size_t i = 0; i < vs->n; i++) {
        total += keel_tensor_bytes(&vs->vars[i]->t);
        if (with_slots)
            for (size_t k = 0; k < vs->vars[i]->n_slots; k++)
                total += keel_tensor_bytes(&vs->vars[i]->slots[k]->t);
    }
    return total;
}

int64_t
keel_vars_global_step(const keel_vars *vs)
{
    return vs != NULL ? vs->global_step : 0;
}

int64_t *
keel__vars_global_step_ptr(keel_vars *vs)
{
    return &vs->global_step;
}

void
keel_vars_set_global_step(keel_vars *vs, int64_t step)
{
    if (vs != NULL)
        vs->global_step = step;
}

void
keel_vars_set_all_initialized(keel_vars *vs, int is_initialized)
{
    if (vs == NULL)
        return;
    for (size_t i = 0; i < vs->n; i++)
        vs->vars[i]->is_initialized = is_initialized != 0;
}

size_t
keel_vars_uninitialized(const keel_vars *vs, char *buf, size_t size)
{
    size_t count = 0, used = 0;
    int truncated = 0;
    if (buf != NULL && size > 0)
        buf[0] = '\0';
    if (vs == NULL)
        return 0;
    for (size_t i = 0; i < vs->n; i++) {
        const keel_var *v = vs->vars[i];
        size_t len;
        if (v->is_initialized)
            continue;
        count++;
        if (buf == NULL || size == 0 || truncated)
            continue;
        len = strlen(v->name) + (used > 0 ? 2 : 0);
        if (used + len + 4 >= size) {
            snprintf(buf + used, size - used, "%s...", used > 0 ? ", " : "");
            truncated = 1;
            continue;
        }
        used += (size_t)snprintf(buf + used, size - used, "%s%s",
                                 used > 0 ? ", " : "", v->name);
    }
    return count;
}

const char *
keel_var_name(const keel_var *v)
{
    return v != NULL ? v->name : NULL;
}

keel_tensor *
keel_var_tensor(keel_var *v)
{
    return v != NULL ? &v->t : NULL;
}

unsigned
keel_var_flags(const keel_var *v)
{
    return v != NULL ? v->flags : 0;
}

void
keel__var_set_row_source(keel_var *v, keel__row_source fn, void *ctx)
{
    if (v == NULL)
        return;
    v->row_src = fn;
    v->row_ctx = fn != NULL ? ctx : NULL;
}

keel_status
keel_var_gather_rows(keel_var *v, size_t n, const int64_t *ids, float *out)
{
    size_t row;
    if (v == NULL || (n > 0 && (ids == NULL || out == NULL)))
        return keel__fail(KEEL_EINVAL, "gather rows: NULL argument");
    if (v->t.ndim < 1 || v->t.shape[0] < 1)
        return keel__fail(KEEL_EINVAL, "gather rows of '%s': a scalar or "
                          "empty variable", v->name);
    for (size_t k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= v->t.shape[0])
            return keel__fail(KEEL_EINVAL, "gather rows of '%s': id %lld "
                              "(entry %zu) is outside [0, %lld)", v->name,
                              (long long)ids[k], k,
                              (long long)v->t.shape[0]);
    if (n == 0)
        return KEEL_OK;
    if (v->row_src != NULL)
        return v->row_src(v->row_ctx, v, n, ids, out);
    row = v->t.count / (size_t)v->t.shape[0];
    for (size_t k = 0; k < n; k++)
        memcpy(out + k * row, v->t.data + (size_t)ids[k] * row,
               row * sizeof *out);
    return KEEL_OK;
}

int
keel_var_is_trainable(const keel_var *v)
{
    return v != NULL && (v->flags & KEEL_VAR_TRAINABLE) != 0;
}

int
keel_var_is_initialized(const keel_var *v)
{
    return v != NULL && v->is_initialized;
}

void
keel_var_set_initialized(keel_var *v, int is_initialized)
{
    if (v != NULL)
        v->is_initialized = is_initialized != 0;
}

size_t
keel_var_index(const keel_var *v)
{
    return v != NULL ? v->index : 0;
}

keel_tensor *
keel_var_slot(keel_var *v, const char *slot_name)
{
    if (v == NULL || slot_name == NULL)
        return NULL;
    for (size_t i = 0; i < v->n_slots; i++)
        if (strcmp(v->slots[i]->name, slot_name) == 0)
            return &v->slots[i]->t;
    return NULL;
}

keel_status
keel_var_add_slot(keel_var *v, const char *slot_name, keel_tensor **out)
{
    slot *p, **pp;
    keel_tensor *existing;
    keel_status st;

    if (out != NULL)
        *out = NULL;
    if (v == NULL)
        return keel__fail(KEEL_EINVAL, "slot: variable is NULL");
    if (!name_ok(slot_name, 0))
        return keel__fail(KEEL_EINVAL, "slot name '%s' for variable '%s' is "
                          "invalid: one segment of [A-Za-z0-9_.-]",
                          slot_name != NULL ? slot_name : "(null)", v->name);
    existing = keel_var_slot(v, slot_name);
    if (existing != NULL) {
        if (out != NULL)
            *out = existing;
        return KEEL_OK;
    }
    /* Slots are few per variable (at most a handful); grow one by one. */
    pp = realloc(v->slots, (v->n_slots + 1) * sizeof *pp);
    if (pp == NULL)
        return keel__fail(KEEL_ENOMEM, "slot '%s' of '%s'", slot_name,
                          v->name);
    v->slots = pp;
    p = calloc(1, sizeof *p);
    if (p == NULL || (p->name = strdup(slot_name)) == NULL) {
        free(p);
        return keel__fail(KEEL_ENOMEM, "slot '%s' of '%s'", slot_name,
                          v->name);
    }
    st = keel_tensor_alloc(&p->t, v->t.ndim, v->t.shape);
    if (st != KEEL_OK) {
        free(p->name);
        free(p);
        return keel__wrap(st, "slot '%s' of '%s'", slot_name, v->name);
    }
    v->slots[v->n_slots++] = p;
    if (out != NULL)
        *out = &p->t;
    return KEEL_OK;
}

size_t
keel_var_slot_count(const keel_var *v)
{
    return v != NULL ? v->n_slots : 0;
}

keel_tensor *
keel_var_slot_at(keel_var *v, size_t i, const char **name)
{
    if (v == NULL || i >= v->n_slots) {
        if (name != NULL)
            *name = NULL;
        return NULL;
    }
    if (name != NULL)
        *name = v->slots[i]->name;
    return &v->slots[i]->t;
}

/* ---- gradients ----------------------------------------------------------- */

/* A variable's gradient rows: as added (seq order) until coalesced, then
 * sorted by id with duplicates summed. */
typedef struct grad_rows {
    int64_t *ids;
    float *rows;         /* n x row floats */
    size_t n, cap;
    size_t row;          /* floats per row: the variable's count / shape[0] */
    int is_coalesced;
    size_t *order;       /* coalescing's permutation, cap entries */
    float *tmp;          /* coalescing's output rows, cap x row floats */
    int dense_written;   /* a row variable's dense gradient was written
                          * (keel_grads_densify) since it was zeroed */
} grad_rows;

struct keel_grads {
    const keel_vars *vs;
    keel_tensor *t;      /* one per variable; empty (data NULL) if frozen */
    grad_rows *rows;     /* one per variable, all empty until rows are added */
    size_t n;
    int64_t examples;    /* what the gradients are the mean over */
    keel__metrics metrics;
};

keel_status
keel_grads_new(const keel_vars *vs, keel_grads **out)
{
    keel_grads *g;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "grads: out is NULL");
    *out = NULL;
    if (vs == NULL)
        return keel__fail(KEEL_EINVAL, "grads: store is NULL");
    g = calloc(1, sizeof *g);
    if (g == NULL)
        return keel__fail(KEEL_ENOMEM, "grads: %zu bytes", sizeof *g);
    g->vs = vs;
    g->n = vs->n;
    g->examples = 1;
    if (vs->n > 0) {
        g->t = calloc(vs->n, sizeof *g->t);
        g->rows = calloc(vs->n, sizeof *g->rows);
        if (g->t == NULL || g->rows == NULL) {
            free(g->t);
            free(g->rows);
            free(g);
            return keel__fail(KEEL_ENOMEM, "grads: %zu entries", vs->n);
        }
    }
    for (size_t i = 0; i < vs->n; i++) {
        const keel_var *v = vs->vars[i];
        keel_status st;
        if (!keel_var_is_trainable(v))
            continue;
        st = keel_tensor_alloc(&g->t[i], v->t.ndim, v->t.shape);
        if (st != KEEL_OK) {
            keel_grads_free(g);
            return keel__wrap(st, "gradient of '%s'", v->name);
        }
    }
    *out = g;
    return KEEL_OK;
}

void
keel_grads_free(keel_grads *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->n; i++) {
        keel_tensor_release(&g->t[i]);
        free(g->rows[i].ids);
        free(g->rows[i].rows);
        free(g->rows[i].order);
        free(g->rows[i].tmp);
    }
    free(g->t);
    free(g->rows);
    free(g);
}

const keel_vars *
keel_grads_vars(const keel_grads *g)
{
    return g != NULL ? g->vs : NULL;
}

size_t
keel_grads_count(const keel_grads *g)
{
    return g != NULL ? g->n : 0;
}

keel_tensor *
keel_grads_at(keel_grads *g, size_t i)
{
    if (g == NULL || i >= g->n || g->t[i].data == NULL)
        return NULL;
    return &g->t[i];
}

keel_status
keel_grads_set_examples(keel_grads *g, int64_t n)
{
    if (g == NULL)
        return keel__fail(KEEL_EINVAL, "grads: set_examples on NULL");
    if (n < 1 || n > KEEL_GRADS_MAX_EXAMPLES)
        return keel__fail(KEEL_EINVAL, "grads: %lld examples (a step's "
                          "gradient is the mean over 1..%d examples)",
                          (long long)n, KEEL_GRADS_MAX_EXAMPLES);
    g->examples = n;
    return KEEL_OK;
}

int64_t
keel_grads_examples(const keel_grads *g)
{
    return g != NULL ? g->examples : 1;
}

keel__metrics *
keel__grads_metrics(keel_grads *g)
{
    return g != NULL ? &g->metrics : NULL;
}

void
keel__metrics_combine_begin(keel__metrics *m)
{
    m->n_combined = 0;
    m->n_kept = 0;
    for (int k = 0; k < KEEL__METRICS_MAX; k++)
        m->total_sum[k] = m->total_count[k] = 0.0;
}

void
keel__metrics_combine_add(keel__metrics *m, int replica, const double *sum,
                          const double *count)
{
    for (int k = 0; k < m->n; k++) {
        m->total_sum[k] += sum[k];
        m->total_count[k] += count[k];
    }
    m->n_combined++;
    if (m->n_kept < KEEL__METRICS_REPLICAS) {
        int i = m->n_kept++;
        m->replica[i] = replica;
        for (int k = 0; k < m->n; k++) {
            m->rsum[i][k] = sum[k];
            m->rcount[i][k] = count[k];
        }
    }
}

keel_tensor *
keel_grads_find(keel_grads *g, const char *name)
{
    keel_var *v;
    if (g == NULL)
        return NULL;
    v = keel_vars_find(g->vs, name);
    return v != NULL ? keel_grads_at(g, v->index) : NULL;
}

void
keel_grads_zero(keel_grads *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->n; i++) {
        /* a row variable's dense gradient is written only by densify:
         * untouched, its pages stay unmapped */
        int skip = (g->vs->vars[i]->flags & KEEL_VAR_ROWS) &&
                   !g->rows[i].dense_written;
        if (g->t[i].data != NULL && !skip)
            memset(g->t[i].data, 0, keel_tensor_bytes(&g->t[i]));
        g->rows[i].n = 0;
        g->rows[i].dense_written = 0;
    }
}

/* ---- gradient rows ------------------------------------------------------- */

static keel_status
rows_reserve(grad_rows *r, size_t need, const char *name)
{
    size_t cap;
    int64_t *ids;
    float *rows, *tmp;
    size_t *order;
    if (need <= r->cap)
        return KEEL_OK;
    cap = r->cap < 64 ? 64 : r->cap;
    while (cap < need)
        cap *= 2;
    if (cap > KEEL_TENSOR_MAX_BYTES / sizeof(float) / r->row)
        return keel__fail(KEEL_ENOMEM, "gradient rows of '%s': %zu rows of "
                          "%zu floats", name, need, r->row);
    ids = realloc(r->ids, cap * sizeof *ids);
    if (ids != NULL)
        r->ids = ids;
    rows = realloc(r->rows, cap * r->row * sizeof *rows);
    if (rows != NULL)
        r->rows = rows;
    order = realloc(r->order, cap * sizeof *order);
    if (order != NULL)
        r->order = order;
    tmp = realloc(r->tmp, cap * r->row * sizeof *tmp);
    if (tmp != NULL)
        r->tmp = tmp;
    if (ids == NULL || rows == NULL || order == NULL || tmp == NULL)
        return keel__fail(KEEL_ENOMEM, "gradient rows of '%s': %zu rows of "
                          "%zu floats", name, cap, r->row);
    r->cap = cap;
    return KEEL_OK;
}

keel_status
keel_grads_add_rows(keel_grads *g, size_t i, size_t n, const int64_t *ids,
                    const float *rows)
{
    const keel_var *v;
    grad_rows *r;
    int64_t nrows;
    keel_status st;
    if (g == NULL || (n > 0 && (ids == NULL || rows == NULL)))
        return keel__fail(KEEL_EINVAL, "grads: add_rows: NULL argument");
    if (i >= g->n || g->t[i].data == NULL)
        return keel__fail(KEEL_EINVAL, "grads: add_rows: variable %zu has "
                          "no gradient (not trainable, or created after "
                          "the gradients)", i);
    v = g->vs->vars[i];
    if (v->t.ndim < 1)
        return keel__fail(KEEL_EINVAL, "grads: add_rows: '%s' is a scalar "
                          "(rows need a variable of rank >= 1)", v->name);
    nrows = v->t.shape[0];
    for (size_t k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= nrows)
            return keel__fail(KEEL_EINVAL, "grads: add_rows: id %lld (entry "
                              "%zu) is outside the %lld rows of '%s'",
                              (long long)ids[k], k, (long long)nrows,
                              v->name);
    r = &g->rows[i];
    r->row = v->t.count / (size_t)nrows;
    if (n > SIZE_MAX / 2 - r->n)
        return keel__fail(KEEL_ENOMEM, "gradient rows of '%s'", v->name);
    if ((st = rows_reserve(r, r->n + n, v->name)) != KEEL_OK)
        return st;
    memcpy(r->ids + r->n, ids, n * sizeof *ids);
    memcpy(r->rows + r->n * r->row, rows, n * r->row * sizeof *rows);
    r->n += n;
    r->is_coalesced = 0;
    return KEEL_OK;
}

/* Ascending id, then ascending position: a total order, so the sort's
 * result is the same whatever the algorithm. */
static _Thread_local const int64_t *sort_ids;

static int
cmp_id_seq(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    if (sort_ids[x] != sort_ids[y])
        return sort_ids[x] < sort_ids[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Sort by id; each id's rows summed in the order they were added. */
static void
rows_coalesce(grad_rows *r)
{
    size_t u = 0, row = r->row;
    if (r->is_coalesced)
        return;
    for (size_t k = 0; k < r->n; k++)
        r->order[k] = k;
    sort_ids = r->ids;
    qsort(r->order, r->n, sizeof *r->order, cmp_id_seq);
    sort_ids = NULL;
    for (size_t k = 0; k < r->n;) {
        size_t first = r->order[k];
        int64_t id = r->ids[first];
        float *dst = r->tmp + u * row;
        memcpy(dst, r->rows + first * row, row * sizeof *dst);
        for (k++; k < r->n && r->ids[r->order[k]] == id; k++) {
            const float *src = r->rows + r->order[k] * row;
            for (size_t c = 0; c < row; c++)
                dst[c] += src[c];
        }
        r->order[u++] = (size_t)id;
    }
    for (size_t k = 0; k < u; k++)
        r->ids[k] = (int64_t)r->order[k];
    memcpy(r->rows, r->tmp, u * row * sizeof *r->rows);
    r->n = u;
    r->is_coalesced = 1;
}

size_t
keel_grads_rows(keel_grads *g, size_t i, const int64_t **ids,
                const float **rows)
{
    grad_rows *r;
    if (ids != NULL)
        *ids = NULL;
    if (rows != NULL)
        *rows = NULL;
    if (g == NULL || i >= g->n || g->rows[i].n == 0)
        return 0;
    r = &g->rows[i];
    rows_coalesce(r);
    if (ids != NULL)
        *ids = r->ids;
    if (rows != NULL)
        *rows = r->rows;
    return r->n;
}

int
keel_grads_has_rows(const keel_grads *g)
{
    if (g == NULL)
        return 0;
    for (size_t i = 0; i < g->n; i++)
        if (g->rows[i].n > 0)
            return 1;
    return 0;
}

void
keel__grads_clear_rows(keel_grads *g, size_t i)
{
    if (g != NULL && i < g->n)
        g->rows[i].n = 0;
}

void
keel_grads_densify(keel_grads *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->n; i++) {
        grad_rows *r = &g->rows[i];
        if (r->n == 0)
            continue;
        rows_coalesce(r);
        r->dense_written = 1;
        for (size_t k = 0; k < r->n; k++) {
            float *dst = g->t[i].data + (size_t)r->ids[k] * r->row;
            const float *src = r->rows + k * r->row;
            for (size_t c = 0; c < r->row; c++)
                dst[c] += src[c];
        }
        r->n = 0;
    }
}
