#!/bin/sh
# algorithm_kills.sh - `make check-long`: every update rule
# (docs/algorithms.md) survives a worker SIGKILL and then a ps SIGKILL in
# the middle of a `keel launch` run of the Fashion-MNIST MLP (1 ps, the
# chief, 1 worker), and finishes; so does distributed K-FAC (docs/kfac.md)
# with every role's task killed in turn. For each rule the script kills
# worker.0 once the chief is past a quarter of the run, waits for the
# launcher to restart it, kills ps.0 once the chief is past a checkpoint
# taken after that, and waits for the job to end. The K-FAC rules run more
# tasks and kill each role before the ps: kfac_chief (chief mode, 1 ps + 3
# replicas) worker.0, then the chief; kfac_roles (roles mode, 1 ps + 5
# replicas: gradient workers chief, worker.0, worker.1, covariance worker
# worker.2, inverse worker worker.3) worker.3, worker.2, worker.0, then the
# chief, each once the previous one's restart is seen and the chief is past
# the next tenth of the run. A rule passes when:
#   - the launcher exits 0, having restarted each killed task once;
#   - the chief rolled back to a checkpoint ("restarting from step M") and
#     the new ps was initialized at step M with every slot tensor the
#     checkpoints hold (the rule's per-worker state: DOWNPOUR's Adagrad
#     sums, ADAG's pull centers), not re-created;
#   - DOWNPOUR's Adagrad sums in the final checkpoint are, element by
#     element, at least those of the checkpoint the ps was rebuilt from
#     (they only grow: sums re-created empty would not be);
#   - the final checkpoint is at the last step (a local-step rule may stop
#     up to window - 1 steps short, docs/algorithms.md), every checkpoint
#     verifies and `keel eval` of the final one works (K-FAC: with a
#     test accuracy of at least 0.8).
# One line per rule and a summary; exit 1 if any rule failed. Not part of
# `make check` (about 30 s per rule on 2 cores).
#
#   tests/algorithm_kills.sh [RULE...]  (default: all 13 and the 2 K-FAC)
#
# Environment: KEEL_BUILDDIR (the build tree, set by make), KEEL_KILLS_DATA
# (/usr/share/datasets/fashion-mnist), KEEL_KILLS_STEPS (last step, 5999:
# no multiple of a window, so local-step rules stop with steps unsent),
# KEEL_KILLS_RULE_SECS (deadline of one rule's run, 180), KEEL_KILLS_KEEP=1
# keeps the temporary directory (it is always kept on failure),
# KEEL_KILLS_KFAC_STEPS (last step of the K-FAC rules, 1999). Exit 77:
# skipped (no data).
set -u

: "${KEEL_BUILDDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
KEEL=$KEEL_BUILDDIR/keel
DATA=${KEEL_KILLS_DATA:-/usr/share/datasets/fashion-mnist}
LAST=${KEEL_KILLS_STEPS:-5999}
RULE_SECS=${KEEL_KILLS_RULE_SECS:-180}
. "$(dirname "$0")/common.sh"
KFAC_LAST=${KEEL_KILLS_KFAC_STEPS:-1999}
RULES=${*:-"$KEEL_ALL_RULES kfac_chief kfac_roles"}

say() { printf 'kills: %s\n' "$*"; }

keel_require_fashion_mnist "$DATA"
for n in "$LAST" "$KFAC_LAST"; do
    case $n in
        ''|*[!0-9]*) say "KEEL_KILLS_STEPS / KEEL_KILLS_KFAC_STEPS '$n' is not a step count"; exit 99;;
    esac
    [ "$n" -ge 500 ] || { say "KEEL_KILLS_STEPS and KEEL_KILLS_KFAC_STEPS must be at least 500"; exit 99; }
