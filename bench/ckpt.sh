#!/bin/sh
# ckpt.sh - checkpoint benchmark, side by side in one run: keel save/restore
# against raw write()+fsync() and a raw cold read() of the same bytes
# (bench/ckpt_bench, interleaved inside one process), and torch.save /
# torch.load of the same bytes (bench/ckpt_torch.py; skipped with a
# message when python3-torch is missing), alternating round by round
# (keel first in odd rounds, torch first in even ones); optionally an older
# ckpt_bench (KEEL_BEFORE=path, built from this ckpt_bench.c) in the same
# rounds. Inside ckpt_bench, keel and raw swap places every round. Prints
# every sample as a JSON line (with the load average at each round), then
# a Markdown table of medians; ratio columns are medians of per-round
# ratios.
# Run from a configured build directory:
#   make bench/ckpt_bench && sh ../bench/ckpt.sh [SIZES] [ROUNDS] [DIR]
set -e
SIZES=${1:-16,256,1024}
ROUNDS=${2:-5}
DIR=${3:-/tmp/keel_ckpt_bench.$$}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${CKPT_BENCH:-./bench/ckpt_bench}
PY=${PYTHON:-/usr/bin/python3}
OUT=$(mktemp /tmp/keel_ckpt_sh.XXXXXX)
trap 'rm -rf "$DIR" "$OUT"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
has_torch=1
"$PY" -c 'import torch' 2>/dev/null || has_torch=0
[ "$has_torch" = 1 ] || echo "ckpt.sh: PyTorch missing: the torch.save column is skipped (apt-get install python3-torch)" >&2
echo "{\"bench\":\"env\",\"host\":\"$(uname -n)\",\"nproc\":$(nproc),\"load\":\"$(load)\",\"dir\":\"$DIR\",\"torch\":$has_torch}" | tee -a "$OUT"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for mib in $(echo "$SIZES" | tr ',' ' '); do
        echo "{\"bench\":\"round\",\"round\":$r,\"size_mib\":$mib,\"load\":\"$(load)\"}" | tee -a "$OUT"
        run_keel() {
            "$BIN" --sizes "$mib" --reps 1 --round "$r" --dir "$DIR/k" |
                sed "s/^{/{\"round\":$r,\"who\":\"keel\",/" | tee -a "$OUT"
            rm -rf "$DIR/k"
            if [ -n "$KEEL_BEFORE" ]; then
                "$KEEL_BEFORE" --sizes "$mib" --reps 1 --round "$r" --dir "$DIR/b" |
                    sed "s/^{/{\"round\":$r,\"who\":\"before\",/" | tee -a "$OUT"
                rm -rf "$DIR/b"
            fi
        }
        run_torch() {
            [ "$has_torch" = 1 ] || return 0
            "$PY" "$HERE/ckpt_torch.py" --size "$mib" --dir "$DIR/t" |
                sed "s/^{/{\"round\":$r,\"who\":\"torch\",/" | tee -a "$OUT"
            rm -rf "$DIR/t"
        }
        if [ $((r % 2)) = 1 ]; then run_keel; run_torch; else run_torch; run_keel; fi
    done
    r=$((r + 1))
done
echo "{\"bench\":\"env_end\",\"load\":\"$(load)\"}" | tee -a "$OUT"
"$PY" - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = statistics.median
def get(who, op, mib):
    return {x["round"]: x["median"] for x in rows
            if x.get("who") == who and x.get("op") == op and x.get("size_mib") == mib}
sizes = sorted({x["size_mib"] for x in rows if x.get("who") == "keel"})
loads = [float(x["load"].split()[0]) for x in rows if x.get("bench") == "round"]
print("\nload average (1 min) at the rounds: %.1f-%.1f, median %.1f" % (min(loads), max(loads), med(loads)))
print("\n| size | raw write+fsync GB/s | keel save GB/s | save/raw | torch.save GB/s | save/torch.save | raw cold read GB/s | keel cold restore GB/s | restore/raw | torch.load cold GB/s | memcpy ms | async stall ms | stall/memcpy | rounds |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
def ratio(a, b):
    v = [a[r] / b[r] for r in a if r in b and b[r] > 0]
    return ("%.2fx (%.2f-%.2f)" % (med(v), min(v), max(v))) if v else "-"
def m(d, f="%.2f"):
    return f % med(d.values()) if d else "-"
for mib in sizes:
    ks, rw = get("keel", "keel_save", mib), get("keel", "raw_write_fsync", mib)
    kr, rr = get("keel", "keel_restore_cold", mib), get("keel", "raw_read_cold", mib)
    ts, tl = get("torch", "torch_save", mib), get("torch", "torch_load_cold", mib)
    cp, stl = get("keel", "memcpy_vars", mib), get("keel", "async_stall", mib)
    print("| %d MiB | %s | %s | **%s** | %s | **%s** | %s | %s | **%s** | %s | %s | %s | **%s** | %d |" % (
        mib, m(rw), m(ks), ratio(ks, rw), m(ts), ratio(ks, ts), m(rr), m(kr), ratio(kr, rr),
        m(tl), m(cp, "%.1f"), m(stl, "%.1f"), ratio(stl, cp), len(ks)))
if any(x.get("who") == "before" for x in rows):
    print("\nbefore (KEEL_BEFORE) in the same rounds:\n")
    print("| size | before save/raw | after save/raw | before restore/raw | after restore/raw | before stall/memcpy | after stall/memcpy |")
    print("|---|---|---|---|---|---|---|")
    for mib in sizes:
        def rr_(who, a, b):
            return ratio(get(who, a, mib), get(who, b, mib))
        print("| %d MiB | %s | %s | %s | %s | %s | %s |" % (
            mib, rr_("before", "keel_save", "raw_write_fsync"), rr_("keel", "keel_save", "raw_write_fsync"),
            rr_("before", "keel_restore_cold", "raw_read_cold"), rr_("keel", "keel_restore_cold", "raw_read_cold"),
            rr_("before", "async_stall", "memcpy_vars"), rr_("keel", "async_stall", "memcpy_vars")))
EOF
