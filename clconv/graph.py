"""Recording a sequence of clconv calls once and replaying it: a batch-1 network's convolutions
for the host time of their launches alone.

    with clconv.graph() as g:            # the calls run as usual, and their launches are kept
        y = clconv.conv2d(x, w1, b1, padding=1)
        z = clconv.conv2d(y, w2, padding=1, relu=True)
    x.set(next_image)                      # new data, in place: same arrays, same buffers
    g.replay()                             # y and z again, from the new x

A call's own host work (finding its plan, checking its arrays, a new result) is most of a small
layer's time (see README, "Host time per call"); a replay enqueues the recorded kernels again,
in order, on the queues they ran on, with the same arguments and buffers, and does nothing else.
The arrays the calls read and wrote, results and workspaces included, are the replay's: update
inputs in place and read results where the calls put them. The graph keeps every buffer its
launches use alive, so no workspace returns to a memory pool while the graph lives.

Only clconv's own kernels are recorded, and a call whose work cannot be replayed that way is
refused: NumPy arrays (their device copies are temporary) with a ``TypeError`` before anything
is enqueued; CLBlast GEMMs, per-group queues, passes spread over several devices, arrays of
another queue, MPI reductions and a module's load_numpy (markers, barriers, copies and
collectives a replay would miss) with a ``ClconvError`` when the block ends, and by
:meth:`Graph.replay`; so is a graph whose block raised. A graph replayed inside another's block
becomes part of it. Other work enqueued inside the block (pyopencl operations, copies) is not
part of the graph.
"""
from contextlib import contextmanager

import numpy as np
import pyopencl as cl

from . import programs, recording
from .programs import ClconvError


class Graph:
    """The launches of the clconv calls made in a :func:`graph` block, replayed by :meth:`replay`.
    ``names``: what each step enqueues (kernel names, "fill" for a zeroed array)."""

    def __init__(self):
        self._steps = []      # (queue, kernel or None for a fill, global, local, slots or fill arguments, what)
        self._kept = []       # every buffer and program a step uses: alive while the graph is
        self._refused = []    # what the block enqueued that a replay would miss
        self.names = []

    def __len__(self):
        return len(self._steps)

    def add_launch(self, queue, kernel, global_size, local_size, args, what):
        """A launch of a cached kernel with ``args``: replayed on a private copy with them set."""
        self._steps.append((queue, programs.bound_kernel(kernel, args, what), global_size, local_size, (), what))
        self._kept.append([kernel.clconv_program, *(a for a in args if isinstance(a, cl.MemoryObjectHolder))])
        self.names.append(kernel.function_name)

    def add_relaunch(self, queue, kernel, global_size, local_size, slots, bufs, what):
        """A launch of a plan's bound kernel (:func:`clconv.programs.relaunch`), whose buffer
        arguments the plan's next call may change: set again before each replay."""
        slots = tuple((pos, bufs[i]) for pos, i in slots)
        self._steps.append((queue, kernel, global_size, local_size, slots, what))
        self._kept.append([kernel.clconv_program, *(buf for _, buf in slots)])
        self.names.append(kernel.function_name)

    def add_fill(self, queue, buf, offset, nbytes):
        """``nbytes`` zero bytes at ``offset`` of ``buf`` (clconv.storage.zero)."""
        self._steps.append((queue, None, None, None, (buf, offset, nbytes), "zeroing"))
        self._kept.append([buf])
        self.names.append("fill")

    def refuse(self, what):
        """Mark the graph unreplayable: the block enqueued ``what``, which a replay would miss."""
        self._refused.append(what)

    def _check(self):
        if self._refused:
            raise ClconvError("clconv.graph: this graph cannot be replayed: its block had "
                              + ", ".join(sorted(set(self._refused))) + ", which a replay would miss (a graph "
                              "replays clconv's own kernels on single queues of one device: gemm='clconv', "
                              "'cpu' or 'gpu', queues='single', arrays of the queue the calls run on)")

    def replay(self):
        """Enqueue the recorded launches again, in order, on the queues they ran on; returns the
        last one's event (None for an empty graph). Replayed inside another graph's block, its
        steps become that graph's too."""
        self._check()
        event = None
        try:
            with programs.launch_lock():
                for queue, kernel, global_size, local_size, slots, what in self._steps:
                    if kernel is None:
                        buf, offset, nbytes = slots
                        event = cl.enqueue_fill_buffer(queue, buf, _ZERO, offset, nbytes)
                        continue
                    for pos, buf in slots:
                        kernel.set_arg(pos, buf)
                    event = cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size)
        except cl.Error as exc:
            raise ClconvError(f"clconv.graph: replaying {what} ({'fill' if kernel is None else kernel.function_name}) "
                              f"failed: {exc}") from exc
        outer = recording.current_graph()
        if outer is not None:
            outer._steps += list(self._steps)
            outer._kept.append(self._kept)
            outer.names += list(self.names)
        return event


_ZERO = np.zeros(1, np.uint8)


@contextmanager
def graph():
    """A :class:`Graph` of the clconv calls this thread makes in the block (they run as usual)."""
    g = Graph()
    with recording.recording_graph(g):
        try:
            yield g
        except BaseException:   # what the block had recorded is not what it meant to
            g.refuse("an exception")
            raise
    g._check()
