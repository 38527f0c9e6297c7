//! `reshape_and_cache` through `AttentionImpl::do_kv_cache_update`, on every available
//! backend: every written slot holds its input rounded to the cache dtype (fp8: `x / scale`,
//! round to nearest even, saturated), −1 slots write nothing, and every other slot keeps what
//! it held before.
//!
//! The expected fp8 bytes are computed here from first principles (decode each of the 256
//! codes from its bit fields, pick the nearest finite one, ties to the even code), not with the
//! crate's encoder, so the test checks the crate's fp8 rounding too.

#[macro_use]
mod common;

use common::{ensure, fail, for_each_case, CaseInfo, Outcome};
use std::sync::OnceLock;

use half::{bf16, f16};
use polyattn::testing::Rng;
use polyattn::{
    AttentionBackend, AttentionLayer, AttentionParams, BackendRef, CacheDType,
    CommonAttentionMetadata, DType, KvCache, KvCacheSpec, SelectorConfig, Tensor, PAD_SLOT_ID,
};

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    cache: CacheDType,
    block_size: usize,
    num_kv_heads: usize,
    head_size: usize,
    num_tokens: usize,
    seed: u64,
}

impl Case {
    fn info(&self) -> CaseInfo {
        let mut config = SelectorConfig::new(self.head_size, self.dtype, self.cache);
        config.block_size = Some(self.block_size as u32);
        CaseInfo {
            label: format!(
                "{}/{} bs{} hkv{} hd{} T{} (seed {})",
                self.dtype,
                self.cache,
                self.block_size,
                self.num_kv_heads,
                self.head_size,
                self.num_tokens,
                self.seed
            ),
            config: Some(config),
            cascade: false,
            graphs: false,
        }
    }
}

/// Value of an fp8 code, from its bit fields (E4M3 "fn": bias 7, no infinities, S.1111.111 is
/// NaN; E5M2: bias 15, IEEE-style top exponent).
fn fp8_decode(e4m3: bool, code: u8) -> f64 {
    let (mant_bits, bias) = if e4m3 { (3u32, 7i32) } else { (2, 15) };
    let exp_bits = 7 - mant_bits;
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> mant_bits) as u32 & ((1 << exp_bits) - 1)) as i32;
    let m = (code as u32 & ((1 << mant_bits) - 1)) as f64;
    let top = (1 << exp_bits) - 1;
    if e4m3 && e == top && m as u32 == 7 {
        return f64::NAN;
    }
    if !e4m3 && e == top {
        return if m == 0.0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    let frac = m / f64::from(1u32 << mant_bits);
    if e == 0 {
        sign * frac * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + frac) * 2f64.powi(e - bias)
    }
}

/// Every finite value of a format with its code, sorted by value (−0 and +0 both kept).
fn finite_table(e4m3: bool) -> &'static [(f64, u8)] {
    static E4M3: OnceLock<Vec<(f64, u8)>> = OnceLock::new();
    static E5M2: OnceLock<Vec<(f64, u8)>> = OnceLock::new();
    let cell = if e4m3 { &E4M3 } else { &E5M2 };
    cell.get_or_init(|| {
        let mut t: Vec<(f64, u8)> = (0..=255u8)
            .map(|c| (fp8_decode(e4m3, c), c))
            .filter(|(v, _)| v.is_finite())
            .collect();
        t.sort_by(|a, b| a.0.total_cmp(&b.0));
        t
    })
}

/// The finite fp8 value nearest to `y` (ties to the even code), which also saturates.
fn fp8_round(e4m3: bool, y: f32) -> f32 {
    let y = y as f64;
    let t = finite_table(e4m3);
    let i = t.partition_point(|&(v, _)| v < y);
    // The nearest value is t[i − 1] or t[i] (when they exist).
    let below = i.checked_sub(1).map(|j| t[j]);
    let above = t.get(i).copied();
    let pick = match (below, above) {
        (Some(b), None) => b,
        (None, Some(a)) => a,
        (Some(b), Some(a)) => {
            let (db, da) = (y - b.0, a.0 - y);
            if db < da || (db == da && b.1 % 2 == 0) {
                b
            } else {
                a
            }
        }
        (None, None) => unreachable!("the table is not empty"),
    };
    pick.0 as f32
}

/// What the cache must hold (decoded, without the fp8 scale) for an input `x` that is already
/// in the activation dtype.
fn expected_stored(cache: CacheDType, act: DType, x: f32, scale: f32) -> f32 {
    match cache.storage_dtype(act) {
        DType::F32 => x,
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::Bf16 => bf16::from_f32(x).to_f32(),
        DType::Fp8E4m3 => fp8_round(true, x / scale),
        DType::Fp8E5m2 => fp8_round(false, x / scale),
        other => unreachable!("{other} is no cache storage dtype"),
    }
}

