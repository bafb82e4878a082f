// im2col / col2im / layout kernels of the general im2col + GEMM algorithm.
//
// Column layout, shared by every pass: for a chunk of B images,
//   col[r][b * P + p],  r = (c * KH + i) * KW + j,  p = oy * OW + ox,  P = OH * OW,
// a (C*KH*KW) x (B*P) row-major matrix. Rows of group g are g*Cg*KH*KW ...,
// so each group's block is one sub-matrix at a fixed offset.
//
// Specialised by the host with prepended #defines; the defaults below are for reading.

// The CPU forms' sizes, in one struct (a driver copies each argument of every launch: see
// clconv.h), under the names they had as arguments from the first line of each kernel.
struct col_geometry { int b, c, h, w, kh, kw, oh, ow, sh, sw, pt, pl, dh, dw; };
#define COL_GEOMETRY_NAMES const int B = geo.b, C = geo.c, H = geo.h, W = geo.w, KH = geo.kh, KW = geo.kw, \
    OH = geo.oh, OW = geo.ow, SH = geo.sh, SW = geo.sw, PT = geo.pt, PL = geo.pl, DH = geo.dh, DW = geo.dw

#ifndef COL_KH         // the GPU forms of im2col and col2im: taps
#define COL_KH 3
#endif
#ifndef COL_KW
#define COL_KW 3
#endif
#ifndef COL_SH         // strides
#define COL_SH 1
#endif
#ifndef COL_SW
#define COL_SW 1
#endif
#ifndef COL_DH         // dilations
#define COL_DH 1
#endif
#ifndef COL_DW
#define COL_DW 1
#endif
#ifndef COL_CHANNELS   // channels per work-item
#define COL_CHANNELS 4
#endif
#ifndef X_HALF         // the GPU forms: 1 where the image side (im2col's x, col2im's dx) is stored as
#define X_HALF 0       // half (a float16 array read or written as it is), col staying REAL
#endif
#if X_HALF
#define X_T half
#define X_LOAD(p, i) vload_half((i), (p))
#define X_SAVE(p, i, v) vstore_half_rte((v), (i), (p))
#else
#define X_T REAL
#define X_LOAD(p, i) ((p)[i])
#define X_SAVE(p, i, v) ((p)[i] = (v))
#endif

// (With a tile of output rows, the host passes OH = the tile's rows and the top padding
// shifted by its first row: the same kernels cover any band of an image.)
//
// im2col's GPU form. 2-D range: dim 0 over the B * P columns (b, p) of col, dim 1 over blocks
// of COL_CHANNELS channels. Each work-item writes the KH*KW rows of its channels in its column:
// the index arithmetic is paid once per pixel, not per tap, neighbouring work-items write
// neighbouring columns, and the columns of all images form one range (no work-group runs past
// the end of each image's pixels). Geometry as constants and several channels per work-item,
// as in col2im below: measured faster on GPUs over the networks' im2col launches.
__kernel void im2col(__global const X_T* restrict x, const IDX x_off,
                     __global REAL* restrict col, const IDX col_off,
                     const int B, const int C, const int H, const int W,
                     const int OH, const int OW, const int PT, const int PL)
{
    const int q = get_global_id(0), c0 = get_global_id(1) * COL_CHANNELS;
    const int P = OH * OW;
    if (q >= B * P || c0 >= C) return;
    const int b = q / P, p = q - b * P, oy = p / OW, ox = p - oy * OW;
    const IDX ld = (IDX)B * P;
    const int channels = min(COL_CHANNELS, C - c0);
    for (int cc = 0; cc < channels; ++cc) {
        const int c = c0 + cc;
        const IDX xb = x_off + ((IDX)b * C + c) * H * W;
        IDX dst = col_off + (IDX)c * COL_KH * COL_KW * ld + q;
        for (int i = 0; i < COL_KH; ++i) {
            const int y = oy * COL_SH - PT + i * COL_DH;
            const bool row_in = y >= 0 && y < H;
            for (int j = 0; j < COL_KW; ++j, dst += ld) {
                const int xx = ox * COL_SW - PL + j * COL_DW;
                col[dst] = (row_in && xx >= 0 && xx < W) ? X_LOAD(x, xb + y * W + xx) : (REAL)0;
            }
        }
    }
}

