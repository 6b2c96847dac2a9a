/* check_train.c - unit tests for train/: finite-difference gradient checks
 * of every layer and of whole models, optimizer and schedule formulas
 * against hand-computed values, exact Adam continuation after a restore,
 * micro-batch determinism, IDX/HDF5 readers (good and corrupt files) and the
 * batch iterator (shuffling, worker slices, resume, epoch limit). */
#include <config.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hdf5.h>
#include <zlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <keel/keel.h>
#include "util.h"
#include "train_int.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------ */

static void
fill_uniform(float *p, size_t n, uint64_t seed, float lo, float hi)
{
    keel__rng r;
    keel__rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        p[i] = keel__rng_uniform(&r, lo, hi);
}

/* A layer under test: fwd() recomputes out (ny floats) from the current
 * parameter buffers. The checked scalar is L = sum r[i] * out[i]. */
typedef struct gcheck {
    void (*fwd)(struct gcheck *g);
    float *out;
    size_t ny;
    float *r;
    void *ctx;
} gcheck;

static double
gc_loss(gcheck *g)
{
    double s = 0.0;
    g->fwd(g);
    for (size_t i = 0; i < g->ny; i++)
        s += (double)g->r[i] * (double)g->out[i];
    return s;
}

/* Central differences for every element of p against analytic grad. */
static void
gc_param(gcheck *g, float *p, size_t np, const float *analytic, float eps,
         const char *what)
{
    for (size_t i = 0; i < np; i++) {
        float save = p[i];
        double lp, lm, num;
        p[i] = save + eps;
        lp = gc_loss(g);
        p[i] = save - eps;
        lm = gc_loss(g);
        p[i] = save;
        num = (lp - lm) / (2.0 * (double)eps);
        ck_assert_msg(fabs(num - (double)analytic[i]) <=
                          2e-3 + 1e-2 * fabs(num),
                      "%s[%zu]: analytic %.6g, numeric %.6g", what, i,
                      (double)analytic[i], num);
    }
}

/* ---- layer gradient checks ---------------------------------------------- */

typedef struct dense_ctx {
    float *x, *w, *b;
    size_t n, in, out;
} dense_ctx;

static void
dense_fwd(gcheck *g)
{
    dense_ctx *c = g->ctx;
    keel__dense_forward(c->x, c->n, c->in, c->out, c->w, c->b, g->out);
}

START_TEST(test_dense_gradients_match_finite_differences)
{
    dense_ctx c = { .n = 3, .in = 5, .out = 4 };
    float x[15], w[20], b[4], y[12], r[12], dw[20], db[4], dx[15];
    gcheck g = { dense_fwd, y, 12, r, &c };
    c.x = x;
    c.w = w;
    c.b = b;
    fill_uniform(x, 15, 1, -1, 1);
    fill_uniform(w, 20, 2, -1, 1);
    fill_uniform(b, 4, 3, -1, 1);
    fill_uniform(r, 12, 4, -1, 1);
    keel__dense_backward(x, r, 3, 5, 4, w, dw, db, dx, 0);
    gc_param(&g, w, 20, dw, 1e-2f, "dense dW");
    gc_param(&g, b, 4, db, 1e-2f, "dense db");
    gc_param(&g, x, 15, dx, 1e-2f, "dense dx");
}
END_TEST

typedef struct conv_ctx {
    keel__conv_geom geom;
    float *x, *w, *b, *col;
    size_t n;
} conv_ctx;

static void
conv_fwd(gcheck *g)
{
    conv_ctx *c = g->ctx;
    keel__conv_forward(&c->geom, c->x, c->n, c->w, c->b, c->col, g->out);
}

static void
check_conv(size_t h, size_t w, size_t cin, size_t cout, size_t k,
           size_t stride, int same)
{
    conv_ctx c;
    size_t nx, nw, ny;
    float *x, *wt, *b, *y, *r, *dw, *db, *dx, *col;
    gcheck g;
    memset(&c, 0, sizeof c);
    c.geom.h = h;
    c.geom.w = w;
    c.geom.cin = cin;
    c.geom.cout = cout;
    c.geom.kh = c.geom.kw = k;
    c.geom.sh = c.geom.sw = stride;
    ck_assert_int_eq(keel__conv_geom_init(&c.geom, same), KEEL_OK);
    c.n = 2;
    nx = c.n * h * w * cin;
    nw = k * k * cin * cout;
    ny = c.n * c.geom.oh * c.geom.ow * cout;
    x = malloc(nx * 4);
    wt = malloc(nw * 4);
    b = malloc(cout * 4);
    y = malloc(ny * 4);
    r = malloc(ny * 4);
    dw = malloc(nw * 4);
    db = malloc(cout * 4);
    dx = malloc(nx * 4);
    col = malloc(keel__conv_col_size(&c.geom, c.n) * 4);
    fill_uniform(x, nx, 11, -1, 1);
    fill_uniform(wt, nw, 12, -1, 1);
    fill_uniform(b, cout, 13, -1, 1);
    fill_uniform(r, ny, 14, -1, 1);
    c.x = x;
    c.w = wt;
    c.b = b;
    c.col = col;
    g = (gcheck){ conv_fwd, y, ny, r, &c };
    keel__conv_backward(&c.geom, x, c.n, r, wt, col, 0, dw, db, dx);
    gc_param(&g, wt, nw, dw, 1e-2f, "conv dW");
    gc_param(&g, b, cout, db, 1e-2f, "conv db");
    gc_param(&g, x, nx, dx, 1e-2f, "conv dx");
    free(x);
    free(wt);
    free(b);
    free(y);
    free(r);
    free(dw);
    free(db);
    free(dx);
    free(col);
}

START_TEST(test_conv2d_valid_gradients_match_finite_differences)
{
    check_conv(5, 6, 2, 3, 3, 1, 0);
}
END_TEST

START_TEST(test_conv2d_same_strided_gradients_match_finite_differences)
{
    keel__conv_geom g = { .h = 5, .w = 6, .cin = 1, .kh = 3, .kw = 3,
                          .cout = 1, .sh = 2, .sw = 2 };
    ck_assert_int_eq(keel__conv_geom_init(&g, 1), KEEL_OK);
    ck_assert_uint_eq(g.oh, 3);      /* ceil(5/2) like TF 'SAME' */
    ck_assert_uint_eq(g.ow, 3);
    check_conv(5, 6, 2, 3, 3, 2, 1);
    check_conv(4, 4, 3, 2, 2, 1, 1);
}
END_TEST

START_TEST(test_conv2d_chunked_im2col_gradients_match_finite_differences)
{
    /* one example per im2col chunk: dW accumulates over chunks, dx is
     * scattered chunk by chunk */
    size_t save = keel__conv_chunk_bytes;
    keel__conv_chunk_bytes = 1;
    check_conv(5, 6, 2, 3, 3, 1, 0);
    check_conv(5, 6, 2, 3, 3, 2, 1);
    keel__conv_direct = KEEL__DC_GENERIC;
    check_conv(6, 5, 1, 17, 3, 1, 0);    /* direct dW, chunked dx */
    keel__conv_direct = KEEL__DC_AUTO;
    keel__conv_chunk_bytes = save;
}
END_TEST

static const int direct_paths[] = { KEEL__DC_GENERIC, KEEL__DC_AVX2,
                                     KEEL__DC_AVX512 };

START_TEST(test_conv2d_direct_paths_gradients_match_finite_differences)
{
    /* cin == 1, valid: the direct kernels (3x3 full 16-channel blocks, a
     * partial block, a 2x2 kernel, a stride), each path forced in turn */
    for (size_t i = 0; i < sizeof direct_paths / sizeof *direct_paths;
         i++) {
        if (!keel__conv_direct_path_supported(direct_paths[i]))
            continue;
        keel__conv_direct = direct_paths[i];
        check_conv(7, 6, 1, 32, 3, 1, 0);
        check_conv(6, 7, 1, 20, 3, 2, 0);
        check_conv(5, 5, 1, 3, 2, 1, 0);
    }
    keel__conv_direct = KEEL__DC_AUTO;
}
END_TEST

START_TEST(test_conv2d_direct_paths_give_identical_bits)
{
    keel__conv_geom g = { .h = 28, .w = 28, .cin = 1, .kh = 3, .kw = 3,
                          .cout = 48, .sh = 1, .sw = 1 };
    size_t n = 3, nx, ny, nw;
    float *x, *w, *dy, *col, *y0, *dw0, *y, *dw;
    ck_assert_int_eq(keel__conv_geom_init(&g, 0), KEEL_OK);
    nx = n * 28 * 28;
    ny = n * g.oh * g.ow * g.cout;
    nw = 9 * g.cout;
    x = malloc(nx * 4);
    w = malloc(nw * 4);
    dy = malloc(ny * 4);
    col = malloc(keel__conv_col_size(&g, n) * 4);
    y0 = malloc(ny * 4);
    y = malloc(ny * 4);
    dw0 = malloc(nw * 4);
    dw = malloc(nw * 4);
    fill_uniform(x, nx, 21, 0, 1);
    fill_uniform(w, nw, 22, -1, 1);
    fill_uniform(dy, ny, 23, -1, 1);
    keel__conv_direct = KEEL__DC_GENERIC;
    keel__conv_forward(&g, x, n, w, NULL, col, y0);
    keel__conv_backward(&g, x, n, dy, w, col, 1, dw0, NULL, NULL);
    for (size_t i = 0; i < sizeof direct_paths / sizeof *direct_paths;
         i++) {
        if (!keel__conv_direct_path_supported(direct_paths[i]))
            continue;
        keel__conv_direct = direct_paths[i];
        keel__conv_forward(&g, x, n, w, NULL, col, y);
        keel__conv_backward(&g, x, n, dy, w, col, 1, dw, NULL, NULL);
        ck_assert_msg(memcmp(y, y0, ny * 4) == 0, "forward of path %d "
                      "differs from the portable kernel", direct_paths[i]);
        ck_assert_msg(memcmp(dw, dw0, nw * 4) == 0, "dW of path %d "
                      "differs from the portable kernel", direct_paths[i]);
    }
    /* and the same values as im2col + sgemm, up to summation order */
    keel__conv_direct = KEEL__DC_OFF;
    keel__conv_forward(&g, x, n, w, NULL, col, y);
    keel__conv_backward(&g, x, n, dy, w, col, 0, dw, NULL, NULL);
    keel__conv_direct = KEEL__DC_AUTO;
    for (size_t i = 0; i < ny; i++)
        ck_assert_msg(fabsf(y[i] - y0[i]) <= 1e-5f * (1 + fabsf(y[i])),
                      "y[%zu]: %g vs %g", i, (double)y0[i], (double)y[i]);
    for (size_t i = 0; i < nw; i++)
        ck_assert_msg(fabsf(dw[i] - dw0[i]) <= 1e-3f * (1 + fabsf(dw[i])),
                      "dw[%zu]: %g vs %g", i, (double)dw0[i],
                      (double)dw[i]);
    free(x);
    free(w);
    free(dy);
    free(col);
    free(y0);
    free(y);
    free(dw0);
    free(dw);
}
END_TEST

typedef struct pool_ctx {
    keel__pool_geom geom;
    float *x;
    int32_t *arg;
    size_t n;
} pool_ctx;

static void
pool_fwd(gcheck *g)
{
    pool_ctx *c = g->ctx;
    keel__pool_forward(&c->geom, c->x, c->n, g->out, c->arg);
}

static void
check_pool(size_t h, size_t w)
{
    pool_ctx c = { .geom = { .h = h, .w = w, .c = 3, .k = 2, .s = 2 },
                   .n = 2 };
    size_t nx = 2 * h * w * 3, ny;
    float x[120], y[64], r[64], dx[120];
    int32_t arg[64];
    keel__rng rng;
    gcheck g;
    ck_assert_int_eq(keel__pool_geom_init(&c.geom), KEEL_OK);
    ck_assert_uint_eq(c.geom.oh, 2);   /* a 5th row/column is dropped */
    ck_assert_uint_eq(c.geom.ow, 2);
    ny = 2 * 2 * 2 * 3;
    for (size_t i = 0; i < nx; i++)
        dx[i] = 7.0f;                  /* backward must overwrite all */
    /* distinct values 0.05 apart so no perturbation changes a winner */
    for (size_t i = 0; i < nx; i++)
        x[i] = 0.05f * (float)i;
    keel__rng_seed(&rng, 5);
    for (size_t i = nx - 1; i > 0; i--) {
        size_t j = keel__rng_below(&rng, i + 1);
        float t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
    c.x = x;
    c.arg = arg;
    fill_uniform(r, ny, 6, -1, 1);
    g = (gcheck){ pool_fwd, y, ny, r, &c };
    pool_fwd(&g);
    keel__pool_backward(&c.geom, r, 2, arg, dx);
    gc_param(&g, x, nx, dx, 1e-2f, "maxpool dx");
}

START_TEST(test_maxpool_gradients_match_finite_differences)
{
    check_pool(5, 4);
    check_pool(4, 5);
    check_pool(4, 4);
}
END_TEST

typedef struct act_ctx {
    keel_activation a;
    float *x;
    size_t n;
} act_ctx;

static void
act_fwd(gcheck *g)
{
    act_ctx *c = g->ctx;
    memcpy(g->out, c->x, c->n * sizeof(float));
    keel__act_forward(c->a, g->out, c->n);
}

START_TEST(test_relu_and_tanh_gradients_match_finite_differences)
{
    for (int a = KEEL_ACT_RELU; a <= KEEL_ACT_TANH; a++) {
        float x[40], y[40], r[40], dx[40];
        act_ctx c = { (keel_activation)a, x, 40 };
        gcheck g = { act_fwd, y, 40, r, &c };
        fill_uniform(x, 40, 21, -2, 2);
        for (int i = 0; i < 40; i++)     /* keep ReLU away from its kink */
            if (fabsf(x[i]) < 0.1f)
                x[i] = 0.5f;
        fill_uniform(r, 40, 22, -1, 1);
        act_fwd(&g);
        memcpy(dx, r, sizeof dx);
        keel__act_backward(c.a, y, dx, 40);
        gc_param(&g, x, 40, dx, a == KEEL_ACT_RELU ? 1e-2f : 1e-3f,
                 a == KEEL_ACT_RELU ? "relu dx" : "tanh dx");
    }
}
END_TEST

typedef struct xent_ctx {
    float *z;
    int32_t *y;
    size_t n, k;
} xent_ctx;

static void
xent_fwd(gcheck *g)
{
    xent_ctx *c = g->ctx;
    double loss;
    int64_t correct;
    keel__softmax_xent(c->z, c->y, c->n, c->k, 1.0f, NULL, &loss, &correct);
    g->out[0] = (float)loss;
}

START_TEST(test_softmax_xent_gradients_match_finite_differences)
{
    float z[12], dz[12], out[1], one[1] = { 1.0f };
    int32_t y[3] = { 0, 3, 2 };
    xent_ctx c = { z, y, 3, 4 };
    gcheck g = { xent_fwd, out, 1, one, &c };
    double loss, ref = 0.0;
    int64_t correct;
    fill_uniform(z, 12, 31, -3, 3);
    keel__softmax_xent(z, y, 3, 4, 1.0f, dz, &loss, &correct);
    for (int i = 0; i < 3; i++) {
        double s = 0.0;
        for (int j = 0; j < 4; j++)
            s += exp((double)z[i * 4 + j]);
        ref += log(s) - (double)z[i * 4 + y[i]];
    }
    ck_assert_double_eq_tol(loss, ref, 1e-9);
    gc_param(&g, z, 12, dz, 1e-3f, "softmax xent dlogits");
    /* the scale (1 / global batch) multiplies the gradient only */
    {
        float dz2[12];
        keel__softmax_xent(z, y, 3, 4, 0.25f, dz2, &loss, &correct);
        for (int i = 0; i < 12; i++)
            ck_assert_float_eq_tol(dz2[i], 0.25f * dz[i], 1e-7);
    }
}
END_TEST

/* ---- model-level checks ------------------------------------------------- */

typedef struct fixture {
    keel_vars *vs;
    keel_model *m;
    keel_grads *g;
} fixture;

static void
fx_new(fixture *f, const keel_model_config *cfg, uint64_t seed)
{
    ck_assert_int_eq(keel_vars_new(&f->vs), KEEL_OK);
    ck_assert_msg(keel_model_new(cfg, f->vs, &f->m) == KEEL_OK, "%s",
                  keel_last_error());
    ck_assert_int_eq(keel_model_init_vars(f->m, f->vs, seed), KEEL_OK);
    ck_assert_int_eq(keel_grads_new(f->vs, &f->g), KEEL_OK);
}

static void
fx_free(fixture *f)
{
    keel_grads_free(f->g);
    keel_model_free(f->m);
    keel_vars_free(f->vs);
}

static void
synthetic(float *x, int32_t *y, size_t n, size_t esize, int classes,
          uint64_t seed)
{
    /* class c lights up block c of the input, plus noise */
    keel__rng r;
    keel__rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) {
        int c = (int)keel__rng_below(&r, (uint64_t)classes);
        y[i] = c;
        for (size_t j = 0; j < esize; j++) {
            float v = keel__rng_uniform(&r, 0.0f, 0.3f);
            if (j * (size_t)classes / esize == (size_t)c)
                v += 0.6f;
            x[i * esize + j] = v;
        }
    }
}

/* Sampled central differences of the mean loss over every variable. */
static void
model_gradcheck(const keel_model_config *cfg, float eps, double min_ok)
{
    fixture f;
    size_t esize = (size_t)(cfg->height * cfg->width * cfg->channels);
    size_t n = 4, checked = 0, ok = 0;
    float *x = malloc(n * esize * 4);
    int32_t y[4];
    keel_batch b = { x, y, n };
    keel_step_stats st;
    fx_new(&f, cfg, 7);
    synthetic(x, y, n, esize, (int)cfg->classes, 8);
    ck_assert_int_eq(keel_model_step(f.m, f.vs, &b, (int64_t)n, f.g, &st),
                     KEEL_OK);
    ck_assert_int_eq(st.count, 4);
    for (size_t v = 0; v < keel_vars_count(f.vs); v++) {
        keel_tensor *t = keel_var_tensor(keel_vars_at(f.vs, v));
        keel_tensor *gt = keel_grads_at(f.g, v);
        ck_assert_ptr_nonnull(gt);
        for (size_t s = 0; s < 12; s++) {
            size_t i = (s * 7919u) % t->count;
            float save = t->data[i];
            double lp, lm, num, an = gt->data[i];
            keel_step_stats e;
            t->data[i] = save + eps;
            keel_model_eval(f.m, f.vs, &b, &e);
            lp = e.loss_sum / (double)n;
            t->data[i] = save - eps;
            keel_model_eval(f.m, f.vs, &b, &e);
            lm = e.loss_sum / (double)n;
            t->data[i] = save;
            num = (lp - lm) / (2.0 * (double)eps);
            checked++;
            if (fabs(num - an) <= 1e-3 + 5e-2 * fabs(num))
                ok++;
        }
    }
    ck_assert_msg((double)ok >= min_ok * (double)checked,
                  "model %s: only %zu of %zu sampled gradients match",
                  keel_model_kind_name(cfg->kind), ok, checked);
    fx_free(&f);
    free(x);
}

START_TEST(test_mlp_model_gradients_match_finite_differences)
{
    keel_model_config cfg;
    keel_model_config_init(&cfg);
    cfg.height = cfg.width = 6;
    cfg.n_hidden = 2;
    cfg.hidden[0] = 8;
    cfg.hidden[1] = 5;
    cfg.activation = KEEL_ACT_TANH;     /* smooth: every sample must match */
    cfg.classes = 3;
    cfg.max_batch = 8;
    model_gradcheck(&cfg, 1e-3f, 1.0);
    cfg.kind = KEEL_MODEL_SOFTMAX;
    model_gradcheck(&cfg, 1e-3f, 1.0);
}
END_TEST

START_TEST(test_cnn_model_gradients_match_finite_differences)
{
    keel_model_config cfg;
    keel_model_config_init(&cfg);
    cfg.kind = KEEL_MODEL_CNN;
    cfg.height = cfg.width = 12;      /* 12 -> 10 -> 5 -> 3 -> 1 */
    cfg.classes = 4;
    cfg.max_batch = 8;
    cfg.init = KEEL_INIT_TORCH;
    /* ReLU and max-pool kinks may be crossed by a perturbation */
    model_gradcheck(&cfg, 1e-3f, 0.9);
}
END_TEST

START_TEST(test_cnn_variables_have_keras_names_and_shapes)
{
    keel_model_config cfg;
    fixture f;
    keel_var *v;
    keel_model_config_init(&cfg);
    cfg.kind = KEEL_MODEL_CNN;
    cfg.max_batch = 4;
    fx_new(&f, &cfg, 1);
    ck_assert_uint_eq(keel_vars_count(f.vs), 8);
    v = keel_vars_find(f.vs, "conv2d_1/kernel");
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(keel_var_tensor(v)->shape[3], 32);
    v = keel_vars_find(f.vs, "conv2d_2/kernel");
    ck_assert_int_eq(keel_var_tensor(v)->shape[2], 32);
    ck_assert_int_eq(keel_var_tensor(v)->shape[3], 64);
    v = keel_vars_find(f.vs, "dense_1/kernel");
    ck_assert_int_eq(keel_var_tensor(v)->shape[0], 5 * 5 * 64);
    ck_assert_ptr_nonnull(keel_vars_find(f.vs, "dense_2/bias"));
    ck_assert(keel_var_is_initialized(v));
    ck_assert_uint_eq(keel_vars_uninitialized(f.vs, NULL, 0), 0);
    ck_assert_double_eq_tol(keel_model_flops_per_example(f.m) / 1e6, 14.8,
                            0.3);
    fx_free(&f);
}
END_TEST

