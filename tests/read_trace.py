#!/usr/bin/env python3
"""read_trace.py - parse a keel Chrome trace with the json module and print one
line per event: "name|cat|ph|ts|dur|pid|tid" (cat "-" when absent). Exit 1
with a message on stderr when the file is not {"traceEvents": [...]}.
Usage: read_trace.py TRACE_JSON"""
import json
import sys


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: read_trace.py TRACE_JSON\n")
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        if not isinstance(events, list):
            raise ValueError("traceEvents is not a list")
        lines = []
        for e in events:
            for key in ("name", "ph", "ts", "dur", "pid", "tid"):
                if key not in e:
                    raise ValueError("event without %r: %r" % (key, e))
            lines.append("%s|%s|%s|%d|%d|%d|%d" % (
                e["name"], e.get("cat", "-"), e["ph"], e["ts"], e["dur"],
                e["pid"], e["tid"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.stderr.write("read_trace: %s: %s\n" % (argv[1], e))
        return 1
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
