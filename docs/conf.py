"""Sphinx configuration of clconv's documentation (built by `make docs` into build/docs)."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import clconv  # noqa: E402  (importing clconv needs no OpenCL device)

project = "clconv"
author = "clconv's authors"
copyright = "clconv's authors"
release = version = clconv.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "generate.py"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "furo"
html_title = f"clconv {release}"

# The docstrings name a few internal modules and helpers that this site does not document (they are
# not part of the API); every other reference must resolve (-n).
_INTERNAL = ["clconv.memory", "clconv.spread", "clconv.transpose", "clconv.selfcheck", "clconv.replay",
             "clconv.gemm", "clconv.tuner", "clconv.tuning", "clconv.planner", "clconv.algorithms.base",
             "clconv.reference", "clconv.probe",
             "clconv.tuner.tune_spread", "clconv.storage.on_float_copies", "clconv.programs.relaunch",
             "clconv.planner.tuned_choices", "clconv.planner.plan_for_call", "clconv.buffers.Ref",
             "clconv.gemm.matrix_units",
             "pick_device", "Plan"]
nitpick_ignore = [(kind, name) for name in _INTERNAL for kind in ("py:mod", "py:func", "py:class", "py:meth", "py:data")]
