#!/usr/bin/env python3
"""Checks that the library's includes follow its layers (docs/architecture.md, Layers).

Each directory of src/ and include/hadatrain/ is a layer with a rank; a file may include headers of its own layer
and of layers ranked below it, and of the layers in its own row where ALLOWED_SIBLINGS says so. The three links
that point up on purpose (docs/architecture.md names them) are listed in ALLOWED_UP. src/cuda/ is the backend of
every layer (its glue takes tensors from ops, grad, optim and dist), so includes to and from it are not checked.

Usage: tools/check_layers.py [ROOT]   (default: the repository holding this script). Prints each include that goes
up as file:line and exits with code 1 when there is one, or when a directory is not a known layer.
"""
import os
import re
import sys

# Rows of docs/architecture.md's diagram, bottom first; layers in one row share a rank.
ROWS = [["core"], ["tensor"], ["autograd"], ["ops"], ["grad"], ["nn"], ["data", "io", "dist"], ["models", "optim"],
        ["train"]]
RANK = {layer: rank for rank, row in enumerate(ROWS) for layer in row}
UNCHECKED = {"cuda"}
# Within a row: data/ and dist/ write and read files through io/, dist/ slices a batch's rows (data/).
ALLOWED_SIBLINGS = {("data", "io"), ("dist", "io"), ("dist", "data")}
# Upward on purpose: a tensor owns its AutogradMeta and converts through the copy op; the engine sums with add.
ALLOWED_UP = {("tensor", "autograd"), ("tensor", "ops"), ("autograd", "ops")}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]hadatrain/(\w+)/')


def layer_files(root):
    for top in ("src", os.path.join("include", "hadatrain")):
        base = os.path.join(root, top)
        for layer in sorted(os.listdir(base)):
            if not os.path.isdir(os.path.join(base, layer)):
                continue
            for dirpath, _, names in os.walk(os.path.join(base, layer)):
                for name in sorted(names):
                    if name.endswith((".h", ".cpp", ".cu", ".cuh")):
                        yield layer, os.path.join(dirpath, name)


def findings(root):
    out = []
    for layer, path in layer_files(root):
        rel = os.path.relpath(path, root)
        if layer in UNCHECKED:
            continue
        if layer not in RANK:
            out.append(f"{rel}: directory '{layer}' is not a layer of docs/architecture.md (add it to ROWS)")
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                dep = m.group(1)
                if dep == layer or dep in UNCHECKED or (layer, dep) in ALLOWED_UP:
                    continue
                if dep not in RANK:
                    out.append(f"{rel}:{lineno}: includes hadatrain/{dep}/, which is not a layer")
                elif RANK[dep] > RANK[layer] or (RANK[dep] == RANK[layer] and (layer, dep) not in ALLOWED_SIBLINGS):
                    out.append(f"{rel}:{lineno}: {layer}/ includes {dep}/, a layer above it or beside it: {line.strip()}")
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = findings(root)
    for f in found:
        print(f)
    print(f"check_layers: {len(found)} finding(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
