"""Passes spread over several devices of one context (clconv.spread): two sub-devices of the
test device (where it partitions), two queues on the test device itself (every device, GPUs
too), and two root PoCL devices where the platform has them (``make test`` runs this file again
with POCL_DEVICES="pthread pthread"), every pass and split against the float64 reference, the
same bits on every run."""
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import reference, tuner, tuning
from clconv.spread import counts
from clconv.device import has_fp64
from helpers import Case, assert_close


def _root_pocl_devices(queue):
    """The root devices of the PoCL under test (one platform: PyPI's and Debian's PoCL may both be
    listed, and a context takes the devices of one)."""
    platform = queue.device.platform
    return platform.get_devices() if "portable computing language" in platform.name.lower() else []


@pytest.fixture(scope="module", params=["sub-devices", "two-queues", "root-devices"])
def queues(request, queue):
    if request.param == "sub-devices":
        try:
            return clconv.sub_device_queues(2, queue.device)
        except ValueError as exc:   # NVIDIA's driver and Mesa's rusticl do not partition
            pytest.skip(str(exc))
    if request.param == "two-queues":
        return [queue, cl.CommandQueue(queue.context, queue.device)]
    devices = _root_pocl_devices(queue)
    if len(devices) < 2:
        pytest.skip('one root PoCL device (make test runs this file with POCL_DEVICES="pthread pthread")')
    return clconv.device_queues(devices[:2])


SPREAD = [
    # groups not divisible by the devices; 5 images cut 2 + 3; images of 13*11 floats: unaligned parts
    Case("g3_odd_images", 5, 6, 13, 11, 9, 3, 3, padding=1, groups=3),
    # 16*16 floats per channel: the parts' slices start aligned, written through sub-buffers
    Case("aligned_winograd", 4, 16, 16, 16, 16, 3, 3, padding=1),
    # one image: a group split reads and writes contiguous runs
    Case("one_image_g2_d2", 1, 32, 15, 17, 32, 3, 3, padding=2, dilation=2, groups=2),
    Case("depthwise_s2_asym", 3, 6, 11, 9, 6, 3, 3, stride=2, padding=((2, 0), (1, 1)), groups=6),
    Case("k1x1_g2", 7, 6, 5, 7, 4, 1, 1, groups=2),
    Case("fc_mode_g2", 3, 6, 3, 5, 4, 3, 5, groups=2),
]


def _runs(p, case, queue, relu=False):
    x, w, b, dy = case.data()
    xd, wd, bd, dyd = (cla.to_device(queue, a) for a in (x, w, b, dy))
    return [(p.forward(xd, wd, bd, relu=relu).get(), p.backward_input(wd, dyd).get(), p.backward_weight(xd, dyd).get())
            for _ in range(2)]


@pytest.mark.parametrize("case", SPREAD, ids=repr)
@pytest.mark.parametrize("split", ["images", "groups"])
def test_spread_matches_reference(case, split, queues):
    if split == "groups" and case.options["groups"] == 1:
        pytest.skip("one group")
    x, w, b, dy = case.data()
    opts = case.options
    # uneven shares: the second device takes more images (or groups)
    p = clconv.plan(x.shape, w.shape, **opts, queue=queues, split=split, shares=[1, 1.6])
    assert p.splits == dict.fromkeys(p.splits, split)
    runs = _runs(p, case, queues[0], relu=True)
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)
    y, dx, dw = runs[0]
    assert_close(y, np.maximum(reference.conv2d(x, w, b, **opts), 0), np.float32, "forward + ReLU")
    assert_close(dx, reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(dw, reference.conv2d_weight(x, w.shape, dy, **opts), np.float32, "grad-weight")


# every algorithm, forced, on a grouped case it applies to: the parts run it on their devices
EVERY = [
    ("im2col", Case("im2col_g2_s2", 3, 16, 11, 9, 6, 3, 3, stride=2, padding=1, groups=2)),
    ("winograd", Case("winograd_g2", 3, 32, 9, 10, 32, 3, 3, padding=1, groups=2)),
    ("fft", Case("fft_g2_k5", 3, 32, 9, 8, 32, 5, 5, padding=2, groups=2)),
    ("direct", Case("direct_g4", 3, 8, 9, 7, 8, 3, 3, padding=1, groups=4)),
    ("1x1", Case("1x1_g2", 3, 6, 5, 7, 4, 1, 1, groups=2)),
    ("fc", Case("fc_g2", 3, 6, 3, 5, 4, 3, 5, groups=2)),
]


@pytest.mark.parametrize("algorithm, case", EVERY, ids=[a for a, _ in EVERY])
@pytest.mark.parametrize("split", ["images", "groups"])
def test_every_algorithm_spreads(algorithm, case, split, queues):
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, queue=queues, split=split, algorithm=algorithm)
    assert set(p.algorithms.values()) == {algorithm}
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32,
                 "grad-weight")


