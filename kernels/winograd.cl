// Winograd F(4x4, 3x3) and F(2x2, 5x5) transforms of the winograd algorithm
// (clconv/algorithms/winograd.py), and F(1x2, 1x7) / F(2x1, 7x1) along one axis.
//
// A TMxTM output tile of an FRxFR convolution (TM = 4 for FR = 3, 2 for FR = 5) is
// A^T [(G g G^T) . (B^T d B)] A, where d is the tile's 6x6 input patch, g the filter and
// "." the element-wise product; summed over channels, each of the 36 products is one GEMM
// over (filters x channels x tiles). Both use the same 6 interpolation points, so B is the
// same; G (6 x FR) and A^T (TM x 6) evaluate the filter's and the output's polynomials.
// A filter of one row or column of 7 taps (WINO_H or WINO_W 0: that axis untransformed, one
// tap, one output per tile) runs F(2, 7) along the other axis: 8 interpolation points, tiles
// of 2 outputs from 8 inputs, 8 products where im2col's GEMM has 14.
// Buffers between the kernels, for P tiles (all tiles of a chunk of B images), TT = AH * AW
// transformed values per tile (36, or 8 along one axis):
//   U[t][k][ci]  transformed filters, TT x K x Ci   (t = AW * row + column of the AH x AW tile)
//   V[t][c][p]   transformed input patches, TT x C x P
//   M[t][k][p]   their products summed over the channels of k's group, TT x K x P
// Grad-weight splits the tiles into S slices of L (S * L = P) and stores V and Z (the
// transformed grad_output) slice-major, V[s][t][c][l] with p = s * L + l, so that the
// GEMMs of every (slice, t, group) are evenly spaced: one batched call. S = 1 is the
// layout above.
// With dilation D the taps of a tile are D apart and so are its outputs: tile row th starts
// at output row (th % D) + (th / D) * TMH * D, which for D = 1 is TMH * th (columns alike).
// The kernels over tiles see TH tile rows per image from tile row TH0: all of them (TH0 = 0),
// or, for an image whose workspace is above the budget, one range of its tile rows (B = 1).
//
// The arrays (filters, input, output, grad_output, grad_weight) are read and written through
// LOAD and SAVE (clconv.h): float16 arrays as they are, the buffers above staying REAL.
// Specialised by the host with prepended #defines; the defaults below are for reading.
#ifndef FR             // filter size along a transformed axis: 3, 5, or 7 (along one axis only)
#define FR 3
#endif
#ifndef WINO_H         // 1: the filter's columns are FR taps, transformed; 0: one tap (a 1 x FR filter)
#define WINO_H 1
#endif
#ifndef WINO_W         // 1: the filter's rows are FR taps, transformed; 0: one tap (an FR x 1 filter)
#define WINO_W 1
#endif
#if FR == 7
#define ALPHA 8        // transformed values per transformed axis
#else
#define ALPHA 6
#endif
#if (FR != 3 && FR != 5 && FR != 7) || !(WINO_H || WINO_W) || (FR == 7 && WINO_H && WINO_W)
#error "FR is 3 or 5, or 7 along one axis only (WINO_H or WINO_W 0); at least one axis transformed"
#endif
#define TM (ALPHA + 1 - FR)          // outputs per tile along a transformed axis
#define AH (WINO_H ? ALPHA : 1)      // a tile's transformed values along rows and columns
#define AW (WINO_W ? ALPHA : 1)
#define TT (AH * AW)
#define TMH (WINO_H ? TM : 1)        // its outputs
#define TMW (WINO_W ? TM : 1)
#define FRH (WINO_H ? FR : 1)        // the filter's taps
#define FRW (WINO_W ? FR : 1)

