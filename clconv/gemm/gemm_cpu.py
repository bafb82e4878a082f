"""Host side of kernels/gemm_cpu.cl: clconv's GEMM for CPU devices.

Each work-item owns a register block of C (6 rows by 2 vectors of the device's native width,
at most 512 bits, narrower for products narrower than that block, or 4 x 3 dot products when both
operands are stored along k, 4 x 6 on 512-bit CPUs: each fills the vector registers) and loops
over K with multiply-adds; no local memory, no barriers, single-work-item work-groups (see the
kernel). A work-item takes several row blocks of one column block when there are many, so each
work-group has enough work to hide the runtime's cost per work-group, and runs K in slices whose
part of B fits half a first-level cache. For long products over long rows of B, B is first packed
in panels of a block's columns (pack_b_panels), which the blocks then read in order (see
rules.PANEL_MIN_ROWS).
"""
from typing import NamedTuple

import numpy as np

from .. import rules
from ..device import cpu_vector_width
from ..programs import get_kernel, index_type, launch
from .operands import PLAIN

SLICE_BYTES = 16 << 10   # a K slice of B's columns for one block: half a 32 KiB first-level cache
PACK_ROWS = 8            # rows of B per work-item of pack_b_panels


class Tile(NamedTuple):
    """A work-item's block: ``inner`` (dot products) or outer products; ``mr`` rows; ``cols``
    columns as ``nv`` vectors of ``vw`` (outer) or ``cols`` dot products (inner); ``tm`` row
    blocks per work-item; ``kc`` the depth of the K slices."""
    inner: bool
    vw: int
    mr: int
    nv: int
    cols: int
    tm: int
    kc: int




def vector_width(device, itemsize):
    """Values per vector of the GEMM kernel: the device's native width for the dtype, up to
    rules.CPU_GEMM_MAX_VECTOR_BITS."""
    return cpu_vector_width(device, itemsize, rules.CPU_GEMM_MAX_VECTOR_BITS)


