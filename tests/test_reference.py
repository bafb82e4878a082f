"""The NumPy reference checked against plain summation loops, and the shared shape rules."""
import itertools

import numpy as np
import pytest

from clconv import reference
from clconv.geometry import conv_geometry, normalize_padding, output_size
from helpers import CASES


def loops_forward(x, w, b, g):
    """y[n, k, oy, ox] = b[k] + sum over c, i, j in k's group of w[k, c, i, j] * x[n, c, iy, ix]."""
    (pt, _), (pl, _) = g.pads
    y = np.zeros(g.output_shape)
    for n, k, oy, ox in itertools.product(range(g.N), range(g.K), range(g.OH), range(g.OW)):
        grp = k // g.Kg
        s = b[k]
        for c, i, j in itertools.product(range(g.Cg), range(g.kh), range(g.kw)):
            iy = oy * g.stride[0] - pt + i * g.dilation[0]
            ix = ox * g.stride[1] - pl + j * g.dilation[1]
            if 0 <= iy < g.H and 0 <= ix < g.W:
                s += w[k, c, i, j] * x[n, grp * g.Cg + c, iy, ix]
        y[n, k, oy, ox] = s
    return y


def loops_gradients(x, w, dy, g):
    """grad_input and grad_weight by the chain rule, one tap at a time."""
    (pt, _), (pl, _) = g.pads
    dx, dw = np.zeros(g.input_shape), np.zeros(g.weight_shape)
    for n, k, oy, ox in itertools.product(range(g.N), range(g.K), range(g.OH), range(g.OW)):
        grp = k // g.Kg
        for c, i, j in itertools.product(range(g.Cg), range(g.kh), range(g.kw)):
            iy = oy * g.stride[0] - pt + i * g.dilation[0]
            ix = ox * g.stride[1] - pl + j * g.dilation[1]
            if 0 <= iy < g.H and 0 <= ix < g.W:
                dx[n, grp * g.Cg + c, iy, ix] += w[k, c, i, j] * dy[n, k, oy, ox]
                dw[k, c, i, j] += x[n, grp * g.Cg + c, iy, ix] * dy[n, k, oy, ox]
    return dx, dw


@pytest.mark.parametrize("case", [c for c in CASES if c.name in {
    "g2_k3x3_s2_pad_pair", "g3_k3x2_s3x2_asym", "depthwise_x2_s2_same", "fc_mode_padded", "d1x3_same_s1",
    "k2x4_s1x3_p2"}], ids=repr)
def test_reference_matches_loops(case):
    x, w, b, dy = (a.astype(np.float64) for a in case.data())
    g = conv_geometry(x.shape, w.shape, **case.options)
    np.testing.assert_allclose(reference.conv2d(x, w, b, **case.options), loops_forward(x, w, b, g),
                               rtol=1e-12, atol=1e-12)
    dx, dw = loops_gradients(x, w, dy, g)
    np.testing.assert_allclose(reference.conv2d_input(x.shape, w, dy, **case.options), dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(reference.conv2d_weight(x, w.shape, dy, **case.options), dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(reference.conv2d_bias(dy), dy.sum(axis=(0, 2, 3)), rtol=1e-12)


@pytest.mark.parametrize("size,k,s,d", [(7, 3, 1, 1), (8, 3, 2, 1), (9, 3, 3, 1), (10, 2, 3, 2), (5, 5, 2, 1),
                                        (1, 3, 1, 1), (13, 4, 4, 3)])
def test_same_padding_gives_ceil_of_size_over_stride(size, k, s, d):
    (top, bottom), (left, right) = normalize_padding("same", (size, size), (k, k), (s, s), (d, d))
    assert output_size(size, k, s, top, bottom, d) == -(-size // s)
    assert bottom - top in (0, 1)  # the odd extra pixel goes to the bottom/right


def test_padding_forms():
    assert normalize_padding(2, (5, 5), (3, 3), (1, 1), (1, 1)) == ((2, 2), (2, 2))
    assert normalize_padding((1, 3), (5, 5), (3, 3), (1, 1), (1, 1)) == ((1, 1), (3, 3))
    assert normalize_padding(((0, 2), (1, 0)), (5, 5), (3, 3), (1, 1), (1, 1)) == ((0, 2), (1, 0))
    assert normalize_padding("valid", (5, 5), (3, 3), (1, 1), (1, 1)) == ((0, 0), (0, 0))


def test_remembered_geometries_never_answer_other_arguments():
    """Validated geometries are remembered; look-alike arguments must not share an answer."""
    w = (4, 3, 3, 3)
    assert conv_geometry(map(int, (1, 3, 8, 8)), w).input_shape == (1, 3, 8, 8)
    assert conv_geometry(map(int, (2, 3, 16, 16)), w).input_shape == (2, 3, 16, 16)   # same repr shape
    assert conv_geometry((1, 3, 8, 8), w, stride=1).stride == (1, 1)
    with pytest.raises(TypeError):
        conv_geometry((1, 3, 8, 8), w, stride=True)      # True == 1, but is refused
    with pytest.raises(TypeError):
        conv_geometry((1, 3, 8, 8), w, stride=1.0)
    assert conv_geometry((1, 3, 8, 8), w, padding=[[1, 0], [0, 1]]).pads == ((1, 0), (0, 1))
