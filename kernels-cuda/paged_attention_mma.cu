// Paged attention on tensor cores (FlashAttention-2 forward, mma.sync m16n8k16 through
// inline PTX, ldmatrix, cp.async) for f16 / bf16 activations with a cache of the same dtype
// and head sizes 64, 96 and 128 (256 would spill its 128 f32 accumulators per thread on
// sm_90 with this tiling; it stays on the CUDA-core kernel). The host uses it for the
// prefill / chunked-prefill requests of a batch (query length >= 16) when it is enabled;
// everything else runs on the CUDA-core kernel of paged_attention.cu, which is also the
// reference for the semantics.
//
// Work: the same WorkItem list as paged_attention.cu (see common.cuh), planned with up to
// MMA_ROWS (16 * PA_MMA_MT * PA_MMA_WARPS: 64, 128 or 256) rows per item: query tokens
// [q_start, q_start + q_len) of request `req` times query heads
// kv_head*group + [head_start, head_start + head_count), row r = token r / head_count, head
// r % head_count (the heads of a GQA group share every K/V tile). num_splits is always 1.
//
// Algorithm per CTA (PA_MMA_WARPS = 4 or 8 warps of MT m16 tiles: warp w owns rows
// 16 MT w .. 16 MT w + 16 MT - 1; with MT = 2 every K and V fragment read from shared memory
// feeds two mma instead of one, which halves the ldmatrix traffic per FLOP; with more rows per
// CTA each K/V tile fetched from L2 feeds more rows):
//  1. The Q tile [MMA_ROWS][D] is copied to shared memory with cp.async (rows past the item's
//     rows zero-filled). Its mma A fragments (ldmatrix.x4) stay in registers at D = 64 and are
//     re-read from shared memory per k16 step at larger D (registers go to the accumulators).
//  2. Keys are visited in tiles of 64 positions starting at the union of the rows' visible
//     ranges (aligned down to 16). K and V tiles [64][D] are gathered from the paged cache with
//     cp.async, 16 bytes at a time; positions outside the visible union are zero-filled, so
//     masked V rows hold zeros, never stale NaNs. The tiles are double-buffered and the
//     gather is pipelined two deep: while tile i is computed, the copy of tile i+1 is in
//     flight and threads 0..63 read the block-table entries of tile i+2 (one key row each)
//     into registers; after the compute they store the rows' global addresses (0 outside the
//     visible union) to a small shared table, which the copies of tile i+2 read a tile later.
//     So no thread waits on the block table before issuing copies, the division by the block
//     size happens once per key row, and a 16-byte copy costs a shared load and two adds.
//     One barrier per tile: the one after the wait makes tile i visible, and since every
//     warp is then past tile i-1, it also frees that buffer and publishes the addresses, so
//     tile i+1's copy is issued right after it.
//  3. Each 64-key tile is computed in sub-tiles of SUBK keys (64, except 32 in the soft cap /
//     ALiBi form at MT = 2; -DPA_MMA_SUBK overrides), so that the live scores fit in
//     registers beside the MT * D / 2 accumulators, each one online-softmax step. S = Q K^T: per warp MT x 16 x SUBK scores (ldmatrix.x4 on K rows
//     gives the B fragments of two n-tiles). A warp whose rows see no key of a sub-tile
//     skips it.
//  4. The softmax runs in base 2: scores are scaled by scale * log2(e) (without soft cap and
//     ALiBi -- a separate build, -DPA_MMA_PLAIN=1, so the common path has no per-score
//     branch and its own register allocation -- the
//     scale is folded into the exponent's FFMA, 2^(s * c - m); with them, c*tanh(s/c) and
//     -slope*|pos - j| are applied in natural units first), masked to -inf outside each row's
//     visible range (skipped when the sub-tile lies inside every row's range: the interior
//     tiles of a long prefill), and exponentiated with ex2.approx (one FFMA + one MUFU op per
//     score). Each thread owns two rows of each m-tile (lane/4 and lane/4 + 8; a row past
//     the item's rows is computed as if it saw every key, so it never forces the mask, and
//     is never stored); row maxima are reduced over the 4 lanes of a quad; the running max m, the per-thread partial denominator l and the O accumulators are
//     rescaled by 2^(m_old - m_new) (skipped when that is 1 for the whole warp);
//     P = 2^(s - m_new) is packed to f16x2 / bf16x2 (the C layout of two n-tiles is the A
//     layout of one k16 step) and O += P V with ldmatrix.x4.trans on the V tile.
//  5. l is reduced over the quad; out = O / l (0 when l = 0), lse = m ln 2 + ln l (-inf when
//     the row saw neither key nor sink). A sink starts a row at m = sink * log2(e) and adds 1
//     to the partial l of one lane of the quad.
//
// Layouts: as paged_attention.cu (q [T][H][D], cache NHD or HND, out [T][H][D] in the
// activation dtype, lse [H][num_tokens]); dynamic shared memory: the Q tile (MMA_ROWS
// rows), then 2 K tiles, then 2 V tiles (64 rows each), row stride D + 8 elements (16-byte
// aligned rows for ldmatrix, conflict-free banks); static: the key-row addresses of two
// tiles (1 KiB).
//
// Bounds relied on (host side): as paged_attention.cu, plus q_len * head_count <= MMA_ROWS,
// head_size == D, q and cache 16-byte aligned (allocations are 256-byte aligned and every
// row offset is a multiple of D elements, D a multiple of 16), 32 * PA_MMA_WARPS threads,
// dynamic shared memory = (MMA_ROWS + 256) * (D + 8) * 2 bytes, compute capability >= 8.0
// (cp.async, ldmatrix, bf16 mma). Block-table entries are read only for keys inside the item's visible union.

