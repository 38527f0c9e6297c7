//! fp8 encoding and decoding (OCP E4M3 "fn" and E5M2), as used by fp8 KV caches.
//!
//! Store is vLLM's `saturating_cast_fp8(x / scale)`: round to nearest, ties to even, and
//! saturate to the largest finite value (infinities saturate too; NaN stays NaN). Load is
//! `float(q) * scale`. Decoding goes through a 256-entry table built at compile time, so the
//! kernels' inner loops do one indexed load per element.

use crate::dtype::DType;

/// Parameters of one fp8 format.
#[derive(Clone, Copy, Debug)]
struct Format {
    mant_bits: u32,
    bias: i32,
    /// Largest finite value.
    max: f64,
    /// True if the top exponent encodes inf/NaN (E5M2); false if only `S.1111.111` is NaN (E4M3fn).
    ieee_top: bool,
    nan: u8,
}

const E4M3: Format = Format {
    mant_bits: 3,
    bias: 7,
    max: 448.0,
    ieee_top: false,
    nan: 0x7f,
};
const E5M2: Format = Format {
    mant_bits: 2,
    bias: 15,
    max: 57344.0,
    ieee_top: true,
    nan: 0x7f,
};

const fn pow2(e: i32) -> f32 {
    let mut v = 1.0f32;
    let mut i = 0;
    if e >= 0 {
        while i < e {
            v *= 2.0;
            i += 1;
        }
    } else {
        while i < -e {
            v *= 0.5;
            i += 1;
        }
    }
    v
}

const fn decode_with(f: Format, b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp_bits = 7 - f.mant_bits;
    let exp = ((b as u32 >> f.mant_bits) & ((1 << exp_bits) - 1)) as i32;
    let mant = (b as u32 & ((1 << f.mant_bits) - 1)) as i32;
    let top = (1 << exp_bits) - 1;
    if f.ieee_top && exp == top {
        return if mant == 0 {
            sign * f32::INFINITY
        } else {
            f32::NAN
        };
    }
    if !f.ieee_top && exp == top && mant == (1 << f.mant_bits) - 1 {
        return f32::NAN;
    }
    let scale = pow2(-(f.mant_bits as i32));
    if exp == 0 {
        sign * (mant as f32) * scale * pow2(1 - f.bias)
    } else {
        sign * (1.0 + mant as f32 * scale) * pow2(exp - f.bias)
    }
}

const fn build_table(f: Format) -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = decode_with(f, i as u8);
        i += 1;
    }
    t
}

/// Decoded value of every E4M3 byte.
pub static E4M3_TABLE: [f32; 256] = build_table(E4M3);
/// Decoded value of every E5M2 byte.
pub static E5M2_TABLE: [f32; 256] = build_table(E5M2);

/// The decode table of an fp8 dtype (`None` for other dtypes).
pub fn table(dtype: DType) -> Option<&'static [f32; 256]> {
    match dtype {
        DType::Fp8E4m3 => Some(&E4M3_TABLE),
        DType::Fp8E5m2 => Some(&E5M2_TABLE),
        _ => None,
    }
}

