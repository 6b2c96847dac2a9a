/* export.c - keel/export.h: a checkpoint's model restored for inference
 * from the checkpoint alone (its /meta architecture), and its weights
 * written as Keras's HDF5 weight layout, safetensors or ONNX
 * (docs/export.md). Every writer builds the whole file beside the target
 * and renames it into place. */
#include <config.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hdf5.h>
#include <json-c/json.h>

#include <keel/checkpoint.h>
#include <keel/config.h>
#include <keel/train.h>
#include <keel/job.h>
#include <keel/export.h>
#include "util.h"
#include "h5util.h"
#include "app_int.h"
#include "../train/train_int.h"

/* The keras_version attribute of a keras-h5 export: the TF-Keras 2 layout
 * (weight names "<layer>/kernel:0"); Keras converts files whose version
 * starts with "1", never these. */
#define KERAS_VERSION "2.15.0"

struct keel_inference {
    keel_vars *vs;
    keel_model *model;
    keel_model_config mc;
    int64_t step;
    struct json_object *arch;     /* keel__model_arch of the model */
    char *source_arch;            /* the checkpoint's attribute, or NULL */
    char path[KEEL_PATH_MAX];
};

void
keel_inference_free(keel_inference *inf)
{
    if (inf == NULL)
        return;
    keel_model_free(inf->model);
    keel_vars_free(inf->vs);
    if (inf->arch != NULL)
        json_object_put(inf->arch);
    free(inf->source_arch);
    free(inf);
}

/* The model config from the checkpoint's architecture, else a job config. */
static keel_status
model_config_of(const char *path, const keel_ckpt_info *info,
                const keel_config *cfg, keel_model_config *mc)
{
    keel_config *own = NULL;
    keel_dataset *ds = NULL;
    keel_status st;
    if (info->architecture != NULL) {
        struct json_object *o = json_tokener_parse(info->architecture);
        if (o == NULL)
            return keel__fail(KEEL_ECORRUPT, "checkpoint %s: /meta "
                              "architecture is not JSON", path);
        st = keel__model_config_from_arch(o, mc);
        json_object_put(o);
        return st != KEEL_OK ? keel__wrap(st, "checkpoint %s", path) : st;
    }
    if (cfg == NULL) {
        if (info->config_text == NULL)
            return keel__fail(KEEL_EINVAL, "checkpoint %s holds neither an "
                              "architecture nor a config (written by an "
                              "older keel); pass the job's CONFIG file",
                              path);
        st = keel_config_from_checkpoint(path, &own);
        if (st != KEEL_OK)
            return st;
        cfg = own;
    }
    /* older checkpoints: the input shape is the data's */
    st = keel__job_open_dataset(cfg, 1, &ds);
    if (st == KEEL_OK)
        st = keel__job_model_config_from(cfg, ds, 1, mc);
    keel_dataset_free(ds);
    keel_config_free(own);
    if (st != KEEL_OK)
        return keel__wrap(st, "the model of %s (no architecture in the "
                          "checkpoint; from its config)", path);
    return KEEL_OK;
}

