"""Checks on array arguments, all made before anything is enqueued, and the marshalling
beside them (:func:`prepare`, :func:`finish`).

Shape rules live in :mod:`clconv.geometry`; this module checks the arrays
themselves: type, dtype, shape, context, layout, and that an output does not
overlap an input.
"""
import threading
from collections import OrderedDict

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from . import limits, memory
from .device import check_dtype_supported, default_queue
from .geometry import check_grad_output
from .recording import current_graph, not_capturable


def is_device_array(a):
    return isinstance(a, cla.Array)


def check_type(name, a):
    """Raise TypeError unless ``a`` is a float pyopencl Array or NumPy array."""
    if not isinstance(a, (cla.Array, np.ndarray)):
        raise TypeError(f"{name} must be a pyopencl.array.Array or a numpy.ndarray, got {type(a).__name__}")
    if a.dtype.kind != "f":
        raise TypeError(f"{name} must be a floating-point array, got {name} of dtype {a.dtype} "
                        f"and size {list(a.shape)}")


def check_grad_output_array(grad_output, g):
    """Raise unless ``grad_output`` is a float array of geometry ``g``'s output size."""
    check_type("grad_output", grad_output)
    check_grad_output(g, grad_output.shape)


def check_same_dtype(**arrays):
    """Raise TypeError unless every given array has one dtype."""
    given = {k: a for k, a in arrays.items() if a is not None}
    dtypes = {a.dtype for a in given.values()}
    if len(dtypes) > 1:
        desc = ", ".join(f"{k} {a.dtype} {list(a.shape)}" for k, a in given.items())
        raise TypeError(f"all arrays must have the same dtype, got {desc}")


def check_array(name, a, shape, context):
    """Check shape, and for device arrays the context, contiguity and alignment.

    NumPy arrays need no layout check: they are copied to the device contiguously.
    """
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} has size {list(a.shape)}, expected {list(shape)}")
    if is_device_array(a):
        if a.context != context:
            raise ValueError(f"{name} of size {list(a.shape)} lives in another OpenCL context than the queue "
                             f"used ({context.devices[0].name}); put all arrays in one context")
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} of size {list(a.shape)} with strides {a.strides} must be C-contiguous")
        if a.offset % a.dtype.itemsize:
            raise ValueError(f"{name} has a byte offset {a.offset} that is not a multiple of its item size")


def check_out(out, shape, context, inputs):
    """Validate an ``out=`` array (its type and dtype already checked): shape, context, and for a
    device array no overlap with the ``inputs``, ((name, array), ...)."""
    if out is None:
        return
    check_array("out", out, shape, context)
    if not is_device_array(out):
        if any(is_device_array(a) for _, a in inputs):
            raise TypeError("out is a numpy.ndarray but the inputs are device arrays; pass a pyopencl Array")
        return
    for name, a in inputs:
        if is_device_array(a) and _overlap(a, out):
            raise ValueError(f"out of size {list(out.shape)} (bytes {out.offset}..{out.offset + out.nbytes}) "
                             f"overlaps {name} of size {list(a.shape)} (bytes {a.offset}..{a.offset + a.nbytes}) "
                             "in one buffer")


def _overlap(a, b):
    """Whether device arrays ``a`` and ``b`` share bytes of one buffer."""
    return (a.base_data == b.base_data and a.nbytes and b.nbytes
            and a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes)


OPTIONAL = ("bias",)   # the only arguments that may be None (and "out", the result, checked on its own)


def all_plain(dtype, context, arrays, shapes, out, out_shape):
    """Whether every array (``arrays``: {name: array}, None where allowed; ``out`` or None) is a
    C-contiguous pyopencl Array of ``dtype`` and its expected shape in ``context``, aligned,
    and ``out`` overlaps none of the others: the usual call, accepted in one quick test.
    Anything else goes through the checks above, which name what is wrong (or accept it)."""
    for name, a in arrays.items():
        if not (a is None and name in OPTIONAL or _plain(a, dtype, shapes[name]) and a.context == context):
            return False
    if out is None:
        return True
    return (_plain(out, dtype, out_shape) and out.context == context
            and not any(a is not None and _overlap(a, out) for a in arrays.values()))


def _plain(a, dtype, shape):
    return (type(a) is cla.Array and a.dtype == dtype and a.shape == shape and a.flags.c_contiguous
            and not a.offset % dtype.itemsize)


