"""python -m clconv {info, bench, tune, tune-gemm, train-digits, warmup, probe, check}: the command line.

It uses clconv's public API only: what it prints about devices, checks and tuning comes from
:mod:`clconv.tools`; ``bench`` runs the workloads benchmark (``clconv.bench``, shipped with the
package), ``train-digits`` the training example (:mod:`clconv.apps.digits`).
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
from tqdm import tqdm

from clconv import (ClconvError, DeviceNotFound, conv2d_bias, conv_geometry, default_queue, pick_device, prepare,
                    reference, tools)

from . import digits


def cmd_info(args):
    for pi, platform in enumerate(cl.get_platforms()):
        print(f"platform {pi}: {platform.name} ({platform.version})")
        try:
            devices = platform.get_devices()
        except cl.Error as exc:
            print(f"  no devices ({exc})")
            continue
        for di, d in enumerate(devices):
            kind = cl.device_type.to_string(d.type)
            print(f"  device {pi}:{di}: {d.name.strip()} [{kind}], driver {d.driver_version}")
            facts = tools.device_facts(d)
            if not facts["builds"]:
                print(f"    cannot build kernels: {facts['build_error']}")
                continue
            print(f"    compute units {d.max_compute_units}, global memory {d.global_mem_size / 2**30:.1f} GiB, "
                  f"max allocation {d.max_mem_alloc_size / 2**30:.2f} GiB, local memory {d.local_mem_size // 1024} KiB")
            print(f"    fp64 (cl_khr_fp64): {'yes' if facts['fp64'] else 'no'}, "
                  f"fp16 (cl_khr_fp16): {'yes' if facts['fp16'] else 'no'} "
                  "(float16 arrays run either way: stored as half, computed in float32)")
            verdicts = facts["checks"]
            passed = sorted(f"{a} ({e}, {t})" for (t, a, e), (ok, _) in verdicts.items() if ok)
            failed = sorted(f"{a} ({e}, {t}): {m}" for (t, a, e), (ok, m) in verdicts.items() if not ok)
            print(f"    known-answer checks passed: {', '.join(passed) or 'none stored yet'}")
            for line in failed:
                print(f"    known-answer check FAILED, left out of 'auto': {line}")
    try:
        device, why = pick_device()
    except DeviceNotFound as exc:
        print(f"no default device: {exc}", file=sys.stderr)
        return 2
    print(f"default device: {device.name.strip()} on {device.platform.name} ({why})")
    pocls = tools.pocl_versions()
    if len(pocls) > 1:
        print(f"PoCL: {len(pocls)} installed ({', '.join('.'.join(map(str, v)) for v in pocls)}); "
              "CLCONV_DEVICE=pocl and the default take the newest that builds kernels")
    print("known-answer checks run the first time an algorithm is used on a device (python -m clconv check "
          "runs them all now); CLCONV_SELFCHECK=0 turns them off" if tools.checks_enabled() else
          "known-answer checks are off (CLCONV_SELFCHECK=0)")
    return 0


def cmd_bench(args):
    from clconv.bench import run   # imported when asked for: the benchmark's peers are heavy
    return run.main(args.rest)   # its own options: python -m clconv bench --help


def _workload_geometries(names, device):
    from clconv.bench.run import load_workloads   # the benchmark's workloads (bench/workloads.json)
    size = "gpu" if device.type & cl.device_type.GPU else "cpu"
    chosen = [w for w in load_workloads() if not names or w["name"] in names]
    if names and len(chosen) != len(set(names)):
        raise ValueError(f"unknown workload in {names}; known: {[w['name'] for w in load_workloads()]}")
    for w in chosen:
        s = w[size]
        yield w["name"], conv_geometry((s["N"], s["C"], s["H"], s["W"]), (s["K"], s["C"] // s["groups"], s["kh"],
                                       s["kw"]), s["stride"], s["padding"], s["dilation"], s["groups"])


def cmd_tune(args):
    queue = default_queue()
    work = list(_workload_geometries(args.workload, queue.device))
    steps = tools.tune_steps([g for _, g in work])
    with tqdm(total=steps, desc="tuning", unit="run", file=sys.stderr) as bar:
        for name, g in work:
            results = tools.tune(g, np.float32, queue, progress=bar.update)
            for pass_name, r in results.items():
                timings = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["timings"].items(), key=lambda kv: kv[1]))
                tqdm.write(f"{name:16s} {pass_name:16s} -> {r['algorithm']}/{r['queues']} ({timings} ms)",
                           file=sys.stdout)
    print(f"stored in {tools.tuning_cache_path()}")
    return 0


def cmd_tune_gemm(args):
    queue = default_queue()
    geometries = [g for _, g in _workload_geometries(args.workload, queue.device)]
    steps = tools.tune_gemm_steps()
    with tqdm(total=steps, desc="tuning CLBlast GEMM", unit="set", file=sys.stderr) as bar:
        def progress(name, result):
            bar.update()
            shown = result if isinstance(result, str) else f"time ratio to CLBlast's own {result:.3f}"
            tqdm.write(f"{name:16s} {shown}", file=sys.stdout)
        # GPU passes take milliseconds: time batches of 10 back-to-back calls; CPU ones need no batching
        batch = 10 if queue.device.type & cl.device_type.GPU else 1
        try:
            entry = tools.tune_gemm(geometries, queue, batch=batch, progress=progress)
        except tools.NothingToTune as exc:   # nothing to tune here, or this process already applied parameters
            print(f"tune-gemm: {exc}", file=sys.stderr)
            return 1
    print(f"{len(entry['default_ms'])} GEMM passes of {len(geometries)} workload(s): geometric mean time ratio "
          f"of the tuned parameters to CLBlast's own {entry['score']}")
    kept = ", ".join(entry["overrides"]) or f"none (their score is not below {tools.GEMM_GAIN})"
    print(f"stored overrides: {kept}; in {tools.tuning_cache_path()}")
    return 0


def _launched_by_mpiexec():
    """Whether this process is one of several started by mpiexec (MPICH's or Open MPI's)."""
    size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or "1"
    return int(size) > 1


def cmd_train_digits(args):
    queue = default_queue()
    comm = None
    if args.mpi or _launched_by_mpiexec():
        from mpi4py import MPI   # the `mpi` extra
        comm = MPI.COMM_WORLD
    lead = comm is None or comm.Get_rank() == 0
    if lead:
        ranks = f", {comm.Get_size()} MPI ranks" if comm is not None else ""
        print(f"training on {queue.device.name.strip()} ({queue.device.platform.name}){ranks}")
    history = digits.train(args.epochs, args.batch, args.lr, args.momentum, queue=queue,
                           plot=args.plot or None, comm=comm, overlap=False if args.no_overlap else "auto")
    if lead:
        if args.plot:
            print(f"wrote {args.plot}")
        if args.json:
            Path(args.json).write_text(json.dumps(history))
        print(f"test accuracy {history['accuracy'][-1]:.4f} after {args.epochs} epochs in {history['seconds']:.1f} s")
    return 0


def cmd_warmup(args):
    """clconv.prepare over the networks benchmark's layers (bench/networks.json, shipped with the
    package): their plans, known-answer checks and kernels, built once on this machine's caches."""
    from clconv.bench.networks import layer_shapes, load_layers, select   # the layers file and its reader
    data = load_layers()
    networks = args.networks.split(",") if args.networks else list(data["networks"])
    unknown = [n for n in networks if n not in data["networks"]]
    if unknown:
        raise ValueError(f"unknown networks {unknown}; known: {list(data['networks'])}")
    queue = default_queue()
    batch = args.batch or (32 if queue.device.type & cl.device_type.GPU else 8)
    layers = select(data, networks)
    print(f"preparing {len(layers)} layers of {', '.join(networks)} at batch {batch} on {queue.device.name.strip()}")
    prepare([layer_shapes(layer, batch) for layer in layers], queue=queue, processes=args.processes, progress=True)
    return 0