keel_status
keel_inference_open(const char *checkpoint_path, const keel_config *cfg,
                    int64_t max_batch, keel_inference **out)
{
    keel_inference *inf;
    keel_ckpt_info *info = NULL;
    keel_restore_config ro;
    keel_restore_report rep;
    keel_status st;
    if (out == NULL || checkpoint_path == NULL)
        return keel__fail(KEEL_EINVAL, "inference: NULL argument");
    *out = NULL;
    if (max_batch < 0 || max_batch > 1 << 20)
        return keel__fail(KEEL_EINVAL, "inference: max_batch %lld (0..%d)",
                          (long long)max_batch, 1 << 20);
    inf = calloc(1, sizeof *inf);
    if (inf == NULL)
        return keel__fail(KEEL_ENOMEM, "inference");
    snprintf(inf->path, sizeof inf->path, "%s", checkpoint_path);
    st = keel_ckpt_read_info(checkpoint_path, &info);
    if (st == KEEL_OK)
        st = model_config_of(checkpoint_path, info, cfg, &inf->mc);
    if (st == KEEL_OK && info->architecture != NULL &&
        (inf->source_arch = strdup(info->architecture)) == NULL)
        st = keel__fail(KEEL_ENOMEM, "inference");
    keel_ckpt_info_free(info);
    if (st == KEEL_OK) {
        inf->mc.max_batch = max_batch > 0 ? max_batch : 256;
        inf->mc.threads = 1;
        st = keel_vars_new(&inf->vs);
    }
    if (st == KEEL_OK)
        st = keel_model_new(&inf->mc, inf->vs, &inf->model);
    if (st == KEEL_OK) {
        keel_restore_config_init(&ro);   // strict
        ro.skip_slots = 1;
        st = keel_ckpt_restore(checkpoint_path, inf->vs, &ro, &rep);
    }
    if (st == KEEL_OK) {
        inf->step = rep.global_step;
        inf->arch = keel__model_arch(inf->model);
        if (inf->arch == NULL)
            st = keel__fail(KEEL_ENOMEM, "inference: architecture");
    }
    if (st != KEEL_OK) {
        keel_inference_free(inf);
        return st;
    }
    *out = inf;
    return KEEL_OK;
}

const keel_model_config *
keel_inference_model_config(const keel_inference *inf)
{
    return inf != NULL ? &inf->mc : NULL;
}

int64_t
keel_inference_step(const keel_inference *inf)
{
    return inf != NULL ? inf->step : -1;
}

keel_vars *
keel_inference_vars(keel_inference *inf)
{
    return inf != NULL ? inf->vs : NULL;
}

keel_status
keel_inference_predict(keel_inference *inf, const float *x, size_t n,
                       float *probs)
{
    size_t esize, bs;
    if (inf == NULL || x == NULL || probs == NULL || n < 1)
        return keel__fail(KEEL_EINVAL, "predict: NULL argument or no "
                          "examples");
    esize = (size_t)(inf->mc.height * inf->mc.width * inf->mc.channels);
    bs = (size_t)inf->mc.max_batch;
    for (size_t i = 0; i < n; i += bs) {
        keel_batch b;
        keel_status st;
        b.x = x + i * esize;
        b.y = NULL;
        b.n = n - i < bs ? n - i : bs;
        st = keel_model_predict(inf->model, inf->vs, &b,
                                probs + i * (size_t)inf->mc.classes);
        if (st != KEEL_OK)
            return st;
    }
    return KEEL_OK;
}

/* ---- formats ---------------------------------------------------------- */

static const char *const format_names[] = { "keras-h5", "safetensors",
                                            "onnx" };

KEEL__FROM_NAME(keel_export_format_from_name, keel_export_format,
                "export format", format_names)

const char *
keel_export_format_extension(keel_export_format f)
{
    return f == KEEL_EXPORT_KERAS_H5 ? ".h5"
         : f == KEEL_EXPORT_SAFETENSORS ? ".safetensors" : ".onnx";
}

/* The layer list and each layer's variables. */
static size_t
n_layers(const keel_inference *inf)
{
    struct json_object *l;
    json_object_object_get_ex(inf->arch, "layers", &l);
    return json_object_array_length(l);
}

static struct json_object *
layer_at(const keel_inference *inf, size_t i)
{
    struct json_object *l;
    json_object_object_get_ex(inf->arch, "layers", &l);
    return json_object_array_get_idx(l, i);
}

static const char *
jstr(struct json_object *o, const char *key)
{
    struct json_object *v;
    if (!json_object_object_get_ex(o, key, &v))
        return NULL;
    return json_object_get_string(v);
}

static int64_t
jint_at(struct json_object *o, const char *key, size_t i)
{
    struct json_object *v;
    if (!json_object_object_get_ex(o, key, &v))
        return 0;
    if (json_object_is_type(v, json_type_array))
        v = json_object_array_get_idx(v, i);
    return json_object_get_int64(v);
}

