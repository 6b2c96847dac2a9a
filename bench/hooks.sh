#!/bin/sh
# hooks.sh - bench/hooks_bench side by side: ROUNDS rounds, each running
# the 6-hook and the 3-hook (MonitoredTrainingSession defaults) set-ups at
# each N_PARAMS, and, with KEEL_BEFORE=path (a hooks_bench built from this
# hooks_bench.c against an older libkeel), the older build right after in
# the same round. Prints every table row tagged with round, who, hooks and
# params and the load average, then medians over rounds. HOOKS_CKPT_SECS=600
# gives the CheckpointSaver the MTS default time-based timer (600 s)
# instead of a step timer that never fires.
# Run from a configured build directory:
#   make bench/hooks_bench && sh ../bench/hooks.sh [ROUNDS] [N_PARAMS...]
set -e
ROUNDS=${1:-3}
shift 2>/dev/null || true
PARAMS=${*:-1024 8192}
BIN=${HOOKS_BENCH:-./bench/hooks_bench}
CK=${HOOKS_CKPT_SECS:-0}
OUT=$(mktemp /tmp/keel_hooks_sh.XXXXXX)
trap 'rm -f "$OUT"' EXIT
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for p in $PARAMS; do
        for extra in 1 0; do
            for who in after before; do
                b=$BIN
                if [ "$who" = before ]; then
                    [ -n "$KEEL_BEFORE" ] || continue
                    b=$KEEL_BEFORE
                fi
                l=$(cut -d' ' -f1 /proc/loadavg)
                "$b" 9 "$p" 1 "$extra" "$CK" | grep '^| [a-z]' | grep -v '^| quantity' |
                    sed "s/^/$r $who $extra $p $l /" | tee -a "$OUT"
            done
        done
    done
    r=$((r + 1))
done
awk '
{ split($0, f, "|"); key = $2 " " ($3 ? 6 : 3) " hooks, " $4 " params:" f[2];
  gsub(/ +$/, "", key); v = f[3] + 0; n[key]++; s[key, n[key]] = v;
  if (!(key in seen)) { seen[key] = 1; order[++k] = key }
  if ($5 > lmax) lmax = $5; if (lmin == "" || $5 < lmin) lmin = $5 }
END {
  printf "\nmedians over rounds (load average %s-%s):\n\n", lmin, lmax
  printf "| who, set-up: quantity | median | min-max |\n|---|---|---|\n"
  for (i = 1; i <= k; i++) {
    key = order[i]; m = n[key]
    for (a = 1; a <= m; a++) x[a] = s[key, a]
    for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++)
      if (x[b] < x[a]) { t = x[a]; x[a] = x[b]; x[b] = t }
    med = m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
    printf "| %s | %.2f | %.2f-%.2f |\n", key, med, x[1], x[m]
  }
}' "$OUT"
