"""Direct grouped convolution for depthwise and small groups, kernels/direct.cl.

When a group has few taps (Cg * kh * kw small: depthwise with any channel
multiplier, ResNeXt-style groups of 4 channels), its GEMMs are far too small
to pay; these passes are memory-bound direct kernels instead. grad-weight is a
deterministic two-stage reduction (partials per slice of the batch*pixels, then
an ordered sum), no atomics.
"""
from ..programs import get_kernel, launch
from .common import i32, iarg, idx_for

MAX_TAPS = 64         # Cg * kh * kw above this: the private accumulators get too large
MAX_FILTERS = 64      # Kg above this: a GEMM over the group's filters pays again
TILE = (64, 4)


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
        kind = "depthwise" if g.Cg == 1 else "small groups"
        return True, (f"{kind} ({g.groups} groups of {g.Cg} channel(s) x {g.kh}x{g.kw} taps -> {g.Kg} filter(s)): "
                      "GEMMs this small do not pay, a direct memory-bound kernel does")

    def __init__(self, g, dtype, device, workspace_limit, per_group=False):
        self.g, self.dtype = g, dtype
        self.taps = g.Cg * g.kh * g.kw
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
        return f"direct grouped kernel, {self.taps} taps per output, no GEMM, no workspace"

    def _geometry(self):
        g = self.g
        (pt, _), (pl, _) = g.pads
        return tuple(map(i32, (g.N, g.C, g.H, g.W, g.K, g.groups, g.kh, g.kw, g.OH, g.OW) + g.stride + (pt, pl)
                         + g.dilation))

    def _kernel(self, queue, name, idx):
        wg = 1 << (min(256, queue.device.max_work_group_size).bit_length() - 1)
        return get_kernel(queue.context, "direct.cl", name, self.dtype, IDX=idx, TAPS=self.taps, WG=wg), wg

    def forward(self, queue, x, w, bias, y, ws):
        g = self.g
        idx = idx_for(self.dtype, x, w, y, bias)
        knl, _ = self._kernel(queue, "direct_forward", idx)
        b = bias if bias is not None else w
        launch(queue, knl, (g.P, g.N * g.K), TILE, x.buf, iarg(idx, x.off), w.buf, iarg(idx, w.off),
               b.buf, iarg(idx, b.off), i32(bias is not None), y.buf, iarg(idx, y.off), *self._geometry(),
               what="forward (direct)")

    def backward_input(self, queue, w, dy, dx, ws):
        g = self.g
        idx = idx_for(self.dtype, w, dy, dx)
        knl, _ = self._kernel(queue, "direct_input", idx)
        launch(queue, knl, (g.H * g.W, g.N * g.C), TILE, w.buf, iarg(idx, w.off), dy.buf, iarg(idx, dy.off),
               dx.buf, iarg(idx, dx.off), *self._geometry(), what="grad-input (direct)")

    def backward_weight(self, queue, x, dy, dw, ws):
        g, S = self.g, self.slices
        idx = idx_for(self.dtype, x, dy, dw)
        partial, wg = self._kernel(queue, "direct_weight_partial", idx)
        launch(queue, partial, (g.K * S * wg,), (wg,), x.buf, iarg(idx, x.off), dy.buf, iarg(idx, dy.off),
               ws, i32(S), *self._geometry(), what="grad-weight (direct, partials)")
        total, _ = self._kernel(queue, "direct_weight_sum", idx)
        launch(queue, total, (g.K * self.taps,), (64,), ws, i32(S), dw.buf, iarg(idx, dw.off), i32(g.K),
               what="grad-weight (direct, sum)")
