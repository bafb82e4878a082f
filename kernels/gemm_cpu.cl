// GEMM for CPU devices over a 2-D grid of matrices, row-major:
//   C[i, j] = alpha * op(A[i, j]) @ op(B[i, j]) + beta * C[i, j],  i < GI, j < GJ,
// op(A) M x K, op(B) K x N; matrix (i, j) of an operand starts at off + i * si + j * sj. With
// KB > 1 a product's depth is KB blocks of K (images summed over, whose positions are not one
// stride apart): block q of A starts a_kb values after block 0, of B b_kb; each K slice runs
// over every block before its sums go to C.
//
// Made for CPU OpenCL runtimes (PoCL, Intel's), which run a work-group's work-items as a loop
// and vectorise a work-item only as far as it is written with vectors. Each work-item owns a
// register block of C and loops over k with multiply-adds (MADD): no local memory, no
// barriers, work-groups of one work-item. It computes `tm` consecutive row blocks of one column
// block, K in slices of KC, each slice over all its row blocks, so that the slice of B stays
// in the first-level cache while they use it; dimension 0 runs over the row blocks, so
// consecutive work-groups, which a runtime hands to its threads in turn, share B's columns.
//
// Two forms, chosen by the host from the operands' layouts:
//   OUTER (INNER 0)  a block of MR rows by NV vectors of VW columns: per k, the NV vectors of a
//                    row of op(B) times each of MR values of op(A), broadcast. For B stored
//                    K x N, A either way; C_TRANSP stores the block transposed (the host runs
//                    A^T B^T as (B A)^T).
//   INNER (INNER 1)  MR x NR dot products along k, for A stored M x K and B stored N x K:
//                    vector partial sums of VW k values each, summed across the vector at the
//                    end of a slice; a slice's last (k1 - k0) % VW values as the lanes of the
//                    vector that ends the slice not summed before (a slice shorter than one vector
//                    a value at a time).
// With `panels`, B was packed by pack_b_panels (below): the column block's panel, its COLS columns of
// every k one after another, zeros past N, is read in order.
// A block past the edge of C reads clamped rows and columns (valid data, discarded) and skips
// their stores. In the OUTER form, where N is not a multiple of the block's columns, the last
// column block is computed shifted back to end at column N (nb below): its loads stay whole
// vectors, and it stores only the columns the block before does not. Only products narrower than
// one block read their columns past N as zeros, a value at a time.
//
// Specialised by the host with prepended #defines; the defaults below are for reading.
#ifndef VW             // values per vector, 4, 8 or 16: the device's native width, 512 bits at most
#define VW 8
#endif
#ifndef INNER          // 0: outer products (B stored K x N); 1: dot products (A M x K, B N x K)
#define INNER 0
#endif
#ifndef MR             // rows of C per register block (the host: 6 outer, 4 inner)
#define MR 6
#endif
#ifndef NV             // OUTER: vectors of columns per register block
#define NV 2
#endif
#ifndef NR             // INNER: columns of C per register block
#define NR 3
#endif
#ifndef KC             // depth of the K slices, a multiple of VW
#define KC 256
#endif
#ifndef A_TRANSP       // OUTER: 1 when A is stored K x M (op(A) = A^T)
#define A_TRANSP 0
#endif
#ifndef C_TRANSP       // OUTER: 1 to store the block transposed, at C[n][m] (the host runs
#define C_TRANSP 0     // op(A) = A^T with op(B) = B^T as C^T = B A this way)
#endif

// Vector loads and stores as VW consecutive scalars, which the compiler merges into one
// unaligned access: PoCL 3.0 calls its vloadn/vstoren builtins (and min, fma) as functions,
// not inlined (seen in its objects).
#define VLOAD8(i, p) ((CAT(REAL, 8))((p)[8 * (i)], (p)[8 * (i) + 1], (p)[8 * (i) + 2], (p)[8 * (i) + 3], \
                                     (p)[8 * (i) + 4], (p)[8 * (i) + 5], (p)[8 * (i) + 6], (p)[8 * (i) + 7]))
