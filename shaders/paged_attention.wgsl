// paged_attention.wgsl — attention of one tile of query rows against one KV head, with
// online softmax (FlashAttention's algorithm), for mixed prefill / decode batches.
//
// Specialisation (a generated header, see src/kernels/wgsl/attention.rs): head size D
// (D4 = D / 4 vec4 columns), BM query rows and BN keys per tile, WG threads, TILED2 and F16
// (the form, below) with DU, JU, LPT, LOG_KL, KB_LEN, S_ROW, FA, KV_SCALED, M_BUFS, the
// element type SH / SH4 of the query, key / value and probability tiles in workgroup memory
// (f32 / vec4<f32>; f16 / vec4<f16> when F16), the dtypes of
// queries / outputs and of keys / values, and the key source: the paged KV cache
// (`kv_load4`, addressed through the block table) or dense K/V tensors (encoder attention).
// Register blocking: KPT keys per thread (KL key lanes, RGA row groups, RPT_A rows each) in
// phase A; CPT vec4 columns per thread (CL column lanes, RGC row groups, RPT_C rows each) in
// phase C. Loops marked `// @unroll` (over those counts) are unrolled by the generator
// (`unroll` in src/kernels/wgsl/preprocess.rs), so the per-thread score and accumulator arrays live in registers.
// The header also supplies `q_load4`, `out_store4`, `k_load4`, `v_load4`, `key_base`,
// `key_base_fast` (a shift for power-of-two block sizes), the raw-word type KV_RAW with
// `k_raw4`, `v_raw4`, `kv_cvt4`, and the score storage `s_s` with `s_get`, `s_set`, `s_get4`;
// `softmax_rows`, `vthread`, `lanes_max`, `lanes_sum` and the `Inputs` struct come from
// softmax_serial.wgsl or softmax_subgroup.wgsl; `Params`, the flags, `visible`, `modify` and `key_range` from
// attention_common.wgsl.
//
// Work: workgroup x + z·65535 runs work item x + z·65535, a `WorkItem` of the planner
// (attention_common.wgsl; built on the host from validated metadata): q_len tokens from
// q_start × head_count query heads of KV head kv_head (row r: token q_start + r / head_count,
// head kv_head·g + head_start + r % head_count, position q_pos + r / head_count; the query
// heads of a KV head share every key the tile loads), against the key range [kv_lo, kv_hi)
// of request `req`. An unsplit item (num_splits = 1) writes the output; a split item writes
// a partial of plane `split` at partial token part_tok + r / head_count; split 0 adds the
// sink logit (once per row).
//
// Per chunk of BN keys: key addresses -> K into shared memory -> S = (q·scale)·K^T (phase A)
// -> per row: soft cap c·tanh(s/c), ALiBi −slope·|pos − j| (FlashAttention's form: slope·(j − pos)
// under a causal mask, symmetric otherwise), causal / sliding-window mask,
// running max m, denominator l and rescale factor α (phase B, `softmax_rows`), while V is
// loaded -> acc = acc·α + P·V (phase C). A sink starts a row at m = sink, l = 1. At the end
// out = acc / l and LSE = m + ln l (natural log; −inf and a zero output for a row that saw
// no key and no sink); a split item writes acc, m and l to `scratch` instead, for
// combine_splits.wgsl. Keys visible to a query at position p: causal j ≤ p; window W
// p − j < W (and j − p < W when not causal).
//
// Layout: q / out [tokens, H, D]; lse [H, num_tokens] (f32 bits); paged KV cache
// [blocks, 2, ...] with the element strides in Params (NHD and HND alike); block table
// [reqs, width] i32; layer = [alibi slopes H][sinks H] f32; scratch = partial rows
// ((split·n_part_tokens + partial token)·H + head)·D4 vec4, then (m, l) vec4s from
// ml_offset (`partial_row`).
//
// Three forms, chosen by the header's TILED2 and F16 (the host's
// `POLYATTN_WGPU_PREFILL=three-phase|fused-softmax|fused-softmax-f16`: tiled, tiled2,
// tiled2h below; for prefill items only; decode tiles always
// take the tiled form):
//   * tiled (TILED2 false, WG = 128): per chunk, key addresses -> barrier -> K -> barrier
//     -> A -> barrier -> B (softmax_rows) with V loaded over K -> barrier -> C -> barrier.
//   * tiled2 (TILED2 true, WG a power of two, `POLYATTN_WGPU_PREFILL_WG`): each thread keeps
//     its key addresses (`chunk_bases`) and raw K/V words (`chunk_raw`, LPT = ⌈BN·D4/WG⌉ of
//     them, unpacked by `kv_cvt4` only when stored) in registers; per chunk:
//       K words -> kv_s, barrier; issue this chunk's V loads; phase A with phase B fused:
//       the KL lanes of a row group (adjacent lanes of one subgroup, numbered by
//       `vthread`; KL ≤ the smallest subgroup size, 1 without subgroups) hold all BN
//       scores of their rows, apply soft cap / ALiBi / mask, and reduce the row max and
//       sum with `lanes_max` / `lanes_sum` (LOG_KL shuffles) — no serial softmax pass
//       (`scores_softmax`); chunk i reads the running maxima from m_s half (i & 1) ^ 1 and
//       writes half i & 1, so no lane reads a maximum another is replacing; barrier; V
//       words -> kv_s; barrier; issue the next
//       chunk's address reads and K loads; phase C over all BN keys (keys ≥ cn have zero
//       V and zero P), JU = 4 keys per step, each row's 4 probabilities one vec4 load
//       (s_s holds vec4 rows of S_ROW = BN + 4 floats); barrier.
//     So 4 barriers per chunk instead of 5, global-load latency overlapped with phases A
//     and C, phase A DU vec4 columns per step. Blocking: KPT = BN / KL ≥ 4 keys per
//     thread where the lanes allow, RGA = WG / KL row groups; phase C as the tiled form
//     with WG threads (WG = 64 gives 4 × 4 blocks in both phases of a 32 × 32 tile at
//     D = 128, twice the FMAs per shared-memory load of 128 threads' 2 × 4; the host's
//     `POLYATTN_WGPU_PREFILL_BLOCK` asks for other blocks).
//   * tiled2h (TILED2 and F16 true; `enable f16;` is emitted for this form only, which the
//     host picks for f16 activations with an f16 cache on adapters with SHADER_F16): the
//     tiled2 form with q_s, kv_s and s_s holding f16 (half the workgroup memory and shared
//     loads; an f16 cache is bound as array<vec4<f16>>, so K / V words go to kv_s without
//     conversion). Phase A (`tile_scores_h`): per score a vec4<f16> partial — four
//     independent f16 accumulators — takes one vec4<f16> FMA (2 packed HFMA2) per vec4
//     column; after FA = 4 columns its lanes are added pairwise in f16 and the two halves
//     added to the f32 score, so the score is an f32 sum of short f16 partials. The softmax
//     (modifiers, mask, max, exp, sums, running m / l / α) stays f32; P is rounded to f16
//     when stored. Phase C: per key, hacc += vec4<f16>(p)·v (vec4<f16> FMAs into f16
//     partials `hacc`, one per output vec4), and after the chunk's BN keys acc = acc·α + hacc
//     in f32, so no f16 sum spans more than one chunk and the error does not grow with the
//     sequence length.
//     Error bound (u = 2^-11, the f16 unit roundoff; q pre-scaled, rounded once to f16):
//     phase A: a lane sums FA = 4 products with one rounding per FMA, then one pairwise
//     add, each rounding relative to a partial of at most 8 products, so
//     |Δs| ≤ 6u·Σ_i |q_i·scale·k_i| (plus the f32 sum's ~D/8·2^-24 relative, negligible),
//     whatever the head size and the size of the logit: an f16 sum over the whole dot
//     product (the earlier FA = 32) rounds relative to partials that grow with the logit,
//     an absolute error of ~ulp(|s|/4) per step (|s| ≈ 30: 2^-8) that reached 3.6e-2 in
//     the output at D = 136. Rounding errors of random sign grow like √(D/4), not D: at
//     D = 128 and |s| ~ 30 a typical |Δs| is ~2e-3. A score error δ perturbs the output by
//     at most ~|δ|·max|v − out|. Phase C: each hacc lane sums ≤ BN products p·v (p ≤ 1
//     rounded to f16, v exact) per chunk, so the chunk's error is ≤ (BN + 1)u·Σ p|v| and
//     the output's, after dividing by l ≥ Σ p, ≤ (BN + 1)u·max|v| whatever the sequence
//     length and the logit range (p ≤ 1 bounds every partial by Σ p|v|); typically
//     ~√BN·u·|v| (4e-3·|v| at BN = 64). Against the f16 tolerance of the shared tests
//     (atol 1.5e-2, rtol 1e-2) that leaves a margin (tests/stale_cache.rs drives |s| to ~30
//     at D = 136 and 256). Not for activations whose partial sums can leave the f16 range
//     (|x| > 65504: an inf / NaN output): those layers keep tiled2.
// All forms share `tile_scores` (phase A; tiled2h branches to `tile_scores_h`), the
// phase-C function `out_chunk` (tiled2h: with its f16 partials) and the epilogue; the
// generator (`AttentionShader::source`) sets DU = JU = 1, KB_LEN = BN, M_BUFS = 1 and
// S_ROW = BN + 1 for the tiled form (its loops as before tiled2 existed).
//
// Bounds relied on: every item comes from metadata validated on the host — tokens < the
// query's rows, keys < seq_len ≤ width·block_size, block ids < the cache's blocks, partial
// rows < the scratch's; q_len · head_count ≤ BM; rows ≥ n_rows and keys ≥ the chunk length are never loaded or stored
// (tiled2 loads nothing for keys ≥ cn: their words are zero). Shared-memory indices:
// a_j + i·KL < BN, c_col + i·CL < D4, rows clamped to BM − 1, u < BN·D4 for the chunk
// stores, parity halves below M_BUFS; every other index is bounded by its loop.

