// reshape_and_cache.wgsl — writes each new token's keys and values into its cache slot
// (vLLM's reshape_and_cache_flash).
//
// For token t with slot s = slot_mapping[t] (i64, read as (low, high) words): s < 0
// (PAD_SLOT_ID; its high word is not 0) writes nothing;
// otherwise block s / block_size, offset s % block_size, and every KV head's D key and value
// elements are converted to the cache dtype by `cache_store4` (fp8: x / scale, correctly
// rounded, then round-to-nearest-even and saturated — bit for bit src/fp8.rs; 16-bit
// formats: RNE; the same dtype: an exact copy).
//
// Specialisation (generated header): WG, `key_load4` / `value_load4` for the activation
// dtype, `cache_store4` for the cache dtype. The head size is a run-time parameter (a
// multiple of 4), so one pipeline serves every layer shape.
//
// Work: one thread per (token, KV head, vec4 column), WG per workgroup, workgroups spread
// over x (≤ 65535) and z.
//
// Layout: key / value [tokens, Hkv, D]; slots i64 as (low, high) i32 pairs; the cache
// [blocks, 2, ...] with the element strides in Params (NHD and HND alike).
// Bounds: slots were validated against blocks × block_size (≤ u32::MAX: the WGSL descriptor
// refuses larger caches, so a slot is its low word as a u32) on the host and
// duplicate slots removed (last write wins, as a sequential reference would do); tokens <
// num_tokens ≤ rows of key and value.

struct Params {
    num_tokens: u32,
    num_kv_heads: u32,
    block_size: u32,
    block_stride: u32,
    kv_stride: u32,
    tok_stride: u32,
    head_stride: u32,
    head_size: u32,
    k_scale: f32,
    v_scale: f32,
    // Blocks per chunk of a cache stored in chunks (see `cache_binding`); unused otherwise.
    blocks_per_window: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read> slots: array<vec2<i32>>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let u = flat_group(wid, nwg) * WG + t;
    let d4 = params.head_size / 4u;
    let per_token = params.num_kv_heads * d4;
    if u >= params.num_tokens * per_token {
        return;
    }
    let tok = u / per_token;
    let rem = u % per_token;
    let h = rem / d4;
    let c = rem % d4;
    let s = slots[tok];
    if s.y != 0 {
        return;
    }
    let slot = bitcast<u32>(s.x);
    let blk = slot / params.block_size;
    let off = slot % params.block_size;
    let src = (tok * params.num_kv_heads + h) * params.head_size + c * 4u;
    let dst = kv_addr(blk, off * params.tok_stride + h * params.head_stride + c * 4u);
    cache_store4(dst, key_load4(src), params.k_scale);
    cache_store4(kb_add(dst, params.kv_stride), value_load4(src), params.v_scale);
}
