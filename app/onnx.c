/* onnx.c - the ONNX export (keel_export, KEEL_EXPORT_ONNX): a ModelProto
 * encoded by hand in protobuf wire format (varints and length-delimited
 * fields; no generated code exists for onnx.proto in C). The graph takes
 * NHWC float32 images "input" [N,H,W,C] and gives "probabilities"
 * [N,classes]; every variable is an initializer under its keel name in
 * keel's (Keras's) layout, convolution kernels turned to ONNX's OIHW by a
 * Transpose node. Opset 13, IR version 7. docs/export.md. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include <keel/checkpoint.h>
#include <keel/version.h>
#include <keel/config.h>
#include <keel/train.h>
#include <keel/export.h>
#include "util.h"
#include "app_int.h"

#define ONNX_IR_VERSION 7
#define ONNX_OPSET 13
enum { T_FLOAT = 1, T_INT64 = 7 };                    /* TensorProto */
enum { A_INT = 2, A_INTS = 7 };                       /* AttributeProto */

/* A growable protobuf message; ok drops to 0 on the first failed grow. */
typedef struct pb {
    unsigned char *b;
    size_t n, cap;
    int ok;
} pb;

static void
pb_put(pb *p, const void *d, size_t n)
{
    if (!p->ok)
        return;
    if (p->n + n > p->cap) {
        size_t c = p->cap ? p->cap : 256;
        unsigned char *nb;
        while (c < p->n + n)
            c *= 2;
        nb = realloc(p->b, c);
        if (nb == NULL) {
            p->ok = 0;
            return;
        }
        p->b = nb;
        p->cap = c;
    }
    memcpy(p->b + p->n, d, n);
    p->n += n;
}

static void
pb_varint(pb *p, uint64_t v)
{
    unsigned char b[10];
    size_t n = 0;
    do {
        b[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v != 0)
            b[n] |= 0x80;
        n++;
    } while (v != 0);
    pb_put(p, b, n);
}

static void
pb_int(pb *p, int field, int64_t v)
{
    pb_varint(p, (uint64_t)field << 3);           /* wire type 0 */
    pb_varint(p, (uint64_t)v);
}

static void
pb_bytes(pb *p, int field, const void *d, size_t n)
{
    pb_varint(p, (uint64_t)field << 3 | 2);       /* length-delimited */
    pb_varint(p, n);
    pb_put(p, d, n);
}

static void
pb_str(pb *p, int field, const char *s)
{
    pb_bytes(p, field, s, strlen(s));
}

/* Append sub as field of p and reset sub. */
static void
pb_msg(pb *p, int field, pb *sub)
{
    if (!sub->ok)
        p->ok = 0;
    pb_bytes(p, field, sub->b, sub->n);
    free(sub->b);
    memset(sub, 0, sizeof *sub);
    sub->ok = 1;
}

static void
pb_free(pb *p)
{
    free(p->b);
    memset(p, 0, sizeof *p);
}

/* AttributeProto: an int or a list of ints. */
static void
attr_ints(pb *node, const char *name, const int64_t *v, int n, int single)
{
    pb a = { 0 };
    a.ok = 1;
    pb_str(&a, 1, name);
    if (single) {
        pb_int(&a, 3, v[0]);
        pb_int(&a, 20, A_INT);
    } else {
        for (int i = 0; i < n; i++)
            pb_int(&a, 8, v[i]);
        pb_int(&a, 20, A_INTS);
    }
    pb_msg(node, 5, &a);
}

/* NodeProto with up to three inputs; attributes added by the caller into
 * the returned builder before node_end. */
static void
node_begin(pb *n, const char *op, const char *name, const char *in0,
           const char *in1, const char *in2, const char *out)
{
    memset(n, 0, sizeof *n);
    n->ok = 1;
    pb_str(n, 1, in0);
    if (in1 != NULL)
        pb_str(n, 1, in1);
    if (in2 != NULL)
        pb_str(n, 1, in2);
    pb_str(n, 2, out);
    pb_str(n, 3, name);
    pb_str(n, 4, op);
}

static void
node_end(pb *graph, pb *n)
{
    pb_msg(graph, 1, n);
}

