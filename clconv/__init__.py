"""clconv: grouped 2-D convolution (forward and all gradients) on any OpenCL device.

Our own OpenCL kernels (im2col/col2im, Winograd transforms, direct grouped convolution) plus
CLBlast GEMM, on pyopencl arrays.
"""
from . import nn, reference
from .device import DeviceNotFound, default_context, default_queue, device_queues, pick_device, sub_device_queues
from .functional import conv2d, conv2d_bias, conv2d_input, conv2d_weight
from .geometry import ConvGeometry, conv_geometry, normalize_padding, output_size
from .graph import Graph, graph
from .plan import Plan
from .planner import plan
from .precision import get_math, set_math
from .prepare import prepare
from .programs import ClconvError
from .transpose import conv_transpose2d, conv_transpose2d_input, conv_transpose2d_weight
from .memory import free_memory, memory_pool, memory_stats

__version__ = "0.1.0"

__all__ = ["conv2d", "conv2d_input", "conv2d_weight", "conv2d_bias", "conv_transpose2d", "conv_transpose2d_input",
           "conv_transpose2d_weight", "nn", "plan", "Plan", "prepare", "reference",
           "default_context", "default_queue", "device_queues", "sub_device_queues", "pick_device", "DeviceNotFound",
           "ClconvError", "ConvGeometry", "conv_geometry", "normalize_padding", "output_size", "free_memory",
           "memory_pool", "memory_stats", "graph", "Graph", "set_math", "get_math"]
