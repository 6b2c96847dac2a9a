/* h5read.c - opening a checkpoint file and listing its datasets (after
 * h5bounds.c's checks), reading datasets (through the I/O engine at their
 * offsets, or through HDF5 for chunked or filtered ones), full
 * verification, and the metadata (keel_ckpt_read_info). */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>
#include <xxhash.h>

#include <keel/version.h>

#include "h5_int.h"
#include "grow.h"
#include "h5util.h"
#include "ckpt_io.h"

/* ---- reading ------------------------------------------------------------ */

static int
attr_exists(hid_t obj, const char *name)
{
    return H5Aexists(obj, name) > 0;
}

static int
attr_read_num(hid_t obj, const char *name, hid_t mtype, H5T_class_t cls,
              void *out)
{
    hid_t a, t, sp;
    int ok = 0;
    if (!attr_exists(obj, name))
        return 0;
    a = H5Aopen(obj, name, H5P_DEFAULT);
    t = a >= 0 ? H5Aget_type(a) : -1;
    sp = a >= 0 ? H5Aget_space(a) : -1;
    if (t >= 0 && sp >= 0 && H5Tget_class(t) == cls &&
        H5Sget_simple_extent_npoints(sp) == 1)
        ok = H5Aread(a, mtype, out) >= 0;
    keel__h5_close(sp);
    keel__h5_close(t);
    keel__h5_close(a);
    return ok;
}

/* A string attribute (fixed or variable length) into a malloc'd copy.
 * Returns 1 ok, 0 absent, -1 unreadable. */
static int
attr_read_str(hid_t obj, const char *name, char **out)
{
    hid_t a, t = -1, sp = -1, mt = -1;
    int rc = -1;
    *out = NULL;
    if (!attr_exists(obj, name))
        return 0;
    a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a >= 0)
        t = H5Aget_type(a);
    if (a >= 0)
        sp = H5Aget_space(a);
    if (t < 0 || sp < 0 || H5Tget_class(t) != H5T_STRING ||
        H5Sget_simple_extent_npoints(sp) != 1)
        goto out;
    if (H5Tis_variable_str(t) > 0) {
        char *v = NULL;
        mt = H5Tcopy(H5T_C_S1);
        if (mt < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 ||
            H5Aread(a, mt, &v) < 0 || v == NULL)
            goto out;
        if (strlen(v) <= CK_META_MAX_TEXT)
            *out = strdup(v);
        H5free_memory(v);
    } else {
        size_t n = H5Tget_size(t);
        char *buf;
        if (n == 0 || n > CK_META_MAX_TEXT)
            goto out;
        buf = calloc(1, n + 1);
        mt = H5Tcopy(t);
        if (buf == NULL || mt < 0 || H5Aread(a, mt, buf) < 0) {
            free(buf);
            goto out;
        }
        *out = buf;
    }
    rc = *out != NULL ? 1 : -1;
out:
    keel__h5_close(mt);
    keel__h5_close(sp);
    keel__h5_close(t);
    keel__h5_close(a);
    return rc;
}

typedef struct visit_ctx {
    ck_file *f;
    size_t cap;
    const char *prefix;       /* "/variables" or "/slots" */
    int is_slots;
    keel_status st;
    /* an index (shard_count > 0): its links, to which each virtual
     * dataset's parts are added (keel__ckpt_check_virtual) */
    int shard_count;
    ck_link **links;
    size_t *n_links, *links_cap;
} visit_ctx;

/* Room in c->f's table for one more dataset, within CK_MAX_ENTRIES. */
static keel_status
visit_grow(visit_ctx *c)
{
    ck_file *f = c->f;
    ck_dset *d;
    if (f->n >= CK_MAX_ENTRIES)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s holds more than %d "
                          "datasets", f->path, CK_MAX_ENTRIES);
    d = keel__grow(f->d, &c->cap, f->n, sizeof *d, 64);
    if (d == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint %s: dataset table",
                          f->path);
    f->d = d;
    return KEEL_OK;
}

/* d's variable name (and under /slots its slot) from the dataset's name
 * below the group: "<variable>", or "<slot>/<variable>". */
static keel_status
visit_name(const visit_ctx *c, const char *name, ck_dset *d)
{
    const char *var = name;
    if (c->is_slots) {
        const char *sl = strchr(name, '/');
        size_t n = sl != NULL ? (size_t)(sl - name) : 0;
        if (sl == NULL || n >= sizeof d->e.slot)
            return keel__fail(KEEL_ECORRUPT, "checkpoint %s: slot dataset "
                              "/slots/%s is not /slots/<slot>/<variable>",
                              c->f->path, name);
        memcpy(d->e.slot, name, n);
        d->e.slot[n] = '\0';
        var = sl + 1;
    }
    if (!keel_name_is_valid(var) || strlen(var) >= sizeof d->e.name ||
        (c->is_slots && !keel_name_is_valid(d->e.slot)))
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: %s/%s is not a "
                          "valid variable name", c->f->path, c->prefix,
                          name);
    strcpy(d->e.name, var);
    return KEEL_OK;
}

/* d's shape and element count from the dataset's type t and space sp:
 * float32 little-endian, at most KEEL_MAX_DIMS non-empty dimensions. */
