/* model.c - the models (softmax regression, MLP, small CNN) as a fixed
 * list of layers over preallocated NHWC buffers: variable creation with
 * Keras names and layouts, deterministic init, train step and eval. */
#include <config.h>

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <json-c/json.h>

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
    int fused;                    /* conv followed by max-pool: bias and
                                   * activation are applied after the pool
                                   * (max commutes with both), 4x less work */
} layer;

/* One thread's buffers for one layer, sized for one piece. */
typedef struct lbuf {
    float *y, *dy;                /* outputs and their gradients */
    int32_t *arg;                 /* pool argmax */
    float *col;                   /* conv im2col workspace */
} lbuf;

/* One layer's parameter gradients (a slot's, or a thread's scratch). */
typedef struct lgrad {
    float *dw, *db;
} lgrad;

#define MAX_THREADS KEEL__POOL_MAX
/* Every batch is cut into pieces whose size depends on the model and its
 * configured max_batch only, never on the thread count: CNN_PIECE examples
 * for the CNN; for dense-only models as few pieces as keep each at most
 * DIRECT_MAX_BATCH rows, of equal size (ceil(max_batch / pieces)): one
 * sgemm per layer over up to 256 rows packs the weights once, where 32-row
 * pieces packed them 8 times at a batch of 256 (1.3x slower on one
 * thread, and the slot reduction made model threads slower still). The
 * batch's gradient is, by definition, the pieces' gradients (each rounded
 * on its own) added elementwise along the reduction tree over the pieces
 * (numeric_int.h, keel__tree_sum), piece 0 added onto grads first. Threads
 * compute up to MAX_SLOTS pieces at a time into slots, which are then
 * added along that tree; past MAX_SLOTS pieces the next round's tree
 * starts from the sum so far in piece 0's place. So the bits never depend on
 * which thread ran a piece, and a batch cut into runs of pieces that are
 * nodes of that tree, whose sums are added along it, gives the same bits. */
#define CNN_PIECE 16
#define MAX_SLOTS KEEL__MODEL_TREE_PIECES
/* Piece 0's dense gradients go straight into the caller's grads (sgemm
 * beta 1: one pass over the parameters less, and no slot); every other
 * piece's go through a slot and are added in piece order. That holds on
 * every thread count, so it is part of the definition of the batch's
 * gradient, not an optimization that must round like one. (Onto zero
 * grads, as in every training step, beta 1 gives the bits of a separate
 * gradient added afterwards on every kernel; onto non-zero grads only while
 * K stays inside one OpenBLAS K block, which Prescott's kernel breaks
 * above 128 rows.) Pieces are at most DIRECT_MAX_BATCH rows. */
#define DIRECT_MAX_BATCH 256
int keel__grads_direct = 1;

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

struct keel_model {
    keel_model_config cfg;
    layer *l;
    int nl;
    size_t nvars;
    double flops;
    int nthreads;                 /* cfg.threads */
    keel__pool *pool;
    size_t piece;                 /* examples per piece */
    size_t max_pieces;            /* ceil(max_batch / piece) */
    int nslots;                   /* min(max_pieces, MAX_SLOTS) */
    int is_dense_only;            /* softmax or MLP */
    int reuse_vars;               /* a replica or keel_model_new_shared:
                                   * another model's variables */
    lbuf *buf[MAX_THREADS];       /* [thread][layer] activations */
    lgrad *slot[MAX_SLOTS];       /* [slot][layer] */
    double *piece_loss;           /* [max_pieces] */
    int64_t *piece_correct;
    /* the last call, when it was a step of one piece in buf[0]
     * (keel__model_step_io): its batch and gradients */
    int last_io;
    const float *last_x;
    size_t last_n;
    const keel_grads *last_grads;
};

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

static const char *const model_names[] = { "softmax", "mlp", "cnn" };
static const char *const act_names[] = { "relu", "tanh", "none" };
static const char *const init_names[] = { "glorot", "torch" };

KEEL__FROM_NAME(keel_model_kind_from_name, keel_model_kind,
                "model type", model_names)

KEEL__NAME(keel_model_kind_name, keel_model_kind, model_names)

KEEL__FROM_NAME(keel_activation_from_name, keel_activation,
                "activation", act_names)

