"""The performance pages and README's headline block are generated from bench/results/*.json:
regenerating them from the committed files must give what is committed (no OpenCL needed)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_performance_pages_match_results():
    run = subprocess.run([sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
