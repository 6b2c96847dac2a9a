#!/bin/sh
# ckpt_adversarial.sh - every checkpoint reader against damaged and hostile
# checkpoints, one of each kind (tests/ckpt_adversarial.py).
exec "${PYTHON3:-python3}" "$KEEL_SRCDIR/tests/ckpt_adversarial.py"
