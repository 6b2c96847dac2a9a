/* export_desc.c - a program's own model on keel's public API only, as a
 * user writes it: variables of its own, a layer description built with
 * keel_model_desc_* and stored in its checkpoint's /meta architecture, for
 * tests/it_export_any.py to export to keras-h5 and onnx.
 *
 *   export_desc DIR mlp|cnn   write DIR/model.ckpt-7.h5; print the
 *                             description and the builder's refusals
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <keel/keel.h>
#include <keel/export.h>

static uint32_t rng = 2463534242u;

static float
next_value(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return (float)(rng >> 8) / (1 << 24) - 0.5f;
}

/* A variable of the given shape filled with values in [-0.5, 0.5). */
static keel_status
var(keel_vars *vs, const char *name, int ndim, int64_t a, int64_t b,
    int64_t c, int64_t d)
{
    int64_t shape[4] = { a, b, c, d };
    keel_var *v;
    keel_status st = keel_vars_create(vs, name, ndim, shape,
                                      KEEL_VAR_TRAINABLE, &v);
    if (st != KEEL_OK)
        return st;
    keel_tensor *t = keel_var_tensor(v);
    for (size_t i = 0; i < t->count; i++)
        t->data[i] = next_value();
    return KEEL_OK;
}

/* A call that must fail: print what keel said. */
static int
refused(keel_status st, const char *what)
{
    if (st == KEEL_OK) {
        fprintf(stderr, "export_desc: %s was accepted\n", what);
        return 0;
    }
    printf("refused %s: %s %s\n", what, keel_status_name(st),
           keel_last_error());
    return 1;
}

static keel_status
describe_mlp(keel_vars *vs, keel_model_desc **d, int *ok)
{
    static const int64_t in[1] = { 6 };
    keel_status st = var(vs, "hidden/kernel", 2, 6, 5, 1, 1);
    if (st == KEEL_OK)
        st = var(vs, "hidden/bias", 1, 5, 1, 1, 1);
    if (st == KEEL_OK)
        st = var(vs, "out/w", 2, 5, 3, 1, 1);
    if (st == KEEL_OK)
        st = var(vs, "out/b", 1, 3, 1, 1, 1);
    if (st == KEEL_OK)
        st = keel_model_desc_new(vs, 1, in, d);
    if (st == KEEL_OK)
        st = keel_model_desc_add_dense(*d, "hidden", "hidden/kernel",
                                       "hidden/bias", "tanh");
    /* out/w is [5, 3]: a kernel for 4 inputs does not fit */
    if (st == KEEL_OK)
        *ok &= refused(keel_model_desc_add_dense(*d, NULL, "out/b", "out/w",
                                                 NULL), "a transposed dense");
    if (st == KEEL_OK)
        *ok &= refused(keel_model_desc_add_dense(*d, NULL, "hidden/kernel",
                                                 "out/b", NULL),
                       "a variable used twice");
    if (st == KEEL_OK)
        st = keel_model_desc_add_dense(*d, NULL, "out/w", "out/b",
                                       "softmax");
    return st;
}

static keel_status
describe_cnn(keel_vars *vs, keel_model_desc **d, int *ok)
{
    static const int64_t in[3] = { 9, 8, 2 };
    keel_status st = var(vs, "conv/kernel", 4, 3, 3, 2, 4);
    if (st == KEEL_OK)
        st = var(vs, "conv/bias", 1, 4, 1, 1, 1);
    /* 9x8 -> conv 3x3 -> 7x6x4 -> pool 2x2 -> 3x3x4 -> 36 */
    if (st == KEEL_OK)
        st = var(vs, "fc/kernel", 2, 36, 3, 1, 1);
    if (st == KEEL_OK)
        st = var(vs, "fc/bias", 1, 3, 1, 1, 1);
    /* state of the program's own, in the checkpoint, in no layer */
    if (st == KEEL_OK)
        st = var(vs, "extra/ema", 1, 2, 1, 1, 1);
    if (st == KEEL_OK)
        st = keel_model_desc_new(vs, 3, in, d);
    if (st == KEEL_OK)
        *ok &= refused(keel_model_desc_add_dense(*d, NULL, "fc/kernel",
                                                 "fc/bias", NULL),
                       "a dense on an image");
    if (st == KEEL_OK)
        st = keel_model_desc_add_conv2d(*d, NULL, "conv/kernel",
                                        "conv/bias", 1, 1, "relu");
    if (st == KEEL_OK)
        st = keel_model_desc_add_max_pooling2d(*d, NULL, 2, 2, 0, 0);
    if (st == KEEL_OK) {
        const char *json;
        *ok &= refused(keel_model_desc_json(*d, &json),
                       "a description ending in an image");
    }
    if (st == KEEL_OK)
        st = keel_model_desc_add_flatten(*d, NULL);
    if (st == KEEL_OK)
        st = keel_model_desc_add_dense(*d, NULL, "fc/kernel", "fc/bias",
                                       NULL);
    return st;
}

int
main(int argc, char **argv)
{
    keel_vars *vs = NULL;
    keel_model_desc *d = NULL;
    keel_saver *sv = NULL;
    keel_saver_config scfg;
    keel_ckpt_meta meta;
    const char *json = NULL;
    char path[4096];
    keel_status st;
    int ok = 1;

    if (argc != 3 || (strcmp(argv[2], "mlp") && strcmp(argv[2], "cnn"))) {
        fprintf(stderr, "usage: export_desc DIR mlp|cnn\n");
        return 2;
    }
    st = keel_vars_new(&vs);
    if (st == KEEL_OK)
        st = strcmp(argv[2], "mlp") == 0 ? describe_mlp(vs, &d, &ok)
                                         : describe_cnn(vs, &d, &ok);
    if (st == KEEL_OK)
        st = keel_model_desc_json(d, &json);
    keel_saver_config_init(&scfg);
    scfg.dir = argv[1];
    if (st == KEEL_OK)
        st = keel_saver_new(&scfg, &sv);
    keel_ckpt_meta_init(&meta);
    meta.architecture = json;       /* what keel export reads */
    keel_vars_set_global_step(vs, 7);
    if (st == KEEL_OK)
        st = keel_saver_save(sv, vs, &meta, path, sizeof path);
    if (st == KEEL_OK)
        printf("description %s\nsaved %s\n", json, path);
    else
        fprintf(stderr, "export_desc: %s\n", keel_last_error());
    keel_saver_free(sv);
    keel_model_desc_free(d);
    keel_vars_free(vs);
    return st == KEEL_OK && ok ? 0 : 1;
}
