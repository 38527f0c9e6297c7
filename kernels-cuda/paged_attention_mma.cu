// Paged attention on tensor cores (FlashAttention-2 forward, mma.sync m16n8k16 through
// inline PTX, ldmatrix, cp.async) for f16 / bf16 activations with a cache of the same dtype
// and head sizes 64, 96 and 128 (256 would spill its 128 f32 accumulators per thread on
// sm_90 with this tiling; it stays on the CUDA-core kernel). The host uses it for the
// prefill / chunked-prefill requests of a batch (query length >= 16) when it is enabled;
// everything else runs on the CUDA-core kernel of paged_attention.cu, which is also the
// reference for the semantics.
//
// Work: the same WorkItem list as paged_attention.cu (see common.cuh), planned with up to 64
// rows per item: query tokens [q_start, q_start + q_len) of request `req` times query heads
// kv_head*group + [head_start, head_start + head_count), row r = token r / head_count, head
// r % head_count (the heads of a GQA group share every K/V tile). num_splits is always 1.
//
// Algorithm per CTA (4 warps, 64 rows, warp w owns rows 16w..16w+15):
//  1. The Q tile [64][D] is copied to shared memory with cp.async (rows past the item's rows
//     zero-filled) and held in registers as mma A fragments (ldmatrix.x4; the Q_REGS = false
//     path, which reloads them from shared memory every tile, is kept for larger D).
//  2. Keys are visited in tiles of 64 positions starting at the union of the rows' visible
//     ranges (aligned down to 16). K and V tiles [64][D] are gathered from the paged cache with
//     cp.async, 16 bytes at a time (block-table lookup per key); positions outside the
//     visible union are zero-filled, so masked V rows hold zeros, never stale NaNs.
//     STAGES = 1: each tile is loaded, waited for, then computed. STAGES = 2 (the `_s2`
//     entry points): K/V tiles are double-buffered, the copy of tile i+1 is issued before
//     tile i is computed (one barrier after the wait makes tile i visible, one after the
//     compute frees its buffer for tile i+2), so the gather overlaps the tensor-core work.
//  3. S = Q K^T: per warp 16 x 64 scores in 8 n-tiles (ldmatrix.x4 on K rows gives the B
//     fragments of two n-tiles). A warp whose rows see no key of the tile skips it.
//  4. Per score: s *= scale, soft cap c*tanh(s/c), ALiBi -slope*|pos - j|, mask (-inf). Each
//     thread owns two rows (lane/4 and lane/4 + 8); row maxima are reduced over the 4 lanes of
//     a quad; the running max m, the per-thread partial denominator l and the O accumulators
//     are rescaled by exp(m_old - m_new); P = exp(s - m_new) is packed to f16x2 / bf16x2
//     (the C layout of two n-tiles is the A layout of one k16 step) and O += P V with
//     ldmatrix.x4.trans on the V tile.
//  5. l is reduced over the quad; out = O / l (0 when l = 0), lse = m + ln l (-inf when the row
//     saw neither key nor sink). A sink starts a row at m = sink and adds 1 to the partial l of
//     one lane of the quad.
//
// Layouts: as paged_attention.cu (q [T][H][D], cache NHD or HND, out [T][H][D] in the
// activation dtype, lse [H][num_tokens]); shared memory: the Q tile, then STAGES K tiles,
// then STAGES V tiles, 64 rows each with a row stride of D + 8 elements (16-byte aligned
// rows for ldmatrix, conflict-free banks).
//
// Bounds relied on (host side): as paged_attention.cu, plus q_len * head_count <= 64,
// head_size == D, q and cache 16-byte aligned (allocations are 256-byte aligned and every
// row offset is a multiple of D elements, D a multiple of 16), dynamic shared memory =
// (1 + 2 * STAGES) * 64 * (D + 8) * 2 bytes, compute capability >= 8.0 (cp.async, ldmatrix,
// bf16 mma).

#include "common.cuh"

#define MMA_WARPS 4
#define MMA_ROWS 64
#define MMA_KEYS 64

// cp.async: all groups issued so far complete.
__device__ __forceinline__ void pa_cp_async_wait_all() {
    ptx_cp_async_commit();
    ptx_cp_async_wait<0>();
}