#include "common.cuh"
#include "prefill_tile.cuh"

// m16 tiles per warp: 1 (64 rows per CTA, the host's default) or 2 (128 rows); the host
// passes -DPA_MMA_MT. Without it the default form is built (the CI whole-file check for
// sm_80 / sm_90; the run-time variant check compiles both forms for sm_90).
#ifndef PA_MMA_MT
#define PA_MMA_MT 1
#endif
// Warps per CTA (4 or 8; -DPA_MMA_WARPS): every warp owns MT m16 tiles of the CTA's rows and
// all of them share each K/V tile, so 8 warps halve the K/V traffic per FLOP of 4.
#ifndef PA_MMA_WARPS
#define PA_MMA_WARPS 4
#endif
// Resident CTAs per SM the register allocation must allow (__launch_bounds__ min blocks).
#ifndef PA_MMA_MINB
#define PA_MMA_MINB 1
#endif
#define MMA_WARPS PA_MMA_WARPS
#define MMA_THREADS (MMA_WARPS * 32)
#define MMA_MT PA_MMA_MT
#define MMA_ROWS (16 * MMA_MT * MMA_WARPS)
#define MMA_KEYS 64
// PA_MMA_PLAIN = 1: only the form without soft cap and ALiBi; 0: only the form with them
// (the host compiles the one its layer needs: each gets its own register allocation, and the
// plain form is the hot one); undefined: both, chosen at entry (the CI whole-file check).
#ifndef PA_MMA_PLAIN
#define PA_MMA_PLAIN -1
#endif
// Keys per online-softmax step (-DPA_MMA_SUBK): 64 (Q fragments re-read once per 64 keys);
// two m16 tiles of the soft cap / ALiBi form hold their scores for 32 keys at a time (64
// does not fit in 255 registers beside the 2 x D/2 accumulators at D = 128 there; the plain
// form fits 64 in 254).
#ifdef PA_MMA_SUBK
#define MMA_SUBK PA_MMA_SUBK
#else
#define MMA_SUBK ((MMA_MT == 1 || PA_MMA_PLAIN == 1) ? 64 : 32)
#endif
static_assert(MMA_MT == 1 || MMA_MT == 2, "one or two m16 tiles per warp");
static_assert(MMA_WARPS == 4 || MMA_WARPS == 8, "4 or 8 warps per CTA");
static_assert(MMA_SUBK == 32 || MMA_SUBK == 64, "32 or 64 keys per softmax step");

// Element offset of the K row of key `kp` for this item's KV head (the V row is `v_delta`
// further), or -1 when kp is outside [span_lo, span_hi) (its copies are zero-filled).
// `block` is the block-table entry of kp's page, loaded beforehand.
__device__ __forceinline__ pa_i64 pa_mma_key_offset(const AttnParams& p, const WorkItem& it,
                                                    int kp, int block, int span_lo,
                                                    int span_hi, int D) {
    if (kp < span_lo || kp >= span_hi) return -1;
    return pa_cache_offset(block, 0, kp % p.block_size, it.kv_head, p.block_size,
                           p.num_kv_heads, D, p.layout_hnd);
}

