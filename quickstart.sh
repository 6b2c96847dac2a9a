#!/usr/bin/env bash
# quickstart.sh - set up keel on Debian 12 and run it.
#   ./quickstart.sh          install missing packages, build, run the main job
#   ./quickstart.sh check    install missing packages, build, run every test
# Idempotent: it installs, configures and builds only what is missing or stale.
# check also runs the suite on an ASan+UBSan build (in _build-san/; set
# KEEL_SANITIZE=0 to skip it) and, when this machine allows network
# namespaces (root, iproute2), the multi-host suite (make check-netns).
# Its closing line counts every test: "check: N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")"
top=$(pwd)

mode=${1:-run}
case "$mode" in
  run|check) ;;
  -h|--help)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 0 ;;
  *)
    echo "keel: quickstart.sh: unknown mode '$mode'; use no argument (run the main job) or 'check' (run the tests)" >&2
    exit 2 ;;
esac

say() { printf '== %s\n' "$*"; }

# ---- 1. Debian packages ---------------------------------------------------
# Build tools, the libraries keel links, the test framework, Open MPI and
# Slurm (tests/it_slurm.sh starts its own daemons; Debian's services are not
# needed), the Python packages the checkpoint-format test uses, and the
# seeds' dataset.
packages=(
  build-essential autoconf automake libtool pkg-config
  libhdf5-dev libopenblas-dev libzmq3-dev libsodium-dev libinih-dev zlib1g-dev
  libxxhash-dev libjson-c-dev libisal-dev check iproute2
  libopenmpi-dev openmpi-bin
  slurmctld slurmd slurm-client munge
  python3 python3-h5py python3-numpy python3-onnx
  dataset-fashion-mnist
)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "keel: quickstart.sh: missing Debian packages: ${missing[*]}" >&2
    echo "keel: install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 2
  fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- 2. Build (only what is stale) ------------------------------------------
jobs=$(nproc 2>/dev/null || echo 2)
build() {   # build DIR [configure args...]
  local dir=$1; shift
  if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt configure ]; then
    say "autogen.sh"
    ./autogen.sh >/dev/null 2>&1 || ./autogen.sh
  fi
  mkdir -p "$dir"
  if [ ! -f "$dir/Makefile" ] || [ configure -nt "$dir/config.status" ]; then
    say "configure $* (in $dir)"
    (cd "$dir" && "$top/configure" --quiet "$@")
  fi
  say "make (in $dir)"
  make -C "$dir" -j"$jobs" --no-print-directory >/dev/null
}
build _build --enable-werror

