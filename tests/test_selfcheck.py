"""The known-answer check (clconv.selfcheck): a broken algorithm is caught, left out of "auto",
refused when forced, stored in the tuning cache and shown by `python -m clconv info`."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

import clconv
from clconv import reference, selfcheck, tuning
from clconv.algorithms import direct

ROOT = Path(__file__).resolve().parents[1]
DEPTHWISE = ((2, 6, 11, 9), (6, 1, 3, 3), dict(padding=1, groups=6))   # "auto" runs it on direct kernels


@pytest.fixture
def fresh_verdicts(tmp_path, monkeypatch):
    """A tuning cache of this test's own and no verdicts kept in the process, before and after."""
    monkeypatch.setenv("CLCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CLCONV_SELFCHECK", raising=False)
    selfcheck.forget()
    yield tmp_path
    selfcheck.forget()


@pytest.fixture
def broken_direct(monkeypatch):
    """direct.cl built with a wrong top padding (PT one more than the geometry's): its kernels run
    and return numbers, wrong ones, as a miscompiling driver would."""
    def wrong_padding(*args, **defines):
        defines["PT"] = f"({defines['PT']} + 1)"
        return clconv.programs.get_kernel(*args, **defines)
    monkeypatch.setattr(direct, "get_kernel", wrong_padding)


def _plan(queue, **kw):
    xs, ws, opts = DEPTHWISE
    return clconv.plan(xs, ws, **opts, queue=queue, **kw)


def test_a_broken_algorithm_is_left_out_refused_and_shown(queue, fresh_verdicts, broken_direct, monkeypatch):
    with pytest.warns(RuntimeWarning, match="direct .*failed its known-answer check on " + re.escape(queue.device.name.strip())):
        plan = _plan(queue)
    assert "direct" not in plan.algorithms.values()
    assert any(("direct", "known-answer") in r.passed_over for r in plan.explain().records)
    # what "auto" chose instead is right
    xs, ws, opts = DEPTHWISE
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    err = reference.normalised_error(plan.forward(x, w), reference.conv2d(x, w, **opts))
    assert err <= reference.TOLERANCE[np.dtype(np.float32)]
    with pytest.raises(clconv.ClconvError, match="'direct'.*failed its known-answer check.*normalised max error"):
        _plan(queue, algorithm="direct")
    # the verdict is in the tuning cache, and info shows it (in another process)
    entries = tuning.load()
    failed = [k for k, v in entries.items() if k.startswith("selfcheck|") and "|direct|" in k and not v["ok"]]
    assert len(failed) == 1
    env = dict(os.environ, CLCONV_CACHE_DIR=str(fresh_verdicts))
    out = subprocess.run([sys.executable, "-m", "clconv", "info"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600).stdout
    assert "known-answer check FAILED, left out of 'auto': direct" in out
    # switched off, the check no longer stands in the way
    selfcheck.forget()
    monkeypatch.setenv("CLCONV_SELFCHECK", "0")
    assert set(_plan(queue).algorithms.values()) == {"direct"}


def test_a_passing_verdict_is_kept_and_not_taken_again(queue, fresh_verdicts, monkeypatch):
    assert set(_plan(queue).algorithms.values()) == {"direct"}
    stored = {k: v for k, v in tuning.load().items() if k.startswith("selfcheck|") and "|direct|" in k}
    assert len(stored) == 1 and next(iter(stored.values()))["ok"] is True
    # a new process (no verdicts in memory) takes it from the cache instead of checking again
    selfcheck.forget()
    monkeypatch.setattr(selfcheck, "run", lambda *a, **k: pytest.fail("checked again"))
    assert set(_plan(queue).algorithms.values()) == {"direct"}
    assert set(_plan(queue, algorithm="direct").algorithms.values()) == {"direct"}


def test_every_case_applies_to_its_algorithm():
    from clconv.algorithms import ALGORITHMS
    from clconv.geometry import conv_geometry
    assert {case[0] for case in selfcheck.CASES} == set(ALGORITHMS)
    for name, label, xs, ws, opts in selfcheck.CASES:
        g = conv_geometry(xs, ws, opts.get("stride", 1), opts.get("padding", 0), opts.get("dilation", 1),
                          opts.get("groups", 1))
        assert ALGORITHMS[name].applies(g)[0], label


def test_the_check_does_not_wait_on_the_callers_queue(queue, fresh_verdicts):
    """A plan's first use on a queue held back by a user event (work the check cannot see) runs
    the check on a queue of its own: the plan comes back while the caller's queue still waits."""
    held = cl.CommandQueue(queue.context, queue.device)
    gate = cl.UserEvent(queue.context)
    cl.enqueue_barrier(held, wait_for=[gate])
    try:
        assert set(_plan(held).algorithms.values()) == {"direct"}
        assert any(k.startswith("selfcheck|") and "|direct|" in k for k in tuning.load())
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
        held.finish()
