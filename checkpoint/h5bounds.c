/* h5bounds.c - what a checkpoint file may point at: its links (external
 * links only to the checkpoint's own files, no dangling soft links) and
 * each dataset's storage (no external or virtual data elsewhere, no more
 * bytes declared than the file can hold), checked before anything is
 * allocated or read. */
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

/* A filtered (compressed) dataset may declare at most this many times the
 * bytes it stores: deflate, the filter HDF5 always has, cannot expand
 * more than about 1032-fold, so a larger claim is a damaged or hostile
 * file, refused before anything is allocated for it. */
#define CK_MAX_EXPANSION ((uint64_t)1100)
/* The longest external link value (file and object name) read. */
#define CK_ELINK_MAX ((size_t)2 * KEEL_PATH_MAX)

/* ---- what a checkpoint may point at ------------------------------------ */

/* 1 when target, a file named inside the checkpoint at path (an external
 * link's file, an external storage file, a virtual dataset's source), is
 * one of that checkpoint's own files: the checkpoint file itself. A
 * relative target is taken from the checkpoint's directory; "." is the
 * file itself (a virtual dataset's own-file name). */
static int
own_file(const char *path, const char *target)
{
    char full[KEEL_PATH_MAX], a[PATH_MAX], b[PATH_MAX];
    const char *sl = strrchr(path, '/');
    int n;
    if (strcmp(target, ".") == 0)
        return 1;
    if (target[0] == '/' || sl == NULL)
        n = snprintf(full, sizeof full, "%s", target);
    else
        n = snprintf(full, sizeof full, "%.*s/%s", (int)(sl - path), path,
                     target);
    if (n < 0 || (size_t)n >= sizeof full)
        return 0;
    return realpath(full, a) != NULL && realpath(path, b) != NULL &&
           strcmp(a, b) == 0;
}

/* A walk over every link of a checkpoint file: pass 0 refuses external
 * and user-defined links to anything but the checkpoint's own files (an
 * index's links into its shards are collected), pass 1 (once no link
 * leaves the file) refuses dangling soft links. */
typedef struct link_ctx {
    const char *path;
    int pass;
    keel_status st;
    int shard_count;
    ck_link *links;
    size_t n_links, cap;
} link_ctx;

keel_status
keel__ckpt_shard_name(char *out, size_t size, const char *index_name, int k,
                      int n)
{
    size_t len = strlen(index_name);
    if (len < 4 || strcmp(index_name + len - 3, ".h5") != 0)
        return keel__fail(KEEL_EINVAL, "checkpoint name '%s' does not end "
                          "in .h5", index_name);
    return keel__fmt(out, size, "shard name", "%.*s.shard-%05d-of-%05d.h5",
                     (int)(len - 3), index_name, k, n);
}

const char *
keel__ckpt_dset_path(const ck_file *f, const ck_dset *d)
{
    return d->src > 0 ? f->srcs[d->src - 1].path : f->path;
}

void
keel__ckpt_src_view(const ck_file *f, int src, ck_file *view)
{
    memset(view, 0, sizeof *view);
    if (src > 0) {
        memcpy(view->path, f->srcs[src - 1].path, sizeof view->path);
        view->file_size = f->srcs[src - 1].file_size;
    } else {
        memcpy(view->path, f->path, sizeof view->path);
        view->file_size = f->file_size;
    }
    view->global_step = f->global_step;
    view->shard_index = -1;
}

/* The shard number when file (an external link's target file) is one of
 * the shards of the index at path: exactly keel__ckpt_shard_name of the
 * index's file name, no directory part; else -1. */
static int
shard_of(const char *path, int shard_count, const char *file)
{
    const char *sl = strrchr(path, '/'), *base = sl != NULL ? sl + 1 : path;
    const char *tail = strstr(file, ".shard-");
    char want[KEEL_NAME_MAX];
    long k;
    if (shard_count <= 0 || strchr(file, '/') != NULL || tail == NULL)
        return -1;
    k = strtol(tail + 7, NULL, 10);
    if (k < 0 || k >= shard_count ||
        keel__ckpt_shard_name(want, sizeof want, base, (int)k,
                              shard_count) != KEEL_OK ||
        strcmp(want, file) != 0)
        return -1;
    return (int)k;
}

/* Record the link name (below the root: "variables/<var>" or
 * "slots/<slot>/<var>") of c's index into shard k, whose target object
 * obj must be the same dataset path. 0 when it is not one. */
