"""GEMMs: one entry point (:func:`grid_gemm`) over three engines, chosen once per plan.

  cpu      clconv's kernel for CPU devices (kernels/gemm_cpu.cl, :mod:`.gemm_cpu`): register
           blocks, no local memory, no barriers
  gpu      clconv's kernel for GPUs (kernels/gemm_gpu.cl, :mod:`.gemm_gpu`): local-memory tiles
  clblast  CLBlast through pyclblast (:mod:`.clblast`, its parameters in :mod:`.clblast_params`)

:func:`choose` picks one for a device ("auto": clconv's own kernel for the device's type,
CLBlast where no GPU tile fits; ``CLCONV_GEMM`` or a plan's ``gemm=`` can force one, "clconv"
meaning clconv's kernel for the device's type); a plan fixes it when it is built and names it
in ``explain()``. Every call site passes its grid as a :class:`Grid`, its matrices as
:class:`Operand`\\ s and what becomes of the product as an :class:`Epilogue` (:mod:`.operands`).
"""
import os

import pyopencl as cl
from pyopencl.tools import context_dependent_memoize

from .. import rules
from ..programs import ClconvError
from ..recording import not_capturable
from . import clblast, gemm_cpu, gemm_gpu
from .gemm_gpu import Im2colB, best_slices
from .operands import PLAIN, Epilogue, Grid, Operand

__all__ = ["CHOICES", "ENGINES", "PLAIN", "Epilogue", "Grid", "Im2colB", "Operand", "best_slices", "choose", "deep",
           "grid_gemm", "group_queues", "k_slices", "matrix_units"]

ENGINES = ("cpu", "gpu", "clblast")
CHOICES = ("auto", "clconv") + ENGINES


def choose(device, requested="auto"):
    """(engine, reason) for ``device``: ``requested`` ("auto", "clconv" or an engine), where
    "auto" defers to ``CLCONV_GEMM`` when that is set."""
    if requested == "auto":
        requested = os.environ.get("CLCONV_GEMM", "").strip().lower() or "auto"
        source = f"CLCONV_GEMM={requested}"
    else:
        source = f"gemm={requested!r}"
    if requested not in CHOICES:
        raise ValueError(f"the GEMM engine must be one of {CHOICES}, not {requested!r} ({source})")
    gpu = bool(device.type & cl.device_type.GPU)
    if requested in ENGINES:
        return requested, f"{source} asks for it"
    own = "gpu" if gpu else "cpu"
    if own == "gpu" and gemm_gpu.tile(device, 128, 128, 1) is None:
        if requested == "clconv":
            raise ValueError(f"no tile of clconv's GPU GEMM kernel fits {device.name.strip()} (work-group and "
                             f"local-memory limits); use gemm='clblast' ({source})")
        return "clblast", "no tile of clconv's GPU GEMM kernel fits this device's work-group and local memory"
    why = f"clconv's {own.upper()} kernel, faster than CLBlast's where compared (docs: GEMM engines)"
    return own, why if requested == "auto" else f"{source} asks for clconv's kernel for this device: {why}"




def deep(device, engine, m, n, k, count, itemsize=4):
    """Whether a forward's ``count`` M x N x K products run clconv's GPU kernel's deep tile
    (:func:`.gemm_gpu.deep`): then :func:`k_slices` and :func:`grid_gemm` take ``deep=True``."""
    return engine == "gpu" and gemm_gpu.deep(device, m, n, k, count, itemsize)


