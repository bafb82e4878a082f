"""Choosing the OpenCL device: the default context and queue, and device facts."""
import functools
import os
import re
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pyopencl as cl

from . import probe, rules

_lock = threading.Lock()
_default = {}
_warned = set()   # devices pick_device warned of: once per process

# OpenCL drivers installed into this Python environment by pip: Intel's CPU runtime
# (intel-opencl-rt, the `intel` extra) ships an .icd file with a placeholder path, so `make`
# registers it in this folder, beside copies of the system's own .icd files (see Makefile).
ENVIRONMENT_VENDORS = Path(sys.prefix) / "etc" / "OpenCL" / "clconv-vendors"


def use_environment_vendors():
    """Point the ICD loader at :data:`ENVIRONMENT_VENDORS` when it exists and the user has not
    chosen a folder (``OCL_ICD_VENDORS``); pyopencl's own PoCL is found either way. It takes
    effect if done before this process first lists the OpenCL platforms: clconv does it on import."""
    if ENVIRONMENT_VENDORS.is_dir() and not os.environ.get("OCL_ICD_VENDORS"):
        os.environ["OCL_ICD_VENDORS"] = str(ENVIRONMENT_VENDORS)


use_environment_vendors()


class DeviceNotFound(RuntimeError):
    """No OpenCL device, or none that ``CLCONV_DEVICE`` (or ``--device``) names; the message lists
    the devices there are."""


def _all_devices():
    found = []
    for pi, platform in enumerate(cl.get_platforms()):
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        found.extend((pi, di, platform, d) for di, d in enumerate(devices))
    return found


def spec_of(device):
    """The ``"P:D"`` indices :func:`pick_device` takes for ``device`` (another process finds it by
    them); None for a device that has none (a sub-device)."""
    for pi, di, _, d in _all_devices():
        if d == device:
            return f"{pi}:{di}"
    return None


def pocl_version(platform):
    """PoCL's version as a tuple ((3, 1) from "OpenCL 3.0 PoCL 3.1+debian ..."), None for another
    platform."""
    match = re.search(r"\bPoCL (\d+)\.(\d+)", platform.version)
    return (int(match[1]), int(match[2])) if match else None


def preference(entry):
    """The default device's order: GPUs first, then PoCL's CPU devices (the newer PoCL first:
    ``rules.PREFER_NEWER_POCL``), then Intel's CPU runtime (whose builds are the quickest of the
    CPU runtimes), then the others, each in the platforms' order."""
    _, _, platform, device = entry
    version = pocl_version(platform)
    if device.type & cl.device_type.GPU:
        return (0,)
    if version is not None:
        return (1, tuple(-v for v in version) if rules.PREFER_NEWER_POCL else ())
    return (2,) if platform.name.startswith("Intel(R) OpenCL") else (3,)


def _matching(devices, spec):
    """The devices ``spec`` names, each with why: ``P:D`` indices, else a case-insensitive
    substring of a platform's name, vendor or version, else of a device's name or vendor."""
    if ":" in spec and all(part.strip().isdigit() for part in spec.split(":")):
        want = tuple(int(part) for part in spec.split(":"))
        return [(e, f"CLCONV_DEVICE={spec!r} (platform:device indices)") for e in devices if e[:2] == want]
    # platforms first: "intel" is Intel's runtime even where PoCL runs on an Intel CPU
    # (whose device vendor is GenuineIntel); PoCL says "PoCL" only in its version
    for fields in (lambda p, d: (p.name, p.vendor, p.version), lambda p, d: (d.name, d.vendor)):
        found = [e for e in devices if any(spec.lower() in n.lower() for n in fields(e[2], e[3]))]
        if found:
            return [(e, f"CLCONV_DEVICE={spec!r} matches {e[2].name} / {e[3].name}") for e in found]
    return []


def pick_device(spec=None):
    """Return ``(device, reason)``.

    ``spec`` (default: ``$CLCONV_DEVICE``) is a case-insensitive substring of the
    platform or device name, vendor or version (``"nvidia"``, ``"pocl"``) or ``"P:D"`` indices.
    Without one: the first GPU, else PoCL's CPU device (the newer PoCL where two are installed),
    else the first device. A device that cannot build kernels (:mod:`clconv.probe`) is passed
    over with a warning naming it and the compiler's line; where the spec names only such
    devices, the first is returned and a plan on it raises that line.
    """
    spec = os.environ.get("CLCONV_DEVICE", "") if spec is None else spec
    devices = _all_devices()
    if not devices:
        raise DeviceNotFound("clconv: no OpenCL platform with a device was found "
                             "(install pyopencl[pocl] for the PoCL CPU device)")
    if spec:
        found = sorted(_matching(devices, spec), key=lambda m: preference(m[0]))
        if not found:
            listing = "; ".join(f"{pi}:{di} {p.name} / {d.name}" for pi, di, p, d in devices)
            raise DeviceNotFound(f"clconv: no OpenCL device matches CLCONV_DEVICE={spec!r} (a substring of a "
                                 f"platform's or device's name, vendor or version, or P:D indices); devices: {listing}")
    else:
        reasons = {0: "first GPU", 1: "no GPU; PoCL CPU device", 2: "no GPU or PoCL device; Intel's CPU runtime",
                   3: "no GPU or PoCL device; first device"}
        found = [(e, reasons[preference(e)[0]]) for e in sorted(devices, key=preference)]
    skipped = []
    for (_, _, _, d), why in found:
        ok, line = probe.check(d)
        if not ok:
            skipped.append((d, line))
            continue
        for s, line in skipped:   # said where another device is taken instead: once per process
            if s.int_ptr not in _warned:
                _warned.add(s.int_ptr)
                warnings.warn(f"clconv: {probe.describe(s)} cannot build kernels: {line}; {d.name.strip()} on "
                              f"{d.platform.name.strip()} is used instead (CLCONV_DEVICE chooses the device; "
                              f"python -m clconv info lists them)", RuntimeWarning, stacklevel=2)
        if skipped:
            why += f"; passed over {', '.join(probe.describe(s) for s, _ in skipped)}, which cannot build kernels"
        return d, why
    (_, _, _, d), why = found[0]
    return d, why + "; no device found builds kernels"


