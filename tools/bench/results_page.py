#!/usr/bin/env python3
"""Generates docs/BENCHMARKS.md, the results page, from the records in docs/results/*.jsonl.

    python3 tools/bench/results_page.py                 # rewrite docs/BENCHMARKS.md and the files it links to
                                                        # (docs/results/lm_runs/README.md, docs/results/curves/)
    python3 tools/bench/results_page.py --check         # exit 1 when one of them differs from what the records give
    python3 tools/bench/results_page.py --merge FILE... # add records (e.g. peer_compare.py's steps.jsonl and
                                                        # memory.jsonl); a record replaces the one with its key

The record format is in docs/results/README.md. Every record carries its date, commit, machine and command; a record
that lacks one, or whose commit is "unknown", is an error naming the file and line. The page shows one row per key
(the latest record); the output depends on the records only, so two runs write the same bytes.
"""
import argparse
import json
import os
import re
import sys
import textwrap

import results_lm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")
PAGE = os.path.join(ROOT, "docs", "BENCHMARKS.md")
LM_RUNS = os.path.join(RESULTS, "lm_runs", "README.md")  # the per-run rows of the language-model sweeps
CURVES = os.path.join(RESULTS, "curves")  # generated SVG curves; every .svg there is the generator's
AREAS = {  # area: (fields every record needs besides the common ones, the fields that make its key)
    "steps": (("model", "batch", "pipeline", "ours_ms"), ("model", "batch", "pipeline")),
    "memory": (("model", "batch", "pipeline", "metric", "gib"), ("model", "batch", "pipeline", "metric")),
    "accuracy": (("recipe", "pipeline", "seed", "top1"), ("recipe", "pipeline", "seed")),
    "kernels": (("group", "name", "metric", "ours"), ("group", "name")),
    "lm": (("recipe", "model", "pipeline", "seed", "val_loss", "val_ppl"), ("recipe", "pipeline", "seed")),
    # multi_gpu: a call's rows are read against each other (its one-process run, its PyTorch peer), so a record
    # replaces only the same run of the same call
    "multi_gpu": (("run", "stage", "model", "gpus", "impl", "all_gather", "pipeline", "status"), ("run", "date", "commit")),
}
COMMON = ("area", "date", "commit", "machine", "command")
HIGHER_IS_BETTER = {"fraction of copy", "speed × own bf16 a·bᵀ", "TFLOP/s"}
MODEL_NAMES = {"resnet18": "ResNet-18 (CIFAR stem, 32²)", "resnet34": "ResNet-34 (CIFAR stem, 32²)",
               "resnet50": "ResNet-50 (ImageNet stem, 224²)", "vit_s4": "ViT-S/4 (32²)", "vit_b16": "ViT-B/16 (224²)",
               "llama32_1b": "LLaMA 1.24B (Llama-3.2-1B shape), sequence 2048",
               "llama3_8b_lora": "LLaMA 8.03B (Llama-3-8B shape), LoRA r16 on q, k, v, o, sequence 2048"}
FORMS = ("eager", "compile", "graph")
SHARED = {"machine": None}  # the machine most records ran on, named once in the header (set by render())


def fill(text):
    """A paragraph wrapped as the page's fixed prose is (the texts that take values from the records)."""
    return textwrap.fill(text, 117, break_long_words=False, break_on_hyphens=False)


def fail(msg):
    sys.exit(f"results_page: {msg}")


def check(rec, where):
    area = rec.get("area")
    if area not in AREAS:
        fail(f"{where}: area {area!r} is none of {', '.join(AREAS)}")
    for k in COMMON + AREAS[area][0]:
        if rec.get(k) in (None, ""):
            fail(f"{where}: the {area} record has no '{k}'")
    if not re.fullmatch(r"\d{4}-\d\d-\d\d", rec["date"]):
        fail(f"{where}: date {rec['date']!r} is not YYYY-MM-DD")
    if rec["commit"] == "unknown":
        fail(f"{where}: commit 'unknown' (set HADATRAIN_COMMIT when the measured tree has no .git)")
    if area == "accuracy" and rec.get("metrics"):
        path = os.path.join(ROOT, rec["metrics"])
        if not os.path.exists(path):
            fail(f"{where}: metrics file {rec['metrics']} does not exist")
        evals = [json.loads(l) for l in open(path) if '"eval"' in l]
        last = round(100 * evals[-1]["test_acc"], 2) if evals else None
        if last is None or abs(last - rec["top1"]) > 0.005:
            fail(f"{where}: top1 {rec['top1']} but {rec['metrics']} ends at {last}")
    if area == "lm" and rec.get("metrics"):
        path = os.path.join(ROOT, rec["metrics"])
        if not os.path.exists(path):
            fail(f"{where}: metrics file {rec['metrics']} does not exist")
        evals = [json.loads(l) for l in open(path) if '"eval"' in l]
        last = evals[-1]["test_loss"] if evals else None
        if last is None or abs(last - rec["val_loss"]) > 5e-5:
            fail(f"{where}: val_loss {rec['val_loss']} but {rec['metrics']} ends at {last}")


def gpu(rec):
    """The GPU a record's machine names ("NVIDIA H200" of "1x NVIDIA H200 (driver ...), 16 CPU cores")."""
    m = re.match(r"\d+x (.+?)(?: \(|,|$)", rec["machine"])
    return m.group(1) if m else rec["machine"]


def page_gpu():
    """The GPU of the page's machine (SHARED, set by render()), or None before it is set."""
    return gpu({"machine": SHARED["machine"]}) if SHARED["machine"] is not None else None


