"""Workspace buffers, reused between calls: one per command queue.

Commands on one in-order queue run in order, so every pass enqueued on a queue
can reuse that queue's buffer; a lock keeps two threads sharing a queue from
interleaving their passes. The buffer grows to the largest request and is kept
for the last few queues used (``free_workspaces`` drops them all).
"""
import atexit
import threading
from collections import OrderedDict

import pyopencl as cl

from .programs import ClconvError

MAX_QUEUES = 8
_lock = threading.Lock()
_entries = OrderedDict()   # queue.int_ptr -> [queue, buffer or None, its size in bytes, lock]


class workspace:
    """``with workspace(queue, nbytes, what) as ws``: hold this queue's workspace buffer (at
    least ``nbytes``; its size in bytes is ``.size`` meanwhile) while enqueuing a pass. A pass
    with no workspace gets None and holds nothing. (A class, not a generator: every call of
    every pass enters one.)"""

    def __init__(self, queue, nbytes, what=""):
        self.queue, self.nbytes, self.what, self.entry, self.size = queue, nbytes, what, None, 0

    def __enter__(self):
        if not self.nbytes:
            return None
        queue, key = self.queue, self.queue.int_ptr
        with _lock:
            entry = _entries.get(key)
            if entry is None:
                entry = _entries[key] = [queue, None, 0, threading.Lock()]   # keeps the queue alive
            _entries.move_to_end(key)
            while len(_entries) > MAX_QUEUES:
                _entries.popitem(last=False)
        entry[3].acquire()
        self.entry = entry
        if entry[2] < self.nbytes:
            entry[1], entry[2] = None, 0
            try:
                entry[1] = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, self.nbytes)
            except cl.Error as exc:
                entry[3].release()
                self.entry = None
                raise ClconvError(f"clconv: {self.what}: allocating {self.nbytes} bytes of workspace failed: "
                                  f"{exc}") from exc
            entry[2] = self.nbytes
        self.size = entry[2]
        return entry[1]

    def __exit__(self, *exc):
        if self.entry is not None:
            self.entry[3].release()
            self.entry = None


def free_workspaces():
    """Release every cached workspace buffer (they are re-allocated on demand)."""
    with _lock:
        for queue, *_ in _entries.values():
            queue.finish()
        _entries.clear()


# Release the buffers while the OpenCL runtime is still up: left to interpreter
# teardown, they can outlive it (seen as a crash at exit with PoCL).
atexit.register(free_workspaces)
