// mla_prefill.wgsl — MLA prefill (vLLM's forward_mha) in expanded form, one chunk of key
// positions per dispatch: causal MHA of the new tokens' queries (P + R dims) against keys
// [k_nope(h) | k_pe] and values v(h), expanded from the latents by kv_b_proj (the host runs
// mla_gather.wgsl and the tiled GEMM of model_ops_linear.wgsl first). Every (token, head)
// row's online-softmax state (acc, m, l) persists across the chunks' dispatches in f32, so
// any context runs with a workspace of one chunk, and the result is that of one pass (the
// chunk merge of vLLM's merge_attn_states, folded into the running state).
//
// Algorithm: workgroup (x, y, z) runs tokens [x·TOKS, +TOKS) of head y of prefill request z
// (its tokens share the head's keys and values). Thread t = row·LANES + lane keeps its
// token's query columns lane, lane + LANES, ... (< QK4) in registers (times scale) and the
// accumulator of value columns lane, lane + LANES, ... (< V4). Per step of KEYS positions:
// the keys and values of head y go to workgroup memory; partial dot products per (token,
// key, lane); LANES partials summed per score; each thread runs its token's online softmax
// and adds the weighted values. Token j sits at position ctx + j (ctx = seq_len − q_len) and
// sees [0, ctx + j]; positions a token does not see take no part, by selection; positions
// no token of the tile sees are not loaded.
//
// Specialisation (generated header): QK4, P4, V4, R4, KW4 = P4 + V4 (vec4 columns of a
// query / key, of k_nope, of a value, of the rope part, of one head's kv_b_proj output), TOKS,
// LANES, WG = TOKS·LANES, KEYS, QKV = ⌈QK4 / LANES⌉, VVP = ⌈V4 / LANES⌉; `q_load4` and
// `out_store4` for the activation dtype.
//
// Layout: q [Tp][num_heads][P + R], out [Tp][num_heads][V] (the prefill tokens); kvx
// [rows][num_heads][P + V] f32 (k_nope first, as kv_b_proj's output rows); lat: the rope
// keys [rows][R] f32 from vec4 pe_off; plan as in mla_gather.wgsl; state: acc [Tp·num_heads]
// [V] f32 vec4, then (m, l) per row as a vec4 from ml_off.
//
// Bounds relied on (host side): validated metadata; the plan's starts as for mla_gather;
// dispatches in chunk order with `first` on the first and `last` on the last (chunk 0 holds
// position 0, seen by every token, so l > 0 when `last` runs); grid.x·TOKS ≥ the longest
// prefill's q_len; grid.y = num_heads.

struct Params {
    num_heads: u32,
    chunk_lo: u32,
    chunk: u32,
    starts_off: u32,
    pe_off: u32,
    ml_off: u32,
    scale: f32,
    first: u32,
    last: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> kvx: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> lat: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> plan: array<i32>;
@group(0) @binding(5) var<storage, read_write> state: array<vec4<f32>>;

var<workgroup> k_s: array<vec4<f32>, KEYS * QK4>;
var<workgroup> v_s: array<vec4<f32>, KEYS * V4>;
var<workgroup> part_s: array<f32, WG * KEYS>;
var<workgroup> score_s: array<f32, TOKS * KEYS>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let i = wid.z;
    let h = wid.y;
    let nh = params.num_heads;
    let q_start = u32(plan[i * 4u]);
    let q_len = u32(plan[i * 4u + 1u]);
    let seq = u32(plan[i * 4u + 2u]);
    let j0 = wid.x * TOKS;
    if j0 >= q_len {
        return;
    }
    let base = u32(plan[params.starts_off + i]);
    let ctx = seq - q_len;
    let row = t / LANES;
    let lane = t % LANES;
    let j = j0 + row;
    let live = j < q_len;
    let jc = min(j, q_len - 1u);
    let row_g = (q_start + jc) * nh + h;
    let row_hi = ctx + jc + 1u;
    let lo = params.chunk_lo;
    let hi = min(min(seq, lo + params.chunk), ctx + min(j0 + TOKS, q_len));

