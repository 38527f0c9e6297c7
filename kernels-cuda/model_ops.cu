// Model operations around attention, for src/compute/cuda.rs (parameter blocks: src/kernels/cuda/model_ops.rs): embedding / row gather,
// RMSNorm, linear (a tiled SGEMM for prefill, a GEMV for decode), RoPE, SiLU·mul and the
// residual add. Everything is f32 and runs on the device's one stream.
//
// Layout (all row-major, dense, each tensor its own allocation — so 256-byte aligned):
//   gather     table [rows][H], ids [T] i32, out [T][H]
//   rms_norm   x, y [T][H], weight [H]
//   linear     x [T][K], W [N][K] (PyTorch's [out_features][in_features]), y [T][N]
//   rope       x [T][heads][d] (in place), positions [T] i32
//   silu_mul   gate, up, out [n];  add: x [n] += y [n]
// `vec4` parameters say that the row length (H, K) or element count is a multiple of 4 and
// the pointers are 16-byte aligned (checked on the host): the kernels then move float4s.
//
// Algorithms:
//   * model_gather: grid-stride loop, one thread per output element (or float4). An index
//     outside [0, rows) gives a row of zeros; the table is never read outside its rows.
//   * model_rms_norm: one block per row (grid-stride over rows); each thread sums squares
//     over a strided slice, warp shuffles then one warp reduce the block's partials, then
//     y = x · (1 / sqrtf(sum / H + eps)) · w (IEEE sqrt and division: NVRTC's defaults).
//   * model_linear_tiled (T > 4): 64×64 output tile per 256-thread block, K in steps of 16.
//     The step's x and W rows are read with coalesced (float4) loads and stored transposed
//     in shared memory ([16][64 + 4]: the padding keeps the float4 reads aligned and spreads
//     the transposing stores); each thread then keeps a 4×4 register block (rows ty·4..
//     features tx·4..) and does 16 FMAs per two float4 shared loads. Loads outside the
//     matrices read zeros and stores outside y are skipped, so any T, K, N work.
//   * model_linear_gemv (T ≤ 4, memory-bound): one warp per output feature, 4 warps per
//     block; lane l reads float4s l, l+32, ... of the weight row (512 contiguous bytes per
//     warp step, through the read-only path) and of the T ≤ 4 input rows (cached), keeps one
//     partial sum per token, and the warp reduces them with shuffles; lane 0 writes y[t][f].
//   * model_rope: one thread per (token, head, pair i); inv_freq = powf(base, -2i/d) and
//     angle = float(pos) · inv_freq in f32 (positions in the thousands differ from the f64
//     CPU reference by ~1e-4 rad from the product's rounding), reduced to [-π, π]
//     (Cody–Waite with fmaf, 2π = 6.28125 + 1.9353e-3) before __sinf / __cosf, which are
//     accurate to ~2^-21 there. Pairs are (2i, 2i+1) (interleaved) or (i, i + d/2).
//   * model_silu_mul / model_add: grid-stride element-wise; silu(g) = g / (1 + expf(-g)).
//
// Bounds relied on (host checks in src/compute/mod.rs and src/compute/cuda.rs): every size
// in the parameter block matches the tensors' shapes; element counts fit in i64 and T, K, N,
// H, heads, d in i32; grid.y of the tiled kernel = ceil(T / 64) ≤ 65535. Ids and positions
// are data: ids are range-checked here, positions only feed arithmetic.

#include "common.cuh"

#define MO_THREADS 256
#define LIN_BM 64
#define LIN_BN 64
#define LIN_BK 16
#define LIN_PAD 4
#define GEMV_WARPS 4

// ---------------------------------------------------------------- gather

struct GatherParams {
    const float* table;
    const int* ids;
    float* out;
    pa_i64 num_rows;    // T
    pa_i64 table_rows;  // rows of the table
    int h;
    int vec4;
};
static_assert(sizeof(GatherParams) == 48, "GatherParams must match src/kernels/cuda/model_ops.rs");

extern "C" __global__ void __launch_bounds__(MO_THREADS) model_gather(const GatherParams p) {
    const pa_i64 hv = p.vec4 ? p.h / 4 : p.h;
    const pa_i64 total = p.num_rows * hv;
    const pa_i64 stride = (pa_i64)gridDim.x * blockDim.x;
    for (pa_i64 u = (pa_i64)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += stride) {
        const pa_i64 r = u / hv;
        const pa_i64 c = u - r * hv;
        const int id = p.ids[r];
        const bool ok = id >= 0 && (pa_i64)id < p.table_rows;
        if (p.vec4) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (ok) v = __ldg((const float4*)p.table + (pa_i64)id * hv + c);
            ((float4*)p.out)[u] = v;
        } else {
            p.out[u] = ok ? __ldg(p.table + (pa_i64)id * hv + c) : 0.0f;
        }
    }
}