static keel_status
visit_shape(const visit_ctx *c, const char *name, hid_t t, hid_t sp,
            ck_dset *d)
{
    const char *path = c->f->path;
    hsize_t dims[KEEL_MAX_DIMS + 1];
    int nd;
    if (H5Tequal(t, H5T_IEEE_F32LE) <= 0) {
        /* HDF5 checks the object header's checksum on open, so a number
         * type here is what the writer chose: the file is whole and does
         * not fit, like a shape mismatch (no fallback to an older
         * checkpoint). Anything else is damage. */
        H5T_class_t cls = H5Tget_class(t);
        if (cls == H5T_FLOAT || cls == H5T_INTEGER)
            return keel__fail(KEEL_EINVAL, "checkpoint %s: dataset %s/%s "
                              "holds %s%zu (%s-endian), not float32 "
                              "little-endian: not a keel checkpoint's "
                              "dtype; convert it to float32", path,
                              c->prefix, name,
                              cls == H5T_FLOAT ? "float" :
                              H5Tget_sign(t) == H5T_SGN_NONE ? "uint" :
                              "int", H5Tget_size(t) * 8,
                              H5Tget_order(t) == H5T_ORDER_BE ? "big" :
                              "little");
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: dataset %s/%s is "
                          "not float32 little-endian (HDF5 class %d, %zu "
                          "bytes)", path, c->prefix, name, (int)cls,
                          H5Tget_size(t));
    }
    nd = H5Sget_simple_extent_ndims(sp);
    if (nd < 0 || nd > KEEL_MAX_DIMS)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: dataset %s/%s has "
                          "%d dimensions (at most %d)", path, c->prefix,
                          name, nd, KEEL_MAX_DIMS);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    d->e.ndim = nd;
    for (int i = 0; i < KEEL_MAX_DIMS; i++)
        d->e.shape[i] = 1;
    for (int i = 0; i < nd; i++) {
        if (dims[i] < 1 || dims[i] > (hsize_t)INT64_MAX)
            return keel__fail(KEEL_ECORRUPT, "checkpoint %s: dataset %s/%s "
                              "has an empty or huge dimension", path,
                              c->prefix, name);
        d->e.shape[i] = (int64_t)dims[i];
    }
    if (keel_shape_count(nd, d->e.shape, &d->count) != KEEL_OK)
        return keel__wrap(KEEL_ECORRUPT, "checkpoint %s: dataset %s/%s",
                          path, c->prefix, name);
    return KEEL_OK;
}

/* d->offset: where the dataset's bytes start when they are one
 * unfiltered contiguous run of the whole dataset (-1 otherwise, for
 * read_via_h5), which must lie within the file. */
static keel_status
visit_offset(const visit_ctx *c, const char *name, hid_t ds, ck_dset *d)
{
    const ck_file *f = c->f;
    hid_t dcpl = H5Dget_create_plist(ds);
    d->offset = -1;
    if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS &&
        H5Pget_nfilters(dcpl) == 0 &&
        H5Dget_storage_size(ds) == (hsize_t)d->count * 4) {
        haddr_t a = H5Dget_offset(ds);
        if (a != HADDR_UNDEF && a <= (haddr_t)INT64_MAX)
            d->offset = (int64_t)a;
    }
    keel__h5_close(dcpl);
    if (d->offset >= 0 &&
        (d->offset > f->file_size ||
         (uint64_t)(f->file_size - d->offset) < (uint64_t)d->count * 4))
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s is truncated: "
                          "dataset %s/%s ends past the end of the file",
                          f->path, c->prefix, name);
    return KEEL_OK;
}

/* d's shape, checksum and offset from dataset name below obj. */
static keel_status
visit_dataset(const visit_ctx *c, hid_t obj, const char *name, ck_dset *d)
{
    hid_t ds = H5Dopen2(obj, name, H5P_DEFAULT);
    hid_t t = ds >= 0 ? H5Dget_type(ds) : -1;
    hid_t sp = ds >= 0 ? H5Dget_space(ds) : -1;
    keel_status st;
    if (t < 0 || sp < 0)
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: cannot open "
                        "dataset %s/%s", c->f->path, c->prefix, name);
    else
        st = visit_shape(c, name, t, sp, d);
    if (st == KEEL_OK) {
        char what[2 * KEEL_NAME_MAX + 32];
        hid_t dcpl = H5Dget_create_plist(ds);
        int virt = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_VIRTUAL;
        keel__h5_close(dcpl);
        snprintf(what, sizeof what, "%s/%s", c->prefix, name);
        /* An index's virtual dataset: the rows of its parts, each checked
         * with its shard; anything else: bounded by this file. */
        if (virt && c->shard_count > 0)
            st = keel__ckpt_check_virtual(c->f->path, c->shard_count, what,
                                          d->e.name, d->e.slot, ds,
                                          c->links, c->n_links,
                                          c->links_cap);
        else
            st = keel__ckpt_check_storage(c->f->path, c->f->file_size,
                                          what, ds, (uint64_t)d->count * 4);
    }
    if (st == KEEL_OK &&
        !attr_read_num(ds, "xxh64", H5T_NATIVE_UINT64, H5T_INTEGER,
                       &d->e.xxh64))
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: dataset %s/%s has "
                        "no xxh64 checksum attribute", c->f->path, c->prefix,
                        name);
    if (st == KEEL_OK)
        st = visit_offset(c, name, ds, d);
    keel__h5_close(sp);
    keel__h5_close(t);
    keel__h5_close(ds);
    return st;
}

/* H5Ovisit's callback: each dataset below the group becomes the next
 * entry of c->f's table; the first failure stops the walk (c->st). */
