// polyattn CUDA-family kernels: shared definitions.
//
// Compiled at run time by NVRTC (src/device/cuda/nvrtc.rs) and, for AMD, by hiprtc; the host
// pastes this header and portability.cuh in place of their include lines, so no compiler
// needs an include path. It includes NO system or toolkit header: NVRTC 13 ships no
// cuda_fp16.h / cuda_bf16.h, so the f16 / bf16 / fp8 conversions below are written with
// inline PTX `cvt` (NVIDIA), clang's _Float16 (AMD) and bit arithmetic. What differs between
// the compilers (PA_NVIDIA / PA_AMD, PA_WAVE, the shuffles, launch bounds) is in
// portability.cuh; everything in this file before the tensor-core section compiles for both.
//
// Element types are passed to kernels as run-time codes (PA_F32 ... PA_E5M2, the same numbers
// as `DtypeCode` in kernels.rs). Conversions happen only where data enters or leaves shared
// memory or registers, never in an inner loop, so the switch costs nothing measurable and
// one compiled kernel serves every dtype combination.
//
// fp8 encoding is vLLM's `saturating_cast_fp8(x / scale)` and matches src/fp8.rs bit for bit:
// |x| is clamped to the largest finite value first (infinities included), then rounded to
// nearest, ties to even; NaN encodes as 0x7F; the sign bit is kept for values that round to 0.

#ifndef POLYATTN_COMMON_CUH
#define POLYATTN_COMMON_CUH

#include "portability.cuh"

typedef unsigned char pa_u8;
typedef unsigned short pa_u16;
typedef unsigned int pa_u32;
typedef long long pa_i64;
typedef unsigned long long pa_u64;

// Element type codes (kernels.rs `DtypeCode`).
#define PA_F32 0
#define PA_F16 1
#define PA_BF16 2
#define PA_E4M3 3
#define PA_E5M2 4

#define PA_INF (__int_as_float(0x7f800000))
#define PA_FULL_MASK 0xffffffffu

// ---------------------------------------------------------------- f16 / bf16 <-> f32

// f16: round to nearest even, both vendors' hardware conversion.
__device__ __forceinline__ float pa_f16_to_f32(pa_u16 h) {
#if PA_NVIDIA
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return (float)__builtin_bit_cast(_Float16, h);
#endif
}

__device__ __forceinline__ pa_u16 pa_f32_to_f16(float f) {
#if PA_NVIDIA
    pa_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    return __builtin_bit_cast(pa_u16, (_Float16)f);
#endif
}

__device__ __forceinline__ float pa_bf16_to_f32(pa_u16 b) {
    return __uint_as_float(((pa_u32)b) << 16);
}

// Round to nearest even; NaN keeps its sign and becomes quiet (as the `half` crate does).
__device__ __forceinline__ pa_u16 pa_f32_to_bf16(float f) {
    pa_u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (pa_u16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (pa_u16)(u >> 16);
}

// ---------------------------------------------------------------- fp8 (OCP E4M3fn, E5M2)

__device__ __forceinline__ float pa_e4m3_to_f32(pa_u8 b) {
    const pa_u32 sign = ((pa_u32)(b & 0x80u)) << 24;
    const pa_u32 exp = (b >> 3) & 0xfu;
    const pa_u32 mant = b & 0x7u;
    if (exp == 0xfu && mant == 0x7u) {
        return __uint_as_float(0x7fc00000u | sign);
    }
    if (exp == 0) {
        // Subnormal: mant * 2^-9.
        return __uint_as_float(sign | __float_as_uint((float)mant * 0.001953125f));
    }
    return __uint_as_float(sign | ((exp + 120u) << 23) | (mant << 20));
}

__device__ __forceinline__ float pa_e5m2_to_f32(pa_u8 b) {
    const pa_u32 sign = ((pa_u32)(b & 0x80u)) << 24;
    const pa_u32 exp = (b >> 2) & 0x1fu;
    const pa_u32 mant = b & 0x3u;
    if (exp == 0x1fu) {
        return __uint_as_float(sign | (mant == 0 ? 0x7f800000u : 0x7fc00000u));
    }
    if (exp == 0) {
        // Subnormal: mant * 2^-16.
        return __uint_as_float(sign | __float_as_uint((float)mant * 1.52587890625e-05f));
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 21));
}