    var q: array<vec4<f32>, QKV>;
    for (var k = 0u; k < QKV; k = k + 1u) {
        let c = lane + k * LANES;
        var v = vec4<f32>(0.0);
        if c < QK4 {
            v = q_load4((row_g * QK4 + c) * 4u) * params.scale;
        }
        q[k] = v;
    }
    var acc: array<vec4<f32>, VVP>;
    var m = NO_MAX;
    var l = 0.0;
    for (var k = 0u; k < VVP; k = k + 1u) {
        let c = lane + k * LANES;
        var a = vec4<f32>(0.0);
        if params.first == 0u && c < V4 {
            a = state[row_g * V4 + c];
        }
        acc[k] = a;
    }
    if params.first == 0u {
        let ml = state[params.ml_off + row_g];
        m = ml.x;
        l = ml.y;
    }

    for (var p0 = lo; p0 < hi; p0 = p0 + KEYS) {
        let n = min(KEYS, hi - p0);
        let w0 = base + p0 - lo;
        for (var e = t; e < n * QK4; e = e + WG) {
            let k = e / QK4;
            let c = e % QK4;
            let w = w0 + k;
            if c < P4 {
                k_s[e] = kvx[(w * nh + h) * KW4 + c];
            } else {
                k_s[e] = lat[params.pe_off + w * R4 + c - P4];
            }
        }
        for (var e = t; e < n * V4; e = e + WG) {
            let k = e / V4;
            let c = e % V4;
            v_s[e] = kvx[((w0 + k) * nh + h) * KW4 + P4 + c];
        }
        workgroupBarrier();
        for (var k = 0u; k < KEYS; k = k + 1u) {
            var s = 0.0;
            if k < n {
                for (var d = 0u; d < QKV; d = d + 1u) {
                    let c = lane + d * LANES;
                    if c < QK4 {
                        s = s + dot(q[d], k_s[k * QK4 + c]);
                    }
                }
            }
            part_s[(row * KEYS + k) * LANES + lane] = s;
        }
        workgroupBarrier();
        if t < TOKS * KEYS {
            var s = 0.0;
            for (var d = 0u; d < LANES; d = d + 1u) {
                s = s + part_s[t * LANES + d];
            }
            score_s[t] = s;
        }
        workgroupBarrier();
        var mx = m;
        for (var k = 0u; k < n; k = k + 1u) {
            if p0 + k < row_hi {
                mx = max(mx, score_s[row * KEYS + k]);
            }
        }
        let corr = exp(m - mx);
        l = l * corr;
        for (var d = 0u; d < VVP; d = d + 1u) {
            acc[d] = acc[d] * corr;
        }
        for (var k = 0u; k < n; k = k + 1u) {
            if p0 + k < row_hi {
                let e = exp(score_s[row * KEYS + k] - mx);
                l = l + e;
                for (var d = 0u; d < VVP; d = d + 1u) {
                    let c = lane + d * LANES;
                    if c < V4 {
                        acc[d] = acc[d] + e * v_s[k * V4 + c];
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
    if params.last != 0u {
        let inv = select(0.0, 1.0 / l, l > 0.0);
        for (var d = 0u; d < VVP; d = d + 1u) {
            let c = lane + d * LANES;
            if c < V4 {
                out_store4((row_g * V4 + c) * 4u, acc[d] * inv);
            }
        }
    } else {
        for (var d = 0u; d < VVP; d = d + 1u) {
            let c = lane + d * LANES;
            if c < V4 {
                state[row_g * V4 + c] = acc[d];
            }
        }
        if lane == 0u {
            state[params.ml_off + row_g] = vec4<f32>(m, l, 0.0, 0.0);
        }
    }
}
