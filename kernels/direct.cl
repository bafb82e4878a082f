// Direct convolution for groups with few taps: CG input channels per group (CG == 1
// is depthwise, with any channel multiplier KG = K / groups; groups == 1 a dense
// convolution of a few channels), weight (K, CG, KH, KW). No GEMM: each output (or
// input-gradient) element is a short dot product over its group's channels and the
// kernel taps. The arrays are read and written through LOAD and SAVE (clconv.h): float16
// arrays as they are (STORE half), every sum in REAL; grad-weight's partials stay REAL.
#ifndef TAPS           // CG * KH * KW, the grad-weight accumulators per filter (a constant)
#define TAPS 9
#endif
#ifndef WG             // work-group size of direct_weight_partial, a power of two
#define WG 256
#endif
#ifndef RT             // taps direct_weight_partial reduces at once (RT x WG values of local memory)
#define RT 8
#endif

// Every size is an argument, all in one struct (a driver copies each argument of every launch:
// see clconv.h), under the names they had as arguments from the first line of each kernel
// (GEOMETRY_NAMES; fields are lower case, as no #define the host prepends is). The filter's
// shape, stride, dilation, padding and channels per group can also be compile-time constants
// set by the host (KH, ...), so index arithmetic by them folds (no division by a variable) and
// the tap loops unroll.
struct geometry { int n, c, h, w, k, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, cg, kg; };
#define GEOMETRY const struct geometry geo
#define GEOMETRY_NAMES const int N = geo.n, C = geo.c, H = geo.h, W = geo.w, K = geo.k, OH = geo.oh, \
    OW = geo.ow, kh = geo.kh, kw = geo.kw, sh = geo.sh, sw = geo.sw, dh = geo.dh, dw = geo.dw, pt = geo.pt, \
    pl = geo.pl, cg = geo.cg, kg = geo.kg
#ifndef KH             // filter rows and columns
#define KH kh
#endif
#ifndef KW
#define KW kw
#endif
#ifndef SH             // stride
#define SH sh
#endif
#ifndef SW
#define SW sw
#endif
#ifndef DH             // dilation
#define DH dh
#endif
#ifndef DW
#define DW dw
#endif
#ifndef PT             // padding at the top and left
#define PT pt
#endif
#ifndef PL
#define PL pl
#endif
#ifndef CG             // input channels per group
#define CG cg
#endif
#ifndef KG             // filters per group
#define KG kg
#endif

#ifndef TX             // output tile of one work-group: TX x TY pixels of KB (n, k) planes
#define TX 32
#endif
#ifndef TY
#define TY 8
#endif
#ifndef RY             // output rows per work-item in the forward kernel, adjacent
#define RY 1
#endif
#ifndef KB             // filters per work-item in the forward kernel (KG % KB == 0): each
#define KB 1           // patch value read from local memory feeds KB accumulators
#endif
#ifndef NP             // (n, k-block) planes per work-group of the forward kernel, one after
#define NP 1           // another (with AHEAD, the next plane's patch is read during this one's sums)
#endif
// Input patch a forward tile needs (set by the host from stride, dilation and kernel
// size): PH = (TY*RY-1)*SH + (KH-1)*DH + 1 rows, PW = (TX-1)*SW + (KW-1)*DW + 1 columns
// rounded up to a multiple of SW.
#ifndef PH
#define PH 10
#endif
#ifndef PW
#define PW 34
#endif

#ifndef FLIP           // 1: direct_forward computes grad-input of a stride-1 convolution instead (see there)
#define FLIP 0
#endif

#ifndef STAGE          // 1: stage each tile's patch in local memory (GPUs); 0: read global memory
#define STAGE 1        //    directly, with no barriers (CPU devices, where caches do the staging)
#endif
#ifndef WSTAGE         // 1 (with STAGE): the forward's weights too, when they fit
#define WSTAGE 1
#endif
#ifndef WVEC           // 1 (with WSTAGE, KB % 4 == 0): read the staged weights as vectors of 4 filters
#define WVEC 0
#endif

// A build compiles the one kernel the host names in ONLY (its upper-case name; the kernels
// share most of their defines, but each pass is specialised apart, and a build of all of them
// took Intel's CPU compiler 1.7 s), or all of them without ONLY.
#define DIRECT_FORWARD 1
#define DIRECT_INPUT 2
#define DIRECT_WEIGHT_PARTIAL 3
#define DIRECT_ROWS 4
#define DIRECT_WEIGHT_ROWS 5
#define DIRECT_INPUT_ROWS 6
#ifdef ONLY
#define BUILDS(kernel) (ONLY == (kernel))
#else
#define BUILDS(kernel) 1
#endif