START_TEST(test_init_is_deterministic_and_glorot_bounded)
{
    keel_model_config cfg;
    fixture a, b;
    keel_tensor *ta, *tb;
    double limit = sqrt(6.0 / (784 + 256));
    int differs = 0;
    keel_model_config_init(&cfg);
    cfg.max_batch = 2;
    fx_new(&a, &cfg, 42);
    fx_new(&b, &cfg, 42);
    ta = keel_var_tensor(keel_vars_find(a.vs, "dense_1/kernel"));
    tb = keel_var_tensor(keel_vars_find(b.vs, "dense_1/kernel"));
    ck_assert_mem_eq(ta->data, tb->data, keel_tensor_bytes(ta));
    for (size_t i = 0; i < ta->count; i++)
        ck_assert(fabs(ta->data[i]) <= limit);
    ck_assert_float_eq(
        keel_var_tensor(keel_vars_find(a.vs, "dense_1/bias"))->data[0], 0);
    ck_assert_int_eq(keel_model_init_vars(b.m, b.vs, 43), KEEL_OK);
    for (size_t i = 0; i < ta->count; i++)
        differs += ta->data[i] != tb->data[i];
    ck_assert_int_gt(differs, (int)ta->count / 2);
    fx_free(&a);
    fx_free(&b);
}
END_TEST

START_TEST(test_microbatch_gradients_are_bitwise_reproducible)
{
    keel_model_config cfg;
    fixture a, b, full;
    float x[16 * 144];
    int32_t y[16];
    keel_model_config_init(&cfg);
    cfg.kind = KEEL_MODEL_CNN;
    cfg.height = cfg.width = 12;
    cfg.classes = 4;
    cfg.max_batch = 16;
    fx_new(&a, &cfg, 3);
    fx_new(&b, &cfg, 3);
    fx_new(&full, &cfg, 3);
    synthetic(x, y, 16, 144, 4, 9);
    /* a: micro-batches 0..3 in order; b: each micro-batch computed into
     * its own gradients (another "process"), then summed in the same order */
    for (int i = 0; i < 4; i++) {
        keel_batch mb = { x + i * 4 * 144, y + i * 4, 4 };
        keel_grads *tmp;
        ck_assert_int_eq(keel_model_step(a.m, a.vs, &mb, 16, a.g, NULL),
                         KEEL_OK);
        ck_assert_int_eq(keel_grads_new(b.vs, &tmp), KEEL_OK);
        ck_assert_int_eq(keel_model_step(b.m, b.vs, &mb, 16, tmp, NULL),
                         KEEL_OK);
        for (size_t v = 0; v < keel_grads_count(b.g); v++) {
            keel_tensor *d = keel_grads_at(b.g, v), *s = keel_grads_at(tmp, v);
            for (size_t j = 0; j < d->count; j++)
                d->data[j] += s->data[j];
        }
        keel_grads_free(tmp);
    }
    {
        keel_batch fb = { x, y, 16 };
        ck_assert_int_eq(keel_model_step(full.m, full.vs, &fb, 16, full.g,
                                         NULL), KEEL_OK);
    }
    for (size_t v = 0; v < keel_grads_count(a.g); v++) {
        keel_tensor *ga = keel_grads_at(a.g, v), *gb = keel_grads_at(b.g, v);
        keel_tensor *gf = keel_grads_at(full.g, v);
        ck_assert_mem_eq(ga->data, gb->data, keel_tensor_bytes(ga));
        for (size_t j = 0; j < ga->count; j++)
            ck_assert_float_eq_tol(ga->data[j], gf->data[j],
                                   1e-5 + 1e-3 * fabsf(gf->data[j]));
    }
    fx_free(&a);
    fx_free(&b);
    fx_free(&full);
}
END_TEST

START_TEST(test_direct_dense_gradients_equal_separate_then_added)
{
    /* MLP: piece 0's gradients added straight into zeroed grads (sgemm
     * beta 1) have the bits of the buffered path (own gradient, then
     * added), on any kernel; a batch of 300 is two pieces of 150, the second
     * through a slot either way */
    keel_model_config cfg;
    fixture a, b;
    size_t n = 300, es = 28 * 28;
    float *x = malloc(n * es * sizeof *x);
    int32_t *y = malloc(n * sizeof *y);
    keel_batch bt = { x, y, n };
    keel_model_config_init(&cfg);
    cfg.max_batch = (int64_t)n;
    fx_new(&a, &cfg, 4);
    fx_new(&b, &cfg, 4);
    synthetic(x, y, n, es, 10, 11);
    for (int round = 0; round < 2; round++) {
        keel_grads_zero(a.g);
        keel_grads_zero(b.g);
        keel__grads_direct = 1;
        ck_assert_int_eq(keel_model_step(a.m, a.vs, &bt, 512, a.g, NULL),
                         KEEL_OK);
        keel__grads_direct = 0;
        ck_assert_int_eq(keel_model_step(b.m, b.vs, &bt, 512, b.g, NULL),
                         KEEL_OK);
        keel__grads_direct = 1;
    }
    for (size_t v = 0; v < keel_grads_count(a.g); v++) {
        keel_tensor *ga = keel_grads_at(a.g, v), *gb = keel_grads_at(b.g, v);
        int nonzero = 0;
        for (size_t j = 0; j < ga->count; j++)
            nonzero |= ga->data[j] != 0.0f;
        ck_assert_msg(nonzero, "gradient %zu is all zero", v);
        ck_assert_mem_eq(ga->data, gb->data, keel_tensor_bytes(ga));
    }
    fx_free(&a);
    fx_free(&b);
    free(x);
    free(y);
}
END_TEST

/* Train `steps` Adam steps of a model with `threads` model threads and
 * `blas` OpenBLAS threads on batches of n (from x, y); hand back the
 * variables' bytes concatenated (caller frees) and the last step's stats.
 * fused: each step and its update as one keel__model_step_apply (zeroing
 * the gradients every other step). */
static unsigned char *
train_bits(const keel_model_config *base, int threads, int blas,
           const float *x, const int32_t *y, size_t n, size_t esize,
           int steps, int fused, keel_step_stats *last, size_t *nbytes)
{
    keel_model_config cfg = *base;
    keel_optimizer_config oc;
    keel_optimizer *opt;
    fixture f;
    unsigned char *bits;
    size_t off = 0;
    cfg.threads = threads;
    keel_train_set_threads(blas);
    fx_new(&f, &cfg, 5);
    keel_optimizer_config_init(&oc, KEEL_OPT_ADAM);
    oc.schedule.learning_rate = 1e-3;
    ck_assert_int_eq(keel_optimizer_new(&oc, &opt), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_prepare(opt, f.vs), KEEL_OK);
    for (int s = 0; s < steps; s++) {
        /* batch s starts at example s (overlapping windows of x) */
        keel_batch b = { x + (size_t)s * esize, y + s, n };
        keel_grads_zero(f.g);
        if (fused) {
            ck_assert_msg(keel__model_step_apply(f.m, f.vs, &b, (int64_t)n,
                                                 f.g, last, opt, s, s & 1) ==
                              KEEL_OK, "%s", keel_last_error());
            continue;
        }
        ck_assert_msg(keel_model_step(f.m, f.vs, &b, (int64_t)n, f.g,
                                      last) == KEEL_OK, "%s",
                      keel_last_error());
        ck_assert_int_eq(keel_optimizer_apply(opt, f.vs, f.g, s), KEEL_OK);
    }
    *nbytes = 0;
    for (size_t v = 0; v < keel_grads_count(f.g); v++)
        *nbytes += keel_tensor_bytes(keel_grads_at(f.g, v));
    bits = malloc(*nbytes);
    ck_assert_ptr_nonnull(bits);
    for (size_t v = 0; v < keel_grads_count(f.g); v++) {
        keel_tensor *t = keel_var_tensor(keel_vars_at(f.vs, v));
        memcpy(bits + off, t->data, keel_tensor_bytes(t));
        off += keel_tensor_bytes(t);
    }
    keel_optimizer_free(opt);
    fx_free(&f);
    keel_train_set_threads(1);
    return bits;
}

START_TEST(test_model_threads_give_identical_bits)
{
    /* Batches are cut into pieces whose size does not depend on the thread
     * count, and the pieces' gradients are summed in a fixed order: 1, 2, 3
     * and 8 model threads (each with a single-threaded OpenBLAS) train to
     * the same bits. (OpenBLAS's own thread count is not bit-neutral on
     * every kernel: Haswell's and Zen's sgemm round differently on 2
     * threads; see docs/determinism.md.) CNN batches of 40 (pieces 16+16+8) and 300 (19 pieces: more
     * than the 16 slots: two rounds), MLP batches of 300 (two pieces of 150:
     * piece 0 straight into grads, piece 1 through a slot) and of 200 with
     * layers of 144, 96 and 80 (one piece: its dense layers' column halves
     * shared by the threads, 80 split 48 + 32). The step with its update
     * in one pool run (keel__model_step_apply) gives the same bits too. */
    static const int threads[] = { 1, 2, 3, 8 };
    struct {
        keel_model_kind kind;
        size_t n, side;
        int classes;
        int64_t h0, h1;
    } cases[] = {
        { KEEL_MODEL_CNN, 40, 12, 4, 32, 16 },
        { KEEL_MODEL_CNN, 300, 10, 4, 32, 16 },
        { KEEL_MODEL_MLP, 300, 12, 10, 32, 16 },
        { KEEL_MODEL_MLP, 200, 12, 10, 96, 80 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        keel_model_config cfg;
        size_t es = cases[c].side * cases[c].side, n = cases[c].n;
        int steps = 3;
        float *x = malloc((n + (size_t)steps) * es * sizeof *x);
        int32_t *y = malloc((n + (size_t)steps) * sizeof *y);
        unsigned char *ref;
        size_t nref;
        keel_step_stats sref;
        ck_assert_ptr_nonnull(x);
        ck_assert_ptr_nonnull(y);
        keel_model_config_init(&cfg);
        cfg.kind = cases[c].kind;
        cfg.height = cfg.width = (int64_t)cases[c].side;
        cfg.classes = cases[c].classes;
        cfg.max_batch = (int64_t)n;
        cfg.hidden[0] = cases[c].h0;
        cfg.hidden[1] = cases[c].h1;
        synthetic(x, y, n + (size_t)steps, es, cases[c].classes, 12 + c);
        ref = train_bits(&cfg, 1, 1, x, y, n, es, steps, 0, &sref, &nref);
        for (size_t t = 0; t < 2 * (sizeof threads / sizeof threads[0]);
             t++) {
            keel_step_stats st;
            size_t nb;
            int fused = t % 2;
            unsigned char *bits;
            if (t / 2 == 0 && !fused)
                continue;            /* the reference */
            bits = train_bits(&cfg, threads[t / 2], 1, x, y, n, es, steps,
                              fused, &st, &nb);
            ck_assert_uint_eq(nb, nref);
            ck_assert_msg(memcmp(bits, ref, nb) == 0,
                          "case %zu: %d model threads%s differ from 1 "
                          "thread (OpenBLAS core %s)", c, threads[t / 2],
                          fused ? " (step and update fused)" : "",
                          keel_train_blas_corename());
            ck_assert_msg(memcmp(&st.loss_sum, &sref.loss_sum,
                                 sizeof st.loss_sum) == 0,
                          "case %zu: loss differs", c);
            ck_assert_int_eq(st.correct, sref.correct);
            free(bits);
        }
        free(ref);
        free(x);
        free(y);
    }
}
END_TEST

START_TEST(test_model_threads_eval_matches_and_small_batches_work)
{
    keel_model_config cfg;
    fixture one, many;
    float x[40 * 144];
    int32_t y[40];
    keel_batch b = { x, y, 40 };
    keel_step_stats s1, s2;
    keel_model_config_init(&cfg);
    cfg.kind = KEEL_MODEL_CNN;
    cfg.height = cfg.width = 12;
    cfg.classes = 4;
    cfg.max_batch = 40;
    fx_new(&one, &cfg, 3);
    cfg.threads = 8;
    fx_new(&many, &cfg, 3);
    synthetic(x, y, 40, 144, 4, 12);
    ck_assert_int_eq(keel_model_eval(one.m, one.vs, &b, &s1), KEEL_OK);
    ck_assert_int_eq(keel_model_eval(many.m, many.vs, &b, &s2), KEEL_OK);
    ck_assert_mem_eq(&s1.loss_sum, &s2.loss_sum, sizeof s1.loss_sum);
    ck_assert_int_eq(s1.correct, s2.correct);
    /* a batch smaller than the thread count: one piece, idle threads */
    b.n = 2;
    ck_assert_int_eq(keel_model_eval(many.m, many.vs, &b, &s2), KEEL_OK);
    ck_assert_int_eq(keel_model_eval(one.m, one.vs, &b, &s1), KEEL_OK);
    ck_assert_mem_eq(&s1.loss_sum, &s2.loss_sum, sizeof s1.loss_sum);
    ck_assert_int_eq(keel_model_step(many.m, many.vs, &b, 2, many.g, &s2),
                     KEEL_OK);
    ck_assert_int_eq(keel_model_step(one.m, one.vs, &b, 2, one.g, &s1),
                     KEEL_OK);
    for (size_t v = 0; v < keel_grads_count(one.g); v++)
        ck_assert_mem_eq(keel_grads_at(one.g, v)->data,
                         keel_grads_at(many.g, v)->data,
                         keel_tensor_bytes(keel_grads_at(one.g, v)));
    fx_free(&one);
    fx_free(&many);
}
END_TEST

START_TEST(test_tiny_mlp_learns_separable_problem)
{
    keel_model_config cfg;
    keel_optimizer_config oc;
    keel_optimizer *opt;
    fixture f;
    float x[64 * 36];
    int32_t y[64];
    keel_batch b = { x, y, 64 };
    keel_step_stats first, last;
    keel_model_config_init(&cfg);
    cfg.height = cfg.width = 6;
    cfg.n_hidden = 1;
    cfg.hidden[0] = 16;
    cfg.classes = 3;
    cfg.max_batch = 64;
    fx_new(&f, &cfg, 1);
    keel_optimizer_config_init(&oc, KEEL_OPT_MOMENTUM);
    oc.schedule.learning_rate = 0.1;
    ck_assert_int_eq(keel_optimizer_new(&oc, &opt), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_prepare(opt, f.vs), KEEL_OK);
    synthetic(x, y, 64, 36, 3, 77);
    keel_model_eval(f.m, f.vs, &b, &first);
    for (int s = 0; s < 60; s++) {
        keel_grads_zero(f.g);
        ck_assert_int_eq(keel_model_step(f.m, f.vs, &b, 64, f.g, NULL),
                         KEEL_OK);
        ck_assert_int_eq(keel_optimizer_apply(opt, f.vs, f.g, s), KEEL_OK);
    }
    keel_model_eval(f.m, f.vs, &b, &last);
    ck_assert_msg(last.loss_sum < 0.2 * first.loss_sum,
                  "loss %g -> %g", first.loss_sum, last.loss_sum);
    ck_assert_int_ge(last.correct, 62);
    keel_optimizer_free(opt);
    fx_free(&f);
}
END_TEST

/* Hogwild: every element's gradient is 1, so one thread's SGD update is
 * -lr on every element. */
static keel_status
hw_ones(void *ctx, int thread, keel_grads *grads, int64_t global_step)
{
    int *fail_thread = ctx;
    (void)global_step;
    if (fail_thread != NULL && *fail_thread == thread)
        return keel__fail(KEEL_EIO, "thread %d's batch is unreadable",
                          thread);
    for (size_t i = 0; i < keel_grads_count(grads); i++) {
        keel_tensor *g = keel_grads_at(grads, i);
        for (size_t k = 0; g != NULL && k < g->count; k++)
            g->data[k] += 1.0f;
    }
    return KEEL_OK;
}

START_TEST(test_hogwild_cas_loses_no_update_and_reports_a_failing_thread)
{
    /* 2 threads x 40 rounds of -0.25 on 5000 elements with CAS: exactly
     * -20 everywhere (every partial sum is a multiple of 0.25, exact in
     * float). With a failing thread 1 the round reports it and thread 0's
     * update is still applied: -20.25. */
    keel_vars *vs;
    keel_var *v;
    keel_optimizer_config oc;
    keel_hogwild_config hc;
    keel_hogwild *h;
    int64_t shape[1] = { 5000 };
    int fail = 1;
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "w", 1, shape, KEEL_VAR_TRAINABLE,
                                      &v), KEEL_OK);
    keel_optimizer_config_init(&oc, KEEL_OPT_SGD);
    oc.schedule.learning_rate = 0.25;
    keel_hogwild_config_init(&hc);
    ck_assert_int_eq(hc.threads, 1);
    hc.threads = 0;
    ck_assert_int_eq(keel_hogwild_new(&hc, &oc, vs, &h), KEEL_EINVAL);
    ck_assert_ptr_null(h);
    hc.threads = 2;
    hc.use_cas = 1;
    ck_assert_int_eq(keel_hogwild_new(&hc, &oc, vs, &h), KEEL_OK);
    ck_assert_int_eq(keel_hogwild_threads(h), 2);
    for (int r = 0; r < 40; r++)
        ck_assert_int_eq(keel_hogwild_run(h, hw_ones, NULL, 2 * r),
                         KEEL_OK);
    for (size_t k = 0; k < 5000; k++)
        ck_assert_float_eq(keel_var_tensor(v)->data[k], -20.0f);
    ck_assert_int_eq(keel_vars_global_step(vs), 0);
    ck_assert_int_eq(keel_hogwild_run(h, hw_ones, &fail, 80), KEEL_EIO);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "hogwild thread 1 at "
                                                    "step 81"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "unreadable"));
    for (size_t k = 0; k < 5000; k++)
        ck_assert_float_eq(keel_var_tensor(v)->data[k], -20.25f);
    /* the failed thread's gradients were cleared: the next round is
     * -0.25 per thread again */
    ck_assert_int_eq(keel_hogwild_run(h, hw_ones, NULL, 82), KEEL_OK);
    ck_assert_float_eq(keel_var_tensor(v)->data[4999], -20.75f);
    keel_hogwild_free(h);
    keel_vars_free(vs);
}
END_TEST

typedef struct hw_fixture {
    keel_vars *vs;
    keel_model *m[2];
    const float *x;
    const int32_t *y;
    size_t esize, batch, next[2];
} hw_fixture;

/* Thread t trains on batches t, t + 2, t + 4, ... of the data. */
static keel_status
hw_model_step(void *ctx, int t, keel_grads *grads, int64_t global_step)
{
    hw_fixture *f = ctx;
    size_t i = f->next[t];
    keel_batch b = { f->x + i * f->esize, f->y + i, f->batch };
    (void)global_step;
    return keel_model_step(f->m[t], f->vs, &b, (int64_t)f->batch, grads,
                           NULL);
}

/* Test accuracy after one pass over n training examples with threads
 * Hogwild threads (racy or CAS). */
static double
hw_train(int threads, int cas, const float *x, const int32_t *y, size_t n,
         size_t esize, const keel_model_config *cfg)
{
    hw_fixture f;
    keel_optimizer_config oc;
    keel_optimizer *opt;
    keel_hogwild_config hc;
    keel_hogwild *h;
    keel_step_stats ev;
    size_t n_test = 1008;
    int64_t correct = 0;
    memset(&f, 0, sizeof f);
    f.x = x;
    f.y = y;
    f.esize = esize;
    f.batch = 16;
    ck_assert_int_eq(keel_vars_new(&f.vs), KEEL_OK);
    ck_assert_int_eq(keel_model_new(cfg, f.vs, &f.m[0]), KEEL_OK);
    ck_assert_int_eq(keel_model_init_vars(f.m[0], f.vs, 3), KEEL_OK);
    ck_assert_msg(keel_model_new_shared(cfg, f.vs, &f.m[1]) == KEEL_OK,
                  "%s", keel_last_error());
    keel_optimizer_config_init(&oc, KEEL_OPT_MOMENTUM);
    oc.schedule.learning_rate = 0.004;
    ck_assert_int_eq(keel_optimizer_new(&oc, &opt), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_prepare(opt, f.vs), KEEL_OK);
    keel_hogwild_config_init(&hc);
    hc.threads = threads;
    hc.use_cas = cas;
    ck_assert_int_eq(keel_hogwild_new(&hc, &oc, f.vs, &h), KEEL_OK);
    for (size_t s = 0; (s + (size_t)threads) * f.batch <= n;
         s += (size_t)threads) {
        for (int t = 0; t < threads; t++)
            f.next[t] = (s + (size_t)t) * f.batch;
        ck_assert_int_eq(keel_hogwild_run(h, hw_model_step, &f,
                                          (int64_t)s), KEEL_OK);
    }
    for (size_t i = n; i < n + n_test; i += f.batch) {
        keel_batch tb = { x + i * esize, y + i, f.batch };
        ck_assert_int_eq(keel_model_eval(f.m[0], f.vs, &tb, &ev), KEEL_OK);
        correct += ev.correct;
    }
    keel_hogwild_free(h);
    keel_optimizer_free(opt);
    keel_model_free(f.m[1]);
    keel_model_free(f.m[0]);
    keel_vars_free(f.vs);
    return (double)correct / (double)n_test;
}

