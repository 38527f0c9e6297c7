// Paged decode attention on tensor cores (split-KV "flash-decoding" with an in-CTA merge) for
// f16 / bf16 activations with a cache of the same dtype, or an fp8 cache (E4M3 / E5M2, KV = 1 /
// 2: the `_e4m3` / `_e5m2` entry points), and head sizes 64, 96 and 128. The host
// uses it for the requests of a batch whose query length is 1 (decodes), when the layer's
// features allow; everything else runs on paged_attention.cu (the semantic reference) or
// paged_attention_mma.cu.
//
// Work: the WorkItem list of common.cuh, planned with at most 16 rows per item and one query
// token per item (q_len == 1): query heads kv_head*group + [head_start, head_start +
// head_count), head_count <= 16, all sharing KV head `kv_head`, so every key and value of the
// item's range is read from memory once for the whole GQA group. Items of a split token
// (num_splits > 1) cover the key range [kv_lo, kv_hi) of split `split`; the planner makes
// enough splits that the GPU's SMs are busy even for a single request.
//
// Algorithm per CTA (4 warps):
//  1. The item's query rows (one per head; rows >= head_count zero-filled) are copied to shared
//     memory with cp.async and held in registers as mma A fragments (ldmatrix.x4), the same for
//     every warp.
//  2. The visible key range [lo, hi) of the token (causal, window, [kv_lo, kv_hi)) is cut into
//     chunks of 16 positions aligned to 16 (a chunk never crosses a cache block: block sizes
//     are multiples of 16). Warp w takes chunks w, w+4, w+8, ... and streams them through its
//     own ring of DEC_STAGES shared-memory stages with cp.async (16-byte copies, DEC_STAGES - 1
//     chunks in flight per warp, no CTA barrier in the loop: __syncwarp orders each warp's
//     own copies and reads). Positions outside [lo, hi) are zero-filled, never read.
//     fp8 caches: the ring holds the raw bytes; once a chunk has landed, the warp converts it
//     into its own 16-bit K / V tile (every fp8 value is exact in f16 and in bf16: sm_89+
//     with `cvt.rn.f16x2.e4m3x2`, E5M2 as the high byte of an f16, the f32 decoders of
//     common.cuh on sm_80), and step 3 reads that tile. The scales are folded: scores use
//     scale * k_scale, the output is multiplied by v_scale once, in the merge.
//  3. Per chunk: S = Q K^T (m16n8k16, rows = heads, 2 n-tiles of 8 keys; ldmatrix.x4 on the
//     K rows), s *= scale, soft cap c*tanh(s/c), ALiBi -slope*|pos - j|, mask (-inf outside
//     [lo, hi) and for rows >= head_count); online softmax per row with running max m and
//     partial denominator l per thread (rows g4 and g4+8 of the mma layout), O rescaled by
//     exp(m_old - m_new); P packed to f16x2 / bf16x2 and O += P V (ldmatrix.x4.trans on V).
//  4. In-CTA merge: the 4 warps' (m, l, O) go to shared memory (reusing the rings after a
//     barrier); row r's result is O = sum_w e^(m_w - M) O_w / L with M = max_w m_w (and the
//     sink for unsplit items), L = sum_w e^(m_w - M) l_w (+ e^(sink - M)). Unsplit items write
//     out = O (0 when L = 0) and lse = M + ln L (natural log, -inf when the row saw neither
//     key nor sink); split items write f32 partials WITHOUT the sink to part_out / part_lse.
//  5. Split items: the last CTA of the token's splits to finish merges the partials and adds
//     the sink once (pd_merge_if_last, below: arrival counters in split_counters, no
//     separate combine launch).
//
// Layouts: q [T][num_heads][D] and out [T][num_heads][D] (f16 / bf16; out_dtype may also be
// f32); cache (num_blocks, 2, block_size, num_kv_heads, D) NHD or HND in the activation dtype
// or fp8;
// lse [num_heads][num_tokens] f32; part_out [num_splits][n_part_tokens][num_heads][D] f32,
// part_lse [num_splits][n_part_tokens][num_heads] f32; split_counters
// [n_part_tokens][num_heads] i32, zero between launches; block_table [num_reqs][bt_stride].
// Shared memory: Q [16][D+8], then per warp DEC_STAGES stages of K [16][D+8] and V [16][D+8]
// (16-byte aligned rows for cp.async / ldmatrix, conflict-free banks); fp8: per warp
// DEC_STAGES stages of raw K [16][D+16] and V [16][D+16] bytes, then per warp one converted
// K [16][D+8] and V [16][D+8] tile; = decode_smem_bytes(D, cache dtype) in kernels.rs.
//
// Bounds relied on (host side): metadata validated (query_start_loc monotonic, query_len <=
// seq_len, block ids of every position < seq_len in range); every item has q_len == 1,
// q_start inside its request, kv_hi <= seq_len, head_start + head_count <= group,
// head_count <= 16, kv_head < num_kv_heads; num_splits <= DEC_MAX_SPLITS, and every split
// item of a token has the same num_splits, part_tok and head range (the merge counts
// arrivals per (part_tok, head0)); head_size == D; block_size a multiple of 16; q,
// cache and part_out 16-byte aligned (allocations are 256-byte aligned, row offsets multiples
// of D elements, D a multiple of 16); out / lse / part buffers sized as above; dynamic shared
// memory = decode_smem_bytes(D); compute capability >= 8.0 (cp.async, ldmatrix, bf16 mma).
// Only chunks that hold at least one position of [lo, hi) are touched, so every block-table
// entry read is one of a position < seq_len, and every cache address lies in that block.

