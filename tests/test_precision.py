"""Math modes (clconv.precision): what each dtype may ask for, the process-wide defaults, where a
plan runs a mode and where it falls back to float32 saying why, the tolerance each mode is held to,
and the modes' results against the float64 reference on the matrix units (the device's, or the GPU
kernel's emulation of them)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

import clconv
from clconv import gemm, precision, reference, rules, selfcheck, tuning
from clconv.algorithms import base, transform
from clconv.geometry import PASSES, conv_geometry
from clconv.planner import plan_for_call
from helpers import Case, assert_close, assert_float16_passes, matrix_units, stand_in_gpu

ROOT = Path(__file__).resolve().parents[1]
F16, F32, F64 = (np.dtype(t) for t in (np.float16, np.float32, np.float64))
CASE = Case("g2_d2_k3x2_odd", 2, 6, 13, 11, 8, 3, 2, padding=(1, 2), dilation=2, groups=2)


@pytest.fixture
def restore_math():
    """Every dtype's default mode as it was before the test, after it."""
    saved = {t: clconv.get_math(t) for t in (F16, F32, F64)}
    yield
    for t, mode in saved.items():
        clconv.set_math(mode, t)


@pytest.fixture
def with_units(monkeypatch):
    """Devices that "have" matrix units clconv uses for tf32: for choices and explain() only, as
    the real kernels for them build on NVIDIA's driver alone."""
    monkeypatch.setattr(gemm, "matrix_units", lambda device: frozenset({"tf32"}))


def _has(queue, mode):
    return mode in gemm.matrix_units(queue.device)


@pytest.mark.parametrize("dtype, mode", [(F32, "fp16"), (F32, "bf16"), (F64, "tf32"), (F16, "tf32"),
                                         (F16, "bf16"), (F32, "fast")], ids=str)
def test_a_mode_the_dtype_cannot_ask_for_is_refused(dtype, mode, queue, restore_math):
    allowed = " or ".join(map(repr, precision.ALLOWED[dtype]))
    words = f"{dtype} arrays take math={allowed}, not '{mode}'"
    asks = [lambda: precision.requested(dtype, mode), lambda: clconv.set_math(mode, dtype)]
    if dtype != F64 or "cl_khr_fp64" in queue.device.extensions:
        asks.append(lambda: clconv.plan(CASE.input_shape, CASE.weight_shape, **CASE.options, dtype=dtype,
                                        queue=queue, math=mode))
    for ask in asks:
        with pytest.raises(ValueError) as info:
            ask()
        assert words in str(info.value)
    assert clconv.get_math(dtype) == {F16: "fp16"}.get(dtype, "strict")   # the refused mode left it as it was


def test_a_dtype_clconv_does_not_run_has_no_modes():
    with pytest.raises(ValueError, match="not int32: no math modes"):
        precision.requested(np.int32, None)
    with pytest.raises(ValueError, match="not int32: no math modes"):
        clconv.get_math(np.int32)


def test_defaults_and_set_math(restore_math):
    assert (clconv.get_math(), clconv.get_math(F16), clconv.get_math(F64)) == ("strict", "fp16", "strict")
    assert clconv.set_math("tf32") == "strict"
    assert clconv.get_math(np.float32) == precision.requested(F32) == precision.default(np.float32) == "tf32"
    assert clconv.set_math("strict", np.float16) == "fp16" and clconv.get_math(np.float16) == "strict"
    assert clconv.set_math("strict") == "tf32" and clconv.get_math() == "strict"
    assert precision.requested(F32, "tf32") == "tf32"   # a call's own mode over the default