// The 1-D transforms, in place on v[0], v[s], v[2s], ... (after inlining every index is a
// constant, so the tiles live in registers). Interpolation points 0, 1, -1, 2, -2, infinity
// (and 1/2, -1/2 for 7 taps). A tile is one flat array, value (i, j) at v[AW * i + j]: column j
// is v + j with s = AW, row i v + AW * i with s = 1. Not v[AH][AW]: a column from &v[0][j] would index past the row v[0],
// undefined behaviour in C (C99 6.5.6, J.2's a[1][7]), and Mesa's compiler (rusticl) takes it
// at its word: those loads read undefined values and those stores are dropped.
// Defined once for a type T with a name suffix: for REAL values (suffix none) and, in the
// CPU kernels below, for vectors of VW tiles' values (suffix _v).
#if FR == 3
#define TRANSFORMS_FR(T, SUFFIX) \
/* G g: 3 filter taps -> 6 (the filter polynomial at each point, scaled) */                   \
inline void filter_1d##SUFFIX(T* v, const int s)                                              \
{                                                                                             \
    const T g0 = v[0], g1 = v[s], g2 = v[2 * s];                                              \
    v[0] = g0 / 4;                                                                            \
    v[s] = -(g0 + g1 + g2) / 6;                                                               \
    v[2 * s] = -(g0 - g1 + g2) / 6;                                                           \
    v[3 * s] = g0 / 24 + g1 / 12 + g2 / 6;                                                    \
    v[4 * s] = g0 / 24 - g1 / 12 + g2 / 6;                                                    \
    v[5 * s] = g2;                                                                            \
}                                                                                             \
/* A^T m: 6 products -> 4 outputs */                                                          \
inline void output_1d##SUFFIX(T* v, const int s)                                              \
{                                                                                             \
    const T m0 = v[0], m1 = v[s], m2 = v[2 * s], m3 = v[3 * s], m4 = v[4 * s], m5 = v[5 * s]; \
    v[0] = m0 + m1 + m2 + m3 + m4;                                                            \
    v[s] = m1 - m2 + 2 * (m3 - m4);                                                           \
    v[2 * s] = m1 + m2 + 4 * (m3 + m4);                                                       \
    v[3 * s] = m1 - m2 + 8 * (m3 - m4) + m5;                                                  \
}                                                                                             \
/* A e, the adjoint of output_1d: 4 output gradients -> 6 */                                  \
inline void grad_output_1d##SUFFIX(T* v, const int s)                                         \
{                                                                                             \
    const T e0 = v[0], e1 = v[s], e2 = v[2 * s], e3 = v[3 * s];                               \
    v[0] = e0;                                                                                \
    v[s] = e0 + e1 + e2 + e3;                                                                 \
    v[2 * s] = e0 - e1 + e2 - e3;                                                             \
    v[3 * s] = e0 + 2 * e1 + 4 * e2 + 8 * e3;                                                 \
    v[4 * s] = e0 - 2 * e1 + 4 * e2 - 8 * e3;                                                 \
    v[5 * s] = e3;                                                                            \
}                                                                                             \
/* G^T u, the adjoint of filter_1d: 6 -> 3 filter taps */                                     \
inline void grad_filter_1d##SUFFIX(T* v, const int s)                                         \
{                                                                                             \
    const T u0 = v[0], u1 = v[s], u2 = v[2 * s], u3 = v[3 * s], u4 = v[4 * s], u5 = v[5 * s]; \
    v[0] = u0 / 4 - (u1 + u2) / 6 + (u3 + u4) / 24;                                           \
    v[s] = (u2 - u1) / 6 + (u3 - u4) / 12;                                                    \
    v[2 * s] = (u3 + u4 - u1 - u2) / 6 + u5;                                                  \
}                                                                                             \
/* end of TRANSFORMS_FR */
#elif FR == 5
#define TRANSFORMS_FR(T, SUFFIX) \
/* G g: 5 filter taps -> 6, the same points and scales as for 3 taps */                                \
inline void filter_1d##SUFFIX(T* v, const int s)                                                       \
{                                                                                                      \
    const T g0 = v[0], g1 = v[s], g2 = v[2 * s], g3 = v[3 * s], g4 = v[4 * s];                         \
    const T even = g0 + g2 + g4, odd = g1 + g3, even2 = g0 + 4 * g2 + 16 * g4, odd2 = 2 * g1 + 8 * g3; \
    v[0] = g0 / 4;                                                                                     \
    v[s] = -(even + odd) / 6;                                                                          \
    v[2 * s] = -(even - odd) / 6;                                                                      \
    v[3 * s] = (even2 + odd2) / 24;                                                                    \
    v[4 * s] = (even2 - odd2) / 24;                                                                    \
    v[5 * s] = g4;                                                                                     \
}                                                                                                      \
/* A^T m: 6 products -> 2 outputs */                                                                   \
inline void output_1d##SUFFIX(T* v, const int s)                                                       \
{                                                                                                      \
    const T m0 = v[0], m1 = v[s], m2 = v[2 * s], m3 = v[3 * s], m4 = v[4 * s], m5 = v[5 * s];          \
    v[0] = m0 + m1 + m2 + m3 + m4;                                                                     \
    v[s] = m1 - m2 + 2 * (m3 - m4) + m5;                                                               \
}                                                                                                      \
/* A e, the adjoint of output_1d: 2 output gradients -> 6 */                                           \
inline void grad_output_1d##SUFFIX(T* v, const int s)                                                  \
{                                                                                                      \
    const T e0 = v[0], e1 = v[s];                                                                      \
    v[0] = e0;                                                                                         \
    v[s] = e0 + e1;                                                                                    \
    v[2 * s] = e0 - e1;                                                                                \
    v[3 * s] = e0 + 2 * e1;                                                                            \
    v[4 * s] = e0 - 2 * e1;                                                                            \
    v[5 * s] = e1;                                                                                     \
}                                                                                                      \
/* G^T u, the adjoint of filter_1d: 6 -> 5 filter taps */                                              \
inline void grad_filter_1d##SUFFIX(T* v, const int s)                                                  \
{                                                                                                      \
    const T u0 = v[0], u1 = v[s], u2 = v[2 * s], u3 = v[3 * s], u4 = v[4 * s], u5 = v[5 * s];          \
    const T sum1 = -(u1 + u2) / 6, dif1 = (u2 - u1) / 6, sum2 = (u3 + u4) / 24, dif2 = (u3 - u4) / 24; \
    v[0] = u0 / 4 + sum1 + sum2;                                                                       \
    v[s] = dif1 + 2 * dif2;                                                                            \
    v[2 * s] = sum1 + 4 * sum2;                                                                        \
    v[3 * s] = dif1 + 8 * dif2;                                                                        \
    v[4 * s] = sum1 + 16 * sum2 + u5;                                                                  \
}                                                                                                      \
/* end of TRANSFORMS_FR */
#elif FR == 7
// F(2, 7): points 0, 1, -1, 2, -2, 1/2, -1/2, infinity; B^T's rows scaled to integers, G's by
// the inverse scales.
#define TRANSFORMS_FR(T, SUFFIX) \
/* B^T d: 8 input values -> 8 */                                                                       \
inline void input_1d##SUFFIX(T* v, const int s)                                                        \
{                                                                                                      \
    const T d0 = v[0], d1 = v[s], d2 = v[2 * s], d3 = v[3 * s], d4 = v[4 * s], d5 = v[5 * s];          \
    const T d6 = v[6 * s], d7 = v[7 * s];                                                              \
    v[0] = 4 * (d0 - d6) + 21 * (d4 - d2);                                                             \
    v[s] = 17 * (d3 + d4) - 4 * (d1 + d2 + d5 + d6);                                                   \
    v[2 * s] = 17 * (d4 - d3) + 4 * (d1 - d2 + d5 - d6);                                               \
    v[3 * s] = 2 * d1 + d2 - 10 * d3 - 5 * d4 + 8 * d5 + 4 * d6;                                       \
    v[4 * s] = d2 - 2 * d1 + 10 * d3 - 5 * d4 - 8 * d5 + 4 * d6;                                       \
    v[5 * s] = 4 * d1 + 8 * d2 - 5 * d3 - 10 * d4 + d5 + 2 * d6;                                       \
    v[6 * s] = 8 * d2 - 4 * d1 + 5 * d3 - 10 * d4 - d5 + 2 * d6;                                       \
    v[7 * s] = 4 * (d7 - d1) + 21 * (d3 - d5);                                                         \
}                                                                                                      \
/* G g: 7 filter taps -> 8 */                                                                          \
inline void filter_1d##SUFFIX(T* v, const int s)                                                       \
{                                                                                                      \
    const T g0 = v[0], g1 = v[s], g2 = v[2 * s], g3 = v[3 * s], g4 = v[4 * s], g5 = v[5 * s];          \
    const T g6 = v[6 * s];                                                                             \
    const T even = g0 + g2 + g4 + g6, odd = g1 + g3 + g5;                                              \
    const T even2 = g0 + 4 * g2 + 16 * g4 + 64 * g6, odd2 = 2 * g1 + 8 * g3 + 32 * g5;                 \
    const T even_h = 64 * g0 + 16 * g2 + 4 * g4 + g6, odd_h = 32 * g1 + 8 * g3 + 2 * g5;               \
    v[0] = g0 / 4;                                                                                     \
    v[s] = (even + odd) / 18;                                                                          \
    v[2 * s] = (even - odd) / 18;                                                                      \
    v[3 * s] = (even2 + odd2) / 360;                                                                   \
    v[4 * s] = (even2 - odd2) / 360;                                                                   \
    v[5 * s] = (even_h + odd_h) / 180;                                                                 \
    v[6 * s] = (even_h - odd_h) / 180;                                                                 \
    v[7 * s] = g6 / 4;                                                                                 \
}                                                                                                      \
/* A^T m: 8 products -> 2 outputs */                                                                   \
inline void output_1d##SUFFIX(T* v, const int s)                                                       \
{                                                                                                      \
    const T m0 = v[0], m1 = v[s], m2 = v[2 * s], m3 = v[3 * s], m4 = v[4 * s], m5 = v[5 * s];          \
    const T m6 = v[6 * s], m7 = v[7 * s];                                                              \
    v[0] = m0 + m1 + m2 + m3 + m4 + m5 + m6;                                                           \
    v[s] = m1 - m2 + 2 * (m3 - m4) + (m5 - m6) / 2 + m7;                                               \
}                                                                                                      \
/* A e, the adjoint of output_1d: 2 output gradients -> 8 */                                           \
inline void grad_output_1d##SUFFIX(T* v, const int s)                                                  \
{                                                                                                      \
    const T e0 = v[0], e1 = v[s];                                                                      \
    v[0] = e0;                                                                                         \
    v[s] = e0 + e1;                                                                                    \
    v[2 * s] = e0 - e1;                                                                                \
    v[3 * s] = e0 + 2 * e1;                                                                            \
    v[4 * s] = e0 - 2 * e1;                                                                            \
    v[5 * s] = e0 + e1 / 2;                                                                            \
    v[6 * s] = e0 - e1 / 2;                                                                            \
    v[7 * s] = e1;                                                                                     \
}                                                                                                      \
/* G^T u, the adjoint of filter_1d: 8 -> 7 filter taps */                                              \
inline void grad_filter_1d##SUFFIX(T* v, const int s)                                                  \
{                                                                                                      \
    const T u0 = v[0], u1 = v[s], u2 = v[2 * s], u3 = v[3 * s], u4 = v[4 * s], u5 = v[5 * s];          \
    const T u6 = v[6 * s], u7 = v[7 * s];                                                              \
    const T s1 = (u1 + u2) / 18, d1 = (u1 - u2) / 18, s2 = (u3 + u4) / 360, d2 = (u3 - u4) / 360;      \
    const T s3 = (u5 + u6) / 180, d3 = (u5 - u6) / 180;                                                \
    v[0] = u0 / 4 + s1 + s2 + 64 * s3;                                                                 \
    v[s] = d1 + 2 * d2 + 32 * d3;                                                                      \
    v[2 * s] = s1 + 4 * s2 + 16 * s3;                                                                  \
    v[3 * s] = d1 + 8 * d2 + 8 * d3;                                                                   \
    v[4 * s] = s1 + 16 * s2 + 4 * s3;                                                                  \
    v[5 * s] = d1 + 32 * d2 + 2 * d3;                                                                  \
    v[6 * s] = s1 + 64 * s2 + s3 + u7 / 4;                                                             \
}                                                                                                      \
/* end of TRANSFORMS_FR */
#endif
#if FR == 7
#define TRANSFORMS(T, SUFFIX) TRANSFORMS_FR(T, SUFFIX)
#else
#define TRANSFORMS(T, SUFFIX) \
/* B^T d: 6 input values -> 6 */                                                              \
inline void input_1d##SUFFIX(T* v, const int s)                                               \
{                                                                                             \
    const T d0 = v[0], d1 = v[s], d2 = v[2 * s], d3 = v[3 * s], d4 = v[4 * s], d5 = v[5 * s]; \
    v[0] = 4 * d0 - 5 * d2 + d4;                                                              \
    v[s] = -4 * (d1 + d2) + d3 + d4;                                                          \
    v[2 * s] = 4 * (d1 - d2) - d3 + d4;                                                       \
    v[3 * s] = 2 * (d3 - d1) - d2 + d4;                                                       \
    v[4 * s] = 2 * (d1 - d3) - d2 + d4;                                                       \
    v[5 * s] = 4 * d1 - 5 * d3 + d5;                                                          \
}                                                                                             \
TRANSFORMS_FR(T, SUFFIX)
#endif

