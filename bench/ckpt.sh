#!/bin/sh
# ckpt.sh - checkpoint benchmark: keel save/restore vs raw write()+fsync()
# and raw cold read() (bench/ckpt_bench, interleaved in one process), then
# torch.save/torch.load and h5py on the same sizes via the shared Python
# baseline. Output: JSON lines. Run from a configured build directory:
#   make bench/ckpt_bench && sh ../bench/ckpt.sh [SIZES] [REPS] [DIR]
set -e
SIZES=${1:-16,256,1024}
REPS=${2:-3}
DIR=${3:-/tmp/keel_ckpt_bench.$$}
HERE=$(dirname "$0")
BIN=${CKPT_BENCH:-./bench/ckpt_bench}
PYBENCH=${PY_IO_BENCH:-/work/shared/bench/py_io_bench.py}
echo "{\"bench\":\"env\",\"host\":\"$(uname -n)\",\"nproc\":$(nproc),\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"dir\":\"$DIR\"}"
"$BIN" --sizes "$SIZES" --reps "$REPS" --dir "$DIR"
rm -rf "$DIR"
if /usr/bin/python3 -c 'import torch, h5py' 2>/dev/null; then
    /usr/bin/python3 "$PYBENCH" --sizes "$SIZES" --reps "$REPS" --dir "$DIR.py" |
        grep -E '"mode": "(raw|torch_save|h5py_contig)"' |
        grep -E '"op": "(write_fsync|read_cold)"' || true
else
    echo '{"bench":"py_io","skipped":"python3 with torch and h5py not found"}'
fi
echo "{\"bench\":\"env_end\",\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
