// paged_attention_coop.wgsl — the prefill tile of paged_attention.wgsl (same work items,
// bindings, masks, modifiers, sinks, LSE and split partials) with both matrix products on
// cooperative matrices (the header says `enable wgpu_cooperative_matrix;`: tensor cores through Vulkan's
// VK_KHR_cooperative_matrix), for f16 activations with an f16 cache.
//
// Where the softmax scale goes: into the f16 Q tile (q_scale() = params.scale, s_scale() = 1), or,
// in the bf16 form, onto the f32 scores (q_scale() = 1, s_scale() = params.scale), since a scaled
// query rounded to bf16's 8 bits moved large logits (soft cap 50) past the bf16 tolerance
// while the unscaled bf16 query converts exactly.
//
// Specialisation (the generated header, src/kernels/wgsl/attention.rs): head size D (a
// multiple of 16), D4 = D / 4, BM query rows (a multiple of 16: RT = BM / 16 row tiles), BN
// keys per chunk (a multiple of 16), NQ subgroups per row tile (1, 2 or 4), WG = 32·RT·NQ
// threads in NSG = RT·NQ subgroups of exactly 32 lanes (the host checks), NT = D / 16 and
// NK = BN / 16 matrix tiles, NTQ = NT / NQ and NKQ = NK / NQ of them per subgroup, LPR =
// 2·NQ softmax lanes per row (LOG_LPR = log2 LPR) taking KH = BN / LPR keys each, RPW =
// 16 / NQ rows per subgroup in the softmax, KV_ROWS = max(BM, BN) (kv_s stages the Q tile
// first), row strides KS (f16, of kv_s), SS (f32, of s_s) and PS (f16, of p_s), each a
// multiple of 16 bytes, LPT and the raw-word helpers of attention_chunks.wgsl (KV_RAW =
// vec4<f16>) and COOP_TAU.
//
// Algorithm (FlashAttention-2 with a lazy rescale). Subgroup g has row tile g / NQ (rows
// row0 .. row0 + 15) and part q = g % NQ: it holds the tile's Q in NT A-matrices and the
// output columns q·NTQ·16 .. + NTQ·16 of its rows in NTQ f32 C-matrices `o` for the whole
// item. Per chunk of BN keys:
//   K words -> kv_s, barrier; issue the chunk's V loads;
//   phase A: S = Q·K^T for the tile's key tiles q·NKQ .. + NKQ (NT multiply-adds each),
//   stored to s_s; barrier;
//   V words -> kv_s (over K); softmax of rows row0 + q·RPW .. + RPW (LPR lanes per row,
//   reduced with shuffles): modifiers, mask, the row's reference maximum m, P = exp(s − m)
//   as f16 into p_s, l += Σ P; barrier (the uniform load of the rescale flag);
//   issue the next chunk's K loads; phase C: o += P·V (NTQ·NK multiply-adds); barrier.
// Why NQ subgroups per row tile: with one, a subgroup keeps all NT output matrices (64
// registers at D = 128) and the driver gives it 255 registers, two 128-thread workgroups per
// SM; split four ways (126 registers, 512 threads) the SM runs 16 subgroups and the H200
// goes from 26.5 to 57.9 TFLOP/s (P2 f16, 32k tokens).
// Why the lazy rescale: a cooperative matrix is opaque (no lane knows which row an element
// belongs to), so o cannot be multiplied by a per-row α in registers. The reference maximum
// m of a row therefore only moves when a chunk's maximum exceeds it by more than TAU (or
// before the row's first visible key, while its o is still zero); then α = exp(m_old −
// m_new) and every subgroup rescales its o through workgroup memory (store, scale rows,
// load: a rare path, taken when any row of the workgroup needs it). Between moves P ≤
// exp(TAU) ≈ 2981, well inside f16, with f16's relative precision; l and o accumulate in
// f32. The result is the same softmax: out = o / l, LSE = m + ln l for whatever reference m
// the row ended with.
//
// Layout: as paged_attention.wgsl (items, q / out [tokens, H, D], lse, scratch partials with
// (m, l) from ml_offset). Workgroup memory: kv_s holds the scaled Q tile at the start (rows
// at r·KS, for the A-matrices), then each chunk's K and V (key j at j·KS); s_s the f32
// scores (row r at r·SS), later the per-subgroup 16×16 staging tiles of the rescale and the
// epilogue (subgroup g at g·256); p_s the f16 probabilities (row r at r·PS). Every
// workgroup variable is a multiple of 16 bytes (a unit test checks): drivers lay them out
// back to back in an order of their choosing, and cooperative loads / stores need 16-byte
// aligned rows (on the H200, a lone 4-byte variable ahead of the f16 arrays made every
// matrix load read 4 bytes early).
//
// Bounds: every index stays inside its array: rows < BM, keys < BN, columns < D; staging
// g·256 + 255 < BM·SS (the host asks NSG·256 ≤ BM·SS, `coop_split_fits`); matrix loads /
// stores touch 16 rows × 16 columns from offsets that leave room for them (row0 + 15 < BM,
// key0 + 15 < BN, col0 + 15 < D). Keys ≥ cn have zero K / V words and zero probabilities;
// rows ≥ n_rows have zero queries, zero probabilities and are never stored.