TRANSFORMS(REAL, )

// First row of tile t along an axis of tiles of `tm` outputs: tiles of dilated outputs
// interleave D ways.
inline int tile_start(const int t, const int D, const int tm)
{
    return (t % D) + (t / D) * tm * D;
}

// U[t][k][ci] = (G g G^T)[t] for filter k, channel ci. 2-D range: ci, k (K filters in all,
// Ko per group). flip = 0: g = w[k][ci]. flip = 1 (grad-input): this convolution's filter k,
// channel ci, is the original filter grp * Ci + ci, channel k % Ko, rotated 180 degrees.
__kernel void winograd_filter(__global const STORE* restrict w, const IDX w_off,
                              __global REAL* restrict u, const IDX u_off,
                              const int K, const int Ko, const int Ci, const int flip)
{
    const int ci = get_global_id(0), k = get_global_id(1);
    if (ci >= Ci || k >= K) return;
    const int grp = k / Ko;
    const __global STORE* g = w + w_off + (flip ? (IDX)(grp * Ci + ci) * Ko + (k - grp * Ko) : (IDX)k * Ci + ci) * FRH * FRW;
    REAL v[TT];
    #pragma unroll
    for (int i = 0; i < FRH; ++i)
        #pragma unroll
        for (int j = 0; j < FRW; ++j)
            v[AW * i + j] = flip ? LOAD(g, FRH * FRW - 1 - FRW * i - j) : LOAD(g, FRW * i + j);
#if WINO_H
    #pragma unroll
    for (int j = 0; j < FRW; ++j) filter_1d(v + j, AW);
#endif
#if WINO_W
    #pragma unroll
    for (int i = 0; i < AH; ++i) filter_1d(v + AW * i, 1);
#endif
    const IDX step = (IDX)K * Ci;
    IDX dst = u_off + (IDX)k * Ci + ci;
    #pragma unroll
    for (int t = 0; t < TT; ++t, dst += step)
        u[dst] = v[t];
}

