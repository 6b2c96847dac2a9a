#!/bin/sh
# ckpt_vds.sh - a sharded checkpoint over partitioned variables read by h5py
# alone and by keel, and its hostile remappings refused (tests/ckpt_vds.py).
exec "${PYTHON3:-python3}" "$KEEL_SRCDIR/tests/ckpt_vds.py"
