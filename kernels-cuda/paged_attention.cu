// Paged attention for mixed batches (decode, prefill, chunked prefill) on CUDA cores, with
// online softmax, and the split-KV ("flash-decoding") combine kernel.
//
// This is the portable, feature-complete path: every head size that is a multiple of 8 up to
// 256, every activation dtype (f32/f16/bf16), every cache dtype (f16/bf16/f32/fp8 e4m3/e5m2
// with scales), causal and bidirectional masks, GQA/MQA, sliding windows, ALiBi, logit soft
// cap, attention sinks and the LSE output. Dtypes are run-time codes (common.cuh); the head
// size is bucketed at compile time as DPL = ceil(head_size / PA_WAVE) (one kernel per bucket,
// `paged_attention_dpl{1..256/PA_WAVE}`), so per-lane register arrays have fixed sizes.
//
// Portable to AMD (portability.cuh): lane math uses PA_WAVE, the warp / wavefront width (32
// on NVIDIA and RDNA, 64 on CDNA), and the shuffles pa_shfl / pa_shfl_xor; no inline PTX.
//
// Work: the host cuts the batch into work items (WorkItem in common.cuh, planned once per step
// and layer shape by src/plan): query tokens
// [q_start, q_start + q_len) of request `req`, query heads
// kv_head*group + [head_start, head_start + head_count) (all share KV head `kv_head`), keys of
// positions [kv_lo, kv_hi). One CTA (4 warps, PA_ATTN_THREADS = 4 * PA_WAVE threads) per
// item; q_len * head_count <= 16 rows.
//
// Algorithm per CTA (FlashAttention-2 style, CUDA cores):
//  1. The item's query rows are loaded once into shared memory, converted to f32 and
//     multiplied by `scale`. Row r is token r / head_count, head r % head_count; warp w owns
//     rows w, w+4, w+8, w+12 (interleaved so that a decode's few rows spread over all warps).
//  2. The key range worth loading is the union of the rows' visible ranges. Keys are streamed
//     in chunks of 16 positions aligned to 16 (a chunk never crosses a cache block, because
//     block sizes are multiples of 16): the whole CTA loads K and V of the chunk from the
//     paged cache (or from dense K/V for encoder attention), dequantised to f32, into shared
//     memory.
//  3. Each warp, for each of its rows: the lanes j, j+16, j+32, ... (PA_WAVE / 16 of them)
//     compute strided parts of the dot product of the row with key j (lane j & 15), combined
//     by log2(PA_WAVE / 16) shuffles; then s = c*tanh(s/c) (soft cap), then
//     s -= slope*|pos - j| (ALiBi, FlashAttention's form: slope*(j - pos) under a causal
//     mask, symmetric when bidirectional), then the mask; the running max m, denominator l and the
//     per-lane accumulators (lane owns dims lane + PA_WAVE*e) are rescaled by exp(m_old - m_new)
//     and the chunk's p_j*v_j added. A sink starts a row at m = sink, l = 1: it joins the
//     denominator and adds no value.
//  4. Output: out = acc / l (0 when l = 0), lse = m + ln l (natural log, -inf when the row saw
//     neither key nor sink). Items with num_splits > 1 (split-KV decode) instead write f32
//     partials WITHOUT the sink to part_out / part_lse; `combine_splits` merges them and adds
//     the sink there, exactly once.
//
// Visibility of key j for a query at absolute position pos (pos = context_len + index in
// the request; context_len = 0 for dense encoder attention), inside [kv_lo, kv_hi): causal j <= pos; decoder window W: pos - j < W;
// bidirectional window: |pos - j| < W.
//
// Layouts: q [T][num_heads][head_size] (q_dtype); cache (num_blocks, 2, block_size,
// num_kv_heads, head_size) NHD or HND (cache_dtype); dense k/v [T][num_kv_heads][head_size]
// (q_dtype); out [T][num_heads][head_size] (out_dtype); lse [num_heads][num_tokens] f32;
// part_out [num_splits][n_part_tokens][num_heads][head_size] f32, part_lse
// [num_splits][n_part_tokens][num_heads] f32; block_table [num_reqs][bt_stride] i32.
//
// Loads are 8 elements wide (pa_load8: head_size is a multiple of 8, buffers 32-byte aligned).
//
// Bounds relied on (host side): metadata validated (query_start_loc monotonic, query_len <=
// seq_len, block ids of every position < seq_len in range); every item has
// q_start..q_start+q_len inside its request, kv_hi <= seq_len (dense: <= the request's query
// length), head_start + head_count <= group, q_len * head_count <= 16, kv_head <
// num_kv_heads; head_size <= PA_WAVE * DPL; blockDim.x == PA_ATTN_THREADS; out / lse / part buffers sized as above; dynamic shared
// memory = paged_attention_smem_bytes(head_size). Positions outside [kv_lo, kv_hi) are never
// loaded.

