"""clconv's own GEMM kernel (kernels/gemm.cl), and when it runs instead of CLBlast's.

CLBlast's tiled GEMM first copies operands whose sizes are not multiples of its tiles into
padded buffers, one launch each, and its batched call covers one batch stride; its kernel is
the faster one on large square products. Ours reads the operands in place, edges guarded,
and runs a whole (groups x images) grid of GEMMs in one launch. On an H200 (one run, float32):
  batched pointwise shapes (M, N, K = 512, 784, 256 x 64)   0.59 ms, CLBlast 0.88
  Winograd 5x5 forward (128, 3136, 48 x 72)                  0.18 ms, CLBlast 0.42
  Winograd 3x3 grad-weight (192, 192, 1024 x 576)            1.87 ms, CLBlast 2.60
  one 4096^3 product                                         5.07 ms, CLBlast 4.45
so GPUs use ours unless all of M, N and K are large, or the grid of tiles is too small to keep
the device busy while the work is large. The 7x7 stem's split-K grad-weight (0.24 GFLOP, 147
work-groups of 64 on 132 compute units) takes 0.057 ms of device time on ours, 0.026 on CLBlast's,
but a CLBlast call costs about 30 us more on the host, and per call, interleaved on one H200
machine, ours ran it in 0.078 ms against 0.096-0.136. CPUs (PoCL) keep CLBlast, whose kernels
suit them better. ``CLCONV_GEMM=clblast`` or ``=clconv`` forces one.
"""
import functools
import os

import numpy as np
import pyopencl as cl
from pyopencl.tools import context_dependent_memoize

from .programs import ClconvError, get_kernel, index_type, launch

LARGE = 1024             # CLBlast when M, N and K are all at least this,
MIN_ITEMS_PER_CU = 128   # or when our grid has fewer work-items per compute unit
SMALL_WORK = 1 << 29     # and the GEMMs more floating-point operations than this
# (rows, columns) of C per work-group, and their relative speed on a 4096^3 SGEMM
# (H200: 27.1, 25.1, 22.7 TFLOP/s): bigger tiles reuse more but leave more edge waste
TILES = (((128, 128), 1.0), ((128, 64), 0.93), ((64, 64), 0.84))
TK = 8                   # depth of the kernel's slices (kernels/gemm.cl)
PAD = 4                  # its local-memory row padding
ENGINES = ("auto", "clconv", "clblast")


def engine():
    """The GEMM engine asked for by ``CLCONV_GEMM`` ("auto" when unset or empty)."""
    name = os.environ.get("CLCONV_GEMM", "").strip().lower() or "auto"
    if name not in ENGINES:
        raise ValueError(f"CLCONV_GEMM must be one of {ENGINES}, not {os.environ['CLCONV_GEMM']!r}")
    return name


def use_own(device, m, n, k, count, itemsize=4):
    """Whether ``count`` GEMMs of this size run on clconv's kernel (else CLBlast's)."""
    name = engine()
    return name == "clconv" if name != "auto" else _own_pays(device, m, n, k, count, itemsize)


@functools.lru_cache(maxsize=4096)
def _own_pays(device, m, n, k, count, itemsize):
    """The "auto" rule of :func:`use_own` (asked on every GEMM call: cached)."""
    gpu, compute_units, _, _, _ = _facts(device)
    chosen = tile(device, m, n, count, itemsize) if gpu and min(m, n, k) < LARGE else None
    if chosen is None:
        return False
    tm, tn = chosen
    items = -(-m // tm) * -(-n // tn) * count * (tm * tn // 64)
    return items >= MIN_ITEMS_PER_CU * compute_units or 2 * m * n * k * count <= SMALL_WORK


@functools.lru_cache(maxsize=None)
def _facts(device):
    """(is a GPU, compute units, largest work-group, its largest sides, local memory bytes) of
    ``device``, asked once (each is a driver call)."""
    return (bool(device.type & cl.device_type.GPU), device.max_compute_units, device.max_work_group_size,
            tuple(device.max_work_item_sizes), device.local_mem_size)


def fits(device, tm, tn, itemsize=4):
    """Whether the device can run a TM x TN tile: its work-group and local memory."""
    _, _, max_group, max_sides, local = _facts(device)
    return (tm * tn // 64 <= max_group and tn // 8 <= max_sides[0] and tm // 8 <= max_sides[1]
            and 2 * TK * (tm + tn + 2 * PAD) * itemsize <= local)


@functools.lru_cache(maxsize=4096)
def tile(device, m, n, count, itemsize=4):
    """The work-group tile (TM, TN) for ``count`` M x N products: least time in a simple model,
    work-groups x tile area / speed, with at least one work-group per compute unit; None when
    no tile fits the device."""
    compute_units = _facts(device)[1]

    def cost(option):
        (tm, tn), speed = option
        groups = -(-m // tm) * -(-n // tn) * count
        return max(groups, compute_units) * tm * tn / speed
    fitting = [t for t in TILES if fits(device, *t[0], itemsize)]
    return min(fitting, key=cost)[0] if fitting else None


@context_dependent_memoize
def _kernel(context, dtype, tm, tn, a_transp, b_transp, idx):
    """The GEMM kernel for a TM x TN tile (looked up on every call: positional and memoised)."""
    return get_kernel(context, "gemm.cl", "gemm", dtype, TM=tm, TN=tn, TK=TK, PAD=PAD, A_TRANSP=int(a_transp),
                      B_TRANSP=int(b_transp), IDX=idx)


def grid_gemm(queue, dtype, gi, gj, m, n, k, a, b, c, offsets, si, sj, lds, *, alpha=1.0, beta=0.0,
              a_transp=False, b_transp=False, what=""):
    """C[i, j] = alpha * op(A[i, j]) @ op(B[i, j]) + beta * C[i, j] for i < gi, j < gj, in one launch.

    Matrix (i, j) of an operand starts at element ``offset + i * si + j * sj`` of its buffer;
    ``offsets``, ``si``, ``sj`` and ``lds`` are (A, B, C) triples. C matrices must not overlap.
    """
    assert (gi == 1 or si[2]) and (gj == 1 or sj[2]), "GEMMs into one C would race"
    itemsize = np.dtype(dtype).itemsize
    chosen = tile(queue.device, m, n, gi * gj, itemsize)
    if chosen is None:
        raise ClconvError(f"clconv: {what}: no tile of clconv's GEMM kernel fits {queue.device.name.strip()} "
                          f"(work-group and local-memory limits); unset CLCONV_GEMM=clconv to use CLBlast's")
    tm, tn = chosen
    shapes = ((k, m) if a_transp else (m, k), (n, k) if b_transp else (k, n), (m, n))   # as stored, row-major
    idx = index_type(*(off + (gi - 1) * i + (gj - 1) * j + (rows - 1) * ld + cols
                       for off, i, j, (rows, cols), ld in zip(offsets, si, sj, shapes, lds)))
    kernel = _kernel(queue.context, np.dtype(dtype), tm, tn, bool(a_transp), bool(b_transp), idx)
    groups = -(-m // tm) * -(-n // tn) * gi * gj
    return launch(queue, kernel, (groups * tn // 8, tm // 8), (tn // 8, tm // 8), m, n, k, alpha, beta, gj,
                  a, offsets[0], lds[0], si[0], sj[0], b, offsets[1], lds[1], si[1], sj[1],
                  c, offsets[2], lds[2], si[2], sj[2], what=what)
