# tests/: test-only programs and scripts that belong to no single module.

# it_determinism: bitwise-identical final checkpoints for reruns and for
# kill-and-resume of the ps, a worker and the chief under keel launch.
if HAVE_CHECK
SUITES += tests/it_determinism
endif

# it_partition: partitioned variables over 3 ps train bitwise equal to
# whole ones; the checkpoint holds each variable whole.
if HAVE_CHECK
SUITES += tests/it_partition
endif

# it_elastic: an elastic sync job goes 4 -> 2 -> 3 replicas (kills, a
# restart of the whole job, a worker of a new index started by hand) and
# ends bitwise equal to one process, with one ps and with two (ps 0
# decides, ps 1 follows); the chief's log names each change.
if HAVE_CHECK
SUITES += tests/it_elastic
endif

# The chaos soak (`make check-long`; KEEL_SOAK_MINUTES, default 30).
LONG_TESTS += tests/soak_chaos.sh
EXTRA_DIST += tests/soak_chaos.sh tests/common.sh

# Every update rule survives a worker and a ps SIGKILL (`make check-long`,
# docs/algorithms.md "Kills").
LONG_TESTS += tests/algorithm_kills.sh
EXTRA_DIST += tests/algorithm_kills.sh

# A SIGKILL of the chief or a ps between a sharded checkpoint's shards and
# its index, hundreds of times (`make check-long`; it_cluster runs 2).
LONG_TESTS += tests/sharded_kills.sh
EXTRA_DIST += tests/sharded_kills.sh

# The command line the independent readers (tests/read_tfevents.py,
# tests/read_trace.py) share.
EXTRA_DIST += tests/read_common.py

# What the Python integration tests (it_export.py, it_export_any.py,
# ckpt_adversarial.py) share: running keel, test data, independent readers.
EXTRA_DIST += tests/py_common.py

# The layering check: no file includes a header of, or calls a function
# of, a higher layer or a sibling (the table in docs/architecture.md);
# layering_plant.sh plants an upward call and include and sees it fail.
TESTS += tests/layering.py tests/layering_plant.sh
EXTRA_DIST += tests/layering.py tests/layering_plant.sh

# keel/keel.h on its own compiles and declares nothing of the trainer app
# (keel/app.h) or the launcher (keel/launch.h).
TESTS += tests/header_keel.sh
EXTRA_DIST += tests/header_keel.sh tests/header_keel.c

# The multi-host suite (`make check-netns`): ps, chief and worker in their
# own network namespaces, links cut and restored. Needs root and iproute2;
# prints "SKIP: reason" and succeeds otherwise. Not part of `make check`
# (quickstart.sh check and CI run it).
EXTRA_DIST += tests/it_netns.sh tests/netns_common.sh
check-netns: all
	@$(abs_top_srcdir)/tests/it_netns.sh '$(abs_top_builddir)'; rc=$$?; \
	if test $$rc = 77; then exit 0; fi; exit $$rc
.PHONY: check-netns

# Multi-host jobs by name: a TFJob operator's TF_CONFIG, srun's Slurm
# variables and an IPv6-only job across three namespaces, each host named
# in its own /etc/netns/NS/hosts; a task SIGKILLed and restarted and a
# link cut in each, the final checkpoint bitwise equal to an undisturbed
# run's. About 1.5 minutes; needs root and iproute2, SKIP (77) otherwise.
# bench/netns.sh measures the same kind of job across namespaces against
# loopback.
TESTS += tests/it_netns_names.sh
EXTRA_DIST += tests/it_netns_names.sh bench/netns.sh

# keel under a real one-node Slurm of its own (munged, slurmctld, slurmd on
# free ports, every file in a temporary directory): docs/deploy.md's sbatch
# script on reserved ports, srun -n 3 and srun --mpi=pmix
# multi_worker_mirrored, each bitwise equal to one process. Needs root and
# slurmctld, slurmd, slurm-client, munge; SKIP (77) otherwise.
TESTS += tests/it_slurm.sh
EXTRA_DIST += tests/it_slurm.sh

# No dates, machine loads or lock paths of one run in the documentation or
# in comments: those belong in bench/README.md (HACKING.md, "Style").
TESTS += tests/docs_facts.py
EXTRA_DIST += tests/docs_facts.py

# docs/deploy.md's TFJob manifest parses, and the TF_CONFIG the training
# operator writes into each of its pods passes `keel config check`.
TESTS += tests/deploy_manifest.py
EXTRA_DIST += tests/deploy_manifest.py

# The adversarial checkpoint suite: tests/ckpt_mutate.py makes truncated,
# bit-flipped, swapped, huge, external, linked, virtual checkpoints and
# damaged state files; every reader must end with a `keel:` error or a
# correct result under a memory limit, and lose no checkpoint. One of each
# in `make check`, the seeded campaign in `make check-long`.
TESTS += tests/ckpt_adversarial.sh
LONG_TESTS += tests/ckpt_adversarial_long.sh
EXTRA_DIST += tests/ckpt_adversarial.sh tests/ckpt_adversarial_long.sh \
	tests/ckpt_adversarial.py tests/ckpt_mutate.py

# A sharded checkpoint over partitioned variables: the index's virtual
# datasets read whole by h5py alone, and a virtual source outside the
# index's shards refused.
TESTS += tests/ckpt_vds.sh
EXTRA_DIST += tests/ckpt_vds.sh tests/ckpt_vds.py