def one_gpu_per_table(recs, where):
    """A kernels table compares its rows' figures, so each group's records must come from one GPU: a record from
    another GPU names it in its group (`HALO per layer on an H100 (...)`). Fails naming the group and both GPUs."""
    seen = {}
    for r in recs:
        if r["area"] != "kernels":
            continue
        g = seen.setdefault(r["group"], (gpu(r), r["name"]))
        if g[0] != gpu(r):
            fail(f"{where}: the kernels group {r['group']!r} holds '{g[1]}' from {g[0]} and '{r['name']}' from "
                 f"{gpu(r)}: a table compares one GPU's figures; name the other GPU in its records' group "
                 f"(e.g. 'HALO per layer on an H100 (...)')")


def key(rec):
    """A record's key: its area's key fields and, for a step, the GPU it ran on (a step on another GPU is another
    row, not a newer measurement of the same one)."""
    k = tuple(rec[f] for f in AREAS[rec["area"]][1])
    return k + (gpu(rec),) if rec["area"] == "steps" else k


def load(area):
    path = os.path.join(RESULTS, f"{area}.jsonl")
    recs = []
    if os.path.exists(path):
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path}:{n}: {e}")
                check(rec, f"{path}:{n}")
                if rec["area"] != area:
                    fail(f"{path}:{n}: a {rec['area']} record in the {area} file")
                recs.append(rec)
    latest = {}
    for rec in sorted(recs, key=lambda r: r["date"]):  # stable: among equal dates the later line wins
        latest[key(rec)] = rec
    return list(latest.values())


def merge(files):
    for f in files:
        new = [json.loads(l) for l in open(f, encoding="utf-8") if l.strip()]
        for n, rec in enumerate(new, 1):
            check(rec, f"{f}:{n}")
        for area in AREAS:
            add = [r for r in new if r["area"] == area]
            if not add:
                continue
            path = os.path.join(RESULTS, f"{area}.jsonl")
            # a record takes the place of the one with its key, so that tables and rows keep their order on the
            # page; records with new keys go last
            fresh = {key(a): a for a in add}
            merged = [fresh.pop(key(r), r) for r in load(area)] + list(fresh.values())
            one_gpu_per_table(merged, f"merging {f}")
            with open(path, "w", encoding="utf-8") as out:
                for r in merged:
                    out.write(json.dumps(r, ensure_ascii=False) + "\n")
            print(f"{path}: {len(add)} record(s) merged")


def num(v, digits=2):
    if isinstance(v, list):
        return "–".join(num(x, digits) for x in v)
    return f"{v:.{digits}f}"


def ratio(a, b):
    """a / b for numbers or [lo, hi] ranges (a range gives the range of ratios)."""
    lo_a, hi_a = (a if isinstance(a, list) else [a, a])
    lo_b, hi_b = (b if isinstance(b, list) else [b, b])
    lo, hi = lo_a / hi_b, hi_a / lo_b
    return f"{lo:.2f}×" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}×"


PLACEHOLDERS = (("MODEL", "model"), ("BATCH", "batch"), ("PIPELINE", "pipeline"))


def template(rec):
    """The command of a record with a model, batch and pipeline (steps, memory) with those values written MODEL,
    BATCH and PIPELINE (each occurrence that stands alone); the command itself for other records."""
    cmd = rec["command"]
    if not all(k in rec for _, k in PLACEHOLDERS) or any(n in cmd for n, _ in PLACEHOLDERS):
        return cmd
    for name, k in PLACEHOLDERS:
        cmd = re.sub(rf"(?<![\w.-]){re.escape(str(rec[k]))}(?![\w.-])", name, cmd)
    return cmd


def words(xs):
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


class Notes:
    """Numbered footnotes of a table: the command (and PyTorch version) of each row, and its machine.

    With `machine` (the page's machine, named once in its header) a footnote names the machine only when it is
    another one; without, the machine is named once per table when every row ran on the same kind. `recs`, the
    table's records, lets rows whose commands differ only in their model, batch and pipeline share one footnote:
    the command with MODEL, BATCH and PIPELINE in their place (template()), used when it covers more rows than the
    command itself does."""

    def __init__(self, recs=(), machine=None):
        self.items, self.machines, self.machine = [], [], machine
        self.rows, self.models = {}, {}  # {(command or template, machine): rows}, {(template, machine): models}
        for r in recs:
            for c in {r["command"], template(r)}:
                self.rows[(c, r["machine"])] = self.rows.get((c, r["machine"]), 0) + 1
            models = self.models.setdefault((template(r), r["machine"]), [])
            if r["model"] not in models:
                models.append(r["model"])

    def ref(self, rec):
        t, m = template(rec), rec["machine"]
        if t != rec["command"] and self.rows.get((t, m), 0) > self.rows.get((rec["command"], m), 0):
            names = [n for n, _ in PLACEHOLDERS if re.search(rf"\b{n}\b", t)]
            what = {"MODEL": "model (" + ", ".join(f"`{x}`" for x in self.models[(t, m)]) + ")", "BATCH": "batch",
                    "PIPELINE": "pipeline"}
            text = f"`{t}`{{torch}}, {words(names)} being the row's {words([what[n] for n in names])}"
        else:
            text = f"`{rec['command']}`{{torch}}"
        # One footnote per command and machine: rows of one command that ran ours and PyTorch's processes share it,
        # with the PyTorch version that any of them records.
        keys = [(c, mm) for c, mm, _ in self.items]
        if (text, m) not in keys:
            self.items.append([text, m, None])
            keys.append((text, m))
        i = keys.index((text, m))
        if rec.get("torch"):
            self.items[i][2] = rec["torch"]
        if m not in self.machines:
            self.machines.append(m)
        return f"[{i + 1}]"

    def commands(self):
        return [(c.replace("{torch}", f" (PyTorch {t})" if t else ""), m) for c, m, t in self.items]

    def lines(self):
        if self.machine is not None:
            return [""] + [f"- [{i}] {cmd}" + ("" if m == self.machine else f" on {m}")
                           for i, (cmd, m) in enumerate(self.commands(), 1)]
        one = len(self.machines) == 1
        out = [""] + [f"- [{i}] {cmd}" + ("" if one else f" on {m}") for i, (cmd, m) in enumerate(self.commands(), 1)]
        return out + ([f"- Machine: {self.machines[0]}."] if one else [])


