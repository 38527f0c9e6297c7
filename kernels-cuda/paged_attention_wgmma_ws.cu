// Paged attention on Hopper's warpgroup tensor-core instructions with a producer warpgroup
// (sm_90a): the warp-specialised form of paged_attention_wgmma.cu. Same work items, masks,
// softmax and results; what differs is who moves the data and how the warpgroups wait.
//
// Work: the WorkItem list of paged_attention_mma.cu planned with up to WS_ROWS = 128 rows per
// item (query tokens times the item's query heads, GQA-packed), num_splits 1.
//
// Algorithm per CTA: three warpgroups (384 threads).
//  - Warpgroup 0, the producer, gives registers back (setmaxnreg.dec to WS_PRODUCER_REGS) and
//    only copies: the Q tile once, then each K / V tile of WS_KEYS keys into stage
//    i % WS_STAGES of a ring, gathered from the paged cache with 16-byte cp.async (pages are
//    smaller than a tile). Before it refills a stage it waits on that stage's `empty`
//    mbarrier; each producer thread's copies arrive on the stage's `full` mbarrier when they
//    land (cp.async.mbarrier.arrive.noinc: 128 arrivals a phase). The block table is read per
//    tile by the first WS_KEYS producer threads into a double-buffered table of row
//    addresses, published to the other producer threads by a named barrier (id 1).
//  - Warpgroups 1 and 2, the consumers, take more registers (setmaxnreg.inc to
//    WS_CONSUMER_REGS) and each compute 64 rows of the item as paged_attention_wgmma.cu's
//    warpgroups do: wait on `full` of the tile's stage, S = Q K^T on wgmma (A and B from
//    shared memory), the online softmax in base 2 (wgmma.cuh's wg_softmax), O += P V with P
//    from registers and V read N-major, wait for the products, then one arrival per warp on
//    the stage's `empty` mbarrier (8 a phase). A warpgroup whose rows see no key of a tile
//    skips its products but still waits and arrives, so a stage is never refilled while its
//    copies may be in flight. No CTA-wide barrier runs inside the loop: the two consumers
//    drift apart and one's softmax runs beside the other's products.
//  - Parities: tile i is fill i / WS_STAGES of its stage, so consumers wait on `full` with
//    parity (i / WS_STAGES) & 1 and the producer on `empty` with the opposite parity (the
//    first round's wait on a fresh barrier's preceding phase returns at once).
//  - With PA_WS_PINGPONG the consumers issue their Q K^T products in turns (named barriers 3
//    and 4: a warpgroup waits for its turn, issues, hands the turn to the other), so they
//    run out of phase: one's softmax beside the other's products. Without it both start on
//    the same tile at the same time and tend to stay in step.
//  - With PA_WS_OVERLAP (FlashAttention-3's intra-warpgroup overlap) K and V have their own
//    `full` / `empty` mbarriers (the V ones: full_v / empty_v) and each consumer keeps two
//    tiles in flight: it issues tile i's Q K^T and then tile i-1's P V (P kept packed in
//    registers from the previous step), waits for the Q K^T only (wgmma.wait_group 1),
//    releases K of tile i, runs tile i's softmax while the P V products still run, then waits
//    for them, releases V of tile i-1, rescales O and packs tile i's P. The producer copies K
//    of tile i, then V of tile i, each after its own `empty` wait, so K is refilled as soon as
//    its scores are computed while V is held one step longer. With PA_WS_PINGPONG as well
//    (FlashAttention-3's schedule) a turn covers one step's issues (tile i's Q K^T and tile
//    i-1's P V): turn t of each warpgroup is index t of 0 .. n_tiles, empty where it has
//    nothing to issue, so both take n_tiles + 1 turns.
//  - With PA_WS_TMA (the forms without the overlap) the 16-key groups of a tile that lie wholly
//    inside the item's visible union, within one page (block sizes a multiple of 16), come by
//    the tensor copy engine: one producer thread posts the stage's byte count on `full`
//    (mbarrier.arrive.expect_tx, the phase's 129th arrival) and issues one
//    cp.async.bulk.tensor per group, head-size half and K / V (a 16-row box of 64 elements,
//    128-byte swizzled by the copy engine as wgmma.cuh lays tiles out), through the tensor map
//    the host encodes over the whole cache (kv_map). The groups at the union's edges, which
//    hold keys no row may read, still come by cp.async with those rows zero-filled, so a
//    stale or NaN slot never reaches P V.
//  - A consumer thread runs fence.proxy.async after each `full` wait: the tiles were written
//    through the generic proxy (cp.async) and wgmma reads them through the async proxy.
//
// Shared memory (dynamic; the base rounded up to 1024 bytes at run time): the Q tile (128
// rows, one swizzled block set per consumer warpgroup), WS_STAGES K tiles, WS_STAGES V tiles,
// each in wgmma.cuh's 128-byte-swizzled column blocks. Static: the mbarriers, the row-address
// table, the rows' visible ranges and the consumer warps' bounds.
//
// Bounds relied on (host side): as paged_attention_wgmma.cu, plus 384 threads and dynamic
// shared memory = wgmma_ws_smem_bytes (src/kernels/cuda/shapes.rs:
// 1024 + (128 + 2 STAGES KEYS) D 2 bytes, within the 227 KiB a CTA may hold); the registers
// setmaxnreg hands out within what the launch bounds give the CTA (checked below). With
// PA_WS_TMA, kv_map maps the whole 16-bit cache as five dimensions, innermost first
// (D, heads, block_size, 2, blocks) for NHD or (D, block_size, heads, 2, blocks) for HND,
// with a box of 64 elements by 16 keys of one head (cache_tensor_map in
// src/backends/cuda/kernels.rs); every form takes the parameter, used or not.

