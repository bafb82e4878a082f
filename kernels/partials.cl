// The second stage of a split-K GEMM (clconv/algorithms/partials.py): partial sums over
// slices of the inner dimension, added in a fixed order so results are deterministic.

// out[i] = (accumulate ? out[i] : 0) + sum over s < S of part[s * stride + i], in order.
__kernel void sum_partials(__global const REAL* restrict part, const IDX part_off, const int S, const IDX n,
                           const IDX stride, __global REAL* restrict out, const IDX out_off, const int accumulate)
{
    const IDX i = get_global_id(0);
    if (i >= n) return;
    REAL acc = accumulate ? out[out_off + i] : (REAL)0;
    for (int s = 0; s < S; ++s) acc += part[part_off + (IDX)s * stride + i];
    out[out_off + i] = acc;
}
