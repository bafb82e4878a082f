"""Plans: one convolution's shapes on one context, with an algorithm per pass.

A :class:`Plan` owns the shape arithmetic, the choice of algorithm for each pass (among
:data:`clconv.algorithms.ALGORITHMS`, each following :mod:`clconv.algorithms.base`), the GEMM
engine, the workspace sizes and the argument checks, and runs the passes. Plans are built
by :mod:`clconv.planner` (``clconv.plan()``, the functional API's cache, the tuning cache).
"""
import functools
from typing import NamedTuple

import numpy as np

from . import memory, precision, probe, selfcheck, storage
from .algorithms import ALGORITHMS
from .buffers import ref
from .device import check_dtype_supported
from .explanation import Explanation, PassRecord, short
from .gemm import choose as choose_gemm
from .geometry import PASSES
from .programs import ClconvError, relaunch
from .replay import Replays, replay_layout, replay_spec
from .validate import check_grad_output_array, finish, prepare, queue_context

QUEUES = ("single", "per-group")


def default_workspace_limit(device):
    """Workspace budget in bytes: half the device's largest allocation, at most 1 GiB."""
    return min(device.max_mem_alloc_size // 2, 1 << 30)


class Plan:
    """Grouped conv2d of fixed shapes on one OpenCL context.

    input (N, C, H, W), weight (K, C/groups, kh, kw), output (N, K, OH, OW).
    Methods take pyopencl Arrays (or NumPy arrays, copied to the plan's queue
    and answered as NumPy) and return the result; ``out=`` writes in place.
    Results and workspaces come from the queue's memory pool (:mod:`clconv.memory`), or from
    ``allocator`` (the plan's, or a call's) when one is given.
    ``tuned``: {pass: tuning-cache entry} for passes whose algorithm was measured, or a function
    of the plan's math mode that gives them (:func:`clconv.planner.tuned_choices`); the others are
    chosen by the rules. ``math``: the math mode asked for (:mod:`clconv.precision`; None: the
    dtype's default), kept as ``math_request``; the plan's ``math`` is the mode it runs, that one
    where its GEMM engine and device can, else "strict" (``explain()`` says why).
    Only algorithms that passed their known-answer check on this device are chosen
    (:mod:`clconv.selfcheck`), on a device that builds kernels at all (:mod:`clconv.probe`);
    ``selfcheck=False`` skips both, as the check's own plans and the tests' stand-in devices do.
    """

    def __init__(self, geometry, dtype, queue, *, algorithm="auto", queues="single", workspace_limit=None,
                 gemm="auto", tuned=None, allocator=None, selfcheck=True, math=None):
        self.geometry, self.dtype, self.queue, self.allocator = geometry, np.dtype(dtype), queue, allocator
        self._selfcheck = selfcheck
        self.context = queue_context(queue)   # kept: the caller may drop theirs
        self.compute_dtype = storage.compute_dtype(dtype)   # float32 for float16 arrays
        if queues not in QUEUES:
            raise ValueError(f"queues must be one of {QUEUES}, got {queues!r}")
        self.queues = queues
        check_dtype_supported(self.dtype, queue.device)
        self.math_request = precision.requested(self.dtype, math)
        _check_allocations(geometry, self.dtype, queue.device)
        if selfcheck:   # a device that builds nothing: its compiler's words, not a plan's (stand-ins skip both)
            probe.require(queue.device)
        self.gemm, self._gemm_reason = choose_gemm(queue.device, gemm)   # fixed for the plan's life
        self.math, self._math_reason = precision.resolve(queue.device, self.gemm, self.dtype, self.math_request)
        self.workspace_limit = workspace_limit or default_workspace_limit(queue.device)
        if self.workspace_limit > queue.device.max_mem_alloc_size:
            raise ValueError(f"workspace_limit {self.workspace_limit} is above the device's largest "
                             f"allocation {queue.device.max_mem_alloc_size}")
        if algorithm not in ("auto", *ALGORITHMS):
            raise ValueError(f"unknown algorithm {algorithm!r}; expected 'auto' or one of {sorted(ALGORITHMS)}")
        tuned = tuned(self.math) if callable(tuned) else tuned or {}
        self._converts = self.dtype != self.compute_dtype   # float16 arrays, float32 algorithms
        self._choice = {p: self._choose(p, algorithm, tuned.get(p)) for p in PASSES}
        # float16 arrays: the passes run on float32 copies of them (the others read them as they are)
        self._copies = {p: self._converts and p not in algo.half_passes for p, (algo, _) in self._choice.items()}
        # what each call needs, worked out once: (algorithm, name for messages, workspace bytes)
        g = geometry
        self._runs = {p: (algo, f"{p} of input {list(g.input_shape)} with weight {list(g.weight_shape)} [{algo.name}]",
                          self._workspace_elements(p) * self.compute_dtype.itemsize)
                      for p, (algo, _) in self._choice.items()}
        # per pass: its arguments' names and expected sizes, and the result's size, checked on every call
        self._shapes = {p: (tuple(sizes), tuple(sizes.values()), out) for p, (sizes, out) in g.pass_shapes().items()}
        # what the usual call needs, in one look-up (Plan._call): the quick test of its arrays
        # (their sizes as above with their C-contiguous strides, the result among the arguments,
        # optional there: None asks for a new one), the result's size, the pass's name for
        # messages and its workspace bytes
        self._usual = {p: (replay_spec((*names, "out"), (*shapes, out),
                                       tuple(memory.layout(s, self.dtype)[0] for s in (*shapes, out))),
                           out, self._runs[p][1], self._runs[p][2])
                       for p, (names, shapes, out) in self._shapes.items()}
        self._replays = Replays()

    def _build(self, cls, per_group):
        return cls(self.geometry, self.compute_dtype, self.queue.device, self.workspace_limit, per_group=per_group,
                   gemm=self.gemm, math=self.math, half=self._converts)

    def _trusted(self, name):
        """(ok, why not) from the known-answer check of algorithm ``name`` on this plan's device,
        GEMM engine, dtype and math mode, the algorithm's own (:func:`clconv.selfcheck.verdict`)."""
        if not self._selfcheck:
            return True, ""
        return selfcheck.verdict(functools.partial(Plan, selfcheck=False), self.queue, name, self.gemm, self.dtype,
                                 self._math_of(ALGORITHMS[name]))

    def _math_of(self, cls):
        """The math mode algorithm ``cls``'s GEMMs run in on this plan."""
        return self.math if cls.MATRIX_UNITS else "strict"

    def checks(self):
        """The known-answer verdicts its choices rest on: {(algorithm, GEMM engine, dtype, math
        mode)} of the algorithms it chose (:func:`clconv.selfcheck.verdict`'s arguments)."""
        return {(name, self.gemm, self.dtype.name, self._math_of(ALGORITHMS[name])) for name in self.algorithms.values()}

    def _choose(self, pass_name, algorithm, tuned=None):
        g = self.geometry
        if (tuned and tuned.get("algorithm") in ALGORITHMS and ALGORITHMS[tuned["algorithm"]].applies(g)[0]
                and self._trusted(tuned["algorithm"])[0]):
            others = ", ".join(f"{k} {v} ms" for k, v in sorted(tuned.get("timings", {}).items()))
            try:
                return (self._build(ALGORITHMS[tuned["algorithm"]], tuned.get("queues") == "per-group"),
                        _Why(f"fastest on this device in the tuning cache ({others or str(tuned.get('ms')) + ' ms'})",
                             ("tuned",)))
            except ValueError:   # e.g. this plan's workspace limit: choose as if nothing were tuned
                pass
        candidates = ALGORITHMS if algorithm == "auto" else {algorithm: ALGORITHMS[algorithm]}
        reasons, passed_over, untrusted, unpreferred = [], [], [], []   # passed_over: (name, rule)
        for name, cls in candidates.items():
            ok, why = cls.applies(g)
            if ok and algorithm == "auto":
                preferred, why_not = cls.preferred(g, pass_name, self.queue.device)
                if not preferred:
                    passed_over.append((name, why_not.rule))
                    unpreferred.append((name, why))
                    continue
            if ok:
                trusted, why_not = self._trusted(name)   # asked only of what applies (and, for "auto", is preferred)
                if not trusted and algorithm != "auto":
                    d = self.queue.device
                    engine = selfcheck.engine_field(self.gemm, self._math_of(cls))
                    raise ClconvError(f"clconv: algorithm {name!r} (GEMMs on {engine}, {self.dtype}) failed its "
                                      f"known-answer check on {d.name.strip()} ({d.platform.name.strip()}, driver "
                                      f"{d.driver_version}): {why_not}")
                if not trusted:
                    passed_over.append((name, "known-answer"))
                    untrusted.append(f"{name}: {why_not}")
                    continue
                try:
                    return self._build(cls, self.queues == "per-group"), _Why(why, (), passed_over)
                except ValueError as exc:   # e.g. the workspace limit: "auto" tries the next one
                    if algorithm != "auto":
                        raise
                    why = str(exc)
                    passed_over.append((name, "workspace"))
            reasons.append(f"{name}: {why}")
        if untrusted:   # what the rules passed over still runs where what they preferred failed its check
            for name, why in unpreferred:
                if self._trusted(name)[0]:
                    try:
                        return (self._build(ALGORITHMS[name], self.queues == "per-group"),
                                _Why(f"{why}, and those preferred failed their known-answer check",
                                     ("known-answer",), passed_over))
                    except ValueError:
                        pass
        shapes = f"input {list(g.input_shape)} with weight {list(g.weight_shape)}"
        if untrusted:   # the input is fine: this device failed the algorithms that would run it
            raise ClconvError(f"clconv: no algorithm can run {pass_name} of {shapes} on "
                              f"{probe.describe(self.queue.device)}: left out by the known-answer check: "
                              f"{'; '.join(untrusted)}; not applicable: {'; '.join(reasons) or 'none'}")
        raise ValueError(f"algorithm {algorithm!r} does not apply to {shapes}: {'; '.join(reasons)}")

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
        float16 arrays the float32 copies of them where it does not read them as they are."""
        own = self._choice[pass_name][0].workspace[pass_name]
        return own + sum(self._sizes(pass_name)) if self._copies[pass_name] else own

    @property
    def workspace_bytes(self):
        """Largest workspace any pass allocates, in bytes."""
        return max(self._workspace_elements(p) for p in PASSES) * self.compute_dtype.itemsize

    def explain(self):
        """The plan as data: an :class:`clconv.explanation.Explanation`, a
        :class:`~clconv.explanation.PassRecord` per pass (algorithm, GEMM shape and engine, chunks,
        splits, workspace, launches, the rules that decided and a short reason) under a header
        (shapes, options, dtype, math mode asked for and run and why, queues, the GEMM engine and
        why). As a string, a compact table; each rule's story is in the docs' algorithms page under
        ``rule-<name>``."""
        g = self.geometry
        stored = f" (stored {self.dtype})" if self._converts else ""
        plain = f"{self.compute_dtype}{stored}"
        header = dict(input=tuple(g.input_shape), weight=tuple(g.weight_shape), output=tuple(g.output_shape),
                      stride=tuple(g.stride), padding=tuple(g.pads), dilation=tuple(g.dilation), groups=g.groups,
                      dtype=str(self.dtype), math=plain if self.math == "strict" else f"{self.math}{stored}",
                      math_request=self.math_request, math_reason=self._math_reason, queues=self.queues,
                      gemm=self.gemm, gemm_reason=self._gemm_reason)
        records = []
        for p, (algo, why) in self._choice.items():
            facts = algo.facts(p)
            notes, rules = list(facts.get("notes", ())), [*why.rules, *facts.get("rules", ())]
            if algo.per_group and g.groups > 1:
                notes.append("per-group queues")
            if self._converts:
                notes.append("on float32 copies" if self._copies[p] else "float16 arrays read as they are")
            if facts.get("gemm") and algo.math != self.math:
                notes.append(algo.STRICT_NOTE)
            if algo.panels.get(p, (0, 0))[1]:
                notes.append("B^T packed in panels" if p == "backward_weight" else "B packed in panels")
                rules.append("cpu-gemm-panels")
            launches = self.launches(p)
            records.append(PassRecord(
                pass_name=p, algorithm=algo.name, engine=self.gemm if facts.get("gemm") else "",
                gemm=tuple(facts.get("gemm", ())), batch=facts.get("batch", 0), chunks=tuple(facts.get("chunks", ())),
                pieces=tuple(facts.get("pieces", ())), splits=facts.get("splits", 1),
                math=f"{algo.math}{stored}" if facts.get("gemm") and algo.math != "strict" else plain,
                workspace=self._workspace_elements(p) * self.compute_dtype.itemsize,
                launches=None if launches is None else tuple(launches), rules=tuple(dict.fromkeys(rules)),
                passed_over=tuple(why.passed_over), reason=short(why.reason), notes=tuple(notes)))
        return Explanation(header, records)

    def enqueue(self, pass_name, queue, *refs, allocator=None, relu=False):
        """Enqueue ``pass_name`` of the chosen algorithm on ``queue`` with its workspace, on
        arrays already checked (:meth:`forward` and the others check, then call this; so does
        :mod:`clconv.transpose`). Replayed when called before on arrays laid out alike
        (:mod:`clconv.replay`); then the replayed launches are returned, else None.

        ``refs``: the pass's arrays as :class:`clconv.buffers.Ref` s in argument order, the
        result last (None: no bias); ``relu`` (forward only): the output through max(., 0) in the
        pass that writes it. float16 arrays run on float32 copies in the workspace
        (:func:`clconv.storage.on_float_copies`) unless the algorithm reads them as they are
        (its ``half_passes``). The workspace is taken from ``allocator`` (else
        the plan's, else the queue's pool) for this pass and freed when it is enqueued: a
        pool hands it out again only to work enqueued after it on the same queue.
        """
        _, what, nbytes = self._runs[pass_name]
        ws = memory.allocate(queue, nbytes, what, allocator or self.allocator) if nbytes else None
        return self._replays.run((pass_name, relu), queue, refs, ws, nbytes,
                                 lambda: self._enqueue(pass_name, queue, refs, ws, relu))

    def _enqueue(self, pass_name, queue, refs, ws, relu):
        algo, what, _ = self._runs[pass_name]
        run = getattr(algo, pass_name)
        if relu:
            run = functools.partial(run, relu=True)
        if self._copies[pass_name]:
            storage.on_float_copies(queue, self.dtype, refs, self._sizes(pass_name), ws, algo.workspace[pass_name],
                                    lambda *copies: run(queue, *copies, ws), what)
        else:
            run(queue, *refs, ws)

    def launches(self, pass_name):
        """What the latest full run of ``pass_name`` enqueued, in order (kernel names, and
        "clblast_gemm" for each CLBlast call), or None before its first call."""
        found = [names for (p, _), names in self._replays.launched.items() if p == pass_name]
        return found[-1] if found else None

    # -- the passes ---------------------------------------------------------------

    def forward(self, input, weight, bias=None, *, out=None, queue=None, allocator=None, relu=False):
        """output (N, K, OH, OW) = conv2d(input (N, C, H, W), weight (K, C/groups, kh, kw)) + bias (K,),
        through max(., 0) with ``relu`` (fused into the pass that writes the output)."""
        return self._call("forward", (input, weight, bias), out, queue, allocator, relu)

    def backward_input(self, weight, grad_output, *, out=None, queue=None, allocator=None):
        """grad_input (N, C, H, W) from weight (K, C/groups, kh, kw) and grad_output (N, K, OH, OW)."""
        return self._call("backward_input", (weight, grad_output), out, queue, allocator)

    def backward_weight(self, input, grad_output, *, out=None, queue=None, allocator=None):
        """grad_weight (K, C/groups, kh, kw) from input (N, C, H, W) and grad_output (N, K, OH, OW)."""
        return self._call("backward_weight", (input, grad_output), out, queue, allocator)

    def _call(self, pass_name, arrays, out, queue, allocator, relu=False):
        """A pass on ``arrays`` (in argument order): checked, uploaded where NumPy, enqueued, and
        its result in the caller's form. The usual call (device arrays of the plan's dtype and
        their expected sizes on their own queue, ``out`` too if given) whose layout was replayed
        before is enqueued at once (:meth:`clconv.replay.Replays.fast`), nothing else done."""
        key = (pass_name, relu)
        allocator = allocator or self.allocator
        home = queue or getattr(arrays[0], "queue", None)
        if home is not None:
            spec, out_shape, what, nbytes = self._usual[pass_name]
            found = replay_layout(home, self.dtype, (*arrays, out), spec)
            launches = None if found is None else self._replays.fast(key, home, found[0])
            if launches is not None:
                bufs = found[1]   # the arrays' and out's buffers; the workspace's appended
                if out is None:
                    out = memory.empty(home, self.context, out_shape, self.dtype, allocator)
                    bufs[-1] = out.base_data
                bufs.append(memory.allocate(home, nbytes, what, allocator) if nbytes else None)
                relaunch(home, launches, bufs)
                return out
        names, shapes, out_shape = self._shapes[pass_name]
        if pass_name != "forward":
            check_grad_output_array(arrays[-1], self.geometry)
        queue, dev, numpy_mode = prepare(queue, self, dict(zip(names, arrays)), dict(zip(names, shapes)), out,
                                         out_shape, allocator)
        if self.geometry.N:
            refs = [None if dev[n] is None else ref(dev[n]) for n in names] + [ref(dev["out"])]
            replayed = self.enqueue(pass_name, queue, *refs, allocator=allocator, relu=relu)
            found = (None if replayed is None
                     else replay_layout(queue, self.dtype, (*arrays, out), self._usual[pass_name][0]))
            if found is not None:
                self._replays.arm(key, queue, found[0], replayed)
        elif pass_name == "backward_weight":
            storage.zero(queue, dev["out"])
        return finish(queue, dev, out, numpy_mode)


class _Why(NamedTuple):
    """Why a pass's algorithm was chosen: the reason's text, the rules that decided it (beyond the
    algorithm's own, :meth:`clconv.algorithms.base.Algorithm.facts`), and the algorithms taken
    before it and passed over, each with the rule that passed it over."""
    reason: str
    rules: tuple = ()
    passed_over: tuple = ()

    def __str__(self):
        return self.reason


def _check_allocations(g, dtype, device):
    """Refuse, before anything is enqueued, a convolution whose input, weight or output is larger
    than one allocation on ``device``; say what would fit."""
    limit = device.max_mem_alloc_size
    for name, shape in (("output", g.output_shape), ("input", g.input_shape), ("weight", g.weight_shape)):
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if nbytes > limit:
            per_image = nbytes // g.N if name != "weight" and g.N else 0
            fits = (f"; a batch of at most {limit // per_image} image(s) would fit" if per_image and per_image <= limit
                    else "")
            raise ValueError(f"conv2d of input {list(g.input_shape)} with weight {list(g.weight_shape)}: the {name} "
                             f"{list(shape)} of {np.dtype(dtype).name} needs {nbytes} bytes, above the largest "
                             f"allocation of {device.name.strip()}, {limit} bytes{fits}")