// Saturating round-to-nearest-even encode. MANT: mantissa bits, BIAS: exponent bias,
// MAXV: largest finite value. Every step is exact in f32 (scaling by powers of two; rintf
// rounds half to even), which is what makes it agree with src/fp8.rs's f64 arithmetic.
__device__ __forceinline__ pa_u8 pa_f32_to_fp8(float x, int mant_bits, int bias, float maxv) {
    const pa_u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fu;  // NaN
    }
    const pa_u8 sign = (pa_u8)((u >> 24) & 0x80u);
    const float a = fminf(__uint_as_float(u & 0x7fffffffu), maxv);
    const int e = (int)((__float_as_uint(a) >> 23) & 0xffu) - 127;  // floor(log2 a) for normals
    const int min_normal = 1 - bias;
    pa_u32 code;
    if (e < min_normal) {
        // Quantum 2^(min_normal - mant_bits); a rounded count of 2^mant_bits means the smallest
        // normal, whose code is exactly that count.
        code = (pa_u32)rintf(ldexpf(a, mant_bits - min_normal));
    } else {
        // steps in [2^m, 2^(m+1)]; a carry to 2^(m+1) rolls into the exponent field.
        const pa_u32 steps = (pa_u32)rintf(ldexpf(a, mant_bits - e));
        code = ((pa_u32)(e + bias) << mant_bits) + (steps - (1u << mant_bits));
    }
    return (pa_u8)(sign | code);
}

__device__ __forceinline__ pa_u8 pa_f32_to_e4m3(float x) { return pa_f32_to_fp8(x, 3, 7, 448.0f); }
__device__ __forceinline__ pa_u8 pa_f32_to_e5m2(float x) { return pa_f32_to_fp8(x, 2, 15, 57344.0f); }

// ---------------------------------------------------------------- typed loads and stores

// Element `i` of a buffer of type `dt`, as f32 (fp8 not yet multiplied by its scale).
__device__ __forceinline__ float pa_load(const void* p, pa_i64 i, int dt) {
    switch (dt) {
        case PA_F16: return pa_f16_to_f32(((const pa_u16*)p)[i]);
        case PA_BF16: return pa_bf16_to_f32(((const pa_u16*)p)[i]);
        case PA_E4M3: return pa_e4m3_to_f32(((const pa_u8*)p)[i]);
        case PA_E5M2: return pa_e5m2_to_f32(((const pa_u8*)p)[i]);
        default: return ((const float*)p)[i];
    }
}

// Elements i..i+8 of a buffer of type `dt` as f32, with one vector load (16 bytes for
// f16 / bf16, 8 for fp8, two of 16 for f32). `i` must be a multiple of 8 and the buffer
// 32-byte aligned (device allocations are 256-byte aligned; every row of D elements starts at
// a multiple of D, a multiple of 8).
__device__ __forceinline__ void pa_load8(const void* p, pa_i64 i, int dt, float* out) {
    if (dt == PA_F32) {
        const float4 a = ((const float4*)p)[i / 4];
        const float4 b = ((const float4*)p)[i / 4 + 1];
        out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
        out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    } else if (dt == PA_F16 || dt == PA_BF16) {
        const uint4 v = ((const uint4*)p)[i / 8];
        const pa_u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const pa_u16 lo = (pa_u16)(w[k] & 0xffffu);
            const pa_u16 hi = (pa_u16)(w[k] >> 16);
            out[2 * k] = dt == PA_F16 ? pa_f16_to_f32(lo) : pa_bf16_to_f32(lo);
            out[2 * k + 1] = dt == PA_F16 ? pa_f16_to_f32(hi) : pa_bf16_to_f32(hi);
        }
    } else {
        const uint2 v = ((const uint2*)p)[i / 8];
        const pa_u32 w[2] = {v.x, v.y};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const pa_u8 b = (pa_u8)((w[k / 4] >> (8 * (k % 4))) & 0xffu);
            out[k] = dt == PA_E4M3 ? pa_e4m3_to_f32(b) : pa_e5m2_to_f32(b);
        }
    }
}