#include "common.cuh"

#define DEC_WARPS 4
#define DEC_KEYS 16    // keys per chunk
#define DEC_STAGES 3   // ring stages per warp
#define DEC_MAX_SPLITS 128  // most splits of one token (the planner's DECODE_MAX_SPLITS)
// Early block-table reads: a layer without a sliding window reads the block-table entries
// of each warp's first DEC_STAGES chunks right after its work item, in parallel with
// query_start_loc / seq_lens. Why: without a window the visible range
// starts at the item's kv_lo, so the chunks' positions are known before seq_lens arrives,
// and the chain item -> seq_lens -> block table -> first copies loses one memory round trip
// (a single long request's decode runs as one wave, so every CTA waits it out at once).
// An entry is used only for a chunk that exists (position < seq_len); the read index is
// clamped to the block-table row, so a chunk past the end reads a valid but unused entry.

// Fused split combine (step 5 below), run by every CTA of a split token after it has written
// its partials; only the token's last CTA to arrive merges. Arrival (the pattern of a
// cooperative-groups grid barrier): a CTA barrier orders every thread's partial stores before
// thread 0's device-scope fence (release), then thread 0 increments the counter of
// (part_tok, head0); the CTA that sees num_splits - 1 resets the counter to 0 (no other CTA
// of this launch touches it again, so every launch starts from zeros), fences again
// (acquire) and, after a CTA barrier, reads the other CTAs' partials through L2
// (ld.global.cg: this CTA never cached them in L1). Warp w merges query heads head0 + w, w + 4, ...: M = max(lse_s..., sink), Z = sum
// exp(lse_s - M) + exp(sink - M), out = sum exp(lse_s - M) / Z * o_s, lse = M + ln Z (out 0
// and lse -inf when M = -inf); a split of weight 0 (an empty key range, LSE -inf) wrote a
// zero partial. Why fused: a separate combine launch costs several microseconds, a tenth of a
// long-context decode step on a large GPU.
template <int D>
__device__ __forceinline__ void pd_merge_if_last(const AttnParams& p, const WorkItem& it,
                                                 int head0) {
    __shared__ int last_s;
    __shared__ float w_s[DEC_WARPS][DEC_MAX_SPLITS];
    const int tid = threadIdx.x;
    __syncthreads();  // every thread's partial stores precede thread 0's fence (cumulative)
    if (tid == 0) {
        __threadfence();
        int* cnt = p.split_counters + (pa_i64)it.part_tok * p.num_heads + head0;
        const int last = atomicAdd(cnt, 1) == it.num_splits - 1;
        if (last) {
            atomicExch(cnt, 0);
            __threadfence();
        }
        last_s = last;
    }
    __syncthreads();
    if (!last_s) return;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int ns = min(it.num_splits, DEC_MAX_SPLITS);
    const int pt = it.part_tok;
    const int t = it.q_start;
    constexpr int L = D / 4;  // lanes holding a float4 of the row
    constexpr int SPL = DEC_MAX_SPLITS / 32;
    for (int r = warp; r < it.head_count; r += DEC_WARPS) {
        const int h = head0 + r;
        const bool sink = p.use_sinks && p.sinks != 0;
        const float sv = sink ? p.sinks[h] : -PA_INF;
        float x[SPL];
        float mx = sv;
#pragma unroll
        for (int k = 0; k < SPL; ++k) {
            const int sp = lane + 32 * k;
            x[k] = sp < ns ? __ldcg(p.part_lse + ((pa_i64)sp * p.n_part_tokens + pt) * p.num_heads + h)
                           : -PA_INF;
            mx = fmaxf(mx, x[k]);
        }
        mx = pa_warp_max(mx);
        float z = 0.0f;
#pragma unroll
        for (int k = 0; k < SPL; ++k) {
            x[k] = (x[k] == -PA_INF || mx == -PA_INF) ? 0.0f : expf(x[k] - mx);
            z += x[k];
        }
        z = pa_warp_sum(z);
        if (sink && mx != -PA_INF) z += expf(sv - mx);
        const float inv = z > 0.0f ? 1.0f / z : 0.0f;
#pragma unroll
        for (int k = 0; k < SPL; ++k) {
            const int sp = lane + 32 * k;
            if (sp < ns) w_s[warp][sp] = x[k] * inv;
        }
        __syncwarp();
        if (lane < L) {
            // MERGE_BATCH partials in flight per lane (independent, predicated loads: the
            // merge is one L2 round trip per 32 splits, not one per split).
            constexpr int MERGE_BATCH = 32;
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int s0 = 0; s0 < ns; s0 += MERGE_BATCH) {
                float4 v[MERGE_BATCH];
#pragma unroll
                for (int k = 0; k < MERGE_BATCH; ++k) {
                    const int sp = s0 + k;
                    const pa_i64 b = ((pa_i64)sp * p.n_part_tokens + pt) * p.num_heads + h;
                    v[k] = sp < ns ? __ldcg((const float4*)(p.part_out + b * D) + lane)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int k = 0; k < MERGE_BATCH; ++k) {
                    // A split of weight 0 (empty key range) wrote zeros, never NaN.
                    const float w = s0 + k < ns ? w_s[warp][s0 + k] : 0.0f;
                    acc.x += w * v[k].x;
                    acc.y += w * v[k].y;
                    acc.z += w * v[k].z;
                    acc.w += w * v[k].w;
                }
            }
            const pa_i64 ob = ((pa_i64)t * p.num_heads + h) * D + 4 * lane;
            pa_store(p.out, ob, p.out_dtype, acc.x);
            pa_store(p.out, ob + 1, p.out_dtype, acc.y);
            pa_store(p.out, ob + 2, p.out_dtype, acc.z);
            pa_store(p.out, ob + 3, p.out_dtype, acc.w);
        }
        if (lane == 0 && p.lse != 0) {
            p.lse[(pa_i64)h * p.num_tokens + t] = z > 0.0f ? mx + logf(z) : -PA_INF;
        }
        __syncwarp();  // w_s[warp] is rewritten for the warp's next head
    }
}

