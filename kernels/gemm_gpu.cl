// GEMM of our own over a 2-D grid of matrices, row-major:
//   C[i, j] = alpha * op(A[i, j]) @ op(B[i, j]) + beta * C[i, j],  i < GI, j < GJ,
// op(A) M x K, op(B) K x N; matrix (i, j) of an operand starts at off + i * si + j * sj.
// With KB > 1 each product is a sum of KB such products, the q-th of A and B q * sq values
// after the first (a sum over images whose positions are not one stride apart). With K_FOLD
// instead, one product's K runs on through such blocks of K_FOLD values each, with no
// padding at their edges (blocks shorter than the slices: 5x5 and 7x7 maps).
// One launch covers the whole grid (e.g. groups x images), with no padded copies: tile
// loads past an edge read zeros and stores past an edge are skipped. The work-groups form
// one row (dimension 0 has the largest range on every device).
//
// A work-group computes a TM x TN tile of one C; its (TN/RN) x (TM/RM) work-items (per plane,
// below) each accumulate RM x RN values (RM, RN: 4 or 8), as 4x4 quadrants TM/2 rows and TN/2
// columns apart where they are 8 (so the local-memory reads of neighbouring work-items are
// neighbouring vectors). 8x8 reuses each staged value most; 4x4 gives a small tile four
// times the work-items, which a device needs to hide its memory latency where a grid has
// few work-groups. TK-deep slices of A and B pass through local memory, double buffered:
// the next slice's global loads are in flight while the current one is multiplied. Where
// the host finds an operand's offsets and leading dimension multiples of 4 (VA, VB = 4),
// its global reads are four-wide vectors along its stored rows (measured much faster on GPUs
// for large products).
//
// With KS > 1 the work-group has KS such planes of work-items along its third dimension: they
// stage each slice together and each multiplies a TK/KS-deep part of it, their sums added in
// local memory at the end. A product of few tiles and a long K then runs 1/KS of the slices one
// after another, in one launch (no partial results in global memory).
//
// With MMA, the products run on NVIDIA's matrix units (mma.sync through inline PTX, compute
// capability 8.0 on; the host checks with a probe): the slices are staged as above, then each
// warp of 32 work-items multiplies a WTM x WTN block of the tile as 16 x 8 fragments, 8 deep,
// its operands rounded to TF32, FP16 or BF16 as they are read from local memory, its sums
// in float. Where RM x RN values per work-item make 64 the warps' blocks are 64 x 32, else 32 x
// (RM * RN); PAD 8 (TF32) or 4 (two-value FP16 and BF16 reads) keeps a warp's fragment reads on
// 32 different banks.
//
// With A_HALF, B_HALF or C_HALF an operand is stored as half (a float16 array, no float copy of
// it): its values become float as they are read from global memory and are rounded to half as
// they are written; staging and sums are in float as for float32 arrays.
//
// Specialised by the host with prepended #defines; the defaults below are for reading.
#ifndef TM             // rows of C per work-group: a multiple of RM (see the checks below)
#define TM 128
#endif
#ifndef TN             // columns of C per work-group: a multiple of RN
#define TN 128
#endif
#ifndef TK             // depth of the slices staged in local memory
#define TK 8
#endif
#ifndef RM             // rows of C per work-item: 4 or 8
#define RM 8
#endif
#ifndef RN             // columns of C per work-item: 4 or 8
#define RN 8
#endif
#ifndef KS             // planes of work-items splitting each slice's depth (1: none)
#define KS 1
#endif
#ifndef A_TRANSP       // 1: A is stored K x M (op(A) = A^T)
#define A_TRANSP 0
#endif
#ifndef B_TRANSP       // 1: B is stored N x K
#define B_TRANSP 0
#endif
#ifndef VA             // A values per global read: 1, or 4 (offsets and lda multiples of 4)
#define VA 1
#endif
#ifndef VB             // the same for B
#define VB 1
#endif
#ifndef VC             // C values per global write: 1, or 4 (offsets, ldc and a fold multiples of 4)
#define VC 1
#endif
#ifndef IM2COL         // 1: B is the im2col matrix of an NCHW input, read in place (IM_* below)
#define IM2COL 0
#endif
#ifndef K_FOLD         // > 0: depth k of A and B is k % K_FOLD into block k / K_FOLD, blocks a_kb and
#define K_FOLD 0       // b_kb values apart (KB = 1)
#endif
#ifndef C_FOLD         // > 0: C's columns run over several images, C_FOLD positions each: column n is
#define C_FOLD 0       // position n % C_FOLD of image n / C_FOLD, whose rows start c_sj values apart
#endif                 // (an NCHW output written in place; the grid has one matrix along j)
#ifndef B_FOLD         // > 0: the same for B (stored K x N): column n is position n % B_FOLD of image
#define B_FOLD 0       // n / B_FOLD, whose rows start b_sj values apart (an NCHW operand read in place)
#endif
#ifndef A_FOLD         // > 0: A (stored M x K) read in place over images along K: the grid's products along j
#define A_FOLD 0       // are split-K slices of one depth, product j's depth k being d = j * K + k, position
#endif                 // d % A_FOLD of image d / A_FOLD, whose rows start a_sj values apart

