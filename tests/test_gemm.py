"""clconv's own GEMM kernel (clconv.gemm) against NumPy, and when it is used."""
from collections import namedtuple

import numpy as np
import pyopencl as cl
import pytest

from clconv import gemm
from helpers import assert_close

GI, GJ = 2, 3   # a 2 x 3 grid of products


@pytest.fixture(autouse=True)
def fresh_tile_choices():
    """Tile choices are cached; tests that restrict the tiles must not see (or leave)
    other choices."""
    gemm.tile.cache_clear()
    yield
    gemm.tile.cache_clear()


# every tile in float32; float64 on the smallest (each tile, layout and dtype is a kernel build);
# each with scalar reads (offsets and strides not multiples of 4) and four-wide ones (offsets,
# strides and leading dimensions multiples of 4), and once each with one operand read four-wide
TILE_DTYPES = [(t[0], np.float32) for t in gemm.TILES] + [(gemm.TILES[-1][0], np.float64)]
CASES = ([(t, d, r) for t, d in TILE_DTYPES for r in ("scalar", "vector")]
         + [(gemm.TILES[1][0], np.float32, r) for r in ("wide_a", "wide_b")])


@pytest.mark.parametrize("a_transp,b_transp", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["nn", "tn", "nt", "tt"])
@pytest.mark.parametrize("tile,dtype,reads", CASES,
                         ids=[f"{t[0]}x{t[1]}-{np.dtype(d).name}-{r}" for t, d, r in CASES])
def test_grid_of_products_at_offsets(tile, dtype, reads, a_transp, b_transp, queue, monkeypatch):
    """Odd sizes (no dimension a multiple of a tile or of 4, K not of the slice depth), padded
    leading dimensions, gaps between matrices, alpha and beta; C outside the products stays as
    it was. Everything outside the matrices is NaN, so a read past an edge shows."""
    if dtype == np.float64 and "cl_khr_fp64" not in queue.device.extensions:
        pytest.skip("no float64 on this device")
    monkeypatch.setattr(gemm, "TILES", tuple(t for t in gemm.TILES if t[0] == tile))
    m, n, k = 67, 130, 29
    rng = np.random.default_rng(1)
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
    widths = [gemm.read_width(queue.device, np.dtype(dtype).itemsize, offsets[x], si[x], sj[x], lds[x], GI, GJ)
              for x in "AB"]
    assert widths == [4 if aligned[x] else 1 for x in "AB"], "the layout does not give the reads it tests"

    def view(x, h, i, j):   # a writable view of matrix (i, j) of operand x in h
        (rows, cols), o = shapes[x], offsets[x] + i * si[x] + j * sj[x]
        return h[o:o + rows * lds[x]].reshape(rows, lds[x])[:, :cols]

    for x in "ABC":
        for i in range(GI):
            for j in range(GJ):
                view(x, host, i, j)[...] = rng.standard_normal(shapes[x])

    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    alpha, beta = 1.5, -0.5
    gemm.grid_gemm(queue, np.dtype(dtype), GI, GJ, m, n, k, buf, buf, buf, tuple(offsets.values()),
                   tuple(si.values()), tuple(sj.values()), tuple(lds.values()), alpha=alpha, beta=beta,
                   a_transp=a_transp, b_transp=b_transp, what="test")
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
    assert_close(got[touched], want[touched], dtype, f"grid GEMM {tile}")
    assert np.array_equal(got[~touched], host[~touched], equal_nan=True), "written outside the C matrices"


def test_beta_zero_ignores_what_c_held(queue):
    """With beta 0, C is overwritten: NaNs already there do not leak into the result."""
    m, n, k = 9, 11, 5
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    host = np.concatenate([a.ravel(), b.ravel(), np.full(m * n, np.nan, np.float32)])
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    gemm.grid_gemm(queue, np.dtype(np.float32), 1, 1, m, n, k, buf, buf, buf, (0, a.size, a.size + b.size),
                   (0, 0, 0), (0, 0, 0), (k, n, n), what="test")
    c = np.empty(m * n, np.float32)
    cl.enqueue_copy(queue, c, buf, src_offset=4 * (a.size + b.size))
    assert_close(c.reshape(m, n), a.astype(np.float64) @ b, np.float32, "GEMM over NaNs")


