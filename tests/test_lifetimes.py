"""Object lifetimes and optional driver queries, as the OpenCL specification allows runtimes to
treat them (Intel's CPU runtime does): a context, program or kernel whose last application
reference is gone may be taken as released, and kernel argument information may be missing
(programs pyopencl rebuilds from its binary cache lack it there). Each test fails on such a
runtime without the rule it is named for."""
import gc
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import reference
from clconv.programs import (StructArg, bound_kernel, get_kernel, kernel_dir, kernel_signatures, kernel_structs,
                             launch, program_source, relaunch)
from clconv.recording import capturing
from helpers import CASES, assert_close

ROOT = Path(__file__).resolve().parents[1]


def test_default_queue_keeps_its_context():
    """A fresh process whose only handle is clconv's default queue: its context stays usable
    (the first call of `python -m clconv check` on Intel's runtime failed here)."""
    code = ("import gc, numpy as np, clconv\n"
            "q = clconv.default_queue(); gc.collect()\n"
            "assert q.context == clconv.default_context()\n"
            "x, w = np.ones((1, 2, 5, 4), np.float32), np.ones((3, 2, 3, 3), np.float32)\n"
            "y = clconv.conv2d(x, w, padding=1)\n"
            "assert np.array_equal(y, clconv.reference.conv2d(x, w, padding=1)), y\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr


def test_plan_outlives_the_callers_context(queue):
    """The caller makes a context and queue, builds a plan, then drops the context: the plan,
    called with NumPy arrays (uploaded through the queue, so nothing of the caller's holds the
    context), still runs every pass."""
    case = CASES[1]
    x, w, b, dy = case.data()
    context = cl.Context([queue.device])
    q = cl.CommandQueue(context)
    p = clconv.plan(x.shape, w.shape, **case.options, queue=q)
    del context
    gc.collect()
    opts = case.options
    assert_close(p.forward(x, w, b), reference.conv2d(x, w, b, **opts), np.float32, "forward")
    assert_close(p.backward_input(w, dy), reference.conv2d_input(x.shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(p.backward_weight(x, dy), reference.conv2d_weight(x, w.shape, dy, **opts), np.float32,
                 "grad-weight")


def test_a_queue_whose_context_was_released_is_refused_clearly(queue):
    """Where the runtime lets a queue outlive every reference to its context, clconv says so."""
    q = cl.CommandQueue(cl.Context([queue.device]))
    gc.collect()
    try:
        q.context
    except cl.Error:
        with pytest.raises(ValueError, match="the queue's context was released"):
            clconv.plan((1, 2, 5, 4), (3, 2, 3, 3), queue=q)
    else:
        pytest.skip(f"{queue.device.platform.name} keeps a queue's context alive")


def test_kernel_copies_outlive_their_program(queue):
    """Replayed launches copy a cached kernel (bound_kernel) long after its program was built:
    the program is kept with its kernels, not asked of the kernel."""
    context = cl.Context([queue.device])   # a context of its own: the kernel is built here
    q = cl.CommandQueue(context)
    n = 37
    kernel = get_kernel(context, "storage.cl", "to_real", np.float32, IDX="int")
    gc.collect()
    src = cla.to_device(q, np.arange(n, dtype=np.float32))
    dst = cla.zeros(q, n, np.float32)
    copy = bound_kernel(kernel, (None, 0, None, 0, n))
    relaunch(q, [(copy, (n,), None, ((0, 0), (2, 1)), "copy")], [src.base_data, dst.base_data])
    np.testing.assert_array_equal(dst.get(), src.get())


def test_replayed_calls_on_a_fresh_context(queue):
    """The same through the public path: a plan called three times on one layout replays its
    launches from kernel copies made on the second call."""
    case = CASES[3]
    x, w, b, dy = case.data()
    context = cl.Context([queue.device])
    q = cl.CommandQueue(context)
    dev = [cla.to_device(q, a) for a in (x, w, b)]
    p = clconv.plan(x.shape, w.shape, **case.options, queue=q)
    gc.collect()
    want = reference.conv2d(x, w, b, **case.options)
    for _ in range(3):
        assert_close(p.forward(*dev).get(), want, np.float32, "forward")


# defines that kernel files without defaults for every macro need to build on their own
NEEDS = {"direct.cl": dict(TAPS=9, WG=64, KH=3, KW=3, SH=1, SW=1, DH=1, DW=1, PT=1, PL=1, CG=1, KG=1)}


@pytest.mark.parametrize("dtype,idx", [(np.float32, "int"), (np.float64, "long")], ids=["float32-int", "float64-long"])
@pytest.mark.parametrize("filename", sorted(p.name for p in kernel_dir().glob("*.cl")))
def test_argument_types_read_from_the_source_match_the_driver(filename, dtype, idx, queue):
    """kernel_signatures (what pyopencl is told) against the driver's own argument information
    for a program built from source with -cl-kernel-arg-info, where the driver gives it."""
    if dtype == np.float64 and not clconv.device.has_fp64(queue.device):
        pytest.skip("the device has no float64")
    defines = tuple(sorted(dict(NEEDS.get(filename, {}), IDX=idx).items()))
    source = program_source(filename, np.dtype(dtype), defines)
    # a source of its own, so that pyopencl builds it from source, not from its binary cache
    unique = f"\n// {filename} {dtype.__name__} {idx} {time.time_ns()}\n"
    program = cl.Program(queue.context, source + unique).build(options=["-cl-kernel-arg-info"])
    scalar = {"int": np.int32, "long": np.int64, "float": np.float32, "double": np.float64}
    signatures = kernel_signatures(source, dtype, dict(defines))
    kernels = program.all_kernels()
    assert sorted(signatures) == sorted(k.function_name for k in kernels)
    for k in kernels:
        driver = []
        for i in range(k.num_args):
            try:
                space = k.get_arg_info(i, cl.kernel_arg_info.ADDRESS_QUALIFIER)
                name = k.get_arg_info(i, cl.kernel_arg_info.TYPE_NAME).strip()
            except cl.Error:
                pytest.skip(f"{queue.device.platform.name} gives no argument information")
            driver.append(None if space != cl.kernel_arg_address_qualifier.PRIVATE
                          else name if name.startswith("struct ") else scalar[name])
        ours = [f"struct {t.name}" if isinstance(t, StructArg) else t for t in signatures[k.function_name]]
        assert ours == driver, k.function_name


@pytest.mark.parametrize("dtype,idx", [(np.float32, "int"), (np.float64, "long")], ids=["float32-int", "float64-long"])
def test_struct_arguments_are_laid_out_as_the_device_reads_them(dtype, idx, queue):
    """Every struct our kernels take (read from the sources as kernel_signatures reads them), packed
    as launch() packs it with distinct values, and read back field by field by a kernel of the
    device's own compiler, beside its sizeof."""
    if dtype == np.float64 and not clconv.device.has_fp64(queue.device):
        pytest.skip("the device has no float64")
    texts = [f.read_text() for f in sorted(kernel_dir().glob("*.cl")) + [kernel_dir() / "clconv.h"]]
    definitions = "\n".join(dict.fromkeys(line for t in texts for line in t.splitlines() if line.startswith("struct ")))
    real = "double" if dtype == np.float64 else "float"
    structs = kernel_structs(definitions, {"REAL": real, "IDX": idx})
    assert {"geometry", "col_geometry", "gemm_sizes", "gemm_operand", "gemm_result"} <= set(structs)
    reads = ["#pragma OPENCL EXTENSION cl_khr_fp64 : enable" if dtype == np.float64 else "",
             f"#define IDX {idx}", f"#define REAL {real}", definitions]
    for name, t in structs.items():
        fields = " ".join(f"out[{i}] = s.{field};" for i, (field, _) in enumerate(t.fields))
        reads.append(f"__kernel void read_{name}(__global {real}* out, const struct {name} s, __global long* size)"
                     f" {{ {fields} size[0] = sizeof(struct {name}); }}")
    program = cl.Program(queue.context, "\n".join(reads)).build()
    for name, t in structs.items():
        values = [(3 * i + 1) * (-1) ** i for i in range(len(t.fields))]
        out = cla.zeros(queue, len(values), dtype)
        size = cla.zeros(queue, 1, np.int64)
        kernel = getattr(program, f"read_{name}")
        kernel(queue, (1,), (1,), out.data, t.layout.pack(*values), size.data)
        assert out.get().tolist() == values, name
        assert size.get()[0] == t.layout.size, name


def test_a_value_a_struct_cannot_hold_is_refused_before_the_launch(queue):
    """A struct field given a value its type cannot hold (an int field past 2^31) raises a
    ClconvError naming the kernel, the struct and the fields, and nothing is enqueued."""
    kernel = get_kernel(queue.context, "im2col.cl", "im2col_rows", np.float32, IDX="int", VW=8)
    x, col = cla.zeros(queue, 64, np.float32), cla.zeros(queue, 64, np.float32)
    sizes = [1, 1, 4, 4, 1, 1, 4, 4, 1, 1, 0, 0, 1, 1]
    sizes[2] = 2**31
    with capturing() as capture, pytest.raises(clconv.ClconvError, match=r"im2col_rows: struct col_geometry .*h=2147483648"):
        launch(queue, kernel, (4, 1), (1, 1), x.base_data, 0, col.base_data, 0, *sizes)
    assert capture.names == []
    with pytest.raises(clconv.ClconvError, match="im2col_rows: a launch gave 3 arguments where it takes 18"):
        launch(queue, kernel, (4, 1), (1, 1), x.base_data, 0, col.base_data)


@pytest.mark.parametrize("source, message", [
    ("__kernel void k(__global float* a, const struct missing s) {}", "kernel k: no definition of struct missing"),
    ("struct s { int a[4]; };\n__kernel void k(const struct s p) {}", r"struct s: only scalar fields"),
    ("struct s { int a; float4 b; };\n__kernel void k(const struct s p) {}", r"struct s: cannot tell the type"),
], ids=["undefined", "array-field", "vector-field"])
def test_structs_the_sources_cannot_be_read_as_say_so(source, message):
    with pytest.raises(clconv.ClconvError, match=message):
        kernel_signatures(source, np.float32, {"IDX": "int"})


def test_builds_never_ask_the_driver_for_argument_types(queue, monkeypatch):
    """A build works where the driver has no argument information (as for programs rebuilt
    from pyopencl's binary cache on Intel's runtime)."""
    def refuse(*args):
        raise AssertionError("clconv asked the driver for kernel argument information")
    monkeypatch.setattr(cl.Kernel, "get_arg_info", refuse)
    context = cl.Context([queue.device])   # nothing cached for it yet
    q = cl.CommandQueue(context)
    x, w = np.ones((1, 2, 5, 4), np.float32), np.ones((3, 2, 3, 3), np.float32)
    np.testing.assert_array_equal(clconv.conv2d(x, w, padding=1, queue=q, algorithm="im2col"),
                                  reference.conv2d(x, w, padding=1))


class _Named:
    def __init__(self, **names):
        self.__dict__.update(names)


def test_device_choice_matches_platforms_before_devices(monkeypatch):
    """CLCONV_DEVICE=intel is Intel's runtime, also where PoCL runs on an Intel CPU and is
    listed first (its device's vendor is then GenuineIntel)."""
    from clconv import device
    pocl = _Named(name="Portable Computing Language", vendor="The pocl project", version="OpenCL 3.0 PoCL 3.0")
    intel = _Named(name="Intel(R) OpenCL", vendor="Intel(R) Corporation", version="OpenCL 3.1 LINUX")
    on_pocl = _Named(name="pthread-Intel(R) Xeon(R) Processor", vendor="GenuineIntel", type=cl.device_type.CPU)
    on_intel = _Named(name="Intel(R) Xeon(R) Processor", vendor="Intel(R) Corporation", type=cl.device_type.CPU)
    monkeypatch.setattr(device, "_all_devices", lambda: [(0, 0, pocl, on_pocl), (1, 0, intel, on_intel)])
    monkeypatch.setattr(device.probe, "check", lambda d: (True, ""))   # stand-ins build nothing
    assert device.pick_device("intel")[0] is on_intel
    assert device.pick_device("pocl")[0] is on_pocl
    assert device.pick_device("pthread")[0] is on_pocl   # a device name still selects
    assert device.pick_device("")[0] is on_pocl           # no GPU: PoCL
