"""Determinism and threads: same answers every run, on every queue."""
import sys
import threading

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import reference
from helpers import CASES, REPLAYED, Case, assert_close, kernel_kind, stand_in_gpu

DETERMINISM = [  # one case per algorithm, plus per-group queues and split-K grad-weight
    (Case("im2col_split_k", 4, 4, 17, 19, 6, 3, 3, padding=1, groups=2), "im2col", "single"),
    (Case("im2col_per_group", 4, 4, 17, 19, 6, 3, 3, padding=1, groups=2), "im2col", "per-group"),
    (Case("depthwise", 3, 6, 40, 33, 12, 3, 3, stride=2, padding=1, groups=6), "direct", "single"),
    (Case("fc", 5, 8, 3, 2, 12, 3, 2, groups=4), "fc", "per-group"),
    (Case("pointwise", 5, 6, 13, 7, 9, 1, 1, groups=3), "1x1", "single"),
]


@pytest.mark.parametrize("case,algorithm,queues", DETERMINISM, ids=lambda v: getattr(v, "name", v))
def test_twenty_runs_are_bitwise_identical(case, algorithm, queues, queue):
    x, w, b, dy = (cla.to_device(queue, a) for a in case.data())
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm=algorithm, queues=queues)
    runs = [[p.forward(x, w, b).get(), p.backward_input(w, dy).get(), p.backward_weight(x, dy).get(),
             clconv.conv2d_bias(dy).get()] for _ in range(20)]
    for run in runs[1:]:
        for first, again in zip(runs[0], run):
            np.testing.assert_array_equal(first, again)


def test_two_threads_on_their_own_queues(queue):
    cases = [CASES[1], CASES[3], CASES[8], CASES[11]]
    errors = []

    def work(q):
        try:
            for case in cases * 3:
                x, w, b, dy = case.data()
                dx_, dw_, db_, ddy = (cla.to_device(q, a) for a in (x, w, b, dy))
                y = clconv.conv2d(dx_, dw_, db_, **case.options)
                gx = clconv.conv2d_input(x.shape, dw_, ddy, **case.options)
                gw = clconv.conv2d_weight(dx_, w.shape, ddy, **case.options)
                assert y.queue is q
                assert_close(y.get(), reference.conv2d(x, w, b, **case.options), np.float32, "forward")
                assert_close(gx.get(), reference.conv2d_input(x.shape, w, dy, **case.options), np.float32, "dx")
                assert_close(gw.get(), reference.conv2d_weight(x, w.shape, dy, **case.options), np.float32, "dw")
        except Exception as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(cl.CommandQueue(queue.context),)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("algorithm", ["direct", "im2col"])
def test_three_threads_share_one_plan_and_queue(algorithm, queue, monkeypatch):
    """Replayed passes (no workspace: direct forward; with one: im2col) from threads sharing a
    plan and a queue, each on its own arrays."""
    monkeypatch.setenv("CLCONV_GEMM", "clconv")   # passes with CLBlast GEMMs are not replayed
    case = Case("depthwise", 3, 6, 20, 17, 12, 3, 3, stride=2, padding=1, groups=6)
    p = clconv.plan(case.input_shape, case.weight_shape, **case.options, queue=queue, algorithm=algorithm)
    errors = []

    def work(seed):
        try:
            x, w, b, dy = case.data(seed=seed)
            xd, wd, bd, dyd = (cla.to_device(queue, a) for a in (x, w, b, dy))
            y, dx = cla.empty(queue, dy.shape, np.float32), cla.empty(queue, x.shape, np.float32)
            for _ in range(20):
                p.forward(xd, wd, bd, out=y)
                p.backward_input(wd, dyd, out=dx)
                assert_close(y.get(), reference.conv2d(x, w, b, **case.options), np.float32, "forward")
                assert_close(dx.get(), reference.conv2d_input(x.shape, w, dy, **case.options), np.float32, "dx")
        except Exception as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    entries = p._replays._entries.values()
    assert len(entries) >= 2 and all(e[2] is not None for e in entries), \
        "the passes should have been kept and replayed on their kernel copies"


