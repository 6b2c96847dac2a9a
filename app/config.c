/* config.c - the job configuration (keel/config.h): one schema table that
 * validates INI files, -s overrides and $OUTPUT_DIR, and documents every
 * key. inih parses; this file owns all knowledge of keys. */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include <keel/config.h>
#include <keel/distributed.h>
#include <keel/tensor.h>
#include <keel/train.h>
#include "defaults.h"
#include "util.h"
#include "../cluster/defaults.h"

/* Lists (T_*_LIST, T_ADDR_LIST) are comma-separated and may continue on
 * indented lines. */
typedef enum { T_INT, T_DOUBLE, T_BOOL, T_STRING, T_ENUM, T_INT_LIST,
               T_DOUBLE_LIST, T_ADDR_LIST } key_type;

typedef struct key_def {
    const char *section;
    const char *name;
    key_type type;
    const char *def;        /* default as text */
    double lo, hi;          /* numeric bounds (inclusive) */
    const char *choices;    /* T_ENUM: "a|b|c" */
    const char *doc;
} key_def;

#define NOLIM -1e300, 1e300
#define VALUE_MAX 65536     /* bytes of one value, continuation lines joined */
#define I64MAX 9.2e18

/* The schema. Order here is the order of `keel config check` and docs. */
/* cluster defaults shared with keel_cluster_config_init */
#define D(name) KEEL__XSTR(KEEL__CLUSTER_##name)

