/* model.c - the models (softmax regression, MLP, seed-002 CNN) as a fixed
 * list of layers over preallocated NHWC buffers: variable creation with
 * Keras names and layouts, deterministic init, train step and eval. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <keel/keel.h>
#include <keel/train.h>
#include "util.h"
#include "train_int.h"

typedef enum lkind { L_DENSE, L_CONV, L_POOL } lkind;

typedef struct layer {
    lkind kind;
    keel_activation act;
    size_t in_size, out_size;     /* floats per example */
    size_t din, dout;             /* dense */
    keel__conv_geom cg;
    keel__pool_geom pg;
    keel_var *w, *b;
    float *y, *dy;                /* [max_batch * out_size] */
    int32_t *arg;                 /* pool argmax */
    float *col;                   /* conv im2col workspace */
    float *dw, *db;               /* this call's gradient */
    int fused;                    /* conv followed by max-pool: bias and
                                   * activation are applied after the pool
                                   * (max commutes with both), 4x less work */
} layer;

struct keel_model {
    keel_model_config cfg;
    layer *l;
    int nl;
    size_t nvars;
    double flops;
};

void
keel_model_config_init(keel_model_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = KEEL_MODEL_MLP;
    cfg->n_hidden = 2;
    cfg->hidden[0] = 256;
    cfg->hidden[1] = 256;
    cfg->activation = KEEL_ACT_RELU;
    cfg->height = 28;
    cfg->width = 28;
    cfg->channels = 1;
    cfg->classes = 10;
    cfg->max_batch = 256;
    cfg->init = KEEL_INIT_GLOROT;
}

static const char *const model_names[] = { "softmax", "mlp", "cnn" };
static const char *const act_names[] = { "relu", "tanh", "none" };
static const char *const init_names[] = { "glorot", "torch" };

static keel_status
name_lookup(const char *what, const char *name, const char *const *names,
            int n, int *out)
{
    char list[128] = "";
    for (int i = 0; i < n; i++)
        if (name != NULL && strcmp(name, names[i]) == 0) {
            *out = i;
            return KEEL_OK;
        }
    for (int i = 0; i < n; i++) {
        strncat(list, names[i], sizeof list - strlen(list) - 1);
        if (i + 1 < n)
            strncat(list, ", ", sizeof list - strlen(list) - 1);
    }
    return keel__fail(KEEL_EINVAL, "unknown %s '%s' (valid: %s)", what,
                      name != NULL ? name : "(null)", list);
}

keel_status
keel_model_kind_from_name(const char *name, keel_model_kind *out)
{
    int i = 0;
    keel_status st = name_lookup("model type", name, model_names, 3, &i);
    if (st == KEEL_OK)
        *out = (keel_model_kind)i;
    return st;
}

const char *
keel_model_kind_name(keel_model_kind k)
{
    return (unsigned)k < 3 ? model_names[k] : "unknown";
}

keel_status
keel_activation_from_name(const char *name, keel_activation *out)
{
    int i = 0;
    keel_status st = name_lookup("activation", name, act_names, 3, &i);
    if (st == KEEL_OK)
        *out = (keel_activation)i;
    return st;
}

keel_status
keel_init_kind_from_name(const char *name, keel_init_kind *out)
{
    int i = 0;
    keel_status st = name_lookup("init scheme", name, init_names, 2, &i);
    if (st == KEEL_OK)
        *out = (keel_init_kind)i;
    return st;
}

