// reshape_and_cache: writes each new token's keys and values into its paged-cache slot
// (vLLM's `reshape_and_cache_flash`, §6.1 of the reference).
//
// Algorithm. Work is cut into *items*: one item is 8 consecutive elements (one 16-byte vector
// of f16 / bf16) of one (token, kv head) row, and moves both the key and the value vector.
// A token has units = num_kv_heads * head_size / 8 items; items are numbered token-major, so
// consecutive threads read consecutive 16-byte vectors of the key / value rows and write
// whole head rows of the cache (256 B for D = 128 bf16), in either layout.
//
// The tokens are cut into chunks of rc_tokens_per_chunk(units) tokens (about
// RC_THREADS * RC_ITEMS_PER_THREAD items, 1 to RC_MAX_TOKENS tokens); a CTA takes chunk
// blockIdx.x, then every gridDim.x-th chunk after it (grid-stride, so any grid is correct;
// the launch sizes it to one chunk per CTA). Per chunk, the CTA's threads first read each
// token's slot once (slot_mapping[t], int64) and turn it into the element offset of the
// token's key row in the cache, -1 for slot < 0 (PAD_SLOT_ID: nothing is written), in shared
// memory; then each thread takes RC_UNROLL_COPY (same-dtype copy of f16 / bf16) or RC_UNROLL
// (every other pair) items at a time: both vector loads of every item first
// (ld.global.nc), then the conversions and stores, so each thread keeps 2x that many loads
// in flight. The launch bound (RC_MIN_CTAS) keeps 1024 threads per SM.
//
// Conversion: the kernel is instantiated for every (activation dtype, cache dtype) pair and
// dispatches once on the pair. Same dtype: the raw bits are copied. Otherwise each element
// goes through f32 to the cache dtype: f16 with cvt.rn, bf16 round-to-nearest-even (NaN kept
// quiet with its sign, as pa_f32_to_bf16), fp8 as x / scale (IEEE division, as the CPU's
// `x / scale`; NVRTC's default -prec-div=true) then rc_f32_to_fp8: saturating,
// round-to-nearest-even, NaN -> 0x7F, bit-identical to pa_f32_to_fp8 in common.cuh and to
// src/fp8.rs. Non-fp8 caches ignore the scales.
//
// Layout: key / value [T][num_kv_heads][head_size] (rows >= num_tokens; extra rows ignored);
// cache of logical shape (num_blocks, 2, block_size, num_kv_heads, head_size), NHD
// ([blocks][2][bs][H][D]) or HND ([blocks][2][H][bs][D]), as pa_cache_offset; slot_mapping
// [num_tokens] int64. The value row of a slot is block_size * H * D elements after its key
// row in both layouts.
//
// Bounds relied on (established on the host): every slot is -1 or in
// 0..num_blocks*block_size (CommonAttentionMetadata validation), so block = slot / block_size
// < num_blocks and off = slot % block_size < block_size, and every store (head < H, element
// e + 8 <= D) lands in the cache's num_blocks blocks (impl checks); key / value have at least
// num_tokens rows of num_kv_heads*head_size elements (impl argument checks) and only rows
// t < num_tokens are read; block_size * num_kv_heads * head_size < 2^31 (the launch checks),
// so offsets within a block or a token are 32-bit; head_size is a multiple of 8
// (descriptor, and the launch checks) and every buffer starts 16-byte aligned (device allocations are 256-byte aligned), so every
// vector access is aligned: an item starts at a multiple of 8 elements (16 / 32 B of f16 /
// f32 input, 8 / 16 / 32 B of fp8 / f16 / f32 cache). Duplicate slots race (which write wins
// is unspecified), as in vLLM.

#include "common.cuh"

// Threads per CTA the launch uses (any blockDim.x up to it is correct; it sizes the chunks;
// attention_impl.rs RESHAPE_THREADS).
#define RC_THREADS 256
// Items a chunk aims to give each thread (attention_impl.rs reshape_tokens_per_cta).
#define RC_ITEMS_PER_THREAD 8
// Most tokens per chunk (the shared-memory table of row offsets).
#define RC_MAX_TOKENS 256
// Items a thread loads before it stores: converting pairs, and the f16 / bf16 raw copy.
#define RC_UNROLL 2
#define RC_UNROLL_COPY 4
// CTAs per SM the launch bound asks for: registers capped at 64 (no spills; the f32 paths
// would take ~72 and fit only 3 CTAs), 1024 threads per SM.
#define RC_MIN_CTAS 4

struct ReshapeParams {
    const void* key;
    const void* value;
    void* cache;
    const pa_i64* slot_mapping;
    int in_dtype;
    int cache_dtype;
    int layout_hnd;
    int num_tokens;
    int num_kv_heads;
    int head_size;
    int block_size;
    float k_scale;  // 1.0 unless the cache is fp8
    float v_scale;
    int pad_;
};
static_assert(sizeof(ReshapeParams) == 72, "ReshapeParams must match kernels.rs");