#ifndef A_HALF         // 1: A stored as half (a float16 array), each value made float as it is read
#define A_HALF 0
#endif
#ifndef B_HALF         // the same for B (for an im2col B, the input)
#define B_HALF 0
#endif
#ifndef C_HALF         // 1: C stored as half, each value rounded to nearest even as it is written
#define C_HALF 0
#endif

#ifndef MMA            // 0: float or double FMAs; 1: TF32, 2: FP16, 3: BF16 products on the matrix units
#define MMA 0
#endif
#ifndef MMA_EMULATED   // 1: the matrix units emulated (the tests' stand-in, below)
#define MMA_EMULATED 0
#endif

#define WX (TN / RN)                // work-items along N
#define WY (TM / RM)                // work-items along M
#define WXY (WX * WY)               // work-items of one plane
#define WG (WXY * KS)
#define A_PER (TM * TK / WG / VA)   // A reads each work-item makes per slice
#define B_PER (TN * TK / WG / VB)
#if VA == 4
#define AV REAL4
#else
#define AV REAL
#endif
#if VB == 4
#define BV REAL4
#else
#define BV REAL
#endif
#ifndef PAD                         // keeps the transposing local stores off one bank, rows 16-byte aligned
#define PAD 4
#endif
#if (RM != 4 && RM != 8) || (RN != 4 && RN != 8) || TM % RM || TN % RN
#error "RM and RN are 4 or 8, TM and TN multiples of them"
#endif
#if (TM * TK) % (WG * VA) || (TN * TK) % (WG * VB) || TK % 4
#error "each work-item must stage whole reads of a slice: WG * VA dividing TM * TK, WG * VB dividing TN * TK"
#endif
#if TK % KS || (KS > 1 && WXY * RM * RN > 2 * TK * (TM + PAD))
#error "KS divides TK, and one plane's sums fit where A's slices were staged"
#endif
#if MMA
#define WTM (RM * RN == 64 ? 64 : 32)   // rows of C per warp
#define WTN (32 * RM * RN / WTM)        // columns of C per warp
#define MI (WTM / 16)                   // 16 x 8 fragments per warp: MI x NI
#define NI (WTN / 8)
#if TM % WTM || TN % WTN || (TM / WTM) * (TN / WTN) * 32 != WXY || (TK / KS) % 8
#error "the warps' blocks tile TM x TN, and each plane's part of a slice is whole 8-deep steps"
#endif
#endif
#if (VA != 1 && VA != 4) || (VB != 1 && VB != 4) || (VC != 1 && VC != 4) || (IM2COL && VB != 1)
#error "VA, VB and VC are 1 or 4; an im2col B is read one value at a time"
#endif
#if C_FOLD && C_FOLD % 4 && VC != 1
#error "a folded C is written four-wide only where its images' rows are whole vectors"
#endif
#if K_FOLD && (IM2COL || (K_FOLD % 4 && (VA != 1 || VB != 1)))
#error "a folded K is not read through im2col, and four-wide only where its blocks are whole vectors"
#endif
#if B_FOLD && (K_FOLD || IM2COL || B_TRANSP || (B_FOLD % 4 && VB != 1))
#error "a folded B is stored K x N, read in place, four-wide only where its images' rows are whole vectors"
#endif
#if A_FOLD && (K_FOLD || B_FOLD || C_FOLD || A_TRANSP || (A_FOLD % 4 && VA != 1))
#error "a folded A is stored M x K, read in place, four-wide only where its images' rows are whole vectors"
#endif