// y[n, k, oy, ox] = bias[k] + sum over c < CG, i, j of
//                   w[k, c, i, j] * x[n, (k / KG) * CG + c, oy*SH - PT + i*DH, ox*SW - PL + j*DW]
// Work-group: a TX x (TY*RY) output tile of KB planes (n, k0..k0+KB-1) of one group, for NP
// such blocks nk = n * K / KB + k0 / KB in turn from nk = group id 2 * NP; each work-item
// computes RY adjacent rows of one column for its KB filters. For each input channel of the
// group, the patch under the tile is staged in local memory (with AHEAD, the next channel's,
// or the next block's first, is read meanwhile); per filter column j, a work-item reads the
// PR patch values its RY rows share into registers once, and uses each for every row and
// filter tap that needs it. The KB filters' weights are staged too with WSTAGE (else read in
// place).
// FLIP: for stride 1, grad-input is this same sum over dy with each group's weight
// transposed (its KG filters become the channels) and rotated by 180 degrees; the
// host passes the transposed geometry (x = dy, y = dx, pads (KH-1)*DH - PT, ...),
// so only the weight index changes. The filter w is then (C, KG-as-CG, KH, KW)
// read as w[c0 + c, k % KG, KH-1-i, KW-1-j] of the original (K_orig, Cg_orig, ...).
#if FLIP
#define WBASE(k, c) (((IDX)c0 + (c)) * KG + (k) % KG) * KH * KW
#define TAP(i, j) ((KH - 1 - (i)) * KW + KW - 1 - (j))
#else
#define WBASE(k, c) ((IDX)(k) * CG + (c)) * KH * KW
#define TAP(i, j) ((i) * KW + (j))
#endif
// Where the staged patch keeps column px: grouped by phase px % SW, so that the work-items
// of a row, which read columns SW apart, read neighbouring words (no local-memory bank
// conflicts). COL_AT(lx, d) is COL(lx * SW + d), folded.
#define COL(px) (((px) % SW) * (PW / SW) + (px) / SW)
#define COL_AT(lx, d) (((d) % SW) * (PW / SW) + (lx) + (d) / SW)
// Staging: element e = lid + s * TX * TY of the patch, s < STAGE_READS, is its row py and
// column px, input (y0 + py, x0 + px). Where a work-item's share fits in registers and the
// work-group has at least 32 work-items (AHEAD), it reads the next channel's share while
// summing over the current one (PoCL 3.0's compiler crashed on that form for 2-item groups).
#define STAGE_READS ((PH * PW + TX * TY - 1) / (TX * TY))   // per work-item
#define STAGE_AT(s) const int e = lid + (s) * TX * TY, py = e / PW, px = e - py * PW
#define AHEAD (STAGE_READS <= 16 && TX * TY >= 32)
#define PR ((RY - 1) * SH + (KH - 1) * DH + 1)   // patch rows under a work-item's RY outputs
// Offset in x of the first input channel of block nk's group
#define PLANE_INPUT(nk) (((IDX)((nk) / (K / KB)) * C + ((((nk) % (K / KB)) * KB) / KG) * CG) * H * W)

// Patch element (py, px) of the input plane at x[xb] (0 in the padding).
inline REAL patch_value(__global const STORE* restrict x, const IDX xb, const int y0, const int x0,
                        const int H, const int W, const int py, const int px)
{
    const int iy = y0 + py, ix = x0 + px;
    return iy >= 0 && iy < H && ix >= 0 && ix < W ? LOAD(x, xb + iy * W + ix) : (REAL)0;
}

