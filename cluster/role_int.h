/* role_int.h - private to cluster/: what the ps task (ps_task.c) and the
 * worker backend (worker.c and its parts) share: the options they run
 * with, resolved for the spec (options.c), and the placement of the
 * variables on the ps (placement.c). */
#ifndef KEEL_CLUSTER_ROLE_INT_H
#define KEEL_CLUSTER_ROLE_INT_H

#include <stdint.h>

#include <keel/cluster.h>
#include <keel/distributed.h>
#include "cluster_int.h"

/* The micro-batch gradient stores one push may carry (each trainable
 * variable once per store): keel_cluster_backend_set_micro's bound, and
 * what a ps and a worker size their messages for. */
#define KEEL__MAX_MICRO 64

/* The options every role function reads: the caller's options, checked,
 * and what they resolve to for this spec. */
typedef struct keel__role_opts {
    keel_cluster_config in;        /* optimizer and algorithm NULL: the
                                     * update rule is algo */
    const keel_cluster_spec *spec;
    int round_robin;                /* in.placement is round-robin */
    int send_buffer_bytes;          /* keel__wire_set_send_buffer's
                                     * in.send_buffer_kib; 0: the kernel's
                                     * autotuning */
    keel__algo algo;                /* the update rule (owns its rates:
                                     * keel__algo_clear) */
} keel__role_opts;

/* ---- options (options.c) ------------------------------------------------ */

/* Check in (NULL: the defaults; who names the caller in the errors) and
 * resolve it for spec into *o; on success *o owns the rule's rates
 * (keel__algo_clear(&o->algo)). */
keel_status keel__role_opts_from(const keel_cluster_spec *spec,
                                 const keel_cluster_config *in,
                                 const char *who, keel__role_opts *o);
/* This task's CURVE keys (o->in.curve: KEY_DIR/<type><index>.key and
 * _secret; clients read ps<i>.key), else its job token, else none. */
keel_status keel__role_load_curve(const keel__role_opts *o, keel__curve *c);
/* The largest tensor of vs (variables and their slots), in bytes. */
uint64_t keel__role_largest_tensor(const keel_vars *vs);
/* cluster.send_buffer_kib for every socket this task creates. */
void keel__role_set_send_buffer(const keel__role_opts *o);

/* ---- placement (placement.c) -------------------------------------------- */

/* The ps of each variable of vs into ps_of (keel_vars_count(vs) of them;
 * -1 for a local variable): variable i to ps i mod n_ps with round_robin,
 * else to the least loaded ps so far (ties: the lowest). KEEL_EINVAL for
 * n_ps < 1. */
keel_status keel__cluster_place(const keel_vars *vs, int n_ps,
                                int round_robin, int *ps_of);

/* ---- partitioned variables (partition.c) ------------------------------- */

/* The caller's store split for the wire: wire holds, in the caller's
 * order, each variable i either unsplit (parts[i] 1, same name) or as its
 * parts[i] parts "NAME/part_k" (rows of keel__partition_rows), from entry
 * first[i] on. */
typedef struct keel__partition {
    keel_vars *wire;
    size_t n;                      /* variables of the caller's store */
    size_t *first;
    int *parts;
} keel__partition;

/* How many parts variable v is split into (1: not split): see
 * keel_cluster_config.partition_bytes; max_parts >= 1. */
int keel__partition_count(keel_var *v, int64_t part_bytes, int max_parts);
/* Part i of k of a variable of rows rows: rows [*first, *first + *n); the
 * first rows % k parts are one row longer. */
void keel__partition_rows(int64_t rows, int k, int i, int64_t *first,
                          int64_t *n);
/* The split of vs for n_ps ps (max_parts 0: n_ps), with zero-filled
 * copies of the slots when with_slots; *out NULL (and KEEL_OK) when no
 * variable is split. Caller owns *out: keel__partition_free. */
keel_status keel__partition_new(const keel_vars *vs, int n_ps,
                                int64_t part_bytes, int max_parts,
                                int with_slots, keel__partition **out);
/* 1 when entry j of p->wire is a part of a split variable of vs (the
 * store p was made from): *whole its name (vs's), its rows [*row_begin,
 * *row_end); 0 when entry j is a variable whole. */
int keel__partition_part_of(const keel__partition *p, const keel_vars *vs,
                            size_t j, const char **whole,
                            int64_t *row_begin, int64_t *row_end);
void keel__partition_free(keel__partition *p);
/* vs (the store p was made from) into p->wire (scatter) or p->wire into
 * vs (gather): values, initialized flags, the global step and, with
 * with_slots, the slots. A gather skips vs's local variables and, with
 * trainable_only, every variable that is not trainable. */
void keel__partition_scatter(const keel__partition *p, keel_vars *vs,
                             int with_slots);
void keel__partition_gather(const keel__partition *p, keel_vars *vs,
                            int with_slots, int trainable_only);
/* Only variable i's value from p->wire into vs. */
void keel__partition_gather_var(const keel__partition *p, keel_vars *vs,
                                size_t i);
/* Gradients from (a store of the caller's vs) split into to (a store of
 * p->wire), with from's example count. */
void keel__partition_grads(const keel__partition *p, keel_grads *from,
                           keel_grads *to);

#endif
