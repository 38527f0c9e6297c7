// model_ops_gemv.wgsl — y = x·Wᵀ (or y += x·Wᵀ) for decode row counts (T ≤ 4·TOK4 ≤ 16):
// memory-bound, so the weight is read exactly once, coalesced.
//
// Algorithm: the workgroup's WG threads form GROUPS = WG / LANES groups of LANES
// consecutive threads (a hardware warp / subgroup on the GPUs we target, without relying on
// subgroup operations); group g reduces output feature f = flat_group·GROUPS + g over K:
// lane l reads the VT columns l, l + LANES, ... of W's row f (LANES consecutive vectors per
// step: one coalesced 512-byte read when V = 4) and the same columns of the T rows of x
// (shared by every group: they stay in cache), and accumulates one partial dot product per
// token: token 4j + q in component q of acc[j]. The LANES partials of a group are then added
// by a tree reduction in workgroup memory (log2 LANES halving steps, TOK4 vectors per lane)
// and lane 0 writes y[t][f] for t < T.
//
// Specialisation (generated header): WG, LANES (a power of two dividing WG), V / VT (V = 4
// needs K % 4 == 0), TOK4 (1, 2 or 4: the narrowest that holds T; a wider one keeps more
// accumulators live for nothing).
//
// Layout: x [T, K], W [N, K], y [T, N], f32 row-major; Params.kv = K / V.
// Bounds relied on (host checks): 1 ≤ T ≤ 4·TOK4; N·K, T·N < 2^32 elements (each tensor
// fits one binding); workgroups spread over x and z, features ≥ N read and write nothing
// (their threads still take part in the barriers).

struct Params {
    num_tokens: u32,
    n: u32,
    kv: u32,
    // 1: y += x·Wᵀ (each output read once, by the thread that writes it); 0: y = x·Wᵀ.
    accumulate: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<VT>;
@group(0) @binding(2) var<storage, read> w: array<VT>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const GROUPS: u32 = WG / LANES;

// Writes (or, with params.accumulate, adds) one output element.
fn put(at: u32, v: f32) {
    if params.accumulate != 0u {
        y[at] = y[at] + v;
    } else {
        y[at] = v;
    }
}

var<workgroup> red: array<vec4<f32>, WG * TOK4>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let g = lid / LANES;
    let l = lid % LANES;
    let f = flat_group(wid, nwg) * GROUPS + g;
    let kv = params.kv;
    let t = params.num_tokens;
    // acc[j][q]: token 4j + q's partial dot product.
    var acc: array<vec4<f32>, TOK4>;
    for (var j = 0u; j < TOK4; j++) {
        acc[j] = vec4<f32>(0.0);
    }
    if f < params.n {
        let row = f * kv;
        for (var c = l; c < kv; c += LANES) {
            let wv = w[row + c];
            for (var j = 0u; j < TOK4; j++) {
                let t0 = 4u * j;
                if t0 < t {
                    acc[j].x += vdot(x[t0 * kv + c], wv);
                }
                if t0 + 1u < t {
                    acc[j].y += vdot(x[(t0 + 1u) * kv + c], wv);
                }
                if t0 + 2u < t {
                    acc[j].z += vdot(x[(t0 + 2u) * kv + c], wv);
                }
                if t0 + 3u < t {
                    acc[j].w += vdot(x[(t0 + 3u) * kv + c], wv);
                }
            }
        }
    }
    for (var j = 0u; j < TOK4; j++) {
        red[lid * TOK4 + j] = acc[j];
    }
    workgroupBarrier();
    for (var stride = LANES / 2u; stride > 0u; stride = stride >> 1u) {
        if l < stride {
            for (var j = 0u; j < TOK4; j++) {
                red[lid * TOK4 + j] = red[lid * TOK4 + j] + red[(lid + stride) * TOK4 + j];
            }
        }
        workgroupBarrier();
    }
    if l == 0u && f < params.n {
        for (var j = 0u; j < TOK4; j++) {
            let s = red[lid * TOK4 + j];
            let t0 = 4u * j;
            if t0 < t {
                put(t0 * params.n + f, s.x);
            }
            if t0 + 1u < t {
                put((t0 + 1u) * params.n + f, s.y);
            }
            if t0 + 2u < t {
                put((t0 + 2u) * params.n + f, s.z);
            }
            if t0 + 3u < t {
                put((t0 + 3u) * params.n + f, s.w);
            }
        }
    }
}