#define VSTORE8(v, i, p) ((p)[8 * (i)] = (v).s0, (p)[8 * (i) + 1] = (v).s1, (p)[8 * (i) + 2] = (v).s2, \
                          (p)[8 * (i) + 3] = (v).s3, (p)[8 * (i) + 4] = (v).s4, (p)[8 * (i) + 5] = (v).s5, \
                          (p)[8 * (i) + 6] = (v).s6, (p)[8 * (i) + 7] = (v).s7)
#if VW == 16
#define VLOAD(i, p) ((REALV)(VLOAD8(2 * (i), p), VLOAD8(2 * (i) + 1, p)))
#define VSTORE(v, i, p) (VSTORE8((v).lo, 2 * (i), p), VSTORE8((v).hi, 2 * (i) + 1, p))
#elif VW == 8
#define VLOAD(i, p) VLOAD8(i, p)
#define VSTORE(v, i, p) VSTORE8(v, i, p)
#else
#define VLOAD(i, p) ((REALV)((p)[4 * (i)], (p)[4 * (i) + 1], (p)[4 * (i) + 2], (p)[4 * (i) + 3]))
#define VSTORE(v, i, p) ((p)[4 * (i)] = (v).s0, (p)[4 * (i) + 1] = (v).s1, (p)[4 * (i) + 2] = (v).s2, \
                         (p)[4 * (i) + 3] = (v).s3)
#endif
#define LAST(i, n) ((i) < (n) ? (i) : (n) - 1)
#if VW == 16
#define LANE_INDEX ((REALV)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))
#elif VW == 8
#define LANE_INDEX ((REALV)(0, 1, 2, 3, 4, 5, 6, 7))
#else
#define LANE_INDEX ((REALV)(0, 1, 2, 3))
#endif

inline REAL vsum(const REALV v)   // the sum of a vector's values
{
#if VW == 16
    const CAT(REAL, 8) h = v.lo + v.hi;
    const CAT(REAL, 4) q = h.lo + h.hi;
#elif VW == 8
    const CAT(REAL, 4) q = v.lo + v.hi;
#else
    const CAT(REAL, 4) q = v;
#endif
    const CAT(REAL, 2) p = q.lo + q.hi;
    return p.lo + p.hi;
}

inline REALV load_edge(__global const REAL* p, const int rest)   // p[0 .. rest-1], zero past them
{
    REAL v[VW];
    _Pragma("unroll") for (int q = 0; q < VW; ++q)
        v[q] = q < rest ? p[q] : (REAL)0;
    return VLOAD(0, v);
}

