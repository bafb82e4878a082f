"""1x1 convolution with stride 1 and no padding: GEMM straight on the input.

An image's input (C, H*W) already is its column matrix, so forward and
grad-input are the im2col algorithm's GEMMs without im2col/col2im:
  forward       Y[b, g]  = W[g] @ X[b, g]       M=Kg  N=H*W  K=Cg
  grad-input    dX[b, g] = W[g]^T @ dY[b, g]    M=Cg  N=H*W  K=Kg
one GEMM per (group, image), batched over the larger of the two. grad-weight
sums over the images:
  grad-weight   dW[g] = sum over b of dY[b, g] @ X[b, g]^T    M=Kg  N=Cg  K=H*W per image
On clconv's kernels that sum is the GEMM's own: its depth is one K block per image
(:class:`clconv.gemm.Grid`'s blocks); no layout copies, no partial sums over the images. On the GPU
kernel they are cut into slices of images (or, for few images, of every image's positions) that
fill the device, whose partial sums are summed in order; over small maps (rules.POINTWISE_CONTINUOUS_BELOW) the blocks
are read as one continuous depth and the slices of images chosen by the GEMM's tile model
(:func:`clconv.gemm.best_slices`), or for products at least rules.POINTWISE_DEEP_WEIGHT_K deep run in the
GPU kernel's deep tile. The CPU kernel runs every image's K block in
one launch, into grad_weight, over maps of fewer than rules.POINTWISE_CPU_BLOCKS_BELOW positions. The other
engines, and the CPU kernel over larger maps, take
  part[b, g] = dY[b, g] @ X[b, g]^T,  dW = sum over b of part[b], in order
in chunks of up to as many images as split-K allows slices, when an image has at least
rules.PARTIALS_MIN_SLICE positions, and otherwise the im2col algorithm, whose im2col for a 1x1 kernel is the
(C, N*H*W) layout that makes it one GEMM per group.

On clconv's GPU kernel, forward and grad-input over small maps (rules.POINTWISE_FOLD_BELOW) are one GEMM
per group over every image's positions; on its CPU kernel, grad-input over small maps
(rules.POINTWISE_CPU_TRANSPOSED_BELOW) runs transposed, dX^T = dY^T W. On a GPU, with one group, forward and grad-input
grids of products too small to fill the device are also cut along their K into slices
(:func:`clconv.gemm.k_slices`), the slices taking the grid's group axis, into partial
outputs summed in order. Such grids come from small images with many channels. Forwards of
long products run the GPU kernel's deep tile, split to fill the device more
(:func:`clconv.gemm.gemm_gpu.deep`).
"""
from .. import rules
from ..bias import after_gemm, before_gemm
from ..buffers import Ref, idx_for
from ..geometry import PASSES
from ..gemm import (Epilogue, Operand as Op, best_slices, deep, gemm_cpu, gemm_gpu, k_slices,
                    unsplit_note)
from ..programs import INT32_MAX
from .base import Algorithm, split_rules
from .im2col import Im2col
from .partials import fit_slices, max_slices, partials_size as _partials, sum_partials




