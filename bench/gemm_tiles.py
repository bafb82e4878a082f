"""The GPU GEMM kernel's tiles on the networks' GEMMs: what clconv.gemm.gemm_gpu.tile is fitted to.

    python -m bench gemm-tiles [--batch N | --workloads] [--budget S] [--layers PATTERNS] [--json PATH]

For every layer of bench/networks.json but the depthwise ones (no GEMMs), and each pass, a plan
is made and run once with clconv's GPU GEMM kernel forced to each candidate tile (gemm_gpu.TILES
and others). Each GEMM that run launched is then timed alone (least of 3, profiling events):
its shape (M, N, K, products in the grid, K blocks, layouts, operands folded over images) and
each tile's time. With --workloads, the reference workloads of bench/workloads.json but the
depthwise ones instead (their GPU sizes, each at its own batch): large GEMMs, where a tile's speed
at saturation decides. Split-K depends on the tile (a grid's work-groups), so a shape appears
under the tiles that chose it.

Reported, over the shapes timed with every candidate: each tile's geometric-mean time against
the shape's best candidate, and the same for the tile the rule launches (gemm_gpu.tile, then
gemm_gpu.launched; the deep tile of gemm_gpu.deep is left out, each candidate timed as
itself at the split-K counts of the rules before it). JSON:
bench/results/<device>-gemm-tiles-b<batch>.json, or -gemm-tiles-workloads.json.
"""
import argparse
import fnmatch
import itertools
import json
import math
import time
from collections import defaultdict

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import clconv
from clconv.gemm import gemm_gpu
from clconv.gemm.gemm_gpu import Tile
from clconv.geometry import pair

from .networks import HERE, geometry, load_layers, options, slug
from .run import load_workloads

# (64x64 of 8x8 work-items, 8 deep, is no longer timed: it was almost never the best)
CANDIDATES = {"128x128": Tile(128, 128), "128x64": Tile(128, 64),
              "64x64_by_4x4": Tile(64, 64, 4, 4, 16), "32x64_by_4x4": Tile(32, 64, 4, 4, 16),
              "64x32_by_4x4": Tile(64, 32, 4, 4, 16), "32x32_by_4x4": Tile(32, 32, 4, 4, 16),
              "64x64_by_8x4": Tile(64, 64, 8, 4, 16), "64x128_by_4x8": Tile(64, 128, 4, 8, 16)}


def timed_gemms(queue, layer, batch, tile):
    """[(shape, ms)] of the GEMMs of the layer's three passes with ``tile`` forced."""
    calls, found = [], []
    run = gemm_gpu.grid_gemm

    def logged(*args, **kw):
        calls.append((args, kw))
        return run(*args, **kw)
    rules, launched, sliced, deep = gemm_gpu.TILES, gemm_gpu.launched, gemm_gpu.sliced, gemm_gpu.deep
    gemm_gpu.TILES, gemm_gpu.grid_gemm = ((tile, 1.0),), logged
    # the tile itself, not what a launch would run for it (another tile, the tile in planes, or
    # for a deep forward the deep tile)
    gemm_gpu.launched = gemm_gpu.sliced = lambda device, t, *args: t
    gemm_gpu.deep = lambda *args, **kw: False
    gemm_gpu.tile.cache_clear()
    try:
        g, opts = geometry(layer, batch), options(layer)
        rng = np.random.default_rng(0)
        x, w, dy = (cla.to_device(queue, rng.standard_normal(s, np.float32))
                    for s in (g.input_shape, g.weight_shape, g.output_shape))
        p = clconv.plan(g.input_shape, g.weight_shape, queue=queue, gemm="gpu", **opts)
        for fn in (lambda: p.forward(x, w), lambda: p.backward_input(w, dy), lambda: p.backward_weight(x, dy)):
            calls.clear()
            fn()
            queue.finish()
            for args, kw in calls:
                times = []
                for _ in range(3):
                    event = run(*args, **kw)
                    event.wait()
                    times.append((event.profile.end - event.profile.start) * 1e-6)
                grid, a, b, c = args[2:6]
                folds = "".join(x for x, op in zip("abc", (a, b, c)) if op.fold)   # read or written in place over images
                found.append(((grid.m, grid.n, grid.k, grid.gi * grid.gj, grid.blocks, a.transp, b.transp,
                               b.im2col is not None, folds), min(times)))
    finally:
        gemm_gpu.TILES, gemm_gpu.grid_gemm, gemm_gpu.launched, gemm_gpu.sliced = rules, run, launched, sliced
        gemm_gpu.deep = deep
        gemm_gpu.tile.cache_clear()
    return found