START_TEST(test_hogwild_two_threads_train_as_well_as_one)
{
    /* The same examples, one pass: 2 Hogwild threads (racy and CAS)
     * reach the accuracy band of 1 thread on held-out data, on shared
     * models (keel_model_new_shared). The band: within 5 points. */
    keel_model_config cfg;
    size_t n = 1536, esize = 64;
    float *x = malloc((n + 1008) * esize * sizeof *x);
    int32_t *y = malloc((n + 1008) * sizeof *y);
    double a1, a2, a2c;
    keel_vars *empty;
    keel_model *m;
    ck_assert_ptr_nonnull(x);
    ck_assert_ptr_nonnull(y);
    keel_model_config_init(&cfg);
    cfg.height = cfg.width = 8;
    cfg.n_hidden = 1;
    cfg.hidden[0] = 32;
    cfg.classes = 8;
    cfg.max_batch = 16;
    synthetic(x, y, n + 1008, esize, 8, 31);
    a1 = hw_train(1, 0, x, y, n, esize, &cfg);
    a2 = hw_train(2, 0, x, y, n, esize, &cfg);
    a2c = hw_train(2, 1, x, y, n, esize, &cfg);
    ck_assert_msg(a1 > 0.9, "1 thread: accuracy %.3f", a1);
    ck_assert_msg(fabs(a2 - a1) <= 0.05 && fabs(a2c - a1) <= 0.05,
                  "1 thread %.3f, 2 racy %.3f, 2 CAS %.3f", a1, a2, a2c);
    /* a shared model needs the variables an identical model made */
    ck_assert_int_eq(keel_vars_new(&empty), KEEL_OK);
    ck_assert_int_eq(keel_model_new_shared(&cfg, empty, &m), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dense_1/kernel"));
    keel_vars_free(empty);
    free(x);
    free(y);
}
END_TEST

START_TEST(test_model_rejects_bad_batches_and_configs)
{
    keel_model_config cfg;
    fixture f;
    float x[4 * 784] = { 0 };
    int32_t y[4] = { 0, 1, 10, 2 };
    keel_batch b = { x, y, 4 };
    keel_vars *vs;
    keel_model *m;
    keel_model_config_init(&cfg);
    cfg.max_batch = 4;
    fx_new(&f, &cfg, 1);
    ck_assert_int_eq(keel_model_step(f.m, f.vs, &b, 4, f.g, NULL),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "label 10"));
    y[2] = 3;
    ck_assert_int_eq(keel_model_step(f.m, f.vs, &b, 2, f.g, NULL),
                     KEEL_EINVAL);
    b.n = 5;
    ck_assert_int_eq(keel_model_step(f.m, f.vs, &b, 8, f.g, NULL),
                     KEEL_EINVAL);
    fx_free(&f);
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    cfg.classes = 1;
    ck_assert_int_eq(keel_model_new(&cfg, vs, &m), KEEL_EINVAL);
    ck_assert_ptr_null(m);
    keel_vars_free(vs);
}
END_TEST

/* ---- names, schedules, optimizers --------------------------------------- */

START_TEST(test_names_parse_and_errors_list_choices)
{
    keel_optimizer_kind ok;
    keel_model_kind mk;
    keel_lr_kind lk;
    keel_model_config cfg;
    ck_assert_int_eq(keel_optimizer_kind_from_name("rmsprop", &ok), KEEL_OK);
    ck_assert_int_eq(ok, KEEL_OPT_RMSPROP);
    ck_assert_int_eq(keel_optimizer_kind_from_name("adamw", &ok),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'adamw'"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "sgd, momentum, adagrad, adam, rmsprop"));
    ck_assert_int_eq(keel_model_kind_from_name("cnn", &mk), KEEL_OK);
    ck_assert_int_eq(mk, KEEL_MODEL_CNN);
    ck_assert_int_eq(keel_model_kind_from_name("resnet", &mk), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "softmax, mlp, cnn"));
    ck_assert_int_eq(keel_lr_kind_from_name("piecewise", &lk), KEEL_OK);
    ck_assert_int_eq(lk, KEEL_LR_PIECEWISE);
    keel_model_config_init(&cfg);
    ck_assert_int_eq(keel_model_parse_hidden("128,64,32", &cfg), KEEL_OK);
    ck_assert_int_eq(cfg.n_hidden, 3);
    ck_assert_int_eq(cfg.hidden[2], 32);
    ck_assert_int_eq(keel_model_parse_hidden("128,,3", &cfg), KEEL_EINVAL);
    ck_assert_int_eq(keel_model_parse_hidden("12x", &cfg), KEEL_EINVAL);
}
END_TEST

START_TEST(test_lr_schedules_follow_their_formulas)
{
    keel_lr_schedule s;
    keel_lr_schedule_init(&s);
    s.learning_rate = 0.5;
    ck_assert_double_eq(keel_lr_at(&s, 12345), 0.5);
    /* a step decay: 1e-3, 1e-4 from step 300, 1e-5 from 700 */
    ck_assert_int_eq(keel_lr_parse_piecewise("300,700", "1e-3,1e-4,1e-5",
                                             &s), KEEL_OK);
    ck_assert_double_eq(keel_lr_at(&s, 0), 1e-3);
    ck_assert_double_eq(keel_lr_at(&s, 299), 1e-3);
    ck_assert_double_eq(keel_lr_at(&s, 300), 1e-4);
    ck_assert_double_eq(keel_lr_at(&s, 699), 1e-4);
    ck_assert_double_eq(keel_lr_at(&s, 700), 1e-5);
    ck_assert_double_eq(keel_lr_at(&s, 1000000), 1e-5);
    ck_assert_int_eq(keel_lr_parse_piecewise("300,200", "1,2,3", &s),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_lr_parse_piecewise("300", "1,2,3", &s),
                     KEEL_EINVAL);
    keel_lr_schedule_init(&s);
    s.kind = KEEL_LR_EXPONENTIAL;
    s.learning_rate = 0.1;
    s.decay_steps = 10;
    s.decay_rate = 0.5;
    ck_assert_double_eq_tol(keel_lr_at(&s, 15), 0.1 * pow(0.5, 1.5), 1e-15);
    s.staircase = 1;
    ck_assert_double_eq_tol(keel_lr_at(&s, 15), 0.05, 1e-15);
    ck_assert_double_eq_tol(keel_lr_at(&s, 20), 0.025, 1e-15);
    s.decay_steps = 0;
    ck_assert_int_eq(keel_lr_schedule_validate(&s), KEEL_EINVAL);
}
END_TEST

/* The optimizer cases run one variable w = {1, -2} through two steps, with
 * the gradients opt_grads[0] then opt_grads[1]. */
static const double opt_w0[2] = { 1.0, -2.0 };
static const float opt_grads[2][2] = { { 0.5f, -1.0f }, { 0.25f, 2.0f } };

static keel_var *
opt_var(keel_vars **vs)
{
    int64_t shape[1] = { 2 };
    keel_var *v;
    ck_assert_int_eq(keel_vars_new(vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(*vs, "w", 1, shape,
                                      KEEL_VAR_TRAINABLE, &v), KEEL_OK);
    keel_var_tensor(v)->data[0] = (float)opt_w0[0];
    keel_var_tensor(v)->data[1] = (float)opt_w0[1];
    return v;
}

static void
run_opt(const keel_optimizer_config *oc, keel_var *v, keel_vars *vs,
        int64_t step0)
{
    keel_optimizer *o;
    keel_tensor g;
    int64_t shape[1] = { 2 };
    ck_assert_int_eq(keel_optimizer_new(oc, &o), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_prepare(o, vs), KEEL_OK);
    ck_assert_int_eq(keel_tensor_alloc(&g, 1, shape), KEEL_OK);
    for (int s = 0; s < 2; s++) {
        memcpy(g.data, opt_grads[s], sizeof opt_grads[s]);
        ck_assert_int_eq(keel_optimizer_apply_var(o, v, &g, step0 + s),
                         KEEL_OK);
    }
    keel_tensor_release(&g);
    keel_optimizer_free(o);
}

/* One optimizer case: its config (with a piecewise schedule when
 * boundaries is not NULL; momentum 0 keeps the default), the global step
 * of its first update, and the slots it keeps (NULL after the last). */
typedef struct opt_case {
    const char *name;
    keel_optimizer_kind kind;
    double learning_rate;
    const char *boundaries, *values;
    double momentum;
    int use_nesterov;
    int64_t step0;
    const char *slots[3];
} opt_case;

static const opt_case opt_cases[] = {
    { .name = "sgd", .kind = KEEL_OPT_SGD,
      .boundaries = "1", .values = "0.1,0.01" },
    { .name = "momentum", .kind = KEEL_OPT_MOMENTUM, .learning_rate = 0.1,
      .slots = { "momentum" } },
    { .name = "nesterov", .kind = KEEL_OPT_MOMENTUM, .learning_rate = 0.1,
      .use_nesterov = 1, .slots = { "momentum" } },
    { .name = "adagrad", .kind = KEEL_OPT_ADAGRAD, .learning_rate = 0.1,
      .slots = { "accumulator" } },
    { .name = "adam", .kind = KEEL_OPT_ADAM, .learning_rate = 0.01,
      .step0 = 5, .slots = { "m", "v" } },
    { .name = "rmsprop", .kind = KEEL_OPT_RMSPROP, .learning_rate = 0.01,
      .momentum = 0.5, .slots = { "rms", "mom" } },
};

/* Case c by hand for element i: returns the weight after the two steps
 * and sets slot[] to the slots' values, in the order c names them. The
 * other hyperparameters are the defaults: momentum 0.9, Adagrad's initial
 * accumulator 0.1, Adam's betas 0.9 and 0.999, RMSProp's rho 0.9. */
static double
opt_by_hand(const opt_case *c, int i, double slot[2])
{
    double w = opt_w0[i], lr = c->learning_rate;
    double a = c->kind == KEEL_OPT_ADAGRAD ? 0.1 : 0.0, b = 0.0;
    for (int s = 0; s < 2; s++) {
        double g = opt_grads[s][i];
        double t = (double)(c->step0 + s + 1), lr_t;
        switch (c->kind) {
        case KEEL_OPT_SGD:          /* lr 0.1 at step 0, 0.01 from step 1 */
            w -= (s == 0 ? 0.1 : 0.01) * g;
            break;
        case KEEL_OPT_MOMENTUM:     /* a: the accumulation */
            a = 0.9 * a + g;
            w -= lr * (c->use_nesterov ? g + 0.9 * a : a);
            break;
        case KEEL_OPT_ADAGRAD:      /* a: the accumulator */
            a += g * g;
            w -= lr * g / (sqrt(a) + 1e-7);
            break;
        case KEEL_OPT_ADAM:         /* a, b: m and v; t counts from 1 */
            lr_t = lr * sqrt(1 - pow(0.999, t)) / (1 - pow(0.9, t));
            a = 0.9 * a + 0.1 * g;
            b = 0.999 * b + 0.001 * g * g;
            w -= lr_t * a / (sqrt(b) + 1e-7);
            break;
        case KEEL_OPT_RMSPROP:      /* a, b: mean square and momentum */
            a = 0.9 * a + 0.1 * g * g;
            b = c->momentum * b + lr * g / sqrt(a + 1e-7);
            w -= b;
            break;
        default:
            ck_abort_msg("%s: no hand computation", c->name);
        }
    }
    slot[0] = a;
    slot[1] = b;
    return w;
}

/* got within 1e-6 of want, or a failure naming the case and the value */
static void
expect_near(const char *name, const char *what, int i, double got,
            double want)
{
    ck_assert_msg(fabs(got - want) < 1e-6, "%s: %s[%d] is %.9g, expected "
                  "%.9g", name, what, i, got, want);
}

START_TEST(test_optimizer_updates_match_hand_computed_values)
{
    for (size_t k = 0; k < sizeof opt_cases / sizeof *opt_cases; k++) {
        const opt_case *c = &opt_cases[k];
        keel_optimizer_config oc;
        keel_vars *vs;
        keel_var *v = opt_var(&vs);
        size_t n_slots = 0;
        while (n_slots < sizeof c->slots / sizeof *c->slots &&
               c->slots[n_slots] != NULL)
            n_slots++;
        keel_optimizer_config_init(&oc, c->kind);
        if (c->boundaries != NULL)
            ck_assert_int_eq(keel_lr_parse_piecewise(c->boundaries,
                                                     c->values, &oc.schedule),
                             KEEL_OK);
        else
            oc.schedule.learning_rate = c->learning_rate;
        if (c->momentum != 0)
            oc.momentum = c->momentum;
        oc.use_nesterov = c->use_nesterov;
        run_opt(&oc, v, vs, c->step0);
        ck_assert_msg(keel_var_slot_count(v) == n_slots, "%s: %zu slots",
                      c->name, keel_var_slot_count(v));
        for (int i = 0; i < 2; i++) {
            double slot[2], w = opt_by_hand(c, i, slot);
            for (size_t j = 0; j < n_slots; j++)
                expect_near(c->name, c->slots[j], i,
                            keel_var_slot(v, c->slots[j])->data[i], slot[j]);
            expect_near(c->name, "w", i, keel_var_tensor(v)->data[i], w);
        }
        keel_vars_free(vs);
    }
}
END_TEST

START_TEST(test_optimizer_prepare_is_idempotent_and_apply_needs_slots)
{
    keel_optimizer_config oc;
    keel_optimizer *o;
    keel_vars *vs;
    keel_var *v = opt_var(&vs);
    keel_tensor g;
    int64_t shape[1] = { 2 };
    keel_optimizer_config_init(&oc, KEEL_OPT_ADAGRAD);
    ck_assert_int_eq(keel_optimizer_new(&oc, &o), KEEL_OK);
    ck_assert_int_eq(keel_tensor_alloc(&g, 1, shape), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_apply_var(o, v, &g, 0), KEEL_ESTATE);
    ck_assert_int_eq(keel_optimizer_prepare(o, vs), KEEL_OK);
    keel_var_slot(v, "accumulator")->data[0] = 7.0f;
    ck_assert_int_eq(keel_optimizer_prepare(o, vs), KEEL_OK);
    ck_assert_uint_eq(keel_var_slot_count(v), 1);
    ck_assert_float_eq(keel_var_slot(v, "accumulator")->data[0], 7.0f);
    ck_assert_float_eq_tol(keel_var_slot(v, "accumulator")->data[1], 0.1f,
                           1e-7);
    keel_tensor_release(&g);
    keel_optimizer_free(o);
    keel_vars_free(vs);
    oc.schedule.learning_rate = -1;
    ck_assert_int_eq(keel_optimizer_new(&oc, &o), KEEL_EINVAL);
}
END_TEST

/* A 6x6-input MLP with one hidden layer and 3 classes. */
static void
tiny_mlp(keel_model_config *cfg, int64_t hidden, int64_t max_batch)
{
    keel_model_config_init(cfg);
    cfg->height = cfg->width = 6;
    cfg->n_hidden = 1;
    cfg->hidden[0] = hidden;
    cfg->classes = 3;
    cfg->max_batch = max_batch;
}

#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
static volatile float ftz_a = 2e-38f, ftz_b = 1.5e-38f;

/* ftz_a - ftz_b (subnormal), computed where the caller's mode rules */
static __attribute__((noipa)) float
sub_f(void)
{
    return ftz_a - ftz_b;
}

/* Whether this CPU flushes subnormals when asked to, asked directly rather
 * than through keel: an emulator may not (valgrind ignores MXCSR's FTZ and
 * DAZ bits), and there the flushed values cannot be checked. */
static int
cpu_honours_ftz(void)
{
    float d;
#if defined(__x86_64__) || defined(__i386__)
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);           /* FTZ | DAZ */
    d = sub_f();
    _mm_setcsr(csr);
#else
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr | (UINT64_C(1) << 24)));
    d = sub_f();
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
#endif
    return d == 0.0f;
}
#endif

START_TEST(test_optimizer_flushes_subnormals_and_keeps_callers_mode)
{
    /* SGD, lr 1: 2e-38 - 1.5e-38 is subnormal (under FLT_MIN, 1.18e-38)
     * and 1e-39 is a subnormal gradient: keel's arithmetic writes and
     * reads them as zero. The caller's own mode is IEEE's before and
     * after, where the same subtraction stays subnormal. */
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
    keel_vars *vs;
    keel_var *v;
    keel_grads *g;
    keel_optimizer *opt;
    keel_optimizer_config oc;
    int64_t shape[1] = { 3 };
    volatile float a = 2e-38f, b = 1.5e-38f;
    float *x, *gr;
    ck_assert(a - b > 0.0f && a - b < FLT_MIN);
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "w", 1, shape, KEEL_VAR_TRAINABLE,
                                      &v), KEEL_OK);
    ck_assert_int_eq(keel_grads_new(vs, &g), KEEL_OK);
    x = keel_var_tensor(v)->data;
    gr = keel_grads_at(g, 0)->data;
    x[0] = 2e-38f; x[1] = 0.0f; x[2] = 1.0f;
    gr[0] = 1.5e-38f; gr[1] = 1e-39f; gr[2] = 0.5f;
    keel_optimizer_config_init(&oc, KEEL_OPT_SGD);
    oc.schedule.learning_rate = 1.0;
    ck_assert_int_eq(keel_optimizer_new(&oc, &opt), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_prepare(opt, vs), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_apply(opt, vs, g, 0), KEEL_OK);
    if (cpu_honours_ftz()) {
        ck_assert_float_eq(x[0], 0.0f);
        ck_assert_float_eq(x[1], 0.0f);
    } else {
        fprintf(stderr, "test_optimizer_flushes_subnormals: this CPU (or "
                "emulator) ignores FTZ/DAZ; flushed values not checked\n");
    }
    ck_assert_float_eq(x[2], 0.5f);
    ck_assert(a - b > 0.0f && a - b < FLT_MIN);
    keel_optimizer_free(opt);
    keel_grads_free(g);
    keel_vars_free(vs);
#endif
}
END_TEST

START_TEST(test_apply_and_zero_equals_apply_then_zero)
{
    /* every optimizer: the fused update gives the bits of apply followed by
     * keel_grads_zero (over several ZERO_BLOCKs of a 72,000-element weight)
     * and leaves every gradient zero, also split over a pool's 3 threads
     * (ranges across variables); a failing call changes nothing */
    static const keel_optimizer_kind kinds[] = {
        KEEL_OPT_SGD, KEEL_OPT_MOMENTUM, KEEL_OPT_ADAGRAD, KEEL_OPT_ADAM,
        KEEL_OPT_RMSPROP };
    keel_model_config cfg;
    float x[16 * 36];
    int32_t y[16];
    keel_batch bt = { x, y, 16 };
    tiny_mlp(&cfg, 2000, 16);
    synthetic(x, y, 16, 36, 3, 8);
    keel__pool *pool;
    ck_assert_int_eq(keel__pool_new(3, &pool), KEEL_OK);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        keel_optimizer_config oc;
        keel_optimizer *o;
        fixture a, b, c, other;
        keel_optimizer_config_init(&oc, kinds[k]);
        oc.momentum = kinds[k] == KEEL_OPT_SGD ? 0.0 : 0.9;
        ck_assert_int_eq(keel_optimizer_new(&oc, &o), KEEL_OK);
        fx_new(&a, &cfg, 5);
        fx_new(&b, &cfg, 5);
        fx_new(&c, &cfg, 5);
        ck_assert_int_eq(keel_optimizer_prepare(o, a.vs), KEEL_OK);
        ck_assert_int_eq(keel_optimizer_prepare(o, b.vs), KEEL_OK);
        ck_assert_int_eq(keel_optimizer_prepare(o, c.vs), KEEL_OK);
        for (int s = 0; s < 3; s++) {
            keel_grads_zero(a.g);
            ck_assert_int_eq(keel_model_step(a.m, a.vs, &bt, 16, a.g, NULL),
                             KEEL_OK);
            ck_assert_int_eq(keel_optimizer_apply(o, a.vs, a.g, s), KEEL_OK);
            if (s == 0)
                keel_grads_zero(b.g);
            ck_assert_int_eq(keel_model_step(b.m, b.vs, &bt, 16, b.g, NULL),
                             KEEL_OK);
            ck_assert_int_eq(keel_optimizer_apply_and_zero(o, b.vs, b.g, s),
                             KEEL_OK);
            if (s == 0)
                keel_grads_zero(c.g);
            ck_assert_int_eq(keel_model_step(c.m, c.vs, &bt, 16, c.g, NULL),
                             KEEL_OK);
            ck_assert_int_eq(keel__optimizer_apply_pooled(o, c.vs, c.g, s, 1,
                                                          pool), KEEL_OK);
            for (size_t i = 0; i < keel_grads_count(b.g); i++) {
                keel_tensor *g = keel_grads_at(b.g, i);
                for (size_t e = 0; g != NULL && e < g->count; e++)
                    ck_assert_msg(g->data[e] == 0.0f, "%s: gradient %zu "
                                  "element %zu not zeroed",
                                  keel_optimizer_kind_name(kinds[k]), i, e);
            }
        }
        for (size_t i = 0; i < keel_vars_count(a.vs); i++) {
            keel_var *va = keel_vars_at(a.vs, i), *vb = keel_vars_at(b.vs, i);
            keel_var *vc = keel_vars_at(c.vs, i);
            ck_assert_mem_eq(keel_var_tensor(va)->data,
                             keel_var_tensor(vb)->data,
                             keel_tensor_bytes(keel_var_tensor(va)));
            ck_assert_mem_eq(keel_var_tensor(va)->data,
                             keel_var_tensor(vc)->data,
                             keel_tensor_bytes(keel_var_tensor(va)));
            for (size_t sl = 0; sl < keel_var_slot_count(va); sl++) {
                const char *name;
                keel_tensor *ta = keel_var_slot_at(va, sl, &name);
                ck_assert_mem_eq(ta->data, keel_var_slot(vb, name)->data,
                                 keel_tensor_bytes(ta));
                ck_assert_mem_eq(ta->data, keel_var_slot(vc, name)->data,
                                 keel_tensor_bytes(ta));
            }
        }
        /* gradients of another store: refused, b's gradients untouched */
        fx_new(&other, &cfg, 6);
        ck_assert_int_eq(keel_model_step(b.m, b.vs, &bt, 16, b.g, NULL),
                         KEEL_OK);
        {
            keel_tensor *g0 = keel_grads_at(b.g, 0);
            size_t nb = keel_tensor_bytes(g0);
            float *before = malloc(nb);
            int nonzero = 0;
            ck_assert_ptr_nonnull(before);
            memcpy(before, g0->data, nb);
            for (size_t e = 0; e < g0->count; e++)
                nonzero |= g0->data[e] != 0.0f;
            ck_assert(nonzero);
            ck_assert_int_eq(keel_optimizer_apply_and_zero(o, other.vs, b.g,
                                                           3),
                             KEEL_EINVAL);
            ck_assert_mem_eq(before, g0->data, nb);
            free(before);
        }
        fx_free(&other);
        fx_free(&a);
        fx_free(&b);
        fx_free(&c);
        keel_optimizer_free(o);
    }
    keel__pool_free(pool);
}
END_TEST

