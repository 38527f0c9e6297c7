// MLA prefill (vLLM's forward_mha) in expanded form, one chunk of key positions per launch:
// causal MHA of the new tokens' queries (qk_nope + rope dims) against keys
// [k_nope(h) | k_pe] and values v(h), expanded from the latents by kv_b_proj (the host runs
// mla_gather_latents, then the model_linear GEMM, per chunk). The softmax state of every
// (token, head) row persists across the chunks' launches in f32 (acc, ml): a chunk's launch
// continues the rows' online softmax, so any context length runs with a workspace bounded
// by one chunk, and the result is that of one pass (the chunk merge of vLLM's
// merge_attn_states, folded into the running state).
//
// Work: one warp / wavefront (PA_WAVE lanes) per row r = j * H + h of prefill request
// blockIdx.y (batch request first_req + blockIdx.y, token j, head h), MLA_PF_WARPS rows per
// CTA. Token j sits at
// position ctx + j (ctx = seq_len - q_len) and sees [0, ctx + j]; this launch covers
// positions [chunk_lo, min(chunk_lo + chunk, seq_len)), stored from row starts[i] of kvx / pe.
// Lane l holds query dims l, l + PA_WAVE, ... (< qk_dim, at most 256 / PA_WAVE) and value
// dims l, l + PA_WAVE, ... (< v_dim). Per step of 4 positions: four dot products (lane
// partials, then warp shuffles), one max, one rescale of the state by e^(m_old - m_new), four weighted
// value rows added. Positions a row does not see are never loaded (selection by bound).
//
// Layouts: q [Tp][H][qk_dim] (activation dtype; Tp = tokens of the prefill requests, from
// query_start_loc[first_req]); kvx [rows][H][qk_nope + v_dim] f32 (k_nope first, as
// kv_b_proj's output); pe [rows][rope] f32; acc [Tp][H][v_dim] f32, ml [Tp][H][2] f32 (max in
// scaled-score units, denominator); out [Tp][H][v_dim] activation dtype.
//
// Bounds relied on (host side): qk_dim = qk_nope + rope <= 256, v_dim <= 256; metadata
// validated; starts as for mla_gather_latents; launches in chunk order with `first` on the
// first and `last` on the last (chunk 0 holds position 0, seen by every row, so l > 0 once
// `last` runs); grid.x * MLA_PF_WARPS >= the longest prefill's q_len * H.

#include "common.cuh"

#define MLA_PF_WARPS 4
#define MLA_PF_MAXD (256 / PA_WAVE)  // dims per lane: 8 on 32-lane warps, 4 on 64-lane

struct MlaPrefillParams {
    const void* q;
    const float* kvx;
    const float* pe;
    float* acc;
    float* ml;
    void* out;
    const int* query_start_loc;
    const int* seq_lens;
    const int* starts;
    float scale;
    int num_heads;
    int first_req;
    int q_base;
    int chunk_lo;
    int chunk;
    int qk_nope;
    int rope_dim;
    int v_dim;
    int act_dtype;
    int first;
    int last;
};
static_assert(sizeof(MlaPrefillParams) == 120, "MlaPrefillParams must match src/kernels/cuda/mla.rs");

extern "C" __global__ void PA_LAUNCH_BOUNDS(MLA_PF_WARPS * PA_WAVE, 1) mla_prefill_attention(const MlaPrefillParams p) {
    const int lane = threadIdx.x & (PA_WAVE - 1);
    const int i = blockIdx.y;
    const int req = p.first_req + i;
    const int H = p.num_heads;
    const int q0 = p.query_start_loc[req];
    const int ql = p.query_start_loc[req + 1] - q0;
    const int seq = p.seq_lens[req];
    const int r = blockIdx.x * MLA_PF_WARPS + (threadIdx.x >> PA_WAVE_LOG2);
    if (r >= ql * H) return;  // the whole warp; no CTA barrier follows
    const int j = r / H;
    const int h = r - j * H;
    const int ctx = seq - ql;
    const pa_i64 row = (pa_i64)(q0 - p.q_base + j) * H + h;  // (token, head) of the prefill
    const int qk = p.qk_nope + p.rope_dim;
    const int kvw = p.qk_nope + p.v_dim;
    const int lo = p.chunk_lo;
    const int hi = min(min(seq, lo + p.chunk), ctx + j + 1);
    const int base = p.starts[i];

    float qv[MLA_PF_MAXD];
#pragma unroll
    for (int k = 0; k < MLA_PF_MAXD; ++k) {
        const int d = lane + PA_WAVE * k;
        qv[k] = d < qk ? pa_load(p.q, row * qk + d, p.act_dtype) * p.scale : 0.0f;
    }
    float acc[MLA_PF_MAXD];
    float m = -PA_INF;
    float l = 0.0f;
    if (p.first) {
#pragma unroll
        for (int k = 0; k < MLA_PF_MAXD; ++k) acc[k] = 0.0f;
    } else {
#pragma unroll
        for (int k = 0; k < MLA_PF_MAXD; ++k) {
            const int d = lane + PA_WAVE * k;
            acc[k] = d < p.v_dim ? p.acc[row * p.v_dim + d] : 0.0f;
        }
        m = p.ml[row * 2];
        l = p.ml[row * 2 + 1];
    }

    for (int pos = lo; pos < hi; pos += 4) {
        float s[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            float x = 0.0f;
            if (pos + u < hi) {
                const pa_i64 w = base + (pos + u - lo);
                const float* kn = p.kvx + (w * H + h) * kvw;
                const float* kr = p.pe + w * p.rope_dim;
#pragma unroll
                for (int k = 0; k < MLA_PF_MAXD; ++k) {
                    const int d = lane + PA_WAVE * k;
                    if (d < p.qk_nope) {
                        x += qv[k] * kn[d];
                    } else if (d < qk) {
                        x += qv[k] * kr[d - p.qk_nope];
                    }
                }
            }
            s[u] = x;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) s[u] = pa_warp_sum(s[u]);
        float mx = m;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            s[u] = pos + u < hi ? s[u] : -PA_INF;
            mx = fmaxf(mx, s[u]);
        }
        const float corr = expf(m - mx);  // m = -inf on the first step: 0
        l *= corr;
#pragma unroll
        for (int k = 0; k < MLA_PF_MAXD; ++k) acc[k] *= corr;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (pos + u < hi) {
                const float e = expf(s[u] - mx);
                l += e;
                const float* v =
                    p.kvx + ((base + (pos + u - lo)) * (pa_i64)H + h) * kvw + p.qk_nope;
#pragma unroll
                for (int k = 0; k < MLA_PF_MAXD; ++k) {
                    const int d = lane + PA_WAVE * k;
                    if (d < p.v_dim) acc[k] += e * v[d];
                }
            }
        }
        m = mx;
    }

    if (p.last) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int k = 0; k < MLA_PF_MAXD; ++k) {
            const int d = lane + PA_WAVE * k;
            if (d < p.v_dim) pa_store(p.out, row * p.v_dim + d, p.act_dtype, acc[k] * inv);
        }
    } else {
#pragma unroll
        for (int k = 0; k < MLA_PF_MAXD; ++k) {
            const int d = lane + PA_WAVE * k;
            if (d < p.v_dim) p.acc[row * p.v_dim + d] = acc[k];
        }
        if (lane == 0) {
            p.ml[row * 2] = m;
            p.ml[row * 2 + 1] = l;
        }
    }
}
