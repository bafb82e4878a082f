"""Tuned CLBlast GEMM parameters: the validity rules, and applying stored sets in a new process."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from clconv import tuning
from clconv.gemm import clblast_params

pytestmark = pytest.mark.clblast

ROOT = Path(__file__).resolve().parent.parent
DEVICE = SimpleNamespace(local_mem_size=48 * 1024, max_work_group_size=1024)


@pytest.mark.parametrize("kernel", sorted(clblast_params.PARAMETERS))
def test_every_candidate_obeys_the_rules(kernel):
    for params in clblast_params.candidates(kernel):
        assert set(params) == set(clblast_params.PARAMETERS[kernel])
        assert clblast_params.valid(kernel, params, DEVICE), params


GEMMK1 = dict(GEMMK=1, KREG=4, KWG=1, KWI=1, SA=0, SB=0)   # valid on the first candidate's tiles


def test_gemmk1_base_is_valid():
    assert clblast_params.valid("Xgemm", dict(clblast_params.candidates("Xgemm")[0], **GEMMK1), DEVICE)


@pytest.mark.parametrize("kernel,change", [
    ("Xgemm", {"MWG": 48}),                       # 48 % (MDIMC * VWM = 64) != 0: CLBlast would compute garbage
    ("Xgemm", {"KWG": 16, "KWI": 3}),             # KWG % KWI != 0
    ("Xgemm", {"MWG": 128, "NWG": 128, "KWG": 64}),   # 64 KiB of local memory
    ("XgemmDirect", {"WGD": 24}),                 # 24 % (MDIMCD * VWMD = 32) != 0
    ("Xgemm", dict(GEMMK1, MDIMA=8)),             # GEMMK 1: MDIMA must equal MDIMC (16)
    ("Xgemm", dict(GEMMK1, KREG=2)),              # GEMMK 1: KREG % VWN (4) != 0
    ("Xgemm", dict(GEMMK1, SA=1)),                # GEMMK 1 kernels use no local memory
], ids=["xgemm_tile", "xgemm_kwi", "xgemm_local_memory", "direct_tile", "xgemm1_mdima", "xgemm1_kreg",
        "xgemm1_local_memory"])
def test_broken_sets_are_refused(kernel, change):
    params = dict(clblast_params.candidates(kernel)[0], **change)
    assert not clblast_params.valid(kernel, params, DEVICE)


def test_stored_sets_are_applied_in_a_new_process(tmp_path, queue):
    """A stored set for CLBlast's direct kernel (the one small GEMMs use) is applied before the
    first GEMM and results still match the reference; an inconsistent stored set is skipped."""
    direct = clblast_params.candidates("XgemmDirect")[3]
    broken = dict(clblast_params.candidates("Xgemm")[0], MWG=48)
    key = tuning.gemm_key(queue.device, "float32")
    (tmp_path / "tuning.json").write_text(json.dumps({"version": tuning.VERSION, "entries": {key: {
        "overrides": {"XgemmDirect": direct, "Xgemm": broken}}}}))
    code = """
import numpy as np, clconv
from clconv import reference
from clconv.gemm import clblast_params
x = np.random.default_rng(0).standard_normal((2, 6, 9, 7)).astype(np.float32)
w = np.random.default_rng(1).standard_normal((5, 6, 3, 2)).astype(np.float32)
y = clconv.conv2d(x, w, padding=1, algorithm="im2col", gemm="clblast")
print(reference.normalised_error(y, reference.conv2d(x, w, padding=1)))
print(sorted(clblast_params.apply_tuned(clconv.default_queue().device, np.float32)))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "CLCONV_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    err, applied = proc.stdout.splitlines()
    assert float(err) <= 1e-4
    assert applied == "['XgemmDirect']"


@pytest.mark.parametrize("params", [{"WGD": 32}, {**dict(zip(clblast_params.PARAMETERS["XgemmDirect"], [0] * 10))},
                                    {**clblast_params.candidates("XgemmDirect")[0], "WGD": "32"}],
                         ids=["missing_names", "zeros", "string_value"])
def test_malformed_stored_sets_are_refused(params):
    assert not clblast_params.valid("XgemmDirect", params, DEVICE)