/* Copy every variable and slot of src into dst (same model layout). */
static void
copy_store(keel_vars *dst, keel_vars *src)
{
    for (size_t i = 0; i < keel_vars_count(src); i++) {
        keel_var *a = keel_vars_at(src, i), *b = keel_vars_at(dst, i);
        ck_assert_str_eq(keel_var_name(a), keel_var_name(b));
        memcpy(keel_var_tensor(b)->data, keel_var_tensor(a)->data,
               keel_tensor_bytes(keel_var_tensor(a)));
        for (size_t s = 0; s < keel_var_slot_count(a); s++) {
            const char *name;
            keel_tensor *ta = keel_var_slot_at(a, s, &name), *tb;
            ck_assert_int_eq(keel_var_add_slot(b, name, &tb), KEEL_OK);
            memcpy(tb->data, ta->data, keel_tensor_bytes(ta));
        }
    }
    keel_vars_set_global_step(dst, keel_vars_global_step(src));
}

START_TEST(test_adam_continues_bitwise_after_restore)
{
    keel_model_config cfg;
    keel_optimizer_config oc;
    keel_optimizer *o;
    fixture a, b;
    float x[8 * 36];
    int32_t y[8];
    keel_batch bt = { x, y, 8 };
    tiny_mlp(&cfg, 7, 8);
    keel_optimizer_config_init(&oc, KEEL_OPT_ADAM);
    ck_assert_int_eq(keel_optimizer_new(&oc, &o), KEEL_OK);
    fx_new(&a, &cfg, 5);
    ck_assert_int_eq(keel_optimizer_prepare(o, a.vs), KEEL_OK);
    synthetic(x, y, 8, 36, 3, 6);
    for (int s = 0; s < 6; s++) {
        if (s == 3) {
            /* "restore" into a fresh store, then continue there */
            fx_new(&b, &cfg, 99);
            copy_store(b.vs, a.vs);
            ck_assert_int_eq(keel_optimizer_prepare(o, b.vs), KEEL_OK);
        }
        if (s >= 3) {
            keel_grads_zero(b.g);
            keel_model_step(b.m, b.vs, &bt, 8, b.g, NULL);
            ck_assert_int_eq(keel_optimizer_apply(o, b.vs, b.g,
                                                  keel_vars_global_step(b.vs)),
                             KEEL_OK);
            keel_vars_set_global_step(b.vs, keel_vars_global_step(b.vs) + 1);
        }
        keel_grads_zero(a.g);
        keel_model_step(a.m, a.vs, &bt, 8, a.g, NULL);
        ck_assert_int_eq(keel_optimizer_apply(o, a.vs, a.g,
                                              keel_vars_global_step(a.vs)),
                         KEEL_OK);
        keel_vars_set_global_step(a.vs, keel_vars_global_step(a.vs) + 1);
    }
    for (size_t i = 0; i < keel_vars_count(a.vs); i++) {
        keel_var *va = keel_vars_at(a.vs, i), *vb = keel_vars_at(b.vs, i);
        ck_assert_mem_eq(keel_var_tensor(va)->data, keel_var_tensor(vb)->data,
                         keel_tensor_bytes(keel_var_tensor(va)));
        ck_assert_mem_eq(keel_var_slot(va, "v")->data,
                         keel_var_slot(vb, "v")->data,
                         keel_tensor_bytes(keel_var_tensor(va)));
    }
    fx_free(&a);
    fx_free(&b);
    keel_optimizer_free(o);
}
END_TEST

/* ---- K-FAC ---------------------------------------------------------------- */

/* The quantities keel and tests/kfac_ref.py both report after the last
 * step: per layer with parameters A, G (debiased), pi, A^-1, G^-1; per
 * variable the last step's change; the KL clipping coefficient. */
#define KF_MAXQ 64

typedef struct kf_case {
    const char *model;           /* "mlp" | "cnn" */
    keel_kfac_config kc;
    size_t n;                    /* examples per step */
    int steps;
    int expect_clipped;          /* the case must exercise KL clipping */
    uint64_t expect_factored;    /* the layers (bits) of the last step that
                                  * must take the factored update */
} kf_case;

/* A case on model with n examples a step, steps steps and kfac's seed;
 * the factors' EMA decay 0.8 and momentum 0.5, the rest kfac's defaults */
static void
kf_case_init(kf_case *c, const char *model, size_t n, int steps,
             uint64_t seed)
{
    memset(c, 0, sizeof *c);
    keel_kfac_config_init(&c->kc);
    c->model = model;
    c->n = n;
    c->steps = steps;
    c->kc.seed = seed;
    c->kc.cov_ema_decay = 0.8;
    c->kc.momentum = 0.5;
}

static void
json_floats(FILE *f, const float *v, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%.9g", i ? "," : "", (double)v[i]);
    fputc(']', f);
}

static void
json_ints(FILE *f, const int32_t *v, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? "," : "", (int)v[i]);
    fputc(']', f);
}

/* Expected values of "name idx" from the reference's output; count in *n. */
static double *
kf_expected(const char *text, const char *key, size_t *n)
{
    size_t kl = strlen(key), cap = 16;
    const char *p = text;
    double *v = malloc(cap * sizeof *v);
    *n = 0;
    while (p != NULL && *p != '\0') {
        if (strncmp(p, key, kl) == 0 && p[kl] == ' ') {
            char *e;
            p += kl;
            for (;;) {
                double d = strtod(p, &e);
                if (e == p)
                    break;
                if (*n == cap)
                    v = realloc(v, (cap *= 2) * sizeof *v);
                v[(*n)++] = d;
                p = e;
                if (*p == '\n')
                    break;
            }
            return v;
        }
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    free(v);
    ck_abort_msg("reference output has no '%s'", key);
    return NULL;
}

/* max |got - want| <= tol * max |want| + abs_tol */
static void
kf_compare_abs(const char *text, const char *key, const float *got,
               size_t n, double scale, double tol, double abs_tol)
{
    size_t m;
    double *want = kf_expected(text, key, &m), err = 0.0, mag = 0.0;
    ck_assert_msg(m == n, "%s: %zu values, reference has %zu", key, n, m);
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] * scale;
        err = fmax(err, fabs(g - want[i]));
        mag = fmax(mag, fabs(want[i]));
    }
    ck_assert_msg(mag > 0.0, "%s: reference is all zero", key);
    ck_assert_msg(err <= tol * mag + abs_tol, "%s: max error %.3g of max "
                  "%.3g (relative %.3g > %.0e)", key, err, mag, err / mag,
                  tol);
    free(want);
}

static void
kf_compare(const char *text, const char *key, const float *got, size_t n,
           double scale, double tol)
{
    kf_compare_abs(text, key, got, n, scale, tol, 0.0);
}

static void
kf_run_case(const kf_case *c)
{
    keel_model_config mc;
    fixture f;
    keel_kfac *k;
    keel__kfac_layer info[16];
    int nl;
    size_t esize, nv;
    float *x, **before;
    int32_t *y;
    const char *in = tu_path("kfac_in.json"), *out = tu_path("kfac_out.txt");
    FILE *fp;
    char *text;
    size_t tlen;
    keel__rng r;

    keel_model_config_init(&mc);
    if (strcmp(c->model, "cnn") == 0) {
        mc.kind = KEEL_MODEL_CNN;
        mc.height = mc.width = 10;
        mc.classes = 4;
    } else {
        mc.kind = KEEL_MODEL_MLP;
        mc.height = 2;
        mc.width = 3;
        mc.n_hidden = 1;
        mc.hidden[0] = 5;
        mc.activation = KEEL_ACT_TANH;
        mc.classes = 3;
    }
    mc.max_batch = (int64_t)c->n;
    mc.init = KEEL_INIT_TORCH;             /* non-zero biases too */
    fx_new(&f, &mc, 11);
    ck_assert_msg(keel_kfac_new(&c->kc, f.m, f.vs, &k) == KEEL_OK, "%s",
                  keel_last_error());
    nl = keel__model_kfac_layers(f.m, info, 16);
    esize = (size_t)(mc.height * mc.width * mc.channels);
    nv = (size_t)nl * 2;
    x = malloc(c->n * esize * sizeof *x);
    y = malloc(c->n * sizeof *y);
    before = calloc(nv, sizeof *before);

    fp = fopen(in, "w");
    ck_assert_ptr_nonnull(fp);
    fprintf(fp, "{\"model\": \"%s\", \"act\": \"tanh\", \"hidden\": [5], "
            "\"h\": %lld, \"w\": %lld, \"c\": 1, \"classes\": %lld, "
            "\"damping\": %.17g, \"decay\": %.17g, \"momentum\": %.17g, "
            "\"momentum_type\": \"%s\", \"norm_constraint\": %.17g, "
            "\"lr\": %.17g, \"empirical\": %d, \"invert_every\": %lld, "
            "\"names\": [",
            c->model, (long long)mc.height, (long long)mc.width,
            (long long)mc.classes, c->kc.damping, c->kc.cov_ema_decay,
            c->kc.momentum,
            c->kc.momentum_type == KEEL_KFAC_MOMENTUM_ADAM ? "adam"
                                                           : "regular",
            c->kc.norm_constraint, c->kc.schedule.learning_rate,
            c->kc.estimation == KEEL_KFAC_EMPIRICAL,
            (long long)c->kc.invert_every);
    for (int i = 0; i < nl; i++)
        fprintf(fp, "%s\"%s\", \"%s\"", i ? ", " : "",
                keel_var_name(info[i].w), keel_var_name(info[i].b));
    fprintf(fp, "], \"shapes\": [");
    for (size_t i = 0; i < nv; i++) {
        keel_tensor *t = keel_var_tensor(i % 2 ? info[i / 2].b
                                               : info[i / 2].w);
        fprintf(fp, "%s[", i ? ", " : "");
        for (int d = 0; d < t->ndim; d++)
            fprintf(fp, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        fprintf(fp, "]");
    }
    fprintf(fp, "], \"vars\": [");
    for (size_t i = 0; i < nv; i++) {
        keel_tensor *t = keel_var_tensor(i % 2 ? info[i / 2].b
                                               : info[i / 2].w);
        fprintf(fp, "%s", i ? ", " : "");
        json_floats(fp, t->data, t->count);
    }
    fprintf(fp, "], \"steps\": [");
    keel__rng_seed(&r, 77);
    for (int s = 0; s < c->steps; s++) {
        keel_batch b = { x, y, c->n };
        for (size_t i = 0; i < c->n * esize; i++)
            x[i] = keel__rng_uniform(&r, 0.0f, 1.0f);
        for (size_t i = 0; i < c->n; i++)
            y[i] = (int32_t)keel__rng_below(&r, (uint64_t)mc.classes);
        if (s + 1 == c->steps)
            for (size_t i = 0; i < nv; i++) {
                keel_tensor *t = keel_var_tensor(i % 2 ? info[i / 2].b
                                                       : info[i / 2].w);
                before[i] = malloc(keel_tensor_bytes(t));
                memcpy(before[i], t->data, keel_tensor_bytes(t));
            }
        keel_grads_zero(f.g);
        ck_assert_int_eq(keel_model_step(f.m, f.vs, &b, (int64_t)c->n, f.g,
                                         NULL), KEEL_OK);
        ck_assert_int_eq(keel_kfac_observe(k, f.vs, &b, s), KEEL_OK);
        fprintf(fp, "%s{\"x\": ", s ? ", " : "");
        json_floats(fp, x, c->n * esize);
        fprintf(fp, ", \"y\": ");
        json_ints(fp, y, c->n);
        fprintf(fp, ", \"t\": ");
        json_ints(fp, keel__kfac_targets(k), c->n);
        fprintf(fp, "}");
        ck_assert_msg(keel_kfac_apply(k, f.vs, f.g, s) == KEEL_OK, "%s",
                      keel_last_error());
        if (s + 1 == c->steps)
            ck_assert_msg(keel__kfac_factored(k) == c->expect_factored,
                          "layers 0x%llx took the factored update, not "
                          "0x%llx", (unsigned long long)keel__kfac_factored(k),
                          (unsigned long long)c->expect_factored);
    }
    fprintf(fp, "]}\n");
    ck_assert_int_eq(fclose(fp), 0);
    {
        char py[4096], sc[4096], err[4096];
        snprintf(py, sizeof py, "%s",
                 getenv("PYTHON3") && getenv("PYTHON3")[0]
                     ? getenv("PYTHON3") : "/usr/bin/python3");
        snprintf(sc, sizeof sc, "%s", tu_src_path("tests/kfac_ref.py"));
        char *argv[] = { py, sc, (char *)in, (char *)out, NULL };
        int rc = tu_run(argv, NULL, 60000, NULL, 0, err, sizeof err);
        ck_assert_msg(rc == 0, "kfac_ref.py failed (%d): %s", rc, err);
    }
    text = tu_read_file(out, &tlen);
    {
        float w = keel_var_tensor(keel_vars_find(f.vs,
                                                 "kfac/ema_weight"))->data[0];
        for (int i = 0; i < nl; i++) {
            char key[64], scope[64];
            const char *wn = keel_var_name(info[i].w);
            float pi = (float)keel__kfac_pi(k, i);
            snprintf(scope, sizeof scope, "%.*s",
                     (int)(strrchr(wn, '/') - wn), wn);
#define KF_VAR(leaf) \
    keel_var_tensor(keel_vars_find(f.vs, (snprintf(name, sizeof name, \
                                                   "%s/%s", scope, leaf), \
                                          name)))
            {
                char name[128];
                keel_tensor *A = KF_VAR("kfac_A"), *G = KF_VAR("kfac_G");
                keel_tensor *Ai = KF_VAR("kfac_A_inv");
                keel_tensor *Gi = KF_VAR("kfac_G_inv");
                snprintf(key, sizeof key, "A %d", i);
                kf_compare(text, key, A->data, A->count, 1.0 / w, 1e-5);
                snprintf(key, sizeof key, "G %d", i);
                kf_compare(text, key, G->data, G->count, 1.0 / w, 1e-5);
                snprintf(key, sizeof key, "pi %d", i);
                kf_compare(text, key, &pi, 1, 1.0, 1e-5);
                snprintf(key, sizeof key, "Ainv %d", i);
                kf_compare(text, key, Ai->data, Ai->count, 1.0, 1e-5);
                snprintf(key, sizeof key, "Ginv %d", i);
                kf_compare(text, key, Gi->data, Gi->count, 1.0, 1e-5);
                float *pc = malloc(info[i].a_dim * info[i].g_dim *
                                   sizeof *pc);
                keel__kfac_precond(k, i, pc);
                snprintf(key, sizeof key, "precond %d", i);
                kf_compare(text, key, pc, info[i].a_dim * info[i].g_dim,
                           1.0, 1e-5);
                free(pc);
            }
#undef KF_VAR
        }
        for (size_t i = 0; i < nv; i++) {
            keel_tensor *t = keel_var_tensor(i % 2 ? info[i / 2].b
                                                   : info[i / 2].w);
            char key[64];
            float *d = malloc(keel_tensor_bytes(t));
            double wmax = 0.0;
            for (size_t j = 0; j < t->count; j++) {
                d[j] = t->data[j] - before[i][j];
                wmax = fmax(wmax, fabs((double)t->data[j]));
            }
            /* the change as the weights hold it: plus their own rounding
             * (one float ulp of the largest weight) */
            snprintf(key, sizeof key, "delta %zu", i);
            kf_compare_abs(text, key, d, t->count, 1.0, 1e-5,
                           wmax * 0x1p-23);
            free(d);
            free(before[i]);
        }
        {
            size_t m;
            double *cl = kf_expected(text, "clip 0", &m);
            ck_assert_msg(c->expect_clipped ? cl[0] < 0.999 : cl[0] == 1.0,
                          "the case's clipping coefficient is %g", cl[0]);
            free(cl);
        }
    }
    free(text);
    free(before);
    free(x);
    free(y);
    keel_kfac_free(k);
    fx_free(&f);
}

START_TEST(test_kfac_matches_numpy_reference)
{
    /* a dense layer and a hidden one (true Fisher, adam momentum); the same
     * with the empirical Fisher, regular momentum and KL clipping; the CNN's
     * two convolutions and dense layers (true Fisher, adam, clipping): A, G,
     * pi, the damped inverses and the last step's update, two steps each
     * (the EMA and momentum carry over), against numpy in float64 */
    kf_case c[3];
    kf_case_init(&c[0], "mlp", 7, 2, 3);
    c[0].kc.invert_every = 1;
    c[0].kc.damping = 0.05;
    c[0].kc.schedule.learning_rate = 0.1;
    c[1] = c[0];
    c[1].kc.estimation = KEEL_KFAC_EMPIRICAL;
    c[1].kc.momentum_type = KEEL_KFAC_MOMENTUM_REGULAR;
    c[1].kc.norm_constraint = 1e-4;
    c[1].expect_clipped = 1;
    kf_case_init(&c[2], "cnn", 3, 2, 3);
    c[2].kc.invert_every = 1;
    c[2].kc.damping = 0.1;
    c[2].kc.schedule.learning_rate = 0.05;
    c[2].kc.norm_constraint = 1e-4;
    c[2].expect_clipped = 1;
    for (int i = 0; i < 3; i++)
        kf_run_case(&c[i]);
}
END_TEST

START_TEST(test_kfac_factored_update_matches_numpy_reference)
{
    /* model_grads with 3 examples, fewer than the 6 inputs: the first
     * layer's update (a 7, g 5) is formed from the batch, the second's
     * (a 6, g 3) from the gradient. adam: steps 1 and 2 continue F^-1 v
     * from step 0's between inversions (invert_every 3); regular with KL
     * clipping: F^-1 of each step's gradient, an inversion at step 2 */
    kf_case c[2];
    kf_case_init(&c[0], "mlp", 3, 3, 4);
    c[0].kc.model_grads = 1;
    c[0].kc.invert_every = 3;
    c[0].kc.damping = 0.05;
    c[0].kc.schedule.learning_rate = 0.1;
    c[0].expect_factored = 1;
    c[1] = c[0];
    c[1].kc.momentum_type = KEEL_KFAC_MOMENTUM_REGULAR;
    c[1].kc.invert_every = 2;
    c[1].kc.norm_constraint = 1e-4;
    c[1].expect_clipped = 1;
    for (int i = 0; i < 2; i++)
        kf_run_case(&c[i]);
}
END_TEST

START_TEST(test_kfac_continues_bitwise_after_restore)
{
    /* invert_every 3: the copy at step 4 lands between inversions, so the
     * restored inverses, EMA weight and velocities carry the run; with
     * model_grads (_i 1) and 4 examples the first layer's update is
     * continued from the restored preconditioned velocity */
    keel_model_config cfg;
    keel_kfac_config kc;
    keel_kfac *ka, *kb = NULL;
    fixture a, b;
    float x[8 * 36];
    int32_t y[8];
    keel_batch bt = { x, y, _i ? 4 : 8 };
    tiny_mlp(&cfg, 7, 8);
    keel_kfac_config_init(&kc);
    kc.model_grads = _i;
    kc.invert_every = 3;
    kc.schedule.learning_rate = 0.01;
    kc.damping = 0.01;
    fx_new(&a, &cfg, 5);
    ck_assert_int_eq(keel_kfac_new(&kc, a.m, a.vs, &ka), KEEL_OK);
    synthetic(x, y, 8, 36, 3, 6);
    for (int s = 0; s < 8; s++) {
        if (s == 4) {
            fx_new(&b, &cfg, 99);
            ck_assert_int_eq(keel_kfac_new(&kc, b.m, b.vs, &kb), KEEL_OK);
            copy_store(b.vs, a.vs);
        }
        if (s >= 4) {
            keel_grads_zero(b.g);
            keel_model_step(b.m, b.vs, &bt, (int64_t)bt.n, b.g, NULL);
            ck_assert_int_eq(keel_kfac_observe(kb, b.vs, &bt, s), KEEL_OK);
            ck_assert_int_eq(keel_kfac_apply(kb, b.vs, b.g, s), KEEL_OK);
        }
        keel_grads_zero(a.g);
        keel_model_step(a.m, a.vs, &bt, (int64_t)bt.n, a.g, NULL);
        ck_assert_int_eq(keel_kfac_observe(ka, a.vs, &bt, s), KEEL_OK);
        ck_assert_int_eq(keel_kfac_apply(ka, a.vs, a.g, s), KEEL_OK);
        ck_assert_int_eq((int)keel__kfac_factored(ka),
                         _i && s % 3 != 0 ? 1 : 0);
    }
    ck_assert_int_eq((int)keel_vars_count(a.vs), (int)keel_vars_count(b.vs));
    ck_assert_int_eq((int)keel_vars_count(a.vs), 4 + 2 * 4 + 1);
    for (size_t i = 0; i < keel_vars_count(a.vs); i++) {
        keel_var *va = keel_vars_at(a.vs, i), *vb = keel_vars_at(b.vs, i);
        ck_assert_str_eq(keel_var_name(va), keel_var_name(vb));
        ck_assert_msg(memcmp(keel_var_tensor(va)->data,
                             keel_var_tensor(vb)->data,
                             keel_tensor_bytes(keel_var_tensor(va))) == 0,
                      "%s differs after the restore", keel_var_name(va));
        /* velocity; with model_grads precond, and the flag on the first
         * layer's bias */
        ck_assert_int_eq((int)keel_var_slot_count(va),
                         !keel_var_is_trainable(va) ? 0
                         : 1 + _i + (_i && strcmp(keel_var_name(va),
                                                  "dense_1/bias") == 0));
        for (size_t k = 0; k < keel_var_slot_count(va); k++) {
            const char *sn;
            keel_tensor *sa = keel_var_slot_at(va, k, &sn);
            ck_assert_ptr_nonnull(keel_var_slot(vb, sn));
            ck_assert_mem_eq(sa->data, keel_var_slot(vb, sn)->data,
                             keel_tensor_bytes(sa));
        }
    }
    keel_kfac_free(ka);
    keel_kfac_free(kb);
    fx_free(&a);
    fx_free(&b);
}
END_TEST

/* The first variable whose name ends in leaf. */
static keel_tensor *
kf_state(keel_vars *vs, const char *leaf)
{
    for (size_t i = 0; i < keel_vars_count(vs); i++) {
        const char *n = keel_var_name(keel_vars_at(vs, i));
        size_t ln = strlen(n), ll = strlen(leaf);
        if (ln >= ll && strcmp(n + ln - ll, leaf) == 0)
            return keel_var_tensor(keel_vars_at(vs, i));
    }
    ck_abort_msg("no variable ending in %s", leaf);
    return NULL;
}

START_TEST(test_kfac_updates_factors_every_cov_update_every_steps)
{
    /* cov_update_every 3, decay 0.5 (0.125 per update), invert_every 2:
     * steps 1 and 2 keep the factors and the EMA weight, step 2 inverts
     * the same factors again (the same inverses), step 3 needs statistics
     * and updates them; the weights move at every step */
    keel_model_config cfg;
    keel_kfac_config kc;
    keel_kfac *k;
    fixture f;
    float x[8 * 36], *A0, *Ai0;
    int32_t y[8];
    keel_batch bt = { x, y, 8 };
    keel_tensor *A, *Ai, *w, *ew;
    size_t nA;
    tiny_mlp(&cfg, 7, 8);
    keel_kfac_config_init(&kc);
    ck_assert_int_eq(kc.cov_update_every, 1);
    kc.cov_update_every = 0;
    fx_new(&f, &cfg, 5);
    ck_assert_int_eq(keel_kfac_new(&kc, f.m, f.vs, &k), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "cov_update_every"));
    kc.cov_update_every = 3;
    kc.cov_ema_decay = 0.5;
    kc.invert_every = 2;
    kc.schedule.learning_rate = 0.01;
    kc.damping = 0.01;
    ck_assert_int_eq(keel_kfac_new(&kc, f.m, f.vs, &k), KEEL_OK);
    synthetic(x, y, 8, 36, 3, 6);
    A = kf_state(f.vs, "/kfac_A");
    Ai = kf_state(f.vs, "/kfac_A_inv");
    ew = kf_state(f.vs, "kfac/ema_weight");
    w = keel_var_tensor(keel_vars_at(f.vs, 0));
    nA = keel_tensor_bytes(A);
    A0 = malloc(nA);
    Ai0 = malloc(nA);
    ck_assert_ptr_nonnull(A0);
    ck_assert_ptr_nonnull(Ai0);
    for (int s = 0; s < 4; s++) {
        float w0 = w->data[0];
        keel_grads_zero(f.g);
        keel_model_step(f.m, f.vs, &bt, 8, f.g, NULL);
        if (s == 3) {
            ck_assert_int_eq(keel_kfac_apply(k, f.vs, f.g, s), KEEL_ESTATE);
            ck_assert(w->data[0] == w0);
        }
        ck_assert_int_eq(keel_kfac_observe(k, f.vs, &bt, s), KEEL_OK);
        ck_assert_int_eq(keel_kfac_apply(k, f.vs, f.g, s), KEEL_OK);
        ck_assert(w->data[0] != w0);
        if (s == 0) {
            ck_assert(ew->data[0] == 0.875f);
            memcpy(A0, A->data, nA);
            memcpy(Ai0, Ai->data, nA);
        } else if (s < 3) {
            ck_assert(ew->data[0] == 0.875f);
            ck_assert_mem_eq(A->data, A0, nA);
            ck_assert_mem_eq(Ai->data, Ai0, nA);
        } else {
            ck_assert(ew->data[0] == 0.984375f);   /* 0.125 w + 0.875 */
            ck_assert(memcmp(A->data, A0, nA) != 0);
        }
    }
    free(A0);
    free(Ai0);
    keel_kfac_free(k);
    fx_free(&f);
}
END_TEST