KEEL__FROM_NAME(keel_init_kind_from_name, keel_init_kind,
                "init scheme", init_names)

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
    free(m->piece_loss);
    free(m->piece_correct);
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
    m->piece_loss = calloc(m->max_pieces, sizeof *m->piece_loss);
    m->piece_correct = calloc(m->max_pieces, sizeof *m->piece_correct);
    if (m->piece_loss == NULL || m->piece_correct == NULL)
        return keel__fail(KEEL_ENOMEM, "model: per-piece statistics");
    return keel__pool_new(m->nthreads, &m->pool);
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
    if ((st = check_config(cfg)) != KEEL_OK)
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
forward(keel_model *m, lbuf *buf, const float *x, size_t n)
{
    const float *in = x;
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        lbuf *B = &buf[i];
        if (L->kind == L_DENSE) {
            keel__dense_forward(in, n, L->din, L->dout,
                                keel_var_tensor(L->w)->data, NULL, B->y);
            keel__bias_act_forward(L->act, B->y, n, L->dout,
                                   keel_var_tensor(L->b)->data);
        } else if (L->kind == L_CONV) {
            keel__conv_forward(&L->cg, in, n, keel_var_tensor(L->w)->data,
                               NULL, B->col, B->y);
            if (!L->fused)
                keel__bias_act_forward(L->act, B->y,
                                       n * L->cg.oh * L->cg.ow, L->cg.cout,
                                       keel_var_tensor(L->b)->data);
        } else {
            layer *P = i > 0 ? &m->l[i - 1] : NULL;
            keel__pool_forward(&L->pg, in, n, B->y, B->arg);
            if (P != NULL && P->fused)
                keel__bias_act_forward(P->act, B->y,
                                       n * L->pg.oh * L->pg.ow, L->pg.c,
                                       keel_var_tensor(P->b)->data);
        }
        in = B->y;
    }
}

/* Where a backward pass puts what it computes of the layers with
 * parameters: their gradients (kfac NULL), or K-FAC's factor statistics
 * (the upper triangles of sum a a^T and sum g g^T into A[f], G[f] for the
 * f-th such layer, added when accumulate; no parameter gradients). */
typedef struct kfac_sink {
    int accumulate;
    float *const *A, *const *G;
} kfac_sink;

/* Backward through every layer of one piece; dlogits already in place.
 * Parameter gradients are overwritten in g, except that with direct (piece
 * 0) dense layers add theirs straight into it (sgemm beta 1); with kfac,
 * the factor statistics instead (g and direct unused). */
static void
backward(keel_model *m, lbuf *buf, lgrad *g, const float *x, size_t n,
         keel_grads *direct, const kfac_sink *kfac)
{
    int f = 0;
    for (int i = 0; i < m->nl; i++)
        f += m->l[i].w != NULL;
    for (int i = m->nl - 1; i >= 0; i--) {
        layer *L = &m->l[i];
        lbuf *B = &buf[i];
        layer *P = i > 0 ? &m->l[i - 1] : NULL;
        const float *in = i > 0 ? buf[i - 1].y : x;
        float *dx = i > 0 ? buf[i - 1].dy : NULL;
        if (L->act != KEEL_ACT_NONE && !L->fused)
            keel__act_backward(L->act, B->y, B->dy, n * L->out_size);
        if (L->kind == L_POOL && P != NULL && P->fused) {
            /* the conv's activation and bias live on the pooled output */
            keel__act_backward(P->act, B->y, B->dy, n * L->out_size);
            if (kfac == NULL)
                keel__col_sums(B->dy, n * L->pg.oh * L->pg.ow, L->pg.c,
                               g[i - 1].db);
        }
        if (L->kind == L_POOL) {
            keel__pool_backward(&L->pg, B->dy, n, B->arg, dx);
            continue;
        }
        f--;
        if (kfac != NULL && L->kind == L_DENSE) {
            keel__cov_add(in, n, L->din, L->din, 1, kfac->accumulate,
                          kfac->A[f]);
            keel__cov_add(B->dy, n, L->dout, L->dout, 0, kfac->accumulate,
                          kfac->G[f]);
            if (dx != NULL)
                keel__sgemm(0, 1, n, L->din, L->dout, 1.0f, B->dy, L->dout,
                            keel_var_tensor(L->w)->data, L->dout, 0.0f, dx,
                            L->din);
        } else if (kfac != NULL) {
            keel__conv_patch_cov(&L->cg, in, n, B->col, 1, kfac->accumulate,
                                 kfac->A[f]);
            keel__cov_add(B->dy, n * L->cg.oh * L->cg.ow, L->cg.cout,
                          L->cg.cout, 0, kfac->accumulate, kfac->G[f]);
            if (dx != NULL)
                keel__conv_backward_dx(&L->cg, n, B->dy,
                                       keel_var_tensor(L->w)->data, B->col,
                                       dx);
        } else if (L->kind == L_DENSE && direct != NULL)
            keel__dense_backward(in, B->dy, n, L->din, L->dout,
                                 keel_var_tensor(L->w)->data,
                                 keel_grads_at(direct,
                                               keel_var_index(L->w))->data,
                                 keel_grads_at(direct,
                                               keel_var_index(L->b))->data,
                                 dx, 1);
        else if (L->kind == L_DENSE)
            keel__dense_backward(in, B->dy, n, L->din, L->dout,
                                 keel_var_tensor(L->w)->data, g[i].dw,
                                 g[i].db, dx, 0);
        else
            keel__conv_backward(&L->cg, in, n, B->dy,
                                keel_var_tensor(L->w)->data, B->col, 1,
                                g[i].dw, L->fused ? NULL : g[i].db, dx);
    }
}

