"""What the algorithms share: buffer references, index-type choice, split-K sizes, batched
GEMMs over (position, group) grids."""
from collections import namedtuple

import numpy as np

from ..gemm import grid_gemm
from ..programs import get_kernel, index_type, launch

Ref = namedtuple("Ref", "buf off end", defaults=(None,))
Ref.__doc__ = ("A raw OpenCL buffer, an element offset into it and, where known, the element just past "
               "the data the kernels may touch (else the buffer's end).")


def ref(array):
    """The (buffer, element offset, end) of a contiguous pyopencl Array."""
    off = array.offset // array.dtype.itemsize
    return Ref(array.base_data, off, off + array.size)


def idx_for(dtype, *refs):
    """Kernel index type able to address every element the references reach."""
    itemsize = np.dtype(dtype).itemsize
    return index_type(*(r.buf.size // itemsize if r.end is None else r.end for r in refs if r is not None))


# Split-K for grad-weight GEMMs, whose result (filters x taps) is small and whose inner
# dimension (positions) long: partial sums over slices of the positions, then an ordered
# sum (sum_partials in kernels/im2col.cl). More work-groups, and shorter float32 sums.
SPLIT_K_TARGET = 1 << 24   # aim for about this many partial-sum elements
MIN_SLICE = 256            # shortest slice (GEMM K) worth a separate partial
MAX_SLICES = 64


def max_slices(outputs, positions, min_slice=MIN_SLICE, most=MAX_SLICES):
    """The most split-K slices worth cutting for ``outputs`` results summed over ``positions``."""
    return max(1, min(most, -(-SPLIT_K_TARGET // outputs), positions // min_slice))


def largest_divisor_at_most(n, limit):
    """Slices of ``n`` positions: the most, up to ``limit``, that divide them exactly."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def sum_partials(queue, dtype, idx, part, S, n, out, accumulate, what):
    """out (n,) (+)= the S partial sums part (S, n), in order (kernels/im2col.cl); both are Refs."""
    knl = get_kernel(queue.context, "im2col.cl", "sum_partials", dtype, IDX=idx)
    launch(queue, knl, (n,), (64,), part.buf, part.off, S, n, out.buf, out.off, int(accumulate), what=what)


def position_gemm(queue, engine, dtype, per_group, G, count, m, n, k, a, b, c, **kw):
    """The ``count`` x G GEMMs of a transform algorithm (Winograd's tile positions, FFT's
    frequencies) on :class:`clconv.gemm.Operand` s in the workspace, whose ``per_group`` is
    the step from one group to the next and ``per_image`` from one position to the next, G
    groups later: without per-group queues (position, group) is one evenly strided batch."""
    if per_group and G > 1:
        grid_gemm(queue, engine, dtype, G, count, m, n, k, a, b, c, per_group=True, **kw)
    else:
        flat = (x._replace(per_group=0, per_image=x.per_group) for x in (a, b, c))
        grid_gemm(queue, engine, dtype, 1, count * G, m, n, k, *flat, **kw)
