"""The networks benchmark: every convolution of six torchvision networks, clconv against PyTorch.

    python -m bench networks [--networks a,b] [--batch N] [--device SPEC] [--budget S] [--rounds R]
                             [--layers PATTERNS] [--limit N] [--json PATH] [--plot PNG] [--profile] [--graph]
                             [--math strict|tf32|fp16]

The layers are bench/networks.json (made by tools/network_layers.py): each distinct Conv2d of
resnet50, mobilenet_v2, efficientnet_b0, convnext_tiny, regnet_y_400mf and inception_v3 at a
224x224 input, with how often each network runs it. For every layer and pass (forward,
grad-input, grad-weight) it times clconv's plain public call (clconv.conv2d, conv2d_input,
conv2d_weight: a new result per call, as users write it) against PyTorch on the same device
(cuDNN, benchmark mode, TF32 off, when the OpenCL device is a GPU and CUDA is there; PyTorch's
CPU build otherwise), in alternating rounds, median of each (bench/run.py's time_it). Before
any warm-up it times each side's first call (plan, kernel builds and one run; PyTorch's cuDNN
autotuning), and checks both first results against PyTorch's in float64 once. Kernel builds
are cached per context and on disk (pyopencl's and the driver's caches), so a layer's first call is cheaper
after a layer that needed the same kernels, and on a machine that ran the benchmark before.

--budget (default 0.3 s) is the timing of one layer-pass, both sides and all rounds together:
about 2.5 minutes for all 519 layer-passes plus first calls and checks on a GPU. Each side
still makes at least one warm-up call and 3 timed batches per round, so on a CPU device the
large layers take longer than the budget (use --networks, --rounds 1 or a smaller --batch).

Reported: per layer-pass the times, their ratio (clconv / PyTorch, lower is better for clconv),
the algorithm clconv chose and the error; the geometric mean of the ratio overall, per pass and
per kind of layer; per network the convolutions' time of one training step (forward and both
gradients of every layer, weighted by its count) and the first-call time (a layer shared with
an earlier network counted there); the worst layer-passes. A table goes to stdout, JSON to
bench/results/<device>-networks-b<batch>.json. Exit status 1 if a result was wrong.

--math compares both sides in one math mode (clconv.precision): strict (the default: float32
arrays, clconv's strict math, cuDNN with TF32 off), tf32 (float32 arrays, clconv's math="tf32",
cuDNN with TF32 allowed, PyTorch's default) or fp16 (float16 arrays and half tensors). Errors are
held to the mode's tolerance (clconv.reference.tolerance); results go to
bench/results/<device>-networks-b<batch>-<mode>.json for the modes other than strict.

--graph also times each pass recorded once in a clconv.graph() and replayed (its launches alone,
as a recorded network runs them; the result checked too), in the same alternating rounds, and
reports its ratio against PyTorch's plain call beside the plain call's.

--first-calls measures only clconv's first calls, as a network's first step pays them: each
selected layer's three passes once, in order, in new processes: cold (empty caches: clconv's
tuning cache with its known-answer verdicts, pyopencl's binary cache, PoCL's and NVIDIA's kernel
caches), cold after clconv.prepare() over the layers in threads, cold after clconv.prepare() with
a worker process per host core first, and warm (the caches of the run before it); --runs picks
some of these, in its order. It
reports each run's total, the programs built and their build time, per kernel file, and writes
bench/results/<device>-networks-b<batch>-first-calls.json.
"""
import argparse
import datetime
import fnmatch
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
from tqdm import tqdm

import clconv
from clconv.geometry import PASSES, conv_geometry
from clconv.programs import builds
from clconv.reference import normalised_error, tolerance

from . import peers
from .profile import device_time
from .run import SHORT, geomean, time_it

HERE = Path(__file__).resolve().parent
LAYERS = HERE / "networks.json"
BUDGET_S = 0.3      # default timing budget of one layer-pass, both sides and all rounds: ~2.5 min for all 519
ROUNDS = 3          # alternating rounds of clconv and PyTorch per layer-pass
MAX_BATCHES = 100   # time_it's cap on timed batches per side and round; the budget ends it sooner
SETTLE_S = 0.05     # pause after a PyTorch CPU run (its threads spin a while); 519 layer-passes x rounds
WORST = 15          # the slowest layer-passes (by ratio) listed
MODES = {"strict": np.float32, "tf32": np.float32, "fp16": np.float16}   # --math: the arrays' dtype
KINDS = ("1x1 on >7x7", "1x1 on <=7x7", "dense 3x3", "asymmetric 1xn/nx1", "other dense", "grouped",
         "depthwise 3x3", "depthwise 5x5", "depthwise 7x7")


