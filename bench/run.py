"""Benchmark clconv on the reference workloads, side by side with its peers.

    python -m bench workloads [--workload NAME ...] [--size cpu|gpu] [--repeat R] [--json PATH]
                              [--no-peers | --torch-only] [--algorithm NAME] [--queues single|per-group] [--plot PNG]

For every workload in bench/workloads.json (the 'gpu' sizes on a GPU, else the
'cpu' sizes) and every pass: warm-up runs (excluding kernel builds), then
repeated batches of back-to-back runs each ended by queue.finish(), min and median per run, GFLOP/s, GB/s, the
algorithm the planner chose, and one correctness check against the NumPy
reference. The headline time is the plan's with ``out=``; the functional API with ``out=``
and plain (a new result per call, from the memory pool) are timed beside it, in the same
rounds, as the call styles users write (``styles`` in the JSON). Peers (bench/peers.py) are timed the same way in the same run, PyTorch in rounds
alternating with clconv's, pass by pass.
A table goes to stdout; JSON to bench/results/<device>-workloads.json.
"""
import argparse
import datetime
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyclblast
import pyopencl as cl
import pyopencl.array as cla
from tqdm import tqdm

import clconv
from clconv import reference
from clconv.reference import normalised_error
from clconv.geometry import conv_geometry

from . import peers

HERE = Path(__file__).resolve().parent
PASSES = ("forward", "backward_input", "backward_weight")
STYLES = ("functional_out", "functional")   # timed beside the plan with out=
ROUNDS = 3         # alternating rounds of clconv and PyTorch per pass
SETTLE_S = 0.2     # pause after a PyTorch run on the CPU
SHORT = {"forward": "fwd", "backward_input": "dgrad", "backward_weight": "wgrad"}


def load_workloads(path=HERE / "workloads.json"):
    return json.loads(Path(path).read_text())["workloads"]


MAX_CALLS_PER_BATCH = 1000


def calls_per_batch(fn, sync, batch_s, most=MAX_CALLS_PER_BATCH):
    """How many back-to-back calls of ``fn`` (warmed up) fill a batch of about ``batch_s``
    ended by one ``sync()``: 4x more calls at a time until a batch takes a quarter of it. One
    call and its sync would not do: a sync that waits (0.1-0.4 ms per clFinish with NVIDIA's
    OpenCL) sized batches of a dozen 15 us calls, each billed more than its own time of the
    sync (H200, a batch-1 1x1 pass: 29 us a call so, 14.5 us in batches of 200; PyTorch's
    likewise 25 against 12)."""
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= batch_s / 4 or calls >= most:
            return max(1, min(most, int(calls * batch_s / max(elapsed, 1e-9))))
        calls *= 4


def time_it(fn, sync, repeat, budget_s=3.0, warmup=2, batch_s=0.005):
    """(min, median) seconds per call of ``fn``, after ``warmup`` untimed calls.

    Calls run in batches of back-to-back calls ended by one ``sync()`` (about ``batch_s``
    each: :func:`calls_per_batch`), so that a driver's blocking-wait latency is not billed to
    every call; peers are timed the same way. Min and median are over the batches.
    """
    for _ in range(warmup):
        fn()
        sync()
    inner = calls_per_batch(fn, sync, batch_s)
    times = []
    start = time.perf_counter()
    while len(times) < repeat and (len(times) < 3 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / inner)
    return min(times), statistics.median(times)


def pass_bytes(g, itemsize):
    """Bytes each pass must at least move: its two operands and its result."""
    return (g.N * g.C * g.H * g.W + g.K * g.Cg * g.kh * g.kw + g.N * g.K * g.P) * itemsize