@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=["float16", "float64"])
@pytest.mark.parametrize("split", ["images", "groups"])
def test_spread_other_dtypes(dtype, split, queues):
    """float16 storage (the parts' passes on CPUs compute on float32 copies; grad-weight's sum over
    devices reads and writes half) and float64."""
    if dtype == np.float64 and not has_fp64(queues[0].device):
        pytest.skip("no fp64")
    case = SPREAD[0]
    x, w, b, dy = case.data(dtype)
    opts = case.options
    p = clconv.plan(x.shape, w.shape, **opts, dtype=dtype, queue=queues, split=split)
    xf, wf, bf, dyf = (a.astype(np.float64) for a in (x, w, b, dy))
    assert_close(p.forward(x, w, b), reference.conv2d(xf, wf, bf, **opts), dtype, "forward")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, wf, dyf, **opts), dtype, "grad-input")
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(xf, w.shape, dyf, **opts), dtype, "grad-weight")


def test_counts_follow_shares():
    assert counts(5, [1, 1.6]) == [2, 3]
    assert counts(3, [1, 1]) == [2, 1]
    assert counts(1, [1, 1, 1]) == [1, 0, 0]
    assert counts(10, [0, 1]) == [0, 10]
    assert sum(counts(97, [0.3, 1, 2.2])) == 97


def test_explain_and_a_device_without_work(queues):
    """Two images over shares 0 and 1: the first device takes none; explain says so."""
    case = Case("two", 2, 4, 9, 8, 6, 3, 3, padding=1, groups=2)
    x, w, b, dy = case.data()
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queues, split="images", shares=[0, 1])
    text = p.explain()
    assert "spread over 2 devices" in text and text.count("split by images (device 1 2 image(s) from 0;") == 3, text
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **case.options), np.float32, "forward")


def test_out_at_an_offset_is_written_and_nothing_else(queues):
    """A result inside a larger buffer at an unaligned offset: the parts' pieces are copied in,
    the bytes around it stay as they were."""
    case = SPREAD[0]
    x, w, b, dy = case.data()
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queues, split="groups")
    shape = p.geometry.output_shape
    big = cla.to_device(queues[0], np.full(int(np.prod(shape)) + 7, 42.0, np.float32))
    out = big[3:3 + int(np.prod(shape))].reshape(shape)
    p.forward(x, w, b, out=out)
    host = big.get()
    assert (host[:3] == 42).all() and (host[3 + out.size:] == 42).all()
    assert_close(host[3:3 + out.size].reshape(shape), reference.conv2d(x, w, b, **case.options), np.float32,
                 "forward")


def test_a_callers_allocator(queues):
    """A pyopencl memory pool of the caller's serves the results; the parts' workspaces still come
    from their own queues' pools (one shared pool could hand one part's freed block to another)."""
    from pyopencl.tools import ImmediateAllocator, MemoryPool
    case = SPREAD[1]
    x, w, b, dy = case.data()
    pool = MemoryPool(ImmediateAllocator(queues[0]))
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queues, split="images")
    for _ in range(3):
        y = p.forward(x, w, b, allocator=pool)
        dw = p.backward_weight(x, dy, allocator=pool)
    assert_close(y, reference.conv2d(x, w, b, **case.options), np.float32, "forward")
    assert_close(dw, reference.conv2d_weight(x, w.shape, dy, **case.options), np.float32, "grad-weight")
    assert pool.managed_bytes > 0


