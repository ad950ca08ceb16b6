#!/usr/bin/env python3
"""Turns a `hadatrain sweep` of language-model runs into `area: lm` result records (docs/results/README.md).

    python3 tools/bench/lm_sweep_records.py SWEEP_DIR --plan PLAN --commit C --date D --machine M \
        [--out FILE] [--copy-metrics DIR] [--command CMD]

SWEEP_DIR holds the sweep's results.csv and each run's metrics, as `hadatrain sweep` writes them (RUN/metrics.jsonl)
or flattened into RUN.metrics.jsonl. Each run that finished (status done)
gives one record: recipe (the config path the plan names), pipeline (a readable name: the value of the
`*.name` override, with `LEVEL_CARRIER` appended for a HALO run, e.g. halo1_fp8, and any other pipeline option
the run sets in brackets, e.g. `hlq (rank: full)`), seed, the final validation loss
and perplexity and the validation loss per epoch from the run's eval records, steps and epochs (the last eval
record's: results.csv's steps column is the last logged training step), the overrides that
made the run (`set`: the stage's and the grid's), `exact_val_loss` (the final validation loss of the exact run of
the same config and seed in the sweep) and, with --copy-metrics, the metrics file copied to DIR under its run name
and named in `metrics` by its path from the repository root. The sweep's throughput figures are not kept: a sweep
with `parallel` above 1 runs several runs on one GPU at once. Records go to FILE (default stdout), one JSON object
a line, for `results_page.py --merge`.
"""
import argparse
import csv
import json
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = "LLaMA sotu_small (31M, tied; Llama-2 tokenizer), from the SOTU pre-training"


def fail(msg):
    sys.exit(f"lm_sweep_records: {msg}")


