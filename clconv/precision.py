"""Math modes: in which format a plan's GEMMs multiply, shaped after PyTorch's
``torch.backends.cuda.matmul.allow_tf32`` and ``torch.set_float32_matmul_precision``.

- "strict": products and sums in the compute dtype (float32 for float16 arrays).
- "tf32": float32 arrays; operands rounded to TF32 (10 explicit mantissa bits), products on the
  matrix units, float32 sums.
- "fp16": float16 arrays; half operands, products on the matrix units, float32 sums.
- "bf16": BF16 operands (7 explicit mantissa bits); no array dtype asks for it yet: pyopencl arrays
  do not carry ml_dtypes' bfloat16.

Each dtype has a process-wide default (:func:`clconv.set_math`, :func:`clconv.get_math`): float32
"strict" (TF32 is opt-in, as for PyTorch's matmuls; ``CLCONV_MATH=tf32`` at import opts in),
float16 "fp16".
A call's or plan's ``math=`` overrides it (:func:`requested`); the plan then runs the mode only
where its GEMMs are clconv's GPU kernel on a device whose matrix units that kernel uses
(:func:`clconv.gemm.matrix_units`), and in float32 elsewhere, saying why (:func:`resolve`). What a
mode costs in accuracy is :func:`clconv.reference.tolerance`.
"""
import os

import numpy as np

from . import gemm, storage

MODES = ("strict", "tf32", "fp16", "bf16")
ALLOWED = {np.dtype(np.float64): ("strict",), np.dtype(np.float32): ("strict", "tf32"),
           np.dtype(np.float16): ("strict", "fp16")}
# what the GEMMs of a plan in each mode do, for explain()
DOES = {"tf32": "TF32 products on the matrix units, float32 sums",
        "fp16": "FP16 products on the matrix units, float32 sums",
        "bf16": "BF16 products on the matrix units, float32 sums"}

_defaults = {np.dtype(np.float64): "strict", np.dtype(np.float32): "strict", np.dtype(np.float16): "fp16"}


def allowed(dtype):
    """The modes arrays of ``dtype`` may ask for (ValueError for a dtype clconv does not run)."""
    found = ALLOWED.get(np.dtype(dtype))
    if found is None:
        raise ValueError(f"clconv runs float16, float32 and float64 arrays, not {np.dtype(dtype)}: no math modes")
    return found


def _checked(dtype, mode):
    modes = allowed(dtype)
    if mode not in modes:
        raise ValueError(f"{np.dtype(dtype)} arrays take math={' or '.join(map(repr, modes))}, not {mode!r} "
                         f"(modes: {', '.join(MODES)})")
    return mode


def requested(dtype, math=None):
    """The mode a call or plan on ``dtype`` arrays asks for: ``math``, else the dtype's default
    (:func:`clconv.get_math`); ValueError for a mode the dtype cannot ask for."""
    if math is None:
        allowed(dtype)
        return _defaults[np.dtype(dtype)]
    return _checked(dtype, math)


def default(dtype):
    """The current default mode of ``dtype`` in one dict look-up where it is a NumPy dtype (the
    functional API's per-call path); None for a dtype clconv does not run."""
    found = _defaults.get(dtype)
    if found is None and not isinstance(dtype, np.dtype):
        found = _defaults.get(np.dtype(dtype))
    return found


def set_math(mode, dtype=np.float32):
    """Make ``mode`` the default of calls and plans on ``dtype`` arrays that pass no ``math=``
    (plans made before keep theirs); returns the previous default. ValueError for a mode the dtype
    cannot ask for."""
    dtype = np.dtype(dtype)
    mode = _checked(dtype, mode)
    previous, _defaults[dtype] = _defaults[dtype], mode
    return previous


def get_math(dtype=np.float32):
    """The default mode of calls and plans on ``dtype`` arrays (:func:`clconv.set_math`)."""
    return requested(dtype)


def resolve(device, engine, dtype, mode):
    """(mode, reason) a plan runs for the requested ``mode`` with GEMM ``engine`` on ``device``:
    the mode where clconv's GPU kernel runs it there, else "strict" with why not."""
    plain = storage.compute_dtype(dtype).name
    if mode == "strict":
        return "strict", f"{plain} products and sums"
    if mode not in gemm.matrix_units(device):
        return "strict", f"{plain} products, with no matrix units for {mode} that clconv uses on {device.name.strip()}"
    if engine != "gpu":
        return "strict", f"{plain} products, as {mode} runs on clconv's GPU kernel only (GEMMs on {engine})"
    return mode, DOES[mode]


_variable = os.environ.get("CLCONV_MATH", "").strip().lower()
if _variable:
    try:
        set_math(_variable)
    except ValueError as exc:
        raise ValueError(f"CLCONV_MATH={_variable}: {exc}") from None