var<workgroup> q_s: array<SH4, BM * D4>;
// Keys, then values.
var<workgroup> kv_s: array<SH4, BN * KV_ROW>;
// Running maxima: M_BUFS halves of BM (tiled2 forms: chunk ci writes half ci & 1 and reads
// the other, so the lanes of a row group never read a maximum one of them is replacing).
var<workgroup> m_s: array<f32, BM * M_BUFS>;
var<workgroup> l_s: array<f32, BM>;
// Rescale factors α.
var<workgroup> a_s: array<f32, BM>;
var<workgroup> pos_s: array<u32, BM>;
var<workgroup> head_s: array<u32, BM>;
// Key addresses (tiled; 1 entry in the tiled2 forms, which keep them in registers).
var<workgroup> kbase_s: array<KB, KB_LEN>;

// Phase A: vec4 column d4 of this thread's KPT keys a_j + i·KL (i < KPT) from kv_s.
fn key_cols(a_j: u32, d4: u32) -> array<SH4, KPT> {
    var kk: array<SH4, KPT>;
    // @unroll
    for (var i = 0u; i < KPT; i = i + 1u) {
        kk[i] = kv_s[(a_j + i * KL) * KV_ROW + d4];
    }
    return kk;
}

// Phase A: this thread's scores S = (q·scale)·K^T for keys a_j + i·KL (i < KPT) of rows
// a_rg + k·RGA (k < RPT_A), from q_s and the keys in kv_s. Rows past BM are clamped (the
// caller does not store them); the d4 loop runs DU vec4 columns per iteration. The tiled2h
// form (F16) computes them with f16 products: `tile_scores_h`.
fn tile_scores(a_j: u32, a_rg: u32) -> array<f32, RPT_A * KPT> {
    if F16 {
        return tile_scores_h(a_j, a_rg);
    }
    var s: array<f32, RPT_A * KPT>;
    // @unroll
    for (var e = 0u; e < RPT_A * KPT; e = e + 1u) {
        s[e] = 0.0;
    }
    for (var d0 = 0u; d0 < D4; d0 = d0 + DU) {
        // @unroll
        for (var dd = 0u; dd < DU; dd = dd + 1u) {
            let d4 = d0 + dd;
            let kk = key_cols(a_j, d4);
            // @unroll
            for (var k = 0u; k < RPT_A; k = k + 1u) {
                let qq = q_s[min(a_rg + k * RGA, BM - 1u) * D4 + d4];
                // @unroll
                for (var i = 0u; i < KPT; i = i + 1u) {
                    s[k * KPT + i] = s[k * KPT + i] + f32(dot(qq, kk[i]));
                }
            }
        }
    }
    return s;
}

