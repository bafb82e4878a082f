"""Building a network's kernels before its first calls: :func:`prepare`.

A convolution's first call makes its plan, builds the kernels it needs (each build is the
device compiler's, from tenths of a second to seconds), takes the known-answer check of each
algorithm new to the device and runs once. A network's first step pays that for every layer in
turn. :func:`prepare` does it for a list of layers at once: every layer's passes on zeros, in
worker threads (each on a queue of its own, of the same context), so that the compilers of
independent programs run side by side where the runtime lets them. The plans it makes are the
ones later calls on that context find (:func:`clconv.planner.cached_plan`), and the kernels are
cached per context and on disk (pyopencl's binary cache, the driver's).

Where a runtime compiles one program at a time per process whatever the threads (NVIDIA's
OpenCL), ``processes`` deals the work to worker processes first, on the same device, each in a
context of its own: the known-answer checks the layers' plans will ask for (each taken once),
then the layers, run as above. The caches on disk they fill (the driver's kernel cache, the
verdicts in the tuning cache) are what this process's threads then read instead of compiling.
"""
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
from tqdm import tqdm

from .functional import conv2d, conv2d_bias, conv2d_input, conv2d_weight
from . import precision, selfcheck
from .device import pick_device, spec_of
from .geometry import conv_geometry
from .nn import Conv2d
from .plan import Plan
from .planner import tuned_choices
from .programs import ClconvError
from .validate import pick_queue, queue_context

OPTIONS = ("stride", "padding", "dilation", "groups")


def _layer(item):
    """(input shape, weight shape, options, dtype or None, queue or None, module or None) of one
    item of :func:`prepare`'s ``layers``."""
    first = item[0]
    if isinstance(first, Conv2d):   # (clconv.nn.Conv2d, input shape)
        module, input_shape = item
        options = {k: getattr(module, k) for k in OPTIONS}
        return tuple(input_shape), tuple(module.weight.shape), options, module.dtype, module.queue, module
    if hasattr(first, "weight"):
        raise TypeError(f"prepare takes clconv.nn.Conv2d modules, got {type(first).__name__}")
    input_shape, weight_shape, *rest = item
    options = dict(rest[0]) if rest else {}
    unknown = set(options) - set(OPTIONS)
    if unknown or len(rest) > 1:
        raise TypeError(f"a layer is (input shape, weight shape[, options]) with options among {OPTIONS}, "
                        f"got {item!r}")
    return tuple(input_shape), tuple(weight_shape), options, None, None, None


def prepare(layers, *, dtype=np.float32, queue=None, workers=None, processes=0, progress=False, math=None):
    """Make the plans and build the kernels of ``layers`` before their first calls; return the
    number of distinct layers prepared.

    ``layers``: ``(input_shape, weight_shape)`` or ``(input_shape, weight_shape, options)``
    (``options``: stride, padding, dilation, groups as :func:`clconv.functional.conv2d` takes them), or
    ``(module, input_shape)`` for a :class:`clconv.nn.Conv2d` (its own dtype and queue). Each
    distinct layer's forward (with a bias), grad-input, grad-weight and grad-bias run once on
    zeros (a module's forward and backward, which add nothing to its gradients), ``workers`` at a
    time (default: the host's cores), on ``queue``'s context (default: the default queue's).
    Bad layers raise before anything runs. ``processes``: how many worker processes run the layers
    first (0: none; see above). ``progress``: a progress bar on standard error.
    ``math``: the math mode of the shapes' plans, as later calls pass it (:mod:`clconv.precision`;
    None: the dtype's default); a module's plans take the module's.
    """
    work = {}
    for item in layers:
        input_shape, weight_shape, options, own_dtype, own_queue, module = _layer(item)
        conv_geometry(input_shape, weight_shape, *(options.get(k, d) for k, d in zip(OPTIONS, (1, 0, 1, 1))))
        layer_dtype, home = np.dtype(own_dtype or dtype), pick_queue(own_queue or queue)
        key = (input_shape, weight_shape, repr(sorted(options.items())), layer_dtype, queue_context(home).int_ptr,
               id(module))
        work.setdefault(key, (input_shape, weight_shape, options, layer_dtype, home, module))
    if not work:
        return 0
    workers = max(1, min(len(work), workers or os.cpu_count() or 1))
    local = threading.local()

    def run(input_shape, weight_shape, options, layer_dtype, home, module):
        if module is not None:   # its own steps on zeros, which leave its gradients as they are
            x = cla.zeros(module.queue, input_shape, layer_dtype)
            module.backward(x, cla.zeros_like(module.forward(x)))
            module.queue.finish()
            return
        if getattr(local, "context", None) != queue_context(home):   # each worker its own queue (context kept)
            local.context = queue_context(home)
            local.queue = cl.CommandQueue(local.context, home.device)
        q = local.queue
        x, w, b = (cla.zeros(q, s, layer_dtype) for s in (input_shape, weight_shape, weight_shape[:1]))
        y = conv2d(x, w, b, queue=q, math=math, **options)
        conv2d_input(input_shape, w, y, queue=q, math=math, **options)
        conv2d_weight(x, weight_shape, y, queue=q, math=math, **options)
        conv2d_bias(y, queue=q)
        q.finish()

    specs = {home.device: spec_of(home.device) for home in {layer[4] for layer in work.values()}} if processes else {}
    if processes and all(specs.values()):   # (a sub-device has no indices: threads alone)
        # (a module's layer as its shapes, dtype and math: its own steps build nothing a shape's do
        # not; the math mode as this process's defaults resolve it)
        shares, checks = [], {}
        for input_shape, weight_shape, options, layer_dtype, home, module in work.values():
            mode = precision.requested(layer_dtype, module.math if module is not None else math)
            spec = specs[home.device]
            # the verdicts its plan will ask for: its choices as the tuning cache and the rules make
            # them, with none asked for
            g = conv_geometry(input_shape, weight_shape, **options)
            tuned = (None if os.environ.get("CLCONV_AUTOTUNE") == "1"   # (then the tuner times it, in the worker)
                     else functools.partial(tuned_choices, g, layer_dtype, home))
            plan = Plan(g, layer_dtype, home, math=mode, selfcheck=False, tuned=tuned)
            needs = {("check", spec, *c) for c in plan.checks()}
            checks.update(dict.fromkeys(sorted(needs)))
            shares.append((("layer", spec, input_shape, weight_shape, options, layer_dtype.name, mode), needs))
        _in_processes(list(checks), shares, min(processes, len(checks) + len(shares)), progress)
    bar = tqdm(total=len(work), desc="clconv.prepare", unit="layer") if progress else None
    try:
        with ThreadPoolExecutor(workers) as pool:
            for done in as_completed([pool.submit(run, *layer) for layer in work.values()]):
                done.result()
                if bar is not None:
                    bar.update()
    finally:
        if bar is not None:
            bar.close()
    return len(work)


