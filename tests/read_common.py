"""read_common.py - the command line the independent readers share
(read_tfevents.py, read_trace.py): one FILE argument; read(FILE) returns
the lines to print. A bad file (one of the exceptions in errors) gives
"<prog>: FILE: <why>" on stderr and exit status 1; a usage error, 2."""
import sys


def run(argv, prog, usage, read, errors):
    if len(argv) != 2:
        sys.stderr.write("usage: %s\n" % usage)
        return 2
    try:
        lines = read(argv[1])
    except errors as e:
        sys.stderr.write("%s: %s: %s\n" % (prog, argv[1], e))
        return 1
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0
