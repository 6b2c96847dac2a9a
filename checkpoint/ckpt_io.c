/* ckpt_io.c - the checkpoint's bulk I/O engine: tensor bytes written and
 * read at the file offsets the HDF5 layout allocated (h5layout.c), with
 * plain write()/pread() and O_DIRECT, several reads in flight, and each
 * dataset's xxh64 computed as its bytes pass. No HDF5 here: this runs
 * outside the HDF5 lock. */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <xxhash.h>

#include "ckpt_io.h"

#define CK_HASH_CHUNK ((size_t)1 << 20)
#define CK_WB_CHUNK ((size_t)8 << 20)
#define CK_DIO_ALIGN KEEL__PAGE_ALIGN  /* O_DIRECT buffer/offset/length */
/* One O_DIRECT write: 8 block-layer requests of 4 MiB in flight, so the
 * device's queue stays full. */
#define CK_DIO_WCHUNK ((size_t)32 << 20)
#define CK_THREADED_READ_BYTES ((size_t)16 << 20)

/* ---- writing ------------------------------------------------------------ */

/* The file a checkpoint's pieces go to, and how far it has got. */
typedef struct ck_out {
    int fd;                   /* buffered descriptor */
    int dfd;                  /* O_DIRECT descriptor of the same file, or -1 */
    int64_t wb[2];            /* written range not yet handed to writeback */
    size_t n_direct;          /* bytes that went by O_DIRECT */
    const char *path;         /* the temporary file, for messages */
} ck_out;

/* The O_DIRECT part of a piece: its page-aligned body, when the piece
 * starts page-aligned in memory and in the file (large tensors: see
 * numeric/tensor.c), goes to the disk by DMA straight from the tensor,
 * CK_DIO_WCHUNK at a time. Direct writes are used because buffered ones
 * of large checkpoints are paced by the kernel's dirty-page writeback, not
 * by the disk (docs/checkpoint.md). When the file system refuses O_DIRECT
 * (EINVAL on the first write) o->dfd is closed and set to -1, hs restarts
 * and *done stays 0: the piece goes buffered. */
static keel_status
write_direct(ck_out *o, const ck_piece *pc, XXH64_state_t *hs, size_t *done)
{
    const char *d = pc->data;
    size_t body = 0;

    *done = 0;
    if (o->dfd >= 0 && ((uintptr_t)d & (CK_DIO_ALIGN - 1)) == 0 &&
        ((uint64_t)pc->offset & (CK_DIO_ALIGN - 1)) == 0)
        body = pc->bytes & ~(CK_DIO_ALIGN - 1);
    if (body > 0 && lseek(o->dfd, (off_t)pc->offset, SEEK_SET) < 0)
        body = 0;
    while (*done < body) {
        size_t c = body - *done < CK_DIO_WCHUNK ? body - *done
                                                : CK_DIO_WCHUNK;
        size_t put = 0;
        if (hs != NULL)
            XXH64_update(hs, d + *done, c);
        while (put < c) {
            ssize_t w = keel__fs->write(o->dfd, d + *done + put, c - put);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0 && errno == EINVAL && *done + put == 0) {
                close(o->dfd);             /* no O_DIRECT here after all */
                o->dfd = -1;
                if (hs != NULL)
                    XXH64_reset(hs, 0);    /* start over, buffered */
                return KEEL_OK;
            }
            if (w <= 0)
                return keel__fail(KEEL_EIO, "write %s: %s", o->path,
                                  w < 0 ? strerror(errno) : "no progress");
            put += (size_t)w;
            o->n_direct += (size_t)w;
        }
        *done += put;
    }
    return KEEL_OK;
}

/* The rest of a piece from byte done on, through the page cache. Every
 * CK_WB_CHUNK written (across pieces) the kernel is asked to start writing
 * the chunk back (sync_file_range WRITE: no wait, no durability promise -
 * the fsync after all pieces gives that), so the disk works while the
 * next chunks are copied. */
