# session/: Scaffold, SessionManager, MonitoredSession, Supervisor, Coordinator.
libkeel_core_la_SOURCES += session/session_int.h session/step_pool.h \
	session/chain.c \
	session/coord.c session/manager.c session/monitored.c \
	session/training.c session/supervisor.c session/signal.c
pkginclude_HEADERS += include/keel/session.h

check_PROGRAMS += tests/session_child
tests_session_child_SOURCES = tests/session_child.c
tests_session_child_LDADD = libkeel_core.la

check_PROGRAMS += bench/hooks_bench
bench_hooks_bench_SOURCES = bench/hooks_bench.c bench/bench_util.c bench/bench_util.h
bench_hooks_bench_LDADD = libkeel_core.la

if HAVE_CHECK
check_PROGRAMS += tests/check_session
TESTS += tests/check_session
tests_check_session_SOURCES = tests/check_session.c tests/fake_ckpt.c \
	tests/fake_ckpt.h
tests_check_session_CFLAGS = $(TEST_CFLAGS)
tests_check_session_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/it_sigterm
TESTS += tests/it_sigterm
tests_it_sigterm_SOURCES = tests/it_sigterm.c
tests_it_sigterm_CFLAGS = $(TEST_CFLAGS)
tests_it_sigterm_LDADD = $(TEST_LIBS)
endif
