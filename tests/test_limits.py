"""Limits made cheap: 64-bit index kernels, forced chunking, allocation failures."""
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import programs, reference
from clconv.plan import ALGORITHMS
from helpers import CASES, QueueAs, assert_close

LIMIT_CASES = [c for c in CASES if c.name in {"g2_k3x3_s2_pad_pair", "depthwise_x2_s2_same", "fc_mode_g2",
                                              "k1x1_g2", "g3_same_s3"}]


@pytest.mark.parametrize("case", LIMIT_CASES, ids=repr)
def test_64_bit_index_kernels(case, queue, monkeypatch):
    """With the 31-bit limit lowered to 10 elements every kernel is built with long indices."""
    monkeypatch.setattr(programs, "INT32_MAX", 10)
    assert programs.index_type(11) == "long"
    x, w, b, dy = case.data()
    opts = case.options
    for name, cls in ALGORITHMS.items():
        g = clconv.conv_geometry(x.shape, w.shape, **opts)
        if not cls.applies(g)[0]:
            continue
        p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm=name)
        assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **opts), np.float32, f"{name} forward")
        assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), np.float32,
                     f"{name} grad-input")
        assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32,
                     f"{name} grad-weight")
    assert_close(clconv.conv2d_bias(dy), reference.conv2d_bias(dy), np.float32, "grad-bias")


def test_small_max_allocation_forces_chunks_with_the_same_result(queue, monkeypatch):
    """A device whose largest allocation holds about two images' workspace (and the whole input
    and output): chunked, same answer."""
    case = next(c for c in CASES if c.name == "g3_same_s3")
    x, w, b, dy = case.data()
    full = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm="im2col")
    per_image = clconv.plan((1, *x.shape[1:]), w.shape, **case.options, queue=queue, algorithm="im2col").workspace_bytes

    small = clconv.Plan(full.geometry, np.float32, QueueAs(queue, max_mem_alloc_size=4 * per_image),
                        algorithm="im2col", selfcheck=False)   # workspace limit: half of that
    assert x.nbytes <= 4 * per_image and small.workspace_bytes <= 2 * per_image < full.workspace_bytes
    assert all(r.chunks[0] == 2 for r in small.explain().records)
    for got, want in [(small.forward(x, w, b, queue=queue), full.forward(x, w, b)),
                      (small.backward_input(w, dy, queue=queue), full.backward_input(w, dy)),
                      (small.backward_weight(x, dy, queue=queue), full.backward_weight(x, dy))]:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_one_image_above_the_limit_is_refused_before_enqueueing(queue):
    # one output position's column, 8 x 3 x 3 floats, is above the budget: no tile fits
    with pytest.raises(ValueError, match="needs 288 workspace bytes, above the limit of 200 bytes"):
        clconv.plan((2, 8, 30, 30), (8, 8, 3, 3), padding=1, queue=queue, algorithm="im2col", workspace_limit=200)


def test_allocation_failure_is_reraised_with_context(queue, monkeypatch):
    case = CASES[1]
    x, w, b, dy = (cla.to_device(queue, a) for a in case.data())
    out = cla.empty(queue, dy.shape, np.float32)
    # explicit im2col, whose forward has a workspace on every engine (clconv's GPU kernel reads a
    # few-channel im2col in place); its known-answer check run first, while memory is there
    opts = dict(case.options, algorithm="im2col", gemm="clblast")
    clconv.conv2d(x, w, **opts, out=out)
    clconv.free_memory()

    def no_memory(*args, **kw):
        raise cl.MemoryError("clCreateBuffer", cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, "mocked")
    monkeypatch.setattr(clconv.memory, "pool", lambda queue: no_memory)   # the driver refuses every allocation
    with pytest.raises(clconv.ClconvError, match=r"forward of input \[3, 4, 9, 7\] with weight \[6, 2, 3, 3\]"):
        clconv.conv2d(x, w, **opts, out=out)
