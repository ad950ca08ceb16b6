#!/usr/bin/python3
"""Turns the metrics.jsonl of one or more runs into PNG curves, one line per run, for comparing runs
(e.g. gradient pipelines). Uses Debian's python3-matplotlib (installed by tools/setup.sh).

    tools/plot_metrics.py --out curves.png runs/a/metrics.jsonl runs/b/metrics.jsonl [--label a --label b]

The figure has three panels, all against the optimiser step: training loss (the `train` records), test loss, and
test top-1 accuracy for image runs or validation perplexity for language-model runs (the `eval` records: those of
epoch ends and those of `train.eval_every_steps`). A run with a weight average (config `ema`) adds its figures as
dashed lines. A run directory may be given instead of its metrics.jsonl.
"""
import argparse
import json
import math
import os
import sys


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    train, evals = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"error: {path}:{lineno}: not a JSON object ({e.msg})")
            kind = rec.get("type")
            if kind == "train" and rec.get("loss") is not None:
                train.append((rec["step"], rec["loss"]))
            elif kind == "eval":
                evals.append(rec)
    if not train and not evals:
        sys.exit(f"error: {path}: no train or eval records")
    return path, train, evals


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="metrics.jsonl files or run directories")
    ap.add_argument("--out", required=True, help="output PNG")
    ap.add_argument("--label", action="append", default=[], help="legend label per run (default: run directory)")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    if args.label and len(args.label) != len(args.runs):
        sys.exit(f"error: {len(args.label)} --label values for {len(args.runs)} runs")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("error: matplotlib is missing: install Debian's python3-matplotlib (tools/setup.sh does)")

    runs = [load(run) for run in args.runs]
    # The third panel: top-1 for image runs, perplexity for language-model runs (their eval records hold test_ppl).
    has_acc = any(e.get("test_acc") is not None for _, _, evals in runs for e in evals)
    key, scale, title3, ylabel3 = (("test_acc", 100.0, "test top-1", "accuracy (%)") if has_acc else
                                   ("test_ppl", 1.0, "validation perplexity", "perplexity"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, (path, train, evals) in enumerate(runs):
        label = args.label[i] if args.label else os.path.basename(os.path.dirname(os.path.abspath(path)))
        if train:
            axes[0].plot([s for s, _ in train], [l for _, l in train], label=label, linewidth=1)
        color = None  # the run's colour; its weight average is drawn dashed in the same colour
        for prefix, style, suffix in (("", "-", ""), ("ema_", "--", " (weight average)")):
            ev = [e for e in evals if e.get(prefix + "test_loss") is not None]
            if ev:
                line = axes[1].plot([e["step"] for e in ev], [e[prefix + "test_loss"] for e in ev], style, marker="o",
                                    label=label + suffix, color=color)
                color = line[0].get_color()
                pts = [(e["step"], scale * e[prefix + key]) for e in ev if e.get(prefix + key) is not None]
                if pts:
                    axes[2].plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", label=label + suffix,
                                 color=color)
    for ax, title, xl, yl in ((axes[0], "training loss", "step", "loss"), (axes[1], "test loss", "step", "loss"),
                              (axes[2], title3, "step", ylabel3)):
        ax.set_title(title)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
