"""General algorithm: im2col + one batched GEMM over the groups per chunk.

Workspace for a chunk of B images (see kernels/im2col.cl): col is (C*kh*kw) x (B*P)
with group g owning rows g*Kd ... (g+1)*Kd - 1, and a (K, B*P) buffer T holds
output-shaped data in the same column order. Per chunk:
  forward        im2col; T[g] = W[g] @ col[g]; T -> Y (NCHW, + bias), or on clconv's GPU GEMM
                 kernel Y[g] = W[g] @ col[g] in place (C's columns folded over the images)
  grad-input     dY -> T; col[g] = W[g]^T @ T[g]; col2im (overwrites dX)
  grad-weight    im2col; dY -> T; split-K: partial[s][g] = T[g][:, s] @ col[g][:, s]^T
                 over S slices of the B*P columns, then dW (+)= sum over s, in order
Each GEMM covers all B*P positions of the chunk, and the groups are the batch of
one strided-batched call (or, with per-group queues, one call per group on its
own queue). Nothing is copied per group: every operand is an offset into its
shared buffer. A chunk of one image needs no T: (1, K, P) is already (K, P), so
the forward writes Y in place (its bias filled first), and with one group the
gradients' GEMMs read dY in place. On clconv's GPU GEMM kernel they can for chunks of any size,
its images folded into the GEMM's columns or depth (where: _folds_output, _folds_grad_output and
_folds_grad_output_weight).

On clconv's GPU GEMM kernel, forward and grad-weight of few channels per group (stems), of kernels
no wider than their stride (where col would be a copy of the input) and of little work read the
input through im2col's index arithmetic in place (gemm.Im2colB), writing no col
(docs: rule-im2col-implicit; thresholds in clconv.rules).
"""
import pyopencl as cl

from .. import rules
from ..bias import after_gemm, before_gemm, flags
from ..buffers import Ref, idx_for
from ..device import cpu_vector_width
from ..gemm import Epilogue, Im2colB, Operand as Op, deep, gemm_cpu, gemm_gpu, k_slices, unsplit_note
from ..programs import INT32_MAX, get_kernel, launch
from .base import Algorithm, split_rules
from .partials import fit_slices, largest_divisor_at_most, max_slices, partials_size as _partials, sum_partials

TILE = (64, 4)             # work-group shape of the 2-D layout kernels
COL_CHANNELS = 4           # channels per work-item of im2col's and col2im's GPU forms (kernels/im2col.cl says why)


