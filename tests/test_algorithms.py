"""Each algorithm against the reference on every case it applies to; the planner's choices."""

import re
import shutil
import subprocess

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import rules
from clconv import reference
from clconv.algorithms import direct, fft, im2col, winograd
from clconv.algorithms.direct import Direct
from clconv.device import has_fp64
from clconv.geometry import conv_geometry
from clconv.plan import ALGORITHMS
from clconv.programs import program_source
from helpers import (CASES, Case, QueueAs, assert_close, assert_float16_passes, assert_passes_match, kernel_kind,
                     stand_in_gpu)

EXTRA = [  # cases that exercise the specialised algorithms harder
    Case("fc_mode_g4_wide", 5, 8, 3, 2, 12, 3, 2, groups=4),
    Case("k1x1_g3_batch5", 5, 6, 3, 7, 9, 1, 1, groups=3),
    Case("depthwise_x3_5x5_d2", 2, 3, 11, 9, 9, 5, 5, padding=((3, 1), (0, 2)), dilation=2, groups=3),
    Case("depthwise_big_batch", 5, 4, 23, 29, 4, 3, 3, stride=2, padding=1, groups=4),
    # CPU forward rows summed 8 (and, two filters per work-item, 4) at once: 11 output rows (8 + 3),
    # strided and dilated rows; 29 rows in bands of 3 rows per work-item (few planes)
    Case("depthwise_row_blocks_s2_d2", 2, 3, 23, 19, 3, 5, 3, stride=(2, 1), padding=(3, 1), dilation=(2, 1),
         groups=3),
    Case("depthwise_x2_row_bands", 1, 2, 29, 17, 4, 3, 3, padding=1, groups=2),
    Case("split_k_g2", 4, 4, 17, 19, 6, 3, 3, padding=1, groups=2),
    Case("split_k_1x1_g1", 6, 5, 13, 11, 7, 1, 1),
    Case("k1x1_per_image_g2", 5, 4, 16, 17, 6, 1, 1, groups=2),   # 272 positions: per-image grad-weight (CLBlast)
    Case("k1x1_29x31_g2", 3, 4, 29, 31, 6, 1, 1, groups=2),   # 899: per-image partial sums on the CPU kernel too
    # maps of fewer than 32 positions: the CPU kernel's grad-input transposed (dX^T = dY^T W); 25 rows
    # of row blocks of 6, 37 columns (a shifted last block), 520 deep (K slices of 128-512 values:
    # the later ones add to what the first stored transposed); 6 channels a group (narrower than a
    # block)
    Case("k1x1_5x5_c37_k520", 2, 37, 5, 5, 520, 1, 1),
    Case("k1x1_3x5_g2_narrow", 3, 12, 3, 5, 10, 1, 1, groups=2),
    # Winograd: partial tiles on every edge, dilation phases, padding past the dilated filter
    Case("winograd_g2_d2_overpad", 2, 6, 13, 11, 4, 3, 3, padding=((5, 1), (0, 3)), dilation=2, groups=2),
    Case("winograd_wide_d1x2", 3, 32, 10, 15, 20, 3, 3, padding=(1, 2), dilation=(1, 2)),
    Case("winograd5_g2_d1x2_overpad", 2, 6, 14, 11, 4, 5, 5, padding=((5, 0), (1, 9)), dilation=(1, 2), groups=2),
    # Winograd F(2, 7) along one axis: a last tile cut by the edge, dilation phases, padding past
    # the dilated filter, groups; 7x1 over 5 channels to 7 filters, uneven padding on both axes
    Case("winograd_1x7_g2_d1x2_overpad", 2, 6, 9, 23, 4, 1, 7, padding=((1, 0), (2, 8)), dilation=(1, 2), groups=2),
    Case("winograd_7x1_c5_k7", 3, 5, 13, 6, 7, 7, 1, padding=((3, 3), (1, 0))),
    # the CPU row transforms' lanes in one tile row: a 7x1 over 38 columns, dilated rows, the one-tap
    # axis padded on the right; a 1x7 over 20 tiles a tile row, its last tile cut by the right edge,
    # its last vector of tiles partly filled
    Case("winograd_7x1_rows_d2", 2, 3, 15, 37, 5, 7, 1, padding=((3, 2), (0, 1)), dilation=(2, 1)),
    Case("winograd_1x7_rows_p3", 3, 3, 5, 39, 4, 1, 7, padding=(1, 3)),
    # tile rows of 12 tiles, dilated rows: CPU transforms whose lanes lie side by side in one tile row
    Case("winograd_rows_d2x1", 2, 4, 13, 45, 5, 3, 3, padding=(2, 1), dilation=(2, 1)),
    # tile rows of 18 tiles, 2 per image: CPU transforms' lanes in one tile row (their patches'
    # rows loaded whole: inside the image, and at its left and right padding), across tile rows
    # and across images
    Case("winograd_rows_p1", 2, 3, 7, 70, 4, 3, 3, padding=1),
    Case("dense_c6_s2", 2, 6, 9, 8, 5, 3, 3, stride=2, padding=1),
    # a patchify stem in small: 4x4 taps at stride 4 (col2im's strides of 4 without a division),
    # rows and columns past the last patch
    Case("patchify_4x4_s4", 2, 3, 13, 18, 5, 4, 4, stride=4),
    # groups of 8 and 24 channels (RegNet-like; 72 and 216 taps): direct on CPUs for forward and grad-input
    Case("grouped_cg8_s2", 2, 16, 11, 9, 6, 3, 3, stride=2, padding=1, groups=2),
    Case("grouped_cg24_pad_h", 1, 48, 9, 8, 4, 3, 3, padding=(1, 0), groups=2),
    # a few-channel stem: 16 filters, 7x7 taps, stride 2
    Case("stem_7x7_s2", 2, 3, 23, 18, 16, 7, 7, stride=2, padding=3),
    # stride 2 on rows of 45: CPU im2col's whole-vector strided reads (one load, its even lanes)
    # between the left padding and a right edge that ends a vector short, for 4- and 8-wide vectors
    Case("s2_rows_45", 2, 3, 7, 45, 4, 3, 3, stride=2, padding=1),
    # AlexNet conv2 in small: 5x5 on 27x27 (32x32 FFT frames), 16 channels and filters per group
    Case("fft_g2_5x5_27", 2, 32, 27, 27, 32, 5, 5, padding=2, groups=2),
    # FFT filter transforms over more channels than one work-group's 64, the last work-group part
    # full (70 channels forward, 66 read flipped for grad-input), 9x7 taps in 16-wide frames
    Case("fft_c70_k66_9x7", 1, 70, 10, 9, 66, 9, 7, padding=(4, 3)),
]


# cases on CLBlast's kernels carry the clblast mark (setup.cfg says where make test runs them)
ENGINE_MARKS = {"clblast": pytest.mark.clblast, "clconv": (), "auto": ()}


def applicable():
    """(case, algorithm, GEMM engine): the GEMM algorithms once with each engine."""
    for case in CASES + EXTRA:
        g = conv_geometry(case.input_shape, case.weight_shape, **case.options)
        for name, cls in ALGORITHMS.items():
            if cls.applies(g)[0]:
                for engine in ("clblast", "clconv") if name != "direct" else ("auto",):
                    yield pytest.param(case, name, engine, id=f"{name}-{case.name}" + (
                        f"-{engine}_gemm" if engine != "auto" else ""), marks=ENGINE_MARKS[engine])


@pytest.mark.parametrize("case,algorithm,engine", list(applicable()))
def test_algorithm_matches_reference(case, algorithm, engine, queue, monkeypatch):
    monkeypatch.setenv("CLCONV_GEMM", engine)
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm=algorithm)
    assert [r.algorithm for r in p.explain().records] == [algorithm] * 3
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(p.forward(x, w), reference.conv2d(x, w, **opts), np.float32, "forward no bias")
    relu = lambda a: np.maximum(a, 0)   # noqa: E731  (the fused option: bias and ReLU as the output is written)
    assert_close(p.forward(x, w, b, relu=True), relu(reference.conv2d(x, w, b, **opts)), np.float32, "forward + ReLU")
    assert_close(p.forward(x, w, relu=True), relu(reference.conv2d(x, w, **opts)), np.float32, "forward no bias + ReLU")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32,
                 "grad-weight")


@pytest.mark.parametrize("case,algorithm", [
    (CASES[0], "fc"), (CASES[0], "1x1"), (CASES[8], "direct"), (CASES[7], "1x1"), (CASES[10], "fc")], ids=repr)
def test_forced_algorithm_that_does_not_apply_is_refused(case, algorithm, queue):
    with pytest.raises(ValueError, match=f"algorithm '{algorithm}' does not apply") as info:
        clconv.plan(case.input_shape, case.weight_shape, **case.options, queue=queue, algorithm=algorithm)
    assert str(list(case.input_shape)) in str(info.value)


@pytest.mark.parametrize("case,expected", [
    ("fc_mode", "fc"), ("fc_mode_g2", "fc"), ("k1x1_g2", "1x1"), ("depthwise_x2_s2_same", "direct"),
    ("dense_c6_s2", "im2col"), ("winograd_wide_d1x2", "winograd")])
def test_auto_choice(case, expected, queue, monkeypatch):
    # (on GPUs, without the Winograd work rule, which these small cases are below: its own test)
    monkeypatch.setattr(rules, "WINOGRAD_GPU_MIN_FLOP_PER_UNIT", 0)
    case = next(c for c in CASES + EXTRA if c.name == case)
    p = clconv.plan(case.input_shape, case.weight_shape, **case.options, queue=queue)
    assert set(p.algorithms.values()) == {expected}


@pytest.mark.parametrize("size,batch,on_cpu", [
    (5, 8, {"forward": "im2col", "backward_input": "im2col", "backward_weight": "im2col"}),   # 2x2 tiles, 39% used
    (7, 8, {"forward": "winograd", "backward_input": "winograd", "backward_weight": "im2col"}),   # 2x2 tiles, 77%
    (7, 7, {"forward": "im2col", "backward_input": "im2col", "backward_weight": "im2col"}),   # 28 tiles in the batch
    (12, 2, {"forward": "winograd", "backward_input": "winograd", "backward_weight": "winograd"}),   # 3x3 tiles
], ids=["5x5_map", "7x7_map", "7x7_map_28_tiles", "12x12_map"])
def test_auto_choice_of_winograd_on_small_maps(size, batch, on_cpu, queue):
    """On CPUs, Winograd's transforms outweigh its smaller GEMMs on small maps: im2col where its
    tiles leave most outputs unused, for grad-weight over 4 tiles or fewer, and over 4 tiles per
    image where the batch has fewer than 32 (GPUs, by work: the test after next)."""
    if queue.device.type & cl.device_type.GPU:
        pytest.skip("the CPUs' rule")
    p = clconv.plan((batch, 16, size, size), (16, 16, 3, 3), padding=1, queue=queue)
    assert p.algorithms == on_cpu
    if "im2col" in on_cpu.values():
        assert all(("winograd", "winograd-cpu-tiles") in r.passed_over for r in p.explain().records
                   if r.algorithm == "im2col")


@pytest.mark.parametrize("kernel,padding", [((1, 7), (0, 3)), ((7, 1), (3, 0))], ids=["1x7", "7x1"])
def test_auto_choice_for_one_row_or_column_of_taps(kernel, padding, queue):
    """1x7 and 7x1 filters (inception_v3's, in small): im2col on CPUs, where Winograd's transforms'
    launches cost what its GEMMs save; below 16 channels, im2col everywhere (GPUs: the next test)."""
    if not queue.device.type & cl.device_type.GPU:
        p = clconv.plan((3, 16, 12, 12), (16, 16) + kernel, padding=padding, queue=queue)
        assert set(p.algorithms.values()) == {"im2col"}
        assert all(("winograd", "winograd-cpu-rows") in r.passed_over for r in p.explain().records)
    thin = clconv.plan((3, 8, 12, 12), (16, 8) + kernel, padding=padding, queue=queue)
    assert set(thin.algorithms.values()) == {"im2col"}
    assert all(("winograd", "winograd-channels") in r.passed_over for r in thin.explain().records)