// Issues the cp.async copies of the K and V tile of keys [c0, c0 + 64) into k_s / v_s
// (positions outside [span_lo, span_hi) zero-filled). Not committed or waited for here.
template <int D>
__device__ __forceinline__ void pa_mma_load_kv(const AttnParams& p, const WorkItem& it,
                                               const pa_u16* cache, const int* bt, int c0,
                                               int span_lo, int span_hi, pa_u16* k_s,
                                               pa_u16* v_s) {
    constexpr int S = D + 8;
    constexpr int CH = D / 8;
    for (int i = threadIdx.x; i < MMA_KEYS * CH; i += blockDim.x) {
        const int j = i / CH;
        const int c = i - j * CH;
        const int kp = c0 + j;
        const pa_u16* ks = cache;
        const pa_u16* vs = cache;
        int bytes = 0;
        if (kp >= span_lo && kp < span_hi) {
            const pa_i64 block = bt[kp / p.block_size];
            const int off = kp % p.block_size;
            ks = cache + pa_cache_offset(block, 0, off, it.kv_head, p.block_size, p.num_kv_heads,
                                         D, p.layout_hnd) + c * 8;
            vs = cache + pa_cache_offset(block, 1, off, it.kv_head, p.block_size, p.num_kv_heads,
                                         D, p.layout_hnd) + c * 8;
            bytes = 16;
        }
        ptx_cp_async16(ptx_smem_addr(k_s + j * S + c * 8), ks, bytes);
        ptx_cp_async16(ptx_smem_addr(v_s + j * S + c * 8), vs, bytes);
    }
}

