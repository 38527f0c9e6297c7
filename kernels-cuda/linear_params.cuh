// The linear layers' parameter block and the helpers of their kernels (model_linear.cu: the
// tiled SGEMM and the GEMVs): weight-row pairs, the epilogues, weight loads of the build's
// type (-DLIN_W). The semantics are model_linear.cu's header.

#ifndef POLYATTN_LINEAR_PARAMS_CUH
#define POLYATTN_LINEAR_PARAMS_CUH

#define LIN_STORE 0
#define LIN_ACCUMULATE 1
#define LIN_SWIGLU 2
#define LIN_ROPE 3

#ifndef LIN_W
#define LIN_W 0
#endif

struct LinearParams {
    const float* x;
    const float* w;          // LIN_W's element type (f32, or f16 / bf16 bits)
    float* y;                // store / accumulate / swiglu output; rope: q
    float* y2;               // rope: k; rope into the cache: the cache
    float* y3;               // rope: v
    const float* norm;       // [K] RMSNorm weight, or null
    const int* positions;    // rope: [T]
    int t;
    int k;
    int n;                   // weight rows
    int vec4;
    int epilogue;            // LIN_*
    float eps;
    int num_heads;           // rope: H
    int num_kv_heads;        // rope: Hk
    int half;                // rope: d / 2
    float rope_base;
    int interleaved;         // rope: 1 = pairs (2i, 2i+1)
    int cache_block_size;    // rope into the cache: tokens per block; 0: k / v outputs
    const pa_i64* slots;     // rope into the cache: [T] slot per token, -1 = not written
    int cache_hnd;           // rope into the cache: 1 = HND layout, 0 = NHD
    int pad_;
};
static_assert(sizeof(LinearParams) == 120, "LinearParams must match src/kernels/cuda/model_ops.rs");

// Row pairs of a pair form (and of the GEMV's store / accumulate): how many there are.
__device__ __forceinline__ int lin_units(const LinearParams& p) {
    return p.epilogue <= LIN_ACCUMULATE ? (p.n + 1) / 2 : p.n / 2;
}

// The two weight rows of pair u (the second equals the first where a store / accumulate
// pair runs past N: it is then computed and dropped).
__device__ __forceinline__ void lin_pair_rows(const LinearParams& p, int u, int* r0, int* r1) {
    if (p.epilogue == LIN_SWIGLU) {
        *r0 = u;
        *r1 = p.n / 2 + u;
    } else if (p.epilogue == LIN_ROPE) {
        const int head = u / p.half;
        int ia, ib;
        pa_rope_pair(u - head * p.half, p.half, p.interleaved, &ia, &ib);
        *r0 = head * 2 * p.half + ia;
        *r1 = head * 2 * p.half + ib;
    } else {
        *r0 = 2 * u;
        *r1 = min(2 * u + 1, p.n - 1);
    }
}

// Rope into the cache: the cache row of key (head < H + Hk) or value head `head` (H <= head)
// of token tok, or null where the token's slot is -1. The cache is [blocks][2][bs][Hk][d]
// (NHD) or [blocks][2][Hk][bs][d] (HND), f32; every slot was checked on the host to lie in
// its blocks, so the row is inside the cache.
__device__ __forceinline__ float* lin_cache_row(const LinearParams& p, pa_i64 tok, int head) {
    const pa_i64 slot = p.slots[tok];
    if (slot < 0) return nullptr;
    const int kv = head >= p.num_heads + p.num_kv_heads ? 1 : 0;
    const int kvh = head - p.num_heads - kv * p.num_kv_heads;
    const pa_i64 block = slot / p.cache_block_size;
    const int off = (int)(slot - block * p.cache_block_size);
    return p.y2 + pa_cache_offset(block, kv, off, kvh, p.cache_block_size, p.num_kv_heads,
                                  2 * p.half, p.cache_hnd);
}

__device__ __forceinline__ float lin_silu(float g) { return g / (1.0f + expf(-g)); }

