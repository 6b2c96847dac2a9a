/* export.c - keel/export.h: a checkpoint's model restored for inference
 * from the checkpoint alone (its /meta architecture), and the weights of
 * any checkpoint written as safetensors or, with a layer description
 * (keel train's, or a program's: describe.c), Keras's HDF5 weight layout
 * or ONNX (docs/export.md). Every writer builds the whole file beside the
 * target and renames it into place. */
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
#include <keel/version.h>
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
    keel__xmodel xm;              /* the model and arch, for the writers */
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
        struct json_object *o = json_tokener_parse(info->architecture), *m;
        if (o == NULL)
            return keel__fail(KEEL_ECORRUPT, "checkpoint %s: /meta "
                              "architecture is not JSON", path);
        if (json_object_is_type(o, json_type_object) &&
            !json_object_object_get_ex(o, "model", &m)) {
            json_object_put(o);
            return keel__fail(KEEL_EINVAL, "checkpoint %s holds a program's "
                              "layer description, not a model keel train "
                              "built: it exports (keel export) but does not "
                              "run in keel", path);
        }
        st = keel__model_config_from_arch(o, mc);
        json_object_put(o);
        return st != KEEL_OK ? keel__wrap(st, "checkpoint %s", path) : st;
    }
    if (cfg == NULL) {
        if (info->config_text == NULL)
            return keel__fail(KEEL_EINVAL, "checkpoint %s holds neither an "
                              "architecture nor a config (a program's own "
                              "model, or written by an older keel); for a "
                              "keel train checkpoint pass the job's CONFIG "
                              "file", path);
        st = keel_config_from_checkpoint(path, &own);
        if (st != KEEL_OK)
            return st;
        cfg = own;
    }
    /* older checkpoints: the input shape is the data's */
    st = keel__job_open_dataset(cfg, 1, 0, 1, &ds);
    if (st == KEEL_OK)      /* keel wrote an architecture once classes
                             * could be other than 10 */
        st = keel__job_model_config_from(
            cfg, ds, keel_config_int(cfg, "model.classes") > 0
                         ? keel_config_int(cfg, "model.classes") : 10,
            1, mc);
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
    if (st == KEEL_OK) {
        st = keel__desc_check(inf->arch, inf->vs, &inf->xm);
        if (st != KEEL_OK)
            st = keel__wrap(KEEL_EINTERNAL, "inference: the model's layer "
                            "description");
        inf->xm.keras_names = 1;
        inf->xm.step = inf->step;
        inf->xm.path = inf->path;
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
keras_h5_write(const keel__xmodel *xm, const char *tmp)
{
    size_t nl = keel__desc_layers(xm);
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
        struct json_object *v;
        const char *name = "";
        if (json_object_object_get_ex(keel__desc_layer(xm, i), "name", &v))
            name = json_object_get_string(v);
        if (xm->keras_names)
            keras_name(name, kn[i], sizeof kn[i]);
        else
            snprintf(kn[i], sizeof kn[i], "%s", name);
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
        keel_var *k = keel__desc_layer_var(xm, i, 0);
        keel_var *b = keel__desc_layer_var(xm, i, 1);
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

/* Every variable of xm, in the store's order, as F32 tensors (keel's
 * floats are little-endian IEEE 754 binary32: x86-64's and the checkpoint
 * format's byte order), after a header padded with spaces so that the data
 * starts 8-byte aligned. __metadata__: format, keel_version, global_step
 * and, when there is one, arch_text (the layer description). */
static keel_status
safetensors_bytes(const keel__xmodel *xm, const char *arch_text,
                  unsigned char **out, size_t *len)
{
    size_t nv = keel_vars_count(xm->vs), off = 0, hl, pad, total;
    struct json_object *h = json_object_new_object(), *meta;
    const char *text;
    unsigned char *buf;
    char step[32];
    if (h == NULL || (meta = json_object_new_object()) == NULL) {
        json_object_put(h);
        return keel__fail(KEEL_ENOMEM, "safetensors header");
    }
    json_object_object_add(meta, "format", json_object_new_string("keel"));
    json_object_object_add(meta, "keel_version",
                           json_object_new_string(keel_version()));
    snprintf(step, sizeof step, "%lld", (long long)xm->step);
    json_object_object_add(meta, "global_step", json_object_new_string(step));
    if (arch_text != NULL)
        json_object_object_add(meta, "architecture",
                               json_object_new_string(arch_text));
    json_object_object_add(h, "__metadata__", meta);
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(xm->vs, i);
        keel_tensor *t = keel_var_tensor(v);
        struct json_object *e = json_object_new_object(), *s, *o;
        size_t nb = keel_tensor_bytes(t);
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        s = json_object_new_array();
        for (int k = 0; k < t->ndim; k++)
            json_object_array_add(s, json_object_new_int64(t->shape[k]));
        o = json_object_new_array();
        json_object_array_add(o, json_object_new_int64((int64_t)off));
        json_object_array_add(o, json_object_new_int64((int64_t)(off + nb)));
        json_object_object_add(e, "dtype", json_object_new_string("F32"));
        json_object_object_add(e, "shape", s);
        json_object_object_add(e, "data_offsets", o);
        json_object_object_add(h, keel_var_name(v), e);
        off += nb;
    }
    text = json_object_to_json_string_ext(h, JSON_C_TO_STRING_PLAIN |
                                          JSON_C_TO_STRING_NOSLASHESCAPE);
    if (text == NULL) {
        json_object_put(h);
        return keel__fail(KEEL_ENOMEM, "safetensors header");
    }
    hl = strlen(text);
    pad = (8 - hl % 8) % 8;
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
        keel_var *v = keel_vars_at(xm->vs, i);
        keel_tensor *t = keel_var_tensor(v);
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        memcpy(buf + off, t->data, keel_tensor_bytes(t));
        off += keel_tensor_bytes(t);
    }
    *out = buf;
    *len = total;
    return KEEL_OK;
}

