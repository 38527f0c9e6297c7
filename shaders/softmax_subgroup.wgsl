// softmax_subgroup.wgsl — phase B of paged_attention.wgsl with subgroup operations (used
// when the adapter has SUBGROUP): one subgroup per query row, lanes striding over the
// chunk's keys, the row max and sum reduced with subgroupMax / subgroupAdd. Works for any
// subgroup size (4 to 128); lanes past the chunk contribute the identities.
//
// Layout and bounds: as softmax_serial.wgsl (r < BM, j < cn ≤ BN). Control flow around the
// reductions is uniform within a subgroup (the row loop depends only on subgroup_id).
// (No `enable subgroups;`: naga 30 rejects it; the SUBGROUP feature gates the builtins.)

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
                s_s[r * S_ROW + j] = 0.0;
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
                let s = modify(s_s[r * S_ROW + j], head, p, kp);
                s_s[r * S_ROW + j] = s;
                mx_lane = max(mx_lane, s);
            }
        }
        let mx = max(m_old, subgroupMax(mx_lane));
        var sum_lane = 0.0;
        for (var j = inp.lane; j < cn; j = j + inp.sg_size) {
            let kp = c0 + j;
            var e = 0.0;
            if visible(p, kp) {
                e = exp(s_s[r * S_ROW + j] - mx);
            }
            s_s[r * S_ROW + j] = e;
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