@pytest.mark.parametrize("kernel,padding,size,batches,mflop", [
    ((3, 3), (1, 1), 28, (4, 1), (231, 58)),
    ((1, 7), (0, 3), 12, (32, 8), (264, 66)),
    ((7, 1), (3, 0), 12, (32, 8), (264, 66)),
], ids=["3x3", "1x7", "7x1"])
def test_auto_choice_of_winograd_on_gpus_by_work(kernel, padding, size, batches, mflop, queue):
    """On GPUs (a stand-in of 16 compute units: 104 MFLOP) Winograd, its F(4x4,3x3) or F(2, 7)
    form, from 6.5 MFLOP a pass per compute unit; on less work its four launches and thin GEMMs
    cost more than im2col's."""
    gpu = QueueAs(queue, type=cl.device_type.GPU, max_compute_units=16)
    for batch, work, algorithm in zip(batches, mflop, ("winograd", "im2col")):
        p = clconv.Plan(clconv.conv_geometry((batch, 64, size, size), (64, 64) + kernel, padding=padding), np.float32,
                        gpu, selfcheck=False)
        assert set(p.algorithms.values()) == {algorithm}, batch
        if algorithm == "winograd":
            outputs = (4, 4) if kernel == (3, 3) else tuple(1 if k == 1 else 2 for k in kernel)
            form = "{}x{},{}x{}".format(*outputs, *kernel)
            assert all(f"F({form})" in r.notes for r in p.explain().records)
        else:
            assert all(("winograd", "winograd-gpu-work") in r.passed_over for r in p.explain().records)
            ok, why = ALGORITHMS["winograd"].preferred(p.geometry, "forward", gpu.device)
            assert not ok and why.rule == "winograd-gpu-work"
            assert f"on GPUs, {work} MFLOP a pass (below 104, 6.5 per compute unit)" in why


def test_auto_choice_of_fft(queue, monkeypatch):
    """5x5 on 27x27 images: the FFT's GEMMs need 3 multiplications per output against Winograd's 9;
    on GPUs that pays for its transforms (the work rule, below, set aside: this layer is small),
    on CPUs it does not."""
    monkeypatch.setattr(rules, "FFT_GPU_MIN_FLOP_PER_UNIT", 0)
    case = next(c for c in EXTRA if c.name == "fft_g2_5x5_27")
    p = clconv.plan(case.input_shape, case.weight_shape, **case.options, queue=queue)
    gpu = bool(queue.device.type & cl.device_type.GPU)
    assert set(p.algorithms.values()) == {"fft" if gpu else "winograd"}
    if gpu:
        assert all("32x32 frames" in r.notes for r in p.explain().records)
        assert "32x32 frames: 3.0 multiplications per output" in p.explain().record("forward").reason
    else:
        assert all(("fft", "fft") in r.passed_over for r in p.explain().records)


def test_auto_choice_of_fft_on_gpus_by_work(queue):
    """On GPUs (a stand-in of 16 compute units: 40 MFLOP) the FFT from 2.5 MFLOP a pass per
    compute unit; on less work its four launches cost more than im2col's pass. A 5x5 over 32
    channels of 27x27: 37 MFLOP an image."""
    gpu = QueueAs(queue, type=cl.device_type.GPU, max_compute_units=16)
    for batch, algorithm in ((2, "fft"), (1, "im2col")):
        p = clconv.Plan(clconv.conv_geometry((batch, 32, 27, 27), (32, 32, 5, 5), padding=2), np.float32, gpu,
                        selfcheck=False)
        assert set(p.algorithms.values()) == {algorithm}, batch
    assert all(("fft", "fft") in r.passed_over for r in p.explain().records)
    ok, why = ALGORITHMS["fft"].preferred(p.geometry, "forward", gpu.device)
    assert not ok and "on GPUs, 37 MFLOP a pass (below 40, 2.5 per compute unit)" in why


@pytest.mark.parametrize("case", ["g1_k3x3_s1_p1", "k1x1_s2", "fc_mode_padded", "stem_7x7_s2"])
def test_auto_choice_for_few_channels(case, queue):
    """Dense convolutions of at most 4 input channels: the direct forward on GPUs, im2col otherwise."""
    case = next(c for c in CASES + EXTRA if c.name == case)
    p = clconv.plan(case.input_shape, case.weight_shape, **case.options, queue=queue)
    gpu = bool(queue.device.type & cl.device_type.GPU)
    assert p.algorithms == {"forward": "direct" if gpu else "im2col", "backward_input": "im2col",
                            "backward_weight": "im2col"}
    assert all(("direct", "direct-stems") in r.passed_over for r in p.explain().records if r.algorithm == "im2col")


def test_explain_fc_mode_names_the_gemm(queue):
    p = clconv.plan((16, 8, 6, 6), (32, 8, 6, 6), queue=queue)
    forward = p.explain().record("forward")
    assert forward.algorithm == "fc" and forward.gemm == (16, 32, 288) and forward.splits == 1
    assert "covers the whole input 6x6" in forward.reason and p.workspace_bytes == 0


@pytest.fixture
def im2col_col_path(monkeypatch):
    """im2col's GPU work rule set aside (GPU_IMPLICIT_FLOP_PER_UNIT 0), for the tests of its col
    path's own rules: on a real GPU their small layers would read im2col in place instead."""
    monkeypatch.setattr(rules, "IM2COL_GPU_IMPLICIT_FLOP_PER_UNIT", {"forward": 0, "backward_weight": 0})


def _grouped_runs():
    """(case, algorithm) for the grouped cases: im2col and auto always, Winograd where it applies,
    the FFT on the cases meant for it."""
    for c in CASES + EXTRA:
        if c.options["groups"] > 1:
            yield from ((c, "im2col"), (c, "auto"))
            if c.options["stride"] == 1 and c.weight_shape[2:] in ((3, 3), (5, 5), (1, 7), (7, 1)):
                yield c, "winograd"
            if c.name.startswith(("winograd", "fft")):
                yield c, "fft"


@pytest.mark.parametrize("case,algorithm", list(_grouped_runs()), ids=repr)
@pytest.mark.parametrize("engine", [pytest.param(e, marks=ENGINE_MARKS[e]) for e in ("clblast", "clconv")],
                         ids=lambda e: f"{e}_gemm")
def test_per_group_queues_are_bit_identical(case, algorithm, engine, queue, monkeypatch):
    monkeypatch.setenv("CLCONV_GEMM", engine)
    x, w, b, dy = case.data()
    opts = case.options
    dev = {k: cla.to_device(queue, v) for k, v in dict(x=x, w=w, b=b, dy=dy).items()}
    results = []
    for queues in ("single", "per-group"):
        p = clconv.plan(x.shape, w.shape, **opts, queue=queue, queues=queues, algorithm=algorithm)
        results.append([p.forward(dev["x"], dev["w"], dev["b"]).get(), p.backward_input(dev["w"], dev["dy"]).get(),
                        p.backward_weight(dev["x"], dev["dy"]).get()])
    for single, grouped in zip(*results):
        np.testing.assert_array_equal(single, grouped)
    assert_close(results[1][0], reference.conv2d(x, w, b, **opts), np.float32, "forward per-group")


# (288 positions: its grad-weight split-K, which chunks under 256 positions are not on GPUs)
SPLIT_WEIGHT_4_IMAGES = Case("g2_k5x5_alexnet_like_4_images", 4, 4, 9, 8, 6, 5, 5, padding=2, groups=2)


@pytest.mark.gpu_form
@pytest.mark.parametrize("name,algorithm", [
    ("g2_k3x3_s2_pad_pair", "im2col"), ("k1x1_g2", "im2col"), ("g2_k5x5_alexnet_like", "im2col"),
    ("g2_k5x5_alexnet_like_4_images", "im2col"), ("grouped_cg8_s2", "im2col"), ("grouped_cg24_pad_h", "auto"),
    ("winograd_g2_d2_overpad", "winograd"), ("fft_g2_5x5_27", "fft"),
])
def test_per_group_queues_are_bit_identical_in_plans_for_a_gpu(name, algorithm, queue):
    """In plans made for a GPU (a stand-in of 132 compute units, clconv's GPU GEMM kernel) each
    group's launch on its own queue takes the tile and planes of the whole grid, so per-group queues
    give the single queue's results bit for bit: a group's smaller grid took more K planes before
    (im2col's grad-weights and grouped forwards differed in their last bits). Against the
    reference too."""
    case = next(c for c in CASES + EXTRA + [SPLIT_WEIGHT_4_IMAGES] if c.name == name)
    x, w, b, dy = case.data()
    gpu = stand_in_gpu(queue, 132)
    results = []
    for queues in ("single", "per-group"):
        p = clconv.Plan(conv_geometry(x.shape, w.shape, **case.options), np.float32, gpu, algorithm=algorithm,
                        queues=queues, gemm="gpu", selfcheck=False)
        results.append([p.forward(x, w, b, queue=queue), p.backward_input(w, dy, queue=queue),
                        p.backward_weight(x, dy, queue=queue)])
    for pass_name, single, grouped in zip(("forward", "grad-input", "grad-weight"), *results):
        np.testing.assert_array_equal(single, grouped, err_msg=pass_name)
    assert_close(results[0][2], reference.conv2d_weight(x, w.shape, dy, **case.options), np.float32, "grad-weight")
    if case is SPLIT_WEIGHT_4_IMAGES:
        assert p._choice["backward_weight"][0].slices > 1


def test_functional_api_takes_algorithm_and_queues(queue):
    case = CASES[1]
    x, w, b, dy = case.data()
    y = clconv.conv2d(x, w, b, **case.options, algorithm="im2col", queues="per-group")
    assert_close(y, reference.conv2d(x, w, b, **case.options), np.float32, "forward")
    with pytest.raises(ValueError, match="queues"):
        clconv.conv2d(x, w, b, **case.options, queues="many")


@pytest.mark.parametrize("images_per_chunk", [4, 2, 1])
def test_split_k_grad_weight_with_chunks(images_per_chunk, queue):
    case = next(c for c in EXTRA if c.name == "split_k_g2")
    x, w, b, dy = case.data()
    g = conv_geometry(x.shape, w.shape, **case.options)
    # 4 * 17 * 19 positions: 4 slices of >= 256 (CPUs), or 19 of >= 64 (GPUs, planned here as of 64
    # compute units: with few, fewer slices fill them, see test_im2col_grad_weight_slices_fill_the_device)
    gpu = bool(queue.device.type & cl.device_type.GPU)
    on = QueueAs(queue, max_compute_units=64) if gpu else queue
    full = clconv.Plan(g, np.float32, on, algorithm="im2col", selfcheck=False)
    algo = full._choice["backward_weight"][0]
    assert algo.slices == (19 if gpu else 4) and full.explain().record("backward_weight").splits == algo.slices
    limit = ((algo.rows + g.K) * g.P * images_per_chunk + algo.max_slices * g.K * g.Kd) * 4
    p = clconv.Plan(g, np.float32, on, algorithm="im2col", selfcheck=False, workspace_limit=limit)
    assert p._choice["backward_weight"][0].chunk == images_per_chunk
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **case.options),
                 np.float32, "grad-weight")