// Tokens per chunk for `units` items per token; the launch (attention_impl.rs,
// reshape_tokens_per_cta) mirrors it to size the grid.
__device__ __forceinline__ int rc_tokens_per_chunk(int units) {
    return max(1, min(RC_MAX_TOKENS, (RC_THREADS * RC_ITEMS_PER_THREAD) / max(units, 1)));
}

// 8 elements as loaded or stored: f32 uses a and b (32 B), f16 / bf16 a (16 B), fp8 a.x, a.y
// (8 B). Unused fields are dead and cost no registers.
struct RcVec {
    uint4 a;
    uint4 b;
};

template <int DT>
__device__ __forceinline__ int rc_elem_bytes() {
    return DT == PA_F32 ? 4 : (DT == PA_F16 || DT == PA_BF16) ? 2 : 1;
}

// 16 bytes of a buffer no kernel writes during the launch: NVIDIA reads them through the
// non-coherent (texture) path; AMD has no such path and takes a plain vector load.
__device__ __forceinline__ uint4 rc_ld_nc16(const char* p) {
#if PA_NVIDIA
    uint4 v;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
#else
    return *(const uint4*)p;
#endif
}

// Input elements e..e+8 (e a multiple of 8) of a read-only activation buffer.
template <int DT>
__device__ __forceinline__ RcVec rc_load(const void* base, pa_i64 e) {
    const char* p = (const char*)base + e * rc_elem_bytes<DT>();
    RcVec v;
    v.a = rc_ld_nc16(p);
    if (DT == PA_F32) {
        v.b = rc_ld_nc16(p + 16);
    } else {
        v.b = make_uint4(0, 0, 0, 0);
    }
    return v;
}

// Stores cache elements e..e+8 (e a multiple of 8).
template <int DT>
__device__ __forceinline__ void rc_store(void* base, pa_i64 e, const RcVec& v) {
    char* p = (char*)base + e * rc_elem_bytes<DT>();
    if (DT == PA_F32) {
        ((uint4*)p)[0] = v.a;
        ((uint4*)p)[1] = v.b;
    } else if (DT == PA_F16 || DT == PA_BF16) {
        *(uint4*)p = v.a;
    } else {
        *(uint2*)p = make_uint2(v.a.x, v.a.y);
    }
}

template <int DT>
__device__ __forceinline__ void rc_unpack(const RcVec& v, float* f) {
    const pa_u32 w[8] = {v.a.x, v.a.y, v.a.z, v.a.w, v.b.x, v.b.y, v.b.z, v.b.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        if (DT == PA_F32) {
            f[k] = __uint_as_float(w[k]);
        } else {
            const pa_u16 h = (pa_u16)((w[k / 2] >> (16 * (k % 2))) & 0xffffu);
            f[k] = DT == PA_F16 ? pa_f16_to_f32(h) : pa_bf16_to_f32(h);
        }
    }
}

// Bit-identical to pa_f32_to_fp8 (common.cuh): the same steps, with ldexpf's power-of-two
// scalings done as multiplications by an exactly constructed 2^k (a in [2^e, 2^(e+1)) times
// 2^(MANT - e) lands in [2^MANT, 2^(MANT+1)], no overflow or underflow, so it is exact; the
// subnormal branch scales up by the constant 2^(MANT + BIAS - 1), exact as well).
template <int MANT, int BIAS>
__device__ __forceinline__ pa_u32 rc_f32_to_fp8(float x, float maxv) {
    const pa_u32 u = __float_as_uint(x);
    const pa_u32 sign = (u >> 24) & 0x80u;
    const float a = fminf(__uint_as_float(u & 0x7fffffffu), maxv);
    const int e = (int)(__float_as_uint(a) >> 23) - 127;  // floor(log2 a) for normals
    const int min_normal = 1 - BIAS;
    pa_u32 code;
    if (e < min_normal) {
        code = (pa_u32)rintf(a * (float)(1 << (MANT - min_normal)));
    } else {
        const float s = __uint_as_float((pa_u32)(127 + MANT - e) << 23);
        const pa_u32 steps = (pa_u32)rintf(a * s);
        code = ((pa_u32)(e + BIAS) << MANT) + steps - (1u << MANT);
    }
    return (u & 0x7fffffffu) > 0x7f800000u ? 0x7fu : (sign | code);
}

