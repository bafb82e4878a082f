"""Building our OpenCL kernels and launching them.

Each ``kernels/*.cl`` file is specialised by prepending ``#define`` lines (real
type, index type, tile sizes), then the shared header ``kernels/clconv.h`` (the
defaults and helpers every file uses), and built once per (context, file, dtype,
options); that cache, the only one of kernels, lives on the context (pyopencl's
context-dependent memoize).
"""
import os
import re
import struct
import threading
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyopencl as cl
from pyopencl.tools import context_dependent_memoize

from . import recording
from .recording import state as _recording   # one flag read per launch

# pyopencl's binary cache reads this variable unguarded when a build fails with anything but
# BUILD_PROGRAM_FAILURE (Intel's CPU runtime answers a bad option with INVALID_BUILD_OPTIONS):
# the value it means by default, so that such a failure reaches us as the driver's error, not a KeyError
os.environ.setdefault("PYOPENCL_CACHE_FAILURE_FATAL", "")


class ClconvError(RuntimeError):
    """A device-side failure (build, launch, CLBlast, out of memory), with its context."""


class BuildError(ClconvError):
    """A kernel build the device's compiler refused; ``compiler_lines``: the first error lines of
    its build log, trimmed (:func:`compiler_lines`)."""

    def __init__(self, message, compiler_lines):
        super().__init__(message)
        self.compiler_lines = compiler_lines


def compiler_lines(error, count=2, width=160):
    """The first ``count`` lines of a failed build's log (a pyopencl error's message) that say
    "error:", else its first non-empty log lines, each trimmed to ``width`` characters and joined
    by " | ": the compiler's own words, as short as a message can carry them."""
    text = str(error)
    log = text.split(">:\n", 1)[1] if ">:\n" in text else text   # after pyopencl's "Build on <device>:"
    log = log.split("\n(options:", 1)[0]
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\berror:", line, re.I)] or lines
    return " | ".join(line if len(line) <= width else line[:width - 3] + "..." for line in errors[:count]) or text


