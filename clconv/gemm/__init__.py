"""GEMMs: one entry point (:func:`grid_gemm`) over three engines, chosen once per plan.

  cpu      clconv's kernel for CPU devices (kernels/gemm_cpu.cl, :mod:`.gemm_cpu`): register
           blocks, no local memory, no barriers
  gpu      clconv's kernel for GPUs (kernels/gemm_gpu.cl, :mod:`.gemm_gpu`): local-memory tiles
  clblast  CLBlast through pyclblast (:mod:`.clblast`, its parameters in :mod:`.clblast_params`)

:func:`choose` picks one for a device ("auto": clconv's own kernel for the device's type,
CLBlast where no GPU tile fits; ``CLCONV_GEMM`` or a plan's ``gemm=`` can force one, "clconv"
meaning clconv's kernel for the device's type); a plan fixes it when it is built and names it
in ``explain()``. Every call site passes its matrices as :class:`Operand`\\ s.
"""
import os
from typing import NamedTuple

import pyopencl as cl
from pyopencl.tools import context_dependent_memoize

from .. import rules
from ..programs import ClconvError
from ..recording import not_capturable
from . import clblast, gemm_cpu, gemm_gpu
from .gemm_gpu import Im2colB, KBlocks, best_slices

__all__ = ["CHOICES", "ENGINES", "Im2colB", "KBlocks", "Operand", "best_slices", "choose", "deep", "grid_gemm",
           "group_queues", "k_slices"]

ENGINES = ("cpu", "gpu", "clblast")
CHOICES = ("auto", "clconv") + ENGINES


class Operand(NamedTuple):
    """One matrix operand of a grid of GEMMs: its buffer, the element offset of its first
    matrix, its leading dimension, and the elements from one matrix to the next along the
    grid's group and image axes (0: the same matrix for all)."""
    buf: object
    off: int
    ld: int
    per_group: int = 0
    per_image: int = 0

    def at(self, group=0, image=0):
        """The element offset of matrix (group, image)."""
        return self.off + group * self.per_group + image * self.per_image


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


def grid_gemm(queue, engine, dtype, groups, images, m, n, k, a, b, c, *, alpha=1.0, beta=0.0, a_transp=False,
              b_transp=False, c_transp=False, per_group=False, im2col=None, k_blocks=None, c_fold=0, b_fold=0,
              a_fold=0, a_packed=None, b_panels=None, deep=False, what=""):
    """C[g, i] = alpha * op(A[g, i]) @ op(B[g, i]) + beta * C[g, i] for every (group g, image i),
    row-major; ``a``, ``b``, ``c`` are :class:`Operand` s, op(A) M x K, op(B) K x N.

    clconv's kernels run the whole grid as one launch. CLBlast's strided-batched call covers one
    axis: the smaller becomes a (host-side, non-blocking) loop and the larger the batch (the
    other way round where only that batch is one CLBlast reads correctly, see
    :func:`.clblast._in_place`). ``im2col`` (an :class:`Im2colB`): B is read in place through
    im2col; ``c_fold``, ``b_fold``: C's or B's columns are the positions of several images,
    ``a_fold``: A's depth, the images' products split-K slices of it (:func:`.gemm_gpu.grid_gemm`);
    these on the GPU kernel only, as is ``deep`` (its deep tile, :func:`deep`). ``k_blocks`` (a :class:`KBlocks`,
    continuous on the GPU kernel only): each product sums over blocks of K, on clconv's kernels.
    ``a_packed`` (an :class:`Operand` in the caller's workspace, of
    :func:`.gemm_cpu.packed_size` elements): where op(A) = A^T alone, clconv's CPU kernel packs
    A^T there first (reading A^T in place costs it 1.5x); ``b_panels`` (of
    :func:`.gemm_cpu.panels_size` elements): it packs B in panels there first. The other engines
    and per-group queues ignore both. ``c_transp``: C is stored transposed, on clconv's CPU kernel
    only, with op(A) = A^T read in place (:func:`.gemm_cpu.grid_gemm`).

    With ``per_group`` each group's GEMMs (batched over the images) run on an in-order queue of
    their own: those queues wait for a marker of everything enqueued on ``queue`` so far, and
    ``queue`` waits for all of them before going on (CLBlast takes no wait list). On clconv's GPU
    kernel each group's launch takes the tile and planes of the whole grid, so its sums are those
    of one launch over all groups, bit for bit.
    """
    folded = c_fold or b_fold or a_fold
    if ((im2col is not None or folded or deep) and engine != "gpu" or k_blocks is not None and engine == "clblast"
            or c_transp and engine != "cpu"):
        raise ClconvError(f"clconv: {what}: an implicit im2col operand, a folded operand or the deep tile need "
                          "clconv's GPU GEMM kernel, a transposed C its CPU kernel, K blocks one of clconv's kernels")
    flags = dict(alpha=alpha, beta=beta, a_transp=a_transp, b_transp=b_transp, what=what)
    if deep:
        flags["deep"] = True
    if c_transp:
        flags["c_transp"] = True
    ops = (a, b, c)
    if per_group and groups > 1:
        not_capturable(what="per-group queues")
        ready = cl.enqueue_marker(queue)
        queue.flush()   # other queues wait on this marker: it must reach the device
        done = []
        for g, q in enumerate(group_queues(queue, groups)):
            cl.enqueue_barrier(q, wait_for=[ready])
            one = [x._replace(off=x.at(g), per_group=0) for x in ops]
            _run(q, engine, dtype, 1, images, m, n, k, *one, im2col, k_blocks, c_fold, b_fold, a_fold, None,
                 None, flags, share=groups)
            done.append(cl.enqueue_marker(q))
            q.flush()
        cl.enqueue_barrier(queue, wait_for=done)
    else:
        _run(queue, engine, dtype, groups, images, m, n, k, *ops, im2col, k_blocks, c_fold, b_fold, a_fold,
             a_packed, b_panels, flags)


def _run(queue, engine, dtype, groups, images, m, n, k, a, b, c, im2col, k_blocks, c_fold, b_fold, a_fold, a_packed,
         b_panels, flags, share=1):
    if engine == "cpu":
        gemm_cpu.grid_gemm(queue, dtype, groups, images, m, n, k, a, b, c, a_packed=a_packed, b_panels=b_panels,
                           k_blocks=k_blocks, **flags)
    elif engine == "gpu":
        gemm_gpu.grid_gemm(queue, dtype, groups, images, m, n, k, a, b, c, im2col=im2col, k_blocks=k_blocks,
                           c_fold=c_fold, b_fold=b_fold, a_fold=a_fold, share=share, **flags)
    else:
        clblast.grid_gemm(queue, dtype, groups, images, m, n, k, a, b, c, **flags)
