// Hopper warpgroup tensor-core building blocks of the wgmma prefill kernel
// (paged_attention_wgmma_ws.cu): shared-memory matrix descriptors
// with the 128-byte swizzle, the wgmma issue / commit / wait wrappers and register fences,
// the m64nNk16 products (A and B from shared memory, or A from registers and B N-major), the
// swizzled tile address, and one key tile's products, online softmax and P packing.
//
// Layouts (the kernels' headers give the whole picture): a tile is stored in column blocks of
// 64 16-bit elements (128 bytes a row), block b holding elements 64 b .. 64 b + 63 of every
// row, and the 16-byte chunk c of row j at chunk position c ^ (j % 8); every block starts on a
// 1024-byte boundary. Accumulators are f32 in the m16 layout of each warp of the warpgroup
// (d[j][e]: n8 tile j; rows g, g + 8 with g = lane / 4; columns 8 j + 2 (lane % 4) + {0, 1}),
// which for two n8 tiles is also the register A fragment of one k16 step.
//
// Needs: common.cuh and prefill_tile.cuh before it; the sm_90a target.
#ifndef POLYATTN_WGMMA_CUH
#define POLYATTN_WGMMA_CUH

// ---------------------------------------------------------------- wgmma wrappers

// A shared-memory matrix descriptor with the 128-byte swizzle: start address, leading- and
// stride-dimension byte offsets, each encoded as (x & 0x3FFFF) >> 4; base offset 0 (every
// pattern starts on a 1024-byte boundary).
__device__ __forceinline__ pa_u64 wg_desc(pa_u32 addr, pa_u32 lbo, pa_u32 sbo) {
    return (pa_u64)((addr & 0x3FFFF) >> 4) | ((pa_u64)((lbo & 0x3FFFF) >> 4) << 16) |
           ((pa_u64)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until none of this warpgroup's committed wgmma groups is pending.
__device__ __forceinline__ void wg_wait_all() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// Makes the shared memory this thread wrote through the generic proxy (cp.async, stores)
// visible to the async proxy (wgmma's operand reads) once a barrier orders the two.
__device__ __forceinline__ void wg_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keeps the compiler from moving reads or writes of accumulators across the wgmma issue /
// wait pair (they are written asynchronously, invisibly to it).
template <int NJ>
__device__ __forceinline__ void wg_fence_regs(float (&d)[NJ][4]) {
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
    }
}

// The same for register A fragments: their writes must come before wgmma.fence, and they
// must stay unchanged until the products that read them are waited for.
template <int NK>
__device__ __forceinline__ void wg_fence_frags(pa_u32 (&a)[NK][4]) {
#pragma unroll
    for (int j = 0; j < NK; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[j][e])::"memory");
    }
}

// The accumulator operands of an m64nN product (N / 8 n8 tiles of d, four f32 each) and their
// placeholders in the instruction (%0 .. %N/2-1); the wrappers below spell one instruction
// each, written once for f16 and bf16 through WG_MMA_SS / WG_MMA_RS.
#define WG_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_D_N64 WG_D4(0), WG_D4(1), WG_D4(2), WG_D4(3), WG_D4(4), WG_D4(5), WG_D4(6), WG_D4(7)
#define WG_D_N128 WG_D_N64, WG_D4(8), WG_D4(9), WG_D4(10), WG_D4(11), WG_D4(12), WG_D4(13), WG_D4(14), WG_D4(15)
#define WG_P_N64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_P_N128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d (+)= A B, A and B from shared memory (descriptors A, B); the predicate operand P (acc)
// says whether d is added to (scale-d) or overwritten.
#define WG_MMA_SS(SHAPE, TY, PD, DOPS, A, B, P)                                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " PD ", " A ", " B      \
                 ", p, 1, 1, 0, 0;\n}\n"                                                         \
                 : DOPS                                                                        \
                 : "l"(da), "l"(db), "r"(acc))