def test_functional_and_module_spread(queues):
    case = SPREAD[0]
    x, w, b, dy = case.data()
    y = clconv.conv2d(x, w, b, **case.options, queue=queues)
    assert_close(y, reference.conv2d(x, w, b, **case.options), np.float32, "functional forward")
    spread = clconv.nn.Conv2d(6, 9, 3, padding=1, groups=3, queue=queues, seed=3)
    one = clconv.nn.Conv2d(6, 9, 3, padding=1, groups=3, queue=queues[0], seed=3)
    for m in (spread, one):
        m.backward(x, dy)
    assert_close(spread(x).get(), one(x).get(), np.float32, "module forward")
    assert_close(spread.backward(x, dy).get(), one.backward(x, dy).get(), np.float32, "module grad-input")
    assert_close(spread.grad_weight.get(), one.grad_weight.get(), np.float32, "module grad_weight")
    assert_close(spread.grad_bias.get(), one.grad_bias.get(), np.float32, "module grad_bias")


def test_the_split_comes_from_the_tuning_cache(queues):
    """tune_spread measures each split and the shares; a plan built afterwards takes them."""
    case = SPREAD[0]
    g = clconv.conv_geometry(case.input_shape, case.weight_shape, **case.options)
    def make_plan(sub, q):
        return clconv.plan(sub.input_shape, sub.weight_shape, sub.stride, sub.pads, sub.dilation, sub.groups, queue=q)
    found = tuner.tune_spread(g, np.float32, tuple(queues), make_plan)
    assert set(found) == {"forward", "backward_input", "backward_weight"}
    for entry in found.values():
        assert entry["split"] in ("images", "groups") and len(entry["shares"]) == 2
        assert {"images", "groups", "device 0 alone"} <= set(entry["timings"])
    stored = tuning.load()
    assert all(tuning.spread_key(queues, np.float32, g, p) in stored for p in found)
    p = clconv.plan(case.input_shape, case.weight_shape, **case.options, queue=queues)
    assert p.splits == {k: v["split"] for k, v in found.items()}
    assert p.explain().count("chosen fastest in the tuning cache") == 3
    # the splits were timed with strict plans: a spread asking for TF32 does not take them
    assert tuning.spread_key(queues, np.float32, g, "forward", "tf32") not in stored
    tf32 = clconv.plan(case.input_shape, case.weight_shape, **case.options, queue=queues, math="tf32")
    assert tf32.explain().count("chosen fastest in the tuning cache") == 0


def test_bad_spreads_are_refused(queue, queues):
    context = cl.Context([queue.device])   # kept: Intel's runtime drops a context nothing refers to
    other = cl.CommandQueue(context)
    with pytest.raises(ValueError, match="share one OpenCL context"):
        clconv.plan((2, 4, 5, 5), (4, 4, 3, 3), queue=[queues[0], other])
    with pytest.raises(ValueError, match="split='groups' needs groups > 1"):
        clconv.plan((2, 4, 5, 5), (4, 4, 3, 3), queue=queues, split="groups")
    with pytest.raises(ValueError, match="shares must be 2 non-negative numbers"):
        clconv.plan((2, 4, 5, 5), (4, 4, 3, 3), queue=queues, shares=[1, -1])
    with pytest.raises(ValueError, match="split must be"):
        clconv.plan((2, 4, 5, 5), (4, 4, 3, 3), queue=queues, split="rows")
    with pytest.raises(ValueError, match="ConvTranspose2d runs on one queue"):
        clconv.nn.ConvTranspose2d(4, 4, 3, queue=queues)
