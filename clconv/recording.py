"""Recording launches: the three ways this thread's launches are kept, in one place.

  profiling        :func:`profiling`: (name, event) of every kernel and GEMM enqueued (the
                   tuner, ``bench.profile``)
  capture          :func:`capturing`: a pass's launches, for a plan's replay (:mod:`clconv.replay`)
  clconv.graph()   :func:`recording_graph`: the launches of a :func:`clconv.graph.graph` block

:func:`clconv.programs.launch` and :func:`clconv.programs.relaunch` read one thread-local
flag (``state.active``) per launch and call :func:`launched` or :func:`relaunched` only when
one of the three is on. What is enqueued some other way (a CLBlast GEMM, markers, barriers,
copies) reports itself through :func:`record` and :func:`not_capturable`.
"""
import threading
from contextlib import contextmanager


class _State(threading.local):
    """What this thread records into; class defaults, so that a read costs no AttributeError."""
    active = False   # any of the three below: the one flag read on every launch
    events = None    # profiling: the list of (name, event)
    capture = None   # the Capture in progress
    graph = None     # the clconv.graph.Graph being recorded

    def update(self):
        self.active = self.events is not None or self.capture is not None or self.graph is not None


state = _State()


def launched(queue, kernel, global_size, local_size, args, what, event):
    """A launch of a cached kernel with ``args`` (their structs packed), enqueued as ``event``."""
    if state.events is not None:   # the name is a driver query: only when profiling
        state.events.append((kernel.function_name, event))
    capture = state.capture
    if capture is not None:
        capture.launches.append((kernel, global_size, local_size, args, what))
        capture.names.append(kernel.function_name)
    if state.graph is not None:
        state.graph.add_launch(queue, kernel, global_size, local_size, args, what)


def relaunched(queue, launches, bufs, events):
    """:func:`clconv.programs.relaunch`'s bound ``launches``, their buffer slots set from
    ``bufs``, enqueued as ``events``."""
    if state.events is not None:
        state.events += [(kernel.function_name, e) for (kernel, *_), e in zip(launches, events)]
    if state.capture is not None:   # a capture in progress would not see these
        for kernel, *_ in launches:
            not_capturable(kernel.function_name)
    graph = state.graph
    if graph is not None:
        for kernel, global_size, local_size, slots, what in launches:
            graph.add_relaunch(queue, kernel, global_size, local_size, slots, bufs, what)


# profiling

@contextmanager
def profiling():
    """Collect ``(name, event)`` for every kernel and GEMM this thread enqueues."""
    state.events = events = []
    state.update()
    try:
        yield events
    finally:
        state.events = None
        state.update()


def record(name, event):
    """``event`` of something enqueued besides a kernel launch (a CLBlast GEMM), when profiling."""
    events = state.events
    if events is not None:
        events.append((name, event))


# capture, for a plan's replay

class Capture:
    """The launches one thread made while capturing, as ``(kernel, global size, local size,
    args, what)``; ``complete`` is False when it also enqueued something else (a CLBlast GEMM,
    markers), which a replay of the launches would miss. ``names``: what each enqueued command
    was, in order (kernel names, "clblast_gemm", ...): the pass's launches as
    :meth:`clconv.Plan.explain` counts them."""

    def __init__(self):
        self.launches, self.names, self.complete = [], [], True


@contextmanager
def capturing():
    """A :class:`Capture` of this thread's launches while in the block (see :mod:`clconv.replay`)."""
    outer = state.capture
    state.capture = capture = Capture()
    state.update()
    try:
        yield capture
    finally:
        state.capture = outer
        state.update()
        if outer is not None:   # the outer capture did not see these launches
            outer.complete = False
            outer.names += capture.names


def not_capturable(name=None, times=1, what=None):
    """Mark the capture in progress (if any) incomplete, and the graph being recorded (if any)
    unreplayable: this thread enqueues something a replay of the captured launches would miss:
    ``times`` launches of ``name`` (a CLBlast GEMM), or with no name, markers, barriers or
    copies; ``what`` it is, as the graph's refusal names it."""
    capture = state.capture
    if capture is not None:
        capture.complete = False
        capture.names += [name] * times if name else []
    graph = state.graph
    if graph is not None:
        graph.refuse(what or name or "markers and barriers")


# clconv.graph()

def current_graph():
    """The :class:`clconv.graph.Graph` this thread is recording into, or None."""
    return state.graph


@contextmanager
def recording_graph(graph):
    """Keep this thread's launches (and fills, and what a replay would miss) in ``graph`` while in
    the block (:func:`clconv.graph.graph`)."""
    if state.graph is not None:
        raise ValueError("clconv.graph() blocks do not nest: this thread is already recording one")
    state.graph = graph
    state.update()
    try:
        yield graph
    finally:
        state.graph = None
        state.update()


@contextmanager
def outside_graph():
    """This thread's launches in the block are not part of a graph it is recording: the work of
    planning a call (known-answer checks, autotuning) is not the call's. Also a decorator."""
    saved, state.graph = state.graph, None
    state.update()
    try:
        yield
    finally:
        state.graph = saved
        state.update()
