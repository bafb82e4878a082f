"""Large single images, whose workspace exceeds the budget, against the same layer over a batch
of smaller images with the same pixels (about the same FLOPs).

    python -m bench tiles [--json PATH] [--no-check]

The cases are the device type's: on CPU devices 1x64x2048x2048 (3x3, stride 2) and
1x32x3000x3000 (3x3); on GPUs 1x64x5800x5800 (3x3, 8 filters). Each pass of the large image
and of its batched twin (k*k images of (H/k)x(W/k)) is timed (best of 3 after a warm-up) and
reported in GFLOP/s; the large image's results are checked once against PyTorch in float64
(on the GPU where PyTorch has CUDA), by normalised error.
"""
import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import clconv
from clconv.reference import TOLERANCE, normalised_error
from clconv.tuning import time_ms

from .run import HERE

CASES = {  # name: (input, weight, stride, padding, twin's k)
    "cpu": {"1x64x2048x2048_s2": ((1, 64, 2048, 2048), (64, 64, 3, 3), 2, 1, 8),
            "1x32x3000x3000": ((1, 32, 3000, 3000), (32, 32, 3, 3), 1, 1, 10)},
    "gpu": {"1x64x5800x5800_k8": ((1, 64, 5800, 5800), (8, 64, 3, 3), 1, 1, 10)},
}
PASSES = ("forward", "backward_input", "backward_weight")


def _timed(queue, xs, ws, stride, padding):
    """(plan, {pass: seconds}, device arrays) for one geometry, random data."""
    rng = np.random.default_rng(0)
    x = cla.to_device(queue, rng.standard_normal(xs, np.float32))
    w = cla.to_device(queue, (rng.standard_normal(ws, np.float32) / np.sqrt(np.prod(ws[1:]))).astype(np.float32))
    p = clconv.plan(xs, ws, stride=stride, padding=padding, queue=queue)
    dy = cla.to_device(queue, rng.standard_normal(p.geometry.output_shape, np.float32))
    outs = {"forward": cla.empty(queue, p.geometry.output_shape, np.float32),
            "backward_input": cla.empty(queue, xs, np.float32), "backward_weight": cla.empty(queue, ws, np.float32)}
    calls = {"forward": lambda: p.forward(x, w, out=outs["forward"]),
             "backward_input": lambda: p.backward_input(w, dy, out=outs["backward_input"]),
             "backward_weight": lambda: p.backward_weight(x, dy, out=outs["backward_weight"])}
    return p, {k: time_ms(fn, queue, repeat=3) / 1e3 for k, fn in calls.items()}, (x, w, dy, outs)


