// model_ops_rope_split.wgsl — one output of a fused Q/K/V projection: heads
// [src_head, src_head + num_heads) of each token's row of `qkv`, rotated by RoPE (query and
// key heads, ROTATE = true) or copied (value heads), into `out`.
//
// Algorithm: one thread per (token, head, pair i), i < d/2, with the arithmetic of
// model_ops_rope.wgsl (so a split-and-rotated head equals a copied head rotated in place by
// that kernel, bit for bit): pair (2i, 2i+1) when INTERLEAVED, else (i, i + d/2);
// inv_freq = pow(base, −2i/d), angle = f32(pos)·inv_freq reduced to [−π, π] (Cody–Waite)
// before sin / cos.
//
// Specialisation (generated header): WG, INTERLEAVED, ROTATE (bool).
//
// Layout: qkv [T, row_heads, d] f32 row-major; positions [T] i32; out [T, num_heads, d];
// Params.half = d / 2.
// Bounds relied on (host checks): src_head + num_heads ≤ row_heads; T·row_heads·d < 2^32
// elements (qkv fits one binding), d > 0; workgroups spread over x and z, threads past
// T·num_heads·half return.

struct Params {
    num_tokens: u32,
    num_heads: u32,
    half: u32,
    base: f32,
    src_head: u32,
    row_heads: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let u = flat_group(wid, nwg) * WG + lid;
    let half = params.half;
    if u >= params.num_tokens * params.num_heads * half {
        return;
    }
    let i = u % half;
    let th = u / half;
    let tok = th / params.num_heads;
    let d = 2u * half;
    let cs = rope_cos_sin(positions[tok], i, d, params.base);
    let c = cs.x;
    let s = cs.y;
    var ia = i;
    var ib = i + half;
    if INTERLEAVED {
        ia = 2u * i;
        ib = ia + 1u;
    }
    let head = th - tok * params.num_heads;
    let src = (tok * params.row_heads + params.src_head + head) * d;
    let to = th * d;
    let x0 = qkv[src + ia];
    let x1 = qkv[src + ib];
    if ROTATE {
        out[to + ia] = x0 * c - x1 * s;
        out[to + ib] = x0 * s + x1 * c;
    } else {
        out[to + ia] = x0;
        out[to + ib] = x1;
    }
}
