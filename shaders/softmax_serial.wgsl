// softmax_serial.wgsl — phase B of paged_attention.wgsl without subgroup operations: one
// thread per query row walks the chunk's scores twice (modify + max, then exp + sum).
//
// Layout: s_s[r·S_ROW + j] holds the chunk's scaled logits on entry and the unnormalised
// probabilities exp(s − m_new) on exit (0 for masked keys and unused rows); m_s, l_s are the
// running max and denominator, a_s receives α = exp(m_old − m_new).
// Bounds: r < BM, j < cn ≤ BN.
//
// Also the lane helpers of paged_attention.wgsl's tiled2 form, which without subgroups
// runs with one lane per row group (KL = 1): `vthread` is the local index and the
// reductions over a row group's lanes are the identity.

struct Inputs {
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
}

fn softmax_rows(inp: Inputs, c0: u32, cn: u32) {
    for (var r = inp.t; r < BM; r = r + WG) {
        let head = head_s[r];
        if head == NO_ROW {
            for (var j = 0u; j < cn; j = j + 1u) {
                s_set(r * S_ROW + j, 0.0);
            }
            a_s[r] = 1.0;
            continue;
        }
        let p = pos_s[r];
        let m_old = m_s[r];
        var mx = m_old;
        for (var j = 0u; j < cn; j = j + 1u) {
            let kp = c0 + j;
            if visible(p, kp) {
                let s = modify(s_get(r * S_ROW + j), head, p, kp);
                s_set(r * S_ROW + j, s);
                mx = max(mx, s);
            }
        }
        var sum = 0.0;
        for (var j = 0u; j < cn; j = j + 1u) {
            let kp = c0 + j;
            var e = 0.0;
            if visible(p, kp) {
                e = exp(s_get(r * S_ROW + j) - mx);
            }
            s_set(r * S_ROW + j, e);
            sum = sum + e;
        }
        let alpha = exp(m_old - mx);
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = mx;
        a_s[r] = alpha;
    }
}

fn vthread(inp: Inputs) -> u32 {
    return inp.t;
}

fn lanes_max(x: f32) -> f32 {
    return x;
}

fn lanes_sum(x: f32) -> f32 {
    return x;
}
