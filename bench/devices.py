"""Several devices against one: each pass of the large workloads on one device and spread over
several (clconv.spread), both splits, side by side in one run.

    python -m bench devices [--workload NAME ...] [--devices gpus|sub-devices|pocl-roots|queues]
                            [--count K] [--size cpu|gpu] [--rounds R] [--json PATH]

``--devices``: the GPUs of the first platform with several ("gpus", the default where there
are), the default device cut into K sub-devices ("sub-devices", CPU runtimes), or the root
PoCL devices (``POCL_DEVICES="pthread pthread"``), or K queues on the default device itself
("queues": no speed-up to gain, it measures what spreading costs). The one-device baseline is the first of
them, in the same context; with sub-devices, the partitioned device whole is timed too. The shares come from clconv.tuner.tune_spread (each device's
throughput on an even part alone); then, in R rounds alternating one device and each split,
min and median per call, GFLOP/s, GB/s, and the speed-up (one device's min over the spread's).
Each spread result is checked once against the one-device result.
"""
import argparse
import datetime
import json
import statistics
import sys

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import clconv
from clconv import tuner
from clconv.geometry import conv_geometry
from clconv.reference import TOLERANCE, normalised_error

from .run import HERE, load_workloads, pass_bytes, time_it

LARGE = ("fc_mode_seed", "alexnet_conv2", "alexnet_conv4", "dilated_3x3")   # the target workloads
PASSES = ("forward", "backward_input", "backward_weight")


def pick_queues(kind, count):
    if kind == "sub-devices":
        return clconv.sub_device_queues(count)
    if kind == "queues":
        home = clconv.default_queue()
        return [home] + [cl.CommandQueue(home.context, home.device) for _ in range(count - 1)]
    if kind == "pocl-roots":
        devices = [d for p in cl.get_platforms() if "portable" in p.name.lower() for d in p.get_devices()]
    else:
        devices = next((p.get_devices(cl.device_type.GPU) for p in cl.get_platforms()
                        if len(p.get_devices(cl.device_type.GPU)) >= count), [])
    if len(devices) < count:
        raise SystemExit(f"--devices {kind}: {len(devices)} device(s), {count} needed")
    return clconv.device_queues(devices[:count])


def _calls(p, x, w, dy, outs):
    return {"forward": lambda: p.forward(x, w, out=outs["forward"]),
            "backward_input": lambda: p.backward_input(w, dy, out=outs["backward_input"]),
            "backward_weight": lambda: p.backward_weight(x, dy, out=outs["backward_weight"])}


