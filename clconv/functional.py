"""The functional API, shaped like PyTorch's conv2d and its gradients.

Arrays are ``pyopencl.array.Array`` (results come back on the same queue) or
NumPy arrays (copied to the device; results come back as NumPy). Results come
from the queue's memory pool (:mod:`clconv.memory`) unless ``out=`` or
``allocator=`` says otherwise. Each call finds its plan in
:func:`clconv.planner.plan_for_call`'s cache, keyed by the call's own arguments.
"""
from . import bias as _bias
from . import storage
from .buffers import ref
from .planner import is_several, plan_for_call
from .validate import check_type, finish, prepare


def _home(queue):
    """The queue a call runs on: for a list of queues (a spread plan), the first."""
    return queue[0] if is_several(queue) else queue


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, out=None, queue=None,
           algorithm="auto", queues="single", gemm="auto", math=None, allocator=None, relu=False):
    """Grouped 2-D convolution (cross-correlation, as in PyTorch).

    input (N, C, H, W), weight (K, C/groups, kh, kw), bias (K,) or None
    -> output (N, K, OH, OW). ``padding``: int, (ph, pw), ((top, bottom), (left, right)),
    'valid' or 'same'. ``stride``, ``dilation``: int or (h, w).
    ``queue``: the queue (default: the input's, else ``clconv.default_queue()``), or a list of
    queues on devices of one context to spread the call over (:mod:`clconv.spread`; the result
    on the first). ``algorithm``: "auto", "fc", "1x1", "direct", "fft", "winograd" or "im2col"; ``queues``: "single"
    or "per-group"; ``gemm``: the GEMM engine (see :func:`clconv.plan`); ``math``: the math mode,
    None for the dtype's default (:mod:`clconv.precision`, :func:`clconv.set_math`); ``allocator``: a pyopencl
    allocator for the result and the workspace instead of clconv's pool; ``relu``: the output
    through max(., 0), fused into the pass that writes it (bias and ReLU in one pass).
    """
    check_type("input", input)
    check_type("weight", weight)
    plan = plan_for_call(input.shape, weight.shape, stride, padding, dilation, groups, input.dtype, queue,
                         (input, weight, bias, out), algorithm, queues, gemm, math)
    return plan.forward(input, weight, bias, out=out, queue=_home(queue), allocator=allocator, relu=relu)


def conv2d_input(input_size, weight, grad_output, stride=1, padding=0, dilation=1, groups=1, *, out=None,
                 queue=None, algorithm="auto", queues="single", gemm="auto", math=None, allocator=None):
    """Gradient of conv2d with respect to its input.

    input_size (N, C, H, W), weight (K, C/groups, kh, kw), grad_output (N, K, OH, OW)
    -> grad_input (N, C, H, W).
    """
    check_type("weight", weight)
    plan = plan_for_call(input_size, weight.shape, stride, padding, dilation, groups, weight.dtype, queue,
                         (weight, grad_output, out), algorithm, queues, gemm, math)
    return plan.backward_input(weight, grad_output, out=out, queue=_home(queue), allocator=allocator)


def conv2d_weight(input, weight_size, grad_output, stride=1, padding=0, dilation=1, groups=1, *, out=None,
                  queue=None, algorithm="auto", queues="single", gemm="auto", math=None, allocator=None):
    """Gradient of conv2d with respect to its weight.

    input (N, C, H, W), weight_size (K, C/groups, kh, kw), grad_output (N, K, OH, OW)
    -> grad_weight (K, C/groups, kh, kw).
    """
    check_type("input", input)
    plan = plan_for_call(input.shape, weight_size, stride, padding, dilation, groups, input.dtype, queue,
                         (input, grad_output, out), algorithm, queues, gemm, math)
    return plan.backward_weight(input, grad_output, out=out, queue=_home(queue), allocator=allocator)


def conv2d_bias(grad_output, *, out=None, queue=None, allocator=None):
    """Gradient of conv2d with respect to its bias: grad_output (N, K, OH, OW) -> (K,)."""
    check_type("grad_output", grad_output)
    if grad_output.ndim != 4:
        raise ValueError(f"grad_output must be 4-D (N, K, OH, OW), got size {list(grad_output.shape)}")
    N, K, OH, OW = grad_output.shape
    queue, dev, numpy_mode = prepare(queue, None, {"grad_output": grad_output},
                                     {"grad_output": grad_output.shape}, out, (K,), allocator)
    if N * OH * OW:
        _bias.bias_grad(queue, grad_output.dtype, ref(dev["grad_output"]), ref(dev["out"]), N, K, OH * OW)
    else:
        storage.zero(queue, dev["out"])
    return finish(queue, dev, out, numpy_mode)