#include "common.cuh"
#include "prefill_tile.cuh"
#include "wgmma.cuh"

#ifndef PA_WS_KEYS
#define PA_WS_KEYS 128
#endif
#ifndef PA_WS_STAGES
#define PA_WS_STAGES 2
#endif
// PA_WS_PINGPONG: 1 takes the consumers' Q K^T issues in turns (named barriers 3 and 4).
#ifndef PA_WS_PINGPONG
#define PA_WS_PINGPONG 0
#endif
// PA_WS_OVERLAP: 1 overlaps each consumer's softmax of tile i with its P V of tile i - 1.
#ifndef PA_WS_OVERLAP
#define PA_WS_OVERLAP 0
#endif
// PA_WS_TMA: 1 brings the groups of 16 keys inside the visible union by the tensor copy engine.
#ifndef PA_WS_TMA
#define PA_WS_TMA 0
#endif
#if PA_WS_TMA && PA_WS_OVERLAP
#error "the tensor-copy loads are written for the forms without the overlap"
#endif
// PA_WS_PLAIN: as paged_attention_wgmma.cu's PA_WG_PLAIN.
#ifndef PA_WS_PLAIN
#define PA_WS_PLAIN -1
#endif
#define WS_KEYS PA_WS_KEYS
#define WS_STAGES PA_WS_STAGES
#define WS_ROWS 128
#define WS_THREADS 384
#define WS_PRODUCER_REGS 40
#define WS_CONSUMER_REGS 232
static_assert(WS_KEYS == 64 || WS_KEYS == 128, "64 or 128 keys per tile");
static_assert(WS_STAGES >= 2 && WS_STAGES <= 4, "2 to 4 stages");
// The launch bounds give the CTA (65536 / 384 rounded down to 8) * 384 = 64512 registers;
// consumers asking for more than the producer gave back would spin in setmaxnreg.inc.
#define WS_LAUNCH_REGS (65536 / WS_THREADS / 8 * 8)
static_assert(WS_PRODUCER_REGS * 128 + WS_CONSUMER_REGS * 256 <= WS_LAUNCH_REGS * WS_THREADS,
              "the registers setmaxnreg hands out exceed what the launch gives the CTA");
static_assert(WS_PRODUCER_REGS % 8 == 0 && WS_CONSUMER_REGS % 8 == 0, "setmaxnreg steps of 8");

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "paged_attention_wgmma_ws.cu needs the sm_90a target (wgmma, setmaxnreg)"
#endif

// ---------------------------------------------------------------- mbarriers, registers

__device__ __forceinline__ void ws_mbar_init(pa_u32 bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Whether the phase of parity `parity` has completed (a bounded wait in hardware).
__device__ __forceinline__ bool ws_mbar_try_wait(pa_u32 bar, pa_u32 parity) {
    pa_u32 done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}

__device__ __forceinline__ void ws_mbar_wait(pa_u32 bar, pa_u32 parity) {
    while (!ws_mbar_try_wait(bar, parity)) {
    }
}

__device__ __forceinline__ void ws_mbar_arrive(pa_u32 bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
                 : "memory");
}

