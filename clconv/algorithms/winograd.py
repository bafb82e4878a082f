"""Winograd F(4x4, 3x3) and F(2x2, 5x5) for 3x3 and 5x5 convolutions at stride 1 (any
padding, dilation, groups), and F(1x2, 1x7) / F(2x1, 7x1) for filters of one row or column
of 7 taps.

Both 2-D forms transform 6x6 input patches: a 4x4 output tile of a 3x3 filter costs 36
multiplications per (filter, channel) pair instead of 144, a 2x2 tile of a 5x5 filter 36
instead of 100, so the GEMMs shrink 4x or 2.8x; the price is transforms that read and
write each operand 2.25x (9x for 2x2 tiles) its size (kernels/winograd.cl has the math
and the buffer layouts). A 1x7 or 7x1 filter transforms 8 inputs along its axis into 8
values for 2 outputs: 8 multiplications where im2col's GEMM has 14, each operand 4x its size
in the transforms. Per chunk of images:
  forward        U = G w G^T; V = B^T x B; M[t, g] = U[t, g] @ V[t, g]; y = A^T M A (+ bias)
  grad-input     the forward pass of the transposed convolution (``g.transposed()``) over dy
  grad-weight    V = B^T x B; Z = A dy A^T; dU[t, g] (+)= Z[t, g] @ V[t, g]^T; dw = G^T dU G
                 Many tiles are cut into S slices (split-K): partial sums of dU per slice in
                 the same batched call, then an ordered sum. Besides filling the device, this
                 keeps float32 sums short: F(2x2,5x5) on AlexNet's conv2 at batch 128 gave
                 1.3e-4 of the largest gradient in one sum, 1.8e-5 in 28 slices (PoCL).
The 36 (or 8) tile positions t (times the S slices of a split grad-weight) times the groups g are
the batch of one batched GEMM (their operands are evenly spaced offsets into
the workspace); with per-group queues, each group's GEMMs run on its own queue.
An image whose workspace is above the budget runs in pieces: ranges of its tile rows, as
many rows as the budget holds, through the same kernels (each told its first tile row);
grad-weight adds the ranges' products in order, so its sum is fixed. On CPUs forward and
grad-input cut an image so also where its workspace is above rules.WINOGRAD_CPU_PIECE_BYTES (the caches).
"""

from math import prod

import pyopencl as cl

from .. import rules
from ..bias import flags
from ..buffers import Ref, idx_for
from ..device import cpu_vector_width, vectorizes_work_items
from ..explanation import Reason
from ..gemm import Epilogue, Operand as Op, gemm_cpu
from ..programs import INT32_MAX, get_kernel, launch, reduction_work_group, work_group_limit
from .partials import largest_divisor_at_most, max_slices, sum_partials
from .transform import Transform, aligned, little_gpu_work, pass_geometry

LOCAL = 256               # transform kernels' work-group, at most (measured slightly faster than 64 on GPUs)