// Read e (< TM*TK/VA) of an A slice starts at (A_M(e), A_K(e)), in the order that keeps
// global reads contiguous: along k when A is stored M x K, along m when stored K x M.
#if A_TRANSP
#define A_M(e) ((e) * VA % TM)
#define A_K(e) ((e) * VA / TM)
#define A_AT_OFF(m, k) ((IDX)(k) * lda + (m))
#else
#define A_M(e) ((e) / (TK / VA))
#define A_K(e) ((e) % (TK / VA) * VA)
#define A_AT_OFF(m, k) ((IDX)(m) * lda + (k))
#endif
#if B_TRANSP
#define B_N(e) ((e) / (TK / VB))
#define B_K(e) ((e) % (TK / VB) * VB)
#define B_AT_OFF(k, n) ((IDX)(n) * ldb + (k))
#else
#define B_N(e) ((e) * VB % TN)
#define B_K(e) ((e) * VB / TN)
#define B_AT_OFF(k, n) ((IDX)(k) * ldb + (n))
#endif

#if K_FOLD
#define A_AT(m, k) ((IDX)((k) / K_FOLD) * a_kb + A_AT_OFF(m, (k) % K_FOLD))
#define B_AT(k, n) ((IDX)((k) / K_FOLD) * b_kb + B_AT_OFF((k) % K_FOLD, n))
#elif B_FOLD
#define A_AT(m, k) A_AT_OFF(m, k)
#define B_AT(k, n) ((IDX)((n) / B_FOLD) * b_sj + B_AT_OFF(k, (n) % B_FOLD))
#elif A_FOLD
#define A_AT(m, k) ((IDX)((j * K + (k)) / A_FOLD) * a_sj + A_AT_OFF(m, (j * K + (k)) % A_FOLD))
#define B_AT(k, n) B_AT_OFF(k, n)
#else
#define A_AT(m, k) A_AT_OFF(m, k)
#define B_AT(k, n) B_AT_OFF(k, n)
#endif

// Local stores of one read: a vector lying along the tile's rows is stored whole;
// one lying along k is spread over 4 rows, `row` values apart.
#define STORE_DOWN(p, v, row) ((p)[0] = (v).s0, (p)[row] = (v).s1, (p)[2 * (row)] = (v).s2, (p)[3 * (row)] = (v).s3)
#if VA == 1
#define STORE_A(p, v) (*(p) = (v))
#elif A_TRANSP
#define STORE_A(p, v) (*(__local REAL4*)(p) = (v))
#else
#define STORE_A(p, v) STORE_DOWN(p, v, TM + PAD)
#endif
#if VB == 1
#define STORE_B(p, v) (*(p) = (v))
#elif B_TRANSP
#define STORE_B(p, v) STORE_DOWN(p, v, TN + PAD)
#else
#define STORE_B(p, v) (*(__local REAL4*)(p) = (v))
#endif

// Each operand's element type in memory, and its reads as REAL: one value at element i of p,
// four from p on (vload_half and vload_half4 need no cl_khr_fp16)
#define HALF_AT(p, i) vload_half((i), (p))
#define HALF4_AT(p) vload_half4(0, (p))
#define REAL_AT(p, i) ((p)[i])
#define REAL4_AT(p) (*(__global const REAL4*)(p))
#if A_HALF
#define A_T half
#define A_AT1 HALF_AT
#define A_AT4 HALF4_AT
#else
#define A_T REAL
#define A_AT1 REAL_AT
#define A_AT4 REAL4_AT
#endif
#if B_HALF
#define B_T half
#define B_AT1 HALF_AT
#define B_AT4 HALF4_AT
#else
#define B_T REAL
#define B_AT1 REAL_AT
#define B_AT4 REAL4_AT
#endif
#if C_HALF
#define C_T half
#define C_LOAD HALF_AT
#define C_LOAD4 HALF4_AT
#define C_SAVE(p, i, v) vstore_half_rte((v), (i), (p))
#define C_SAVE4(p, v) vstore_half4_rte((v), 0, (p))
#else
#define C_T REAL
#define C_LOAD REAL_AT
#define C_LOAD4 REAL4_AT
#define C_SAVE(p, i, v) ((p)[i] = (v))
#define C_SAVE4(p, v) (*(__global REAL4*)(p) = (v))
#endif

