/* model.c - the models (softmax regression, MLP, small CNN) as a fixed
 * list of layers over preallocated NHWC buffers: the config and its names,
 * building a model (variable creation with Keras names and layouts, the
 * pieces a batch is cut into, every workspace), deterministic init, free
 * and accessors. Running it is in model_run.c, its architecture record in
 * model_desc.c. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <keel/train.h>
#include "util.h"
#include "model_int.h"

/* The dense piece for a configured max_batch: ceil(max_batch / 256)
 * pieces of equal size (the last one may be shorter). */
static size_t
dense_piece_for(size_t max_batch)
{
    size_t np = (max_batch + DIRECT_MAX_BATCH - 1) / DIRECT_MAX_BATCH;
    if (np == 0)
        return 1;
    return (max_batch + np - 1) / np;
}

void
keel_model_config_init(keel_model_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
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
    cfg->threads = 1;
}

const char *const keel__model_kind_names[] = { "softmax", "mlp", "cnn" };
const char *const keel__activation_names[] = { "relu", "tanh", "none" };
const char *const keel__init_kind_names[] = { "glorot", "torch" };

KEEL__FROM_NAME(keel_model_kind_from_name, keel_model_kind,
                "model type", keel__model_kind_names)

KEEL__NAME(keel_model_kind_name, keel_model_kind, keel__model_kind_names)

KEEL__FROM_NAME(keel_activation_from_name, keel_activation,
                "activation", keel__activation_names)

KEEL__FROM_NAME(keel_init_kind_from_name, keel_init_kind,
                "init scheme", keel__init_kind_names)

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

static void
free_lgrads(lgrad *g, int nl)
{
    if (g == NULL)
        return;
    for (int i = 0; i < nl; i++) {
        keel_aligned_free(g[i].dw);
        keel_aligned_free(g[i].db);
    }
    free(g);
}

