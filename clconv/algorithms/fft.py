"""FFT convolution for stride-1 convolutions whose padded images fit a 64x64 frame (any
padding, dilation, groups).

Each image plane is padded into an FH x FW frame (powers of two) and transformed once; a
filter is transformed once per call. Per frequency, the products summed over channels
(or images) are one complex GEMM, run as a real GEMM on stacked real and imaginary parts
(kernels/fft.cl has the math and the layouts). With F = FH * (FW/2 + 1) kept frequencies, a
(filter, channel) pair costs 4F real multiplications per image where im2col's GEMM costs
kh*kw per output pixel: AlexNet's 5x5 conv2 on 27x27 images (a 32x32 frame) needs 3.0 per
output, against Winograd F(2x2,5x5)'s 9 and im2col's 25. Per chunk of images:
  forward        X = DFT(x); W = DFT(w); Y[f, g] = [Wr Wi][f, g] @ [[Xr Xi]; [Xi -Xr]][f, g];
                 y = IDFT(Y) (+ bias)
  grad-input     the forward pass of the transposed convolution (``g.transposed()``) over dy
  grad-weight    X = DFT(x); DY = DFT(dy); dW[f, g] (+)= [DYr DYi][f, g] @ [[Xr Xi]; [Xi -Xr]][f, g]^T;
                 dw = taps of IDFT(dW)
The F frequencies times the groups are the batch of one batched GEMM; with per-group queues
each group's GEMMs run on its own queue. Grad-weight sums over 2 x (images per chunk) per
GEMM, chunks added on.
"""
import functools

import numpy as np
import pyopencl as cl

from .. import rules
from ..bias import flags
from ..buffers import Ref, idx_for
from ..explanation import Reason
from ..gemm import Epilogue, Operand as Op
from ..programs import ClconvError, get_kernel, launch, work_group_limit
from .base import pow2_at_least
from .transform import Transform, aligned, little_gpu_work

MAX_FRAME = 64        # frame side, at most: one frame row lives in a work-item's registers
MIN_FRAME = 4
MAX_GROUP = 256       # work-items per work-group of the image transforms, at most
FILTER_GROUP = 64     # and channels per work-group of the filter transform


@functools.lru_cache(maxsize=None)
def _twiddles(n, dtype):
    """#defines TW_RE and TW_IM: cos(2 pi j / n) and -sin(2 pi j / n), j < n, as C literals of ``dtype``."""
    angles = 2 * np.pi * np.arange(n) / n
    suffix = "f" if dtype == np.float32 else ""
    literals = {}
    for name, values in (("TW_RE", np.cos(angles)), ("TW_IM", -np.sin(angles))):
        values[np.abs(values) < 1e-12] = 0.0   # exact zeros where the angle is a multiple of pi / 2
        literals[name] = ", ".join(f"{float(v)!r}{suffix}" for v in values)
    return literals


def _filter(kh, kw, dilation):
    """fft.cl's #defines for filter transforms of kh x kw taps ``dilation`` apart."""
    return dict(FILTER_KH=kh, FILTER_KW=kw, FILTER_DH=dilation[0], FILTER_DW=dilation[1])


def _output(h, w, dilation):
    """fft.cl's #defines for output transforms onto an h x w grid of the frame's rows and columns
    ``dilation`` apart."""
    return dict(OUT_OH=h, OUT_OW=w, OUT_DH=dilation[0], OUT_DW=dilation[1])


def frame(g):
    """(FH, FW): the smallest power-of-two frame (at least MIN_FRAME) that holds the padded
    input of the forward and of the transposed convolution, so no output index wraps."""
    (pt, pb), (pl, pr) = g.pads
    eh, ew = g.dilation[0] * (g.kh - 1), g.dilation[1] * (g.kw - 1)
    return (pow2_at_least(max(MIN_FRAME, g.H + pt + pb, g.H + eh)),
            pow2_at_least(max(MIN_FRAME, g.W + pl + pr, g.W + ew)))


