#!/usr/bin/env bash
# it_netns_names.sh - multi-host jobs whose hosts are known by name only.
# Three network namespaces (h1, h2, h3) joined by veth pairs to a bridge in
# a fourth; each has its own /etc/netns/NS/hosts (`ip netns exec` mounts it
# over /etc/hosts) naming every host, as a cluster's DNS would:
#   tfjob  TF_CONFIG exactly as the Kubernetes TFJob operator writes it
#          (Go's json.Marshal: keys sorted, "environment": "cloud"), hosts
#          tfjob-{chief,ps,worker}-0.default.svc:2222 on IPv4; the ps is
#          SIGKILLed and comes back on another address, its name moved
#          with it (a pod re-created on a new IP: the chief and the worker
#          find it again by name); the worker's link is cut and restored.
#   slurm  srun's variables (SLURM_JOB_NODELIST=node[01-03], SLURM_PROCID,
#          SLURM_NTASKS, SLURM_NODEID, SLURM_STEP_NODELIST,
#          SLURM_TASKS_PER_NODE, SLURM_STEP_RESV_PORTS, ...): rank 0 the ps
#          on node01, worker 0 (the chief) on node02, worker 1 on node03;
#          worker 1 is SIGKILLed and restarted, the ps's link is cut.
#   ipv6   the namespaces hold IPv6 addresses only (nodad), the names map
#          to them only; TF_CONFIG as in tfjob; the worker is SIGKILLed
#          and restarted, the chief's link is cut.
# A killed task is restarted with its own command line; a link is down for
# CUT_SECS (past cluster.dead_after_ms, so the peers give each other up
# and reconnect). Every job is sync training (1 ps, 2 replicas, 300 steps,
# one OpenBLAS thread: bitwise deterministic, docs/determinism.md); each
# disturbed run ends with exit 0 for every task and a final checkpoint that
# `keel ckpt diff` finds identical to an undisturbed run of the same job.
# Every wait has a deadline; every process, namespace and /etc/netns entry
# is removed on exit, failure or signal. Needs root and iproute2; exits 77
# with "SKIP: reason" otherwise (a scenario the kernel cannot host, e.g.
# IPv6 disabled, is a SKIP line of its own).
# Usage: it_netns_names.sh BUILDDIR (or KEEL_BUILDDIR set);
# KEEL_NETNS_SCENARIOS="tfjob slurm ipv6" picks scenarios;
# KEEL_NETNS_RATE (default 200mbit; off: none) caps each namespace's
# outgoing rate (tc tbf), so that a run lasts long enough on an idle
# machine for its disturbances to land mid-run (the rate changes timing,
# never bits); KEEL_NETNS_KEEP=DIR keeps every task's log there.
set -u

# shellcheck source=tests/netns_common.sh
. "$(dirname "$0")/netns_common.sh"
netns_builddir it_netns_names.sh "${1:-${KEEL_BUILDDIR:-}}"

skip() { echo "SKIP: netns names: $*"; exit 77; }
netns_require

MAX_STEPS=300
KILL_AT=30            # the chief's step after which the victim is killed
CUT_SECS=3            # a link is down this long (dead_after_ms is 1500)
scenarios=${KEEL_NETNS_SCENARIOS:-tfjob slurm ipv6}

tag=kn$$
hub=$tag-hub
hosts=(h1 h2 h3)          # h1 the ps, h2 the chief, h3 the other worker
declare -A ns hubif
for h in "${hosts[@]}"; do ns[$h]=$tag-$h; hubif[$h]=v-$h; done
all_ns=("$hub" "${ns[h1]}" "${ns[h2]}" "${ns[h3]}")
work=$(mktemp -d "${TMPDIR:-/tmp}/keel-netns-names-XXXXXX")
pids=()
declare -A pid
made_etc_netns=