// One 16-byte chunk of a K row and of its V row: `row` is the K row's global byte address
// (0: the key is outside the item's visible union, both chunks are zero-filled from the valid
// address `dummy` without reading it), `cb` the chunk's byte offset in the row, `vb` that
// plus the V row's distance.
__device__ __forceinline__ void pa_mma_copy_chunk(pa_u32 k_dst, pa_u32 v_dst, pa_u64 row,
                                                  pa_u64 cb, pa_u64 vb, const void* dummy) {
    if (row != 0) {
        ptx_cp_async16_full(k_dst, (const void*)(row + cb));
        ptx_cp_async16_full(v_dst, (const void*)(row + vb));
    } else {
        ptx_cp_async16(k_dst, dummy, 0);
        ptx_cp_async16(v_dst, dummy, 0);
    }
}

// Issues the cp.async copies of the K and V tile whose key rows start at the global byte
// addresses krow[0..64) (0: zero-fill) to the shared tiles at k_sa / v_sa (32-bit shared
// addresses). Not committed or waited for here. The addresses come from shared memory, so no
// thread waits on the block table here. Why the two forms: where the CTA's threads divide a
// row's 16-byte chunks evenly (D = 64, 128), each thread copies the same chunk column of
// every (MMA_THREADS / CH)-th row, so its chunk offsets and shared destinations are constants
// and a chunk costs one shared load, two 64-bit adds and its copies (a warp still copies whole
// contiguous rows); otherwise (D = 96) row and column are recomputed per chunk.
template <int D>
__device__ __forceinline__ void pa_mma_load_kv(const pa_u16* cache, const pa_u64* krow,
                                               pa_i64 v_delta_b, pa_u32 k_sa, pa_u32 v_sa) {
    constexpr int S = D + 8;
    constexpr int CH = D / 8;
    static_assert(MMA_KEYS * CH % MMA_THREADS == 0, "whole copy rounds");
    if constexpr (MMA_THREADS % CH == 0) {
        constexpr int RSTEP = MMA_THREADS / CH;  // rows per copy round
        const int c = threadIdx.x % CH;
        const int j0 = threadIdx.x / CH;
        const pa_u64 cb = (pa_u64)c * 16;
        const pa_u64 vb = cb + (pa_u64)v_delta_b;
        const pa_u32 dst0 = (pa_u32)(j0 * S + c * 8) * 2;
#pragma unroll
        for (int k = 0; k < MMA_KEYS / RSTEP; ++k) {
            const pa_u32 dst = dst0 + (pa_u32)(k * RSTEP * S * 2);
            pa_mma_copy_chunk(k_sa + dst, v_sa + dst, krow[j0 + k * RSTEP], cb, vb, cache);
        }
    } else {
#pragma unroll
        for (int k = 0; k < MMA_KEYS * CH / MMA_THREADS; ++k) {
            const int i = threadIdx.x + k * MMA_THREADS;
            const int j = i / CH;
            const int c = i - j * CH;
            const pa_u64 cb = (pa_u64)c * 16;
            const pa_u32 dst = (pa_u32)(j * S + c * 8) * 2;
            pa_mma_copy_chunk(k_sa + dst, v_sa + dst, krow[j], cb, cb + (pa_u64)v_delta_b,
                              cache);
        }
    }
}

