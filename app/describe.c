/* describe.c - layer descriptions (docs/export.md): the JSON layer list
 * keel train stores in a checkpoint's /meta architecture attribute, and
 * the same list built by a program for its own model (keel_model_desc_*,
 * keel/export.h). keel__desc_check reads one from a file or a builder and
 * checks it against the variables it names: every length, name and shape
 * is bounded and compared before an exporter walks it. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include <keel/tensor.h>
#include <keel/export.h>
#include "util.h"
#include "app_int.h"

#define MAX_LAYERS 256          /* layers in one description */
#define MAX_DIM (1 << 24)       /* an input or window dimension */
#define LAYER_NAME_MAX 64       /* bytes of a layer name, with its NUL */

static const char *const activations[] = { "linear", "relu", "tanh",
                                           "sigmoid", "softmax" };
static const char *const classes[] = { "Dense", "Conv2D", "MaxPooling2D",
                                       "Flatten" };
/* tf.keras's default layer names, by class */
static const char *const default_names[] = { "dense", "conv2d",
                                             "max_pooling2d", "flatten" };

/* The shape of the tensor between two layers, without the batch axis. */
typedef struct dshape {
    int rank;                   /* 1 or 3 */
    int64_t d[3];
} dshape;

static const char *
shape_text(const dshape *s, char *buf, size_t size)
{
    return keel_shape_format(buf, size, s->rank, s->d);
}

static int
layer_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= LAYER_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

