// model_ops_rope.wgsl — rotary position embedding in place.
//
// Algorithm: one thread per (token, head, pair i), i < d/2. The pair is (2i, 2i+1) when
// INTERLEAVED, else (i, i + d/2). inv_freq = pow(base, −2i/d) and angle = f32(pos)·inv_freq,
// both in f32 (the CPU reference works in f64: positions in the thousands differ by ~1e-4
// rad from the rounding of the product). The angle is reduced to [−π, π] before sin / cos
// (Cody–Waite: k = round(a / 2π), r = a − k·HI − k·LO with fma, HI = 6.28125 exact in 8
// bits), because GPU sin/cos are accurate only near the origin (Vulkan guarantees them on
// [−π, π]; model_ops_common.wgsl's rope_cos_sin); then (x0, x1) ← (x0·cos − x1·sin,
// x0·sin + x1·cos).
//
// Specialisation (generated header): WG, INTERLEAVED (bool).
//
// Layout: x [T, heads, d] f32 row-major, read and written; positions [T] i32; Params.half
// = d / 2 (d even). A negative position is rotated by its (negative) angle — the CPU kernel
// rejects it; no memory depends on it.
// Bounds relied on (host checks): T·heads·d < 2^32 elements (x fits one binding), d > 0;
// workgroups spread over x and z, threads past T·heads·half return.

struct Params {
    num_tokens: u32,
    num_heads: u32,
    half: u32,
    base: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> positions: array<i32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

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
    let e = th * d;
    var ia = e + i;
    var ib = e + i + half;
    if INTERLEAVED {
        ia = e + 2u * i;
        ib = ia + 1u;
    }
    let x0 = x[ia];
    let x1 = x[ib];
    x[ia] = x0 * c - x1 * s;
    x[ib] = x0 * s + x1 * c;
}
