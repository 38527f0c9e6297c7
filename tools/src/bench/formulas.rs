//! FLOP and byte counts of every benchmarked kernel, exactly as `perf-anchors.md` §8 defines
//! them, and the roofline arithmetic that turns a time into TFLOP/s, GB/s and a fraction of
//! the measured ceilings.
//!
//! Conventions (§8): FLOPs count multiply and add separately and use the query heads, never
//! the KV heads; bytes are "useful bytes" — every K/V element of the visible context once,
//! the queries once, the outputs once — in decimal units (GB = 1e9 B). Split-KV partials,
//! page tables and masks are overhead, not work, and are not counted.
//!
//! Bytes depend on the dtypes, FLOPs do not; [`Traffic`] keeps the element counts per role so
//! that one shape table serves every dtype (and the Python reference reads the same counts).

use serde::{Deserialize, Serialize};

/// One request of an attention batch: `sq` new query tokens against `sk` keys (context plus
/// the new tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Query length `Sq`.
    pub sq: usize,
    /// KV length `Sk` (≥ `sq`).
    pub sk: usize,
}

/// Prefill FLOPs of one request (§8): non-causal `2·Hq·Sq·Sk·(Dqk+Dv)`; causal with the
/// diagonal aligned bottom-right (query `i` sees `Sk − Sq + i + 1` keys)
/// `Hq·(Dqk+Dv)·Sq·(2·Sk − Sq + 1)`.
pub fn prefill_flops(hq: usize, dqk: usize, dv: usize, r: Request, causal: bool) -> f64 {
    let (h, d, sq, sk) = (hq as f64, (dqk + dv) as f64, r.sq as f64, r.sk as f64);
    if causal {
        h * d * sq * (2.0 * sk - sq + 1.0)
    } else {
        2.0 * h * sq * sk * d
    }
}

/// Decode FLOPs of one request (§8): `2·Hq·Sq·Sk·(Dqk+Dv)` (every query token sees every key;
/// exact for `Sq = 1`, the usual count for speculative `Sq` of 2–4).
pub fn decode_flops(hq: usize, dqk: usize, dv: usize, r: Request) -> f64 {
    2.0 * hq as f64 * r.sq as f64 * r.sk as f64 * (dqk + dv) as f64
}

/// Attention bytes of a batch (§8, the FA3 / FlashMLA "useful bytes"):
/// `Σ_b Sk_b·Hkv·(Dqk+Dv)·s_kv + Σ_b Sq_b·Hq·Dqk·s_q + Σ_b Sq_b·Hq·Dv·s_o`.
#[allow(clippy::too_many_arguments)] // the §8 formula's own parameters
pub fn attention_bytes(
    reqs: &[Request],
    hq: usize,
    hkv: usize,
    dqk: usize,
    dv: usize,
    s_q: usize,
    s_kv: usize,
    s_o: usize,
) -> f64 {
    let sk: f64 = reqs.iter().map(|r| r.sk as f64).sum();
    let sq: f64 = reqs.iter().map(|r| r.sq as f64).sum();
    sk * (hkv * (dqk + dv) * s_kv) as f64
        + sq * (hq * dqk * s_q) as f64
        + sq * (hq * dv * s_o) as f64
}

/// MLA decode bytes (§8, absorbed form: one latent of `Dqk` elements per token serves as key
/// and, its first `Dv` elements, as value): `Σ_b Sk_b·Dqk·s_kv` plus queries (`Dqk`) and
/// outputs (`Dv`), both in the activation dtype of `s_q` bytes.
pub fn mla_bytes(
    reqs: &[Request],
    hq: usize,
    dqk: usize,
    dv: usize,
    s_q: usize,
    s_kv: usize,
) -> f64 {
    let sk: f64 = reqs.iter().map(|r| r.sk as f64).sum();
    let sq: f64 = reqs.iter().map(|r| r.sq as f64).sum();
    sk * (dqk * s_kv) as f64 + sq * (hq * dqk * s_q) as f64 + sq * (hq * dv * s_q) as f64
}

