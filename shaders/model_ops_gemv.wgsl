// model_ops_gemv.wgsl — the linear layer p = x·Wᵀ for decode row counts (T ≤ 4·TOK4 ≤ 16),
// its input rows optionally RMS-normed first and its product written by one of the output
// steps of model_ops_linear_out.wgsl (stored, added, SwiGLU, RoPE split): memory-bound, so
// the weight is read exactly once, coalesced.
//
// Algorithm: the workgroup's WG threads form GROUPS = WG / LANES groups of LANES
// consecutive threads (a hardware warp / subgroup on the GPUs we target, without relying on
// subgroup operations); group g computes output unit u = flat_group·GROUPS + g, whose ROWS
// weight rows are row u (OUT_PLAIN, ROWS = 1) or the two rows of pair u (the pair forms,
// ROWS = 2). Lane l reads the VT columns l, l + LANES, ... of the unit's rows (LANES
// consecutive vectors per step: one coalesced 512-byte read per row when V = 4) and the
// same columns of the T rows of x (shared by every group: they stay in cache), and
// accumulates one partial dot product per (row, token): row m's token 4j + q in component q
// of acc[m·TOK4 + j]. Each row's LANES partials are then added by a tree reduction in
// workgroup memory (log2 LANES halving steps, TOK4 vectors per lane; the rows one after the
// other, so the reduction space stays WG·TOK4 vectors ≤ 16 KiB), and lane 0 writes the
// unit's outputs for t < T (put / put_pair).
// NORM: first the whole workgroup sums each token row's squares (thread lid takes the
// columns lid, lid + WG, ...; a tree reduction over WG in the same workgroup memory), every
// thread forms inv = 1 / sqrt(ss / K + eps) for the T tokens, and the main loop uses
// h = x · inv · g in place of x. (One reduction for the workgroup, not one per group:
// without subgroup operations a group's reduction takes as many barriers, and the
// workgroup reads x once for it instead of GROUPS times.)
//
// Specialisation (generated header): WG, LANES (a power of two dividing WG), V / VT (V = 4
// needs K % 4 == 0), TOK4 (1, 2 or 4: the narrowest that holds T; a wider one keeps more
// accumulators live for nothing), ROWS, NORM, OUT and the optional bindings
// (model_ops_linear_out.wgsl).
//
// Layout: model_ops_linear_out.wgsl's; Params.kv = K / V.
// Bounds relied on (host checks): 1 ≤ T ≤ 4·TOK4; those of model_ops_linear_out.wgsl;
// workgroups spread over x and z, units ≥ num_units() read and write nothing (their threads
// still take part in the barriers).

const GROUPS: u32 = WG / LANES;

var<workgroup> red: array<vec4<f32>, WG * TOK4>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let g = lid / LANES;
    let l = lid % LANES;
    let u = flat_group(wid, nwg) * GROUPS + g;
    let kv = params.kv;
    let t = params.num_tokens;
    // inv[j][q]: token 4j + q's norm scale (NORM).
    var inv: array<vec4<f32>, TOK4>;
    if NORM {
        var ss: array<vec4<f32>, TOK4>;
        for (var c = lid; c < kv; c += WG) {
            for (var j = 0u; j < TOK4; j++) {
                for (var q = 0u; q < 4u; q++) {
                    let tq = 4u * j + q;
                    if tq < t {
                        let v = x[tq * kv + c];
                        ss[j][q] += vdot(v, v);
                    }
                }
            }
        }
        for (var j = 0u; j < TOK4; j++) {
            red[lid * TOK4 + j] = ss[j];
        }
        workgroupBarrier();
        for (var stride = WG / 2u; stride > 0u; stride = stride >> 1u) {
            if lid < stride {
                for (var j = 0u; j < TOK4; j++) {
                    red[lid * TOK4 + j] = red[lid * TOK4 + j] + red[(lid + stride) * TOK4 + j];
                }
            }
            workgroupBarrier();
        }
        let k = f32(kv * V);
        for (var j = 0u; j < TOK4; j++) {
            inv[j] = 1.0 / sqrt(red[j] / k + params.eps);
        }
        // Every thread has read the totals before the reduction below overwrites them.
        workgroupBarrier();
    }
    // acc[m·TOK4 + j][q]: row m's partial dot product for token 4j + q (zero-initialised).
    var acc: array<vec4<f32>, TOK4 * ROWS>;
    if u < num_units() {
        let w0 = unit_row(u, 0u) * kv;
        let w1 = unit_row(u, ROWS - 1u) * kv;
        for (var c = l; c < kv; c += LANES) {
            let a = wload(w0 + c);
            var b = a;
            var gc = VT(1.0);
            if ROWS == 2u {
                b = wload(w1 + c);
            }
            if NORM {
                gc = norm_w[c];
            }
            for (var j = 0u; j < TOK4; j++) {
                let t0 = 4u * j;
                if t0 < t {
                    var h = x[t0 * kv + c];
                    if NORM {
                        h = h * inv[j].x * gc;
                    }
                    acc[j].x += vdot(h, a);
                    if ROWS == 2u {
                        acc[TOK4 + j].x += vdot(h, b);
                    }
                }
                if t0 + 1u < t {
                    var h = x[(t0 + 1u) * kv + c];
                    if NORM {
                        h = h * inv[j].y * gc;
                    }
                    acc[j].y += vdot(h, a);
                    if ROWS == 2u {
                        acc[TOK4 + j].y += vdot(h, b);
                    }
                }
                if t0 + 2u < t {
                    var h = x[(t0 + 2u) * kv + c];
                    if NORM {
                        h = h * inv[j].z * gc;
                    }
                    acc[j].z += vdot(h, a);
                    if ROWS == 2u {
                        acc[TOK4 + j].z += vdot(h, b);
                    }
                }
                if t0 + 3u < t {
                    var h = x[(t0 + 3u) * kv + c];
                    if NORM {
                        h = h * inv[j].w * gc;
                    }
                    acc[j].w += vdot(h, a);
                    if ROWS == 2u {
                        acc[TOK4 + j].w += vdot(h, b);
                    }
                }
            }
        }
    }
    // sums[m·TOK4 + j]: the group's totals of row m (lane 0's are complete). A lane reads
    // back only its own slots, which nobody else writes, so the next row's stores need no
    // barrier of their own.
    var sums: array<vec4<f32>, TOK4 * ROWS>;
    for (var m = 0u; m < ROWS; m++) {
        for (var j = 0u; j < TOK4; j++) {
            red[lid * TOK4 + j] = acc[m * TOK4 + j];
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
        for (var j = 0u; j < TOK4; j++) {
            sums[m * TOK4 + j] = red[lid * TOK4 + j];
        }
    }
    if l == 0u && u < num_units() {
        for (var j = 0u; j < TOK4; j++) {
            for (var q = 0u; q < 4u; q++) {
                let tok = 4u * j + q;
                if tok < t {
                    if OUT == OUT_PLAIN {
                        put(tok, u, sums[j][q]);
                    } else {
                        put_pair(tok, u, sums[j][q], sums[TOK4 + j][q]);
                    }
                }
            }
        }
    }
}