# what clconv.gemm asks of a device
Device = namedtuple("Device", "type max_compute_units max_work_group_size max_work_item_sizes local_mem_size "
                               "mem_base_addr_align")


def _device(gpu=True, compute_units=132, max_work_group_size=1024, local_mem_size=48 * 1024):
    """A stand-in device (an H200's numbers by default)."""
    return Device(cl.device_type.GPU if gpu else cl.device_type.CPU, compute_units, max_work_group_size,
                  (1024, 1024, 64), local_mem_size, 4096)


@pytest.mark.parametrize("m,n,count,engine,own", [
    (512, 784, 64, "auto", True),       # a pointwise convolution's products
    (64, 147, 49, "auto", True),        # the 7x7 stem's split-K grad-weight: a grid of few tiles
    (1600, 4096, 1, "auto", True),      # fully-connected mode: every dimension large
    (1600, 4096, 1, "clconv", True),
    (512, 784, 64, "clblast", False),
], ids=["pointwise", "few_tiles", "all_large", "forced_clconv", "forced_clblast"])
def test_engine_choice(m, n, count, engine, own, monkeypatch):
    """GPUs run every product on clconv's kernel (it measured faster than CLBlast's on every
    shape tried, fully-connected ones included), CPUs none; CLCONV_GEMM forces either."""
    monkeypatch.setenv("CLCONV_GEMM", engine)
    assert gemm.use_own(_device(), m, n, count) is own
    if engine == "auto":
        assert gemm.use_own(_device(gpu=False), m, n, count) is False   # CPUs keep CLBlast


@pytest.mark.parametrize("value,engine", [("", "auto"), (" CLBlast ", "clblast"), ("clconv", "clconv")])
def test_engine_names(value, engine, monkeypatch):
    monkeypatch.setenv("CLCONV_GEMM", value)
    assert gemm.engine() == engine


def test_unknown_engine_is_refused_when_planning(queue, monkeypatch):
    """Before anything is enqueued: at plan time."""
    import clconv
    monkeypatch.setenv("CLCONV_GEMM", "cublas")
    with pytest.raises(ValueError, match="CLCONV_GEMM must be one of"):
        clconv.plan((1, 2, 5, 5), (3, 2, 3, 3), queue=queue)


@pytest.mark.parametrize("m,n,count,want", [
    (512, 256, 64, (128, 128)),     # exact multiples: the largest tile
    (512, 784, 64, (128, 64)),      # 784 columns: 64-wide tiles waste less
    (192, 192, 576, (64, 64)),      # 192 = 1.5 x 128
    (64, 12544, 1, (64, 64)),       # 64 rows
], ids=["multiples", "ragged_n", "ragged_both", "short_m"])
def test_tile_choice(m, n, count, want):
    assert gemm.tile(_device(), m, n, count) == want


def test_tile_fits_the_work_group_and_local_memory():
    assert gemm.tile(_device(max_work_group_size=128), 4096, 4096, 1) == (128, 64)
    # float64: 128x128 stages 33792 bytes, 128x64 25600, 64x64 17408
    assert gemm.tile(_device(local_mem_size=32 * 1024), 4096, 4096, 1, 8) == (128, 64)
    assert gemm.tile(_device(local_mem_size=16 * 1024), 4096, 4096, 1, 8) is None
    assert not gemm.use_own(_device(local_mem_size=16 * 1024), 512, 784, 64, 8)   # so CLBlast runs it


def test_tune_gemm_needs_a_pass_that_clblast_runs(queue, monkeypatch):
    """tune-gemm times only passes whose GEMMs CLBlast runs: with every GEMM on clconv's own
    kernel there is nothing to tune, and it says so."""
    from clconv import tuning
    from clconv.geometry import conv_geometry
    monkeypatch.setenv("CLCONV_GEMM", "clconv")
    with pytest.raises(RuntimeError, match="nothing to tune"):
        tuning.tune_gemm([conv_geometry((2, 8, 9, 9), (8, 8, 3, 3), 1, 1, 1, 1)], queue, save=False)
