// FFT transforms of the fft algorithm (clconv/algorithms/fft.py).
//
// At stride 1 a convolution is a correlation: y[i] = sum_u x[i + u*D] w[u], per axis. With x
// padded into an FH x FW frame (x[y][x] at frame row y + PT, column x + PL, zeros around) no
// output index wraps, so with X, W the 2-D DFTs of the frame and of the (dilated) filter,
//   forward       Y[n][k]  = sum_c X[n][c] conj(W[k][c])      y = IDFT(Y), top-left OH x OW
//   grad-weight   dW[k][c] = sum_n X[n][c] conj(DY[n][k])     dw = IDFT(dW) on the filter's
//                                                             (dilated) tap grid
// (grad-input is the forward pass of the transposed convolution). Real data have Hermitian
// spectra: only the FH x (FW/2 + 1) frequencies f = fy * HW + fx are kept.
//
// Per frequency and group, each sum is one real GEMM over stacked real and imaginary parts:
// a spectrum row [re | im] of B images or Cg channels, and for X a second, "rotated" row
// [im | -re], so that [Wr Wi] @ [[Xr Xi]; [Xi -Xr]] = [Re | Im] of conj(W) X. Buffers, with
// b the image within the chunk of B and rows the channels, each row 2B long:
//   S[f][row][2B]            spectra of images: row = channel (plain), or for the rotated
//                            layout rows g*2Cg + cg (plain) and g*2Cg + Cg + cg (rotated)
//   WS[f][k][2Cg]            filter spectra (or the grad-weight's summed products)
//
// Specialised by the host with prepended #defines; the defaults below are for reading.
#ifndef FH             // frame rows and columns: powers of two
#define FH 32
#endif
#ifndef FW
#define FW 32
#endif
#ifndef NB             // images per work-group of the image transforms
#define NB 8
#endif
#ifndef NBO            // and of the output transforms
#define NBO 8
#endif
#ifndef BATCH          // global reads a work-item of the image transforms keeps in flight
#define BATCH 8
#endif
// The filter and output transforms take the layer's shapes as constants: their loops unroll
// around them and their index arithmetic folds (the filter transform's row twiddle indices among
// it; the column ones still depend on the work-item's column frequency). Against the same shapes
// as arguments this measured faster on GPUs (filter and output transforms, whole passes) and on
// PoCL; the image transform's gain was within noise, so it keeps its arguments and one build per
// frame size (every shape's own build of it made a cold make test minutes longer on rusticl).
// A build compiles the one kernel the host names in ONLY (its upper-case name), with its own
// shapes, or all of them without ONLY: the transforms' unrolled FFTs make most of a build's time.
#define FFT_IMAGE 1
#define FFT_FILTER 2
#define FFT_OUTPUT 3
#ifdef ONLY
#define BUILDS(kernel) (ONLY == (kernel))
#else
#define BUILDS(kernel) 1
#endif
#ifndef FILTER_KH      // fft_filter: the filter's taps and their dilation
#define FILTER_KH 5
#endif
#ifndef FILTER_KW
#define FILTER_KW 5
#endif
#ifndef FILTER_DH
#define FILTER_DH 1
#endif
#ifndef FILTER_DW
#define FILTER_DW 1
#endif
#ifndef OUT_OH         // fft_output: its planes' rows and columns, and the dilation of their grid in the frame
#define OUT_OH 25
#endif
#ifndef OUT_OW
#define OUT_OW 25
#endif
#ifndef OUT_DH
#define OUT_DH 1
#endif
#ifndef OUT_DW
#define OUT_DW 1
#endif
#define HW (FW / 2 + 1)                 // kept columns of a spectrum
#define FT (FH > FW ? FH : FW)          // twiddle table length
#ifndef TW_RE          // the twiddles exp(-2 pi i j / FT), j < FT, as literals from the host (FT = 32 here)
#define TW_RE 1.0f, 0.98078528f, 0.92387953f, 0.83146961f, 0.70710678f, 0.55557023f, 0.38268343f, 0.19509032f, \
    0.0f, -0.19509032f, -0.38268343f, -0.55557023f, -0.70710678f, -0.83146961f, -0.92387953f, -0.98078528f, \
    -1.0f, -0.98078528f, -0.92387953f, -0.83146961f, -0.70710678f, -0.55557023f, -0.38268343f, -0.19509032f, \
    0.0f, 0.19509032f, 0.38268343f, 0.55557023f, 0.70710678f, 0.83146961f, 0.92387953f, 0.98078528f
