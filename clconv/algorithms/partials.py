"""Host side of kernels/partials.cl: split-K, partial sums over slices of a long inner
dimension, then their ordered (deterministic) sum.

Grad-weight GEMMs have a small result (filters x taps) and a long inner dimension
(positions): partial sums over slices of the positions give more work-groups and shorter
float32 sums. im2col, 1x1 (one slice per image) and Winograd cut them; direct's grad-weight
kernels write theirs alike.
"""
import numpy as np
import pyopencl as cl

from .. import rules
from ..device import scalar_work_items
from ..programs import get_kernel, launch, reduction_work_group, work_group_limit



def max_slices(outputs, positions, min_slice=rules.PARTIALS_MIN_SLICE, most=rules.PARTIALS_MAX_SLICES, target=rules.PARTIALS_TARGET):
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




def _four_wide(device, itemsize, n):
    """Whether ``device`` sums ``n`` values of ``itemsize`` bytes four per work-item: its buffers
    start aligned to such a vector, and it keeps work-items scalar (CPUs), or it is a GPU and n / 4
    work-items make a work-group for each compute unit."""
    if device.mem_base_addr_align < 8 * 4 * itemsize:
        return False
    if device.type & cl.device_type.GPU:
        return n // 4 >= _local_size(device) * device.max_compute_units
    return scalar_work_items(device)


def _local_size(device):
    """The sums' work-group: rules.PARTIALS_GPU_LOCAL on GPUs (or the largest power of two below it the device
    allows), 64 elsewhere; launches take at most what the kernel allows (sum_partials)."""
    return reduction_work_group(device, rules.PARTIALS_GPU_LOCAL) if device.type & cl.device_type.GPU else 64


def sum_partials(queue, dtype, idx, part, S, n, out, accumulate, what, stride=None, float_parts=False):
    """out (n,) (+)= the S partial sums of ``part``, ``stride`` elements apart (default n), in
    order; both are Refs of ``dtype`` storage, or with ``float_parts`` (``dtype`` float16) the
    partial sums float32 (a GEMM's of float16 operands read as they are, or direct's grad-weight
    partials) and the result float16.
    Four values per work-item (the same sums, so the same bits) where the storage is float32 or
    float64, n, the stride and both offsets are multiples of 4 (buffers aligned to vectors), on
    the devices above."""
    stride, dtype, device = stride or n, np.dtype(dtype), queue.device
    assert not float_parts or dtype == np.float16, "float partial sums are summed into float16 results"
    v = 4 if (dtype in (np.float32, np.float64) and not (n % 4 or stride % 4 or part.off % 4 or out.off % 4)
              and _four_wide(device, dtype.itemsize, n)) else 1
    knl = get_kernel(queue.context, "partials.cl", "sum_partials4" if v == 4 else "sum_partials", dtype, IDX=idx,
                     **({"PART_REAL": 1} if float_parts else {}))
    launch(queue, knl, (n // v,), (min(_local_size(device), work_group_limit(knl, device)),), part.buf, part.off // v,
           S, n // v, stride // v, out.buf, out.off // v, int(accumulate), what=what)