def kernel_dir():
    """Folder of the ``.cl`` sources: inside the installed package, else the source tree."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if (candidate / "im2col.cl").is_file():
            return candidate
    raise ClconvError(f"clconv: kernel sources not found next to {here}")


# dtype -> (arithmetic type REAL, storage type STORE). float16 is stored as half and
# computed in float: core OpenCL's vload_half/vstore_half need no cl_khr_fp16.
_C_TYPES = {np.dtype(np.float32): ("float", "float"), np.dtype(np.float64): ("double", "double"),
            np.dtype(np.float16): ("float", "half")}
# Kernel files that read and write through LOAD/SAVE and so accept float16 storage;
# the others take REAL buffers and are only built for float32 and float64.
_STORAGE_AWARE = {"bias.cl", "direct.cl", "partials.cl", "storage.cl", "winograd.cl"}
HEADER = "clconv.h"
INT32_MAX = 2**31 - 1


def multiply_add_builtin(device):
    """Whether clconv's kernels write a multiply-add as OpenCL's fma() for this device (MADD in
    kernels/clconv.h), not as ``a * b + c``: Intel's CPU runtime leaves ``a * b + c`` as a
    multiply and an add, where fma() gives one FMA instruction. PoCL 3.0 contracts ``a * b + c``
    to an FMA but calls its mad() and fma() builtins as functions; GPUs contract it."""
    return bool(device.type & cl.device_type.CPU) and device.platform.name.startswith("Intel(R) OpenCL")


def index_type(*element_counts):
    """The kernel index type: ``int`` when every count fits in 31 bits, else ``long``."""
    return "int" if max(element_counts, default=0) <= INT32_MAX else "long"


def program_source(filename, dtype, defines, device=None):
    """The source built for ``kernels/filename``: our #defines for ``dtype``, ``device`` (how its
    compiler wants a multiply-add written) and ``defines`` ((name, value) pairs), the shared
    header, then the file."""
    path = kernel_dir() / filename
    real, store = _C_TYPES[dtype]
    if store == "half" and filename not in _STORAGE_AWARE:
        raise ClconvError(f"clconv: {filename} has no float16 storage (only {sorted(_STORAGE_AWARE)} do)")
    lines = [f"#define REAL {real}"]
    if store == "half":   # else the header's: STORE is REAL
        lines += ["#define STORE half", "#define LOAD(p, i) vload_half((i), (p))",
                  "#define SAVE(p, i, v) vstore_half_rte((v), (i), (p))"]
    if dtype == np.float64:
        lines.insert(0, "#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if device is not None and multiply_add_builtin(device):
        lines.append("#define MADD(a, b, c) fma((a), (b), (c))")
    lines += [f"#define {name} {value}" for name, value in defines]
    return "\n".join(lines) + "\n" + _header_text() + path.read_text()


@lru_cache(maxsize=None)
def _header_text():
    return (kernel_dir() / HEADER).read_text()


@context_dependent_memoize
def _build(context, filename, dtype, defines):
    path = kernel_dir() / filename
    source = program_source(filename, dtype, defines, context.devices[0])
    # Oclgrind's checks cannot follow LLVM's `freeze` instruction, which the optimiser
    # emits for our div/mod index arithmetic: build unoptimised there.
    oclgrind = context.devices[0].platform.name == "Oclgrind"
    options = ["-cl-opt-disable"] if oclgrind else []
    start = time.perf_counter()
    try:
        program = cl.Program(context, source).build(options=options)
    except cl.Error as exc:
        words = compiler_lines(exc)
        raise BuildError(f"clconv: building {path.name} failed: {words} (dtype {dtype}, defines {dict(defines)}, "
                         f"options {options}, source {path})\n{exc}", words) from exc
    with _building_lock:
        _built.append((filename, time.perf_counter() - start))
    signatures = kernel_signatures(source, dtype, dict(defines))
    kernels = {k.function_name: k for k in program.all_kernels()}
    for name, k in kernels.items():
        # The program is kept with its kernels: a runtime may treat a program whose last
        # application reference is gone as released (Intel's does), and bound_kernel needs it.
        k.clconv_program = program
        # what launch() packs struct parameters with; a struct is set as its bytes (dtype None)
        k.clconv_pack = _packer(name, signatures[name])
        k.clconv_arg_dtypes = [None if isinstance(t, StructArg) else t for t in signatures[name]]
        k.set_scalar_arg_dtypes(k.clconv_arg_dtypes)
    return kernels


_SCALAR_TYPES = {"int": np.int32, "long": np.int64, "float": np.float32, "double": np.float64}
_QUALIFIERS = {"const", "__private", "private", "restrict", "volatile"}
_STRUCT_CODES = {np.int32: "i", np.int64: "q", np.float32: "f", np.float64: "d"}   # struct module, standard sizes


class StructArg:
    """A kernel parameter that is a struct of scalars, passed by value: ``name``, ``fields``
    ((field, NumPy type), ...) and ``layout``, a :class:`struct.Struct` laying the fields out as
    OpenCL C does (each aligned to its size, the whole to its largest field's). A kernel takes
    its many scalars as one such argument because drivers copy each argument of every launch,
    and one argument costs less host time than many."""

    def __init__(self, name, fields):
        self.name, self.fields = name, tuple(fields)
        fmt, size, largest = "<", 0, 1
        for _, t in self.fields:
            item = np.dtype(t).itemsize
            fmt += "x" * (-size % item) + _STRUCT_CODES[t]
            size += -size % item + item
            largest = max(largest, item)
        self.layout = struct.Struct(fmt + "x" * (-size % largest))


def _packer(name, signature):
    """For kernel ``name`` with struct parameters, a function from its launch arguments (each
    struct's fields in its place, in order) to the arguments the kernel takes (each struct as its
    bytes); None for a kernel without."""
    if not any(isinstance(t, StructArg) for t in signature):
        return None
    count = sum(len(t.fields) if isinstance(t, StructArg) else 1 for t in signature)

    def pack(args):
        if len(args) != count:
            raise ClconvError(f"clconv: kernel {name}: a launch gave {len(args)} arguments where it takes {count}")
        packed, i = [], 0
        for t in signature:
            if isinstance(t, StructArg):
                values = args[i:i + len(t.fields)]
                try:
                    packed.append(t.layout.pack(*values))
                except struct.error as exc:
                    fields = ", ".join(f"{f}={v!r}" for (f, _), v in zip(t.fields, values))
                    raise ClconvError(f"clconv: kernel {name}: struct {t.name} cannot hold {fields}: {exc}") from exc
                i += len(t.fields)
            else:
                packed.append(args[i])
                i += 1
        return tuple(packed)
    return pack


def _declared(words, names, what):
    """The NumPy type of a declaration's words (its qualifiers, type and name)."""
    types = [names.get(w, w) for w in words[:-1] if w not in _QUALIFIERS]
    if len(types) != 1 or types[0] not in _SCALAR_TYPES:
        raise ClconvError(f"clconv: {what}: cannot tell the type of {' '.join(words)!r}")
    return _SCALAR_TYPES[types[0]]


def kernel_structs(source, names):
    """{struct name: StructArg} of the source's ``struct name { int a, b; IDX c; };`` definitions,
    ``names`` mapping macro type names (REAL, IDX) to C types."""
    found = {}
    for name, body in re.findall(r"\bstruct\s+(\w+)\s*\{([^}]*)\}\s*;", source):
        fields = []
        for decl in re.sub(r"/\*.*?\*/|//[^\n]*", " ", body).split(";"):
            if decl.strip():
                first, *more = [part.split() for part in decl.split(",")]
                t = _declared(first, names, f"struct {name}")
                fields += [(first[-1], t)] + [(words[-1], t) for words in more]
        if any(not field.isidentifier() for field, _ in fields):
            raise ClconvError(f"clconv: struct {name}: only scalar fields can be read, not {[f for f, _ in fields]}")
        found[name] = StructArg(name, fields)
    return found


def kernel_signatures(source, dtype, defines):
    """{kernel name: argument types} read from our own source: None for buffers and local
    memory, the NumPy type of a scalar, a :class:`StructArg` for a struct of scalars. pyopencl,
    told the scalars' types, packs arguments much faster than when it has to inspect each
    scalar on every call. The driver is not asked
    (clGetKernelArgInfo): it is optional, and programs that pyopencl rebuilds from its binary
    cache lack it on some runtimes (Intel's). A parameter that is one macro name is expanded
    from the source's #define; the types REAL and IDX come from the build's dtype and defines."""
    macros = dict(re.findall(r"^[ \t]*#define[ \t]+(\w+)[ \t]+((?:.*\\\n)*.*)$", source, re.M))
    macros = {k: v.replace("\\\n", " ") for k, v in macros.items()}
    names = {"REAL": _C_TYPES[np.dtype(dtype)][0], "IDX": str(defines.get("IDX", "long"))}
    structs = kernel_structs(source, names)
    found = {}
    for match in re.finditer(r"__kernel\b.*?\bvoid\s+(\w+)\s*\(", source, re.S):
        depth, end = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        params = source[match.end():end - 1].split(",")
        dtypes = []
        while params:
            words = re.sub(r"/\*.*?\*/|//[^\n]*", " ", params.pop(0)).split()
            if len(words) == 1 and words[0] in macros:   # e.g. direct.cl's GEOMETRY
                params[:0] = macros[words[0]].split(",")
                continue
            if any("*" in w for w in words) or "__local" in words or "local" in words:
                dtypes.append(None)
            elif "struct" in words:
                tag = words[words.index("struct") + 1]
                if tag not in structs:
                    raise ClconvError(f"clconv: kernel {match[1]}: no definition of struct {tag} found in its source")
                dtypes.append(structs[tag])
            else:
                dtypes.append(_declared(words, names, f"kernel {match[1]}"))
        found[match[1]] = dtypes
    return found


def work_group_limit(kernel, device):
    """The largest work-group ``kernel`` may run in on ``device``: a driver query, asked once per
    pair and kept on the (cached) kernel."""
    limits = kernel.__dict__.setdefault("clconv_group_limits", {})
    if device.int_ptr not in limits:
        limits[device.int_ptr] = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device)
    return limits[device.int_ptr]


