# tests/common.sh - sourced (POSIX sh) by the long tests, the install tests
# and bench/algorithms_accuracy.sh: the update rules, the checks that start
# a Fashion-MNIST run, the MLP job the rule comparisons share and readers
# of keel launch's output and of keel.pc.
# shellcheck shell=sh

# Every update rule (docs/algorithms.md).
# shellcheck disable=SC2034
KEEL_ALL_RULES="sync async hogwild downpour downpour_easy agn sagn adag dynsgd easgd aeasgd aeamsgd model_averaging"

# Needs $KEEL (the keel binary) and say() (one line on stdout). Exits 99
# (a hard error) when $KEEL is not executable, 77 (skipped) when the
# directory $1 holds no Fashion-MNIST training images (plain or gzipped).
keel_require_fashion_mnist() {
    if [ ! -x "$KEEL" ]; then
        say "no keel binary at $KEEL (set KEEL_BUILDDIR)"; exit 99
    fi
    if [ ! -r "$1/train-images-idx3-ubyte.gz" ] &&
       [ ! -r "$1/train-images-idx3-ubyte" ]; then
        say "skipped: no Fashion-MNIST in $1 (apt-get install dataset-fashion-mnist)"
        exit 77
    fi
}

# The rule comparisons' rates for rule $1 with $2 replicas, as keel -s
# options on stdout (docs/algorithms.md, "Accuracy"): tuned on the job
# below for about the budget of sync's 2,812 steps at 0.1. Local SGD runs
# on each replica's mean gradient (a slice of 32) at eta 0.05; AGN-like
# commits move the center by about one local step per window, so those
# get a short window and eta 0.2. async and hogwild push each replica's
# share of the global batch's gradient (1 / replicas of its mean): their
# optimizer rate is 0.1 times the replicas.
keel_rule_rates() {
    case $1 in
        agn|adag|sagn) echo "-s algorithm.window=4 -s algorithm.learning_rate=0.2" ;;
        downpour) echo "-s algorithm.learning_rate=0.05 -s algorithm.ps_learning_rate=0.01" ;;
        downpour_easy) echo "-s algorithm.learning_rate=0.05 -s algorithm.ps_learning_rate=0.05" ;;
        async|hogwild) echo "-s optimizer.learning_rate=$(awk -v r="$2" 'BEGIN { print 0.1 * r }')" ;;
        *) echo "-s algorithm.learning_rate=0.05" ;;
    esac
}

# The rule comparisons' job on stdout: the MLP 784-256-256-10 (the
# default widths, so that -s model.type=cnn may replace it) on the
# Fashion-MNIST in directory $1, plain SGD at 0.1, batch 64, seed 0, one
# thread. The text ends inside [train]; the caller appends the rest.
keel_rules_mlp_ini() {
    cat <<INI
[model]
type = mlp
[data]
dir = $1
[optimizer]
name = sgd
learning_rate = 0.1
[train]
batch_size = 64
seed = 0
threads = 1
INI
}

# The pid of the newest incarnation of task $2 ("chief", "ps.0", ...) that
# keel launch reported in its output file $1 (its lines "launch |
# started|restarted <task> (pid N)"); nothing when there is none.
keel_launch_pid() {
    sed -n "s/^launch | \(re\)\{0,1\}started $2 (pid \([0-9]*\)).*/\2/p" "$1" |
        tail -1
}

# The libdir that keel.pc in the build directory $1 names, with ${prefix}
# and ${exec_prefix} spelled out: where `make install` puts libkeel and
# keel.pc below its DESTDIR.
keel_pc_libdir() (
    prefix=$(sed -n 's/^prefix=//p' "$1/keel.pc")
    sed -n 's/^libdir=//p' "$1/keel.pc" |
        sed -e "s|\${exec_prefix}|$prefix|g" -e "s|\${prefix}|$prefix|g"
)
