"""Images whose workspace exceeds the budget run in tiles of output rows (im2col) or in ranges
of tile rows (Winograd), every pass, against the float64 reference, the same bits on every run."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import rules
from clconv import reference
from clconv.algorithms import im2col, winograd
from helpers import Case, QueueAs, assert_close

TILED = [
    Case("tiles_k3_p1", 2, 3, 17, 13, 5, 3, 3, padding=1),
    Case("tiles_s2_asym_g2", 1, 4, 19, 11, 6, 3, 2, stride=2, padding=((2, 0), (1, 1)), groups=2),
    Case("tiles_d2_s3x1", 2, 2, 23, 9, 4, 3, 3, stride=(3, 1), padding=(2, 1), dilation=2),
    Case("tiles_k5_overpad", 1, 3, 13, 10, 3, 5, 4, padding=((4, 1), (0, 3))),
    Case("tiles_depthwise_s2", 2, 6, 21, 15, 6, 3, 3, stride=2, padding=1, groups=6),
    Case("tiles_k1_s2", 1, 5, 15, 9, 7, 1, 1, stride=2),
]

# Winograd's 3x3 and 5x5 at stride 1, 16 channels per group or more (so "auto" would take it)
WINOGRAD_TILED = [
    Case("winograd_k3_p1", 2, 16, 37, 13, 16, 3, 3, padding=1),
    Case("winograd_k5_asym_g2", 1, 32, 43, 11, 32, 5, 5, padding=((2, 0), (1, 3)), groups=2),
    Case("winograd_d2_k3", 2, 16, 47, 9, 18, 3, 3, padding=2, dilation=2),
    Case("winograd_k3_valid", 1, 17, 50, 7, 16, 3, 3),
    Case("winograd_1x7_p3", 2, 16, 37, 13, 16, 1, 7, padding=(0, 3)),
    Case("winograd_7x1_d2x3", 1, 16, 41, 9, 16, 7, 1, padding=(6, 1), dilation=(2, 3)),
]


def _row_bytes(p):
    g = p.geometry
    return g.C * g.kh * g.kw * g.OW * 4


@pytest.mark.parametrize("case", TILED, ids=repr)
@pytest.mark.parametrize("algorithm", ["im2col", "auto"])
@pytest.mark.parametrize("budget", ["rows", "columns"])
def test_one_image_in_tiles(case, algorithm, budget, queue):
    """Tiles of output rows (a budget of three rows' col), or of columns of one row (a budget
    below one row's col)."""
    x, w, b, dy = case.data()
    opts = case.options
    full = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="im2col")
    row = _row_bytes(full)
    limit = 3 * row if budget == "rows" else max(row // 3, 2 * row // full.geometry.OW)
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm=algorithm, workspace_limit=limit)
    if algorithm == "im2col" and budget == "rows":   # at most 3 rows (GPUs: split-K's partials take their share)
        pieces = [r.pieces for r in p.explain().records]
        assert all(unit == "output rows" and 1 <= rows <= 3 for _, rows, unit in pieces), p.explain()
    elif algorithm == "im2col":
        pieces = [r.pieces for r in p.explain().records]
        assert all(unit == "output columns" and 1 <= c < full.geometry.OW for _, c, unit in pieces), p.explain()
    assert p.workspace_bytes <= limit
    _check_passes(p, case, queue)


# over 512 output positions: enough for split-K slices, which CPUs' tiles do without
CACHE_TILED = [Case("cache_k3_p1", 1, 3, 37, 29, 4, 3, 3, padding=1),
               Case("cache_s2_asym_g2", 2, 4, 47, 45, 6, 3, 2, stride=2, padding=((2, 0), (1, 1)), groups=2)]


