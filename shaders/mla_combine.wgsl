// mla_combine.wgsl — merges the split partials of mla_decode.wgsl (flash-decoding): for each
// (token, head) row, with split i holding its normalised output o_i and LSE λ_i over its
// keys (λ_i = −inf for a split in which the row saw no key),
//   M = max λ_i,  w_i = exp(λ_i − M),  out = Σ w_i·o_i / Σ w_i,  LSE = M + ln Σ w_i.
// Splits with λ_i = −inf are skipped by selection (their o_i is never read), so the merge
// does not depend on what a partial of an empty split holds.
//
// Work: one thread per (row, vec4 column of the L values), WG per workgroup, workgroups
// spread over x (≤ 65535) and z. Every row saw at least one key in some split (its own
// position), so Σ w_i ≥ 1.
//
// Specialisation (generated header): WG, L4 (vec4 columns of a row), `part_load4` (f32) and
// `out_store4` for the output dtype.
//
// Layout: part [splits][rows][L] f32, part_lse [splits][rows] f32 (row = token·num_heads +
// head); out [tokens][num_heads][L]; lse [num_heads][tokens] f32.
// Bounds: threads past rows·L4 return; splits ≤ the planes the host allocated.

struct Params {
    num_tokens: u32,
    num_heads: u32,
    num_splits: u32,
    write_lse: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> part_lse: array<f32>;
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let u = flat_group(wid, nwg) * WG + t;
    let rows = params.num_tokens * params.num_heads;
    if u >= rows * L4 {
        return;
    }
    let row = u / L4;
    let c = u % L4;
    var mx = NO_MAX;
    for (var s = 0u; s < params.num_splits; s = s + 1u) {
        let v = part_lse[s * rows + row];
        if v > NO_MAX {
            mx = max(mx, v);
        }
    }
    var sum = 0.0;
    var acc = vec4<f32>(0.0);
    for (var s = 0u; s < params.num_splits; s = s + 1u) {
        let v = part_lse[s * rows + row];
        if v > NO_MAX {
            let w = exp(v - mx);
            sum = sum + w;
            acc = acc + w * part_load4(((s * rows + row) * L4 + c) * 4u);
        }
    }
    out_store4((row * L4 + c) * 4u, acc / sum);
    if c == 0u && params.write_lse != 0u {
        let h = row % params.num_heads;
        let tok = row / params.num_heads;
        lse[h * params.num_tokens + tok] = mx + log(sum);
    }
}
