# hooks/: the standard session-run hooks, TensorBoard event files, traces.
