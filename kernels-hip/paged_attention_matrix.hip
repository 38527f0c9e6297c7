// Paged prefill on AMD matrix cores: the FlashAttention-2 forward of the CUDA family's
// tensor-core kernel (kernels-cuda/paged_attention_mma.cu) for AMD GPUs, whose matrix
// instructions, wavefronts and memory pipeline differ from NVIDIA's. f16 / bf16 activations
// with a cache of the same dtype, head sizes 64, 96 and 128; the HIP backend runs its
// prefill / chunked-prefill requests (query length >= 16) here and everything else on the
// portable CUDA-core kernel (kernels-cuda/paged_attention.cu), which is also the reference
// for the semantics.
//
// Matrix instruction (PA_MC_KIND, set by the host per target):
//   1  MFMA v_mfma_f32_16x16x16{f16,bf16_1k}: CDNA2 / CDNA3 (gfx90a, gfx94x), wave64.
//   2  WMMA v_wmma_f32_16x16x16_{f16,bf16}_w32: RDNA3 (gfx11), wave32.
// Both compute one 16 x 16 x 16 tile D = A B + C with f32 accumulators; they differ only in
// which lane holds which element (the fragment table below). Compiled for NVIDIA (NVRTC),
// kind 2 runs with the WMMA product emulated lane for lane by warp shuffles: slow, but it
// runs this file's tiling, masks, softmax and stores on a GPU that is here (the CUDA
// backend's `POLYATTN_CUDA_MMA=amd-wmma`).
//
// Fragments of one 16 x 16 x 16 tile, lane l of the wavefront (KPL 16-bit values of A and
// B, CPL f32 values of C per lane):
//   MFMA: A row l%16, k 4(l/16)+e (e < 4); B column l%16, k 4(l/16)+e; C column l%16,
//         row 4(l/16)+i (i < 4).
//   WMMA: A row l%16, k e (e < 16; lanes 16..31 repeat lanes 0..15); B column l%16, k e;
//         C column l%16, row 2i + l/16 (i < 8).
// In both, the lanes holding one C row are the 16 lanes of one group l/16, so a row's max
// and sum are reductions over lane bits 0..3 (xor 1, 2, 4, 8).
//
// Work: the planner's WorkItem list (see common.cuh) with up to MC_ROWS = 64 rows per item:
// query tokens [q_start, q_start + q_len) of request `req` times query heads
// kv_head*group + [head_start, head_start + head_count), row r = token r / head_count, head
// r % head_count (a GQA group's heads share every K/V tile). num_splits is always 1.
//
// Algorithm per workgroup (MC_WAVES = 4 wavefronts; wavefront w owns rows 16w .. 16w + 15):
//  1. The Q tile [64][D] is stored to LDS (rows past the item's rows zero-filled).
//  2. Keys are visited in tiles of MC_KEYS = 32 from the union of the rows' visible ranges.
//     K and V tiles are gathered from the paged cache with 16-byte loads into registers and
//     stored to double-buffered LDS (K row-major, V transposed so that a B fragment of P V is
//     one contiguous read); positions outside the union are zero-filled, so masked V rows
//     hold zeros, never stale NaNs. While tile i is computed, tile i+1's loads are in flight;
//     they are stored to the other buffer after the compute, and one barrier per tile makes
//     them visible and frees the buffer just read.
//  3. S = Q K^T per wavefront: 16 x 32 scores (two n16 tiles, D/16 k16 steps). A wavefront
//     whose rows see no key of the tile skips it.
//  4. Softmax in base 2: scores are scaled (soft cap and ALiBi applied in natural units),
//     times log2 e, masked to -inf outside each row's visible range (by selection), and the
//     running max m, the lane's partial denominator l and the O accumulators are rescaled by
//     2^(m_old - m_new). A row past the item's rows is computed as if it saw every key (its Q
//     is zero) and never stored.
//  5. P = 2^(s - m_new) goes through the wavefront's LDS scratch ([16][32], 16-bit) from the
//     C layout to the A layout, and O += P V (D/16 n16 tiles, 2 k16 steps).
//  6. l is reduced over the row's 16 lanes; out = O / l (0 when l = 0), lse = m ln 2 + ln l
//     (-inf when the row saw neither key nor sink). A sink starts a row at m = sink log2 e
//     with l = 1 on one lane of the row.
//
// Layouts: q [T][H][D], cache NHD or HND, out [T][H][D] in the activation dtype, lse
// [H][num_tokens]; dynamic LDS (`matrix_smem_bytes` on the host): Q [64][D+8], K [2][32][D+8],
// V^T [2][D][40], P [4][16][40] (16-bit elements; every row a multiple of 16 bytes).
//
// Bounds relied on (host side): as paged_attention.cu, plus q_len * head_count <= 64,
// head_size == D, cache dtype == activation dtype (f16 / bf16), q and cache 16-byte aligned
// (every row starts at a multiple of D elements, D a multiple of 16), 4 * PA_WAVE threads,
// the dynamic LDS above. Block-table entries are read only for keys inside the item's
// visible union.

