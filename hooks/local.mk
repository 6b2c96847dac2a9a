# hooks/: the standard session-run hooks, TensorBoard event files, traces.
libkeel_core_la_SOURCES += hooks/hooks_int.h hooks/basic.c hooks/ckpt_hook.c \
	hooks/summary.c
pkginclude_HEADERS += include/keel/hooks.h
libkeel_core_la_SOURCES += hooks/events_int.h hooks/crc32c.c \
	hooks/events.c hooks/trace.c
pkginclude_HEADERS += include/keel/events.h
EXTRA_DIST += tests/read_tfevents.py tests/read_trace.py

if HAVE_CHECK
SUITES += tests/check_events
tests_check_events_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/hooks
endif

# Benchmark (built by `make check`, never run by it): see bench/README.md.
check_PROGRAMS += bench/bench_events
bench_bench_events_SOURCES = bench/bench_events.c
bench_bench_events_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/hooks $(ZLIB_CFLAGS)
bench_bench_events_LDADD = libkeel_core.la $(ZLIB_LIBS)

if HAVE_CHECK
SUITES += tests/check_hooks
tests_check_hooks_SOURCES = tests/check_hooks.c tests/fake_ckpt.c \
	tests/fake_ckpt.h
endif