def _in_processes(checks, layers, count, progress):
    """The known-answer ``checks`` and the ``layers`` ((task, the checks it needs)) of
    :func:`_worker` on ``count`` worker processes (``python -m clconv.prepare``), a task at a time to
    whichever is free: every check first, each taken once, then each layer once the checks it needs
    are done (so that no worker takes a check another is taking). ClconvError with a worker's last
    words where one fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH"))))
    todo, waiting, done, failed = list(checks), list(layers), set(), []
    ready = threading.Condition()
    bar = tqdm(total=len(todo) + len(waiting), desc="clconv.prepare (processes)", unit="task") if progress else None

    def next_task():
        with ready:
            while not failed:
                if todo:
                    return todo.pop(0)
                for i, (task, needs) in enumerate(waiting):
                    if needs <= done:
                        return waiting.pop(i)[0]
                if not waiting:
                    return None
                ready.wait()
            return None

    def fail(why):
        with ready:
            failed.append(f"clconv: a prepare worker process failed: {why}")
            ready.notify_all()   # (no one waits for the checks it will not finish)

    def serve(_):
        with tempfile.TemporaryFile("w+") as words:   # (a file: a pipe left unread would fill and block it)
            def last_words():
                words.seek(0)
                lines = words.read().strip().splitlines()
                return lines[-1] if lines else "no message"
            worker = None
            try:
                worker = subprocess.Popen([sys.executable, "-m", "clconv.prepare"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=words, text=True, env=env)
                task = next_task()
                while task is not None:
                    worker.stdin.write(json.dumps(task, default=int) + "\n")   # (NumPy integers as ints)
                    worker.stdin.flush()
                    if not worker.stdout.readline():
                        fail(f"it ended without doing its task (exit status {worker.wait()}): {last_words()}")
                        return
                    if task[0] == "check":   # what layers wait for
                        with ready:
                            done.add(task)
                            ready.notify_all()
                    if bar is not None:
                        bar.update()
                    task = next_task()
                worker.stdin.close()
                if worker.wait():
                    fail(f"exit status {worker.returncode}: {last_words()}")
            except (OSError, ValueError) as exc:   # (a pipe to a worker gone, or none started)
                fail(f"{type(exc).__name__}: {exc}; {last_words()}")
            finally:
                if worker is not None and worker.poll() is None:
                    worker.kill()
                    worker.wait()

    try:
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(serve, range(count)))
    finally:
        if bar is not None:
            bar.close()
    if failed:
        raise ClconvError(failed[0])


def _worker():
    """A worker process of :func:`prepare`: its tasks on standard input, a JSON line each, each on
    the device its spec names, "done" on standard output after each. A task is ("check", spec,
    algorithm, engine, dtype, math), a known-answer verdict, or ("layer", spec, input shape, weight
    shape, options, dtype, math)."""
    queues = {}   # per device spec: (its context, kept while its queue is used, and a queue)
    for line in sys.stdin:
        kind, spec, *task = json.loads(line)
        if spec not in queues:
            device = pick_device(spec)[0]
            context = cl.Context([device])
            queues[spec] = context, cl.CommandQueue(context, device)
        queue = queues[spec][1]
        if kind == "check":
            algorithm, engine, dtype, math = task
            selfcheck.verdict(functools.partial(Plan, selfcheck=False), queue, algorithm, engine, dtype, math)
        else:
            input_shape, weight_shape, options, dtype, math = task
            prepare([(input_shape, weight_shape, options)], dtype=dtype, queue=queue, workers=1, math=math)
        print("done", flush=True)


if __name__ == "__main__":
    _worker()
