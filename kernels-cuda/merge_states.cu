// merge_attn_states: combines two partial attention results over disjoint key sets
// (vLLM's `merge_attn_states`, §6.2 of the reference).
//
// Algorithm, per (token t, head h), natural-log LSEs: an LSE of +inf counts as -inf (FA2
// reports empty sequences as +inf); m = max(lse_p, lse_s); a = exp(lse_p - m),
// b = exp(lse_s - m); out = o_p * (a / (a+b)) + o_s * (b / (a+b)) in f32 (the weights are
// formed first, then multiplied); out_lse = ln(a+b) + m. Tokens t >= prefill_tokens copy the
// suffix (out = o_s, out_lse = lse_s). Both sides empty gives out = 0 and out_lse = -inf (vLLM
// gives NaN there; src/backends/cpu/kernels/merge_states.rs documents the choice).
//
// Grid: (T, H) CTAs; each CTA's threads stride over the head dimension and every thread
// computes the two weights itself (two exps, no shared memory, no synchronisation).
//
// Layout: o_p, o_s, out [T][H][D] (in_dtype for the inputs, out_dtype for out); lse_p, lse_s,
// out_lse [H][T] f32; out_lse may be null.
//
// Bounds relied on (host checks in src/ops.rs / the CUDA impl): all three outputs hold
// T*H*D elements, the LSEs H*T; grid.x == T, grid.y == H.

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
    float lp = p.lse_p[li];
    float ls = ls_raw;
    if (lp == PA_INF) lp = -PA_INF;
    if (ls == PA_INF) ls = -PA_INF;
    const float m = fmaxf(lp, ls);
    if (m == -PA_INF) {
        for (int d = threadIdx.x; d < p.head_size; d += blockDim.x) {
            pa_store(p.out, row + d, p.out_dtype, 0.0f);
        }
        if (p.out_lse != 0 && threadIdx.x == 0) p.out_lse[li] = -PA_INF;
        return;
    }
    const float a = expf(lp - m);
    const float b = expf(ls - m);
    const float z = a + b;
    const float wa = a / z;
    const float wb = b / z;
    for (int d = threadIdx.x; d < p.head_size; d += blockDim.x) {
        const float v = pa_load(p.o_p, row + d, p.in_dtype) * wa +
                        pa_load(p.o_s, row + d, p.in_dtype) * wb;
        pa_store(p.out, row + d, p.out_dtype, v);
    }
    if (p.out_lse != 0 && threadIdx.x == 0) p.out_lse[li] = logf(z) + m;
}
