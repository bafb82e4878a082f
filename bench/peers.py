"""What users would otherwise run, timed side by side with clconv.

- PyTorch: torch.nn.functional.conv2d and torch.ops.aten.convolution_backward
  (on CUDA with TF32 off and cudnn.benchmark on, when the OpenCL device is a GPU
  and CUDA is there; otherwise on the CPU).
- NumPy: clconv.reference (im2col + BLAS matmul in float64), forward only.
- For the GEMM benchmark, the same products through NumPy's and PyTorch's matmul on the host.
- CLBlast convgemm looped over (image, group): the approach of the Torch OpenCL
  backend, through CLBlast's C API with ctypes.
Each peer returns what to time ({pass: callable}; torch also its sync and label), or a
string saying why it cannot run here.
"""
import ctypes
import ctypes.util

import numpy as np
import pyopencl as cl

from clconv import reference


def _pair(value):
    """(h, w) from an int or an (h, w) pair, as PyTorch takes stride, padding and dilation."""
    return (int(value[0]), int(value[1])) if isinstance(value, (tuple, list)) else (int(value),) * 2


def torch_peer(w, ocl_device, arrays, tf32=False):
    """{pass: fn} running PyTorch, the synchronize function, and a label; or a reason string.

    ``w``: the sizes (N, C, H, W, K, kh, kw, groups) and stride, padding, dilation, each an int
    or an (h, w) pair (symmetric padding per axis, as PyTorch's); ``arrays``: NumPy x, w, dy.
    Each fn returns PyTorch's result: the output, or convolution_backward's (grad_input,
    grad_weight, grad_bias) with only the asked-for gradient computed. On a GPU, cuDNN with TF32
    allowed where ``tf32`` (PyTorch's own default), else off; float16 arrays run as half tensors.
    """
    try:
        import torch
    except ImportError:
        return "PyTorch not installed"
    on_gpu = bool(ocl_device.type & cl.device_type.GPU) and torch.cuda.is_available()
    dev = torch.device("cuda" if on_gpu else "cpu")
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
    x, wt, dy = (torch.from_numpy(a).to(dev) for a in (arrays["x"], arrays["w"], arrays["dy"]))
    s, p, d, g = _pair(w["stride"]), _pair(w["padding"]), _pair(w["dilation"]), w["groups"]

    def backward(mask):
        return lambda: torch.ops.aten.convolution_backward(dy, x, wt, None, s, p, d, False, (0, 0), g, mask)

    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    label = f"torch-{'cudnn' if on_gpu else 'cpu'}" + ("-tf32" if tf32 and on_gpu else "")
    fns = {"forward": lambda: torch.nn.functional.conv2d(x, wt, None, s, p, d, g),
           "backward_input": backward([True, False, False]),
           "backward_weight": backward([False, True, False])}
    return fns, sync, label


def matmul_peers(opa, opb):
    """{name: fn}: op(A) @ op(B) of NumPy arrays through NumPy's matmul (its BLAS) and, where it
    imports, PyTorch's (its own BLAS, on every core: the best host GEMM a user has at hand)."""
    found = {"numpy": lambda: np.matmul(opa, opb)}
    try:
        import torch
    except ImportError:
        return found
    ta, tb = torch.from_numpy(opa), torch.from_numpy(opb)
    found["torch"] = lambda: torch.matmul(ta, tb)
    return found


def cuda_matmul_peer(opa, opb, math="strict"):
    """{"torch-cuda": fn}: op(A) @ op(B) through PyTorch on CUDA (cuBLAS) in the math mode
    ``math`` (TF32 allowed for "tf32", half or bfloat16 tensors for "fp16" or "bf16"), each call
    synchronised; {} where PyTorch has no CUDA."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    torch.backends.cuda.matmul.allow_tf32 = math == "tf32"
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(math, torch.float32)
    ta, tb = (torch.from_numpy(x.copy()).to("cuda", dtype) for x in (opa, opb))

    def run():
        torch.matmul(ta, tb)
        torch.cuda.synchronize()
    return {"torch-cuda": run}


def numpy_peer(w, arrays):
    opts = dict(stride=w["stride"], padding=w["padding"], dilation=w["dilation"], groups=w["groups"])
    return {"forward": lambda: reference.conv2d(arrays["x"], arrays["w"], **opts)}


class _CLBlast:
    """CLBlastSconvgemm through ctypes, argument types declared."""

    def __init__(self):
        path = ctypes.util.find_library("clblast") or "libclblast.so.1"
        self.lib = ctypes.CDLL(path)
        f = self.lib.CLBlastSconvgemm
        size = ctypes.c_size_t
        f.argtypes = ([ctypes.c_int] + [size] * 13 + [ctypes.c_void_p, size] * 3
                      + [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)])
        f.restype = ctypes.c_int
        self.convgemm = f


CROSS_CORRELATION = 151


def clblast_loop_peer(w, queue, dev_arrays, y):
    """forward: one CLBlast convgemm per (image, group), offsets into the shared buffers."""
    try:
        blas = _CLBlast()
    except OSError as exc:
        return f"CLBlast C library not loadable: {exc}"
    N, C, H, W, K, kh, kw = (w[k] for k in ("N", "C", "H", "W", "K", "kh", "kw"))
    G = w["groups"]
    Cg, Kg = C // G, K // G
    OH, OW = y.shape[2:]
    q = ctypes.c_void_p(queue.int_ptr)
    bufs = [ctypes.c_void_p(a.base_data.int_ptr) for a in (dev_arrays["x"], dev_arrays["w"], y)]

    def run():
        for n in range(N):
            for g in range(G):
                event = ctypes.c_void_p()
                status = blas.convgemm(CROSS_CORRELATION, Cg, H, W, kh, kw, w["padding"], w["padding"],
                                       w["stride"], w["stride"], w["dilation"], w["dilation"], Kg, 1,
                                       bufs[0], (n * C + g * Cg) * H * W, bufs[1], g * Kg * Cg * kh * kw,
                                       bufs[2], (n * K + g * Kg) * OH * OW, ctypes.byref(q), ctypes.byref(event))
                if status != 0:
                    raise RuntimeError(f"CLBlastSconvgemm failed with status {status}")
                cl.Event.from_int_ptr(event.value, retain=False)
    return {"forward": run}
