// paged_decode.wgsl — split-KV decode over the paged KV cache (flash-decoding), for work
// items of at most ROWS query rows (decode and short speculative-decode queries), used when
// the adapter has subgroup operations. Same work items, flags, scratch layout and combine
// pass (combine_splits.wgsl) as paged_attention.wgsl; it differs in how one workgroup
// walks its keys.
//
// Algorithm: workgroup x + z·65535 runs work item x + z·65535 (a `WorkItem`, see
// attention_common.wgsl), one KV head's part of a tile; the planner lists the Hkv items of a
// tile and split side by side, so they are dispatched together and read the same cache
// blocks at the same time (one block holds every head's keys: the pages and DRAM rows it
// touches serve all of them). The item's n_rows ≤ ROWS query rows (row r is token
// q_start + r / head_count, query head kv_head·g + head_start + r % head_count) run against
// its key range, so every key and value is read once for all the query heads that share it. The WG invocations form
// NKG = WG / TPK key groups of TPK lanes; lanes of a key group lie in one subgroup (TPK
// divides the subgroup size, both powers of two; kg and the lane come from subgroup_id and
// subgroup_invocation_id, not from the local index). Key group kg takes keys
// it + kg·U .. it + kg·U + U − 1 of every step of NKG·U keys. Lane c of a key group owns
// granules c, c + TPK, … (GPT of them) of a K or V row: a granule (`Gran`) is G = 8 elements
// of a 16- or 8-bit cache (a 16-byte vec4<u32> for f16/bf16, an 8-byte vec2<u32> for fp8, so
// both have the same lanes per key and registers per lane) or 4 f32 (a vec4<u32>), loaded
// whole. Per step a lane
//   1. issues the 2·U·GPT granule loads of its keys' K and V, then the block-table reads of
//      the keys it loads next (they overlap the loads in flight; one read for all U keys when
//      they share a block: the range starts at a multiple of U and U divides the block
//      size); those loads are the next step's, issued before this step's granules (loaded
//      one step earlier) are used, so two steps of loads are in flight while it computes;
//   2. forms partial dot products of its query granules (registers, pre-scaled by
//      scale·k_scale) with each key, and sums them over the TPK lanes with
//      subgroupShuffleXor (log2 TPK steps);
//   3. updates its key group's own online softmax per row — soft cap, ALiBi, mask, running
//      max m, denominator l, acc = acc·exp(m_old − m) + Σ p·V — all in registers, with no
//      barrier and no workgroup memory in the loop. A step whose keys every row sees
//      (`unmasked_range`) with neither soft cap nor ALiBi skips the per-key range, mask and
//      modifier code (most steps of a decode).
// The TPK lanes of a key group all run the same softmax (the all-reduce leaves every score
// in every lane): redundant work, which is why the short form matters.
// Key group 0 of the item that carries the sink flag starts its rows at m = sink, l = 1.
// At the end the NKG states merge through workgroup memory (M = max m, L = Σ l·e^(m − M),
// acc = Σ acc·e^(m − M), times v_scale), row by row; then out = acc / L and LSE = M + ln L
// (natural log; 0 and −inf when L = 0), or, for a split item, (acc, M, L) go to `scratch`
// for combine_splits.wgsl.
//
// Specialisation (generated header, see `DecodeShader` in src/kernels/wgsl/attention.rs):
// D, D4 = D / 4, G, V4G = G / 4, NG = D / G, TPK, LOG_TPK, GPT = ceil(NG / TPK),
// QV = GPT·V4G, WG, NKG = WG / TPK, U, ROWS, FULL (1 when TPK divides NG:
// no lane is ever past the last granule, the masks fold away); the granule type `Gran`;
// `q_load4` / `out_store4` for the query dtype; `unpack4(w, i)`, the i-th four elements of a
// granule as f32 (exact integer unpacking, common.wgsl). Loops marked `// @unroll` (all over
// those constants) are unrolled by the generator (`unroll` in src/kernels/wgsl/preprocess.rs): every per-thread array
// (queries, accumulators, loaded granules, scores) is then indexed by constants only and
// lives in registers.
//
// Layout: as paged_attention.wgsl (partials at `partial_row`); the cache's words are
// granules (`Gran`), read by the generated `kv_word` from one buffer or from the chunk of a
// cache stored in chunks.
//
// Bounds relied on: the host uses this kernel only when the cache's element strides (block,
// K→V, token, head) and D are multiples of G and the cache buffer is a whole number of
// granules, so every granule address is aligned; items come from validated metadata (keys <
// seq_len ≤ width·block_size, block ids < the cache's blocks, tokens < the query's rows,
// n_rows ≤ ROWS, partial rows < the scratch's). Keys past the range read the granules of key
// hi − 1 (inside the buffer); lanes past the last granule (NG not a multiple of TPK)
// re-read granule NG − 1; rows ≥ n_rows are never loaded or stored.
//
// Stale cache contents: any slot the item may not read (block 0, the tail of a last block,
// keys outside every row's window) may hold NaN or ±inf, and p = 0 times inf is still NaN,
// so no such slot is ever loaded: a key past the range loads the item's last key hi − 1
// instead (`key_bases` clamps it), and its score is never used (the softmax takes only keys that are
// in range and visible, and gives the rest p = 0 by assignment). Every key of [lo, hi) is
// visible to some row (the rows are consecutive positions, and the union of their causal /
// window intervals is the range `key_range` returns), so it is the request's own data.