// PLAIN: the layer has neither soft cap nor ALiBi (the entry point picks the instantiation,
// so the common path carries no per-score branch on them and its loop stays small).
template <bool BF16, int D, bool PLAIN>
__device__ __forceinline__ void pa_mma_attend(const AttnParams& p) {
    constexpr int S = D + 8;       // shared row stride in elements
    constexpr int SB = 2 * S;      // ... in bytes
    constexpr int KT = D / 16;     // k16 steps of Q K^T
    constexpr int NT = D / 8;      // n8 tiles of O
    constexpr int CH = D / 8;      // 16-byte chunks per row
    constexpr int MT = MMA_MT;
    constexpr int SUBK = MMA_SUBK;  // keys per online-softmax step
    constexpr int NJ = SUBK / 8;    // n8 tiles of S per step
    constexpr int TILE_B = MMA_KEYS * SB;  // bytes of one K or V tile
    // Q fragments stay in registers only where they fit beside the MT * NT * 4 accumulators
    // and MT * 32 scores (d64); larger heads reload them from shared memory per k16 step.
    constexpr bool Q_REGS = D <= 64;
    extern __shared__ uint4 pa_mma_smem[];
    // Global byte addresses of the K rows of the two tiles in flight (0: zero-fill).
    __shared__ pa_u64 krow_s[2][MMA_KEYS];
    // 32-bit shared addresses: the Q tile, then 2 K tiles, then 2 V tiles.
    const pa_u32 q_sa = ptx_smem_addr(pa_mma_smem);
    const pa_u32 k_sa0 = q_sa + MMA_ROWS * SB;
    const pa_u32 v_sa0 = k_sa0 + 2 * TILE_B;

    const WorkItem it = p.items[blockIdx.x];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g4 = lane >> 2;
    const int t4 = lane & 3;
    const PaPrefillItem geo = pa_prefill_item(p, it);
    const int hc = geo.hc;
    const int rows = geo.rows;
    const int pos0 = geo.pos0;
    const int head0 = geo.head0;
    const pa_u16* q = (const pa_u16*)p.q;
    const pa_u16* cache = (const pa_u16*)p.cache;
    const pa_i64 v_delta_b = (pa_i64)p.block_size * p.num_kv_heads * D * 2;

    // Key tiles cover the union of the rows' visible ranges, from `first` (aligned down to 16).
    const int span_lo = geo.span_lo;
    const int span_hi = geo.span_hi;
    const int* bt = p.block_table + (pa_i64)it.req * p.bt_stride;
    const int first = geo.first;
    // Threads 0..63 own one key row of every tile: they read its block-table entry one tile
    // ahead of the copy that needs it (the read flies during a tile's compute).
    const bool owner = tid < MMA_KEYS;
    auto table_entry = [&](int c) -> int {
        const int kp = c + tid;
        return (owner && kp >= span_lo && kp < span_hi) ? bt[kp / p.block_size] : 0;
    };
    auto row_address = [&](int kp, int block) -> pa_u64 {
        const pa_i64 o = pa_mma_key_offset(p, it, kp, block, span_lo, span_hi, D);
        return o >= 0 ? (pa_u64)(cache + o) : 0;
    };
    if (owner) {
        krow_s[0][tid] = row_address(first + tid, table_entry(first));
        const int c1 = first + MMA_KEYS;
        krow_s[1][tid] = row_address(c1 + tid, table_entry(c1));
    }

    // 1. Q tile (rows past the item's rows zero-filled), in the same copy group as K/V tile 0.
    for (int i = tid; i < MMA_ROWS * CH; i += MMA_THREADS) {
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
        ptx_cp_async16(q_sa + (pa_u32)(r * S + c * 8) * 2, src, bytes);
    }
    __syncthreads();  // krow_s of tiles 0 and 1
    if (first < span_hi) pa_mma_load_kv<D>(cache, krow_s[0], v_delta_b, k_sa0, v_sa0);
    ptx_cp_async_commit();

    // Per-row state, softmax in base 2: m is in units of log2 (the natural max times log2 e).
    // Thread rows: m-tile t, half i -> row rbase + 16 t + 8 i. A row past the item's rows
    // "sees" every key (it is computed, never stored), so it never forces the mask.
    // Each row's visible range [lo, hi) lives in shared memory (read by the masked sub-tiles
    // only); the loop keeps four warp-wide bounds instead: the union [u_lo, u_hi) of the
    // non-empty ranges (a sub-tile outside it is skipped) and the intersection [n_lo, n_hi)
    // (a sub-tile inside it needs no mask). Why: registers (255 at two m-tiles per warp).
    __shared__ int2 vis_s[MMA_ROWS];
    const int rbase = 16 * MT * warp + g4;
    float m[MT][2], l[MT][2];
    int u_lo = 1 << 30, u_hi = -(1 << 30), n_lo = -(1 << 30), n_hi = 1 << 30;
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = rbase + 16 * t + 8 * i;
            const bool act = r < rows;
            int lo, hi;
            pa_visible(p, pos0 + r / hc, it.kv_lo, it.kv_hi, &lo, &hi);
            if (!act) {
                lo = -(1 << 30);
                hi = 1 << 30;
            }
            if (t4 == 0) vis_s[r] = make_int2(lo, hi);
            if (lo < hi) {
                u_lo = min(u_lo, lo);
                u_hi = max(u_hi, hi);
            }
            n_lo = max(n_lo, lo);
            n_hi = min(n_hi, hi);
            const bool sink = p.use_sinks && act;
            m[t][i] = sink ? p.sinks[head0 + r % hc] * PA_LOG2E : -PA_INF;
            l[t][i] = (sink && t4 == 0) ? 1.0f : 0.0f;
        }
    }
