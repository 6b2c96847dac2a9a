#!/usr/bin/env bash
# it_slurm.sh - keel under a real Slurm: a private one-node cluster
# (munged with its own key and socket, slurmctld and slurmd with a
# slurm.conf of their own, every port, socket, state and log file in a
# mkdtemp directory, no system daemon involved) runs
#   sbatch   docs/deploy.md's batch script, as written there but for the
#            output root and the config path, submitted with --nodes=1
#            --ntasks-per-node=3: srun --resv-ports=3 starts rank 0 the ps,
#            ranks 1 and 2 the workers (rank 1, worker 0, the chief) from
#            the variables srun sets; the ps serves on a reserved port
#            (SLURM_STEP_RESV_PORTS, slurm.conf's MpiParams=ports);
#   srun     `srun -n 3 keel train` on ports from cluster.port_base;
#   pmix     `srun --mpi=pmix -n 2 keel train -s
#            train.strategy=multi_worker_mirrored`: the ranks from PMIx;
# a small sync MLP job on Fashion-MNIST. Each run's every task exits 0
# (srun's exit code; the batch job's, which is its srun's, from scontrol)
# and its final checkpoint is bitwise equal (`keel ckpt diff`) to the same
# job run in one process.
# The daemons, the job's tasks and the directory are removed on exit,
# failure or signal; every wait has a deadline.
# Needs root (slurmd runs the tasks as their user), slurmctld, slurmd,
# munged, mungekey, sbatch, srun, sinfo and the Fashion-MNIST package;
# exits 77 with "SKIP: reason" otherwise. A pmix run that Slurm cannot
# start (no PMIx plugin) is a SKIP line of its own.
# Usage: it_slurm.sh BUILDDIR (or KEEL_BUILDDIR set); KEEL_SLURM_KEEP=DIR
# keeps the daemons' and the tasks' logs there.
set -u

