"""A small sweep of every kernel and algorithm, meant to run under Oclgrind.

    make check-kernels

runs it twice with Oclgrind as the OpenCL device and fails unless Oclgrind's
log is empty each time:
  python tests/oclgrind_sweep.py             CLBlast GEMMs, Oclgrind's data-race and
                                             memory-access checks (--data-races)
  python tests/oclgrind_sweep.py --host-gemm every GEMM done on the host instead, with
                                             --data-races --uninitialized
(--only TEXT runs only the entries whose names contain TEXT.)
The second run exists because Oclgrind's uninitialised-value tracking reports
CLBlast's own optimised kernels even on fully initialised inputs (a plain
3x10x6 SGEMM is enough), and that taint then reaches every kernel reading a
GEMM result. With the GEMM on the host, each of our kernels is checked with
the same offsets and layouts; that run also has entries on clconv's own GEMM
kernel. The sweep checks every result against the NumPy reference and exits
non-zero on a mismatch.
"""
import os
import sys

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
from numpy.lib.stride_tricks import as_strided

import clconv
from clconv import rules
from clconv import reference
from clconv.algorithms import direct, fc, im2col, pointwise
from clconv.gemm import clblast as blas, gemm_cpu, k_slices
from helpers import QueueAs

PANEL_RULES = {rule: getattr(rules, rule) for rule in ("PANEL_MIN_ROWS", "PANEL_MIN_DEPTH", "PANEL_MIN_ROW_BYTES",
                                                         "BT_PANEL_MIN_ROWS")}
BAND_BYTES = rules.DIRECT_BAND_BYTES
GROUPS_PER_UNIT = rules.DIRECT_GROUPS_PER_UNIT