done
command -v setsid >/dev/null || { say "no setsid (util-linux)"; exit 99; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/keel-kills.XXXXXX") || exit 99
FAILED=0
LPID=
LOG=
cleanup() {
    stop_launcher
    if [ "$FAILED" = 0 ] && [ "${KEEL_KILLS_KEEP:-0}" != 1 ]; then
        rm -rf "$TMP"
    else
        say "kept $TMP (per rule: <rule>.log, <rule>/logs/)"
    fi
}
# The launcher runs in a process group of its own (setsid); each task in
# one of its own, and they die with the launcher (PDEATHSIG). On a
# deadline or an interrupt the launcher's group and every task group it
# started are killed and the launcher is reaped.
stop_launcher() {
    [ -n "$LPID" ] || return 0
    if kill -0 "$LPID" 2>/dev/null; then
        kill -KILL -- "-$LPID" 2>/dev/null || kill -KILL "$LPID" 2>/dev/null
        for p in $(sed -n 's/^launch | \(re\)\{0,1\}started [^ ]* (pid \([0-9]*\)).*/\2/p' "$LOG"); do
            kill -KILL -- "-$p" 2>/dev/null
        done
    fi
    wait "$LPID" 2>/dev/null
    LPID=
}
trap cleanup EXIT
trap 'FAILED=1; exit 1' INT TERM

# The rules' rates as in bench/algorithms_accuracy.sh (so that each
# trains); WINDOW is how many local steps a replica may leave unsent when
# it stops (docs/algorithms.md, "Returning workers and restarts");
# WORKERS the workers besides the chief, KILLS the tasks killed in turn
# before ps.0, R_LAST the rule's last step, MIN_ACC the least test
# accuracy of its final checkpoint, R_SECS its deadline (K-FAC: 3 times
# KEEL_KILLS_RULE_SECS).
rule_args() {
    WORKERS=1 KILLS=worker.0 R_LAST=$LAST MIN_ACC= R_SECS=$RULE_SECS
    case $1 in
        agn|adag|sagn) EXTRA="-s algorithm.window=4 -s algorithm.learning_rate=0.2"; WINDOW=4 ;;
        downpour) EXTRA="-s algorithm.learning_rate=0.05 -s algorithm.ps_learning_rate=0.01"; WINDOW=5 ;;
        downpour_easy) EXTRA="-s algorithm.learning_rate=0.05 -s algorithm.ps_learning_rate=0.05"; WINDOW=5 ;;
        async|hogwild) EXTRA="-s optimizer.learning_rate=0.2"; WINDOW=1 ;;
        dynsgd) EXTRA="-s algorithm.learning_rate=0.05"; WINDOW=5 ;;
        model_averaging) EXTRA="-s algorithm.learning_rate=0.05"; WINDOW=10 ;;
        aeasgd|aeamsgd) EXTRA="-s algorithm.learning_rate=0.05"; WINDOW=32 ;;
        easgd) EXTRA="-s algorithm.learning_rate=0.05"; WINDOW=1 ;;
        sync) EXTRA=; WINDOW=1 ;;
        kfac_chief|kfac_roles)
            EXTRA="-s optimizer.name=kfac -s optimizer.learning_rate=0.0003 -s checkpoint.save_steps=$((KFAC_LAST / 5)) -s hooks.log_every_steps=10"
            WINDOW=1 R_LAST=$KFAC_LAST MIN_ACC=0.8 R_SECS=$((RULE_SECS * 3))
            if [ "$1" = kfac_chief ]; then
                EXTRA="$EXTRA -s kfac.distributed=chief" WORKERS=2 KILLS="worker.0 chief"
            else
                # 105 examples a step: 21 per replica, 63 per step's gradient
                EXTRA="$EXTRA -s kfac.distributed=roles -s train.batch_size=105"
                WORKERS=4 KILLS="worker.3 worker.2 worker.0 chief"
            fi ;;
        *) return 1 ;;
    esac
}

