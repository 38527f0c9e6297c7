// mla_decode.wgsl — MLA decode in latent space (vLLM's forward_mqa): every query row is an
// absorbed D-wide query (kv_lora_rank + rope) attending over the request's cached latents,
// whose first L dims are also the values; one shared "KV head", so every row of a request
// reads the same latents.
//
// Algorithm: workgroup (x, y, z) runs rows [x·ROWS, +ROWS) of decode request y (row r: token
// r / num_heads of the request, head r % num_heads) over split z of its keys. Thread
// t = group·LANES + lane owns RPT rows (group·RPT ..) and keeps their query vec4 columns lane,
// lane + LANES, ... (< D4) in registers (times the score scale), and the accumulators of
// their value columns lane, lane + LANES, ... (< L4): each latent vec4 it loads from
// workgroup memory feeds RPT rows. Per step of KEYS keys (a step never crosses a block: KEYS
// divides the block size): the latents go to workgroup memory (dequantised to f32, only
// positions the split holds); every thread writes the partial dot products of its columns
// for the step's keys; the LANES partials of each (row, key) are summed into its score; each
// thread then runs its rows' online softmax over the step's scores (the LANES threads of a
// row compute the same maximum and denominator) and adds the weighted latents to their
// accumulators. 4 barriers per step. A row at token j sees positions [0, ctx + j] (ctx =
// seq_len − q_len); keys it does not see take no part, by selection (their latents are never
// multiplied in, so a NaN slot cannot leak).
//
// Output: SPLIT false — out (activation dtype) = acc / l · v_scale and, when write_lse,
// lse[h][token] = m + ln l (natural log). SPLIT true — out is the f32 partial plane z
// (acc / l · v_scale, zero for a row that saw no key) and lse the partial LSE (−inf for such
// a row), merged by mla_combine.wgsl.
//
// Specialisation (generated header): D4, L4 (vec4 columns of the latent and of the values),
// ROWS, RPT (rows per thread), LANES, WG = ROWS / RPT · LANES, KEYS, QV = ⌈D4 / LANES⌉, VV = ⌈L4 / LANES⌉, SPLIT;
// `q_load4`, `cache_load4` (raw elements; fp8 not scaled: k_scale is folded into scale and
// v_scale), `out_store4`.
//
// Layout: q [tokens][num_heads][D] (decode tokens first, q_len each: request y's token j is
// token y·q_len + j); cache [blocks][block_size][D]; block_table [reqs][bt_stride] i32;
// seq_lens [reqs] i32; out [tokens][num_heads][L] (SPLIT: f32 [splits][tokens·num_heads][L]);
// lse [num_heads][tokens] (SPLIT: [splits][tokens·num_heads]).
//
// Bounds relied on (host side): the metadata was validated (q_len ≤ seq_len, block ids of
// every position < seq_len within the cache); KEYS divides block_size; grid.x·ROWS ≥
// q_len·num_heads; every buffer fits one binding and every index fits u32.

struct Params {
    num_heads: u32,
    num_tokens: u32,
    block_size: u32,
    bt_stride: u32,
    num_splits: u32,
    q_len: u32,
    scale: f32,
    v_scale: f32,
    write_lse: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read> block_table: array<i32>;
@group(0) @binding(4) var<storage, read> seq_lens: array<i32>;
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;

var<workgroup> lat_s: array<vec4<f32>, KEYS * D4>;
var<workgroup> part_s: array<f32, ROWS * KEYS * LANES>;
var<workgroup> score_s: array<f32, ROWS * KEYS>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let req = wid.y;
    let nh = params.num_heads;
    let q_len = params.q_len;
    let rows = q_len * nh;
    let group = t / LANES;
    let lane = t % LANES;
    let seq = u32(seq_lens[req]);

    // The split's keys, in whole steps: [lo, hi).
    let steps = (seq + KEYS - 1u) / KEYS;
    let per = (steps + params.num_splits - 1u) / params.num_splits;
    let lo = min(wid.z * per, steps) * KEYS;
    let hi = min((wid.z + 1u) * per * KEYS, seq);

    // This thread's rows: live, global row (token·num_heads + head), keys seen [0, row_hi).
    var live: array<bool, RPT>;
    var grow: array<u32, RPT>;
    var row_hi: array<u32, RPT>;
    var q: array<array<vec4<f32>, QV>, RPT>;
    var acc: array<array<vec4<f32>, VV>, RPT>;
    var m: array<f32, RPT>;
    var l: array<f32, RPT>;
    // @unroll
    for (var u = 0u; u < RPT; u = u + 1u) {
        let r = wid.x * ROWS + group * RPT + u;
        live[u] = r < rows;
        let rc = min(r, rows - 1u);
        let j = rc / nh;
        grow[u] = (req * q_len + j) * nh + rc % nh;
        row_hi[u] = seq - q_len + j + 1u;
        m[u] = NO_MAX;
        l[u] = 0.0;
        // @unroll
        for (var i = 0u; i < QV; i = i + 1u) {
            let c = lane + i * LANES;
            var v = vec4<f32>(0.0);
            if live[u] && c < D4 {
                v = q_load4((grow[u] * D4 + c) * 4u) * params.scale;
            }
            q[u][i] = v;
        }
        // @unroll
        for (var i = 0u; i < VV; i = i + 1u) {
            acc[u][i] = vec4<f32>(0.0);
        }
    }
    let bt = req * params.bt_stride;