# (name, input shape, weight shape, options, algorithm, queues, workspace limit in bytes or None)
SWEEP = [
    ("im2col", (2, 4, 5, 6), (6, 2, 3, 2), dict(stride=(2, 1), padding=((1, 0), (2, 1)), groups=2), "im2col",
     "single", None),
    ("im2col_dilated_same", (1, 3, 6, 5), (2, 3, 3, 3), dict(padding="same", dilation=(2, 1)), "im2col", "single",
     None),
    ("im2col_split_k", (2, 2, 16, 17), (3, 2, 3, 3), dict(padding=1), "im2col", "single", None),
    ("im2col_chunked", (3, 2, 5, 4), (4, 1, 2, 2), dict(groups=2), "im2col", "single", 2 * 4 * 4 * 20 * 4),
    # one image in tiles of 2 output rows: col of 2 rows (4 x 3 x 3 taps x 2 x 4 columns) is the budget
    ("im2col_tiles", (2, 4, 9, 7), (4, 2, 3, 3), dict(stride=(2, 1), padding=((2, 1), (1, 0)), dilation=(1, 2),
                                                  groups=2), "im2col", "single", 4 * 9 * 2 * 4 * 4),
    # tiles of 2 output columns of one row: col of 2 positions (3 x 3 x 3 taps x 2) is the budget
    ("im2col_column_tiles", (1, 3, 5, 11), (4, 3, 3, 3), dict(stride=(1, 2), padding=((1, 0), (2, 1))), "im2col",
     "single", 3 * 9 * 2 * 4),
    ("im2col_per_group_queues", (2, 4, 5, 6), (6, 2, 3, 3), dict(padding=1, groups=2), "im2col", "per-group",
     None),
    # split-K of forward and grad-input (a GPU's rule, forced: slices=)
    ("im2col_split_k_fwd_dgrad", (3, 6, 9, 7), (8, 3, 3, 3), dict(stride=2, padding=(1, 0), groups=2, slices=3),
     "im2col", "single", None),
    ("fc", (3, 4, 3, 2), (6, 2, 3, 2), dict(groups=2), "fc", "single", None),
    ("fc_split_k", (2, 6, 2, 1), (9, 6, 2, 1), dict(slices=3), "fc", "single", None),
    ("1x1_split_k", (2, 6, 16, 17), (12, 6, 1, 1), dict(slices=3), "1x1", "single", None),
    ("1x1", (2, 6, 3, 5), (4, 3, 1, 1), dict(groups=2), "1x1", "single", None),
    ("direct_depthwise", (2, 3, 7, 6), (6, 1, 3, 3), dict(stride=2, padding=1, groups=3), "direct", "single",
     None),
    ("direct_two_rows_per_item", (1, 2, 18, 10), (4, 1, 3, 3), dict(padding=1, groups=2), "direct", "single",
     None),
    ("direct_overpad", (1, 3, 5, 7), (6, 1, 3, 2), dict(padding=((3, 1), (0, 2)), groups=3), "direct", "single",
     None),
    ("direct_few_channels", (2, 3, 11, 10), (8, 3, 5, 5), dict(stride=2, padding=2), "direct", "single", None),
    ("im2col_float16", (2, 4, 5, 6), (6, 2, 3, 2), dict(padding=1, groups=2, dtype=np.float16), "im2col",
     "single", None),
    # float16 arrays read and written as they are (Oclgrind calls itself a GPU): direct's staged forward
    # and grad-weight partials, its strided grad-input; Winograd's transforms
    ("direct_float16", (2, 3, 7, 6), (6, 1, 3, 3), dict(stride=2, padding=1, groups=3, dtype=np.float16), "direct",
     "single", None),
    ("winograd_float16", (2, 4, 7, 9), (4, 2, 3, 3), dict(padding=1, groups=2, dtype=np.float16), "winograd",
     "single", None),
    ("direct_small_groups", (1, 4, 6, 7), (4, 2, 2, 3), dict(padding=(1, 0), dilation=(2, 1), groups=2), "direct",
     "single", None),
    # the GPU forward's planes per work-group (groups_per_unit=0: as where many work-groups remain):
    # read in place, 15 planes in work-groups of four; staged, two filters per work-item, 9 planes;
    # staged in tiles of 16 work-items (no read-ahead), 9 planes
    ("direct_in_place_planes", (3, 5, 9, 7), (5, 1, 3, 3), dict(stride=2, padding=1, groups=5, groups_per_unit=0),
     "direct", "single", None),
    ("direct_staged_planes", (3, 6, 8, 9), (6, 2, 5, 5), dict(padding=2, groups=3, groups_per_unit=0), "direct",
     "single", None),
    ("direct_staged_planes_no_read_ahead", (3, 2, 3, 4), (3, 2, 5, 5), dict(padding=2, groups_per_unit=0), "direct",
     "single", None),
    # groups of 8 channels (72 taps), as "auto" runs them on CPUs, and their GPU forms forced
    ("direct_groups_of_8", (1, 16, 7, 6), (4, 8, 3, 3), dict(stride=2, padding=1, groups=2), "direct", "single",
     None),
    ("cpu_direct_groups_of_8", (1, 16, 7, 6), (4, 8, 3, 3), dict(stride=2, padding=1, groups=2, cpu=True), "direct",
     "single", None),
    ("winograd_dilated_overpad", (2, 4, 7, 9), (4, 2, 3, 3), dict(padding=((5, 1), (0, 3)), dilation=2, groups=2),
     "winograd", "per-group", None),
    ("winograd_5x5_overpad", (2, 2, 9, 8), (3, 2, 5, 5), dict(padding=((5, 0), (1, 4))), "winograd", "single",
     None),
    ("winograd_split_k", (2, 1, 32, 32), (2, 1, 5, 5), dict(padding=2), "winograd", "single", None),
    # F(2, 7) along one axis: a tile cut by the edge, dilation, padding past the filter, groups; a 7x1
    ("winograd_1x7_dilated_overpad", (2, 4, 3, 13), (2, 2, 1, 7), dict(padding=((1, 0), (2, 7)), dilation=(1, 2),
                                                                      groups=2), "winograd", "per-group", None),
    ("winograd_7x1", (1, 3, 9, 4), (2, 3, 7, 1), dict(padding=(3, 1)), "winograd", "single", None),
    # one image per chunk: grad-weight's 1240 floats (V, Z, dU at 256-element boundaries) fit, two do not
    # each image in pieces of 2 of its 4 tile rows (the budget is below one image's workspace)
    ("winograd_pieces", (2, 2, 14, 9), (3, 2, 3, 3), dict(padding=((1, 2), (1, 0)), dilation=(2, 1)), "winograd",
     "single", 7200),
    ("winograd_chunked", (3, 2, 6, 5), (3, 2, 3, 3), dict(padding=1), "winograd", "single", 1240 * 4),
    ("fft_dilated_overpad_per_group", (2, 4, 6, 5), (4, 2, 3, 2), dict(padding=((4, 0), (1, 2)), dilation=(1, 2),
                                                                      groups=2), "fft", "per-group", None),
    # one image per chunk: every pass's spectra of one image (1184-1264 floats) fit, of two (1760-1856) do not
    ("fft_chunked", (3, 2, 5, 4), (3, 2, 3, 3), dict(padding=1), "fft", "single", 1500 * 4),
    # clconv's own GEMM kernels in place of CLBlast's: in the host-gemm run only, which has every
    # check (Oclgrind simulates the GPU kernel's 64-256 work-item groups slowly). Oclgrind calls
    # itself a GPU too, so "clconv" is the GPU kernel (kernels/gemm_gpu.cl); "cpu" the CPU one
    # (kernels/gemm_cpu.cl) in each of its forms
    ("own_gemm_im2col_split_k", (2, 2, 16, 17), (3, 2, 3, 3), dict(padding=1, gemm="clconv"), "im2col", "single",
     None),   # two channels: im2col read in place by the GEMM (implicit), as below
    ("own_gemm_implicit_im2col_groups", (3, 4, 9, 7), (4, 2, 3, 3), dict(stride=2, padding=1, dilation=(1, 2),
                                                                         groups=2, gemm="clconv"), "im2col",
     "single", None),
    # taps no wider than the stride: im2col read in place whatever the channels
    ("own_gemm_implicit_im2col_apart", (2, 6, 7, 9), (5, 6, 2, 2), dict(stride=(2, 3), gemm="clconv"), "im2col",
     "single", None),
    # grad-input's GEMM reading grad_output in place, its images' positions folded into the columns
    # (48 per image: four-wide reads; 35: a value at a time), then col2im with the taps built in;
    # grad-weight's too, folded into the depth (48 per image; 35: through the layout copy), in split-K
    # slices (six images: 288 positions; on GPUs a chunk of fewer than 256 is not split)
    ("own_gemm_im2col_folded_grad_output", (6, 10, 8, 6), (4, 5, 3, 3), dict(padding=1, groups=2, gemm="clconv"),
     "im2col", "single", None),
    ("own_gemm_im2col_folded_grad_output_odd", (2, 6, 9, 7), (5, 6, 3, 2), dict(stride=(1, 2), padding=(1, 2),
                                                                               dilation=(2, 1), gemm="clconv"),
     "im2col", "single", None),
    # grad-weight over small maps: every image's positions one continuous K (25: read a value at a time;
    # 12: four-wide)
    ("own_gemm_1x1_continuous_k", (4, 3, 5, 5), (5, 3, 1, 1), dict(gemm="clconv"), "1x1", "single", None),
    ("own_gemm_1x1_continuous_k_vectors", (3, 4, 4, 3), (8, 4, 1, 1), dict(gemm="clconv"), "1x1", "single", None),
    # 15 positions per image: forward and grad-input one GEMM per group over every image's positions
    ("own_gemm_1x1_groups_x_images", (3, 6, 3, 5), (4, 3, 1, 1), dict(groups=2, gemm="clconv"), "1x1", "single",
     None),
    # grad-weight's sum over the images in K blocks: slices of one image, of 128 positions of one image
    ("own_gemm_1x1_k_blocks_image_slices", (3, 2, 16, 16), (3, 2, 1, 1), dict(gemm="clconv", slices=3), "1x1",
     "single", None),
    ("own_gemm_1x1_k_blocks_position_slices", (1, 4, 16, 16), (6, 2, 1, 1), dict(groups=2, gemm="clconv", slices=2),
     "1x1", "single", None),
    ("own_gemm_fc_per_group", (3, 4, 3, 2), (6, 2, 3, 2), dict(groups=2, gemm="clconv"), "fc", "per-group", None),
    ("own_gemm_winograd", (1, 4, 5, 6), (4, 2, 3, 3), dict(padding=1, groups=2, gemm="clconv"), "winograd",
     "single", None),
    ("cpu_gemm_im2col_split_k_groups", (2, 4, 16, 17), (6, 2, 3, 3), dict(padding=1, groups=2, gemm="cpu"), "im2col",
     "single", None),
    ("cpu_gemm_1x1_k_blocks", (3, 2, 16, 16), (3, 2, 1, 1), dict(gemm="cpu"), "1x1", "single", 2 * 3 * 2 * 4),
    # 35 positions per image: the last column block shifted over the one before, K blocks with a tail
    ("cpu_gemm_1x1_shifted_block_k_tail", (3, 5, 5, 7), (11, 5, 1, 1), dict(gemm="cpu"), "1x1", "single", None),
    # grad-input over maps of fewer than 32 positions, transposed: a shifted last column block and
    # two K slices (of 512 at Oclgrind's 4-wide vectors); a group narrower than one block
    ("cpu_gemm_1x1_transposed", (2, 37, 5, 5), (520, 37, 1, 1), dict(gemm="cpu"), "1x1", "single", None),
    ("cpu_gemm_1x1_transposed_g2", (3, 12, 3, 5), (10, 6, 1, 1), dict(groups=2, gemm="cpu"), "1x1", "single", None),
    ("cpu_gemm_fc_groups", (3, 4, 3, 2), (6, 2, 3, 2), dict(groups=2, gemm="cpu"), "fc", "single", None),
    ("cpu_gemm_winograd", (1, 4, 5, 6), (4, 2, 3, 3), dict(padding=1, groups=2, gemm="cpu"), "winograd",
     "single", None),
    # B packed in panels (forward, grad-input) and B^T packed transposed (grad-weight): the packing
    # rules lowered to every product ("panels")
    ("cpu_gemm_im2col_panels", (2, 4, 9, 7), (6, 2, 3, 3), dict(stride=(2, 1), padding=1, groups=2, gemm="cpu",
                                                                panels=True), "im2col", "single", None),
    ("cpu_gemm_1x1_panels", (3, 6, 5, 7), (10, 3, 1, 1), dict(groups=2, gemm="cpu", panels=True), "1x1", "single",
     None),
    ("cpu_gemm_winograd_panels", (1, 6, 5, 6), (10, 3, 3, 3), dict(padding=1, groups=2, gemm="cpu", panels=True),
     "winograd", "single", None),
    # the kernels made for CPU devices (their row forms): Oclgrind calls itself a GPU, so these
    # plans are built on the queue as a CPU device would report it (helpers.QueueAs)
    ("cpu_direct_depthwise_s2_overpad", (2, 3, 9, 11), (6, 1, 3, 3), dict(stride=2, padding=((2, 1), (1, 3)),
                                                                           groups=3, cpu=True), "direct",
     "single", None),
    # rows of 37 outputs: longer than direct_rows' short-row form takes (the entries above are short)
    # rows of one vector, several output rows summed at once
    ("cpu_direct_depthwise_short_rows_blocked", (2, 4, 7, 7), (4, 1, 5, 5), dict(padding=2, groups=4, cpu=True),
     "direct", "single", None),
    ("cpu_direct_depthwise_long_rows", (1, 2, 5, 37), (2, 1, 3, 3), dict(padding=1, groups=2, cpu=True), "direct",
     "single", None),
    ("cpu_direct_groups_d2", (1, 4, 10, 13), (8, 2, 3, 3), dict(padding=2, dilation=2, groups=2, cpu=True),
     "direct", "single", None),
    # the zero-padded input band in local memory (the long rows above take it too): bands of fewer
    # rows than a plane's, stride 2, a filter taller than the image
    ("cpu_direct_band_of_fewer_rows", (4, 8, 13, 29), (8, 1, 7, 7), dict(padding=3, groups=8, cpu=True,
                                                                         band_bytes=3200), "direct", "single", None),
    # grad-weight's band: bands of 8 and 3 rows, a work-item's slice ending inside an image
    ("cpu_direct_band_weight_rows", (3, 4, 11, 13), (4, 1, 3, 3), dict(padding=1, groups=4, cpu=True,
                                                                       band_bytes=720), "direct", "single", None),
    ("cpu_direct_band_s2_tall_filter", (1, 4, 5, 23), (4, 2, 7, 5), dict(stride=2, padding=(3, 2), groups=2,
                                                                         cpu=True), "direct", "single", None),
    ("cpu_winograd_3x3_dilated", (2, 3, 9, 14), (4, 3, 3, 3), dict(padding=(1, 2), dilation=(1, 2), cpu=True),
     "winograd", "single", None),
    ("cpu_winograd_5x5_split_k", (2, 1, 32, 30), (2, 1, 5, 5), dict(padding=2, cpu=True), "winograd", "single",
     None),
    # the transforms' lanes side by side in one tile row (rows of patches loaded whole), padding at
    # both ends, chunks across tile rows and images; rows of tiles dilated
    ("cpu_winograd_rows", (2, 3, 7, 37), (4, 3, 3, 3), dict(padding=1, cpu=True), "winograd", "single", None),
    ("cpu_winograd_rows_d2x1", (1, 2, 13, 21), (3, 2, 3, 3), dict(padding=(2, 1), dilation=(2, 1), cpu=True),
     "winograd", "single", None),
    # F(2, 7) in rows: a 7x1's lanes in one tile row of 11 columns (the one-tap axis padded, dilated
    # rows) and across tile rows; a 1x7's 2-output tiles, 9 to a tile row, its last tile cut
    ("cpu_winograd_7x1_rows", (1, 2, 9, 10), (3, 2, 7, 1), dict(padding=((3, 2), (0, 1)), dilation=(2, 1), cpu=True),
     "winograd", "single", None),
    ("cpu_winograd_1x7_rows", (2, 2, 3, 17), (3, 2, 1, 7), dict(padding=(1, 3), cpu=True), "winograd", "single",
     None),
    ("cpu_winograd_5x5_pieces", (1, 3, 13, 10), (2, 3, 5, 5), dict(padding=2, cpu=True), "winograd", "single",
     9600),
    ("cpu_im2col_column_tiles", (1, 3, 5, 11), (4, 3, 3, 3), dict(stride=(1, 2), padding=((1, 0), (2, 1)), cpu=True),
     "im2col", "single", 3 * 9 * 2 * 4),
    ("cpu_im2col_patchify_s4", (1, 3, 13, 18), (4, 3, 4, 4), dict(stride=4, cpu=True), "im2col", "single", None),
    ("cpu_im2col_strided_dilated", (2, 4, 11, 13), (6, 2, 3, 2), dict(stride=(2, 3), padding=((2, 0), (1, 2)),
                                                                      dilation=(1, 2), groups=2, cpu=True),
     "im2col", "single", None),
    # col2im_rows over tiles of 2 output rows (their input rows added after the first tile's)
    ("cpu_im2col_tiles", (2, 4, 9, 7), (4, 2, 3, 3), dict(stride=(2, 1), padding=((2, 1), (1, 0)), dilation=(1, 2),
                                                          groups=2, cpu=True), "im2col", "single", 4 * 9 * 2 * 4 * 4),
    ("cpu_im2col_1x1_stride_2", (2, 5, 9, 11), (3, 5, 1, 1), dict(stride=2, cpu=True), "im2col", "single", None),
]


