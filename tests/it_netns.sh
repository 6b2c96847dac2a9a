#!/usr/bin/env bash
# it_netns.sh - hosts that are really apart: the ps, the chief and a worker
# of one `keel train` cluster, each in its own network namespace, joined by
# veth pairs to a bridge in a fourth namespace, on private test addresses
# (10.200.0.0/24) that exist only inside the namespaces this script makes.
# Links are cut and restored (ip link set down/up, tc netem) while training:
#   partition   sync mode: a partitioned worker is noticed by the ps (named
#               as missing) and by the worker (the ps unanswered past
#               cluster.dead_after_ms); the cluster waits, the worker rejoins
#               when the link returns, training ends at max_steps with
#               applied == 2 x global_step (no gradient applied twice).
#   async       async mode: the chief keeps training while the worker is
#               cut off; the worker rejoins; applied == global step.
#   netem       loss and delay on the worker's link: training finishes
#               with exact counts (SKIP when the kernel lacks sch_netem).
# Every wait has a deadline; every namespace and process is removed on exit,
# failure or signal. Needs root and iproute2; exits 77 with "SKIP: reason"
# otherwise. Usage: it_netns.sh BUILDDIR (or KEEL_BUILDDIR set);
# KEEL_NETNS_KEEP=DIR keeps every task's log there.
set -u

# shellcheck source=tests/netns_common.sh
. "$(dirname "$0")/netns_common.sh"
netns_builddir it_netns.sh "${1:-${KEEL_BUILDDIR:-}}"

skip() { echo "SKIP: netns: $*"; exit 77; }
netns_require

tag=keeltest-$$
hub=$tag-hub
ns_ps=$tag-ps ns_chief=$tag-chief ns_w1=$tag-w1
all_ns=("$hub" "$ns_ps" "$ns_chief" "$ns_w1")
work=$(mktemp -d "${TMPDIR:-/tmp}/keel-netns-XXXXXX")
pids=()

