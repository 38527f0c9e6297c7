//! The two measured ceilings of the roofline, per device, in the same run as the kernels
//! (`perf-anchors.md` §7, §9): a compute peak and a large copy. The result and configuration
//! types ([`Peaks`], [`ProbeConfig`]) are the library's (`polyattn::probe`), which the GPU
//! backends' probes fill; the CPU's are measured here.
//!
//! - CPU: an FMA loop on every rayon thread at once (12 independent AVX2/FMA chains per
//!   thread where the CPU has them, portable multiply-add otherwise) and a parallel copy of a
//!   512 MiB buffer (read + write both counted, as the H200's `b.copy_(a)` anchor counts them),
//!   plus a streaming read for reference. Best of several trials: a ceiling is what the
//!   machine can do, not what it usually does.
//! - GPU devices: [`measure`] has one arm per [`Device`] variant; a GPU backend fills its arm
//!   with a device copy of ≥ 4 GiB timed with its device timer and a large matmul in the
//!   benchmark dtype (bf16 8192³ on the H200) on random data (zeros run faster).

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

use polyattn::device::Device;
use polyattn::dtype::DType;
use polyattn::error::Result;
use polyattn::probe::{Peaks, ProbeConfig};

/// Measures the ceilings of `device` for kernels computing in `dtype`.
pub fn measure(device: &Device, dtype: DType, cfg: &ProbeConfig) -> Result<Peaks> {
    match device {
        Device::Cpu(_) => Ok(cpu_peaks(device, dtype, cfg)),
        // Hook: the CUDA backend measures a device copy (events, ≥ 4 GiB) and a cuBLAS-free
        // bf16/f16 matmul or its own GEMM kernel here; the wgpu backend a buffer copy and a
        // shader FMA loop / cooperative-matrix GEMM.
        Device::Wgpu(d) => polyattn::backends::wgpu::probes::peaks(d, dtype, cfg),
        Device::Vulkan(d) => polyattn::backends::vulkan::probes::peaks(d, dtype, cfg),
        Device::Cuda(d) => polyattn::backends::cuda::probes::peaks(d, dtype, cfg),
        Device::Hip(d) => polyattn::backends::hip::probes::peaks(d, dtype, cfg),
    }
}

fn cpu_peaks(device: &Device, dtype: DType, cfg: &ProbeConfig) -> Peaks {
    let threads = rayon::current_num_threads();
    let (gflops, isa) = fma_peak_gflops(cfg);
    let (copy, read) = copy_and_read_gbps(cfg);
    Peaks {
        device: device.description(),
        kind: device.kind().as_str().into(),
        dtype: match dtype {
            DType::F32 | DType::F16 | DType::Bf16 => "f32".into(),
            other => other.to_string(),
        },
        compute_tflops: gflops / 1e3,
        compute_method: format!(
            "fp32 FMA loop, {isa}, {threads} threads, best of {}",
            cfg.trials
        ),
        mem_gbps: copy,
        mem_method: format!(
            "parallel copy of {} MiB, read+write counted, {threads} threads, best of {}",
            cfg.copy_bytes >> 20,
            cfg.trials
        ),
        read_gbps: Some(read),
    }
}

/// Independent FMA chains per thread: enough to cover 2 FMA ports × 4–6 cycles of latency.
const CHAINS: usize = 12;

/// FLOPs of one iteration of the loop (per thread): chains × 8 lanes × 2.
const FLOPS_PER_ITER: f64 = (CHAINS * 8 * 2) as f64;

#[cfg(target_arch = "x86_64")]
fn has_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_fma() -> bool {
    false
}

/// One thread's loop: `iters` rounds of `CHAINS` 8-wide multiply-adds.
fn fma_loop(iters: u64, fma: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: only called after `is_x86_feature_detected!` found AVX2 and FMA.
        return unsafe { fma_loop_avx2(iters) };
    }
    let _ = fma;
    fma_loop_portable(iters)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let m = _mm256_set1_ps(0.999_999);
    let c = _mm256_set1_ps(1e-7);
    let mut a = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for x in a.iter_mut() {
            *x = _mm256_fmadd_ps(*x, m, c);
        }
    }
    let mut s = _mm256_setzero_ps();
    for x in a {
        s = _mm256_add_ps(s, x);
    }
    let mut out = [0.0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), s);
    out.iter().sum()
}

