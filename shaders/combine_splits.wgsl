// combine_splits.wgsl — merges the split-KV partials of paged_attention.wgsl and
// paged_decode.wgsl (flash-decoding): for each (token, query head) of a split request, with
// partial i holding the unnormalised accumulator acc_i, running max m_i and denominator l_i
// over its key range:
//   M = max_i m_i,  L = Σ l_i·exp(m_i − M),  out = Σ acc_i·exp(m_i − M) / L,
//   LSE = M + ln L   (natural log; out = 0 and LSE = −inf when L = 0: no key, no sink).
// The sink logit was added by exactly one partial (split 0), so it counts once.
//
// Algorithm: the WG threads of a workgroup form SL = WG / D4 split lanes of D4 columns
// (thread t: column t % D4, split lane t / D4). Split lane k walks partials k, k + SL, …
// once, BATCH at a time: it issues the loads of BATCH partials before merging any of them
// into its own (m, l, acc) online (rescaling by exp(m_old − m_new)), so a long split list
// costs n_splits / (SL·BATCH) load latencies, not n_splits / SL; then the SL states merge
// through workgroup memory and the first D4 threads write the row.
//
// Specialisation (generated header): WG (≥ D4: the host takes head sizes ≤ 4·WG), BATCH (the
// loops over it are unrolled, `// @unroll`) and `out_store4` for the output dtype. The head
// size D and the partial-token count are run-time parameters.
//
// Work: workgroup (x + z·65535, y) merges split group x+z·65535 for query head y; a group (a
// `SplitGroup` of the planner, src/plan/work_item.rs) is the first batch token, the number of
// tokens, their first partial token and the number of splits. Its tokens are merged one
// after the other.
//
// Layout: scratch partial row of (split s, partial token p, head h) at
// ((s·n_part_tokens + p)·H + h)·D4 vec4, its (m, l) at ml_offset + that row (as
// `partial_row` in attention_common.wgsl). out [tokens, H, D]; lse [H, num_tokens] f32 bits.
// Bounds: groups come from the host plan that sized `scratch`; i < q_len; threads past
// SL·D4 load nothing; workgroup arrays are indexed below WG.

struct Params {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    group: u32,
    num_groups: u32,
    ml_offset: u32,
    write_lse: u32,
    head_size: u32,
    n_part_tokens: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> scratch: array<vec4<f32>>;
// The planner's split group (src/plan/work_item.rs; SplitGroup in kernels-cuda/common.cuh).
struct SplitGroup {
    q_start: u32,
    q_len: u32,
    part_tok: u32,
    num_splits: u32,
}

@group(0) @binding(2) var<storage, read> groups: array<SplitGroup>;
@group(0) @binding(4) var<storage, read_write> lse: array<u32>;

var<workgroup> acc_s: array<vec4<f32>, WG>;
var<workgroup> ml_s: array<vec2<f32>, WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let gi = flat_group(wid, nwg);
    if gi >= params.num_groups {
        return;
    }
    let head = wid.y;
    let grp = groups[gi];
    let tok_start = grp.q_start;
    let n_tok = grp.q_len;
    let n_splits = grp.num_splits;
    let D = params.head_size;
    let D4 = D / 4u;
    let lanes = max(WG / D4, 1u);
    let col = t % D4;
    let sl = t / D4;
    for (var i = 0u; i < n_tok; i = i + 1u) {
        var m = NO_MAX;
        var l = 0.0;
        var o = vec4<f32>(0.0);
        if sl < lanes {
            for (var s0 = sl; s0 < n_splits; s0 = s0 + lanes * BATCH) {
                var mls: array<vec4<f32>, BATCH>;
                var parts: array<vec4<f32>, BATCH>;
                // @unroll
                for (var j = 0u; j < BATCH; j = j + 1u) {
                    let s = s0 + j * lanes;
                    // Past the list: a neutral partial (m = NO_MAX, l = 0, acc = 0).
                    mls[j] = vec4<f32>(NO_MAX, 0.0, 0.0, 0.0);
                    parts[j] = vec4<f32>(0.0);
                    if s < n_splits {
                        let prow = (s * params.n_part_tokens + grp.part_tok + i) * params.num_heads + head;
                        mls[j] = scratch[params.ml_offset + prow];
                        parts[j] = scratch[prow * D4 + col];
                    }
                }
                // @unroll
                for (var j = 0u; j < BATCH; j = j + 1u) {
                    let m_new = max(m, mls[j].x);
                    let a = exp(m - m_new);
                    let b = exp(mls[j].x - m_new);
                    l = l * a + mls[j].y * b;
                    // A partial that saw no key (l = 0) adds nothing, by selection.
                    o = o * a + select(vec4<f32>(0.0), parts[j] * b, mls[j].y > 0.0);
                    m = m_new;
                }
            }
        }
        acc_s[t] = o;
        ml_s[t] = vec2<f32>(m, l);
        workgroupBarrier();
        if t < D4 {
            var big_m = NO_MAX;
            for (var k = 0u; k < lanes; k = k + 1u) {
                big_m = max(big_m, ml_s[k * D4 + t].x);
            }
            var big_l = 0.0;
            var res = vec4<f32>(0.0);
            for (var k = 0u; k < lanes; k = k + 1u) {
                let ml = ml_s[k * D4 + t];
                let f = exp(ml.x - big_m);
                big_l = big_l + ml.y * f;
                res = res + acc_s[k * D4 + t] * f;
            }
            if big_l > 0.0 {
                res = res / big_l;
            } else {
                res = vec4<f32>(0.0);
            }
            let tok = tok_start + i;
            out_store4((tok * params.num_heads + head) * D + t * 4u, res);
            if t == 0u && params.write_lse != 0u {
                var bits = NEG_INF_BITS;
                if big_l > 0.0 {
                    bits = bitcast<u32>(big_m + log(big_l));
                }
                lse[head * params.num_tokens + tok] = bits;
            }
        }
        workgroupBarrier();
    }
}