var<workgroup> kv_s: array<f16, KV_ROWS * KS>;
var<workgroup> s_s: array<f32, BM * SS>;
var<workgroup> p_s: array<f16, BM * PS>;
// Reference maxima and "has seen a visible key" flags, two halves by chunk parity (chunk ci
// writes half ci & 1 and reads the other: the two lanes of a row never race).
var<workgroup> m_s: array<f32, 2 * BM>;
var<workgroup> seen_s: array<u32, 2 * BM>;
var<workgroup> l_s: array<f32, BM>;
var<workgroup> a_s: array<f32, BM>;
var<workgroup> pos_s: array<u32, BM>;
var<workgroup> head_s: array<u32, BM>;
// 1 when a row of the tile needs its output rescaled this chunk (reset after the check);
// element 0 is used. Four words, not one: see "every workgroup variable" above.
var<workgroup> rescale_a: array<atomic<u32>, 4>;

// A reference maximum moves only when exceeded by more than this (P ≤ exp(TAU)).
const TAU: f32 = COOP_TAU;

struct Inputs {
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
}

// The raw K or V words of a chunk (attention_chunks.wgsl) into kv_s, key j at j·KS.
fn coop_store_chunk(t: u32, w_in: array<KV_RAW, LPT>) {
    var w = w_in;
    // @unroll
    for (var i = 0u; i < LPT; i = i + 1u) {
        let u = t + i * WG;
        if u < BN * D4 {
            let e = (u / D4) * KS + (u % D4) * 4u;
            let x = w[i];
            kv_s[e] = x.x;
            kv_s[e + 1u] = x.y;
            kv_s[e + 2u] = x.z;
            kv_s[e + 3u] = x.w;
        }
    }
}