template <bool BF16, int D, int STAGES>
__device__ __forceinline__ void pa_mma_attend(const AttnParams& p) {
    constexpr int S = D + 8;       // shared row stride in elements
    constexpr int KT = D / 16;     // k16 steps of Q K^T
    constexpr int NT = D / 8;      // n8 tiles of O
    constexpr int CH = D / 8;      // 16-byte chunks per row
    constexpr bool Q_REGS = D <= 128;
    extern __shared__ uint4 pa_mma_smem[];
    static_assert(STAGES == 1 || STAGES == 2, "one or two K/V buffers");
    pa_u16* q_s = (pa_u16*)pa_mma_smem;
    pa_u16* k_s0 = q_s + MMA_ROWS * S;           // STAGES K tiles
    pa_u16* v_s0 = k_s0 + STAGES * MMA_KEYS * S;  // then STAGES V tiles

    const WorkItem it = p.items[blockIdx.x];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g4 = lane >> 2;
    const int t4 = lane & 3;
    const int hc = it.head_count;
    const int rows = it.q_len * hc;
    const int qsl0 = p.query_start_loc[it.req];
    const int req_q_len = p.query_start_loc[it.req + 1] - qsl0;
    const int ctx = p.seq_lens[it.req] - req_q_len;
    const int pos0 = ctx + (it.q_start - qsl0);
    const int head0 = it.kv_head * p.group + it.head_start;
    const pa_u16* q = (const pa_u16*)p.q;
    const pa_u16* cache = (const pa_u16*)p.cache;

    // 1. Q tile.
    for (int i = tid; i < MMA_ROWS * CH; i += blockDim.x) {
        const int r = i / CH;
        const int c = i - r * CH;
        const pa_u16* src = q;
        int bytes = 0;
        if (r < rows) {
            const int t = it.q_start + r / hc;
            const int h = head0 + r % hc;
            src = q + ((pa_i64)t * p.num_heads + h) * D + c * 8;
            bytes = 16;
        }
        ptx_cp_async16(ptx_smem_addr(q_s + r * S + c * 8), src, bytes);
    }
    pa_cp_async_wait_all();
    __syncthreads();

    int pos[2], qh[2], lo[2], hi[2];
    float m[2], l[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = 16 * warp + g4 + 8 * i;
        const bool act = r < rows;
        const int rr = act ? r : 0;
        pos[i] = pos0 + rr / hc;
        qh[i] = head0 + rr % hc;
        pa_visible(p, pos[i], it.kv_lo, it.kv_hi, &lo[i], &hi[i]);
        if (!act) hi[i] = lo[i];
        const bool sink = p.use_sinks && act;
        m[i] = sink ? p.sinks[qh[i]] : -PA_INF;
        l[i] = (sink && t4 == 0) ? 1.0f : 0.0f;
    }
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    // A fragments of this warp's 16 rows: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15).
    const int a_row = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
    const int a_col = 8 * (lane >> 4);
    pa_u32 qf[Q_REGS ? KT : 1][4];
    if (Q_REGS) {
#pragma unroll
        for (int kk = 0; kk < (Q_REGS ? KT : 1); ++kk) {
            ptx_ldmatrix_x4(ptx_smem_addr(q_s + a_row * S + 16 * kk + a_col), qf[kk][0], qf[kk][1],
                           qf[kk][2], qf[kk][3]);
        }
    }

    // 2. Key tiles over the union of the rows' visible ranges.
    int span_lo, span_hi, tmp;
    pa_visible(p, pos0, it.kv_lo, it.kv_hi, &span_lo, &tmp);
    pa_visible(p, pos0 + it.q_len - 1, it.kv_lo, it.kv_hi, &tmp, &span_hi);
    span_lo = max(span_lo, it.kv_lo);
    span_hi = min(span_hi, it.kv_hi);
    const int* bt = p.block_table + (pa_i64)it.req * p.bt_stride;
    // ldmatrix lane addressing for K (two n-tiles x k16) and V (k16 x two d-tiles, .trans).
    const int k_row = (lane & 7) + 8 * (lane >> 4);
    const int k_col = 8 * ((lane >> 3) & 1);
    const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1);
    const int v_col = 8 * (lane >> 4);

    const int first = span_lo - span_lo % 16;
    if (STAGES == 2 && first < span_hi) {
        pa_mma_load_kv<D>(p, it, cache, bt, first, span_lo, span_hi, k_s0, v_s0);
        ptx_cp_async_commit();
    }
    int stage = 0;
    for (int c0 = first; c0 < span_hi; c0 += MMA_KEYS, stage ^= (STAGES - 1)) {
        pa_u16* k_s = k_s0 + stage * MMA_KEYS * S;
        pa_u16* v_s = v_s0 + stage * MMA_KEYS * S;
        if (STAGES == 1) {
            __syncthreads();  // the previous tile is consumed
            pa_mma_load_kv<D>(p, it, cache, bt, c0, span_lo, span_hi, k_s, v_s);
            pa_cp_async_wait_all();
        } else if (c0 + MMA_KEYS < span_hi) {
            // The other buffer was freed by the barrier that ended the previous tile.
            pa_mma_load_kv<D>(p, it, cache, bt, c0 + MMA_KEYS, span_lo, span_hi,
                              k_s0 + (stage ^ 1) * MMA_KEYS * S, v_s0 + (stage ^ 1) * MMA_KEYS * S);
            ptx_cp_async_commit();
            ptx_cp_async_wait<1>();  // this tile's group is complete, the next may fly
        } else {
            ptx_cp_async_wait<0>();
        }
        __syncthreads();

        bool any = false;
#pragma unroll
        for (int i = 0; i < 2; ++i) any |= lo[i] < hi[i] && lo[i] < c0 + MMA_KEYS && hi[i] > c0;
        // Warp-uniform. No early `continue`: with two stages every thread must reach the
        // barrier at the end of the tile.
        if (__any_sync(PA_FULL_MASK, any)) {
            // 3. S = Q K^T.
            float s[8][4];
#pragma unroll
            for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KT; ++kk) {
                pa_u32 a[4];
                if (Q_REGS) {
                    a[0] = qf[Q_REGS ? kk : 0][0];
                    a[1] = qf[Q_REGS ? kk : 0][1];
                    a[2] = qf[Q_REGS ? kk : 0][2];
                    a[3] = qf[Q_REGS ? kk : 0][3];
                } else {
                    ptx_ldmatrix_x4(ptx_smem_addr(q_s + a_row * S + 16 * kk + a_col), a[0], a[1],
                                    a[2], a[3]);
                }
#pragma unroll
                for (int j = 0; j < 8; j += 2) {
                    pa_u32 b0, b1, b2, b3;
                    ptx_ldmatrix_x4(ptx_smem_addr(k_s + (8 * j + k_row) * S + 16 * kk + k_col),
                                    b0, b1, b2, b3);
                    ptx_mma<BF16>(s[j], a, b0, b1);
                    ptx_mma<BF16>(s[j + 1], a, b2, b3);
                }
            }

            // 4. Modifiers, mask, online softmax.
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e >> 1;
                    const int kp = c0 + 8 * j + 2 * t4 + (e & 1);
                    float x = s[j][e] * p.scale;
                    if (p.soft_cap > 0.0f) x = p.soft_cap * tanhf(x / p.soft_cap);
                    if (p.alibi != 0) x -= p.alibi[qh[i]] * fabsf((float)(pos[i] - kp));
                    x = (kp >= lo[i] && kp < hi[i]) ? x : -PA_INF;
                    s[j][e] = x;
                    mx[i] = fmaxf(mx[i], x);
                }
            }
            float msub[2], alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(PA_FULL_MASK, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(PA_FULL_MASK, mx[i], 2));
                msub[i] = mx[i] == -PA_INF ? 0.0f : mx[i];
                alpha[i] = expf(m[i] - msub[i]);
                m[i] = mx[i];
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float x = expf(s[j][e] - msub[e >> 1]);
                    s[j][e] = x;
                    rs[e >> 1] += x;
                }
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + rs[i];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                o[n][2] *= alpha[1];
                o[n][3] *= alpha[1];
            }

            // O += P V.
