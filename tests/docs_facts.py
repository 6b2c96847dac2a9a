#!/usr/bin/env python3
"""docs_facts.py - fails when documentation or a comment quotes one run.

Measured figures, the date they were taken, the machine's load and its
lock paths belong in bench/README.md (one table per benchmark with its
command, machine and date; HACKING.md, "Build, test, benchmark"). Elsewhere
a document states a contract and links there, and a comment states a
contract or a reason (HACKING.md, "Style"). This check scans README.md,
HACKING.md, docs/*.md and the comments of every *.c, *.h, *.sh and *.py
file (bench/ and the fuzz corpus excepted) for:

  - dates: year-month-day, year-month, a month's name (or its
    abbreviation) and a year;
  - a machine's load: its load (average), or load and a number;
  - lock paths: a path under /tmp, /run or /var/lock whose name ends
    in lock;

and prints file:line: what for each. bench/README.md and NEWS (history)
are exempt.

usage: docs_facts.py [SRCDIR]   (default: KEEL_SRCDIR, else this file's ..)
"""
import io
import os
import re
import sys
import tokenize

MONTHS = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|"
          r"June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|Oct(?:ober)?|"
          r"Nov(?:ember)?|Dec(?:ember)?)")

RULES = [
    ("a date", re.compile(r"\b20\d\d-(?:0[1-9]|1[0-2])(?:-\d\d)?\b")),
    ("a date", re.compile(r"\b" + MONTHS + r"\.?,?\s+(?:\d{1,2},?\s+)?"
                          r"20\d\d\b")),
    ("a machine's load", re.compile(r"\bload[- ]averages?\b|\bloadavg\b",
                                    re.I)),
    ("a machine's load", re.compile(r"\bload(?: of| was| at| ~| about)?"
                                    r"\s*~?\d+(?:\.\d+)?\b(?!\s*(?:%|x\b))",
                                    re.I)),
    ("a lock path", re.compile(r"/(?:tmp|run|var/lock|var/run)/\S*lock\b")),
]

DOCS_EXEMPT = {"bench/README.md", "NEWS"}
SKIP_DIRS = {".git", "bench", "autom4te.cache", "_build"}
SKIP_PREFIXES = ("tests/fuzz/corpus",)


def c_comments(text):
    """(line, text) of every comment of a C file, strings skipped."""
    out = []
    i, n, line = 0, len(text), 1
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
            i += 1
        elif ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            line += text.count("\n", i, j)
            i = j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k, part in enumerate(text[i:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i:j]))
            i = j
        else:
            i += 1
    return out


def sh_comments(text):
    """(line, text) of every '#' comment of a shell script: a '#' at the
    start of a word outside quotes ($#, ${#x} and quoted ones are not)."""
    out = []
    for no, s in enumerate(text.split("\n"), 1):
        quote = None
        prev = " "
        for k, ch in enumerate(s):
            if quote:
                if ch == quote and (quote == "'" or prev != "\\"):
                    quote = None
            elif ch in "\"'" and prev != "\\":
                quote = ch
            elif ch == "#" and (prev.isspace() or k == 0 or prev in ";|&("):
                out.append((no, s[k:]))
                break
            prev = ch
    return out


def py_comments(text):
    """(line, text) of every comment and docstring-like string statement."""
    out = []
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return sh_comments(text)
    prev = tokenize.NEWLINE
    for t in toks:
        if t.type == tokenize.COMMENT:
            out.append((t.start[0], t.string))
        elif t.type == tokenize.STRING and prev in (
                tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                tokenize.NL, tokenize.ENCODING):
            for k, part in enumerate(t.string.split("\n")):
                out.append((t.start[0] + k, part))
        if t.type not in (tokenize.COMMENT, tokenize.NL):
            prev = t.type
    return out


def targets(src):
    """(relative path, [(line, text)]) of everything checked."""
    docs = ["README.md", "HACKING.md"]
    docs += sorted("docs/" + f for f in os.listdir(os.path.join(src, "docs"))
                   if f.endswith(".md"))
    for rel in docs:
        if rel in DOCS_EXEMPT:
            continue
        with open(os.path.join(src, rel), encoding="utf-8") as f:
            yield rel, list(enumerate(f.read().split("\n"), 1))
    for root, dirs, files in os.walk(src):
        relroot = os.path.relpath(root, src)
        relroot = "" if relroot == "." else relroot + "/"
        dirs[:] = sorted(d for d in dirs
                         if d not in SKIP_DIRS and not d.startswith("_build")
                         and not (relroot + d).startswith(SKIP_PREFIXES))
        for f in sorted(files):
            rel = relroot + f
            if f.endswith((".c", ".h")):
                pick = c_comments
            elif f.endswith(".sh"):
                pick = sh_comments
            elif f.endswith(".py"):
                pick = py_comments
            else:
                continue
            if os.path.exists(os.path.join(root, f[:-2] + ".in")):
                continue                     # generated by configure
            with open(os.path.join(root, f), encoding="utf-8",
                      errors="replace") as fh:
                yield rel, pick(fh.read())


def scan(src):
    problems = []
    for rel, lines in targets(src):
        for no, text in lines:
            for what, rx in RULES:
                m = rx.search(text)
                if m:
                    problems.append("%s:%d: %s ('%s'): figures, dates, loads "
                                    "and lock paths of a run go in "
                                    "bench/README.md" % (rel, no, what,
                                                         m.group(0)))
                    break
    return problems


def main():
    src = (sys.argv[1] if len(sys.argv) > 1
           else os.environ.get("KEEL_SRCDIR")
           or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if not os.path.isdir(os.path.join(src, "docs")):
        print("docs_facts: %s is not keel's source tree" % src,
              file=sys.stderr)
        return 2
    problems = scan(src)
    for p in problems:
        print(p)
    print("docs_facts: %d problem%s" % (len(problems),
                                         "" if len(problems) == 1 else "s"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