// 8 elements of activation dtype IN to cache dtype OUT (fp8: divided by `scale` first).
template <int IN, int OUT>
__device__ __forceinline__ RcVec rc_convert(const RcVec& in, float scale) {
    if (IN == OUT) return in;
    float f[8];
    rc_unpack<IN>(in, f);
    pa_u32 w[8];
    if (OUT == PA_F32) {
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = __float_as_uint(f[k]);
    } else if (OUT == PA_F16 || OUT == PA_BF16) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const pa_u32 lo = OUT == PA_F16 ? pa_f32_to_f16(f[2 * k]) : pa_f32_to_bf16(f[2 * k]);
            const pa_u32 hi =
                OUT == PA_F16 ? pa_f32_to_f16(f[2 * k + 1]) : pa_f32_to_bf16(f[2 * k + 1]);
            w[k] = lo | (hi << 16);
        }
        w[4] = w[5] = w[6] = w[7] = 0;
    } else {
        w[0] = w[1] = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float y = f[k] / scale;
            const pa_u32 c = OUT == PA_E4M3 ? rc_f32_to_fp8<3, 7>(y, 448.0f)
                                            : rc_f32_to_fp8<2, 15>(y, 57344.0f);
            w[k / 4] |= c << (8 * (k % 4));
        }
        w[2] = w[3] = w[4] = w[5] = w[6] = w[7] = 0;
    }
    RcVec o;
    o.a = make_uint4(w[0], w[1], w[2], w[3]);
    o.b = make_uint4(w[4], w[5], w[6], w[7]);
    return o;
}

template <int IN, int OUT>
__device__ __forceinline__ void rc_run(const ReshapeParams& p, pa_i64* s_row) {
    const int vpr = p.head_size >> 3;                 // items per head row
    const int units = p.num_kv_heads * vpr;           // items per token
    const int tpc = rc_tokens_per_chunk(units);
    // Strides within one block or token fit in 32 bits (block_size * H * D elements).
    const int row = p.num_kv_heads * p.head_size;     // elements per token
    const int kv_stride = p.block_size * row;         // key row -> value row
    const int head_stride = p.layout_hnd ? p.block_size * p.head_size : p.head_size;
    const int tok_stride = p.layout_hnd ? p.head_size : row;
    const pa_i64 nchunks = ((pa_i64)p.num_tokens + tpc - 1) / tpc;
    const int nthreads = (int)blockDim.x;
    constexpr int RC_U = (IN == OUT && IN != PA_F32) ? RC_UNROLL_COPY : RC_UNROLL;
    for (pa_i64 c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const int t0 = (int)(c * tpc);
        const int ntok = min(tpc, p.num_tokens - t0);
        __syncthreads();  // the previous chunk is done with s_row
        for (int i = threadIdx.x; i < ntok; i += nthreads) {
            const pa_i64 slot = p.slot_mapping[t0 + i];
            pa_i64 r = -1;
            if (slot >= 0) {
                const pa_i64 block = slot / p.block_size;
                const int off = (int)(slot - block * p.block_size);
                r = block * (2 * (pa_i64)kv_stride) + off * tok_stride;
            }
            s_row[i] = r;
        }
        __syncthreads();
        const int n = ntok * units;
        for (int i0 = threadIdx.x; i0 < n; i0 += RC_U * nthreads) {
            RcVec k[RC_U];
            RcVec v[RC_U];
            pa_i64 dst[RC_U];
#pragma unroll
            for (int j = 0; j < RC_U; ++j) {
                const int i = i0 + j * nthreads;
                dst[j] = -1;
                if (i < n) {
                    const int tl = (int)((unsigned)i / (unsigned)units);
                    const int r = i - tl * units;  // head * vpr + vector
                    const pa_i64 base = s_row[tl];
                    if (base >= 0) {
                        const int h = (int)((unsigned)r / (unsigned)vpr);
                        const int e = (r - h * vpr) * 8;
                        dst[j] = base + (h * head_stride + e);
                        const pa_i64 src = (pa_i64)(t0 + tl) * row + r * 8;
                        k[j] = rc_load<IN>(p.key, src);
                        v[j] = rc_load<IN>(p.value, src);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < RC_U; ++j) {
                if (dst[j] >= 0) {
                    rc_store<OUT>(p.cache, dst[j], rc_convert<IN, OUT>(k[j], p.k_scale));
                    rc_store<OUT>(p.cache, dst[j] + kv_stride,
                                  rc_convert<IN, OUT>(v[j], p.v_scale));
                }
            }
        }
    }
}

template <int IN>
__device__ __forceinline__ void rc_dispatch_out(const ReshapeParams& p, pa_i64* s_row) {
    switch (p.cache_dtype) {
        case PA_F32: rc_run<IN, PA_F32>(p, s_row); break;
        case PA_F16: rc_run<IN, PA_F16>(p, s_row); break;
        case PA_BF16: rc_run<IN, PA_BF16>(p, s_row); break;
        case PA_E4M3: rc_run<IN, PA_E4M3>(p, s_row); break;
        case PA_E5M2: rc_run<IN, PA_E5M2>(p, s_row); break;
        default: break;
    }
}

extern "C" __global__ void PA_LAUNCH_BOUNDS(RC_THREADS, RC_MIN_CTAS)
    reshape_and_cache(const ReshapeParams p) {
    PA_DEPENDENT_PROLOGUE();
    __shared__ pa_i64 s_row[RC_MAX_TOKENS];
    switch (p.in_dtype) {
        case PA_F32: rc_dispatch_out<PA_F32>(p, s_row); break;
        case PA_F16: rc_dispatch_out<PA_F16>(p, s_row); break;
        case PA_BF16: rc_dispatch_out<PA_BF16>(p, s_row); break;
        default: break;
    }
}