enum { JOB_STEP, JOB_EVAL, JOB_PREDICT };

/* Dense-only models compute every dense layer in two fixed column halves
 * (of the outputs for y, dw and db; of the inputs for dx) on any thread
 * count, so two model threads share one piece and the bits never depend on
 * which thread ran a half (sgemm rounds a column by its call's shape).
 * Dimensions below DENSE_SPLIT_MIN are one half and an empty one. */
#define DENSE_SPLIT_MIN 64

static void
dense_half(size_t dim, int h, size_t *lo, size_t *hi)
{
    size_t mid = dim >= DENSE_SPLIT_MIN ? ((dim / 2 + 15) & ~(size_t)15)
                                        : dim;
    *lo = h == 0 ? 0 : mid;
    *hi = h == 0 ? mid : dim;
}

/* One model call spread over the pool: tasks are taken in any order by any
 * thread; each task's result lands in its own place. */
typedef struct job {
    keel_model *m;
    int what;
    const keel_batch *batch;
    size_t npieces;
    float scale;                 /* 1 / global batch size */
    float *probs;
    keel_grads *grads;           /* JOB_STEP: the caller's */
    keel_grads *direct;          /* JOB_STEP: piece 0's dense grads go
                                  * straight into the caller's grads */
    size_t base;                 /* task i is piece base + i */
    int ntasks;
    int nthreads;
    _Atomic int next;            /* next task */
    keel__spin_barrier bar;      /* the column halves' layer barrier */
} job;

/* The end of a piece's forward, on one thread: probabilities (predict), or
 * loss, correct count and (for a step) dlogits. */
static void
finish_piece(job *j, lbuf *buf, size_t p, size_t lo, size_t n)
{
    keel_model *m = j->m;
    lbuf *last = &buf[m->nl - 1];
    size_t k = m->l[m->nl - 1].dout;
    if (j->what == JOB_PREDICT) {
        for (size_t i = 0; i < n; i++) {
            const float *z = last->y + i * k;
            float *pr = j->probs + (lo + i) * k;
            float mx = z[0];
            double sum = 0.0;
            for (size_t c = 1; c < k; c++)
                mx = z[c] > mx ? z[c] : mx;
            for (size_t c = 0; c < k; c++)
                sum += exp((double)z[c] - (double)mx);
            for (size_t c = 0; c < k; c++)
                pr[c] = (float)(exp((double)z[c] - (double)mx) / sum);
        }
        return;
    }
    m->piece_loss[p] = 0.0;
    m->piece_correct[p] = 0;
    keel__softmax_xent(last->y, j->batch->y + lo, n, k, j->scale,
                       j->what == JOB_STEP ? last->dy : NULL,
                       &m->piece_loss[p], &m->piece_correct[p]);
}

/* Piece p of a dense-only model in column halves: thread t of T computes
 * the halves h with h % T == t (T = 1: all of them), with a barrier after
 * every layer when T > 1; thread 0 finishes the forward. For a step,
 * backward into g, or piece 0's straight into the caller's grads. */