// Global reads of one part of a slice, zero past the edges. A four-wide part starts at a
// multiple of 4 elements (the host checks offsets and leading dimensions) and lies along
// the stored rows, where the edge may cut it.
// (One branch, on rest, for every edge: PoCL's optimiser, given an outer bounds test around
// this call instead, read the row past the last one, seen with NaNs stored there.)
#define READ4(name, T, AT1, AT4)                                                                 \
inline REAL4 name(__global const T* p, const int rest)   /* rest: how many of the 4 exist */    \
{                                                                                               \
    if (rest >= 4)                                                                              \
        return AT4(p);                                                                          \
    return (REAL4)(rest > 0 ? AT1(p, 0) : 0, rest > 1 ? AT1(p, 1) : 0, rest > 2 ? AT1(p, 2) : 0, 0); \
}
#if VA == 4
READ4(read4_a, A_T, A_AT1, A_AT4)
#endif
#if VB == 4
READ4(read4_b, B_T, B_AT1, B_AT4)
#endif
#if VA == 1
#define A_READ(m, k) ((m) < M && (k) < K ? A_AT1(ap, A_AT(m, k)) : (REAL)0)
#elif A_TRANSP
#define A_READ(m, k) read4_a(ap + A_AT(m, k), (k) < K ? M - (m) : 0)
#else
#define A_READ(m, k) read4_a(ap + A_AT(m, k), (m) < M ? K - (k) : 0)
#endif
#if IM2COL
// Implicit im2col: B's row r = (channel, ky, kx) and column p = (image, oy, ox) of the
// im2col matrix (kernels/im2col.cl's layout) are read from the input itself, zero in the
// padding; column p of matrix (i, j) counts from j * IM_PJ, for split-K slices. The host
// defines the geometry: input IM_H x IM_W, images IM_XS values apart, output positions
// IM_P per image in rows of IM_OW, taps IM_KH x IM_KW, strides IM_SY, IM_SX, paddings
// IM_PT, IM_PL, dilations IM_DY, IM_DX.
inline REAL im2col_at(__global const B_T* x, const int r, const int p)
{
    const int c = r / (IM_KH * IM_KW), ky = r / IM_KW % IM_KH, kx = r % IM_KW;
    const int img = p / IM_P, oy = p % IM_P / IM_OW, ox = p % IM_OW;
    const int iy = oy * IM_SY - IM_PT + ky * IM_DY, ix = ox * IM_SX - IM_PL + kx * IM_DX;
    return (iy >= 0 && iy < IM_H && ix >= 0 && ix < IM_W)
        ? B_AT1(x, (IDX)img * IM_XS + ((IDX)c * IM_H + iy) * IM_W + ix) : (REAL)0;
}
#if B_TRANSP
#define B_READ(k, n) ((n) < N && (k) < K ? im2col_at(bp, n, j * IM_PJ + (k)) : (REAL)0)
#else
#define B_READ(k, n) ((n) < N && (k) < K ? im2col_at(bp, k, j * IM_PJ + (n)) : (REAL)0)
#endif
#elif VB == 1
#define B_READ(k, n) ((n) < N && (k) < K ? B_AT1(bp, B_AT(k, n)) : (REAL)0)
#elif B_TRANSP
#define B_READ(k, n) read4_b(bp + B_AT(k, n), (n) < N ? K - (k) : 0)
#else
#define B_READ(k, n) read4_b(bp + B_AT(k, n), (k) < K ? N - (n) : 0)
#endif