# ---- 3. Run -------------------------------------------------------------------
# Prints Check's per-suite summary lines and, per build, "N passed, N
# failed, N skipped". A program that skipped (exit 77: automake's SKIP)
# counts as skipped, never as passed.
run_suite() {   # run_suite DIR
  local dir=$1 status=0
  make -C "$dir" -j"$jobs" --no-print-directory check >"$dir/check.out" 2>&1 || status=$?
  grep -h -E '^[0-9]+%: Checks: |^[A-Za-z_ -]*: [0-9]+ passed, [0-9]+ failed' "$dir"/tests/*.log 2>/dev/null || true
  if [ $status -ne 0 ]; then
    cat "$dir/check.out"
    for log in "$dir"/tests/*.log; do
      if grep -q -E '^(FAIL|ERROR)' "${log%.log}.trs" 2>/dev/null; then
        echo "---- $log"; tail -n 60 "$log"
      fi
    done
  fi
  # Count test cases: Check's summary line, or a script's own "N passed, N
  # failed" line; a program that printed neither counts as one.
  local pass=0 fail=0 skip=0 log trs line n f e
  for log in "$dir"/tests/*.log; do
    trs=${log%.log}.trs
    [ -f "$trs" ] || continue
    if grep -q '^:test-result: SKIP' "$trs"; then
      echo "SKIP: ${log##*/}: $(grep -h -m1 -E '^SKIP' "$log" || echo 'no reason given')"
      skip=$((skip + 1))
      continue
    fi
    if line=$(grep -h -E '^[0-9]+%: Checks: ' "$log" | tail -n 1) && [ -n "$line" ]; then
      n=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$line")
      f=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$line")
      e=$(sed -E 's/.*Errors: ([0-9]+).*/\1/' <<<"$line")
      # a Check test that cannot run here returns early after printing
      # "SKIP <test>: <why>": skipped, not passed
      local s; s=$(grep -c -E '^SKIP ' "$log" || true)
      grep -h -E '^SKIP ' "$log" || true
      pass=$((pass + n - f - e - s)); fail=$((fail + f + e)); skip=$((skip + s))
    elif line=$(grep -h -E '^[A-Za-z_ -]*: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1) && [ -n "$line" ]; then
      n=$(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line")
      f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
      pass=$((pass + n)); fail=$((fail + f))
      if [[ $line =~ ([0-9]+)\ skipped ]]; then skip=$((skip + BASH_REMATCH[1])); fi
    elif grep -q '^:test-result: PASS' "$trs"; then
      pass=$((pass + 1))
    else
      fail=$((fail + 1))
    fi
    if grep -q -E '^:test-result: (FAIL|ERROR)' "$trs" && [ "$fail" -eq 0 ]; then
      fail=1
    fi
  done
  # make itself failed (a build error, a missing file): that is a failure too
  if [ $status -ne 0 ] && [ $fail -eq 0 ]; then fail=1; fi
  echo "$dir: $pass passed, $fail failed, $skip skipped"
  total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
  total_skip=$((total_skip + skip))
  return $status
}

# The network-namespace suite: its own "netns: N passed, N failed, N
# skipped" line, or one SKIP line with the reason.
run_netns() {   # run_netns DIR
  local dir=$1 status=0 line
  make -C "$dir" --no-print-directory check-netns >"$dir/check-netns.out" 2>&1 || status=$?
  grep -h -E '^(PASS|FAIL|SKIP)' "$dir/check-netns.out" || true
  line=$(grep -h -E '^netns: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$dir/check-netns.out" | tail -n 1 || true)
  if [ -n "$line" ]; then
    echo "$line"
    total_pass=$((total_pass + $(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line")))
    total_fail=$((total_fail + $(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")))
    total_skip=$((total_skip + $(sed -E 's/.* ([0-9]+) skipped$/\1/' <<<"$line")))
  elif [ $status -eq 0 ] && grep -q -E '^SKIP' "$dir/check-netns.out"; then
    total_skip=$((total_skip + 1))      # the whole suite, reason above
  else
    total_fail=$((total_fail + 1))
    [ $status -ne 0 ] || status=1
  fi
  if [ $status -ne 0 ]; then tail -n 80 "$dir/check-netns.out"; fi
  return $status
}

total_pass=0 total_fail=0 total_skip=0
if [ "$mode" = check ]; then
  rc=0
  run_suite _build || rc=$?
  # The packagers' route: install into a scratch DESTDIR and build an
  # outside program with pkg-config alone.
  for script in smoke.sh missing_dep.sh; do
    if tests/install/$script _build 2>"_build/$script.err"; then
      total_pass=$((total_pass + 1))
    else
      cat "_build/$script.err"; total_fail=$((total_fail + 1)); rc=1
    fi
  done
  run_netns _build || rc=$?
  if [ "${KEEL_SANITIZE:-1}" != 0 ]; then
    build _build-san --enable-werror --enable-sanitizers
    run_suite _build-san || rc=$?
  else
    echo "SKIP: the ASan+UBSan suite (KEEL_SANITIZE=0)"
    total_skip=$((total_skip + 1))
  fi
  [ $rc -eq 0 ] && say "all tests passed" || say "tests FAILED"
  echo "check: $total_pass passed, $total_fail failed, $total_skip skipped"
  exit $rc
fi

# The main job: the small CNN on Fashion-MNIST trained
# by a local cluster — 1 parameter server and 2 training replicas (the chief
# and one worker) in sync mode — while chaos SIGKILLs a worker now and then
# to show the recovery in the log; then the newest checkpoint is evaluated
# in one process with no cluster. Outputs go to $OUTPUT_DIR if set, else
# ./fashion_mnist_output; rerunning resumes, or just evaluates a finished run.
keel=_build/keel
say "keel launch examples/fashion_mnist.ini --ps 1 --workers 1 --chaos 7,40 --chaos-targets worker"
# One model thread per replica: two replicas already fill the two cores.
"$keel" launch examples/fashion_mnist.ini --ps 1 --workers 1 \
  --chaos 7,40 --chaos-targets worker -s train.model_threads=1
say "keel eval examples/fashion_mnist.ini"
"$keel" eval examples/fashion_mnist.ini
