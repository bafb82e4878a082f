"""Replaying a pass's launches when a plan is called again on arrays laid out as before.

Working out a pass (its kernels, index types, GEMM tiles, argument lists) costs host time on
every call, often more than the device spends on a small convolution. What a pass enqueues
depends only on its plan (which fixes the GEMM engine), the queue, the arrays' offsets and extents, which
arrays share a buffer, and the workspace's size; so a plan keeps, per such signature, the
launches its first call made, without the caller's buffers. When the signature comes again,
each launch gets a private copy of its kernel with every argument but the buffers set once
(not on the first call: a one-off layout would pay for copies it never uses), and calls set only the buffers and enqueue. Passes that enqueue anything besides
clconv's own kernels (CLBlast GEMMs, per-group queues) are not kept and run in full every time.

The usual call (device arrays on their own queue, a new result or ``out=``) goes shorter still:
once its pass has been replayed, the plan keeps the bound launches under the call's layout
(:func:`replay_layout`: the arrays' offsets and which share a buffer) and
:meth:`Replays.fast` finds them from it, before any other work of the call (``clconv.Plan._call``).
"""
import threading
from collections import OrderedDict

import pyopencl as cl
import pyopencl.array as cla

from . import limits
from .programs import bound_kernel, relaunch
from .recording import capturing
from .validate import OPTIONAL

class Replays:
    def __init__(self):
        self._entries = OrderedDict()   # signature -> [queue, steps, their bound launches or None]
        self._fast = {}                 # (pass key, queue, layout) -> bound launches
        self._lock = threading.Lock()
        self.launched = {}              # pass key -> names of what its last full run launched

    def run(self, pass_key, queue, refs, ws, ws_size, enqueue):
        """Enqueue a pass on ``queue`` with array references ``refs`` (Refs or None) and
        workspace ``ws`` (None, or a buffer of ``ws_size`` bytes): replayed when its signature
        has been seen, else by ``enqueue()``, whose launches are then kept. Returns the bound
        launches when replayed (for :meth:`arm`), else None."""
        key = _signature(pass_key, queue, refs, ws_size)
        entry = self._entries.get(key)
        if entry is not None and entry[0] is queue:
            if entry[2] is None:   # seen a second time: worth its kernel copies
                entry[2] = [(bound_kernel(kernel, args, what), global_size, local_size, slots, what)
                            for kernel, global_size, local_size, args, slots, what in entry[1]]
            relaunch(queue, entry[2], [None if r is None else r.buf for r in refs] + [ws])
            return entry[2]
        with capturing() as capture:
            enqueue()
        self.launched.pop(pass_key, None)   # the newest last
        self.launched[pass_key] = capture.names
        steps = _steps(capture, refs, ws) if capture.complete else None
        if steps is not None:
            with self._lock:   # another thread's entry for this signature, maybe bound already, stays
                kept = self._entries.get(key)
                if kept is None or kept[0] is not queue:
                    self._entries[key] = [queue, steps, None]
                while len(self._entries) > limits.REPLAYS_KEPT:
                    self._entries.popitem(last=False)
        return None

    def arm(self, pass_key, queue, layout, launches):
        """Keep ``launches`` (a replay's, from :meth:`run`) for :meth:`fast` calls of ``pass_key``
        on ``queue`` whose arrays have ``layout`` (:func:`replay_layout`)."""
        with self._lock:
            if len(self._fast) >= limits.REPLAYS_KEPT:
                self._fast.clear()
            self._fast[pass_key, queue, layout] = launches

    def fast(self, pass_key, queue, layout):
        """The launches :meth:`arm` kept for a call of ``pass_key`` on ``queue`` whose arrays
        have ``layout``, or None; to be relaunched (:func:`clconv.programs.relaunch`) with the
        arrays' buffers, the result's and the workspace."""
        return self._fast.get((pass_key, queue, layout))


def replay_spec(names, shapes, strides):
    """What :func:`replay_layout` checks each of a pass's arrays against, given their ``names``,
    expected ``shapes`` and C-contiguous ``strides`` in argument order, "out" last: per array
    (whether it may be None, its shape, its strides)."""
    return tuple((name in OPTIONAL or name == "out", shape, step) for name, shape, step in zip(names, shapes, strides))


def replay_layout(queue, dtype, arrays, spec):
    """The layout of a call's ``arrays`` (in argument order, "out" last) when every one is an
    aligned pyopencl Array of ``dtype`` with the shape and strides of ``spec``
    (:func:`replay_spec`; None where it may be None) on ``queue`` itself (then it is in the
    queue's context and there is nothing of another queue to wait for), else None. The layout
    is what a replay's arguments depend on in such arrays: per array (None stays None) its byte
    offset and the position, among the arrays before it that are not None, of the first sharing
    its buffer (their count if none does). A replayed call whose arrays are laid out as an
    earlier call's that passed every check needs no other check (``clconv.Plan._call``,
    :mod:`clconv.replay`). The strides are compared rather than asking pyopencl's flags, which
    a new array works out on first use at a cost. One loop: this runs on every call.
    Returned with the arrays' buffers in argument order (None for None), as (layout, buffers)."""
    key, bufs, seen = [], [], []
    itemsize = dtype.itemsize
    for a, (optional, shape, step) in zip(arrays, spec):
        if a is None:
            if not optional:
                return None
            key.append(None)
            bufs.append(None)
            continue
        if (type(a) is not cla.Array or a.queue is not queue or a.shape != shape or a.strides != step
                or a.dtype != dtype or a.offset % itemsize):
            return None
        buf, first = a.base_data, 0
        for other in seen:
            if other is buf:
                break
            first += 1
        seen.append(buf)
        bufs.append(buf)
        key.append((a.offset, first))
    return tuple(key), bufs


def _signature(pass_key, queue, refs, ws_size):
    """What the launches depend on besides the plan: per array its offset, extent and the first
    array sharing its buffer; the queue and the workspace's size."""
    ids = [None if r is None else id(r.buf) for r in refs]   # all buffers are alive during the call
    arrays = tuple(None if r is None else (r.off, r.end, ids.index(i)) for r, i in zip(refs, ids))
    return pass_key, queue.int_ptr, ws_size, arrays


def _steps(capture, refs, ws):
    """The captured launches as (kernel, global size, local size, arguments with the buffers
    left out, buffer slots, what); a slot is (argument position, -1 for the workspace or i for
    ``refs[i]``). None if a launch took a buffer that is neither."""
    steps = []
    for kernel, global_size, local_size, args, what in capture.launches:
        args, slots = list(args), []
        for pos, a in enumerate(args):
            if isinstance(a, cl.MemoryObjectHolder):
                if a is ws:
                    slots.append((pos, -1))
                else:
                    i = next((i for i, r in enumerate(refs) if r is not None and r.buf is a), None)
                    if i is None:
                        return None
                    slots.append((pos, i))
                args[pos] = None   # kept without the caller's buffers
        steps.append((kernel, global_size, local_size, tuple(args), tuple(slots), what))
    return steps
