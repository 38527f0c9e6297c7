// The linear layers of the model runner and of the MLA prefill's kv_b_proj expansion, for
// every compiler of the family (parameter block: src/kernels/cuda/model_ops.rs): y = x · Wᵀ
// in f32, a tiled SGEMM for many rows and a GEMV for a few.
//
// Layout (row-major, dense, 256-byte aligned allocations): x [T][K], W [N][K] (PyTorch's
// [out_features][in_features]), y [T][N]. `vec4` says that K is a multiple of 4 and x, W are
// 16-byte aligned (checked on the host): the kernels then move float4s. `accumulate` = 1
// computes y += x · Wᵀ instead (a projection added into the residual stream: y is read once,
// by the thread that writes it).
//
// Algorithms:
//   * model_linear_tiled (T > 16): 64×64 output tile per 256-thread block, K in steps of 16.
//     The step's x and W rows are read with coalesced (float4) loads and stored transposed
//     in shared memory ([16][64 + 4]: the padding keeps the float4 reads aligned and spreads
//     the transposing stores); each thread then keeps a 4×4 register block (rows ty·4..
//     features tx·4..) and does 16 FMAs per two float4 shared loads. Loads outside the
//     matrices read zeros and stores outside y are skipped, so any T, K, N work.
//   * model_linear_gemv / _gemv8 / _gemv16 (T ≤ 4 / 8 / 16, memory-bound: every weight
//     element is read once for all T tokens): one warp / wavefront (PA_WAVE lanes) per output feature, 4 per
//     block; lane l reads float4s l, l + PA_WAVE, ... of the weight row (through the
//     read-only path where there is one) and of the T input rows (small: they stay in L1 /
//     L2), keeps one partial sum per token in registers, and the warp reduces them with
//     shuffles; lane 0 writes y[t][f].
//
// Bounds relied on (host checks in src/compute/ and the MLA backends): the sizes match the
// tensors; element counts fit in i64 and T, K, N in i32; grid.y of the tiled kernel =
// ceil(T / 64) ≤ 65535; a GEMV runs only for 1 ≤ T ≤ its width.

#include "common.cuh"

#define MO_THREADS 256
#define LIN_BM 64
#define LIN_BN 64
#define LIN_BK 16
#define LIN_PAD 4
#define GEMV_WARPS 4

struct LinearParams {
    const float* x;
    const float* w;
    float* y;
    int t;
    int k;
    int n;
    int vec4;
    int accumulate;
    int pad_;
};
static_assert(sizeof(LinearParams) == 48, "LinearParams must match src/kernels/cuda/model_ops.rs");

extern "C" __global__ void PA_LAUNCH_BOUNDS(MO_THREADS, 1) model_linear_tiled(const LinearParams p) {
    __shared__ __attribute__((aligned(16))) float as[LIN_BK][LIN_BM + LIN_PAD];
    __shared__ __attribute__((aligned(16))) float bs[LIN_BK][LIN_BN + LIN_PAD];
    const int tid = threadIdx.x;
    const int tx = tid % (LIN_BN / 4);
    const int ty = tid / (LIN_BN / 4);
    const pa_i64 m0 = (pa_i64)blockIdx.y * LIN_BM;
    const pa_i64 n0 = (pa_i64)blockIdx.x * LIN_BN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < p.k; k0 += LIN_BK) {
        if (p.vec4) {
            // 64 rows × 4 float4 per matrix: one float4 of x and one of W per thread.
            const int r = tid / 4;
            const int c = (tid % 4) * 4;
            const bool kin = k0 + c < p.k;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 b = a;
            if (m0 + r < p.t && kin) a = pa_ldg((const float4*)(p.x + (m0 + r) * p.k + k0 + c));
            if (n0 + r < p.n && kin) b = pa_ldg((const float4*)(p.w + (n0 + r) * p.k + k0 + c));
            as[c + 0][r] = a.x;
            as[c + 1][r] = a.y;
            as[c + 2][r] = a.z;
            as[c + 3][r] = a.w;
            bs[c + 0][r] = b.x;
            bs[c + 1][r] = b.y;
            bs[c + 2][r] = b.z;
            bs[c + 3][r] = b.w;
        } else {
            // 64 rows × 16 floats per matrix: four of each per thread, 16 threads per row.
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int e = tid + i * MO_THREADS;
                const int r = e / LIN_BK;
                const int c = e % LIN_BK;
                const bool kin = k0 + c < p.k;
                as[c][r] = (m0 + r < p.t && kin) ? pa_ldg(p.x + (m0 + r) * p.k + k0 + c) : 0.0f;
                bs[c][r] = (n0 + r < p.n && kin) ? pa_ldg(p.w + (n0 + r) * p.k + k0 + c) : 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < LIN_BK; ++kk) {
            const float4 a = *(const float4*)&as[kk][ty * 4];
            const float4 b = *(const float4*)&bs[kk][tx * 4];
            const float av[4] = {a.x, a.y, a.z, a.w};
            const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }

    const pa_i64 nb = n0 + tx * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const pa_i64 m = m0 + ty * 4 + i;
        if (m >= p.t) break;
        float* yr = p.y + m * p.n;
        if (p.n % 4 == 0 && nb + 3 < p.n) {
            float4 v = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            if (p.accumulate) {
                const float4 o = *(const float4*)(yr + nb);
                v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
            }
            *(float4*)(yr + nb) = v;
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (nb + j < p.n) yr[nb + j] = p.accumulate ? yr[nb + j] + acc[i][j] : acc[i][j];
        }
    }
}

