// Model operations around attention, for src/compute/cuda.rs (parameter blocks: src/kernels/cuda/model_ops.rs): embedding / row gather,
// RMSNorm, RoPE, SiLU·mul and the residual add (the linear layers are model_linear.cu).
// Everything is f32 and runs on the device's one stream.
//
// Layout (all row-major, dense, each tensor its own allocation — so 256-byte aligned):
//   gather     table [rows][H], ids [T] i32, out [T][H]
//   rms_norm   x, y [T][H], weight [H]
//   rope       x [T][heads][d] (in place), positions [T] i32
//   silu_mul   gate, up, out [n];  add: x [n] += y [n]
//   argmax     x [T][V], out [T] i32
//   swiglu     gate_up [T][2I] (gate columns, then up columns), out [T][I]
//   rope_split qkv [T][H + 2Hk][d] (query, key, value heads), positions [T] i32,
//              q [T][H][d], k, v [T][Hk][d]
// `vec4` parameters say that the row length (H, K) or element count is a multiple of 4 and
// the pointers are 16-byte aligned (checked on the host): the kernels then move float4s.
//
// Algorithms:
//   * model_gather: grid-stride loop, one thread per output element (or float4). An index
//     outside [0, rows) gives a row of zeros; the table is never read outside its rows.
//   * model_rms_norm: one block per row (grid-stride over rows); each thread sums squares
//     over a strided slice, warp shuffles then one warp reduce the block's partials, then
//     y = x · (1 / sqrtf(sum / H + eps)) · w (IEEE sqrt and division: NVRTC's defaults).
//   * model_rope: one thread per (token, head, pair i), rotated by common.cuh's
//     pa_rope_rotate (angles in f32: positions in the thousands differ from the f64 CPU
//     reference by ~1e-4 rad from the product's rounding). Pairs are (2i, 2i+1)
//     (interleaved) or (i, i + d/2).
//   * model_silu_mul / model_add: grid-stride element-wise; silu(g) = g / (1 + expf(-g)).
//   * model_swiglu: model_silu_mul over the two halves of each row of a fused gate/up
//     projection: a block per row (grid-stride over rows), threads over its columns (float4
//     when I % 4 == 0).
//   * model_rope_split: one thread per (token, head of the fused row, pair i); query and key
//     heads are rotated exactly as model_rope rotates them (the same angle arithmetic) and
//     written to q / k, value heads copied to v: the three projections' split and both
//     rotations in one launch.
//   * model_argmax: one block of 1024 threads per row (grid-stride over rows); each thread
//     keeps the best (value, index) of a strided slice, then warp shuffles and thread 0
//     reduce the block's candidates. "Better" is a larger value, or an equal value at a
//     lower index; NaN is never
//     better (every comparison with it is false) and -inf is no candidate, so a row with
//     nothing above -inf keeps the start candidate (-inf, INT_MAX) and gives 0: the host's
//     rule (src/compute/cpu.rs argmax_row).
//
// Bounds relied on (host checks in src/compute/mod.rs and src/compute/cuda.rs): every size
// in the parameter block matches the tensors' shapes; element counts fit in i64 and T, H,
// heads, d in i32. Ids and positions
// are data: ids are range-checked here, positions only feed arithmetic.

#include "common.cuh"