// Stores `v` as element `i` of a buffer of type `dt` (fp8: `v` already divided by its scale).
__device__ __forceinline__ void pa_store(void* p, pa_i64 i, int dt, float v) {
    switch (dt) {
        case PA_F16: ((pa_u16*)p)[i] = pa_f32_to_f16(v); break;
        case PA_BF16: ((pa_u16*)p)[i] = pa_f32_to_bf16(v); break;
        case PA_E4M3: ((pa_u8*)p)[i] = pa_f32_to_e4m3(v); break;
        case PA_E5M2: ((pa_u8*)p)[i] = pa_f32_to_e5m2(v); break;
        default: ((float*)p)[i] = v; break;
    }
}

// ---------------------------------------------------------------- paged KV cache addressing

// Element offset of (block, kv, token-in-block, head, 0) in a cache of logical shape
// (num_blocks, 2, block_size, num_kv_heads, head_size) stored NHD ([blocks][2][bs][H][D]) or
// HND ([blocks][2][H][bs][D]); a head's `head_size` elements follow contiguously. 64-bit:
// large caches exceed 2^31 elements.
__device__ __forceinline__ pa_i64 pa_cache_offset(pa_i64 block, int kv, int tok, int head,
                                                  int block_size, int num_kv_heads,
                                                  int head_size, int hnd) {
    const pa_i64 base = (block * 2 + kv) * (pa_i64)block_size * num_kv_heads * head_size;
    return hnd ? base + ((pa_i64)head * block_size + tok) * head_size
               : base + ((pa_i64)tok * num_kv_heads + head) * head_size;
}

// ---------------------------------------------------------------- warp reductions

// Sum / max over the PA_WAVE lanes of a warp or wavefront (every lane ends with the result).
__device__ __forceinline__ float pa_warp_sum(float v) {
#pragma unroll
    for (int o = PA_WAVE / 2; o > 0; o >>= 1) v += pa_shfl_xor(v, o);
    return v;
}

__device__ __forceinline__ float pa_warp_max(float v) {
#pragma unroll
    for (int o = PA_WAVE / 2; o > 0; o >>= 1) v = fmaxf(v, pa_shfl_xor(v, o));
    return v;
}

// ---------------------------------------------------------------- attention work and parameters
//
// Shared by paged_attention.cu, paged_attention_mma.cu and paged_decode.cu. `WorkItem` and
// `SplitGroup` are the planner's records (src/plan/work_item.rs, which documents every field
// and asserts every offset; the WGSL kernels declare the same struct); `AttnParams` mirrors
// src/kernels/cuda/params.rs. Sizes are asserted on both sides.

struct WorkItem {
    int req;
    int q_start;
    int q_len;
    int kv_head;
    int head_start;
    int head_count;
    int kv_lo;
    int kv_hi;
    int split;
    int num_splits;
    int part_tok;  // partial-buffer token index of q_start (num_splits > 1)
    int q_pos;     // sequence position of q_start (the CUDA kernels derive it themselves)
};
static_assert(sizeof(WorkItem) == 48, "WorkItem must match src/plan/work_item.rs");

struct SplitGroup {
    int q_start;
    int q_len;
    int part_tok;
    int num_splits;
};
static_assert(sizeof(SplitGroup) == 16, "SplitGroup must match src/plan/work_item.rs");

struct AttnParams {
    const void* q;
    const void* cache;
    const void* k_dense;
    const void* v_dense;
    const int* block_table;
    const int* seq_lens;
    const int* query_start_loc;
    const WorkItem* items;
    const float* alibi;   // [num_heads] or null
    const float* sinks;   // [num_heads] or null
    void* out;
    float* lse;           // [num_heads][num_tokens] or null
    float* part_out;
    float* part_lse;
    // Per (split token, query head) arrival counters of the decode kernel's fused combine
    // (zero between launches: the last CTA of a token's splits resets its counter).
    int* split_counters;
    int q_dtype;
    int cache_dtype;
    int out_dtype;
    int dense;            // 1: keys/values from k_dense/v_dense (encoder), 0: paged cache
    int layout_hnd;
    int num_heads;
    int num_kv_heads;
    int head_size;
    int group;
    int block_size;
    int bt_stride;
    int num_tokens;
    int n_part_tokens;
    int causal;
    int window;           // 0: none
    int use_sinks;
    float scale;
    float soft_cap;       // 0: off
    float k_scale;        // dequantisation scales (1.0 unless fp8)
    float v_scale;
};
static_assert(sizeof(AttnParams) == 200, "AttnParams must match kernels.rs");

