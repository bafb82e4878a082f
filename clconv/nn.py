"""Modules that keep their parameters and gradients on the device, like Torch's nn.

Each module holds ``weight``, ``bias`` (or None), ``grad_weight`` and
``grad_bias`` as pyopencl arrays; ``backward`` adds into the gradients, so
several backward calls sum until ``zero_grad()``. Results come from the queue's
memory pool, or from the module's ``allocator``; a module keeps its plan per input size. A
module's ``math`` is the math mode of its passes (:mod:`clconv.precision`), None for the dtype's
default at each call (:func:`clconv.set_math`).
"""
from math import sqrt

import numpy as np
import pyopencl.array as cla

from . import memory, precision, storage
from .bias import relu_grad
from .buffers import ref
from .device import check_dtype_supported, default_queue
from .functional import conv2d_bias
from .geometry import normalize_padding, pair
from .planner import is_several, plan_for_call
from .recording import current_graph, not_capturable
from .validate import queue_context
from .transpose import conv_transpose2d, conv_transpose2d_input, conv_transpose2d_weight


class _ConvBase:
    _weight_shape = None   # set by subclasses

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, dtype, queue,
                 seed, allocator, math):
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels), ("groups", groups)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by "
                             f"groups ({groups})")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride, self.dilation = pair(stride, "stride"), pair(dilation, "dilation")
        self.padding = padding
        # a list of queues (devices of one context): Conv2d spreads its passes over them
        # (clconv.spread); arrays and results live on the first
        self.devices = tuple(queue) if is_several(queue) else None
        self.queue = (self.devices[0] if self.devices else queue) or default_queue()
        self.allocator = allocator
        self.dtype = np.dtype(dtype)
        check_dtype_supported(self.dtype, self.queue.device)
        precision.requested(self.dtype, math)   # a mode the dtype cannot ask for fails here, not at the first call
        self.math = math
        shape = self._weight_shape()
        fan_in = shape[1] * self.kernel_size[0] * self.kernel_size[1]   # PyTorch: weight.size(1) * kh * kw
        bound = 1 / sqrt(fan_in)   # kaiming_uniform(a=sqrt(5)) bound, as PyTorch's default
        rng = np.random.default_rng(seed)
        self.weight = cla.to_device(self.queue, rng.uniform(-bound, bound, shape).astype(self.dtype))
        self.grad_weight = cla.to_device(self.queue, np.zeros(shape, self.dtype))
        if bias:
            self.bias = cla.to_device(self.queue, rng.uniform(-bound, bound, out_channels).astype(self.dtype))
            self.grad_bias = cla.to_device(self.queue, np.zeros(out_channels, self.dtype))
        else:
            self.bias = self.grad_bias = None

    def __call__(self, x):
        return self.forward(x)

    def _to_device(self, a):
        if isinstance(a, cla.Array):
            return a
        if current_graph() is not None:
            raise TypeError("inside clconv.graph() a module's arrays must be pyopencl arrays, whose buffers a "
                            f"replay reuses; got {type(a).__name__}")
        return cla.to_device(self.queue, np.ascontiguousarray(a, self.dtype))

    def _accumulate(self, grad_weight, grad_output):
        storage.accumulate(self.queue, self.grad_weight, grad_weight)
        if self.bias is not None:
            storage.accumulate(self.queue, self.grad_bias,
                               conv2d_bias(grad_output, queue=self.queue, allocator=self.allocator))

    def zero_grad(self):
        """Set grad_weight and grad_bias to zero."""
        storage.zero(self.queue, self.grad_weight)
        if self.grad_bias is not None:
            storage.zero(self.queue, self.grad_bias)

    def parameters(self):
        """[weight, bias] (bias only when the module has one)."""
        return [p for p in (self.weight, self.bias) if p is not None]

    def load_numpy(self, weight, bias=None):
        """Copy NumPy weight (and bias) in, e.g. exported from a Caffe or PyTorch model."""
        weight = np.asarray(weight)
        if weight.shape != self.weight.shape:
            raise ValueError(f"weight of size {list(weight.shape)} does not fit {self!r}: expected "
                             f"{list(self.weight.shape)}")
        if (bias is None) != (self.bias is None):
            raise ValueError(f"{self!r} {'has' if self.bias is not None else 'has no'} bias")
        if bias is not None and np.shape(bias) != self.bias.shape:
            raise ValueError(f"bias of size {list(np.shape(bias))} does not fit {self!r}: expected "
                             f"{list(self.bias.shape)}")
        not_capturable(what="copies from the host (load_numpy)")
        self.weight.set(np.ascontiguousarray(weight, self.dtype))
        if bias is not None:
            self.bias.set(np.ascontiguousarray(bias, self.dtype))

    def state_dict(self):
        """{"weight": ndarray, "bias": ndarray} (bias only when the module has one)."""
        state = {"weight": self.weight.get()}
        if self.bias is not None:
            state["bias"] = self.bias.get()
        return state

    def __repr__(self):
        extra = "".join(f", {k}={v}" for k, v in self._repr_options().items())
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}{extra}, bias={self.bias is not None}, dtype={self.dtype})")