@pytest.mark.parametrize("case,algorithm", REPLAYED, ids=lambda v: getattr(v, "name", v))
def test_replayed_calls_read_and_write_their_own_arrays(case, algorithm, queue, monkeypatch):
    """Calls after the first replay its launches (clconv.replay) with their own buffers."""
    monkeypatch.setenv("CLCONV_GEMM", "clconv")   # passes with CLBlast GEMMs are not replayed
    opts = case.options
    p = clconv.plan(case.input_shape, case.weight_shape, **opts, queue=queue, algorithm=algorithm)
    kept = []
    for seed in (1, 2, 1):   # new arrays each time, laid out alike: the third calls replay
        kept.append(len(p._replays._entries))   # (the first ones grow the workspace, which makes new keys)
        x, w, b, dy = case.data(seed=seed)
        xd, wd, bd, dyd = (cla.to_device(queue, a) for a in (x, w, b, dy))
        assert_close(p.forward(xd, wd, bd).get(), reference.conv2d(x, w, b, **opts), np.float32, "forward")
        assert_close(p.backward_input(wd, dyd).get(), reference.conv2d_input(x.shape, w, dy, **opts), np.float32,
                     "grad-input")
        assert_close(p.backward_weight(xd, dyd).get(), reference.conv2d_weight(x, w.shape, dy, **opts),
                     np.float32, "grad-weight")
    assert kept[2] == len(p._replays._entries) >= 3, "every pass should have been kept, then replayed"

    # input, weight and output side by side in one buffer, then apart at the same offsets, then
    # in a second shared buffer: the sharing is part of what a replay is keyed on
    x, w, _, _ = case.data(seed=3)
    sizes = [x.size, w.size, int(np.prod(p.geometry.output_shape))]
    starts = np.cumsum([0] + sizes)

    def views(buffers):
        return [buf[s:s + n].reshape(shape) for buf, s, n, shape in
                zip(buffers, starts, sizes, (x.shape, w.shape, p.geometry.output_shape))]
    shared = [cla.zeros(queue, int(starts[-1]), np.float32)] * 3
    apart = [cla.zeros(queue, int(starts[-1]), np.float32) for _ in range(3)]
    again = [cla.zeros(queue, int(starts[-1]), np.float32)] * 3
    want = reference.conv2d(x, w, **opts)
    for buffers in (shared, apart, again):
        xv, wv, yv = views(buffers)
        xv.set(x), wv.set(w)
        p.forward(xv, wv, out=yv)
        assert_close(yv.get(), want, np.float32, "forward into a view")
    np.testing.assert_array_equal(views(shared)[2].get(), views(again)[2].get())


@pytest.mark.parametrize("case,algorithm", REPLAYED, ids=lambda v: getattr(v, "name", v))
def test_replayed_and_fast_calls_match_first_calls_bit_for_bit(case, algorithm, queue, monkeypatch):
    """A plan's first call of a pass runs it in full, its second replays the kept launches, its
    third and later take the fast path (the bound launches found from the arrays' layout, no
    other work: here prepare() would raise). Each gives bit for bit what a new plan's first
    call gives on the same data, with fresh data, a new result or out=."""
    monkeypatch.setenv("CLCONV_GEMM", "clconv")   # passes with CLBlast GEMMs are not replayed
    opts = case.options
    p = clconv.plan(case.input_shape, case.weight_shape, **opts, queue=queue, algorithm=algorithm)

    def passes(plan, x, w, b, dy, outs=None):
        outs = outs or {}
        return [plan.forward(x, w, b, out=outs.get("forward")).get(),
                plan.backward_input(w, dy, out=outs.get("backward_input")).get(),
                plan.backward_weight(x, dy, out=outs.get("backward_weight")).get()]

    def first_calls(x, w, b, dy):   # a new plan's: nothing kept yet
        fresh = clconv.plan(case.input_shape, case.weight_shape, **opts, queue=queue, algorithm=algorithm)
        return passes(fresh, x, w, b, dy)

    data = [tuple(cla.to_device(queue, a) for a in case.data(seed=seed)) for seed in (1, 2, 3)]
    want = first_calls(*data[0])
    for _ in range(2):   # the full run, then the replay that arms the fast path
        for got, expected in zip(passes(p, *data[0]), want):
            np.testing.assert_array_equal(got, expected)
    outs = {name: cla.empty(queue, shape, np.float32)
            for name, shape in (("forward", p.geometry.output_shape), ("backward_input", case.input_shape),
                                ("backward_weight", case.weight_shape))}
    passes(p, *data[0], outs)   # the out= layout: replayed once, then fast too
    expected = {seed: first_calls(*d) for seed, d in zip((2, 3), data[1:])}

    def refuse(*args, **kwargs):
        raise AssertionError("a fast-path call went through prepare()")
    monkeypatch.setattr(sys.modules["clconv.plan"], "prepare", refuse)   # clconv.plan is the function
    for seed, d in zip((2, 3), data[1:]):   # fresh data, fast path only
        for got, expected_one in zip(passes(p, *d), expected[seed]):
            np.testing.assert_array_equal(got, expected_one)
        for got, expected_one in zip(passes(p, *d, outs), expected[seed]):
            np.testing.assert_array_equal(got, expected_one)