def k_slices(device, engine, m, n, k, count, itemsize=4, min_slice=rules.MIN_K_SLICE, waves=rules.FILL_WAVES, tile=None,
             deep=False, min_depth=None):
    """Split-K slices for ``count`` M x N x K products on ``engine``: the fewest that divide K
    exactly (so every slice is one product of the grid) and fill the device as above, or with
    ``waves`` work-groups per compute unit, counted in the tile the GEMM model picks for the grid
    or in ``tile`` (a :class:`.gemm_gpu.Tile`), or with ``deep`` in the deep tile to
    :data:`clconv.rules.DEEP_WAVES`; 1 where the grid fills it already, K is too short, or the engine
    is not clconv's GPU kernel (CPU kernels spread a product's blocks over the cores themselves;
    CLBlast is not split). ``min_depth``: the least K split at all (default rules.MIN_SPLIT_DEPTH, the
    forwards' and grad-inputs' bound; grad-weight's callers pass 0 and bound their slices of
    images or positions themselves)."""
    if engine != "gpu" or k < (rules.MIN_SPLIT_DEPTH if min_depth is None else min_depth):
        return 1
    if deep:
        tile, waves = gemm_gpu.EIGHT_BY_FOUR, rules.DEEP_WAVES
    groups = gemm_gpu.work_groups(device, m, n, count, itemsize, tile)
    if not groups:   # (an empty grid, of no images)
        return 1
    want = -(-waves * device.max_compute_units // groups)
    best = 1
    for d in range(2, k // min_slice + 1):
        if best >= want:
            break
        if k % d == 0:
            best = d
    return best


def unsplit_note(device, engine, m, n, k, count, itemsize=4):
    """explain()'s words where rules.MIN_SPLIT_DEPTH alone keeps a forward's or grad-input's ``count``
    M x N x K products whole (:func:`k_slices` would split them without it), else ""."""
    if k < rules.MIN_SPLIT_DEPTH and k_slices(device, engine, m, n, k, count, itemsize, min_depth=0) > 1:
        return (f", not split-K (K={k}, below {rules.MIN_SPLIT_DEPTH}: two slices would save about what their sum "
                "costs, and cost a second launch)")
    return ""


@context_dependent_memoize
def _queue_pool(context, device):
    """The per-group in-order queues of one context and device (grown on demand)."""
    return []


def group_queues(queue, count):
    """``count`` in-order queues on the context and device of ``queue``, kept per context."""
    pool = _queue_pool(queue.context, queue.device)
    while len(pool) < count:
        pool.append(cl.CommandQueue(queue.context, queue.device))
    return pool[:count]


def matrix_units(device):
    """The math modes (:mod:`clconv.precision`: "tf32", "fp16", "bf16") whose products clconv's GPU
    kernel can run on ``device``'s matrix units (:func:`.gemm_gpu.matrix_units`); empty where it
    has none that clconv uses."""
    return gemm_gpu.matrix_units(device)


def grid_gemm(queue, engine, dtype, grid, a, b, c, epilogue=PLAIN, *, per_group=False, deep=False, math="strict",
              what=""):
    """C[g, i] = alpha * op(A[g, i]) @ op(B[g, i]) + beta * C[g, i] for every (group g < grid.gi,
    image i < grid.gj), row-major; ``a``, ``b``, ``c`` are :class:`Operand` s, op(A) M x K,
    op(B) K x N, of the :class:`Grid` ``grid``; alpha and beta are the :class:`Epilogue`'s.

    clconv's kernels run the whole grid as one launch. CLBlast's strided-batched call covers one
    axis: the smaller becomes a (host-side, non-blocking) loop and the larger the batch (the
    other way round where only that batch is one CLBlast reads correctly, see
    :func:`.clblast._in_place`). What each operand's fields ask of an engine (an im2col B, folded
    operands, a transposed C, packing, K blocks) is in :class:`Operand` and :class:`Grid`; one an
    engine cannot do raises. ``deep``: clconv's GPU kernel runs its deep tile (:func:`deep`).
    ``math``: "strict" (products in ``dtype``), or a mode of :func:`matrix_units` (clconv's GPU
    kernel on the matrix units, operands rounded to that format, float32 sums).

    With ``per_group`` each group's GEMMs (batched over the images) run on an in-order queue of
    their own: those queues wait for a marker of everything enqueued on ``queue`` so far, and
    ``queue`` waits for all of them before going on (CLBlast takes no wait list). On clconv's GPU
    kernel each group's launch takes the tile and planes of the whole grid, so its sums are those
    of one launch over all groups, bit for bit. Operands are not packed there.
    """
    if ((b.im2col is not None or a.fold or b.fold or c.fold or deep) and engine != "gpu"
            or (grid.blocks > 1 or grid.continuous) and engine == "clblast" or c.transp and engine != "cpu"
            or (math != "strict" or a.half or b.half or c.half) and engine != "gpu"):
        raise ClconvError(f"clconv: {what}: an implicit im2col operand, a folded operand, the deep tile and float16 "
                          "operands need clconv's GPU GEMM kernel, a transposed C its CPU kernel, K blocks one of "
                          f"clconv's kernels, math={math!r} clconv's GPU kernel")
    if per_group and grid.gi > 1:
        not_capturable(what="per-group queues")
        ready = cl.enqueue_marker(queue)
        queue.flush()   # other queues wait on this marker: it must reach the device
        done = []
        one = grid._replace(gi=1)
        for g, q in enumerate(group_queues(queue, grid.gi)):
            cl.enqueue_barrier(q, wait_for=[ready])
            ops = [x._replace(off=x.at(g), per_group=0, pack=None) for x in (a, b, c)]
            _run(q, engine, dtype, one, *ops, epilogue, deep, math, what, share=grid.gi)
            done.append(cl.enqueue_marker(q))
            q.flush()
        cl.enqueue_barrier(queue, wait_for=done)
    else:
        _run(queue, engine, dtype, grid, a, b, c, epilogue, deep, math, what)


def _run(queue, engine, dtype, grid, a, b, c, epilogue, deep, math, what, share=1):
    if engine == "cpu":
        gemm_cpu.grid_gemm(queue, dtype, grid, a, b, c, epilogue, what=what)
    elif engine == "gpu":
        gemm_gpu.grid_gemm(queue, dtype, grid, a, b, c, epilogue, deep=deep, share=share, math=math, what=what)
    else:
        clblast.grid_gemm(queue, dtype, grid, a, b, c, epilogue, what=what)