static const key_def schema[] = {
    { "model", "type", T_ENUM, "mlp", NOLIM, "softmax|mlp|cnn",
      "Model: softmax regression, a multi-layer perceptron, or a small "
      "CNN (Conv32-Pool-Conv64-Pool-Dense64-Dense(classes), images "
      "only)." },
    { "model", "init", T_ENUM, "glorot", NOLIM, "glorot|torch",
      "Initial weights: glorot (Keras: Glorot-uniform kernels, zero "
      "biases) or torch (PyTorch's default: kernels and biases "
      "U(-1/sqrt(fan_in), 1/sqrt(fan_in)))." },
    { "model", "hidden", T_INT_LIST, "256,256", 1, 65536, NULL,
      "MLP hidden layer widths, comma-separated (mlp only)." },
    { "model", "classes", T_INT, "0", 0, 1000000, NULL,
      "Number of classes (labels 0..classes-1); 0: the largest label of "
      "the training set plus one. A label outside the range is an error "
      "naming the file and the row." },

    { "data", "dir", T_STRING, "/usr/share/datasets/fashion-mnist", NOLIM,
      NULL, "Directory of the IDX files (train-images-idx3-ubyte[.gz], "
      "train-labels-idx1-ubyte[.gz], t10k-...). Debian's "
      "dataset-fashion-mnist installs them here." },
    { "data", "format", T_ENUM, "idx", NOLIM, "idx|hdf5",
      "idx: MNIST-format files in data.dir; hdf5: data.train_file and "
      "data.test_file with datasets x and y." },
    { "data", "train_file", T_STRING, "", NOLIM, NULL,
      "HDF5 training file (format = hdf5); relative paths are relative to "
      "data.dir." },
    { "data", "test_file", T_STRING, "", NOLIM, NULL,
      "HDF5 test file (format = hdf5) for keel eval." },
    { "data", "shuffle", T_BOOL, "true", NOLIM, NULL,
      "Shuffle the training set every epoch (deterministically from "
      "train.seed)." },
    { "data", "stream", T_ENUM, "auto", NOLIM, "auto|on|off",
      "HDF5 sets: on reads x in blocks of data.shuffle_block rows while "
      "training (two blocks in memory, the labels whole); off reads the "
      "file into memory; auto streams a file larger than "
      "data.memory_budget_mb. Both give the same batches." },
    { "data", "memory_budget_mb", T_INT, "1024", 1, 1 << 30, NULL,
      "MiB a data file may take before data.stream = auto streams it." },
    { "data", "shuffle_block", T_INT, "4096", 1, 2147483647, NULL,
      "HDF5 sets: each epoch shuffles the order of the blocks of this "
      "many consecutive rows and the rows within each block (the unit "
      "a streamed set is read in). A block of at least the set's size "
      "shuffles the whole set at once." },

    { "optimizer", "name", T_ENUM, "sgd", NOLIM,
      "sgd|momentum|adagrad|adam|rmsprop|kfac",
      "Optimizer; kfac: K-FAC with the [kfac] keys (docs/kfac.md)." },
    { "optimizer", "learning_rate", T_DOUBLE, "0.01", 0, 1e6, NULL,
      "Learning rate (the first value of a schedule); 0.0001 when unset "
      "with kfac." },
    { "optimizer", "momentum", T_DOUBLE, "0.9", 0, 1, NULL,
      "Momentum (momentum, rmsprop)." },
    { "optimizer", "nesterov", T_BOOL, "false", NOLIM, NULL,
      "Nesterov momentum (momentum only)." },
    { "optimizer", "beta1", T_DOUBLE, "0.9", 0, 1, NULL, "Adam beta1." },
    { "optimizer", "beta2", T_DOUBLE, "0.999", 0, 1, NULL, "Adam beta2." },
    { "optimizer", "epsilon", T_DOUBLE, "1e-7", 0, 1, NULL,
      "Adam, Adagrad and RMSProp epsilon." },
    { "optimizer", "rho", T_DOUBLE, "0.9", 0, 1, NULL,
      "RMSProp decay of the squared-gradient average." },
    { "optimizer", "initial_accumulator_value", T_DOUBLE, "0.1", 0, 1e6,
      NULL, "Adagrad's starting accumulator." },
    { "optimizer", "schedule", T_ENUM, "constant", NOLIM,
      "constant|piecewise|exponential",
      "Learning-rate schedule over global steps or epochs "
      "(schedule_unit)." },
    { "optimizer", "boundaries", T_INT_LIST, "", 0, I64MAX, NULL,
      "piecewise: boundaries in schedule_unit, increasing (e.g. "
      "2814,6566 steps, or 3,7 epochs)." },
    { "optimizer", "values", T_DOUBLE_LIST, "", 0, 1e6, NULL,
      "piecewise: learning rates, one more than boundaries." },
    { "optimizer", "schedule_unit", T_ENUM, "steps", NOLIM, "steps|epochs",
      "What boundaries and decay_steps count: global steps, or epochs "
      "(the schedule changes at the first step of an epoch; the "
      "tf.distribute tutorial's decay is schedule = piecewise, "
      "schedule_unit = epochs, boundaries = 3,7, values = "
      "1e-3,1e-4,1e-5)." },
    { "optimizer", "decay_rate", T_DOUBLE, "0.96", 0, 1, NULL,
      "exponential: lr * decay_rate^(step / decay_steps)." },
    { "optimizer", "decay_steps", T_INT, "1000", 1, I64MAX, NULL,
      "exponential: steps (or epochs, schedule_unit) per decay." },
    { "optimizer", "staircase", T_BOOL, "false", NOLIM, NULL,
      "exponential: decay in whole steps of decay_steps." },

    { "kfac", "damping", T_DOUBLE, "0.001", 1e-12, 1e6, NULL,
      "Tikhonov damping lambda, factored between A and G with the "
      "trace-norm pi (a convolution's divided by its output locations)." },
    { "kfac", "cov_ema_decay", T_DOUBLE, "0.95", 0, 0.999999, NULL,
      "Decay of the factors' zero-debiased moving averages." },
    { "kfac", "momentum", T_DOUBLE, "0.9", 0, 0.999999, NULL,
      "Momentum of the K-FAC update." },
    { "kfac", "momentum_type", T_ENUM, "adam", NOLIM, "regular|adam",
      "adam: v = mu v + g, step F^-1 v; regular: v = mu v + F^-1 g, step "
      "v." },
    { "kfac", "estimation_mode", T_ENUM, "gradients", NOLIM,
      "gradients|empirical",
      "G from targets sampled from the model (gradients: the true "
      "Fisher) or from the labels (empirical Fisher)." },
    { "kfac", "norm_constraint", T_DOUBLE, "0", 0, 1e12, NULL,
      "KL clipping: scale the update so lr^2 <g, F^-1 g> <= this (0: "
      "off)." },
    { "kfac", "invert_every", T_INT, "10", 1, 1000000, NULL,
      "Recompute the damped inverses every this many steps." },
    { "kfac", "cov_update_every", T_INT, "1", 1, 1000000, NULL,
      "Update the factors every this many steps (their decay per update "
      "is then cov_ema_decay to this power)." },
    { "kfac", "distributed", T_ENUM, "chief", NOLIM, "chief|roles",
      "In a cluster (sync mode): chief: every replica computes gradients, "
      "the chief alone the factor statistics, inverses and the update; "
      "roles: gradient, covariance and inverse workers by replica index "
      "(docs/kfac.md). Ignored in one process." },
    { "kfac", "replicas_to_aggregate", T_ENUM, "cluster", NOLIM,
      "cluster|kfac",
      "kfac.distributed = chief: the gradients a sync step aggregates; "
      "cluster: cluster.replicas_to_aggregate; kfac: ceil(0.6 N) of N >= 3 "
      "replicas (the rest are backups)." },
    { "kfac", "gradient_fraction", T_DOUBLE, "0.6", 0, 1, NULL,
      "kfac.distributed = roles: replicas [0, floor(f N)) (at least 1) "
      "compute gradients; the chief is one." },
    { "kfac", "covariance_fraction", T_DOUBLE, "0.2", 0, 1, NULL,
      "kfac.distributed = roles: the next floor(f N) replicas (at least 1) "
      "compute factor statistics; the rest (at least 1) invert factors." },

    { "train", "batch_size", T_INT, "64", 1, 1 << 20, NULL,
      "Global batch size (split across workers)." },
    { "train", "max_steps", T_INT, "0", 0, I64MAX, NULL,
      "Stop at this global step (0: no step limit). With epochs, "
      "whichever comes first." },
    { "train", "epochs", T_INT, "0", 0, 1000000, NULL,
      "Stop after this many passes over the data (0: no epoch limit)." },
    { "train", "seed", T_INT, "0", 0, I64MAX, NULL,
      "Seed for initialization and shuffling." },
    { "train", "threads", T_INT, "0", 0, 1024, NULL,
      "OpenBLAS threads (0: OpenBLAS's default). Not bit-neutral on "
      "every OpenBLAS kernel (Haswell's and Zen's sgemm round differently "
      "on 2 threads than on 1): for results that do not depend on the "
      "thread count, set 1 and use train.model_threads." },
    { "train", "model_threads", T_INT, "1", 1, 8, NULL,
      "Persistent model threads (with single-threaded OpenBLAS) that "
      "share the fixed pieces of every batch (CNN: 16 examples; dense "
      "models: ceil(batch_size / 256) equal pieces, each layer in two "
      "fixed column halves) and the optimizer update. Results are bitwise identical for every value (with "
      "OpenBLAS single-threaded, as model threads always run it). With "
      "algorithm.name = hogwild: the Hogwild threads (not bit-neutral)." },
    { "train", "strategy", T_ENUM, "auto", NOLIM,
      "auto|one_device|mirrored|multi_worker_mirrored|parameter_server",
      "How the replicas are spread: one_device (one process), mirrored "
      "(train.replicas threads in one process, each with its slice of the "
      "batch, gradients added in a fixed order, one update), "
      "multi_worker_mirrored (one replica per MPI rank, every rank "
      "holding every variable, gradients all-reduced, no ps; start the "
      "ranks with mpirun, srun or keel launch --strategy "
      "multi_worker_mirrored), parameter_server (chief and workers of a "
      "cluster with ps tasks). auto: parameter_server when the process has "
      "a cluster (TF_CONFIG, Slurm, keel launch), else one_device. Every "
      "strategy writes the same checkpoints (the chief's), restorable "
      "under any other." },
    { "train", "replicas", T_INT, "2", 1, 8, NULL,
      "Replicas of train.strategy = mirrored (threads in this process; "
      "each runs train.model_threads model threads). train.batch_size is "
      "the global batch, split evenly over them." },
    { "train", "micro_batch", T_INT, "0", 0, 1 << 20, NULL,
      "Fixed micro-batch size (0: off). Each gradient is summed over "
      "micro-batches of this many examples in global order, so 1 process "
      "and any number of cluster workers give identical bits; the "
      "per-worker batch must be a multiple of it." },
    { "train", "leaves", T_INT, "4", 1, 65536, NULL,
      "multi_worker_mirrored: the global batch is cut into this many equal "
      "leaves whose gradients are added along one fixed binary tree, so "
      "every rank count up to it gives identical bits (train.batch_size a "
      "multiple of it; 1 to 64 leaves per rank)." },
    { "train", "eval_batch_size", T_INT, "1000", 1, 1 << 20, NULL,
      "Batch size of keel eval." },
    { "train", "validate_every_epochs", T_INT, "0", 0, 1000000, NULL,
      "Evaluate the test set after every N epochs during training (0: "
      "never): loss and accuracy logged and written as validation/loss "
      "and validation/accuracy to <checkpoint.dir>/validation events. "
      "The chief only, in a cluster." },

    { "checkpoint", "dir", T_STRING, "keel_output", NOLIM, NULL,
      "Checkpoint and summary directory; $OUTPUT_DIR, when set, "
      "replaces it." },
    { "checkpoint", "basename", T_STRING, "model.ckpt", NOLIM, NULL,
      "Checkpoint files are <basename>-<step>.h5 (end-of-epoch ones "
      "<basename>-epoch<E>-<step>.h5)." },
    { "checkpoint", "save_steps", T_INT, "0", 0, I64MAX, NULL,
      "Save every N global steps (0: use save_secs)." },
    { "checkpoint", "save_secs", T_DOUBLE, "600", 0, 1e9, NULL,
      "Save every N seconds when save_steps is not set (0: only at "
      "start and end)." },
    { "checkpoint", "save_epochs", T_INT, "0", 0, 1000000, NULL,
      "Also save at the end of every N epochs (0: off), as Keras's "
      "ModelCheckpoint: files <basename>-epoch<E>-<step>.h5, E the epochs "
      "completed, kept by max_to_keep like every checkpoint." },
    { "checkpoint", "max_to_keep", T_INT, "5", 0, 1000000, NULL,
      "Newest checkpoints to keep (0: keep all)." },
    { "checkpoint", "keep_checkpoint_every_n_hours", T_DOUBLE, "0", 0, 1e6,
      NULL, "Also keep one checkpoint per N hours (0: off)." },
    { "checkpoint", "async", T_BOOL, "false", NOLIM, NULL,
      "Write checkpoints in a background thread; the step waits only for "
      "a copy of the variables." },
    { "checkpoint", "save_on_error", T_BOOL, "false", NOLIM, NULL,
      "Also write the final checkpoint when training stops on an error "
      "(TF1 never does)." },
    { "checkpoint", "warm_start_from", T_STRING, "", NOLIM, NULL,
      "Start a new run from another run's checkpoint (a file, or a "
      "directory: its newest): variables restored by name, the ones it "
      "lacks initialized, step and optimizer state fresh. Only while dir "
      "holds no checkpoint: a dir with one resumes it instead. Never dir "
      "itself (\"\": off)." },
    { "checkpoint", "warm_start_vars", T_STRING, "", NOLIM, NULL,
      "Warm-start only the variables whose whole name matches this POSIX "
      "extended regex (\"\": every variable)." },

    { "hooks", "log_every_steps", T_INT, "100", 0, I64MAX, NULL,
      "Log step, epoch, loss, accuracy, learning rate and examples/s "
      "every N steps (0: off)." },
    { "hooks", "summary_every_steps", T_INT, "100", 0, I64MAX, NULL,
      "Write TensorBoard and CSV scalars every N steps (0: off)." },
    { "hooks", "nan_check", T_BOOL, "true", NOLIM, NULL,
      "Stop with an error (exit 1) when the loss is NaN; the chief checks "
      "before saving, so no checkpoint of a diverged step is written." },
    { "hooks", "inf_check", T_BOOL, "false", NOLIM, NULL,
      "Also treat an infinite loss as an error." },
    { "hooks", "profile_steps", T_INT, "0", 0, I64MAX, NULL,
      "Write a Chrome trace of step timings every N steps (0: off)." },
    { "hooks", "progress", T_ENUM, "auto", NOLIM, "auto|on|off",
      "Progress bar on stderr with epoch, step, examples/s, loss and ETA "
      "(auto: only when stderr is a terminal)." },

    { "cluster", "chief", T_STRING, "", NOLIM, NULL,
      "Chief address host:port (empty: worker 0 is the chief)." },
    { "cluster", "ps", T_ADDR_LIST, "", NOLIM, NULL,
      "Parameter servers, comma-separated host:port list (a host is a "
      "name, an IPv4 address or [IPv6 address])." },
    { "cluster", "bind_address", T_STRING, "", NOLIM, NULL,
      "Where a ps listens. Empty: every address of this machine its own "
      "entry's host resolves to (an error when none is); *: every "
      "interface; an interface name (eth0): its addresses; or one address "
      "of this machine. The port is the entry's." },
    { "cluster", "local_transport", T_ENUM, "auto", NOLIM, "auto|tcp",
      "auto: a ps on an address of its own host also listens on a Unix "
      "socket in /tmp/keel-<uid> (private to the user), and tasks of that "
      "host whose ps socket exists there connect over it, "
      "with the same token or CURVE checks; tcp: tcp only (tasks of one "
      "host run as different users or in different /tmp)." },
    { "cluster", "workers", T_ADDR_LIST, "", NOLIM, NULL,
      "Workers, comma-separated host:port list." },
    { "cluster", "mode", T_ENUM, "sync", NOLIM, "sync|async",
      "sync: SyncReplicas with tokens; async: each push applied as it "
      "arrives." },
    { "cluster", "replicas_to_aggregate", T_INT, "0", 0, 1 << 20, NULL,
      "sync: gradients averaged per step, at most the training replicas "
      "(chief + workers; more is an error at start); fewer leaves the "
      "rest as backup workers, and the update is the mean of the gradients "
      "aggregated (0: every replica)." },
    { "cluster", "total_num_replicas", T_INT, "0", 0, 1 << 20, NULL,
      "sync: the training replicas producing gradients; must equal the "
      "cluster's chief + workers when set (0: that number)." },
    { "cluster", "num_ps", T_INT, D(SLURM_NUM_PS), 0, 4096, NULL,
      "Slurm: how many of the tasks are parameter servers." },
    { "cluster", "port_base", T_INT, D(SLURM_PORT_BASE), 1, 65535, NULL,
      "Slurm: first port on each node (task k of a node listens on "
      "port_base + k), unless srun --resv-ports set "
      "SLURM_STEP_RESV_PORTS." },
    { "cluster", "placement", T_ENUM, "size_balanced", NOLIM,
      "round_robin|size_balanced",
      "How variables are spread over parameter servers." },
    { "cluster", "reduce_tree", T_BOOL, "true", NOLIM, NULL,
      "Sync mode: the ps add the replicas' gradients along the fixed "
      "binary tree over the model's pieces of the global batch (each "
      "replica pushes the sums of the tree nodes covering its pieces, one "
      "for a power-of-two replica count dividing the pieces), so 1, 2, 3, 4 ... replicas give the same "
      "bits where the batch allows it (docs/determinism.md). false: in "
      "replica order (one push each; results differ between replica "
      "counts in the last bits)." },
    { "cluster", "heartbeat_ms", T_INT, D(HEARTBEAT_MS), 10, 600000, NULL,
      "Workers and the chief ping every ps this often (own thread and "
      "sockets), so a lost or restarted ps is noticed within about one "
      "period even while a sync step waits for other replicas." },
    { "cluster", "send_buffer_kib", T_INT, D(SEND_BUFFER_KIB), 0, 65536, NULL,
      "Kernel send buffer of every cluster socket, in KiB (the kernel "
      "doubles it: the bytes a connection has in flight); 0: the kernel's "
      "autotuning. 512 suits loopback (docs/protocol.md); across "
      "machines raise it to about the link's bandwidth x round trip, e.g. "
      "2048 for 10 Gb/s at 1 ms." },
    { "cluster", "dead_after_ms", T_INT, D(DEAD_AFTER_MS), 100, 86400000, NULL,
      "A ps silent this long is declared dead (the step is given up and "
      "the session recovers); also the deadline of every request." },
    { "cluster", "stall_warn_secs", T_DOUBLE, D(STALL_WARN_SECS), 0, 1e6, NULL,
      "A sync step waiting this long is logged (by the waiting replicas "
      "and the ps) with the replicas it lacks and how long each has been "
      "silent; 0: never." },
    { "cluster", "step_timeout_secs", T_DOUBLE, D(STEP_TIMEOUT_SECS), 0, 1e9, NULL,
      "A replica whose step has not completed after this long fails with "
      "an error naming what the step lacks; 0: wait forever." },
    { "cluster", "orphan_secs", T_DOUBLE, D(ORPHAN_SECS), 0, 1e9, NULL,
      "A ps that has not heard from the chief for this long exits 1 "
      "(no parameter server left running forever); 0: never." },
    { "cluster", "ready_retry_ms", T_INT, D(READY_RETRY_MS), 1, 60000, NULL,
      "Workers' retry interval while waiting for the chief (readiness is "
      "also pushed as an event)." },
    { "cluster", "max_wait_secs", T_DOUBLE, D(MAX_WAIT_SECS), 0, 1e9, NULL,
      "How long the chief waits for the ps, a worker for the chief, and "
      "every task for the cluster's host names to resolve, before "
      "failing; the waiting task names the missing peers every 10 s." },
    { "cluster", "stop_grace_secs", T_DOUBLE,
      KEEL__XSTR(KEEL__DEFAULT_STOP_GRACE_SECS), 0, 1e6, NULL,
      "Grace period for threads at shutdown." },
    { "cluster", "eval_timeout_secs", T_DOUBLE, "7200", 0.001, 1e9, NULL,
      "Evaluator task: fail (exit 1) when no new checkpoint appears in "
      "checkpoint.dir for this long." },

    { "algorithm", "name", T_ENUM, "sync", NOLIM,
      "sync|async|hogwild|downpour|downpour_easy|agn|sagn|adag|dynsgd|"
      "easgd|aeasgd|aeamsgd|model_averaging",
      "The update rule (docs/algorithms.md). On a cluster: sync is "
      "SyncReplicas, async and hogwild apply each push as it arrives, the "
      "others as their rules say; unset: cluster.mode (or TF_CONFIG's "
      "mode), sync or async. In one process: hogwild runs "
      "train.model_threads threads, each on its own batch_size "
      "mini-batches, updating the shared variables with no lock; the "
      "others train as usual." },
    { "algorithm", "hogwild_cas", T_BOOL, "false", NOLIM, NULL,
      "hogwild in one process: change each variable element by a "
      "compare-and-swap loop, so no concurrent update is lost (false: "
      "plain racy stores, the paper's setting)." },
    { "algorithm", "learning_rate", T_DOUBLE, "0", 0, 1e6, NULL,
      "eta: the workers' local SGD step (alpha in DOWNPOUR), and ADAG's "
      "eta on the ps; 0: optimizer.learning_rate with its schedule." },
    { "algorithm", "ps_learning_rate", T_DOUBLE, "0", 0, 1e6, NULL,
      "gamma: the ps's step on a DOWNPOUR commit (Adagrad's base rate; "
      "SGD's in downpour_easy); 0: optimizer.learning_rate." },
    { "algorithm", "window", T_INT, "0", 0, 1 << 20, NULL,
      "Local steps per commit: lambda (agn, sagn, adag, dynsgd, "
      "model_averaging) or tau (easgd, aeasgd, aeamsgd); 0: the rule's "
      "default (12, 12, 12, 5, 10; 1, 32, 32)." },
    { "algorithm", "n_fetch", T_INT, "0", 0, 1 << 20, NULL,
      "DOWNPOUR: pull the center before every n_fetch-th local step; 0: "
      "5." },
    { "algorithm", "n_push", T_INT, "0", 0, 1 << 20, NULL,
      "DOWNPOUR: commit the accrued gradient every n_push local steps; 0: "
      "5." },
    { "algorithm", "epsilon", T_DOUBLE, "0", 0, 1, NULL,
      "DOWNPOUR's Adagrad: gamma / (sqrt(sum of squares) + epsilon); 0: "
      "1e-8." },
    { "algorithm", "moving_rate", T_DOUBLE, "0", 0, 1, NULL,
      "alpha = eta * rho of elastic averaging (easgd, aeasgd, aeamsgd); "
      "0: 0.9 / replicas (beta = p * alpha = 0.9)." },
    { "algorithm", "momentum", T_DOUBLE, "0", 0, 0.999999, NULL,
      "delta: AEAMSGD's Nesterov momentum; 0: 0.9." },
    { "algorithm", "worker_learning_rates", T_DOUBLE_LIST, "", 0, 1e6, NULL,
      "sync: one learning rate per replica (the chief's first, then worker "
      "0, 1, ...); each replica's gradient is scaled by its rate over "
      "optimizer.learning_rate. Empty: one rate for all." },

    { "security", "curve", T_BOOL, "false", NOLIM, NULL,
      "CURVE authentication and encryption on every socket." },
    { "security", "key_dir", T_STRING, "", NOLIM, NULL,
      "Directory with this task's key pair (keel keygen) and the allowed "
      "public keys." },
};