// V[s][t][c][l] = (B^T d B)[t] of channel c's patch under tile p = s * L + l. 2-D range:
// p over the B * TH * TW tiles of the chunk, c. Reads outside the input (padding) are zeros.
__kernel void winograd_input(__global const STORE* restrict x, const IDX x_off,
                             __global REAL* restrict out, const IDX out_off,
                             const int B, const int C, const int H, const int W,
                             const int TH, const int TW, const int TH0, const int PT, const int PL,
                             const int DH, const int DW, const int L)
{
    const int p = get_global_id(0), c = get_global_id(1);
    const int P = B * TH * TW;
    if (p >= P || c >= C) return;
    const int b = p / (TH * TW), t = p - b * TH * TW, th = t / TW;
    const int y0 = tile_start(TH0 + th, DH, TMH) - PT, x0 = tile_start(t - th * TW, DW, TMW) - PL;
    const __global STORE* src = x + x_off + ((IDX)b * C + c) * H * W;
    REAL v[TT];
    #pragma unroll
    for (int i = 0; i < AH; ++i) {
        const int y = y0 + i * DH;
        const bool row_in = y >= 0 && y < H;
        #pragma unroll
        for (int j = 0; j < AW; ++j) {
            const int xx = x0 + j * DW;
            v[AW * i + j] = (row_in && xx >= 0 && xx < W) ? LOAD(src, y * W + xx) : (REAL)0;
        }
    }
#if WINO_H
    #pragma unroll
    for (int j = 0; j < AW; ++j) input_1d(v + j, AW);
#endif
#if WINO_W
    #pragma unroll
    for (int i = 0; i < AH; ++i) input_1d(v + AW * i, 1);
#endif
    const int s = p / L;
    const IDX step = (IDX)C * L;
    IDX dst = out_off + ((IDX)s * TT * C + c) * L + p - s * L;
    #pragma unroll
    for (int q = 0; q < TT; ++q, dst += step)
        out[dst] = v[q];
}

