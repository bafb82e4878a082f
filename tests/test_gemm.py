"""clconv's GEMM engines against NumPy (clconv.gemm): its GPU and CPU kernels and CLBlast on
grids of products at odd offsets, and which engine a plan uses."""
import shutil
import subprocess
from collections import namedtuple

import numpy as np
import pyopencl as cl
import pytest

from clconv import gemm, rules, tuning
from clconv.gemm import Epilogue, Grid, Operand, gemm_cpu, gemm_gpu
from clconv.programs import program_source
from helpers import QueueAs, assert_close, matrix_units

GI, GJ = 2, 3   # a 2 x 3 grid of products


@pytest.fixture(autouse=True)
def fresh_tile_choices():
    """Tile choices are cached; tests that restrict the tiles must not see (or leave)
    other choices."""
    gemm_gpu.tile.cache_clear()
    yield
    gemm_gpu.tile.cache_clear()


# every tile the model picks or a launch runs in float32; float64 on the last (each tile, layout
# and dtype is a kernel build); each with scalar reads (offsets and strides not multiples of 4)
# and four-wide ones (offsets, strides and leading dimensions multiples of 4), and once each with
# one operand read four-wide; and split among planes of work-items (KS), over several slices
PLANES = [gemm_gpu.Tile(64, 64, 8, 4, 32, 2), gemm_gpu.Tile(32, 64, 4, 4, 32, 2), gemm_gpu.Tile(32, 32, 4, 4, 32, 4)]
TILE_DTYPES = ([(t[0], np.float32) for t in gemm_gpu.TILES] + [(t, np.float32) for t in [gemm_gpu.EIGHT_BY_FOUR] + PLANES]
               + [(gemm_gpu.TILES[-1][0], np.float64), (PLANES[1], np.float64)])
CASES = ([(t, d, r) for t, d in TILE_DTYPES for r in ("scalar", "vector")]
         + [(gemm_gpu.TILES[1][0], np.float32, r) for r in ("wide_a", "wide_b")])
LAYOUTS = dict(argnames="a_transp,b_transp", argvalues=[(False, False), (True, False), (False, True), (True, True)],
               ids=["nn", "tn", "nt", "tt"])


def check_grid(queue, run, dtype, reads, a_transp, b_transp, m=67, n=130, k=29, seed=1, math="strict"):
    """``run(buf, a, b, c, alpha, beta)`` (Operands into one buffer) against NumPy on a GI x GJ
    grid: odd sizes (no dimension a multiple of a tile or of 4, K not of a slice depth), padded
    leading dimensions, gaps between matrices, alpha and beta; C outside the products stays as
    it was. Everything outside the matrices is NaN, so a read past an edge shows. ``reads``:
    "vector" aligns every operand to 4 elements, "wide_a"/"wide_b" only that one, "scalar" none.
    float16: the buffer holds half values, the Operands say so (``half``). Returns the Operands."""
    if dtype == np.float64 and "cl_khr_fp64" not in queue.device.extensions:
        pytest.skip("no float64 on this device")
    rng = np.random.default_rng(seed)
    a_shape, b_shape = (k, m) if a_transp else (m, k), (n, k) if b_transp else (k, n)
    # one buffer: A, B and C each a (GI, GJ) grid of padded matrices, j fastest, with gaps
    shapes = {"A": a_shape, "B": b_shape, "C": (m, n)}
    aligned = {x: reads == "vector" or reads == f"wide_{x.lower()}" for x in shapes}
    lds = {x: s[1] + ((-s[1]) % 4 + 4 if aligned[x] else 3) for x, s in shapes.items()}
    gaps = {x: 4 if aligned[x] else 5 for x in shapes}
    sj = {x: s[0] * lds[x] + gaps[x] for x, s in shapes.items()}
    si = {x: GJ * sj[x] + gaps[x] for x in shapes}
    offsets, start = {}, 8
    for x in "ABC":
        offsets[x], start = start + (0 if aligned[x] else 3), start + 3 + GI * si[x] + (-(GI * si[x] + 3) % 4)
    host = np.full(start, np.nan, dtype)

    def view(x, h, i, j):   # a writable view of matrix (i, j) of operand x in h
        (rows, cols), o = shapes[x], offsets[x] + i * si[x] + j * sj[x]
        return h[o:o + rows * lds[x]].reshape(rows, lds[x])[:, :cols]

    for x in "ABC":
        for i in range(GI):
            for j in range(GJ):
                view(x, host, i, j)[...] = rng.standard_normal(shapes[x])

    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    ops = [Operand(buf, offsets[x], lds[x], si[x], sj[x], half=dtype == np.float16) for x in "ABC"]
    alpha, beta = 1.5, -0.5
    run(*ops, alpha, beta)
    got = np.empty_like(host)
    cl.enqueue_copy(queue, got, buf)
    want = host.astype(np.float64)
    for i in range(GI):
        for j in range(GJ):
            a, b = view("A", host, i, j).astype(np.float64), view("B", host, i, j).astype(np.float64)
            c = view("C", want, i, j)
            c[...] = alpha * ((a.T if a_transp else a) @ (b.T if b_transp else b)) + beta * c
    touched = np.zeros(start, bool)
    for i in range(GI):
        for j in range(GJ):
            view("C", touched, i, j)[...] = True
    assert_close(got[touched], want[touched], dtype, "grid GEMM", math=math)
    assert np.array_equal(got[~touched], host[~touched], equal_nan=True), "written outside the C matrices"
    return ops


@pytest.mark.gpu_form
@pytest.mark.parametrize(**LAYOUTS)
@pytest.mark.parametrize("tile,dtype,reads", CASES,
                         ids=[f"{t.tm}x{t.tn}_by_{t.rm}x{t.rn}" + (f"_ks{t.ks}" if t.ks > 1 else "")
                              + f"-{np.dtype(d).name}-{r}" for t, d, r in CASES])
def test_gpu_kernel_grid_of_products_at_offsets(tile, dtype, reads, a_transp, b_transp, queue, monkeypatch):
    """The GPU kernel with each tile, its reads four-wide where the layout allows."""
    if not gemm_gpu.fits(queue.device, tile, np.dtype(dtype).itemsize):
        pytest.skip("the tile does not fit this device")
    monkeypatch.setattr(gemm_gpu, "TILES", ((tile, 1.0),))
    for rule in ("launched", "sliced"):   # the tile itself, as given
        monkeypatch.setattr(gemm_gpu, rule, lambda device, t, *args: t)

    def run(a, b, c, alpha, beta):
        widths = [gemm_gpu.read_width(queue.device, np.dtype(dtype).itemsize, x.off, x.per_group, x.per_image, x.ld,
                                      GI, GJ) for x in (a, b)]
        assert widths == [4 if reads in ("vector", f"wide_{x}") else 1 for x in "ab"], "the layout gives other reads"
        # C is written four-wide where it is aligned too, its last run of each row (N = 130) value by value
        assert gemm_gpu.read_width(queue.device, np.dtype(dtype).itemsize, c.off, c.per_group, c.per_image, c.ld,
                                   GI, GJ) == (4 if reads == "vector" else 1), "the layout gives other writes"
        gemm_gpu.grid_gemm(queue, np.dtype(dtype), Grid(GI, GJ, m, n, k), a._replace(transp=a_transp),
                           b._replace(transp=b_transp), c, Epilogue(alpha, beta), what="test")
    m, n, k = 67, 130, 157 if tile.ks > 1 else 29   # (planes: several slices, the last one cut short)
    check_grid(queue, run, dtype, reads, a_transp, b_transp, m, n, k)


