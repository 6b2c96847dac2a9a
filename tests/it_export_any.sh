#!/bin/sh
# it_export_any.sh - keel export of any checkpoint, checked by
# tests/it_export_any.py with h5py, numpy and onnx.
exec "${PYTHON3:-python3}" "$KEEL_SRCDIR/tests/it_export_any.py"
