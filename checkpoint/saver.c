/* saver.c - keel_saver: one checkpoint file per save committed durably,
 * then the TF-format `checkpoint` state file (state.c), then retention
 * (retention.c). Async saves copy everything into one reusable staging
 * buffer and write it on a background thread; at most one is in flight. */
#include <config.h>

#include <assert.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "saver_int.h"
#include "grow.h"

void
keel_saver_config_init(keel_saver_config *cfg)
{
    if (cfg == NULL)
        return;
    KEEL__STRUCT_INIT(cfg);
    cfg->basename = KEEL_CKPT_DEFAULT_BASENAME;
    cfg->max_to_keep = 5;
    cfg->keep_every_n_hours = 0;
    cfg->is_async = 0;
}

/* ---- saver lifetime ----------------------------------------------------- */

/* The saver's name and retention settings: base gets the basename. */
static keel_status
check_naming(const keel_saver_config *cfg, const char **base)
{
    *base = cfg->basename != NULL ? cfg->basename
                                  : KEEL_CKPT_DEFAULT_BASENAME;
    if (!keel_name_is_valid(*base) || strchr(*base, '/') != NULL ||
        strlen(*base) > 200)
        return keel__fail(KEEL_EINVAL, "checkpoint basename '%s' must be one "
                          "path segment of [A-Za-z0-9_.-]", *base);
    if (cfg->max_to_keep < 0)
        return keel__fail(KEEL_EINVAL, "max_to_keep %d: must be >= 0 "
                          "(0 keeps all)", cfg->max_to_keep);
    if (!(cfg->keep_every_n_hours >= 0))
        return keel__fail(KEEL_EINVAL, "keep_every_n_hours must be >= 0");
    return KEEL_OK;
}

/* s's settings from cfg, and its directory, created when missing. */
static keel_status
saver_setup(keel_saver *s, const keel_saver_config *cfg, const char *base)
{
    keel_status st = keel__fmt(s->dir, sizeof s->dir,
                               "checkpoint directory", "%s", cfg->dir);
    if (st != KEEL_OK)
        return st;
    snprintf(s->basename, sizeof s->basename, "%s", base);
    s->max_to_keep = cfg->max_to_keep;
    s->keep_every_n_hours = cfg->keep_every_n_hours;
    s->is_async = cfg->is_async != 0;
    s->last_step = -1;
    st = keel__fs_mkdirs(s->dir);
    if (st != KEEL_OK)
        return keel__wrap(st, "checkpoint directory %s", s->dir);
    return KEEL_OK;
}

/* Check cfg, set up the directory, take over what an earlier saver left
 * there (temp files, its list, interrupted deletions, stale leases,
 * committed but unrecorded checkpoints). */
keel_status
keel_saver_new(const keel_saver_config *cfg, keel_saver **out)
{
    keel_saver *s;
    keel_status st;
    const char *base;

    st = KEEL__CONFIG_CHECK(cfg, out, keel_saver_config, "keel_saver_new");
    if (st != KEEL_OK)
        return st;
    if (cfg->dir == NULL || cfg->dir[0] == 0)
        return keel__fail(KEEL_EINVAL, "keel_saver_new: a checkpoint "
                          "directory is required");
    *out = NULL;
    st = check_naming(cfg, &base);
    if (st != KEEL_OK)
        return st;
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return keel__fail(KEEL_ENOMEM, "saver");
    st = saver_setup(s, cfg, base);
    if (st != KEEL_OK) {
        free(s);
        return st;
    }
    keel__ckpt_clean_temp_files(s);
    keel__ckpt_load_state(s);
    /* stale leases of dead readers; deferred deletions now unleased */
    keel__ckpt_lease_sweep(s->dir, &s->state);
    keel__ckpt_adopt_orphans(s);
    if (s->state.last_preserved < 0)
        s->state.last_preserved = keel__now_wall();
    *out = s;
    return KEEL_OK;
}

int64_t
keel_saver_last_step(const keel_saver *s)
{
    if (s == NULL)
        return -1;
    return __atomic_load_n(&s->last_step, __ATOMIC_ACQUIRE);
}

/* ---- one save ----------------------------------------------------------- */