/// Multiply then add (two roundings, two instructions): what the compiler emits for
/// `a * m + c` without FMA.
fn fma_loop_portable(iters: u64) -> f32 {
    let mut a = [[1.0f32; 8]; CHAINS];
    let m = black_box(0.999_999f32);
    let c = black_box(1e-7f32);
    for _ in 0..iters {
        for x in a.iter_mut() {
            for v in x.iter_mut() {
                *v = *v * m + c;
            }
        }
    }
    a.iter().flatten().sum()
}

/// Best GFLOP/s over `cfg.trials` trials with every thread of the pool busy, and the ISA.
fn fma_peak_gflops(cfg: &ProbeConfig) -> (f64, &'static str) {
    let fma = has_fma();
    let isa = if fma {
        "AVX2+FMA 256-bit"
    } else {
        "portable multiply-add"
    };
    // Calibrate the iteration count on one thread.
    let mut iters: u64 = 1 << 16;
    loop {
        let t = Instant::now();
        black_box(fma_loop(black_box(iters), fma));
        let dt = t.elapsed().as_secs_f64();
        if dt > 0.02 || iters > 1 << 34 {
            iters = ((iters as f64) * cfg.fma_seconds / dt.max(1e-9)).max(1.0) as u64;
            break;
        }
        iters *= 4;
    }
    let threads = rayon::current_num_threads();
    let mut best = 0.0f64;
    for _ in 0..cfg.trials.max(1) {
        let t = Instant::now();
        let sums: Vec<f32> = rayon::broadcast(|_| fma_loop(black_box(iters), fma));
        let dt = t.elapsed().as_secs_f64();
        black_box(sums);
        best = best.max(threads as f64 * iters as f64 * FLOPS_PER_ITER / dt / 1e9);
    }
    (best, isa)
}

/// Best copy GB/s (read + write counted) and best read GB/s.
fn copy_and_read_gbps(cfg: &ProbeConfig) -> (f64, f64) {
    let n = (cfg.copy_bytes / 4).max(1 << 16);
    let threads = rayon::current_num_threads().max(1);
    let chunk = n.div_ceil(threads * 4).max(1 << 14);
    // First touch in parallel, with non-zero data.
    let mut src = vec![0.0f32; n];
    src.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| {
        c.iter_mut()
            .enumerate()
            .for_each(|(j, x)| *x = (i + j) as f32 * 1e-3 + 1.0)
    });
    let mut dst = vec![0.0f32; n];
    dst.par_chunks_mut(chunk).for_each(|c| c.fill(1.0));
    let bytes = (n * 4) as f64;
    let mut best_copy = 0.0f64;
    let mut best_read = 0.0f64;
    for _ in 0..cfg.trials.max(1) + 1 {
        let t = Instant::now();
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        let dt = t.elapsed().as_secs_f64();
        black_box(&dst);
        best_copy = best_copy.max(2.0 * bytes / dt / 1e9);

        let t = Instant::now();
        let s: f32 = src.par_chunks(chunk).map(sum8).sum();
        let dt = t.elapsed().as_secs_f64();
        black_box(s);
        best_read = best_read.max(bytes / dt / 1e9);
    }
    (best_copy, best_read)
}

/// Sum with eight independent accumulators (vectorises; bandwidth-bound).
fn sum8(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_compute_the_same_thing() {
        // Both loops run the same recurrence; they agree to rounding.
        let a = fma_loop(1000, has_fma());
        let b = fma_loop_portable(1000);
        assert!((a - b).abs() < 1e-3 * b.abs(), "{a} {b}");
        assert_eq!(sum8(&[1.0; 19]), 19.0);
    }
}
