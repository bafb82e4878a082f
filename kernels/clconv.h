// Prepended by the builder (clconv/programs.py) to every kernel file, after the host's
// #defines: the defaults every file reads with, and the helpers they all use.
#ifndef REAL           // arithmetic type: float or double (float for float16 storage)
#define REAL float
#endif
#ifndef STORE          // element type in memory: REAL, or half (float16 storage, REAL = float)
#define STORE REAL
#define LOAD(p, i) ((p)[i])
#define SAVE(p, i, v) ((p)[i] = (v))
#endif
#ifndef IDX            // index type: int when every index formed is below 2^31, else long
#define IDX long
#endif
#ifndef MADD           // a * b + c as one FMA: OpenCL C contracts the expression by default, and PoCL
                       // 3.0 calls its mad() and fma() builtins as functions, not inlined (seen in its
                       // objects); where a runtime does not contract it, the builder defines fma()
                       // (clconv.programs.multiply_add_builtin)
#define MADD(a, b, c) ((a) * (b) + (c))
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define REAL4 CAT(REAL, 4)
#define REALV CAT(REAL, VW)   // VW values: files of CPU row kernels define VW

// The epilogue flags of the kernels that write a forward pass's output (clconv/bias.py).
#define EPI_BIAS 1             // add bias[k]
#define EPI_RELU 2             // then max(v, 0)
#define EPI_ADD 4              // (fill_bias) onto the output's values, instead of onto 0
#define EPILOGUE(flags, v) (((flags) & EPI_RELU) && (v) < (REAL)0 ? (REAL)0 : (v))

// The GEMM kernels' scalars, in three structs: a driver copies each argument of every launch,
// and two dozen ints cost NVIDIA's OpenCL about a microsecond more per launch than a few structs
// of them. The sizes: C = alpha * A B + beta * C for GI x GJ matrices, the K-deep products in KB
// blocks. An operand's place: its offset, leading dimension, steps between matrices i and
// between matrices j, and between K blocks; the result's the same, less the last. Fields are
// lower case, as no #define the host prepends is.
struct gemm_sizes { int m, n, k; REAL alpha, beta; int gj, blocks; };
struct gemm_operand { IDX off; int ld; IDX si, sj, kb; };
struct gemm_result { IDX off; int ld; IDX si, sj; };
// the kernels' parameters sizes, a_at, b_at and c_at under the names their bodies use
#define GEMM_NAMES                                                                                 \
    const int M = sizes.m, N = sizes.n, K = sizes.k, GJ = sizes.gj, KB = sizes.blocks;           \
    const REAL alpha = sizes.alpha, beta = sizes.beta;                                            \
    const IDX a_off = a_at.off, a_si = a_at.si, a_sj = a_at.sj, a_kb = a_at.kb;                   \
    const IDX b_off = b_at.off, b_si = b_at.si, b_sj = b_at.sj, b_kb = b_at.kb;                   \
    const IDX c_off = c_at.off, c_si = c_at.si, c_sj = c_at.sj;                                   \
    const int lda = a_at.ld, ldb = b_at.ld, ldc = c_at.ld

// p[i] for 0 <= i < n, else zero: the load clamped into the row and always made, so that the
// compiler selects rather than branches on each value. Used where that measured no slower on
// either CPU runtime: im2col_rows' edges. direct_rows keeps the branch: with the select its
// vector-by-vector edges measured slower on PoCL, its short rows faster on PoCL but slower on
// Intel's runtime.
inline REAL at_or_zero(const __global REAL* restrict p, const int i, const int n)
{
    const REAL v = p[i < 0 ? 0 : i < n ? i : n - 1];
    return i >= 0 && i < n ? v : (REAL)0;
}