class Im2col(Algorithm):
    name = "im2col"

    @staticmethod
    def applies(g):
        return True, "general: any shape, stride, padding, dilation and groups"

    def __init__(self, g, dtype, device, workspace_limit, per_group=False, gemm="clblast", math="strict", half=False):
        super().__init__(g, dtype, device, workspace_limit, per_group, gemm, math, half)
        # CPU devices: im2col in rows, this many columns per vector
        self.vw = 0 if device.type & cl.device_type.GPU else cpu_vector_width(device, dtype.itemsize)
        # im2col_rows over rows narrower than one vector: the widest narrower vectors that divide
        # the row, where some do (then every vector is whole, none at the row's edge lane by lane)
        narrow = [v for v in (8, 4) if g.OW < self.vw and v < self.vw and g.OW % v == 0]
        self.im2col_vw = narrow[0] if narrow else self.vw
        itemsize = dtype.itemsize
        self.rows = g.C * g.kh * g.kw
        per_image = (self.rows + g.K) * g.P
        # grad-weight split-K (a chunk's slices divide its positions exactly, so can be shorter);
        # GPUs take up to 4x more, 4x shorter slices: more work-groups for few outputs; CPUs only below
        # rules.IM2COL_CPU_SPLIT_BELOW values
        gpu = bool(device.type & cl.device_type.GPU)
        self.units = device.max_compute_units if gpu else 0   # (_in_place_reason: the work rule is for GPUs only)
        cap = (max_slices(g.K * g.Kd, g.N * g.P, rules.IM2COL_GPU_MIN_SLICE, rules.IM2COL_GPU_MAX_SLICES) if gpu
               else max_slices(g.K * g.Kd, g.N * g.P) if g.K * g.Kd < rules.IM2COL_CPU_SPLIT_BELOW else 1)
        self.max_slices = 1 if self._short(g.N * g.P) else cap   # (no partials where no chunk can split)
        partials = self.max_slices * g.K * g.Kd if self.max_slices > 1 else 0
        # grad-input on clconv's CPU GEMM kernel packs W^T after the rest (gemm_cpu.packed_size);
        # grad-weight's partials and it are never needed at once
        packed = g.K * g.Kd if gemm == "cpu" else 0
        reserved = max(partials, packed)
        self.band = None   # output rows per tile, when one image does not fit the budget (or the cache)
        self.short_chunk, self.unsplit = False, {}   # explain()'s notes of the split rules (below)
        self.in_place = {}   # forward, grad-weight: why it reads im2col in place (_in_place_reason), where it does
        cache_bound = bool(self.vw) and self.rows * g.P * itemsize > rules.IM2COL_CPU_COL_BYTES
        if cache_bound or (per_image + reserved) * itemsize > workspace_limit:   # (the tiles pack nothing)
            self._fit_bands(workspace_limit, (per_image + partials) * itemsize, partials, cache_bound)
            return
        # where forward and grad-weight read im2col in place, on clconv's GPU GEMM kernel: whole images
        # only (its im2col is compiled for them, not for tiles), whose positions, the forward's N, are
        # a 32-bit argument
        if gemm == "gpu" and g.N * g.P <= INT32_MAX:
            reasons = {p: self._in_place_reason(p) for p in ("forward", "backward_weight")}
            self.in_place = {p: why for p, why in reasons.items() if why is not None}
        # clconv's CPU GEMM kernel packs B (col, T) in panels after the rest where its rule says so
        # (gemm_cpu.panels_size): per image at most B's rows by its positions, and a block of
        # columns more per matrix
        panels = ((lambda m, n, k: gemm_cpu.panels_size(device, m, n, k, g.groups, itemsize)) if self.packs else
                  (lambda m, n, k: 0))
        b_rows = (max(self.rows if gemm_cpu.panels_wanted(g.Kg, g.Kd) else 0,
                      g.K if gemm_cpu.panels_wanted(g.Kd, g.Kg) else 0) if self.packs else 0)
        with_panels, reserved_panels = per_image + b_rows * g.P, b_rows * 2 * gemm_cpu.vector_width(device, itemsize)
        if (with_panels + reserved + reserved_panels) * itemsize > workspace_limit:   # then without panels
            panels, with_panels, reserved_panels = (lambda m, n, k: 0), per_image, 0
        reserved += reserved_panels
        # images per chunk: as many as the budget allows (the forward on clconv's CPU GEMM kernel
        # takes one where an image's positions alone make a wide GEMM: see rules.IM2COL_CPU_IMAGE_POSITIONS)
        self.chunk = max(1, min(g.N, (workspace_limit // itemsize - reserved) // with_panels, INT32_MAX // g.P))
        per_unit = 2 * g.K * g.Kd * g.P / max(1, device.max_compute_units)   # an image's GEMM FLOP per unit
        self.forward_chunk = (1 if gemm == "cpu" and g.P >= rules.IM2COL_CPU_IMAGE_POSITIONS and per_unit >= rules.IM2COL_CPU_IMAGE_WORK
                              else self.chunk)
        # slices of a full chunk, and of a shorter last one (which can split into more)
        self.slices = self._slice_count(device, self.chunk * g.P)
        # explain()'s note where rules.IM2COL_GPU_MIN_SPLIT_POSITIONS alone keeps a full chunk whole
        self.short_chunk = (self.slices == 1 and self._short(self.chunk * g.P)
                            and self._slice_count(device, self.chunk * g.P, cap, bound=False) > 1)
        last = g.N % self.chunk
        self.last_slices = self._slice_count(device, last * g.P) if last else self.slices
        most = max(self.slices, self.last_slices)
        wgrad_extra = most * g.K * g.Kd if most > 1 else 0
        # forward and grad-input split-K on GPUs, where a chunk's grid of products leaves compute
        # units idle (few filters or channels over small images): S partial results after col
        # and T, as many as the budget holds, summed in order
        # (the forward's long products on clconv's GPU GEMM kernel's deep tile: gemm_gpu.deep)
        room, ld = workspace_limit // itemsize - per_image * self.chunk, self.chunk * g.P
        self.deep = not self._implicit("forward") and deep(device, gemm, g.Kg, ld, g.Kd, g.groups, itemsize)
        split = lambda m, k, outputs, in_deep=False: fit_slices(k, k_slices(device, gemm, m, ld, k, g.groups,
                                                                            itemsize, deep=in_deep),
                                                                room // (outputs * ld))
        self.split = {"backward_input": split(g.Kd, g.Kg, self.rows)}
        # explain()'s note per pass where MIN_SPLIT_DEPTH alone keeps its products whole
        self.unsplit = {"backward_input": unsplit_note(device, gemm, g.Kd, ld, g.Kg, g.groups, itemsize)}
        self.packed_at = per_image * self.chunk + _partials(self.split["backward_input"], self.rows * ld)
        if self._implicit("forward"):
            # the implicit forward is one grid over all images, into Y; with one group, where that
            # grid leaves compute units idle, cut into slices of whole channels (an offset into the
            # input, which its im2col B reads), their partial outputs summed in order
            outputs = g.N * g.K * g.P
            want = k_slices(device, gemm, g.K, g.N * g.P, g.Kd, 1, itemsize) if g.groups == 1 else 1
            self.split["forward"] = fit_slices(g.C, want, workspace_limit // (max(1, outputs) * itemsize))
            self.unsplit["forward"] = (unsplit_note(device, gemm, g.K, g.N * g.P, g.Kd, 1, itemsize)
                                       if g.groups == 1 else "")
            forward = _partials(self.split["forward"], outputs)
        else:
            self.split["forward"] = split(g.Kg, g.Kd, g.K, self.deep)
            self.unsplit["forward"] = unsplit_note(device, gemm, g.Kg, ld, g.Kd, g.groups, itemsize)
            forward = per_image * self.forward_chunk + _partials(self.split["forward"], g.K * ld)
        # B in panels (of the unsplit GEMMs) after the rest: where the sizes are 0, not packed
        self._reserve_panels("forward", forward, panels(g.Kg, self.forward_chunk * g.P, g.Kd), workspace_limit)
        self._reserve_panels("backward_input", self.packed_at + packed, panels(g.Kd, ld, g.Kg), workspace_limit)
        # grad-weight: col^T in panels after the rest (the GEMM's K, positions per slice, short)
        bt = (gemm_cpu.panels_size(device, g.Kg, g.Kd, self.chunk * g.P // self.slices, g.groups * self.slices,
                                   itemsize, b_transp=True) if self.packs else 0)
        self._reserve_panels("backward_weight", per_image * self.chunk + wgrad_extra, bt, workspace_limit)
        # float16 arrays read and written as they are where each launch of a pass reads or writes
        # them in clconv's GPU GEMM kernel or im2col's GPU forms (col, T and split-K partial sums stay
        # float32): the forward into Y, grad-input reading dY in place, grad-weight reading dY in
        # place in one chunk (chunks would round dW between them)
        if half and gemm == "gpu":
            gathers = not self.vw   # (im2col's and col2im's GPU forms)
            whole = {"forward": self._implicit("forward") or gathers and self._folds_output(),
                     "backward_input": gathers and self._folds_grad_output(),
                     "backward_weight": (self._folds_grad_output_weight() and self.chunk >= g.N
                                         and (gathers or self._implicit("backward_weight")))}
            self.half_passes = frozenset(p for p, yes in whole.items() if yes)

    def _short(self, positions):
        """Whether clconv's GPU GEMM kernel keeps a grad-weight product of ``positions`` whole
        (rules.IM2COL_GPU_MIN_SPLIT_POSITIONS)."""
        return self.gemm == "gpu" and positions < rules.IM2COL_GPU_MIN_SPLIT_POSITIONS

    def _slice_count(self, device, positions, limit=None, bound=True):
        """Grad-weight's split-K slices of a chunk's ``positions``: the most, up to ``limit``
        (max_slices where not given; on
        clconv's GPU GEMM kernel, up to the fewest that fill the device: rules.IM2COL_GPU_FILL_WAVES), that
        divide them exactly; on that kernel, whose folded grad_output (see
        _folds_grad_output_weight) is read four-wide where its slices are whole vectors, the most of
        lengths a multiple of 4 where they are at least half as many (RegNet's C48 56x56 1x1
        stride-2 projection at batch 32: 224 slices of 112 positions, not 256 of 98); with
        ``bound``, one on that kernel below rules.IM2COL_GPU_MIN_SPLIT_POSITIONS (_short). (The tiles of
        _fit_bands take their own count of max_slices, bounded likewise.)"""
        g = self.g
        limit = self.max_slices if limit is None else limit
        if bound and self._short(positions):
            return 1
        if self.gemm == "gpu":   # (slices of at least positions / max_slices: no longer count is taken)
            limit = min(limit, k_slices(device, self.gemm, g.Kg, g.Kd, positions, g.groups, self.dtype.itemsize,
                                        min_slice=max(1, positions // limit), waves=rules.IM2COL_GPU_FILL_WAVES,
                                        tile=gemm_gpu.TILES[0][0], min_depth=0))
        most = largest_divisor_at_most(positions, limit)
        if self.gemm == "gpu" and g.P % 4 == 0:
            whole = largest_divisor_at_most(positions // 4, limit)
            if 2 * whole >= most:
                return whole
        return most

    def _fit_bands(self, workspace_limit, whole, partials, cache_bound=False):
        """One image's workspace (``whole`` bytes) is above the budget, or on a CPU its col above
        rules.IM2COL_CPU_COL_BYTES (``cache_bound``): the passes run image by image over tiles of ``band``
        output rows, as evenly sized as the budget allows, each tile's col (rows x band * OW, at
        most rules.IM2COL_CPU_COL_BYTES where cache-bound, or one position's column where that is more) the
        workspace; where one row's col is above the budget too, over tiles of ``cols`` columns of
        one row. Output, grad_output and grad-weight are read and written in place. Grad-weight
        adds the tiles into grad_weight in order: on GPUs each tile's positions cut into split-K
        slices (its ``partials`` after col) and summed; on CPUs each tile's GEMM adds its product
        itself (unsplit: split-K slices per tile measured slower on CPUs)."""
        g, itemsize = self.g, self.dtype.itemsize
        column = self.rows * itemsize       # col of one output position
        if self.vw:
            self.max_slices = 1
        else:   # split-K's partial sums take at most half the budget, and leave room for one position
            room = min(workspace_limit // 2, workspace_limit - column) // itemsize
            self.max_slices = max(1, min(self.max_slices, room // (g.K * g.Kd)))
        partials = self.max_slices * g.K * g.Kd if self.max_slices > 1 else 0
        fits = (workspace_limit - partials * itemsize) // column   # output positions per tile
        cache_bound = cache_bound and rules.IM2COL_CPU_COL_BYTES // column < fits   # (else the budget decides)
        if cache_bound:
            fits = max(1, rules.IM2COL_CPU_COL_BYTES // column)
        if fits < 1:
            raise ValueError(f"one output position of input {list(g.input_shape)} with weight "
                             f"{list(g.weight_shape)} needs {column + partials * itemsize} workspace bytes, above "
                             f"the limit of {workspace_limit} bytes (one image needs {whole})")
        if fits >= g.OW:   # whole rows
            tiles = -(-g.OH // min(g.OH, fits // g.OW))
            self.band, self.cols = -(-g.OH // tiles), g.OW
            shape = f"{tiles} tiles of {self.band} output rows per image"
        else:              # pieces of one row
            per_row = -(-g.OW // fits)
            self.band, self.cols = 1, -(-g.OW // per_row)
            shape = (f"{g.OH * per_row} tiles of {self.cols} output columns of one row per image ({per_row} per "
                     f"row: one row's col is above the budget too)")
        self.chunk, self.forward_chunk, self.slices, self.last_slices = 1, 1, 1, 1
        self.band_rule = "im2col-cpu-col-bytes" if cache_bound else "workspace"   # (explain()'s)
        self.split, self.deep = {"forward": 1, "backward_input": 1}, False
        self.tiling = (f"{shape} (one image's col is {self.rows * g.P * itemsize} bytes, above {rules.IM2COL_CPU_COL_BYTES}: tiles "
                       "whose col stays in a CPU's caches)" if cache_bound else
                       f"{shape} (one image needs {whole} workspace bytes, above the limit of {workspace_limit})")
        col = self.rows * self.band * self.cols
        self.workspace = {"forward": col, "backward_input": col, "backward_weight": col + partials}

    def _bands(self):
        """(first output row, rows, first output column, columns) of each tile of an image."""
        g = self.g
        return [(oy0, min(self.band, g.OH - oy0), ox0, min(self.cols, g.OW - ox0))
                for oy0 in range(0, g.OH, self.band) for ox0 in range(0, g.OW, self.cols)]

    def describe(self, pass_name):
        g, B = self.g, self.chunk
        if self.band:
            mnk = {"forward": (g.Kg, "tile", g.Kd), "backward_input": (g.Kd, "tile", g.Kg),
                   "backward_weight": (g.Kg, g.Kd, "tile")}[pass_name]
            how = {"forward": "output rows written in place", "backward_input": "col2im adding each tile's "
                   "input rows in order", "backward_weight": "tiles summed in order into grad_weight"}[pass_name]
            return (f"im2col + GEMM batched over {g.groups} group(s), image by image in {self.tiling}; per GEMM "
                    f"M={mnk[0]} N={mnk[1]} K={mnk[2]} (tile = {self.band * self.cols} positions, fewer in the last); "
                    f"{how}")
        if pass_name == "forward" and self._implicit("forward"):
            S = self.split["forward"]
            return (f"GEMM reading im2col in place (clconv's GPU GEMM kernel, no col; {self.in_place['forward']}), "
                    f"one per group ({g.groups}), "
                    f"M={g.Kg} N={g.N * g.P} (every image's positions) K={g.Kd}"
                    + (f", split-K into {S} slices of {g.C // S} channels (K={g.Kd // S}) summed in order (the grid "
                       "alone would leave the GPU's compute units idle)" if S > 1 else
                       self.unsplit["forward"] + ", into the output"))
        if pass_name == "forward":
            B = self.forward_chunk
        chunks = -(-g.N // B) if g.N else 0
        mnk = {"forward": (g.Kg, B * g.P, g.Kd), "backward_input": (g.Kd, B * g.P, g.Kg),
               "backward_weight": (g.Kg, g.Kd, B * g.P)}[pass_name]
        implicit = pass_name == "backward_weight" and self._implicit(pass_name)
        text = ((f"GEMM reading im2col in place (clconv's GPU GEMM kernel, no col; {self.in_place[pass_name]})"
                 if implicit else "im2col + GEMM")
                + f" batched over {g.groups} group(s), {chunks} chunk(s) of {B} image(s), "
                f"per GEMM M={mnk[0]} N={mnk[1]} K={mnk[2]}")
        if pass_name == "forward" and B < self.chunk:
            text += (f" (one image per chunk on clconv's CPU GEMM, from {rules.IM2COL_CPU_IMAGE_POSITIONS} positions and "
                     f"{rules.IM2COL_CPU_IMAGE_WORK / 1e6:g} MFLOP per compute unit and image: its GEMM writes the output in place, "
                     "no layout copy)")
        if pass_name == "forward" and self._folds_output():
            text += ", the output written in place (its images' positions folded into the GEMM's columns, no layout copy)"
        if pass_name == "backward_input" and self._folds_grad_output():
            text += ", grad_output read in place (its images' positions folded into the GEMM's columns, no layout copy)"
        if pass_name == "backward_weight" and self._folds_grad_output_weight():
            text += ", grad_output read in place (its images' positions folded into the GEMM's depth, no layout copy)"
        if pass_name == "backward_weight" and self.slices > 1:
            text += f", split-K into {self.slices} slices summed in order"
            if self.gemm == "gpu":
                text += (f" (a divisor of the positions, slices of whole vectors of 4 preferred, up to the fewest "
                         f"giving {rules.IM2COL_GPU_FILL_WAVES} work-groups of 128x128 per compute unit and at most "
                         f"{self.max_slices})")
        elif pass_name == "backward_weight" and self.short_chunk:
            text += (f", unsplit ({self.chunk * g.P} positions a chunk, below {rules.IM2COL_GPU_MIN_SPLIT_POSITIONS}: a short "
                     "product, whose partial sums would cost a second launch)")
        elif self.split.get(pass_name, 1) > 1:
            text += (f", split-K into {self.split[pass_name]} slices of K={mnk[2] // self.split[pass_name]} summed in "
                     "order (the grid alone would leave the GPU's compute units idle)")
        else:
            text += self.unsplit.get(pass_name, "")
        if pass_name == "forward" and self.deep:
            text += ", " + gemm_gpu.deep_note()
        return text

    def facts(self, pass_name):
        g, gpu = self.g, self.gemm == "gpu"
        if self.band:
            tile = self.band * self.cols
            mnk = {"forward": (g.Kg, tile, g.Kd), "backward_input": (g.Kd, tile, g.Kg),
                   "backward_weight": (g.Kg, g.Kd, tile)}[pass_name]
            rows = self.cols == g.OW
            pieces = ((-(-g.OH // self.band), self.band, "output rows") if rows else
                      (g.OH * -(-g.OW // self.cols), self.cols, "output columns"))
            return dict(gemm=mnk, batch=g.groups, pieces=pieces,
                        splits=1 if self._short(tile) else largest_divisor_at_most(tile, self.max_slices),
                        rules=(self.band_rule,))
        if pass_name == "forward" and self._implicit("forward"):
            S = self.split["forward"]
            return dict(gemm=(g.Kg, g.N * g.P, g.Kd), batch=S if S > 1 else g.groups, chunks=(1, g.N), splits=S,
                        rules=("im2col-implicit",) + split_rules(S, self.unsplit["forward"]),
                        notes=("implicit im2col", "output in place"))
        B = self.forward_chunk if pass_name == "forward" else self.chunk
        mnk = {"forward": (g.Kg, B * g.P, g.Kd), "backward_input": (g.Kd, B * g.P, g.Kg),
               "backward_weight": (g.Kg, g.Kd, B * g.P)}[pass_name]
        rules_, notes = [], []
        if self.chunk < g.N:
            rules_.append("workspace")
        if pass_name == "forward" and B < self.chunk:
            rules_.append("im2col-cpu-image-chunks")
        if pass_name == "backward_weight" and self._implicit(pass_name):
            rules_.append("im2col-implicit")
            notes.append("implicit im2col")
        if (pass_name == "forward" and self._folds_output() or pass_name == "backward_input"
                and self._folds_grad_output() or pass_name == "backward_weight" and self._folds_grad_output_weight()):
            notes.append("output in place" if pass_name == "forward" else "grad_output in place")
        if pass_name == "backward_weight":
            S = self.slices
            if S > 1 or self.short_chunk:
                rules_.append("im2col-gpu-split-positions" if gpu else "im2col-cpu-split")
        else:
            S = self.split[pass_name]
            rules_ += split_rules(S, self.unsplit.get(pass_name))
        if pass_name == "forward" and self.deep:
            rules_.append("gemm-deep-tile")
            notes.append("deep tile")
        return dict(gemm=mnk, batch=S * g.groups, chunks=(-(-g.N // B) if g.N else 0, B), splits=S, rules=tuple(rules_), notes=tuple(notes))

    def _folds_output(self):
        """Whether the forward's GEMM writes Y as it is (clconv's GPU GEMM kernel), its images'
        positions folded into the columns, not T and the layout kernel (split-K: with one group,
        whose slices are a grid of whole outputs), which measured faster than the layout copy."""
        return self.gemm == "gpu" and not self.band and (self.split["forward"] == 1 or self.g.groups == 1)

    def _folds_grad_output(self):
        """Whether grad-input's GEMM reads dY as it is, its images' positions folded into the
        columns (clconv's GPU GEMM kernel, unsplit), not through the layout copy T."""
        return self.gemm == "gpu" and self.split["backward_input"] == 1 and not self.band

    def _folds_grad_output_weight(self):
        """Whether grad-weight's GEMM reads dY as it is (clconv's GPU GEMM kernel, whole images),
        its images' positions folded into the depth, not through the layout copy T: where it reads
        dY four-wide as it would T (positions and every chunk's split-K slices whole vectors, which
        _slice_count prefers), or value by value where the GEMM's N (taps per group) is at most
        rules.IM2COL_SCALAR_FOLD_MAX_TAPS, so that each work-group row reads dY once or twice."""
        g = self.g
        slices = (self.chunk * g.P // self.slices, (g.N % self.chunk or self.chunk) * g.P // self.last_slices)
        vectors = g.P % 4 == 0 and all(L % 4 == 0 for L in slices)
        return self.gemm == "gpu" and not self.band and (vectors or g.Kd <= rules.IM2COL_SCALAR_FOLD_MAX_TAPS)

    def _implicit(self, pass_name):
        """Whether ``pass_name`` (forward or grad-weight) reads im2col in place, on the GPU GEMM
        kernel, as decided when the plan was made (``in_place``, :meth:`_in_place_reason`)."""
        return pass_name in self.in_place

    def _in_place_reason(self, pass_name):
        """Why ``pass_name`` would read im2col in place, as explain() says it, or None: few
        channels, or taps that do not overlap (a kernel no wider than its stride: 1x1 stride 2,
        patchify layers), whose col would be a copy of the input or of part of it; or on GPUs too
        little work for the im2col launch to pay (rules.IM2COL_GPU_IMPLICIT_FLOP_PER_UNIT)."""
        g = self.g
        if g.Cg <= rules.IM2COL_IMPLICIT_MAX_CHANNELS:
            return f"{g.Cg} channel(s) per group"
        if all(s >= (k - 1) * d + 1 for s, k, d in zip(g.stride, (g.kh, g.kw), g.dilation)):
            return "taps apart: col would be a copy of the input"
        per_unit = rules.IM2COL_GPU_IMPLICIT_FLOP_PER_UNIT[pass_name]
        if self.units and g.flops() <= per_unit * self.units:
            return (f"{g.flops() / 1e6:.1f} MFLOP a pass, at most {per_unit * self.units / 1e6:.0f} "
                    f"({per_unit / 1e6:g} per compute unit): the im2col launch would cost more than the GEMM's gathers")
        return None

    def _im2col_b(self, pj, images):
        """The input as the GEMM's im2col operand, slices of pj columns, matrices over ``images``."""
        g = self.g
        (pt, _), (pl, _) = g.pads
        xs = g.C * g.H * g.W
        return Im2colB(g.H, g.W, xs, g.P, g.OW, g.kh, g.kw, *g.stride, pt, pl, *g.dilation, pj,
                            (images - 1) * xs + g.Cg * g.H * g.W)

    def _geometry_args(self, B, tile=None):
        """The layout kernels' geometry arguments for B images, or for a ``tile`` (oy0, rows, ox0,
        cols) of one image: a convolution of those outputs, its top and left padding shifted."""
        g = self.g
        (pt, _), (pl, _) = g.pads
        oy0, rows, ox0, cols = tile or (0, g.OH, 0, g.OW)
        return ((B, g.C, g.H, g.W, g.kh, g.kw, rows, cols) + g.stride
                + (pt - oy0 * g.stride[0], pl - ox0 * g.stride[1]) + g.dilation)

    def _kernel(self, queue, name, idx):
        return get_kernel(queue.context, "im2col.cl", name, self.dtype, IDX=idx)

    def _gpu_kernel(self, queue, name, idx, geometry, half=False):
        """The GPU form of im2col or col2im (``name``) for ``geometry`` (_geometry_args): taps,
        strides and dilations built in, COL_CHANNELS channels per work-item (kernels/im2col.cl
        says why); ``half``: the image side stored as float16."""
        _, _, _, _, kh, kw, _, _, sh, sw, _, _, dh, dw = geometry
        return get_kernel(queue.context, "im2col.cl", name, self.dtype, IDX=idx, COL_KH=kh, COL_KW=kw, COL_SH=sh,
                          COL_SW=sw, COL_DH=dh, COL_DW=dw, COL_CHANNELS=COL_CHANNELS,
                          **({"X_HALF": 1} if half else {}))

    def _im2col(self, queue, idx, x, n0, B, ws, col, tile=None, half=False):
        """col of images n0 ... n0+B-1 (or of a ``tile`` of image n0, see _geometry_args): on GPUs a
        work-item per (image, output pixel) and COL_CHANNELS channels; on CPUs im2col_rows, a
        work-item per (output row, channel) writing VW columns at a time. ``half``: x is float16
        (GPU form)."""
        g = self.g
        geometry = self._geometry_args(B, tile)
        _, _, _, _, _, _, rows, cols, _, _, pt, pl, _, _ = geometry
        x_at = x.off + n0 * g.C * g.H * g.W
        assert not (half and self.vw), "float16 images are gathered by the GPU form only"
        if self.vw:
            knl = get_kernel(queue.context, "im2col.cl", "im2col_rows", self.dtype, IDX=idx, VW=self.im2col_vw)
            launch(queue, knl, (B * rows, g.C), (1, 1), x.buf, x_at, ws, col, *geometry, what="im2col")
            return
        knl = self._gpu_kernel(queue, "im2col", idx, geometry, half)
        launch(queue, knl, (B * rows * cols, -(-g.C // COL_CHANNELS)), (64, 1), x.buf, x_at, ws, col, B, g.C, g.H,
               g.W, rows, cols, pt, pl, what="im2col")

    def _col2im(self, queue, idx, ws, col, dx, n0, B, first, last, accumulate, tile=None, half=False):
        """Input rows first ... last-1 of images n0 ... n0+B-1 from col at ``col`` (or of image n0
        from a ``tile``'s col), added to dx with ``accumulate``: on GPUs a work-item per (input
        pixel, channel, image); on CPUs col2im_rows, a work-item per (input row, channel) summing
        VW pixels at a time. ``half``: dx is float16 (GPU form)."""
        g = self.g
        geometry = self._geometry_args(B, tile)
        dx_at, what = dx.off + n0 * g.C * g.H * g.W, "col2im (tile)" if tile else "col2im"
        assert not (half and self.vw), "float16 images are gathered by the GPU form only"
        if self.vw:
            knl = get_kernel(queue.context, "im2col.cl", "col2im_rows", self.dtype, IDX=idx, VW=self.vw)
            launch(queue, knl, (B * (last - first), g.C), (1, 1), ws, col, dx.buf, dx_at, *geometry, first * g.W,
                   int(accumulate), what=what)
            return
        _, _, _, _, _, _, rows, cols, _, _, pt, pl, _, _ = geometry
        knl = self._gpu_kernel(queue, "col2im", idx, geometry, half)
        launch(queue, knl, ((last - first) * g.W, -(-g.C // COL_CHANNELS), B), (64, 1, 1), ws, col, dx.buf, dx_at,
               B, g.C, g.H, g.W, rows, cols, pt, pl, first * g.W, int(accumulate), what=what)

    def _to_columns(self, queue, idx, dy, n0, B, ws, t):
        """dY of images n0 ... n0+B-1 (B, K, P) as (K, B*P): (buffer, offset) of T, or of dY
        itself for one image of one group (with more groups, dY at an offset CLBlast might
        misread would take one GEMM per group: see gemm.clblast._in_place)."""
        g = self.g
        if B == 1 and g.groups == 1:
            return dy.buf, dy.off + n0 * g.K * g.P
        self._layout(queue, idx, "nchw_to_cnhw", B, (dy.buf, dy.off + n0 * g.K * g.P, ws, t, B, g.K, g.P),
                     "grad_output layout")
        return ws, t

    def _layout(self, queue, idx, name, B, args, what):
        """Layout kernel ``name`` (nchw_to_cnhw, cnhw_to_nchw) over B images: on GPUs a work-item
        per value; on CPUs its row form, a work-item per (image, channel) plane."""
        g = self.g
        if self.vw:
            launch(queue, self._kernel(queue, name + "_rows", idx), (B * g.K,), (1,), *args, what=what)
        else:
            launch(queue, self._kernel(queue, name, idx), (B * g.P, g.K), TILE, *args, what=what)

    def forward(self, queue, x, w, bias, y, ws, relu=False):
        g, B = self.g, self.forward_chunk
        Kg, Kd = g.Kg, g.Kd
        if self.band:
            return self._forward_tiles(queue, x, w, bias, y, ws, relu)
        if self._implicit("forward"):   # one GEMM per group over all images' positions, into Y
            store, h = self._store("forward"), "forward" in self.half_passes
            beta = before_gemm(queue, store, y, bias, g.N, g.K, g.P, relu)
            S, plane, cols = self.split["forward"], g.H * g.W, g.N * g.P
            if S > 1:   # slice s: W[:, s-th Kd/S columns] @ im2col of the s-th C/S channels; one group
                ks, n = Kd // S, g.N * g.K * g.P
                self._gemm(queue, g.K, cols, ks, Op(w.buf, w.off, Kd, ks, half=h),
                           Op(x.buf, x.off, 0, g.C // S * plane, im2col=self._im2col_b(0, g.N), half=h),
                           Op(ws, 0, g.P, n, g.K * g.P, fold=g.P), slices=S, what="forward (implicit im2col, split-K)")
                sum_partials(queue, store, idx_for(self.dtype, x, w, y, bias, Ref(ws, 0)), Ref(ws, 0), S, n, y,
                             beta != 0, "forward (implicit im2col, sum of slices)", float_parts=h)
            else:
                self._gemm(queue, Kg, cols, Kd, Op(w.buf, w.off, Kd, Kg * Kd, half=h),
                           Op(x.buf, x.off, 0, g.Cg * plane, im2col=self._im2col_b(0, g.N), half=h),
                           Op(y.buf, y.off, g.P, Kg * g.P, g.K * g.P, fold=g.P, half=h), Epilogue(beta=beta),
                           what="forward (implicit im2col)")
            after_gemm(queue, store, y, bias, g.N, g.K, g.P, relu)
            return
        idx = idx_for(self.dtype, x, w, y, bias, Ref(ws, 0))
        b = bias if bias is not None else w
        folds = self._folds_output()
        S, store, h = self.split["forward"], self._store("forward"), "forward" in self.half_passes
        for n0 in range(0, g.N, B):
            nb = min(B, g.N - n0)
            col, ld = 0, nb * g.P
            self._im2col(queue, idx, x, n0, nb, ws, col, half=h)
            # one image, or the images folded into the GEMM's columns: straight into Y (bias and
            # ReLU around the GEMM); else into T, then the layout kernel, which applies them
            in_place = nb == 1 or folds
            assert in_place or not h, "float16 outputs are written in place"
            out = Ref(y.buf, y.off + n0 * g.K * g.P) if in_place else Ref(ws, self.rows * ld)
            beta = before_gemm(queue, store, out, bias, nb, g.K, g.P, relu) if in_place else 0.0
            fold = g.P if folds else 0   # (C's column b * P + p: image b, position p)
            c_ld = g.P if in_place else ld   # C's rows: Y's, or T's
            if S > 1:   # slice s: W[g][:, s-th Kd/S rows] @ col[g][those rows], partials after col and T
                ks, part = Kd // S, (self.rows + g.K) * B * g.P
                if folds:   # (one group: the slices are the grid's products along i, each a whole C)
                    self._gemm(queue, Kg, ld, ks, Op(w.buf, w.off, Kd, ks, half=h), Op(ws, col, ld, ks * ld),
                               Op(ws, part, g.P, g.K * ld, g.K * g.P, fold=fold), slices=S, deep=self.deep,
                               what="forward (split-K)")
                else:
                    self._gemm(queue, Kg, ld, ks, Op(w.buf, w.off, Kd, Kg * Kd, ks), Op(ws, col, ld, Kd * ld, ks * ld),
                               Op(ws, part, ld, Kg * ld, g.K * ld), images=S, deep=self.deep,
                               what="forward (split-K)")
                sum_partials(queue, store, idx, Ref(ws, part), S, g.K * ld, out, beta != 0,
                             "forward (sum of slices)", float_parts=h)
            else:
                self._gemm(queue, Kg, ld, Kd, Op(w.buf, w.off, Kd, Kg * Kd, half=h),
                           Op(ws, col, ld, Kd * ld, pack=self._panels("forward", ws)),
                           Op(out.buf, out.off, c_ld, Kg * c_ld, g.K * g.P, fold=fold, half=h), Epilogue(beta=beta),
                           deep=self.deep, what="forward")
            if in_place:
                after_gemm(queue, store, out, bias, nb, g.K, g.P, relu)
            else:
                self._layout(queue, idx, "cnhw_to_nchw", nb, (ws, out.off, y.buf, y.off + n0 * g.K * g.P, b.buf, b.off,
                                                               flags(bias, relu), nb, g.K, g.P), "output layout")

    def backward_input(self, queue, w, dy, dx, ws):
        g, B = self.g, self.chunk
        if self.band:
            return self._input_tiles(queue, w, dy, dx, ws)
        idx = idx_for(self.dtype, w, dy, dx, Ref(ws, 0))
        Kg, Kd, h = g.Kg, g.Kd, "backward_input" in self.half_passes
        for n0 in range(0, g.N, B):
            nb = min(B, g.N - n0)
            col, ld = g.K * nb * g.P, nb * g.P
            S = self.split["backward_input"]
            if self._folds_grad_output():   # dY read in place: column b * P + p is (image b, position p)
                self._gemm(queue, Kd, ld, Kg, Op(w.buf, w.off, Kd, Kg * Kd, transp=True, half=h),
                           Op(dy.buf, dy.off + n0 * g.K * g.P, g.P, Kg * g.P, g.K * g.P, fold=g.P, half=h),
                           Op(ws, col, ld, Kd * ld), what="grad-input (grad_output read in place)")
                self._col2im(queue, idx, ws, col, dx, n0, nb, 0, g.H, False, half=h)
                continue
            t_buf, t = self._to_columns(queue, idx, dy, n0, nb, ws, 0)
            if S > 1:   # slice s: W[g][s-th Kg/S filters]^T @ T[g][those filters], partials after T and col
                ks, part = Kg // S, (g.K + self.rows) * B * g.P
                self._gemm(queue, Kd, ld, ks, Op(w.buf, w.off, Kd, Kg * Kd, ks * Kd, transp=True),
                           Op(t_buf, t, ld, Kg * ld, ks * ld), Op(ws, part, ld, Kd * ld, self.rows * ld), images=S,
                           what="grad-input (split-K)")
                sum_partials(queue, self.dtype, idx, Ref(ws, part), S, self.rows * ld, Ref(ws, col), False,
                             "grad-input (sum of slices)")
            else:
                self._gemm(queue, Kd, ld, Kg, Op(w.buf, w.off, Kd, Kg * Kd, transp=True, pack=Op(ws, self.packed_at, 0)),
                           Op(t_buf, t, ld, Kg * ld, pack=self._panels("backward_input", ws)),
                           Op(ws, col, ld, Kd * ld), what="grad-input")
            self._col2im(queue, idx, ws, col, dx, n0, nb, 0, g.H, False)

    def backward_weight(self, queue, x, dy, dw, ws):
        g, B = self.g, self.chunk
        if self.band:
            return self._weight_tiles(queue, x, dy, dw, ws)
        idx = idx_for(self.dtype, x, dy, dw, Ref(ws, 0))
        Kg, Kd, h = g.Kg, g.Kd, "backward_weight" in self.half_passes
        folds = self._folds_grad_output_weight()   # (decided once per call, not per chunk)
        for n0 in range(0, g.N, B):
            nb = min(B, g.N - n0)
            ld = nb * g.P
            col, part = 0, (self.rows + g.K) * ld
            S = self.slices if nb == B else self.last_slices
            L = ld // S   # slice length: S slices cover the nb * P columns exactly
            # B: col (Kd x ld per group, slices L apart), or the input read through im2col in
            # place (its leading dimension unused; the slices are im2col's)
            panels = self._panels("backward_weight", ws)
            if self._implicit("backward_weight"):
                b = Op(x.buf, x.off + n0 * g.C * g.H * g.W, ld, g.Cg * g.H * g.W, transp=True, pack=panels,
                       im2col=self._im2col_b(L if S > 1 else 0, nb), half=h)
            else:
                self._im2col(queue, idx, x, n0, nb, ws, col, half=h)
                b = Op(ws, col, ld, Kd * ld, L, transp=True, pack=panels)
            # A: dY read in place, its images' positions folded into the depth (the slices run on
            # through it), or T, its layout copy
            if folds:
                a = Op(dy.buf, dy.off + n0 * g.K * g.P, g.P, Kg * g.P, g.K * g.P, fold=g.P, half=h)
            else:
                t_buf, t = self._to_columns(queue, idx, dy, n0, nb, ws, self.rows * ld)
                a = Op(t_buf, t, ld, Kg * ld, L)
            if S == 1:
                self._gemm(queue, Kg, Kd, ld, a, b, Op(dw.buf, dw.off, Kd, Kg * Kd, half=h),
                           Epilogue(beta=0.0 if n0 == 0 else 1.0), what="grad-weight")
                continue
            self._gemm(queue, Kg, Kd, L, a, b, Op(ws, part, Kd, Kg * Kd, g.K * Kd), images=S,
                       what="grad-weight (split-K)")
            n = g.K * Kd
            sum_partials(queue, self._store("backward_weight"), idx, Ref(ws, part), S, n, dw, n0 > 0,
                         "grad-weight (sum of slices)", float_parts=h)

    # -- one image at a time, in tiles of output rows (see _fit_bands) ---------------------

    def _forward_tiles(self, queue, x, w, bias, y, ws, relu):
        """Per image: bias filled first (unless a ReLU follows); per tile: im2col of its rows, then
        Y[g][:, rows] (+)= W[g] @ col[g], written in place (rows of Y are P apart)."""
        g, Kg, Kd = self.g, self.g.Kg, self.g.Kd
        idx = idx_for(self.dtype, x, w, y, bias, Ref(ws, 0))
        for n in range(g.N):
            image = Ref(y.buf, y.off + n * g.K * g.P)
            beta = before_gemm(queue, self.dtype, image, bias, 1, g.K, g.P, relu)
            for tile in self._bands():
                oy0, rows, ox0, cols = tile
                L = rows * cols
                self._im2col(queue, idx, x, n, 1, ws, 0, tile)
                self._gemm(queue, Kg, L, Kd, Op(w.buf, w.off, Kd, Kg * Kd), Op(ws, 0, L, Kd * L),
                           Op(y.buf, image.off + oy0 * g.OW + ox0, g.P, Kg * g.P), Epilogue(beta=beta),
                           what="forward (tile)")
            after_gemm(queue, self.dtype, image, bias, 1, g.K, g.P, relu)

    def _input_tiles(self, queue, w, dy, dx, ws):
        """Per tile: col[g] = W[g]^T @ dY[g][:, rows] (read in place), then col2im of the input rows
        the tile reaches: the image's first tile writes every input row, later ones add theirs."""
        g, Kg, Kd = self.g, self.g.Kg, self.g.Kd
        (pt, _), (sh, dh) = g.pads[0], (g.stride[0], g.dilation[0])
        idx = idx_for(self.dtype, w, dy, dx, Ref(ws, 0))
        for n in range(g.N):
            for t, tile in enumerate(self._bands()):
                oy0, rows, ox0, cols = tile
                L = rows * cols
                self._gemm(queue, Kd, L, Kg, Op(w.buf, w.off, Kd, Kg * Kd, transp=True),
                           Op(dy.buf, dy.off + n * g.K * g.P + oy0 * g.OW + ox0, g.P, Kg * g.P), Op(ws, 0, L, Kd * L),
                           what="grad-input (tile)")
                # input rows the tile's output rows read: all of them for the first tile
                first = 0 if t == 0 else max(0, oy0 * sh - pt)
                last = g.H if t == 0 else min(g.H, (oy0 + rows - 1) * sh - pt + (g.kh - 1) * dh + 1)
                if last > first:
                    self._col2im(queue, idx, ws, 0, dx, n, 1, first, last, t > 0, tile)

    def _weight_tiles(self, queue, x, dy, dw, ws):
        """Per tile: im2col of its rows, then dW[g] (+)= dY[g][:, rows] @ col[g]^T, dY read in
        place, on GPUs in S split-K slices of the tile's positions (partial sums after col, then
        their ordered sum; CPUs: one, see _fit_bands); every image's tiles in order, so the sum is
        the same on every run."""
        g, Kg, Kd = self.g, self.g.Kg, self.g.Kd
        idx = idx_for(self.dtype, x, dy, dw, Ref(ws, 0))
        first, part = True, self.rows * self.band * self.cols
        for n in range(g.N):
            for tile in self._bands():
                oy0, rows, ox0, cols = tile
                L = rows * cols
                S = 1 if self._short(L) else largest_divisor_at_most(L, self.max_slices)
                self._im2col(queue, idx, x, n, 1, ws, 0, tile)
                a = Op(dy.buf, dy.off + n * g.K * g.P + oy0 * g.OW + ox0, g.P, Kg * g.P, L // S)
                b = Op(ws, 0, L, Kd * L, L // S, transp=True)
                if S == 1:
                    self._gemm(queue, Kg, Kd, L, a, b, Op(dw.buf, dw.off, Kd, Kg * Kd),
                               Epilogue(beta=0.0 if first else 1.0), what="grad-weight (tile)")
                else:
                    self._gemm(queue, Kg, Kd, L // S, a, b, Op(ws, part, Kd, Kg * Kd, g.K * Kd), images=S,
                               what="grad-weight (tile, split-K)")
                    sum_partials(queue, self.dtype, idx, Ref(ws, part), S, g.K * Kd, dw, not first,
                                 "grad-weight (tile, sum of slices)")
                first = False
