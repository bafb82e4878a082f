"""Property tests: random valid configurations, every pass against the reference.

A fixed, derandomised profile keeps the run bounded and repeatable in CI.
"""
import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import clconv
from clconv import reference
from clconv.geometry import conv_geometry
from helpers import assert_close

settings.register_profile("clconv", max_examples=40, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.load_profile("clconv")

small = st.integers(1, 3)
paddings = st.one_of(st.integers(0, 2), st.tuples(st.integers(0, 2), st.integers(0, 2)),
                     st.tuples(st.tuples(st.integers(0, 2), st.integers(0, 2)),
                               st.tuples(st.integers(0, 2), st.integers(0, 2))),
                     st.sampled_from(["same", "valid"]))


@st.composite
def configs(draw):
    groups = draw(st.integers(1, 3))
    cg, kg = draw(small), draw(small)
    if draw(st.booleans()):               # depthwise with a channel multiplier
        cg = 1
    shape = (draw(st.integers(0, 3)), cg * groups, draw(st.integers(1, 11)), draw(st.integers(1, 11)))
    weight = (kg * groups, cg, draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    opts = dict(stride=draw(st.one_of(small, st.tuples(small, small))),
                padding=draw(paddings),
                dilation=draw(st.one_of(st.integers(1, 2), st.tuples(st.integers(1, 2), st.integers(1, 2)))),
                groups=groups)
    try:
        conv_geometry(shape, weight, **opts)
    except ValueError:
        assume(False)
    return shape, weight, opts, draw(st.sampled_from(["auto", "im2col"]))


@given(configs(), st.integers(0, 2**31 - 1))
def test_random_configurations_match_reference(config, seed):
    shape, weight, opts, algorithm = config
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(weight).astype(np.float32)
    b = rng.standard_normal(weight[0]).astype(np.float32)
    y_ref = reference.conv2d(x, w, b, **opts)
    dy = rng.standard_normal(y_ref.shape).astype(np.float32)
    assert_close(clconv.conv2d(x, w, b, **opts, algorithm=algorithm), y_ref, np.float32, "forward")
    assert_close(clconv.conv2d_input(shape, w, dy, **opts, algorithm=algorithm),
                 reference.conv2d_input(shape, w, dy, **opts), np.float32, "grad-input")
    assert_close(clconv.conv2d_weight(x, weight, dy, **opts, algorithm=algorithm),
                 reference.conv2d_weight(x, weight, dy, **opts), np.float32, "grad-weight")
    assert_close(clconv.conv2d_bias(dy), reference.conv2d_bias(dy), np.float32, "grad-bias")