#pragma unroll
    for (int x = 1; x < 32; x <<= 1) {
        u_lo = min(u_lo, __shfl_xor_sync(PA_FULL_MASK, u_lo, x));
        u_hi = max(u_hi, __shfl_xor_sync(PA_FULL_MASK, u_hi, x));
        n_lo = max(n_lo, __shfl_xor_sync(PA_FULL_MASK, n_lo, x));
        n_hi = min(n_hi, __shfl_xor_sync(PA_FULL_MASK, n_hi, x));
    }
    // The four bounds are read back once per sub-tile (one 16-byte shared load) instead of
    // living in registers through the loop: 4 registers, which the 64-key softmax step at
    // two m-tiles needs.
    __shared__ int4 bounds_s[MMA_WARPS];
    if (lane == 0) bounds_s[warp] = make_int4(u_lo, u_hi, n_lo, n_hi);
    __syncwarp();  // vis_s rows and bounds of this warp (read only by this warp)
    const float qk_scale = PLAIN ? p.scale * PA_LOG2E : p.scale;
    float o[MT][NT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int n = 0; n < NT; ++n) o[t][n][0] = o[t][n][1] = o[t][n][2] = o[t][n][3] = 0.0f;
    }

    // ldmatrix lane addresses (bytes): A fragments of m-tile t of Q at q_la + 16 t rows
    // (matrices rows 0-7 | 8-15 x k 0-7 | 8-15), K (two n-tiles x k16) and V (k16 x two
    // d-tiles, .trans) relative to their tile.
    const pa_u32 q_la =
        q_sa + ((16 * MT * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * S + 8 * (lane >> 4)) * 2;
    const pa_u32 k_la = (((lane & 7) + 8 * (lane >> 4)) * S + 8 * ((lane >> 3) & 1)) * 2;
    const pa_u32 v_la = (((lane & 7) + 8 * ((lane >> 3) & 1)) * S + 8 * (lane >> 4)) * 2;
    pa_u32 qf[Q_REGS ? MT : 1][Q_REGS ? KT : 1][4];

    // 2. Key tiles, double-buffered: while tile i is computed, the copy of tile i+1 is in
    // flight and the block-table entries of tile i+2 are being read.
    int stage = 0;
    for (int c0 = first; c0 < span_hi; c0 += MMA_KEYS, stage ^= 1) {
        const pa_u32 k_st = k_sa0 + stage * TILE_B;
        const pa_u32 v_st = v_sa0 + stage * TILE_B;
        // Tile i+1's copy into the other buffer: right after the one barrier, which also
        // proves that every warp finished tile i-1 with that buffer.
        auto load_next = [&]() {
            if (c0 + MMA_KEYS < span_hi) {
                pa_mma_load_kv<D>(cache, krow_s[stage ^ 1], v_delta_b,
                                  k_sa0 + (stage ^ 1) * TILE_B, v_sa0 + (stage ^ 1) * TILE_B);
            }
            ptx_cp_async_commit();  // possibly empty: keeps one group per tile
        };
        const int block2 = table_entry(c0 + 2 * MMA_KEYS);
        ptx_cp_async_wait<0>();  // tile i (and Q): the only group in flight
        __syncthreads();
        load_next();
        if (Q_REGS && c0 == first) {
#pragma unroll
            for (int t = 0; t < (Q_REGS ? MT : 1); ++t) {
#pragma unroll
                for (int kk = 0; kk < (Q_REGS ? KT : 1); ++kk) {
                    ptx_ldmatrix_x4(q_la + (16 * t * S + 16 * kk) * 2, qf[t][kk][0], qf[t][kk][1],
                                    qf[t][kk][2], qf[t][kk][3]);
                }
            }
        }

        // The tile is computed in sub-tiles of SUBK keys (each its own online-softmax step),
        // which keeps the live scores at MT * SUBK / 2 registers beside the accumulators.
#pragma unroll
        for (int hf = 0; hf < MMA_KEYS / SUBK; ++hf) {
            const int cs = c0 + SUBK * hf;
            const int4 wb = bounds_s[warp];  // u_lo, u_hi, n_lo, n_hi
            // Warp-uniform; skips this sub-tile only (the barriers lie outside this loop).
            if (!(wb.x < cs + SUBK && wb.y > cs)) continue;
            // 3. S = Q K^T: each K fragment pair feeds the MT m-tiles.
            float s[MT][NJ][4];
#pragma unroll
            for (int t = 0; t < MT; ++t) {
#pragma unroll
                for (int j = 0; j < NJ; ++j) s[t][j][0] = s[t][j][1] = s[t][j][2] = s[t][j][3] = 0.0f;
            }
#pragma unroll
            for (int kk = 0; kk < KT; ++kk) {
                pa_u32 a[MT][4];
#pragma unroll
                for (int t = 0; t < MT; ++t) {
                    if (Q_REGS) {
#pragma unroll
                        for (int x = 0; x < 4; ++x) a[t][x] = qf[Q_REGS ? t : 0][Q_REGS ? kk : 0][x];
                    } else {
                        ptx_ldmatrix_x4(q_la + (16 * t * S + 16 * kk) * 2, a[t][0], a[t][1],
                                        a[t][2], a[t][3]);
                    }
                }
#pragma unroll
                for (int j = 0; j < NJ; j += 2) {
                    pa_u32 b0, b1, b2, b3;
                    ptx_ldmatrix_x4(k_st + k_la + ((SUBK * hf + 8 * j) * S + 16 * kk) * 2, b0, b1,
                                    b2, b3);
#pragma unroll
                    for (int t = 0; t < MT; ++t) {
                        ptx_mma<BF16>(s[t][j], a[t], b0, b1);
                        ptx_mma<BF16>(s[t][j + 1], a[t], b2, b3);
                    }
                }
            }

            // 4. Modifiers, mask, online softmax (base 2).
            const bool all_inside = wb.z <= cs && wb.w >= cs + SUBK;
            float alpha[MT][2];
            bool moved = false;
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                // PLAIN: the sub-tile's raw maxima, scaled after the quad reduction.
                float mx[2] = {PLAIN ? -PA_INF : m[t][0], PLAIN ? -PA_INF : m[t][1]};
                const int r = rbase + 16 * t;
                if (all_inside) {
                    const int none[2] = {0, 0};
                    pa_mma_scores<false, PLAIN, NJ>(p, s[t], cs, t4, r, hc, pos0, head0, none,
                                                    none, qk_scale, mx);
                } else {
                    const int2 v0 = vis_s[r];
                    const int2 v1 = vis_s[r + 8];
                    const int lo[2] = {v0.x, v1.x};
                    const int hi[2] = {v0.y, v1.y};
                    pa_mma_scores<true, PLAIN, NJ>(p, s[t], cs, t4, r, hc, pos0, head0, lo, hi,
                                                   qk_scale, mx);
                }
                float msub[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(PA_FULL_MASK, mx[i], 1));
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(PA_FULL_MASK, mx[i], 2));
                    if (PLAIN) mx[i] = fmaxf(m[t][i], mx[i] * qk_scale);
                    msub[i] = mx[i] == -PA_INF ? 0.0f : mx[i];
                    alpha[t][i] = ptx_ex2(m[t][i] - msub[i]);
                    moved |= alpha[t][i] != 1.0f;
                    m[t][i] = mx[i];
                }
#pragma unroll
                for (int j = 0; j < NJ; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[t][j][e] = ptx_ex2(PLAIN ? fmaf(s[t][j][e], qk_scale, -msub[e >> 1])
                                                   : s[t][j][e] - msub[e >> 1]);
                    }
                }
                pa_mma_row_reduce<NJ, true>(s[t], rs);
