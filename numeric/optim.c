/* optim.c - learning-rate schedules and optimizers (SGD, Momentum/Nesterov,
 * Adagrad, Adam, RMSProp) with TF1/Keras update formulas. All optimizer
 * state lives in variable slots (checkpointed); Adam's bias correction comes
 * from the global step, so a restored run continues bit for bit. */
#include <config.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <keel/optimizer.h>
#include "util.h"
#include "numeric_int.h"

KEEL__VECTORIZE_FILE

struct opt_task;

struct keel_optimizer {
    keel_optimizer_config cfg;
    struct opt_task *task;        /* apply's work list, reused */
    size_t cap;
    struct opt_call *pending;     /* keel__optimizer_begin's call, run by
                                   * keel__optimizer_part */
};

static const char *const lr_names[] = { "constant", "piecewise",
                                        "exponential" };
static const char *const opt_names[] = { "sgd", "momentum", "adagrad",
                                         "adam", "rmsprop" };

void
keel_lr_schedule_init(keel_lr_schedule *s)
{
    KEEL__STRUCT_INIT(s);
    s->kind = KEEL_LR_CONSTANT;
    s->learning_rate = 0.001;
    s->decay_steps = 1000;
    s->decay_rate = 0.96;
}

KEEL__FROM_NAME(keel_lr_kind_from_name, keel_lr_kind,
                "learning-rate schedule", lr_names)

KEEL__NAME(keel_lr_kind_name, keel_lr_kind, lr_names)

keel_status
keel_lr_schedule_validate(const keel_lr_schedule *s)
{
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "schedule: NULL");
    if (KEEL__STRUCT_CHECK(s, keel_lr_schedule) != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "schedule");
    switch (s->kind) {
    case KEEL_LR_CONSTANT:
    case KEEL_LR_EXPONENTIAL:
        if (!isfinite(s->learning_rate) || s->learning_rate < 0.0)
            return keel__fail(KEEL_EINVAL, "schedule: learning_rate %g must "
                              "be finite and >= 0", s->learning_rate);
        if (s->kind == KEEL_LR_EXPONENTIAL &&
            (s->decay_steps < 1 || !isfinite(s->decay_rate) ||
             s->decay_rate <= 0.0))
            return keel__fail(KEEL_EINVAL, "schedule: exponential needs "
                              "decay_steps >= 1 and decay_rate > 0 (got "
                              "%lld, %g)", (long long)s->decay_steps,
                              s->decay_rate);
        return KEEL_OK;
    case KEEL_LR_PIECEWISE:
        if (s->n_boundaries < 0 || s->n_boundaries >= KEEL_LR_MAX_PIECES)
            return keel__fail(KEEL_EINVAL, "schedule: %d boundaries "
                              "(0..%d)", s->n_boundaries,
                              KEEL_LR_MAX_PIECES - 1);
        for (int i = 0; i < s->n_boundaries; i++)
            if (s->boundaries[i] < 0 ||
                (i > 0 && s->boundaries[i] <= s->boundaries[i - 1]))
                return keel__fail(KEEL_EINVAL, "schedule: boundaries must "
                                  "be >= 0 and strictly increasing (at "
                                  "index %d)", i);
        for (int i = 0; i <= s->n_boundaries; i++)
            if (!isfinite(s->values[i]) || s->values[i] < 0.0)
                return keel__fail(KEEL_EINVAL, "schedule: value %d (%g) "
                                  "must be finite and >= 0", i,
                                  s->values[i]);
        return KEEL_OK;
    }
    return keel__fail(KEEL_EINVAL, "schedule: unknown kind %d", s->kind);
}

double
keel_lr_at(const keel_lr_schedule *s, int64_t step)
{
    if (step < 0)
        step = 0;
    switch (s->kind) {
    case KEEL_LR_PIECEWISE: {
        int i = 0;
        while (i < s->n_boundaries && step >= s->boundaries[i])
            i++;
        return s->values[i];
    }
    case KEEL_LR_EXPONENTIAL: {
        double p;
        if (s->staircase)
            p = (double)(step / s->decay_steps);
        else
            p = (double)step / (double)s->decay_steps;
        return s->learning_rate * pow(s->decay_rate, p);
    }
    default:
        return s->learning_rate;
    }
}

