"""clconv benchmarks: ``python -m bench`` (see bench/run.py)."""
