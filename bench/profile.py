"""Where each pass spends its device time: OpenCL profiling events per kernel.

    python -m bench profile [--workload NAME ...] [--size cpu|gpu] [--algorithm NAME]

Runs every pass once to warm up, then in a burst of back-to-back calls on a profiling queue
(:func:`device_time`, which bench.networks and bench.host use too), and sums the device time of
each enqueued kernel or CLBlast GEMM by name ("gemm_gpu" and "gemm_cpu" are clconv's own GEMM
kernels, "clblast_gemm" CLBlast's). CLBlast returns the event of its last kernel only: its helper
kernels (padding, transposes), when it runs any, are not counted, so "clblast_gemm" can be an
underestimate.
"""
import argparse
import statistics
from collections import defaultdict

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import clconv
from clconv.recording import profiling

from .run import load_workloads

# A call's device time, measured in steady state: the calls of a burst after the first SETTLE,
# median of each. The first kernel after an idle device reads longer, which a pipeline of calls,
# as a network runs them, does not pay.
CALLS = 8
SETTLE = 2


def device_time(fn, queue, calls=CALLS):
    """(device ms, launches, {kernel: device ms}) of one call of ``fn(queue)`` on ``queue``, a
    profiling queue: after a warm-up call, ``calls`` calls back to back (more than SETTLE), each's
    time and its kernels' summed by name; the medians over the calls after the first SETTLE.
    Raises RuntimeError unless every call launched the same kernels."""
    if calls <= SETTLE:
        raise ValueError(f"device_time needs more than {SETTLE} calls, got {calls}")
    fn(queue)
    queue.finish()
    ends = []
    with profiling() as events:
        for _ in range(calls):
            fn(queue)
            ends.append(len(events))
        queue.finish()
    each = [events[a:b] for a, b in zip([0] + ends, ends)]
    names = [[kernel for kernel, _ in call] for call in each]
    if any(n != names[0] for n in names):
        raise RuntimeError(f"{calls} calls launched different kernels: {names}")
    per = len(names[0])
    kept = []
    for call in each[SETTLE:]:
        parts = defaultdict(float)
        for kernel, event in call:
            parts[kernel] += (event.profile.end - event.profile.start) * 1e-6
        kept.append(parts)
    kernels = {k: statistics.median(p[k] for p in kept) for k in kept[0]}
    return statistics.median(sum(p.values()) for p in kept), per, kernels


def profile(w, size, queue, algorithm="auto"):
    s = w[size]
    x = cla.to_device(queue, np.random.default_rng(0).standard_normal((s["N"], s["C"], s["H"], s["W"]), np.float32))
    wt = cla.to_device(queue, np.ones((s["K"], s["C"] // s["groups"], s["kh"], s["kw"]), np.float32))
    p = clconv.plan(x.shape, wt.shape, s["stride"], s["padding"], s["dilation"], s["groups"], queue=queue,
                     algorithm=algorithm)
    dy = cla.to_device(queue, np.ones(p.geometry.output_shape, np.float32))
    passes = {"forward": lambda: p.forward(x, wt), "backward_input": lambda: p.backward_input(wt, dy),
              "backward_weight": lambda: p.backward_weight(x, dy)}
    rows = []
    for name, run in passes.items():
        total, _, parts = device_time(lambda q: run(), queue)
        detail = ", ".join(f"{k} {v:.3f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
        rows.append(f"{w['name']:16s} {name:16s} {p.algorithms[name]:7s} {total:9.3f} ms = {detail}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench profile", description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="append")
    ap.add_argument("--size", choices=("cpu", "gpu"))
    ap.add_argument("--algorithm", default="auto", help="force an algorithm (see clconv.plan)")
    args = ap.parse_args(argv)
    device = clconv.default_queue().device
    queue = cl.CommandQueue(clconv.default_context(), device,
                            properties=cl.command_queue_properties.PROFILING_ENABLE)
    size = args.size or ("gpu" if device.type & cl.device_type.GPU else "cpu")
    print(f"device: {device.name}; sizes: {size}; device time per pass (ms) by kernel")
    for w in load_workloads():
        if not args.workload or w["name"] in args.workload:
            print("\n".join(profile(w, size, queue, args.algorithm)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
