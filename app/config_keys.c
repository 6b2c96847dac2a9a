/* config_keys.c - the configuration's key table: every INI key's
 * section, name, type, default, limits, choices and one-line description.
 * The parser, -s overrides, `keel config check` and `keel config keys`
 * (docs/config.md) all read it; adding a key is adding a row here
 * (HACKING.md, "Adding a config key"). */
#include <config.h>

#include <stddef.h>

#include "defaults.h"
#include "util.h"
#include "../cluster/defaults.h"
#include "config_int.h"

#define NOLIM -1e300, 1e300

/* The schema. Order here is the order of `keel config check` and docs. */
/* cluster defaults shared with keel_cluster_config_init */
#define D(name) KEEL__XSTR(KEEL__CLUSTER_##name)

const keel__config_key keel__config_keys[] = {
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
    { "checkpoint", "sharded", T_ENUM, "off", NOLIM, "auto|on|off",
      "Cluster with ps: each ps writes its own variables and slots as one "
      "shard into dir and the chief commits an index last (no model "
      "traffic through the chief); dir must be one directory on every "
      "task (a shared file system) and basename model.ckpt. off: the "
      "chief pulls the model and writes one file. auto: on when every ps "
      "runs on a loopback address (this machine), else off." },
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
      "auto, the default: a ps on an address of its own host also listens "
      "on a Unix socket in /tmp/keel-<uid> (private to the user), and "
      "tasks of that host whose ps socket exists there connect over it, "
      "with the same token or CURVE checks; tcp: tcp only." },
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
    { "cluster", "partition_bytes", T_INT, "0", 0, 1e15, NULL,
      "Partitioned variables: a variable of at least two rows bigger than "
      "this many bytes is split by rows into ceil(bytes / partition_bytes) "
      "parts (at most cluster.max_partitions and its rows), each an "
      "ordinary variable NAME/part_k on a ps; the workers and checkpoints "
      "see the whole variable (a sharded checkpoint's index shows it as "
      "one virtual dataset over the parts) and training gives the same "
      "values. 0: off." },
    { "cluster", "max_partitions", T_INT, "0", 0, 1024, NULL,
      "The most parts cluster.partition_bytes splits a variable into; 0: "
      "the number of parameter servers." },
    { "cluster", "reduce_tree", T_BOOL, "true", NOLIM, NULL,
      "Sync mode: the ps add the replicas' gradients along the fixed "
      "binary tree over the model's pieces of the global batch (each "
      "replica pushes the sums of the tree nodes covering its pieces, one "
      "for a power-of-two replica count dividing the pieces), so 1, 2, 3, 4 ... replicas give the same "
      "bits where the batch allows it (docs/determinism.md). false: in "
      "replica order (one push each; results differ between replica "
      "counts in the last bits)." },
    { "cluster", "elastic", T_BOOL, "false", NOLIM, NULL,
      "Sync mode over the reduction tree: the job goes on when a worker "
      "leaves for good (silent past cluster.dead_after_ms, or removed by "
      "keel launch) and when one joins (any new worker index): ps 0 "
      "re-divides the global batch's leaves among the live replicas at a "
      "step boundary (the other ps follow), so the variables stay bitwise "
      "those of a run with fixed membership; each replica reads the whole "
      "global batch. No backup workers (docs/cluster.md)." },
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

const size_t keel__config_n_keys =
    sizeof keel__config_keys / sizeof keel__config_keys[0];