static void
dense_piece_part(job *j, lbuf *buf, int t, int T, size_t p, lgrad *g)
{
    keel_model *m = j->m;
    size_t lo = p * m->piece;
    size_t hi = lo + m->piece < j->batch->n ? lo + m->piece : j->batch->n;
    size_t n = hi - lo, c0, c1;
    const float *x = j->batch->x + lo * m->l[0].in_size;
    keel_grads *direct = p == 0 ? j->direct : NULL;
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        const float *in = i > 0 ? buf[i - 1].y : x;
        const float *w = keel_var_tensor(L->w)->data;
        const float *b = keel_var_tensor(L->b)->data;
        for (int h = t; h < 2; h += T) {
            dense_half(L->dout, h, &c0, &c1);
            if (c0 == c1)
                continue;
            keel__dense_forward_cols(in, n, L->din, L->dout, w, buf[i].y, c0,
                                     c1);
            keel__bias_act_forward_ld(L->act, buf[i].y + c0, n, c1 - c0,
                                      L->dout, b + c0);
        }
        if (T > 1)
            keel__spin_barrier_wait(&j->bar);
    }
    if (t == 0)
        finish_piece(j, buf, p, lo, n);
    if (j->what != JOB_STEP)
        return;
    if (T > 1)
        keel__spin_barrier_wait(&j->bar);       /* dlogits */
    for (int i = m->nl - 1; i >= 0; i--) {
        layer *L = &m->l[i];
        layer *P = i > 0 ? &m->l[i - 1] : NULL;
        const float *in = i > 0 ? buf[i - 1].y : x;
        const float *w = keel_var_tensor(L->w)->data;
        float *dw = g[i].dw, *db = g[i].db;
        if (direct != NULL) {
            dw = keel_grads_at(direct, keel_var_index(L->w))->data;
            db = keel_grads_at(direct, keel_var_index(L->b))->data;
        }
        for (int h = t; h < 2; h += T) {
            dense_half(L->dout, h, &c0, &c1);
            if (c0 < c1)
                keel__dense_backward_cols(in, buf[i].dy, n, L->din, L->dout,
                                          dw, db, c0, c1, direct != NULL);
        }
        if (P == NULL)
            break;
        /* dx, and the previous layer's activation gradient, by input
         * half: the same halves as that layer's outputs, so its dw below
         * reads only what this thread wrote; its dx needs the barrier */
        for (int h = t; h < 2; h += T) {
            dense_half(L->din, h, &c0, &c1);
            if (c0 == c1)
                continue;
            keel__dense_dx_cols(buf[i].dy, n, L->din, L->dout, w,
                                buf[i - 1].dy, c0, c1);
            if (P->act != KEEL_ACT_NONE)
                keel__act_backward_ld(P->act, buf[i - 1].y + c0,
                                      buf[i - 1].dy + c0, n, c1 - c0, L->din);
        }
        if (T > 1)
            keel__spin_barrier_wait(&j->bar);
    }
}

/* Forward (and for a step, backward into g) of piece p on thread t. */
static void
run_piece(job *j, int t, size_t p, lgrad *g)
{
    keel_model *m = j->m;
    lbuf *buf = m->buf[t];
    size_t lo = p * m->piece, hi, n;
    const float *x;
    if (m->is_dense_only) {
        dense_piece_part(j, buf, 0, 1, p, g);
        return;
    }
    hi = lo + m->piece < j->batch->n ? lo + m->piece : j->batch->n;
    n = hi - lo;
    x = j->batch->x + lo * m->l[0].in_size;
    forward(m, buf, x, n);
    finish_piece(j, buf, p, lo, n);
    if (j->what == JOB_STEP)
        backward(m, buf, g, x, n, p == 0 ? j->direct : NULL, NULL);
}

/* A dense-only model's only piece, its column halves over the threads. */
static void
halves_worker(void *ctx, int t)
{
    job *j = ctx;
    dense_piece_part(j, j->m->buf[0], t, j->nthreads, 0, j->m->slot[0]);
}

static void
job_worker(void *ctx, int t)
{
    job *j = ctx;
    int task;
    while ((task = j->next++) < j->ntasks)
        run_piece(j, t, j->base + (size_t)task,
                  j->what == JOB_STEP ? j->m->slot[task] : NULL);
}

/* dst[lo, hi) = the round's pieces added along the reduction tree
 * (keel__tree_sum) whose leaf 0 is dst + slot 0 (or dst alone when piece
 * 0 went straight into it) and leaf i the slot i: for a round onto zero
 * gradients, the same bits as any split of the round into runs of pieces
 * that are tree nodes, whose sums are added later along the same tree
 * (mirrored replicas, cluster workers). Whichever thread does which
 * range. */
static void
reduce_range(float *dst, float *const *src, int S, int has_first,
             size_t lo, size_t hi)
{
    keel__tree_node nodes[MAX_SLOTS + 1];
    const float *parts[MAX_SLOTS + 1];
    int k = 0;
    if (lo >= hi)
        return;
    if (!has_first)
        keel__add_into(dst + lo, src[0] + lo, hi - lo);
    parts[k] = dst;
    nodes[k].lo = 0;
    nodes[k].hi = 1;
    k++;
    for (int s = 1; s < S + has_first; s++, k++) {
        parts[k] = src[s - has_first];
        nodes[k].lo = k;
        nodes[k].hi = k + 1;
    }
    if (k > 1)
        (void)keel__tree_sum(k, nodes, parts, k, dst, lo, hi);
}