// Visible key range [lo, hi) of a query at `pos` within [kv_lo, kv_hi).
__device__ __forceinline__ void pa_visible(const AttnParams& p, int pos, int kv_lo, int kv_hi,
                                           int* lo, int* hi) {
    int a = kv_lo;
    int b = kv_hi;
    if (p.causal) b = min(b, pos + 1);
    if (p.window > 0) {
        a = max(a, pos + 1 - p.window);
        if (!p.causal) b = min(b, pos + p.window);
    }
    *lo = a;
    *hi = max(a, b);
}

// ---------------------------------------------------------------- dependent launches

// Programmatic dependent launch (Hopper and newer): a kernel the host launches as a
// dependent (src/device/cuda/launch.rs) may start while the kernel before it on the stream
// still runs. PA_DEPENDENT_PROLOGUE, the first statement of every kernel that may be launched
// so, waits until that kernel has finished and its writes are visible (griddepcontrol.wait),
// then lets the next kernel start launching (griddepcontrol.launch_dependents; it too waits
// before reading anything): each kernel's launch latency hides behind the one before it.
// Elsewhere, and for a kernel launched the ordinary way, both are no-ops.
#if PA_NVIDIA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PA_DEPENDENT_PROLOGUE()                                    \
    asm volatile("griddepcontrol.wait;" ::: "memory");            \
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PA_DEPENDENT_PROLOGUE() \
    do {                        \
    } while (0)
#endif

// ---------------------------------------------------------------- RoPE

// Pair i of a head of size d at position pos, rotated: (x0, x1) -> (*y0, *y1).
// inv_freq = powf(base, -2i/d) and angle = float(pos) · inv_freq in f32, reduced to [-π, π]
// (Cody–Waite with fmaf, 2π = 6.28125 + 1.9353e-3) before __sinf / __cosf, which are
// accurate to ~2^-21 there. Every product and sum is written out (fmaf with a separate
// product), so that every kernel that rotates (model_rope, model_rope_split, the linear
// layers' RoPE output) rounds identically whatever the compiler would contract.
__device__ __forceinline__ void pa_rope_rotate(float x0, float x1, int pos, int i, int d,
                                               float base, float* y0, float* y1) {
    const float inv_freq = powf(base, -(float)(2 * i) / (float)d);
    const float a = (float)pos * inv_freq;
    const float kq = rintf(a * 0.15915494309189535f);
    const float r = fmaf(-kq, 0.0019353071795864769f, fmaf(-kq, 6.28125f, a));
    const float c = __cosf(r);
    const float s = __sinf(r);
    const float x1s = x1 * s;
    const float x1c = x1 * c;
    *y0 = fmaf(x0, c, -x1s);
    *y1 = fmaf(x0, s, x1c);
}

// The coordinates (ia, ib) of pair i of a head: (2i, 2i + 1) interleaved, else (i, i + half).
__device__ __forceinline__ void pa_rope_pair(int i, int half, bool interleaved, int* ia, int* ib) {
    *ia = interleaved ? 2 * i : i;
    *ib = interleaved ? *ia + 1 : *ia + half;
}

// Where head `head` of token tok's fused Q/K/V row goes (H query heads, then Hk key heads,
// then Hk value heads, each d wide): its first element in q, k or v; *rotate says whether
// it is rotated (query and key heads) or copied (value heads).
__device__ __forceinline__ float* pa_qkv_head(float* q, float* k, float* v, pa_i64 tok, int head,
                                              int num_heads, int num_kv_heads, int d,
                                              bool* rotate) {
    *rotate = head < num_heads + num_kv_heads;
    if (head < num_heads) return q + (tok * num_heads + head) * d;
    if (head < num_heads + num_kv_heads) return k + (tok * num_kv_heads + head - num_heads) * d;
    return v + (tok * num_kv_heads + head - num_heads - num_kv_heads) * d;
}