class Conv2d(_ConvBase):
    """2-D convolution: input (N, in_channels, H, W) -> (N, out_channels, OH, OW).

    weight (out_channels, in_channels/groups, kh, kw) and bias (out_channels,) are
    initialised as PyTorch does (uniform in +-1/sqrt(fan_in)); ``seed`` makes it repeatable.
    ``relu``: the output goes through max(., 0), fused into the pass that writes it; ``backward``
    then takes the gradient through it, using the output of the last ``forward``.
    ``queue``: a queue, or a list of queues on devices of one context, over which every pass
    is spread (:mod:`clconv.spread`); parameters and results live on the first.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 dtype=np.float32, queue=None, seed=None, allocator=None, relu=False, math=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, dtype,
                         queue, seed, allocator, math)
        normalize_padding(padding, (1, 1), self.kernel_size, self.stride, self.dilation)   # validate the form
        self.relu = bool(relu)
        self._plans = {}   # (input size, math mode asked for) -> plan
        self._output = None   # with relu: the last forward's output, for backward

    def _weight_shape(self):
        return (self.out_channels, self.in_channels // self.groups) + self.kernel_size

    def _repr_options(self):
        shown = {"padding": self.padding != 0, "dilation": self.dilation != (1, 1), "groups": self.groups != 1,
                 "relu": self.relu, "math": self.math is not None}
        return {k: getattr(self, k) for k, show in shown.items() if show}

    def _plan(self, input_shape):
        mode = precision.default(self.dtype) if self.math is None else self.math
        p = self._plans.get((input_shape, mode))
        if p is None:
            p = self._plans[input_shape, mode] = plan_for_call(input_shape, self.weight.shape, self.stride,
                                                               self.padding, self.dilation, self.groups, self.dtype,
                                                               self.devices or self.queue, (),
                                                               "auto", "single", "auto", mode)
        return p

    def forward(self, x):
        """output (N, out_channels, OH, OW) for x (N, in_channels, H, W) on the module's queue."""
        x = self._to_device(x)
        y = self._plan(x.shape).forward(x, self.weight, self.bias, queue=self.queue, allocator=self.allocator,
                                        relu=self.relu)
        if self.relu:
            self._output = y
        return y

    def backward(self, x, grad_output):
        """grad_input (N, in_channels, H, W); adds into grad_weight and grad_bias."""
        x, dy = self._to_device(x), self._to_device(grad_output)
        p = self._plan(x.shape)
        if self.relu:   # the gradient through the ReLU, from the last forward's output
            y = self._output
            if y is None or y.shape != dy.shape:
                raise ValueError(f"{self!r}: backward with grad_output of size {list(dy.shape)} needs the output of a "
                                 f"forward of that size first (its ReLU's gradient), got "
                                 f"{None if y is None else list(y.shape)}")
            masked = memory.empty(self.queue, queue_context(self.queue), dy.shape, dy.dtype, self.allocator)
            relu_grad(self.queue, dy.dtype, ref(dy), ref(y), ref(masked), dy.size)
            dy = masked
        grad_input = p.backward_input(self.weight, dy, queue=self.queue, allocator=self.allocator)
        self._accumulate(p.backward_weight(x, dy, queue=self.queue, allocator=self.allocator), dy)
        return grad_input