template <bool BF16, int D, int KV>
__device__ __forceinline__ void pd_decode(const AttnParams& p) {
    constexpr bool FP8 = KV != 0;
    constexpr int S = D + 8;                 // shared row stride in elements
    constexpr int KT = D / 16;               // k16 steps of Q K^T
    constexpr int NT = D / 8;                // n8 tiles of O
    constexpr int CH = D / 8;                // 16-byte pieces per 16-bit row
    constexpr int TILE = DEC_KEYS * S;       // elements of one K (or V) stage
    // The ring as the cache stores it: EB bytes per element, rows of RS bytes (16-byte
    // aligned, padded against bank conflicts), CHB 16-byte pieces per row, PIECES per lane
    // per K (or V) chunk, RAW bytes per K (or V) stage.
    constexpr int EB = FP8 ? 1 : 2;
    constexpr int RS = FP8 ? D + 16 : S * 2;
    constexpr int CHB = D * EB / 16;
    constexpr int PIECES = DEC_KEYS * CHB / 32;
    constexpr int RAW = DEC_KEYS * RS;
    constexpr int STAGE_BYTES = 2 * RAW;
    static_assert(D % 16 == 0 && (DEC_KEYS * (D / 16)) % 32 == 0, "head size");
    extern __shared__ uint4 pd_smem[];
    pa_u16* q_s = (pa_u16*)pd_smem;          // [16][S]
    pa_u8* ring = (pa_u8*)(q_s + 16 * S);    // [DEC_WARPS][DEC_STAGES] stages of STAGE_BYTES
    // fp8: this warp's converted K and V tiles, after every warp's ring.
    pa_u16* conv = (pa_u16*)(ring + DEC_WARPS * DEC_STAGES * STAGE_BYTES) +
                   (threadIdx.x >> 5) * 2 * TILE;

    const WorkItem it = p.items[blockIdx.x];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g4 = lane >> 2;
    const int t4 = lane & 3;
    const int hc = it.head_count;
    const int* bt = p.block_table + (pa_i64)it.req * p.bt_stride;
    // The first chunks' block ids, before seq_lens is known (early block-table reads, above).
    const bool spec = !(p.window > 0) && p.bt_stride > 0;
    pa_i64 spec_block[DEC_STAGES];
    if (spec) {
        const int cb = it.kv_lo - it.kv_lo % DEC_KEYS;
#pragma unroll
        for (int s = 0; s < DEC_STAGES; ++s) {
            const int c0 = cb + DEC_KEYS * (warp + DEC_WARPS * s);
            spec_block[s] = bt[min(c0 / p.block_size, p.bt_stride - 1)];
        }
    }
    const int qsl0 = p.query_start_loc[it.req];
    const int req_q_len = p.query_start_loc[it.req + 1] - qsl0;
    const int pos = p.seq_lens[it.req] - req_q_len + (it.q_start - qsl0);
    const int head0 = it.kv_head * p.group + it.head_start;
    const pa_u16* q = (const pa_u16*)p.q;
    const float qk_scale = FP8 ? p.scale * p.k_scale : p.scale;

    int lo, hi;
    pa_visible(p, pos, it.kv_lo, it.kv_hi, &lo, &hi);
    const int c_begin = lo - lo % DEC_KEYS;
    const int nch = lo < hi ? (hi - c_begin + DEC_KEYS - 1) / DEC_KEYS : 0;
    const int my_n = nch > warp ? (nch - warp + DEC_WARPS - 1) / DEC_WARPS : 0;
    const pa_i64 row_stride = p.layout_hnd ? (pa_i64)D : (pa_i64)p.num_kv_heads * D;
    pa_u8* my_ring = ring + warp * DEC_STAGES * STAGE_BYTES;

    // Block id of this warp's i-th chunk (one of a position in [lo, hi), so < seq_len).
    auto block_of = [&](int i) -> pa_i64 {
        const int c0 = c_begin + DEC_KEYS * (warp + DEC_WARPS * i);
        return bt[c0 / p.block_size];
    };
    // Queues the cp.async copies of this warp's i-th chunk (in cache block `block`) into ring
    // stage `stage`.
    auto issue = [&](int i, int stage, pa_i64 block) {
        const int c0 = c_begin + DEC_KEYS * (warp + DEC_WARPS * i);
        const int off = c0 % p.block_size;
        const pa_i64 k_off = pa_cache_offset(block, 0, off, it.kv_head, p.block_size,
                                             p.num_kv_heads, D, p.layout_hnd);
        const pa_i64 v_off = pa_cache_offset(block, 1, off, it.kv_head, p.block_size,
                                             p.num_kv_heads, D, p.layout_hnd);
        // Element offsets times EB are byte offsets; rows of D * EB bytes, a multiple of 16.
        const pa_u8* kb = (const pa_u8*)p.cache + k_off * EB;
        const pa_u8* vb = (const pa_u8*)p.cache + v_off * EB;
        pa_u8* ks = my_ring + stage * STAGE_BYTES;
        pa_u8* vs = ks + RAW;
#pragma unroll
        for (int u = 0; u < PIECES; ++u) {
            const int piece = lane + 32 * u;
            const int j = piece / CHB;
            const int c = piece - j * CHB;
            const int kp = c0 + j;
            const int bytes = (kp >= lo && kp < hi) ? 16 : 0;
            const pa_i64 o = (j * row_stride) * EB + c * 16;
            ptx_cp_async16(ptx_smem_addr(ks + j * RS + c * 16), kb + o, bytes);
            ptx_cp_async16(ptx_smem_addr(vs + j * RS + c * 16), vb + o, bytes);
        }
    };

    // 1. Q rows (committed with the first chunk's group).
    for (int i = tid; i < 16 * CH; i += blockDim.x) {
        const int r = i / CH;
        const int c = i - r * CH;
        const pa_u16* src = q;
        int bytes = 0;
        if (r < hc) {
            src = q + ((pa_i64)it.q_start * p.num_heads + head0 + r) * D + c * 8;
            bytes = 16;
        }
        ptx_cp_async16(ptx_smem_addr(q_s + r * S + c * 8), src, bytes);
    }
    // Prologue: the first DEC_STAGES - 1 chunks of this warp in flight.
#pragma unroll
    for (int s = 0; s < DEC_STAGES - 1; ++s) {
        if (s < my_n) issue(s, s, spec ? spec_block[s] : block_of(s));
        ptx_cp_async_commit();
    }
    // The block id of the next chunk to issue, loaded one iteration ahead so that the
    // block-table read never stalls an issue.
    pa_i64 next_block = DEC_STAGES - 1 < my_n
                            ? (spec ? spec_block[DEC_STAGES - 1] : block_of(DEC_STAGES - 1))
                            : 0;
    ptx_cp_async_wait<DEC_STAGES - 2>();  // this thread's Q pieces (and chunk 0) landed
    __syncthreads();                     // everyone's Q pieces landed

    pa_u32 qf[KT][4];
    {
        const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1);
        const int a_col = 8 * (lane >> 4);
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            ptx_ldmatrix_x4(ptx_smem_addr(q_s + a_row * S + 16 * kk + a_col), qf[kk][0], qf[kk][1],
                           qf[kk][2], qf[kk][3]);
        }
    }

    bool act[2];
    float slope[2], m[2], l[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = g4 + 8 * i;
        act[i] = r < hc;
        slope[i] = (p.alibi != 0 && act[i]) ? p.alibi[head0 + r] : 0.0f;
        m[i] = -PA_INF;
        l[i] = 0.0f;
    }
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    // ldmatrix lane addressing for K (two n-tiles x k16) and V (k16 x two d-tiles, .trans).
    const int k_row = (lane & 7) + 8 * (lane >> 4);
    const int k_col = 8 * ((lane >> 3) & 1);
    const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1);
    const int v_col = 8 * (lane >> 4);

    // Issues chunk i + DEC_STAGES - 1 into the stage chunk i - 1 used (one commit group per
    // chunk, empty past the end, so that wait<DEC_STAGES - 2> always means "chunk i landed").
    auto refill = [&](int i) {
        const int nx = i + DEC_STAGES - 1;
        if (nx < my_n) {
            issue(nx, nx % DEC_STAGES, next_block);
            if (nx + 1 < my_n) next_block = block_of(nx + 1);
        }
        ptx_cp_async_commit();
    };

    // 2-3. This warp's chunks through its ring.
    for (int i = 0; i < my_n; ++i) {
        ptx_cp_async_wait<DEC_STAGES - 2>();
        __syncwarp();  // every lane's copies of chunk i are visible to the warp
        const int stage = i % DEC_STAGES;
        const pa_u16* ks = (const pa_u16*)(my_ring + stage * STAGE_BYTES);
        const pa_u16* vs = ks + TILE;
        if (FP8) {
            // Raw chunk -> this warp's 16-bit tiles. The previous chunk's reads of `conv`
            // ended at the __syncwarp before the last refill.
            const pa_u8* rk = my_ring + stage * STAGE_BYTES;
#pragma unroll
            for (int u = 0; u < 2 * PIECES; ++u) {
                const int kv = u / PIECES;  // 0: K, 1: V
                const int piece = lane + 32 * (u - kv * PIECES);
                const int j = piece / CHB;
                const int c = piece - j * CHB;
                const uint4 raw = *(const uint4*)(rk + kv * RAW + j * RS + c * 16);
                const uint2 a = pa_fp8x4<BF16, KV>(raw.x);
                const uint2 b = pa_fp8x4<BF16, KV>(raw.y);
                const uint2 e = pa_fp8x4<BF16, KV>(raw.z);
                const uint2 f = pa_fp8x4<BF16, KV>(raw.w);
                uint4* dst = (uint4*)(conv + kv * TILE + j * S + c * 16);
                dst[0] = make_uint4(a.x, a.y, b.x, b.y);
                dst[1] = make_uint4(e.x, e.y, f.x, f.y);
            }
            __syncwarp();
            ks = conv;
            vs = conv + TILE;
            // This raw stage is converted (and stage (i - 1) % DEC_STAGES long since): the
            // next copies can fly while this chunk's mma work runs.
            refill(i);
        }
        const int c0 = c_begin + DEC_KEYS * (warp + DEC_WARPS * i);

        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            pa_u32 b0, b1, b2, b3;
            ptx_ldmatrix_x4(ptx_smem_addr(ks + k_row * S + 16 * kk + k_col), b0, b1, b2, b3);
            ptx_mma<BF16>(s[0], qf[kk], b0, b1);
            ptx_mma<BF16>(s[1], qf[kk], b2, b3);
        }

        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e >> 1;
                const int kp = c0 + 8 * j + 2 * t4 + (e & 1);
                float x = s[j][e] * qk_scale;
                if (p.soft_cap > 0.0f) x = p.soft_cap * tanhf(x / p.soft_cap);
                if (p.alibi != 0) x -= slope[r] * fabsf((float)(pos - kp));
                x = (act[r] && kp >= lo && kp < hi) ? x : -PA_INF;
                s[j][e] = x;
                mx[r] = fmaxf(mx[r], x);
            }
        }
        float msub[2], alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(PA_FULL_MASK, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(PA_FULL_MASK, mx[r], 2));
            msub[r] = mx[r] == -PA_INF ? 0.0f : mx[r];
            alpha[r] = expf(m[r] - msub[r]);
            m[r] = mx[r];
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float x = expf(s[j][e] - msub[e >> 1]);
                s[j][e] = x;
                rs[e >> 1] += x;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + rs[r];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }

        pa_u32 a[4];
        a[0] = ptx_pack2<BF16>(s[0][0], s[0][1]);
        a[1] = ptx_pack2<BF16>(s[0][2], s[0][3]);
        a[2] = ptx_pack2<BF16>(s[1][0], s[1][1]);
        a[3] = ptx_pack2<BF16>(s[1][2], s[1][3]);
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            pa_u32 b0, b1, b2, b3;
            ptx_ldmatrix_x4_trans(ptx_smem_addr(vs + v_row * S + 8 * n + v_col), b0, b1, b2, b3);
            ptx_mma<BF16>(o[n], a, b0, b1);
            ptx_mma<BF16>(o[n + 1], a, b2, b3);
        }

        __syncwarp();  // every lane is done reading the stage (fp8: the conv tile)
        if (!FP8) refill(i);
    }

    // 4. In-CTA merge of the warps' states, through shared memory (the rings are free once
    // every warp has drained its copies and passed the barrier).
    ptx_cp_async_wait<0>();
    __syncthreads();
    float* red_o = (float*)ring;                     // [DEC_WARPS][16][D]
    float* red_m = red_o + DEC_WARPS * 16 * D;       // [DEC_WARPS][16]
    float* red_l = red_m + DEC_WARPS * 16;           // [DEC_WARPS][16]
    float* fac = red_l + DEC_WARPS * 16;             // [DEC_WARPS][16]
    float* row_lse = fac + DEC_WARPS * 16;           // [16]
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float lt = l[i];
        lt += __shfl_xor_sync(PA_FULL_MASK, lt, 1);
        lt += __shfl_xor_sync(PA_FULL_MASK, lt, 2);
        const int r = g4 + 8 * i;
        if (!act[i]) continue;
        float* dst = red_o + (warp * 16 + r) * D;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            dst[8 * n + 2 * t4] = o[n][2 * i];
            dst[8 * n + 2 * t4 + 1] = o[n][2 * i + 1];
        }
        if (t4 == 0) {
            red_m[warp * 16 + r] = m[i];
            red_l[warp * 16 + r] = lt;
        }
    }
    __syncthreads();
    const bool split = it.num_splits > 1;
    if (tid < hc) {
        const int r = tid;
        const bool sink = p.use_sinks && p.sinks != 0 && !split;
        const float sv = sink ? p.sinks[head0 + r] : -PA_INF;
        float mm = sv;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) mm = fmaxf(mm, red_m[w * 16 + r]);
        float wt[DEC_WARPS];
        float z = sink ? expf(sv - mm) : 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) {
            const float mw = red_m[w * 16 + r];
            wt[w] = mw == -PA_INF ? 0.0f : expf(mw - mm);
            z += wt[w] * red_l[w * 16 + r];
        }
        // fp8: v_scale, folded out of the values, applied here once.
        const float inv = z > 0.0f ? (FP8 ? p.v_scale : 1.0f) / z : 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) fac[w * 16 + r] = wt[w] * inv;
        row_lse[r] = z > 0.0f ? mm + logf(z) : -PA_INF;
    }
    __syncthreads();

    const int t = it.q_start;
    constexpr int D4 = D / 4;
    for (int i = tid; i < hc * D4; i += blockDim.x) {
        const int r = i / D4;
        const int d = (i - r * D4) * 4;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) {
            const float f = fac[w * 16 + r];
            if (f != 0.0f) {
                const float4 x = *(const float4*)(red_o + (w * 16 + r) * D + d);
                v[0] += f * x.x;
                v[1] += f * x.y;
                v[2] += f * x.z;
                v[3] += f * x.w;
            }
        }
        const int h = head0 + r;
        if (split) {
            const pa_i64 base =
                ((pa_i64)it.split * p.n_part_tokens + it.part_tok) * p.num_heads + h;
            float4 w;
            w.x = v[0];
            w.y = v[1];
            w.z = v[2];
            w.w = v[3];
            *(float4*)(p.part_out + base * D + d) = w;
        } else {
            const pa_i64 base = ((pa_i64)t * p.num_heads + h) * D + d;
#pragma unroll
            for (int e = 0; e < 4; ++e) pa_store(p.out, base + e, p.out_dtype, v[e]);
        }
    }
    if (tid < hc) {
        const int h = head0 + tid;
        if (split) {
            p.part_lse[((pa_i64)it.split * p.n_part_tokens + it.part_tok) * p.num_heads + h] =
                row_lse[tid];
        } else if (p.lse != 0) {
            p.lse[(pa_i64)h * p.num_tokens + t] = row_lse[tid];
        }
    }
    if (split) pd_merge_if_last<D>(p, it, head0);
}

