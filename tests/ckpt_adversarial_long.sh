#!/bin/sh
# ckpt_adversarial_long.sh - the adversarial checkpoint campaign of
# `make check-long`: every mutation with several seeds, keel train resuming
# from each (tests/ckpt_adversarial.py --long).
exec "${PYTHON3:-python3}" "$KEEL_SRCDIR/tests/ckpt_adversarial.py" --long
