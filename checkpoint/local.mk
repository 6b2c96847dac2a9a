# checkpoint/: HDF5 checkpoints, the state file, retention, async save.
