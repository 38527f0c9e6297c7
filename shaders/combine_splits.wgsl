// combine_splits.wgsl — merges the split-KV partials of paged_attention.wgsl (flash-
// decoding): for each (token, query head) of a split request, with partial i holding the
// unnormalised accumulator acc_i, running max m_i and denominator l_i over its key range:
//   M = max_i m_i,  L = Σ l_i·exp(m_i − M),  out = Σ acc_i·exp(m_i − M) / L,
//   LSE = M + ln L   (natural log; out = 0 and LSE = −inf when L = 0: no key, no sink).
// The sink logit was added by exactly one partial (split 0), so it counts once.
//
// Specialisation (generated header): WG and `out_store4` for the output dtype. The head
// size D and the rows of a decode tile (BMD) are run-time parameters.
//
// Work: workgroup (x + z·65535, y) merges group x+z·65535 for query head y; a group is 4 u32:
// first batch token, number of tokens, first partial slot, number of splits. Threads stride
// over the group's tokens × D4 columns.
//
// Layout: scratch partial row of (slot, kv_head, r) at ((slot·Hkv + kv_head)·BMD + r)·D4
// vec4, its (m, l) at ml_offset + that row; r = i·g + head % g for token i of the group.
// out [tokens, H, D]; lse [H, num_tokens] f32 bits.
// Bounds: groups and slots come from the host plan that sized `scratch`; i < n_tok.

struct Params {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    group: u32,
    num_groups: u32,
    ml_offset: u32,
    write_lse: u32,
    head_size: u32,
    decode_rows: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> scratch: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> groups: array<u32>;
@group(0) @binding(4) var<storage, read_write> lse: array<u32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let gi = flat_group(wid, nwg);
    if gi >= params.num_groups {
        return;
    }
    let head = wid.y;
    let g = params.group;
    let kv_head = head / g;
    let tok_start = groups[gi * 4u];
    let n_tok = groups[gi * 4u + 1u];
    let split_base = groups[gi * 4u + 2u];
    let n_splits = groups[gi * 4u + 3u];
    let D = params.head_size;
    let D4 = D / 4u;
    let BMD = params.decode_rows;
    for (var u = t; u < n_tok * D4; u = u + WG) {
        let i = u / D4;
        let c = u % D4;
        let r = i * g + head % g;
        var mx = NO_MAX;
        for (var s = 0u; s < n_splits; s = s + 1u) {
            let prow = ((split_base + s) * params.num_kv_heads + kv_head) * BMD + r;
            mx = max(mx, scratch[params.ml_offset + prow].x);
        }
        var l = 0.0;
        var o = vec4<f32>(0.0);
        for (var s = 0u; s < n_splits; s = s + 1u) {
            let prow = ((split_base + s) * params.num_kv_heads + kv_head) * BMD + r;
            let ml = scratch[params.ml_offset + prow];
            let wgt = exp(ml.x - mx);
            l = l + ml.y * wgt;
            o = o + scratch[prow * D4 + c] * wgt;
        }
        let tok = tok_start + i;
        var res = vec4<f32>(0.0);
        if l > 0.0 {
            res = o / l;
        }
        out_store4((tok * params.num_heads + head) * D + c * 4u, res);
        if c == 0u && params.write_lse != 0u {
            var bits = NEG_INF_BITS;
            if l > 0.0 {
                bits = bitcast<u32>(mx + log(l));
            }
            lse[head * params.num_tokens + tok] = bits;
        }
    }
}
