"""The persistent tuning cache: the fastest algorithm per pass, measured on this device.

Entries live in a readable JSON file, ``tuning.json`` in the user cache folder
(``$CLCONV_CACHE_DIR`` overrides it), keyed by device, driver, dtype, shapes,
options and pass. ``python -m clconv tune`` fills it; with ``CLCONV_AUTOTUNE=1``
the planner times the candidates on first use of a shape and stores the winner.
A corrupt or foreign file is ignored with a warning; writes take a file lock
and replace the file atomically, so concurrent processes cannot corrupt it.
"""
import datetime
import fcntl
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pyopencl.array as cla

from .programs import ClconvError, recording

VERSION = 1
# tune-gemm stores its sets only when they score below this: on a busy 2-core CPU a set that
# scored 0.91 in the search ran no faster in a fresh process (per-pass noise of 10-20 %)
GEMM_GAIN = 0.9
PASSES = ("forward", "backward_input", "backward_weight")


def cache_path():
    folder = os.environ.get("CLCONV_CACHE_DIR")
    if not folder:
        import platformdirs
        folder = platformdirs.user_cache_dir("clconv")
    return Path(folder) / "tuning.json"


def entry_key(device, dtype, g, pass_name):
    """One readable key: device | driver | dtype | input | weight | stride | pads | dilation | groups | pass."""
    return "|".join(str(v) for v in (device.name.strip(), device.driver_version, np.dtype(dtype).name,
                                     list(g.input_shape), list(g.weight_shape), list(g.stride),
                                     [list(p) for p in g.pads], list(g.dilation), g.groups, pass_name))


def gemm_key(device, dtype):
    """Key of the tuned CLBlast GEMM parameters: gemm | device | driver | dtype."""
    return "|".join(("gemm", device.name.strip(), device.driver_version, np.dtype(dtype).name))


def load(path=None):
    """All entries of the cache file ({} when it is missing, corrupt or of another version)."""
    path = Path(path or cache_path())
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"clconv: ignoring unreadable tuning cache {path}: {exc}", stacklevel=3)
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), dict):
        warnings.warn(f"clconv: ignoring tuning cache {path}: not a version-{VERSION} clconv cache", stacklevel=3)
        return {}
    return data["entries"]


def store(new_entries, path=None):
    """Merge ``new_entries`` into the cache file under a lock, then replace it atomically."""
    path = Path(path or cache_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")    # a corrupt file is replaced, having been warned about on load
            entries = load(path)
        entries.update(new_entries)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tuning-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"version": VERSION, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)


def candidates(g):
    """(algorithm, queues) pairs that apply to geometry ``g``."""
    from .plan import ALGORITHMS
    found = []
    for name, cls in ALGORITHMS.items():
        if cls.applies(g)[0]:
            found.append((name, "single"))
            if g.groups > 1 and name != "direct":
                found.append((name, "per-group"))
    return found


def _time(fn, queue, repeat=5, batch=1):
    """ms per call of ``fn``: the best of ``repeat`` batches of ``batch`` calls, after a warm-up."""
    fn()
    queue.finish()                       # warm-up: kernel builds
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        queue.finish()
        best = min(best, (time.perf_counter() - t0) / batch)
    return best * 1e3


def tune(g, dtype, queue, passes=PASSES, save=True, progress=None):
    """Time every candidate for each pass on ``queue``'s device; store and return the winners.

    Returns {pass: {"algorithm", "queues", "ms", "timings"}}.
    """
    from .plan import Plan
    rng = np.random.default_rng(0)
    x = cla.to_device(queue, rng.standard_normal(g.input_shape).astype(dtype))
    w = cla.to_device(queue, rng.standard_normal(g.weight_shape).astype(dtype))
    dy = cla.to_device(queue, rng.standard_normal(g.output_shape).astype(dtype))
    outs = {"forward": cla.empty(queue, g.output_shape, dtype), "backward_input": cla.empty(queue, g.input_shape, dtype),
            "backward_weight": cla.empty(queue, g.weight_shape, dtype)}
    results, new = {}, {}
    for pass_name in passes:
        timings = {}
        for algorithm, queues in candidates(g):
            if progress:
                progress()
            try:
                p = Plan(g, dtype, queue, algorithm=algorithm, queues=queues, tuned=False)
            except ValueError:   # e.g. above the workspace limit: not a candidate here
                continue
            run = {"forward": lambda p=p: p.forward(x, w, out=outs["forward"]),
                   "backward_input": lambda p=p: p.backward_input(w, dy, out=outs["backward_input"]),
                   "backward_weight": lambda p=p: p.backward_weight(x, dy, out=outs["backward_weight"])}[pass_name]
            timings[f"{algorithm}/{queues}"] = _time(run, queue)
        if not timings:
            continue
        best = min(timings, key=timings.get)
        algorithm, queues = best.split("/")
        results[pass_name] = {"algorithm": algorithm, "queues": queues, "ms": round(timings[best], 4),
                              "timings": {k: round(v, 4) for k, v in timings.items()},
                              "date": datetime.date.today().isoformat()}
        new[entry_key(queue.device, dtype, g, pass_name)] = results[pass_name]
    if save:
        store(new)
    return results