/* ---- export ------------------------------------------------------------ */

/* xm in format f to out_path, atomically; keras-h5 and onnx need xm's
 * description (the callers check). */
static keel_status
export_xmodel(const keel__xmodel *xm, const char *arch_text,
              keel_export_format f, const char *out_path)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    keel_status st;
    if (f == KEEL_EXPORT_KERAS_H5) {
        char tmp[KEEL_PATH_MAX];
        st = keel__fs_tmp_name(tmp, sizeof tmp, out_path);
        if (st != KEEL_OK)
            return st;
        keel__h5_lock();
        H5E_BEGIN_TRY {
            st = keras_h5_write(xm, tmp);
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
        st = safetensors_bytes(xm, arch_text, &buf, &len);
    else if (f == KEEL_EXPORT_ONNX)
        st = keel__onnx_bytes(xm, &buf, &len);
    else
        st = keel__fail(KEEL_EINVAL, "export: unknown format %d", (int)f);
    if (st == KEEL_OK)
        st = keel__fs_write_atomic(out_path, buf, len);
    free(buf);
    return st != KEEL_OK ? keel__wrap(st, "export to %s", out_path) : st;
}

keel_status
keel_export(keel_inference *inf, keel_export_format f, const char *out_path)
{
    if (inf == NULL || out_path == NULL)
        return keel__fail(KEEL_EINVAL, "export: NULL argument");
    return export_xmodel(&inf->xm, json_object_to_json_string_ext(
                             inf->arch, JSON_C_TO_STRING_PLAIN),
                         f, out_path);
}

/* Every variable of the checkpoint at path, restored (checksums verified,
 * slots not read) into a new store; *step its global step. */
static keel_status
checkpoint_vars(const char *path, keel_vars **out, int64_t *step)
{
    keel_ckpt_entry *e = NULL;
    keel_restore_config ro;
    keel_restore_report rep;
    keel_vars *vs = NULL;
    size_t n = 0;
    keel_status st = keel_ckpt_list(path, &e, &n);
    if (st == KEEL_OK)
        st = keel_vars_new(&vs);
    for (size_t i = 0; st == KEEL_OK && i < n; i++)
        if (e[i].slot[0] == '\0')
            st = keel_vars_create(vs, e[i].name, e[i].ndim, e[i].shape, 0,
                                  NULL);
    keel_ckpt_list_free(e);
    if (st == KEEL_OK) {
        keel_restore_config_init(&ro);
        ro.skip_slots = 1;
        st = keel_ckpt_restore(path, vs, &ro, &rep);
    }
    if (st != KEEL_OK) {
        keel_vars_free(vs);
        return st;
    }
    *step = rep.global_step;
    *out = vs;
    return KEEL_OK;
}

/* A model keel train built: an architecture with "model", or none but a
 * config (the checkpoint's or cfg) for a checkpoint of an older keel. */
static int
is_keel_model(const keel_ckpt_info *info, const keel_config *cfg)
{
    struct json_object *o, *m;
    int yes;
    if (info->architecture == NULL)
        return cfg != NULL || info->config_text != NULL;
    o = json_tokener_parse(info->architecture);
    yes = o != NULL && json_object_is_type(o, json_type_object) &&
          json_object_object_get_ex(o, "model", &m);
    json_object_put(o);
    return yes;
}

/* The variables and description of the checkpoint at path to out_path. */
static keel_status
export_checkpoint_vars(const char *path, const keel_ckpt_info *info,
                       keel_export_format f, const char *out_path)
{
    struct json_object *arch = NULL, *m;
    keel__xmodel xm;
    keel_status st;
    memset(&xm, 0, sizeof xm);
    xm.path = path;
    if (info->architecture == NULL && f != KEEL_EXPORT_SAFETENSORS)
        return keel__fail(KEEL_EINVAL, "%s has no layer description: "
                          "safetensors export works; keras-h5 and onnx "
                          "need one, stored with keel_model_desc_json() in "
                          "keel_ckpt_meta.architecture, or for a checkpoint "
                          "of keel train its job's config "
                          "(docs/export.md)", path);
    if (info->architecture != NULL &&
        (arch = json_tokener_parse(info->architecture)) == NULL)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: /meta architecture "
                          "is not JSON", path);
    st = checkpoint_vars(path, &xm.vs, &xm.step);
    if (st == KEEL_OK && arch != NULL && f != KEEL_EXPORT_SAFETENSORS) {
        st = keel__desc_check(arch, xm.vs, &xm);
        if (st != KEEL_OK)
            st = keel__wrap(st, "checkpoint %s: the layer description",
                            path);
        xm.keras_names = json_object_object_get_ex(arch, "model", &m);
    }
    if (st == KEEL_OK)
        st = export_xmodel(&xm, info->architecture, f, out_path);
    keel_vars_free(xm.vs);
    json_object_put(arch);
    return st;
}

keel_status
keel_export_checkpoint(const char *checkpoint_path, const keel_config *cfg,
                       keel_export_format f, const char *out_path)
{
    keel_ckpt_info *info = NULL;
    keel_inference *inf = NULL;
    keel_status st;
    if (checkpoint_path == NULL || out_path == NULL)
        return keel__fail(KEEL_EINVAL, "export: NULL argument");
    st = keel_ckpt_read_info(checkpoint_path, &info);
    if (st != KEEL_OK)
        return st;
    if (f != KEEL_EXPORT_SAFETENSORS && is_keel_model(info, cfg)) {
        st = keel_inference_open(checkpoint_path, cfg, 0, &inf);
        if (st == KEEL_OK)
            st = keel_export(inf, f, out_path);
        keel_inference_free(inf);
    } else {
        st = export_checkpoint_vars(checkpoint_path, info, f, out_path);
    }
    keel_ckpt_info_free(info);
    return st;
}