def measured(rec, notes):
    return f"{rec['date']} `{rec['commit']}` {notes.ref(rec)}"


def pipe(rec):
    """The pipeline cell: its name, its label and, for a record from another GPU than the page's, that GPU."""
    name = f"{rec['pipeline']} ({rec['label']})" if rec.get("label") else rec["pipeline"]
    if rec["area"] == "steps" and page_gpu() not in (None, gpu(rec)):
        name += f" on {gpu(rec).removeprefix('NVIDIA ').split()[0]}"
    return name


def table(head, rows):
    cell = lambda c: c.replace("|", "\\|")  # a '|' inside a cell would end it
    return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] +
            ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows])


def steps_vs_peer(recs):
    notes, rows = Notes(machine=SHARED["machine"]), []
    for r in sorted((r for r in recs if r["pipeline"] == "exact" or r.get("peer")), key=order):
        peer = r.get("peer") or {}
        other = r.get("peer_other_call") or {}  # measured by the previous call on the same machine: shown, no ratio
        cells = []
        for f in FORMS:
            p = peer.get(f)
            if p is None and f in other:
                cells.append(f"{num(other[f]['ms'])} (previous call)")
                continue
            cells.append("not measured" if p is None else ("timed out" if p["error"] == "exit 124" else "failed") if "error" in p else num(p["ms"]))
        ok = {f: peer[f]["ms"] for f in FORMS if f in peer and "error" not in peer[f]}
        if other and not peer:
            verdict = "no ratio: PyTorch ran in the previous call"
        elif len(ok) == 3:
            best = min(ok, key=ok.get)
            verdict = f"**{ok[best] / r['ours_ms']:.2f}×** ({best})"
        elif any(f in peer for f in FORMS):
            verdict = "peer not measured in the same call (only " + ", ".join(f for f in FORMS if f in ok) + ")"
        else:
            verdict = "peer not measured in the same call"
        rows.append([MODEL_NAMES.get(r["model"], r["model"]), str(r["batch"]), pipe(r), num(r["ours_ms"])] + cells +
                    [verdict, measured(r, notes)])
    return table(["model", "batch", "pipeline", "ours (ms)", "PyTorch eager", "torch.compile", "whole-step CUDA graph",
                  "peer / ours", "measured"], rows) + notes.lines()


def steps_text(recs):
    """STEPS with the LLaMA row's utilisation and memory filled in from its record."""
    llama = [r for r in recs if r["model"] == "llama32_1b" and r["pipeline"] == "exact"]
    if not llama:
        return STEPS.split("\nThe LLaMA row")[0] + "\n"
    r = llama[0]
    if r.get("peer_form"):
        peer = r["peer"][r["peer_form"]]
        peer_mfu = r["ours_mfu"] * r["ours_ms"] / peer["ms"]  # the same FLOPs per step
        said = f"PyTorch's fastest form {peer_mfu:.3f} and {num(peer['peak_allocated_gib'])} GiB"
    else:
        said = "PyTorch was not measured in the call that measured this row, so it has no ratio"
    return STEPS.format(llama_mfu=f"{r['ours_mfu']:.3f}", llama_mem=num(r["ours_peak_allocated_gib"]), llama_peer=said,
                        lora_text=lora_text(recs))


def lora_text(recs):
    """The sentence under the steps table for the LoRA row, from its record (empty without one)."""
    lora = [r for r in recs if r["model"] == "llama3_8b_lora" and r["pipeline"] == "exact"]
    if not lora:
        return ""
    r = lora[0]
    p = (r.get("peer_other_call") or {}).get("eager")
    peer = (r.get("peer") or {}).get(r.get("peer_form") or "")
    if peer:  # measured in the same call: the peer is the fastest form
        said = (f" The peer, transformers + peft (bf16 base, f32 adapters, the same adapters and optimiser), fastest "
                f"as {r['peer_form']}: {peer['tok_per_s']:,} tokens/s, "
                f"{num(peer['peak_allocated_gib'])} GiB.")
    elif p:
        said = (f" PyTorch, transformers + peft eager ({r['peer_script']}, bf16 base, f32 adapters) ran in the call before "
                f"ours on the same machine: {num(p['ms'])} ms, {p['tok_per_s']:,} tokens/s, "
                f"{num(p['peak_allocated_gib'])} GiB; two calls, so no ratio.")
    else:
        said = ""
    return (f"The LoRA row: random weights, the frozen base held in bf16 (ours: {r['base_note']}), "
            f"adapters in f32, AdamW over the adapters; ours {r['ours_tok_per_s']:,} tokens/s, peak allocated "
            f"{num(r['ours_peak_allocated_gib'])} GiB.{said}\n")


def order(r):
    return (list(MODEL_NAMES).index(r["model"]) if r["model"] in MODEL_NAMES else 99, r["model"], r["batch"],
            r["pipeline"], gpu(r) != page_gpu())


def steps_vs_exact(recs):
    shown = sorted((r for r in recs if r["pipeline"] != "exact"), key=order)
    notes, rows = Notes(shown, SHARED["machine"]), []
    for r in shown:
        e, other = r.get("exact_ms"), r.get("exact_other_call_ms")  # other: same commit and machine kind, another call
        exact = num(e) if e else f"{num(other)} (another call)" if other else "not measured"
        speed = ratio(e, r["ours_ms"]) if e else f"{ratio(other, r['ours_ms'])} (two calls)" if other else "—"
        rows.append([MODEL_NAMES.get(r["model"], r["model"]), str(r["batch"]), pipe(r), num(r["ours_ms"]), exact, speed,
                     measured(r, notes)])
    return table(["model", "batch", "pipeline", "step (ms)", "our exact, same call (ms)", "speed vs exact",
                  "measured"], rows) + notes.lines()


