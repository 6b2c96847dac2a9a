# bench/common.sh - sourced by the bench scripts (POSIX sh): what machine
# and OpenBLAS kernel a run measured, which kernels it can try, and the
# MLP job the training benchmarks share.

# The OpenBLAS core name this environment gets (OPENBLAS_CORETYPE
# honoured), or "unknown".
bench_blas_core() {
    /usr/bin/python3 -c 'import ctypes, ctypes.util
l = ctypes.CDLL(ctypes.util.find_library("openblas") or "libopenblas.so.0")
l.openblas_get_corename.restype = ctypes.c_char_p
print(l.openblas_get_corename().decode())' 2>/dev/null || echo unknown
}

bench_has_avx512() { grep -q -w avx512f /proc/cpuinfo; }

# One line for the log: cores, CPU model and vector extensions, the
# OpenBLAS kernel, the load average.
bench_machine() {
    echo "machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)" \
         "($(grep -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/ $//'));" \
         "OpenBLAS kernel: $(bench_blas_core) (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset});" \
         "load: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# The OPENBLAS_CORETYPE values worth comparing here: SkylakeX only where
# the CPU has AVX-512 (elsewhere it dies with SIGILL), Haswell where it has
# AVX2, otherwise the kernel OpenBLAS picks itself.
bench_coretypes() {
    if bench_has_avx512; then
        echo "SkylakeX Haswell"
    elif grep -q -w avx2 /proc/cpuinfo; then
        echo Haswell
    else
        bench_blas_core
    fi
}

# The directory for a run's logs, on stdout: $BENCH_OUT (made when
# missing), or else a fresh `mktemp -d /tmp/<name>.XXXXXX`.
bench_out_dir() {
    d=${BENCH_OUT:-$(mktemp -d "/tmp/$1.XXXXXX")}
    mkdir -p "$d" && echo "$d"
}

# bench_mpirun ME: MPIRUN, the mpirun on PATH, with Open MPI's consent to
# run as root exported when root runs it; ME's exit 3 naming the packages
# when there is none.
bench_mpirun() {
    MPIRUN=$(command -v mpirun || true)
    if [ -z "$MPIRUN" ]; then
        echo "$1: mpirun missing (apt-get install openmpi-bin" \
             "libopenmpi-dev, then re-run configure)" >&2
        exit 3
    fi
    if [ "$(id -u)" = 0 ]; then
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
    fi
}

# bench_mwm_ini OUT [TRAIN_LINES]: the MLP below under
# multi_worker_mirrored, one BLAS thread a rank, TRAIN_LINES ("key = v\n"
# lines) added to [train], checkpoints in OUT/run, no logging hooks.
bench_mwm_ini() {
    bench_mlp_momentum_ini
    printf '[train]\nstrategy = multi_worker_mirrored\nthreads = 1\n%b' \
        "${2:-}"
    printf '[checkpoint]\ndir = %s/run\n[hooks]\nlog_every_steps = 0\n' "$1"
    printf 'summary_every_steps = 0\nprogress = off\n'
}

# The MLP 784-256-256-10 with momentum SGD on Fashion-MNIST (INI sections
# [model], [data], [optimizer]; the caller appends the rest).
bench_mlp_momentum_ini() {
    cat <<INI
[model]
type = mlp
hidden = 256,256
[data]
dir = /usr/share/datasets/fashion-mnist
[optimizer]
name = momentum
learning_rate = 0.01
momentum = 0.9
INI
}
