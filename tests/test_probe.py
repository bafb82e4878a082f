"""A device that cannot build kernels (clconv.probe), on the device under test made to fail its
builds (tests/failing_builds.py): never the default, its compiler's words in every error, plan
errors that name what the known-answer check left out, and no failure of the device's kept as
an algorithm's."""
import os
import subprocess
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

import clconv
from clconv import device, probe, programs, reference, selfcheck, tuning
from clconv.programs import BuildError, ClconvError

import failing_builds
from failing_builds import MESSAGE

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty tuning cache and no answers or verdicts of this process (restored after)."""
    monkeypatch.setenv("CLCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(probe, "_answers", {})
    monkeypatch.setattr(selfcheck, "_verdicts", {})
    monkeypatch.setattr(device, "_warned", set())


def new_queue(queue):
    """A queue on a new context of the device under test: nothing cached for it yet (the
    context is kept with it: a runtime may release a context its program no longer holds)."""
    queues = clconv.device_queues([queue.device])
    _kept.append(queues)
    return queues[0]


_kept = []


def broken_queue(queue, monkeypatch, spare_probe=False):
    """:func:`new_queue` of the device under test, whose builds now fail."""
    failing_builds.install(queue.device.platform.name, spare_probe, patch=monkeypatch.setattr)
    return new_queue(queue)


def stored(prefix):
    return {k: v for k, v in tuning.load().items() if k.startswith(prefix)}


def test_build_error_carries_the_compilers_words(queue, monkeypatch):
    q = broken_queue(queue, monkeypatch)
    with pytest.raises(BuildError) as info:
        programs.get_kernel(q.context, "bias.cl", "fill_bias", np.float32)
    first = str(info.value).splitlines()[0]
    assert first.startswith("clconv: building bias.cl failed: ") and MESSAGE in first
    assert MESSAGE in info.value.compiler_lines and "\n" not in info.value.compiler_lines


def test_plan_on_a_device_that_cannot_build_raises_its_line(queue, monkeypatch, fresh):
    x, w = np.ones((2, 3, 7, 5), np.float32), np.ones((4, 3, 3, 3), np.float32)
    with monkeypatch.context() as m:
        q = broken_queue(queue, m)
        with pytest.raises(ClconvError, match="cannot build kernels: .*" + MESSAGE):
            clconv.conv2d(x, w, queue=q)
        assert stored("buildcheck|") == {probe.key(q.device): {"ok": False, "line": probe.check(q.device)[1]}}
        assert not stored("selfcheck|"), "a failure of the whole device was kept as an algorithm's verdict"
    # the device builds again: once probed anew (a new driver, python -m clconv check), its plans run as usual
    assert probe.check(q.device, fresh=True) == (True, "")
    q = new_queue(queue)
    np.testing.assert_allclose(clconv.conv2d(x, w, queue=q), reference.conv2d(x, w), rtol=1e-5)
    assert stored("selfcheck|") and all(v["ok"] for v in stored("selfcheck|").values())


def test_plan_error_names_what_the_known_answer_check_left_out(queue, monkeypatch, fresh):
    """The device builds (its probe passes) but every convolution kernel fails: the plan's error
    is a ClconvError naming the algorithms left out with the compiler's words, beside those
    that do not apply, and the verdicts stored carry the compiler's words too."""
    q = broken_queue(queue, monkeypatch, spare_probe=True)
    x, w = np.ones((1, 4, 9, 7), np.float32), np.ones((6, 2, 5, 5), np.float32)
    with pytest.warns(RuntimeWarning, match="failed its known-answer check"):
        with pytest.raises(ClconvError) as info:
            clconv.conv2d(x, w, padding=2, groups=2, queue=q)
    message = str(info.value)
    assert "left out by the known-answer check: " in message and MESSAGE in message
    assert "not applicable: " in message and "1x1: " in message
    verdicts = stored("selfcheck|")
    assert verdicts and not any(v["ok"] for v in verdicts.values())
    assert all(MESSAGE in v["message"] for v in verdicts.values())
    assert stored("buildcheck|")[probe.key(q.device)]["ok"] is True