// tiled2h phase A: `tile_scores` with vec4<f16> FMAs. Per score, a vec4<f16> partial `h`
// (four independent f16 accumulators, one per vec4 lane) sums the element-wise products of
// FA vec4 columns (FA products per lane); then its lanes are added pairwise in f16, the two
// halves are added to the f32 score, and the next FA columns start a fresh partial.
fn tile_scores_h(a_j: u32, a_rg: u32) -> array<f32, RPT_A * KPT> {
    var s: array<f32, RPT_A * KPT>;
    // @unroll
    for (var e = 0u; e < RPT_A * KPT; e = e + 1u) {
        s[e] = 0.0;
    }
    for (var f0 = 0u; f0 < D4; f0 = f0 + FA) {
        var h: array<SH4, RPT_A * KPT>;
        // @unroll
        for (var e = 0u; e < RPT_A * KPT; e = e + 1u) {
            h[e] = SH4(0.0);
        }
        // FA is a multiple of DU and DU divides D4, so every step is whole.
        let f1 = min(f0 + FA, D4);
        for (var d0 = f0; d0 < f1; d0 = d0 + DU) {
            // @unroll
            for (var dd = 0u; dd < DU; dd = dd + 1u) {
                let d4 = d0 + dd;
                let kk = key_cols(a_j, d4);
                // @unroll
                for (var k = 0u; k < RPT_A; k = k + 1u) {
                    let qq = q_s[min(a_rg + k * RGA, BM - 1u) * D4 + d4];
                    // @unroll
                    for (var i = 0u; i < KPT; i = i + 1u) {
                        h[k * KPT + i] = fma(qq, kk[i], h[k * KPT + i]);
                    }
                }
            }
        }
        // @unroll
        for (var e = 0u; e < RPT_A * KPT; e = e + 1u) {
            let p = h[e].xy + h[e].zw;
            s[e] = s[e] + f32(p.x) + f32(p.y);
        }
    }
    return s;
}