/* keel_kfac_apply_update (the role-split chief's update): with the store's
 * inverses, v <- mu v + grad and W <- W - lr A^-1 [v_W; v_b] G^-1 per
 * layer (adam momentum, dense: T = 1), computed here in double from the
 * state before the call; the factors, inverses and EMA weight stay
 * bitwise as they were. */
START_TEST(test_kfac_apply_update_uses_the_stores_inverses_only)
{
    keel_model_config cfg;
    keel_kfac_config kc;
    keel_kfac *k;
    fixture f;
    float x[8 * 36];
    int32_t y[8];
    keel_batch bt = { x, y, 8 };
    const double lr = 0.01, mu = 0.9;
    size_t nv;
    float **before;
    tiny_mlp(&cfg, 7, 8);
    keel_kfac_config_init(&kc);
    kc.schedule.learning_rate = lr;
    kc.momentum = mu;
    kc.damping = 0.01;
    fx_new(&f, &cfg, 5);
    ck_assert_int_eq(keel_kfac_new(&kc, f.m, f.vs, &k), KEEL_OK);
    synthetic(x, y, 8, 36, 3, 6);
    /* step 0: statistics, inverses and a first update */
    keel_grads_zero(f.g);
    keel_model_step(f.m, f.vs, &bt, 8, f.g, NULL);
    ck_assert_int_eq(keel_kfac_observe(k, f.vs, &bt, 0), KEEL_OK);
    ck_assert_int_eq(keel_kfac_apply(k, f.vs, f.g, 0), KEEL_OK);
    /* step 1 (no inversion due either way): the update only */
    keel_grads_zero(f.g);
    keel_model_step(f.m, f.vs, &bt, 8, f.g, NULL);
    nv = keel_vars_count(f.vs);
    before = calloc(nv, sizeof *before);
    ck_assert_ptr_nonnull(before);
    for (size_t i = 0; i < nv; i++) {
        keel_tensor *t = keel_var_tensor(keel_vars_at(f.vs, i));
        before[i] = malloc(keel_tensor_bytes(t));
        ck_assert_ptr_nonnull(before[i]);
        memcpy(before[i], t->data, keel_tensor_bytes(t));
    }
    ck_assert_int_eq(keel_kfac_num_layers(k), 2);
    {
        /* expected values, from the state before the call */
        double *want[2][2];
        for (int l = 0; l < 2; l++) {
            const char *scope;
            size_t a, g;
            char n[4][KEEL_NAME_MAX];
            keel_var *vk, *vb;
            const float *Ai, *Gi, *gk, *gb, *vvk, *vvb;
            double *v, *t;
            ck_assert_int_eq(keel_kfac_layer(k, l, &scope, &a, &g), KEEL_OK);
            snprintf(n[0], sizeof n[0], "%s/kernel", scope);
            snprintf(n[1], sizeof n[1], "%s/bias", scope);
            snprintf(n[2], sizeof n[2], "%s/kfac_A_inv", scope);
            snprintf(n[3], sizeof n[3], "%s/kfac_G_inv", scope);
            vk = keel_vars_find(f.vs, n[0]);
            vb = keel_vars_find(f.vs, n[1]);
            ck_assert_ptr_nonnull(vk);
            ck_assert_ptr_nonnull(vb);
            Ai = keel_var_tensor(keel_vars_find(f.vs, n[2]))->data;
            Gi = keel_var_tensor(keel_vars_find(f.vs, n[3]))->data;
            gk = keel_grads_at(f.g, keel_var_index(vk))->data;
            gb = keel_grads_at(f.g, keel_var_index(vb))->data;
            vvk = keel_var_slot(vk, "velocity")->data;
            vvb = keel_var_slot(vb, "velocity")->data;
            v = calloc(a * g, sizeof *v);       /* [v_W; v_b], a x g */
            t = calloc(a * g, sizeof *t);
            want[l][0] = calloc((a - 1) * g, sizeof(double));
            want[l][1] = calloc(g, sizeof(double));
            ck_assert(v && t && want[l][0] && want[l][1]);
            for (size_t i = 0; i < a * g; i++)
                v[i] = i < (a - 1) * g
                           ? mu * vvk[i] + gk[i]
                           : mu * vvb[i - (a - 1) * g] + gb[i - (a - 1) * g];
            for (size_t r = 0; r < a; r++)          /* t = v G^-1 */
                for (size_t c = 0; c < g; c++)
                    for (size_t j = 0; j < g; j++)
                        t[r * g + c] += v[r * g + j] * Gi[j * g + c];
            for (size_t r = 0; r < a; r++)          /* W - lr A^-1 t */
                for (size_t c = 0; c < g; c++) {
                    double p = 0.0;
                    for (size_t j = 0; j < a; j++)
                        p += Ai[r * a + j] * t[j * g + c];
                    if (r < a - 1)
                        want[l][0][r * g + c] =
                            keel_var_tensor(vk)->data[r * g + c] - lr * p;
                    else
                        want[l][1][c] = keel_var_tensor(vb)->data[c] - lr * p;
                }
            free(v);
            free(t);
        }
        ck_assert_msg(keel_kfac_apply_update(k, f.vs, f.g, 1) == KEEL_OK,
                      "%s", keel_last_error());
        for (int l = 0; l < 2; l++) {
            const char *scope;
            size_t a, g;
            char n[2][KEEL_NAME_MAX];
            const float *w, *b;
            ck_assert_int_eq(keel_kfac_layer(k, l, &scope, &a, &g), KEEL_OK);
            snprintf(n[0], sizeof n[0], "%s/kernel", scope);
            snprintf(n[1], sizeof n[1], "%s/bias", scope);
            w = keel_var_tensor(keel_vars_find(f.vs, n[0]))->data;
            b = keel_var_tensor(keel_vars_find(f.vs, n[1]))->data;
            for (size_t i = 0; i < (a - 1) * g + g; i++) {
                double got = i < (a - 1) * g ? w[i] : b[i - (a - 1) * g];
                double exp = i < (a - 1) * g ? want[l][0][i]
                                             : want[l][1][i - (a - 1) * g];
                ck_assert_msg(fabs(got - exp) <= 1e-5 * (fabs(exp) + 1e-3),
                              "%s [%zu]: %g, want %g", scope, i, got, exp);
            }
            free(want[l][0]);
            free(want[l][1]);
        }
    }
    /* the factors, their inverses and the EMA weight did not move */
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(f.vs, i);
        const char *nm = keel_var_name(v);
        if (strstr(nm, "kfac") != NULL)
            ck_assert_msg(memcmp(before[i], keel_var_tensor(v)->data,
                                 keel_tensor_bytes(keel_var_tensor(v))) == 0,
                          "%s changed", nm);
        free(before[i]);
    }
    free(before);
    keel_kfac_free(k);
    fx_free(&f);
}
END_TEST

START_TEST(test_kfac_rejects_bad_configs_and_unobserved_steps)
{
    keel_model_config cfg;
    keel_kfac_config kc;
    keel_kfac *k = NULL;
    fixture f;
    keel_kfac_momentum_type mt;
    keel_kfac_estimation es;
    tiny_mlp(&cfg, 4, 8);
    fx_new(&f, &cfg, 1);
    keel_kfac_config_init(&kc);
    ck_assert_double_eq(kc.cov_ema_decay, 0.95);
    ck_assert_double_eq(kc.momentum, 0.9);
    ck_assert_int_eq(kc.momentum_type, KEEL_KFAC_MOMENTUM_ADAM);
    ck_assert_int_eq(kc.estimation, KEEL_KFAC_GRADIENTS);
    ck_assert_int_eq(kc.invert_every, 10);
    kc.damping = 0.0;
    ck_assert_int_eq(keel_kfac_new(&kc, f.m, f.vs, &k), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "damping"));
    keel_kfac_config_init(&kc);
    kc.invert_every = 0;
    ck_assert_int_eq(keel_kfac_new(&kc, f.m, f.vs, &k), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "invert_every"));
    kc.invert_every = 10;
    kc.cov_ema_decay = 1.0;
    ck_assert_int_eq(keel_kfac_new(&kc, f.m, f.vs, &k), KEEL_EINVAL);
    ck_assert_int_eq(keel_kfac_momentum_type_from_name("qmodel", &mt),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "regular, adam"));
    ck_assert_int_eq(keel_kfac_estimation_from_name("empirical", &es),
                     KEEL_OK);
    ck_assert_int_eq(es, KEEL_KFAC_EMPIRICAL);
    keel_kfac_config_init(&kc);
    ck_assert_int_eq(keel_kfac_new(&kc, f.m, f.vs, &k), KEEL_OK);
    /* no statistics this step: an error, and nothing changes */
    {
        keel_tensor *w = keel_var_tensor(keel_vars_at(f.vs, 0));
        float w0 = w->data[0];
        ck_assert_int_eq(keel_kfac_apply(k, f.vs, f.g, 0), KEEL_ESTATE);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "observe"));
        ck_assert(w->data[0] == w0);
    }
    keel_kfac_free(k);
    fx_free(&f);
}
END_TEST

/* ---- K-FAC of a program's own layers (keel/kfac.h) ---- */

/* A value in [-1, 1) from *s. */
static float
ul_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 40) / (1 << 23) - 1.0);
}

/* The layers of the user-layer tests: a dense layer with a bias (5 -> 4),
 * one without (4 -> 3), a 2x2 conv2d with a bias on 4x4x2 inputs (VALID,
 * stride 1: 3x3x3 outputs), and a trainable variable of no layer. */
typedef struct ul_store {
    keel_vars *vs;
    keel_var *d1k, *d1b, *d2k, *ck, *cb, *extra;
} ul_store;

static void
ul_store_new(ul_store *u, uint64_t seed)
{
    static const int64_t s_d1k[2] = { 5, 4 }, s_d1b[1] = { 4 };
    static const int64_t s_d2k[2] = { 4, 3 }, s_ck[4] = { 2, 2, 2, 3 };
    static const int64_t s_cb[1] = { 3 }, s_ex[1] = { 3 };
    keel_var **out[6] = { &u->d1k, &u->d1b, &u->d2k, &u->ck, &u->cb,
                          &u->extra };
    const char *names[6] = { "d1/kernel", "d1/bias", "d2/kernel",
                             "c/kernel", "c/bias", "extra/w" };
    const int64_t *shapes[6] = { s_d1k, s_d1b, s_d2k, s_ck, s_cb, s_ex };
    const int ranks[6] = { 2, 1, 2, 4, 1, 1 };
    ck_assert_int_eq(keel_vars_new(&u->vs), KEEL_OK);
    for (int i = 0; i < 6; i++) {
        keel_tensor *t;
        ck_assert_int_eq(keel_vars_create(u->vs, names[i], ranks[i],
                                          shapes[i], KEEL_VAR_TRAINABLE,
                                          out[i]), KEEL_OK);
        t = keel_var_tensor(*out[i]);
        for (size_t j = 0; j < t->count; j++)
            t->data[j] = ul_rand(&seed);
    }
}

static void
ul_register(ul_store *u, keel_kfac_layers *lc)
{
    keel_kfac_conv2d_config cc;
    int i;
    ck_assert_int_eq(keel_kfac_layers_add_dense(lc, u->d1k, u->d1b, &i),
                     KEEL_OK);
    ck_assert_int_eq(i, 0);
    ck_assert_int_eq(keel_kfac_layers_add_dense(lc, u->d2k, NULL, &i),
                     KEEL_OK);
    ck_assert_int_eq(i, 1);
    keel_kfac_conv2d_config_init(&cc);
    cc.height = 4;
    cc.width = 4;
    ck_assert_int_eq(keel_kfac_layers_add_conv2d(lc, &cc, u->ck, u->cb, &i),
                     KEEL_OK);
    ck_assert_int_eq(i, 2);
}

/* sum over rows of [x_r, 1?] [x_r, 1?]^T / norm, in double (a x a). */
static void
ul_cov(const float *x, size_t rows, size_t d, int homog, double norm,
       double *out)
{
    size_t a = d + (homog ? 1 : 0);
    memset(out, 0, a * a * sizeof *out);
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < a; i++)
            for (size_t j = 0; j < a; j++) {
                double xi = i < d ? x[r * d + i] : 1.0;
                double xj = j < d ? x[r * d + j] : 1.0;
                out[i * a + j] += xi * xj / norm;
            }
}

/* The store's factor scope/leaf, debiased by the EMA weight, against
 * want (n x n). */
static void
ul_check_factor(keel_vars *vs, const char *name, const double *want,
                size_t n)
{
    keel_tensor *t = keel_var_tensor(keel_vars_find(vs, name));
    float w = keel_var_tensor(keel_vars_find(vs, "kfac/ema_weight"))->data[0];
    ck_assert_uint_eq(t->count, n * n);
    for (size_t i = 0; i < n * n; i++)
        ck_assert_msg(fabs(t->data[i] / w - want[i]) <=
                          1e-5 * (fabs(want[i]) + 1e-2),
                      "%s[%zu]: %g, want %g", name, i,
                      (double)(t->data[i] / w), want[i]);
}

/* dst (a x g) = A^-1 m G^-1 / T in double, from the store's inverses. */
static void
ul_precond(keel_vars *vs, const char *scope, const double *m, size_t a,
           size_t g, double T, double *dst)
{
    char n[2][KEEL_NAME_MAX];
    const float *Ai, *Gi;
    double *t = calloc(a * g, sizeof *t);
    ck_assert_ptr_nonnull(t);
    snprintf(n[0], sizeof n[0], "%s/kfac_A_inv", scope);
    snprintf(n[1], sizeof n[1], "%s/kfac_G_inv", scope);
    Ai = keel_var_tensor(keel_vars_find(vs, n[0]))->data;
    Gi = keel_var_tensor(keel_vars_find(vs, n[1]))->data;
    for (size_t r = 0; r < a; r++)
        for (size_t c = 0; c < g; c++)
            for (size_t j = 0; j < g; j++)
                t[r * g + c] += m[r * g + j] * Gi[j * g + c];
    for (size_t r = 0; r < a; r++)
        for (size_t c = 0; c < g; c++) {
            double p = 0.0;
            for (size_t j = 0; j < a; j++)
                p += Ai[r * a + j] * t[j * g + c];
            dst[r * g + c] = p / T;
        }
    free(t);
}

/* (A / w + pi sqrt(lambda) I) A^-1 = I for the store's A and inverse. */
static void
ul_check_inverse(keel_vars *vs, const char *scope, size_t a, size_t g,
                 double lam)
{
    char n[4][KEEL_NAME_MAX];
    const float *A, *G, *Ai;
    double w, ta = 0.0, tg = 0.0, pi;
    snprintf(n[0], sizeof n[0], "%s/kfac_A", scope);
    snprintf(n[1], sizeof n[1], "%s/kfac_G", scope);
    snprintf(n[2], sizeof n[2], "%s/kfac_A_inv", scope);
    A = keel_var_tensor(keel_vars_find(vs, n[0]))->data;
    G = keel_var_tensor(keel_vars_find(vs, n[1]))->data;
    Ai = keel_var_tensor(keel_vars_find(vs, n[2]))->data;
    w = keel_var_tensor(keel_vars_find(vs, "kfac/ema_weight"))->data[0];
    for (size_t i = 0; i < a; i++)
        ta += A[i * a + i] / w;
    for (size_t i = 0; i < g; i++)
        tg += G[i * g + i] / w;
    pi = sqrt((ta / (double)a) / (tg / (double)g));
    for (size_t i = 0; i < a; i++)
        for (size_t j = 0; j < a; j++) {
            double s = 0.0;
            for (size_t k = 0; k < a; k++)
                s += ((double)A[i * a + k] / w +
                      (i == k ? pi * sqrt(lam) : 0.0)) * Ai[k * a + j];
            ck_assert_msg(fabs(s - (i == j ? 1.0 : 0.0)) < 2e-3,
                          "%s: (A + damping) A^-1 [%zu][%zu] = %g", scope, i,
                          j, s);
        }
}

