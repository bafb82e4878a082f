"""Fully-connected mode: the kernel covers the whole unpadded input (OH = OW = 1).

Then input (N, C*H*W) and output (N, K) are plain matrices, group g owning
columns g*Kd ... of the input and g*Kg ... of the output, and each pass is one
strided-batched GEMM over the groups, over the whole batch, with no workspace:
  forward       Y[:, g]  = X[:, g] @ W[g]^T       M=N   N=Kg  K=Kd
  grad-input    dX[:, g] = dY[:, g] @ W[g]        M=N   N=Kd  K=Kg
  grad-weight   dW[g]    = dY[:, g]^T @ X[:, g]   M=Kg  N=Kd  K=N
"""
from ..bias import after_gemm, before_gemm
from ..gemm import Operand as Op
from .base import Algorithm


class FullyConnected(Algorithm):
    name = "fc"

    @staticmethod
    def applies(g):
        if g.kh == g.H and g.kw == g.W and g.pads == ((0, 0), (0, 0)):
            return True, f"kernel {g.kh}x{g.kw} covers the whole input {g.H}x{g.W}: one GEMM per pass"
        return False, (f"needs a kernel covering the whole unpadded input (kernel {g.kh}x{g.kw}, "
                       f"input {g.H}x{g.W}, padding {g.pads})")

    def describe(self, pass_name):
        g = self.g
        mnk = {"forward": (g.N, g.Kg, g.Kd), "backward_input": (g.N, g.Kd, g.Kg),
               "backward_weight": (g.Kg, g.Kd, g.N)}[pass_name]
        return (f"fully-connected GEMM over the whole batch, {g.groups} group(s) in one batched call, "
                f"M={mnk[0]} N={mnk[1]} K={mnk[2]}, no im2col, no workspace")

    def forward(self, queue, x, w, bias, y, ws, relu=False):
        g = self.g
        beta = before_gemm(queue, self.dtype, y, bias, g.N, g.K, g.P, relu)
        self._gemm(queue, g.N, g.Kg, g.Kd, Op(x.buf, x.off, g.C * g.H * g.W, g.Kd), Op(w.buf, w.off, g.Kd, g.Kg * g.Kd),
                   Op(y.buf, y.off, g.K, g.Kg), beta=beta, b_transp=True, what="forward (fc)")
        after_gemm(queue, self.dtype, y, bias, g.N, g.K, g.P, relu)

    def backward_input(self, queue, w, dy, dx, ws):
        g = self.g
        self._gemm(queue, g.N, g.Kd, g.Kg, Op(dy.buf, dy.off, g.K, g.Kg), Op(w.buf, w.off, g.Kd, g.Kg * g.Kd),
                   Op(dx.buf, dx.off, g.C * g.H * g.W, g.Kd), what="grad-input (fc)")

    def backward_weight(self, queue, x, dy, dw, ws):
        g = self.g
        self._gemm(queue, g.Kg, g.Kd, g.N, Op(dy.buf, dy.off, g.K, g.Kg), Op(x.buf, x.off, g.C * g.H * g.W, g.Kd),
                   Op(dw.buf, dw.off, g.Kd, g.Kg * g.Kd), a_transp=True, what="grad-weight (fc)")
