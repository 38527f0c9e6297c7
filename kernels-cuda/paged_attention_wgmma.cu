// Paged attention on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), in its
// barrier form (POLYATTN_CUDA_WGMMA_FORM=barrier; the default form is the warp-specialised
// paged_attention_wgmma_ws.cu): the Hopper prefill for f16 / bf16 activations with a cache
// of the same dtype and head sizes 64 and 128 (rows of whole 128-byte swizzle atoms).
// Everything else -- other head sizes, other GPUs -- runs on paged_attention_mma.cu, which
// shares this kernel's work items, masks and softmax (prefill_tile.cuh) and is the reference
// for the semantics.
// The wgmma wrappers, descriptors and one tile's steps are in wgmma.cuh.
//
// Work: the same WorkItem list as paged_attention_mma.cu, planned with up to WG_ROWS = 128
// rows per item: query tokens [q_start, q_start + q_len) of request `req` times query heads
// kv_head*group + [head_start, head_start + head_count), row r = token r / head_count, head
// r % head_count. num_splits is always 1.
//
// Algorithm per CTA: two warpgroups (8 warps, 256 threads); warpgroup g computes rows
// 64 g .. 64 g + 63 of the item, each of its warps the 16 rows of its slice of the wgmma
// m64 tile, in the m16 accumulator layout prefill_tile.cuh describes.
//  1. The Q tile [128][D] is copied to shared memory with cp.async (rows past the item's rows
//     zero-filled), in the same copy group as the first K/V tile.
//  2. Keys are visited in tiles of WG_KEYS (128, or 64 with -DPA_WG_KEYS=64) positions from
//     the union of the rows' visible ranges (aligned down to 16). All 256 threads gather the
//     K and V tiles from the paged cache with 16-byte cp.async copies (pages are smaller than
//     a tile, so there is no one box for the bulk tensor copy engine); positions outside the
//     visible union are zero-filled, never read. Tiles are double-buffered and the block
//     table is read two tiles ahead into a shared table of row addresses, as in
//     paged_attention_mma.cu. A tile becomes visible to the tensor cores through
//     cp.async.wait_group, fence.proxy.async (cp.async writes through the generic proxy;
//     wgmma reads through the async proxy) and the one barrier of the tile.
//  3. S = Q K^T: D / 16 wgmma.m64nKk16 steps, A (Q) and B (K) from shared memory, f32
//     accumulators in registers. A warpgroup whose rows see no key of the tile skips it
//     (uniform over the warpgroup, as wgmma requires).
//  4. Online softmax in base 2 exactly as paged_attention_mma.cu (mask by selection to -inf,
//     ex2.approx, running max m and partial sum l per row, O rescaled when m moves).
//  5. O += P V: P packed to f16x2 / bf16x2 straight from the S accumulators (the accumulator
//     layout of two n8 tiles is wgmma's register A fragment of one k16 step), V from shared
//     memory read N-major (imm-trans-b), KEYS / 16 wgmma.m64nDk16 steps. Each warpgroup waits
//     for its products before the next tile's barrier, after which the buffer is refilled.
//  6. out = O / l (0 when l = 0), lse = m ln 2 + ln l (-inf when the row saw neither key nor
//     sink); sinks as in paged_attention_mma.cu.
//
// Shared-memory layout (dynamic; its base rounded up to 1024 bytes at run time, which the
// host's size allows for): the Q tile, then K stage 0, K stage 1, V stage 0, V stage 1. Every
// tile is stored in column blocks of 64 elements (128 bytes a row): block b holds elements
// 64 b .. 64 b + 63 of every row, rows 128 bytes apart, and the 16-byte chunk c of row j sits
// at chunk position c ^ (j % 8) -- the 128-byte swizzle, whose pattern repeats every 8 rows
// (1024 bytes, the alignment every block keeps). The Q tile holds one such set of blocks per
// warpgroup (64 rows each). wgmma descriptors (wg_desc): Q and K are K-major (stride between
// 8-row groups 1024 bytes; a k16 step is +32 bytes inside a block, the next block after four
// steps); V is N-major (its rows are keys: +2048 bytes per k16 step; the leading-dimension
// offset is the distance between its column blocks).
//
// Bounds relied on (host side): as paged_attention_mma.cu, plus head_size == D in {64, 128},
// 256 threads, dynamic shared memory = wgmma_smem_bytes (src/kernels/cuda/shapes.rs:
// 1024 + (128 + 4 KEYS) D 2 bytes), compiled for sm_90a (wgmma and the async proxy fence).
// Block-table entries are read only for keys inside the item's visible union.

