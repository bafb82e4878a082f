"""The networks benchmark (python -m bench networks): its layers file is consistent, its core
runs on a few tiny layers and writes the JSON it promises, and its correctness check catches
a wrong result. Needs PyTorch (the benchmark's peer) except for the layers-file test."""
import json

import numpy as np
import pytest

import clconv
from clconv.reference import TOLERANCE, tolerance
from clconv.rules import POINTWISE_FOLD_BELOW as FOLD_BELOW
from clconv.bench import networks as nb


@pytest.fixture(scope="module")
def data():
    return nb.load_layers()


def macs(layer):
    """Multiply-adds per image: how we pick the smallest layers."""
    return layer["K"] * layer["OH"] * layer["OW"] * layer["C"] // layer["groups"] * layer["kh"] * layer["kw"]


@pytest.fixture(scope="module")
def tiny(data):
    """The smallest layer of three kinds: a 1x1 on a small map, a depthwise one, an asymmetric one."""
    picks = []
    for kinds in (("1x1 on <=7x7",), ("depthwise 3x3", "depthwise 5x5", "depthwise 7x7"), ("asymmetric 1xn/nx1",)):
        picks.append(min((lay for lay in data["layers"] if nb.kind(lay) in kinds), key=macs))
    return picks


def test_layers_file_is_consistent(data):
    layers = data["layers"]
    assert len({lay["id"] for lay in layers}) == len(layers)
    shapes = [json.dumps([lay[k] for k in ("C", "H", "W", "K", "kh", "kw", "stride", "padding", "dilation", "groups")])
              for lay in layers]
    assert len(set(shapes)) == len(layers), "a layer is listed twice"
    for net, info in data["networks"].items():
        mine = [lay for lay in layers if net in lay["count"]]
        assert len(mine) == info["distinct"], net
        assert sum(lay["count"][net] for lay in mine) == info["conv2d_layers"], net
    for lay in layers:
        assert set(lay["count"]) <= set(data["networks"]) and min(lay["count"].values()) >= 1, lay["id"]
        g = nb.geometry(lay, 1)   # clconv's own shape rule must give the output PyTorch recorded
        assert (g.OH, g.OW) == (lay["OH"], lay["OW"]) and g.OH > 0 and g.OW > 0, lay["id"]
        assert nb.kind(lay) in nb.KINDS, lay["id"]