// tiled2: unpacks this thread's raw words (keys or values) into kv_s, times `scale` (fp8
// caches only: the host passes 1 for the others, KV_SCALED false).
fn chunk_store(t: u32, w_in: array<KV_RAW, LPT>, scale: f32) {
    var w = w_in;
    // @unroll
    for (var i = 0u; i < LPT; i = i + 1u) {
        let u = t + i * WG;
        if u < BN * D4 {
            var x = kv_cvt4(w[i]);
            if KV_SCALED {
                x = x * SH(scale);
            }
            kv_s[(u / D4) * KV_ROW + u % D4] = x;
        }
    }
}

// tiled form: the chunk's keys (`v` false) or values (`v` true), addressed through kbase_s,
// into kv_s times `scale`; zeros for keys ≥ cn.
fn tiled_stage(t: u32, cn: u32, v: bool, scale: f32) {
    for (var u = t; u < BN * D4; u = u + WG) {
        let j = u / D4;
        let c = u % D4;
        var x = vec4<f32>(0.0);
        if j < cn {
            let e = kb_add(kbase_s[min(j, KB_LEN - 1u)], c * 4u);
            if v {
                x = v_load4(e);
            } else {
                x = k_load4(e);
            }
            x = x * scale;
        }
        kv_s[j * KV_ROW + c] = SH4(x);
    }
}