@pytest.mark.parametrize("value, shown", [("tf32", "tf32"), ("", "strict")])
def test_clconv_math_sets_float32s_default_at_import(value, shown):
    env = dict(os.environ, CLCONV_MATH=value)
    out = subprocess.run([sys.executable, "-c", "import clconv; print(clconv.get_math())"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == shown, out.stderr
    bad = subprocess.run([sys.executable, "-c", "import clconv"], cwd=ROOT, env=dict(os.environ, CLCONV_MATH="fp16"),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "CLCONV_MATH=fp16: float32 arrays take math='strict' or 'tf32'" in bad.stderr


def test_tolerance_comes_from_the_format():
    assert reference.tolerance(F32) == reference.TOLERANCE[F32] == 1e-4
    assert reference.tolerance(F64, "strict") == 1e-10
    assert reference.tolerance(F32, "tf32") == 4 * 2.0 ** -11 == pytest.approx(2e-3, rel=0.03)
    assert reference.tolerance(F32, "bf16") == 4 * 2.0 ** -8 == pytest.approx(1.6e-2, rel=0.03)
    assert reference.tolerance(F16, "fp16") == reference.TOLERANCE[F16] == 2e-3   # never below the dtype's own
    for dtype in (F16, F32):
        for mode in precision.MODES:
            assert reference.tolerance(dtype, mode) >= reference.TOLERANCE[dtype]


def test_resolve_runs_a_mode_only_on_clconvs_gpu_kernel_with_units(queue, with_units):
    device = queue.device
    assert precision.resolve(device, "gpu", F32, "tf32") == ("tf32", "TF32 products on the matrix units, float32 sums")
    mode, why = precision.resolve(device, "clblast", F32, "tf32")
    assert mode == "strict" and why == "float32 products, as tf32 runs on clconv's GPU kernel only (GEMMs on clblast)"
    mode, why = precision.resolve(device, "gpu", F16, "fp16")   # the stand-in has units for tf32 only
    assert mode == "strict" and why.startswith("float32 products, with no matrix units for fp16 that clconv uses on")
    assert precision.resolve(device, "gpu", F64, "strict") == ("strict", "float64 products and sums")


def test_a_cpu_device_runs_tf32_in_float32_and_says_why(queue, restore_math):
    if _has(queue, "tf32"):
        pytest.skip(f"{queue.device.name.strip()} has matrix units clconv uses for tf32")
    x, w, b, dy = CASE.data()
    p = clconv.plan(x.shape, w.shape, **CASE.options, queue=queue, algorithm="im2col", math="tf32")
    assert (p.math_request, p.math) == ("tf32", "strict")
    e = p.explain()
    assert e.header["math"] == "float32" and e.header["math_request"] == "tf32"
    assert f"no matrix units for tf32 that clconv uses on {queue.device.name.strip()}" in e.header["math_reason"]
    assert "\nmath tf32: float32 products, with no matrix units for tf32" in e
    assert all(r.math == "float32" for r in e.records)
    opts = CASE.options
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **opts), F32, "forward")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), F32, "grad-input")
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), F32, "grad-weight")
    # the default asked for: its plans say nothing of math
    assert "\nmath " not in clconv.plan(x.shape, w.shape, **opts, queue=queue).explain()


def test_float16_arrays_ask_for_fp16_and_run_it_where_the_device_can(queue):
    p = clconv.plan(CASE.input_shape, CASE.weight_shape, **CASE.options, dtype=np.float16, queue=queue)
    assert p.math_request == "fp16"
    if not (_has(queue, "fp16") and p.gemm == "gpu"):
        assert p.math == "strict" and p.explain().header["math"] == "float32 (stored float16)"
        assert "\nmath fp16: float32 products" in p.explain()
    x, w, b, dy = CASE.data(np.float16)
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **CASE.options), F16, "forward", p.math)


