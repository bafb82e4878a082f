"""GEMM engines on the convolution workloads' GEMM shapes, against NumPy and the machine's peak.

    python -m bench gemm [--repeat R] [--json PATH] [--engine NAME ...] [--size cpu|gpu|square]
                         [--math strict|tf32|fp16|bf16]

Times each engine that runs on the device (clconv's CPU kernel, clconv's GPU kernel, CLBlast)
on the products the fully-connected, pointwise and im2col passes of bench/workloads.json run
(their layouts and batch counts), interleaved round by round, plus NumPy's matmul (its BLAS)
and, where it imports, PyTorch's on the same shapes in the same process. The peak is measured: an OpenCL kernel of independent
multiply-add chains on every compute unit, in vectors of the device's native width (8 values at
least: 16 on AVX-512 CPUs, whose 512-bit peak is about 1.8x the 256-bit one on the 2-core Xeon,
420 against 229 GFLOP/s), the FLOP/s the device's compiler can issue; beside it the figure
derived from the clock /proc/cpuinfo reports and two FMA pipes per core of the widest vectors its
flags list (32 single-precision FLOP per cycle with AVX2, 64 with AVX-512).

--size square times one 4096 x 4096 x 4096 product. --math runs clconv's GPU kernel in that mode
(clconv.precision; the others only in strict math) and, on a GPU, PyTorch's CUDA matmul (cuBLAS)
in the same mode beside the host peers, each held to the mode's tolerance
(clconv.reference.tolerance).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

import clconv
from clconv.gemm import Grid, Operand, clblast, gemm_cpu, gemm_gpu

from clconv.reference import normalised_error, tolerance

from .peers import cuda_matmul_peer, matmul_peers
from .run import load_workloads

PEAK_SOURCE = """
__kernel void peak(__global float* out, const int n, const float s)
{
    VEC v[CHAINS];
    #pragma unroll
    for (int c = 0; c < CHAINS; ++c) v[c] = (VEC)(get_global_id(0) + c);
    for (int i = 0; i < n; ++i) {
        #pragma unroll
        for (int c = 0; c < CHAINS; ++c) v[c] = v[c] * s + 0.5f;
    }
    VEC t = 0;
    #pragma unroll
    for (int c = 0; c < CHAINS; ++c) t += v[c];
    out[get_global_id(0)] = t.s0 + t.s1 + t.s2 + t.s3 + t.s4 + t.s5 + t.s6 + t.s7;
}
"""
CHAINS = 12
SETTLE_S = 0.2


def peak_vector_width(device):
    """Values per vector of the peak kernel: the device's native float width, 8 to 16."""
    return min(16, max(8, device.native_vector_width_float))


def measured_peak(queue, seconds=0.5):
    """GFLOP/s of independent multiply-add chains of :func:`peak_vector_width` values, CHAINS per
    work-item, 8 work-items per compute unit."""
    vw = peak_vector_width(queue.device)
    program = cl.Program(queue.context, f"#define CHAINS {CHAINS}\n#define VEC float{vw}\n" + PEAK_SOURCE).build()
    kernel = program.peak
    items = 8 * queue.device.max_compute_units
    out = cl.Buffer(queue.context, cl.mem_flags.WRITE_ONLY, 4 * items)
    n = 1000
    while True:
        t0 = time.perf_counter()
        kernel(queue, (items,), (1,), out, np.int32(n), np.float32(0.999))
        queue.finish()
        dt = time.perf_counter() - t0
        if dt > seconds:
            return 2 * vw * CHAINS * n * items / dt / 1e9
        n *= 2


def clock_peak():
    """(GHz, FLOP per cycle and core, GFLOP/s) from /proc/cpuinfo's clock and flags: two FMA pipes
    of 512-bit vectors where it lists avx512f (64 FLOP a cycle), else of 256-bit ones (32); None
    where unknown."""
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
    except OSError:
        return None
    mhz = [float(line.split(":")[1]) for line in lines if line.startswith("cpu MHz")]
    wide = any(line.startswith("flags") and "avx512f" in line.split() for line in lines)
    per_cycle = 64 if wide else 32
    return (max(mhz) / 1e3, per_cycle, max(mhz) / 1e3 * per_cycle * os.cpu_count()) if mhz else None


