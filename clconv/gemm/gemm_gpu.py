"""Host side of kernels/gemm_gpu.cl: clconv's GEMM for GPUs, local-memory tiles.

CLBlast's tiled GEMM first copies operands whose sizes are not multiples of its tiles into
padded buffers, one launch each, and its batched call covers one batch stride. Ours reads the
operands in place, edges guarded, four values per read where they are aligned, and runs a
whole (groups x images) grid of GEMMs in one launch; it measured faster than CLBlast's on the
shapes the GEMM pages compare (docs/performance), so GPUs use ours wherever one of its tiles fits the device (:func:`clconv.gemm.choose`).
"""
import functools
import hashlib
from typing import NamedTuple

import numpy as np
import pyopencl as cl

from .. import limits, reference, rules, tuning
from ..programs import BuildError, ClconvError, get_kernel, index_type, kernel_dir, launch, work_group_limit
from .operands import PLAIN, Grid, Operand

class Tile(NamedTuple):
    """One shape of kernels/gemm_gpu.cl: TM x TN of C per work-group, RM x RN per work-item,
    slices TK deep, split among KS planes of work-items."""
    tm: int
    tn: int
    rm: int = 8
    rn: int = 8
    tk: int = 8
    ks: int = 1

    @property
    def work_items(self):
        return self.tm * self.tn // (self.rm * self.rn) * self.ks


# The tiles, each with its relative speed where the device is saturated, and SATURATION: fitted to
# the networks benchmark's GEMMs, each timed with every tile (python -m bench.gemm_tiles; the
# timings are in bench/results/). 4x4 work-items give grids of few work-groups more work-items.
TILES = ((Tile(128, 128), 1.0), (Tile(128, 64), 0.97), (Tile(32, 64, 4, 4, 16), 0.95),
         (Tile(64, 32, 4, 4, 16), 0.95))
SATURATION = 256         # work-items per compute unit a grid needs to run at its tile's speed
PAD = 4                  # the kernel's local-memory row padding


