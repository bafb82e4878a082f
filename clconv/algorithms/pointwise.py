"""1x1 convolution with stride 1 and no padding: GEMM straight on the input.

An image's input (C, H*W) already is its column matrix, so forward and
grad-input are the im2col algorithm's GEMMs without im2col/col2im:
  forward       Y[b, g]  = W[g] @ X[b, g]       M=Kg  N=H*W  K=Cg
  grad-input    dX[b, g] = W[g]^T @ dY[b, g]    M=Cg  N=H*W  K=Kg
one GEMM per (group, image), batched over the larger of the two. grad-weight
sums over the images:
  grad-weight   part[b, g] = dY[b, g] @ X[b, g]^T    M=Kg  N=Cg  K=H*W
                dW = sum over b of part[b], in order (split-K with one slice per image)
in chunks of up to as many images as split-K allows slices, when an image has at
least MIN_SLICE positions (H200, pointwise workload: 0.50 ms against 0.75 through
the im2col layout). Otherwise it uses the im2col algorithm, whose im2col for a 1x1
kernel is the (C, N*H*W) layout that makes it one GEMM per group.
"""
from ..bias import after_gemm, before_gemm
from ..buffers import Ref, idx_for
from ..gemm import Operand as Op
from .base import Algorithm
from .im2col import Im2col
from .partials import MIN_SLICE, max_slices, sum_partials


class Pointwise(Algorithm):
    name = "1x1"

    @staticmethod
    def applies(g):
        if (g.kh, g.kw) == (1, 1) and g.stride == (1, 1) and g.pads == ((0, 0), (0, 0)):
            return True, "1x1 kernel, stride 1, no padding: the input is already the GEMM operand"
        return False, f"needs a 1x1 kernel with stride 1 and no padding (kernel {g.kh}x{g.kw}, stride {g.stride}, " \
                      f"padding {g.pads})"

    def __init__(self, g, dtype, device, workspace_limit, per_group=False, gemm="clblast"):
        super().__init__(g, dtype, device, workspace_limit, per_group, gemm)
        # grad-weight: images per chunk of per-image partial sums (1: the im2col layout instead)
        fits = workspace_limit // (g.K * g.Cg * dtype.itemsize)
        self.images = min(g.N, max_slices(g.K * g.Cg, g.N * g.P), fits) if g.P >= MIN_SLICE else 1
        self._weight = None if self.images > 1 else Im2col(g, dtype, device, workspace_limit, per_group, gemm)
        self.workspace["backward_weight"] = (self.images * g.K * g.Cg if self._weight is None
                                             else self._weight.workspace["backward_weight"])

    def describe(self, pass_name):
        g = self.g
        if pass_name == "backward_weight":
            if self._weight is not None:
                return "1x1: " + self._weight.describe(pass_name)
            return (f"1x1 GEMM per (group, image) on the input and grad_output, M={g.Kg} N={g.Cg} K={g.P}, "
                    f"partial sums of {self.images} image(s) per launch summed in order, no layout copies")
        m, k = (g.Kg, g.Cg) if pass_name == "forward" else (g.Cg, g.Kg)
        # grouped, the groups are the batch (an image's groups are packed; a group's images are not)
        return (f"1x1 GEMM on the input, {g.groups} group(s) x {g.N} image(s) in "
                f"{1 if g.groups == 1 else g.N} batched launch(es), M={m} N={g.P} K={k}, no im2col")

    def forward(self, queue, x, w, bias, y, ws, relu=False):
        g = self.g
        beta = before_gemm(queue, self.dtype, y, bias, g.N, g.K, g.P, relu)
        self._gemm(queue, g.Kg, g.P, g.Cg, Op(w.buf, w.off, g.Cg, g.Kg * g.Cg),
                   Op(x.buf, x.off, g.P, g.Cg * g.P, g.C * g.P), Op(y.buf, y.off, g.P, g.Kg * g.P, g.K * g.P),
                   images=g.N, beta=beta, what="forward (1x1)")
        after_gemm(queue, self.dtype, y, bias, g.N, g.K, g.P, relu)

    def backward_input(self, queue, w, dy, dx, ws):
        g = self.g
        self._gemm(queue, g.Cg, g.P, g.Kg, Op(w.buf, w.off, g.Cg, g.Kg * g.Cg),
                   Op(dy.buf, dy.off, g.P, g.Kg * g.P, g.K * g.P), Op(dx.buf, dx.off, g.P, g.Cg * g.P, g.C * g.P),
                   images=g.N, a_transp=True, what="grad-input (1x1)")

    def backward_weight(self, queue, x, dy, dw, ws):
        if self._weight is not None:
            self._weight.backward_weight(queue, x, dy, dw, ws)
            return
        g, B, n = self.g, self.images, self.g.K * self.g.Cg
        idx = idx_for(self.dtype, x, dy, dw, Ref(ws, 0))
        for n0 in range(0, g.N, B):
            nb = min(B, g.N - n0)
            self._gemm(queue, g.Kg, g.Cg, g.P, Op(dy.buf, dy.off + n0 * g.K * g.P, g.P, g.Kg * g.P, g.K * g.P),
                       Op(x.buf, x.off + n0 * g.C * g.P, g.P, g.Cg * g.P, g.C * g.P), Op(ws, 0, g.Cg, g.Kg * g.Cg, n),
                       images=nb, b_transp=True, what="grad-weight (1x1)")
            sum_partials(queue, self.dtype, idx, Ref(ws, 0), nb, n, dw, n0 > 0, "grad-weight (1x1, sum of images)")