#include "common.cuh"

#ifndef PA_MC_KIND
#error "paged_attention_matrix: the host passes -DPA_MC_KIND=1 (MFMA) or 2 (WMMA)"
#endif
#if PA_MC_KIND == 1
#if PA_WAVE != 64
#error "MFMA 16x16x16 fragments are laid out for 64-lane wavefronts"
#endif
#define MC_KPL 4
#define MC_CPL 4
#elif PA_MC_KIND == 2
#if PA_WAVE != 32
#error "WMMA _w32 fragments are laid out for 32-lane wavefronts"
#endif
#define MC_KPL 16
#define MC_CPL 8
#else
#error "PA_MC_KIND: 1 (MFMA) or 2 (WMMA)"
#endif
#if PA_NVIDIA && PA_MC_KIND != 2
#error "on NVIDIA only the WMMA layout is emulated"
#endif

#define MC_WAVES 4
#define MC_THREADS (MC_WAVES * PA_WAVE)
#define MC_ROWS (16 * MC_WAVES)
#define MC_KEYS 32
#define MC_VS (MC_KEYS + 8)  // row stride of the V^T and P tiles, in 16-bit elements
#define MC_LOG2E 1.4426950408889634f
#define MC_LN2 0.6931471805599453f

// ---------------------------------------------------------------- fragment table

// First k of the lane's A / B values.
__device__ __forceinline__ int mc_kbase(int lane) {
#if PA_MC_KIND == 1
    return 4 * (lane >> 4);
#else
    return 0;
#endif
}

// Row of the lane's C value i (its column is lane % 16).
__device__ __forceinline__ int mc_crow(int lane, int i) {
#if PA_MC_KIND == 1
    return 4 * (lane >> 4) + i;
#else
    return 2 * i + ((lane >> 4) & 1);
#endif
}

// A / B fragment: the lane's MC_KPL 16-bit values, packed two per word (low half first).
struct mc_frag {
    pa_u32 w[MC_KPL / 2];
};

// The lane's MC_KPL contiguous 16-bit values at `p` (8-byte aligned for MFMA, 16 for WMMA).
__device__ __forceinline__ mc_frag mc_lds_load(const pa_u16* p) {
    mc_frag f;
#if PA_MC_KIND == 1
    const uint2 v = *(const uint2*)p;
    f.w[0] = v.x;
    f.w[1] = v.y;
#else
    const uint4 a = ((const uint4*)p)[0];
    const uint4 b = ((const uint4*)p)[1];
    f.w[0] = a.x; f.w[1] = a.y; f.w[2] = a.z; f.w[3] = a.w;
    f.w[4] = b.x; f.w[5] = b.y; f.w[6] = b.z; f.w[7] = b.w;
#endif
    return f;
}

