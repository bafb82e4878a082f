"""The command line and the tuning cache, run as a user would: in subprocesses."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import clconv
from clconv import selfcheck, tuning

ROOT = Path(__file__).resolve().parents[1]


def run(args, env=None, timeout=600):
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_info_names_devices_and_the_default(queue):
    out = run(["-m", "clconv", "info"])
    assert queue.device.name.strip() in out
    assert "max allocation" in out and "fp64 (cl_khr_fp64): " in out and "fp16 (cl_khr_fp16): " in out
    assert "default device: " + queue.device.name.strip() in out


def test_info_lists_both_cpu_runtimes_from_the_environment():
    """`make` registers Intel's runtime in the environment's vendors folder, which clconv points
    the ICD loader at when OCL_ICD_VENDORS is unset: `python -m clconv info` lists it beside PoCL."""
    from clconv.device import ENVIRONMENT_VENDORS
    if not (ENVIRONMENT_VENDORS / "intel-cpu.icd").is_file():
        pytest.skip(f"Intel's CPU runtime is not registered in {ENVIRONMENT_VENDORS} (make installs it)")
    env = {k: v for k, v in os.environ.items() if k not in ("OCL_ICD_VENDORS", "CLCONV_DEVICE")}
    proc = subprocess.run([sys.executable, "-m", "clconv", "info"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Intel(R) OpenCL" in proc.stdout and "Portable Computing Language" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "clconv", "--device", "intel", "info"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert "on Intel(R) OpenCL (CLCONV_DEVICE='intel' matches" in proc.stdout


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_check_runs_every_algorithm(dtype):
    out = run(["-m", "clconv", "check", "--dtype", dtype])
    assert f"every pass in {dtype}" in out
    for name in ("im2col", "im2col grouped", "im2col strided across", "im2col strided narrow",
                 "im2col CLBlast-GEMM", "im2col grouped per-group", "fc", "1x1", "direct", "direct few-channel",
                 "winograd", "winograd 5x5", "winograd 1x7", "winograd 7x1", "fft"):
        for pass_name in ("forward", "grad-input", "grad-weight"):
            assert f"  {name:28s} {pass_name:12s} normalised max error" in out
    # every case's three passes, im2col's also on CLBlast and on per-group queues, and the bias
    im2col = sum(case[0] == "im2col" for case in selfcheck.CASES)
    assert out.count(" ok") == 3 * (len(selfcheck.CASES) + 2 * im2col) + 1 and "all passes match" in out


@pytest.mark.parametrize("args", [["info"], ["check"], ["bench", "--no-peers"], ["tune"]], ids=" ".join)
def test_no_matching_device_is_said_without_a_traceback(args):
    """A device that CLCONV_DEVICE (or --device) names but that is not there: one message listing
    the devices, exit status 2; `info` still lists the platforms first."""
    env = dict(os.environ, CLCONV_DEVICE="no-such-device")
    proc = subprocess.run([sys.executable, "-m", "clconv", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "no OpenCL device matches CLCONV_DEVICE='no-such-device'" in proc.stderr and "devices: 0:0 " in proc.stderr
    if args == ["info"]:
        assert "platform 0: " in proc.stdout


def test_bad_options_are_said_without_a_traceback(queue):
    for args in (["bench", "--workload", "no-such-workload", "--no-peers"], ["tune", "--workload", "no-such-workload"]):
        proc = subprocess.run([sys.executable, "-m", "clconv", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "no-such-workload" in proc.stderr, args


@pytest.mark.whole_program
def test_bench_writes_json_and_chart(tmp_path):
    pytest.importorskip("matplotlib")
    out = run(["-m", "clconv", "bench", "--workload", "stem_7x7_s2", "--repeat", "3", "--no-peers",
               "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "chart.png")])
    result = json.loads((tmp_path / "r.json").read_text())
    passes = result["workloads"][0]["passes"]
    assert set(passes) == {"forward", "backward_input", "backward_weight"}
    assert all(p["error"] <= 1e-4 and p["median_ms"] > 0 for p in passes.values())
    assert "stem_7x7_s2" in out
    png = (tmp_path / "chart.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000


@pytest.mark.whole_program
def test_tuning_cache_round_trip_across_processes(tmp_path):
    env = {"CLCONV_CACHE_DIR": str(tmp_path)}
    out = run(["-m", "clconv", "tune", "--workload", "depthwise_s2"], env=env)
    assert "depthwise_s2" in out and str(tmp_path) in out
    entries = json.loads((tmp_path / "tuning.json").read_text())["entries"]
    # (known-answer verdicts and the build probe's are stored there too)
    entries = {k: v for k, v in entries.items() if not k.startswith(("selfcheck|", "buildcheck|"))}
    assert len(entries) == 3 and all(e["algorithm"] in ("direct", "im2col") for e in entries.values())
    explain = run(["-c", "import clconv; from clconv.apps.cli import _workload_geometries; q = clconv.default_queue(); "
                         "name, g = next(_workload_geometries(['depthwise_s2'], q.device)); "
                         "print(clconv.plan(g.input_shape, g.weight_shape, g.stride, g.pads, g.dilation, g.groups, "
                         "queue=q).explain().records)"], env=env)
    assert explain.count("rules=('tuned',") == 3 and explain.count("fastest on this device in the tuning cache") == 3


def test_corrupt_or_foreign_cache_is_ignored_with_a_warning(tmp_path, monkeypatch, queue):
    monkeypatch.setenv("CLCONV_CACHE_DIR", str(tmp_path))
    for text in ("{not json", json.dumps({"version": 999, "entries": {}}), json.dumps([1, 2])):
        (tmp_path / "tuning.json").write_text(text)
        with pytest.warns(UserWarning, match="ignoring"):
            p = clconv.plan((1, 6, 5, 5), (2, 6, 3, 3), queue=queue)
        assert p.algorithms["forward"] == "im2col"
    tuning.store({"k": {"algorithm": "im2col"}})    # a corrupt file is replaced on the next store
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.load() == {"k": {"algorithm": "im2col"}}


def test_concurrent_stores_keep_a_valid_file(tmp_path):
    code = ("import sys; from clconv import tuning; "
            "[tuning.store({f'{sys.argv[1]}-{i}': {'algorithm': 'im2col'}}) for i in range(40)]")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(n)], cwd=ROOT,
                              env=dict(os.environ, CLCONV_CACHE_DIR=str(tmp_path))) for n in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    entries = json.loads((tmp_path / "tuning.json").read_text())["entries"]
    assert len(entries) == 160


def test_autotune_times_on_first_use_and_stores(tmp_path, monkeypatch, queue):
    monkeypatch.setenv("CLCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CLCONV_AUTOTUNE", "1")
    p = clconv.plan((2, 4, 9, 8), (8, 2, 3, 3), padding=1, groups=2, queue=queue)
    assert all("tuned" in r.rules for r in p.explain().records)
    assert len([k for k in tuning.load() if not k.startswith("selfcheck|")]) == 3
    x = np.ones((2, 4, 9, 8), np.float32)
    w = np.ones((8, 2, 3, 3), np.float32)
    np.testing.assert_allclose(p.forward(x, w), clconv.reference.conv2d(x, w, padding=1, groups=2), rtol=1e-5)


def test_bench_has_one_entry_point_naming_every_benchmark():
    """python -m bench lists its benchmarks, each a module with main(argv); an unknown name is said
    with exit status 2."""
    from clconv.bench.__main__ import BENCHMARKS
    out = run(["-m", "bench", "--help"])
    assert all(f"  {name} " in out for name in BENCHMARKS)
    for module, _ in BENCHMARKS.values():
        assert (ROOT / "bench" / f"{module}.py").is_file() and "def main(argv=None)" in \
            (ROOT / "bench" / f"{module}.py").read_text(), module
    proc = subprocess.run([sys.executable, "-m", "bench", "no-such-benchmark"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2 and "invalid choice: 'no-such-benchmark'" in proc.stderr


# what the apps may import from clconv: the names of its __all__ and these documented modules
PUBLIC_MODULES = {"clconv.nn", "clconv.reference", "clconv.mpi", "clconv.tools", "clconv.bench"}


def test_apps_use_the_public_api_only():
    """clconv/apps/ (the command line, the demo, the training example) imports from clconv only
    what clconv.__all__ names and the public modules, and uses no other clconv.<name>."""
    import ast
    import re
    for path in (ROOT / "clconv" / "apps").glob("*.py"):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and all(a.name in ("cli", "demo", "digits") for a in node.names), \
                    f"{path.name}: a relative import reaches outside clconv.apps"
            elif isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "clconv":
                for alias in node.names:
                    public = alias.name in clconv.__all__ or f"clconv.{alias.name}" in PUBLIC_MODULES
                    ok = (node.module == "clconv" and public) or \
                        any(node.module == m or node.module.startswith(m + ".") for m in PUBLIC_MODULES)
                    assert ok, f"{path.name}: from {node.module} import {alias.name}"
            elif isinstance(node, ast.Import):
                assert all(a.name == "clconv" or not a.name.startswith("clconv") for a in node.names), path.name
        for name in re.findall(r"\bclconv\.(\w+)", source):
            assert name in clconv.__all__ or f"clconv.{name}" in PUBLIC_MODULES or name in ("apps", "demo"), \
                f"{path.name}: clconv.{name}"