#if INNER
#define COLS NR
#else
#define COLS (NV * VW)
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_cpu(const struct gemm_sizes sizes, __global const REAL* restrict a, const struct gemm_operand a_at,
              __global const REAL* restrict b, const struct gemm_operand b_at,
              __global REAL* restrict c, const struct gemm_result c_at, const int panels, const int tm)
{
    // tm, the row blocks per work-item, is an argument, not a #define: a loop's trip count, it
    // buys nothing compiled in and would make a program of its own for nearly every shape
    GEMM_NAMES;
    const int n0 = get_global_id(1) * COLS, z = get_global_id(2);
#if !INNER
    // the columns this block computes start at nb: n0, or for a last block past N, N - COLS (when
    // N holds a whole block); those before n0 are the previous block's and are not stored
    const int nb = N >= COLS && n0 + COLS > N && !panels ? N - COLS : n0;
#endif
    const int i = z / GJ, j = z - i * GJ;
    a += a_off + i * a_si + j * a_sj;
    b += b_off + i * b_si + j * b_sj;
    c += c_off + i * c_si + j * c_sj;
#if INNER
    // columns of C past N read row N - 1 of B
    IDX rb[NR];
    _Pragma("unroll") for (int s = 0; s < NR; ++s)
        rb[s] = LAST(n0 + s, N);
#endif

    // K in slices of KC: a slice of this column block's B stays in cache across the row blocks.
    // The first slice's sums go to C as alpha * sum + beta * C, later ones add alpha * sum.
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int k1 = K - k0 < KC ? K : k0 + KC;
        const REAL keep = k0 == 0 ? beta : (REAL)1;   // what C's value counts for
        for (int t = 0; t < tm; ++t) {
            const int m0 = (get_global_id(0) * tm + t) * MR;
            if (m0 >= M) break;
            // rows of op(A) past M read row M - 1
            IDX ra[MR];
            _Pragma("unroll") for (int r = 0; r < MR; ++r)
                ra[r] = LAST(m0 + r, M);
#if INNER
            REALV acc[MR][NR];
            _Pragma("unroll") for (int r = 0; r < MR; ++r)
                _Pragma("unroll") for (int s = 0; s < NR; ++s)
                    acc[r][s] = 0;
            const int tail = (k1 - k0) % VW, kv = k1 - tail;   // the slice's whole vectors end at kv
#define INNER_STEP(k, MASK)                                                    \
            {                                                                  \
                REALV bv[NR];                                                  \
                _Pragma("unroll") for (int s = 0; s < NR; ++s)                 \
                    bv[s] = MASK(VLOAD(0, bq + rb[s] * ldb + (k)));            \
                _Pragma("unroll") for (int r = 0; r < MR; ++r) {               \
                    const REALV av = MASK(VLOAD(0, aq + ra[r] * lda + (k)));   \
                    _Pragma("unroll") for (int s = 0; s < NR; ++s)             \
                        acc[r][s] = MADD(av, bv[s], acc[r][s]);                \
                }                                                              \
            }
#define ALL_LANES(v) (v)
#define TAIL_LANES(v) (LANE_INDEX >= (REAL)(VW - tail) ? (v) : (REALV)0)
            for (int q = 0; q < KB; ++q) {
                const __global REAL* restrict aq = a + q * a_kb;
                const __global REAL* restrict bq = b + q * b_kb;
                for (int k = k0; k < kv; k += VW)
                    INNER_STEP(k, ALL_LANES)
                if (tail && kv > k0) {   // the tail: the vector that ends at k1, its lanes before kv (summed) zeroed
                    INNER_STEP(k1 - VW, TAIL_LANES)
                }
            }
            REAL sum[MR][NR];
            _Pragma("unroll") for (int r = 0; r < MR; ++r)
                _Pragma("unroll") for (int s = 0; s < NR; ++s)
                    sum[r][s] = vsum(acc[r][s]);
            if (kv == k0)   // a slice shorter than one vector, a value at a time
            for (int q = 0; q < KB; ++q) {
                const __global REAL* restrict aq = a + q * a_kb;
                const __global REAL* restrict bq = b + q * b_kb;
                for (int k = kv; k < k1; ++k)
                    _Pragma("unroll") for (int r = 0; r < MR; ++r)
                        _Pragma("unroll") for (int s = 0; s < NR; ++s)
                            sum[r][s] = MADD(aq[ra[r] * lda + k], bq[rb[s] * ldb + k], sum[r][s]);
            }
            _Pragma("unroll") for (int r = 0; r < MR; ++r) {
                if (m0 + r >= M) break;
                _Pragma("unroll") for (int s = 0; s < NR; ++s) {
                    if (n0 + s < N) {
                        __global REAL* p = c + (IDX)(m0 + r) * ldc + n0 + s;
                        *p = keep == (REAL)0 ? alpha * sum[r][s] : MADD(keep, *p, alpha * sum[r][s]);
                    }
                }
            }
#else
            REALV acc[MR][NV];
            _Pragma("unroll") for (int r = 0; r < MR; ++r)
                _Pragma("unroll") for (int v = 0; v < NV; ++v)
                    acc[r][v] = 0;
#if A_TRANSP
#define A_AT(r, k) aq[(IDX)(k) * lda + ra[r]]
#else
#define A_AT(r, k) aq[ra[r] * lda + (k)]
#endif
#define OUTER_STEP(LOAD_B, COL)                                                \
            for (int q = 0; q < KB; ++q)                                       \
            for (int k = k0; k < k1; ++k) {                                    \
                const __global REAL* restrict aq = a + q * a_kb;               \
                __global const REAL* bk = b + q * b_kb + (IDX)k * ldb + (COL); \
                REALV bv[NV];                                                  \
                _Pragma("unroll") for (int v = 0; v < NV; ++v)                 \
                    bv[v] = LOAD_B(v);                                         \
                _Pragma("unroll") for (int r = 0; r < MR; ++r) {               \
                    const REALV av = (REALV)(A_AT(r, k));                      \
                    _Pragma("unroll") for (int v = 0; v < NV; ++v)             \
                        acc[r][v] = MADD(av, bv[v], acc[r][v]);                \
                }                                                              \
            }
#define B_FULL(v) VLOAD(v, bk)
#define B_EDGE(v) load_edge(bk + (v) * VW, N - n0 - (v) * VW)
            if (panels) {
                const __global REAL* restrict bp = b + (IDX)get_global_id(1) * KB * K * COLS;
                for (int q = 0; q < KB; ++q) {
                    const __global REAL* restrict aq = a + q * a_kb;
                    const __global REAL* bk = bp + ((IDX)q * K + k0) * COLS;
                    const __global REAL* ar[MR];
                    _Pragma("unroll") for (int r = 0; r < MR; ++r)
                        ar[r] = &A_AT(r, k0);
                    for (int k = 0; k < k1 - k0; ++k, bk += COLS) {
                        REALV bv[NV];
                        _Pragma("unroll") for (int v = 0; v < NV; ++v)
                            bv[v] = VLOAD(v, bk);
                        _Pragma("unroll") for (int r = 0; r < MR; ++r) {
#if A_TRANSP
                            const REALV av = (REALV)(ar[r][(IDX)k * lda]);
#else
                            const REALV av = (REALV)(ar[r][k]);
#endif
                            _Pragma("unroll") for (int v = 0; v < NV; ++v)
                                acc[r][v] = MADD(av, bv[v], acc[r][v]);
                        }
                    }
                }
            } else if (n0 + COLS <= N) {
                OUTER_STEP(B_FULL, n0)
            } else if (nb + COLS <= N) {   // shifted
                OUTER_STEP(B_FULL, nb)
            } else {
                OUTER_STEP(B_EDGE, n0)
            }
            _Pragma("unroll") for (int r = 0; r < MR; ++r) {
                if (m0 + r >= M) break;
                _Pragma("unroll") for (int v = 0; v < NV; ++v) {
                    // this vector's lanes from `first` up to `last` are columns of C that are this block's own
                    const int first = max(n0 - nb - v * VW, 0), last = min(N - nb - v * VW, VW);
                    const REALV out = alpha * acc[r][v];
#if C_TRANSP
                    REAL part[VW];
                    VSTORE(out, 0, part);
                    for (int q = first; q < last; ++q) {
                        __global REAL* p = c + (IDX)(nb + v * VW + q) * ldc + m0 + r;
                        *p = keep == (REAL)0 ? part[q] : MADD(keep, *p, part[q]);
                    }
#else
                    __global REAL* cr = c + (IDX)(m0 + r) * ldc + nb + v * VW;
                    if (first == 0 && last == VW) {
                        const REALV sum = keep == (REAL)0 ? out : MADD((REALV)keep, VLOAD(0, cr), out);
                        VSTORE(sum, 0, cr);
                    } else {
                        REAL part[VW];
                        VSTORE(out, 0, part);
                        for (int q = first; q < last; ++q)
                            cr[q] = keep == (REAL)0 ? part[q] : MADD(keep, cr[q], part[q]);
                    }
#endif
                }
            }
#endif
        }
    }
}

