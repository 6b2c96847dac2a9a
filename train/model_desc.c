/* model_desc.c - a model's architecture record (docs/checkpoint-format.md):
 * a JSON object with the model's config and a Keras-like layer list, and
 * back from it into a model config, checked. */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include <json-c/json.h>

#include <keel/train.h>
#include "util.h"
#include "model_int.h"

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
    json_set_str(o, "model", keel__model_kind_names[c->kind]);
    json_object_object_add(o, "input_shape", json_ints(shape, 3));
    json_set_int(o, "classes", c->classes);
    json_object_object_add(o, "hidden",
                           json_ints(c->hidden, c->kind == KEEL_MODEL_MLP
                                                    ? c->n_hidden : 0));
    json_set_str(o, "activation", keel__activation_names[c->activation]);
    json_set_str(o, "init", keel__init_kind_names[c->init]);
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
    if ((st = arch_name(o, "model", keel__model_kind_names, 3, &k)) != KEEL_OK)
        return st;
    mc->kind = (keel_model_kind)k;
    if ((st = arch_name(o, "activation", keel__activation_names, 3, &k))
        != KEEL_OK)
        return st;
    mc->activation = (keel_activation)k;
    if ((st = arch_name(o, "init", keel__init_kind_names, 2, &k)) != KEEL_OK)
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
    return keel__model_check_config(mc);
}
