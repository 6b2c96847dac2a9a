/* h5layout.c - the checkpoint file's HDF5 layout and its writing: the
 * /meta attributes, the /variables and /slots datasets with their xxh64
 * attributes, the blobs, and the whole-file write (temp file, fsync,
 * rename). HDF5 (not thread-safe in Debian's build) is used for metadata
 * only, under keel__h5_lock(); datasets are contiguous and allocated
 * early, so their bytes are written and read by the I/O engine
 * (ckpt_io.c) at their file offsets, outside the lock. Reading is
 * h5read.c, what a file may point at h5bounds.c. */
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

#define CK_ALIGN_THRESHOLD ((hsize_t)64 << 10)
#define CK_ALIGN ((hsize_t)4096)
/* HDF5 metadata (object headers, attributes) is allocated from blocks of
 * this size, so a checkpoint's metadata sits together at the head of the
 * file instead of one piece before each dataset: a cold open reads it in
 * one go, not with a disk seek per variable. */
#define CK_META_BLOCK ((hsize_t)64 << 10)
#define CK_LATE_HASH_BYTES ((size_t)4 << 20)
#define CK_DIRECT_BYTES ((size_t)4 << 20)  /* smaller files: page cache */

keel_status
keel__ckpt_plan_add(ck_plan *p, const char *name, const char *slot,
                    const keel_tensor *t, const void *data)
{
    ck_item *items = keel__grow(p->items, &p->cap, p->n, sizeof *items, 64);
    ck_item *it;
    if (items == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint plan");
    p->items = items;
    it = &p->items[p->n++];
    memset(it, 0, sizeof *it);
    it->name = name;
    it->slot = slot;
    it->ndim = t->ndim;
    memcpy(it->shape, t->shape, sizeof it->shape);
    it->data = data;
    it->bytes = keel_tensor_bytes(t);
    return KEEL_OK;
}

/* Lock HDF5 and switch its error printing off (libkeel never prints). */
void
keel__ckpt_h5_begin(void)
{
    keel__h5_lock();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

void
keel__ckpt_h5_end(void)
{
    keel__h5_unlock();
}

hid_t
keel__ckpt_fapl(void)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0)
        return -1;
    if (H5Pset_fapl_sec2(fapl) < 0 ||
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0 ||
        H5Pset_alignment(fapl, CK_ALIGN_THRESHOLD, CK_ALIGN) < 0 ||
        H5Pset_meta_block_size(fapl, CK_META_BLOCK) < 0 ||
        H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0 ||
        H5Pset_file_locking(fapl, 0, 1) < 0) {
        H5Pclose(fapl);
        return -1;
    }
    return fapl;
}

/* ---- writing ------------------------------------------------------------ */

static int
attr_write(hid_t obj, const char *name, hid_t ftype, hid_t mtype,
           const void *val)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = sp >= 0 ? H5Acreate2(obj, name, ftype, sp, H5P_DEFAULT,
                                   H5P_DEFAULT) : -1;
    int ok = a >= 0 && H5Awrite(a, mtype, val) >= 0;
    keel__h5_close(a);
    keel__h5_close(sp);
    return ok;
}

/* A fixed-length, NUL-padded byte string (h5py reads it as bytes). */
static int
attr_write_str(hid_t obj, const char *name, const char *val)
{
    size_t n = strlen(val);
    hid_t t = H5Tcopy(H5T_C_S1);
    int ok = t >= 0 && H5Tset_size(t, n > 0 ? n : 1) >= 0 &&
             H5Tset_strpad(t, H5T_STR_NULLPAD) >= 0 &&
             H5Tset_cset(t, H5T_CSET_UTF8) >= 0;
    if (ok) {
        char zero = '\0';
        ok = attr_write(obj, name, t, t, n > 0 ? val : &zero);
    }
    keel__h5_close(t);
    return ok;
}

static keel_status end_write(hid_t f, hid_t fapl, const char *tmp,
                             keel_status st);

/* Create one dataset (early-allocated, contiguous, never filled) with its
 * checksum attribute; *offset receives where its bytes go. */