def shapes(size):
    """(name, M, N, K, count, a_transp, b_transp): the GEMMs of the workloads' GEMM passes, or
    for "square" one 4096^3 product."""
    if size == "square":
        return [("square", 4096, 4096, 4096, 1, False, False)]
    found = []
    for w in load_workloads():
        s = w[size]
        N, C, H, W, K, kh, kw, G = (s[x] for x in ("N", "C", "H", "W", "K", "kh", "kw", "groups"))
        Cg, Kg = C // G, K // G
        if (kh, kw) == (H, W) and s["padding"] == 0:   # fully connected
            Kd = Cg * kh * kw
            found += [(f"{w['name']} fwd", N, Kg, Kd, G, False, True),
                      (f"{w['name']} dgrad", N, Kd, Kg, G, False, False),
                      (f"{w['name']} wgrad", Kg, Kd, N, G, True, False)]
        elif (kh, kw) == (1, 1) and s["stride"] == 1 and s["padding"] == 0:   # pointwise, per image
            P = H * W
            found += [(f"{w['name']} fwd", Kg, P, Cg, G * N, False, False),
                      (f"{w['name']} dgrad", Cg, P, Kg, G * N, True, False),
                      (f"{w['name']} wgrad", Kg, Cg, P, G * N, False, True)]
        elif w["name"] in ("dense_3x3", "stem_7x7_s2"):   # im2col over the batch
            OH = (H + 2 * s["padding"] - s["dilation"] * (kh - 1) - 1) // s["stride"] + 1
            OW = (W + 2 * s["padding"] - s["dilation"] * (kw - 1) - 1) // s["stride"] + 1
            P, Kd = N * OH * OW, Cg * kh * kw
            found += [(f"{w['name']} fwd", Kg, P, Kd, G, False, False),
                      (f"{w['name']} dgrad", Kd, P, Kg, G, True, False),
                      (f"{w['name']} wgrad", Kg, Kd, P, G, False, True)]
    return found