# The chief's progress: the highest step it logged or checkpointed.
progress() {
    sed -n 's/^chief | \(step\|saved checkpoint for step\) \([0-9][0-9]*\).*/\2/p' "$LOG" |
        sort -n | tail -1
}
count() { grep -c -- "$1" "$LOG"; }

# until_ok WHAT CMD...: run CMD every 0.1 s until it succeeds (0), the
# launcher exits (1) or the rule's deadline passes (2).
until_ok() {
    what=$1; shift
    while :; do
        "$@" && return 0
        if ! kill -0 "$LPID" 2>/dev/null; then
            "$@" && return 0
            WHY="the job ended before $what"; return 1
        fi
        if [ "$(date +%s)" -ge "$DEADLINE" ]; then
            WHY="no $what within ${R_SECS} s"; return 2
        fi
        sleep 0.1
    done
}
past() { p=$(progress); [ -n "$p" ] && [ "$p" -ge "$1" ]; }
seen() { [ "$(count "$1")" -ge "${2:-1}" ]; }
# a "saved checkpoint" line after the first line matching $1
saved_after() {
    awk -v pat="$1" 'index($0, pat) { on = 1 }
        on && /^chief \| saved checkpoint for step / { found = 1 }
        END { exit !found }' "$LOG"
}

# Slot datasets of a checkpoint ("[slot NAME]" in `keel ckpt show`).
slots_in() { "$KEEL" ckpt show "$1" | grep -c '\[slot '; }

# DOWNPOUR: every Adagrad sum of checkpoint $2 >= its value in $1.
sums_grew() {
    for v in $("$KEEL" ckpt show "$1" | sed -n 's/^  \([^ ]*\) *\[slot downpour_accumulator\].*/\1/p'); do
        "$KEEL" ckpt show --all --slot downpour_accumulator "$1" "$v" | sed 1d > "$TMP/a"
        "$KEEL" ckpt show --all --slot downpour_accumulator "$2" "$v" | sed 1d > "$TMP/b"
        [ -s "$TMP/a" ] && [ "$(wc -l < "$TMP/a")" = "$(wc -l < "$TMP/b")" ] || return 1
        paste "$TMP/a" "$TMP/b" | awk '$2 + 0 < $1 + 0 { bad++ } END { exit bad > 0 }' ||
            return 1
    done
    return 0
}