@pytest.mark.parametrize("case", CACHE_TILED, ids=repr)
def test_cpu_col_above_the_cache_budget_in_tiles(case, queue, monkeypatch):
    """On CPUs an image whose col is above rules.IM2COL_CPU_COL_BYTES (here three rows' col) runs in
    tiles of at most that much col whatever the workspace limit, grad-weight's tiles each added
    by their own GEMM (no partial sums); a GPU's plan of the same layer keeps whole images."""
    if queue.device.type & cl.device_type.GPU:
        pytest.skip("a CPU rule")
    x, w = case.data()[:2]
    row = _row_bytes(clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="im2col"))
    monkeypatch.setattr(rules, "IM2COL_CPU_COL_BYTES", 3 * row)
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="im2col")
    records = p.explain().records
    assert all(r.pieces[2] == "output rows" and 1 <= r.pieces[1] <= 3 and "im2col-cpu-col-bytes" in r.rules
               for r in records), p.explain()
    assert p.workspace_bytes <= 3 * row
    _check_passes(p, case, queue)
    assert "sum_partials" not in " ".join(p.launches("backward_weight")), p.launches("backward_weight")
    gpu = clconv.Plan(p.geometry, np.float32, QueueAs(queue, type=cl.device_type.GPU), algorithm="im2col",
                      selfcheck=False)
    assert not any(r.pieces for r in gpu.explain().records), gpu.explain()


@pytest.mark.parametrize("case", WINOGRAD_TILED, ids=repr)
def test_winograd_in_ranges_of_tile_rows(case, queue):
    """Half the smallest pass's Winograd workspace for one image: every pass runs each
    image in pieces of its tile rows."""
    x, w = case.data()[:2]
    one = clconv.plan((1,) + x.shape[1:], w.shape, **case.options, queue=queue, algorithm="winograd")
    limit = min(r.workspace for r in one.explain().records) // 2
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="winograd", workspace_limit=limit)
    records = p.explain().records   # (more than one piece: fewer tile rows than the image's)
    assert all(r.pieces[2] == "tile rows" and r.pieces[0] > 1 and "workspace" in r.rules for r in records), p.explain()
    assert p.workspace_bytes <= limit
    _check_passes(p, case, queue)


@pytest.mark.parametrize("case", WINOGRAD_TILED[:2], ids=repr)
def test_cpu_winograd_above_the_cache_budget_in_pieces(case, queue, monkeypatch):
    """On CPUs forward and grad-input of an image whose Winograd workspace is above
    rules.WINOGRAD_CPU_PIECE_BYTES (here half the smallest pass's) run in pieces of its tile rows
    whatever the workspace limit, grad-weight on whole images; a budget below one tile row leaves
    whole images (no error); a GPU's plan keeps whole images."""
    if queue.device.type & cl.device_type.GPU:
        pytest.skip("a CPU rule")
    x, w = case.data()[:2]
    one = clconv.plan((1,) + x.shape[1:], w.shape, **case.options, queue=queue, algorithm="winograd")
    cap = min(r.workspace for r in one.explain().records) // 2
    monkeypatch.setattr(rules, "WINOGRAD_CPU_PIECE_BYTES", cap)
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="winograd")
    forward, grad_input, grad_weight = p.explain().records
    for record in (forward, grad_input):
        assert record.pieces[2] == "tile rows" and "winograd-cpu-pieces" in record.rules, record
        u = 36 * w.shape[0] * w.shape[1] * 4   # the filters' transform, which the pieces share
        assert record.workspace <= cap + u, record
    assert not grad_weight.pieces, grad_weight
    _check_passes(p, case, queue)
    monkeypatch.setattr(rules, "WINOGRAD_CPU_PIECE_BYTES", 1)
    assert not any(r.pieces for r in clconv.plan(x.shape, w.shape, **case.options, queue=queue,
                                                 algorithm="winograd").explain().records)
    monkeypatch.setattr(rules, "WINOGRAD_CPU_PIECE_BYTES", cap)
    gpu = clconv.Plan(p.geometry, np.float32, QueueAs(queue, type=cl.device_type.GPU), algorithm="winograd",
                      selfcheck=False)
    assert not any(r.pieces for r in gpu.explain().records), gpu.explain()