def reduction_work_group(device, limit=256):
    """A work-group size: the largest power of two <= limit the device allows (our reductions, by default)."""
    return 1 << (min(limit, device.max_work_group_size).bit_length() - 1)


_building = {}   # (context, program) -> the lock held while it is built: one build, whatever the threads
_building_lock = threading.Lock()
_built = []      # (file, seconds) of each program this process built (from pyopencl's binary cache or not)


def builds():
    """[(kernel file, seconds)] of the programs this process has built, in order: where a first
    call's time goes (the networks benchmark reports them)."""
    with _building_lock:
        return list(_built)


def get_kernel(context, filename, name, dtype, **defines):
    """The kernel ``name`` of ``kernels/filename`` built for ``dtype`` and ``defines``."""
    program = (filename, np.dtype(dtype), tuple(sorted(defines.items())))
    with _building_lock:
        lock = _building.setdefault((context.int_ptr, program), threading.Lock())
    with lock:
        return _build(context, *program)[name]


# clSetKernelArg is not thread-safe, and each kernel object is shared: a cached kernel by
# every thread using this context, a replay's bound copy by the threads calling that plan on
# one queue. Arguments are set and the kernel enqueued under one lock.
_launch_lock = threading.Lock()


def launch(queue, kernel, global_size, local_size, *args, what=""):
    """Enqueue ``kernel``; global_size is rounded up to a multiple of local_size (the kernels
    guard the excess). Every launch names its local size: left to the driver (None) it costs
    host time per launch on some runtimes. ``args``: the kernel's parameters in order, a struct
    parameter's fields in its place (packed here). Told to :func:`clconv.recording.launched`
    when this thread records launches."""
    global_size = tuple(-(-g // l) * l for g, l in zip(global_size, local_size))
    if kernel.clconv_pack is not None:
        args = kernel.clconv_pack(args)
    try:
        with _launch_lock:
            event = kernel(queue, global_size, local_size, *args)
    except cl.Error as exc:
        raise ClconvError(f"clconv: {what or kernel.function_name}: launching {kernel.function_name} "
                          f"over {global_size} failed: {exc}") from exc
    if _recording.active:
        recording.launched(queue, kernel, global_size, local_size, args, what, event)
    return event


def bound_kernel(kernel, args, what=""):
    """A private copy of ``kernel`` (one of ours) with ``args`` set (None: a buffer set later),
    for :func:`relaunch`, which sets only the arguments that change: setting all of them,
    20-30 for some kernels, costs host time on every call."""
    try:
        copy = cl.Kernel(kernel.clconv_program, kernel.function_name)
        copy.clconv_program = kernel.clconv_program   # kept with it, as with the cached kernels
        for i, (value, dtype) in enumerate(zip(args, kernel.clconv_arg_dtypes)):
            copy.set_arg(i, value if dtype is None else dtype(value))
    except cl.Error as exc:
        raise ClconvError(f"clconv: {what or kernel.function_name}: copying {kernel.function_name} "
                          f"to replay it failed: {exc}") from exc
    return copy


def relaunch(queue, launches, bufs):
    """Enqueue :func:`bound_kernel` copies again, in order, under one hold of the launch lock:
    ``launches``: ((kernel, global size, local size, slots, what), ...), global sizes already
    multiples of the local ones, as :func:`launch` made them; each slot (argument position, i)
    is set to ``bufs[i]`` first. The last launch's event is returned. Told to
    :func:`clconv.recording.relaunched` when this thread records launches."""
    event, events = None, ([] if _recording.active else None)
    try:
        with _launch_lock:
            for kernel, global_size, local_size, slots, what in launches:
                for pos, i in slots:
                    kernel.set_arg(pos, bufs[i])
                event = cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size)
                if events is not None:
                    events.append(event)
    except cl.Error as exc:
        raise ClconvError(f"clconv: {what or kernel.function_name}: launching {kernel.function_name} "
                          f"over {global_size} failed: {exc}") from exc
    if events is not None:
        recording.relaunched(queue, launches, bufs, events)
    return event


def launch_lock():
    """The lock under which kernel arguments are set and kernels enqueued (see _launch_lock)."""
    return _launch_lock