@pytest.mark.gpu_form
@pytest.mark.parametrize("units,slices", [(1, 2), (8, 17), (64, 19)], ids=["1_unit", "8_units", "64_units"])
def test_im2col_grad_weight_slices_fill_the_device(units, slices, queue):
    """On a GPU, im2col's grad-weight takes the fewest split-K slices (dividing its positions)
    whose grid gives GPU_FILL_WAVES work-groups of the largest tile per compute unit, at most
    max_slices. split_k_g2: two groups of one 128x128 tile, 4 x 17 x 19 = 1292 positions (divisors
    2, 4, 17, 19, 34, ...), at most 20 slices of >= 64: one unit asks for 2 slices, 8 for 16 (17),
    64 for 128 (the cap: 19). Against the reference."""
    case = next(c for c in EXTRA if c.name == "split_k_g2")
    x, w, b, dy = case.data()
    gpu = QueueAs(queue, type=cl.device_type.GPU, max_compute_units=units)
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **case.options), np.float32, gpu, algorithm="im2col",
                    selfcheck=False)
    algo = p._choice["backward_weight"][0]
    assert algo.gemm == "gpu" and algo.max_slices == 20 and algo.slices == slices
    text = algo.describe("backward_weight")
    assert f"split-K into {slices} slices summed in order (a divisor of the positions" in text
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **case.options),
                 np.float32, "grad-weight")


@pytest.mark.gpu_form
@pytest.mark.parametrize("case,split", [
    (Case("255_positions", 1, 5, 17, 19, 7, 3, 3), False),   # 15 x 17 positions: one product
    (Case("256_positions", 1, 5, 18, 18, 7, 3, 3), True),    # 16 x 16: split
    (Case("3_images_of_99", 3, 5, 11, 13, 7, 3, 3), True),   # 3 x 9 x 11 = 297 in one chunk
], ids=repr)
def test_im2col_grad_weight_splits_no_short_product(case, split, queue):
    """On a GPU, im2col's grad-weight splits a chunk's positions only from
    GPU_MIN_SPLIT_POSITIONS (below, one product, and explain() says why), however many compute
    units the grid leaves idle. Against the reference."""
    x, w, b, dy = case.data()
    gpu = QueueAs(queue, type=cl.device_type.GPU, max_compute_units=64)
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **case.options), np.float32, gpu, algorithm="im2col",
                    selfcheck=False)
    algo = p._choice["backward_weight"][0]
    assert algo.gemm == "gpu" and algo.chunk == case.input_shape[0]
    assert (algo.slices > 1) == split
    positions = algo.chunk * (case.input_shape[2] - 2) * (case.input_shape[3] - 2)
    unsplit = f"unsplit ({positions} positions a chunk, below {rules.IM2COL_GPU_MIN_SPLIT_POSITIONS}"
    assert (unsplit in algo.describe("backward_weight")) == (not split)
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **case.options),
                 np.float32, "grad-weight")


@pytest.mark.gpu_form
@pytest.mark.parametrize("case,slices,folds", [
    (Case("odd_63_positions", 9, 6, 9, 7, 5, 3, 3, padding=1), 7, True),     # 567 positions: 7 slices of 81, N 54
    (Case("odd_wide_taps", 9, 8, 9, 7, 5, 3, 3, padding=1), 7, False),       # N 72: the layout copy
    (Case("whole_vector_slices", 30, 8, 4, 5, 5, 3, 3, padding=1), 6, True),  # 600: 6 slices of 100, not 8 of 75; N 72
], ids=repr)
def test_im2col_grad_weight_reads_grad_output_in_place(case, slices, folds, queue, im2col_col_path):
    """In a plan for a GPU, im2col's grad-weight GEMM reads grad_output as it is, its images'
    positions folded into the depth: four-wide where the slices are whole vectors, which the
    slice count prefers (at least half as many), else value by value where the GEMM's N is at
    most SCALAR_FOLD_MAX_TAPS (else through the layout copy). Against the reference."""
    x, w, b, dy = case.data()
    gpu = QueueAs(queue, type=cl.device_type.GPU, max_compute_units=64)   # (enough units to want the cap)
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **case.options), np.float32, gpu, algorithm="im2col",
                    selfcheck=False)
    algo = p._choice["backward_weight"][0]
    assert algo.gemm == "gpu" and not algo._implicit("backward_weight") and algo.chunk == case.input_shape[0]
    assert algo.slices == slices
    text = algo.describe("backward_weight")
    assert ("folded into the GEMM's depth" in text) == folds and f"split-K into {slices} slices" in text
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **case.options),
                 np.float32, "grad-weight")


@pytest.mark.clblast
@pytest.mark.parametrize("images", [5, 2])
def test_1x1_grad_weight_per_image_partials_in_chunks(images, queue):
    """Off clconv's GPU kernel: one partial sum per image (no layout copies), as many images per
    launch as the workspace holds, later chunks added on; images of fewer than 256 positions
    take the im2col layout."""
    case = next(c for c in EXTRA if c.name == "k1x1_per_image_g2")
    x, w, b, dy = case.data()
    g = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="1x1").geometry
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="1x1", gemm="clblast",
                    workspace_limit=images * g.K * g.Cg * 4)
    assert p._choice["backward_weight"][0].images == images
    weight = p.explain().record("backward_weight")
    assert weight.chunks[1] == images and "per-image partial sums" in weight.notes
    want = reference.conv2d_weight(x, w.shape, dy, **case.options)
    assert_close(p.backward_weight(x, dy), want, np.float32, "grad-weight")
    small = next(c for c in EXTRA if c.name == "k1x1_g3_batch5")   # 3 x 7 positions per image
    assert "im2col layout" in clconv.plan(small.input_shape, small.weight_shape, **small.options, queue=queue,
                                          gemm="clblast").explain().record("backward_weight").notes


def test_1x1_grad_weight_on_the_cpu_kernel(queue):
    """clconv's CPU GEMM sums the images in K blocks over maps of fewer than CPU_BLOCKS_BELOW
    positions, and takes per-image partial sums over larger ones."""
    from clconv.algorithms import pointwise
    for name, blocked in (("k1x1_per_image_g2", True), ("k1x1_29x31_g2", False)):
        case = next(c for c in EXTRA if c.name == name)
        x, w, b, dy = case.data()
        p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="1x1", gemm="cpu")
        assert (x.shape[2] * x.shape[3] < rules.POINTWISE_CPU_BLOCKS_BELOW) == blocked
        notes = p.explain().record("backward_weight").notes
        assert ("K blocks" in notes) == blocked and ("per-image partial sums" in notes) != blocked
        assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **case.options), np.float32,
                     "grad-weight")


ALL_PASSES = ("forward", "backward_input", "backward_weight")


@pytest.mark.parametrize("case,algorithm,packing", [
    (Case("im2col_panels_g2_s2", 3, 6, 11, 13, 10, 3, 3, stride=(2, 1), padding=1, groups=2), "im2col", ALL_PASSES),
    (Case("1x1_panels_g2", 3, 6, 9, 13, 10, 1, 1, groups=2), "1x1", ALL_PASSES),
    (Case("winograd_panels_g2", 3, 32, 9, 11, 34, 3, 3, padding=1, groups=2), "winograd", ("backward_weight",))],
    ids=repr)
@pytest.mark.parametrize("queues", ["single", "per-group"])
def test_cpu_gemm_packs_b_in_panels(case, algorithm, packing, queues, queue, monkeypatch):
    """Forward and grad-input with B (col, T, the input, grad_output) packed in panels by clconv's CPU
    GEMM, grad-weight with B^T (col, the input over K blocks, Winograd's V) packed transposed (its
    rules lowered to every product here); on per-group queues, whose GEMMs pack nothing,
    not; explain() says which."""
    from clconv.gemm import gemm_cpu
    monkeypatch.setattr(rules, "PANEL_MIN_ROWS", 1)
    monkeypatch.setattr(rules, "PANEL_MIN_DEPTH", 1)
    monkeypatch.setattr(rules, "PANEL_MIN_ROW_BYTES", 1)
    monkeypatch.setattr(rules, "BT_PANEL_MIN_ROWS", 1)
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **opts), np.float32, queue, algorithm=algorithm, gemm="cpu",
                    queues=queues)
    for name in ALL_PASSES:
        record = p.explain().record(name)
        said = "B^T packed in panels" if name == "backward_weight" else "B packed in panels"
        assert (said in record.notes) == (queues == "single" and name in packing), record
        assert ("cpu-gemm-panels" in record.rules) == (said in record.notes)
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32, "grad-weight")


@pytest.mark.gpu_form
@pytest.mark.parametrize("slices", [1, 5])
@pytest.mark.parametrize("case", [
    next(c for c in EXTRA if c.name == "k1x1_g3_batch5"),   # 3 groups, 7 positions per image
    Case("k1x1_continuous_5x5", 10, 7, 5, 5, 6, 1, 1),       # 25 positions: not a multiple of 4
    Case("k1x1_continuous_4x3", 5, 4, 4, 3, 8, 1, 1),        # 12 positions: four-wide reads
], ids=repr)
def test_1x1_grad_weight_reads_small_maps_as_one_depth(case, slices, queue, monkeypatch):
    """On clconv's GPU kernel, grad-weight over maps of fewer than CONTINUOUS_BELOW positions reads every
    image's positions as one continuous K (no block padded at an image's end), in the slices of
    whole images that the tile model picks (forced here)."""
    from clconv.algorithms import pointwise
    picked = []

    def forced(device, m, n, k, count, options, itemsize=4):
        picked.append(options)
        return max(o for o in options if o <= slices)
    monkeypatch.setattr(pointwise, "best_slices", forced)
    x, w, b, dy = case.data()
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="1x1", gemm="gpu")
    algo, g = p._choice["backward_weight"][0], p.geometry
    divisors = [d for d in range(1, g.N + 1) if g.N % d == 0]
    assert algo.continuous and divisors in picked   # (the known-answer check plans a smaller case too)
    want_slices = max(d for d in divisors if d <= slices)
    assert algo.slices == want_slices
    line = algo.describe("backward_weight")
    assert "every image's positions one continuous K" in line
    assert (f"{want_slices} slices of {g.N // want_slices} image(s)" in line) == (want_slices > 1)
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **case.options), np.float32,
                 "grad-weight")


@pytest.mark.gpu_form
@pytest.mark.parametrize("case,small_grid_bound,deep", [
    (Case("k1x1_deep_weight_7x7", 21, 37, 7, 7, 19, 1, 1), False, True),   # 1029 deep, M, N below a tile: slices
    (Case("k1x1_deep_weight_4x3", 47, 5, 4, 3, 9, 1, 1), False, True),     # 564 deep, four-wide reads; one slice
    (Case("k1x1_shallow_weight_5x5", 20, 37, 5, 5, 19, 1, 1), False, False),   # 500 deep: the tile model's slices
    (Case("k1x1_deep_weight_7x7", 21, 37, 7, 7, 19, 1, 1), True, False),   # deep, but its grid under the bound
], ids=repr)
def test_1x1_grad_weight_of_long_products_runs_the_deep_tile(case, small_grid_bound, deep, queue, monkeypatch):
    """On clconv's GPU kernel, a continuous grad-weight at least DEEP_WEIGHT_K deep runs the deep tile
    (the GEMM is launched with deep=True), in slices of whole images each at least DEEP_WEIGHT_SLICE
    deep, where the deep tile's grid has a work-group per DEEP_MIN_SHARE compute units (set here so
    that these one-work-group grids are above the bound, or under it); otherwise it does not."""
    from clconv.algorithms import pointwise
    from clconv.gemm import gemm_gpu
    if not gemm_gpu.fits(queue.device, gemm_gpu.EIGHT_BY_FOUR):
        pytest.skip("the deep tile does not fit this device")
    monkeypatch.setattr(rules, "DEEP_MIN_SHARE", 0 if small_grid_bound else queue.device.max_compute_units)
    launched = []
    run = gemm_gpu.grid_gemm

    def spy(*args, **kwargs):
        launched.append(kwargs.get("deep", False))
        return run(*args, **kwargs)
    monkeypatch.setattr(gemm_gpu, "grid_gemm", spy)
    x, w, b, dy = case.data()
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="1x1", gemm="gpu")
    algo, g = p._choice["backward_weight"][0], p.geometry
    assert algo.continuous and algo.deep_weight == deep
    assert (g.N * g.P >= rules.POINTWISE_DEEP_WEIGHT_K) == (deep or small_grid_bound)
    assert g.N % algo.slices == 0 and (algo.slices == 1 or not deep
                                       or g.N // algo.slices * g.P >= rules.POINTWISE_DEEP_WEIGHT_SLICE)
    assert ("deep tile" in algo.describe("backward_weight")) == deep
    launched.clear()   # (planning may run the device's known-answer check first)
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **case.options), np.float32,
                 "grad-weight")
    assert launched == [deep]