// Output tile p of channel k = A^T M[.][k][p] A (+ bias), written where it lies inside the
// (B, K, OH, OW) output. 2-D range: p, k.
__kernel void winograd_output(__global const REAL* restrict m, const IDX m_off,
                              __global STORE* restrict y, const IDX y_off,
                              __global const STORE* restrict bias, const IDX bias_off, const int flags,
                              const int B, const int K, const int OH, const int OW,
                              const int TH, const int TW, const int TH0, const int DH, const int DW)
{
    const int p = get_global_id(0), k = get_global_id(1);
    const int P = B * TH * TW;
    if (p >= P || k >= K) return;
    const IDX step = (IDX)K * P;
    IDX src = m_off + (IDX)k * P + p;
    REAL v[TT];
    #pragma unroll
    for (int q = 0; q < TT; ++q, src += step)
        v[q] = m[src];
#if WINO_H
    #pragma unroll
    for (int j = 0; j < AW; ++j) output_1d(v + j, AW);
#endif
#if WINO_W
    #pragma unroll
    for (int i = 0; i < TMH; ++i) output_1d(v + AW * i, 1);
#endif
    const REAL b0 = (flags & EPI_BIAS) ? LOAD(bias, bias_off + k) : (REAL)0;
    const int b = p / (TH * TW), t = p - b * TH * TW, th = t / TW;
    const int oy0 = tile_start(TH0 + th, DH, TMH), ox0 = tile_start(t - th * TW, DW, TMW);
    __global STORE* dst = y + y_off + ((IDX)b * K + k) * OH * OW;
    #pragma unroll
    for (int i = 0; i < TMH; ++i) {
        const int oy = oy0 + i * DH;
        if (oy >= OH) break;
        #pragma unroll
        for (int j = 0; j < TMW; ++j) {
            const int ox = ox0 + j * DW;
            if (ox < OW) SAVE(dst, oy * OW + ox, EPILOGUE(flags, v[AW * i + j] + b0));
        }
    }
}

// Z[s][t][k][l] = (A E A^T)[t], E the TMH x TMW tile p = s * L + l of grad_output channel k
// (zeros past the output's edge): the gradient of M in the forward's terms. 2-D range: p, k.
__kernel void winograd_grad_output(__global const STORE* restrict dy, const IDX dy_off,
                                   __global REAL* restrict z, const IDX z_off,
                                   const int B, const int K, const int OH, const int OW,
                                   const int TH, const int TW, const int TH0, const int DH, const int DW, const int L)
{
    const int p = get_global_id(0), k = get_global_id(1);
    const int P = B * TH * TW;
    if (p >= P || k >= K) return;
    const int b = p / (TH * TW), t = p - b * TH * TW, th = t / TW;
    const int oy0 = tile_start(TH0 + th, DH, TMH), ox0 = tile_start(t - th * TW, DW, TMW);
    const __global STORE* src = dy + dy_off + ((IDX)b * K + k) * OH * OW;
    REAL v[TT];
    #pragma unroll
    for (int i = 0; i < TMH; ++i) {
        const int oy = oy0 + i * DH;
        #pragma unroll
        for (int j = 0; j < TMW; ++j) {
            const int ox = ox0 + j * DW;
            v[AW * i + j] = (oy < OH && ox < OW) ? LOAD(src, oy * OW + ox) : (REAL)0;
        }
    }
#if WINO_H
    #pragma unroll
    for (int j = 0; j < TMW; ++j) grad_output_1d(v + j, AW);
#endif
#if WINO_W
    #pragma unroll
    for (int i = 0; i < AH; ++i) grad_output_1d(v + AW * i, 1);
#endif
    const int s = p / L;
    const IDX step = (IDX)K * L;
    IDX dst = z_off + ((IDX)s * TT * K + k) * L + p - s * L;
    #pragma unroll
    for (int q = 0; q < TT; ++q, dst += step)
        z[dst] = v[q];
}

// grad_weight[k][ci] = G^T dU[.][k][ci] G: the TT summed products back to FRH x FRW taps
// (overwrites grad_weight). 2-D range: ci, k.
__kernel void winograd_grad_filter(__global const REAL* restrict du, const IDX du_off,
                                   __global STORE* restrict dw, const IDX dw_off,
                                   const int K, const int Ci)
{
    const int ci = get_global_id(0), k = get_global_id(1);
    if (ci >= Ci || k >= K) return;
    const IDX step = (IDX)K * Ci;
    IDX src = du_off + (IDX)k * Ci + ci;
    REAL v[TT];
    #pragma unroll
    for (int q = 0; q < TT; ++q, src += step)
        v[q] = du[src];
#if WINO_H
    #pragma unroll
    for (int j = 0; j < AW; ++j) grad_filter_1d(v + j, AW);
#endif
#if WINO_W
    #pragma unroll
    for (int i = 0; i < FRH; ++i) grad_filter_1d(v + AW * i, 1);
#endif
    __global STORE* g = dw + dw_off + ((IDX)k * Ci + ci) * FRH * FRW;
    #pragma unroll
    for (int i = 0; i < FRH; ++i)
        #pragma unroll
        for (int j = 0; j < FRW; ++j)
            SAVE(g, FRW * i + j, v[AW * i + j]);
}

// ---- CPU devices ----------------------------------------------------------------------
// CPU runtimes vectorise a work-item only as far as it is written with vectors (PoCL 3.0
// keeps the kernels above scalar: its cost model finds their gathers too dear). These do
// the same transforms on VW consecutive tiles at once (across tile rows and images where
// they must), one tile per vector lane, work-groups of one work-item: buffers and results
// exactly as above. A 7x1's tiles lie one per output column, so VW of them in one tile row
// load as one run of a row: the host takes these for it on every CPU.
#ifndef VW             // tiles per vector: 4 or 8
#define VW 8
#endif
typedef union { REALV v; REAL s[VW]; } lanes;   // a vector and its values
TRANSFORMS(REALV, _v)

