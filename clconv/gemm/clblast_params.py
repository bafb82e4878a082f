"""CLBlast GEMM parameters: candidate sets, their validity rules, and applying tuned ones.

CLBlast picks its GEMM kernels' tile sizes from a database keyed by device; for a
device it does not know (a GPU newer than its database, say) it falls back to a vendor default.
``python -m clconv tune-gemm`` times the candidates below on the convolution
workloads (:func:`clconv.tuner.tune_gemm` finds the passes, :func:`search` times the
sets) and stores the fastest in the tuning cache (:mod:`clconv.tuning`);
every process then applies them (``pyclblast.override_parameters``) before its
first GEMM on that device. CLBlast does not check a set's consistency (a bad
one silently gives wrong results), hence :func:`valid` and the result check in
the search.
"""
import datetime
import threading
import warnings

import numpy as np
import pyclblast

from .. import tuning
from ..programs import ClconvError
from ..reference import TOLERANCE, normalised_error

# A search stores its sets only when they score below this: on a busy CPU a set scoring just
# above it in the search ran no faster in a fresh process (the per-pass noise is that large)
GEMM_GAIN = 0.9

# Kernel -> its parameter names, and candidate sets in that order. The starting points are
# CLBlast's own tuned sets for recent NVIDIA GPUs (its database, generic NVIDIA, Ampere,
# Ada), plus a 128x128 tile for large GEMMs; then GEMMK=1 sets (CLBlast's second tiled
# kernel: no local memory, KREG values of k in registers): the first ran a pointwise-sized
# GEMM faster than CLBlast's own choice on a GPU in one experiment, though over all the
# workloads' GEMM passes no GEMMK=1 set won there.
PARAMETERS = {
    "Xgemm": ("GEMMK", "KREG", "KWG", "KWI", "MDIMA", "MDIMC", "MWG", "NDIMB", "NDIMC", "NWG", "SA", "SB",
              "STRM", "STRN", "VWM", "VWN"),
    "XgemmDirect": ("KWID", "MDIMAD", "MDIMCD", "NDIMBD", "NDIMCD", "PADA", "PADB", "VWMD", "VWND", "WGD"),
}
# Not searched: "GemmRoutine" XGEMM_MIN_INDIRECT_SIZE, the size where CLBlast switches
# between the two kernels. Lowering it to 256 made a tiled kernel fault on a GPU
# (OUT_OF_RESOURCES), which loses the whole context.
CANDIDATES = {
    "Xgemm": [
        (0, 1, 32, 2, 16, 16, 64, 16, 16, 64, 1, 1, 0, 0, 4, 4),
        (0, 1, 32, 2, 8, 8, 32, 16, 16, 64, 1, 1, 0, 0, 4, 4),
        (0, 1, 32, 2, 16, 16, 64, 8, 8, 64, 1, 1, 0, 0, 4, 4),
        (0, 1, 32, 2, 32, 32, 128, 8, 8, 64, 0, 1, 1, 1, 4, 4),
        (0, 1, 32, 2, 8, 8, 64, 32, 16, 128, 1, 1, 1, 1, 2, 2),
        (0, 1, 32, 2, 8, 32, 128, 16, 8, 128, 1, 1, 1, 1, 2, 2),
        (0, 1, 32, 2, 32, 16, 128, 8, 8, 64, 0, 0, 0, 0, 4, 8),
        (0, 1, 16, 2, 8, 8, 32, 8, 16, 128, 1, 0, 1, 1, 4, 8),
        (0, 1, 32, 2, 16, 16, 128, 16, 16, 128, 1, 1, 0, 0, 4, 4),
        (1, 4, 1, 1, 8, 8, 64, 8, 8, 64, 0, 0, 0, 0, 2, 2),
        (1, 4, 1, 1, 8, 8, 64, 8, 8, 64, 0, 0, 0, 0, 4, 4),
        (1, 4, 1, 1, 16, 16, 64, 16, 16, 64, 0, 0, 0, 0, 4, 4),
        (1, 2, 1, 1, 16, 16, 128, 16, 16, 128, 0, 0, 0, 0, 2, 2),
    ],
    "XgemmDirect": [
        (2, 8, 8, 16, 16, 1, 1, 4, 2, 32),
        (8, 8, 16, 32, 16, 1, 1, 2, 1, 32),
        (2, 16, 16, 16, 16, 1, 1, 1, 2, 32),
        (2, 8, 8, 8, 8, 1, 1, 1, 1, 32),
        (2, 8, 8, 8, 8, 1, 1, 1, 1, 16),
        (8, 16, 8, 16, 8, 1, 0, 2, 2, 32),
    ],
}
PRECISION = {np.dtype(np.float32): 32, np.dtype(np.float64): 64}


