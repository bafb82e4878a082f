"""Every public pass against the float64 NumPy reference."""
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import reference
from helpers import CASES, assert_close, assert_passes_match


def _all_passes(case, dtype, run):
    """Run the four passes through ``run(fn, *args)`` and compare each with the reference."""
    x, w, b, dy = case.data(dtype)
    opts = case.options
    assert_close(run(clconv.conv2d, x, w, b, **opts), reference.conv2d(x, w, b, **opts), dtype, "forward")
    assert_close(run(clconv.conv2d, x, w, None, **opts), reference.conv2d(x, w, **opts), dtype, "forward no bias")
    assert_close(run(clconv.conv2d_input, x.shape, w, dy, **opts), reference.conv2d_input(x.shape, w, dy, **opts),
                 dtype, "grad-input")
    assert_close(run(clconv.conv2d_weight, x, w.shape, dy, **opts),
                 reference.conv2d_weight(x, w.shape, dy, **opts), dtype, "grad-weight")
    assert_close(run(clconv.conv2d_bias, dy), reference.conv2d_bias(dy), dtype, "grad-bias")


def _numpy_run(fn, *args, **kw):
    result = fn(*args, **kw)
    assert isinstance(result, np.ndarray)
    return result


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_numpy_in_numpy_out(case):
    _all_passes(case, np.float32, _numpy_run)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_device_arrays(case, queue):
    def run(fn, *args, **kw):
        dev = [cla.to_device(queue, a) if isinstance(a, np.ndarray) else a for a in args]
        result = fn(*dev, **kw)
        assert isinstance(result, cla.Array) and result.queue is queue
        return result.get()
    _all_passes(case, np.float32, run)


@pytest.mark.parametrize("case", [c for c in CASES if c.name in {"g3_k3x2_s3x2_asym", "depthwise_x2_s2_same",
                                                                 "fc_mode_g2", "k1x1_g2"}], ids=repr)
def test_float64(case, queue):
    if "cl_khr_fp64" not in queue.device.extensions:
        pytest.skip(f"{queue.device.name} has no cl_khr_fp64")
    _all_passes(case, np.float64, _numpy_run)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_float16(case, queue):
    """float16 storage runs on every device (no cl_khr_fp16 needed): half in, half out."""
    def run(fn, *args, **kw):
        result = fn(*args, **kw)
        assert result.dtype == np.float16
        return result
    _all_passes(case, np.float16, run)


@pytest.mark.parametrize("algorithm,case", [("im2col", "fc_mode_g2"), ("direct", "fc_mode_g2"), ("fc", "fc_mode_g2"),
                                            ("1x1", "k1x1_g2")])
def test_float16_every_algorithm(algorithm, case, queue):
    case = next(c for c in CASES if c.name == case)
    x, w, b, dy = case.data(np.float16)
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, dtype=np.float16, queue=queue, algorithm=algorithm)
    assert p.explain().header["math"] == "float32 (stored float16)"
    assert all(r.math == "float32 (stored float16)" for r in p.explain().records)
    assert_passes_match(p, x, w, b, dy, opts, np.float16)


def test_float16_sums_in_float32(queue):
    """3000 products of 1 x 0.33325 (1/3 in half): summed in half, each addition past 512
    rounds 0.33 to 0.5 (error > 10 %); summed in float32 and rounded once, 999.75 -> 1000."""
    x = np.ones((1, 3000, 1, 1), np.float16)
    w = np.full((2, 3000, 1, 1), 1 / 3, np.float16)
    for algorithm in ("1x1", "im2col", "fc"):
        y = clconv.conv2d(x, w, algorithm=algorithm)
        expected = reference.conv2d(x, w)
        assert abs(float(expected[0, 0, 0, 0]) - 999.755859375) < 1e-9
        np.testing.assert_array_equal(y, np.float16(expected))
    dw = clconv.conv2d_weight(np.full((3000, 1, 1, 1), 1 / 3, np.float16), (1, 1, 1, 1),
                              np.ones((3000, 1, 1, 1), np.float16))
    np.testing.assert_array_equal(dw, np.float16(999.755859375))


