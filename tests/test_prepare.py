"""clconv.prepare: a network's plans and kernels before its first calls, in worker threads;
afterwards the calls build nothing and give the reference's answers."""
import threading

import numpy as np
import pytest

import clconv
from clconv import programs, reference
from clconv.programs import builds, get_kernel

from helpers import assert_close

LAYERS = [((2, 6, 11, 9), (8, 3, 3, 3), dict(padding=1, groups=2)),
          ((2, 6, 11, 9), (8, 3, 3, 3), dict(padding=1, groups=2)),   # the same layer again: prepared once
          ((3, 5, 9, 7), (7, 5, 1, 1), {}),
          ((2, 4, 13, 10), (4, 1, 5, 3), dict(stride=(2, 1), padding=((2, 1), (1, 1)), groups=4))]


def new_queue(queue):
    """A queue on a new context of the device under test: nothing built for it yet."""
    queues = clconv.device_queues([queue.device])
    _kept.append(queues)   # the context lives as long as the tests
    return queues[0]


_kept = []


def test_prepare_then_first_calls_build_nothing(queue):
    q = new_queue(queue)
    assert clconv.prepare(LAYERS, queue=q, workers=3) == 3
    built = len(builds())
    rng = np.random.default_rng(0)
    for xs, ws, opts in LAYERS[1:]:
        x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
        y = clconv.conv2d(x, w, queue=q, **opts)
        assert_close(y, reference.conv2d(x, w, **opts), np.float32, f"forward {xs} {ws}")
        dy = rng.standard_normal(y.shape).astype(np.float32)
        assert_close(clconv.conv2d_input(xs, w, dy, queue=q, **opts), reference.conv2d_input(xs, w, dy, **opts),
                     np.float32, f"grad-input {xs} {ws}")
        assert_close(clconv.conv2d_weight(x, ws, dy, queue=q, **opts), reference.conv2d_weight(x, ws, dy, **opts),
                     np.float32, f"grad-weight {xs} {ws}")
    assert len(builds()) == built, f"the first calls built {builds()[built:]} after prepare"


def test_prepare_a_module(queue):
    q = new_queue(queue)
    conv = clconv.nn.Conv2d(4, 6, (3, 2), stride=(1, 2), padding=1, queue=q)
    assert clconv.prepare([(conv, (3, 4, 10, 7))]) == 1
    assert not conv.grad_weight.get().any() and not conv.grad_bias.get().any(), "prepare changed the gradients"
    built = len(builds())
    x = np.random.default_rng(1).standard_normal((3, 4, 10, 7)).astype(np.float32)
    y = conv(x)
    assert_close(y.get(), reference.conv2d(x, conv.weight.get(), conv.bias.get(), stride=(1, 2), padding=1),
                 np.float32, "module forward")
    conv.backward(x, y)
    assert len(builds()) == built


def test_prepare_in_processes_fills_the_caches_first(queue, tmp_path, monkeypatch):
    """processes=2: worker processes take the known-answer checks the layers' plans ask for, each
    once, then run the layers, on the same device, into the caches on disk (here empty ones): the
    verdicts are in the tuning cache; then this process's calls give the reference's answers."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CLCONV_CACHE_DIR", str(tmp_path / "clconv"))
    clconv.selfcheck.forget()
    calls = []
    real = clconv.prepare.__globals__["_in_processes"]
    monkeypatch.setitem(clconv.prepare.__globals__, "_in_processes",
                        lambda *args: (calls.append(args), real(*args))[1])
    q = new_queue(queue)
    assert clconv.prepare(LAYERS, queue=q, processes=2) == 3
    (checks, layers, count, _), = calls
    spec = clconv.device.spec_of(q.device)
    assert count == 2 and [t[:2] for t, _ in layers] == [("layer", spec)] * 3
    planned = set()
    for xs, ws, opts in LAYERS:
        g = clconv.conv_geometry(xs, ws, **opts)
        planned |= clconv.Plan(g, np.float32, q, selfcheck=False).checks()
    assert sorted(checks) == sorted({("check", spec, *c) for c in planned}), "each verdict asked for once"
    assert set().union(*(needs for _, needs in layers)) == set(checks)
    stored = clconv.tuning.load()
    for _, _, algorithm, engine, dtype, math in checks:
        assert stored[clconv.selfcheck.key(q.device, algorithm, engine, dtype, math)]["ok"] is True, algorithm
    rng = np.random.default_rng(2)
    for xs, ws, opts in LAYERS[1:]:
        x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
        assert_close(clconv.conv2d(x, w, queue=q, **opts), reference.conv2d(x, w, **opts), np.float32, f"{xs} {ws}")


def test_a_failing_worker_process_raises_its_last_words(queue, monkeypatch):
    monkeypatch.setitem(clconv.prepare.__globals__, "spec_of", lambda device: "99:99")
    with pytest.raises(clconv.ClconvError, match=r"a prepare worker process failed: it ended without doing its "
                                                 r"task \(exit status 1\): clconv\.device\.DeviceNotFound: .*99:99"):
        clconv.prepare(LAYERS[2:], queue=new_queue(queue), processes=1)


def test_prepare_in_processes_takes_numpy_sizes_and_sub_devices_use_threads(queue, monkeypatch):
    """Sizes given as NumPy integers reach the workers; a device no other process can name (a
    sub-device) is prepared in threads alone."""
    layer = (tuple(np.int64(v) for v in LAYERS[2][0]), LAYERS[2][1])
    assert clconv.prepare([layer], queue=new_queue(queue), processes=1) == 1
    monkeypatch.setitem(clconv.prepare.__globals__, "spec_of", lambda device: None)
    monkeypatch.setitem(clconv.prepare.__globals__, "_in_processes", lambda *args: pytest.fail("worker processes"))
    assert clconv.prepare([layer], queue=new_queue(queue), processes=2) == 1


@pytest.mark.parametrize("layer, error", [
    (((2, 6, 9, 9), (4, 4, 3, 3), {}), ValueError),                  # channels: 6 against the weight's 4
    (((2, 6, 9, 9), (4, 6, 3, 3), dict(stride=0)), ValueError),
    (((2, 6, 9, 9), (4, 6, 3, 3), dict(bias=True)), TypeError),      # not an option of a layer
], ids=["channels", "stride-0", "unknown-option"])
def test_prepare_refuses_a_bad_layer_before_running_any(queue, layer, error):
    q = new_queue(queue)
    built = len(builds())
    with pytest.raises(error):
        clconv.prepare([LAYERS[2], layer], queue=q)
    assert len(builds()) == built


def test_threads_asking_for_one_program_build_it_once(queue):
    q = new_queue(queue)
    built = len(builds())
    start = threading.Barrier(4)

    def ask():
        start.wait()
        get_kernel(q.context, "bias.cl", "fill_bias", np.float32, IDX="int")

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [name for name, _ in builds()[built:]] == ["bias.cl"]
    assert programs.get_kernel(q.context, "bias.cl", "fill_bias", np.float32, IDX="int") is not None