// A^T packed for gemm_cpu: dst[i, j] (M x K, row-major, ld K) = src[i, j]^T (src stored K x M, ld
// lda), matrix (i, j) of each at off + i * si + j * sj. Work-item (row block of MR rows, i * GJ + j)
// reads MR consecutive values of each of src's K rows and writes them down MR rows of dst. The
// GEMM reading A^T in place walks one of A's rows per k, lda apart (a new page per k for wide
// weights): measured slower on PoCL and Intel's runtime than on the packed copy.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pack_a_transposed(const int M, const int K, const int GJ,
                       __global const REAL* restrict src, const IDX src_off, const int lda, const IDX s_si,
                       const IDX s_sj, __global REAL* restrict dst, const IDX dst_off, const IDX d_si, const IDX d_sj)
{
    const int m0 = get_global_id(0) * MR, z = get_global_id(1);
    const int i = z / GJ, j = z - i * GJ, rows = min(MR, M - m0);
    src += src_off + i * s_si + j * s_sj + m0;
    dst += dst_off + i * d_si + j * d_sj + (IDX)m0 * K;
    for (int k = 0; k < K; ++k) {
        const __global REAL* sk = src + (IDX)k * lda;
        for (int r = 0; r < rows; ++r) dst[(IDX)r * K + k] = sk[r];
    }
}

