"""A call's host time: plain public calls of small layers against one empty kernel launch.

    python -m bench host [--rounds R] [--json PATH]

The floor is one launch of an empty kernel (one buffer argument, set once) through pyopencl on
the same queue: what any OpenCL library pays per kernel. Against it, per layer and pass, the
plain public call (``clconv.conv2d``, ``conv2d_input``, ``conv2d_weight``: a new result per
call) and the call with ``out=``. Each is timed two ways, in R rounds interleaved:

- ``pipelined``: batches of back-to-back calls ended by one ``queue.finish()`` (as the networks
  benchmark times), per call; with a device faster than the host this is the host's time;
- ``sync``: one call, then ``queue.finish()``, per call: the latency a caller waiting for each
  result sees.

Beside them, ``graph``: the pass recorded once in a :func:`clconv.graph` and replayed, pipelined
(what each layer of a recorded network costs: its launches alone).

Least and median over the batches; ``host``: the pipelined batches' time before their finish,
per call (what the host spent, the device's backlog aside). Launches per pass come from the
plan (:meth:`clconv.Plan.launches`), device time from a profiling queue in steady state
(:func:`bench.profile.device_time`). Each result is checked once against the float64 reference.
"""
import argparse
import datetime
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import clconv
from clconv import reference
from clconv.reference import TOLERANCE, normalised_error

from .networks import record_and_replay, slug
from .profile import device_time
from .run import HERE, PASSES, SHORT, calls_per_batch

LAYERS = {   # name: (input size, weight size, options); batch 1, as inference calls them
    "tiny 3x3 g2": ((1, 4, 6, 6), (6, 2, 3, 3), dict(groups=2)),
    "1x1 C64 14x14": ((1, 64, 14, 14), (64, 64, 1, 1), {}),
    "depthwise 3x3 C96 28x28": ((1, 96, 28, 28), (96, 1, 3, 3), dict(padding=1, groups=96)),
    "3x3 C64 28x28": ((1, 64, 28, 28), (64, 64, 3, 3), dict(padding=1)),
}
BATCH_S = 0.004   # a pipelined batch lasts about this long
ROUNDS = 5


