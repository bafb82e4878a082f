"""clconv.graph(): calls recorded once, replayed on the same arrays with new data."""
import gc

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import reference
from helpers import REPLAYED, Case, QueueAs, assert_close


def _device(queue, arrays):
    return [cla.to_device(queue, a) for a in arrays]


def _replay_matches(g, inputs, new, results, run):
    """Write ``new`` (host arrays) into the device ``inputs``, fill ``results`` with NaN, replay
    ``g``: the results are bit for bit what ``run`` gives on fresh device copies of ``new``."""
    for dev, host in zip(inputs, new):
        dev.set(host)
    for r in results:
        r.fill(np.nan)
    g.replay()
    for got, want in zip(results, run(*_device(inputs[0].queue, new))):
        np.testing.assert_array_equal(got.get(), want.get())


def _calls(x, w, b, dy, opts, algorithm):
    """Every pass of one layer through the functional API: [output, grad_input, grad_weight, grad_bias]."""
    return [clconv.conv2d(x, w, b, **opts, algorithm=algorithm),
            clconv.conv2d_input(x.shape, w, dy, **opts, algorithm=algorithm),
            clconv.conv2d_weight(x, w.shape, dy, **opts, algorithm=algorithm),
            clconv.conv2d_bias(dy)]


@pytest.mark.parametrize("warm", [False, True], ids=["first_calls", "fast_calls"])
@pytest.mark.parametrize("case,algorithm", REPLAYED, ids=lambda v: getattr(v, "name", v))
def test_replay_recomputes_from_new_data_bit_for_bit(case, algorithm, warm, queue, monkeypatch):
    """A graph of a layer's four passes, replayed after new data is written into its inputs,
    gives bit for bit what the same calls give on that data, and matches the reference. Recorded
    on the plans' first calls (full runs), or on calls that take the fast path."""
    monkeypatch.setenv("CLCONV_GEMM", "clconv")   # CLBlast GEMMs cannot be replayed
    opts = case.options
    # a layout of its own (odd batch) per parametrisation: the first calls below are the plan's first
    shape = (case.input_shape[0] + 2 * warm + 1,) + case.input_shape[1:]
    layer = Case("graph", *shape, case.weight_shape[0], *case.weight_shape[2:], **opts)
    x, w, b, dy = _device(queue, layer.data(seed=1))
    if warm:
        for _ in range(3):
            _calls(x, w, b, dy, opts, algorithm)
    with clconv.graph() as g:
        results = _calls(x, w, b, dy, opts, algorithm)
    plans = clconv.planner.plan_for_call(x.shape, w.shape, opts["stride"], opts["padding"], opts["dilation"],
                                         opts["groups"], x.dtype, queue, (x,), algorithm, "single", "auto")
    assert g.names == [*plans.launches("forward"), *plans.launches("backward_input"),
                       *plans.launches("backward_weight"), "bias_grad"]
    new = layer.data(seed=2)
    _replay_matches(g, (x, w, b, dy), new, results, lambda *fresh: _calls(*fresh, opts, algorithm))
    hx, hw, hb, hdy = new
    assert_close(results[0].get(), reference.conv2d(hx, hw, hb, **opts), np.float32, "forward")
    assert_close(results[1].get(), reference.conv2d_input(hx.shape, hw, hdy, **opts), np.float32, "grad-input")
    assert_close(results[2].get(), reference.conv2d_weight(hx, hw.shape, hdy, **opts), np.float32, "grad-weight")
    assert_close(results[3].get(), reference.conv2d_bias(hdy), np.float32, "grad-bias")