/// `reshape_and_cache` bytes (§8): `T·Hkv·(Dk+Dv)·(s_in + s_cache) + 8·T` (the int64 slot
/// mapping).
pub fn kv_write_bytes(
    t: usize,
    hkv: usize,
    dk: usize,
    dv: usize,
    s_in: usize,
    s_cache: usize,
) -> f64 {
    (t * hkv * (dk + dv) * (s_in + s_cache)) as f64 + 8.0 * t as f64
}

/// LSE-merge bytes of two partial states (§8): `T·H·Dv·(2·s_in + s_out) + 3·T·H·4` (two LSEs
/// in, one out, f32).
pub fn merge_bytes(t: usize, h: usize, dv: usize, s_in: usize, s_out: usize) -> f64 {
    (t * h * dv * (2 * s_in + s_out)) as f64 + (3 * t * h * 4) as f64
}

/// FLOPs and bytes of one benchmark case, with the bytes split by the dtype they are counted
/// in: `bytes = act_elems·s_act + cache_elems·s_cache + fixed_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// FLOPs (0 for pure data movement).
    pub flops: f64,
    /// Elements counted in the activation dtype (queries, outputs, new keys/values, merge
    /// inputs and outputs).
    pub act_elems: f64,
    /// Elements counted in the KV-cache dtype.
    pub cache_elems: f64,
    /// Bytes that do not depend on a dtype (f32 LSEs, int64 slot mappings).
    pub fixed_bytes: f64,
}

impl Traffic {
    /// Bytes for activations of `s_act` bytes and a cache of `s_cache` bytes per element.
    pub fn bytes(&self, s_act: usize, s_cache: usize) -> f64 {
        self.act_elems * s_act as f64 + self.cache_elems * s_cache as f64 + self.fixed_bytes
    }
}

/// Which ceiling bounds a kernel's best possible time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    /// `FLOPs / peak` is the larger floor.
    Compute,
    /// `bytes / bandwidth` is the larger floor.
    Memory,
}

impl Bound {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::Compute => "compute",
            Bound::Memory => "memory",
        }
    }
}

/// A timed kernel placed on the roofline of measured ceilings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RooflinePoint {
    /// Achieved TFLOP/s (`flops / t / 1e12`).
    pub tflops: f64,
    /// Achieved GB/s (`bytes / t / 1e9`, decimal).
    pub gbps: f64,
    /// Arithmetic intensity, FLOP per byte.
    pub intensity: f64,
    /// The ceiling that bounds the best possible time.
    pub bound: Bound,
    /// `t_min / t` with `t_min = max(F / P, bytes / BW)` (§8's roofline floor), in 0..≈1.
    pub fraction: f64,
}