// The TT transformed values of tiles p0 .. p0 + n - 1 (n >= VW: VW of them) of channel c,
// one per lane of v, into out[s][t][c][l] (p = s * L + l) with `channels` channels: each
// value's VW tiles consecutive where they lie in one slice.
inline void store_tiles(REALV v[TT], __global REAL* restrict out, const int p0, const int n, const int channels,
                        const int c, const int L)
{
    const IDX step = (IDX)channels * L;
    const int s0 = p0 / L;
    if (n >= VW && (p0 + VW - 1) / L == s0) {
        __global REAL* dst = out + ((IDX)s0 * TT * channels + c) * L + p0 - s0 * L;
        #pragma unroll
        for (int t = 0; t < TT; ++t) {
            lanes u;
            u.v = v[t];
            #pragma unroll
            for (int q = 0; q < VW; ++q) dst[t * step + q] = u.s[q];
        }
        return;
    }
    for (int q = 0; q < VW && q < n; ++q) {
        const int p = p0 + q, s = p / L;
        __global REAL* dst = out + ((IDX)s * TT * channels + c) * L + p - s * L;
        #pragma unroll
        for (int t = 0; t < TT; ++t) {
            lanes u;
            u.v = v[t];
            dst[t * step] = u.s[q];
        }
    }
}

// v[t] = src[t * step + q] for the VW lanes q, zero from lane n on: VW consecutive
// values of each of TT planes `step` apart, one vector each where n >= VW (value by value, each
// tested, they made the output transform slower on PoCL).
inline void load_planes(REALV v[TT], const __global REAL* restrict src, const IDX step, const int n)
{
    if (n >= VW) {
        #pragma unroll
        for (int t = 0; t < TT; ++t) {
            const __global REAL* p = src + t * step;
#if VW == 8
            v[t] = (REALV)(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
#elif VW == 4
            v[t] = (REALV)(p[0], p[1], p[2], p[3]);
#else
#error "VW (tiles per vector) must be 4 or 8"
#endif
        }
        return;
    }
    #pragma unroll
    for (int t = 0; t < TT; ++t) {
        lanes u;
        #pragma unroll
        for (int q = 0; q < VW; ++q) u.s[q] = q < n ? src[t * step + q] : (REAL)0;
        v[t] = u.v;
    }
}

// The value at row y, column x of an H x W plane, or zero outside it: the load clamped to the
// plane and always made, so that the compiler selects rather than branches. Clamped by
// comparisons: PoCL 3.0 calls its clamp() builtin as a function, a call per value.
inline REAL value_or_zero(const __global STORE* restrict plane, const int y, const int x, const int H, const int W)
{
    const REAL v = LOAD(plane, (IDX)(y < 0 ? 0 : y < H ? y : H - 1) * W + (x < 0 ? 0 : x < W ? x : W - 1));
    return y >= 0 && y < H && x >= 0 && x < W ? v : (REAL)0;
}

// Whether the VW tiles from tile p0 of the chunk (P tiles, TW per tile row; r0: p0's place among
// its image's) are whole and side by side in one tile row, undilated along it: lane q's tile then
// starts TMW * q columns after lane 0's.
#define ONE_TILE_ROW(p0, r0, P, TW, DW) ((DW) == 1 && (p0) + VW <= (P) && (r0) % (TW) + VW <= (TW))

// dst[j] (j < COUNT) = the lanes' j-th values along row y of an H x W plane, lane q's from column
// x0 + TMW * q on (zeros outside the plane), for VW tiles side by side in a tile row: the row's
// TMW * (VW - 1) + COUNT values loaded once, in order, not VW * COUNT gathered lane by lane
// (measured faster on PoCL for the input and grad_output transforms).
#define ROW_LANES(dst, plane, y, x0, H, W, COUNT)                                               \
    {                                                                                           \
        REAL r_[TMW * (VW - 1) + (COUNT)];                                                      \
        if ((y) >= 0 && (y) < (H) && (x0) >= 0 && (x0) + TMW * (VW - 1) + (COUNT) <= (W)) {     \
            _Pragma("unroll") for (int u = 0; u < TMW * (VW - 1) + (COUNT); ++u)                \
                r_[u] = LOAD(plane, (IDX)(y) * (W) + (x0) + u);                                   \
        } else {                                                                                \
            _Pragma("unroll") for (int u = 0; u < TMW * (VW - 1) + (COUNT); ++u)                \
                r_[u] = value_or_zero(plane, y, (x0) + u, H, W);                                \
        }                                                                                       \
        _Pragma("unroll") for (int j = 0; j < (COUNT); ++j) {                                   \
            lanes t_;                                                                           \
            _Pragma("unroll") for (int q = 0; q < VW; ++q) t_.s[q] = r_[TMW * q + j];           \
            (dst)[j] = t_.v;                                                                    \
        }                                                                                       \
    }

// Each lane's tile of VW consecutive tiles p0 .. p0 + VW - 1 of the chunk (across tile rows and
// images; past P: tile P - 1 again): its first output row and column, and where its image starts.
#define LANE_TILES(TH, TW, P, channels, plane_size)                                              \
    int ys[VW], xs[VW];                                                                          \
    IDX img[VW];                                                                                 \
    _Pragma("unroll") for (int q = 0; q < VW; ++q) {                                             \
        const int p = p0 + q < P ? p0 + q : P - 1, b = p / ((TH) * (TW)), r = p - b * (TH) * (TW); \
        const int th = r / (TW);                                                                 \
        ys[q] = tile_start(TH0 + th, DH, TMH);                                                   \
        xs[q] = tile_start(r - th * (TW), DW, TMW);                                              \
        img[q] = (IDX)b * (channels) * (plane_size);                                             \
    }

// winograd_input's V for tiles p0 .. p0 + VW - 1 of the chunk, work-item (p0 / VW, c).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void winograd_input_rows(__global const STORE* restrict x, const IDX x_off,
                         __global REAL* restrict out, const IDX out_off,
                         const int B, const int C, const int H, const int W,
                         const int TH, const int TW, const int TH0, const int PT, const int PL,
                         const int DH, const int DW, const int L)
{
    const int p0 = get_global_id(0) * VW, c = get_global_id(1), P = B * TH * TW, r0 = p0 % (TH * TW);
    const __global STORE* src = x + x_off + (IDX)c * H * W;
    REALV v[TT];
    if (ONE_TILE_ROW(p0, r0, P, TW, DW)) {
        const __global STORE* plane = src + (IDX)(p0 / (TH * TW)) * C * H * W;
        const int th = r0 / TW, y0 = tile_start(TH0 + th, DH, TMH) - PT, x0 = TMW * (r0 - th * TW) - PL;
        #pragma unroll
        for (int i = 0; i < AH; ++i) ROW_LANES(v + AW * i, plane, y0 + i * DH, x0, H, W, AW)
    } else {
        LANE_TILES(TH, TW, P, C, H * W)
        bool inside = DH == 1 && DW == 1;   // every lane's patch inside the image: no bounds to test
        #pragma unroll
        for (int q = 0; q < VW; ++q) {
            ys[q] -= PT;
            xs[q] -= PL;
            inside = inside && ys[q] >= 0 && ys[q] + AH - 1 < H && xs[q] >= 0 && xs[q] + AW - 1 < W;
        }
#define PATCH(VALUE)                                                                             \
    _Pragma("unroll") for (int i = 0; i < AH; ++i)                                               \
        _Pragma("unroll") for (int j = 0; j < AW; ++j) {                                         \
            lanes t;                                                                             \
            _Pragma("unroll") for (int q = 0; q < VW; ++q) t.s[q] = VALUE;                        \
            v[AW * i + j] = t.v;                                                                 \
        }
        if (inside) {
            PATCH(LOAD(src, img[q] + (IDX)(ys[q] + i) * W + xs[q] + j))
        } else {   // zeros outside the image (loads clamped to it)
            PATCH(value_or_zero(src + img[q], ys[q] + i * DH, xs[q] + j * DW, H, W))
        }
#undef PATCH
    }
#if WINO_H
    #pragma unroll
    for (int j = 0; j < AW; ++j) input_1d_v(v + j, AW);
#endif
#if WINO_W
    #pragma unroll
    for (int i = 0; i < AH; ++i) input_1d_v(v + AW * i, 1);
#endif
    store_tiles(v, out + out_off, p0, P - p0, C, c, L);
}

