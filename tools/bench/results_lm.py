"""The language-model parts of the results page (tools/bench/results_page.py): the sweep summary, the per-run page
docs/results/lm_runs/README.md and the training-loss curves in docs/results/curves/, drawn as plain SVG text.

A sweep record is an `area: lm` record with a `plan` (tools/bench/lm_sweep_records.py writes them); the others
(a single run such as the SOTU pre-training) keep the plain table. Everything here depends on the records and the
metrics files they name only, so two runs write the same bytes.
"""
import json
import math
import os

RECIPE_NAMES = {"configs/llm/moby_dick_finetune_full.yaml": "full fine-tuning",
                "configs/llm/moby_dick_finetune_lora.yaml": "LoRA"}
# Colour and dash of each pipeline's line: HALO levels by colour, carriers by dash (int8 solid, fp8 dashed).
STYLES = {"exact": ("#000000", ""), "hlq": ("#d62728", ""),
          "halo0_int8": ("#1f77b4", ""), "halo0_fp8": ("#1f77b4", "6 4"),
          "halo1_int8": ("#2ca02c", ""), "halo1_fp8": ("#2ca02c", "6 4"),
          "halo2_int8": ("#9467bd", ""), "halo2_fp8": ("#9467bd", "6 4")}
EXTRA_COLOURS = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#ff7f0e")


def pipeline_order(p):
    """exact, hlq, then HALO by level and carrier (int8 before fp8), each followed by its variants with options set
    (`hlq (rank: full)` after hlq), then anything else by name."""
    base = p.split(" (", 1)[0]
    if base in STYLES:
        return (list(STYLES).index(base), p != base, p)
    return (len(STYLES), True, p)


def recipe_name(recipe):
    return RECIPE_NAMES.get(recipe, recipe)


def stem(recipe):
    return os.path.splitext(os.path.basename(recipe))[0]


def rel(v, ref):
    return f"{100 * (v - ref) / ref:+.3f} %"


def curve_name(recipe, seed):
    return f"lm_{stem(recipe)}_seed{seed}.svg"


def train_losses(path):
    """[(step, loss)] of a metrics file's training records (one per step: the last line for a step wins)."""
    by_step = {}
    for line in open(path, encoding="utf-8"):
        if '"train"' in line:
            rec = json.loads(line)
            if rec.get("type") == "train" and "loss" in rec:
                by_step[rec["step"]] = rec["loss"]
    return sorted(by_step.items())


def nice_ticks(lo, hi, n=6):
    """Ticks at a multiple of 1, 2, 2.5 or 5 × 10^k covering [lo, hi] with about n intervals; returns the ticks
    and the decimals their labels need."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0) * 1e-3
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = [k * step for k in range(first, last + 1)]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) + (1 if round(step / mag, 6) == 2.5 else 0)
    return ticks, decimals


def fmt(v):
    return f"{v:.1f}"


def style_map(names):
    """{pipeline: (colour, dash)}: STYLES' entry, else the next of EXTRA_COLOURS (solid)."""
    extra, out = iter(EXTRA_COLOURS), {}
    for n in names:
        out[n] = STYLES.get(n) or (next(extra, "#7f7f7f"), "")
    return out


def panel(out, box, series, styles, xlabel, ylabel):
    """A line plot of series [(pipeline, [(x, y)])] into box (left, top, width, height): frame, grid, ticks with
    labels, axis labels; styles from style_map."""
    left, top, w, h = box
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    xt, xd = nice_ticks(min(xs), max(xs), 7)
    yt, yd = nice_ticks(min(ys), max(ys), 5)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]
    px = lambda x: left + (x - x0) / (x1 - x0) * w
    py = lambda y: top + h - (y - y0) / (y1 - y0) * h
    for t in xt:
        out.append(f'<line x1="{fmt(px(t))}" y1="{top}" x2="{fmt(px(t))}" y2="{top + h}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{fmt(px(t))}" y="{top + h + 16}" text-anchor="middle">{t:.{xd}f}</text>')
    for t in yt:
        out.append(f'<line x1="{left}" y1="{fmt(py(t))}" x2="{left + w}" y2="{fmt(py(t))}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{left - 6}" y="{fmt(py(t) + 4)}" text-anchor="end">{t:.{yd}f}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#404040"/>')
    out.append(f'<text x="{fmt(left + w / 2)}" y="{top + h + 34}" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text x="{left - 58}" y="{fmt(top + h / 2)}" text-anchor="middle" '
               f'transform="rotate(-90 {left - 58} {fmt(top + h / 2)})">{ylabel}</text>')
    for name, pts in series:
        colour, dash = styles[name]
        d = " ".join(f"{fmt(px(x))},{fmt(py(y))}" for x, y in pts)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="1.6"{dash_attr}/>')


