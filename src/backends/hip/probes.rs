//! Benchmark support for the HIP device, as the types of [`crate::probe`]: a region timer
//! and the bandwidth ceiling of the roofline.
//!
//! Both are wall-clock based (no HIP events yet): the timer is [`WallTimer`], the wall clock
//! between two device synchronisations, which includes launch and synchronisation latency.
//! The compute ceiling is not measured (the family's FMA probe is not one of its portable
//! sources): [`peaks`] reports it as 0, which the benchmark's charts and reports treat as
//! unmeasured. Nothing here has run on AMD hardware.

use crate::device::{Device, HipDevice};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::probe::{Peaks, ProbeConfig, RegionTimer, WallTimer};

/// The best timer for `device`: the wall clock between device synchronisations.
pub fn timer(device: &HipDevice) -> Box<dyn RegionTimer> {
    Box::new(WallTimer::new(&Device::Hip(device.clone())))
}

/// Measures the copy ceiling of `device` (a device-to-device copy of at least 2 GiB, read +
/// write counted, best of the trials, wall-clock timed); the compute ceiling is reported as
/// 0 (not measured, see the module docs).
pub fn peaks(device: &HipDevice, _dtype: DType, cfg: &ProbeConfig) -> Result<Peaks> {
    let trials = cfg.trials.max(1);
    let mut t = timer(device);
    let bytes = cfg.copy_bytes.max(2 << 30);
    let src = device.zeros_bytes(bytes)?;
    let mut dst = device.zeros_bytes(bytes)?;
    device.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..=trials {
        t.start()?;
        device.copy(&src, &mut dst)?;
        best = best.min(t.stop()?);
    }
    drop((src, dst));
    if !(best.is_finite() && best > 0.0) {
        return Err(Error::Device {
            backend: "HIP".into(),
            message: format!("the copy probe measured {best} s"),
        });
    }
    let mem_gbps = 2.0 * bytes as f64 / best / 1e9;
    Ok(Peaks {
        device: device.description(),
        kind: "hip".into(),
        dtype: "f32".into(),
        compute_tflops: 0.0,
        compute_method: "not measured on HIP (no portable FMA probe yet)".into(),
        mem_gbps,
        mem_method: format!(
            "hipMemcpyDtoD of {} MiB (read + write counted), wall clock between \
             synchronisations, best of {}",
            bytes >> 20,
            trials + 1
        ),
        read_gbps: None,
    })
}