#pragma unroll
                for (int i = 0; i < 2; ++i) l[t][i] = l[t][i] * alpha[t][i] + rs[i];
            }
            // Once the running maxima settle (most tiles of a long row) alpha is exactly 1.
            if (__any_sync(PA_FULL_MASK, moved)) {
#pragma unroll
                for (int t = 0; t < MT; ++t) {
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        o[t][n][0] *= alpha[t][0];
                        o[t][n][1] *= alpha[t][0];
                        o[t][n][2] *= alpha[t][1];
                        o[t][n][3] *= alpha[t][1];
                    }
                }
            }

            // O += P V: each V fragment pair feeds the MT m-tiles.
#pragma unroll
            for (int kk = 0; kk < SUBK / 16; ++kk) {
                pa_u32 a[MT][4];
#pragma unroll
                for (int t = 0; t < MT; ++t) {
                    a[t][0] = ptx_pack2<BF16>(s[t][2 * kk][0], s[t][2 * kk][1]);
                    a[t][1] = ptx_pack2<BF16>(s[t][2 * kk][2], s[t][2 * kk][3]);
                    a[t][2] = ptx_pack2<BF16>(s[t][2 * kk + 1][0], s[t][2 * kk + 1][1]);
                    a[t][3] = ptx_pack2<BF16>(s[t][2 * kk + 1][2], s[t][2 * kk + 1][3]);
                }
#pragma unroll
                for (int n = 0; n < NT; n += 2) {
                    pa_u32 b0, b1, b2, b3;
                    ptx_ldmatrix_x4_trans(v_st + v_la + ((SUBK * hf + 16 * kk) * S + 8 * n) * 2,
                                          b0, b1, b2, b3);
#pragma unroll
                    for (int t = 0; t < MT; ++t) {
                        ptx_mma<BF16>(o[t][n], a[t], b0, b1);
                        ptx_mma<BF16>(o[t][n + 1], a[t], b2, b3);
                    }
                }
            }
        }  // sub-tiles
        // Tile i+2's addresses go where tile i's were (tile i's copies were issued a tile ago,
        // before the barrier this tile began with).
        if (owner) krow_s[stage][tid] = row_address(c0 + 2 * MMA_KEYS + tid, block2);
        // This buffer is consumed before it is refilled and krow_s is written: the next
        // tile's barrier proves both.
    }
    ptx_cp_async_wait<0>();  // no copy outlives the CTA (an item with no key still loaded Q)

    // 5. Results. The item's fields are read again (an L1 / L2 hit) rather than kept in
    // registers through the key loop.
    const WorkItem& ie = p.items[blockIdx.x];
    const int e_hc = ie.head_count;
    const int e_rows = ie.q_len * e_hc;
    const int e_q0 = ie.q_start;
    const int e_head0 = ie.kv_head * p.group + ie.head_start;
    const int out_dt = BF16 ? PA_BF16 : PA_F16;
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float lt = l[t][i];
            lt += __shfl_xor_sync(PA_FULL_MASK, lt, 1);
            lt += __shfl_xor_sync(PA_FULL_MASK, lt, 2);
            const int r = rbase + 16 * t + 8 * i;
            if (r >= e_rows) continue;
            const int tok = e_q0 + r / e_hc;
            const int h = e_head0 + r % e_hc;
            const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
            const pa_i64 base = ((pa_i64)tok * p.num_heads + h) * D;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int d = 8 * n + 2 * t4;
                pa_store(p.out, base + d, out_dt, o[t][n][2 * i] * inv);
                pa_store(p.out, base + d + 1, out_dt, o[t][n][2 * i + 1] * inv);
            }
            if (t4 == 0 && p.lse != 0) {
                p.lse[(pa_i64)h * p.num_tokens + tok] =
                    lt > 0.0f ? m[t][i] * PA_LN2 + logf(lt) : -PA_INF;
            }
        }
    }
}

#if PA_MMA_PLAIN == 1
#define PA_MMA_BODY(BF16, D) pa_mma_attend<BF16, D, true>(p);
#elif PA_MMA_PLAIN == 0
#define PA_MMA_BODY(BF16, D) pa_mma_attend<BF16, D, false>(p);
#else
#define PA_MMA_BODY(BF16, D)                        \
    if (!(p.soft_cap > 0.0f) && p.alibi == 0) {     \
        pa_mma_attend<BF16, D, true>(p);            \
    } else {                                        \
        pa_mma_attend<BF16, D, false>(p);           \
    }
#endif
#define PA_MMA_DEFINE(NAME, BF16, D)                                                   \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS, PA_MMA_MINB) NAME(const AttnParams p) { \
        PA_MMA_BODY(BF16, D)                                                           \
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