def workload_layers():
    """The reference workloads' GPU sizes as layers of the networks file's form, each with its batch N."""
    layers = []
    for work in load_workloads():
        s = work["gpu"]
        layers.append({"id": f"workloads:{work['name']}", **{k: s[k] for k in ("N", "C", "H", "W", "K", "kh", "kw", "groups")},
                       **{k: list(pair(s[k], k)) for k in ("stride", "padding", "dilation")}})
    return layers


def interleaved(layers):
    """The layers one network at a time in turn (first, each network's first layer; then each's
    second ...), so that a run the budget cuts short has timed every network's layers alike."""
    by_network = defaultdict(list)
    for layer in layers:
        by_network[layer["id"].split(":")[0]].append(layer)
    rounds = itertools.zip_longest(*by_network.values())
    return [layer for round_ in rounds for layer in round_ if layer is not None]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench gemm-tiles", description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--batch", type=int, default=32)
    which.add_argument("--workloads", action="store_true", help="the reference workloads (GPU sizes), not the networks")
    ap.add_argument("--budget", type=float, default=480, help="stop after this many seconds (default 480)")
    ap.add_argument("--layers", help="comma-separated glob patterns of layer ids (default: all)")
    ap.add_argument("--json", help="output path")
    args = ap.parse_args(argv)
    context = clconv.default_queue().context
    queue = cl.CommandQueue(context, properties=cl.command_queue_properties.PROFILING_ENABLE)
    if gemm_gpu.tile(queue.device, 128, 128, 1) is None:
        raise SystemExit("no tile of clconv's GPU GEMM kernel fits this device")
    start, times = time.time(), defaultdict(dict)   # shape -> {tile: ms}
    patterns = args.layers.split(",") if args.layers else ["*"]
    found = workload_layers() if args.workloads else load_layers()["layers"]
    layers = interleaved([lay for lay in found if lay["groups"] != lay["C"]
                          and any(fnmatch.fnmatchcase(lay["id"], p) for p in patterns)])
    for i, layer in enumerate(layers):
        if time.time() - start > args.budget:
            print(f"budget spent after {i} of {len(layers)} layers")
            break
        for name, tile in CANDIDATES.items():
            if gemm_gpu.fits(queue.device, tile):
                for shape, ms in timed_gemms(queue, layer, layer.get("N", args.batch), tile):
                    times[shape][name] = ms
    usable = [tile for tile in CANDIDATES if gemm_gpu.fits(queue.device, CANDIDATES[tile])]
    full = {shape: t for shape, t in times.items() if len(t) == len(usable)}
    by_tile = {name: CANDIDATES[name] for name in usable}
    rule = {}
    for shape, t in full.items():
        m, n, _, count = shape[:4]
        chosen = gemm_gpu.launched(queue.device, gemm_gpu.tile(queue.device, m, n, count), shape[7])
        rule[shape] = next((name for name, tile in by_tile.items() if tile == chosen), None)
    geo = {name: math.exp(sum(math.log(t[name] / min(t.values())) for t in full.values()) / len(full))
           for name in usable} if full else {}
    picked = [full[s][rule[s]] / min(full[s].values()) for s in full if rule[s]]
    if picked:
        geo["rule"] = math.exp(sum(map(math.log, picked)) / len(picked))
    print(f"{len(full)} GEMM shapes timed with all {len(usable)} tiles; time / the shape's best tile (geometric mean):")
    for name, value in sorted(geo.items(), key=lambda kv: kv[1]):
        print(f"  {name:16s} {value:.3f}")
    device = queue.device
    which = "workloads" if args.workloads else f"b{args.batch}"
    out = args.json or str(HERE / "results" / f"{slug(device.name)}-gemm-tiles-{which}.json")
    with open(out, "w") as f:
        json.dump({"device": device.name.strip(), "batch": "workloads" if args.workloads else args.batch,
                   "tiles": {k: CANDIDATES[k]._asdict() for k in usable},
                   "geomean_vs_best": geo,
                   "shapes": [{"m": s[0], "n": s[1], "k": s[2], "products": s[3], "k_blocks": s[4], "a_transp": s[5],
                               "b_transp": s[6], "im2col": s[7], "folds": s[8], "ms": t, "rule": rule[s]} for s, t in full.items()]},
                  f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