@pytest.mark.gpu_form
def test_1x1_grad_weight_in_one_slice_where_no_partial_sum_fits(queue):
    """A workspace too small for one partial sum leaves the continuous grad-weight one slice
    (which needs none), not without options."""
    case = Case("k1x1_tiny_workspace", 3, 6, 5, 5, 8, 1, 1)
    x, w, b, dy = case.data()
    p = clconv.plan(x.shape, w.shape, queue=queue, algorithm="1x1", gemm="gpu", workspace_limit=100)
    algo = p._choice["backward_weight"][0]
    assert algo.continuous and algo.slices == 1 and p.workspace_bytes == 0
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy), np.float32, "grad-weight")


@pytest.mark.gpu_form
@pytest.mark.parametrize("slices", [1, 3])
@pytest.mark.parametrize("case,fold_below,folded", [
    (next(c for c in EXTRA if c.name == "k1x1_g3_batch5"), 64, True),   # 3 groups, 7 positions per image
    (next(c for c in EXTRA if c.name == "split_k_1x1_g1"), 64, False),  # 13 x 11 positions: a GEMM per image
    (Case("k1x1_fold_split", 3, 6, 5, 7, 9, 1, 1), 64, True),         # 35 positions; C 6 and K 9 split in 3
    (next(c for c in EXTRA if c.name == "split_k_1x1_g1"), 1000, True),   # 143 positions, under a higher bound
    (Case("k1x1_fold_9x8", 2, 6, 9, 8, 5, 1, 1), None, True),   # 72: folded, grad-weight not one depth
], ids=["grouped_folded", "per_image", "folded", "folded_below_1000", "folded_not_continuous"])
def test_1x1_folds_small_maps_into_one_gemm(case, fold_below, folded, slices, queue, monkeypatch):
    """On clconv's GPU kernel, forward and grad-input over maps of fewer than FOLD_BELOW positions
    are one GEMM over every image's positions, the output stored image by image; split-K (forced)
    still cuts their K, one group only."""
    from clconv.algorithms import pointwise
    if fold_below is not None:   # (None: the library's bound)
        monkeypatch.setattr(rules, "POINTWISE_FOLD_BELOW", fold_below)
    monkeypatch.setattr(pointwise, "k_slices", lambda device, engine, m, n, k, count, itemsize=4, *a, **kw: slices)
    x, w, b, dy = case.data()
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="1x1", gemm="gpu")
    algo, g = p._choice["forward"][0], p.geometry
    assert algo.fold == folded
    assert p._choice["backward_weight"][0].continuous == (g.P < rules.POINTWISE_CONTINUOUS_BELOW)   # (its own bound)
    for pass_name, k in (("forward", g.C), ("backward_input", g.K)):
        want = max(d for d in range(1, slices + 1) if k % d == 0) if g.groups == 1 else 1
        assert algo.split[pass_name] == want
        assert ("over every image's positions" in algo.describe(pass_name)) == folded
    assert_passes_match(p, x, w, b, dy, case.options)


@pytest.mark.gpu_form
@pytest.mark.parametrize("case_name,by_images,by_positions,want", [
    ("k1x1_per_image_g2", 1, 1, (1, None)),                                   # one GEMM per group
    ("k1x1_per_image_g2", 5, 1, (5, "slices of images")),
    ("split_k_1x1_g1", 3, 1, (3, "slices of images")),
    ("split_k_1x1_g1", 1, 11, (11, "slices of positions")),                   # few images
    ("k1x1_per_image_g2", 1, 2, (2, "slices of positions")),
], ids=["whole", "slices_of_images", "slices_of_2_images", "slices_of_positions", "grouped_positions"])
def test_1x1_grad_weight_sums_images_in_k_blocks(case_name, by_images, by_positions, want, queue, monkeypatch):
    """On clconv's GPU kernel the sum over the images is the GEMM's own (one K block per image),
    cut into slices of images or of every image's positions as the split-K rule asks."""
    from clconv.algorithms import pointwise
    case = next(c for c in EXTRA if c.name == case_name)
    x, w, b, dy = case.data()
    rule = pointwise.k_slices
    monkeypatch.setattr(pointwise, "k_slices", lambda device, engine, m, n, k, *args, **kw: (
        by_images if k == x.shape[0] else by_positions if k == x.shape[2] * x.shape[3] else rule(
            device, engine, m, n, k, *args, **kw)))
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="1x1", gemm="gpu")
    weight, (slices, how) = p.explain().record("backward_weight"), want
    assert "K blocks" in weight.notes and "1x1-weight-blocks" in weight.rules and weight.splits == slices
    assert (how in weight.notes) if how else not any(n.startswith("slices of") for n in weight.notes)
    want = reference.conv2d_weight(x, w.shape, dy, **case.options)
    assert_close(p.backward_weight(x, dy), want, np.float32, "grad-weight")


def test_winograd_chunks_and_workspace_fallback(queue):
    case = next(c for c in EXTRA if c.name == "winograd_wide_d1x2")
    x, w, b, dy = case.data()
    opts = case.options
    full = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="winograd")
    algo = full._choice["forward"][0]
    assert algo.chunk == {"forward": 3, "backward_input": 3, "backward_weight": 3}
    one = clconv.plan((1,) + x.shape[1:], w.shape, **opts, queue=queue, algorithm="winograd")
    limit = one.workspace_bytes   # one image per chunk
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="winograd", workspace_limit=limit)
    assert [r.chunks for r in p.explain().records] == [(3, 1)] * 3
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32,
                 "grad-weight")
    # below one image, it cuts the image (tests/test_tiles.py); below one tile row it refuses
    with pytest.raises(ValueError, match="Winograd workspace bytes, above the limit of 256 bytes"):
        clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="winograd", workspace_limit=256)


def test_fft_chunks_float64_and_workspace_limit(queue):
    """One image per chunk: grad-weight's per-frequency sums add on across chunks."""
    case = next(c for c in EXTRA if c.name == "winograd5_g2_d1x2_overpad")
    opts = case.options
    one = clconv.plan((1,) + case.input_shape[1:], case.weight_shape, **opts, queue=queue, algorithm="fft")
    limit = one.workspace_bytes
    dtypes = [np.float32] + ([np.float64] if has_fp64(queue.device) else [])
    for dtype in dtypes:
        x, w, b, dy = case.data(dtype)
        p = clconv.plan(x.shape, w.shape, **opts, dtype=dtype, queue=queue, algorithm="fft",
                        workspace_limit=limit * np.dtype(dtype).itemsize // 4)
        assert [r.chunks for r in p.explain().records] == [(2, 1)] * 3
        assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **opts), dtype, "forward")
        assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), dtype, "grad-input")
        assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), dtype, "grad-weight")
    with pytest.raises(ValueError, match="FFT workspace bytes, above the limit"):
        clconv.plan(case.input_shape, case.weight_shape, **opts, queue=queue, algorithm="fft",
                    workspace_limit=limit - 4)


@pytest.mark.parametrize("case", [
    Case("winograd_split_k_3x3", 6, 4, 37, 40, 6, 3, 3, padding=1, groups=2),
    Case("winograd_split_k_5x5_d2", 5, 2, 40, 38, 3, 5, 5, padding=(4, 3), dilation=2)], ids=repr)
def test_winograd_split_k_grad_weight_with_chunks(case, queue):
    """Grad-weight over at least 2 x 256 tiles sums slices of them; chunks of 2 images
    accumulate, and per-group queues give the same bits."""
    x, w, b, dy = case.data()
    opts = case.options
    want = reference.conv2d_weight(x, w.shape, dy, **opts)
    algo = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="winograd")._choice["backward_weight"][0]
    two = algo._layout("backward_weight", 2)[-1] * 4   # bytes for chunks of 2 images
    results = []
    for queues in ("single", "per-group"):
        p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="winograd", workspace_limit=two,
                        queues=queues)
        assert p._choice["backward_weight"][0].chunk["backward_weight"] == 2
        weight = p.explain().record("backward_weight")
        assert weight.chunks == (3, 2) and weight.splits > 1 and "winograd-weight-split" in weight.rules
        results.append(p.backward_weight(x, dy))
        assert_close(results[-1], want, np.float32, f"grad-weight, {queues}")
    np.testing.assert_array_equal(*results)
    # 4 bytes less: one image per chunk, and the partial sums still inside the limit
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="winograd", workspace_limit=two - 4)
    assert p._choice["backward_weight"][0].chunk["backward_weight"] == 1 and p.workspace_bytes <= two - 4
    assert_close(p.backward_weight(x, dy), want, np.float32, "grad-weight, one image per chunk")


@pytest.mark.parametrize("kind,cap,slices", [(cl.device_type.GPU, 15, 8), (cl.device_type.CPU, 16, 16)],
                         ids=["gpu", "cpu"])
def test_winograd_grad_weight_split_cap(kind, cap, slices, queue):
    """Winograd's grad-weight split-K keeps its partial sums to about GPU_SPLIT_K_TARGET elements
    on GPUs, SPLIT_K_TARGET elsewhere. 64 -> 64 channels (36 x 64 x 64 = 147456 per slice) over
    4 x 32 x 32 = 4096 tiles (at most 16 slices of 256): 15 on a GPU (8 dividing the tiles), 16
    elsewhere (there the slices' length decides: the size alone would allow 114). A plan only:
    the split's sums are checked against the reference above."""
    g = conv_geometry((4, 64, 128, 128), (64, 64, 3, 3), padding=1)
    p = clconv.Plan(g, np.float32, QueueAs(queue, type=kind), algorithm="winograd", selfcheck=False)
    algo = p._choice["backward_weight"][0]
    assert algo.max_slices == cap and algo._slices(4096) == slices
    assert p.explain().record("backward_weight").splits == slices


GROUPED_KG4 = Case("grouped_kg4_s1", 2, 8, 13, 11, 8, 3, 3, padding=1, groups=2)
STEM = next(c for c in EXTRA if c.name == "stem_7x7_s2")


