"""CLBlast's GEMM through pyclblast, on raw buffers with explicit element offsets.

pyclblast takes ``Array`` objects but only uses ``base_data`` and ignores
``Array.offset``; we wrap each raw buffer in a minimal 2-D ``Array`` and always
pass the element offsets ourselves. CLBlast takes no wait list: everything is
ordered by in-order queues (and markers/barriers between queues).
"""
import pyclblast
import pyopencl as cl
import pyopencl.array as cla

from ..programs import ClconvError
from ..recording import not_capturable, record
from .clblast_params import apply_tuned
from .operands import PLAIN


class _Operand(cla.Array):
    """A raw buffer as pyclblast wants it: it reads only ``dtype``, a 2-D ``shape`` and
    ``base_data``. A full ``Array`` per operand would cost far more host time per GEMM call."""

    def __init__(self, buf, dtype):  # the Array constructor is skipped on purpose
        self.base_data, self.dtype, self.shape = buf, dtype, (1, 1)


def _in_place(m, n, k, count, lds, offsets, strides, a_transp, b_transp, gemmk):
    """The operands ("A", "B", "C") whose offset or batch stride CLBlast's strided-batched GEMM
    may ignore.

    Its tiled (indirect) kernel reads an operand in place, with no padded copy, when its sizes
    happen to be multiples of the kernel's tiles and nothing needs transposing; it then
    assumes offset 0 and matrices packed back to back, whatever was passed (CLBlast 1.5.3 and
    its current source: the non-batched GEMM checks the offset, this one does not). Tile sizes
    are CLBlast's choice, so every operand that could be read in place and is not at offset 0
    with a packed stride counts. Row-major, the default kernel (GEMMK 0) reads only an
    untransposed B in place; GEMMK 1 kernels can also read A and write C in place.
    """
    # (first, second) dimension of each operand as CLBlast's row-major path stores it
    dims = {"A": (m, k) if a_transp else (k, m), "B": (k, n) if b_transp else (n, k), "C": (n, m)}
    candidates = set() if b_transp else {"B"}
    if gemmk == 1:
        candidates |= {"C"} | ({"A"} if not a_transp else set())
    return [x for x, ld, off, stride in zip("ABC", lds, offsets, strides)
            if x in candidates and ld == dims[x][0] and (off or (count > 1 and stride != dims[x][0] * dims[x][1]))]


def _gemmk(device, dtype):
    """The Xgemm kernel variant in use (0 unless clconv applied a GEMMK 1 set: tuned, or being tuned)."""
    return apply_tuned(device, dtype).get("Xgemm", {}).get("GEMMK", 0)


