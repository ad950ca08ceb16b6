#!/usr/bin/env python3
"""tools/bench/llama_steps.py against a made-up bench_llama that prints bench_llama's report lines: the rounds'
order (exact, then each pipeline, again), the records' means, the same-call exact time, the largest peak, and the
refusals: a process that fails, or one that records no step graph, leaves no records and exits 1. Each record
passes results_page.py's check (what --merge accepts)."""
import json
import os
import stat
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "bench", "llama_steps.py")
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import results_page  # noqa: E402  (its record check: what --merge accepts)

# The fake: its k-th call (k from 1, counted in CALLS) prints a step graph of BASE[pipeline] + k ms and an eager
# step 1 ms slower, MFU 0.5 + k/1000, peak 40 + k GiB; FAIL_AT=k exits 3 at call k, NO_GRAPH_AT=k prints
# bench_llama's "step graph: not used" line instead of the step-graph line.
FAKE = r'''#!/usr/bin/env python3
import os, sys
preset, batch, seq, pipeline = sys.argv[1:5]
lora = " lora" if sys.argv[5:] == ["--lora"] else ""
calls = os.environ["CALLS"]
k = (int(open(calls).read()) if os.path.exists(calls) else 0) + 1
open(calls, "w").write(str(k))
with open(os.environ["ORDER"], "a") as f:
    f.write(pipeline + "\n")
if os.environ.get("FAIL_AT") == str(k):
    sys.exit(3)
base = {"exact": 270.0, "halo2_fp8": 280.0, "hlq": 250.0, "halo2_fp8_precise": 290.0}[pipeline]
ms = base + k
tok = int(batch) * int(seq) / ms * 1000.0
print(f"bench_llama: {preset}, 1.236 B parameters, 1.236 B trainable")
print(f"hadatrain {preset} batch {batch}x{seq} {pipeline}{lora}, eager: {ms + 1:.2f} ms/step, {tok:.0f} tok/s, "
      f"MFU {0.5 + k / 1000:.3f}, peak allocated {44 + k:.2f} GiB")
if os.environ.get("NO_GRAPH_AT") == str(k):
    print("  step graph: not used: a host synchronisation while recording")
    sys.exit(0)
print(f"hadatrain {preset} batch {batch}x{seq} {pipeline}{lora}, step graph: {ms:.2f} ms/step, {tok:.0f} tok/s, "
      f"MFU {0.5 + k / 1000:.3f}, peak allocated {40 + k:.2f} GiB")
'''


def run(d, *args, **env):
    e = dict(os.environ, CALLS=os.path.join(d, "calls"), ORDER=os.path.join(d, "order"), HADATRAIN_COMMIT="abc1234")
    e.update(env)
    for f in ("calls", "order"):
        if os.path.exists(os.path.join(d, f)):
            os.remove(os.path.join(d, f))
    out = os.path.join(d, "steps.jsonl")
    if os.path.exists(out):
        os.remove(out)
    p = subprocess.run([sys.executable, SCRIPT, os.path.join(d, "build"), out] + list(args), env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    order = open(os.path.join(d, "order")).read().split() if os.path.exists(os.path.join(d, "order")) else []
    recs = [json.loads(l) for l in open(out)] if os.path.exists(out) else None
    return p.returncode, p.stdout, order, recs


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def main():
    with tempfile.TemporaryDirectory() as d:
        tools = os.path.join(d, "build", "tools")
        os.makedirs(tools)
        fake = os.path.join(tools, "bench_llama")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)

        rc, out, order, recs = run(d, "halo2_fp8", "hlq", "--runs", "2")
        check(rc == 0, f"exit {rc}: {out}")
        check(order == ["exact", "halo2_fp8", "hlq"] * 2, f"order {order}")
        check(recs is not None and [r["pipeline"] for r in recs] == ["halo2_fp8", "hlq"], f"records {recs}")
        h, q = recs
        # calls: exact 1, halo 2, hlq 3, exact 4, halo 5, hlq 6
        check(h["exact_ms"] == 272.5 and q["exact_ms"] == 272.5, f"exact_ms {h['exact_ms']}")  # (271 + 274) / 2
        check(h["ours_ms"] == 283.5 and h["ours_eager_ms"] == 284.5, f"halo ms {h['ours_ms']} {h['ours_eager_ms']}")
        check(q["ours_ms"] == 254.5, f"hlq ms {q['ours_ms']}")  # (253 + 256) / 2
        check(h["ours_peak_allocated_gib"] == 45.0 and q["ours_peak_allocated_gib"] == 46.0, "largest step-graph peak")
        check(h["ours_mfu"] == round((0.502 + 0.505) / 2, 3), f"mfu {h['ours_mfu']}")
        check(h["ours_tok_per_s"] == round(8 * 2048 / 0.2835), f"tok/s {h['ours_tok_per_s']}")
        for r in recs:
            results_page.check(r, "llama_steps record")  # exits with the reason on a record --merge would refuse
            check(r["area"] == "steps" and r["model"] == "llama32_1b" and r["batch"] == 8 and r["seq"] == 2048, "keys")
            check(r["ours_form"] == "step graph" and r["runs"] == 2 and r["commit"] == "abc1234", "fields")
            check(r["command"].startswith("python3 tools/bench/llama_steps.py ") and "--runs 2" in r["command"],
                  f"command {r['command']}")
            check(len(r["processes"]) == 2 and r["processes"][0].endswith("bench_llama llama32_1b 8 2048 exact"),
                  f"processes {r['processes']}")

        rc, out, order, recs = run(d, "halo2_fp8", "--preset", "llama3_8b", "--batch", "4", "--lora", "--runs", "1")
        check(rc == 0 and recs is not None and len(recs) == 1, f"--lora: exit {rc}: {out}")
        r = recs[0]
        results_page.check(r, "llama_steps --lora record")
        check(r["model"] == "llama3_8b_lora" and r["batch"] == 4 and r["exact_ms"] == 271.0 and r["ours_ms"] == 282.0,
              f"--lora record {r}")
        check(r["processes"] == [f"{d}/build/tools/bench_llama llama3_8b 4 2048 exact --lora",
                                 f"{d}/build/tools/bench_llama llama3_8b 4 2048 halo2_fp8 --lora"], f"{r['processes']}")

        # a shorthand name gets the label of what it sets (the page shows it beside the name); a plain one none
        check("label" not in recs[0], f"label of halo2_fp8: {recs[0].get('label')}")
        rc, out, order, recs = run(d, "halo2_fp8_precise", "--runs", "1")
        check(rc == 0 and recs is not None and recs[0].get("label") == "fp8_accumulation: precise",
              f"halo2_fp8_precise's label: exit {rc}, {recs}")
        results_page.check(recs[0], "llama_steps labelled record")

        rc, out, order, recs = run(d, "halo2_fp8", "--runs", "2", FAIL_AT="3")
        check(rc == 1 and recs is None and "exit 3" in out, f"a failing process: exit {rc}, {recs}, {out}")
        check(order == ["exact", "halo2_fp8", "exact"], f"stops at the failure: {order}")

        rc, out, order, recs = run(d, "halo2_fp8", "--runs", "1", NO_GRAPH_AT="2")
        check(rc == 1 and recs is None, f"no step graph: exit {rc}, {recs}")
        check("no step-graph line (a host synchronisation while recording)" in out, out)

        rc, out, _, _ = run(d, "exact")
        check(rc != 0 and "besides exact" in out, f"only exact: {out}")
    print("llama_steps: ok")


if __name__ == "__main__":
    main()