@pytest.mark.whole_program
def test_benchmark_writes_its_json(tiny, data, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "run.json"
    nets = sorted({n for lay in tiny for n in lay["count"]})
    status = nb.main(["--networks", ",".join(nets), "--layers", ",".join(lay["id"] for lay in tiny),
                      "--batch", "1", "--budget", "0.01", "--rounds", "1", "--graph", "--profile", "--json", str(out)])
    assert status == 0
    record = json.loads(out.read_text())
    assert record["batch"] == 1 and record["networks"] == nets and record["peer"].startswith("torch-")
    assert record["math"] == "strict"
    assert sorted(r["id"] for r in record["layers"]) == sorted(lay["id"] for lay in tiny)
    for r in record["layers"]:
        assert set(r["passes"]) == {"forward", "backward_input", "backward_weight"}
        for d in r["passes"].values():
            assert d["ok"] and d["error"] <= record["tolerance"] == TOLERANCE[np.dtype(np.float32)]
            assert d["clconv_ms"] > 0 and d["torch_ms"] > 0 and d["first_call_ms"] > 0
            assert d["ratio"] == pytest.approx(d["clconv_ms"] / d["torch_ms"])
            assert d["algorithm"] in ("fc", "1x1", "direct", "fft", "winograd", "im2col")
            assert d["graph_ms"] > 0 and d["graph_ratio"] == pytest.approx(d["graph_ms"] / d["torch_ms"])
            assert d["device_ms"] > 0 and d["launches"] >= len(d["kernels"]) >= 1, d   # (--profile)
    s = record["summary"]
    assert set(s["graph"]["networks"]) == set(nets) and s["graph"]["overall"] > 0
    assert s["overall"]["layer_passes"] == 9 and s["failures"] == []
    assert s["faster"]["clconv"] + s["faster"]["torch"] == 9
    assert set(s["per_kind"]) == {r["kind"] for r in record["layers"]}
    for net in nets:
        m = s["networks"][net]
        assert m["clconv_step_ms"] > 0 and m["torch_step_ms"] > 0
        assert m["conv2d_measured"] == sum(lay["count"].get(net, 0) for lay in tiny)
    # each layer's first calls are counted once, with the first network that has it
    assert sum(m["clconv_first_call_s"] for m in s["networks"].values()) == pytest.approx(
        sum(d["first_call_ms"] for r in record["layers"] for d in r["passes"].values()) / 1e3)

    # runs of network subsets (one device call each) merge into one record, each layer once
    halves = [{**record, "networks": [net], "layers": [r for r in record["layers"] if net in r["count"]]}
              for net in nets]
    merged = nb.merge(halves, data)
    assert merged["networks"] == nets and sorted(r["id"] for r in merged["layers"]) == sorted(lay["id"] for lay in tiny)
    assert merged["summary"]["overall"] == pytest.approx(s["overall"])
    for net in nets:
        assert merged["summary"]["networks"][net] == pytest.approx(s["networks"][net]), net
    with pytest.raises(ValueError, match="cannot merge"):
        nb.merge([record, {**record, "batch": 2}], data)


def test_a_wrong_result_fails_the_check(tiny, queue, monkeypatch):
    pytest.importorskip("torch")
    real = clconv.conv2d
    monkeypatch.setattr(clconv, "conv2d", lambda *args, **kw: real(*args, **kw) * np.float32(1.001))
    passes, _ = nb.run_layer(tiny[0], 1, queue, budget_s=0.01, rounds=1)
    assert not passes["forward"]["ok"] and passes["forward"]["error"] > TOLERANCE[np.dtype(np.float32)]
    assert passes["backward_input"]["ok"] and passes["backward_weight"]["ok"]


@pytest.mark.whole_program
@pytest.mark.parametrize("math", ["tf32", "fp16"])
def test_benchmark_compares_in_a_math_mode(math, tiny, tmp_path):
    """--math: both sides in the mode (float16 arrays and half tensors for fp16), held to its
    tolerance, the mode in the record."""
    pytest.importorskip("torch")
    out = tmp_path / "run.json"
    lay = tiny[0]
    status = nb.main(["--networks", next(iter(lay["count"])), "--layers", lay["id"], "--batch", "1", "--budget", "0.01",
                      "--rounds", "1", "--math", math, "--json", str(out)])
    assert status == 0
    record = json.loads(out.read_text())
    dtype = np.float16 if math == "fp16" else np.float32
    assert record["math"] == math and record["tolerance"] == tolerance(dtype, math)
    assert all(d["ok"] and d["error"] <= record["tolerance"] for d in record["layers"][0]["passes"].values())


@pytest.mark.whole_program
def test_gemm_tiles_times_a_layers_gemms_with_each_tile(data, tmp_path, monkeypatch):
    """python -m bench gemm-tiles on one small 1x1 layer with two tiles: every GEMM of its three
    passes is timed with both, and the rule's pick is one of them."""
    from clconv.bench import gemm_tiles
    from clconv.gemm.gemm_gpu import Tile
    monkeypatch.setattr(gemm_tiles, "CANDIDATES", {"128x64": Tile(128, 64), "32x64_by_4x4": Tile(32, 64, 4, 4, 16)})
    layer = min((lay for lay in data["layers"] if (lay["kh"], lay["kw"], lay["groups"]) == (1, 1, 1)
                 and lay["stride"] == [1, 1] and lay["H"] * lay["W"] > 1), key=macs)   # the 1x1 algorithm's
    out = tmp_path / "tiles.json"
    gemm_tiles.main(["--batch", "2", "--layers", layer["id"], "--json", str(out)])
    record = json.loads(out.read_text())
    assert record["batch"] == 2 and set(record["tiles"]) == {"128x64", "32x64_by_4x4"}
    shapes = record["shapes"]
    products = {(s["m"], s["n"]) for s in shapes}
    K, C, P = layer["K"], layer["C"], layer["H"] * layer["W"]
    n = 2 * P if P < FOLD_BELOW else P   # (forward and grad-input: both images' positions in one GEMM, or one each)
    assert {(K, n), (C, n), (K, C)} <= products   # fwd, dgrad, wgrad
    wgrad = next(s for s in shapes if (s["m"], s["n"]) == (K, C))
    assert wgrad["b_transp"] and wgrad["k_blocks"] * wgrad["products"] == 2   # both images, as K blocks or slices
    for s in shapes:
        assert set(s["ms"]) == {"128x64", "32x64_by_4x4"} and min(s["ms"].values()) > 0
        assert s["rule"] in (None, "128x64", "32x64_by_4x4")