keel_status
keel_model_parse_hidden(const char *s, keel_model_config *cfg)
{
    int n = 0;
    const char *p = s;
    if (s == NULL || cfg == NULL)
        return keel__fail(KEEL_EINVAL, "hidden sizes: NULL argument");
    while (*p == ' ')
        p++;
    if (*p == '\0') {
        cfg->n_hidden = 0;
        return KEEL_OK;
    }
    for (;;) {
        char buf[32];
        size_t len = strcspn(p, ",");
        int64_t v;
        if (n == KEEL_MODEL_MAX_HIDDEN)
            return keel__fail(KEEL_EINVAL, "hidden sizes '%s': at most %d "
                              "layers", s, KEEL_MODEL_MAX_HIDDEN);
        if (len == 0 || len >= sizeof buf)
            return keel__fail(KEEL_EINVAL, "hidden sizes '%s': expected "
                              "comma-separated positive integers like "
                              "'256,256'", s);
        memcpy(buf, p, len);
        buf[len] = '\0';
        if (!keel__parse_i64(buf, 1, 1 << 20, &v))
            return keel__fail(KEEL_EINVAL, "hidden sizes '%s': '%s' is not "
                              "an integer in [1, 1048576]", s, buf);
        cfg->hidden[n++] = v;
        p += len;
        if (*p == '\0')
            break;
        p++;
    }
    cfg->n_hidden = n;
    return KEEL_OK;
}

void
keel_model_free(keel_model *m)
{
    if (m == NULL)
        return;
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        keel_aligned_free(L->y);
        keel_aligned_free(L->dy);
        keel_aligned_free(L->arg);
        keel_aligned_free(L->col);
        keel_aligned_free(L->dw);
        keel_aligned_free(L->db);
    }
    free(m->l);
    free(m);
}

static keel_status
alloc_floats(float **p, size_t count, const char *what)
{
    if (count > KEEL_TENSOR_MAX_BYTES / sizeof(float))
        return keel__fail(KEEL_EINVAL, "model: %s of %zu floats too large",
                          what, count);
    *p = keel_aligned_alloc(count * sizeof(float));
    if (*p == NULL)
        return keel__fail(KEEL_ENOMEM, "model: %s (%zu floats)", what,
                          count);
    return KEEL_OK;
}

static keel_status
make_var(keel_vars *vs, const char *scope, const char *leaf, int ndim,
         const int64_t *shape, keel_var **out)
{
    char name[KEEL_NAME_MAX];
    keel_status st = keel__fmt(name, sizeof name, "variable name", "%s/%s",
                               scope, leaf);
    if (st != KEEL_OK)
        return st;
    st = keel_vars_create(vs, name, ndim, shape, KEEL_VAR_TRAINABLE, out);
    if (st != KEEL_OK)
        return keel__wrap(st, "model");
    return KEEL_OK;
}

/* Append a layer; in_size is the previous output (or the input). */
static keel_status
add_layer(keel_model *m, keel_vars *vs, layer *proto, int *n_dense,
          int *n_conv)
{
    layer *L = &m->l[m->nl];
    size_t nb = (size_t)m->cfg.max_batch;
    keel_status st;
    char scope[32];
    *L = *proto;
    m->nl++;
    if (L->kind == L_DENSE) {
        int64_t ks[2] = { (int64_t)L->din, (int64_t)L->dout };
        int64_t bs[1] = { (int64_t)L->dout };
        snprintf(scope, sizeof scope, "dense_%d", ++*n_dense);
        L->out_size = L->dout;
        if ((st = make_var(vs, scope, "kernel", 2, ks, &L->w)) != KEEL_OK ||
            (st = make_var(vs, scope, "bias", 1, bs, &L->b)) != KEEL_OK)
            return st;
        m->flops += 2.0 * (double)L->din * (double)L->dout *
                    (m->nl == 1 ? 2.0 : 3.0);
    } else if (L->kind == L_CONV) {
        keel__conv_geom *g = &L->cg;
        int64_t ks[4] = { (int64_t)g->kh, (int64_t)g->kw, (int64_t)g->cin,
                          (int64_t)g->cout };
        int64_t bs[1] = { (int64_t)g->cout };
        snprintf(scope, sizeof scope, "conv2d_%d", ++*n_conv);
        if ((st = keel__conv_geom_init(g, 0)) != KEEL_OK)
            return st;
        L->out_size = g->oh * g->ow * g->cout;
        if ((st = make_var(vs, scope, "kernel", 4, ks, &L->w)) != KEEL_OK ||
            (st = make_var(vs, scope, "bias", 1, bs, &L->b)) != KEEL_OK ||
            (st = alloc_floats(&L->col, keel__conv_col_size(g, nb),
                               "im2col workspace")) != KEEL_OK)
            return st;
        m->flops += 2.0 * (double)(g->oh * g->ow) *
                    (double)(g->kh * g->kw * g->cin) * (double)g->cout *
                    (m->nl == 1 ? 2.0 : 3.0);
    } else {
        if ((st = keel__pool_geom_init(&L->pg)) != KEEL_OK)
            return st;
        L->out_size = L->pg.oh * L->pg.ow * L->pg.c;
        if (nb * L->in_size > INT32_MAX)
            return keel__fail(KEEL_EINVAL, "model: max_batch %zu too large "
                              "for max-pool indices", nb);
        L->arg = keel_aligned_alloc(nb * L->out_size * sizeof(int32_t));
        if (L->arg == NULL)
            return keel__fail(KEEL_ENOMEM, "model: pool indices");
    }
    if ((st = alloc_floats(&L->y, nb * L->out_size, "activations")) !=
            KEEL_OK ||
        (st = alloc_floats(&L->dy, nb * L->out_size, "activation grads")) !=
            KEEL_OK)
        return st;
    if (L->w != NULL &&
        ((st = alloc_floats(&L->dw, keel_var_tensor(L->w)->count,
                            "kernel grad")) != KEEL_OK ||
         (st = alloc_floats(&L->db, keel_var_tensor(L->b)->count,
                            "bias grad")) != KEEL_OK))
        return st;
    if (L->w != NULL)
        m->nvars += 2;
    return KEEL_OK;
}

