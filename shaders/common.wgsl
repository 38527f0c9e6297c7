// common.wgsl — element conversions shared by every polyattn shader.
//
// Algorithm: the kernels compute in f32. Storage formats other than f32 are unpacked on
// load and packed on store with integer arithmetic only (not even unpack2x16float, which
// naga gates behind SHADER_FLOAT16_IN_FLOAT32), so that every adapter, with the f16 feature
// or without, GL included, produces the same bits as the CPU backend:
//   * f16  -> f32: built from the bit fields (exact); f32 -> f16: round to nearest even,
//     overflow to inf, NaN kept quiet (the `half` crate's conversion);
//   * bf16 -> f32: the bits shifted into the high half (exact);  f32 -> bf16: RNE, NaN quiet;
//   * fp8 (OCP E4M3 "fn" and E5M2) -> f32: built from the bit fields (exact), then times the
//     dequantisation scale;  f32 -> fp8: `x / scale` divided with correct rounding
//     (`div_rn`: WGSL's `/` may be off by 2.5 ulp), then round to nearest even and saturate to
//     the largest finite value, NaN -> 0x7F — bit for bit `src/fp8.rs`.
// Infinities and NaNs are never written as literals (WGSL rejects them); they are built
// from bits at run time.
//
// Layout: 16-bit elements are stored two per u32 (element 2i in the low half), fp8 elements
// four per u32 (element 4i in the low byte): the little-endian byte order of the host
// tensors, so uploads and downloads are plain copies.
//
// Bounds: these functions touch no memory.

// Largest finite E4M3 value (448) and E5M2 value (57344) as f32 bits.
const FP8_E4M3_MAX_BITS: u32 = 0x43e00000u;
const FP8_E5M2_MAX_BITS: u32 = 0x47600000u;
const NEG_INF_BITS: u32 = 0xff800000u;
const POS_INF_BITS: u32 = 0x7f800000u;
// "No key seen yet" for running maxima: finite, far below any real logit.
const NO_MAX: f32 = -1.0e30;

fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0x1fu {
        // inf, or NaN with the quiet bit set (as the `half` crate converts it)
        return bitcast<f32>(sign | POS_INF_BITS | select(0u, 0x00400000u, m != 0u) | (m << 13u));
    }
    if e == 0u {
        let mag = ldexp(f32(m), -24);
        return select(mag, -mag, sign != 0u);
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

fn f32_to_f16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let exp = x & 0x7f800000u;
    let man = x & 0x007fffffu;
    if exp == 0x7f800000u {
        // inf or NaN (NaN keeps a set quiet bit and its top mantissa bits)
        let nan_bit = select(0u, 0x0200u, man != 0u);
        return sign | 0x7c00u | nan_bit | (man >> 13u);
    }
    let half_exp = i32(exp >> 23u) - 127 + 15;
    if half_exp >= 0x1f {
        return sign | 0x7c00u;
    }
    if half_exp <= 0 {
        if 14 - half_exp > 24 {
            return sign;
        }
        let m = man | 0x00800000u;
        let sh = u32(14 - half_exp);
        var half_man = m >> sh;
        let round_bit = 1u << (sh - 1u);
        if (m & round_bit) != 0u && (m & (3u * round_bit - 1u)) != 0u {
            half_man = half_man + 1u;
        }
        return sign | half_man;
    }
    let bits = sign | (u32(half_exp) << 10u) | (man >> 13u);
    let round_bit = 0x00001000u;
    if (man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u {
        return bits + 1u;
    }
    return bits;
}

fn bf16_bits_to_f32(h: u32) -> f32 {
    return bitcast<f32>((h & 0xffffu) << 16u);
}

fn f32_to_bf16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    if (x & 0x7fffffffu) > 0x7f800000u {
        return (x >> 16u) | 0x0040u;
    }
    let round_bit = 0x00008000u;
    if (x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u {
        return (x >> 16u) + 1u;
    }
    return x >> 16u;
}

// Four fp8 bytes of `w` (lowest first) -> f32, exactly, with no branch: a code's magnitude
// bits are shifted into the f32 exponent and mantissa fields (`mag`, at bit 20 for E4M3, 21
// for E5M2) and rebiased by an integer add (exponent + 127 − bias); subnormal codes
// (exponent 0) are the mantissa times 2^(1 − bias − mant), computed as f32(mag) times a
// power of two (exact: mag < 2^23); E4M3 S.1111.111 is NaN, E5M2 exponent 31 is inf (mantissa
// 0) or NaN; the sign bit is or-ed in last (so −0 stays −0).
fn e4m3x4_to_f32(w: u32) -> vec4<f32> {
    let mag = vec4<u32>(w << 20u, w << 12u, w << 4u, w >> 4u) & vec4<u32>(0x07f00000u);
    let sign = vec4<u32>(w << 24u, w << 16u, w << 8u, w) & vec4<u32>(0x80000000u);
    let normal = bitcast<vec4<f32>>(mag + vec4<u32>(0x3c000000u));
    // 2^-29 = 2^-9 (the subnormal quantum) / 2^20 (the shift of mag).
    let sub = vec4<f32>(mag) * 1.86264514923095703125e-9;
    var v = select(normal, sub, mag < vec4<u32>(0x00800000u));
    v = select(v, bitcast<vec4<f32>>(vec4<u32>(0x7fc00000u)), mag == vec4<u32>(0x07f00000u));
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) | sign);
}