def curve_svg(title, series):
    """The training loss of each pipeline (top) and its difference from exact's at the same step (bottom, when
    an exact series is there)."""
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="800" height="560" viewBox="0 0 800 560" '
           'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
           '<rect width="800" height="560" fill="#ffffff"/>',
           f'<text x="360" y="22" text-anchor="middle" font-size="14">{title}</text>']
    styles = style_map([name for name, _ in series])
    panel(out, (80, 40, 560, 280), series, styles, "step", "training loss")
    exact = dict(next((pts for name, pts in series if name == "exact"), []))
    diffs = [(name, [(x, y - exact[x]) for x, y in pts if x in exact]) for name, pts in series]
    if exact:
        panel(out, (80, 390, 560, 120), diffs, styles, "step", "minus exact's")
    for i, (name, _) in enumerate(series):
        colour, dash = styles[name]
        y = 50 + 20 * i
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="656" y1="{y}" x2="686" y2="{y}" stroke="{colour}" stroke-width="2"{dash_attr}/>')
        out.append(f'<text x="692" y="{y + 4}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def sweep_groups(recs):
    """{(recipe, seed): [record, ...] in pipeline order} of the sweep records."""
    groups = {}
    for r in recs:
        groups.setdefault((r["recipe"], r["seed"]), []).append(r)
    return {k: sorted(v, key=lambda r: pipeline_order(r["pipeline"])) for k, v in sorted(groups.items())}


def curves(recs, root, curves_dir):
    """{path: SVG text}: per recipe and seed, the training loss of every pipeline's run that has a metrics file."""
    files = {}
    for (recipe, seed), group in sweep_groups(recs).items():
        series = [(r["pipeline"], train_losses(os.path.join(root, r["metrics"]))) for r in group if r.get("metrics")]
        series = [(n, pts) for n, pts in series if pts]
        if series:
            title = f"{recipe_name(recipe)}, seed {seed}: training loss ({stem(recipe)})"
            files[os.path.join(curves_dir, curve_name(recipe, seed))] = curve_svg(title, series)
    return files


def summary(recs):
    """Per pipeline (rows) and recipe (column pairs): the mean over seeds of the final validation loss and its
    relative difference from exact's mean over the same seeds."""
    recipes = sorted({r["recipe"] for r in recs})
    pipelines = sorted({r["pipeline"] for r in recs}, key=pipeline_order)
    head, rows = ["pipeline"], []
    for rc in recipes:
        head += [f"{recipe_name(rc)}: validation loss, mean of seeds", f"{recipe_name(rc)}: vs exact's mean"]
    for p in pipelines:
        row = [p]
        for rc in recipes:
            mine = {r["seed"]: r["val_loss"] for r in recs if r["recipe"] == rc and r["pipeline"] == p}
            exact = {r["seed"]: r["val_loss"] for r in recs if r["recipe"] == rc and r["pipeline"] == "exact"}
            if not mine:
                row += ["—", "—"]
                continue
            m = sum(mine.values()) / len(mine)
            seeds = ",".join(str(s) for s in sorted(mine))
            cell = f"{m:.4f}" + ("" if len(mine) == 2 else f" (seeds {seeds})")
            if p == "exact":
                vs = "(reference)"
            elif set(mine) <= set(exact):
                e = sum(exact[s] for s in mine) / len(mine)
                vs = rel(m, e)
            else:
                vs = "no exact run of these seeds"
            row += [cell, vs]
        rows.append(row)
    return head, rows


def per_run_rows(recs, page_dir, root, measured):
    """Per recipe: (recipe, rows) of the per-run table, pipelines in order, seeds within."""
    out = []
    for rc in sorted({r["recipe"] for r in recs}):
        rows = []
        for r in sorted((r for r in recs if r["recipe"] == rc), key=lambda r: (pipeline_order(r["pipeline"]), r["seed"])):
            e = r.get("exact_val_loss")
            vs = "(reference)" if r["pipeline"] == "exact" else (rel(r["val_loss"], e) if e else "no exact run")
            by_epoch = ", ".join(f"{ep}: {v:.4f}" for ep, v in r.get("val_loss_by_epoch", []))
            m = (f"[metrics]({os.path.relpath(os.path.join(root, r['metrics']), page_dir)})" if r.get("metrics")
                 else "—")
            rows.append([r["pipeline"], str(r["seed"]), f"{r['val_loss']:.4f}", f"{r['val_ppl']:.3f}", vs,
                         str(r.get("steps", "—")), by_epoch or "—", m, measured(r)])
        out.append((rc, rows))
    return out
