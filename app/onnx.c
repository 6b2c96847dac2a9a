/* onnx.c - the ONNX export (keel_export, KEEL_EXPORT_ONNX): a ModelProto
 * encoded by hand in protobuf wire format (varints and length-delimited
 * fields; no generated code exists for onnx.proto in C). The graph takes
 * "input", NHWC float32 images [N,H,W,C] or vectors [N,D], and gives
 * "probabilities" [N,classes] (a description whose output is logits) or
 * "output" [N,D] (any other); every variable is an initializer under its
 * keel name in keel's (Keras's) layout, convolution kernels turned to
 * ONNX's OIHW by a Transpose node. Opset 13, IR version 7. docs/export.md. */
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

/* Begin NodeProto op of layer lname: named "<lname>/<op>", its output
 * "<lname>/<op>:0" into out. */
static void
layer_node_begin(pb *n, const char *op, const char *lname, const char *in0,
                 const char *in1, const char *in2, char *out, size_t out_size)
{
    char name[128];
    snprintf(name, sizeof name, "%s/%s", lname, op);
    snprintf(out, out_size, "%s/%s:0", lname, op);
    node_begin(n, op, name, in0, in1, in2, out);
}

static void
activation(pb *graph, const char *act, const char *in, char *out,
           size_t out_size, const char *lname)
{
    static const int64_t last = -1;
    const char *op = strcmp(act, "relu") == 0 ? "Relu"
                   : strcmp(act, "tanh") == 0 ? "Tanh"
                   : strcmp(act, "sigmoid") == 0 ? "Sigmoid"
                   : strcmp(act, "softmax") == 0 ? "Softmax" : NULL;
    pb n;
    if (op == NULL) {
        snprintf(out, out_size, "%s", in);
        return;
    }
    layer_node_begin(&n, op, lname, in, NULL, NULL, out, out_size);
    if (strcmp(op, "Softmax") == 0)
        attr_ints(&n, "axis", &last, 1, 1);
    node_end(graph, &n);
}

/* The graph as it is built: the name of the tensor the next layer takes,
 * and whether that tensor is NCHW (after a convolution) or NHWC. */
typedef struct onnx_graph {
    pb g;
    char cur[128];
    int nchw;
} onnx_graph;

/* One layer of the architecture: its Keras config, name, activation, and
 * kernel and bias (or NULL). */
typedef struct onnx_layer {
    struct json_object *config;
    const char *cls, *name, *act;
    keel_var *kernel, *bias;
} onnx_layer;

/* A Conv2D or MaxPooling2D layer's 2-D window (size_key) and strides. */
static void
layer_window(const onnx_layer *l, const char *size_key, int64_t size[2],
             int64_t strides[2])
{
    for (int d = 0; d < 2; d++) {
        size[d] = keel__desc_int(l->config, size_key, (size_t)d);
        strides[d] = keel__desc_int(l->config, "strides", (size_t)d);
    }
}

/* Conv2D: the input turned NCHW (once), the kernel OIHW, unpadded. */
static void
add_conv(onnx_graph *og, const onnx_layer *l)
{
    static const int64_t to_nchw[4] = { 0, 3, 1, 2 };
    static const int64_t to_oihw[4] = { 3, 2, 0, 1 };
    int64_t ks[2], st[2], pads[4] = { 0, 0, 0, 0 };
    char w[128], next[128];
    pb n;

    if (!og->nchw) {
        transpose(&og->g, l->name, "to_nchw", og->cur, to_nchw, og->cur,
                  sizeof og->cur);
        og->nchw = 1;
    }
    transpose(&og->g, l->name, "kernel_oihw", keel_var_name(l->kernel),
              to_oihw, w, sizeof w);
    layer_window(l, "kernel_size", ks, st);
    layer_node_begin(&n, "Conv", l->name, og->cur, w, keel_var_name(l->bias),
                     next, sizeof next);
    attr_ints(&n, "kernel_shape", ks, 2, 0);
    attr_ints(&n, "strides", st, 2, 0);
    attr_ints(&n, "pads", pads, 4, 0);
    node_end(&og->g, &n);
    activation(&og->g, l->act, next, og->cur, sizeof og->cur, l->name);
}

static void
add_maxpool(onnx_graph *og, const onnx_layer *l)
{
    int64_t ks[2], st[2];
    char next[128];
    pb n;

    layer_window(l, "pool_size", ks, st);
    layer_node_begin(&n, "MaxPool", l->name, og->cur, NULL, NULL, next,
                     sizeof next);
    attr_ints(&n, "kernel_shape", ks, 2, 0);
    attr_ints(&n, "strides", st, 2, 0);
    node_end(&og->g, &n);
    snprintf(og->cur, sizeof og->cur, "%s", next);
}

