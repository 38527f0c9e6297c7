// merge_attn_states: combines two partial attention results over disjoint key sets
// (vLLM's `merge_attn_states`, §6.2 of the reference).
//
// Algorithm, per (token t, head h), natural-log LSEs: an LSE of +inf counts as -inf (FA2
// reports empty sequences as +inf); m = max(lse_p, lse_s); a = exp(lse_p - m),
// b = exp(lse_s - m); out = o_p * (a / (a+b)) + o_s * (b / (a+b)) in f32 (the weights are
// formed first, then multiplied); out_lse = ln(a+b) + m. Tokens t >= prefill_tokens copy the
// suffix (out = o_s, out_lse = lse_s). Both sides empty gives out = 0 and out_lse = -inf (vLLM
// gives NaN there; src/backends/cpu/kernels/merge_states.rs documents the choice). A side of
// weight 0 (empty or underflowed) is excluded by selection, so NaN / inf in its row never
// reaches the output.
//
// Grid: merge_attn_states_vec (the host's choice when D % 8 == 0): one thread per 8
// consecutive elements of a (t, h) row (row r = t * H + h, D / 8 threads per row, flat over
// the grid), both inputs loaded with one vector load each before any arithmetic, one vector
// store. Why: at 65536 tokens x 32 heads a CTA per row (below) or a warp per row with
// element loads keeps too few bytes in flight per SM (the H200 streamed 0.8 TB/s either way).
// merge_attn_states (any D): (T, H) CTAs whose threads stride over the head dimension.
// Every thread computes the two weights itself (two exps, no shared memory, no
// synchronisation).
//
// Layout: o_p, o_s, out [T][H][D] (in_dtype for the inputs, out_dtype for out); lse_p, lse_s,
// out_lse [H][T] f32; out_lse may be null.
//
// Bounds relied on (host checks in src/ops.rs / the CUDA impl): all three outputs hold
// T*H*D elements, the LSEs H*T; merge_attn_states: grid.x == T, grid.y == H;
// merge_attn_states_vec: D % 8 == 0, gridDim.x * blockDim.x >= T*H*D/8 (threads past it
// return at once), buffers 16-byte aligned (32 for f32; allocations are 256-byte aligned
// and every row starts at a multiple of D elements).

#include "common.cuh"

struct MergeParams {
    const void* o_p;
    const void* o_s;
    const float* lse_p;
    const float* lse_s;
    void* out;
    float* out_lse;
    int in_dtype;
    int out_dtype;
    int num_tokens;
    int num_heads;
    int head_size;
    int prefill_tokens;  // tokens at or after this index copy the suffix
};
static_assert(sizeof(MergeParams) == 72, "MergeParams must match kernels.rs");

// The merge rule's weights (see above): +inf LSEs count as -inf; wa, wb = the two sides'
// shares. Returns the merged LSE, -inf when both sides are empty (the caller then writes
// zeros without reading the inputs, whose rows may hold anything).
__device__ __forceinline__ float pm_weights(float lp, float ls, float* wa, float* wb) {
    if (lp == PA_INF) lp = -PA_INF;
    if (ls == PA_INF) ls = -PA_INF;
    const float m = fmaxf(lp, ls);
    if (m == -PA_INF) {
        *wa = *wb = 0.0f;
        return -PA_INF;
    }
    const float a = expf(lp - m);
    const float b = expf(ls - m);
    const float z = a + b;
    *wa = a / z;
    *wb = b / z;
    return logf(z) + m;
}