fn e5m2x4_to_f32(w: u32) -> vec4<f32> {
    let mag = vec4<u32>(w << 21u, w << 13u, w << 5u, w >> 3u) & vec4<u32>(0x0fe00000u);
    let sign = vec4<u32>(w << 24u, w << 16u, w << 8u, w) & vec4<u32>(0x80000000u);
    let normal = bitcast<vec4<f32>>(mag + vec4<u32>(0x38000000u));
    // 2^-37 = 2^-16 (the subnormal quantum) / 2^21 (the shift of mag).
    let sub = vec4<f32>(mag) * 7.2759576141834259033203125e-12;
    var v = select(normal, sub, mag < vec4<u32>(0x00800000u));
    let top = select(
        vec4<u32>(0x7fc00000u),
        vec4<u32>(POS_INF_BITS),
        mag == vec4<u32>(0x0f800000u),
    );
    v = select(v, bitcast<vec4<f32>>(top), mag >= vec4<u32>(0x0f800000u));
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) | sign);
}

// Correctly rounded x / s for a positive normal finite s (the fp8 scales); other inputs
// fall back to `/`, whose result then saturates or rounds to zero in fp8 anyway.
fn div_rn(x: f32, s: f32) -> f32 {
    let xb = bitcast<u32>(x);
    let sb = bitcast<u32>(s);
    let xa = xb & 0x7fffffffu;
    let sign = xb & 0x80000000u;
    let se = (sb >> 23u) & 0xffu;
    if xa >= 0x7f800000u || (sb >> 31u) != 0u || se == 0u || se == 0xffu {
        return x / s;
    }
    if xa == 0u {
        return bitcast<f32>(sign);
    }
    var ex = i32(xa >> 23u);
    var mx = (xa & 0x007fffffu) | 0x00800000u;
    if ex == 0 {
        let sh = countLeadingZeros(xa) - 8u;
        mx = xa << sh;
        ex = 1 - i32(sh);
    }
    let ms = (sb & 0x007fffffu) | 0x00800000u;
    var e = ex - i32(se);
    var r = mx;
    if r < ms {
        r = r << 1u;
        e = e - 1;
    }
    var q = 0u;
    for (var i = 0u; i < 24u; i = i + 1u) {
        q = q << 1u;
        if r >= ms {
            r = r - ms;
            q = q | 1u;
        }
        r = r << 1u;
    }
    if r > ms || (r == ms && (q & 1u) == 1u) {
        q = q + 1u;
        if q == 0x01000000u {
            q = q >> 1u;
            e = e + 1;
        }
    }
    let be = e + 127;
    if be >= 255 {
        return bitcast<f32>(sign | POS_INF_BITS);
    }
    if be <= 0 {
        return x / s;
    }
    return bitcast<f32>(sign | (u32(be) << 23u) | (q & 0x007fffffu));
}

// f32 -> one fp8 byte: round to nearest even, saturate to the largest finite value (whose
// f32 bits are `max_bits`), NaN -> 0x7F. The code of a value q·2^qe (q in quantum units)
// is ((qe + mant + bias - 1) << mant) + q, which covers subnormals, normals and the carry
// into the next binade alike.
fn f32_to_fp8(y: f32, mant: u32, bias: i32, max_bits: u32) -> u32 {
    let bits = bitcast<u32>(y);
    let sign = (bits >> 24u) & 0x80u;
    var a = bits & 0x7fffffffu;
    if a > 0x7f800000u {
        return 0x7fu;
    }
    a = min(a, max_bits);
    let ef = a >> 23u;
    if ef == 0u {
        return sign;
    }
    let e = i32(ef) - 127;
    let m24 = (a & 0x007fffffu) | 0x00800000u;
    let qe = max(e, 1 - bias) - i32(mant);
    let shift = u32(qe - (e - 23));
    var q = 0u;
    if shift <= 24u {
        q = m24 >> shift;
        let rem = m24 & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if rem > half || (rem == half && (q & 1u) == 1u) {
            q = q + 1u;
        }
    }
    if q == 0u {
        return sign;
    }
    return sign | ((u32(qe + i32(mant) + bias - 1) << mant) + q);
}

fn f32_to_e4m3(x: f32, scale: f32) -> u32 {
    return f32_to_fp8(div_rn(x, scale), 3u, 7, FP8_E4M3_MAX_BITS);
}

fn f32_to_e5m2(x: f32, scale: f32) -> u32 {
    return f32_to_fp8(div_rn(x, scale), 2u, 15, FP8_E5M2_MAX_BITS);
}

// Element-unit workgroup index of a dispatch spread over x (≤ 65535) and z.
fn flat_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.z * nwg.x + wid.x;
}