// Adjoint of im2col. One work-item per input pixel (b, y, x) and COL_CHANNELS channels gathers
// every column entry that im2col read from each of those pixels and OVERWRITES dx with the sum
// (or, with ``accumulate``, adds it: a tile of output rows after the first): no atomics, a fixed
// summation order. 3-D range: pixels of one image from pixel q0 on (a tile's input rows),
// blocks of channels, images. The taps, strides and dilations are compile-time constants
// (COL_*), so that the remainders and quotients by the strides are shifts and multiplies, and a
// work-item covers several channels, so that the GPU starts fewer work-groups of so little work
// each: both measured faster on GPUs over the networks' im2col grad-inputs (built-in strides for
// strided 3x3 layers, several channels per work-item most for 1x1 stride-2 ones).
__kernel void col2im(__global const REAL* restrict col, const IDX col_off,
                     __global X_T* restrict dx, const IDX dx_off,
                     const int B, const int C, const int H, const int W,
                     const int OH, const int OW, const int PT, const int PL,
                     const int q0, const int accumulate)
{
    const int q = q0 + get_global_id(0), c0 = get_global_id(1) * COL_CHANNELS, b = get_global_id(2);
    if (q >= H * W || c0 >= C || b >= B) return;
    const int y = q / W, xx = q - y * W;
    const IDX ld = (IDX)B * OH * OW;
    // Only taps t with (position + pad - t * D) a non-negative multiple of the stride read
    // this pixel; undilated, they are t = (position + pad) % S, then every S-th. A tile of
    // outputs has a shifted top and left padding, possibly negative (and so position + pad):
    // the first tap is then the remainder of position + pad plus a multiple of the stride
    // that makes it non-negative.
    const int ty = y + PT + (PT < 0 ? COL_SH * ((COL_SH - 1 - PT) / COL_SH) : 0);
    const int tx = xx + PL + (PL < 0 ? COL_SW * ((COL_SW - 1 - PL) / COL_SW) : 0);
    const int i0 = COL_DH == 1 ? ty % COL_SH : 0, di = COL_DH == 1 ? COL_SH : 1;
    const int j0 = COL_DW == 1 ? tx % COL_SW : 0, dj = COL_DW == 1 ? COL_SW : 1;
    const int channels = min(COL_CHANNELS, C - c0);
    for (int cc = 0; cc < channels; ++cc) {
        const int c = c0 + cc;
        const IDX src = col_off + (IDX)c * COL_KH * COL_KW * ld + (IDX)b * OH * OW;
        REAL acc = (REAL)0;
        for (int i = i0; i < COL_KH; i += di) {
            int oy = y + PT - i * COL_DH;             // = oy * SH when tap i reads row y
            if (oy < 0) break;                        // only falls as i grows
            if (COL_DH != 1 && oy % COL_SH) continue; // (undilated, the first tap and step keep it a multiple)
            oy /= COL_SH;
            if (oy >= OH) continue;
            const IDX row = src + (IDX)i * COL_KW * ld;
            for (int j = j0; j < COL_KW; j += dj) {
                int ox = xx + PL - j * COL_DW;
                if (ox < 0) break;
                if (COL_DW != 1 && ox % COL_SW) continue;
                ox /= COL_SW;
                if (ox < OW) acc += col[row + j * ld + oy * OW + ox];
            }
        }
        const IDX at = dx_off + ((IDX)b * C + c) * H * W + q;
        X_SAVE(dx, at, accumulate ? X_LOAD(dx, at) + acc : acc);
    }
}

// (B, K, P) -> (K, B*P): grad_output in the column layout, so that grad-weight
// is one GEMM per group over all B*P positions of the chunk.
__kernel void nchw_to_cnhw(__global const REAL* restrict src, const IDX src_off,
                           __global REAL* restrict dst, const IDX dst_off,
                           const int B, const int K, const int P)
{
    const int q = get_global_id(0);   // b * P + p
    const int k = get_global_id(1);
    if (q >= B * P || k >= K) return;
    const int b = q / P, p = q - b * P;
    dst[dst_off + (IDX)k * (B * (IDX)P) + q] = src[src_off + ((IDX)b * K + k) * P + p];
}

// (K, B*P) -> (B, K, P), the epilogue (``flags``: bias[k], ReLU) applied: the forward GEMM's
// result back into NCHW. 2-D range: dim 0 over (b, p), dim 1 over k.
__kernel void cnhw_to_nchw(__global const REAL* restrict src, const IDX src_off,
                           __global REAL* restrict dst, const IDX dst_off,
                           __global const REAL* restrict bias, const IDX bias_off, const int flags,
                           const int B, const int K, const int P)
{
    const int q = get_global_id(0);
    const int k = get_global_id(1);
    if (q >= B * P || k >= K) return;
    const int b = q / P, p = q - b * P;
    REAL v = src[src_off + (IDX)k * (B * (IDX)P) + q];
    if (flags & EPI_BIAS) v += bias[bias_off + k];
    dst[dst_off + ((IDX)b * K + k) * P + p] = EPILOGUE(flags, v);
}

