"""What ``python -m clconv`` runs, as functions that return data: a device's facts, whether it
builds kernels, the known-answer checks, and tuning. The command line (``clconv.apps.cli``)
prints their results; a program of one's own may call them the same way.
"""
import functools

import numpy as np
import pyopencl as cl

from . import precision, probe, selfcheck, tuner, tuning
from .algorithms import ALGORITHMS
from .device import has_fp16, has_fp64, pocl_version
from .gemm import choose as choose_gemm, clblast_params
from .geometry import PASSES
from .plan import Plan

NothingToTune = clblast_params.NothingToTune   # raised by tune_gemm() where there is nothing to tune
GEMM_GAIN = clblast_params.GEMM_GAIN           # tune_gemm() keeps parameters whose time ratio is below this


def device_facts(device):
    """What clconv knows of ``device``, a dict: ``builds`` (whether it builds and runs kernels,
    the verdict remembered per driver) and ``build_error`` (the compiler's line, else None); where
    it builds, also ``fp64`` and ``fp16`` (the extensions) and ``checks``, the stored known-answer
    verdicts {(dtype, algorithm, engine): (ok, message)}."""
    builds, line = probe.check(device)
    facts = {"builds": builds, "build_error": None if builds else line}
    if builds:
        facts.update(fp64=has_fp64(device), fp16=has_fp16(device), checks=selfcheck.stored(device))
    return facts


def probe_device(device):
    """(builds, line, description): whether ``device`` builds and runs kernels, asked anew (not
    the remembered verdict), the compiler's line where it does not, and how clconv names it."""
    builds, line = probe.check(device, fresh=True)
    return builds, line, probe.describe(device)


def pocl_versions():
    """The versions of the PoCL platforms installed, as (major, minor) tuples."""
    return [v for v in map(pocl_version, cl.get_platforms()) if v]


def checks_enabled():
    """Whether known-answer checks run on an algorithm's first use (``CLCONV_SELFCHECK=0``: not)."""
    return selfcheck.enabled()


def check(queue, dtype, math=None):
    """Every algorithm's known-answer cases on ``queue``'s device, anew, on the plans' GEMM engine
    in the math mode plans on ``dtype`` arrays run for ``math`` (:mod:`clconv.precision`; None: the
    dtype's default), and im2col also on CLBlast and on per-group queues; the verdicts are stored as
    the first use of an algorithm would store them. Returns (engine, rows): the plans' GEMM engine
    (with the mode where it is not "strict": "gpu+tf32") and an iterator of (label, pass name,
    normalised error or None, ok, message), one per case and pass, each computed as it is taken.
    Raises ``clconv.ClconvError`` where the device does not build kernels."""
    probe.check(queue.device, fresh=True)   # asked anew, as the verdicts below are taken anew
    probe.require(queue.device)
    dtype = np.dtype(dtype)
    request = precision.requested(dtype, math)
    own, _ = choose_gemm(queue.device)
    unchecked = functools.partial(Plan, selfcheck=False)
    runs = [(a, own, "single", "") for a in dict.fromkeys(case[0] for case in selfcheck.CASES)]
    runs += [("im2col", "clblast", "single", " CLBlast-GEMM"), ("im2col", own, "per-group", " per-group")]

    def mode(algorithm, engine):
        """The math mode a plan's ``algorithm`` runs on ``engine`` for the request."""
        run = precision.resolve(queue.device, engine, dtype, request)[0]
        return run if ALGORITHMS[algorithm].MATRIX_UNITS else "strict"

    def rows():
        for algorithm, engine, queues, suffix in runs:
            math = mode(algorithm, engine)
            results = selfcheck.run(unchecked, queue, algorithm, engine, dtype, queues, math)
            if queues == "single":
                selfcheck.store(queue.device, algorithm, engine, dtype, results, math)
            for label, pass_name, err, ok, message in results:
                yield label + suffix, pass_name, err, ok, message
    return selfcheck.engine_field(own, precision.resolve(queue.device, own, dtype, request)[0]), rows()


def tune_steps(geometries):
    """How many timed runs :func:`tune` makes for ``geometries`` (for a progress bar)."""
    return sum(len(tuner.candidates(g)) * len(PASSES) for g in geometries)


def tune(g, dtype, queue, progress=None):
    """Time every applicable algorithm (and per-group queues) for each pass of geometry ``g``
    (``clconv.conv_geometry``) on ``queue``'s device and store the winners in the tuning
    cache; ``progress()`` after each run. Returns {pass: {"algorithm", "queues", "ms", "timings"}}."""
    return tuner.tune(g, dtype, queue, progress=progress)


def tune_gemm_steps():
    """How many parameter sets :func:`tune_gemm` times (for a progress bar)."""
    return sum(len(clblast_params.CANDIDATES[k]) for k in clblast_params.PARAMETERS)


def tune_gemm(geometries, queue, batch=1, progress=None):
    """Search CLBlast's GEMM parameters on the GEMM passes of ``geometries`` (``batch``
    back-to-back calls per timing) and store those that pay; ``progress(name, result)`` after
    each set. Run it in a process of its own. Returns the stored entry ("default_ms", "score",
    "overrides", ...); raises ``NothingToTune`` where no pass runs a CLBlast GEMM or this
    process already applied CLBlast parameters."""
    return tuner.tune_gemm(geometries, queue, batch=batch, progress=progress)


def tuning_cache_path():
    """The tuning cache's file (``tune`` and ``tune_gemm`` store there)."""
    return tuning.cache_path()