// B (stored K x N, KB blocks of K) packed in panels for gemm_cpu's `panels`: panel j holds columns
// j * COLS ... of every k of every block, COLS values per k (zeros past N), rows (q, k) in order;
// matrix (i, j) of each at off + i * si + j * sj. A work-item copies rows_per_item whole rows, each
// read in order, into every panel.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pack_b_panels(const int N, const int K, const int GJ, const int KB, const int rows_per_item,
                   __global const REAL* restrict src, const IDX src_off, const int ldb, const IDX s_si, const IDX s_sj,
                   const IDX s_kb, __global REAL* restrict dst, const IDX dst_off, const IDX d_si, const IDX d_sj)
{
    const int z = get_global_id(1), gi = z / GJ, gj = z - gi * GJ, rows = KB * K;
    const int r0 = get_global_id(0) * rows_per_item, r1 = min(r0 + rows_per_item, rows), full = N / COLS;
    src += src_off + gi * s_si + gj * s_sj;
    dst += dst_off + gi * d_si + gj * d_sj;
    const IDX panel = (IDX)rows * COLS;
    for (int r = r0; r < r1; ++r) {
        const int q = r / K;
        const __global REAL* row = src + q * s_kb + (IDX)(r - q * K) * ldb;
        __global REAL* d = dst + (IDX)r * COLS;
        for (int j = 0; j < full; ++j, row += COLS, d += panel)
            _Pragma("unroll") for (int v = 0; v < NV; ++v)
                VSTORE(VLOAD(v, row), v, d);
        if (full * COLS < N)
            _Pragma("unroll") for (int v = 0; v < NV; ++v)
                VSTORE(load_edge(row + v * VW, N - full * COLS - v * VW), v, d);
    }
}

// B stored N x K (KB blocks of K) packed transposed, in the panels pack_b_panels writes (op(B) = B^T
// read as if stored K x N): work-item (rows, panel j, matrix) reads each of the panel's COLS rows of B
// along rows_per_item of its (block, k) values, in order, and writes them down the panel's column.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pack_bt_panels(const int N, const int K, const int GJ, const int KB, const int rows_per_item,
                    __global const REAL* restrict src, const IDX src_off, const int ldb, const IDX s_si,
                    const IDX s_sj, const IDX s_kb, __global REAL* restrict dst, const IDX dst_off, const IDX d_si,
                    const IDX d_sj)
{
    const int j = get_global_id(1), z = get_global_id(2), gi = z / GJ, gj = z - gi * GJ, rows = KB * K;
    const int r0 = get_global_id(0) * rows_per_item, r1 = min(r0 + rows_per_item, rows);
    src += src_off + gi * s_si + gj * s_sj;
    dst += dst_off + gi * d_si + gj * d_sj + (IDX)j * rows * COLS;
    const int q0 = r0 / K;
    for (int c = 0; c < COLS; ++c) {
        const int n = j * COLS + c;
        if (n >= N) {
            for (int r = r0; r < r1; ++r) dst[(IDX)r * COLS + c] = 0;
            continue;
        }
        const __global REAL* row = src + (IDX)n * ldb;
        int q = q0, k = r0 - q0 * K;
        for (int r = r0; r < r1; ++r) {
            dst[(IDX)r * COLS + c] = row[q * s_kb + k];
            if (++k == K) {
                k = 0;
                ++q;
            }
        }
    }
}
