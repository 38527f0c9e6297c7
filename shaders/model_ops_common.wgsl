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

const INV_TWO_PI: f32 = 0.15915494309189535;
const TWO_PI_HI: f32 = 6.28125;
const TWO_PI_LO: f32 = 0.0019353071795864769;

// RoPE: (cos, sin) of pair i of a head of size d at position pos. The angle
// pos · base^(-2i/d) in f32, reduced to [-π, π] (Cody–Waite, 2π = TWO_PI_HI + TWO_PI_LO)
// before cos / sin: the arithmetic of the CUDA family's pa_rope_rotate. Every kernel that
// rotates (rope, rope_split, the linear layers' RoPE output) takes its angles from here.
fn rope_cos_sin(pos: i32, i: u32, d: u32, base: f32) -> vec2<f32> {
    let inv_freq = pow(base, -f32(2u * i) / f32(d));
    let a = f32(pos) * inv_freq;
    let k = round(a * INV_TWO_PI);
    let r = fma(-k, TWO_PI_LO, fma(-k, TWO_PI_HI, a));
    return vec2<f32>(cos(r), sin(r));
}
