// model_ops_elementwise.wgsl — SwiGLU's activation out = silu(gate) · up (OP = 0), the
// residual add x += y in place (OP = 1), and SwiGLU over a fused gate/up projection (OP = 2:
// out[r, c] = silu(a[r, c]) · a[r, W + c], rows of 2W in a, of W in out).
//
// Algorithm: one thread per VT; silu(g) = g / (1 + exp(−g)) (the CPU kernel's formula: for
// g → −∞, exp(−g) overflows to +inf and the quotient is −0, no NaN). f32 throughout.
//
// Specialisation (generated header): WG, V / VT (V = 4 when the element count is a
// multiple of 4), OP.
//
// Layout: all operands dense with the same shape. OP 0: a = gate, b = up, out = result.
// OP 1: a = y, out = x (read and written); b is unused (a placeholder is bound). OP 2: a =
// gate_up [T, 2W], out [T, W], Params.width = W / V; b is unused.
// Bounds relied on (host checks): count = elements / V < 2^32 (the tensors fit one binding);
// workgroups spread over x and z, threads past count return.

struct Params {
    count: u32,
    width: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<VT>;
@group(0) @binding(2) var<storage, read> b: array<VT>;
@group(0) @binding(3) var<storage, read_write> out: array<VT>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let u = flat_group(wid, nwg) * WG + lid;
    if u >= params.count {
        return;
    }
    if OP == 0u {
        let g = a[u];
        out[u] = g / (1.0 + exp(-g)) * b[u];
    } else if OP == 1u {
        out[u] = out[u] + a[u];
    } else {
        let w = params.width;
        let r = u / w;
        let at = u + r * w;
        let g = a[at];
        out[u] = g / (1.0 + exp(-g)) * a[at + w];
    }
}
