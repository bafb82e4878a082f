"""The persistent tuning cache: the fastest algorithm per pass, measured on this device,
and tuned CLBlast parameters; and the timing both tuners use (:func:`time_ms`).

The tuners are :mod:`clconv.tuner` (algorithms, above the plans it times) and
:func:`clconv.gemm.clblast_params.search` (CLBlast's parameters). Entries live in a
readable JSON file, ``tuning.json`` in the user cache folder (``$CLCONV_CACHE_DIR``
overrides it), keyed by device, driver, dtype, shapes, options and pass. ``python -m
clconv tune`` fills it; with ``CLCONV_AUTOTUNE=1`` the planner (:mod:`clconv.planner`)
times the candidates on first use of a shape and stores the winner. A corrupt or foreign file is ignored with a warning; writes take a file lock
and replace the file atomically, so concurrent processes cannot corrupt it.
"""
import fcntl
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import platformdirs

VERSION = 1


def cache_path():
    folder = os.environ.get("CLCONV_CACHE_DIR")
    if not folder:
        folder = platformdirs.user_cache_dir("clconv")
    return Path(folder) / "tuning.json"


def entry_key(device, dtype, g, pass_name, math="strict"):
    """One readable key: device | driver | dtype | input | weight | stride | pads | dilation | groups | pass,
    then | math mode where it is not "strict" (:mod:`clconv.precision`)."""
    return "|".join(str(v) for v in (device.name.strip(), device.driver_version, np.dtype(dtype).name,
                                     list(g.input_shape), list(g.weight_shape), list(g.stride),
                                     [list(p) for p in g.pads], list(g.dilation), g.groups, pass_name)
                    + ((math,) if math != "strict" else ()))


def spread_key(queues, dtype, g, pass_name, math="strict"):
    """Key of a pass spread over devices: spread | each device with its compute units | driver |
    dtype | the geometry as in :func:`entry_key` | pass, then | the math mode asked for where it
    is not "strict"."""
    devices = "+".join(f"{q.device.name.strip()} ({q.device.max_compute_units} CU)" for q in queues)
    return "|".join(str(v) for v in ("spread", devices, queues[0].device.driver_version, np.dtype(dtype).name,
                                     list(g.input_shape), list(g.weight_shape), list(g.stride),
                                     [list(p) for p in g.pads], list(g.dilation), g.groups, pass_name)
                    + ((math,) if math != "strict" else ()))


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


def time_ms(fn, queue, repeat=5, batch=1):
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


