"""Soak test: many mixed calls, memory must stay flat.

    python tests/soak.py [--calls 10000] [--check-every 50]

Draws configurations from a fixed pool of random valid ones (so caches stay
bounded), runs a random pass on each call (forward, grad-input, grad-weight,
grad-bias; NumPy and device arrays), checks a sample against the NumPy
reference, and reports host RSS and what clconv holds on the device (its memory
pools, cached plans) after a warm-up round and at the end.
"""
import argparse
import time

import numpy as np
import pyopencl.array as cla

import clconv
from clconv import reference
from clconv.geometry import conv_geometry
from clconv.planner import _plan_cache


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def held():
    pools = clconv.memory_stats()
    return {"rss_mib": round(rss_mib(), 1), "pooled_bytes": pools["managed_bytes"], "pooled_blocks":
            pools["active_blocks"] + pools["held_blocks"], "cached_plans": len(_plan_cache)}


def pool(rng, size):
    configs = []
    while len(configs) < size:
        groups = int(rng.integers(1, 4))
        cg, kg = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        if rng.random() < 0.3:
            groups, cg = int(rng.integers(2, 9)), 1
        shape = (int(rng.integers(1, 4)), cg * groups, int(rng.integers(3, 20)), int(rng.integers(3, 20)))
        weight = (kg * groups, cg, int(rng.integers(1, 5)), int(rng.integers(1, 5)))
        opts = dict(stride=int(rng.integers(1, 3)), padding=[0, 1, "same", ((1, 0), (0, 2))][rng.integers(4)],
                    dilation=int(rng.integers(1, 3)), groups=groups)
        try:
            conv_geometry(shape, weight, **opts)
        except ValueError:
            continue
        configs.append((shape, weight, opts))
    return configs


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python tests/soak.py", description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--check-every", type=int, default=50)
    ap.add_argument("--pool", type=int, default=40)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    queue = clconv.default_queue()
    configs = pool(rng, args.pool)
    data = []
    for shape, weight, opts in configs:
        x = rng.standard_normal(shape).astype(np.float32)
        w = rng.standard_normal(weight).astype(np.float32)
        dy = rng.standard_normal(reference.conv2d(x, w, **opts).shape).astype(np.float32)
        data.append((x, w, dy))

    def call(i, check):
        c = i % len(configs)
        shape, weight, opts = configs[c]
        x, w, dy = data[c]
        kind = i // len(configs) % 4
        args = [cla.to_device(queue, a) for a in (x, w, dy)] if i % 2 else [x, w, dy]   # device arrays half the time
        if kind == 0:
            got, want = clconv.conv2d(args[0], args[1], **opts), (reference.conv2d, (x, w))
        elif kind == 1:
            got, want = clconv.conv2d_input(shape, args[1], args[2], **opts), (reference.conv2d_input, (shape, w, dy))
        elif kind == 2:
            got, want = clconv.conv2d_weight(args[0], weight, args[2], **opts), (reference.conv2d_weight,
                                                                                 (x, weight, dy))
        else:
            got, want = clconv.conv2d_bias(args[2]), None
        if check:
            got = got.get() if isinstance(got, cla.Array) else got
            expected = reference.conv2d_bias(dy) if want is None else want[0](*want[1], **opts)
            err = reference.normalised_error(got, expected)
            if err > reference.TOLERANCE[np.dtype(np.float32)]:
                raise AssertionError(f"call {i}: {configs[c]} pass {kind}: error {err}")

    for i in range(len(configs) * 4):          # warm-up: every config and pass once (builds, caches)
        call(i, check=True)
    queue.finish()
    start, t0 = held(), time.perf_counter()
    checked = 0
    for i in range(args.calls):
        check = i % args.check_every == 0
        call(i, check)
        checked += check
    queue.finish()
    end = held()
    print(f"{args.calls} calls in {time.perf_counter() - t0:.1f} s over {len(configs)} configurations, "
          f"{checked} checked against the reference: all within 1e-4")
    print(f"after warm-up: {start}")
    print(f"at the end:    {end}")
    grown = end["rss_mib"] - start["rss_mib"]
    print(f"host RSS change: {grown:+.1f} MiB; pooled device memory change: "
          f"{end['pooled_bytes'] - start['pooled_bytes']} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
