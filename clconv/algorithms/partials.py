"""Host side of kernels/partials.cl: split-K, partial sums over slices of a long inner
dimension, then their ordered (deterministic) sum.

Grad-weight GEMMs have a small result (filters x taps) and a long inner dimension
(positions): partial sums over slices of the positions give more work-groups and shorter
float32 sums. im2col, 1x1 (one slice per image) and Winograd cut them; direct sums its own
partials in direct.cl.
"""
from ..programs import get_kernel, launch

SPLIT_K_TARGET = 1 << 24   # aim for about this many partial-sum elements
MIN_SLICE = 256            # shortest slice (GEMM K) worth a separate partial
MAX_SLICES = 64


def max_slices(outputs, positions, min_slice=MIN_SLICE, most=MAX_SLICES, target=SPLIT_K_TARGET):
    """The most split-K slices worth cutting for ``outputs`` results summed over ``positions``,
    about ``target`` partial-sum elements at most."""
    return max(1, min(most, -(-target // outputs), positions // min_slice))


def partials_size(slices, outputs):
    """Elements of ``slices`` partial results of ``outputs`` each (none without a split)."""
    return slices * outputs if slices > 1 else 0


def fit_slices(k, slices, most):
    """``slices`` of a K of ``k`` (a split-K rule's choice) cut to at most ``most`` (what the
    workspace holds) and to a divisor of ``k``, so every slice is one product of the grid."""
    return largest_divisor_at_most(k, max(1, min(slices, most)))


def largest_divisor_at_most(n, limit):
    """Slices of ``n`` positions: the most, up to ``limit``, that divide them exactly."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def sum_partials(queue, dtype, idx, part, S, n, out, accumulate, what, stride=None):
    """out (n,) (+)= the S partial sums of ``part``, ``stride`` elements apart (default n), in
    order; both are Refs."""
    knl = get_kernel(queue.context, "partials.cl", "sum_partials", dtype, IDX=idx)
    launch(queue, knl, (n,), (64,), part.buf, part.off, S, n, stride or n, out.buf, out.off, int(accumulate),
           what=what)