def test_explain_names_each_pass_mode_on_a_gpu_with_units(queue, with_units):
    """With tf32 granted (a stand-in GPU with units, clconv's GPU kernel), the GEMM passes of
    im2col run it; Winograd's stay float32 and say why; direct has no GEMMs. Plans only: no
    kernel runs."""
    gpu = stand_in_gpu(queue, 132)
    g = conv_geometry((2, 16, 13, 11), (16, 16, 3, 3), padding=1)
    plans = {a: clconv.Plan(g, np.float32, gpu, algorithm=a, gemm="gpu", math="tf32", selfcheck=False)
             for a in ("im2col", "winograd")}
    for p in plans.values():
        assert p.math == "tf32" and p.explain().header["math"] == "tf32"
        assert "\nmath tf32: TF32 products on the matrix units, float32 sums" in p.explain()
    assert {r.math for r in plans["im2col"].explain().records} == {"tf32"}
    for r in plans["winograd"].explain().records:
        assert r.math == "float32" and transform.Transform.STRICT_NOTE in r.notes
    depthwise = conv_geometry((2, 6, 13, 11), (6, 1, 3, 3), padding=1, groups=6)
    direct = clconv.Plan(depthwise, np.float32, gpu, algorithm="direct", gemm="gpu", math="tf32", selfcheck=False)
    assert {r.math for r in direct.explain().records} == {"float32"}
    assert not any(r.notes.count(transform.Transform.STRICT_NOTE) for r in direct.explain().records)


@pytest.mark.gpu_form
@pytest.mark.parametrize("case, algorithm, mode", [(CASE, "im2col", "tf32"),
                                                   (Case("k3x3_p1", 2, 8, 9, 7, 6, 3, 3, padding=1), "winograd",
                                                    "strict")], ids=lambda v: getattr(v, "name", v))
def test_algorithms_hand_their_mode_to_every_gemm(queue, with_units, monkeypatch, case, algorithm, mode):
    """Each GEMM of a tf32 plan is asked for tf32 (Winograd's for strict); run here in strict
    math (the tf32 kernel builds on NVIDIA's driver only), checked against the reference."""
    asked = []

    def recording(real):
        def grid_gemm(*args, math="strict", **kw):
            asked.append(math)
            real(*args, math="strict", **kw)
        return grid_gemm
    monkeypatch.setattr(base, "grid_gemm", recording(base.grid_gemm))
    monkeypatch.setattr(transform, "grid_gemm", recording(transform.grid_gemm))
    x, w, b, dy = case.data()
    opts = case.options
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **opts), np.float32, stand_in_gpu(queue, 132),
                    algorithm=algorithm, gemm="gpu", math="tf32", selfcheck=False)
    assert_close(p.forward(x, w, b, queue=queue), reference.conv2d(x, w, b, **opts), F32, "forward")
    assert_close(p.backward_weight(x, dy, queue=queue), reference.conv2d_weight(x, w.shape, dy, **opts), F32,
                 "grad-weight")
    assert asked and set(asked) == {mode}, asked


def test_changing_the_default_changes_the_plan_of_a_call(queue, restore_math):
    x, w, _, _ = CASE.data()
    opts = CASE.options

    def call_plan(math=None):
        return plan_for_call(x.shape, w.shape, opts["stride"], opts["padding"], opts["dilation"], opts["groups"],
                             x.dtype, queue, (x, w), "auto", "single", "auto", math)
    strict = call_plan()
    clconv.set_math("tf32")
    tf32 = call_plan()
    assert tf32 is not strict and (strict.math_request, tf32.math_request) == ("strict", "tf32")
    assert tf32 is call_plan("tf32") and strict is call_plan("strict")
    assert "math tf32:" in tf32.explain() and "math tf32:" not in strict.explain()
    clconv.set_math("strict")
    assert call_plan() is strict
    # modules follow the default too, unless given a mode of their own
    clconv.set_math("tf32")
    follows, own = clconv.nn.Conv2d(6, 8, (3, 2), queue=queue), clconv.nn.Conv2d(6, 8, (3, 2), queue=queue,
                                                                                 math="strict")
    assert follows._plan((2, 6, 13, 11)).math_request == "tf32" and own._plan((2, 6, 13, 11)).math_request == "strict"
    with pytest.raises(ValueError, match="float32 arrays take math="):
        clconv.nn.Conv2d(6, 8, 3, queue=queue, math="fp16")