// tiled2 forms: phase A of the chunk at c0 (cn keys) with phase B fused. The KL lanes of a
// row group hold all BN scores of their rows; the row max and sum are reduced across them
// in registers. Reads the running maxima from m_s half par ^ 1 and writes the new ones to
// half par (so no lane reads a maximum another lane of its group is replacing); stores
// the probabilities in s_s and α in a_s.
fn scores_softmax(a_j: u32, a_rg: u32, c0: u32, cn: u32, par: u32) {
    var s = tile_scores(a_j, a_rg);
    // @unroll
    for (var k = 0u; k < RPT_A; k = k + 1u) {
        let r = a_rg + k * RGA;
        let rc = min(r, BM - 1u);
        let head = head_s[rc];
        let live = r < BM && head != NO_ROW;
        let p = pos_s[rc];
        var ok: array<bool, KPT>;
        var mx = NO_MAX;
        // @unroll
        for (var i = 0u; i < KPT; i = i + 1u) {
            let j = a_j + i * KL;
            let o = live && j < cn && visible(p, c0 + j);
            ok[i] = o;
            if o {
                let x = modify(s[k * KPT + i], head, p, c0 + j);
                s[k * KPT + i] = x;
                mx = max(mx, x);
            }
        }
        let m_old = m_s[(par ^ 1u) * BM + rc];
        let m_new = max(m_old, lanes_max(mx));
        var sum = 0.0;
        // @unroll
        for (var i = 0u; i < KPT; i = i + 1u) {
            var e = 0.0;
            if ok[i] {
                e = exp(s[k * KPT + i] - m_new);
            }
            sum = sum + e;
            if r < BM {
                s_set(r * S_ROW + a_j + i * KL, e);
            }
        }
        sum = lanes_sum(sum);
        if r < BM && a_j == 0u {
            let alpha = exp(m_old - m_new);
            l_s[r] = l_s[r] * alpha + sum;
            m_s[par * BM + r] = m_new;
            a_s[r] = alpha;
        }
    }
}

// Phase C: acc = acc·α + P·V over the chunk's first jn keys (V in kv_s, P in s_s, α in
// a_s), JU keys per iteration. Rows past n_rows have zero probabilities and are
// never stored; rows past BM are clamped. tiled2h (F16): the chunk's P·V in f16 partial
// sums `hacc`, added to acc after it.
fn out_chunk(
    c_col: u32,
    c_rg: u32,
    jn: u32,
    acc_in: array<vec4<f32>, RPT_C * CPT>,
) -> array<vec4<f32>, RPT_C * CPT> {
    var acc = acc_in;
    // @unroll
    for (var k = 0u; k < RPT_C; k = k + 1u) {
        let alpha = a_s[min(c_rg + k * RGC, BM - 1u)];
        // @unroll
        for (var i = 0u; i < CPT; i = i + 1u) {
            acc[k * CPT + i] = acc[k * CPT + i] * alpha;
        }
    }
    var hacc: array<SH4, RPT_C * CPT>;
    if F16 {
        // @unroll
        for (var e = 0u; e < RPT_C * CPT; e = e + 1u) {
            hacc[e] = SH4(0.0);
        }
    }
    for (var j0 = 0u; j0 < jn; j0 = j0 + JU) {
        // tiled2 (JU = 4, rows of S_ROW a multiple of 4): each row's 4 probabilities in
        // one vec4 load.
        var pr: array<SH4, RPT_C>;
        if TILED2 {
            // @unroll
            for (var k = 0u; k < RPT_C; k = k + 1u) {
                pr[k] = s_get4(min(c_rg + k * RGC, BM - 1u) * S_ROW + j0);
            }
        }
        // @unroll
        for (var jj = 0u; jj < JU; jj = jj + 1u) {
            let j = j0 + jj;
            var vv: array<SH4, CPT>;
            // @unroll
            for (var i = 0u; i < CPT; i = i + 1u) {
                vv[i] = kv_s[j * KV_ROW + c_col + i * CL];
            }
            // @unroll
            for (var k = 0u; k < RPT_C; k = k + 1u) {
                var pk = SH(0.0);
                if TILED2 {
                    pk = pr[k][min(jj, 3u)];
                } else {
                    pk = SH(s_get(min(c_rg + k * RGC, BM - 1u) * S_ROW + j));
                }
                // @unroll
                for (var i = 0u; i < CPT; i = i + 1u) {
                    if F16 {
                        hacc[k * CPT + i] = fma(SH4(pk), vv[i], hacc[k * CPT + i]);
                    } else {
                        acc[k * CPT + i] = acc[k * CPT + i] + vec4<f32>(pk * vv[i]);
                    }
                }
            }
        }
    }
    if F16 {
        // @unroll
        for (var e = 0u; e < RPT_C * CPT; e = e + 1u) {
            acc[e] = acc[e] + vec4<f32>(hacc[e]);
        }
    }
    return acc;
}

