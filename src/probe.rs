//! What a device reports to a benchmark: the two measured ceilings of the roofline
//! ([`Peaks`], measured under a [`ProbeConfig`]) and a timer for one region of device work
//! ([`RegionTimer`]).
//!
//! The library holds only these types. Each GPU backend implements them for its device
//! (`backends::cuda::probes`: CUDA events, a device copy and an FMA kernel;
//! `backends::wgpu::probes`: timestamp queries, a WGSL copy and FMA loop); the benchmark
//! harness (the `polyattn-tools` crate, `polyattn bench`) measures the CPU itself, picks the
//! probe of each device and runs the timing loop.
//!
//! [`WallTimer`] is the timer every device has: the host's monotonic clock between two device
//! synchronisations. It reads a [`Clock`], so that tests can hand it one they advance.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::error::Result;

/// The measured ceilings of one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// The device description.
    pub device: String,
    /// Device family (`cpu`, `cuda`, …).
    pub kind: String,
    /// The dtype the compute peak is for (the CPU kernels compute in f32 whatever they store).
    pub dtype: String,
    /// Compute ceiling, TFLOP/s.
    pub compute_tflops: f64,
    /// How it was measured.
    pub compute_method: String,
    /// Bandwidth ceiling, GB/s (decimal; copy, read + write counted).
    pub mem_gbps: f64,
    /// How it was measured.
    pub mem_method: String,
    /// Streaming read bandwidth, GB/s, when measured (for reference; not the ceiling).
    #[serde(default)]
    pub read_gbps: Option<f64>,
}

impl Peaks {
    /// The ridge point, FLOP per byte.
    pub fn ridge(&self) -> f64 {
        if self.mem_gbps > 0.0 {
            self.compute_tflops * 1e12 / (self.mem_gbps * 1e9)
        } else {
            0.0
        }
    }
}

/// How long each probe runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeConfig {
    /// Trials per probe (the best is kept).
    pub trials: usize,
    /// Bytes of each copy buffer.
    pub copy_bytes: usize,
    /// Approximate seconds of one FMA trial.
    pub fma_seconds: f64,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            trials: 5,
            copy_bytes: 512 << 20,
            fma_seconds: 0.25,
        }
    }
}

/// Times one region of work on a device.
pub trait RegionTimer {
    /// What the timer measures with (recorded in every row).
    fn method(&self) -> &str;
    /// Marks the start of the region.
    fn start(&mut self) -> Result<()>;
    /// Marks the end of the region; returns its duration in seconds.
    fn stop(&mut self) -> Result<f64>;
}

/// A monotonic clock: the time elapsed since a fixed origin of its own.
pub trait Clock {
    /// Time since the clock's origin; never decreases.
    fn now(&self) -> Duration;
}

/// The host's monotonic clock (`std::time::Instant`), with its origin at creation.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock (the host's monotonic clock by default), synchronising the device (or every device
/// of a region that spans several) at both ends.
pub struct WallTimer {
    devices: Vec<Device>,
    clock: Box<dyn Clock>,
    t0: Option<Duration>,
    method: String,
}

impl WallTimer {
    /// A wall-clock timer for `device`.
    pub fn new(device: &Device) -> Self {
        Self::with_clock(device, Box::new(MonotonicClock::new()))
    }

    /// A timer for `device` that reads `clock` (tests hand it a clock they advance).
    pub fn with_clock(device: &Device, clock: Box<dyn Clock>) -> Self {
        let method = match device {
            Device::Cpu(_) => "wall clock (std::time::Instant)".to_string(),
            _ => "wall clock between device synchronisations (no device timer yet)".to_string(),
        };
        WallTimer {
            devices: vec![device.clone()],
            clock,
            t0: None,
            method,
        }
    }

    /// A wall-clock timer for a region whose work spans `devices` (one rank per GPU): it
    /// synchronises every one at both ends, so the region ends with the last device's work.
    pub fn across(devices: &[Device]) -> Self {
        WallTimer {
            devices: devices.to_vec(),
            clock: Box::new(MonotonicClock::new()),
            t0: None,
            method: format!(
                "wall clock between synchronisations of {} device(s)",
                devices.len()
            ),
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.devices.iter().try_for_each(Device::synchronize)
    }
}

impl RegionTimer for WallTimer {
    fn method(&self) -> &str {
        &self.method
    }

    fn start(&mut self) -> Result<()> {
        self.synchronize()?;
        self.t0 = Some(self.clock.now());
        Ok(())
    }

    fn stop(&mut self) -> Result<f64> {
        self.synchronize()?;
        let now = self.clock.now();
        Ok(self
            .t0
            .take()
            .map_or(0.0, |t| now.saturating_sub(t).as_secs_f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A clock that moves only when the test advances it.
    #[derive(Clone, Default)]
    struct FakeClock(Rc<Cell<Duration>>);

    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            self.0.get()
        }
    }

    #[test]
    fn the_monotonic_clock_does_not_go_back() {
        let c = MonotonicClock::new();
        let a = c.now();
        assert!(c.now() >= a);
    }

    #[test]
    fn the_wall_timer_measures_its_clock_between_start_and_stop() {
        let clock = FakeClock::default();
        let mut t = WallTimer::with_clock(&Device::cpu(), Box::new(clock.clone()));
        clock.0.set(Duration::from_millis(3));
        t.start().unwrap();
        clock.0.set(Duration::from_millis(10));
        let secs = t.stop().unwrap();
        assert!((secs - 0.007).abs() < 1e-12, "{secs} s, expected 0.007 s");
        // A stop without a start measures nothing.
        assert_eq!(t.stop().unwrap(), 0.0);
    }

    #[test]
    fn ridge_is_flops_over_bytes() {
        let p = Peaks {
            device: "d".into(),
            kind: "cpu".into(),
            dtype: "f32".into(),
            compute_tflops: 0.1,
            compute_method: String::new(),
            mem_gbps: 10.0,
            mem_method: String::new(),
            read_gbps: None,
        };
        assert_eq!(p.ridge(), 10.0);
        assert_eq!(Peaks { mem_gbps: 0.0, ..p }.ridge(), 0.0);
    }
}