#define TW_IM 0.0f, -0.19509032f, -0.38268343f, -0.55557023f, -0.70710678f, -0.83146961f, -0.92387953f, \
    -0.98078528f, -1.0f, -0.98078528f, -0.92387953f, -0.83146961f, -0.70710678f, -0.55557023f, -0.38268343f, \
    -0.19509032f, 0.0f, 0.19509032f, 0.38268343f, 0.55557023f, 0.70710678f, 0.83146961f, 0.92387953f, \
    0.98078528f, 1.0f, 0.98078528f, 0.92387953f, 0.83146961f, 0.70710678f, 0.55557023f, 0.38268343f, 0.19509032f
#endif
// In constant memory: read at constant indices (the FFTs, once unrolled) they fold into the
// code as immediates; the filter transform reads them at indices that depend on its column
// frequency and tap only.
__constant REAL TWR[FT] = {TW_RE};
__constant REAL TWI[FT] = {TW_IM};

#define LOG2(n) ((n) >= 64 ? 6 : (n) >= 32 ? 5 : (n) >= 16 ? 4 : (n) >= 8 ? 3 : (n) >= 4 ? 2 : 1)

inline int reverse_bits(int i, const int bits)
{
    int r = 0;
    for (int b = 0; b < bits; ++b, i >>= 1) r = (r << 1) | (i & 1);
    return r;
}

// In-place DFT of length n (a power of two dividing FT, at most 64) of re[] + i im[]: radix 2,
// decimation in time. Every loop has a constant trip count, so once unrolled every index is a
// constant, the arrays stay in registers and the twiddles are immediates (those of 1 skipped).
static inline __attribute__((always_inline)) void fft(REAL* re, REAL* im, const int n)
{
    const int bits = LOG2(n);
    #pragma unroll
    for (int i = 0; i < n; ++i) {
        const int r = reverse_bits(i, bits);
        if (i < r) {
            const REAL a = re[i], b = im[i];
            re[i] = re[r]; im[i] = im[r]; re[r] = a; im[r] = b;
        }
    }
    #pragma unroll
    for (int stage = 0; stage < bits; ++stage) {
        #pragma unroll
        for (int j = 0; j < n / 2; ++j) {   // butterfly j joins a and a + span, span = 2^stage
            const int span = 1 << stage, k = j & (span - 1);
            const int a = ((j >> stage) << (stage + 1)) + k, b = a + span;
            REAL tr = re[b], ti = im[b];
            if (k) {
                const REAL wr = TWR[k * (FT >> (stage + 1))], wi = TWI[k * (FT >> (stage + 1))];
                tr = re[b] * wr - im[b] * wi;
                ti = re[b] * wi + im[b] * wr;
            }
            re[b] = re[a] - tr; im[b] = im[a] - ti;
            re[a] += tr; im[a] += ti;
        }
    }
}

// Two real sequences a, b at the cost of one complex DFT: with z = a + i b, Z = DFT(z) and
// j = (n - k) % n, A[k] = (Z[k] + conj Z[j]) / 2 and B[k] = (Z[k] - conj Z[j]) / 2i.