/* ValueInfoProto: float tensor [N, dims...] with N symbolic. */
static void
value_info(pb *graph, int field, const char *name, const int64_t *dims,
           int nd)
{
    pb vi = { 0 }, type = { 0 }, tt = { 0 }, shape = { 0 }, dim = { 0 };
    vi.ok = type.ok = tt.ok = shape.ok = dim.ok = 1;
    pb_str(&dim, 2, "N");
    pb_msg(&shape, 1, &dim);
    for (int i = 0; i < nd; i++) {
        pb_int(&dim, 1, dims[i]);
        pb_msg(&shape, 1, &dim);
    }
    pb_int(&tt, 1, T_FLOAT);
    pb_msg(&tt, 2, &shape);
    pb_msg(&type, 1, &tt);
    pb_str(&vi, 1, name);
    pb_msg(&vi, 2, &type);
    pb_msg(graph, field, &vi);
    pb_free(&dim);
    pb_free(&shape);
    pb_free(&tt);
    pb_free(&type);
}

/* TensorProto initializer: a variable's float32 data, little-endian. */
static void
initializer(pb *graph, keel_var *v)
{
    keel_tensor *t = keel_var_tensor(v);
    pb tp = { 0 };
    tp.ok = 1;
    for (int k = 0; k < t->ndim; k++)
        pb_int(&tp, 1, t->shape[k]);
    pb_int(&tp, 2, T_FLOAT);
    pb_str(&tp, 8, keel_var_name(v));
    pb_bytes(&tp, 9, t->data, keel_tensor_bytes(t));
    pb_msg(graph, 5, &tp);
}

/* A Transpose node "<lname>/<tag>" of in by perm (4 axes); its output's
 * name into out (which may be in). */
static void
transpose(pb *graph, const char *lname, const char *tag, const char *in,
          const int64_t perm[4], char *out, size_t out_size)
{
    char name[128], o[128];
    pb n;
    snprintf(name, sizeof name, "%s/%s", lname, tag);
    snprintf(o, sizeof o, "%s/%s:0", lname, tag);
    node_begin(&n, "Transpose", name, in, NULL, NULL, o);
    attr_ints(&n, "perm", perm, 4, 0);
    node_end(graph, &n);
    snprintf(out, out_size, "%s", o);
}

static void
activation(pb *graph, const char *act, const char *in, char *out,
           size_t out_size, const char *lname)
{
    const char *op = strcmp(act, "relu") == 0 ? "Relu"
                   : strcmp(act, "tanh") == 0 ? "Tanh" : NULL;
    char name[96];
    pb n;
    if (op == NULL) {
        snprintf(out, out_size, "%s", in);
        return;
    }
    snprintf(name, sizeof name, "%s/%s", lname, op);
    snprintf(out, out_size, "%s/%s:0", lname, op);
    node_begin(&n, op, name, in, NULL, NULL, out);
    node_end(graph, &n);
}