@pytest.mark.parametrize("case", [STEM, GROUPED_KG4], ids=repr)
def test_direct_several_filters_per_work_item(case, queue):
    """On a device of one compute unit every work-group count is enough: the forward kernel
    takes the most filters per work-item it can (on GPUs staging the patch in local memory),
    and so does the stride-1 grad-input."""
    x, w, b, dy = case.data()
    opts = case.options
    g = conv_geometry(x.shape, w.shape, **opts)
    p = clconv.Plan(g, np.float32, QueueAs(queue, max_compute_units=1), algorithm="direct",
                    selfcheck=False)
    algo = p._choice["forward"][0]
    assert algo.kb["forward"] == min(16, g.Kg) and algo.kb["backward_input"] == (g.Cg if g.stride == (1, 1) else 1)
    assert_close(p.forward(x, w, b, queue=queue), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(p.backward_input(w, dy, queue=queue), reference.conv2d_input(x.shape, w, dy, **opts), np.float32,
                 "grad-input")


def _staged_features(algo):
    """What a direct plan's GPU-form forward launches do: rows and filters per work-item, and
    patch values each work-item stages (the kernel reads them ahead for at most 16, in
    work-groups of at least 32 work-items)."""
    tx, ty, ph, pw, ry = algo.tiles["forward"]
    return {"rows": ry, "filters": algo.kb["forward"], "grad_input_filters": algo.kb["backward_input"],
            "reads": -(-ph * pw // (tx * ty))}


STAGED_EXTRA = [  # (case, what its plan must do on one compute unit)
    (Case("depthwise_s2_rows", 1, 2, 70, 40, 2, 3, 3, stride=2, padding=1, groups=2), {"rows": 2}),
    (Case("few_channels_s2x1_d2", 1, 3, 45, 50, 4, 3, 3, stride=(2, 1), padding=2, dilation=2),
     {"rows": 4, "filters": 4}),
    # grad-input through the forward kernel with four filters' weights read at once
    (GROUPED_KG4, {"grad_input_filters": 4}),
    # one output per plane under a 17x17 patch: too many values per work-item to read ahead
    (Case("g2_5x5_d4_one_output", 1, 4, 17, 17, 2, 5, 5, dilation=4, groups=2), {"reads": 289}),
    # 2-work-item tiles (PoCL 3.0's compiler crashed on their read-ahead form)
    (Case("two_item_tile", 1, 2, 4, 3, 4, 3, 3), {}),
]


def _direct_staged(case, dtype, units, queue):
    """The GPU form of the direct kernels on any device (its queue reports a GPU of ``units``
    compute units) against the reference."""
    x, w, b, dy = case.data(dtype)
    opts = case.options
    g = conv_geometry(x.shape, w.shape, **opts)
    p = clconv.Plan(g, dtype, QueueAs(queue, type=cl.device_type.GPU, max_compute_units=units), algorithm="direct",
                    selfcheck=False)
    algo = p._choice["forward"][0]
    assert algo.staged
    assert_close(p.forward(x, w, b, queue=queue), reference.conv2d(x, w, b, **opts), dtype, "forward")
    assert_close(p.backward_input(w, dy, queue=queue), reference.conv2d_input(x.shape, w, dy, **opts), dtype,
                 "grad-input")
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **opts), dtype,
                 "grad-weight")
    return algo


@pytest.mark.gpu_form
@pytest.mark.parametrize("units", [1, 132], ids=lambda u: f"{u}_units")
@pytest.mark.parametrize("case,expect", [(c, {}) for c in CASES + EXTRA if Direct.applies(
    conv_geometry(c.input_shape, c.weight_shape, **c.options))[0]] + STAGED_EXTRA, ids=repr)
def test_direct_staged_matches_reference(case, expect, units, queue):
    """Staged patches and weights, several rows and filters per work-item (one compute unit:
    the most filters; 132: as on an H200), patch columns grouped by stride phase."""
    features = _staged_features(_direct_staged(case, np.float32, units, queue))
    if units == 1:
        assert {k: features[k] for k in expect} == expect


FORM_CASES = [  # (case, (reading in place, planes per work-group) of the forward and grad-input)
    # N*K = 15 planes: the last work-group takes three
    (Case("depthwise_3x3_s2_odd", 3, 5, 13, 11, 5, 3, 3, stride=2, padding=1, groups=5), (True, 4)),
    (Case("depthwise_5x5_one_row", 3, 3, 9, 14, 3, 5, 5, padding=2, groups=3), (True, 4)),
    (Case("depthwise_5x5_four_rows", 3, 3, 37, 41, 3, 5, 5, padding=2, groups=3), (False, 4)),
    # two filters per work-item: 9 (n, k-block) planes
    (Case("g3_7x7_two_filters", 3, 6, 12, 13, 6, 7, 7, padding=3, groups=3), (False, 4)),
    (Case("dense_3x3_few_uses", 2, 3, 11, 9, 5, 3, 3, padding=1), (False, 1)),
    # four filters' staged weights read at once (WVEC), 6 planes
    (Case("g2_5x5_four_filters", 3, 4, 9, 11, 8, 5, 5, padding=2, groups=2), (False, 4)),
    # tiles of 16 work-items: no read-ahead, each plane's patch read after the last one's sums
    (Case("dense_5x5_on_3x4_no_read_ahead", 3, 2, 3, 4, 3, 5, 5, padding=2), (False, 4)),
]


@pytest.mark.gpu_form
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case,form", FORM_CASES, ids=repr)
def test_direct_forward_forms(case, form, dtype, queue, monkeypatch):
    """The GPU forward kernel's forms where enough work-groups remain (here: always): reading a
    depthwise input in place or staging patches, one plane or PLANES planes per work-group in turn
    (the last work-group's fewer); explain() names the form. Against the reference, forward and
    grad-input (the stride-1 grad-input runs the same kernel over flipped weights)."""
    if dtype == np.float64 and not has_fp64(queue.device):
        pytest.skip("the device has no float64")
    monkeypatch.setattr(rules, "DIRECT_GROUPS_PER_UNIT", 0)
    algo = _direct_staged(case, dtype, 1, queue)
    assert set(algo.form.values()) == {form}
    line = algo.describe("forward")
    assert ("reading the input in place" in line) == form[0]
    assert (f"{form[1]} planes per work-group in turn" in line) == (form[1] > 1)


def test_direct_forward_form_rule():
    """_forward_form on an H200's 132 compute units, the networks' layers at batch 32: depthwise
    3x3 at stride 2 reads in place; 7x7 at stride 1 on 56x56 stages four planes per work-group;
    dense 3x3 one; at batch 1 too few work-groups for planes."""
    def form(n, c, hw, k, stride, groups):
        g = conv_geometry((n, c, hw, hw), (c, c // groups, k, k), stride=stride, padding=k // 2, groups=groups)
        tile = (32, 8, 0, 0, 4 if hw >= 28 else 1)
        return direct._forward_form(g, tile, 1, 132)
    assert form(32, 192, 28, 3, 2, 192) == (True, 4)
    assert form(32, 96, 56, 7, 1, 96) == (False, 4)
    assert form(32, 64, 56, 3, 1, 1) == (False, 1)
    assert form(1, 192, 28, 3, 2, 192) == (False, 1)


@pytest.mark.parametrize("case,short", [
    (Case("depthwise_7x7_on_6x4", 2, 3, 6, 4, 3, 7, 7, padding=3, groups=3), True),    # rows of 4 outputs
    (Case("grouped_kb2_on_7x4_s2", 1, 8, 7, 4, 8, 3, 3, stride=2, padding=1, groups=4), True),
    (Case("depthwise_on_30_wide", 1, 2, 4, 30, 2, 3, 3, padding=1, groups=2), False),
], ids=repr)
def test_direct_rows_load_short_rows_once(case, short, queue):
    """On CPUs, rows of at most one vector of outputs take direct_rows' short-row form (each input
    row loaded once, zero-padded); longer rows the vector-by-vector one; both sum several output
    rows at once where a work-item has several (the last block's rows past its band not stored).
    Against the reference, forward and grad-input (the forward kernel over the flipped weights)."""
    x, w, b, dy = case.data()
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **case.options), np.float32,
                    QueueAs(queue, type=cl.device_type.CPU), algorithm="direct", selfcheck=False)
    notes, rows = p.explain().record("forward").notes, p._choice["forward"][0].rows["forward"][1]
    assert ("short rows" in notes) == short
    assert any(n.endswith("rows at once") for n in notes) == (rows > 1)   # (rows per work-item: the device's cores)
    assert_close(p.forward(x, w, b, queue=queue), reference.conv2d(x, w, b, **case.options), np.float32, "forward")
    assert_close(p.backward_input(w, dy, queue=queue), reference.conv2d_input(x.shape, w, dy, **case.options),
                 np.float32, "grad-input")


@pytest.mark.parametrize("case,band,rows,band_bytes", [
    (Case("depthwise_7x7_on_13x29", 4, 6, 13, 29, 6, 7, 7, padding=3, groups=6), True, 13, None),
    # bands of 8 of a plane's 13 rows where the whole plane's would not fit (the last one partly past it)
    (Case("depthwise_7x7_band_of_8_rows", 4, 6, 13, 29, 6, 7, 7, padding=3, groups=6), True, 8, 3200),
    # groups of 3 channels (not a vector's multiple), stride 2, dilation 2; a filter taller than the image
    (Case("g2_of_3_s2_d2", 4, 6, 23, 37, 4, 3, 3, stride=2, padding=2, dilation=2, groups=2), True, None, None),
    (Case("depthwise_9x9_on_4x11", 4, 4, 4, 11, 4, 9, 9, padding=4, groups=4), True, None, None),
    # stride 2, 3x3 and few loads at a row's edge: reading in place costs less than the copy
    (Case("depthwise_s2_wide", 4, 4, 9, 150, 4, 3, 3, stride=2, padding=1, groups=4), False, None, None),
], ids=repr)
def test_direct_rows_zero_padded_band(case, band, rows, band_bytes, queue, monkeypatch):
    """On CPUs, direct_rows over rows longer than a vector copies its input rows, zero-padded, into
    local memory where that pays (rules.DIRECT_BAND_MIN_USES, BAND_MIN_EDGES), in bands of fewer rows than
    a plane where a plane's do not fit BAND_BYTES. Forward and grad-input against the reference."""
    if band_bytes:
        monkeypatch.setattr(rules, "DIRECT_BAND_BYTES", band_bytes)
    x, w, b, dy = case.data()
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **case.options), np.float32,
                    QueueAs(queue, type=cl.device_type.CPU, max_compute_units=1), algorithm="direct", selfcheck=False)
    assert ("input band" in p.explain().record("forward").notes) == band
    if rows:
        assert p._choice["forward"][0].rows["forward"][1] == rows
    assert_close(p.forward(x, w, b, queue=queue), reference.conv2d(x, w, b, **case.options), np.float32, "forward")
    assert_close(p.backward_input(w, dy, queue=queue), reference.conv2d_input(x.shape, w, dy, **case.options),
                 np.float32, "grad-input")


@pytest.mark.parametrize("case,band_rows,band_bytes", [
    # two slices of 33 rows: the first ends inside the second image, in bands of 8 and 3 rows
    (Case("depthwise_band_of_8_rows", 3, 4, 11, 13, 4, 3, 3, padding=1, groups=4), 8, 720),
    (Case("depthwise_7x7_on_7x7", 2, 4, 7, 7, 4, 7, 7, padding=3, groups=4), 7, None),   # rows of one vector
    (Case("g2_of_3_s2_d2", 4, 6, 23, 37, 4, 3, 3, stride=2, padding=2, dilation=2, groups=2), 12, None),
    (Case("depthwise_s2_wide", 4, 4, 9, 150, 4, 3, 3, stride=2, padding=1, groups=4), None, None),
], ids=repr)
def test_direct_weight_rows_zero_padded_band(case, band_rows, band_bytes, queue, monkeypatch):
    """On CPUs, direct_weight_rows copies the input rows under up to BR output rows of an image,
    zero-padded, into local memory where that pays (as direct_rows), BR as many of an image's rows as
    fit BAND_BYTES; a work-item's slice of rows may end inside an image. Against the reference."""
    if band_bytes:
        monkeypatch.setattr(rules, "DIRECT_BAND_BYTES", band_bytes)
    x, w, b, dy = case.data()
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **case.options), np.float32,
                    QueueAs(queue, type=cl.device_type.CPU, max_compute_units=1), algorithm="direct", selfcheck=False)
    algo = p._choice["backward_weight"][0]
    assert (algo._weight_band() or (None,))[0] == band_rows
    assert (f"input band of {band_rows} rows" in p.explain().record("backward_weight").notes) == bool(band_rows)
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **case.options),
                 np.float32, "grad-weight")


