/* mpirun.h - the Open MPI options keel's multi_worker_mirrored ranks run
 * with on one machine: `keel launch --strategy multi_worker_mirrored`
 * starts its ranks with them, and tests/it_mpi runs mpirun with them. */
#ifndef KEEL_MPIRUN_H
#define KEEL_MPIRUN_H

/* The most arguments mpirun_local_options writes. */
#define MPIRUN_LOCAL_OPTIONS_MAX 8

/* mpirun's options for ranks on this machine alone: more ranks than cores
 * allowed, shared memory between them and the loopback interface only (no
 * network); as root, Open MPI's own consent flag. Writes them (static
 * strings) at argv[0..]; returns how many, at most
 * MPIRUN_LOCAL_OPTIONS_MAX. */
int mpirun_local_options(char **argv);

#endif