def memory(recs):
    """One row per model, batch and pipeline: its peak allocated and step-graph memory, each against its baseline."""
    recs = sorted(recs, key=order)
    notes, rows, groups = Notes(recs, SHARED["machine"]), [], {}
    for r in recs:
        groups.setdefault((r["model"], r["batch"], pipe(r)), {})[r["metric"]] = r

    def cell(r):
        if r is None:
            return "—"
        b = r.get("baseline")
        return num(r["gib"]) + (f" ({100 * r['gib'] / b['gib']:.0f} % of {b['pipeline']})" if b else "")

    for (model, batch, pipeline), m in groups.items():
        peak, graph = m.get("peak allocated"), m.get("step graph memory")
        when = []
        for r in (peak, graph):
            if r is not None and measured(r, notes) not in when:
                when.append(measured(r, notes))
        rows.append([MODEL_NAMES.get(model, model), str(batch), pipeline, cell(peak),
                     num(peak["saved_gib"]) if peak and "saved_gib" in peak else "—", cell(graph), "; ".join(when)])
    return table(["model", "batch", "pipeline", "peak allocated (GiB; against, same call)", "saved by the forward (GiB)",
                  "step graph memory (GiB; against, same call)", "measured"], rows) + notes.lines()


def accuracy(recs, drawn):
    """Runs without a kept metrics file: one row per recipe and seed, a column per pipeline (a sweep's table);
    runs with one: one row per recipe and pipeline, a column per seed, each cell with its metrics file's link and
    its own date, commit and footnote. `drawn`: accuracy_curves' files, linked under the tables."""
    notes = Notes(machine=SHARED["machine"])
    grid = [r for r in recs if not r.get("metrics")]
    pipes = sorted({pipe(r) for r in grid}, key=lambda p: (p != "exact", p))
    cells = {}
    for r in grid:
        cells.setdefault((r["recipe"], r["seed"]), {})[pipe(r)] = r
    rows = []
    for (recipe, seed), by in sorted(cells.items()):
        row = [recipe, str(seed)]
        for p in pipes:
            r = by.get(p)
            e = r.get("exact_top1") if r else None
            row.append("—" if r is None else f"{r['top1']:.2f} %" + (f" ({r['top1'] - e:+.2f})" if e is not None else ""))
        rows.append(row + [measured(next(iter(by.values())), notes)])
    out = table(["recipe", "seed"] + pipes + ["measured"], rows) + [""] if rows else []
    kept, rows = [r for r in recs if r.get("metrics")], {}
    seeds = sorted({r["seed"] for r in kept})
    for r in sorted(kept, key=lambda r: (r["recipe"], r["pipeline"] != "exact", r["pipeline"], r["seed"])):
        rows.setdefault((r["recipe"], pipe(r)), {})[r["seed"]] = r

    def cell(r):
        if r is None:
            return "—"
        e = r.get("exact_top1")
        m = f"[metrics]({os.path.relpath(os.path.join(ROOT, r['metrics']), os.path.dirname(PAGE))})"
        return (f"{r['top1']:.2f} %" + (f" ({r['top1'] - e:+.2f})" if e is not None else "") +
                f", {m}, {measured(r, notes)}")
    if rows:
        out += table(["recipe", "pipeline"] + [f"seed {s}: test top-1 (vs exact), metrics file, measured" for s in seeds],
                     [[recipe, p] + [cell(by.get(s)) for s in seeds] for (recipe, p), by in rows.items()])
    if drawn:
        links = ", ".join(f"[{title}]({os.path.relpath(path, os.path.dirname(PAGE))})"
                          for path, (title, _) in drawn.items())
        out += ["", f"Training loss every logged step, one line per pipeline, and its difference from exact's: {links}."]
    return out + notes.lines()


def slug(text):
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def accuracy_curves(recs):
    """{path: (link text, SVG)}: per recipe and seed with two or more kept metrics files, the training loss of each
    pipeline's run (results_lm.curve_svg)."""
    groups = {}
    for r in recs:
        if r.get("metrics"):
            groups.setdefault((r["recipe"], r["seed"]), []).append(r)
    files = {}
    for (recipe, seed), group in sorted(groups.items()):
        group = sorted(group, key=lambda r: results_lm.pipeline_order(r["pipeline"]))
        series = [(pipe(r), results_lm.train_losses(os.path.join(ROOT, r["metrics"]))) for r in group]
        series = [(n, pts) for n, pts in series if pts]
        if len(series) >= 2:
            files[os.path.join(CURVES, f"accuracy_{slug(recipe)}_seed{seed}.svg")] = (
                f"{recipe}, seed {seed}", results_lm.curve_svg(f"{recipe}, seed {seed}: training loss", series))
    return files


