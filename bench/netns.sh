#!/usr/bin/env bash
# bench/netns.sh - one sync parameter-server job (1 ps, the chief, 1 worker;
# the MLP 784-256-256-10 with momentum SGD on Fashion-MNIST, one thread a
# task) on 127.0.0.1, against the same job across three network namespaces
# joined by veth pairs to a bridge, each task on its own host known by name
# only (/etc/netns/NS/hosts: ps-0.bench.svc, chief-0.bench.svc,
# worker-0.bench.svc). Rounds alternate which goes first. Speed is the
# chief's "cluster N examples/s" (its first to last step, checkpoints
# included); prints the medians over rounds and veth/loopback (the median
# of the per-round ratios), and where a step's time goes: the ps's idle
# time (replies out, the next gradients in) and the chief's wait for the
# ps, medians in ms. Needs root and iproute2.
#   usage: bench/netns.sh [BUILD_DIR]
#   env:   ROUNDS=3 BATCH=64 EXAMPLES=25600 RUN_TIMEOUT=300 (seconds one
#          run may take; then its tasks are killed and the script fails)
#          MTU=1500 (the veth pairs' and the bridge's; loopback's is 65536)
#          LOCAL_TRANSPORT=auto (cluster.local_transport of both jobs: auto
#          puts the loopback job on Unix sockets, tcp keeps it on TCP)
#          SEND_BUFFER_KIB=<unset: keel's default> (cluster.send_buffer_kib
#          of both jobs; 0: the kernel's autotuning)
#          BENCH_OUT=<default a fresh /tmp/keel-netns-bench.*, kept>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
keel=$(cd "$build" && pwd)/keel
ROUNDS=${ROUNDS:-3}
BATCH=${BATCH:-64}
EXAMPLES=${EXAMPLES:-25600}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
MTU=${MTU:-1500}
LOCAL_TRANSPORT=${LOCAL_TRANSPORT:-auto}
SEND_BUFFER_KIB=${SEND_BUFFER_KIB:-}
[ -x "$keel" ] || { echo "netns.sh: no keel in $build" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "netns.sh: needs root (network namespaces)" >&2; exit 2; }
command -v ip >/dev/null || { echo "netns.sh: needs ip (iproute2)" >&2; exit 2; }
. "$here/common.sh"
OUT=$(bench_out_dir keel-netns-bench)
: > "$OUT/runs.jsonl"

tag=kb$$
hub=$tag-hub
roles=(ps chief worker)
declare -A ns addr pid
for i in 0 1 2; do
  ns[${roles[$i]}]=$tag-${roles[$i]}
  addr[${roles[$i]}]=10.202.0.$((i + 1))
done
all_ns=("$hub" "${ns[ps]}" "${ns[chief]}" "${ns[worker]}")
pids=()

