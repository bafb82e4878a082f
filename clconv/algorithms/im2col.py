"""General algorithm: im2col + strided-batched CLBlast GEMM over groups and images.

Workspace layout for a chunk of B images (see kernels/im2col.cl):
col is (C*kh*kw) x (B*P); group g owns rows g*Kd ... (g+1)*Kd - 1. Each pass is,
per chunk:
  forward        im2col, then Y[b, g] = W[g] @ col[g][:, b]      (one GEMM per (g, b))
  grad-input     col[g][:, b] = W[g]^T @ dY[b, g], then col2im   (col2im overwrites dX)
  grad-weight    im2col, dY -> (K, B*P), then dW[g] += dY'[g] @ col[g]^T  (one GEMM per g)
The (g, b) GEMMs are strided-batched launches over the larger of the two, looped
over the smaller. Nothing is copied per group: every operand is an offset into
its shared buffer.
"""
from ..bias import prefill_bias
from ..blas import grid_gemm
from ..programs import INT32_MAX, get_kernel, launch
from .common import Ref, i32, iarg, idx_for

TILE = (64, 4)   # work-group shape of the 2-D layout kernels


class Im2col:
    name = "im2col"

    @staticmethod
    def applies(g):
        return True, "general: any shape, stride, padding, dilation and groups"

    def __init__(self, g, dtype, device, workspace_limit, per_group=False):
        self.g, self.dtype, self.per_group = g, dtype, per_group
        itemsize = dtype.itemsize
        rows = g.C * g.kh * g.kw
        self.rows = rows
        per_image = {"forward": rows * g.P, "backward_input": rows * g.P, "backward_weight": (rows + g.K) * g.P}
        if per_image["backward_weight"] * itemsize > workspace_limit:
            raise ValueError(f"one image of input {list(g.input_shape)} with weight {list(g.weight_shape)} needs "
                             f"{per_image['backward_weight'] * itemsize} workspace bytes, above the limit "
                             f"of {workspace_limit} bytes")
        # images per chunk, per pass: as many as the budget allows
        self.chunk = {p: max(1, min(g.N, workspace_limit // (e * itemsize), INT32_MAX // g.P))
                      for p, e in per_image.items()}
        self.workspace = {p: per_image[p] * self.chunk[p] for p in per_image}

    def describe(self, pass_name):
        g, B = self.g, self.chunk[pass_name]
        launches = -(-g.N // B) if g.N else 0
        return (f"im2col + batched GEMM over {g.groups} group(s), chunks of {B} image(s) "
                f"({launches} chunk(s)); per GEMM M={g.Kg} N={g.P} K={g.Kd}")

    def _geometry_args(self, B):
        g = self.g
        (pt, _), (pl, _) = g.pads
        return ((B, g.C, g.H, g.W, g.kh, g.kw, g.OH, g.OW) + g.stride + (pt, pl) + g.dilation)

    def _im2col(self, queue, x, n0, B, ws, idx):
        g = self.g
        knl = get_kernel(queue.context, "im2col.cl", "im2col", self.dtype, IDX=idx)
        launch(queue, knl, (B * g.P, self.rows), TILE,
               x.buf, iarg(idx, x.off + n0 * g.C * g.H * g.W), ws, iarg(idx, 0),
               *map(i32, self._geometry_args(B)), what="im2col")

    def forward(self, queue, x, w, bias, y, ws):
        g, B = self.g, self.chunk["forward"]
        beta = prefill_bias(queue, self.dtype, y, bias, g)
        idx = idx_for(self.dtype, x, w, y, Ref(ws, 0))
        G, Kg, Kd, P = g.groups, g.Kg, g.Kd, g.P
        for n0 in range(0, g.N, B):
            nb = min(B, g.N - n0)
            self._im2col(queue, x, n0, nb, ws, idx)
            grid_gemm(queue, self.dtype, G, nb, Kg, P, Kd, w.buf, ws, y.buf,
                      offsets=(w.off, 0, y.off + n0 * g.K * P),
                      group_strides=(Kg * Kd, Kd * nb * P, Kg * P),
                      image_strides=(0, P, g.K * P),
                      lds=(Kd, nb * P, P), beta=beta, per_group=self.per_group, what="forward")

    def backward_input(self, queue, w, dy, dx, ws):
        g, B = self.g, self.chunk["backward_input"]
        idx = idx_for(self.dtype, w, dy, dx, Ref(ws, 0))
        G, Kg, Kd, P = g.groups, g.Kg, g.Kd, g.P
        knl = get_kernel(queue.context, "im2col.cl", "col2im", self.dtype, IDX=idx)
        for n0 in range(0, g.N, B):
            nb = min(B, g.N - n0)
            grid_gemm(queue, self.dtype, G, nb, Kd, P, Kg, w.buf, dy.buf, ws,
                      offsets=(w.off, dy.off + n0 * g.K * P, 0),
                      group_strides=(Kg * Kd, Kg * P, Kd * nb * P),
                      image_strides=(0, g.K * P, P),
                      lds=(Kd, P, nb * P), a_transp=True, per_group=self.per_group, what="grad-input")
            launch(queue, knl, (nb * g.C * g.H * g.W,), (64,),
                   ws, iarg(idx, 0), dx.buf, iarg(idx, dx.off + n0 * g.C * g.H * g.W),
                   *map(i32, self._geometry_args(nb)), what="col2im")

    def backward_weight(self, queue, x, dy, dw, ws):
        g, B = self.g, self.chunk["backward_weight"]
        idx = idx_for(self.dtype, x, dy, dw, Ref(ws, 0))
        G, Kg, Kd, P = g.groups, g.Kg, g.Kd, g.P
        transpose = get_kernel(queue.context, "im2col.cl", "nchw_to_cnhw", self.dtype, IDX=idx)
        for n0 in range(0, g.N, B):
            nb = min(B, g.N - n0)
            dyt = self.rows * nb * P          # dY' lives after col in the workspace
            self._im2col(queue, x, n0, nb, ws, idx)
            launch(queue, transpose, (nb * P, g.K), TILE, dy.buf, iarg(idx, dy.off + n0 * g.K * P),
                   ws, iarg(idx, dyt), i32(nb), i32(g.K), i32(P), what="grad-weight layout")
            grid_gemm(queue, self.dtype, G, 1, Kg, Kd, nb * P, ws, ws, dw.buf,
                      offsets=(dyt, 0, dw.off), group_strides=(Kg * nb * P, Kd * nb * P, Kg * Kd),
                      image_strides=(0, 0, 0), lds=(nb * P, nb * P, Kd), beta=0.0 if n0 == 0 else 1.0,
                      b_transp=True, per_group=self.per_group, what="grad-weight")

