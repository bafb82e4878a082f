"""float16 storage: arrays kept as half, algorithms run in float32 on float copies (except the
passes an algorithm runs on the arrays as they are: its ``half_passes``).

Host side of kernels/storage.cl. The copies live in the pass's workspace after
the algorithm's own (:func:`on_float_copies`); :func:`accumulate` and :func:`zero`
serve every dtype.
"""
import numpy as np
import pyopencl as cl

from .buffers import Ref, idx_for, ref
from .programs import ClconvError, get_kernel, launch
from .recording import current_graph

HALF = np.dtype(np.float16)


def compute_dtype(dtype):
    """The dtype the algorithms run in for arrays of ``dtype``: float32 for float16."""
    return np.dtype(np.float32) if np.dtype(dtype) == HALF else np.dtype(dtype)


def _launch(queue, name, dtype, dst, src, n, what):
    knl = get_kernel(queue.context, "storage.cl", name, dtype, IDX=idx_for(np.float16, dst, src))
    launch(queue, knl, (n,), (64,), src.buf, src.off, dst.buf, dst.off, n, what=what)


def to_real(queue, dtype, src, dst, n, what=""):
    """dst (float, Ref) = src (``dtype`` storage, Ref), n elements."""
    _launch(queue, "to_real", dtype, dst, src, n, what)


def to_store(queue, dtype, src, dst, n, what=""):
    """dst (``dtype`` storage, Ref) = src (float, Ref) rounded to nearest even, n elements."""
    _launch(queue, "to_store", dtype, dst, src, n, what)


def on_float_copies(queue, dtype, refs, sizes, ws, at, run, what=""):
    """``run(*copies)`` on float32 copies of the pass's arrays ``refs`` (Refs of ``dtype``
    storage, the result last, None for no bias; ``sizes`` their element counts), placed in the
    workspace ``ws`` from element ``at`` on; then the result rounded back into the last array."""
    copies = []
    for r, n in zip(refs, sizes):
        copies.append(None if r is None else Ref(ws, at))
        at += 0 if r is None else n
    for r, c, n in zip(refs[:-1], copies, sizes):
        if r is not None:
            to_real(queue, dtype, r, c, n, what)
    run(*copies)
    to_store(queue, dtype, copies[-1], refs[-1], sizes[-1], what)


def accumulate(queue, dst, src):
    """dst += src for two device arrays of one shape and dtype, added in float for float16."""
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"cannot add {src.dtype} {list(src.shape)} into {dst.dtype} {list(dst.shape)}")
    n = dst.size
    if n:
        d, s = ref(dst), ref(src)
        knl = get_kernel(queue.context, "storage.cl", "accumulate", dst.dtype, IDX=idx_for(dst.dtype, d, s))
        launch(queue, knl, (n,), (64,), d.buf, d.off, s.buf, s.off, n, what="gradient accumulation")


def zero(queue, array):
    """Set a device array to 0 (all bits clear), whatever its dtype."""
    if array.nbytes:
        try:
            cl.enqueue_fill_buffer(queue, array.base_data, np.zeros(1, np.uint8), array.offset, array.nbytes)
        except cl.Error as exc:
            raise ClconvError(f"clconv: zeroing {array.nbytes} bytes failed: {exc}") from exc
        graph = current_graph()
        if graph is not None:
            graph.add_fill(queue, array.base_data, array.offset, array.nbytes)