static keel_status
check_config(const keel_model_config *c)
{
    if ((unsigned)c->kind > KEEL_MODEL_CNN)
        return keel__fail(KEEL_EINVAL, "model: unknown type %d", c->kind);
    if (c->height < 1 || c->width < 1 || c->channels < 1 ||
        c->height > 4096 || c->width > 4096 || c->channels > 4096)
        return keel__fail(KEEL_EINVAL, "model: input shape %lldx%lldx%lld "
                          "out of range (1..4096 each)",
                          (long long)c->height, (long long)c->width,
                          (long long)c->channels);
    if (c->classes < 2 || c->classes > 1000000)
        return keel__fail(KEEL_EINVAL, "model: classes %lld out of range "
                          "(2..1000000)", (long long)c->classes);
    if (c->max_batch < 1 || c->max_batch > 1 << 20)
        return keel__fail(KEEL_EINVAL, "model: max_batch %lld out of range "
                          "(1..1048576)", (long long)c->max_batch);
    if (c->n_hidden < 0 || c->n_hidden > KEEL_MODEL_MAX_HIDDEN)
        return keel__fail(KEEL_EINVAL, "model: %d hidden layers (0..%d)",
                          c->n_hidden, KEEL_MODEL_MAX_HIDDEN);
    for (int i = 0; i < c->n_hidden && c->kind == KEEL_MODEL_MLP; i++)
        if (c->hidden[i] < 1 || c->hidden[i] > 1 << 20)
            return keel__fail(KEEL_EINVAL, "model: hidden size %lld",
                              (long long)c->hidden[i]);
    if ((unsigned)c->activation > KEEL_ACT_NONE ||
        (unsigned)c->init > KEEL_INIT_TORCH)
        return keel__fail(KEEL_EINVAL, "model: bad activation or init");
    return KEEL_OK;
}