static herr_t
visit_cb(hid_t obj, const char *name, const H5O_info_t *info, void *op)
{
    visit_ctx *c = op;
    ck_dset *d;

    if (info->type == H5O_TYPE_GROUP)
        return 0;
    if (info->type != H5O_TYPE_DATASET) {
        c->st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: %s/%s is not a "
                           "dataset or group", c->f->path, c->prefix, name);
        return -1;
    }
    c->st = visit_grow(c);
    if (c->st != KEEL_OK)
        return -1;
    d = &c->f->d[c->f->n];
    memset(d, 0, sizeof *d);
    c->st = visit_name(c, name, d);
    if (c->st == KEEL_OK)
        c->st = visit_dataset(c, obj, name, d);
    if (c->st != KEEL_OK)
        return -1;
    c->f->n++;
    return 0;
}

int
keel__ckpt_dset_cmp(const void *a, const void *b)
{
    const ck_dset *x = a, *y = b;
    int c = strcmp(x->e.slot, y->e.slot);
    return c != 0 ? c : strcmp(x->e.name, y->e.name);
}

/* Open the file with HDF5 after checking it is a non-empty HDF5 file. */
static keel_status
open_h5(const char *path, int64_t *size, hid_t *out)
{
    struct stat sb;
    hid_t fapl;
    htri_t is;

    *out = -1;
    if (stat(path, &sb) != 0)
        return keel__fail(errno == ENOENT ? KEEL_ENOTFOUND : KEEL_EIO,
                          "checkpoint %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s is not a regular "
                          "file", path);
    if (sb.st_size == 0)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s is empty (0 bytes): "
                          "an interrupted copy or a full disk?", path);
    *size = (int64_t)sb.st_size;
    fapl = keel__ckpt_fapl();
    is = H5Fis_hdf5(path);
    if (is <= 0) {
        H5Pclose(fapl);
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s is not an HDF5 file "
                          "(no HDF5 signature)", path);
    }
    *out = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (*out < 0)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s cannot be opened by "
                          "HDF5 (truncated or damaged, %lld bytes)", path,
                          (long long)sb.st_size);
    return KEEL_OK;
}

static keel_status
read_meta_step(hid_t h, const char *path, int64_t *step)
{
    hid_t meta;
    int format = 0;
    keel_status st = KEEL_OK;
    if (H5Lexists(h, "/meta", H5P_DEFAULT) <= 0)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s has no /meta group: "
                          "not a keel checkpoint", path);
    meta = H5Gopen2(h, "/meta", H5P_DEFAULT);
    if (meta < 0 || !attr_read_num(meta, "format_version", H5T_NATIVE_INT,
                                   H5T_INTEGER, &format))
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: /meta has no "
                        "format_version", path);
    else if (format != KEEL_CKPT_FORMAT_VERSION)
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s has format version %d; "
                        "this keel reads version %d", path, format,
                        KEEL_CKPT_FORMAT_VERSION);
    else if (!attr_read_num(meta, "global_step", H5T_NATIVE_INT64,
                            H5T_INTEGER, step))
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: /meta has no "
                        "global_step", path);
    keel__h5_close(meta);
    return st;
}

/* A sharded checkpoint's identity from /meta of h into f: run_id,
 * shard_count and, in a shard file, shard_index. An ordinary checkpoint
 * has none of them (shard_count 0, shard_index -1). */
static keel_status
read_shard_meta(hid_t h, const char *path, ck_file *f)
{
    hid_t meta = H5Gopen2(h, "/meta", H5P_DEFAULT);
    int64_t count = 0, index = -1;
    keel_status st = KEEL_OK;
    f->shard_count = 0;
    f->shard_index = -1;
    if (meta < 0)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: cannot open /meta",
                          path);
    if (attr_exists(meta, "shard_count")) {
        if (!attr_read_num(meta, "shard_count", H5T_NATIVE_INT64,
                           H5T_INTEGER, &count) ||
            count < 1 || count > CK_MAX_SHARDS)
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: /meta "
                            "shard_count is unreadable or outside 1..%d",
                            path, CK_MAX_SHARDS);
        else if (!attr_read_num(meta, "run_id", H5T_NATIVE_UINT64,
                                H5T_INTEGER, &f->run_id))
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: sharded but "
                            "/meta has no run_id", path);
        else if (attr_exists(meta, "shard_index") &&
                 (!attr_read_num(meta, "shard_index", H5T_NATIVE_INT64,
                                 H5T_INTEGER, &index) ||
                  index < 0 || index >= count))
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: /meta "
                            "shard_index is unreadable or outside 0..%lld",
                            path, (long long)count - 1);
        f->shard_count = (int)count;
        f->shard_index = (int)index;
    }
    keel__h5_close(meta);
    return st;
}

/* List the datasets below group prefix ("/variables" or "/slots") of the
 * open checkpoint h into c->f (visit_cb). */
static keel_status
visit_group(hid_t h, const char *path, const char *prefix, visit_ctx *c)
{
    hid_t g = H5Gopen2(h, prefix, H5P_DEFAULT);
    keel_status st = KEEL_OK;
    c->prefix = prefix;
    if (g < 0 || H5Ovisit(g, H5_INDEX_NAME, H5_ITER_INC, visit_cb, c) < 0)
        st = c->st != KEEL_OK ? c->st :
             keel__fail(KEEL_ECORRUPT, "checkpoint %s: cannot list %s",
                        path, prefix);
    keel__h5_close(g);
    return st;
}

