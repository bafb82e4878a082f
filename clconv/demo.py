"""``python -m clconv.demo``: the demonstration, :mod:`clconv.apps.demo`."""
from .apps.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
