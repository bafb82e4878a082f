"""The fused bias + ReLU forward against bias and ReLU run separately, on the reference workloads.

    python -m bench fused [--size cpu|gpu] [--json PATH]

Per workload, forward pass, interleaved in rounds: the plan's forward with ``relu=True`` (bias
and ReLU as the output is written); the forward with bias, then a ReLU pass; the forward
without bias, then a bias pass and a ReLU pass (both with clconv's own epilogue kernel,
kernels/bias.cl); and the forward with bias, then a ReLU as a user would write it with
pyopencl's elementwise tools. Each result is checked once against the NumPy reference.
"""
import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
from pyopencl.elementwise import ElementwiseKernel

import clconv
from clconv import reference
from clconv.bias import fill_bias
from clconv.buffers import ref
from clconv.reference import normalised_error

from .run import HERE, load_workloads, time_it

ROUNDS = 3


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench fused", description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("cpu", "gpu"), help="workload sizes (default: by device type)")
    ap.add_argument("--json", help="output path (default bench/results/<device>-fused.json)")
    args = ap.parse_args(argv)
    queue = clconv.default_queue()
    device = queue.device
    size = args.size or ("gpu" if device.type & cl.device_type.GPU else "cpu")
    relu = ElementwiseKernel(queue.context, "float *y", "y[i] = y[i] > 0 ? y[i] : 0", "bench_relu")
    rows = []
    print(f"device: {device.platform.name} / {device.name}; sizes: {size}")
    print(f"{'workload':16s} {'algo':8s} {'fused ms':>9s} {'+relu':>9s} {'+bias+relu':>11s} {'+pyopencl':>10s} "
          f"{'x +relu':>8s} {'x 3':>6s} {'x pyopencl':>10s}")
    for w in load_workloads():
        s = w[size]
        xs, ws = (s["N"], s["C"], s["H"], s["W"]), (s["K"], s["C"] // s["groups"], s["kh"], s["kw"])
        opts = dict(stride=s["stride"], padding=s["padding"], dilation=s["dilation"], groups=s["groups"])
        rng = np.random.default_rng(0)
        x, wt, b = (rng.standard_normal(xs, np.float32), (rng.standard_normal(ws, np.float32) / np.sqrt(np.prod(ws[1:]))).astype(np.float32),
                    rng.standard_normal(s["K"], np.float32))
        xd, wd, bd = (cla.to_device(queue, a) for a in (x, wt, b))
        p = clconv.plan(xs, ws, **opts, queue=queue)
        y = cla.empty(queue, p.geometry.output_shape, np.float32)
        N, K, P = s["N"], s["K"], int(np.prod(p.geometry.output_shape[2:]))
        styles = {
            "fused": lambda: p.forward(xd, wd, bd, out=y, relu=True),
            "bias_then_relu": lambda: (p.forward(xd, wd, bd, out=y),
                                       fill_bias(queue, np.float32, ref(y), None, N, K, P, add=True, relu=True)),
            "separate": lambda: (p.forward(xd, wd, out=y), fill_bias(queue, np.float32, ref(y), ref(bd), N, K, P, add=True),
                                 fill_bias(queue, np.float32, ref(y), None, N, K, P, add=True, relu=True)),
            "pyopencl_relu": lambda: (p.forward(xd, wd, bd, out=y), relu(y, queue=queue)),
        }
        n = min(s["N"], 4)
        want = np.maximum(reference.conv2d(x[:n], wt, b, **opts), 0)
        errors = {}
        for name, fn in styles.items():
            fn()
            errors[name] = normalised_error(y.get()[:n], want)
        times = {name: [] for name in styles}
        for _ in range(ROUNDS):
            for name, fn in styles.items():
                times[name].append(time_it(fn, queue.finish, 10)[1])
        med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        rows.append({"name": w["name"], "algorithm": p.algorithms["forward"], "median_ms": med, "error": errors})
        print(f"{w['name']:16s} {p.algorithms['forward']:8s} {med['fused']:9.3f} {med['bias_then_relu']:9.3f} "
              f"{med['separate']:11.3f} {med['pyopencl_relu']:10.3f} {med['bias_then_relu'] / med['fused']:8.2f} "
              f"{med['separate'] / med['fused']:6.2f} {med['pyopencl_relu'] / med['fused']:10.2f}", flush=True)
    gm = {k: float(np.exp(np.mean([np.log(r["median_ms"][k] / r["median_ms"]["fused"]) for r in rows])))
          for k in ("bias_then_relu", "separate", "pyopencl_relu")}
    print(f"geometric mean speed-up of the fused forward: {gm['bias_then_relu']:.2f}x over the forward with bias then "
          f"a ReLU pass, {gm['separate']:.2f}x over bias and ReLU passes, {gm['pyopencl_relu']:.2f}x over a pyopencl "
          "elementwise ReLU")
    today = datetime.date.today().isoformat()
    path = Path(args.json) if args.json else HERE / "results" / f"{device.name.strip().lower().replace(' ', '-')}-fused.json"
    path.write_text(json.dumps({"date": today, "device": device.name, "platform": device.platform.name, "sizes": size,
                                "speed_up": gm, "workloads": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