def test_verdicts_and_tunings_are_kept_per_mode(queue, tmp_path, monkeypatch):
    monkeypatch.setenv("CLCONV_CACHE_DIR", str(tmp_path))
    selfcheck.forget()
    d = queue.device
    strict, tf32 = selfcheck.key(d, "im2col", "gpu", F32), selfcheck.key(d, "im2col", "gpu", F32, "tf32")
    assert strict.split("|")[5] == "gpu" and tf32.split("|")[5] == "gpu+tf32"
    assert strict == selfcheck.key(d, "im2col", "gpu", F32, "strict") and len(tf32.split("|")) == 7
    selfcheck.store(d, "im2col", "gpu", F32, [("im2col", "forward", 1e-3, True, "")], "tf32")
    selfcheck.store(d, "im2col", "gpu", F32, [("im2col", "forward", 1e-6, True, "")])
    assert set(selfcheck.stored(d)) == {("float32", "im2col", "gpu+tf32"), ("float32", "im2col", "gpu")}
    selfcheck.forget()
    g = conv_geometry(CASE.input_shape, CASE.weight_shape, **CASE.options)
    assert tuning.entry_key(d, F32, g, "forward") == tuning.entry_key(d, F32, g, "forward", "strict")
    assert tuning.entry_key(d, F32, g, "forward", "tf32") == tuning.entry_key(d, F32, g, "forward") + "|tf32"


# -- on the matrix units: the device's, or the GPU kernel's emulation of them ---------------------

# the passes that read float16 arrays as they are, per case: on a CPU device (im2col's CPU row
# kernels gather in float: only its GEMM-only passes), and on a GPU (its GPU forms gather half too;
# as planned for a stand-in of 132 compute units)
HALF_AS_THEY_ARE = {"cpu": {"1x1_g3": PASSES, "fc_g2": PASSES, "im2col_in_place_g2": ("forward", "backward_weight")},
                    "gpu": {"1x1_g3": PASSES, "fc_g2": PASSES, "im2col_in_place_g2": PASSES, "im2col_g3_s2": PASSES,
                            "im2col_g2_d2": ("forward", "backward_input")}}
GPU_CASES = [  # odd, non-square, groups and dilation; each algorithm whose GEMMs take a mode; per-group queues
    (Case("im2col_g2_d2", 2, 24, 17, 13, 40, 3, 2, padding=(1, 2), dilation=2, groups=2), "im2col", "single"),
    (Case("im2col_g3_s2", 2, 21, 15, 12, 33, 3, 3, stride=2, padding=1, groups=3), "im2col", "per-group"),
    (Case("1x1_g3", 2, 48, 13, 11, 24, 1, 1, groups=3), "1x1", "single"),
    (Case("im2col_in_place_g2", 3, 6, 15, 11, 10, 3, 3, stride=(1, 2), padding=1, groups=2), "im2col", "single"),
    (Case("fc_g2", 7, 64, 5, 3, 40, 5, 3, groups=2), "fc", "single"),
]


