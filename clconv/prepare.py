"""Building a network's kernels before its first calls: :func:`prepare`.

A convolution's first call makes its plan, builds the kernels it needs (each build is the
device compiler's, from tenths of a second to seconds), takes the known-answer check of each
algorithm new to the device and runs once. A network's first step pays that for every layer in
turn. :func:`prepare` does it for a list of layers at once: every layer's passes on zeros, in
worker threads (each on a queue of its own, of the same context), so that the compilers of
independent programs run side by side where the runtime lets them. The plans it makes are the
ones later calls on that context find (:func:`clconv.planner.cached_plan`), and the kernels are
cached per context and on disk (pyopencl's binary cache, the driver's).
"""
import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
from tqdm import tqdm

from .functional import conv2d, conv2d_bias, conv2d_input, conv2d_weight
from .geometry import conv_geometry
from .nn import Conv2d
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


def prepare(layers, *, dtype=np.float32, queue=None, workers=None, progress=False, math=None):
    """Make the plans and build the kernels of ``layers`` before their first calls; return the
    number of distinct layers prepared.

    ``layers``: ``(input_shape, weight_shape)`` or ``(input_shape, weight_shape, options)``
    (``options``: stride, padding, dilation, groups as :func:`clconv.functional.conv2d` takes them), or
    ``(module, input_shape)`` for a :class:`clconv.nn.Conv2d` (its own dtype and queue). Each
    distinct layer's forward (with a bias), grad-input, grad-weight and grad-bias run once on
    zeros (a module's forward and backward, which add nothing to its gradients), ``workers`` at a
    time (default: the host's cores), on ``queue``'s context (default: the default queue's).
    Bad layers raise before anything runs. ``progress``: a progress bar on standard error.
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
