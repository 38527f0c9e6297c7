// model_ops_sample.wgsl — choosing tokens on the device: out[r] = row r's greedy token
// (argmax) or, with SAMPLING, a temperature / top-p draw (src/compute/mod.rs `sample`; the
// exact rule, in f64, is src/compute/cpu.rs `sample_row`).
//
// Algorithm: one workgroup per row.
//   Argmax: each thread keeps the best (value, index) of the columns lid, lid + WG, ...;
//   the WG candidates are combined by a tree reduction in workgroup memory (log2 WG halving
//   steps, a barrier after each). "Better" is a larger value, or an equal value at a lower
//   index. NaN is never better (ordered comparisons with it are false) and −∞ is no
//   candidate, so a row with nothing above −∞ keeps the start candidate (−∞, 0xffffffff)
//   and gives 0: the host's rule (src/compute/cpu.rs argmax_row), so greedy tokens agree
//   on every device.
//   Sampling (rows whose temperature T > 0 and whose maximum m, the argmax's value, is
//   finite; the others take the argmax): p = exp((x − m) / T), 0 for NaN and −∞, so every
//   p lies in [0, 1] and the bit patterns of non-negative f32 order as their values.
//   1. total = Σ p, as a tree sum of per-thread strided sums.
//   2. The nucleus threshold: the largest bit pattern t with S(t) = Σ_{p ≥ t} p ≥
//      top_p · total, by bisection over [0, bits(1.0) + 1) — 30 halvings, each a pass over
//      the row summed exactly as step 1 is (so S(0) is the total bit for bit). Skipped when
//      top_p ≥ 1 (or NaN): everything is kept.
//   3. The draw: target = u · K (K the kept mass). Thread i owns the contiguous columns
//      [i·C, (i+1)·C), C = ceil(V / WG); thread 0 adds the threads' kept masses in order (a
//      serial scan: every prefix is the previous one plus a non-negative mass, so the
//      prefixes never decrease and thread i's interval [prefix(i−1), prefix(i)) starts where
//      thread i−1's ends, the same f32 word), so exactly one interval holds a target below
//      the total, and that thread walks its columns in order to the first whose running
//      mass exceeds it. A target past the scanned total (rounding) takes the row's last
//      kept column.
//   The threshold, the total and the scan are workgroup-wide values every thread reads
//   after a barrier, so all threads take the same branches.
//
// Specialisation (generated header): WG (a power of two), SAMPLING (bool); V / VT unused
// (scalar loads).
//
// Layout: x [T, V] f32 row-major; rows [T] vec4<f32> (temperature, top_p, uniform, unused;
// read only with SAMPLING, which the host binds); out [T] i32.
// Bounds relied on (host checks): T·V < 2^32 elements (x fits one binding), V ≤ i32::MAX;
// workgroup flat_group(...) is row T's index, rows ≥ T return at once (a uniform branch, so
// the barriers stay in uniform control flow). Every column read is < V.

struct Params {
    num_rows: u32,
    v: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> rows: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<i32>;

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;
// Row-wide values published by thread 0: whether the row samples, its top_p (read back with
// workgroupUniformLoad, so branches on them are uniform), and the picked column + 1 (0: none
// yet).
var<workgroup> go_s: u32;
var<workgroup> top_p_s: f32;
var<workgroup> pick_s: u32;

const NONE: u32 = 0xffffffffu;
const NEG_INF_BITS: u32 = 0xff800000u;
// bits(1.0) + 1: no p reaches it, so S(HI) = 0.
const HI: u32 = 0x3f800001u;
// The largest f32 below 1.
const BELOW_ONE: f32 = 0.99999994;

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

// Tree sum of every thread's `a` (call from uniform control flow; red_v is free after).
fn wg_sum(lid: u32, a: f32) -> f32 {
    red_v[lid] = a;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride >> 1u) {
        if lid < stride {
            red_v[lid] = red_v[lid] + red_v[lid + stride];
        }
        workgroupBarrier();
    }
    let s = red_v[0];
    workgroupBarrier();
    return s;
}

