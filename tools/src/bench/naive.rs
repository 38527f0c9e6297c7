//! The naive CPU reference of `perf-anchors.md` §7/§10: "matmul → softmax → matmul" on
//! contiguous keys and values, the floor a CPU attention kernel has to beat (llama.cpp's
//! flash-attention path is not automatically faster than it).
//!
//! For each query head, every score row `s = q·Kᵀ` is computed in full (masked entries
//! included, as a GEMM would), masked, soft-maxed, and multiplied by `V` in full. Work is
//! spread over query heads with rayon. The benchmark counts the same useful FLOPs (§8) for it
//! as for the kernels, so its TFLOP/s are comparable; it does about twice the arithmetic on
//! causal prefill.

use rayon::prelude::*;

use polyattn::backends::cpu::kernels::paged_attention::{axpy, dot};

use super::formulas::Request;
use super::inputs::random_storage;
use polyattn::device::CpuStorage;
use polyattn::dtype::DType;

/// One request's contiguous f32 inputs and output.
pub struct NaiveRequest {
    sq: usize,
    sk: usize,
    /// `[Hq][Sq][D]`, already scaled.
    q: Vec<f32>,
    /// `[Hkv][Sk][D]`.
    k: Vec<f32>,
    /// `[Hkv][Sk][D]`.
    v: Vec<f32>,
    /// `[Hq][Sq][D]`.
    out: Vec<f32>,
}

/// A batch for the naive reference.
pub struct NaiveBatch {
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
    reqs: Vec<NaiveRequest>,
}

fn f32s(n: usize, seed: u64) -> Vec<f32> {
    match random_storage(n, DType::F32, seed) {
        CpuStorage::F32(v) => v,
        _ => unreachable!("random_storage(F32) is f32"),
    }
}

impl NaiveBatch {
    /// Random inputs for `reqs` with `hq` / `hkv` heads of size `d`.
    pub fn new(reqs: &[Request], hq: usize, hkv: usize, d: usize, causal: bool, seed: u64) -> Self {
        let scale = 1.0 / (d as f32).sqrt();
        let reqs = reqs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let s = seed ^ ((i as u64 + 1) << 20);
                let mut q = f32s(hq * r.sq * d, s ^ 1);
                q.iter_mut().for_each(|x| *x *= scale);
                NaiveRequest {
                    sq: r.sq,
                    sk: r.sk,
                    q,
                    k: f32s(hkv * r.sk * d, s ^ 2),
                    v: f32s(hkv * r.sk * d, s ^ 3),
                    out: vec![0.0; hq * r.sq * d],
                }
            })
            .collect();
        NaiveBatch {
            hq,
            hkv,
            d,
            causal,
            reqs,
        }
    }

    /// Runs the reference on every request.
    pub fn run(&mut self) {
        let (hq, hkv, d, causal) = (self.hq, self.hkv, self.d, self.causal);
        let g = hq / hkv.max(1);
        for r in &mut self.reqs {
            let (sq, sk) = (r.sq, r.sk);
            let (q, k, v) = (&r.q, &r.k, &r.v);
            r.out
                .par_chunks_mut(sq * d)
                .enumerate()
                .for_each(|(h, out)| {
                    let kh = &k[(h / g) * sk * d..][..sk * d];
                    let vh = &v[(h / g) * sk * d..][..sk * d];
                    let mut s = vec![0.0f32; sk];
                    for i in 0..sq {
                        let qi = &q[(h * sq + i) * d..][..d];
                        for (j, sj) in s.iter_mut().enumerate() {
                            *sj = dot(qi, &kh[j * d..(j + 1) * d]);
                        }
                        // Bottom-right causal mask: query i sees keys 0..=sk−sq+i.
                        if causal {
                            s[sk - sq + i + 1..].fill(f32::NEG_INFINITY);
                        }
                        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let mut z = 0.0f32;
                        for x in s.iter_mut() {
                            *x = (*x - m).exp();
                            z += *x;
                        }
                        let o = &mut out[i * d..(i + 1) * d];
                        o.fill(0.0);
                        for (j, &p) in s.iter().enumerate() {
                            axpy(o, p / z, &vh[j * d..(j + 1) * d]);
                        }
                    }
                });
        }
    }

    /// The outputs, `[request][Hq][Sq][D]` flattened.
    pub fn outputs(&self) -> impl Iterator<Item = &f32> {
        self.reqs.iter().flat_map(|r| r.out.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_returns_its_value() {
        // A single visible key: the output is exactly that value row.
        let mut b = NaiveBatch::new(&[Request { sq: 1, sk: 1 }], 2, 1, 8, true, 3);
        b.run();
        let v = b.reqs[0].v.clone();
        let out: Vec<f32> = b.outputs().copied().collect();
        assert_eq!(&out[..8], &v[..8]);
        assert_eq!(&out[8..16], &v[..8]);
    }
}
