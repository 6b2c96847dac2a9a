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