static keel_status
parse_list(const char *what, const char *s, int max, int is_int,
           int64_t *iv, double *dv, int *n)
{
    const char *p = s;
    *n = 0;
    if (s == NULL || *s == '\0')
        return KEEL_OK;
    for (;;) {
        char buf[64];
        size_t len = strcspn(p, ",");
        if (*n == max)
            return keel__fail(KEEL_EINVAL, "%s '%s': at most %d entries",
                              what, s, max);
        if (len == 0 || len >= sizeof buf)
            return keel__fail(KEEL_EINVAL, "%s '%s': empty or overlong "
                              "entry", what, s);
        memcpy(buf, p, len);
        buf[len] = '\0';
        if (is_int ? !keel__parse_i64(buf, 0, INT64_MAX, &iv[*n])
                   : !keel__parse_double(buf, &dv[*n]))
            return keel__fail(KEEL_EINVAL, "%s '%s': bad number '%s'", what,
                              s, buf);
        (*n)++;
        p += len;
        if (*p == '\0')
            return KEEL_OK;
        p++;
    }
}

keel_status
keel_lr_parse_piecewise(const char *boundaries, const char *values,
                        keel_lr_schedule *s)
{
    int nb, nv;
    keel_status st;
    keel_lr_schedule t = *s;
    st = parse_list("piecewise boundaries", boundaries,
                    KEEL_LR_MAX_PIECES - 1, 1, t.boundaries, NULL, &nb);
    if (st != KEEL_OK)
        return st;
    st = parse_list("piecewise values", values, KEEL_LR_MAX_PIECES, 0, NULL,
                    t.values, &nv);
    if (st != KEEL_OK)
        return st;
    if (nv != nb + 1)
        return keel__fail(KEEL_EINVAL, "piecewise schedule: %d boundaries "
                          "need %d values, got %d", nb, nb + 1, nv);
    t.kind = KEEL_LR_PIECEWISE;
    t.n_boundaries = nb;
    if ((st = keel_lr_schedule_validate(&t)) != KEEL_OK)
        return st;
    *s = t;
    return KEEL_OK;
}

void
keel_optimizer_config_init(keel_optimizer_config *cfg,
                           keel_optimizer_kind kind)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->kind = kind;
    keel_lr_schedule_init(&cfg->schedule);
    cfg->momentum = kind == KEEL_OPT_MOMENTUM ? 0.9 : 0.0;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->epsilon = 1e-7;
    cfg->rho = 0.9;
    cfg->initial_accumulator_value = 0.1;
    if (kind == KEEL_OPT_SGD || kind == KEEL_OPT_MOMENTUM)
        cfg->schedule.learning_rate = 0.01;
}

KEEL__FROM_NAME(keel_optimizer_kind_from_name, keel_optimizer_kind,
                "optimizer", opt_names)

KEEL__NAME(keel_optimizer_kind_name, keel_optimizer_kind, opt_names)

keel_status
keel_optimizer_new(const keel_optimizer_config *cfg, keel_optimizer **out)
{
    keel_optimizer *o;
    keel_status st;
    if (out != NULL)
        *out = NULL;
    st = KEEL__CONFIG_CHECK(cfg, out, keel_optimizer_config, "optimizer");
    if (st != KEEL_OK)
        return st;
    if ((unsigned)cfg->kind > KEEL_OPT_RMSPROP)
        return keel__fail(KEEL_EINVAL, "optimizer: unknown kind %d",
                          cfg->kind);
    if ((st = keel_lr_schedule_validate(&cfg->schedule)) != KEEL_OK)
        return keel__wrap(st, "optimizer %s",
                          keel_optimizer_kind_name(cfg->kind));
    if (!(cfg->momentum >= 0.0 && cfg->momentum < 1.0) ||
        !(cfg->beta1 >= 0.0 && cfg->beta1 < 1.0) ||
        !(cfg->beta2 >= 0.0 && cfg->beta2 < 1.0) ||
        !(cfg->rho >= 0.0 && cfg->rho < 1.0))
        return keel__fail(KEEL_EINVAL, "optimizer %s: momentum, beta1, beta2 "
                          "and rho must be in [0, 1)",
                          keel_optimizer_kind_name(cfg->kind));
    if (!(cfg->epsilon >= 0.0) || !isfinite(cfg->epsilon) ||
        !(cfg->initial_accumulator_value >= 0.0) ||
        !isfinite(cfg->initial_accumulator_value))
        return keel__fail(KEEL_EINVAL, "optimizer %s: epsilon and "
                          "initial_accumulator_value must be finite and >= 0",
                          keel_optimizer_kind_name(cfg->kind));
    if (cfg->kind == KEEL_OPT_ADAGRAD &&
        cfg->initial_accumulator_value == 0.0 && cfg->epsilon == 0.0)
        return keel__fail(KEEL_EINVAL, "optimizer adagrad: "
                          "initial_accumulator_value and epsilon are both 0 "
                          "(division by zero)");
    o = calloc(1, sizeof *o);
    if (o == NULL)
        return keel__fail(KEEL_ENOMEM, "optimizer");
    o->cfg = *cfg;
    *out = o;
    return KEEL_OK;
}