#define N_KEYS (sizeof schema / sizeof schema[0])

typedef struct value {
    char *text;
    char *origin;        /* where the value came from; NULL: "default" */
    int is_set;          /* by file, override or env */
    int is_cli;          /* by an override */
    int seen_in_file;    /* duplicate detection within one load */
    int64_t i;
    double d;
} value;

struct keel_config {
    value v[N_KEYS];
    char *source;        /* the loaded file's text */
};

/* Record where v's value came from. 0: out of memory (v unchanged). */
static int __attribute__((format(printf, 2, 3)))
set_origin(value *v, const char *fmt, ...)
{
    va_list ap;
    char *o;
    int n;
    va_start(ap, fmt);
    n = vasprintf(&o, fmt, ap);
    va_end(ap);
    if (n < 0)
        return 0;
    free(v->origin);
    v->origin = o;
    return 1;
}

static const char *
origin_of(const value *v)
{
    return v->origin != NULL ? v->origin : "default";
}

static int
find_key(const char *section, const char *name)
{
    for (size_t k = 0; k < N_KEYS; k++)
        if (strcmp(schema[k].section, section) == 0 &&
            strcmp(schema[k].name, name) == 0)
            return (int)k;
    return -1;
}

static int
find_dotted(const char *key)
{
    const char *dot = key != NULL ? strchr(key, '.') : NULL;
    char section[64];
    size_t n;
    if (dot == NULL)
        return -1;
    n = (size_t)(dot - key);
    if (n >= sizeof section)
        return -1;
    memcpy(section, key, n);
    section[n] = '\0';
    return find_key(section, dot + 1);
}

static int
section_known(const char *section)
{
    for (size_t k = 0; k < N_KEYS; k++)
        if (strcmp(schema[k].section, section) == 0)
            return 1;
    return 0;
}

/* What an error about an unknown name offers instead, into buf: section
 * NULL, every section ("[model] [data] ..."); else the keys of section
 * ("type, init, ..."). */
static void
list_names(const char *section, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < N_KEYS && used < size; k++) {
        const key_def *d = &schema[k];
        int opens_section = k == 0 ||
                            strcmp(d->section, schema[k - 1].section) != 0;
        if (section == NULL && opens_section)
            used += (size_t)snprintf(buf + used, size - used, "%s[%s]",
                                     used > 0 ? " " : "", d->section);
        else if (section != NULL && strcmp(d->section, section) == 0)
            used += (size_t)snprintf(buf + used, size - used, "%s%s",
                                     used > 0 ? ", " : "", d->name);
    }
}

static char *
trim(char *s)
{
    char *e;
    while (*s == ' ' || *s == '\t')
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' ||
                     e[-1] == '\n'))
        *--e = '\0';
    return s;
}

static int
parse_bool(const char *s, int *out)
{
    static const char *yes[] = { "true", "yes", "on", "1" };
    static const char *no[] = { "false", "no", "off", "0" };
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 1;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 1;
        }
    }
    return 0;
}