def _tiles(size, dilation, tile):
    """Tiles of ``tile`` outputs along an output axis of ``size``: each dilation phase of the
    axis gets whole tiles."""
    return dilation * -(-(-(-size // dilation)) // tile)


def _alpha(g):
    """Transformed values per tile along (rows, columns): 6 for 3 and 5 taps, 8 for 7, 1 along
    an axis of one tap (not transformed)."""
    return tuple(1 if r == 1 else 8 if r == 7 else 6 for r in (g.kh, g.kw))


def _side(g):
    """Outputs per tile along (rows, columns): F(4x4, 3x3), F(2x2, 5x5), F(1x2, 1x7), F(2x1, 7x1)."""
    return tuple(a + 1 - r for a, r in zip(_alpha(g), (g.kh, g.kw)))


def _dilation(t):
    """Geometry ``t``'s dilation as its tiles see it: 1 along an axis of one tap (no phases to interleave)."""
    return tuple(d if r > 1 else 1 for d, r in zip(t.dilation, (t.kh, t.kw)))


def _column(g):
    """Whether the filter is one column of taps (a 7x1): Winograd along its column (the H axis) only."""
    return g.kw == 1 and g.kh > 1


def _grid(t, side):
    """Tiles (TH, TW) per image along the output rows and columns of geometry ``t``."""
    (dh, dw) = _dilation(t)
    return _tiles(t.OH, dh, side[0]), _tiles(t.OW, dw, side[1])


def _form(g):
    """F(4x4,3x3) and so on, as the docs write it."""
    return "F({}x{},{}x{})".format(*_side(g), g.kh, g.kw)


class Winograd(Transform):
    name, kind = "winograd", "Winograd"
    HALF_KERNELS = True   # its transforms read and write the arrays through LOAD and SAVE; the GEMMs' are float

    @staticmethod
    def applies(g):
        if (g.kh, g.kw) not in ((3, 3), (5, 5), (1, 7), (7, 1)) or g.stride != (1, 1):
            return False, (f"needs a 3x3, 5x5, 1x7 or 7x1 filter at stride 1 (got {g.kh}x{g.kw}, stride "
                           f"{g.stride})")
        (mh, mw), (ah, aw) = _side(g), _alpha(g)
        return True, (f"{g.kh}x{g.kw} at stride 1: Winograd {_form(g)} needs {ah * aw} multiplications per "
                      f"{mh}x{mw} output tile where im2col's GEMM needs {mh * mw * g.kh * g.kw}")

    @staticmethod
    def preferred(g, pass_name, device):
        """Whether "auto" should pick this algorithm for ``pass_name`` on ``device`` (it applies
        either way): rule-winograd-channels, rule-winograd-gpu-work, rule-winograd-cpu-rows,
        rule-winograd-cpu-tiles."""
        if min(g.Cg, g.Kg) < rules.WINOGRAD_MIN_CHANNELS:
            return False, Reason("winograd-channels", f"fewer than {rules.WINOGRAD_MIN_CHANNELS} channels or filters "
                                                      f"per group (Cg = {g.Cg}, Kg = {g.Kg})")
        if device.type & cl.device_type.GPU:
            small = little_gpu_work(g, device, rules.WINOGRAD_GPU_MIN_FLOP_PER_UNIT)
            if small:
                return False, Reason("winograd-gpu-work", small)
            return True, ""
        if g.kh != g.kw:   # (a 1x7 or 7x1 on CPUs: its launches cost in wall time what they save)
            return False, Reason("winograd-cpu-rows", "on CPUs a 1x7 or 7x1 filter's transforms cost what its "
                                                      "GEMMs save")
        # CPUs on small maps, where the transforms outweigh the GEMMs they shrink
        (mh, mw), t = _side(g), pass_geometry(g, pass_name)
        th, tw = _grid(t, (mh, mw))
        tiles, used = th * tw, t.OH * t.OW / (th * tw * mh * mw)
        if pass_name == "backward_weight" and tiles <= 4:
            return False, Reason("winograd-cpu-tiles", f"on CPUs, a grad-weight over {tiles} tiles per image")
        if tiles <= 4 and t.N * tiles < rules.WINOGRAD_CPU_MIN_TILES:
            return False, Reason("winograd-cpu-tiles", f"on CPUs, {t.N * tiles} tiles in the batch, fewer than "
                                                       f"{rules.WINOGRAD_CPU_MIN_TILES}")
        if used < 0.5:
            return False, Reason("winograd-cpu-tiles", f"on CPUs, tiles of which {used:.0%} of the outputs are used")
        return True, ""

    def __init__(self, g, dtype, device, workspace_limit, per_group=False, gemm="clblast", math="strict", half=False):
        super().__init__(g, dtype, device, workspace_limit, per_group, gemm, math, half)
        self.tile = _side(g)    # outputs per tile along rows and columns
        self.tt = prod(_alpha(g))   # transformed values per tile (TT): 36, or 8 along one axis
        # the kernels' form: 3, 5 or 7 taps along the transformed axes (both, or one of a 1x7 / 7x1)
        self.defines = (dict(FR=g.kh) if g.kh == g.kw else
                        dict(FR=max(g.kh, g.kw), WINO_H=int(g.kh > 1), WINO_W=int(g.kw > 1)))
        # CPU devices whose compiler keeps per-tile kernels scalar, and a column of taps (7x1) on every
        # CPU: the transforms' _rows forms, this many tiles (or channels) per vector. A column's tiles
        # lie one per column, so a vector of them loads as a run of a row; on Intel's runtime, which
        # vectorises the per-tile kernels itself, 7x1 layers' passes measured faster this way than with
        # the per-tile transforms, 1x7 layers' slower
        self.rows = (cpu_vector_width(device, dtype.itemsize) if not device.type & cl.device_type.GPU
                     and (_column(g) or not vectorizes_work_items(device)) else 0)
        # tiles (TH, TW) per image along the pass's output rows and columns
        self.grid = {p: _grid(t, self.tile) for p, t in self.geometry.items()}
        # grad-weight split-K over the tiles: slices of a chunk divide its tiles exactly
        self.split_target = rules.WINOGRAD_GPU_SPLIT_K_TARGET if device.type & cl.device_type.GPU else rules.PARTIALS_TARGET
        self.max_slices = max_slices(self.tt * g.K * g.Cg, g.N * self._tiles_per_image("backward_weight"),
                                     target=self.split_target)
        # grad-weight on clconv's CPU GEMM kernel: V^T in panels where its rule says so, for L tiles
        # per slice over ``count`` GEMMs (gemm_cpu.panels_size)
        self._bt_panels = ((lambda L, count: gemm_cpu.panels_size(device, g.Kg, g.Cg, L, count, dtype.itemsize,
                                                                   b_transp=True)) if self.packs else
                           (lambda L, count: 0))
        # tile rows per piece, and why, for the passes whose one image is above the budget
        self.ranges, self.cuts, self.cut_rule = {}, {}, {}   # (cut_rule: explain()'s rule of the pieces)
        gpu = device.type & cl.device_type.GPU
        self._fit_chunks(workspace_limit,
                         per_image=lambda p, t: self.tt * self._tiles_per_image(p) * (t.C + t.K),   # V, and M (or Z)
                         # U (or dU, and the partial sums)
                         fixed=lambda p, t: self.tt * t.K * t.Cg * (1 + self._partials(p)),
                         widest=lambda p, t: self.tt * max(t.C, t.K) * self._tiles_per_image(p),
                         piece_bytes=lambda p: None if gpu or p == "backward_weight" else rules.WINOGRAD_CPU_PIECE_BYTES)
        at = self.layout["backward_weight"][-1]   # the panels are the layout's last region
        self.panels["backward_weight"] = (at, self.workspace["backward_weight"] - at)

    def _partials(self, pass_name):
        """Partial sums of dU the pass keeps, in units of dU: the most split-K slices, or none."""
        return self.max_slices if pass_name == "backward_weight" and self.max_slices > 1 else 0

    def _layout(self, pass_name, B, rows=None):
        """Offsets of the workspace regions after the first, then its end, for chunks of B
        images (or pieces of ``rows`` tile rows of one image). V (TT, C, P) comes first, at offset 0: it is the GEMM's B operand (see
        gemm.clblast._in_place); then U (TT, K, Ci) and M (TT, K, P), or for grad-weight Z (TT, K, P),
        dU (TT, K, Ci), its partial sums (S, TT, K, Ci) and V^T in panels for clconv's CPU GEMM (or
        nothing), V and Z then stored slice-major (S, TT, channels, P / S); TT = 36, or 8 along one axis."""
        t, (TH, TW) = self.geometry[pass_name], self.grid[pass_name]
        P = B * (TH if rows is None else rows) * TW
        small = self.tt * t.K * t.Cg
        if pass_name == "backward_weight":
            S = self._slices(P) if P else 1
            sizes = [self.tt * t.K * P, small, small * self._partials(pass_name),
                     self._bt_panels(P // S, S * self.tt * t.groups)]
        else:
            sizes = [small, self.tt * t.K * P]
        offsets = [aligned(self.tt * t.C * P)]
        for size, following in zip(sizes, sizes[1:]):   # an empty last region needs no alignment
            offsets.append(aligned(offsets[-1] + size) if following else offsets[-1] + size)
        return (*offsets, offsets[-1] + sizes[-1])

    def _cut(self, pass_name, limit, whole, cache=False):
        """Pieces of R tile rows of one image, R the most that fit ``limit`` elements (then evened
        out over the pieces), grad-weight's split-K partial sums within half of it; ValueError
        when one tile row does not fit. ``cache``: the limit is rules.WINOGRAD_CPU_PIECE_BYTES (beyond U), not the
        budget."""
        t, (TH, TW) = self.geometry[pass_name], self.grid[pass_name]
        if pass_name == "backward_weight":   # split-K's partial sums take at most half the budget
            self.max_slices = max(1, min(self.max_slices, limit // 2 // (self.tt * t.K * t.Cg)))
        fixed = self._layout(pass_name, 1, 0)[-1]
        R = min(TH - 1, max(1, (limit - fixed) // (self.tt * TW * (t.C + t.K))),
                INT32_MAX // (self.tt * TW * max(t.C, t.K)))
        while R > 1 and self._layout(pass_name, 1, R)[-1] > limit:   # the estimate ignores alignment
            R -= 1
        if R < 1 or self._layout(pass_name, 1, R)[-1] > limit:
            super()._cut(pass_name, limit, whole)
        R = -(-TH // -(-TH // R))   # as many pieces, evenly sized
        self.ranges[pass_name] = R
        self.cut_rule[pass_name] = "winograd-cpu-pieces" if cache else "workspace"
        above = (f"above {rules.WINOGRAD_CPU_PIECE_BYTES} beyond the filters' transform: pieces whose workspace stays in a CPU's "
                 "caches" if cache else f"above the limit of {limit * self.dtype.itemsize}")
        self.cuts[pass_name] = (f"image by image in {-(-TH // R)} pieces of {R} of its {TH} tile rows (one image "
                                f"needs {whole * self.dtype.itemsize} workspace bytes, {above})")
        return self._layout(pass_name, 1, R)

    def _pieces(self, pass_name):
        """(first image, images, first tile row, tile rows) of each piece of a pass: chunks of
        whole images, or each image's ranges of tile rows."""
        t, B, (TH, _) = self.geometry[pass_name], self.chunk[pass_name], self.grid[pass_name]
        R = self.ranges.get(pass_name)
        if R is None:
            return [(n0, min(B, t.N - n0), 0, TH) for n0 in range(0, t.N, B)]
        return [(n, 1, th0, min(R, TH - th0)) for n in range(t.N) for th0 in range(0, TH, R)]

    def _tiles_per_image(self, pass_name):
        th, tw = self.grid[pass_name]
        return th * tw

    def describe(self, pass_name):
        t, B = self.geometry[pass_name], self.chunk[pass_name]
        chunks = -(-t.N // B) if t.N else 0
        R = self.ranges.get(pass_name)
        n = B * self._tiles_per_image(pass_name) if R is None else R * self.grid[pass_name][1]
        mnk = (t.Kg, t.Cg, n) if pass_name == "backward_weight" else (t.Kg, n, t.Cg)
        flipped = " of the transposed convolution over grad_output" if pass_name == "backward_input" else ""
        S = self._slices(n) if pass_name == "backward_weight" else 1
        count = f"{S} x {self.tt}" if S > 1 else f"{self.tt}"
        pieces = f"chunk, {chunks} chunk(s) of {B} image(s)" if R is None else f"piece, {self.cuts[pass_name]}"
        text = (f"Winograd {_form(self.g)}{flipped}: transforms + {count} x {t.groups} batched GEMMs per "
                f"{pieces}, per GEMM M={mnk[0]} N={mnk[1]} K={mnk[2] // S}")
        if S > 1:
            text += (f", split-K into {S} slices of the tiles summed in order (a divisor of them, at most "
                     f"{self.max_slices}: partial sums of about {self.split_target} values at most"
                     f"{' on GPUs' if self.split_target < rules.PARTIALS_TARGET else ''}, slices of at least {rules.PARTIALS_MIN_SLICE} "
                     f"tiles, {rules.PARTIALS_MAX_SLICES} slices at most, within the workspace)")
        if R is not None and pass_name == "backward_weight":
            text += ", pieces added in order"
        if self.rows:
            why = ("a column's tiles load as runs of rows" if _column(self.g)
                   else "this CPU compiler keeps per-tile kernels scalar")
            text += f"; transforms in rows, {self.rows} tiles per vector ({why})"
        return text

    def facts(self, pass_name):
        t, B, R = self.geometry[pass_name], self.chunk[pass_name], self.ranges.get(pass_name)
        n = B * self._tiles_per_image(pass_name) if R is None else R * self.grid[pass_name][1]
        S = self._slices(n) if pass_name == "backward_weight" else 1
        rules_ = ("winograd-weight-split",) if S > 1 else ()
        if R is None:
            place = dict(chunks=(-(-t.N // B) if t.N else 0, B))
        else:
            place = dict(pieces=(-(-self.grid[pass_name][0] // R), R, "tile rows"))
            rules_ += (self.cut_rule[pass_name],)
        mnk = (t.Kg, t.Cg, n) if pass_name == "backward_weight" else (t.Kg, n, t.Cg)
        notes = (_form(self.g),) + (("row transforms",) if self.rows else ())
        return dict(gemm=mnk, batch=S * self.tt * t.groups, splits=S, rules=rules_, notes=notes, **place)

    def _slices(self, tiles):
        """Split-K slices of a grad-weight chunk of ``tiles`` tiles."""
        return largest_divisor_at_most(tiles, self.max_slices)

    def _lane_groups(self, tiles):
        """Work-items of a _rows transform over ``tiles`` tiles: VW (self.rows) tiles each."""
        return -(-tiles // self.rows) if self.rows else 0

    def _transform(self, queue, name, idx, gpu_range, rows_range, *args, what):
        """Launch transform ``name``: on GPUs over ``gpu_range`` (a work-item per tile or
        filter, work-groups of up to LOCAL); on CPUs its _rows form over ``rows_range``
        (VW tiles or channels per vector, single work-items)."""
        if self.rows:
            knl = get_kernel(queue.context, "winograd.cl", name + "_rows", self.store, IDX=idx, **self.defines,
                             VW=self.rows)
            launch(queue, knl, rows_range, (1,) * len(rows_range), *args, what=what)
            return
        knl = get_kernel(queue.context, "winograd.cl", name, self.store, IDX=idx, **self.defines)
        local = reduction_work_group(queue.device, min(LOCAL, work_group_limit(knl, queue.device))), 1
        launch(queue, knl, gpu_range, local, *args, what=what)

    def _input(self, queue, idx, pass_name, x, piece, ws, at, slices=1):
        """V (slices, TT, C, P / slices) at ``at`` from the P tiles of a piece of ``x``."""
        t, (n0, nb, th0, rows), TW = self.geometry[pass_name], piece, self.grid[pass_name][1]
        (pt, _), (pl, _) = t.pads
        P = nb * rows * TW
        self._transform(queue, "winograd_input", idx, (P, t.C), (self._lane_groups(P), t.C),
                        x.buf, x.off + n0 * t.C * t.H * t.W, ws, at, nb, t.C, t.H, t.W, rows, TW, th0,
                        pt, pl, *_dilation(t), P // slices, what="Winograd input transform")

    def _tile_args(self, pass_name, piece):
        """The output-side kernels' tile arguments for a piece: images, channels, output size,
        tile rows and columns, first tile row, dilation."""
        t, (_, nb, th0, rows) = self.geometry[pass_name], piece
        return (nb, t.K, t.OH, t.OW, rows, self.grid[pass_name][1], th0) + _dilation(t)

    def _convolve(self, queue, pass_name, x, w, bias, y, ws, what, relu=False):
        """y = conv(x, w) (+ bias) over the pass's geometry, w flipped for grad-input."""
        t = self.geometry[pass_name]
        idx = idx_for(self.dtype, x, w, y, bias, Ref(ws, 0))
        G, Ko, Ci = t.groups, t.Kg, t.Cg
        u, m = self.layout[pass_name]
        self._transform(queue, "winograd_filter", idx, (Ci, t.K), (t.K,), w.buf, w.off, ws, u, t.K, Ko, Ci,
                        int(pass_name == "backward_input"), what=f"{what}: filter transform")
        b = bias if bias is not None else w
        for piece in self._pieces(pass_name):
            n0, nb, _, rows = piece
            P = nb * rows * self.grid[pass_name][1]
            self._input(queue, idx, pass_name, x, piece, ws, 0)
            self._position_gemm(queue, G, self.tt, Ko, P, Ci, Op(ws, u, Ci, Ko * Ci, t.K * Ci),
                                Op(ws, 0, P, Ci * P, t.C * P), Op(ws, m, P, Ko * P, t.K * P), what=what)
            self._transform(queue, "winograd_output", idx, (P, t.K), (self._lane_groups(P), t.K), ws, m,
                            y.buf, y.off + n0 * t.K * t.OH * t.OW, b.buf, b.off, flags(bias, relu),
                            *self._tile_args(pass_name, piece), what=f"{what}: output transform")

    def backward_weight(self, queue, x, dy, dw, ws):
        t = self.g
        idx = idx_for(self.dtype, x, dy, dw, Ref(ws, 0))
        Kg, Cg, TW = t.Kg, t.Cg, self.grid["backward_weight"][1]
        z, du, part, _ = self.layout["backward_weight"]
        n = self.tt * t.K * Cg   # elements of dU
        for i, piece in enumerate(self._pieces("backward_weight")):
            n0, nb, _, rows = piece
            P = nb * rows * TW
            S = self._slices(P)
            L = P // S   # tiles per slice; V and Z slice-major: (S, TT, channels, L)
            self._input(queue, idx, "backward_weight", x, piece, ws, 0, S)
            self._transform(queue, "winograd_grad_output", idx, (P, t.K), (self._lane_groups(P), t.K),
                            dy.buf, dy.off + n0 * t.K * t.OH * t.OW, ws, z, *self._tile_args("backward_weight", piece),
                            L, what="grad-weight (Winograd): grad_output transform")
            # GEMM (slice, t, group) at index (s * TT + t) * G + g: into dU, or its partial sums
            self._position_gemm(queue, t.groups, S * self.tt, Kg, Cg, L, Op(ws, z, L, Kg * L, t.K * L),
                                Op(ws, 0, L, Cg * L, t.C * L, transp=True, pack=self._panels("backward_weight", ws)),
                                Op(ws, du if S == 1 else part, Cg, Kg * Cg, t.K * Cg),
                                Epilogue(beta=1.0 if S == 1 and i > 0 else 0.0), what="grad-weight (Winograd)")
            if S > 1:
                sum_partials(queue, self.dtype, idx, Ref(ws, part), S, n, Ref(ws, du), i > 0,
                             "grad-weight (Winograd): sum of slices")
        self._transform(queue, "winograd_grad_filter", idx, (Cg, t.K), (t.K,), ws, du, dw.buf, dw.off, t.K, Cg,
                        what="grad-weight (Winograd): filter transform")