/* The directory part of path into dir ("." when it has none). */
static keel_status
dir_of(const char *path, char *dir, size_t size)
{
    const char *sl = strrchr(path, '/');
    if (sl == NULL)
        return keel__fmt(dir, size, "checkpoint directory", ".");
    if (sl == path)
        return keel__fmt(dir, size, "checkpoint directory", "/");
    return keel__fmt(dir, size, "checkpoint directory", "%.*s",
                     (int)(sl - path), path);
}

/* Open shard k of the index f, check that it is that shard of this very
 * checkpoint (step, run id, number and count), and append to *d (n
 * entries so far, capacity *cap) every dataset the index links into it,
 * each found in the shard; a shard holding a dataset the index does not
 * link is refused too. */
static keel_status
open_shard(ck_file *f, int k, const ck_link *links, size_t n_links,
           ck_dset **d, size_t *n, size_t *cap)
{
    char dir[KEEL_PATH_MAX], name[KEEL_NAME_MAX];
    const char *sl = strrchr(f->path, '/');
    ck_src *src = &f->srcs[k];
    ck_file s;
    size_t linked = 0;
    keel_status st = dir_of(f->path, dir, sizeof dir);
    if (st == KEEL_OK)
        st = keel__ckpt_shard_name(name, sizeof name, sl ? sl + 1 : f->path,
                                   k, f->shard_count);
    if (st == KEEL_OK)
        st = keel__path_join(src->path, sizeof src->path, dir, name);
    if (st != KEEL_OK)
        return st;
    st = keel__ckpt_open(src->path, &s);
    if (st == KEEL_ENOTFOUND)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: its shard %s is "
                          "missing; the checkpoint is incomplete", f->path,
                          src->path);
    if (st != KEEL_OK)
        return keel__wrap(st, "checkpoint %s: shard %d of %d", f->path, k,
                          f->shard_count);
    if (s.shard_index != k || s.shard_count != f->shard_count ||
        s.run_id != f->run_id || s.global_step != f->global_step) {
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s (step %lld, run "
                        "%016llx, %d shards): shard file %s is shard %d of "
                        "%d of step %lld, run %016llx; not this "
                        "checkpoint's", f->path, (long long)f->global_step,
                        (unsigned long long)f->run_id, f->shard_count,
                        src->path, s.shard_index, s.shard_count,
                        (long long)s.global_step,
                        (unsigned long long)s.run_id);
        keel__ckpt_close(&s);
        return st;
    }
    src->file_size = s.file_size;
    for (size_t i = 0; i < n_links && st == KEEL_OK; i++) {
        ck_dset key, *hit = NULL, *nd;
        if (links[i].shard != k)
            continue;
        memset(&key, 0, sizeof key);
        if (links[i].part >= 0 &&
            snprintf(key.e.name, sizeof key.e.name, "%s/part_%d",
                     links[i].name, links[i].part) >=
            (int)sizeof key.e.name) {
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: part %d of %s "
                            "has too long a name", f->path, links[i].part,
                            links[i].name);
            break;
        }
        if (links[i].part < 0)
            strcpy(key.e.name, links[i].name);
        strcpy(key.e.slot, links[i].slot);
        if (key.e.slot[0] == '\0')
            hit = bsearch(&key, s.d, s.n_vars, sizeof *s.d,
                          keel__ckpt_dset_cmp);
        else
            hit = bsearch(&key, s.d + s.n_vars, s.n - s.n_vars, sizeof *s.d,
                          keel__ckpt_dset_cmp);
        if (hit == NULL) {
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s links %s%s%s in "
                            "shard %s, which does not hold it", f->path,
                            links[i].slot, links[i].slot[0] ? "/" : "",
                            key.e.name, src->path);
            break;
        }
        if (links[i].part >= 0) {
            /* a part of a virtual dataset of the index: the shard's
             * dataset must have the rows the mapping takes */
            if (!keel_shape_equal(hit->e.ndim, hit->e.shape,
                                  links[i].ndim, links[i].shape)) {
                st = keel__fail(KEEL_ECORRUPT, "checkpoint %s maps %s%s%s "
                                "of shard %s with another shape than the "
                                "shard's", f->path, links[i].slot,
                                links[i].slot[0] ? "/" : "", key.e.name,
                                src->path);
                break;
            }
            linked++;
            continue;
        }
        if (*n >= CK_MAX_ENTRIES) {
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s holds more than "
                            "%d datasets", f->path, CK_MAX_ENTRIES);
            break;
        }
        nd = keel__grow(*d, cap, *n, sizeof *nd, 64);
        if (nd == NULL) {
            st = keel__fail(KEEL_ENOMEM, "checkpoint %s: dataset table",
                            f->path);
            break;
        }
        *d = nd;
        nd[*n] = *hit;
        nd[*n].src = k + 1;
        (*n)++;
        linked++;
    }
    if (st == KEEL_OK && linked != s.n)
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s links %zu of the %zu "
                        "datasets of its shard %s; not this checkpoint's "
                        "shard", f->path, linked, s.n, src->path);
    keel__ckpt_close(&s);
    return st;
}

/* The index f's table extended by every dataset it links into its
 * shards: variables first, then slots (keel__ckpt_open sorts each
 * part). */