#define MO_THREADS 256

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
    PA_DEPENDENT_PROLOGUE();
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
    PA_DEPENDENT_PROLOGUE();
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
    PA_DEPENDENT_PROLOGUE();
    const pa_i64 total = p.num_tokens * p.num_heads * p.half;
    const pa_i64 stride = (pa_i64)gridDim.x * blockDim.x;
    const int d = 2 * p.half;
    for (pa_i64 u = (pa_i64)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += stride) {
        const pa_i64 th = u / p.half;
        const int i = (int)(u - th * p.half);
        const pa_i64 tok = th / p.num_heads;
        const pa_i64 e = th * d;
        const pa_i64 ia = p.interleaved ? e + 2 * i : e + i;
        const pa_i64 ib = p.interleaved ? ia + 1 : ia + p.half;
        pa_rope_rotate(p.x[ia], p.x[ib], p.positions[tok], i, d, p.base, p.x + ia, p.x + ib);
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
    PA_DEPENDENT_PROLOGUE();
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
    PA_DEPENDENT_PROLOGUE();
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

// ---------------------------------------------------------------- swiglu

struct SwigluParams {
    const float* gate_up;
    float* out;
    pa_i64 rows;  // T
    int width;    // I
    int vec4;
};
static_assert(sizeof(SwigluParams) == 32, "SwigluParams must match src/kernels/cuda/model_ops.rs");

extern "C" __global__ void __launch_bounds__(MO_THREADS) model_swiglu(const SwigluParams p) {
    PA_DEPENDENT_PROLOGUE();
    // A block per row (grid-stride over rows), its threads over the row's columns: no 64-bit
    // division per element.
    for (pa_i64 r = blockIdx.x; r < p.rows; r += gridDim.x) {
        if (p.vec4) {
            const int wv = p.width / 4;
            const float4* row = (const float4*)p.gate_up + r * 2 * wv;
            float4* out = (float4*)p.out + r * wv;
            for (int c = threadIdx.x; c < wv; c += blockDim.x) {
                const float4 g = __ldg(row + c);
                const float4 v = __ldg(row + wv + c);
                out[c] = make_float4(mo_silu(g.x) * v.x, mo_silu(g.y) * v.y, mo_silu(g.z) * v.z,
                                     mo_silu(g.w) * v.w);
            }
        } else {
            const float* row = p.gate_up + r * 2 * p.width;
            float* out = p.out + r * p.width;
            for (int c = threadIdx.x; c < p.width; c += blockDim.x)
                out[c] = mo_silu(row[c]) * row[p.width + c];
        }
    }
}

// ---------------------------------------------------------------- rope_split

struct RopeSplitParams {
    const float* qkv;
    const int* positions;
    float* q;
    float* k;
    float* v;
    pa_i64 num_tokens;
    int num_heads;     // H
    int num_kv_heads;  // Hk
    int half;          // d / 2
    float base;
    int interleaved;
    int pad_;
};
static_assert(sizeof(RopeSplitParams) == 72, "RopeSplitParams must match src/kernels/cuda/model_ops.rs");

extern "C" __global__ void __launch_bounds__(MO_THREADS) model_rope_split(const RopeSplitParams p) {
    PA_DEPENDENT_PROLOGUE();
    const int row_heads = p.num_heads + 2 * p.num_kv_heads;
    const pa_i64 total = p.num_tokens * row_heads * p.half;
    const pa_i64 stride = (pa_i64)gridDim.x * blockDim.x;
    const int d = 2 * p.half;
    for (pa_i64 u = (pa_i64)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += stride) {
        const pa_i64 th = u / p.half;
        const int i = (int)(u - th * p.half);
        const pa_i64 tok = th / row_heads;
        const int head = (int)(th - tok * row_heads);
        const float* src = p.qkv + th * d;
        bool rotate;
        float* dst = pa_qkv_head(p.q, p.k, p.v, tok, head, p.num_heads, p.num_kv_heads, d, &rotate);
        int ia, ib;
        pa_rope_pair(i, p.half, p.interleaved, &ia, &ib);
        const float x0 = src[ia];
        const float x1 = src[ib];
        if (rotate) {
            pa_rope_rotate(x0, x1, p.positions[tok], i, d, p.base, dst + ia, dst + ib);
        } else {
            dst[ia] = x0;
            dst[ib] = x1;
        }
    }
}

// ---------------------------------------------------------------- argmax

struct ArgmaxParams {
    const float* x;
    int* out;
    pa_i64 num_rows;
    int v;
    int pad_;
};
static_assert(sizeof(ArgmaxParams) == 32, "ArgmaxParams must match src/kernels/cuda/model_ops.rs");

__device__ __forceinline__ bool mo_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// One row is a whole vocabulary (49152 for SmolLM2) and a decode step has few rows: a wide
// block, so one row takes few rounds of loads.
#define ARGMAX_THREADS 1024

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) model_argmax(const ArgmaxParams p) {
    PA_DEPENDENT_PROLOGUE();
    __shared__ float red_v[ARGMAX_THREADS / 32];
    __shared__ int red_i[ARGMAX_THREADS / 32];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    for (pa_i64 row = blockIdx.x; row < p.num_rows; row += gridDim.x) {
        const float* xr = p.x + row * p.v;
        float bv = -PA_INF;
        int bi = 0x7fffffff;
        for (int c = tid; c < p.v; c += ARGMAX_THREADS) {
            const float v = __ldg(xr + c);
            if (v > -PA_INF && mo_better(v, c, bv, bi)) {
                bv = v;
                bi = c;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(PA_FULL_MASK, bv, o);
            const int oi = __shfl_xor_sync(PA_FULL_MASK, bi, o);
            if (mo_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            red_v[warp] = bv;
            red_i[warp] = bi;
        }
        __syncthreads();
        if (tid == 0) {
            float v = red_v[0];
            int i = red_i[0];
            for (int w = 1; w < ARGMAX_THREADS / 32; ++w) {
                if (mo_better(red_v[w], red_i[w], v, i)) {
                    v = red_v[w];
                    i = red_i[w];
                }
            }
            p.out[row] = i == 0x7fffffff ? 0 : i;
        }
        __syncthreads();  // red_* are rewritten by the next row
    }
}