keel_status
keel_model_new(const keel_model_config *cfg, keel_vars *vs, keel_model **out)
{
    keel_model *m;
    keel_status st;
    int n_dense = 0, n_conv = 0;
    size_t h, w, c, flat;
    layer p;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "model: out is NULL");
    *out = NULL;
    if (cfg == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "model: NULL config or store");
    if ((st = check_config(cfg)) != KEEL_OK)
        return st;
    m = calloc(1, sizeof *m);
    if (m == NULL)
        return keel__fail(KEEL_ENOMEM, "model");
    m->cfg = *cfg;
    m->l = calloc(KEEL_MODEL_MAX_HIDDEN + 8, sizeof *m->l);
    if (m->l == NULL) {
        free(m);
        return keel__fail(KEEL_ENOMEM, "model layers");
    }
    h = (size_t)cfg->height;
    w = (size_t)cfg->width;
    c = (size_t)cfg->channels;
    flat = h * w * c;
    if (cfg->kind == KEEL_MODEL_CNN) {
        size_t chans[2] = { 32, 64 };
        for (int i = 0; i < 2; i++) {
            memset(&p, 0, sizeof p);
            p.kind = L_CONV;
            p.act = KEEL_ACT_RELU;
            p.in_size = h * w * c;
            p.cg.h = h;
            p.cg.w = w;
            p.cg.cin = c;
            p.cg.kh = p.cg.kw = 3;
            p.cg.sh = p.cg.sw = 1;
            p.cg.cout = chans[i];
            if ((st = add_layer(m, vs, &p, &n_dense, &n_conv)) != KEEL_OK)
                goto fail;
            h = m->l[m->nl - 1].cg.oh;
            w = m->l[m->nl - 1].cg.ow;
            c = chans[i];
            memset(&p, 0, sizeof p);
            p.kind = L_POOL;
            p.act = KEEL_ACT_NONE;
            p.in_size = h * w * c;
            p.pg.h = h;
            p.pg.w = w;
            p.pg.c = c;
            p.pg.k = p.pg.s = 2;
            if ((st = add_layer(m, vs, &p, &n_dense, &n_conv)) != KEEL_OK)
                goto fail;
            h = m->l[m->nl - 1].pg.oh;
            w = m->l[m->nl - 1].pg.ow;
            m->l[m->nl - 2].fused = 1;
        }
        flat = h * w * c;
        memset(&p, 0, sizeof p);
        p.kind = L_DENSE;
        p.act = KEEL_ACT_RELU;
        p.in_size = p.din = flat;
        p.dout = 64;
        if ((st = add_layer(m, vs, &p, &n_dense, &n_conv)) != KEEL_OK)
            goto fail;
        flat = 64;
    } else if (cfg->kind == KEEL_MODEL_MLP) {
        for (int i = 0; i < cfg->n_hidden; i++) {
            memset(&p, 0, sizeof p);
            p.kind = L_DENSE;
            p.act = cfg->activation;
            p.in_size = p.din = flat;
            p.dout = (size_t)cfg->hidden[i];
            if ((st = add_layer(m, vs, &p, &n_dense, &n_conv)) != KEEL_OK)
                goto fail;
            flat = p.dout;
        }
    }
    memset(&p, 0, sizeof p);
    p.kind = L_DENSE;
    p.act = KEEL_ACT_NONE;
    p.in_size = p.din = flat;
    p.dout = (size_t)cfg->classes;
    if ((st = add_layer(m, vs, &p, &n_dense, &n_conv)) != KEEL_OK)
        goto fail;
    *out = m;
    return KEEL_OK;
fail:
    keel_model_free(m);
    return st;
}

keel_status
keel_model_init_vars(keel_model *m, keel_vars *vs, uint64_t seed)
{
    if (m == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "model init: NULL argument");
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        keel_tensor *kt, *bt;
        double fan_in, fan_out, limit, blimit;
        keel__rng r;
        if (L->w == NULL)
            continue;
        kt = keel_var_tensor(L->w);
        bt = keel_var_tensor(L->b);
        if (L->kind == L_DENSE) {
            fan_in = (double)L->din;
            fan_out = (double)L->dout;
        } else {
            double rf = (double)(L->cg.kh * L->cg.kw);
            fan_in = rf * (double)L->cg.cin;
            fan_out = rf * (double)L->cg.cout;
        }
        if (m->cfg.init == KEEL_INIT_GLOROT) {
            limit = sqrt(6.0 / (fan_in + fan_out));
            blimit = 0.0;
        } else {
            limit = blimit = 1.0 / sqrt(fan_in);
        }
        /* one independent stream per variable, keyed by its position */
        keel__rng_seed(&r, seed ^ (0x51ed2701ULL * (uint64_t)(i + 1)));
        for (size_t j = 0; j < kt->count; j++)
            kt->data[j] = keel__rng_uniform(&r, (float)-limit, (float)limit);
        for (size_t j = 0; j < bt->count; j++)
            bt->data[j] = blimit > 0.0
                              ? keel__rng_uniform(&r, (float)-blimit,
                                                  (float)blimit)
                              : 0.0f;
        keel_var_set_initialized(L->w, 1);
        keel_var_set_initialized(L->b, 1);
    }
    return KEEL_OK;
}

