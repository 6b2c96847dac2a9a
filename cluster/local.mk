# cluster/: cluster spec, wire protocol, parameter servers, workers.
libkeel_core_la_SOURCES += cluster/cluster_int.h cluster/spec.c cluster/slurm.c \
	cluster/wire.c cluster/security.c \
	cluster/ps_int.h cluster/ps.c cluster/ps_auth.c cluster/ps_values.c cluster/ps_shard.c \
	cluster/ps_push.c cluster/ps_sparse.c cluster/ps_aggregate.c cluster/ps_members.c \
	cluster/ps_request.c \
	cluster/defaults.h cluster/heartbeat.c \
	cluster/allreduce_mpi.c cluster/algorithm.c \
	cluster/spec_int.h cluster/tfconfig.c cluster/detect.c \
	cluster/role_int.h cluster/options.c cluster/placement.c cluster/partition.c \
	cluster/ps_task.c cluster/address.c \
	cluster/worker_int.h cluster/worker.c cluster/worker_call.c \
	cluster/worker_pull.c cluster/worker_save.c cluster/worker_push.c cluster/worker_sparse.c \
	cluster/worker_part.c
pkginclude_HEADERS += include/keel/cluster.h include/keel/distributed.h
if HAVE_CHECK
SUITES += tests/check_cluster
tests_check_cluster_SOURCES = tests/check_cluster.c tests/ps_skel.c \
	tests/ps_skel.h
tests_check_cluster_CFLAGS = $(TEST_CFLAGS) $(ZMQ_CFLAGS) $(JSONC_CFLAGS)
tests_check_cluster_LDADD = $(TEST_LIBS) $(ZMQ_LIBS)
endif

# bench/cluster_bench: wire protocol push+pull throughput (built by
# `make check`, run by bench/cluster_bench.sh; not installed).
check_PROGRAMS += bench/cluster_bench
bench_cluster_bench_SOURCES = bench/cluster_bench.c tests/ps_skel.c \
	tests/ps_skel.h
bench_cluster_bench_CFLAGS = $(AM_CFLAGS) $(ZMQ_CFLAGS)
bench_cluster_bench_LDADD = libkeel_core.la $(ZMQ_LIBS)

# bench/ps_mean: the sync ps's weighted mean of the replicas' gradients,
# its scalar and kernel forms and the float kernels' sum, timed in one run
# (built by `make check`; not installed).
check_PROGRAMS += bench/ps_mean
bench_ps_mean_SOURCES = bench/ps_mean.c $(BENCH_UTIL)
bench_ps_mean_LDADD = libkeel_core.la

# it_security: a raw ZeroMQ peer against a running ps, in each security
# mode (libzmq only for the peer; libkeel_core only to derive a password).
if HAVE_CHECK
SUITES += tests/it_security
tests_it_security_CFLAGS = $(TEST_CFLAGS) $(ZMQ_CFLAGS)
tests_it_security_LDADD = $(TEST_LIBS) $(ZMQ_LIBS)
endif

# it_cluster: ps / chief / worker processes of the keel CLI on 127.0.0.1,
# and of tests/cluster_child (a user's own program of one cluster task).
if HAVE_CHECK
SUITES += tests/it_cluster
endif
check_PROGRAMS += tests/cluster_child
tests_cluster_child_SOURCES = tests/cluster_child.c tests/linefit.h
tests_cluster_child_LDADD = libkeel_core.la

# check_algorithms: the update rules by hand, then each on real sockets.
if HAVE_CHECK
SUITES += tests/check_algorithms
tests_check_algorithms_CFLAGS = $(TEST_CFLAGS) $(ZMQ_CFLAGS)
tests_check_algorithms_LDADD = $(TEST_LIBS) $(ZMQ_LIBS)
endif

# Every rule to >= 84 % on Fashion-MNIST (minutes per rule): check-long.
LONG_TESTS += bench/algorithms_accuracy.sh
EXTRA_DIST += bench/algorithms_accuracy.sh
