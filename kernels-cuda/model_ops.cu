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
//   sample     x [T][V], rows [T] float4 (temperature, top_p, uniform, unused), out [T] i32
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
//   * model_sample: model_argmax's reduction, then (rows that sample) the total, a
//     bisection for the top-p threshold and a scan for the draw; see the kernel.
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
#define MO_WARPS (ARGMAX_THREADS / 32)

// The block's best (value, index) of row xr (v columns): per-thread strided candidates,
// warp shuffles, then thread 0 over the warps' candidates; every thread gets the result
// (red_* are free again on return).
__device__ __forceinline__ void mo_block_argmax(const float* xr, int v, float* red_v, int* red_i,
                                                float& best_v, int& best_i) {
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    float bv = -PA_INF;
    int bi = 0x7fffffff;
    for (int c = tid; c < v; c += ARGMAX_THREADS) {
        const float x = __ldg(xr + c);
        if (x > -PA_INF && mo_better(x, c, bv, bi)) {
            bv = x;
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
        for (int w = 1; w < MO_WARPS; ++w) {
            if (mo_better(red_v[w], red_i[w], red_v[0], red_i[0])) {
                red_v[0] = red_v[w];
                red_i[0] = red_i[w];
            }
        }
    }
    __syncthreads();
    best_v = red_v[0];
    best_i = red_i[0];
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) model_argmax(const ArgmaxParams p) {
    PA_DEPENDENT_PROLOGUE();
    __shared__ float red_v[MO_WARPS];
    __shared__ int red_i[MO_WARPS];
    for (pa_i64 row = blockIdx.x; row < p.num_rows; row += gridDim.x) {
        float bv;
        int bi;
        mo_block_argmax(p.x + row * p.v, p.v, red_v, red_i, bv, bi);
        if (threadIdx.x == 0) p.out[row] = bi == 0x7fffffff ? 0 : bi;
    }
}

// ---------------------------------------------------------------- sample

struct SampleParams {
    const float* x;
    const float4* rows;  // (temperature, top_p, uniform, unused) per row
    int* out;
    pa_i64 num_rows;
    int v;
    int pad_;
};
static_assert(sizeof(SampleParams) == 40, "SampleParams must match src/kernels/cuda/model_ops.rs");

// p of one logit: exp((x − m) / temp), 0 for −∞ and NaN (the comparison is false for both).
// expf and a true division (NVRTC's defaults): a temperature whose reciprocal overflows
// would turn the maximum's 0 · ∞ into NaN.
__device__ __forceinline__ float mo_prob(float x, float m, float temp) {
    return x > -PA_INF ? expf((x - m) / temp) : 0.0f;
}

// Block sum: warp shuffles, then thread 0 adds the warps' sums in order; every thread gets
// the same value (one fixed order, so equal inputs give equal sums bit for bit).
__device__ __forceinline__ float mo_block_sum(float a, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(PA_FULL_MASK, a, o);
    if (lane == 0) red[warp] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = red[0];
        for (int w = 1; w < MO_WARPS; ++w) s += red[w];
        red[0] = s;
    }
    __syncthreads();
    const float s = red[0];
    __syncthreads();
    return s;
}