def _frequencies(g):
    fh, fw = frame(g)
    return fh * (fw // 2 + 1)


def multiplications_per_output(g, pass_name):
    """Real multiplications of the per-frequency GEMMs per output pixel and (filter, channel) pair."""
    pixels = g.H * g.W if pass_name == "backward_input" else g.OH * g.OW
    return 4 * _frequencies(g) / pixels


class FFT(Transform):
    name, kind = "fft", "FFT"

    @staticmethod
    def applies(g):
        if g.stride != (1, 1):
            return False, f"needs stride 1 (got {g.stride})"
        fh, fw = frame(g)
        if max(fh, fw) > MAX_FRAME:
            return False, f"its padded images need a {fh}x{fw} frame, above {MAX_FRAME}x{MAX_FRAME}"
        return True, (f"stride 1, {fh}x{fw} frames: {multiplications_per_output(g, 'forward'):.1f} multiplications "
                      f"per output where im2col's GEMM needs {g.kh * g.kw}")

    @staticmethod
    def preferred(g, pass_name, device):
        """Whether "auto" should pick this algorithm for ``pass_name`` on ``device`` (it applies
        either way): on GPUs, from rules.FFT_GPU_MIN_FLOP_PER_UNIT, when its GEMMs need at most half the
        multiplications of the next choice (Winograd's for 3x3 and 5x5 filters, else im2col's),
        which pays for its transforms."""
        if not device.type & cl.device_type.GPU:
            return False, Reason("fft", "on CPUs its image transforms cost more than its GEMMs save")
        if min(g.Cg, g.Kg) < rules.FFT_MIN_CHANNELS:
            return False, Reason("fft", f"fewer than {rules.FFT_MIN_CHANNELS} channels or filters per group "
                                        f"(Cg = {g.Cg}, Kg = {g.Kg})")
        small = little_gpu_work(g, device, rules.FFT_GPU_MIN_FLOP_PER_UNIT)
        if small:
            return False, Reason("fft", small)
        fft = multiplications_per_output(g, pass_name)
        if (g.kh, g.kw) in ((3, 3), (5, 5)):
            other, name = 36 / (7 - g.kh) ** 2, "Winograd"
        else:
            other, name = g.kh * g.kw, "im2col"
        if fft > other / 2:
            return False, Reason("fft", f"{fft:.1f} multiplications per output, more than half of {name}'s "
                                        f"{other:.1f}")
        return True, ""

    def __init__(self, g, dtype, device, workspace_limit, per_group=False, gemm="clblast", math="strict", half=False):
        super().__init__(g, dtype, device, workspace_limit, per_group, gemm, math, half)
        self.fh, self.fw = frame(g)
        self.F = _frequencies(g)
        # images per work-group of the image and of the output transforms (FH/2 work-items
        # each): within MAX_GROUP work-items and the device's local memory (each frame's half
        # spectrum, real and imaginary parts). More images per group make longer runs in the
        # spectra's rows (image transforms measured faster with 8 than 4 on GPUs); the output
        # transforms take at most 8 (8 and 4 measured about even there).
        spectrum = 2 * self.fh * (self.fw // 2 + 1) * dtype.itemsize
        fits = [nb for nb in (16, 8, 4, 2, 1) if nb == 1 or (
            nb * self.fh // 2 <= min(MAX_GROUP, device.max_work_group_size) and nb * spectrum <= device.local_mem_size)]
        self.nb, self.nbo = fits[0], min(8, fits[0])
        F = self.F
        self._fit_chunks(workspace_limit,
                         per_image=lambda p, t: F * 2 * (2 * t.C + t.K),   # the image spectra, rotated, and the products
                         fixed=lambda p, t: F * t.K * 2 * t.Cg,          # the filter spectra (or dW)
                         widest=lambda p, t: F * 2 * 2 * max(t.C, t.K))

    def _layout(self, pass_name, B):
        """Offsets of the workspace regions after the first, then its end, for chunks of B
        images. The rotated image spectra X (F, 2C, 2B) come first, at offset 0: they are the
        GEMM's B operand (see gemm.clblast._in_place); then for the convolutions the filter spectra
        (F, K, 2Cg) and the products Y (F, K, 2B), for grad-weight DY (F, K, 2B) and dW (F, K, 2Cg)."""
        t, F = self.geometry[pass_name], self.F
        filters, images = F * t.K * 2 * t.Cg, F * t.K * 2 * B
        second, third = (images, filters) if pass_name == "backward_weight" else (filters, images)
        first = aligned(F * 2 * t.C * 2 * B)
        return first, aligned(first + second), aligned(first + second) + third

    def describe(self, pass_name):
        t, B = self.geometry[pass_name], self.chunk[pass_name]
        chunks = -(-t.N // B) if t.N else 0
        mnk = (t.Kg, 2 * t.Cg, 2 * B) if pass_name == "backward_weight" else (t.Kg, 2 * B, 2 * t.Cg)
        flipped = " of the transposed convolution over grad_output" if pass_name == "backward_input" else ""
        return (f"FFT{flipped}: {self.fh}x{self.fw} frames, {multiplications_per_output(self.g, pass_name):.1f} "
                f"multiplications per output; transforms + {self.F} x {t.groups} batched GEMMs per chunk, "
                f"{chunks} chunk(s) of {B} image(s), per GEMM M={mnk[0]} N={mnk[1]} K={mnk[2]}")

    def facts(self, pass_name):
        t, B = self.geometry[pass_name], self.chunk[pass_name]
        mnk = (t.Kg, 2 * t.Cg, 2 * B) if pass_name == "backward_weight" else (t.Kg, 2 * B, 2 * t.Cg)
        return dict(gemm=mnk, batch=self.F * t.groups, chunks=(-(-t.N // B) if t.N else 0, B), rules=("fft",),
                    notes=(f"{self.fh}x{self.fw} frames",))

    def _kernel(self, queue, name, idx, shape):
        """``name`` built alone (ONLY) for this plan and ``shape``, the #defines of the shapes it
        takes (:func:`_filter`, :func:`_output`; the image transform takes its shape as arguments,
        ``{}``); the image and output transforms with as many images per work-group as the built
        kernel allows. A device may allow a kernel fewer work-items than its max_work_group_size,
        which chose them (Mesa's llvmpipe: 32 of 1024 for these): then fewer images per work-group,
        decided here, where the kernel's limit is first known."""
        while True:
            sizes = dict(NB=self.nb) if name == "fft_image" else dict(NBO=self.nbo) if name == "fft_output" else {}
            knl = get_kernel(queue.context, "fft.cl", name, self.dtype, ONLY=name.upper(), IDX=idx, FH=self.fh,
                             FW=self.fw, **sizes, **_twiddles(max(self.fh, self.fw), self.dtype), **shape)
            if name == "fft_filter":
                return knl
            per_image, images = self.fh // 2, self.nb if name == "fft_image" else self.nbo
            allowed = work_group_limit(knl, queue.device)
            if images * per_image <= allowed:
                return knl
            if per_image > allowed:
                raise ClconvError(f"clconv: {name} for {self.fh}x{self.fw} frames needs work-groups of at least "
                                  f"{per_image}, the device allows {allowed}")
            fewer = 1 << ((allowed // per_image).bit_length() - 1)
            if name == "fft_image":
                self.nb = fewer
            else:
                self.nbo = fewer

    def _images(self, queue, idx, x, n0, nb, C, H, W, pads, Cg, ws, at, rotated, what):
        """Spectra (F, rows, 2 nb) at ``at`` of images n0 ... n0+nb-1 of ``x`` (C channels of
        H x W at (top, left) = ``pads`` in the frame), with rotated rows (groups of Cg) when
        ``rotated``."""
        launch(queue, self._kernel(queue, "fft_image", idx, {}), (nb, self.fh // 2, C), (self.nb, self.fh // 2, 1),
               x.buf, x.off + n0 * C * H * W, ws, at, nb, C, H, W, *pads, Cg, int(rotated),
               what=f"{what}: image transform")

    def _convolve(self, queue, pass_name, x, w, bias, y, ws, what, relu=False):
        """y = conv(x, w) (+ bias) over the pass's geometry, w flipped for grad-input."""
        t, B = self.geometry[pass_name], self.chunk[pass_name]
        idx = idx_for(self.dtype, x, w, y, bias, Ref(ws, 0))
        u, m = self.layout[pass_name]
        knl = self._kernel(queue, "fft_filter", idx, _filter(t.kh, t.kw, t.dilation))
        local = (min(t.Cg, FILTER_GROUP, work_group_limit(knl, queue.device)), 1, 1)
        launch(queue, knl, (t.Cg, self.fw // 2 + 1, t.K), local, w.buf, w.off, ws,
               u, t.K, t.Kg, t.Cg, int(pass_name == "backward_input"),
               what=f"{what}: filter transform")
        output = self._kernel(queue, "fft_output", idx, _output(t.OH, t.OW, (1, 1)))
        b = bias if bias is not None else w
        for n0 in range(0, t.N, B):
            nb = min(B, t.N - n0)
            self._images(queue, idx, x, n0, nb, t.C, t.H, t.W, (t.pads[0][0], t.pads[1][0]), t.Cg, ws, 0, True,
                         what)
            # per (frequency, group): Y (Kg, 2nb) = W (Kg, 2Cg) @ X rotated (2Cg, 2nb)
            # (their operands step G groups from one frequency to the next: see _position_gemm)
            self._position_gemm(queue, t.groups, self.F, t.Kg, 2 * nb, 2 * t.Cg,
                                Op(ws, u, 2 * t.Cg, t.Kg * 2 * t.Cg, t.K * 2 * t.Cg),
                                Op(ws, 0, 2 * nb, 2 * t.Cg * 2 * nb, t.C * 2 * 2 * nb),
                                Op(ws, m, 2 * nb, t.Kg * 2 * nb, t.K * 2 * nb), what=what)
            launch(queue, output, (nb, self.fh // 2, t.K), (self.nbo, self.fh // 2, 1), ws, m,
                   y.buf, y.off + n0 * t.K * t.OH * t.OW, b.buf, b.off, flags(bias, relu), nb, t.K,
                   t.K * t.OH * t.OW, t.OH * t.OW, what=f"{what}: output transform")

    def backward_weight(self, queue, x, dy, dw, ws):
        t, B = self.g, self.chunk["backward_weight"]
        idx = idx_for(self.dtype, x, dy, dw, Ref(ws, 0))
        d, s = self.layout["backward_weight"]
        what = "grad-weight (FFT)"
        for n0 in range(0, t.N, B):
            nb = min(B, t.N - n0)
            self._images(queue, idx, x, n0, nb, t.C, t.H, t.W, (t.pads[0][0], t.pads[1][0]), t.Cg, ws, 0, True,
                         what)
            self._images(queue, idx, dy, n0, nb, t.K, t.OH, t.OW, (0, 0), t.Kg, ws, d, False, what)
            # per (frequency, group): dW (Kg, 2Cg) (+)= DY (Kg, 2nb) @ (X rotated (2Cg, 2nb))^T
            self._position_gemm(queue, t.groups, self.F, t.Kg, 2 * t.Cg, 2 * nb,
                                Op(ws, d, 2 * nb, t.Kg * 2 * nb, t.K * 2 * nb),
                                Op(ws, 0, 2 * nb, 2 * t.Cg * 2 * nb, t.C * 2 * 2 * nb, transp=True),
                                Op(ws, s, 2 * t.Cg, t.Kg * 2 * t.Cg, t.K * 2 * t.Cg),
                                Epilogue(beta=1.0 if n0 > 0 else 0.0), what=what)
        # the taps: IDFT(dW) on the dilated filter grid, as the output transform with the
        # channels for images: tap (ci, k) to dw (k, ci)
        taps = t.kh * t.kw
        taps_output = self._kernel(queue, "fft_output", idx, _output(t.kh, t.kw, t.dilation))
        launch(queue, taps_output, (t.Cg, self.fh // 2, t.K), (self.nbo, self.fh // 2, 1), ws, s,
               dw.buf, dw.off, dw.buf, dw.off, 0, t.Cg, t.K, taps, t.Cg * taps, what=f"{what}: filter transform")