def language_models(recs):
    """Single runs (records without a `plan`) one row each; per sweep plan the text, a summary table (results_lm) and
    links to the per-run page and the curves."""
    notes, rows = Notes(machine=SHARED["machine"]), []
    for r in sorted((r for r in recs if not r.get("plan")), key=lambda r: (r["recipe"], r["seed"], r["pipeline"])):
        curve = ", ".join(f"{e}: {v:.4f}" for e, v in r.get("val_loss_by_epoch", []))
        seconds = epoch_seconds(r)
        rows.append([r["recipe"], r["model"], pipe(r), str(r["seed"]), f"{r['val_loss']:.4f}", f"{r['val_ppl']:.3f}",
                     str(r.get("steps", "—")), f"{seconds:.1f}" if seconds else "—", curve or "—", measured(r, notes)])
    out = table(["recipe", "model", "pipeline", "seed", "validation loss", "perplexity", "steps",
                 "training time (s, sum of the epochs)", "validation loss by epoch", "measured"], rows) if rows else []
    link = lambda path: os.path.relpath(path, os.path.dirname(PAGE))
    for plan in sorted({r["plan"] for r in recs if r.get("plan")}):
        sweep = [r for r in recs if r.get("plan") == plan]
        calls = sorted({measured(r, notes) for r in sweep})
        out += [""] + LM_SWEEP.get(plan, f"`{plan}`:").split("\n") + [f"Measured {'; '.join(calls)}.", ""]
        out += table(*results_lm.summary(sweep))
        groups = results_lm.sweep_groups(sweep)
        by_recipe = {}
        for recipe, seed in groups:
            name = os.path.join(CURVES, results_lm.curve_name(recipe, seed))
            by_recipe.setdefault(recipe, []).append(f"[seed {seed}]({link(name)})")
        out += ["", f"Per run (each seed, loss per epoch, metrics files): [{link(LM_RUNS)}]({link(LM_RUNS)}). "
                    "Training loss every logged step, one line per pipeline, and its difference from exact's: " +
                "; ".join(f"{results_lm.recipe_name(rc)} {', '.join(v)}" for rc, v in by_recipe.items()) + "."]
    return out + notes.lines()


def epoch_seconds(rec):
    """The sum of the `epoch_seconds` of a run's eval records (the trainer's time per epoch, evaluation and
    checkpoints excluded), from its kept metrics file; None without one or without the field."""
    if not rec.get("metrics"):
        return None
    evals = [json.loads(line) for line in open(os.path.join(ROOT, rec["metrics"]), encoding="utf-8")
             if '"eval"' in line]
    times = [e["epoch_seconds"] for e in evals if e.get("type") == "eval" and "epoch_seconds" in e]
    return sum(times) if times else None


def lm_runs_page(recs):
    """docs/results/lm_runs/README.md: every sweep run's row, per recipe, with its curves."""
    notes, page_dir = Notes(), os.path.dirname(LM_RUNS)
    sweep = [r for r in recs if r.get("plan")]
    lines = LM_RUNS_TEXT.split("\n")
    for recipe, rows in results_lm.per_run_rows(sweep, page_dir, ROOT, lambda r: measured(r, notes)):
        lines += ["", f"## {results_lm.recipe_name(recipe)} (`{recipe}`)", ""]
        lines += table(["pipeline", "seed", "validation loss", "perplexity", "vs exact, same seed (relative)", "steps",
                        "validation loss by epoch", "metrics", "measured"], rows)
        for seed in sorted({r["seed"] for r in sweep if r["recipe"] == recipe}):
            svg = os.path.relpath(os.path.join(CURVES, results_lm.curve_name(recipe, seed)), page_dir)
            lines += ["", f"![{results_lm.recipe_name(recipe)}, seed {seed}]({svg})"]
    return "\n".join(lines + notes.lines()).rstrip("\n") + "\n"


MODES = {"none": "hadatrain, one process", "fsdp": "hadatrain fsdp", "ddp": "hadatrain ddp, all-reduce in backward",
         "ddp-after": "hadatrain ddp, all-reduce after backward"}


def impl_mode(r):
    """A multi_gpu row's implementation with how it is distributed (records before --mode: by their all-gather)."""
    if r["impl"] != "hadatrain":
        return r["impl"]
    return MODES[r.get("mode") or ("none" if r["all_gather"] == "none" else "fsdp")]


def compiled_peer(recs, c, call):
    """Whether call c measured PyTorch's torch.compile form (the multi-GPU peer's fastest form so far)."""
    return any(call(r) == c and r["impl"].startswith("torch") and r["impl"].endswith(" compile") and
               r.get("tok_per_s_per_gpu") for r in recs)


def multi_gpu(recs):
    """Runs of tools/bench/multi_gpu.sh: throughput rows (stages scaling, whose rows include ddp's, and 8b), then
    the equivalence checks. "ours / PyTorch's fastest" compares a hadatrain row with the fastest PyTorch row (FSDP2
    or DDP, any form) of the same call (same date, commit, machine, model, GPU count and stage); "of one process's"
    with the same call's one-process row (all-gather none: one GPU, nothing distributed) of the same pipeline."""
    notes, rows, eq = Notes(machine=SHARED["machine"]), [], []
    call = lambda r: (r["date"], r["commit"], r["machine"], r["model"], r["gpus"], r["stage"])
    peers, single = {}, {}
    for r in recs:
        if r["impl"].startswith("torch") and r.get("tok_per_s_per_gpu"):
            peers[call(r)] = max(peers.get(call(r), 0), r["tok_per_s_per_gpu"])
        if r["all_gather"] == "none" and r.get("tok_per_s_per_gpu"):  # one process, nothing sharded
            single[(r["date"], r["commit"], r["machine"], r["model"], r["stage"], r["impl"], r["pipeline"])] = \
                r["tok_per_s_per_gpu"]
    for c in [c for c in peers if not compiled_peer(recs, c, call)]:  # a slower form is no peer (multi_gpu_text)
        del peers[c]
    for r in sorted(recs, key=lambda r: (r["stage"], r["model"], r["gpus"], r["impl"], r["pipeline"], r["all_gather"])):
        if r["stage"] == "equivalence":
            eq.append([r["run"], r["model"], str(r["gpus"]), f"{r['max_rel_diff']:.2g}", f"{r['tolerance']:g}",
                       "within" if r["status"] == "ok" else "**outside**", r.get("note", "—"), measured(r, notes)])
            continue
        peer = peers.get(call(r))
        vs = f"{r['tok_per_s_per_gpu'] / peer:.2f}×" if peer and r["impl"] == "hadatrain" else "—"
        one = single.get((r["date"], r["commit"], r["machine"], r["model"], r["stage"], r["impl"], r["pipeline"]))
        eff = f"{100 * r['tok_per_s_per_gpu'] / one:.1f} %" if one and r["all_gather"] != "none" else "—"
        wire = next((r[k] for k in sorted(r) if "bytes" in k and k != "comm_bytes_est"), None)
        wire_txt = f"{wire / 1e9:.2f}" if wire else (f"{r['comm_bytes_est'] / 1e9:.2f} (estimate)" if r.get(
            "comm_bytes_est") else "—")
        rows.append([r["model"], str(r["gpus"]), impl_mode(r), pipe(r), "—" if r["all_gather"] == "-" else r["all_gather"],
                     f"{r['tok_per_s_per_gpu']:,}",
                     eff, vs, num(r["step_ms"]), num(r["peak_allocated_gib"]) if "peak_allocated_gib" in r else "—",
                     wire_txt, f"{r['mfu_per_gpu']:.3f}" if "mfu_per_gpu" in r else "—", measured(r, notes)])
    out = table(["model", "GPUs", "implementation", "pipeline", "all-gather", "tokens/s per GPU",
                 "of one process's (same call)", "ours / PyTorch's fastest (same call)", "step (ms)", "peak GiB (largest rank)", "GB on the wire per rank and step",
                 "MFU per GPU", "measured"], rows)
    if eq:
        out += ["", "Equivalence (per-step training losses, largest relative difference):", ""]
        out += table(["check", "model", "GPUs", "largest difference", "tolerance", "result", "note", "measured"], eq)
    return out + notes.lines()


