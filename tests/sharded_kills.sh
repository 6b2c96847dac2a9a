#!/bin/sh
# sharded_kills.sh - `make check-long`: it_cluster's SIGKILL between a
# sharded checkpoint's shards and its index, the chief and a ps in turn,
# KEEL_SHARD_KILL_TRIALS times (default 200; `make check` runs 2). Every
# trial checks `keel ckpt verify`, that the state file's newest entry is a
# whole checkpoint and that the job restarted resumes from it.
: "${KEEL_BUILDDIR:?run through make check-long}"
KEEL_SHARD_KILL_TRIALS=${KEEL_SHARD_KILL_TRIALS:-200}
export KEEL_SHARD_KILL_TRIALS
CK_RUN_SUITE=it_cluster CK_RUN_CASE=sharded_kill
export CK_RUN_SUITE CK_RUN_CASE
exec "$KEEL_BUILDDIR/tests/it_cluster"
