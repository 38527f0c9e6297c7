// mla_gather.wgsl — one chunk of the MLA prefill's latents as f32 rows (the input of the
// kv_b_proj expansion and the rope keys of mla_prefill.wgsl).
//
// Prefill request i (workgroup row y) holds positions [chunk_lo, min(chunk_lo + chunk,
// seq_len)) of this chunk; position chunk_lo + r lands at row starts[i] + r of `lat`: its
// first L dims in the kv_c region (rows × L4 vec4, dense: the GEMM's input), its last R in
// the rope region (from pe_off). A position before the request's new tokens (pos < ctx =
// seq_len − q_len) is read from the cache through the block table (fp8 times k_scale); a
// new token's from its own kv_c / k_pe row (prefill token q_start + pos − ctx).
//
// Specialisation (generated header): WG, `kv_c_load4` / `k_pe_load4` for the activation
// dtype, `cache_load4` for the cache dtype. Sizes are run-time parameters.
//
// Work: threads of the workgroups of row y stride over (row, vec4 column) of request y's
// positions, WG per workgroup.
//
// Layout: kv_c [Tp][L], k_pe [Tp][R] (the prefill tokens); cache [blocks][block_size][L + R]
// (one buffer, or chunks of whole blocks: the generated `kv_addr`);
// block_table [reqs][bt_stride] i32; plan: per prefill request (q_start, q_len, seq_len,
// batch request) i32 ×4, then per chunk the n + 1 row starts (from starts_off); lat f32 vec4.
// Bounds relied on (host side): validated metadata (block ids of positions < seq_len within
// the cache, q_len ≤ seq_len); starts[i + 1] − starts[i] = clamp(seq_len − chunk_lo, 0,
// chunk); lat holds starts[n] rows in both regions.

struct Params {
    chunk_lo: u32,
    starts_off: u32,
    block_size: u32,
    bt_stride: u32,
    l4: u32,
    r4: u32,
    pe_off: u32,
    k_scale: f32,
    // Elements per cache block (block_size · D).
    block_stride: u32,
    // Blocks per chunk of a cache stored in chunks; unused for one buffer.
    blocks_per_window: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> block_table: array<i32>;
@group(0) @binding(5) var<storage, read> plan: array<i32>;
@group(0) @binding(6) var<storage, read_write> lat: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = wid.y;
    let q_start = u32(plan[i * 4u]);
    let q_len = u32(plan[i * 4u + 1u]);
    let seq = u32(plan[i * 4u + 2u]);
    let req = u32(plan[i * 4u + 3u]);
    let row0 = u32(plan[params.starts_off + i]);
    let n = u32(plan[params.starts_off + i + 1u]) - row0;
    let d4 = params.l4 + params.r4;
    let ctx = seq - q_len;
    for (var u = wid.x * WG + t; u < n * d4; u = u + WG * nwg.x) {
        let r = u / d4;
        let c = u % d4;
        let pos = params.chunk_lo + r;
        var v: vec4<f32>;
        if pos < ctx {
            let blk = u32(block_table[req * params.bt_stride + pos / params.block_size]);
            let at = kv_addr(blk, ((pos % params.block_size) * d4 + c) * 4u);
            v = cache_load4(at) * params.k_scale;
        } else {
            let tok = q_start + pos - ctx;
            if c < params.l4 {
                v = kv_c_load4((tok * params.l4 + c) * 4u);
            } else {
                v = k_pe_load4((tok * params.r4 + c - params.l4) * 4u);
            }
        }
        let row = row0 + r;
        if c < params.l4 {
            lat[row * params.l4 + c] = v;
        } else {
            lat[params.pe_off + row * params.r4 + c - params.l4] = v;
        }
    }
}
