// GEMM of our own over a 2-D grid of matrices, row-major:
//   C[i, j] = alpha * op(A[i, j]) @ op(B[i, j]) + beta * C[i, j],  i < GI, j < GJ,
// op(A) M x K, op(B) K x N; matrix (i, j) of an operand starts at off + i * si + j * sj.
// One launch covers the whole grid (e.g. groups x images), with no padded copies: tile
// loads past an edge read zeros and stores past an edge are skipped. The work-groups form
// one row (dimension 0 has the largest range on every device).
//
// A work-group computes a TM x TN tile of one C; its (TN/8) x (TM/8) work-items each
// accumulate 8x8 values, as four 4x4 quadrants TM/2 rows and TN/2 columns apart (so the
// local-memory reads of neighbouring work-items are neighbouring vectors). TK-deep slices
// of A and B pass through local memory, double buffered: the next slice's global loads
// are in flight while the current one is multiplied.
//
// Specialised by the host with prepended #defines; the defaults below are for reading.
#ifndef REAL
#define REAL float
#endif
#ifndef IDX            // index type: int when every index formed is below 2^31, else long
#define IDX long
#endif
#ifndef TM             // rows of C per work-group (a multiple of 8 that divides TK * 64)
#define TM 128
#endif
#ifndef TN             // columns of C per work-group (the same rules)
#define TN 128
#endif
#ifndef TK             // depth of the slices staged in local memory
#define TK 8
#endif
#ifndef A_TRANSP       // 1: A is stored K x M (op(A) = A^T)
#define A_TRANSP 0
#endif
#ifndef B_TRANSP       // 1: B is stored N x K
#define B_TRANSP 0
#endif

#define CAT(a, b) a##b
#define VEC(t, n) CAT(t, n)
#define REAL4 VEC(REAL, 4)

#define WX (TN / 8)                 // work-items along N
#define WY (TM / 8)                 // work-items along M
#define WG (WX * WY)
#define A_PER (TM * TK / WG)        // A values each work-item stages per slice
#define B_PER (TN * TK / WG)
#ifndef PAD                         // keeps the transposing local stores off one bank, rows 16-byte aligned
#define PAD 4
#endif
#if TM % 8 || TN % 8 || (TM * TK) % WG || (TN * TK) % WG
#error "each work-item must stage whole parts of a slice: TM and TN multiples of 8 dividing TK * 64"
#endif

// Element e (< TM*TK) of an A slice, in the order that keeps global reads contiguous:
// along k when A is stored M x K, along m when stored K x M.
#if A_TRANSP
#define A_M(e) ((e) % TM)
#define A_K(e) ((e) / TM)
#define A_AT(m, k) a[(IDX)(k) * lda + (m)]
#else
#define A_M(e) ((e) / TK)
#define A_K(e) ((e) % TK)
#define A_AT(m, k) a[(IDX)(m) * lda + (k)]
#endif
#if B_TRANSP
#define B_N(e) ((e) / TK)
#define B_K(e) ((e) % TK)
#define B_AT(k, n) b[(IDX)(n) * ldb + (k)]
#else
#define B_N(e) ((e) % TN)
#define B_K(e) ((e) / TN)
#define B_AT(k, n) b[(IDX)(k) * ldb + (n)]
#endif

__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void gemm(const int M, const int N, const int K, const REAL alpha, const REAL beta, const int GJ,
          __global const REAL* restrict a, const IDX a_off, const int lda, const IDX a_si, const IDX a_sj,
          __global const REAL* restrict b, const IDX b_off, const int ldb, const IDX b_si, const IDX b_sj,
          __global REAL* restrict c, const IDX c_off, const int ldc, const IDX c_si, const IDX c_sj)
{
    __local REAL As[2][TK][TM + PAD];
    __local REAL Bs[2][TK][TN + PAD];
    const int tx = get_local_id(0), ty = get_local_id(1), t = ty * WX + tx;
    // work-groups in one row: (matrix, tile row, tile column), the tile column fastest
    const int NT = (N + TN - 1) / TN, MT = (M + TM - 1) / TM, id = get_group_id(0);
    const int n0 = id % NT * TN, m0 = id / NT % MT * TM, z = id / NT / MT;
    const int i = z / GJ, j = z - i * GJ;
    a += a_off + i * a_si + j * a_sj;
    b += b_off + i * b_si + j * b_sj;
    c += c_off + i * c_si + j * c_sj;

    REAL ra[A_PER], rb[B_PER];
#define FETCH(k0)                                                                   \
    for (int q = 0; q < A_PER; ++q) {                                               \
        const int e = t + q * WG, m = m0 + A_M(e), k = (k0) + A_K(e);              \
        ra[q] = (m < M && k < K) ? A_AT(m, k) : (REAL)0;                            \
    }                                                                               \
    for (int q = 0; q < B_PER; ++q) {                                               \
        const int e = t + q * WG, n = n0 + B_N(e), k = (k0) + B_K(e);              \
        rb[q] = (n < N && k < K) ? B_AT(k, n) : (REAL)0;                            \
    }
#define STAGE(s)                                                                    \
    for (int q = 0; q < A_PER; ++q) As[s][A_K(t + q * WG)][A_M(t + q * WG)] = ra[q]; \
    for (int q = 0; q < B_PER; ++q) Bs[s][B_K(t + q * WG)][B_N(t + q * WG)] = rb[q];

    REAL acc[8][8];
    for (int r = 0; r < 8; ++r)
        for (int s = 0; s < 8; ++s)
            acc[r][s] = 0;

    FETCH(0)
    STAGE(0)
    barrier(CLK_LOCAL_MEM_FENCE);
    const int slices = (K + TK - 1) / TK;
    for (int kt = 0; kt < slices; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < slices;
        if (more) {
            FETCH((kt + 1) * TK)
        }
        for (int k = 0; k < TK; ++k) {
            const REAL4 a0 = vload4(0, &As[cur][k][ty * 4]), a1 = vload4(0, &As[cur][k][ty * 4 + TM / 2]);
            const REAL4 b0 = vload4(0, &Bs[cur][k][tx * 4]), b1 = vload4(0, &Bs[cur][k][tx * 4 + TN / 2]);
            const REAL av[8] = {a0.s0, a0.s1, a0.s2, a0.s3, a1.s0, a1.s1, a1.s2, a1.s3};
            const REAL bv[8] = {b0.s0, b0.s1, b0.s2, b0.s3, b1.s0, b1.s1, b1.s2, b1.s3};
            for (int r = 0; r < 8; ++r)
                for (int s = 0; s < 8; ++s)
                    acc[r][s] += av[r] * bv[s];
        }
        if (more) {
            STAGE(cur ^ 1)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int r = 0; r < 8; ++r) {
        const int m = m0 + ty * 4 + (r & 3) + (r >> 2) * (TM / 2);
        if (m >= M) continue;
        for (int s = 0; s < 8; ++s) {
            const int n = n0 + tx * 4 + (s & 3) + (s >> 2) * (TN / 2);
            if (n < N) {
                const IDX o = (IDX)m * ldc + n;
                c[o] = beta == (REAL)0 ? alpha * acc[r][s] : alpha * acc[r][s] + beta * c[o];
            }
        }
    }
}
