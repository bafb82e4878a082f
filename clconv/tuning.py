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

VERSION = 1
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


def lookup(device, dtype, g, pass_name):
    """The stored winner {"algorithm", "queues", "ms"} for this pass, or None."""
    return load().get(entry_key(device, dtype, g, pass_name))


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


def _time(fn, queue, repeat=5):
    fn()
    queue.finish()                       # warm-up: kernel builds
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        queue.finish()
        best = min(best, time.perf_counter() - t0)
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
            p = Plan(g, dtype, queue, algorithm=algorithm, queues=queues, tuned=False)
            run = {"forward": lambda p=p: p.forward(x, w, out=outs["forward"]),
                   "backward_input": lambda p=p: p.backward_input(w, dy, out=outs["backward_input"]),
                   "backward_weight": lambda p=p: p.backward_weight(x, dy, out=outs["backward_weight"])}[pass_name]
            timings[f"{algorithm}/{queues}"] = _time(run, queue)
            if progress:
                progress()
        best = min(timings, key=timings.get)
        algorithm, queues = best.split("/")
        results[pass_name] = {"algorithm": algorithm, "queues": queues, "ms": round(timings[best], 4),
                              "timings": {k: round(v, 4) for k, v in timings.items()},
                              "date": datetime.date.today().isoformat()}
        new[entry_key(queue.device, dtype, g, pass_name)] = results[pass_name]
    if save:
        store(new)
    return results