/* An upper bound of the file plan p makes: its data, each dataset aligned
 * and with its object header and attributes, the text attributes, and the
 * metadata blocks HDF5 allocates. */
static uint64_t
planned_file_bytes(const ck_plan *p)
{
    uint64_t b = (uint64_t)4 << 16;              /* superblock, groups */
    for (size_t i = 0; i < p->n; i++)
        b += p->items[i].bytes + 8192;
    for (size_t i = 0; i < p->n_blobs; i++)
        b += p->blobs[i].size + 8192;
    b += p->config_text != NULL ? strlen(p->config_text) : 0;
    b += p->topology != NULL ? strlen(p->topology) : 0;
    b += p->architecture != NULL ? strlen(p->architecture) : 0;
    return b;
}

/* Refuse a save that cannot fit the process's file size limit
 * (RLIMIT_FSIZE) before HDF5 starts it, on the caller's thread (an async
 * save fails at its own call, not at the next one): HDF5 (1.10) cannot
 * give up a file whose closing flush failed (EFBIG), and the file object
 * that failed close leaves behind crashes the library at exit. Free
 * space is not checked ahead (file systems report it too loosely to
 * refuse on it): a full disk fails the save with ENOSPC and removes the
 * temporary file. */
static keel_status
check_room(const ck_plan *p)
{
    uint64_t need = planned_file_bytes(p);
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        need > (uint64_t)rl.rlim_cur)
        return keel__fail(KEEL_EIO, "checkpoint of step %lld needs up to "
                          "%llu bytes, more than this process's file size "
                          "limit of %llu bytes (ulimit -f); raise the limit",
                          (long long)p->step, (unsigned long long)need,
                          (unsigned long long)rl.rlim_cur);
    return KEEL_OK;
}

static keel_status
commit_file(const keel_saver *s, ck_plan *p, ck_commit *c)
{
    keel_status st = keel__ckpt_file_name(c->name, sizeof c->name,
                                          s->basename, p->step, p->epoch);
    ck_link *links = NULL;
    if (st == KEEL_OK)
        st = keel__path_join(c->path, sizeof c->path, s->dir, c->name);
    /* A sharded checkpoint's index is written only once every shard is
     * durable and is this checkpoint's. */
    if (st == KEEL_OK && p->shard_count > 0)
        st = keel__ckpt_index_links(s->dir, c->name, p, &links,
                                    &p->n_links);
    p->links = links;
    if (st == KEEL_OK)
        st = keel__ckpt_write_file(p, c->path);
    free(links);
    p->links = NULL;
    p->n_links = 0;
    if (st != KEEL_OK)
        return keel__wrap(st, "save of step %lld failed", (long long)p->step);
    return KEEL_OK;
}

/* Commit the file, record it in the state file, apply retention. Runs on
 * the caller's thread (sync) or the writer thread (async). */
