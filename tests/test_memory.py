"""Results and workspaces from the memory pools (clconv/memory.py): reuse, safety, a user's
allocator, the free call, and sizes no allocation can hold."""
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import reference
from helpers import CASES, QueueAs, assert_close

CASE = CASES[1]   # grouped, strided; with im2col a workspace in every pass


def _device(queue, case=CASE, seed=0):
    return [cla.to_device(queue, a) for a in case.data(seed=seed)]


def _blocks():
    s = clconv.memory_stats()
    return s["active_blocks"] + s["held_blocks"], s["managed_bytes"]


def test_plain_calls_reuse_pooled_memory(queue):
    """1,000 plain calls of every pass take no new device memory after the first: the blocks
    the pools got from the driver stay the same."""
    x, w, b, dy = _device(queue)
    opts = dict(CASE.options, algorithm="im2col")

    def step():
        clconv.conv2d(x, w, b, **opts)
        clconv.conv2d_input(x.shape, w, dy, **opts)
        clconv.conv2d_weight(x, w.shape, dy, **opts)
        clconv.conv2d_bias(dy)
    step()
    queue.finish()
    before = _blocks()
    for _ in range(1000 // 4):
        step()
    queue.finish()
    assert _blocks() == before


def test_module_steps_reuse_pooled_memory(queue):
    x, _, _, dy = CASE.data()
    conv = clconv.nn.Conv2d(CASE.input_shape[1], CASE.weight_shape[0], CASE.weight_shape[2:], **CASE.options,
                            queue=queue, seed=0)
    xd, dyd = cla.to_device(queue, x), cla.to_device(queue, dy)
    for _ in range(2):
        conv.forward(xd)
        conv.backward(xd, dyd)
    queue.finish()
    before = _blocks()
    for _ in range(50):
        conv.forward(xd)
        conv.backward(xd, dyd)
    queue.finish()
    assert _blocks() == before


def test_a_result_is_not_overwritten_by_the_next_call(queue):
    """Dropped results' blocks come back, but one still held is never handed out again."""
    opts = CASE.options
    (x1, w, b, _), (x2, *_) = CASE.data(seed=1), CASE.data(seed=2)
    y1 = clconv.conv2d(cla.to_device(queue, x1), cla.to_device(queue, w), cla.to_device(queue, b), **opts)
    ys = [clconv.conv2d(cla.to_device(queue, x2), cla.to_device(queue, w), cla.to_device(queue, b), **opts)
          for _ in range(3)]   # their dropped uploads make free blocks the next calls take
    assert len({y.base_data.int_ptr for y in [y1] + ys}) == 4
    assert_close(y1.get(), reference.conv2d(x1, w, b, **opts), np.float32, "first result")
    for y in ys:
        assert_close(y.get(), reference.conv2d(x2, w, b, **opts), np.float32, "later result")


def test_a_block_read_on_another_queue_is_not_reused_before_that_queue_is_done(queue):
    """y comes from queue q1's pool and is read by a pass on q2, held back by a user event;
    the caller drops y, and q1 goes on producing results. None of them may take y's block
    while q2 has not run: q2's result must still be the one of y's values."""
    q1, q2 = queue, cl.CommandQueue(queue.context, queue.device)
    x, w, b, _ = CASE.data(seed=4)
    opts = CASE.options
    xd, wd, bd = (cla.to_device(q1, a) for a in (x, w, b))
    y = clconv.conv2d(xd, wd, bd, **opts)                 # from q1's pool
    w2 = np.random.default_rng(5).standard_normal((4, y.shape[1], 1, 1)).astype(np.float32)
    w2d = cla.to_device(q1, w2)
    q1.finish()
    gate = cl.UserEvent(queue.context)
    cl.enqueue_barrier(q2, wait_for=[gate])               # q2 cannot start until the gate opens
    z = clconv.conv2d(y, w2d, queue=q2)
    y_ptr = y.base_data.int_ptr
    del y
    others = [clconv.conv2d(xd, wd, **opts) for _ in range(4)]   # q1 runs: these write their results
    q1.finish()
    assert all(o.base_data.int_ptr != y_ptr for o in others)
    gate.set_status(cl.command_execution_status.COMPLETE)
    q2.finish()
    want = reference.conv2d(reference.conv2d(x, w, b, **opts), w2)
    assert_close(z.get(), want, np.float32, "result read on the second queue")


def test_a_users_allocator_takes_results_and_workspaces(queue):
    x, w, b, dy = _device(queue)
    asked = []

    def allocator(nbytes):
        asked.append(nbytes)
        return cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, nbytes)
    # explicit im2col, whose forward has a workspace on every engine (clconv's GPU kernel reads a
    # few-channel im2col in place)
    opts = dict(CASE.options, algorithm="im2col", gemm="clblast")
    clconv.conv2d(x, w, b, **opts)   # the pool's blocks for this call exist already
    queue.finish()
    before = _blocks()
    p = clconv.plan(x.shape, w.shape, **opts, queue=queue)
    y = clconv.conv2d(x, w, b, **opts, allocator=allocator)
    workspace = p._runs["forward"][2]
    assert workspace > 0 and asked == [y.nbytes, workspace]
    assert isinstance(y.base_data, cl.Buffer) and _blocks() == before
    assert_close(y.get(), reference.conv2d(*CASE.data()[:3], **CASE.options), np.float32, "forward")
    conv = clconv.nn.Conv2d(4, 6, 3, **CASE.options, queue=queue, allocator=allocator)
    asked.clear()
    conv.forward(x)
    assert asked and asked[0] == y.nbytes


def test_free_memory_returns_the_free_blocks(queue):
    x, w, b, _ = _device(queue)
    for _ in range(3):
        clconv.conv2d(x, w, b, **CASE.options)
    queue.finish()
    assert clconv.memory_stats()["held_blocks"] > 0
    kept = clconv.conv2d(x, w, b, **CASE.options)   # in use: stays valid
    clconv.free_memory()
    stats = clconv.memory_stats()
    assert stats["held_blocks"] == 0 and stats["active_blocks"] >= 1
    assert_close(kept.get(), reference.conv2d(*CASE.data()[:3], **CASE.options), np.float32, "kept result")


def test_a_result_larger_than_one_allocation_is_refused_before_enqueueing(queue):
    x = cla.to_device(queue, np.ones((1, 2, 3, 3), np.float32))
    w = cla.to_device(queue, np.ones((2, 2, 1, 1), np.float32))
    out = cla.zeros(queue, (1, 2, 3, 3), np.float32)
    limit = queue.device.max_mem_alloc_size
    with pytest.raises(ValueError, match=rf"the output \[1, 2, 2000003, 2000003\] of float32 needs "
                                         rf"32000096000072 bytes, above the largest allocation of .*, {limit} bytes"):
        clconv.conv2d(x, w, padding=10**6, out=out)
    assert not out.get().any()


def test_an_input_larger_than_one_allocation_is_refused_with_a_batch_that_fits(queue):
    small = QueueAs(queue, max_mem_alloc_size=3 * 16 * 32 * 32 * 4)   # three images of the input
    with pytest.raises(ValueError, match=r"the input \[8, 16, 32, 32\] of float32 needs 524288 bytes, above the "
                                         r"largest allocation .* 196608 bytes; a batch of at most 3 image\(s\) would fit"):
        clconv.Plan(clconv.conv_geometry((8, 16, 32, 32), (4, 16, 3, 3), padding=1), np.float32, small)
