"""The algorithm contract: what :class:`clconv.plan.Plan` asks of every algorithm.

An algorithm class says whether it applies to a geometry (:meth:`Algorithm.applies`) and
whether ``algorithm="auto"`` should pick it for a pass on a device
(:meth:`Algorithm.preferred`), each with its reason. An instance is built for one geometry,
compute dtype, device, workspace budget, per-group-queue choice, GEMM engine and math mode
(:mod:`clconv.precision`, "strict" where ``MATRIX_UNITS`` is false), and whether the arrays
are float16 (``half``: compute dtype float32); it raises ValueError when it cannot run within
the budget. It then states the workspace each pass needs (``workspace``, in compute-dtype
elements), the passes it runs on float16 arrays as they are (``half_passes``; the plan gives
the others float32 copies; ``HALF_KERNELS``: all of them on GPUs, ``store`` the kernels'
dtype), states each pass's facts for ``explain()``, and enqueues the passes on
:class:`clconv.buffers.Ref` s:

  forward(queue, x, w, bias, y, ws, relu)  y = conv(x, w) (+ bias; bias may be None), then
                                           max(y, 0) with relu, in the same pass over y
  backward_input(queue, w, dy, dx, ws)     dx = grad-input
  backward_weight(queue, x, dy, dw, ws)    dw = grad-weight

``ws`` is the pass's workspace buffer (None when it needs none). Results are overwritten,
never accumulated, and are the same on every run (sums in a fixed order).
"""
import numpy as np
import pyopencl as cl

from ..gemm import PLAIN, Grid, Operand, grid_gemm
from ..geometry import PASSES


def pow2_at_least(n):
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def split_rules(slices, unsplit=""):
    """The split-K rules behind a forward's or grad-input's ``slices`` (rule-split-k-fill), or
    where MIN_SPLIT_DEPTH alone kept it whole (``unsplit``, its note: rule-split-depth)."""
    return ("split-k-fill",) if slices > 1 else ("split-depth",) if unsplit else ()


class Algorithm:
    name = None
    MATRIX_UNITS = True   # whether its GEMMs may run in a matrix-unit mode (clconv.precision)
    HALF_KERNELS = False  # whether its kernels read and write float16 arrays as they are in every pass on GPUs
    STRICT_NOTE = ""      # where not, explain()'s words on why its products stay in float32

    @staticmethod
    def applies(g):
        """(True, why) when the algorithm can run geometry ``g``, else (False, why not)."""
        raise NotImplementedError

    @staticmethod
    def preferred(g, pass_name, device):
        """(True, "") when "auto" should pick it for ``pass_name`` on ``device`` (where it applies),
        else (False, why not)."""
        return True, ""

    def __init__(self, g, dtype, device, workspace_limit, per_group=False, gemm="clblast", math="strict", half=False):
        self.g, self.dtype, self.per_group, self.gemm = g, dtype, per_group, gemm
        self.math = math if self.MATRIX_UNITS else "strict"
        # the dtype its kernels are built for: float16 storage (float sums) where the arrays are
        # float16 (``half``), HALF_KERNELS and the device a GPU (on CPUs such kernels, converting a
        # value at each of its several reads, measured slower than on float32 copies); then every
        # pass reads them as they are. Other algorithms set the half_passes they have
        gpu = bool(device.type & cl.device_type.GPU)
        self.store = np.dtype(np.float16) if half and self.HALF_KERNELS and gpu else dtype
        self.half_passes = frozenset(PASSES) if self.store != dtype else frozenset()
        self.workspace = dict.fromkeys(PASSES, 0)
        # {pass: (offset, elements)} of the workspace where its GEMM packs B in panels (clconv's CPU
        # kernel, gemm_cpu.panels_size); a pass not named, or of 0 elements, packs none. Only there,
        # and not on per-group queues, whose GEMMs pack nothing
        self.panels = {}
        self.packs = gemm == "cpu" and not (per_group and g.groups > 1)

    def describe(self, pass_name):
        """One line on how ``pass_name`` runs, in words."""
        raise NotImplementedError

    def facts(self, pass_name):
        """What ``Plan.explain()`` records of ``pass_name`` (:class:`clconv.explanation.PassRecord`):
        a dict of ``gemm`` (M, N, K) of each GEMM, ``batch`` (GEMMs per grid), ``chunks``
        (chunks, images each) or ``pieces`` (pieces per image, size, unit), ``splits``
        (split-K slices), ``rules`` (names of the rules that shaped the pass) and ``notes``."""
        return {}

    def forward(self, queue, x, w, bias, y, ws, relu=False):
        raise NotImplementedError

    def backward_input(self, queue, w, dy, dx, ws):
        raise NotImplementedError

    def backward_weight(self, queue, x, dy, dw, ws):
        raise NotImplementedError

    def _reserve_panels(self, pass_name, at, size, workspace_limit):
        """The pass packs ``size`` elements of panels at ``at``, after the rest of its workspace,
        where the budget holds them (and none otherwise)."""
        if (at + size) * self.dtype.itemsize > workspace_limit:
            size = 0
        self.panels[pass_name] = (at, size)
        self.workspace[pass_name] = at + size

    def _panels(self, pass_name, ws):
        """Where in ``ws`` the pass's GEMM packs B in panels (an Operand), or None."""
        at, size = self.panels.get(pass_name, (0, 0))
        return Operand(ws, at, 0) if size else None

    def _gemm(self, queue, m, n, k, a, b, c, epilogue=PLAIN, images=1, slices=None, blocks=1, continuous=False, **kw):
        """GEMMs batched over the groups (and ``images``) on this plan's engine and queues; with
        ``slices``, over split-K slices instead of the groups (one group only). ``blocks``,
        ``continuous``: K blocks (:class:`clconv.gemm.Grid`); ``kw``: ``deep``, ``what``. In this
        algorithm's math mode."""
        if slices is not None:
            grid_gemm(queue, self.gemm, self.dtype, Grid(slices, images, m, n, k, blocks, continuous), a, b, c,
                      epilogue, math=self.math, **kw)
            return
        grid_gemm(queue, self.gemm, self.dtype, Grid(self.g.groups, images, m, n, k, blocks, continuous), a, b, c,
                  epilogue, per_group=self.per_group, math=self.math, **kw)

    def _store(self, pass_name):
        """The dtype ``pass_name``'s arrays are stored in: float16 where it reads them as they are."""
        return np.dtype(np.float16) if pass_name in self.half_passes else self.dtype