cleanup() {
  netns_cleanup
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

netns_hub "$hub"

# addr_of NS: each task's private address; port 7000 in every namespace.
declare -A addr=( ["$ns_ps"]=10.200.0.1 ["$ns_chief"]=10.200.0.2 ["$ns_w1"]=10.200.0.3 )
declare -A hubif=( ["$ns_ps"]=v-ps ["$ns_chief"]=v-chief ["$ns_w1"]=v-w1 )
for ns in "$ns_ps" "$ns_chief" "$ns_w1"; do
  netns_join "$ns" "$hub" "${hubif[$ns]}"
  ip -n "$ns" addr add "${addr[$ns]}/24" dev eth0
done

# ---- data and config ---------------------------------------------------------
netns_write_data "$work" || exit 1

# write_config NAME MODE MAX_STEPS [LOG_EVERY]
write_config() {
  cat >"$work/$1.ini" <<EOF
[model]
type = softmax
[data]
dir = $work
[optimizer]
name = sgd
learning_rate = 0.05
[train]
batch_size = 32
max_steps = $3
seed = 3
[checkpoint]
dir = $work/$1-ckpt
save_steps = 0
save_secs = 0
[hooks]
log_every_steps = ${4:-1}
summary_every_steps = 0
progress = off
[cluster]
mode = $2
heartbeat_ms = 100
dead_after_ms = 2000
stall_warn_secs = 1
max_wait_secs = 120
EOF
}

tf_config() {   # tf_config TYPE INDEX
  printf '{"cluster": {"ps": ["%s:7000"], "chief": ["%s:7000"], "worker": ["%s:7000"]}, "task": {"type": "%s", "index": %d}}' \
    "${addr[$ns_ps]}" "${addr[$ns_chief]}" "${addr[$ns_w1]}" "$1" "$2"
}

# start NAME NS TYPE INDEX: keel train inside NS, log in $work/NAME-TYPE.log
start() {
  ip netns exec "$2" env TF_CONFIG="$(tf_config "$3" "$4")" OPENBLAS_NUM_THREADS=1 \
    "$keel" train "$work/$1.ini" >"$work/$1-$3.log" 2>&1 &
  pids+=($!)
  eval "pid_$3=$!"
}

now_ms() { date +%s%3N; }

# wait_log FILE REGEX TIMEOUT_S: 0 when a line matches before the deadline
wait_log() {
  local end=$(( $(now_ms) + $3 * 1000 ))
  while [ "$(now_ms)" -lt $end ]; do
    grep -q -E "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# wait_count FILE REGEX N TIMEOUT_S: 0 when N lines match before the deadline
wait_count() {
  local end=$(( $(now_ms) + $4 * 1000 ))
  while [ "$(now_ms)" -lt $end ]; do
    [ "$(grep -c -E "$2" "$1" 2>/dev/null)" -ge "$3" ] && return 0
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

last_step() {   # the chief's newest logged step
  grep -o -E 'step [0-9]+' "$1" 2>/dev/null | tail -n 1 | grep -o -E '[0-9]+' || echo 0
}

passed=0 failed=0 skipped=0
fail() { echo "FAIL: $scenario: $*"; for f in "$work"/"$scenario"-*.log; do echo "---- $f"; tail -n 30 "$f"; done; failed=$((failed + 1)); }
ok() { echo "PASS: $scenario: $*"; passed=$((passed + 1)); }

stop_all() {   # whatever is left of a scenario's tasks
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  pids=()
}

link() {   # link NS up|down: the task's cable at the bridge
  ip -n "$hub" link set "${hubif[$1]}" "$2"
}

# run_cluster SCENARIO MODE MAX_STEPS [LOG_EVERY]: start ps, chief, worker
run_cluster() {
  write_config "$1" "$2" "$3" "${4:-1}"
  start "$1" "$ns_ps" ps 0
  start "$1" "$ns_chief" chief 0
  start "$1" "$ns_w1" worker 0
}

# cut_worker_when FILE REGEX WHAT: once a line of FILE matches (within
# 90 s), cut the worker's link and set t_cut to the time of the cut; when
# none does, fail with WHAT (status 1)
cut_worker_when() {
  if ! wait_log "$1" "$2" 90; then
    fail "$3"; return 1
  fi
  link "$ns_w1" down
  t_cut=$(now_ms)
}

# A worker's line saying its ps no longer answers
ps_lost_re='ps 0.*(unavailable|not answer|no answer|silent|dead|unreachable)|EUNAVAILABLE'

# finish_cluster SCENARIO REPLICAS MAX_STEPS: every task exits 0 in time,
# the ps's summary has step == MAX_STEPS (any step when MAX_STEPS is "-")
# and applied == REPLICAS x step
finish_cluster() {
  local rc_c rc_w rc_p line step applied
  wait_exit "$pid_chief" 180; rc_c=$?
  wait_exit "$pid_worker" 60; rc_w=$?
  wait_exit "$pid_ps" 60; rc_p=$?
  if [ $rc_c -ne 0 ] || [ $rc_w -ne 0 ] || [ $rc_p -ne 0 ]; then
    fail "exit codes chief=$rc_c worker=$rc_w ps=$rc_p (124: deadline)"; return 1
  fi
  line=$(grep -o -E 'done at step [0-9]+: gradients applied [0-9]+' "$work/$1-ps.log" | tail -n 1)
  step=$(sed -E 's/done at step ([0-9]+):.*/\1/' <<<"$line")
  applied=$(sed -E 's/.*applied ([0-9]+)/\1/' <<<"$line")
  if [ -z "$line" ] || { [ "$3" != - ] && [ "$step" != "$3" ]; } ||
     [ "$applied" != $(( $2 * step )) ]; then
    fail "ps summary '$line': want step $3 and applied $2 x step"; return 1
  fi
  echo "  $1: ps: $line"
  return 0
}

# ---- 1. partition a worker in sync mode ---------------------------------------
# The run has no reachable end (10^7 steps): it is ended by SIGTERM to the
# chief (a stop request: every task exits 0) after the worker has rejoined.
scenario=partition
run_cluster partition sync 10000000 10
if cut_worker_when "$work/partition-chief.log" '^step [0-9]*[1-9][0-9]0 ' \
     "the cluster never reached step 100"; then
  # The ps names the silent worker (every stall_warn_secs, 1 s); the worker
  # gives the ps up after dead_after_ms (2 s). Deadlines leave room for a
  # loaded machine.
  if ! wait_log "$work/partition-ps.log" 'missing=worker 0' 30; then
    fail "the ps never named the partitioned worker as missing"
  elif ! wait_log "$work/partition-worker.log" "$ps_lost_re" 30; then
    fail "the worker never noticed the partition (no 'ps 0 ... unavailable' line)"
  else
    noticed=$(( $(now_ms) - t_cut ))
    s1=$(last_step "$work/partition-chief.log")
    sleep 1
    s2=$(last_step "$work/partition-chief.log")
    link "$ns_w1" up
    if [ "$s2" -gt $(( s1 + 10 )) ]; then
      fail "sync training went on without the worker (step $s1 -> $s2)"
    elif ! wait_count "$work/partition-worker.log" 'model ready after' 2 90; then
      fail "the worker did not rejoin within 90 s of the link's return"
    elif ! wait_log "$work/partition-chief.log" "^step $(( (s2 / 10 + 20) * 10 )) " 90; then
      fail "training did not resume within 90 s of the link's return (step $s2)"
    else
      kill -TERM "$pid_chief"
      if finish_cluster partition 2 -; then
        ok "the worker noticed after ${noticed} ms (dead_after_ms 2000); the cluster waited at step $s2 and went on after the link returned"
      fi
    fi
  fi
fi
stop_all

# ---- 2. async: the rest goes on -------------------------------------------------
# The run has no reachable end (10^7 steps); the chief is stopped by SIGTERM
# (a stop request: every task exits 0) once the worker has rejoined.
scenario=async
run_cluster async async 10000000 10
if cut_worker_when "$work/async-worker.log" 'model ready after 1 attempt' \
     "the worker never started training"; then
  wait_log "$work/async-worker.log" "$ps_lost_re" 30
  noticed=$?
  noticed_ms=$(( $(now_ms) - t_cut ))
  s1=$(last_step "$work/async-chief.log")
  wait_log "$work/async-chief.log" "step $(( (s1 / 10 + 10) * 10 ))([^0-9]|$)" 30
  went_on=$?
  link "$ns_w1" up
  # the worker's session is re-created: its second readiness
  wait_count "$work/async-worker.log" 'model ready after' 2 90
  rejoined=$?
  [ $rejoined -ne 0 ] || wait_log "$work/async-chief.log" "step $(( (s1 / 10 + 30) * 10 ))([^0-9]|$)" 30
  kill -TERM "$pid_chief"
  if [ $noticed -ne 0 ]; then
    fail "the worker never noticed the partition"
  elif [ $went_on -ne 0 ]; then
    fail "the chief did not go on while the worker was cut off (stuck after step $s1)"
  elif [ $rejoined -ne 0 ]; then
    fail "the worker did not train again within 90 s of the link's return"
  elif finish_cluster async 1 -; then
    # async: every applied push is one global step
    ok "the worker noticed after ${noticed_ms} ms; the chief went on past step $s1 meanwhile; the worker rejoined; SIGTERM ended all three with exit 0"
  fi
fi
stop_all

# ---- 3. loss and delay ---------------------------------------------------------------
scenario=netem
if ! ip netns exec "$ns_w1" tc qdisc add dev eth0 root netem delay 20ms 2>"$work/err"; then
  echo "SKIP: netem: tc netem is not available here ($(tr '\n' ' ' <"$work/err"| sed 's/ *$//'); the kernel lacks sch_netem)"
  skipped=$((skipped + 1))
else
  ip netns exec "$ns_w1" tc qdisc change dev eth0 root netem delay 20ms 10ms loss 5%
  run_cluster netem sync 60
  if finish_cluster netem 2 60; then
    ok "60 sync steps over a link with 20 ms delay and 5% loss"
  fi
  ip netns exec "$ns_w1" tc qdisc del dev eth0 root 2>/dev/null
fi

echo "netns: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