void
keel_optimizer_free(keel_optimizer *o)
{
    if (o != NULL) {
        free(o->task);
        free(o->pending);
    }
    free(o);
}

const keel_optimizer_config *
keel_optimizer_get_config(const keel_optimizer *o)
{
    return o != NULL ? &o->cfg : NULL;
}

/* Slots of a kind, NULL-terminated. */
static void
slot_names(const keel_optimizer_config *c, const char *names[3])
{
    names[0] = names[1] = names[2] = NULL;
    switch (c->kind) {
    case KEEL_OPT_MOMENTUM:
        names[0] = "momentum";
        break;
    case KEEL_OPT_ADAGRAD:
        names[0] = "accumulator";
        break;
    case KEEL_OPT_ADAM:
        names[0] = "m";
        names[1] = "v";
        break;
    case KEEL_OPT_RMSPROP:
        names[0] = "rms";
        names[1] = "mom";
        break;
    default:
        break;
    }
}

static keel_status
prepare_var(const keel_optimizer *o, keel_var *v)
{
    const char *names[3];
    slot_names(&o->cfg, names);
    for (int i = 0; names[i] != NULL; i++) {
        keel_tensor *t;
        int existed = keel_var_slot(v, names[i]) != NULL;
        keel_status st = keel_var_add_slot(v, names[i], &t);
        if (st != KEEL_OK)
            return keel__wrap(st, "optimizer: slot '%s' of '%s'", names[i],
                              keel_var_name(v));
        if (!existed && o->cfg.kind == KEEL_OPT_ADAGRAD)
            for (size_t j = 0; j < t->count; j++)
                t->data[j] = (float)o->cfg.initial_accumulator_value;
    }
    return KEEL_OK;
}