def pick_queue(queue, *arrays, default=None):
    """``queue`` if given, else the first device array's queue, else ``default``,
    else :func:`clconv.default_queue`."""
    if queue is not None:
        if not isinstance(queue, cl.CommandQueue):
            raise TypeError(f"queue must be a pyopencl.CommandQueue, got {type(queue).__name__}")
        return queue
    for a in arrays:
        if is_device_array(a) and a.queue is not None:
            return a.queue
    return default if default is not None else default_queue()


_queue_contexts = OrderedDict()   # queue.int_ptr -> (queue, its context); the queue kept alive (limits.QUEUES_KEPT)
_queue_lock = threading.Lock()


def queue_context(queue):
    """The context of ``queue``, after checking it is in-order (our passes rely on in-order
    execution); asked of the driver once per queue, as every call needs both."""
    entry = _queue_contexts.get(queue.int_ptr)
    if entry is not None and entry[0] is queue:
        return entry[1]
    if queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE:
        raise ValueError("clconv needs an in-order command queue; got an out-of-order queue")
    try:
        context = queue.context
    except cl.Error as exc:
        raise ValueError("the queue's context was released: keep a reference to the pyopencl.Context (or an "
                         "array in it) while its queues are used; some runtimes (Intel's) treat a context "
                         f"without one as gone ({exc})") from exc
    with _queue_lock:
        _queue_contexts[queue.int_ptr] = (queue, context)
        while len(_queue_contexts) > limits.QUEUES_KEPT:
            _queue_contexts.popitem(last=False)
    return context


def prepare(queue, plan, arrays, shapes, out, out_shape, allocator=None):
    """Check every argument, then upload NumPy ones (nothing is enqueued before all checks pass).

    ``shapes``: {name: expected size}; ``out_shape``: the result's. ``plan`` gives the dtype,
    context and fallback queue; without one (grad-bias) they come from the arrays. A new
    result and uploads come from ``allocator``, else the queue's pool (:mod:`clconv.memory`).
    Returns (queue, dict of device arrays incl. "out", numpy_mode).
    Every call of every pass runs this: it asks the driver nothing it already knows.
    """
    queue = pick_queue(queue, *arrays.values(), out, default=plan.queue if plan else None)
    context = queue_context(queue)
    same_context = plan is not None and (queue is plan.queue or context == plan.context)
    if same_context and all_plain(plan.dtype, context, arrays, shapes, out, out_shape):
        # the usual call, device arrays that pass every check below: accepted in one test
        _after_their_queues(queue, arrays.values(), out)
        if out is None:
            out = memory.empty(queue, context, out_shape, plan.dtype, allocator)
        return queue, {**arrays, "out": out}, False
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
    if current_graph() is not None:
        host = [name for name, a in (*given, ("out", out)) if a is not None and not is_device_array(a)]
        if host:
            raise TypeError(f"inside clconv.graph() arrays must be pyopencl arrays, whose buffers a replay reuses; "
                            f"got NumPy arrays for {', '.join(host)}")
    _after_their_queues(queue, arrays.values(), out)
    dev = dict(arrays)
    numpy_mode = True
    allocator = allocator or memory.pool(queue)
    for name, a in given:
        if is_device_array(a):
            numpy_mode = False
        else:
            dev[name] = cla.to_device(queue, np.ascontiguousarray(a), allocator=allocator)
    dev["out"] = out if is_device_array(out) else memory.empty(queue, context, tuple(out_shape), dtype, allocator)
    return queue, dev, numpy_mode


def _after_their_queues(queue, arrays, out):
    """Order the call after what pyopencl recorded on device arrays of another queue (their
    ``events``: writes, ``to_device`` among them). A blocking write returning is not enough:
    Intel's CPU runtime showed a kernel on a second queue the old contents of a buffer just
    written through the first, about one call in four under load, unless it waited on the
    write's event."""
    events = [e for a in (*arrays, out) if is_device_array(a) and a.queue is not None and a.queue is not queue
              for e in a.events]
    if events:
        not_capturable(what="arrays of another queue (a barrier on their writes)")
        cl.enqueue_barrier(queue, wait_for=events)


def finish(queue, dev, out, numpy_mode):
    """The result in the caller's form: ``out``, a NumPy array, or the device array. Arrays of
    another queue than the one the pass ran on are kept alive until it is done
    (:func:`clconv.memory.keep_until_done`)."""
    if any(a is not None and a.queue is not queue for a in dev.values()):
        memory.keep_until_done(queue, list(dev.values()))
    result = dev["out"]
    if isinstance(out, np.ndarray):
        result.get(ary=out)
        return out
    return result.get() if numpy_mode else result