#include "common.cuh"
#include "prefill_tile.cuh"
#include "wgmma.cuh"

#ifndef PA_WG_KEYS
#define PA_WG_KEYS 128
#endif
// PA_WG_PLAIN: 1 builds only the form without soft cap and ALiBi, 0 only the form with them,
// undefined both, chosen at entry (the CI whole-file check).
#ifndef PA_WG_PLAIN
#define PA_WG_PLAIN -1
#endif
#define WG_KEYS PA_WG_KEYS
#define WG_ROWS 128
#define WG_THREADS 256
static_assert(WG_KEYS == 64 || WG_KEYS == 128, "64 or 128 keys per tile");

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "paged_attention_wgmma.cu needs the sm_90a target (wgmma)"
#endif

template <bool BF16, int D, bool PLAIN>
__device__ __forceinline__ void wg_attend(const AttnParams& p) {
    constexpr int CH = D / 8;              // 16-byte chunks per row
    constexpr int NT = D / 8;              // n8 tiles of O
    constexpr int TILE_B = WG_KEYS * D * 2;  // bytes of one K or V tile
    constexpr int QWG_B = 64 * D * 2;      // bytes of one warpgroup's Q rows
    extern __shared__ uint4 wg_smem_raw[];
    __shared__ pa_u64 krow_s[2][WG_KEYS];
    __shared__ int2 vis_s[WG_ROWS];
    __shared__ int4 bounds_s[WG_THREADS / 32];
    const pa_u32 q_sa = (ptx_smem_addr(wg_smem_raw) + 1023u) & ~1023u;
    const pa_u32 k_sa0 = q_sa + WG_ROWS * D * 2;
    const pa_u32 v_sa0 = k_sa0 + 2 * TILE_B;

    const WorkItem it = p.items[blockIdx.x];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wg = warp >> 2;
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

    const int span_lo = geo.span_lo;
    const int span_hi = geo.span_hi;
    const int* bt = p.block_table + (pa_i64)it.req * p.bt_stride;
    const int first = geo.first;
    const bool owner = tid < WG_KEYS;
    auto table_entry = [&](int c) -> int {
        const int kp = c + tid;
        return (owner && kp >= span_lo && kp < span_hi) ? bt[kp / p.block_size] : 0;
    };
    auto row_address = [&](int kp, int block) -> pa_u64 {
        if (kp < span_lo || kp >= span_hi) return 0;
        const pa_i64 o = pa_cache_offset(block, 0, kp % p.block_size, it.kv_head, p.block_size,
                                         p.num_kv_heads, D, p.layout_hnd);
        return (pa_u64)(cache + o);
    };
    if (owner) {
        krow_s[0][tid] = row_address(first + tid, table_entry(first));
        const int c1 = first + WG_KEYS;
        krow_s[1][tid] = row_address(c1 + tid, table_entry(c1));
    }

    // 1. Q tile, swizzled per warpgroup.
    for (int i = tid; i < WG_ROWS * CH; i += WG_THREADS) {
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
        ptx_cp_async16(q_sa + (pa_u32)((r >> 6) * QWG_B) + wg_swizzled(r & 63, c, 64), src,
                       bytes);
    }

    // Per-row state (base 2). A row past the item's rows sees every key (computed, never
    // stored), so it never forces the mask, and it stays out of the union, so a warpgroup
    // with no row of the item computes nothing. Bounds per warp: the union [u_lo, u_hi) of
    // the item's non-empty visible ranges and the intersection [n_lo, n_hi) of all.
    const int r0 = 64 * wg + 16 * (warp & 3) + g4;  // this thread's rows: r0, r0 + 8
    float m[2], l[2];
    const int4 wbounds = wg_rows_start(p, it, rows, hc, pos0, head0, r0, t4, vis_s, m, l);
    if (lane == 0) bounds_s[warp] = wbounds;
    __syncthreads();  // krow_s of tiles 0 and 1, vis_s, bounds_s
    // The warpgroup's union decides whether it computes a tile (wgmma runs per warpgroup).
    int g_lo = 1 << 30, g_hi = -(1 << 30);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const int4 b = bounds_s[4 * wg + w];
        g_lo = min(g_lo, b.x);
        g_hi = max(g_hi, b.y);
    }
    if (first < span_hi) {
        wg_load_kv<D, WG_KEYS, WG_THREADS>(tid, cache, krow_s[0], v_delta_b, k_sa0, v_sa0);
    }
    ptx_cp_async_commit();

    const float qk_scale = PLAIN ? p.scale * PA_LOG2E : p.scale;
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // Descriptors of this warpgroup's Q rows and of the two K and V stages (k16 steps add
    // their byte offsets >> 4 to the start-address field).
    const pa_u64 dq0 = wg_desc(q_sa + (pa_u32)(wg * QWG_B), 16, 1024);
    const pa_u64 dk0 = wg_desc(k_sa0, 16, 1024);
    const pa_u64 dv0 = wg_desc(v_sa0, WG_KEYS * 128, 1024);

    int stage = 0;
    for (int c0 = first; c0 < span_hi; c0 += WG_KEYS, stage ^= 1) {
        const int block2 = table_entry(c0 + 2 * WG_KEYS);
        ptx_cp_async_wait<0>();  // tile i (and Q): the only group in flight
        wg_fence_proxy_async();
        __syncthreads();
        if (c0 + WG_KEYS < span_hi) {
            wg_load_kv<D, WG_KEYS, WG_THREADS>(tid, cache, krow_s[stage ^ 1], v_delta_b,
                                               k_sa0 + (stage ^ 1) * TILE_B,
                                               v_sa0 + (stage ^ 1) * TILE_B);
        }
        ptx_cp_async_commit();  // possibly empty: one group per tile

        if (g_lo < c0 + WG_KEYS && g_hi > c0) {
            // 3.-5. S = Q K^T, the online softmax, O += P V.
            const pa_u64 so = (pa_u64)((stage * TILE_B) >> 4);
            wg_tile<BF16, D, PLAIN, WG_KEYS>(p, dq0, dk0 + so, dv0 + so, c0, bounds_s[warp],
                                             vis_s, r0, t4, hc, pos0, head0, qk_scale, m, l, o,
                                             [] {});
        }
        // Tile i+2's addresses go where tile i's were (tile i's copies were issued a tile
        // ago, before this tile's barrier); the next tile's barrier publishes them.
        if (owner) krow_s[stage][tid] = row_address(c0 + 2 * WG_KEYS + tid, block2);
    }
    ptx_cp_async_wait<0>();  // no copy outlives the CTA

    // 6. Results.
    wg_store_rows<BF16, D>(p, o, m, l, r0, t4);
}