START_TEST(test_kfac_user_layers_factors_and_update)
{
    enum { NX = 6 };
    const double lr = 0.1, damping = 0.01;
    ul_store u;
    keel_kfac_layers *lc;
    keel_kfac_config kc;
    keel_kfac *k;
    keel_grads *g;
    uint64_t s = 99;
    float x1[NX * 5], g1[NX * 4], x2[NX * 4], g2[NX * 3];
    float xc[NX * 4 * 4 * 2], gc[NX * 3 * 3 * 3], patch[NX * 9 * 8];
    float before[6][64];
    keel_var *vars[6];
    double ref[81], *m, *p;
    ul_store_new(&u, 7);
    vars[0] = u.d1k; vars[1] = u.d1b; vars[2] = u.d2k;
    vars[3] = u.ck; vars[4] = u.cb; vars[5] = u.extra;
    ck_assert_int_eq(keel_kfac_layers_new(&lc), KEEL_OK);
    ul_register(&u, lc);
    ck_assert_int_eq(keel_kfac_layers_count(lc), 3);
    keel_kfac_config_init(&kc);
    kc.schedule.learning_rate = lr;
    kc.damping = damping;
    kc.momentum_type = KEEL_KFAC_MOMENTUM_REGULAR;
    kc.momentum = 0.5;
    ck_assert_msg(keel_kfac_new_from_layers(&kc, lc, u.vs, &k) == KEEL_OK,
                  "%s", keel_last_error());
    keel_kfac_layers_free(lc);
    ck_assert_int_eq(keel_kfac_num_layers(k), 3);
    {
        size_t a, gd;
        ck_assert_int_eq(keel_kfac_layer(k, 1, NULL, &a, &gd), KEEL_OK);
        ck_assert_uint_eq(a, 4);                /* no bias: no 1 appended */
        ck_assert_uint_eq(gd, 3);
        ck_assert_int_eq(keel_kfac_layer(k, 2, NULL, &a, &gd), KEEL_OK);
        ck_assert_uint_eq(a, 2 * 2 * 2 + 1);
    }
    ck_assert_ptr_nonnull(keel_var_slot(u.extra, "velocity"));
    for (size_t i = 0; i < sizeof x1 / sizeof *x1; i++) x1[i] = ul_rand(&s);
    for (size_t i = 0; i < sizeof g1 / sizeof *g1; i++) g1[i] = ul_rand(&s);
    for (size_t i = 0; i < sizeof x2 / sizeof *x2; i++) x2[i] = ul_rand(&s);
    for (size_t i = 0; i < sizeof g2 / sizeof *g2; i++) g2[i] = ul_rand(&s);
    for (size_t i = 0; i < sizeof xc / sizeof *xc; i++) xc[i] = ul_rand(&s);
    for (size_t i = 0; i < sizeof gc / sizeof *gc; i++) gc[i] = ul_rand(&s);
    ck_assert_int_eq(keel_grads_new(u.vs, &g), KEEL_OK);
    for (int v = 0; v < 6; v++) {
        keel_tensor *t = keel_grads_at(g, keel_var_index(vars[v]));
        for (size_t i = 0; i < t->count; i++)
            t->data[i] = ul_rand(&s);
        memcpy(before[v], keel_var_tensor(vars[v])->data,
               t->count * sizeof(float));
    }
    /* layer 1 unobserved: the apply fails naming it, nothing changes */
    ck_assert_int_eq(keel_kfac_observe_layer(k, 0, x1, g1, NX, 0), KEEL_OK);
    ck_assert_int_eq(keel_kfac_apply(k, u.vs, g, 0), KEEL_ESTATE);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'d2'"));
    ck_assert(memcmp(before[0], keel_var_tensor(u.d1k)->data,
                     20 * sizeof(float)) == 0);
    /* layer 0 in two pieces of the batch, the others whole */
    ck_assert_int_eq(keel_kfac_observe_layer(k, 0, x1, g1, 4, 0), KEEL_OK);
    ck_assert_int_eq(keel_kfac_observe_layer(k, 0, x1 + 4 * 5, g1 + 4 * 4,
                                             NX - 4, 0), KEEL_OK);
    ck_assert_int_eq(keel_kfac_observe_layer(k, 1, x2, g2, NX, 0), KEEL_OK);
    ck_assert_int_eq(keel_kfac_observe_layer(k, 2, xc, gc, NX, 0), KEEL_OK);
    ck_assert_int_eq(keel_kfac_observe_layer(k, 3, xc, gc, NX, 0),
                     KEEL_EINVAL);
    ck_assert_msg(keel_kfac_apply(k, u.vs, g, 0) == KEEL_OK, "%s",
                  keel_last_error());
    /* the factors */
    ul_cov(x1, NX, 5, 1, NX, ref);
    ul_check_factor(u.vs, "d1/kfac_A", ref, 6);
    ul_cov(g1, NX, 4, 0, NX, ref);
    ul_check_factor(u.vs, "d1/kfac_G", ref, 4);
    ul_cov(x2, NX, 4, 0, NX, ref);
    ul_check_factor(u.vs, "d2/kfac_A", ref, 4);
    ul_cov(g2, NX, 3, 0, NX, ref);
    ul_check_factor(u.vs, "d2/kfac_G", ref, 3);
    for (int b = 0; b < NX; b++)            /* im2col, kernel order */
        for (int oy = 0; oy < 3; oy++)
            for (int ox = 0; ox < 3; ox++)
                for (int ky = 0; ky < 2; ky++)
                    for (int kx = 0; kx < 2; kx++)
                        for (int ci = 0; ci < 2; ci++)
                            patch[((b * 9 + oy * 3 + ox) * 4 + ky * 2 + kx) *
                                      2 + ci] =
                                xc[((b * 4 + oy + ky) * 4 + ox + kx) * 2 + ci];
    ul_cov(patch, NX * 9, 8, 1, NX * 9, ref);
    ul_check_factor(u.vs, "c/kfac_A", ref, 9);
    ul_cov(gc, NX * 9, 3, 0, NX * 9, ref);
    ul_check_factor(u.vs, "c/kfac_G", ref, 3);
    /* the damped inverses (lambda / T for the convolution) */
    ul_check_inverse(u.vs, "d1", 6, 4, damping);
    ul_check_inverse(u.vs, "d2", 4, 3, damping);
    ul_check_inverse(u.vs, "c", 9, 3, damping / 9.0);
    /* the update: x -= lr F^-1 grad (regular momentum, zero velocity) */
    m = calloc(64, sizeof *m);
    p = calloc(64, sizeof *p);
    ck_assert(m != NULL && p != NULL);
    {
        const struct {
            const char *scope;
            int kv, bv;             /* vars[] of kernel, bias (-1 none) */
            size_t a, gd;
            double T;
        } L[3] = { { "d1", 0, 1, 6, 4, 1 }, { "d2", 2, -1, 4, 3, 1 },
                   { "c", 3, 4, 9, 3, 9 } };
        for (int l = 0; l < 3; l++) {
            size_t nk = (L[l].a - (L[l].bv >= 0)) * L[l].gd;
            const float *gk = keel_grads_at(g, keel_var_index(vars[L[l].kv]))
                                  ->data;
            for (size_t i = 0; i < nk; i++)
                m[i] = gk[i];
            if (L[l].bv >= 0) {
                const float *gb =
                    keel_grads_at(g, keel_var_index(vars[L[l].bv]))->data;
                for (size_t i = 0; i < L[l].gd; i++)
                    m[nk + i] = gb[i];
            }
            ul_precond(u.vs, L[l].scope, m, L[l].a, L[l].gd, L[l].T, p);
            for (size_t i = 0; i < L[l].a * L[l].gd; i++) {
                int v = i < nk ? L[l].kv : L[l].bv;
                size_t j = i < nk ? i : i - nk;
                double want = before[v][j] - lr * p[i];
                double got = keel_var_tensor(vars[v])->data[j];
                ck_assert_msg(fabs(got - want) <= 1e-4 * (fabs(want) + 1e-2),
                              "%s [%zu]: %g, want %g", L[l].scope, i, got,
                              want);
            }
        }
    }
    /* the variable of no layer: momentum SGD, v = grad, x -= lr v */
    for (size_t i = 0; i < 3; i++) {
        float gv = keel_grads_at(g, keel_var_index(u.extra))->data[i];
        ck_assert(keel_var_tensor(u.extra)->data[i] ==
                  before[5][i] - (float)lr * gv);
    }
    free(m);
    free(p);
    keel_grads_free(g);
    keel_kfac_free(k);
    keel_vars_free(u.vs);
}
END_TEST

START_TEST(test_kfac_user_layers_refuse_bad_registrations)
{
    ul_store u;
    keel_kfac_layers *lc;
    keel_kfac_conv2d_config cc;
    keel_kfac_config kc;
    keel_kfac *k = NULL;
    float logits[2 * 3] = { 0, 5, 0, 9, 0, 0 };
    int32_t labels[2] = { 2, 1 }, t[2];
    ul_store_new(&u, 3);
    ck_assert_int_eq(keel_kfac_layers_new(&lc), KEEL_OK);
    keel_kfac_config_init(&kc);
    /* nothing registered */
    ck_assert_int_eq(keel_kfac_new_from_layers(&kc, lc, u.vs, &k),
                     KEEL_EINVAL);
    /* a bias that is not the kernel's outputs, a kernel of the wrong rank */
    ck_assert_int_eq(keel_kfac_layers_add_dense(lc, u.d2k, u.d1b, NULL),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "d1/bias"));
    ck_assert_int_eq(keel_kfac_layers_add_dense(lc, u.ck, NULL, NULL),
                     KEEL_EINVAL);
    keel_kfac_conv2d_config_init(&cc);
    ck_assert_int_eq(keel_kfac_layers_add_conv2d(lc, &cc, u.ck, u.cb, NULL),
                     KEEL_EINVAL);          /* no input size */
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "height"));
    cc.height = 1;
    cc.width = 1;
    ck_assert_int_eq(keel_kfac_layers_add_conv2d(lc, &cc, u.ck, u.cb, NULL),
                     KEEL_EINVAL);          /* kernel larger than input */
    memset(&cc, 0, sizeof cc);
    ck_assert_int_eq(keel_kfac_layers_add_conv2d(lc, &cc, u.ck, u.cb, NULL),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "keel_kfac_conv2d_config_init"));
    /* twice the same kernel */
    ck_assert_int_eq(keel_kfac_layers_add_dense(lc, u.d1k, u.d1b, NULL),
                     KEEL_OK);
    ck_assert_int_eq(keel_kfac_layers_add_dense(lc, u.d1k, NULL, NULL),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "already"));
    /* model_grads describes a model's step */
    kc.model_grads = 1;
    ck_assert_int_eq(keel_kfac_new_from_layers(&kc, lc, u.vs, &k),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "model_grads"));
    kc.model_grads = 0;
    ck_assert_int_eq(keel_kfac_new_from_layers(&kc, lc, u.vs, &k), KEEL_OK);
    /* a layer collection's optimizer observes layers, not batches */
    {
        keel_batch bt = { logits, labels, 2 };
        ck_assert_int_eq(keel_kfac_observe(k, u.vs, &bt, 0), KEEL_EINVAL);
        ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                     "keel_kfac_observe_layer"));
    }
    /* targets: the same draws for the same step; empirical: the labels */
    {
        int32_t t2[2];
        ck_assert_int_eq(keel_kfac_sample_targets(k, logits, 2, 3, NULL, 5,
                                                  t), KEEL_OK);
        ck_assert_int_eq(keel_kfac_sample_targets(k, logits, 2, 3, NULL, 6,
                                                  t2), KEEL_OK);
        ck_assert_int_eq(keel_kfac_sample_targets(k, logits, 2, 3, NULL, 5,
                                                  t2), KEEL_OK);
        ck_assert(t[0] == t2[0] && t[1] == t2[1]);
        ck_assert_int_eq(t[0], 1);     /* p = 0.987 */
        ck_assert_int_eq(t[1], 0);     /* p = 0.9998 */
    }
    keel_kfac_free(k);
    kc.estimation = KEEL_KFAC_EMPIRICAL;
    ck_assert_int_eq(keel_kfac_new_from_layers(&kc, lc, u.vs, &k), KEEL_OK);
    ck_assert_int_eq(keel_kfac_sample_targets(k, logits, 2, 3, labels, 0, t),
                     KEEL_OK);
    ck_assert(t[0] == 2 && t[1] == 1);
    ck_assert_int_eq(keel_kfac_sample_targets(k, logits, 2, 3, NULL, 0, t),
                     KEEL_EINVAL);
    keel_kfac_free(k);
    keel_kfac_layers_free(lc);
    keel_vars_free(u.vs);
}
END_TEST

/* ---- data files --------------------------------------------------------- */

#define NEX 10

static void
write_maybe_gz(const char *path, const void *data, size_t n, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(gzwrite(f, data, (unsigned)n), (int)n);
        ck_assert_int_eq(gzclose(f), Z_OK);
    } else {
        tu_write_file(path, data, n);
    }
}

/* NEX images of 4x3 pixels (pixel j of image i = i*12 + j) and labels i%3;
 * count_labels lets a test make the two files disagree. */
static void
write_idx(const char *img, const char *lab, int gz, uint32_t count_labels)
{
    uint8_t ibuf[16 + NEX * 12], lbuf[8 + NEX];
    tu_idx_images_header(ibuf, NEX, 4, 3);
    for (int i = 0; i < NEX * 12; i++)
        ibuf[16 + i] = (uint8_t)i;
    tu_idx_labels_header(lbuf, count_labels);
    for (int i = 0; i < NEX; i++)
        lbuf[8 + i] = (uint8_t)(i % 3);
    write_maybe_gz(img, ibuf, sizeof ibuf, gz);
    write_maybe_gz(lab, lbuf, 8 + (count_labels < NEX ? count_labels : NEX),
                   gz);
}

START_TEST(test_idx_reader_reads_plain_and_gzip)
{
    for (int gz = 0; gz <= 1; gz++) {
        keel_dataset *ds;
        float x[12];
        int32_t y;
        int64_t h, w, c;
        const char *img = tu_path(gz ? "i.gz" : "i.idx");
        const char *lab = tu_path(gz ? "l.gz" : "l.idx");
        write_idx(img, lab, gz, NEX);
        ck_assert_msg(keel_dataset_open_idx(img, lab, 3, &ds) == KEEL_OK,
                      "%s", keel_last_error());
        ck_assert_uint_eq(keel_dataset_count(ds), NEX);
        keel_dataset_shape(ds, &h, &w, &c);
        ck_assert_int_eq(h, 4);
        ck_assert_int_eq(w, 3);
        ck_assert_int_eq(c, 1);
        ck_assert_int_eq(keel_dataset_get(ds, 7, x, &y), KEEL_OK);
        ck_assert_int_eq(y, 1);
        ck_assert_float_eq(x[5], (float)(7 * 12 + 5) / 255.0f);
        ck_assert_int_eq(keel_dataset_get(ds, NEX, x, &y), KEEL_EINVAL);
        keel_dataset_free(ds);
    }
}
END_TEST

static void
expect_corrupt(const char *img, const char *lab, int classes,
               const char *needle, const char *name)
{
    keel_dataset *ds = (keel_dataset *)1;
    ck_assert_int_eq(keel_dataset_open_idx(img, lab, classes, &ds),
                     KEEL_ECORRUPT);
    ck_assert_ptr_null(ds);
    ck_assert_msg(strstr(keel_last_error(), needle) != NULL &&
                      strstr(keel_last_error(), name) != NULL,
                  "message '%s' lacks '%s' or '%s'", keel_last_error(),
                  needle, name);
}

START_TEST(test_idx_reader_rejects_corrupt_files)
{
    const char *img = tu_path("i.idx"), *lab = tu_path("l.idx");
    const char *gimg = tu_path("i.gz"), *glab = tu_path("l.gz");
    keel_dataset *ds;
    write_idx(img, lab, 0, NEX);
    expect_corrupt(img, lab, 2, "outside [0, 2)", "l.idx");
    tu_flip_byte(img, 3, 0x01);                      /* magic 0x802 */
    expect_corrupt(img, lab, 3, "wrong magic", "i.idx");
    write_idx(img, lab, 0, NEX);
    tu_truncate(img, 16 + NEX * 12 - 1);
    expect_corrupt(img, lab, 3, "truncated", "i.idx");
    tu_truncate(img, 10);
    expect_corrupt(img, lab, 3, "16-byte header", "i.idx");
    write_idx(img, lab, 0, NEX - 1);                 /* 9 labels */
    expect_corrupt(img, lab, 3, "has 9 labels", "l.idx");
    write_idx(img, lab, 0, NEX);
    tu_flip_byte(img, 8, 0x80);                      /* huge rows */
    expect_corrupt(img, lab, 3, "bad header", "i.idx");
    write_idx(img, lab, 0, NEX);
    {
        char *d;
        size_t n;
        d = tu_read_file(lab, &n);
        tu_write_file(lab, d, n - 1);
        free(d);
    }
    expect_corrupt(img, lab, 3, "truncated", "l.idx");
    /* a gzip stream cut short */
    write_idx(gimg, glab, 1, NEX);
    tu_truncate(gimg, tu_file_size(gimg) - 12);
    expect_corrupt(gimg, glab, 3, "", "i.gz");
    ck_assert_int_eq(keel_dataset_open_idx(tu_path("missing"), glab, 3, &ds),
                     KEEL_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "missing"));
}
END_TEST

/* An HDF5 file with x (uint8 [n,4,3] or float [n,4,3,2]) and y int32. */
static void
write_h5(const char *path, int as_float, hsize_t nx, hsize_t ny,
         int32_t bad_label)
{
    hid_t f, s, d;
    hsize_t xd[4] = { nx, 4, 3, 2 };
    size_t per = as_float ? 24 : 12;
    void *xbuf = calloc(nx * per, as_float ? 4 : 1);
    int32_t *y = calloc(ny, sizeof *y);
    for (size_t i = 0; i < nx * per; i++) {
        if (as_float)
            ((float *)xbuf)[i] = (float)i * 0.001f;
        else
            ((uint8_t *)xbuf)[i] = (uint8_t)i;
    }
    for (size_t i = 0; i < ny; i++)
        y[i] = (int32_t)(i % 3);
    if (ny > 0)
        y[ny - 1] = bad_label >= 0 ? bad_label : y[ny - 1];
    f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    s = H5Screate_simple(as_float ? 4 : 3, xd, NULL);
    d = H5Dcreate2(f, "x", as_float ? H5T_IEEE_F32LE : H5T_STD_U8LE, s,
                   H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(H5Dwrite(d, as_float ? H5T_NATIVE_FLOAT
                                          : H5T_NATIVE_UINT8,
                              H5S_ALL, H5S_ALL, H5P_DEFAULT, xbuf), 0);
    H5Dclose(d);
    H5Sclose(s);
    s = H5Screate_simple(1, &ny, NULL);
    d = H5Dcreate2(f, "y", H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT,
                   H5P_DEFAULT);
    ck_assert_int_ge(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL,
                              H5P_DEFAULT, y), 0);
    H5Dclose(d);
    H5Sclose(s);
    H5Fclose(f);
    free(xbuf);
    free(y);
}

START_TEST(test_h5_reader_reads_uint8_and_float)
{
    keel_dataset *ds;
    float x[24];
    int32_t y;
    int64_t c;
    const char *p = tu_path("d.h5");
    write_h5(p, 0, 5, 5, -1);
    ck_assert_msg(keel_dataset_open_h5(p, 3, &ds) == KEEL_OK, "%s",
                  keel_last_error());
    ck_assert_uint_eq(keel_dataset_count(ds), 5);
    ck_assert_uint_eq(keel_dataset_example_size(ds), 12);
    keel_dataset_get(ds, 2, x, &y);
    ck_assert_int_eq(y, 2);
    ck_assert_float_eq(x[1], 25.0f / 255.0f);
    keel_dataset_free(ds);
    write_h5(p, 1, 4, 4, -1);
    ck_assert_int_eq(keel_dataset_open_h5(p, 3, &ds), KEEL_OK);
    keel_dataset_shape(ds, NULL, NULL, &c);
    ck_assert_int_eq(c, 2);
    keel_dataset_get(ds, 3, x, &y);
    ck_assert_float_eq(x[4], (float)(3 * 24 + 4) * 0.001f);
    keel_dataset_free(ds);
}
END_TEST

/* Every config struct of keel/train.h made without its init function
 * (memset, "= { 0 }": struct_size 0) is refused by the function taking it,
 * naming the struct and its init function. */
static keel_vars *zc_vs;
static keel_model *zc_model;
static keel_dataset *zc_ds;

static keel_status
zc_model_config(void)
{
    keel_model_config c;
    keel_model *m = NULL;
    keel_status st;
    memset(&c, 0, sizeof c);
    st = keel_model_new(&c, zc_vs, &m);
    ck_assert_ptr_null(m);
    return st;
}

static keel_status
zc_lr_schedule(void)
{
    keel_lr_schedule c;
    memset(&c, 0, sizeof c);
    return keel_lr_schedule_validate(&c);
}

static keel_status
zc_optimizer_config(void)
{
    keel_optimizer_config c;
    keel_optimizer *o = NULL;
    keel_status st;
    memset(&c, 0, sizeof c);
    st = keel_optimizer_new(&c, &o);
    ck_assert_ptr_null(o);
    return st;
}

static keel_status
zc_optimizer_schedule(void)
{
    keel_optimizer_config c;
    keel_optimizer *o = NULL;
    keel_optimizer_config_init(&c, KEEL_OPT_SGD);
    memset(&c.schedule, 0, sizeof c.schedule);
    return keel_optimizer_new(&c, &o);
}

static keel_status
zc_kfac_config(void)
{
    keel_kfac_config c;
    keel_kfac *k = NULL;
    memset(&c, 0, sizeof c);
    return keel_kfac_new(&c, zc_model, zc_vs, &k);
}

static keel_status
zc_hogwild_config(void)
{
    keel_hogwild_config c;
    keel_optimizer_config oc;
    keel_hogwild *h = NULL;
    memset(&c, 0, sizeof c);
    keel_optimizer_config_init(&oc, KEEL_OPT_SGD);
    return keel_hogwild_new(&c, &oc, zc_vs, &h);
}

static keel_status
zc_data_iter_config(void)
{
    keel_data_iter_config c;
    keel_data_iter *it = NULL;
    memset(&c, 0, sizeof c);
    return keel_data_iter_new(zc_ds, &c, &it);
}

START_TEST(test_zeroed_config_structs_are_refused_by_name)
{
    static const tu_zeroed_case cases[] = {
        { "keel_model_config", zc_model_config },
        { "keel_lr_schedule", zc_lr_schedule },
        { "keel_optimizer_config", zc_optimizer_config },
        { "keel_lr_schedule", zc_optimizer_schedule },
        { "keel_kfac_config", zc_kfac_config },
        { "keel_hogwild_config", zc_hogwild_config },
        { "keel_data_iter_config", zc_data_iter_config },
    };
    keel_model_config mc;
    const char *p = tu_path("zc.h5");
    ck_assert_int_eq(keel_vars_new(&zc_vs), KEEL_OK);
    keel_model_config_init(&mc);
    mc.kind = KEEL_MODEL_SOFTMAX;
    mc.height = 4;
    mc.width = 3;
    mc.channels = 2;
    mc.classes = 3;
    ck_assert_int_eq(keel_model_new(&mc, zc_vs, &zc_model), KEEL_OK);
    write_h5(p, 0, 5, 5, -1);
    ck_assert_int_eq(keel_dataset_open_h5(p, 3, &zc_ds), KEEL_OK);
    tu_assert_zeroed_refused(cases, sizeof cases / sizeof *cases);
    keel_dataset_free(zc_ds);
    keel_model_free(zc_model);
    keel_vars_free(zc_vs);
}
END_TEST