def multi_gpu_text(recs):
    """MULTI_GPU with the per-GPU batch of the throughput rows, and what "estimate" means where a row shows one."""
    runs = [r for r in recs if r["stage"] != "equivalence"]
    shapes = list(dict.fromkeys((r["model"], r.get("batch_per_gpu"), r.get("seq")) for r in runs))
    batch = ("as the script sets it" if any(b is None or q is None for _, b, q in shapes) else
             "; ".join(f"`{m}` {b} × {q} tokens" for m, b, q in shapes))
    estimate = any(r.get("comm_bytes_est") and not any("bytes" in k and k != "comm_bytes_est" for k in r) for r in runs)
    torch_rows = [r for r in runs if r["impl"].startswith("torch") and r.get("tok_per_s_per_gpu")]
    peers = sorted({r["impl"].split()[1] for r in torch_rows})
    call = lambda r: (r["date"], r["commit"], r["machine"], r["model"], r["gpus"], r["stage"])
    uncompiled = sorted({r["date"] for r in torch_rows if not compiled_peer(runs, call(r), call)})
    peer = ("The peer, PyTorch " + " and ".join(p.upper() for p in peers) +
            " (`tools/bench/fsdp_torch.py`), runs in the same call as the rows it is compared with; a ratio is shown "
            "only where that call also measured `torch.compile`, PyTorch's fastest form on these steps so far" +
            (f" (the call{'s' if len(uncompiled) > 1 else ''} of {', '.join(uncompiled)} did not: no ratio)"
             if uncompiled else "") + "." if peers else
            "No PyTorch peer (`tools/bench/fsdp_torch.py`, stage `peer`) ran in these calls, so no row has a ratio "
            "against one.")
    text = MULTI_GPU.replace("{batch}", batch).replace("{peer}", peer).replace("{estimate}", ' "estimate": bytes on the wire computed from '
                                                        "the parameter count (ring collectives) where the run logged "
                                                        "none." if estimate else "")
    return "## Several GPUs\n\n" + fill(text) + "\n"


def kernels(recs):
    notes, out, groups = Notes(machine=SHARED["machine"]), [], []
    for r in recs:
        if r["group"] not in groups:
            groups.append(r["group"])
    rows = []
    for g in groups:
        if g.startswith(LAYER_GROUPS):
            continue
        for r in (r for r in recs if r["group"] == g):
            t = r.get("torch_eager")
            if t is None:
                vs = "—"
            elif r["metric"] in HIGHER_IS_BETTER:
                vs = ratio(r["ours"], t)
            else:
                vs = ratio(t, r["ours"])
            digits = 4 if r["metric"] == "ms" else 3
            rows.append([g, r["name"] + (f" ({r['note']})" if r.get("note") else ""), r["metric"], num(r["ours"], digits),
                         num(t, digits) if t is not None else "not recorded", vs, measured(r, notes)])
    out += table(["group", "kernel", "unit", "ours", "PyTorch eager, same call", "ours vs PyTorch (speed)",
                  "measured"], rows)
    return (out + halo_layers([r for r in recs if r["group"].startswith(LAYER_GROUPS[0])], notes) +
            layer_errors([r for r in recs if r["group"].startswith(LAYER_GROUPS[1])], notes) + notes.lines())


# Groups of per-layer records (bench_halo's), shown as one table per group by halo_layers and layer_errors
LAYER_GROUPS = ("HALO per layer", "Errors per layer")


def layer_errors(recs, notes):
    """bench_halo's HT_BENCH_ERRORS records ("LAYER, VARIANT, PRODUCT", metric "relative error"): per group a table
    with one row per layer and call and one column per variant, each cell the errors of Y, g_x and g_w in per cent."""
    out = []
    for g in dict.fromkeys(r["group"] for r in recs):
        variants, rows_by = [], {}
        for r in (r for r in recs if r["group"] == g):
            layer, variant, product = [x.strip() for x in r["name"].split(",")[:3]]
            if variant not in variants:
                variants.append(variant)
            rows_by.setdefault((layer, r["commit"]), {}).setdefault(variant, {})[product] = r
        cell = lambda by: " / ".join(f"{100 * by[p]['ours']:.4g}" if p in by else "—" for p in ("Y", "g_x", "g_w"))
        rows = [[layer] + [cell(by[v]) if v in by else "—" for v in variants] +
                [measured(next(iter(next(iter(by.values())).values())), notes)] for (layer, _), by in rows_by.items()]
        text = (f"{g}: relative errors ‖out − ref‖ / ‖ref‖ in per cent of Y / g_x / g_w from one eager forward + "
                "backward, against the same products of the same bf16 operands in f64 (`HT_BENCH_ERRORS=1 "
                "tools/bench/bench_halo`, Note [Errors per layer]: Gaussian operands, no outlier channels; exact "
                "bf16's figures are its outputs' bf16 rounding).")
        out += ["", text, ""] + table(["layer"] + variants + ["measured"], rows)
    return out


