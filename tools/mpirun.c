/* mpirun.c - the mpirun options of ranks on one machine (mpirun.h). */
#include <config.h>

#include <assert.h>
#include <unistd.h>

#include "mpirun.h"

int
mpirun_local_options(char **argv)
{
    int k = 0;
    if (getuid() == 0)
        argv[k++] = "--allow-run-as-root";
    argv[k++] = "--oversubscribe";
    argv[k++] = "--mca";
    argv[k++] = "btl";
    argv[k++] = "self,vader";
    argv[k++] = "--mca";
    argv[k++] = "oob_tcp_if_include";
    argv[k++] = "lo";
    assert(k <= MPIRUN_LOCAL_OPTIONS_MAX);
    return k;
}
