//! What `polyattn bench` needs from the wgpu device: the two roofline ceilings measured in the
//! same run (a buffer copy and an f32 FMA loop, `shaders/probe_*.wgsl`) and a region timer
//! on the device's own clock (timestamp queries, when the adapter has `TIMESTAMP_QUERY`), as
//! the types of [`crate::probe`].
//!
//! Timestamps are written at the end of empty compute passes submitted before and after the
//! region, so the region itself is recorded as usual; Vulkan latches an end-of-pass timestamp
//! only once every earlier command of the queue has finished. Before the start mark the
//! timer clears a 256 MB buffer (as triton's `do_bench` and `benches/reference_sdpa.py` do):
//! it evicts L2, and it keeps the device busy while the host records and submits the timed
//! call, so that host launch latency does not count as kernel time.

use std::time::Instant;

use crate::device::{Device, WgpuDevice};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::probe::{Peaks, ProbeConfig, RegionTimer, WallTimer};

use crate::device::wgpu::{bind_group, grid, pipeline, whole, ParamBlock, Words};
use crate::kernels::wgsl::{Bindings, ProbeShader};

fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        backend: "wgpu".into(),
        message: message.into(),
    }
}

/// Two timestamps on the device's clock.
struct Stamps {
    dev: WgpuDevice,
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    ns_per_tick: f64,
}

impl Stamps {
    fn new(dev: &WgpuDevice) -> Option<Self> {
        if !dev.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
            return None;
        }
        let set = dev.device().create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("polyattn timer"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let resolve = dev.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("polyattn timer resolve"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Some(Stamps {
            ns_per_tick: dev.queue().get_timestamp_period() as f64,
            dev: dev.clone(),
            set,
            resolve,
        })
    }

    /// Submits an empty pass writing timestamp `index` at its end, after clearing `flush`
    /// when given.
    fn write(&self, index: u32, flush: Option<&wgpu::Buffer>) {
        let mut enc = self
            .dev
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("polyattn timestamp"),
            });
        if let Some(b) = flush {
            enc.clear_buffer(b, 0, None);
        }
        {
            let _pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &self.set,
                    beginning_of_pass_write_index: None,
                    end_of_pass_write_index: Some(index),
                }),
            });
        }
        if index == 1 {
            enc.resolve_query_set(&self.set, 0..2, &self.resolve, 0);
        }
        self.dev.submit(enc.finish());
    }

    /// Seconds between the two timestamps (waits for the queue).
    fn read(&self) -> Result<f64> {
        let bytes = self.dev.read_bytes(&self.resolve, 0, 16)?;
        let t0 = u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8]));
        let t1 = u64::from_le_bytes(bytes[8..].try_into().unwrap_or([0; 8]));
        if t1 <= t0 {
            return Err(device_error(format!(
                "timestamps out of order ({t0} then {t1})"
            )));
        }
        Ok((t1 - t0) as f64 * self.ns_per_tick * 1e-9)
    }
}

/// A region timer on the device's timestamp clock.
pub struct WgpuTimer {
    stamps: Stamps,
    flush: Option<wgpu::Buffer>,
    method: String,
}

/// Bytes cleared before each timed region.
const FLUSH_BYTES: u64 = 256 << 20;

/// The process's L2-flush buffer (allocated once; `None` if it cannot be).
fn flush_buffer(dev: &WgpuDevice) -> Option<wgpu::Buffer> {
    static FLUSH: std::sync::OnceLock<Option<wgpu::Buffer>> = std::sync::OnceLock::new();
    FLUSH
        .get_or_init(|| {
            let bytes = FLUSH_BYTES.min(dev.limits().max_buffer_size) / 4 * 4;
            dev.create_storage_buffer(
                "polyattn L2 flush",
                bytes,
                wgpu::BufferUsages::empty(),
                false,
            )
            .ok()
        })
        .clone()
}

impl RegionTimer for WgpuTimer {
    fn method(&self) -> &str {
        &self.method
    }

    fn start(&mut self) -> Result<()> {
        self.stamps.dev.synchronize()?;
        self.stamps.write(0, self.flush.as_ref());
        Ok(())
    }

    fn stop(&mut self) -> Result<f64> {
        self.stamps.write(1, None);
        self.stamps.read()
    }
}