class ConvTranspose2d(_ConvBase):
    """Transposed 2-D convolution: input (N, in_channels, H, W) -> (N, out_channels, Hout, Wout).

    weight (in_channels, out_channels/groups, kh, kw), as PyTorch's ConvTranspose2d.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, dtype=np.float32, queue=None, seed=None, allocator=None, math=None):
        if is_several(queue):
            raise ValueError("ConvTranspose2d runs on one queue; got a list of queues (Conv2d spreads over several)")
        super().__init__(in_channels, out_channels, kernel_size, stride, pair(padding, "padding"), dilation, groups,
                         bias, dtype, queue, seed, allocator, math)
        self.output_padding = pair(output_padding, "output_padding")

    def _weight_shape(self):
        return (self.in_channels, self.out_channels // self.groups) + self.kernel_size

    def _repr_options(self):
        shown = {"padding": self.padding != (0, 0), "output_padding": self.output_padding != (0, 0),
                 "dilation": self.dilation != (1, 1), "groups": self.groups != 1, "math": self.math is not None}
        return {k: getattr(self, k) for k, show in shown.items() if show}

    def _options(self):
        return dict(stride=self.stride, padding=self.padding, output_padding=self.output_padding, groups=self.groups,
                    dilation=self.dilation, math=self.math)

    def forward(self, x):
        """output (N, out_channels, Hout, Wout) for x (N, in_channels, H, W)."""
        return conv_transpose2d(self._to_device(x), self.weight, self.bias, queue=self.queue, allocator=self.allocator,
                                **self._options())

    def backward(self, x, grad_output):
        """grad_input (N, in_channels, H, W); adds into grad_weight and grad_bias."""
        x, dy = self._to_device(x), self._to_device(grad_output)
        opts = dict(queue=self.queue, allocator=self.allocator, **self._options())
        grad_input = conv_transpose2d_input(x.shape, self.weight, dy, **opts)
        self._accumulate(conv_transpose2d_weight(x, self.weight.shape, dy, **opts), dy)
        return grad_input


def from_torch(torch_module, queue=None, dtype=np.float32):
    """{name: :class:`Conv2d`} for every ``torch.nn.Conv2d`` inside ``torch_module`` (as
    ``named_modules`` lists them, ``""`` for the module itself), with the layer's options and a
    copy of its weight and bias; :func:`to_torch` copies them back."""
    import torch   # only for reading a PyTorch model
    convs = {}
    for name, layer in torch_module.named_modules():
        if type(layer) is torch.nn.ConvTranspose2d or not isinstance(layer, torch.nn.Conv2d):
            continue
        if layer.padding_mode != "zeros":
            raise ValueError(f"{name or type(torch_module).__name__}: padding_mode {layer.padding_mode!r} is not "
                             "supported (only 'zeros')")
        conv = Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, layer.padding,
                      layer.dilation, layer.groups, bias=layer.bias is not None, dtype=dtype, queue=queue)
        with torch.no_grad():
            conv.load_numpy(layer.weight.detach().cpu().numpy(),
                            None if layer.bias is None else layer.bias.detach().cpu().numpy())
        convs[name] = conv
    return convs


def to_torch(convs, torch_module):
    """Copy the weight and bias of each :class:`Conv2d` in ``convs`` ({name: module}, as
    :func:`from_torch` gives) into the ``torch.nn.Conv2d`` of that name in ``torch_module``."""
    import torch
    layers = dict(torch_module.named_modules())
    for name, conv in convs.items():
        layer = layers.get(name)
        if not isinstance(layer, torch.nn.Conv2d):
            raise ValueError(f"{type(torch_module).__name__} has no Conv2d named {name!r}")
        state = conv.state_dict()
        if tuple(layer.weight.shape) != state["weight"].shape or (layer.bias is None) != ("bias" not in state):
            raise ValueError(f"{name}: {conv!r} does not fit {layer}")
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(state["weight"]))
            if layer.bias is not None:
                layer.bias.copy_(torch.from_numpy(state["bias"]))
