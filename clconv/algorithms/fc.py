"""Fully-connected mode: the kernel covers the whole unpadded input (OH = OW = 1).

Then input (N, C*H*W) and output (N, K) are plain matrices, group g owning
columns g*Kd ... of the input and g*Kg ... of the output, and each pass is one
strided-batched GEMM over the groups, over the whole batch, with no workspace:
  forward       Y[:, g]  = X[:, g] @ W[g]^T       M=N   N=Kg  K=Kd
  grad-input    dX[:, g] = dY[:, g] @ W[g]        M=N   N=Kd  K=Kg
  grad-weight   dW[g]    = dY[:, g]^T @ X[:, g]   M=Kg  N=Kd  K=N

With one group, on a GPU, forward and grad-input GEMMs whose grid is too small to fill the
device (squeeze-excitation layers: a few images times 8-1152 outputs, K up to 1152, one
work-group looping over all of K) are cut along K into slices (:func:`clconv.gemm.k_slices`,
the rule 1x1 and im2col use), whose partial results in the workspace are summed in order.
"""
from ..bias import after_gemm, before_gemm
from ..buffers import Ref, idx_for
from ..geometry import PASSES
from ..gemm import Epilogue, Operand as Op, k_slices, unsplit_note
from .base import Algorithm, split_rules
from .partials import fit_slices, partials_size, sum_partials


class FullyConnected(Algorithm):
    name = "fc"

    @staticmethod
    def applies(g):
        if g.kh == g.H and g.kw == g.W and g.pads == ((0, 0), (0, 0)):
            return True, f"kernel {g.kh}x{g.kw} covers the whole input {g.H}x{g.W}: one GEMM per pass"
        return False, (f"needs a kernel covering the whole unpadded input (kernel {g.kh}x{g.kw}, "
                       f"input {g.H}x{g.W}, padding {g.pads})")

    def __init__(self, g, dtype, device, workspace_limit, per_group=False, gemm="clblast", math="strict", half=False):
        super().__init__(g, dtype, device, workspace_limit, per_group, gemm, math, half)
        item = dtype.itemsize   # split-K slices per pass: one group only, as many as the workspace holds
        split = (lambda m, n, k: 1 if g.groups > 1 else
                 fit_slices(k, k_slices(device, gemm, m, n, k, 1, item), workspace_limit // max(1, m * n * item)))
        self.split = {"forward": split(g.N, g.K, g.Kd), "backward_input": split(g.N, g.Kd, g.K), "backward_weight": 1}
        # explain()'s note per pass where MIN_SPLIT_DEPTH alone keeps its product whole
        self.unsplit = ({"forward": unsplit_note(device, gemm, g.N, g.K, g.Kd, 1, item),
                         "backward_input": unsplit_note(device, gemm, g.N, g.Kd, g.K, 1, item)}
                        if g.groups == 1 else {})
        self.workspace["forward"] = partials_size(self.split["forward"], g.N * g.K)
        self.workspace["backward_input"] = partials_size(self.split["backward_input"], g.N * g.Kd)
        # float16 arrays read and written as they are on clconv's GPU kernel (split-K partial sums
        # in float32, summed into the float16 result)
        if half and gemm == "gpu":
            self.half_passes = frozenset(PASSES)

    def describe(self, pass_name):
        g, S = self.g, self.split[pass_name]
        mnk = {"forward": (g.N, g.Kg, g.Kd), "backward_input": (g.N, g.Kd, g.Kg),
               "backward_weight": (g.Kg, g.Kd, g.N)}[pass_name]
        split = (f", split-K into {S} slices of K={mnk[2] // S} summed in order (the grid alone would leave the "
                 "GPU's compute units idle)" if S > 1 else
                 self.unsplit.get(pass_name, "") + ", no workspace")
        return (f"fully-connected GEMM over the whole batch, {g.groups} group(s) in one batched call, "
                f"M={mnk[0]} N={mnk[1]} K={mnk[2]}, no im2col" + split)

    def facts(self, pass_name):
        g, S = self.g, self.split[pass_name]
        mnk = {"forward": (g.N, g.Kg, g.Kd), "backward_input": (g.N, g.Kd, g.Kg),
               "backward_weight": (g.Kg, g.Kd, g.N)}[pass_name]
        return dict(gemm=mnk, batch=S if S > 1 else g.groups, chunks=(1, g.N), splits=S,
                    rules=("fc",) + split_rules(S, self.unsplit.get(pass_name)))

    def forward(self, queue, x, w, bias, y, ws, relu=False):
        g, S, store, h = self.g, self.split["forward"], self._store("forward"), "forward" in self.half_passes
        beta = before_gemm(queue, store, y, bias, g.N, g.K, g.P, relu)
        if S > 1:   # slice s: X[:, s-th Kd/S columns] @ W[:, those columns]^T; one group
            ks, n = g.Kd // S, g.N * g.K
            self._gemm(queue, g.N, g.K, ks, Op(x.buf, x.off, g.Kd, ks, half=h),
                       Op(w.buf, w.off, g.Kd, ks, transp=True, half=h), Op(ws, 0, g.K, n), slices=S,
                       what="forward (fc, split-K)")
            sum_partials(queue, store, idx_for(self.dtype, x, w, y, bias, Ref(ws, 0)), Ref(ws, 0), S, n, y,
                         beta != 0, "forward (fc, sum of slices)", float_parts=h)
        else:
            self._gemm(queue, g.N, g.Kg, g.Kd, Op(x.buf, x.off, g.C * g.H * g.W, g.Kd, half=h),
                       Op(w.buf, w.off, g.Kd, g.Kg * g.Kd, transp=True, half=h), Op(y.buf, y.off, g.K, g.Kg, half=h),
                       Epilogue(beta=beta), what="forward (fc)")
        after_gemm(queue, store, y, bias, g.N, g.K, g.P, relu)

    def backward_input(self, queue, w, dy, dx, ws):
        g, S, h = self.g, self.split["backward_input"], "backward_input" in self.half_passes
        if S > 1:   # slice s: dY[:, s-th K/S filters] @ W[those filters]; one group
            ks, n = g.K // S, g.N * g.Kd
            self._gemm(queue, g.N, g.Kd, ks, Op(dy.buf, dy.off, g.K, ks, half=h),
                       Op(w.buf, w.off, g.Kd, ks * g.Kd, half=h), Op(ws, 0, g.Kd, n), slices=S,
                       what="grad-input (fc, split-K)")
            sum_partials(queue, self._store("backward_input"), idx_for(self.dtype, w, dy, dx, Ref(ws, 0)), Ref(ws, 0),
                         S, n, dx, False, "grad-input (fc, sum of slices)", float_parts=h)
            return
        self._gemm(queue, g.N, g.Kd, g.Kg, Op(dy.buf, dy.off, g.K, g.Kg, half=h),
                   Op(w.buf, w.off, g.Kd, g.Kg * g.Kd, half=h), Op(dx.buf, dx.off, g.C * g.H * g.W, g.Kd, half=h),
                   what="grad-input (fc)")

    def backward_weight(self, queue, x, dy, dw, ws):
        g, h = self.g, "backward_weight" in self.half_passes
        self._gemm(queue, g.Kg, g.Kd, g.N, Op(dy.buf, dy.off, g.K, g.Kg, transp=True, half=h),
                   Op(x.buf, x.off, g.C * g.H * g.W, g.Kd, half=h), Op(dw.buf, dw.off, g.Kd, g.Kg * g.Kd, half=h),
                   what="grad-weight (fc)")