def timed(fn, sync, batch):
    """(pipelined s per call, its host part, sync s per call) of ``fn``, one batch each."""
    sync()
    t0 = time.perf_counter()
    for _ in range(batch):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    for _ in range(max(1, batch // 4)):
        fn()
        sync()
    t3 = time.perf_counter()
    return (t2 - t0) / batch, (t1 - t0) / batch, (t3 - t2) / max(1, batch // 4)


def measure(styles, sync, rounds):
    """{style: {pipelined/host/sync: (least, median) in us}}, styles interleaved per round."""
    batches = {}
    for name, fn in styles.items():   # warm up; size each batch for about BATCH_S
        for _ in range(3):
            fn()
        sync()
        batches[name] = max(4, calls_per_batch(fn, sync, BATCH_S))
    runs = defaultdict(list)
    for _ in range(rounds):
        for name, fn in styles.items():
            for _ in range(3):
                runs[name].append(timed(fn, sync, batches[name]))
    return {name: {kind: (min(t[i] for t in r) * 1e6, statistics.median(t[i] for t in r) * 1e6)
                   for i, kind in enumerate(("pipelined", "host", "sync"))} for name, r in runs.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench host", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--json", help="output path (default bench/results/<device>-host.json)")
    args = ap.parse_args(argv)
    queue = clconv.default_queue()
    device = queue.device
    profiling = cl.CommandQueue(queue.context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    empty = cl.Program(queue.context, "__kernel void empty(__global float *x) {}").build().empty
    scratch = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 64)
    empty.set_arg(0, scratch)
    floor = measure({"empty": lambda: cl.enqueue_nd_range_kernel(queue, empty, (1,), (1,))}, queue.finish,
                    args.rounds)["empty"]
    print(f"device: {device.platform.name.strip()} / {device.name.strip()}")
    print(f"empty kernel launch: pipelined least {floor['pipelined'][0]:.1f} us (median {floor['pipelined'][1]:.1f}), "
          f"sync least {floor['sync'][0]:.1f} us (median {floor['sync'][1]:.1f})")
    print(f"{'layer':24s} {'pass':5s} {'launch':>6s} {'dev us':>7s} | {'plain: pipelined':>16s} {'host':>6s} "
          f"{'sync':>6s} | {'out=: pipelined':>15s} {'sync':>6s} | {'graph replay':>15s} | "
          f"{'x empty (pipelined, sync; graph)':>31s}")
    rows = []
    rng = np.random.default_rng(0)
    for name, (xs, ws, opts) in LAYERS.items():
        x = rng.standard_normal(xs, np.float32)
        w = (rng.standard_normal(ws, np.float32) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
        p = clconv.plan(xs, ws, **opts, queue=queue)
        dy = rng.standard_normal(p.geometry.output_shape, np.float32)
        xd, wd, dyd = (cla.to_device(queue, a) for a in (x, w, dy))
        outs = {"forward": cla.empty(queue, dy.shape, np.float32), "backward_input": cla.empty(queue, xs, np.float32),
                "backward_weight": cla.empty(queue, ws, np.float32)}
        calls = {"forward": lambda q=None, out=None: clconv.conv2d(xd, wd, **opts, queue=q, out=out),
                 "backward_input": lambda q=None, out=None: clconv.conv2d_input(xs, wd, dyd, **opts, queue=q, out=out),
                 "backward_weight": lambda q=None, out=None: clconv.conv2d_weight(xd, ws, dyd, **opts, queue=q,
                                                                                   out=out)}
        on_plan = {"forward": lambda: p.forward(xd, wd), "backward_input": lambda: p.backward_input(wd, dyd),
                   "backward_weight": lambda: p.backward_weight(xd, dyd)}   # what the pass launches, by name
        want = {"forward": reference.conv2d(x, w, None, **opts),
                "backward_input": reference.conv2d_input(xs, w, dy, **opts),
                "backward_weight": reference.conv2d_weight(x, ws, dy, **opts)}
        for pass_name in PASSES:
            call = calls[pass_name]
            error = float(normalised_error(call().get(), want[pass_name]))
            g, replayed = record_and_replay(call)
            error = max(error, float(normalised_error(replayed.get(), want[pass_name])))
            t = measure({"plain": call, "out": lambda: call(out=outs[pass_name]), "graph": g.replay}, queue.finish,
                        args.rounds)
            device_ms, launches, _ = device_time(lambda q: call(q), profiling)
            device_us = device_ms * 1e3
            on_plan[pass_name]()
            row = {"layer": name, "pass": pass_name, "input": list(xs), "weight": list(ws), "options": opts,
                   "algorithm": p.algorithms[pass_name], "launches": launches, "launched": p.launches(pass_name),
                   "device_us": device_us, "error": error, "ok": error <= TOLERANCE[np.dtype(np.float32)], **t}
            rows.append(row)
            print(f"{name:24s} {SHORT[pass_name]:5s} {launches:6d} {device_us:7.1f} | "
                  f"{t['plain']['pipelined'][0]:7.1f} ({t['plain']['pipelined'][1]:6.1f}) {t['plain']['host'][0]:6.1f} "
                  f"{t['plain']['sync'][0]:6.1f} | {t['out']['pipelined'][0]:6.1f} ({t['out']['pipelined'][1]:6.1f}) "
                  f"{t['out']['sync'][0]:6.1f} | {t['graph']['pipelined'][0]:6.1f} ({t['graph']['pipelined'][1]:6.1f}) | "
                  f"{t['plain']['pipelined'][0] / floor['pipelined'][0]:11.2f} "
                  f"{t['plain']['sync'][0] / floor['sync'][0]:11.2f} {t['graph']['pipelined'][0] / floor['pipelined'][0]:6.2f}"
                  + ("" if row["ok"] else f"  WRONG RESULT: error {error:.2e}"), flush=True)
    print("(us per call: least (median); 'x empty': the plain call's least, and the graph replay's, over the empty "
          "launch's least)")
    path = Path(args.json) if args.json else HERE / "results" / f"{slug(device.name)}-host.json"
    path.write_text(json.dumps({"date": datetime.date.today().isoformat(), "device": device.name.strip(),
                                "platform": device.platform.name.strip(), "driver": device.driver_version,
                                "empty_launch_us": floor, "layers": rows}, indent=1))
    print(f"wrote {path}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