# every tile a launch runs on the matrix units, as :func:`gemm_gpu.on_matrix_units` deepens it, and
# split among planes (each plane's part of a slice 8 or 16 deep); TF32 with reads four-wide and value
# by value and both operands transposed or not, FP16 and BF16 (the same staging, their fragments two
# values a register) with one of these
UNIT_TILES = [t for t, _ in gemm_gpu.TILES] + [gemm_gpu.EIGHT_BY_FOUR, gemm_gpu.Tile(64, 64, 8, 4, 32, 2),
                                               gemm_gpu.Tile(32, 64, 4, 4, 32, 2)]
UNIT_CASES = ([("tf32", t, r, at, at) for t in UNIT_TILES for r in ("scalar", "vector") for at in (False, True)]
              + [(mode, t, "vector", False, False) for mode in ("fp16", "bf16") for t in UNIT_TILES])


@pytest.mark.gpu_form
@pytest.mark.parametrize("math,tile,reads,a_transp,b_transp", UNIT_CASES,
                         ids=[f"{mode}-{t.tm}x{t.tn}_by_{t.rm}x{t.rn}_tk{t.tk}" + (f"_ks{t.ks}" if t.ks > 1 else "")
                              + f"-{r}-{'tt' if at else 'nn'}" for mode, t, r, at, _ in UNIT_CASES])
def test_gpu_kernel_on_matrix_units(math, tile, reads, a_transp, b_transp, queue, monkeypatch):
    """The kernel's products on the matrix units (its MMA form) with each tile, within the mode's
    tolerance of float64 on a grid of odd sizes at odd offsets (fragments cut by every edge), and
    not bit for bit the float32 products (the units ran)."""
    matrix_units(queue, monkeypatch, math)
    if not gemm_gpu.fits(queue.device, tile, 4, gemm_gpu.MMA[math][2]):
        pytest.skip("the tile does not fit this device")
    monkeypatch.setattr(gemm_gpu, "TILES", ((tile, 1.0),))
    for rule in ("launched", "sliced", "on_matrix_units"):   # the tile itself, as given
        monkeypatch.setattr(gemm_gpu, rule, lambda device, t, *args: t)

    def run(mode):
        def enqueue(a, b, c, alpha, beta):
            gemm_gpu.grid_gemm(queue, np.dtype(np.float32), Grid(GI, GJ, m, n, k), a._replace(transp=a_transp),
                               b._replace(transp=b_transp), c, Epilogue(alpha, beta), math=mode, what="test")
        return enqueue
    m, n, k = 67, 130, 157 if tile.ks > 1 else 45
    ops = {mode: check_grid(queue, run(mode), np.float32, reads, a_transp, b_transp, m, n, k, math=mode)
           for mode in ("strict", math)}
    got = {}
    for mode, (_, _, c) in ops.items():
        host = np.empty(c.buf.size // 4, np.float32)
        cl.enqueue_copy(queue, host, c.buf)
        got[mode] = host[c.off:c.off + m * c.ld]
    assert not np.array_equal(got["strict"], got[math]), f"{math} gave float32's products bit for bit"


# float16 operands read and written as they are (no float32 copies): in float32 math and on the units,
# each with a tile of one plane and one of two, reads four-wide (vload_half4) and value by value,
# both operands as stored or both transposed
HALF_CASES = [(mode, t, r, at) for mode, t, r in (("strict", gemm_gpu.TILES[1][0], "scalar"),
                                                  ("strict", PLANES[0], "vector"),
                                                  ("fp16", gemm_gpu.TILES[1][0], "vector"),
                                                  ("fp16", PLANES[0], "scalar")) for at in (False, True)]


@pytest.mark.gpu_form
@pytest.mark.parametrize("math,tile,reads,transp", HALF_CASES,
                         ids=[f"{mode}-{t.tm}x{t.tn}_by_{t.rm}x{t.rn}" + (f"_ks{t.ks}" if t.ks > 1 else "")
                              + f"-{r}-{'tt' if at else 'nn'}" for mode, t, r, at in HALF_CASES])
def test_gpu_kernel_on_half_operands(math, tile, reads, transp, queue, monkeypatch):
    """A, B and C stored as float16 (a float16 array's own buffer), each value made float as it is
    read and C rounded to half as it is written, alpha and beta applied in float: within float16's
    tolerance of float64 on a grid of odd sizes at odd offsets, nothing outside C written."""
    if math != "strict":
        matrix_units(queue, monkeypatch, math)
    if not gemm_gpu.fits(queue.device, tile, 4, gemm_gpu.MMA[math][2] if math != "strict" else gemm_gpu.PAD):
        pytest.skip("the tile does not fit this device")
    monkeypatch.setattr(gemm_gpu, "TILES", ((tile, 1.0),))
    for rule in ("launched", "sliced", "on_matrix_units"):   # the tile itself, as given
        monkeypatch.setattr(gemm_gpu, rule, lambda device, t, *args: t)

    def run(a, b, c, alpha, beta):
        assert a.half and b.half and c.half
        widths = [gemm_gpu.read_width(queue.device, 4, x.off, x.per_group, x.per_image, x.ld, GI, GJ) for x in (a, b, c)]
        assert widths == [4 if reads == "vector" else 1] * 3, "the layout gives other reads"   # (vload_half4 or not)
        gemm_gpu.grid_gemm(queue, np.dtype(np.float32), Grid(GI, GJ, m, n, k), a._replace(transp=transp),
                           b._replace(transp=transp), c, Epilogue(alpha, beta), math=math, what="test")
    m, n, k = 67, 130, 157 if tile.ks > 1 else 45
    check_grid(queue, run, np.float16, reads, transp, transp, m, n, k, math=math)


def test_half_operands_need_the_gpu_kernel(queue):
    """Only clconv's GPU kernel reads float16 operands as they are: another engine refuses them."""
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 64)
    half = Operand(buf, 0, 2, half=True)
    for engine in ("cpu", "clblast"):
        with pytest.raises(gemm.ClconvError, match="float16 operands"):
            gemm.grid_gemm(queue, engine, np.float32, Grid(1, 1, 2, 2, 2), half, half, half, what="test")


@pytest.mark.gpu_form
def test_units_check_passes_the_units_and_fails_a_wrong_rounding(queue, monkeypatch, tmp_path):
    """The check behind :func:`gemm_gpu.matrix_units`: the kernel in a mode passes on the units
    (here the device's or the emulated ones) and is kept in the tuning cache; a kernel rounding
    to BF16 where TF32 was asked fails it with its error (the check can fail), kept too."""
    monkeypatch.setenv("CLCONV_CACHE_DIR", str(tmp_path))
    if matrix_units(queue, monkeypatch, "tf32") == "device":
        assert "tf32" in gemm_gpu.matrix_units(queue.device)
    else:
        assert gemm_gpu.matrix_units(queue.device) == frozenset()   # no NVIDIA compute capability
    assert gemm_gpu.units_check(queue.device, "tf32") == (True, "")
    assert tuning.load()[gemm_gpu._units_key(queue.device, "tf32")]["ok"] is True
    monkeypatch.setenv("CLCONV_CACHE_DIR", str(tmp_path / "another"))   # (a cache that has not seen it)
    build = gemm_gpu.get_kernel

    def bf16(context, filename, name, dtype, **defines):
        if defines.get("MMA") == 1:
            defines.update(MMA=3, PAD=4)
        return build(context, filename, name, dtype, **defines)
    monkeypatch.setattr(gemm_gpu, "get_kernel", bf16)
    ok, why = gemm_gpu.units_check(queue.device, "tf32")
    assert not ok and why.startswith("a 45x37x53 product's normalised max error is "), why

    def no_build(*args, **kw):
        raise AssertionError("built again")
    monkeypatch.setattr(gemm_gpu, "get_kernel", no_build)
    assert gemm_gpu.units_check(queue.device, "tf32") == (ok, why), "a failure kept for this driver and source"


