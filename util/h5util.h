/* h5util.h - HDF5 helpers libkeel's HDF5 readers and writers share. */
#ifndef KEEL_H5UTIL_H
#define KEEL_H5UTIL_H

#include <hdf5.h>

/* Close id, whatever kind of HDF5 object it names; a negative id (a
 * create or open that failed) is skipped, so a cleanup path closes every
 * handle it may hold without testing each. */
void keel__h5_close(hid_t id);

#endif
