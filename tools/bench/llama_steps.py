#!/usr/bin/env python3
"""Our LLaMA training step per gradient pipeline against our exact step, in one call on one GPU.

The rows of the results page's "Gradient pipelines: step time against our exact step" for LLaMA. For each of RUNS
rounds it runs BUILD_DIR/tools/bench_llama PRESET BATCH SEQ P [--lora] for exact and then for each PIPELINE, each in
its own process, so exact and the pipelines alternate. With --lora every process trains bench_llama's LoRA set-up
(rank 16 on q, k, v, o; the base frozen in bf16) and the records' model is PRESET_lora. Each process prints an eager
and a step-graph line (tools/bench/bench_llama.cpp). OUT (a JSON-lines file, replaced) gets one `steps` record per pipeline:
  ours_ms                  the mean over the rounds of the step graph's ms/step (ours_form: step graph)
  ours_eager_ms            the mean of the eager step's
  ours_tok_per_s, ours_mfu the step graph's, from those means (tokens per step / ours_ms; the mean MFU)
  ours_peak_allocated_gib  the largest step-graph peak of the rounds
  exact_ms                 the mean of exact's step graph in the same rounds
  runs, processes          the number of rounds and the commands of one round
with date, commit, machine and command (docs/results/README.md). A process that fails, or prints no step-graph
line (bench_llama says why it did not record one), fails the call: exit 1, OUT not written, since a mean over
fewer rounds would no longer be this call's. Every process's command line and output go to OUT.log.

The commit is `git describe --always --dirty` of the tree, or $HADATRAIN_COMMIT where the copy has no .git (as on
the lent GPU machine); the machine as peer_compare.py names it. Merge with:
    python3 tools/bench/results_page.py --merge OUT
    python3 tools/bench/llama_steps.py BUILD_DIR OUT PIPELINE... [--preset llama32_1b] [--batch 8] [--seq 2048]
                                       [--lora] [--runs 2] [--timeout 600]
"""
import argparse
import json
import os
import re
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from peer_compare import record_fields, sh  # noqa: E402

# bench_llama's report line (tools/bench/bench_llama.cpp, `report`)
LINE = re.compile(r"^hadatrain (?P<preset>\S+) batch (\d+)x(\d+) (?P<pipeline>\S+)(?P<lora> lora)?, "
                  r"(?P<form>eager|step graph): (?P<ms>[\d.]+) ms/step, (\d+) tok/s, "
                  r"MFU (?P<mfu>[\d.]+), peak allocated (?P<gib>[\d.]+) GiB$", re.M)
NOT_USED = re.compile(r"step graph: not used: (.*)$", re.M)

# What the suffix of a bench_llama pipeline's shorthand name sets (tools/bench/bench_llama.cpp: halo2_fp8_precise,
# hlq_fast, hlq_full, ...), shown beside the name on the page.
LABELS = {"_precise": "fp8_accumulation: precise", "_fast": "fp8_accumulation: fast", "_full": "rank: full"}


def one_run(build, preset, batch, seq, pipeline, lora, log, timeout):
    """bench_llama's eager and step-graph figures for one process: (dict, command) or raises RuntimeError."""
    cmd = [os.path.join(build, "tools", "bench_llama"), preset, str(batch), str(seq), pipeline]
    cmd += ["--lora"] if lora else []
    rc, out = sh(cmd, log, timeout)
    lines = {m["form"]: m for m in LINE.finditer(out) if m["pipeline"] == pipeline and bool(m["lora"]) == lora}
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {rc} (output in the log)")
    if "step graph" not in lines:
        why = NOT_USED.search(out)
        raise RuntimeError(f"{' '.join(cmd)}: no step-graph line" + (f" ({why.group(1)})" if why else ""))
    if "eager" not in lines:
        raise RuntimeError(f"{' '.join(cmd)}: no eager line")
    g, e = lines["step graph"], lines["eager"]
    return {"ms": float(g["ms"]), "mfu": float(g["mfu"]), "gib": float(g["gib"]), "eager_ms": float(e["ms"])}, cmd


def mean(xs):
    return sum(xs) / len(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("out", help="the records' file (JSON lines, replaced)")
    ap.add_argument("pipelines", nargs="+", help="bench_llama pipelines (halo2_fp8, hlq, ...); exact always runs")
    ap.add_argument("--preset", default="llama32_1b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--lora", action="store_true", help="bench_llama's LoRA set-up in every process")
    ap.add_argument("--runs", type=int, default=2, help="rounds of exact and every pipeline (default %(default)s)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per process")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    order = ["exact"] + [p for p in a.pipelines if p != "exact"]
    if len(order) == 1:
        ap.error("name at least one pipeline besides exact")
    log = a.out + ".log"
    if os.path.exists(log):
        os.remove(log)
    common = record_fields("llama_steps.py")
    if common["commit"] == "unknown":
        print("llama_steps: no git tree and no $HADATRAIN_COMMIT: the records would say commit 'unknown', which "
              "results_page.py refuses", file=sys.stderr)
        return 1
    runs = {p: [] for p in order}
    cmds = {}
    try:
        for r in range(a.runs):
            for p in order:
                res, cmd = one_run(a.build, a.preset, a.batch, a.seq, p, a.lora, log, a.timeout)
                runs[p].append(res)
                cmds[p] = " ".join(shlex.quote(c) for c in cmd)
                print(f"round {r + 1}/{a.runs} {p}: step graph {res['ms']:.2f} ms, eager {res['eager_ms']:.2f} ms",
                      flush=True)
    except RuntimeError as e:
        print(f"llama_steps: {e}; nothing written (log: {log})", file=sys.stderr)
        return 1
    exact_ms = mean([x["ms"] for x in runs["exact"]])
    tokens = a.batch * a.seq
    records = []
    for p in order[1:]:
        ms = mean([x["ms"] for x in runs[p]])
        rec = {"area": "steps", "model": a.preset + ("_lora" if a.lora else ""), "batch": a.batch, "seq": a.seq,
               "dtype": "bf16", "pipeline": p,
               "ours_ms": round(ms, 2), "ours_form": "step graph",
               "ours_eager_ms": round(mean([x["eager_ms"] for x in runs[p]]), 2),
               "ours_peak_allocated_gib": max(x["gib"] for x in runs[p]),
               "ours_tok_per_s": round(tokens / (ms / 1000.0)), "ours_mfu": round(mean([x["mfu"] for x in runs[p]]), 3),
               "exact_ms": round(exact_ms, 2), "runs": a.runs, "processes": [cmds["exact"], cmds[p]]}
        label = next((v for k, v in LABELS.items() if p.endswith(k)), None)
        if label:
            rec["label"] = label
        rec.update(common)
        records.append(rec)
        print(f"{a.preset} {p}: {rec['ours_ms']:.2f} ms against exact's {rec['exact_ms']:.2f} "
              f"({exact_ms / ms:.2f}x, mean of {a.runs})")
    with open(a.out, "w") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    print(f"records: {a.out}; log: {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
