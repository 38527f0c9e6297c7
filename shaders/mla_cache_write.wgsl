// mla_cache_write.wgsl — writes each new token's latent [kv_c | k_pe] into its slot of the
// MLA latent cache (vLLM's concat_and_cache_mla).
//
// For token t with slot s = slot_mapping[t] (i64, read as (low, high) words): s < 0
// (PAD_SLOT_ID; its high word is not 0) writes nothing;
// otherwise vec4 column c of its latent (kv_c[t] for c < L4, then k_pe[t]) goes to column c
// of cache row s (block s / block_size, offset s % block_size of the cache's [blocks]
// [block_size][D], addressed by the generated `kv_addr`: one buffer, or the chunk holding
// the block), converted by `cache_store4` (fp8: x / scale,
// correctly rounded, RNE, saturated — bit for bit src/fp8.rs; 16-bit formats: RNE; the same
// dtype: an exact copy).
//
// Specialisation (generated header): WG, `kv_c_load4` / `k_pe_load4` for the activation
// dtype, `cache_store4` for the cache dtype. The latent sizes are run-time parameters
// (multiples of 4), so one pipeline per dtype pairing serves every layer.
//
// Work: one thread per (token, vec4 column), WG per workgroup, workgroups spread over x
// (≤ 65535) and z.
//
// Layout: kv_c [tokens][L], k_pe [tokens][R]; slots i64 as (low, high) i32 pairs; cache
// [blocks][block_size][L + R].
// Bounds: slots were validated against blocks × block_size (≤ u32::MAX: the impl refuses a
// larger cache) on the host, so a slot is its low word as a u32; tokens <
// num_tokens ≤ rows of kv_c and k_pe.

struct Params {
    num_tokens: u32,
    l4: u32,
    r4: u32,
    scale: f32,
    block_size: u32,
    // Elements per block (block_size · D).
    block_stride: u32,
    // Blocks per chunk of a cache stored in chunks; unused for one buffer.
    blocks_per_window: u32,
    pad0: u32,
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
    let d4 = params.l4 + params.r4;
    if u >= params.num_tokens * d4 {
        return;
    }
    let tok = u / d4;
    let c = u % d4;
    let s = slots[tok];
    if s.y != 0 {
        return;
    }
    var v: vec4<f32>;
    if c < params.l4 {
        v = kv_c_load4((tok * params.l4 + c) * 4u);
    } else {
        v = k_pe_load4((tok * params.r4 + c - params.l4) * 4u);
    }
    let slot = bitcast<u32>(s.x);
    let at = kv_addr(slot / params.block_size, ((slot % params.block_size) * d4 + c) * 4u);
    cache_store4(at, v, params.scale);
}