// ---- CPU devices ----------------------------------------------------------------------
#ifndef VW             // values per vector of im2col_rows: 4 or 8
#define VW 8
#endif
typedef union { REALV v; REAL s[VW]; } lanes;   // a vector and its values
// the even lanes of two vectors, lo's then hi's, named one by one
#if VW == 4
#define EVEN_LANES(lo, hi) ((REALV)((lo).s0, (lo).s2, (hi).s0, (hi).s2))
#elif VW == 8
#define EVEN_LANES(lo, hi) ((REALV)((lo).s0, (lo).s2, (lo).s4, (lo).s6, (hi).s0, (hi).s2, (hi).s4, (hi).s6))
#else
#error "im2col_rows takes vectors of 4 or 8 values"
#endif

// im2col for CPU devices, which vectorise a work-item only as far as it is written with
// vectors: work-item (b * OH + oy, c), a single-work-item group, writes output row oy of
// image b into every tap row of channel c, VW neighbouring columns of col at a time.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void im2col_rows(__global const REAL* restrict x, const IDX x_off,
                 __global REAL* restrict col, const IDX col_off,
                 const struct col_geometry geo)
{
    COL_GEOMETRY_NAMES;
    const int boy = get_global_id(0), c = get_global_id(1), b = boy / OH, oy = boy - b * OH;
    const IDX ld = (IDX)B * OH * OW;
    const __global REAL* xc = x + x_off + ((IDX)b * C + c) * H * W;
    __global REAL* dst = col + col_off + (IDX)c * KH * KW * ld + (IDX)b * OH * OW + oy * OW;
    for (int i = 0; i < KH; ++i) {
        const int y = oy * SH - PT + i * DH;
        const __global REAL* xr = xc + (IDX)y * W;
        for (int j = 0; j < KW; ++j, dst += ld) {
            for (int ox0 = 0; ox0 < OW; ox0 += VW) {
                const int x0 = ox0 * SW - PL + j * DW;   // input column of the first lane
                lanes v;
                if (y < 0 || y >= H) {
                    for (int q = 0; q < VW; ++q) v.s[q] = 0;
                } else if (SW == 1 && x0 >= 0 && x0 + VW - 1 < W) {
                    // strides 1 and 2 as constants: contiguous loads, not gathers (measured faster
                    // on PoCL for grouped strided grad-weights)
                    for (int q = 0; q < VW; ++q) v.s[q] = xr[x0 + q];
                } else if (SW == 2 && x0 >= 0 && x0 + 2 * VW - 1 < W) {
                    // one load of 2 VW values, its even lanes: measured faster than 2 VW scalar
                    // reads with every other one kept on both CPU runtimes (PoCL and Intel's),
                    // most on large maps (in direct.cl's row reads it measured slower)
                    const REALV lo = CAT(vload, VW)(0, xr + x0), hi = CAT(vload, VW)(0, xr + x0 + VW);
                    v.v = EVEN_LANES(lo, hi);
                } else if (x0 >= 0 && x0 + (VW - 1) * SW < W) {
                    for (int q = 0; q < VW; ++q) v.s[q] = xr[x0 + q * SW];
                } else {
                    for (int q = 0; q < VW; ++q) v.s[q] = at_or_zero(xr, x0 + q * SW, W);
                }
                if (ox0 + VW <= OW) {
                    for (int q = 0; q < VW; ++q) dst[ox0 + q] = v.s[q];
                } else {
                    for (int q = 0; q < VW; ++q)
                        if (q < OW - ox0) dst[ox0 + q] = v.s[q];
                }
            }
        }
    }
}

// v mod S (0 ... S - 1, for v of either sign) and v / S where S divides v: strides of 1, 2 and 4,
// the networks' all, without a division. col2im_rows worked out a few per tap and VW pixels: with
// them, and the stride-2 taps' lanes set two apart from a contiguous read, PoCL's im2col grad-inputs
// measured faster, strided stems most.
#define MOD_S(v, S) ((S) == 1 ? 0 : (S) == 2 ? (v) & 1 : (S) == 4 ? (v) & 3 : (((v) % (S)) + (S)) % (S))
#define DIV_S(v, S) ((S) == 1 ? (v) : (S) == 2 ? (v) >> 1 : (S) == 4 ? (v) >> 2 : (v) / (S))