START_TEST(test_h5_reader_rejects_corrupt_files)
{
    keel_dataset *ds;
    const char *p = tu_path("d.h5");
    write_h5(p, 0, 5, 4, -1);
    ck_assert_int_eq(keel_dataset_open_h5(p, 3, &ds), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "5 rows but dataset "
                                                   "'y' has 4 labels"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "d.h5"));
    write_h5(p, 1, 5, 5, 7);
    ck_assert_int_eq(keel_dataset_open_h5(p, 3, &ds), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "label 7"));
    tu_write_file(p, "not hdf5 at all", 15);
    ck_assert_int_eq(keel_dataset_open_h5(p, 3, &ds), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "not a readable"));
    {
        hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        H5Fclose(f);
    }
    ck_assert_int_eq(keel_dataset_open_h5(p, 3, &ds), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'x'"));
    ck_assert_int_eq(keel_dataset_open_h5(tu_path("nope.h5"), 3, &ds),
                     KEEL_ENOTFOUND);
}
END_TEST


/* A tabular HDF5 file at path: 'x' [n, d] of type xt (written from
 * doubles: row i, column j is i + j / 1000, or bad at value bad_at), 'y'
 * [ny] of type yt (label i % 5, or bad_label at the last row). */
static void
write_tab(const char *path, size_t n, size_t d, hid_t xt, size_t ny,
          hid_t yt, long bad_at, double bad, long bad_label)
{
    hsize_t xd[2] = { n, d }, yd = ny;
    double *x = malloc(n * d * sizeof *x), *yf = malloc(ny * sizeof *yf);
    int64_t *y = malloc(ny * sizeof *y);
    hid_t f, s, ds;
    for (size_t i = 0; i < n * d; i++)
        x[i] = (double)(i / d) + (double)(i % d) / 1000.0;
    if (bad_at >= 0)
        x[bad_at] = bad;
    for (size_t i = 0; i < ny; i++)
        y[i] = (int64_t)(i % 5);
    if (bad_label >= 0 && ny > 0)
        y[ny - 1] = bad_label;
    for (size_t i = 0; i < ny; i++)
        yf[i] = (double)y[i];
    f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    s = H5Screate_simple(2, xd, NULL);
    ds = H5Dcreate2(f, "x", xt, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL,
                              H5P_DEFAULT, x), 0);
    H5Dclose(ds);
    H5Sclose(s);
    s = H5Screate_simple(1, &yd, NULL);
    ds = H5Dcreate2(f, "y", yt, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (H5Tget_class(yt) == H5T_FLOAT)
        ck_assert_int_ge(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL,
                                  H5P_DEFAULT, yf), 0);
    else
        ck_assert_int_ge(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL,
                                  H5P_DEFAULT, y), 0);
    H5Dclose(ds);
    H5Sclose(s);
    H5Fclose(f);
    free(x);
    free(y);
    free(yf);
}

static keel_status
open_tab(const char *p, int stream, int64_t block, int64_t classes,
         keel_dataset **ds)
{
    keel_dataset_h5_config hc;
    keel_dataset_h5_config_init(&hc);
    hc.stream = stream;
    hc.block_rows = block;
    hc.num_classes = classes;
    return keel_dataset_open_h5_config(p, &hc, ds);
}

START_TEST(test_h5_tabular_rows_in_memory_and_streamed)
{
    const char *p = tu_path("t.h5");
    keel_dataset *ds;
    float x[7];
    int32_t y;
    int64_t h, w, c;
    for (int stream = 0; stream < 2; stream++) {
        write_tab(p, 50, 7, stream ? H5T_IEEE_F64LE : H5T_IEEE_F32LE, 50,
                  H5T_STD_U8LE, -1, 0, -1);
        ck_assert_msg(open_tab(p, stream, 8, 5, &ds) == KEEL_OK, "%s",
                      keel_last_error());
        ck_assert_int_eq(keel_dataset_rank(ds), 2);
        ck_assert_int_eq(keel_dataset_is_streamed(ds), stream);
        ck_assert_int_eq(keel_dataset_max_label(ds), 4);
        keel_dataset_shape(ds, &h, &w, &c);
        ck_assert(h == 7 && w == 1 && c == 1);
        ck_assert_int_eq(keel_dataset_get(ds, 43, x, &y), KEEL_OK);
        ck_assert_int_eq(y, 3);
        ck_assert_float_eq(x[6], 43.006f);
        ck_assert_int_eq(keel_dataset_get(ds, 1, x, &y), KEEL_OK);
        ck_assert_float_eq(x[0], 1.0f);
        /* streamed: two reads of 8-row blocks, none in memory */
        ck_assert_uint_eq(keel_dataset_blocks_read(ds), stream ? 2 : 0);
        keel_dataset_free(ds);
    }
}
END_TEST

/* Each bad file fails with the file, the dataset and the row named. */
START_TEST(test_h5_tabular_errors_name_file_dataset_and_row)
{
    const char *p = tu_path("bad.h5");
    keel_dataset *ds;
    float x[4];
    write_tab(p, 30, 4, H5T_IEEE_F32LE, 30, H5T_STD_I32LE, -1, 0, 9);
    ck_assert_int_eq(open_tab(p, 0, 0, 5, &ds), KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), "bad.h5: dataset 'y' row 29: "
                         "label 9 outside [0, 5)") != NULL, "%s",
                  keel_last_error());
    write_tab(p, 30, 4, H5T_IEEE_F32LE, 29, H5T_STD_I32LE, -1, 0, -1);
    ck_assert_int_eq(open_tab(p, 1, 8, 5, &ds), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dataset 'x' has 30 "
                                 "rows but dataset 'y' has 29 labels"));
    write_tab(p, 30, 4, H5T_STD_I32LE, 30, H5T_STD_I32LE, -1, 0, -1);
    ck_assert_int_eq(open_tab(p, 0, 0, 5, &ds), KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), "dataset 'x' holds integers") !=
                  NULL && strstr(keel_last_error(), "float32 or float64"),
                  "%s", keel_last_error());
    write_tab(p, 30, 4, H5T_IEEE_F32LE, 30, H5T_IEEE_F32LE, -1, 0, -1);
    ck_assert_int_eq(open_tab(p, 0, 0, 5, &ds), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dataset 'y' holds "
                                 "floating-point numbers"));
    /* NaN at row 21, value 2: in memory at open, streamed at the read */
    write_tab(p, 30, 4, H5T_IEEE_F32LE, 30, H5T_STD_I32LE, 21 * 4 + 2, NAN,
              -1);
    ck_assert_int_eq(open_tab(p, 0, 0, 5, &ds), KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), "bad.h5: dataset 'x' row 21, "
                         "value 2 is NaN") != NULL, "%s", keel_last_error());
    ck_assert_int_eq(open_tab(p, 1, 8, 5, &ds), KEEL_OK);
    ck_assert_int_eq(keel_dataset_get(ds, 3, x, NULL), KEEL_OK);
    ck_assert_int_eq(keel_dataset_get(ds, 17, x, NULL), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "row 21, value 2 is "
                                 "NaN"));
    keel_dataset_free(ds);
    write_tab(p, 30, 4, H5T_IEEE_F64LE, 30, H5T_STD_I32LE, 5, INFINITY, -1);
    ck_assert_int_eq(open_tab(p, 0, 0, 5, &ds), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "row 1, value 1 is "
                                 "infinite"));
}
END_TEST

/* The streamed set gives the in-memory set's batches, position for
 * position, reading each block once per epoch; the saved position
 * resumes either; a block size other than the saved one is refused. */
START_TEST(test_streamed_iterator_matches_in_memory_and_resumes)
{
    const char *p = tu_path("s.h5");
    keel_dataset *mem, *str, *whole;
    keel_data_iter *a, *b, *c;
    keel_data_iter_config ic;
    keel_batch ba, bb;
    unsigned char state[KEEL_DATA_ITER_STATE_BYTES];
    size_t len;
    int seen[203] = { 0 }, sorted = 1;
    write_tab(p, 203, 3, H5T_IEEE_F32LE, 203, H5T_STD_I32LE, -1, 0, -1);
    ck_assert_int_eq(open_tab(p, 0, 16, 5, &mem), KEEL_OK);
    ck_assert_int_eq(open_tab(p, 1, 16, 5, &str), KEEL_OK);
    ck_assert_int_eq(open_tab(p, 0, 0, 5, &whole), KEEL_OK);
    keel_data_iter_config_init(&ic);
    ic.global_batch_size = 10;
    ic.seed = 77;
    ck_assert_int_eq(keel_data_iter_new(mem, &ic, &a), KEEL_OK);
    ck_assert_int_eq(keel_data_iter_new(str, &ic, &b), KEEL_OK);
    for (int step = 0; step < 60; step++) {         /* 20 a epoch */
        ck_assert_int_eq(keel_data_iter_next(a, &ba), KEEL_OK);
        ck_assert_int_eq(keel_data_iter_next(b, &bb), KEEL_OK);
        ck_assert_uint_eq(ba.n, bb.n);
        ck_assert(memcmp(ba.x, bb.x, ba.n * 3 * sizeof(float)) == 0);
        ck_assert(memcmp(ba.y, bb.y, ba.n * sizeof(int32_t)) == 0);
        for (size_t i = 0; step < 20 && i < ba.n; i++) {
            int row = (int)lrintf(ba.x[i * 3]);
            seen[row]++;
            if (i > 0 && row < (int)lrintf(ba.x[(i - 1) * 3]))
                sorted = 0;
        }
    }
    /* 13 blocks (the last of 11 rows), 200 rows used an epoch: each
     * block read once per epoch */
    ck_assert_uint_le(keel_dataset_blocks_read(str), 3 * 13);
    ck_assert(!sorted);
    for (int i = 0, used = 0; i < 203; i++) {
        ck_assert_int_le(seen[i], 1);
        used += seen[i];
        if (i == 202)
            ck_assert_int_eq(used, 200);
    }
    /* the in-memory position resumes the streamed set */
    ck_assert_int_eq(keel_data_iter_state(a, state, sizeof state, &len),
                     KEEL_OK);
    keel_data_iter_free(b);
    ck_assert_int_eq(keel_data_iter_new(str, &ic, &b), KEEL_OK);
    ck_assert_int_eq(keel_data_iter_set_state(b, state, len), KEEL_OK);
    for (int step = 0; step < 25; step++) {
        ck_assert_int_eq(keel_data_iter_next(a, &ba), KEEL_OK);
        ck_assert_int_eq(keel_data_iter_next(b, &bb), KEEL_OK);
        ck_assert(memcmp(ba.x, bb.x, ba.n * 3 * sizeof(float)) == 0);
    }
    /* a whole-set shuffle does not take a block-shuffled position */
    ck_assert_int_eq(keel_data_iter_new(whole, &ic, &c), KEEL_OK);
    ck_assert_int_eq(keel_data_iter_set_state(c, state, len), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "blocks of 16 rows"));
    keel_data_iter_free(c);
    keel_data_iter_free(a);
    keel_data_iter_free(b);
    keel_dataset_free(mem);
    keel_dataset_free(str);
    keel_dataset_free(whole);
}
END_TEST

/* A block at least the set's size is the whole-set shuffle, whose bits
 * are those of the IDX reader's (unchanged by blocks). */
START_TEST(test_block_as_large_as_the_set_is_the_whole_set_order)
{
    const char *p = tu_path("w.h5");
    keel_dataset *big, *whole;
    keel_data_iter *a, *b;
    keel_data_iter_config ic;
    keel_batch ba, bb;
    unsigned char sa[KEEL_DATA_ITER_STATE_BYTES], sb[sizeof sa];
    write_tab(p, 40, 2, H5T_IEEE_F32LE, 40, H5T_STD_I32LE, -1, 0, -1);
    ck_assert_int_eq(open_tab(p, 1, 40, 5, &big), KEEL_OK);
    ck_assert_int_eq(open_tab(p, 0, 0, 5, &whole), KEEL_OK);
    keel_data_iter_config_init(&ic);
    ic.global_batch_size = 8;
    ic.seed = 3;
    ck_assert_int_eq(keel_data_iter_new(big, &ic, &a), KEEL_OK);
    ck_assert_int_eq(keel_data_iter_new(whole, &ic, &b), KEEL_OK);
    for (int step = 0; step < 12; step++) {
        ck_assert_int_eq(keel_data_iter_next(a, &ba), KEEL_OK);
        ck_assert_int_eq(keel_data_iter_next(b, &bb), KEEL_OK);
        ck_assert(memcmp(ba.x, bb.x, ba.n * 2 * sizeof(float)) == 0);
    }
    ck_assert_int_eq(keel_data_iter_state(a, sa, sizeof sa, NULL),
                     KEEL_OK);
    ck_assert_int_eq(keel_data_iter_state(b, sb, sizeof sb, NULL),
                     KEEL_OK);
    ck_assert(memcmp(sa, sb, sizeof sa) == 0);
    ck_assert_int_eq(sa[4], 1);          /* version 1, as before blocks */
    keel_data_iter_free(a);
    keel_data_iter_free(b);
    keel_dataset_free(big);
    keel_dataset_free(whole);
}
END_TEST

/* ---- iterator ----------------------------------------------------------- */

/* A dataset of n examples whose pixel 0 encodes the index. */
static keel_dataset *
index_dataset(size_t n)
{
    keel_dataset *ds;
    uint8_t *ibuf = calloc(16 + n, 1), lbuf[8 + 256];
    ck_assert(n <= 256);
    tu_idx_images_header(ibuf, (uint32_t)n, 1, 1);
    memset(lbuf, 0, sizeof lbuf);
    tu_idx_labels_header(lbuf, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        ibuf[16 + i] = (uint8_t)i;
        lbuf[8 + i] = (uint8_t)(i % 2);
    }
    tu_write_file(tu_path("ix"), ibuf, 16 + n);
    tu_write_file(tu_path("lx"), lbuf, 8 + n);
    free(ibuf);
    ck_assert_int_eq(keel_dataset_open_idx(tu_path("ix"), tu_path("lx"), 2,
                                           &ds), KEEL_OK);
    return ds;
}

static int
ex_id(const keel_batch *b, size_t i)
{
    return (int)lrintf(b->x[i] * 255.0f);
}

/* Example ids of the next n_steps global batches for worker w of nw. */
static int
collect(const keel_dataset *ds, int64_t gb, int w, int nw, uint64_t seed,
        int n_steps, int *ids)
{
    keel_data_iter_config c;
    keel_data_iter *it;
    int k = 0;
    keel_data_iter_config_init(&c);
    c.global_batch_size = gb;
    c.worker_index = w;
    c.num_workers = nw;
    c.seed = seed;
    ck_assert_int_eq(keel_data_iter_new(ds, &c, &it), KEEL_OK);
    for (int s = 0; s < n_steps; s++) {
        keel_batch b;
        ck_assert_int_eq(keel_data_iter_next(it, &b), KEEL_OK);
        for (size_t i = 0; i < b.n; i++)
            ids[k++] = ex_id(&b, i);
    }
    keel_data_iter_free(it);
    return k;
}

START_TEST(test_iterator_shuffles_deterministically_per_epoch)
{
    keel_dataset *ds = index_dataset(100);
    int a[200], b[200], c[200], seen[100] = { 0 };
    ck_assert_int_eq(collect(ds, 10, 0, 1, 7, 20, a), 200);
    ck_assert_int_eq(collect(ds, 10, 0, 1, 7, 20, b), 200);
    ck_assert_int_eq(collect(ds, 10, 0, 1, 8, 20, c), 200);
    ck_assert_mem_eq(a, b, sizeof a);
    ck_assert(memcmp(a, c, sizeof a) != 0);
    ck_assert(memcmp(a, a + 100, 100 * sizeof *a) != 0);  /* new epoch order */
    for (int i = 0; i < 100; i++)
        seen[a[i]]++;
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(seen[i], 1);
    keel_dataset_free(ds);
}
END_TEST

START_TEST(test_worker_slices_union_to_the_global_batch)
{
    keel_dataset *ds = index_dataset(100);
    int global[100];
    collect(ds, 12, 0, 1, 3, 8, global);
    for (int nw = 2; nw <= 5; nw += 1) {
        int parts[5][100], n[5];
        for (int w = 0; w < nw; w++)
            n[w] = collect(ds, 12, w, nw, 3, 8, parts[w]);
        /* step s: concatenating the workers' slices gives global batch s */
        for (int s = 0; s < 8; s++) {
            int k = 0;
            for (int w = 0; w < nw; w++) {
                int lo = 12 * w / nw, hi = 12 * (w + 1) / nw, len = hi - lo;
                ck_assert_int_eq(n[w], 8 * len);
                for (int i = 0; i < len; i++)
                    ck_assert_int_eq(parts[w][s * len + i],
                                     global[s * 12 + k++]);
            }
            ck_assert_int_eq(k, 12);
        }
    }
    keel_dataset_free(ds);
}
END_TEST

START_TEST(test_iterator_state_resumes_with_the_next_example)
{
    keel_dataset *ds = index_dataset(50);
    keel_data_iter_config c;
    keel_data_iter *a, *b;
    uint8_t state[KEEL_DATA_ITER_STATE_BYTES];
    size_t len;
    keel_batch ba, bb;
    keel_data_iter_config_init(&c);
    c.global_batch_size = 8;
    c.seed = 11;
    ck_assert_int_eq(keel_data_iter_new(ds, &c, &a), KEEL_OK);
    for (int s = 0; s < 9; s++)     /* 6 steps per epoch: mid epoch 1 */
        ck_assert_int_eq(keel_data_iter_next(a, &ba), KEEL_OK);
    ck_assert_int_eq(keel_data_iter_epoch(a), 1);
    ck_assert_int_eq(keel_data_iter_offset(a), 24);
    ck_assert_int_eq(keel_data_iter_state(a, state, sizeof state, &len),
                     KEEL_OK);
    ck_assert_uint_eq(len, KEEL_DATA_ITER_STATE_BYTES);
    c.seed = 999;                   /* the state's seed wins */
    ck_assert_int_eq(keel_data_iter_new(ds, &c, &b), KEEL_OK);
    ck_assert_int_eq(keel_data_iter_set_state(b, state, len), KEEL_OK);
    for (int s = 0; s < 10; s++) {
        ck_assert_int_eq(keel_data_iter_next(a, &ba), KEEL_OK);
        ck_assert_int_eq(keel_data_iter_next(b, &bb), KEEL_OK);
        ck_assert_uint_eq(ba.n, bb.n);
        ck_assert_mem_eq(ba.x, bb.x, ba.n * sizeof(float));
    }
    state[0] ^= 1;
    ck_assert_int_eq(keel_data_iter_set_state(b, state, len), KEEL_ECORRUPT);
    state[0] ^= 1;
    ck_assert_int_eq(keel_data_iter_set_state(b, state, len - 1),
                     KEEL_ECORRUPT);
    state[32] ^= 1;                 /* dataset size differs */
    ck_assert_int_eq(keel_data_iter_set_state(b, state, len), KEEL_EINVAL);
    keel_data_iter_free(a);
    keel_data_iter_free(b);
    keel_dataset_free(ds);
}
END_TEST

START_TEST(test_iterator_epoch_limit_and_remainder)
{
    keel_dataset *ds = index_dataset(10);
    keel_data_iter_config c;
    keel_data_iter *it;
    keel_batch b;
    int steps = 0;
    size_t last = 0;
    keel_data_iter_config_init(&c);
    c.global_batch_size = 4;
    c.max_epochs = 2;
    c.drop_remainder = 0;
    ck_assert_int_eq(keel_data_iter_new(ds, &c, &it), KEEL_OK);
    ck_assert_int_eq(keel_data_iter_steps_per_epoch(it), 3);
    while (keel_data_iter_next(it, &b) == KEEL_OK) {
        steps++;
        last = b.n;
    }
    ck_assert_int_eq(steps, 6);
    ck_assert_uint_eq(last, 2);        /* the partial batch is kept */
    ck_assert_int_eq(keel_data_iter_next(it, &b), KEEL_EOUTOFRANGE);
    keel_data_iter_free(it);
    c.drop_remainder = 1;
    ck_assert_int_eq(keel_data_iter_new(ds, &c, &it), KEEL_OK);
    steps = 0;
    while (keel_data_iter_next(it, &b) == KEEL_OK)
        steps++;
    ck_assert_int_eq(steps, 4);
    keel_data_iter_free(it);
    c.global_batch_size = 11;
    ck_assert_int_eq(keel_data_iter_new(ds, &c, &it), KEEL_EINVAL);
    keel_dataset_free(ds);
}
END_TEST

#define FMNIST "/usr/share/datasets/fashion-mnist"