void
keel_model_free(keel_model *m)
{
    if (m == NULL)
        return;
    keel__pool_free(m->pool);
    for (int s = 0; s < MAX_THREADS; s++) {
        if (m->buf[s] == NULL)
            continue;
        for (int i = 0; i < m->nl; i++) {
            lbuf *B = &m->buf[s][i];
            keel_aligned_free(B->y);
            keel_aligned_free(B->dy);
            keel_aligned_free(B->arg);
            keel_aligned_free(B->col);
        }
        free(m->buf[s]);
    }
    for (int s = 0; s < MAX_SLOTS; s++)
        free_lgrads(m->slot[s], m->nl);
    free(m->row_loss);
    free(m->row_ok);
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

/* The variable scope/leaf: created in vs, or (reuse) the trainable one
 * an identical model created there, its shape checked. */
static keel_status
make_var(keel_vars *vs, int reuse, const char *scope, const char *leaf,
         int ndim, const int64_t *shape, keel_var **out)
{
    char name[KEEL_NAME_MAX];
    keel_status st = keel__fmt(name, sizeof name, "variable name", "%s/%s",
                               scope, leaf);
    if (st != KEEL_OK)
        return st;
    if (reuse) {
        keel_var *v = keel_vars_find(vs, name);
        keel_tensor *t = v != NULL ? keel_var_tensor(v) : NULL;
        if (t == NULL || !keel_shape_equal(t->ndim, t->shape, ndim, shape)
            || !keel_var_is_trainable(v))
            return keel__fail(KEEL_EINVAL, "model: the store has no "
                              "trainable variable '%s' of this model's "
                              "shape (a replica or keel_model_new_shared "
                              "needs a store an identical model was built "
                              "on)", name);
        *out = v;
        return KEEL_OK;
    }
    st = keel_vars_create(vs, name, ndim, shape, KEEL_VAR_TRAINABLE, out);
    if (st != KEEL_OK)
        return keel__wrap(st, "model");
    return KEEL_OK;
}

/* A model being built: its store, the shape of the next layer's input
 * (a dense layer's output is 1 x 1 x its size) and the layer counts
 * that number the variable scopes. */
typedef struct builder {
    keel_model *m;
    keel_vars *vs;
    size_t h, w, c;
    int n_dense, n_conv;
} builder;

/* Append a layer; in_size is the previous output (or the input). */
static keel_status
add_layer(builder *bd, layer *proto)
{
    keel_model *m = bd->m;
    keel_vars *vs = bd->vs;
    layer *L = &m->l[m->nl];
    keel_status st;
    char scope[32];
    *L = *proto;
    m->nl++;
    if (L->kind == L_DENSE) {
        int64_t ks[2] = { (int64_t)L->din, (int64_t)L->dout };
        int64_t bs[1] = { (int64_t)L->dout };
        snprintf(scope, sizeof scope, "dense_%d", ++bd->n_dense);
        L->out_size = L->dout;
        if ((st = make_var(vs, m->reuse_vars, scope, "kernel", 2, ks, &L->w)) != KEEL_OK ||
            (st = make_var(vs, m->reuse_vars, scope, "bias", 1, bs, &L->b)) != KEEL_OK)
            return st;
        m->flops += 2.0 * (double)L->din * (double)L->dout *
                    (m->nl == 1 ? 2.0 : 3.0);
    } else if (L->kind == L_CONV) {
        keel__conv_geom *g = &L->cg;
        int64_t ks[4] = { (int64_t)g->kh, (int64_t)g->kw, (int64_t)g->cin,
                          (int64_t)g->cout };
        int64_t bs[1] = { (int64_t)g->cout };
        snprintf(scope, sizeof scope, "conv2d_%d", ++bd->n_conv);
        if ((st = keel__conv_geom_init(g, 0)) != KEEL_OK)
            return st;
        L->out_size = g->oh * g->ow * g->cout;
        if ((st = make_var(vs, m->reuse_vars, scope, "kernel", 4, ks, &L->w)) != KEEL_OK ||
            (st = make_var(vs, m->reuse_vars, scope, "bias", 1, bs, &L->b)) != KEEL_OK)
            return st;
        m->flops += 2.0 * (double)(g->oh * g->ow) *
                    (double)(g->kh * g->kw * g->cin) * (double)g->cout *
                    (m->nl == 1 ? 2.0 : 3.0);
    } else {
        if ((st = keel__pool_geom_init(&L->pg)) != KEEL_OK)
            return st;
        L->out_size = L->pg.oh * L->pg.ow * L->pg.c;
    }
    if (L->w != NULL)
        m->nvars += 2;
    return KEEL_OK;
}

static keel_status
alloc_lgrads(keel_model *m, lgrad **out)
{
    keel_status st;
    *out = calloc((size_t)m->nl, sizeof(lgrad));
    if (*out == NULL)
        return keel__fail(KEEL_ENOMEM, "model: gradient buffers");
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        if (L->w != NULL &&
            ((st = alloc_floats(&(*out)[i].dw, keel_var_tensor(L->w)->count,
                                "kernel grad")) != KEEL_OK ||
             (st = alloc_floats(&(*out)[i].db, keel_var_tensor(L->b)->count,
                                "bias grad")) != KEEL_OK))
            return st;
    }
    return KEEL_OK;
}

/* Every thread's and slot's workspaces, allocated once (nothing is
 * allocated per step). */