// Softmax of row r's keys h·KH .. (h+1)·KH of the chunk at c0 (cn keys) for part h of
// the LPR lanes of the row (lanes differing in their low log2(LPR) bits: the reductions
// are shuffles over those bits). Returns whether the row's output needs a rescale.
fn coop_softmax_row(r: u32, h: u32, c0: u32, cn: u32, par: u32) -> bool {
    let head = head_s[r];
    let live = head != NO_ROW;
    let p = pos_s[r];
    let j0 = h * KH;
    var x: array<f32, KH>;
    var mx = NO_MAX;
    var saw = false;
    // @unroll
    for (var i = 0u; i < KH; i = i + 1u) {
        let j = j0 + i;
        let o = live && j < cn && visible(p, c0 + j);
        var v = NO_MAX;
        if o {
            v = modify(s_s[r * SS + j] * s_scale(), head, p, c0 + j);
            mx = max(mx, v);
            saw = true;
        }
        x[i] = v;
    }
    // @unroll
    for (var i = 0u; i < LOG_LPR; i = i + 1u) {
        mx = max(mx, subgroupShuffleXor(mx, 1u << i));
    }
    let m_old = m_s[(par ^ 1u) * BM + r];
    let seen_old = seen_s[(par ^ 1u) * BM + r];
    var m_new = m_old;
    var rescale = false;
    if seen_old == 0u {
        m_new = max(m_old, mx);
    } else if mx > m_old + TAU {
        m_new = mx;
        rescale = true;
    }
    var sum = 0.0;
    // @unroll
    for (var i = 0u; i < KH; i = i + 1u) {
        var e = 0.0;
        if x[i] > NO_MAX {
            e = exp(x[i] - m_new);
        }
        sum = sum + e;
        p_s[r * PS + j0 + i] = f16(e);
    }
    var saw_any = u32(saw);
    // @unroll
    for (var i = 0u; i < LOG_LPR; i = i + 1u) {
        sum = sum + subgroupShuffleXor(sum, 1u << i);
        saw_any = saw_any | subgroupShuffleXor(saw_any, 1u << i);
    }
    let saw2 = saw_any != 0u;
    if h == 0u {
        var alpha = 1.0;
        if m_new != m_old {
            alpha = exp(m_old - m_new);
        }
        l_s[r] = l_s[r] * alpha + sum;
        a_s[r] = alpha;
        m_s[par * BM + r] = m_new;
        seen_s[par * BM + r] = select(seen_old, 1u, saw2);
    }
    return rescale;
}