// ---------------------------------------------------------------- rms_norm

struct RmsNormParams {
    const float* x;
    const float* weight;
    float* y;
    pa_i64 num_rows;
    int h;
    float eps;
    int vec4;
    int pad_;
};
static_assert(sizeof(RmsNormParams) == 48, "RmsNormParams must match src/kernels/cuda/model_ops.rs");

__device__ __forceinline__ float mo_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(PA_FULL_MASK, v, o);
    return v;
}

extern "C" __global__ void __launch_bounds__(MO_THREADS) model_rms_norm(const RmsNormParams p) {
    __shared__ float red[MO_THREADS / 32];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    for (pa_i64 row = blockIdx.x; row < p.num_rows; row += gridDim.x) {
        const float* xr = p.x + row * p.h;
        float* yr = p.y + row * p.h;
        float s = 0.0f;
        if (p.vec4) {
            const int hv = p.h / 4;
            for (int c = tid; c < hv; c += MO_THREADS) {
                const float4 v = ((const float4*)xr)[c];
                s = fmaf(v.x, v.x, s);
                s = fmaf(v.y, v.y, s);
                s = fmaf(v.z, v.z, s);
                s = fmaf(v.w, v.w, s);
            }
        } else {
            for (int c = tid; c < p.h; c += MO_THREADS) s = fmaf(xr[c], xr[c], s);
        }
        s = mo_warp_sum(s);
        if (lane == 0) red[warp] = s;
        __syncthreads();
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < MO_THREADS / 32; ++w) total += red[w];
        const float inv = 1.0f / sqrtf(total / (float)p.h + p.eps);
        if (p.vec4) {
            const int hv = p.h / 4;
            for (int c = tid; c < hv; c += MO_THREADS) {
                const float4 v = ((const float4*)xr)[c];
                const float4 g = __ldg((const float4*)p.weight + c);
                ((float4*)yr)[c] =
                    make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
            }
        } else {
            for (int c = tid; c < p.h; c += MO_THREADS) yr[c] = xr[c] * inv * __ldg(p.weight + c);
        }
        __syncthreads();  // red is rewritten by the next row
    }
}

// ---------------------------------------------------------------- linear

struct LinearParams {
    const float* x;
    const float* w;
    float* y;
    int t;
    int k;
    int n;
    int vec4;
};
static_assert(sizeof(LinearParams) == 40, "LinearParams must match src/kernels/cuda/model_ops.rs");