#if MMA && MMA_EMULATED
// The tests' stand-in for the matrix units where there are none (CPU runtimes): the same
// fragments, rounded alike (normal numbers; smaller ones flushed to zero, FP16's larger ones to
// infinity), each warp's product
// formed through local memory. With it the tests check this file's fragment layouts, warps and
// stores on every runtime; on NVIDIA's GPUs the PTX below runs instead.
inline uint fragment(const float x)   // TF32: to nearest, ties away
{
    return (as_uint(x) + 0x1000u) & 0xffffe000u;
}
inline uint bits16(const float x)   // FP16 or BF16 bits of x, to nearest even
{
    const uint u = as_uint(x);
#if MMA == 2
    const uint r = u + 0xfffu + ((u >> 13) & 1u);
    const int e = (int)((r >> 23) & 0xffu) - 112;
    return ((r >> 16) & 0x8000u) | (e >= 31 ? 0x7c00u : e > 0 ? ((uint)e << 10) | ((r >> 13) & 0x3ffu) : 0u);
#else
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
#endif
}
inline float value16(const uint h)   // the float of FP16 or BF16 bits h
{
#if MMA == 2
    const uint e = (h >> 10) & 0x1fu;
    return as_float(((h & 0x8000u) << 16) | (e ? ((e + 112u) << 23) | ((h & 0x3ffu) << 13) : 0u));
#else
    return as_float(h << 16);
#endif
}
inline uint fragment2(const float lo, const float hi)
{
    return bits16(lo) | (bits16(hi) << 16);
}
#define A_REGS (MMA == 1 ? 4 : 2)
#define B_REGS (MMA == 1 ? 2 : 1)
// the 16 x 8 A and 8 x 8 B of one warp's product, row-major, in ab[0 .. 127] and ab[128 ..]
inline void emulated_mma(float* d, const uint* a, const uint* b, __local float* ab, const int g, const int q)
{
    __local float* bb = ab + 128;
#if MMA == 1
    for (int h = 0; h < 4; ++h)
        ab[(g + (h & 1) * 8) * 8 + q + (h >> 1) * 4] = as_float(a[h]);
    bb[q * 8 + g] = as_float(b[0]);
    bb[(q + 4) * 8 + g] = as_float(b[1]);
#else
    for (int h = 0; h < 2; ++h) {
        ab[(g + h * 8) * 8 + 2 * q] = value16(a[h] & 0xffffu);
        ab[(g + h * 8) * 8 + 2 * q + 1] = value16(a[h] >> 16);
    }
    bb[2 * q * 8 + g] = value16(b[0] & 0xffffu);
    bb[(2 * q + 1) * 8 + g] = value16(b[0] >> 16);
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >> 1) * 8, col = 2 * q + (i & 1);
        float sum = 0;
        for (int k = 0; k < 8; ++k)
            sum += ab[row * 8 + k] * bb[k * 8 + col];
        d[i] += sum;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#define MMA_SYNC(d, a, b) emulated_mma((d), (a), (b), emulated[t / 32], g, q)
#elif MMA == 1
inline uint fragment(const float x)   // rounded to TF32, to nearest, ties away (as cuBLAS rounds)
{
    uint u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
    return u;
}
#define A_REGS 4
#define B_REGS 2
#define MMA_SYNC(d, a, b) asm volatile(                                                         \
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
    : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3])                                    \
    : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"((b)[0]), "r"((b)[1]))
#elif MMA
inline uint fragment2(const float lo, const float hi)   // two values in one register, lo in its lower half
{
    uint u;
#if MMA == 2
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
#endif
    return u;
}
#define A_REGS 2
#define B_REGS 1
#if MMA == 2
#define MMA_TYPE "f16"
#else
#define MMA_TYPE "bf16"
#endif
#define MMA_SYNC(d, a, b) asm volatile(                                                         \
    "mma.sync.aligned.m16n8k8.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};" \
    : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3])                                    \
    : "r"((a)[0]), "r"((a)[1]), "r"((b)[0]))
#endif