def cmd_probe(args):
    """Whether the device (CLCONV_DEVICE's, else the default) builds and runs kernels, asked anew
    (:func:`clconv.tools.probe_device`): exit status 0, else 1 with the compiler's line."""
    device, why = pick_device()
    builds, line, name = tools.probe_device(device)
    print(f"{name} ({why}): " + ("builds kernels" if builds else f"cannot build kernels: {line}"))
    return 0 if builds else 1


def cmd_check(args):
    """Whether the device builds kernels, then every algorithm's known-answer cases, both anew
    (:func:`clconv.tools.check`), and grad-bias against the NumPy reference."""
    queue = default_queue()
    dtype = np.dtype(args.dtype)
    own, rows = tools.check(queue, dtype, args.math)
    print(f"checking every pass in {dtype} against the NumPy reference on {queue.device.name.strip()} "
          f"(GEMMs on {own})")
    failed = 0
    for label, pass_name, err, ok, message in rows:
        failed += not ok
        shown = f"normalised max error {err:.1e}" if err is not None else message.splitlines()[0]
        print(f"  {label:28s} {pass_name:12s} {shown}  {'ok' if ok else 'FAILED'}")
    dy = np.random.default_rng(1).standard_normal((3, 5, 4, 7)).astype(dtype)
    err = float(reference.normalised_error(conv2d_bias(dy), reference.conv2d_bias(dy)))
    ok = err <= reference.TOLERANCE[dtype]
    failed += not ok
    print(f"  {'bias':28s} {'grad-bias':12s} normalised max error {err:.1e}  {'ok' if ok else 'FAILED'}")
    print("all passes match" if not failed else f"{failed} check(s) FAILED")
    return 1 if failed else 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m clconv", description="clconv: grouped conv2d on OpenCL")
    ap.add_argument("--device", help="OpenCL device: a substring of the platform or device name, or P:D "
                                     "(sets CLCONV_DEVICE)")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="platforms, devices, memory, extensions, the default device and why")
    sub.add_parser("bench", help="the benchmark (options: python -m clconv bench --help)", add_help=False)
    tune = sub.add_parser("tune", help="time every algorithm for the workloads and store the winners")
    tune.add_argument("--workload", action="append", help="workload name (repeatable; default: all)")
    tune_gemm = sub.add_parser("tune-gemm", help="search CLBlast GEMM parameters on the workloads' GEMM passes "
                                                 "and store the fastest (run it on its own)")
    tune_gemm.add_argument("--workload", action="append", help="workload name (repeatable; default: all)")
    digits = sub.add_parser("train-digits", help="train a small convolutional network on scikit-learn's digits "
                                                 "(the `examples` extra), on the device from start to finish")
    digits.add_argument("--epochs", type=int, default=30)
    digits.add_argument("--batch", type=int, default=32, help="images per SGD step")
    digits.add_argument("--lr", type=float, default=0.05)
    digits.add_argument("--momentum", type=float, default=0.9)
    digits.add_argument("--plot", default="digits-training.png",
                        help="PNG of loss and accuracy per epoch ('' for none)")
    digits.add_argument("--json", help="write the loss and accuracy per epoch and the seconds to this file")
    digits.add_argument("--mpi", action="store_true", help="average the gradients over the MPI ranks (the default "
                                                           "when started by mpiexec with more than one process)")
    digits.add_argument("--no-overlap", action="store_true", help="with MPI: reduce every layer's gradients after "
                                                                  "the whole backward, not during it")
    warmup = sub.add_parser("warmup", help="build the kernels of networks' layers ahead of their first calls "
                                           "(clconv.prepare over bench/networks.json)")
    warmup.add_argument("--networks", help="comma-separated subset (default: all six)")
    warmup.add_argument("--batch", type=int, help="images per call (default 32 on a GPU, 8 on a CPU device)")
    warmup.add_argument("--processes", type=int, default=min(os.cpu_count() or 1, 8),
                        help="worker processes that build first, each with its own context and arrays (default: "
                             "one per host core, at most 8; 0: threads only)")
    sub.add_parser("probe", help="whether the device builds and runs kernels (exit status 1 if not)")
    check = sub.add_parser("check", help="quick self-test of every pass against the NumPy reference")
    check.add_argument("--dtype", choices=["float32", "float16", "float64"], default="float32")
    check.add_argument("--math", help="math mode (strict, tf32 for float32, fp16 for float16), where the device "
                                      "runs it (default: the dtype's, clconv.get_math)")
    args, rest = ap.parse_known_args(argv)
    if args.command != "bench" and rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    if args.device:
        os.environ["CLCONV_DEVICE"] = args.device
    command = {"info": cmd_info, "bench": cmd_bench, "tune": cmd_tune, "tune-gemm": cmd_tune_gemm,
               "train-digits": cmd_train_digits, "warmup": cmd_warmup, "check": cmd_check,
               "probe": cmd_probe}[args.command]
    # what a user can mend (no such device, a dtype the device lacks, a bad option) is said in one
    # line, without a traceback; exit status 2, as argparse gives for a bad command line
    try:
        return command(args)
    except (DeviceNotFound, TypeError, ValueError) as exc:
        print(f"python -m clconv {args.command}: {exc}", file=sys.stderr)
        return 2
    except ClconvError as exc:
        print(f"python -m clconv {args.command}: {exc}", file=sys.stderr)
        return 1
