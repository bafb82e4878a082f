"""Shared test tools: the one tolerance table, the case list, comparisons."""
import numpy as np
import pyopencl as cl

from clconv import reference
from clconv.reference import normalised_error, tolerance


def assert_close(actual, expected, dtype, what="", math="strict"):
    """The normalised max error against the float64 reference is within the tolerance of ``dtype``
    in math mode ``math`` (clconv.reference.tolerance: TOLERANCE[dtype] for "strict")."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values in the result"
    err, most = normalised_error(actual, expected), tolerance(dtype, math)
    assert err <= most, f"{what}: normalised max error {err:.3g} > {most}"


def kernel_kind(name):
    """A launch's kernel without its variant's suffix: whether a runtime gets a transform's row
    kernel (direct_rows, winograd_input_rows, the layout kernels' nchw_to_cnhw_rows, ...) or its
    per-tile one depends on what its compiler vectorises and on the filter's shape
    (clconv.algorithms.winograd, .direct),
    as whether split-K's sum runs four values a work-item (sum_partials4) does, not on the pass's
    launches."""
    return name.removesuffix("_rows").replace("sum_partials4", "sum_partials")


def assert_passes_match(p, x, w, b, dy, options, dtype=np.float32, weight=True):
    """Plan ``p``'s forward (with bias, and through ReLU), grad-input and (with ``weight``)
    grad-weight on host arrays, each against the float64 reference."""
    want = reference.conv2d(x, w, b, **options)
    assert_close(p.forward(x, w, b), want, dtype, "forward")
    assert_close(p.forward(x, w, b, relu=True), np.maximum(want, 0), dtype, "forward + ReLU")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **options), dtype, "grad-input")
    if weight:
        assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **options), dtype,
                     "grad-weight")


def assert_float16_passes(p, x, w, b, dy, options, queue, as_they_are, math="strict"):
    """Float16 plan ``p`` (made for a stand-in device, run on ``queue``): each pass within float16's
    tolerance of the float64 reference, reading and writing the arrays as they are (explain()'s
    note, no to_real or to_store launch) or, without ``as_they_are``, on float32 copies; a fused
    ReLU gives the forward's own halves through max(., 0), bit for bit."""
    got = {"forward": p.forward(x, w, b, queue=queue), "backward_input": p.backward_input(w, dy, queue=queue),
           "backward_weight": p.backward_weight(x, dy, queue=queue)}
    want = {"forward": reference.conv2d(x, w, b, **options),
            "backward_input": reference.conv2d_input(x.shape, w, dy, **options),
            "backward_weight": reference.conv2d_weight(x, w.shape, dy, **options)}
    for pass_name, result in got.items():
        assert result.dtype == np.float16
        assert ("float16 arrays read as they are" in p.explain().record(pass_name).notes) == as_they_are, p.explain()
        assert bool({"to_real", "to_store"} & set(p.launches(pass_name))) != as_they_are, p.launches(pass_name)
        assert_close(result, want[pass_name], np.float16, pass_name, math)
    np.testing.assert_array_equal(p.forward(x, w, b, queue=queue, relu=True), np.maximum(got["forward"], 0))


class QueueAs:
    """``queue`` whose device reports other values for the properties given (the rest are the
    real device's), to the plans built on it; kernels still run on the real queue. Plans on it
    are built with ``selfcheck=False``: a known-answer verdict is the real device's, and its
    check would run on this stand-in, which pyopencl's allocators refuse."""

    def __init__(self, queue, **device):
        self._q, self.device = queue, _DeviceAs(queue.device, device)

    def __getattr__(self, name):
        return getattr(self._q, name)


class _DeviceAs:
    def __init__(self, device, overrides):
        self._device = device
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self._device, name)


def stand_in_gpu(queue, units):
    """``queue`` as a GPU of ``units`` compute units with an H100's or H200's work-group and
    local-memory limits (:class:`QueueAs`): plans made for such a GPU, whatever device runs them."""
    return QueueAs(queue, type=cl.device_type.GPU, max_compute_units=units, max_work_group_size=1024,
                   max_work_item_sizes=(1024, 1024, 64), local_mem_size=49152)