def default_context():
    """The process-wide default context, created on first use (see :func:`pick_device`)."""
    default_queue()
    return _default["context"]


def default_queue():
    """The process-wide default in-order command queue, created on first use."""
    with _lock:
        if "queue" not in _default:
            device, _ = pick_device()
            # the context is kept too: a runtime may treat a context whose last application
            # reference is gone as released while its queue lives (Intel's does)
            _default["context"] = cl.Context([device])
            _default["queue"] = cl.CommandQueue(_default["context"])
        return _default["queue"]


class Queues(list):
    """A list of command queues that keeps their context alive (``.context``): a runtime may
    treat a context without an application reference as released while its queues live
    (Intel's does)."""

    def __init__(self, queues, context):
        super().__init__(queues)
        self.context = context


def device_queues(devices):
    """An in-order queue on each of ``devices`` (of one platform), in one new context: what a
    spread plan (``clconv.plan(..., queue=[...])``) runs on. Keep the returned list (or the
    plan) while the queues are used."""
    context = cl.Context(list(devices))
    return Queues([cl.CommandQueue(context, d) for d in devices], context)


def sub_device_queues(count, device=None):
    """``device`` (default: the default queue's) partitioned into ``count`` sub-devices of
    equal compute units (CPU runtimes such as PoCL and Intel's can; NVIDIA's cannot), a queue
    on each in one context. A context made of sub-devices may list only their parent in
    ``context.devices``: use ``queue.device``."""
    device = device or default_queue().device
    units = device.max_compute_units // count
    if count < 1 or units < 1:
        raise ValueError(f"cannot split {device.name.strip()} ({device.max_compute_units} compute units) into "
                         f"{count} sub-devices")
    # asked first: Mesa's rusticl (22.3) reports 0 here and crashes the process in clCreateSubDevices
    if device.partition_max_sub_devices < count:
        raise ValueError(f"{device.name.strip()} on {device.platform.name} cannot be partitioned into {count} "
                         f"sub-devices (it reports at most {device.partition_max_sub_devices})")
    try:
        subs = device.create_sub_devices([cl.device_partition_property.EQUALLY, units])[:count]
    except cl.Error as exc:
        raise ValueError(f"{device.name.strip()} on {device.platform.name} cannot be partitioned: {exc}") from exc
    return device_queues(subs)


def has_fp64(device):
    return "cl_khr_fp64" in device.extensions.split() or bool(getattr(device, "double_fp_config", 0))


def has_fp16(device):
    # Read the extensions string: some drivers raise when asked for half_fp_config.
    return "cl_khr_fp16" in device.extensions.split()


def cpu_vector_width(device, itemsize, max_bits=256):
    """Values per vector in clconv's CPU kernels: the device's native width for the dtype,
    from 4 values to ``max_bits``' worth (256 but in the GEMM kernel, see gemm_cpu).

    The other kernels keep 256 bits: PoCL 3.0 (LLVM 14) failed to compile some of their 16-wide
    float forms for an AVX-512 CPU ('Do not know how to scalarize', 'Cannot select: fma'), and
    cores that run AVX-512 as two 256-bit halves (AMD's Zen 4) reach the same peak with 256-bit
    vectors."""
    native = device.native_vector_width_double if itemsize == 8 else device.native_vector_width_float
    return max(4, min(max_bits // 8 // itemsize, native or 4))


def vectorizes_work_items(device):
    """Whether the device's compiler vectorises a scalar kernel across work-items well enough
    that clconv's per-tile Winograd transforms beat their CPU row forms: Intel's CPU runtime
    (per-tile transforms measured faster than rows there); not PoCL 3.0, whose cost model
    keeps those kernels scalar (rows measured faster there on the workloads' 3x3 and 5x5
    shapes); GPUs run work-items in lanes anyway. (A 7x1 filter takes the row forms on
    every CPU: its tiles load as runs of rows, see clconv.algorithms.winograd.)"""
    return bool(device.type & cl.device_type.GPU) or device.platform.name.startswith("Intel(R) OpenCL")


@functools.lru_cache(maxsize=None)
def scalar_work_items(device):
    """Whether a simple one-value-per-work-item kernel runs faster on the device written with
    explicit vectors: PoCL's CPU device (measured on PoCL 3.0). Four values per work-item in the
    split-K sum (sum_partials4) measured faster than one on PoCL, but slower on Intel's CPU
    runtime and on rusticl's llvmpipe, whose compilers vectorise such a kernel across
    work-items. (A different threshold from :func:`vectorizes_work_items`,
    which asks whether the per-tile Winograd transforms, with their gathers, vectorise well
    enough to beat the row forms: rusticl's do not.)"""
    return bool(device.type & cl.device_type.CPU) and device.platform.name == "Portable Computing Language"


SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def check_dtype_supported(dtype, device):
    """Raise TypeError unless this device can run ``dtype`` convolutions.

    float16 runs everywhere: it is only stored as half (core OpenCL's vload_half /
    vstore_half), all arithmetic is float32, so it needs no cl_khr_fp16.
    """
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"clconv supports float16, float32 and float64 arrays, got {dtype}")
    if dtype == np.float64 and not has_fp64(device):
        raise TypeError(f"float64 needs the cl_khr_fp64 extension, which device {device.name!r} lacks")