// One arrival on `bar` where `pred` holds, predicated rather than branched around (the
// overlapped consumers arrive while wgmma products are in flight).
__device__ __forceinline__ void ws_mbar_arrive_if(pa_u32 bar, bool pred) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 st;\nsetp.ne.b32 p, %1, 0;\n"
        "@p mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar),
        "r"((int)pred)
        : "memory");
}

// One arrival on `bar` once every cp.async this thread issued before it has landed.
__device__ __forceinline__ void ws_cp_async_arrive(pa_u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Arrives on named barrier `id` of `threads` threads without waiting for it where `pred`
// holds (predicated, not branched around: the ping-pong hand-over runs with wgmma in flight).
__device__ __forceinline__ void ws_bar_arrive_if(int id, int threads, bool pred) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p bar.arrive %0, %1;\n}\n" ::"r"(id),
        "r"(threads), "r"((int)pred)
        : "memory");
}

// Arrives on named barrier `id` of `threads` threads without waiting for it.
__device__ __forceinline__ void ws_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int N>
__device__ __forceinline__ void ws_regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N>
__device__ __forceinline__ void ws_regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// A CUtensorMap (128 bytes, 64-byte aligned), opaque here: the host encodes it with
// cuTensorMapEncodeTiled over the cache as five dimensions, the head size innermost.
struct __align__(64) PaTensorMap {
    unsigned long long v[16];
};