/// Inputs: standard normals, plus a few values that exercise fp8 saturation and subnormals.
fn inputs(rng: &mut Rng, n: usize, dtype: DType) -> Vec<f32> {
    let specials = [30.0f32, -30.0, 3000.0, -3000.0, 1e-4, -3e-5, 0.5, 2.0];
    let mut v = rng.normals(n);
    for (i, s) in specials.iter().enumerate() {
        let at = rng.below(n);
        v[at] = *s * (1.0 + i as f32 * 1e-3);
    }
    // As the activation tensor will hold them.
    let t = Tensor::from_f32(&polyattn::Device::cpu(), &v, &[n], dtype).expect("upload");
    t.to_f32_vec().expect("download")
}

fn run_case(backend: &BackendRef, c: &Case) -> Outcome {
    let b: &dyn AttentionBackend = backend.as_ref();
    let device = b.device()?;
    let (hkv, d, bs) = (c.num_kv_heads, c.head_size, c.block_size);
    let params = AttentionParams {
        kv_cache_dtype: c.cache,
        ..AttentionParams::new(hkv * 2, d, hkv)
    };
    let imp = b.make_impl(params)?;
    let spec = KvCacheSpec {
        block_size: bs,
        num_kv_heads: hkv,
        head_size: d,
        dtype: c.dtype,
        cache_dtype: c.cache,
    };
    let builder = b.make_builder(&spec)?;
    let num_blocks = c.num_tokens.div_ceil(bs) + 3;
    let num_slots = num_blocks * bs;
    let mut cache = KvCache::new(b, spec, num_blocks)?;
    let (k_scale, v_scale) = if c.cache.is_fp8() {
        (0.05, 0.04)
    } else {
        (1.0, 1.0)
    };
    let layer = AttentionLayer::new("kv.test").with_scales(k_scale, v_scale)?;
    let mut rng = Rng::new(c.seed);
    let row = hkv * d;

    // One request covering every slot of the cache.
    let whole = |slots: Vec<i64>| common::whole_cache_batch(num_blocks, bs, slots);

    // 1. A sentinel in every slot: a per-slot pattern, so a write to the wrong slot shows.
    let sentinel_k: Vec<f32> = (0..num_slots * row)
        .map(|i| 0.25 + (i % 7) as f32 * 0.125)
        .collect();
    let sentinel_v: Vec<f32> = sentinel_k.iter().map(|x| -x).collect();
    let all_slots: Vec<i64> = (0..num_slots as i64).collect();
    let md = builder.build(
        0,
        &CommonAttentionMetadata::new(&device, whole(all_slots))?,
        false,
    )?;
    imp.do_kv_cache_update(
        &layer,
        &Tensor::from_f32(&device, &sentinel_k, &[num_slots, hkv, d], c.dtype)?,
        &Tensor::from_f32(&device, &sentinel_v, &[num_slots, hkv, d], c.dtype)?,
        &mut cache,
        md.as_ref(),
    )?;
    let before = cache.data().to_f32_vec()?;
    // The sentinel pass itself is a full write: check it like any other.
    check_slots(
        &cache,
        &before,
        &sentinel_k,
        &sentinel_v,
        &(0..num_slots as i64).collect::<Vec<_>>(),
        c,
        k_scale,
        v_scale,
    )
    .map_err(|e| fail(format!("sentinel pass: {e}")))?;

    // 2. The update under test: unique random slots, about one in five −1, key / value
    //    tensors with padding rows past the slot mapping (ignored).
    let t = c.num_tokens;
    let mut pool: Vec<i64> = (0..num_slots as i64).collect();
    rng.shuffle(&mut pool);
    let slots: Vec<i64> = (0..t)
        .map(|i| {
            if rng.below(5) == 0 {
                PAD_SLOT_ID
            } else {
                pool[i]
            }
        })
        .collect();
    ensure(
        slots.contains(&PAD_SLOT_ID) && slots.iter().any(|&s| s >= 0),
        || "the case needs both written and −1 slots".into(),
    )?;
    let pad_rows = 3;
    let key_in = inputs(&mut rng, (t + pad_rows) * row, c.dtype);
    let value_in = inputs(&mut rng, (t + pad_rows) * row, c.dtype);
    let md = builder.build(
        0,
        &CommonAttentionMetadata::new(&device, whole(slots.clone()))?,
        false,
    )?;
    imp.do_kv_cache_update(
        &layer,
        &Tensor::from_f32(&device, &key_in, &[t + pad_rows, hkv, d], c.dtype)?,
        &Tensor::from_f32(&device, &value_in, &[t + pad_rows, hkv, d], c.dtype)?,
        &mut cache,
        md.as_ref(),
    )?;
    let after = cache.data().to_f32_vec()?;
    check_slots(
        &cache, &after, &key_in, &value_in, &slots, c, k_scale, v_scale,
    )?;

    // 3. Everything not written keeps its pre-state, bit for bit.
    let mut written = vec![false; after.len()];
    for &s in slots.iter().filter(|&&s| s >= 0) {
        let (blk, off) = (s as usize / bs, s as usize % bs);
        for kv in 0..2 {
            for h in 0..hkv {
                let o = cache.offset(blk, kv, off, h);
                written[o..o + d].fill(true);
            }
        }
    }
    for (i, ((&a, &b4), &w)) in after.iter().zip(&before).zip(&written).enumerate() {
        if !w && a.to_bits() != b4.to_bits() {
            return Err(fail(format!(
                "cache element {i} was not a target (−1 slots: {}) but changed from {b4} to {a}",
                slots.iter().filter(|&&s| s < 0).count()
            )));
        }
    }
    Ok(())
}