class NothingToTune(RuntimeError):
    """tune_gemm has nothing to do here: no CLBlast GEMM to time, or parameters already applied."""


def tune_gemm(geometries, queue, dtype=np.float32, repeat=3, batch=10, save=True, progress=None):
    """Search CLBlast GEMM parameters on the GEMM passes of ``geometries``; store the winners.

    One kernel at a time (tiled Xgemm, then XgemmDirect): each candidate runs every pass
    whose GEMMs CLBlast runs (on GPUs none, unless ``CLCONV_GEMM=clblast``), its results are
    compared with those of CLBlast's own parameters, and it scores the geometric mean of its
    per-pass time ratios to them (so a small pass counts as much as a large one). The best
    correct set of each kernel stays applied, even when it is slower than CLBlast's own
    (which cannot be restored); the final combination is timed once more and its sets are
    stored only if it scores below GEMM_GAIN. CLBlast cannot return to its own parameters
    within a process, so run this in a process of its own (``python -m clconv tune-gemm``);
    a set that faults the device loses the context and ends the search with nothing stored.
    Returns the entry {"overrides", "score", "default_ms", "ms", "scores", ...}
    (overrides {}: no gain).
    """
    from .gemm import clblast_params
    from .plan import Plan
    from .reference import TOLERANCE, normalised_error
    if clblast_params.ignore_tuned(queue.device, dtype):    # the baseline must be CLBlast's own parameters
        raise NothingToTune("this process already applied (or overrode) CLBlast parameters; tune in a process of "
                           "its own")
    rng = np.random.default_rng(0)
    runs = []
    for g in geometries:
        p = Plan(g, dtype, queue, tuned=False)
        x, w, dy = (cla.to_device(queue, rng.standard_normal(s).astype(dtype))
                    for s in (g.input_shape, g.weight_shape, g.output_shape))
        y, dx, dw = (cla.empty(queue, s, dtype) for s in (g.output_shape, g.input_shape, g.weight_shape))
        fns = {"forward": lambda p=p, x=x, w=w, y=y: p.forward(x, w, out=y),
               "backward_input": lambda p=p, w=w, dy=dy, dx=dx: p.backward_input(w, dy, out=dx),
               "backward_weight": lambda p=p, x=x, dy=dy, dw=dw: p.backward_weight(x, dy, out=dw)}
        for name in p.algorithms:
            with recording() as events:
                fns[name]()
            if any(kind == "clblast_gemm" for kind, _ in events):
                runs.append(fns[name])
    if not runs:
        raise NothingToTune("no pass of these workloads runs a CLBlast GEMM on this device: nothing to tune")

    def measure():
        """Per-pass ms (best of ``repeat`` batches) and each pass's result."""
        times = [_time(fn, queue, repeat, batch) for fn in runs]
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
    for kernel in clblast_params.PARAMETERS:
        best = None
        for i, params in enumerate(clblast_params.candidates(kernel)):
            name = f"{kernel}#{i}"
            if not clblast_params.valid(kernel, params, queue.device, np.dtype(dtype).itemsize):
                scores[name] = "invalid"
            else:
                clblast_params.override(queue.device, dtype, kernel, params)
                score, _ = trial()
                scores[name] = "failed or wrong results" if score is None else round(score, 4)
                if score is not None and (best is None or score < best[0]):
                    best = (score, params)
            if progress:
                progress(name, scores[name])
        if best is not None:
            clblast_params.override(queue.device, dtype, kernel, best[1])
            applied[kernel] = best[1]
    score, times = trial()
    gain = score is not None and score < GEMM_GAIN
    scores["final"] = None if score is None else round(score, 4)
    entry = {"overrides": applied if gain else {}, "score": scores["final"],
             "default_ms": [round(t, 4) for t in default], "ms": [round(t, 4) for t in times or []],
             "scores": scores, "date": datetime.date.today().isoformat()}
    if save and score is not None:
        store({gemm_key(queue.device, dtype): entry})
    return entry
