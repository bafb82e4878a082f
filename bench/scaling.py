"""Scaling with cores: the ten reference workloads and the GEMM benchmark on a CPU device with
2, 4, 8, ... threads, the peers given the same number.

    python -m bench scaling [--threads 2,4,8,16] [--repeat R] [--json PATH]

Each thread count runs `python -m bench workloads --torch-only` and `python -m bench gemm --engine
clconv-cpu` in child processes, since thread pools are sized when a runtime starts: PoCL's
(POCL_MAX_PTHREAD_COUNT in PoCL 3.0, POCL_CPU_MAX_CU_COUNT in later releases; both are set),
PyTorch's and NumPy's BLAS's (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS). Reported
per thread count: the geometric mean of clconv / PyTorch CPU over the 30 passes, for a plan's
call with ``out=`` and for plain functional calls (PyTorch timed interleaved with clconv), and
the GEMMs' GFLOP/s (geometric mean over the shapes) of clconv's CPU kernel, of NumPy's matmul
and of the measured FMA peak.
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

THREAD_VARIABLES = ("POCL_MAX_PTHREAD_COUNT", "POCL_CPU_MAX_CU_COUNT", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "MKL_NUM_THREADS")


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def ten_summary(record):
    """{"plan_out", "functional"}: geometric means of clconv / PyTorch over the workloads' passes."""
    ratios = {"plan_out": [], "functional": []}
    for w in record["workloads"]:
        for p in w["passes"].values():
            torch = next(v["median_ms"] for k, v in p["peers"].items() if k.startswith("torch"))
            ratios["plan_out"].append(p["median_ms"] / torch)
            ratios["functional"].append(p["styles"]["functional"]["median_ms"] / torch)
    return {k: geomean(v) for k, v in ratios.items()} | {"passes": len(ratios["plan_out"])}


def gemm_summary(record):
    """GFLOP/s (geometric mean over the shapes) of each engine and NumPy, and the measured peak."""
    engines = record["shapes"][0]["engines"]
    return {e: geomean(s["engines"][e]["gflops"] for s in record["shapes"]) for e in engines} | \
        {"measured_peak": record["measured_peak_gflops"]}


def run(threads, repeat, scratch):
    env = dict(os.environ, **{v: str(threads) for v in THREAD_VARIABLES})
    ten, gemm = scratch / f"ten-{threads}.json", scratch / f"gemm-{threads}.json"
    for args in ([__package__, "workloads", "--torch-only", "--repeat", str(repeat), "--json", str(ten)],
                 [__package__, "gemm", "--engine", "clconv-cpu", "--repeat", str(max(3, repeat // 2)), "--json",
                  str(gemm)]):
        subprocess.run([sys.executable, "-m", *args], env=env, check=True, stdout=subprocess.DEVNULL)
    ten_record, gemm_record = json.loads(ten.read_text()), json.loads(gemm.read_text())
    return {"threads": threads, "device": ten_record["device"], "ten": ten_summary(ten_record),
            "gemm": gemm_summary(gemm_record), "ten_record": ten_record, "gemm_record": gemm_record}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench scaling", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="2,4,8,16", help="comma-separated thread counts (default 2,4,8,16)")
    ap.add_argument("--repeat", type=int, default=6, help="timed runs per pass (default 6)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'threads':>7}  {'plan out= / torch':>17}  {'plain / torch':>13}  {'clconv GEMM GF/s':>16}  "
          f"{'NumPy GF/s':>10}  {'peak GF/s':>9}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for threads in (int(t) for t in args.threads.split(",")):
            r = run(threads, args.repeat, Path(scratch))
            rows.append(r)
            print(f"{threads:7d}  {r['ten']['plan_out']:17.2f}  {r['ten']['functional']:13.2f}  "
                  f"{r['gemm']['clconv-cpu']:16.1f}  {r['gemm']['numpy']:10.1f}  {r['gemm']['measured_peak']:9.1f}",
                  flush=True)
            if args.json:   # (after every thread count: a run cut short keeps what it measured)
                Path(args.json).write_text(json.dumps({"date": datetime.date.today().isoformat(), "rows": rows},
                                                      indent=1))
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