// winograd_output's tiles p0 .. p0 + VW - 1 of the chunk, work-item (p0 / VW, k).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void winograd_output_rows(__global const REAL* restrict m, const IDX m_off,
                          __global STORE* restrict y, const IDX y_off,
                          __global const STORE* restrict bias, const IDX bias_off, const int flags,
                          const int B, const int K, const int OH, const int OW,
                          const int TH, const int TW, const int TH0, const int DH, const int DW)
{
    const int p0 = get_global_id(0) * VW, k = get_global_id(1), P = B * TH * TW;
    const REAL b0 = (flags & EPI_BIAS) ? LOAD(bias, bias_off + k) : (REAL)0;
    __global STORE* dst = y + y_off + (IDX)k * OH * OW;
    LANE_TILES(TH, TW, P, K, OH * OW)
    REALV v[TT];
    load_planes(v, m + m_off + (IDX)k * P + p0, (IDX)K * P, P - p0);
#if WINO_H
    #pragma unroll
    for (int j = 0; j < AW; ++j) output_1d_v(v + j, AW);
#endif
#if WINO_W
    #pragma unroll
    for (int i = 0; i < TMH; ++i) output_1d_v(v + AW * i, 1);
#endif
    // the lanes' tiles side by side in one tile row, inside the output: TMW * VW consecutive outputs
    const bool run = ONE_TILE_ROW(p0, p0 % (TH * TW), P, TW, DW) && xs[VW - 1] + TMW <= OW;
    #pragma unroll
    for (int i = 0; i < TMH; ++i) {
        lanes t[TMW];
        #pragma unroll
        for (int j = 0; j < TMW; ++j) t[j].v = v[AW * i + j];
        if (run) {
            if (ys[0] + i * DH >= OH) break;
            __global STORE* row = dst + img[0] + (IDX)(ys[0] + i * DH) * OW + xs[0];
            #pragma unroll
            for (int q = 0; q < VW; ++q)
                #pragma unroll
                for (int j = 0; j < TMW; ++j) SAVE(row, TMW * q + j, EPILOGUE(flags, t[j].s[q] + b0));
            continue;
        }
        #pragma unroll
        for (int q = 0; q < VW; ++q) {
            const int oy = ys[q] + i * DH;
            if (p0 + q >= P || oy >= OH) continue;
            __global STORE* row = dst + img[q] + (IDX)oy * OW;
            if (DW == 1 && xs[q] + TMW <= OW) {   // the tile's TMW outputs inside the row
                #pragma unroll
                for (int j = 0; j < TMW; ++j) SAVE(row, xs[q] + j, EPILOGUE(flags, t[j].s[q] + b0));
            } else {
                #pragma unroll
                for (int j = 0; j < TMW; ++j) {
                    const int ox = xs[q] + j * DW;
                    if (ox < OW) SAVE(row, ox, EPILOGUE(flags, t[j].s[q] + b0));
                }
            }
        }
    }
}

