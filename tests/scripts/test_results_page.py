#!/usr/bin/env python3
"""tools/bench/results_page.py's merge on a scratch copy of the records: a kernels record replaces the one with its
group and name in its place (the file's order, and with it the page's, stays), new keys go last, and a record from
another GPU than its group's is refused (naming the group and both GPUs) and leaves the records as they were; the
same record under a group that names its GPU merges. A step record from another GPU is another row beside the one of
the page's GPU (which a newer step of that GPU replaces), and its pipeline cell names that GPU."""
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import results_page  # noqa: E402

COMMON = {"area": "kernels", "metric": "ms", "date": "2026-12-06", "commit": "abc1234", "command": "bench"}


def rec(group, name, ours, machine):
    return dict(COMMON, group=group, name=name, ours=ours, machine=machine)


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def merge(results, records):
    """results_page.merge of records in a file; the failure message, or None."""
    path = os.path.join(results, "new.jsonl")
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    try:
        results_page.merge([path])
    except SystemExit as e:
        return str(e.code)
    return None


def main():
    h200, h100 = "1x NVIDIA H200 (driver 580.159.04, CUDA 13.0), 16 CPU cores", "1x NVIDIA H100 80GB HBM3"
    with tempfile.TemporaryDirectory() as d:
        results_page.RESULTS = d
        kernels = os.path.join(d, "kernels.jsonl")
        with open(kernels, "w") as f:
            for r in (rec("HALO per layer (8B)", "up_proj, exact", 4.1, h200), rec("HALO per layer (8B)", "q_proj, exact", 1.1, h200)):
                f.write(json.dumps(r) + "\n")
        before = open(kernels).read()

        msg = merge(d, [rec("HALO per layer (8B)", "up_proj, exact", 4.0, h100)])
        check(msg is not None and "'HALO per layer (8B)'" in msg and "NVIDIA H200" in msg and
              "NVIDIA H100 80GB HBM3" in msg, f"another GPU in a group: {msg}")
        check(open(kernels).read() == before, "a refused merge leaves the records as they were")

        check(merge(d, [rec("HALO per layer on an H100 (8B)", "up_proj, exact", 4.0, h100)]) is None,
              "the GPU named in the group merges")
        check(merge(d, [rec("HALO per layer (8B)", "up_proj, exact", 4.2, h200)]) is None, "the same GPU merges")
        recs = [json.loads(l) for l in open(kernels)]
        check([(r["group"], r["name"], r["ours"]) for r in recs] ==
              [("HALO per layer (8B)", "up_proj, exact", 4.2), ("HALO per layer (8B)", "q_proj, exact", 1.1),
               ("HALO per layer on an H100 (8B)", "up_proj, exact", 4.0)],
              f"a record replaces the one with its group and name in its place, a new one goes last: {recs}")

        def step(pipeline, ms, machine, date="2026-12-06"):
            return {"area": "steps", "model": "llama32_1b", "batch": 8, "pipeline": pipeline, "ours_ms": ms,
                    "exact_ms": 270.0, "date": date, "commit": "abc1234", "command": "llama_steps", "machine": machine}
        steps = os.path.join(d, "steps.jsonl")
        with open(steps, "w") as f:
            f.write(json.dumps(step("halo1_fp8", 245.0, h200)) + "\n")
        check(merge(d, [step("halo1_fp8", 236.0, h100, "2026-12-07")]) is None, "a step from another GPU merges")
        check(merge(d, [step("halo1_fp8", 244.0, h200, "2026-12-07")]) is None, "a newer step of the same GPU merges")
        recs = results_page.load("steps")
        check(sorted((r["machine"], r["ours_ms"]) for r in recs) == [(h100, 236.0), (h200, 244.0)],
              f"one row per GPU, the newer one of each: {recs}")
        results_page.SHARED["machine"] = h200
        lines = results_page.steps_vs_exact(recs)
        rows = [l for l in lines if l.startswith("| LLaMA")]
        check(len(rows) == 2 and "| halo1_fp8 | 244.00 |" in rows[0] and "| halo1_fp8 on H100 | 236.00 |" in rows[1],
              f"the page's GPU first, the other named: {rows}")
    # the repository's records pass the rule (--check applies it too)
    results_page.RESULTS = os.path.join(ROOT, "docs", "results")
    results_page.one_gpu_per_table(results_page.load("kernels"), "docs/results/kernels.jsonl")
    print("results_page merge: ok")


if __name__ == "__main__":
    main()