/* Layer i's variable w (0 kernel, 1 bias), or NULL for weightless ones. */
static keel_var *
layer_var(keel_inference *inf, size_t i, int w)
{
    struct json_object *ws, *L = layer_at(inf, i);
    if (!json_object_object_get_ex(L, "weights", &ws))
        return NULL;
    return keel_vars_find(inf->vs, json_object_get_string(
                                       json_object_array_get_idx(ws,
                                                                 (size_t)w)));
}

/* ---- keras-h5 ---------------------------------------------------------- */

/* A fixed-length, NUL-padded ASCII string type of size n (numpy 'S'). */
static hid_t
str_type(size_t n)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t >= 0 && (H5Tset_size(t, n > 0 ? n : 1) < 0 ||
                   H5Tset_strpad(t, H5T_STR_NULLPAD) < 0)) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

/* Create attribute name of type t over the dataspace sp on obj and write
 * val (NULL: nothing to write); closes sp, never t. */
static int
attr_put(hid_t obj, const char *name, hid_t t, hid_t sp, const void *val)
{
    hid_t a = t >= 0 && sp >= 0 ? H5Acreate2(obj, name, t, sp, H5P_DEFAULT,
                                             H5P_DEFAULT) : -1;
    int ok = a >= 0 && (val == NULL || H5Awrite(a, t, val) >= 0);
    keel__h5_close(a);
    keel__h5_close(sp);
    return ok;
}

/* names[n] as a 1-D fixed-length string attribute; n == 0 writes what
 * Keras writes for a layer without weights (an empty float64 array). */
static int
attr_strings(hid_t obj, const char *name, const char *const *names,
             size_t n)
{
    hsize_t dim = n;
    size_t w = 1;
    char *buf;
    hid_t t;
    int ok;
    if (n == 0)
        return attr_put(obj, name, H5T_IEEE_F64LE,
                        H5Screate_simple(1, &dim, NULL), NULL);
    for (size_t i = 0; i < n; i++)
        if (strlen(names[i]) > w)
            w = strlen(names[i]);
    buf = calloc(n, w);
    if (buf == NULL)
        return 0;
    for (size_t i = 0; i < n; i++)
        memcpy(buf + i * w, names[i], strlen(names[i]));
    t = str_type(w);
    ok = attr_put(obj, name, t, H5Screate_simple(1, &dim, NULL), buf);
    keel__h5_close(t);
    free(buf);
    return ok;
}

static int
attr_string(hid_t obj, const char *name, const char *s)
{
    hid_t t = str_type(strlen(s));
    int ok = attr_put(obj, name, t, H5Screate(H5S_SCALAR), s);
    keel__h5_close(t);
    return ok;
}

/* /<layer>/<layer>/<leaf>:0 as float32 LE, the variable's shape. */
static int
write_weight(hid_t g, const char *lname, const char *leaf, keel_var *v)
{
    keel_tensor *t = keel_var_tensor(v);
    hsize_t dims[KEEL_MAX_DIMS];
    char dname[KEEL_NAME_MAX + 8];
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), sp, d;
    int ok;
    for (int k = 0; k < t->ndim; k++)
        dims[k] = (hsize_t)t->shape[k];
    snprintf(dname, sizeof dname, "%s/%s:0", lname, leaf);
    if (lcpl >= 0)
        H5Pset_create_intermediate_group(lcpl, 1);
    sp = H5Screate_simple(t->ndim, dims, NULL);
    d = lcpl >= 0 && sp >= 0 ? H5Dcreate2(g, dname, H5T_IEEE_F32LE, sp, lcpl,
                                          H5P_DEFAULT, H5P_DEFAULT) : -1;
    ok = d >= 0 && H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                            H5P_DEFAULT, t->data) >= 0;
    keel__h5_close(d);
    keel__h5_close(sp);
    keel__h5_close(lcpl);
    return ok;
}

/* tf.keras's default name of the layer keel calls name: keel numbers
 * each kind from 1 ("dense_1", "dense_2"), tf.keras from none ("dense",
 * "dense_1"), so a model built in tf.keras finds its layers by_name. */