static keel_status
open_shards(ck_file *f, const ck_link *links, size_t n_links)
{
    ck_dset *got = NULL, *all;
    size_t n = 0, cap = 0, m = 0, nv = 0, scap = 0;
    keel_status st = KEEL_OK;

    /* The shard table grows as shards are found (a damaged index cannot
     * make it large: the first missing shard ends the walk). */
    for (int k = 0; st == KEEL_OK && k < f->shard_count; k++) {
        ck_src *s = keel__grow(f->srcs, &scap, (size_t)k, sizeof *s, 4);
        if (s == NULL) {
            st = keel__fail(KEEL_ENOMEM, "checkpoint %s: shard table",
                            f->path);
            break;
        }
        f->srcs = s;
        memset(&f->srcs[k], 0, sizeof f->srcs[k]);
        st = open_shard(f, k, links, n_links, &got, &n, &cap);
    }
    all = st == KEEL_OK ? malloc((f->n + n + 1) * sizeof *all) : NULL;
    if (st == KEEL_OK && all == NULL)
        st = keel__fail(KEEL_ENOMEM, "checkpoint %s: dataset table",
                        f->path);
    if (st == KEEL_OK) {
        if (f->n_vars > 0)      /* f->d is NULL when the index has none */
            memcpy(all, f->d, f->n_vars * sizeof *all);
        m = f->n_vars;
        for (size_t i = 0; i < n; i++)
            if (got[i].e.slot[0] == '\0')
                all[m++] = got[i];
        nv = m;
        if (f->n > f->n_vars)
            memcpy(all + m, f->d + f->n_vars,
                   (f->n - f->n_vars) * sizeof *all);
        m += f->n - f->n_vars;
        for (size_t i = 0; i < n; i++)
            if (got[i].e.slot[0] != '\0')
                all[m++] = got[i];
        free(f->d);
        f->d = all;
        f->n_vars = nv;
        f->n = m;
    }
    free(got);
    return st;
}

keel_status
keel__ckpt_open(const char *path, ck_file *f)
{
    hid_t h = -1;
    keel_status st;
    visit_ctx c;
    ck_link *links = NULL;
    size_t n_links = 0, links_cap = 0;

    memset(f, 0, sizeof *f);
    st = keel__fmt(f->path, sizeof f->path, "checkpoint path", "%s", path);
    if (st != KEEL_OK)
        return st;
    keel__ckpt_h5_begin();
    f->shard_index = -1;
    st = open_h5(path, &f->file_size, &h);
    if (st == KEEL_OK)
        st = read_meta_step(h, path, &f->global_step);
    if (st == KEEL_OK)
        st = read_shard_meta(h, path, f);
    if (st == KEEL_OK)
        st = keel__ckpt_check_links(h, path,
                                    f->shard_index < 0 ? f->shard_count : 0,
                                    &links, &n_links);
    memset(&c, 0, sizeof c);
    c.f = f;
    c.st = KEEL_OK;
    c.shard_count = f->shard_index < 0 ? f->shard_count : 0;
    c.links = &links;
    c.n_links = &n_links;
    links_cap = n_links;
    c.links_cap = &links_cap;
    if (st == KEEL_OK) {
        if (H5Lexists(h, "/variables", H5P_DEFAULT) <= 0) {
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s has no /variables "
                            "group", path);
        } else {
            st = visit_group(h, path, "/variables", &c);
        }
    }
    f->n_vars = f->n;
    if (st == KEEL_OK && H5Lexists(h, "/slots", H5P_DEFAULT) > 0) {
        c.is_slots = 1;
        st = visit_group(h, path, "/slots", &c);
    }
    keel__h5_close(h);
    keel__ckpt_h5_end();
    if (st == KEEL_OK && f->shard_count > 0 && f->shard_index < 0)
        st = open_shards(f, links, n_links);
    free(links);
    if (st != KEEL_OK) {
        keel__ckpt_close(f);
        return st;
    }
    if (f->n > 0) {             /* f->d is NULL in an empty file */
        qsort(f->d, f->n_vars, sizeof *f->d, keel__ckpt_dset_cmp);
        qsort(f->d + f->n_vars, f->n - f->n_vars, sizeof *f->d,
              keel__ckpt_dset_cmp);
    }
    return KEEL_OK;
}

void
keel__ckpt_close(ck_file *f)
{
    if (f == NULL)
        return;
    free(f->d);
    f->d = NULL;
    f->n = f->n_vars = 0;
    free(f->srcs);
    f->srcs = NULL;
}

/* Open dataset h5name of the checkpoint file h at path; a virtual
 * dataset's sources (an index's shards) are found in path's directory
 * whatever the working directory. -1 on failure. */
static hid_t
open_dset(hid_t h, const char *path, const char *h5name)
{
    char dir[KEEL_PATH_MAX];
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS), ds = -1;
    if (dapl >= 0 && dir_of(path, dir, sizeof dir) == KEEL_OK &&
        H5Pset_virtual_prefix(dapl, dir) >= 0)
        ds = H5Dopen2(h, h5name, dapl);
    keel__h5_close(dapl);
    return ds;
}

/* Fallback for datasets whose bytes are not one contiguous run (written by
 * another tool, e.g. chunked h5py): let HDF5 read them. */