/* Thread t's share of every parameter gradient: slots added into grads. */
static void
reduce_worker(void *ctx, int t)
{
    job *j = ctx;
    keel_model *m = j->m;
    int S = j->ntasks, T = j->nthreads;
    for (int i = 0; i < m->nl; i++) {
        layer *L = &m->l[i];
        float *src[MAX_SLOTS];
        keel_tensor *gw, *gb;
        size_t cw, cb;
        int s0 = L->kind == L_DENSE && j->direct != NULL && j->base == 0;
        if (L->w == NULL || s0 >= S)
            continue;                /* none, or piece 0 already added */
        gw = keel_grads_at(j->grads, keel_var_index(L->w));
        gb = keel_grads_at(j->grads, keel_var_index(L->b));
        cw = gw->count;
        cb = gb->count;
        for (int s = s0; s < S; s++)
            src[s - s0] = m->slot[s][i].dw;
        /* ranges in multiples of 16 floats (one cache line) */
        reduce_range(gw->data, src, S - s0, s0,
                     (cw * (size_t)t / (size_t)T) & ~(size_t)15,
                     t + 1 == T ? cw
                                : (cw * (size_t)(t + 1) / (size_t)T) &
                                      ~(size_t)15);
        if (t == 0) {
            for (int s = s0; s < S; s++)
                src[s - s0] = m->slot[s][i].db;
            reduce_range(gb->data, src, S - s0, s0, 0, cb);
        }
    }
}

/* Cut the batch into pieces and run them over the pool: evaluation all at
 * once; a step MAX_SLOTS pieces at a time, each round's slots added into
 * grads before the next (piece 0's dense gradients straight into grads). */
static void
run_job(keel_model *m, job *j, int what, const keel_batch *batch,
        float scale, float *probs, keel_grads *grads)
{
    size_t np = (batch->n + m->piece - 1) / m->piece;
    /* a step of one piece leaves its activations and output gradients in
     * buf[0] (one thread's piece, or the column halves' shared one) */
    m->last_io = what == JOB_STEP && m->is_dense_only && np == 1;
    m->last_x = batch->x;
    m->last_n = batch->n;
    m->last_grads = grads;
    *j = (job){ .m = m, .what = what, .batch = batch, .npieces = np,
                .scale = scale, .probs = probs, .grads = grads,
                .nthreads = keel__pool_threads(m->pool) };
    if (what == JOB_STEP)
        j->direct = keel__grads_direct ? grads : NULL;
    if (m->is_dense_only && np == 1 && j->nthreads > 1) {
        j->bar.n = j->nthreads;
        keel__pool_run(m->pool, halves_worker, j);
        if (what == JOB_STEP && j->direct == NULL) {
            j->ntasks = 1;           /* the halves went into slot 0 */
            j->nthreads = 1;
            reduce_worker(j, 0);
        }
        return;
    }
    if (what != JOB_STEP) {
        j->ntasks = (int)np;
        j->next = 0;
        if (np == 1)
            job_worker(j, 0);
        else
            keel__pool_run(m->pool, job_worker, j);
        return;
    }
    for (size_t base = 0; base < np; base += MAX_SLOTS) {
        j->base = base;
        j->ntasks = np - base < MAX_SLOTS ? (int)(np - base) : MAX_SLOTS;
        j->next = 0;
        j->nthreads = keel__pool_threads(m->pool);
        if (j->ntasks == 1 || j->nthreads == 1)
            job_worker(j, 0);
        else
            keel__pool_run(m->pool, job_worker, j);
        if (j->ntasks == 1 || j->nthreads == 1) {
            j->nthreads = 1;         /* reduce_worker: all of it here */
            reduce_worker(j, 0);
        } else {
            keel__pool_run(m->pool, reduce_worker, j);
        }
    }
}

static void
sum_stats(const keel_model *m, const job *j, keel_step_stats *stats)
{
    double loss = 0.0;
    int64_t correct = 0;
    for (size_t p = 0; p < j->npieces; p++) {
        loss += m->piece_loss[p];
        correct += m->piece_correct[p];
    }
    if (stats != NULL) {
        stats->loss_sum = loss;
        stats->correct = correct;
        stats->count = (int64_t)j->batch->n;
    }
}

static keel_status
model_step_fp(keel_model *m, keel_vars *vs, const keel_batch *batch,
              int64_t global_batch_size, keel_grads *grads,
              keel_step_stats *stats)
{
    keel_status st;
    job j;
    if (m == NULL || vs == NULL || grads == NULL)
        return keel__fail(KEEL_EINVAL, "model step: NULL argument");
    m->last_io = 0;
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
    run_job(m, &j, JOB_STEP, batch, (float)(1.0 / (double)global_batch_size),
            NULL, grads);
    sum_stats(m, &j, stats);
    return KEEL_OK;
}

keel_status
keel_model_step(keel_model *m, keel_vars *vs, const keel_batch *batch,
                int64_t global_batch_size, keel_grads *grads,
                keel_step_stats *stats)
{
    return KEEL__FLUSHED(model_step_fp(m, vs, batch, global_batch_size, grads,
                                       stats));
}

