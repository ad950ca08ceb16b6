#!/usr/bin/env python3
"""tools/check_layers.py on made-up trees: an include that goes up or sideways is found, one that goes down, the
allowed ones and src/cuda/'s are not; then the repository itself has none."""
import importlib.util
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("check_layers", os.path.join(ROOT, "tools", "check_layers.py"))
check_layers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_layers)


def tree(files):
    root = tempfile.mkdtemp()
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    os.makedirs(os.path.join(root, "include", "hadatrain"), exist_ok=True)
    return root


def expect(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


ok = tree({
    "src/nn/a.cpp": '#include "hadatrain/ops/copy.h"\n#include "hadatrain/nn/layers.h"\n',
    "src/tensor/t.cpp": '#include "hadatrain/autograd/meta.h"\n#include "hadatrain/ops/copy.h"\n',
    "src/dist/d.cpp": '#include "hadatrain/io/atomic_file.h"\n#include "hadatrain/data/loader.h"\n',
    "src/cuda/glue/g.cpp": '#include "hadatrain/train/anything.h"\n',
    "src/train/t.cpp": '#include "hadatrain/cuda/x.h"\n#include "hadatrain/models/llama.h"\n',
})
expect(check_layers.findings(ok) == [], f"allowed includes reported: {check_layers.findings(ok)}")

bad = tree({
    "include/hadatrain/nn/lora.h": '// x\n#include "hadatrain/models/llama.h"\n',
    "src/io/h.cpp": '#include "hadatrain/data/loader.h"\n',
    "src/grad/p.cpp": '#include "hadatrain/nn/module.h"\n',
    "src/widgets/w.cpp": "",
})
found = check_layers.findings(bad)
expect(len(found) == 4, f"expected 4 findings, got {found}")
expect(any(f.startswith("include/hadatrain/nn/lora.h:2: nn/ includes models/") for f in found), f"nn -> models: {found}")
expect(any(f.startswith("src/io/h.cpp:1: io/ includes data/") for f in found), f"io -> data (beside): {found}")
expect(any(f.startswith("src/grad/p.cpp:1: grad/ includes nn/") for f in found), f"grad -> nn: {found}")
expect(any("'widgets' is not a layer" in f for f in found), f"unknown layer: {found}")

expect(check_layers.findings(ROOT) == [], f"the repository: {check_layers.findings(ROOT)}")
print("check_layers: ok")