static keel_status
commit_save(keel_saver *s, ck_plan *p)
{
    ck_commit c = { .now = keel__now_wall() };
    keel_status st;
    int64_t t0 = keel__now_mono_ns(), t1, t2, t3;

    keel__ckpt_join_reaper(s);
    t1 = t0;
    st = commit_file(s, p, &c);
    if (st != KEEL_OK)
        return st;
    t2 = keel__now_mono_ns();
    c.doomed = malloc((s->state.n + 1) * sizeof *c.doomed);
    if (c.doomed == NULL)
        return keel__fail(KEEL_ENOMEM, "checkpoint retention list");
    st = keel__ckpt_record_commit(s, &c);
    if (st == KEEL_OK) {
        s->lists_deletions = c.n_doomed > 0;
        __atomic_store_n(&s->last_step, p->step, __ATOMIC_RELEASE);
        /* deletions deferred by readers' leases, now released */
        keel__ckpt_lease_sweep(s->dir, &s->state);
        t3 = keel__now_mono_ns();
        keel__ckpt_start_reaping(s, &c);
        keel__log(KEEL_LOG_DEBUG, "saved %s: (setup %.1f ms) file %.1f ms, "
                  "state file %.1f ms, retention start %.1f ms", c.path,
                  (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
                  (double)(t3 - t2) / 1e6,
                  (double)(keel__now_mono_ns() - t3) / 1e6);
    }
    free(c.doomed);
    return st;
}

static void *
writer_main(void *arg)
{
    keel_saver *s = arg;
#ifdef SCHED_BATCH
    /* Background work: never preempt the training thread on wake-up. */
    struct sched_param sp = { 0 };
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
    pthread_mutex_lock(&s->mu);
    for (;;) {
        keel_status st;
        while (!s->has_job && !s->is_quitting)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->has_job)
            break;
        assert(s->in_flight);
        pthread_mutex_unlock(&s->mu);
        s->t_woken_ns = keel__now_mono_ns();
        keel__log(KEEL_LOG_DEBUG, "async save of step %lld: staged in %.2f "
                  "ms, writer running %.2f ms after the staging ended",
                  (long long)s->plan.step,
                  (double)(s->t_staged_ns - s->t_stage_ns) / 1e6,
                  (double)(s->t_woken_ns - s->t_staged_ns) / 1e6);
        st = commit_save(s, &s->plan);
        pthread_mutex_lock(&s->mu);
        s->th_status = st;
        if (st != KEEL_OK)
            snprintf(s->th_err, sizeof s->th_err, "%s", keel_last_error());
        s->has_job = 0;
        s->in_flight = 0;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Start the writer thread (first async save). */
static int
start_writer(keel_saver *s)
{
    if (s->has_thread)
        return 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    s->has_job = s->is_quitting = s->in_flight = 0;
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        pthread_cond_destroy(&s->done_cv);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        return 0;
    }
    s->has_thread = 1;
    return 1;
}

/* Wait for the in-flight save and return its status (re-raised here). */
static keel_status
join_writer(keel_saver *s)
{
    keel_status st;
    if (!s->has_thread)
        return KEEL_OK;
    pthread_mutex_lock(&s->mu);
    while (s->in_flight)
        pthread_cond_wait(&s->done_cv, &s->mu);
    st = s->th_status;
    s->th_status = KEEL_OK;
    pthread_mutex_unlock(&s->mu);
    if (st != KEEL_OK)
        return keel__fail(st, "async checkpoint: %s", s->th_err);
    return KEEL_OK;
}

static void
stop_writer(keel_saver *s)
{
    if (!s->has_thread)
        return;
    pthread_mutex_lock(&s->mu);
    s->is_quitting = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    s->has_thread = 0;
}

keel_status
keel_saver_wait(keel_saver *s)
{
    keel_status st;
    if (s == NULL)
        return keel__fail(KEEL_EINVAL, "keel_saver_wait: saver is NULL");
    st = join_writer(s);
    keel__ckpt_join_reaper(s);
    return st;
}

static size_t
round_up(size_t n)
{
    return (n + KEEL_TENSOR_ALIGN - 1) & ~(size_t)(KEEL_TENSOR_ALIGN - 1);
}

/* Where an n-byte tensor goes in the staging buffer at or after off:
 * aligned as numeric/tensor.c allocates tensors (KEEL__ALIGN_FOR), so the
 * writer can send large ones to disk with O_DIRECT. */
static size_t
stage_at(size_t off, size_t n)
{
    size_t a = KEEL__ALIGN_FOR(n);
    return (off + a - 1) & ~(a - 1);
}

void
keel_ckpt_meta_init(keel_ckpt_meta *meta)
{
    KEEL__STRUCT_INIT(meta);
}

static keel_status
check_meta(const keel_ckpt_meta *meta)
{
    keel_status st;
    if (meta == NULL)
        return KEEL_OK;
    if ((st = KEEL__STRUCT_CHECK(meta, keel_ckpt_meta)) != KEEL_OK)
        return keel__wrap(st, "checkpoint meta");
    if (meta->n_blobs > KEEL_CKPT_MAX_BLOBS)
        return keel__fail(KEEL_EINVAL, "checkpoint meta: %zu blobs, at most "
                          "%d", meta->n_blobs, KEEL_CKPT_MAX_BLOBS);
    if (meta->n_blobs > 0 && meta->blobs == NULL)
        return keel__fail(KEEL_EINVAL, "checkpoint meta: blobs is NULL");
    if (meta->epoch < 0)
        return keel__fail(KEEL_EINVAL, "checkpoint meta: epoch %lld is "
                          "negative", (long long)meta->epoch);
    for (size_t i = 0; i < meta->n_blobs; i++) {
        const keel_ckpt_blob *b = &meta->blobs[i];
        if (b->name == NULL || !keel_name_is_valid(b->name) ||
            strchr(b->name, '/') != NULL || strlen(b->name) >= 64)
            return keel__fail(KEEL_EINVAL, "checkpoint blob name '%s' must "
                              "be one segment of [A-Za-z0-9_.-], < 64 bytes",
                              b->name ? b->name : "(null)");
        if (b->size > 0 && b->data == NULL)
            return keel__fail(KEEL_EINVAL, "checkpoint blob '%s': data is "
                              "NULL", b->name);
        for (size_t j = 0; j < i; j++)
            if (strcmp(meta->blobs[j].name, b->name) == 0)
                return keel__fail(KEEL_EINVAL, "checkpoint blob '%s' given "
                                  "twice", b->name);
    }
    return KEEL_OK;
}

/* Copy a string into the saver's name arena at *off. */
static const char *
arena_put(keel_saver *s, size_t *off, const char *str)
{
    size_t n = strlen(str) + 1;
    char *p = s->names + *off;
    memcpy(p, str, n);
    *off += n;
    return p;
}

/* The end of an n-byte tensor staged at or after off. */
static size_t
stage_end(size_t off, size_t n)
{
    return stage_at(off, n) + round_up(n);
}

/* The staging bytes (*total) and name arena bytes (*text) a save of vs
 * and meta needs. */
static void
stage_measure(const keel_vars *vs, const keel_ckpt_meta *meta,
              size_t *total, size_t *text)
{
    size_t nv = keel_vars_count(vs);
    *total = *text = 0;
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(vs, i);
        const char *sn;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        *total = stage_end(*total, keel_tensor_bytes(keel_var_tensor(v)));
        *text += strlen(keel_var_name(v)) + 1;
        for (size_t j = 0; keel_var_slot_at(v, j, &sn) != NULL; j++) {
            *total = stage_end(*total,
                               keel_tensor_bytes(keel_var_slot_at(v, j,
                                                                  NULL)));
            *text += strlen(sn) + 1;
        }
    }
    if (meta != NULL) {
        for (size_t i = 0; i < meta->n_blobs; i++) {
            *total = stage_end(*total, meta->blobs[i].size);
            *text += strlen(meta->blobs[i].name) + 1;
        }
        *text += (meta->config_text ? strlen(meta->config_text) + 1 : 0) +
                 (meta->topology ? strlen(meta->topology) + 1 : 0) +
                 (meta->architecture ? strlen(meta->architecture) + 1 : 0);
    }
}