cleanup() {
  local n
  netns_cleanup
  # only the entries this script made: /etc/netns/<its namespace>
  for n in "${all_ns[@]}"; do rm -rf "/etc/netns/$n"; done
  [ -z "$made_etc_netns" ] || rmdir /etc/netns 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

netns_hub "$hub"
# flood multicast (IPv6 neighbour discovery) without waiting for a querier
ip -n "$hub" link set br0 type bridge mcast_snooping 0 2>/dev/null

declare -A v4=( [h1]=10.201.0.1 [h2]=10.201.0.2 [h3]=10.201.0.3 )
declare -A v6=( [h1]=fd00:201::1 [h2]=fd00:201::2 [h3]=fd00:201::3 )
for h in "${hosts[@]}"; do
  netns_join "${ns[$h]}" "$hub" "${hubif[$h]}"
done
rate=${KEEL_NETNS_RATE:-200mbit}
if [ "$rate" != off ]; then
  for h in "${hosts[@]}"; do
    if ! ip netns exec "${ns[$h]}" tc qdisc add dev eth0 root tbf rate "$rate" \
         burst 64kb limit 4mb 2>"$work/err"; then
      echo "note: no rate cap ($(tr '\n' ' ' <"$work/err" | sed 's/ *$//')): runs are shorter, disturbances may come late"
      break
    fi
  done
fi

# Every namespace's hosts file names every host: the TFJob services and the
# Slurm nodes on IPv4, the v6-* names on IPv6 only. The mount point is
# /etc/hosts; without one `ip netns exec` cannot show the file. A file is
# rewritten in place (same inode), so that the running tasks, which see it
# through a bind mount, read the new table, as a cluster DNS's update.
made_etc_netns=
[ -d /etc/netns ] || made_etc_netns=1
[ -e /etc/hosts ] || skip "/etc/hosts does not exist (ip netns exec mounts the namespace's file over it)"
write_hosts() {
  local h
  for h in "${hosts[@]}"; do
    mkdir -p "/etc/netns/${ns[$h]}" || return 1
    cat >"/etc/netns/${ns[$h]}/hosts" <<EOF || return 1
127.0.0.1 localhost
::1 localhost ip6-localhost ip6-loopback
${v4[h1]} tfjob-ps-0.default.svc node01
${v4[h2]} tfjob-chief-0.default.svc node02
${v4[h3]} tfjob-worker-0.default.svc node03
${v6[h1]} v6-ps-0.default.svc
${v6[h2]} v6-chief-0.default.svc
${v6[h3]} v6-worker-0.default.svc
EOF
  done
}
write_hosts || skip "cannot write /etc/netns"
if ! ip netns exec "${ns[h2]}" getent hosts tfjob-ps-0.default.svc >"$work/err" 2>&1 ||
   ! grep -q "${v4[h1]}" "$work/err"; then
  skip "/etc/netns/NS/hosts is not seen inside the namespace ($(tr '\n' ' ' <"$work/err"))"
fi

# set_family 4|6: the namespaces' addresses of one family only
set_family() {
  local h
  for h in "${hosts[@]}"; do
    ip -n "${ns[$h]}" addr flush dev eth0 scope global
    if [ "$1" = 4 ]; then
      ip -n "${ns[$h]}" addr add "${v4[$h]}/24" dev eth0 || return 1
    else
      ip netns exec "${ns[$h]}" sysctl -q -w net.ipv6.conf.eth0.disable_ipv6=0 >/dev/null 2>&1
      ip -n "${ns[$h]}" -6 addr add "${v6[$h]}/64" dev eth0 nodad 2>"$work/err" || return 1
    fi
  done
}

# ---- data --------------------------------------------------------------------
netns_write_data "$work" || exit 1

# write_config RUN: the job's config, its checkpoints in $work/RUN-ckpt.
# Checkpoints every 25 steps bound what a ps restart recomputes.
write_config() {
  cat >"$work/$1.ini" <<EOF
[model]
type = mlp
hidden = 32
[data]
dir = $work
[optimizer]
name = adam
learning_rate = 0.01
[train]
batch_size = 32
max_steps = $MAX_STEPS
seed = 5
threads = 1
model_threads = 1
[checkpoint]
dir = $work/$1-ckpt
save_steps = 25
save_secs = 0
max_to_keep = 0
[hooks]
log_every_steps = 10
summary_every_steps = 0
progress = off
[cluster]
mode = sync
heartbeat_ms = 100
dead_after_ms = 1500
stall_warn_secs = 1
max_wait_secs = 60
EOF
}

# tf_config PREFIX TYPE INDEX: TF_CONFIG as the TFJob operator writes it for
# services PREFIX-{chief,ps,worker}-0.default.svc on port 2222
tf_config() {
  printf '{"cluster":{"chief":["%s-chief-0.default.svc:2222"],"ps":["%s-ps-0.default.svc:2222"],"worker":["%s-worker-0.default.svc:2222"]},"task":{"type":"%s","index":%d},"environment":"cloud"}' \
    "$1" "$1" "$1" "$2" "$3"
}

# slurm_env RANK: what srun -N3 -n3 --resv-ports sets for task RANK (one
# task a node; rank r on node0(r+1))
slurm_env() {
  local r=$1
  printf '%s\n' SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_STEP_ID=0 \
    SLURM_JOB_NODELIST='node[01-03]' SLURM_NODELIST='node[01-03]' \
    SLURM_STEP_NODELIST='node[01-03]' SLURM_JOB_NUM_NODES=3 SLURM_NNODES=3 \
    SLURM_STEP_NUM_NODES=3 SLURM_NTASKS=3 SLURM_NPROCS=3 \
    SLURM_STEP_NUM_TASKS=3 SLURM_TASKS_PER_NODE='1(x3)' \
    SLURM_STEP_TASKS_PER_NODE='1(x3)' SLURM_JOB_CPUS_PER_NODE='2(x3)' \
    SLURM_STEP_RESV_PORTS=12000 SLURM_PROCID="$r" SLURM_NODEID="$r" \
    SLURM_LOCALID=0 SLURM_GTIDS="$r" SLURMD_NODENAME="node0$((r + 1))" \
    SLURM_TOPOLOGY_ADDR="node0$((r + 1))" SLURM_CPUS_ON_NODE=2
}

# task_env SCENARIO HOST: the environment of SCENARIO's task on HOST, a
# line each
task_env() {
  local -A type=( [h1]=ps [h2]=chief [h3]=worker ) rank=( [h1]=0 [h2]=1 [h3]=2 )
  case $1 in
    tfjob) echo "TF_CONFIG=$(tf_config tfjob "${type[$2]}" 0)" ;;
    ipv6)  echo "TF_CONFIG=$(tf_config v6 "${type[$2]}" 0)" ;;
    slurm) slurm_env "${rank[$2]}" ;;
  esac
}

