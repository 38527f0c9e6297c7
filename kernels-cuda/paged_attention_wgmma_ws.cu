// Paged attention on Hopper's warpgroup tensor-core instructions with a producer warpgroup
// (sm_90a): the CUDA backend's prefill on compute capability 9.0. The work items, masks and
// softmax are paged_attention_mma.cu's (prefill_tile.cuh); the wgmma wrappers and tile step
// are wgmma.cuh's.
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
//    WS_CONSUMER_REGS) and each compute 64 rows of the item: wait on `full` of the tile's
//    stage, S = Q K^T on wgmma (A and B from shared memory), the online softmax in base 2
//    (wgmma.cuh's wg_softmax), O += P V with P from registers and V read N-major, wait for
//    the products, then one arrival per warp on the stage's `empty` mbarrier (8 a phase). A
//    warpgroup whose rows see no key of a tile skips its products but still waits and
//    arrives, so a stage is never refilled while its copies may be in flight. No CTA-wide
//    barrier runs inside the loop: the two consumers drift apart and one's softmax runs
//    beside the other's products.
//  - Parities: tile i is fill i / WS_STAGES of its stage, so consumers wait on `full` with
//    parity (i / WS_STAGES) & 1 and the producer on `empty` with the opposite parity (the
//    first round's wait on a fresh barrier's preceding phase returns at once).
//  - A consumer thread runs fence.proxy.async after each `full` wait: the tiles were written
//    through the generic proxy (cp.async) and wgmma reads them through the async proxy.
//
// Shared memory (dynamic; the base rounded up to 1024 bytes at run time): the Q tile (128
// rows, one swizzled block set per consumer warpgroup), WS_STAGES K tiles, WS_STAGES V tiles,
// each in wgmma.cuh's 128-byte-swizzled column blocks. Static: the mbarriers, the row-address
// table, the rows' visible ranges and the consumer warps' bounds.
//
// Bounds relied on (host side): compute capability 9.0 (the sm_90a cubin); f16 / bf16
// activations and cache of the same dtype, head size 64 or 128; work items of at most 128 rows
// that never split; 384 threads and dynamic shared memory = wgmma_smem_bytes
// (src/kernels/cuda/shapes.rs: 1024 + (128 + 2 STAGES KEYS) D 2 bytes, within the 227 KiB a
// CTA may hold); the registers setmaxnreg hands out within what the launch bounds give the
// CTA (checked below).

#include "common.cuh"
#include "prefill_tile.cuh"
#include "wgmma.cuh"

#ifndef PA_WS_KEYS
#define PA_WS_KEYS 128
#endif
#ifndef PA_WS_STAGES
#define PA_WS_STAGES 2
#endif
// PA_WS_PLAIN: 1 builds only the plain path (no soft cap, no ALiBi), 0 only the modifier
// path, -1 (the whole-file build) both, chosen per launch.
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

// One arrival on `bar` once every cp.async this thread issued before it has landed.
__device__ __forceinline__ void ws_cp_async_arrive(pa_u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

template <int N>
__device__ __forceinline__ void ws_regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N>
__device__ __forceinline__ void ws_regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---------------------------------------------------------------- the kernel

template <bool BF16, int D, bool PLAIN>
__device__ __forceinline__ void ws_attend(const AttnParams& p) {
    constexpr int CH = D / 8;                 // 16-byte chunks per row
    constexpr int NT = D / 8;                 // n8 tiles of O
    constexpr int TILE_B = WS_KEYS * D * 2;   // bytes of one K or V tile
    constexpr int QWG_B = 64 * D * 2;         // bytes of one warpgroup's Q rows
    static_assert(1024 + (WS_ROWS + 2 * WS_STAGES * WS_KEYS) * D * 2 + 4096 <= 227 * 1024,
                  "the stages, the Q tile and the static arrays within a CTA's shared memory");
    extern __shared__ uint4 ws_smem_raw[];
    __shared__ pa_u64 full_s[WS_STAGES];
    __shared__ pa_u64 empty_s[WS_STAGES];
    __shared__ pa_u64 q_full_s;
    __shared__ pa_u64 krow_s[2][WS_KEYS];
    __shared__ int2 vis_s[WS_ROWS];
    __shared__ int4 bounds_s[8];
    const pa_u32 q_sa = (ptx_smem_addr(ws_smem_raw) + 1023u) & ~1023u;
    const pa_u32 k_sa0 = q_sa + WS_ROWS * D * 2;
    const pa_u32 v_sa0 = k_sa0 + WS_STAGES * TILE_B;
    const pa_u32 full0 = ptx_smem_addr(full_s);
    const pa_u32 empty0 = ptx_smem_addr(empty_s);
    const pa_u32 q_full = ptx_smem_addr(&q_full_s);
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
            ws_mbar_init(full0 + 8 * s, 128);
            ws_mbar_init(empty0 + 8 * s, 8);
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
                // Block-table entries only for keys inside the item's visible union.
                const int kp = c0 + tid;
                pa_u64 a = 0;
                if (kp >= span_lo && kp < span_hi) {
                    const int block = bt[kp / p.block_size];
                    const pa_i64 o = pa_cache_offset(block, 0, kp % p.block_size, it.kv_head,
                                                     p.block_size, p.num_kv_heads, D,
                                                     p.layout_hnd);
                    a = (pa_u64)(cache + o);
                }
                krow[tid] = a;
            }
            // The table of this tile for every producer thread; the other buffer was last
            // read before this barrier's previous round.
            ptx_bar_sync(1, 128);
            const pa_u32 free_parity = ((i / WS_STAGES) & 1) ^ 1;
            ws_mbar_wait(empty0 + 8 * s, free_parity);
            wg_load_kv<D, WS_KEYS, 128>(tid, cache, krow, v_delta_b, k_sa0 + s * TILE_B,
                                        v_sa0 + s * TILE_B);
            ws_cp_async_arrive(full0 + 8 * s);
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

    // Per-row state (base 2), as paged_attention_mma.cu: a row past the item's rows sees
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
    int i = 0;
    for (int c0 = first; c0 < span_hi; c0 += WS_KEYS, ++i) {
        const int s = i % WS_STAGES;
        ws_mbar_wait(full0 + 8 * s, (i / WS_STAGES) & 1);
        wg_fence_proxy_async();
        if (g_lo < c0 + WS_KEYS && g_hi > c0) {
            const pa_u64 so = (pa_u64)((s * TILE_B) >> 4);
            wg_tile<BF16, D, PLAIN, WS_KEYS>(p, dq0, dk0 + so, dv0 + so, c0, wb, vis_s, r0, t4, hc,
                                             pos0, head0, qk_scale, m, l, o);
        }
        __syncwarp();
        if (lane == 0) ws_mbar_arrive(empty0 + 8 * s);  // this warp is done with the stage
    }

    wg_store_rows<BF16, D>(p, o, m, l, r0, t4);
}

#if PA_WS_PLAIN == 1
#define PA_WS_BODY(BF16, D) ws_attend<BF16, D, true>(p);
#elif PA_WS_PLAIN == 0
#define PA_WS_BODY(BF16, D) ws_attend<BF16, D, false>(p);
#else
#define PA_WS_BODY(BF16, D)                     \
    if (!(p.soft_cap > 0.0f) && p.alibi == 0) { \
        ws_attend<BF16, D, true>(p);            \
    } else {                                    \
        ws_attend<BF16, D, false>(p);           \
    }
#endif
#define PA_WS_DEFINE(NAME, BF16, D)                                                        \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1) NAME(const AttnParams p) { \
        PA_WS_BODY(BF16, D)                                                                \
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