/* Grow the staging buffer and the name arena to total and text bytes
 * (they are reused from save to save). */
static keel_status
stage_reserve(keel_saver *s, size_t total, size_t text)
{
    if (total > s->stage_cap) {
        char *nb = keel_aligned_alloc(total);
        if (nb == NULL)
            return keel__fail(KEEL_ENOMEM, "async checkpoint staging buffer "
                              "of %zu bytes", total);
        keel_aligned_free(s->stage);
        s->stage = nb;
        s->stage_cap = total;
    }
    if (text + 1 > s->names_cap) {
        char *nn = realloc(s->names, text + 1);
        if (nn == NULL)
            return keel__fail(KEEL_ENOMEM, "async checkpoint names");
        s->names = nn;
        s->names_cap = text + 1;
    }
    return KEEL_OK;
}

/* Copy t into the staging buffer at or after *off and add it to the plan
 * as variable name (slot NULL) or as its slot. */
static keel_status
stage_tensor(keel_saver *s, const char *name, const char *slot,
             const keel_tensor *t, size_t *off)
{
    size_t n = keel_tensor_bytes(t);
    keel_status st;
    *off = stage_at(*off, n);
    memcpy(s->stage + *off, t->data, n);
    st = keel__ckpt_plan_add(&s->plan, name, slot, t, s->stage + *off);
    if (st != KEEL_OK)
        return st;
    *off += round_up(n);
    return KEEL_OK;
}