// d += A B, A from registers (four b32: the m16 A fragment of each warp), B from shared memory
// stored N-major (imm-trans-b = 1).
#define WG_MMA_RS(SHAPE, TY, PD, DOPS, A, B, P)                                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " PD ", " A ", " B      \
                 ", p, 1, 1, 1;\n}\n"                                                            \
                 : DOPS                                                                        \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc))

// d (+)= A B for one m64n64k16 step, A and B from shared memory (descriptors), f32
// accumulators in the m16-tile layout of each warp (d[j][e]: n8 tile j).
template <bool BF16>
__device__ __forceinline__ void wg_mma_ss_n64(float (&d)[8][4], pa_u64 da, pa_u64 db, int acc) {
    if (BF16) WG_MMA_SS("m64n64k16", "bf16", WG_P_N64, WG_D_N64, "%32", "%33", "%34");
    else WG_MMA_SS("m64n64k16", "f16", WG_P_N64, WG_D_N64, "%32", "%33", "%34");
}

// d (+)= A B for one m64n128k16 step, A and B from shared memory (descriptors), f32
// accumulators in the m16-tile layout of each warp (d[j][e]: n8 tile j).
template <bool BF16>
__device__ __forceinline__ void wg_mma_ss_n128(float (&d)[16][4], pa_u64 da, pa_u64 db, int acc) {
    if (BF16) WG_MMA_SS("m64n128k16", "bf16", WG_P_N128, WG_D_N128, "%64", "%65", "%66");
    else WG_MMA_SS("m64n128k16", "f16", WG_P_N128, WG_D_N128, "%64", "%65", "%66");
}

// d += A B for one m64n64k16 step, A from registers (the m16 A-fragment layout per warp),
// B from shared memory stored N-major (imm-trans-b = 1).
template <bool BF16>
__device__ __forceinline__ void wg_mma_rs_n64(float (&d)[8][4], const pa_u32 (&a)[4], pa_u64 db) {
    const int acc = 1;
    if (BF16) WG_MMA_RS("m64n64k16", "bf16", WG_P_N64, WG_D_N64, "{%32, %33, %34, %35}", "%36", "%37");
    else WG_MMA_RS("m64n64k16", "f16", WG_P_N64, WG_D_N64, "{%32, %33, %34, %35}", "%36", "%37");
}

// d += A B for one m64n128k16 step, A from registers (the m16 A-fragment layout per warp),
// B from shared memory stored N-major (imm-trans-b = 1).
template <bool BF16>
__device__ __forceinline__ void wg_mma_rs_n128(float (&d)[16][4], const pa_u32 (&a)[4], pa_u64 db) {
    const int acc = 1;
    if (BF16) WG_MMA_RS("m64n128k16", "bf16", WG_P_N128, WG_D_N128, "{%64, %65, %66, %67}", "%68", "%69");
    else WG_MMA_RS("m64n128k16", "f16", WG_P_N128, WG_D_N128, "{%64, %65, %66, %67}", "%68", "%69");
}

// One k16 step of S = Q K^T over N = NJ * 8 keys.
template <bool BF16, int NJ>
__device__ __forceinline__ void wg_mma_qk(float (&s)[NJ][4], pa_u64 dq, pa_u64 dk, int acc) {
    if constexpr (NJ == 16) {
        wg_mma_ss_n128<BF16>(s, dq, dk, acc);
    } else {
        static_assert(NJ == 8, "64 or 128 keys");
        wg_mma_ss_n64<BF16>(s, dq, dk, acc);
    }
}

// One k16 step of O += P V over N = NT * 8 head dimensions.
template <bool BF16, int NT>
__device__ __forceinline__ void wg_mma_pv(float (&o)[NT][4], const pa_u32 (&a)[4], pa_u64 dv) {
    if constexpr (NT == 16) {
        wg_mma_rs_n128<BF16>(o, a, dv);
    } else {
        static_assert(NT == 8, "head size 64 or 128");
        wg_mma_rs_n64<BF16>(o, a, dv);
    }
}

// Byte offset of the 16-byte chunk `c` of row `j` in a swizzled tile of `rows` rows.
__device__ __forceinline__ pa_u32 wg_swizzled(int j, int c, int rows) {
    return (pa_u32)((c >> 3) * rows * 128 + j * 128 + (((c & 7) ^ (j & 7)) << 4));
}

