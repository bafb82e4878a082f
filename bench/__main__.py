"""The benchmarks' one entry point: ``python -m bench <name> [options]``; ``python -m bench <name>
--help`` gives a benchmark's options. (Installed, the package is ``clconv.bench``:
``python -m clconv.bench <name>``; ``python -m clconv bench`` runs the workloads.) Each writes its
JSON to ``bench/results/``, named as the contributing guide says.
"""
import argparse
import importlib
import sys

# name -> (module, what it times), in the order the contributing guide's table lists them
BENCHMARKS = {
    "workloads": ("run", "the ten workloads against PyTorch, NumPy and CLBlast"),
    "networks": ("networks", "every convolution of six torchvision networks against PyTorch"),
    "host": ("host", "small layers' host time per call, against an empty launch"),
    "gemm": ("gemm", "the GEMM engines on the workloads' GEMM shapes"),
    "gemm-tiles": ("gemm_tiles", "the GPU GEMM's tiles on the networks' GEMMs"),
    "fused": ("fused", "the fused bias and ReLU against unfused ways"),
    "tiles": ("tiles", "large images against batches of smaller ones"),
    "devices": ("devices", "one device against several"),
    "scaling": ("scaling", "PoCL's thread count (the workloads and GEMM benchmarks in child processes)"),
    "profile": ("profile", "each pass split into its kernels (printed)"),
    "mpi": ("mpi", "gradient reductions over MPI ranks, overlapped and not (under mpiexec)"),
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = f"python -m {__package__}"
    if not argv or argv[0] not in BENCHMARKS:
        listing = "\n".join(f"  {name:11s} {what}" for name, (_, what) in BENCHMARKS.items())
        ap = argparse.ArgumentParser(prog=prog, usage=f"{prog} <name> [options]",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description=f"clconv's benchmarks ({prog} <name> --help: a benchmark's options)",
                                     epilog=f"benchmarks:\n{listing}")
        ap.add_argument("name", choices=list(BENCHMARKS), metavar="name", help="the benchmark (below)")
        if not argv:
            ap.print_help(sys.stderr)
            return 2
        ap.parse_args(argv[:1])   # prints the help (-h), or names the benchmarks there are, and exits
    module = importlib.import_module(f"{__package__}.{BENCHMARKS[argv[0]][0]}")
    return module.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
