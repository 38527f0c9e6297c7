// merge_attn_states.wgsl — vLLM's merge_attn_states: combines two partial attention results
// over disjoint key sets. Per (token t, head h), natural-log LSEs:
//   an LSE of ±inf counts as an empty side (vLLM maps +inf to −inf);
//   m = max(lse_p, lse_s), a = exp(lse_p − m), b = exp(lse_s − m),
//   out = o_p·a/(a+b) + o_s·b/(a+b), out_lse = ln(a+b) + m;
//   both sides empty: out = 0, out_lse = −inf (the CPU backend's choice; vLLM gives NaN);
//   a side that is empty or whose weight is 0 is excluded by selection: its output row is
//   not read (or its product is not added), so NaN / inf there cannot reach the result;
//   tokens t ≥ prefill_tokens_with_context copy the suffix.
// Computed in f32 like the CPU kernel (src/backends/cpu/kernels/merge_states.rs).
//
// Specialisation (generated header): WG, `po_load4`, `so_load4`, `out_store4` for the
// activation dtype. The head size is a run-time parameter (a multiple of 4).
//
// Work: one thread per (token, head, vec4 column), workgroups spread over x and z.
// Layout: outputs [T, H, D]; LSEs [H, T] as f32 bits.
// Bounds: T, H, D checked against every tensor's shape on the host.

struct Params {
    num_tokens: u32,
    num_heads: u32,
    head_size: u32,
    prefill_tokens: u32,
    write_lse: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> p_lse: array<u32>;
@group(0) @binding(4) var<storage, read> s_lse: array<u32>;
@group(0) @binding(6) var<storage, read_write> out_lse: array<u32>;

fn is_empty(bits: u32) -> bool {
    return (bits & 0x7fffffffu) == POS_INF_BITS;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let u = flat_group(wid, nwg) * WG + t;
    let d4 = params.head_size / 4u;
    let T = params.num_tokens;
    if u >= T * params.num_heads * d4 {
        return;
    }
    let row = u / d4;
    let c = u % d4;
    let tok = row / params.num_heads;
    let h = row % params.num_heads;
    let e = row * params.head_size + c * 4u;
    let li = h * T + tok;
    let lp = p_lse[li];
    let ls = s_lse[li];
    var o = vec4<f32>(0.0);
    var out_bits = NEG_INF_BITS;
    if tok >= params.prefill_tokens {
        o = so_load4(e);
        out_bits = ls;
    } else if is_empty(lp) && is_empty(ls) {
        o = vec4<f32>(0.0);
    } else if is_empty(lp) {
        // a = 0, b = 1: out = o_s (o_p is not read: an empty side's row may hold anything).
        o = so_load4(e);
        out_bits = ls;
    } else if is_empty(ls) {
        o = po_load4(e);
        out_bits = lp;
    } else {
        let fp = bitcast<f32>(lp);
        let fs = bitcast<f32>(ls);
        let m = max(fp, fs);
        let a = exp(fp - m);
        let b = exp(fs - m);
        let z = a + b;
        // A side whose weight underflowed to 0 is dropped by selection, not by a zero
        // product (0 · inf is NaN).
        let zero = vec4<f32>(0.0);
        o = select(zero, po_load4(e) * (a / z), a > 0.0)
            + select(zero, so_load4(e) * (b / z), b > 0.0);
        out_bits = bitcast<u32>(log(z) + m);
    }
    out_store4(e, o);
    if c == 0u && params.write_lse != 0u {
        out_lse[li] = out_bits;
    }
}
