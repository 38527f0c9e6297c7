// model_ops_linear_out.wgsl — what the two linear kernels share (model_ops_gemv.wgsl for
// few tokens, model_ops_linear.wgsl tiled for many): their parameters and bindings, the
// weight rows of an output unit, and the output step of the product p = x·Wᵀ
// (crate::compute::linear_fused says what each form computes).
//
// Output forms (OUT, from the generated header):
//   OUT_PLAIN   y [T, N] = p, or y += p where params.accumulate is 1 (each output element
//               read once, by the thread that writes it). Unit u of work: weight row u.
//   OUT_SWIGLU  y [T, I] = silu(p[:, u]) · p[:, I + u] with N = 2I and silu(g) = g / (1 +
//               exp(−g)) (model_ops_elementwise.wgsl's formula: for g → −∞ the quotient is
//               −0, no NaN).
//   OUT_ROPE    p is a fused Q/K/V projection, N = (H + 2Hk)·d: query heads rotated into
//               y = q [T, H, d], key heads into k_out [T, Hk, d], value heads copied into
//               v_out [T, Hk, d]. The rotation is model_ops_rope.wgsl's, rounding for
//               rounding: inv_freq = pow(base, −2i/d), angle = f32(pos)·inv_freq reduced to
//               [−π, π] (Cody–Waite: k = round(a / 2π), r = a − k·HI − k·LO with fma) before
//               cos / sin, then (x0·cos − x1·sin, x0·sin + x1·cos).
//   OUT_ROPE_CACHE  OUT_ROPE with the key and value heads written into the f32 paged KV
//               cache kv_cache instead of k_out / v_out: token tok's rows go to slot
//               s = slots[tok] (i64 as (low, high) words; a high word ≠ 0, i.e. s < 0 or
//               s ≥ 2^32: not written), block s / bs, offset s % bs, in reshape_and_cache's
//               layout ([blocks][2][bs][Hk][d] NHD or [blocks][2][Hk][bs][d] HND; values
//               bs·Hk·d elements after their keys).
// The pair forms (SWIGLU, ROPE) combine two products per output element, so their unit of
// work is a pair of weight rows: pair u < N / 2 is rows (u, I + u) for SwiGLU; for RoPE
// head = u / half, i = u % half, rows head·d + ia and head·d + ib with (ia, ib) = (2i,
// 2i + 1) where params.interleaved is 1, else (i, i + half). Member 0 of a pair is its
// first row (the gate; x0 of the rotation), member 1 its second.
//
// NORM (generated header): the kernels RMS-norm the input rows, using h = x · inv · g with
// inv = 1 / sqrt(ss / K + eps), ss the row's sum of squares and g = norm_w [K]
// (model_ops_rms_norm.wgsl's expression; each kernel sums the squares in its own order).
//
// Bindings: 0 params; 1 x [T, K] (VT), 2 W [N, K] (f32 as VT, or f16 / bf16 bits read
// through wload), 3 y (the plain or SwiGLU output, or q), row-major, f32 but for a 16-bit W.
// The generated header declares W and wload, 4 norm_w [K] (VT) with NORM and
// 5 positions [T] (i32), 6 k_out, 7 v_out (f32) with OUT_ROPE, 5 positions, 6 kv_cache
// (f32), 7 slots [T] (vec2<i32>) with OUT_ROPE_CACHE; a binding a form does not use
// is declared instead as a private one-element stand-in that only code behind a false
// constant names, so the plain form binds exactly x, W and y (kernels::wgsl::Bindings::Model)
// and the others kernels::wgsl::Bindings::LinearFused.
//
// Bounds relied on (host checks): every tensor fits one storage binding (fewer than 2^30
// f32), so every element index below fits a u32; T ≥ 1, K ≥ 1; N even in the pair forms
// and N = (H + 2Hk)·d, d = 2·half ≥ 2 in OUT_ROPE; a position only feeds arithmetic; in
// OUT_ROPE_CACHE every slot ≥ 0 lies in the cache's blocks (the batch's metadata checked
// against the cache on the host, by linear_fused and before a graph replay), and the cache
// fits one binding, so its indices fit a u32.