@functools.lru_cache(maxsize=None)
def _facts(device):
    """(is a GPU, compute units, largest work-group, its largest sides, local memory bytes,
    buffer alignment in bytes) of ``device``, asked once (each is a driver call)."""
    return (bool(device.type & cl.device_type.GPU), device.max_compute_units, device.max_work_group_size,
            tuple(device.max_work_item_sizes), device.local_mem_size, device.mem_base_addr_align // 8)


def read_width(device, itemsize, offset, si, sj, ld, gi, gj, sq=0):
    """Values per global read of one operand: 4 when each of its matrices (and K blocks, ``sq``
    apart) starts at a multiple of 4 elements and its rows lie a multiple of 4 apart, so that
    four-wide reads along the rows stay aligned (buffers start aligned to at least that on the
    device); else 1."""
    aligned = (offset % 4 == 0 and ld % 4 == 0 and (gi == 1 or si % 4 == 0) and (gj == 1 or sj % 4 == 0)
               and sq % 4 == 0 and _facts(device)[5] >= 4 * itemsize)
    return 4 if aligned else 1


def fits(device, t, itemsize=4, pad=PAD):
    """Whether the device can run the :class:`Tile` ``t`` with rows padded by ``pad``: its
    work-group and local memory."""
    _, _, max_group, max_sides, local, _ = _facts(device)
    return (t.work_items <= max_group and t.tn // t.rn <= max_sides[0] and t.tm // t.rm <= max_sides[1]
            and t.ks <= max_sides[2] and 2 * t.tk * (t.tm + t.tn + 2 * pad) * itemsize <= local
            and (t.ks == 1 or t.tm * t.tn <= 2 * t.tk * (t.tm + pad)))   # (a plane's sums, where A was staged)


def on_matrix_units(device, t, math):
    """The :class:`Tile` a launch in ``math`` (a mode of :data:`MMA`) runs for ``t``: its slices
    deepened to MMA_TK where that fits the device, else to 16, the deepest that fits (a slice's
    8-deep steps each run in a few cycles on the units: fewer, deeper slices cross fewer barriers)."""
    pad = MMA[math][2]
    for tk in (MMA_TK, 16):
        if t.tk <= tk and fits(device, t._replace(tk=tk), 4, pad):
            return t._replace(tk=tk)
    return t


def _cost(device, option, m, n, count, k=None):
    """The model's time for ``count`` M x N products, K deep, with the tile and speed of
    ``option``: the tiles' area (work-groups x tile area x K rounded up to the tile's slices)
    over its speed, the speed scaled down where the grid has fewer work-items than SATURATION
    per compute unit (then the time is one work-item's work: a 4x4 work-item's is a quarter of
    an 8x8 one's)."""
    t, speed = option
    groups = -(-m // t.tm) * -(-n // t.tn) * count
    busy = min(1.0, groups * t.work_items / (_facts(device)[1] * SATURATION))
    depth = -(-k // t.tk) * t.tk if k else 1   # (None: K long enough for its rounding not to count)
    return groups * t.tm * t.tn * depth / (speed * busy) if groups else 0.0   # (empty: any tile)


@functools.lru_cache(maxsize=limits.GPU_TILES_KEPT)
def tile(device, m, n, count, itemsize=4):
    """The :class:`Tile` for ``count`` M x N products: least time in the model of :func:`_cost`
    (for any long K); None when no tile fits the device."""
    fitting = [t for t in TILES if fits(device, t[0], itemsize)]
    return min(fitting, key=lambda option: _cost(device, option, m, n, count))[0] if fitting else None


def best_slices(device, m, n, k, count, options, itemsize=4):
    """Of ``options`` (split-K slice counts dividing ``k``), the one of least time in the model
    for ``count`` M x N products K deep cut into S slices: the rule's tile over count x S
    products K/S deep (the fewest slices where several tie). Where a grid is short of
    work-items, a larger tile over more slices can beat a smaller one over fewer. The partial
    results' traffic is left out of the model (docs: rule-1x1-weight-blocks)."""
    def cost(S):
        t = tile(device, m, n, count * S, itemsize)
        return _cost(device, (t, dict(TILES)[t]), m, n, count * S, k // S)
    return min(sorted(options), key=cost) if tile(device, m, n, count, itemsize) else 1


# What a launch runs where the model picks a tile of 8x8 work-items: 64x64 tiles of 8x4 work-items,
# 16 deep (half the work-items of a 128x128 tile, so twice the work-groups per area, and half the
# slices), which measured faster (bench.gemm_tiles), except over an im2col B, whose reads cost the
# most per value. The model and the split-K rules still count a grid in the 8x8 tiles.
EIGHT_BY_FOUR = Tile(64, 64, 8, 4, 16)


def launched(device, t, im2col=False, itemsize=4):
    """The tile a launch runs for the model's tile ``t``: :data:`EIGHT_BY_FOUR` for an 8x8 one
    (unless B is read through im2col, or it does not fit the device), else ``t``."""
    if t.rm == t.rn == 8 and not im2col and fits(device, EIGHT_BY_FOUR, itemsize):
        return EIGHT_BY_FOUR
    return t




def deep_note():
    """What ``explain()`` says of a pass whose GEMM takes the deep tile."""
    t = EIGHT_BY_FOUR
    return (f"clconv's GPU GEMM kernel in its deep tile ({t.tm}x{t.tn} of {t.rm}x{t.rn} work-items, for products at "
            f"least {rules.DEEP_K} deep, split to {rules.DEEP_WAVES} work-groups per compute unit)")


def deep_grid(device, m, n, count, itemsize=4):
    """Whether ``count`` M x N products may run EIGHT_BY_FOUR: it fits the device, and their grid in
    it has at least one work-group per rules.DEEP_MIN_SHARE compute units before any split."""
    return (work_groups(device, m, n, count, itemsize, EIGHT_BY_FOUR) * rules.DEEP_MIN_SHARE >= _facts(device)[1]
            and fits(device, EIGHT_BY_FOUR, itemsize))


def deep(device, m, n, k, count, itemsize=4):
    """Whether a forward's ``count`` M x N products K deep run EIGHT_BY_FOUR by the rule above."""
    t = tile(device, m, n, count, itemsize)
    return t is not None and t.rm * t.rn == 16 and k >= rules.DEEP_K and deep_grid(device, m, n, count, itemsize)




def sliced(device, t, groups, k, blocks=1, itemsize=4, pad=PAD):
    """``t`` with KS planes: the most, doubling up to rules.MAX_PLANES, while the grid of ``groups``
    work-groups is short of SATURATION work-items per compute unit, the tile fits the device, and
    products of ``blocks`` K blocks ``k`` deep (each block its own slices) take fewer slices, at
    least rules.MIN_PLANE_SLICES."""
    want = _facts(device)[1] * SATURATION
    while t.ks < rules.MAX_PLANES and groups * t.work_items < want:
        deeper = t._replace(tk=t.tk * 2, ks=t.ks * 2)
        slices = -(-k // deeper.tk) * blocks
        if slices < rules.MIN_PLANE_SLICES or slices == -(-k // t.tk) * blocks or not fits(device, deeper, itemsize, pad):
            break
        t = deeper
    return t


def work_groups(device, m, n, count, itemsize=4, t=None):
    """Work-groups of ``count`` M x N products in the :class:`Tile` ``t``, by default the one
    :func:`tile` picks: how the split-K rules measure a grid (a launch may run
    :func:`launched`'s smaller tile)."""
    t = t or tile(device, m, n, count, itemsize) or TILES[-1][0]
    return -(-m // t.tm) * -(-n // t.tn) * count


# Math modes on the matrix units: the kernel's MMA define, the least compute capability whose
# PTX has what the form uses (mma.sync m16n8k8 in the format; cvt.rna.tf32.f32, cvt.rn.f16x2.f32
# and cvt.rn.bf16x2.f32, all of 8.0), and the row padding that keeps a warp's fragment reads on
# 32 banks (one value per row: 8; two rows' values per register: 4).
MMA = {"tf32": (1, (8, 0), 8), "fp16": (2, (8, 0), 4), "bf16": (3, (8, 0), 4)}
MMA_TK = 32   # the slice depth a matrix-unit launch stages where it fits (else 16): barriers per product


def compute_capability(device):
    """(major, minor) of an NVIDIA device (cl_nv_device_attribute_query), else None."""
    if "cl_nv_device_attribute_query" not in device.extensions:
        return None
    return device.compute_capability_major_nv, device.compute_capability_minor_nv


@functools.lru_cache(maxsize=None)
def matrix_units(device):
    """The math modes of :data:`MMA` this kernel runs on ``device``'s matrix units: an NVIDIA GPU of
    the compute capability each needs (asked of the driver, never read from the device's name)
    whose compiler takes the inline PTX and whose products pass :func:`units_check`. Asked once per
    process and device."""
    cc = compute_capability(device)
    if cc is None or not _facts(device)[0]:
        return frozenset()
    return frozenset(mode for mode, (_, least, _) in MMA.items() if cc >= least and units_check(device, mode)[0])


def _units_key(device, mode):
    """The tuning-cache key of a :func:`units_check`: matrixunits | device | driver | mode | kernel source."""
    source = hashlib.sha256((kernel_dir() / "gemm_gpu.cl").read_bytes()).hexdigest()[:12]
    return "|".join(("matrixunits", device.name.strip(), device.driver_version, mode, source))


def units_check(device, mode):
    """(ok, why not): whether this kernel in ``mode`` builds on ``device`` and computes a 45 x 37
    product 53 deep within the mode's tolerance of float64 (its rounding, not a wrong fragment
    layout): from the tuning cache where this driver and kernel source were checked, else run now
    on a context of its own and kept."""
    k = _units_key(device, mode)
    entry = tuning.load().get(k)
    if isinstance(entry, dict) and isinstance(entry.get("ok"), bool):
        return entry["ok"], str(entry.get("why", ""))
    rng = np.random.default_rng(0)
    m, n, depth = 45, 37, 53
    a, b = rng.standard_normal((m, depth)).astype(np.float32), rng.standard_normal((depth, n)).astype(np.float32)
    try:
        context = cl.Context([device])
        queue = cl.CommandQueue(context)
        bufs = [cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
                for x in (a, b, np.zeros((m, n), np.float32))]
        grid_gemm(queue, np.dtype(np.float32), Grid(1, 1, m, n, depth), Operand(bufs[0], 0, depth),
                  Operand(bufs[1], 0, n), Operand(bufs[2], 0, n), math=mode, what=f"the {mode} matrix-unit check")
        got = np.empty((m, n), np.float32)
        cl.enqueue_copy(queue, got, bufs[2])
        queue.finish()
    except BuildError as exc:
        answer = False, exc.compiler_lines
    except (ClconvError, cl.Error) as exc:
        answer = False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    else:
        err = reference.normalised_error(got, a.astype(np.float64) @ b)
        ok = bool(err <= reference.tolerance(np.float32, mode))   # (NaN fails)
        answer = ok, "" if ok else f"a {m}x{n}x{depth} product's normalised max error is {err:.2g}"
    tuning.store({k: {"ok": answer[0], "why": answer[1]}})
    return answer


class Im2colB(NamedTuple):
    """B read in place as the im2col matrix of an NCHW input (kernels/gemm_gpu.cl's IM_* defines):
    input h x w, images xs values apart, p output positions per image in rows of ow, taps
    kh x kw, strides, paddings (top, left), dilations; column p of matrix (i, j) counts from
    j * pj. ``span``: values of the input a matrix can read from its start (for the index type)."""
    h: int
    w: int
    xs: int
    p: int
    ow: int
    kh: int
    kw: int
    sy: int
    sx: int
    pt: int
    pl: int
    dy: int
    dx: int
    pj: int
    span: int

    def defines(self):
        return tuple((f"IM_{name.upper()}", value) for name, value in self._asdict().items() if name != "span")


def grid_gemm(queue, dtype, grid, a, b, c, epilogue=PLAIN, *, deep=False, share=1, math="strict", what=""):
    """C[i, j] = alpha * op(A[i, j]) @ op(B[i, j]) + beta * C[i, j] for i < gi, j < gj of ``grid``
    (a :class:`clconv.gemm.Grid`), in one launch; alpha and beta: ``epilogue``'s.

    ``a``, ``b``, ``c``: :class:`clconv.gemm.Operand` s (matrix (i, j) at ``at(i, j)``); C
    matrices must not overlap. ``b.im2col`` (an :class:`Im2colB`): B is the im2col matrix of the
    input at B's offsets, read in place (its leading dimension is unused). ``grid.blocks``:
    op(A[i, j]) @ op(B[i, j]) is the sum over that many blocks of K, each M x K by K x N, the
    operands' ``k_step`` apart; ``grid.continuous``: read as one depth (the K_FOLD define), not
    block by block, each block's last slice padded with zeros (which wastes most of a slice where
    K is short: 25 or 49 positions). ``c.fold`` (gj == 1): C's N columns are n / c.fold images
    of c.fold positions, image q's rows starting at ``c.per_image`` * q (an NCHW output, its
    batch in the GEMM's N). ``b.fold`` (gj == 1, B stored K x N, read as it is): the same for
    B's columns. ``a.fold`` (A stored M x K, read as it is): the same for A's depth, where the
    gj products along j are split-K slices of one depth of gj * K values (product j's depth k is
    j * K + k; an NCHW operand, its batch in the GEMM's K). ``deep``: the grid runs
    EIGHT_BY_FOUR, the tile its caller's split was counted in (:func:`deep`). ``math``: "strict",
    or a mode of :func:`matrix_units` (float32 only): the products on the matrix units, the tile's
    slices deepened by :func:`on_matrix_units`. An operand's ``half``: stored as float16, read and
    written as it is (``dtype`` float32). ``share``: this
    launch is one of ``share`` alike that together make the grid (per-group queues): its tile
    and planes are chosen for the whole grid, as one launch of it would take them, so that its
    sums are the same bit for bit.
    """
    gi, gj, m, n, k = grid.gi, grid.gj, grid.m, grid.n, grid.k
    alpha, beta = epilogue
    a_transp, b_transp, im2col = a.transp, b.transp, b.im2col
    a_fold, b_fold, c_fold = a.fold, b.fold, c.fold
    blocked = grid.blocks > 1 or grid.continuous
    kblocks, continuous = grid.blocks, grid.continuous
    if im2col is not None and blocked:
        raise ClconvError(f"clconv: {what}: an im2col B is not read in K blocks")
    assert not (deep and im2col is not None), "the deep tile is not run over an im2col B (see launched)"
    assert not c_fold or (gj == 1 and n % c_fold == 0), "a folded C is one matrix of whole images along j"
    assert not b_fold or (gj == 1 and n % b_fold == 0 and not b_transp and im2col is None and not blocked), \
        "a folded B is one K x N matrix of whole images along j, read as it is"
    assert not a_fold or ((gj * k) % a_fold == 0 and not (a_transp or b_fold or c_fold) and not blocked), \
        "a folded A is one M x (gj * K) matrix of whole images, read as it is"
    ops = (a, b, c)
    assert (gi == 1 or c.per_group) and (gj == 1 or c.per_image or c_fold), "GEMMs into one C would race"
    itemsize = np.dtype(dtype).itemsize
    mma, _, pad = MMA[math] if math != "strict" else (0, None, PAD)
    assert not mma or np.dtype(dtype) == np.float32, "the matrix units take float32 operands"
    assert not (a.half or b.half or c.half) or np.dtype(dtype) == np.float32, "float16 operands are summed in float32"
    if deep:
        chosen = EIGHT_BY_FOUR
    else:
        chosen = tile(queue.device, m, n, gi * gj * share, itemsize)
        if chosen is None:
            raise ClconvError(f"clconv: {what}: no tile of clconv's GEMM kernel fits {queue.device.name.strip()} "
                              f"(work-group and local-memory limits); use gemm='clblast'")
        chosen = launched(queue.device, chosen, im2col is not None, itemsize)
    tm, tn = chosen.tm, chosen.tn
    groups = -(-m // tm) * -(-n // tn) * gi * gj
    depth, blocks = (k * kblocks, 1) if continuous else (k, kblocks)   # (continuous: one depth)
    chosen = sliced(queue.device, chosen, groups * share, depth, blocks, itemsize, pad)
    if mma:
        chosen = on_matrix_units(queue.device, chosen, math)
    shapes = ((k, m) if a_transp else (m, k), (n, k) if b_transp else (k, n), (m, n))   # as stored, row-major
    spans = [(rows - 1) * x.ld + cols for (rows, cols), x in zip(shapes, ops)]
    if im2col is not None:
        spans[1] = im2col.span
    for fold, x, i, rows, cols in ((a_fold, a, 0, m, gj * k), (b_fold, b, 1, k, n), (c_fold, c, 2, m, n)):
        if fold:
            spans[i] = (cols // fold - 1) * x.per_image + (rows - 1) * x.ld + fold
    if a_fold:   # (one matrix per group: its j products are slices of it)
        spans[0] -= (gj - 1) * a.per_image
    steps = (a.k_step, b.k_step, 0)
    idx = index_type(*(x.at(gi - 1, gj - 1) + (kblocks - 1) * step + span for x, step, span in zip(ops, steps, spans)))
    # an im2col B is gathered one value at a time; a continuous depth is read four-wide only where
    # its blocks are whole vectors (K a multiple of 4), a folded B where its images' rows are
    scalar_b = im2col is not None or (b_fold and (b_fold % 4 or b.per_image % 4))
    # a folded A where its images' rows and its slices are whole vectors (and its image stride)
    scalar_a = a_fold and (a_fold % 4 or k % 4 or a.per_image % 4)
    va, vb = (1 if (x is b and scalar_b) or (x is a and scalar_a) or (continuous and k % 4)
              else read_width(queue.device, itemsize, x.off, x.per_group, x.per_image, x.ld, gi, gj, step)
              for x, step in zip((a, b), steps))
    # C is written four-wide where its rows (and a fold's images) are whole aligned vectors
    vc = (read_width(queue.device, itemsize, c.off, c.per_group, c.per_image, c.ld, gi, gj)
          if not c_fold or (c_fold % 4 == 0 and c.per_image % 4 == 0) else 1)
    def build(t):
        return get_kernel(queue.context, "gemm_gpu.cl", "gemm_gpu", dtype, TM=tm, TN=tn, RM=t.rm, RN=t.rn, TK=t.tk,
                          KS=t.ks, PAD=pad, MMA=mma, A_TRANSP=int(a_transp), B_TRANSP=int(b_transp), VA=va, VB=vb, VC=vc,
                          IDX=idx, IM2COL=int(im2col is not None), K_FOLD=k if continuous else 0, C_FOLD=c_fold,
                          B_FOLD=b_fold, A_FOLD=a_fold, A_HALF=int(a.half), B_HALF=int(b.half), C_HALF=int(c.half),
                          **dict(im2col.defines() if im2col else ()))
    kernel = build(chosen)
    if chosen.ks > 1 and chosen.work_items > work_group_limit(kernel, queue.device):
        # the planes' work-group is above what the compiler allows this kernel: one plane
        chosen = chosen._replace(tk=chosen.tk // chosen.ks, ks=1)
        kernel = build(chosen)
    wx, wy = tn // chosen.rn, tm // chosen.rm
    return launch(queue, kernel, (groups * wx, wy, chosen.ks), (wx, wy, chosen.ks), m, n, depth, alpha, beta, gj, blocks,
                  a.buf, a.off, a.ld, a.per_group, a.per_image, a.k_step,
                  b.buf, b.off, b.ld, b.per_group, b.per_image, b.k_step,
                  c.buf, c.off, c.ld, c.per_group, c.per_image, what=what)