#include "common.cuh"

#define PA_WARPS 4
#define PA_RPW 4                       // rows per warp
#define PA_ROWS (PA_WARPS * PA_RPW)    // rows per CTA
#define PA_KC 16                       // keys per chunk (the shifts by 4 below rely on it)
#define PA_ATTN_THREADS (PA_WARPS * PA_WAVE)
#define PA_PARTS (PA_WAVE / PA_KC)     // lanes sharing one key's dot product

// WorkItem, AttnParams and pa_visible live in common.cuh (shared with paged_attention_mma.cu).

template <int DPL>
__device__ __forceinline__ void pa_attend(const AttnParams& p) {
    extern __shared__ float pa_smem[];
    const int D = p.head_size;
    const int SK = D + 2;  // padded K row: a warp's 16 keys start in distinct banks
    float* q_s = pa_smem;              // [PA_ROWS][D]
    float* k_s = q_s + PA_ROWS * D;    // [PA_KC][SK]
    float* v_s = k_s + PA_KC * SK;     // [PA_KC][D]

    const WorkItem it = p.items[blockIdx.x];
    const int tid = threadIdx.x;
    const int lane = tid & (PA_WAVE - 1);
    const int warp = tid >> PA_WAVE_LOG2;
    const int hc = it.head_count;
    const int rows = it.q_len * hc;
    const int qsl0 = p.query_start_loc[it.req];
    const int req_q_len = p.query_start_loc[it.req + 1] - qsl0;
    // Encoder (dense) attention has no context: its keys are the request's own query rows,
    // whatever seq_lens says (as vLLM's encoder path and the CPU backend).
    const int ctx = p.dense ? 0 : p.seq_lens[it.req] - req_q_len;
    const int pos0 = ctx + (it.q_start - qsl0);
    const int head0 = it.kv_head * p.group + it.head_start;

    // 1. Scaled query rows, 8 elements (one vector load) per thread and step.
    const int D8 = D / 8;
    for (int i = tid; i < rows * D8; i += blockDim.x) {
        const int r = i / D8;
        const int d = (i - r * D8) * 8;
        const int t = it.q_start + r / hc;
        const int h = head0 + r % hc;
        float v[8];
        pa_load8(p.q, ((pa_i64)t * p.num_heads + h) * D + d, p.q_dtype, v);
#pragma unroll
        for (int e = 0; e < 8; ++e) q_s[r * D + d + e] = v[e] * p.scale;
    }

    float m[PA_RPW], l[PA_RPW], acc[PA_RPW][DPL];
    int lo[PA_RPW], hi[PA_RPW], pos[PA_RPW], qh[PA_RPW];
#pragma unroll
    for (int k = 0; k < PA_RPW; ++k) {
        const int r = k * PA_WARPS + warp;
        const int rr = r < rows ? r : 0;
        pos[k] = pos0 + rr / hc;
        qh[k] = head0 + rr % hc;
        pa_visible(p, pos[k], it.kv_lo, it.kv_hi, &lo[k], &hi[k]);
        if (r >= rows) hi[k] = lo[k];  // inactive row: sees nothing
        const bool sink = p.use_sinks && it.num_splits == 1 && r < rows;
        m[k] = sink ? p.sinks[qh[k]] : -PA_INF;
        l[k] = sink ? 1.0f : 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[k][e] = 0.0f;
    }

    // 2. The union of the rows' visible ranges (both ends are monotone in the position).
    int span_lo, span_hi, tmp;
    pa_visible(p, pos0, it.kv_lo, it.kv_hi, &span_lo, &tmp);
    pa_visible(p, pos0 + it.q_len - 1, it.kv_lo, it.kv_hi, &tmp, &span_hi);
    span_lo = max(span_lo, it.kv_lo);
    span_hi = min(span_hi, it.kv_hi);
    const int* bt = p.block_table + (pa_i64)it.req * p.bt_stride;

    for (int c0 = span_lo - span_lo % PA_KC; c0 < span_hi; c0 += PA_KC) {
        __syncthreads();  // previous chunk consumed (and, first time, q_s written)
        for (int i = tid; i < PA_KC * D8; i += blockDim.x) {
            const int j = i / D8;
            const int d = (i - j * D8) * 8;
            const int kp = c0 + j;
            float kv[8], vv[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) kv[e] = vv[e] = 0.0f;
            if (kp >= span_lo && kp < span_hi) {
                if (p.dense) {
                    const pa_i64 o = ((pa_i64)(qsl0 + kp) * p.num_kv_heads + it.kv_head) * D + d;
                    pa_load8(p.k_dense, o, p.q_dtype, kv);
                    pa_load8(p.v_dense, o, p.q_dtype, vv);
                } else {
                    const pa_i64 block = bt[kp / p.block_size];
                    const int off = kp % p.block_size;
                    const pa_i64 ko = pa_cache_offset(block, 0, off, it.kv_head, p.block_size,
                                                      p.num_kv_heads, D, p.layout_hnd);
                    const pa_i64 vo = pa_cache_offset(block, 1, off, it.kv_head, p.block_size,
                                                      p.num_kv_heads, D, p.layout_hnd);
                    pa_load8(p.cache, ko + d, p.cache_dtype, kv);
                    pa_load8(p.cache, vo + d, p.cache_dtype, vv);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        kv[e] *= p.k_scale;
                        vv[e] *= p.v_scale;
                    }
                }
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                k_s[j * SK + d + e] = kv[e];
                v_s[j * D + d + e] = vv[e];
            }
        }
        __syncthreads();

        // 3. Scores and online softmax, one row at a time per warp.
        const int j = lane & (PA_KC - 1);
        const int part = lane >> 4;  // lane / PA_KC
        const int kp = c0 + j;
#pragma unroll
        for (int k = 0; k < PA_RPW; ++k) {
            if (lo[k] >= hi[k] || c0 >= hi[k] || c0 + PA_KC <= lo[k]) continue;  // warp-uniform
            const float* qr = q_s + (k * PA_WARPS + warp) * D;
            float s = 0.0f;
            for (int d = part; d < D; d += PA_PARTS) s += qr[d] * k_s[j * SK + d];
#pragma unroll
            for (int o = PA_KC; o < PA_WAVE; o <<= 1) s += pa_shfl_xor(s, o);
            if (p.soft_cap > 0.0f) s = p.soft_cap * tanhf(s / p.soft_cap);
            if (p.alibi != 0) s -= p.alibi[qh[k]] * fabsf((float)(pos[k] - kp));
            const bool vis = kp >= lo[k] && kp < hi[k];
            s = vis ? s : -PA_INF;
            float cm = s;
#pragma unroll
            for (int o = PA_KC / 2; o > 0; o >>= 1) cm = fmaxf(cm, pa_shfl_xor(cm, o));
            const float mn = fmaxf(m[k], cm);
            if (mn == -PA_INF) continue;  // nothing visible yet (warp-uniform)
            const float alpha = expf(m[k] - mn);
            const float pj = vis ? expf(s - mn) : 0.0f;
            float ps = pj;
#pragma unroll
            for (int o = PA_KC / 2; o > 0; o >>= 1) ps += pa_shfl_xor(ps, o);
            l[k] = l[k] * alpha + ps;
            m[k] = mn;
#pragma unroll
            for (int e = 0; e < DPL; ++e) acc[k][e] *= alpha;
#pragma unroll 4
            for (int jj = 0; jj < PA_KC; ++jj) {
                const float pv = pa_shfl(pj, jj);
                if (pv != 0.0f) {
#pragma unroll
                    for (int e = 0; e < DPL; ++e) {
                        const int d = lane + PA_WAVE * e;
                        if (d < D) acc[k][e] += pv * v_s[jj * D + d];
                    }
                }
            }
        }
    }

    // 4. Results.
