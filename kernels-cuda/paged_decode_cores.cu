// Single-token decode on CUDA cores (NVIDIA: 32-lane warps, __syncwarp) for f32 activations
// and an f32 cache at head size 64:
// the decode steps of models run in f32, where the feature-complete paged_attention.cu is
// bound by instruction fetch (its code is many times what a decode executes) and by one
// serial chain of chunks per CTA. This kernel is small and has no run-time feature branch:
// the host takes it only for layers without soft cap, ALiBi and sinks, over the paged cache,
// and runs everything else on paged_attention.cu (the semantic reference).
//
// Work: the WorkItem list of common.cuh as paged_attention.cu takes it (the same planner,
// splits and combine_splits), with q_len == 1 in every item: query heads
// kv_head * group + [head_start, head_start + head_count), head_count <= PDC_H, all sharing
// KV head `kv_head`, keys [kv_lo, kv_hi) (a split's range).
//
// Algorithm per CTA (4 warps):
//  1. The item's query rows, times `scale`, go to shared memory ([PDC_H][64]).
//  2. The visible keys [lo, hi) (pa_visible: causal, window, the item's range) are cut into
//     runs of 32; warp w takes runs w, w + 4, ... Lane j of a run owns key lo + 32r + j: it
//     reads the key's row from the cache as 16 float4s, accumulating its score against every
//     head of the item (the query rows are broadcast reads), and copies the value row into
//     the warp's own shared tile ([32][68]) on the way. Keys past `hi` are neither read nor
//     scored: their score is -inf by selection.
//  3. Online softmax per head across the run (warp max, then e^(s - m) and the warp sum of
//     it); then lane l adds p_j * v_j[2l, 2l + 1] over the run's keys from the tile, for
//     every head (the weights p_j broadcast by shuffles).
//  4. The four warps' (m, l, O) meet in shared memory; each output element is
//     O = sum_w e^(m_w - M) O_w / L with M = max_w m_w, L = sum_w e^(m_w - M) l_w. Unsplit
//     items write out (0 when L = 0) and lse = M + ln L (-inf when no key was visible);
//     split items write f32 partials to part_out / part_lse for combine_splits.
// The cache scales multiply the scores (k_scale) and the output (v_scale), as in
// paged_attention.cu.
//
// Layouts: q and out [T][num_heads][64] f32; cache (num_blocks, 2, block_size,
// num_kv_heads, 64) NHD or HND, f32; lse [num_heads][num_tokens]; part_out
// [num_splits][n_part_tokens][num_heads][64], part_lse [num_splits][n_part_tokens][num_heads].
// Shared memory (dynamic, decode_cores_smem_bytes in src/kernels/cuda/shapes.rs):
// Q [PDC_H][64], then per warp a value tile [32][68] (rows start 4 banks apart: the lanes'
// float4 stores of one column land in distinct banks), reused by step 4 for the warps'
// (m, l, O).
//
// Bounds relied on (host side): metadata validated (query_start_loc monotonic, query_len <=
// seq_len, block ids of every position < seq_len in range); every item has q_len == 1 with
// q_start inside its request, kv_hi <= seq_len, head_start + head_count <= group,
// head_count <= PDC_H, kv_head < num_kv_heads; head_size == 64; q, out and cache f32 and
// 16-byte aligned (allocations are 256-byte aligned, rows are 64 floats); out / lse / part
// buffers sized as above; blockDim.x == 128; no soft cap, ALiBi, sinks or dense keys (the
// kernel ignores those fields). Only keys in [lo, hi) are read, so every block-table entry
// read is one of a position < seq_len.

#include "common.cuh"

#define PDC_D 64                  // head size
#define PDC_WARPS 4
#define PDC_RUN 32                // keys per run (one per lane)
#define PDC_VS (PDC_D + 4)        // value tile row stride in floats