#pragma unroll
            for (int kk = 0; kk < MMA_KEYS / 16; ++kk) {
                pa_u32 a[4];
                a[0] = ptx_pack2<BF16>(s[2 * kk][0], s[2 * kk][1]);
                a[1] = ptx_pack2<BF16>(s[2 * kk][2], s[2 * kk][3]);
                a[2] = ptx_pack2<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                a[3] = ptx_pack2<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int n = 0; n < NT; n += 2) {
                    pa_u32 b0, b1, b2, b3;
                    ptx_ldmatrix_x4_trans(
                        ptx_smem_addr(v_s + (16 * kk + v_row) * S + 8 * n + v_col), b0, b1, b2, b3);
                    ptx_mma<BF16>(o[n], a, b0, b1);
                    ptx_mma<BF16>(o[n + 1], a, b2, b3);
                }
            }
        }  // any
        if (STAGES == 2) __syncthreads();  // this buffer is consumed before it is refilled
    }

    // 5. Results.
    const int out_dt = BF16 ? PA_BF16 : PA_F16;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float lt = l[i];
        lt += __shfl_xor_sync(PA_FULL_MASK, lt, 1);
        lt += __shfl_xor_sync(PA_FULL_MASK, lt, 2);
        const int r = 16 * warp + g4 + 8 * i;
        if (r >= rows) continue;
        const int t = it.q_start + r / hc;
        const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
        const pa_i64 base = ((pa_i64)t * p.num_heads + qh[i]) * D;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int d = 8 * n + 2 * t4;
            pa_store(p.out, base + d, out_dt, o[n][2 * i] * inv);
            pa_store(p.out, base + d + 1, out_dt, o[n][2 * i + 1] * inv);
        }
        if (t4 == 0 && p.lse != 0) {
            p.lse[(pa_i64)qh[i] * p.num_tokens + t] = lt > 0.0f ? m[i] + logf(lt) : -PA_INF;
        }
    }
}

#define PA_MMA_DEFINE(NAME, BF16, D)                                                   \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32, 1) NAME(const AttnParams p) { \
        pa_mma_attend<BF16, D, 1>(p);                                                  \
    }                                                                                  \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32, 1)                    \
        NAME##_s2(const AttnParams p) {                                                \
        pa_mma_attend<BF16, D, 2>(p);                                                  \
    }

// The host compiles only the variant it needs (-DPA_MMA_D=128 -DPA_MMA_BF16=1); without the
// defines every variant is built (the CI compile check).
#ifdef PA_MMA_D
#define PA_MMA_ALL 0
#else
#define PA_MMA_ALL 1
#define PA_MMA_D 0
#define PA_MMA_BF16 0
#endif
#define PA_MMA_WANT(BF, D) (PA_MMA_ALL || (PA_MMA_D == (D) && PA_MMA_BF16 == (BF)))
#if PA_MMA_WANT(0, 64)
PA_MMA_DEFINE(paged_attention_mma_f16_d64, false, 64)
#endif
#if PA_MMA_WANT(0, 96)
PA_MMA_DEFINE(paged_attention_mma_f16_d96, false, 96)
#endif
#if PA_MMA_WANT(0, 128)
PA_MMA_DEFINE(paged_attention_mma_f16_d128, false, 128)
#endif
#if PA_MMA_WANT(1, 64)
PA_MMA_DEFINE(paged_attention_mma_bf16_d64, true, 64)
#endif
#if PA_MMA_WANT(1, 96)
PA_MMA_DEFINE(paged_attention_mma_bf16_d96, true, 96)
#endif
#if PA_MMA_WANT(1, 128)
PA_MMA_DEFINE(paged_attention_mma_bf16_d128, true, 128)
#endif
