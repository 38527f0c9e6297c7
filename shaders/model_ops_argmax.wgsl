// model_ops_argmax.wgsl — greedy sampling on the device: out[r] = the index of row r's
// largest element.
//
// Algorithm: one workgroup per row. Each thread keeps the best (value, index) of the columns
// lid, lid + WG, ...; the WG candidates are combined by a tree reduction in workgroup memory
// (log2 WG halving steps, a barrier after each). "Better" is a larger value, or an equal
// value at a lower index. NaN is never better (ordered comparisons with it are false) and
// −∞ is no candidate, so a row with nothing above −∞ keeps the start candidate
// (−∞, 0xffffffff) and gives 0: the host's rule (src/compute/cpu.rs argmax_row), so greedy
// tokens agree on every device.
//
// Specialisation (generated header): WG (a power of two); V / VT unused (scalar loads).
//
// Layout: x [T, V] f32 row-major; out [T] i32.
// Bounds relied on (host checks): T·V < 2^32 elements (x fits one binding), V ≤ i32::MAX;
// workgroup flat_group(...) is row T's index, rows ≥ T return at once (a uniform branch, so
// the barriers stay in uniform control flow).

struct Params {
    num_rows: u32,
    v: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<i32>;

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;

const NONE: u32 = 0xffffffffu;

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

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
    let neg_inf = bitcast<f32>(0xff800000u);
    let base = row * params.v;
    var bv = neg_inf;
    var bi = NONE;
    for (var c = lid; c < params.v; c += WG) {
        let v = x[base + c];
        if v > neg_inf && better(v, c, bv, bi) {
            bv = v;
            bi = c;
        }
    }
    red_v[lid] = bv;
    red_i[lid] = bi;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride >> 1u) {
        if lid < stride {
            let ov = red_v[lid + stride];
            let oi = red_i[lid + stride];
            if better(ov, oi, red_v[lid], red_i[lid]) {
                red_v[lid] = ov;
                red_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if lid == 0u {
        let i = red_i[0];
        out[row] = select(i32(i), 0, i == NONE);
    }
}