// Adjoint of im2col_rows for CPU devices: work-item (b * rows + y - q0 / W, c), a single-work-item
// group (rows: the input rows each image's part of the range covers, from row q0 / W on), writes
// input row y of channel c of image b, VW pixels at a time, each the sum of the column entries
// that read it in col2im's order (tap rows, then tap columns, ascending). The taps that reach the
// row, and per tap column the first lane it reaches, are worked out once per row and VW pixels:
// no division per pixel, which made col2im far slower than its memory traffic on CPUs.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void col2im_rows(__global const REAL* restrict col, const IDX col_off,
                 __global REAL* restrict dx, const IDX dx_off,
                 const struct col_geometry geo, const int q0, const int accumulate)
{
    COL_GEOMETRY_NAMES;
    const int rows = get_global_size(0) / B;
    const int by = get_global_id(0), c = get_global_id(1), b = by / rows, y = q0 / W + by - b * rows;
    const IDX ld = (IDX)B * OH * OW;
    const __global REAL* src = col + col_off + (IDX)c * KH * KW * ld + (IDX)b * OH * OW;
    __global REAL* dst = dx + dx_off + ((IDX)b * C + c) * H * W + (IDX)y * W;
    for (int x0 = 0; x0 < W; x0 += VW) {
        REAL acc[VW];
        for (int q = 0; q < VW; ++q) acc[q] = 0;
        for (int i = 0; i < KH; ++i) {
            const int ty = y + PT - i * DH;            // = oy * SH when tap row i reads row y
            if (ty < 0) break;                         // only falls as i grows
            if (MOD_S(ty, SH)) continue;
            const int oy = DIV_S(ty, SH);
            if (oy >= OH) continue;
            for (int j = 0; j < KW; ++j) {
                const __global REAL* r = src + (IDX)(i * KW + j) * ld + (IDX)oy * OW;
                const int tx = x0 + PL - j * DW;       // = ox * SW where lane 0 is read
                const int first = MOD_S(-tx, SW);      // the first lane tap column j reads
                int ox = DIV_S(tx + first, SW);        // exact
                if (SW == 1 && ox >= 0 && ox + VW <= OW) {
                    for (int q = 0; q < VW; ++q) acc[q] += r[ox + q];
                } else if (SW == 2 && ox >= 0 && ox + VW / 2 <= OW) {   // every other lane, from lane 0 or 1
                    if (first == 0)
                        for (int q = 0; q < VW / 2; ++q) acc[2 * q] += r[ox + q];
                    else
                        for (int q = 0; q < VW / 2; ++q) acc[2 * q + 1] += r[ox + q];
                } else {
                    for (int q = first; q < VW; q += SW, ++ox) {
                        if (ox >= 0 && ox < OW) acc[q] += r[ox];
                    }
                }
            }
        }
        if (x0 + VW <= W) {   // a whole vector
            if (accumulate)
                for (int q = 0; q < VW; ++q) dst[x0 + q] += acc[q];
            else
                for (int q = 0; q < VW; ++q) dst[x0 + q] = acc[q];
            continue;
        }
        const int n = W - x0;
        for (int q = 0; q < n; ++q) dst[x0 + q] = accumulate ? dst[x0 + q] + acc[q] : acc[q];
    }
}

// The layout kernels for CPU devices: work-item b * K + k, a single-work-item group, moves plane
// (b, k), whose P values are contiguous on both sides (the GPU forms' work-item per value
// paid a division each, measured slow on PoCL).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void nchw_to_cnhw_rows(__global const REAL* restrict src, const IDX src_off,
                       __global REAL* restrict dst, const IDX dst_off,
                       const int B, const int K, const int P)
{
    const int bk = get_global_id(0), b = bk / K, k = bk - b * K;
    const __global REAL* s = src + src_off + (IDX)bk * P;
    __global REAL* d = dst + dst_off + (IDX)k * B * P + (IDX)b * P;
    for (int p = 0; p < P; ++p) d[p] = s[p];
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void cnhw_to_nchw_rows(__global const REAL* restrict src, const IDX src_off,
                       __global REAL* restrict dst, const IDX dst_off,
                       __global const REAL* restrict bias, const IDX bias_off, const int flags,
                       const int B, const int K, const int P)
{
    const int bk = get_global_id(0), b = bk / K, k = bk - b * K;
    const __global REAL* s = src + src_off + (IDX)k * B * P + (IDX)b * P;
    __global REAL* d = dst + dst_off + (IDX)bk * P;
    const REAL add = (flags & EPI_BIAS) ? bias[bias_off + k] : (REAL)0;
    for (int p = 0; p < P; ++p) d[p] = EPILOGUE(flags, s[p] + add);
}