// Issues the cp.async copies of the K and V tile of KEYS keys whose key rows start at the
// global byte addresses krow[0..KEYS) (0: zero-fill from the valid address `dummy`) into the
// swizzled tiles at k_sa / v_sa, from THREADS threads (`tid` in [0, THREADS)). Each thread
// copies one chunk column of every (THREADS / CH)-th row, a multiple of 8 rows apart, so its
// swizzled column and destinations are constants.
template <int D, int KEYS, int THREADS>
__device__ __forceinline__ void wg_load_kv(int tid, const pa_u16* dummy, const pa_u64* krow,
                                           pa_i64 v_delta_b, pa_u32 k_sa, pa_u32 v_sa) {
    constexpr int CH = D / 8;
    constexpr int RSTEP = THREADS / CH;  // rows per copy round
    static_assert(RSTEP % 8 == 0, "rounds keep the swizzle phase");
    static_assert(KEYS % RSTEP == 0, "whole rounds");
    const int c = tid % CH;
    const int j0 = tid / CH;
    const pa_u64 cb = (pa_u64)c * 16;
    const pa_u64 vb = cb + (pa_u64)v_delta_b;
    const pa_u32 dst0 = wg_swizzled(j0, c, KEYS);
#pragma unroll
    for (int k = 0; k < KEYS / RSTEP; ++k) {
        const pa_u32 dst = dst0 + (pa_u32)(k * RSTEP * 128);
        const pa_u64 row = krow[j0 + k * RSTEP];
        if (row != 0) {
            ptx_cp_async16_full(k_sa + dst, (const void*)(row + cb));
            ptx_cp_async16_full(v_sa + dst, (const void*)(row + vb));
        } else {
            ptx_cp_async16(k_sa + dst, dummy, 0);
            ptx_cp_async16(v_sa + dst, dummy, 0);
        }
    }
}

// S = Q K^T for one tile: KT k16 steps issued and committed as one wgmma group (not waited).
template <bool BF16, int NJ, int KT>
__device__ __forceinline__ void wg_issue_qk(float (&s)[NJ][4], pa_u64 dq0, pa_u64 dk) {
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        const pa_u32 off = (pa_u32)((kk >> 2) * 64 * 128 + (kk & 3) * 32);
        const pa_u32 koff = (pa_u32)((kk >> 2) * NJ * 8 * 128 + (kk & 3) * 32);
        wg_mma_qk<BF16, NJ>(s, dq0 + (off >> 4), dk + (koff >> 4), kk > 0 ? 1 : 0);
    }
}

// O += P V for one tile of NK * 16 keys: NK k16 steps issued (not committed, not waited).
template <bool BF16, int NT, int NK>
__device__ __forceinline__ void wg_issue_pv(float (&o)[NT][4], const pa_u32 (&pf)[NK][4],
                                            pa_u64 dv) {
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
        wg_mma_pv<BF16, NT>(o, pf[kk], dv + (pa_u64)((kk * 2048) >> 4));
    }
}