START_TEST(test_real_fashion_mnist_opens_if_installed)
{
    keel_dataset *ds;
    keel_data_iter_config c;
    keel_data_iter *it;
    keel_batch b;
    int hist[10] = { 0 };
    if (access(FMNIST "/t10k-images-idx3-ubyte.gz", R_OK) != 0) {
        fprintf(stderr, "SKIP test_real_fashion_mnist: %s not installed "
                "(apt-get install dataset-fashion-mnist)\n", FMNIST);
        return;
    }
    ck_assert_msg(keel_dataset_open_idx(FMNIST "/t10k-images-idx3-ubyte.gz",
                                        FMNIST "/t10k-labels-idx1-ubyte.gz",
                                        10, &ds) == KEEL_OK,
                  "%s", keel_last_error());
    ck_assert_uint_eq(keel_dataset_count(ds), 10000);
    ck_assert_uint_eq(keel_dataset_example_size(ds), 784);
    keel_data_iter_config_init(&c);
    c.global_batch_size = 1000;
    c.shuffle = 0;
    ck_assert_int_eq(keel_data_iter_new(ds, &c, &it), KEEL_OK);
    for (int s = 0; s < 10; s++) {
        ck_assert_int_eq(keel_data_iter_next(it, &b), KEEL_OK);
        for (size_t i = 0; i < b.n; i++)
            hist[b.y[i]]++;
    }
    for (int k = 0; k < 10; k++)         /* the test set is balanced */
        ck_assert_int_eq(hist[k], 1000);
    keel_data_iter_free(it);
    keel_dataset_free(ds);
}
END_TEST

START_TEST(test_blas_threads_and_corename)
{
    keel_train_set_threads(1);
    ck_assert_int_eq(keel_train_threads(), 1);
    ck_assert_ptr_nonnull(keel_train_blas_corename());
    ck_assert_int_gt((int)strlen(keel_train_blas_corename()), 0);
}
END_TEST

/* The reduction tree: covers by hand (a node splits at its middle, the
 * left half the smaller: over 8 leaves [0,4) [4,8); over 3 [0,1) [1,3);
 * over 6 [0,3) [3,6), then [0,1) [1,3); over 12 [0,6) [6,12), then
 * [0,3) [3,6) [6,9) [9,12), [3,6) into [3,4) [4,6), [6,9) into [6,7)
 * [7,9)), and sums whose order shows: leaves 1, 1e8, -1e8, 1 add along the
 * tree to (1 + 1e8) + (-1e8 + 1) = 1e8 - 1e8 = 0 in float (in leaf order:
 * 1). */
START_TEST(test_reduce_tree_covers_and_sums_in_tree_order)
{
    keel__tree_node n[16];
    float l[4][3] = { { 1.0f, 2.0f, 0.5f }, { 1e8f, 3.0f, 0.25f },
                      { -1e8f, 4.0f, 0.125f }, { 1.0f, 5.0f, 1.0f } };
    float s01[3], dst[3];
    const float *parts[4];
    ck_assert_int_eq(keel__tree_cover(8, 0, 8, n, 16), 1);
    ck_assert(n[0].lo == 0 && n[0].hi == 8);
    ck_assert_int_eq(keel__tree_cover(8, 3, 6, n, 16), 2);
    ck_assert(n[0].lo == 3 && n[0].hi == 4 && n[1].lo == 4 && n[1].hi == 6);
    ck_assert_int_eq(keel__tree_cover(8, 1, 8, n, 16), 3);
    ck_assert(n[0].lo == 1 && n[1].lo == 2 && n[1].hi == 4 &&
              n[2].lo == 4 && n[2].hi == 8);
    ck_assert_int_eq(keel__tree_cover(3, 1, 3, n, 16), 1);
    ck_assert(n[0].lo == 1 && n[0].hi == 3);
    ck_assert_int_eq(keel__tree_cover(3, 0, 2, n, 16), 2);
    ck_assert(n[0].lo == 0 && n[0].hi == 1 && n[1].lo == 1 && n[1].hi == 2);
    /* two replicas of 6 leaves (a CNN batch of 96): one node each */
    ck_assert_int_eq(keel__tree_cover(6, 0, 3, n, 16), 1);
    ck_assert(n[0].lo == 0 && n[0].hi == 3);
    ck_assert_int_eq(keel__tree_cover(6, 3, 6, n, 16), 1);
    ck_assert(n[0].lo == 3 && n[0].hi == 6);
    /* four replicas of 12 leaves: one node each; three: a few */
    ck_assert_int_eq(keel__tree_cover(12, 9, 12, n, 16), 1);
    ck_assert(n[0].lo == 9 && n[0].hi == 12);
    ck_assert_int_eq(keel__tree_cover(12, 4, 8, n, 16), 3);
    ck_assert(n[0].lo == 4 && n[0].hi == 6 && n[1].lo == 6 &&
              n[1].hi == 7 && n[2].lo == 7 && n[2].hi == 8);
    ck_assert_int_eq(keel__tree_cover(12, 0, 9, n, 16), 2);
    ck_assert(n[0].hi == 6 && n[1].lo == 6 && n[1].hi == 9);
    ck_assert_int_eq(keel__tree_cover(8, 1, 8, n, 2), -1);
    ck_assert_int_eq(keel__tree_cover(8, 5, 5, n, 16), -1);
    ck_assert_int_eq(keel__tree_cover(8, 0, 9, n, 16), -1);
    /* four leaves */
    for (int i = 0; i < 4; i++) {
        n[i].lo = i;
        n[i].hi = i + 1;
        parts[i] = l[i];
    }
    ck_assert_int_eq(keel__tree_sum(4, n, parts, 4, dst, 0, 3), KEEL_OK);
    ck_assert(dst[0] == 0.0f && dst[1] == 14.0f && dst[2] == 1.875f);
    /* the same from node [0, 2)'s sum and the leaves 2 and 3, into that
     * node's own buffer */
    for (int j = 0; j < 3; j++)
        s01[j] = l[0][j] + l[1][j];
    n[0].lo = 0;
    n[0].hi = 2;
    n[1].lo = 2;
    n[1].hi = 3;
    n[2].lo = 3;
    n[2].hi = 4;
    parts[0] = s01;
    parts[1] = l[2];
    parts[2] = l[3];
    ck_assert_int_eq(keel__tree_sum(4, n, parts, 3, s01, 0, 3), KEEL_OK);
    ck_assert(s01[0] == 0.0f && s01[1] == 14.0f && s01[2] == 1.875f);
    /* not a cover: a gap, or a range that is no node of the tree */
    n[1].lo = 3;
    ck_assert_int_eq(keel__tree_sum(4, n, parts, 3, dst, 0, 3), KEEL_EINVAL);
    n[0].hi = 3;
    n[1].lo = 3;
    n[1].hi = 4;
    ck_assert_int_eq(keel__tree_sum(4, n, parts, 2, dst, 0, 3), KEEL_EINVAL);
    n[0].hi = 4;
    ck_assert_int_eq(keel__tree_sum(4, n, parts, 1, dst, 0, 3), KEEL_OK);
    ck_assert(dst[0] == s01[0]);
}
END_TEST


/* ---- embeddings and gradient rows --------------------------------------- */

START_TEST(test_embedding_gathers_rows_and_sums_duplicates_in_order)
{
    keel_vars *vs;
    keel_grads *g;
    keel_embedding *e;
    keel_embedding_config cfg;
    const int64_t ids1[3] = { 4, 1, 4 }, ids2[2] = { 0, 4 };
    /* id 4 gets a, b, then c: (a + b) + c is 0 in float, a + (b + c) not */
    const float a = 1e8f, b = 1.0f, c = -1e8f;
    float d1[3 * 2] = { a, 1, 5, 6, b, 2 }, d2[2 * 2] = { 7, 8, c, 3 };
    float out[3 * 2];
    const int64_t *rid;
    const float *rrow;
    volatile float ab = a + b;
    keel_embedding_config_init(&cfg);
    cfg.name = "emb";
    cfg.vocab = 6;
    cfg.dim = 2;
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_embedding_new(&cfg, vs, &e), KEEL_OK);
    ck_assert_ptr_eq(keel_embedding_var(e), keel_vars_find(vs,
                                                          "emb/embeddings"));
    ck_assert_int_eq(keel_embedding_init_vars(e, 7), KEEL_OK);
    ck_assert_int_eq(keel_grads_new(vs, &g), KEEL_OK);
    ck_assert_int_eq(keel_embedding_lookup(e, 3, ids1, out), KEEL_OK);
    for (int k = 0; k < 3; k++)
        ck_assert_mem_eq(out + 2 * k, keel_var_tensor(keel_embedding_var(e))
                         ->data + 2 * ids1[k], 2 * sizeof(float));
    for (size_t j = 0; j < 12; j++) {
        float x = keel_var_tensor(keel_embedding_var(e))->data[j];
        ck_assert(x >= -0.05f && x < 0.05f);
    }
    ck_assert_int_eq(keel_embedding_backward(e, 3, ids1, d1, g), KEEL_OK);
    ck_assert_int_eq(keel_embedding_backward(e, 2, ids2, d2, g), KEEL_OK);
    ck_assert(keel_grads_has_rows(g));
    ck_assert_uint_eq(keel_grads_rows(g, 0, &rid, &rrow), 3);
    ck_assert(rid[0] == 0 && rid[1] == 1 && rid[2] == 4);
    ck_assert(rrow[0] == 7 && rrow[1] == 8);      /* id 0 */
    ck_assert(rrow[2] == 5 && rrow[3] == 6);      /* id 1 */
    ck_assert(rrow[4] == ab + c);                 /* (a + b) + c */
    ck_assert(rrow[4] == 0.0f);
    ck_assert(rrow[5] == 1 + 2 + 3);
    /* asked again: the same (already coalesced) */
    ck_assert_uint_eq(keel_grads_rows(g, 0, &rid, &rrow), 3);
    ck_assert(rrow[4] == 0.0f && rid[2] == 4);
    /* densify scatters the sums into the dense gradient and drops them */
    keel_grads_densify(g);
    ck_assert(!keel_grads_has_rows(g));
    ck_assert(keel_grads_at(g, 0)->data[8] == 0.0f);
    ck_assert(keel_grads_at(g, 0)->data[9] == 6.0f);
    ck_assert(keel_grads_at(g, 0)->data[2] == 5.0f);
    ck_assert(keel_grads_at(g, 0)->data[4] == 0.0f);
    keel_grads_zero(g);
    ck_assert_uint_eq(keel_grads_rows(g, 0, NULL, NULL), 0);
    keel_grads_free(g);
    keel_embedding_free(e);
    keel_vars_free(vs);
}
END_TEST

START_TEST(test_embedding_ids_out_of_range_are_refused_by_name)
{
    keel_vars *vs;
    keel_grads *g;
    keel_embedding *e;
    keel_embedding_config cfg;
    keel_optimizer_config oc;
    keel_optimizer *o;
    const int64_t bad[2] = { 1, 6 }, neg[1] = { -1 }, unsorted[2] = { 3, 2 };
    float rows[4] = { 0 }, out[4];
    keel_embedding_config_init(&cfg);
    cfg.name = "tbl";
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_embedding_new(&cfg, vs, &e), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "vocab"));
    cfg.vocab = 6;
    cfg.dim = 2;
    ck_assert_int_eq(keel_embedding_new(&cfg, vs, &e), KEEL_OK);
    ck_assert_int_eq(keel_grads_new(vs, &g), KEEL_OK);
    ck_assert_int_eq(keel_embedding_lookup(e, 2, bad, out), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "tbl/embeddings"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "id 6"));
    ck_assert_int_eq(keel_embedding_backward(e, 1, neg, rows, g),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_grads_add_rows(g, 0, 2, bad, rows), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "tbl/embeddings"));
    ck_assert_uint_eq(keel_grads_rows(g, 0, NULL, NULL), 0);  /* nothing */
    keel_optimizer_config_init(&oc, KEEL_OPT_SGD);
    ck_assert_int_eq(keel_optimizer_new(&oc, &o), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_apply_rows(o, keel_embedding_var(e), 2,
                                               unsorted, rows, 0),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "tbl/embeddings"));
    ck_assert_int_eq(keel_optimizer_apply_rows(o, keel_embedding_var(e), 2,
                                               bad, rows, 0), KEEL_EINVAL);
    keel_optimizer_free(o);
    keel_grads_free(g);
    keel_embedding_free(e);
    keel_vars_free(vs);
}
END_TEST

/* Two stores with the same [5,3] table "t" (and a dense "d"), slots
 * prepared for kind. */
static void
rows_store(keel_optimizer_kind kind, keel_vars **vs, keel_grads **g,
           keel_optimizer **o)
{
    int64_t shape[2] = { 5, 3 };
    keel_optimizer_config oc;
    keel_var *t, *d;
    ck_assert_int_eq(keel_vars_new(vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(*vs, "t", 2, shape, KEEL_VAR_TRAINABLE,
                                      &t), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(*vs, "d", 1, shape + 1,
                                      KEEL_VAR_TRAINABLE, &d), KEEL_OK);
    fill_uniform(keel_var_tensor(t)->data, 15, 3, -1, 1);
    fill_uniform(keel_var_tensor(d)->data, 3, 4, -1, 1);
    keel_optimizer_config_init(&oc, kind);
    oc.schedule.learning_rate = 0.1;
    ck_assert_int_eq(keel_optimizer_new(&oc, o), KEEL_OK);
    ck_assert_int_eq(keel_optimizer_prepare(*o, *vs), KEEL_OK);
    ck_assert_int_eq(keel_grads_new(*vs, g), KEEL_OK);
}

/* The table and its slots, concatenated, into buf (4 x 15 floats). */
static void
rows_snapshot(keel_vars *vs, float *buf)
{
    keel_var *t = keel_vars_find(vs, "t");
    memset(buf, 0, 4 * 15 * sizeof *buf);
    memcpy(buf, keel_var_tensor(t)->data, 15 * sizeof *buf);
    for (size_t i = 0; i < keel_var_slot_count(t) && i < 3; i++)
        memcpy(buf + 15 * (i + 1), keel_var_slot_at(t, i, NULL)->data,
               15 * sizeof *buf);
}

START_TEST(test_lazy_apply_touches_only_the_given_rows)
{
    keel_optimizer_kind kind = (keel_optimizer_kind)_i;
    const int64_t ids[3] = { 3, 1, 3 }, ids2[1] = { 1 };
    float rows[9], before[60], after[60], dense[60];
    float cas[60];
    keel_vars *vs, *vd, *vc;
    keel_grads *g, *gd, *gc;
    keel_optimizer *o, *od, *oc;
    fill_uniform(rows, 9, 9, -1, 1);
    rows_store(kind, &vs, &g, &o);
    rows_store(kind, &vd, &gd, &od);
    rows_store(kind, &vc, &gc, &oc);     /* Hogwild's CAS form */
    rows_snapshot(vs, before);
    /* the same step: rows in one store, scattered densely in the other */
    for (int step = 0; step < 2; step++) {
        const int64_t *id = step == 0 ? ids : ids2;
        size_t n = step == 0 ? 3 : 1;
        fill_uniform(keel_grads_find(g, "d")->data, 3, 10 + step, -1, 1);
        ck_assert_int_eq(keel_grads_add_rows(g, 0, n, id, rows), KEEL_OK);
        ck_assert_int_eq(keel_grads_add_rows(gd, 0, n, id, rows), KEEL_OK);
        ck_assert_int_eq(keel_grads_add_rows(gc, 0, n, id, rows), KEEL_OK);
        memcpy(keel_grads_find(gc, "d")->data, keel_grads_find(g, "d")->data,
               3 * sizeof(float));
        ck_assert_int_eq(keel__optimizer_apply_cas(oc, vc, gc, step),
                         KEEL_OK);
        ck_assert(!keel_grads_has_rows(gc));
        ck_assert(rows[0] != 0.0f);      /* the caller's rows stay */
        memcpy(keel_grads_find(gd, "d")->data, keel_grads_find(g, "d")->data,
               3 * sizeof(float));
        keel_grads_densify(gd);
        ck_assert_int_eq(keel_optimizer_apply_and_zero(o, vs, g, step),
                         KEEL_OK);
        ck_assert(!keel_grads_has_rows(g));
        ck_assert_int_eq(keel_optimizer_apply(od, vd, gd, step), KEEL_OK);
        keel_grads_zero(gd);
        rows_snapshot(vs, after);
        rows_snapshot(vd, dense);
        rows_snapshot(vc, cas);
        ck_assert_mem_eq(cas, after, sizeof cas);
        /* rows 0, 2, 4 and their slots: untouched, bit for bit */
        for (int s = 0; s < 4; s++)
            for (int r = 0; r < 5; r += 2)
                ck_assert_mem_eq(after + 15 * s + 3 * r,
                                 before + 15 * s + 3 * r, 3 * sizeof(float));
        /* the dense variable: as the dense update */
        ck_assert_mem_eq(keel_var_tensor(keel_vars_find(vs, "d"))->data,
                         keel_var_tensor(keel_vars_find(vd, "d"))->data,
                         3 * sizeof(float));
        /* row 1 (touched every step): the dense update's bits */
        for (int s = 0; s < 4; s++)
            ck_assert_mem_eq(after + 15 * s + 3, dense + 15 * s + 3,
                             3 * sizeof(float));
        if (step == 0 || kind == KEEL_OPT_SGD || kind == KEEL_OPT_ADAGRAD) {
            /* stateless in an untouched row: lazy is the dense update */
            ck_assert_mem_eq(after, dense, sizeof after);
        } else {
            /* row 3, untouched at step 1: the lazy update leaves it (and
             * its slots) as step 0 did; the dense one moves it by its
             * momentum */
            int differs = 0;
            for (int s = 0; s < 4; s++)
                differs |= memcmp(after + 15 * s + 9, dense + 15 * s + 9,
                                  3 * sizeof(float)) != 0;
            ck_assert(differs);
        }
        if (step == 0)
            rows_snapshot(vs, before);   /* step 1 must keep rows 0,2,3,4 */
        else
            for (int s = 0; s < 4; s++)
                ck_assert_mem_eq(after + 15 * s + 9, before + 15 * s + 9,
                                 3 * sizeof(float));
    }
    keel_optimizer_free(o);
    keel_optimizer_free(od);
    keel_optimizer_free(oc);
    keel_grads_free(g);
    keel_grads_free(gd);
    keel_grads_free(gc);
    keel_vars_free(vs);
    keel_vars_free(vd);
    keel_vars_free(vc);
}
END_TEST

static Suite *
train_suite(void)
{
    Suite *s = suite_create("train");
    TCase *kf, *tc;
    tu_tcase(s, "layers", 0, NULL, NULL, TU_TESTS(
        test_dense_gradients_match_finite_differences,
        test_conv2d_valid_gradients_match_finite_differences,
        test_conv2d_same_strided_gradients_match_finite_differences,
        test_conv2d_chunked_im2col_gradients_match_finite_differences,
        test_conv2d_direct_paths_gradients_match_finite_differences,
        test_conv2d_direct_paths_give_identical_bits,
        test_maxpool_gradients_match_finite_differences,
        test_relu_and_tanh_gradients_match_finite_differences,
        test_softmax_xent_gradients_match_finite_differences));
    tu_tcase(s, "models", 20, NULL, NULL, TU_TESTS(
        test_mlp_model_gradients_match_finite_differences,
        test_cnn_model_gradients_match_finite_differences,
        test_cnn_variables_have_keras_names_and_shapes,
        test_init_is_deterministic_and_glorot_bounded,
        test_microbatch_gradients_are_bitwise_reproducible,
        test_model_threads_give_identical_bits,
        test_model_threads_eval_matches_and_small_batches_work,
        test_direct_dense_gradients_equal_separate_then_added,
        test_tiny_mlp_learns_separable_problem,
        test_model_rejects_bad_batches_and_configs,
        test_hogwild_cas_loses_no_update_and_reports_a_failing_thread,
        test_hogwild_two_threads_train_as_well_as_one,
        test_blas_threads_and_corename,
        test_reduce_tree_covers_and_sums_in_tree_order));
    // 72,000-element fused updates x 5
    tu_tcase(s, "optim", 20, NULL, NULL, TU_TESTS(
        test_names_parse_and_errors_list_choices,
        test_lr_schedules_follow_their_formulas,
        test_optimizer_updates_match_hand_computed_values,
        test_optimizer_prepare_is_idempotent_and_apply_needs_slots,
        test_adam_continues_bitwise_after_restore,
        test_apply_and_zero_equals_apply_then_zero,
        test_optimizer_flushes_subnormals_and_keeps_callers_mode));
    tc = tu_tcase(s, "rows", 20, NULL, NULL, TU_TESTS(
        test_embedding_gathers_rows_and_sums_duplicates_in_order,
        test_embedding_ids_out_of_range_are_refused_by_name));
    /* every optimizer kind */
    tcase_add_loop_test(tc, test_lazy_apply_touches_only_the_given_rows, 0,
                        KEEL_OPT_RMSPROP + 1);
    kf = tu_tcase(s, "kfac", 60, tu_setup, tu_teardown, TU_TESTS(
        test_kfac_matches_numpy_reference,
        test_kfac_factored_update_matches_numpy_reference,
        test_kfac_rejects_bad_configs_and_unobserved_steps,
        test_kfac_updates_factors_every_cov_update_every_steps,
        test_kfac_apply_update_uses_the_stores_inverses_only,
        test_kfac_user_layers_factors_and_update,
        test_kfac_user_layers_refuse_bad_registrations));
    /* 0: from the gradients; 1: model_grads */
    tcase_add_loop_test(kf, test_kfac_continues_bitwise_after_restore, 0,
                        2);
    tu_tcase(s, "data", 20, tu_setup, tu_teardown, TU_TESTS(
        test_idx_reader_reads_plain_and_gzip,
        test_idx_reader_rejects_corrupt_files,
        test_h5_reader_reads_uint8_and_float,
        test_h5_reader_rejects_corrupt_files,
        test_h5_tabular_rows_in_memory_and_streamed,
        test_h5_tabular_errors_name_file_dataset_and_row,
        test_streamed_iterator_matches_in_memory_and_resumes,
        test_block_as_large_as_the_set_is_the_whole_set_order,
        test_zeroed_config_structs_are_refused_by_name,
        test_iterator_shuffles_deterministically_per_epoch,
        test_worker_slices_union_to_the_global_batch,
        test_iterator_state_resumes_with_the_next_example,
        test_iterator_epoch_limit_and_remainder,
        test_real_fashion_mnist_opens_if_installed));
    return s;
}

KEEL_TEST_MAIN(train_suite)
