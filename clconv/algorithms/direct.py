"""Direct grouped convolution for depthwise and small groups, kernels/direct.cl.

When a group has few taps (Cg * kh * kw small: depthwise with any channel
multiplier, ResNeXt-style groups of 4 channels), its GEMMs are far too small
to pay; these passes are memory-bound direct kernels instead. grad-weight is a
deterministic two-stage reduction (partials per slice of the batch*pixels, then
an ordered sum), no atomics.
"""
import pyopencl as cl

from ..programs import get_kernel, launch, reduction_work_group
from .common import idx_for

MAX_TAPS = 64         # Cg * kh * kw above this: the private accumulators get too large
MAX_FILTERS = 64      # Kg above this: a GEMM over the group's filters pays again
MAX_PATCH = 3072      # elements of the local-memory patch (12 KiB in float32, 24 KiB in float64)


def _pow2_at_least(n):
    return 1 << max(0, (n - 1).bit_length())


def _tile(width, height):
    """Work-group tile (TX, TY) of at most 256 work-items for a width x height plane."""
    tx = min(32, _pow2_at_least(width))
    return tx, min(256 // tx, _pow2_at_least(height))


def _patches(g, staged=True):
    """{pass: (TX, TY, PH, PW, RY)}: work-group tiles, the forward's staged input patch and
    its output rows per work-item: when staging, the most of 4, 2, 1 whose patch fits
    MAX_PATCH (4 rows made depthwise forward 2.3x faster on an H200); otherwise 1 (more
    rows made PoCL up to 1.8x slower)."""
    (sh, sw), (dh, dw) = g.stride, g.dilation
    tx, ty = _tile(g.OW, g.OH)
    for ry in (4, 2, 1) if staged else (1,):
        if ry == 1 or (ty * ry <= _pow2_at_least(g.OH)
                       and ((ty * ry - 1) * sh + (g.kh - 1) * dh + 1) * ((tx - 1) * sw + (g.kw - 1) * dw + 1)
                       <= MAX_PATCH):
            break
    fwd = (tx, ty, (ty * ry - 1) * sh + (g.kh - 1) * dh + 1, (tx - 1) * sw + (g.kw - 1) * dw + 1, ry)
    return {"forward": fwd, "backward_input": _tile(g.W, g.H) + fwd[2:]}


class Direct:
    name = "direct"

    @staticmethod
    def applies(g):
        taps = g.Cg * g.kh * g.kw
        if g.groups == 1:
            return False, "needs groups > 1 (a dense convolution is a GEMM's job)"
        if taps > MAX_TAPS or g.Kg > MAX_FILTERS:
            return False, (f"needs at most {MAX_TAPS} taps (Cg*kh*kw = {taps}) and {MAX_FILTERS} filters per group "
                           f"(Kg = {g.Kg})")
        _, _, ph, pw, _ = _patches(g, staged=False)["forward"]
        patch = ph * pw
        if patch > MAX_PATCH:
            return False, f"the input patch of a tile ({patch} elements) does not fit in local memory"
        kind = "depthwise" if g.Cg == 1 else "small groups"
        return True, (f"{kind} ({g.groups} groups of {g.Cg} channel(s) x {g.kh}x{g.kw} taps -> {g.Kg} filter(s)): "
                      "GEMMs this small do not pay, a direct memory-bound kernel does")

    @staticmethod
    def preferred(g, pass_name):
        """Whether "auto" should pick this algorithm for ``pass_name`` (it applies either way)."""
        if pass_name == "backward_input" and g.Cg > 1:
            return False, ("grad-input of groups of several channels: im2col measured about 2x faster "
                           "(ResNeXt 32x4d on an H200 and on PoCL)")
        return True, ""

    def __init__(self, g, dtype, device, workspace_limit, per_group=False):
        self.g, self.dtype = g, dtype
        self.per_group = False   # no GEMMs, so no per-group queues
        self.taps = g.Cg * g.kh * g.kw
        self.staged = bool(device.type & cl.device_type.GPU)   # on CPUs caches stage better than barriers
        self.tiles = _patches(g, self.staged)
        # enough work-groups in stage 1 to fill the device (about 4 per compute unit),
        # each slice keeping at least 1024 positions; fixed per device, so deterministic
        fill = -(-4 * device.max_compute_units // g.K)
        self.slices = max(1, min(64, fill, g.N * g.P // 1024))
        self.workspace = {"forward": 0, "backward_input": 0, "backward_weight": g.K * self.slices * self.taps}

    def describe(self, pass_name):
        g = self.g
        if pass_name == "backward_weight":
            return (f"direct grouped grad-weight, {g.K} x {self.slices} partial sums of {self.taps} taps, "
                    "then an ordered sum")
        tx, ty, ph, pw, ry = self.tiles[pass_name]
        staged = (f" of {ry} row(s) per work-item, staging a {ph}x{pw} input patch in local memory"
                  if pass_name == "forward" and self.staged else "")
        return f"direct grouped kernel, {self.taps} taps per output, {tx}x{ty} tiles{staged}, no GEMM, no workspace"

    def _geometry(self):
        g = self.g
        (pt, _), (pl, _) = g.pads
        return (g.N, g.C, g.H, g.W, g.K, g.groups, g.kh, g.kw, g.OH, g.OW) + g.stride + (pt, pl) + g.dilation

    def _kernel(self, queue, name, idx, tile=None):
        wg = reduction_work_group(queue.device)
        tx, ty, ph, pw, ry = tile or self.tiles["forward"]
        return get_kernel(queue.context, "direct.cl", name, self.dtype, IDX=idx, TAPS=self.taps, WG=wg,
                          TX=tx, TY=ty, PH=ph, PW=pw, RY=ry, STAGE=int(self.staged)), wg

    def forward(self, queue, x, w, bias, y, ws):
        g = self.g
        idx = idx_for(self.dtype, x, w, y, bias)
        tx, ty, _, _, ry = self.tiles["forward"]
        knl, _ = self._kernel(queue, "direct_forward", idx, self.tiles["forward"])
        b = bias if bias is not None else w
        launch(queue, knl, (g.OW, -(-g.OH // (ty * ry)) * ty, g.N * g.K), (tx, ty, 1), x.buf, x.off, w.buf, w.off,
               b.buf, b.off, int(bias is not None), y.buf, y.off, *self._geometry(),
               what="forward (direct)")

    def backward_input(self, queue, w, dy, dx, ws):
        g = self.g
        idx = idx_for(self.dtype, w, dy, dx)
        tx, ty = self.tiles["backward_input"][:2]
        knl, _ = self._kernel(queue, "direct_input", idx, self.tiles["backward_input"])
        launch(queue, knl, (g.W, g.H, g.N * g.C), (tx, ty, 1), w.buf, w.off, dy.buf, dy.off,
               dx.buf, dx.off, *self._geometry(), what="grad-input (direct)")

    def backward_weight(self, queue, x, dy, dw, ws):
        g, S = self.g, self.slices
        idx = idx_for(self.dtype, x, dy, dw)
        partial, wg = self._kernel(queue, "direct_weight_partial", idx)
        launch(queue, partial, (g.K * S * wg,), (wg,), x.buf, x.off, dy.buf, dy.off,
               ws, S, *self._geometry(), what="grad-weight (direct, partials)")
        total, _ = self._kernel(queue, "direct_weight_sum", idx)
        launch(queue, total, (g.K * self.taps,), (64,), ws, S, dw.buf, dw.off, g.K,
               what="grad-weight (direct, sum)")