def halo_layers(recs, notes):
    """The per-layer HALO / HLQ records, one table per group (model shape), one row per layer and call: each
    variant's forward + backward time and its speed against exact bf16 of the same layer and call (records named
    "LAYER, VARIANT, forward + backward"); where the group has HLQ's backward times, columns with those too."""
    out = []
    for n, g in enumerate(dict.fromkeys(r["group"] for r in recs)):
        out += halo_group([r for r in recs if r["group"] == g], notes, first=n == 0)
    return out


def halo_group(recs, notes, first):
    variants, layers = [], {}
    for r in recs:
        layer, variant = [x.strip() for x in r["name"].split(",")[:2]]
        if variant not in variants:
            variants.append(variant)
        layers.setdefault((layer, r["commit"]), {})[variant] = r
    # HLQ's per-layer speed target is its backward's: a group with HLQ shows the backward times too
    timed = [("ours", "forward + backward")]
    if "hlq" in variants and any("backward_ms" in r for r in recs):
        timed.append(("backward_ms", "backward"))
    rows = []
    for (layer, _), by in layers.items():
        exact = by.get("exact bf16")
        cells = []
        for key, what in timed:
            for v in variants:
                r = by.get(v)
                if r is None or key not in r:
                    cells.append("—")
                elif exact is None or v == "exact bf16" or key not in exact:
                    cells.append(num(r[key], 3))
                else:
                    cells.append(f"{num(r[key], 3)} ({exact[key] / r[key]:.3f}×)")  # targets sit at 1.5×
        rows.append([layer] + cells + [measured(next(iter(by.values())), notes)])
    text = (f"{recs[0]['group']}: forward + backward in ms and, in brackets, the speed against exact bf16 of the "
            "same layer and call (above 1: faster); `tools/bench/bench_halo`, a recorded step graph per variant, "
            "a layer's graphs replayed in turns (30 rounds)."
            if first else f"{recs[0]['group']}, timed as above.")
    if len(timed) > 1:
        text += (" The backward columns: the forward + backward graph's time less the forward graph's (which "
                 "includes what the forward saves: HLQ's ACBP, HALO's quantised operands), in brackets against exact "
                 "bf16's backward.")
    if "halo2 fp8 bound" in variants:
        text += (" `halo2 fp8 GEMMs alone`: HALO-2's three fp8 products alone on codes of its shapes, in the same "
                 "rounds; `halo2 fp8 bound`: those plus the bytes of the level-2 dataflow's memory passes at the HBM's "
                 "peak rate, the least time that dataflow can take (Note [HALO's bound per layer] in "
                 "tools/bench/bench_halo.cpp).")
    if "halo2 fp8 bound at the copy rate" in variants:
        text += (" `halo2 fp8 bound at the copy rate`: the same bytes at the rate of a plain 1 GiB copy measured in "
                 "the same rounds (the faster of our copy kernel and cudaMemcpyAsync), what a pass that only moves "
                 "its bytes through DRAM reaches on this GPU (a pass that finds its input in L2 can beat it).")
    head = ["layer"] + ([f"{v}, {what}" for _, what in timed for v in variants] if len(timed) > 1 else variants) + \
        ["measured"]
    return ["", text, ""] + table(head, rows)


HEADER = """# Results

{intro}
"""

INTRO = ("Generated by `tools/bench/results_page.py` from the records in [docs/results/](results/README.md), one "
         "JSON object per row: edit the records, not this page. Each row gives its date, the commit measured and a "
         "footnote with its command; it ran on {machine} unless the footnote names another machine. A ratio compares "
         "times of one call only.")

STEPS = """## Training steps against the peer

The peer is the fastest of PyTorch's eager, `torch.compile` (model and optimiser step) and whole-step CUDA graph
(`torch.cuda.graph`) forms, each in its own process in the same call as ours (`tools/bench/bench_train_torch.py`).
Both train the same model on random data: bf16 forward, f32 master weights, channels-last ResNets, cross-entropy, SGD
with momentum 0.9, the f32 image cast to bf16 inside the step; median of 20 steps after 5 warm-up steps. Ours is
`bench_train`'s step-graph time (`train.cuda_graph: auto`). peer / ours above 1: ours is faster.

The LLaMA row is a full fine-tuning step (`tools/bench/bench_llama`, `tools/bench/bench_llama_torch.py`): random
token ids, f32 master weights, bf16 compute, cross-entropy in f32, AdamW (PyTorch's fused AdamW), median of 12 steps
after 4 warm-up; the peer is transformers' `LlamaForCausalLM` with SDPA attention; ours is the faster of our eager
step and step graph. Model FLOPs utilisation (PaLM count over 989 TFLOP/s dense bf16) and peak allocated memory:
ours {llama_mfu} and {llama_mem} GiB; {llama_peer}.
{lora_text}"""

PIPE_STEPS = """## Gradient pipelines: step time against our exact step

Each pipeline's step graph beside our exact step in the same call, every Linear and Conv2d through the pipeline.
"""