static keel_status
check_batch(const keel_model *m, const keel_batch *b, const char *what)
{
    if (b == NULL || b->x == NULL || b->y == NULL)
        return keel__fail(KEEL_EINVAL, "model %s: NULL batch", what);
    if (b->n < 1 || b->n > (size_t)m->cfg.max_batch)
        return keel__fail(KEEL_EINVAL, "model %s: batch of %zu examples "
                          "(1..max_batch %lld)", what, b->n,
                          (long long)m->cfg.max_batch);
    for (size_t i = 0; i < b->n; i++)
        if (b->y[i] < 0 || b->y[i] >= m->cfg.classes)
            return keel__fail(KEEL_EINVAL, "model %s: label %d of example "
                              "%zu outside [0, %lld)", what, (int)b->y[i], i,
                              (long long)m->cfg.classes);
    return KEEL_OK;
}

static void
forward(keel_model *m, const float *x, size_t n)
{
    const float *in = x;
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        if (L->kind == L_DENSE) {
            keel__dense_forward(in, n, L->din, L->dout,
                                keel_var_tensor(L->w)->data, NULL, L->y);
            keel__bias_act_forward(L->act, L->y, n, L->dout,
                                   keel_var_tensor(L->b)->data);
        } else if (L->kind == L_CONV) {
            keel__conv_forward(&L->cg, in, n, keel_var_tensor(L->w)->data,
                               NULL, L->col, L->y);
            if (!L->fused)
                keel__bias_act_forward(L->act, L->y,
                                       n * L->cg.oh * L->cg.ow, L->cg.cout,
                                       keel_var_tensor(L->b)->data);
        } else {
            layer *P = i > 0 ? &m->l[i - 1] : NULL;
            keel__pool_forward(&L->pg, in, n, L->y, L->arg);
            if (P != NULL && P->fused)
                keel__bias_act_forward(P->act, L->y,
                                       n * L->pg.oh * L->pg.ow, L->pg.c,
                                       keel_var_tensor(P->b)->data);
        }
        in = L->y;
    }
}