static int
enum_has(const char *choices, const char *s)
{
    size_t n = strlen(s);
    const char *p = choices;
    while (*p != '\0') {
        const char *bar = strchr(p, '|');
        size_t len = bar != NULL ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, s, n) == 0)
            return 1;
        if (bar == NULL)
            break;
        p = bar + 1;
    }
    return 0;
}

/* Parse a comma-separated numeric list; returns count or -1 (message in
 * why). */
static int
parse_list(const char *s, int is_int, double lo, double hi, int64_t *iout,
           double *dout, int max, char *why, size_t why_size)
{
    size_t len = strlen(s);
    char *buf, *save = NULL, *tok;
    int n = 0;
    if (len > VALUE_MAX) {
        snprintf(why, why_size, "list of %zu bytes (limit %d)", len,
                 VALUE_MAX);
        return -1;
    }
    buf = malloc(len + 1);
    if (buf == NULL) {
        snprintf(why, why_size, "out of memory");
        return -1;
    }
    memcpy(buf, s, len + 1);
    if (trim(buf)[0] == '\0') {
        free(buf);
        return 0;
    }
    for (tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char *t = trim(tok);
        int64_t iv;
        double dv;
        if (is_int) {
            if (!keel__parse_i64(t, (int64_t)lo,
                                 hi >= I64MAX ? INT64_MAX : (int64_t)hi,
                                 &iv)) {
                snprintf(why, why_size, "'%.64s' is not an integer in "
                         "[%.0f, %.0f]", t, lo, hi >= I64MAX ? 9.2e18 : hi);
                free(buf);
                return -1;
            }
            dv = (double)iv;
        } else {
            if (!keel__parse_double(t, &dv) || dv < lo || dv > hi) {
                snprintf(why, why_size, "'%.64s' is not a number in [%g, "
                         "%g]", t, lo, hi);
                free(buf);
                return -1;
            }
            iv = 0;
        }
        if (n < max) {
            if (iout != NULL)
                iout[n] = iv;
            if (dout != NULL)
                dout[n] = dv;
        }
        n++;
    }
    free(buf);
    return n;
}

/* An enum's choices "a|b|c" as "a, b, c", cut to fit out. */
static void
format_choices(const char *choices, char *out, size_t size)
{
    size_t used = 0;
    for (const char *p = choices; *p != '\0' && used + 3 < size; p++) {
        if (*p == '|') {
            out[used++] = ',';
            out[used++] = ' ';
        } else {
            out[used++] = *p;
        }
    }
    out[used] = '\0';
}

/* Whether text is a valid value of key d: its integer (ints, bools) in *i
 * and number (ints, doubles) in *dv; why gets the reason when not. */
static int
parse_typed(const key_def *d, const char *text, int64_t *i, double *dv,
            char *why, size_t why_size)
{
    int b;
    switch (d->type) {
    case T_INT: {
        int64_t hi = d->hi >= I64MAX ? INT64_MAX : (int64_t)d->hi;
        if (!keel__parse_i64(text, (int64_t)d->lo, hi, i)) {
            snprintf(why, why_size, "%s.%s = '%s' is not an integer from "
                     "%lld to %lld", d->section, d->name, text,
                     (long long)d->lo, (long long)hi);
            return 0;
        }
        *dv = (double)*i;
        break;
    }
    case T_DOUBLE:
        if (!keel__parse_double(text, dv) || *dv < d->lo || *dv > d->hi) {
            snprintf(why, why_size, "%s.%s = '%s' is not a number from %g "
                     "to %g", d->section, d->name, text, d->lo, d->hi);
            return 0;
        }
        break;
    case T_BOOL:
        if (!parse_bool(text, &b)) {
            snprintf(why, why_size, "%s.%s = '%s' is not a boolean; use "
                     "true or false", d->section, d->name, text);
            return 0;
        }
        *i = b;
        break;
    case T_ENUM:
        if (!enum_has(d->choices, text)) {
            char choices[256];
            format_choices(d->choices, choices, sizeof choices);
            snprintf(why, why_size, "%s.%s = '%s' is not one of: %s",
                     d->section, d->name, text, choices);
            return 0;
        }
        break;
    case T_INT_LIST:
    case T_DOUBLE_LIST: {
        char inner[256];
        if (parse_list(text, d->type == T_INT_LIST, d->lo, d->hi, NULL,
                       NULL, 0, inner, sizeof inner) < 0) {
            snprintf(why, why_size, "%s.%s: %s", d->section, d->name,
                     inner);
            return 0;
        }
        break;
    }
    case T_STRING:
    case T_ADDR_LIST:
        break;
    }
    return 1;
}

/* Validate text (trimmed, writable) for key k and store it. why gets the
 * reason on failure. */
static int
set_trimmed(keel_config *cfg, int k, char *text, char *why, size_t why_size)
{
    value *v = &cfg->v[k];
    char *copy;
    int64_t i = 0;
    double dv = 0;
    if (!parse_typed(&schema[k], text, &i, &dv, why, why_size))
        return 0;
    copy = strdup(text);
    if (copy == NULL) {
        snprintf(why, why_size, "out of memory");
        return 0;
    }
    free(v->text);
    v->text = copy;
    v->i = i;
    v->d = dv;
    return 1;
}

/* Validate raw for key k and store it. why gets the reason on failure. */
static int
set_value(keel_config *cfg, int k, const char *raw, char *why,
          size_t why_size)
{
    size_t n = strlen(raw);
    char *buf;
    int ok;
    if (n > VALUE_MAX) {
        snprintf(why, why_size, "value of %s.%s is %zu bytes (limit %d)",
                 schema[k].section, schema[k].name, n, VALUE_MAX);
        return 0;
    }
    buf = malloc(n + 1);
    if (buf == NULL) {
        snprintf(why, why_size, "out of memory");
        return 0;
    }
    memcpy(buf, raw, n + 1);
    ok = set_trimmed(cfg, k, trim(buf), why, why_size);
    free(buf);
    return ok;
}

keel_status
keel_config_new(keel_config **out)
{
    keel_config *cfg;
    char why[512];
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "config: out is NULL");
    *out = NULL;
    cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL)
        return keel__fail(KEEL_ENOMEM, "config");
    for (size_t k = 0; k < N_KEYS; k++) {
        if (!set_value(cfg, (int)k, schema[k].def, why, sizeof why)) {
            keel_config_free(cfg);
            return keel__fail(KEEL_EINTERNAL, "config default: %s", why);
        }
    }
    *out = cfg;
    return KEEL_OK;
}

void
keel_config_free(keel_config *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t k = 0; k < N_KEYS; k++) {
        free(cfg->v[k].text);
        free(cfg->v[k].origin);
    }
    free(cfg->source);
    free(cfg);
}

/* Parsing. inih splits each line into section, key and value, but reads
 * through a fixed line buffer (200 bytes in Debian's build). keel hands it
 * the file one physical line at a time through an ini_reader, so inih's
 * line numbers are the file's, and a line too long for that buffer is
 * handed over shortened: a comment as ";", a section as "[name]", a key
 * line as "key=" with its value kept here (inline comment and blanks
 * stripped the way inih strips them) and used by the handler instead. So
 * lines of any length parse the same as short ones, up to VALUE_MAX bytes
 * of value. Indented lines continue
 * the previous key's value (inih's multi-line values); keel accepts that
 * only for lists, joined with ", ". */
typedef struct load_ctx {
    keel_config *cfg;
    const char *path;
    const char *text;       /* the whole file */
    size_t pos, len;
    int line;               /* the physical line inih is parsing */
    int has_key;            /* a key line came since the last section */
    int cont;               /* this line continues the previous key */
    int last_key;           /* schema index of the previous key, or -1 */
    char *long_value;       /* a long line's value, or NULL */
    int err_line;
    char why[768];          /* the first error only */
} load_ctx;

/* Keep the first error (with its line); then fail the handler (0) or stop
 * the reader (NULL). */
#define KEEP_FIRST(lc, ...)                                              \
    do {                                                                 \
        if ((lc)->why[0] == '\0') {                                      \
            snprintf((lc)->why, sizeof (lc)->why, __VA_ARGS__);          \
            (lc)->err_line = (lc)->line;                                 \
        }                                                                \
    } while (0)
#define FAIL_FIRST(lc, ...) do { KEEP_FIRST(lc, __VA_ARGS__); return 0; } \
    while (0)
#define READER_FAIL(lc, ...)                                             \
    do { KEEP_FIRST(lc, __VA_ARGS__); return NULL; } while (0)

static int
is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* inih's rule: the first of chars, or an inline comment (';' after a
 * blank), or the end. */
static const char *
find_or_comment(const char *s, const char *end, const char *chars)
{
    int was_space = 0;
    while (s < end && (chars == NULL || strchr(chars, *s) == NULL) &&
           !(was_space && *s == ';')) {
        was_space = is_blank(*s);
        s++;
    }
    return s;
}

/* A copy of [s, end) without an inline comment and surrounding blanks. */
static char *
value_copy(const char *s, const char *end)
{
    char *v;
    end = find_or_comment(s, end, NULL);
    while (s < end && is_blank(*s))
        s++;
    while (end > s && is_blank(end[-1]))
        end--;
    v = malloc((size_t)(end - s) + 1);
    if (v != NULL) {
        memcpy(v, s, (size_t)(end - s));
        v[end - s] = '\0';
    }
    return v;
}