#if BUILDS(FFT_IMAGE)
// The spectra of B images of C channels, each H x W placed at (PT, PL) in the frame, into S
// at s_off: rotated rows as well when `rotated` (then C = G * Cg). 3-D range: images
// (rounded up to NB), FH / 2, channels; work-group NB x FH/2 x 1: NB images of one channel.
// Work-item (b, r) transforms frame rows 2r and 2r + 1 of image b as one complex row, then
// the columns r, r + FH/2, ... below FW/2, column 0 (real) carrying the real column FW/2.
__kernel void fft_image(__global const REAL* restrict x, const IDX x_off,
                        __global REAL* restrict s, const IDX s_off,
                        const int B, const int C, const int H, const int W, const int PT, const int PL,
                        const int Cg, const int rotated)
{
    __local REAL spec[2][FH][HW][NB];   // first the NB planes as read, then their row transforms
    __local REAL* plane = &spec[0][0][0][0];
    const int b = get_local_id(0), r = get_local_id(1), id = r * NB + b;
    const int n = get_global_id(0), c = get_global_id(2), n0 = get_group_id(0) * NB;
    // the NB planes, each read whole and in order (H x W fits in its share: H <= FH, W <= FW)
    // (BATCH reads in flight per work-item, not one at a time, each waiting for the last)
    const int HWn = H * W, all = NB * HWn, step = NB * FH / 2;
    for (int e0 = id; e0 < all; e0 += BATCH * step) {
        REAL v[BATCH];
        #pragma unroll
        for (int q = 0; q < BATCH; ++q) {
            const int e = e0 + q * step, p = e / HWn;
            v[q] = e < all && n0 + p < B ? x[x_off + ((IDX)(n0 + p) * C + c) * HWn + e - p * HWn] : (REAL)0;
        }
        #pragma unroll
        for (int q = 0; q < BATCH; ++q)
            if (e0 + q * step < all)
                plane[e0 + q * step] = v[q];
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    // frame rows 2r (as the real part) and 2r + 1 (the imaginary part) of plane b
    REAL re[FW], im[FW];
    const int y = 2 * r - PT;
    const bool live0 = n < B && y >= 0 && y < H, live1 = n < B && y + 1 >= 0 && y + 1 < H;
    #pragma unroll
    for (int i = 0; i < FW; ++i) {
        const int xx = i - PL;
        const bool in = xx >= 0 && xx < W;
        re[i] = live0 && in ? plane[b * HWn + y * W + xx] : (REAL)0;
        im[i] = live1 && in ? plane[b * HWn + (y + 1) * W + xx] : (REAL)0;
    }
    if (live0 || live1)
        fft(re, im, FW);
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (int i = 0; i < HW; ++i) {
        const int j = (FW - i) % FW;
        spec[0][2 * r][i][b] = (re[i] + re[j]) * (REAL)0.5;
        spec[1][2 * r][i][b] = (im[i] - im[j]) * (REAL)0.5;
        spec[0][2 * r + 1][i][b] = (im[i] + im[j]) * (REAL)0.5;
        spec[1][2 * r + 1][i][b] = (re[j] - re[i]) * (REAL)0.5;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    if (n >= B) return;
    const int rows = rotated ? 2 * C : C;
    const int row = rotated ? c + c / Cg * Cg : c;
    const IDX fstep = (IDX)rows * 2 * B, rot = (IDX)Cg * 2 * B;
    for (int t = r; t < FW / 2; t += FH / 2) {
        REAL cre[FH], cim[FH];
        #pragma unroll
        for (int i = 0; i < FH; ++i) {
            cre[i] = spec[0][i][t][b];
            cim[i] = t ? spec[1][i][t][b] : spec[0][i][FW / 2][b];
        }
        fft(cre, cim, FH);
        IDX dst = s_off + ((IDX)t * rows + row) * 2 * B + n;
        const IDX nyquist = (IDX)(FW / 2) * fstep;   // column FW/2 from column 0
        #pragma unroll
        for (int fy = 0; fy < FH; ++fy, dst += HW * fstep) {
            const int j = (FH - fy) % FH;
            REAL vr = cre[fy], vi = cim[fy];
            if (!t) {
                const REAL nr = (cim[fy] + cim[j]) * (REAL)0.5, ni = (cre[j] - cre[fy]) * (REAL)0.5;
                vr = (cre[fy] + cre[j]) * (REAL)0.5;
                vi = (cim[fy] - cim[j]) * (REAL)0.5;
                s[dst + nyquist] = nr;
                s[dst + nyquist + B] = ni;
                if (rotated) {
                    s[dst + nyquist + rot] = ni;
                    s[dst + nyquist + rot + B] = -nr;
                }
            }
            s[dst] = vr;
            s[dst + B] = vi;
            if (rotated) {
                s[dst + rot] = vi;
                s[dst + rot + B] = -vr;
            }
        }
    }
}
#endif

#if BUILDS(FFT_FILTER)
// Filter spectra WS[f][k][2Ci] of K filters of Ci channels (KH x KW taps, DH x DW apart);
// `flip`: of the transposed convolution (filter k, channel ci read from filter ci of k's group,
// channel k % Ko, taps reversed). Direct sums, separable: per filter row u, its taps' sum at
// column frequency fx, then that times exp(-2 pi i fy u DH / FH) into each row frequency fy.
// 3-D range: ci, fx (HW), k. Each work-item reads its own taps: measured faster on GPUs than
// staging a work-group's taps in local memory with the column DFT as an FFT, than several
// work-items per (ci, fx, k) each taking some of the row frequencies, and than work-groups of
// 4 or 8 column frequencies (2 was mixed, about even on average).
__kernel void fft_filter(__global const REAL* restrict w, const IDX w_off,
                         __global REAL* restrict ws, const IDX ws_off,
                         const int K, const int Ko, const int Ci, const int flip)
{
    const int ci = get_global_id(0), fx = get_global_id(1), k = get_global_id(2);
    if (ci >= Ci || fx >= HW || k >= K) return;
    const int KH = FILTER_KH, KW = FILTER_KW, DH = FILTER_DH, DW = FILTER_DW, grp = k / Ko, taps = KH * KW;
    const __global REAL* g = w + w_off + (flip ? (IDX)(grp * Ci + ci) * Ko + (k - grp * Ko) : (IDX)k * Ci + ci) * taps;
    REAL sr[FH], si[FH];
    #pragma unroll
    for (int fy = 0; fy < FH; ++fy)
        sr[fy] = si[fy] = 0;
    #pragma unroll
    for (int u = 0; u < KH; ++u) {
        REAL rr = 0, ri = 0;   // row u's taps at column frequency fx
        #pragma unroll
        for (int v = 0; v < KW; ++v) {
            const REAL tap = flip ? g[taps - 1 - KW * u - v] : g[KW * u + v];
            const int j = fx * v * DW % FW * (FT / FW);
            rr += tap * TWR[j];
            ri += tap * TWI[j];
        }
        #pragma unroll
        for (int fy = 0; fy < FH; ++fy) {
            const int j = fy * u * DH % FH * (FT / FH);
            sr[fy] += rr * TWR[j] - ri * TWI[j];
            si[fy] += rr * TWI[j] + ri * TWR[j];
        }
    }
    IDX dst = ws_off + ((IDX)fx * K + k) * 2 * Ci + ci;
    #pragma unroll
    for (int fy = 0; fy < FH; ++fy, dst += (IDX)HW * K * 2 * Ci) {
        ws[dst] = sr[fy];
        ws[dst + Ci] = si[fy];
    }
}
#endif

#if BUILDS(FFT_OUTPUT)
// y[n][k] = the OH x OW grid of IDFT(S[.][k] of image n) at rows 0, DH, ... and columns 0,
// DW, ... (+ bias[k]), from S (plain rows, K of them), output (n, k) at y + n * SN + k * SK.
// The convolutions' outputs are the top-left of the frame (DH = DW = 1); the grad-weight's
// taps are its dilated filter grid, with n the channel. Overwrites y. 3-D range: images
// (rounded up to NBO), FH / 2, K; work-group NBO x FH/2 x 1: NBO images of one output channel.
// Inverse DFTs as conj(DFT(conj(.))). Work-item (b, r) inverts columns r, r + FH/2, ... below
// FW/2 (column 0 carrying column FW/2: both invert to real columns), then output rows 2r and
// 2r + 1 as one complex row (both real: the second rides as the imaginary part).
__kernel void fft_output(__global const REAL* restrict s, const IDX s_off,
                         __global REAL* restrict y, const IDX y_off,
                         __global const REAL* restrict bias, const IDX bias_off, const int flags,
                         const int B, const int K, const IDX SN, const IDX SK)
{
    const int OH = OUT_OH, OW = OUT_OW, DH = OUT_DH, DW = OUT_DW;
    __local REAL spec[2][FH][HW][NBO];   // column transforms of the NBO spectra, then the outputs
    __local REAL* plane = &spec[0][0][0][0];
    const int b = get_local_id(0), r = get_local_id(1), id = r * NBO + b;
    const int n = get_global_id(0), k = get_global_id(2), n0 = get_group_id(0) * NBO;

    const IDX fstep = (IDX)K * 2 * B;
    for (int t = r; t < FW / 2; t += FH / 2) {
        REAL cre[FH], cim[FH];
        IDX src = s_off + ((IDX)t * K + k) * 2 * B + n;
        const IDX nyquist = (IDX)(FW / 2) * fstep;   // column FW/2 from column 0
        #pragma unroll
        for (int fy = 0; fy < FH; ++fy, src += HW * fstep) {
            REAL vr = n < B ? s[src] : (REAL)0, vi = n < B ? s[src + B] : (REAL)0;
            if (!t && n < B) {   // column 0 + i column FW/2
                vr -= s[src + nyquist + B];
                vi += s[src + nyquist];
            }
            cre[fy] = vr;
            cim[fy] = -vi;
        }
        fft(cre, cim, FH);
        #pragma unroll
        for (int i = 0; i < FH; ++i) {
            spec[0][i][t][b] = cre[i];
            spec[1][i][t][b] = t ? -cim[i] : (REAL)0;
            if (!t) {
                spec[0][i][FW / 2][b] = -cim[i];
                spec[1][i][FW / 2][b] = 0;
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    // output rows 2r and 2r + 1, frame rows 2r * DH and (2r + 1) * DH: conj of Z = A + i B,
    // each full row from its Hermitian half
    const bool live0 = 2 * r < OH, live1 = 2 * r + 1 < OH;
    const int fa = live0 ? 2 * r * DH : 0, fb = live1 ? (2 * r + 1) * DH : 0;
    REAL re[FW], im[FW];
    #pragma unroll
    for (int i = 0; i < FW; ++i) {
        const int m = i < HW ? i : FW - i, sign = i < HW ? 1 : -1;
        const REAL ar = spec[0][fa][m][b], ai = sign * spec[1][fa][m][b];
        const REAL br = live1 ? spec[0][fb][m][b] : (REAL)0, bi = live1 ? sign * spec[1][fb][m][b] : (REAL)0;
        re[i] = ar - bi;
        im[i] = -(ai + br);
    }
    if (live0)
        fft(re, im, FW);
    barrier(CLK_LOCAL_MEM_FENCE);
    // the NBO output planes, each OH x OW (fits: OH <= FH, OW <= FW), then written whole and in order
    const int HWn = OH * OW;
    const REAL b0 = (flags & EPI_BIAS) ? bias[bias_off + k] : (REAL)0;
    #pragma unroll
    for (int i = 0; i < FW; ++i)   // constant indices into re[], im[]: the arrays stay in registers
        if (i % DW == 0 && i / DW < OW) {
            if (live0)
                plane[b * HWn + 2 * r * OW + i / DW] = EPILOGUE(flags, re[i] / (FH * FW) + b0);
            if (live1)
                plane[b * HWn + (2 * r + 1) * OW + i / DW] = EPILOGUE(flags, -im[i] / (FH * FW) + b0);
        }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = id; e < NBO * HWn; e += NBO * FH / 2) {
        const int p = e / HWn;
        if (n0 + p < B)
            y[y_off + (n0 + p) * SN + k * SK + e - p * HWn] = plane[e];
    }
}
#endif