static int
add_shard_link(link_ctx *c, const char *name, const char *obj, int k)
{
    ck_link *l;
    const char *var = NULL, *slot = "";
    size_t slot_len = 0;
    if (obj == NULL || obj[0] != '/' || strcmp(obj + 1, name) != 0)
        return 0;
    if (strncmp(name, "variables/", 10) == 0) {
        var = name + 10;
    } else if (strncmp(name, "slots/", 6) == 0) {
        const char *s2 = strchr(name + 6, '/');
        if (s2 == NULL)
            return 0;
        slot = name + 6;
        slot_len = (size_t)(s2 - slot);
        var = s2 + 1;
    }
    if (var == NULL || strlen(var) >= KEEL_NAME_MAX ||
        slot_len >= KEEL_NAME_MAX || c->n_links >= CK_MAX_ENTRIES)
        return 0;
    l = keel__grow(c->links, &c->cap, c->n_links, sizeof *l, 64);
    if (l == NULL)
        return 0;
    c->links = l;
    l = &c->links[c->n_links++];
    memset(l, 0, sizeof *l);
    l->part = -1;
    strcpy(l->name, var);
    memcpy(l->slot, slot, slot_len);
    l->shard = k;
    return 1;
}

static herr_t
link_cb(hid_t g, const char *name, const H5L_info_t *li, void *op)
{
    link_ctx *c = op;
    if (li->type == H5L_TYPE_HARD)
        return 0;
    if (li->type == H5L_TYPE_SOFT) {
        if (c->pass == 1 && H5Oexists_by_name(g, name, H5P_DEFAULT) <= 0) {
            c->st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: /%s is a "
                               "dangling soft link", c->path, name);
            return -1;
        }
        return 0;
    }
    if (c->pass == 1)
        return 0;
    if (li->type == H5L_TYPE_EXTERNAL) {
        char *val = NULL;
        const char *file = NULL, *obj = NULL;
        unsigned flags;
        int ok = li->u.val_size > 0 && li->u.val_size <= CK_ELINK_MAX &&
                 (val = calloc(1, li->u.val_size + 1)) != NULL &&
                 H5Lget_val(g, name, val, li->u.val_size, H5P_DEFAULT) >= 0 &&
                 H5Lunpack_elink_val(val, li->u.val_size, &flags, &file,
                                     &obj) >= 0 && file != NULL;
        if (ok && own_file(c->path, file)) {
            free(val);
            return 0;
        }
        if (ok) {
            int k = shard_of(c->path, c->shard_count, file);
            if (k >= 0 && add_shard_link(c, name, obj, k)) {
                free(val);
                return 0;
            }
        }
        c->st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: /%s is an external "
                           "link to %s%s%s, outside the checkpoint's own "
                           "files and shards; refused", c->path, name,
                           ok ? file : "an unreadable target",
                           ok && obj != NULL ? ":" : "",
                           ok && obj != NULL ? obj : "");
        free(val);
        return -1;
    }
    c->st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: /%s is a user-defined "
                       "link (type %d); refused", c->path, name,
                       (int)li->type);
    return -1;
}

/* Every link of the open checkpoint h stays within its own files and
 * resolves. */
keel_status
keel__ckpt_check_links(hid_t h, const char *path, int shard_count,
                       ck_link **links, size_t *n_links)
{
    link_ctx c = { .path = path, .st = KEEL_OK,
                   .shard_count = shard_count };
    keel_status st = KEEL_OK;
    for (c.pass = 0; c.pass < 2 && st == KEEL_OK; c.pass++)
        if (H5Lvisit(h, H5_INDEX_NAME, H5_ITER_INC, link_cb, &c) < 0)
            st = c.st != KEEL_OK ? c.st :
                 keel__fail(KEEL_ECORRUPT, "checkpoint %s: cannot list its "
                            "links (damaged HDF5 metadata)", path);
    *links = c.links;
    *n_links = c.n_links;
    return st;
}

/* Dataset ds (what: its name for messages) of the checkpoint path,
 * file_size bytes long, declaring bytes bytes of data: its storage is in
 * the checkpoint's own files (no external storage file, no virtual
 * source elsewhere) and can hold what it declares (unfiltered: all of
 * it; filtered: at most CK_MAX_EXPANSION times what it stores). Checked
 * before anything of that size is allocated. */