@pytest.mark.parametrize("case", [c for c in CASES if c.options["groups"] > 1], ids=repr)
def test_grouped_equals_concatenated_groups(case):
    x, w, b, dy = case.data()
    G = case.options["groups"]
    opts = dict(case.options, groups=1)
    Cg, Kg = x.shape[1] // G, w.shape[0] // G
    parts = [clconv.conv2d(x[:, g * Cg:(g + 1) * Cg], w[g * Kg:(g + 1) * Kg], b[g * Kg:(g + 1) * Kg], **opts)
             for g in range(G)]
    grouped = clconv.conv2d(x, w, b, **case.options)
    np.testing.assert_allclose(grouped, np.concatenate(parts, axis=1), rtol=1e-5, atol=1e-5)


def _carve(queue, arrays, offsets, fill=12345.0):
    """Place each array inside one shared buffer at the given element offsets, sentinels around."""
    dtype = arrays[0].dtype
    size = max(o + a.size for o, a in zip(offsets, arrays)) + 131
    base = cla.to_device(queue, np.full(size, fill, dtype))
    views = []
    for o, a in zip(offsets, arrays):
        v = base[o:o + a.size].reshape(a.shape)
        v.set(np.ascontiguousarray(a))
        views.append(v)
    return base, views


@pytest.mark.parametrize("first_offset,dtype", [(0, np.float32), (13, np.float32), (4099, np.float32),
                                                (13, np.float16)], ids=["0", "13", "4099", "13-float16"])
@pytest.mark.parametrize("case", [c for c in CASES if c.name in {"g3_k3x2_s3x2_asym", "depthwise_x2_s2_same",
                                                                 "fc_mode", "k1x1_g2", "g1_k3x3_s1_p1"}], ids=repr)
def test_views_at_odd_offsets_in_one_buffer(case, first_offset, dtype, queue):
    """All operands and outputs in one buffer, the first at ``first_offset``, each followed by at least
    127 sentinels (and preceded by them, but for offset 0); after every pass the sentinels are unchanged."""
    x, w, b, dy = case.data(dtype)
    opts = case.options
    y_ref = reference.conv2d(x, w, b, **opts)
    shapes = [x, w, b, dy, np.zeros(y_ref.shape, dtype), np.zeros(x.shape, dtype),
              np.zeros(w.shape, dtype), np.zeros(b.shape, dtype)]
    offsets, pos = [], first_offset
    for a in shapes:
        offsets.append(pos)
        pos += a.size + 127 + (pos % 7)
    base, (vx, vw, vb, vdy, vy, vdx, vdw, vdb) = _carve(queue, shapes, offsets)
    before = base.get()
    assert clconv.conv2d(vx, vw, vb, out=vy, **opts) is vy
    assert clconv.conv2d_input(x.shape, vw, vdy, out=vdx, **opts) is vdx
    assert clconv.conv2d_weight(vx, w.shape, vdy, out=vdw, **opts) is vdw
    assert clconv.conv2d_bias(vdy, out=vdb) is vdb
    assert_close(vy.get(), y_ref, dtype, "forward")
    assert_close(vdx.get(), reference.conv2d_input(x.shape, w, dy, **opts), dtype, "grad-input")
    assert_close(vdw.get(), reference.conv2d_weight(x, w.shape, dy, **opts), dtype, "grad-weight")
    assert_close(vdb.get(), reference.conv2d_bias(dy), dtype, "grad-bias")
    after = base.get()
    written = np.zeros(after.size, bool)
    for o, a in zip(offsets[4:], shapes[4:]):
        written[o:o + a.size] = True
    np.testing.assert_array_equal(after[~written], before[~written])


@pytest.mark.parametrize("case", [c for c in CASES if c.name in {"g2_k3x3_s2_pad_pair", "k1x1_s3_pad1",
                                                                 "g3_same_s3"}], ids=repr)
