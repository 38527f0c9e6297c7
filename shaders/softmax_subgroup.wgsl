// softmax_subgroup.wgsl — phase B of paged_attention.wgsl with subgroup operations (used
// when the adapter has SUBGROUP): one subgroup per query row, lanes striding over the
// chunk's keys, the row max and sum reduced with subgroupMax / subgroupAdd. Works for any
// subgroup size (4 to 128); lanes past the chunk contribute the identities.
//
// Layout and bounds: as softmax_serial.wgsl (r < BM, j < cn ≤ BN). Control flow around the
// reductions is uniform within a subgroup (the row loop depends only on subgroup_id).
// (No `enable subgroups;`: naga 30 rejects it; the SUBGROUP feature gates the builtins.)
//
// Also the lane helpers of paged_attention.wgsl's tiled2 form: `vthread` numbers the
// invocations subgroup by subgroup (subgroup_id · size + lane, a permutation of the local
// indices when every subgroup but the last is full), so the KL lanes of a phase-A row group
// (KL a power of two ≤ the smallest subgroup size: the host's choice) are adjacent lanes of
// one subgroup; `lanes_max` / `lanes_sum` reduce over them with LOG_KL subgroupShuffleXor
// steps (every lane of the group ends with the result).

struct Inputs {
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
}

fn softmax_rows(inp: Inputs, c0: u32, cn: u32) {
    for (var r = inp.sg_id; r < BM; r = r + inp.n_sg) {
        let head = head_s[r];
        if head == NO_ROW {
            for (var j = inp.lane; j < cn; j = j + inp.sg_size) {
                s_set(r * S_ROW + j, 0.0);
            }
            if inp.lane == 0u {
                a_s[r] = 1.0;
            }
            continue;
        }
        let p = pos_s[r];
        let m_old = m_s[r];
        var mx_lane = NO_MAX;
        for (var j = inp.lane; j < cn; j = j + inp.sg_size) {
            let kp = c0 + j;
            if visible(p, kp) {
                let s = modify(s_get(r * S_ROW + j), head, p, kp);
                s_set(r * S_ROW + j, s);
                mx_lane = max(mx_lane, s);
            }
        }
        let mx = max(m_old, subgroupMax(mx_lane));
        var sum_lane = 0.0;
        for (var j = inp.lane; j < cn; j = j + inp.sg_size) {
            let kp = c0 + j;
            var e = 0.0;
            if visible(p, kp) {
                e = exp(s_get(r * S_ROW + j) - mx);
            }
            s_set(r * S_ROW + j, e);
            sum_lane = sum_lane + e;
        }
        let sum = subgroupAdd(sum_lane);
        if inp.lane == 0u {
            let alpha = exp(m_old - mx);
            l_s[r] = l_s[r] * alpha + sum;
            m_s[r] = mx;
            a_s[r] = alpha;
        }
    }
}

fn vthread(inp: Inputs) -> u32 {
    return inp.sg_id * inp.sg_size + inp.lane;
}

fn lanes_max(x: f32) -> f32 {
    var y = x;
    // @unroll
    for (var i = 0u; i < LOG_KL; i = i + 1u) {
        y = max(y, subgroupShuffleXor(y, 1u << i));
    }
    return y;
}

fn lanes_sum(x: f32) -> f32 {
    var y = x;
    // @unroll
    for (var i = 0u; i < LOG_KL; i = i + 1u) {
        y = y + subgroupShuffleXor(y, 1u << i);
    }
    return y;
}
