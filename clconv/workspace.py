"""Workspace buffers, reused between calls: one per command queue.

Commands on one in-order queue run in order, so every pass enqueued on a queue
can reuse that queue's buffer; a lock keeps two threads sharing a queue from
interleaving their passes. The buffer grows to the largest request and is kept
for the last few queues used (``free_workspaces`` drops them all).
"""
import atexit
import threading
from collections import OrderedDict
from contextlib import contextmanager

import pyopencl as cl

from .programs import ClconvError

MAX_QUEUES = 8
_lock = threading.Lock()
_entries = OrderedDict()   # queue.int_ptr -> [queue, buffer or None, lock]


@contextmanager
def workspace(queue, nbytes, what=""):
    """Hold this queue's workspace (at least ``nbytes``) while enqueuing a pass. A pass
    with no workspace gets None and holds nothing."""
    if not nbytes:
        yield None
        return
    with _lock:
        entry = _entries.get(queue.int_ptr)
        if entry is None:
            entry = _entries[queue.int_ptr] = [queue, None, threading.Lock()]   # keeps the queue alive
        _entries.move_to_end(queue.int_ptr)
        while len(_entries) > MAX_QUEUES:
            _entries.popitem(last=False)
    with entry[2]:
        if entry[1] is None or entry[1].size < nbytes:
            entry[1] = None
            try:
                entry[1] = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, nbytes)
            except cl.Error as exc:
                raise ClconvError(f"clconv: {what}: allocating {nbytes} bytes of workspace failed: {exc}") from exc
        yield entry[1]


def free_workspaces():
    """Release every cached workspace buffer (they are re-allocated on demand)."""
    with _lock:
        for queue, _, _ in _entries.values():
            queue.finish()
        _entries.clear()


# Release the buffers while the OpenCL runtime is still up: left to interpreter
# teardown, they can outlive it (seen as a crash at exit with PoCL).
atexit.register(free_workspaces)