static keel_status
model_eval_fp(keel_model *m, keel_vars *vs, const keel_batch *batch,
              keel_step_stats *stats)
{
    keel_status st;
    job j;
    if (m == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "model eval: NULL argument");
    if ((st = check_batch(m, batch, "eval")) != KEEL_OK)
        return st;
    run_job(m, &j, JOB_EVAL, batch, 1.0f, NULL, NULL);
    sum_stats(m, &j, stats);
    return KEEL_OK;
}

keel_status
keel_model_eval(keel_model *m, keel_vars *vs, const keel_batch *batch,
                keel_step_stats *stats)
{
    return KEEL__FLUSHED(model_eval_fp(m, vs, batch, stats));
}

static keel_status
model_predict_fp(keel_model *m, keel_vars *vs, const keel_batch *batch,
                 float *probs)
{
    job j;
    if (m == NULL || vs == NULL || batch == NULL || batch->x == NULL ||
        probs == NULL)
        return keel__fail(KEEL_EINVAL, "model predict: NULL argument");
    if (batch->n < 1 || batch->n > (size_t)m->cfg.max_batch)
        return keel__fail(KEEL_EINVAL, "model predict: batch of %zu "
                          "examples (1..max_batch %lld)", batch->n,
                          (long long)m->cfg.max_batch);
    run_job(m, &j, JOB_PREDICT, batch, 1.0f, probs, NULL);
    return KEEL_OK;
}

keel_status
keel_model_predict(keel_model *m, keel_vars *vs, const keel_batch *batch,
                   float *probs)
{
    return KEEL__FLUSHED(model_predict_fp(m, vs, batch, probs));
}

/* ---- K-FAC statistics ---------------------------------------------------- */

int
keel__model_kfac_layers(const keel_model *m, keel__kfac_layer *out, int max)
{
    int k = 0;
    for (int i = 0; i < m->nl; i++) {
        const layer *L = &m->l[i];
        keel__kfac_layer *o;
        if (L->w == NULL)
            continue;
        if (k < max) {
            o = &out[k];
            memset(o, 0, sizeof *o);
            o->is_conv = L->kind == L_CONV;
            o->w = L->w;
            o->b = L->b;
            if (o->is_conv) {
                o->a_dim = L->cg.kh * L->cg.kw * L->cg.cin + 1;
                o->g_dim = L->cg.cout;
                o->locations = L->cg.oh * L->cg.ow;
                o->cg = L->cg;
            } else {
                o->a_dim = L->din + 1;
                o->g_dim = L->dout;
                o->locations = 1;
            }
        }
        k++;
    }
    return k;
}

/* Targets of one piece: the labels, or one draw per example from the
 * softmax of its logits (inverse CDF of a uniform in [0, 1), in double). */
void
keel__kfac_draw_targets(const float *logits, size_t n, size_t k,
                        const int32_t *labels, keel__rng *rng, int32_t *t)
{
    for (size_t i = 0; i < n; i++) {
        const float *z = logits + i * k;
        float mx = z[0];
        double sum = 0.0, u, acc = 0.0;
        size_t c;
        if (rng == NULL) {
            t[i] = labels[i];
            continue;
        }
        for (c = 1; c < k; c++)
            mx = z[c] > mx ? z[c] : mx;
        for (c = 0; c < k; c++)
            sum += exp((double)z[c] - (double)mx);
        u = (double)(keel__rng_next(rng) >> 11) * 0x1.0p-53 * sum;
        for (c = 0; c + 1 < k; c++) {
            acc += exp((double)z[c] - (double)mx);
            if (u < acc)
                break;
        }
        t[i] = (int32_t)c;
    }
}

keel_status
keel__model_kfac_stats(keel_model *m, const keel_batch *batch, keel__rng *rng,
                       int32_t *targets, int accumulate, int after_step,
                       float *const *A, float *const *G)
{
    keel_status st;
    lbuf *buf;
    size_t k_out;
    kfac_sink sink = { accumulate, A, G };
    int have_fwd;
    if ((st = check_batch(m, batch, "K-FAC statistics")) != KEEL_OK)
        return st;
    /* the step's one piece left every layer's activations in buf[0]
     * (its backward writes only the gradients) */
    have_fwd = after_step && m->last_io && batch->x == m->last_x &&
               batch->n == m->last_n;
    m->last_io = 0;
    buf = m->buf[0];
    k_out = m->l[m->nl - 1].dout;
    for (size_t lo = 0; lo < batch->n; lo += m->piece) {
        size_t n = batch->n - lo < m->piece ? batch->n - lo : m->piece;
        const float *x = batch->x + lo * m->l[0].in_size;
        double loss = 0.0;
        int64_t correct = 0;
        if (!have_fwd)
            forward(m, buf, x, n);
        keel__kfac_draw_targets(buf[m->nl - 1].y, n, k_out, batch->y + lo,
                                rng, targets + lo);
        keel__softmax_xent(buf[m->nl - 1].y, targets + lo, n, k_out, 1.0f,
                           buf[m->nl - 1].dy, &loss, &correct);
        backward(m, buf, NULL, x, n, NULL, &sink);
        sink.accumulate = 1;
    }
    return KEEL_OK;
}