static keel_status
write_buffered(ck_out *o, const ck_piece *pc, XXH64_state_t *hs, size_t done)
{
    const char *d = pc->data;
    keel_status st = KEEL_OK;

    if (done < pc->bytes &&
        lseek(o->fd, (off_t)(pc->offset + (int64_t)done), SEEK_SET) < 0)
        return keel__fail(KEEL_EIO, "seek in %s: %s", o->path,
                          strerror(errno));
    while (done < pc->bytes && st == KEEL_OK) {
        size_t c = pc->bytes - done < CK_WB_CHUNK ? pc->bytes - done
                                                  : CK_WB_CHUNK;
        if (hs != NULL) {
            for (size_t h = 0; h < c && st == KEEL_OK; h += CK_HASH_CHUNK) {
                size_t hc = c - h < CK_HASH_CHUNK ? c - h : CK_HASH_CHUNK;
                XXH64_update(hs, d + done + h, hc);
                st = keel__fs_write_all(o->fd, d + done + h, hc, o->path);
            }
        } else {
            st = keel__fs_write_all(o->fd, d + done, c, o->path);
        }
        done += c;
        /* wb[0..1]: the written range not yet handed to writeback (the
         * pieces are in file order; gaps between them are metadata). */
        if (o->wb[1] <= o->wb[0])
            o->wb[0] = pc->offset + (int64_t)(done - c);
        o->wb[1] = pc->offset + (int64_t)done;
#ifdef SYNC_FILE_RANGE_WRITE
        if (st == KEEL_OK && o->wb[1] - o->wb[0] >= (int64_t)CK_WB_CHUNK) {
            (void)sync_file_range(o->fd, (off_t)o->wb[0],
                                  (off_t)(o->wb[1] - o->wb[0]),
                                  SYNC_FILE_RANGE_WRITE);
            o->wb[0] = o->wb[1];
        }
#endif
    }
    return st;
}

/* Write one dataset's bytes at its offset: the O_DIRECT body, then the
 * rest buffered. With hash, each chunk is hashed right before it is
 * written (one pass over memory). */
static keel_status
write_piece(ck_out *o, const ck_piece *pc, uint64_t *hash)
{
    XXH64_state_t *hs = NULL;
    size_t done;
    keel_status st;

    if (hash != NULL) {
        hs = XXH64_createState();
        if (hs == NULL)
            return keel__fail(KEEL_ENOMEM, "xxh64 state");
        XXH64_reset(hs, 0);
    }
    st = write_direct(o, pc, hs, &done);
    if (st == KEEL_OK)
        st = write_buffered(o, pc, hs, done);
    if (hs != NULL) {
        *hash = XXH64_digest(hs);
        XXH64_freeState(hs);
    }
    return st;
}

/* O_DIRECT writes do not pass the data through the CPU, so the checksums
 * need a pass of their own: CK_HASHERS threads compute them while the
 * writes run (hashing inline would hold each direct write back by the
 * hash's time). Each takes the next piece not yet taken and computes its
 * whole xxh64, so a checksum is the same as one thread's and the file
 * format does not change; pieces are hashed in parallel, not split. */
#define CK_HASHERS 2

typedef struct hash_job {
    const ck_piece *pieces;
    size_t n;
    size_t next;              /* the next piece to take (atomic) */
} hash_job;

static void *
hash_main(void *arg)
{
    hash_job *h = arg;
    for (;;) {
        size_t i = __atomic_fetch_add(&h->next, 1, __ATOMIC_RELAXED);
        if (i >= h->n)
            break;
        if (h->pieces[i].hash != NULL)
            *h->pieces[i].hash = XXH64(h->pieces[i].data,
                                       h->pieces[i].bytes, 0);
    }
    return NULL;
}