#if PA_AMD
#if PA_MC_KIND == 1
typedef _Float16 mc_half_v __attribute__((ext_vector_type(4)));
typedef short mc_short_v __attribute__((ext_vector_type(4)));
typedef float mc_float_v __attribute__((ext_vector_type(4)));
#else
typedef _Float16 mc_half_v __attribute__((ext_vector_type(16)));
typedef short mc_short_v __attribute__((ext_vector_type(16)));
typedef float mc_float_v __attribute__((ext_vector_type(8)));
#endif
#endif

// c += a b for one 16 x 16 x 16 tile (the lane's fragments).
template <bool BF16>
__device__ __forceinline__ void mc_mma(float (&c)[MC_CPL], const mc_frag& a, const mc_frag& b) {
#if PA_AMD
    mc_float_v acc;
#pragma unroll
    for (int i = 0; i < MC_CPL; ++i) acc[i] = c[i];
    if (BF16) {
        const mc_short_v av = __builtin_bit_cast(mc_short_v, a);
        const mc_short_v bv = __builtin_bit_cast(mc_short_v, b);
#if PA_MC_KIND == 1
        acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(av, bv, acc, 0, 0, 0);
#else
        acc = __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(av, bv, acc);
#endif
    } else {
        const mc_half_v av = __builtin_bit_cast(mc_half_v, a);
        const mc_half_v bv = __builtin_bit_cast(mc_half_v, b);
#if PA_MC_KIND == 1
        acc = __builtin_amdgcn_mfma_f32_16x16x16f16(av, bv, acc, 0, 0, 0);
#else
        acc = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(av, bv, acc);
#endif
    }
#pragma unroll
    for (int i = 0; i < MC_CPL; ++i) c[i] = acc[i];
#else
    // The WMMA product, lane for lane: C row 2i + l/16 needs A's row from lane (2i + l/16),
    // which holds it (A rows live in lanes 0..15); B's column is the lane's own.
    const int lane = threadIdx.x & 31;
    float af[MC_KPL], bf[MC_KPL];
#pragma unroll
    for (int e = 0; e < MC_KPL; ++e) {
        const pa_u16 x = (pa_u16)((a.w[e / 2] >> (16 * (e % 2))) & 0xffffu);
        const pa_u16 y = (pa_u16)((b.w[e / 2] >> (16 * (e % 2))) & 0xffffu);
        af[e] = BF16 ? pa_bf16_to_f32(x) : pa_f16_to_f32(x);
        bf[e] = BF16 ? pa_bf16_to_f32(y) : pa_f16_to_f32(y);
    }
#pragma unroll
    for (int i = 0; i < MC_CPL; ++i) {
        const int src = mc_crow(lane, i);
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < MC_KPL; ++e) s = fmaf(pa_shfl(af[e], src), bf[e], s);
        c[i] += s;
    }
#endif
}

// ---------------------------------------------------------------- helpers

// Orders a wavefront's LDS writes before its own lanes' later reads of them.
__device__ __forceinline__ void mc_wave_sync() {
#if PA_AMD
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
    __syncwarp();
#endif
}

__device__ __forceinline__ int mc_shfl_xor_int(int v, int m) {
    return __float_as_int(pa_shfl_xor(__int_as_float(v), m));
}

// Max / sum over the 16 lanes of the lane's group (the lanes that hold one C row).
__device__ __forceinline__ float mc_row_max(float v) {
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) v = fmaxf(v, pa_shfl_xor(v, o));
    return v;
}

__device__ __forceinline__ float mc_row_sum(float v) {
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) v += pa_shfl_xor(v, o);
    return v;
}

__device__ __forceinline__ float mc_exp2(float x) {
#if PA_AMD
    return __builtin_exp2f(x);
#else
    return ptx_ex2(x);
#endif
}

template <bool BF16>
__device__ __forceinline__ pa_u16 mc_pack(float x) {
    return BF16 ? pa_f32_to_bf16(x) : pa_f32_to_f16(x);
}