extern "C" __global__ void __launch_bounds__(MO_THREADS) model_linear_tiled(const LinearParams p) {
    __shared__ __align__(16) float as[LIN_BK][LIN_BM + LIN_PAD];
    __shared__ __align__(16) float bs[LIN_BK][LIN_BN + LIN_PAD];
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
            if (m0 + r < p.t && kin) a = __ldg((const float4*)(p.x + (m0 + r) * p.k + k0 + c));
            if (n0 + r < p.n && kin) b = __ldg((const float4*)(p.w + (n0 + r) * p.k + k0 + c));
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
                as[c][r] = (m0 + r < p.t && kin) ? __ldg(p.x + (m0 + r) * p.k + k0 + c) : 0.0f;
                bs[c][r] = (n0 + r < p.n && kin) ? __ldg(p.w + (n0 + r) * p.k + k0 + c) : 0.0f;
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
            *(float4*)(yr + nb) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (nb + j < p.n) yr[nb + j] = acc[i][j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) model_linear_gemv(const LinearParams p) {
    const int lane = threadIdx.x & 31;
    const pa_i64 f = (pa_i64)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (f >= p.n) return;  // the whole warp: no block-level synchronisation follows
    const int t = p.t;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (p.vec4) {
        const int kv = p.k / 4;
        const float4* wr = (const float4*)(p.w + f * p.k);
        const float4* xr = (const float4*)p.x;
#pragma unroll 4
        for (int c = lane; c < kv; c += 32) {
            const float4 wv = __ldg(wr + c);
#pragma unroll
            for (int tt = 0; tt < 4; ++tt) {
                if (tt < t) {
                    const float4 xv = __ldg(xr + (pa_i64)tt * kv + c);
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
        for (int c = lane; c < p.k; c += 32) {
            const float wv = __ldg(wr + c);
#pragma unroll
            for (int tt = 0; tt < 4; ++tt)
                if (tt < t) acc[tt] = fmaf(wv, __ldg(p.x + (pa_i64)tt * p.k + c), acc[tt]);
        }
    }
#pragma unroll
    for (int tt = 0; tt < 4; ++tt) acc[tt] = mo_warp_sum(acc[tt]);
    if (lane == 0) {
#pragma unroll
        for (int tt = 0; tt < 4; ++tt)
            if (tt < t) p.y[(pa_i64)tt * p.n + f] = acc[tt];
    }
}

// ---------------------------------------------------------------- rope

struct RopeParams {
    float* x;
    const int* positions;
    pa_i64 num_tokens;
    int num_heads;
    int half;
    float base;
    int interleaved;
};
static_assert(sizeof(RopeParams) == 40, "RopeParams must match src/kernels/cuda/model_ops.rs");

extern "C" __global__ void __launch_bounds__(MO_THREADS) model_rope(const RopeParams p) {
    const pa_i64 total = p.num_tokens * p.num_heads * p.half;
    const pa_i64 stride = (pa_i64)gridDim.x * blockDim.x;
    const int d = 2 * p.half;
    for (pa_i64 u = (pa_i64)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += stride) {
        const pa_i64 th = u / p.half;
        const int i = (int)(u - th * p.half);
        const pa_i64 tok = th / p.num_heads;
        const float inv_freq = powf(p.base, -(float)(2 * i) / (float)d);
        const float a = (float)p.positions[tok] * inv_freq;
        const float kq = rintf(a * 0.15915494309189535f);
        const float r = fmaf(-kq, 0.0019353071795864769f, fmaf(-kq, 6.28125f, a));
        const float c = __cosf(r);
        const float s = __sinf(r);
        const pa_i64 e = th * d;
        const pa_i64 ia = p.interleaved ? e + 2 * i : e + i;
        const pa_i64 ib = p.interleaved ? ia + 1 : ia + p.half;
        const float x0 = p.x[ia];
        const float x1 = p.x[ib];
        p.x[ia] = x0 * c - x1 * s;
        p.x[ib] = x0 * s + x1 * c;
    }
}

// ---------------------------------------------------------------- element-wise

struct EltwiseParams {
    const float* a;  // silu_mul: gate; add: y
    const float* b;  // silu_mul: up; add: unused
    float* out;      // silu_mul: result; add: x (read and written)
    pa_i64 n;        // elements
    int vec4;
    int pad_;
};
static_assert(sizeof(EltwiseParams) == 40, "EltwiseParams must match src/kernels/cuda/model_ops.rs");

__device__ __forceinline__ float mo_silu(float g) { return g / (1.0f + expf(-g)); }

extern "C" __global__ void __launch_bounds__(MO_THREADS) model_silu_mul(const EltwiseParams p) {
    const pa_i64 stride = (pa_i64)gridDim.x * blockDim.x;
    const pa_i64 start = (pa_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (p.vec4) {
        for (pa_i64 u = start; u < p.n / 4; u += stride) {
            const float4 g = __ldg((const float4*)p.a + u);
            const float4 v = __ldg((const float4*)p.b + u);
            ((float4*)p.out)[u] = make_float4(mo_silu(g.x) * v.x, mo_silu(g.y) * v.y,
                                              mo_silu(g.z) * v.z, mo_silu(g.w) * v.w);
        }
    } else {
        for (pa_i64 u = start; u < p.n; u += stride) p.out[u] = mo_silu(p.a[u]) * p.b[u];
    }
}

extern "C" __global__ void __launch_bounds__(MO_THREADS) model_add(const EltwiseParams p) {
    const pa_i64 stride = (pa_i64)gridDim.x * blockDim.x;
    const pa_i64 start = (pa_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (p.vec4) {
        for (pa_i64 u = start; u < p.n / 4; u += stride) {
            const float4 y = __ldg((const float4*)p.a + u);
            float4 x = ((float4*)p.out)[u];
            x.x += y.x;
            x.y += y.y;
            x.z += y.z;
            x.w += y.w;
            ((float4*)p.out)[u] = x;
        }
    } else {
        for (pa_i64 u = start; u < p.n; u += stride) p.out[u] += p.a[u];
    }
}