@pytest.mark.gpu_form
@pytest.mark.parametrize("case", [STEM, GROUPED_KG4], ids=repr)
def test_direct_staged_float64(case, queue):
    if not has_fp64(queue.device):
        pytest.skip("the device has no float64")
    _direct_staged(case, np.float64, 1, queue)


# the algorithms whose kernels read float16 arrays as they are on GPUs (HALF_KERNELS), each form:
# direct's GPU forms (input in place, staged patches, four filters' staged weights at once, the strided
# grad-input, grad-weight's partials in work-groups); Winograd's transforms per tile, F(4x4, 3x3),
# F(2x2, 5x5) dilated, F(2, 7) along either axis, and chunks of one image at offsets into the arrays.
# On CPUs (direct's row kernels, Winograd's transforms VW tiles at a time) the same on float32 copies
DIRECT_CPU = [Case("depthwise_7x7_on_13x29", 4, 6, 13, 29, 6, 7, 7, padding=3, groups=6)]
DIRECT_GPU = [c for c, _ in FORM_CASES] + [
    Case("g2_s2_strided_grad_input", 3, 4, 11, 9, 6, 3, 3, stride=2, padding=1, groups=2)]
WINOGRAD = [Case("3x3_g2", 2, 6, 13, 11, 4, 3, 3, padding=1, groups=2),
            Case("5x5_d2", 2, 3, 14, 12, 4, 5, 5, padding=(4, 3), dilation=2),
            Case("1x7", 2, 4, 5, 13, 6, 1, 7, padding=(0, 3), groups=2),
            Case("7x1", 2, 3, 13, 6, 5, 7, 1, padding=(3, 0)),
            Case("3x3_chunks", 3, 4, 10, 9, 6, 3, 3, padding=1)]
HALF_KERNEL_CASES = [
    *(pytest.param("direct", c, "cpu", id=f"direct-cpu-{c.name}") for c in DIRECT_CPU),
    *(pytest.param("direct", c, "gpu", id=f"direct-gpu-{c.name}", marks=pytest.mark.gpu_form) for c in DIRECT_GPU),
    *(pytest.param("winograd", c, "cpu", id=f"winograd-cpu-{c.name}") for c in WINOGRAD[-1:]),
    *(pytest.param("winograd", c, "gpu", id=f"winograd-gpu-{c.name}", marks=pytest.mark.gpu_form) for c in WINOGRAD),
]


@pytest.mark.parametrize("algorithm, case, kind", HALF_KERNEL_CASES)
def test_half_kernels_read_float16_arrays_as_they_are(algorithm, case, kind, queue, monkeypatch):
    """In plans for a GPU the kernels of direct and Winograd read and write float16 arrays as they
    are (no float32 copies made or converted back), summing in float; for a CPU they run on float32
    copies. Each pass within float16's tolerance of the float64 reference; a fused ReLU gives the
    forward's own halves through max(., 0), bit for bit (applied in float, before the rounding)."""
    monkeypatch.setattr(rules, "DIRECT_GROUPS_PER_UNIT", 0)   # (direct's GPU forms: planes per work-group)
    x, w, b, dy = case.data(np.float16)
    opts = case.options
    device = QueueAs(queue, type=cl.device_type.GPU if kind == "gpu" else cl.device_type.CPU, max_compute_units=1)
    limit = None
    if case.name.endswith("_chunks"):   # a workspace of one image's: chunks at offsets into the arrays
        limit = clconv.Plan(conv_geometry((1,) + x.shape[1:], w.shape, **opts), np.float16, device,
                            algorithm=algorithm, selfcheck=False).workspace_bytes
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **opts), np.float16, device, algorithm=algorithm,
                    selfcheck=False, workspace_limit=limit)
    if limit:
        assert [r.chunks for r in p.explain().records] == [(x.shape[0], 1)] * 3
    assert_float16_passes(p, x, w, b, dy, opts, queue, as_they_are=kind == "gpu")


# the C preprocessor (GCC's, else the clang `make` installs), which reads OpenCL C's directives alike
PREPROCESSOR = (["cpp", "-P", "-w"] if shutil.which("cpp") else
                ["clang-15", "-E", "-P", "-w", "-x", "c", "-"] if shutil.which("clang-15") else None)


def _kernel_text(name, defines):
    """Kernel ``name`` of direct.cl and the functions it calls, preprocessed with ``defines``."""
    source = program_source("direct.cl", np.dtype(np.float32), (("ONLY", name.upper()), ("IDX", "int"),
                                                                 *defines.items()))
    text = subprocess.run(PREPROCESSOR, input=source, capture_output=True, text=True, check=True).stdout
    functions, depth, start = {}, 0, 0   # top-level function name -> its text, by braces
    for m in re.finditer(r"[{}]", text):
        depth += 1 if m.group() == "{" else -1
        if m.group() == "{" and depth == 1:
            head = re.findall(r"\b(?:void|float\d*|int)\s+(\w+)\s*\(", text[start:m.start()])
        if depth == 0:
            if head:
                functions[head[0]] = text[start:m.end()]
            start = m.end()
    kept, todo = {}, [name]
    while todo:
        f = todo.pop()
        if f not in kept:
            kept[f] = functions[f]
            todo += [c for c in functions if re.search(rf"\b{c}\s*\(", kept[f])]
    body = "".join(kept.values())
    return body + "".join(re.findall(r"^typedef .*lanes;$", text, re.M) if "lanes" in body else [])


@pytest.mark.skipif(not PREPROCESSOR, reason="needs a C preprocessor (cpp or clang-15)")
def test_direct_builds_get_only_the_defines_their_kernel_reads():
    """direct.READS names every #define each kernel of direct.cl reads besides the filter's: a value
    given for any other leaves the kernel, and what it calls, the same text (so builds that differ
    only there would be the same program)."""
    values = dict(TAPS=7, TX=4, TY=2, PH=5, PW=6, RY=2, KB=2, NP=3, RB=3, VW=4, STAGE=0, WSTAGE=0, WVEC=1, FLIP=1,
                  WG=32, RT=3, CB=2, RI=2, RNV=2, RR=2, LPAD=512, BR=2)
    filt = dict(KH=3, KW=3, SH=2, SW=2, DH=1, DW=1, PT=1, PL=1, CG=1, KG=1)
    for name, reads in direct.READS.items():
        own = {k: v for k, v in values.items() if k in reads} | filt
        text = _kernel_text(name, own)
        assert f"void {name}(" in text
        for k, v in {**values, **filt}.items():
            if k not in own:
                assert _kernel_text(name, {**own, k: v}) == text, f"{name} reads {k}, not in direct.READS"


def test_auto_passes_over_winograd_above_the_workspace_limit(queue, monkeypatch):
    # many filters, few pixels: Winograd's 36 x 64 x 16 transformed filters need more than im2col
    # (on GPUs, without the Winograd work rule, which 1.5 MFLOP is below: its own test)
    monkeypatch.setattr(rules, "WINOGRAD_GPU_MIN_FLOP_PER_UNIT", 0)
    x = np.random.default_rng(0).standard_normal((1, 16, 9, 9)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((64, 16, 3, 3)).astype(np.float32)
    assert clconv.plan(x.shape, w.shape, padding=1, queue=queue).algorithms["forward"] == "winograd"
    p = clconv.plan(x.shape, w.shape, padding=1, queue=queue, workspace_limit=80000)
    assert set(p.algorithms.values()) == {"im2col"}
    assert all(("winograd", "workspace") in r.passed_over for r in p.explain().records)
    assert_close(p.forward(x, w), reference.conv2d(x, w, padding=1), np.float32, "forward")
    # below one output position's column (16 x 3 x 3 values) nothing fits, not even im2col's tiles
    with pytest.raises(ValueError, match=r"winograd: one image .* im2col: one output position .* \(one image needs"):
        clconv.plan(x.shape, w.shape, padding=1, queue=queue, workspace_limit=500)


def test_split_k_last_chunk_fits_its_workspace(queue):
    # chunks of 26 images (416 positions) split into 8 slices, the last one of 18 images (288
    # positions) into 12; on GPUs (chunks of at least 256 positions split there), which cut the
    # batch into slices of >= 64 rather than 256 positions (at most 50), 26 and 36 (slices of whole
    # vectors of 4 positions), planned as of 64 compute units (few would fill with fewer slices)
    xs, ws = (200, 16, 9, 9), (64, 16, 3, 3)
    g = conv_geometry(xs, ws, stride=2)
    gpu = bool(queue.device.type & cl.device_type.GPU)
    on = QueueAs(queue, max_compute_units=64) if gpu else queue
    algo = clconv.Plan(g, np.float32, on, algorithm="im2col", selfcheck=False)._choice["backward_weight"][0]
    limit = ((algo.rows + g.K) * g.P * 26 + algo.max_slices * g.K * g.Kd) * 4
    p = clconv.Plan(g, np.float32, on, algorithm="im2col", selfcheck=False, workspace_limit=limit)
    algo = p._choice["backward_weight"][0]
    assert (algo.chunk, algo.slices, algo.last_slices) == ((26, 26, 36) if gpu else (26, 8, 12))
    assert algo.workspace["backward_weight"] == (algo.rows + g.K) * g.P * 26 + algo.last_slices * g.K * g.Kd
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs).astype(np.float32)
    dy = rng.standard_normal(g.output_shape).astype(np.float32)
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, ws, dy, stride=2), np.float32,
                 "grad-weight")


def test_tuned_winner_above_the_workspace_limit_is_passed_over(queue, monkeypatch, tmp_path):
    from clconv import tuning
    monkeypatch.setenv("CLCONV_CACHE_DIR", str(tmp_path))
    xs, ws = (1, 16, 8, 8), (64, 16, 3, 3)
    g = clconv.plan(xs, ws, padding=1, queue=queue).geometry
    tuning.store({tuning.entry_key(queue.device, np.float32, g, p): {"algorithm": "winograd", "queues": "single",
                                                                     "ms": 1.0} for p in ("forward",)})
    assert sum("tuned" in r.rules for r in clconv.plan(xs, ws, padding=1, queue=queue).explain().records) == 1
    p = clconv.plan(xs, ws, padding=1, queue=queue, workspace_limit=80000)   # Winograd needs more
    assert p.algorithms["forward"] == "im2col" and not any("tuned" in r.rules for r in p.explain().records)


def test_direct_grad_weight_partials_fit_the_workspace_limit(queue):
    xs, ws, opts = (8, 2, 64, 64), (2, 1, 3, 3), dict(padding=1, groups=2)
    one_slice = 2 * 9 * 4   # bytes of one slice of partial sums: K filters x 9 taps
    full = clconv.plan(xs, ws, **opts, queue=queue, algorithm="direct")
    assert full._choice["backward_weight"][0].slices > 1
    p = clconv.plan(xs, ws, **opts, queue=queue, algorithm="direct", workspace_limit=one_slice)
    assert p._choice["backward_weight"][0].slices == 1 and p.workspace_bytes == one_slice
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs).astype(np.float32)
    dy = rng.standard_normal(p.geometry.output_shape).astype(np.float32)
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, ws, dy, **opts), np.float32, "grad-weight")
    with pytest.raises(ValueError, match="workspace bytes, above the limit"):
        clconv.plan(xs, ws, **opts, queue=queue, algorithm="direct", workspace_limit=one_slice - 4)