static const char *
get_str(struct json_object *o, const char *key)
{
    struct json_object *v;
    if (!json_object_object_get_ex(o, key, &v) ||
        !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

/* o[key] as a pair of integers in [1, MAX_DIM] into p; absent: def (NULL:
 * required). The pair is written back, so readers find it. */
static keel_status
get_pair(struct json_object *o, const char *lname, const char *key,
         const int64_t *def, int64_t p[2])
{
    struct json_object *v, *a;
    if (!json_object_object_get_ex(o, key, &v)) {
        if (def == NULL)
            return keel__fail(KEEL_ECORRUPT, "layer %s: '%s' is missing",
                              lname, key);
        p[0] = def[0];
        p[1] = def[1];
    } else {
        if (!json_object_is_type(v, json_type_array) ||
            json_object_array_length(v) != 2)
            return keel__fail(KEEL_ECORRUPT, "layer %s: '%s' is not a "
                              "pair of integers", lname, key);
        for (size_t i = 0; i < 2; i++) {
            struct json_object *e = json_object_array_get_idx(v, i);
            if (!json_object_is_type(e, json_type_int) ||
                json_object_get_int64(e) < 1 ||
                json_object_get_int64(e) > MAX_DIM)
                return keel__fail(KEEL_ECORRUPT, "layer %s: '%s'[%zu] is "
                                  "not an integer in [1, %d]", lname, key, i,
                                  MAX_DIM);
            p[i] = json_object_get_int64(e);
        }
    }
    a = json_object_new_array();
    if (a == NULL)
        return keel__fail(KEEL_ENOMEM, "layer %s", lname);
    json_object_array_add(a, json_object_new_int64(p[0]));
    json_object_array_add(a, json_object_new_int64(p[1]));
    json_object_object_add(o, key, a);
    return KEEL_OK;
}

/* o[key], when present, equals want; absent, it is set to want. */
static keel_status
check_int(struct json_object *o, const char *lname, const char *key,
          int64_t want)
{
    struct json_object *v;
    if (json_object_object_get_ex(o, key, &v)) {
        if (!json_object_is_type(v, json_type_int) ||
            json_object_get_int64(v) != want)
            return keel__fail(KEEL_ECORRUPT, "layer %s: '%s' is not %lld, "
                              "what its kernel's shape says", lname, key,
                              (long long)want);
        return KEEL_OK;
    }
    json_object_object_add(o, key, json_object_new_int64(want));
    return KEEL_OK;
}

static keel_status
check_padding(struct json_object *o, const char *lname)
{
    const char *p = get_str(o, "padding");
    struct json_object *v;
    if (json_object_object_get_ex(o, "padding", &v) &&
        (p == NULL || strcmp(p, "valid") != 0))
        return keel__fail(KEEL_ECORRUPT, "layer %s: padding '%s': only "
                          "\"valid\" is supported", lname,
                          p != NULL ? p : "?");
    json_object_object_add(o, "padding", json_object_new_string("valid"));
    return KEEL_OK;
}

/* Layer L's kernel and bias: two variable names in vs, used by no earlier
 * layer (used: the variables so far, n_used of them). */
static keel_status
layer_weights(struct json_object *L, const char *lname, keel_vars *vs,
              keel_var **used, size_t n_used, keel_var *w[2])
{
    struct json_object *ws;
    if (!json_object_object_get_ex(L, "weights", &ws) ||
        !json_object_is_type(ws, json_type_array) ||
        json_object_array_length(ws) != 2)
        return keel__fail(KEEL_ECORRUPT, "layer %s: 'weights' is not "
                          "[kernel, bias] (two variable names)", lname);
    for (size_t k = 0; k < 2; k++) {
        struct json_object *e = json_object_array_get_idx(ws, k);
        const char *vn = json_object_is_type(e, json_type_string)
                             ? json_object_get_string(e) : NULL;
        if (vn == NULL || (w[k] = keel_vars_find(vs, vn)) == NULL)
            return keel__fail(KEEL_ECORRUPT, "layer %s: %s '%s' is not a "
                              "variable of the model", lname,
                              k == 0 ? "kernel" : "bias",
                              vn != NULL ? vn : "?");
        for (size_t u = 0; u < n_used; u++)
            if (used[u] == w[k])
                return keel__fail(KEEL_ECORRUPT, "layer %s: variable %s "
                                  "belongs to an earlier layer", lname, vn);
    }
    if (w[0] == w[1])
        return keel__fail(KEEL_ECORRUPT, "layer %s: kernel and bias are the "
                          "same variable", lname);
    return KEEL_OK;
}

static keel_status
bad_shape(const char *lname, const char *what, keel_var *v,
          const char *want)
{
    char got[96];
    keel_tensor *t = keel_var_tensor(v);
    keel_shape_format(got, sizeof got, t->ndim, t->shape);
    return keel__fail(KEEL_ECORRUPT, "layer %s: %s %s has shape %s, want %s",
                      lname, what, keel_var_name(v), got, want);
}

static keel_status
check_dense(struct json_object *L, const char *lname, keel_var *w[2],
            dshape *s)
{
    keel_tensor *k = keel_var_tensor(w[0]), *b = keel_var_tensor(w[1]);
    char want[96], in[96];
    if (s->rank != 1)
        return keel__fail(KEEL_ECORRUPT, "layer %s (Dense) takes a vector; "
                          "its input is %s: put a Flatten before it", lname,
                          shape_text(s, in, sizeof in));
    if (k->ndim != 2 || k->shape[0] != s->d[0]) {
        snprintf(want, sizeof want, "[%lld, units]", (long long)s->d[0]);
        return bad_shape(lname, "kernel", w[0], want);
    }
    if (b->ndim != 1 || b->shape[0] != k->shape[1]) {
        snprintf(want, sizeof want, "[%lld]", (long long)k->shape[1]);
        return bad_shape(lname, "bias", w[1], want);
    }
    s->d[0] = k->shape[1];
    return check_int(L, lname, "units", k->shape[1]);
}

static keel_status
check_conv(struct json_object *L, const char *lname, keel_var *w[2],
           dshape *s)
{
    static const int64_t one[2] = { 1, 1 };
    keel_tensor *k = keel_var_tensor(w[0]), *b = keel_var_tensor(w[1]);
    int64_t ks[2], st[2];
    char want[96], in[96];
    keel_status rc;
    if (s->rank != 3)
        return keel__fail(KEEL_ECORRUPT, "layer %s (Conv2D) takes an image "
                          "[height, width, channels]; its input is %s",
                          lname, shape_text(s, in, sizeof in));
    if (k->ndim != 4 || k->shape[2] != s->d[2]) {
        snprintf(want, sizeof want, "[kh, kw, %lld, filters]",
                 (long long)s->d[2]);
        return bad_shape(lname, "kernel", w[0], want);
    }
    if (b->ndim != 1 || b->shape[0] != k->shape[3]) {
        snprintf(want, sizeof want, "[%lld]", (long long)k->shape[3]);
        return bad_shape(lname, "bias", w[1], want);
    }
    ks[0] = k->shape[0];
    ks[1] = k->shape[1];
    if ((rc = get_pair(L, lname, "kernel_size", ks, st)) != KEEL_OK)
        return rc;
    if (st[0] != ks[0] || st[1] != ks[1])
        return keel__fail(KEEL_ECORRUPT, "layer %s: kernel_size is not "
                          "[%lld, %lld], what its kernel's shape says",
                          lname, (long long)ks[0], (long long)ks[1]);
    if ((rc = get_pair(L, lname, "strides", one, st)) != KEEL_OK ||
        (rc = check_padding(L, lname)) != KEEL_OK ||
        (rc = check_int(L, lname, "filters", k->shape[3])) != KEEL_OK)
        return rc;
    if (s->d[0] < ks[0] || s->d[1] < ks[1])
        return keel__fail(KEEL_ECORRUPT, "layer %s: a %lldx%lld kernel "
                          "does not fit its input %s", lname,
                          (long long)ks[0], (long long)ks[1],
                          shape_text(s, in, sizeof in));
    s->d[0] = (s->d[0] - ks[0]) / st[0] + 1;
    s->d[1] = (s->d[1] - ks[1]) / st[1] + 1;
    s->d[2] = k->shape[3];
    return KEEL_OK;
}

static keel_status
check_pool(struct json_object *L, const char *lname, dshape *s)
{
    static const int64_t two[2] = { 2, 2 };
    int64_t ps[2], st[2];
    char in[96];
    keel_status rc;
    if (s->rank != 3)
        return keel__fail(KEEL_ECORRUPT, "layer %s (MaxPooling2D) takes an "
                          "image [height, width, channels]; its input is %s",
                          lname, shape_text(s, in, sizeof in));
    if ((rc = get_pair(L, lname, "pool_size", two, ps)) != KEEL_OK ||
        (rc = get_pair(L, lname, "strides", ps, st)) != KEEL_OK ||
        (rc = check_padding(L, lname)) != KEEL_OK)
        return rc;
    if (s->d[0] < ps[0] || s->d[1] < ps[1])
        return keel__fail(KEEL_ECORRUPT, "layer %s: a %lldx%lld window does "
                          "not fit its input %s", lname, (long long)ps[0],
                          (long long)ps[1], shape_text(s, in, sizeof in));
    s->d[0] = (s->d[0] - ps[0]) / st[0] + 1;
    s->d[1] = (s->d[1] - ps[1]) / st[1] + 1;
    return KEEL_OK;
}

/* One layer: its name (unique among the first i), class, activation and
 * variables, and the shape it gives; *n_used grows by its variables. */
static keel_status
check_layer(struct json_object *layers, size_t i, keel_vars *vs,
            keel_var **used, size_t *n_used, dshape *s)
{
    struct json_object *L = json_object_array_get_idx(layers, i);
    const char *lname, *cls, *act;
    struct json_object *v;
    int kind = -1, a = 0;
    keel_var *w[2] = { NULL, NULL };
    keel_status rc;
    char out[96];

    if (!json_object_is_type(L, json_type_object))
        return keel__fail(KEEL_ECORRUPT, "layers[%zu] is not an object", i);
    lname = get_str(L, "name");
    if (lname == NULL || !layer_name_ok(lname))
        return keel__fail(KEEL_ECORRUPT, "layers[%zu]: 'name' is missing or "
                          "not 1-%d characters of [A-Za-z0-9_.-]", i,
                          LAYER_NAME_MAX - 1);
    for (size_t j = 0; j < i; j++)
        if (strcmp(get_str(json_object_array_get_idx(layers, j), "name"),
                   lname) == 0)
            return keel__fail(KEEL_ECORRUPT, "layers[%zu]: the name %s is "
                              "taken by layers[%zu]", i, lname, j);
    cls = get_str(L, "class_name");
    for (int k = 0; cls != NULL && k < 4; k++)
        if (strcmp(cls, classes[k]) == 0)
            kind = k;
    if (kind < 0)
        return keel__fail(KEEL_ECORRUPT, "layer %s: class_name '%s' (Dense, "
                          "Conv2D, MaxPooling2D or Flatten)", lname,
                          cls != NULL ? cls : "?");
    act = "linear";
    if (json_object_object_get_ex(L, "activation", &v) &&
        (act = get_str(L, "activation")) == NULL)
        act = "?";
    while (a < 5 && strcmp(act, activations[a]) != 0)
        a++;
    if (a == 5 || (a != 0 && kind >= 2))
        return keel__fail(KEEL_ECORRUPT, "layer %s: activation '%s' (%s)",
                          lname, act, kind >= 2 ? "none for a layer without "
                          "weights" : "linear, relu, tanh, sigmoid or "
                          "softmax");
    if (kind < 2) {
        rc = layer_weights(L, lname, vs, used, *n_used, w);
        if (rc != KEEL_OK)
            return rc;
        json_object_object_add(L, "activation",
                               json_object_new_string(activations[a]));
    }
    rc = kind == 0 ? check_dense(L, lname, w, s)
       : kind == 1 ? check_conv(L, lname, w, s)
       : kind == 2 ? check_pool(L, lname, s) : KEEL_OK;
    if (rc != KEEL_OK)
        return rc;
    if (kind == 3 && s->rank == 3) {
        s->d[0] *= s->d[1] * s->d[2];
        s->rank = 1;
    }
    if (a == 4 && s->rank != 1)
        return keel__fail(KEEL_ECORRUPT, "layer %s: softmax over an output "
                          "%s: only a vector's", lname,
                          shape_text(s, out, sizeof out));
    if (w[0] != NULL) {
        used[(*n_used)++] = w[0];
        used[(*n_used)++] = w[1];
    }
    return KEEL_OK;
}

static keel_status
check_input(struct json_object *arch, dshape *s)
{
    struct json_object *a;
    size_t n;
    if (!json_object_object_get_ex(arch, "input_shape", &a) ||
        !json_object_is_type(a, json_type_array) ||
        ((n = json_object_array_length(a)) != 1 && n != 3))
        return keel__fail(KEEL_ECORRUPT, "'input_shape' is not [features] "
                          "or [height, width, channels]");
    s->rank = (int)n;
    for (size_t i = 0; i < n; i++) {
        struct json_object *v = json_object_array_get_idx(a, i);
        if (!json_object_is_type(v, json_type_int) ||
            json_object_get_int64(v) < 1 ||
            json_object_get_int64(v) > MAX_DIM)
            return keel__fail(KEEL_ECORRUPT, "input_shape[%zu] is not an "
                              "integer in [1, %d]", i, MAX_DIM);
        s->d[i] = json_object_get_int64(v);
    }
    if (n == 3 && s->d[0] * s->d[1] > MAX_DIM / s->d[2])
        return keel__fail(KEEL_ECORRUPT, "input_shape holds more than %d "
                          "values", MAX_DIM);
    return KEEL_OK;
}

static keel_status
desc_check(struct json_object *arch, keel_vars *vs, int partial,
           keel__xmodel *xm)
{
    struct json_object *layers;
    keel_var **used;
    const char *output;
    size_t n, n_used = 0;
    dshape s;
    keel_status st;

    if (!json_object_is_type(arch, json_type_object))
        return keel__fail(KEEL_ECORRUPT, "not a JSON object");
    if ((st = check_input(arch, &s)) != KEEL_OK)
        return st;
    xm->in_rank = s.rank;
    memcpy(xm->in_shape, s.d, sizeof s.d);
    output = get_str(arch, "output");
    xm->softmax = output != NULL && strcmp(output, "logits") == 0;
    if (json_object_object_get_ex(arch, "output", &layers) && !xm->softmax)
        return keel__fail(KEEL_ECORRUPT, "'output' is not \"logits\"");
    if (!json_object_object_get_ex(arch, "layers", &layers) ||
        !json_object_is_type(layers, json_type_array) ||
        (n = json_object_array_length(layers)) > MAX_LAYERS ||
        (n == 0 && !partial))
        return keel__fail(KEEL_ECORRUPT, "'layers' is not a list of 1 to %d "
                          "layers", MAX_LAYERS);
    used = calloc(2 * n + 1, sizeof *used);
    if (used == NULL)
        return keel__fail(KEEL_ENOMEM, "layer description");
    for (size_t i = 0; i < n; i++) {
        st = check_layer(layers, i, vs, used, &n_used, &s);
        if (st != KEEL_OK)
            break;
    }
    free(used);
    if (st != KEEL_OK)
        return st;
    if (!partial && s.rank != 1) {
        char out[96];
        return keel__fail(KEEL_ECORRUPT, "the last layer gives %s, not a "
                          "vector: end with Flatten or Dense",
                          shape_text(&s, out, sizeof out));
    }
    if (xm->softmax && s.rank != 1)
        return keel__fail(KEEL_ECORRUPT, "\"output\": \"logits\" needs a "
                          "vector output");
    xm->out_dim = s.d[0];
    xm->arch = arch;
    xm->vs = vs;
    return KEEL_OK;
}

keel_status
keel__desc_check(struct json_object *arch, keel_vars *vs, keel__xmodel *xm)
{
    return desc_check(arch, vs, 0, xm);
}

size_t
keel__desc_layers(const keel__xmodel *xm)
{
    struct json_object *l;
    if (xm->arch == NULL || !json_object_object_get_ex(xm->arch, "layers", &l))
        return 0;
    return json_object_array_length(l);
}

struct json_object *
keel__desc_layer(const keel__xmodel *xm, size_t i)
{
    struct json_object *l;
    json_object_object_get_ex(xm->arch, "layers", &l);
    return json_object_array_get_idx(l, i);
}

keel_var *
keel__desc_layer_var(const keel__xmodel *xm, size_t i, int w)
{
    struct json_object *ws, *L = keel__desc_layer(xm, i);
    if (!json_object_object_get_ex(L, "weights", &ws))
        return NULL;
    return keel_vars_find(xm->vs, json_object_get_string(
                                      json_object_array_get_idx(ws,
                                                                (size_t)w)));
}

int64_t
keel__desc_int(struct json_object *L, const char *key, size_t i)
{
    struct json_object *v;
    if (!json_object_object_get_ex(L, key, &v))
        return 0;
    if (json_object_is_type(v, json_type_array))
        v = json_object_array_get_idx(v, i);
    return json_object_get_int64(v);
}

/* ---- keel_model_desc: a program's description, built layer by layer ---- */

struct keel_model_desc {
    keel_vars *vs;              /* borrowed */
    struct json_object *arch;
    int n_kind[4];              /* default-named layers of each class */
    char *json;                 /* keel_model_desc_json's text */
};

keel_status
keel_model_desc_new(keel_vars *vs, int ndim, const int64_t *input_shape,
                    keel_model_desc **out)
{
    keel_model_desc *d;
    struct json_object *shape;
    keel__xmodel xm;
    keel_status st;
    if (out == NULL || vs == NULL || input_shape == NULL)
        return keel__fail(KEEL_EINVAL, "model description: NULL argument");
    *out = NULL;
    if (ndim != 1 && ndim != 3)
        return keel__fail(KEEL_EINVAL, "model description: input of %d "
                          "dimensions (1: [features], 3: [height, width, "
                          "channels])", ndim);
    d = calloc(1, sizeof *d);
    if (d == NULL || (d->arch = json_object_new_object()) == NULL ||
        (shape = json_object_new_array()) == NULL) {
        keel_model_desc_free(d);
        return keel__fail(KEEL_ENOMEM, "model description");
    }
    d->vs = vs;
    for (int i = 0; i < ndim; i++)
        json_object_array_add(shape, json_object_new_int64(input_shape[i]));
    json_object_object_add(d->arch, "input_shape", shape);
    json_object_object_add(d->arch, "layers", json_object_new_array());
    st = desc_check(d->arch, vs, 1, &xm);
    if (st != KEEL_OK) {
        keel_model_desc_free(d);
        return keel__wrap(KEEL_EINVAL, "model description");
    }
    *out = d;
    return KEEL_OK;
}

void
keel_model_desc_free(keel_model_desc *d)
{
    if (d == NULL)
        return;
    if (d->arch != NULL)
        json_object_put(d->arch);
    free(d->json);
    free(d);
}

/* Append layer L of class kind (named name, or Keras's default), check
 * the description so far against the variables, and drop L on failure. */
static keel_status
desc_add(keel_model_desc *d, int kind, const char *name,
         struct json_object *L)
{
    struct json_object *layers;
    keel__xmodel xm;
    keel_status st;
    char def[LAYER_NAME_MAX];
    int defaulted = name == NULL;
    if (L == NULL)
        return keel__fail(KEEL_ENOMEM, "model description");
    if (defaulted) {
        if (d->n_kind[kind] == 0)
            snprintf(def, sizeof def, "%s", default_names[kind]);
        else
            snprintf(def, sizeof def, "%s_%d", default_names[kind],
                     d->n_kind[kind]);
        name = def;
    }
    json_object_object_add(L, "name", json_object_new_string(name));
    json_object_object_add(L, "class_name",
                           json_object_new_string(classes[kind]));
    json_object_object_get_ex(d->arch, "layers", &layers);
    json_object_array_add(layers, L);
    st = desc_check(d->arch, d->vs, 1, &xm);
    if (st != KEEL_OK) {
        json_object_array_del_idx(layers,
                                  json_object_array_length(layers) - 1, 1);
        return keel__wrap(KEEL_EINVAL, "model description");
    }
    d->n_kind[kind] += defaulted;
    return KEEL_OK;
}

static struct json_object *
weighted(const char *kernel, const char *bias, const char *activation)
{
    struct json_object *L = json_object_new_object(), *w;
    if (L == NULL)
        return NULL;
    w = json_object_new_array();
    json_object_array_add(w, json_object_new_string(kernel != NULL ? kernel
                                                                   : ""));
    json_object_array_add(w, json_object_new_string(bias != NULL ? bias
                                                                 : ""));
    json_object_object_add(L, "activation", json_object_new_string(
                               activation != NULL ? activation : "linear"));
    json_object_object_add(L, "weights", w);
    return L;
}

static struct json_object *
pair(int64_t a, int64_t b)
{
    struct json_object *p = json_object_new_array();
    json_object_array_add(p, json_object_new_int64(a));
    json_object_array_add(p, json_object_new_int64(b));
    return p;
}

keel_status
keel_model_desc_add_dense(keel_model_desc *d, const char *name,
                          const char *kernel, const char *bias,
                          const char *activation)
{
    if (d == NULL)
        return keel__fail(KEEL_EINVAL, "model description: NULL");
    return desc_add(d, 0, name, weighted(kernel, bias, activation));
}

keel_status
keel_model_desc_add_conv2d(keel_model_desc *d, const char *name,
                           const char *kernel, const char *bias,
                           int stride_h, int stride_w,
                           const char *activation)
{
    struct json_object *L;
    if (d == NULL)
        return keel__fail(KEEL_EINVAL, "model description: NULL");
    L = weighted(kernel, bias, activation);
    if (L != NULL)
        json_object_object_add(L, "strides", pair(stride_h, stride_w));
    return desc_add(d, 1, name, L);
}

keel_status
keel_model_desc_add_max_pooling2d(keel_model_desc *d, const char *name,
                                  int pool_h, int pool_w, int stride_h,
                                  int stride_w)
{
    struct json_object *L;
    if (d == NULL)
        return keel__fail(KEEL_EINVAL, "model description: NULL");
    L = json_object_new_object();
    if (L != NULL) {
        json_object_object_add(L, "pool_size", pair(pool_h, pool_w));
        json_object_object_add(L, "strides",
                               stride_h > 0 || stride_w > 0
                                   ? pair(stride_h, stride_w)
                                   : pair(pool_h, pool_w));
    }
    return desc_add(d, 2, name, L);
}

keel_status
keel_model_desc_add_flatten(keel_model_desc *d, const char *name)
{
    if (d == NULL)
        return keel__fail(KEEL_EINVAL, "model description: NULL");
    return desc_add(d, 3, name, json_object_new_object());
}

keel_status
keel_model_desc_json(keel_model_desc *d, const char **json)
{
    keel__xmodel xm;
    const char *text;
    keel_status st;
    if (d == NULL || json == NULL)
        return keel__fail(KEEL_EINVAL, "model description: NULL argument");
    *json = NULL;
    st = desc_check(d->arch, d->vs, 0, &xm);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "model description");
    text = json_object_to_json_string_ext(d->arch, JSON_C_TO_STRING_PLAIN |
                                          JSON_C_TO_STRING_NOSLASHESCAPE);
    free(d->json);
    d->json = text != NULL ? strdup(text) : NULL;
    if (d->json == NULL)
        return keel__fail(KEEL_ENOMEM, "model description");
    *json = d->json;
    return KEEL_OK;
}
