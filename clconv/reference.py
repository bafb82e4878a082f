"""NumPy reference for grouped conv2d and its gradients, in float64.

Same signatures as the device functions (minus ``queue``), on NumPy arrays.
The math is written out plainly: gather the kernel windows (im2col), one
einsum per group, scatter back (col2im).
"""
import numpy as np

from .geometry import check_grad_output, conv_geometry

# How close a device result must be to this reference, per dtype: the normalised max
# error max|actual - expected| / max|expected|. float16 results are float32 sums rounded
# once to half (unit roundoff 2**-11 = 4.9e-4); a module's accumulated gradient is rounded
# three times, hence 4 roundoffs. Used by the tests and by ``python -m clconv check``.
TOLERANCE = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-10}
# Unit roundoff of the operands' format in each matrix-unit mode (clconv.precision): TF32 and
# FP16 keep 10 explicit mantissa bits, BF16 7.
ROUNDOFF = {"tf32": 2.0 ** -11, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def tolerance(dtype, math="strict"):
    """How close a result of ``dtype`` arrays computed in math mode ``math`` must be to this
    reference: ``TOLERANCE`` for "strict", else four unit roundoffs of the operands' format
    (``ROUNDOFF``: 2.0e-3 for tf32 and fp16, 1.6e-2 for bf16), never below the dtype's own.

    It does not grow with the depth K of the products: each operand is rounded once, the
    products of rounded operands are exact in float32 and summed in float32, so each term carries
    a relative error of at most two roundoffs, of either sign. Those errors add like a random walk,
    as the sqrt(K) of the terms, and the error is normalised by the largest result, which grows at
    least as fast (as sqrt(K) for terms of either sign, as K for terms of one)."""
    own = TOLERANCE[np.dtype(dtype)]
    return own if math == "strict" else max(own, 4 * ROUNDOFF[math])


def normalised_error(actual, expected):
    """max|actual - expected| / max|expected| in float64 (0 for empty arrays)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = max(np.abs(expected).max(initial=0.0), 1e-30)
    return np.abs(actual - expected).max(initial=0.0) / scale


def _windows(x, g):
    """(N, C, H, W) -> (N, C, kh, kw, OH, OW): the input pixel under each kernel tap."""
    (pt, pb), (pl, pr) = g.pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    (sh, sw), (dh, dw) = g.stride, g.dilation
    cols = np.empty((g.N, g.C, g.kh, g.kw, g.OH, g.OW))
    for i in range(g.kh):
        for j in range(g.kw):
            cols[:, :, i, j] = xp[:, :, i * dh: i * dh + sh * (g.OH - 1) + 1: sh,
                                  j * dw: j * dw + sw * (g.OW - 1) + 1: sw]
    return cols


def _unwindows(cols, g):
    """Adjoint of :func:`_windows`: add each tap's value back onto its input pixel."""
    (pt, pb), (pl, pr) = g.pads
    (sh, sw), (dh, dw) = g.stride, g.dilation
    xp = np.zeros((g.N, g.C, g.H + pt + pb, g.W + pl + pr))
    for i in range(g.kh):
        for j in range(g.kw):
            xp[:, :, i * dh: i * dh + sh * (g.OH - 1) + 1: sh,
               j * dw: j * dw + sw * (g.OW - 1) + 1: sw] += cols[:, :, i, j]
    return xp[:, :, pt: pt + g.H, pl: pl + g.W]


def _store(result, out):
    if out is None:
        return result
    if out.shape != result.shape:
        raise ValueError(f"out has shape {list(out.shape)}, expected {list(result.shape)}")
    out[...] = result
    return out


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, out=None):
    """y (N, K, OH, OW) = grouped conv of input (N, C, H, W) with weight (K, C/groups, kh, kw) + bias (K,)."""
    x, w = np.asarray(input, np.float64), np.asarray(weight, np.float64)
    g = conv_geometry(x.shape, w.shape, stride, padding, dilation, groups)
    G = g.groups
    cols = _windows(x, g).reshape(g.N, G, g.Kd, g.P)
    y = np.einsum("gkd,ngdp->ngkp", w.reshape(G, g.Kg, g.Kd), cols, optimize=True).reshape(g.output_shape)
    if bias is not None:
        b = np.asarray(bias, np.float64)
        if b.shape != (g.K,):
            raise ValueError(f"bias of size {list(b.shape)} does not match weight {list(w.shape)}: expected [{g.K}]")
        y += b.reshape(1, g.K, 1, 1)
    return _store(y, out)


def conv2d_input(input_size, weight, grad_output, stride=1, padding=0, dilation=1, groups=1, *, out=None):
    """grad_input (N, C, H, W) from weight (K, C/groups, kh, kw) and grad_output (N, K, OH, OW)."""
    w, dy = np.asarray(weight, np.float64), np.asarray(grad_output, np.float64)
    g = conv_geometry(tuple(input_size), w.shape, stride, padding, dilation, groups)
    check_grad_output(g, dy.shape)
    G = g.groups
    dcols = np.einsum("gkd,ngkp->ngdp", w.reshape(G, g.Kg, g.Kd), dy.reshape(g.N, G, g.Kg, g.P), optimize=True)
    dx = _unwindows(dcols.reshape(g.N, g.C, g.kh, g.kw, g.OH, g.OW), g)
    return _store(dx, out)


def conv2d_weight(input, weight_size, grad_output, stride=1, padding=0, dilation=1, groups=1, *, out=None):
    """grad_weight (K, C/groups, kh, kw) from input (N, C, H, W) and grad_output (N, K, OH, OW)."""
    x, dy = np.asarray(input, np.float64), np.asarray(grad_output, np.float64)
    g = conv_geometry(x.shape, tuple(weight_size), stride, padding, dilation, groups)
    check_grad_output(g, dy.shape)
    G = g.groups
    cols = _windows(x, g).reshape(g.N, G, g.Kd, g.P)
    dw = np.einsum("ngkp,ngdp->gkd", dy.reshape(g.N, G, g.Kg, g.P), cols, optimize=True)
    return _store(dw.reshape(g.weight_shape), out)


def conv2d_bias(grad_output, *, out=None):
    """grad_bias (K,) = grad_output (N, K, OH, OW) summed over N, OH, OW."""
    dy = np.asarray(grad_output, np.float64)
    if dy.ndim != 4:
        raise ValueError(f"grad_output must be 4-D (N, K, OH, OW), got size {list(dy.shape)}")
    return _store(dy.sum(axis=(0, 2, 3)), out)