class _Platform:
    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize("name", ["winograd_g2_d2_overpad", "winograd_rows_p1", "winograd_7x1_rows_d2",
                                  "winograd_1x7_rows_p3"])
@pytest.mark.parametrize("platform", ["Portable Computing Language", "Intel(R) OpenCL"], ids=["pocl", "intel"])
def test_winograd_transforms_per_cpu_runtime(platform, name, queue):
    """The two CPU runtimes differ: PoCL 3.0 keeps the per-tile transform kernels scalar, so CPU
    devices there take the row forms (VW tiles per vector); Intel's runtime vectorises the
    per-tile kernels across work-items, which then measure faster, but for a column of taps (7x1),
    whose tiles' values load as runs of rows. All match the reference, on every runtime the suite
    runs (the row forms' lanes in one tile row too: winograd_rows_p1, winograd_7x1_rows_d2)."""
    case = next(c for c in EXTRA if c.name == name)
    rows = platform.startswith("Portable") or case.weight_shape[2:] == (7, 1)
    x, w, b, dy = case.data()
    opts = case.options
    g = conv_geometry(x.shape, w.shape, **opts)
    p = clconv.Plan(g, np.float32, QueueAs(queue, type=cl.device_type.CPU, platform=_Platform(platform)),
                    algorithm="winograd", selfcheck=False)
    assert all(("row transforms" in r.notes) is rows for r in p.explain().records)
    assert_close(p.forward(x, w, b, queue=queue), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(p.backward_input(w, dy, queue=queue), reference.conv2d_input(x.shape, w, dy, **opts), np.float32,
                 "grad-input")
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32,
                 "grad-weight")


@pytest.mark.parametrize("slices", [2, 3, 5])
@pytest.mark.parametrize("case", [
    Case("1x1_c12_k9_5x7", 3, 12, 5, 7, 9, 1, 1),          # forward K=12, grad-input K=9: under one tile
    Case("1x1_c6_k12_16x17", 5, 6, 16, 17, 12, 1, 1),      # per-image grad-weight: 272 positions
], ids=repr)
def test_pointwise_split_k(case, slices, queue, monkeypatch):
    """1x1's split-K (a GPU's rule, forced here on any device and engine): the slices along K of
    forward and grad-input, rounded down to a divisor of that K (5 divides none of them), against
    the reference; grad-weight's own (K blocks: test_1x1_grad_weight_sums_images_in_k_blocks) is
    not split-K's."""
    from clconv.algorithms import pointwise
    monkeypatch.setattr(pointwise, "k_slices", lambda device, engine, m, n, k, count, *args, **kw: slices)
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="1x1")
    algo = p._choice["forward"][0]
    for pass_name, k in (("forward", x.shape[1]), ("backward_input", w.shape[0]), ("backward_weight", 272)):
        want = max(d for d in range(1, slices + 1) if k % d == 0) if pass_name != "backward_weight" else 1
        assert algo.split[pass_name] == want, pass_name
        assert ("split-K into" in algo.describe(pass_name)) == (want > 1), pass_name
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(p.forward(x, w, relu=True), np.maximum(reference.conv2d(x, w, **opts), 0), np.float32, "fwd + ReLU")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32,
                 "grad-weight")


@pytest.mark.parametrize("slices", [2, 3, 5])
@pytest.mark.parametrize("case", [
    Case("fc_c12_k9_3x2", 3, 12, 3, 2, 9, 3, 2),     # forward K=72, grad-input K=9
    Case("fc_c8_k30_1x1_one_image", 1, 8, 1, 1, 30, 1, 1),   # a squeeze-excitation layer at batch 1
], ids=repr)
def test_fc_split_k(case, slices, queue, monkeypatch):
    """fc's split-K (a GPU's rule, forced here on any device and engine): forward and grad-input
    cut along K, rounded down to a divisor of that K, against the reference."""
    from clconv.algorithms import fc
    monkeypatch.setattr(fc, "k_slices", lambda device, engine, m, n, k, count, itemsize=4, **kw: slices)
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="fc")
    algo = p._choice["forward"][0]
    g = p.geometry
    for pass_name, k in (("forward", g.Kd), ("backward_input", g.K), ("backward_weight", 1)):
        want = max(d for d in range(1, slices + 1) if k % d == 0)
        assert algo.split[pass_name] == want, pass_name
        assert ("split-K into" in algo.describe(pass_name)) == (want > 1), pass_name
    assert_passes_match(p, x, w, b, dy, opts)


@pytest.mark.parametrize("queues", ["single", "per-group"])
@pytest.mark.parametrize("slices", [2, 3, 5])
@pytest.mark.parametrize("case", [
    Case("g2_3x3_s2_batch3", 3, 6, 9, 7, 8, 3, 3, stride=2, padding=(1, 0), groups=2),   # K: 27 forward, 4 grad-input
    Case("g1_1x7_one_image", 1, 5, 6, 11, 6, 1, 7, padding=(0, 3)),                       # one image: into Y in place
], ids=repr)
def test_im2col_split_k(case, slices, queues, queue, monkeypatch, im2col_col_path):
    """im2col's forward and grad-input split-K (a GPU's rule, forced here on any device and engine),
    rounded down to a divisor of each GEMM's K, against the reference."""
    # (on the GPU engine this also limits grad-weight's slices, of chunks of at least 256 positions)
    monkeypatch.setattr(im2col, "k_slices", lambda *args, **kwargs: slices)
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="im2col", queues=queues)
    algo = p._choice["forward"][0]
    g = p.geometry
    for pass_name, k in (("forward", g.Kd), ("backward_input", g.Kg)):
        want = max(d for d in range(1, slices + 1) if k % d == 0)
        if pass_name == "forward" and algo._implicit("forward"):
            want = 1   # few channels of several groups on clconv's GPU GEMM: one GEMM reading im2col in place
        assert algo.split[pass_name] == want, pass_name
        assert ("slices of K=" in algo.describe(pass_name)) == (want > 1), pass_name
    assert_passes_match(p, x, w, b, dy, opts, weight=False)


@pytest.mark.gpu_form
@pytest.mark.parametrize("case,slices,folds", [
    (Case("g1_3x3_batch3", 3, 6, 9, 7, 5, 3, 3, padding=1), 1, True),   # 63 positions: C written value by value
    (Case("g1_3x2_s2x1_batch3", 3, 6, 12, 9, 8, 3, 2, stride=(2, 1), padding=(1, 0)), 3, True),   # 48: four-wide
    (Case("g2_c5_3x3_batch3", 3, 10, 9, 7, 8, 3, 3, padding=1, groups=2), 1, True),   # each group's C at its rows
    (Case("g2_c5_3x3_s2_batch3", 3, 10, 9, 7, 8, 3, 3, stride=2, padding=(1, 0), groups=2), 3, False),
], ids=repr)
def test_im2col_forward_writes_output_in_place(case, slices, folds, queue, monkeypatch, im2col_col_path):
    """On clconv's GPU GEMM kernel im2col's forward writes the output as it is, every image's
    positions folded into the GEMM's columns (no layout copy), unsplit or in split-K slices of one
    group (each a whole partial output); slices over several groups keep the layout copy.
    Forward, with bias and through ReLU, against the reference."""
    # (on the GPU engine this also limits grad-weight's slices, of chunks of at least 256 positions)
    monkeypatch.setattr(im2col, "k_slices", lambda *args, **kwargs: slices)
    x, w, b, _ = case.data()
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="im2col", gemm="gpu")
    algo = p._choice["forward"][0]
    assert not algo._implicit("forward") and algo.split["forward"] == slices and algo.chunk == case.input_shape[0]
    assert ("the output written in place" in algo.describe("forward")) == folds
    want = reference.conv2d(x, w, b, **opts)
    assert_close(p.forward(x, w, b), want, np.float32, "forward")
    split = ["sum_partials"] if slices > 1 else []
    assert [kernel_kind(name) for name in p.launches("forward")] == (
        ["im2col", "fill_bias", "gemm_gpu"] + split if folds else ["im2col", "gemm_gpu"] + split + ["cnhw_to_nchw"])
    assert_close(p.forward(x, w, b, relu=True), np.maximum(want, 0), np.float32, "forward + ReLU")


@pytest.mark.gpu_form
@pytest.mark.parametrize("slices", [1, 3])
@pytest.mark.parametrize("case,algorithm", [
    (Case("im2col_1x7_batch3", 3, 9, 9, 7, 9, 1, 7, padding=(0, 3)), "im2col"),   # K 63; in place
    (Case("im2col_3x3_s2_g2", 3, 12, 11, 9, 10, 3, 3, stride=2, groups=2), "im2col"),   # K 54 per group
    (Case("1x1_5x5_batch3", 3, 45, 5, 5, 27, 1, 1), "1x1"),   # folded over the images
    (Case("1x1_16x17_batch2", 2, 30, 16, 17, 21, 1, 1), "1x1"),   # 272 positions: a product per image
], ids=repr)
def test_deep_tile(case, algorithm, slices, queue, monkeypatch, im2col_col_path):
    """On clconv's GPU GEMM kernel a forward's products at least DEEP_K deep, where the model gives
    the grid 4x4 work-items and that fill enough of the device, run the deep tile (64x64 of 8x4
    work-items), split-K or not. Forced here (DEEP_K 9, every grid given a 4x4 tile and counted
    large enough, the split); forward with bias and through ReLU, and grad-input (never deep),
    against the reference."""
    from clconv.algorithms import pointwise
    from clconv.gemm import gemm_gpu
    module = im2col if algorithm == "im2col" else pointwise
    monkeypatch.setattr(rules, "DEEP_K", 9)
    monkeypatch.setattr(rules, "DEEP_MIN_SHARE", 1 << 20)   # (a grid of one work-group large enough)
    monkeypatch.setattr(gemm_gpu, "tile", lambda *args, **kwargs: gemm_gpu.TILES[2][0])
    monkeypatch.setattr(module, "k_slices", lambda *args, **kwargs: slices)
    tiles, run, planes = {}, gemm_gpu.grid_gemm, gemm_gpu.sliced   # {pass: tiles its GEMMs launched}
    current = []
    monkeypatch.setattr(gemm_gpu, "grid_gemm", lambda *args, **kwargs: current.insert(0, kwargs["what"].split(" ")[0])
                        or run(*args, **kwargs))
    monkeypatch.setattr(gemm_gpu, "sliced", lambda device, t, *args, **kwargs: tiles.setdefault(current[0], set()).add(
        (t.tm, t.tn, t.rm, t.rn)) or planes(device, t, *args, **kwargs))
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm=algorithm, gemm="gpu")
    algo, k = p._choice["forward"][0], p.geometry.Kd
    assert algo.deep and algo.split["forward"] == max(d for d in range(1, slices + 1) if k % d == 0)
    assert "deep tile" in algo.describe("forward") and "deep tile" not in algo.describe("backward_input")
    tiles.clear()   # (the known-answer check's own plans launch on their rules' tiles)
    assert_passes_match(p, x, w, b, dy, opts, weight=False)
    assert tiles["forward"] == {(64, 64, 8, 4)} and tiles["grad-input"] == {(32, 64, 4, 4)}