// The online softmax of one tile's scores (base 2), as paged_attention_mma.cu: modifiers
// and mask, the new running maxima m, alpha = 2^(m_old - m_new) for the O rescale (which the
// caller applies when `moved` for some lane of the warp), s overwritten with P, l updated.
template <bool PLAIN, int NJ>
__device__ __forceinline__ bool wg_softmax(const AttnParams& p, float (&s)[NJ][4], int c0,
                                           int4 wb, const int2* vis_s, int r0, int t4, int hc,
                                           int pos0, int head0, float qk_scale, float (&m)[2],
                                           float (&l)[2], float (&alpha)[2]) {
    const bool all_inside = wb.z <= c0 && wb.w >= c0 + NJ * 8;
    float mx[2] = {PLAIN ? -PA_INF : m[0], PLAIN ? -PA_INF : m[1]};
    if (all_inside) {
        const int none[2] = {0, 0};
        pa_mma_scores<false, PLAIN, NJ>(p, s, c0, t4, r0, hc, pos0, head0, none, none, qk_scale,
                                        mx);
    } else {
        const int2 v0 = vis_s[r0];
        const int2 v1 = vis_s[r0 + 8];
        const int lo[2] = {v0.x, v1.x};
        const int hi[2] = {v0.y, v1.y};
        pa_mma_scores<true, PLAIN, NJ>(p, s, c0, t4, r0, hc, pos0, head0, lo, hi, qk_scale, mx);
    }
    float msub[2], rs[2] = {0.0f, 0.0f};
    bool moved = false;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(PA_FULL_MASK, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(PA_FULL_MASK, mx[i], 2));
        if (PLAIN) mx[i] = fmaxf(m[i], mx[i] * qk_scale);
        msub[i] = mx[i] == -PA_INF ? 0.0f : mx[i];
        alpha[i] = ptx_ex2(m[i] - msub[i]);
        moved |= alpha[i] != 1.0f;
        m[i] = mx[i];
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[j][e] = ptx_ex2(PLAIN ? fmaf(s[j][e], qk_scale, -msub[e >> 1])
                                    : s[j][e] - msub[e >> 1]);
        }
    }
    pa_mma_row_reduce<NJ, true>(s, rs);
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + rs[i];
    return __any_sync(PA_FULL_MASK, moved);
}

// P (the scores after wg_softmax) packed to f16x2 / bf16x2: the accumulator layout of two n8
// tiles is wgmma's register A fragment of one k16 step.
template <bool BF16, int NJ>
__device__ __forceinline__ void wg_pack_p(const float (&s)[NJ][4], pa_u32 (&pf)[NJ / 2][4]) {
#pragma unroll
    for (int kk = 0; kk < NJ / 2; ++kk) {
        pf[kk][0] = ptx_pack2<BF16>(s[2 * kk][0], s[2 * kk][1]);
        pf[kk][1] = ptx_pack2<BF16>(s[2 * kk][2], s[2 * kk][3]);
        pf[kk][2] = ptx_pack2<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pf[kk][3] = ptx_pack2<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

template <int NT>
__device__ __forceinline__ void wg_rescale(float (&o)[NT][4], const float (&alpha)[2]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
    }
}

// The start state of this thread's rows r0 and r0 + 8 of an item of `rows` rows (`hc` heads a
// token, first position pos0, first head head0), as paged_attention_mma.cu: each row's
// visible range into vis_s (by the lane with t4 == 0), m / l from the sink or empty. A row
// past the item's rows sees every key (computed, never stored), so it never forces the mask,
// and it stays out of the union. Returns the warp's bounds: the union [x, y) of its rows'
// non-empty visible ranges and the intersection [z, w) of all of them.
__device__ __forceinline__ int4 wg_rows_start(const AttnParams& p, const WorkItem& it, int rows,
                                              int hc, int pos0, int head0, int r0, int t4,
                                              int2* vis_s, float (&m)[2], float (&l)[2]) {
    int u_lo = 1 << 30, u_hi = -(1 << 30), n_lo = -(1 << 30), n_hi = 1 << 30;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = r0 + 8 * i;
        const bool act = r < rows;
        int lo, hi;
        pa_visible(p, pos0 + r / hc, it.kv_lo, it.kv_hi, &lo, &hi);
        if (!act) {
            lo = -(1 << 30);
            hi = 1 << 30;
        }
        if (t4 == 0) vis_s[r] = make_int2(lo, hi);
        if (act && lo < hi) {
            u_lo = min(u_lo, lo);
            u_hi = max(u_hi, hi);
        }
        n_lo = max(n_lo, lo);
        n_hi = min(n_hi, hi);
        const bool sink = p.use_sinks && act;
        m[i] = sink ? p.sinks[head0 + r % hc] * PA_LOG2E : -PA_INF;
        l[i] = (sink && t4 == 0) ? 1.0f : 0.0f;
    }
#pragma unroll
    for (int x = 1; x < 32; x <<= 1) {
        u_lo = min(u_lo, __shfl_xor_sync(PA_FULL_MASK, u_lo, x));
        u_hi = max(u_hi, __shfl_xor_sync(PA_FULL_MASK, u_hi, x));
        n_lo = max(n_lo, __shfl_xor_sync(PA_FULL_MASK, n_lo, x));
        n_hi = min(n_hi, __shfl_xor_sync(PA_FULL_MASK, n_hi, x));
    }
    return make_int4(u_lo, u_hi, n_lo, n_hi);
}

