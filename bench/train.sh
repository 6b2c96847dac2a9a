#!/usr/bin/env bash
# bench/train.sh - keel's training throughput beside PyTorch's, in one run:
# ROUNDS rounds, each running keel's bench/train_bench and then
# bench/torch_train.py (both thread settings PyTorch likes best)
# under the same OPENBLAS_CORETYPE, so the noise of this shared machine
# hits both alike. Prints medians over rounds and keel/PyTorch ratios.
# keel thread settings: "1", "2" = OpenBLAS threads; "m2" = 2 model threads
# (keel_model_config.threads) with 1 OpenBLAS thread each.
#   usage: bench/train.sh [throughput|accuracy] [BUILD_DIR]
#   env:   ROUNDS=3 CORETYPES=<default: "SkylakeX Haswell" where the CPU
#          has AVX-512, Haswell where it has AVX2> MODELS=mlp,cnn
#          BATCHES=64,256 SEG=1.5 EPOCHS=5 BENCH_OUT=./train-bench
#          KEEL_BEFORE=path/to/another/build/bench/train_bench: an older
#          keel measured in the same rounds (before/after columns; the
#          two take turns going first)
#          TORCH=0 skips PyTorch; RUN_TIMEOUT=600 (seconds one process
#          may take)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:-throughput}
build=${2:-$here/../_build}
ROUNDS=${ROUNDS:-3}
. "$here/common.sh"
CORETYPES=${CORETYPES:-$(bench_coretypes)}
MODELS=${MODELS:-mlp,cnn}
BATCHES=${BATCHES:-64,256}
SEG=${SEG:-1.5}
EPOCHS=${EPOCHS:-5}
OUT=${BENCH_OUT:-$PWD/train-bench}
PY=${PYTHON:-/usr/bin/python3}
TORCH=${TORCH:-1}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
if [ "$TORCH" = 1 ] && ! $PY -c 'import torch' 2>/dev/null; then
    echo "train.sh: PyTorch missing: the PyTorch column is skipped (apt-get install python3-torch)" >&2
    TORCH=0
fi
mkdir -p "$OUT"
bench_machine >&2
make -s -C "$build" bench/train_bench
kb="$build/bench/train_bench"

if [ "$mode" = accuracy ]; then
    # fixed seed, batch 64, test accuracy after every epoch (keel, then
    # PyTorch's own run of the same protocol)
    OPENBLAS_NUM_THREADS=1 "$kb" --mode accuracy --models "$MODELS" \
        --batches 64 --epochs "$EPOCHS" --threads 1 --model-threads 2 \
        --init torch | tee "$OUT/keel_acc.jsonl"
    [ "$TORCH" = 1 ] || exit 0
    OPENBLAS_NUM_THREADS=1 $PY "$here/torch_train.py" --mode accuracy \
        --models "$MODELS" --batches 64 --epochs "$EPOCHS" --threads 2 \
        | tee "$OUT/torch_acc.jsonl"
    exit 0
fi