// Posts `bytes` of transactions on `bar` and arrives on it (one of its arrivals).
__device__ __forceinline__ void ws_mbar_expect_tx(pa_u32 bar, pa_u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

// One box of the tensor map at coordinates (c0 .. c4) into shared memory at `dst`, its bytes
// counted on `bar` as they land.
__device__ __forceinline__ void ws_tma_load(pa_u32 dst, const PaTensorMap* map, int c0, int c1,
                                            int c2, int c3, int c4, pa_u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
        "l"((pa_u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
        : "memory");
}

// ---------------------------------------------------------------- the kernel

template <bool BF16, int D, bool PLAIN>
__device__ __forceinline__ void ws_attend(const AttnParams& p, const PaTensorMap* kv_map) {
    constexpr int CH = D / 8;                 // 16-byte chunks per row
    constexpr int NT = D / 8;                 // n8 tiles of O
    constexpr int TILE_B = WS_KEYS * D * 2;   // bytes of one K or V tile
    constexpr int QWG_B = 64 * D * 2;         // bytes of one warpgroup's Q rows
    static_assert(1024 + (WS_ROWS + 2 * WS_STAGES * WS_KEYS) * D * 2 + 4096 <= 227 * 1024,
                  "the stages, the Q tile and the static arrays within a CTA's shared memory");
    extern __shared__ uint4 ws_smem_raw[];
    __shared__ pa_u64 full_s[WS_STAGES];
    __shared__ pa_u64 empty_s[WS_STAGES];
    __shared__ pa_u64 full_v_s[PA_WS_OVERLAP ? WS_STAGES : 1];
    __shared__ pa_u64 empty_v_s[PA_WS_OVERLAP ? WS_STAGES : 1];
    __shared__ pa_u64 q_full_s;
    __shared__ pa_u64 krow_s[2][WS_KEYS];
    __shared__ int grp_s[2][PA_WS_TMA ? WS_KEYS / 16 : 1];  // a bulk-copied group's block, or -1
    __shared__ int2 vis_s[WS_ROWS];
    __shared__ int4 bounds_s[8];
    const pa_u32 q_sa = (ptx_smem_addr(ws_smem_raw) + 1023u) & ~1023u;
    const pa_u32 k_sa0 = q_sa + WS_ROWS * D * 2;
    const pa_u32 v_sa0 = k_sa0 + WS_STAGES * TILE_B;
    const pa_u32 full0 = ptx_smem_addr(full_s);
    const pa_u32 empty0 = ptx_smem_addr(empty_s);
    const pa_u32 q_full = ptx_smem_addr(&q_full_s);
    // With the overlap, K's barriers are full0 / empty0 and V's these; without, full0 / empty0
    // cover both.
    const pa_u32 full_v0 = ptx_smem_addr(full_v_s);
    const pa_u32 empty_v0 = ptx_smem_addr(empty_v_s);

    const WorkItem it = p.items[blockIdx.x];
    const int tid = threadIdx.x;
    const PaPrefillItem geo = pa_prefill_item(p, it);
    const int hc = geo.hc;
    const int rows = geo.rows;
    const int pos0 = geo.pos0;
    const int head0 = geo.head0;
    const int span_lo = geo.span_lo;
    const int span_hi = geo.span_hi;
    const int first = geo.first;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < WS_STAGES; ++s) {
            ws_mbar_init(full0 + 8 * s, 128 + PA_WS_TMA);
            ws_mbar_init(empty0 + 8 * s, 8);
            if (PA_WS_OVERLAP) {
                ws_mbar_init(full_v0 + 8 * s, 128);
                ws_mbar_init(empty_v0 + 8 * s, 8);
            }
        }
        ws_mbar_init(q_full, 128);
    }
    __syncthreads();  // the barriers' initial state, before any thread uses them

    if (tid < 128) {
        // ------------------------------------------------ producer
        ws_regs_dec<WS_PRODUCER_REGS>();
        const pa_u16* q = (const pa_u16*)p.q;
        const pa_u16* cache = (const pa_u16*)p.cache;
        const pa_i64 v_delta_b = (pa_i64)p.block_size * p.num_kv_heads * D * 2;
        const int* bt = p.block_table + (pa_i64)it.req * p.bt_stride;
        // Whole 16-key groups sit in one page when the pages are a multiple of 16 keys (the
        // tiles start 16-aligned).
        const bool tma_ok = p.block_size % 16 == 0 && !p.dense;
        (void)tma_ok;
        for (int i = tid; i < WS_ROWS * CH; i += 128) {
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
        ws_cp_async_arrive(q_full);
        int i = 0;
        for (int c0 = first; c0 < span_hi; c0 += WS_KEYS, ++i) {
            const int s = i % WS_STAGES;
            pa_u64* krow = krow_s[i & 1];
            if (tid < WS_KEYS) {
                // Block-table entries only for keys inside the item's visible union. A row
                // address of 1 marks a key whose group comes by the tensor copy engine.
                const int kp = c0 + tid;
                const int g0 = c0 + (tid & ~15);
                const bool bulk = PA_WS_TMA && tma_ok && g0 >= span_lo && g0 + 16 <= span_hi;
                pa_u64 a = 0;
                int block = -1;
                if (kp >= span_lo && kp < span_hi) {
                    block = bt[kp / p.block_size];
                    const pa_i64 o = pa_cache_offset(block, 0, kp % p.block_size, it.kv_head,
                                                     p.block_size, p.num_kv_heads, D,
                                                     p.layout_hnd);
                    a = bulk ? 1 : (pa_u64)(cache + o);
                }
                krow[tid] = a;
                if (PA_WS_TMA && (tid & 15) == 0) grp_s[i & 1][tid >> 4] = bulk ? block : -1;
            }
            // The table of this tile for every producer thread; the other buffer was last
            // read before this barrier's previous round.
            ptx_bar_sync(1, 128);
            const pa_u32 free_parity = ((i / WS_STAGES) & 1) ^ 1;
            ws_mbar_wait(empty0 + 8 * s, free_parity);
#if PA_WS_OVERLAP
            wg_load_kv<D, WS_KEYS, 128, true, false>(tid, cache, krow, v_delta_b,
                                                     k_sa0 + s * TILE_B, v_sa0 + s * TILE_B);
            ws_cp_async_arrive(full0 + 8 * s);
            ws_mbar_wait(empty_v0 + 8 * s, free_parity);
            wg_load_kv<D, WS_KEYS, 128, false, true>(tid, cache, krow, v_delta_b,
                                                     k_sa0 + s * TILE_B, v_sa0 + s * TILE_B);
            ws_cp_async_arrive(full_v0 + 8 * s);
#else
#if PA_WS_TMA
            if (tid == 0) {
                const int* grp = grp_s[i & 1];
                int n = 0;
#pragma unroll
                for (int g = 0; g < WS_KEYS / 16; ++g) n += grp[g] >= 0 ? 1 : 0;
                ws_mbar_expect_tx(full0 + 8 * s, (pa_u32)(n * 2 * 16 * D * 2));
#pragma unroll
                for (int g = 0; g < WS_KEYS / 16; ++g) {
                    if (grp[g] < 0) continue;
                    const int tok = (c0 + 16 * g) % p.block_size;
                    const int a1 = p.layout_hnd ? tok : it.kv_head;
                    const int a2 = p.layout_hnd ? it.kv_head : tok;
#pragma unroll
                    for (int h = 0; h < D / 64; ++h) {
                        const pa_u32 off = (pa_u32)(s * TILE_B + h * WS_KEYS * 128 + g * 16 * 128);
                        ws_tma_load(k_sa0 + off, kv_map, h * 64, a1, a2, 0, grp[g], full0 + 8 * s);
                        ws_tma_load(v_sa0 + off, kv_map, h * 64, a1, a2, 1, grp[g], full0 + 8 * s);
                    }
                }
            }
#endif
            wg_load_kv<D, WS_KEYS, 128>(tid, cache, krow, v_delta_b, k_sa0 + s * TILE_B,
                                        v_sa0 + s * TILE_B);
            ws_cp_async_arrive(full0 + 8 * s);
#endif
        }
        ptx_cp_async_commit();
        ptx_cp_async_wait<0>();  // no copy outlives its thread
        return;
    }

    // ---------------------------------------------------- consumers
    ws_regs_inc<WS_CONSUMER_REGS>();
    const int ctid = tid - 128;
    const int lane = tid & 31;
    const int warp = ctid >> 5;  // 0..7
    const int wg = warp >> 2;    // 0..1
    const int g4 = lane >> 2;
    const int t4 = lane & 3;

    // Per-row state (base 2), as paged_attention_wgmma.cu: a row past the item's rows sees
    // every key (computed, never stored) and stays out of the union.
    const int r0 = 64 * wg + 16 * (warp & 3) + g4;  // this thread's rows: r0, r0 + 8
    float m[2], l[2];
    const int4 wb = wg_rows_start(p, it, rows, hc, pos0, head0, r0, t4, vis_s, m, l);
    if (lane == 0) bounds_s[warp] = wb;
    ptx_bar_sync(2, 256);  // vis_s, bounds_s among the consumers
    int g_lo = 1 << 30, g_hi = -(1 << 30);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const int4 b = bounds_s[4 * wg + w];
        g_lo = min(g_lo, b.x);
        g_hi = max(g_hi, b.y);
    }

    const float qk_scale = PLAIN ? p.scale * PA_LOG2E : p.scale;
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const pa_u64 dq0 = wg_desc(q_sa + (pa_u32)(wg * QWG_B), 16, 1024);
    const pa_u64 dk0 = wg_desc(k_sa0, 16, 1024);
    const pa_u64 dv0 = wg_desc(v_sa0, WS_KEYS * 128, 1024);

    ws_mbar_wait(q_full, 0);
#if PA_WS_OVERLAP
    // The tiles this warpgroup computes, [i_lo, i_hi): those with a key its rows see, which
    // are contiguous. The others are only waited for and released. Inside the range nothing
    // branches around a wgmma in flight (ptxas would serialise them).
    constexpr int NJ = WS_KEYS / 8;   // n8 tiles of S
    constexpr int NK = WS_KEYS / 16;  // k16 steps of P V
    const int n_tiles = first < span_hi ? (span_hi - first + WS_KEYS - 1) / WS_KEYS : 0;
    int i_lo = g_lo > first ? (g_lo - first) / WS_KEYS : 0;
    int i_hi = g_hi > first ? min(n_tiles, (g_hi - first + WS_KEYS - 1) / WS_KEYS) : 0;
    if (g_lo >= g_hi || i_lo >= i_hi) i_lo = i_hi = n_tiles;
    auto k_parity = [](int i) { return (pa_u32)((i / WS_STAGES) & 1); };
    // Ping-pong turns (no-ops without PA_WS_PINGPONG): wait for this warpgroup's turn t,
    // hand it to the other after the issues (warpgroup 1 hands none over after its last).
    auto turn_wait = [&] {
        if (PA_WS_PINGPONG) ptx_bar_sync(3 + wg, 256);
    };
    auto hand_over = [&](int t) {
        if (PA_WS_PINGPONG) ws_bar_arrive_if(3 + (wg ^ 1), 256, !(wg == 1 && t == n_tiles));
    };
#if PA_WS_PINGPONG
    if (wg == 1) ws_bar_arrive(3, 256);  // warpgroup 0 issues first
#endif
    auto pass = [&](int i) {  // a tile this warpgroup does not compute
        const int s = i % WS_STAGES;
        ws_mbar_wait(full0 + 8 * s, k_parity(i));
        ws_mbar_arrive_if(empty0 + 8 * s, lane == 0);
        ws_mbar_wait(full_v0 + 8 * s, k_parity(i));
        ws_mbar_arrive_if(empty_v0 + 8 * s, lane == 0);
    };
    for (int i = 0; i < i_lo; ++i) {
        turn_wait();
        pass(i);
        hand_over(i);
    }
    if (i_lo < i_hi) {
        pa_u32 pf[NK][4];  // P of the previous tile, packed
        float sc[NJ][4];
        float alpha[2];
        {  // the first tile: its scores alone
            const int s = i_lo % WS_STAGES;
            const int c0 = first + i_lo * WS_KEYS;
            turn_wait();
            ws_mbar_wait(full0 + 8 * s, k_parity(i_lo));
            wg_fence_proxy_async();
            wg_fence();
            wg_issue_qk<BF16, NJ, D / 16>(sc, dq0, dk0 + (pa_u64)((s * TILE_B) >> 4));
            wg_commit();
            hand_over(i_lo);
            wg_wait<0>();
            wg_fence_regs<NJ>(sc);
            ws_mbar_arrive_if(empty0 + 8 * s, lane == 0);
            if (wg_softmax<PLAIN, NJ>(p, sc, c0, wb, vis_s, r0, t4, hc, pos0, head0, qk_scale, m,
                                      l, alpha)) {
                wg_rescale<NT>(o, alpha);
            }
            wg_pack_p<BF16, NJ>(sc, pf);
        }
        for (int i = i_lo + 1; i < i_hi; ++i) {
            const int s = i % WS_STAGES;
            const int sp = (i - 1) % WS_STAGES;
            const int c0 = first + i * WS_KEYS;
            turn_wait();
            ws_mbar_wait(full0 + 8 * s, k_parity(i));
            ws_mbar_wait(full_v0 + 8 * sp, k_parity(i - 1));
            wg_fence_proxy_async();
            // Tile i's Q K^T, then tile i-1's P V, in two groups.
            wg_fence_frags<NK>(pf);
            wg_fence_regs<NT>(o);
            wg_fence();
            wg_issue_qk<BF16, NJ, D / 16>(sc, dq0, dk0 + (pa_u64)((s * TILE_B) >> 4));
            wg_commit();
            wg_issue_pv<BF16, NT, NK>(o, pf, dv0 + (pa_u64)((sp * TILE_B) >> 4));
            wg_commit();
            hand_over(i);
            wg_wait<1>();  // the scores; the P V products may still run
            wg_fence_regs<NJ>(sc);
            ws_mbar_arrive_if(empty0 + 8 * s, lane == 0);  // K of tile i read
            const bool moved = wg_softmax<PLAIN, NJ>(p, sc, c0, wb, vis_s, r0, t4, hc, pos0,
                                                     head0, qk_scale, m, l, alpha);
            wg_wait<0>();
            wg_fence_regs<NT>(o);
            wg_fence_frags<NK>(pf);
            ws_mbar_arrive_if(empty_v0 + 8 * sp, lane == 0);  // V of tile i - 1 read
            if (moved) wg_rescale<NT>(o, alpha);
            wg_pack_p<BF16, NJ>(sc, pf);
        }
        {  // the last tile's P V
            const int sp = (i_hi - 1) % WS_STAGES;
            turn_wait();
            ws_mbar_wait(full_v0 + 8 * sp, k_parity(i_hi - 1));
            wg_fence_proxy_async();
            wg_fence_frags<NK>(pf);
            wg_fence_regs<NT>(o);
            wg_fence();
            wg_issue_pv<BF16, NT, NK>(o, pf, dv0 + (pa_u64)((sp * TILE_B) >> 4));
            wg_commit();
            hand_over(i_hi);
            wg_wait<0>();
            wg_fence_regs<NT>(o);
            wg_fence_frags<NK>(pf);
            ws_mbar_arrive_if(empty_v0 + 8 * sp, lane == 0);
        }
    }
    // Turns i_hi + 1 .. n_tiles pass the remaining tiles; a warpgroup that computed nothing
    // passed every tile in turns 0 .. n_tiles - 1 and takes turn n_tiles empty.
    for (int i = i_hi; i < n_tiles; ++i) {
        turn_wait();
        pass(i);
        hand_over(i + 1);
    }
    if (i_lo == i_hi) {
        turn_wait();
        hand_over(n_tiles);
    }
#else
#if PA_WS_PINGPONG
    if (wg == 1) ws_bar_arrive(3, 256);  // warpgroup 0 issues first
#endif
    int i = 0;
    for (int c0 = first; c0 < span_hi; c0 += WS_KEYS, ++i) {
        const int s = i % WS_STAGES;
        ws_mbar_wait(full0 + 8 * s, (i / WS_STAGES) & 1);
        wg_fence_proxy_async();
        // Ping-pong: a warpgroup issues its Q K^T only in its turn (barrier 3 + wg) and hands
        // the turn over once they are issued, so one's softmax runs beside the other's
        // products. Every tile takes a turn, computed or skipped, so both warpgroups pass the
        // same number of barriers (warpgroup 1 hands no turn over after the last tile).
        const bool last = c0 + WS_KEYS >= span_hi;
        auto hand_over = [&] {
            if (PA_WS_PINGPONG && !(wg == 1 && last)) ws_bar_arrive(3 + (wg ^ 1), 256);
        };
        if (PA_WS_PINGPONG) ptx_bar_sync(3 + wg, 256);
        if (g_lo < c0 + WS_KEYS && g_hi > c0) {
            const pa_u64 so = (pa_u64)((s * TILE_B) >> 4);
            wg_tile<BF16, D, PLAIN, WS_KEYS>(p, dq0, dk0 + so, dv0 + so, c0, wb, vis_s, r0, t4, hc,
                                             pos0, head0, qk_scale, m, l, o, hand_over);
        } else {
            hand_over();
        }
        __syncwarp();
        if (lane == 0) ws_mbar_arrive(empty0 + 8 * s);  // this warp is done with the stage
    }
#endif

    wg_store_rows<BF16, D>(p, o, m, l, r0, t4);
}

