"""The CLBlast GEMM wrapper computes the right product wherever its operands sit in a buffer.

CLBlast's strided-batched GEMM ignores the offset and batch stride of an operand it reads in
place (clconv.gemm.clblast._in_place); these sizes are multiples of its tiles, where that happens.
"""
import numpy as np
import pyopencl as cl
import pytest

from clconv.gemm.clblast import gemm_strided_batched
from helpers import assert_close

pytestmark = pytest.mark.clblast

M, N, K, COUNT = 512, 1024, 512, 2


@pytest.mark.parametrize("b_offset,b_gap,count", [
    (0, 0, COUNT),      # packed at the start of the buffer: the plain strided-batched call
    (64, 0, COUNT),     # aligned offset: a sub-buffer starting at B
    (3, 0, COUNT),      # unaligned offset: one GEMM per matrix
    (0, 32, COUNT),     # a gap between the matrices: one GEMM per matrix
    (64, 0, 1),         # a single matrix: the non-batched GEMM
], ids=["packed", "aligned_offset", "odd_offset", "padded_stride", "single"])
def test_gemm_at_any_offset_and_stride(b_offset, b_gap, count, queue):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((count, M, K), np.float32)
    b = rng.standard_normal((count, K, N), np.float32)
    b_stride = K * N + b_gap
    a_off = b_offset + count * b_stride          # B first, then A, then C, in one buffer
    c_off = a_off + a.size
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4 * (c_off + count * M * N))
    for i in range(count):
        cl.enqueue_copy(queue, buf, b[i], dst_offset=4 * (b_offset + i * b_stride))
    cl.enqueue_copy(queue, buf, a, dst_offset=4 * a_off)
    gemm_strided_batched(queue, np.dtype(np.float32), M, N, K, count, buf, a_off, K, M * K, buf, b_offset, N,
                         b_stride, buf, c_off, N, M * N, what="test")
    c = np.empty((count, M, N), np.float32)
    cl.enqueue_copy(queue, c, buf, src_offset=4 * c_off)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert_close(c, want, np.float32, "GEMM")


@pytest.mark.parametrize("groups,images", [(2, 8), (8, 2)])
def test_grouped_1x1_batches_what_clblast_reads_correctly(groups, images, queue, monkeypatch):
    """Batched over the images, a group's input is not packed (its stride is C*P): the GEMMs
    batch over the groups instead, one call per image, not one per (group, image)."""
    import clconv
    from clconv import reference
    from clconv.gemm import clblast as blas
    monkeypatch.setenv("CLCONV_GEMM", "clblast")   # clconv's own kernels would run otherwise
    xs, ws = (images, 8 * groups, 32, 32), (16 * groups, 8, 1, 1)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    p = clconv.plan(xs, ws, groups=groups, queue=queue)   # (its known-answer check's GEMMs not counted)
    assert p.algorithms["forward"] == "1x1"
    calls = []
    for name in ("gemm", "gemmStridedBatched"):
        original = getattr(blas.pyclblast, name)
        monkeypatch.setattr(blas.pyclblast, name, lambda *a, _f=original, **k: calls.append(1) or _f(*a, **k))
    y = p.forward(x, w)
    assert len(calls) == images
    assert_close(y, reference.conv2d(x, w, groups=groups), np.float32, "forward")


GEMMK1_CODE = """
import numpy as np, pyopencl as cl, clconv
from clconv.gemm import clblast as blas, clblast_params
q = clconv.default_queue()
params = next(p for p in clblast_params.candidates("Xgemm") if p["GEMMK"] == 1)
clblast_params.override(q.device, np.float32, "Xgemm", params)
M, N, K = 512, 1024, 512
rng = np.random.default_rng(0)
a, b = rng.standard_normal((2, M, K), np.float32), rng.standard_normal((2, K, N), np.float32)
offsets = {"b": 64, "a": 64 + 2 * K * N + 64, "c": 64 + 4 * K * N + 128}   # each past an aligned gap
buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 4 * (offsets["c"] + 2 * M * N))
cl.enqueue_copy(q, buf, b, dst_offset=4 * offsets["b"])
cl.enqueue_copy(q, buf, a, dst_offset=4 * offsets["a"])
blas.gemm_strided_batched(q, np.dtype(np.float32), M, N, K, 2, buf, offsets["a"], K, M * K, buf, offsets["b"], N,
                          K * N, buf, offsets["c"], N, M * N, what="test")
c = np.empty((2, M, N), np.float32)
cl.enqueue_copy(q, c, buf, src_offset=4 * offsets["c"])
want = a.astype(np.float64) @ b.astype(np.float64)
print(np.abs(c - want).max() / np.abs(want).max())
"""


def test_gemm_at_offsets_under_a_gemmk1_set():
    """With a tuned GEMMK 1 set applied, CLBlast also reads A and writes C in place: all three
    operands at offsets still give the right product (a process of its own: the set stays).
    Without the workaround's A and C guard, the error was 1.0 on PoCL."""
    import os
    import subprocess
    import sys
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", GEMMK1_CODE], cwd=root, capture_output=True,
                          text=True, timeout=600, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) <= 1e-5