keel_status
keel_model_step(keel_model *m, keel_vars *vs, const keel_batch *batch,
                int64_t global_batch_size, keel_grads *grads,
                keel_step_stats *stats)
{
    keel_status st;
    layer *last;
    double loss = 0.0;
    int64_t correct = 0;
    size_t n;
    if (m == NULL || vs == NULL || grads == NULL)
        return keel__fail(KEEL_EINVAL, "model step: NULL argument");
    if ((st = check_batch(m, batch, "step")) != KEEL_OK)
        return st;
    if (global_batch_size < (int64_t)batch->n)
        return keel__fail(KEEL_EINVAL, "model step: global batch size %lld "
                          "smaller than the batch (%zu)",
                          (long long)global_batch_size, batch->n);
    if (keel_grads_vars(grads) != vs)
        return keel__fail(KEEL_EINVAL, "model step: gradients were made "
                          "for another variable store");
    for (int i = 0; i < m->nl; i++)
        if (m->l[i].w != NULL &&
            (keel_grads_at(grads, keel_var_index(m->l[i].w)) == NULL ||
             keel_grads_at(grads, keel_var_index(m->l[i].b)) == NULL))
            return keel__fail(KEEL_EINVAL, "model step: no gradient for "
                              "'%s'", keel_var_name(m->l[i].w));
    n = batch->n;
    forward(m, batch->x, n);
    last = &m->l[m->nl - 1];
    keel__softmax_xent(last->y, batch->y, n, last->dout,
                       (float)(1.0 / (double)global_batch_size), last->dy,
                       &loss, &correct);
    for (int i = m->nl - 1; i >= 0; i--) {
        layer *L = &m->l[i];
        const float *in = i > 0 ? m->l[i - 1].y : batch->x;
        float *dx = i > 0 ? m->l[i - 1].dy : NULL;
        layer *P = i > 0 ? &m->l[i - 1] : NULL;
        if (L->act != KEEL_ACT_NONE && !L->fused)
            keel__act_backward(L->act, L->y, L->dy, n * L->out_size);
        if (L->kind == L_POOL && P != NULL && P->fused) {
            /* the conv's activation and bias live on the pooled output */
            keel__act_backward(P->act, L->y, L->dy, n * L->out_size);
            keel__col_sums(L->dy, n * L->pg.oh * L->pg.ow, L->pg.c, P->db);
        }
        if (L->kind == L_DENSE)
            keel__dense_backward(in, L->dy, n, L->din, L->dout,
                                 keel_var_tensor(L->w)->data, L->dw, L->db,
                                 dx);
        else if (L->kind == L_CONV)
            keel__conv_backward(&L->cg, in, n, L->dy,
                                keel_var_tensor(L->w)->data, L->col, 1,
                                L->dw, L->fused ? NULL : L->db, dx);
        else
            keel__pool_backward(&L->pg, L->dy, n, L->arg, dx);
    }
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        keel_tensor *gw, *gb;
        if (L->w == NULL)
            continue;
        gw = keel_grads_at(grads, keel_var_index(L->w));
        gb = keel_grads_at(grads, keel_var_index(L->b));
        keel__add_into(gw->data, L->dw, gw->count);
        keel__add_into(gb->data, L->db, gb->count);
    }
    if (stats != NULL) {
        stats->loss_sum = loss;
        stats->correct = correct;
        stats->count = (int64_t)n;
    }
    return KEEL_OK;
}

keel_status
keel_model_eval(keel_model *m, keel_vars *vs, const keel_batch *batch,
                keel_step_stats *stats)
{
    keel_status st;
    layer *last;
    double loss = 0.0;
    int64_t correct = 0;
    if (m == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "model eval: NULL argument");
    if ((st = check_batch(m, batch, "eval")) != KEEL_OK)
        return st;
    forward(m, batch->x, batch->n);
    last = &m->l[m->nl - 1];
    keel__softmax_xent(last->y, batch->y, batch->n, last->dout, 1.0f, NULL,
                       &loss, &correct);
    if (stats != NULL) {
        stats->loss_sum = loss;
        stats->correct = correct;
        stats->count = (int64_t)batch->n;
    }
    return KEEL_OK;
}

keel_status
keel_model_predict(keel_model *m, keel_vars *vs, const keel_batch *batch,
                   float *probs)
{
    layer *last;
    size_t k;
    if (m == NULL || vs == NULL || batch == NULL || batch->x == NULL ||
        probs == NULL)
        return keel__fail(KEEL_EINVAL, "model predict: NULL argument");
    if (batch->n < 1 || batch->n > (size_t)m->cfg.max_batch)
        return keel__fail(KEEL_EINVAL, "model predict: batch of %zu "
                          "examples (1..max_batch %lld)", batch->n,
                          (long long)m->cfg.max_batch);
    forward(m, batch->x, batch->n);
    last = &m->l[m->nl - 1];
    k = last->dout;
    for (size_t i = 0; i < batch->n; i++) {
        const float *z = last->y + i * k;
        float mx = z[0];
        double sum = 0.0;
        for (size_t j = 1; j < k; j++)
            mx = z[j] > mx ? z[j] : mx;
        for (size_t j = 0; j < k; j++)
            sum += exp((double)z[j] - (double)mx);
        for (size_t j = 0; j < k; j++)
            probs[i * k + j] = (float)(exp((double)z[j] - (double)mx) / sum);
    }
    return KEEL_OK;
}

double
keel_model_flops_per_example(const keel_model *m)
{
    return m != NULL ? m->flops : 0.0;
}

size_t
keel_model_num_vars(const keel_model *m)
{
    return m != NULL ? m->nvars : 0;
}

const keel_model_config *
keel_model_get_config(const keel_model *m)
{
    return m != NULL ? &m->cfg : NULL;
}