cleanup() {
  local p n
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for n in "${all_ns[@]}"; do
    ip netns del "$n" 2>/dev/null || true
    rm -rf "/etc/netns/$n"
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

ip netns add "$hub"
ip -n "$hub" link set lo up
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
for r in "${roles[@]}"; do
  ip netns add "${ns[$r]}"
  ip -n "${ns[$r]}" link set lo up
  ip link add "v-$r" netns "$hub" type veth peer name eth0 netns "${ns[$r]}"
  ip -n "$hub" link set "v-$r" master br0
  ip -n "$hub" link set "v-$r" mtu "$MTU" up
  ip -n "${ns[$r]}" link set eth0 mtu "$MTU"
  ip -n "${ns[$r]}" addr add "${addr[$r]}/24" dev eth0
  ip -n "${ns[$r]}" link set eth0 up
  mkdir -p "/etc/netns/${ns[$r]}"
  {
    echo "127.0.0.1 localhost"
    for q in "${roles[@]}"; do echo "${addr[$q]} $q-0.bench.svc"; done
  } > "/etc/netns/${ns[$r]}/hosts"
done

{ bench_mlp_momentum_ini; cat <<EOF
[train]
batch_size = $BATCH
max_steps = $((EXAMPLES / BATCH))
threads = 1
[checkpoint]
dir = $OUT/run
save_steps = 1000000
[hooks]
log_every_steps = 0
summary_every_steps = 0
progress = off
[cluster]
mode = sync
local_transport = $LOCAL_TRANSPORT
EOF
  [ -z "$SEND_BUFFER_KIB" ] || echo "send_buffer_kib = $SEND_BUFFER_KIB"
} > "$OUT/job.ini"

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run WHERE ROUND: one job (WHERE: loopback or veth), a JSON line
run() {
  local where=$1 round=$2 r host end rc bad="" line idle wait_ms
  declare -A hp
  if [ "$where" = loopback ]; then
    for r in "${roles[@]}"; do hp[$r]=127.0.0.1:$(free_port); done
  else
    for r in "${roles[@]}"; do hp[$r]=$r-0.bench.svc:2222; done
  fi
  rm -rf "$OUT/run"
  for r in "${roles[@]}"; do
    local tf
    tf=$(printf '{"cluster":{"chief":["%s"],"ps":["%s"],"worker":["%s"]},"task":{"type":"%s","index":0},"environment":"cloud"}' \
      "${hp[chief]}" "${hp[ps]}" "${hp[worker]}" "$r")
    if [ "$where" = loopback ]; then
      TF_CONFIG=$tf OPENBLAS_NUM_THREADS=1 "$keel" train "$OUT/job.ini" \
        > "$OUT/$where-$round-$r.log" 2>&1 &
    else
      ip netns exec "${ns[$r]}" env TF_CONFIG="$tf" OPENBLAS_NUM_THREADS=1 \
        "$keel" train "$OUT/job.ini" > "$OUT/$where-$round-$r.log" 2>&1 &
    fi
    pid[$r]=$!
    pids+=($!)
  done
  end=$(( $(date +%s) + RUN_TIMEOUT ))
  for r in chief ps worker; do
    while kill -0 "${pid[$r]}" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 0.1; done
    kill -KILL "${pid[$r]}" 2>/dev/null || true
    rc=0; wait "${pid[$r]}" || rc=$?
    [ $rc -eq 0 ] || bad="$bad $r=$rc"
  done
  pids=()
  if [ -n "$bad" ]; then
    echo "netns.sh: $where round $round failed:$bad (137: killed at RUN_TIMEOUT $RUN_TIMEOUT s); logs in $OUT" >&2
    tail -n 5 "$OUT/$where-$round"-*.log >&2
    exit 1
  fi
  line=$(grep -o -E 'cluster [0-9]+ examples, [0-9.]+ examples/s' "$OUT/$where-$round-chief.log" | tail -n 1)
  idle=$(grep -o -E 'idle [0-9.]+' "$OUT/$where-$round-ps.log" | tail -n 1 | cut -d' ' -f2)
  wait_ms=$(grep -o -E 'wait for the ps [0-9.]+' "$OUT/$where-$round-chief.log" | tail -n 1 | cut -d' ' -f5)
  echo "{\"round\": $round, \"where\": \"$where\", \"examples_per_s\": $(sed -E 's/.* ([0-9.]+) examples\/s/\1/' <<<"$line"), \"ps_idle_ms\": ${idle:-null}, \"chief_wait_ms\": ${wait_ms:-null}}" \
    >> "$OUT/runs.jsonl"
}

bench_machine
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order="loopback veth"; else order="veth loopback"; fi
  for where in $order; do
    echo "== round $round/$ROUNDS $where" >&2
    run "$where" "$round"
  done
done

/usr/bin/python3 - "$OUT/runs.jsonl" "$BATCH" "$EXAMPLES" "$MTU" "$LOCAL_TRANSPORT" "${SEND_BUFFER_KIB:-default}" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in runs:
    by.setdefault(r["round"], {})[r["where"]] = r["examples_per_s"]
lo = [v["loopback"] for v in by.values()]
ve = [v["veth"] for v in by.values()]
ratios = sorted(v["veth"] / v["loopback"] for v in by.values())
print(f"sync, 1 ps + chief + worker, batch {sys.argv[2]}, {sys.argv[3]} examples a run, veth MTU {sys.argv[4]}, local_transport {sys.argv[5]}, send_buffer_kib {sys.argv[6]}, {len(by)} rounds")
print(f"loopback: {statistics.median(lo):.0f} ex/s   veth by name: {statistics.median(ve):.0f} ex/s")
print(f"veth/loopback: {statistics.median(ratios):.3f} (rounds {ratios[0]:.3f}-{ratios[-1]:.3f})")
for w in ("loopback", "veth"):
    idle = [r["ps_idle_ms"] for r in runs if r["where"] == w and r.get("ps_idle_ms") is not None]
    wt = [r["chief_wait_ms"] for r in runs if r["where"] == w and r.get("chief_wait_ms") is not None]
    if idle and wt:
        print(f"{w}: ps idle {statistics.median(idle):.3f} ms a step (replies out, gradients in), chief waits for the ps {statistics.median(wt):.3f} ms a step")
PY
echo "logs: $OUT"
