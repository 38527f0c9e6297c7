// reshape_and_cache: writes each new token's keys and values into its paged-cache slot
// (vLLM's `reshape_and_cache_flash`, §6.1 of the reference).
//
// Algorithm: one CTA per token t (grid.x = slot_mapping length, a grid-stride loop covers
// more tokens than grid.x). slot = slot_mapping[t]; slot < 0 (PAD_SLOT_ID) writes nothing.
// Otherwise block = slot / block_size, offset = slot % block_size, and the CTA's threads walk
// the num_kv_heads * head_size elements of the token: key and value are read in the
// activation dtype, converted to f32, and stored in the cache dtype (fp8: x / scale,
// saturated, round-to-nearest-even, bit-identical to src/fp8.rs; other dtypes ignore the
// scales).
//
// Layout: key / value [T][num_kv_heads][head_size] (rows >= num_tokens; extra rows ignored);
// cache of logical shape (num_blocks, 2, block_size, num_kv_heads, head_size), NHD or HND
// (see pa_cache_offset); slot_mapping [num_tokens] int64.
//
// Bounds relied on (established on the host): every slot is -1 or in
// 0..num_blocks*block_size (CommonAttentionMetadata validation); key / value have at least
// num_tokens rows of num_kv_heads*head_size elements (impl argument checks); the cache
// holds num_blocks blocks of this spec (impl checks). Duplicate slots race (which write wins
// is unspecified), as in vLLM.

#include "common.cuh"

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

extern "C" __global__ void reshape_and_cache(const ReshapeParams p) {
    const int elems = p.num_kv_heads * p.head_size;
    const bool fp8 = p.cache_dtype == PA_E4M3 || p.cache_dtype == PA_E5M2;
    for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
        const pa_i64 slot = p.slot_mapping[t];
        if (slot < 0) continue;
        const pa_i64 block = slot / p.block_size;
        const int off = (int)(slot % p.block_size);
        for (int i = threadIdx.x; i < elems; i += blockDim.x) {
            const int head = i / p.head_size;
            const int d = i - head * p.head_size;
            const pa_i64 src = (pa_i64)t * elems + i;
            float k = pa_load(p.key, src, p.in_dtype);
            float v = pa_load(p.value, src, p.in_dtype);
            if (fp8) {
                // IEEE division, as the CPU's `x / scale` (NVRTC's default -prec-div=true).
                k = k / p.k_scale;
                v = v / p.v_scale;
            }
            const pa_i64 ko = pa_cache_offset(block, 0, off, head, p.block_size,
                                              p.num_kv_heads, p.head_size, p.layout_hnd);
            const pa_i64 vo = pa_cache_offset(block, 1, off, head, p.block_size,
                                              p.num_kv_heads, p.head_size, p.layout_hnd);
            pa_store(p.cache, ko + d, p.cache_dtype, k);
            pa_store(p.cache, vo + d, p.cache_dtype, v);
        }
    }
}