keel_status
keel__onnx_bytes(keel_inference *inf, unsigned char **out, size_t *len)
{
    const keel_model_config *mc = keel_inference_model_config(inf);
    pb model = { 0 }, graph = { 0 }, n, op = { 0 };
    char cur[128], next[128], name[128];
    int nchw = 0;                  /* the current tensor is NCHW */
    int64_t in_dims[3] = { mc->height, mc->width, mc->channels };
    int64_t out_dims[1] = { mc->classes };
    size_t nl = keel__export_layers(inf);
    model.ok = graph.ok = op.ok = 1;

    pb_str(&graph, 2, "keel");
    snprintf(cur, sizeof cur, "input");
    for (size_t i = 0; i < nl; i++) {
        struct json_object *L = keel__export_layer(inf, i), *v;
        const char *cls, *lname, *act = "linear";
        keel_var *k = keel__export_layer_var(inf, i, 0);
        keel_var *b = keel__export_layer_var(inf, i, 1);
        json_object_object_get_ex(L, "class_name", &v);
        cls = json_object_get_string(v);
        json_object_object_get_ex(L, "name", &v);
        lname = json_object_get_string(v);
        if (json_object_object_get_ex(L, "activation", &v))
            act = json_object_get_string(v);
        if (strcmp(cls, "Conv2D") == 0) {
            static const int64_t to_nchw[4] = { 0, 3, 1, 2 };
            static const int64_t to_oihw[4] = { 3, 2, 0, 1 };
            int64_t ks[2], st[2], pads[4] = { 0, 0, 0, 0 };
            char w[128];
            if (!nchw) {
                transpose(&graph, lname, "to_nchw", cur, to_nchw, cur,
                          sizeof cur);
                nchw = 1;
            }
            transpose(&graph, lname, "kernel_oihw", keel_var_name(k),
                      to_oihw, w, sizeof w);
            for (int d = 0; d < 2; d++) {
                ks[d] = keel__export_layer_int(L, "kernel_size", (size_t)d);
                st[d] = keel__export_layer_int(L, "strides", (size_t)d);
            }
            snprintf(name, sizeof name, "%s/Conv", lname);
            snprintf(next, sizeof next, "%s/Conv:0", lname);
            node_begin(&n, "Conv", name, cur, w, keel_var_name(b), next);
            attr_ints(&n, "kernel_shape", ks, 2, 0);
            attr_ints(&n, "strides", st, 2, 0);
            attr_ints(&n, "pads", pads, 4, 0);
            node_end(&graph, &n);
            activation(&graph, act, next, cur, sizeof cur, lname);
        } else if (strcmp(cls, "MaxPooling2D") == 0) {
            int64_t ks[2], st[2];
            for (int d = 0; d < 2; d++) {
                ks[d] = keel__export_layer_int(L, "pool_size", (size_t)d);
                st[d] = keel__export_layer_int(L, "strides", (size_t)d);
            }
            snprintf(name, sizeof name, "%s/MaxPool", lname);
            snprintf(next, sizeof next, "%s/MaxPool:0", lname);
            node_begin(&n, "MaxPool", name, cur, NULL, NULL, next);
            attr_ints(&n, "kernel_shape", ks, 2, 0);
            attr_ints(&n, "strides", st, 2, 0);
            node_end(&graph, &n);
            snprintf(cur, sizeof cur, "%s", next);
        } else if (strcmp(cls, "Flatten") == 0) {
            static const int64_t to_nhwc[4] = { 0, 2, 3, 1 };
            static const int64_t one = 1;
            if (nchw) {       /* Keras flattens in (h, w, c) order */
                transpose(&graph, lname, "to_nhwc", cur, to_nhwc, cur,
                          sizeof cur);
                nchw = 0;
            }
            snprintf(name, sizeof name, "%s/Flatten", lname);
            snprintf(next, sizeof next, "%s/Flatten:0", lname);
            node_begin(&n, "Flatten", name, cur, NULL, NULL, next);
            attr_ints(&n, "axis", &one, 1, 1);
            node_end(&graph, &n);
            snprintf(cur, sizeof cur, "%s", next);
        } else if (strcmp(cls, "Dense") == 0) {
            snprintf(name, sizeof name, "%s/Gemm", lname);
            snprintf(next, sizeof next, "%s/Gemm:0", lname);
            node_begin(&n, "Gemm", name, cur, keel_var_name(k),
                       keel_var_name(b), next);
            node_end(&graph, &n);
            activation(&graph, act, next, cur, sizeof cur, lname);
        } else {
            pb_free(&graph);
            return keel__fail(KEEL_EINTERNAL, "onnx export: layer %s of "
                              "class %s", lname, cls);
        }
        if (k != NULL)
            initializer(&graph, k);
        if (b != NULL)
            initializer(&graph, b);
    }
    {
        static const int64_t last = 1;
        node_begin(&n, "Softmax", "probabilities/Softmax", cur, NULL, NULL,
                   "probabilities");
        attr_ints(&n, "axis", &last, 1, 1);
        node_end(&graph, &n);
    }
    value_info(&graph, 11, "input", in_dims, 3);
    value_info(&graph, 12, "probabilities", out_dims, 1);

    pb_int(&model, 1, ONNX_IR_VERSION);
    pb_str(&model, 2, "keel");
    pb_str(&model, 3, keel_version());
    pb_msg(&model, 7, &graph);
    pb_str(&op, 1, "");
    pb_int(&op, 2, ONNX_OPSET);
    pb_msg(&model, 8, &op);
    pb_free(&op);
    pb_free(&graph);
    if (!model.ok) {
        pb_free(&model);
        return keel__fail(KEEL_ENOMEM, "onnx export");
    }
    *out = model.b;
    *len = model.n;
    return KEEL_OK;
}