// The GEMV for T ≤ MAXT tokens: MAXT partial sums in registers, so each width is its own
// entry point (a 16-wide body for one token keeps fewer weight loads in flight).
template <int MAXT>
__device__ __forceinline__ void linear_gemv(const LinearParams& p) {
    const int lane = threadIdx.x & (PA_WAVE - 1);
    const pa_i64 f = (pa_i64)blockIdx.x * GEMV_WARPS + (threadIdx.x >> PA_WAVE_LOG2);
    if (f >= p.n) return;  // the whole warp: no block-level synchronisation follows
    const int t = p.t;
    float acc[MAXT];
#pragma unroll
    for (int tt = 0; tt < MAXT; ++tt) acc[tt] = 0.0f;
    if (p.vec4) {
        const int kv = p.k / 4;
        const float4* wr = (const float4*)(p.w + f * p.k);
        const float4* xr = (const float4*)p.x;
#pragma unroll 4
        for (int c = lane; c < kv; c += PA_WAVE) {
            const float4 wv = pa_ldg(wr + c);
#pragma unroll
            for (int tt = 0; tt < MAXT; ++tt) {
                if (tt < t) {
                    const float4 xv = pa_ldg(xr + (pa_i64)tt * kv + c);
                    float s = acc[tt];
                    s = fmaf(wv.x, xv.x, s);
                    s = fmaf(wv.y, xv.y, s);
                    s = fmaf(wv.z, xv.z, s);
                    s = fmaf(wv.w, xv.w, s);
                    acc[tt] = s;
                }
            }
        }
    } else {
        const float* wr = p.w + f * p.k;
#pragma unroll 4
        for (int c = lane; c < p.k; c += PA_WAVE) {
            const float wv = pa_ldg(wr + c);
#pragma unroll
            for (int tt = 0; tt < MAXT; ++tt)
                if (tt < t) acc[tt] = fmaf(wv, pa_ldg(p.x + (pa_i64)tt * p.k + c), acc[tt]);
        }
    }
#pragma unroll
    for (int tt = 0; tt < MAXT; ++tt)
        if (tt < t) acc[tt] = pa_warp_sum(acc[tt]);
    if (lane == 0) {
#pragma unroll
        for (int tt = 0; tt < MAXT; ++tt) {
            if (tt < t) {
                float* y = p.y + (pa_i64)tt * p.n + f;
                *y = p.accumulate ? *y + acc[tt] : acc[tt];
            }
        }
    }
}

extern "C" __global__ void PA_LAUNCH_BOUNDS(GEMV_WARPS * PA_WAVE, 1) model_linear_gemv(const LinearParams p) {
    linear_gemv<4>(p);
}

extern "C" __global__ void PA_LAUNCH_BOUNDS(GEMV_WARPS * PA_WAVE, 1) model_linear_gemv8(const LinearParams p) {
    linear_gemv<8>(p);
}

extern "C" __global__ void PA_LAUNCH_BOUNDS(GEMV_WARPS * PA_WAVE, 1) model_linear_gemv16(const LinearParams p) {
    linear_gemv<16>(p);
}
