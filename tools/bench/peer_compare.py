#!/usr/bin/env python3
"""Our training steps against PyTorch's fastest form, in one call on one GPU.

For each MODEL:BATCH it runs build-gpu/tools/bench_train MODEL BATCH bf16 PIPELINE for each pipeline, then
tools/bench/bench_train_torch.py MODEL BATCH FORM for each of PyTorch's forms (eager, compile, graph), every one in
its own process, one after another. Our time is bench_train's step-graph line (what the trainer runs with
train.cuda_graph: auto); the peer is the fastest of the PyTorch forms measured in this call, and every ratio is
peer time / our time (above 1: ours is faster). A form that fails is recorded as failed and the model's ratio is
then left out (the fastest form is not known).

Writes, into OUT (a directory):
  steps.jsonl   one record per model and pipeline: our time and memory, every PyTorch form's time and peak
                memory, the peer form, the ratio; with date, commit, machine and command (docs/results/README.md)
  memory.jsonl  one record per model and pipeline: bench_train's peak allocated memory, what the forward saved,
                and the step graph's memory
  peer_compare.log  every process's command line and output
Merge them into the results page with: python3 tools/bench/results_page.py --merge OUT/steps.jsonl OUT/memory.jsonl

The commit is `git describe --always --dirty` of the tree, or $HADATRAIN_COMMIT where the copy has no .git (as on
the lent GPU machine). Several calls may cover different models: each record's own numbers come from one call.
    python3 tools/bench/peer_compare.py BUILD_DIR OUT [--models resnet34:256,vit_s4:256] [--pipelines exact,hlq]
                                        [--forms eager,compile,graph] [--timeout 480] [--label PIPELINE=TEXT]
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys

DEFAULT_MODELS = "resnet18:256,resnet34:256,resnet50:128,vit_s4:256,vit_b16:256"
HERE = os.path.dirname(os.path.abspath(__file__))
EAGER = re.compile(r"^hadatrain (\S+) batch (\d+) (\S+) forward, (\S+), (\S+): ([\d.]+) ms/step, (\d+) img/s, "
                   r"peak allocated ([\d.]+) GiB", re.M)
GRAPH = re.compile(r"^hadatrain (\S+) batch (\d+) (\S+) forward, (\S+), step graph: ([\d.]+) ms/step, (\d+) img/s, "
                   r"graph memory ([\d.]+) GiB, host issue ([\d.]+) ms, (\d+) nodes", re.M)
SAVED = re.compile(r"memory: before step ([\d.]+) GiB, after forward ([\d.]+) GiB \(saved for backward ([\d.]+)\)")


def sh(cmd, log, timeout):
    """Runs cmd (a list), appends its command line and output to log; returns (exit code, output)."""
    line = " ".join(shlex.quote(c) for c in cmd)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += f"\n(timed out after {timeout} s)"
    with open(log, "a") as f:
        f.write(f"$ {line}\n{out}\n(exit {rc})\n\n")
    return rc, out


def commit():
    if os.environ.get("HADATRAIN_COMMIT"):
        return os.environ["HADATRAIN_COMMIT"]
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine():
    try:
        rows = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              stdout=subprocess.PIPE, text=True, check=True).stdout.strip().splitlines()
        name, driver = [s.strip() for s in rows[0].split(",")]
        gpus = f"{len(rows)}x {name} (driver {driver})"
    except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
        gpus = "GPU unknown (nvidia-smi failed)"
    return f"{gpus}, {os.cpu_count()} CPU cores"


def record_fields(script):
    """The fields every results record has (docs/results/README.md) for a call of tools/bench/SCRIPT with this
    process's arguments: today's date (UTC), the commit, the machine and the command."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit(),
        "machine": machine(),
        "command": " ".join(shlex.quote(c) for c in ["python3", f"tools/bench/{script}"] + sys.argv[1:]),
    }


def ours(build, model, batch, pipeline, log, timeout):
    cmd = [os.path.join(build, "tools", "bench_train"), model, str(batch), "bf16", pipeline]
    rc, out = sh(cmd, log, timeout)
    e, g, s = EAGER.search(out), GRAPH.search(out), SAVED.search(out)
    if rc != 0 or not e:
        return {"error": f"bench_train exit {rc}" + ("" if e else ", no result line")}, cmd
    r = {"eager_ms": float(e.group(6)), "peak_allocated_gib": float(e.group(8))}
    if s:
        r["saved_gib"] = float(s.group(3))
    if g:
        r.update(graph_ms=float(g.group(5)), graph_gib=float(g.group(7)), graph_nodes=int(g.group(9)))
    return r, cmd