static void
keras_name(const char *name, char *out, size_t size)
{
    const char *us = strrchr(name, '_');
    char *end;
    long n = us != NULL ? strtol(us + 1, &end, 10) : 0;
    if (us == NULL || us[1] == '\0' || *end != '\0' || n < 1) {
        snprintf(out, size, "%s", name);
        return;
    }
    if (n == 1)
        snprintf(out, size, "%.*s", (int)(us - name), name);
    else
        snprintf(out, size, "%.*s_%ld", (int)(us - name), name, n - 1);
}

static keel_status
keras_h5_write(keel_inference *inf, const char *tmp)
{
    size_t nl = n_layers(inf);
    const char **names = calloc(nl > 0 ? nl : 1, sizeof *names);
    char (*kn)[64] = calloc(nl > 0 ? nl : 1, sizeof *kn);
    hid_t f;
    int ok = 1;
    keel_status st = KEEL_OK;
    if (names == NULL || kn == NULL) {
        free(names);
        free(kn);
        return keel__fail(KEEL_ENOMEM, "keras-h5 export");
    }
    for (size_t i = 0; i < nl; i++) {
        keras_name(jstr(layer_at(inf, i), "name"), kn[i], sizeof kn[i]);
        names[i] = kn[i];
    }
    f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) {
        free(names);
        free(kn);
        return keel__fail(KEEL_EIO, "keras-h5 export: cannot create %s",
                          tmp);
    }
    ok = attr_strings(f, "layer_names", names, nl) &&
         attr_string(f, "backend", "tensorflow") &&
         attr_string(f, "keras_version", KERAS_VERSION);
    for (size_t i = 0; ok && i < nl; i++) {
        hid_t g = H5Gcreate2(f, names[i], H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT);
        keel_var *k = layer_var(inf, i, 0), *b = layer_var(inf, i, 1);
        ok = g >= 0;
        if (ok && k != NULL && b != NULL) {
            char wk[96], wb[96];
            const char *wn[2] = { wk, wb };
            snprintf(wk, sizeof wk, "%s/kernel:0", names[i]);
            snprintf(wb, sizeof wb, "%s/bias:0", names[i]);
            ok = attr_strings(g, "weight_names", wn, 2) &&
                 write_weight(g, names[i], "kernel", k) &&
                 write_weight(g, names[i], "bias", b);
        } else if (ok) {
            ok = attr_strings(g, "weight_names", NULL, 0);
        }
        keel__h5_close(g);
    }
    if (H5Fclose(f) < 0)
        ok = 0;
    if (!ok)
        st = keel__fail(KEEL_EIO, "keras-h5 export: writing %s failed",
                        tmp);
    free(names);
    free(kn);
    return st;
}

/* ---- safetensors ------------------------------------------------------- */

/* Every variable of the model in layer order (kernel, bias, ...). */
static size_t
model_vars(keel_inference *inf, keel_var **out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < n_layers(inf); i++)
        for (int w = 0; w < 2; w++) {
            keel_var *v = layer_var(inf, i, w);
            if (v != NULL && n < cap)
                out[n++] = v;
        }
    return n;
}