@pytest.mark.gpu_form
@pytest.mark.parametrize("dtype, mode", [(F32, "tf32"), (F16, "fp16")], ids=str)
@pytest.mark.parametrize("case, algorithm, queues", GPU_CASES, ids=lambda v: getattr(v, "name", v))
def test_matrix_units_against_the_reference(queue, monkeypatch, case, algorithm, queues, dtype, mode):
    """Each pass in the mode within its tolerance, on clconv's GPU kernel (the device's matrix
    units, or the kernel's emulation of them: :func:`helpers.matrix_units`); not bit-equal to
    strict math (the units ran); strict within the dtype's own tolerance."""
    matrix_units(queue, monkeypatch, mode)
    x, w, b, dy = case.data(dtype)
    opts = case.options
    want = {"forward": reference.conv2d(x, w, b, **opts),
            "grad-input": reference.conv2d_input(x.shape, w, dy, **opts),
            "grad-weight": reference.conv2d_weight(x, w.shape, dy, **opts)}
    got = {}
    for math in (mode, "strict"):
        p = clconv.plan(x.shape, w.shape, **opts, dtype=dtype, queue=queue, algorithm=algorithm, gemm="gpu",
                        queues=queues, math=math)
        assert p.math == math, p.explain()
        got[math] = {"forward": p.forward(x, w, b), "grad-input": p.backward_input(w, dy),
                     "grad-weight": p.backward_weight(x, dy)}
        for pass_name, result in got[math].items():
            assert_close(result, want[pass_name], dtype, f"{pass_name} ({math})", math)
    if dtype == F16:   # read as they are: no float32 copies made or converted; else on copies
        kind = "gpu" if queue.device.type & cl.device_type.GPU else "cpu"
        for pass_name in PASSES:
            direct = pass_name in HALF_AS_THEY_ARE[kind].get(case.name, ())
            assert ("float16 arrays read as they are" in p.explain().record(pass_name).notes) == direct, p.explain()
            assert bool({"to_real", "to_store"} & set(p.launches(pass_name))) != direct, p.launches(pass_name)
    if dtype == F32 or algorithm == "im2col":   # (float16 sums of few outputs may round to the same halves)
        assert not np.array_equal(got[mode]["forward"], got["strict"]["forward"]), f"{mode} gave strict's bits"


# on a GPU: im2col's GPU forms (im2col and col2im gather float16 images as they are), grouped, strided
# and dilated, on one queue and per-group queues, and one group with a long K; 1x1 split-K forward and
# grad-input (float partial sums of half operands), each with grad-weight in slices
G2 = Case("g2_s2_d2", 3, 10, 13, 11, 12, 3, 3, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
GPU_FORM_CASES = [(G2, "im2col", "single"), (G2, "im2col", "per-group"),
                  (Case("g1_deep", 2, 64, 8, 6, 8, 3, 3, padding=1), "im2col", "single"),
                  (Case("1x1_split_forward", 2, 4096, 3, 5, 16, 1, 1), "1x1", "single"),
                  (Case("1x1_split_grad_input", 2, 16, 3, 5, 4096, 1, 1), "1x1", "single"),
                  (Case("fc_split_forward", 3, 512, 4, 3, 10, 4, 3), "fc", "single")]


@pytest.mark.gpu_form
@pytest.mark.parametrize("math", ["strict", "fp16"])
@pytest.mark.parametrize("case, algorithm, queues", GPU_FORM_CASES, ids=lambda v: getattr(v, "name", v))
def test_float16_arrays_read_as_they_are_on_a_gpu(queue, monkeypatch, case, algorithm, queues, math):
    """In plans for a GPU (a stand-in: im2col's GPU forms, clconv's GPU GEMM kernel, col not read in
    place), every pass reads and writes the float16 arrays as they are, with no float32 copies:
    im2col gathers half input into float col, col2im rounds its sums to half once, the GEMM reads
    half operands, split-K partial sums stay float; each pass within float16's tolerance of the
    float64 reference. A fused ReLU after the bias gives the forward's own halves through
    max(., 0), bit for bit: the sum with the bias is rounded to half once."""
    if math != "strict":
        matrix_units(queue, monkeypatch, math)
    monkeypatch.setattr(rules, "IM2COL_GPU_IMPLICIT_FLOP_PER_UNIT", {"forward": 0, "backward_weight": 0})
    x, w, b, dy = case.data(np.float16)
    opts = case.options
    p = clconv.Plan(conv_geometry(x.shape, w.shape, **opts), np.float16, stand_in_gpu(queue, 132),
                    algorithm=algorithm, gemm="gpu", math=math, selfcheck=False, queues=queues)
    assert p.math == math
    if "_split_" in case.name:
        assert max(r.splits for r in p.explain().records[:2]) > 1, p.explain()
    assert_float16_passes(p, x, w, b, dy, opts, queue, as_they_are=True, math=math)