// p of one logit: exp((v − m) / temp), 0 for −∞ and NaN (the comparison is false for both).
// A division, not a product with 1 / temp: a temperature so small that its reciprocal is
// +∞ would turn the maximum's 0 · ∞ into NaN.
fn prob(v: f32, m: f32, temp: f32) -> f32 {
    return select(0.0, exp((v - m) / temp), v > bitcast<f32>(NEG_INF_BITS));
}

// Σ p over this thread's strided columns, of those p ≥ t.
fn strided_mass(lid: u32, base: u32, m: f32, temp: f32, t: f32) -> f32 {
    var s = 0.0;
    for (var c = lid; c < params.v; c += WG) {
        let p = prob(x[base + c], m, temp);
        if p >= t {
            s = s + p;
        }
    }
    return s;
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
    let neg_inf = bitcast<f32>(NEG_INF_BITS);
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
    let m = red_v[0];
    let greedy = select(i32(red_i[0]), 0, red_i[0] == NONE);
    if !SAMPLING {
        if lid == 0u {
            out[row] = greedy;
        }
        return;
    }
    let s = rows[row];
    if lid == 0u {
        // m > −∞ and m < +∞ (NaN never reaches m).
        go_s = select(0u, 1u, s.x > 0.0 && m > neg_inf && m < bitcast<f32>(0x7f800000u));
        top_p_s = s.y;
        pick_s = 0u;
    }
    if workgroupUniformLoad(&go_s) == 0u {
        if lid == 0u {
            out[row] = greedy;
        }
        return;
    }
    let top_p = workgroupUniformLoad(&top_p_s);
    let temp = s.x;

    // 1–2. The total and the nucleus threshold (bit pattern `lo`, kept mass `kept`).
    let total = wg_sum(lid, strided_mass(lid, base, m, temp, 0.0));
    var lo = 0u;
    var kept = total;
    if top_p < 1.0 {
        let goal = top_p * total;
        var hi = HI;
        for (var it = 0u; it < 30u; it = it + 1u) {
            let mid = lo + (hi - lo) / 2u;
            let mass = wg_sum(lid, strided_mass(lid, base, m, temp, bitcast<f32>(mid)));
            if mass >= goal {
                lo = mid;
                kept = mass;
            } else {
                hi = mid;
            }
        }
    }
    let t = bitcast<f32>(lo);

    // 3. The draw over contiguous column ranges.
    let chunk = (params.v + WG - 1u) / WG;
    let c0 = min(lid * chunk, params.v);
    let c1 = min(c0 + chunk, params.v);
    var own = 0.0;
    var last = 0u;
    for (var c = c0; c < c1; c = c + 1u) {
        let p = prob(x[base + c], m, temp);
        if p >= t && p > 0.0 {
            own = own + p;
            last = c + 1u;
        }
    }
    red_v[lid] = own;
    red_i[lid] = last;
    workgroupBarrier();
    // Inclusive serial scan of the kept masses by thread 0; red_i ends as the running max of
    // last + 1, so red_i[WG − 1] is the row's last kept column + 1.
    if lid == 0u {
        for (var i = 1u; i < WG; i = i + 1u) {
            red_v[i] = red_v[i - 1u] + red_v[i];
            red_i[i] = max(red_i[i - 1u], red_i[i]);
        }
    }
    workgroupBarrier();
    let u = select(0.0, min(s.z, BELOW_ONE), s.z >= 0.0);
    let goal_mass = u * kept;
    let after = red_v[lid];
    var before = 0.0;
    if lid > 0u {
        before = red_v[lid - 1u];
    }
    if own > 0.0 && before <= goal_mass && goal_mass < after {
        var acc = before;
        var pick = last;
        for (var c = c0; c < c1; c = c + 1u) {
            let p = prob(x[base + c], m, temp);
            if p >= t && p > 0.0 {
                acc = acc + p;
                if acc > goal_mass {
                    pick = c + 1u;
                    break;
                }
            }
        }
        pick_s = pick;
    }
    workgroupBarrier();
    if lid == 0u {
        let pick = select(pick_s, red_i[WG - 1u], pick_s == 0u);
        out[row] = select(i32(pick) - 1, greedy, pick == 0u);
    }
}