// Temperature / top-p sampling, one block per row (grid-stride over rows): the argmax as
// model_argmax (greedy rows: temperature not above 0, or no finite maximum m, end there);
// then p = exp((x − m) / T) in [0, 1], whose f32 bit patterns order as their values; the
// total Σp; the top-p threshold as the largest bit pattern t with Σ_{p ≥ t} p ≥ top_p · total
// by 30 bisection steps over [0, bits(1.0) + 1), each a block sum in the total's order
// (skipped when top_p ≥ 1 or NaN); and the draw: target = uniform · kept mass, thread i owns
// the contiguous columns [i·C, (i+1)·C), and the threads' kept masses are added in order
// (each warp's by its lane 0, then the warps' totals by thread 0: every prefix is the one
// before plus a non-negative mass, so the prefixes never decrease, and thread i's interval
// starts at thread i−1's end, the same shared word), so exactly one interval holds a target
// below the total; that thread walks its columns to the first whose running mass exceeds
// it; a target past the scanned total (rounding) takes the last kept column. The rule in
// f64: src/compute/cpu.rs sample_row.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) model_sample(const SampleParams p) {
    PA_DEPENDENT_PROLOGUE();
    __shared__ float red_v[MO_WARPS];
    __shared__ int red_i[MO_WARPS];
    __shared__ float scan[ARGMAX_THREADS];
    __shared__ int last_s;
    __shared__ int pick_s;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    for (pa_i64 row = blockIdx.x; row < p.num_rows; row += gridDim.x) {
        const float* xr = p.x + row * p.v;
        float m;
        int bi;
        mo_block_argmax(xr, p.v, red_v, red_i, m, bi);
        const int greedy = bi == 0x7fffffff ? 0 : bi;
        const float4 s = p.rows[row];
        const float temp = s.x;
        if (!(temp > 0.0f) || !(m < PA_INF) || !(m > -PA_INF)) {
            if (tid == 0) p.out[row] = greedy;
            continue;  // uniform: every thread read the same values
        }
        float part = 0.0f;
        // A NaN probability (an overflowing x − m over an infinite temperature) counts as
        // nothing, as in the WGSL kernel.
        for (int c = tid; c < p.v; c += ARGMAX_THREADS) {
            const float pr = mo_prob(__ldg(xr + c), m, temp);
            part += pr >= 0.0f ? pr : 0.0f;
        }
        const float total = mo_block_sum(part, red_v);
        unsigned lo = 0u;
        float kept = total;
        if (s.y < 1.0f) {
            const float goal = s.y * total;
            unsigned hi = 0x3f800001u;
            for (int it = 0; it < 30; ++it) {
                const unsigned mid = lo + (hi - lo) / 2u;
                const float t = __uint_as_float(mid);
                float q = 0.0f;
                for (int c = tid; c < p.v; c += ARGMAX_THREADS) {
                    const float pr = mo_prob(__ldg(xr + c), m, temp);
                    if (pr >= t) q += pr;
                }
                const float mass = mo_block_sum(q, red_v);
                if (mass >= goal) {
                    lo = mid;
                    kept = mass;
                } else {
                    hi = mid;
                }
            }
        }
        const float t = __uint_as_float(lo);
        const int chunk = (p.v + ARGMAX_THREADS - 1) / ARGMAX_THREADS;
        const int c0 = min(tid * chunk, p.v);
        const int c1 = min(c0 + chunk, p.v);
        float own = 0.0f;
        int last = 0;  // last kept column + 1
        for (int c = c0; c < c1; ++c) {
            const float pr = mo_prob(__ldg(xr + c), m, temp);
            if (pr >= t && pr > 0.0f) {
                own += pr;
                last = c + 1;
            }
        }
        // Serial scans: each warp's lane 0 adds its lanes' masses in order (scan holds the
        // warp-local inclusive prefixes), thread 0 the warps' totals; then every thread's
        // inclusive prefix is its warp's start plus its local prefix (monotone: the warp's
        // start is the previous warp's last prefix, the same sum).
        scan[tid] = own;
        int lst = last;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) lst = max(lst, __shfl_xor_sync(PA_FULL_MASK, lst, o));
        __syncwarp();
        if (lane == 0) {
            float run = 0.0f;
            for (int i = 0; i < 32; ++i) {
                run += scan[tid + i];
                scan[tid + i] = run;
            }
            red_v[warp] = run;
            red_i[warp] = lst;
        }
        __syncthreads();
        if (tid == 0) {
            float run = 0.0f;
            int mx = 0;
            for (int w = 0; w < MO_WARPS; ++w) {
                const float w_sum = red_v[w];
                red_v[w] = run;  // start of warp w
                run += w_sum;
                mx = max(mx, red_i[w]);
            }
            last_s = mx;
            pick_s = 0;
        }
        __syncthreads();
        const float local = scan[tid];
        __syncthreads();
        // A warp's last lane gets red_v[w] + total, the sum thread 0 formed as the next
        // warp's start: the intervals meet exactly.
        scan[tid] = red_v[warp] + local;
        __syncthreads();
        const float uu = s.z >= 0.0f ? fminf(s.z, 0.99999994f) : 0.0f;
        const float target = uu * kept;
        const float after = scan[tid];
        const float before = tid > 0 ? scan[tid - 1] : 0.0f;
        if (own > 0.0f && before <= target && target < after) {
            float acc = before;
            int pick = last;
            for (int c = c0; c < c1; ++c) {
                const float pr = mo_prob(__ldg(xr + c), m, temp);
                if (pr >= t && pr > 0.0f) {
                    acc += pr;
                    if (acc > target) {
                        pick = c + 1;
                        break;
                    }
                }
            }
            pick_s = pick;
        }
        __syncthreads();
        if (tid == 0) {
            const int pick = pick_s != 0 ? pick_s : last_s;
            p.out[row] = pick != 0 ? pick - 1 : greedy;
        }
        __syncthreads();  // shared words are rewritten by the next row
    }
}