def test_nan_filled_outputs_are_fully_overwritten(case, queue):
    x, w, b, dy = case.data()
    opts = case.options
    outs = {}
    for name, shape in [("y", reference.conv2d(x, w, **opts).shape), ("dx", x.shape), ("dw", w.shape),
                        ("db", b.shape)]:
        outs[name] = cla.empty(queue, shape, np.float32)
        outs[name].fill(np.nan)
    dev = {k: cla.to_device(queue, v) for k, v in dict(x=x, w=w, b=b, dy=dy).items()}
    clconv.conv2d(dev["x"], dev["w"], None, out=outs["y"], **opts)
    clconv.conv2d_input(x.shape, dev["w"], dev["dy"], out=outs["dx"], **opts)
    clconv.conv2d_weight(dev["x"], w.shape, dev["dy"], out=outs["dw"], **opts)
    clconv.conv2d_bias(dev["dy"], out=outs["db"])
    assert_close(outs["y"].get(), reference.conv2d(x, w, **opts), np.float32, "forward")
    assert_close(outs["dx"].get(), reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(outs["dw"].get(), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32, "grad-weight")
    assert_close(outs["db"].get(), reference.conv2d_bias(dy), np.float32, "grad-bias")


@pytest.mark.parametrize("case", [c for c in CASES if c.input_shape[0] == 3 and c.name in {
    "g2_k3x3_s2_pad_pair", "depthwise_x2_s2_same", "g3_same_s3"}], ids=repr)
def test_chunked_batch_matches_reference(case, queue):
    """A workspace limit of one image's workspace forces one chunk per image."""
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="im2col")
    one = clconv.plan((1, *x.shape[1:]), w.shape, **opts, queue=queue, algorithm="im2col").workspace_bytes
    small = clconv.plan(x.shape, w.shape, **opts, queue=queue, algorithm="im2col", workspace_limit=one)
    assert small.workspace_bytes < p.workspace_bytes
    assert all(r.chunks[0] == 3 for r in small.explain().records)
    assert_close(small.forward(x, w, b), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(small.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "dx")
    assert_close(small.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32, "dw")


def test_explicit_queue_and_second_queue(queue):
    """Arrays written through another queue: a call on this one waits for their writes (Intel's
    runtime showed a second queue stale contents after a blocking write, without the wait)."""
    case = CASES[1]
    x, w, b, dy = case.data()
    for _ in range(20):
        other = cl.CommandQueue(queue.context)
        dx, dw = cla.to_device(other, x), cla.to_device(other, w)
        y = clconv.conv2d(dx, dw, **case.options)
        assert y.queue is other
        y2 = clconv.conv2d(dx, dw, **case.options, queue=queue)
        assert y2.queue is queue
        np.testing.assert_array_equal(y.get(), y2.get())


def test_queueless_and_subclassed_arrays(queue):
    """An array without a queue and one of a pyopencl Array subclass: not the usual call's
    quick acceptance (clconv.validate.all_plain) but the full checks, and the same results."""
    class Sub(cla.Array):
        pass
    case = CASES[1]
    x, w, b, dy = case.data()
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue)
    xd = cla.to_device(queue, x).with_queue(None)
    ws = Sub(queue, w.shape, w.dtype, data=cla.to_device(queue, w).base_data)
    bd, dyd = cla.to_device(queue, b), cla.to_device(queue, dy)
    assert_close(p.forward(xd, ws, bd).get(), reference.conv2d(x, w, b, **case.options), np.float32, "forward")
    assert_close(p.backward_weight(xd, dyd).get(), reference.conv2d_weight(x, w.shape, dy, **case.options),
                 np.float32, "grad-weight")


def test_empty_batch_gives_empty_output_and_zero_gradients(queue):
    case = CASES[1]
    x, w, b, dy = case.data()
    x0, dy0 = x[:0], dy[:0]
    assert clconv.conv2d(x0, w, b, **case.options).shape == (0,) + dy.shape[1:]
    assert clconv.conv2d_input(x0.shape, w, dy0, **case.options).shape == x0.shape
    np.testing.assert_array_equal(clconv.conv2d_weight(x0, w.shape, dy0, **case.options), np.zeros(w.shape))
    np.testing.assert_array_equal(clconv.conv2d_bias(dy0), np.zeros(b.shape))

