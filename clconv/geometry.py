"""Shape rules shared by the library, the NumPy reference and the tests.

One output-size rule (:func:`output_size`), one padding normaliser
(:func:`normalize_padding`) and one validator (:func:`conv_geometry`).
Everything here is pure Python: nothing touches a device.
"""
from dataclasses import dataclass
from numbers import Integral

from . import limits


PASSES = ("forward", "backward_input", "backward_weight")   # every plan's passes, in this order


def _is_int(v):
    return isinstance(v, Integral) and not isinstance(v, bool)


def pair(value, name):
    """Return ``(h, w)`` from an int or a pair of ints (``stride``, ``dilation``)."""
    if _is_int(value):
        return (int(value), int(value))
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) for v in value):
        return (int(value[0]), int(value[1]))
    raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")


def output_size(size, kernel, stride, pad_lo, pad_hi, dilation):
    """Output length along one axis: the one rule used everywhere."""
    return (size + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1


def normalize_padding(padding, in_hw, kernel_hw, stride, dilation):
    """Return ``((top, bottom), (left, right))`` for every accepted padding form.

    Accepted: int, ``(ph, pw)``, ``((top, bottom), (left, right))``, ``'valid'``
    and ``'same'`` (output = ceil(input / stride) for any stride, the odd extra
    pixel going to bottom/right as TensorFlow does).
    """
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return ((0, 0), (0, 0))
        if mode == "same":
            pads = []
            for size, k, s, d in zip(in_hw, kernel_hw, stride, dilation):
                out = -(-size // s)
                total = max((out - 1) * s + d * (k - 1) + 1 - size, 0)
                pads.append((total // 2, total - total // 2))
            return tuple(pads)
        raise ValueError(f"padding must be an int, a pair, a pair of pairs, 'same' or 'valid'; got {padding!r}")
    if _is_int(padding):
        pads = ((padding, padding), (padding, padding))
    elif isinstance(padding, (tuple, list)) and len(padding) == 2:
        if all(_is_int(p) for p in padding):
            pads = ((padding[0], padding[0]), (padding[1], padding[1]))
        elif all(isinstance(p, (tuple, list)) and len(p) == 2 and all(_is_int(v) for v in p) for p in padding):
            pads = tuple((p[0], p[1]) for p in padding)
        else:
            raise TypeError(f"padding must be an int, a pair, a pair of pairs, 'same' or 'valid'; got {padding!r}")
    else:
        raise TypeError(f"padding must be an int, a pair, a pair of pairs, 'same' or 'valid'; got {padding!r}")
    pads = tuple((int(a), int(b)) for a, b in pads)
    if any(v < 0 for p in pads for v in p):
        raise ValueError(f"padding must be non-negative, got {padding!r}")
    return pads


@dataclass(frozen=True)
class ConvGeometry:
    """All sizes of one grouped convolution, validated.

    input (N, C, H, W), weight (K, C/groups, kh, kw), output (N, K, OH, OW).
    """
    N: int
    C: int
    H: int
    W: int
    K: int
    kh: int
    kw: int
    groups: int
    stride: tuple
    dilation: tuple
    pads: tuple        # ((top, bottom), (left, right))
    OH: int
    OW: int

    @property
    def input_shape(self):
        return (self.N, self.C, self.H, self.W)

    @property
    def weight_shape(self):
        return (self.K, self.C // self.groups, self.kh, self.kw)

    @property
    def output_shape(self):
        return (self.N, self.K, self.OH, self.OW)

    @property
    def Cg(self):
        """Input channels per group."""
        return self.C // self.groups

    @property
    def Kg(self):
        """Output channels (filters) per group."""
        return self.K // self.groups

    @property
    def Kd(self):
        """GEMM inner size per group: Cg * kh * kw."""
        return self.Cg * self.kh * self.kw

    @property
    def P(self):
        """Output pixels per image: OH * OW."""
        return self.OH * self.OW

    def transposed(self):
        """The stride-1 convolution whose forward pass is this one's grad-input (stride 1 only):
        grad_output (N, K, OH, OW) in, grad_input (N, C, H, W) out, each group's filters as its
        channels, weights rotated 180 degrees, padding (k-1)*dilation - pad per side (negative
        pads shift the window; every kernel bounds-checks its reads)."""
        assert self.stride == (1, 1), "only a stride-1 grad-input is a convolution of grad_output"
        (pt, pb), (pl, pr) = self.pads
        dh, dw = self.dilation
        eh, ew = dh * (self.kh - 1), dw * (self.kw - 1)
        return ConvGeometry(self.N, self.K, self.OH, self.OW, self.C, self.kh, self.kw, self.groups, (1, 1),
                            self.dilation, ((eh - pt, eh - pb), (ew - pl, ew - pr)), self.H, self.W)

    def flops(self):
        """Multiply-adds x 2 of one pass (the same for forward, grad-input, grad-weight)."""
        return 2 * self.N * self.K * self.P * self.Kd

    def pass_shapes(self):
        """Per pass, ({argument: its size}, the result's size), as every plan checks its calls."""
        return {"forward": ({"input": self.input_shape, "weight": self.weight_shape, "bias": (self.K,)},
                            self.output_shape),
                "backward_input": ({"weight": self.weight_shape, "grad_output": self.output_shape}, self.input_shape),
                "backward_weight": ({"input": self.input_shape, "grad_output": self.output_shape}, self.weight_shape)}


def _shape(s):
    return list(s)


_memo = {}    # repr(arguments) -> ConvGeometry: each functional call validates its arguments (limits.GEOMETRIES_KEPT)


def conv_geometry(input_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1):
    """Validate a convolution's sizes and options; return a :class:`ConvGeometry`.

    Raises ``ValueError``/``TypeError`` naming the shapes and what was expected.
    Valid arguments are remembered: checking them again costs host time on every call.
    """
    args = (input_shape, weight_shape, stride, padding, dilation, groups)
    # only plain ints, strings and tuples/lists of them are remembered, keyed by repr (which
    # tells apart what the checks do: 1, True, [1], (1,)); anything else is checked every time
    key = repr(args) if _plain(args) else None
    g = _memo.get(key)
    if g is None:
        g = _conv_geometry(*args)
        if key is not None and len(_memo) < limits.GEOMETRIES_KEPT:
            _memo[key] = g
    return g


def _plain(value):
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return type(value) in (int, str)


def _conv_geometry(input_shape, weight_shape, stride, padding, dilation, groups):
    input_shape, weight_shape = tuple(input_shape), tuple(weight_shape)
    if len(weight_shape) != 4:
        raise ValueError(f"weight must be 4-D (K, C/groups, kh, kw), got weight of size {_shape(weight_shape)}")
    if len(input_shape) != 4:
        raise ValueError(f"Expected 4-D input (N, C, H, W) for 4-D weight {_shape(weight_shape)}, "
                         f"but got input of size {_shape(input_shape)}")
    if not all(_is_int(v) for v in input_shape + weight_shape):
        raise TypeError(f"shapes must be integers, got input {input_shape} and weight {weight_shape}")
    if not _is_int(groups):
        raise TypeError(f"groups must be an int, got {groups!r}")
    if groups <= 0:
        raise ValueError(f"non-positive groups is not supported, got groups={groups}")
    stride, dilation = pair(stride, "stride"), pair(dilation, "dilation")
    if min(stride) <= 0:
        raise ValueError(f"non-positive stride is not supported, got stride={stride}")
    if min(dilation) <= 0:
        raise ValueError(f"dilation must be positive, got dilation={dilation}")
    N, C, H, W = input_shape
    K, Cg, kh, kw = weight_shape
    if min(weight_shape) <= 0:
        raise ValueError(f"weight has a zero or negative dimension: weight of size {_shape(weight_shape)} "
                         f"for input of size {_shape(input_shape)}")
    if N < 0 or min(C, H, W) <= 0:
        raise ValueError(f"input has a zero or negative dimension: input of size {_shape(input_shape)} "
                         f"for weight of size {_shape(weight_shape)} (only the batch N may be 0)")
    if K % groups:
        raise ValueError(f"Given groups={groups}, expected weight {_shape(weight_shape)} to have out_channels "
                         f"divisible by groups, but got {K} out_channels")
    if C % groups:
        raise ValueError(f"Given groups={groups}, expected input {_shape(input_shape)} to have in_channels "
                         f"divisible by groups, but got {C} channels")
    if Cg * groups != C:
        raise ValueError(f"Given groups={groups}, weight of size {_shape(weight_shape)}, expected input"
                         f"{_shape(input_shape)} to have {Cg * groups} channels, but got {C} channels instead")
    pads = normalize_padding(padding, (H, W), (kh, kw), stride, dilation)
    OH = output_size(H, kh, stride[0], *pads[0], dilation[0])
    OW = output_size(W, kw, stride[1], *pads[1], dilation[1])
    if OH <= 0 or OW <= 0:
        eff = (dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1)
        padded = (H + sum(pads[0]), W + sum(pads[1]))
        raise ValueError(f"Calculated padded input size per channel: ({padded[0]} x {padded[1]}). "
                         f"Kernel size (dilated): ({eff[0]} x {eff[1]}). Kernel size can't be greater than "
                         f"actual input size (input {_shape(input_shape)}, weight {_shape(weight_shape)})")
    return ConvGeometry(N, C, H, W, K, kh, kw, groups, stride, dilation, pads, OH, OW)


def check_grad_output(geom, grad_output_shape):
    """Raise unless ``grad_output_shape`` is the output shape of ``geom``."""
    if tuple(grad_output_shape) != geom.output_shape:
        raise ValueError(f"grad_output of size {_shape(grad_output_shape)} does not match the output size "
                         f"{_shape(geom.output_shape)} of input {_shape(geom.input_shape)} convolved with weight "
                         f"{_shape(geom.weight_shape)} (stride={geom.stride}, padding={geom.pads}, "
                         f"dilation={geom.dilation}, groups={geom.groups})")