#if PA_WS_PLAIN == 1
#define PA_WS_BODY(BF16, D) ws_attend<BF16, D, true>(p, &kv_map);
#elif PA_WS_PLAIN == 0
#define PA_WS_BODY(BF16, D) ws_attend<BF16, D, false>(p, &kv_map);
#else
#define PA_WS_BODY(BF16, D)                     \
    if (!(p.soft_cap > 0.0f) && p.alibi == 0) { \
        ws_attend<BF16, D, true>(p, &kv_map);   \
    } else {                                    \
        ws_attend<BF16, D, false>(p, &kv_map);  \
    }
#endif
// Every form takes the tensor map (unused without PA_WS_TMA), so the host passes the same
// two parameters to each.
#define PA_WS_DEFINE(NAME, BF16, D)                                                  \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1)                      \
        NAME(const AttnParams p, const __grid_constant__ PaTensorMap kv_map) {       \
        PA_WS_BODY(BF16, D)                                                          \
    }

// The host compiles only the variant it needs (-DPA_WS_D=128 -DPA_WS_BF16=1); without the
// defines every variant is built (the CI compile check).
#ifdef PA_WS_D
#define PA_WS_ALL 0
#else
#define PA_WS_ALL 1
#define PA_WS_D 0
#define PA_WS_BF16 0
#endif
#define PA_WS_WANT(BF, D) (PA_WS_ALL || (PA_WS_D == (D) && PA_WS_BF16 == (BF)))
#if PA_WS_WANT(0, 64)
PA_WS_DEFINE(paged_attention_wgmma_ws_f16_d64, false, 64)
#endif
#if PA_WS_WANT(0, 128)
PA_WS_DEFINE(paged_attention_wgmma_ws_f16_d128, false, 128)
#endif
#if PA_WS_WANT(1, 64)
PA_WS_DEFINE(paged_attention_wgmma_ws_bf16_d64, true, 64)
#endif
#if PA_WS_WANT(1, 128)
PA_WS_DEFINE(paged_attention_wgmma_ws_bf16_d128, true, 128)
#endif