#pragma unroll
    for (int k = 0; k < PA_RPW; ++k) {
        const int r = k * PA_WARPS + warp;
        if (r >= rows) continue;
        const int t = it.q_start + r / hc;
        const int h = qh[k];
        const float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
        const float row_lse = l[k] > 0.0f ? m[k] + logf(l[k]) : -PA_INF;
        if (it.num_splits > 1) {
            const pa_i64 base =
                ((pa_i64)it.split * p.n_part_tokens + it.part_tok + r / hc) * p.num_heads + h;
#pragma unroll
            for (int e = 0; e < DPL; ++e) {
                const int d = lane + PA_WAVE * e;
                if (d < D) p.part_out[base * D + d] = acc[k][e] * inv;
            }
            if (lane == 0) p.part_lse[base] = row_lse;
        } else {
            const pa_i64 base = (pa_i64)t * p.num_heads + h;
#pragma unroll
            for (int e = 0; e < DPL; ++e) {
                const int d = lane + PA_WAVE * e;
                if (d < D) pa_store(p.out, base * D + d, p.out_dtype, acc[k][e] * inv);
            }
            if (lane == 0 && p.lse != 0) p.lse[(pa_i64)h * p.num_tokens + t] = row_lse;
        }
    }
}

#define PA_DEFINE(DPL)                                                                  \
    extern "C" __global__ void PA_LAUNCH_BOUNDS(PA_ATTN_THREADS, 4)                      \
        paged_attention_dpl##DPL(const AttnParams p) {                                    \
        PA_DEPENDENT_PROLOGUE();                                                          \
        pa_attend<DPL>(p);                                                                \
    }