static keel_status
create_dset(hid_t parent, const char *h5name, hid_t ftype, int ndim,
            const int64_t *shape, uint64_t hash, int64_t *offset,
            const char *path)
{
    hsize_t dims[KEEL_MAX_DIMS];
    hid_t sp, dcpl = -1, lcpl = -1, d = -1;
    haddr_t addr;
    keel_status st = KEEL_OK;

    for (int i = 0; i < ndim; i++)
        dims[i] = (hsize_t)shape[i];
    sp = ndim == 0 ? H5Screate(H5S_SCALAR)
                   : H5Screate_simple(ndim, dims, NULL);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (sp < 0 || dcpl < 0 || lcpl < 0 ||
        H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0 ||
        H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0 ||
        H5Pset_create_intermediate_group(lcpl, 1) < 0) {
        st = keel__fail(KEEL_EIO, "HDF5 property setup failed for %s in %s",
                        h5name, path);
        goto out;
    }
    d = H5Dcreate2(parent, h5name, ftype, sp, lcpl, dcpl, H5P_DEFAULT);
    if (d < 0) {
        st = keel__fail(KEEL_EIO, "cannot create dataset %s in %s (a name "
                        "used both as a variable and as a prefix of "
                        "another, or out of space)", h5name, path);
        goto out;
    }
    if (!attr_write(d, "xxh64", H5T_STD_U64LE, H5T_NATIVE_UINT64, &hash)) {
        st = keel__fail(KEEL_EIO, "cannot write the xxh64 attribute of %s "
                        "in %s", h5name, path);
        goto out;
    }
    addr = H5Dget_offset(d);
    *offset = addr == HADDR_UNDEF ? -1 : (int64_t)addr;
out:
    keel__h5_close(d);
    keel__h5_close(lcpl);
    keel__h5_close(dcpl);
    keel__h5_close(sp);
    return st;
}

/* A sharded checkpoint's identity: run_id and shard_count, and in a shard
 * file its shard_index. 1 on success. */
static int
write_shard_meta(hid_t meta, const ck_plan *p)
{
    int64_t count = p->shard_count, index = p->shard_index;
    return attr_write(meta, "run_id", H5T_STD_U64LE, H5T_NATIVE_UINT64,
                      &p->run_id) &&
           attr_write(meta, "shard_count", H5T_STD_I64LE, H5T_NATIVE_INT64,
                      &count) &&
           (index < 0 ||
            attr_write(meta, "shard_index", H5T_STD_I64LE,
                       H5T_NATIVE_INT64, &index));
}

/* The virtual dataset of a partitioned variable in an index: l[0] .. l[K-1]
 * are its parts (l->n_parts), each mapped from its shard's
 * "<name>/part_<k>" (all of it, the file named relative to the index) onto
 * its rows; the xxh64 attribute is the whole dataset's (l->hash). */