static keel_status
safetensors_bytes(keel_inference *inf, unsigned char **out, size_t *len)
{
    keel_var *vars[64];
    size_t nv = model_vars(inf, vars, 64), off = 0, hl, pad, total;
    struct json_object *h = json_object_new_object(), *meta;
    const char *text;
    unsigned char *buf;
    char step[32];
    if (h == NULL)
        return keel__fail(KEEL_ENOMEM, "safetensors header");
    meta = json_object_new_object();
    json_object_object_add(meta, "format", json_object_new_string("keel"));
    snprintf(step, sizeof step, "%lld", (long long)inf->step);
    json_object_object_add(meta, "global_step", json_object_new_string(step));
    json_object_object_add(meta, "architecture", json_object_new_string(
        json_object_to_json_string_ext(inf->arch, JSON_C_TO_STRING_PLAIN)));
    json_object_object_add(h, "__metadata__", meta);
    for (size_t i = 0; i < nv; i++) {
        keel_tensor *t = keel_var_tensor(vars[i]);
        struct json_object *e = json_object_new_object(), *s, *o;
        size_t nb = keel_tensor_bytes(t);
        s = json_object_new_array();
        for (int k = 0; k < t->ndim; k++)
            json_object_array_add(s, json_object_new_int64(t->shape[k]));
        o = json_object_new_array();
        json_object_array_add(o, json_object_new_int64((int64_t)off));
        json_object_array_add(o, json_object_new_int64((int64_t)(off + nb)));
        json_object_object_add(e, "dtype", json_object_new_string("F32"));
        json_object_object_add(e, "shape", s);
        json_object_object_add(e, "data_offsets", o);
        json_object_object_add(h, keel_var_name(vars[i]), e);
        off += nb;
    }
    text = json_object_to_json_string_ext(h, JSON_C_TO_STRING_PLAIN |
                                          JSON_C_TO_STRING_NOSLASHESCAPE);
    hl = strlen(text);
    pad = (8 - hl % 8) % 8;             /* data starts 8-byte aligned */
    total = 8 + hl + pad + off;
    buf = malloc(total);
    if (buf == NULL) {
        json_object_put(h);
        return keel__fail(KEEL_ENOMEM, "safetensors export of %zu bytes",
                          total);
    }
    for (int k = 0; k < 8; k++)
        buf[k] = (unsigned char)((uint64_t)(hl + pad) >> (8 * k));
    memcpy(buf + 8, text, hl);
    memset(buf + 8 + hl, ' ', pad);
    json_object_put(h);
    off = 8 + hl + pad;
    for (size_t i = 0; i < nv; i++) {
        keel_tensor *t = keel_var_tensor(vars[i]);
        /* keel's floats are little-endian IEEE 754 binary32 (x86-64, the
         * checkpoint format's own byte order) */
        memcpy(buf + off, t->data, keel_tensor_bytes(t));
        off += keel_tensor_bytes(t);
    }
    *out = buf;
    *len = total;
    return KEEL_OK;
}

/* ---- export ------------------------------------------------------------ */

keel_status
keel_export(keel_inference *inf, keel_export_format f, const char *out_path)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    keel_status st;
    if (inf == NULL || out_path == NULL)
        return keel__fail(KEEL_EINVAL, "export: NULL argument");
    if (f == KEEL_EXPORT_KERAS_H5) {
        char tmp[KEEL_PATH_MAX];
        st = keel__fs_tmp_name(tmp, sizeof tmp, out_path);
        if (st != KEEL_OK)
            return st;
        keel__h5_lock();
        H5E_BEGIN_TRY {
            st = keras_h5_write(inf, tmp);
        } H5E_END_TRY;
        keel__h5_unlock();
        if (st == KEEL_OK)
            st = keel__fs_fsync_path(tmp);
        if (st == KEEL_OK)
            st = keel__fs_commit(tmp, out_path);
        if (st != KEEL_OK)
            unlink(tmp);
        return st != KEEL_OK ? keel__wrap(st, "export to %s", out_path) : st;
    }
    if (f == KEEL_EXPORT_SAFETENSORS)
        st = safetensors_bytes(inf, &buf, &len);
    else if (f == KEEL_EXPORT_ONNX)
        st = keel__onnx_bytes(inf, &buf, &len);
    else
        st = keel__fail(KEEL_EINVAL, "export: unknown format %d", (int)f);
    if (st == KEEL_OK)
        st = keel__fs_write_atomic(out_path, buf, len);
    free(buf);
    return st != KEEL_OK ? keel__wrap(st, "export to %s", out_path) : st;
}

/* For onnx.c: the pieces of the model it walks. */
size_t
keel__export_layers(keel_inference *inf)
{
    return n_layers(inf);
}

struct json_object *
keel__export_layer(keel_inference *inf, size_t i)
{
    return layer_at(inf, i);
}

keel_var *
keel__export_layer_var(keel_inference *inf, size_t i, int w)
{
    return layer_var(inf, i, w);
}

int64_t
keel__export_layer_int(struct json_object *L, const char *key, size_t i)
{
    return jint_at(L, key, i);
}