def torch_form(model, batch, form, out_dir, log, timeout):
    tmp = os.path.join(out_dir, f".torch_{model}_{batch}_{form}.jsonl")
    if os.path.exists(tmp):
        os.remove(tmp)
    cmd = [sys.executable, os.path.join(HERE, "bench_train_torch.py"), model, str(batch), form, "--jsonl", tmp]
    rc, _ = sh(cmd, log, timeout)
    if rc != 0 or not os.path.exists(tmp):
        return {"error": f"exit {rc}"}
    with open(tmp) as f:
        rec = json.loads(f.read().splitlines()[-1])
    os.remove(tmp)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("out")
    ap.add_argument("--models", default=DEFAULT_MODELS, help="MODEL:BATCH,... (default %(default)s)")
    ap.add_argument("--pipelines", default="exact", help="bench_train pipelines, comma-separated")
    ap.add_argument("--forms", default="eager,compile,graph", help="PyTorch forms, comma-separated")
    ap.add_argument("--timeout", type=int, default=480, help="seconds per process")
    ap.add_argument("--label", action="append", default=[], metavar="PIPELINE=TEXT",
                    help="a label the results page shows with a pipeline, e.g. hlq='simulated conv products' "
                         "while HLQ's convolutions run dequantised (docs/BENCHMARKS.md lists the labels)")
    a = ap.parse_args()
    forms = a.forms.split(",")
    labels = dict(l.split("=", 1) for l in a.label if "=" in l)
    if len(labels) != len(a.label):
        ap.error("--label takes PIPELINE=TEXT")
    for f in forms:
        if f not in ("eager", "compile", "graph"):
            ap.error(f"unknown PyTorch form '{f}' (eager, compile, graph)")
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "peer_compare.log")
    common = record_fields("peer_compare.py")
    if common["commit"] == "unknown":
        print("peer_compare: no git tree and no $HADATRAIN_COMMIT: the records say commit 'unknown', which "
              "results_page.py refuses", file=sys.stderr)
    steps, memory = [], []
    for item in a.models.split(","):
        model, _, batch = item.partition(":")
        batch = int(batch or 256)
        mine = {p: ours(a.build, model, batch, p, log, a.timeout) for p in a.pipelines.split(",")}
        peer = {f: torch_form(model, batch, f, a.out, log, a.timeout) for f in forms}
        ok = {f: r for f, r in peer.items() if "error" not in r}
        complete = len(ok) == 3
        best = min(ok, key=lambda f: ok[f]["ms_per_step"]) if complete else None
        torch_version = next((r["torch"] for r in ok.values()), None)
        for p, (r, cmd) in mine.items():
            rec = {"area": "steps", "model": model, "batch": batch, "dtype": "bf16", "pipeline": p}
            if p in labels:
                rec["label"] = labels[p]
            if "error" in r:
                rec["error"] = r["error"]
            else:
                form = "step graph" if "graph_ms" in r else "eager"
                rec.update(ours_ms=r.get("graph_ms", r["eager_ms"]), ours_form=form, ours_eager_ms=r["eager_ms"],
                           ours_peak_allocated_gib=r["peak_allocated_gib"])
            rec["peer"] = {f: ({"error": v["error"]} if "error" in v else
                               {"ms": v["ms_per_step"], "peak_allocated_gib": v["peak_allocated_gib"]})
                           for f, v in peer.items()}
            rec["torch"] = torch_version
            ex = mine.get("exact", ({},))[0]
            if p != "exact" and "graph_ms" in ex:
                rec["exact_ms"] = ex["graph_ms"]  # our exact step in the same call
            if best and "ours_ms" in rec:
                rec.update(peer_form=best, peer_ms=ok[best]["ms_per_step"],
                           ratio=round(ok[best]["ms_per_step"] / rec["ours_ms"], 3))
            rec.update(common)
            rec["processes"] = [" ".join(cmd)] + [f"python3 tools/bench/bench_train_torch.py {model} {batch} {f}"
                                                  for f in forms]
            steps.append(rec)
            if "error" not in r:  # our memory: peak allocated (eager) and the step graph's, beside the same-call
                # exact with the same recomputation (exact_rc for a *_rc pipeline)
                base = "exact_rc" if p.endswith("_rc") and p != "exact_rc" else "exact" if p != "exact" else None
                b = mine.get(base, ({"error": ""},))[0] if base else {"error": ""}
                for metric, k in (("peak allocated", "peak_allocated_gib"), ("step graph memory", "graph_gib")):
                    if k not in r:
                        continue
                    mem = {"area": "memory", "model": model, "batch": batch, "dtype": "bf16", "pipeline": p,
                           "metric": metric, "gib": r[k]}
                    if k == "peak_allocated_gib" and "saved_gib" in r:
                        mem["saved_gib"] = r["saved_gib"]
                    if k in b:
                        mem["baseline"] = {"pipeline": base, "gib": b[k]}
                    if p in labels:
                        mem["label"] = labels[p]
                    mem.update(common)
                    mem["command"] = " ".join(cmd)
                    memory.append(mem)
            peer_txt = f"{best} {ok[best]['ms_per_step']:.2f} ms" if best else "incomplete"
            ours_txt = f"{rec['ours_ms']:.2f} ms" if "ours_ms" in rec else rec["error"]
            ratio_txt = f"{rec['ratio']:.2f}x" if "ratio" in rec else "-"
            print(f"{model} b{batch} {p}: ours {ours_txt}, peer {peer_txt}, peer/ours {ratio_txt}", flush=True)
    for name, recs in (("steps.jsonl", steps), ("memory.jsonl", memory)):
        with open(os.path.join(a.out, name), "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    print(f"results: {a.out}/steps.jsonl, {a.out}/memory.jsonl; logs: {log}")
    return 0 if all("ratio" in r for r in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