@group(0) @binding(3) var<storage, read> block_table: array<i32>;

// The K and V granules of one step's U keys (this lane's GPT granules of each).
struct Granules {
    kgr: array<Gran, U * GPT>,
    vgr: array<Gran, U * GPT>,
}

var<workgroup> red_s: array<vec4<f32>, NKG * D4>;
var<workgroup> ml_s: array<vec2<f32>, NKG * ROWS>;

// Address of key `pos`'s K row for `kv_head` (kb_add kv_stride for V). Power-of-two
// block sizes (all of vLLM's) take a shift and a mask instead of a division.
fn key_base(pos: u32, kv_head: u32, kv_row: u32) -> KB {
    var b = 0u;
    var off = 0u;
    if params.block_shift < 32u {
        b = pos >> params.block_shift;
        off = pos & (params.block_size - 1u);
    } else {
        b = pos / params.block_size;
        off = pos % params.block_size;
    }
    let blk = u32(block_table[kv_row + b]);
    return kv_addr(blk, off * params.tok_stride + kv_head * params.head_stride);
}

// Element bases of keys j0 .. j0 + U − 1, each key clamped to `last` = hi − 1 (the item's
// own last key, which it reads anyway, so a key past the range never loads a slot that may
// hold stale NaN / inf). Branch-free: a key group wholly inside the range gets its own keys,
// one crossing `hi` gets its keys up to hi − 1 and then hi − 1 again, one past it hi − 1 for
// all U. With `one_block` (j0 is a multiple of U and U divides the block size, so the U
// clamped keys share a block: hi − 1 ≥ j0 lies in j0's block, or all of them are hi − 1)
// one block-table read serves all of them. Needs hi ≥ 1 (the caller runs it only when
// lo < hi).
fn key_bases(j0: u32, last: u32, kv_head: u32, kv_row: u32, one_block: bool) -> array<KB, U> {
    var kb: array<KB, U>;
    if one_block {
        let jc = min(j0, last);
        let b0 = key_base(jc, kv_head, kv_row);
        // @unroll
        for (var u = 0u; u < U; u = u + 1u) {
            kb[u] = kb_add(b0, (min(j0 + u, last) - jc) * params.tok_stride);
        }
        return kb;
    }
    // @unroll
    for (var u = 0u; u < U; u = u + 1u) {
        kb[u] = key_base(min(j0 + u, last), kv_head, kv_row);
    }
    return kb;
}

