"""Modules and the transposed convolution against the reference."""
import numpy as np
import pyopencl.array as cla
import pytest

import clconv
from clconv import reference
from helpers import assert_close


def transposed_reference(x, w, b, stride, padding, output_padding, groups, dilation):
    """conv_transpose2d as the grad-input of the convolution it transposes (NumPy, float64)."""
    from clconv.transpose import transpose_output_shape
    size = transpose_output_shape(x.shape, w.shape, stride, padding, output_padding, groups, dilation)
    y = reference.conv2d_input(size, w, x, stride, padding, dilation, groups)
    return y + (0 if b is None else np.asarray(b, np.float64).reshape(1, -1, 1, 1))


TRANSPOSED = [  # (input shape, weight shape, stride, padding, output_padding, groups, dilation)
    ((2, 4, 5, 7), (4, 3, 3, 3), 2, 1, 1, 1, 1),
    ((1, 6, 4, 3), (6, 2, 3, 2), (2, 3), (1, 0), (1, 2), 3, 1),
    ((3, 2, 6, 5), (2, 5, 2, 4), 1, 0, 0, 1, (2, 1)),
    ((2, 4, 3, 3), (4, 1, 3, 3), 3, 1, (2, 0), 4, 2),
]


@pytest.mark.parametrize("xs,ws,stride,padding,output_padding,groups,dilation,dtype",
                         [t + (np.float32,) for t in TRANSPOSED] + [TRANSPOSED[1] + (np.float16,)],
                         ids=["s2_op1", "g3_s2x3", "d2x1", "depthwise_s3", "g3_s2x3_float16"])
def test_conv_transpose2d_and_its_gradients(xs, ws, stride, padding, output_padding, groups, dilation, dtype):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[1] * groups).astype(dtype)
    opts = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    want = transposed_reference(x, w, b, **opts)
    assert_close(clconv.conv_transpose2d(x, w, b, **opts), want, dtype, "conv_transpose2d")
    dy = rng.standard_normal(want.shape).astype(dtype)
    conv = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    # its input gradient is the forward convolution, its weight gradient the conv's grad-weight with roles swapped
    assert_close(clconv.conv_transpose2d_input(xs, w, dy, **opts), reference.conv2d(dy, w, **conv), dtype,
                 "grad-input")
    assert_close(clconv.conv_transpose2d_weight(x, ws, dy, **opts), reference.conv2d_weight(dy, ws, x, **conv),
                 dtype, "grad-weight")
    # and the adjoint identity <T(x), dy> = <x, T^*(dy)> holds
    np.testing.assert_allclose(np.vdot(want - b.reshape(1, -1, 1, 1), dy),
                               np.vdot(x, reference.conv2d(dy, w, **conv)), rtol=1e-9)


def test_conv_transpose2d_rejects_bad_output_padding():
    with pytest.raises(ValueError, match="output_padding"):
        clconv.conv_transpose2d(np.ones((1, 2, 3, 3), np.float32), np.ones((2, 2, 3, 3), np.float32), stride=2,
                                output_padding=2)


@pytest.mark.parametrize("groups,padding,dtype", [(1, 1, np.float32), (2, "same", np.float32),
                                                  (4, ((1, 0), (2, 1)), np.float32), (2, "same", np.float16)],
                         ids=["g1", "g2_same", "g4_asym", "g2_same_float16"])
def test_conv2d_module_forward_backward_accumulates(groups, padding, dtype, queue):
    m = clconv.nn.Conv2d(4, 8, (3, 2), stride=(1, 2), padding=padding, groups=groups, seed=3, dtype=dtype)
    w, b = m.weight.get(), m.bias.get()
    assert w.dtype == dtype and np.abs(w).max() <= 1 / np.sqrt(4 // groups * 6) and w.std() > 0
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 9, 7)).astype(dtype)
    opts = dict(stride=(1, 2), padding=padding, groups=groups)
    y = m(x)
    assert isinstance(y, cla.Array)
    assert_close(y.get(), reference.conv2d(x, w, b, **opts), dtype, "forward")
    dy1 = rng.standard_normal(y.shape).astype(dtype)
    dy2 = rng.standard_normal(y.shape).astype(dtype)
    gx = m.backward(x, dy1)
    assert_close(gx.get(), reference.conv2d_input(x.shape, w, dy1, **opts), dtype, "grad-input")
    m.backward(cla.to_device(queue, x), cla.to_device(queue, dy2))   # a second call adds
    assert_close(m.grad_weight.get(), reference.conv2d_weight(x, w.shape, dy1, **opts)
                 + reference.conv2d_weight(x, w.shape, dy2, **opts), dtype, "grad-weight sum")
    assert_close(m.grad_bias.get(), reference.conv2d_bias(dy1) + reference.conv2d_bias(dy2), dtype, "grad-bias")
    m.zero_grad()
    assert not m.grad_weight.get().any() and not m.grad_bias.get().any()


def test_module_state_round_trip_and_repr():
    m = clconv.nn.Conv2d(6, 4, 3, padding=1, groups=2, bias=True, seed=0)
    assert repr(m) == "Conv2d(6, 4, kernel_size=(3, 3), stride=(1, 1), padding=1, groups=2, bias=True, dtype=float32)"
    w = np.arange(4 * 3 * 9, dtype=np.float32).reshape(4, 3, 3, 3)
    m.load_numpy(w, np.ones(4))
    state = m.state_dict()
    np.testing.assert_array_equal(state["weight"], w)
    np.testing.assert_array_equal(state["bias"], np.ones(4))
    assert [p.shape for p in m.parameters()] == [(4, 3, 3, 3), (4,)]
    with pytest.raises(ValueError, match=r"\[4, 6, 3, 3\]"):
        m.load_numpy(np.zeros((4, 6, 3, 3)), np.ones(4))
    nobias = clconv.nn.Conv2d(2, 2, 1, bias=False)
    assert nobias.bias is None and nobias.parameters() == [nobias.weight]


def test_conv_transpose2d_module(queue):
    m = clconv.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, seed=1)
    assert repr(m).startswith("ConvTranspose2d(4, 6, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), "
                              "output_padding=(1, 1), groups=2")
    x = np.random.default_rng(2).standard_normal((2, 4, 5, 4)).astype(np.float32)
    w, b = m.weight.get(), m.bias.get()
    opts = dict(stride=2, padding=1, output_padding=1, groups=2, dilation=1)
    y = m(x)
    assert y.shape == (2, 6, 10, 8)
    assert_close(y.get(), transposed_reference(x, w, b, **opts), np.float32, "forward")
    dy = np.ones(y.shape, np.float32)
    gx = m.backward(x, dy)
    conv = dict(stride=2, padding=1, dilation=1, groups=2)
    assert_close(gx.get(), reference.conv2d(dy, w, **conv), np.float32, "grad-input")
    assert_close(m.grad_weight.get(), reference.conv2d_weight(dy, w.shape, x, **conv), np.float32, "grad-weight")
    assert_close(m.grad_bias.get(), reference.conv2d_bias(dy), np.float32, "grad-bias")


def test_conv_transpose2d_output_padding_must_be_below_the_stride():
    # PyTorch also accepts it below the dilation; clconv's grad-input mapping needs it below the stride
    with pytest.raises(ValueError, match=r"output_padding \(1, 1\) must be smaller than the stride"):
        clconv.conv_transpose2d(np.ones((1, 2, 5, 5), np.float32), np.ones((2, 2, 3, 3), np.float32), dilation=2,
                                output_padding=1)