static keel_status
read_via_h5(const ck_file *f, const ck_dset *d, void *dst)
{
    char h5name[2 * KEEL_NAME_MAX + 32];
    hid_t h = -1, ds = -1;
    int64_t size;
    keel_status st;
    if (d->e.slot[0] == '\0')
        snprintf(h5name, sizeof h5name, "/variables/%s", d->e.name);
    else
        snprintf(h5name, sizeof h5name, "/slots/%s/%s", d->e.slot,
                 d->e.name);
    keel__ckpt_h5_begin();
    st = open_h5(keel__ckpt_dset_path(f, d), &size, &h);
    if (st == KEEL_OK) {
        ds = open_dset(h, keel__ckpt_dset_path(f, d), h5name);
        if (ds < 0 || H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                              H5P_DEFAULT, dst) < 0)
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: cannot read "
                            "dataset %s", keel__ckpt_dset_path(f, d), h5name);
    }
    keel__h5_close(ds);
    keel__h5_close(h);
    keel__ckpt_h5_end();
    return st;
}


keel_status
keel__ckpt_read(const ck_file *f, const ck_dset *d, void *dst)
{
    size_t bytes = d->count * sizeof(float);
    const char *path = keel__ckpt_dset_path(f, d);
    keel_status st;
    uint64_t h = 0;

    if (d->offset >= 0) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return keel__fail(KEEL_EIO, "open checkpoint %s: %s", path,
                              strerror(errno));
        st = keel__ckpt_io_read_hashed(fd, dst, NULL, bytes, d->offset,
                                       path, &h);
        close(fd);
    } else {
        st = read_via_h5(f, d, dst);
        h = XXH64(dst, bytes, 0);
    }
    if (st != KEEL_OK)
        return st;
    if (h != d->e.xxh64)
        return keel__ckpt_io_bad_hash(path, d);
    return KEEL_OK;
}

/* keel__ckpt_io_read_many over a sharded checkpoint: one pass per file
 * (the index, then each shard), each through a view of that file. */
static keel_status
read_many_sharded(const ck_file *f, const ck_read_job *jobs, size_t n)
{
    ck_read_job *sub = malloc((n + 1) * sizeof *sub);
    keel_status st = KEEL_OK;
    if (sub == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint %s: read jobs", f->path);
    for (int src = 0; src <= f->shard_count && st == KEEL_OK; src++) {
        ck_file view;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (jobs[i].d->src == src && jobs[i].d->offset >= 0)
                sub[m++] = jobs[i];
        if (m == 0)
            continue;
        keel__ckpt_src_view(f, src, &view);
        st = keel__ckpt_io_read_many(&view, sub, m);
    }
    free(sub);
    return st;
}

keel_status
keel__ckpt_read_many(const ck_file *f, const ck_read_job *jobs, size_t n)
{
    /* Datasets another tool wrote chunked or compressed: through HDF5;
     * the contiguous ones in one pass by the engine. */
    for (size_t i = 0; i < n; i++) {
        if (jobs[i].d->offset < 0) {
            keel_status st = keel__ckpt_read(f, jobs[i].d, jobs[i].dst);
            if (st != KEEL_OK)
                return st;
        }
    }
    if (f->srcs == NULL)
        return keel__ckpt_io_read_many(f, jobs, n);
    return read_many_sharded(f, jobs, n);
}

/* The xxh64 of dataset d of f, which HDF5 reads (chunked or filtered),
 * a slab of whole rows at a time through buf (size bytes), so memory
 * stays bounded whatever the dataset declares. */
static keel_status
hash_via_h5(const ck_file *f, const ck_dset *d, void *buf, size_t size,
            uint64_t *hash)
{
    char h5name[2 * KEEL_NAME_MAX + 32];
    hid_t h = -1, ds = -1, fsp = -1, msp = -1;
    hsize_t start[KEEL_MAX_DIMS] = { 0 }, cnt[KEEL_MAX_DIMS];
    size_t row = 1, rows = 1, per;
    XXH64_state_t *xs = XXH64_createState();
    int64_t fsize;
    keel_status st;

    if (xs == NULL)
        return keel__fail(KEEL_ENOMEM, "verify %s: hash state", f->path);
    XXH64_reset(xs, 0);
    if (d->e.slot[0] == '\0')
        snprintf(h5name, sizeof h5name, "/variables/%s", d->e.name);
    else
        snprintf(h5name, sizeof h5name, "/slots/%s/%s", d->e.slot,
                 d->e.name);
    for (int i = 0; i < d->e.ndim; i++) {
        cnt[i] = (hsize_t)d->e.shape[i];
        if (i > 0)
            row *= (size_t)d->e.shape[i];
    }
    if (d->e.ndim > 0)
        rows = (size_t)d->e.shape[0];
    per = size / (row * sizeof(float));
    keel__ckpt_h5_begin();
    st = open_h5(keel__ckpt_dset_path(f, d), &fsize, &h);
    if (st == KEEL_OK && (per == 0 ||
        (ds = open_dset(h, keel__ckpt_dset_path(f, d), h5name)) < 0 ||
        (fsp = H5Dget_space(ds)) < 0))
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: cannot read dataset "
                        "%s", keel__ckpt_dset_path(f, d), h5name);
    for (size_t r = 0; st == KEEL_OK && r < rows; r += per) {
        size_t k = rows - r < per ? rows - r : per;
        hsize_t m = (hsize_t)(k * row);
        int ok;
        if (d->e.ndim > 0) {
            start[0] = (hsize_t)r;
            cnt[0] = (hsize_t)k;
        }
        msp = H5Screate_simple(1, &m, NULL);
        ok = msp >= 0 &&
             (d->e.ndim == 0 ||
              H5Sselect_hyperslab(fsp, H5S_SELECT_SET, start, NULL, cnt,
                                  NULL) >= 0) &&
             H5Dread(ds, H5T_NATIVE_FLOAT, d->e.ndim == 0 ? H5S_ALL : msp,
                     d->e.ndim == 0 ? H5S_ALL : fsp, H5P_DEFAULT, buf) >= 0;
        keel__h5_close(msp);
        if (!ok)
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: cannot read "
                            "dataset %s", keel__ckpt_dset_path(f, d),
                            h5name);
        else
            XXH64_update(xs, buf, k * row * sizeof(float));
    }
    keel__h5_close(fsp);
    keel__h5_close(ds);
    keel__h5_close(h);
    keel__ckpt_h5_end();
    *hash = XXH64_digest(xs);
    XXH64_freeState(xs);
    return st;
}

