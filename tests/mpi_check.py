"""Run by tests/test_mpi.py under ``mpiexec -n K``: data-parallel gradients over the ranks
(clconv.mpi.DataParallel) against the one-process full-batch gradient.

    mpiexec -n 3 python tests/mpi_check.py [--images N] [--fault skip|double|max] [--no-overlap]

Every rank builds the same two-layer network (same seeds) and takes its uneven share of a
batch of 7 images (``--images``; fewer than the ranks leaves some with none); the loss is mean(sum(output * R)) over the batch for a fixed random R.
After the reduction each rank's gradients must equal the full batch's, computed by the same
modules in one process, and be the same bits on every rank; a step's reductions recorded in a
clconv.graph() must be refused. ``--fault`` breaks the reduction on purpose (skipped, done
twice, MPI.MAX instead of MPI.SUM): the check must then fail; with
"forget" the last rank leaves one layer out of the reduction, and must abort every rank.
Every rank exits with the combined verdict (0 only if all ranks passed), so one failing rank
cannot leave the others waiting.
"""
import argparse
import sys

import numpy as np
from mpi4py import MPI

import clconv
from clconv.mpi import DataParallel
from clconv.reference import TOLERANCE, normalised_error
from clconv.spread import counts

def network():
    return [clconv.nn.Conv2d(3, 8, 3, stride=2, padding=1, relu=True, seed=1),
            clconv.nn.Conv2d(8, 6, 3, padding=(0, 1), groups=2, seed=2)]


def step(layers, x, r, scale, dp=None):
    """Forward and backward of layers on images x with grad_output r * scale (the mean loss's)."""
    inputs = []
    for layer in layers:
        inputs.append(x)
        x = layer.forward(x)
    g = (r * scale).astype(np.float32)
    for layer, xin in zip(reversed(layers), reversed(inputs)):
        layer.zero_grad()
        g = layer.backward(xin, g)
        if dp is not None:
            dp.ready(layer)


def graph_refused(dp, layers):
    """A step's reductions recorded in a clconv.graph() (a replay would repeat none of the copies
    and collectives): every rank runs the block, and each must have it refused, naming them."""
    try:
        with clconv.graph():
            dp.start(1)
            for layer in reversed(layers):
                layer.zero_grad()
                dp.ready(layer)
            dp.finish()
    except clconv.ClconvError as exc:
        if "MPI reductions" in str(exc):
            return True
        print(f"graph refused, but not for the reductions: {exc}", flush=True)
        return False
    print("a graph of MPI reductions was not refused", flush=True)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault", choices=["skip", "double", "max", "forget"])
    ap.add_argument("--no-overlap", action="store_true")
    ap.add_argument("--images", type=int, default=7)
    args = ap.parse_args()
    N = args.images
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 3, 11, 9)).astype(np.float32)
    r = rng.standard_normal((N, 6, 4, 5)).astype(np.float32)

    full = network()
    step(full, x, r, 1.0 / N)
    expected = [a.get() for m in full for a in (m.grad_weight, m.grad_bias)]

    cut = np.cumsum([0] + counts(N, [1] * size))
    lo, hi = int(cut[rank]), int(cut[rank + 1])
    layers = network()
    dp = DataParallel(layers, comm, overlap=not args.no_overlap)
    if args.fault == "skip":
        dp._allreduce = lambda buffer: None
    elif args.fault == "double":
        reduce_once = dp._allreduce
        dp._allreduce = lambda buffer: (reduce_once(buffer), reduce_once(buffer))
    elif args.fault == "max":
        dp._allreduce = lambda buffer: comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.MAX)
    if args.fault == "forget" and rank == size - 1:
        ready = dp.ready
        dp.ready = lambda layer: None if layer is layers[0] else ready(layer)
    for _ in range(2):   # twice: the second step reuses the host buffers
        dp.start(hi - lo)
        if hi > lo:
            step(layers, x[lo:hi], r[lo:hi], 1.0 / (hi - lo), dp)
        else:
            for layer in reversed(layers):
                layer.zero_grad()
                dp.ready(layer)
        dp.finish()
    got = [a.get() for m in layers for a in (m.grad_weight, m.grad_bias)]

    refused = graph_refused(dp, layers)   # on every rank: its collectives are every rank's
    errors = [normalised_error(a, b) for a, b in zip(got, expected)]
    ok = all(e <= TOLERANCE[np.dtype(np.float32)] for e in errors) and refused
    gathered = comm.allgather(np.concatenate([a.ravel() for a in got]))
    same = all(np.array_equal(gathered[0], other) for other in gathered[1:])
    verdict = comm.allreduce(int(ok and same), op=MPI.MIN)
    print(f"rank {rank}/{size}: images {lo}..{hi - 1}, errors {max(errors):.2e}, same on every rank {same}, "
          f"{'ok' if ok else 'MISMATCH'}", flush=True)
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