# K-FAC roles: after the rollback to step $1, the chief's staleness lines
# (every 10 steps) at step S >= $1 + 30 show inverses newer than the
# rollback (average age < S - $1): the inverse worker went on with the
# replayed steps rather than waiting for the step of its last op before
# the ps's loss. BADLINE: the first line that does not.
inverses_after() {
    BADLINE=$(awk -v r="$1" '
        index($0, "restarting from step ") { on = 1; next }
        on && /^chief \| K-FAC: step [0-9]+ preconditioned with inverses / {
            s = $5; a = $9
            if (s >= r + 30 && a >= s - r) { print; exit }
        }' "$LOG")
    [ -z "$BADLINE" ]
}

{ keel_rules_mlp_ini "$DATA"; cat <<EOF; } > "$TMP/mlp.ini"
[checkpoint]
dir = $TMP/unused
save_steps = $((LAST / 5))
save_secs = 0
max_to_keep = 0
[hooks]
log_every_steps = 50
summary_every_steps = 0
[cluster]
dead_after_ms = 120000
EOF

say "$(date -u '+%H:%M:%S') last step $LAST (K-FAC $KFAC_LAST); worker.0 killed past a quarter of it, ps.0 past 11/20 (after a checkpoint); $TMP"
printf '%-16s %-12s %-9s %-10s %-9s %-6s %s\n' rule kills restored final accuracy secs result
N_OK=0 N_BAD=0 BAD_RULES=
for r in $RULES; do
    if ! rule_args "$r"; then
        say "unknown rule '$r'"; FAILED=1; N_BAD=$((N_BAD + 1)); continue
    fi
    LOG=$TMP/$r.log
    WHY=
    T0=$(date +%s)
    DEADLINE=$((T0 + R_SECS))
    # shellcheck disable=SC2086
    ALG=$r
    case $r in kfac_*) ALG=sync ;; esac
    OUTPUT_DIR=$TMP/$r setsid "$KEEL" launch "$TMP/mlp.ini" --ps 1 \
        --workers "$WORKERS" --no-status --max-restarts 2 \
        -s algorithm.name="$ALG" -s train.max_steps="$R_LAST" $EXTRA \
        > "$LOG" 2>&1 < /dev/null &
    LPID=$!
    RC=
    # the kills before the ps's: the k-th of n past step k/(2n+2) of the run
    NK=$(echo "$KILLS" | wc -w)
    K=0
    for t in $KILLS; do
        K=$((K + 1))
        AT=$((R_LAST * K / (2 * NK + 2)))
        if until_ok "step $AT" past "$AT"; then
            WPID=$(keel_launch_pid "$LOG" "$t")
            kill -KILL "$WPID" 2>/dev/null || WHY="$t (pid $WPID) was gone before its kill"
        fi
        [ -z "$WHY" ] && until_ok "restart of $t" seen "^launch | restarted $t "
        [ -z "$WHY" ] || break
        LASTKILL=$t
    done
    KILL_PS=$((R_LAST * 11 / 20))
    [ -z "$WHY" ] && until_ok "step $KILL_PS" past "$KILL_PS"
    [ -z "$WHY" ] && until_ok "checkpoint after the $LASTKILL's restart" \
        saved_after "launch | restarted $LASTKILL "
    # K-FAC: the ps dies 60 steps past that checkpoint, so that the
    # cluster replays steps after its rollback (see inverses_after)
    case $r in kfac_*)
        CK=$(sed -n 's/^chief | saved checkpoint for step \([0-9]*\):.*/\1/p' "$LOG" | tail -1)
        [ -z "$WHY" ] && until_ok "step $((CK + 60))" past $((CK + 60)) ;;
    esac
    NRB=$(count "restarting from step ")
    if [ -z "$WHY" ]; then
        PPID_=$(keel_launch_pid "$LOG" ps.0)
        kill -KILL "$PPID_" 2>/dev/null || WHY="ps.0 (pid $PPID_) was gone before its kill"
    fi
    [ -z "$WHY" ] && until_ok "restart of ps.0" seen "^launch | restarted ps.0 "
    [ -z "$WHY" ] && until_ok "rollback after the ps's loss" seen "restarting from step " $((NRB + 1))
    [ -z "$WHY" ] && until_ok "end of the job" sh -c "! kill -0 $LPID 2>/dev/null"
    if [ -n "$WHY" ]; then
        stop_launcher
    else
        wait "$LPID"
        RC=$?
        LPID=
    fi
    SECS=$(($(date +%s) - T0))
    KW= KWS=
    for t in $KILLS; do
        n=$(count "^launch | restarted $t ")
        KWS="$KWS${KWS:+,}$n"
        [ "$n" = 1 ] || KW="$KW $t $n"
    done
    KP=$(count "^launch | restarted ps.0 ")
    RESTORED=$(sed -n 's/.*restarting from step \([0-9]*\):.*/\1/p' "$LOG" | tail -1)
    FINAL=$(sed -n 's/^model_checkpoint_path: "model\.ckpt-\([0-9]*\)\.h5"$/\1/p' \
        "$TMP/$r/checkpoint" 2>/dev/null)
    ACC=
    if [ -z "$WHY" ] && [ "$RC" != 0 ]; then
        WHY="keel launch exited $RC: $(grep -E '^(launch|chief) \| .*(keel:|failed|gave up)' "$LOG" | tail -1)"
    fi
    if [ -z "$WHY" ] && { [ -n "$KW" ] || [ "$KP" != 1 ]; }; then
        WHY="restarts:${KW:- each killed worker 1}, ps.0 $KP (want one each: a task failed besides the kills)"
    fi
    if [ -z "$WHY" ] && [ -z "$FINAL" ]; then
        WHY="no final checkpoint in $TMP/$r/checkpoint"
    fi
    if [ -z "$WHY" ] && { [ "$FINAL" -lt $((R_LAST - WINDOW + 1)) ] ||
                          [ "$FINAL" -gt $((R_LAST + 2 * WINDOW)) ]; }; then
        WHY="final checkpoint at step $FINAL, not $R_LAST (window $WINDOW)"
    fi
    if [ -z "$WHY" ] && ! "$KEEL" ckpt verify "$TMP/$r" > "$TMP/$r.verify" 2>&1; then
        WHY="keel ckpt verify: $(grep -v '^ok' "$TMP/$r.verify" | head -1)"
    fi
    # the new ps was initialized at the rolled-back step, with the slots
    if [ -z "$WHY" ]; then
        RESTORED_CKPT=$TMP/$r/model.ckpt-$RESTORED.h5
        INIT=$(grep "^ps.0 | ps 0: initialized by the chief " "$LOG" | tail -1)
        WANT_SLOTS=$(slots_in "$TMP/$r/model.ckpt-$FINAL.h5")
        if [ ! -f "$RESTORED_CKPT" ]; then
            WHY="rolled back to step $RESTORED, but there is no $RESTORED_CKPT"
        elif [ "$(count "^ps.0 | ps 0: initialized by the chief ")" -lt 2 ]; then
            WHY="the restarted ps logged no initialization"
        elif ! printf '%s\n' "$INIT" | grep -q " at step $RESTORED: [0-9]* variables, $WANT_SLOTS slot tensors"; then
            WHY="the restarted ps was not given step $RESTORED with $WANT_SLOTS slot tensors: $INIT"
        fi
        case $r in
            downpour|adag)
                [ -n "$WHY" ] || [ "$WANT_SLOTS" -gt 0 ] ||
                    WHY="no $r slots in the final checkpoint" ;;
        esac
        if [ -z "$WHY" ] && [ "$r" = downpour ] &&
           ! sums_grew "$RESTORED_CKPT" "$TMP/$r/model.ckpt-$FINAL.h5"; then
            WHY="Adagrad sums of step $FINAL below those of step $RESTORED: re-created, not restored"
        fi
    fi
    if [ -z "$WHY" ]; then
        ACC=$("$KEEL" eval "$TMP/$r" --json 2>"$TMP/$r.eval" |
              sed -n 's/.*"accuracy": *\([0-9.]*\).*/\1/p')
        [ -n "$ACC" ] || WHY="keel eval $TMP/$r failed: $(head -1 "$TMP/$r.eval")"
    fi
    if [ -z "$WHY" ] && [ "$r" = kfac_roles ] && ! inverses_after "$RESTORED"; then
        WHY="after the rollback to step $RESTORED no inverses were published: $BADLINE"
    fi
    if [ -z "$WHY" ] && [ -n "$MIN_ACC" ] &&
       [ "$(echo "$ACC < $MIN_ACC" | bc -l)" = 1 ]; then
        WHY="test accuracy $ACC below $MIN_ACC"
    fi
    if [ -z "$WHY" ]; then
        RESULT=ok N_OK=$((N_OK + 1))
    else
        RESULT="FAIL: $WHY" N_BAD=$((N_BAD + 1)) FAILED=1 BAD_RULES="$BAD_RULES $r"
    fi
    printf '%-16s %-12s %-9s %-10s %-9s %-6s %s\n' "$r" "w$KWS,ps$KP" \
        "${RESTORED:--}" "${FINAL:--}/$R_LAST" "${ACC:--}" "$SECS" "$RESULT"
done
say "$(date -u '+%H:%M:%S') $N_OK passed, $N_BAD failed${BAD_RULES:+:$BAD_RULES}"
exit "$FAILED"