def test_the_default_passes_over_a_device_that_cannot_build(queue, monkeypatch, fresh):
    others = [e for e in device._all_devices() if e[3] != queue.device]
    if not others:
        pytest.skip("one OpenCL device only: nothing to pass over to")
    failing_builds.install(queue.device.platform.name, patch=monkeypatch.setattr)
    # the device under test first in the default's order (and every device of its platform, which breaks too)
    monkeypatch.setattr(device, "preference", lambda e: (e[2] != queue.device.platform, e[0], e[1]))
    with pytest.warns(RuntimeWarning) as warned:
        chosen, why = device.pick_device("")
    assert chosen.platform != queue.device.platform
    assert "which cannot build kernels" in why and probe.describe(queue.device) in why
    said = [str(w.message) for w in warned if probe.describe(queue.device) in str(w.message)]
    assert len(said) == 1 and "cannot build kernels: " in said[0] and MESSAGE in said[0]
    with no_runtime_warning():
        device.pick_device("")   # said once per process


@contextmanager
def no_runtime_warning():
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        yield
    assert not [w for w in log if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in log]


def test_a_spec_naming_only_a_device_that_cannot_build_returns_it(queue, monkeypatch, fresh):
    entry = next(e for e in device._all_devices() if e[3] == queue.device)
    failing_builds.install(queue.device.platform.name, patch=monkeypatch.setattr)
    with no_runtime_warning():
        chosen, why = device.pick_device(f"{entry[0]}:{entry[1]}")
    assert chosen == queue.device and why.endswith("no device found builds kernels")


def run(args, env):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.whole_program
def test_demo_and_info_where_the_default_device_cannot_build(queue, tmp_path):
    """As on a CPU whose PoCL cannot compile: the demo passes on another device with one
    warning naming the cause, info lists the device with its compiler's line, and the demo
    on that device ends in a one-line ClconvError with no traceback."""
    env = {"CLCONV_CACHE_DIR": str(tmp_path), "CLCONV_DEVICE": ""}
    default, _ = device.pick_device("")
    entries = device._all_devices()
    if all(p == default.platform for *_, p, _ in entries):
        pytest.skip("the default device's platform is the only one: nothing to pass over to")
    wrapper = ["tests/failing_builds.py", default.platform.version]   # this platform alone, not a second PoCL
    demo = run([*wrapper, "-m", "clconv.demo"], env)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "check against the NumPy reference: PASSED" in demo.stdout
    warned = [line for line in demo.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warned) == 1 and probe.describe(default) in warned[0] and MESSAGE in warned[0], demo.stderr
    info = run([*wrapper, "-m", "clconv", "info"], env)
    assert info.returncode == 0, info.stdout + info.stderr
    assert f"cannot build kernels: " in info.stdout and MESSAGE in info.stdout
    index = next(f"{pi}:{di}" for pi, di, _, d in entries if d == default)
    named = run([*wrapper, "-m", "clconv.demo"], {**env, "CLCONV_DEVICE": index})
    assert named.returncode == 1
    last = named.stdout.strip().splitlines()[-1]
    assert last.startswith("clconv.demo: ClconvError: ") and "cannot build kernels: " in last and MESSAGE in last
    assert "Traceback" not in named.stdout + named.stderr


class _Named:
    def __init__(self, **names):
        self.__dict__.update(names)


def test_two_pocls_the_newer_that_builds(monkeypatch, fresh):
    """PyPI's PoCL 3.0 listed before Debian's 3.1: CLCONV_DEVICE=pocl and the default take 3.1,
    or 3.0 where 3.1 cannot build (one warning naming it)."""
    wheel = _Named(name="Portable Computing Language", vendor="The pocl project", version="OpenCL 3.0 PoCL 3.0-rc2")
    debian = _Named(name="Portable Computing Language", vendor="The pocl project", version="OpenCL 3.0 PoCL 3.1+debian")
    on_wheel, on_debian = (_Named(name=f"pthread-{n}", vendor="AuthenticAMD", type=cl.device_type.CPU, platform=p,
                                  driver_version=v, int_ptr=i)
                           for n, p, v, i in (("AMD EPYC", wheel, "3.0-rc2", 1), ("znver5-AMD EPYC", debian, "3.1", 2)))
    monkeypatch.setattr(device, "_all_devices", lambda: [(0, 0, wheel, on_wheel), (1, 0, debian, on_debian)])
    builds = {1: (True, ""), 2: (True, "")}
    monkeypatch.setattr(probe, "check", lambda d: builds[d.int_ptr])
    assert device.pick_device("pocl")[0] is on_debian and device.pick_device("")[0] is on_debian
    builds[2] = (False, "error: unknown target CPU 'generic'")
    with pytest.warns(RuntimeWarning, match="pthread-znver5-AMD EPYC .* cannot build kernels: error: unknown target"):
        assert device.pick_device("pocl")[0] is on_wheel
    assert device.pick_device("")[0] is on_wheel
