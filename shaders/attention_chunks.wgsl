// attention_chunks.wgsl — the K / V staging of paged_attention.wgsl's tiled2 forms and of
// paged_attention_coop.wgsl: each thread computes the element bases of the keys it loads
// (`chunk_bases`) and loads their raw words (`chunk_raw`) into registers, so the global
// loads of a chunk are in flight while the workgroup computes on the previous one.
//
// Layout: a chunk of BN keys is BN·D4 vec4 words; load i of thread t covers word
// u = t + i·WG (key u / D4, vec4 column u % D4), i < LPT = ⌈BN·D4 / WG⌉.
// Bounds: keys ≥ cn are never loaded (their words are zero, 0.0 in every dtype); the bases
// come from `key_base_fast` (block table rows validated on the host).

// Element bases of the keys this thread loads for the chunk at c0 (cn keys): load
// i covers vec4 u = t + i·WG of the chunk's BN·D4, key u / D4 (0 for keys ≥ cn, never read).
fn chunk_bases(t: u32, c0: u32, cn: u32, kv_head: u32, kv_row: u32) -> array<KB, LPT> {
    var kb: array<KB, LPT>;
    // @unroll
    for (var i = 0u; i < LPT; i = i + 1u) {
        let j = (t + i * WG) / D4;
        var b = KB();
        if j < cn {
            b = key_base_fast(c0 + j, kv_head, kv_row);
        }
        kb[i] = b;
    }
    return kb;
}

// This thread's raw words of the chunk's keys (`v`: values) at the bases `kb`;
// zero words (0.0 in every dtype) for keys ≥ cn.
fn chunk_raw(t: u32, kb_in: array<KB, LPT>, cn: u32, v: bool) -> array<KV_RAW, LPT> {
    var kb = kb_in;
    var w: array<KV_RAW, LPT>;
    // @unroll
    for (var i = 0u; i < LPT; i = i + 1u) {
        let u = t + i * WG;
        var x = KV_RAW();
        if u / D4 < cn {
            let e = kb_add(kb[i], (u % D4) * 4u);
            if v {
                x = v_raw4(e);
            } else {
                x = k_raw4(e);
            }
        }
        w[i] = x;
    }
    return w;
}