@compute @workgroup_size(WG)
fn main(inp: Inputs) {
    let t = inp.t;
    // No early return for workgroups past the items (the dispatch rounds up): cooperative
    // matrix operations need uniform control flow, so such a workgroup runs item 0 with no
    // rows and no keys and stores nothing.
    let item_id = flat_group(inp.wid, inp.nwg);
    let valid = item_id < params.num_items;
    let item = select(0u, item_id, valid);
    let it = items[item];
    let kv_head = it.kv_head;
    let g = params.group;
    let H = params.num_heads;
    let hc = it.head_count;
    let n_rows = select(0u, it.q_len * hc, valid);
    let kv_lo = it.kv_lo;
    let kv_hi = it.kv_hi;
    let kv_row = item_kv_row(it);
    let direct = it.num_splits == 1u;
    let add_sink = it.split == 0u && (params.flags & SINKS) != 0u;
    let sg = inp.sg;
    let lane = inp.lane;
    // Subgroup sg: row tile sg / NQ (rows row0 .. row0 + 15), part q = sg % NQ of its keys
    // (phase A) and of its output columns (phase C).
    let row0 = (sg / NQ) * 16u;
    let q = sg % NQ;

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
        m_s[r] = m0;
        m_s[BM + r] = m0;
        if r == 0u {
            atomicStore(&rescale_a[0], 0u);
        }
        seen_s[r] = 0u;
        seen_s[BM + r] = 0u;
        l_s[r] = l0;
        a_s[r] = 1.0;
    }
    // Queries, scaled, as f16 rows of kv_s (zero past n_rows).
    for (var u = t; u < BM * D4; u = u + WG) {
        let r = u / D4;
        let c = u % D4;
        var v = vec4<f32>(0.0);
        if r < n_rows {
            let tok = it.q_start + r / hc;
            let head = kv_head * g + it.head_start + r % hc;
            v = q_load4((tok * H + head) * D + c * 4u) * q_scale();
        }
        let e = r * KS + c * 4u;
        kv_s[e] = f16(v.x);
        kv_s[e + 1u] = f16(v.y);
        kv_s[e + 2u] = f16(v.z);
        kv_s[e + 3u] = f16(v.w);
    }
    // A zero 16×16 tile in s_s, loaded as the zero C-matrix every accumulation starts from.
    // Why not `coop_mat16x16<f32, C>()`: naga emits OpConstantNull for it, which the H200's
    // driver (580) did not zero on every use: results grew chunk after chunk.
    for (var u = t; u < 256u; u = u + WG) {
        s_s[u] = 0.0;
    }
    workgroupBarrier();
    let zero_c = coopLoadT<coop_mat16x16<f32, C>>(&s_s[0], 16u);
    var qa: array<coop_mat16x16<f16, A>, NT>;
    var o: array<coop_mat16x16<f32, C>, NTQ>;
    // @unroll
    for (var n = 0u; n < NT; n = n + 1u) {
        qa[n] = coopLoadT<coop_mat16x16<f16, A>>(&kv_s[row0 * KS + n * 16u], KS);
    }
    // @unroll
    for (var n = 0u; n < NTQ; n = n + 1u) {
        o[n] = zero_c;
    }

    // Keys any row of the tile can see.
    let p_min = it.q_pos;
    let p_max = it.q_pos + it.q_len - 1u;
    let range = key_range(kv_lo, kv_hi, p_min, p_max);
    let lo = range.x;
    let hi = range.y;
    var kb: array<KB, LPT>;
    var raw: array<KV_RAW, LPT>;
    if lo < hi && valid {
        kb = chunk_bases(t, lo, min(BN, hi - lo), kv_head, kv_row);
        raw = chunk_raw(t, kb, min(BN, hi - lo), false);
    }
    // The Q tile is in registers: kv_s is free for K.
    workgroupBarrier();

    // Softmax lanes: LPR per row, rows row0 + q·RPW .. + RPW of the subgroup's row tile.
    let sm_row = row0 + q * RPW + lane / LPR;
    let sm_half = lane % LPR;
    let n_chunks = select(0u, (hi - lo + BN - 1u) / BN, lo < hi && valid);
    for (var ci = 0u; ci < n_chunks; ci = ci + 1u) {
        let c0 = lo + ci * BN;
        let cn = min(BN, hi - c0);
        let par = ci & 1u;
        coop_store_chunk(t, raw);
        workgroupBarrier();
        raw = chunk_raw(t, kb, cn, true);
        // Phase A: S = Q·K^T for the subgroup's 16 rows and its NKQ key tiles (16 keys per
        // C-matrix).
        // @unroll
        for (var kk = 0u; kk < NKQ; kk = kk + 1u) {
            let k = q * NKQ + kk;
            var sacc = zero_c;
            // @unroll
            for (var n = 0u; n < NT; n = n + 1u) {
                let kt = coopLoad<coop_mat16x16<f16, B>>(&kv_s[k * 16u * KS + n * 16u], KS);
                sacc = coopMultiplyAdd(qa[n], kt, sacc);
            }
            coopStoreT(sacc, &s_s[row0 * SS + k * 16u], SS);
        }
        workgroupBarrier();
        coop_store_chunk(t, raw);
        let rescale = coop_softmax_row(sm_row, sm_half, c0, cn, par);
        let any_rescale = subgroupAny(rescale);
        if lane == 0u && any_rescale {
            atomicOr(&rescale_a[0], 1u);
        }
        // The barrier after the softmax, and whether any subgroup must rescale (a value
        // uniform across the workgroup, as the branch below needs).
        let need = workgroupUniformLoad(&rescale_a[0]);
        // Rare: some row's reference maximum moved; every subgroup takes this path (the
        // barriers need the whole workgroup), those without such rows scale by 1.
        if need != 0u {
            // @unroll
            for (var n = 0u; n < NTQ; n = n + 1u) {
                coopStoreT(o[n], &s_s[sg * 256u], 16u);
                workgroupBarrier();
                // @unroll
                for (var e = 0u; e < 8u; e = e + 1u) {
                    let idx = lane * 8u + e;
                    s_s[sg * 256u + idx] = s_s[sg * 256u + idx] * a_s[row0 + idx / 16u];
                }
                workgroupBarrier();
                o[n] = coopLoadT<coop_mat16x16<f32, C>>(&s_s[sg * 256u], 16u);
                workgroupBarrier();
            }
            if t == 0u {
                atomicStore(&rescale_a[0], 0u);
            }
        }
        // The next chunk's K loads, in flight during phase C.
        let c1 = c0 + BN;
        if c1 < hi {
            kb = chunk_bases(t, c1, min(BN, hi - c1), kv_head, kv_row);
            raw = chunk_raw(t, kb, min(BN, hi - c1), false);
        }
        // Phase C: o += P·V.
        var pa: array<coop_mat16x16<f16, A>, NK>;
        // @unroll
        for (var k = 0u; k < NK; k = k + 1u) {
            pa[k] = coopLoadT<coop_mat16x16<f16, A>>(&p_s[row0 * PS + k * 16u], PS);
        }
        // @unroll
        for (var n = 0u; n < NTQ; n = n + 1u) {
            // @unroll
            for (var k = 0u; k < NK; k = k + 1u) {
                let vt = coopLoadT<coop_mat16x16<f16, B>>(&kv_s[k * 16u * KS + (q * NTQ + n) * 16u], KS);
                o[n] = coopMultiplyAdd(pa[k], vt, o[n]);
            }
        }
        workgroupBarrier();
    }
    // The half of m_s holding the final reference maxima (that of the last chunk; half 1,
    // which holds the initial values too, when there was none).
    let m_fin = ((n_chunks + 1u) & 1u) * BM;

    // Epilogue: each 16×16 output tile through the subgroup's staging tile; lane holds row
    // lane / 2, columns 8·(lane & 1) .. + 8 of it.
    let r = row0 + (lane >> 1u);
    let hh = lane & 1u;
    let live = r < n_rows;
    var l = 0.0;
    var m = NO_MAX;
    var head = 0u;
    var tok = 0u;
    if live {
        l = l_s[r];
        m = m_s[m_fin + r];
        head = head_s[r];
        tok = it.q_start + r / hc;
    }
    // @unroll
    for (var n = 0u; n < NTQ; n = n + 1u) {
        coopStoreT(o[n], &s_s[sg * 256u], 16u);
        workgroupBarrier();
        if live {
            let st = sg * 256u + lane * 8u;
            let lo4 = vec4<f32>(s_s[st], s_s[st + 1u], s_s[st + 2u], s_s[st + 3u]);
            let hi4 = vec4<f32>(s_s[st + 4u], s_s[st + 5u], s_s[st + 6u], s_s[st + 7u]);
            let col = (q * NTQ + n) * 16u + hh * 8u;
            if direct {
                var a = vec4<f32>(0.0);
                var b = vec4<f32>(0.0);
                if l > 0.0 {
                    a = lo4 / l;
                    b = hi4 / l;
                }
                out_store4((tok * H + head) * D + col, a);
                out_store4((tok * H + head) * D + col + 4u, b);
            } else {
                let prow = partial_row(it, r, head);
                scratch[prow * D4 + col / 4u] = lo4;
                scratch[prow * D4 + col / 4u + 1u] = hi4;
            }
        }
        workgroupBarrier();
    }
    if live && hh == 0u && q == 0u {
        if direct {
            if (params.flags & WRITE_LSE) != 0u {
                var bits = NEG_INF_BITS;
                if l > 0.0 {
                    bits = bitcast<u32>(m + log(l));
                }
                lse[head * params.num_tokens + tok] = bits;
            }
        } else {
            let prow = partial_row(it, r, head);
            scratch[params.ml_offset + prow] = vec4<f32>(m, l, 0.0, 0.0);
        }
    }
}