keel_status
keel__ckpt_io_write(int fd, const char *tmp, const ck_piece *pieces,
                    size_t n, int direct, size_t *n_direct)
{
    keel_status st = KEEL_OK;
    ck_out o = { .fd = fd, .dfd = -1, .path = tmp };
    int n_hashers = 0, wants_hash = 0;
    hash_job hj = { pieces, n, 0 };
    pthread_t hasher[CK_HASHERS];
    int64_t t0 = keel__now_mono_ns(), t1;

    assert(fd >= 0 && n_direct != NULL);
    for (size_t i = 0; i < n; i++)
        wants_hash |= pieces[i].hash != NULL;
#ifdef O_DIRECT
    if (direct)
        o.dfd = open(tmp, O_WRONLY | O_CLOEXEC | O_DIRECT);
#else
    (void)direct;
#endif
    while (wants_hash && o.dfd >= 0 && n_hashers < CK_HASHERS &&
           (size_t)n_hashers < n &&
           pthread_create(&hasher[n_hashers], NULL, hash_main, &hj) == 0)
        n_hashers++;
    for (size_t i = 0; i < n && st == KEEL_OK; i++) {
        const ck_piece *pc = &pieces[i];
        if (pc->bytes == 0)
            continue;
        if (pc->offset < 0) {
            st = keel__fail(KEEL_EINTERNAL, "HDF5 gave no data offset for "
                            "%s in %s", pc->what, tmp);
            break;
        }
        st = write_piece(&o, pc, n_hashers > 0 ? NULL : pc->hash);
    }
    t1 = keel__now_mono_ns();
    for (int k = 0; k < n_hashers; k++)
        pthread_join(hasher[k], NULL);
    if (n_hashers > 0)
        keel__log(KEEL_LOG_DEBUG, "write %s: data written in %.1f ms, "
                  "checksums (%d threads) done %.1f ms later", tmp,
                  (double)(t1 - t0) / 1e6, n_hashers,
                  (double)(keel__now_mono_ns() - t1) / 1e6);
    if (o.dfd >= 0)
        close(o.dfd);               /* direct writes are done on return */
    *n_direct = o.n_direct;
    return st;
}

/* ---- reading ------------------------------------------------------------ */

