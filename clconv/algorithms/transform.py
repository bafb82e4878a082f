"""What the transform algorithms (Winograd, FFT) share.

Both transform the operands of each pass, run one batched GEMM per transformed position
(Winograd's 36 tile positions, FFT's frequencies) and transform back. Each pass runs over a
convolution geometry, grad-input over the transposed one (so it is the forward pass over
grad_output with flipped filters); the workspace holds regions at aligned offsets for a
chunk of images, as many images as the budget allows (or, where one image is above it and
the algorithm can cut it, for a piece of one image: see ``_cut``).
"""
from ..gemm import PLAIN, Grid, grid_gemm
from ..programs import INT32_MAX
from .base import Algorithm

ALIGN = 256   # workspace regions start at multiples of this many elements (sub-buffer origins)


def aligned(n):
    return -(-n // ALIGN) * ALIGN


def little_gpu_work(g, device, per_unit):
    """explain()'s words for a pass of ``g`` below ``per_unit`` FLOP per compute unit of GPU
    ``device`` ("on GPUs, N MFLOP a pass (below L, P per compute unit)"), or None where it has
    that much work: the transforms' rules of when their launches do not pay."""
    flop, least = g.flops(), per_unit * device.max_compute_units
    if flop >= least:
        return None
    return f"on GPUs, {flop / 1e6:.0f} MFLOP a pass (below {least / 1e6:.0f}, {per_unit / 1e6:g} per compute unit)"


def pass_geometry(g, pass_name):
    """The convolution a pass of ``g`` runs as a forward pass: grad-input's is the transposed one."""
    return g.transposed() if pass_name == "backward_input" else g


class Transform(Algorithm):
    """A subclass sets ``kind`` (for messages) and defines ``_layout(pass_name, B)``: the
    offsets of its workspace regions after the first (at 0), then their end, for chunks of B
    images; and ``_convolve(queue, pass_name, x, w, bias, y, ws, what, relu)`` for forward and
    grad-input (with ``relu``, the forward's output through max(., 0) as it is written)."""
    kind = None
    MATRIX_UNITS = False
    STRICT_NOTE = "products in float32: the transforms amplify the operands' rounding"

    def __init__(self, g, dtype, device, workspace_limit, per_group=False, gemm="clblast", math="strict", half=False):
        super().__init__(g, dtype, device, workspace_limit, per_group, gemm, math, half)
        self.geometry = {p: pass_geometry(g, p) for p in ("forward", "backward_input", "backward_weight")}
        self.chunk, self.layout = {}, {}

    def _fit_chunks(self, workspace_limit, per_image, fixed, widest, piece_bytes=lambda pass_name: None):
        """Images per chunk of each pass: the most whose layout fits the budget. ``per_image(t)``
        and ``fixed(pass_name, t)``: an estimate of the elements per image and of those that do
        not grow with the images (each called with the pass's name and geometry); ``widest(pass_name, t)``: elements per image of the largest region, kept
        within 32-bit GEMM offsets. ``piece_bytes(pass_name)``: bytes above which the part of one
        image's layout that grows with the image (all but ``fixed``) is cut into pieces of at most
        that much even within the budget, where the algorithm can cut it so (None: only above the
        budget)."""
        g, size, limit = self.g, self.dtype.itemsize, workspace_limit // self.dtype.itemsize
        for pass_name, t in self.geometry.items():
            B = max(1, min(g.N, (limit - fixed(pass_name, t)) // per_image(pass_name, t), INT32_MAX // widest(pass_name, t)))
            while B > 1 and self._layout(pass_name, B)[-1] > limit:   # the estimate ignores alignment
                B -= 1
            layout = self._layout(pass_name, B)
            if layout[-1] > limit:
                layout = self._cut(pass_name, limit, layout[-1])
            else:
                cap, one, base = piece_bytes(pass_name), self._layout(pass_name, 1)[-1], fixed(pass_name, t)
                if cap is not None and (one - base) * size > cap:
                    try:
                        B, layout = 1, self._cut(pass_name, cap // size + base, one, cache=True)
                    except ValueError:   # (not even one piece of the image within it: whole images, as before)
                        pass
            self.chunk[pass_name], self.layout[pass_name], self.workspace[pass_name] = B, layout[:-1], layout[-1]

    def _cut(self, pass_name, limit, whole, cache=False):
        """One image's layout (``whole`` elements) is above the budget (``limit`` elements; with
        ``cache``, the size of pieces that stay in a CPU's caches, not the budget): the layout for
        pieces of an image that fit, or ValueError where the algorithm cannot cut one."""
        g, size = self.g, self.dtype.itemsize
        raise ValueError(f"one image of input {list(g.input_shape)} with weight {list(g.weight_shape)} needs "
                         f"{whole * size} {self.kind} workspace bytes, above the limit of {limit * size} bytes")

    def _position_gemm(self, queue, G, count, m, n, k, a, b, c, epilogue=PLAIN, **kw):
        """The ``count`` x G GEMMs (one per transformed position and group) on
        :class:`clconv.gemm.Operand` s in the workspace, whose ``per_group`` is the step from one
        group to the next and ``per_image`` from one position to the next, G groups later:
        without per-group queues (position, group) is one evenly strided batch."""
        if self.per_group and G > 1:
            grid_gemm(queue, self.gemm, self.dtype, Grid(G, count, m, n, k), a, b, c, epilogue, per_group=True,
                      math=self.math, **kw)
        else:
            flat = (x._replace(per_group=0, per_image=x.per_group) for x in (a, b, c))
            grid_gemm(queue, self.gemm, self.dtype, Grid(1, count * G, m, n, k), *flat, epilogue, math=self.math, **kw)

    def forward(self, queue, x, w, bias, y, ws, relu=False):
        self._convolve(queue, "forward", x, w, bias, y, ws, f"forward ({self.kind})", relu)

    def backward_input(self, queue, w, dy, dx, ws):
        self._convolve(queue, "backward_input", dy, w, None, dx, ws, f"grad-input ({self.kind})")

    def _convolve(self, queue, pass_name, x, w, bias, y, ws, what, relu=False):
        raise NotImplementedError