int
keel__model_step_io(const keel_model *m, const keel_batch *batch, int f,
                    const keel_grads **grads, const float **in,
                    const float **dy)
{
    int k = 0;
    if (m == NULL || batch == NULL || !m->last_io || batch->x != m->last_x ||
        batch->n != m->last_n)
        return 0;
    for (int i = 0; i < m->nl; i++) {
        if (m->l[i].w == NULL || k++ != f)
            continue;
        if (m->l[i].kind != L_DENSE)
            return 0;
        *grads = m->last_grads;
        *in = i > 0 ? m->buf[0][i - 1].y : batch->x;
        *dy = m->buf[0][i].dy;
        return 1;
    }
    return 0;
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

/* ---- architecture description (docs/checkpoint-format.md) -------------- */

static struct json_object *
json_ints(const int64_t *v, int n)
{
    struct json_object *a = json_object_new_array();
    for (int i = 0; a != NULL && i < n; i++)
        json_object_array_add(a, json_object_new_int64(v[i]));
    return a;
}

static const char *
keras_activation(keel_activation a)
{
    return a == KEEL_ACT_RELU ? "relu" : a == KEEL_ACT_TANH ? "tanh"
                                                           : "linear";
}

static void
json_set_str(struct json_object *o, const char *key, const char *s)
{
    json_object_object_add(o, key, json_object_new_string(s));
}

static void
json_set_int(struct json_object *o, const char *key, int64_t v)
{
    json_object_object_add(o, key, json_object_new_int64(v));
}

/* The model's config members of the architecture record. */
static void
arch_config(struct json_object *o, const keel_model_config *c)
{
    int64_t shape[3] = { c->height, c->width, c->channels };
    json_set_str(o, "model", model_names[c->kind]);
    json_object_object_add(o, "input_shape", json_ints(shape, 3));
    json_set_int(o, "classes", c->classes);
    json_object_object_add(o, "hidden",
                           json_ints(c->hidden, c->kind == KEEL_MODEL_MLP
                                                    ? c->n_hidden : 0));
    json_set_str(o, "activation", act_names[c->activation]);
    json_set_str(o, "init", init_names[c->init]);
    json_set_str(o, "output", "logits");
}

/* A Keras MaxPooling2D layer (the n-th) for l. */
static void
arch_pool(struct json_object *L, const layer *l, int n)
{
    int64_t k[2] = { (int64_t)l->pg.k, (int64_t)l->pg.k };
    int64_t s[2] = { (int64_t)l->pg.s, (int64_t)l->pg.s };
    char name[48];
    snprintf(name, sizeof name, "max_pooling2d_%d", n);
    json_set_str(L, "name", name);
    json_set_str(L, "class_name", "MaxPooling2D");
    json_object_object_add(L, "pool_size", json_ints(k, 2));
    json_object_object_add(L, "strides", json_ints(s, 2));
    json_set_str(L, "padding", "valid");
}

/* A Keras Dense or Conv2D layer for l, named by its variables' scope,
 * with its activation and its variables' names. */
static void
arch_params(struct json_object *L, const layer *l)
{
    const char *vn = keel_var_name(l->w);
    const char *slash = strchr(vn, '/');
    struct json_object *w = json_object_new_array();
    char name[48];
    snprintf(name, sizeof name, "%.*s", (int)(slash - vn), vn);
    json_set_str(L, "name", name);
    if (l->kind == L_DENSE) {
        json_set_str(L, "class_name", "Dense");
        json_set_int(L, "units", (int64_t)l->dout);
    } else {
        int64_t k[2] = { (int64_t)l->cg.kh, (int64_t)l->cg.kw };
        int64_t s[2] = { (int64_t)l->cg.sh, (int64_t)l->cg.sw };
        json_set_str(L, "class_name", "Conv2D");
        json_set_int(L, "filters", (int64_t)l->cg.cout);
        json_object_object_add(L, "kernel_size", json_ints(k, 2));
        json_object_object_add(L, "strides", json_ints(s, 2));
        json_set_str(L, "padding", "valid");
    }
    json_set_str(L, "activation", keras_activation(l->act));
    json_object_array_add(w, json_object_new_string(vn));
    json_object_array_add(w, json_object_new_string(keel_var_name(l->b)));
    json_object_object_add(L, "weights", w);
}

/* The architecture record (a Keras-like layer list) of m. */
struct json_object *
keel__model_arch(const keel_model *m)
{
    struct json_object *o = json_object_new_object(), *layers;
    int n_pool = 0;
    if (o == NULL)
        return NULL;
    arch_config(o, &m->cfg);
    layers = json_object_new_array();
    json_object_object_add(o, "layers", layers);
    for (int i = 0; i < m->nl; i++) {
        const layer *l = &m->l[i];
        struct json_object *L = json_object_new_object();
        if (l->kind == L_DENSE && (i == 0 || m->l[i - 1].kind != L_DENSE)) {
            /* Keras flattens NHWC in (h, w, c) order, as keel does */
            struct json_object *f = json_object_new_object();
            json_set_str(f, "name", "flatten_1");
            json_set_str(f, "class_name", "Flatten");
            json_object_array_add(layers, f);
        }
        if (l->kind == L_POOL)
            arch_pool(L, l, ++n_pool);
        else
            arch_params(L, l);
        json_object_array_add(layers, L);
    }
    return o;
}

static keel_status
arch_int(struct json_object *o, const char *key, int64_t lo, int64_t hi,
         int64_t *out)
{
    struct json_object *v;
    if (!json_object_object_get_ex(o, key, &v) ||
        !json_object_is_type(v, json_type_int) ||
        json_object_get_int64(v) < lo || json_object_get_int64(v) > hi)
        return keel__fail(KEEL_ECORRUPT, "architecture: '%s' is not an "
                          "integer in [%lld, %lld]", key, (long long)lo,
                          (long long)hi);
    *out = json_object_get_int64(v);
    return KEEL_OK;
}

static keel_status
arch_name(struct json_object *o, const char *key, const char *const *names,
          int n, int *out)
{
    struct json_object *v;
    if (!json_object_object_get_ex(o, key, &v) ||
        !json_object_is_type(v, json_type_string))
        return keel__fail(KEEL_ECORRUPT, "architecture: '%s' is missing or "
                          "not a string", key);
    return keel__name_lookup(key, json_object_get_string(v), names, n,
                             out);
}

keel_status
keel__model_config_from_arch(struct json_object *o, keel_model_config *mc)
{
    struct json_object *a;
    keel_status st;
    int k = 0;
    keel_model_config_init(mc);
    if (o == NULL || !json_object_is_type(o, json_type_object))
        return keel__fail(KEEL_ECORRUPT, "architecture: not a JSON object");
    if ((st = arch_name(o, "model", model_names, 3, &k)) != KEEL_OK)
        return st;
    mc->kind = (keel_model_kind)k;
    if ((st = arch_name(o, "activation", act_names, 3, &k)) != KEEL_OK)
        return st;
    mc->activation = (keel_activation)k;
    if ((st = arch_name(o, "init", init_names, 2, &k)) != KEEL_OK)
        return st;
    mc->init = (keel_init_kind)k;
    if ((st = arch_int(o, "classes", 2, 1000000, &mc->classes)) != KEEL_OK)
        return st;
    if (!json_object_object_get_ex(o, "input_shape", &a) ||
        !json_object_is_type(a, json_type_array) ||
        json_object_array_length(a) != 3)
        return keel__fail(KEEL_ECORRUPT, "architecture: input_shape is not "
                          "[height, width, channels]");
    for (int i = 0; i < 3; i++) {
        struct json_object *v = json_object_array_get_idx(a, (size_t)i);
        int64_t *dst = i == 0 ? &mc->height : i == 1 ? &mc->width
                                                     : &mc->channels;
        if (!json_object_is_type(v, json_type_int) ||
            json_object_get_int64(v) < 1 || json_object_get_int64(v) > 4096)
            return keel__fail(KEEL_ECORRUPT, "architecture: input_shape[%d] "
                              "is not an integer in [1, 4096]", i);
        *dst = json_object_get_int64(v);
    }
    mc->n_hidden = 0;
    if (json_object_object_get_ex(o, "hidden", &a)) {
        if (!json_object_is_type(a, json_type_array) ||
            json_object_array_length(a) > KEEL_MODEL_MAX_HIDDEN)
            return keel__fail(KEEL_ECORRUPT, "architecture: hidden is not a "
                              "list of at most %d sizes",
                              KEEL_MODEL_MAX_HIDDEN);
        for (size_t i = 0; i < json_object_array_length(a); i++) {
            struct json_object *v = json_object_array_get_idx(a, i);
            if (!json_object_is_type(v, json_type_int) ||
                json_object_get_int64(v) < 1 ||
                json_object_get_int64(v) > 1 << 20)
                return keel__fail(KEEL_ECORRUPT, "architecture: hidden[%zu] "
                                  "is not an integer in [1, 1048576]", i);
            mc->hidden[mc->n_hidden++] = json_object_get_int64(v);
        }
    }
    return check_config(mc);
}
