#!/usr/bin/env python3
"""Checks that every `Note [Name]` reference in the sources and docs leads to its note.

A note is written once, where its subject lives, as a comment or paragraph that starts with `Note [Name]`; other
places cite it as `Note [Name]` (same file or anywhere) or `Note [Name] in path/to/file`. The check fails when
  - a note is cited but no line anywhere starts with it (the note was renamed or deleted), or
  - a citation names a file that does not exist or does not contain the note's name (the note moved, or the
    file was renamed: `in halo_fast_rows_impl.cu` after it became a .cuh),
and prints each such citation as file:line.

Usage: tools/check_notes.py [ROOT]   (default: the repository holding this script). Exit code 1 on a finding.
"""
import collections
import os
import re
import sys

TREES = ["src", "include", "tests", "tools", "docs", "examples", "cmake", "configs"]
TOP_FILES = ["README.md", "CMakeLists.txt"]
SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".md", ".py", ".sh", ".cmake", ".txt", ".yaml")
# A citation: the name, then optionally "in <file>" naming where the note is.
CITE = re.compile(r"Note \[([^\]]+)\](?:\s+in\s+([\w./-]+\.(?:cpp|cuh|cu|h|md|py|sh|cmake)\b))?")
# A note's start: the name at the start of a line (after comment or list markers), then the end of the line, a
# colon, a full stop or its text.
START = re.compile(r"^\s*(?://+|#+|\*+|-|>)?\s*(?:\*\*[^*]*\*\*\s*\()?Note \[([^\]]+)\](?=$|[.:,)]|\s)")


def source_files(root):
    for top in TOP_FILES:
        path = os.path.join(root, top)
        if os.path.isfile(path):
            yield top
    for tree in TREES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, tree)):
            dirnames[:] = sorted(d for d in dirnames if d not in ("corpus", "results", "runs", "fixtures"))
            for name in sorted(filenames):
                if name.endswith(SUFFIXES) and name != os.path.basename(__file__):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    texts = {}
    for rel in source_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            texts[rel] = f.read()
    if not texts:
        print(f"check_notes: no sources under {root}", file=sys.stderr)
        return 1

    starts = collections.defaultdict(set)  # name -> files where a line starts with it
    cites = []  # (file, line, name, named file or None)
    for rel, text in texts.items():
        for number, line in enumerate(text.split("\n"), 1):
            m = START.match(line)
            if m:
                starts[m.group(1)].add(rel)
            for c in CITE.finditer(line):
                cites.append((rel, number, c.group(1), c.group(2)))

    findings = []
    for rel, number, name, where in cites:
        if name not in starts:
            findings.append(f"{rel}:{number}: Note [{name}] is cited but no line starts it (renamed or deleted?)")
            continue
        if where is None:
            continue
        matches = [f for f in texts if f == where or f.endswith("/" + where)]
        if not matches:
            findings.append(f"{rel}:{number}: Note [{name}] is said to be in {where}, which does not exist; it is in "
                            f"{', '.join(sorted(starts[name]))}")
        elif not any(f"[{name}]" in texts[f] for f in matches):
            findings.append(f"{rel}:{number}: Note [{name}] is said to be in {where}, which does not hold it; it is "
                            f"in {', '.join(sorted(starts[name]))}")
    for f in findings:
        print(f)
    print(f"check_notes: {len(starts)} notes, {len(cites)} citations, {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
