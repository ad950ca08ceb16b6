#!/usr/bin/env python3
"""tools/bench/ncu_summary.py on a made-up Nsight Compute CSV: launches of one kernel and grid are averaged into one
line in the order of their first launch (the same kernel on another grid is another line), thread instructions are
warp instructions × 32, the DRAM rate is bytes over duration, and a row in other units than the base ones is
refused with its row named."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import ncu_summary  # noqa: E402

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def rows(launch_id, kernel, grid, ns, warp_inst, read, write, time_unit="ns"):
    values = {"gpu__time_duration.sum": (time_unit, ns), "smsp__inst_executed.sum": ("inst", warp_inst),
              "smsp__issue_active.avg.pct_of_peak_sustained_active": ("%", 80),
              "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", 50),
              "dram__bytes_read.sum": ("byte", read), "dram__bytes_write.sum": ("byte", write)}
    return "".join(f'"{launch_id}","1","bench","host","void ns::<unnamed>::{kernel}(Args, int)","1","7","(256, 1, 1)","{grid}",'
                   f'"0","9.0","Command line profiler metrics","{m}","{u}","{v:,}"\n' for m, (u, v) in values.items())


def write(text):
    f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
    f.write("==PROF== Connected to process 1\n" + text)
    f.close()
    return f.name


def run_script(path):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench", "ncu_summary.py"), path],
                          capture_output=True, text=True)


def main():
    path = write(HEADER + rows(0, "rows_kernel<4096>", "(8192, 1, 1)", 60000, 1_000_000, 64_000_000, 8_000_000)
                 + rows(1, "transpose_kernel", "(64, 64, 1)", 10000, 100_000, 1_000_000, 1_000_000)
                 + rows(2, "rows_kernel<4096>", "(8192, 1, 1)", 80000, 1_000_000, 64_000_000, 8_000_000)
                 + rows(3, "rows_kernel<4096>", "(14336, 1, 1)", 100000, 2_000_000, 112_000_000, 14_000_000))
    got = ncu_summary.summary(path)
    assert [(r["kernel"], r["grid"], r["launches"]) for r in got] == [
        ("rows_kernel<4096>", "(8192, 1, 1)", 2), ("transpose_kernel", "(64, 64, 1)", 1),
        ("rows_kernel<4096>", "(14336, 1, 1)", 1)], got
    first = got[0]
    assert abs(first["us"] - 70.0) < 1e-9, first  # the mean of 60 and 80 µs
    assert abs(first["thread_inst_M"] - 32.0) < 1e-9, first  # 1 M warp instructions × 32
    assert abs(first["dram_TB_per_s"] - 72e6 / 70e3 / 1e3) < 1e-12, first  # 72 MB in 70 µs: 1.03 TB/s
    assert abs(got[1]["dram_TB_per_s"] - 0.2) < 1e-12, got[1]  # 2 MB in 10 µs
    out = run_script(path)
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 3, out
    bad = write(HEADER + rows(0, "rows_kernel<4096>", "(8192, 1, 1)", 60, 1, 1, 1, time_unit="usecond"))
    out = run_script(bad)
    assert out.returncode != 0 and "row 2" in out.stderr and "usecond" in out.stderr, out
    for p in (path, bad):
        os.unlink(p)
    print("ncu_summary: ok")


if __name__ == "__main__":
    main()