extern "C" __global__ void merge_attn_states(const MergeParams p) {
    const int t = blockIdx.x;
    const int h = blockIdx.y;
    if (t >= p.num_tokens || h >= p.num_heads) return;
    const pa_i64 li = (pa_i64)h * p.num_tokens + t;
    const pa_i64 row = ((pa_i64)t * p.num_heads + h) * p.head_size;
    const float ls_raw = p.lse_s[li];
    if (t >= p.prefill_tokens) {
        for (int d = threadIdx.x; d < p.head_size; d += blockDim.x) {
            pa_store(p.out, row + d, p.out_dtype, pa_load(p.o_s, row + d, p.in_dtype));
        }
        if (p.out_lse != 0 && threadIdx.x == 0) p.out_lse[li] = ls_raw;
        return;
    }
    float wa, wb;
    const float lse = pm_weights(p.lse_p[li], ls_raw, &wa, &wb);
    if (lse == -PA_INF) {
        for (int d = threadIdx.x; d < p.head_size; d += blockDim.x) {
            pa_store(p.out, row + d, p.out_dtype, 0.0f);
        }
        if (p.out_lse != 0 && threadIdx.x == 0) p.out_lse[li] = -PA_INF;
        return;
    }
    // A side of weight 0 is neither read nor multiplied (its row may hold NaN / inf).
    const bool use_p = wa != 0.0f;
    const bool use_s = wb != 0.0f;
    for (int d = threadIdx.x; d < p.head_size; d += blockDim.x) {
        float v = 0.0f;
        if (use_p) v = pa_load(p.o_p, row + d, p.in_dtype) * wa;
        if (use_s) v += pa_load(p.o_s, row + d, p.in_dtype) * wb;
        pa_store(p.out, row + d, p.out_dtype, v);
    }
    if (p.out_lse != 0 && threadIdx.x == 0) p.out_lse[li] = lse;
}

// Stores v[0..8] as elements i..i+8 of a buffer of type `dt` (f16 / bf16 / f32 with vector
// stores; `i` a multiple of 8, the buffer aligned as pa_load8 needs).
__device__ __forceinline__ void pm_store8(void* p, pa_i64 i, int dt, const float* v) {
    if (dt == PA_F32) {
        ((float4*)p)[i / 4] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4*)p)[i / 4 + 1] = make_float4(v[4], v[5], v[6], v[7]);
    } else if (dt == PA_F16 || dt == PA_BF16) {
        pa_u32 w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const pa_u16 lo = dt == PA_F16 ? pa_f32_to_f16(v[2 * k]) : pa_f32_to_bf16(v[2 * k]);
            const pa_u16 hi =
                dt == PA_F16 ? pa_f32_to_f16(v[2 * k + 1]) : pa_f32_to_bf16(v[2 * k + 1]);
            w[k] = (pa_u32)lo | ((pa_u32)hi << 16);
        }
        ((uint4*)p)[i / 8] = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) pa_store(p, i + k, dt, v[k]);
    }
}

extern "C" __global__ void merge_attn_states_vec(const MergeParams p) {
    const int pieces = p.head_size >> 3;
    const pa_i64 g = (pa_i64)blockIdx.x * blockDim.x + threadIdx.x;
    const pa_i64 r = g / pieces;
    if (r >= (pa_i64)p.num_tokens * p.num_heads) return;
    const int c = (int)(g - r * pieces);
    const int t = (int)(r / p.num_heads);
    const int h = (int)(r - (pa_i64)t * p.num_heads);
    const pa_i64 li = (pa_i64)h * p.num_tokens + t;
    const pa_i64 i = r * p.head_size + 8 * c;
    const bool copy = t >= p.prefill_tokens;
    // Every load first: the row's pieces exist whatever the branch below takes.
    float vs[8], vp[8];
    pa_load8(p.o_s, i, p.in_dtype, vs);
    const float ls_raw = p.lse_s[li];
    float lp = 0.0f;
    if (!copy) {
        pa_load8(p.o_p, i, p.in_dtype, vp);
        lp = p.lse_p[li];
    }
    if (copy) {
        pm_store8(p.out, i, p.out_dtype, vs);
        if (p.out_lse != 0 && c == 0) p.out_lse[li] = ls_raw;
        return;
    }
    float wa, wb;
    const float lse = pm_weights(lp, ls_raw, &wa, &wb);
    // A side of weight 0 is dropped by selection (0 * inf is NaN). One test per row, not
    // per element: when the row is not empty the larger side's weight is at least 1/2, so
    // the cases are both sides, the prefix alone, the suffix alone.
    if (lse == -PA_INF) {
#pragma unroll
        for (int k = 0; k < 8; ++k) vs[k] = 0.0f;
    } else if (wa != 0.0f && wb != 0.0f) {
#pragma unroll
        for (int k = 0; k < 8; ++k) vs[k] = vp[k] * wa + vs[k] * wb;
    } else if (wa != 0.0f) {
#pragma unroll
        for (int k = 0; k < 8; ++k) vs[k] = vp[k] * wa;
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) vs[k] *= wb;
    }
    pm_store8(p.out, i, p.out_dtype, vs);
    if (p.out_lse != 0 && c == 0) p.out_lse[li] = lse;
}