static keel_status
write_virtual(hid_t f, const ck_plan *p, const ck_link *l, const char *name,
              const char *tmp)
{
    char h5name[2 * KEEL_NAME_MAX + 32], src[2 * KEEL_NAME_MAX + 48];
    char file[KEEL_NAME_MAX];
    hsize_t dims[KEEL_MAX_DIMS], start[KEEL_MAX_DIMS] = { 0 };
    hsize_t pd[KEEL_MAX_DIMS];
    hid_t sp = -1, dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), d = -1;
    int ndim = l->ndim;
    keel_status st = KEEL_OK;

    for (int i = 0; i < ndim; i++)
        dims[i] = (hsize_t)l->shape[i];
    dims[0] = 0;
    for (int j = 0; j < l->n_parts; j++)
        dims[0] += (hsize_t)l[j].shape[0];
    if (l->slot[0] == '\0')
        st = keel__fmt(h5name, sizeof h5name, "dataset name",
                       "/variables/%s", l->name);
    else
        st = keel__fmt(h5name, sizeof h5name, "dataset name",
                       "/slots/%s/%s", l->slot, l->name);
    sp = H5Screate_simple(ndim, dims, NULL);
    if (st == KEEL_OK && (sp < 0 || dcpl < 0 || lcpl < 0 ||
                          H5Pset_create_intermediate_group(lcpl, 1) < 0))
        st = keel__fail(KEEL_EIO, "HDF5 property setup failed for %s in %s",
                        h5name, tmp);
    for (int j = 0; j < l->n_parts && st == KEEL_OK; j++) {
        hid_t vsp = H5Scopy(sp), ssp;
        for (int i = 0; i < ndim; i++)
            pd[i] = (hsize_t)l[j].shape[i];
        start[0] = (hsize_t)l[j].first;
        ssp = H5Screate_simple(ndim, pd, NULL);
        st = keel__ckpt_shard_name(file, sizeof file, name, l[j].shard,
                                   p->shard_count);
        if (st == KEEL_OK)
            st = keel__fmt(src, sizeof src, "dataset name", "%s/part_%d",
                           h5name, l[j].part);
        if (st == KEEL_OK &&
            (vsp < 0 || ssp < 0 ||
             H5Sselect_hyperslab(vsp, H5S_SELECT_SET, start, NULL, pd,
                                 NULL) < 0 ||
             H5Pset_virtual(dcpl, vsp, file, src, ssp) < 0))
            st = keel__fail(KEEL_EIO, "cannot map %s of %s onto rows of %s "
                            "in %s", src, file, h5name, tmp);
        keel__h5_close(ssp);
        keel__h5_close(vsp);
    }
    if (st == KEEL_OK) {
        d = H5Dcreate2(f, h5name, H5T_IEEE_F32LE, sp, lcpl, dcpl,
                       H5P_DEFAULT);
        if (d < 0)
            st = keel__fail(KEEL_EIO, "cannot create virtual dataset %s in "
                            "%s", h5name, tmp);
    }
    if (st == KEEL_OK &&
        !attr_write(d, "xxh64", H5T_STD_U64LE, H5T_NATIVE_UINT64, &l->hash))
        st = keel__fail(KEEL_EIO, "cannot write the xxh64 attribute of %s "
                        "in %s", h5name, tmp);
    keel__h5_close(d);
    keel__h5_close(lcpl);
    keel__h5_close(dcpl);
    keel__h5_close(sp);
    return st;
}

/* An index's external links: /variables/<name> and /slots/<slot>/<name>
 * of each link to the same path in its shard's file, named relative to
 * the index (name: the index's file name). */
static keel_status
write_links(hid_t f, const ck_plan *p, const char *name, const char *tmp)
{
    char h5name[2 * KEEL_NAME_MAX + 32], file[KEEL_NAME_MAX];
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    keel_status st = KEEL_OK;
    if (lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0)
        st = keel__fail(KEEL_EIO, "cannot create links in %s", tmp);
    for (size_t i = 0; i < p->n_links && st == KEEL_OK; i++) {
        const ck_link *l = &p->links[i];
        if (l->part >= 0) {
            if (l->part == 0)
                st = write_virtual(f, p, l, name, tmp);
            continue;
        }
        st = keel__ckpt_shard_name(file, sizeof file, name, l->shard,
                                   p->shard_count);
        if (st == KEEL_OK && l->slot[0] == '\0')
            st = keel__fmt(h5name, sizeof h5name, "dataset name",
                           "/variables/%s", l->name);
        else if (st == KEEL_OK)
            st = keel__fmt(h5name, sizeof h5name, "dataset name",
                           "/slots/%s/%s", l->slot, l->name);
        if (st == KEEL_OK &&
            H5Lcreate_external(file, h5name, f, h5name, lcpl,
                               H5P_DEFAULT) < 0)
            st = keel__fail(KEEL_EIO, "cannot link %s of %s to shard %s",
                            h5name, tmp, file);
    }
    keel__h5_close(lcpl);
    return st;
}

/* The /variables and /slots groups, and /meta with its attributes into
 * *meta (closed by the caller, also on failure). */
