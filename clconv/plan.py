"""Plans: one convolution's shapes on one context, with an algorithm per pass.

A :class:`Plan` owns the shape arithmetic, the choice of algorithm for each
pass, the workspace size and the argument checks. The functional API
(:mod:`clconv.functional`) is a thin layer over a small cache of plans.
"""
import os
import threading
from collections import OrderedDict

import numpy as np
import pyopencl.array as cla

from . import storage, tuning
from .algorithms.common import Ref, ref
from .algorithms.direct import Direct
from .algorithms.fc import FullyConnected
from .algorithms.fft import FFT
from .algorithms.im2col import Im2col
from .algorithms.pointwise import Pointwise
from .algorithms.winograd import Winograd
from .device import check_dtype_supported
from .gemm import choose as choose_gemm
from .geometry import check_grad_output, conv_geometry
from .replay import Replays
from .validate import (OPTIONAL, all_plain, check_array, check_out, check_same_dtype, check_type, is_device_array,
                       pick_queue, queue_context)
from .workspace import workspace

# In order of preference: the first that applies is chosen by algorithm="auto".
ALGORITHMS = {cls.name: cls for cls in (FullyConnected, Pointwise, Direct, FFT, Winograd, Im2col)}
QUEUES = ("single", "per-group")
PASSES = ("forward", "backward_input", "backward_weight")


