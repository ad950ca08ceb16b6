#!/usr/bin/env python3
"""One line per kernel from Nsight Compute's CSV: what a memory pass spends its time on.

    ncu --clock-control none --cache-control none --csv --print-units base --metrics METRICS ... > ncu.csv
    python3 tools/bench/ncu_summary.py ncu.csv
    python3 tools/bench/ncu_summary.py --metrics     # METRICS, comma-separated: what to pass to ncu

METRICS are those of `METRICS` below (run_benchmarks.sh's halo_kernels group passes them). Launches of one kernel
with one grid are one line, in the order of their first launch (a kernel with a persistent grid run on two operands,
such as the absmax passes of x and W, is one line: its figures are then a mean over both), with the launches, the
mean duration, the thread instructions (warp instructions × 32), the share of cycles in which a scheduler issued
(issue-bound passes sit near the top), the achieved occupancy, and the DRAM bytes read and written with the rate
they make. The figures are each launch's own; `--print-units base` keeps them in nanoseconds and bytes, which this
script expects (it refuses other units, naming the row). Names lose their return type, namespaces and parameters.
"""
import collections
import csv
import re
import sys

METRICS = ("gpu__time_duration.sum", "smsp__inst_executed.sum",
           "smsp__issue_active.avg.pct_of_peak_sustained_active",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "dram__bytes_read.sum", "dram__bytes_write.sum")
# ncu 2025's base units are spelt "ns" and "byte" (older releases wrote "nsecond")
BASE_UNITS = {"gpu__time_duration.sum": ("ns", "nsecond"), "dram__bytes_read.sum": ("byte",),
              "dram__bytes_write.sum": ("byte",)}


def short_name(kernel):
    """A kernel's name without its return type, namespaces and parameters, its template arguments kept:
    "void ns::<unnamed>::square_kernel<4096, 2>(Args, Out)" -> "square_kernel<4096, 2>"."""
    # an anonymous namespace: "(anonymous namespace)::", or ncu's "<unnamed>::" (seen in its CSV also as "unnamed>::")
    kernel = re.sub(r"\(anonymous namespace\)::|<?unnamed>::", "", kernel)
    head, sep, targs = kernel.split("(")[0].partition("<")
    return head.split("::")[-1].split(" ")[-1] + sep + targs


def launches(path):
    """{launch ID: {"kernel", "grid", metric: value}} from ncu's CSV (its lines before the header are log lines)."""
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    out = collections.OrderedDict()
    for n, row in enumerate(csv.DictReader(lines), start=2):
        name, unit = row["Metric Name"], row["Metric Unit"]
        if name in BASE_UNITS and unit not in BASE_UNITS[name]:
            sys.exit(f"{path}: CSV row {n}: {name} in {unit!r}, expected {' or '.join(map(repr, BASE_UNITS[name]))} "
                     "(run ncu with --print-units base)")
        launch = out.setdefault(row["ID"], {"kernel": short_name(row["Kernel Name"]), "grid": row["Grid Size"]})
        launch[name] = float(row["Metric Value"].replace(",", ""))
    return out


def summary(path):
    groups = collections.OrderedDict()
    for launch in launches(path).values():
        groups.setdefault((launch["kernel"], launch["grid"]), []).append(launch)
    rows = []
    for (kernel, grid), ls in groups.items():
        mean = {m: sum(x.get(m, 0.0) for x in ls) / len(ls) for m in METRICS}
        ns = mean["gpu__time_duration.sum"]
        dram = mean["dram__bytes_read.sum"] + mean["dram__bytes_write.sum"]
        rows.append({"kernel": kernel, "grid": grid, "launches": len(ls), "us": ns / 1e3,
                     "thread_inst_M": mean["smsp__inst_executed.sum"] * 32 / 1e6,
                     "issue_pct": mean["smsp__issue_active.avg.pct_of_peak_sustained_active"],
                     "occupancy_pct": mean["sm__warps_active.avg.pct_of_peak_sustained_active"],
                     "dram_read_MB": mean["dram__bytes_read.sum"] / 1e6,
                     "dram_write_MB": mean["dram__bytes_write.sum"] / 1e6,
                     "dram_TB_per_s": dram / ns / 1e3 if ns else 0.0})
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_summary.py NCU_CSV | --metrics")
    if sys.argv[1] == "--metrics":
        print(",".join(METRICS))
        return
    for r in summary(sys.argv[1]):
        print(f"{r['kernel'][:40]:40s} grid {r['grid']:>15s} x{r['launches']:<3d} {r['us']:8.1f} us  "
              f"{r['thread_inst_M']:8.1f} M inst  issue {r['issue_pct']:5.1f} %  occupancy {r['occupancy_pct']:5.1f} %  "
              f"DRAM {r['dram_read_MB']:7.1f} MB read {r['dram_write_MB']:7.1f} MB written {r['dram_TB_per_s']:5.2f} TB/s")


if __name__ == "__main__":
    main()