PTX_TYPES = {"tf32": "tf32.tf32", "fp16": "f16.f16", "bf16": "bf16.bf16"}


@pytest.mark.parametrize("math", list(PTX_TYPES))
def test_matrix_unit_forms_compile_to_ptx(math, tmp_path):
    """The kernel's MMA forms, every tile and the folded and im2col reads, through clang's NVPTX
    back end for compute capability 8.0 (where this machine has it, as Debian's PoCL brings it):
    the inline PTX is taken, each mma.sync is of the mode's types, and nothing spills to local
    memory. What the emulation cannot check (the PTX itself); NVIDIA's own compiler builds it on
    its GPUs, where test_gpu_kernel_on_matrix_units runs it."""
    clang = shutil.which("clang-15") or shutil.which("clang")
    if clang is None:
        pytest.skip("no clang here")
    im2col = gemm_gpu.Im2colB(9, 11, 3 * 99, 45, 9, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0)
    forms = [dict(t=t) for t in UNIT_TILES] + [dict(t=UNIT_TILES[0], C_FOLD=7), dict(t=UNIT_TILES[1], K_FOLD=9),
                                               dict(t=UNIT_TILES[2], IM2COL=1, **dict(im2col.defines()))]
    for i, form in enumerate(forms):
        t = form.pop("t")
        defines = dict(TM=t.tm, TN=t.tn, RM=t.rm, RN=t.rn, TK=t.tk, KS=t.ks, PAD=gemm_gpu.MMA[math][2],
                       MMA=gemm_gpu.MMA[math][0], IDX="int", **form)
        src = tmp_path / f"form{i}.cl"
        src.write_text(program_source("gemm_gpu.cl", np.dtype(np.float32), tuple(sorted(defines.items()))))
        out = subprocess.run([clang, "-x", "cl", "-cl-std=CL1.2", "-target", "nvptx64-nvidia-nvcl", "-march=sm_80",
                              "-Xclang", "-finclude-default-header", "-fgnu-keywords", "-O2", "-S", "-o", "-", str(src)],
                             capture_output=True, text=True)
        if "unknown target" in out.stderr or "No available targets" in out.stderr:
            pytest.skip("this clang has no NVPTX back end")
        assert out.returncode == 0, f"{math} {t} {form}: {out.stderr[-2000:]}"
        assert f"mma.sync.aligned.m16n8k8.row.col.f32.{PTX_TYPES[math]}.f32" in out.stdout, f"{math} {t} {form}"
        assert "st.local" not in out.stdout and "ld.local" not in out.stdout, f"{math} {t} {form}: spills"


CPU_VARIANTS = {   # the CPU kernel's block as its host sizes it, and forced other ways
    "default": None,
    "one_block_per_item": lambda t: t._replace(tm=1),
    "five_blocks_per_item": lambda t: t._replace(tm=5),   # the last work-item's blocks run past M
    "short_k_slices": lambda t: t._replace(kc=t.vw),      # C read back per slice, in shifted blocks too
    "vw4": 4,                                             # 4-wide vectors (SSE-sized)
    "vw8": 8,                                             # 256-bit vectors (AVX2)
    "vw16": 16,                                           # 512-bit vectors (AVX-512)
}


@pytest.mark.parametrize(**LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("variant", list(CPU_VARIANTS))
def test_cpu_kernel_grid_of_products_at_offsets(variant, dtype, a_transp, b_transp, queue, monkeypatch):
    """The CPU kernel in both forms (outer products for B stored K x N, dot products for A and B
    stored along K, A^T B^T as (B A)^T), with edge blocks in M and N and a K tail."""
    change = CPU_VARIANTS[variant]
    native = queue.device.native_vector_width_double if dtype == np.float64 else queue.device.native_vector_width_float
    if isinstance(change, int) and change > 4 and native <= 1:
        # (4 minutes of a cold run on rusticl, its slowest tests, for forms it never runs)
        pytest.skip("the device reports no native vector width (rusticl's llvmpipe): clconv's CPU kernels take "
                    "4-wide vectors on it, whatever the CPU")
    if isinstance(change, int):
        monkeypatch.setattr(gemm_cpu, "vector_width", lambda device, itemsize: change)
    elif change is not None:
        sized = gemm_cpu.tile
        monkeypatch.setattr(gemm_cpu, "tile", lambda *args: change(sized(*args)))

    def run(a, b, c, alpha, beta):
        gemm_cpu.grid_gemm(queue, np.dtype(dtype), Grid(GI, GJ, 67, 130, 29), a._replace(transp=a_transp),
                           b._replace(transp=b_transp), c, Epilogue(alpha, beta), what="test")
    check_grid(queue, run, dtype, "scalar", a_transp, b_transp)


@pytest.mark.parametrize(**LAYOUTS)
@pytest.mark.parametrize("variant", ["default", "short_k_slices", "vw4"])
def test_cpu_kernel_sums_k_blocks(variant, a_transp, b_transp, queue, monkeypatch):
    """Products whose depth is 3 blocks of K at block strides that are not K apart (images summed
    over), in a grid of 2 products, both forms; K slices that span every block."""
    if variant == "vw4":
        monkeypatch.setattr(gemm_cpu, "vector_width", lambda device, itemsize: 4)
    elif variant == "short_k_slices":
        sized = gemm_cpu.tile
        monkeypatch.setattr(gemm_cpu, "tile", lambda *args: sized(*args)._replace(kc=sized(*args).vw))
    m, n, k, blocks, gi = 13, 37, 21, 3, 2
    rng = np.random.default_rng(7)
    a_shape, b_shape = (k, m) if a_transp else (m, k), (n, k) if b_transp else (k, n)
    a_step, b_step = np.prod(a_shape) + 5, np.prod(b_shape) + 3   # blocks q of A and B, then the products i
    a_size, b_size = blocks * a_step + 1, blocks * b_step + 2
    host = np.full(gi * (a_size + b_size + m * n) + 3, np.nan, np.float32)
    a_at = lambda i, q: 3 + i * a_size + q * a_step
    b_at = lambda i, q: 3 + gi * a_size + i * b_size + q * b_step
    c_at = lambda i: 3 + gi * (a_size + b_size) + i * m * n
    want = np.empty((gi, m, n))
    for i in range(gi):
        host[c_at(i):c_at(i) + m * n] = rng.standard_normal(m * n)
        want[i] = -0.5 * host[c_at(i):c_at(i) + m * n].reshape(m, n)
        for q in range(blocks):
            a = rng.standard_normal(a_shape).astype(np.float32)
            b = rng.standard_normal(b_shape).astype(np.float32)
            host[a_at(i, q):a_at(i, q) + a.size], host[b_at(i, q):b_at(i, q) + b.size] = a.ravel(), b.ravel()
            want[i] += 1.5 * (a.T if a_transp else a).astype(np.float64) @ (b.T if b_transp else b)
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    gemm_cpu.grid_gemm(queue, np.dtype(np.float32), Grid(gi, 1, m, n, k, blocks),
                       Operand(buf, a_at(0, 0), a_shape[1], a_size, 0, a_step, transp=a_transp),
                       Operand(buf, b_at(0, 0), b_shape[1], b_size, 0, b_step, transp=b_transp),
                       Operand(buf, c_at(0), n, m * n, 0), Epilogue(1.5, -0.5), what="test")
    got = np.empty_like(host)
    cl.enqueue_copy(queue, got, buf)
    assert_close(np.stack([got[c_at(i):c_at(i) + m * n].reshape(m, n) for i in range(gi)]), want, np.float32,
                 "K blocks")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_cpu_kernel_packs_a_transposed(dtype, queue):
    """op(A) = A^T with a workspace to pack it in (pack_a_transposed, then the GEMM on the copy),
    on the grid at offsets as above; the workspace around the packed copies stays untouched."""
    def run(a, b, c, alpha, beta):
        size = gemm_cpu.packed_size(GI, GJ, 67, 29, a)
        assert size == GI * GJ * 67 * 29
        ws = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                       hostbuf=np.full(size + 10, np.nan, dtype))
        gemm_cpu.grid_gemm(queue, np.dtype(dtype), Grid(GI, GJ, 67, 130, 29),
                           a._replace(transp=True, pack=Operand(ws, 5, 0)), b, c, Epilogue(alpha, beta), what="test")
        around = np.empty(size + 10, dtype)
        cl.enqueue_copy(queue, around, ws)
        assert np.isnan(around[:5]).all() and np.isnan(around[-5:]).all() and not np.isnan(around[5:-5]).any()
    check_grid(queue, run, dtype, "scalar", True, False)