def candidates(kernel):
    """The candidate sets of ``kernel`` as {name: value} dicts."""
    return [dict(zip(PARAMETERS[kernel], values)) for values in CANDIDATES[kernel]]


def valid(kernel, p, device, itemsize=4):
    """Whether set ``p`` (all of the kernel's parameters, positive ints) obeys the kernel's
    divisibility rules and fits the device."""
    if kernel not in PARAMETERS or not isinstance(p, dict) or set(p) != set(PARAMETERS[kernel]) \
            or not all(type(v) is int and v > 0 or (v == 0 and k in ZERO_OK) for k, v in p.items()):
        return False
    if kernel == "Xgemm":
        mdim, ndim = p["MDIMC"] * p["VWM"], p["NDIMC"] * p["VWN"]
        ok = (p["KWG"] % p["KWI"] == 0 and p["MWG"] % mdim == 0 and p["NWG"] % ndim == 0
              and p["MWG"] % (p["MDIMA"] * p["VWM"]) == 0 and p["NWG"] % (p["NDIMB"] * p["VWN"]) == 0)
        if p["GEMMK"] == 0:
            threads = p["MDIMC"] * p["NDIMC"]
            ok = ok and threads % p["MDIMA"] == 0 and threads % p["NDIMB"] == 0 \
                and p["KWG"] % (threads // p["MDIMA"]) == 0 and p["KWG"] % (threads // p["NDIMB"]) == 0
        else:   # the shapes CLBlast's own tuner explores for this kernel
            ok = ok and p["KREG"] % p["VWN"] == 0 and p["MDIMA"] == p["MDIMC"] and p["NDIMB"] == p["NDIMC"] \
                and p["KWG"] == p["KWI"] == 1 and p["SA"] == p["SB"] == 0
        local = itemsize * (p["SA"] * p["KWG"] * p["MWG"] + p["SB"] * p["KWG"] * p["NWG"])
        return ok and local <= device.local_mem_size and p["MDIMC"] * p["NDIMC"] <= device.max_work_group_size
    if kernel == "XgemmDirect":
        wgd, threads = p["WGD"], p["MDIMCD"] * p["NDIMCD"]
        ok = (wgd % p["KWID"] == 0 and wgd % (p["MDIMCD"] * p["VWMD"]) == 0 and wgd % (p["NDIMCD"] * p["VWND"]) == 0
              and wgd % (p["MDIMAD"] * p["VWMD"]) == 0 and wgd % (p["NDIMBD"] * p["VWND"]) == 0
              and threads % p["MDIMAD"] == 0 and threads % p["NDIMBD"] == 0
              and wgd % (threads // p["MDIMAD"]) == 0 and wgd % (threads // p["NDIMBD"]) == 0)
        local = itemsize * (wgd * (wgd + p["PADA"]) + wgd * (wgd + p["PADB"]))
        return ok and local <= device.local_mem_size and threads <= device.max_work_group_size
    return False


ZERO_OK = {"GEMMK", "SA", "SB", "STRM", "STRN", "PADA", "PADB"}   # flags and paddings may be 0


_lock = threading.Lock()
_applied = {}   # (device.int_ptr, dtype) -> {kernel: params} applied in this process


def override(device, dtype, kernel, params):
    """Make CLBlast use ``params`` for ``kernel`` on ``device`` (process-wide, from now on).

    This counts as the process's applied sets: stored ones are not applied on top of it."""
    pyclblast.override_parameters(device, kernel, PRECISION[np.dtype(dtype)], {k: int(v) for k, v in params.items()})
    _applied.setdefault((device.int_ptr, np.dtype(dtype)), {})[kernel] = params   # what blas.py guards against


def apply_tuned(device, dtype):
    """Before the first GEMM of ``dtype`` on ``device``: apply the stored tuned sets, once.

    Returns what is applied ({} when nothing was tuned for this device and driver).
    """
    key = (device.int_ptr, np.dtype(dtype))
    applied = _applied.get(key)          # every GEMM call asks: no lock once decided
    if applied is not None:
        return applied
    with _lock:
        if key not in _applied:
            _applied[key] = {}
            entry = tuning.load().get(tuning.gemm_key(device, dtype))
            stored = entry.get("overrides") if isinstance(entry, dict) else None
            for kernel, params in (stored if isinstance(stored, dict) else {}).items():
                if not valid(kernel, params, device, np.dtype(dtype).itemsize):
                    warnings.warn(f"clconv: ignoring stored CLBlast parameters for {kernel}: {params}", stacklevel=2)
                    continue
                try:
                    override(device, dtype, kernel, params)
                except RuntimeError as exc:       # e.g. a parameter this CLBlast does not know
                    warnings.warn(f"clconv: CLBlast refused the stored parameters for {kernel}: {exc}",
                                  stacklevel=2)
                    continue
        return _applied[key]


def ignore_tuned(device, dtype):
    """From now on apply no stored sets for ``dtype`` on ``device`` in this process (for tuning).

    Returns the sets this process had already applied ({} if none).
    """
    with _lock:
        return dict(_applied.setdefault((device.int_ptr, np.dtype(dtype)), {}))


class NothingToTune(RuntimeError):
    """No CLBlast GEMM to time, or parameters already applied in this process."""


def search(runs, queue, dtype=np.float32, repeat=3, batch=10, save=True, progress=None):
    """Search CLBlast GEMM parameters on ``runs`` (calls of passes whose GEMMs CLBlast runs,
    each returning its result); store the winners.

    One kernel at a time (tiled Xgemm, then XgemmDirect): each candidate runs every pass,
    its results are compared with those of CLBlast's own parameters, and it scores the
    geometric mean of its per-pass time ratios to them (so a small pass counts as much as a
    large one). The best correct set of each kernel stays applied, even when it is slower
    than CLBlast's own (which cannot be restored); the final combination is timed once more
    and its sets are stored only if it scores below GEMM_GAIN. A set that faults the device
    loses the context and ends the search with nothing stored.
    Returns the entry {"overrides", "score", "default_ms", "ms", "scores", ...}
    (overrides {}: no gain).
    """
    def measure():
        """Per-pass ms (best of ``repeat`` batches) and each pass's result."""
        times = [tuning.time_ms(fn, queue, repeat, batch) for fn in runs]
        return times, [fn().get() for fn in runs]

    measure()                    # once to warm up (builds, workspaces, clocks), so the baseline is fair
    default, expected = measure()

    def trial():
        """The applied parameters' score, per-pass ms, or None for wrong results or a failure."""
        try:
            times, outs = measure()
        except (ClconvError, RuntimeError):     # a set this device cannot build or run
            return None, None
        if any(normalised_error(o, e) > TOLERANCE[np.dtype(dtype)] for o, e in zip(outs, expected)):
            return None, None
        return float(np.exp(np.mean(np.log(np.array(times) / default)))), times

    applied, scores = {}, {}
    for kernel in PARAMETERS:
        best = None
        for i, params in enumerate(candidates(kernel)):
            name = f"{kernel}#{i}"
            if not valid(kernel, params, queue.device, np.dtype(dtype).itemsize):
                scores[name] = "invalid"
            else:
                override(queue.device, dtype, kernel, params)
                score, _ = trial()
                scores[name] = "failed or wrong results" if score is None else round(score, 4)
                if score is not None and (best is None or score < best[0]):
                    best = (score, params)
            if progress:
                progress(name, scores[name])
        if best is not None:
            override(queue.device, dtype, kernel, best[1])
            applied[kernel] = best[1]
    score, times = trial()
    gain = score is not None and score < GEMM_GAIN
    scores["final"] = None if score is None else round(score, 4)
    entry = {"overrides": applied if gain else {}, "score": scores["final"],
             "default_ms": [round(t, 4) for t in default], "ms": [round(t, 4) for t in times or []],
             "scores": scores, "date": datetime.date.today().isoformat()}
    if save and score is not None:
        tuning.store({tuning.gemm_key(queue.device, dtype): entry})
    return entry