def _check_passes(p, case, queue):
    """Every pass of plan ``p`` and the fused forward against the reference, the same bits twice."""
    x, w, b, dy = case.data()
    opts = case.options
    xd, wd, bd, dyd = (cla.to_device(queue, a) for a in (x, w, b, dy))
    runs = [(p.forward(xd, wd, bd).get(), p.forward(xd, wd, bd, relu=True).get(), p.backward_input(wd, dyd).get(),
             p.backward_weight(xd, dyd).get()) for _ in range(2)]
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)   # the tiles are summed in a fixed order
    y, yr, dx, dw = runs[0]
    assert_close(y, reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(yr, np.maximum(reference.conv2d(x, w, b, **opts), 0), np.float32, "forward + ReLU")
    assert_close(dx, reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(dw, reference.conv2d_weight(x, w.shape, dy, **opts), np.float32, "grad-weight")


def _tiled(name):
    return next(c for c in TILED if c.name == name)


# (case, budget), few: each geometry builds its own GPU GEMM kernels, slow to build on CPU runtimes
GPU_FORMS = [(Case("layouts_c6_p1", 3, 6, 9, 7, 5, 3, 3, padding=1), "images"),   # 63 positions per image
             (_tiled("tiles_d2_s3x1"), "images"),                                  # 56: four-wide reads
             (_tiled("tiles_k1_s2"), "columns"), (_tiled("tiles_depthwise_s2"), "columns"),
             (_tiled("tiles_s2_asym_g2"), "rows"), (_tiled("tiles_k5_overpad"), "rows")]


@pytest.mark.gpu_form
@pytest.mark.parametrize("case,budget", GPU_FORMS, ids=lambda v: v if isinstance(v, str) else repr(v))
def test_gpu_forms_in_tiles(case, budget, queue):
    """The GPU forms of im2col's kernels on any device, in plans made for a GPU: col2im with its
    taps and strides built in (tiles: a negative top or left padding), grad-input's GEMM reading
    grad_output in place; with whole images, every pass (the layout kernels too), against the
    reference."""
    x, w, b, dy = case.data()
    opts = case.options
    gpu = QueueAs(queue, type=cl.device_type.GPU)
    full = clconv.Plan(clconv.conv_geometry(x.shape, w.shape, **opts), np.float32, gpu, algorithm="im2col",
                       selfcheck=False)
    row = _row_bytes(full)
    limit = {"images": None, "rows": 3 * row, "columns": max(row // 3, 2 * row // full.geometry.OW)}[budget]
    p = clconv.Plan(full.geometry, np.float32, gpu, algorithm="im2col", workspace_limit=limit, selfcheck=False)
    records = p.explain().records
    assert set(p.algorithms.values()) == {"im2col"} and (limit is None) == (not any(r.pieces for r in records))
    assert (limit is None) == ("grad_output in place" in p.explain().record("backward_input").notes)   # (folded)
    assert_close(p.backward_input(w, dy, queue=queue), reference.conv2d_input(x.shape, w, dy, **opts), np.float32,
                 "grad-input")
    if limit is None:   # (tiles: grad-input's col2im; the H200's run of this module covers the rest)
        assert_close(p.forward(x, w, b, queue=queue), reference.conv2d(x, w, b, **opts), np.float32, "forward")
        assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **opts),
                     np.float32, "grad-weight")


def test_auto_runs_what_no_whole_image_fits(queue, monkeypatch):
    """A 3x3 stride-1 layer Winograd would take: with a budget below one image's workspace for
    every algorithm, "auto" still takes Winograd, in pieces of the image's tile rows (on GPUs
    without the Winograd work rule, which this layer's 3.9 MFLOP is below: its own test)."""
    monkeypatch.setattr(rules, "WINOGRAD_GPU_MIN_FLOP_PER_UNIT", 0)
    case = Case("wide", 1, 16, 30, 28, 16, 3, 3, padding=1)
    x, w, b, dy = case.data()
    limit = 5 * 16 * 9 * 28 * 4
    p = clconv.plan(x.shape, w.shape, padding=1, queue=queue, workspace_limit=limit)
    assert set(p.algorithms.values()) == {"winograd"} and all(r.pieces for r in p.explain().records), p.explain()
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, padding=1), np.float32, "forward")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, padding=1), np.float32, "grad-input")
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, padding=1), np.float32,
                 "grad-weight")


def test_a_budget_below_one_output_position_is_refused(queue):
    with pytest.raises(ValueError, match=r"one output position of input \[1, 4, 9, 9\] with weight \[4, 4, 3, 3\] "
                                         r"needs 144 workspace bytes, above the limit of 100 bytes"):
        clconv.plan((1, 4, 9, 9), (4, 4, 3, 3), padding=1, queue=queue, algorithm="im2col", workspace_limit=100)