static keel_status
alloc_buffers(keel_model *m)
{
    size_t nb = m->piece;
    keel_status st;
    for (int s = 0; s < m->nthreads; s++) {
        m->buf[s] = calloc((size_t)m->nl, sizeof(lbuf));
        if (m->buf[s] == NULL)
            return keel__fail(KEEL_ENOMEM, "model: layer buffers");
        for (int i = 0; i < m->nl; i++) {
            layer *L = &m->l[i];
            lbuf *B = &m->buf[s][i];
            if (L->kind == L_CONV &&
                (st = alloc_floats(&B->col, keel__conv_col_size(&L->cg, nb),
                                   "im2col workspace")) != KEEL_OK)
                return st;
            if (L->kind == L_POOL) {
                if (nb * L->in_size > INT32_MAX)
                    return keel__fail(KEEL_EINVAL, "model: max_batch too "
                                      "large for max-pool indices");
                B->arg = keel_aligned_alloc(nb * L->out_size *
                                            sizeof(int32_t));
                if (B->arg == NULL)
                    return keel__fail(KEEL_ENOMEM, "model: pool indices");
            }
            if ((st = alloc_floats(&B->y, nb * L->out_size,
                                   "activations")) != KEEL_OK ||
                (st = alloc_floats(&B->dy, nb * L->out_size,
                                   "activation grads")) != KEEL_OK)
                return st;
        }
    }
    for (int s = 0; s < m->nslots; s++)
        if ((st = alloc_lgrads(m, &m->slot[s])) != KEEL_OK)
            return st;
    m->row_loss = calloc(m->max_pieces * m->piece, sizeof *m->row_loss);
    m->row_ok = calloc(m->max_pieces * m->piece, sizeof *m->row_ok);
    if (m->row_loss == NULL || m->row_ok == NULL)
        return keel__fail(KEEL_ENOMEM, "model: per-example statistics");
    return keel__pool_new(m->nthreads, &m->pool);
}

keel_status
keel__model_check_config(const keel_model_config *c)
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
    if (c->threads < 1 || c->threads > MAX_THREADS)
        return keel__fail(KEEL_EINVAL, "model: threads %d out of range "
                          "(1..%d)", c->threads, MAX_THREADS);
    if ((unsigned)c->activation > KEEL_ACT_NONE ||
        (unsigned)c->init > KEEL_INIT_TORCH)
        return keel__fail(KEEL_EINVAL, "model: bad activation or init");
    return KEEL_OK;
}

static keel_status model_build(const keel_model_config *cfg, keel_vars *vs,
                               int reuse, keel_model **out);

keel_status
keel_model_new(const keel_model_config *cfg, keel_vars *vs, keel_model **out)
{
    return model_build(cfg, vs, 0, out);
}

keel_status
keel__model_new_replica(const keel_model *m, keel_vars *vs, int threads,
                        keel_model **out)
{
    keel_model_config c;
    if (m == NULL)
        return keel__fail(KEEL_EINVAL, "model replica: NULL model");
    c = m->cfg;
    c.threads = threads;
    return model_build(&c, vs, 1, out);
}

/* A dense layer of dout units on the flattened input. */
static keel_status
add_dense(builder *bd, size_t dout, keel_activation act)
{
    size_t flat = bd->h * bd->w * bd->c;
    layer p = { .kind = L_DENSE, .act = act, .in_size = flat, .din = flat,
                .dout = dout };
    keel_status st = add_layer(bd, &p);
    bd->h = bd->w = 1;
    bd->c = dout;
    return st;
}

/* A 3 x 3 ReLU convolution of cout channels, then a 2 x 2 max-pool fused
 * with it. */
static keel_status
add_conv_pool(builder *bd, size_t cout)
{
    keel_model *m = bd->m;
    layer conv = {
        .kind = L_CONV, .act = KEEL_ACT_RELU,
        .in_size = bd->h * bd->w * bd->c,
        .cg = { .h = bd->h, .w = bd->w, .cin = bd->c, .kh = 3, .kw = 3,
                .cout = cout, .sh = 1, .sw = 1 },
    };
    layer pool = { .kind = L_POOL, .act = KEEL_ACT_NONE };
    keel_status st = add_layer(bd, &conv);
    if (st != KEEL_OK)
        return st;
    bd->h = m->l[m->nl - 1].cg.oh;
    bd->w = m->l[m->nl - 1].cg.ow;
    bd->c = cout;
    pool.in_size = bd->h * bd->w * bd->c;
    pool.pg = (keel__pool_geom){ .h = bd->h, .w = bd->w, .c = bd->c,
                                 .k = 2, .s = 2 };
    if ((st = add_layer(bd, &pool)) != KEEL_OK)
        return st;
    bd->h = m->l[m->nl - 1].pg.oh;
    bd->w = m->l[m->nl - 1].pg.ow;
    m->l[m->nl - 2].fused = 1;
    return KEEL_OK;
}