template <int H>
__device__ __forceinline__ void pdc_decode(const AttnParams& p) {
    extern __shared__ float4 pdc_smem4[];
    float* q_s = (float*)pdc_smem4;                      // [H][64]
    float* tiles = q_s + H * PDC_D;                      // [4][32][68]
    const WorkItem it = p.items[blockIdx.x];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int hc = it.head_count;
    const int qsl0 = p.query_start_loc[it.req];
    const int req_q_len = p.query_start_loc[it.req + 1] - qsl0;
    const int pos = p.seq_lens[it.req] - req_q_len + (it.q_start - qsl0);
    const int head0 = it.kv_head * p.group + it.head_start;
    int lo, hi;
    pa_visible(p, pos, it.kv_lo, it.kv_hi, &lo, &hi);

    // 1. Query rows.
    const float* q = (const float*)p.q;
    for (int i = tid; i < hc * (PDC_D / 4); i += blockDim.x) {
        const int h = i / (PDC_D / 4);
        const int c = i - h * (PDC_D / 4);
        float4 v = *(const float4*)(q + ((pa_i64)it.q_start * p.num_heads + head0 + h) * PDC_D + 4 * c);
        v.x *= p.scale;
        v.y *= p.scale;
        v.z *= p.scale;
        v.w *= p.scale;
        *(float4*)(q_s + h * PDC_D + 4 * c) = v;
    }
    __syncthreads();

    float m[H], l[H], o0[H], o1[H];
#pragma unroll
    for (int h = 0; h < H; ++h) {
        m[h] = -PA_INF;
        l[h] = 0.0f;
        o0[h] = 0.0f;
        o1[h] = 0.0f;
    }
    float* tile = tiles + warp * PDC_RUN * PDC_VS;
    const int* bt = p.block_table + (pa_i64)it.req * p.bt_stride;
    const float* cache = (const float*)p.cache;

    // 2.–3. Runs of 32 keys.
    for (int r0 = lo + warp * PDC_RUN; r0 < hi; r0 += PDC_WARPS * PDC_RUN) {
        const int kp = r0 + lane;
        const bool in = kp < hi;
        float s[H];
#pragma unroll
        for (int h = 0; h < H; ++h) s[h] = 0.0f;
        if (in) {
            const pa_i64 block = bt[kp / p.block_size];
            const int off = kp % p.block_size;
            const float4* kr = (const float4*)(cache + pa_cache_offset(block, 0, off, it.kv_head,
                                                                         p.block_size, p.num_kv_heads,
                                                                         PDC_D, p.layout_hnd));
            const float4* vr = (const float4*)(cache + pa_cache_offset(block, 1, off, it.kv_head,
                                                                         p.block_size, p.num_kv_heads,
                                                                         PDC_D, p.layout_hnd));
            // Unrolled for H up to 4 only: the compiler hoists every query load of an
            // unrolled step (H float4s each), which spills the wider variants.
            constexpr int UNROLL = H <= 4 ? 4 : 1;
#pragma unroll UNROLL
            for (int c = 0; c < PDC_D / 4; ++c) {
                const float4 k = kr[c];
                *(float4*)(tile + lane * PDC_VS + 4 * c) = vr[c];
#pragma unroll
                for (int h = 0; h < H; ++h) {
                    if (h < hc) {
                        const float4 qq = *(const float4*)(q_s + h * PDC_D + 4 * c);
                        s[h] = fmaf(qq.x, k.x, s[h]);
                        s[h] = fmaf(qq.y, k.y, s[h]);
                        s[h] = fmaf(qq.z, k.z, s[h]);
                        s[h] = fmaf(qq.w, k.w, s[h]);
                    }
                }
            }
        }
        __syncwarp();  // the run's value rows are in the tile
        const int nk = min(PDC_RUN, hi - r0);
#pragma unroll
        for (int h = 0; h < H; ++h) {
            if (h >= hc) break;
            const float x = in ? s[h] * p.k_scale : -PA_INF;
            float cm = x;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, pa_shfl_xor(cm, o));
            // cm is finite: the run holds at least one visible key (r0 < hi).
            const float mn = fmaxf(m[h], cm);
            const float alpha = expf(m[h] - mn);
            const float e = in ? expf(x - mn) : 0.0f;
            float es = e;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) es += pa_shfl_xor(es, o);
            l[h] = l[h] * alpha + es;
            m[h] = mn;
            o0[h] *= alpha;
            o1[h] *= alpha;
            s[h] = e;
        }
        for (int j = 0; j < nk; ++j) {
            const float2 v = *(const float2*)(tile + j * PDC_VS + 2 * lane);
#pragma unroll
            for (int h = 0; h < H; ++h) {
                if (h < hc) {
                    const float pj = pa_shfl(s[h], j);
                    o0[h] = fmaf(pj, v.x, o0[h]);
                    o1[h] = fmaf(pj, v.y, o1[h]);
                }
            }
        }
        __syncwarp();  // the tile is rewritten by the next run
    }

    // 4. The warps' states meet: per warp [H] m, [H] l, [H][64] O, in its own tile (each
    // warp is done with it), then read across warps after the barrier.
    {
        float* st = tile;
#pragma unroll
        for (int h = 0; h < H; ++h) {
            if (h < hc) {
                if (lane == 0) {
                    st[h] = m[h];
                    st[H + h] = l[h];
                }
                *(float2*)(st + 2 * H + h * PDC_D + 2 * lane) = make_float2(o0[h], o1[h]);
            }
        }
    }
    __syncthreads();
    const bool split = it.num_splits > 1;
    const int stride = PDC_RUN * PDC_VS;
    for (int i = tid; i < hc * PDC_D; i += blockDim.x) {
        const int h = i / PDC_D;
        const int d = i - h * PDC_D;
        float mx = -PA_INF;
#pragma unroll
        for (int w = 0; w < PDC_WARPS; ++w) mx = fmaxf(mx, tiles[w * stride + h]);
        float lt = 0.0f;
        float ot = 0.0f;
        if (mx != -PA_INF) {
#pragma unroll
            for (int w = 0; w < PDC_WARPS; ++w) {
                const float* st = tiles + w * stride;
                const float wt = expf(st[h] - mx);  // 0 for a warp that saw no key
                lt = fmaf(wt, st[H + h], lt);
                ot = fmaf(wt, st[2 * H + h * PDC_D + d], ot);
            }
        }
        const float val = lt > 0.0f ? ot / lt * p.v_scale : 0.0f;
        const float row_lse = lt > 0.0f ? mx + logf(lt) : -PA_INF;
        const int head = head0 + h;
        if (split) {
            const pa_i64 base =
                ((pa_i64)it.split * p.n_part_tokens + it.part_tok) * p.num_heads + head;
            p.part_out[base * PDC_D + d] = val;
            if (d == 0) p.part_lse[base] = row_lse;
        } else {
            const pa_i64 base = (pa_i64)it.q_start * p.num_heads + head;
            ((float*)p.out)[base * PDC_D + d] = val;
            if (d == 0 && p.lse != 0) p.lse[(pa_i64)head * p.num_tokens + it.q_start] = row_lse;
        }
    }
}

// MIN_BLOCKS bounds the registers: the head slots' scores and states grow with H.
#define PDC_DEFINE(H, MIN_BLOCKS)                                                     \
    extern "C" __global__ void PA_LAUNCH_BOUNDS(PDC_WARPS * 32, MIN_BLOCKS)            \
        paged_decode_cores_h##H(const AttnParams p) {                                  \
        PA_DEPENDENT_PROLOGUE();                                                        \
        pdc_decode<H>(p);                                                               \
    }

// The host builds the variant it needs (-DPDC_ONLY_H=4, 8 or 16: the fewest head slots that
// hold the items' head count); without the define all three are built (the CI compile check).
#ifndef PDC_ONLY_H
#define PDC_ONLY_H 0
#endif
#if PDC_ONLY_H == 0 || PDC_ONLY_H == 4
PDC_DEFINE(4, 4)
#endif
#if PDC_ONLY_H == 0 || PDC_ONLY_H == 8
PDC_DEFINE(8, 4)
#endif
#if PDC_ONLY_H == 0 || PDC_ONLY_H == 16
PDC_DEFINE(16, 3)
#endif
