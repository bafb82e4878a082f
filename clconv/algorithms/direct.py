"""Direct convolution for depthwise, small groups and few-channel stems, kernels/direct.cl.

When a group has few taps (Cg * kh * kw small: depthwise with any channel
multiplier, ResNeXt-style groups of 4 channels), its GEMMs are far too small
to pay; these passes are memory-bound direct kernels instead. A dense
convolution of at most 4 input channels (a network's RGB stem) has a GEMM
inner dimension of at most 4*7*7 taps whatever its filters: on GPUs its
forward is a direct kernel too. grad-weight is a deterministic two-stage
reduction (partials per slice of the batch*pixels, then their ordered sum,
kernels/partials.cl), no atomics. On GPUs float16 arrays are read and written
as they are, every sum in float32.
"""
import pyopencl as cl

from .. import rules
from ..bias import flags
from ..buffers import Ref, idx_for
from ..device import cpu_vector_width
from ..explanation import Reason
from ..programs import get_kernel, launch, reduction_work_group
from .base import Algorithm, pow2_at_least
from .partials import sum_partials

MAX_ACC = 32          # forward accumulators per work-item (filters x rows)
MAX_PATCH = 3072      # elements of one channel's local-memory patch (12 KiB in float32, 24 KiB in float64)
MAX_WEIGHTS = 2048    # and of the forward's staged weights (KB filters x taps), at most; else read in place
LOCAL_SPARE = 8192    # bytes of local memory left unplanned when staging weights beside the patch
REDUCE_BYTES = 16384  # local memory of grad-weight's reduction (RT taps x work-group values), half the
                      # device's at most


# The #defines each kernel of kernels/direct.cl reads besides ONLY, IDX and the filter's constants
# (Direct._specs). A build is given only its own kernel's, so that layers whose kernels agree on
# them share one program.
READS = {"direct_forward": {"TX", "TY", "PH", "PW", "RY", "KB", "NP", "FLIP", "STAGE", "WSTAGE", "WVEC"},
         "direct_input": {"TX", "TY"},
         "direct_weight_partial": {"WG", "RT", "TAPS"},
         "direct_rows": {"VW", "KB", "RB", "RNV", "RR", "LPAD", "FLIP"},
         "direct_weight_rows": {"VW", "TAPS", "BR", "LPAD"},
         "direct_input_rows": {"VW", "CB", "RB", "RI"}}