struct Params {
    num_tokens: u32,
    // Weight rows N.
    n: u32,
    // K / V.
    kv: u32,
    // OUT_PLAIN: 1 adds the product into y, 0 stores it.
    accumulate: u32,
    // NORM: the epsilon added to the mean square.
    eps: f32,
    // OUT_ROPE: d / 2, H, Hk, the rotation's base, 1 for pairs (2i, 2i + 1).
    half: u32,
    num_heads: u32,
    num_kv_heads: u32,
    base: f32,
    interleaved: u32,
    // OUT_ROPE_CACHE: tokens per cache block, and 1 for the HND layout.
    block_size: u32,
    hnd: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<VT>;
// Binding 2, the weight `w`, and its reader `wload(i) -> VT` come with the generated header
// (f32 vectors, or 16-bit weights widened as they are read).
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const OUT_PLAIN: u32 = 0u;
const OUT_SWIGLU: u32 = 1u;
const OUT_ROPE: u32 = 2u;
const OUT_ROPE_CACHE: u32 = 3u;
// Either RoPE split.
const ROPE_SPLIT: bool = OUT == OUT_ROPE || OUT == OUT_ROPE_CACHE;

// Output units: weight rows (OUT_PLAIN) or row pairs.
fn num_units() -> u32 {
    if OUT == OUT_PLAIN {
        return params.n;
    }
    return params.n / 2u;
}

// The offsets (ia, ib) in its head of RoPE pair i.
fn rope_offsets(i: u32) -> vec2<u32> {
    if params.interleaved != 0u {
        return vec2<u32>(2u * i, 2u * i + 1u);
    }
    return vec2<u32>(i, i + params.half);
}

// The weight row of member m (0 or 1) of unit u (OUT_PLAIN: row u itself).
fn unit_row(u: u32, m: u32) -> u32 {
    if OUT == OUT_SWIGLU {
        return u + m * (params.n / 2u);
    }
    if ROPE_SPLIT {
        let head = u / params.half;
        let o = rope_offsets(u - head * params.half);
        return head * 2u * params.half + select(o.x, o.y, m == 1u);
    }
    return u;
}

// OUT_PLAIN: token tok's product v of weight row r, stored or added.
fn put(tok: u32, r: u32, v: f32) {
    let at = tok * params.n + r;
    if params.accumulate != 0u {
        y[at] = y[at] + v;
    } else {
        y[at] = v;
    }
}

// The pair forms: token tok's products a0 (member 0), a1 (member 1) of pair u, written as
// OUT says.
fn put_pair(tok: u32, u: u32, a0: f32, a1: f32) {
    if OUT == OUT_SWIGLU {
        y[tok * (params.n / 2u) + u] = a0 / (1.0 + exp(-a0)) * a1;
        return;
    }
    let half = params.half;
    let d = 2u * half;
    let head = u / half;
    let i = u - head * half;
    let o = rope_offsets(i);
    let h = params.num_heads;
    let hk = params.num_kv_heads;
    if OUT == OUT_ROPE_CACHE && head >= h {
        put_cache_pair(tok, head, i, o, a0, a1);
        return;
    }
    if head >= h + hk {
        let at = (tok * hk + head - h - hk) * d;
        v_out[at + o.x] = a0;
        v_out[at + o.y] = a1;
        return;
    }
    let cs = rope_cos_sin(positions[tok], i, d, params.base);
    let c = cs.x;
    let s = cs.y;
    let r0 = a0 * c - a1 * s;
    let r1 = a0 * s + a1 * c;
    if head < h {
        let at = (tok * h + head) * d;
        y[at + o.x] = r0;
        y[at + o.y] = r1;
    } else {
        let at = (tok * hk + head - h) * d;
        k_out[at + o.x] = r0;
        k_out[at + o.y] = r1;
    }
}

// OUT_ROPE_CACHE: token tok's key (rotated) or value pair (a0, a1) of KV head row `head`
// (H ≤ head < H + 2Hk), RoPE pair i at offsets o of its row, into the token's cache slot.
fn put_cache_pair(tok: u32, head: u32, i: u32, o: vec2<u32>, a0: f32, a1: f32) {
    let s = slots[tok];
    if s.y != 0 {
        return;
    }
    let h = params.num_heads;
    let hk = params.num_kv_heads;
    let half = params.half;
    let d = 2u * half;
    let is_v = head >= h + hk;
    let kvh = select(head - h, head - h - hk, is_v);
    let slot = bitcast<u32>(s.x);
    let bs = params.block_size;
    let blk = slot / bs;
    let off = slot % bs;
    var row = (off * hk + kvh) * d;
    if params.hnd != 0u {
        row = (kvh * bs + off) * d;
    }
    let at = (blk * 2u + select(0u, 1u, is_v)) * bs * hk * d + row;
    if is_v {
        kv_cache[at + o.x] = a0;
        kv_cache[at + o.y] = a1;
        return;
    }
    let cs = rope_cos_sin(positions[tok], i, d, params.base);
    kv_cache[at + o.x] = a0 * cs.x - a1 * cs.y;
    kv_cache[at + o.y] = a0 * cs.y + a1 * cs.x;
}