// ---------------------------------------------------------------- the kernel

template <bool BF16, int D>
__device__ __forceinline__ void mc_attend(const AttnParams& p) {
    constexpr int QS = D + 8;               // row stride of the Q and K tiles (elements)
    constexpr int CH = D / 8;               // 16-byte chunks per row
    constexpr int NT = D / 16;              // n16 tiles of O, k16 steps of Q K^T
    constexpr int TILE_CH = MC_KEYS * CH;   // chunks of one K (or V) tile
    constexpr int NCH = (TILE_CH + MC_THREADS - 1) / MC_THREADS;  // per thread
    extern __shared__ uint4 mc_smem[];
    pa_u16* const q_s = (pa_u16*)mc_smem;
    pa_u16* const k_s = q_s + MC_ROWS * QS;       // [2][MC_KEYS][QS]
    pa_u16* const v_s = k_s + 2 * MC_KEYS * QS;   // [2][D][MC_VS], transposed
    pa_u16* const p_s = v_s + 2 * D * MC_VS;      // [MC_WAVES][16][MC_VS]

    const WorkItem it = p.items[blockIdx.x];
    const int tid = threadIdx.x;
    const int lane = tid & (PA_WAVE - 1);
    const int wave = tid >> PA_WAVE_LOG2;
    const int col = lane & 15;
    const int kb = mc_kbase(lane);
    const int hc = it.head_count;
    const int rows = it.q_len * hc;
    const int qsl0 = p.query_start_loc[it.req];
    const int req_q_len = p.query_start_loc[it.req + 1] - qsl0;
    const int ctx = p.seq_lens[it.req] - req_q_len;
    const int pos0 = ctx + (it.q_start - qsl0);
    const int head0 = it.kv_head * p.group + it.head_start;
    const pa_u16* q = (const pa_u16*)p.q;
    const pa_u16* cache = (const pa_u16*)p.cache;
    const pa_i64 v_delta = (pa_i64)p.block_size * p.num_kv_heads * D;

    // Key tiles cover the union of the rows' visible ranges.
    int span_lo, span_hi, tmp;
    pa_visible(p, pos0, it.kv_lo, it.kv_hi, &span_lo, &tmp);
    pa_visible(p, pos0 + it.q_len - 1, it.kv_lo, it.kv_hi, &tmp, &span_hi);
    span_lo = max(span_lo, it.kv_lo);
    span_hi = min(span_hi, it.kv_hi);
    const int* bt = p.block_table + (pa_i64)it.req * p.bt_stride;

    // 1. Q tile.
    for (int i = tid; i < MC_ROWS * CH; i += MC_THREADS) {
        const int r = i / CH;
        const int c = i - r * CH;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < rows) {
            const int t = it.q_start + r / hc;
            const int h = head0 + r % hc;
            v = *(const uint4*)(q + ((pa_i64)t * p.num_heads + h) * D + c * 8);
        }
        *(uint4*)(q_s + r * QS + c * 8) = v;
    }

    // 2. The staged chunks of one K / V tile: loads (zeros outside the union), then stores.
    uint4 kreg[NCH], vreg[NCH];
    auto stage_load = [&](int c0) {
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
            const int ci = tid + k * MC_THREADS;
            const int j = ci / CH;
            const int c = ci - j * CH;
            const int kp = c0 + j;
            kreg[k] = vreg[k] = make_uint4(0u, 0u, 0u, 0u);
            if (ci < TILE_CH && kp >= span_lo && kp < span_hi) {
                const int block = bt[kp / p.block_size];
                const pa_i64 o = pa_cache_offset(block, 0, kp % p.block_size, it.kv_head,
                                                 p.block_size, p.num_kv_heads, D,
                                                 p.layout_hnd) +
                                 c * 8;
                kreg[k] = *(const uint4*)(cache + o);
                vreg[k] = *(const uint4*)(cache + o + v_delta);
            }
        }
    };
    auto stage_store = [&](int buf) {
        pa_u16* const kt = k_s + buf * MC_KEYS * QS;
        pa_u16* const vt = v_s + buf * D * MC_VS;
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
            const int ci = tid + k * MC_THREADS;
            if (ci >= TILE_CH) continue;
            const int j = ci / CH;
            const int c = ci - j * CH;
            *(uint4*)(kt + j * QS + c * 8) = kreg[k];
            const pa_u32 w[4] = {vreg[k].x, vreg[k].y, vreg[k].z, vreg[k].w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                vt[(c * 8 + 2 * e) * MC_VS + j] = (pa_u16)(w[e] & 0xffffu);
                vt[(c * 8 + 2 * e + 1) * MC_VS + j] = (pa_u16)(w[e] >> 16);
            }
        }
    };

    // Per-row state of the lane's MC_CPL rows, softmax in base 2 (m in units of log2); each
    // row's visible range [lo, hi) in LDS (registers go to the accumulators).
    __shared__ int2 vis_s[MC_ROWS];
    float m[MC_CPL], l[MC_CPL];
    int u_lo = 1 << 30, u_hi = -(1 << 30);
