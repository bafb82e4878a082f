"""clconv's benchmarks: ``python -m bench <name>`` (``python -m bench --help`` lists them; bench/__main__.py)."""