def tile(device, m, n, k, count, itemsize, b_transp, k_blocks=1):
    """The register block and row blocks per work-item for ``count`` M x N x K products, each
    over ``k_blocks`` blocks of K."""
    vw = vector_width(device, itemsize)
    if b_transp:   # dot products: 4 x 3 vector sums and 3 vectors of B fill 16 registers with A's
        # (4 x 4 spills); 4 x 6 fill 32
        inner, mr, nv = True, 4, 1
        cols = rules.CPU_GEMM_WIDE_INNER_COLS if vw * itemsize >= 64 else 3
    else:          # outer products: 2 vectors of columns, rows to fill the registers (6 x 2 of 16)
        inner, nv = False, 2
        while n < nv * vw and vw > 4:   # (the kernel's vectors: 4, 8 or 16 values)
            vw //= 2
        mr, cols = rules.CPU_GEMM_REGISTERS // 2 - 2, nv * vw
    blocks = -(-m // mr)
    per_block = mr * cols * k * k_blocks
    columns = -(-n // cols) * count
    least = rules.CPU_GEMM_GROUPS_PER_UNIT * device.max_compute_units
    tm = max(1, min(blocks, -(-rules.CPU_GEMM_WORK_PER_ITEM // max(per_block, 1)), blocks * columns // least or 1))
    kc = max(vw, SLICE_BYTES // (cols * itemsize * k_blocks) // vw * vw)   # (a slice spans every block)
    return Tile(inner, vw, mr, nv, cols, tm, kc)




def panels_wanted(m, k, b_transp=False):
    """Whether the rules above pack B for op(A) of ``m`` rows over a depth of ``k`` (each block's
    where B^T; where B is stored K x N, when B's rows are long enough: :func:`panels_size`)."""
    if b_transp:
        return k < rules.BT_PANEL_MAX_DEPTH and m >= rules.BT_PANEL_MIN_ROWS * (2 if 2 * k >= rules.BT_PANEL_MAX_DEPTH else 1)
    return m >= rules.PANEL_MIN_ROWS and k >= rules.PANEL_MIN_DEPTH


def panels_size(device, m, n, k, count, itemsize, k_blocks=1, b_transp=False):
    """Elements :func:`grid_gemm` needs for ``b_panels``: ``count`` distinct B matrices (stored K x N,
    or N x K where ``b_transp``, over ``k_blocks`` blocks of K) in panels; 0 where the rules above
    pack none."""
    if b_transp:
        if not panels_wanted(m, k, True):
            return 0
    elif not panels_wanted(m, k * k_blocks) or n * itemsize < rules.PANEL_MIN_ROW_BYTES:
        return 0
    cols = tile(device, m, n, k, count, itemsize, False, k_blocks).cols
    return count * -(-n // cols) * cols * k * k_blocks


def packed_size(gi, gj, m, k, a):
    """Elements :func:`grid_gemm` needs for ``a_packed`` (A^T packed) with operand ``a``: one
    M x K copy per distinct matrix of A (a weight shared by the images is packed once)."""
    return (gi if a.per_group else 1) * (gj if a.per_image else 1) * m * k


def grid_gemm(queue, dtype, grid, a, b, c, epilogue=PLAIN, *, what=""):
    """C[i, j] = alpha * op(A[i, j]) @ op(B[i, j]) + beta * C[i, j] for i < gi, j < gj of ``grid``
    (a :class:`clconv.gemm.Grid`), in one launch; ``a``, ``b``, ``c``: :class:`clconv.gemm.Operand` s
    (matrix (i, j) at ``at(i, j)``), C matrices must not overlap; alpha and beta: ``epilogue``'s.
    op(A) = A^T with op(B) = B^T runs as C^T = op(B)^T op(A)^T, stored transposed. ``c.transp``:
    C is stored transposed (element (r, s) of C[i, j] at ``c.at(i, j) + s * c.ld + r``), for
    op(A) = A^T read in place and B untransposed, neither packed, one K block. With op(A) = A^T
    alone and ``a.pack`` (an Operand of :func:`packed_size` elements in the caller's workspace),
    A^T is packed there first (pack_a_transposed, one launch more) and the GEMM reads the copy.
    With ``b.pack`` (an Operand of :func:`panels_size` elements in the caller's workspace), B is
    packed there in panels first (pack_b_panels, or for op(B) = B^T alone pack_bt_panels; one
    launch more). ``grid.blocks`` (not continuous): op(A[i, j]) @ op(B[i, j]) is the sum over
    that many blocks of K, each M x K by K x N, the operands' ``k_step`` apart."""
    gi, gj, m, n, k = grid.gi, grid.gj, grid.m, grid.n, grid.k
    alpha, beta = epilogue
    a_transp, b_transp, c_transp, a_packed, b_panels = a.transp, b.transp, c.transp, a.pack, b.pack
    kblocks, steps = grid.blocks, (a.k_step, b.k_step)
    assert (gi == 1 or c.per_group) and (gj == 1 or c.per_image), "GEMMs into one C would race"
    assert not grid.continuous and (kblocks == 1 or a_packed is None), "K blocks are read block by block, unpacked"
    assert not c_transp or (a_transp and not b_transp and a_packed is None and b_panels is None
                            and kblocks == 1), "C stored transposed: A^T read in place, B untransposed, unpacked"
    if a_transp and not b_transp and a_packed is not None:
        a = _pack(queue, dtype, gi, gj, m, k, a, a_packed, what)
        a_transp = False
    panels = b_panels is not None
    assert not (panels and a_transp and b_transp), "B in panels: op(A) = A^T with op(B) = B^T runs transposed, unpacked"
    if a_transp and b_transp:   # C^T (N x M) = B (stored N x K) @ A (stored K x M): both untransposed
        m, n, a, b, a_transp, b_transp, steps, c_transp = n, m, b, a, False, False, steps[::-1], True
    itemsize = np.dtype(dtype).itemsize
    # B^T in panels runs as outer products on them, not dot products
    t = tile(queue.device, m, n, k, gi * gj, itemsize, b_transp and not panels, kblocks)
    ops = (a, b, c)
    shapes = ((k, m) if a_transp else (m, k), (n, k) if b_transp else (k, n), (n, m) if c_transp else (m, n))
    size = -(-n // t.cols) * t.cols * k * kblocks   # of one matrix in panels
    idx = index_type(panels and b_panels.off + size * (gi if b.per_group else 1) * (gj if b.per_image else 1),
                     *(x.at(gi - 1, gj - 1) + (kblocks - 1) * step + (rows - 1) * x.ld + cols
                       for x, step, (rows, cols) in zip(ops, (*steps, 0), shapes)))
    defines = dict(IDX=idx, VW=t.vw, INNER=int(t.inner), MR=t.mr, NV=t.nv, NR=t.cols, KC=t.kc,
                   A_TRANSP=int(a_transp), C_TRANSP=int(c_transp))
    if panels:
        b = _pack_b(queue, dtype, gi, gj, n, k, kblocks, b, steps[1], b_panels, size, t.cols, defines, b_transp,
                    what)
        b_transp = False
        steps, ops = (steps[0], 0), (a, b, c)
    kernel = get_kernel(queue.context, "gemm_cpu.cl", "gemm_cpu", dtype, **defines)
    blocks = -(-m // t.mr)
    return launch(queue, kernel, (-(-blocks // t.tm), -(-n // t.cols), gi * gj), (1, 1, 1), m, n, k, alpha, beta, gj,
                  kblocks, *(v for x, step in zip(ops[:2], steps) for v in (x.buf, x.off, x.ld, x.per_group,
                                                                               x.per_image, step)),
                  c.buf, c.off, c.ld, c.per_group, c.per_image, int(panels), t.tm, what=what)


def _pack(queue, dtype, gi, gj, m, k, a, packed, what):
    """A^T (stored K x M) of each distinct matrix of ``a`` packed M x K at ``packed``: the
    Operand the GEMM then reads."""
    gi_a, gj_a = (gi if a.per_group else 1), (gj if a.per_image else 1)
    out = type(a)(packed.buf, packed.off, k, m * k * gj_a if a.per_group else 0, m * k if a.per_image else 0)
    mr = rules.CPU_GEMM_REGISTERS // 2 - 2
    idx = index_type(a.at(gi_a - 1, gj_a - 1) + (k - 1) * a.ld + m, out.at(gi_a - 1, gj_a - 1) + m * k)
    kernel = get_kernel(queue.context, "gemm_cpu.cl", "pack_a_transposed", dtype, IDX=idx, MR=mr)
    launch(queue, kernel, (-(-m // mr), gi_a * gj_a), (1, 1), m, k, gj_a, a.buf, a.off, a.ld, a.per_group,
           a.per_image, out.buf, out.off, out.per_group, out.per_image, what=what + " (A^T packed)")
    return out


def _pack_b(queue, dtype, gi, gj, n, k, kb, b, b_kb, packed, size, cols, defines, transposed, what):
    """B (stored K x N, or N x K where ``transposed``; ``kb`` blocks of K ``b_kb`` apart) of each
    distinct matrix of ``b`` packed in panels of ``cols`` columns, ``size`` elements a matrix, at
    ``packed`` (pack_b_panels,
    pack_bt_panels): the Operand the GEMM then reads."""
    gi_b, gj_b = (gi if b.per_group else 1), (gj if b.per_image else 1)
    out = type(b)(packed.buf, packed.off, 0, size * gj_b if b.per_group else 0, size if b.per_image else 0)
    args = (n, k, gj_b, kb, PACK_ROWS, b.buf, b.off, b.ld, b.per_group, b.per_image, b_kb, out.buf, out.off,
            out.per_group, out.per_image)
    rows = -(-(kb * k) // PACK_ROWS)
    if transposed:
        kernel = get_kernel(queue.context, "gemm_cpu.cl", "pack_bt_panels", dtype, **defines)
        launch(queue, kernel, (rows, -(-n // cols), gi_b * gj_b), (1, 1, 1),
               *args, what=what + " (B^T in panels)")
    else:
        kernel = get_kernel(queue.context, "gemm_cpu.cl", "pack_b_panels", dtype, **defines)
        launch(queue, kernel, (rows, gi_b * gj_b), (1, 1), *args, what=what + " (B in panels)")
    return out
