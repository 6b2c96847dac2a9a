# tests/: test-only programs and scripts that belong to no single module.

# The chaos soak (`make check-long`; KEEL_SOAK_MINUTES, default 30).
LONG_TESTS += tests/soak_chaos.sh
EXTRA_DIST += tests/soak_chaos.sh