builddir=${1:-${KEEL_BUILDDIR:-}}
srcdir=${KEEL_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
if [ -z "$builddir" ] || [ ! -x "$builddir/keel" ]; then
  echo "it_slurm.sh: usage: it_slurm.sh BUILDDIR (with keel built in it)" >&2
  exit 2
fi
builddir=$(cd "$builddir" && pwd)
keel=$builddir/keel
data=${KEEL_SLURM_DATA:-/usr/share/datasets/fashion-mnist}
MAX_STEPS=20

skip() { echo "SKIP: slurm: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root to run slurmd (running as uid $(id -u))"
for c in slurmctld slurmd munged mungekey sbatch srun sinfo scancel squeue python3; do
  command -v "$c" >/dev/null 2>&1 ||
    skip "$c is not installed (apt-get install slurmctld slurmd slurm-client munge)"
done
[ -r "$data/train-images-idx3-ubyte.gz" ] || [ -r "$data/train-images-idx3-ubyte" ] ||
  skip "no Fashion-MNIST in $data (apt-get install dataset-fashion-mnist)"
[ -r "$srcdir/docs/deploy.md" ] || skip "no docs/deploy.md under $srcdir (set KEEL_SRCDIR)"

# Nothing of the caller's Slurm (a job this test runs inside, a cluster's
# config) reaches the private cluster or the one-process runs.
for v in $(env | sed -n 's/^\(SLURM[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset TF_CONFIG OUTPUT_DIR KEEL_CLUSTER_TOKEN || true

t0=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/keel-slurm-XXXXXX") || exit 99
# munged wants every directory above its socket searchable by all
chmod 711 "$work"
export SLURM_CONF=$work/slurm.conf
daemons=()          # munged, slurmctld, slurmd: children of this shell
children=()         # the one-process runs: children of this shell too

now_ms() { date +%s%3N; }

cleanup() {
  local p end
  if [ ${#daemons[@]} -ge 2 ]; then
    # the job's tasks run under slurmstepd, not under this shell: end
    # them through the controller, then wait (with a deadline) for them
    scancel --quiet --full "$(squeue -h -o %i 2>/dev/null)" >/dev/null 2>&1
    end=$(( $(now_ms) + 10000 ))
    while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ "$(now_ms)" -lt $end ]; do
      sleep 0.2
    done
  fi
  for p in "${children[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do
    kill -TERM "${daemons[$i]}" 2>/dev/null
  done
  end=$(( $(now_ms) + 10000 ))
  for p in "${daemons[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ "$(now_ms)" -lt $end ]; do sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  if [ -n "${KEEL_SLURM_KEEP:-}" ]; then
    mkdir -p "$KEEL_SLURM_KEEP" && cp "$work"/*.log "$KEEL_SLURM_KEEP"/ 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

show_logs() {
  local f
  for f in "$work"/*.log; do [ -e "$f" ] && { echo "---- $f"; tail -n 20 "$f"; }; done
}
die() { echo "FAIL: slurm: $*"; show_logs; exit 1; }

# ---- ports -------------------------------------------------------------------
# free_ports N: the first port of N consecutive free TCP ports (bound and
# released here; nothing else on the machine is expected to take them in
# the seconds before the daemons bind them)
free_ports() {
  python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randrange(20000, 60000 - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            s.bind(("", p))
            socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    sys.exit(0)
sys.exit(1)
EOF
}
base=$(free_ports 13) || die "no 13 free consecutive ports"
ctld_port=$base                   # slurmctld
slurmd_port=$((base + 1))         # slurmd
resv_lo=$((base + 2))             # MpiParams=ports: what srun --resv-ports hands out
resv_hi=$((base + 9))
keel_port=$((base + 10))          # cluster.port_base of the srun run (3 tasks)

# ---- the job -------------------------------------------------------------------
# Sync training of a dense model gives one process's bits for any replica
# count when its gradients are folded in micro-batches (docs/determinism.md).
cat >"$work/job.ini" <<EOF
[model]
type = mlp
hidden = 32
[data]
dir = $data
[optimizer]
name = adam
learning_rate = 0.01
[train]
batch_size = 64
micro_batch = 16
max_steps = $MAX_STEPS
seed = 5
threads = 1
model_threads = 1
[checkpoint]
dir = $work/unused
save_steps = 0
save_secs = 0
[hooks]
log_every_steps = 5
summary_every_steps = 0
progress = off
[cluster]
mode = sync
max_wait_secs = 30
EOF
final=model.ckpt-$MAX_STEPS.h5

# one RUN [keel train options]: start the job in one process, into
# $work/RUN, in the background (it runs while the daemons start)
declare -A ref_pid
one() {
  local run=$1; shift
  OUTPUT_DIR=$work/$run "$keel" train "$work/job.ini" "$@" >"$work/$run.log" 2>&1 &
  ref_pid[$run]=$!
  children+=($!)
}
# one_done RUN: the one-process run RUN exited 0 in time and wrote its
# final checkpoint
one_done() {
  local end=$(( $(now_ms) + 120000 )) rc
  while kill -0 "${ref_pid[$1]}" 2>/dev/null && [ "$(now_ms)" -lt $end ]; do sleep 0.1; done
  kill -0 "${ref_pid[$1]}" 2>/dev/null && die "one process ($1) still runs after 120 s"
  wait "${ref_pid[$1]}"; rc=$?
  [ $rc -eq 0 ] || die "one process ($1) exited $rc"
  [ -f "$work/$1/$final" ] || die "one process ($1) wrote no $final"
}

# same RUN REF: RUN's final checkpoint is bitwise REF's
same() {
  [ -f "$work/$1/$final" ] || die "$1: no $final in $work/$1 ($(ls "$work/$1" 2>&1 | tr '\n' ' '))"
  "$keel" ckpt diff "$work/$2/$final" "$work/$1/$final" >"$work/$1-diff.log" 2>&1 ||
    die "$1: keel ckpt diff against $2 exited $?: $(head -c 600 "$work/$1-diff.log")"
  echo "PASS: slurm: $1: every task exited 0, final checkpoint equals one process's ($(( $(date +%s) - t0 )) s in)"
}

one ref -s cluster.num_ps=1
# Open MPI's plugins keep buffers to the end and are unloaded by
# MPI_Finalize, so no suppression can name their frames: under a sanitizer
# build every MPI process here runs without leak detection (as in it_mpi)
mpi_asan="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
ASAN_OPTIONS=$mpi_asan one ref-mwm -s train.strategy=multi_worker_mirrored -s train.micro_batch=0

# ---- munge -------------------------------------------------------------------
mungekey --create --keyfile="$work/munge.key" >"$work/mungekey.log" 2>&1 ||
  die "mungekey --create failed: $(cat "$work/mungekey.log")"
chmod 600 "$work/munge.key"
munged -F --socket="$work/munge.socket" --key-file="$work/munge.key" \
  --pid-file="$work/munged.pid" --log-file="$work/munged.log" \
  --seed-file="$work/munged.seed" >"$work/munged.out.log" 2>&1 &
daemons+=($!)
end=$(( $(now_ms) + 10000 ))
until [ -S "$work/munge.socket" ]; do
  kill -0 "${daemons[0]}" 2>/dev/null || die "munged exited: $(cat "$work/munged.out.log")"
  [ "$(now_ms)" -lt $end ] || die "munged made no socket in 10 s"
  sleep 0.05
done

# ---- slurm.conf ----------------------------------------------------------------
# The node offers at least 4 CPUs (config_overrides: more than a small
# machine has), so that 3 tasks fit on one node as they would on a real
# one; the tasks share the cores.
host=$(hostname -s)
cpus=$(nproc)
[ "$cpus" -ge 4 ] || cpus=4
cat >"$SLURM_CONF" <<EOF
ClusterName=keeltest
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$work/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MpiParams=ports=$resv_lo-$resv_hi
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
InactiveLimit=0
KillWait=2
NodeName=$host CPUs=$cpus RealMemory=256 State=UNKNOWN
PartitionName=keel Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
: >"$work/plugstack.conf"
mkdir -p "$work/state" "$work/spool"

slurmctld -D -i >"$work/slurmctld.out.log" 2>&1 &
daemons+=($!)
slurmd -D >"$work/slurmd.out.log" 2>&1 &
daemons+=($!)
end=$(( $(now_ms) + 30000 ))
until [ "$(sinfo -h -N -n "$host" -o %t 2>/dev/null)" = idle ]; do
  for p in "${daemons[@]}"; do
    kill -0 "$p" 2>/dev/null || die "a daemon (pid $p) exited before the node was idle"
  done
  [ "$(now_ms)" -lt $end ] ||
    die "node $host not idle in 30 s (sinfo: $(sinfo -h -N -o '%n %t %E' 2>&1))"
  sleep 0.2
done
echo "slurm: node $host idle ($(( $(date +%s) - t0 )) s in)"


# docs/deploy.md's batch script: the block after its "Slurm batch script"
# marker, with the shared output root and the config path of this test
awk '/not run by tests\/docs_commands.sh: a Slurm batch script/ { m = 1; next }
     m == 1 && /^```sh/ { m = 2; next }
     m == 2 && /^```/ { exit }
     m == 2 { print }' "$srcdir/docs/deploy.md" >"$work/doc.sbatch"
grep -q '^srun ' "$work/doc.sbatch" && grep -q 'keel train job.ini' "$work/doc.sbatch" ||
  die "docs/deploy.md: no batch script with srun and 'keel train job.ini' after its Slurm batch script marker"
sed -e "s|/shared/runs/|$work/sbatch-|" -e "s|keel train job.ini|keel train $work/job.ini|" \
  "$work/doc.sbatch" >"$work/job.sbatch"

# sbatch, then the job's state and exit code (the batch script's, whose
# last command is srun: nonzero when any task is) from the controller,
# polled (sbatch --wait polls at seconds apart)
PATH=$builddir:$PATH sbatch --parsable --nodes=1 --ntasks-per-node=3 \
  --output="$work/sbatch-job.log" --chdir="$work" "$work/job.sbatch" \
  >"$work/sbatch.log" 2>&1 || die "sbatch of docs/deploy.md's script exited $?"
jobid=$(sed -n 's/^\([0-9][0-9]*\).*/\1/p' "$work/sbatch.log" | head -n 1)
[ -n "$jobid" ] || die "sbatch printed no job id: $(cat "$work/sbatch.log")"
end=$(( $(now_ms) + 120000 ))
while :; do
  state=$(scontrol show job "$jobid" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  case $state in PENDING|CONFIGURING|RUNNING|COMPLETING|"") ;; *) break ;; esac
  [ "$(now_ms)" -lt $end ] || die "job $jobid not done in 120 s (state ${state:-unknown})"
  sleep 0.2
done
exitcode=$(scontrol show job "$jobid" | sed -n 's/.*[^a-zA-Z]ExitCode=\([0-9:]*\).*/\1/p')
[ "$state" = COMPLETED ] && [ "$exitcode" = 0:0 ] ||
  die "job $jobid of docs/deploy.md's script ended $state, exit code $exitcode"
mv "$work/sbatch-$jobid" "$work/sbatch" || die "the job wrote no $work/sbatch-$jobid"
# the ps serves on a port srun reserved (SLURM_STEP_RESV_PORTS), not on
# cluster.port_base
ps_port=$(sed -n 's/^ps 0: serving .* on tcp:\/\/[^ ]*:\([0-9]*\).*/\1/p' "$work/sbatch-job.log" | head -n 1)
[ -n "$ps_port" ] || die "the job's log names no port the ps serves on"
[ "$ps_port" -ge "$resv_lo" ] && [ "$ps_port" -le $resv_hi ] ||
  die "the ps serves on port $ps_port, not on one of the reserved $resv_lo-$resv_hi (srun --resv-ports reserved none?)"
one_done ref
same sbatch ref

# srun as a user runs it from a login shell: three tasks, ports from
# cluster.port_base, the token in the environment srun passes on
KEEL_CLUSTER_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n') \
OUTPUT_DIR=$work/srun timeout 120 srun -n 3 "$keel" train \
  "$work/job.ini" -s cluster.num_ps=1 -s cluster.port_base="$keel_port" \
  >"$work/srun.log" 2>&1
rc=$?
[ $rc -eq 0 ] || die "srun -n 3 keel train exited $rc"
same srun ref

# multi_worker_mirrored: the ranks from Slurm's PMIx plugin
if ! srun --mpi=list 2>&1 | grep -q pmix; then
  echo "SKIP: slurm: pmix: srun --mpi=list names no pmix plugin"
else
  ASAN_OPTIONS=$mpi_asan \
  OUTPUT_DIR=$work/pmix timeout 120 srun --mpi=pmix -n 2 "$keel" \
    train "$work/job.ini" -s train.strategy=multi_worker_mirrored -s train.micro_batch=0 \
    >"$work/pmix.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || die "srun --mpi=pmix -n 2 keel train exited $rc"
  grep -q 'collective: rank 1 of 2' "$work/pmix.log" ||
    die "srun --mpi=pmix: no 'collective: rank 1 of 2' in the tasks' output"
  one_done ref-mwm
  same pmix ref-mwm
fi
exit 0