#if PA_WG_PLAIN == 1
#define PA_WG_BODY(BF16, D) wg_attend<BF16, D, true>(p);
#elif PA_WG_PLAIN == 0
#define PA_WG_BODY(BF16, D) wg_attend<BF16, D, false>(p);
#else
#define PA_WG_BODY(BF16, D)                     \
    if (!(p.soft_cap > 0.0f) && p.alibi == 0) { \
        wg_attend<BF16, D, true>(p);            \
    } else {                                    \
        wg_attend<BF16, D, false>(p);           \
    }
#endif
#define PA_WG_DEFINE(NAME, BF16, D)                                                     \
    extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) NAME(const AttnParams p) { \
        PA_WG_BODY(BF16, D)                                                             \
    }

// The host compiles only the variant it needs (-DPA_WG_D=128 -DPA_WG_BF16=1); without the
// defines every variant is built (the CI compile check).
#ifdef PA_WG_D
#define PA_WG_ALL 0
#else
#define PA_WG_ALL 1
#define PA_WG_D 0
#define PA_WG_BF16 0
#endif
#define PA_WG_WANT(BF, D) (PA_WG_ALL || (PA_WG_D == (D) && PA_WG_BF16 == (BF)))
#if PA_WG_WANT(0, 64)
PA_WG_DEFINE(paged_attention_wgmma_f16_d64, false, 64)
#endif
#if PA_WG_WANT(0, 128)
PA_WG_DEFINE(paged_attention_wgmma_f16_d128, false, 128)
#endif
#if PA_WG_WANT(1, 64)
PA_WG_DEFINE(paged_attention_wgmma_bf16_d64, true, 64)
#endif
#if PA_WG_WANT(1, 128)
PA_WG_DEFINE(paged_attention_wgmma_bf16_d128, true, 128)
#endif