keel_status
keel__ckpt_check_storage(const char *path, int64_t file_size,
                         const char *what, hid_t ds, uint64_t bytes)
{
    hid_t dcpl = H5Dget_create_plist(ds);
    keel_status st = KEEL_OK;
    H5D_layout_t layout;
    int n_ext, n_filters;
    uint64_t stored, limit;

    if (dcpl < 0)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: dataset %s has no "
                          "readable creation properties", path, what);
    layout = H5Pget_layout(dcpl);
    n_ext = H5Pget_external_count(dcpl);
    n_filters = H5Pget_nfilters(dcpl);
    for (int i = 0; i < n_ext && st == KEEL_OK; i++) {
        char name[KEEL_PATH_MAX] = "";
        off_t off;
        hsize_t size;
        if (H5Pget_external(dcpl, (unsigned)i, sizeof name, name, &off,
                            &size) < 0 || !own_file(path, name))
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: dataset %s keeps "
                            "its data in external file '%s', outside the "
                            "checkpoint's own files; refused", path, what,
                            name);
    }
    if (st == KEEL_OK && layout == H5D_VIRTUAL) {
        size_t nv = 0;
        if (H5Pget_virtual_count(dcpl, &nv) < 0)
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: virtual dataset "
                            "%s has unreadable mappings", path, what);
        for (size_t i = 0; i < nv && st == KEEL_OK; i++) {
            char name[KEEL_PATH_MAX] = "";
            ssize_t len = H5Pget_virtual_filename(dcpl, i, name,
                                                  sizeof name);
            if (len < 0 || (size_t)len >= sizeof name ||
                !own_file(path, name))
                st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: virtual "
                                "dataset %s maps data from '%s', outside "
                                "the checkpoint's own files; refused", path,
                                what, name);
        }
    }
    keel__h5_close(dcpl);
    if (st != KEEL_OK)
        return st;
    /* Virtual and external data is bounded by the file itself. */
    stored = layout == H5D_VIRTUAL || n_ext > 0 ? (uint64_t)file_size
                                                : H5Dget_storage_size(ds);
    if (stored > (uint64_t)file_size)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: dataset %s claims "
                          "%llu stored bytes in a file of %lld bytes", path,
                          what, (unsigned long long)stored,
                          (long long)file_size);
    limit = n_filters > 0 || layout == H5D_VIRTUAL ?
            stored * CK_MAX_EXPANSION : stored;
    if (bytes > limit)
        return keel__fail(KEEL_ECORRUPT, "checkpoint %s: dataset %s declares "
                          "%llu bytes but the file holds %llu bytes of it%s; "
                          "truncated or damaged", path, what,
                          (unsigned long long)bytes,
                          (unsigned long long)stored,
                          n_filters > 0 ? " (compressed, more than the "
                          "largest expansion a filter gives)" : "");
    return KEEL_OK;
}

/* One mapping of a virtual dataset, checked by keel__ckpt_check_virtual. */
typedef struct vmap {
    int shard, part;
    int64_t first, rows;
} vmap;

