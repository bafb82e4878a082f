"""Device memory for results and workspaces: a pyopencl ``MemoryPool`` per command queue.

A call's result (when no ``out=`` is given) and each pass's workspace come from the pool of
the queue the pass runs on, as PyTorch's caching allocator serves a stream: repeated calls
reuse device memory instead of creating (and releasing) an OpenCL buffer each time, which
costs some drivers far more host time than a small call. A block freed back to a queue's pool is handed out
again only to work enqueued later on that same in-order queue, so it runs after everything
that used the block there. Where a pass on another queue reads an array (``queue=`` other
than the array's own), the call keeps the array alive until that queue has finished the
pass (:func:`keep_until_done`), so its block cannot return to a pool while being read. A call
waits for the writes pyopencl recorded on an argument of another queue (its ``events``; see
``clconv.validate.prepare``); other work of the user's own on other queues is the user's to
order, as with PyTorch's streams.

``allocator=`` (functional API, plans, modules) replaces the pool with the user's pyopencl
allocator, for results and workspaces alike. :func:`free_memory` (``clconv.free_memory()``) returns the pools' free
blocks to the driver; :func:`memory_stats` says what the pools hold.
"""
import atexit
import threading
from collections import OrderedDict
from functools import lru_cache

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pyopencl.tools as cl_tools

from . import limits
from .programs import ClconvError
from .recording import not_capturable

_lock = threading.Lock()
_pools = OrderedDict()   # queue.int_ptr -> (queue, MemoryPool), keeping its queue alive (limits.POOLS_KEPT)
_pending = []            # (event, arrays): arrays read on a queue not their own, kept until the event


def pool(queue):
    """The memory pool of ``queue`` (created on first use)."""
    entry = _pools.get(queue.int_ptr)
    if entry is not None and entry[0] is queue:
        return entry[1]
    with _lock:
        entry = _pools.get(queue.int_ptr)
        if entry is None or entry[0] is not queue:
            entry = _pools[queue.int_ptr] = (queue, cl_tools.MemoryPool(cl_tools.ImmediateAllocator(queue)))
        while len(_pools) > limits.POOLS_KEPT:
            _, (_, evicted) = _pools.popitem(last=False)
            evicted.free_held()
    return entry[1]


def memory_pool(queue):
    """The pyopencl ``MemoryPool`` that clconv takes results and workspaces from for work on
    ``queue`` (created on first use). Pass it as ``allocator=`` to arrays of your own on that
    queue (``pyopencl.array.empty(queue, shape, dtype, allocator=clconv.memory_pool(queue))``) and
    they share its blocks, as tensors share PyTorch's caching allocator."""
    return pool(queue)


def allocate(queue, nbytes, what="", allocator=None):
    """A buffer of ``nbytes`` for work on ``queue``, from ``allocator`` or the queue's pool;
    a driver failure re-raised with ``what`` it was for."""
    try:
        return (allocator or pool(queue))(nbytes)
    except cl.Error as exc:
        raise ClconvError(f"clconv: {what}: allocating {nbytes} bytes failed: {exc}") from exc


@lru_cache(maxsize=limits.LAYOUTS_KEPT)
def layout(shape, dtype):
    """(C-contiguous strides, size) of ``shape`` in ``dtype``."""
    strides, step = [], dtype.itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(1, n)
    return tuple(reversed(strides)), int(np.prod(shape, dtype=object))


def empty(queue, context, shape, dtype, allocator=None):
    """A new C-contiguous Array of ``shape`` and ``dtype`` (both already checked) on ``queue``
    (of ``context``), its memory from ``allocator`` or the queue's pool. Built through
    pyopencl's fast constructor, which skips re-checking the shape (the checked one costs a
    large part of a small pass's host time). Arrays are constructed, not copied from the
    attributes of another: such copies crashed a two-queue case, the cause not found."""
    strides, size = layout(shape, dtype)
    return cla.Array(None, shape, dtype, allocator=allocator or pool(queue), strides=strides, _fast=True,
                     _size=size, _context=context, _queue=queue)


def keep_until_done(queue, arrays):
    """Keep ``arrays`` (read by work just enqueued on ``queue``) alive until that work is done;
    arrays kept earlier whose work has finished are let go."""
    if _pending:
        with _lock:
            _pending[:] = [(e, a) for e, a in _pending
                           if e.command_execution_status != cl.command_execution_status.COMPLETE]
    not_capturable(what="arrays of another queue (a marker keeps them)")
    event = cl.enqueue_marker(queue)
    with _lock:
        _pending.append((event, arrays))


def memory_stats():
    """What the pools hold: {"queues", "active_blocks", "active_bytes" (handed out and not yet
    freed), "held_blocks" (free, kept for reuse), "managed_bytes" (all blocks taken from the
    driver, sizes rounded up to the pools' bins)}."""
    with _lock:
        pools = [p for _, p in _pools.values()]
    return {"queues": len(pools), "active_blocks": sum(p.active_blocks for p in pools),
            "active_bytes": sum(p.active_bytes for p in pools), "held_blocks": sum(p.held_blocks for p in pools),
            "managed_bytes": sum(p.managed_bytes for p in pools)}


def free_memory():
    """Return every pool's free blocks to the driver (blocks in use stay valid and go back to
    the driver when freed)."""
    with _lock:
        for _, p in _pools.values():
            p.free_held()


# Release the blocks while the OpenCL runtime is still up: left to interpreter teardown, they
# can outlive it (seen as a crash at exit with PoCL).
atexit.register(free_memory)