LAUNCHES = [  # per algorithm, what each pass launches on a CPU device with clconv's CPU GEMM kernel
    (Case("im2col_split_k", 4, 4, 17, 19, 6, 3, 3, padding=1, groups=2), "im2col",
     (["im2col", "gemm_cpu", "cnhw_to_nchw"], ["nchw_to_cnhw", "pack_a_transposed", "gemm_cpu", "col2im"],
      ["im2col", "nchw_to_cnhw", "gemm_cpu", "sum_partials"])),
    (Case("depthwise", 3, 6, 40, 33, 12, 3, 3, stride=2, padding=1, groups=6), "direct",
     (["direct"], ["direct_input"], ["direct_weight", "sum_partials"])),
    (Case("winograd", 2, 6, 13, 11, 4, 3, 3, padding=1, groups=2), "winograd",
     (["winograd_filter", "winograd_input", "gemm_cpu", "winograd_output"],
      ["winograd_filter", "winograd_input", "gemm_cpu", "winograd_output"],
      ["winograd_input", "winograd_grad_output", "gemm_cpu", "winograd_grad_filter"])),
    # F(2, 7) along the filter's row: the same four launches a pass as the 2-D forms
    (Case("winograd_1x7", 2, 4, 5, 13, 6, 1, 7, padding=(0, 3), groups=2), "winograd",
     (["winograd_filter", "winograd_input", "gemm_cpu", "winograd_output"],
      ["winograd_filter", "winograd_input", "gemm_cpu", "winograd_output"],
      ["winograd_input", "winograd_grad_output", "gemm_cpu", "winograd_grad_filter"])),
    (Case("fft", 2, 4, 9, 7, 6, 3, 3, padding=1, groups=2), "fft",
     (["fft_filter", "fft_image", "gemm_cpu", "fft_output"], ["fft_filter", "fft_image", "gemm_cpu", "fft_output"],
      ["fft_image", "fft_image", "gemm_cpu", "fft_output"])),
    (Case("fc", 5, 8, 3, 2, 12, 3, 2, groups=4), "fc", (["fill_bias", "gemm_cpu"], ["gemm_cpu"], ["gemm_cpu"])),
    # 91 positions per image: grad-weight sums the images in K blocks, one launch
    (Case("pointwise", 5, 6, 13, 7, 9, 1, 1, groups=3), "1x1",
     (["fill_bias", "gemm_cpu"], ["pack_a_transposed", "gemm_cpu"], ["gemm_cpu"])),
    # 899 positions per image: per-image partial sums, then their ordered sum
    (Case("pointwise_large_maps", 3, 4, 29, 31, 6, 1, 1, groups=2), "1x1",
     (["fill_bias", "gemm_cpu"], ["pack_a_transposed", "gemm_cpu"], ["gemm_cpu", "sum_partials"])),
    # 256 channels and filters over 8x8 maps: forward and grad-input pack B in panels first, grad-weight
    # the input transposed into them
    (Case("pointwise_b_in_panels", 1, 256, 8, 8, 256, 1, 1), "1x1",
     (["fill_bias", "pack_b_panels", "gemm_cpu"], ["pack_a_transposed", "pack_b_panels", "gemm_cpu"],
      ["pack_bt_panels", "gemm_cpu"])),
]


def _assert_launches(p, launches):
    """Plan ``p``'s launches per pass, once each pass has run, are ``launches`` (kernel kinds), and
    explain() counts and names them."""
    for pass_name, want in zip(("forward", "backward_input", "backward_weight"), launches):
        launched = p.launches(pass_name)
        assert [kernel_kind(name) for name in launched] == want, pass_name
        assert p.explain().record(pass_name).launches == tuple(launched), pass_name


@pytest.mark.parametrize("case,algorithm,launches", LAUNCHES, ids=lambda v: getattr(v, "name", None))
def test_launches_per_pass(case, algorithm, launches, queue):
    """Every algorithm's launches per pass, counted and named by the plan and shown by explain():
    a new launch in a pass is a change this table must be told of. The forward has a bias."""
    if queue.device.type & cl.device_type.GPU:
        pytest.skip("the table is for CPU devices (GPU kernels and split-K launch differently)")
    x, w, b, dy = (cla.to_device(queue, a) for a in case.data())
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm=algorithm, gemm="cpu")
    assert all(r.launches is None for r in p.explain().records)
    p.forward(x, w, b), p.backward_input(w, dy), p.backward_weight(x, dy)
    _assert_launches(p, launches)