: > "$OUT/keel.jsonl"
: > "$OUT/torch.jsonl"
: > "$OUT/before.jsonl"
KEEL_BEFORE=${KEEL_BEFORE:-}
load() { cut -d' ' -f1 /proc/loadavg; }
# Per round, per model and batch: keel, (the older keel,) then PyTorch, so
# each pair runs seconds apart; every line records the 1-minute load
# average read just before its process started.
for core in $CORETYPES; do
    for r in $(seq "$ROUNDS"); do
        echo "== round $r/$ROUNDS OPENBLAS_CORETYPE=$core load $(load)" >&2
        for model in ${MODELS//,/ }; do
            for batch in ${BATCHES//,/ }; do
                tag="\"round\": $r, \"coretype\": \"$core\""
                bins=("$kb"); names=(keel)
                if [ -n "$KEEL_BEFORE" ] && [ $((r % 2)) = 1 ]; then
                    bins=("$kb" "$KEEL_BEFORE"); names=(keel before)
                elif [ -n "$KEEL_BEFORE" ]; then
                    bins=("$KEEL_BEFORE" "$kb"); names=(before keel)
                fi
                for i in "${!bins[@]}"; do
                    OPENBLAS_CORETYPE=$core timeout "$RUN_TIMEOUT" \
                        "${bins[$i]}" --mode throughput \
                        --models "$model" --batches "$batch" \
                        --threads-list 1,2,m2 --reps 1 --seg-seconds "$SEG" \
                        | sed "s/^{/{$tag, \"load\": $(load), /" \
                        >> "$OUT/${names[$i]}.jsonl"
                done
                [ "$TORCH" = 1 ] || continue
                for env in "OMP_WAIT_POLICY=PASSIVE" "OPENBLAS_NUM_THREADS=1"; do
                    env OPENBLAS_CORETYPE="$core" $env timeout "$RUN_TIMEOUT" \
                        $PY "$here/torch_train.py" \
                        --mode throughput --models "$model" --batches "$batch" \
                        --reps 1 --seg-seconds "$SEG" \
                        | sed "s/^{/{$tag, \"load\": $(load), \"torch_env\": \"$env\", /" \
                        >> "$OUT/torch.jsonl"
                done
            done
        done
    done
done

$PY - "$OUT/keel.jsonl" "$OUT/torch.jsonl" "$OUT/before.jsonl" <<'EOF'
import json, statistics, sys
from collections import defaultdict
keel = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
torch = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
before = defaultdict(list)
for r in (json.loads(l) for l in open(sys.argv[3]) if l.strip()):
    if r["bench"] == "keel_train_tput":
        before[(r["coretype"], r["model"], r["batch"], r["threads"])].append(r["median"])
k = defaultdict(list)       # (core, model, batch, threads) -> [ex/s per round]
split = {}
cores = {}
peak = defaultdict(list)
core_name = {}
for r in keel:
    if r["bench"] == "keel_train_tput":
        k[(r["coretype"], r["model"], r["batch"], r["threads"])].append(r["median"])
        cores[r["threads"]] = r["blas_threads"] * r["model_threads"]
        core_name[r["coretype"]] = r["corename"]
    elif r["bench"] == "keel_sgemm_peak":
        peak[(r["coretype"], r["threads"])].append(r["gflops"])
    elif r["bench"] == "keel_train_split":
        split[(r["coretype"], r["model"], r["batch"])] = r
t = defaultdict(list)       # (core, model, batch, env/threads) -> [ex/s]
for r in torch:
    if r["bench"] == "torch_train_tput":
        t[(r["coretype"], r["model"], r["batch"],
           r["torch_env"] + " threads=%d" % r["threads"])].append(r["median"])
flops = {"mlp": 1.21e6, "cnn": 14.8e6}
print("| coretype (keel corename) | model | batch | keel ex/s (threads) | keel GFLOP/s (% of sgemm peak) | PyTorch best ex/s (setting) | keel/PyTorch | rounds | load avg (min-max) |")
print("|---|---|---|---|---|---|---|---|---|")
rows_before = []
for (core, model, batch) in sorted({(a, b, c) for (a, b, c, _) in k}):
    kbest = max(((statistics.median(v), th) for (a, b, c, th), v in k.items()
                 if (a, b, c) == (core, model, batch)))
    tbest = max(((statistics.median(v), s) for (a, b, c, s), v in t.items()
                 if (a, b, c) == (core, model, batch)), default=(float("nan"), "-"))
    pk = statistics.median(peak[(core, min(cores[kbest[1]], 2))])
    g = kbest[0] * flops[model] / 1e9
    n = len(k[(core, model, batch, kbest[1])])
    la = [r["load"] for r in keel + torch if r.get("coretype") == core and
          r.get("model") == model and r.get("batch") == batch and "load" in r]
    print("| %s (%s) | %s | %d | %.0f (%s) | %.0f (%.0f%% of %.0f) | %.0f (%s) | %.2f | %d | %.1f-%.1f |" % (
        core, core_name.get(core, "?"), model, batch, kbest[0], kbest[1], g,
        100 * g / pk, pk, tbest[0], tbest[1], kbest[0] / tbest[0], n,
        min(la, default=float("nan")), max(la, default=float("nan"))))
    bb = max(((statistics.median(v), th) for (a, b, c, th), v in before.items()
              if (a, b, c) == (core, model, batch)), default=None)
    if bb:
        rows_before.append("| %s | %s | %d | %.0f (%s) | %.2f | %.0f (%s) | %.2f | %.2f |" % (
            core, model, batch, bb[0], bb[1], bb[0] / tbest[0], kbest[0], kbest[1],
            kbest[0] / tbest[0], kbest[0] / bb[0]))
if rows_before:
    print()
    print("before (KEEL_BEFORE) and after, best settings, same rounds:")
    print("| coretype | model | batch | before ex/s | before/PyTorch | after ex/s | after/PyTorch | after/before |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows_before:
        print(row)
print()
print("time split of keel's 1-thread run (last round):")
for key, r in sorted(split.items()):
    print("  %s %s b%d: gemm %.0f%%, im2col %.0f%%, elementwise %.0f%%, optimizer %.0f%%, data %.0f%%" % (
        key[0], key[1], key[2], r["gemm_pct"], r["im2col_pct"], r["elementwise_pct"],
        r["optimizer_pct"], r["data_pct"]) + ", direct conv %.0f%%" % r.get("conv_direct_pct", 0))
print()
print("all keel figures (min..max over rounds):")
for key, v in sorted(k.items()):
    print("  %s %s b%d threads=%s: median %.0f (%.0f..%.0f)" % (key + (statistics.median(v), min(v), max(v))))
print("all PyTorch figures:")
for key, v in sorted(t.items()):
    print("  %s %s b%d %s: median %.0f (%.0f..%.0f)" % (key + (statistics.median(v), min(v), max(v))))
EOF