static int
put_line(char *str, int num, const char *s, size_t n)
{
    if ((size_t)num < n + 2)
        return 0;
    memcpy(str, s, n);
    str[n] = '\n';
    str[n + 1] = '\0';
    return 1;
}

/* A "[section]" line: the section's name to inih, or an error naming the
 * valid sections. */
static char *
section_line(load_ctx *lc, const char *s, const char *end, char *str,
             int num)
{
    const char *close = find_or_comment(s + 1, end, "]");
    char name[64];
    size_t nl2;
    if (close == end || *close != ']')
        READER_FAIL(lc, "syntax error: '[' without ']'; expected "
                    "'[section]'");
    for (s++; s < close && is_blank(*s); s++)
        ;
    while (close > s && is_blank(close[-1]))
        close--;
    nl2 = (size_t)(close - s);
    if (nl2 >= sizeof name || (memcpy(name, s, nl2), name[nl2] = '\0',
                               !section_known(name))) {
        char secs[256];
        list_names(NULL, secs, sizeof secs);
        READER_FAIL(lc, "unknown section [%.*s]; valid sections: %s",
                    (int)(nl2 < 64 ? nl2 : 64), s, secs);
    }
    lc->has_key = 0;
    lc->last_key = -1;
    snprintf(str, (size_t)num, "[%s]\n", name);
    return str;
}

/* A "key = value" line [start, end), s its first non-blank: as it is when
 * it fits str, else "key=x" with the value kept in lc->long_value. */
static char *
key_line(load_ctx *lc, const char *start, const char *s, const char *end,
         char *str, int num)
{
    const char *eq = find_or_comment(s, end, "=:");
    if (eq == end || (*eq != '=' && *eq != ':'))
        READER_FAIL(lc, "syntax error; expected '[section]' or "
                    "'key = value'");
    lc->has_key = 1;
    if (put_line(str, num, start, (size_t)(end - start)))
        return str;
    if ((size_t)(eq - s) + 4 > (size_t)num)
        READER_FAIL(lc, "key '%.40s...' is too long", s);
    lc->long_value = value_copy(eq + 1, end);
    if (lc->long_value == NULL)
        READER_FAIL(lc, "out of memory");
    memcpy(str, s, (size_t)(eq - s) + 1);
    strcpy(str + (eq - s) + 1, "x\n");
    return str;
}

/* The ini_reader: the next physical line to inih, shortened as the comment
 * above load_ctx says when it does not fit str. */
