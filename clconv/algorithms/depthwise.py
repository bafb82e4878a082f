"""Direct depthwise convolution (groups == C, any channel multiplier), kernels/depthwise.cl.

GEMMs of M=multiplier, K=kh*kw are far too small to pay; these passes are
memory-bound direct kernels instead. grad-weight is a deterministic two-stage
reduction (partials per slice of the batch*pixels, then an ordered sum), no atomics.
"""
from ..programs import get_kernel, launch
from .common import i32, iarg, idx_for

MAX_TAPS = 64         # kh * kw above this keeps the private accumulators too large
TILE = (64, 4)


class Depthwise:
    name = "direct"

    @staticmethod
    def applies(g):
        if g.groups != g.C:
            return False, f"needs groups == channels (depthwise); groups={g.groups}, channels={g.C}"
        if g.kh * g.kw > MAX_TAPS:
            return False, f"kernel {g.kh}x{g.kw} has more than {MAX_TAPS} taps"
        return True, (f"depthwise (groups == channels == {g.C}, multiplier {g.K // g.C}): "
                      "GEMMs this small do not pay, a direct memory-bound kernel does")

    def __init__(self, g, dtype, device, workspace_limit, per_group=False):
        self.g, self.dtype = g, dtype
        # enough work-groups in stage 1 to fill the device (about 4 per compute unit),
        # each slice keeping at least 1024 positions; fixed per device, so deterministic
        fill = -(-4 * device.max_compute_units // g.K)
        self.slices = max(1, min(64, fill, g.N * g.P // 1024))
        self.workspace = {"forward": 0, "backward_input": 0,
                          "backward_weight": g.K * self.slices * g.kh * g.kw}

    def describe(self, pass_name):
        g = self.g
        if pass_name == "backward_weight":
            return (f"direct depthwise grad-weight, {g.K} x {self.slices} partial sums of {g.kh * g.kw} taps, "
                    "then an ordered sum")
        return f"direct depthwise kernel, {g.kh}x{g.kw} taps, multiplier {g.K // g.C}"

    def _geometry(self):
        g = self.g
        (pt, _), (pl, _) = g.pads
        return tuple(map(i32, (g.N, g.C, g.H, g.W, g.K, g.kh, g.kw, g.OH, g.OW) + g.stride + (pt, pl) + g.dilation))

    def forward(self, queue, x, w, bias, y, ws):
        g = self.g
        idx = idx_for(self.dtype, x, w, y)
        knl = get_kernel(queue.context, "depthwise.cl", "dw_forward", self.dtype, IDX=idx)
        b = bias if bias is not None else w
        launch(queue, knl, (g.P, g.N * g.K), TILE, x.buf, iarg(idx, x.off), w.buf, iarg(idx, w.off),
               b.buf, iarg(idx, b.off), i32(bias is not None), y.buf, iarg(idx, y.off), *self._geometry(),
               what="forward (depthwise)")

    def backward_input(self, queue, w, dy, dx, ws):
        g = self.g
        idx = idx_for(self.dtype, w, dy, dx)
        knl = get_kernel(queue.context, "depthwise.cl", "dw_input", self.dtype, IDX=idx)
        launch(queue, knl, (g.H * g.W, g.N * g.C), TILE, w.buf, iarg(idx, w.off), dy.buf, iarg(idx, dy.off),
               dx.buf, iarg(idx, dx.off), *self._geometry(), what="grad-input (depthwise)")

    def backward_weight(self, queue, x, dy, dw, ws):
        g, S, taps = self.g, self.slices, self.g.kh * self.g.kw
        idx = idx_for(self.dtype, x, dy, dw)
        wg = 1 << (min(256, queue.device.max_work_group_size).bit_length() - 1)
        partial = get_kernel(queue.context, "depthwise.cl", "dw_weight_partial", self.dtype, IDX=idx,
                             TAPS=taps, WG=wg)
        launch(queue, partial, (g.K * S * wg,), (wg,), x.buf, iarg(idx, x.off), dy.buf, iarg(idx, dy.off),
               ws, i32(S), *self._geometry(), what="grad-weight (depthwise, partials)")
        total = get_kernel(queue.context, "depthwise.cl", "dw_weight_sum", self.dtype, IDX=idx, TAPS=taps, WG=wg)
        launch(queue, total, (g.K * taps,), (64,), ws, i32(S), dw.buf, iarg(idx, dw.off), i32(g.K),
               what="grad-weight (depthwise, sum)")
