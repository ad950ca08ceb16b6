#!/usr/bin/env python3
"""tools/bench/lm_sweep_records.py on a small made-up sweep: the pipeline names it gives (options a stage sets in its
`set` list, HALO's level and carrier from the grid), the config of a one-config stage (the sweep leaves its column
empty), the exact run it pairs each run with, and its refusal of a run whose metrics disagree with results.csv."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "bench", "lm_sweep_records.py")

PLAN = """sweep:
  out_dir: runs/sweeps/x
stages:
  ref:
    configs:
      - configs/llm/a_full.yaml
      - configs/llm/a_lora.yaml
    grid:
      grad_pipeline.layers.*_proj.name: [exact, hlq]
      run.seed: [0]
  halo:
    configs:
      - configs/llm/a_full.yaml
      - configs/llm/a_lora.yaml
    set: ["grad_pipeline.layers.*_proj.name=halo"]
    grid:
      grad_pipeline.layers.*_proj.level: [2]
      grad_pipeline.layers.*_proj.carrier: [fp8]
      run.seed: [0]
  hlq_rank_full:
    configs:
      - configs/llm/a_full.yaml
    set: ["grad_pipeline.layers.*_proj.name=hlq", "grad_pipeline.layers.*_proj.rank=full"]
    grid:
      run.seed: [0]
"""

NAME, LEVEL, CARRIER = ("grad_pipeline.layers.*_proj." + k for k in ("name", "level", "carrier"))
HEAD = ["run", "stage", "config", NAME, "run.seed", LEVEL, CARRIER, "status", "epochs", "steps", "best_test_loss",
        "final_ppl", "final_top1", "best_top1", "final_test_loss", "seconds", "throughput", "throughput_unit", "peak_mb"]
# run, stage, config column, name, level, carrier, final validation loss
RUNS = [("ref-a_full-exact-0", "ref", "a_full", "exact", "", "", 4.5),
        ("ref-a_full-hlq-0", "ref", "a_full", "hlq", "", "", 5.0),
        ("ref-a_lora-exact-0", "ref", "a_lora", "exact", "", "", 5.5),
        ("halo-a_full-2-fp8-0", "halo", "a_full", "", "2", "fp8", 4.6),
        ("halo-a_lora-2-fp8-0", "halo", "a_lora", "", "2", "fp8", 5.6),
        ("hlq_rank_full-0", "hlq_rank_full", "", "", "", "", 4.7)]


def write_sweep(d, bad_run=None):
    with open(os.path.join(d, "plan.yaml"), "w") as f:
        f.write(PLAN)
    rows = [",".join(HEAD)]
    for run, stage, config, name, level, carrier, loss in RUNS:
        rows.append(",".join([run, stage, config, name, "0", level, carrier, "done", "2", "10", str(loss), "1", "", "",
                              str(loss), "1", "1", "tok/s", "1"]))
        # as `hadatrain sweep` writes them (RUN/metrics.jsonl), and one flattened (RUN.metrics.jsonl)
        if run == RUNS[0][0]:
            path = os.path.join(d, run + ".metrics.jsonl")
        else:
            os.makedirs(os.path.join(d, run))
            path = os.path.join(d, run, "metrics.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps({"type": "train", "step": 1, "epoch": 1, "loss": 9.0}) + "\n")
            for epoch, value in ((1, loss + 1), (2, loss + (0.25 if run == bad_run else 0.0))):
                f.write(json.dumps({"type": "eval", "step": 5 * epoch, "epoch": epoch, "test_loss": value,
                                    "test_ppl": 2.0, "test_tokens": 100}) + "\n")
    with open(os.path.join(d, "results.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")


def run(d):
    return subprocess.run([sys.executable, SCRIPT, d, "--plan", os.path.join(d, "plan.yaml"), "--commit", "abc1234",
                           "--date", "2026-12-04", "--machine", "m"], capture_output=True, text=True)


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        write_sweep(d)
        p = run(d)
        check(p.returncode == 0, f"exit {p.returncode}: {p.stderr}")
        recs = {r["run"]: r for r in (json.loads(l) for l in p.stdout.splitlines() if l.strip())}
        check(len(recs) == len(RUNS), f"{len(recs)} records for {len(RUNS)} runs")
        want = {"ref-a_full-exact-0": ("exact", "configs/llm/a_full.yaml", 4.5),
                "ref-a_full-hlq-0": ("hlq", "configs/llm/a_full.yaml", 4.5),
                "ref-a_lora-exact-0": ("exact", "configs/llm/a_lora.yaml", 5.5),
                "halo-a_full-2-fp8-0": ("halo2_fp8", "configs/llm/a_full.yaml", 4.5),
                "halo-a_lora-2-fp8-0": ("halo2_fp8", "configs/llm/a_lora.yaml", 5.5),
                "hlq_rank_full-0": ("hlq (rank: full)", "configs/llm/a_full.yaml", 4.5)}
        for name, (pipeline, recipe, exact) in want.items():
            r = recs.get(name)
            if r is None:
                failures.append(f"no record for {name}")
                continue
            check(r["pipeline"] == pipeline, f"{name}: pipeline {r['pipeline']!r}, want {pipeline!r}")
            check(r["recipe"] == recipe, f"{name}: recipe {r['recipe']!r}, want {recipe!r}")
            check(r.get("exact_val_loss") == exact, f"{name}: exact_val_loss {r.get('exact_val_loss')}, want {exact}")
            check(r["val_loss_by_epoch"][-1][1] == r["val_loss"], f"{name}: last epoch's loss is not val_loss")
        rf = recs.get("hlq_rank_full-0", {})
        check("grad_pipeline.layers.*_proj.rank=full" in rf.get("set", []), f"hlq_rank_full-0: set {rf.get('set')}")

    with tempfile.TemporaryDirectory() as d:  # a metrics file whose last eval disagrees with results.csv
        write_sweep(d, bad_run="halo-a_full-2-fp8-0")
        p = run(d)
        check(p.returncode != 0 and "halo-a_full-2-fp8-0" in p.stderr + p.stdout,
              f"a disagreeing metrics file was accepted (exit {p.returncode}): {p.stderr}")

    for f in failures:
        print("FAILED:", f)
    print(f"{'ok' if not failures else f'{len(failures)} failure(s)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
