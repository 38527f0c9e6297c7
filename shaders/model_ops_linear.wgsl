// model_ops_linear.wgsl — the linear layer p = x·Wᵀ for prefill row counts (T >
// GEMV_MAX_TOKENS), its input rows optionally RMS-normed first and its product written by
// one of the output steps of model_ops_linear_out.wgsl (stored, added, SwiGLU, RoPE split):
// a tiled GEMM in workgroup memory with register blocking.
//
// Algorithm: workgroup (x, y) computes the BM×BN tile of token rows [y·BM, +BM) and BN tile
// columns. It walks K in steps of BK: the step's BM rows of x and the BN weight rows behind
// the tile's columns are loaded cooperatively (consecutive threads read consecutive VT of
// one row: coalesced) and stored transposed in workgroup memory, [BK][BM] and [BK][BN],
// each row padded by one element so the transposing stores spread over the banks; after a
// barrier every thread accumulates its TM×TN = 4×4 outputs — rows ty + i·TY, columns
// tx + j·TX, so neighbouring threads own neighbouring columns and the final stores are
// coalesced — with one f32 FMA per (row, column, k): 8 workgroup-memory reads per 16 FMAs.
// A second barrier guards the tiles before the next step overwrites them.
// Tile columns. OUT_PLAIN: column c is weight row x·BN + c. Pair forms: the BN columns are
// PAIRS = BN / 2 row pairs, column c is member c / PAIRS of pair x·PAIRS + c % PAIRS, so the
// thread with columns tx + j·TX holds both members of pairs x·PAIRS + tx + j·TX (j < 2) in
// acc[i][j] and acc[i][j + 2] (TX = BN / 4 = PAIRS / 2), and neighbouring threads write
// neighbouring pairs. The weight row behind each of a thread's W loads is the same at every
// K step: looked up once (tile_row).
// NORM: the workgroup first sums the squares of its BM rows (ROW_THREADS = WG / BM = 4
// threads a row, strided columns; the four partials added pairwise in workgroup memory)
// into inv_s = 1 / sqrt(ss / K + eps), then scales each x element by inv_s[row] and the norm
// weight as it loads it.
//
// Specialisation (generated header): WG = (BM/4)·(BN/4) = 4·BM threads, BM, BN, BK, V / VT
// (V = 4: x, W and the norm weight are read as vec4, which needs K % 4 == 0; V = 1: as f32),
// NORM, OUT and the optional bindings (model_ops_linear_out.wgsl).
//
// Layout: model_ops_linear_out.wgsl's; Params.kv = K / V.
// Bounds: loads outside [0, T)×[0, K) and past the weight's rows or units read zeros and
// stores outside [0, T) or past the last unit are skipped, so any T, K, N work. Relied on
// (host checks): those of model_ops_linear_out.wgsl; ceil(units / (BN or PAIRS)) and
// ceil(T / BM) within the per-dimension dispatch limit.

const TX: u32 = BN / 4u;
const TY: u32 = BM / 4u;
const STEP: u32 = BK / V;
const A_ROW: u32 = BM + 1u;
const B_ROW: u32 = BN + 1u;
const A_LOADS: u32 = BM * STEP / WG;
const B_LOADS: u32 = BN * STEP / WG;
const ROW_THREADS: u32 = WG / BM;
const PAIRS: u32 = BN / 2u;
// The weight row of a tile column past the matrix: its loads read zeros.
const NO_ROW: u32 = 0xffffffffu;

var<workgroup> a_s: array<f32, BK * A_ROW>;
var<workgroup> b_s: array<f32, BK * B_ROW>;
var<workgroup> sq_s: array<f32, WG>;
var<workgroup> inv_s: array<f32, BM>;

// The weight row behind tile column c of column tile tx0, or NO_ROW.
fn tile_row(tx0: u32, c: u32) -> u32 {
    if OUT == OUT_PLAIN {
        let r = tx0 * BN + c;
        return select(NO_ROW, r, r < params.n);
    }
    let u = tx0 * PAIRS + c % PAIRS;
    if u >= num_units() {
        return NO_ROW;
    }
    return unit_row(u, c / PAIRS);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let m0 = wid.y * BM;
    let tx = lid % TX;
    let ty = lid / TX;
    let kv = params.kv;
    if NORM {
        let r = lid / ROW_THREADS;
        let q = lid % ROW_THREADS;
        var s = 0.0;
        if m0 + r < params.num_tokens {
            let base = (m0 + r) * kv;
            for (var c = q; c < kv; c += ROW_THREADS) {
                let v = x[base + c];
                s += vdot(v, v);
            }
        }
        sq_s[lid] = s;
        workgroupBarrier();
        if q == 0u {
            let ss = (sq_s[lid] + sq_s[lid + 1u]) + (sq_s[lid + 2u] + sq_s[lid + 3u]);
            inv_s[r] = 1.0 / sqrt(ss / f32(kv * V) + params.eps);
        }
        workgroupBarrier();
    }
    var brow: array<u32, B_LOADS>;
    for (var l = 0u; l < B_LOADS; l++) {
        brow[l] = tile_row(wid.x, (lid + l * WG) / STEP);
    }
    // acc[i][j]: row m0 + ty + i·TY, tile column tx + j·TX (zero-initialised).
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < kv; k0 += STEP) {
        for (var l = 0u; l < A_LOADS; l++) {
            let e = lid + l * WG;
            let r = e / STEP;
            let c = e % STEP;
            let m = m0 + r;
            let k = k0 + c;
            var v = VT(0.0);
            if m < params.num_tokens && k < kv {
                v = x[m * kv + k];
                if NORM {
                    v = v * inv_s[r] * norm_w[k];
                }
            }
            for (var j = 0u; j < V; j++) {
                a_s[(c * V + j) * A_ROW + r] = lane(v, j);
            }
        }
        for (var l = 0u; l < B_LOADS; l++) {
            let e = lid + l * WG;
            let r = e / STEP;
            let c = e % STEP;
            let row = brow[l];
            let k = k0 + c;
            var v = VT(0.0);
            if row != NO_ROW && k < kv {
                v = wload(row * kv + k);
            }
            for (var j = 0u; j < V; j++) {
                b_s[(c * V + j) * B_ROW + r] = lane(v, j);
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let ar = kk * A_ROW + ty;
            let br = kk * B_ROW + tx;
            let a = vec4<f32>(a_s[ar], a_s[ar + TY], a_s[ar + 2u * TY], a_s[ar + 3u * TY]);
            let b = vec4<f32>(b_s[br], b_s[br + TX], b_s[br + 2u * TX], b_s[br + 3u * TX]);
            acc[0] = fma(vec4<f32>(a.x), b, acc[0]);
            acc[1] = fma(vec4<f32>(a.y), b, acc[1]);
            acc[2] = fma(vec4<f32>(a.z), b, acc[2]);
            acc[3] = fma(vec4<f32>(a.w), b, acc[3]);
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let m = m0 + ty + i * TY;
        if m >= params.num_tokens {
            break;
        }
        if OUT == OUT_PLAIN {
            for (var j = 0u; j < 4u; j++) {
                let r = wid.x * BN + tx + j * TX;
                if r < params.n {
                    put(m, r, acc[i][j]);
                }
            }
        } else {
            for (var j = 0u; j < 2u; j++) {
                let u = wid.x * PAIRS + tx + j * TX;
                if u < num_units() {
                    put_pair(m, u, acc[i][j], acc[i][j + 2u]);
                }
            }
        }
    }
}