// The keys of [lo, hi) that every query at positions p_min..=p_max sees (no mask needed
// there): the complement of what `visible` can hide. Returns hi <= lo when none.
fn unmasked_range(lo: u32, hi: u32, p_min: u32, p_max: u32) -> vec2<u32> {
    var a = lo;
    var b = hi;
    if (params.flags & CAUSAL) != 0u {
        b = min(b, p_min + 1u);
    }
    if (params.flags & WINDOW) != 0u {
        if p_max + 1u > params.window {
            a = max(a, p_max + 1u - params.window);
        }
        if (params.flags & CAUSAL) == 0u {
            b = min(b, p_min + params.window);
        }
    }
    return vec2<u32>(a, b);
}

// Lane c's granules of the keys at element bases `kb` (lanes past the last granule re-read
// granule NG − 1; the scores and P·V mask them).
fn load_step(kb: array<KB, U>, c: u32) -> Granules {
    var g: Granules;
    // @unroll
    for (var u = 0u; u < U; u = u + 1u) {
        // @unroll
        for (var k = 0u; k < GPT; k = k + 1u) {
            let gi = min(c + k * TPK, NG - 1u);
            g.kgr[u * GPT + k] = kv_word(kb_add(kb[u], gi * G));
            g.vgr[u * GPT + k] = kv_word(kb_add(kb[u], params.kv_stride + gi * G));
        }
    }
    return g;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_id) sg_id: u32,
) {
    // The planner lists the Hkv items of one tile and split side by side, so they start
    // together and walk the same blocks.
    let item = flat_group(wid, nwg);
    if item >= params.num_items {
        return;
    }
    // The item's fields, reduced to what the kernel keeps: the first token and position, the
    // first query head, the heads per token, and the first scratch row of its partials
    // (DIRECT: the item writes the output) — as few live values as the key loop allows.
    let wi = items[item];
    let kv_head = wi.kv_head;
    let g = params.group;
    let H = params.num_heads;
    let hc = wi.head_count;
    let n_rows = min(wi.q_len * hc, ROWS);
    let kv_lo = wi.kv_lo;
    let kv_hi = wi.kv_hi;
    let kv_row = item_kv_row(wi);
    let tok0 = wi.q_start;
    let pos0 = wi.q_pos;
    let head0 = kv_head * g + wi.head_start;
    let part0 = select(wi.split * params.n_part_tokens + wi.part_tok, DIRECT, wi.num_splits == 1u);
    let add_sink = wi.split == 0u && (params.flags & SINKS) != 0u;

    let kg = sg_id * (sg_size / TPK) + lane / TPK;
    let c = lane % TPK;

    // Rows: query head, position; queries (pre-scaled) in registers; running statistics.
    var head: array<u32, ROWS>;
    var pos: array<u32, ROWS>;
    var qv: array<vec4<f32>, ROWS * QV>;
    var m: array<f32, ROWS>;
    var l: array<f32, ROWS>;
    var acc: array<vec4<f32>, ROWS * QV>;
    let qscale = params.scale * params.k_scale;
    // @unroll
    for (var r = 0u; r < ROWS; r = r + 1u) {
        let rr = min(r, n_rows - 1u);
        head[r] = head0 + rr % hc;
        pos[r] = pos0 + rr / hc;
        let tok = tok0 + rr / hc;
        m[r] = NO_MAX;
        l[r] = 0.0;
        if add_sink && kg == 0u && r < n_rows {
            m[r] = layer[H + head[r]];
            l[r] = 1.0;
        }
        // @unroll
        for (var k = 0u; k < GPT; k = k + 1u) {
            let gi = c + k * TPK;
            // @unroll
            for (var i = 0u; i < V4G; i = i + 1u) {
                var v = vec4<f32>(0.0);
                if r < n_rows && gi < NG {
                    v = q_load4((tok * H + head[r]) * D + gi * G + i * 4u) * qscale;
                }
                qv[r * QV + k * V4G + i] = v;
                acc[r * QV + k * V4G + i] = vec4<f32>(0.0);
            }
        }
    }

    let p_min = pos0;
    let p_max = pos0 + (n_rows - 1u) / hc;
    let range = key_range(kv_lo, kv_hi, p_min, p_max);
    let lo = range.x;
    let hi = range.y;
    let STEP = NKG * U;
    // Steps inside `plain` need no mask and no logit modifier: their softmax skips both.
    let plain = unmasked_range(lo, hi, p_min, p_max);
    let no_modifier = (params.flags & (SOFT_CAP | ALIBI)) == 0u;
    let one_block = lo % U == 0u && params.block_size % U == 0u;

    // Element bases of the keys whose granules load next. The granules of step `it` + STEP
    // load while step `it` is computed (two steps of loads in flight).
    let last = hi - 1u;
    var kb: array<KB, U>;
    var nxt: Granules;
    if lo < hi {
        kb = key_bases(lo + kg * U, last, kv_head, kv_row, one_block);
        nxt = load_step(kb, c);
        kb = key_bases(lo + STEP + kg * U, last, kv_head, kv_row, one_block);
    }

    for (var it = lo; it < hi; it = it + STEP) {
        // 1. Loads: the next step's K and V granules (this step's were loaded one step
        //    earlier), then the addresses of the step after (their block-table reads overlap
        //    the loads).
        var cur = nxt;
        if it + STEP < hi {
            nxt = load_step(kb, c);
        }
        kb = key_bases(it + 2u * STEP + kg * U, last, kv_head, kv_row, one_block);

        // 2. Scores: partial dots over this lane's granules, summed over the key's lanes.
        var s: array<f32, U * ROWS>;
        // @unroll
        for (var u = 0u; u < U; u = u + 1u) {
            var kf: array<vec4<f32>, QV>;
            // @unroll
            for (var k = 0u; k < GPT; k = k + 1u) {
                let live = FULL == 1u || c + k * TPK < NG;
                // @unroll
                for (var i = 0u; i < V4G; i = i + 1u) {
                    kf[k * V4G + i] = select(vec4<f32>(0.0), unpack4(cur.kgr[u * GPT + k], i), live);
                }
            }
            // @unroll
            for (var r = 0u; r < ROWS; r = r + 1u) {
                var d = 0.0;
                // @unroll
                for (var x = 0u; x < QV; x = x + 1u) {
                    d = d + dot(qv[r * QV + x], kf[x]);
                }
                s[u * ROWS + r] = d;
            }
        }
        // @unroll
        for (var lv = 0u; lv < LOG_TPK; lv = lv + 1u) {
            let o = TPK >> (lv + 1u);
            // @unroll
            for (var x = 0u; x < U * ROWS; x = x + 1u) {
                s[x] = s[x] + subgroupShuffleXor(s[x], o);
            }
        }

        // 3. Online softmax per row, then acc += P·V. A step whose keys are all in range,
        //    visible to every row and unmodified (the common case) takes the short form.
        if no_modifier && it >= plain.x && it + STEP <= plain.y {
            // @unroll
            for (var r = 0u; r < ROWS; r = r + 1u) {
                if r < n_rows {
                    let m_old = m[r];
                    var mx = m_old;
                    // @unroll
                    for (var u = 0u; u < U; u = u + 1u) {
                        mx = max(mx, s[u * ROWS + r]);
                    }
                    var sum = 0.0;
                    // @unroll
                    for (var u = 0u; u < U; u = u + 1u) {
                        let p = exp(s[u * ROWS + r] - mx);
                        s[u * ROWS + r] = p;
                        sum = sum + p;
                    }
                    let alpha = exp(m_old - mx);
                    m[r] = mx;
                    l[r] = l[r] * alpha + sum;
                    // @unroll
                    for (var x = 0u; x < QV; x = x + 1u) {
                        acc[r * QV + x] = acc[r * QV + x] * alpha;
                    }
                } else {
                    // @unroll
                    for (var u = 0u; u < U; u = u + 1u) {
                        s[u * ROWS + r] = 0.0;
                    }
                }
            }
        } else {
            // @unroll
            for (var r = 0u; r < ROWS; r = r + 1u) {
                if r < n_rows {
                    let m_old = m[r];
                    var mx = m_old;
                    var live = 0u;
                    // @unroll
                    for (var u = 0u; u < U; u = u + 1u) {
                        let j = it + kg * U + u;
                        if j < hi && visible(pos[r], j) {
                            let sv = modify(s[u * ROWS + r], head[r], pos[r], j);
                            s[u * ROWS + r] = sv;
                            mx = max(mx, sv);
                            live = live | (1u << u);
                        }
                    }
                    var sum = 0.0;
                    // @unroll
                    for (var u = 0u; u < U; u = u + 1u) {
                        var p = 0.0;
                        if (live & (1u << u)) != 0u {
                            p = exp(s[u * ROWS + r] - mx);
                        }
                        s[u * ROWS + r] = p;
                        sum = sum + p;
                    }
                    let alpha = exp(m_old - mx);
                    m[r] = mx;
                    l[r] = l[r] * alpha + sum;
                    // @unroll
                    for (var x = 0u; x < QV; x = x + 1u) {
                        acc[r * QV + x] = acc[r * QV + x] * alpha;
                    }
                } else {
                    // @unroll
                    for (var u = 0u; u < U; u = u + 1u) {
                        s[u * ROWS + r] = 0.0;
                    }
                }
            }
        }
        // @unroll
        for (var u = 0u; u < U; u = u + 1u) {
            // @unroll
            for (var k = 0u; k < GPT; k = k + 1u) {
                let live = FULL == 1u || c + k * TPK < NG;
                // @unroll
                for (var i = 0u; i < V4G; i = i + 1u) {
                    let vv = select(vec4<f32>(0.0), unpack4(cur.vgr[u * GPT + k], i), live);
                    // @unroll
                    for (var r = 0u; r < ROWS; r = r + 1u) {
                        acc[r * QV + k * V4G + i] = acc[r * QV + k * V4G + i]
                            + s[u * ROWS + r] * vv;
                    }
                }
            }
        }
    }

    // Merge the key groups' states, row by row (n_rows is uniform: the barriers are too).
    if c == 0u {
        // @unroll
        for (var r = 0u; r < ROWS; r = r + 1u) {
            ml_s[kg * ROWS + r] = vec2<f32>(m[r], l[r]);
        }
    }
    workgroupBarrier();
    // @unroll
    for (var r = 0u; r < ROWS; r = r + 1u) {
        if r < n_rows {
            var big_m = NO_MAX;
            for (var q = 0u; q < NKG; q = q + 1u) {
                big_m = max(big_m, ml_s[q * ROWS + r].x);
            }
            var big_l = 0.0;
            for (var q = 0u; q < NKG; q = q + 1u) {
                let ml = ml_s[q * ROWS + r];
                big_l = big_l + ml.y * exp(ml.x - big_m);
            }
            let f = exp(m[r] - big_m) * params.v_scale;
            // @unroll
            for (var k = 0u; k < GPT; k = k + 1u) {
                let gi = c + k * TPK;
                if gi < NG {
                    // @unroll
                    for (var i = 0u; i < V4G; i = i + 1u) {
                        red_s[kg * D4 + gi * V4G + i] = acc[r * QV + k * V4G + i] * f;
                    }
                }
            }
            workgroupBarrier();
            let tok = tok0 + r / hc;
            for (var col = t; col < D4; col = col + WG) {
                var o = vec4<f32>(0.0);
                for (var q = 0u; q < NKG; q = q + 1u) {
                    o = o + red_s[q * D4 + col];
                }
                if part0 == DIRECT {
                    var res = vec4<f32>(0.0);
                    if big_l > 0.0 {
                        res = o / big_l;
                    }
                    out_store4((tok * H + head[r]) * D + col * 4u, res);
                    if col == 0u && (params.flags & WRITE_LSE) != 0u {
                        var bits = NEG_INF_BITS;
                        if big_l > 0.0 {
                            bits = bitcast<u32>(big_m + log(big_l));
                        }
                        lse[head[r] * params.num_tokens + tok] = bits;
                    }
                } else {
                    let prow = (part0 + r / hc) * H + head[r];
                    scratch[prow * D4 + col] = o;
                    if col == 0u {
                        scratch[params.ml_offset + prow] = vec4<f32>(big_m, big_l, 0.0, 0.0);
                    }
                }
            }
            workgroupBarrier();
        }
    }
}