keel_status
keel_optimizer_prepare(keel_optimizer *o, keel_vars *vs)
{
    if (o == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "optimizer prepare: NULL argument");
    for (size_t i = 0; i < keel_vars_count(vs); i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_status st;
        if (!keel_var_is_trainable(v))
            continue;
        if ((st = prepare_var(o, v)) != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

static keel_status
need_slot(keel_var *v, const char *slot, float **out)
{
    keel_tensor *t = keel_var_slot(v, slot);
    if (t == NULL)
        return keel__fail(KEEL_ESTATE, "optimizer: variable '%s' has no "
                          "slot '%s' (call keel_optimizer_prepare first)",
                          keel_var_name(v), slot);
    *out = t->data;
    return KEEL_OK;
}

/* The update kernels (float32, elementwise, no FMA contraction). */

static KEEL__HOT void
sgd_update(float *restrict x, const float *restrict g, size_t n, float lr)
{
    for (size_t i = 0; i < n; i++)
        x[i] -= lr * g[i];
}

/* TF ApplyMomentum == PyTorch SGD(momentum, dampening 0):
 * a = mu a + g; x -= lr a   (Nesterov: x -= lr (g + mu a)) */
static KEEL__HOT void
momentum_update(float *restrict x, float *restrict a, const float *restrict g,
                size_t n, float lr, float mu, int nesterov)
{
    if (nesterov)
        for (size_t i = 0; i < n; i++) {
            a[i] = mu * a[i] + g[i];
            x[i] -= lr * (g[i] + mu * a[i]);
        }
    else
        for (size_t i = 0; i < n; i++) {
            a[i] = mu * a[i] + g[i];
            x[i] -= lr * a[i];
        }
}

/* Keras Adagrad: a += g^2; x -= lr g / (sqrt(a) + eps) */
static KEEL__HOT void
adagrad_update(float *restrict x, float *restrict a, const float *restrict g,
               size_t n, float lr, float eps)
{
    for (size_t i = 0; i < n; i++) {
        a[i] += g[i] * g[i];
        x[i] -= lr * g[i] / (sqrtf(a[i]) + eps);
    }
}

/* TF1 ApplyAdam: t = step + 1, lr_t = lr sqrt(1 - b2^t) / (1 - b1^t),
 * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; x -= lr_t m / (sqrt(v) + eps) */
static KEEL__HOT void
adam_update(float *restrict x, float *restrict m, float *restrict v,
            const float *restrict g, size_t n, float lr_t, float b1,
            float b2, float eps)
{
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        x[i] -= lr_t * m[i] / (sqrtf(v[i]) + eps);
    }
}

/* TF1 ApplyRMSProp: ms = rho ms + (1-rho) g^2;
 * mom = mu mom + lr g / sqrt(ms + eps); x -= mom */
static KEEL__HOT void
rmsprop_update(float *restrict x, float *restrict ms, float *restrict mom,
               const float *restrict g, size_t n, float lr, float rho,
               float mu, float eps)
{
    for (size_t i = 0; i < n; i++) {
        ms[i] = rho * ms[i] + (1.0f - rho) * g[i] * g[i];
        mom[i] = mu * mom[i] + lr * g[i] / sqrtf(ms[i] + eps);
        x[i] -= mom[i];
    }
}

/* Below this many elements an update stays on the calling thread. */
#define OPT_PARALLEL_MIN 65536
/* With zeroing, each block of a gradient is zeroed right after the update
 * has read it (still in L1). */
#define ZERO_BLOCK 4096

/* One variable's update, resolved and checked once per apply. */
typedef struct opt_task {
    float *x, *s1, *s2;
    float *g;                     /* written only when zeroing */
    size_t n;
    size_t var;                   /* apply_all: store index + 1 of a
                                   * variable updated by rows, else 0 */
} opt_task;

/* One apply: the constants of the step and the variables' tasks, split
 * over threads in equal ranges of their concatenated elements (bounds
 * multiples of 16 floats: no shared cache line). Elementwise, so the bits
 * never depend on the split. */
typedef struct opt_call {
    const keel_optimizer_config *c;
    float lr;                     /* adam: lr_t, bias correction folded in */
    const opt_task *task;
    size_t ntask, total;
    int zero;
    int nthreads;
} opt_call;

/* Check v against grad and find its slots. */
static keel_status
make_task(const keel_optimizer_config *c, keel_var *v,
          const keel_tensor *grad, opt_task *k)
{
    keel_tensor *w = keel_var_tensor(v);
    keel_status st = KEEL_OK;
    if (grad == NULL || grad->data == NULL)
        return keel__fail(KEEL_EINVAL, "optimizer apply: no gradient for "
                          "'%s' (gradients made before it was created?)",
                          keel_var_name(v));
    if (!keel_shape_equal(w->ndim, w->shape, grad->ndim, grad->shape))
        return keel__fail(KEEL_EINVAL, "optimizer apply: gradient shape of "
                          "'%s' does not match the variable",
                          keel_var_name(v));
    *k = (opt_task){ .x = w->data, .g = grad->data, .n = w->count };
    switch (c->kind) {
    case KEEL_OPT_SGD:
        break;
    case KEEL_OPT_MOMENTUM:
        st = need_slot(v, "momentum", &k->s1);
        break;
    case KEEL_OPT_ADAGRAD:
        st = need_slot(v, "accumulator", &k->s1);
        break;
    case KEEL_OPT_ADAM:
        if ((st = need_slot(v, "m", &k->s1)) == KEEL_OK)
            st = need_slot(v, "v", &k->s2);
        break;
    case KEEL_OPT_RMSPROP:
        if ((st = need_slot(v, "rms", &k->s1)) == KEEL_OK)
            st = need_slot(v, "mom", &k->s2);
        break;
    }
    return st;
}

static float
step_lr(const keel_optimizer_config *c, int64_t global_step)
{
    double lr = keel_lr_at(&c->schedule, global_step);
    if (c->kind == KEEL_OPT_ADAM) {
        double t = (double)global_step + 1.0;
        lr = lr * sqrt(1.0 - pow(c->beta2, t)) / (1.0 - pow(c->beta1, t));
    }
    return (float)lr;
}

/* Elements [lo, hi) of one task. */
static void
update_range(const opt_call *a, const opt_task *k, size_t lo, size_t hi)
{
    const keel_optimizer_config *c = a->c;
    for (size_t off = lo; off < hi;) {
        size_t n = !a->zero ? hi - off
                   : hi - off < ZERO_BLOCK ? hi - off : ZERO_BLOCK;
        float *x = k->x + off, *s1 = k->s1 ? k->s1 + off : NULL;
        float *s2 = k->s2 ? k->s2 + off : NULL;
        const float *g = k->g + off;
        switch (c->kind) {
        case KEEL_OPT_SGD:
            sgd_update(x, g, n, a->lr);
            break;
        case KEEL_OPT_MOMENTUM:
            momentum_update(x, s1, g, n, a->lr, (float)c->momentum,
                            c->use_nesterov);
            break;
        case KEEL_OPT_ADAGRAD:
            adagrad_update(x, s1, g, n, a->lr, (float)c->epsilon);
            break;
        case KEEL_OPT_ADAM:
            adam_update(x, s1, s2, g, n, a->lr, (float)c->beta1,
                        (float)c->beta2, (float)c->epsilon);
            break;
        case KEEL_OPT_RMSPROP:
            rmsprop_update(x, s1, s2, g, n, a->lr, (float)c->rho,
                           (float)c->momentum, (float)c->epsilon);
            break;
        }
        if (a->zero)
            memset(k->g + off, 0, n * sizeof *k->g);
        off += n;
    }
}

/* Rows of one variable: the dense kernels on each given row of the
 * variable and its slots (TF's sparse applies; Adam is LazyAdam). */
static void
update_rows(const opt_call *a, const opt_task *k, size_t n,
            const int64_t *ids, const float *rows, size_t row)
{
    for (size_t r = 0; r < n; r++) {
        size_t off = (size_t)ids[r] * row;
        opt_task one = { .x = k->x + off,
                         .s1 = k->s1 ? k->s1 + off : NULL,
                         .s2 = k->s2 ? k->s2 + off : NULL,
                         .g = (float *)(rows + r * row), .n = row };
        opt_call c = *a;
        c.zero = 0;
        update_range(&c, &one, 0, row);
    }
}

/* Check rows against v: ids strictly increasing and below its rows. */
static keel_status
check_rows(keel_var *v, size_t n, const int64_t *ids, const float *rows,
           size_t *row)
{
    keel_tensor *w = keel_var_tensor(v);
    if (w->ndim < 1)
        return keel__fail(KEEL_EINVAL, "optimizer apply: '%s' is a scalar "
                          "(rows need rank >= 1)", keel_var_name(v));
    if (n > 0 && (ids == NULL || rows == NULL))
        return keel__fail(KEEL_EINVAL, "optimizer apply: rows of '%s': "
                          "NULL ids or rows", keel_var_name(v));
    for (size_t r = 0; r < n; r++)
        if (ids[r] < 0 || ids[r] >= w->shape[0] ||
            (r > 0 && ids[r] <= ids[r - 1]))
            return keel__fail(KEEL_EINVAL, "optimizer apply: rows of '%s': "
                              "id %lld (entry %zu) is outside [0, %lld) or "
                              "not above the one before", keel_var_name(v),
                              (long long)ids[r], r, (long long)w->shape[0]);
    *row = w->count / (size_t)w->shape[0];
    return KEEL_OK;
}

/* Thread t's share of the concatenated elements of every task. */
static void
apply_worker(void *ctx, int t)
{
    const opt_call *a = ctx;
    size_t T = (size_t)a->nthreads, base = 0;
    size_t lo = (a->total * (size_t)t / T) & ~(size_t)15;
    size_t hi = (size_t)t + 1 == T ? a->total
                                   : (a->total * ((size_t)t + 1) / T) &
                                         ~(size_t)15;
    for (size_t i = 0; i < a->ntask && base < hi; i++) {
        const opt_task *k = &a->task[i];
        size_t b = lo > base ? lo - base : 0;
        size_t e = hi - base < k->n ? hi - base : k->n;
        if (b < e)
            update_range(a, k, b, e);
        base += k->n;
    }
}

static keel_status
optimizer_apply_var_fp(keel_optimizer *o, keel_var *v,
                       const keel_tensor *grad, int64_t global_step)
{
    opt_task k;
    opt_call a;
    keel_status st;
    if (o == NULL || v == NULL || grad == NULL || grad->data == NULL)
        return keel__fail(KEEL_EINVAL, "optimizer apply: NULL argument");
    if (global_step < 0)
        return keel__fail(KEEL_EINVAL, "optimizer apply: negative global "
                          "step %lld", (long long)global_step);
    if ((st = make_task(&o->cfg, v, grad, &k)) != KEEL_OK)
        return st;
    a = (opt_call){ .c = &o->cfg, .lr = step_lr(&o->cfg, global_step),
                    .task = &k, .ntask = 1, .total = k.n, .nthreads = 1 };
    KEEL__PROF_BEGIN();
    update_range(&a, &k, 0, k.n);
    KEEL__CORE_PROF_END(optimizer_ns);
    return KEEL_OK;
}

keel_status
keel_optimizer_apply_var(keel_optimizer *o, keel_var *v,
                         const keel_tensor *grad, int64_t global_step)
{
    return KEEL__FLUSHED(optimizer_apply_var_fp(o, v, grad, global_step));
}

static keel_status
optimizer_apply_rows_fp(keel_optimizer *o, keel_var *v, size_t n,
                        const int64_t *ids, const float *rows,
                        int64_t global_step)
{
    opt_task k;
    opt_call a;
    keel_status st;
    size_t row;
    if (o == NULL || v == NULL)
        return keel__fail(KEEL_EINVAL, "optimizer apply: NULL argument");
    if (global_step < 0)
        return keel__fail(KEEL_EINVAL, "optimizer apply: negative global "
                          "step %lld", (long long)global_step);
    if ((st = check_rows(v, n, ids, rows, &row)) != KEEL_OK)
        return st;
    if ((st = make_task(&o->cfg, v, keel_var_tensor(v), &k)) != KEEL_OK)
        return st;
    a = (opt_call){ .c = &o->cfg, .lr = step_lr(&o->cfg, global_step),
                    .task = &k, .ntask = 1, .total = k.n, .nthreads = 1 };
    KEEL__PROF_BEGIN();
    update_rows(&a, &k, n, ids, rows, row);
    KEEL__CORE_PROF_END(optimizer_ns);
    return KEEL_OK;
}

keel_status
keel_optimizer_apply_rows(keel_optimizer *o, keel_var *v, size_t n,
                          const int64_t *ids, const float *rows,
                          int64_t global_step)
{
    return KEEL__FLUSHED(optimizer_apply_rows_fp(o, v, n, ids, rows,
                                                 global_step));
}

/* Hogwild's CAS form: x[i] += d as one compare-and-swap loop on the
 * float's 32-bit pattern, so no concurrent update of the same element is
 * lost. The slots are still plain racy stores. */
typedef uint32_t __attribute__((may_alias)) keel__u32_alias;

static inline void
cas_add(float *x, float d)
{
    keel__u32_alias *p = (keel__u32_alias *)x;
    uint32_t old = __atomic_load_n(p, __ATOMIC_RELAXED), nw;
    do {
        float f;
        memcpy(&f, &old, sizeof f);
        f += d;
        memcpy(&nw, &f, sizeof nw);
    } while (!__atomic_compare_exchange_n(p, &old, nw, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
}

/* The update kernels above as per-element deltas added by cas_add; then
 * the gradient is zeroed. */
static void
cas_update(const opt_call *a, const opt_task *k)
{
    const keel_optimizer_config *c = a->c;
    float lr = a->lr, mu = (float)c->momentum, eps = (float)c->epsilon;
    float b1 = (float)c->beta1, b2 = (float)c->beta2, rho = (float)c->rho;
    float *s1 = k->s1, *s2 = k->s2, *g = k->g;
    for (size_t i = 0; i < k->n; i++) {
        float d;
        switch (c->kind) {
        case KEEL_OPT_MOMENTUM:
            s1[i] = mu * s1[i] + g[i];
            d = c->use_nesterov ? -lr * (g[i] + mu * s1[i]) : -lr * s1[i];
            break;
        case KEEL_OPT_ADAGRAD:
            s1[i] += g[i] * g[i];
            d = -lr * g[i] / (sqrtf(s1[i]) + eps);
            break;
        case KEEL_OPT_ADAM:
            s1[i] = b1 * s1[i] + (1.0f - b1) * g[i];
            s2[i] = b2 * s2[i] + (1.0f - b2) * g[i] * g[i];
            d = -lr * s1[i] / (sqrtf(s2[i]) + eps);
            break;
        case KEEL_OPT_RMSPROP:
            s1[i] = rho * s1[i] + (1.0f - rho) * g[i] * g[i];
            s2[i] = mu * s2[i] + lr * g[i] / sqrtf(s1[i] + eps);
            d = -s2[i];
            break;
        default:
            d = -lr * g[i];
            break;
        }
        cas_add(&k->x[i], d);
    }
    memset(g, 0, k->n * sizeof *g);
}

/* Floats per row of v (rank >= 1). */
static size_t
var_row(keel_var *v)
{
    const keel_tensor *w = keel_var_tensor(v);
    return w->count / (size_t)w->shape[0];
}

/* cas_update on each given row, its gradient copied first (cas_update
 * zeroes the gradient it reads; the rows stay the caller's). */
static void
cas_rows(const opt_call *a, const opt_task *k, size_t n, const int64_t *ids,
         const float *rows, size_t row)
{
    float g[256];
    for (size_t r = 0; r < n; r++)
        for (size_t c0 = 0; c0 < row; c0 += 256) {
            size_t off = (size_t)ids[r] * row + c0;
            size_t m = row - c0 < 256 ? row - c0 : 256;
            opt_task one = { .x = k->x + off,
                             .s1 = k->s1 ? k->s1 + off : NULL,
                             .s2 = k->s2 ? k->s2 + off : NULL,
                             .g = g, .n = m };
            memcpy(g, rows + r * row + c0, m * sizeof *g);
            cas_update(a, &one);
        }
}

/* Check and resolve one apply into *a (every check first: a failing
 * apply changes no variable), then update the variables with gradient
 * rows; the dense updates are left to the caller. */
static keel_status
apply_prepare(keel_optimizer *o, keel_vars *vs, keel_grads *grads,
              int64_t global_step, int zero, int cas, opt_call *out)
{
    size_t nv, nt = 0, total = 0;
    opt_call a;
    if (o == NULL || vs == NULL || grads == NULL)
        return keel__fail(KEEL_EINVAL, "optimizer apply: NULL argument");
    if (keel_grads_vars(grads) != vs)
        return keel__fail(KEEL_EINVAL, "optimizer apply: gradients were "
                          "made for another variable store");
    if (global_step < 0)
        return keel__fail(KEEL_EINVAL, "optimizer apply: negative global "
                          "step %lld", (long long)global_step);
    nv = keel_vars_count(vs);
    if (nv > o->cap) {
        opt_task *t = realloc(o->task, nv * sizeof *t);
        if (t == NULL)
            return keel__fail(KEEL_ENOMEM, "optimizer apply: work list of "
                              "%zu variables", nv);
        o->task = t;
        o->cap = nv;
    }
    /* every check first: a failing apply changes no variable. A
     * variable with gradient rows is a task of no dense elements (n 0,
     * row_of its index + 1), updated after the dense ones. */
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_status st;
        const int64_t *ids;
        const float *rows;
        size_t nr, row;
        if (!keel_var_is_trainable(v))
            continue;              /* untrainable variables have none */
        st = make_task(&o->cfg, v, keel_grads_at(grads, i), &o->task[nt]);
        if (st != KEEL_OK)
            return st;
        nr = keel_grads_rows(grads, i, &ids, &rows);
        o->task[nt].var = nr > 0 ? i + 1 : 0;
        if (nr > 0) {
            if ((st = check_rows(v, nr, ids, rows, &row)) != KEEL_OK)
                return st;
            o->task[nt].n = 0;
        }
        total += o->task[nt++].n;
    }
    a = (opt_call){ .c = &o->cfg, .lr = step_lr(&o->cfg, global_step),
                    .task = o->task, .ntask = nt, .total = total,
                    .zero = zero, .nthreads = 1 };
    for (size_t i = 0; i < nt; i++) {
        opt_task *k = &o->task[i];
        const int64_t *ids;
        const float *rows;
        size_t nr, row;
        if (k->var == 0)
            continue;
        nr = keel_grads_rows(grads, k->var - 1, &ids, &rows);
        row = var_row(keel_vars_at(vs, k->var - 1));
        if (cas)
            cas_rows(&a, k, nr, ids, rows, row);
        else
            update_rows(&a, k, nr, ids, rows, row);
        if (zero)
            keel__grads_clear_rows(grads, k->var - 1);
    }
    *out = a;
    return KEEL_OK;
}

static keel_status
apply_all_fp(keel_optimizer *o, keel_vars *vs, keel_grads *grads,
             int64_t global_step, int zero, keel__pool *pool, int cas)
{
    opt_call a;
    keel_status st;
    KEEL__PROF_BEGIN();
    if ((st = apply_prepare(o, vs, grads, global_step, zero, cas, &a)) !=
        KEEL_OK)
        return st;
    if (cas) {
        for (size_t i = 0; i < a.ntask; i++)
            if (o->task[i].var == 0)
                cas_update(&a, &o->task[i]);
    } else if (pool != NULL && keel__pool_threads(pool) > 1 &&
        a.total >= OPT_PARALLEL_MIN) {
        a.nthreads = keel__pool_threads(pool);
        keel__pool_run(pool, apply_worker, &a);
    } else {
        apply_worker(&a, 0);
    }
    KEEL__CORE_PROF_END(optimizer_ns);
    return KEEL_OK;
}

static keel_status
apply_all(keel_optimizer *o, keel_vars *vs, keel_grads *grads,
          int64_t global_step, int zero, keel__pool *pool, int cas)
{
    return KEEL__FLUSHED(apply_all_fp(o, vs, grads, global_step, zero, pool,
                                      cas));
}

keel_status
keel__optimizer_begin(keel_optimizer *o, keel_vars *vs, keel_grads *grads,
                      int64_t global_step, int zero)
{
    keel_status st;
    if (o != NULL && o->pending == NULL &&
        (o->pending = malloc(sizeof *o->pending)) == NULL)
        return KEEL__FLUSHED(keel__fail(KEEL_ENOMEM, "optimizer apply: "
                                        "call state"));
    st = apply_prepare(o, vs, grads, global_step, zero, 0, o ? o->pending
                                                              : NULL);
    return KEEL__FLUSHED(st);
}

void
keel__optimizer_part(keel_optimizer *o, int t, int nthreads)
{
    opt_call a = *o->pending;
    a.nthreads = nthreads;
    apply_worker(&a, t);
}

keel_status
keel__optimizer_apply_pooled(keel_optimizer *o, keel_vars *vs,
                             keel_grads *grads, int64_t global_step,
                             int zero, keel__pool *pool)
{
    return apply_all(o, vs, grads, global_step, zero, pool, 0);
}

keel_status
keel_optimizer_apply(keel_optimizer *o, keel_vars *vs, keel_grads *grads,
                     int64_t global_step)
{
    return apply_all(o, vs, grads, global_step, 0, NULL, 0);
}

keel_status
keel_optimizer_apply_and_zero(keel_optimizer *o, keel_vars *vs,
                              keel_grads *grads, int64_t global_step)
{
    return apply_all(o, vs, grads, global_step, 1, NULL, 0);
}

keel_status
keel__optimizer_apply_cas(keel_optimizer *o, keel_vars *vs,
                          keel_grads *grads, int64_t global_step)
{
    return apply_all(o, vs, grads, global_step, 1, NULL, 1);
}
