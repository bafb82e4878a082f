// The second stage of a split-K GEMM (clconv/algorithms/partials.py): partial sums over
// slices of the inner dimension, added in a fixed order so results are deterministic; also
// direct's grad-weight partials (kernels/direct.cl) and the sum over devices of a spread
// grad-weight (clconv/spread.py), in float16 storage too.

#ifndef PART_REAL      // 1: the partial sums are REAL (float), the result STORE (half): a GEMM's float
#define PART_REAL 0    // partials of float16 operands read as they are, or direct's grad-weight partials
#endif
#if PART_REAL
#define PART_T REAL
#define PART_LOAD(p, i) ((p)[i])
#else
#define PART_T STORE
#define PART_LOAD LOAD
#endif

// out[i] = (accumulate ? out[i] : 0) + sum over s < S of part[s * stride + i], in order.
__kernel void sum_partials(__global const PART_T* restrict part, const IDX part_off, const int S, const IDX n,
                           const IDX stride, __global STORE* restrict out, const IDX out_off, const int accumulate)
{
    if (get_global_id(0) >= (size_t)n) return;   // compared before IDX: the rounded-up launch may pass its range
    const IDX i = get_global_id(0);
    REAL acc = accumulate ? LOAD(out, out_off + i) : (REAL)0;
    for (int s = 0; s < S; ++s) acc += PART_LOAD(part, part_off + (IDX)s * stride + i);
    SAVE(out, out_off + i, acc);
}

// The same, four values per work-item (float32 and float64 storage), where n, stride and both
// offsets, all counted in vectors here, were multiples of 4 values (the host checks).
__kernel void sum_partials4(__global const REAL4* restrict part, const IDX part_off, const int S, const IDX n,
                            const IDX stride, __global REAL4* restrict out, const IDX out_off, const int accumulate)
{
    if (get_global_id(0) >= (size_t)n) return;
    const IDX i = get_global_id(0);
    REAL4 acc = accumulate ? out[out_off + i] : (REAL4)0;
    for (int s = 0; s < S; ++s) acc += part[part_off + (IDX)s * stride + i];
    out[out_off + i] = acc;
}
