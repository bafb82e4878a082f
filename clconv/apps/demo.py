"""A short demonstration: list the OpenCL devices, then run an AlexNet-style
grouped convolution (groups=2) forward and backward on the default device and
check every pass against the NumPy reference.  Run: ``python -m clconv.demo``.
Public API only.
"""
import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import clconv
from clconv import ClconvError, DeviceNotFound, pick_device, reference


def _timed(queue, fn, *args, **kw):
    fn(*args, **kw)                       # warm-up: builds kernels
    queue.finish()
    start = time.perf_counter()
    result = fn(*args, **kw)
    queue.finish()
    return result, time.perf_counter() - start


def main():
    try:
        return _demo()
    except ClconvError as exc:   # the device's own failure (its compiler's words), said without a traceback
        print(f"clconv.demo: {type(exc).__name__}: {exc}")
        return 1


def _demo():
    print("OpenCL devices:")
    for pi, platform in enumerate(cl.get_platforms()):
        for di, device in enumerate(platform.get_devices()):
            print(f"  {pi}:{di}  {platform.name} / {device.name}")
    try:
        device, why = pick_device()
    except DeviceNotFound as exc:
        print(exc)
        return 2
    queue = clconv.default_queue()
    print(f"default device: {device.name}\n  ({why}; set CLCONV_DEVICE to choose)")

    # AlexNet conv2: 96 -> 256 channels, 5x5, padding 2, two groups (smaller batch).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 96, 27, 27)).astype(np.float32)
    w = (rng.standard_normal((256, 48, 5, 5)) * 0.05).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    opts = dict(padding=2, groups=2)
    dx_, dw_, db_ = (cla.to_device(queue, a) for a in (x, w, b))
    print(clconv.plan(x.shape, w.shape, **opts, queue=queue).explain())

    y, t_fwd = _timed(queue, clconv.conv2d, dx_, dw_, db_, **opts)
    dy = cla.to_device(queue, rng.standard_normal(y.shape).astype(np.float32))
    gx, t_in = _timed(queue, clconv.conv2d_input, x.shape, dw_, dy, **opts)
    gw, t_w = _timed(queue, clconv.conv2d_weight, dx_, w.shape, dy, **opts)
    gb, t_b = _timed(queue, clconv.conv2d_bias, dy)

    dyh = dy.get()
    checks = [("forward", y, reference.conv2d(x, w, b, **opts), t_fwd),
              ("grad-input", gx, reference.conv2d_input(x.shape, w, dyh, **opts), t_in),
              ("grad-weight", gw, reference.conv2d_weight(x, w.shape, dyh, **opts), t_w),
              ("grad-bias", gb, reference.conv2d_bias(dyh), t_b)]
    ok = True
    for name, got, want, seconds in checks:
        err = reference.normalised_error(got.get(), want)
        ok &= err <= reference.TOLERANCE[np.dtype(np.float32)]
        print(f"{name:12s} shape {str(list(got.shape)):20s} normalised max error {err:.2e}  {seconds * 1e3:8.2f} ms")
    print("check against the NumPy reference:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
