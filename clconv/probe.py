"""Whether a device builds and runs kernels at all (``kernels/probe.cl``).

A runtime can load, list its device and still fail every build: PyPI's PoCL 3.0 (LLVM 14) on a
CPU newer than its LLVM rejects its own target ("unknown target CPU 'generic'"). Such a device is
never made the default (:func:`clconv.device.pick_device` skips it with a warning), and a plan on
it raises :class:`~clconv.programs.ClconvError` with the compiler's words before any known-answer
check could store a failure that is the device's, not an algorithm's.

The answer is kept per process and in the tuning cache, keyed by platform, device and driver: a
device that builds is probed once per machine and driver; one that does not, once per process
(one failed build), so that whatever mends it is seen. ``python -m clconv probe`` asks anew.
"""
import threading
import warnings

import numpy as np
import pyopencl as cl

from . import tuning
from .programs import BuildError, ClconvError, get_kernel, launch

_lock = threading.Lock()
_answers = {}   # tuning-cache key -> (ok, line): this process's

SIZE = 37   # values the probe computes: more than one work-group's worth on no device, fewer than any


def key(device):
    """The tuning-cache key: buildcheck | platform and its version | device | driver."""
    p = device.platform
    return "|".join(("buildcheck", p.name.strip(), p.version.strip(), device.name.strip(), device.driver_version))


def _run(device):
    """(ok, line): build the probe on a context of its own and check its results."""
    try:
        context = cl.Context([device])
        queue = cl.CommandQueue(context)
        with warnings.catch_warnings():   # a compiler that reports its successes (Intel's): not news here
            warnings.simplefilter("ignore", cl.CompilerWarning)
            kernel = get_kernel(context, "probe.cl", "probe", np.float32)
        x = np.arange(SIZE, dtype=np.float32)
        buf = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
        launch(queue, kernel, (SIZE,), (1,), buf, SIZE, what="the build probe")
        got = np.empty_like(x)
        cl.enqueue_copy(queue, got, buf)
        queue.finish()
    except BuildError as exc:
        return False, exc.compiler_lines
    except (ClconvError, cl.Error) as exc:
        return False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    if not np.array_equal(got, 2 * x + 1):
        return False, f"the probe kernel ran but computed {got[:4].tolist()}... where 2x+1 is {(2 * x + 1)[:4].tolist()}..."
    return True, ""


def check(device, fresh=False):
    """(ok, the compiler's first error line or why not): whether ``device`` builds and runs the
    probe, from this process, or where it did the tuning cache, unless ``fresh``; else taken now
    and kept."""
    k = key(device)
    if not fresh:
        with _lock:
            if k in _answers:
                return _answers[k]
        entry = tuning.load().get(k)
        if isinstance(entry, dict) and entry.get("ok") is True:   # a failure is asked again once a process
            with _lock:
                _answers[k] = True, ""
                return _answers[k]
    answer = _run(device)
    with _lock:
        _answers[k] = answer
    tuning.store({k: {"ok": answer[0], "line": answer[1]}})
    return answer


def describe(device):
    """The device as messages name it: its name, platform and driver."""
    return f"{device.name.strip()} ({device.platform.name.strip()}, driver {device.driver_version})"


def require(device):
    """Raise :class:`ClconvError` with the compiler's line unless ``device`` builds kernels."""
    ok, line = check(device)
    if not ok:
        raise ClconvError(f"clconv: {describe(device)} cannot build kernels: {line}; choose another device "
                          f"(CLCONV_DEVICE, or a queue= on one; python -m clconv info lists them)")


def forget():
    """Drop this process's answers (the tuning cache keeps its own): for tests."""
    with _lock:
        _answers.clear()