class Case:
    """One convolution configuration: input (N, C, H, W), weight (K, C/groups, kh, kw), options."""

    def __init__(self, name, N, C, H, W, K, kh, kw, stride=1, padding=0, dilation=1, groups=1):
        self.name = name
        self.input_shape = (N, C, H, W)
        self.weight_shape = (K, C // groups, kh, kw)
        self.options = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)

    def __repr__(self):
        return self.name

    def data(self, dtype=np.float32, seed=0):
        """Random input, weight, bias (K,) and a grad_output of the right size."""
        from clconv import reference
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(self.input_shape).astype(dtype)
        w = rng.standard_normal(self.weight_shape).astype(dtype)
        b = rng.standard_normal(self.weight_shape[0]).astype(dtype)
        out_shape = reference.conv2d(x[:0], w, **self.options).shape[1:]
        dy = rng.standard_normal((self.input_shape[0],) + out_shape).astype(dtype)
        return x, w, b, dy


CASES = [
    Case("g1_k3x3_s1_p1", 1, 3, 7, 9, 5, 3, 3, padding=1),
    Case("g2_k3x3_s2_pad_pair", 3, 4, 9, 7, 6, 3, 3, stride=2, padding=(1, 2), groups=2),
    Case("g3_k3x2_s3x2_asym", 1, 6, 11, 8, 9, 3, 2, stride=(3, 2), padding=((2, 0), (1, 3)), groups=3),
    Case("depthwise_x2_s2_same", 3, 5, 9, 6, 10, 3, 3, stride=2, padding="same", groups=5),
    Case("depthwise_k2x4_d2_valid", 1, 4, 10, 13, 4, 2, 4, padding="valid", dilation=2, groups=4),
    Case("k1x1_g2", 3, 6, 5, 7, 4, 1, 1, groups=2),
    Case("k1x1_s2", 1, 4, 7, 6, 3, 1, 1, stride=2),
    Case("k1x1_s3_pad1", 3, 3, 8, 5, 5, 1, 1, stride=3, padding=1),
    Case("fc_mode", 3, 8, 5, 4, 7, 5, 4),
    Case("fc_mode_g2", 3, 6, 3, 5, 4, 3, 5, groups=2),
    Case("fc_mode_padded", 1, 2, 3, 3, 3, 5, 5, padding=1),
    Case("d1x3_same_s1", 3, 3, 8, 11, 4, 3, 3, padding="same", dilation=(1, 3)),
    Case("k2x4_s1x3_p2", 1, 2, 6, 13, 3, 2, 4, stride=(1, 3), padding=2),
    Case("g3_same_s3", 3, 6, 10, 11, 6, 3, 3, stride=3, padding="same", groups=3),
    Case("g2_d2_s2_p1", 1, 4, 12, 9, 4, 3, 3, stride=2, padding=1, dilation=2, groups=2),
    Case("g2_k5x5_alexnet_like", 3, 4, 9, 8, 6, 5, 5, padding=2, groups=2),
    # padding beyond the dilated kernel: the stride-1 grad-input's flipped padding goes negative
    Case("depthwise_x2_k3x2_overpad", 2, 3, 5, 7, 6, 3, 2, padding=((3, 1), (0, 2)), groups=3),
]


REPLAYED = [  # one case per algorithm whose passes a plan replays (clconv's own GEMM kernel)
    (Case("im2col_split_k", 4, 4, 17, 19, 6, 3, 3, padding=1, groups=2), "im2col"),
    (Case("depthwise", 3, 6, 40, 33, 12, 3, 3, stride=2, padding=1, groups=6), "direct"),
    (Case("winograd", 2, 6, 13, 11, 4, 3, 3, padding=1, groups=2), "winograd"),
    (Case("fft", 2, 4, 9, 7, 6, 3, 3, padding=1, groups=2), "fft"),
    (Case("fc", 5, 8, 3, 2, 12, 3, 2, groups=4), "fc"),
    (Case("pointwise", 5, 6, 13, 7, 9, 1, 1, groups=3), "1x1"),
]


def matrix_units(queue, monkeypatch, mode):
    """The matrix units for ``mode`` in what the test runs: the device's where clconv uses them
    (NVIDIA), else the GPU GEMM kernel's emulation of them (its MMA_EMULATED form: the same
    fragments, rounded alike, multiplied through local memory), which checks the kernel's
    fragment layouts, warps and stores and everything above them on every runtime. Returns
    "device" or "emulated"."""
    from clconv import gemm
    from clconv.gemm import gemm_gpu
    if mode in gemm_gpu.matrix_units(queue.device):
        return "device"
    build = gemm_gpu.get_kernel

    def emulated(context, filename, name, dtype, **defines):
        return build(context, filename, name, dtype, **defines, **({"MMA_EMULATED": 1} if defines.get("MMA") else {}))
    monkeypatch.setattr(gemm_gpu, "get_kernel", emulated)
    monkeypatch.setattr(gemm, "matrix_units", lambda device: frozenset({mode}))
    return "emulated"

