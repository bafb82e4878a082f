"""Host side of kernels/bias.cl: a forward pass's bias and ReLU (its epilogue), the gradient
through that ReLU, and the grad-bias reduction.

Kernels that write a forward's output (direct, Winograd, FFT, im2col's layout kernel) apply
the epilogue themselves, as they write (:func:`flags`); passes whose output a GEMM writes get
the bias filled in first (the GEMM adding onto it) or, with ReLU, bias and ReLU in one pass
after it (:func:`before_gemm`, :func:`after_gemm`).
"""
import numpy as np

from .buffers import idx_for
from .programs import get_kernel, launch, reduction_work_group

EPI_BIAS, EPI_RELU, EPI_ADD = 1, 2, 4   # kernels/clconv.h


def flags(bias, relu):
    """The epilogue flags of a kernel writing the output: add the bias (a Ref, or None), then ReLU."""
    return (EPI_BIAS if bias is not None else 0) | (EPI_RELU if relu else 0)


def fill_bias(queue, dtype, y, bias, N, K, P, add=False, relu=False):
    """y (N, K, P) = bias[k] everywhere (a GEMM then accumulates onto it), or += with ``add``;
    then ReLU with ``relu``. ``bias`` may be None (only with ``add``)."""
    idx = idx_for(dtype, y, bias)
    b = bias if bias is not None else y
    knl = get_kernel(queue.context, "bias.cl", "fill_bias", dtype, IDX=idx)
    launch(queue, knl, (P, N * K), (min(64, P), 1), y.buf, y.off, b.buf, b.off,
           N, K, P, flags(bias, relu) | (EPI_ADD if add else 0), what="bias")


def _bias_first(dtype, bias, relu):
    """Whether the bias is filled in before the GEMM: without ReLU, and for a float16 output
    always (then the GEMM's sum with it is rounded to half once, not the product and then the sum
    again)."""
    return bias is not None and (not relu or np.dtype(dtype) == np.float16)


def before_gemm(queue, dtype, y, bias, N, K, P, relu=False):
    """Before a GEMM that writes the forward's output y (N, K, P) of ``dtype`` storage: y = bias
    broadcast where :func:`_bias_first`, else :func:`after_gemm` adds it. Returns the GEMM's beta."""
    if not _bias_first(dtype, bias, relu):
        return 0.0
    fill_bias(queue, dtype, y, bias, N, K, P)
    return 1.0


def after_gemm(queue, dtype, y, bias, N, K, P, relu=False):
    """After that GEMM, with ReLU: y = max(y + bias, 0) in one pass over y (the bias only where
    :func:`before_gemm` did not fill it in)."""
    if relu:
        fill_bias(queue, dtype, y, None if _bias_first(dtype, bias, relu) else bias, N, K, P, add=True, relu=True)


def relu_grad(queue, dtype, dy, y, dx, n):
    """dx = dy where y > 0, else 0 (n elements; Refs): the gradient through a fused ReLU of output y."""
    idx = idx_for(dtype, dy, y, dx)
    knl = get_kernel(queue.context, "bias.cl", "relu_grad", dtype, IDX=idx)
    launch(queue, knl, (n,), (64,), dy.buf, dy.off, y.buf, y.off, dx.buf, dx.off, n, what="ReLU gradient")


def bias_grad(queue, dtype, dy, db, N, K, P):
    """db (K,) = dy (N, K, P) summed over N and P, one work-group per channel."""
    idx = idx_for(dtype, dy, db)
    wg = reduction_work_group(queue.device)
    knl = get_kernel(queue.context, "bias.cl", "bias_grad", dtype, IDX=idx, WG=wg)
    launch(queue, knl, (K * wg,), (wg,), dy.buf, dy.off, db.buf, db.off,
           N, K, P, what="grad-bias")