@pytest.mark.gpu_form
@pytest.mark.parametrize("case,algorithm", REPLAYED, ids=lambda v: getattr(v, "name", v))
def test_gpu_forms_replay_bit_for_bit(case, algorithm, queue):
    """Plans made for a GPU (clconv's GPU GEMM kernel and every algorithm's GPU forms) recorded on
    first calls and replayed on new data: bit for bit what the same plan's calls give."""
    gpu = QueueAs(queue, type=cl.device_type.GPU, max_compute_units=16)
    opts = case.options
    p = clconv.Plan(clconv.conv_geometry(case.input_shape, case.weight_shape, **opts), np.float32, gpu,
                    algorithm=algorithm, gemm="gpu", selfcheck=False)

    def passes(x, w, b, dy):
        return [p.forward(x, w, b, queue=queue), p.backward_input(w, dy, queue=queue),
                p.backward_weight(x, dy, queue=queue)]
    x, w, b, dy = _device(queue, case.data(seed=1))
    with clconv.graph() as g:
        results = passes(x, w, b, dy)
    assert ("direct_forward" if algorithm == "direct" else "gemm_gpu") in g.names   # the GPU forms
    new = case.data(seed=2)
    _replay_matches(g, (x, w, b, dy), new, results, passes)
    hx, hw, hb, hdy = new
    assert_close(results[0].get(), reference.conv2d(hx, hw, hb, **opts), np.float32, "forward")


def test_a_chain_of_layers_and_the_pool_between_replays(queue, monkeypatch):
    """Two layers chained, the same plan called twice on other arrays in the graph, and other
    calls between replays (whose results and workspaces come from the pool the graph's came
    from): each replay reads and writes the graph's own arrays."""
    monkeypatch.setenv("CLCONV_GEMM", "clconv")
    layer = Case("chain", 2, 6, 11, 9, 8, 3, 3, padding=1, groups=2)
    x, w, b, _ = _device(queue, layer.data(seed=1))
    x2 = cla.to_device(queue, layer.data(seed=3)[0])
    w2 = cla.to_device(queue, np.random.default_rng(4).standard_normal((5, 8, 1, 1)).astype(np.float32))
    with clconv.graph() as g:
        y = clconv.conv2d(x, w, b, padding=1, groups=2, algorithm="im2col")
        z = clconv.conv2d(y, w2, relu=True)
        y2 = clconv.conv2d(x2, w, b, padding=1, groups=2, algorithm="im2col")   # the same plan, other arrays
    for seed in (5, 6):
        hx, hx2 = (np.random.default_rng(seed + i).standard_normal(layer.input_shape).astype(np.float32)
                   for i in (0, 10))
        x.set(hx)
        x2.set(hx2)
        for _ in range(3):   # other calls of the same plans and pool, on other arrays
            clconv.conv2d(cla.to_device(queue, hx2), w, b, padding=1, groups=2, algorithm="im2col")
            clconv.conv2d(cla.to_device(queue, hx), w, padding=1, groups=2, algorithm="direct")
        g.replay()
        hw, hb = w.get(), b.get()
        want_y = reference.conv2d(hx, hw, hb, padding=1, groups=2)
        assert_close(y.get(), want_y, np.float32, "first layer")
        assert_close(z.get(), np.maximum(reference.conv2d(want_y, w2.get()), 0), np.float32, "second layer")
        assert_close(y2.get(), reference.conv2d(hx2, hw, hb, padding=1, groups=2), np.float32, "same plan again")


