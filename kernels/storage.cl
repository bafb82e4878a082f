// Conversions between the storage type and the arithmetic type, for float16 arrays
// (STORE half, REAL float): the algorithms run in float on float copies, so every
// sum accumulates in float32. Built for float32/float64 too (then plain copies).

// dst[i] = (REAL)src[i] for i < n
__kernel void to_real(__global const STORE* restrict src, const IDX src_off,
                      __global REAL* restrict dst, const IDX dst_off, const IDX n)
{
    if (get_global_id(0) >= (size_t)n) return;   // compared before IDX: the rounded-up launch may pass its range
    const IDX i = get_global_id(0);
    dst[dst_off + i] = LOAD(src, src_off + i);
}

// dst[i] = src[i] rounded to the storage type (to nearest even)
__kernel void to_store(__global const REAL* restrict src, const IDX src_off,
                       __global STORE* restrict dst, const IDX dst_off, const IDX n)
{
    if (get_global_id(0) >= (size_t)n) return;   // compared before IDX: the rounded-up launch may pass its range
    const IDX i = get_global_id(0);
    SAVE(dst, dst_off + i, src[src_off + i]);
}

// dst[i] += src[i], added in REAL (a module's gradient accumulation)
__kernel void accumulate(__global STORE* restrict dst, const IDX dst_off,
                         __global const STORE* restrict src, const IDX src_off, const IDX n)
{
    if (get_global_id(0) >= (size_t)n) return;   // compared before IDX: the rounded-up launch may pass its range
    const IDX i = get_global_id(0);
    SAVE(dst, dst_off + i, LOAD(dst, dst_off + i) + LOAD(src, src_off + i));
}
