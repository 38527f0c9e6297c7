// model_ops_rms_norm.wgsl — RMSNorm: y = x / sqrt(mean(x²) + eps) · weight, per row.
//
// Algorithm: one workgroup per row. Each thread sums the squares of the VT columns
// lid, lid + WG, ... (vdot of a vector with itself); the WG partial sums are added by a tree
// reduction in workgroup memory (log2 WG halving steps, a barrier after each); every thread
// then reads the total, forms inv = 1 / sqrt(total / H + eps) and writes x · inv · weight
// (the CPU kernel's order of operations). f32 throughout.
//
// Specialisation (generated header): WG (a power of two), V / VT (V = 4 when H % 4 == 0).
//
// Layout: x, y [T, H] f32 row-major; weight [H]; Params.hv = H / V.
// Bounds relied on (host checks): T·H < 2^32 elements (the tensors fit one binding), H > 0;
// workgroup flat_group(...) is row T's index, rows ≥ T return at once (a uniform branch:
// the whole workgroup takes it, so the barriers stay in uniform control flow).

struct Params {
    num_rows: u32,
    hv: u32,
    h: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<VT>;
@group(0) @binding(2) var<storage, read> weight: array<VT>;
@group(0) @binding(3) var<storage, read_write> y: array<VT>;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let row = flat_group(wid, nwg);
    if row >= params.num_rows {
        return;
    }
    let base = row * params.hv;
    var s = 0.0;
    for (var c = lid; c < params.hv; c += WG) {
        let v = x[base + c];
        s += vdot(v, v);
    }
    red[lid] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride >> 1u) {
        if lid < stride {
            red[lid] = red[lid] + red[lid + stride];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(params.h) + params.eps);
    for (var c = lid; c < params.hv; c += WG) {
        y[base + c] = x[base + c] * inv * weight[c];
    }
}