/* Verify the metadata and blobs under /meta (small: read through HDF5). */
static keel_status
verify_blobs(const char *path)
{
    keel_ckpt_info *info = NULL;
    keel_status st = keel_ckpt_read_info(path, &info);
    keel_ckpt_info_free(info);
    return st;
}

keel_status
keel__ckpt_verify(const char *path, int64_t *step)
{
    ck_file f;
    keel_status st;
    void *buf = NULL;
    int fd = -1;

    st = keel__ckpt_open(path, &f);
    if (st != KEEL_OK)
        return st;
    /* Slots must match their variable's shape. */
    for (size_t i = f.n_vars; i < f.n; i++) {
        ck_dset key = f.d[i];
        ck_dset *v;
        key.e.slot[0] = '\0';
        v = bsearch(&key, f.d, f.n_vars, sizeof *f.d, keel__ckpt_dset_cmp);
        if (v != NULL && !keel_shape_equal(v->e.ndim, v->e.shape,
                                           f.d[i].e.ndim, f.d[i].e.shape)) {
            char a[64], b[64];
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: slot '%s' of "
                            "variable '%s' has shape %s, the variable %s",
                            path, f.d[i].e.slot, f.d[i].e.name,
                            keel_shape_format(a, sizeof a, f.d[i].e.ndim,
                                              f.d[i].e.shape),
                            keel_shape_format(b, sizeof b, v->e.ndim,
                                              v->e.shape));
            goto out;
        }
    }
    buf = malloc(CK_IO_CHUNK);
    if (buf == NULL) {
        st = keel__fail(KEEL_ENOMEM, "verify %s: read buffer", path);
        goto out;
    }
    /* The file itself, then each shard of an index, one file at a time. */
    for (int src = 0; src <= (f.srcs != NULL ? f.shard_count : 0) &&
                      st == KEEL_OK; src++) {
        const char *fp = src > 0 ? f.srcs[src - 1].path : path;
        fd = open(fp, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            st = keel__fail(KEEL_EIO, "open checkpoint %s: %s", fp,
                            strerror(errno));
            goto out;
        }
        for (size_t i = 0; i < f.n && st == KEEL_OK; i++) {
            const ck_dset *d = &f.d[i];
            uint64_t h = 0;
            if (d->src != src)
                continue;
            if (d->offset < 0)
                st = hash_via_h5(&f, d, buf, CK_IO_CHUNK, &h);
            else
                st = keel__ckpt_io_read_hashed(fd, NULL, buf,
                                               d->count * sizeof(float),
                                               d->offset, fp, &h);
            if (st == KEEL_OK && h != d->e.xxh64)
                st = keel__ckpt_io_bad_hash(fp, d);
        }
        close(fd);
        fd = -1;
    }
    if (st == KEEL_OK)
        st = verify_blobs(path);
    if (st == KEEL_OK && step != NULL)
        *step = f.global_step;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    keel__ckpt_close(&f);
    return st;
}

keel_status
keel_ckpt_verify(const char *path)
{
    if (path == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_verify: path is NULL");
    return keel__ckpt_verify(path, NULL);
}

/* ---- metadata ----------------------------------------------------------- */

typedef struct blob_ctx {
    keel_ckpt_info *info;
    const char *path;
    int64_t file_size;
    keel_status st;
} blob_ctx;

static herr_t
blob_read_cb(hid_t g, const char *name, const H5L_info_t *linfo, void *op)
{
    blob_ctx *c = op;
    keel_ckpt_info *info = c->info;
    hid_t d, sp;
    hssize_t n;
    uint64_t want = 0;
    void *buf;
    (void)linfo;
    if (info->n_blobs >= KEEL_CKPT_MAX_BLOBS ||
        strlen(name) >= sizeof info->blobs[0].name) {
        c->st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: too many blobs or "
                           "blob name '%s' too long", c->path, name);
        return -1;
    }
    d = H5Dopen2(g, name, H5P_DEFAULT);
    sp = d >= 0 ? H5Dget_space(d) : -1;
    n = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    keel__h5_close(sp);
    if (d >= 0 && n >= 0) {
        char what[KEEL_NAME_MAX + 32];
        snprintf(what, sizeof what, "/meta/blobs/%s", name);
        c->st = keel__ckpt_check_storage(c->path, c->file_size, what, d,
                                         (uint64_t)n);
        if (c->st != KEEL_OK) {
            keel__h5_close(d);
            return -1;
        }
    }
    if (d < 0 || n < 0 || (uint64_t)n > CK_BLOB_MAX ||
        !attr_read_num(d, "xxh64", H5T_NATIVE_UINT64, H5T_INTEGER, &want)) {
        keel__h5_close(d);
        c->st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: blob /meta/blobs/"
                           "%s is unreadable or has no xxh64", c->path, name);
        return -1;
    }
    buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf == NULL) {
        keel__h5_close(d);
        c->st = keel__fail(KEEL_ENOMEM, "checkpoint %s: blob %s (%lld "
                           "bytes)", c->path, name, (long long)n);
        return -1;
    }
    if ((n > 0 && H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL,
                          H5P_DEFAULT, buf) < 0) ||
        XXH64(buf, (size_t)n, 0) != want) {
        free(buf);
        keel__h5_close(d);
        c->st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: blob /meta/blobs/"
                           "%s fails its xxh64 checksum", c->path, name);
        return -1;
    }
    keel__h5_close(d);
    strcpy(info->blobs[info->n_blobs].name, name);
    info->blobs[info->n_blobs].data = buf;
    info->blobs[info->n_blobs].size = (size_t)n;
    info->n_blobs++;
    return 0;
}