def test_cpu_kernel_packs_a_shared_by_the_images_once(queue):
    """A weight shared by a group's images (per-image stride 0) is packed once per group."""
    rng = np.random.default_rng(3)
    m, n, k = 67, 130, 29
    a = rng.standard_normal((GI, k, m)).astype(np.float32)
    b = rng.standard_normal((GI, GJ, k, n)).astype(np.float32)
    mf = cl.mem_flags
    abuf, bbuf = (cl.Buffer(queue.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x) for x in (a, b))
    cbuf = cl.Buffer(queue.context, mf.READ_WRITE, GI * GJ * m * n * 4)
    a_op = Operand(abuf, 0, m, k * m, 0, transp=True)
    assert gemm_cpu.packed_size(GI, GJ, m, k, a_op) == GI * m * k
    ws = cl.Buffer(queue.context, mf.READ_WRITE, GI * m * k * 4)
    a_op = a_op._replace(pack=Operand(ws, 0, 0))
    gemm_cpu.grid_gemm(queue, np.dtype(np.float32), Grid(GI, GJ, m, n, k), a_op, Operand(bbuf, 0, n, GJ * k * n, k * n),
                       Operand(cbuf, 0, n, GJ * m * n, m * n), what="test")
    got = np.empty((GI, GJ, m, n), np.float32)
    cl.enqueue_copy(queue, got, cbuf)
    want = np.einsum("gkm,gjkn->gjmn", a.astype(np.float64), b.astype(np.float64))
    assert_close(got, want, np.float32, "packed A^T shared by the images")


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (5, 3, 1), (3, 17, 40), (13, 2, 8), (7, 11, 21)], ids=str)
@pytest.mark.parametrize(**LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_cpu_kernel_small_and_thin_products(m, n, k, a_transp, b_transp, dtype, queue):
    """Products smaller than one block (narrower vectors, a last block shifted over the one
    before), and a K that is one vector exactly (no tail)."""
    def run(a, b, c, alpha, beta):
        gemm_cpu.grid_gemm(queue, np.dtype(dtype), Grid(GI, GJ, m, n, k), a._replace(transp=a_transp),
                           b._replace(transp=b_transp), c, Epilogue(alpha, beta), what="test")
    check_grid(queue, run, dtype, "vector", a_transp, b_transp, m, n, k, seed=m * n * k)


@pytest.mark.clblast
@pytest.mark.parametrize(**LAYOUTS)
def test_clblast_grid_of_products_at_offsets(a_transp, b_transp, queue):
    """CLBlast's grid through clconv.gemm.clblast (a loop over one axis, the other batched)."""
    from clconv.gemm import clblast

    def run(a, b, c, alpha, beta):
        clblast.grid_gemm(queue, np.dtype(np.float32), Grid(GI, GJ, 67, 130, 29), a._replace(transp=a_transp),
                          b._replace(transp=b_transp), c, Epilogue(alpha, beta), what="test")
    check_grid(queue, run, np.float32, "scalar", a_transp, b_transp)


def test_cpu_kernel_blocks_from_the_device():
    """Outer products in 2 vectors of the native width (512 bits at most; narrower for products
    narrower than that) by 6 rows (12 accumulators of 16 registers); dot products in 4 x 3 of
    256-bit vectors, 4 x 6 of 512-bit ones (32 registers); enough work per work-item."""
    cpu = _device(gpu=False, compute_units=2)._replace()
    for native, want in ((16, 16), (8, 8), (32, 16)):
        facts = dict(native_vector_width_float=native, native_vector_width_double=native // 2)
        dev = type("D", (), dict(cpu._asdict(), **facts))()
        t = gemm_cpu.tile(dev, 512, 784, 256, 4, 4, False)
        assert (t.inner, t.vw, t.mr, t.nv, t.cols) == (False, want, 6, 2, 2 * want) and t.tm > 1
        assert gemm_cpu.tile(dev, 512, 784, 256, 4, 8, False).vw == want // 2   # float64: half as many
        # narrower than 2 vectors: half as wide, 4 values at least
        for itemsize in (4, 8):
            widest = want * 4 // itemsize
            assert [gemm_cpu.tile(dev, 512, n, 256, 4, itemsize, False).vw for n in (196, 32, 31, 16, 9, 3)] == \
                {16: [16, 16, 8, 8, 4, 4], 8: [8, 8, 8, 8, 4, 4], 4: [4, 4, 4, 4, 4, 4]}[widest]
        for itemsize in (4, 8):
            t = gemm_cpu.tile(dev, 64, 1024, 9216, 1, itemsize, True)
            vw = want * 4 // itemsize
            assert (t.inner, t.vw, t.mr, t.cols) == (True, vw, 4, 6 if vw * itemsize == 64 else 3)


def test_beta_zero_ignores_what_c_held(queue):
    """With beta 0, C is overwritten: NaNs already there do not leak into the result."""
    m, n, k = 9, 11, 5
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    host = np.concatenate([a.ravel(), b.ravel(), np.full(m * n, np.nan, np.float32)])
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    gemm_gpu.grid_gemm(queue, np.dtype(np.float32), Grid(1, 1, m, n, k), Operand(buf, 0, k), Operand(buf, a.size, n),
                       Operand(buf, a.size + b.size, n), what="test")
    c = np.empty(m * n, np.float32)
    cl.enqueue_copy(queue, c, buf, src_offset=4 * (a.size + b.size))
    assert_close(c.reshape(m, n), a.astype(np.float64) @ b, np.float32, "GEMM over NaNs")


@pytest.fixture(params=[1, 2], ids=["one_plane", "two_planes"])
def planes(request, monkeypatch):
    """A test's GEMMs as the rules make them, then with every tile split among two planes of
    work-items (KS), staged twice as deep."""
    def two(device, t, *args):
        deeper = t._replace(tk=t.tk * 2, ks=2)
        assert gemm_gpu.fits(device, deeper), "the test's tile does not fit two planes"
        return deeper
    if request.param > 1:
        monkeypatch.setattr(gemm_gpu, "sliced", two)
    return request.param


@pytest.mark.gpu_form
@pytest.mark.parametrize("positions", [7, 8], ids=["7_positions", "8_positions"])   # scalar, four-wide reads
@pytest.mark.parametrize("math", ["strict", "tf32"])
def test_gpu_kernel_folded_c_and_continuous_k(math, positions, planes, queue, monkeypatch):
    """The GPU kernel's batch modes on a buffer of NaN gaps: C stored image by image (c_fold: the
    columns of 3 images, their rows ``per_image`` apart, written four-wide where aligned) and K blocks read as one depth
    (continuous: 5 blocks of A and B at their own steps), against NumPy; nothing outside the
    images' rows is written, nothing outside the blocks read."""
    if math != "strict":
        matrix_units(queue, monkeypatch, math)
    rng = np.random.default_rng(4)
    m, p, images, blocks, kb = 5, positions, 3, 5, positions
    n = images * p
    aligned = p % 4 == 0   # then every block starts at a multiple of 4: four-wide reads
    # (aligned: C's images start at multiples of 4 too, written four-wide)
    a_step, b_step = m * kb + (4 if aligned else 5), kb * n + (4 if aligned else 7)
    c_per_image = m * p + (4 if aligned else 3)
    a_off, b_off = 4, 4 + blocks * a_step + (0 if aligned else 1)
    c_off = b_off + blocks * b_step + 4
    widths = [gemm_gpu.read_width(queue.device, 4, off, 0, 0, ld, 1, 1, step)
              for off, ld, step in ((a_off, kb, a_step), (b_off, n, b_step))]
    assert widths == [4, 4] if aligned else widths[0] == 1
    assert (c_off % 4 == 0 and c_per_image % 4 == 0) == aligned
    host = np.full(c_off + images * c_per_image + 4, np.nan, np.float32)
    a = rng.standard_normal((blocks, m, kb)).astype(np.float32)
    b = rng.standard_normal((blocks, kb, n)).astype(np.float32)
    for q in range(blocks):
        host[a_off + q * a_step:][:m * kb] = a[q].ravel()
        host[b_off + q * b_step:][:kb * n] = b[q].ravel()
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    dtype = np.dtype(np.float32)
    # C = sum over the blocks of A_q @ B_q, its columns stored image by image
    gemm_gpu.grid_gemm(queue, dtype, Grid(1, 1, m, n, kb, blocks, True), Operand(buf, a_off, kb, k_step=a_step),
                       Operand(buf, b_off, n, k_step=b_step), Operand(buf, c_off, p, 0, c_per_image, fold=p),
                       math=math, what="test")
    got = np.empty_like(host)
    cl.enqueue_copy(queue, got, buf)
    want = sum(a[q].astype(np.float64) @ b[q] for q in range(blocks))
    written = np.zeros(host.size, bool)
    for i in range(images):
        rows = got[c_off + i * c_per_image:][:m * p].reshape(m, p)
        assert_close(rows, want[:, i * p:(i + 1) * p], np.float32, f"image {i}", math=math)
        written[c_off + i * c_per_image:][:m * p] = True
    assert np.array_equal(got[~written], host[~written], equal_nan=True), "written outside the images' rows"


@pytest.mark.gpu_form
@pytest.mark.parametrize("positions", [7, 8], ids=["7_positions", "8_positions"])   # scalar, four-wide reads
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("math", ["strict", "tf32"])
def test_gpu_kernel_folded_b(math, positions, groups, planes, queue, monkeypatch):
    """B's columns over images (b_fold, as grad-input reads an NCHW grad_output): image q's K x p
    rows start ``per_image`` * q on, NaN in the gaps, each group's K rows ``per_group`` further,
    A^T stored as it is; against NumPy, with a K that is no multiple of the slices."""
    if math != "strict":
        matrix_units(queue, monkeypatch, math)
    rng = np.random.default_rng(5)
    m, k, p, images = 37, 37, positions, 3
    n = images * p
    aligned = p % 4 == 0
    per_image = groups * k * p + (4 if aligned else 3)   # a gap after each image
    a_off, b_off = 4, 4 + -(-groups * k * m // 4) * 4 + 4
    c_off = b_off + images * per_image + 4
    host = np.full(c_off + groups * m * n, np.nan, np.float32)
    a = rng.standard_normal((groups, k, m)).astype(np.float32)   # stored K x M: op(A) = A^T
    b = rng.standard_normal((images, groups, k, p)).astype(np.float32)
    host[a_off:][:a.size] = a.ravel()
    for q in range(images):
        host[b_off + q * per_image:][:groups * k * p] = b[q].ravel()
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    assert gemm_gpu.read_width(queue.device, 4, b_off, k * p, 0, p, groups, 1) == (4 if aligned else 1)
    gemm.grid_gemm(queue, "gpu", np.dtype(np.float32), Grid(groups, 1, m, n, k), Operand(buf, a_off, m, k * m, transp=True),
                   Operand(buf, b_off, p, k * p, per_image, fold=p), Operand(buf, c_off, n, m * n), math=math, what="test")
    got = np.empty(groups * m * n, np.float32)
    cl.enqueue_copy(queue, got, buf, src_offset=4 * c_off)
    for g in range(groups):
        want = a[g].T.astype(np.float64) @ np.concatenate([b[q, g] for q in range(images)], axis=1)
        assert_close(got.reshape(groups, m, n)[g], want, np.float32, f"group {g}", math=math)


@pytest.mark.gpu_form
@pytest.mark.parametrize("positions,slices", [(7, 2), (8, 2), (8, 4)],
                         ids=["7_positions", "8_positions", "8_positions_4_slices"])   # scalar, four-wide reads
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("math", ["strict", "tf32"])
def test_gpu_kernel_folded_a(math, positions, slices, groups, planes, queue, monkeypatch):
    """A's depth over images (a_fold, as grad-weight reads an NCHW grad_output): image q's M x p
    rows start ``per_image`` * q on, NaN in the gaps, each group's M rows ``per_group`` further;
    the grid's products along j are split-K slices of that depth, which start inside an image
    (10 images of 7 positions in 2 slices of 35; 9 of 8 in 2 of 36, four-wide, or in 4 of 18,
    value by value); B^T stored as it is, its slices one after the other; against NumPy."""
    if math != "strict":
        matrix_units(queue, monkeypatch, math)
    rng = np.random.default_rng(6)
    m, n, p = 37, 11, positions
    images = 10 if p == 7 else 9
    depth = images * p
    k = depth // slices
    aligned = p % 4 == 0 and k % 4 == 0
    per_image = groups * m * p + (4 if p % 4 == 0 else 3)   # a gap after each image
    a_off = 4
    b_off = a_off + images * per_image + 4
    c_off = b_off + -(-groups * n * depth // 4) * 4 + 4
    host = np.full(c_off + groups * slices * m * n, np.nan, np.float32)
    a = rng.standard_normal((images, groups, m, p)).astype(np.float32)
    b = rng.standard_normal((groups, n, depth)).astype(np.float32)   # stored N x K: op(B) = B^T
    for q in range(images):
        host[a_off + q * per_image:][:groups * m * p] = a[q].ravel()
    host[b_off:][:b.size] = b.ravel()
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    gemm.grid_gemm(queue, "gpu", np.dtype(np.float32), Grid(groups, slices, m, n, k),
                   Operand(buf, a_off, p, m * p, per_image, fold=p), Operand(buf, b_off, depth, n * depth, k, transp=True),
                   Operand(buf, c_off, n, slices * m * n, m * n), math=math, what="test")
    assert (gemm_gpu.read_width(queue.device, 4, a_off, m * p, per_image, p, groups, 1) == 4) == (p % 4 == 0)
    got = np.empty(groups * slices * m * n, np.float32).reshape(groups, slices, m, n)
    cl.enqueue_copy(queue, got, buf, src_offset=4 * c_off)
    for g in range(groups):
        whole = np.concatenate([a[q, g] for q in range(images)], axis=1).astype(np.float64)   # M x depth
        for j in range(slices):
            want = whole[:, j * k:(j + 1) * k] @ b[g, :, j * k:(j + 1) * k].T
            assert_close(got[g, j], want, np.float32, f"group {g}, slice {j} ({'four-wide' if aligned else 'scalar'})",
                         math=math)


# what clconv.gemm asks of a device
Device = namedtuple("Device", "name type max_compute_units max_work_group_size max_work_item_sizes local_mem_size "
                               "mem_base_addr_align")


def _device(gpu=True, compute_units=132, max_work_group_size=1024, local_mem_size=48 * 1024):
    """A stand-in device (an H200's numbers by default)."""
    return Device("stand-in", cl.device_type.GPU if gpu else cl.device_type.CPU, compute_units, max_work_group_size,
                  (1024, 1024, 64), local_mem_size, 4096)


@pytest.mark.parametrize("gpu,requested,env,engine", [
    (True, "auto", "", "gpu"), (False, "auto", "", "cpu"), (True, "clconv", "", "gpu"), (False, "clconv", "", "cpu"),
    (True, "auto", " CLBlast ", "clblast"), (False, "auto", "clconv", "cpu"), (False, "gpu", "clblast", "gpu"),
    (True, "clblast", "", "clblast")],
    ids=["gpu_auto", "cpu_auto", "gpu_clconv", "cpu_clconv", "env_clblast", "env_clconv", "asked_over_env",
         "gpu_clblast"])
def test_engine_choice(gpu, requested, env, engine, monkeypatch):
    """clconv's kernel for the device's type (each measured faster than CLBlast's on every shape
    tried); CLCONV_GEMM, or a plan's gemm=, which wins over it, forces one."""
    monkeypatch.setenv("CLCONV_GEMM", env)
    chosen, why = gemm.choose(_device(gpu), requested)
    assert chosen == engine and why


def test_no_gpu_tile_falls_back_to_clblast(monkeypatch):
    monkeypatch.delenv("CLCONV_GEMM", raising=False)
    small = _device(local_mem_size=1024)
    assert gemm.choose(small)[0] == "clblast"
    with pytest.raises(ValueError, match="no tile of clconv's GPU GEMM kernel fits"):
        gemm.choose(small, "clconv")


def test_unknown_engine_is_refused_when_planning(queue, monkeypatch):
    """Before anything is enqueued: at plan time."""
    import clconv
    monkeypatch.setenv("CLCONV_GEMM", "cublas")
    with pytest.raises(ValueError, match="the GEMM engine must be one of"):
        clconv.plan((1, 2, 5, 5), (3, 2, 3, 3), queue=queue)
    with pytest.raises(ValueError, match="'cublas'"):
        clconv.plan((1, 2, 5, 5), (3, 2, 3, 3), queue=queue, gemm="cublas")


def test_plan_fixes_its_engine_and_explains_it(queue, monkeypatch):
    import clconv
    monkeypatch.setenv("CLCONV_GEMM", "clblast")
    p = clconv.plan((2, 8, 9, 9), (8, 8, 3, 3), padding=1, queue=queue, algorithm="im2col")
    monkeypatch.setenv("CLCONV_GEMM", "clconv")   # later changes do not reach a built plan
    header = p.explain().header
    assert p.gemm == header["gemm"] == "clblast" and header["gemm_reason"] == "CLCONV_GEMM=clblast asks for it"
    assert all(r.engine == "clblast" for r in p.explain().records if r.gemm)


@pytest.mark.parametrize("m,n,count,want", [
    (512, 256, 64, (128, 128, 8)),    # exact multiples, many work-groups: the largest tile
    (4096, 4096, 1, (128, 128, 8)),
    (1024, 448, 8, (128, 64, 8)),     # 448 columns: 64-wide tiles waste none
    (512, 784, 64, (64, 32, 4)),      # 784 columns: 32-wide tiles waste less
    (256, 49, 1, (32, 64, 4)),        # a 1x1 layer on 7x7 at batch 1: 2 work-groups of 128x128, 8 of 32x64
    (64, 12544, 1, (32, 64, 4)),      # 64 rows: 98 work-groups of 128x128 would leave it idle
], ids=["multiples", "one_product", "ragged_n_by_64", "ragged_n_by_32", "few_work_groups", "short_m"])
def test_tile_choice(m, n, count, want):
    t = gemm_gpu.tile(_device(), m, n, count)
    assert (t.tm, t.tn, t.rm) == want


def _kernels_built(queue, monkeypatch, k):
    """The defines of each GEMM kernel built for one aligned grid of 67 x 130 products K deep, run
    through :func:`check_grid` (so also checked against NumPy)."""
    built = []
    real = gemm_gpu.get_kernel
    monkeypatch.setattr(gemm_gpu, "get_kernel", lambda *args, **kw: built.append(kw) or real(*args, **kw))

    def run(a, b, c, alpha, beta):
        gemm_gpu.grid_gemm(queue, np.dtype(np.float32), Grid(GI, GJ, 67, 130, k), a, b, c, Epilogue(alpha, beta),
                           what="test")
    check_grid(queue, run, np.float32, "vector", False, False, 67, 130, k)
    return built


@pytest.mark.gpu_form
def test_eight_by_eight_tiles_launch_as_eight_by_four(queue, monkeypatch):
    """Where the model picks a tile of 8x8 work-items, a launch runs 64x64 tiles of 8x4 ones,
    but not over an im2col B, nor where that tile does not fit; other tiles run as picked."""
    dev, small = _device(), gemm_gpu.TILES[2][0]
    for t, _ in gemm_gpu.TILES[:2]:
        assert gemm_gpu.launched(dev, t) == gemm_gpu.EIGHT_BY_FOUR
        assert gemm_gpu.launched(dev, t, im2col=True) == t
    # float64 on 32 KB: 128x64 fits (25600 bytes staged), the 8x4 tile (34816) does not
    assert gemm_gpu.launched(_device(local_mem_size=32 * 1024), gemm_gpu.TILES[1][0], itemsize=8) == gemm_gpu.TILES[1][0]
    assert gemm_gpu.launched(dev, small) == small
    # and a GEMM the model gives 128x128 builds the 8x4 kernel (and is right)
    monkeypatch.setattr(gemm_gpu, "TILES", gemm_gpu.TILES[:1])
    built = _kernels_built(queue, monkeypatch, k=29)
    # (one plane: at K = 29, two would leave one slice)
    assert [(kw["TM"], kw["TN"], kw["RM"], kw["RN"], kw["TK"], kw["KS"]) for kw in built] == [(64, 64, 8, 4, 16, 1)]


@pytest.mark.gpu_form
def test_planes_above_the_kernels_work_group_limit_fall_back_to_one(queue, monkeypatch):
    """Where the compiler allows the kernel fewer work-items than its planes need, it is built
    again with one plane (and is right)."""
    monkeypatch.setattr(gemm_gpu, "TILES", gemm_gpu.TILES[2:3])
    monkeypatch.setattr(gemm_gpu, "sliced", lambda device, t, *args: t._replace(tk=t.tk * 2, ks=2))
    monkeypatch.setattr(gemm_gpu, "work_group_limit", lambda kernel, device: 128)
    built = _kernels_built(queue, monkeypatch, k=57)
    assert [(kw["TK"], kw["KS"]) for kw in built] == [(32, 2), (16, 1)]


def test_planes_where_the_grid_is_short_of_work_items():
    """KS planes (each doubling the staged depth) while a grid has fewer than SATURATION
    work-items per compute unit, the tile fits and a product keeps two slices."""
    dev, t = _device(), gemm_gpu.TILES[2][0]   # 32x64 of 4x4, 16 deep: 128 work-items
    assert gemm_gpu.sliced(dev, t, 1, 672) == t._replace(tk=32, ks=2)    # 64 deep: 53 KB staged
    assert gemm_gpu.sliced(_device(local_mem_size=64 * 1024), t, 1, 672) == t._replace(tk=64, ks=4)
    assert gemm_gpu.sliced(dev, t, 1, 33) == t._replace(tk=32, ks=2)     # 3 slices become 2
    assert gemm_gpu.sliced(dev, t, 1, 32) == t                              # 2 would become 1
    assert gemm_gpu.sliced(dev, t, 1, 16, 32) == t                          # 32 blocks of one slice each
    assert gemm_gpu.sliced(dev, t, 1, 20, 32) == t._replace(tk=32, ks=2)  # 64 slices become 32
    assert gemm_gpu.sliced(dev, t, 264, 672) == t                           # 132 x 256 work-items
    assert gemm_gpu.sliced(dev, t, 263, 672) == t._replace(tk=32, ks=2)
    assert gemm_gpu.sliced(_device(max_work_group_size=128), t, 1, 672) == t


def test_tile_fits_the_work_group_and_local_memory():
    assert gemm_gpu.tile(_device(max_work_group_size=128), 4096, 4096, 1)[:2] == (128, 64)   # 128 work-items
    # float64: 128x128 stages 33792 bytes, 128x64 25600, 32x64 and 64x32 (16 deep) 26624
    assert gemm_gpu.tile(_device(local_mem_size=32 * 1024), 4096, 4096, 1, 8)[:2] == (128, 64)
    assert gemm_gpu.tile(_device(local_mem_size=26 * 1024), 4096, 4096, 1, 8)[:2] == (128, 64)
    assert gemm_gpu.tile(_device(local_mem_size=16 * 1024), 4096, 4096, 1, 8) is None


def test_tune_gemm_needs_a_pass_that_clblast_runs(queue, monkeypatch):
    """tune-gemm times only passes whose GEMMs CLBlast runs: with every GEMM on clconv's own
    kernel there is nothing to tune, and it says so."""
    from clconv import tuner
    from clconv.geometry import conv_geometry
    monkeypatch.setenv("CLCONV_GEMM", "clconv")   # clconv's kernel for this device type
    with pytest.raises(RuntimeError, match="nothing to tune"):
        tuner.tune_gemm([conv_geometry((2, 8, 9, 9), (8, 8, 3, 3), 1, 1, 1, 1)], queue, save=False)


def test_cached_plans_follow_clconv_gemm(queue, monkeypatch):
    """The functional API's plan cache is keyed by the GEMM request (an "auto" one with
    CLCONV_GEMM), so a changed setting gets a plan of its own, and the same one the same plan."""
    from clconv.geometry import conv_geometry
    from clconv.planner import cached_plan
    g = conv_geometry((2, 8, 9, 9), (8, 8, 3, 3), 1, 1, 1, 1)
    monkeypatch.setenv("CLCONV_GEMM", "clblast")
    first = cached_plan(g, np.float32, queue, "im2col")
    assert first.gemm == "clblast" and cached_plan(g, np.float32, queue, "im2col") is first
    monkeypatch.setenv("CLCONV_GEMM", "clconv")
    assert cached_plan(g, np.float32, queue, "im2col").gemm in ("cpu", "gpu")
    assert cached_plan(g, np.float32, queue, "im2col", gemm="clblast").gemm == "clblast"


@pytest.mark.parametrize("a_transp,b_transp", [(False, False), (True, False), (False, True)], ids=["nn", "tn", "nt"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("variant", ["default", "vw4"])
def test_cpu_kernel_packs_b_in_panels(variant, dtype, a_transp, b_transp, queue, monkeypatch):
    """B packed in panels (pack_b_panels, or B stored N x K transposed into them, pack_bt_panels;
    then the GEMM's outer products on them), on the grid at offsets as above: N of 4 panels and a
    part one read as zeros past its edge; the workspace around the panels stays untouched."""
    if variant == "vw4":
        monkeypatch.setattr(gemm_cpu, "vector_width", lambda device, itemsize: 4)
    monkeypatch.setattr(rules, "PANEL_MIN_ROWS", 67)
    monkeypatch.setattr(rules, "PANEL_MIN_DEPTH", 29)
    monkeypatch.setattr(rules, "BT_PANEL_MIN_ROWS", 67)
    monkeypatch.setattr(rules, "BT_PANEL_MAX_DEPTH", 59)
    itemsize = np.dtype(dtype).itemsize
    size = lambda m, n, k: gemm_cpu.panels_size(queue.device, m, n, k, GI * GJ, itemsize,   # noqa: E731
                                                b_transp=b_transp)
    cols = gemm_cpu.tile(queue.device, 67, 130, 29, GI * GJ, itemsize, False).cols
    monkeypatch.setattr(rules, "PANEL_MIN_ROW_BYTES", 130 * itemsize)
    if b_transp:   # below the rule: too few rows (twice as many from half its depth on), too deep
        assert size(66, 130, 29) == size(133, 130, 30) == size(200, 130, 59) == 0 < size(134, 130, 30)
    else:          # too few rows, too shallow, rows too short
        assert size(66, 130, 29) == size(67, 130, 28) == size(67, 129, 29) == 0

    def run(a, b, c, alpha, beta):
        n = size(67, 130, 29)
        assert n == GI * GJ * -(-130 // cols) * cols * 29
        ws = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                       hostbuf=np.full(n + 10, np.nan, dtype))
        gemm_cpu.grid_gemm(queue, np.dtype(dtype), Grid(GI, GJ, 67, 130, 29), a._replace(transp=a_transp),
                           b._replace(transp=b_transp, pack=Operand(ws, 5, 0)), c, Epilogue(alpha, beta), what="test")
        around = np.empty(n + 10, dtype)
        cl.enqueue_copy(queue, around, ws)
        assert np.isnan(around[:5]).all() and np.isnan(around[-5:]).all() and not np.isnan(around[5:-5]).any()
    check_grid(queue, run, dtype, "scalar", a_transp, b_transp)


@pytest.mark.parametrize("b_transp", [False, True], ids=["b", "b_transposed"])
def test_cpu_kernel_packs_b_in_panels_over_k_blocks_and_once_per_shared_matrix(b_transp, queue):
    """K blocks (3, at strides that are not K apart) packed one after another in each panel; a B
    shared by the images (per-image stride 0) is packed once per group."""
    rng = np.random.default_rng(5)
    m, n, k, blocks = 9, 45, 7, 3
    a = rng.standard_normal((GI, GJ, blocks, m, k + 1)).astype(np.float32)   # each block's rows padded
    b = rng.standard_normal((GI, blocks, k + 2, n)).astype(np.float32)      # a block's rows, then 2 more
    b_stored = np.ascontiguousarray(b.transpose(0, 1, 3, 2)) if b_transp else b   # N x (K + 2) where B^T
    mf = cl.mem_flags
    abuf, bbuf = (cl.Buffer(queue.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x) for x in (a, b_stored))
    cbuf = cl.Buffer(queue.context, mf.READ_WRITE, GI * GJ * m * n * 4)
    cols = gemm_cpu.tile(queue.device, m, n, k, GI, 4, False, blocks).cols
    size = GI * -(-n // cols) * cols * k * blocks   # one matrix per group
    ws = cl.Buffer(queue.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.full(size + 1, np.nan, np.float32))
    gemm_cpu.grid_gemm(queue, np.dtype(np.float32), Grid(GI, GJ, m, n, k, blocks),
                       Operand(abuf, 0, k + 1, GJ * blocks * m * (k + 1), blocks * m * (k + 1), m * (k + 1)),
                       Operand(bbuf, 0, k + 2 if b_transp else n, blocks * (k + 2) * n, 0, (k + 2) * n,
                               transp=b_transp, pack=Operand(ws, 0, 0)),
                       Operand(cbuf, 0, n, GJ * m * n, m * n), what="test")
    got = np.empty((GI, GJ, m, n), np.float32)
    cl.enqueue_copy(queue, got, cbuf)
    last = np.empty(1, np.float32)
    cl.enqueue_copy(queue, last, ws, src_offset=size * 4)
    want = np.einsum("ijqmk,iqkn->ijmn", a[..., :k].astype(np.float64), b[:, :, :k].astype(np.float64))
    assert_close(got, want, np.float32, "B in panels over K blocks")
    assert np.isnan(last[0])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=["float16", "float32", "float64"])
@pytest.mark.parametrize("n,stride,offsets", [(36, 40, (8, 4)), (36, 36, (0, 0)), (35, 40, (8, 4)), (36, 40, (9, 4)),
                                              (36, 40, (8, 5)), (36, 42, (8, 4))],
                         ids=["four_wide", "packed", "odd_n", "odd_part_offset", "odd_out_offset", "odd_stride"])
@pytest.mark.parametrize("accumulate", [False, True], ids=["written", "added"])
@pytest.mark.parametrize("forced", [False, True], ids=["device_rule", "four_wide_forced"])
def test_split_k_partials_summed_in_order(n, stride, offsets, accumulate, forced, dtype, queue, monkeypatch):
    """kernels/partials.cl: out = (accumulate ? out : 0) + the S partials in order, four values per
    work-item where n, the stride and both offsets are multiples of 4 on a device whose rule takes
    that form (sum_partials4; partials._four_wide), else one: against NumPy summing in the same
    order, bit for bit; out's neighbours untouched. Elsewhere the four-wide form is forced too;
    float16 storage (float32 sums) always takes the one-value form."""
    if dtype == np.float64 and "cl_khr_fp64" not in queue.device.extensions:
        pytest.skip("no float64 on this device")
    from clconv.algorithms import partials
    from clconv.algorithms.partials import sum_partials
    from clconv.buffers import Ref
    from clconv.device import scalar_work_items
    from clconv.recording import profiling
    device = queue.device   # the device's own rule, written out: CPUs that keep work-items scalar;
    if device.type & cl.device_type.GPU:   # GPUs where n / 4 work-items fill every compute unit
        rule = n // 4 >= partials._local_size(device) * device.max_compute_units
    else:
        rule = scalar_work_items(device)
    if forced:
        monkeypatch.setattr(partials, "_four_wide", lambda device, itemsize, n: True)
    rng = np.random.default_rng(9)
    S, (part_off, out_off) = 5, offsets
    part = rng.standard_normal(part_off + S * stride).astype(dtype)
    out = rng.standard_normal(out_off + n + 4).astype(dtype)
    want = out.copy()
    real = np.float32 if dtype == np.float16 else dtype   # (float16 storage is summed in float32)
    acc = out[out_off:out_off + n].astype(real) if accumulate else np.zeros(n, real)
    for s in range(S):
        acc = acc + part[part_off + s * stride:][:n].astype(real)
    want[out_off:out_off + n] = acc   # (rounded to float16 storage, to nearest even, as vstore_half_rte)
    buffers = [cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
               for a in (part, out)]
    with profiling() as launched:
        sum_partials(queue, dtype, "int", Ref(buffers[0], part_off), S, n, Ref(buffers[1], out_off), accumulate,
                     "test", stride=stride)
    got = np.empty_like(out)
    cl.enqueue_copy(queue, got, buffers[1])
    np.testing.assert_array_equal(got, want)
    four = (n % 4 == 0 and stride % 4 == 0 and part_off % 4 == 0 and out_off % 4 == 0 and dtype != np.float16
            and (forced or rule))
    assert [name for name, _ in launched] == ["sum_partials4" if four else "sum_partials"]


def test_split_k_sums_on_gpus_four_wide_where_they_fill_the_device(queue, monkeypatch):
    """On a GPU (a stand-in of two compute units) the sum runs in work-groups of
    rules.PARTIALS_GPU_LOCAL (or the kernel's limit), four values per work-item where n / 4 work-items
    make a work-group per compute unit, else one; those launches (made on this queue) give the
    same bits as NumPy."""
    from clconv.algorithms import partials
    from clconv.buffers import Ref
    from clconv.programs import work_group_limit
    from clconv.recording import profiling
    gpu = QueueAs(queue, type=cl.device_type.GPU, max_compute_units=2).device
    local = partials._local_size(gpu)
    assert local == min(rules.PARTIALS_GPU_LOCAL, 1 << (queue.device.max_work_group_size.bit_length() - 1))
    rule, launch, locals_ = partials._four_wide, partials.launch, []
    # (the GPU's rule asked of the stand-in; the launches, on this queue, record their work-groups)
    monkeypatch.setattr(partials, "_local_size", lambda device: local)
    monkeypatch.setattr(partials, "_four_wide", lambda device, itemsize, n: rule(gpu, itemsize, n))
    monkeypatch.setattr(partials, "launch", lambda q, knl, size, group, *a, **k: (
        locals_.append((group, (min(local, work_group_limit(knl, queue.device)),))), launch(q, knl, size, group, *a, **k)))
    rng = np.random.default_rng(3)
    for n, form in ((8 * local + 4, "sum_partials4"), (8 * local - 4, "sum_partials")):
        part = rng.standard_normal(3 * n).astype(np.float32)
        want = part[:n] + part[n:2 * n] + part[2 * n:]
        bufs = [cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
                for a in (part, np.zeros(n, np.float32))]
        with profiling() as launched:
            partials.sum_partials(queue, np.float32, "int", Ref(bufs[0], 0), 3, n, Ref(bufs[1], 0), False, "test")
        got = np.empty(n, np.float32)
        cl.enqueue_copy(queue, got, bufs[1])
        np.testing.assert_array_equal(got, want)
        assert [name for name, _ in launched] == [form], (n, launched)
    assert len(locals_) == 2 and all(got == want for got, want in locals_), locals_   # (the kernel's limit, if less)