# start RUN SCENARIO HOST: keel train in HOST's namespace; the log is
# appended to (a restart's follows the killed task's)
start() {
  local envs
  mapfile -t envs < <(task_env "$2" "$3")
  ip netns exec "${ns[$3]}" env "${envs[@]}" OPENBLAS_NUM_THREADS=1 \
    "$keel" train "$work/$1.ini" >>"$work/$1-$3.log" 2>&1 &
  pids+=($!)
  pid[$3]=$!
}

now_ms() { date +%s%3N; }

# wait_log FILE REGEX TIMEOUT_S [N]: 0 when N (1) lines match in time
wait_log() {
  local end=$(( $(now_ms) + $3 * 1000 ))
  while [ "$(now_ms)" -lt $end ]; do
    [ "$(grep -c -E "$2" "$1" 2>/dev/null)" -ge "${4:-1}" ] && return 0
    sleep 0.05
  done
  return 1
}

# wait_exit PID TIMEOUT_S: the exit status, or 124 (and SIGKILL) at the deadline
wait_exit() {
  local end=$(( $(now_ms) + $2 * 1000 ))
  while kill -0 "$1" 2>/dev/null; do
    if [ "$(now_ms)" -ge $end ]; then
      kill -KILL "$1" 2>/dev/null; wait "$1" 2>/dev/null; return 124
    fi
    sleep 0.05
  done
  wait "$1"
}

last_step() {   # the newest logged step of a chief's log
  grep -o -E '^step [0-9]+' "$1" 2>/dev/null | tail -n 1 | grep -o -E '[0-9]+' || echo 0
}

# wait_step FILE N TIMEOUT_S: 0 once the chief logged a step >= N in time
wait_step() {
  local end=$(( $(now_ms) + $3 * 1000 ))
  while [ "$(now_ms)" -lt $end ]; do
    [ "$(last_step "$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  return 1
}

link() { ip -n "$hub" link set "${hubif[$1]}" "$2"; }   # link HOST up|down

passed=0 failed=0 skipped=0
fail() {
  local f
  echo "FAIL: $scenario: $*"
  for f in "$work/$run"-*.log; do echo "---- $f"; tail -n 25 "$f"; done
  failed=$((failed + 1))
}
ok() { echo "PASS: $scenario: $*"; passed=$((passed + 1)); }

stop_all() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  pids=()
  pid=()
}

# finish RUN: every task exits 0 in time (the chief within 120 s)
finish() {
  local rc h bad=""
  for h in h2 h1 h3; do
    wait_exit "${pid[$h]}" 120; rc=$?
    [ $rc -eq 0 ] || bad="$bad $h=$rc"
  done
  [ -z "$bad" ] && return 0
  fail "$1: exit codes$bad (124: deadline)"
  return 1
}

final_ckpt() { echo "$work/$1-ckpt/model.ckpt-$MAX_STEPS.h5"; }

# The lines that say a partition was seen: the ps naming a silent replica,
# a replica giving the ps up
cut_seen_re='missing=|ps 0.*(unavailable|not answer|no answer|silent|dead|unreachable)|EUNAVAILABLE'

