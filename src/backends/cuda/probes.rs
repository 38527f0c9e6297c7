//! Benchmark support for the CUDA device: a CUDA-event region timer and the two roofline
//! ceilings (a device copy and the CUDA-core f32 FMA peak), measured in the same run as the
//! kernels (`perf-anchors.md` §9), as the types of [`crate::probe`].
//!
//! The tensor-core (bf16 matmul) ceiling is not measured here: polyattn has no GEMM kernel,
//! and `benches/reference_sdpa.py` measures it with PyTorch in the same device session; the
//! prefill rows therefore report their fraction of the CUDA-core peak, and RESULTS.md puts the
//! tensor-core ceiling beside it.

use cudarc::driver::{CudaEvent, LaunchConfig};

use crate::device::{CudaDevice, CudaStorage, Device};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::probe::{Peaks, ProbeConfig, RegionTimer};

use crate::device::cuda as runtime;
use crate::kernels::cuda::{FmaProbeParams, PROBES};

/// Bytes cleared before every timed region: evicts the H200's 60 MB L2 and keeps the GPU busy
/// while the host enqueues the timed call (as `triton.testing.do_bench` does).
const FLUSH_BYTES: usize = 256 << 20;

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Device {
        backend: "cuda".into(),
        message: format!("{what}: {e}"),
    }
}

/// Times a region with CUDA events recorded on the device's stream.
pub struct CudaEventTimer {
    device: CudaDevice,
    flush: Option<CudaStorage>,
    start: Option<CudaEvent>,
    method: String,
}

/// The best timer for `device`: CUDA events after a 256 MiB clear.
pub fn timer(device: &CudaDevice) -> Box<dyn RegionTimer> {
    let flush = device.zeros(FLUSH_BYTES, DType::Fp8E4m3).ok();
    let method = format!(
        "CUDA events on the kernels' stream, after a {} MiB clear",
        flush.as_ref().map_or(0, |f| f.len_bytes() >> 20)
    );
    Box::new(CudaEventTimer {
        device: device.clone(),
        flush,
        start: None,
        method,
    })
}

fn timing_event(device: &CudaDevice) -> Result<CudaEvent> {
    device
        .stream()
        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| err("recording an event", e))
}

impl RegionTimer for CudaEventTimer {
    fn method(&self) -> &str {
        &self.method
    }

    fn start(&mut self) -> Result<()> {
        if let Some(f) = self.flush.as_mut() {
            self.device.fill_zeros(f)?;
        }
        self.start = Some(timing_event(&self.device)?);
        Ok(())
    }

    fn stop(&mut self) -> Result<f64> {
        let end = timing_event(&self.device)?;
        let start = self
            .start
            .take()
            .ok_or_else(|| err("timer", "stop without start"))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| err("reading the events", e))?;
        Ok(f64::from(ms) / 1e3)
    }
}

/// Measures the copy and FMA ceilings of `device`.
pub fn peaks(device: &CudaDevice, _dtype: DType, cfg: &ProbeConfig) -> Result<Peaks> {
    let trials = cfg.trials.max(1);
    let mut t = timer(device);

    // Copy: two 2 GiB buffers (≥ 4 GiB moved per copy), best of the trials.
    let bytes = cfg.copy_bytes.max(2 << 30);
    let mut src = device.zeros(bytes, DType::Fp8E4m3)?;
    let mut dst = device.zeros(bytes, DType::Fp8E4m3)?;
    device.fill_zeros(&mut src)?;
    let mut best = f64::INFINITY;
    for _ in 0..trials + 1 {
        t.start()?;
        device.copy(&src, &mut dst)?;
        best = best.min(t.stop()?);
    }
    drop((src, dst));
    let mem_gbps = 2.0 * bytes as f64 / best / 1e9;

    // FMA: 132-SM-scale grid, iterations calibrated to about cfg.fma_seconds.
    let f = runtime::function(device, &PROBES, &[], "fma_probe")?;
    let threads = 256u32;
    let blocks = device.sm_count().max(1) * 32;
    let n = (threads * blocks) as usize;
    let out = device.zeros(n, DType::F32)?;
    let cfg_launch = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut iters = 1024i32;
    let mut best_tflops = 0.0f64;
    for trial in 0..trials + 4 {
        let p = FmaProbeParams {
            out: out.device_ptr(),
            iters,
            m: 0.999_9,
            c: 1e-4,
            pad: 0,
        };
        t.start()?;
        runtime::launch(device, &f, cfg_launch, &p, None)?;
        let secs = t.stop()?;
        let flops = 2.0 * 8.0 * f64::from(iters) * n as f64;
        if trial >= 3 {
            best_tflops = best_tflops.max(flops / secs / 1e12);
        } else if secs < cfg.fma_seconds && iters < (1 << 24) {
            // Calibrate: grow the loop until one launch takes about cfg.fma_seconds.
            iters = ((f64::from(iters) * cfg.fma_seconds / secs.max(1e-6)).min(f64::from(1 << 24)))
                as i32;
        }
    }
    Ok(Peaks {
        device: Device::Cuda(device.clone()).description(),
        kind: "cuda".into(),
        dtype: "f32".into(),
        compute_tflops: best_tflops,
        compute_method: format!(
            "f32 FMA loop on the CUDA cores ({blocks}×{threads} threads, 8 chains, {iters} \
             iterations), best of {trials}; tensor-core ceiling: see the reference's matmul"
        ),
        mem_gbps,
        mem_method: format!(
            "cuMemcpyDtoD of {} MiB (read + write counted), CUDA events, best of {}",
            bytes >> 20,
            trials + 1
        ),
        read_gbps: None,
    })
}
