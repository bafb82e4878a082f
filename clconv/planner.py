"""Where plans come from: :func:`plan` (public), the small plan cache of the functional API
(:func:`cached_plan`), and the tuning-cache lookup that gives a plan its measured choices
(:func:`tuned_choices`; with ``CLCONV_AUTOTUNE=1`` the passes not yet measured are timed
first, by :mod:`clconv.tuner`)."""
import functools
import os
import threading
from collections import OrderedDict

import numpy as np
import pyopencl.array as cla

from . import limits, precision, tuner, tuning
from .geometry import PASSES, conv_geometry
from .plan import Plan
from .spread import SpreadPlan
from .validate import pick_queue, queue_context


def tuned_choices(g, dtype, queue, math="strict"):
    """{pass: entry} from the tuning cache for geometry ``g``, ``dtype`` and the math mode a plan
    runs (``math``, :mod:`clconv.precision`) on ``queue``'s device; with CLCONV_AUTOTUNE=1, missing
    passes are timed now and stored."""
    stored = tuning.load()
    found = {p: stored.get(tuning.entry_key(queue.device, dtype, g, p, math)) for p in PASSES}
    missing = [p for p, entry in found.items() if entry is None]
    if missing and g.N and os.environ.get("CLCONV_AUTOTUNE") == "1":
        found.update(tuner.tune(g, dtype, queue, passes=missing, math=math))
    return {p: entry for p, entry in found.items() if entry is not None}


def tuned_splits(g, dtype, queues, make_plan, math="strict"):
    """{pass: entry} from the tuning cache for geometry ``g`` spread over ``queues``, its parts'
    plans asking for math mode ``math``; with CLCONV_AUTOTUNE=1, missing passes are timed now and
    stored."""
    stored = tuning.load()
    found = {p: stored.get(tuning.spread_key(queues, dtype, g, p, math)) for p in PASSES}
    missing = [p for p, entry in found.items() if entry is None]
    if missing and g.N and os.environ.get("CLCONV_AUTOTUNE") == "1":
        found.update(tuner.tune_spread(g, dtype, queues, make_plan, passes=missing, math=math))
    return {p: entry for p, entry in found.items() if entry is not None}


def is_several(queue):
    """Whether ``queue`` asks for several devices: a list or tuple of queues."""
    return isinstance(queue, (list, tuple))


def build(g, dtype, queue, algorithm="auto", queues="single", workspace_limit=None, gemm="auto", split="auto",
          shares=None, math=None):
    """A :class:`Plan`, or for a list of queues a :class:`clconv.spread.SpreadPlan` whose parts
    are such plans; the tuning cache decides only what the caller left open ("auto" with
    single queues: an explicit queues= choice stands; "auto" split without shares), found under
    the math mode a plan runs, and a spread's splits under the mode asked for (its devices may
    run different ones)."""
    if is_several(queue):
        def make_plan(sub, q):
            return build(sub, dtype, q, algorithm, queues, workspace_limit, gemm, math=math)
        if len(queue) == 1:
            return make_plan(g, queue[0])
        tuned = (tuned_splits(g, dtype, tuple(queue), make_plan, precision.requested(dtype, math))
                 if split == "auto" and shares is None else None)
        return SpreadPlan(g, dtype, queue, make_plan, split=split, shares=shares, tuned=tuned)
    tuned = functools.partial(tuned_choices, g, dtype, queue) if algorithm == "auto" and queues == "single" else None
    return Plan(g, dtype, queue, algorithm=algorithm, queues=queues, workspace_limit=workspace_limit, gemm=gemm,
                tuned=tuned, math=math)


def plan(input_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, *, dtype=np.float32,
         queue=None, algorithm="auto", queues="single", workspace_limit=None, gemm="auto", split="auto",
         shares=None, math=None):
    """Build a reusable :class:`Plan` for input (N, C, H, W) and weight (K, C/groups, kh, kw).

    ``queue``: one queue, or a list of queues on devices of one context for a
    :class:`clconv.spread.SpreadPlan` that spreads every pass over them, ``split`` "auto"
    (measured in the tuning cache, else by rule), "images" or "groups", in proportion to
    ``shares`` (the devices' relative speeds; default measured, else compute units).

    ``algorithm``: "auto" or one of "fc", "1x1", "direct", "fft", "winograd", "im2col" (ValueError if
    it does not apply). ``queues``: "single" or "per-group" (each group's GEMMs on
    their own in-order queue). ``workspace_limit``: bytes of the algorithm's workspace per pass
    (for float16 arrays, their float32 copies come on top in the passes that make them). ``gemm``: the GEMM engine, "auto"
    (``CLCONV_GEMM`` if set, else clconv's kernel for the device's type), "clconv", "cpu", "gpu"
    or "clblast" (see :mod:`clconv.gemm`). ``math``: the math mode (:mod:`clconv.precision`):
    "strict", "tf32" for float32, "fp16" for float16, or None for the dtype's default
    (:func:`clconv.get_math`); run where the device and GEMM engine can, else "strict", which
    ``explain()`` says.
    """
    g = conv_geometry(input_shape, weight_shape, stride, padding, dilation, groups)
    return build(g, dtype, queue if is_several(queue) else pick_queue(queue), algorithm, queues, workspace_limit, gemm,
                 split, shares, math)