@compute @workgroup_size(WG)
fn main(inp: Inputs) {
    let t = inp.t;
    let item = flat_group(inp.wid, inp.nwg);
    if item >= params.num_items {
        return;
    }
    let it = items[item];
    let kv_head = it.kv_head;
    let g = params.group;
    let H = params.num_heads;
    let hc = it.head_count;
    let n_rows = it.q_len * hc;
    let kv_lo = it.kv_lo;
    let kv_hi = it.kv_hi;
    let kv_row = item_kv_row(it);
    let direct = it.num_splits == 1u;
    let add_sink = it.split == 0u && (params.flags & SINKS) != 0u;

    // Rows: position, query head, running statistics.
    for (var r = t; r < BM; r = r + WG) {
        var m0 = NO_MAX;
        var l0 = 0.0;
        if r < n_rows {
            let head = kv_head * g + it.head_start + r % hc;
            pos_s[r] = it.q_pos + r / hc;
            head_s[r] = head;
            if add_sink {
                m0 = layer[H + head];
                l0 = 1.0;
            }
        } else {
            pos_s[r] = 0u;
            head_s[r] = NO_ROW;
        }
        for (var b = 0u; b < M_BUFS; b = b + 1u) {
            m_s[b * BM + r] = m0;
        }
        a_s[r] = 1.0;
        l_s[r] = l0;
    }
    // Queries, scaled.
    for (var u = t; u < BM * D4; u = u + WG) {
        let r = u / D4;
        let c = u % D4;
        var v = vec4<f32>(0.0);
        if r < n_rows {
            let tok = it.q_start + r / hc;
            let head = kv_head * g + it.head_start + r % hc;
            v = q_load4((tok * H + head) * D + c * 4u) * params.scale;
        }
        q_s[u] = SH4(v);
    }

    // Keys any row of the tile can see.
    let p_min = it.q_pos;
    let p_max = it.q_pos + it.q_len - 1u;
    let range = key_range(kv_lo, kv_hi, p_min, p_max);
    let lo = range.x;
    let hi = range.y;

    // Register blocks. Phase A: keys a_j + i·KL (i < KPT) of rows a_rg + k·RGA (k < RPT_A).
    // Phase C: vec4 columns c_col + i·CL (i < CPT) of rows c_rg + k·RGC (k < RPT_C). Each
    // shared-memory load then feeds KPT (or RPT_A, RPT_C, CPT) dot products instead of one;
    // lanes of one warp read distinct K / V rows (A) or adjacent vec4s (C) and share the
    // Q / probability rows (broadcast). tiled2 numbers its phase-A threads by subgroup lane
    // (`vthread`), so the KL lanes of a row group lie in one subgroup.
    let a_t = select(t, vthread(inp), TILED2);
    let a_j = a_t % KL;
    let a_rg = a_t / KL;
    let c_col = t % CL;
    let c_rg = t / CL;
    var acc: array<vec4<f32>, RPT_C * CPT>;
    // @unroll
    for (var e = 0u; e < RPT_C * CPT; e = e + 1u) {
        acc[e] = vec4<f32>(0.0);
    }
    // tiled2: the key bases and raw K words of the next chunk, in registers.
    var kb: array<KB, LPT>;
    var raw: array<KV_RAW, LPT>;
    if TILED2 && lo < hi {
        kb = chunk_bases(t, lo, min(BN, hi - lo), kv_head, kv_row);
        raw = chunk_raw(t, kb, min(BN, hi - lo), false);
    }
    workgroupBarrier();

    // Chunks; the running maxima of chunk ci go to m_s half ci & 1 (tiled2 forms).
    let n_chunks = select(0u, (hi - lo + BN - 1u) / BN, lo < hi);
    for (var ci = 0u; ci < n_chunks; ci = ci + 1u) {
        let c0 = lo + ci * BN;
        let cn = min(BN, hi - c0);
        if TILED2 {
            // K (loaded during the last chunk's phase C) into shared memory; this chunk's
            // V loads are issued before phase A and stored after it.
            chunk_store(t, raw, params.k_scale);
            workgroupBarrier();
            raw = chunk_raw(t, kb, cn, true);
            if a_rg < RGA {
                scores_softmax(a_j, a_rg, c0, cn, ci & 1u);
            }
            workgroupBarrier();
            chunk_store(t, raw, params.v_scale);
            workgroupBarrier();
            // The next chunk's K loads, in flight during phase C.
            let c1 = c0 + BN;
            if c1 < hi {
                kb = chunk_bases(t, c1, min(BN, hi - c1), kv_head, kv_row);
                raw = chunk_raw(t, kb, min(BN, hi - c1), false);
            }
        } else {
            for (var j = t; j < cn; j = j + WG) {
                kbase_s[min(j, KB_LEN - 1u)] = key_base(c0 + j, kv_head, kv_row);
            }
            workgroupBarrier();
            tiled_stage(t, cn, false, params.k_scale);
            workgroupBarrier();

            // Phase A: S = Q·K^T. Rows past n_rows hold zero queries (their scores are
            // discarded by phase B); rows past BM are clamped and not stored.
            if a_rg < RGA {
                let s = tile_scores(a_j, a_rg);
                // @unroll
                for (var k = 0u; k < RPT_A; k = k + 1u) {
                    let r = a_rg + k * RGA;
                    if r < BM {
                        // @unroll
                        for (var i = 0u; i < KPT; i = i + 1u) {
                            s_set(r * S_ROW + a_j + i * KL, s[k * KPT + i]);
                        }
                    }
                }
            }
            workgroupBarrier();

            // Phase B (rows) while V is loaded over K.
            softmax_rows(inp, c0, cn);
            tiled_stage(t, cn, true, params.v_scale);
            workgroupBarrier();
        }
        // Phase C over the chunk's first jn keys (cn; tiled2: all BN, whose keys ≥ cn
        // have zero values and probabilities).
        if c_rg < RGC {
            acc = out_chunk(c_col, c_rg, select(cn, BN, TILED2), acc);
        }
        workgroupBarrier();
    }
    // The half of m_s holding the final running maxima (tiled2 forms: that of the last
    // chunk, or of the initial values, half 1, when there was none).
    let m_fin = select(0u, ((n_chunks + 1u) & 1u) * BM, TILED2);


    // Epilogue.
    if c_rg < RGC {
        // @unroll
        for (var k = 0u; k < RPT_C; k = k + 1u) {
            let r = c_rg + k * RGC;
            if r < n_rows {
                let l = l_s[r];
                let m = m_s[m_fin + r];
                let head = head_s[r];
                let tok = it.q_start + r / hc;
                if direct {
                    // @unroll
                    for (var i = 0u; i < CPT; i = i + 1u) {
                        var o = vec4<f32>(0.0);
                        if l > 0.0 {
                            o = acc[k * CPT + i] / l;
                        }
                        out_store4((tok * H + head) * D + (c_col + i * CL) * 4u, o);
                    }
                    if c_col == 0u && (params.flags & WRITE_LSE) != 0u {
                        var bits = NEG_INF_BITS;
                        if l > 0.0 {
                            bits = bitcast<u32>(m + log(l));
                        }
                        lse[head * params.num_tokens + tok] = bits;
                    }
                } else {
                    let prow = partial_row(it, r, head);
                    // @unroll
                    for (var i = 0u; i < CPT; i = i + 1u) {
                        scratch[prow * D4 + c_col + i * CL] = acc[k * CPT + i];
                    }
                    if c_col == 0u {
                        scratch[params.ml_offset + prow] = vec4<f32>(m, l, 0.0, 0.0);
                    }
                }
            }
        }
    }
}