def gemm_peer(g, queue):
    """One plain CLBlast SGEMM of each pass's size (groups == 1 only): the bound to aim at."""
    shapes = {"forward": (g.N * g.P, g.K, g.Kd), "backward_input": (g.N * g.P, g.Kd, g.K),
              "backward_weight": (g.K, g.Kd, g.N * g.P)}
    fns = {}
    for p, (m, n, k) in shapes.items():
        a, b, c = (cla.zeros(queue, s, np.float32) for s in ((m, k), (k, n), (m, n)))
        fns[p] = (lambda m=m, n=n, k=k, a=a, b=b, c=c: pyclblast.gemm(queue, m, n, k, a, b, c, k, n, n))
    return fns


def run_workload(w, size, queue, repeat, with_peers, log, algorithm="auto", queues="single", others=True):
    s = dict(w[size])
    g = conv_geometry((s["N"], s["C"], s["H"], s["W"]), (s["K"], s["C"] // s["groups"], s["kh"], s["kw"]),
                      s["stride"], s["padding"], s["dilation"], s["groups"])
    rng = np.random.default_rng(0)
    host = {"x": rng.standard_normal(g.input_shape, np.float32),
            "w": (rng.standard_normal(g.weight_shape, np.float32) / np.sqrt(g.Kd)).astype(np.float32),
            "dy": rng.standard_normal(g.output_shape, np.float32)}
    dev = {k: cla.to_device(queue, v) for k, v in host.items()}
    outs = {"forward": cla.empty(queue, g.output_shape, np.float32),
            "backward_input": cla.empty(queue, g.input_shape, np.float32),
            "backward_weight": cla.empty(queue, g.weight_shape, np.float32)}
    plan = clconv.plan(g.input_shape, g.weight_shape, s["stride"], s["padding"], s["dilation"], s["groups"],
                       queue=queue, algorithm=algorithm, queues=queues)
    opts = dict(stride=s["stride"], padding=s["padding"], dilation=s["dilation"], groups=s["groups"])
    ours = {"forward": lambda: plan.forward(dev["x"], dev["w"], out=outs["forward"]),
            "backward_input": lambda: plan.backward_input(dev["w"], dev["dy"], out=outs["backward_input"]),
            "backward_weight": lambda: plan.backward_weight(dev["x"], dev["dy"], out=outs["backward_weight"])}
    call = dict(opts, algorithm=algorithm, queues=queues)
    functional = {"forward": lambda out: clconv.conv2d(dev["x"], dev["w"], out=out, **call),
                  "backward_input": lambda out: clconv.conv2d_input(g.input_shape, dev["w"], dev["dy"], out=out, **call),
                  "backward_weight": lambda out: clconv.conv2d_weight(dev["x"], g.weight_shape, dev["dy"], out=out,
                                                                      **call)}
    result = {"name": w["name"], "size": size, "shape": s, "flop_per_pass": g.flops(),
              "explain": plan.explain(), "passes": {}}
    nbytes = pass_bytes(g, 4)
    # PyTorch, the peer the targets are set against, is timed interleaved with clconv, pass by
    # pass, in ROUNDS alternating rounds (these shared machines drift); the other peers after
    torch = peers.torch_peer(_peer_shape(g), queue.device, host) if with_peers else "no peers asked for"
    if isinstance(torch, str):
        log(f"  torch: {torch}")
    for p in PASSES:
        times, peer_times = [], []
        styles = {"functional_out": lambda p=p: functional[p](outs[p]), "functional": lambda p=p: functional[p](None)}
        style_times = {s: [] for s in STYLES}
        for _ in range(ROUNDS if not isinstance(torch, str) else 1):
            times.append(time_it(ours[p], queue.finish, repeat))
            for s in STYLES:
                style_times[s].append(time_it(styles[s], queue.finish, repeat))
            if not isinstance(torch, str):
                peer_times.append(time_it(torch[0][p], torch[1], max(3, repeat // 2)))
                time.sleep(SETTLE_S)   # its threads spin a while after a call: not on clconv's time
        tmin, tmed = min(t[0] for t in times), statistics.median(t[1] for t in times)
        result["passes"][p] = {"algorithm": plan.algorithms[p], "min_ms": tmin * 1e3, "median_ms": tmed * 1e3,
                               "gflops": g.flops() / tmed / 1e9, "gbps": nbytes / tmed / 1e9, "peers": {},
                               "styles": {s: {"min_ms": min(t[0] for t in ts) * 1e3,
                                              "median_ms": statistics.median(t[1] for t in ts) * 1e3}
                                          for s, ts in style_times.items()}}
        if peer_times:
            result["passes"][p]["peers"][torch[2]] = {"min_ms": min(t[0] for t in peer_times) * 1e3,
                                                      "median_ms": statistics.median(t[1] for t in peer_times) * 1e3,
                                                      "interleaved": True}
    # correctness once: forward and grad-input on the first images, grad-weight on the whole batch
    n = min(g.N, 4)
    x, wt, dy = host["x"], host["w"], host["dy"]
    errors = {"forward": normalised_error(outs["forward"].get()[:n], reference.conv2d(x[:n], wt, **opts)),
              "backward_input": normalised_error(outs["backward_input"].get()[:n],
                                                 reference.conv2d_input(x[:n].shape, wt, dy[:n], **opts)),
              "backward_weight": normalised_error(outs["backward_weight"].get(),
                                                  reference.conv2d_weight(x, wt.shape, dy, **opts))}
    for p in PASSES:
        result["passes"][p]["error"] = errors[p]
    if with_peers and others:   # (others: the peers besides PyTorch)
        for label, fns, sync in _peers(g, queue, host, dev, outs, log):
            for p, fn in fns.items():
                try:
                    tmin, tmed = time_it(fn, sync, max(3, repeat // 2))
                except Exception as exc:  # a peer failing must not stop the benchmark
                    log(f"  {label} {p}: failed: {exc}")
                    continue
                result["passes"][p]["peers"][label] = {"min_ms": tmin * 1e3, "median_ms": tmed * 1e3}
            if label == "clblast-loop":  # it wrote into our forward output: check it computed the same thing
                err = normalised_error(outs["forward"].get()[:n], reference.conv2d(x[:n], wt, **opts))
                result["passes"]["forward"]["peers"][label]["error"] = err
    return result


def _peer_shape(g):
    return {"stride": g.stride[0], "padding": g.pads[0][0], "dilation": g.dilation[0], "groups": g.groups,
            "N": g.N, "C": g.C, "H": g.H, "W": g.W, "K": g.K, "kh": g.kh, "kw": g.kw}


def _peers(g, queue, host, dev, outs, log):
    """(label, {pass: fn}, sync) for every peer besides PyTorch (timed with clconv's passes)."""
    shape = _peer_shape(g)
    found = []
    if g.N * g.K * g.P * g.Kd <= 2e10:   # float64 NumPy on the largest sizes takes too long to repeat
        found.append(("numpy", peers.numpy_peer(shape, host), lambda: None))
    loop = peers.clblast_loop_peer(shape, queue, dev, outs["forward"])
    if isinstance(loop, str):
        log(f"  clblast-loop: {loop}")
    else:
        found.append(("clblast-loop", loop, queue.finish))
    if g.groups == 1:
        found.append(("clblast-gemm", gemm_peer(g, queue), queue.finish))
    return found


def table(results):
    labels = sorted({lab for r in results for p in r["passes"].values() for lab in p["peers"]})
    head = f"{'workload':16s} {'pass':5s} {'algo':6s} {'med ms':>9s} {'min ms':>9s} {'GFLOP/s':>8s} {'GB/s':>7s} " \
           f"{'err':>8s} {'fn out=':>9s} {'fn plain':>9s}" + "".join(f" {lab:>13s} {'ratio':>6s}" for lab in labels)
    lines = [head, "-" * len(head)]
    for r in results:
        for p, d in r["passes"].items():
            row = (f"{r['name']:16s} {SHORT[p]:5s} {d['algorithm']:6s} {d['median_ms']:9.3f} {d['min_ms']:9.3f} "
                   f"{d['gflops']:8.1f} {d['gbps']:7.1f} {d['error']:8.1e}")
            row += "".join(f" {d['styles'][s]['median_ms']:9.3f}" if s in d.get("styles", {}) else f" {'-':>9s}"
                           for s in STYLES)
            for lab in labels:
                peer = d["peers"].get(lab)
                row += (f" {peer['median_ms']:13.3f} {d['median_ms'] / peer['median_ms']:6.2f}" if peer
                        else f" {'-':>13s} {'-':>6s}")
            lines.append(row)
    lines.append("med/min ms: the plan with out=; fn out= / fn plain: median ms of clconv.conv2d (and its gradients) "
                 "with out= / with a new result per call")
    lines.append("ratio = clconv median (plan with out=) / peer median (lower is better for clconv)")
    for lab in labels:
        pairs = [(d, d["peers"][lab]["median_ms"]) for r in results for d in r["passes"].values() if lab in d["peers"]]
        means = {"plan out=": geomean([d["median_ms"] / t for d, t in pairs])}
        for s in STYLES:
            means[s.replace("_", " ")] = geomean([d["styles"][s]["median_ms"] / t for d, t in pairs if s in d["styles"]])
        lines.append(f"geometric mean of clconv / {lab} over {len(pairs)} passes: "
                     + ", ".join(f"{k} {v:.2f}" for k, v in means.items()))
    return "\n".join(lines)


def geomean(values):
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench workloads", description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="append", help="run only these workloads (repeatable)")
    ap.add_argument("--size", choices=("cpu", "gpu"), help="workload sizes (default: by device type)")
    ap.add_argument("--repeat", type=int, default=10, help="timed runs per pass (default 10)")
    ap.add_argument("--json", help="output path (default bench/results/<device>-workloads.json)")
    ap.add_argument("--no-peers", action="store_true", help="time clconv only")
    ap.add_argument("--torch-only", action="store_true", help="of the peers, time PyTorch only (the one the "
                    "targets are set against; a CLBlast loop takes seconds per call on CPUs)")
    ap.add_argument("--algorithm", default="auto", help="force an algorithm (see clconv.plan)")
    ap.add_argument("--queues", default="single", choices=("single", "per-group"), help="GEMM queues per group")
    ap.add_argument("--plot", help="also draw a PNG chart to this path (needs matplotlib)")
    args = ap.parse_args(argv)

    queue = clconv.default_queue()
    device = queue.device
    size = args.size or ("gpu" if device.type & cl.device_type.GPU else "cpu")
    workloads = [w for w in load_workloads() if not args.workload or w["name"] in args.workload]
    if not workloads:
        ap.error(f"no workload named {args.workload}")
    print(f"device: {device.platform.name} / {device.name}; sizes: {size}", flush=True)
    results = []
    with tqdm(workloads, desc="benchmark", unit="workload", file=sys.stderr) as bar:
        for w in bar:
            bar.set_postfix_str(w["name"])
            results.append(run_workload(w, size, queue, args.repeat, not args.no_peers,
                                        lambda msg: tqdm.write(msg, file=sys.stdout), args.algorithm, args.queues,
                                        not args.torch_only))
    print(table(results))
    today = datetime.date.today().isoformat()
    path = Path(args.json) if args.json else \
        HERE / "results" / f"{re.sub(r'[^A-Za-z0-9]+', '-', device.name).strip('-').lower()}-workloads.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"date": today, "algorithm": args.algorithm, "queues": args.queues, "device": device.name,
              "platform": device.platform.name, "driver": device.driver_version, "machine": platform.machine(),
              "python": sys.version.split()[0], "sizes": size, "clconv": clconv.__version__, "workloads": results}
    path.write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")
    if args.plot:
        from .plot import plot
        plot(record, args.plot)
        print(f"wrote {args.plot}")
    return 0
