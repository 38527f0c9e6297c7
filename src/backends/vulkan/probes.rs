//! What `polyattn bench` needs from the Vulkan device: the two roofline ceilings measured in
//! the same run (a buffer copy and an f32 FMA loop, the WGSL family's `shaders/probe_*.wgsl`,
//! each recorded once and timed by the two timestamps of its recording) and a region timer on
//! the device's own clock, as the types of [`crate::probe`].
//!
//! The timer reads the clock after clearing a 256 MB buffer (as triton's `do_bench` and
//! `benches/reference_sdpa.py` do: it evicts the caches) and again after the region. The
//! first mark is submitted without waiting, so the host submits the region while the clear
//! runs, as CUDA's events do; a region whose calls wait (downloads, uploads) counts the
//! host's part of those waits.

use std::sync::Arc;

use crate::device::vulkan::{Step, VulkanBuffer};
use crate::device::wgsl::{Words, PARAM_SLOT_BYTES};
use crate::device::{Device, VulkanDevice};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::wgsl::ProbeShader;
use crate::probe::{Peaks, ProbeConfig, RegionTimer, WallTimer};

/// Bytes cleared before each timed region.
const FLUSH_BYTES: u64 = 256 << 20;

/// A region timer on the device's timestamp clock.
pub struct VulkanTimer {
    dev: VulkanDevice,
    flush: Option<Arc<VulkanBuffer>>,
    started: bool,
    method: String,
}

impl RegionTimer for VulkanTimer {
    fn method(&self) -> &str {
        &self.method
    }

    fn start(&mut self) -> Result<()> {
        self.started = self.dev.timestamp_start(self.flush.as_ref())?;
        Ok(())
    }

    fn stop(&mut self) -> Result<f64> {
        if !std::mem::take(&mut self.started) {
            return Err(Error::Device {
                backend: "VULKAN".into(),
                message: "the timer was stopped without a start".into(),
            });
        }
        match self.dev.timestamp_elapsed()? {
            Some(t) if t > 0.0 => Ok(t),
            Some(t) => Err(Error::Device {
                backend: "VULKAN".into(),
                message: format!("timestamps out of order ({t} s between them)"),
            }),
            None => Err(no_timestamps()),
        }
    }
}

/// The best timer of `dev`: its timestamps when the compute queue has them, else the wall
/// clock between synchronisations.
pub fn timer(dev: &VulkanDevice) -> Box<dyn RegionTimer> {
    if !dev.has_timestamps() {
        return Box::new(WallTimer::new(&Device::Vulkan(dev.clone())));
    }
    let bytes = FLUSH_BYTES.min(dev.max_storage_range()) / 4 * 4;
    let flush = dev.zeros(bytes).ok().map(Arc::new);
    Box::new(VulkanTimer {
        method: format!(
            "Vulkan timestamps after a {} MiB clear and after the region",
            flush.as_ref().map_or(0, |b| b.len_bytes() >> 20)
        ),
        dev: dev.clone(),
        flush,
        started: false,
    })
}

fn no_timestamps() -> Error {
    Error::Device {
        backend: "VULKAN".into(),
        message: "the compute queue has no timestamps: no ceilings to measure".into(),
    }
}

/// The ceilings of `dev` for kernels storing `dtype` (they compute in f32 whatever they
/// store, so the compute ceiling is the f32 FMA rate).
pub fn peaks(dev: &VulkanDevice, dtype: DType, cfg: &ProbeConfig) -> Result<Peaks> {
    let trials = cfg.trials.max(1);
    let info = crate::device::wgsl::WgslRuntime::info(dev).clone();
    let params = dev.mapped_param_slot()?;
    // Copy: two buffers as large as one binding allows, up to 1 GiB each.
    let bytes = ((cfg.copy_bytes as u64).max(1 << 30)).min(info.max_binding_bytes) / 16 * 16;
    let src = dev.zeros(bytes)?;
    let dst = dev.zeros(bytes)?;
    let copy = ProbeShader::Copy;
    let pipe = dev.pipeline(&copy.key(), &copy.source())?;
    let (x, z) = info.grid((bytes / 16).div_ceil(256).min(65535 * 4))?;
    let rec = dev.record(&[Step::declared(
        &pipe,
        vec![(0, &params), (1, &src), (2, &dst)],
        (x, 1, z),
    )])?;
    let mut best_copy = f64::INFINITY;
    for _ in 0..trials + 1 {
        let t = dev.submit_timed(&rec)?.ok_or_else(no_timestamps)?;
        best_copy = best_copy.min(t.as_secs_f64());
    }
    let mem_gbps = 2.0 * bytes as f64 / best_copy / 1e9;

    // FMA: ~1M threads, iterations calibrated to about cfg.fma_seconds.
    let fma = ProbeShader::Fma;
    let groups: u64 = 4096;
    let out = dev.zeros(groups * 256 * 16)?;
    let unused = dev.zeros(PARAM_SLOT_BYTES)?;
    let pipe = dev.pipeline(&fma.key(), &fma.source())?;
    let (fx, fz) = info.grid(groups)?;
    let rec = dev.record(&[Step::declared(
        &pipe,
        vec![(0, &params), (1, &unused), (2, &out)],
        (fx, 1, fz),
    )])?;
    let run = |iters: u32| -> Result<f64> {
        dev.write_param_slot(&params, &Words::new().u(iters).w)?;
        Ok(dev
            .submit_timed(&rec)?
            .ok_or_else(no_timestamps)?
            .as_secs_f64())
    };
    let mut iters = 64u32;
    let t = run(iters)?;
    if t > 0.0 {
        let scale = (cfg.fma_seconds.max(0.01) / t).clamp(1.0, 1e6);
        iters = ((iters as f64 * scale) as u32).clamp(64, 1 << 24);
    }
    let mut best_fma = f64::INFINITY;
    for _ in 0..trials {
        best_fma = best_fma.min(run(iters)?);
    }
    let flops = (groups * 256) as f64 * iters as f64 * 64.0;
    Ok(Peaks {
        device: dev.description(),
        kind: "vulkan".into(),
        dtype: match dtype {
            DType::F32 | DType::F16 | DType::Bf16 => "f32".into(),
            other => other.to_string(),
        },
        compute_tflops: flops / best_fma / 1e12,
        compute_method: format!(
            "WGSL f32 fma loop as SPIR-V, 8 vec4 chains × {iters} iterations × {} threads, \
             best of {trials}; Vulkan timestamps around the recorded dispatch",
            groups * 256
        ),
        mem_gbps,
        mem_method: format!(
            "WGSL vec4 copy as SPIR-V of {} MiB, read+write counted, best of {}; Vulkan \
             timestamps around the recorded dispatch",
            bytes >> 20,
            trials + 1
        ),
        read_gbps: None,
    })
}
