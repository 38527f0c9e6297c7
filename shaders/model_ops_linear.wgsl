// model_ops_linear.wgsl — y = x·Wᵀ (or y += x·Wᵀ) for prefill row counts (T > GEMV_MAX_TOKENS): a tiled
// GEMM in workgroup memory with register blocking.
//
// Algorithm: workgroup (x, y) computes the BM×BN output tile of rows [y·BM, +BM) and
// features [x·BN, +BN). It walks K in steps of BK: the step's BM rows of x and BN rows of W
// are loaded cooperatively (consecutive threads read consecutive VT of one row: coalesced)
// and stored transposed in workgroup memory, [BK][BM] and [BK][BN], each row padded by one
// element so the transposing stores spread over the banks; after a barrier every thread
// accumulates its TM×TN = 4×4 outputs — rows ty + i·TY, features tx + j·TX, so neighbouring
// threads own neighbouring features and the final stores are coalesced — with one f32 FMA
// per (row, feature, k): 8 workgroup-memory reads per 16 FMAs. A second barrier guards the
// tiles before the next step overwrites them.
//
// Specialisation (generated header): WG = (BM/4)·(BN/4) threads, BM, BN, BK, V / VT (V = 4:
// x and W are read as vec4, which needs K % 4 == 0; V = 1: as f32).
//
// Layout: x [T, K], W [N, K] (PyTorch's [out_features, in_features]), y [T, N], all f32
// row-major; Params.kv = K / V.
// Bounds: loads outside [0, T)×[0, K) and [0, N)×[0, K) read zeros and stores outside
// [0, T)×[0, N) are skipped, so any T, K, N work. Relied on (host checks): T·K, N·K, T·N <
// 2^32 elements (each tensor fits one binding); ceil(N / BN) and ceil(T / BM) within the
// per-dimension dispatch limit.

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

const TX: u32 = BN / 4u;
const TY: u32 = BM / 4u;
const STEP: u32 = BK / V;
const A_ROW: u32 = BM + 1u;
const B_ROW: u32 = BN + 1u;
const A_LOADS: u32 = BM * STEP / WG;
const B_LOADS: u32 = BN * STEP / WG;

var<workgroup> a_s: array<f32, BK * A_ROW>;
var<workgroup> b_s: array<f32, BK * B_ROW>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let m0 = wid.y * BM;
    let n0 = wid.x * BN;
    let tx = lid % TX;
    let ty = lid / TX;
    let kv = params.kv;
    // acc[i][j]: row m0 + ty + i·TY, feature n0 + tx + j·TX (zero-initialised).
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
            }
            for (var j = 0u; j < V; j++) {
                a_s[(c * V + j) * A_ROW + r] = lane(v, j);
            }
        }
        for (var l = 0u; l < B_LOADS; l++) {
            let e = lid + l * WG;
            let r = e / STEP;
            let c = e % STEP;
            let n = n0 + r;
            let k = k0 + c;
            var v = VT(0.0);
            if n < params.n && k < kv {
                v = w[n * kv + k];
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
        for (var j = 0u; j < 4u; j++) {
            let n = n0 + tx + j * TX;
            if n < params.n {
                let at = m * params.n + n;
                if params.accumulate != 0u {
                    y[at] = y[at] + acc[i][j];
                } else {
                    y[at] = acc[i][j];
                }
            }
        }
    }
}
