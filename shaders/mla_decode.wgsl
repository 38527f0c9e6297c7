// mla_decode.wgsl — MLA decode in latent space (vLLM's forward_mqa): every query row is an
// absorbed D-wide query (kv_lora_rank + rope) attending over the request's cached latents,
// whose first L dims are also the values; one shared "KV head", so every row of a request
// reads the same latents.
//
// Algorithm: workgroup (x, y, z) runs rows [x·ROWS, +ROWS) of decode request y (row r: token
// r / num_heads of the request, head r % num_heads) over split z of its keys. Thread
// t = row·LANES + lane keeps its row's query vec4 columns lane, lane + LANES, ... (< D4) in
// registers (times the score scale) and the accumulator of its value columns lane,
// lane + LANES, ... (< L4). Per step of KEYS keys (a step never crosses a block: KEYS
// divides the block size): the latents go to workgroup memory (dequantised to f32, only
// positions the split holds); every thread writes the partial dot products of its columns
// for the step's keys; the LANES partials of each (row, key) are summed into its score; each
// thread then runs its row's online softmax over the step's scores (the LANES threads of a
// row compute the same maximum and denominator) and adds the weighted latents to its
// accumulator. 4 barriers per step. A row at token j sees positions [0, ctx + j] (ctx =
// seq_len − q_len); keys it does not see take no part, by selection (their latents are never
// multiplied in, so a NaN slot cannot leak).
//
// Output: SPLIT false — out (activation dtype) = acc / l · v_scale and, when write_lse,
// lse[h][token] = m + ln l (natural log). SPLIT true — out is the f32 partial plane z
// (acc / l · v_scale, zero for a row that saw no key) and lse the partial LSE (−inf for such
// a row), merged by mla_combine.wgsl.
//
// Specialisation (generated header): D4, L4 (vec4 columns of the latent and of the values),
// ROWS, LANES, WG = ROWS·LANES, KEYS, QV = ⌈D4 / LANES⌉, VV = ⌈L4 / LANES⌉, SPLIT;
// `q_load4`, `cache_load4` (raw elements; fp8 not scaled: k_scale is folded into scale and
// v_scale), `out_store4`.
//
// Layout: q [tokens][num_heads][D] (decode tokens first, q_len each: request y's token j is
// token y·q_len + j); cache [blocks][block_size][D] (one buffer, or chunks of whole
// blocks: the generated `kv_addr`); block_table [reqs][bt_stride] i32;
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
    // Elements per cache block (block_size · D).
    block_stride: u32,
    // Blocks per chunk of a cache stored in chunks; unused for one buffer.
    blocks_per_window: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read> block_table: array<i32>;
@group(0) @binding(4) var<storage, read> seq_lens: array<i32>;
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;

var<workgroup> lat_s: array<vec4<f32>, KEYS * D4>;
var<workgroup> part_s: array<f32, WG * KEYS>;
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
    let row = t / LANES;
    let lane = t % LANES;
    let r = wid.x * ROWS + row;
    let live = r < rows;
    let j = min(r, rows - 1u) / nh;
    let h = min(r, rows - 1u) % nh;
    let seq = u32(seq_lens[req]);
    let token = req * q_len + j;
    // Keys this row sees: [0, seq - q_len + j].
    let row_hi = seq - q_len + j + 1u;

    // The split's keys, in whole steps: [lo, hi).
    let steps = (seq + KEYS - 1u) / KEYS;
    let per = (steps + params.num_splits - 1u) / params.num_splits;
    let lo = min(wid.z * per, steps) * KEYS;
    let hi = min((wid.z + 1u) * per * KEYS, seq);

    var q: array<vec4<f32>, QV>;
    let q_row = (token * nh + h) * D4 * 4u;
    for (var i = 0u; i < QV; i = i + 1u) {
        let c = lane + i * LANES;
        var v = vec4<f32>(0.0);
        if live && c < D4 {
            v = q_load4(q_row + c * 4u) * params.scale;
        }
        q[i] = v;
    }
    var acc: array<vec4<f32>, VV>;
    for (var i = 0u; i < VV; i = i + 1u) {
        acc[i] = vec4<f32>(0.0);
    }
    var m = NO_MAX;
    var l = 0.0;
    let bt = req * params.bt_stride;

    for (var k0 = lo; k0 < hi; k0 = k0 + KEYS) {
        let n = min(KEYS, hi - k0);
        let blk = u32(block_table[bt + k0 / params.block_size]);
        let base = kv_addr(blk, (k0 % params.block_size) * D4 * 4u);
        for (var e = t; e < n * D4; e = e + WG) {
            lat_s[e] = cache_load4(kb_add(base, e * 4u));
        }
        workgroupBarrier();
        for (var k = 0u; k < KEYS; k = k + 1u) {
            var s = 0.0;
            if k < n {
                for (var i = 0u; i < QV; i = i + 1u) {
                    let c = lane + i * LANES;
                    if c < D4 {
                        s = s + dot(q[i], lat_s[k * D4 + c]);
                    }
                }
            }
            part_s[(row * KEYS + k) * LANES + lane] = s;
        }
        workgroupBarrier();
        if t < ROWS * KEYS {
            var s = 0.0;
            for (var i = 0u; i < LANES; i = i + 1u) {
                s = s + part_s[t * LANES + i];
            }
            score_s[t] = s;
        }
        workgroupBarrier();
        var mx = m;
        for (var k = 0u; k < n; k = k + 1u) {
            if k0 + k < row_hi {
                mx = max(mx, score_s[row * KEYS + k]);
            }
        }
        let corr = exp(m - mx);
        l = l * corr;
        for (var i = 0u; i < VV; i = i + 1u) {
            acc[i] = acc[i] * corr;
        }
        for (var k = 0u; k < n; k = k + 1u) {
            if k0 + k < row_hi {
                let p = exp(score_s[row * KEYS + k] - mx);
                l = l + p;
                for (var i = 0u; i < VV; i = i + 1u) {
                    let c = lane + i * LANES;
                    if c < L4 {
                        acc[i] = acc[i] + p * lat_s[k * D4 + c];
                    }
                }
            }
        }
        m = mx;
        workgroupBarrier();
    }

    if !live {
        return;
    }
    let seen = l > 0.0;
    let inv = select(0.0, params.v_scale / l, seen);
    let grow = token * nh + h;
    var out_row = grow * L4 * 4u;
    if SPLIT {
        out_row = (wid.z * params.num_tokens * nh + grow) * L4 * 4u;
    }
    for (var i = 0u; i < VV; i = i + 1u) {
        let c = lane + i * LANES;
        if c < L4 {
            out_store4(out_row + c * 4u, acc[i] * inv);
        }
    }
    if lane == 0u {
        let v = select(bitcast<f32>(NEG_INF_BITS), m + log(l), seen);
        if SPLIT {
            lse[wid.z * params.num_tokens * nh + grow] = v;
        } else if params.write_lse != 0u {
            lse[h * params.num_tokens + token] = v;
        }
    }
}