def host_gemm(queue, dtype, m, n, k, count, a, a_off, lda, a_stride, b, b_off, ldb, b_stride, c, c_off, ldc,
              c_stride, *, alpha=1.0, beta=0.0, a_transp=False, b_transp=False, what=""):
    """clconv.gemm.clblast.gemm_strided_batched computed with NumPy on host copies of the buffers."""
    queue.finish()
    host = {}
    for buf in (a, b, c):
        if buf.int_ptr not in host:
            host[buf.int_ptr] = np.empty(buf.size // dtype.itemsize, dtype)
            cl.enqueue_copy(queue, host[buf.int_ptr], buf)
    A, B, C = (host[buf.int_ptr] for buf in (a, b, c))
    src = {id(A): A.copy(), id(B): B.copy()}   # inputs as they were before any C write

    def mat(h, off, rows, cols, ld):
        return as_strided(h[off:], (rows, cols), (ld * h.itemsize, h.itemsize))
    for i in range(count):
        op_a = mat(src[id(A)], a_off + i * a_stride, *((k, m) if a_transp else (m, k)), lda)
        op_b = mat(src[id(B)], b_off + i * b_stride, *((n, k) if b_transp else (k, n)), ldb)
        out = mat(C, c_off + i * c_stride, m, n, ldc)
        prod = alpha * ((op_a.T if a_transp else op_a) @ (op_b.T if b_transp else op_b))
        out[...] = prod + beta * out if beta else prod
    cl.enqueue_copy(queue, c, C)
    queue.finish()


def main():
    queue = clconv.default_queue()
    if "--host-gemm" in sys.argv:
        blas.gemm_strided_batched = host_gemm
    platform = queue.device.platform.name
    if platform != "Oclgrind":
        print(f"the OpenCL platform in use is {platform!r}, not Oclgrind", file=sys.stderr)
        return 2
    # No device buffer is released during the sweep: Oclgrind (--uninitialized) reuses a released
    # buffer's slot and then takes writes past the old buffer's size as unwritten, reporting
    # uninitialised values the kernels never read (seen after a forward's 24-byte bias array
    # was released; the same run with it kept reported nothing). So every array is uploaded
    # here and kept (results and workspaces come from clconv's pools, which keep their blocks).
    kept = []

    def device(a):
        kept.append(cla.to_device(queue, a))
        return kept[-1]
    failures = 0
    rng = np.random.default_rng(0)
    # im2col's GPU work rule set aside: on Oclgrind's device (a GPU, among its types, of one compute
    # unit) every entry is little work and would read im2col in place, which the entries above
    # reach through their channels and taps (few, or apart) instead; the others write col
    rules.IM2COL_GPU_IMPLICIT_FLOP_PER_UNIT = {"forward": 0, "backward_weight": 0}
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""   # a part of the names to run
    for name, xs, ws, opts, algorithm, queues, limit in SWEEP:
        if only not in name:
            continue
        opts = dict(opts)
        dtype = np.dtype(opts.pop("dtype", np.float32))
        # Oclgrind calls itself every device type, GPU too: name the GEMM engine
        engine = opts.pop("gemm", "clblast")
        as_cpu = opts.pop("cpu", False)
        slices = opts.pop("slices", None)   # split-K slices the GEMM rule gives, forced (None: the rule's)
        lowered = 1 if opts.pop("panels", False) else None   # the packing rules' thresholds, lowered
        rules.DIRECT_BAND_BYTES = opts.pop("band_bytes", BAND_BYTES)   # direct_rows' input band, made smaller
        rules.DIRECT_GROUPS_PER_UNIT = opts.pop("groups_per_unit", GROUPS_PER_UNIT)   # 0: the forward's forms' rules
        for rule, value in PANEL_RULES.items():
            setattr(rules, rule, lowered or value)
        for module in (fc, im2col, pointwise):
            # (im2col on the GPU engine: grad-weight's slices limited to this many too)
            module.k_slices = (lambda *args, n=slices, **kw: n) if slices else k_slices
        if engine != "clblast" and "--host-gemm" not in sys.argv:
            continue
        x = rng.standard_normal(xs).astype(dtype)
        w = rng.standard_normal(ws).astype(dtype)
        b = rng.standard_normal(ws[0]).astype(dtype)
        on = QueueAs(queue, type=cl.device_type.CPU) if as_cpu else queue
        p = clconv.Plan(clconv.conv_geometry(xs, ws, **opts), dtype, on, algorithm=algorithm, queues=queues,
                        workspace_limit=limit, gemm=engine)
        g = p.geometry
        dy = rng.standard_normal(g.output_shape).astype(dtype)
        dev = {k: device(v) for k, v in dict(x=x, w=w, b=b, dy=dy, y=np.zeros(g.output_shape, dtype),
                                             yr=np.zeros(g.output_shape, dtype), dx=np.zeros(xs, dtype),
                                             dw=np.zeros(ws, dtype)).items()}
        p.forward(dev["x"], dev["w"], dev["b"], out=dev["y"])
        p.forward(dev["x"], dev["w"], dev["b"], out=dev["yr"], relu=True)
        p.backward_input(dev["w"], dev["dy"], out=dev["dx"])
        p.backward_weight(dev["x"], dev["dy"], out=dev["dw"])
        kept.append(clconv.conv2d_bias(dev["dy"]))
        results = {"forward": (dev["y"].get(), reference.conv2d(x, w, b, **opts)),
                   "forward+ReLU": (dev["yr"].get(), np.maximum(reference.conv2d(x, w, b, **opts), 0)),
                   "grad-input": (dev["dx"].get(), reference.conv2d_input(xs, w, dy, **opts)),
                   "grad-weight": (dev["dw"].get(), reference.conv2d_weight(x, ws, dy, **opts)),
                   "grad-bias": (kept[-1].get(), reference.conv2d_bias(dy))}
        for pass_name, (got, want) in results.items():
            err = reference.normalised_error(got, want)
            ok = err <= reference.TOLERANCE[dtype]
            failures += not ok
            print(f"{name:26s} {pass_name:12s} {p.algorithms.get(pass_name.replace('grad-', 'backward_').replace('+ReLU', ''), ''):7s} "
                  f"error {err:.1e} {'ok' if ok else 'MISMATCH'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)   # skip interpreter teardown: CLBlast's exit-time cleanup can crash under Oclgrind