__kernel __attribute__((reqd_work_group_size(WX, WY, KS)))
void gemm_gpu(const struct gemm_sizes sizes, __global const A_T* restrict a, const struct gemm_operand a_at,
              __global const B_T* restrict b, const struct gemm_operand b_at,
              __global C_T* restrict c, const struct gemm_result c_at)
{
    GEMM_NAMES;
    // typed as vectors so that the reads in the inner loop are single 16-byte loads
    __local REAL4 As[2][TK][(TM + PAD) / 4];
    __local REAL4 Bs[2][TK][(TN + PAD) / 4];
#if MMA && MMA_EMULATED
    __local float emulated[WG / 32][16 * 8 + 8 * 8];
#endif
    const int tx = get_local_id(0), ty = get_local_id(1), kz = get_local_id(2), t = (kz * WY + ty) * WX + tx;
    // work-groups in one row: (matrix, tile row, tile column), the tile column fastest
    const int NT = (N + TN - 1) / TN, MT = (M + TM - 1) / TM, id = get_group_id(0);
    const int n0 = id % NT * TN, m0 = id / NT % MT * TM, z = id / NT / MT;
    const int i = z / GJ, j = z - i * GJ;
    a += a_off + i * a_si + (A_FOLD ? 0 : j * a_sj);
    b += b_off + i * b_si + (B_FOLD ? 0 : j * b_sj);
    c += c_off + i * c_si + (C_FOLD ? 0 : j * c_sj);

    AV ra[A_PER];
    BV rb[B_PER];
    // the next slice to fetch: k0 deep into the K block at ap, bp (KB blocks of K-deep products)
    int k0 = 0;
    __global const A_T* restrict ap = a;
    __global const B_T* restrict bp = b;
#define FETCH()                                                                     \
    _Pragma("unroll") for (int q = 0; q < A_PER; ++q) {                             \
        const int e = t + q * WG, m = m0 + A_M(e), k = k0 + A_K(e);                \
        ra[q] = A_READ(m, k);                                                       \
    }                                                                               \
    _Pragma("unroll") for (int q = 0; q < B_PER; ++q) {                             \
        const int e = t + q * WG, n = n0 + B_N(e), k = k0 + B_K(e);                \
        rb[q] = B_READ(k, n);                                                       \
    }                                                                               \
    k0 += TK;                                                                       \
    if (k0 >= K) {                                                                  \
        k0 = 0;                                                                     \
        ap += a_kb;                                                                 \
        bp += b_kb;                                                                 \
    }
#define STAGE(s)                                                                    \
    _Pragma("unroll") for (int q = 0; q < A_PER; ++q) {                             \
        const int e = t + q * WG;                                                   \
        STORE_A((__local REAL*)As[s] + A_K(e) * (TM + PAD) + A_M(e), ra[q]);        \
    }                                                                               \
    _Pragma("unroll") for (int q = 0; q < B_PER; ++q) {                             \
        const int e = t + q * WG;                                                   \
        STORE_B((__local REAL*)Bs[s] + B_K(e) * (TN + PAD) + B_N(e), rb[q]);        \
    }

#if MMA
    // fragment (mi, ni) of the warp's block in acc[(mi * NI + ni) * 4 ...]: rows g and g + 8 of
    // it, columns 2 * q and 2 * q + 1 (the fragments' layout in PTX)
    REAL acc[RM * RN];
#define ACC(f) acc[f]
    const int tp = ty * WX + tx, lane = tp % 32, warp = tp / 32, g = lane / 4, q = lane % 4;
    const int wm = warp % (TM / WTM) * WTM, wn = warp / (TM / WTM) * WTN;
#else
    REAL acc[RM][RN];
#define ACC(f) acc[(f) / RN][(f) % RN]
#endif
#pragma unroll
    for (int f = 0; f < RM * RN; ++f)
        ACC(f) = 0;

    const int slices = (K + TK - 1) / TK * KB;
    FETCH()
    STAGE(0)
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kt = 0; kt < slices; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < slices;
        if (more) {
            FETCH()
        }
#if MMA
        for (int kk = 0; kk < TK / KS; kk += 8) {
            const int k = kz * (TK / KS) + kk;
            __local const REAL* as = (__local const REAL*)As[cur] + k * (TM + PAD) + wm + g;
            __local const REAL* bs = (__local const REAL*)Bs[cur] + k * (TN + PAD) + wn + g;
            uint fa[MI][A_REGS], fb[NI][B_REGS];
            #pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                #pragma unroll
                for (int h = 0; h < 2; ++h) {   // rows g and g + 8 of the fragment
                    __local const REAL* p = as + mi * 16 + h * 8;
#if MMA == 1
                    fa[mi][h] = fragment(p[q * (TM + PAD)]);
                    fa[mi][h + 2] = fragment(p[(q + 4) * (TM + PAD)]);
#else
                    fa[mi][h] = fragment2(p[2 * q * (TM + PAD)], p[(2 * q + 1) * (TM + PAD)]);
#endif
                }
            #pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                __local const REAL* p = bs + ni * 8;
#if MMA == 1
                fb[ni][0] = fragment(p[q * (TN + PAD)]);
                fb[ni][1] = fragment(p[(q + 4) * (TN + PAD)]);
#else
                fb[ni][0] = fragment2(p[2 * q * (TN + PAD)], p[(2 * q + 1) * (TN + PAD)]);
#endif
            }
            #pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                #pragma unroll
                for (int ni = 0; ni < NI; ++ni)
                    MMA_SYNC(acc + (mi * NI + ni) * 4, fa[mi], fb[ni]);
        }