/// The best timer of `dev`: timestamp queries when the adapter has them, else the wall clock
/// between synchronisations.
pub fn timer(dev: &WgpuDevice) -> Box<dyn RegionTimer> {
    match Stamps::new(dev) {
        Some(stamps) => {
            let flush = flush_buffer(dev);
            Box::new(WgpuTimer {
                method: format!(
                    "wgpu timestamp queries ({:.3} ns/tick) at the end of empty passes around \
                     the region, after a {} MiB clear",
                    stamps.ns_per_tick,
                    flush.as_ref().map_or(0, |b| b.size() >> 20)
                ),
                stamps,
                flush,
            })
        }
        None => Box::new(WallTimer::new(&Device::Wgpu(dev.clone()))),
    }
}

/// Times one dispatch: timestamps when available, else the wall clock around a
/// synchronised submit.
fn time_dispatch(
    dev: &WgpuDevice,
    pipe: &wgpu::ComputePipeline,
    group: &wgpu::BindGroup,
    dims: (u32, u32, u32),
) -> Result<f64> {
    let mut t = timer(dev);
    t.start()?;
    let t0 = Instant::now();
    let mut enc = dev
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("polyattn probe"),
        });
    crate::device::wgpu::dispatch(&mut enc, pipe, group, dims);
    dev.submit(enc.finish());
    let secs = t.stop()?;
    Ok(if secs > 0.0 {
        secs
    } else {
        t0.elapsed().as_secs_f64()
    })
}

/// The ceilings of `dev` for kernels storing `dtype` (they compute in f32 whatever they
/// store, so the compute ceiling is the f32 FMA rate).
pub fn peaks(dev: &WgpuDevice, dtype: DType, cfg: &ProbeConfig) -> Result<Peaks> {
    let trials = cfg.trials.max(1);
    // Copy: two buffers as large as one binding allows, up to 1 GiB each.
    let bytes = ((cfg.copy_bytes as u64).max(1 << 30))
        .min(dev.max_binding_bytes())
        .min(dev.limits().max_buffer_size)
        / 16
        * 16;
    let src = dev.create_storage_buffer("probe src", bytes, wgpu::BufferUsages::empty(), false)?;
    let dst = dev.create_storage_buffer("probe dst", bytes, wgpu::BufferUsages::empty(), false)?;
    let params = ParamBlock::new(dev, 1);
    let copy = ProbeShader::Copy;
    let pipe = pipeline(dev, &copy.key(), || copy.source(), Bindings::Probe, false)?;
    let group = bind_group(
        dev,
        &pipe,
        vec![(0, params.binding(0)), (1, whole(&src)), (2, whole(&dst))],
    );
    let (x, z) = grid(dev, (bytes / 16).div_ceil(256).min(65535 * 4))?;
    let mut best_copy = f64::INFINITY;
    for _ in 0..trials + 1 {
        best_copy = best_copy.min(time_dispatch(dev, &pipe, &group, (x, 1, z))?);
    }
    let mem_gbps = 2.0 * bytes as f64 / best_copy / 1e9;

    // FMA: ~1M threads, iterations calibrated to about cfg.fma_seconds.
    let fma = ProbeShader::Fma;
    let groups: u64 = 4096;
    let out = dev.create_storage_buffer(
        "probe fma out",
        groups * 256 * 16,
        wgpu::BufferUsages::empty(),
        false,
    )?;
    let pipe = pipeline(dev, &fma.key(), || fma.source(), Bindings::Probe, false)?;
    let (fx, fz) = grid(dev, groups)?;
    let run = |iters: u32| -> Result<f64> {
        params.write(dev, &[Words::new().u(iters).w]);
        let group = bind_group(
            dev,
            &pipe,
            vec![
                (0, params.binding(0)),
                (1, whole(dev.dummy_buffer(0))),
                (2, whole(&out)),
            ],
        );
        time_dispatch(dev, &pipe, &group, (fx, 1, fz))
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
    let timer_name = timer(dev).method().to_string();
    Ok(Peaks {
        device: dev.description(),
        kind: "wgpu".into(),
        dtype: match dtype {
            DType::F32 | DType::F16 | DType::Bf16 => "f32".into(),
            other => other.to_string(),
        },
        compute_tflops: flops / best_fma / 1e12,
        compute_method: format!(
            "WGSL f32 fma loop, 8 vec4 chains × {iters} iterations × {} threads, best of \
             {trials}; {timer_name}",
            groups * 256
        ),
        mem_gbps,
        mem_method: format!(
            "WGSL vec4 copy of {} MiB, read+write counted, best of {}; {timer_name}",
            bytes >> 20,
            trials + 1
        ),
        read_gbps: None,
    })
}