static keel_status
pread_all(int fd, void *dst, size_t n, int64_t off, const char *path)
{
    char *p = dst;
    while (n > 0) {
        size_t want = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t r = pread(fd, p, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return keel__fail(KEEL_EIO, "read %s: %s", path, strerror(errno));
        if (r == 0)
            return keel__fail(KEEL_ECORRUPT, "checkpoint %s is truncated "
                              "(unexpected end of file)", path);
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return KEEL_OK;
}

/* Large reads into memory: a reader thread pread()s ahead while the
 * caller hashes what has arrived, so the checksum overlaps the disk. */
typedef struct rd_job {
    int fd;
    char *dst;
    size_t n;
    int64_t off;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t done;
    int failed;               /* errno, or -1 for an early end of file */
} rd_job;

static void *
rd_main(void *arg)
{
    rd_job *j = arg;
    size_t pos = 0;
    while (pos < j->n) {
        size_t c = j->n - pos < CK_IO_CHUNK ? j->n - pos : CK_IO_CHUNK;
        ssize_t r = pread(j->fd, j->dst + pos, c, (off_t)(j->off +
                                                          (int64_t)pos));
        if (r < 0 && errno == EINTR)
            continue;
        pthread_mutex_lock(&j->mu);
        if (r <= 0)
            j->failed = r < 0 ? errno : -1;
        else
            j->done = pos + (size_t)r;
        pthread_cond_signal(&j->cv);
        pthread_mutex_unlock(&j->mu);
        if (r <= 0)
            return NULL;
        pos += (size_t)r;
    }
    return NULL;
}

static keel_status
read_hashed_mt(int fd, void *dst, size_t n, int64_t off, const char *path,
               uint64_t *hash, int *ran)
{
    rd_job j;
    pthread_t th;
    XXH64_state_t *s;
    size_t hashed = 0;
    int failed = 0;

    *ran = 0;
    memset(&j, 0, sizeof j);
    j.fd = fd;
    j.dst = dst;
    j.n = n;
    j.off = off;
    s = XXH64_createState();
    if (s == NULL)
        return keel__fail(KEEL_ENOMEM, "xxh64 state");
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    if (pthread_create(&th, NULL, rd_main, &j) != 0) {
        pthread_cond_destroy(&j.cv);
        pthread_mutex_destroy(&j.mu);
        XXH64_freeState(s);
        return KEEL_OK;       /* *ran = 0: caller reads without a thread */
    }
    *ran = 1;
    XXH64_reset(s, 0);
    while (hashed < n) {
        size_t avail;
        pthread_mutex_lock(&j.mu);
        while (j.done == hashed && j.failed == 0)
            pthread_cond_wait(&j.cv, &j.mu);
        avail = j.done;
        failed = j.failed;
        pthread_mutex_unlock(&j.mu);
        if (avail > hashed) {
            XXH64_update(s, (char *)dst + hashed, avail - hashed);
            hashed = avail;
        } else if (failed != 0) {
            break;
        }
    }
    pthread_join(th, NULL);
    pthread_cond_destroy(&j.cv);
    pthread_mutex_destroy(&j.mu);
    *hash = XXH64_digest(s);
    XXH64_freeState(s);
    if (hashed < n) {
        if (failed == -1)
            return keel__fail(KEEL_ECORRUPT, "checkpoint %s is truncated "
                              "(unexpected end of file)", path);
        return keel__fail(KEEL_EIO, "read %s: %s", path, strerror(failed));
    }
    return KEEL_OK;
}

/* In chunks, hashing each chunk while it is hot and asking the kernel to read
 * the next chunks ahead, so disk reads overlap the checksum work. */
keel_status
keel__ckpt_io_read_hashed(int fd, void *dst, void *bounce, size_t n,
                          int64_t off, const char *path, uint64_t *hash)
{
    XXH64_state_t *s = XXH64_createState();
    const int ahead = 4;
    size_t done = 0;
    keel_status st = KEEL_OK;
    if (dst != NULL && n >= CK_THREADED_READ_BYTES) {
        int ran;
        XXH64_freeState(s);
        st = read_hashed_mt(fd, dst, n, off, path, hash, &ran);
        if (ran || st != KEEL_OK)
            return st;
        s = XXH64_createState();
    }
    if (s == NULL)
        return keel__fail(KEEL_ENOMEM, "xxh64 state");
    XXH64_reset(s, 0);
    posix_fadvise(fd, (off_t)off, (off_t)(n < ahead * CK_IO_CHUNK ? n :
                                          ahead * CK_IO_CHUNK),
                  POSIX_FADV_WILLNEED);
    while (done < n && st == KEEL_OK) {
        size_t c = n - done < CK_IO_CHUNK ? n - done : CK_IO_CHUNK;
        size_t next = done + (size_t)ahead * CK_IO_CHUNK;
        char *p = dst != NULL ? (char *)dst + done : bounce;
        if (next < n)
            posix_fadvise(fd, (off_t)(off + (int64_t)next),
                          (off_t)(n - next < CK_IO_CHUNK ? n - next
                                                         : CK_IO_CHUNK),
                          POSIX_FADV_WILLNEED);
        st = pread_all(fd, p, c, off + (int64_t)done, path);
        if (st == KEEL_OK)
            XXH64_update(s, p, c);
        done += c;
    }
    *hash = XXH64_digest(s);
    XXH64_freeState(s);
    return st;
}


static void
describe(const ck_dset *d, char *buf, size_t size)
{
    if (d->e.slot[0] == '\0')
        snprintf(buf, size, "variable '%s'", d->e.name);
    else
        snprintf(buf, size, "slot '%s' of variable '%s'", d->e.slot,
                 d->e.name);
}

keel_status
keel__ckpt_io_bad_hash(const char *path, const ck_dset *d)
{
    char what[2 * KEEL_NAME_MAX + 64];
    describe(d, what, sizeof what);
    return keel__fail(KEEL_ECORRUPT, "checkpoint %s: %s fails its xxh64 "
                      "checksum (the data is corrupt)", path, what);
}

/* ---- one-pass restore ----------------------------------------------------
 * The contiguous datasets are cut, in file order, into pieces of at most
 * CK_RD_CHUNK bytes; CK_RD_READERS reader threads take the pieces in order
 * and read each straight into its destination, so several reads are in
 * flight at once, while the caller hashes each dataset's bytes as the
 * pieces holding them arrive (in file order) and checks each dataset's
 * checksum as soon as its last piece is hashed. No copy beyond the read
 * itself, and one reader waiting for a core (the machine is busy) does not
 * leave the disk idle: the others' reads are still queued.
 * A piece whose pages are not all in the page cache (mincore() on a
 * mapping of the file) is read with O_DIRECT when the destinations and the
 * offsets are page-aligned (large tensors are): the disk's data goes by DMA
 * into the tensor, with no page-cache copy and no read-ahead heuristics.
 * One piece spans consecutive datasets when they follow within
 * CK_RD_GAP_MAX bytes (the HDF5 headers between them land in a scratch
 * page, one preadv()), so small datasets are read like one file. Cached
 * pieces, unaligned ones, sub-page tails and file systems without O_DIRECT
 * use plain buffered pread()s (with POSIX_FADV_SEQUENTIAL).
 * A failed read (I/O error, early end of file) stops the readers taking
 * new pieces; the caller still hashes every piece before it in file
 * order, so the first bad checksum in the file is the one reported. */

#define CK_RD_CHUNK ((size_t)2 << 20)
#define CK_RD_READERS 2
#define CK_RD_THREAD_BYTES ((size_t)1 << 20)
#define CK_RD_GAP_MAX ((size_t)64 << 10)   /* read over, into scratch */
#define CK_RD_IOV 64

typedef struct rm_ord {
    int64_t offset;
    size_t i;
} rm_ord;

/* One read: bytes [pos0, ...) of job k0 through job k1 at pos1 (exclusive),
 * consecutive jobs joined over gaps of at most CK_RD_GAP_MAX bytes. */
typedef struct rm_piece {
    size_t k0, pos0, k1, pos1;
    int is_aligned;           /* every part page-aligned: O_DIRECT may do */
    int state;                /* 0 pending, 1 arrived, else failed */
    int err;                  /* errno, or -1 for an early end of file */
} rm_piece;

typedef struct rm_job {
    int fd;
    int dfd;                  /* O_DIRECT descriptor, or -1 */
    int is_direct_off;        /* a direct read failed: buffered from now */
    const char *map;          /* the file mapped for mincore(), or NULL */
    size_t map_len;
    void *scratch;            /* CK_RD_GAP_MAX bytes, page-aligned */
    const ck_read_job *jobs;
    const rm_ord *order;      /* contiguous jobs, by file offset */
    size_t n;
    rm_piece *pc;
    size_t n_pc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t next;              /* the next piece a reader takes */
    int is_stopped;           /* a read failed, or the caller gave up */
    size_t direct_bytes;      /* read with O_DIRECT (for the debug log) */
    pthread_t th[CK_RD_READERS];
    int n_th;                 /* readers running; 0: the caller reads */
} rm_job;

static size_t
rm_bytes(const rm_job *j, size_t k)
{
    return j->jobs[j->order[k].i].d->count * sizeof(float);
}

static int
rm_is_page(uint64_t x)
{
    return (x & (CK_DIO_ALIGN - 1)) == 0;
}

/* Cut the contiguous jobs into pieces (j->pc, j->n_pc). */
static keel_status
rm_plan(rm_job *j, const char *path)
{
    size_t k = 0, pos = 0, cap = 0;
    for (size_t i = 0; i < j->n; i++)
        cap += rm_bytes(j, i) / CK_RD_CHUNK + 2;
    j->pc = calloc(cap > 0 ? cap : 1, sizeof *j->pc);
    if (j->pc == NULL)
        return keel__fail(KEEL_ENOMEM, "restore from %s: %zu pieces", path,
                          cap);
    while (k < j->n) {
        const ck_read_job *jb = &j->jobs[j->order[k].i];
        size_t bytes = rm_bytes(j, k), c, body, want, n_iov = 1;
        int64_t off = jb->d->offset + (int64_t)pos;
        rm_piece *p;
        if (pos >= bytes) {
            k++;
            pos = 0;
            continue;
        }
        p = &j->pc[j->n_pc++];
        p->k0 = k;
        p->pos0 = pos;
        c = bytes - pos < CK_RD_CHUNK ? bytes - pos : CK_RD_CHUNK;
        body = c & ~(CK_DIO_ALIGN - 1);
        if (body == 0 || !rm_is_page((uintptr_t)jb->dst + pos) ||
            !rm_is_page((uint64_t)off)) {
            p->k1 = k;                 /* buffered only */
            p->pos1 = pos + c;
            pos += c;
            continue;
        }
        p->is_aligned = 1;
        pos += body;
        want = body;
        while (pos == bytes && want < CK_RD_CHUNK && k + 1 < j->n &&
               n_iov + 2 <= CK_RD_IOV) {
            const ck_read_job *nx = &j->jobs[j->order[k + 1].i];
            int64_t gap = nx->d->offset - (jb->d->offset + (int64_t)bytes);
            size_t nb = rm_bytes(j, k + 1);
            size_t take = (nb < CK_RD_CHUNK - want ? nb : CK_RD_CHUNK - want)
                          & ~(CK_DIO_ALIGN - 1);
            if (gap < 0 || gap > (int64_t)CK_RD_GAP_MAX || take == 0 ||
                !rm_is_page((uint64_t)gap) ||
                !rm_is_page((uintptr_t)nx->dst))
                break;
            n_iov += gap > 0 ? 2 : 1;
            want += (size_t)gap + take;
            k++;
            jb = nx;
            bytes = nb;
            pos = take;
        }
        p->k1 = k;
        p->pos1 = pos;
    }
    return KEEL_OK;
}

/* 1 when every page of [off, off + n) is in the page cache. Without a
 * mapping (mmap failed) or vector the answer is 1: buffered reads. */
static int
rm_is_cached(const rm_job *j, unsigned char *vec, int64_t off, size_t n)
{
    size_t pg = CK_DIO_ALIGN, a = (size_t)off & ~(pg - 1), np;
    if (j->map == NULL || vec == NULL)
        return 1;
    if (a >= j->map_len)
        return 0;
    if (a + n > j->map_len)
        n = j->map_len - a;
    np = ((size_t)off - a + n + pg - 1) / pg;
    if (mincore((void *)(j->map + a), (size_t)off - a + n, vec) != 0)
        return 1;
    for (size_t k = 0; k < np; k++)
        if (!(vec[k] & 1))
            return 0;
    return 1;
}

/* The parts of piece p: destination, file offset, length; gaps between
 * datasets go to j->scratch. Returns the number of parts. */
static size_t
rm_parts(const rm_job *j, const rm_piece *p, struct iovec *iov,
         int64_t *offs)
{
    size_t n_iov = 0;
    for (size_t k = p->k0; k <= p->k1 && k < j->n; k++) {
        const ck_read_job *jb = &j->jobs[j->order[k].i];
        size_t a = k == p->k0 ? p->pos0 : 0;
        size_t b = k == p->k1 ? p->pos1 : rm_bytes(j, k);
        if (k > p->k0) {
            const ck_read_job *pv = &j->jobs[j->order[k - 1].i];
            int64_t end = pv->d->offset + (int64_t)rm_bytes(j, k - 1);
            if (jb->d->offset > end) {
                iov[n_iov].iov_base = j->scratch;
                iov[n_iov].iov_len = (size_t)(jb->d->offset - end);
                offs[n_iov++] = end;
            }
        }
        if (b > a) {
            iov[n_iov].iov_base = (char *)jb->dst + a;
            iov[n_iov].iov_len = b - a;
            offs[n_iov++] = jb->d->offset + (int64_t)a;
        }
    }
    return n_iov;
}

/* Read piece p: 0, an errno, or -1 for an early end of file. */
static int
rm_read(rm_job *j, const rm_piece *p, unsigned char *vec)
{
    struct iovec iov[CK_RD_IOV];
    int64_t offs[CK_RD_IOV];
    size_t n_iov = rm_parts(j, p, iov, offs), want = 0;
    int is_direct_off;
    ssize_t r;

    for (size_t i = 0; i < n_iov; i++)
        want += iov[i].iov_len;
    pthread_mutex_lock(&j->mu);
    is_direct_off = j->is_direct_off;
    pthread_mutex_unlock(&j->mu);
    if (j->dfd >= 0 && p->is_aligned && !is_direct_off &&
        !rm_is_cached(j, vec, offs[0], want)) {
        do
            r = preadv(j->dfd, iov, (int)n_iov, (off_t)offs[0]);
        while (r < 0 && errno == EINTR);
        if (r == (ssize_t)want) {
            pthread_mutex_lock(&j->mu);
            j->direct_bytes += want;
            pthread_mutex_unlock(&j->mu);
            return 0;
        }
        /* EINVAL (alignment rules we do not meet), an I/O error or a
         * short file: the buffered path says what is wrong, or works. */
        pthread_mutex_lock(&j->mu);
        j->is_direct_off = 1;
        pthread_mutex_unlock(&j->mu);
    }
    for (size_t i = 0; i < n_iov; i++) {
        char *d = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        int64_t off = offs[i];
        while (left > 0) {
            r = pread(j->fd, d, left, (off_t)off);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return r < 0 ? errno : -1;
            d += r;
            left -= (size_t)r;
            off += r;
        }
    }
    return 0;
}

static void *
rm_main(void *arg)
{
    rm_job *j = arg;
    /* A piece is at most CK_RD_CHUNK bytes plus one gap. */
    unsigned char *vec = malloc((CK_RD_CHUNK + CK_RD_GAP_MAX) / CK_DIO_ALIGN +
                                2);
    for (;;) {
        size_t i;
        int err;
        pthread_mutex_lock(&j->mu);
        i = j->next;
        if (j->is_stopped || i >= j->n_pc) {
            pthread_mutex_unlock(&j->mu);
            break;
        }
        j->next++;
        pthread_mutex_unlock(&j->mu);
        err = rm_read(j, &j->pc[i], vec);   /* vec NULL: buffered */
        pthread_mutex_lock(&j->mu);
        j->pc[i].state = err == 0 ? 1 : 2;
        j->pc[i].err = err;
        if (err != 0)
            j->is_stopped = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
    free(vec);
    return NULL;
}

static int
rm_offset_cmp(const void *a, const void *b)
{
    const rm_ord *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The O_DIRECT descriptor and the mapping that tells cached pieces from
 * cold ones. Any failure leaves buffered reads only: never an error. */
static void
rm_direct_setup(rm_job *j, const ck_file *f)
{
    size_t len = (size_t)f->file_size;
    void *m;
    if (f->file_size <= 0 || (int64_t)len != f->file_size)
        return;
    if (posix_memalign(&j->scratch, CK_DIO_ALIGN, CK_RD_GAP_MAX) != 0) {
        j->scratch = NULL;
        return;
    }
    m = mmap(NULL, len, PROT_READ, MAP_SHARED, j->fd, 0);
    if (m == MAP_FAILED)
        return;
    j->map = m;
    j->map_len = len;
#ifdef O_DIRECT
    j->dfd = open(f->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
#endif
}

/* The contiguous jobs (the layout reads the others) into order, by file
 * offset; returns how many, *total their bytes. */
static size_t
rm_order(const ck_read_job *jobs, size_t n, rm_ord *order, size_t *total)
{
    size_t n_contig = 0;
    for (size_t i = 0; i < n; i++) {
        if (jobs[i].d->offset < 0)
            continue;
        order[n_contig].offset = jobs[i].d->offset;
        order[n_contig++].i = i;
        *total += jobs[i].d->count * sizeof(float);
    }
    qsort(order, n_contig, sizeof *order, rm_offset_cmp);
    return n_contig;
}

static keel_status
rm_open(rm_job *j, const char *path)
{
    j->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (j->fd < 0)
        return keel__fail(KEEL_EIO, "open checkpoint %s: %s", path,
                          strerror(errno));
    posix_fadvise(j->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return KEEL_OK;
}

/* The readers of a large restore: the pieces, O_DIRECT where it can
 * serve, then the threads (when none starts, the caller reads alone). */
static keel_status
rm_start(rm_job *j, const ck_file *f)
{
    keel_status st = rm_plan(j, f->path);
    if (st != KEEL_OK)
        return st;
    rm_direct_setup(j, f);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    while (j->n_th < CK_RD_READERS &&
           pthread_create(&j->th[j->n_th], NULL, rm_main, j) == 0)
        j->n_th++;
    if (j->n_th == 0) {
        pthread_cond_destroy(&j->cv);
        pthread_mutex_destroy(&j->mu);
    }
    return KEEL_OK;
}

/* Stop the readers (they finish the piece in hand) and wait for them. */
static void
rm_stop(rm_job *j)
{
    if (j->n_th == 0)
        return;
    pthread_mutex_lock(&j->mu);
    j->is_stopped = 1;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < j->n_th; i++)
        pthread_join(j->th[i], NULL);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
}

static void
rm_release(rm_job *j)
{
    if (j->dfd >= 0)
        close(j->dfd);
    if (j->map != NULL)
        munmap((void *)j->map, j->map_len);
    free(j->scratch);
    free(j->pc);
    if (j->fd >= 0)
        close(j->fd);
}

/* Wait for a reader to finish piece pc; its read's failure, named. */
static keel_status
rm_wait(rm_job *j, const rm_piece *pc, const char *path)
{
    int state, err;
    pthread_mutex_lock(&j->mu);
    while (pc->state == 0)
        pthread_cond_wait(&j->cv, &j->mu);
    state = pc->state;
    err = pc->err;
    pthread_mutex_unlock(&j->mu);
    if (state == 1)
        return KEEL_OK;
    return err == -1
           ? keel__fail(KEEL_ECORRUPT, "checkpoint %s is truncated "
                        "(unexpected end of file)", path)
           : keel__fail(KEEL_EIO, "read %s: %s", path, strerror(err));
}

/* The bytes of contiguous job k, read here (no readers) or hashed as the
 * readers' pieces arrive, against the dataset's checksum. *p is the
 * piece holding the next unhashed bytes of job k. */
static keel_status
rm_check_job(rm_job *j, size_t k, size_t *p, XXH64_state_t *hs,
             const char *path)
{
    const ck_read_job *jb = &j->jobs[j->order[k].i];
    size_t bytes = rm_bytes(j, k), hashed = 0;
    keel_status st;
    XXH64_reset(hs, 0);
    if (j->n_th == 0) {
        st = pread_all(j->fd, jb->dst, bytes, jb->d->offset, path);
        if (st != KEEL_OK)
            return st;
        XXH64_update(hs, jb->dst, bytes);
        hashed = bytes;
    }
    while (hashed < bytes) {
        const rm_piece *pc = &j->pc[*p];
        size_t avail;
        st = rm_wait(j, pc, path);
        if (st != KEEL_OK)
            return st;
        avail = pc->k1 > k ? bytes : pc->pos1;
        XXH64_update(hs, (char *)jb->dst + hashed, avail - hashed);
        hashed = avail;
        if (pc->k1 == k)
            (*p)++;
    }
    if (XXH64_digest(hs) != jb->d->e.xxh64)
        return keel__ckpt_io_bad_hash(path, jb->d);
    return KEEL_OK;
}

/* Order the contiguous datasets by offset, start readers for a large
 * restore, then hash and check each dataset in file order. */
keel_status
keel__ckpt_io_read_many(const ck_file *f, const ck_read_job *jobs, size_t n)
{
    rm_ord *order;
    size_t total = 0, p = 0;
    keel_status st = KEEL_OK;
    XXH64_state_t *hs = NULL;
    rm_job j;

    memset(&j, 0, sizeof j);
    j.fd = -1;
    j.dfd = -1;
    j.jobs = jobs;
    order = malloc((n > 0 ? n : 1) * sizeof *order);
    if (order == NULL)
        return keel__fail(KEEL_ENOMEM, "restore from %s: %zu datasets",
                          f->path, n);
    j.order = order;
    j.n = rm_order(jobs, n, order, &total);
    if (j.n > 0) {
        hs = XXH64_createState();
        st = hs != NULL ? rm_open(&j, f->path)
                        : keel__fail(KEEL_ENOMEM, "xxh64 state");
    }
    if (j.n > 0 && st == KEEL_OK && total >= CK_RD_THREAD_BYTES)
        st = rm_start(&j, f);
    for (size_t k = 0; k < j.n && st == KEEL_OK; k++)
        st = rm_check_job(&j, k, &p, hs, f->path);
    rm_stop(&j);
    if (j.direct_bytes > 0)
        keel__log(KEEL_LOG_DEBUG, "read %s: %zu of %zu bytes with O_DIRECT "
                  "(%d readers)", f->path, j.direct_bytes, total, j.n_th);
    rm_release(&j);
    XXH64_freeState(hs);
    free(order);
    return st;
}