def engines(queue, names, math="strict"):
    """{name: run(m, n, k, count, a, b, c, a_transp, b_transp)} for the engines that run here, in
    ``math`` (clconv's GPU kernel only, where that is not strict)."""
    f32 = np.dtype(np.float32)

    def batched(grid, **kw):
        def run(m, n, k, count, a, b, c, at, bt):
            grid(queue, f32, Grid(1, count, m, n, k), Operand(a, 0, m if at else k, 0, m * k, transp=at),
                 Operand(b, 0, k if bt else n, 0, k * n, transp=bt), Operand(c, 0, n, 0, m * n), what="bench", **kw)
        return run
    found = {"clconv-cpu": batched(gemm_cpu.grid_gemm), "clblast": batched(clblast.grid_gemm)} if math == "strict" else {}
    if gemm_gpu.tile(queue.device, 128, 128, 1) is not None and (math == "strict"
                                                                  or math in gemm_gpu.matrix_units(queue.device)):
        found["clconv-gpu"] = batched(gemm_gpu.grid_gemm, math=math)
    return {k: v for k, v in found.items() if not names or k in names}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench gemm", description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="rounds of interleaved runs (default 5)")
    ap.add_argument("--engine", action="append", help="only these engines (clconv-cpu, clconv-gpu, clblast)")
    ap.add_argument("--size", choices=("cpu", "gpu", "square"), default="cpu")
    ap.add_argument("--math", choices=("strict", "tf32", "fp16", "bf16"), default="strict",
                    help="clconv's GPU kernel and PyTorch's CUDA matmul in this math mode")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    queue = clconv.default_queue()
    device = queue.device
    peak = measured_peak(queue)
    clock = clock_peak()
    print(f"device: {device.platform.name} / {device.name.strip()}")
    print(f"measured fma peak ({peak_vector_width(device)}-wide vectors): {peak:.1f} GFLOP/s"
          + (f"; clock {clock[0]:.2f} GHz x {clock[1]} FLOP x {os.cpu_count()} cores = {clock[2]:.1f} GFLOP/s"
             if clock else ""))
    runs = engines(queue, args.engine, args.math)
    if not runs:
        ap.error(f"no engine runs math={args.math!r} on {device.name.strip()}")
    tol = tolerance(np.float32, args.math)
    rng = np.random.default_rng(0)
    rows = []
    for name, m, n, k, count, at, bt in shapes(args.size):
        ha = rng.standard_normal((count, k, m) if at else (count, m, k)).astype(np.float32)
        hb = rng.standard_normal((count, n, k) if bt else (count, k, n)).astype(np.float32)
        a, b = cla.to_device(queue, ha), cla.to_device(queue, hb)
        opa = ha.transpose(0, 2, 1) if at else ha
        opb = hb.transpose(0, 2, 1) if bt else hb
        want = np.matmul(opa.astype(np.float64), opb.astype(np.float64))
        flop = 2.0 * m * n * k * count
        on_gpu = bool(device.type & cl.device_type.GPU)
        hosts = {**matmul_peers(opa, opb), **(cuda_matmul_peer(opa, opb, args.math) if on_gpu else {})}
        times = {e: [] for e in (*runs, *hosts)}
        outs = {e: cla.empty(queue, (count, m, n), np.float32) for e in runs}
        for e, fn in runs.items():   # warm up, and check once
            fn(m, n, k, count, a.base_data, b.base_data, outs[e].base_data, at, bt)
            queue.finish()
            err = normalised_error(outs[e].get(), want)
            assert err <= tol, f"{e} {name}: normalised error {err}"
        for fn in hosts.values():
            fn()
        for _ in range(args.repeat):   # interleaved rounds
            for e, fn in runs.items():
                inner = max(1, int(0.2 / max(min(times[e], default=0.05), 1e-4)))
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn(m, n, k, count, a.base_data, b.base_data, outs[e].base_data, at, bt)
                queue.finish()
                times[e].append((time.perf_counter() - t0) / inner)
            for e, fn in hosts.items():   # as many calls back to back as the engines make
                inner = max(1, int(0.2 / max(min(times[e], default=0.05), 1e-4)))
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                times[e].append((time.perf_counter() - t0) / inner)
                time.sleep(SETTLE_S)   # the BLAS's threads spin a while after a call: not on the next engine's time
        row = {"gemm": name, "m": m, "n": n, "k": k, "count": count, "a_transp": at, "b_transp": bt,
               "engines": {e: {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3,
                               "gflops": flop / statistics.median(t) / 1e9,
                               "percent_of_peak": 100 * flop / statistics.median(t) / 1e9 / peak}
                           for e, t in times.items()}}
        rows.append(row)
        cells = "  ".join(f"{e} {d['gflops']:6.1f} GFLOP/s ({d['percent_of_peak']:3.0f}%)"
                          for e, d in row["engines"].items())
        layout = ("T" if at else "N") + ("T" if bt else "N")
        print(f"{name:22s} {layout} {m:5d}x{n:5d}x{k:5d} x{count:<3d} {cells}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name.strip(), "platform": device.platform.name, "driver": device.driver_version,
                       "machine": platform.machine(), "measured_peak_gflops": peak,
                       "peak_vector_width": peak_vector_width(device),
                       "clock_peak": clock and {"ghz": clock[0], "flop_per_cycle": clock[1], "gflops": clock[2]},
                       "math": args.math, "numpy": np.__version__, "torch": getattr(sys.modules.get("torch"), "__version__", None),
                       "shapes": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
