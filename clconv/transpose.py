"""Transposed convolution (PyTorch's conv_transpose2d), built on the conv2d passes.

A transposed convolution of input (N, Cin, H, W) with weight (Cin, Cout/groups,
kh, kw) is the grad-input pass of the convolution that maps (N, Cout, Hout,
Wout) to (N, Cin, H, W) with that same weight; its gradients are that
convolution's forward (for the input) and grad-weight (for the weight) passes.
"""
from . import bias as _bias
from .buffers import ref
from .functional import conv2d, conv2d_weight
from .geometry import conv_geometry, pair
from .planner import cached_plan
from .validate import check_type, finish, pick_queue, prepare


def transpose_output_shape(input_shape, weight_shape, stride=1, padding=0, output_padding=0, groups=1,
                           dilation=1):
    """(N, Cout, Hout, Wout) of conv_transpose2d, Hout = (H-1)*s - 2*p + d*(kh-1) + output_padding + 1."""
    if len(input_shape) != 4 or len(weight_shape) != 4:
        raise ValueError(f"conv_transpose2d needs 4-D input (N, Cin, H, W) and weight (Cin, Cout/groups, kh, kw), "
                         f"got input {list(input_shape)} and weight {list(weight_shape)}")
    (sh, sw), (ph, pw) = pair(stride, "stride"), pair(padding, "padding")
    (oh, ow), (dh, dw) = pair(output_padding, "output_padding"), pair(dilation, "dilation")
    if min(sh, sw, dh, dw) <= 0 or min(ph, pw, oh, ow) < 0:
        raise ValueError(f"stride and dilation must be positive, padding and output_padding non-negative; got "
                         f"stride={stride}, padding={padding}, output_padding={output_padding}, dilation={dilation}")
    if not (oh < sh and ow < sw):   # (PyTorch also allows it below the dilation; clconv does not)
        raise ValueError(f"output_padding {(oh, ow)} must be smaller than the stride {(sh, sw)}")
    N, cin, H, W = input_shape
    if weight_shape[0] != cin:
        raise ValueError(f"Given transposed weight of size {list(weight_shape)}, expected input {list(input_shape)} "
                         f"to have {weight_shape[0]} channels, but got {cin} channels instead")
    kh, kw = weight_shape[2:]
    size = ((H - 1) * sh - 2 * ph + dh * (kh - 1) + oh + 1, (W - 1) * sw - 2 * pw + dw * (kw - 1) + ow + 1)
    if min(size) <= 0:
        raise ValueError(f"conv_transpose2d of input {list(input_shape)} with weight {list(weight_shape)} would have "
                         f"an empty output {size}")
    return (N, weight_shape[1] * groups) + size


def _conv_geometry(input_shape, weight_shape, stride, padding, output_padding, groups, dilation):
    """The convolution whose grad-input pass is this transposed convolution."""
    out = transpose_output_shape(input_shape, weight_shape, stride, padding, output_padding, groups, dilation)
    g = conv_geometry(out, weight_shape, stride, padding, dilation, groups)
    assert g.output_shape == tuple(input_shape), (g.output_shape, input_shape)
    return g


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *,
                     out=None, queue=None, allocator=None, math=None):
    """Transposed convolution: input (N, Cin, H, W), weight (Cin, Cout/groups, kh, kw), bias (Cout,)
    -> output (N, Cout, Hout, Wout), as torch.nn.functional.conv_transpose2d. ``math``: the math
    mode, None for the dtype's default (:mod:`clconv.precision`)."""
    check_type("input", input)
    check_type("weight", weight)
    g = _conv_geometry(input.shape, weight.shape, stride, padding, output_padding, groups, dilation)
    plan = cached_plan(g, input.dtype, pick_queue(queue, input, weight, bias, out), math=math)
    queue, dev, numpy_mode = prepare(queue, plan, {"input": input, "weight": weight, "bias": bias},
                                     {"input": g.output_shape, "weight": g.weight_shape, "bias": (g.C,)},
                                     out, g.input_shape, allocator)
    if g.N:
        plan.enqueue("backward_input", queue, ref(dev["weight"]), ref(dev["input"]), ref(dev["out"]),
                     allocator=allocator)
        if bias is not None:
            _bias.fill_bias(queue, plan.dtype, ref(dev["out"]), ref(dev["bias"]), g.N, g.C, g.H * g.W, add=True)
    return finish(queue, dev, out, numpy_mode)


def conv_transpose2d_input(input_size, weight, grad_output, stride=1, padding=0, output_padding=0, groups=1,
                           dilation=1, *, out=None, queue=None, allocator=None, math=None):
    """Gradient of conv_transpose2d for its input: weight (Cin, Cout/groups, kh, kw),
    grad_output (N, Cout, Hout, Wout) -> grad_input (N, Cin, H, W) of size ``input_size``."""
    check_type("weight", weight)
    check_type("grad_output", grad_output)
    g = _conv_geometry(tuple(input_size), weight.shape, stride, padding, output_padding, groups, dilation)
    if tuple(grad_output.shape) != g.input_shape:
        raise ValueError(f"grad_output of size {list(grad_output.shape)} does not match the output size "
                         f"{list(g.input_shape)} of conv_transpose2d of input {list(input_size)} with weight "
                         f"{list(weight.shape)}")
    return conv2d(grad_output, weight, None, stride, padding, dilation, groups, out=out, queue=queue,
                  allocator=allocator, math=math)


def conv_transpose2d_weight(input, weight_size, grad_output, stride=1, padding=0, output_padding=0, groups=1,
                            dilation=1, *, out=None, queue=None, allocator=None, math=None):
    """Gradient of conv_transpose2d for its weight: input (N, Cin, H, W), grad_output (N, Cout, Hout, Wout)
    -> grad_weight (Cin, Cout/groups, kh, kw) of size ``weight_size``."""
    check_type("input", input)
    check_type("grad_output", grad_output)
    g = _conv_geometry(input.shape, tuple(weight_size), stride, padding, output_padding, groups, dilation)
    if tuple(grad_output.shape) != g.input_shape:
        raise ValueError(f"grad_output of size {list(grad_output.shape)} does not match the output size "
                         f"{list(g.input_shape)} of conv_transpose2d of input {list(input.shape)} with weight "
                         f"{list(weight_size)}")
    return conv2d_weight(grad_output, weight_size, input, stride, padding, dilation, groups, out=out, queue=queue,
                         allocator=allocator, math=math)