def test_the_graph_keeps_its_workspaces_from_the_pool(queue, monkeypatch):
    """A workspace taken from the queue's pool during recording stays the graph's: blocks of its
    size taken from the pool afterwards are other blocks, which a replay leaves alone."""
    monkeypatch.setenv("CLCONV_GEMM", "clconv")
    layer = Case("workspace", 2, 4, 9, 7, 6, 3, 3, padding=1)
    x, w, _, dy = _device(queue, layer.data())
    p = clconv.plan(x.shape, w.shape, padding=1, queue=queue, algorithm="im2col")
    # grad-input: col2im's col is a workspace on every device (on a GPU this 4-channel forward
    # reads its input in place and has none)
    nbytes = p._runs["backward_input"][2]
    assert nbytes > 0
    with clconv.graph() as g:
        dx = p.backward_input(w, dy)
    taken = [cla.Array(queue, nbytes // 4, np.float32, data=clconv.memory.allocate(queue, nbytes)) for _ in range(4)]
    for t in taken:
        t.fill(-7.0)
    g.replay()
    assert_close(dx.get(), reference.conv2d_input(x.shape, w.get(), dy.get(), padding=1), np.float32, "replayed")
    for t in taken:
        np.testing.assert_array_equal(t.get(), np.full(nbytes // 4, -7.0, np.float32))


def test_a_module_training_step_replays(queue, monkeypatch):
    """A module's zero_grad, forward (with the fused ReLU) and backward recorded: each replay on new
    data gives bit for bit what a twin module (same weights) computes with plain calls."""
    monkeypatch.setenv("CLCONV_GEMM", "clconv")
    conv, twin = (clconv.nn.Conv2d(4, 6, 3, padding=1, groups=2, queue=queue, seed=1, relu=True) for _ in range(2))
    rng = np.random.default_rng(7)
    x = cla.to_device(queue, rng.standard_normal((2, 4, 7, 5)).astype(np.float32))
    dy = cla.to_device(queue, rng.standard_normal((2, 6, 7, 5)).astype(np.float32))
    with clconv.graph() as g:
        conv.zero_grad()
        y = conv(x)
        gx = conv.backward(x, dy)
    for seed in (8, 9):
        rng = np.random.default_rng(seed)
        hx, hdy = rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(dy.shape).astype(np.float32)
        x.set(hx)
        dy.set(hdy)
        g.replay()
        twin.zero_grad()
        tx = cla.to_device(queue, hx)
        ty = twin(tx)
        tgx = twin.backward(tx, cla.to_device(queue, hdy))
        for got, want in ((y, ty), (gx, tgx), (conv.grad_weight, twin.grad_weight), (conv.grad_bias, twin.grad_bias)):
            np.testing.assert_array_equal(got.get(), want.get())


def test_an_empty_batch_replays_its_zero_fill(queue):
    x = cla.zeros(queue, (0, 4, 5, 5), np.float32)
    dy = cla.zeros(queue, (0, 6, 3, 3), np.float32)
    with clconv.graph() as g:
        dw = clconv.conv2d_weight(x, (6, 4, 3, 3), dy)
    assert g.names == ["fill"]
    dw.fill(np.nan)
    g.replay()
    np.testing.assert_array_equal(dw.get(), np.zeros((6, 4, 3, 3), np.float32))


def test_numpy_arrays_are_refused_before_anything_is_enqueued(queue):
    x, w, b, _ = Case("numpy", 1, 4, 6, 5, 6, 3, 3, padding=1, groups=2).data()
    with pytest.raises(TypeError, match=r"inside clconv.graph\(\) arrays must be pyopencl arrays.*input, weight, bias"):
        with clconv.graph() as g:
            clconv.conv2d(x, w, b, padding=1, groups=2)
    assert len(g) == 0
    module = clconv.nn.Conv2d(4, 6, 3, padding=1, queue=queue)
    with pytest.raises(TypeError, match="a module's arrays must be pyopencl arrays"):
        with clconv.graph():
            module(x)


def test_per_group_queues_are_refused_when_the_block_ends(queue, monkeypatch):
    monkeypatch.setenv("CLCONV_GEMM", "clconv")
    x, w, _, _ = _device(queue, Case("per_group", 2, 4, 7, 6, 6, 3, 3, padding=1, groups=2).data())
    with pytest.raises(clconv.ClconvError, match="cannot be replayed: its block had per-group queues"):
        with clconv.graph() as g:
            y = clconv.conv2d(x, w, padding=1, groups=2, algorithm="im2col", queues="per-group")
    assert_close(y.get(), reference.conv2d(x.get(), w.get(), padding=1, groups=2), np.float32, "the call itself")
    with pytest.raises(clconv.ClconvError, match="cannot be replayed"):
        g.replay()


@pytest.mark.clblast
def test_clblast_gemms_are_refused_when_the_block_ends(queue):
    x, w, _, _ = _device(queue, Case("clblast", 2, 4, 7, 6, 6, 3, 3, padding=1).data())
    with pytest.raises(clconv.ClconvError, match=r"its block had CLBlast GEMMs, .*gemm='clconv'"):
        with clconv.graph():
            clconv.conv2d(x, w, padding=1, algorithm="im2col", gemm="clblast")


def test_arrays_of_another_queue_are_refused(queue, monkeypatch):
    """An argument written through another queue makes the call wait on that queue's work (a
    barrier a replay would not repeat): refused when the block ends."""
    monkeypatch.setenv("CLCONV_GEMM", "clconv")
    other = cl.CommandQueue(queue.context, queue.device)
    x, w, _, _ = Case("other_queue", 2, 4, 7, 6, 6, 3, 3, padding=1, groups=2).data()
    xd, wd = cla.to_device(other, x), cla.to_device(queue, w)
    with pytest.raises(clconv.ClconvError, match="its block had arrays of another queue"):
        with clconv.graph():
            clconv.conv2d(xd, wd, padding=1, groups=2, queue=queue)


def test_an_exception_in_the_block_refuses_the_graph(queue):
    x, w, _, _ = _device(queue, Case("exception", 1, 4, 6, 5, 6, 3, 3, padding=1, groups=2).data())
    with pytest.raises(ValueError, match="stride"):
        with clconv.graph() as g:
            clconv.conv2d(x, w, padding=1, groups=2)
            clconv.conv2d(x, w, stride=0, groups=2)
    assert len(g) > 0
    with pytest.raises(clconv.ClconvError, match="cannot be replayed: its block had an exception"):
        g.replay()


def test_a_graph_replayed_in_another_graphs_block_becomes_part_of_it(queue, monkeypatch):
    monkeypatch.setenv("CLCONV_GEMM", "clconv")
    layer = Case("compose", 2, 4, 7, 6, 6, 3, 3, padding=1, groups=2)
    x, w, b, _ = _device(queue, layer.data())
    w2 = cla.to_device(queue, np.random.default_rng(3).standard_normal((5, 6, 1, 1)).astype(np.float32))
    with clconv.graph() as first:
        y = clconv.conv2d(x, w, b, padding=1, groups=2)
    with clconv.graph() as both:
        first.replay()
        z = clconv.conv2d(y, w2)
    assert both.names == first.names + both.names[len(first):] and len(both) > len(first)
    new = layer.data(seed=4)[0]
    x.set(new)
    y.fill(np.nan)
    z.fill(np.nan)
    both.replay()
    want_y = reference.conv2d(new, w.get(), b.get(), padding=1, groups=2)
    assert_close(y.get(), want_y, np.float32, "the inner graph's layer")
    assert_close(z.get(), reference.conv2d(want_y, w2.get()), np.float32, "the outer graph's layer")


def test_graphs_do_not_nest(queue):
    with clconv.graph():
        with pytest.raises(ValueError, match="do not nest"):
            with clconv.graph():
                pass


def test_graph_outlives_its_plans_and_the_callers_context(queue, monkeypatch):
    """Graphs recorded on a plan's first calls (private kernel copies) and on fast calls (the
    plan's bound kernels) replay after the caller's context and every plan are dropped."""
    monkeypatch.setenv("CLCONV_GEMM", "clconv")
    case = Case("lifetime", 3, 4, 9, 7, 6, 3, 3, stride=2, padding=(1, 2), groups=2)
    opts = case.options
    x, w, _, _ = case.data()
    context = cl.Context([queue.device])
    q = cl.CommandQueue(context)
    xd, wd = cla.to_device(q, x), cla.to_device(q, w)
    graphs, results = [], []
    for _ in range(2):   # the first calls, then fast calls (after the replay that arms them)
        with clconv.graph() as g:
            results.append(clconv.conv2d(xd, wd, **opts))
        graphs.append(g)
        clconv.conv2d(xd, wd, **opts)
    del context
    monkeypatch.setattr(clconv.planner, "_calls", {})
    monkeypatch.setattr(clconv.planner, "_plan_cache", type(clconv.planner._plan_cache)())
    gc.collect()
    new = case.data(seed=5)[0]
    xd.set(new)
    for g, y in zip(graphs, results):
        y.fill(np.nan)
        g.replay()
        assert_close(y.get(), reference.conv2d(new, w, **opts), np.float32, "replayed")