GPU_LAUNCHES = [  # per algorithm, what each pass launches in a plan made for a GPU (GPU_UNITS), clconv's GPU GEMM
    # 2 channels a group: forward and grad-weight read the input in place (no im2col); each group's
    # forward over every image into Y in one launch, the bias filled first; grad-weight in split-K slices
    (Case("im2col_implicit", 4, 4, 17, 19, 6, 3, 3, padding=1, groups=2), "im2col",
     (["fill_bias", "gemm_gpu"], ["gemm_gpu", "col2im"], ["gemm_gpu", "sum_partials"])),
    # 8 channels, little work (GPU_IMPLICIT_FLOP_PER_UNIT): forward and grad-weight read the input in
    # place too; grad_output read in place by grad-input's GEMM, copied for grad-weight's
    (Case("im2col_c8", 3, 8, 11, 9, 6, 3, 3, stride=2, padding=1), "im2col",
     (["fill_bias", "gemm_gpu"], ["gemm_gpu", "col2im"], ["nchw_to_cnhw", "gemm_gpu"])),
    # 64 channels, 71 MFLOP a pass (the rule's 64 and 19 on GPU_UNITS' 16): col written;
    # grad-weight in split-K slices, summed in order
    (Case("im2col_col", 4, 64, 19, 17, 48, 3, 3, padding=1), "im2col",
     (["im2col", "fill_bias", "gemm_gpu"], ["gemm_gpu", "col2im"],
      ["im2col", "nchw_to_cnhw", "gemm_gpu", "sum_partials"])),
    (Case("depthwise", 3, 6, 40, 33, 12, 3, 3, stride=2, padding=1, groups=6), "direct",
     (["direct_forward"], ["direct_input"], ["direct_weight_partial", "sum_partials"])),
    (Case("winograd", 2, 6, 13, 11, 4, 3, 3, padding=1, groups=2), "winograd",
     (["winograd_filter", "winograd_input", "gemm_gpu", "winograd_output"],
      ["winograd_filter", "winograd_input", "gemm_gpu", "winograd_output"],
      ["winograd_input", "winograd_grad_output", "gemm_gpu", "winograd_grad_filter"])),
    (Case("winograd_7x1", 2, 4, 13, 5, 6, 7, 1, padding=(3, 0), groups=2), "winograd",
     (["winograd_filter", "winograd_input", "gemm_gpu", "winograd_output"],
      ["winograd_filter", "winograd_input", "gemm_gpu", "winograd_output"],
      ["winograd_input", "winograd_grad_output", "gemm_gpu", "winograd_grad_filter"])),
    (Case("fft", 2, 4, 9, 7, 6, 3, 3, padding=1, groups=2), "fft",
     (["fft_filter", "fft_image", "gemm_gpu", "fft_output"], ["fft_filter", "fft_image", "gemm_gpu", "fft_output"],
      ["fft_image", "fft_image", "gemm_gpu", "fft_output"])),
    (Case("fc", 5, 8, 3, 2, 12, 3, 2, groups=4), "fc", (["fill_bias", "gemm_gpu"], ["gemm_gpu"], ["gemm_gpu"])),
    # 91 positions per image: every pass one GEMM over all images (folded, or K blocks)
    (Case("pointwise", 5, 6, 13, 7, 9, 1, 1, groups=3), "1x1", (["fill_bias", "gemm_gpu"], ["gemm_gpu"], ["gemm_gpu"])),
    # 899 positions per image: grad-weight in slices of the images, summed in order
    (Case("pointwise_large_maps", 3, 4, 29, 31, 6, 1, 1, groups=2), "1x1",
     (["fill_bias", "gemm_gpu"], ["gemm_gpu"], ["gemm_gpu", "sum_partials"])),
]
# The compute units of the GPU the table's plans are made for (stand_in_gpu), whatever device runs
# them (on a real GPU too, whose own would change the split-K counts, and with them some passes'
# partial sums)
GPU_UNITS = 16


@pytest.mark.gpu_form
@pytest.mark.parametrize("case,algorithm,launches", GPU_LAUNCHES, ids=lambda v: getattr(v, "name", None))
def test_gpu_launches_per_pass(case, algorithm, launches, queue):
    """The same table for plans made for a GPU (clconv's GPU GEMM kernel and the algorithms' GPU
    forms), counted and shown by explain(), the results checked against the reference."""
    opts = case.options
    hx, hw, hb, hdy = case.data()
    x, w, b, dy = (cla.to_device(queue, a) for a in (hx, hw, hb, hdy))
    p = clconv.Plan(clconv.conv_geometry(case.input_shape, case.weight_shape, **opts), np.float32,
                    stand_in_gpu(queue, GPU_UNITS), algorithm=algorithm, gemm="gpu", selfcheck=False)
    results = (p.forward(x, w, b, queue=queue), p.backward_input(w, dy, queue=queue),
               p.backward_weight(x, dy, queue=queue))
    _assert_launches(p, launches)
    assert_close(results[0].get(), reference.conv2d(hx, hw, hb, **opts), np.float32, "forward")
    assert_close(results[1].get(), reference.conv2d_input(hx.shape, hw, hdy, **opts), np.float32, "grad-input")
    assert_close(results[2].get(), reference.conv2d_weight(hx, hw.shape, hdy, **opts), np.float32, "grad-weight")