def plan_parts(plan_path):
    """The config paths the plan names (by file stem), each stage's `set` list and each stage's config stems, read
    from the plan's text: the plan format's `configs:` items are `- PATH` lines and a stage's `set:` is a one-line
    list of quoted strings."""
    configs, stage_sets, stage_configs, stage = {}, {}, {}, None
    in_stages = False
    for n, raw in enumerate(open(plan_path, encoding="utf-8"), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            in_stages = line.strip() == "stages:"
            continue
        m = re.fullmatch(r"\s*-\s*(\S+\.ya?ml)", line)
        if m:
            configs[os.path.splitext(os.path.basename(m.group(1)))[0]] = m.group(1)
            if in_stages and stage is not None:
                stage_configs[stage].append(os.path.splitext(os.path.basename(m.group(1)))[0])
        if in_stages and indent == 2 and line.strip().endswith(":"):
            stage = line.strip()[:-1]
            stage_sets[stage], stage_configs[stage] = [], []
        m = re.fullmatch(r"\s*set:\s*\[(.*)\]", line)
        if m and in_stages and indent == 4:
            items = re.findall(r'"([^"]*)"', m.group(1))
            if not items and m.group(1).strip():
                fail(f"{plan_path}:{n}: the stage's set list is not a list of quoted strings")
            stage_sets[stage] = items
    if not configs:
        fail(f"{plan_path}: no config paths (lines '- PATH.yaml') found")
    return configs, stage_sets, stage_configs


def evals(path):
    """The eval records of a metrics file, one per epoch (the last line of an epoch wins: a run writes its last
    epoch's record again when it finishes)."""
    by_epoch = {}
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if '"eval"' in line:
            rec = json.loads(line)
            if "test_loss" not in rec:
                fail(f"{path}:{n}: eval record without test_loss")
            by_epoch[rec["epoch"]] = rec
    return [by_epoch[e] for e in sorted(by_epoch)]


def pipeline_name(overrides, run):
    """The `*.name` override's value, `LEVEL_CARRIER` appended for a HALO run (halo1_fp8), then every other pipeline
    option the run sets in brackets: `hlq (rank: full)`, `halo2_fp8 (fp8_accumulation: fast)`."""
    vals = {}
    for o in overrides:
        k, _, v = o.partition("=")
        if k.startswith("grad_pipeline."):
            vals[k.rsplit(".", 1)[-1]] = v
    if "name" not in vals:
        fail(f"run {run}: no grad_pipeline.*.name override in {overrides}")
    name = vals.pop("name")
    if name == "halo":
        if "level" not in vals or "carrier" not in vals:
            fail(f"run {run}: a halo run without a level and carrier override ({overrides})")
        name = f"halo{vals.pop('level')}_{vals.pop('carrier')}"
    return name + "".join(f" ({k}: {v})" for k, v in sorted(vals.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--plan", required=True, help="the plan the sweep ran, from the repository root")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", required=True, help="YYYY-MM-DD, UTC")
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", help="default: build-gpu/tools/hadatrain sweep --plan PLAN")
    ap.add_argument("--out", help="write the records here (default: stdout)")
    ap.add_argument("--copy-metrics", metavar="DIR", help="copy each run's metrics file here (inside the repository)")
    a = ap.parse_args()
    if not re.fullmatch(r"\d{4}-\d\d-\d\d", a.date):
        fail(f"--date {a.date!r} is not YYYY-MM-DD")
    plan_file = a.plan if os.path.isabs(a.plan) else os.path.join(ROOT, a.plan)
    configs, stage_sets, stage_configs = plan_parts(plan_file)
    table = os.path.join(a.sweep_dir, "results.csv")
    if not os.path.exists(table):
        fail(f"{table} does not exist (SWEEP_DIR must hold the sweep's results.csv)")
    rows = list(csv.DictReader(open(table, encoding="utf-8")))
    fixed = {"run", "stage", "config", "status", "epochs", "steps", "best_test_loss", "final_ppl", "final_top1",
             "best_top1", "final_test_loss", "seconds", "throughput", "throughput_unit", "peak_mb"}
    recs = []
    for i, row in enumerate(rows, 2):
        if row["status"] != "done":
            print(f"lm_sweep_records: {table}:{i}: run {row['run']} is {row['status']}, left out", file=sys.stderr)
            continue
        if not row["config"] and len(stage_configs.get(row["stage"], [])) == 1:
            row["config"] = stage_configs[row["stage"]][0]  # the sweep names the config only when a stage has several
        if row["config"] not in configs:
            fail(f"{table}:{i}: config {row['config']!r} is not among the plan's ({', '.join(configs)})")
        if row["stage"] not in stage_sets:
            fail(f"{table}:{i}: stage {row['stage']!r} is not among the plan's ({', '.join(stage_sets)})")
        grid = [f"{k}={v}" for k, v in row.items() if k not in fixed and v != ""]
        overrides = stage_sets[row["stage"]] + grid
        seed = next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("run.seed=")), None)
        if seed is None:
            fail(f"{table}:{i}: run {row['run']} has no run.seed override")
        nested = os.path.join(a.sweep_dir, row["run"], "metrics.jsonl")
        metrics = nested if os.path.exists(nested) else os.path.join(a.sweep_dir, row["run"] + ".metrics.jsonl")
        if not os.path.exists(metrics):
            fail(f"neither {nested} nor {metrics} exists (run {row['run']})")
        ev = evals(metrics)
        if not ev:
            fail(f"{metrics}: no eval records")
        last = ev[-1]
        if abs(last["test_loss"] - float(row["final_test_loss"])) > 1e-9:
            fail(f"{metrics}: last test_loss {last['test_loss']} but {table}:{i} says {row['final_test_loss']}")
        rec = {"area": "lm", "recipe": configs[row["config"]], "model": MODEL,
               "pipeline": pipeline_name(overrides, row["run"]), "seed": seed, "run": row["run"],
               "plan": a.plan, "set": overrides,
               "val_loss": round(last["test_loss"], 6), "val_ppl": round(last["test_ppl"], 4),
               "val_tokens": last.get("test_tokens"), "steps": last["step"],
               "epochs": last["epoch"], "val_loss_by_epoch": [[e["epoch"], round(e["test_loss"], 6)] for e in ev]}
        if a.copy_metrics:
            os.makedirs(a.copy_metrics, exist_ok=True)
            dest = os.path.join(a.copy_metrics, row["run"] + ".metrics.jsonl")
            shutil.copyfile(metrics, dest)
            rel = os.path.relpath(os.path.abspath(dest), ROOT)
            if rel.startswith(".."):
                fail(f"--copy-metrics {a.copy_metrics} is outside the repository {ROOT}")
            rec["metrics"] = rel
        recs.append(rec)
    exact = {(r["recipe"], r["seed"]): r["val_loss"] for r in recs if r["pipeline"] == "exact"}
    for r in recs:
        if (r["recipe"], r["seed"]) in exact:
            r["exact_val_loss"] = exact[(r["recipe"], r["seed"])]
        else:
            print(f"lm_sweep_records: run {r['run']}: no exact run of {r['recipe']} seed {r['seed']} in the sweep",
                  file=sys.stderr)
        r.update(date=a.date, commit=a.commit, machine=a.machine,
                 command=a.command or f"build-gpu/tools/hadatrain sweep --plan {a.plan}")
    out = open(a.out, "w", encoding="utf-8") if a.out else sys.stdout
    for r in recs:
        out.write(json.dumps(r, ensure_ascii=False) + "\n")
    if a.out:
        out.close()
        print(f"{a.out}: {len(recs)} record(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