@pytest.mark.gpu_form
@pytest.mark.parametrize("case,pass_name,units,split,note", [
    (Case("fwd_766_deep", 1, 766, 5, 7, 24, 1, 1), "forward", 132, False, True),   # two slices before the rule
    (Case("fwd_768_deep", 1, 768, 5, 7, 24, 1, 1), "forward", 132, True, False),
    (Case("dgrad_766_deep", 1, 24, 5, 7, 766, 1, 1), "backward_input", 132, False, True),
    (Case("dgrad_768_deep", 1, 24, 5, 7, 768, 1, 1), "backward_input", 132, True, False),
    (Case("fwd_766_grid_fills", 1, 766, 5, 7, 128, 1, 1), "forward", 1, False, False),   # unsplit anyway
], ids=repr)
def test_split_k_only_from_the_least_depth(case, pass_name, units, split, note, queue):
    """On clconv's GPU kernel a forward's or grad-input's product is split only from
    rules.MIN_SPLIT_DEPTH deep, however idle its grid leaves the device (a 1x1 over a 5x7 map on a
    stand-in of 132 compute units); explain() says so where the rule alone keeps it whole (not
    where the grid fills the device anyway). Against the reference."""
    x, w, b, dy = case.data()
    gpu = stand_in_gpu(queue, units)
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **case.options), np.float32, gpu, algorithm="1x1", gemm="gpu",
                    selfcheck=False)
    algo = p._choice[pass_name][0]
    text = algo.describe(pass_name)
    assert (algo.split[pass_name] > 1) == split and ("split-K into" in text) == split
    depth = case.weight_shape[1] if pass_name == "forward" else case.weight_shape[0]
    assert (f"not split-K (K={depth}, below {rules.MIN_SPLIT_DEPTH}" in text) == note
    if pass_name == "forward":
        assert_close(p.forward(x, w, queue=queue), reference.conv2d(x, w, **case.options), np.float32, "forward")
    else:
        assert_close(p.backward_input(w, dy, queue=queue), reference.conv2d_input(x.shape, w, dy, **case.options),
                     np.float32, "grad-input")


@pytest.mark.parametrize("case,deep,slices", [
    (((32, 192, 12, 12), (192, 192, 1, 7), dict(padding=(0, 3))), True, 3),   # 216 work-groups of 64x64
    (((32, 384, 5, 5), (384, 384, 3, 1), dict(padding=(1, 0))), True, 4),   # 78: K 1152 in slices of 288
    (((32, 96, 25, 25), (96, 96, 3, 3), dict(stride=2)), False, 2),   # K 864: the split rule before
    (((1, 192, 12, 12), (192, 192, 1, 7), dict(padding=(0, 3))), False, 4),   # 9 work-groups: too few
    (((32, 2048, 5, 5), (320, 2048, 1, 1), {}), True, 8),   # 1x1, folded: 65 work-groups, slices of 256
], ids=["1x7_c192", "3x1_c384", "3x3_s2_k864", "1x7_c192_batch1", "1x1_c2048_5x5"])
def test_deep_tile_rule(case, deep, slices, queue, im2col_col_path):
    """The deep tile's rule on a stand-in H200 (132 compute units): inception_v3's im2col forwards
    at batch 32, one at batch 1 (through col: the work rule, which would read it in place, set
    aside), and a 1x1 forward. A plan only: the deep tile's results are checked against the
    reference above."""
    input_shape, weight_shape, opts = case
    g = conv_geometry(input_shape, weight_shape, **opts)
    fake = stand_in_gpu(queue, 132)
    algorithm = "1x1" if weight_shape[2:] == (1, 1) else "im2col"
    algo = clconv.Plan(g, np.float32, fake, algorithm=algorithm, gemm="gpu", selfcheck=False)._choice["forward"][0]
    assert algo.deep == deep and algo.split["forward"] == slices


@pytest.mark.gpu_form
@pytest.mark.parametrize("case,forward,weight", [   # on 16 units: forwards up to 64 MFLOP, grad-weights up to 19
    (Case("g2_cg5_3x3_odd", 3, 10, 9, 7, 6, 3, 3, padding=1, groups=2), True, True),   # 0.1 MFLOP
    (Case("c64_3x3_36mflop", 2, 64, 19, 17, 48, 3, 3, padding=1), True, False),
    (Case("c64_3x3_71mflop", 4, 64, 19, 17, 48, 3, 3, padding=1), False, False),
], ids=repr)
def test_implicit_im2col_on_gpus_by_work(case, forward, weight, queue):
    """On GPUs (a stand-in of 16 compute units) im2col's forward reads the input in place up to 4
    MFLOP a pass per compute unit and its grad-weight up to 1.2, whatever the channels and taps
    (GPU_IMPLICIT_FLOP_PER_UNIT), explain() saying so; never by work on CPUs. Every pass against
    the reference."""
    x, w, b, dy = case.data()
    g = conv_geometry(x.shape, w.shape, **case.options)
    p = clconv.Plan(g, np.float32, QueueAs(queue, type=cl.device_type.GPU, max_compute_units=16),
                    algorithm="im2col", gemm="gpu", selfcheck=False)
    algo = p._choice["forward"][0]
    for pass_name, implicit, least in (("forward", forward, 64), ("backward_weight", weight, 19)):
        assert algo._implicit(pass_name) == implicit, pass_name
        text = algo.describe(pass_name)
        assert (f"no col; {g.flops() / 1e6:.1f} MFLOP a pass, at most {least} (" in text) == implicit, text
        assert text.startswith("GEMM reading im2col in place") == implicit, text
    want = reference.conv2d(x, w, b, **case.options)
    assert_close(p.forward(x, w, b, queue=queue), want, np.float32, "forward")
    assert_close(p.forward(x, w, b, queue=queue, relu=True), np.maximum(want, 0), np.float32, "forward + ReLU")
    assert_close(p.backward_input(w, dy, queue=queue), reference.conv2d_input(x.shape, w, dy, **case.options),
                 np.float32, "grad-input")
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **case.options),
                 np.float32, "grad-weight")
    cpu = clconv.Plan(g, np.float32, QueueAs(queue, type=cl.device_type.CPU, max_compute_units=16),
                      algorithm="im2col", gemm="gpu", selfcheck=False)._choice["forward"][0]
    assert not cpu._implicit("forward") and not cpu._implicit("backward_weight")


@pytest.mark.gpu_form
@pytest.mark.parametrize("slices", [1, 4])
@pytest.mark.parametrize("case,implicit", [
    (Case("1x1_s2_odd", 3, 10, 9, 7, 6, 1, 1, stride=2), True),
    (Case("2x2_s2_patchify", 2, 6, 8, 11, 5, 2, 2, stride=2), True),
    (Case("3x2_s3x2_padded", 2, 6, 10, 9, 4, 3, 2, stride=(3, 2), padding=(1, 0)), True),
    (Case("2x2_s2_g2", 2, 8, 6, 7, 6, 2, 2, stride=2, groups=2), True),
    (Case("2x2_s2_g2_cg5", 2, 10, 6, 7, 6, 2, 2, stride=2, groups=2), True),   # 5 channels per group
    (Case("3x3_s2_overlapping", 2, 6, 9, 8, 4, 3, 3, stride=2, padding=1), False),
], ids=repr)
def test_implicit_im2col_where_taps_do_not_overlap(case, implicit, slices, queue, monkeypatch, im2col_col_path):
    """On clconv's GPU GEMM kernel, im2col is read in place where it would only copy the input:
    few channels, or taps no wider than the stride. The forward is then one GEMM over the images
    into Y, or with one group, split-K slices of whole channels (the rule forced here)."""
    # (on the GPU engine this also limits grad-weight's slices, of chunks of at least 256 positions)
    monkeypatch.setattr(im2col, "k_slices", lambda *args, **kwargs: slices)
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="im2col", gemm="gpu")
    algo, g = p._choice["forward"][0], p.geometry
    assert algo._implicit("forward") == algo._implicit("backward_weight") == implicit
    forward = algo.describe("forward")
    assert ("reading im2col in place" in forward) == implicit
    if implicit:
        want = max(d for d in range(1, slices + 1) if g.C % d == 0) if g.groups == 1 else 1
        assert algo.split["forward"] == want
        assert (f"split-K into {want} slices of {g.C // want} channels" in forward) == (want > 1)
        assert algo.describe("backward_weight").startswith("GEMM reading im2col in place")
    assert_passes_match(p, x, w, b, dy, opts)


@pytest.mark.parametrize("gpu", [False, pytest.param(True, marks=pytest.mark.gpu_form)], ids=["cpu", "gpu"])
@pytest.mark.parametrize("case,cpu_weight,why", [
    (next(c for c in EXTRA if c.name == "grouped_cg8_s2"), "im2col", "grad-weight of 72 taps per group at stride 2"),
    (Case("grouped_cg8_s1", 2, 16, 9, 11, 4, 3, 3, padding=1, groups=2), "direct", None),
    (Case("grouped_cg24_s1", 1, 48, 7, 9, 4, 3, 3, padding=1, groups=2), "im2col",
     "grad-weight of 216 taps per group above 144"),
], ids=repr)
def test_auto_direct_for_wider_groups_on_cpus_only(case, cpu_weight, why, gpu, queue):
    """Groups of more than 64 taps: "auto" takes direct kernels for the forward and grad-input on
    CPUs, and for grad-weight at stride 1 up to 144 taps (else im2col); im2col for every pass on GPUs.
    Every pass against the reference."""
    on = QueueAs(queue, type=cl.device_type.GPU if gpu else cl.device_type.CPU)
    p = clconv.Plan(conv_geometry(case.input_shape, case.weight_shape, **case.options), np.float32, on,
                    selfcheck=False)
    want = "im2col" if gpu else "direct"
    assert p.algorithms == {"forward": want, "backward_input": want, "backward_weight": "im2col" if gpu else cpu_weight}
    taps = case.weight_shape[1] * 9
    refused = [r.pass_name for r in p.explain().records if ("direct", "direct-taps") in r.passed_over]
    assert refused == (list(ALL_PASSES) if gpu else ["backward_weight"] if why else [])
    if gpu or why:
        said = ALGORITHMS["direct"].preferred(p.geometry, "backward_weight", on.device)[1]
        assert (f"{taps} taps per group, above 64" if gpu else why) in said
    x, w, b, dy = case.data()
    opts = case.options
    assert_close(p.forward(x, w, b, queue=queue), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(p.backward_input(w, dy, queue=queue), reference.conv2d_input(x.shape, w, dy, **opts), np.float32,
                 "grad-input")
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32,
                 "grad-weight")


def test_explain_is_records_printed_as_a_narrow_table(queue):
    """explain(): a PassRecord per pass whose fields a program reads, its rules named as the docs'
    algorithms page names its sections; printed, at most 100 columns a line (the demo's layer)."""
    import pathlib
    from clconv.explanation import PassRecord
    p = clconv.plan((4, 96, 27, 27), (256, 48, 5, 5), padding=2, groups=2, queue=queue)
    e = p.explain()
    assert [r.pass_name for r in e.records] == list(ALL_PASSES) and all(isinstance(r, PassRecord) for r in e.records)
    assert [r.algorithm for r in e.records] == [p.algorithms[name] for name in ALL_PASSES]
    assert all(r.workspace == p._workspace_elements(r.pass_name) * 4 and len(r.reason) <= 120 for r in e.records)
    assert e.header["groups"] == 2 and e.header["gemm"] == p.gemm and max(map(len, str(e).splitlines())) <= 100
    docs = (pathlib.Path(__file__).parent.parent / "docs" / "guide" / "algorithms.md").read_text()
    named = {rule for r in e.records for rule in r.rules} | {rule for r in e.records for _, rule in r.passed_over}
    assert all(f"(rule-{rule})=" in docs for rule in named), named
    p.forward(*case_data(p))
    assert e.record("forward").launches is None and p.explain().record("forward").launches == tuple(
        p.launches("forward"))


def case_data(p):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(p.geometry.input_shape).astype(np.float32),
            rng.standard_normal(p.geometry.weight_shape).astype(np.float32))