/* Every saved variable and its slots, names into the arena at *toff. */
static keel_status
stage_vars(keel_saver *s, const keel_vars *vs, size_t *off, size_t *toff)
{
    size_t nv = keel_vars_count(vs);
    keel_status st;
    s->plan.n = 0;
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_tensor *sl;
        const char *name, *sn;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        name = arena_put(s, toff, keel_var_name(v));
        st = stage_tensor(s, name, NULL, keel_var_tensor(v), off);
        if (st != KEEL_OK)
            return st;
        for (size_t j = 0; (sl = keel_var_slot_at(v, j, &sn)) != NULL; j++) {
            st = stage_tensor(s, name, arena_put(s, toff, sn), sl, off);
            if (st != KEEL_OK)
                return st;
        }
    }
    return KEEL_OK;
}

/* meta's blobs (after the tensors, from off) and texts into the plan. */
static void
stage_meta(keel_saver *s, const keel_ckpt_meta *meta, size_t off,
           size_t *toff)
{
    ck_plan *p = &s->plan;
    p->n_blobs = 0;
    p->config_text = p->topology = p->architecture = NULL;
    p->epoch = meta != NULL ? meta->epoch : 0;
    if (meta == NULL)
        return;
    for (size_t i = 0; i < meta->n_blobs; i++) {
        keel_ckpt_blob *b = &p->blobs[p->n_blobs++];
        b->name = arena_put(s, toff, meta->blobs[i].name);
        b->size = meta->blobs[i].size;
        off = stage_at(off, b->size);
        if (b->size > 0)
            memcpy(s->stage + off, meta->blobs[i].data, b->size);
        b->data = s->stage + off;
        off += round_up(b->size);
    }
    if (meta->config_text != NULL)
        p->config_text = arena_put(s, toff, meta->config_text);
    if (meta->topology != NULL)
        p->topology = arena_put(s, toff, meta->topology);
    if (meta->architecture != NULL)
        p->architecture = arena_put(s, toff, meta->architecture);
}

/* Async: copy every tensor, name and meta into staging memory. */
static keel_status
stage(keel_saver *s, const keel_vars *vs, const keel_ckpt_meta *meta)
{
    size_t total, text, off = 0, toff = 0;
    keel_status st;
    stage_measure(vs, meta, &total, &text);
    st = stage_reserve(s, total, text);
    if (st == KEEL_OK)
        st = stage_vars(s, vs, &off, &toff);
    if (st == KEEL_OK)
        stage_meta(s, meta, off, &toff);
    return st;
}

/* Sync: the plan points straight at the store's tensors. */
static keel_status
plan_direct(ck_plan *p, const keel_vars *vs, const keel_ckpt_meta *meta)
{
    size_t nv = keel_vars_count(vs);
    keel_status st;
    p->n = 0;
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_tensor *t = keel_var_tensor(v), *sl;
        const char *sn;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL)
            continue;
        st = keel__ckpt_plan_add(p, keel_var_name(v), NULL, t, t->data);
        if (st != KEEL_OK)
            return st;
        for (size_t j = 0; (sl = keel_var_slot_at(v, j, &sn)) != NULL; j++) {
            st = keel__ckpt_plan_add(p, keel_var_name(v), sn, sl, sl->data);
            if (st != KEEL_OK)
                return st;
        }
    }
    p->n_blobs = 0;
    p->config_text = meta != NULL ? meta->config_text : NULL;
    p->topology = meta != NULL ? meta->topology : NULL;
    p->architecture = meta != NULL ? meta->architecture : NULL;
    p->epoch = meta != NULL ? meta->epoch : 0;
    if (meta != NULL)
        for (size_t i = 0; i < meta->n_blobs; i++)
            p->blobs[p->n_blobs++] = meta->blobs[i];
    return KEEL_OK;
}

void
keel_ckpt_index_config_init(keel_ckpt_index_config *cfg)
{
    if (cfg == NULL)
        return;
    KEEL__STRUCT_INIT(cfg);
}