def _check(host, stride, padding, block=64):
    """Normalised errors of the three results against PyTorch in float64. On a GPU, whole; on the
    CPU, whose PyTorch float64 convolution unfolds the whole image (20 GB for 1x32x3000x3000),
    over blocks of ``block`` output rows, each with the input rows it reads (zeros beyond the
    image): the blocks' outputs side by side, their grad-inputs added at their rows, their
    grad-weights summed, all in float64."""
    import torch   # the `bench` extra
    x, w, dy, outs = host
    f64 = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev, torch.float64)   # noqa: E731
    if torch.cuda.is_available():
        dev, opts = "cuda", dict(stride=stride, padding=padding)
        want = {"forward": torch.nn.functional.conv2d(f64(x), f64(w), **opts).cpu().numpy(),
                "backward_input": torch.nn.grad.conv2d_input(x.shape, f64(w), f64(dy), **opts).cpu().numpy(),
                "backward_weight": torch.nn.grad.conv2d_weight(f64(x), w.shape, f64(dy), **opts).cpu().numpy()}
        return {k: normalised_error(outs[k], want[k]) for k in PASSES}
    dev, (N, C, H, W), kh = "cpu", x.shape, w.shape[2]
    OH, tw = dy.shape[2], f64(w)
    y, dx, dw = np.zeros(dy.shape), np.zeros(x.shape), np.zeros(w.shape)
    for a in range(0, OH, block):
        h = min(block, OH - a)
        top, bottom = a * stride - padding, (a + h - 1) * stride - padding + kh   # input rows read
        xb = np.zeros((N, C, bottom - top, W), np.float32)
        xb[:, :, max(0, -top):min(H, bottom) - top] = x[:, :, max(0, top):min(H, bottom)]
        tx, tdy = f64(xb), f64(dy[:, :, a:a + h])
        opts = dict(stride=stride, padding=(0, padding))
        y[:, :, a:a + h] = torch.nn.functional.conv2d(tx, tw, **opts).numpy()
        dxb = torch.nn.grad.conv2d_input(xb.shape, tw, tdy, **opts).numpy()
        dx[:, :, max(0, top):min(H, bottom)] += dxb[:, :, max(0, -top):min(H, bottom) - top]
        dw += torch.nn.grad.conv2d_weight(tx, w.shape, tdy, **opts).numpy()
    return {k: normalised_error(outs[k], v) for k, v in zip(PASSES, (y, dx, dw))}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench tiles", description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="output path (default bench/results/<device>-tiles.json)")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with PyTorch")
    args = ap.parse_args(argv)
    queue = clconv.default_queue()
    device = queue.device
    kind = "gpu" if device.type & cl.device_type.GPU else "cpu"
    print(f"device: {device.platform.name} / {device.name.strip()}")
    rows = []
    for name, (xs, ws, stride, padding, k) in CASES[kind].items():
        big, t_big, arrays = _timed(queue, xs, ws, stride, padding)
        x, w, dy, outs = arrays
        host = (x.get(), w.get(), dy.get(), {k: a.get() for k, a in outs.items()})
        del arrays, x, w, dy, outs
        clconv.free_memory()   # the device arrays' memory back before the float64 copies
        errors = {} if args.no_check else _check(host, stride, padding)
        del host
        twin_xs = (xs[0] * k * k, xs[1], xs[2] // k, xs[3] // k)
        twin, t_twin, _ = _timed(queue, twin_xs, ws, stride, padding)
        clconv.free_memory()
        row = {"name": name, "input": xs, "weight": ws, "stride": stride, "padding": padding,
               "explain": big.explain(), "twin_input": twin_xs, "twin_explain": twin.explain(), "passes": {}}
        flops, twin_flops = big.geometry.flops(), twin.geometry.flops()
        for p in PASSES:
            gf, twin_gf = flops / t_big[p] / 1e9, twin_flops / t_twin[p] / 1e9
            row["passes"][p] = {"algorithm": big.algorithms[p], "s": t_big[p], "gflops": gf, "twin_s": t_twin[p],
                                "twin_algorithm": twin.algorithms[p], "twin_gflops": twin_gf,
                                "ratio": twin_gf / gf, "error": errors.get(p)}
            ok = "" if p not in errors else (" ok" if errors[p] <= TOLERANCE[np.dtype(np.float32)] else " MISMATCH")
            print(f"{name:20s} {p:16s} {big.algorithms[p]:8s} {t_big[p]:8.3f} s {gf:8.1f} GFLOP/s | twin "
                  f"{twin.algorithms[p]:8s} {t_twin[p]:8.3f} s {twin_gf:8.1f} GFLOP/s | twin/large {twin_gf / gf:5.2f}"
                  + (f" | error {errors[p]:.1e}{ok}" if p in errors else ""), flush=True)
        print("  " + big.explain().splitlines()[1][:200])
        rows.append(row)
    today = datetime.date.today().isoformat()
    path = Path(args.json) if args.json else \
        HERE / "results" / f"{device.name.strip().lower().replace(' ', '-')}-tiles.json"
    path.write_text(json.dumps({"date": today, "device": device.name.strip(), "platform": device.platform.name,
                                "cases": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