// One key tile of KEYS keys at c0 for a warpgroup, whose K and V stages the descriptors dk
// and dv address: S = Q K^T (waited), the modifiers, mask and online softmax (wg_softmax, O
// rescaled when a row's maximum moved), P packed, O += P V (waited, so the stage may be
// refilled once every warpgroup reading it is past this call). `wb`: the warp's bounds from
// wg_rows_start.
template <bool BF16, int D, bool PLAIN, int KEYS>
__device__ __forceinline__ void wg_tile(const AttnParams& p, pa_u64 dq0, pa_u64 dk, pa_u64 dv,
                                        int c0, int4 wb, const int2* vis_s, int r0, int t4,
                                        int hc, int pos0, int head0, float qk_scale,
                                        float (&m)[2], float (&l)[2], float (&o)[D / 8][4]) {
    constexpr int NJ = KEYS / 8;
    constexpr int NK = KEYS / 16;
    float s[NJ][4];
    wg_fence();
    wg_issue_qk<BF16, NJ, D / 16>(s, dq0, dk);
    wg_commit();
    wg_wait_all();
    wg_fence_regs<NJ>(s);
    float alpha[2];
    if (wg_softmax<PLAIN, NJ>(p, s, c0, wb, vis_s, r0, t4, hc, pos0, head0, qk_scale, m, l,
                              alpha)) {
        wg_rescale<D / 8>(o, alpha);
    }
    pa_u32 pf[NK][4];
    wg_pack_p<BF16, NJ>(s, pf);
    wg_fence_frags<NK>(pf);
    wg_fence_regs<D / 8>(o);
    wg_fence();
    wg_issue_pv<BF16, D / 8, NK>(o, pf, dv);
    wg_commit();
    wg_wait_all();
    wg_fence_regs<D / 8>(o);
    wg_fence_frags<NK>(pf);
}

// The results of this thread's rows r0 and r0 + 8 of the CTA's item: out = O / l (0 when
// l = 0), lse = m ln 2 + ln l (-inf when the row saw neither key nor sink). The item is read
// again from global memory here rather than kept in registers through the key loop.
template <bool BF16, int D>
__device__ __forceinline__ void wg_store_rows(const AttnParams& p, const float (&o)[D / 8][4],
                                              const float (&m)[2], const float (&l)[2], int r0,
                                              int t4) {
    const WorkItem& ie = p.items[blockIdx.x];
    const int e_hc = ie.head_count;
    const int e_rows = ie.q_len * e_hc;
    const int e_q0 = ie.q_start;
    const int e_head0 = ie.kv_head * p.group + ie.head_start;
    const int out_dt = BF16 ? PA_BF16 : PA_F16;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float lt = l[i];
        lt += __shfl_xor_sync(PA_FULL_MASK, lt, 1);
        lt += __shfl_xor_sync(PA_FULL_MASK, lt, 2);
        const int r = r0 + 8 * i;
        if (r >= e_rows) continue;
        const int tok = e_q0 + r / e_hc;
        const int h = e_head0 + r % e_hc;
        const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
        const pa_i64 base = ((pa_i64)tok * p.num_heads + h) * D;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int d = 8 * n + 2 * t4;
            pa_store(p.out, base + d, out_dt, o[n][2 * i] * inv);
            pa_store(p.out, base + d + 1, out_dt, o[n][2 * i + 1] * inv);
        }
        if (t4 == 0 && p.lse != 0) {
            p.lse[(pa_i64)h * p.num_tokens + tok] = lt > 0.0f ? m[i] * PA_LN2 + logf(lt) : -PA_INF;
        }
    }
}

#endif  // POLYATTN_WGMMA_CUH