/* keel_saver_save, and with index an index of index->shard_count shards
 * (keel_saver_save_sharded). */
static keel_status
save(keel_saver *s, const keel_vars *vs, const keel_ckpt_meta *meta,
     const keel_ckpt_index_config *index, char *path, size_t path_size)
{
    keel_status st;
    int64_t step;
    char name[KEEL_NAME_MAX];

    if (s == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "keel_saver_save: NULL saver or "
                          "variable store");
    /* A failed earlier async save is reported here, never dropped; this
     * save is then not started. */
    st = join_writer(s);
    if (st != KEEL_OK)
        return st;
    st = check_meta(meta);
    if (st != KEEL_OK)
        return st;
    step = keel_vars_global_step(vs);
    if (step < 0)
        return keel__fail(KEEL_EINVAL, "cannot checkpoint negative global "
                          "step %lld", (long long)step);
    st = keel__ckpt_file_name(name, sizeof name, s->basename, step,
                              meta != NULL ? meta->epoch : 0);
    if (st == KEEL_OK && path != NULL)
        st = keel__path_join(path, path_size, s->dir, name);
    if (st != KEEL_OK)
        return st;
    if (step == keel_saver_last_step(s))
        return KEEL_OK;
    s->plan.step = step;
    s->plan.run_id = index != NULL ? index->run_id : 0;
    s->plan.shard_count = index != NULL ? index->shard_count : 0;
    s->plan.shard_index = -1;
    s->plan.partitioned = index != NULL && index->partitioned;
    s->plan.wall_time = keel__now_wall();
    if (!s->is_async) {
        st = plan_direct(&s->plan, vs, meta);
        if (st == KEEL_OK)
            st = check_room(&s->plan);
        if (st == KEEL_OK)
            st = commit_save(s, &s->plan);
        return st;
    }
    s->t_stage_ns = keel__now_mono_ns();
    st = stage(s, vs, meta);
    if (st == KEEL_OK)
        st = check_room(&s->plan);
    if (st != KEEL_OK)
        return st;
    s->t_staged_ns = keel__now_mono_ns();
    if (!start_writer(s)) {
        /* No thread: write it here rather than drop it. */
        return commit_save(s, &s->plan);
    }
    pthread_mutex_lock(&s->mu);
    /* the previous save was waited for: its staging buffer is free */
    assert(!s->has_job && !s->in_flight);
    s->th_err[0] = '\0';
    s->has_job = 1;
    s->in_flight = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return KEEL_OK;
}

keel_status
keel_saver_save(keel_saver *s, const keel_vars *vs,
                const keel_ckpt_meta *meta, char *path, size_t path_size)
{
    return save(s, vs, meta, NULL, path, path_size);
}

keel_status
keel_saver_save_sharded(keel_saver *s, const keel_vars *vs,
                        const keel_ckpt_meta *meta,
                        const keel_ckpt_index_config *index, char *path,
                        size_t path_size)
{
    keel_status st;
    if (index == NULL)
        return keel__fail(KEEL_EINVAL, "keel_saver_save_sharded: index is "
                          "NULL");
    st = KEEL__STRUCT_CHECK(index, keel_ckpt_index_config);
    if (st != KEEL_OK)
        return keel__wrap(st, "keel_saver_save_sharded");
    if (index->shard_count < 1 || index->shard_count > CK_MAX_SHARDS)
        return keel__fail(KEEL_EINVAL, "keel_saver_save_sharded: "
                          "shard_count %d outside 1..%d",
                          index->shard_count, CK_MAX_SHARDS);
    return save(s, vs, meta, index, path, path_size);
}

void
keel_saver_free(keel_saver *s)
{
    if (s == NULL)
        return;
    if (join_writer(s) != KEEL_OK)
        keel__log(KEEL_LOG_ERROR, "%s", keel_last_error());
    stop_writer(s);
    keel__ckpt_join_reaper(s);
    keel__ckpt_drop_finished_deletions(s);
    keel__ckpt_state_free(&s->state);
    free(s->plan.items);
    keel_aligned_free(s->stage);
    free(s->names);
    free(s);
}
