"""Data-parallel steps over MPI ranks with the gradient reductions overlapped with the backward
pass and without, alternating in one run.

    mpiexec -n 2 python -m bench mpi [--width C] [--layers L] [--batch N] [--steps S] [--json PATH]

Every rank runs L 3x3 convolutions of C channels on its share of N images of 28x28 (forward,
backward, the reduction of every layer's gradients by clconv.mpi.DataParallel); rank 0 prints
the min and median ms per step for each mode, the gradient bytes reduced per step, and the time
of the reductions alone (Allreduce of the same host buffers, nothing else running).
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import pyopencl.array as cla
from mpi4py import MPI

import clconv
from clconv.mpi import DataParallel
from clconv.spread import counts


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench mpi", description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    queue = clconv.default_queue()
    layers = [clconv.nn.Conv2d(args.width, args.width, 3, padding=1, relu=True, seed=i, queue=queue)
              for i in range(args.layers)]
    cut = np.cumsum([0] + counts(args.batch, [1] * size))
    local = int(cut[rank + 1] - cut[rank])
    rng = np.random.default_rng(rank)
    x = cla.to_device(queue, rng.standard_normal((local, args.width, 28, 28)).astype(np.float32))
    dy = x.copy()
    modes = {"overlap": DataParallel(layers, comm, overlap=True), "after": DataParallel(layers, comm, overlap=False)}

    def step(dp):
        inputs, h = [], x
        for layer in layers:
            inputs.append(h)
            h = layer.forward(h)
        g = dy
        dp.start(local)
        for layer, xin in zip(reversed(layers), reversed(inputs)):
            layer.zero_grad()
            g = layer.backward(xin, g)
            dp.ready(layer)
        dp.finish()
        queue.finish()

    times = {k: [] for k in modes}
    for dp in modes.values():
        step(dp)   # warm-up: kernel builds, plans
    for _ in range(args.steps):   # alternating modes
        for name, dp in modes.items():
            comm.Barrier()
            t0 = time.perf_counter()
            step(dp)
            times[name].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    flat = [np.zeros(m.grad_weight.size + m.grad_bias.size) for m in layers]
    alone = []
    for _ in range(args.steps):
        comm.Barrier()
        t0 = time.perf_counter()
        for buf in flat:
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        alone.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    if rank == 0:
        nbytes = sum(b.nbytes for b in flat)
        result = {"ranks": size, "width": args.width, "layers": args.layers, "batch": args.batch,
                  "device": queue.device.name.strip(), "gradient_bytes": nbytes,
                  "allreduce_alone_ms": min(alone) * 1e3,
                  **{f"{k}_ms": {"min": min(v) * 1e3, "median": statistics.median(v) * 1e3} for k, v in times.items()}}
        print(f"{size} ranks, {args.layers} layers of {args.width} channels, batch {args.batch}: "
              f"{nbytes / 1e6:.1f} MB of float64 gradients per step, reductions alone {min(alone) * 1e3:.2f} ms")
        for k, v in times.items():
            print(f"  reductions {k:8s}: {min(v) * 1e3:8.2f} ms per step (median {statistics.median(v) * 1e3:8.2f})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