def _tile(width, height):
    """Work-group tile (TX, TY) of at most 256 work-items for a width x height plane."""
    tx = min(32, pow2_at_least(width))
    return tx, min(256 // tx, pow2_at_least(height))


def _patch(g, tx, ty, ry):
    """(PH, PW) of the input patch under a TX x (TY*RY) output tile; PW is rounded up to a
    multiple of the stride, as the kernel groups the patch's columns by phase."""
    (sh, sw), (dh, dw) = g.stride, g.dilation
    return (ty * ry - 1) * sh + (g.kh - 1) * dh + 1, -(-((tx - 1) * sw + (g.kw - 1) * dw + 1) // sw) * sw


def _patches(g, staged=True):
    """{pass: (TX, TY, PH, PW, RY)}: work-group tiles, the forward's staged input patch and
    its output rows per work-item: when staging, the most of 4, 2, 1 whose patch fits
    MAX_PATCH (more rows measured faster for depthwise forward on GPUs); otherwise 1 (more
    rows measured slower on PoCL)."""
    tx, ty = _tile(g.OW, g.OH)
    for ry in (4, 2, 1) if staged else (1,):
        ph, pw = _patch(g, tx, ty, ry)
        if ry == 1 or (ty * ry <= pow2_at_least(g.OH) and ph * pw <= MAX_PATCH):
            break
    return {"forward": (tx, ty, ph, pw, ry), "backward_input": _tile(g.W, g.H) + (ph, pw, ry)}


def _filters_per_item(g, tile, compute_units):
    """KB, filters per work-item of the forward kernel: as many of a group's filters as keep
    KB * RY accumulators at most MAX_ACC and a work-group per compute unit, so each staged
    patch value is read once for them all (measured faster than one filter per work-item on
    GPUs; on a 7x7 stem 16 filters, leaving fewer work-groups than compute units, measured
    slower than 8)."""
    tx, ty, _, _, ry = tile
    planes = -(-g.OW // tx) * -(-g.OH // (ty * ry)) * g.N * g.K
    return next(kb for kb in (16, 8, 4, 2, 1)
                if kb == 1 or g.Kg % kb == 0 and kb * ry <= MAX_ACC and planes // kb >= compute_units)




def _forward_form(g, tile, kb, compute_units):
    """(in place, NP) of the GPU forward kernel over geometry ``g`` with ``tile`` and ``kb``
    filters per work-item: whether it reads its input in place rather than staging patches, and
    the (n, k-block) planes each work-group takes in turn (see rules.DIRECT_IN_PLACE_USES)."""
    tx, ty, _, _, ry = tile
    tiles = -(-g.OW // tx) * -(-g.OH // (ty * ry))
    if tiles * -(-(g.N * g.K // kb) // rules.DIRECT_PLANES) < rules.DIRECT_GROUPS_PER_UNIT * compute_units:
        return False, 1
    uses = g.kh * g.kw / (g.stride[0] * g.stride[1])
    if kb == 1 and g.Cg == 1 and (uses <= rules.DIRECT_IN_PLACE_USES or (ry == 1 and g.stride == (1, 1))):
        return True, rules.DIRECT_PLANES
    return False, rules.DIRECT_PLANES if uses >= rules.DIRECT_PLANE_USES else 1




def _rows_per_item(g, compute_units):
    """(KB, RB) of the CPU forward kernel over geometry ``g``: filters per work-item, the most
    of 8, 4, 2, 1 dividing a group's filters (each input vector feeds KB sums), and output rows
    per work-item (:func:`_band`)."""
    kb = next(b for b in (rules.DIRECT_CPU_MAX_FILTERS, 4, 2, 1) if g.Kg % b == 0)
    return kb, _band(g.OH, g.N * g.K // kb, compute_units)


def _input_rows_per_item(g, compute_units):
    """(CB, RB) of the CPU strided grad-input kernel (direct_input_rows) over geometry ``g``:
    input channels per work-item, the most of 8, 4, 2, 1 dividing a group's channels (each
    grad_output vector feeds CB sums; measured faster than one channel per work-item on PoCL
    for grouped strided grad-inputs), and input rows per work-item
    (:func:`_band`)."""
    cb = next(b for b in (rules.DIRECT_CPU_MAX_FILTERS, 4, 2, 1) if g.Cg % b == 0)
    return cb, _band(g.H, g.N * g.C // cb, compute_units)


def _band(rows, planes, compute_units):
    """Rows per work-item of a CPU row kernel over ``planes`` planes of ``rows`` rows: all of
    a plane's unless that leaves fewer than rules.DIRECT_CPU_ITEMS_PER_UNIT work-items per compute unit."""
    want = rules.DIRECT_CPU_ITEMS_PER_UNIT * compute_units
    return rows if planes >= want or not planes else max(1, rows // -(-want // planes))


def _patch_sizes(g):
    """(PH, PW) of the forward kernel's patch for every launch over ``g`` (one row per work-item)."""
    geometries = (g, g.transposed()) if g.stride == (1, 1) else (g,)
    return [_patches(t, staged=False)["forward"][2:4] for t in geometries]


class Direct(Algorithm):
    name = "direct"
    MATRIX_UNITS = False   # no GEMMs: its sums are float32 in its own kernels
    HALF_KERNELS = True    # every kernel reads and writes the arrays through LOAD and SAVE (kernels/direct.cl)

    @staticmethod
    def applies(g):
        taps = g.Cg * g.kh * g.kw
        if g.groups == 1:
            if g.C > rules.DIRECT_MAX_DENSE_CHANNELS or taps > rules.DIRECT_MAX_DENSE_TAPS:
                return False, (f"needs groups > 1, or at most {rules.DIRECT_MAX_DENSE_CHANNELS} input channels and "
                               f"{rules.DIRECT_MAX_DENSE_TAPS} taps (C*kh*kw = {taps}): a dense convolution is a GEMM's job")
        elif taps > rules.DIRECT_CPU_MAX_TAPS or g.Kg > rules.DIRECT_MAX_FILTERS:
            return False, (f"needs at most {rules.DIRECT_CPU_MAX_TAPS} taps (Cg*kh*kw = {taps}) and {rules.DIRECT_MAX_FILTERS} filters per "
                           f"group (Kg = {g.Kg})")
        patch = max(ph * pw for ph, pw in _patch_sizes(g))
        if patch > MAX_PATCH:
            return False, f"the input patch of a tile ({patch} elements) does not fit in local memory"
        if g.groups == 1:
            return True, (f"few input channels ({g.C} x {g.kh}x{g.kw} taps -> {g.K} filters): a GEMM this "
                          "thin does not pay, a direct kernel does")
        kind = "depthwise" if g.Cg == 1 else "small groups"
        return True, (f"{kind} ({g.groups} groups of {g.Cg} channel(s) x {g.kh}x{g.kw} taps -> {g.Kg} filter(s)): "
                      "GEMMs this small do not pay, a direct memory-bound kernel does")

    @staticmethod
    def preferred(g, pass_name, device):
        """Whether "auto" should pick this algorithm for ``pass_name`` on ``device`` (it applies
        either way): rule-direct-stems, rule-direct-taps, rule-direct-strided-grad-input."""
        gpu = bool(device.type & cl.device_type.GPU)
        if g.groups == 1 and (pass_name != "forward" or not gpu):
            return False, Reason("direct-stems", "a dense stem's gradients and CPU forward run faster through im2col")
        taps = g.Cg * g.kh * g.kw
        if g.groups > 1 and taps > rules.DIRECT_MAX_TAPS:
            if gpu:
                return False, Reason("direct-taps", f"{taps} taps per group, above {rules.DIRECT_MAX_TAPS} on GPUs")
            if pass_name == "backward_weight" and (g.stride != (1, 1) or taps > rules.DIRECT_CPU_MAX_WEIGHT_TAPS):
                return False, Reason("direct-taps", f"grad-weight of {taps} taps per group " + (
                    "at stride 2" if g.stride != (1, 1) else f"above {rules.DIRECT_CPU_MAX_WEIGHT_TAPS}") + " on CPUs")
            return True, ""   # (forward and grad-input, strided too, up to DIRECT_CPU_MAX_TAPS on CPUs)
        if pass_name == "backward_input" and g.Cg > 1 and g.stride != (1, 1):
            return False, Reason("direct-strided-grad-input", "strided grad-input of groups of several channels")
        return True, ""

    def __init__(self, g, dtype, device, workspace_limit, per_group=False, gemm=None, math="strict", half=False):
        super().__init__(g, dtype, device, workspace_limit, False, None, half=half)   # no GEMMs: no per-group queues
        self.taps = g.Cg * g.kh * g.kw
        self.staged = bool(device.type & cl.device_type.GPU)   # on CPUs caches stage better than barriers
        self.vw = cpu_vector_width(device, dtype.itemsize)      # columns per vector of the CPU row kernels
        self.local_mem = device.local_mem_size
        self.tiles = _patches(g, self.staged)
        # stride 1: grad-input is a forward pass over dy (rotated, transposed weights), so it
        # gets the forward's staged patch and rows per work-item (measured faster for depthwise
        # grad-input on GPUs); strided grad-input keeps its own kernel, which skips off-grid taps
        self.transposed = g.transposed() if g.stride == (1, 1) else None
        if self.transposed:
            self.tiles["backward_input"] = _patches(self.transposed, self.staged)["forward"]
        units = device.max_compute_units
        self.kb = {"forward": _filters_per_item(g, self.tiles["forward"], units),
                   "backward_input": _filters_per_item(self.transposed, self.tiles["backward_input"], units)
                   if self.transposed else 1}
        self.form = {p: _forward_form(t, self.tiles[p], self.kb[p], units)   # direct_forward's (GPUs)
                     for p, t in (("forward", g), ("backward_input", self.transposed)) if t and self.staged}
        self.specs = {id(t): self._specs(t) for t in (g, self.transposed) if t}   # per launch geometry
        # enough work-groups in stage 1 to fill the device (about 4 per compute unit), each
        # slice keeping at least 1024 positions, as many as the workspace holds; fixed per
        # device and limit, so deterministic
        room = workspace_limit // (g.K * self.taps * dtype.itemsize)
        if room < 1:
            raise ValueError(f"grad-weight of input {list(g.input_shape)} with weight {list(g.weight_shape)} needs "
                             f"{g.K * self.taps * dtype.itemsize} workspace bytes, above the limit of "
                             f"{workspace_limit} bytes")
        if self.staged:
            fill = -(-4 * units // g.K)
            self.slices = max(1, min(64, fill, g.N * g.P // 1024, room))
        else:   # CPU devices: row kernels, slices of at least 4 output rows, rules.DIRECT_CPU_ITEMS_PER_UNIT per unit
            self.rows = {"forward": self._band_fitting(g, _rows_per_item(g, units)),
                         # stride 1: the forward kernel over the transposed geometry; else
                         # direct_input_rows, bands of input-gradient rows of CB planes of one group
                         "backward_input": self._band_fitting(self.transposed, _rows_per_item(self.transposed, units))
                         if self.transposed else _input_rows_per_item(g, units)}
            fill = -(-rules.DIRECT_CPU_ITEMS_PER_UNIT * units // g.K)
            self.slices = max(1, min(64, fill, g.N * g.OH // 4, room))
        self.workspace["backward_weight"] = g.K * self.slices * self.taps
        # GPU grad-weight: work-groups no larger than a slice's positions (a 7x7 map at batch 1:
        # 49, where 256 left 207 work-items idle through the reduction), RT taps reduced per pass
        # of the tree, within REDUCE_BYTES of local memory
        self.wg_weight = min(pow2_at_least(-(-g.N * g.P // self.slices)), 256)
        reduce_bytes = min(REDUCE_BYTES, self.local_mem // 2)
        self.rt = max(1, min(16, self.taps, reduce_bytes // (self.wg_weight * dtype.itemsize)))

    def describe(self, pass_name):
        g = self.g
        if pass_name == "backward_weight":
            kind = "" if self.staged else " (rows of output, vectors along them)"
            band = None if self.staged else self._weight_band()
            if band:
                kind += (f", the input rows under up to {band[0]} output row(s) of an image first copied zero-padded "
                         "into local memory (a vector load each)")
            return (f"direct grad-weight{kind}, {g.K} x {self.slices} partial sums of {self.taps} taps, "
                    "then an ordered sum")
        tx, ty, ph, pw, ry = self.tiles[pass_name]
        as_forward = pass_name == "forward" or self.transposed
        flipped = (" (the forward kernel over grad_output with rotated, transposed weights)"
                   if pass_name == "backward_input" and self.transposed else "")
        taps = self.g.Kg * self.g.kh * self.g.kw if flipped else self.taps
        if not self.staged:
            kb, rb = self.rows[pass_name]   # (strided grad-input: kb is CB, channels per work-item)
            if not as_forward:
                ri = min(rb, self._row_block(self.g, kb))
                rows = (f", {ri} rows summed at once (each grad_output vector loaded once for all of them)" if ri > 1
                        else "")
                return (f"direct row kernel, the taps of each stride phase per input-gradient column, work-items "
                        f"of {rb} row(s) of {kb} plane(s) of one group, {self.vw} columns of a phase per vector{rows}, "
                        "no GEMM, no workspace")
            geometry = self.transposed if flipped else self.g
            vectors = self._short_rows(geometry, kb)
            rr = min(rb, self._row_block(geometry, kb * max(1, vectors)))
            short = f", each input row loaded once, zero-padded (rows of {vectors} vector(s))" if vectors else ""
            if self._band_values(geometry, kb, rb):
                short += ", its input rows first copied zero-padded into local memory (a vector load each)"
            if rr > 1:
                short += f", {rr} output rows summed at once (each input {'row' if vectors else 'vector'} loaded " \
                         "once for all of them)"
            return (f"direct row kernel{flipped}, {taps} taps per output, work-items of {rb} output row(s) x {kb} "
                    f"filter(s), {self.vw} columns per vector{short}, no GEMM, no workspace")
        staged = ""
        if as_forward and self.staged:
            in_place, planes = self.form[pass_name]
            staged = (f" of {ry} row(s) x {self.kb[pass_name]} filter(s) per work-item, "
                      + ("reading the input in place" if in_place else f"staging a {ph}x{pw} patch in local memory"))
            if planes > 1:
                staged += f", {planes} planes per work-group in turn"
        return (f"direct kernel{flipped}, {taps} taps per output, {tx}x{ty} tiles{staged}, "
                "no GEMM, no workspace")

    def facts(self, pass_name):
        if pass_name == "backward_weight":
            band = None if self.staged else self._weight_band()
            return dict(splits=self.slices, rules=("direct-kernels",),
                        notes=("two-stage sum",) + ((f"input band of {band[0]} rows",) if band else ()))
        if self.staged:
            notes = []
            if pass_name == "forward" or self.transposed:
                in_place, planes = self.form[pass_name]
                notes.append("input in place" if in_place else "staged patch")
                if planes > 1:
                    notes.append(f"{planes} planes a work-group")
        else:
            kb, rb = self.rows[pass_name]
            if pass_name == "forward" or self.transposed:
                geometry = self.transposed if pass_name == "backward_input" else self.g
                vectors = self._short_rows(geometry, kb)
                rr = min(rb, self._row_block(geometry, kb * max(1, vectors)))
                notes = [f"rows of {rb} x {kb} filters"] + (["short rows"] if vectors else [])
                if self._band_values(geometry, kb, rb):
                    notes.append("input band")
            else:
                rr = min(rb, self._row_block(self.g, kb))
                notes = [f"rows of {rb} x {kb} planes"]
            if rr > 1:
                notes.append(f"{rr} rows at once")
        if pass_name == "backward_input" and self.transposed:
            notes.insert(0, "forward kernel on grad_output")
        return dict(rules=("direct-kernels",), notes=tuple(notes))

    def _short_rows(self, g, kb):
        """Vectors per output row where direct_rows over geometry ``g`` with ``kb`` filters takes
        its short-row form (each tap row's input loaded once, zero-padded); 0 where it does not."""
        vectors = -(-g.OW // self.vw)
        return vectors if vectors <= rules.DIRECT_SHORT_ROW_VECTORS and kb * vectors <= rules.DIRECT_SHORT_ROW_ACC else 0

    def _band_fitting(self, g, rows):
        """(KB, RB) of direct_rows over geometry ``g`` from ``rows``, with fewer rows per
        work-item where RB rows' zero-padded input band would not fit :meth:`_band_bytes` (the
        most multiple of the row block that fits)."""
        kb, rb = rows
        if self._short_rows(g, kb) or not self._band_pays(g, kb):
            return rows
        rr = min(rb, self._row_block(g, kb))
        fits = self._rows_fitting(g, g.Cg) // rr * rr
        return (kb, min(rb, fits)) if fits > 0 else rows

    def _rows_fitting(self, g, channels):
        """The most output rows over geometry ``g`` whose zero-padded input rows of ``channels``
        channels fit :meth:`_band_bytes` (0 or less where not one row's do)."""
        row = channels * self._band_width(g) * self.dtype.itemsize
        return (self._band_bytes() // row - (g.kh - 1) * g.dilation[0] - 1) // g.stride[0] + 1

    @staticmethod
    def _band_rows(g, rows):
        """Input rows under ``rows`` consecutive output rows over geometry ``g``."""
        return (rows - 1) * g.stride[0] + (g.kh - 1) * g.dilation[0] + 1

    def _band_width(self, g):
        """Values per row of the row kernels' zero-padded input band: every vector of an output
        row (BAND_WIDTH in kernels/direct.cl)."""
        return -(-g.OW // self.vw) * self.vw * g.stride[1] + (g.kw - 1) * g.dilation[1]

    def _band_pays(self, g, kb):
        """Whether a row kernel over geometry ``g`` with ``kb`` filters per input value copies its
        input rows into a zero-padded band (rules.DIRECT_BAND_MIN_USES, rules.DIRECT_BAND_MIN_EDGES), space permitting."""
        (sh, sw), dw, pl = g.stride, g.dilation[1], g.pads[1][0]
        if kb * g.kh * g.kw >= rules.DIRECT_BAND_MIN_USES * sh * sw:
            return True
        # the share of an output row's (vector, tap column) loads that reach past the row's edges
        span = self.vw * sw if sw == 2 else (self.vw - 1) * sw + 1   # values one load reads (row_values)
        starts = [u * self.vw * sw - pl + j * dw for u in range(-(-g.OW // self.vw)) for j in range(g.kw)]
        return sum(s < 0 or s + span > g.W for s in starts) >= rules.DIRECT_BAND_MIN_EDGES * len(starts)

    def _band_values(self, g, kb, rb):
        """Values of direct_rows' zero-padded input band over geometry ``g`` with ``kb`` filters
        and ``rb`` rows per work-item; 0 where it takes none (:meth:`_band_pays`, or above
        :meth:`_band_bytes`; short rows load theirs once anyway)."""
        if self._short_rows(g, kb) or not self._band_pays(g, kb):
            return 0
        rr = min(rb, self._row_block(g, kb))
        values = g.Cg * self._band_rows(g, -(-rb // rr) * rr) * self._band_width(g)
        return values if values * self.dtype.itemsize <= self._band_bytes() else 0

    def _weight_band(self):
        """(BR, values) of direct_weight_rows' zero-padded input band: the most output rows of an
        image whose input rows fit :meth:`_band_bytes` (all of them at most), and the values they
        take; None where it takes none (:meth:`_band_pays`, or not one row's)."""
        g = self.g
        if not self._band_pays(g, 1):
            return None
        rows = min(g.OH, self._rows_fitting(g, 1))
        return (rows, self._band_rows(g, rows) * self._band_width(g)) if rows > 0 else None

    def _band_bytes(self):
        """The most bytes of direct_rows' input band: rules.DIRECT_BAND_BYTES, within half the device's local memory."""
        return min(rules.DIRECT_BAND_BYTES, self.local_mem // 2)

    @staticmethod
    def _row_block(g, kb):
        """Output rows direct_rows sums at once over geometry ``g`` with ``kb`` vectors of sums per
        row (filters, times a short row's vectors) (RR, at most a work-item's rows): for a filter
        of several tap rows, the most of rules.DIRECT_ROW_BLOCK, 4, 2 whose accumulators (kb x RR) stay within
        rules.DIRECT_SHORT_ROW_ACC; else 1."""
        if g.kh == 1:   # (no input row is read by two output rows)
            return 1
        return next((rr for rr in (rules.DIRECT_ROW_BLOCK, 4, 2) if rr <= rules.DIRECT_ROW_BLOCK and kb * rr <= rules.DIRECT_SHORT_ROW_ACC), 1)

    @staticmethod
    def _specs(g):
        """(GEOMETRY arguments, the filter's #defines) of launches over geometry ``g``: filter
        shape, stride, dilation, top/left padding, channels and filters per group."""
        (pt, _), (pl, _) = g.pads
        filt = dict(KH=g.kh, KW=g.kw, SH=g.stride[0], SW=g.stride[1], DH=g.dilation[0], DW=g.dilation[1],
                    PT=pt, PL=pl, CG=g.Cg, KG=g.Kg)
        return (g.N, g.C, g.H, g.W, g.K, g.OH, g.OW) + tuple(filt.values()), {k: f"({v})" for k, v in filt.items()}

    def _sizes(self, g=None):
        """The kernels' GEOMETRY arguments."""
        return self.specs[id(g or self.g)][0]

    def _kernel(self, queue, name, idx, tile=None, g=None, kb=1, rb=1, cb=1, form=(False, 1)):
        """``name`` built for geometry ``g`` (the transposed one flips the weights), the filter's
        sizes compiled in (loops unrolled, divisions folded); ``kb`` filters (forward kernels) or
        ``cb`` channels (direct_input_rows) and ``rb`` rows per work-item; direct_forward's
        ``form``: (reading in place, planes per work-group)."""
        g = g or self.g
        wg = reduction_work_group(queue.device, self.wg_weight)   # grad-weight's reduction shape
        channels = dict(CB=cb) if name == "direct_input_rows" else {}
        ri = min(rb, self._row_block(g, cb)) if name == "direct_input_rows" else 1
        if ri > 1:
            channels["RI"] = ri
        vectors = self._short_rows(g, kb) if name == "direct_rows" else 0
        short = dict(RNV=vectors) if vectors else {}
        rr = min(rb, self._row_block(g, kb * max(1, vectors))) if name == "direct_rows" else 1
        if rr > 1:
            short["RR"] = rr
        band = self._band_values(g, kb, rb) if name == "direct_rows" else 0
        if band:
            short["LPAD"] = pow2_at_least(band)   # (one build for rows up to that long)
        weight_band = self._weight_band() if name == "direct_weight_rows" else None
        if weight_band:
            short.update(BR=weight_band[0], LPAD=pow2_at_least(weight_band[1]))
        tx, ty, ph, pw, ry = tile or self.tiles["forward"]
        constants = self.specs[id(g)][1]
        # the forward's weights staged in local memory where a filter has several channels
        # (measured faster on GPUs for stems and grouped layers); depthwise filters are too
        # small to pay for it (measured slightly slower)
        # (all within the plan's device's local memory, LOCAL_SPARE bytes kept free)
        item, weights = self.dtype.itemsize, kb * g.Cg * g.kh * g.kw
        room = self.local_mem - LOCAL_SPARE - ph * pw * item
        stage = self.staged and not form[0]
        wstage = stage and g.Cg > 1 and weights <= MAX_WEIGHTS and weights * item <= room
        # four filters' staged weights read at once (measured faster on GPUs)
        wvec = wstage and kb % 4 == 0
        defines = dict(TAPS=self.taps, TX=tx, TY=ty, PH=ph, PW=pw, RY=ry, KB=kb, NP=form[1], RB=rb, VW=self.vw,
                       STAGE=int(stage), WSTAGE=int(wstage), WVEC=int(wvec), FLIP=int(g is self.transposed),
                       WG=wg, RT=self.rt, **channels, **short)
        # ONLY: the build compiles this one kernel of direct.cl, given only the values it reads
        return (get_kernel(queue.context, "direct.cl", name, self.store, ONLY=name.upper(), IDX=idx, **constants,
                           **{k: v for k, v in defines.items() if k in READS[name]}), wg)

    def _forward(self, queue, pass_name, g, x, w, bias, y, what, relu=False):
        """The forward kernel over geometry ``g`` (the transposed one flips the weights): on GPUs
        direct_forward's tiles, on CPUs direct_rows' bands of output rows."""
        b = bias if bias is not None else w
        idx = idx_for(self.store, x, w, y, bias)
        args = (x.buf, x.off, w.buf, w.off, b.buf, b.off, flags(bias, relu), y.buf, y.off, *self._sizes(g))
        if not self.staged:
            kb, rb = self.rows[pass_name]
            knl, _ = self._kernel(queue, "direct_rows", idx, None, g, kb, rb)
            launch(queue, knl, (-(-g.OH // rb), g.N * g.K // kb), (1, 1), *args, what=what)
            return
        tile, kb, form = self.tiles[pass_name], self.kb[pass_name], self.form[pass_name]
        tx, ty, _, _, ry = tile
        knl, _ = self._kernel(queue, "direct_forward", idx, tile, g, kb, form=form)
        launch(queue, knl, (g.OW, -(-g.OH // (ty * ry)) * ty, -(-(g.N * g.K // kb) // form[1])), (tx, ty, 1),
               *args, what=what)

    def forward(self, queue, x, w, bias, y, ws, relu=False):
        self._forward(queue, "forward", self.g, x, w, bias, y, "forward (direct)", relu)

    def backward_input(self, queue, w, dy, dx, ws):
        if self.transposed:
            return self._forward(queue, "backward_input", self.transposed, dy, w, None, dx,
                                 "grad-input (direct, as a forward pass)")
        g = self.g
        idx = idx_for(self.store, w, dy, dx)
        args = (w.buf, w.off, dy.buf, dy.off, dx.buf, dx.off, *self._sizes())
        if not self.staged:
            cb, rb = self.rows["backward_input"]
            knl, _ = self._kernel(queue, "direct_input_rows", idx, rb=rb, cb=cb)
            launch(queue, knl, (-(-g.H // rb), g.N * g.C // cb), (1, 1), *args, what="grad-input (direct)")
            return
        tx, ty = self.tiles["backward_input"][:2]
        knl, _ = self._kernel(queue, "direct_input", idx, self.tiles["backward_input"])
        launch(queue, knl, (g.W, g.H, g.N * g.C), (tx, ty, 1), *args, what="grad-input (direct)")

    def backward_weight(self, queue, x, dy, dw, ws):
        g, S = self.g, self.slices
        idx = idx_for(self.store, x, dy, dw)
        if self.staged:
            partial, wg = self._kernel(queue, "direct_weight_partial", idx)
            launch(queue, partial, (g.K * S * wg,), (wg,), x.buf, x.off, dy.buf, dy.off,
                   ws, S, *self._sizes(), what="grad-weight (direct, partials)")
        else:
            partial, _ = self._kernel(queue, "direct_weight_rows", idx)
            launch(queue, partial, (g.K * S,), (1,), x.buf, x.off, dy.buf, dy.off,
                   ws, S, *self._sizes(), what="grad-weight (direct, partials)")
        sum_partials(queue, self.store, idx_for(self.store, dw, Ref(ws, 0)), Ref(ws, 0), S, g.K * self.taps, dw, False,
                     "grad-weight (direct, sum)", float_parts=self.store != self.dtype)