#pragma unroll
    for (int i = 0; i < MC_CPL; ++i) {
        const int r = 16 * wave + mc_crow(lane, i);
        const bool act = r < rows;
        int lo, hi;
        pa_visible(p, pos0 + r / hc, it.kv_lo, it.kv_hi, &lo, &hi);
        if (!act) {
            lo = -(1 << 30);
            hi = 1 << 30;
        } else if (lo < hi) {
            u_lo = min(u_lo, lo);
            u_hi = max(u_hi, hi);
        }
        if (col == 0) vis_s[r] = make_int2(lo, hi);
        const bool sink = p.use_sinks && act;
        m[i] = sink ? p.sinks[head0 + r % hc] * MC_LOG2E : -PA_INF;
        l[i] = (sink && col == 0) ? 1.0f : 0.0f;
    }
    float o_acc[NT][MC_CPL];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int i = 0; i < MC_CPL; ++i) o_acc[n][i] = 0.0f;
    }

    const int first = span_lo;
    if (first < span_hi) {
        stage_load(first);
        stage_store(0);
    }
    __syncthreads();  // the Q tile and key tile 0

    const pa_u16* const q_row = q_s + (16 * wave + col) * QS + kb;
    pa_u16* const p_w = p_s + wave * 16 * MC_VS;
    int buf = 0;
    for (int c0 = first; c0 < span_hi; c0 += MC_KEYS, buf ^= 1) {
        const bool more = c0 + MC_KEYS < span_hi;  // uniform over the workgroup
        if (more) stage_load(c0 + MC_KEYS);
        if (u_lo < c0 + MC_KEYS && u_hi > c0) {  // uniform over the wavefront
            const pa_u16* const kt = k_s + buf * MC_KEYS * QS;
            const pa_u16* const vt = v_s + buf * D * MC_VS;
            // 3. S = Q K^T for keys c0 + 16 nj + col.
            float s[2][MC_CPL];
#pragma unroll
            for (int nj = 0; nj < 2; ++nj) {
#pragma unroll
                for (int i = 0; i < MC_CPL; ++i) s[nj][i] = 0.0f;
            }
            // Not unrolled (nor the P V loop below): unrolled, the compiler hoists every
            // fragment load of the tile and exceeds RDNA3's 256 VGPRs (scratch spills).
#pragma unroll 1
            for (int kk = 0; kk < NT; ++kk) {
                const mc_frag a = mc_lds_load(q_row + 16 * kk);
#pragma unroll
                for (int nj = 0; nj < 2; ++nj) {
                    mc_mma<BF16>(s[nj], a, mc_lds_load(kt + (16 * nj + col) * QS + 16 * kk + kb));
                }
            }
            // 4. Scores in base 2, masked by selection; the online-softmax step.
#pragma unroll
            for (int i = 0; i < MC_CPL; ++i) {
                const int r = 16 * wave + mc_crow(lane, i);
                const int2 vis = vis_s[r];
                float slope = 0.0f;
                int pos = 0;
                if (p.alibi != 0 && r < rows) {
                    slope = p.alibi[head0 + r % hc];
                    pos = pos0 + r / hc;
                }
                float mx = m[i];
#pragma unroll
                for (int nj = 0; nj < 2; ++nj) {
                    const int kp = c0 + 16 * nj + col;
                    float x = s[nj][i] * p.scale;
                    if (p.soft_cap > 0.0f) x = p.soft_cap * tanhf(x / p.soft_cap);
                    x -= slope * fabsf((float)(pos - kp));
                    x *= MC_LOG2E;
                    x = (kp >= vis.x && kp < vis.y) ? x : -PA_INF;
                    s[nj][i] = x;
                    mx = fmaxf(mx, x);
                }
                mx = mc_row_max(mx);
                const float msub = mx == -PA_INF ? 0.0f : mx;
                const float alpha = mc_exp2(m[i] - msub);
                m[i] = mx;
                float rs = 0.0f;
#pragma unroll
                for (int nj = 0; nj < 2; ++nj) {
                    const float pv = mc_exp2(s[nj][i] - msub);
                    rs += pv;
                    p_w[mc_crow(lane, i) * MC_VS + 16 * nj + col] = mc_pack<BF16>(pv);
                }
                l[i] = l[i] * alpha + rs;
#pragma unroll
                for (int n = 0; n < NT; ++n) o_acc[n][i] *= alpha;
            }
            mc_wave_sync();  // P in the A layout
            // 5. O += P V.
#pragma unroll 1
            for (int kk = 0; kk < MC_KEYS / 16; ++kk) {
                const mc_frag a = mc_lds_load(p_w + col * MC_VS + 16 * kk + kb);
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    mc_mma<BF16>(o_acc[n], a, mc_lds_load(vt + (16 * n + col) * MC_VS + 16 * kk + kb));
                }
            }
        }
        if (more) stage_store(buf ^ 1);
        __syncthreads();  // tile i+1 visible; tile i's buffers and P scratch free
    }

    // 6. Normalise and store the item's rows.
    const int out_dt = BF16 ? PA_BF16 : PA_F16;