class Pointwise(Algorithm):
    name = "1x1"

    @staticmethod
    def applies(g):
        if (g.kh, g.kw) == (1, 1) and g.stride == (1, 1) and g.pads == ((0, 0), (0, 0)):
            return True, "1x1 kernel, stride 1, no padding: the input is already the GEMM operand"
        return False, f"needs a 1x1 kernel with stride 1 and no padding (kernel {g.kh}x{g.kw}, stride {g.stride}, " \
                      f"padding {g.pads})"

    def __init__(self, g, dtype, device, workspace_limit, per_group=False, gemm="clblast", math="strict", half=False):
        super().__init__(g, dtype, device, workspace_limit, per_group, gemm, math, half)
        item = dtype.itemsize
        fits = workspace_limit // (g.K * g.Cg * item)   # grad-weight partial sums the workspace holds
        # grad-weight on the GPU kernel: slices of whole images, or (where that fills the device
        # less: few images) of every image's positions, each at least rules.MIN_K_SLICE positions deep
        self.slices, self.by_images = 1, True
        # small maps: the K blocks read as one continuous depth (no slice padded at each image's
        # end), in slices of whole images chosen by the tile model (gemm_gpu.best_slices)
        self.continuous = gemm == "gpu" and g.P < rules.POINTWISE_CONTINUOUS_BELOW and g.N > 1
        # (and products of such depth on the deep tile: rules.POINTWISE_DEEP_WEIGHT_K)
        self.deep_weight = (self.continuous and g.N * g.P >= rules.POINTWISE_DEEP_WEIGHT_K
                            and gemm_gpu.deep_grid(device, g.Kg, g.Cg, g.groups, item))
        if self.deep_weight:
            self.slices = fit_slices(g.N, k_slices(device, gemm, g.Kg, g.Cg, g.N, g.groups, item,
                                                   -(-rules.POINTWISE_DEEP_WEIGHT_SLICE // g.P), deep=True, min_depth=0),
                                     min(fits, rules.PARTIALS_MAX_SLICES))
        elif self.continuous:   # (one slice needs no workspace)
            options = [d for d in range(1, max(1, min(g.N, fits, rules.PARTIALS_MAX_SLICES)) + 1) if g.N % d == 0]
            self.slices = best_slices(device, g.Kg, g.Cg, g.N * g.P, g.groups, options, item)
        elif self.blocked:
            by_images = fit_slices(g.N, k_slices(device, gemm, g.Kg, g.Cg, g.N, g.groups, item,
                                                 -(-rules.MIN_K_SLICE // g.P), min_depth=0), fits)
            by_positions = fit_slices(g.P, k_slices(device, gemm, g.Kg, g.Cg, g.P, g.groups, item,
                                                    -(-rules.MIN_K_SLICE // g.N), min_depth=0), fits)
            self.by_images = by_images >= by_positions
            self.slices = max(by_images, by_positions)
        # elsewhere: images per chunk of per-image partial sums (1: the im2col layout instead)
        self.images = min(g.N, max_slices(g.K * g.Cg, g.N * g.P), fits) if g.P >= rules.PARTIALS_MIN_SLICE else 1
        self._weight = (None if self.blocked or self.images > 1
                        else Im2col(g, dtype, device, workspace_limit, per_group, gemm, math))
        # split-K slices per pass (one group only: the slices take the grid's group axis), as many
        # as the workspace holds
        # forward and grad-input on the GPU kernel: one GEMM over every image's positions (folded)
        # where a map has fewer than rules.POINTWISE_FOLD_BELOW positions, not a GEMM per image
        self.fold = gemm == "gpu" and g.P < rules.POINTWISE_FOLD_BELOW and g.N * g.P <= INT32_MAX   # (N is a 32-bit argument)
        cols, count = (g.N * g.P, 1) if self.fold else (g.P, g.N)
        # (the forward's long products on clconv's GPU GEMM kernel's deep tile: gemm_gpu.deep)
        self.deep = g.groups == 1 and deep(device, gemm, g.K, cols, g.C, count, item)
        split = (lambda m, k, outputs, in_deep=False: 1 if g.groups > 1 else
                 fit_slices(k, k_slices(device, gemm, m, cols, k, count, item, deep=in_deep),
                            workspace_limit // (outputs * item)))
        # explain()'s note per pass where MIN_SPLIT_DEPTH alone keeps its products whole
        self.unsplit = ({"forward": unsplit_note(device, gemm, g.K, cols, g.C, count, item),
                         "backward_input": unsplit_note(device, gemm, g.C, cols, g.K, count, item)}
                        if g.groups == 1 else {})
        # (grad-weight's own: self.slices in K blocks on clconv's kernels; split-K splits only on the
        # GPU one, where they always are)
        self.split = {"forward": split(g.K, g.C, g.N * g.K * g.P, self.deep),
                      "backward_input": split(g.C, g.K, g.N * g.C * g.P), "backward_weight": 1}
        # grad-input on the CPU kernel over small maps, unsplit: dX^T = dY^T W, stored transposed
        self.transposed = gemm == "cpu" and g.P < rules.POINTWISE_CPU_TRANSPOSED_BELOW and self.split["backward_input"] == 1
        # on clconv's CPU GEMM kernel W^T is packed in the workspace first (gemm_cpu.packed_size), and
        # B (the input, grad_output) in panels after the rest where its rule says so and the budget
        # holds them (gemm_cpu.panels_size)
        first = {"forward": _partials(self.split["forward"], g.N * g.K * g.P),
                 "backward_input": (_partials(self.split["backward_input"], g.N * g.C * g.P)
                                    + (g.K * g.Cg if gemm == "cpu" and not self.transposed else 0))}
        for p, (m, k) in {"forward": (g.Kg, g.Cg), "backward_input": (g.Cg, g.Kg)}.items():
            size = (gemm_cpu.panels_size(device, m, g.P, k, g.groups * g.N, item)
                    if self.packs and self.split[p] == 1 else 0)
            self._reserve_panels(p, first[p], size, workspace_limit)
        # float16 arrays read and written as they are, no float32 copies, on clconv's GPU kernel (whose
        # grad-weight runs in K blocks): split-K slices' partial sums stay float32, summed into the
        # float16 result
        if half and gemm == "gpu":
            self.half_passes = frozenset(PASSES)
        self.workspace["backward_weight"] = (_partials(self.slices, g.K * g.Cg) if self.blocked else
                                             self.images * g.K * g.Cg
                                             if self._weight is None else self._weight.workspace["backward_weight"])
        if self.blocked and self.packs:   # X^T in panels (K blocks)
            self._reserve_panels("backward_weight", self.workspace["backward_weight"],
                                 gemm_cpu.panels_size(device, g.Kg, g.Cg, g.P, g.groups, item, g.N, b_transp=True),
                                 workspace_limit)

    @property
    def blocked(self):
        """Whether grad-weight sums the images in K blocks (clconv's kernels have them)."""
        return self.gemm == "gpu" or self.gemm == "cpu" and self.g.P < rules.POINTWISE_CPU_BLOCKS_BELOW

    def describe(self, pass_name):
        g, S = self.g, self.split[pass_name]
        split = (f", split-K into {S} slices of K={{}} summed in order (the grid alone would leave the GPU's compute "
                 "units idle)") if S > 1 else self.unsplit.get(pass_name, "")
        if pass_name == "backward_weight":
            if self._weight is not None:
                return "1x1: " + self._weight.describe(pass_name)
            if self.blocked:
                S = self.slices
                t = gemm_gpu.EIGHT_BY_FOUR
                blocks, why = ((f"every image's positions one continuous K, at least {rules.POINTWISE_DEEP_WEIGHT_K} deep: clconv's "
                                f"GPU GEMM kernel's deep tile, {t.tm}x{t.tn} of {t.rm}x{t.rn} work-items",
                                f"slices of at least {rules.POINTWISE_DEEP_WEIGHT_SLICE} positions, the fewest that give the deep "
                                f"tile {rules.DEEP_WAVES} work-groups per compute unit, or as many as are that "
                                "deep") if self.deep_weight else
                               ("every image's positions one continuous K", "the GEMM's tile model: a larger tile "
                                "over more slices") if self.continuous else
                               ("one K block per image", "the grid alone would leave the GPU's compute units idle"))
                return (f"1x1 GEMM on the input and grad_output, M={g.Kg} N={g.Cg} K={g.P} per image, "
                        f"{g.groups} group(s), the sum over the images in the GEMM ({blocks})"
                        + (f", {S} slices of " + (f"{g.N // S} image(s)" if self.by_images else
                                                     f"{g.P // S} positions of every image")
                           + f" summed in order ({why})" if S > 1 else "") + ", no layout copies")
            return (f"1x1 GEMM per (group, image) on the input and grad_output, M={g.Kg} N={g.Cg} K={g.P}, "
                    f"partial sums of {self.images} image(s) per launch summed in order, no layout copies")
        m, k = (g.Kg, g.Cg) if pass_name == "forward" else (g.Cg, g.Kg)
        if pass_name == "backward_input" and self.transposed:
            return (f"1x1 GEMM per (group, image) run transposed, grad_input^T = grad_output^T @ weight, "
                    f"{g.groups} group(s) x {g.N} image(s) in one launch, M={g.P} N={g.Cg} K={g.Kg}, grad_output "
                    f"read and grad_input stored transposed in place (fewer than {rules.POINTWISE_CPU_TRANSPOSED_BELOW} positions "
                    "per image: the channels fill the CPU kernel's vectors), no im2col")
        if pass_name == "forward" and self.deep:
            split += ", " + gemm_gpu.deep_note()
        if self.fold:
            return (f"1x1 GEMM on the input, one per group ({g.groups}) over every image's positions (fewer than "
                    f"{rules.POINTWISE_FOLD_BELOW} per image), M={m} N={g.N * g.P} K={k}, no im2col" + split.format(k // S))
        # grouped, the groups are the batch (an image's groups are packed; a group's images are not)
        return (f"1x1 GEMM on the input, {g.groups} group(s) x {g.N} image(s) in "
                f"{1 if g.groups == 1 else g.N} batched launch(es), M={m} N={g.P} K={k}, no im2col"
                + split.format(k // S))

    def facts(self, pass_name):
        g, S = self.g, self.split[pass_name]
        if pass_name == "backward_weight":
            if self._weight is not None:   # the im2col layout
                facts = self._weight.facts(pass_name)
                return dict(facts, notes=("im2col layout", *facts.get("notes", ())))
            if self.blocked:
                S = self.slices
                rules_ = ("1x1-weight-blocks",) + (("gemm-deep-tile",) if self.deep_weight else ())
                notes = ("deep tile" if self.deep_weight else "continuous K" if self.continuous else "K blocks",
                         "slices of images" if self.by_images else "slices of positions")
                return dict(gemm=(g.Kg, g.Cg, g.N * g.P), batch=g.groups * S, chunks=(1, g.N), splits=S,
                            rules=rules_, notes=notes[:1] if S == 1 else notes)
            return dict(gemm=(g.Kg, g.Cg, g.P), batch=g.groups * self.images, chunks=(-(-g.N // self.images),
                        self.images), rules=("1x1-weight-blocks",), notes=("per-image partial sums",))
        m, k = (g.Kg, g.Cg) if pass_name == "forward" else (g.Cg, g.Kg)
        rules_, notes = split_rules(S, self.unsplit.get(pass_name)), []
        if pass_name == "backward_input" and self.transposed:
            return dict(gemm=(g.P, g.Cg, g.Kg), batch=g.groups * g.N, chunks=(1, g.N),
                        rules=("1x1-cpu-transposed",), notes=("transposed",))
        if pass_name == "forward" and self.deep:
            rules_, notes = rules_ + ("gemm-deep-tile",), ["deep tile"]
        if self.fold:
            return dict(gemm=(m, g.N * g.P, k), batch=S if S > 1 else g.groups, chunks=(1, g.N), splits=S,
                        rules=("1x1-fold",) + rules_, notes=tuple(notes))
        return dict(gemm=(m, g.P, k), batch=S * g.N if S > 1 else g.groups * g.N, chunks=(1, g.N), splits=S,
                    rules=rules_, notes=tuple(notes))

    def _columns(self):
        """(columns, images, fold of B and C) of forward and grad-input, whose B is the input or
        grad_output: folded, one GEMM's columns are every image's positions, B read and C stored
        image by image; otherwise a GEMM per image (fold 0)."""
        g = self.g
        if not self.fold:
            return g.P, g.N, 0
        return g.N * g.P, 1, g.P

    def forward(self, queue, x, w, bias, y, ws, relu=False):
        g, S, store, h = self.g, self.split["forward"], self._store("forward"), "forward" in self.half_passes
        beta = before_gemm(queue, store, y, bias, g.N, g.K, g.P, relu)
        if S > 1:   # slice s: W[:, s-th K/S channels] @ X[those channels]; one group
            ks, n = g.C // S, g.N * g.K * g.P
            cols, images, fold = self._columns()
            self._gemm(queue, g.K, cols, ks, Op(w.buf, w.off, g.C, ks, half=h),
                       Op(x.buf, x.off, g.P, ks * g.P, g.C * g.P, fold=fold, half=h),
                       Op(ws, 0, g.P, n, g.K * g.P, fold=fold), images=images, slices=S, deep=self.deep,
                       what="forward (1x1, split-K)")
            sum_partials(queue, store, idx_for(self.dtype, x, w, y, bias, Ref(ws, 0)), Ref(ws, 0), S, n, y,
                         beta != 0, "forward (1x1, sum of slices)", float_parts=h)
        else:
            cols, images, fold = self._columns()
            self._gemm(queue, g.Kg, cols, g.Cg, Op(w.buf, w.off, g.Cg, g.Kg * g.Cg, half=h),
                       Op(x.buf, x.off, g.P, g.Cg * g.P, g.C * g.P, fold=fold, pack=self._panels("forward", ws), half=h),
                       Op(y.buf, y.off, g.P, g.Kg * g.P, g.K * g.P, fold=fold, half=h), Epilogue(beta=beta),
                       images=images, deep=self.deep, what="forward (1x1)")
        after_gemm(queue, store, y, bias, g.N, g.K, g.P, relu)

    def backward_input(self, queue, w, dy, dx, ws):
        g, S, h = self.g, self.split["backward_input"], "backward_input" in self.half_passes
        if S > 1:   # slice s: W[s-th K/S filters]^T @ dY[those filters]; one group
            ks, n = g.K // S, g.N * g.C * g.P
            cols, images, fold = self._columns()
            self._gemm(queue, g.C, cols, ks, Op(w.buf, w.off, g.C, ks * g.C, transp=True, half=h),
                       Op(dy.buf, dy.off, g.P, ks * g.P, g.K * g.P, fold=fold, half=h),
                       Op(ws, 0, g.P, n, g.C * g.P, fold=fold), images=images, slices=S,
                       what="grad-input (1x1, split-K)")
            sum_partials(queue, self._store("backward_input"), idx_for(self.dtype, w, dy, dx, Ref(ws, 0)), Ref(ws, 0),
                         S, n, dx, False, "grad-input (1x1, sum of slices)", float_parts=h)
            return
        if self.transposed:   # dX^T (P x Cg) = dY^T (P x Kg) @ W (Kg x Cg), dY and dX transposed in place
            self._gemm(queue, g.P, g.Cg, g.Kg, Op(dy.buf, dy.off, g.P, g.Kg * g.P, g.K * g.P, transp=True),
                       Op(w.buf, w.off, g.Cg, g.Kg * g.Cg), Op(dx.buf, dx.off, g.P, g.Cg * g.P, g.C * g.P, transp=True),
                       images=g.N, what="grad-input (1x1, transposed)")
            return
        cols, images, fold = self._columns()
        self._gemm(queue, g.Cg, cols, g.Kg, Op(w.buf, w.off, g.Cg, g.Kg * g.Cg, transp=True, pack=Op(ws, 0, 0), half=h),
                   Op(dy.buf, dy.off, g.P, g.Kg * g.P, g.K * g.P, fold=fold, pack=self._panels("backward_input", ws),
                      half=h),
                   Op(dx.buf, dx.off, g.P, g.Cg * g.P, g.C * g.P, fold=fold, half=h), images=images,
                   what="grad-input (1x1)")

    def backward_weight(self, queue, x, dy, dw, ws):
        if self._weight is not None:
            self._weight.backward_weight(queue, x, dy, dw, ws)
            return
        g, B, n = self.g, self.images, self.g.K * self.g.Cg
        if self.blocked:   # slice j: images j * nb ... (j + 1) * nb - 1, or positions j * ps ... of every image
            S, h = self.slices, "backward_weight" in self.half_passes
            nb, ps = (g.N // S, g.P) if self.by_images else (g.N, g.P // S)
            step_y, step_x = (nb * g.K * g.P, nb * g.C * g.P) if self.by_images else (ps, ps)
            c = Op(dw.buf, dw.off, g.Cg, g.Kg * g.Cg, half=h) if S == 1 else Op(ws, 0, g.Cg, g.Kg * g.Cg, n)
            self._gemm(queue, g.Kg, g.Cg, ps, Op(dy.buf, dy.off, g.P, g.Kg * g.P, step_y, k_step=g.K * g.P, half=h),
                       Op(x.buf, x.off, g.P, g.Cg * g.P, step_x, k_step=g.C * g.P, transp=True,
                          pack=self._panels("backward_weight", ws), half=h), c, images=S, blocks=nb,
                       continuous=self.continuous, deep=self.deep_weight, what="grad-weight (1x1, K blocks)")
            if S > 1:
                sum_partials(queue, self._store("backward_weight"), idx_for(self.dtype, x, dy, dw, Ref(ws, 0)),
                             Ref(ws, 0), S, n, dw, False, "grad-weight (1x1, sum of slices)", float_parts=h)
            return
        idx = idx_for(self.dtype, x, dy, dw, Ref(ws, 0))
        for n0 in range(0, g.N, B):
            nb = min(B, g.N - n0)
            dy0, x0 = dy.off + n0 * g.K * g.P, x.off + n0 * g.C * g.P
            self._gemm(queue, g.Kg, g.Cg, g.P, Op(dy.buf, dy0, g.P, g.Kg * g.P, g.K * g.P),
                       Op(x.buf, x0, g.P, g.Cg * g.P, g.C * g.P, transp=True), Op(ws, 0, g.Cg, g.Kg * g.Cg, n),
                       images=nb, what="grad-weight (1x1)")
            sum_partials(queue, self.dtype, idx, Ref(ws, 0), nb, n, dw, n0 > 0, "grad-weight (1x1, sum of images)")

