// model_ops_common.wgsl — what every model-operation shader (model_ops_*.wgsl) shares.
//
// The generated header before it defines, per specialisation: WG (threads per workgroup),
// V (elements per vector load: 4 when the row length is a multiple of 4, else 1), the
// alias VT (vec4<f32> or f32), `vdot(a, b)` (dot product of two VT) and `lane(v, j)`
// (component j of a VT; the value itself when V = 1), and the kernel's own constants.
//
// Bounds: these functions touch no memory.

// Workgroup index of a dispatch spread over x (≤ the per-dimension limit) and z
// (src/device/wgpu/dispatch.rs `grid`); indices past the real count are skipped by the
// kernels.
fn flat_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.z * nwg.x + wid.x;
}