def default_workspace_limit(device):
    """Workspace budget in bytes: half the device's largest allocation, at most 1 GiB."""
    return min(device.max_mem_alloc_size // 2, 1 << 30)


class Plan:
    """Grouped conv2d of fixed shapes on one OpenCL context.

    input (N, C, H, W), weight (K, C/groups, kh, kw), output (N, K, OH, OW).
    Methods take pyopencl Arrays (or NumPy arrays, copied to the plan's queue
    and answered as NumPy) and return the result; ``out=`` writes in place.
    """

    def __init__(self, geometry, dtype, queue, *, algorithm="auto", queues="single", workspace_limit=None,
                 gemm="auto", tuned=True):
        self.geometry, self.dtype, self.queue = geometry, np.dtype(dtype), queue
        self.context = queue_context(queue)   # kept: the caller may drop theirs
        self.compute_dtype = storage.compute_dtype(dtype)   # float32 for float16 arrays
        if queues not in QUEUES:
            raise ValueError(f"queues must be one of {QUEUES}, got {queues!r}")
        self.queues = queues
        check_dtype_supported(self.dtype, queue.device)
        self.gemm, self._gemm_reason = choose_gemm(queue.device, gemm)   # fixed for the plan's life
        self.workspace_limit = workspace_limit or default_workspace_limit(queue.device)
        if self.workspace_limit > queue.device.max_mem_alloc_size:
            raise ValueError(f"workspace_limit {self.workspace_limit} is above the device's largest "
                             f"allocation {queue.device.max_mem_alloc_size}")
        if algorithm not in ("auto", *ALGORITHMS):
            raise ValueError(f"unknown algorithm {algorithm!r}; expected 'auto' or one of {sorted(ALGORITHMS)}")
        # the tuning cache decides only what the caller left open (an explicit queues= choice stands)
        winners = self._tuned_winners() if algorithm == "auto" and queues == "single" and tuned else {}
        self._choice = {p: self._choose(p, algorithm, winners.get(p)) for p in PASSES}
        # what each call needs, worked out once: (algorithm, name for messages, workspace bytes)
        g = geometry
        self._converts = self.dtype != self.compute_dtype   # float16 arrays, float32 algorithms
        self._runs = {p: (algo, f"{p} of input {list(g.input_shape)} with weight {list(g.weight_shape)} [{algo.name}]",
                          self._workspace_elements(p) * self.compute_dtype.itemsize)
                      for p, (algo, _) in self._choice.items()}
        # per pass: the expected size of each argument and of the result, checked on every call
        self._shapes = {"forward": ({"input": g.input_shape, "weight": g.weight_shape, "bias": (g.K,)},
                                    g.output_shape),
                        "backward_input": ({"weight": g.weight_shape, "grad_output": g.output_shape}, g.input_shape),
                        "backward_weight": ({"input": g.input_shape, "grad_output": g.output_shape}, g.weight_shape)}
        self._replays = Replays()

    def _tuned_winners(self):
        """{pass: entry} from the tuning cache; with CLCONV_AUTOTUNE=1, missing passes are timed now."""
        g, device = self.geometry, self.queue.device
        stored = tuning.load()
        winners = {p: stored.get(tuning.entry_key(device, self.dtype, g, p)) for p in PASSES}
        missing = [p for p, entry in winners.items() if entry is None]
        if missing and g.N and os.environ.get("CLCONV_AUTOTUNE") == "1":
            winners.update(tuning.tune(g, self.dtype, self.queue, passes=missing))
        return {p: entry for p, entry in winners.items() if entry is not None}

    def _choose(self, pass_name, algorithm, tuned=None):
        g = self.geometry
        if tuned and tuned.get("algorithm") in ALGORITHMS and ALGORITHMS[tuned["algorithm"]].applies(g)[0]:
            others = ", ".join(f"{k} {v} ms" for k, v in sorted(tuned.get("timings", {}).items()))
            cls = ALGORITHMS[tuned["algorithm"]]
            try:
                return (cls(g, self.compute_dtype, self.queue.device, self.workspace_limit,
                            per_group=tuned.get("queues") == "per-group", gemm=self.gemm),
                        f"fastest on this device in the tuning cache ({others or str(tuned.get('ms')) + ' ms'})")
            except ValueError:   # e.g. this plan's workspace limit: choose as if nothing were tuned
                pass
        candidates = ALGORITHMS if algorithm == "auto" else {algorithm: ALGORITHMS[algorithm]}
        reasons, passed_over = [], ""
        for name, cls in candidates.items():
            ok, why = cls.applies(g)
            if ok and algorithm == "auto" and hasattr(cls, "preferred"):
                preferred, why_not = cls.preferred(g, pass_name, self.queue.device)
                if not preferred:
                    passed_over += f" (not {name}: {why_not})"
                    continue
            if ok:
                try:
                    return cls(g, self.compute_dtype, self.queue.device, self.workspace_limit,
                               per_group=self.queues == "per-group", gemm=self.gemm), why + passed_over
                except ValueError as exc:   # e.g. the workspace limit: "auto" tries the next one
                    if algorithm != "auto":
                        raise
                    why = str(exc)
                    passed_over += f" (not {name}: {why})"
            reasons.append(f"{name}: {why}")
        raise ValueError(f"algorithm {algorithm!r} does not apply to input {list(g.input_shape)} with weight "
                         f"{list(g.weight_shape)}: {'; '.join(reasons)}")

    @property
    def algorithms(self):
        """The algorithm chosen for each pass: {"forward": "im2col", ...}."""
        return {p: algo.name for p, (algo, _) in self._choice.items()}

    def _sizes(self, pass_name):
        """Element counts of a pass's arrays, in argument order (the result last)."""
        g = self.geometry
        x, w, y = (int(np.prod(s)) for s in (g.input_shape, g.weight_shape, g.output_shape))
        return {"forward": (x, w, g.K, y), "backward_input": (w, y, x), "backward_weight": (x, y, w)}[pass_name]

    def _workspace_elements(self, pass_name):
        """The pass's workspace in compute-dtype elements: the algorithm's own, then for
        float16 the float32 copies of its arrays."""
        own = self._choice[pass_name][0].workspace[pass_name]
        return own + sum(self._sizes(pass_name)) if self._converts else own

    @property
    def workspace_bytes(self):
        """Largest workspace any pass allocates, in bytes."""
        return max(self._workspace_elements(p) for p in PASSES) * self.compute_dtype.itemsize

    def explain(self):
        """A short account of the algorithm chosen for each pass and why."""
        g = self.geometry
        half = (" (stored as float16, computed in float32 on float32 copies in the workspace)"
                if self._converts else "")
        lines = [f"conv2d input {list(g.input_shape)} weight {list(g.weight_shape)} -> output "
                 f"{list(g.output_shape)}, stride {g.stride}, padding {g.pads}, dilation {g.dilation}, "
                 f"groups {g.groups}, {self.dtype}{half}, queues: {self.queues}; GEMMs on {self.gemm} "
                 f"({self._gemm_reason})"]
        for p, (algo, why) in self._choice.items():
            queues = ", per-group queues" if algo.per_group and g.groups > 1 else ""
            lines.append(f"{p} [{algo.name}]: {algo.describe(p)}{queues}; chosen because {why}; "
                         f"workspace {self._workspace_elements(p) * self.compute_dtype.itemsize} bytes")
        return "\n".join(lines)

    def _run(self, pass_name, queue, *refs):
        """Enqueue ``pass_name`` of the chosen algorithm with this queue's workspace (replayed
        when called before on arrays laid out alike: :mod:`clconv.replay`).

        ``refs``: the pass's arrays in argument order, the result last (None: no bias).
        float16 arrays are converted to float32 copies after the algorithm's own workspace,
        the algorithm runs on those, and its result is rounded back into the last array.
        """
        _, what, nbytes = self._runs[pass_name]
        held = workspace(queue, nbytes, what)
        with held as ws:
            self._replays.run(pass_name, queue, refs, ws, held.size,
                              lambda: self._enqueue(pass_name, queue, refs, ws))

    def _enqueue(self, pass_name, queue, refs, ws):
        algo, what, _ = self._runs[pass_name]
        if not self._converts:
            getattr(algo, pass_name)(queue, *refs, ws)
            return
        sizes, copies, at = self._sizes(pass_name), [], algo.workspace[pass_name]
        for r, n in zip(refs, sizes):
            copies.append(None if r is None else Ref(ws, at))
            at += 0 if r is None else n
        for r, c, n in zip(refs[:-1], copies, sizes):
            if r is not None:
                storage.to_real(queue, self.dtype, r, c, n, what)
        getattr(algo, pass_name)(queue, *copies, ws)
        storage.to_store(queue, self.dtype, copies[-1], refs[-1], sizes[-1], what)

    # -- the passes ---------------------------------------------------------------

    def forward(self, input, weight, bias=None, *, out=None, queue=None):
        """output (N, K, OH, OW) = conv2d(input (N, C, H, W), weight (K, C/groups, kh, kw)) + bias (K,)."""
        shapes, out_shape = self._shapes["forward"]
        queue, dev, numpy_mode = prepare(queue, self, {"input": input, "weight": weight, "bias": bias},
                                         shapes, out, out_shape)
        if self.geometry.N:
            self._run("forward", queue, ref(dev["input"]), ref(dev["weight"]),
                      None if bias is None else ref(dev["bias"]), ref(dev["out"]))
        return finish(dev, out, numpy_mode)

    def backward_input(self, weight, grad_output, *, out=None, queue=None):
        """grad_input (N, C, H, W) from weight (K, C/groups, kh, kw) and grad_output (N, K, OH, OW)."""
        _check_grad_output_rank(grad_output, self.geometry)
        shapes, out_shape = self._shapes["backward_input"]
        queue, dev, numpy_mode = prepare(queue, self, {"weight": weight, "grad_output": grad_output},
                                         shapes, out, out_shape)
        if self.geometry.N:
            self._run("backward_input", queue, ref(dev["weight"]), ref(dev["grad_output"]), ref(dev["out"]))
        return finish(dev, out, numpy_mode)

    def backward_weight(self, input, grad_output, *, out=None, queue=None):
        """grad_weight (K, C/groups, kh, kw) from input (N, C, H, W) and grad_output (N, K, OH, OW)."""
        _check_grad_output_rank(grad_output, self.geometry)
        shapes, out_shape = self._shapes["backward_weight"]
        queue, dev, numpy_mode = prepare(queue, self, {"input": input, "grad_output": grad_output},
                                         shapes, out, out_shape)
        if self.geometry.N:
            self._run("backward_weight", queue, ref(dev["input"]), ref(dev["grad_output"]), ref(dev["out"]))
        else:
            storage.zero(queue, dev["out"])
        return finish(dev, out, numpy_mode)


def prepare(queue, plan, arrays, shapes, out, out_shape):
    """Check every argument, then upload NumPy ones (nothing is enqueued before all checks pass).

    ``shapes``: {name: expected size}; ``out_shape``: the result's. ``plan`` gives the dtype,
    context and fallback queue; without one (grad-bias) they come from the arrays.
    Returns (queue, dict of device arrays incl. "out", numpy_mode).
    Every call of every pass runs this: it asks the driver nothing it already knows.
    """
    queue = pick_queue(queue, *arrays.values(), out, default=plan.queue if plan else None)
    context = queue_context(queue)
    same_context = plan is not None and (queue is plan.queue or context == plan.context)
    if same_context and all_plain(plan.dtype, context, arrays, shapes, out, out_shape):
        # the usual call, device arrays that pass every check below: accepted in one test
        return queue, {**arrays, "out": cla.empty(queue, out_shape, plan.dtype) if out is None else out}, False
    given = [(name, a) for name, a in arrays.items() if a is not None or name not in OPTIONAL]
    for name, a in given:
        check_type(name, a)
    if out is not None:
        check_type("out", out)
    check_same_dtype(**dict(given), out=out)
    dtype = given[0][1].dtype
    if plan is not None:
        if not same_context:
            raise ValueError("the queue belongs to another OpenCL context than this plan")
        if dtype != plan.dtype:
            raise TypeError(f"this plan is for {plan.dtype}, got arrays of dtype {dtype}")
    else:
        check_dtype_supported(dtype, queue.device)
    for name, a in given:
        check_array(name, a, shapes[name], context)
    check_out(out, out_shape, context, given)
    dev = dict(arrays)
    numpy_mode = True
    for name, a in given:
        if is_device_array(a):
            numpy_mode = False
        else:
            dev[name] = cla.to_device(queue, np.ascontiguousarray(a))
    dev["out"] = out if is_device_array(out) else cla.empty(queue, out_shape, dtype)
    return queue, dev, numpy_mode


def finish(dev, out, numpy_mode):
    """The result in the caller's form: ``out``, a NumPy array, or the device array."""
    result = dev["out"]
    if isinstance(out, np.ndarray):
        result.get(ary=out)
        return out
    return result.get() if numpy_mode else result


def _check_grad_output_rank(grad_output, g):
    check_type("grad_output", grad_output)
    check_grad_output(g, grad_output.shape)


_PLAN_CACHE_SIZE = 64
_plan_cache = OrderedDict()
_plan_lock = threading.Lock()


def plan(input_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, *, dtype=np.float32,
         queue=None, algorithm="auto", queues="single", workspace_limit=None, gemm="auto"):
    """Build a reusable :class:`Plan` for input (N, C, H, W) and weight (K, C/groups, kh, kw).

    ``algorithm``: "auto" or one of "fc", "1x1", "direct", "fft", "winograd", "im2col" (ValueError if
    it does not apply). ``queues``: "single" or "per-group" (each group's GEMMs on
    their own in-order queue). ``workspace_limit``: bytes of the algorithm's workspace per pass
    (for float16 arrays, their float32 copies come on top). ``gemm``: the GEMM engine, "auto"
    (``CLCONV_GEMM`` if set, else clconv's kernel for the device's type), "clconv", "cpu", "gpu"
    or "clblast" (see :mod:`clconv.gemm`).
    """
    g = conv_geometry(input_shape, weight_shape, stride, padding, dilation, groups)
    return Plan(g, dtype, pick_queue(queue), algorithm=algorithm, queues=queues, workspace_limit=workspace_limit,
                gemm=gemm)


def cached_plan(g, dtype, queue, algorithm="auto", queues="single", gemm="auto"):
    """The plan for (geometry, dtype, context, algorithm, queues, GEMM request) from a small LRU
    cache. An "auto" GEMM request is keyed with CLCONV_GEMM, which the plan resolves it by:
    nothing on this path asks the driver."""
    asked = gemm if gemm != "auto" else "auto:" + os.environ.get("CLCONV_GEMM", "").strip().lower()
    key = (queue_context(queue).int_ptr, g, np.dtype(dtype), algorithm, queues, asked)
    with _plan_lock:
        p = _plan_cache.get(key)
        if p is not None:
            _plan_cache.move_to_end(key)
            return p
    p = Plan(g, dtype, queue, algorithm=algorithm, queues=queues, gemm=gemm)
    with _plan_lock:
        _plan_cache[key] = p
        while len(_plan_cache) > _PLAN_CACHE_SIZE:
            _plan_cache.popitem(last=False)
    return p
