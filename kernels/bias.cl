// Bias kernels: broadcast in the forward pass, reduction for grad-bias.
#ifndef ACC            // accumulation type of the reduction
#define ACC REAL
#endif
#ifndef WG             // work-group size of bias_grad, a power of two
#define WG 256
#endif

// y[b, k, p] = (y[b, k, p] with EPI_ADD, else 0) + (bias[k] with EPI_BIAS), then ReLU with
// EPI_RELU: the bias before a GEMM adds onto it (beta = 1), a transposed convolution's bias
// after its GEMMs, or a GEMM's output's bias and ReLU in one pass.
__kernel void fill_bias(__global STORE* restrict y, const IDX y_off,
                        __global const STORE* restrict bias, const IDX bias_off,
                        const int B, const int K, const int P, const int flags)
{
    const int p = get_global_id(0);
    const int bk = get_global_id(1);   // b * K + k
    if (p >= P || bk >= B * K) return;
    const IDX i = y_off + (IDX)bk * P + p;
    const REAL v = (flags & EPI_ADD ? LOAD(y, i) : (REAL)0) + (flags & EPI_BIAS ? LOAD(bias, bias_off + bk % K) : (REAL)0);
    SAVE(y, i, EPILOGUE(flags, v));
}

// db[k] = sum over images n and pixels p of dy[n, k, p]. One work-group per k;
// each work-item sums a fixed strided subset, then a tree in local memory:
// a fixed order, so the result is the same on every run.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void bias_grad(__global const STORE* restrict dy, const IDX dy_off,
               __global STORE* restrict db, const IDX db_off,
               const int N, const int K, const int P)
{
    __local ACC part[WG];
    const int k = get_group_id(0);
    const int l = get_local_id(0);
    const IDX total = (IDX)N * P;
    ACC acc = 0;
    for (IDX t = l; t < total; t += WG) {
        const IDX n = t / P, p = t - n * P;
        acc += (ACC)LOAD(dy, dy_off + (n * K + k) * P + p);
    }
    part[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) part[l] += part[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) SAVE(db, db_off + k, (REAL)part[0]);
}


// dx[i] = dy[i] where the fused ReLU's output y[i] is above 0, else 0: the gradient through it.
__kernel void relu_grad(__global const STORE* restrict dy, const IDX dy_off,
                        __global const STORE* restrict y, const IDX y_off,
                        __global STORE* restrict dx, const IDX dx_off, const IDX n)
{
    if (get_global_id(0) >= (size_t)n) return;   // compared before IDX: the rounded-up launch may pass its range
    const IDX i = get_global_id(0);
    SAVE(dx, dx_off + i, LOAD(y, y_off + i) > (REAL)0 ? LOAD(dy, dy_off + i) : (REAL)0);
}
