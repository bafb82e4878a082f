"""Determinism and threads: same answers every run, on every queue."""
import threading

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv import reference
from helpers import CASES, Case, assert_close

DETERMINISM = [  # one case per algorithm, plus per-group queues and split-K grad-weight
    (Case("im2col_split_k", 4, 4, 17, 19, 6, 3, 3, padding=1, groups=2), "im2col", "single"),
    (Case("im2col_per_group", 4, 4, 17, 19, 6, 3, 3, padding=1, groups=2), "im2col", "per-group"),
    (Case("depthwise", 3, 6, 40, 33, 12, 3, 3, stride=2, padding=1, groups=6), "direct", "single"),
    (Case("fc", 5, 8, 3, 2, 12, 3, 2, groups=4), "fc", "per-group"),
    (Case("pointwise", 5, 6, 13, 7, 9, 1, 1, groups=3), "1x1", "single"),
]


@pytest.mark.parametrize("case,algorithm,queues", DETERMINISM, ids=lambda v: getattr(v, "name", v))
def test_twenty_runs_are_bitwise_identical(case, algorithm, queues, queue):
    x, w, b, dy = (cla.to_device(queue, a) for a in case.data())
    p = clconv.plan(x.shape, w.shape, **case.options, queue=queue, algorithm=algorithm, queues=queues)
    runs = [[p.forward(x, w, b).get(), p.backward_input(w, dy).get(), p.backward_weight(x, dy).get(),
             clconv.conv2d_bias(dy).get()] for _ in range(20)]
    for run in runs[1:]:
        for first, again in zip(runs[0], run):
            np.testing.assert_array_equal(first, again)


def test_two_threads_on_their_own_queues(queue):
    cases = [CASES[1], CASES[3], CASES[8], CASES[11]]
    errors = []

    def work(q):
        try:
            for case in cases * 3:
                x, w, b, dy = case.data()
                dx_, dw_, db_, ddy = (cla.to_device(q, a) for a in (x, w, b, dy))
                y = clconv.conv2d(dx_, dw_, db_, **case.options)
                gx = clconv.conv2d_input(x.shape, dw_, ddy, **case.options)
                gw = clconv.conv2d_weight(dx_, w.shape, ddy, **case.options)
                assert y.queue is q
                assert_close(y.get(), reference.conv2d(x, w, b, **case.options), np.float32, "forward")
                assert_close(gx.get(), reference.conv2d_input(x.shape, w, dy, **case.options), np.float32, "dx")
                assert_close(gw.get(), reference.conv2d_weight(x, w.shape, dy, **case.options), np.float32, "dw")
        except Exception as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(cl.CommandQueue(queue.context),)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