#define PD_DEFINE(NAME, BF16, D, KV)                                                      \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32, 2) NAME(const AttnParams p) { \
        pd_decode<BF16, D, KV>(p);                                                        \
    }

// The host compiles only the variant it needs (-DPD_D=128 -DPD_BF16=1 -DPD_KV=1); without
// the defines every variant is built (the CI compile check). PD_KV: 0 = the activation dtype,
// 1 = E4M3, 2 = E5M2.
#ifdef PD_D
#define PD_ALL 0
#else
#define PD_ALL 1
#define PD_D 0
#define PD_BF16 0
#define PD_KV 0
#endif
#define PD_WANT(BF, D, KV) (PD_ALL || (PD_D == (D) && PD_BF16 == (BF) && PD_KV == (KV)))
// One entry point per (activation dtype, cache dtype, head size).
#if PD_WANT(0, 64, 0)
PD_DEFINE(paged_decode_f16_d64, false, 64, 0)
#endif
#if PD_WANT(0, 96, 0)
PD_DEFINE(paged_decode_f16_d96, false, 96, 0)
#endif
#if PD_WANT(0, 128, 0)
PD_DEFINE(paged_decode_f16_d128, false, 128, 0)
#endif
#if PD_WANT(0, 64, 1)
PD_DEFINE(paged_decode_f16_e4m3_d64, false, 64, 1)
#endif
#if PD_WANT(0, 96, 1)
PD_DEFINE(paged_decode_f16_e4m3_d96, false, 96, 1)
#endif
#if PD_WANT(0, 128, 1)
PD_DEFINE(paged_decode_f16_e4m3_d128, false, 128, 1)
#endif
#if PD_WANT(0, 64, 2)
PD_DEFINE(paged_decode_f16_e5m2_d64, false, 64, 2)
#endif
#if PD_WANT(0, 96, 2)
PD_DEFINE(paged_decode_f16_e5m2_d96, false, 96, 2)
#endif
#if PD_WANT(0, 128, 2)
PD_DEFINE(paged_decode_f16_e5m2_d128, false, 128, 2)
#endif
#if PD_WANT(1, 64, 0)
PD_DEFINE(paged_decode_bf16_d64, true, 64, 0)
#endif
#if PD_WANT(1, 96, 0)
PD_DEFINE(paged_decode_bf16_d96, true, 96, 0)
#endif
#if PD_WANT(1, 128, 0)
PD_DEFINE(paged_decode_bf16_d128, true, 128, 0)
#endif
#if PD_WANT(1, 64, 1)
PD_DEFINE(paged_decode_bf16_e4m3_d64, true, 64, 1)
#endif
#if PD_WANT(1, 96, 1)
PD_DEFINE(paged_decode_bf16_e4m3_d96, true, 96, 1)
#endif
#if PD_WANT(1, 128, 1)
PD_DEFINE(paged_decode_bf16_e4m3_d128, true, 128, 1)
#endif
#if PD_WANT(1, 64, 2)
PD_DEFINE(paged_decode_bf16_e5m2_d64, true, 64, 2)
#endif
#if PD_WANT(1, 96, 2)
PD_DEFINE(paged_decode_bf16_e5m2_d96, true, 96, 2)
#endif
#if PD_WANT(1, 128, 2)
PD_DEFINE(paged_decode_bf16_e5m2_d128, true, 128, 2)
#endif
