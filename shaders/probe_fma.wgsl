// probe_fma.wgsl — the compute ceiling of `polyattn bench` on wgpu: f32 fused multiply-adds
// (the attention kernels compute in f32 whatever they store), 8 independent vec4 chains per
// thread so that latency hides: 64 FLOP per thread per iteration.
//
// Layout: params.x = iterations; dst has one vec4 per thread (keeps the chains live).
// Bounds: the host sizes dst for every thread of the dispatch.

@group(0) @binding(0) var<uniform> params: vec4<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let id = flat_group(wid, nwg) * 256u + t;
    let x = f32(id & 1023u) * 1.0e-3;
    var a0 = vec4<f32>(x, x + 0.1, x + 0.2, x + 0.3);
    var a1 = a0 + 1.0;
    var a2 = a0 + 2.0;
    var a3 = a0 + 3.0;
    var a4 = a0 - 1.0;
    var a5 = a0 - 2.0;
    var a6 = a0 - 3.0;
    var a7 = a0 * 0.5;
    let b = vec4<f32>(0.999);
    let c = vec4<f32>(0.001);
    for (var i = 0u; i < params.x; i = i + 1u) {
        a0 = fma(a0, b, c);
        a1 = fma(a1, b, c);
        a2 = fma(a2, b, c);
        a3 = fma(a3, b, c);
        a4 = fma(a4, b, c);
        a5 = fma(a5, b, c);
        a6 = fma(a6, b, c);
        a7 = fma(a7, b, c);
    }
    dst[id] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