static int
vmap_cmp(const void *a, const void *b)
{
    const vmap *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

/* Mapping i of dcpl into *m: its source is shard_of the index path, the
 * dataset "<h5name>/part_<k>" there, all of it, of ndim dimensions with
 * dims' trailing ones; its virtual selection one block of whole rows of
 * dims. 0 when it is anything else. */
static int
vmap_read(hid_t dcpl, size_t i, const char *path, int shard_count,
          const char *h5name, int ndim, const hsize_t *dims, vmap *m)
{
    char file[KEEL_NAME_MAX] = "", obj[2 * KEEL_NAME_MAX + 48] = "";
    hsize_t vd[KEEL_MAX_DIMS + 1];
    hsize_t lo[KEEL_MAX_DIMS + 1], hi[KEEL_MAX_DIMS + 1];
    hid_t ssp = -1, vsp = -1;
    size_t hl = strlen(h5name);
    ssize_t fl = H5Pget_virtual_filename(dcpl, i, file, sizeof file);
    ssize_t ol = H5Pget_virtual_dsetname(dcpl, i, obj, sizeof obj);
    char *end;
    long k;
    int ok = fl > 0 && (size_t)fl < sizeof file && ol > 0 &&
             (size_t)ol < sizeof obj;
    if (ok) {
        m->shard = shard_of(path, shard_count, file);
        ok = m->shard >= 0 && strncmp(obj, h5name, hl) == 0 &&
             strncmp(obj + hl, "/part_", 6) == 0 &&
             obj[hl + 6] >= '0' && obj[hl + 6] <= '9' &&
             (obj[hl + 6] != '0' || obj[hl + 7] == '\0');
    }
    if (ok) {
        k = strtol(obj + hl + 6, &end, 10);
        ok = *end == '\0' && k >= 0 && k < CK_MAX_VIRTUAL;
        m->part = (int)k;
    }
    if (ok) {
        ssp = H5Pget_virtual_srcspace(dcpl, i);
        vsp = H5Pget_virtual_vspace(dcpl, i);
        ok = ssp >= 0 && vsp >= 0 &&
             H5Sget_select_type(ssp) == H5S_SEL_ALL &&
             H5Sget_simple_extent_ndims(vsp) == ndim &&
             H5Sget_simple_extent_dims(vsp, vd, NULL) == ndim &&
             H5Sget_select_type(vsp) == H5S_SEL_HYPERSLABS &&
             H5Sget_select_bounds(vsp, lo, hi) >= 0;
    }
    /* one box of whole rows; the source (all of it, an extent HDF5 keeps
     * only in the source file) is checked to have exactly that shape when
     * its shard is opened */
    for (int d = 0; ok && d < ndim; d++)
        ok = vd[d] == dims[d] && hi[d] >= lo[d] && hi[d] < dims[d] &&
             (d == 0 || (lo[d] == 0 && hi[d] == dims[d] - 1));
    if (ok) {
        hsize_t box = 1;
        for (int d = 0; d < ndim; d++)
            box *= hi[d] - lo[d] + 1;
        ok = H5Sget_select_npoints(vsp) == (hssize_t)box;
        m->first = (int64_t)lo[0];
        m->rows = (int64_t)(hi[0] - lo[0] + 1);
    }
    keel__h5_close(ssp);
    keel__h5_close(vsp);
    return ok;
}

keel_status
keel__ckpt_check_virtual(const char *path, int shard_count, const char *what,
                         const char *var, const char *slot, hid_t ds,
                         ck_link **links, size_t *n_links, size_t *cap)
{
    hid_t dcpl = H5Dget_create_plist(ds), sp = H5Dget_space(ds);
    hsize_t dims[KEEL_MAX_DIMS + 1];
    size_t nv = 0;
    vmap *m = NULL;
    int ndim = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    int64_t next = 0;
    keel_status st = KEEL_OK;

    if (dcpl < 0 || ndim < 1 || ndim > KEEL_MAX_DIMS ||
        H5Sget_simple_extent_dims(sp, dims, NULL) != ndim ||
        H5Pget_virtual_count(dcpl, &nv) < 0 || nv < 2 ||
        nv > CK_MAX_VIRTUAL || shard_count <= 0 ||
        (m = calloc(nv, sizeof *m)) == NULL)
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: virtual dataset %s "
                        "is not the rows of 2..%d parts in the index's "
                        "shards; refused", path, what, CK_MAX_VIRTUAL);
    for (size_t i = 0; i < nv && st == KEEL_OK; i++) {
        char file[KEEL_NAME_MAX] = "";
        if (!vmap_read(dcpl, i, path, shard_count, what, ndim, dims,
                       &m[i])) {
            (void)H5Pget_virtual_filename(dcpl, i, file, sizeof file);
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: virtual dataset "
                            "%s maps data from '%s', which is not whole "
                            "rows of '%s/part_<k>' in one of the index's "
                            "own shards; refused", path, what, file, what);
        }
    }
    if (st == KEEL_OK)
        qsort(m, nv, sizeof *m, vmap_cmp);
    for (size_t i = 0; i < nv && st == KEEL_OK; i++) {
        if (m[i].first != next || m[i].part != (int)i)
            st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: virtual dataset "
                            "%s: its part %d maps rows from %lld, not %lld "
                            "(parts overlap, leave a gap or are out of "
                            "order); refused", path, what, m[i].part,
                            (long long)m[i].first, (long long)next);
        next += m[i].rows;
    }
    if (st == KEEL_OK && (uint64_t)next != (uint64_t)dims[0])
        st = keel__fail(KEEL_ECORRUPT, "checkpoint %s: virtual dataset %s "
                        "maps %lld of its %llu rows; refused", path, what,
                        (long long)next, (unsigned long long)dims[0]);
    for (size_t i = 0; i < nv && st == KEEL_OK; i++) {
        ck_link *l = keel__grow(*links, cap, *n_links, sizeof *l, 64);
        if (l == NULL || *n_links >= CK_MAX_ENTRIES) {
            st = keel__fail(l == NULL ? KEEL_ENOMEM : KEEL_ECORRUPT,
                            "checkpoint %s: too many links", path);
            break;
        }
        *links = l;
        l = &l[(*n_links)++];
        memset(l, 0, sizeof *l);
        snprintf(l->name, sizeof l->name, "%s", var);
        snprintf(l->slot, sizeof l->slot, "%s", slot);
        l->shard = m[i].shard;
        l->part = m[i].part;
        l->n_parts = (int)nv;
        l->first = m[i].first;
        l->ndim = ndim;
        for (int d = 0; d < KEEL_MAX_DIMS; d++)
            l->shape[d] = d < ndim ? (int64_t)dims[d] : 1;
        l->shape[0] = m[i].rows;
    }
    free(m);
    keel__h5_close(sp);
    keel__h5_close(dcpl);
    return st;
}