#else
        for (int kk = 0; kk < TK / KS; ++kk) {
            const int k = kz * (TK / KS) + kk;
            // quadrant q of a work-item's rows starts q * WY vectors (q * TM / 2 rows) on
            const REAL4 a0 = As[cur][k][ty], b0 = Bs[cur][k][tx];
#if RM == 8
            const REAL4 a1 = As[cur][k][ty + WY];
            const REAL av[RM] = {a0.s0, a0.s1, a0.s2, a0.s3, a1.s0, a1.s1, a1.s2, a1.s3};
#else
            const REAL av[RM] = {a0.s0, a0.s1, a0.s2, a0.s3};
#endif
#if RN == 8
            const REAL4 b1 = Bs[cur][k][tx + WX];
            const REAL bv[RN] = {b0.s0, b0.s1, b0.s2, b0.s3, b1.s0, b1.s1, b1.s2, b1.s3};
#else
            const REAL bv[RN] = {b0.s0, b0.s1, b0.s2, b0.s3};
#endif
            for (int r = 0; r < RM; ++r)
                for (int s = 0; s < RN; ++s)
                    acc[r][s] += av[r] * bv[s];
        }
#endif
        if (more) {
            STAGE(cur ^ 1)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#if KS > 1
    // the planes' sums into plane 0's, one plane at a time, through the staging memory (free now)
    __local REAL* sums = (__local REAL*)As;
    for (int p = 1; p < KS; ++p) {
        if (kz == p)
#pragma unroll
            for (int f = 0; f < RM * RN; ++f)
                sums[f * WXY + ty * WX + tx] = ACC(f);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (kz == 0)
#pragma unroll
            for (int f = 0; f < RM * RN; ++f)
                ACC(f) += sums[f * WXY + ty * WX + tx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (kz != 0)
        return;
#endif

    // A work-item's values of one row lie in runs of 4 neighbouring columns (its quadrants):
    // with VC == 4 each whole run is one four-wide write, so that neighbouring work-items write
    // neighbouring vectors (a run cut by C's last column is written value by value). Against
    // value-by-value writes on GPUs: about even over a network's GEMMs, faster for the short-K
    // ones that write most.
#if C_FOLD
#define C_AT(m, n) ((IDX)((n) / C_FOLD) * c_sj + (IDX)(m) * ldc + (n) % C_FOLD)
#else
#define C_AT(m, n) ((IDX)(m) * ldc + (n))
#endif
#if MMA
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + wm + mi * 16 + h * 8 + g;
            if (m >= M) continue;
            #pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                const int n = n0 + wn + ni * 8 + 2 * q;
                #pragma unroll
                for (int s = 0; s < 2 && n + s < N; ++s) {
                    const IDX o = C_AT(m, n + s);
                    const REAL v = alpha * acc[(mi * NI + ni) * 4 + 2 * h + s];
                    C_SAVE(c, o, beta == (REAL)0 ? v : v + beta * C_LOAD(c, o));
                }
            }
        }
#else
    for (int r = 0; r < RM; ++r) {
        const int m = m0 + ty * 4 + (r & 3) + (r >> 2) * (TM / 2);
        if (m >= M) continue;
        for (int h = 0; h < RN / 4; ++h) {
            const int n = n0 + tx * 4 + h * (TN / 2);
#if VC == 4
            if (n + 3 < N) {
                __global C_T* o = c + C_AT(m, n);
                const REAL4 v = alpha * (REAL4)(acc[r][4 * h], acc[r][4 * h + 1], acc[r][4 * h + 2], acc[r][4 * h + 3]);
                C_SAVE4(o, beta == (REAL)0 ? v : v + beta * C_LOAD4(o));
                continue;
            }
#endif
            for (int s = 0; s < 4 && n + s < N; ++s) {
                const IDX o = C_AT(m, n + s);
                const REAL v = alpha * acc[r][4 * h + s];
                C_SAVE(c, o, beta == (REAL)0 ? v : v + beta * C_LOAD(c, o));
            }
        }
    }
#endif
}
