# netns_common.sh - the network-namespace set-up tests/it_netns.sh and
# tests/it_netns_names.sh share (bash, sourced): the build directory, the
# requirements (root, iproute2, python3), a hub namespace with a bridge,
# a namespace joined to it by a veth pair, the synthetic MNIST-format
# data, and the removal of every process and namespace. The sourcing
# script defines skip (prints "SKIP: reason", exits 77) first; the
# functions use its globals pids (the processes it started), all_ns (the
# namespaces it made) and work (its temporary directory).
# shellcheck shell=bash disable=SC2034,SC2154

# netns_builddir SCRIPT BUILDDIR: keel's path in $keel, or the usage line
# and exit 2 when BUILDDIR has no keel built in it
netns_builddir() {
  if [ -z "$2" ] || [ ! -x "$2/keel" ]; then
    echo "$1: usage: $1 BUILDDIR (with keel built in it)" >&2
    exit 2
  fi
  keel=$(cd "$2" && pwd)/keel
}

# netns_require: SKIP unless root with ip and python3
netns_require() {
  [ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces (running as uid $(id -u))"
  command -v ip >/dev/null 2>&1 || skip "ip (iproute2) is not installed"
  command -v python3 >/dev/null 2>&1 || skip "python3 is needed to write the test data"
}

# netns_cleanup: kill the processes in pids and any left in the
# namespaces of all_ns, delete those namespaces; with KEEL_NETNS_KEEP set,
# copy the logs of $work there. $work itself is the caller's to remove.
netns_cleanup() {
  local p n
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  for n in "${all_ns[@]}"; do
    # the processes inside are ours; a namespace with a process left in it
    # is still deleted from the list (the kernel frees it when they end)
    ip netns pids "$n" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "$n" 2>/dev/null
  done
  if [ -n "${KEEL_NETNS_KEEP:-}" ]; then   # keep the logs for a look
    mkdir -p "$KEEL_NETNS_KEEP" && cp "$work"/*.log "$KEEL_NETNS_KEEP"/ 2>/dev/null
  fi
}

# netns_hub HUB: the namespace HUB with the bridge br0 up (SKIP when the
# kernel cannot make either)
netns_hub() {
  if ! ip netns add "$1" 2>"$work/err"; then
    skip "cannot make a network namespace: $(tr '\n' ' ' <"$work/err")"
  fi
  if ! ip -n "$1" link add br0 type bridge 2>"$work/err"; then
    skip "cannot make a bridge in a namespace: $(tr '\n' ' ' <"$work/err")"
  fi
  ip -n "$1" link set lo up
  ip -n "$1" link set br0 up
}

# netns_join NS HUB HUBIF: the namespace NS, lo up, its eth0 (up, no
# address) the peer of HUBIF on HUB's bridge; exits 1 when it cannot
netns_join() {
  ip netns add "$1" || exit 1
  ip -n "$1" link set lo up
  ip link add "$3" netns "$2" type veth peer name eth0 netns "$1" || exit 1
  ip -n "$2" link set "$3" master br0
  ip -n "$2" link set "$3" up
  ip -n "$1" link set eth0 up
}

# netns_write_data DIR: a small MNIST-format set (640 train, 200 test
# images of 10 classes, each a bright square at its own place over noise)
netns_write_data() {
  python3 - "$1" <<'EOF'
import struct, sys
d = sys.argv[1]
for prefix, n, seed in (("train", 640, 1), ("t10k", 200, 2)):
    s = seed
    img = bytearray(struct.pack(">IIII", 0x803, n, 28, 28))
    lab = bytearray(struct.pack(">II", 0x801, n))
    for i in range(n):
        c = i % 10
        x = bytearray(784)
        for k in range(784):
            s = (s * 1664525 + 1013904223) & 0xffffffff
            x[k] = s >> 27
        r0, c0 = 2 + (c // 5) * 12, 2 + (c % 5) * 5
        for r in range(r0, r0 + 6):
            for q in range(c0, min(c0 + 6, 28)):
                x[r * 28 + q] = 230
        img += x
        lab.append(c)
    open(f"{d}/{prefix}-images-idx3-ubyte", "wb").write(img)
    open(f"{d}/{prefix}-labels-idx1-ubyte", "wb").write(lab)
EOF
}
