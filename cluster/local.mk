# cluster/: cluster spec, wire protocol, parameter servers, workers, launcher.