static char *
read_line(char *str, int num, void *stream)
{
    load_ctx *lc = stream;
    const char *start, *end, *s, *nl;
    size_t n;
    free(lc->long_value);
    lc->long_value = NULL;
    lc->cont = 0;
    if (lc->why[0] != '\0' || lc->pos >= lc->len || num < 16)
        return NULL;
    start = lc->text + lc->pos;
    nl = memchr(start, '\n', lc->len - lc->pos);
    end = nl != NULL ? nl : lc->text + lc->len;
    lc->pos = (size_t)(end - lc->text) + (nl != NULL ? 1 : 0);
    lc->line++;
    n = (size_t)(end - start);
    for (s = start; s < end && is_blank(*s); s++)
        ;
    if (lc->line == 1 && end - s >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
        s += 3;
    if (s == end || *s == ';' || *s == '#')
        return put_line(str, num, start, n) ? str : strcpy(str, ";\n");
    if (s > start && lc->has_key) {
        /* inih strips no inline comment from a continuation: keep the
         * value here for every continuation line. */
        lc->cont = 1;
        lc->long_value = value_copy(s, end);
        if (lc->long_value == NULL)
            READER_FAIL(lc, "out of memory");
        return put_line(str, num, start, n) ? str : strcpy(str, " x\n");
    }
    if (*s == '[')
        return section_line(lc, s, end, str, num);
    return key_line(lc, start, s, end, str, num);
}

/* Append a continuation line to the list value of key k (a trailing comma
 * dropped). */
static int
continue_list(load_ctx *lc, int k, const char *more)
{
    const char *have = lc->cfg->v[k].text != NULL ? lc->cfg->v[k].text : "";
    size_t hl = strlen(have), ml = strlen(more);
    char *joined, why[768];
    int ok;
    joined = malloc(hl + ml + 3);
    if (joined == NULL)
        FAIL_FIRST(lc, "out of memory");
    /* No separator after a trailing comma or before a leading one. */
    snprintf(joined, hl + ml + 3, "%s%s%s", have,
             hl == 0 || have[hl - 1] == ',' || more[0] == ',' ? "" : ", ",
             more);
    /* A list continued line by line may end each line with a comma: the
     * last one ends nothing. */
    {
        size_t jl = strlen(joined);
        while (jl > 0 && (joined[jl - 1] == ',' || is_blank(joined[jl - 1])))
            joined[--jl] = '\0';
    }
    ok = set_value(lc->cfg, k, joined, why, sizeof why);
    free(joined);
    if (!ok)
        FAIL_FIRST(lc, "%s", why);
    return 1;
}

static int
on_ini(void *user, const char *section, const char *name, const char *val)
{
    load_ctx *lc = user;
    char why[768];
    int k;
    if (lc->long_value != NULL)
        val = lc->long_value;
    if (lc->cont) {
        k = lc->last_key;
        if (k < 0)
            return 0;      /* the key line already failed */
        if (schema[k].type != T_INT_LIST && schema[k].type != T_DOUBLE_LIST &&
            schema[k].type != T_ADDR_LIST)
            FAIL_FIRST(lc, "indented line continues %s.%s, which is not a "
                       "list (only lists may continue on indented lines); "
                       "remove the indentation", schema[k].section,
                       schema[k].name);
        return continue_list(lc, k, val);
    }
    lc->last_key = -1;
    if (section[0] == '\0')
        FAIL_FIRST(lc, "key '%s' is outside any section; put it under one "
                   "such as [train]", name);
    k = find_key(section, name);
    if (k < 0) {
        char keys[600];
        list_names(section, keys, sizeof keys);
        FAIL_FIRST(lc, "unknown key '%s' in [%s]; valid keys: %s", name,
                   section, keys);
    }
    if (lc->cfg->v[k].seen_in_file)
        FAIL_FIRST(lc, "%s.%s is set twice", section, name);
    if (!set_value(lc->cfg, k, val, why, sizeof why))
        FAIL_FIRST(lc, "%s", why);
    lc->last_key = k;
    lc->cfg->v[k].seen_in_file = 1;
    lc->cfg->v[k].is_set = 1;
    if (!set_origin(&lc->cfg->v[k], "%s:%d", lc->path, lc->line))
        FAIL_FIRST(lc, "out of memory");
    return 1;
}

/* Parse text (takes ownership) as if read from the file named name. */
static keel_status
load_text(keel_config *cfg, const char *name, char *text)
{
    load_ctx lc;
    int rc;
    memset(&lc, 0, sizeof lc);
    lc.cfg = cfg;
    lc.path = name;
    lc.text = text;
    lc.len = strlen(text);
    lc.last_key = -1;
    for (size_t k = 0; k < N_KEYS; k++)
        cfg->v[k].seen_in_file = 0;
    rc = ini_parse_stream(read_line, &lc, on_ini, &lc);
    free(lc.long_value);
    if (lc.why[0] != '\0') {
        free(text);
        return keel__fail(KEEL_EINVAL, "%s:%d: %s", name, lc.err_line,
                          lc.why);
    }
    if (rc != 0) {
        free(text);
        if (rc < 0)
            return keel__fail(KEEL_ENOMEM, "%s: out of memory parsing it",
                              name);
        return keel__fail(KEEL_EINVAL, "%s:%d: syntax error; expected "
                          "'[section]' or 'key = value'", name, rc);
    }
    free(cfg->source);
    cfg->source = text;
    return KEEL_OK;
}

keel_status
keel_config_load(keel_config *cfg, const char *path)
{
    char *text;
    size_t n;
    keel_status st;

    if (cfg == NULL || path == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    st = keel__fs_read_all(path, 1 << 20, &text, &n);
    if (st == KEEL_ENOTFOUND)
        return keel__fail(KEEL_EINVAL, "config file %s does not exist",
                          path);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "config file %s", path);
    if (strlen(text) != n) {
        free(text);
        return keel__fail(KEEL_EINVAL, "%s: config file contains a NUL "
                          "byte; is it a text file?", path);
    }
    return load_text(cfg, path, text);
}

keel_status
keel_config_load_text(keel_config *cfg, const char *text, const char *name)
{
    char *copy;
    if (cfg == NULL || text == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    if (name == NULL)
        name = "(text)";
    if (strlen(text) > (1 << 20))
        return keel__fail(KEEL_EINVAL, "%s: config text over 1 MiB", name);
    copy = strdup(text);
    if (copy == NULL)
        return keel__fail(KEEL_ENOMEM, "config text");
    return load_text(cfg, name, copy);
}

keel_status
keel_config_override(keel_config *cfg, const char *assignment,
                     const char *origin)
{
    char buf[4096], why[768];
    char *eq, *key;
    int k;
    if (cfg == NULL || assignment == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    if (origin == NULL)
        origin = "override";
    if (strlen(assignment) >= sizeof buf)
        return keel__fail(KEEL_EINVAL, "%s: '%.40s...' is too long", origin,
                          assignment);
    snprintf(buf, sizeof buf, "%s", assignment);
    eq = strchr(buf, '=');
    if (eq == NULL)
        return keel__fail(KEEL_EINVAL, "%s: '%s' is not section.key=value "
                          "(e.g. train.max_steps=100)", origin, assignment);
    *eq = '\0';
    key = trim(buf);
    k = find_dotted(key);
    if (k < 0) {
        char *dot = strchr(key, '.');
        char keys[768], secs[256];
        if (dot != NULL) {
            *dot = '\0';
            if (section_known(key)) {
                list_names(key, keys, sizeof keys);
                return keel__fail(KEEL_EINVAL, "%s: unknown key '%s' in "
                                  "[%s]; valid keys: %s", origin, dot + 1,
                                  key, keys);
            }
        }
        list_names(NULL, secs, sizeof secs);
        return keel__fail(KEEL_EINVAL, "%s: unknown setting '%s'; use "
                          "section.key with a section of %s", origin,
                          assignment, secs);
    }
    if (!set_value(cfg, k, eq + 1, why, sizeof why))
        return keel__fail(KEEL_EINVAL, "%s: %s", origin, why);
    cfg->v[k].is_set = 1;
    cfg->v[k].is_cli = 1;
    if (!set_origin(&cfg->v[k], "%s", origin))
        return keel__fail(KEEL_ENOMEM, "%s", origin);
    return KEEL_OK;
}

keel_status
keel_config_apply_env(keel_config *cfg)
{
    const char *out = getenv("OUTPUT_DIR");
    int k = find_key("checkpoint", "dir");
    char why[768];
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    if (out == NULL || out[0] == '\0' || cfg->v[k].is_cli)
        return KEEL_OK;
    if (!set_value(cfg, k, out, why, sizeof why))
        return keel__fail(KEEL_EINVAL, "$OUTPUT_DIR: %s", why);
    cfg->v[k].is_set = 1;
    if (!set_origin(&cfg->v[k], "$OUTPUT_DIR"))
        return keel__fail(KEEL_ENOMEM, "$OUTPUT_DIR");
    return KEEL_OK;
}

/* a and b name the same directory: realpath when both exist, else the
 * strings without trailing slashes. */
static int
same_dir(const char *a, const char *b)
{
    char ra[PATH_MAX], rb[PATH_MAX];
    size_t la = strlen(a), lb = strlen(b);
    if (realpath(a, ra) != NULL && realpath(b, rb) != NULL)
        return strcmp(ra, rb) == 0;
    while (la > 1 && a[la - 1] == '/')
        la--;
    while (lb > 1 && b[lb - 1] == '/')
        lb--;
    return la == lb && strncmp(a, b, la) == 0;
}

keel_status
keel_config_apply_model_dir(keel_config *cfg, const char *model_dir)
{
    int k = find_key("checkpoint", "dir");
    char why[768];
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    if (model_dir == NULL || model_dir[0] == '\0')
        return KEEL_OK;
    if (cfg->v[k].is_set && !same_dir(cfg->v[k].text, model_dir))
        return keel__fail(KEEL_EINVAL, "TF_CONFIG model_dir '%s' and "
                          "checkpoint.dir '%s' (set by %s) are different "
                          "directories; remove one of the two settings or "
                          "give both the same path", model_dir,
                          cfg->v[k].text, origin_of(&cfg->v[k]));
    if (!set_value(cfg, k, model_dir, why, sizeof why))
        return keel__fail(KEEL_EINVAL, "TF_CONFIG model_dir: %s", why);
    if (!cfg->v[k].is_set && !set_origin(&cfg->v[k], "TF_CONFIG model_dir"))
        return keel__fail(KEEL_ENOMEM, "TF_CONFIG model_dir");
    cfg->v[k].is_set = 1;
    return KEEL_OK;
}

static const value *
get(const keel_config *cfg, const char *key, key_type want, int alt)
{
    int k = find_dotted(key);
    if (cfg == NULL || k < 0)
        return NULL;
    if (schema[k].type != want && (alt < 0 || schema[k].type != (key_type)alt))
        return NULL;
    return &cfg->v[k];
}

int64_t
keel_config_int(const keel_config *cfg, const char *key)
{
    const value *v = get(cfg, key, T_INT, T_BOOL);
    return v != NULL ? v->i : 0;
}

double
keel_config_double(const keel_config *cfg, const char *key)
{
    const value *v = get(cfg, key, T_DOUBLE, T_INT);
    return v != NULL ? v->d : 0.0;
}

int
keel_config_bool(const keel_config *cfg, const char *key)
{
    const value *v = get(cfg, key, T_BOOL, -1);
    return v != NULL ? (int)v->i : 0;
}

const char *
keel_config_str(const keel_config *cfg, const char *key)
{
    int k = find_dotted(key);
    if (cfg == NULL || k < 0 || cfg->v[k].text == NULL)
        return "";
    return cfg->v[k].text;
}

int
keel_config_is_set(const keel_config *cfg, const char *key)
{
    int k = find_dotted(key);
    return cfg != NULL && k >= 0 && cfg->v[k].is_set;
}

const char *
keel_config_origin(const keel_config *cfg, const char *key)
{
    int k = find_dotted(key);
    if (cfg == NULL || k < 0)
        return "";
    return origin_of(&cfg->v[k]);
}

/* A list key's entries into iout (is_int: T_INT_LIST) or dout
 * (T_DOUBLE_LIST). */
static int
get_list(const keel_config *cfg, const char *key, int is_int, int64_t *iout,
         double *dout, int max)
{
    const value *v = get(cfg, key, is_int ? T_INT_LIST : T_DOUBLE_LIST, -1);
    int k = find_dotted(key);
    char why[256];
    if (v == NULL)
        return -1;
    return parse_list(v->text, is_int, schema[k].lo, schema[k].hi, iout, dout,
                      max, why, sizeof why);
}

int
keel_config_int_list(const keel_config *cfg, const char *key, int64_t *out,
                     int max)
{
    return get_list(cfg, key, 1, out, NULL, max);
}

int
keel_config_double_list(const keel_config *cfg, const char *key, double *out,
                        int max)
{
    return get_list(cfg, key, 0, NULL, out, max);
}

/* checkpoint.save_steps against checkpoint.save_secs, and the run's end
 * (train.max_steps or train.epochs). */
static keel_status
validate_saves_and_end(const keel_config *cfg)
{
    if (keel_config_is_set(cfg, "checkpoint.save_steps") &&
        keel_config_is_set(cfg, "checkpoint.save_secs") &&
        keel_config_int(cfg, "checkpoint.save_steps") > 0 &&
        keel_config_double(cfg, "checkpoint.save_secs") > 0)
        return keel__fail(KEEL_EINVAL, "checkpoint.save_steps (%s) and "
                          "checkpoint.save_secs (%s) are both set; keep one",
                          keel_config_origin(cfg, "checkpoint.save_steps"),
                          keel_config_origin(cfg, "checkpoint.save_secs"));
    if (keel_config_int(cfg, "train.max_steps") == 0 &&
        keel_config_int(cfg, "train.epochs") == 0)
        return keel__fail(KEEL_EINVAL, "the run has no end: set "
                          "train.max_steps or train.epochs (or both; the "
                          "first reached stops training)");
    return KEEL_OK;
}

/* algorithm.name = hogwild against K-FAC and micro-batches. */
static keel_status
validate_hogwild(const keel_config *cfg)
{
    const char *alg = keel_config_str(cfg, "algorithm.name");
    int is_hw = strcmp(alg, "hogwild") == 0;

    if (is_hw && strcmp(keel_config_str(cfg, "optimizer.name"),
                        "kfac") == 0)
        return keel__fail(KEEL_EINVAL, "algorithm.name = hogwild and "
                          "optimizer.name = kfac (%s): K-FAC's shared "
                          "factors need one update at a time; pick "
                          "another optimizer",
                          keel_config_origin(cfg, "optimizer.name"));
    if (is_hw && keel_config_int(cfg, "train.micro_batch") > 0)
        return keel__fail(KEEL_EINVAL, "algorithm.name = hogwild and "
                          "train.micro_batch (%s): Hogwild threads "
                          "each take whole mini-batches; remove "
                          "train.micro_batch",
                          keel_config_origin(cfg, "train.micro_batch"));
    return KEEL_OK;
}

/* One process's parallelism: model threads against OpenBLAS threads,
 * train.replicas only with mirrored, whose batch they split evenly. */
static keel_status
validate_parallelism(const keel_config *cfg)
{
    if (keel_config_int(cfg, "train.model_threads") > 1 &&
        keel_config_int(cfg, "train.threads") > 1)
        return keel__fail(KEEL_EINVAL, "train.model_threads (%lld) and "
                          "train.threads (%lld) are both above 1; model "
                          "threads use single-threaded OpenBLAS: set "
                          "train.threads = 1 or remove it",
                          (long long)keel_config_int(cfg,
                                                     "train.model_threads"),
                          (long long)keel_config_int(cfg, "train.threads"));
    if (keel_config_is_set(cfg, "train.replicas") &&
        strcmp(keel_config_str(cfg, "train.strategy"), "mirrored") != 0)
        return keel__fail(KEEL_EINVAL, "train.replicas (%s) applies only to "
                          "train.strategy = mirrored, not %s",
                          keel_config_origin(cfg, "train.replicas"),
                          keel_config_str(cfg, "train.strategy"));
    if (strcmp(keel_config_str(cfg, "train.strategy"), "mirrored") == 0 &&
        keel_config_int(cfg, "train.batch_size") %
        keel_config_int(cfg, "train.replicas") != 0)
        return keel__fail(KEEL_EINVAL, "train.batch_size = %lld does not "
                          "split evenly over train.replicas = %lld "
                          "(mirrored); make it a multiple",
                          (long long)keel_config_int(cfg, "train.batch_size"),
                          (long long)keel_config_int(cfg, "train.replicas"));
    return KEEL_OK;
}

/* model.hidden: only for an mlp, which needs at least one layer;
 * model.classes: 0 or at least 2. */
static keel_status
validate_model(const keel_config *cfg)
{
    const char *model = keel_config_str(cfg, "model.type");

    if (keel_config_is_set(cfg, "model.hidden") && strcmp(model, "mlp") != 0)
        return keel__fail(KEEL_EINVAL, "model.hidden (%s) applies only to "
                          "model.type = mlp, not '%s'",
                          keel_config_origin(cfg, "model.hidden"), model);
    if (strcmp(model, "mlp") == 0) {
        int64_t h[1];
        keel_model_config mc;
        keel_status st;
        if (keel_config_int_list(cfg, "model.hidden", h, 1) < 1)
            return keel__fail(KEEL_EINVAL, "model.hidden is empty; an mlp "
                              "needs at least one hidden layer (e.g. "
                              "256,256)");
        /* the parser keel train builds the model with, so that config
         * check refuses what train refuses (a trailing comma, too many
         * layers) */
        keel_model_config_init(&mc);
        st = keel_model_parse_hidden(keel_config_str(cfg, "model.hidden"),
                                     &mc);
        if (st != KEEL_OK)
            return keel__wrap(KEEL_EINVAL, "model.hidden (%s)",
                              keel_config_origin(cfg, "model.hidden"));
    }
    if (keel_config_int(cfg, "model.classes") == 1)
        return keel__fail(KEEL_EINVAL, "model.classes = 1 (%s): a "
                          "classifier needs at least 2 classes (0: from "
                          "the labels)", keel_config_origin(cfg,
                                                            "model.classes"));
    {
        int64_t micro = keel_config_int(cfg, "train.micro_batch");
        int64_t batch = keel_config_int(cfg, "train.batch_size");
        if (micro > 0 && (batch % micro != 0 || batch / micro > 64))
            return keel__fail(KEEL_EINVAL, "train.micro_batch = %lld (%s) "
                              "must divide train.batch_size = %lld (%s) "
                              "into at most 64 micro-batches",
                              (long long)micro,
                              keel_config_origin(cfg, "train.micro_batch"),
                              (long long)batch,
                              keel_config_origin(cfg, "train.batch_size"));
    }
    return KEEL_OK;
}

/* The optimizer.* and kfac.* keys that only some optimizer.name reads. */
static keel_status
validate_optimizer(const keel_config *cfg)
{
    const char *opt = keel_config_str(cfg, "optimizer.name");

    if (keel_config_is_set(cfg, "optimizer.momentum") &&
        strcmp(opt, "momentum") != 0 && strcmp(opt, "rmsprop") != 0)
        return keel__fail(KEEL_EINVAL, "optimizer.momentum (%s) has no "
                          "effect with optimizer.name = %s; use momentum or "
                          "rmsprop, or remove it",
                          keel_config_origin(cfg, "optimizer.momentum"), opt);
    if (keel_config_bool(cfg, "optimizer.nesterov") &&
        strcmp(opt, "momentum") != 0)
        return keel__fail(KEEL_EINVAL, "optimizer.nesterov needs "
                          "optimizer.name = momentum, not %s", opt);
    if ((keel_config_is_set(cfg, "optimizer.beta1") ||
         keel_config_is_set(cfg, "optimizer.beta2")) &&
        strcmp(opt, "adam") != 0)
        return keel__fail(KEEL_EINVAL, "optimizer.beta1/beta2 apply only to "
                          "optimizer.name = adam, not %s", opt);
    if (strcmp(opt, "kfac") != 0) {
        static const char *const kk[] = { "kfac.damping",
            "kfac.cov_ema_decay", "kfac.momentum", "kfac.momentum_type",
            "kfac.estimation_mode", "kfac.norm_constraint",
            "kfac.invert_every", "kfac.cov_update_every",
            "kfac.distributed", "kfac.replicas_to_aggregate",
            "kfac.gradient_fraction", "kfac.covariance_fraction" };
        for (size_t i = 0; i < sizeof kk / sizeof *kk; i++)
            if (keel_config_is_set(cfg, kk[i]))
                return keel__fail(KEEL_EINVAL, "%s (%s) applies only to "
                                  "optimizer.name = kfac, not %s", kk[i],
                                  keel_config_origin(cfg, kk[i]), opt);
    }
    return KEEL_OK;
}

/* optimizer.schedule = piecewise: its increasing boundaries and one
 * value more; the boundaries and values need piecewise. */
static keel_status
validate_schedule(const keel_config *cfg)
{
    const char *sched = keel_config_str(cfg, "optimizer.schedule");

    if (strcmp(sched, "piecewise") == 0) {
        int64_t b[256];
        double vals[257];
        int nb = keel_config_int_list(cfg, "optimizer.boundaries", b, 256);
        int nv = keel_config_double_list(cfg, "optimizer.values", vals, 257);
        if (nb < 1 || nb > 256)
            return keel__fail(KEEL_EINVAL, "optimizer.schedule = piecewise "
                              "needs optimizer.boundaries (1 to 256 steps)");
        if (nv != nb + 1)
            return keel__fail(KEEL_EINVAL, "optimizer.values has %d entries; "
                              "piecewise needs one more than "
                              "optimizer.boundaries (%d)", nv, nb + 1);
        for (int i = 1; i < nb; i++)
            if (b[i] <= b[i - 1])
                return keel__fail(KEEL_EINVAL, "optimizer.boundaries must "
                                  "increase: %lld follows %lld",
                                  (long long)b[i], (long long)b[i - 1]);
    } else if (keel_config_is_set(cfg, "optimizer.boundaries") ||
               keel_config_is_set(cfg, "optimizer.values")) {
        return keel__fail(KEEL_EINVAL, "optimizer.boundaries/values need "
                          "optimizer.schedule = piecewise, not %s", sched);
    }
    return KEEL_OK;
}

/* The warm start: warm_start_vars compiles as a POSIX extended regex and
 * goes with a warm_start_from, which is not checkpoint.dir itself. */
static keel_status
validate_warm_start(const keel_config *cfg)
{
    const char *from = keel_config_str(cfg, "checkpoint.warm_start_from");
    const char *vars = keel_config_str(cfg, "checkpoint.warm_start_vars");
    const char *dir = keel_config_str(cfg, "checkpoint.dir");
    size_t n = strlen(dir);
    if (vars[0] != '\0') {
        regex_t re;
        char why[128];
        int rc = regcomp(&re, vars, REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            regerror(rc, &re, why, sizeof why);
            return keel__fail(KEEL_EINVAL, "checkpoint.warm_start_vars "
                              "'%s' (%s) is not a POSIX extended regex: %s",
                              vars, keel_config_origin(
                                  cfg, "checkpoint.warm_start_vars"), why);
        }
        regfree(&re);
        if (from[0] == '\0')
            return keel__fail(KEEL_EINVAL, "checkpoint.warm_start_vars (%s) "
                              "needs checkpoint.warm_start_from: the "
                              "checkpoint to warm-start from",
                              keel_config_origin(
                                  cfg, "checkpoint.warm_start_vars"));
    }
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (from[0] != '\0' && strncmp(from, dir, n) == 0 &&
        strspn(from + n, "/") == strlen(from + n))
        return keel__fail(KEEL_EINVAL, "checkpoint.warm_start_from (%s) is "
                          "checkpoint.dir (%s), this run's own checkpoint "
                          "directory: a warm start writes a new run into "
                          "another directory",
                          keel_config_origin(cfg,
                                             "checkpoint.warm_start_from"),
                          keel_config_origin(cfg, "checkpoint.dir"));
    return KEEL_OK;
}

/* The files: an HDF5 training file, checkpoint.dir and a plain
 * checkpoint.basename. */
static keel_status
validate_files(const keel_config *cfg)
{
    if (strcmp(keel_config_str(cfg, "data.format"), "hdf5") == 0 &&
        keel_config_str(cfg, "data.train_file")[0] == '\0')
        return keel__fail(KEEL_EINVAL, "data.format = hdf5 needs "
                          "data.train_file (an HDF5 file with datasets x "
                          "and y)");
    if (keel_config_str(cfg, "checkpoint.dir")[0] == '\0')
        return keel__fail(KEEL_EINVAL, "checkpoint.dir is empty; set it or "
                          "$OUTPUT_DIR");
    if (!keel_name_is_valid(keel_config_str(cfg, "checkpoint.basename")) ||
        strchr(keel_config_str(cfg, "checkpoint.basename"), '/') != NULL)
        return keel__fail(KEEL_EINVAL, "checkpoint.basename '%s' must be a "
                          "plain file name of [A-Za-z0-9_.-]",
                          keel_config_str(cfg, "checkpoint.basename"));
    return validate_warm_start(cfg);
}

/* The cluster's timing (heartbeat before death) and replica counts. */
static keel_status
validate_cluster(const keel_config *cfg)
{
    if (keel_config_int(cfg, "cluster.heartbeat_ms") >=
        keel_config_int(cfg, "cluster.dead_after_ms"))
        return keel__fail(KEEL_EINVAL, "cluster.heartbeat_ms (%lld) must be "
                          "less than cluster.dead_after_ms (%lld): a peer "
                          "would be declared dead between two heartbeats",
                          (long long)keel_config_int(cfg,
                                                     "cluster.heartbeat_ms"),
                          (long long)keel_config_int(cfg,
                                                     "cluster.dead_after_ms"));
    if (keel_config_int(cfg, "cluster.total_num_replicas") > 0 &&
        keel_config_int(cfg, "cluster.replicas_to_aggregate") >
        keel_config_int(cfg, "cluster.total_num_replicas"))
        return keel__fail(KEEL_EINVAL, "cluster.replicas_to_aggregate "
                          "(%lld) exceeds cluster.total_num_replicas (%lld)",
                          (long long)keel_config_int(cfg,
                              "cluster.replicas_to_aggregate"),
                          (long long)keel_config_int(cfg,
                              "cluster.total_num_replicas"));
    return KEEL_OK;
}

/* algorithm.name against the older cluster.mode, per-worker learning
 * rates only with sync, and K-FAC's plain sync rule. */
static keel_status
validate_algorithm(const keel_config *cfg)
{
    if (keel_config_is_set(cfg, "algorithm.name") &&
        keel_config_is_set(cfg, "cluster.mode")) {
        keel_algorithm a;
        int async_mode = strcmp(keel_config_str(cfg, "cluster.mode"),
                                "async") == 0;
        if (keel_algorithm_from_name(keel_config_str(cfg, "algorithm.name"),
                                     &a) == KEEL_OK &&
            keel_algorithm_is_sync(a) == async_mode)
            return keel__fail(KEEL_EINVAL, "algorithm.name = %s (%s) is "
                              "%s but cluster.mode = %s (%s); cluster.mode "
                              "is the older name of sync and async: drop "
                              "it", keel_algorithm_name(a),
                              keel_config_origin(cfg, "algorithm.name"),
                              async_mode ? "synchronous" : "asynchronous",
                              keel_config_str(cfg, "cluster.mode"),
                              keel_config_origin(cfg, "cluster.mode"));
    }
    if (keel_config_str(cfg, "algorithm.worker_learning_rates")[0] != '\0' &&
        (strcmp(keel_config_str(cfg, "algorithm.name"), "sync") != 0 ||
         strcmp(keel_config_str(cfg, "cluster.mode"), "async") == 0))
        return keel__fail(KEEL_EINVAL, "algorithm.worker_learning_rates "
                          "(%s) applies to synchronous SGD only "
                          "(algorithm.name = sync), not %s",
                          keel_config_origin(cfg,
                              "algorithm.worker_learning_rates"),
                          strcmp(keel_config_str(cfg, "algorithm.name"),
                                 "sync") != 0
                              ? keel_config_str(cfg, "algorithm.name")
                              : "cluster.mode = async");
    if (strcmp(keel_config_str(cfg, "optimizer.name"), "kfac") == 0) {
        /* the chief applies each step's mean gradient: no other rule */
        const char *k = keel_config_str(cfg, "algorithm.worker_learning_"
                                        "rates")[0] != '\0'
                            ? "algorithm.worker_learning_rates"
                        : keel_config_is_set(cfg, "algorithm.name") &&
                          strcmp(keel_config_str(cfg, "algorithm.name"),
                                 "sync") != 0
                            ? "algorithm.name"
                            : NULL;
        if (k != NULL)
            return keel__fail(KEEL_EINVAL, "%s (%s) does not apply to "
                              "optimizer.name = kfac: in a cluster K-FAC "
                              "takes the plain sync rule, the chief "
                              "applying each step's mean gradient "
                              "(docs/kfac.md); unset it", k,
                              keel_config_origin(cfg, k));
    }
    return KEEL_OK;
}

/* security.curve needs its key directory. */
static keel_status
validate_security(const keel_config *cfg)
{
    if (keel_config_bool(cfg, "security.curve") &&
        keel_config_str(cfg, "security.key_dir")[0] == '\0')
        return keel__fail(KEEL_EINVAL, "security.curve = true needs "
                          "security.key_dir (make keys with 'keel keygen "
                          "DIR')");
    return KEEL_OK;
}

/* Cross-key rules. Each names both keys and where they were set; the
 * first rule broken, in this order, is the one reported. */
keel_status
keel_config_validate(const keel_config *cfg)
{
    static keel_status (*const rules[])(const keel_config *) = {
        validate_saves_and_end, validate_hogwild, validate_parallelism,
        validate_model, validate_optimizer, validate_schedule,
        validate_files, validate_cluster, validate_algorithm,
        validate_security
    };
    keel_status st;

    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    for (size_t i = 0; i < sizeof rules / sizeof *rules; i++)
        if ((st = rules[i](cfg)) != KEEL_OK)
            return st;
    return KEEL_OK;
}

typedef struct strbuf {
    char *p;
    size_t n, cap;
    int failed;
} strbuf;

static void __attribute__((format(printf, 2, 3)))
sb_add(strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    int need;
    if (sb->failed)
        return;
    for (;;) {
        va_start(ap, fmt);
        need = vsnprintf(sb->p != NULL ? sb->p + sb->n : NULL,
                         sb->p != NULL ? sb->cap - sb->n : 0, fmt, ap);
        va_end(ap);
        if (need < 0) {
            sb->failed = 1;
            return;
        }
        if (sb->p != NULL && sb->n + (size_t)need < sb->cap) {
            sb->n += (size_t)need;
            return;
        }
        {
            size_t cap = (sb->cap + (size_t)need + 1) * 2;
            char *p = realloc(sb->p, cap);
            if (p == NULL) {
                sb->failed = 1;
                return;
            }
            sb->p = p;
            sb->cap = cap;
        }
    }
}

keel_status
keel_config_dump(const keel_config *cfg, int with_origin, char **text)
{
    strbuf sb = { 0 };
    if (cfg == NULL || text == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    *text = NULL;
    for (size_t k = 0; k < N_KEYS; k++) {
        if (k == 0 || strcmp(schema[k].section, schema[k - 1].section) != 0)
            sb_add(&sb, "%s[%s]\n", k > 0 ? "\n" : "", schema[k].section);
        if (with_origin)
            sb_add(&sb, "%-28s = %-36s ; %s\n", schema[k].name,
                   cfg->v[k].text, origin_of(&cfg->v[k]));
        else
            sb_add(&sb, "%s = %s\n", schema[k].name, cfg->v[k].text);
    }
    if (sb.failed) {
        free(sb.p);
        return keel__fail(KEEL_ENOMEM, "config dump");
    }
    *text = sb.p;
    return KEEL_OK;
}

const char *
keel_config_source_text(const keel_config *cfg)
{
    return cfg != NULL && cfg->source != NULL ? cfg->source : "";
}

static const char *
type_name(const key_def *d)
{
    switch (d->type) {
    case T_INT: return "integer";
    case T_DOUBLE: return "number";
    case T_BOOL: return "boolean";
    case T_STRING: return "string";
    case T_ADDR_LIST: return "address list";
    case T_ENUM: return "choice";
    case T_INT_LIST: return "integer list";
    case T_DOUBLE_LIST: return "number list";
    }
    return "?";
}

keel_status
keel_config_write_reference(FILE *out)
{
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "config reference: NULL stream");
    fprintf(out, "<!-- Generated by `keel config keys`; do not edit. -->\n"
            "# keel configuration reference\n\n"
            "A job is configured by an INI file. Every key is optional; "
            "unknown sections or keys, bad values and conflicting options "
            "are errors that name the file and line. `-s section.key=value` "
            "overrides a key, and `$OUTPUT_DIR`, when set, replaces "
            "`checkpoint.dir` (unless `-s` sets it). `keel config check "
            "FILE` prints the resolved settings and where each came "
            "from, and exits 2 on any error.\n\n"
            "Lines may be of any length (a value up to 64 KiB). A list "
            "(integer, number or address list) may continue on the "
            "following indented lines, joined with commas; comments "
            "(`;` or `#` at the start of a line, `;` after a blank inside "
            "one) may sit between and after them:\n\n"
            "```ini\n[cluster]\nworkers = node01:2222, node02:2222,\n"
            "    node03:2222   ; rack 2\n    node04:2222\n```\n\n"
            "An indented line under a key that is not a list is an "
            "error.\n");
    for (size_t k = 0; k < N_KEYS; k++) {
        const key_def *d = &schema[k];
        if (k == 0 || strcmp(d->section, schema[k - 1].section) != 0)
            fprintf(out, "\n## [%s]\n\n| key | type | default | meaning |\n"
                    "|---|---|---|---|\n", d->section);
        fprintf(out, "| `%s` | %s", d->name, type_name(d));
        if (d->type == T_ENUM)
            fprintf(out, " (`%s`)", d->choices);
        fprintf(out, " | `%s` | %s |\n", d->def[0] != '\0' ? d->def : "\"\"",
                d->doc);
    }
    if (ferror(out))
        return keel__fail(KEEL_EIO, "config reference: write failed");
    return KEEL_OK;
}

int
keel_config_is_async(const keel_config *cfg, int *is_set)
{
    int by_alg = keel_config_is_set(cfg, "algorithm.name");
    if (is_set != NULL)
        *is_set = by_alg || keel_config_is_set(cfg, "cluster.mode");
    if (by_alg) {
        keel_algorithm a;
        /* validation accepts only known names (the enum lists them) */
        if (keel_algorithm_from_name(keel_config_str(cfg, "algorithm.name"),
                                     &a) == KEEL_OK)
            return !keel_algorithm_is_sync(a);
    }
    return strcmp(keel_config_str(cfg, "cluster.mode"), "async") == 0;
}