MEMORY = """## Memory

`peak allocated`: the allocator's peak over bench_train's eager steps; `saved by the forward`: allocated after the
forward minus before the step; `step graph memory`: the recorded step graph's high-water mark. A `_rc` pipeline
(`recompute_output` on every `mlp.fc1` and `attn.qkv`) is set beside `exact_rc`, exact with it. HLQ saves by keeping fewer inputs, not by compressing activations: a
layer whose input another op keeps or can rebuild exactly keeps nothing (docs/gradient_pipelines.md, Memory).
"""

ACCURACY = """## Accuracy per pipeline

Test top-1 after the last epoch, every Linear and Conv2d through the pipeline (HLQ with its low-precision conv
products; 15-epoch runs: `configs/fashion_mnist_resnet18{,_hlq,_luq,_lbp_wht}.yaml`). "vs exact" (points, in brackets):
against the exact run of the same call and seed. Metrics and configs: docs/runs/ (docs/runs/README.md).
"""

LANGUAGE_MODELS = """## Language models

Runs of the recipes in `configs/llm/` (docs/language_models.md): validation loss per token and its perplexity after
the last epoch, on the held-out documents the config names.
"""

LM_SWEEP = {"configs/llm/plans/moby_dick_pipelines.yaml": """\
**Fine-tuning through each gradient pipeline** (seeds 0 and 1): the SOTU model above, from its last checkpoint, on
Moby Dick (135 chapters, 10 % held out by `run.seed`), 2 epochs of 16 × 512-token batches, bf16, AdamW, cosine
schedule (`moby_dick_finetune_full.yaml`: every weight trains; `moby_dick_finetune_lora.yaml`: rank 16 on the seven
projections, base frozen; docs/language_models.md). The seven projections (`*_proj`) alone run the pipeline (under
LoRA only the frozen base's g_x products). "vs exact": (loss − exact's) / exact's. 8 runs at a time shared the GPU."""}

LM_RUNS_TEXT = """# Language-model sweep runs

Generated by `python3 tools/bench/results_page.py` from the `area: lm` records with a `plan` in
[docs/results/lm.jsonl](../lm.jsonl) (written by `tools/bench/lm_sweep_records.py`); the summary and what was run
are in [docs/BENCHMARKS.md](../../BENCHMARKS.md#language-models). The metrics files here are the runs' own
`metrics.jsonl`, named by run: training records every 4 steps (loss), eval records per epoch (validation loss and
perplexity). "vs exact, same seed" is relative: (loss − exact's) / exact's, exact of the same config and seed in
the same sweep. The curves below are drawn from the training records (top: loss; bottom: minus exact's at the same
step)."""

MULTI_GPU = ("`tools/bench/multi_gpu.sh` (docs/distributed.md): full fine-tuning steps of LLaMA shapes sharded by "
             "`dist.mode: fsdp` or replicated by `dist.mode: ddp` (`configs/llm/bench/`), random weights, bf16 compute; "
             "per-GPU batch {batch}; tokens/s after the warm-up. {peer}{estimate}")

KERNELS = """## Kernels

Our kernels against PyTorch's eager op in the same call (`tools/bench/bench_kernels_torch.py`). "fraction of copy":
bytes read and written over the time, over a same-dtype copy's bandwidth in the same call (about 4.2 TB/s).
"""


def render():
    """{path: text} of the page and the files it links to that the records give."""
    data = {a: load(a) for a in AREAS}
    one_gpu_per_table(data["kernels"], os.path.relpath(os.path.join(RESULTS, "kernels.jsonl"), ROOT))
    machines = {}
    for r in (r for recs in data.values() for r in recs):
        machines[r["machine"]] = machines.get(r["machine"], 0) + 1
    SHARED["machine"] = min(machines, key=lambda m: (-machines[m], m)) if machines else None
    intro = INTRO.replace("{machine}", SHARED["machine"]) if machines else INTRO.split(" Each row")[0]
    lines = HEADER.replace("{intro}", fill(intro)).split("\n")
    drawn = accuracy_curves(data["accuracy"])
    for text, body in ((steps_text(data["steps"]), steps_vs_peer(data["steps"])), (PIPE_STEPS, steps_vs_exact(data["steps"])),
                       (MEMORY, memory(data["memory"])), (ACCURACY, accuracy(data["accuracy"], drawn)),
                       (LANGUAGE_MODELS, language_models(data["lm"])),
                       (multi_gpu_text(data["multi_gpu"]), multi_gpu(data["multi_gpu"]) if data["multi_gpu"] else None),
                       (KERNELS, kernels(data["kernels"]))):
        if body is not None:  # a section with no records yet is left out
            lines += text.split("\n") + body + [""]
    files = {PAGE: "\n".join(lines).rstrip("\n") + "\n"}
    if any(r.get("plan") for r in data["lm"]):
        files[LM_RUNS] = lm_runs_page(data["lm"])
    files.update(results_lm.curves([r for r in data["lm"] if r.get("plan")], ROOT, CURVES))
    files.update({path: svg for path, (_, svg) in drawn.items()})
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/BENCHMARKS.md is out of date")
    ap.add_argument("--merge", nargs="+", metavar="FILE", help="merge these records into docs/results/ first")
    a = ap.parse_args()
    if a.merge:
        merge(a.merge)
    files = render()
    stale_curves = sorted(os.path.join(CURVES, f) for f in (os.listdir(CURVES) if os.path.isdir(CURVES) else [])
                          if f.endswith(".svg") and os.path.join(CURVES, f) not in files)
    if a.check:
        for path, text in files.items():
            current = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
            if current != text:
                fail(f"{os.path.relpath(path, ROOT)} is out of date: run python3 tools/bench/results_page.py")
        if stale_curves:
            fail(f"{', '.join(os.path.relpath(p, ROOT) for p in stale_curves)}: no record draws it any more: "
                 "run python3 tools/bench/results_page.py")
        return 0
    for path, text in files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    for path in stale_curves:
        os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