/* Flatten, from NHWC: Keras flattens in (h, w, c) order. */
static void
add_flatten(onnx_graph *og, const onnx_layer *l)
{
    static const int64_t to_nhwc[4] = { 0, 2, 3, 1 };
    static const int64_t one = 1;
    char next[128];
    pb n;

    if (og->nchw) {
        transpose(&og->g, l->name, "to_nhwc", og->cur, to_nhwc, og->cur,
                  sizeof og->cur);
        og->nchw = 0;
    }
    layer_node_begin(&n, "Flatten", l->name, og->cur, NULL, NULL, next,
                     sizeof next);
    attr_ints(&n, "axis", &one, 1, 1);
    node_end(&og->g, &n);
    snprintf(og->cur, sizeof og->cur, "%s", next);
}

/* Dense: a Gemm with the kernel and bias, then the activation. */
static void
add_dense(onnx_graph *og, const onnx_layer *l)
{
    char next[128];
    pb n;

    layer_node_begin(&n, "Gemm", l->name, og->cur, keel_var_name(l->kernel),
                     keel_var_name(l->bias), next, sizeof next);
    node_end(&og->g, &n);
    activation(&og->g, l->act, next, og->cur, sizeof og->cur, l->name);
}

/* Layer i of xm's description into l. */
static void
layer_at(const keel__xmodel *xm, size_t i, onnx_layer *l)
{
    struct json_object *v;

    l->config = keel__desc_layer(xm, i);
    l->kernel = keel__desc_layer_var(xm, i, 0);
    l->bias = keel__desc_layer_var(xm, i, 1);
    json_object_object_get_ex(l->config, "class_name", &v);
    l->cls = json_object_get_string(v);
    json_object_object_get_ex(l->config, "name", &v);
    l->name = json_object_get_string(v);
    l->act = "linear";
    if (json_object_object_get_ex(l->config, "activation", &v))
        l->act = json_object_get_string(v);
}

/* Layer i's nodes, then its kernel and bias as initializers. */
static keel_status
add_layer(onnx_graph *og, const keel__xmodel *xm, size_t i)
{
    static const struct {
        const char *cls;
        void (*add)(onnx_graph *, const onnx_layer *);
    } kinds[] = {
        { "Conv2D", add_conv }, { "MaxPooling2D", add_maxpool },
        { "Flatten", add_flatten }, { "Dense", add_dense },
    };
    onnx_layer l;
    size_t j = 0;

    layer_at(xm, i, &l);
    while (j < sizeof kinds / sizeof *kinds && strcmp(l.cls, kinds[j].cls))
        j++;
    if (j == sizeof kinds / sizeof *kinds)
        return keel__fail(KEEL_EINTERNAL, "onnx export: layer %s of class "
                          "%s", l.name, l.cls);
    kinds[j].add(og, &l);
    if (l.kernel != NULL)
        initializer(&og->g, l.kernel);
    if (l.bias != NULL)
        initializer(&og->g, l.bias);
    return KEEL_OK;
}

/* The GraphProto: every layer, the softmax of logits, and the input and
 * output ("probabilities" after logits, else "output"). */
static keel_status
build_graph(const keel__xmodel *xm, pb *graph)
{
    static const int64_t last = 1;
    int64_t out_dims[1] = { xm->out_dim };
    size_t nl = keel__desc_layers(xm);
    const char *out_name = xm->softmax ? "probabilities" : "output";
    onnx_graph og;
    pb n;

    memset(&og, 0, sizeof og);
    og.g.ok = 1;
    pb_str(&og.g, 2, "keel");
    snprintf(og.cur, sizeof og.cur, "input");
    for (size_t i = 0; i < nl; i++) {
        keel_status st = add_layer(&og, xm, i);
        if (st != KEEL_OK) {
            pb_free(&og.g);
            return st;
        }
    }
    if (xm->softmax) {
        node_begin(&n, "Softmax", "probabilities/Softmax", og.cur, NULL,
                   NULL, out_name);
        attr_ints(&n, "axis", &last, 1, 1);
    } else {
        node_begin(&n, "Identity", "output/Identity", og.cur, NULL, NULL,
                   out_name);
    }
    node_end(&og.g, &n);
    value_info(&og.g, 11, "input", xm->in_shape, xm->in_rank);
    value_info(&og.g, 12, out_name, out_dims, 1);
    *graph = og.g;
    return KEEL_OK;
}

keel_status
keel__onnx_bytes(const keel__xmodel *xm, unsigned char **out, size_t *len)
{
    pb model = { 0 }, graph, op = { 0 };
    keel_status st = build_graph(xm, &graph);

    if (st != KEEL_OK)
        return st;
    model.ok = op.ok = 1;
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
