#!/bin/sh
# it_export.sh - keel export / predict / eval CKPT.h5 and the per-epoch
# workflow, checked by tests/it_export.py with h5py, numpy and onnx.
exec "${PYTHON3:-python3}" "$KEEL_SRCDIR/tests/it_export.py"
