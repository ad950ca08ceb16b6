#!/usr/bin/env python3
"""Records of tools/bench/multi_gpu.sh: one JSON object per run, from a training run's metrics.jsonl and log or
from tools/bench/fsdp_torch.py's JSON line, and the summary at the end. Standard library only.

    multi_gpu_records.py ours  --run-dir DIR --log FILE --rc RC [--refused KEY] --warmup-steps W META...
    multi_gpu_records.py torch --jsonl FILE --log FILE --rc RC META...
    multi_gpu_records.py skip  --why TEXT META...
    multi_gpu_records.py equiv --a DIR --b DIR --tol T [--from-step S] META...
    multi_gpu_records.py finish --out DIR

META: --name --stage --model --gpus --impl --gather --pipeline --batch-per-gpu --seq --command (--mode, --note).
--mode says how the run is distributed: none (one process), fsdp, ddp (all-reduce during the backward), ddp-after
(after it), fsdp2 (PyTorch's); without it, none when --gather is none, else fsdp.
The first four append one record to OUT/all.jsonl (OUT: the folder holding --log, or --out). `finish` writes
OUT/multi_gpu.jsonl, the measured records in the results page's format (area multi_gpu, docs/results/README.md)
with date, commit and machine, and prints the summary table.

Our runs' numbers come from metrics.jsonl (the trainer's train records, rank 0's in DIR, rank r's in DIR/rank<r>)
and the run's log: the timed steps are the windows between records that start after --warmup-steps, timed by the
log lines of their records (log_times says why); the trainer's own `tok_per_s` over the same windows is kept as
trainer_tok_per_s. Per GPU: the global batch's tokens per second over the world size. Step time: the timed steps'
time over their count. Peak memory: the largest `gpu_peak_mb` of any rank (since the process started). Bytes on the wire: a train-record field whose name holds "bytes" when the trainer logs one; otherwise left
out, and `comm_bytes_est` gives the ring estimate per rank per step, (N - 1) / N * P * (gather bytes + reduce
bytes) for P parameters (the fsdp log line), one reduce-scatter and one all-gather of every parameter per step,
two all-gathers with reshard_after_forward on (the log line says which), every parameter in the all-gather dtype.
"""
import argparse
import datetime
import json
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_compare import commit, machine  # noqa: E402  (the results page's commit and machine strings)

DTYPE_BYTES = {"f32": 4, "fp32": 4, "bf16": 2, "int8": 1, "fp8": 1}
PARAMS = re.compile(r"dist: fsdp over (\d+) rank\(s\): .* (\d+) of (\d+) parameter elements per rank")
REDUCE = re.compile(r"reduce-scatter in (\w+)")
LOG_STEP = re.compile(r"^\[(\d\d):(\d\d):(\d\d)\.(\d{3})\] \[info\] epoch \d+/\d+ step (\d+) ", re.M)


def meta_args(ap):
    for k in ("name", "stage", "model", "impl", "gather", "pipeline", "command"):
        ap.add_argument(f"--{k}", required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--batch-per-gpu", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--mode", choices=("", "none", "fsdp", "ddp", "ddp-after", "fsdp2"), default="")
    ap.add_argument("--note", default="")


def meta(a):
    rec = {"run": a.name, "stage": a.stage, "model": a.model, "gpus": a.gpus, "impl": a.impl, "all_gather": a.gather,
           "pipeline": a.pipeline, "batch_per_gpu": a.batch_per_gpu, "seq": a.seq, "command": a.command,
           "mode": a.mode or ("none" if a.gather == "none" else "fsdp")}
    if a.note:
        rec["note"] = a.note
    return rec


def read_jsonl(path):
    out = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a cut-off last line of a killed run
    return out


def tail_error(log, refused_key=None, n=2):
    """What went wrong, from a run's log: the config reader's error on refused_key when there is one, else the
    last distinct lines that look like an error (every rank prints its own copy)."""
    if not os.path.exists(log):
        return "no log"
    lines = [l.strip() for l in open(log, encoding="utf-8", errors="replace") if l.strip()]
    if refused_key:
        hit = [l for l in lines if refused_key in l and ("unknown key" in l or "expected" in l)]
        if hit:
            return hit[0][-300:]
    errs = [l for l in lines if re.search(r"error|Error|refused|unknown|failed|out of memory|Traceback", l)]
    picked = []
    for l in reversed(errs or lines):
        if l not in picked:
            picked.insert(0, l)
        if len(picked) == n:
            break
    return " | ".join(picked)[-400:]