# run_scenario SCENARIO VICTIM CUT FAMILY ENDPOINT [MOVED]: an undisturbed
# run (its ps serving on ENDPOINT, the address its name resolved to), then
# one whose VICTIM host's task is SIGKILLed after step KILL_AT and
# restarted, and whose CUT host's link is down for CUT_SECS once the
# restarted task is back; both must end with exit 0 and identical final
# checkpoints. MOVED (an IPv4 address): the victim's host comes back on
# that address and its name with it (a Kubernetes pod re-created on
# another IP); the peers must find it by name.
run_scenario() {
  local victim=$2 cut=$3 ep=$5 moved=${6:-} old h t0 kill_step cut_step before after rc
  scenario=$1
  if ! set_family "$4"; then
    echo "SKIP: $scenario: no IPv$4 address can be set here ($(tr '\n' ' ' <"$work/err"| sed 's/ *$//'))"
    skipped=$((skipped + 1)); return
  fi
  write_hosts || { fail "cannot write the hosts files"; return; }
  t0=$(now_ms)

  run=$scenario-ref
  write_config "$run"
  for h in h1 h2 h3; do start "$run" "$scenario" $h; done
  finish "$run" || { stop_all; return; }
  pids=()
  if [ ! -f "$(final_ckpt "$run")" ]; then
    fail "the undisturbed run wrote no $(basename "$(final_ckpt "$run")")"; return
  fi
  if ! grep -q -F "on tcp://$ep " "$work/$run-h1.log"; then
    fail "the ps did not serve on tcp://$ep"; return
  fi

  run=$scenario-hit
  write_config "$run"
  for h in h1 h2 h3; do start "$run" "$scenario" $h; done
  if ! wait_step "$work/$run-h2.log" $KILL_AT 90; then
    fail "the chief never reached step $KILL_AT"; stop_all; return
  fi
  kill -KILL "${pid[$victim]}" 2>/dev/null
  wait "${pid[$victim]}" 2>/dev/null; rc=$?
  kill_step=$(last_step "$work/$run-h2.log")
  if [ $rc -ne 137 ]; then
    fail "$victim's task had ended (status $rc) before the kill at step $kill_step (raise MAX_STEPS or lower KEEL_NETNS_RATE)"
    stop_all; return
  fi
  if [ -n "$moved" ]; then
    old=${v4[$victim]}
    v4[$victim]=$moved
    ip -n "${ns[$victim]}" addr flush dev eth0 scope global
    ip -n "${ns[$victim]}" addr add "$moved/24" dev eth0
    write_hosts
    v4[$victim]=$old      # the next scenario's set_family restores it
  fi
  start "$run" "$scenario" "$victim"
  # back: a worker's second session, or the chief's second INIT of the ps
  if [ "$victim" = h1 ]; then
    wait_log "$work/$run-h2.log" 'cluster ready' 60 2; rc=$?
  else
    wait_log "$work/$run-$victim.log" 'model ready after' 60 2; rc=$?
  fi
  if [ $rc -ne 0 ]; then
    fail "the restarted task on $victim${moved:+ (moved to $moved)} was not back within 60 s"; stop_all; return
  fi
  cut_step=$(last_step "$work/$run-h2.log")
  if [ "$cut_step" -ge $MAX_STEPS ]; then
    fail "the run ended before the link could be cut (raise MAX_STEPS)"; stop_all; return
  fi
  before=$(cat "$work/$run"-*.log | grep -c -E "$cut_seen_re")
  link "$cut" down
  sleep $CUT_SECS
  link "$cut" up
  after=$(cat "$work/$run"-*.log | grep -c -E "$cut_seen_re")
  finish "$run" || { stop_all; return; }
  pids=()
  if [ "$after" -le "$before" ]; then
    fail "no task noticed the $CUT_SECS s cut of $cut's link (no '$cut_seen_re' line)"; return
  fi
  rc=0
  "$keel" ckpt diff "$(final_ckpt "$scenario-ref")" "$(final_ckpt "$run")" >"$work/$run-diff.log" 2>&1 || rc=$?
  if [ $rc -ne 0 ] || ! grep -q 'identical: ' "$work/$run-diff.log"; then
    fail "keel ckpt diff of the final checkpoints exited $rc: $(head -c 600 "$work/$run-diff.log")"; return
  fi
  if [ -n "$moved" ] && ! grep -q -F "on tcp://$moved:" "$work/$run-$victim.log"; then
    fail "the restarted task did not serve on its new address $moved"; return
  fi
  ok "$victim's task killed at step $kill_step and restarted${moved:+ on $moved}, $cut's link cut for ${CUT_SECS} s at step $cut_step; step $MAX_STEPS bitwise equal to the undisturbed run ($(( ($(now_ms) - t0) / 1000 )) s)"
}

for s in $scenarios; do
  case $s in
    tfjob) run_scenario tfjob h1 h3 4 "${v4[h1]}:2222" 10.201.0.11 ;;
    slurm) run_scenario slurm h3 h1 4 "${v4[h1]}:12000" ;;   # SLURM_STEP_RESV_PORTS
    ipv6)  run_scenario ipv6 h3 h2 6 "[${v6[h1]}]:2222" ;;
    *) echo "it_netns_names.sh: unknown scenario '$s' (tfjob, slurm, ipv6)" >&2; exit 2 ;;
  esac
done

echo "netns names: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ] || exit 1
[ $passed -gt 0 ] || exit 77