def load_layers(path=LAYERS):
    """The layers file: {"networks": {name: {"conv2d_layers", "distinct"}}, "layers": [...], ...}."""
    return json.loads(Path(path).read_text())


def select(data, networks, patterns=None, limit=None):
    """The layers run by any of ``networks``, in file order, whose id matches one of the glob
    ``patterns`` (all if none), at most ``limit`` of them."""
    chosen = [lay for lay in data["layers"] if any(n in lay["count"] for n in networks)
              and (not patterns or any(fnmatch.fnmatchcase(lay["id"], p) for p in patterns))]
    return chosen[:limit] if limit else chosen


def kind(layer):
    """The kind of layer, for the per-kind geometric means (KINDS)."""
    kh, kw, C, groups = layer["kh"], layer["kw"], layer["C"], layer["groups"]
    if groups > 1:
        return f"depthwise {kh}x{kw}" if groups == C else "grouped"
    if kh == kw == 1:
        return "1x1 on >7x7" if max(layer["H"], layer["W"]) > 7 else "1x1 on <=7x7"
    if kh == kw == 3:
        return "dense 3x3"
    return "asymmetric 1xn/nx1" if min(kh, kw) == 1 else "other dense"


def describe(layer):
    """A short shape: '64x56x56>256 1x1 s1 p0', with ',' between unequal h and w, ' gG' for groups."""
    def hw(v):
        return str(v[0]) if v[0] == v[1] else f"{v[0]},{v[1]}"
    text = (f"{layer['C']}x{layer['H']}x{layer['W']}>{layer['K']} {layer['kh']}x{layer['kw']} "
            f"s{hw(layer['stride'])} p{hw(layer['padding'])}")
    if layer["dilation"] != [1, 1]:
        text += f" d{hw(layer['dilation'])}"
    return text + (f" g{layer['groups']}" if layer["groups"] > 1 else "")


def options(layer):
    """The layer's stride, padding, dilation and groups, as the conv calls take them."""
    return {"stride": tuple(layer["stride"]), "padding": tuple(layer["padding"]),
            "dilation": tuple(layer["dilation"]), "groups": layer["groups"]}