#endif  // POLYATTN_COMMON_CUH

#if PA_NVIDIA
// ---- PTX wrappers shared by the tensor-core kernels (paged_attention_mma.cu, paged_decode.cu):
// shared-memory addresses, cp.async, ldmatrix, mma.sync m16n8k16 with f32 accumulators and
// f32 -> f16x2/bf16x2 packing. sm_80+ instructions: only kernels compiled for sm_80 or
// newer may call them (every kernel here is).

__device__ __forceinline__ pa_u32 ptx_smem_addr(const void* p) {
    pa_u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

// 16-byte async copy global -> shared; src_bytes = 0 writes 16 zero bytes (no read).
__device__ __forceinline__ void ptx_cp_async16(pa_u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// 16-byte async copy global -> shared, all 16 bytes read (no source-size operand to compute).
__device__ __forceinline__ void ptx_cp_async16_full(pa_u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

// Named barrier `id` (1 to 15; 0 is __syncthreads') over `threads` threads, a multiple of 32:
// a subset of a CTA's warps synchronises without stalling the others.
__device__ __forceinline__ void ptx_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void ptx_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void ptx_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ptx_ldmatrix_x4(pa_u32 addr, pa_u32& r0, pa_u32& r1, pa_u32& r2,
                                               pa_u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void ptx_ldmatrix_x4_trans(pa_u32 addr, pa_u32& r0, pa_u32& r1,
                                                     pa_u32& r2, pa_u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// d += a * b for one m16n8k16 tile, f32 accumulators.
template <bool BF16>
__device__ __forceinline__ void ptx_mma(float* d, const pa_u32* a, pa_u32 b0, pa_u32 b1) {
    if (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// 2^x with the special-function unit (ex2.approx.ftz: about 2 ulp, -inf -> +0, subnormal
// results flushed to 0). The tensor-core kernels keep their softmax in base 2 so that every
// exponential is one FFMA (x * scale*log2(e) - m) and one MUFU op.
__device__ __forceinline__ float ptx_ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

// Packs (lo, hi) into one register of two 16-bit values, lo in the low half.
template <bool BF16>
__device__ __forceinline__ pa_u32 ptx_pack2(float lo, float hi) {
    pa_u32 r;
    if (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

// Four fp8 values (the bytes of `w`, lowest first) as four 16-bit values of the activation
// type (two f16x2 / bf16x2 words, lowest first). Exact: every E4M3 / E5M2 value is an f16 and
// a bf16. KV: 1 = E4M3, 2 = E5M2.
template <bool BF16, int KV>
__device__ __forceinline__ uint2 pa_fp8x4(pa_u32 w) {
    pa_u32 h[2];  // f16x2
    if (KV == 2) {
        h[0] = __byte_perm(w, 0, 0x1404);  // bytes 0, 1 as the high bytes of two f16
        h[1] = __byte_perm(w, 0, 0x3424);  // bytes 2, 3
    } else {
#if __CUDA_ARCH__ >= 890
        const pa_u16 lo = (pa_u16)(w & 0xffffu);
        const pa_u16 hi = (pa_u16)(w >> 16);
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h[0]) : "h"(lo));
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h[1]) : "h"(hi));
#else
        float f[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) f[k] = pa_e4m3_to_f32((pa_u8)((w >> (8 * k)) & 0xffu));
        return make_uint2(ptx_pack2<BF16>(f[0], f[1]), ptx_pack2<BF16>(f[2], f[3]));
#endif
    }
    if (!BF16) return make_uint2(h[0], h[1]);
    pa_u32 r[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const float lo = pa_f16_to_f32((pa_u16)(h[k] & 0xffffu));
        const float hi = pa_f16_to_f32((pa_u16)(h[k] >> 16));
        r[k] = ptx_pack2<true>(lo, hi);
    }
    return make_uint2(r[0], r[1]);
}

#endif  // PA_NVIDIA