    for (var k0 = lo; k0 < hi; k0 = k0 + KEYS) {
        let n = min(KEYS, hi - k0);
        let blk = u32(block_table[bt + k0 / params.block_size]);
        let base = (blk * params.block_size + k0 % params.block_size) * D4 * 4u;
        for (var e = t; e < n * D4; e = e + WG) {
            lat_s[e] = cache_load4(base + e * 4u);
        }
        workgroupBarrier();
        // @unroll
        for (var k = 0u; k < KEYS; k = k + 1u) {
            var s: array<f32, RPT>;
            // @unroll
            for (var u = 0u; u < RPT; u = u + 1u) {
                s[u] = 0.0;
            }
            if k < n {
                // @unroll
                for (var i = 0u; i < QV; i = i + 1u) {
                    let c = lane + i * LANES;
                    if c < D4 {
                        let x = lat_s[k * D4 + c];
                        // @unroll
                        for (var u = 0u; u < RPT; u = u + 1u) {
                            s[u] = s[u] + dot(q[u][i], x);
                        }
                    }
                }
            }
            // @unroll
            for (var u = 0u; u < RPT; u = u + 1u) {
                part_s[((group * RPT + u) * KEYS + k) * LANES + lane] = s[u];
            }
        }
        workgroupBarrier();
        for (var e = t; e < ROWS * KEYS; e = e + WG) {
            var s = 0.0;
            // @unroll
            for (var i = 0u; i < LANES; i = i + 1u) {
                s = s + part_s[e * LANES + i];
            }
            score_s[e] = s;
        }
        workgroupBarrier();
        var p: array<array<f32, KEYS>, RPT>;
        // @unroll
        for (var u = 0u; u < RPT; u = u + 1u) {
            let row = group * RPT + u;
            var mx = m[u];
            // @unroll
            for (var k = 0u; k < KEYS; k = k + 1u) {
                if k < n && k0 + k < row_hi[u] {
                    mx = max(mx, score_s[row * KEYS + k]);
                }
            }
            let corr = exp(m[u] - mx);
            var sum = l[u] * corr;
            // @unroll
            for (var k = 0u; k < KEYS; k = k + 1u) {
                var e = 0.0;
                if k < n && k0 + k < row_hi[u] {
                    e = exp(score_s[row * KEYS + k] - mx);
                }
                p[u][k] = e;
                sum = sum + e;
            }
            // @unroll
            for (var i = 0u; i < VV; i = i + 1u) {
                acc[u][i] = acc[u][i] * corr;
            }
            l[u] = sum;
            m[u] = mx;
        }
        // Positions a row does not see have p = 0 and are skipped (never multiplied in).
        // @unroll
        for (var k = 0u; k < KEYS; k = k + 1u) {
            if k < n {
                // @unroll
                for (var i = 0u; i < VV; i = i + 1u) {
                    let c = lane + i * LANES;
                    if c < L4 {
                        let x = lat_s[k * D4 + c];
                        // @unroll
                        for (var u = 0u; u < RPT; u = u + 1u) {
                            if k0 + k < row_hi[u] {
                                acc[u][i] = acc[u][i] + p[u][k] * x;
                            }
                        }
                    }
                }
            }
        }
        workgroupBarrier();
    }

    // @unroll
    for (var u = 0u; u < RPT; u = u + 1u) {
        if live[u] {
            let seen = l[u] > 0.0;
            let inv = select(0.0, params.v_scale / l[u], seen);
            var out_row = grow[u] * L4 * 4u;
            if SPLIT {
                out_row = (wid.z * params.num_tokens * nh + grow[u]) * L4 * 4u;
            }
            // @unroll
            for (var i = 0u; i < VV; i = i + 1u) {
                let c = lane + i * LANES;
                if c < L4 {
                    out_store4(out_row + c * 4u, acc[u][i] * inv);
                }
            }
            if lane == 0u {
                let v = select(bitcast<f32>(NEG_INF_BITS), m[u] + log(l[u]), seen);
                if SPLIT {
                    lse[wid.z * params.num_tokens * nh + grow[u]] = v;
                } else if params.write_lse != 0u {
                    let h = grow[u] % nh;
                    let tok = grow[u] / nh;
                    lse[h * params.num_tokens + tok] = v;
                }
            }
        }
    }
}