static keel_status
write_meta(hid_t f, const ck_plan *p, const char *tmp, hid_t *meta)
{
    int format = KEEL_CKPT_FORMAT_VERSION;
    hid_t g;
    *meta = H5Gcreate2(f, "/meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    g = H5Gcreate2(f, "/variables", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    keel__h5_close(g);
    g = H5Gcreate2(f, "/slots", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    keel__h5_close(g);
    if (*meta < 0 ||
        !attr_write(*meta, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT,
                    &format) ||
        !attr_write_str(*meta, "keel_version", keel_version()) ||
        !attr_write(*meta, "global_step", H5T_STD_I64LE, H5T_NATIVE_INT64,
                    &p->step) ||
        !attr_write(*meta, "wall_time", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                    &p->wall_time) ||
        (p->config_text != NULL &&
         !attr_write_str(*meta, "config", p->config_text)) ||
        (p->topology != NULL &&
         !attr_write_str(*meta, "topology", p->topology)) ||
        (p->architecture != NULL &&
         !attr_write_str(*meta, "architecture", p->architecture)) ||
        (p->epoch > 0 &&
         !attr_write(*meta, "epoch", H5T_STD_I64LE, H5T_NATIVE_INT64,
                     &p->epoch)) ||
        (p->shard_count > 0 && !write_shard_meta(*meta, p)))
        return keel__fail(KEEL_EIO, "cannot write /meta attributes of %s",
                          tmp);
    return KEEL_OK;
}

/* One dataset per variable and slot, under /variables/<name> and
 * /slots/<slot>/<name>; pieces[i] gets item i's bytes and offset. */
static keel_status
write_items(hid_t f, const ck_plan *p, const char *tmp, ck_piece *pieces)
{
    char h5name[2 * KEEL_NAME_MAX + 32];
    keel_status st;
    for (size_t i = 0; i < p->n; i++) {
        const ck_item *it = &p->items[i];
        if (it->slot == NULL)
            st = keel__fmt(h5name, sizeof h5name, "dataset name",
                           "/variables/%s", it->name);
        else
            st = keel__fmt(h5name, sizeof h5name, "dataset name",
                           "/slots/%s/%s", it->slot, it->name);
        if (st == KEEL_OK)
            st = create_dset(f, h5name, H5T_IEEE_F32LE, it->ndim,
                             it->shape, it->hash, &pieces[i].offset, tmp);
        if (st != KEEL_OK)
            return st;
        pieces[i].data = it->data;
        pieces[i].bytes = it->bytes;
        pieces[i].what = it->name;
    }
    return KEEL_OK;
}

/* An empty blob: a dataset of shape (0,) with its checksum, nothing to
 * write. */
static keel_status
write_empty_blob(hid_t g, const keel_ckpt_blob *b, uint64_t hash,
                 const char *tmp)
{
    hsize_t zero = 0;
    hid_t sp = H5Screate_simple(1, &zero, NULL);
    hid_t d = sp >= 0 ? H5Dcreate2(g, b->name, H5T_STD_U8LE, sp,
                                   H5P_DEFAULT, H5P_DEFAULT,
                                   H5P_DEFAULT) : -1;
    int ok = d >= 0 && attr_write(d, "xxh64", H5T_STD_U64LE,
                                  H5T_NATIVE_UINT64, &hash);
    keel__h5_close(d);
    keel__h5_close(sp);
    if (!ok)
        return keel__fail(KEEL_EIO, "cannot create blob %s in %s", b->name,
                          tmp);
    return KEEL_OK;
}

/* One uint8 dataset per blob under /meta/blobs; pieces[i] gets blob i's
 * bytes and offset (none for an empty blob). */
static keel_status
write_blobs(hid_t meta, const ck_plan *p, const char *tmp, ck_piece *pieces)
{
    keel_status st = KEEL_OK;
    hid_t g = -1;
    if (p->n_blobs > 0) {
        g = H5Gcreate2(meta, "blobs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g < 0)
            return keel__fail(KEEL_EIO, "cannot create /meta/blobs in %s",
                              tmp);
    }
    for (size_t i = 0; i < p->n_blobs && st == KEEL_OK; i++) {
        const keel_ckpt_blob *b = &p->blobs[i];
        int64_t shape = (int64_t)b->size;
        ck_piece *pc = &pieces[i];
        uint64_t hash = XXH64(b->data, b->size, 0);
        if (b->size == 0) {
            st = write_empty_blob(g, b, hash, tmp);
            pc->data = NULL;
            pc->bytes = 0;
            pc->offset = -1;
            continue;
        }
        st = create_dset(g, b->name, H5T_STD_U8LE, 1, &shape, hash,
                         &pc->offset, tmp);
        pc->data = b->data;
        pc->bytes = b->size;
        pc->what = b->name;
    }
    keel__h5_close(g);
    return st;
}

/* Create the file's whole HDF5 structure; pieces[i] gets each dataset's
 * data offset (items first, then blobs). */
static keel_status
write_structure(const ck_plan *p, const char *name, const char *tmp,
                ck_piece *pieces)
{
    hid_t fapl, f = -1, meta = -1;
    keel_status st = KEEL_OK;

    keel__ckpt_h5_begin();
    fapl = keel__ckpt_fapl();
    if (fapl >= 0)
        f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (f < 0)
        st = keel__fail(KEEL_EIO, "cannot create checkpoint file %s: %s",
                        tmp, strerror(errno));
    if (st == KEEL_OK)
        st = write_meta(f, p, tmp, &meta);
    if (st == KEEL_OK)
        st = write_items(f, p, tmp, pieces);
    if (st == KEEL_OK && p->n_links > 0)
        st = write_links(f, p, name, tmp);
    if (st == KEEL_OK)
        st = write_blobs(meta, p, tmp, pieces + p->n);
    keel__h5_close(meta);
    return end_write(f, fapl, tmp, st);
}

/* The end of a write of tmp that began with keel__ckpt_h5_begin(): close
 * f (when open) and fapl, then keel__ckpt_h5_end(); st, or when st is
 * KEEL_OK the error of closing f. HDF5 flushes what it buffered on close,
 * so a full disk (ENOSPC) or a file size limit (EFBIG) often shows there:
 * say which. */
static keel_status
end_write(hid_t f, hid_t fapl, const char *tmp, keel_status st)
{
    if (f >= 0) {
        errno = 0;
        if (H5Fclose(f) < 0 && st == KEEL_OK)
            st = keel__fail(KEEL_EIO, "HDF5 could not close %s%s%s", tmp,
                            errno != 0 ? ": " : "",
                            errno != 0 ? strerror(errno) : "");
    }
    keel__h5_close(fapl);
    keel__ckpt_h5_end();
    return st;
}

/* Fill in the xxh64 attributes once the checksums are known. */
static keel_status
write_hashes(const ck_plan *p, const char *tmp)
{
    char h5name[2 * KEEL_NAME_MAX + 32];
    hid_t fapl, f = -1;
    keel_status st = KEEL_OK;

    keel__ckpt_h5_begin();
    fapl = keel__ckpt_fapl();
    if (fapl >= 0)
        f = H5Fopen(tmp, H5F_ACC_RDWR, fapl);
    if (f < 0) {
        st = keel__fail(KEEL_EIO, "cannot reopen %s to record checksums",
                        tmp);
        goto out;
    }
    for (size_t i = 0; i < p->n; i++) {
        const ck_item *it = &p->items[i];
        hid_t d, a = -1;
        int ok;
        if (it->slot == NULL)
            snprintf(h5name, sizeof h5name, "/variables/%s", it->name);
        else
            snprintf(h5name, sizeof h5name, "/slots/%s/%s", it->slot,
                     it->name);
        d = H5Dopen2(f, h5name, H5P_DEFAULT);
        if (d >= 0)
            a = H5Aopen(d, "xxh64", H5P_DEFAULT);
        ok = a >= 0 && H5Awrite(a, H5T_NATIVE_UINT64, &it->hash) >= 0;
        keel__h5_close(a);
        keel__h5_close(d);
        if (!ok) {
            st = keel__fail(KEEL_EIO, "cannot record the checksum of %s in "
                            "%s", h5name, tmp);
            goto out;
        }
    }
out:
    return end_write(f, fapl, tmp, st);
}

/* One checkpoint file being written: its temp file, the pieces of data
 * (items, then blobs), the items' bytes, whether their checksums are
 * recorded after the data, and the phases' times for the debug log. */
typedef struct ck_write {
    char tmp[KEEL_PATH_MAX];
    ck_piece *pieces;
    size_t np;
    size_t total;
    int late;
    size_t n_direct;
    int64_t tm[6];
} ck_write;

/* Small checkpoints: checksums first (cheaper than reopening the file to
 * record them). Large ones: each chunk hashed right before it is written
 * (one pass over memory), checksums recorded afterwards. */
static void
plan_hashes(ck_plan *p, ck_write *w)
{
    for (size_t i = 0; i < p->n; i++)
        w->total += p->items[i].bytes;
    w->late = w->total >= CK_LATE_HASH_BYTES;
    for (size_t i = 0; i < p->n; i++) {
        p->items[i].hash = w->late ? 0 : XXH64(p->items[i].data,
                                               p->items[i].bytes, 0);
        w->pieces[i].hash = w->late ? &p->items[i].hash : NULL;
    }
}

/* The pieces' bytes at their offsets in the temp file, the late
 * checksums, then fsync and close. */
static keel_status
write_data(const ck_plan *p, ck_write *w)
{
    keel_status st;
    int fd = open(w->tmp, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return keel__fail(KEEL_EIO, "reopen %s to write data: %s", w->tmp,
                          strerror(errno));
    st = keel__ckpt_io_write(fd, w->tmp, w->pieces, w->np,
                             w->total >= CK_DIRECT_BYTES, &w->n_direct);
    w->tm[2] = keel__now_mono_ns();
    if (st == KEEL_OK && w->late) {
        w->tm[3] = w->tm[2];
        st = write_hashes(p, w->tmp);
    }
    w->tm[4] = keel__now_mono_ns();
    if (st == KEEL_OK && keel__fs->fsync(fd) != 0)
        st = keel__fail(KEEL_EIO, "fsync %s: %s", w->tmp, strerror(errno));
    if (st != KEEL_OK) {
        close(fd);
        return st;
    }
    if (close(fd) != 0)
        return keel__fail(KEEL_EIO, "close %s: %s", w->tmp, strerror(errno));
    return KEEL_OK;
}

/* Write p to a temp file beside path (structure, data, checksums),
 * fsync it and commit it under path; on failure nothing is left. */
keel_status
keel__ckpt_write_file(ck_plan *p, const char *path)
{
    ck_write w = { .np = p->n + p->n_blobs };
    keel_status st;
    const char *sl;

    st = keel__fs_tmp_name(w.tmp, sizeof w.tmp, path);
    if (st != KEEL_OK)
        return st;
    w.pieces = calloc(w.np > 0 ? w.np : 1, sizeof *w.pieces);
    if (w.pieces == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint %s: no memory for %zu "
                          "datasets", path, w.np);
    plan_hashes(p, &w);
    w.tm[0] = keel__now_mono_ns();
    sl = strrchr(path, '/');
    st = write_structure(p, sl != NULL ? sl + 1 : path, w.tmp, w.pieces);
    w.tm[1] = keel__now_mono_ns();
    if (st == KEEL_OK)
        st = write_data(p, &w);
    free(w.pieces);
    if (st != KEEL_OK) {
        unlink(w.tmp);
        return st;
    }
    w.tm[5] = keel__now_mono_ns();
    /* rename + fsync of the directory; unlinks tmp if the rename fails. */
    st = keel__fs_commit(w.tmp, path);
    keel__log(KEEL_LOG_DEBUG, "wrote %s: structure %.1f ms, data %.1f ms "
              "(%zu of %zu bytes with O_DIRECT), record checksums %.1f ms, "
              "fsync %.1f ms, rename+dir fsync %.1f ms", path,
              (double)(w.tm[1] - w.tm[0]) / 1e6,
              (double)(w.tm[2] - w.tm[1]) / 1e6, w.n_direct, w.total,
              w.late ? (double)(w.tm[4] - w.tm[3]) / 1e6 : 0.0,
              (double)(w.tm[5] - w.tm[4]) / 1e6,
              (double)(keel__now_mono_ns() - w.tm[5]) / 1e6);
    return st;
}

