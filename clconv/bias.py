"""Host side of kernels/bias.cl: broadcasting the bias and the grad-bias reduction."""
from .buffers import idx_for
from .programs import get_kernel, launch, reduction_work_group


def fill_bias(queue, dtype, y, bias, N, K, P, add=False):
    """y (N, K, P) = bias[k] everywhere (a GEMM then accumulates onto it), or += with ``add``."""
    idx = idx_for(dtype, y, bias)
    knl = get_kernel(queue.context, "bias.cl", "fill_bias", dtype, IDX=idx)
    launch(queue, knl, (P, N * K), (min(64, P), 1), y.buf, y.off, bias.buf, bias.off,
           N, K, P, int(add), what="bias")


def prefill_bias(queue, dtype, y, bias, g):
    """Before a GEMM pass: y = bias broadcast (then GEMM with beta = 1), or nothing.

    Returns the GEMM's beta. ``g`` is the ConvGeometry, ``bias`` a Ref or None.
    """
    if bias is None:
        return 0.0
    fill_bias(queue, dtype, y, bias, g.N, g.K, g.P)
    return 1.0


def bias_grad(queue, dtype, dy, db, N, K, P):
    """db (K,) = dy (N, K, P) summed over N and P, one work-group per channel."""
    idx = idx_for(dtype, dy, db)
    wg = reduction_work_group(queue.device)
    knl = get_kernel(queue.context, "bias.cl", "bias_grad", dtype, IDX=idx, WG=wg)
    launch(queue, knl, (K * wg,), (wg,), dy.buf, dy.off, db.buf, db.off,
           N, K, P, what="grad-bias")