/// Every token with a slot ≥ 0 has its K and V rows in that slot, as the cache dtype rounds
/// them.
#[allow(clippy::too_many_arguments)]
fn check_slots(
    cache: &KvCache,
    data: &[f32],
    key: &[f32],
    value: &[f32],
    slots: &[i64],
    c: &Case,
    k_scale: f32,
    v_scale: f32,
) -> Outcome {
    let (hkv, d, bs) = (c.num_kv_heads, c.head_size, c.block_size);
    for (t, &s) in slots.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let (blk, off) = (s as usize / bs, s as usize % bs);
        for (kv, (src, scale)) in [(key, k_scale), (value, v_scale)].into_iter().enumerate() {
            for h in 0..hkv {
                let o = cache.offset(blk, kv, off, h);
                for i in 0..d {
                    let x = src[(t * hkv + h) * d + i];
                    let want = expected_stored(c.cache, c.dtype, x, scale);
                    let got = data[o + i];
                    if got != want {
                        return Err(fail(format!(
                            "token {t} → slot {s} ({}, head {h}, dim {i}): cache holds {got}, \
                             expected {want} (input {x}, scale {scale})",
                            ["key", "value"][kv]
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut rng = Rng::new(77);
    let geometry = [(16, 2, 64), (32, 4, 80), (16, 1, 256), (64, 2, 32)];
    let mut i = 0u64;
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for cache in CacheDType::ALL {
            let (block_size, num_kv_heads, head_size) = geometry[rng.below(geometry.len())];
            out.push(Case {
                dtype,
                cache,
                block_size,
                num_kv_heads,
                head_size,
                num_tokens: 20 + rng.below(30),
                seed: 500 + i,
            });
            i += 1;
        }
    }
    out
}

#[test]
fn reshape_and_cache_writes_exactly_the_slots() {
    for_each_case("reshape_and_cache", &cases(), Case::info, run_case);
}

#[test]
fn independent_fp8_rounding_sanity() {
    // The test's own fp8 rounding, checked on values whose answer is known.
    assert_eq!(fp8_round(true, 1000.0), 448.0); // saturates
    assert_eq!(fp8_round(true, -1e9), -448.0);
    assert_eq!(fp8_round(false, 1e6), 57344.0);
    assert_eq!(fp8_round(true, 12.5), 12.0); // tie between 12 (even code) and 13
    assert_eq!(fp8_round(true, 13.5), 14.0); // tie between 13 and 14 (even code)
    assert_eq!(fp8_round(true, 2f32.powi(-9)), 2f32.powi(-9)); // smallest subnormal
    assert_eq!(fp8_round(true, 2f32.powi(-11)), 0.0); // below half of it
    assert_eq!(fp8_round(false, 2f32.powi(-16)), 2f32.powi(-16));
    assert_eq!(fp8_round(false, 5.0), 5.0);
    assert_eq!(fp8_round(false, 5.5), 6.0); // E5M2 at [4,8) steps by 1: tie 5|6 → 6 (even code)
    assert!(fp8_decode(true, 0x7f).is_nan());
    assert_eq!(fp8_decode(false, 0x7c), f64::INFINITY);
}
