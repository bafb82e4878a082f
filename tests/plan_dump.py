"""Dump the planner's choices for every layer of bench/networks.json, to compare two versions.

    PYTHONPATH=. python tests/plan_dump.py > before.txt      # on a CPU runtime (CLCONV_DEVICE)
    PYTHONPATH=. python tests/plan_dump.py --gpu 132 > ...   # on a stand-in GPU of 132 units
    PYTHONPATH=. python tests/plan_dump.py --run ...         # also run batch 1 and list launches

Per layer, batch and pass: the chosen algorithm, the plan's GEMM engine, the workspace bytes and
the algorithm object's state (splits, chunks, tiles, panels, kernel forms: every plain value it
keeps), which is what the passes' launches are made from. Words (explain()'s notes, reasons) are
left out: only choices are compared. Plans are built without the tuning cache and the
known-answer check, so the rules alone decide.
"""
import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import clconv  # noqa: E402
from clconv.geometry import PASSES, conv_geometry  # noqa: E402
from clconv.plan import Plan  # noqa: E402

from bench.networks import load_layers  # noqa: E402

# wording kept on algorithm objects, not choices (explain()'s notes)
WORDS = {"unsplit", "tiling", "in_place", "short_chunk", "cut_rule", "band_rule"}


def canonical(value, depth=0):
    """A value's plain, stable form: numbers, tuples and dicts of them; objects by their state."""
    if isinstance(value, (bool, int, float, np.integer, np.floating)) or value is None:
        return repr(value)
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, np.dtype):
        return str(value)
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(canonical(v, depth) for v in value) + ")"
    if isinstance(value, dict):
        items = sorted((canonical(k, depth), canonical(v, depth)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if hasattr(value, "input_shape") and hasattr(value, "weight_shape"):   # a geometry
        return f"geometry({value.input_shape}, {value.weight_shape}, {value.stride}, {value.pads}, " \
               f"{value.dilation}, {value.groups})"
    if hasattr(value, "__dict__") and depth < 2 and type(value).__module__.startswith("clconv.algorithms"):
        return type(value).__name__ + state(value, depth + 1)
    return type(value).__name__


def state(algo, depth=0):
    out = {}
    for name, value in sorted(vars(algo).items()):
        if name in ("g", "device", "dtype") or name in WORDS:
            continue
        if name == "specs":   # keyed by id() of geometries: values only
            value = sorted(canonical(v, depth) for v in value.values())
        if isinstance(value, str) and name not in ("gemm", "name"):
            continue
        out[name] = canonical(value, depth)
    return "{" + ", ".join(f"{k}={v}" for k, v in out.items()) + "}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, default=0, help="compute units of a stand-in GPU (0: the real device)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--run", action="store_true", help="run batch 1's passes and list their launches")
    args = ap.parse_args()
    queue = clconv.default_queue()
    if args.gpu:
        from helpers import stand_in_gpu
        queue = stand_in_gpu(queue, args.gpu)
    data = load_layers()
    print(f"# device {'stand-in GPU of %d units' % args.gpu if args.gpu else queue.device.name.strip()}")
    for layer in data["layers"]:
        for n in (int(b) for b in args.batches.split(",")):
            xs = (n, layer["C"], layer["H"], layer["W"])
            ws = (layer["K"], layer["C"] // layer["groups"], layer["kh"], layer["kw"])
            g = conv_geometry(xs, ws, tuple(layer["stride"]), tuple(layer["padding"]), tuple(layer["dilation"]),
                              layer["groups"])
            p = Plan(g, np.float32, queue, selfcheck=False)
            print(f"{layer['id']} N={n} gemm={p.gemm} workspace={p.workspace_bytes}")
            if args.run and n == 1 and not args.gpu:
                rng = np.random.default_rng(0)
                x, w = rng.standard_normal(xs, np.float32), rng.standard_normal(ws, np.float32)
                dy = rng.standard_normal(g.output_shape, np.float32)
                p.forward(x, w), p.backward_input(w, dy), p.backward_weight(x, dy)
            for pass_name in PASSES:
                algo = p._choice[pass_name][0]
                ws_bytes = p._workspace_elements(pass_name) * p.compute_dtype.itemsize
                print(f"  {pass_name} [{algo.name}] workspace={ws_bytes} launches={p.launches(pass_name)}")
                print(f"    {state(algo)}")


if __name__ == "__main__":
    os.environ.setdefault("CLCONV_SELFCHECK", "0")
    main()
