#!/usr/bin/env python3
"""read_trace.py - parse a keel Chrome trace with the json module and print one
line per event: "name|cat|ph|ts|dur|pid|tid" (cat "-" when absent). Exit 1
with a message on stderr when the file is not {"traceEvents": [...]}.
Usage: read_trace.py TRACE_JSON"""
import json
import sys

from read_common import run


def read(path):
    with open(path, encoding="utf-8") as f:
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
    return lines


def main(argv):
    return run(argv, "read_trace", "read_trace.py TRACE_JSON", read,
               (OSError, ValueError, KeyError, TypeError))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