fn encode_with(f: Format, x: f32) -> u8 {
    if x.is_nan() {
        return f.nan;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = (x as f64).abs().min(f.max); // saturate, infinities included
    let min_normal_exp = 1 - f.bias;
    // Quantum of the binade that holds `a` (subnormals share the smallest normal binade's).
    let e = if a == 0.0 {
        min_normal_exp
    } else {
        (a.log2().floor() as i32).max(min_normal_exp)
    };
    let quantum = 2f64.powi(e - f.mant_bits as i32);
    let steps = a / quantum;
    let mut r = steps.round();
    if (steps - steps.floor() - 0.5).abs() == 0.0 && r % 2.0 != 0.0 {
        r -= 1.0; // ties to even
    }
    let q = (r * quantum).min(f.max);
    if q == 0.0 {
        return sign;
    }
    let qe = (q.log2().floor() as i32).max(min_normal_exp);
    let (exp_field, mant) = if q < 2f64.powi(min_normal_exp) {
        (
            0u32,
            (q / 2f64.powi(min_normal_exp - f.mant_bits as i32)) as u32,
        )
    } else {
        let m = ((q / 2f64.powi(qe) - 1.0) * f64::from(1u32 << f.mant_bits)).round() as u32;
        ((qe + f.bias) as u32, m)
    };
    sign | ((exp_field << f.mant_bits) | mant) as u8
}

/// Encodes `x` as E4M3 with saturation to ±448 (NaN → 0x7F).
pub fn encode_e4m3(x: f32) -> u8 {
    encode_with(E4M3, x)
}

/// Encodes `x` as E5M2 with saturation to ±57344 (NaN → 0x7F).
pub fn encode_e5m2(x: f32) -> u8 {
    encode_with(E5M2, x)
}

/// Encodes `x` in the fp8 `dtype`; panics only on a non-fp8 dtype (a programming error).
pub fn encode(dtype: DType, x: f32) -> u8 {
    match dtype {
        DType::Fp8E4m3 => encode_e4m3(x),
        DType::Fp8E5m2 => encode_e5m2(x),
        other => unreachable!("fp8::encode called with {other}"),
    }
}

/// Largest finite value of an fp8 dtype.
pub fn max_finite(dtype: DType) -> f32 {
    match dtype {
        DType::Fp8E4m3 => 448.0,
        DType::Fp8E5m2 => 57344.0,
        _ => f32::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(E4M3_TABLE[0x7e], 448.0);
        assert!(E4M3_TABLE[0x7f].is_nan());
        assert_eq!(E4M3_TABLE[0x01], 2f32.powi(-9));
        assert_eq!(E4M3_TABLE[0x38], 1.0);
        assert_eq!(E5M2_TABLE[0x7b], 57344.0);
        assert_eq!(E5M2_TABLE[0x7c], f32::INFINITY);
        assert_eq!(E5M2_TABLE[0x3c], 1.0);
        assert_eq!(E5M2_TABLE[0x01], 2f32.powi(-16));
    }

    #[test]
    fn every_finite_code_round_trips() {
        for (tbl, enc) in [
            (&E4M3_TABLE, encode_e4m3 as fn(f32) -> u8),
            (&E5M2_TABLE, encode_e5m2 as fn(f32) -> u8),
        ] {
            for b in 0..=255u8 {
                let v = tbl[b as usize];
                if !v.is_finite() || (v == 0.0 && b == 0x80) {
                    continue;
                }
                assert_eq!(enc(v), b, "code {b:#x} value {v}");
            }
        }
    }

    #[test]
    fn saturates_and_rounds_to_nearest_even() {
        assert_eq!(E4M3_TABLE[encode_e4m3(1e6) as usize], 448.0);
        assert_eq!(E4M3_TABLE[encode_e4m3(f32::NEG_INFINITY) as usize], -448.0);
        assert_eq!(E5M2_TABLE[encode_e5m2(f32::INFINITY) as usize], 57344.0);
        // 1.0625 lies halfway between 1.0 and 1.125 in E4M3: ties go to the even mantissa (1.0).
        assert_eq!(E4M3_TABLE[encode_e4m3(1.0625) as usize], 1.0);
        // 1.1875 lies halfway between 1.125 and 1.25: the even one is 1.25.
        assert_eq!(E4M3_TABLE[encode_e4m3(1.1875) as usize], 1.25);
        // Nearest, not truncated.
        assert_eq!(E4M3_TABLE[encode_e4m3(1.1) as usize], 1.125);
        assert!(E4M3_TABLE[encode_e4m3(f32::NAN) as usize].is_nan());
    }

    #[test]
    fn relative_error_is_bounded_in_normal_range() {
        let mut x = 0.02f32;
        while x < 400.0 {
            let e4 = E4M3_TABLE[encode_e4m3(x) as usize];
            assert!(((e4 - x) / x).abs() <= 1.0 / 16.0 + 1e-6, "{x} -> {e4}");
            let e5 = E5M2_TABLE[encode_e5m2(x) as usize];
            assert!(((e5 - x) / x).abs() <= 1.0 / 8.0 + 1e-6, "{x} -> {e5}");
            x *= 1.37;
        }
    }
}