def gemm_strided_batched(queue, dtype, m, n, k, count, a, a_off, lda, a_stride, b, b_off, ldb, b_stride,
                         c, c_off, ldc, c_stride, *, alpha=1.0, beta=0.0, a_transp=False, b_transp=False,
                         what=""):
    """C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for i < count, row-major.

    A[i] starts at element ``a_off + i * a_stride`` of buffer ``a`` (same for B, C).
    ``c_stride`` must not be 0 (accumulating that way is not reliable in CLBlast).
    Operands CLBlast could read at the wrong place (see :func:`_in_place`) get a sub-buffer
    starting at their offset when the device's alignment allows, else the GEMMs run one by
    one through CLBlast's non-batched routine, which honours offsets.
    """
    assert count == 1 or c_stride > 0, "batched GEMM into one C would race"
    c_stride = c_stride if count > 1 else m * ldc    # CLBlast rejects a zero stride even for one matrix
    device = queue.device
    gemmk = _gemmk(device, dtype)
    risky = _in_place(m, n, k, count, (lda, ldb, ldc), (a_off, b_off, c_off), (a_stride, b_stride, c_stride),
                      a_transp, b_transp, gemmk)
    if risky and count > 1:
        ops = {"A": [a, a_off, a_stride, m * k], "B": [b, b_off, b_stride, k * n], "C": [c, c_off, c_stride, m * n]}
        align = device.mem_base_addr_align // 8
        if all(ops[x][1] * dtype.itemsize % align == 0 and ops[x][2] == ops[x][3] for x in risky):
            try:   # a view of exactly each such operand (its stride is already packed): offset 0
                for x in risky:
                    buf, origin, _, packed = ops[x]
                    if not isinstance(buf, cl.Buffer):   # a memory pool's block: a Buffer handle on it
                        buf = cl.Buffer.from_int_ptr(buf.int_ptr, retain=True)
                    ops[x][:2] = buf.get_sub_region(origin * dtype.itemsize, count * packed * dtype.itemsize), 0
                risky = []
            except cl.Error:   # e.g. the buffer is itself a sub-buffer: one GEMM at a time
                pass
        if not risky:
            (a, a_off, _, _), (b, b_off, _, _), (c, c_off, _, _) = ops.values()
    not_capturable("clblast_gemm", 1 if not risky else count, what="CLBlast GEMMs")
    try:
        if not risky:
            event = pyclblast.gemmStridedBatched(
                queue, m, n, k, count, _Operand(a, dtype), _Operand(b, dtype), _Operand(c, dtype), lda, ldb, ldc,
                a_stride, b_stride, c_stride, alpha=alpha, beta=beta, a_transp=a_transp, b_transp=b_transp,
                a_offset=a_off, b_offset=b_off, c_offset=c_off)
        else:
            for i in range(count):
                event = pyclblast.gemm(
                    queue, m, n, k, _Operand(a, dtype), _Operand(b, dtype), _Operand(c, dtype), lda, ldb, ldc,
                    alpha=alpha, beta=beta, a_transp=a_transp, b_transp=b_transp, a_offset=a_off + i * a_stride,
                    b_offset=b_off + i * b_stride, c_offset=c_off + i * c_stride)
    except (RuntimeError, cl.Error) as exc:
        raise ClconvError(f"clconv: {what}: CLBlast GEMM m={m} n={n} k={k} batch={count} "
                          f"(lda={lda}, ldb={ldb}, ldc={ldc}) failed: {exc}") from exc
    record("clblast_gemm", event)
    return event


def grid_gemm(queue, dtype, grid, a, b, c, epilogue=PLAIN, *, what=""):
    """The (group, image) grid of GEMMs (a :class:`clconv.gemm.Grid` of one K block) on
    :class:`clconv.gemm.Operand` s as strided-batched calls: one axis is a (host-side,
    non-blocking) loop, the other the batch, the loop over the smaller one unless its batch has
    strides CLBlast would misread (:func:`_in_place`; such a batch runs one GEMM at a time): then
    over the other one. The operands' ``pack`` is ignored."""
    groups, images, m, n, k = grid.gi, grid.gj, grid.m, grid.n, grid.k
    a_transp, b_transp = a.transp, b.transp
    lds = (a.ld, b.ld, c.ld)
    gemmk = _gemmk(queue.device, dtype)
    ways = [(groups, "per_group", images, "per_image"), (images, "per_image", groups, "per_group")]
    loop, loop_axis, count, batch_axis = min(ways, key=lambda w: (
        bool(_in_place(m, n, k, w[2], lds, (0, 0, 0), [getattr(x, w[3]) for x in (a, b, c)], a_transp, b_transp,
                       gemmk)), w[0]))
    for i in range(loop):
        a_off, b_off, c_off = (x.off + i * getattr(x, loop_axis) for x in (a, b, c))
        gemm_strided_batched(queue, dtype, m, n, k, count, a.buf, a_off, a.ld, getattr(a, batch_axis),
                             b.buf, b_off, b.ld, getattr(b, batch_axis), c.buf, c_off, c.ld, getattr(c, batch_axis),
                             alpha=epilogue.alpha, beta=epilogue.beta, a_transp=a_transp, b_transp=b_transp,
                             what=what)
