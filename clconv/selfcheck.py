"""The known-answer check: an algorithm is trusted on a device only once it has given the
reference's answers there.

OpenCL compilers differ, and some get our kernels wrong without an error (a numerical library's
worst failure). So the first time an algorithm runs on a device, with a given driver, GEMM engine,
math mode (:mod:`clconv.precision`), dtype and kernel sources, it runs every pass of its small
odd-shaped :data:`CASES` against the float64 reference (:mod:`clconv.reference`), within the
mode's tolerance (:func:`clconv.reference.tolerance`). The verdict is kept in the tuning cache
(:mod:`clconv.tuning`), so it is taken once per machine. An algorithm that fails is left out of
``algorithm="auto"`` with a warning naming the device and the error, and forcing it raises
:class:`clconv.ClconvError` (:class:`clconv.plan.Plan` asks :func:`verdict`). ``python -m clconv
check`` runs every case anew and ``python -m clconv info`` shows the stored verdicts.
``CLCONV_SELFCHECK=0`` turns the check off.
"""
import hashlib
import os
import threading
import warnings
from functools import lru_cache

import numpy as np
import pyopencl as cl

from . import probe, reference, tuning
from .geometry import conv_geometry
from .programs import BuildError, ClconvError, kernel_dir
from .recording import outside_graph

# (algorithm, label, input, weight, options): every algorithm at least once, on small odd
# shapes (groups, uneven padding, dilation, channels not multiples of any vector width)
CASES = [
    ("im2col", "im2col", (2, 4, 9, 7), (6, 4, 3, 2), dict(stride=(2, 1), padding=((1, 0), (2, 1)))),
    ("im2col", "im2col grouped", (2, 4, 9, 7), (6, 2, 3, 3), dict(padding="same", groups=2, dilation=2)),
    # across at stride 2: rows wide enough for whole vectors read two at a time and a last vector
    # of three columns, and rows of fewer columns than one vector (forms that two PoCL releases
    # compiled wrong, each its own)
    ("im2col", "im2col strided across", (2, 3, 5, 37), (4, 3, 3, 2), dict(stride=(1, 2), padding=1)),
    ("im2col", "im2col strided narrow", (2, 4, 6, 7), (6, 4, 3, 2), dict(stride=(1, 2), padding=1)),
    ("fc", "fc", (5, 6, 4, 3), (8, 3, 4, 3), dict(groups=2)),
    ("1x1", "1x1", (3, 6, 5, 7), (9, 2, 1, 1), dict(groups=3)),
    ("direct", "direct", (2, 6, 11, 9), (12, 1, 3, 3), dict(stride=2, padding=1, groups=6)),
    ("direct", "direct few-channel", (2, 3, 13, 11), (8, 3, 7, 7), dict(stride=2, padding=3)),
    ("winograd", "winograd", (2, 32, 9, 10), (32, 16, 3, 3), dict(padding=(1, 2), dilation=(1, 2), groups=2)),
    ("winograd", "winograd 5x5", (2, 16, 11, 9), (16, 16, 5, 5), dict(padding=2)),
    ("winograd", "winograd 1x7", (2, 16, 5, 13), (16, 8, 1, 7), dict(padding=(1, 4), dilation=(1, 2), groups=2)),
    ("winograd", "winograd 7x1", (2, 8, 11, 5), (12, 8, 7, 1), dict(padding=(3, 1), dilation=(1, 2))),
    ("fft", "fft", (2, 6, 12, 9), (4, 3, 5, 3), dict(padding=(2, 0), dilation=(1, 2), groups=2)),
]
PASS_NAMES = ("forward", "grad-input", "grad-weight")

_lock = threading.Lock()
_verdicts = {}   # key -> (ok, message), this process's: each verdict is looked up or taken once
_pending = {}    # key -> the lock held while that verdict is looked up or taken


def enabled():
    return os.environ.get("CLCONV_SELFCHECK", "1").strip() != "0"


@lru_cache(maxsize=None)
def sources_digest():
    """A short digest of the kernel sources: a verdict holds for the kernels it ran."""
    h = hashlib.sha256()
    for path in sorted(kernel_dir().iterdir()):
        if path.suffix in (".cl", ".h"):
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:12]


def engine_field(engine, math="strict"):
    """The GEMM engine as a verdict's key and messages name it: "gpu", or "gpu+tf32" for its GEMMs
    in a math mode other than "strict"."""
    return engine if math == "strict" else f"{engine}+{math}"


def key(device, algorithm, engine, dtype, math="strict"):
    """The tuning-cache key of a verdict: selfcheck | device | driver | dtype | algorithm | GEMM
    engine (:func:`engine_field`, with the math mode) | sources."""
    return "|".join(("selfcheck", device.name.strip(), device.driver_version, np.dtype(dtype).name, algorithm,
                     engine_field(engine, math), sources_digest()))


