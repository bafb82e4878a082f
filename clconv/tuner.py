"""The tuners, above the plans they time: the fastest algorithm per pass (:func:`tune`), the
split of a pass over several devices (:func:`tune_spread`), and
the CLBlast GEMM parameters on the workloads' GEMM passes (:func:`tune_gemm`, whose search
is :func:`clconv.gemm.clblast_params.search`). Winners go to the tuning cache
(:mod:`clconv.tuning`), where :mod:`clconv.planner` finds them."""
import datetime

import numpy as np
import pyopencl.array as cla

from .algorithms import ALGORITHMS
from .gemm import clblast_params
from .geometry import PASSES
from .plan import Plan
from .recording import outside_graph, profiling
from .spread import SpreadPlan
from .tuning import entry_key, spread_key, store, time_ms


def candidates(g):
    """(algorithm, queues) pairs that apply to geometry ``g``."""
    found = []
    for name, cls in ALGORITHMS.items():
        if cls.applies(g)[0]:
            found.append((name, "single"))
            if g.groups > 1 and name != "direct":
                found.append((name, "per-group"))
    return found


def _passes(p, x, w, dy, outs):
    """{pass: a call of that pass of plan ``p`` into its ``outs`` array}."""
    return {"forward": lambda: p.forward(x, w, out=outs["forward"]),
            "backward_input": lambda: p.backward_input(w, dy, out=outs["backward_input"]),
            "backward_weight": lambda: p.backward_weight(x, dy, out=outs["backward_weight"])}


def _arrays(g, dtype, queue, rng):
    """Random input, weight and grad_output of geometry ``g``, and an output array per pass."""
    x, w, dy = (cla.to_device(queue, rng.standard_normal(s).astype(dtype))
                for s in (g.input_shape, g.weight_shape, g.output_shape))
    outs = {p: cla.empty(queue, s, dtype) for p, s in zip(PASSES, (g.output_shape, g.input_shape, g.weight_shape))}
    return x, w, dy, outs


@outside_graph()
def tune(g, dtype, queue, passes=PASSES, save=True, progress=None, math=None):
    """Time every candidate for each pass on ``queue``'s device, its plans asking for math mode
    ``math`` (None: the dtype's default); store the winners under the mode the plans ran, and
    return them.

    Returns {pass: {"algorithm", "queues", "ms", "timings"}}.
    """
    x, w, dy, outs = _arrays(g, dtype, queue, np.random.default_rng(0))
    results, new = {}, {}
    for pass_name in passes:
        timings = {}
        for algorithm, queues in candidates(g):
            if progress:
                progress()
            try:
                p = Plan(g, dtype, queue, algorithm=algorithm, queues=queues, math=math)
            except ValueError:   # e.g. above the workspace limit: not a candidate here
                continue
            timings[f"{algorithm}/{queues}"] = time_ms(_passes(p, x, w, dy, outs)[pass_name], queue)
            mode = p.math   # the same for every candidate: the device's and GEMM engine's
        if not timings:
            continue
        best = min(timings, key=timings.get)
        algorithm, queues = best.split("/")
        results[pass_name] = {"algorithm": algorithm, "queues": queues, "ms": round(timings[best], 4),
                              "timings": {k: round(v, 4) for k, v in timings.items()},
                              "date": datetime.date.today().isoformat()}
        new[entry_key(queue.device, dtype, g, pass_name, mode)] = results[pass_name]
    if save:
        store(new)
    return results


@outside_graph()
def tune_spread(g, dtype, queues, make_plan, passes=PASSES, save=True, math="strict"):
    """Per pass, each split of geometry ``g`` over ``queues`` (:mod:`clconv.spread`): first
    each device's throughput on an even part alone (the shares), then the spread plan with
    those shares; store and return the faster split with its shares, under the math mode
    ``make_plan``'s plans were asked for (``math``).

    Returns {pass: {"split", "shares", "ms", "timings"}}; "timings" has each split and the
    first device alone on the whole pass, for comparison."""
    rng = np.random.default_rng(0)
    home = queues[0]
    x, w, dy, outs = _arrays(g, dtype, home, rng)
    splits = ("images", "groups") if g.groups >= 2 else ("images",)
    results, new = {}, {}
    for pass_name in passes:
        timings, shares = {}, {}
        for split in splits:
            even = SpreadPlan(g, dtype, queues, make_plan, split=split, shares=[1] * len(queues))
            rates = []
            for part in even._parts_for(split, (1,) * len(queues)):
                sub = _passes(part.plan, *_arrays(part.plan.geometry, dtype, part.queue, rng))[pass_name]
                rates.append(part.count / time_ms(sub, part.queue, repeat=3))
            # devices left without a part (fewer items than devices): with even shares, counts()
            # leaves only the last ones empty, so the rates line up with the queues
            rates += [0.0] * (len(queues) - len(rates))
            shares[split] = [round(r / max(rates), 3) for r in rates]
            p = SpreadPlan(g, dtype, queues, make_plan, split=split, shares=shares[split])
            timings[split] = time_ms(_passes(p, x, w, dy, outs)[pass_name], home)
        alone = make_plan(g, home)
        timings["device 0 alone"] = time_ms(_passes(alone, x, w, dy, outs)[pass_name], home)
        best = min(splits, key=timings.get)
        results[pass_name] = {"split": best, "shares": shares[best], "ms": round(timings[best], 4),
                              "timings": {k: round(v, 4) for k, v in timings.items()},
                              "date": datetime.date.today().isoformat()}
        new[spread_key(queues, dtype, g, pass_name, math)] = results[pass_name]
    if save:
        store(new)
    return results


def tune_gemm(geometries, queue, dtype=np.float32, repeat=3, batch=10, save=True, progress=None):
    """Search CLBlast GEMM parameters (:func:`clconv.gemm.clblast_params.search`) on the passes
    of ``geometries`` whose GEMMs CLBlast runs (on GPUs none, unless ``CLCONV_GEMM=clblast``);
    store and return the entry. Run it in a process of its own (``python -m clconv tune-gemm``):
    CLBlast cannot return to its own parameters within a process."""
    if clblast_params.ignore_tuned(queue.device, dtype):    # the baseline must be CLBlast's own parameters
        raise clblast_params.NothingToTune("this process already applied (or overrode) CLBlast parameters; tune "
                                           "in a process of its own")
    rng = np.random.default_rng(0)
    runs = []
    for g in geometries:
        p = Plan(g, dtype, queue)
        calls = _passes(p, *_arrays(g, dtype, queue, rng))
        for name in PASSES:
            with profiling() as events:
                calls[name]()
            if any(kind == "clblast_gemm" for kind, _ in events):
                runs.append(calls[name])
    if not runs:
        raise clblast_params.NothingToTune("no pass of these workloads runs a CLBlast GEMM on this device: nothing "
                                           "to tune")
    return clblast_params.search(runs, queue, dtype, repeat, batch, save, progress)
