"""bench.profile.device_time, the steady-state device time that bench.profile, bench.networks
--profile and bench.host report: each call's launches are the plan's, by name."""
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv
from clconv.bench.profile import device_time


@pytest.fixture
def profiling(queue):
    return cl.CommandQueue(queue.context, queue.device, properties=cl.command_queue_properties.PROFILING_ENABLE)


def test_device_time_is_per_call_and_names_the_plans_launches(profiling):
    rng = np.random.default_rng(0)
    x = cla.to_device(profiling, rng.standard_normal((2, 4, 9, 7)).astype(np.float32))
    w = cla.to_device(profiling, rng.standard_normal((6, 4, 3, 3)).astype(np.float32))
    p = clconv.plan(x.shape, w.shape, padding=1, queue=profiling, algorithm="winograd")
    ms, launches, kernels = device_time(lambda q: p.forward(x, w, queue=q), profiling)
    names = p.launches("forward")
    assert launches == len(names) >= 3 and set(kernels) == set(names), (launches, kernels, names)
    assert ms > 0 and all(t > 0 for t in kernels.values())
    # one call's time, not the burst's: at most the sum of its kernels' medians, give or take the spread
    assert ms <= 2 * sum(kernels.values())


def test_device_time_refuses_calls_that_launch_differently(profiling):
    rng = np.random.default_rng(1)
    x = cla.to_device(profiling, rng.standard_normal((1, 4, 6, 5)).astype(np.float32))
    w = cla.to_device(profiling, rng.standard_normal((4, 4, 3, 3)).astype(np.float32))
    plans = [clconv.plan(x.shape, w.shape, queue=profiling, algorithm=a) for a in ("winograd", "direct")]
    calls = iter(range(100))
    # after the warm-up: direct's launches, winograd's, direct's again
    with pytest.raises(RuntimeError, match="launched different kernels"):
        device_time(lambda q: plans[next(calls) % 2].forward(x, w, queue=q), profiling, calls=3)
    # one plan's pass run once, twice, three times: the same kernel, 2 a call by count alone
    repeats = iter(range(100))

    def runs(q):
        for _ in range(next(repeats) % 4):
            plans[1].forward(x, w, queue=q)
    with pytest.raises(RuntimeError, match="launched different kernels"):
        device_time(runs, profiling, calls=3)
    with pytest.raises(ValueError, match="more than 2 calls"):
        device_time(runs, profiling, calls=2)
