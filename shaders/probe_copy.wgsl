// probe_copy.wgsl — the bandwidth ceiling of `polyattn bench` on wgpu: dst = src, 16 bytes
// per thread per step, a grid-stride loop over the whole buffer (read + write both count).
//
// Layout: src and dst are arrays of vec4<f32> of equal length.
// Bounds: i < arrayLength(&src) ≤ arrayLength(&dst) (the host binds equal sizes).

@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let n = min(arrayLength(&src), arrayLength(&dst));
    let stride = nwg.x * nwg.z * 256u;
    for (var i = flat_group(wid, nwg) * 256u + t; i < n; i = i + stride) {
        dst[i] = src[i];
    }
}