/* /meta's attributes: wall time, keel version, the config, topology and
 * architecture texts, the epoch when there is one. */
static keel_status
read_meta_attrs(hid_t meta, const char *path, keel_ckpt_info *info)
{
    char *s = NULL;
    int rc;
    if (!attr_read_num(meta, "wall_time", H5T_NATIVE_DOUBLE, H5T_FLOAT,
                       &info->wall_time))
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: /meta has no "
                          "wall_time", path);
    rc = attr_read_str(meta, "keel_version", &s);
    if (rc > 0)
        snprintf(info->keel_version, sizeof info->keel_version, "%s", s);
    free(s);
    if (rc < 0 ||
        attr_read_str(meta, "config", &info->config_text) < 0 ||
        attr_read_str(meta, "topology", &info->topology) < 0 ||
        attr_read_str(meta, "architecture", &info->architecture) < 0)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: unreadable text "
                          "attribute under /meta", path);
    if (attr_exists(meta, "epoch") &&
        (!attr_read_num(meta, "epoch", H5T_NATIVE_INT64, H5T_INTEGER,
                        &info->epoch) || info->epoch < 0))
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: /meta epoch is not "
                          "a non-negative integer", path);
    return KEEL_OK;
}

/* Every blob under /meta/blobs, each checked against its checksum. */
static keel_status
read_blobs(hid_t meta, const char *path, int64_t file_size,
           keel_ckpt_info *info)
{
    blob_ctx c = { info, path, file_size, KEEL_OK };
    keel_status st = KEEL_OK;
    hid_t g;
    if (H5Lexists(meta, "blobs", H5P_DEFAULT) <= 0)
        return KEEL_OK;
    g = H5Gopen2(meta, "blobs", H5P_DEFAULT);
    if (g < 0 || H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL,
                            blob_read_cb, &c) < 0)
        st = c.st != KEEL_OK ? c.st : keel__fail(KEEL_ECORRUPT,
             "checkpoint %s: cannot list /meta/blobs", path);
    keel__h5_close(g);
    return st;
}

keel_status
keel_ckpt_read_info(const char *path, keel_ckpt_info **out)
{
    keel_ckpt_info *info;
    ck_file f;
    hid_t h = -1, meta = -1;
    int64_t size;
    keel_status st;

    if (path == NULL || out == NULL)
        return keel__fail(KEEL_EINVAL, "keel_ckpt_read_info: NULL argument");
    *out = NULL;
    st = keel__ckpt_open(path, &f);
    if (st != KEEL_OK)
        return st;
    info = calloc(1, sizeof *info);
    if (info == NULL) {
        keel__ckpt_close(&f);
        return keel__fail(KEEL_ENOMEM, "checkpoint info for %s", path);
    }
    info->global_step = f.global_step;
    info->n_variables = f.n_vars;
    info->n_slots = f.n - f.n_vars;
    info->format_version = KEEL_CKPT_FORMAT_VERSION;
    info->shard_count = f.shard_index < 0 ? f.shard_count : 0;
    info->run_id = f.run_id;
    keel__ckpt_close(&f);

    keel__ckpt_h5_begin();
    st = open_h5(path, &size, &h);
    if (st == KEEL_OK)
        meta = H5Gopen2(h, "/meta", H5P_DEFAULT);
    if (st == KEEL_OK && meta < 0)
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: cannot open /meta",
                        path);
    if (st == KEEL_OK)
        st = read_meta_attrs(meta, path, info);
    if (st == KEEL_OK)
        st = read_blobs(meta, path, size, info);
    keel__h5_close(meta);
    keel__h5_close(h);
    keel__ckpt_h5_end();
    if (st != KEEL_OK) {
        keel_ckpt_info_free(info);
        return st;
    }
    *out = info;
    return KEEL_OK;
}

void
keel_ckpt_info_free(keel_ckpt_info *info)
{
    if (info == NULL)
        return;
    free(info->config_text);
    free(info->topology);
    free(info->architecture);
    for (size_t i = 0; i < info->n_blobs; i++)
        free(info->blobs[i].data);
    free(info);
}

const void *
keel_ckpt_info_blob(const keel_ckpt_info *info, const char *name,
                    size_t *size)
{
    if (info == NULL || name == NULL)
        return NULL;
    for (size_t i = 0; i < info->n_blobs; i++) {
        if (strcmp(info->blobs[i].name, name) == 0) {
            if (size != NULL)
                *size = info->blobs[i].size;
            /* A zero-size blob still has a non-NULL (1-byte) buffer. */
            return info->blobs[i].data;
        }
    }
    return NULL;
}