/* The layers of cfg's model kind, then the logits: the CNN's two
 * convolution + pool blocks (32 and 64 channels) and dense 64, or the
 * MLP's hidden layers; a softmax model has the logits only. */
static keel_status
add_layers(builder *bd, const keel_model_config *cfg)
{
    keel_status st = KEEL_OK;
    if (cfg->kind == KEEL_MODEL_CNN) {
        st = add_conv_pool(bd, 32);
        if (st == KEEL_OK)
            st = add_conv_pool(bd, 64);
        if (st == KEEL_OK)
            st = add_dense(bd, 64, KEEL_ACT_RELU);
    } else if (cfg->kind == KEEL_MODEL_MLP) {
        for (int i = 0; i < cfg->n_hidden && st == KEEL_OK; i++)
            st = add_dense(bd, (size_t)cfg->hidden[i], cfg->activation);
    }
    if (st == KEEL_OK)
        st = add_dense(bd, (size_t)cfg->classes, KEEL_ACT_NONE);
    return st;
}

/* How a batch of up to max_batch is cut into pieces, and the slots the
 * pieces' gradients go through. */
static void
set_pieces(keel_model *m)
{
    size_t max_batch = (size_t)m->cfg.max_batch;
    if (!m->is_dense_only)
        m->piece = CNN_PIECE;
    else
        m->piece = dense_piece_for(max_batch);
    if (m->piece > max_batch)
        m->piece = max_batch;
    m->max_pieces = (max_batch + m->piece - 1) / m->piece;
    m->nslots = m->max_pieces < MAX_SLOTS ? (int)m->max_pieces : MAX_SLOTS;
}

/* Check cfg, add the layers (their variables created in vs, or with
 * reuse found there), cut batches into pieces and allocate every
 * workspace. */
static keel_status
model_build(const keel_model_config *cfg, keel_vars *vs, int reuse,
            keel_model **out)
{
    keel_model *m;
    keel_status st;
    builder bd;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "model: out is NULL");
    *out = NULL;
    if (cfg == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "model: NULL config or store");
    if ((st = KEEL__STRUCT_CHECK(cfg, keel_model_config)) != KEEL_OK)
        return keel__wrap(st, "model");
    if ((st = keel__model_check_config(cfg)) != KEEL_OK)
        return st;
    m = calloc(1, sizeof *m);
    if (m == NULL)
        return keel__fail(KEEL_ENOMEM, "model");
    m->cfg = *cfg;
    m->reuse_vars = reuse;
    m->nthreads = cfg->threads;
    m->is_dense_only = cfg->kind != KEEL_MODEL_CNN;
    m->l = calloc(KEEL_MODEL_MAX_HIDDEN + 8, sizeof *m->l);
    if (m->l == NULL) {
        free(m);
        return keel__fail(KEEL_ENOMEM, "model layers");
    }
    bd = (builder){ .m = m, .vs = vs, .h = (size_t)cfg->height,
                    .w = (size_t)cfg->width, .c = (size_t)cfg->channels };
    st = add_layers(&bd, cfg);
    if (st == KEEL_OK) {
        set_pieces(m);
        st = alloc_buffers(m);
    }
    if (st != KEEL_OK) {
        keel_model_free(m);
        return st;
    }
    *out = m;
    return KEEL_OK;
}

keel_status
keel_model_new_shared(const keel_model_config *cfg, keel_vars *vs,
                      keel_model **out)
{
    return model_build(cfg, vs, 1, out);
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

size_t
keel__model_piece(const keel_model *m)
{
    return m->piece;
}

keel__pool *
keel__model_pool(keel_model *m)
{
    return m != NULL ? m->pool : NULL;
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