#pragma unroll
    for (int i = 0; i < MC_CPL; ++i) {
        const float lt = mc_row_sum(l[i]);
        const int r = 16 * wave + mc_crow(lane, i);
        if (r >= rows) continue;
        const int tok = it.q_start + r / hc;
        const int h = head0 + r % hc;
        const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
        const pa_i64 base = ((pa_i64)tok * p.num_heads + h) * D;
#pragma unroll
        for (int n = 0; n < NT; ++n) pa_store(p.out, base + 16 * n + col, out_dt, o_acc[n][i] * inv);
        if (col == 0 && p.lse != 0) {
            p.lse[(pa_i64)h * p.num_tokens + tok] = lt > 0.0f ? m[i] * MC_LN2 + logf(lt) : -PA_INF;
        }
    }
}

#define MC_DEFINE(NAME, BF16, D)                                                     \
    extern "C" __global__ void PA_LAUNCH_BOUNDS(MC_THREADS, 1) NAME(const AttnParams p) { \
        mc_attend<BF16, D>(p);                                                       \
    }

MC_DEFINE(paged_attention_matrix_f16_d64, false, 64)
MC_DEFINE(paged_attention_matrix_f16_d96, false, 96)
MC_DEFINE(paged_attention_matrix_f16_d128, false, 128)
MC_DEFINE(paged_attention_matrix_bf16_d64, true, 64)
MC_DEFINE(paged_attention_matrix_bf16_d96, true, 96)
MC_DEFINE(paged_attention_matrix_bf16_d128, true, 128)