// A work-item's share of the patch of the input plane at x[xb].
inline void read_patch(REAL* got, __global const STORE* restrict x, const IDX xb, const int y0, const int x0,
                       const int H, const int W, const int lid)
{
    for (int s = 0; s < STAGE_READS; ++s) {
        STAGE_AT(s);
        got[s] = e < PH * PW ? patch_value(x, xb, y0, x0, H, W, py, px) : (REAL)0;
    }
}
#if BUILDS(DIRECT_FORWARD)
__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void direct_forward(__global const STORE* restrict x, const IDX x_off,
                    __global const STORE* restrict w, const IDX w_off,
                    __global const STORE* restrict bias, const IDX bias_off, const int flags,
                    __global STORE* restrict y, const IDX y_off, GEOMETRY)
{
    GEOMETRY_NAMES;
#if STAGE
    __local REAL patch[PH][PW];
    const int lid = get_local_id(1) * TX + get_local_id(0);
#endif
#if STAGE && WSTAGE
    // the KB filters' weights, tap by tap; with WVEC four filters' at a time are one local read
#if WVEC
    __local REAL4 wl4[CG * KH * KW][KB / 4];
    __local REAL* const wl = (__local REAL*)wl4;
#else
    __local REAL wl[CG * KH * KW * KB];
#endif
#endif
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int ox = get_group_id(0) * TX + lx, oy0 = (get_group_id(1) * TY + ly) * RY;
    const int y0 = get_group_id(1) * TY * RY * SH - PT, x0 = get_group_id(0) * TX * SW - PL;
    // this work-group's planes: (n, k-block) nk0 .. nk0 + np - 1, one after another
    const int nk0 = get_group_id(2) * NP, np = min(NP, N * (K / KB) - nk0);
#if STAGE && AHEAD
    // With AHEAD, each work-item reads its share of the next channel's patch (or the next
    // plane's first) ahead, into registers: all its reads are in flight together, and overlap
    // the sums over this channel.
    REAL got[STAGE_READS];
    read_patch(got, x, x_off + PLANE_INPUT(nk0), y0, x0, H, W, lid);
#endif
    for (int p = 0; p < np; ++p) {
        const int nk = nk0 + p;
        const int k0 = (nk % (K / KB)) * KB, n = nk / (K / KB), c0 = (k0 / KG) * CG;
        REAL acc[KB][RY];
        for (int b = 0; b < KB; ++b)
            for (int r = 0; r < RY; ++r) acc[b][r] = (flags & EPI_BIAS) ? LOAD(bias, bias_off + k0 + b) : (REAL)0;
#if STAGE && WSTAGE
        for (int e = lid; e < CG * KH * KW * KB; e += TX * TY) {   // read after the first barrier below
            const int b = e % KB, ct = e / KB, c = ct / (KH * KW), t = ct % (KH * KW);
            wl[e] = LOAD(w, w_off + WBASE(k0 + b, c) + TAP(t / KW, t % KW));
        }
#define WEIGHT(b, c, i, j) wl[(((c) * KH + (i)) * KW + (j)) * KB + (b)]
#else
#define WEIGHT(b, c, i, j) LOAD(w, w_off + WBASE(k0 + (b), c) + TAP(i, j))
#endif
#if STAGE
        for (int c = 0; c < CG; ++c) {
            const IDX xb = x_off + ((IDX)n * C + c0 + c) * H * W;   // this channel's input plane
            for (int s = 0; s < STAGE_READS; ++s) {
                STAGE_AT(s);
#if AHEAD
                if (e < PH * PW) patch[py][COL(px)] = got[s];
#else
                if (e < PH * PW) patch[py][COL(px)] = patch_value(x, xb, y0, x0, H, W, py, px);
#endif
            }
            barrier(CLK_LOCAL_MEM_FENCE);
#if AHEAD
            if (c + 1 < CG) read_patch(got, x, xb + (IDX)H * W, y0, x0, H, W, lid);
            else if (p + 1 < np) read_patch(got, x, x_off + PLANE_INPUT(nk + 1), y0, x0, H, W, lid);
#endif
            for (int j = 0; j < KW; ++j) {
                REAL v[PR];    // column lx * SW + j * DW of the rows under this work-item's RY outputs
                for (int t = 0; t < PR; ++t) v[t] = patch[ly * RY * SH + t][COL_AT(lx, j * DW)];
                for (int i = 0; i < KH; ++i) {
                    REAL wv[KB];   // the KB filters' weights at tap (i, j)
#if WVEC
                    for (int b = 0; b < KB; b += 4) {
                        const REAL4 q = wl4[(c * KH + i) * KW + j][b / 4];
                        wv[b] = q.s0, wv[b + 1] = q.s1, wv[b + 2] = q.s2, wv[b + 3] = q.s3;
                    }
#else
                    for (int b = 0; b < KB; ++b) wv[b] = WEIGHT(b, c, i, j);
#endif
                    for (int b = 0; b < KB; ++b)
                        for (int r = 0; r < RY; ++r) acc[b][r] += wv[b] * v[r * SH + i * DH];
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
#else
        for (int c = 0; c < CG; ++c) {
            const IDX xb = x_off + ((IDX)n * C + c0 + c) * H * W;
            for (int r = 0; r < RY; ++r)
                for (int i = 0; i < KH; ++i) {
                    const int iy = y0 + (ly * RY + r) * SH + i * DH;
                    if (iy < 0 || iy >= H) continue;
                    for (int j = 0; j < KW; ++j) {
                        const int ix = x0 + lx * SW + j * DW;
                        if (ix < 0 || ix >= W) continue;
                        const REAL v = LOAD(x, xb + iy * W + ix);
                        for (int b = 0; b < KB; ++b)
                            acc[b][r] += WEIGHT(b, c, i, j) * v;
                    }
                }
        }
#endif
        for (int b = 0; b < KB; ++b)
            for (int r = 0; r < RY; ++r) {
                const int oy = oy0 + r;
                if (ox < OW && oy < OH)
                    SAVE(y, y_off + ((IDX)n * K + k0 + b) * OH * OW + oy * OW + ox, EPILOGUE(flags, acc[b][r]));
            }
#undef WEIGHT
    }
}
#endif

// dx[n, c, iy, ix] = sum over the KG filters k of c's group and the taps that read
// (iy, ix) of w[k, c % CG, i, j] * dy[n, k, oy, ox]. Overwrites dx; fixed order.
// Work-group: a TX x TY tile of plane (n, c) = group id 2. Only a fraction of the
// taps meets the output grid when strided, so dy is read from global memory
// directly (staging it measured slower on GPUs).
#if BUILDS(DIRECT_INPUT)
__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void direct_input(__global const STORE* restrict w, const IDX w_off,
                  __global const STORE* restrict dy, const IDX dy_off,
                  __global STORE* restrict dx, const IDX dx_off, GEOMETRY)
{
    GEOMETRY_NAMES;
    const int ix = get_global_id(0), iy = get_global_id(1), nc = get_global_id(2);
    if (ix >= W || iy >= H) return;
    const int c = nc % C, n = nc / C, k0 = (c / CG) * KG, cw = c % CG;
    // Only taps t with (position + pad - t * D) a non-negative multiple of the stride read
    // this pixel; undilated, they are t = (position + pad) % S, then every S-th.
    const int i0 = DH == 1 ? (iy + PT) % SH : 0, di = DH == 1 ? SH : 1;
    const int j0 = DW == 1 ? (ix + PL) % SW : 0, dj = DW == 1 ? SW : 1;
    REAL acc = (REAL)0;
    for (int m = 0; m < KG; ++m) {
        const int k = k0 + m;
        const IDX db = dy_off + ((IDX)n * K + k) * OH * OW;
        const IDX wb = w_off + ((IDX)k * CG + cw) * KH * KW;
        for (int i = i0; i < KH; i += di) {
            const int ny = iy + PT - i * DH;          // = oy * SH when tap i reads row iy
            if (ny < 0) break;                        // ny only falls as i grows
            if (ny % SH) continue;
            const int oy = ny / SH;
            if (oy >= OH) continue;
            for (int j = j0; j < KW; j += dj) {
                const int nx = ix + PL - j * DW;
                if (nx < 0) break;
                if (nx % SW) continue;
                const int ox = nx / SW;
                if (ox < OW) acc += LOAD(w, wb + i * KW + j) * LOAD(dy, db + oy * OW + ox);
            }
        }
    }
    SAVE(dx, dx_off + (IDX)nc * H * W + iy * W + ix, acc);
}
#endif

// grad-weight, stage 1 of 2. Work-group (k, s) sums dy[n, k, p] * x[n, c, ...] for
// every (c, i, j) of filter k over slice s of the N*OH*OW positions, each work-item
// a fixed strided subset, then a tree in local memory, RT taps per pass of the tree so
// that a filter's taps take few barriers (a 7x7 filter: 7 passes, not 49):
// part[(s * K + k) * TAPS + tap], then summed over s in order (partials.cl).
#if BUILDS(DIRECT_WEIGHT_PARTIAL)
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void direct_weight_partial(__global const STORE* restrict x, const IDX x_off,
                           __global const STORE* restrict dy, const IDX dy_off,
                           __global REAL* restrict part, const int S, GEOMETRY)
{
    GEOMETRY_NAMES;
    __local REAL red[RT][WG];
    const int k = get_group_id(0) / S, s = get_group_id(0) % S, l = get_local_id(0);
    const int c0 = (k / KG) * CG, P = OH * OW;
    const IDX total = (IDX)N * P;
    const IDX per = (total + S - 1) / S;
    const IDX begin = per * s;
    const IDX end = min(total, begin + per);
    REAL acc[TAPS];
    for (int t = 0; t < TAPS; ++t) acc[t] = (REAL)0;
    for (IDX t = begin + l; t < end; t += WG) {
        const int n = t / P, p = t - (IDX)n * P;
        const int oy = p / OW, ox = p - oy * OW;
        const REAL g = LOAD(dy, dy_off + ((IDX)n * K + k) * P + p);
        for (int c = 0; c < CG; ++c) {
            const IDX xb = x_off + ((IDX)n * C + c0 + c) * H * W;
            for (int i = 0; i < KH; ++i) {
                const int iy = oy * SH - PT + i * DH;
                if (iy < 0 || iy >= H) continue;
                for (int j = 0; j < KW; ++j) {
                    const int ix = ox * SW - PL + j * DW;
                    if (ix >= 0 && ix < W) acc[(c * KH + i) * KW + j] += g * LOAD(x, xb + iy * W + ix);
                }
            }
        }
    }
    for (int t0 = 0; t0 < TAPS; t0 += RT) {
        for (int r = 0; r < RT; ++r)
            if (t0 + r < TAPS) red[r][l] = acc[t0 + r];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int h = WG / 2; h > 0; h >>= 1) {
            if (l < h)
                for (int r = 0; r < RT; ++r)
                    if (t0 + r < TAPS) red[r][l] += red[r][l + h];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        for (int r = l; r < RT && t0 + r < TAPS; r += WG)   // (a work-group can be smaller than RT)
            part[((IDX)s * K + k) * TAPS + t0 + r] = red[r][0];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
#endif

// ---- CPU devices ----------------------------------------------------------------------
// CPU runtimes run a work-group's work-items as a loop and vectorise one work-item as far
// as it is written with vectors, so these kernels give each work-item whole output rows,
// VW columns at a time: work-groups of one work-item, no local memory, no barriers.
#ifndef VW             // values per vector of the row kernels: 4 or 8
#define VW 8
#endif
#ifndef RB             // output rows per work-item of direct_rows and direct_input_rows
#define RB 1
#endif
#ifndef RNV            // > 0: direct_rows' output rows are RNV vectors at most (short rows, see there)
#define RNV 0
#endif
#ifndef RR             // direct_rows' output rows summed at once (see there)
#define RR 1
#endif
typedef union { REALV v; REAL s[VW]; } lanes;   // a vector and its values

// The first `count` values of v (all VW of them where count >= VW) at yr, through the epilogue.
inline void store_outputs(__global STORE* restrict yr, const REALV v, const int count, const int flags)
{
    lanes out;
    out.v = v;
    if (count >= VW) {
        _Pragma("unroll") for (int q = 0; q < VW; ++q) SAVE(yr, q, EPILOGUE(flags, out.s[q]));
    } else {
        for (int q = 0; q < count; ++q) SAVE(yr, q, EPILOGUE(flags, out.s[q]));
    }
}

// VW values of input row xr at columns ix0, ix0 + SW, ... (zero outside 0 .. W - 1), as
// consecutive scalars, which the compiler merges into vector loads (PoCL 3.0 calls its
// vloadn builtins as functions).
inline REALV row_values(__global const STORE* restrict xr, const int ix0, const int W)
{
    lanes v;
#if SW == 2   // 2 * VW consecutive values, then the even ones: no strided loads (taking them with
              // a vector's .even crashed Oclgrind 21.10's uninitialised-value tracking)
    if (ix0 >= 0 && ix0 + 2 * VW - 1 < W) {
        REAL r[2 * VW];
        _Pragma("unroll") for (int q = 0; q < 2 * VW; ++q) r[q] = LOAD(xr, ix0 + q);
        _Pragma("unroll") for (int q = 0; q < VW; ++q) v.s[q] = r[2 * q];
        return v.v;
    }
    {
#else
    if (ix0 >= 0 && ix0 + (VW - 1) * SW < W) {
        _Pragma("unroll") for (int q = 0; q < VW; ++q) v.s[q] = LOAD(xr, ix0 + q * SW);
    } else {
#endif
        _Pragma("unroll") for (int q = 0; q < VW; ++q) {
            const int ix = ix0 + q * SW;
            v.s[q] = ix >= 0 && ix < W ? LOAD(xr, ix) : (REAL)0;
        }
    }
    return v.v;
}

// The same sum as direct_forward (FLIP included), for CPU devices: work-item (band, nk)
// computes RB output rows from band * RB of the KB planes (n, k0 .. k0 + KB - 1), VW
// columns at a time, each input row value of a tap loaded once for the KB filters.
// Short rows (RNV > 0: a row of outputs is RNV vectors at most) take a row at once instead:
// the input values it reads under one tap row, RLEN of them zero-padded, are loaded once into
// private memory, and every tap's vector is taken from there. Over a row of 7 outputs every
// tap's vector otherwise straddles the padding or the row's end and is loaded lane by lane.
// Longer rows with RR > 1 sum RR output rows at once: each input row vector is loaded once
// for every tap row that reads it into one of the RR rows ((RR - 1) * SH + (KH - 1) * DH + 1
// input rows per KW taps, for RR * KH * KW multiply-adds), not once per multiply-add.
#if RNV
#define RLEN ((RNV * VW - 1) * SW + (KW - 1) * DW + 1)
#endif
// Longer rows with LPAD > 0 first copy the work-item's input rows, zero-padded on every side,
// into LPAD values of local memory (LR rows of each of the group's channels, one row as long as
// every vector of a row needs), and read every vector from there: no padding checks, one vector
// load each, where a vector at a row's edge otherwise is loaded lane by lane with a test each.
#ifndef LPAD
#define LPAD 0
#endif
#define LR ((((RB) + RR - 1) / RR * RR - 1) * SH + (KH - 1) * DH + 1)

// Values per band row: every vector of an output row's columns, -PL .. BAND_WIDTH - PL - 1.
#define BAND_WIDTH (((OW) + VW - 1) / VW * VW * SW + (KW - 1) * DW)

// Input row xr (W values) into band row br, zero-padded (its lw columns start at -PL).
inline void band_row(__local REAL* restrict br, __global const STORE* restrict xr, const int lw, const int W)
{
    for (int q = 0; q < lw; ++q) {
        const int ix = q - PL;
        br[q] = ix >= 0 && ix < W ? LOAD(xr, ix) : (REAL)0;
    }
}

// VW values of a zero-padded row in local memory from column q0, SW apart (as row_values).
inline REALV band_values(__local const REAL* restrict br, const int q0)
{
    lanes v;
#if SW == 2
    REAL r[2 * VW];
    _Pragma("unroll") for (int q = 0; q < 2 * VW; ++q) r[q] = br[q0 + q];
    _Pragma("unroll") for (int q = 0; q < VW; ++q) v.s[q] = r[2 * q];
#else
    _Pragma("unroll") for (int q = 0; q < VW; ++q) v.s[q] = br[q0 + q * SW];
#endif
    return v.v;
}
#if BUILDS(DIRECT_ROWS)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void direct_rows(__global const STORE* restrict x, const IDX x_off,
                 __global const STORE* restrict w, const IDX w_off,
                 __global const STORE* restrict bias, const IDX bias_off, const int flags,
                 __global STORE* restrict y, const IDX y_off, GEOMETRY)
{
    GEOMETRY_NAMES;
    const int nk = get_global_id(1);
    const int k0 = (nk % (K / KB)) * KB, n = nk / (K / KB), c0 = (k0 / KG) * CG;
    const int oy_end = min(OH, (int)(get_global_id(0) + 1) * RB);
    REAL bk[KB];
    _Pragma("unroll") for (int b = 0; b < KB; ++b) bk[b] = (flags & EPI_BIAS) ? LOAD(bias, bias_off + k0 + b) : (REAL)0;
#if RNV   // (with RR output rows at once, as below)
    for (int oy0 = get_global_id(0) * RB; oy0 < oy_end; oy0 += RR) {
        REALV acc[KB][RR][RNV];
        _Pragma("unroll") for (int b = 0; b < KB; ++b)
            _Pragma("unroll") for (int o = 0; o < RR; ++o)
                _Pragma("unroll") for (int u = 0; u < RNV; ++u) acc[b][o][u] = (REALV)bk[b];
        for (int c = 0; c < CG; ++c) {
            __global const STORE* xc = x + x_off + ((IDX)n * C + c0 + c) * H * W;
            _Pragma("unroll") for (int t = 0; t < (RR - 1) * SH + (KH - 1) * DH + 1; ++t) {
                const int iy = oy0 * SH - PT + t;
                if (iy < 0 || iy >= H) continue;
                __global const STORE* xr = xc + iy * W;
                REAL r[RLEN];   // input columns -PL ... -PL + RLEN - 1, zero outside the row
                _Pragma("unroll") for (int q = 0; q < RLEN; ++q) {
                    const int ix = q - PL;
                    r[q] = ix >= 0 && ix < W ? LOAD(xr, ix) : (REAL)0;
                }
                _Pragma("unroll") for (int j = 0; j < KW; ++j)
                    _Pragma("unroll") for (int u = 0; u < RNV; ++u) {
                        lanes v;
                        _Pragma("unroll") for (int q = 0; q < VW; ++q) v.s[q] = r[(u * VW + q) * SW + j * DW];
                        _Pragma("unroll") for (int o = 0; o < RR; ++o) {
                            const int d = t - o * SH;   // tap row d / DH of output row oy0 + o
                            if (d < 0 || d % DH || d / DH >= KH) continue;
                            _Pragma("unroll") for (int b = 0; b < KB; ++b)
                                acc[b][o][u] = MADD((REALV)LOAD(w, w_off + WBASE(k0 + b, c) + TAP(d / DH, j)), v.v,
                                                    acc[b][o][u]);
                        }
                    }
            }
        }
        _Pragma("unroll") for (int o = 0; o < RR; ++o)
            if (oy0 + o < oy_end)
                _Pragma("unroll") for (int b = 0; b < KB; ++b)
                    _Pragma("unroll") for (int u = 0; u < RNV; ++u)
                        store_outputs(y + y_off + ((IDX)n * K + k0 + b) * OH * OW + (oy0 + o) * OW + u * VW,
                                      acc[b][o][u], OW - u * VW, flags);
    }
#else   // RR output rows at once (one where RR is 1)
#if LPAD
    __local REAL band[LPAD];   // channel c's input row iy0 + r at band[(c * LR + r) * lw]
    const int lw = BAND_WIDTH, iy0 = (int)get_global_id(0) * RB * SH - PT;
    for (int c = 0; c < CG; ++c) {
        __global const STORE* xc = x + x_off + ((IDX)n * C + c0 + c) * H * W;
        for (int r = 0; r < LR; ++r)
            if (iy0 + r >= 0 && iy0 + r < H)   // (rows outside the image are never read)
                band_row(band + (c * LR + r) * lw, xc + (iy0 + r) * W, lw, W);
    }
#define INPUT_VECTOR(c, iy, ix0) band_values(band + ((c) * LR + (iy) - iy0) * lw, (ix0) + PL)
#else
#define INPUT_VECTOR(c, iy, ix0) row_values(xc + (iy) * W, (ix0), W)
#endif
    for (int oy0 = get_global_id(0) * RB; oy0 < oy_end; oy0 += RR) {
        for (int ox0 = 0; ox0 < OW; ox0 += VW) {
            REALV acc[KB][RR];
            _Pragma("unroll") for (int b = 0; b < KB; ++b)
                _Pragma("unroll") for (int r = 0; r < RR; ++r) acc[b][r] = (REALV)bk[b];
            for (int c = 0; c < CG; ++c) {
                __global const STORE* xc = x + x_off + ((IDX)n * C + c0 + c) * H * W;
                // input row oy0 * SH - PT + t is tap row (t - r * SH) / DH of output row oy0 + r
                _Pragma("unroll") for (int t = 0; t < (RR - 1) * SH + (KH - 1) * DH + 1; ++t) {
                    const int iy = oy0 * SH - PT + t;
                    if (iy < 0 || iy >= H) continue;
                    _Pragma("unroll") for (int j = 0; j < KW; ++j) {
                        const REALV v = INPUT_VECTOR(c, iy, ox0 * SW - PL + j * DW);
                        _Pragma("unroll") for (int r = 0; r < RR; ++r) {
                            const int d = t - r * SH;   // (folds: t and r are unrolled)
                            if (d < 0 || d % DH || d / DH >= KH) continue;
                            _Pragma("unroll") for (int b = 0; b < KB; ++b)
                                acc[b][r] = MADD((REALV)LOAD(w, w_off + WBASE(k0 + b, c) + TAP(d / DH, j)), v, acc[b][r]);
                        }
                    }
                }
            }
            _Pragma("unroll") for (int r = 0; r < RR; ++r)
                if (oy0 + r < oy_end)
                    _Pragma("unroll") for (int b = 0; b < KB; ++b)
                        store_outputs(y + y_off + ((IDX)n * K + k0 + b) * OH * OW + (oy0 + r) * OW + ox0, acc[b][r],
                                      OW - ox0, flags);
        }
    }
#endif
}
#endif

// VW consecutive values p[o0 .. o0 + VW - 1], zero outside 0 .. n - 1.
inline REALV span_values(__global const STORE* restrict p, const int o0, const int n)
{
    lanes v;
    if (o0 >= 0 && o0 + VW <= n) {
        _Pragma("unroll") for (int q = 0; q < VW; ++q) v.s[q] = LOAD(p, o0 + q);
    } else {
        _Pragma("unroll") for (int q = 0; q < VW; ++q) v.s[q] = o0 + q >= 0 && o0 + q < n ? LOAD(p, o0 + q) : (REAL)0;
    }
    return v.v;
}

// grad-weight stage 1 for CPU devices: work-item (k, s) sums dy[n, k, oy, ox] *
// x[n, c, ...] for every tap of filter k over slice s of the N * OH output rows, VW columns at
// a time into one vector per tap of a channel (channel by channel, so the accumulators stay
// in registers), then across the vectors: part[(s * K + k) * TAPS + tap], as stage 1 above.
// With LPAD > 0 the input rows under up to BR output rows of one image are first copied,
// zero-padded, into local memory (as direct_rows' band) and every input vector is read there.
#ifndef BR             // output rows of one image direct_weight_rows' band serves
#define BR 1
#endif
#if BUILDS(DIRECT_WEIGHT_ROWS)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void direct_weight_rows(__global const STORE* restrict x, const IDX x_off,
                        __global const STORE* restrict dy, const IDX dy_off,
                        __global REAL* restrict part, const int S, GEOMETRY)
{
    GEOMETRY_NAMES;
    const int k = get_global_id(0) / S, s = get_global_id(0) % S;
    const int c0 = (k / KG) * CG, rows = N * OH, per = (rows + S - 1) / S;
    const int begin = per * s, end = min(rows, begin + per);
#if LPAD   // input row iy0 + r at band[r * lw], columns -PL .. lw - PL - 1
    __local REAL band[LPAD];
    const int lw = BAND_WIDTH;
#define WEIGHT_INPUT(iy, ix0) band_values(band + ((iy) - iy0) * lw, (ix0) + PL)
#else
#define WEIGHT_INPUT(iy, ix0) row_values(xc + (iy) * W, (ix0), W)
#endif
    for (int c = 0; c < CG; ++c) {
        REALV acc[KH * KW];
        _Pragma("unroll") for (int t = 0; t < KH * KW; ++t) acc[t] = 0;
        for (int row = begin; row < end; ) {
            const int n = row / OH, oy_begin = row - n * OH;
            const int oy_end = min(min(OH, oy_begin + BR), end - n * OH);   // this image's rows, BR at most
            __global const STORE* xc = x + x_off + ((IDX)n * C + c0 + c) * H * W;
#if LPAD
            const int iy0 = oy_begin * SH - PT;
            for (int r = 0; r < (oy_end - oy_begin - 1) * SH + (KH - 1) * DH + 1; ++r)
                if (iy0 + r >= 0 && iy0 + r < H)   // (rows outside the image are never read)
                    band_row(band + r * lw, xc + (iy0 + r) * W, lw, W);
#endif
            for (int oy = oy_begin; oy < oy_end; ++oy) {
                __global const STORE* g = dy + dy_off + ((IDX)n * K + k) * OH * OW + oy * OW;
                for (int ox0 = 0; ox0 < OW; ox0 += VW) {
                    const REALV gr = span_values(g, ox0, OW);   // zero past the row's end: adds nothing
                    _Pragma("unroll") for (int i = 0; i < KH; ++i) {
                        const int iy = oy * SH - PT + i * DH;
                        if (iy < 0 || iy >= H) continue;
                        _Pragma("unroll") for (int j = 0; j < KW; ++j)
                            acc[i * KW + j] = MADD(gr, WEIGHT_INPUT(iy, ox0 * SW - PL + j * DW), acc[i * KW + j]);
                    }
                }
            }
            row += oy_end - oy_begin;
        }
        _Pragma("unroll") for (int t = 0; t < KH * KW; ++t) {
            lanes a;
            a.v = acc[t];
            REAL sum = 0;
            _Pragma("unroll") for (int q = 0; q < VW; ++q) sum += a.s[q];
            part[((IDX)s * K + k) * TAPS + c * KH * KW + t] = sum;
        }
    }
}
#endif

// Columns px + (u0 + q) * SW of row rb from lanes q of out, up to the phase's count columns: a
// whole vector's unrolled, without a test per lane (measured faster on PoCL for strided depthwise
// and grouped grad-inputs on large maps; no change on Intel's runtime).
#define STORE_PHASE(rb, out, px, u0, count)                                                     \
    do {                                                                                        \
        if ((u0) + VW <= (count)) {                                                             \
            _Pragma("unroll") for (int q = 0; q < VW; ++q) SAVE(rb, (px) + ((u0) + q) * SW, (out).s[q]); \
        } else {                                                                                \
            for (int q = 0; q < VW && (u0) + q < (count); ++q) SAVE(rb, (px) + ((u0) + q) * SW, (out).s[q]); \
        }                                                                                       \
    } while (0)

// direct_input's sum for CPU devices: work-item (band, (n * C + c) / CB) computes RB input-gradient
// rows from band * RB of the CB planes (n, c .. c + CB - 1), channels of one group, which read
// the same grad_output. A row's columns are taken by stride phase px, VW at a time: columns px,
// px + SW, ... meet the output grid through the same taps j, at consecutive output columns, so
// each (filter, tap) adds one vector of grad_output, loaded once for the CB channels. With RI > 1
// a work-item sums RI input rows at once, each grad_output vector loaded once for every one of
// them that it reaches (through tap row (iy + PT - oy * SH) / DH), not once per row and tap.
#ifndef CB             // input channels per work-item of direct_input_rows (dividing CG)
#define CB 1
#endif
#ifndef RI             // input-gradient rows direct_input_rows sums at once (see there)
#define RI 1
#endif
#if BUILDS(DIRECT_INPUT_ROWS)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void direct_input_rows(__global const STORE* restrict w, const IDX w_off,
                       __global const STORE* restrict dy, const IDX dy_off,
                       __global STORE* restrict dx, const IDX dx_off, GEOMETRY)
{
    GEOMETRY_NAMES;
    const int nc = get_global_id(1) * CB, c0 = nc % C, n = nc / C, k0 = (c0 / CG) * KG, cw = c0 % CG;
    const int iy_end = min(H, (int)(get_global_id(0) + 1) * RB);
#if RI > 1
    for (int iy0 = get_global_id(0) * RB; iy0 < iy_end; iy0 += RI) {
        __global STORE* row = dx + dx_off + (IDX)nc * H * W + iy0 * W;
        // the grad_output rows that reach input rows iy0 ... iy0 + RI - 1
        const int lo = iy0 + PT - (KH - 1) * DH, oy_lo = lo <= 0 ? 0 : (lo + SH - 1) / SH;
        const int oy_hi = min(OH - 1, (iy0 + RI - 1 + PT) / SH);
        for (int px = 0; px < SW && px < W; ++px) {
            const int count = (W - px + SW - 1) / SW;   // columns of this phase
            for (int u0 = 0; u0 < count; u0 += VW) {
                REALV acc[CB][RI];
                _Pragma("unroll") for (int b = 0; b < CB; ++b)
                    _Pragma("unroll") for (int r = 0; r < RI; ++r) acc[b][r] = 0;
                for (int m = 0; m < KG; ++m) {
                    const __global STORE* dk = dy + dy_off + ((IDX)n * K + k0 + m) * OH * OW;
                    const __global STORE* wk = w + w_off + ((IDX)(k0 + m) * CG + cw) * KH * KW;
                    for (int oy = oy_lo; oy <= oy_hi; ++oy) {
                        _Pragma("unroll") for (int j = 0; j < KW; ++j) {
                            const int nx = px + PL - j * DW;   // = ox * SW for column u = 0 of this phase
                            if (nx % SW) continue;
                            const REALV v = span_values(dk + oy * OW, nx / SW + u0, OW);
                            _Pragma("unroll") for (int r = 0; r < RI; ++r) {
                                const int d = iy0 + r + PT - oy * SH;   // = i * DH, tap row i reading row iy0 + r
                                if (d < 0 || d % DH || d / DH >= KH) continue;
                                _Pragma("unroll") for (int b = 0; b < CB; ++b)
                                    acc[b][r] = MADD((REALV)LOAD(wk, b * KH * KW + d / DH * KW + j), v, acc[b][r]);
                            }
                        }
                    }
                }
                _Pragma("unroll") for (int r = 0; r < RI; ++r) {
                    if (iy0 + r >= iy_end) break;
                    _Pragma("unroll") for (int b = 0; b < CB; ++b) {
                        lanes out;
                        out.v = acc[b][r];
                        __global STORE* rb = row + (IDX)b * H * W + r * W;
                        STORE_PHASE(rb, out, px, u0, count);
                    }
                }
            }
        }
    }
#else
    for (int iy = get_global_id(0) * RB; iy < iy_end; ++iy) {
        __global STORE* row = dx + dx_off + (IDX)nc * H * W + iy * W;
        for (int px = 0; px < SW && px < W; ++px) {
            const int count = (W - px + SW - 1) / SW;   // columns of this phase
            for (int u0 = 0; u0 < count; u0 += VW) {
                REALV acc[CB];
                _Pragma("unroll") for (int b = 0; b < CB; ++b) acc[b] = 0;
                for (int m = 0; m < KG; ++m) {
                    const __global STORE* dk = dy + dy_off + ((IDX)n * K + k0 + m) * OH * OW;
                    // filter m's taps for channel cw + b at wk + b * KH * KW
                    const __global STORE* wk = w + w_off + ((IDX)(k0 + m) * CG + cw) * KH * KW;
                    _Pragma("unroll") for (int i = 0; i < KH; ++i) {
                        const int ny = iy + PT - i * DH;   // = oy * SH where tap i reads row iy
                        if (ny % SH || ny < 0 || ny / SH >= OH) continue;
                        _Pragma("unroll") for (int j = 0; j < KW; ++j) {
                            const int nx = px + PL - j * DW;   // = ox * SW for column u = 0 of this phase
                            if (nx % SW) continue;
                            const REALV v = span_values(dk + ny / SH * OW, nx / SW + u0, OW);
                            _Pragma("unroll") for (int b = 0; b < CB; ++b)
                                acc[b] = MADD((REALV)LOAD(wk, b * KH * KW + i * KW + j), v, acc[b]);
                        }
                    }
                }
                _Pragma("unroll") for (int b = 0; b < CB; ++b) {
                    lanes out;
                    out.v = acc[b];
                    __global STORE* rb = row + (IDX)b * H * W;
                    STORE_PHASE(rb, out, px, u0, count);
                }
            }
        }
    }
#endif
}
#endif
