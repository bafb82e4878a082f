"""The host-time benchmark (python -m bench host): its results are checked, and the launches it
counts from profiling events are the ones the plan names."""
import json

import pytest

from clconv.bench import host


@pytest.mark.whole_program
def test_host_benchmark_writes_its_json(tmp_path):
    out = tmp_path / "host.json"
    assert host.main(["--rounds", "1", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    floor = record["empty_launch_us"]
    assert set(floor) == {"pipelined", "host", "sync"} and all(0 < least <= median for least, median in floor.values())
    assert [(r["layer"], r["pass"]) for r in record["layers"]] == [
        (layer, p) for layer in host.LAYERS for p in ("forward", "backward_input", "backward_weight")]
    for r in record["layers"]:
        assert r["ok"], r
        assert r["launched"] and r["launches"] == len(r["launched"]), r   # profiled events = the plan's count
        for style in ("plain", "out", "graph"):
            assert all(0 < least <= median for least, median in r[style].values()), r