def status_of(rc, log, refused_key):
    if rc == 0:
        return "ok"
    if rc in (124, 137):
        return "timed out"
    text = open(log, encoding="utf-8", errors="replace").read() if os.path.exists(log) else ""
    if refused_key and any(refused_key in l and ("unknown key" in l or "expected" in l) for l in text.splitlines()):
        return "refused by this build"  # the config reader's error on the key or its value
    if "out of memory" in text.lower():
        return "out of memory"
    return f"failed (exit {rc})"


def append(out_dir, rec):
    with open(os.path.join(out_dir, "all.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def train_records(run_dir):
    """{rank: [train records]} for rank 0 (run_dir) and every rank<r>/ below it."""
    ranks = {0: [r for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if r.get("type") == "train"]}
    if os.path.isdir(run_dir):
        for d in os.listdir(run_dir):
            m = re.fullmatch(r"rank(\d+)", d)
            if m:
                ranks[int(m.group(1))] = [r for r in read_jsonl(os.path.join(run_dir, d, "metrics.jsonl"))
                                          if r.get("type") == "train"]
    return ranks


def log_times(log):
    """{step: seconds of the day} of each train log line (the first rank's copy). The trainer prints a record's
    line after reading the window's losses from the device, a synchronisation, so the time between two lines is
    the device's time for the steps between them. The trainer's own tok_per_s is measured before that read (the
    host may still be ahead of the device) and is kept beside it as trainer_tok_per_s."""
    out = {}
    for h, m, s, ms, step in LOG_STEP.findall(log):
        out.setdefault(int(step), int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1e3)
    return out


def ours(a):
    rec = meta(a)
    rec["status"] = status_of(a.rc, a.log, a.refused)
    if rec["status"] != "ok":
        rec["error"] = tail_error(a.log, a.refused)
        return rec
    ranks = train_records(a.run_dir)
    train = ranks[0]
    tokens = a.batch_per_gpu * a.gpus * a.seq  # the global batch of one step
    log = open(a.log, encoding="utf-8", errors="replace").read()
    stamps = log_times(log)
    prev, steps, seconds, trainer_seconds, mfu_sum, windows = 0, 0, 0.0, 0.0, 0.0, 0
    for r in train:
        n = r["step"] - prev
        if prev >= a.warmup_steps and n > 0 and r.get("tok_per_s", 0) > 0:
            steps += n
            trainer_seconds += n * tokens / r["tok_per_s"]
            mfu_sum += r.get("mfu", 0.0) / r["tok_per_s"]  # the trainer's mfu per token/s (a constant)
            windows += 1
            if stamps is not None and prev in stamps and r["step"] in stamps:
                seconds += (stamps[r["step"]] - stamps[prev]) % 86400  # past midnight
            else:
                stamps = None
        prev = r["step"]
    if steps == 0:
        rec["status"] = "no timed steps"
        rec["error"] = f"metrics.jsonl has no train record after step {a.warmup_steps}"
        return rec
    if not stamps or seconds <= 0:
        seconds = trainer_seconds
        rec["timing"] = "the trainer's tok_per_s (no log timestamps)"
    tok_s = steps * tokens / seconds
    rec.update(timed_steps=steps, tok_per_s=round(tok_s), tok_per_s_per_gpu=round(tok_s / a.gpus),
               step_ms=round(1e3 * seconds / steps, 2), trainer_tok_per_s=round(steps * tokens / trainer_seconds))
    if mfu_sum:  # the trainer's mfu is the global batch's: per GPU, over the world size
        rec["mfu_per_gpu"] = round(mfu_sum / windows * tok_s / a.gpus, 4)
    peaks = [r["gpu_peak_mb"] for recs in ranks.values() for r in recs if "gpu_peak_mb" in r]
    if peaks:
        rec["peak_allocated_gib"] = round(max(peaks) / 1024, 2)
    bytes_keys = sorted({k for r in train for k in r if "bytes" in k})
    for k in bytes_keys:
        rec[k] = train[-1].get(k)
    m, red = PARAMS.search(log), REDUCE.search(log)
    if m:
        p = int(m.group(3))
        rec["parameters"] = p
        gather = DTYPE_BYTES.get(a.gather)
        reduce_b = DTYPE_BYTES.get(red.group(1) if red else "f32")
        gathers = 2 if "reshard_after_forward on" in log else 1  # gathered again in backward
        rec["reshard_after_forward"] = gathers == 2
        if gather and reduce_b and a.gpus > 1:
            rec["comm_bytes_est"] = round((a.gpus - 1) / a.gpus * p * (gathers * gather + reduce_b))
    rec["losses"] = [[r["step"], round(r["loss"], 5)] for r in train]
    return rec


def torch_rec(a):
    rec = meta(a)
    lines = read_jsonl(a.jsonl)
    if a.rc != 0 or not lines:
        rec["status"] = status_of(a.rc or 1, a.log, None)
        rec["error"] = tail_error(a.log)
        return rec
    t = lines[-1]
    rec.update(status="ok", tok_per_s=t["tok_per_s"], tok_per_s_per_gpu=t["tok_per_s_per_gpu"],
               step_ms=t["ms_per_step"], peak_allocated_gib=t["peak_allocated_gib"], mfu_per_gpu=t["mfu_per_gpu"],
               parameters=t["parameters"], timed_steps=t["steps"], torch=t["torch"])
    if t.get("wrap", "fsdp2") == "ddp":
        if a.gpus > 1:  # one ring all-reduce of every f32 gradient: 2 (N - 1) / N of its bytes
            rec["comm_bytes_est"] = round(2 * (a.gpus - 1) / a.gpus * t["parameters"] * 4)
        return rec
    rec["reshard_after_forward"] = t["reshard_after_forward"]
    if a.gpus > 1:  # bf16 all-gathers (twice with resharding), f32 reduce-scatter
        rec["comm_bytes_est"] = round((a.gpus - 1) / a.gpus * t["parameters"] * (2 * (1 + t["reshard_after_forward"]) + 4))
    return rec


def equiv(a):
    rec = meta(a)
    la = {r["step"]: r["loss"] for r in train_records(a.a)[0]}
    lb = {r["step"]: r["loss"] for r in train_records(a.b)[0]}
    common = sorted(s for s in set(la) & set(lb) if s >= a.from_step)
    if not common:
        rec.update(status="failed", error=f"no common logged step (>= {a.from_step}) in {a.a} and {a.b}")
        return rec
    rel = max(abs(la[s] - lb[s]) / max(abs(la[s]), 1e-12) for s in common)
    rec.update(status="ok" if rel <= a.tol else "mismatch", max_rel_diff=float(f"{rel:.3g}"), tolerance=a.tol,
               steps_compared=len(common),
               losses=[[s, round(la[s], 6), round(lb[s], 6)] for s in common])
    return rec


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def finish(a):
    recs = read_jsonl(os.path.join(a.out, "all.jsonl"))
    common = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
              "commit": commit(), "machine": os.environ.get("HADATRAIN_MACHINE") or machine()}
    measured = []
    for r in recs:
        if r["status"] in ("ok", "mismatch"):
            out = {"area": "multi_gpu"}
            out.update({k: v for k, v in r.items() if k != "losses" or r["stage"] == "equivalence"})
            out.update(common)
            measured.append(out)
    name = "multi_gpu.smoke.jsonl" if a.smoke else "multi_gpu.jsonl"  # CPU smoke numbers are not results
    with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
        for r in measured:
            f.write(json.dumps(r) + "\n")
    # tokens/s per GPU against the one-process run (all_gather none) of the same stage, model, implementation and
    # pipeline in this folder
    one = {(r["stage"], r["model"], r["impl"], r["pipeline"]): r.get("tok_per_s_per_gpu")
           for r in recs if r["all_gather"] == "none" and r["status"] == "ok"}
    print(f"\n== multi_gpu summary ({common['machine']}; commit {common['commit']}) ==")
    head = f"{'run':<30} {'gpus':>4} {'model':<14} {'impl':<20} {'mode':<9} {'gather':<6} {'status':<22} {'tok/s/GPU':>9} " \
           f"{'vs 1proc':>8} {'step ms':>8} {'peak GiB':>8} {'MB/step':>8} {'MFU':>6}"
    print(head)
    for r in recs:
        st = r["status"]
        if r["stage"] == "equivalence":
            st = f"{st} {fmt(r.get('max_rel_diff'), '.2g')}/{r.get('tolerance', '-')}" if "max_rel_diff" in r else st
        base = one.get((r["stage"], r["model"], r["impl"], r["pipeline"]))
        eff = f"{r['tok_per_s_per_gpu'] / base:.3f}" if base and r.get("tok_per_s_per_gpu") else "-"
        wire = r.get("comm_bytes_per_step") or next((r[k] for k in r if "bytes" in k and k != "comm_bytes_est"), None)
        wire_txt = fmt(wire / 1e6, ".4g") if isinstance(wire, (int, float)) else (
            fmt(r["comm_bytes_est"] / 1e6, ".4g") + "e" if "comm_bytes_est" in r else "-")
        pipe = r["impl"] + ("" if r["pipeline"] == "exact" else f" {r['pipeline']}")
        print(f"{r['run']:<30} {r['gpus']:>4} {r['model']:<14} {pipe[:20]:<20} {r.get('mode', '-'):<9} "
              f"{r['all_gather']:<6} {st[:22]:<22} "
              f"{fmt(r.get('tok_per_s_per_gpu'), '.0f'):>9} {eff:>8} {fmt(r.get('step_ms'), '.1f'):>8} "
              f"{fmt(r.get('peak_allocated_gib'), '.1f'):>8} {wire_txt:>8} {fmt(r.get('mfu_per_gpu'), '.3f'):>6}")
        if r.get("error"):
            print(f"    {r['error'][:200]}")
    print("vs 1proc: tokens/s per GPU over the one-process run's (all-gather none) of the same pipeline in this call; "
          "MB/step: bytes on the wire per rank per step as the trainer logs it, 'e': the ring estimate")
    print(f"records: {a.out}/all.jsonl (every run), {a.out}/{name} (measured" +
          (", CPU smoke: not for the results page)" if a.smoke else ", for python3 tools/bench/results_page.py --merge)"))
    if common["commit"] == "unknown":
        print("multi_gpu: no git tree and no $HADATRAIN_COMMIT: results_page.py refuses commit 'unknown'")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("ours")
    meta_args(o)
    o.add_argument("--run-dir", required=True)
    o.add_argument("--log", required=True)
    o.add_argument("--rc", type=int, required=True)
    o.add_argument("--refused", help="a config key: a failed run whose log names it was refused by the build")
    o.add_argument("--warmup-steps", type=int, required=True)
    t = sub.add_parser("torch")
    meta_args(t)
    t.add_argument("--jsonl", required=True)
    t.add_argument("--log", required=True)
    t.add_argument("--rc", type=int, required=True)
    s = sub.add_parser("skip")
    meta_args(s)
    s.add_argument("--why", required=True)
    s.add_argument("--out", required=True)
    e = sub.add_parser("equiv")
    meta_args(e)
    e.add_argument("--a", required=True, help="the reference run's folder")
    e.add_argument("--b", required=True)
    e.add_argument("--tol", type=float, required=True, help="largest relative loss difference per step")
    e.add_argument("--from-step", type=int, default=1)
    e.add_argument("--out", required=True)
    f = sub.add_parser("finish")
    f.add_argument("--out", required=True)
    f.add_argument("--smoke", action="store_true", help="a --cpu-smoke run: write multi_gpu.smoke.jsonl instead")
    a = ap.parse_args()
    if a.cmd == "finish":
        return finish(a)
    if a.cmd == "skip":
        rec = meta(a)
        rec.update(status="skipped", error=a.why)
        out_dir = a.out
    elif a.cmd == "equiv":
        rec, out_dir = equiv(a), a.out
    else:
        rec = ours(a) if a.cmd == "ours" else torch_rec(a)
        out_dir = os.path.dirname(os.path.dirname(os.path.abspath(a.log)))  # OUT/logs/NAME.log
    append(out_dir, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
