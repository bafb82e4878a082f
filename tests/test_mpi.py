"""Gradients summed over MPI ranks (clconv.mpi): tests/mpi_check.py under mpiexec with 1, 2
and 3 processes, uneven and empty local batches, with and without overlap, and with the
reduction broken on purpose (which must fail); the digits example under ``mpiexec -n 2``
against one process."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py", reason="the `mpi` extra (make installs it)")

HERE = Path(__file__).parent
# MPICH's wheel (the `mpi` extra) puts mpiexec beside the interpreter; else the system's
BESIDE = Path(sys.executable).parent / "mpiexec"
MPIEXEC = str(BESIDE) if BESIDE.exists() else shutil.which("mpiexec")
if MPIEXEC is None:
    pytest.skip("mpi4py but no mpiexec: install the `mpi` extra (mpich)", allow_module_level=True)


# Open MPI's mpiexec refuses to start as root unless told (CI containers run as root); MPICH ignores these
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _mpiexec(n, *args, timeout=600):
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


@pytest.mark.parametrize("ranks, extra", [(1, []), (2, []), (3, []), (2, ["--no-overlap"]), (3, ["--images", "2"])],
                         ids=["1-rank", "2-ranks", "3-ranks", "2-ranks-no-overlap", "3-ranks-one-empty"])
def test_reduced_gradients_equal_the_full_batch(ranks, extra):
    run = _mpiexec(ranks, str(HERE / "mpi_check.py"), *extra)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" ok") == ranks, run.stdout


@pytest.mark.parametrize("fault", ["skip", "double", "max"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_broken_reduction_is_caught(fault, ranks):
    run = _mpiexec(ranks, str(HERE / "mpi_check.py"), "--fault", fault)
    assert run.returncode != 0 and "MISMATCH" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_rank_leaving_a_layer_out_aborts_every_rank(ranks):
    """One rank never reduces a layer the others do: it aborts the communicator rather than leave
    them waiting (the run ends, with an error)."""
    run = _mpiexec(ranks, str(HERE / "mpi_check.py"), "--fault", "forget", timeout=300)   # a hang fails here
    # ended with an error before any rank's verdict (the abort message itself may be lost: the
    # launcher can stop forwarding output as it kills the ranks)
    assert run.returncode != 0 and " ok" not in run.stdout and "MISMATCH" not in run.stdout, run.stdout + run.stderr


@pytest.mark.whole_program
def test_digits_under_two_ranks_follow_one_process(tmp_path):
    """The same batches split over two ranks: the same losses and accuracies as one process,
    up to float32 rounding of the sums."""
    histories = []
    for ranks in (1, 2):
        out = tmp_path / f"{ranks}.json"
        run = _mpiexec(ranks, "-m", "clconv", "train-digits", "--epochs", "3", "--plot", "", "--json", str(out))
        assert run.returncode == 0, run.stdout + run.stderr
        histories.append(json.loads(out.read_text()))
    one, two = histories
    assert one["accuracy"] == pytest.approx(two["accuracy"], abs=1 / 360)   # one test image either way
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-4)