def run(w, size, queues, rounds, log, whole=None):
    s = w[size]
    g = conv_geometry((s["N"], s["C"], s["H"], s["W"]), (s["K"], s["C"] // s["groups"], s["kh"], s["kw"]),
                      s["stride"], s["padding"], s["dilation"], s["groups"])
    home = queues[0]
    rng = np.random.default_rng(0)
    x, wt, dy = (cla.to_device(home, rng.standard_normal(shape).astype(np.float32))
                 for shape in (g.input_shape, g.weight_shape, g.output_shape))
    outs = {p: cla.empty(home, shape, np.float32)
            for p, shape in zip(PASSES, (g.output_shape, g.input_shape, g.weight_shape))}

    def make_plan(sub, q):
        return clconv.plan(sub.input_shape, sub.weight_shape, sub.stride, sub.pads, sub.dilation, sub.groups, queue=q)

    one = make_plan(g, home)
    if whole is not None:   # the partitioned device itself, in its own context, on the same data
        wx, ww, wdy = (cla.to_device(whole, a.get()) for a in (x, wt, dy))
        wouts = {p: cla.empty(whole, a.shape, np.float32) for p, a in outs.items()}
        whole_plan = make_plan(g, whole)
    tuned = tuner.tune_spread(g, np.float32, tuple(queues), make_plan, save=False)
    splits = ("images", "groups") if g.groups > 1 else ("images",)
    rows = []
    for p in PASSES:
        plans = {"one device": one}
        for split in splits:
            shares = tuned[p]["shares"] if tuned[p]["split"] == split else None
            plans[split] = clconv.plan(g.input_shape, g.weight_shape, g.stride, g.pads, g.dilation, g.groups,
                                       queue=queues, split=split, shares=shares or [1] * len(queues))
        reference = None
        times = {k: [] for k in plans}
        if whole is not None:
            times["whole device"] = []
        for _ in range(rounds):   # alternating, so drifts of the machine hit every variant alike
            if whole is not None:
                times["whole device"].append(time_it(_calls(whole_plan, wx, ww, wdy, wouts)[p], whole.finish,
                                                     repeat=5, budget_s=2.0))
            for name, plan in plans.items():
                call = _calls(plan, x, wt, dy, outs)[p]
                times[name].append(time_it(call, home.finish, repeat=5, budget_s=2.0))
                result = outs[p].get()
                if name == "one device":
                    reference = result
                elif len(times[name]) == 1:
                    times[name + " error"] = normalised_error(result, reference)
        flops, nbytes = g.flops(), pass_bytes(g, 4)
        row = {"workload": w["name"], "pass": p, "tuned": tuned[p], "variants": {}}
        base = min(t[0] for t in times["one device"])
        for name, plan in {**plans, **({"whole device": whole_plan} if whole is not None else {})}.items():
            best = min(t[0] for t in times[name])
            median = statistics.median(t[1] for t in times[name])
            row["variants"][name] = {"min_ms": best * 1e3, "median_ms": median * 1e3, "gflops": flops / best / 1e9,
                                     "gbs": nbytes / best / 1e9, "speedup": base / best,
                                     "error": times.get(name + " error"), "algorithms": plan.algorithms[p]}
        if whole is not None:
            plans["whole device"] = whole_plan
        for name, plan in plans.items():
            best = min(t[0] for t in times[name])
            median = statistics.median(t[1] for t in times[name])
            err = times.get(name + " error")
            ok = "" if err is None else (" ok" if err <= TOLERANCE[np.dtype(np.float32)] else " MISMATCH")
            log(f"{w['name']:16s} {p:16s} {name:12s} {best * 1e3:9.3f} ms (median {median * 1e3:9.3f}) "
                f"{flops / best / 1e9:8.1f} GFLOP/s {nbytes / best / 1e9:7.1f} GB/s  x{base / best:5.2f}"
                + ("" if err is None else f"  error {err:.1e}{ok}"))
        rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench devices", description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="append", help=f"workload name (repeatable; default: {', '.join(LARGE)})")
    ap.add_argument("--devices", choices=["gpus", "sub-devices", "pocl-roots", "queues"])
    ap.add_argument("--count", type=int, default=2)
    ap.add_argument("--size", choices=["cpu", "gpu"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    gpu = bool(clconv.default_queue().device.type & cl.device_type.GPU)
    kind = args.devices or ("gpus" if gpu else "sub-devices")
    queues = pick_queues(kind, args.count)
    size = args.size or ("gpu" if queues[0].device.type & cl.device_type.GPU else "cpu")
    names = args.workload or LARGE
    workloads = [w for w in load_workloads() if w["name"] in names]
    labels = [f"{q.device.name.strip()} ({q.device.max_compute_units} CU)" for q in queues]
    print(f"devices ({kind}): {'; '.join(labels)}")
    rows = []
    for w in workloads:
        rows += run(w, size, queues, args.rounds, lambda line: print(line, flush=True),
                    clconv.default_queue() if kind == "sub-devices" else None)
    for name in ("images", "groups"):
        ups = [r["variants"][name]["speedup"] for r in rows if name in r["variants"]]
        if ups:
            print(f"geometric mean speed-up, split by {name}: {float(np.exp(np.mean(np.log(ups)))):.2f} "
                  f"over {len(ups)} passes")
    today = datetime.date.today().isoformat()
    path = args.json or HERE / "results" / f"{labels[0].split(' (')[0].lower().replace(' ', '-')}-devices-" \
                                           f"{kind}.json"
    with open(path, "w") as f:
        json.dump({"date": today, "devices": labels, "kind": kind, "size": size, "rows": rows}, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