/// Places a kernel of `flops` and `bytes` that ran in `seconds` under a compute ceiling of
/// `peak_tflops` and a bandwidth ceiling of `peak_gbps`.
pub fn roofline(
    flops: f64,
    bytes: f64,
    seconds: f64,
    peak_tflops: f64,
    peak_gbps: f64,
) -> RooflinePoint {
    let t_compute = if peak_tflops > 0.0 {
        flops / (peak_tflops * 1e12)
    } else {
        0.0
    };
    let t_memory = if peak_gbps > 0.0 {
        bytes / (peak_gbps * 1e9)
    } else {
        0.0
    };
    let (bound, t_min) = if t_compute >= t_memory {
        (Bound::Compute, t_compute)
    } else {
        (Bound::Memory, t_memory)
    };
    RooflinePoint {
        tflops: flops / seconds / 1e12,
        gbps: bytes / seconds / 1e9,
        intensity: if bytes > 0.0 { flops / bytes } else { 0.0 },
        bound,
        fraction: if seconds > 0.0 { t_min / seconds } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    #[test]
    fn prefill_counts_match_section_8() {
        // Llama-3-8B, 1×4k causal: 32·256·4096·(2·4096 − 4096 + 1).
        let r = Request { sq: 4096, sk: 4096 };
        assert_eq!(prefill_flops(32, 128, 128, r, true), 137_472_507_904.0);
        // FA's convention 4·S²·H·D / 2 is the same up to the diagonal term (+1/S).
        let fa = 4.0 * 4096.0f64.powi(2) * 32.0 * 128.0 / 2.0;
        assert!(close(prefill_flops(32, 128, 128, r, true), fa, 3e-4));
        // FA sweep, d128 non-causal B=4 S=4k H=16: 4·B·S²·H·D.
        let nc = 4.0 * prefill_flops(16, 128, 128, r, false);
        assert_eq!(nc, 4.0 * 4.0 * 4096.0f64.powi(2) * 16.0 * 128.0);
        // Chunked prefill: Sq = 2, Sk = 5 → queries see 4 and 5 keys: 9 pairs · 2·(D+D) FLOPs.
        let c = prefill_flops(1, 8, 8, Request { sq: 2, sk: 5 }, true);
        assert_eq!(c, 9.0 * 2.0 * 16.0);
    }

    #[test]
    fn decode_counts_match_section_3_table() {
        // 32/8, B=1, S=4k bf16: 16.8 MB of KV+q+o (§3 table).
        let b1 = attention_bytes(&[Request { sq: 1, sk: 4096 }], 32, 8, 128, 128, 2, 2, 2);
        assert_eq!(b1, 16_793_600.0);
        // B=64, S=32k: 8,591 MB.
        let reqs = vec![Request { sq: 1, sk: 32768 }; 64];
        let b64 = attention_bytes(&reqs, 32, 8, 128, 128, 2, 2, 2);
        assert_eq!((b64 / 1e6).round(), 8591.0);
        // Intensity ≈ 2g/s = 4 FLOP/B for g = 4, bf16.
        let f: f64 = reqs.iter().map(|&r| decode_flops(32, 128, 128, r)).sum();
        assert!(close(f / b64, 4.0, 1e-3), "{}", f / b64);
    }

    #[test]
    fn data_movement_counts_match_the_probe_rows() {
        // reshape_and_cache T=4096, Hkv=8, D=128, bf16 → 35 µs ≈ 960 GB/s in the H200 probe.
        let b = kv_write_bytes(4096, 8, 128, 128, 2, 2);
        assert_eq!(b, 33_587_200.0);
        assert_eq!((b / 35e-6 / 1e9).round(), 960.0);
        // Merge T=1024, H=32, D=128, bf16 → 186 µs ≈ 137 GB/s.
        let m = merge_bytes(1024, 32, 128, 2, 2);
        assert_eq!(m, 25_559_040.0);
        assert_eq!((m / 186e-6 / 1e9).round(), 137.0);
        // MLA B=64 S=4k: latent bytes B·Sk·576·2 (§8's "≈") plus q and o, 6% here.
        let reqs = vec![Request { sq: 1, sk: 4096 }; 64];
        let mla = mla_bytes(&reqs, 128, 576, 512, 2, 2);
        assert_eq!(
            mla,
            64.0 * 4096.0 * 576.0 * 2.0 + 64.0 * 128.0 * 1088.0 * 2.0
        );
        let f: f64 = reqs.iter().map(|&r| decode_flops(128, 576, 512, r)).sum();
        assert_eq!(f, 73_014_444_032.0);
    }

    #[test]
    fn traffic_and_roofline() {
        let t = Traffic {
            flops: 1e12,
            act_elems: 10.0,
            cache_elems: 100.0,
            fixed_bytes: 7.0,
        };
        assert_eq!(t.bytes(2, 1), 127.0);
        // 1 TFLOP in 10 ms on a 200 TFLOP/s, 1000 GB/s machine: compute floor 5 ms → 50%.
        let p = roofline(1e12, 1e9, 0.01, 200.0, 1000.0);
        assert_eq!(p.bound, Bound::Compute);
        assert!(close(p.fraction, 0.5, 1e-12));
        assert!(close(p.tflops, 100.0, 1e-12));
        assert!(close(p.gbps, 100.0, 1e-12));
        // Pure data movement: memory bound, fraction = GB/s over the bandwidth.
        let q = roofline(0.0, 4e9, 0.002, 200.0, 4000.0);
        assert_eq!(q.bound, Bound::Memory);
        assert!(close(q.fraction, 0.5, 1e-12));
        assert_eq!(q.intensity, 0.0);
    }
}