// The host compiles only the bucket it needs (-DPA_ONLY_DPL=n, a module per bucket, which
// keeps the first-call NVRTC time short); without the define every bucket up to head size
// 256 is built (the CI compile check): 8 on a 32-wide warp, 4 on a 64-wide wavefront.
#ifndef PA_ONLY_DPL
#define PA_ONLY_DPL 0
#endif
#define PA_WANT_DPL(n) ((n) * PA_WAVE <= 256 && (PA_ONLY_DPL == 0 || PA_ONLY_DPL == (n)))
#if PA_WANT_DPL(1)
PA_DEFINE(1)
#endif
#if PA_WANT_DPL(2)
PA_DEFINE(2)
#endif
#if PA_WANT_DPL(3)
PA_DEFINE(3)
#endif
#if PA_WANT_DPL(4)
PA_DEFINE(4)
#endif
#if PA_WANT_DPL(5)
PA_DEFINE(5)
#endif
#if PA_WANT_DPL(6)
PA_DEFINE(6)
#endif
#if PA_WANT_DPL(7)
PA_DEFINE(7)
#endif
#if PA_WANT_DPL(8)
PA_DEFINE(8)
#endif

// One token of a split group: merges its partials for query head blockIdx.y.
__device__ __forceinline__ void combine_token(const AttnParams& p, const int t, const int pt,
                                              const int ns) {
    const int h = blockIdx.y;
    const int D = p.head_size;
    float mx = (p.use_sinks && p.sinks != 0) ? p.sinks[h] : -PA_INF;
    for (int s = 0; s < ns; ++s) {
        mx = fmaxf(mx, p.part_lse[((pa_i64)s * p.n_part_tokens + pt) * p.num_heads + h]);
    }
    const pa_i64 obase = ((pa_i64)t * p.num_heads + h) * D;
    if (mx == -PA_INF) {
        for (int d = threadIdx.x; d < D; d += blockDim.x) pa_store(p.out, obase + d, p.out_dtype, 0.0f);
        if (threadIdx.x == 0 && p.lse != 0) p.lse[(pa_i64)h * p.num_tokens + t] = -PA_INF;
        return;
    }
    float z = (p.use_sinks && p.sinks != 0) ? expf(p.sinks[h] - mx) : 0.0f;
    for (int s = 0; s < ns; ++s) {
        z += expf(p.part_lse[((pa_i64)s * p.n_part_tokens + pt) * p.num_heads + h] - mx);
    }
    const float inv_z = 1.0f / z;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < ns; ++s) {
            const pa_i64 b = ((pa_i64)s * p.n_part_tokens + pt) * p.num_heads + h;
            const float w = expf(p.part_lse[b] - mx) * inv_z;
            if (w != 0.0f) v += w * p.part_out[b * D + d];
        }
        pa_store(p.out, obase + d, p.out_dtype, v);
    }
    if (threadIdx.x == 0 && p.lse != 0) p.lse[(pa_i64)h * p.num_tokens + t] = mx + logf(z);
}

// Split-KV combine. One CTA per (split group, query head), the group's tokens one after the
// other: each token's num_splits partials (out f32 [D], lse) are merged with the sink (if
// any) in the denominator: M = max(lse_s..., sink), Z = sum exp(lse_s - M) + exp(sink - M),
// out = sum exp(lse_s - M)/Z * o_s, lse = M + ln Z. A partial with lse = -inf (its key range
// was empty) has weight 0.
//
// `groups` holds one SplitGroup per split query range; bounds: q_start + q_len <= num_tokens,
// part_tok + q_len <= n_part_tokens, num_splits <= the number of partial planes allocated.
extern "C" __global__ void combine_splits(const AttnParams p, const SplitGroup* groups) {
    PA_DEPENDENT_PROLOGUE();
    const SplitGroup grp = groups[blockIdx.x];
    for (int i = 0; i < grp.q_len; ++i) {
        combine_token(p, grp.q_start + i, grp.part_tok + i, grp.num_splits);
    }
}