// winograd_grad_output's Z for tiles p0 .. p0 + VW - 1 of the chunk, work-item (p0 / VW, k).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void winograd_grad_output_rows(__global const STORE* restrict dy, const IDX dy_off,
                               __global REAL* restrict z, const IDX z_off,
                               const int B, const int K, const int OH, const int OW,
                               const int TH, const int TW, const int TH0, const int DH, const int DW, const int L)
{
    const int p0 = get_global_id(0) * VW, k = get_global_id(1), P = B * TH * TW, r0 = p0 % (TH * TW);
    const __global STORE* src = dy + dy_off + (IDX)k * OH * OW;
    REALV v[TT];
    if (ONE_TILE_ROW(p0, r0, P, TW, DW)) {
        const __global STORE* plane = src + (IDX)(p0 / (TH * TW)) * K * OH * OW;
        const int th = r0 / TW, y0 = tile_start(TH0 + th, DH, TMH), x0 = TMW * (r0 - th * TW);
        #pragma unroll
        for (int i = 0; i < TMH; ++i) ROW_LANES(v + AW * i, plane, y0 + i * DH, x0, OH, OW, TMW)
    } else {
        LANE_TILES(TH, TW, P, K, OH * OW)
        #pragma unroll
        for (int i = 0; i < TMH; ++i)
            #pragma unroll
            for (int j = 0; j < TMW; ++j) {
                lanes t;
                #pragma unroll
                for (int q = 0; q < VW; ++q)
                    t.s[q] = value_or_zero(src + img[q], ys[q] + i * DH, xs[q] + j * DW, OH, OW);
                v[AW * i + j] = t.v;
            }
    }
#if WINO_H
    #pragma unroll
    for (int j = 0; j < TMW; ++j) grad_output_1d_v(v + j, AW);
#endif
#if WINO_W
    #pragma unroll
    for (int i = 0; i < AH; ++i) grad_output_1d_v(v + AW * i, 1);
#endif
    store_tiles(v, z + z_off, p0, P - p0, K, k, L);
}

// winograd_filter's U for filter k and VW channels at a time, work-item k.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void winograd_filter_rows(__global const STORE* restrict w, const IDX w_off,
                          __global REAL* restrict u, const IDX u_off,
                          const int K, const int Ko, const int Ci, const int flip)
{
    const int k = get_global_id(0), grp = k / Ko;
    const IDX step = (IDX)K * Ci;
    for (int ci0 = 0; ci0 < Ci; ci0 += VW) {
        REALV v[TT];
        #pragma unroll
        for (int i = 0; i < FRH; ++i)
            #pragma unroll
            for (int j = 0; j < FRW; ++j) {
                lanes t;
                #pragma unroll
                for (int q = 0; q < VW; ++q) {
                    const int ci = ci0 + q < Ci ? ci0 + q : Ci - 1;
                    const __global STORE* g = w + w_off + (flip ? (IDX)(grp * Ci + ci) * Ko + (k - grp * Ko)
                                                               : (IDX)k * Ci + ci) * FRH * FRW;
                    t.s[q] = flip ? LOAD(g, FRH * FRW - 1 - FRW * i - j) : LOAD(g, FRW * i + j);
                }
                v[AW * i + j] = t.v;
            }
#if WINO_H
        #pragma unroll
        for (int j = 0; j < FRW; ++j) filter_1d_v(v + j, AW);
#endif
#if WINO_W
        #pragma unroll
        for (int i = 0; i < AH; ++i) filter_1d_v(v + AW * i, 1);
#endif
        __global REAL* dst = u + u_off + (IDX)k * Ci + ci0;
        #pragma unroll
        for (int t = 0; t < TT; ++t) {
            lanes l;
            l.v = v[t];
            for (int q = 0; q < VW && ci0 + q < Ci; ++q) dst[t * step + q] = l.s[q];
        }
    }
}

// winograd_grad_filter's grad_weight for filter k and VW channels at a time, work-item k.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void winograd_grad_filter_rows(__global const REAL* restrict du, const IDX du_off,
                               __global STORE* restrict dw, const IDX dw_off,
                               const int K, const int Ci)
{
    const int k = get_global_id(0);
    const IDX step = (IDX)K * Ci;
    for (int ci0 = 0; ci0 < Ci; ci0 += VW) {
        REALV v[TT];
        load_planes(v, du + du_off + (IDX)k * Ci + ci0, step, Ci - ci0);
#if WINO_H
        #pragma unroll
        for (int j = 0; j < AW; ++j) grad_filter_1d_v(v + j, AW);
#endif
#if WINO_W
        #pragma unroll
        for (int i = 0; i < FRH; ++i) grad_filter_1d_v(v + AW * i, 1);
#endif
        #pragma unroll
        for (int i = 0; i < FRH; ++i)
            #pragma unroll
            for (int j = 0; j < FRW; ++j) {
                lanes t;
                t.v = v[AW * i + j];
                for (int q = 0; q < VW && ci0 + q < Ci; ++q)
                    SAVE(dw, dw_off + ((IDX)k * Ci + ci0 + q) * FRH * FRW + FRW * i + j, t.s[q]);
            }
    }
}