def _queues_key(queue):
    """A cache key's device part: the context of one queue, or the queues of a spread."""
    if is_several(queue):
        return tuple(q.int_ptr for q in queue)
    return queue_context(queue).int_ptr


_plan_cache = OrderedDict()   # (limits.PLANS_KEPT)
_plan_lock = threading.Lock()


def _gemm_request(gemm):
    """The GEMM request as cached plans are keyed: an "auto" one with CLCONV_GEMM, which the plan
    resolves it by."""
    return gemm if gemm != "auto" else "auto:" + os.environ.get("CLCONV_GEMM", "").strip().lower()


def cached_plan(g, dtype, queue, algorithm="auto", queues="single", gemm="auto", math=None):
    """The plan for (geometry, dtype, context, algorithm, queues, GEMM request, math mode asked
    for) from a small LRU cache. An "auto" GEMM request is keyed with CLCONV_GEMM, which the plan
    resolves it by, and ``math`` None with the dtype's default now (:func:`clconv.set_math`):
    nothing on this path asks the driver."""
    mode = precision.default(dtype) if math is None else math   # (checked by the plan)
    key = (_queues_key(queue), g, np.dtype(dtype), algorithm, queues, _gemm_request(gemm), mode)
    with _plan_lock:
        p = _plan_cache.get(key)
        if p is not None:
            _plan_cache.move_to_end(key)
            return p
    p = build(g, dtype, queue, algorithm, queues, gemm=gemm, math=mode)
    with _plan_lock:
        _plan_cache[key] = p
        while len(_plan_cache) > limits.PLANS_KEPT:
            _plan_cache.popitem(last=False)
    return p


_calls = {}   # the functional API's call arguments -> plan (limits.CALLS_KEPT)

# The functional API reads CLCONV_GEMM on every call. os.environ.get is slow when the variable
# is unset (two exceptions inside the mapping), as slow as the rest of the plan's look-up: the
# call is keyed by the raw value in the mapping's own dict, which os.environ keeps
# in step with every change made through it.
_ENVIRON = getattr(os.environ, "_data", None)
_GEMM_VARIABLE = os.environ.encodekey("CLCONV_GEMM") if _ENVIRON is not None else None


def _gemm_call_key(gemm):
    """A functional call's GEMM request as its plan is looked up: "auto" with CLCONV_GEMM's raw
    value (the plan resolves it; :func:`_gemm_request`)."""
    if gemm != "auto":
        return gemm
    return "auto", (_ENVIRON.get(_GEMM_VARIABLE) if _ENVIRON is not None else os.environ.get("CLCONV_GEMM"))


def _plain_option(value):
    """Whether a call's stride, padding or dilation keys its plan as it is: an int, a string or
    a pair of ints, equal only to the same values of the same types (True == 1, (1.0, 1) == (1, 1)
    and lists are not hashable: other values are keyed by their repr, which costs host time)."""
    kind = type(value)
    return kind is int or kind is str or (kind is tuple and len(value) == 2 and type(value[0]) is int
                                          and type(value[1]) is int)


def plan_for_call(input_shape, weight_shape, stride, padding, dilation, groups, dtype, queue, arrays, algorithm,
                  queues, gemm, math=None):
    """The plan of a functional call, looked up by the call's own arguments (its shapes, its
    options as given, dtype, queue, algorithm, queues, GEMM request and math mode, None keyed as
    the dtype's default now): a call seen before skips the geometry's checks and the plan cache's
    key. Options other than ints, strings and pairs of ints are keyed by their repr
    (:func:`_plain_option`). ``queue``: the call's, else the first device array's, else the
    default."""
    first = arrays[0] if arrays else None
    if queue is None and type(first) is cla.Array and first.queue is not None:
        queue = first.queue   # the usual call, as pick_queue would find it
    else:
        queue = tuple(queue) if is_several(queue) else pick_queue(queue, *arrays)
    options = (stride, padding, dilation, groups)
    if not (type(stride) is type(padding) is type(dilation) is type(groups) is int
            or _plain_option(stride) and _plain_option(padding) and _plain_option(dilation) and type(groups) is int):
        options = repr(options)
    if math is None:
        math = precision.default(dtype)   # (None for a dtype clconv does not run: the plan says so)
    key = (queue, tuple(input_shape), tuple(weight_shape), options, dtype, algorithm, queues, _gemm_call_key(gemm),
           math)
    p = _calls.get(key)
    if p is None:
        g = conv_geometry(input_shape, weight_shape, stride, padding, dilation, groups)
        p = cached_plan(g, dtype, queue, algorithm, queues, gemm, math)
        if len(_calls) >= limits.CALLS_KEPT:
            _calls.clear()   # rare: a program calling with that many different arguments
        _calls[key] = p
    return p
