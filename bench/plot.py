"""A chart of one benchmark run: time per pass per workload for clconv and each
peer, and clconv's achieved GFLOP/s against the best GEMM rate measured in the
same run (the practical peak of this device through CLBlast)."""
import math


def plot(result, path):
    """Write a PNG chart of ``result`` (the JSON object bench.run writes) to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(w["name"], p, d) for w in result["workloads"] for p, d in w["passes"].items()]
    labels = [f"{name} {p.replace('backward_', 'd').replace('forward', 'fwd')}" for name, p, _ in rows]
    peers = sorted({peer for _, _, d in rows for peer in d["peers"]})
    series = [("clconv", [d["median_ms"] for _, _, d in rows])]
    series += [(peer, [d["peers"].get(peer, {}).get("median_ms", math.nan) for _, _, d in rows]) for peer in peers]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(10, 0.45 * len(rows)), 9), constrained_layout=True)
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series):
        top.bar([x + (i - (len(series) - 1) / 2) * width for x in range(len(rows))], values, width, label=name)
    top.set_yscale("log")
    top.set_ylabel("median time per call (ms, log scale)")
    top.set_title(f"clconv vs peers on {result['device']} ({result['sizes']} sizes, {result['date']})")
    top.set_xticks(range(len(rows)), labels, fontsize=7, rotation=60, ha="right", rotation_mode="anchor")
    top.legend(fontsize=8, ncol=len(series))

    gflops = [d["gflops"] for _, _, d in rows]
    bottom.bar(range(len(rows)), gflops, color="tab:blue", label="clconv")
    gemm = [w["flop_per_pass"] / d["peers"]["clblast-gemm"]["median_ms"] / 1e6
            for w in result["workloads"] for d in w["passes"].values() if "clblast-gemm" in d["peers"]]
    if gemm:
        bottom.axhline(max(gemm), color="tab:red", linestyle="--",
                       label=f"best CLBlast SGEMM rate in this run ({max(gemm):.0f} GFLOP/s)")
    bottom.set_ylabel("achieved GFLOP/s")
    bottom.set_xticks(range(len(rows)), labels, fontsize=7, rotation=60, ha="right", rotation_mode="anchor")
    bottom.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