def geometry(layer, batch):
    return conv_geometry((batch, layer["C"], layer["H"], layer["W"]),
                         (layer["K"], layer["C"] // layer["groups"], layer["kh"], layer["kw"]), **options(layer))


def first_call(fn, sync):
    """(milliseconds, result) of one call and its sync: for clconv, plan and kernel builds
    included when it is the layer's first."""
    t0 = time.perf_counter()
    result = fn()
    sync()
    return (time.perf_counter() - t0) * 1e3, result


def torch_result(value, pass_name):
    """PyTorch's result of a pass as NumPy: the output, or the gradient convolution_backward gave."""
    if pass_name != "forward":
        value = value[0 if pass_name == "backward_input" else 1]
    return value.detach().cpu().numpy()


def record_and_replay(call):
    """(the graph of ``call`` recorded once in a clconv.graph(), the result it recorded after one
    replay): the result is NaN-filled first, so what it holds is what the replay wrote."""
    with clconv.graph() as recorded:
        result = call()
    result.fill(np.nan)
    recorded.replay()
    return recorded, result


def run_layer(layer, batch, queue, budget_s=BUDGET_S, rounds=ROUNDS, profile_queue=None, graph=False, math="strict"):
    """({pass: measurements}, the peer's label) of one layer: first calls and the correctness
    check, then timing in rounds; with ``profile_queue``, each pass's device time by kernel; with
    ``graph``, each pass recorded in a clconv.graph() and its replay timed too; both sides in the
    math mode ``math`` (see --math)."""
    g = geometry(layer, batch)
    opts = options(layer)
    dtype = MODES[math]
    tol = tolerance(dtype, math)
    rng = np.random.default_rng(0)
    host = {"x": rng.standard_normal(g.input_shape, np.float32),
            "w": (rng.standard_normal(g.weight_shape, np.float32) / np.sqrt(g.Kd)).astype(np.float32),
            "dy": rng.standard_normal(g.output_shape, np.float32)}
    host = {k: v.astype(dtype) for k, v in host.items()}
    dev = {k: cla.to_device(queue, v) for k, v in host.items()}
    shape = {"N": batch, **{k: layer[k] for k in ("C", "H", "W", "K", "kh", "kw", "groups")}, **opts}
    torch = peers.torch_peer(shape, queue.device, host, tf32=math == "tf32")
    opts = {**opts, "math": math}   # (clconv's calls; PyTorch's peer has its own)
    if isinstance(torch, str):
        raise RuntimeError(f"the networks benchmark needs PyTorch as its peer: {torch}")
    theirs, torch_sync, label = torch
    # the correctness check's answer: the same PyTorch calls in float64 (both sides' errors are
    # measured against it, so a disagreement says which side is off)
    exact, _, _ = peers.torch_peer(shape, queue.device, {k: v.astype(np.float64) for k, v in host.items()},
                                   tf32=math == "tf32")
    # clconv's plain public calls, looked up on the module at call time (the test perturbs one)
    ours = {"forward": lambda: clconv.conv2d(dev["x"], dev["w"], **opts),
            "backward_input": lambda: clconv.conv2d_input(g.input_shape, dev["w"], dev["dy"], **opts),
            "backward_weight": lambda: clconv.conv2d_weight(dev["x"], g.weight_shape, dev["dy"], **opts)}
    on_cpu = not queue.device.type & cl.device_type.GPU
    sides = 3 if graph else 2
    per_side_s = budget_s / (sides * rounds)
    on = {"forward": lambda q: clconv.conv2d(dev["x"], dev["w"], **opts, queue=q),
          "backward_input": lambda q: clconv.conv2d_input(g.input_shape, dev["w"], dev["dy"], **opts, queue=q),
          "backward_weight": lambda q: clconv.conv2d_weight(dev["x"], g.weight_shape, dev["dy"], **opts, queue=q)}
    passes = {}
    for p in PASSES:
        first_ms, mine = first_call(ours[p], queue.finish)
        torch_first_ms, reference = first_call(theirs[p], torch_sync)
        want = torch_result(exact[p](), p)
        error = float(normalised_error(mine.get(), want))
        torch_error = float(normalised_error(torch_result(reference, p), want))
        if graph:
            recorded, replayed = record_and_replay(ours[p])
            error = max(error, float(normalised_error(replayed.get(), want)))
        del mine, reference, want
        times, torch_times, graph_times = [], [], []
        for r in range(rounds):
            warmup = 2 if r == 0 else 1
            times.append(time_it(ours[p], queue.finish, MAX_BATCHES, per_side_s, warmup))
            torch_times.append(time_it(theirs[p], torch_sync, MAX_BATCHES, per_side_s, warmup))
            if on_cpu:
                time.sleep(SETTLE_S)   # PyTorch's threads spin a while after a call: not on clconv's time
            if graph:
                graph_times.append(time_it(recorded.replay, queue.finish, MAX_BATCHES, per_side_s, warmup))
        ms = statistics.median(t[1] for t in times) * 1e3
        torch_ms = statistics.median(t[1] for t in torch_times) * 1e3
        passes[p] = {"clconv_ms": ms, "clconv_min_ms": min(t[0] for t in times) * 1e3,
                     "torch_ms": torch_ms, "torch_min_ms": min(t[0] for t in torch_times) * 1e3,
                     "ratio": ms / torch_ms, "error": error, "torch_error": torch_error, "ok": bool(error <= tol),
                     "first_call_ms": first_ms, "torch_first_call_ms": torch_first_ms}
        if graph:
            graph_ms = statistics.median(t[1] for t in graph_times) * 1e3
            passes[p].update(graph_ms=graph_ms, graph_min_ms=min(t[0] for t in graph_times) * 1e3,
                             graph_ratio=graph_ms / torch_ms)
        if profile_queue is not None:
            device_ms, launches, kernels = device_time(on[p], profile_queue)
            passes[p].update(device_ms=device_ms, launches=launches, kernels=kernels)
    # the plan the calls used comes from the functional API's cache; one made with the same
    # arguments chooses the same algorithms (no kernels built: those are cached per context)
    chosen = clconv.plan(g.input_shape, g.weight_shape, queue=queue, dtype=dtype, **opts).algorithms
    for p in PASSES:
        passes[p]["algorithm"] = chosen[p]
    return passes, label


def run_layers(layers, batch, queue, budget_s=BUDGET_S, rounds=ROUNDS, progress=True, profile=False, graph=False,
               math="strict"):
    """[{"id", "kind", "shape", "layer", "count", "peer", "passes"}] for ``layers``."""
    profile_queue = (cl.CommandQueue(queue.context, queue.device,
                                     properties=cl.command_queue_properties.PROFILING_ENABLE) if profile else None)
    results = []
    with tqdm(layers, desc="layers", unit="layer", file=sys.stderr, disable=not progress) as bar:
        for layer in bar:
            bar.set_postfix_str(layer["id"])
            passes, peer = run_layer(layer, batch, queue, budget_s, rounds, profile_queue, graph, math)
            results.append({"id": layer["id"], "kind": kind(layer), "shape": describe(layer),
                            "layer": {k: v for k, v in layer.items() if k not in ("id", "count")},
                            "count": layer["count"], "peer": peer, "passes": passes})
    return results


# name: (caches, clconv.prepare first: None, or its worker processes, 0 for threads alone)
FIRST_CALL_RUNS = {"cold": ("cold", None), "prepared": ("cold, prepared", 0),
                   "processes": ("cold, prepared in processes", os.cpu_count() or 1), "warm": ("warm", None)}


def cache_env(folder):
    """Environment variables that put every kernel and tuning cache under ``folder``."""
    return {"XDG_CACHE_HOME": str(folder), "CLCONV_CACHE_DIR": str(Path(folder) / "clconv"),
            "POCL_CACHE_DIR": str(Path(folder) / "pocl"), "CUDA_CACHE_PATH": str(Path(folder) / "nv")}


def layer_shapes(layer, batch):
    g = geometry(layer, batch)
    return g.input_shape, g.weight_shape, options(layer)


def first_calls_run(layers, batch, queue, processes=None):
    """One process's first calls: {"prepare_s", "first_calls_s", "total_s", "builds", "build_s",
    "by_file"} over ``layers`` (each layer's passes once, in order), with clconv.prepare() over
    them first unless ``processes`` is None (its worker processes: 0 for threads alone)."""
    start = time.perf_counter()
    if processes is not None:
        clconv.prepare([layer_shapes(layer, batch) for layer in layers], queue=queue, processes=processes)
    prepare_s = time.perf_counter() - start
    first_s = 0.0
    for layer in layers:
        xs, ws, opts = layer_shapes(layer, batch)
        x, w = cla.zeros(queue, xs, np.float32), cla.zeros(queue, ws, np.float32)
        queue.finish()
        calls = (lambda: clconv.conv2d(x, w, **opts), lambda: clconv.conv2d_input(xs, w, y, **opts),
                 lambda: clconv.conv2d_weight(x, ws, y, **opts))
        for call in calls:
            ms, result = first_call(call, queue.finish)
            first_s += ms / 1e3
            y = result if call is calls[0] else y
    built = builds()
    by_file = Counter()
    for name, _ in built:
        by_file[name] += 1
    return {"prepare_s": prepare_s, "first_calls_s": first_s, "total_s": time.perf_counter() - start,
            "builds": len(built), "build_s": sum(t for _, t in built), "by_file": dict(sorted(by_file.items()))}


def first_calls(argv, device_name, batch, names):
    """Run the FIRST_CALL_RUNS ``names``, each a new process (this module with --first-calls-child),
    each but "warm" on empty caches, "warm" on those the run before it left; their records."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="clconv-first-calls-") as folder:
        for i, name in enumerate(names):
            caches, prepared = FIRST_CALL_RUNS[name]
            if name != "warm":   # (a folder per run: a name given twice is cold twice)
                where = Path(folder) / f"caches-{i}"
            out = Path(folder) / f"run-{len(runs)}.json"
            child = [sys.executable, "-m", f"{__package__}.networks", *argv, "--first-calls-child", str(out), "--batch", str(batch)]
            if prepared is not None:
                child += ["--prepare", str(prepared)]
            subprocess.run(child, check=True, env={**os.environ, **cache_env(where)})
            runs.append({"caches": caches, "prepared": prepared, **json.loads(out.read_text())})
            r = runs[-1]
            print(f"{caches:28s} prepare {r['prepare_s']:7.1f} s  first calls {r['first_calls_s']:7.1f} s  "
                  f"total {r['total_s']:7.1f} s  {r['builds']:4d} programs built in {r['build_s']:6.1f} s", flush=True)
    return runs


def summarise(results, networks, info):
    """Geometric means, per-network step and first-call times, the worst layer-passes, counts."""
    rows = [(r, p, d) for r in results for p, d in r["passes"].items()]

    def mean(selected):
        return {"layer_passes": len(selected), "geomean_ratio": geomean([d["ratio"] for _, _, d in selected]),
                "geomean_min_ratio": geomean([d["clconv_min_ms"] / d["torch_min_ms"] for _, _, d in selected])}

    per_network, owner = {}, {}
    for net in networks:
        for r in results:
            if net in r["count"]:
                owner.setdefault(r["id"], net)
    for net in networks:
        mine = [r for r in results if net in r["count"]]
        step = {side: sum(r["count"][net] * d[f"{side}_ms"] for r in mine for d in r["passes"].values())
                for side in ("clconv", "torch")}
        first = {side: sum(d[key] for r in mine if owner[r["id"]] == net for d in r["passes"].values()) / 1e3
                 for side, key in (("clconv", "first_call_ms"), ("torch", "torch_first_call_ms"))}
        per_network[net] = {"distinct_measured": len(mine), "distinct": info[net]["distinct"],
                            "conv2d_measured": sum(r["count"][net] for r in mine),
                            "conv2d_layers": info[net]["conv2d_layers"],
                            "clconv_step_ms": step["clconv"], "torch_step_ms": step["torch"],
                            "ratio": step["clconv"] / step["torch"] if mine else float("nan"),
                            "clconv_first_call_s": first["clconv"], "torch_first_call_s": first["torch"]}
    worst = sorted(rows, key=lambda row: -row[2]["ratio"])[:WORST]
    graphs = {}
    if rows and all("graph_ms" in d for _, _, d in rows):   # --graph: the replays against PyTorch's plain calls
        graphs = {"overall": geomean([d["graph_ratio"] for _, _, d in rows]),
                  "per_pass": {p: geomean([d["graph_ratio"] for _, q, d in rows if q == p]) for p in PASSES},
                  "networks": {}}
        for net in networks:
            mine = [r for r in results if net in r["count"]]
            step = sum(r["count"][net] * d["graph_ms"] for r in mine for d in r["passes"].values())
            graphs["networks"][net] = {"graph_step_ms": step,
                                       "ratio": step / per_network[net]["torch_step_ms"] if mine else float("nan")}
    return {"overall": mean(rows), **({"graph": graphs} if graphs else {}),
            "per_pass": {p: mean([row for row in rows if row[1] == p]) for p in PASSES},
            "per_kind": {k: mean([row for row in rows if row[0]["kind"] == k])
                         for k in KINDS if any(row[0]["kind"] == k for row in rows)},
            "networks": per_network,
            "worst": [{"id": r["id"], "shape": r["shape"], "pass": p, "ratio": d["ratio"], "clconv_ms": d["clconv_ms"],
                       "torch_ms": d["torch_ms"], "algorithm": d["algorithm"]} for r, p, d in worst],
            "faster": {"clconv": sum(d["ratio"] < 1 for _, _, d in rows),
                       "torch": sum(d["ratio"] >= 1 for _, _, d in rows)},
            "failures": [f"{r['id']} {p}: error {d['error']:.2e}, above the tolerance (PyTorch's {d['torch_error']:.1e})"
                         for r, p, d in rows if not d["ok"]]}


def report(record):
    """The stdout report of a record (the JSON this module writes)."""
    peer, s = record["peer"], record["summary"]
    head = (f"{'layer':44s} {'shape':30s} {'pass':5s} {'algo':9s} {'clconv ms':>10s} {'torch ms':>10s} "
            f"{'ratio':>6s} {'error':>8s} {'1st ms':>8s}")
    lines = [head, "-" * len(head)]
    for r in record["layers"]:
        for p, d in r["passes"].items():
            flag = "" if d["ok"] else "  WRONG"
            lines.append(f"{r['id'][:44]:44s} {r['shape'][:30]:30s} {SHORT[p]:5s} {d['algorithm']:9s} "
                         f"{d['clconv_ms']:10.3f} {d['torch_ms']:10.3f} {d['ratio']:6.2f} {d['error']:8.1e} "
                         f"{d['first_call_ms']:8.1f}{flag}")
    lines.append(f"ratio = clconv median / {peer} median (lower is better for clconv); clconv: plain calls, a new "
                 f"result each; 1st ms: clconv's first call (plan, kernel builds, one run); math "
                 f"{record.get('math', 'strict')}, errors within {record['tolerance']:.2g}")
    lines.append("")
    lines.append(f"geometric mean of the ratio over {s['overall']['layer_passes']} layer-passes: "
                 f"{s['overall']['geomean_ratio']:.2f}   (" +
                 ", ".join(f"{SHORT[p]} {m['geomean_ratio']:.2f}" for p, m in s["per_pass"].items()) +
                 f"); of the minimum times: {s['overall']['geomean_min_ratio']:.2f} (less sensitive to a busy machine)")
    lines.append(f"clconv faster on {s['faster']['clconv']} layer-passes, {peer} on {s['faster']['torch']}")
    if "graph" in s:
        lines.append(f"each pass recorded in a clconv.graph() and replayed, against {peer}'s plain calls: "
                     f"{s['graph']['overall']:.2f}   (" +
                     ", ".join(f"{SHORT[p]} {m:.2f}" for p, m in s["graph"]["per_pass"].items()) + "); per network: " +
                     ", ".join(f"{net} {m['ratio']:.2f}" for net, m in s["graph"]["networks"].items()))
    lines.append("per kind of layer:")
    for k, m in s["per_kind"].items():
        lines.append(f"  {k:22s} {m['geomean_ratio']:6.2f}  over {m['layer_passes']} layer-passes")
    lines.append("")
    lines.append(f"conv time per training step at batch {record['batch']} (fwd + grad-input + grad-weight of every "
                 f"Conv2d, weighted by count); first calls (a layer shared with an earlier network counted there):")
    lines.append(f"  {'network':16s} {'Conv2d':>7s} {'clconv ms':>10s} {'torch ms':>10s} {'ratio':>6s} "
                 f"{'1st clconv s':>12s} {'1st torch s':>11s}")
    for net, m in s["networks"].items():
        measured = f"{m['conv2d_measured']}/{m['conv2d_layers']}"
        lines.append(f"  {net:16s} {measured:>7s} {m['clconv_step_ms']:10.2f} {m['torch_step_ms']:10.2f} "
                     f"{m['ratio']:6.2f} {m['clconv_first_call_s']:12.2f} {m['torch_first_call_s']:11.2f}")
    lines.append("")
    lines.append(f"worst {len(s['worst'])} layer-passes by ratio:")
    for w in s["worst"]:
        d = next(r for r in record["layers"] if r["id"] == w["id"])["passes"][w["pass"]]
        device = (f"; device {d['device_ms']:.3f} ms in {d['launches']} launch(es): " +
                  ", ".join(f"{k} {v:.3f}" for k, v in sorted(d["kernels"].items(), key=lambda kv: -kv[1]))
                  if "device_ms" in d else "")
        lines.append(f"  {w['ratio']:6.2f}  {w['id'][:44]:44s} {w['shape'][:30]:30s} {SHORT[w['pass']]:5s} "
                     f"{w['algorithm']:9s} {w['clconv_ms']:9.3f} vs {w['torch_ms']:9.3f} ms{device}")
    if any("device_ms" in d for r in record["layers"] for d in r["passes"].values()):
        lines.append("")
        lines.append("host time per pass (wall time of a plain call, least and median over the layer-passes; "
                     "device time and launches from profiling events):")
        for p in PASSES:
            rows = [d for r in record["layers"] for q, d in r["passes"].items() if q == p]
            lines.append(f"  {SHORT[p]:5s} least {min(d['clconv_min_ms'] for d in rows) * 1e3:7.1f} us, median "
                         f"{statistics.median(d['clconv_ms'] for d in rows) * 1e3:8.1f} us; device median "
                         f"{statistics.median(d['device_ms'] for d in rows) * 1e3:8.1f} us; launches "
                         f"{min(d['launches'] for d in rows)}-{max(d['launches'] for d in rows)} (median "
                         f"{statistics.median(d['launches'] for d in rows):g})")
    for f in s["failures"]:
        lines.append(f"WRONG RESULT: {f}")
    return "\n".join(lines)


def plot(record, path):
    """A PNG: per network the step-time ratio, and per layer-pass the ratio against PyTorch's time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nets = record["summary"]["networks"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    bars = left.bar(range(len(nets)), [m["ratio"] for m in nets.values()], color="tab:blue")
    left.bar_label(bars, fmt="%.2f")
    left.axhline(1, color="gray", linestyle="--")
    left.set_xticks(range(len(nets)), list(nets), rotation=30, ha="right")
    left.set_ylabel(f"conv time per training step, clconv / {record['peer']}")
    left.set_title(f"{record['device']}, batch {record['batch']} ({record['date']})")
    for p, color in zip(PASSES, ("tab:blue", "tab:orange", "tab:green")):
        points = [(d["torch_ms"], d["ratio"]) for r in record["layers"] for q, d in r["passes"].items() if q == p]
        right.scatter(*zip(*points), s=12, color=color, label=SHORT[p], alpha=0.7)
    right.axhline(1, color="gray", linestyle="--")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel(f"{record['peer']} median ms (log)")
    right.set_ylabel("clconv / peer per layer-pass (log; below 1: clconv faster)")
    right.legend()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def slug(name):
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench networks", description=__doc__.splitlines()[0])
    ap.add_argument("--networks", help="comma-separated subset (default: all in the layers file)")
    ap.add_argument("--batch", type=int, help="images per call (default 32 on a GPU, 8 on a CPU device)")
    ap.add_argument("--device", help="OpenCL device, as CLCONV_DEVICE takes it (e.g. pocl, nvidia, 0:1)")
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help=f"seconds of timing per layer-pass, both sides and all rounds together (default "
                         f"{BUDGET_S}); each side still runs at least one warm-up and 3 timed batches a round")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"alternating rounds per layer-pass (default {ROUNDS})")
    ap.add_argument("--layers", help="comma-separated glob patterns of layer ids (e.g. 'resnet50:layer1.*')")
    ap.add_argument("--limit", type=int, help="only the first N selected layers")
    ap.add_argument("--json", help="output path (default bench/results/<device>-networks-b<batch>.json)")
    ap.add_argument("--plot", help="also draw a PNG chart to this path (needs matplotlib)")
    ap.add_argument("--file", default=str(LAYERS), help="the layers file (default: networks.json beside this module)")
    ap.add_argument("--profile", action="store_true", help="also run each layer-pass once on a profiling queue: "
                                                           "its device time by kernel and its launches")
    ap.add_argument("--graph", action="store_true", help="also time each pass recorded in a clconv.graph() and "
                                                         "replayed (a recorded network's launches alone)")
    ap.add_argument("--first-calls", action="store_true", help="only clconv's first calls, cold, cold after "
                    "clconv.prepare() and warm, each in a new process (see above)")
    ap.add_argument("--runs", default=",".join(FIRST_CALL_RUNS), help=f"with --first-calls, these runs in this "
                    f"order (default {','.join(FIRST_CALL_RUNS)}; warm reuses the caches of the run before it)")
    ap.add_argument("--first-calls-child", metavar="JSON", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--math", choices=list(MODES), default="strict",
                    help="both sides' math mode: strict (default), tf32 or fp16 (see above)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="instead of measuring, combine runs of network subsets "
                    "on one device and batch (one device call each, say) into one record (--json, --plot)")
    args = ap.parse_args(argv)
    if args.merge:
        return write(merge([json.loads(Path(f).read_text()) for f in args.merge], load_layers(args.file)),
                     Path(args.json or ap.error("--merge needs --json")), args.plot)

    data = load_layers(args.file)
    networks = args.networks.split(",") if args.networks else list(data["networks"])
    unknown = [n for n in networks if n not in data["networks"]]
    if unknown:
        ap.error(f"unknown networks {unknown}; the layers file has {list(data['networks'])}")
    layers = select(data, networks, args.layers.split(",") if args.layers else None, args.limit)
    if not layers:
        ap.error("no layer selected")
    if args.device:
        os.environ["CLCONV_DEVICE"] = args.device   # read when clconv first picks its device, just below
    queue = clconv.default_queue()
    device = queue.device
    batch = args.batch or (32 if device.type & cl.device_type.GPU else 8)
    if args.first_calls_child:
        record = first_calls_run(layers, batch, queue, args.prepare)
        Path(args.first_calls_child).write_text(json.dumps(record))
        return 0
    runs = args.runs.split(",")
    if set(runs) - set(FIRST_CALL_RUNS):
        ap.error(f"--runs takes {', '.join(FIRST_CALL_RUNS)}, not {args.runs}")
    if runs[0] == "warm":
        ap.error("--runs: warm needs a run before it, whose caches it reuses")
    if args.first_calls:
        argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--first-calls"]
        print(f"first calls: {device.platform.name} / {device.name}; batch {batch}; {len(layers)} layers x 3 passes",
              flush=True)
        record = {"date": datetime.date.today().isoformat(), "device": device.name, "platform": device.platform.name,
                  "driver": device.driver_version, "batch": batch, "networks": networks,
                  "layer_passes": 3 * len(layers), "host_cores": os.cpu_count(),
                  "runs": first_calls(argv, device.name, batch, runs)}
        path = Path(args.json) if args.json else HERE / "results" / f"{slug(device.name)}-networks-b{batch}-first-calls.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
        print(f"wrote {path}")
        return 0
    try:
        import torch
    except ImportError:
        ap.error("PyTorch, the peer this benchmark compares with, is not installed (pip install clconv[bench])")
    print(f"device: {device.platform.name} / {device.name}; batch {batch}; {len(layers)} layers x 3 passes; "
          f"networks: {', '.join(networks)}", flush=True)
    results = run_layers(layers, batch, queue, args.budget, args.rounds, profile=args.profile, graph=args.graph,
                         math=args.math)
    today = datetime.date.today().isoformat()
    record = {"date": today, "device": device.name, "platform": device.platform.name,
              "driver": device.driver_version, "machine": platform.machine(), "python": sys.version.split()[0],
              "clconv": clconv.__version__, "torch": torch.__version__, "peer": results[0]["peer"], "batch": batch,
              "budget_s": args.budget, "rounds": args.rounds, "math": args.math,
              "tolerance": tolerance(MODES[args.math], args.math), "networks": networks,
              "layers": results, "summary": summarise(results, networks, data["networks"])}
    return write(record, Path(args.json) if args.json else
                 HERE / "results" / f"{slug(device.name)}-networks-b{batch}{'' if args.math == 'strict' else '-' + args.math}.json",
                 args.plot)


def write(record, path, plot_path=None):
    """Report ``record``, write it to ``path`` (and a chart to ``plot_path``); the exit status."""
    print(report(record))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")
    if plot_path:
        plot(record, plot_path)
        print(f"wrote {plot_path}")
    return 1 if record["summary"]["failures"] else 0


def merge(records, data):
    """One record from runs of network subsets on one device and batch: their layers, each once
    (as its first run measured it), summarised over all their networks."""
    first = records[0]
    for r in records[1:]:
        if (r["device"], r["batch"], r["peer"]) != (first["device"], first["batch"], first["peer"]):
            raise ValueError(f"cannot merge runs of {r['device']} batch {r['batch']} ({r['peer']}) with runs of "
                             f"{first['device']} batch {first['batch']} ({first['peer']})")
    networks = [n for r in records for n in r["networks"]]
    layers = list({lay["id"]: lay for r in reversed(records) for lay in r["layers"]}.values())
    return {**first, "networks": networks, "layers": layers, "merged_from": [
        {k: r[k] for k in ("date", "networks", "budget_s", "rounds")} for r in records],
            "summary": summarise(layers, networks, data["networks"])}


if __name__ == "__main__":
    raise SystemExit(main())