@outside_graph()
def run(make_plan, queue, algorithm, engine, dtype, queues="single", math="strict"):
    """Run ``algorithm``'s cases on ``queue`` with GEMM ``engine`` in math mode ``math``: a list of
    (case label, pass, normalised error or None, ok, message). ``make_plan(geometry, dtype, queue,
    algorithm=, queues=, gemm=, math=)`` builds a plan that asks for no verdict (a
    :class:`clconv.plan.Plan` with ``selfcheck=False``)."""
    dtype = np.dtype(dtype)
    tolerance = reference.tolerance(dtype, math)
    rng = np.random.default_rng(0)
    results = []
    for name, label, xs, ws, opts in CASES:
        if name != algorithm:
            continue
        g = conv_geometry(xs, ws, opts.get("stride", 1), opts.get("padding", 0), opts.get("dilation", 1),
                          opts.get("groups", 1))
        x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
        b = rng.standard_normal(ws[0]).astype(dtype)
        dy = rng.standard_normal(g.output_shape).astype(dtype)
        want = {"forward": lambda: reference.conv2d(x, w, b, **opts),
                "grad-input": lambda: reference.conv2d_input(xs, w, dy, **opts),
                "grad-weight": lambda: reference.conv2d_weight(x, ws, dy, **opts)}
        try:
            plan = make_plan(g, dtype, queue, algorithm=algorithm, queues=queues, gemm=engine, math=math)
            got = {"forward": lambda: plan.forward(x, w, b), "grad-input": lambda: plan.backward_input(w, dy),
                   "grad-weight": lambda: plan.backward_weight(x, dy)}
        except (ValueError, ClconvError, cl.Error) as exc:
            results += [(label, p, None, False, _failure(exc)) for p in PASS_NAMES]
            continue
        for p in PASS_NAMES:
            try:
                err = float(reference.normalised_error(got[p](), want[p]()))
            except (ClconvError, cl.Error) as exc:
                results.append((label, p, None, False, _failure(exc)))
                continue
            ok = err <= tolerance   # NaN fails
            results.append((label, p, err, ok, "" if ok else f"normalised max error {err:.2g}"))
    return results


BUILD_FAILED = "BuildError: "   # how a result's message starts where a kernel did not build


def _failure(exc):
    """A failed result's message: the error's type and its text (a build failure's first line
    carries the compiler's words, :class:`clconv.programs.BuildError`)."""
    return f"{BUILD_FAILED if isinstance(exc, BuildError) else type(exc).__name__ + ': '}{exc}"


def summary(results):
    """(ok, message) of a :func:`run`: the first failure, or how many results matched."""
    for label, p, _, ok, message in results:
        if not ok:
            return False, f"{label} {p}: {message.splitlines()[0] if message else 'failed'}"
    return True, f"{len(results)} results match the reference"


def store(device, algorithm, engine, dtype, results, math="strict"):
    """Keep a :func:`run`'s verdict for this process and in the tuning cache; (ok, message).
    Where a kernel did not build and the device now fails :mod:`clconv.probe` too, the failure is
    the device's, not the algorithm's: nothing is kept, and :class:`ClconvError` says so."""
    ok, message = summary(results)
    if not ok and any(m.startswith(BUILD_FAILED) for *_, m in results) and not probe.check(device, fresh=True)[0]:
        probe.require(device)
    k = key(device, algorithm, engine, dtype, math)
    with _lock:
        _verdicts[k] = (ok, message)
    tuning.store({k: {"ok": ok, "message": message}})
    return ok, message


def verdict(make_plan, queue, algorithm, engine, dtype, math="strict"):
    """(ok, message) for ``algorithm`` with GEMM ``engine`` in math mode ``math`` on ``dtype``
    arrays on ``queue``'s device:
    from this process, else the tuning cache, else checked now (:func:`run` with ``make_plan``,
    on a new queue of ``queue``'s context and device) and kept. A failure warns once per
    process, naming the device and the error."""
    if not enabled():
        return True, "known-answer check off (CLCONV_SELFCHECK=0)"
    device = queue.device
    probe.require(device)   # a device that builds nothing has no verdicts to give
    k = key(device, algorithm, engine, dtype, math)
    with _lock:
        if k in _verdicts:
            return _verdicts[k]
        pending = _pending.setdefault(k, threading.Lock())
    with pending:   # threads planning at once (clconv.prepare) take one check of an algorithm, not one each
        with _lock:
            found = _verdicts.get(k)
        if found is not None:
            return found
        entry = tuning.load().get(k)
        if isinstance(entry, dict) and isinstance(entry.get("ok"), bool):
            with _lock:
                found = _verdicts[k] = (entry["ok"], str(entry.get("message", "")))
        else:   # on a queue of its own: the caller's may wait on work (a user event) the check cannot see
            own = cl.CommandQueue(queue.context, device)
            found = store(device, algorithm, engine, dtype, run(make_plan, own, algorithm, engine, dtype, math=math),
                          math)
    if not found[0]:
        warnings.warn(f"clconv: {algorithm} (GEMMs on {engine_field(engine, math)}, {np.dtype(dtype).name}) failed "
                      f"its known-answer check on {device.name.strip()} ({device.platform.name.strip()}, driver "
                      f"{device.driver_version}): {found[1]}; algorithm='auto' leaves it out", RuntimeWarning,
                      stacklevel=2)
    return found


def stored(device):
    """{(dtype, algorithm, engine): (ok, message)} of the verdicts the tuning cache holds for
    ``device``'s driver and the current kernel sources; ``engine`` as :func:`engine_field` names
    it ("gpu+tf32" for a math mode other than "strict")."""
    head = f"selfcheck|{device.name.strip()}|{device.driver_version}|"
    found = {}
    for k, entry in tuning.load().items():
        parts = k.split("|")
        if k.startswith(head) and len(parts) == 7 and parts[6] == sources_digest() and isinstance(entry, dict):
            found[(parts[3], parts[4], parts[5])] = (bool(entry.get("ok")), str(entry.get("message", "")))
    return found


def forget():
    """Drop this process's verdicts (the tuning cache keeps its own): for tests."""
    with _lock:
        _verdicts.clear()