// Token tok's products a0, a1 of pair u, written as the epilogue says.
__device__ __forceinline__ void lin_put_pair(const LinearParams& p, pa_i64 tok, int u, float a0,
                                             float a1) {
    if (p.epilogue == LIN_SWIGLU) {
        p.y[tok * (p.n / 2) + u] = lin_silu(a0) * a1;
    } else if (p.epilogue == LIN_ROPE) {
        const int d = 2 * p.half;
        const int head = u / p.half;
        const int i = u - head * p.half;
        int ia, ib;
        pa_rope_pair(i, p.half, p.interleaved, &ia, &ib);
        bool rotate;
        float* dst;
        if (p.cache_block_size > 0 && head >= p.num_heads) {
            dst = lin_cache_row(p, tok, head);
            if (dst == nullptr) return;
            rotate = head < p.num_heads + p.num_kv_heads;
        } else {
            dst = pa_qkv_head(p.y, p.y2, p.y3, tok, head, p.num_heads, p.num_kv_heads, d, &rotate);
        }
        if (rotate) {
            pa_rope_rotate(a0, a1, p.positions[tok], i, d, p.rope_base, dst + ia, dst + ib);
        } else {
            dst[ia] = a0;
            dst[ib] = a1;
        }
    } else {
        float* yr = p.y + tok * p.n;
        const int r0 = 2 * u;
        const bool acc = p.epilogue == LIN_ACCUMULATE;
        yr[r0] = acc ? yr[r0] + a0 : a0;
        if (r0 + 1 < p.n) yr[r0 + 1] = acc ? yr[r0 + 1] + a1 : a1;
    }
}

__device__ __forceinline__ float lin_sq4(float4 v, float s) {
    s = fmaf(v.x, v.x, s);
    s = fmaf(v.y, v.y, s);
    s = fmaf(v.z, v.z, s);
    return fmaf(v.w, v.w, s);
}

// x · inv · g per component (model_rms_norm's expression).
__device__ __forceinline__ float4 lin_scale4(float4 v, float inv, float4 g) {
    return make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
}

// One weight element as f32 (LIN_W's type widened).
__device__ __forceinline__ float lin_w1(const LinearParams& p, pa_i64 e) {
#if LIN_W == 0
    return pa_ldg(p.w + e);
#elif LIN_W == 1
    return pa_f16_to_f32(pa_ldg((const pa_u16*)(const void*)p.w + e));
#elif LIN_W == 2
    return pa_bf16_to_f32(pa_ldg((const pa_u16*)(const void*)p.w + e));
#else
#error "LIN_W must be 0 (f32), 1 (f16) or 2 (bf16)"
#endif
}

// Weight elements e..e+3 (e a multiple of 4, vec4 alignment) as f32.
__device__ __forceinline__ float4 lin_w4(const LinearParams& p, pa_i64 e) {
#if LIN_W == 0
    return pa_ldg((const float4*)(p.w + e));
#else
    const uint2 u = pa_ldg((const uint2*)((const pa_u16*)(const void*)p.w + e));
    const pa_u16 h[4] = {(pa_u16)(u.x & 0xffffu), (pa_u16)(u.x >> 16), (pa_u16)(u.y & 0xffffu),
                         (pa_u16)(u.y >> 16)};
#if LIN_W == 1
    return make_float4(pa_f16_to_f32(h[0]), pa_f16_to_f32(h[1]), pa_f16_to_f32(h[2]),
                       pa_f16_to_f32(h[3]));
#else
    return make_float4(pa_bf16_to_f32(h[0]), pa_bf16_to_f32(h[1]), pa_bf16_to_f32(h[2]),
                       pa_bf16_to_f32(h[3]));
#endif
#endif
}

__device__ __forceinline__ float lin_dot4(float4 w, float4 x, float s) {
    s = fmaf(w.x, x.x, s);
    s = fmaf(w.y, x.y, s);
    s = fmaf(w.z, x.z, s);
    return fmaf(w.w, x.w, s);
}

#endif  // POLYATTN_LINEAR_PARAMS_CUH
